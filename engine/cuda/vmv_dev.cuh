/* Device side of the matrix products of m activation vectors (the MTP verify pass): each
 * weight chunk loaded and unpacked once for the m products, each product summed in exactly the
 * decode matvec's order (matvec_dev.cuh), so every result equals the decode step's bit for bit.
 * Shared by the verify kernels (q35_verify.cu) and the fused wo + router launch's m-token form
 * (router_fuse.cu). */
#ifndef SPARK_ENGINE_CUDA_VMV_DEV_CUH
#define SPARK_ENGINE_CUDA_VMV_DEV_CUH

#include "matvec_dev.cuh"

/* Bytes of one staged vector of cols values (16-byte aligned). */
static __host__ __device__ __forceinline__ size_t vmv_xs(bool quant, int cols) {
    return (engine_cu_xs_bytes(quant, cols) + 15) & ~(size_t)15;
}

/* The staged vector t of a block (vmv_xs bytes each). */
__device__ __forceinline__ engine_cu_xv vmv_xv(const uint8_t *sm, size_t xs, int cols, bool quant,
                                               int t) {
    return engine_cu_xv_at(sm + (size_t)t * xs, cols, quant, 0);
}

/* Chunk c of a quantised row, loaded and unpacked (the operands of engine_cu_qdot_chunk's
 * expression, qdot.cuh): its 32 quants as lo / hi words and its scales. Plain read-only loads:
 * the values of qdot.cuh's, without its optional L2 policy. */
typedef struct {
    uint32_t lo[4], hi[4];
    float d1, d2, m1, m2, d;
    int a0, b0; /* the chunk's columns (engine_cu_chunk_cols) */
} vq_u;

