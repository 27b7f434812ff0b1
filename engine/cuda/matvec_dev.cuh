/* Device side of the quantised matrix-vector products (contract in matvec.cuh): the work of
 * one block, shared by the per-op kernel (matvec.cu) and the fused decode step (step.cu). */
#ifndef SPARK_ENGINE_CUDA_MATVEC_DEV_CUH
#define SPARK_ENGINE_CUDA_MATVEC_DEV_CUH

#include "matvec.cuh"
#include "qdot.cuh"
#include "sync.cuh"

/* The lane's partial dot products of R rows (row0, row0 + stride, ...) with the staged x over
 * chunks c0, c0 + step, ... (the R rows' loads are in flight together); rows from nvalid on
 * (past the matrix's end) compute on row0 and are not to be stored. */
template <int T, int R, bool SH = false>
__device__ __forceinline__ void mv_rows(const uint8_t *row0, size_t stride, int nvalid, int c0,
                                        int step, int n_chunks, const engine_cu_xv &xv,
                                        float acc[R]) {
#pragma unroll
    for (int i = 0; i < R; i++)
        acc[i] = 0.0f;
    /* the head's copy: a lane's chunks of both rows in flight together */
    constexpr int UNROLL = R == 1 || T == ENGINE_CU_TYPE_Q6_KR ? 2 : 1;
#pragma unroll(UNROLL)
    for (int c = c0; c < n_chunks; c += step)
#pragma unroll
        for (int i = 0; i < R; i++) {
            const uint8_t *row = row0 + (i < nvalid ? i : 0) * stride;
            if constexpr (T == ENGINE_CU_TYPE_Q6_KR)
                acc[i] += engine_cu_q6r_dot<SH>(row, c, n_chunks, xv);
            else
                acc[i] += engine_cu_dot_chunk<T, SH>(row, c, xv);
        }
}

/* Row groups: matrix i owns groups [start_i, start_i + n_i), of `per` rows each. */
__device__ __forceinline__ int mv_find(const engine_cu_mv &a, int g, int per, int *first) {
    int start = 0;
    for (int i = 0; i < a.n_mat; i++) {
        const int n = (a.m[i].rows + per - 1) / per;
        if (g < start + n) {
            *first = start;
            return i;
        }
        start += n;
    }
    *first = start;
    return -1;
}

/* Group g of a block (every thread of the block; after the staging): warp w's rows (R > 0) or
 * its chunks of the group's row (R == 0, the block summing the warps' parts in `part`). Returns
 * the group's output vector (for engine_cu_sink), or NULL. Q6R: the instance of the output head's
 * repacked copy (dequant.cuh ENGINE_CU_TYPE_Q6_KR; R 1, 2 or 4, mode Q8_K), an instance of its own
 * so that the other launches' code stays as it is (a Q6_KR case in their switch measured ~1%
 * slower steps, session 12). SH (R > 0, quantised): the group's rows from the block's copy in
 * shared memory at ws (mv_block's bulk copy, engine_cu_mv.tma). TT (a quantised type; 0: any):
 * an instance whose switch holds type TT's products alone, for callers whose matrices are all
 * of type TT (router_fuse.cu, engine_cu_rf_args.spec); the same sums. */
