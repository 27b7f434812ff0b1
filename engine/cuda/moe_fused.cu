/* The MoE block in one launch (contract in moe_fused.cuh) and engine_cuda_op_moe_fused for the
 * tests. */
#include <string.h>

#include "moe_dev.cuh"
#include "matvec.cuh"
#include "moe_fused.cuh"

extern "C" {
#include "cuda/cuda_backend.h"
}

#define MF_THREADS (FFN_WARPS * 32)

/* Reducers of a launch of nb blocks for n outputs: a share of 64 outputs each (16 float4s, the
 * block's 256 threads 16 per float4), at least one, at most nb. */
__host__ __device__ __forceinline__ int mf_reducers(int nb, int n) {
    const int r = n / 64;
    return r < 1 ? 1 : r > nb ? nb : r;
}

__host__ __device__ __forceinline__ size_t mf_align16(size_t n) {
    return (n + 15) & ~(size_t)15;
}

/* Step 4 (a block's share of its 256-value group's down work): rows i0 .. i1 - 1, eight lanes a
 * row (lane & 7 = the group's chunk c, from base + i * row_bytes: coalesced), four rows a warp
 * and 32 a block per pass. */
#define MF_PRE 4 /* passes whose weights a thread loads before the group wait (a.preload) */

template <int T>
__device__ __forceinline__ void mf_preload(const engine_cu_ffn_down_args &d, const uint8_t *base,
                                           int i0, int i1, engine_cu_qraw raw[MF_PRE]) {
    const int r = ((threadIdx.x >> 5) << 2) + ((threadIdx.x & 31) >> 3), c = threadIdx.x & 7;
#pragma unroll
    for (int u = 0; u < MF_PRE; u++) {
        const int i = i0 + u * ((int)blockDim.x >> 3) + r;
        if (i < i1) engine_cu_qload<T>(base + (size_t)i * d.row_bytes, c, raw[u]);
    }
}

/* The row's eight chunk products summed over its lanes (a fixed tree), w times that stored. */
__device__ __forceinline__ void mf_row_store(int i, int i1, float v, float w, float *part) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    if ((threadIdx.x & 7) == 0 && i < i1) part[i] = w * v;
}

/* part[i] = w * (row i's chunks 0..7 from base . the staged hv) for i in [i0, i1); with pre
 * (quantised T) the first MF_PRE passes from raw (mf_preload): the same sums bit for bit. */
template <int T>
__device__ __forceinline__ void mf_down(const engine_cu_ffn_down_args &d, const uint8_t *base,
                                        int i0, int i1, const engine_cu_xv &hv, float w,
                                        float *part, bool pre, const engine_cu_qraw *raw) {
    const int r = ((threadIdx.x >> 5) << 2) + ((threadIdx.x & 31) >> 3), c = threadIdx.x & 7;
    const int step = (int)blockDim.x >> 3;
    int ib = i0; /* uniform over the block */
    if (engine_cu_type_quant(T) && pre) {
#pragma unroll
        for (int u = 0; u < MF_PRE; u++, ib += step) {
            const int i = ib + r;
            float v = 0.0f;
            if (i < i1) v = engine_cu_qdot_raw<T>(raw[u], base + (size_t)i * d.row_bytes, c, hv);
            mf_row_store(i, i1, v, w, part);
        }
    }
#pragma unroll 4
    for (; ib < i1; ib += step) {
        const int i = ib + r;
        const float v =
            i < i1 ? engine_cu_dot_chunk<T>(base + (size_t)i * d.row_bytes, c, hv) : 0.0f;
        mf_row_store(i, i1, v, w, part);
    }
}

__device__ __forceinline__ void mf_add4(float4 &a, const float4 b) {
    a.x += b.x;
    a.y += b.y;
    a.z += b.z;
    a.w += b.w;
}

/* Step 5 by a reducer (every thread of the block): float4 columns q0 .. q1 - 1 of the outputs;
 * per column MF_TPR threads each sum every MF_TPR-th of the np partials (in order), then the
 * first sums those MF_TPR sums in order (the same association whichever block reduces) and
 * stores y as the down kernel does (down_store). */
#define MF_TPR 4

template <bool RF>
__device__ __forceinline__ void mf_reduce(const engine_cu_ffn_down_args &d, const float *partial,
                                          int np, int q0, int q1, float4 *red) {
    const int n4 = d.rows >> 2, tpr = MF_TPR, nct = (int)blockDim.x / MF_TPR;
    const int cl = (int)threadIdx.x % nct, pp = (int)threadIdx.x / nct;
    const float4 *p4 = (const float4 *)partial;
    for (int qb = q0; qb < q1; qb += nct) { /* uniform over the block */
        const int q = qb + cl;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (pp < tpr && q < q1) {
#pragma unroll 8
            for (int p = pp; p < np; p += tpr)
                mf_add4(acc, __ldcg(p4 + (size_t)p * n4 + q));
        }
        red[threadIdx.x] = acc;
        __syncthreads();
        if (pp == 0 && q < q1) {
            float4 s = red[cl];
            for (int t = 1; t < tpr; t++)
                mf_add4(s, red[t * nct + cl]);
            float4 *y4 = (float4 *)d.y + q;
            float4 y = *y4;
            if (RF) {
                const float4 ya = ((const float4 *)d.y_add)[q];
                y = make_float4((y.x + ya.x) + s.x, (y.y + ya.y) + s.y, (y.z + ya.z) + s.z,
                                (y.w + ya.w) + s.w);
            } else {
                mf_add4(y, s);
            }
            *y4 = y;
        }
        __syncthreads();
    }
}

/* Counters: [0] blocks arrived, [1] reducers done, [2 + j * (n_ff / 256) + g] blocks of slot j's
 * 256-value group g that stored their h, then (class_reduce) [2 + k * n_ff / 256 + m] blocks of
 * row class m (place m in their group) arrived. Partials: [j * (n_ff / 256) + g][n_embd], slot j's
 * group g's share of the down product (weighted), its rows split among the group's blocks. MODE:
 * the staging of both x (for gate/up) and h (for down); RF: the router fusion (up.x_add, dn.y_add).
 */
