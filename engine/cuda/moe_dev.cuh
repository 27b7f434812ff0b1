/* Device side of the FFN kernels (contract in moe.cuh): the work of one block, shared by the
 * per-op kernels (moe.cu) and the fused decode step (step.cu). Same scheme as matvec_dev.cuh:
 * the block stages its input in shared memory (qdot.cuh), a warp owns a row, lanes take
 * consecutive 32-value chunks. */
#ifndef SPARK_ENGINE_CUDA_MOE_DEV_CUH
#define SPARK_ENGINE_CUDA_MOE_DEV_CUH

#include <math.h>

#include "moe.cuh"
#include "qdot.cuh"
#include "sync.cuh"

#define FFN_WARPS 8

/* The softmax of route below (one warp), in place: p[i], the logit of expert lane + 32 i on
 * entry (-inf past n), becomes its probability (-1 past n). NPL < ENGINE_CU_MAX_EXPERT / 32 (n <=
 * 32 NPL): the same p for i < NPL, bit for bit (the slots left out would add -inf to the maximum
 * and +0 to each lane's sum). */
template <int NPL = ENGINE_CU_MAX_EXPERT / 32>
static __device__ __forceinline__ void route_softmax_regs(int n, float p[NPL]) {
    const int lane = threadIdx.x & 31;
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < NPL; i++)
        mx = fmaxf(mx, p[i]);
    mx = engine_cu_warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        p[i] = lane + 32 * i < n ? expf(p[i] - mx) : -1.0f;
        sum += p[i] > 0.0f ? p[i] : 0.0f;
    }
    const float inv = 1.0f / engine_cu_warp_sum(sum);
#pragma unroll
    for (int i = 0; i < NPL; i++)
        if (p[i] >= 0.0f) p[i] *= inv;
}

/* route_softmax_regs on logits[lane + 32 i] (past n: -inf), read through L2 with cg. */
template <int NPL = ENGINE_CU_MAX_EXPERT / 32>
static __device__ __forceinline__ void route_softmax(const float *logits, int n, bool cg,
                                                     float p[NPL]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        const int e = lane + 32 * i;
        p[i] = e < n ? (cg ? __ldcg(logits + e) : logits[e]) : -INFINITY;
    }
    route_softmax_regs<NPL>(n, p);
}

/* One round of a warp's top-k over keys key[i] of experts lane + 32 i (0: out of the race):
 * the largest key, ties to the lower id, with two warp reductions (sm_80 redux); the winner is
 * struck out (key 0) and returned, its key in *km. Every lane gets the same result. */
template <int NPL = ENGINE_CU_MAX_EXPERT / 32>
static __device__ __forceinline__ int route_pick(unsigned key[NPL], unsigned *km) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const int lane = threadIdx.x & 31;
    unsigned best = 0u;
    int bid = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < NPL; i++)
        if (key[i] > best) { /* ascending id per lane: ties keep the lower one */
            best = key[i];
            bid = lane + 32 * i;
        }
    const unsigned m = __reduce_max_sync(0xffffffffu, best);
    const int id = __reduce_min_sync(0xffffffffu, best == m ? bid : 0x7fffffff);
#pragma unroll
    for (int i = 0; i < NPL; i++)
        if (lane + 32 * i == id) key[i] = 0u;
    *km = m;
    return id;
#else
    (void)key;
    *km = 0u;
    return 0;
#endif
}

/* Softmax + top-k of the router logits by one warp; results in ids[k], wts[k] (shared). Each
 * lane keeps its experts' probabilities in registers; a chosen one is struck out (-1). With
 * REDUX (sm_80 and later) each round is route_pick's two warp reductions over the keys
 * bits(p) + 1 (p >= 0 orders as its bits; struck out and past n: 0) instead of five rounds of
 * shuffles: the same ids, weights and sum, bit for bit. NPL < ENGINE_CU_MAX_EXPERT / 32 (n <= 32
 * NPL): the same results, the slots left out holding experts past n (key 0, p -1: never picked). */
static_assert(ENGINE_CU_MAX_EXPERT_USED <= 32, "route: a pick per lane");
template <bool REDUX = true, int NPL = ENGINE_CU_MAX_EXPERT / 32>
static __device__ void route(const float *logits, int n, int k, int norm_topk, int *ids, float *wts,
                             bool cg = false) {
    const int lane = threadIdx.x & 31;
    float p[NPL];
    route_softmax<NPL>(logits, n, cg, p);
    float tot = 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr bool rx = REDUX;
#else
    constexpr bool rx = false;
#endif
    unsigned key[NPL];
    int my_id = 0;
    float my_wt = 0.0f;
    if (rx)
#pragma unroll
        for (int i = 0; i < NPL; i++) /* NaN: as 0, so ids stay valid */
            key[i] = p[i] >= 0.0f ? __float_as_uint(p[i]) + 1u : lane + 32 * i < n ? 1u : 0u;
    for (int j = 0; j < k; j++) {
        float best = -1.0f;
        int bid = 0x7fffffff;
        if (rx) {
            unsigned m;
            bid = route_pick<NPL>(key, &m);
            best = __uint_as_float(m - 1u);
        } else {
#pragma unroll
            for (int i = 0; i < NPL; i++)
                if (p[i] > best) { /* ascending e per lane: ties keep the lower id */
                    best = p[i];
                    bid = lane + 32 * i;
                }
            engine_cu_warp_argmax(best, bid);
#pragma unroll
            for (int i = 0; i < NPL; i++)
                if (lane + 32 * i == bid) p[i] = -1.0f;
        }
        if (lane == j) { /* round j's pick stays in lane j's registers (k <= 32) */
            my_id = bid;
            my_wt = best;
        }
        tot += best;
    }
    /* the k weights divided at once, a lane each (lane 0 dividing them in turn after the
     * rounds was a chain of k loads, divisions and stores on the routing's path) */
    if (lane < k) {
        ids[lane] = my_id;
        wts[lane] = norm_topk ? my_wt / tot : my_wt;
    }
    __syncwarp();
}

