/* Shared by every CUDA file of the engine: the error-check macro and architecture switches.
 * Host launchers are declared in each op's .cuh; no CUDA type crosses engine.h. */
#ifndef SPARK_ENGINE_CUDA_COMMON_CUH
#define SPARK_ENGINE_CUDA_COMMON_CUH

#include <ctype.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#include "engine.h"
int engine_err(int code, const char *fmt, ...);
}

/* The output head's repacked Q6_K rows: an internal type id (never in a file) and its group of
 * eight superblocks in bytes (layout: dequant.cuh). */
#define ENGINE_CU_TYPE_Q6_KR 0x100E
#define ENGINE_CU_Q6R_GROUP 1680

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

/* The thread's warp in its block, known to the compiler as the same in every lane (a shuffle
 * from lane 0), so that code under a branch on it is not taken for divergent: no run-time
 * divergence checks and slow collective paths around the shuffles there. The whole warp calls
 * it, converged (at a kernel's start). */
__device__ __forceinline__ int engine_cu_warp_id() {
    return __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 5), 0);
}

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

/* The warp's largest (v, id) pair, ties to the lower id, by shuffles: every lane gets it. */
template <typename T> __device__ __forceinline__ void engine_cu_warp_argmax(T &v, int &id) {
    for (int o = 16; o > 0; o >>= 1) {
        const T ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, id, o);
        if (ov > v || (ov == v && oi < id)) {
            v = ov;
            id = oi;
        }
    }
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

/* Programmatic dependent launch (sm_90 and later): a kernel lets the next one in the stream
 * start early (launch_dependents), and waits for the previous one to finish and flush before
 * it reads activations or writes anything (wait). Before the wait a kernel may only read
 * weights (prefetch). No-ops when the launch did not ask for it. */
#ifdef SPARK_CUDA_TRACE
/* Launch timeline (diagnosis builds only: CMake -DSPARK_CUDA_TRACE=ON; the default build has
 * none of this). Thread 0 of every block records the global timer where the block lets its
 * dependents launch (ev 0: in practice where the block starts) and where its PDL wait returns
 * (ev 1: the previous kernel complete; some kernels add stamps of their own stages, ev 2 and 4..7,
 * and ev 3, the block's work done: ENGINE_CU_TRACE_END), with the launch's grid id (PTX %gridid,
 * unique per launch, also inside graph replays), its block index and grid shape, into
 * per-multiprocessor slices of a buffer (engine_cuda_trace_start / _stop in trace.cu). Each
 * translation unit has its own copy of the pointer (no separate compilation): ENGINE_CU_TRACE_TU
 * below binds it. */
typedef struct {
    unsigned long long t, grid;
    unsigned block, ev, gx, gy; /* ev: 0 | 1, + (blockDim.x << 8) */
} engine_cu_trace_rec;
typedef struct {
    engine_cu_trace_rec *rec; /* [n_sm][per_sm] */
    unsigned *ctr;            /* [n_sm] */
    unsigned per_sm;
    unsigned n_sm; /* slices; a %smid past them (ids need not be contiguous) is dropped */
} engine_cu_trace_ptr;
static __device__ engine_cu_trace_ptr engine_cu_trace_g;

/* ev recorded by the calling thread (one thread of the block: ENGINE_CU_TRACE_ANY) */
__device__ __forceinline__ void engine_cu_trace_any(unsigned ev) {
    const engine_cu_trace_ptr tp = engine_cu_trace_g;
    if (!tp.rec) return;
    unsigned long long t, g;
    unsigned sm;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(g));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    if (sm >= tp.n_sm) return;
    const unsigned i = atomicAdd(tp.ctr + sm, 1u);
    if (i >= tp.per_sm) return;
    engine_cu_trace_rec r;
    r.t = t;
    r.grid = g;
    r.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    r.ev = ev | blockDim.x << 8;
    r.gx = gridDim.x;
    r.gy = gridDim.y * gridDim.z;
    tp.rec[(size_t)sm * tp.per_sm + i] = r;
}
__device__ __forceinline__ void engine_cu_trace_ev(unsigned ev) {
    if (!(threadIdx.x | threadIdx.y | threadIdx.z)) engine_cu_trace_any(ev);
}
/* At the end of each .cu file with kernels: the host-side binder of that file's pointer. */
#define ENGINE_CU_TRACE_TU(name)                                                                   \
    extern "C" int engine_cu_trace_bind_##name(const void *p) {                                    \
        return cudaMemcpyToSymbol(engine_cu_trace_g, p, sizeof(engine_cu_trace_ptr)) !=            \
               cudaSuccess;                                                                        \
    }