template <int MODE, bool RF>
__global__ void __launch_bounds__(MF_THREADS, 2) moe_fused_kernel(engine_cu_moe_fused_args a) {
    extern __shared__ uint4 mf_shm[];
    __shared__ int ids[ENGINE_CU_MAX_EXPERT_USED];
    __shared__ float wts[ENGINE_CU_MAX_EXPERT_USED];
    __shared__ unsigned ticket;
    __shared__ float4 red[MF_THREADS];
    const engine_cu_ffn_up_args &u = a.up;
    const engine_cu_ffn_down_args &d = a.dn;
    constexpr bool quant = MODE != ENGINE_CU_X_F32;
    const int S = a.slice, nsl = u.rows / S, ng = u.rows / 256, b = blockIdx.x, nb = gridDim.x;
    const int j = b / nsl, s = b - j * nsl, w = threadIdx.x >> 5;
    const int G = 256 / S, g = s / G, m = s - g * G; /* group g, the block's place m in it */
    uint8_t *xs = (uint8_t *)mf_shm, *hs = xs + mf_align16(engine_cu_xs_bytes(quant, u.cols));
    engine_cu_pdl_launch();
    if (u.norm_w && w == FFN_WARPS - 1)
        engine_cu_prefetch_l2((const uint8_t *)u.norm_w, sizeof(float) * (size_t)u.cols);
    engine_cu_pdl_wait();
    /* 1. route (warp 0) and ask L2 for the block's gate and up rows; the other warps stage x */
    if (w == 0) {
        ffn_route_warp<RF>(u, b, ids, wts);
        const size_t off = (size_t)ids[j] * u.expert_bytes + (size_t)s * S * u.row_bytes;
        engine_cu_prefetch_l2(u.gate + off, (size_t)S * u.row_bytes);
        engine_cu_prefetch_l2(u.up + off, (size_t)S * u.row_bytes);
    }
    if (RF)
        engine_cu_stage_x<MODE, false, true>(u.x, u.cols, u.norm_w, u.eps, xs, 1, u.x_add);
    else
        engine_cu_stage_x<MODE>(u.x, u.cols, u.norm_w, u.eps, xs, 1); /* ends with a barrier */
    if (b == 0 && (int)threadIdx.x < u.k) {
        u.ids[threadIdx.x] = ids[threadIdx.x];
        u.weights[threadIdx.x] = wts[threadIdx.x];
    }
    const int e = ids[j];
    const float wj = wts[j];
    /* the down side: the group's columns col0 .. col0 + 255 are chunks 0..7 from dbase in each
     * row (a superblock, or 8 blocks of 32); the block takes rows i0 .. i1 - 1 of them, whose
     * bytes it asks of L2 now, to arrive during gate/up */
    const int col0 = 256 * g, unit = MODE == ENGINE_CU_X_Q8_K ? 256 : 32;
    const size_t ub = d.row_bytes / (size_t)(d.cols / unit), span = (size_t)(256 / unit) * ub;
    const uint8_t *dbase = d.down + (size_t)e * d.expert_bytes + (size_t)(col0 / unit) * ub;
    const int rpb = (d.rows + G - 1) / G, i0 = min(d.rows, m * rpb), i1 = min(d.rows, i0 + rpb);
    for (int i = i0 + (int)threadIdx.x; i < i1; i += blockDim.x)
        engine_cu_prefetch_rows(dbase + (size_t)i * d.row_bytes, span);
    /* 2. the slice's gate/up rows, 32 a pass (a warp's 4 rows' loads in flight together) */
    const engine_cu_xv xv = engine_cu_xv_at(xs, u.cols, quant, 0);
    if (!(a.diag & 8))
        for (int r0 = s * S; r0 < s * S + S; r0 += 4 * FFN_WARPS)
            ffn_up_rows<MODE, 4>(u, j, e, r0 + w, xv);
    engine_cu_qraw raw[MF_PRE]; /* a.preload: the first down passes, in flight during the wait */
    const bool pre = quant && a.preload;
    if (pre) {
        switch (d.type) {
#define MF_PRE_CASE(T)                                                                             \
    case T:                                                                                        \
        if (MODE == engine_cu_x_mode(T)) mf_preload<T>(d, dbase, i0, i1, raw);                     \
        break;
            ENGINE_CU_QUANT_CASES(MF_PRE_CASE)
#undef MF_PRE_CASE
        }
    }
    /* 3. h of the group complete (stored, fenced, counted), then staged from L2 as the down
     * kernel stages it (the same 8-bit values) */
    const float *hj = u.h + (size_t)j * u.rows;
    __threadfence();
    __syncthreads();
    unsigned *gc = a.counters + 2 + j * ng + g;
    if (threadIdx.x == 0) atomicAdd(gc, 1u);
    if (!(a.diag & 4)) engine_cu_spin(gc, (unsigned)G);
    engine_cu_stage_x<MODE, true>(hj + col0, 256, nullptr, 0.0f, hs); /* ends with a barrier */
    /* 4. the block's rows of the group's weighted down product */
    const engine_cu_xv hv = engine_cu_xv_at(hs, 256, quant, 0);
    float *part = a.partial + (size_t)(j * ng + g) * d.rows;
    if (!(a.diag & 1)) {
        switch (d.type) {
#define MF_CASE(T)                                                                                 \
    case T:                                                                                        \
        if (MODE == engine_cu_x_mode(T)) mf_down<T>(d, dbase, i0, i1, hv, wj, part, pre, raw);     \
        break;
            ENGINE_CU_QUANT_CASES(MF_CASE)
#undef MF_CASE
#define MF_CASE(T)                                                                                 \
    case T:                                                                                        \
        if (MODE == ENGINE_CU_X_F32) mf_down<T>(d, dbase, i0, i1, hv, wj, part, false, raw);       \
        break;
            ENGINE_CU_FLOAT_CASES(MF_CASE)
#undef MF_CASE
        }
    }
    /* 5. arrive and reduce */
    __threadfence();
    __syncthreads();
    unsigned *cc = a.counters + 2 + u.k * ng; /* class_reduce: arrivals of each row class m */
    if (threadIdx.x == 0) {
        ticket = atomicAdd(a.class_reduce ? cc + m : a.counters, 1u);
        __threadfence(); /* the partials of the blocks counted before this one: visible after */
    }
    __syncthreads();
    const unsigned t = ticket;
    int nred, q0, q1;
    if (a.class_reduce) { /* the last block of class m reduces its rows at once: no wait */
        if (t != (unsigned)(u.k * ng) - 1) return;
        nred = G;
        q0 = i0 >> 2;
        q1 = i1 >> 2;
    } else { /* the last R blocks to arrive wait for all and reduce a 1/R share each */
        nred = mf_reducers(nb, d.rows);
        if (t < (unsigned)(nb - nred)) return;
        engine_cu_spin(a.counters, (unsigned)nb);
        const int n4 = d.rows >> 2, per = (n4 + nred - 1) / nred;
        q0 = min(n4, ((int)t - (nb - nred)) * per);
        q1 = min(n4, q0 + per);
    }
    if (!(a.diag & 2)) mf_reduce<RF>(d, a.partial, u.k * ng, q0, q1, red);
    if (threadIdx.x == 0 && atomicAdd(a.counters + 1, 1u) == (unsigned)nred - 1) {
        /* every block has arrived, so passed its waits: zero for the next launch */
        a.counters[0] = 0;
        a.counters[1] = 0;
        for (int q = 0; q < u.k * ng + 8; q++)
            a.counters[2 + q] = 0;
    }
}

