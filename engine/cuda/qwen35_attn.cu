/* Gated decode attention of qwen35moe (contract in qwen35_attn.cuh). */
#include <algorithm>
#include <cuda_fp16.h>
#include <math.h>

#include "gatt_dev.cuh"
#include "qwen35_attn.cuh"

#define GATT_THREADS 256
#define GATT_WARPS (GATT_THREADS / 32)
#define SPL ENGINE_CU_GATT_SPLIT
static_assert(SPL <= 32, "the softmax takes a split's scores one per lane");

bool engine_cu_gatt_ok(int n_head, int n_kv, int hd, int rot) {
    if (n_kv < 1 || n_head % n_kv) return false;
    const int g = n_head / n_kv;
    return (hd == 64 || hd == 128 || hd == 256) &&
           (g == 1 || g == 2 || g == 4 || g == 8 || g == 16) && rot >= 2 && rot % 2 == 0 &&
           rot <= hd;
}

int engine_cu_gatt_splits(int n_ctx) {
    return (n_ctx + SPL - 1) / SPL;
}

/* ---------------------------------------------------------------------------------------------
 * Short context (engine_cu_gatt.short_n): one block per query head over all n <= short_n
 * positions, writing the gated output itself (the merge launch then does nothing).
 * ------------------------------------------------------------------------------------------- */

/* N consecutive cache values from src (a generic pointer: the cache in global memory or the
 * block's shared copy of the new row), N * element size bytes aligned; as floats. */
template <int N, bool F32> __device__ __forceinline__ void gs_load(const void *src, float *o) {
    static_assert(N == 2 || N == 4 || N == 8, "2, 4 or 8 values");
    if constexpr (F32) {
        const float4 *p4 = (const float4 *)src;
        if constexpr (N == 2) {
            const float2 x = *(const float2 *)src;
            o[0] = x.x, o[1] = x.y;
        } else {
#pragma unroll
            for (int i = 0; i < N / 4; i++) {
                const float4 x = p4[i];
                o[4 * i] = x.x, o[4 * i + 1] = x.y, o[4 * i + 2] = x.z, o[4 * i + 3] = x.w;
            }
        }
    } else {
        __half2 h[N / 2];
        if constexpr (N == 2)
            *(unsigned *)h = *(const unsigned *)src;
        else if constexpr (N == 4)
            *(uint2 *)h = *(const uint2 *)src;
        else
            *(uint4 *)h = *(const uint4 *)src;
#pragma unroll
        for (int i = 0; i < N / 2; i++) {
            const float2 f = __half22float2(h[i]);
            o[2 * i] = f.x, o[2 * i + 1] = f.y;
        }
    }
}

/* 8 consecutive values of dimension-major chunk (16 bytes of F16, 32 of F32) as floats. */
template <bool F32> __device__ __forceinline__ void gs_load8(const void *src, float *o) {
    gs_load<8, F32>(src, o);
}

constexpr int GS_MAX_SPLITS = ENGINE_CU_GATT_SHORT_MAX / SPL; /* one warp per split */
static_assert(GS_MAX_SPLITS <= GATT_WARPS, "a warp per split's softmax");

constexpr size_t gatt_short_smem_floats(int hd) {
    /* q, the new K row (F32), its and V's cache-format copies, the scores, the splits' partials
     * [split][hd + 2] as the runners write them, the V sums [split][position group][hd] */
    return 4 * (size_t)hd + ENGINE_CU_GATT_SHORT_MAX + (size_t)GS_MAX_SPLITS * (hd + 2) +
           (size_t)GS_MAX_SPLITS * GATT_THREADS;
}