/* The router fusion's routing in two halves (route_ids_raw, then route_weights_raw), so that the
 * ids, and the copies of the chosen experts' rows, need not wait for the RMS scale of h: the
 * logits are s raw with s > 0, the order of raw is theirs, and only the weights need s.
 * route_ids_raw: the top-k of raw[i] (expert lane + 32 i) by one warp, largest first, ties to the
 * lower id, into ids[k] (shared); lane j < k returns pick j. The picks are route's on s raw
 * except where two distinct raw values give the same probability after rounding (route takes
 * the lower id there, this the larger logit): a near-tie either way. NaN: the lowest valid key,
 * as in route. SHFL: route_pick's reductions as shuffle rounds (SPARK_CUDA_ROUTE=shfl). */
__device__ __forceinline__ unsigned route_key_raw(float v) {
    if (v != v) return 1u;
    const unsigned u = __float_as_uint(v + 0.0f);      /* -0 as +0 */
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* >= 0x007fffff: never 0 or 1 */
}

template <int NPL = ENGINE_CU_MAX_EXPERT / 32>
static __device__ __forceinline__ int route_pick_shfl(unsigned key[NPL], unsigned *km) {
    const int lane = threadIdx.x & 31;
    unsigned best = 0u;
    int bid = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < NPL; i++)
        if (key[i] > best) {
            best = key[i];
            bid = lane + 32 * i;
        }
    engine_cu_warp_argmax(best, bid);
#pragma unroll
    for (int i = 0; i < NPL; i++)
        if (lane + 32 * i == bid) key[i] = 0u;
    *km = best;
    return bid;
}

template <int NPL = ENGINE_CU_MAX_EXPERT / 32>
static __device__ __forceinline__ int route_ids_raw(const float *raw, int n, int k, bool shfl,
                                                    int *ids) {
    const int lane = threadIdx.x & 31;
    unsigned key[NPL];
#pragma unroll
    for (int i = 0; i < NPL; i++)
        key[i] = lane + 32 * i < n ? route_key_raw(raw[i]) : 0u;
    int my_id = 0;
    for (int j = 0; j < k; j++) {
        unsigned m;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        const int id = shfl ? route_pick_shfl<NPL>(key, &m) : route_pick<NPL>(key, &m);
#else
        const int id = route_pick_shfl<NPL>(key, &m);
#endif
        if (lane == j) my_id = id;
    }
    if (lane < k) ids[lane] = my_id;
    __syncwarp();
    return my_id;
}

/* route_weights_raw: the weights of route_ids_raw's picks (my_id: lane j's pick j) from the
 * logits s raw, as route computes them (route_softmax's probabilities, summed in pick order,
 * each divided by the sum with norm_topk), into wts[k] (shared). */
template <int NPL = ENGINE_CU_MAX_EXPERT / 32>
static __device__ __forceinline__ void route_weights_raw(const float *raw, float s, int n, int k,
                                                         int norm_topk, int my_id, float *wts) {
    const int lane = threadIdx.x & 31;
    float p[NPL];
#pragma unroll
    for (int i = 0; i < NPL; i++) /* __fmul_rn: route's logits were stored, never contracted */
        p[i] = lane + 32 * i < n ? __fmul_rn(s, raw[i]) : -INFINITY;
    route_softmax_regs<NPL>(n, p);
    const int src = my_id & 31, slot = my_id >> 5;
    float v = 0.0f;
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        const float t = __shfl_sync(0xffffffffu, p[i], src);
        if (i == slot) v = t;
    }
    v = v >= 0.0f ? v : 0.0f; /* NaN: route's key 1 stands for 0 */
    float tot = 0.0f; /* k <= ENGINE_CU_MAX_EXPERT_USED: a fixed count, the same adds in order */
#pragma unroll
    for (int j = 0; j < ENGINE_CU_MAX_EXPERT_USED; j++) {
        const float t = __shfl_sync(0xffffffffu, v, j);
        if (j < k) tot += t;
    }
    if (lane < k) wts[lane] = norm_topk ? v / tot : v;
    __syncwarp();
}

/* route by a whole block (every thread calls it; it ends with a barrier; blockDim.x >= 64):
 * warp 0 takes route's softmax into sp[ENGINE_CU_MAX_EXPERT] (shared), then two threads per
 * expert count the experts before it in the order (probability descending, id ascending); the
 * expert of rank j < k is the one route picks in its round j (the largest left, ties to the
 * lower id), so ids and wts are route's bit for bit (the same sum of the k weights, in rank
 * order, for norm_topk), without route's k rounds of shuffles on one warp. Slots start at
 * expert 0, so logits with NaN give valid ids. */