/* The whole-grid form (moe_fused.cuh grid): thread 0 copies the block's ng down row groups, a
 * run of FFN_WARPS rows of each of the k experts per group, into dst (group i, slot j at
 * (i k + j) run), counted on bar. */
__device__ __forceinline__ void mg_copy_down(const engine_cu_ffn_down_args &d, const int *ids,
                                             int g0, int ng, uint8_t *dst, uint64_t *bar,
                                             bool merged = false, bool lanes = false) {
    const size_t run = (size_t)FFN_WARPS * d.row_bytes, st = engine_cu_run_stride(run);
    if (lanes) { /* SPARK_CUDA_MOE_LANES: a whole warp calls; lane l issues copy l */
        const int lane = threadIdx.x & 31, n = merged ? d.k : ng * d.k;
        if (lane == 0) engine_cu_mbar_expect(bar, (unsigned)((size_t)ng * d.k * run));
        __syncwarp();
        if (lane < n) {
            const int i = merged ? 0 : lane / d.k, j = merged ? lane : lane - (lane / d.k) * d.k;
            const size_t ms = engine_cu_run_stride((size_t)ng * run);
            engine_cu_bulk_g2s(merged ? dst + (size_t)j * ms : dst + (size_t)(i * d.k + j) * st,
                               d.down + (size_t)ids[j] * d.expert_bytes + (size_t)(g0 + i) * run,
                               (unsigned)(merged ? (size_t)ng * run : run), bar);
        }
        return;
    }
    engine_cu_mbar_expect(bar, (unsigned)((size_t)ng * d.k * run));
    if (merged) { /* dn_merge: slot j's ng groups (consecutive rows) as one copy */
        const size_t ms = engine_cu_run_stride((size_t)ng * run);
        for (int j = 0; j < d.k; j++)
            engine_cu_bulk_g2s(dst + (size_t)j * ms,
                               d.down + (size_t)ids[j] * d.expert_bytes + (size_t)g0 * run,
                               (unsigned)((size_t)ng * run), bar);
        return;
    }
    for (int i = 0; i < ng; i++)
#pragma unroll 1 /* one thread's copies: a loop, not unrolled code */
        for (int j = 0; j < d.k; j++)
            engine_cu_bulk_g2s(dst + (size_t)(i * d.k + j) * st,
                               d.down + (size_t)ids[j] * d.expert_bytes + (size_t)(g0 + i) * run,
                               (unsigned)run, bar);
}

/* The gate and up runs of up item it (expert slot it / gx, its 2 FFN_WARPS rows) into dst,
 * counted on bar (expected here when own: a barrier of the item's own). */
__device__ __forceinline__ void mg_copy_up(const engine_cu_ffn_up_args &u, const int *ids, int it,
                                           int gx, size_t urun, uint8_t *dst, uint64_t *bar,
                                           bool own) {
    const int j = it / gx;
    const size_t off = (size_t)ids[j] * u.expert_bytes + (size_t)(it - j * gx) * urun;
    if (own) engine_cu_mbar_expect(bar, (unsigned)(2 * urun));
    engine_cu_bulk_g2s(dst, u.gate + off, (unsigned)urun, bar);
    engine_cu_bulk_g2s(dst + urun, u.up + off, (unsigned)urun, bar);
}

/* The copies that follow the landing of a block's up item i (its group's first thread): item
 * i + infl, and the down runs where the order (dn_at) puts them. */
__device__ __forceinline__ void
mg_next_copies(const engine_cu_ffn_up_args &u, const engine_cu_ffn_down_args &d, const int *ids,
               int i, int i0, int infl, int ni, int gx, size_t urun, uint8_t *ws, uint64_t *bar_it,
               int dn_at, int g0, int ng, uint8_t *wd, uint64_t *bar_dn, bool dmerge, bool lanes) {
    /* lanes: the whole warp calls (the down copies a lane each), else its first thread */
    const int nx = i + infl;
    const bool first = !lanes || (threadIdx.x & 31) == 0;
    if (nx < ni) {
        if (first)
            mg_copy_up(u, ids, i0 + nx, gx, urun, ws + (size_t)nx * 2 * urun, &bar_it[nx], true);
        if (dn_at == 1 && nx == ni - 1) mg_copy_down(d, ids, g0, ng, wd, bar_dn, dmerge, lanes);
    }
    if (dn_at == 2 && i == ni - 1) mg_copy_down(d, ids, g0, ng, wd, bar_dn, dmerge, lanes);
}

/* MG_GROUPS warp groups of FFN_WARPS warps: group q takes the block's up items q, q + MG_GROUPS,
 * ... and its down row groups likewise (warp w % FFN_WARPS of the group the item's rows and the
 * group's row, as in the up and down kernels). One warp group (256 threads) measured slower:
 * 451.5 / 457.3 tok/s (late / early down copies) against 491.2 for the pair, Qwen3-30B-A3B
 * Q4_K_M, H200, session 16 call 2; three: 503.0 / 505.2 (call 3). */
#define MG_GROUPS 3
#define MG_THREADS (MG_GROUPS * MF_THREADS)
#define MG_MAX_IPB 8 /* up items per block with a barrier each (moe_fused.cuh items) */
#define MG_DIAG_ROUTE2 0x10 /* diag: the routing warp routes twice (moe_fused.cuh diag) */
#define MG_DIAG_LATE 0x20   /* diag: the routing after the block's scale (moe_fused.cuh diag) */
#define MG_DIAG_NW_LATE 0x40 /* diag: the norm weights read after the wait (moe_fused.cuh diag) */
/* diag, timing only (wrong results): the up products (0x80), the staging of h after the grid
 * barrier (0x100) or the down products (0x200) left out, the copies and barriers kept */
#define MG_DIAG_NO_UP 0x80
#define MG_DIAG_NO_HSTAGE 0x100
#define MG_DIAG_NO_DOWN 0x200

/* UT, DT (a.spec): the instance for gate/up of type UT and down of type DT alone (0: any), so
 * that only their products are in its code. F (1, 2; with UT): form F with every switch it reads
 * at the sessions' default (mg_form_fixed), fixed here, so that the alternatives' code is not in
 * the image either. */
