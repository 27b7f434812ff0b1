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
#define ENGINE_CUDA_CHECK(call)                                                              \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess)                                                               \
            return engine_err(e_ == cudaErrorMemoryAllocation ? ENGINE_ENOMEM : ENGINE_EINTERNAL, \
                              "CUDA %s at %s:%d: %s", #call, __FILE__, __LINE__,             \
                              cudaGetErrorString(e_));                                       \
    } while (0)

#endif
