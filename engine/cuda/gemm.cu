/* Tensor-core matrix-matrix products (contract in gemm.cuh). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdlib.h>

#include "gemm.cuh"
#include "qdot.cuh"

extern "C" {
#include "cpu/quant.h"
#include "cuda/cuda_backend.h"
}

#define BM ENGINE_CU_GEMM_BM
#define BN ENGINE_CU_GEMM_BN
#define BK ENGINE_CU_GEMM_BK
#define GEMM_THREADS 128

int engine_cu_gemm_xform(int type) {
    switch (type) {
    case ENGINE_TYPE_Q4_K:
    case ENGINE_TYPE_Q5_K:
    case ENGINE_TYPE_Q6_K: return ENGINE_CU_GX_Q8_K;
    case ENGINE_TYPE_Q8_0:
    case ENGINE_TYPE_Q4_0: return ENGINE_CU_GX_Q8_0;
    case ENGINE_TYPE_F16: return ENGINE_CU_GX_F16;
    case ENGINE_TYPE_BF16: return ENGINE_CU_GX_BF16;
    case ENGINE_TYPE_F32: return ENGINE_CU_GX_F32;
    default: return -1;
    }
}

bool engine_cu_gemm_ok(int type, int cols) {
    const int f = engine_cu_gemm_xform(type);
    if (f < 0 || cols <= 0 || cols % 32) return false;
    if (f == ENGINE_CU_GX_Q8_K) return cols % 256 == 0;
    return true;
}

static size_t al256(size_t n) {
    return (n + 255) & ~(size_t)255;
}

size_t engine_cu_gemm_x_bytes(int form, int m, int cols) {
    const size_t n = (size_t)m * (size_t)cols;
    if (form == ENGINE_CU_GX_Q8_K || form == ENGINE_CU_GX_Q8_0)
        return al256(n) + al256(sizeof(float) * (n / 32)) + al256(sizeof(float) * (n / 16));
    return al256(n * (form == ENGINE_CU_GX_F32 ? 4 : 2));
}

/* ---------------------------------------------------------------------------------------------
 * Activation preparation: a block per row, staged in shared memory by the decode kernels' own
 * code (qdot.cuh), then written out.
 * ------------------------------------------------------------------------------------------- */
template <int MODE>
__global__ void __launch_bounds__(256)
    gemm_prep_kernel(int form, int cols, const float *x, const float *g, int ldx,
                     const float *norm_w, float eps, int8_t *q, float *d, float *s, void *v) {
    extern __shared__ __align__(16) uint8_t sm[];
    const int t = blockIdx.x;
    const float *src = x + (size_t)t * ldx;
    uint8_t *st = sm;
    if (g) { /* SwiGLU input: h = silu(g) * x, as engine_cpu_swiglu */
        float *h = (float *)sm;
        const float *gr = g + (size_t)t * ldx;
        for (int i = threadIdx.x; i < cols; i += blockDim.x) {
            const float a = gr[i];
            h[i] = a / (1.0f + expf(-a)) * src[i];
        }
        __syncthreads();
        src = h;
        st = sm + sizeof(float) * (size_t)cols;
        norm_w = nullptr;
    }
    engine_cu_stage_x<MODE>(src, cols, norm_w, eps, st);
    if (MODE != ENGINE_CU_X_F32) {
        const int4 *sq = (const int4 *)st;
        int4 *dq = (int4 *)(q + (size_t)t * cols);
        for (int i = threadIdx.x; i < cols / 16; i += blockDim.x)
            dq[i] = sq[i];
        const float *sd = (const float *)(st + cols), *ss = sd + cols / 32;
        for (int i = threadIdx.x; i < cols / 32; i += blockDim.x)
            d[(size_t)t * (cols / 32) + i] = sd[i];
        for (int i = threadIdx.x; i < cols / 16; i += blockDim.x)
            s[(size_t)t * (cols / 16) + i] = ss[i];
    } else {
        const float *sf = (const float *)st;
        if (form == ENGINE_CU_GX_F32) {
            float *o = (float *)v + (size_t)t * cols;
            for (int i = threadIdx.x; i < cols; i += blockDim.x)
                o[i] = sf[i];
        } else {
            uint16_t *o = (uint16_t *)v + (size_t)t * cols;
            const bool bf = form == ENGINE_CU_GX_BF16;
            for (int i = threadIdx.x; i < cols; i += blockDim.x)
                o[i] = bf ? __bfloat16_as_ushort(__float2bfloat16_rn(sf[i]))
                          : __half_as_ushort(__float2half_rn(sf[i]));
        }
    }
}