template <int MODE, bool RF, int UT = 0, int DT = 0, int F = 0>
__global__ void __launch_bounds__(MG_THREADS, 1) moe_grid_kernel(engine_cu_moe_fused_args a) {
    /* from a 128-byte boundary, where the bulk copies land: +2.7% Q4_K_M, +5.7% Q8_0 against
     * the 16-byte boundary it had (Qwen3-30B-A3B, H200, session 21 call 1) */
    extern __shared__ __align__(128) uint4 mg_shm[];
    __shared__ int ids[ENGINE_CU_MAX_EXPERT_USED];
    __shared__ float wts[ENGINE_CU_MAX_EXPERT_USED];
    __shared__ uint64_t bar_up, bar_dn, bar_it[MG_MAX_IPB];
    const engine_cu_ffn_up_args &u = a.up;
    const engine_cu_ffn_down_args &d = a.dn;
    /* the types' own instance (UT) holds the sessions' loops alone: rolled, no diagnosis */
    const int roll = UT ? 3 : a.roll, diag = UT ? 0 : a.diag;
    const int b = blockIdx.x, nb = gridDim.x, w = engine_cu_warp_id();
    const int q = w / FFN_WARPS, wl = w - q * FFN_WARPS;
    const int gx = u.rows / (2 * FFN_WARPS), n_items = u.k * gx, n_groups = d.rows / FFN_WARPS;
    const int i0 = b * a.ipb, ni = max(0, min(a.ipb, n_items - i0));
    const int g0 = b * a.gpb, ng = max(0, min(a.gpb, n_groups - g0));
    /* urun: a gate or up run (128-byte multiples for the 30B-A3B's types); drun: the stride of
     * the down runs (mg_copy_down) */
    const size_t urun = (size_t)2 * FFN_WARPS * u.row_bytes,
                 drun = engine_cu_run_stride((size_t)FFN_WARPS * d.row_bytes);
    uint8_t *sm = (uint8_t *)mg_shm, *ws = sm + a.ws_off;
    const bool early = F ? F == 2 : a.grid == 2;
    uint8_t *wd = early ? ws + (size_t)a.ipb * 2 * urun : ws; /* the down runs */
    /* a.items: each item's runs counted on a barrier of its own, so that a warp group computes
     * its item as soon as that item's runs have landed */
    const int pipe = F ? 1 : a.pipe;
    const bool per_item = F ? true : (a.items || pipe > 0) && a.ipb <= MG_MAX_IPB; /* F: fits */
    /* up items issued at the start, and when the down runs go (moe_fused.cuh pipe) */
    const int infl = per_item && pipe > 0 ? min(ni, pipe) : ni;
    const int dn_at = early && ni > 0 ? (F ? 2 : a.pipe_down) : 0;
    const bool dmerge =
        F ? F == 2 : a.dn_merge == 1 || (a.dn_merge == 2 && early);          /* moe_fused.cuh */
    const bool lanes = F ? F == 2 : a.lanes == 1 || (a.lanes == 2 && early); /* moe_fused.cuh */
    const bool y_pre = F ? true : a.y_pre, arrive = F ? true : a.arrive;
    /* every block starts before a dependent can launch, so all are resident by then */
    engine_cu_pdl_launch();
    if (threadIdx.x == 0) {
        engine_cu_mbar_init(&bar_up);
        engine_cu_mbar_init(&bar_dn);
        if (per_item)
#pragma unroll 1
            for (int i = 0; i < ni; i++)
                engine_cu_mbar_init(&bar_it[i]);
    }
    if (u.norm_w && w == FFN_WARPS - 1)
        engine_cu_prefetch_l2((const uint8_t *)u.norm_w, sizeof(float) * (size_t)u.cols);
    /* the staging warps' norm weights (qdot.cuh engine_cu_stage_nw), before the wait */
    const bool nw_pre = !(diag & MG_DIAG_NW_LATE);
    const engine_cu_nw_pre nwp = engine_cu_stage_x_nw<MODE>(nw_pre ? u.norm_w : nullptr, u.cols, 1);
    engine_cu_pdl_wait();
    /* 1. route and copy (warp 0), stage x (the others): the up kernel's steps. With the router
     * fusion and the block's scale (RF, u.coop), warp 0 picks the experts from the raw logits
     * and issues the copies between its share of the scale's loads and the scale's barrier, and
     * weighs them after it (the ids need no scale: ffn_route_ids) */
    const bool coop = RF && (F || u.coop), split = coop && !(diag & MG_DIAG_LATE);
    float sc = -1.0f, raw[ENGINE_CU_MAX_EXPERT / 32];
    float ss = 0.0f;
    if (coop) {
        if (w == 0) ffn_route_raw(u, raw);
        ss = engine_cu_block_ss<false, true>((const float4 *)u.x, (const float4 *)u.x_add, u.cols,
                                             MF_THREADS); /* the up kernel's scale's bits */
        if (!split) sc = engine_cu_block_scale_end(ss, u.cols, u.eps, MF_THREADS);
    }
    int my_id = 0;
    if (w == 0) {
        if (coop) { /* raw[] stays in registers (a pointer chosen at run time put it on the stack)
                     */
            my_id = ffn_route_ids<true, F != 0>(u, raw, ids);
            if (diag & MG_DIAG_ROUTE2) my_id = ffn_route_ids<true>(u, raw, ids); /* the same */
            if (!split) ffn_route_weights<true, F != 0>(u, b, raw, sc, my_id, wts);
        } else {
            ffn_route_warp<RF, true>(u, b, ids, wts);
            if (diag & MG_DIAG_ROUTE2) { /* the same ids and weights again */
                __syncwarp();
                ffn_route_warp<RF, true>(u, b, ids, wts);
            }
        }
        ENGINE_CU_TRACE(5);
        if ((threadIdx.x & 31) == 0) {
            if (!per_item) engine_cu_mbar_expect(&bar_up, (unsigned)((size_t)ni * 2 * urun));
            for (int i = 0; i < infl; i++)
                mg_copy_up(u, ids, i0 + i, gx, urun, ws + (size_t)i * 2 * urun,
                           per_item ? &bar_it[i] : &bar_up, per_item);
            if (!lanes && early && (dn_at == 0 || (dn_at == 1 && infl == ni)))
                mg_copy_down(d, ids, g0, ng, wd, &bar_dn, dmerge);
        }
        if (lanes && early && (dn_at == 0 || (dn_at == 1 && infl == ni)))
            mg_copy_down(d, ids, g0, ng, wd, &bar_dn, dmerge, true);
        ENGINE_CU_TRACE(10);
    }
    if (split) {
        sc = engine_cu_block_scale_end(ss, u.cols, u.eps, MF_THREADS);
        ENGINE_CU_TRACE(9);
        if (w == 0) ffn_route_weights<true, F != 0>(u, b, raw, sc, my_id, wts);
    }
    if (RF) /* warps 1 ..; ends with a barrier. F: the block's scale sc (coop and split) */
        engine_cu_stage_x<MODE, false, true, F != 0>(u.x, u.cols, u.norm_w, u.eps, sm, 1, u.x_add,
                                                     sc, &nwp);
    else
        engine_cu_stage_x<MODE>(u.x, u.cols, u.norm_w, u.eps, sm, 1, nullptr, -1.0f, &nwp);
    ENGINE_CU_TRACE(6);
    if (b == 0 && (int)threadIdx.x < u.k) {
        u.ids[threadIdx.x] = ids[threadIdx.x];
        u.weights[threadIdx.x] = wts[threadIdx.x];
    }
    /* 2. the items' rows of h from the copy */
    const engine_cu_xv xv = engine_cu_xv_at(sm, u.cols, true, 0);
    if (!per_item) {
        engine_cu_mbar_wait(&bar_up, 0);
        ENGINE_CU_TRACE(7);
    }
    for (int i = q; i < ni; i += MG_GROUPS) {
        if (per_item) {
            engine_cu_mbar_wait(&bar_it[i], 0);
            if (i == 0) ENGINE_CU_TRACE(7); /* thread 0's group: item 0 landed */
            if (i > 0 && wl == 0 && (threadIdx.x & 31) == 0)
                ENGINE_CU_TRACE_ANY(12 + i); /* item i landed (13, 14, ...) */
        }
        if (wl == 0 && (lanes || (threadIdx.x & 31) == 0))
            mg_next_copies(u, d, ids, i, i0, infl, ni, gx, urun, ws, bar_it, dn_at, g0, ng, wd,
                           &bar_dn, dmerge, lanes); /* the group's first thread: later copies */
        const int it = i0 + i, j = it / gx, r = (it - j * gx) * 2 * FFN_WARPS + wl;
        if (diag & MG_DIAG_NO_UP) {
        } else if (roll & 2) { /* moe_fused.cuh roll */
            ffn_up_rows<MODE, 2, true, true, UT>(u, j, ids[j], r, xv, ws + (size_t)i * 2 * urun);
        } else {
            ffn_up_rows<MODE, 2, true, false, UT>(u, j, ids[j], r, xv, ws + (size_t)i * 2 * urun);
        }
        if (wl == 0 && (threadIdx.x & 31) == 0)
            ENGINE_CU_TRACE_ANY(20 + i); /* the group's first warp done with item i */
    }
    /* a.y_pre: lane 0 of each warp reads its first down row's y (and y_add) now, so that its
     * store after the down products waits for no load (nobody else writes those rows) */
    const bool ypre = y_pre && q < ng;
    const int ry = (g0 + q) * FFN_WARPS + wl;
    float y0 = 0.0f, ya0 = 0.0f;
    if (ypre && (threadIdx.x & 31) == 0) {
        y0 = d.y[ry];
        if (RF) ya0 = d.y_add[ry];
    }
    /* 3. h stored everywhere; meanwhile (grid 1) the down runs into the up runs' space */
    __threadfence();
    __syncthreads();
    ENGINE_CU_TRACE(12); /* every product of the block done: its arrival at the grid barrier */
    if (threadIdx.x == 0) {
        if (!early && !arrive) {
            engine_cu_fence_proxy_async(); /* the block's reads of the up runs come first */
            mg_copy_down(d, ids, g0, ng, wd, &bar_dn, dmerge);
        }
        atomicAdd(a.counters, 1u);
    }
    if (!early && arrive && (lanes ? w == 1 : threadIdx.x == 32)) { /* moe_fused.cuh arrive */
        engine_cu_fence_proxy_async();
        mg_copy_down(d, ids, g0, ng, wd, &bar_dn, dmerge, lanes);
    }
    engine_cu_spin_bounded(a.counters, (unsigned)nb, 10000000000ull); /* 10 s: a trap, no hang */
    ENGINE_CU_TRACE(4);
    if (threadIdx.x == 0 && atomicAdd(a.counters + 1, 1u) == (unsigned)nb - 1) {
        a.counters[0] = 0; /* every block has passed the barrier: zero for the next launch */
        a.counters[1] = 0;
    }
    /* 4. all of h staged (through L2) as the down kernel stages it, then the block's groups */
    if (diag & MG_DIAG_NO_HSTAGE)
        __syncthreads();
    else
        engine_cu_stage_x<MODE, true>(u.h, d.k * d.cols, nullptr, 0.0f,
                                      sm); /* ends with a barrier */
    engine_cu_mbar_wait(&bar_dn, 0);
    ENGINE_CU_TRACE(8);
    if (!F && a.pf_norm && w == 1) /* the next launch's norm weights (moe_fused.cuh pf_norm) */
        engine_cu_prefetch_l2((const uint8_t *)a.pf_norm, sizeof(float) * (size_t)a.pf_norm_n);
    for (int i = q; i < ng; i += MG_GROUPS) {
        const int r = (g0 + i) * FFN_WARPS + wl;
        /* the run of slot 0 (group-major; dn_merge: slot-major, the slots ms apart) */
        const size_t ms = dmerge ? engine_cu_run_stride((size_t)ng * FFN_WARPS * d.row_bytes) : 0;
        const uint8_t *wr =
            wd + (dmerge ? (size_t)i * FFN_WARPS * d.row_bytes : (size_t)i * d.k * drun) +
            (size_t)wl * d.row_bytes;
        float v = 0.0f;
        switch (d.type) {
#define MG_CASE(T)                                                                                 \
    case T:                                                                                        \
        if (MODE == engine_cu_x_mode(T) && (DT == 0 || DT == T) && !(diag & MG_DIAG_NO_DOWN)) {    \
            if (roll & 1) /* moe_fused.cuh roll */                                                 \
                v = down_row<T, true, 1>(d, r, ids, wts, sm, true, wr, ms);                        \
            else                                                                                   \
                v = down_row<T, true>(d, r, ids, wts, sm, true, wr, ms);                           \
        }                                                                                          \
        break;
            ENGINE_CU_QUANT_CASES(MG_CASE)
#undef MG_CASE
        }
        if ((threadIdx.x & 31) == 0) {
            if (ypre && i == q)
                d.y[r] = RF ? (y0 + ya0) + v : y0 + v; /* down_store's adds in its order */
            else
                down_store<RF>(d, r, v);
        }
    }
    ENGINE_CU_TRACE_END();
}