static __device__ void route_block(const float *logits, int n, int k, int norm_topk, int *ids,
                                   float *wts, float *sp, bool cg) {
    const int t = threadIdx.x, half = t & 1;
    if (t < 32) {
        float p[ENGINE_CU_MAX_EXPERT / 32];
        route_softmax(logits, n, cg, p);
#pragma unroll
        for (int i = 0; i < ENGINE_CU_MAX_EXPERT / 32; i++)
            sp[t + 32 * i] = p[i];
    }
    if (t < k) {
        ids[t] = 0;
        wts[t] = 0.0f;
    }
    __syncthreads();
    for (int e0 = 0; e0 < n; e0 += (int)blockDim.x / 2) { /* uniform over the block */
        const int e = e0 + (t >> 1);
        const float pe = e < n ? sp[e] : 0.0f;
        int r = 0;
#pragma unroll 8
        for (int f = half; f < n; f += 2) {
            const float pf = sp[f];
            r += pf > pe || (pf == pe && f < e);
        }
        r += __shfl_xor_sync(0xffffffffu, r, 1);
        if (!half && e < n && r < k) {
            ids[r] = e;
            wts[r] = pe;
        }
    }
    __syncthreads();
    if (t == 0) {
        float tot = 0.0f;
        for (int j = 0; j < k; j++)
            tot += wts[j];
        if (norm_topk)
            for (int j = 0; j < k; j++)
                wts[j] = wts[j] / tot;
    }
    __syncthreads();
}

/* gate and up of rows r + i FFN_WARPS (i < NR: rows r and r + FFN_WARPS by default) of one
 * expert against the staged x, in one loop (the 2 NR rows' loads in flight together): h =
 * silu(g) * u for each into h[NR]. stride: the bytes from one of the rows to the next. */
template <int T, int NR, bool SH>
__device__ __forceinline__ void up_step(const uint8_t *g, const uint8_t *u, size_t stride, int c,
                                        const engine_cu_xv &xv, float *ag, float *au) {
#pragma unroll
    for (int i = 0; i < NR; i++) {
        ag[i] += engine_cu_dot_chunk<T, SH>(g + i * stride, c, xv);
        au[i] += engine_cu_dot_chunk<T, SH>(u + i * stride, c, xv);
    }
}

/* ROLL: the chunk loop kept rolled (less code to fetch; the same sums in the same order). */
template <int T, int NR = 2, bool SH = false, bool ROLL = false>
__device__ __forceinline__ void up_rows(const uint8_t *g, const uint8_t *u, size_t stride,
                                        int n_chunks, const engine_cu_xv &xv, float *h) {
    float ag[NR], au[NR];
#pragma unroll
    for (int i = 0; i < NR; i++)
        ag[i] = au[i] = 0.0f;
    if (ROLL) {
#pragma unroll 1
        for (int c = threadIdx.x & 31; c < n_chunks; c += 32)
            up_step<T, NR, SH>(g, u, stride, c, xv, ag, au);
    } else {
        for (int c = threadIdx.x & 31; c < n_chunks; c += 32)
            up_step<T, NR, SH>(g, u, stride, c, xv, ag, au);
    }
#pragma unroll
    for (int i = 0; i < NR; i++) {
        const float gs = engine_cu_warp_sum(ag[i]), us = engine_cu_warp_sum(au[i]);
        h[i] = gs / (1.0f + expf(-gs)) * us;
    }
}

/* Row groups of 2 * FFN_WARPS rows of the up products. */
__host__ __device__ __forceinline__ int engine_cu_up_groups(int rows) {
    return (rows + 2 * FFN_WARPS - 1) / (2 * FFN_WARPS);
}

/* The raw logits of the router fusion's routing warp (RF), lane + 32 i into raw[i]. */
__device__ __forceinline__ void ffn_route_raw(const engine_cu_ffn_up_args &a,
                                              float raw[ENGINE_CU_MAX_EXPERT / 32]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < ENGINE_CU_MAX_EXPERT / 32; i++)
        raw[i] = lane + 32 * i < a.n_expert ? a.router[lane + 32 * i] : 0.0f;
}

/* The router fusion's routing (RF, a.x_add) in its two halves on the raw logits raw[] (lane + 32
 * i, ffn_route_raw): ffn_route_ids the ids (route_ids_raw; lane j < k returns pick j), which
 * need no scale, and ffn_route_weights their weights for the RMS scale sc of h = x + x_add, the
 * one the staging uses (route_weights_raw; block b 0 also stores qwen35's scaled shared-expert
 * logit, a.rf_sh). N4: with at most 128 experts, 4 a lane (the same results; a second
 * instance, so only the whole-grid MoE launch asks for it: in the up kernels it cost registers). */
template <bool N4, bool E128 = false>
__device__ __forceinline__ int ffn_route_ids(const engine_cu_ffn_up_args &a, const float *raw,
                                             int *ids) {
    /* E128: the caller's instance is launched only with at most 128 experts and route's picks
     * (no ENGINE_CU_ROUTE_SHFL), so that the other paths are not in its image */
    const bool shfl = !E128 && (a.route & ENGINE_CU_ROUTE_SHFL) != 0;
    if (E128 || (N4 && a.n_expert <= 128)) return route_ids_raw<4>(raw, a.n_expert, a.k, shfl, ids);
    return route_ids_raw<>(raw, a.n_expert, a.k, shfl, ids);
}