void engine_cu_gemm_prep(engine_cu_gx *gx, void *buf, int form, int m, int cols, const float *x,
                         const float *g, int ldx, const float *norm_w, float eps,
                         cudaStream_t stream) {
    const size_t n = (size_t)m * (size_t)cols;
    uint8_t *b = (uint8_t *)buf;
    gx->form = form;
    gx->cols = cols;
    gx->v = buf;
    gx->d = gx->s = nullptr;
    int8_t *q = nullptr;
    float *d = nullptr, *s = nullptr;
    const bool quant = form == ENGINE_CU_GX_Q8_K || form == ENGINE_CU_GX_Q8_0;
    if (quant) {
        q = (int8_t *)b;
        d = (float *)(b + al256(n));
        s = (float *)(b + al256(n) + al256(sizeof(float) * (n / 32)));
        gx->d = d;
        gx->s = s;
    }
    if (m <= 0) return;
    const size_t smem = (g ? sizeof(float) * (size_t)cols : 0) + engine_cu_xs_bytes(quant, cols);
    const dim3 grid((unsigned)m), block(256);
    if (form == ENGINE_CU_GX_Q8_K) {
        if (smem > 48 * 1024)
            cudaFuncSetAttribute(gemm_prep_kernel<ENGINE_CU_X_Q8_K>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        gemm_prep_kernel<ENGINE_CU_X_Q8_K><<<grid, block, smem, stream>>>(
            form, cols, x, g, ldx, norm_w, eps, q, d, s, buf);
    } else if (form == ENGINE_CU_GX_Q8_0) {
        if (smem > 48 * 1024)
            cudaFuncSetAttribute(gemm_prep_kernel<ENGINE_CU_X_Q8_0>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        gemm_prep_kernel<ENGINE_CU_X_Q8_0><<<grid, block, smem, stream>>>(
            form, cols, x, g, ldx, norm_w, eps, q, d, s, buf);
    } else {
        if (smem > 48 * 1024)
            cudaFuncSetAttribute(gemm_prep_kernel<ENGINE_CU_X_F32>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        gemm_prep_kernel<ENGINE_CU_X_F32><<<grid, block, smem, stream>>>(
            form, cols, x, g, ldx, norm_w, eps, q, d, s, buf);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Weight decoding into the tile: 16-value runs as int8 q with the run's value s * q + o.
 * ------------------------------------------------------------------------------------------- */
__device__ __forceinline__ void gemm_decode_q(int type, const uint8_t *row, int c, uint32_t qa[4],
                                              uint32_t qb[4], float *sa, float *oa, float *sb,
                                              float *ob) {
    switch (type) {
    case ENGINE_TYPE_Q4_K:
    case ENGINE_TYPE_Q5_K: {
        const bool q5 = type == ENGINE_TYPE_Q5_K;
        const uint8_t *b = row + (size_t)(c >> 3) * (q5 ? 176 : 144);
        const int q = c & 7, j = q >> 1, half = q & 1;
        const uint32_t dd = __ldg((const uint32_t *)b);
        const float d = engine_cu_h2f((uint16_t)(dd & 0xffffu)),
                    dmin = engine_cu_h2f((uint16_t)(dd >> 16));
        const uint32_t w0 = __ldg((const uint32_t *)(b + 4)), w1 = __ldg((const uint32_t *)(b + 8)),
                       w2 = __ldg((const uint32_t *)(b + 12));
        uint32_t qs[4];
        engine_cu_load16_a16(b + (q5 ? 48 : 16) + 32 * j + 16 * half, qs);
        int sc, m;
        engine_cu_scale_min_k4w(2 * j, w0, w1, w2, &sc, &m);
        *sa = d * (float)sc;
        *oa = -(dmin * (float)m);
        engine_cu_scale_min_k4w(2 * j + 1, w0, w1, w2, &sc, &m);
        *sb = d * (float)sc;
        *ob = -(dmin * (float)m);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            qa[i] = qs[i] & 0x0F0F0F0Fu;
            qb[i] = (qs[i] >> 4) & 0x0F0F0F0Fu;
        }
        if (q5) {
            uint32_t qh[4];
            engine_cu_load16_a16(b + 16 + 16 * half, qh);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                qa[i] |= ((qh[i] >> (2 * j)) & 0x01010101u) << 4;
                qb[i] |= ((qh[i] >> (2 * j + 1)) & 0x01010101u) << 4;
            }
        }
        break;
    }
    case ENGINE_TYPE_Q6_K: {
        const uint8_t *b = row + (size_t)(c >> 3) * 210;
        const int q = c & 7, hh = q >> 2, r = q & 3, w = r >> 1, l0 = 16 * (r & 1);
        const float d = engine_cu_h2f(__ldg((const uint16_t *)(b + 208)));
        uint32_t ql[4], qh[4];
        engine_cu_ldw_a2<4>(b + 64 * hh + 32 * w + l0, ql);
        engine_cu_ldw_a2<4>(b + 128 + 32 * hh + l0, qh);
        const int8_t *scp = (const int8_t *)(b + 192 + 8 * hh + (l0 >> 4));
        *sa = d * (float)__ldg(scp + 2 * w);
        *sb = d * (float)__ldg(scp + 4 + 2 * w);
        *oa = *ob = 0.0f;
        const int s1 = 2 * w, s2 = 4 + 2 * w;
#pragma unroll
        for (int i = 0; i < 4; i++) { /* q - 32 in [-32, 31]: bytewise, wrapping */
            qa[i] = __vsub4((ql[i] & 0x0F0F0F0Fu) | (((qh[i] >> s1) & 0x03030303u) << 4),
                            0x20202020u);
            qb[i] = __vsub4(((ql[i] >> 4) & 0x0F0F0F0Fu) | (((qh[i] >> s2) & 0x03030303u) << 4),
                            0x20202020u);
        }
        break;
    }
    case ENGINE_TYPE_Q8_0: {
        const uint8_t *b = row + (size_t)c * 34;
        const float d = engine_cu_h2f(__ldg((const uint16_t *)b));
        uint32_t v[8];
        engine_cu_ldw_a2<8>(b + 2, v);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            qa[i] = v[i];
            qb[i] = v[i + 4];
        }
        *sa = *sb = d;
        *oa = *ob = 0.0f;
        break;
    }
    default: { /* Q4_0: q - 8 */
        const uint8_t *b = row + (size_t)c * 18;
        const float d = engine_cu_h2f(__ldg((const uint16_t *)b));
        uint32_t v[4];
        engine_cu_ldw_a2<4>(b + 2, v);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            qa[i] = __vsub4(v[i] & 0x0F0F0F0Fu, 0x08080808u);
            qb[i] = __vsub4((v[i] >> 4) & 0x0F0F0F0Fu, 0x08080808u);
        }
        *sa = *sb = d;
        *oa = *ob = 0.0f;
        break;
    }
    }
}

__device__ __forceinline__ void mma_s8(int c[4], uint32_t a0, uint32_t a1, uint32_t b0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
                 "{%7,%7,%7,%7};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0), "r"(0));
#else
    c[0] = c[1] = c[2] = c[3] = 0;
#endif
}

__device__ __forceinline__ void mma_f16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1,
                                        bool bf) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (bf)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