template <int MODE, int R, bool Q6R = false, bool SH = false, int TT = 0>
__device__ __forceinline__ float *mv_group(const engine_cu_mv &a, int g, const engine_cu_xv &xv,
                                           float *part, const uint8_t *ws = nullptr) {
    constexpr int NR = R > 0 ? R : 1, PER = R > 0 ? ENGINE_CU_MV_WARPS * R : 1;
    const int w = engine_cu_warp_id(), lane = threadIdx.x & 31;
    int first;
    const int mi = mv_find(a, g, PER, &first);
    if (mi < 0) return nullptr; /* never: n_groups row groups in all */
    const uint8_t *mw = a.m[mi].w;
    const size_t rb = a.m[mi].row_bytes;
    const int rows = a.m[mi].rows, type = a.m[mi].type, accumulate = a.m[mi].accumulate;
    float *y = a.m[mi].y;
    const int n_chunks = a.cols >> 5;
    const int r0 = (g - first) * PER + (R > 0 ? w : 0);
    float acc[NR];
    if (R > 0 && r0 >= rows) return y; /* no barrier below when R > 0 */
    /* rows past the end compute on row r0 and are not stored */
    const uint8_t *row = SH ? ws + (size_t)w * rb : mw + (size_t)r0 * rb;
    const size_t stride = (size_t)8 * rb;
    const int nvalid = R > 0 ? min(NR, (rows - r0 + 7) / 8) : 1;
    const int c0 = R > 0 ? lane : 32 * w + lane, step = R > 0 ? 32 : 32 * ENGINE_CU_MV_WARPS;
    if constexpr (Q6R) {
        static_assert(MODE == ENGINE_CU_X_Q8_K && R > 0 && R <= 4, "the head's instance");
        mv_rows<ENGINE_CU_TYPE_Q6_KR, NR>(row, stride, nvalid, c0, step, n_chunks, xv, acc);
    } else {
        switch (type) {
#define MV_CASE(T)                                                                                 \
    case T:                                                                                        \
        if (MODE == engine_cu_x_mode(T) && (TT == 0 || TT == T))                                   \
            mv_rows<T, NR, SH>(row, stride, nvalid, c0, step, n_chunks, xv, acc);                  \
        break;
            ENGINE_CU_QUANT_CASES(MV_CASE)
#undef MV_CASE
#define MV_CASE(T)                                                                                 \
    case T:                                                                                        \
        if (MODE == ENGINE_CU_X_F32 && !SH && TT == 0)                                             \
            mv_rows<T, NR>(row, stride, nvalid, c0, step, n_chunks, xv, acc);                      \
        break;
            ENGINE_CU_FLOAT_CASES(MV_CASE)
#undef MV_CASE
        default:
            for (int i = 0; i < NR; i++)
                acc[i] = 0.0f;
        }
    }
    if (R > 0) {
#pragma unroll
        for (int i = 0; i < NR; i++) {
            const float s = engine_cu_warp_sum(acc[i]);
            const int r = r0 + 8 * i;
            if (lane == 0 && r < rows) y[r] = accumulate ? y[r] + s : s;
        }
    } else {
        const float s = engine_cu_warp_sum(acc[0]);
        if (lane == 0) part[w] = s;
        __syncthreads();
        if (threadIdx.x == 0) {
            float t = 0.0f;
            for (int k = 0; k < ENGINE_CU_MV_WARPS; k++)
                t += part[k];
            y[r0] = accumulate ? y[r0] + t : t;
        }
        __syncthreads();
    }
    return y;
}

/* Stage the block's input (every thread calls it; ends with a barrier): normalised with the
 * per-warp scale, or with a.coop the whole block's (engine_cu_mv.coop). FIX (an instance
 * launched only with a.coop and a.nw_late off, and without a norm where !NORM): those fixed, so
 * that the alternatives are not in its image. */
template <int MODE, bool NORM = true, bool FIX = false>
__device__ __forceinline__ void mv_stage(const engine_cu_mv &a, uint8_t *sm,
                                         const engine_cu_nw_pre *pre = nullptr) {
    const float *nw = FIX && !NORM ? nullptr : a.norm_w;
    const float sc =
        !FIX && a.coop && nw
            ? engine_cu_block_scale<false, false>((const float4 *)a.x, nullptr, a.cols, a.eps)
            : -1.0f;
    engine_cu_stage_x<MODE>(a.x, a.cols, nw, a.eps, sm, 0, nullptr, sc, pre);
}

/* The staging warp's norm weights read before the wait (qdot.cuh engine_cu_stage_nw; none with
 * a.nw_late): for mv_stage. */
template <int MODE, bool NORM = true, bool FIX = false>
__device__ __forceinline__ engine_cu_nw_pre mv_nw(const engine_cu_mv &a) {
    if (!NORM) return engine_cu_stage_x_nw<MODE>(nullptr, a.cols);
    return engine_cu_stage_x_nw<MODE>(!FIX && a.nw_late ? nullptr : a.norm_w, a.cols);
}

