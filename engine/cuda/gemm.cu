/* Tensor-core matrix-matrix products (contract in gemm.cuh). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <type_traits>

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
/* Q4_K / Q5_K: the two runs of chunk q (0..7) of a superblock from its header words (d and
 * dmin, then the three scale words), the chunk's 16 qs bytes and (Q5_K) its 16 qh bytes. */
__device__ __forceinline__ void gemm_decode_k45(bool q5, int q, const uint32_t hdr[4],
                                                const uint32_t qs[4], const uint32_t qh[4],
                                                uint32_t qa[4], uint32_t qb[4], float *sa,
                                                float *oa, float *sb, float *ob) {
    const int j = q >> 1;
    const float d = engine_cu_h2f((uint16_t)(hdr[0] & 0xffffu)),
                dmin = engine_cu_h2f((uint16_t)(hdr[0] >> 16));
    int sc, m;
    engine_cu_scale_min_k4w(2 * j, hdr[1], hdr[2], hdr[3], &sc, &m);
    *sa = d * (float)sc;
    *oa = -(dmin * (float)m);
    engine_cu_scale_min_k4w(2 * j + 1, hdr[1], hdr[2], hdr[3], &sc, &m);
    *sb = d * (float)sc;
    *ob = -(dmin * (float)m);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        qa[i] = qs[i] & 0x0F0F0F0Fu;
        qb[i] = (qs[i] >> 4) & 0x0F0F0F0Fu;
    }
    if (q5)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            qa[i] |= ((qh[i] >> (2 * j)) & 0x01010101u) << 4;
            qb[i] |= ((qh[i] >> (2 * j + 1)) & 0x01010101u) << 4;
        }
}