/* The block's tile: matrix, first X row (dense: of X; grouped: of the sorted slots), rows. */
__device__ __forceinline__ bool gemm_tile(const engine_cu_gemm_args &a, int *mat, int *row0,
                                          int *nrow) {
    if (a.tiles) {
        const int j = (int)blockIdx.y;
        if (j >= *a.n_tiles) return false;
        *mat = a.tiles[3 * j];
        *row0 = a.tiles[3 * j + 1];
        *nrow = a.tiles[3 * j + 2];
    } else {
        *mat = 0;
        *row0 = (int)blockIdx.y * BM;
        *nrow = min(BM, a.m - *row0);
    }
    return *nrow > 0;
}

__device__ __forceinline__ void mma_s8_k32(int c[4], const uint32_t a[4], uint32_t b0,
                                           uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
#else
    c[0] = c[1] = c[2] = c[3] = 0;
#endif
}

/* Add one int8 product of a 16 x 8 fragment to the accumulators: element (token i, row r) +=
 * ws_r * xd_i * c + wo_r * xs_i, i = g (+8 for c[2], c[3]), r = 2 tig (+1 for c[1], c[3]). */
__device__ __forceinline__ void gemm_epilogue(float d[4], const int c[4], float ws0, float wo0,
                                              float ws1, float wo1, const float xd[2],
                                              const float xs[2]) {
    d[0] += ws0 * xd[0] * (float)c[0] + wo0 * xs[0];
    d[1] += ws1 * xd[0] * (float)c[1] + wo1 * xs[0];
    d[2] += ws0 * xd[1] * (float)c[2] + wo0 * xs[1];
    d[3] += ws1 * xd[1] * (float)c[3] + wo1 * xs[1];
}