template <int T>
__device__ __forceinline__ void vq_unpack(const uint8_t *row, int c, int cols, vq_u &u) {
    int a0, b0;
    engine_cu_chunk_cols(T, c, &a0, &b0);
    u.a0 = a0;
    u.b0 = b0;
    uint32_t *lo = u.lo, *hi = u.hi;
    float d1 = 0.0f, d2 = 0.0f, m1 = 0.0f, m2 = 0.0f, d = 0.0f;
    if (T == ENGINE_TYPE_Q4_K || T == ENGINE_TYPE_Q5_K) {
        const bool q5 = T == ENGINE_TYPE_Q5_K;
        const uint8_t *b = row + (size_t)(c >> 3) * (q5 ? 176 : 144);
        const int q = c & 7, j = q >> 1, half = q & 1;
        const uint32_t dd = __ldg((const uint32_t *)b);
        const float dk = engine_cu_h2f((uint16_t)(dd & 0xffffu)),
                    dmin = engine_cu_h2f((uint16_t)(dd >> 16));
        const uint32_t w0 = __ldg((const uint32_t *)(b + 4)), w1 = __ldg((const uint32_t *)(b + 8)),
                       w2 = __ldg((const uint32_t *)(b + 12));
        uint32_t qs[4];
        engine_cu_load16_a16(b + (q5 ? 48 : 16) + 32 * j + 16 * half, qs);
        int sc[2], mn[2];
        engine_cu_scale_min_k4w2(j, w0, w1, w2, sc, mn);
        d1 = dk * (float)sc[0];
        m1 = dmin * (float)mn[0];
        d2 = dk * (float)sc[1];
        m2 = dmin * (float)mn[1];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo[i] = qs[i] & 0x0F0F0F0Fu;
            hi[i] = (qs[i] >> 4) & 0x0F0F0F0Fu;
        }
        if (q5) {
            uint32_t qh[4];
            engine_cu_load16_a16(b + 16 + 16 * half, qh);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                lo[i] |= ((qh[i] >> (2 * j)) & 0x01010101u) << 4;
                hi[i] |= ((qh[i] >> (2 * j + 1)) & 0x01010101u) << 4;
            }
        }
    } else if (T == ENGINE_TYPE_Q6_K) {
        const uint8_t *b = row + (size_t)(c >> 3) * 210;
        const int q = c & 7, hh = q >> 2, r = q & 3, w = r >> 1, l0 = 16 * (r & 1);
        const float dk = engine_cu_h2f(__ldg((const uint16_t *)(b + 208)));
        uint32_t ql[4], qh[4];
        engine_cu_ldw_a2<4>(b + 64 * hh + 32 * w + l0, ql);
        engine_cu_ldw_a2<4>(b + 128 + 32 * hh + l0, qh);
        const int8_t *scp = (const int8_t *)(b + 192 + 8 * hh + (l0 >> 4));
        d1 = dk * (float)__ldg(scp + 2 * w);
        d2 = dk * (float)__ldg(scp + 4 + 2 * w);
        const int s1 = 2 * w, s2 = 4 + 2 * w;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo[i] = (ql[i] & 0x0F0F0F0Fu) | (((qh[i] >> s1) & 0x03030303u) << 4);
            hi[i] = ((ql[i] >> 4) & 0x0F0F0F0Fu) | (((qh[i] >> s2) & 0x03030303u) << 4);
        }
    } else if (T == ENGINE_CU_TYPE_Q6_KR) {
        size_t oq, oh, os, od;
        engine_cu_q6r_at(c, cols >> 5, &oq, &oh, &os, &od);
        uint32_t ql[4];
        engine_cu_load16_a16(row + oq, ql);
        const uint2 u = __ldg((const uint2 *)(row + oh));
        const uint32_t sc = __ldg((const uint16_t *)(row + os));
        const float dk = engine_cu_h2f(__ldg((const uint16_t *)(row + od)));
        d1 = dk * (float)(int)(int8_t)(sc & 0xffu);
        d2 = dk * (float)(int)(int8_t)(sc >> 8);
        engine_cu_q6r_unpack(ql, u.x, u.y, lo, hi);
    } else if (T == ENGINE_TYPE_Q8_0) {
        const uint8_t *b = row + (size_t)c * 34;
        d = engine_cu_h2f(__ldg((const uint16_t *)b));
        uint32_t v[8];
        engine_cu_ldw_a2<8>(b + 2, v);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo[i] = v[i];
            hi[i] = v[i + 4];
        }
    } else { /* Q4_0 */
        const uint8_t *b = row + (size_t)c * 18;
        d = engine_cu_h2f(__ldg((const uint16_t *)b));
        uint32_t v[4];
        engine_cu_ldw_a2<4>(b + 2, v);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo[i] = v[i] & 0x0F0F0F0Fu;
            hi[i] = (v[i] >> 4) & 0x0F0F0F0Fu;
        }
    }
    u.d1 = d1;
    u.d2 = d2;
    u.m1 = m1;
    u.m2 = m2;
    u.d = d;
}

/* The staged vector's operands of a chunk at columns a0 / b0: loaded once for every row. */
typedef struct {
    int4 xa, xb;
    float da, db, sa, sb;
} vq_x;

__device__ __forceinline__ vq_x vq_xload(const uint8_t *sm, size_t xs, int cols, int t, int a0,
                                         int b0) {
    const engine_cu_xv xv = vmv_xv(sm, xs, cols, true, t);
    vq_x x;
    x.xa = *(const int4 *)(xv.q + a0);
    x.xb = *(const int4 *)(xv.q + b0);
    x.da = xv.d[a0 >> 5];
    x.db = xv.d[b0 >> 5];
    x.sa = xv.s[a0 >> 4];
    x.sb = xv.s[b0 >> 4];
    return x;
}

