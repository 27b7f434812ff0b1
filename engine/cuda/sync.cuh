/* How a block's work waits for its inputs, in a per-op kernel or in the fused decode step.
 *
 * The block bodies of matvec_dev.cuh, moe_dev.cuh and attention_dev.cuh take a sync object S
 * and call, every thread of the block alike:
 *   S.wait()        before reading anything an earlier op writes (after prefetching weights);
 *   S.wait_ids()    MoE down: before reading the expert ids and weights of the routing;
 *   S.ids_written() MoE up, warp 0 of the block that stored the ids and weights, right after.
 * engine_cu_pdl_sync: a kernel of its own, launched with programmatic dependent launch: the
 * waits are griddepcontrol.wait (the previous kernel complete and flushed).
 * engine_cu_dep_sync: a block of the fused step kernel (step.cu): thread 0 spins on a counter
 * in global memory with acquire loads until the op it depends on has counted all its blocks
 * done (each block adds 1 with release semantics when it ends), then the block meets at a
 * barrier. Deadlock-free without co-residency: a block takes its work in the order of a ticket
 * counter, so every block it waits for holds a lower ticket and is running or done.
 * Thread 0 fences after its wait as cooperative groups' grid sync does.
 * STATUS (stage 4): measured on the H200 with a bug since fixed (step_att called itself, so
 * the compiler dropped the attention phase: wrong logits, and the speed of a step without
 * attention); the fixed step is not yet run on a GPU. Sessions use the per-op launches unless
 * SPARK_CUDA_FUSED=1; test_cuda_forward checks the fused step with SPARK_TEST_CUDA_FUSED=1. */
#ifndef SPARK_ENGINE_CUDA_SYNC_CUH
#define SPARK_ENGINE_CUDA_SYNC_CUH

#include "common.cuh"

struct engine_cu_pdl_sync {
    __device__ __forceinline__ void wait() const {
        engine_cu_pdl_wait();
    }
    __device__ __forceinline__ void wait_ids() const {
        engine_cu_pdl_wait();
    }
    __device__ __forceinline__ void ids_written() const {}
};

/* engine_cu_pdl_sync that, when `late`, lets the next kernel launch only after its wait
 * (griddepcontrol.launch_dependents right after griddepcontrol.wait; else the kernel triggers at
 * its start): the dependent kernel then starts once every block of this one has waited, so
 * whatever this kernel's predecessors wrote is final when it starts (decode stage 6: the router
 * launch before an up kernel that stages x before its own wait). */
struct engine_cu_pdl_late_sync {
    bool late;
    __device__ __forceinline__ void wait() const {
        engine_cu_pdl_wait();
        if (late) engine_cu_pdl_launch();
    }
    __device__ __forceinline__ void wait_ids() const {
        wait();
    }
    __device__ __forceinline__ void ids_written() const {}
};

__device__ __forceinline__ unsigned engine_cu_ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* Every thread of the block: return once *p >= n (p NULL: at once, no barrier). */
__device__ __forceinline__ void engine_cu_spin(const unsigned *p, unsigned n) {
    if (!p) return;
    if (threadIdx.x == 0) {
        while (engine_cu_ld_acquire(p) < n)
            __nanosleep(32);
        __threadfence(); /* as cooperative groups' grid sync: no stale line of L1 after it */
    }
    __syncthreads();
}

/* engine_cu_spin for a wait on blocks of the same launch (a barrier over the grid): thread 0
 * gives up after ns nanoseconds of the global timer with a trap, so that a wait which cannot end
 * (blocks that never became resident: two such launches at once on two streams, or a tool that
 * runs blocks one after another) fails the launch with an error instead of hanging the
 * process. */
__device__ __forceinline__ void engine_cu_spin_bounded(const unsigned *p, unsigned n,
                                                       unsigned long long ns) {
    if (threadIdx.x == 0) {
        unsigned long long t0, t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        while (engine_cu_ld_acquire(p) < n) {
            __nanosleep(32);
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
            if (t - t0 > ns) __trap();
        }
        __threadfence();
    }
    __syncthreads();
}

struct engine_cu_dep_sync {
    const unsigned *dep; /* the done counter of the op this block depends on, or NULL */
    unsigned dep_n;      /* its block count */
    unsigned *ids;       /* MoE: the flag "ids and weights stored" of this layer, or NULL */
    __device__ __forceinline__ void wait() const {
        engine_cu_spin(dep, dep_n);
    }
    __device__ __forceinline__ void wait_ids() const {
        if (ids)
            engine_cu_spin(ids, 1u);
        else
            wait();
    }
    __device__ __forceinline__ void ids_written() const {
        __syncwarp();
        if ((threadIdx.x & 31) == 0 && ids) {
            __threadfence();
            atomicExch(ids, 1u);
        }
    }
};

#endif
