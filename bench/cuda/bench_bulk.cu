/* Bulk copies into shared memory in isolation (a benchmark, not a test): what a block's
 * cp.async.bulk copies cost to issue and to land, by where their sources lie and where their
 * destinations start. The whole-grid MoE launch issues a few such copies per block right after
 * its routing; session 21's timeline had the routing warp spend 2.5 us issuing four of them, and
 * the destinations' alignment alone moved decode by 4-7% (bench/RESULTS.md). Built on its own:
 *
 *   nvcc -O2 -arch=sm_90 -Iengine -o bench_bulk bench/cuda/bench_bulk.cu
 *   bench_bulk [-g GIB] [-r RUN_BYTES] [-n LAUNCHES]
 *
 * One block per multiprocessor, 768 threads (the MoE launch's). Thread 0 takes the clock,
 * arms an mbarrier for all its bytes and issues C copies of RUN_BYTES (default 18,432: a run of
 * 16 Q4_K rows of 2,048 values), then takes the clock again (issue time); every thread waits on
 * the barrier and thread 0 takes the clock a third time (land time). Sources (GIB GiB of device
 * memory, default 16, so the 2 MiB pages exceed what the TLBs hold):
 *   seq   block b's copies one after another from b * C * RUN_BYTES (few pages, each shared by
 *         neighbouring blocks)
 *   page  each copy from a page of its own, drawn at random per launch (likely a TLB miss each,
 *         the worst case of rows picked by the router)
 *   exp   the MoE launch's: a gate and an up run per item, items of 8 experts of 128 picked
 *         per launch, in a layer picked per launch (bench_bulk.cu BB_EXPERT)
 *   hot   every block the same C runs (L2 hits after the first launch)
 *   seqr  as seq from a page drawn per launch (as a launch's weight rows: new pages each launch)
 * seqr and exp also "+w": a launch before each timed one reads one word of every page the timed
 * one's copies read, so that their address translations are warm and their data is not
 * (-w 1: only those, bulk copies).
 * Destinations: 128-byte aligned plus SHIFT bytes (0, 16, 48, 80). Each configuration twice:
 * "bulk" (thread 0's cp.async.bulk copies) and "async" (the same bytes as every thread's
 * 16-byte cp.async through the load/store units, issued before one wait), so that what a
 * multiprocessor's bulk-copy unit takes in can be set against its load path. Per configuration: the
 * medians and p90 over blocks and launches of issue and land time (us after thread 0's first
 * clock), and the launch time (CUDA events) as GB/s of the bytes copied. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/common.cuh"

#define BB_THREADS 768
#define BB_MAX_COPIES 16
#define BB_PAGE ((size_t)2 << 20)

enum { BB_SEQ, BB_PAGE_MODE, BB_EXPERT, BB_HOT, BB_SEQR };

/* BB_EXPERT: the MoE launch's pattern. A layer is a gate and an up tensor of BB_EXPERTS experts
 * of BB_ITEMS runs each, one after the other; a launch picks a layer and BB_USED experts (a
 * hash of the launch), and copy pair (2 i, 2 i + 1) of block b is item b C / 2 + i's gate and up
 * run: slot (item / BB_ITEMS) % BB_USED, run item % BB_ITEMS. */
#define BB_EXPERTS 128
#define BB_USED 8
#define BB_ITEMS 48

__device__ __forceinline__ uint32_t bb_hash(uint32_t h) {
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    h *= 0x297a2d39u;
    return h ^ (h >> 15);
}

