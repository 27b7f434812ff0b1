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

/* Conv channel of conv-loop item t of a block (key head kh, value head h, columns c0..):
 * its index, whether the block writes its ring slot, and its shared-memory destination. */
__device__ __forceinline__ int engine_cu_dn_channel(int t, int dk, int nk, int kh, int h, int dv,
                                                    int c0, bool owner, bool &own) {
    if (t < dk) {
        own = owner;
        return kh * dk + t;
    }
    if (t < 2 * dk) {
        own = owner;
        return nk * dk + kh * dk + (t - dk);
    }
    own = true;
    return 2 * nk * dk + h * dv + c0 + (t - 2 * dk);
}

#endif
