/* Where a small buffer that every block reads lands, in isolation (a benchmark, not a test).
 * Session 42 found the decode step 0.4-1.4% slower when its small buffers (from the attention
 * output `ao` back: vectors every block of the next launch reads) moved by 4 / 16 / 64 KiB, and
 * no change at 256 B / 1 KiB / 256 KiB (bench/RESULTS.md). If the L2's address hash put such a
 * vector's lines on few slices, or all in the L2 partition far from half of the
 * multiprocessors, at some offsets, a read of it by every block would take longer there. This
 * measures that read at each offset of a sweep, in two allocations (a 2 MiB page's low 21 bits
 * are the same in the virtual and the physical address; the bits above are not, so offsets that
 * are bad in both allocations point at a hash of the low bits, which a placement rule can use).
 * Built on its own:
 *
 *   nvcc -O2 -arch=sm_90 -o bench_place bench/cuda/bench_place.cu
 *   bench_place [-b BYTES] [-m MAX_OFFSET] [-s STEP] [-a ALLOCS] [-n LAUNCHES] [-r REPL] [-o CSV]
 *
 * BYTES (default 8,192: x or ao of a 2,048-wide model) at offsets 0, STEP, ... < MAX_OFFSET
 * (default 256 and 2 MiB) from the start of each of ALLOCS (default 2) allocations. Per offset:
 *   lat  one warp per multiprocessor walks the buffer's lines in order, each load (ld.global.cg:
 *        L2, not L1) depending on the one before: cycles a load, mean and max over the blocks
 *        (the max is what a launch whose blocks all wait for the slowest pays)
 *   bw   two blocks of 256 threads per multiprocessor read the whole buffer 16 times (L2 hits
 *        after the first pass): microseconds a launch (CUDA events over 4 x LAUNCHES launches)
 *   wr   the decode step's pattern: 16 blocks write the buffer (as the wo + router launch writes
 *        ao), then a block of 256 threads per multiprocessor reads all of it once (as every MoE
 *        block stages x + ao): cycles of a reading block from its first load to its last,
 *        mean and max over the blocks
 *   wrR  the same with the buffer written REPL times (-r, default 4; 1: not measured), the copies
 *        back to back from the offset, and each reading block reading copy (its SM id % REPL):
 *        whether spreading the one hot vector over more lines (a fix the engine could adopt for
 *        ao and x) lowers the readers' max and flattens it over the offsets
 * Printed: each allocation's distribution (min, p10, median, p90, max) of both, the offsets
 * worst by lat max, and how the allocations agree (the offsets in the worst tenth of both). */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "bench_place: %s: %s\n", #x, cudaGetErrorString(e_));                  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define LAT_REPS 4
#define BW_REPS 16
#define BW_THREADS 256

__device__ __forceinline__ uint32_t ld_cg(const uint32_t *p) {
    uint32_t v;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ float4 ld_cg4(const float4 *p) {
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(p));
    return v;
}

/* One warp: lane l reads word l of each 128-byte line, the line's address depending on the
 * word read before (the buffer holds zeros). */
__global__ void lat_kernel(const uint32_t *p, int n_lines, long long *cyc, uint32_t *sink) {
    const int lane = (int)threadIdx.x;
    uint32_t dep = 0;
    for (int j = 0; j < n_lines; j++) /* into L2 (and the TLB) */
        dep += ld_cg(p + j * 32 + lane + dep);
    __syncwarp();
    const long long t0 = clock64();
    for (int r = 0; r < LAT_REPS; r++)
        for (int j = 0; j < n_lines; j++)
            dep += ld_cg(p + j * 32 + lane + dep);
    const long long t1 = clock64();
    if (lane == 0) cyc[blockIdx.x] = t1 - t0;
    if (dep == 0xdeadbeefu) sink[0] = dep;
}

__global__ void bw_kernel(const float4 *p, int n4, float *sink) {
    float acc = 0.0f;
    for (int r = 0; r < BW_REPS; r++)
        for (int i = (int)threadIdx.x; i < n4; i += BW_THREADS) {
            const float4 v = ld_cg4(p + i);
            acc += v.x + v.y + v.z + v.w;
        }
    if (acc == 1234.5f) sink[blockIdx.x] = acc;
}

#define WR_WRITERS 16