/* engine_cu_qdot_chunk's value (qdot.cuh) of an unpacked chunk against a vector's operands. */
template <int T> __device__ __forceinline__ float vq_val(const vq_u &u, const vq_x &x) {
    const int ia = engine_cu_dp4a4(u.lo, x.xa, 0), ib = engine_cu_dp4a4(u.hi, x.xb, 0);
    if (T == ENGINE_TYPE_Q4_K || T == ENGINE_TYPE_Q5_K)
        return u.d1 * (x.da * (float)ia) - u.m1 * x.sa + (u.d2 * (x.db * (float)ib) - u.m2 * x.sb);
    else if (T == ENGINE_TYPE_Q6_K || T == ENGINE_CU_TYPE_Q6_KR)
        return u.d1 * (x.da * (float)ia - 32.0f * x.sa) + u.d2 * (x.db * (float)ib - 32.0f * x.sb);
    else if (T == ENGINE_TYPE_Q8_0)
        return u.d * (x.da * (float)(ia + ib));
    else
        return u.d * (x.da * (float)(ia + ib) - 8.0f * (x.sa + x.sb));
}

/* Lane partial sums of R rows (row0, row0 + stride, ...; those from nvalid on compute on row0
 * and are not stored) against the m staged vectors over chunks c0, c0 + step, ...: per row and
 * vector the additions of mv_rows, in its order. */
template <int T, int R>
__device__ __forceinline__ void vmv_rows(const uint8_t *row0, size_t stride, int nvalid, int c0,
                                         int step, int n_chunks, const uint8_t *sm, size_t xs,
                                         int cols, int m, float acc[R][ENGINE_CU_VMAX]) {
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int t = 0; t < ENGINE_CU_VMAX; t++)
            acc[i][t] = 0.0f;
    for (int c = c0; c < n_chunks; c += step) {
        if constexpr (engine_cu_type_quant(T)) {
            /* the R rows' chunks unpacked, then each vector's operands read from shared memory
             * once for the R rows (read per row, the m vectors' reads bound the heads' time) */
            vq_u u[R];
#pragma unroll
            for (int i = 0; i < R; i++)
                vq_unpack<T>(row0 + (i < nvalid ? i : 0) * stride, c, cols, u[i]);
#pragma unroll
            for (int t = 0; t < ENGINE_CU_VMAX; t++) {
                if (t >= m) break;
                const vq_x x = vq_xload(sm, xs, cols, t, u[0].a0, u[0].b0);
#pragma unroll
                for (int i = 0; i < R; i++)
                    acc[i][t] += vq_val<T>(u[i], x);
            }
        } else {
#pragma unroll
            for (int i = 0; i < R; i++) {
                const uint8_t *row = row0 + (i < nvalid ? i : 0) * stride;
#pragma unroll
                for (int t = 0; t < ENGINE_CU_VMAX; t++)
                    if (t < m)
                        acc[i][t] += engine_cu_dot_chunk<T>(row, c, vmv_xv(sm, xs, cols, false, t));
            }
        }
    }
}

/* Ask L2 for the rows of group g that this warp (R > 0; R == 0: warp 0, the group's row) will
 * compute: before the wait, fetched while the previous kernel finishes. */
template <int R> __device__ __forceinline__ void vmv_prefetch_first(const engine_cu_mv &mv, int g) {
    constexpr bool SPLIT = R == 0;
    constexpr int NR = SPLIT ? 1 : R, PER = SPLIT ? 1 : ENGINE_CU_MV_WARPS * R;
    const int w = threadIdx.x >> 5;
    int first;
    const int mi = mv_find(mv, g, PER, &first);
    if (mi < 0) return;
    const size_t rb = mv.m[mi].row_bytes;
    const int r = (g - first) * PER + (SPLIT ? 0 : w);
#pragma unroll
    for (int i = 0; i < NR; i++)
        if (r + 8 * i < mv.m[mi].rows && (!SPLIT || w == 0))
            engine_cu_prefetch_l2(mv.m[mi].w + (size_t)(r + 8 * i) * rb, rb);
}

/* Row group g of the matrices of mv against the m vectors staged at sm (xs bytes apart; every
 * thread of the block calls it after the staging): R > 0: warp w's rows w, w + 8, .. (R of
 * them) of the group; R == 0 (split-K, one matrix of few rows): the group's row, warp w taking
 * chunks 32 w + lane step 256, the block summing the warps' parts in `part` (barriers inside).
 * Token t's results at mv.m[i].y + (t0 + t) * y_stride[i] (accumulated when the matrix says). */