__device__ __forceinline__ uint64_t bb_clock() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* The source offset of copy c of block b (the modes above). */
__device__ __forceinline__ size_t bb_off(int mode, int b, int c, int copies, unsigned run,
                                         size_t n_pages, unsigned seed) {
    if (mode == BB_SEQ) return ((size_t)b * copies + c) * run;
    if (mode == BB_PAGE_MODE) { /* a page per copy: a hash of (launch, b, c) */
        const uint32_t h = bb_hash(seed ^ (uint32_t)(b * BB_MAX_COPIES + c) * 0x9e3779b9u);
        return (size_t)(h % (uint32_t)n_pages) * BB_PAGE;
    }
    if (mode == BB_EXPERT) {
        const size_t eb = (size_t)BB_ITEMS * run, tb = (size_t)BB_EXPERTS * eb;
        const uint32_t layers = (uint32_t)(n_pages * BB_PAGE / (2 * tb));
        const uint32_t layer = bb_hash(seed) % (layers ? layers : 1u);
        const int item = b * (copies / 2) + c / 2, slot = (item / BB_ITEMS) % BB_USED;
        const uint32_t e = bb_hash(seed + 977u * (uint32_t)slot) % BB_EXPERTS;
        return (size_t)layer * 2 * tb + (size_t)(c & 1) * tb + (size_t)e * eb +
               (size_t)(item % BB_ITEMS) * run;
    }
    if (mode == BB_SEQR) { /* seq from a page drawn per launch (the pages change each launch) */
        const size_t span = (size_t)BB_MAX_COPIES * 256 * run / BB_PAGE + 1;
        const uint32_t base = bb_hash(seed) % (uint32_t)(n_pages > span ? n_pages - span : 1);
        return (size_t)base * BB_PAGE + ((size_t)b * copies + c) * run;
    }
    return (size_t)c * run;
}

/* Reads one word at the end of each 2 MiB page that copy c of block b (thread c) will read, so
 * that the address translations of the timed launch after it are warm (the pages' data is not:
 * a 16-byte word a page). */
__global__ void bb_touch_kernel(const uint8_t *src, size_t n_pages, int mode, int copies,
                                unsigned run, unsigned seed, unsigned *sink) {
    const int c = threadIdx.x;
    if (c >= copies) return;
    const size_t off = bb_off(mode, blockIdx.x, c, copies, run, n_pages, seed);
    const size_t p0 = off / BB_PAGE, p1 = (off + run - 1) / BB_PAGE;
    unsigned v = 0;
    for (size_t p = p0; p <= p1; p++)
        v += __ldcg((const unsigned *)(src + (p + 1) * BB_PAGE - 16));
    if (v == 0x9e3779b9u) *sink = v; /* never: keeps the loads */
}

/* times[2 b]: issue, times[2 b + 1]: land, ns after thread 0's first clock */
__global__ void __launch_bounds__(BB_THREADS, 1)
    bb_kernel(const uint8_t *src, size_t n_pages, int mode, int copies, unsigned run, int shift,
              unsigned seed, uint32_t *times) {
    extern __shared__ __align__(128) uint8_t bb_smem[];
    __shared__ uint64_t bar;
    const int b = blockIdx.x;
    uint64_t t0 = 0, t1 = 0;
    if (threadIdx.x == 0) {
        engine_cu_mbar_init(&bar);
        t0 = bb_clock();
        engine_cu_mbar_expect(&bar, (unsigned)copies * run);
        for (int c = 0; c < copies; c++) {
            const size_t off = bb_off(mode, b, c, copies, run, n_pages, seed);
            engine_cu_bulk_g2s(bb_smem + shift + (size_t)c * run, src + off, run, &bar);
        }
        t1 = bb_clock();
    }
    __syncthreads();
    engine_cu_mbar_wait(&bar, 0);
    if (threadIdx.x == 0) {
        const uint64_t t2 = bb_clock();
        times[2 * b] = (uint32_t)(t1 - t0);
        times[2 * b + 1] = (uint32_t)(t2 - t0);
    }
}

/* The same bytes by every thread's 16-byte cp.async (the load/store units' path, many requests
 * in flight per thread) instead of the bulk-copy unit: times as bb_kernel's, "issue" when thread
 * 0 has issued its part. */