/* Query head h (of KV head g; `store`: the group's first head, whose block alone writes this
 * position's K/V row to the cache) over positions 0..pos, n = pos + 1 <= SHORT_MAX. The other
 * blocks of the group take row pos from a shared-memory copy (rounded to the cache's type as
 * the store does), never from the cache, so nothing races with the store.
 * Bit for bit the split path (gatt_kernel + gatt_merge_kernel), which at n <= 128 runners x 32
 * runs one split per runner: every value is that path's expression on the same operands in the
 * same order, only computed by other threads: a score is a warp's dot (lane l: dimensions
 * l + 32 t in t order, then the butterfly sum), a split's softmax a warp's (max, exp, sum over
 * its lanes), a split's weighted V per dimension and position group the sequential sum over
 * its positions pg, pg + PG, .. (a thread takes 8 dimensions of one (split, group) chain with
 * 16-byte loads), the groups added in order, then the merge of the splits by gatt_dev.cuh's
 * merge functions. Barriers: after the q/k preparation, the scores, the softmax, the V sums,
 * (PG > 1: the group sums,) the merge weights. */
template <int HD, bool F32>
__device__ __forceinline__ void gatt_short_block(const engine_cu_gatt a, int h, int g, bool store,
                                                 int pos, float *sm) {
    constexpr int PG = GATT_THREADS / HD;   /* position groups of the split path's V sums */
    constexpr int OCT = HD / 8;             /* 8-dimension chunks of a row */
    constexpr int CHAIN = GATT_THREADS / GS_MAX_SPLITS; /* threads per split: PG * OCT */
    static_assert(PG * OCT == CHAIN, "a thread per (group, 8 dimensions) of a split");
    constexpr size_t ES = F32 ? 4 : 2;
    const int tid = threadIdx.x, lane = tid & 31, wi = tid >> 5;
    const int n = pos + 1, nsplit = (n + SPL - 1) / SPL, half = a.rot / 2;
    const size_t row = (size_t)a.n_kv * HD, col = (size_t)g * HD;
    float *qs = sm;                                 /* [HD] */
    float *kf = qs + HD;                            /* [HD] */
    void *krs = kf + HD;                            /* [HD] of the cache's type */
    void *vrs = kf + 2 * HD;                        /* [HD] of the cache's type */
    float *e = kf + 3 * HD;                         /* [SHORT_MAX] scores, then weights */
    float *ph = e + ENGINE_CU_GATT_SHORT_MAX;       /* [GS_MAX_SPLITS][HD + 2] */
    float *red = ph + GS_MAX_SPLITS * (HD + 2);     /* [GS_MAX_SPLITS][PG][HD] */
    __shared__ float wr[GS_MAX_SPLITS];
    __shared__ float inv_den;
    const float2 *cs = a.rope + (size_t)pos * half;
    /* the output gate of this thread's dimension, loaded while the rest runs */
    const float gate = tid < HD ? a.qg[(size_t)h * 2 * HD + HD + tid] : 0.0f;
    if (wi == 0) {
        engine_cu_gatt_norm_rope<HD>(a.qg + (size_t)h * 2 * HD, a.q_norm, a.eps, cs, half, qs);
    } else if (wi == 1) {
        engine_cu_gatt_norm_rope<HD>(a.k + col, a.k_norm, a.eps, cs, half, kf);
        if (store)
            engine_cu_gatt_store_kv<HD>(kf, a.v, col, a.k_cache, a.v_cache, F32,
                                        (size_t)pos * row + col, lane);
#pragma unroll
        for (int t = 0; t < HD / 32; t++) {
            const int i = lane + 32 * t;
            if constexpr (F32) {
                ((float *)krs)[i] = kf[i];
                ((float *)vrs)[i] = a.v[col + i];
            } else {
                ((__half *)krs)[i] = __float2half_rn(kf[i]);
                ((__half *)vrs)[i] = __float2half_rn(a.v[col + i]);
            }
        }
    }
    __syncthreads();
    /* scores: a warp a position as the split path (GS_P positions at once for the loads) */
    const float scale = 1.0f / sqrtf((float)HD);
    constexpr int GS_P = 4;
    for (int b = wi * GS_P; b < n; b += GS_P * GATT_WARPS) {
        float kv[GS_P][HD / 32];
#pragma unroll
        for (int u = 0; u < GS_P; u++) {
            const int p = b + u;
            const char *src = p == pos ? (const char *)krs
                                       : (const char *)a.k_cache + ((size_t)p * row + col) * ES;
#pragma unroll
            for (int t = 0; t < HD / 32; t++)
                kv[u][t] = p < n ? engine_cu_gatt_load(src, F32, (size_t)(lane + 32 * t)) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < GS_P; u++) {
            float acc = 0.0f;
#pragma unroll
            for (int t = 0; t < HD / 32; t++)
                acc += qs[lane + 32 * t] * kv[u][t];
            acc = engine_cu_warp_sum(acc);
            if (lane == 0 && b + u < n) e[b + u] = acc * scale;
        }
    }
    __syncthreads();
    /* each split's max and sum (warp s), e := exp(score - max), as the split path */
    if (wi < nsplit) {
        float *es = e + wi * SPL;
        const int np = min(SPL, n - wi * SPL);
        const float x = lane < np ? es[lane] : -INFINITY;
        const float m = engine_cu_warp_max(x);
        const float ex = lane < np ? expf(x - m) : 0.0f;
        if (lane < np) es[lane] = ex;
        const float l = engine_cu_warp_sum(ex);
        if (lane == 0) {
            ph[wi * (HD + 2) + HD] = m;
            ph[wi * (HD + 2) + HD + 1] = l;
        }
    }
    __syncthreads();
    /* weighted V: thread (split s, group pg, dimensions o8 .. o8 + 7), positions pg, pg + PG, ..
     * of the split in order (the split path's per-dimension chain) */
    {
        const int s = tid / CHAIN, r = tid - s * CHAIN, pg = r / OCT, o8 = (r - pg * OCT) * 8;
        if (s < nsplit) {
            const int p0 = s * SPL, np = min(SPL, n - p0);
            float acc[8];
#pragma unroll
            for (int j = 0; j < 8; j++)
                acc[j] = 0.0f;
#pragma unroll 8
            for (int pi = pg; pi < np; pi += PG) {
                const int p = p0 + pi;
                const char *src = p == pos ? (const char *)vrs
                                           : (const char *)a.v_cache + ((size_t)p * row + col) * ES;
                float v[8];
                gs_load8<F32>(src + (size_t)o8 * ES, v);
                const float w = e[s * SPL + pi];
#pragma unroll
                for (int j = 0; j < 8; j++)
                    acc[j] += w * v[j];
            }
#pragma unroll
            for (int j = 0; j < 8; j++)
                red[((size_t)s * PG + pg) * HD + o8 + j] = acc[j];
        }
    }
    __syncthreads();
    /* each split's partial: the groups' sums added in order (a runner's merge of its one split
     * is that sum exactly: run = 0 * exp(-inf) + sum * exp(0)) */
    for (int i = tid; i < nsplit * HD; i += GATT_THREADS) {
        const int s = i / HD, d = i - s * HD;
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < PG; k++)
            sum += red[((size_t)s * PG + k) * HD + d];
        ph[s * (HD + 2) + d] = sum;
    }
    __syncthreads();
    /* the merge of the splits, as gatt_merge_kernel */
    engine_cu_gatt_merge_weights<HD>(ph, nsplit, tid, lane, wr, inv_den);
    __syncthreads();
    if (tid < HD) {
        const float num = engine_cu_gatt_merge_num<HD>(ph, nsplit, tid, wr);
        a.out[(size_t)h * HD + tid] = num * inv_den * (1.0f / (1.0f + expf(-gate)));
    }
}