/* Ask L2 for warp w's rows of groups g0, g0 + gdx, ... (R > 0; all of them, or g0's alone). */
template <int R>
__device__ __forceinline__ void mv_prefetch_groups(const engine_cu_mv &a, int g0, int gdx,
                                                   int n_groups, bool all) {
    constexpr int PER = ENGINE_CU_MV_WARPS * R;
    const int w = threadIdx.x >> 5;
    for (int g = g0; g < n_groups; g += gdx) {
        int first;
        const int mi = mv_find(a, g, PER, &first);
        if (mi < 0) break;
        const size_t rb = a.m[mi].row_bytes;
        const int r0 = (g - first) * PER + w;
#pragma unroll
        for (int i = 0; i < R; i++)
            if (r0 + 8 * i < a.m[mi].rows)
                engine_cu_prefetch_l2(a.m[mi].w + (size_t)(r0 + 8 * i) * rb, rb);
        if (!all) break;
    }
}

/* The block of mv_block below when the warps load the first chunk of their first group's rows
 * into registers before the wait (a.preload; quantised type T of the block's first group, R >
 * 0): those loads are in flight during the wait and the staging, the compute picks them up
 * after it; the same sums in the same order as mv_rows. */
template <int T, int MODE, int R, typename S, int TT = 0>
__device__ __forceinline__ void mv_block_pre(const engine_cu_mv &a, int n_groups, int bx, int gdx,
                                             uint8_t *sm, const S &sync, int mi, int first) {
    __shared__ float part[ENGINE_CU_MV_WARPS];
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const uint8_t *mw = a.m[mi].w;
    const size_t rb = a.m[mi].row_bytes;
    const int rows = a.m[mi].rows, accumulate = a.m[mi].accumulate;
    float *y = a.m[mi].y;
    const int n_chunks = a.cols >> 5;
    const int r0 = (bx - first) * ENGINE_CU_MV_WARPS * R + w;
    const size_t stride = r0 + 8 * (R - 1) < rows ? (size_t)8 * rb : 0;
    const uint8_t *row = mw + (size_t)min(r0, rows - 1) * rb;
    const bool live = r0 < rows && lane < n_chunks;
    engine_cu_qraw raw[R];
    if (live)
#pragma unroll
        for (int i = 0; i < R; i++)
            engine_cu_qload<T>(row + i * stride, lane, raw[i]);
    /* the rest of the rows, and the norm weights every block reads: L2 */
    mv_prefetch_groups<R>(a, bx, gdx, n_groups, a.max_bps > 0);
    if (a.norm_w && w == ENGINE_CU_MV_WARPS - 1)
        engine_cu_prefetch_l2((const uint8_t *)a.norm_w, sizeof(float) * (size_t)a.cols);
    sync.wait();
    mv_stage<MODE>(a, sm);
    const engine_cu_xv xv = engine_cu_xv_at(sm, a.cols, true, 0);
    if (r0 < rows) {
        float acc[R];
#pragma unroll
        for (int i = 0; i < R; i++) {
            acc[i] = 0.0f;
            if (live) acc[i] += engine_cu_qdot_raw<T>(raw[i], row + i * stride, lane, xv);
        }
#pragma unroll(R == 1 ? 2 : 1)
        for (int c = lane + 32; c < n_chunks; c += 32)
#pragma unroll
            for (int i = 0; i < R; i++)
                acc[i] += engine_cu_dot_chunk<T>(row + i * stride, c, xv);
#pragma unroll
        for (int i = 0; i < R; i++) {
            const float s = engine_cu_warp_sum(acc[i]);
            const int r = r0 + 8 * i;
            if (lane == 0 && r < rows) y[r] = accumulate ? y[r] + s : s;
        }
    }
    for (int g = bx + gdx; g < n_groups; g += gdx)
        mv_group<MODE, R, false, false, TT>(a, g, xv, part);
}

/* mv_block below with a.tma (the launcher's: a block per row group, R > 0, a quantised mode,
 * rows of 16-byte multiples at 16-byte-aligned addresses): thread 0 copies the block's group of
 * rows (one contiguous run) into shared memory after the staged x with a bulk copy BEFORE the
 * wait, so the rows arrive while the previous kernel finishes; the warps then compute from
 * there: mv_group's sums, bit for bit. */