__global__ void __launch_bounds__(BB_THREADS, 1)
    bb_async_kernel(const uint8_t *src, size_t n_pages, int mode, int copies, unsigned run,
                    int shift, unsigned seed, uint32_t *times) {
    extern __shared__ __align__(128) uint8_t bb_smem[];
    const int b = blockIdx.x;
    const unsigned per = run / 16u;
    uint64_t t0 = 0, t1 = 0;
    if (threadIdx.x == 0) t0 = bb_clock();
    for (int c = 0; c < copies; c++) {
        const uint8_t *s0 = src + bb_off(mode, b, c, copies, run, n_pages, seed);
        uint8_t *d0 = bb_smem + shift + (size_t)c * run;
        for (unsigned i = threadIdx.x; i < per; i += BB_THREADS)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                             (unsigned)__cvta_generic_to_shared(d0 + 16u * i)),
                         "l"(s0 + 16u * i)
                         : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    if (threadIdx.x == 0) t1 = bb_clock();
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) {
        const uint64_t t2 = bb_clock();
        times[2 * b] = (uint32_t)(t1 - t0);
        times[2 * b + 1] = (uint32_t)(t2 - t0);
    }
}

static int bb_cmp(const void *a, const void *b) {
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int bb_cmpf(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

#define BB_CK(x)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "bench_bulk: %s: %s\n", #x, cudaGetErrorString(e_));                   \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv) {
    double gib = 16.0;
    unsigned run = 18432;
    int launches = 50, warm_only = 0; /* -w 1: only the seqr / exp modes, cold and warm, bulk */
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-g"))
            gib = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-r"))
            run = (unsigned)strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "-w"))
            warm_only = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-n"))
            launches = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_bulk [-g GIB] [-r RUN_BYTES] [-n LAUNCHES]\n");
            return 2;
        }
    }
    if (run == 0 || run % 16 || launches < 2 || gib <= 0.0) {
        fprintf(stderr, "bench_bulk: RUN_BYTES a positive multiple of 16, LAUNCHES >= 2\n");
        return 2;
    }
    int dev = 0, sms = 0, optin = 0;
    BB_CK(cudaGetDevice(&dev));
    BB_CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    BB_CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    cudaDeviceProp prop;
    BB_CK(cudaGetDeviceProperties(&prop, dev));
    if (prop.major < 9) {
        fprintf(stderr, "bench_bulk: bulk copies need sm_90 or later (%s is sm_%d%d)\n", prop.name,
                prop.major, prop.minor);
        return 1;
    }
    const size_t bytes = (size_t)(gib * (double)(1u << 30)) / BB_PAGE * BB_PAGE;
    const size_t n_pages = bytes / BB_PAGE;
    uint8_t *src = NULL;
    uint32_t *times = NULL;
    BB_CK(cudaMalloc((void **)&src, bytes));
    BB_CK(cudaMemset(src, 1, bytes));
    BB_CK(cudaMalloc((void **)&times, sizeof(uint32_t) * 2 * (size_t)sms));
    uint32_t *h = (uint32_t *)malloc(sizeof(uint32_t) * 2 * (size_t)sms * (size_t)launches);
    uint32_t *iss = (uint32_t *)malloc(sizeof(uint32_t) * (size_t)sms * (size_t)launches);
    uint32_t *lan = (uint32_t *)malloc(sizeof(uint32_t) * (size_t)sms * (size_t)launches);
    float *ms = (float *)malloc(sizeof(float) * (size_t)launches);
    if (!h || !iss || !lan || !ms) {
        fprintf(stderr, "bench_bulk: out of host memory\n");
        return 1;
    }
    cudaEvent_t e0, e1;
    BB_CK(cudaEventCreate(&e0));
    BB_CK(cudaEventCreate(&e1));
    printf("%s, %d SMs, %.1f GiB of sources (%zu pages of 2 MiB), runs of %u bytes, %d launches\n",
           prop.name, sms, (double)bytes / (1u << 30), n_pages, run, launches);
    printf("eng   mode copies shift | issue us median p90 | land us median p90 | launch us median "
           "| GB/s\n");
    static const char *const names[] = {"seq", "page", "exp", "hot", "seqr"};
    static const int copies_set[] = {1, 2, 4, 6, 16};
    static const int shifts[] = {0, 16, 48, 80};
    for (int eng = 0; eng < 2; eng++)  /* 0 bulk copies, 1 every thread's cp.async */
        for (int mw = 0; mw < 7; mw++) /* mode, and for seqr / exp cold or warm translations */
            for (int ci = 0; ci < (int)(sizeof copies_set / sizeof copies_set[0]); ci++)
                for (int si = 0; si < (int)(sizeof shifts / sizeof shifts[0]); si++) {
                    static const int mws[7][2] = {{0, 0}, {1, 0}, {2, 0}, {3, 0},
                                                  {4, 0}, {4, 1}, {2, 1}};
                    const int mode = mws[mw][0], warm = mws[mw][1];
                    if ((warm_only && (eng || (mode != BB_SEQR && mode != BB_EXPERT)))) continue;
                    if (warm && eng) continue;
                    const int copies = copies_set[ci], shift = shifts[si];
                    if (shift && copies != 2) continue; /* the shifts at one size */
                    const size_t smem = 128 + (size_t)copies * run;
                    if ((mode == BB_SEQ && (size_t)sms * copies * run > bytes) ||
                        (mode == BB_EXPERT &&
                         (copies % 2 || 2 * (size_t)BB_EXPERTS * BB_ITEMS * run > bytes)) ||
                        smem > (size_t)optin)
                        continue;
                    BB_CK(cudaFuncSetAttribute(eng ? bb_async_kernel : bb_kernel,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)smem));
                    for (int l = -1; l < launches; l++) { /* l -1: a warm-up */
                        if (warm)
                            bb_touch_kernel<<<sms, 32>>>(src, n_pages, mode, copies, run,
                                                         0x1234567u + 7919u * (unsigned)(l + 1),
                                                         times);
                        BB_CK(cudaEventRecord(e0));
                        (eng ? bb_async_kernel : bb_kernel)<<<sms, BB_THREADS, smem>>>(
                            src, n_pages, mode, copies, run, shift,
                            0x1234567u + 7919u * (unsigned)(l + 1), times);
                        BB_CK(cudaGetLastError());
                        BB_CK(cudaEventRecord(e1));
                        BB_CK(cudaEventSynchronize(e1));
                        if (l < 0) continue;
                        BB_CK(cudaEventElapsedTime(&ms[l], e0, e1));
                        BB_CK(cudaMemcpy(h + (size_t)l * 2 * sms, times, sizeof(uint32_t) * 2 * sms,
                                         cudaMemcpyDeviceToHost));
                    }
                    const size_t n = (size_t)sms * launches;
                    for (size_t i = 0; i < n; i++) {
                        iss[i] = h[2 * i];
                        lan[i] = h[2 * i + 1];
                    }
                    qsort(iss, n, sizeof *iss, bb_cmp);
                    qsort(lan, n, sizeof *lan, bb_cmp);
                    qsort(ms, (size_t)launches, sizeof *ms, bb_cmpf);
                    const double lm = ms[launches / 2] * 1e3;
                    printf("%-5s %-4s%-2s %6d %5d | %8.2f %8.2f | %8.2f %8.2f | %8.2f | %7.1f\n",
                           eng ? "async" : "bulk", names[mode], warm ? "+w" : "", copies, shift,
                           iss[n / 2] / 1e3, iss[n * 9 / 10] / 1e3, lan[n / 2] / 1e3,
                           lan[n * 9 / 10] / 1e3, lm, (double)sms * copies * run / (lm * 1e3));
                }
    free(h), free(iss), free(lan), free(ms);
    cudaFree(src), cudaFree(times);
    return 0;
}