template <bool N4, bool E128 = false>
__device__ __forceinline__ void ffn_route_weights(const engine_cu_ffn_up_args &a, int b,
                                                  const float *raw, float sc, int my_id,
                                                  float *wts) {
    if (E128 || (N4 && a.n_expert <= 128))
        route_weights_raw<4>(raw, sc, a.n_expert, a.k, a.norm_topk, my_id, wts);
    else
        route_weights_raw<>(raw, sc, a.n_expert, a.k, a.norm_topk, my_id, wts);
    if (a.rf_sh && b == 0 && (threadIdx.x & 31) == 0) *a.rf_sh = sc * a.router[a.n_expert];
}

/* The routing of an up block by its warp 0 (every lane calls it) into ids[k], wts[k] (shared):
 * route on a.router, or with the router fusion (RF) ffn_route_ids and ffn_route_weights.
 * sc_given >= 0 (RF, a.coop): the scale, computed by the whole block, and raw_given the raw
 * logits (ffn_route_raw), both read already; else the warp reads the logits and computes the
 * scale itself as each staging warp does (both loads in flight together). N4: as above. */
template <bool RF, bool N4 = false>
__device__ __forceinline__ void ffn_route_warp(const engine_cu_ffn_up_args &a, int b, int *ids,
                                               float *wts, float sc_given = -1.0f,
                                               const float *raw_given = nullptr) {
    if (RF) {
        float raw[ENGINE_CU_MAX_EXPERT / 32];
        if (raw_given)
#pragma unroll
            for (int i = 0; i < ENGINE_CU_MAX_EXPERT / 32; i++)
                raw[i] = raw_given[i];
        else
            ffn_route_raw(a, raw);
        const float sc =
            sc_given >= 0.0f
                ? sc_given
                : engine_cu_stage_scale<false, true>((const float4 *)a.x, (const float4 *)a.x_add,
                                                     a.cols, a.cols >> 2, threadIdx.x & 31, a.eps);
        ffn_route_weights<N4>(a, b, raw, sc, ffn_route_ids<N4>(a, raw, ids), wts);
        return;
    }
    const bool shfl = (a.route & ENGINE_CU_ROUTE_SHFL) != 0;
    if (N4 && a.n_expert <= 128) { /* 4 experts a lane: half the chains, the same picks */
        if (!shfl)
            route<true, 4>(a.router, a.n_expert, a.k, a.norm_topk, ids, wts);
        else
            route<false, 4>(a.router, a.n_expert, a.k, a.norm_topk, ids, wts);
    } else if (!shfl) {
        route<true>(a.router, a.n_expert, a.k, a.norm_topk, ids, wts);
    } else {
        route<false>(a.router, a.n_expert, a.k, a.norm_topk, ids, wts);
    }
}

/* Rows r and r + FFN_WARPS (when below a.rows) of expert e, slot j, against the staged x (one
 * warp; r < a.rows): h[j][r] = silu(G_e x) * U_e x, lane 0 stores. NR > 2: rows r + i FFN_WARPS
 * for every i < NR, all below a.rows (the caller's). SH (quantised types): the rows from the
 * block's copy of its item's two runs in shared memory, gate run at ws, up run after it (row r
 * at ws + (r % (2 FFN_WARPS)) row_bytes). */
template <int MODE, int NR = 2, bool SH = false, bool ROLL = false, int UT = 0>
__device__ __forceinline__ void ffn_up_rows(const engine_cu_ffn_up_args &a, int j, int e, int r,
                                            const engine_cu_xv &xv, const uint8_t *ws = nullptr) {
    const size_t off = (size_t)e * a.expert_bytes + (size_t)r * a.row_bytes;
    const size_t so = (size_t)(r % (2 * FFN_WARPS)) * a.row_bytes;
    const uint8_t *gr = SH ? ws + so : a.gate + off,
                  *ur = SH ? ws + 2 * FFN_WARPS * a.row_bytes + so : a.up + off;
    const bool two = NR > 2 || r + FFN_WARPS < a.rows;
    const size_t stride = two ? (size_t)FFN_WARPS * a.row_bytes : 0;
    float hv[NR];
#pragma unroll
    for (int i = 0; i < NR; i++)
        hv[i] = 0.0f;
    switch (a.type) { /* gate and up share a type (checked at upload) */
#define UP_CASE(T)                                                                                 \
    case T:                                                                                        \
        if (MODE == engine_cu_x_mode(T) && (UT == 0 || UT == T))                                   \
            up_rows<T, NR, SH, ROLL>(gr, ur, stride, a.cols >> 5, xv, hv);                         \
        break;
        ENGINE_CU_QUANT_CASES(UP_CASE)
#undef UP_CASE
#define UP_CASE(T)                                                                                 \
    case T:                                                                                        \
        if (MODE == ENGINE_CU_X_F32 && !SH && UT == 0)                                             \
            up_rows<T, NR>(gr, ur, stride, a.cols >> 5, xv, hv);                                   \
        break;
        ENGINE_CU_FLOAT_CASES(UP_CASE)
#undef UP_CASE
    }
    if ((threadIdx.x & 31) == 0) {
        float *h = a.h + (size_t)j * a.rows;
        h[r] = hv[0];
#pragma unroll
        for (int i = 1; i < NR; i++)
            if (two) h[r + i * FFN_WARPS] = hv[i];
    }
}