/* The bytes chunk c of a row reads (its block), for the L2 prefetch of the next step. */
__device__ __forceinline__ const uint8_t *gemm_chunk_block(int type, const uint8_t *row, int c,
                                                           int *bytes) {
    switch (type) {
    case ENGINE_TYPE_Q4_K: *bytes = 144; return row + (size_t)(c >> 3) * 144;
    case ENGINE_TYPE_Q5_K: *bytes = 176; return row + (size_t)(c >> 3) * 176;
    case ENGINE_TYPE_Q6_K: *bytes = 210; return row + (size_t)(c >> 3) * 210;
    case ENGINE_TYPE_Q8_0: *bytes = 34; return row + (size_t)c * 34;
    case ENGINE_TYPE_Q4_0: *bytes = 18; return row + (size_t)c * 18;
    default: *bytes = 64; return row + (size_t)c * 64; /* F16, BF16 */
    }
}

/* MODE 0: int8 tensor cores in 16-column steps (Q6_K: a scale per 16 values); MODE 1: int8 in
 * 32-column steps (Q4_K, Q5_K, Q8_0, Q4_0: a scale and offset per 32 values, so one m16n8k32
 * product and one F32 epilogue per 32 columns); MODE 2: F16 / BF16 tensor cores. Shared rows
 * are padded to 144 / 272 bytes so that the fragment loads of a warp hit 32 different banks.
 * Each step prefetches the next step's X tile into registers and asks L2 for its weight
 * blocks before the products, so their latency overlaps the tensor-core work. */