template <int MODE, int R, typename S, bool NORM = true, int TT = 0, bool FIX = false>
__device__ __forceinline__ void mv_block_tma(const engine_cu_mv &a, int bx, uint8_t *sm,
                                             const S &sync) {
    constexpr int PER = ENGINE_CU_MV_WARPS * R;
    __shared__ uint64_t tma_bar;
    __shared__ float part[ENGINE_CU_MV_WARPS];
    int first;
    const int mi = mv_find(a, bx, PER, &first);
    if (mi < 0) return; /* never: a block per group */
    uint8_t *ws = sm + engine_cu_w_off(engine_cu_xs_bytes(true, a.cols));
    if (threadIdx.x == 0) {
        const size_t rb = a.m[mi].row_bytes;
        const int r0 = (bx - first) * PER, nr = min(PER, a.m[mi].rows - r0);
        engine_cu_mbar_init(&tma_bar);
        engine_cu_mbar_expect(&tma_bar, (unsigned)(nr * rb));
        engine_cu_bulk_g2s(ws, a.m[mi].w + (size_t)r0 * rb, (unsigned)(nr * rb), &tma_bar);
    }
    if ((NORM || !FIX) && a.norm_w &&
        (threadIdx.x >> 5) == ENGINE_CU_MV_WARPS - 1) /* read by every block: L2 */
        engine_cu_prefetch_l2((const uint8_t *)a.norm_w, sizeof(float) * (size_t)a.cols);
    const engine_cu_nw_pre nwp = mv_nw<MODE, NORM, FIX>(a); /* NORM false: a launch with no norm */
    sync.wait();
    mv_stage<MODE, NORM, FIX>(a, sm, &nwp); /* ends with a barrier: the init visible to all */
    ENGINE_CU_TRACE(4);
    engine_cu_mbar_wait(&tma_bar, 0);
    ENGINE_CU_TRACE(7);
    const engine_cu_xv xv = engine_cu_xv_at(sm, a.cols, true, 0);
    mv_group<MODE, R, false, true, TT>(a, bx, xv, part, ws);
    ENGINE_CU_TRACE_END();
}

/* Block bx of a grid of gdx blocks (n_groups row groups), `sm` the dynamic shared memory;
 * `sync.wait()` where the block must wait for its inputs (every thread calls it).
 * MODE: the activation staging (qdot.cuh) of the weight types this instance handles.
 * R > 0: a group is 8 * R rows, warp w computing rows w, w + 8, ... of it (R at once).
 * R == 0 (split-K, for matrices of few rows): a group is one row, warp w taking chunks
 * w, w + 8, ... and the block summing the warps' parts. */
template <int MODE, int R, typename S, bool Q6R = false, bool NORM = true, int TT = 0,
          bool TO = false>