template <int MODE, int R, bool Q6R = false>
__device__ __forceinline__ void vmv_group(const engine_cu_mv &mv, const size_t *y_stride, int g,
                                          const uint8_t *sm, size_t xs, int m, int t0,
                                          float (*part)[ENGINE_CU_MV_WARPS]) {
    constexpr bool SPLIT = R == 0;
    constexpr int NR = SPLIT ? 1 : R, PER = SPLIT ? 1 : ENGINE_CU_MV_WARPS * R;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, cols = mv.cols;
    const int n_chunks = cols >> 5;
    int first;
    const int mi = mv_find(mv, g, PER, &first);
    if (mi < 0) return; /* never: n_groups row groups in all */
    const engine_cu_mat &mt = mv.m[mi];
    const int r = (g - first) * PER + (SPLIT ? 0 : w);
    if (!SPLIT && r >= mt.rows) return; /* no barrier below when !SPLIT */
    const uint8_t *row = mt.w + (size_t)r * mt.row_bytes;
    /* rows past the end compute on row r and are not stored */
    const size_t stride = (size_t)8 * mt.row_bytes;
    const int nvalid = SPLIT ? 1 : min(NR, (mt.rows - r + 7) / 8);
    const int c0 = SPLIT ? 32 * w + lane : lane, step = SPLIT ? 32 * ENGINE_CU_MV_WARPS : 32;
    float acc[NR][ENGINE_CU_VMAX];
    if constexpr (Q6R) { /* the output head's repacked copy (matvec_dev.cuh mv_group) */
        static_assert(MODE == ENGINE_CU_X_Q8_K && !SPLIT, "the head's instance");
        vmv_rows<ENGINE_CU_TYPE_Q6_KR, NR>(row, stride, nvalid, c0, step, n_chunks, sm, xs, cols, m,
                                           acc);
    } else {
        switch (mt.type) {
#define VMV_CASE(T)                                                                                \
    case T:                                                                                        \
        if (MODE == engine_cu_x_mode(T))                                                           \
            vmv_rows<T, NR>(row, stride, nvalid, c0, step, n_chunks, sm, xs, cols, m, acc);        \
        break;
            ENGINE_CU_QUANT_CASES(VMV_CASE)
#undef VMV_CASE
#define VMV_CASE(T)                                                                                \
    case T:                                                                                        \
        if (MODE == ENGINE_CU_X_F32)                                                               \
            vmv_rows<T, NR>(row, stride, nvalid, c0, step, n_chunks, sm, xs, cols, m, acc);        \
        break;
            ENGINE_CU_FLOAT_CASES(VMV_CASE)
#undef VMV_CASE
        default:
            for (int i = 0; i < NR; i++)
                for (int t = 0; t < ENGINE_CU_VMAX; t++)
                    acc[i][t] = 0.0f;
        }
    }
    const size_t ys = y_stride[mi];
    if (!SPLIT) {
#pragma unroll
        for (int i = 0; i < NR; i++)
#pragma unroll
            for (int t = 0; t < ENGINE_CU_VMAX; t++) {
                if (t >= m) break;
                const float s = engine_cu_warp_sum(acc[i][t]);
                float *y = mt.y + (size_t)(t0 + t) * ys;
                const int ri = r + 8 * i;
                if (lane == 0 && ri < mt.rows) y[ri] = mt.accumulate ? y[ri] + s : s;
            }
    } else {
#pragma unroll
        for (int t = 0; t < ENGINE_CU_VMAX; t++) {
            if (t >= m) break;
            const float s = engine_cu_warp_sum(acc[0][t]);
            if (lane == 0) part[t][w] = s;
        }
        __syncthreads();
        if (threadIdx.x < m) {
            const int t = threadIdx.x;
            float tot = 0.0f;
            for (int k = 0; k < ENGINE_CU_MV_WARPS; k++)
                tot += part[t][k];
            float *y = mt.y + (size_t)(t0 + t) * ys;
            y[r] = mt.accumulate ? y[r] + tot : tot;
        }
        __syncthreads();
    }
}

#endif
