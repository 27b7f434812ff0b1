/* Shared by every CUDA file of the engine: the error-check macro and architecture switches.
 * Host launchers are declared in each op's .cuh; no CUDA type crosses engine.h. */
#ifndef SPARK_ENGINE_CUDA_COMMON_CUH
#define SPARK_ENGINE_CUDA_COMMON_CUH

#include <cuda_runtime.h>

extern "C" {
#include "engine.h"
int engine_err(int code, const char *fmt, ...);
}

/* Convert a CUDA error into an engine error at the boundary, naming the call site. */
#define ENGINE_CUDA_CHECK(call)                                                                    \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return engine_err(e_ == cudaErrorMemoryAllocation ? ENGINE_ENOMEM : ENGINE_EINTERNAL,  \
                              "CUDA %s at %s:%d: %s", #call, __FILE__, __LINE__,                   \
                              cudaGetErrorString(e_));                                             \
    } while (0)

/* The C headers of engine/ use C11 spellings that C++17 lacks; map them for nvcc. */
#ifndef _Noreturn
#define _Noreturn [[noreturn]]
#endif
#ifndef _Static_assert
#define _Static_assert static_assert
#endif

#define ENGINE_CUDA_WARP 32

__device__ __forceinline__ float engine_cu_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float engine_cu_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the
 * result. `red` is shared scratch of 32 floats; the call synchronises the block. */
__device__ __forceinline__ float engine_cu_block_sum(float v, float *red) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = engine_cu_warp_sum(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return engine_cu_warp_sum(v);
}

#endif