#define ENGINE_CU_TRACE(ev) engine_cu_trace_ev(ev)
#define ENGINE_CU_TRACE_ANY(ev) engine_cu_trace_any(ev)
/* The end of a block's work (every thread of the block reaches it): a barrier, then ev 3. */
#define ENGINE_CU_TRACE_END()                                                                      \
    do {                                                                                           \
        __syncthreads();                                                                           \
        engine_cu_trace_ev(3);                                                                     \
    } while (0)
#else
#define ENGINE_CU_TRACE_END() ((void)0)
#define ENGINE_CU_TRACE_TU(name)
#define ENGINE_CU_TRACE(ev) ((void)0)
#define ENGINE_CU_TRACE_ANY(ev) ((void)0)
#endif

__device__ __forceinline__ void engine_cu_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    ENGINE_CU_TRACE(1);
}

__device__ __forceinline__ void engine_cu_pdl_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
    ENGINE_CU_TRACE(0);
}

/* Loads of the decode kernels' weights (qdot.cuh), which every token reads once: a 40 MB per
 * layer stream through the 50 MB L2. With ENGINE_CU_L2_HINT=1 they carry an L2 evict-first
 * policy so that the stream does not push out of L2 what is reused from layer to layer and
 * kernel to kernel (the kernels' code and parameters, activations, the KV cache); 0: plain
 * read-only loads. Read-only data only. Default 1: +0.6% tok/s (Q4_K_M) and +0.8% (Q8_0) on
 * 12-block cut models on the H200, the same tokens (bench/RESULTS.md, decode stage 5). */
#ifndef ENGINE_CU_L2_HINT
#define ENGINE_CU_L2_HINT 1
#endif
#if ENGINE_CU_L2_HINT && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define ENGINE_CU_HINTED 1
__device__ __forceinline__ uint64_t engine_cu_pol_stream() {
    uint64_t p;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
#endif

__device__ __forceinline__ uint32_t engine_cu_ldw(const uint32_t *p) {
#ifdef ENGINE_CU_HINTED
    uint32_t v;
    asm("ld.global.nc.L2::cache_hint.u32 %0, [%1], %2;"
        : "=r"(v)
        : "l"(p), "l"(engine_cu_pol_stream()));
    return v;
#else
    return __ldg(p);
#endif
}

__device__ __forceinline__ uint16_t engine_cu_ldh(const uint16_t *p) {
#ifdef ENGINE_CU_HINTED
    uint16_t v;
    asm("ld.global.nc.L2::cache_hint.u16 %0, [%1], %2;"
        : "=h"(v)
        : "l"(p), "l"(engine_cu_pol_stream()));
    return v;
#else
    return __ldg(p);
#endif
}

__device__ __forceinline__ int engine_cu_ldsb(const int8_t *p) {
#ifdef ENGINE_CU_HINTED
    int v;
    asm("ld.global.nc.L2::cache_hint.s8 %0, [%1], %2;"
        : "=r"(v)
        : "l"(p), "l"(engine_cu_pol_stream()));
    return v;
#else
    return __ldg(p);
#endif
}

__device__ __forceinline__ uint4 engine_cu_ldq(const uint4 *p) {
#ifdef ENGINE_CU_HINTED
    uint4 v;
    asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "l"(engine_cu_pol_stream()));
    return v;
#else
    return __ldg(p);
#endif
}

__device__ __forceinline__ uint2 engine_cu_ldd(const uint2 *p) {
#ifdef ENGINE_CU_HINTED
    uint2 v;
    asm("ld.global.nc.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;"
        : "=r"(v.x), "=r"(v.y)
        : "l"(p), "l"(engine_cu_pol_stream()));
    return v;
#else
    return __ldg(p);
#endif
}