/* Items (row group g, expert slot j), item j * groups + g; block b of gdx takes items b,
 * b + gdx, ...: warp w computes rows w and w + FFN_WARPS of each item's group. With a router,
 * warp 0 routes while the other warps stage x. RF (router fusion, a.x_add; not with S6): the
 * input is h = x + x_add, and warp 0 scales the raw logits by h's RMS scale before it routes. */
template <int MODE, typename S, bool S6 = false, bool RF = false>
__device__ __forceinline__ void ffn_up_block(const engine_cu_ffn_up_args &a, int b, int gdx,
                                             uint8_t *sm, const S &sync) {
    __shared__ int ids[ENGINE_CU_MAX_EXPERT_USED];
    __shared__ float wts[ENGINE_CU_MAX_EXPERT_USED];
    __shared__ uint64_t tma_bar;
    const int w = threadIdx.x >> 5;
    const int gx = engine_cu_up_groups(a.rows), n_items = gx * (a.router ? a.k : 1);
    /* ENGINE_CU_ROUTE_TMA (the launcher's: one item a block, quantised, 2 FFN_WARPS rows a
     * group): the item's gate and up runs into shared memory at ws, thread 0 the copies */
    const bool tma = MODE != ENGINE_CU_X_F32 && (a.route & ENGINE_CU_ROUTE_TMA) && b < n_items;
    const size_t run = (size_t)2 * FFN_WARPS * a.row_bytes;
    uint8_t *ws = sm + engine_cu_w_off(engine_cu_xs_bytes(MODE != ENGINE_CU_X_F32, a.cols));
    if (tma && threadIdx.x == 0) {
        engine_cu_mbar_init(&tma_bar);
        if (!a.router) { /* dense: item b is row group b, known before the wait */
            engine_cu_mbar_expect(&tma_bar, (unsigned)(2 * run));
            engine_cu_bulk_g2s(ws, a.gate + (size_t)b * run, (unsigned)run, &tma_bar);
            engine_cu_bulk_g2s(ws + run, a.up + (size_t)b * run, (unsigned)run, &tma_bar);
        }
    }
    /* the item's gate and up rows are two contiguous runs of an expert: asked of L2 as soon
     * as the expert is known (dense: before the wait; MoE: by the routing warp once it has
     * routed, while the other warps still stage x); with max_bps every item's, else the
     * first's (the block has one) */
    if (a.norm_w && w == FFN_WARPS - 1)
        engine_cu_prefetch_l2((const uint8_t *)a.norm_w, sizeof(float) * (size_t)a.cols);
    if (!a.router && w == 0 && !tma)
        for (int it = b; it < n_items; it += gdx) {
            const int r0 = it * 2 * FFN_WARPS, nr = min(2 * FFN_WARPS, a.rows - r0);
            engine_cu_prefetch_l2(a.gate + (size_t)r0 * a.row_bytes, (size_t)nr * a.row_bytes);
            engine_cu_prefetch_l2(a.up + (size_t)r0 * a.row_bytes, (size_t)nr * a.row_bytes);
            if (!a.max_bps) break;
        }
    if (S6 && a.stage_early) /* x final (the router launched this kernel after its wait) */
        engine_cu_stage_x<MODE, true>(a.x, a.cols, a.norm_w, a.eps, sm, 0); /* all warps */
    sync.wait();
    if (a.trigger_late) engine_cu_pdl_launch(); /* the router's logits are complete */
    /* a.coop (RF): the scale of h by the whole block, the routing warp's logits read first */
    float sc = -1.0f, raw[ENGINE_CU_MAX_EXPERT / 32];
    if (RF && a.coop) {
        if (a.router && w == 0) ffn_route_raw(a, raw);
        sc = engine_cu_block_scale<false, true>((const float4 *)a.x, (const float4 *)a.x_add,
                                                a.cols, a.eps);
        ENGINE_CU_TRACE(4);
    }
    if (a.router) {
        if (w == 0) {
            if (S6 && a.routed) { /* the router's last block routed (complete after the wait) */
                const int lane = threadIdx.x & 31;
                if (lane < a.k) ids[lane] = __ldcg(a.ids + lane);
                __syncwarp();
            } else {
                ffn_route_warp<RF>(a, b, ids, wts, sc, RF && a.coop ? raw : nullptr);
                if (a.diag & 1)
                    ffn_route_warp<RF>(a, b, ids, wts, sc, RF && a.coop ? raw : nullptr);
            }
            ENGINE_CU_TRACE(5);
            for (int it = b; it < n_items; it += gdx) {
                const int j = it / gx, r0 = (it - j * gx) * 2 * FFN_WARPS;
                const int nr = min(2 * FFN_WARPS, a.rows - r0);
                const size_t off = (size_t)ids[j] * a.expert_bytes + (size_t)r0 * a.row_bytes;
                if (tma) {
                    if ((threadIdx.x & 31) == 0) {
                        engine_cu_mbar_expect(&tma_bar, (unsigned)(2 * run));
                        engine_cu_bulk_g2s(ws, a.gate + off, (unsigned)run, &tma_bar);
                        engine_cu_bulk_g2s(ws + run, a.up + off, (unsigned)run, &tma_bar);
                    }
                } else if (!(a.route & ENGINE_CU_ROUTE_BULK)) {
                    engine_cu_prefetch_l2(a.gate + off, (size_t)nr * a.row_bytes);
                    engine_cu_prefetch_l2(a.up + off, (size_t)nr * a.row_bytes);
                } else if ((threadIdx.x & 31) < 2) { /* a run each */
                    engine_cu_prefetch_bulk(((threadIdx.x & 1) ? a.up : a.gate) + off,
                                            (size_t)nr * a.row_bytes);
                }
                if (!a.max_bps) break;
            }
            ENGINE_CU_TRACE(2);
        }
    } else if (threadIdx.x == 0) {
        ids[0] = 0;
    }
    if (S6 && a.stage_early)
        __syncthreads(); /* ids visible */
    else
        for (int i = 0; i < (a.diag & 2 ? 2 : 1); i++) {
            if (i) __syncthreads(); /* the first staging's reads of sm done */
            if (RF)
                engine_cu_stage_x<MODE, false, true>(a.x, a.cols, a.norm_w, a.eps, sm,
                                                     a.router ? 1 : 0, a.x_add, sc);
            else
                engine_cu_stage_x<MODE>(a.x, a.cols, a.norm_w, a.eps, sm, a.router ? 1 : 0);
        }
    ENGINE_CU_TRACE(6);
    if (a.router && !(S6 && a.routed) && b == 0 && w == 0) { /* the block of item 0 */
        if (threadIdx.x < a.k) {
            a.ids[threadIdx.x] = ids[threadIdx.x];
            a.weights[threadIdx.x] = wts[threadIdx.x];
        }
        sync.ids_written();
    }
    const engine_cu_xv xv = engine_cu_xv_at(sm, a.cols, MODE != ENGINE_CU_X_F32, 0);
    if (tma) { /* the block's one item, from shared memory */
        engine_cu_mbar_wait(&tma_bar, 0);
        ENGINE_CU_TRACE(7);
        const int j = b / gx, r = (b - j * gx) * 2 * FFN_WARPS + w;
        ffn_up_rows<MODE, 2, true>(a, j, ids[j], r, xv, ws);
        ENGINE_CU_TRACE_END();
        return;
    }
    for (int it = b; it < n_items; it += gdx) {
        const int j = it / gx, r = (it - j * gx) * 2 * FFN_WARPS + w;
        if (r >= a.rows) continue;
        ffn_up_rows<MODE>(a, j, ids[j], r, xv);
    }
    ENGINE_CU_TRACE_END();
}