template <int MODE>
__global__ void __launch_bounds__(GEMM_THREADS, 3) gemm_kernel(engine_cu_gemm_args a) {
    constexpr bool Q = MODE != 2;
    constexpr int SROW = Q ? BK + 16 : 2 * BK + 16, NR = MODE == 1 ? 4 : 8; /* scale runs */
    constexpr int XV = Q ? (BM * BK / 16) / GEMM_THREADS : (BM * BK / 8) / GEMM_THREADS;
    __shared__ __align__(16) uint8_t sA[BM * SROW];
    __shared__ __align__(16) uint8_t sB[BN * SROW];
    __shared__ float sWs[Q ? BN : 1][NR], sWo[Q ? BN : 1][NR], sXd[Q ? BM : 1][4],
        sXs[Q ? BM : 1][NR];
    __shared__ int sIdx[BM];
    int mat, row0, nrow;
    if (!gemm_tile(a, &mat, &row0, &nrow)) return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 1, wn = warp & 1, g = lane >> 2, tig = lane & 3;
    const int n0 = (int)blockIdx.x * BN;
    const uint8_t *W = a.w + (size_t)mat * a.mat_bytes;
    const int nch = a.cols / 32;
    const bool bf = a.type == ENGINE_TYPE_BF16;
    if (tid < BM) {
        const int i = row0 + tid;
        sIdx[tid] = tid < nrow ? (a.x_idx ? a.x_idx[i] : i) : -1;
    }
    __syncthreads();
    float acc[2][4][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[mi][ni][e] = 0.0f;

    /* this thread's X vectors of a step: rows and 16-byte parts */
    int4 xr[XV];
    auto load_x = [&](int k0) {
#pragma unroll
        for (int j = 0; j < XV; j++) {
            const int idx = tid + GEMM_THREADS * j;
            const int r = Q ? idx >> 3 : idx >> 4, part = Q ? idx & 7 : idx & 15;
            const int src = sIdx[r], col = k0 + (Q ? 16 : 8) * part;
            xr[j] = make_int4(0, 0, 0, 0);
            if (src >= 0 && col < a.cols)
                xr[j] = Q ? *(const int4 *)((const int8_t *)a.x.v + (size_t)src * a.cols + col)
                          : *(const int4 *)((const uint16_t *)a.x.v + (size_t)src * a.cols + col);
        }
    };
    load_x(0);
    for (int k0 = 0; k0 < a.cols; k0 += BK) {
#pragma unroll
        for (int j = 0; j < XV; j++) {
            const int idx = tid + GEMM_THREADS * j;
            const int r = Q ? idx >> 3 : idx >> 4, part = Q ? idx & 7 : idx & 15;
            *(int4 *)(sA + r * SROW + 16 * part) = xr[j];
        }
        if (Q)
            for (int idx = tid; idx < BM * 4; idx += GEMM_THREADS) {
                const int r = idx >> 2, e = idx & 3, src = sIdx[r], cd = k0 + 32 * e;
                const bool in = src >= 0 && cd < a.cols;
                const float *xs = in ? a.x.s + (size_t)src * (a.cols / 16) + cd / 16 : nullptr;
                sXd[r][e] = in ? a.x.d[(size_t)src * (a.cols / 32) + cd / 32] : 0.0f;
                if (MODE == 1) {
                    sXs[r][e] = in ? xs[0] + xs[1] : 0.0f;
                } else {
                    sXs[r][2 * e] = in ? xs[0] : 0.0f;
                    sXs[r][2 * e + 1] = in ? xs[1] : 0.0f;
                }
            }
        /* W tile: 4 chunks of 32 values per row cover the step's 128 columns (every layout) */
#pragma unroll
        for (int j = 0; j < (BN * 4) / GEMM_THREADS; j++) {
            const int cid = tid + GEMM_THREADS * j, r = cid >> 2, c = k0 / 32 + (cid & 3);
            const int grow = n0 + r;
            const bool in = grow < a.rows && c < nch;
            const uint8_t *row = W + (size_t)grow * a.row_bytes;
            int a0, b0;
            engine_cu_chunk_cols(a.type, c, &a0, &b0);
            a0 -= k0;
            b0 -= k0;
            if (Q) {
                uint32_t qa[4] = {0, 0, 0, 0}, qb[4] = {0, 0, 0, 0};
                float s1 = 0.0f, o1 = 0.0f, s2 = 0.0f, o2 = 0.0f;
                if (in) gemm_decode_q(a.type, row, c, qa, qb, &s1, &o1, &s2, &o2);
                *(uint4 *)(sB + r * SROW + a0) = make_uint4(qa[0], qa[1], qa[2], qa[3]);
                *(uint4 *)(sB + r * SROW + b0) = make_uint4(qb[0], qb[1], qb[2], qb[3]);
                /* MODE 1: both runs of a 32-column block carry its scale (written twice) */
                const int ra = MODE == 1 ? a0 >> 5 : a0 >> 4, rb = MODE == 1 ? b0 >> 5 : b0 >> 4;
                sWs[r][ra] = s1;
                sWo[r][ra] = o1;
                sWs[r][rb] = s2;
                sWo[r][rb] = o2;
            } else {
                const uint4 z = make_uint4(0, 0, 0, 0);
                const uint4 *p = (const uint4 *)(row + (size_t)c * 64);
                uint4 *dst = (uint4 *)(sB + r * SROW + 2 * a0);
#pragma unroll
                for (int k = 0; k < 4; k++)
                    dst[k] = in ? __ldg(p + k) : z;
            }
            if (in && c + 4 < nch) { /* the next step's block of this chunk */
                int nb;
                const uint8_t *nxt = gemm_chunk_block(a.type, row, c + 4, &nb);
                engine_cu_prefetch_rows(nxt, (size_t)nb);
            }
        }
        __syncthreads();
        if (k0 + BK < a.cols) load_x(k0 + BK);
        if (MODE == 1) {
#pragma unroll
            for (int ks = 0; ks < BK / 32; ks++) {
                const int kk = 32 * ks;
                uint32_t af[2][4], bfr[4][2];
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
                    const uint8_t *p = sA + (wm * 32 + mi * 16 + g) * SROW + kk + 4 * tig;
                    af[mi][0] = *(const uint32_t *)p;
                    af[mi][1] = *(const uint32_t *)(p + 8 * SROW);
                    af[mi][2] = *(const uint32_t *)(p + 16);
                    af[mi][3] = *(const uint32_t *)(p + 8 * SROW + 16);
                }
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    const uint8_t *p = sB + (wn * 32 + ni * 8 + g) * SROW + kk + 4 * tig;
                    bfr[ni][0] = *(const uint32_t *)p;
                    bfr[ni][1] = *(const uint32_t *)(p + 16);
                }
                float xd[2][2], xs[2][2];
#pragma unroll
                for (int mi = 0; mi < 2; mi++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int i = wm * 32 + mi * 16 + g + 8 * h;
                        xd[mi][h] = sXd[i][ks];
                        xs[mi][h] = sXs[i][ks];
                    }
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    const int r = wn * 32 + ni * 8 + 2 * tig;
                    const float ws0 = sWs[r][ks], wo0 = sWo[r][ks], ws1 = sWs[r + 1][ks],
                                wo1 = sWo[r + 1][ks];
#pragma unroll
                    for (int mi = 0; mi < 2; mi++) {
                        int c[4];
                        mma_s8_k32(c, af[mi], bfr[ni][0], bfr[ni][1]);
                        gemm_epilogue(acc[mi][ni], c, ws0, wo0, ws1, wo1, xd[mi], xs[mi]);
                    }
                }
            }
        } else {
#pragma unroll
            for (int ks = 0; ks < BK / 16; ks++) {
                const int kk = 16 * ks;
                if (MODE == 0) {
                    uint32_t af[2][2], bfr[4];
#pragma unroll
                    for (int mi = 0; mi < 2; mi++) {
                        const uint8_t *p = sA + (wm * 32 + mi * 16 + g) * SROW + kk + 4 * tig;
                        af[mi][0] = *(const uint32_t *)p;
                        af[mi][1] = *(const uint32_t *)(p + 8 * SROW);
                    }
#pragma unroll
                    for (int ni = 0; ni < 4; ni++)
                        bfr[ni] =
                            *(const uint32_t *)(sB + (wn * 32 + ni * 8 + g) * SROW + kk + 4 * tig);
                    float xd[2][2], xs[2][2];
#pragma unroll
                    for (int mi = 0; mi < 2; mi++)
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            const int i = wm * 32 + mi * 16 + g + 8 * h;
                            xd[mi][h] = sXd[i][ks >> 1];
                            xs[mi][h] = sXs[i][ks];
                        }
#pragma unroll
                    for (int ni = 0; ni < 4; ni++) {
                        const int r = wn * 32 + ni * 8 + 2 * tig;
                        const float ws0 = sWs[r][ks], wo0 = sWo[r][ks], ws1 = sWs[r + 1][ks],
                                    wo1 = sWo[r + 1][ks];
#pragma unroll
                        for (int mi = 0; mi < 2; mi++) {
                            int c[4];
                            mma_s8(c, af[mi][0], af[mi][1], bfr[ni]);
                            gemm_epilogue(acc[mi][ni], c, ws0, wo0, ws1, wo1, xd[mi], xs[mi]);
                        }
                    }
                } else {
                    uint32_t af[2][4];
#pragma unroll
                    for (int mi = 0; mi < 2; mi++) {
                        const uint8_t *p =
                            sA + (wm * 32 + mi * 16 + g) * SROW + 2 * (kk + 2 * tig);
                        af[mi][0] = *(const uint32_t *)p;
                        af[mi][1] = *(const uint32_t *)(p + 8 * SROW);
                        af[mi][2] = *(const uint32_t *)(p + 16);
                        af[mi][3] = *(const uint32_t *)(p + 8 * SROW + 16);
                    }
#pragma unroll
                    for (int ni = 0; ni < 4; ni++) {
                        const uint8_t *p = sB + (wn * 32 + ni * 8 + g) * SROW + 2 * (kk + 2 * tig);
                        const uint32_t b0 = *(const uint32_t *)p,
                                       b1 = *(const uint32_t *)(p + 16);
#pragma unroll
                        for (int mi = 0; mi < 2; mi++)
                            mma_f16(acc[mi][ni], af[mi], b0, b1, bf);
                    }
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int i = wm * 32 + mi * 16 + g + 8 * h;
            if (i >= nrow) continue;
            float *y = a.y + (size_t)(row0 + i) * a.ldy;
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int r = n0 + wn * 32 + ni * 8 + 2 * tig + e;
                    if (r >= a.rows) continue;
                    const float v = acc[mi][ni][2 * h + e];
                    y[r] = a.accumulate ? y[r] + v : v;
                }
        }
}