/* Ask L2 for `bytes` bytes from p (its 128-byte lines spread over the lanes of a warp, which
 * all call this). */
__device__ __forceinline__ void engine_cu_prefetch_l2(const uint8_t *p, size_t bytes) {
    const uintptr_t a = (uintptr_t)p & ~(uintptr_t)127, end = (uintptr_t)p + bytes;
    for (uintptr_t o = a + 128 * (threadIdx.x & 31); o < end; o += 128 * 32)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(o));
}

/* Ask L2 for the `bytes` bytes from p, every 128-byte line of them (one thread). */
__device__ __forceinline__ void engine_cu_prefetch_rows(const uint8_t *p, size_t bytes) {
    const uintptr_t end = (uintptr_t)p + bytes;
    for (uintptr_t o = (uintptr_t)p & ~(uintptr_t)127; o < end; o += 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(o));
}

/* Ask L2 for bytes [p, p + bytes) with one bulk prefetch (one thread; sm_90 and later: the
 * copy engine walks the lines, where prefetch.global.L2 takes an instruction per line), widened
 * to 16-byte boundaries: callers pass ranges inside the model's weight allocation, whose mapping
 * ends on a page boundary. Older architectures: engine_cu_prefetch_rows. */
__device__ __forceinline__ void engine_cu_prefetch_bulk(const uint8_t *p, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uintptr_t a = (uintptr_t)p & ~(uintptr_t)15,
                    e = ((uintptr_t)p + bytes + 15) & ~(uintptr_t)15;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"((unsigned)(e - a))
                 : "memory");
#else
    engine_cu_prefetch_rows(p, bytes);
#endif
}

/* Bulk copies from global into shared memory (sm_90 and later; callers check the
 * architecture on the host): one thread issues cp.async.bulk per contiguous run (16-byte
 * aligned source and destination, a multiple of 16 bytes), the copy engine moves the bytes,
 * and the run's arrival is counted in transaction bytes on an mbarrier in shared memory. A block
 * puts its whole weight slice in flight with a few instructions, where loads from registers keep
 * only what the registers hold. The barrier: engine_cu_mbar_init by one thread, visible to the
 * others after a __syncthreads; that thread then engine_cu_mbar_expect (the bytes of all its
 * runs, before the first copy) and engine_cu_bulk_g2s per run; every thread that reads the runs
 * calls engine_cu_mbar_wait(bar, 0), after which the bytes are visible to it. One use per
 * kernel (phase 0). */
__device__ __forceinline__ unsigned engine_cu_smem_addr(const void *p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void engine_cu_mbar_init(uint64_t *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(engine_cu_smem_addr(bar))
                 : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
    (void)bar;
#endif
}

__device__ __forceinline__ void engine_cu_mbar_expect(uint64_t *bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(engine_cu_smem_addr(bar)),
        "r"(bytes)
        : "memory");
#else
    (void)bar;
    (void)bytes;
#endif
}

__device__ __forceinline__ void engine_cu_bulk_g2s(void *dst, const void *src, unsigned bytes,
                                                   uint64_t *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#ifdef ENGINE_CU_HINTED
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1], %2, [%3], %4;" ::"r"(engine_cu_smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(engine_cu_smem_addr(bar)), "l"(engine_cu_pol_stream())
                 : "memory");
#else
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];" ::"r"(engine_cu_smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(engine_cu_smem_addr(bar))
                 : "memory");
#endif
#else
    (void)dst;
    (void)src;
    (void)bytes;
    (void)bar;
#endif
}

__device__ __forceinline__ void engine_cu_mbar_wait(uint64_t *bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WAIT;\n"
                 "}\n" ::"r"(engine_cu_smem_addr(bar)),
                 "r"(parity)
                 : "memory");
#else
    (void)bar;
    (void)parity;
#endif
}

/* Order this thread's earlier generic-proxy accesses of shared memory (and, after a barrier,
 * the block's) before its later bulk copies into it: a copy into space the block has read. */
__device__ __forceinline__ void engine_cu_fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

