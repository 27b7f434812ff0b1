/* GPU query through the CUDA runtime. Compiled only when the CUDA backend is built. */
#include "common.cuh"

#include <stdio.h>
#include <string.h>

extern "C" int engine_gpu_info_get(engine_gpu_info *out) {
    memset(out, 0, sizeof *out);
    out->backend_built = true;
    cudaRuntimeGetVersion(&out->runtime_version);
    cudaError_t e = cudaDriverGetVersion(&out->driver_version);
    if (e != cudaSuccess || out->driver_version == 0) {
        snprintf(out->status, sizeof out->status, "no CUDA driver found (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "libcuda not loaded");
        return 0;
    }
    int n = 0;
    e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        snprintf(out->status, sizeof out->status, "no usable GPU (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
        cudaGetLastError(); /* clear the sticky error for later callers */
        return 0;
    }
    if (n > ENGINE_MAX_GPUS) n = ENGINE_MAX_GPUS;
    for (int i = 0; i < n; i++) {
        cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
        engine_gpu_device *d = &out->devices[out->n_devices++];
        snprintf(d->name, sizeof d->name, "%s", p.name);
        d->major = p.major;
        d->minor = p.minor;
        d->total_mem = p.totalGlobalMem;
        d->multiprocessors = p.multiProcessorCount;
        d->mem_bus_width_bits = p.memoryBusWidth;
        int clk = 0;
        if (cudaDeviceGetAttribute(&clk, cudaDevAttrMemoryClockRate, i) == cudaSuccess)
            d->mem_clock_khz = clk;
        size_t free_b = 0, total_b = 0;
        if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
            d->free_mem = free_b;
    }
    snprintf(out->status, sizeof out->status, "ok");
    return 0;
}