/* A lane takes (expert slot, chunk) items, so all 32 lanes work and the loads of different
 * experts are in flight together. UN: the loop's unroll (the same sums in the same order). */
template <int T, bool SH = false, int UN = 2>
__device__ __forceinline__ float down_row(const engine_cu_ffn_down_args &a, int r, const int *ids,
                                          const float *wts, const uint8_t *sm, bool quant,
                                          const uint8_t *ws = nullptr, size_t sst = 0) {
    /* sst (SH): the bytes from one slot's rows to the next (0: one run of FFN_WARPS rows) */
    if (SH && !sst) sst = engine_cu_run_stride(FFN_WARPS * a.row_bytes);
    const int nch = a.cols >> 5, n_items = a.k * nch, lane = threadIdx.x & 31;
    /* item it = (slot j, chunk c) = divmod(it, nch), stepped by 32 without a division an item
     * (the loop had a div.s32 an item) */
    const int dj = 32 / nch, dc = 32 - dj * nch;
    int j = lane / nch, c = lane - j * nch;
    float tot = 0.0f;
#pragma unroll(UN)
    for (int it = lane; it < n_items; it += 32) {
        /* SH: slot j's run of FFN_WARPS rows in shared memory (engine_cu_run_stride apart), ws
         * this warp's row in slot 0 */
        const uint8_t *d = SH ? ws + (size_t)j * sst
                              : a.down + (size_t)ids[j] * a.expert_bytes + (size_t)r * a.row_bytes;
        const engine_cu_xv xv = engine_cu_xv_at(sm, a.k * a.cols, quant, j * a.cols);
        tot += wts[j] * engine_cu_dot_chunk<T, SH>(d, c, xv);
        j += dj;
        c += dc;
        if (c >= nch) {
            c -= nch;
            j++;
        }
    }
    return engine_cu_warp_sum(tot);
}

/* Row r's result: y[r] += s, or with the router fusion (RF, a.y_add) y[r] = (y[r] + y_add[r]) +
 * s, the two adds of the unfused path (the wo kernel's accumulate, then this one) in order. */
template <bool RF>
__device__ __forceinline__ void down_store(const engine_cu_ffn_down_args &a, int r, float s) {
    if (RF)
        a.y[r] = (a.y[r] + a.y_add[r]) + s;
    else
        a.y[r] += s;
}

/* ffn_down_block below once the ids are known, when each warp loads the first two (expert,
 * chunk) items of its first row into registers before the wait (a.preload; quantised type T):
 * those loads overlap the wait and the staging of h; the same sums in the same order as
 * down_row. */