/* Bring the 128-byte lines of p[0, bytes) into this multiprocessor's L1 (and L2) before they
 * are needed, so the kernel's later loads of them hit L1: the lanes of a warp take the lines,
 * at most N each with a one-byte load (never outside p[0, bytes)); lines past those are only
 * asked of L2. The loaded bytes land in v[N], which the caller must consume late (see
 * engine_cu_sink) so that no instruction waits for them early. */
template <int N>
__device__ __forceinline__ void engine_cu_touch(const uint8_t *p, size_t bytes, uint32_t v[N]) {
    const uintptr_t b = (uintptr_t)p, end = b + bytes;
    uintptr_t o = (b & ~(uintptr_t)127) + 128 * (threadIdx.x & 31);
#pragma unroll
    for (int i = 0; i < N; i++, o += 128 * 32) {
        v[i] = 0;
        if (o < end) asm volatile("ld.global.nc.u8 %0, [%1];" : "=r"(v[i]) : "l"(o < b ? b : o));
    }
    for (; o < end; o += 128 * 32)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(o));
}

/* Consume touched bytes at the end of a kernel: their sum (at most 255 per byte, so never all
 * ones for fewer than 2^24 bytes) decides a store that cannot happen, which keeps the loads
 * alive without any instruction waiting for them before this point. */
__device__ __forceinline__ void engine_cu_sink(uint32_t sum, float *never) {
    if (sum == 0xffffffffu) *never = 0.0f;
}

/* Whether w is one of the words of e (words: runs of letters and digits; e may be NULL), so
 * that "kint" does not match inside "nokint". */
static inline bool engine_cu_env_word(const char *e, const char *w) {
    const size_t n = strlen(w);
    for (const char *p = e ? strstr(e, w) : NULL; p; p = strstr(p + 1, w)) {
        const bool a = p == e || !isalnum((unsigned char)p[-1]), b = !isalnum((unsigned char)p[n]);
        if (a && b) return true;
    }
    return false;
}

/* Multiprocessors of the current device (1 when the query fails; the error stays for the
 * caller's cudaGetLastError). */
static inline int engine_cu_sm_count() {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms < 1)
        return 1;
    return sms;
}

/* Whether the current device takes the bulk copies into shared memory (engine_cu_bulk_g2s:
 * sm_90 and later); a failed query says no, its error cleared. */
static inline bool engine_cu_bulk_ok() {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return major >= 9;
}

/* Whether `blocks` blocks of `kernel` (`threads` threads, `smem` bytes of dynamic shared memory,
 * the attribute for more than 48 KB set first) are resident at once: one wave. A failed query
 * says no, its error cleared. */
template <typename K>
static inline bool engine_cu_one_wave(K kernel, int threads, size_t smem, int blocks) {
    int occ = 0;
    if (smem > 48 * 1024)
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, threads, smem) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return (long)occ * engine_cu_sm_count() >= blocks;
}

/* Launch with programmatic stream serialisation when pdl (the kernel must call engine_cu_pdl_wait
 * before touching anything a previous kernel writes or reads) and, with cluster_y > 0, thread
 * block clusters of 1 x cluster_y x 1 blocks. Errors surface in cudaGetLastError. */
template <typename... KA, typename... A>
static inline void engine_cu_launch_ex(void (*kernel)(KA...), dim3 grid, dim3 block, size_t smem,
                                       cudaStream_t st, bool pdl, unsigned cluster_y,
                                       A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at[2];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
    at[1].id = cudaLaunchAttributeClusterDimension;
    at[1].val.clusterDim.x = 1;
    at[1].val.clusterDim.y = cluster_y;
    at[1].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = cluster_y > 0 ? 2 : 1;
    if (smem > 48 * 1024)
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    cudaLaunchKernelEx(&cfg, kernel, args...);
}

/* Launch with programmatic stream serialisation, no clusters. */
template <typename... KA, typename... A>
static inline void engine_cu_launch(void (*kernel)(KA...), dim3 grid, dim3 block, size_t smem,
                                    cudaStream_t st, A... args) {
    engine_cu_launch_ex(kernel, grid, block, smem, st, true, 0u, args...);
}

#endif