__device__ __forceinline__ void gemm_decode_q(int type, const uint8_t *row, int c, uint32_t qa[4],
                                              uint32_t qb[4], float *sa, float *oa, float *sb,
                                              float *ob) {
    switch (type) {
    case ENGINE_TYPE_Q4_K:
    case ENGINE_TYPE_Q5_K: {
        const bool q5 = type == ENGINE_TYPE_Q5_K;
        const uint8_t *b = row + (size_t)(c >> 3) * (q5 ? 176 : 144);
        const int q = c & 7, j = q >> 1, half = q & 1;
        uint32_t hdr[4], qs[4], qh[4] = {0, 0, 0, 0};
        hdr[0] = __ldg((const uint32_t *)b);
        hdr[1] = __ldg((const uint32_t *)(b + 4));
        hdr[2] = __ldg((const uint32_t *)(b + 8));
        hdr[3] = __ldg((const uint32_t *)(b + 12));
        engine_cu_load16_a16(b + (q5 ? 48 : 16) + 32 * j + 16 * half, qs);
        if (q5) engine_cu_load16_a16(b + 16 + 16 * half, qh);
        gemm_decode_k45(q5, q, hdr, qs, qh, qa, qb, sa, oa, sb, ob);
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

/* The int8 products start from GEMM_MAGIC (the bits of the float 1.5 * 2^23) instead of 0: for
 * |sum| < 2^22 the int32 result is then the bit pattern of the float 1.5 * 2^23 + sum, and one
 * F32 subtraction gives the sum exactly, where an int-to-float conversion runs at a quarter of
 * the F32 rate. The sums stay below 2^20 (|q| <= 128, |xq| <= 127, 32 columns). The legacy
 * kernels (engine_cu_gemm_args.legacy) start from 0 and convert. */
#define GEMM_MAGIC 0x4B400000
#define GEMM_MAGIC_F 12582912.0f

__device__ __forceinline__ void mma_s8(int c[4], uint32_t a0, uint32_t a1, uint32_t b0, int c0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
                 "{%7,%7,%7,%7};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0), "r"(c0));
#else
    c[0] = c[1] = c[2] = c[3] = c0;
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

/* The block's tile: matrix, first X row (dense: of X; grouped: of the sorted slots), rows.
 * WM = 2: tiles of 64 X rows (grouped: one list entry per block); WM = 1: 32 rows (grouped:
 * two blocks per list entry of <= 64 rows, the second exits when the entry has <= 32). */
template <int WM>
__device__ __forceinline__ bool gemm_tile(const engine_cu_gemm_args &a, int *mat, int *row0,
                                          int *nrow) {
    if (a.tiles) {
        const int j = WM == 1 ? (int)blockIdx.y >> 1 : (int)blockIdx.y;
        if (j >= *a.n_tiles) return false;
        *mat = a.tiles[3 * j];
        *row0 = a.tiles[3 * j + 1];
        *nrow = a.tiles[3 * j + 2];
        if (WM == 1) {
            const int h = 32 * (int)(blockIdx.y & 1);
            *row0 += h;
            *nrow = min(32, *nrow - h);
        }
    } else {
        *mat = 0;
        *row0 = (int)blockIdx.y * 32 * WM;
        *nrow = min(32 * WM, a.m - *row0);
    }
    return *nrow > 0;
}

__device__ __forceinline__ void mma_s8_k32(int c[4], const uint32_t a[4], uint32_t b0,
                                           uint32_t b1, int c0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c0));
#else
    c[0] = c[1] = c[2] = c[3] = c0;
#endif
}

/* Add one int8 product of a 16 x 8 fragment to the accumulators: element (token i, row r) +=
 * ws_r * xd_i * c + wo_r * xs_i, i = g (+8 for c[2], c[3]), r = 2 tig (+1 for c[1], c[3]).
 * LEGACY: c from 0, converted; else c from GEMM_MAGIC, and OFF = false drops the offset term
 * (types without one: Q6_K, Q8_0, Q4_0). */
template <bool LEGACY, bool OFF>
__device__ __forceinline__ void gemm_epilogue(float d[4], const int c[4], float ws0, float wo0,
                                              float ws1, float wo1, const float xd[2],
                                              const float xs[2]) {
    if (LEGACY) {
        d[0] += ws0 * xd[0] * (float)c[0] + wo0 * xs[0];
        d[1] += ws1 * xd[0] * (float)c[1] + wo1 * xs[0];
        d[2] += ws0 * xd[1] * (float)c[2] + wo0 * xs[1];
        d[3] += ws1 * xd[1] * (float)c[3] + wo1 * xs[1];
        return;
    }
    const float f0 = __int_as_float(c[0]) - GEMM_MAGIC_F, f1 = __int_as_float(c[1]) - GEMM_MAGIC_F,
                f2 = __int_as_float(c[2]) - GEMM_MAGIC_F, f3 = __int_as_float(c[3]) - GEMM_MAGIC_F;
    if (OFF) {
        d[0] = fmaf(ws0 * xd[0], f0, fmaf(wo0, xs[0], d[0]));
        d[1] = fmaf(ws1 * xd[0], f1, fmaf(wo1, xs[0], d[1]));
        d[2] = fmaf(ws0 * xd[1], f2, fmaf(wo0, xs[1], d[2]));
        d[3] = fmaf(ws1 * xd[1], f3, fmaf(wo1, xs[1], d[3]));
    } else {
        d[0] = fmaf(ws0 * xd[0], f0, d[0]);
        d[1] = fmaf(ws1 * xd[0], f1, d[1]);
        d[2] = fmaf(ws0 * xd[1], f2, d[2]);
        d[3] = fmaf(ws1 * xd[1], f3, d[3]);
    }
}

/* 16 bytes global -> shared without registers (cp.async, sm_80+; both 16-byte aligned), its
 * group commit, and the wait for all but the newest group. */
#define GEMM_STAGE_ROW 112 /* staged bytes of a weight row and step: Q5_K 16 + 32 + 64 */
__device__ __forceinline__ void gemm_cp_async16(void *dst, const void *src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
#else
    *(uint4 *)dst = *(const uint4 *)src;
#endif
}
__device__ __forceinline__ void gemm_cp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
__device__ __forceinline__ void gemm_cp_wait1() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group 1;" ::: "memory");
#endif
}

/* Ask for the 128-byte lines of p[0, bytes) in L2, or in this multiprocessor's L1 as well. */
__device__ __forceinline__ void gemm_prefetch(const uint8_t *p, int bytes, int l1) {
    const uintptr_t end = (uintptr_t)p + (uintptr_t)bytes;
    for (uintptr_t o = (uintptr_t)p & ~(uintptr_t)127; o < end; o += 128) {
        if (l1)
            asm volatile("prefetch.global.L1 [%0];" ::"l"(o));
        else
            asm volatile("prefetch.global.L2 [%0];" ::"l"(o));
    }
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
 * 32-column steps (Q4_K, Q5_K: a scale and offset per 32 values, so one m16n8k32 product and
 * one F32 epilogue per 32 columns); MODE 3: as MODE 1 without offsets (Q8_0, Q4_0); MODE 2:
 * F16 / BF16 tensor cores. WM: 2 warps of 32 X rows (tiles of 64 X rows x 64 weight rows) or 1
 * (32 X rows x 128 weight rows); each warp computes 32 x 32. LEGACY: the first version (64 x
 * 64, converted sums, offsets for every type; MODE 3 runs as MODE 1). Shared rows are padded
 * to 144 / 272 bytes so that the fragment loads of a warp hit 32 different banks. Each step
 * prefetches the next step's X tile into registers and asks L2 for its weight blocks before
 * the products, so their latency overlaps the tensor-core work. */
template <int MODE, int WM, bool LEGACY, bool PIPE = false>
__global__ void __launch_bounds__(GEMM_THREADS, 3) gemm_kernel(engine_cu_gemm_args a) {
    static_assert(!PIPE || (MODE == 1 && !LEGACY), "the staged pipeline is for Q4_K / Q5_K");
    constexpr bool Q = MODE != 2, K32 = MODE == 1 || MODE == 3;
    constexpr bool OFF = LEGACY ? Q : MODE == 1;
    constexpr int TBM = 32 * WM, TBN = 128 / WM, WNN = 4 / WM;
    constexpr int SROW = Q ? BK + 16 : 2 * BK + 16, NR = K32 ? 4 : 8; /* scale runs */
    constexpr int XV = Q ? (TBM * BK / 16) / GEMM_THREADS : (TBM * BK / 8) / GEMM_THREADS;
    __shared__ __align__(16) uint8_t sA[TBM * SROW];
    __shared__ __align__(16) uint8_t sB[TBN * SROW];
    __shared__ float sWs[Q ? TBN : 1][NR], sWo[OFF ? TBN : 1][NR], sXd[Q ? TBM : 1][4],
        sXs[OFF ? TBM : 1][NR];
    __shared__ int sIdx[TBM];
    int mat, row0, nrow;
    if (!gemm_tile<WM>(a, &mat, &row0, &nrow)) return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WNN, wn = warp % WNN, g = lane >> 2, tig = lane & 3;
    /* the matrix of this column tile: w's tiles first, then those of each further part */
    const uint8_t *W = a.w + (size_t)mat * a.mat_bytes;
    float *Y = a.y;
    int rows = a.rows, ldy = a.ldy, bx = (int)blockIdx.x;
    for (int j = 0; j < a.n_more; j++) {
        const int nt = (rows + TBN - 1) / TBN;
        if (bx < nt) break;
        bx -= nt;
        W = a.more[j].w + (size_t)mat * a.mat_bytes;
        Y = a.more[j].y;
        rows = a.more[j].rows;
        ldy = a.more[j].ldy;
    }
    const int n0 = bx * TBN;
    const int nch = a.cols / 32;
    const bool bf = a.type == ENGINE_TYPE_BF16;
    const int c0 = LEGACY ? 0 : GEMM_MAGIC;
    if (tid < TBM) {
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

    /* this thread's X vectors of a step: rows and 16-byte parts; and (int8 forms, not LEGACY)
     * its X scales of the step: (row, 32-column block) pairs idx = tid + 128 j */
    constexpr int XS = Q && !LEGACY ? TBM * 4 / GEMM_THREADS : 1;
    int4 xr[XV];
    float xdr[XS], xsr[XS];
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
        if (Q && !LEGACY)
#pragma unroll
            for (int j = 0; j < XS; j++) {
                const int idx = tid + GEMM_THREADS * j, r = idx >> 2, cd = k0 + 32 * (idx & 3);
                const int src = sIdx[r];
                const bool in = src >= 0 && cd < a.cols;
                xdr[j] = in ? a.x.d[(size_t)src * (a.cols / 32) + cd / 32] : 0.0f;
                xsr[j] = 0.0f;
                if (OFF && in) { /* !LEGACY: only MODE 1 keeps offsets (per 32) */
                    const float *xs = a.x.s + (size_t)src * (a.cols / 16) + cd / 16;
                    xsr[j] = xs[0] + xs[1];
                }
            }
    };
    /* the W tile of step k0 for weights of type tc (int8 forms): a chunk outside the matrix
     * decodes row 0's chunk 0 (always there) and stores zeros; then the L2 (a.prefetch_l1: L1)
     * prefetch of the next step's blocks */
    auto wtile = [&](auto tc, int k0) {
        constexpr int T = decltype(tc)::value;
        constexpr int NJ = (TBN * 4) / GEMM_THREADS;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const int cid = tid + GEMM_THREADS * j, r = cid >> 2, c = k0 / 32 + (cid & 3);
            const int grow = n0 + r;
            const bool in = grow < rows && c < nch;
            const uint8_t *row = W + (size_t)(in ? grow : 0) * a.row_bytes;
            int a0, b0;
            engine_cu_chunk_cols(T, c, &a0, &b0);
            a0 -= k0;
            b0 -= k0;
            uint32_t qa[4], qb[4];
            float s1, o1, s2, o2;
            gemm_decode_q(T, row, in ? c : 0, qa, qb, &s1, &o1, &s2, &o2);
            const uint32_t mk = in ? 0xffffffffu : 0u;
            *(uint4 *)(sB + r * SROW + a0) =
                make_uint4(qa[0] & mk, qa[1] & mk, qa[2] & mk, qa[3] & mk);
            *(uint4 *)(sB + r * SROW + b0) =
                make_uint4(qb[0] & mk, qb[1] & mk, qb[2] & mk, qb[3] & mk);
            /* K32: both runs of a 32-column block carry its scale (written twice) */
            const int ra = K32 ? a0 >> 5 : a0 >> 4, rb = K32 ? b0 >> 5 : b0 >> 4;
            sWs[r][ra] = in ? s1 : 0.0f;
            sWs[r][rb] = in ? s2 : 0.0f;
            if (OFF) {
                sWo[r][ra] = in ? o1 : 0.0f;
                sWo[r][rb] = in ? o2 : 0.0f;
            }
        }
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const int cid = tid + GEMM_THREADS * j, r = cid >> 2, c = k0 / 32 + (cid & 3);
            const int grow = n0 + r;
            if (grow < rows && c + 4 < nch) { /* the next step's block of this chunk */
                int nb;
                const uint8_t *nxt =
                    gemm_chunk_block(T, W + (size_t)grow * a.row_bytes, c + 4, &nb);
                gemm_prefetch(nxt, nb, a.prefetch_l1);
            }
        }
    };
    /* PIPE (Q4_K / Q5_K): the raw bytes a step needs of each weight row (the superblock's
     * 16-byte header, Q5_K its 32 qh bytes, the 64 qs bytes of the step's half) are copied
     * into one of two staging buffers (dynamic shared memory, GEMM_STAGE_ROW bytes a row) with
     * cp.async one step ahead, and the step decodes from there: the weight loads of step k+1
     * fly during the products of step k. Rows past the matrix are staged as zeros. */
    extern __shared__ __align__(16) uint8_t gemm_stage[];
    auto stage = [&](int k0, int buf) {
        if constexpr (PIPE) {
            const bool q5 = a.type == ENGINE_TYPE_Q5_K;
            const int nc = q5 ? 7 : 5, h = (k0 >> 7) & 1, bb = q5 ? 176 : 144, qso = q5 ? 48 : 16;
            uint8_t *st = gemm_stage + (size_t)buf * TBN * GEMM_STAGE_ROW;
            for (int idx = tid; idx < TBN * nc; idx += GEMM_THREADS) {
                const int r = idx / nc, pc = idx - r * nc, grow = n0 + r;
                /* piece pc: 0 the header, then (Q5_K) the two qh pieces, then four qs pieces */
                const int e = pc - (q5 ? 3 : 1);
                const int so = pc == 0 ? 0 : e < 0 ? 16 * pc : qso + 64 * h + 16 * e;
                const int dof = pc == 0 ? 0 : e < 0 ? 16 * pc : qso + 16 * e;
                uint8_t *dst = st + r * GEMM_STAGE_ROW + dof;
                const uint8_t *blk = W + (size_t)grow * a.row_bytes + (size_t)(k0 >> 8) * bb;
                if (grow < rows)
                    gemm_cp_async16(dst, blk + so);
                else
                    *(uint4 *)dst = make_uint4(0, 0, 0, 0);
            }
            gemm_cp_commit();
        }
    };
    /* the W tile of step k0 from staging buffer buf (as wtile; the type is Q4_K or Q5_K) */
    auto wtile_staged = [&](int k0, int buf) {
        if constexpr (PIPE) {
            constexpr int NJ = (TBN * 4) / GEMM_THREADS;
            const bool q5 = a.type == ENGINE_TYPE_Q5_K;
            const int h = (k0 >> 7) & 1;
            const uint8_t *st = gemm_stage + (size_t)buf * TBN * GEMM_STAGE_ROW;
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                const int cid = tid + GEMM_THREADS * j, r = cid >> 2, c = k0 / 32 + (cid & 3);
                const bool in = n0 + r < rows && c < nch;
                const uint8_t *sr = st + r * GEMM_STAGE_ROW;
                const int q = c & 7, jj = q >> 1, half = q & 1;
                uint32_t hdr[4], qs[4], qh[4] = {0, 0, 0, 0};
                const int qo = (q5 ? 48 : 16) + 32 * (jj - 2 * h) + 16 * half;
                const uint4 hv = *(const uint4 *)sr, sv = *(const uint4 *)(sr + qo);
                hdr[0] = hv.x, hdr[1] = hv.y, hdr[2] = hv.z, hdr[3] = hv.w;
                qs[0] = sv.x, qs[1] = sv.y, qs[2] = sv.z, qs[3] = sv.w;
                if (q5) {
                    const uint4 bv = *(const uint4 *)(sr + 16 + 16 * half);
                    qh[0] = bv.x, qh[1] = bv.y, qh[2] = bv.z, qh[3] = bv.w;
                }
                uint32_t qa[4], qb[4];
                float s1, o1, s2, o2;
                gemm_decode_k45(q5, q, hdr, qs, qh, qa, qb, &s1, &o1, &s2, &o2);
                int a0, b0;
                engine_cu_chunk_cols(ENGINE_TYPE_Q4_K, c, &a0, &b0); /* Q5_K: the same columns */
                a0 -= k0;
                b0 -= k0;
                const uint32_t mk = in ? 0xffffffffu : 0u;
                *(uint4 *)(sB + r * SROW + a0) =
                    make_uint4(qa[0] & mk, qa[1] & mk, qa[2] & mk, qa[3] & mk);
                *(uint4 *)(sB + r * SROW + b0) =
                    make_uint4(qb[0] & mk, qb[1] & mk, qb[2] & mk, qb[3] & mk);
                sWs[r][a0 >> 5] = in ? s1 : 0.0f;
                sWs[r][b0 >> 5] = in ? s2 : 0.0f;
                sWo[r][a0 >> 5] = in ? o1 : 0.0f;
                sWo[r][b0 >> 5] = in ? o2 : 0.0f;
            }
        }
    };
    load_x(0);
    if constexpr (PIPE) stage(0, 0);
    for (int k0 = 0; k0 < a.cols; k0 += BK) {
        const int buf = (k0 / BK) & 1;
        if constexpr (PIPE) { /* the next step's bytes (an empty group at the last step) */
            if (k0 + BK < a.cols)
                stage(k0 + BK, buf ^ 1);
            else
                gemm_cp_commit();
        }
#pragma unroll
        for (int j = 0; j < XV; j++) {
            const int idx = tid + GEMM_THREADS * j;
            const int r = Q ? idx >> 3 : idx >> 4, part = Q ? idx & 7 : idx & 15;
            *(int4 *)(sA + r * SROW + 16 * part) = xr[j];
        }
        if (Q && !LEGACY)
#pragma unroll
            for (int j = 0; j < XS; j++) {
                const int idx = tid + GEMM_THREADS * j;
                sXd[idx >> 2][idx & 3] = xdr[j];
                if (OFF) sXs[idx >> 2][idx & 3] = xsr[j];
            }
        if (Q && LEGACY)
            for (int idx = tid; idx < TBM * 4; idx += GEMM_THREADS) {
                const int r = idx >> 2, e = idx & 3, src = sIdx[r], cd = k0 + 32 * e;
                const bool in = src >= 0 && cd < a.cols;
                sXd[r][e] = in ? a.x.d[(size_t)src * (a.cols / 32) + cd / 32] : 0.0f;
                if (OFF) {
                    const float *xs = in ? a.x.s + (size_t)src * (a.cols / 16) + cd / 16 : nullptr;
                    if (K32) {
                        sXs[r][e] = in ? xs[0] + xs[1] : 0.0f;
                    } else {
                        sXs[r][2 * e] = in ? xs[0] : 0.0f;
                        sXs[r][2 * e + 1] = in ? xs[1] : 0.0f;
                    }
                }
            }
        /* W tile: 4 chunks of 32 values per row cover the step's 128 columns (every layout).
         * The int8 forms (not LEGACY) decode with the type fixed at compile time and without
         * branches, so that the loads of all of a thread's chunks are in flight together. */
        if constexpr (PIPE) {
            gemm_cp_wait1(); /* this thread's copies of step k0 have landed */
            __syncthreads(); /* and everyone's */
            wtile_staged(k0, buf);
        } else if constexpr (Q && !LEGACY) {
            if constexpr (MODE == 0) {
                wtile(std::integral_constant<int, ENGINE_TYPE_Q6_K>(), k0);
            } else if constexpr (MODE == 1) {
                if (a.type == ENGINE_TYPE_Q4_K)
                    wtile(std::integral_constant<int, ENGINE_TYPE_Q4_K>(), k0);
                else
                    wtile(std::integral_constant<int, ENGINE_TYPE_Q5_K>(), k0);
            } else {
                if (a.type == ENGINE_TYPE_Q8_0)
                    wtile(std::integral_constant<int, ENGINE_TYPE_Q8_0>(), k0);
                else
                    wtile(std::integral_constant<int, ENGINE_TYPE_Q4_0>(), k0);
            }
        }
#pragma unroll
        for (int j = 0; j < (Q && !LEGACY ? 0 : (TBN * 4) / GEMM_THREADS); j++) {
            const int cid = tid + GEMM_THREADS * j, r = cid >> 2, c = k0 / 32 + (cid & 3);
            const int grow = n0 + r;
            const bool in = grow < rows && c < nch;
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
                /* K32: both runs of a 32-column block carry its scale (written twice) */
                const int ra = K32 ? a0 >> 5 : a0 >> 4, rb = K32 ? b0 >> 5 : b0 >> 4;
                sWs[r][ra] = s1;
                sWs[r][rb] = s2;
                if (OFF) {
                    sWo[r][ra] = o1;
                    sWo[r][rb] = o2;
                }
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
        if (K32) {
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
                        xs[mi][h] = OFF ? sXs[i][ks] : 0.0f;
                    }
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    const int r = wn * 32 + ni * 8 + 2 * tig;
                    const float ws0 = sWs[r][ks], ws1 = sWs[r + 1][ks];
                    const float wo0 = OFF ? sWo[r][ks] : 0.0f, wo1 = OFF ? sWo[r + 1][ks] : 0.0f;
#pragma unroll
                    for (int mi = 0; mi < 2; mi++) {
                        int c[4];
                        mma_s8_k32(c, af[mi], bfr[ni][0], bfr[ni][1], c0);
                        gemm_epilogue<LEGACY, OFF>(acc[mi][ni], c, ws0, wo0, ws1, wo1, xd[mi],
                                                   xs[mi]);
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
                            xs[mi][h] = OFF ? sXs[i][ks] : 0.0f;
                        }
#pragma unroll
                    for (int ni = 0; ni < 4; ni++) {
                        const int r = wn * 32 + ni * 8 + 2 * tig;
                        const float ws0 = sWs[r][ks], ws1 = sWs[r + 1][ks];
                        const float wo0 = OFF ? sWo[r][ks] : 0.0f,
                                    wo1 = OFF ? sWo[r + 1][ks] : 0.0f;
#pragma unroll
                        for (int mi = 0; mi < 2; mi++) {
                            int c[4];
                            mma_s8(c, af[mi][0], af[mi][1], bfr[ni], c0);
                            gemm_epilogue<LEGACY, OFF>(acc[mi][ni], c, ws0, wo0, ws1, wo1,
                                                       xd[mi], xs[mi]);
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
            float *y = Y + (size_t)(row0 + i) * ldy;
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int r = n0 + wn * 32 + ni * 8 + 2 * tig + e;
                    if (r >= rows) continue;
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
    if (!gemm_tile<2>(a, &mat, &row0, &nrow)) return;
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

template <int WM, bool LEGACY>
static void gemm_launch(int mode, dim3 grid, const engine_cu_gemm_args *a, cudaStream_t st) {
    switch (mode) {
    case 0: gemm_kernel<0, WM, LEGACY><<<grid, GEMM_THREADS, 0, st>>>(*a); break;
    case 1: gemm_kernel<1, WM, LEGACY><<<grid, GEMM_THREADS, 0, st>>>(*a); break;
    case 2: gemm_kernel<2, WM, false><<<grid, GEMM_THREADS, 0, st>>>(*a); break; /* no int sums */
    default: gemm_kernel<LEGACY ? 1 : 3, WM, LEGACY><<<grid, GEMM_THREADS, 0, st>>>(*a); break;
    }
}

/* The staged (cp.async) kernels: Q4_K / Q5_K, two staging buffers of dynamic shared memory. */
template <int WM> static void gemm_launch_pipe(dim3 grid, const engine_cu_gemm_args *a,
                                               cudaStream_t st) {
    const size_t dyn = (size_t)2 * (128 / WM) * GEMM_STAGE_ROW;
    cudaFuncSetAttribute(gemm_kernel<1, WM, false, true>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn);
    gemm_kernel<1, WM, false, true><<<grid, GEMM_THREADS, dyn, st>>>(*a);
}

void engine_cu_gemm(const engine_cu_gemm_args *a, cudaStream_t stream) {
    if (a->rows <= 0) return;
    const int form = engine_cu_gemm_xform(a->type);
    if (form == ENGINE_CU_GX_F32 && a->n_more > 0) { /* one launch per part */
        engine_cu_gemm_args b = *a;
        b.n_more = 0;
        engine_cu_gemm(&b, stream);
        for (int j = 0; j < a->n_more; j++) {
            b.w = a->more[j].w;
            b.y = a->more[j].y;
            b.rows = a->more[j].rows;
            b.ldy = a->more[j].ldy;
            engine_cu_gemm(&b, stream);
        }
        return;
    }
    if (form == ENGINE_CU_GX_F32) {
        const unsigned ny = a->tiles ? (unsigned)a->max_tiles : (unsigned)((a->m + BM - 1) / BM);
        const unsigned nz = a->ksplit > 1 && !a->tiles ? (unsigned)a->ksplit : 1u;
        if (ny == 0) return;
        const dim3 grid((unsigned)((a->rows + BN - 1) / BN), ny, nz);
        gemm_f32_kernel<<<grid, 256, 0, stream>>>(*a);
        return;
    }
    const int mode = form == ENGINE_CU_GX_F16 || form == ENGINE_CU_GX_BF16 ? 2
                     : a->type == ENGINE_TYPE_Q6_K                         ? 0
                     : a->type == ENGINE_TYPE_Q4_K || a->type == ENGINE_TYPE_Q5_K ? 1
                                                                                   : 3;
    const int tr = a->legacy ? 64 : a->tile_rows ? a->tile_rows : a->tiles ? 32 : 64;
    const int wm = tr == 32 ? 1 : 2, tbm = 32 * wm, tbn = 128 / wm;
    const unsigned ny = a->tiles ? (unsigned)a->max_tiles * (wm == 1 ? 2u : 1u)
                                 : (unsigned)((a->m + tbm - 1) / tbm);
    unsigned nx = (unsigned)((a->rows + tbn - 1) / tbn);
    for (int j = 0; j < a->n_more; j++)
        nx += (unsigned)((a->more[j].rows + tbn - 1) / tbn);
    if (ny == 0) return;
    const dim3 grid(nx, ny);
    if (a->pipeline && !a->legacy && mode == 1) {
        if (wm == 1)
            gemm_launch_pipe<1>(grid, a, stream);
        else
            gemm_launch_pipe<2>(grid, a, stream);
        return;
    }
    if (a->legacy)
        gemm_launch<2, true>(mode, grid, a, stream);
    else if (wm == 1)
        gemm_launch<1, false>(mode, grid, a, stream);
    else
        gemm_launch<2, false>(mode, grid, a, stream);
}

/* ---------------------------------------------------------------------------------------------
 * Test op (cuda_backend.h): allocates, copies, runs, copies back. SPARK_CUDA_GEMM_OP picks the
 * kernel variant, words separated by anything: "legacy" (the first kernels), "tile32" /
 * "tile64" (X rows per tile), "grouped" (grouped mode: the rows cut into groups of 1 to 70
 * rows, tile list entries of <= 64, alternate entries on a second copy of W, each slot reading
 * X row m-1-i; the result is put back in row order; three list entries past the count),
 * "fused" (the rows cut into three matrices at 5/8 and 7/8 of one launch: .more), "pfl1"
 * (the L1 prefetch), "pipe" (the staged cp.async kernels for Q4_K / Q5_K).
 * ------------------------------------------------------------------------------------------- */
extern "C" int engine_cuda_op_gemm(engine_type type, const void *w, int64_t rows, int64_t cols,
                                   size_t row_bytes, int m, const float *x, const float *norm_w,
                                   float eps, bool accumulate, float *y) {
    int rc = engine_cuda_usable();
    if (rc) return rc;
    if (!engine_cu_gemm_ok(type, (int)cols) || rows < 1 || rows > INT32_MAX || m < 1)
        return engine_err(ENGINE_EUNSUPPORTED, "cuda gemm: %s rows of %lld values, %lld x %d",
                          engine_type_name(type), (long long)cols, (long long)rows, m);
    const char *var = getenv("SPARK_CUDA_GEMM_OP");
    const bool grouped = var && strstr(var, "grouped"), legacy = var && strstr(var, "legacy");
    const int tile_rows = var && strstr(var, "tile32") ? 32 : var && strstr(var, "tile64") ? 64 : 0;
    const bool fused = var && strstr(var, "fused");
    const int form = engine_cu_gemm_xform(type);
    const size_t wb = (size_t)rows * row_bytes, xb = sizeof(float) * (size_t)m * (size_t)cols,
                 yb = sizeof(float) * (size_t)m * (size_t)rows,
                 gb = engine_cu_gemm_x_bytes(form, m, (int)cols);
    const size_t yr = (size_t)rows;
    uint8_t *dw = NULL;
    float *dx = NULL, *dy = NULL, *dn = NULL, *hy = NULL;
    int32_t *dt = NULL, *ht = NULL;
    void *dg = NULL;
    int nt = 0, max_tiles = 0;
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
    hy = (float *)malloc(yb);
    /* tile list: 3 ints per entry, then the count, then x_idx[m] */
    max_tiles = m + 3;
    ht = (int32_t *)malloc(sizeof(int32_t) * (size_t)(3 * max_tiles + 1 + m));
    if (!hy || !ht) {
        rc = engine_err(ENGINE_ENOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < m; i++) /* grouped: slot i holds X row m-1-i and its y row */
        memcpy(hy + (size_t)i * yr, y + (size_t)(grouped ? m - 1 - i : i) * yr, sizeof(float) * yr);
    if (grouped) {
        static const int sizes[] = {1, 7, 32, 33, 64, 65, 5, 40, 70, 2};
        int r = 0;
        for (int gi = 0; r < m; gi++) {
            const int gn = std::min(sizes[gi % 10], m - r);
            for (int o = 0; o < gn; o += ENGINE_CU_GEMM_BM, nt++) {
                ht[3 * nt] = nt & 1;
                ht[3 * nt + 1] = r + o;
                ht[3 * nt + 2] = std::min(ENGINE_CU_GEMM_BM, gn - o);
            }
            r += gn;
        }
        for (int j = nt; j < max_tiles; j++) { /* past the count: must not run */
            ht[3 * j] = 0;
            ht[3 * j + 1] = 0;
            ht[3 * j + 2] = 64;
        }
        ht[3 * max_tiles] = nt;
        for (int i = 0; i < m; i++)
            ht[3 * max_tiles + 1 + i] = m - 1 - i;
        OPC(cudaMalloc((void **)&dt, sizeof(int32_t) * (size_t)(3 * max_tiles + 1 + m)));
        OPC(cudaMemcpy(dt, ht, sizeof(int32_t) * (size_t)(3 * max_tiles + 1 + m),
                       cudaMemcpyHostToDevice));
    }
    OPC(cudaMalloc((void **)&dw, 2 * wb));
    OPC(cudaMalloc((void **)&dx, xb));
    OPC(cudaMalloc((void **)&dy, yb));
    OPC(cudaMalloc(&dg, gb));
    OPC(cudaMemcpy(dw, w, wb, cudaMemcpyHostToDevice));
    OPC(cudaMemcpy(dw + wb, w, wb, cudaMemcpyHostToDevice));
    OPC(cudaMemcpy(dx, x, xb, cudaMemcpyHostToDevice));
    OPC(cudaMemcpy(dy, hy, yb, cudaMemcpyHostToDevice));
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
    a.tile_rows = tile_rows;
    a.legacy = legacy;
    a.prefetch_l1 = var && strstr(var, "pfl1");
    a.pipeline = var && strstr(var, "pipe");
    if (fused) {
        const int r1 = (int)(rows * 5 / 8), r2 = (int)(rows * 7 / 8);
        a.rows = r1;
        a.n_more = 2;
        a.more[0].w = dw + (size_t)r1 * row_bytes;
        a.more[0].y = dy + r1;
        a.more[0].rows = r2 - r1;
        a.more[0].ldy = (int)rows;
        a.more[1].w = dw + (size_t)r2 * row_bytes;
        a.more[1].y = dy + r2;
        a.more[1].rows = (int)rows - r2;
        a.more[1].ldy = (int)rows;
    }
    if (grouped) {
        a.tiles = dt;
        a.n_tiles = dt + 3 * max_tiles;
        a.x_idx = dt + 3 * max_tiles + 1;
        a.max_tiles = max_tiles;
    }
    engine_cu_gemm(&a, 0);
    OPC(cudaGetLastError());
    OPC(cudaMemcpy(hy, dy, yb, cudaMemcpyDeviceToHost));
    for (int i = 0; i < m; i++)
        memcpy(y + (size_t)(grouped ? m - 1 - i : i) * yr, hy + (size_t)i * yr, sizeof(float) * yr);
#undef OPC
done:
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(dn);
    cudaFree(dg);
    cudaFree(dt);
    free(hy);
    free(ht);
    return rc;
}