typedef void (*mf_kernel_fn)(engine_cu_moe_fused_args);

static mf_kernel_fn mf_kernel(int mode, bool rf) {
    if (mode == ENGINE_CU_X_Q8_K)
        return rf ? moe_fused_kernel<ENGINE_CU_X_Q8_K, true>
                  : moe_fused_kernel<ENGINE_CU_X_Q8_K, false>;
    if (mode == ENGINE_CU_X_Q8_0)
        return rf ? moe_fused_kernel<ENGINE_CU_X_Q8_0, true>
                  : moe_fused_kernel<ENGINE_CU_X_Q8_0, false>;
    return rf ? moe_fused_kernel<ENGINE_CU_X_F32, true> : moe_fused_kernel<ENGINE_CU_X_F32, false>;
}

static size_t mf_smem(const engine_cu_moe_fused_args *a) {
    const int mode = engine_cu_x_mode(a->up.type);
    const bool q = mode != ENGINE_CU_X_F32;
    return mf_align16(engine_cu_xs_bytes(q, a->up.cols)) + engine_cu_xs_bytes(q, 256);
}

/* The form (1, 2) of a laid-out whole-grid launch when every switch the form reads is at the
 * sessions' default (so that moe_grid_kernel's F instance computes the same), else 0. */
static int mg_form_fixed(const engine_cu_moe_fused_args *a) {
    const bool early = a->grid == 2;
    const bool dmerge = a->dn_merge == 1 || (a->dn_merge == 2 && early);
    const bool lanes = a->lanes == 1 || (a->lanes == 2 && early);
    if ((a->grid != 1 && a->grid != 2) || a->roll != 3 || a->diag || !a->y_pre || a->pipe != 1 ||
        !a->up.coop || dmerge != early || lanes != early ||
        (early ? a->pipe_down != 2 : !a->arrive))
        return 0;
    /* what the F instances also take as fixed: an item barrier each, at most 128 experts routed
     * by route's picks (moe_dev.cuh ffn_route_ids E128), no next-norm prefetch */
    if (a->ipb > MG_MAX_IPB || a->up.n_expert > 128 || (a->up.route & ENGINE_CU_ROUTE_SHFL) ||
        a->pf_norm)
        return 0;
    return a->grid;
}