/* n4 float4 of each of the repl copies, back to back (zeros: lat's chain stays in the buffer) */
__global__ void wr_write_kernel(float4 *p, int n4, int repl) {
    for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n4;
         i += (int)(gridDim.x * blockDim.x))
        for (int r = 0; r < repl; r++)
            p[(size_t)r * n4 + i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

__device__ __forceinline__ unsigned sm_id() {
    unsigned v;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(v));
    return v;
}

/* repl > 1: the block reads copy (its SM id % repl) */
__global__ void wr_read_kernel(const float4 *p, int n4, int repl, long long *cyc, float *sink) {
    __shared__ float part[BW_THREADS];
    if (repl > 1) p += (size_t)(sm_id() % (unsigned)repl) * n4;
    __syncthreads();
    const long long t0 = clock64();
    float acc = 0.0f;
    for (int i = (int)threadIdx.x; i < n4; i += BW_THREADS) {
        const float4 v = ld_cg4(p + i);
        acc += v.x + v.y + v.z + v.w;
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    const long long t1 = clock64();
    if (threadIdx.x == 0) {
        cyc[blockIdx.x] = t1 - t0;
        if (part[0] == 1234.5f) sink[blockIdx.x] = part[0];
    }
}

typedef struct {
    double lat_mean, lat_max, bw_us, wr_mean, wr_max, wrr_mean, wrr_max;
} probe;

static double field_of(const probe *q, size_t field) {
    return *(const double *)((const char *)q + field);
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *sorted, int n, double q) {
    int i = (int)(q * (n - 1) + 0.5);
    return sorted[i < 0 ? 0 : i >= n ? n - 1 : i];
}

static void dist(const char *what, const probe *pr, int n, size_t field) {
    double *v = (double *)malloc(sizeof(double) * (size_t)n);
    if (!v) exit(1);
    for (int i = 0; i < n; i++)
        v[i] = field_of(&pr[i], field);
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    printf("  %-22s min %8.2f  p10 %8.2f  median %8.2f  p90 %8.2f  max %8.2f\n", what, v[0],
           pct(v, n, 0.1), pct(v, n, 0.5), pct(v, n, 0.9), v[n - 1]);
    free(v);
}

/* The 8 offsets worst by one field. */
static void worst(const char *what, const probe *pa, int n_off, size_t step, size_t field) {
    int w[8], nw = 0;
    for (int k = 0; k < 8 && k < n_off; k++) {
        int bi = -1;
        for (int o = 0; o < n_off; o++) {
            bool used = false;
            for (int j = 0; j < nw; j++)
                used |= w[j] == o;
            if (!used && (bi < 0 || field_of(&pa[o], field) > field_of(&pa[bi], field))) bi = o;
        }
        w[nw++] = bi;
    }
    printf("  worst by %s:", what);
    for (int j = 0; j < nw; j++)
        printf(" %zu (%.1f)", (size_t)w[j] * step, field_of(&pa[w[j]], field));
    printf("\n");
}

/* The wr pattern at p with repl copies, n_launch times: the reading blocks' cycles, mean and max
 * over the blocks, averaged over the launches. */
static void wr_probe(const uint8_t *p, size_t bytes, int repl, int wr_threads, int n_sm,
                     int n_launch, long long *d_cyc, long long *cyc, uint32_t *d_sink,
                     double *mean_out, double *max_out) {
    double mean = 0.0, mx = 0.0;
    for (int l = 0; l < n_launch; l++) {
        wr_write_kernel<<<WR_WRITERS, wr_threads>>>((float4 *)(uintptr_t)p, (int)(bytes / 16),
                                                    repl);
        wr_read_kernel<<<n_sm, BW_THREADS>>>((const float4 *)p, (int)(bytes / 16), repl, d_cyc,
                                             (float *)d_sink);
        CK(cudaGetLastError());
        CK(cudaMemcpy(cyc, d_cyc, sizeof(long long) * (size_t)n_sm, cudaMemcpyDeviceToHost));
        double s = 0.0, m = 0.0;
        for (int b = 0; b < n_sm; b++) {
            s += (double)cyc[b];
            if ((double)cyc[b] > m) m = (double)cyc[b];
        }
        mean += s / n_sm;
        mx += m;
    }
    *mean_out = mean / n_launch;
    *max_out = mx / n_launch;
}

int main(int argc, char **argv) {
    size_t bytes = 8192, max_off = (size_t)2 << 20, step = 256;
    int n_alloc = 2, n_launch = 5, repl = 4;
    const char *csv = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-b"))
            bytes = strtoull(argv[i + 1], NULL, 0);
        else if (!strcmp(argv[i], "-m"))
            max_off = strtoull(argv[i + 1], NULL, 0);
        else if (!strcmp(argv[i], "-s"))
            step = strtoull(argv[i + 1], NULL, 0);
        else if (!strcmp(argv[i], "-a"))
            n_alloc = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-n"))
            n_launch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-r"))
            repl = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-o"))
            csv = argv[i + 1];
        else {
            fprintf(stderr, "bench_place: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (bytes < 128 || bytes % 128 || step < 16 || step % 16 || max_off < step || n_alloc < 1 ||
        n_alloc > 8 || n_launch < 1 || repl < 1 || repl > 16) {
        fprintf(stderr, "bench_place: bad arguments (BYTES a multiple of 128, STEP of 16, REPL "
                        "1..16)\n");
        return 2;
    }
    int dev = 0, n_sm = 0, clk_khz = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaDeviceGetAttribute(&clk_khz, cudaDevAttrClockRate, dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    const int n_off = (int)(max_off / step);
    const int n_lines = (int)(bytes / 128);
    /* the writers' threads: each of the WR_WRITERS blocks writes its share of the buffer */
    int wr_threads = ((int)(bytes / 16) + WR_WRITERS - 1) / WR_WRITERS;
    wr_threads = wr_threads < 32 ? 32 : wr_threads > 1024 ? 1024 : (wr_threads + 31) / 32 * 32;
    printf("bench_place: %s, %d SMs, L2 %d KiB; %zu bytes at %d offsets (step %zu) in %d "
           "allocations; lat: %d blocks of 32, bw: %d blocks of %d, %d launches; wrR: %d copies\n",
           prop.name, n_sm, prop.l2CacheSize >> 10, bytes, n_off, step, n_alloc, n_sm, 2 * n_sm,
           BW_THREADS, n_launch, repl);
    const size_t region =
        (max_off + (size_t)repl * bytes + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
    uint8_t *base[8] = {0};
    long long *d_cyc = NULL;
    uint32_t *d_sink = NULL;
    CK(cudaMalloc((void **)&d_cyc, sizeof(long long) * (size_t)n_sm));
    CK(cudaMalloc((void **)&d_sink, sizeof(float) * 2 * (size_t)n_sm));
    for (int a = 0; a < n_alloc; a++) {
        /* a gap between the allocations, so that they do not share pages */
        uint8_t *gap = NULL;
        CK(cudaMalloc((void **)&gap, (size_t)(a + 1) * (6 << 20)));
        CK(cudaMalloc((void **)&base[a], region));
        CK(cudaMemset(base[a], 0, region));
        CK(cudaFree(gap));
        printf("  allocation %d at %p (offset in its 2 MiB page %zu)\n", a, (void *)base[a],
               (size_t)((uintptr_t)base[a] & ((2u << 20) - 1)));
    }
    probe *pr = (probe *)calloc((size_t)n_alloc * (size_t)n_off, sizeof *pr);
    long long *cyc = (long long *)malloc(sizeof(long long) * (size_t)n_sm);
    if (!pr || !cyc) return 1;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int a = 0; a < n_alloc; a++)
        for (int o = 0; o < n_off; o++) {
            const uint8_t *p = base[a] + (size_t)o * step;
            probe *q = &pr[(size_t)a * (size_t)n_off + (size_t)o];
            double mean = 0.0, mx = 0.0;
            for (int l = 0; l < n_launch; l++) {
                lat_kernel<<<n_sm, 32>>>((const uint32_t *)p, n_lines, d_cyc, d_sink);
                CK(cudaGetLastError());
                CK(cudaMemcpy(cyc, d_cyc, sizeof(long long) * (size_t)n_sm,
                              cudaMemcpyDeviceToHost));
                double s = 0.0, m = 0.0;
                for (int b = 0; b < n_sm; b++) {
                    const double c = (double)cyc[b] / (LAT_REPS * n_lines);
                    s += c;
                    if (c > m) m = c;
                }
                mean += s / n_sm;
                mx += m;
            }
            q->lat_mean = mean / n_launch;
            q->lat_max = mx / n_launch;
            wr_probe(p, bytes, 1, wr_threads, n_sm, n_launch, d_cyc, cyc, d_sink, &q->wr_mean,
                     &q->wr_max);
            if (repl > 1)
                wr_probe(p, bytes, repl, wr_threads, n_sm, n_launch, d_cyc, cyc, d_sink,
                         &q->wrr_mean, &q->wrr_max);
            bw_kernel<<<2 * n_sm, BW_THREADS>>>((const float4 *)p, (int)(bytes / 16),
                                                (float *)d_sink); /* warm */
            CK(cudaEventRecord(e0));
            for (int l = 0; l < 4 * n_launch; l++)
                bw_kernel<<<2 * n_sm, BW_THREADS>>>((const float4 *)p, (int)(bytes / 16),
                                                    (float *)d_sink);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms = 0.0f;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            q->bw_us = 1e3 * ms / (4 * n_launch);
        }
    FILE *f = csv ? fopen(csv, "w") : NULL;
    if (csv && !f) fprintf(stderr, "bench_place: cannot write %s\n", csv);
    if (f)
        fprintf(f, "alloc,offset,lat_mean_cyc,lat_max_cyc,bw_us,wr_mean_cyc,wr_max_cyc,"
                   "wrr_mean_cyc,wrr_max_cyc\n");
    for (int a = 0; a < n_alloc; a++) {
        const probe *pa = &pr[(size_t)a * (size_t)n_off];
        printf("allocation %d:\n", a);
        dist("lat mean (cycles)", pa, n_off, offsetof(probe, lat_mean));
        dist("lat max (cycles)", pa, n_off, offsetof(probe, lat_max));
        dist("bw (us a launch)", pa, n_off, offsetof(probe, bw_us));
        dist("wr mean (cycles)", pa, n_off, offsetof(probe, wr_mean));
        dist("wr max (cycles)", pa, n_off, offsetof(probe, wr_max));
        if (repl > 1) {
            dist("wrR mean (cycles)", pa, n_off, offsetof(probe, wrr_mean));
            dist("wrR max (cycles)", pa, n_off, offsetof(probe, wrr_max));
        }
        if (f)
            for (int o = 0; o < n_off; o++)
                fprintf(f, "%d,%zu,%.2f,%.2f,%.3f,%.1f,%.1f,%.1f,%.1f\n", a, (size_t)o * step,
                        pa[o].lat_mean, pa[o].lat_max, pa[o].bw_us, pa[o].wr_mean, pa[o].wr_max,
                        pa[o].wrr_mean, pa[o].wrr_max);
        worst("lat max", pa, n_off, step, offsetof(probe, lat_max));
        worst("wr max", pa, n_off, step, offsetof(probe, wr_max));
        if (repl > 1) worst("wrR max", pa, n_off, step, offsetof(probe, wrr_max));
    }
    if (f) fclose(f);
    if (n_alloc >= 2) { /* do the allocations agree on the bad offsets? */
        static const char *const names[4] = {"lat max", "bw", "wr max", "wrR max"};
        const size_t fos[4] = {offsetof(probe, lat_max), offsetof(probe, bw_us),
                               offsetof(probe, wr_max), offsetof(probe, wrr_max)};
        for (int field = 0; field < (repl > 1 ? 4 : 3); field++) {
            const size_t fo = fos[field];
            double th[8];
            double *v = (double *)malloc(sizeof(double) * (size_t)n_off);
            if (!v) return 1;
            for (int a = 0; a < n_alloc; a++) {
                for (int o = 0; o < n_off; o++)
                    v[o] = field_of(&pr[(size_t)a * n_off + o], fo);
                qsort(v, (size_t)n_off, sizeof *v, cmp_d);
                th[a] = pct(v, n_off, 0.9);
            }
            free(v);
            int in0 = 0, both = 0;
            for (int o = 0; o < n_off; o++) {
                const double x0 = field_of(&pr[o], fo);
                const double x1 = field_of(&pr[(size_t)n_off + o], fo);
                if (x0 >= th[0]) {
                    in0++;
                    both += x1 >= th[1];
                }
            }
            printf("%s: of allocation 0's worst tenth (%d offsets), %d are in allocation 1's "
                   "(%.0f%%; 10%% if unrelated)\n",
                   names[field], in0, both, in0 ? 100.0 * both / in0 : 0.0);
        }
    }
    printf("clock %.0f MHz\n", clk_khz / 1e3);
    free(pr);
    free(cyc);
    return 0;
}