/* ENGINE_CU_GATT_EARLY (decode step, before the PDL wait): the block asks L2 for the K and V
 * rows it will read, positions before pos only (pos itself is stored in this launch): the
 * short path's block all of them (n <= 256), a split-path runner its first split. */
template <int G, int HD> __device__ __forceinline__ void gatt_prefetch(const engine_cu_gatt &a) {
    const int pos = *a.pos, n = pos + 1, nsplit = (n + SPL - 1) / SPL;
    const size_t row = (size_t)a.n_kv * HD, es = a.kv_f32 ? 4 : 2;
    constexpr int LINES = HD * 4 / 128; /* 128-byte lines of an F32 row (F16: half of them) */
    const int lines = a.kv_f32 ? LINES : LINES / 2, tid = threadIdx.x;
    int p_lo, p_hi; /* [p_lo, p_hi) */
    if (n <= (a.short_n & ~ENGINE_CU_GATT_EARLY)) {
        if ((int)blockIdx.y >= G) return;
        p_lo = 0, p_hi = pos;
    } else {
        const int nact = min((int)gridDim.y, nsplit);
        if ((int)blockIdx.y >= nact) return;
        p_lo = (int)blockIdx.y * SPL, p_hi = min(p_lo + SPL, pos);
    }
    const size_t col = (size_t)blockIdx.x * HD;
    for (int i = tid; i < (p_hi - p_lo) * lines; i += GATT_THREADS) {
        const int p = p_lo + i / lines, l = i - (i / lines) * lines;
        const size_t off = ((size_t)p * row + col) * es + (size_t)l * 128;
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)a.k_cache + off));
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)a.v_cache + off));
    }
}