template <int MODE, int UT, int DT> static mf_kernel_fn mg_spec(const engine_cu_moe_fused_args *a) {
    const int f = a->spec == 3 ? 0 : mg_form_fixed(a); /* spec 3: the switches read at run time */
    return f == 1   ? moe_grid_kernel<MODE, true, UT, DT, 1>
           : f == 2 ? moe_grid_kernel<MODE, true, UT, DT, 2>
                    : moe_grid_kernel<MODE, true, UT, DT>;
}

static mf_kernel_fn mg_kernel(int mode, bool rf, const engine_cu_moe_fused_args *a) {
    /* moe_fused.cuh spec: the common files' type pairs, with the sessions' roll and no diag */
    if (a->spec && rf && a->roll == 3 && !a->diag) {
        const int ut = a->up.type, dt = a->dn.type;
        const bool q4 = a->spec != 2 && ut == ENGINE_TYPE_Q4_K;
        if (q4 && dt == ENGINE_TYPE_Q6_K)
            return mg_spec<ENGINE_CU_X_Q8_K, ENGINE_TYPE_Q4_K, ENGINE_TYPE_Q6_K>(a);
        if (q4 && dt == ENGINE_TYPE_Q4_K)
            return mg_spec<ENGINE_CU_X_Q8_K, ENGINE_TYPE_Q4_K, ENGINE_TYPE_Q4_K>(a);
        if (ut == ENGINE_TYPE_Q8_0 && dt == ENGINE_TYPE_Q8_0)
            return mg_spec<ENGINE_CU_X_Q8_0, ENGINE_TYPE_Q8_0, ENGINE_TYPE_Q8_0>(a);
    }
    if (mode == ENGINE_CU_X_Q8_K)
        return rf ? moe_grid_kernel<ENGINE_CU_X_Q8_K, true>
                  : moe_grid_kernel<ENGINE_CU_X_Q8_K, false>;
    return rf ? moe_grid_kernel<ENGINE_CU_X_Q8_0, true> : moe_grid_kernel<ENGINE_CU_X_Q8_0, false>;
}

/* The whole-grid form's layout (moe_fused.cuh grid): up items per block as few as the
 * multiprocessors allow (one block each), the blocks that takes, down row groups per block,
 * and the shared memory: the staging of x or of all of h, whichever is larger, then the copies
 * (grid 1: the larger of the up and down runs; grid 2: both). Sets a->ipb, gpb, ws_off;
 * returns the blocks, *smem the bytes. */
static int mg_layout(engine_cu_moe_fused_args *a, size_t *smem) {
    const engine_cu_ffn_up_args &u = a->up;
    const engine_cu_ffn_down_args &d = a->dn;
    const int n_items = u.k * (u.rows / (2 * FFN_WARPS)), n_groups = d.rows / FFN_WARPS;
    const int sms = engine_cu_sm_count();
    a->ipb = (n_items + sms - 1) / sms;
    const int nb = (n_items + a->ipb - 1) / a->ipb;
    a->gpb = (n_groups + nb - 1) / nb;
    /* lanes (moe_fused.cuh) issue one down copy each: a form with more copies than a warp has
     * lanes issues them from one thread */
    const bool merged = a->dn_merge == 1 || (a->dn_merge == 2 && a->grid == 2);
    if ((a->lanes == 1 || (a->lanes == 2 && a->grid == 2)) && (merged ? 1 : a->gpb) * d.k > 32)
        a->lanes = 0;
    const size_t xs = engine_cu_xs_bytes(true, u.cols), hs = engine_cu_xs_bytes(true, d.k * d.cols);
    a->ws_off = (unsigned)engine_cu_w_off(xs > hs ? xs : hs);
    const size_t up = (size_t)a->ipb * 4 * FFN_WARPS * u.row_bytes,
                 dn = (size_t)a->gpb * d.k * engine_cu_run_stride((size_t)FFN_WARPS * d.row_bytes);
    *smem = a->ws_off + (a->grid == 2 ? up + dn : up > dn ? up : dn);
    const int ng = (n_groups + a->gpb - 1) / a->gpb;
    return nb > ng ? nb : ng;
}

/* Why the whole-grid form cannot take a (NULL: it can); *nb, *smem its launch. grid 3 (auto)
 * becomes 2 where that fits, else 1. */