/* F32 weights (the router): SIMT, 64 x 64 tiles of 256 threads, 4 x 4 outputs each (X rows
 * strided by 16 so that a warp's loads spread over the banks), exact F32 products. */
__global__ void __launch_bounds__(256) gemm_f32_kernel(engine_cu_gemm_args a) {
    __shared__ float sX[BM][33], sW[BN][33];
    __shared__ int sIdx[BM];
    int mat, row0, nrow;
    if (!gemm_tile(a, &mat, &row0, &nrow)) return;
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int n0 = (int)blockIdx.x * BN;
    const float *W = (const float *)(a.w + (size_t)mat * a.mat_bytes);
    const float *X = (const float *)a.x.v;
    /* split z of ksplit: whole 32-column steps [kb, ke) */
    const int ks = a.ksplit > 1 ? a.ksplit : 1, steps = a.cols / 32, z = (int)blockIdx.z;
    const int kb = 32 * (int)((long)steps * z / ks), ke = 32 * (int)((long)steps * (z + 1) / ks);
    if (tid < BM) {
        const int i = row0 + tid;
        sIdx[tid] = tid < nrow ? (a.x_idx ? a.x_idx[i] : i) : -1;
    }
    __syncthreads();
    float acc[4][4] = {};
    for (int k0 = kb; k0 < ke; k0 += 32) {
        for (int idx = tid; idx < BM * 32; idx += 256) {
            const int r = idx >> 5, k = idx & 31, src = sIdx[r], grow = n0 + r;
            sX[r][k] = src >= 0 ? X[(size_t)src * a.cols + k0 + k] : 0.0f;
            sW[r][k] = grow < a.rows
                           ? __ldg((const float *)((const uint8_t *)W + (size_t)grow * a.row_bytes) +
                                   k0 + k)
                           : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < 32; k++) {
            float xv[4], wv[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                xv[u] = sX[ty + 16 * u][k];
                wv[u] = sW[tx + 16 * u][k];
            }
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int v = 0; v < 4; v++)
                    acc[u][v] = fmaf(xv[u], wv[v], acc[u][v]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int i = ty + 16 * u;
        if (i >= nrow) continue;
        float *y = a.y + ((size_t)z * a.m + (size_t)(row0 + i)) * a.ldy;
#pragma unroll
        for (int v = 0; v < 4; v++) {
            const int r = n0 + tx + 16 * v;
            if (r < a.rows) y[r] = a.accumulate ? y[r] + acc[u][v] : acc[u][v];
        }
    }
}

void engine_cu_gemm(const engine_cu_gemm_args *a, cudaStream_t stream) {
    const unsigned ny = a->tiles ? (unsigned)a->max_tiles : (unsigned)((a->m + BM - 1) / BM);
    if (ny == 0 || a->rows <= 0) return;
    const int form = engine_cu_gemm_xform(a->type);
    const unsigned nz = form == ENGINE_CU_GX_F32 && a->ksplit > 1 && !a->tiles ? a->ksplit : 1;
    const dim3 grid((unsigned)((a->rows + BN - 1) / BN), ny, nz);
    if (form == ENGINE_CU_GX_F32)
        gemm_f32_kernel<<<grid, 256, 0, stream>>>(*a);
    else if (form == ENGINE_CU_GX_F16 || form == ENGINE_CU_GX_BF16)
        gemm_kernel<2><<<grid, GEMM_THREADS, 0, stream>>>(*a);
    else if (a->type == ENGINE_TYPE_Q6_K)
        gemm_kernel<0><<<grid, GEMM_THREADS, 0, stream>>>(*a);
    else
        gemm_kernel<1><<<grid, GEMM_THREADS, 0, stream>>>(*a);
}

/* ---------------------------------------------------------------------------------------------
 * Test op (cuda_backend.h): allocates, copies, runs, copies back.
 * ------------------------------------------------------------------------------------------- */
extern "C" int engine_cuda_op_gemm(engine_type type, const void *w, int64_t rows, int64_t cols,
                                   size_t row_bytes, int m, const float *x, const float *norm_w,
                                   float eps, bool accumulate, float *y) {
    int rc = engine_cuda_usable();
    if (rc) return rc;
    if (!engine_cu_gemm_ok(type, (int)cols) || rows < 1 || rows > INT32_MAX || m < 1)
        return engine_err(ENGINE_EUNSUPPORTED, "cuda gemm: %s rows of %lld values, %lld x %d",
                          engine_type_name(type), (long long)cols, (long long)rows, m);
    const int form = engine_cu_gemm_xform(type);
    const size_t wb = (size_t)rows * row_bytes, xb = sizeof(float) * (size_t)m * (size_t)cols,
                 yb = sizeof(float) * (size_t)m * (size_t)rows,
                 gb = engine_cu_gemm_x_bytes(form, m, (int)cols);
    uint8_t *dw = NULL;
    float *dx = NULL, *dy = NULL, *dn = NULL;
    void *dg = NULL;
    engine_cu_gx gx;
    engine_cu_gemm_args a;
#define OPC(call)                                                                                  \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            rc = engine_err(ENGINE_EINTERNAL, "CUDA %s: %s", #call, cudaGetErrorString(e_));       \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)
    OPC(cudaMalloc((void **)&dw, wb));
    OPC(cudaMalloc((void **)&dx, xb));
    OPC(cudaMalloc((void **)&dy, yb));
    OPC(cudaMalloc(&dg, gb));
    OPC(cudaMemcpy(dw, w, wb, cudaMemcpyHostToDevice));
    OPC(cudaMemcpy(dx, x, xb, cudaMemcpyHostToDevice));
    OPC(cudaMemcpy(dy, y, yb, cudaMemcpyHostToDevice));
    if (norm_w) {
        OPC(cudaMalloc((void **)&dn, sizeof(float) * (size_t)cols));
        OPC(cudaMemcpy(dn, norm_w, sizeof(float) * (size_t)cols, cudaMemcpyHostToDevice));
    }
    engine_cu_gemm_prep(&gx, dg, form, m, (int)cols, dx, NULL, (int)cols, dn, eps, 0);
    memset(&a, 0, sizeof a);
    a.w = dw;
    a.row_bytes = row_bytes;
    a.mat_bytes = wb;
    a.type = type;
    a.rows = (int)rows;
    a.cols = (int)cols;
    a.x = gx;
    a.m = m;
    a.y = dy;
    a.ldy = (int)rows;
    a.accumulate = accumulate;
    engine_cu_gemm(&a, 0);
    OPC(cudaGetLastError());
    OPC(cudaMemcpy(y, dy, yb, cudaMemcpyDeviceToHost));
#undef OPC
done:
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(dn);
    cudaFree(dg);
    return rc;
}
