/* The cost of a dependent step on the GPU (a benchmark, not a test): how long one op waiting for
 * the whole previous one takes when nothing else is done, by the two means the decode step has.
 *
 *   bench_sync [N_STEPS] [BLOCKS]      (defaults 288 steps, 396 blocks of 256 threads a step)
 *
 * per-op: N_STEPS launches of a kernel of BLOCKS blocks in a CUDA graph, each launched with
 *   programmatic dependent launch and waiting (griddepcontrol.wait) for the one before, as the
 *   per-op decode step does;
 * fused: one launch of N_STEPS * BLOCKS blocks; a block takes a ticket, and the blocks of step
 *   i wait for the done counter of step i - 1 to reach BLOCKS (sync.cuh, as step.cu does).
 * Each block reads one value its step's predecessor wrote and writes one. Prints microseconds
 * per dependent step (graph replays, mean of 20 after a warm-up).
 * Build: nvcc -O3 -std=c++17 -arch=sm_90 -Iengine -Iengine/cuda bench/cuda/bench_sync.cu */
#include <stdio.h>
#include <stdlib.h>

#include "sync.cuh"

__global__ void perop_kernel(float *buf, int step) {
    engine_cu_pdl_launch();
    engine_cu_pdl_wait();
    if (threadIdx.x == 0) buf[(step + 1) * gridDim.x + blockIdx.x] = buf[step * gridDim.x] + 1.0f;
}

__global__ void fused_kernel(float *buf, unsigned *ctr, int blocks, int total) {
    __shared__ unsigned s_t;
    __shared__ int s_last;
    if (threadIdx.x == 0) s_t = atomicAdd(ctr, 1u);
    __syncthreads();
    const int step = (int)s_t / blocks, b = (int)s_t % blocks;
    engine_cu_spin(step > 0 ? ctr + 2 + step - 1 : nullptr, (unsigned)blocks);
    if (threadIdx.x == 0) buf[(step + 1) * blocks + b] = buf[step * blocks] + 1.0f;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(ctr + 2 + step, 1u);
        __threadfence();
        s_last = atomicAdd(ctr + 1, 1u) == (unsigned)total - 1;
    }
    __syncthreads();
    if (s_last)
        for (int i = threadIdx.x; i < 2 + total / blocks; i += blockDim.x)
            ctr[i] = 0;
}

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                               \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static int time_graph(cudaGraphExec_t ex, cudaStream_t st, int reps, float *ms) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaGraphLaunch(ex, st));
    CK(cudaEventRecord(a, st));
    for (int r = 0; r < reps; r++)
        CK(cudaGraphLaunch(ex, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    CK(cudaEventElapsedTime(ms, a, b));
    *ms /= reps;
    return 0;
}

int main(int argc, char **argv) {
    const int n = argc > 1 ? atoi(argv[1]) : 288, blocks = argc > 2 ? atoi(argv[2]) : 396;
    if (n < 1 || blocks < 1) return 2;
    float *buf;
    unsigned *ctr;
    cudaStream_t st;
    CK(cudaMalloc(&buf, sizeof(float) * (size_t)(n + 1) * blocks));
    CK(cudaMalloc(&ctr, sizeof(unsigned) * (size_t)(n + 2)));
    CK(cudaMemset(buf, 0, sizeof(float) * (size_t)(n + 1) * blocks));
    CK(cudaMemset(ctr, 0, sizeof(unsigned) * (size_t)(n + 2)));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t g;
    cudaGraphExec_t ex_perop, ex_fused;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < n; i++)
        engine_cu_launch(perop_kernel, dim3(blocks), dim3(256), 0, st, buf, i);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ex_perop, g, 0));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    engine_cu_launch(fused_kernel, dim3(n * blocks), dim3(256), 0, st, buf, ctr, blocks,
                     n * blocks);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ex_fused, g, 0));
    CK(cudaGraphDestroy(g));
    float ms_p = 0, ms_f = 0;
    if (time_graph(ex_perop, st, 20, &ms_p) || time_graph(ex_fused, st, 20, &ms_f)) return 1;
    float last = 0;
    CK(cudaMemcpy(&last, buf + (size_t)n * blocks, sizeof last, cudaMemcpyDeviceToHost));
    printf("dependent steps of %d blocks x 256 threads, %d per graph: per-op launches (PDL) "
           "%.2f us/step, fused kernel with counter waits %.2f us/step (check %s)\n",
           blocks, n, 1e3f * ms_p / n, 1e3f * ms_f / n, last == (float)n ? "ok" : "FAILED");
    return last == (float)n ? 0 : 1;
}