static const char *mg_why(engine_cu_moe_fused_args *a, int *nb, size_t *smem) {
    if (a->grid == 3) {
        a->grid = 2;
        if (!mg_why(a, nb, smem)) return nullptr;
        a->grid = 1;
    }
    const engine_cu_ffn_up_args &u = a->up;
    const engine_cu_ffn_down_args &d = a->dn;
    const int mode = engine_cu_x_mode(u.type);
    if (!engine_cu_type_quant(u.type) || !engine_cu_type_quant(d.type))
        return "a float type (the bulk copies take quantised rows)";
    if (u.rows % (2 * FFN_WARPS) || d.rows % FFN_WARPS) return "rows not in whole groups";
    if (d.sh_logit) return "a shared expert";
    if (!engine_cu_bulk_ok()) return "no bulk copies (before sm_90)";
    if (((uintptr_t)u.gate | (uintptr_t)u.up | (uintptr_t)d.down) & 15 || u.expert_bytes % 16 ||
        d.expert_bytes % 16 || (2 * FFN_WARPS * u.row_bytes) % 16 || (FFN_WARPS * d.row_bytes) % 16)
        return "runs not 16-byte aligned";
    *nb = mg_layout(a, smem);
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
            cudaSuccess) {
        cudaGetLastError();
        return "the device query failed";
    }
    if (*smem > (size_t)optin) return "the copies do not fit shared memory";
    if (!engine_cu_one_wave(mg_kernel(mode, u.x_add != nullptr, a), MG_THREADS, *smem, *nb))
        return "its blocks do not all fit the GPU at once";
    return nullptr;
}

size_t engine_cu_moe_fused_partial_floats(int k, int n_ff, int n_embd) {
    return (size_t)k * (size_t)((n_ff + 255) / 256) * (size_t)n_embd;
}

size_t engine_cu_moe_fused_counters(int k, int n_ff) {
    return 2 + (size_t)k * (size_t)((n_ff + 255) / 256) + 8;
}

const char *engine_cu_moe_fused_why(const engine_cu_moe_fused_args *a) {
    const engine_cu_ffn_up_args &u = a->up;
    const engine_cu_ffn_down_args &d = a->dn;
    const int mode = engine_cu_x_mode(u.type);
    if (!u.router || u.k < 1 || u.k > ENGINE_CU_MAX_EXPERT_USED ||
        u.n_expert > ENGINE_CU_MAX_EXPERT)
        return "not an MoE block the kernels route";
    if (!a->grid && a->slice != 32 && a->slice != 64) return "the slice is not 32 or 64 rows";
    if (mode != engine_cu_x_mode(d.type))
        return "gate/up and down stage their inputs differently (no fused instance)";
    if (a->grid) {
        if (d.cols != u.rows || d.rows != u.cols || d.k != u.k) return "shapes differ";
        if ((u.x_add != nullptr) != (d.y_add != nullptr))
            return "the router fusion is on in only one of up and down";
        if (!a->counters || !u.h || !u.ids || !u.weights) return "no scratch";
        engine_cu_moe_fused_args c = *a;
        int nb;
        size_t smem;
        return mg_why(&c, &nb, &smem);
    }
    if (d.cols != u.rows || d.rows != u.cols || d.k != u.k || u.rows % 256 || u.cols % 32 ||
        (mode == ENGINE_CU_X_Q8_K && u.cols % 256))
        return "the shape does not split into groups of 256 intermediate rows";
    if ((u.x_add != nullptr) != (d.y_add != nullptr))
        return "the router fusion is on in only one of up and down";
    if (!a->partial || !a->counters || !u.h || !u.ids || !u.weights) return "no scratch";
    const int nb = u.k * (u.rows / a->slice);
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mf_kernel(mode, u.x_add != nullptr),
                                                      MF_THREADS, mf_smem(a)) != cudaSuccess) {
        cudaGetLastError();
        return "the occupancy query failed";
    }
    if ((long)per_sm * engine_cu_sm_count() < nb)
        return "its blocks do not all fit the GPU at once";
    return nullptr;
}

void engine_cu_moe_fused(const engine_cu_moe_fused_args *a, cudaStream_t stream) {
    if (engine_cu_moe_fused_why(a)) {
        engine_cu_ffn_up(&a->up, stream);
        engine_cu_ffn_down(&a->dn, stream);
        return;
    }
    if (a->grid) {
        engine_cu_moe_fused_args c = *a;
        int nb = 0;
        size_t smem = 0;
        mg_why(&c, &nb, &smem);
        engine_cu_launch(mg_kernel(engine_cu_x_mode(c.up.type), c.up.x_add != nullptr, &c),
                         dim3(nb), dim3(MG_THREADS), smem, stream, c);
        return;
    }
    const int nb = a->up.k * (a->up.rows / a->slice);
    engine_cu_launch(mf_kernel(engine_cu_x_mode(a->up.type), a->up.x_add != nullptr), dim3(nb),
                     dim3(MF_THREADS), mf_smem(a), stream, *a);
}

/* ---------------------------------------------------------------------------------------------
 * Test entry point (cuda_backend.h)
 * ------------------------------------------------------------------------------------------- */