__device__ __forceinline__ void mv_block(const engine_cu_mv &a, int n_groups, int bx, int gdx,
                                         uint8_t *sm, const S &sync) {
    constexpr int NR = R > 0 ? R : 1, PER = R > 0 ? ENGINE_CU_MV_WARPS * R : 1;
    __shared__ float part[ENGINE_CU_MV_WARPS];
    const int w = engine_cu_warp_id();
    /* TO (a launcher's, with a.tma set, a.coop and a.nw_late off, and no norm where !NORM): the
     * bulk-copy form alone with those fixed (mv_stage FIX), so that the instance's image holds
     * none of the other forms' code */
    if constexpr (!Q6R && R > 0 && MODE != ENGINE_CU_X_F32)
        if (TO || a.tma) {
            mv_block_tma<MODE, R, S, NORM, TT, TO>(a, bx, sm, sync);
            return;
        }
    if (!Q6R && R > 0 && R <= 2 && MODE != ENGINE_CU_X_F32 && a.preload && !a.touch) {
        int first;
        const int mi = mv_find(a, bx, PER, &first);
        if (mi < 0) return; /* never: the grid has at most n_groups blocks */
        switch (a.m[mi].type) {
#define MV_PRE(T)                                                                                  \
    case T:                                                                                        \
        if (MODE == engine_cu_x_mode(T) && (TT == 0 || TT == T)) {                                 \
            mv_block_pre<T, MODE, (R > 0 ? R : 1), S, TT>(a, n_groups, bx, gdx, sm, sync, mi,      \
                                                          first);                                  \
            return;                                                                                \
        }                                                                                          \
        break;
            ENGINE_CU_QUANT_CASES(MV_PRE)
#undef MV_PRE
        }
    }
    uint32_t tv[NR][2] = {}; /* touched bytes (a.touch), consumed at the end */
    /* the first group's weights (with max_bps: every group's, L2 only) fetched while the
     * previous kernel finishes */
    for (int g = bx; g < n_groups; g += gdx) {
        int first;
        const int mi = mv_find(a, g, PER, &first);
        if (mi < 0) break; /* never: n_groups row groups in all */
        const uint8_t *mw = a.m[mi].w;
        const size_t rb = a.m[mi].row_bytes;
        const int r0 = (g - first) * PER;
#pragma unroll
        for (int i = 0; i < NR; i++) {
            const uint8_t *p = nullptr;
            size_t n = 0;
            if (R == 0) {
                const size_t part_b = (rb + ENGINE_CU_MV_WARPS - 1) / ENGINE_CU_MV_WARPS;
                if (w * part_b < rb) {
                    p = mw + (size_t)r0 * rb + w * part_b;
                    n = min(part_b, rb - w * part_b);
                }
            } else if (r0 + w + 8 * i < a.m[mi].rows) {
                p = mw + (size_t)(r0 + w + 8 * i) * rb;
                n = rb;
            }
            if (g == bx) {
                if (p && a.touch && MODE != ENGINE_CU_X_F32) /* F32: registers are short */
                    engine_cu_touch<2>(p, n, tv[i]);
                else if (p)
                    engine_cu_prefetch_l2(p, n);
            } else if (p) {
                engine_cu_prefetch_l2(p, n);
            }
        }
        if (!a.max_bps) break;
    }
    if (a.norm_w && w == ENGINE_CU_MV_WARPS - 1) /* read by every block: L2 */
        engine_cu_prefetch_l2((const uint8_t *)a.norm_w, sizeof(float) * (size_t)a.cols);
    sync.wait();
    mv_stage<MODE>(a, sm);
    ENGINE_CU_TRACE(4);
    const engine_cu_xv xv = engine_cu_xv_at(sm, a.cols, MODE != ENGINE_CU_X_F32, 0);
    float *y = nullptr;
    for (int g = bx; g < n_groups; g += gdx) {
        float *yg = mv_group<MODE, R, Q6R, false, TT>(a, g, xv, part);
        if (yg) y = yg;
    }
    uint32_t sum = 0;
#pragma unroll
    for (int i = 0; i < NR; i++)
        sum += tv[i][0] + tv[i][1];
    if (y) engine_cu_sink(sum, y);
    ENGINE_CU_TRACE_END();
}

/* The ring form (engine_cu_mv.ring, matvec.cu mv_ring_kernel): one block a multiprocessor of NW
 * warps loops over one large matrix (the output head). Each warp streams its own tiles of R
 * consecutive rows (tiles gw, gw + GW, ... for the grid's GW warps) through nbuf buffers of its
 * own in shared memory with bulk copies, lane 0 putting the tile nbuf ahead in flight as soon
 * as the warp has read a buffer, so the memory is not idle between row groups (the looping
 * kernels reload registers group by group). The first nbuf tiles are asked for before the
 * wait: weights do not depend on the previous kernel. Q6R: the head's repacked copy. A row's
 * sum is mv_rows's on the same bytes, so mv_group's bit for bit; the staging is mv_stage's
 * (with a.coop, the scale over the first ENGINE_CU_MV_WARPS warps, as in the other kernels). */
