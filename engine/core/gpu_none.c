/* GPU query for builds without the CUDA backend. */
#include "common.h"

#include <string.h>

int engine_gpu_info_get(engine_gpu_info *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->status, sizeof out->status,
             "this build has no CUDA backend (nvcc was not found or SPARK_CUDA=OFF)");
    return 0;
}