template <int T, int MODE, typename S, bool RF = false>
__device__ __forceinline__ void ffn_down_pre(const engine_cu_ffn_down_args &a, int b, int gdx,
                                             int n_groups, uint8_t *sm, const S &sync,
                                             const int *ids, float *wts) {
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = b * FFN_WARPS + w, nch = a.cols >> 5, n_items = a.k * nch;
    engine_cu_qraw raw[2];
    const uint8_t *rp[2] = {a.down, a.down};
    int jj[2] = {0, 0}, cc[2] = {0, 0};
    if (r < a.rows)
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int it = lane + 32 * u;
            if (it < n_items) {
                jj[u] = it / nch;
                cc[u] = it - jj[u] * nch;
                rp[u] = a.down + (size_t)ids[jj[u]] * a.expert_bytes + (size_t)r * a.row_bytes;
                engine_cu_qload<T>(rp[u], cc[u], raw[u]);
            }
        }
    for (int g = b; g < n_groups; g += gdx) { /* the rest of the rows: L2 */
        const int rg = g * FFN_WARPS + w;
        if (rg < a.rows)
            for (int j = 0; j < a.k; j++)
                engine_cu_prefetch_l2(a.down + (size_t)ids[j] * a.expert_bytes +
                                          (size_t)rg * a.row_bytes,
                                      a.row_bytes);
        if (!a.max_bps) break;
    }
    sync.wait(); /* h complete */
    if (a.sh_logit && threadIdx.x == 0) wts[a.k - 1] = 1.0f / (1.0f + expf(-*a.sh_logit));
    engine_cu_stage_x<MODE>(a.h, a.k * a.cols, nullptr, 0.0f, sm); /* ends with a barrier */
    if (r < a.rows) {
        float tot = 0.0f;
#pragma unroll
        for (int u = 0; u < 2; u++)
            if (lane + 32 * u < n_items) {
                const engine_cu_xv xv = engine_cu_xv_at(sm, a.k * a.cols, true, jj[u] * a.cols);
                tot += wts[jj[u]] * engine_cu_qdot_raw<T>(raw[u], rp[u], cc[u], xv);
            }
#pragma unroll 2
        for (int it = lane + 64; it < n_items; it += 32) {
            const int j = it / nch, c = it - j * nch;
            const uint8_t *d = a.down + (size_t)ids[j] * a.expert_bytes + (size_t)r * a.row_bytes;
            const engine_cu_xv xv = engine_cu_xv_at(sm, a.k * a.cols, true, j * a.cols);
            tot += wts[j] * engine_cu_dot_chunk<T>(d, c, xv);
        }
        const float s = engine_cu_warp_sum(tot);
        if (lane == 0) down_store<RF>(a, r, s);
    }
    for (int g = b + gdx; g < n_groups; g += gdx) {
        const int rg = g * FFN_WARPS + w;
        if (rg >= a.rows) continue;
        const float s = down_row<T>(a, rg, ids, wts, sm, true);
        if (lane == 0) down_store<RF>(a, rg, s);
    }
}

/* ffn_down_block below with a.tma (the launcher's: block b takes row group b alone, a
 * quantised type): thread 0 copies the group's run of FFN_WARPS rows of each of the k experts
 * into shared memory (after the staged h) with bulk copies, all in flight while the block stages
 * h; warp w then computes row b FFN_WARPS + w from there: down_row's sums, bit for bit. */
template <int MODE, typename S, bool RF>
__device__ __forceinline__ void ffn_down_tma(const engine_cu_ffn_down_args &a, int b, uint8_t *sm,
                                             const S &sync, const int *ids, float *wts) {
    __shared__ uint64_t tma_bar;
    const int w = threadIdx.x >> 5, r = b * FFN_WARPS + w;
    const size_t run = (size_t)FFN_WARPS * a.row_bytes;
    uint8_t *ws = sm + engine_cu_w_off(engine_cu_xs_bytes(true, a.k * a.cols));
    if (threadIdx.x == 0) {
        engine_cu_mbar_init(&tma_bar);
        engine_cu_mbar_expect(&tma_bar, (unsigned)(a.k * run));
        for (int j = 0; j < a.k; j++)
            engine_cu_bulk_g2s(ws + j * engine_cu_run_stride(run),
                               a.down + (size_t)ids[j] * a.expert_bytes + (size_t)b * run,
                               (unsigned)run, &tma_bar);
    }
    sync.wait(); /* h complete */
    if (a.sh_logit && threadIdx.x == 0) wts[a.k - 1] = 1.0f / (1.0f + expf(-*a.sh_logit));
    engine_cu_stage_x<MODE>(a.h, a.k * a.cols, nullptr, 0.0f, sm); /* ends with a barrier */
    ENGINE_CU_TRACE(5);
    engine_cu_mbar_wait(&tma_bar, 0);
    ENGINE_CU_TRACE(7);
    float s = 0.0f;
    switch (a.type) {
#define DOWN_CASE(T)                                                                               \
    case T:                                                                                        \
        if (MODE == engine_cu_x_mode(T))                                                           \
            s = down_row<T, true>(a, r, ids, wts, sm, true, ws + (size_t)w * a.row_bytes);         \
        break;
        ENGINE_CU_QUANT_CASES(DOWN_CASE)
#undef DOWN_CASE
    }
    if ((threadIdx.x & 31) == 0) down_store<RF>(a, r, s);
    ENGINE_CU_TRACE_END();
}

/* Row groups of FFN_WARPS rows of the down products: block b of gdx takes groups b, b + gdx,
 * ...; warp w computes row w of each. RF: the router fusion's residual add (a.y_add). */