__device__ __forceinline__ void mv_ring_issue(const engine_cu_mat &m, int R, int gw, int GW, int k,
                                              int nbuf, uint8_t *ring, size_t tile, uint64_t *bar) {
    const int n_tiles = (m.rows + R - 1) / R, t = gw + k * GW;
    if (t >= n_tiles) return;
    const int r0 = t * R, nr = min(R, m.rows - r0);
    uint64_t *b = bar + k % nbuf;
    engine_cu_mbar_expect(b, (unsigned)(nr * m.row_bytes));
    engine_cu_bulk_g2s(ring + (size_t)(k % nbuf) * tile, m.w + (size_t)r0 * m.row_bytes,
                       (unsigned)(nr * m.row_bytes), b);
}

template <int MODE, int NW, int R, bool Q6R, typename S>
__device__ __forceinline__ void mv_block_ring(const engine_cu_mv &a, int nbuf, uint8_t *sm,
                                              const S &sync) {
    __shared__ uint64_t bars[NW][ENGINE_CU_MV_RING_MAX];
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const engine_cu_mat &m = a.m[0];
    const size_t rb = m.row_bytes, tile = (size_t)R * rb;
    const int n_tiles = (m.rows + R - 1) / R;
    const int gw = (int)blockIdx.x * NW + w, GW = (int)gridDim.x * NW;
    uint8_t *ring =
        sm + engine_cu_w_off(engine_cu_xs_bytes(true, a.cols)) + (size_t)w * nbuf * tile;
    uint64_t *bar = bars[w];
    if (lane == 0) {
        for (int i = 0; i < nbuf; i++)
            engine_cu_mbar_init(bar + i);
        for (int k = 0; k < nbuf; k++)
            mv_ring_issue(m, R, gw, GW, k, nbuf, ring, tile, bar);
    }
    if (a.norm_w && w == NW - 1) /* read by every block: L2 */
        engine_cu_prefetch_l2((const uint8_t *)a.norm_w, sizeof(float) * (size_t)a.cols);
    const engine_cu_nw_pre nwp = mv_nw<MODE>(a);
    sync.wait();
    const float sc = a.coop && a.norm_w
                         ? engine_cu_block_scale<false, false>((const float4 *)a.x, nullptr, a.cols,
                                                               a.eps, ENGINE_CU_MV_WARPS * 32)
                         : -1.0f;
    engine_cu_stage_x<MODE>(a.x, a.cols, a.norm_w, a.eps, sm, 0, nullptr, sc, &nwp); /* a barrier */
    const engine_cu_xv xv = engine_cu_xv_at(sm, a.cols, true, 0);
    const int n_chunks = a.cols >> 5;
    for (int k = 0; gw + k * GW < n_tiles; k++) {
        const int r0 = (gw + k * GW) * R, nvalid = min(R, m.rows - r0);
        const uint8_t *buf = ring + (size_t)(k % nbuf) * tile;
        engine_cu_mbar_wait(bar + k % nbuf, (unsigned)((k / nbuf) & 1));
        float acc[R];
        if constexpr (Q6R) {
            mv_rows<ENGINE_CU_TYPE_Q6_KR, R, true>(buf, rb, nvalid, lane, 32, n_chunks, xv, acc);
        } else {
            switch (m.type) {
#define MV_CASE(T)                                                                                 \
    case T:                                                                                        \
        if (MODE == engine_cu_x_mode(T))                                                           \
            mv_rows<T, R, true>(buf, rb, nvalid, lane, 32, n_chunks, xv, acc);                     \
        break;
                ENGINE_CU_QUANT_CASES(MV_CASE)
#undef MV_CASE
            default:
#pragma unroll
                for (int i = 0; i < R; i++)
                    acc[i] = 0.0f;
            }
        }
        __syncwarp(); /* every lane has read the buffer: it takes tile k + nbuf */
        if (lane == 0) {
            engine_cu_fence_proxy_async();
            mv_ring_issue(m, R, gw, GW, k + nbuf, nbuf, ring, tile, bar);
        }
#pragma unroll
        for (int i = 0; i < R; i++) {
            const float s = engine_cu_warp_sum(acc[i]);
            if (lane == 0 && i < nvalid) m.y[r0 + i] = m.accumulate ? m.y[r0 + i] + s : s;
        }
    }
}

#endif