extern "C" int engine_cuda_op_moe_fused(
    engine_type up_type, engine_type down_type, int n_expert, int k, bool norm_topk, int n_embd,
    int n_ff, const float *router, const void *gate, const void *up, const void *down, size_t rb_in,
    size_t rb_ff, const float *norm_w, float eps, const float *x, const float *x_add, int slice,
    int flags, int reps, float *y_ref, float *y_fused, int32_t *ids, float *weights) {
    int rc = engine_cuda_usable();
    if (rc) return rc;
    if (!engine_cu_type_supported(up_type) || !engine_cu_type_supported(down_type) || k < 1 ||
        k > ENGINE_CU_MAX_EXPERT_USED || k > n_expert || n_expert > ENGINE_CU_MAX_EXPERT ||
        n_embd < 32 || n_ff < 32 || n_embd % 32 || n_ff % 32 || reps < 1)
        return engine_err(ENGINE_EINVAL, "moe fused: bad shape");
    const size_t ge = (size_t)n_ff * rb_in, de = (size_t)n_embd * rb_ff;
    const size_t fe = sizeof(float) * (size_t)n_embd;
    const size_t sizes[12] = {sizeof(float) * (size_t)n_expert,
                              ge * n_expert,
                              ge * n_expert,
                              de * n_expert,
                              fe,
                              fe,
                              fe,
                              sizeof(float) * (size_t)k * n_ff,
                              sizeof(int32_t) * (size_t)k,
                              sizeof(float) * (size_t)k,
                              sizeof(float) * engine_cu_moe_fused_partial_floats(k, n_ff, n_embd),
                              sizeof(unsigned) * engine_cu_moe_fused_counters(k, n_ff)};
    size_t off[12], total = 0;
    for (int i = 0; i < 12; i++) {
        off[i] = total;
        total += (sizes[i] + 255) & ~(size_t)255;
    }
    uint8_t *m = nullptr;
    cudaError_t ce = cudaMalloc((void **)&m, total);
    if (ce != cudaSuccess) goto fail;
    {
        float *dr = (float *)(m + off[0]), *dn = (float *)(m + off[4]);
        uint8_t *dg = m + off[1], *du = m + off[2], *dd = m + off[3];
        float *dxa = (float *)(m + off[5]), *dx = (float *)(m + off[6]);
        float *dh = (float *)(m + off[7]), *dw = (float *)(m + off[9]);
        int32_t *di = (int32_t *)(m + off[8]);
        if ((ce = cudaMemset(m, 0, total)) != cudaSuccess ||
            (ce = cudaMemcpy(dr, router, sizes[0], cudaMemcpyHostToDevice)) != cudaSuccess ||
            (ce = cudaMemcpy(dg, gate, sizes[1], cudaMemcpyHostToDevice)) != cudaSuccess ||
            (ce = cudaMemcpy(du, up, sizes[2], cudaMemcpyHostToDevice)) != cudaSuccess ||
            (ce = cudaMemcpy(dd, down, sizes[3], cudaMemcpyHostToDevice)) != cudaSuccess ||
            (ce = cudaMemcpy(dn, norm_w, fe, cudaMemcpyHostToDevice)) != cudaSuccess ||
            (x_add && (ce = cudaMemcpy(dxa, x_add, fe, cudaMemcpyHostToDevice)) != cudaSuccess))
            goto fail;
        engine_cu_moe_fused_args a;
        memset(&a, 0, sizeof a);
        engine_cu_ffn_up_args &ua = a.up;
        ua.router = dr;
        ua.n_expert = n_expert;
        ua.k = k;
        ua.norm_topk = norm_topk;
        ua.gate = dg;
        ua.up = du;
        ua.expert_bytes = ge;
        ua.row_bytes = rb_in;
        ua.type = (int)up_type;
        ua.cols = n_embd;
        ua.rows = n_ff;
        ua.x = dx;
        ua.norm_w = dn;
        ua.eps = eps;
        ua.h = dh;
        ua.ids = di;
        ua.weights = dw;
        ua.x_add = x_add ? dxa : nullptr;
        engine_cu_ffn_down_args &da = a.dn;
        da.down = dd;
        da.expert_bytes = de;
        da.row_bytes = rb_ff;
        da.type = (int)down_type;
        da.cols = n_ff;
        da.rows = n_embd;
        da.k = k;
        da.h = dh;
        da.ids = di;
        da.weights = dw;
        da.y = dx;
        da.y_add = ua.x_add;
        a.slice = slice;
        a.preload = flags & 1;
        a.class_reduce = (flags & 2) != 0;
        a.grid = (flags >> 2) & 3; /* the whole-grid form: 1, 2, 3 (auto) */
        a.items = (flags >> 4) & 1; /* its per-item barriers */
        a.pipe = (flags >> 5) & 7;  /* the order of its copies */
        a.pipe_down = (flags >> 8) & 3;
        a.y_pre = (flags >> 11) & 1; /* the down rows' y read before the products */
        a.arrive = (flags >> 12) & 1;   /* form 1: the arrival before the down copies */
        a.dn_merge = (flags >> 13) & 1; /* the down runs merged per slot, both forms */
        a.lanes = (flags >> 14) & 1;    /* the down copies a lane each, both forms */
        a.roll = (flags >> 15) & 3;     /* the down (1) and up (2) loops rolled */
        a.spec = (flags >> 17) & 1;     /* the instance of the types alone */
        a.up.coop = (int)((flags >> 19) & 1) && x_add; /* the block's scale, as the sessions */
        a.partial = (float *)(m + off[10]);
        a.counters = (unsigned *)(m + off[11]);
        const char *why = engine_cu_moe_fused_why(&a);
        if (why) {
            cudaFree(m);
            return engine_err(ENGINE_EUNSUPPORTED, "moe fused: %s", why);
        }
        for (int r = 0; r <= reps; r++) { /* r 0: the unfused pair */
            float *out = r == 0 ? y_ref : y_fused + (size_t)(r - 1) * n_embd;
            if ((ce = cudaMemcpy(dx, x, fe, cudaMemcpyHostToDevice)) != cudaSuccess) goto fail;
            if (r == 0) {
                engine_cu_ffn_up(&a.up, 0);
                engine_cu_ffn_down(&a.dn, 0);
            } else {
                engine_cu_moe_fused(&a, 0);
            }
            if ((ce = cudaDeviceSynchronize()) != cudaSuccess ||
                (ce = cudaGetLastError()) != cudaSuccess ||
                (ce = cudaMemcpy(out, dx, fe, cudaMemcpyDeviceToHost)) != cudaSuccess)
                goto fail;
        }
        if ((ce = cudaMemcpy(ids, di, sizeof(int32_t) * k, cudaMemcpyDeviceToHost)) !=
                cudaSuccess ||
            (ce = cudaMemcpy(weights, dw, sizeof(float) * k, cudaMemcpyDeviceToHost)) !=
                cudaSuccess)
            goto fail;
        /* the counters must be back at zero */
        const size_t nc = engine_cu_moe_fused_counters(k, n_ff);
        unsigned *hc = (unsigned *)calloc(nc, sizeof(unsigned));
        if (!hc) {
            cudaFree(m);
            return engine_err(ENGINE_ENOMEM, "out of memory");
        }
        ce = cudaMemcpy(hc, a.counters, sizeof(unsigned) * nc, cudaMemcpyDeviceToHost);
        size_t bad = nc;
        for (size_t i = 0; ce == cudaSuccess && i < nc && bad == nc; i++)
            if (hc[i]) bad = i;
        free(hc);
        if (ce != cudaSuccess) goto fail;
        cudaFree(m);
        if (bad != nc) return engine_err(ENGINE_EINTERNAL, "moe fused: counter %zu not reset", bad);
        return 0;
    }
fail:
    cudaFree(m);
    cudaGetLastError();
    return engine_err(ce == cudaErrorMemoryAllocation ? ENGINE_ENOMEM : ENGINE_EINTERNAL,
                      "CUDA moe fused op: %s", cudaGetErrorString(ce));
}

ENGINE_CU_TRACE_TU(moe_fused)
