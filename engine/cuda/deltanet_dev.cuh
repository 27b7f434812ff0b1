/* Device helpers of the Gated DeltaNet (contracts in deltanet.cuh), shared by the decode step
 * (deltanet.cu), the chunked prefill (deltanet_chunk.cu) and the verify pass (q35_vdelta.cu),
 * one code for all so that they take the same arithmetic (bit for bit). */
#ifndef SPARK_ENGINE_CUDA_DELTANET_DEV_CUH
#define SPARK_ENGINE_CUDA_DELTANET_DEV_CUH

#include <math.h>

__device__ __forceinline__ float engine_cu_dn_silu(float y) {
    return y / (1.0f + expf(-y));
}

__device__ __forceinline__ float engine_cu_dn_softplus(float x) {
    return x > 20.0f ? x : log1pf(expf(x)); /* torch's threshold, as the CPU */
}

#endif