/* Grid (n_kv, runners) of GATT_THREADS; with SHORT (a.short_n > 0) at least G runners: while
 * pos + 1 <= a.short_n, block (g, y < G) serves query head g G + y alone (the rest exit), else
 * the split path below (its runners are the same: runners >= splits of pos + 1 or 128).
 * SHORT (the sessions' instance) is compiled for two blocks per multiprocessor (<= 128
 * registers, no spills: 120 for G 8, HD 256; it took 146 with one), so that the split path's
 * 2 x 128 runners at depth run in one wave instead of two. */
template <int G, int HD, bool SHORT>
__global__ void __launch_bounds__(GATT_THREADS, SHORT ? 2 : 0) gatt_kernel(engine_cu_gatt a) {
    constexpr int PG = GATT_THREADS / HD; /* position groups of the V sums */
    constexpr int EPT = (G * HD + GATT_THREADS - 1) / GATT_THREADS; /* merged elements/thread */
    extern __shared__ float ga_smem[];
    __shared__ float ml[G][2], rml[G][2]; /* the split's, the runner's running (max, sum) */
    const int g = blockIdx.x, tid = threadIdx.x, lane = tid & 31, wi = tid >> 5;
    float *qs = ga_smem;           /* [G][HD] */
    float *e = qs + G * HD;        /* [G][SPL] */
    float *red = e + G * SPL;      /* [PG][G][HD] */
    float *kr = red + PG * G * HD; /* [HD] */
    engine_cu_pdl_launch();
    if constexpr (SHORT)
        if (a.short_n & ENGINE_CU_GATT_EARLY) gatt_prefetch<G, HD>(a);
    engine_cu_pdl_wait();
    const int pos = *a.pos, n = pos + 1, nsplit = (n + SPL - 1) / SPL;
    if constexpr (SHORT) {
        if (n <= (a.short_n & ~ENGINE_CU_GATT_EARLY)) {
            extern __shared__ __align__(16) float gs_smem[]; /* ga_smem, 16-byte aligned */
            const int y = blockIdx.y;
            if (y < G && a.kv_f32)
                gatt_short_block<HD, true>(a, g * G + y, g, y == 0, pos, gs_smem);
            else if (y < G)
                gatt_short_block<HD, false>(a, g * G + y, g, y == 0, pos, gs_smem);
            return;
        }
    }
    const int nact = min((int)gridDim.y, nsplit);
    if ((int)blockIdx.y >= nact) return;
    const int max_splits = (a.n_ctx + SPL - 1) / SPL, half = a.rot / 2;
    const size_t row = (size_t)a.n_kv * HD;
    const float2 *cs = a.rope + (size_t)pos * half;
    for (int h = wi; h < G; h += GATT_WARPS)
        engine_cu_gatt_norm_rope<HD>(a.qg + (size_t)(g * G + h) * 2 * HD, a.q_norm, a.eps, cs, half,
                                     qs + h * HD);
    if ((int)blockIdx.y == (pos / SPL) % nact && wi == GATT_WARPS - 1) {
        /* this position's K and V rows, read by this block alone */
        engine_cu_gatt_norm_rope<HD>(a.k + (size_t)g * HD, a.k_norm, a.eps, cs, half, kr);
        const size_t o = (size_t)pos * row + (size_t)g * HD;
        engine_cu_gatt_store_kv<HD>(kr, a.v, (size_t)g * HD, a.k_cache, a.v_cache, a.kv_f32, o,
                                    lane);
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf((float)HD);
    const int pg = tid / HD, d = tid - pg * HD;
    /* this runner's running merge of its splits: elements tid + j * GATT_THREADS of [G][HD] */
    float run[EPT];
#pragma unroll
    for (int j = 0; j < EPT; j++)
        run[j] = 0.0f;
    if (tid < G) {
        rml[tid][0] = -INFINITY;
        rml[tid][1] = 0.0f;
    }
    for (int s = blockIdx.y; s < nsplit; s += nact) {
        const int p0 = s * SPL, np = min(SPL, n - p0);
        /* scores: a warp per position (SHORT: the warp's SPL / 8 positions' loads together) */
        if constexpr (SHORT) {
            constexpr int PW = SPL / GATT_WARPS;
            float kv[PW][HD / 32];
#pragma unroll
            for (int u = 0; u < PW; u++) {
                const int pi = wi + u * GATT_WARPS;
                const size_t base = (size_t)(p0 + pi) * row + (size_t)g * HD;
#pragma unroll
                for (int t = 0; t < HD / 32; t++)
                    kv[u][t] = pi < np ? engine_cu_gatt_load(a.k_cache, a.kv_f32,
                                                             base + lane + 32 * t)
                                       : 0.0f;
            }
            asm volatile("" ::: "memory"); /* keep the loads ahead of the sums */
#pragma unroll
            for (int u = 0; u < PW; u++) {
                const int pi = wi + u * GATT_WARPS;
                if (pi >= np) break;
#pragma unroll
                for (int h = 0; h < G; h++) {
                    float acc = 0.0f;
#pragma unroll
                    for (int t = 0; t < HD / 32; t++)
                        acc += qs[h * HD + lane + 32 * t] * kv[u][t];
                    acc = engine_cu_warp_sum(acc);
                    if (lane == 0) e[h * SPL + pi] = acc * scale;
                }
            }
        } else {
            for (int pi = wi; pi < np; pi += GATT_WARPS) {
                const size_t base = (size_t)(p0 + pi) * row + (size_t)g * HD;
                float kv[HD / 32];
#pragma unroll
                for (int t = 0; t < HD / 32; t++)
                    kv[t] = engine_cu_gatt_load(a.k_cache, a.kv_f32, base + lane + 32 * t);
#pragma unroll
                for (int h = 0; h < G; h++) {
                    float acc = 0.0f;
#pragma unroll
                    for (int t = 0; t < HD / 32; t++)
                        acc += qs[h * HD + lane + 32 * t] * kv[t];
                    acc = engine_cu_warp_sum(acc);
                    if (lane == 0) e[h * SPL + pi] = acc * scale;
                }
            }
        }
        __syncthreads();
        /* each head's max and sum over the split; e := exp(score - max) */
        for (int h = wi; h < G; h += GATT_WARPS) {
            float *eh = e + h * SPL;
            const float x = lane < np ? eh[lane] : -INFINITY;
            const float m = engine_cu_warp_max(x);
            const float ex = lane < np ? expf(x - m) : 0.0f;
            if (lane < np) eh[lane] = ex;
            const float l = engine_cu_warp_sum(ex);
            if (lane == 0) {
                ml[h][0] = m;
                ml[h][1] = l;
            }
        }
        __syncthreads();
        /* weighted V: thread (position group pg, dimension d) */
        float acc[G];
#pragma unroll
        for (int h = 0; h < G; h++)
            acc[h] = 0.0f;
        if constexpr (SHORT) { /* the thread's SPL / PG values loaded together, then summed */
            constexpr int NV = SPL / PG;
            float vv[NV];
#pragma unroll
            for (int i = 0; i < NV; i++) {
                const int pi = pg + i * PG;
                vv[i] = pi < np ? engine_cu_gatt_load(a.v_cache, a.kv_f32,
                                                      (size_t)(p0 + pi) * row + (size_t)g * HD + d)
                                : 0.0f;
            }
            asm volatile("" ::: "memory");
#pragma unroll
            for (int i = 0; i < NV; i++) {
                const int pi = pg + i * PG;
                if (pi >= np) break;
#pragma unroll
                for (int h = 0; h < G; h++)
                    acc[h] += e[h * SPL + pi] * vv[i];
            }
        } else {
#pragma unroll 4
            for (int pi = pg; pi < np; pi += PG) {
                const float v = engine_cu_gatt_load(a.v_cache, a.kv_f32,
                                                    (size_t)(p0 + pi) * row + (size_t)g * HD + d);
#pragma unroll
                for (int h = 0; h < G; h++)
                    acc[h] += e[h * SPL + pi] * v;
            }
        }
#pragma unroll
        for (int h = 0; h < G; h++)
            red[((size_t)pg * G + h) * HD + d] = acc[h];
        __syncthreads();
        /* into the running merge (rescaled to the new running max) */
#pragma unroll
        for (int j = 0; j < EPT; j++) {
            const int i = tid + j * GATT_THREADS;
            if (i < G * HD) {
                const int h = i / HD, dd = i - h * HD;
                float sum = 0.0f;
#pragma unroll
                for (int k = 0; k < PG; k++)
                    sum += red[((size_t)k * G + h) * HD + dd];
                const float mo = rml[h][0], ms = ml[h][0], mn = fmaxf(mo, ms);
                run[j] = run[j] * expf(mo - mn) + sum * expf(ms - mn);
            }
        }
        __syncthreads();
        if (tid < G) {
            const float mo = rml[tid][0], ms = ml[tid][0], mn = fmaxf(mo, ms);
            rml[tid][1] = rml[tid][1] * expf(mo - mn) + ml[tid][1] * expf(ms - mn);
            rml[tid][0] = mn;
        }
        __syncthreads();
    }
    /* one partial per runner: [G][HD] weighted V, then the max and the sum */
#pragma unroll
    for (int j = 0; j < EPT; j++) {
        const int i = tid + j * GATT_THREADS;
        if (i < G * HD) {
            const int h = i / HD, dd = i - h * HD;
            float *pp = a.partial + ((size_t)(g * G + h) * max_splits + blockIdx.y) * (HD + 2);
            pp[dd] = run[j];
            if (dd == 0) {
                pp[HD] = rml[h][0];
                pp[HD + 1] = rml[h][1];
            }
        }
    }
}

/* The merge of the runners' partials: block (head, 64 dimensions) of 64 threads; warp 0 takes
 * the runners' weights exp(m_r - m) once (shared memory) and the denominator, then each thread
 * sums its dimension over the runners (coalesced rows) and applies the output gate.
 * SHORT (the default sessions' instance): the same values in the same order with the loads
 * issued together (each lane's runners' (max, sum) at once, the numerator's partials 32 at a
 * time instead of 8), so a deep context waits for a few round trips, not one per 8 runners. */
template <int HD, bool SHORT>
__global__ void __launch_bounds__(64) gatt_merge_kernel(engine_cu_gatt a) {
    __shared__ float wr[ENGINE_CU_GATT_RUNNERS];
    __shared__ float inv_den;
    engine_cu_pdl_launch();
    engine_cu_pdl_wait();
    const int h = blockIdx.x, tid = threadIdx.x, lane = tid & 31;
    const int n = *a.pos + 1, nsplit = (n + SPL - 1) / SPL, max_splits = (a.n_ctx + SPL - 1) / SPL;
    if constexpr (SHORT)
        if (n <= (a.short_n & ~ENGINE_CU_GATT_EARLY)) return; /* the short block wrote it */
    const int nact = min(min(max_splits, ENGINE_CU_GATT_RUNNERS), nsplit);
    const float *ph = a.partial + (size_t)h * max_splits * (HD + 2);
    const int dd = (int)blockIdx.y * 64 + tid;
    const float gate = a.qg[(size_t)h * 2 * HD + HD + dd];
    float num = 0.0f;
    if constexpr (SHORT) {
        /* engine_cu_gatt_merge_weights' values: fmaxf in any order is the same max, and each
         * lane's sum runs over its runners lane, lane + 32, .. in that order */
        constexpr int PER = ENGINE_CU_GATT_RUNNERS / 32;
        if (tid < 32) {
            float mr[PER], lr[PER];
#pragma unroll
            for (int j = 0; j < PER; j++) {
                const int r = lane + 32 * j;
                mr[j] = r < nact ? ph[(size_t)r * (HD + 2) + HD] : -INFINITY;
                lr[j] = r < nact ? ph[(size_t)r * (HD + 2) + HD + 1] : 0.0f;
            }
            float m = -INFINITY;
#pragma unroll
            for (int j = 0; j < PER; j++)
                m = fmaxf(m, mr[j]);
            m = engine_cu_warp_max(m);
            float den = 0.0f;
#pragma unroll
            for (int j = 0; j < PER; j++) {
                const int r = lane + 32 * j;
                if (r < nact) {
                    const float w = expf(mr[j] - m);
                    wr[r] = w;
                    den += w * lr[j];
                }
            }
            den = engine_cu_warp_sum(den);
            if (lane == 0) inv_den = 1.0f / den;
        }
        __syncthreads();
        /* engine_cu_gatt_merge_num's sum, r in order, its loads 32 at a time */
        int r = 0;
        for (; r + 32 <= nact; r += 32) {
            float v[32];
#pragma unroll
            for (int i = 0; i < 32; i++)
                v[i] = ph[(size_t)(r + i) * (HD + 2) + dd];
            asm volatile("" ::: "memory"); /* keep the 32 loads ahead of the sum */
#pragma unroll
            for (int i = 0; i < 32; i++)
                num += wr[r + i] * v[i];
        }
        for (; r < nact; r++)
            num += wr[r] * ph[(size_t)r * (HD + 2) + dd];
    } else {
        engine_cu_gatt_merge_weights<HD>(ph, nact, tid, lane, wr, inv_den);
        __syncthreads();
        num = engine_cu_gatt_merge_num<HD>(ph, nact, dd, wr);
    }
    a.out[(size_t)h * HD + dd] = num * inv_den * (1.0f / (1.0f + expf(-gate)));
}

template <int G, int HD> static void gatt_launch(const engine_cu_gatt *a, cudaStream_t stream) {
    constexpr int PG = GATT_THREADS / HD;
    size_t smem = sizeof(float) * ((size_t)G * HD + (size_t)G * SPL + (size_t)PG * G * HD + HD);
    const int runners = min(engine_cu_gatt_splits(a->n_ctx), ENGINE_CU_GATT_RUNNERS);
    if ((a->short_n & ~ENGINE_CU_GATT_EARLY) <= 0) {
        engine_cu_launch(gatt_kernel<G, HD, false>, dim3(a->n_kv, runners), dim3(GATT_THREADS),
                         smem, stream, *a);
        engine_cu_launch(gatt_merge_kernel<HD, false>, dim3(a->n_head, HD / 64), dim3(64), 0,
                         stream, *a);
        return;
    }
    smem = std::max(smem, sizeof(float) * gatt_short_smem_floats(HD));
    engine_cu_launch(gatt_kernel<G, HD, true>, dim3(a->n_kv, std::max(runners, G)),
                     dim3(GATT_THREADS), smem, stream, *a);
    engine_cu_launch(gatt_merge_kernel<HD, true>, dim3(a->n_head, HD / 64), dim3(64), 0, stream,
                     *a);
}

template <int HD> static void gatt_launch_hd(const engine_cu_gatt *a, cudaStream_t stream) {
    switch (a->n_head / a->n_kv) {
    case 1:
        gatt_launch<1, HD>(a, stream);
        break;
    case 2:
        gatt_launch<2, HD>(a, stream);
        break;
    case 4:
        gatt_launch<4, HD>(a, stream);
        break;
    case 8:
        gatt_launch<8, HD>(a, stream);
        break;
    default:
        gatt_launch<16, HD>(a, stream);
        break;
    }
}

void engine_cu_gatt_run(const engine_cu_gatt *a_in, cudaStream_t stream) {
    engine_cu_gatt b = *a_in, *a = &b;
    const int early = b.short_n & ENGINE_CU_GATT_EARLY, sn = b.short_n & ~ENGINE_CU_GATT_EARLY;
    b.short_n = std::min(std::max(sn, 0), ENGINE_CU_GATT_SHORT_MAX);
    if (b.short_n > 0) b.short_n |= early;
    if (a->hd == 64)
        gatt_launch_hd<64>(a, stream);
    else if (a->hd == 128)
        gatt_launch_hd<128>(a, stream);
    else
        gatt_launch_hd<256>(a, stream);
}

/* ---------------------------------------------------------------------------------------------
 * Prefill (many positions of one sequence): the q/k preparation with the KV store, and the
 * output gate; the attention itself is prefill.cu's causal pass.
 * ------------------------------------------------------------------------------------------- */

/* A warp per (token, head): query heads first (to q), then KV heads (to the cache). */
template <int HD> __global__ void __launch_bounds__(256) gatt_pf_qk_kernel(engine_cu_gatt_pf a) {
    __shared__ float buf[8][HD];
    const int wi = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nh = a.n_head, nkv = a.n_kv, per = nh + nkv;
    const long j = (long)blockIdx.x * 8 + wi;
    if (j >= (long)a.n * per) return;
    const int t = (int)(j / per), hh = (int)(j - (long)t * per), pos = a.pos0 + t;
    const int half = a.rot / 2;
    const float2 *cs = a.rope + (size_t)pos * half;
    float *dst = buf[wi];
    if (hh < nh) {
        engine_cu_gatt_norm_rope<HD>(a.qg + ((size_t)t * nh + hh) * 2 * HD, a.q_norm, a.eps, cs,
                                     half, dst);
#pragma unroll
        for (int u = 0; u < HD / 32; u++)
            a.q[((size_t)t * nh + hh) * HD + lane + 32 * u] = dst[lane + 32 * u];
        return;
    }
    const int g = hh - nh;
    engine_cu_gatt_norm_rope<HD>(a.k + ((size_t)t * nkv + g) * HD, a.k_norm, a.eps, cs, half, dst);
    const size_t o = (size_t)pos * nkv * HD + (size_t)g * HD;
    engine_cu_gatt_store_kv<HD>(dst, a.v, ((size_t)t * nkv + g) * HD, a.k_cache, a.v_cache,
                                a.kv_f32, o, lane);
}

void engine_cu_gatt_pf_qk(const engine_cu_gatt_pf *a, cudaStream_t stream) {
    const long warps = (long)a->n * (a->n_head + a->n_kv);
    if (warps <= 0) return;
    const unsigned blocks = (unsigned)((warps + 7) / 8);
    if (a->hd == 64)
        gatt_pf_qk_kernel<64><<<blocks, 256, 0, stream>>>(*a);
    else if (a->hd == 128)
        gatt_pf_qk_kernel<128><<<blocks, 256, 0, stream>>>(*a);
    else
        gatt_pf_qk_kernel<256><<<blocks, 256, 0, stream>>>(*a);
}

__global__ void gatt_pf_gate_kernel(float *att, const float *qg, int hd, size_t total) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const size_t th = i / (size_t)hd, d = i - th * (size_t)hd; /* th: token * n_head + head */
    const float gate = qg[th * 2 * (size_t)hd + (size_t)hd + d];
    att[i] *= 1.0f / (1.0f + expf(-gate));
}

void engine_cu_gatt_pf_gate(float *att, const float *qg, int n, int n_head, int hd,
                            cudaStream_t stream) {
    const size_t total = (size_t)n * n_head * hd;
    if (total)
        gatt_pf_gate_kernel<<<(unsigned)((total + 255) / 256), 256, 0, stream>>>(att, qg, hd,
                                                                               total);
}

ENGINE_CU_TRACE_TU(qwen35_attn)