template <int MODE, typename S, bool RF = false>
__device__ __forceinline__ void ffn_down_block(const engine_cu_ffn_down_args &a, int b, int gdx,
                                               uint8_t *sm, const S &sync) {
    __shared__ int ids[ENGINE_CU_MAX_EXPERT_USED];
    __shared__ float wts[ENGINE_CU_MAX_EXPERT_USED];
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n_groups = (a.rows + FFN_WARPS - 1) / FFN_WARPS;
    const int ks = a.sh_logit ? a.k - 1 : a.k; /* slots routed or read */
    if (a.router) { /* the logits are complete (the up launch triggered late): route now */
        if (w == 0) route(a.router, a.n_expert, ks, a.norm_topk, ids, wts, true);
    } else if (a.ids_early) { /* routed by the router launch, complete: read before the wait */
        if ((int)threadIdx.x < ks) {
            ids[threadIdx.x] = __ldcg(a.ids + threadIdx.x);
            wts[threadIdx.x] = __ldcg(a.weights + threadIdx.x);
        }
    } else {
        sync.wait_ids();
        if ((int)threadIdx.x < ks) {
            ids[threadIdx.x] = a.ids ? a.ids[threadIdx.x] : 0;
            wts[threadIdx.x] = a.ids ? a.weights[threadIdx.x] : 1.0f;
        }
    }
    if (a.sh_logit && threadIdx.x == 0) ids[a.k - 1] = a.sh_id;
    __syncthreads();
    ENGINE_CU_TRACE(4);
    if (MODE != ENGINE_CU_X_F32 && a.tma) { /* the launcher's: one row group a block */
        ffn_down_tma<MODE, S, RF>(a, b, sm, sync, ids, wts);
        return;
    }
    if (a.preload && !a.touch && MODE != ENGINE_CU_X_F32) {
        switch (a.type) {
#define DOWN_PRE(T)                                                                                \
    case T:                                                                                        \
        if (MODE == engine_cu_x_mode(T)) {                                                         \
            ffn_down_pre<T, MODE, S, RF>(a, b, gdx, n_groups, sm, sync, ids, wts);                 \
            return;                                                                                \
        }                                                                                          \
        break;
            ENGINE_CU_QUANT_CASES(DOWN_PRE)
#undef DOWN_PRE
        }
    }
    uint32_t tv0 = 0, tv1 = 0; /* touched bytes, consumed at the end */
    for (int g = b; g < n_groups; g += gdx) {
        const int r = g * FFN_WARPS + w;
        if (r >= a.rows) {
        } else if (g == b && a.touch && MODE != ENGINE_CU_X_F32) {
            /* the warp's k rows into L1 while the block stages h: lane items (expert j, line),
             * each row's lines counted with one to spare for a misaligned start, the last
             * clamped to the row's last byte; items past 64 only to L2 */
            const int lpr = (int)((a.row_bytes + 127) / 128) + 1, n_it = a.k * lpr;
            for (int it = lane, i = 0; it < n_it; it += 32, i++) {
                const int j = it / lpr, ln = it - j * lpr;
                const uint8_t *p = a.down + (size_t)ids[j] * a.expert_bytes +
                                   (size_t)r * a.row_bytes + min((size_t)ln * 128, a.row_bytes - 1);
                if (i == 0)
                    asm volatile("ld.global.nc.u8 %0, [%1];" : "=r"(tv0) : "l"(p));
                else if (i == 1)
                    asm volatile("ld.global.nc.u8 %0, [%1];" : "=r"(tv1) : "l"(p));
                else
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
            }
        } else if (a.pf_bulk) { /* lane j: slot j's row */
            if (lane < a.k)
                engine_cu_prefetch_bulk(a.down + (size_t)ids[lane] * a.expert_bytes +
                                            (size_t)r * a.row_bytes,
                                        a.row_bytes);
        } else {
            for (int j = 0; j < a.k; j++)
                engine_cu_prefetch_l2(a.down + (size_t)ids[j] * a.expert_bytes +
                                          (size_t)r * a.row_bytes,
                                      a.row_bytes);
        }
        if (!a.max_bps) break;
    }
    sync.wait(); /* h complete */
    if (a.sh_logit && threadIdx.x == 0) wts[a.k - 1] = 1.0f / (1.0f + expf(-*a.sh_logit));
    engine_cu_stage_x<MODE>(a.h, a.k * a.cols, nullptr, 0.0f, sm); /* ends with a barrier */
    ENGINE_CU_TRACE(5);
    if (a.diag & 2) engine_cu_stage_x<MODE>(a.h, a.k * a.cols, nullptr, 0.0f, sm);
    for (int g = b; g < n_groups; g += gdx) {
        const int r = g * FFN_WARPS + w;
        if (r >= a.rows) continue;
        float s = 0.0f;
        switch (a.type) {
#define DOWN_CASE(T)                                                                               \
    case T:                                                                                        \
        if (MODE == engine_cu_x_mode(T)) s = down_row<T>(a, r, ids, wts, sm, true);                \
        break;
            ENGINE_CU_QUANT_CASES(DOWN_CASE)
#undef DOWN_CASE
#define DOWN_CASE(T)                                                                               \
    case T:                                                                                        \
        if (MODE == ENGINE_CU_X_F32) s = down_row<T>(a, r, ids, wts, sm, false);                   \
        break;
            ENGINE_CU_FLOAT_CASES(DOWN_CASE)
#undef DOWN_CASE
        }
        if (lane == 0) down_store<RF>(a, r, s);
    }
    engine_cu_sink(tv0 + tv1, a.y);
    ENGINE_CU_TRACE_END();
}

#endif
