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
        return al256(n) + al256(sizeof(float) * (n / 32)) + al256(sizeof(float) * (n / 16)) +
               (form == ENGINE_CU_GX_Q8_K ? al256(sizeof(uint32_t) * (n / 32)) : 0);
    return al256(n * (form == ENGINE_CU_GX_F32 ? 4 : 2));
}

/* ---------------------------------------------------------------------------------------------
 * Activation preparation: a block per row, staged in shared memory by the decode kernels' own
 * code (qdot.cuh), then written out.
 * ------------------------------------------------------------------------------------------- */
template <int MODE>
__global__ void __launch_bounds__(256)
    gemm_prep_kernel(int form, int cols, const float *x, const float *g, int ldx,
                     const float *norm_w, float eps, int8_t *q, float *d, float *s, uint32_t *b,
                     void *v) {
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
        if (MODE == ENGINE_CU_X_Q8_K) /* each 32-value run's int sum as F16 lo, hi (gemm.cuh) */
            for (int i = threadIdx.x; i < cols / 32; i += blockDim.x) {
                const int4 u = sq[2 * i], w = sq[2 * i + 1];
                int sum = 0;
                sum = __dp4a(u.x, 0x01010101, sum);
                sum = __dp4a(u.y, 0x01010101, sum);
                sum = __dp4a(u.z, 0x01010101, sum);
                sum = __dp4a(u.w, 0x01010101, sum);
                sum = __dp4a(w.x, 0x01010101, sum);
                sum = __dp4a(w.y, 0x01010101, sum);
                sum = __dp4a(w.z, 0x01010101, sum);
                sum = __dp4a(w.w, 0x01010101, sum);
                const uint32_t lo = __half_as_ushort(__int2half_rn(sum & 63)),
                               hi = __half_as_ushort(__int2half_rn(sum >> 6));
                b[(size_t)t * (cols / 32) + i] = lo | hi << 16;
            }
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
    gx->b = nullptr;
    int8_t *q = nullptr;
    float *d = nullptr, *s = nullptr;
    uint32_t *sb = nullptr;
    const bool quant = form == ENGINE_CU_GX_Q8_K || form == ENGINE_CU_GX_Q8_0;
    if (quant) {
        q = (int8_t *)b;
        d = (float *)(b + al256(n));
        s = (float *)(b + al256(n) + al256(sizeof(float) * (n / 32)));
        gx->d = d;
        gx->s = s;
    }
    if (form == ENGINE_CU_GX_Q8_K) {
        sb = (uint32_t *)(b + al256(n) + al256(sizeof(float) * (n / 32)) +
                          al256(sizeof(float) * (n / 16)));
        gx->b = sb;
    }
    if (m <= 0) return;
    const size_t smem = (g ? sizeof(float) * (size_t)cols : 0) + engine_cu_xs_bytes(quant, cols);
    const dim3 grid((unsigned)m), block(256);
    if (form == ENGINE_CU_GX_Q8_K) {
        if (smem > 48 * 1024)
            cudaFuncSetAttribute(gemm_prep_kernel<ENGINE_CU_X_Q8_K>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        gemm_prep_kernel<ENGINE_CU_X_Q8_K>
            <<<grid, block, smem, stream>>>(form, cols, x, g, ldx, norm_w, eps, q, d, s, sb, buf);
    } else if (form == ENGINE_CU_GX_Q8_0) {
        if (smem > 48 * 1024)
            cudaFuncSetAttribute(gemm_prep_kernel<ENGINE_CU_X_Q8_0>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        gemm_prep_kernel<ENGINE_CU_X_Q8_0>
            <<<grid, block, smem, stream>>>(form, cols, x, g, ldx, norm_w, eps, q, d, s, sb, buf);
    } else {
        if (smem > 48 * 1024)
            cudaFuncSetAttribute(gemm_prep_kernel<ENGINE_CU_X_F32>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        gemm_prep_kernel<ENGINE_CU_X_F32>
            <<<grid, block, smem, stream>>>(form, cols, x, g, ldx, norm_w, eps, q, d, s, sb, buf);
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
    int sc[2], m[2];
    engine_cu_scale_min_k4w2(j, hdr[1], hdr[2], hdr[3], sc, m);
    *sa = d * (float)sc[0];
    *oa = -(dmin * (float)m[0]);
    *sb = d * (float)sc[1];
    *ob = -(dmin * (float)m[1]);
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

/* Q6_K: the two runs of a chunk from its 16 ql bytes and 16 qh bytes (w: its 32-value group
 * in the half); q - 32 in [-32, 31], bytewise, wrapping. */
__device__ __forceinline__ void gemm_bits_q6(int w, const uint32_t ql[4], const uint32_t qh[4],
                                             uint32_t qa[4], uint32_t qb[4]) {
    const int s1 = 2 * w, s2 = 4 + 2 * w;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        qa[i] = __vsub4((ql[i] & 0x0F0F0F0Fu) | (((qh[i] >> s1) & 0x03030303u) << 4), 0x20202020u);
        qb[i] = __vsub4(((ql[i] >> 4) & 0x0F0F0F0Fu) | (((qh[i] >> s2) & 0x03030303u) << 4),
                        0x20202020u);
    }
}

/* Q4_0: the two runs of a block from its 16 qs bytes, q - 8. */
__device__ __forceinline__ void gemm_bits_q40(const uint32_t v[4], uint32_t qa[4], uint32_t qb[4]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        qa[i] = __vsub4(v[i] & 0x0F0F0F0Fu, 0x08080808u);
        qb[i] = __vsub4((v[i] >> 4) & 0x0F0F0F0Fu, 0x08080808u);
    }
}

/* Q6_K chunk c of `row`: the two runs' bits (gemm_bits_q6), their int8 scales and the block's d */
__device__ __forceinline__ void gemm_decode_q6(const uint8_t *row, int c, uint32_t qa[4],
                                               uint32_t qb[4], int8_t sc[2], float *d) {
    const uint8_t *b = row + (size_t)(c >> 3) * 210;
    const int q = c & 7, hh = q >> 2, r = q & 3, w = r >> 1, l0 = 16 * (r & 1);
    *d = engine_cu_h2f(__ldg((const uint16_t *)(b + 208)));
    uint32_t ql[4], qh[4];
    engine_cu_ldw_a2<4>(b + 64 * hh + 32 * w + l0, ql);
    engine_cu_ldw_a2<4>(b + 128 + 32 * hh + l0, qh);
    const int8_t *scp = (const int8_t *)(b + 192 + 8 * hh + (l0 >> 4));
    sc[0] = __ldg(scp + 2 * w);
    sc[1] = __ldg(scp + 4 + 2 * w);
    gemm_bits_q6(w, ql, qh, qa, qb);
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
        int8_t sc[2];
        float d;
        gemm_decode_q6(row, c, qa, qb, sc, &d);
        *sa = d * (float)sc[0];
        *sb = d * (float)sc[1];
        *oa = *ob = 0.0f;
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
        gemm_bits_q40(v, qa, qb);
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
#define GEMM_STAGE_ROW_Q4 80 /* the SV kernels' Q4_K rows (16 + 64): 4 blocks per SM fit */
/* Q6_K, Q8_0, Q4_0 (2-byte aligned blocks): up to GEMM_STAGE_PIECES 16-byte pieces covering a
 * step's bytes, in rows of GEMM_STAGE_ROW2 bytes (44 words: 8 rows' reads spread over banks) */
#define GEMM_STAGE_PIECES 10
#define GEMM_STAGE_ROW2 176
__device__ __forceinline__ void gemm_cp_async16(void *dst, const void *src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
#else
    *(uint4 *)dst = *(const uint4 *)src;
#endif
}
/* The first n (1..16) bytes at src to dst, the rest of the 16 zero-filled, through registers:
 * reads no byte past src + n. */
__device__ __forceinline__ void gemm_copy16n(void *dst, const void *src, int n) {
    uint8_t *o = (uint8_t *)dst;
    for (int i = 0; i < 16; i++)
        o[i] = i < n ? ((const uint8_t *)src)[i] : 0;
}
/* The same with cp.async. Its 16-byte window is read as a whole by compute-sanitizer's count
 * (src-size or not), so a window past the end of the weights takes gemm_copy16n instead. */
__device__ __forceinline__ void gemm_cp_async16n(void *dst, const void *src, int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(n)
                 : "memory");
#else
    gemm_copy16n(dst, src, n);
#endif
}
/* N words of the 4 N bytes at a 2-byte-aligned shared address (aligned loads, funnel shifts). */
template <int N> __device__ __forceinline__ void gemm_lds_a2(const uint8_t *p, uint32_t w[N]) {
    const uintptr_t ad = (uintptr_t)p;
    const uint32_t *b = (const uint32_t *)(ad & ~(uintptr_t)3);
    const int sh = (int)(ad & 3) * 8;
    uint32_t u[N + 1];
#pragma unroll
    for (int i = 0; i < N; i++)
        u[i] = b[i];
    u[N] = sh ? (uint32_t)*(const uint16_t *)(b + N) : 0u;
#pragma unroll
    for (int i = 0; i < N; i++)
        w[i] = __funnelshift_r(u[i], u[i + 1], sh);
}
/* Staged piece pc (0 .. GEMM_STAGE_PIECES-1) of a Q6_K / Q8_0 / Q4_0 row's step k0 (bb bytes a
 * block): its 16-byte aligned source and how many of its bytes are wanted (<= 0: none). Q6_K:
 * pieces 0-4 cover the half's 64 ql bytes, 5-7 its 32 qh bytes, 8-9 its 8 scales and d; the
 * 32-blocked types: 0-9 the step's four blocks. Nothing past the row's end is read. */
__device__ __forceinline__ int gemm_stage_piece(bool q6, int bb, const uint8_t *row,
                                                size_t row_bytes, int k0, int pc,
                                                const uint8_t **src) {
    uintptr_t s0;
    int len, pp = pc;
    if (q6) {
        const uintptr_t blk = (uintptr_t)row + (uintptr_t)(k0 >> 8) * 210;
        const int h = (k0 >> 7) & 1;
        if (pc < 5) {
            s0 = blk + 64 * h, len = 64;
        } else if (pc < 8) {
            s0 = blk + 128 + 32 * h, len = 32, pp = pc - 5;
        } else {
            s0 = blk + 192 + 8 * h, len = 18 - 8 * h, pp = pc - 8;
        }
    } else {
        s0 = (uintptr_t)row + (uintptr_t)(k0 >> 5) * (uintptr_t)bb, len = 4 * bb;
    }
    const uintptr_t a = (s0 & ~(uintptr_t)15) + 16 * (uintptr_t)pp,
                    end = std::min<uintptr_t>(s0 + (uintptr_t)len, (uintptr_t)row + row_bytes);
    *src = (const uint8_t *)a;
    return end > a ? (int)std::min<uintptr_t>(16, end - a) : 0;
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
/* SV layout of the scales (engine_cu_gemm_args.svec): weight row r's at gemm_pw(r), X row i's
 * at gemm_px(i) in each run's TBN / TBM floats, so that a thread's 8 weight-row scales and 4
 * X-row scales of a run are two and one 16-byte loads (the warp fragment order). */
__device__ __forceinline__ int gemm_pw(int r) {
    return (r & ~31) | (((r >> 1) & 3) << 3) | (((r >> 3) & 3) << 1) | (r & 1);
}
__device__ __forceinline__ int gemm_px(int i) {
    return (i & ~31) | ((i & 7) << 2) | (((i >> 4) & 1) << 1) | ((i >> 3) & 1);
}

/* DB (engine_cu_gemm_args.direct; staged Q4_K / Q5_K, SV): the products read their weight
 * fragments straight from the staged raw bytes (a 32-bit word of packed nibbles gives the
 * fragment of two 32-column runs: low nibbles, then high; Q5_K ORs in its qh bit), so the
 * decode only writes the scales and no int8 weight tile goes through shared memory. */
/* The blocks per multiprocessor a gemm_kernel's registers are allotted for. */
constexpr int gemm_min_blocks(int ki, int wm, int wnn, bool sv) {
    return ki ? ki : wm * wnn == 8 ? 2 : sv ? 4 : 3;
}
/* KI (engine_cu_gemm_args.kint; DB kernels, and Q6_K's SV kernel: below): each 32-column
 * run's int8 product times the run's 6-bit scale summed in int32 over the superblock (its two
 * steps), the minimums' term sum_j m_j * (X run sum)_j of the superblock as one F16 tensor-core
 * product per fragment (run sums split as 64 hi + lo, m and 64 m: exact integers), then d * sumi -
 * dmin * summ (d, dmin times the X row's Q8_K scale) added to the F32 sums at the superblock's end:
 * the CPU dot's (dot_k45_block) integer order inside a superblock. Q6_K (MODE 0): each 16-column
 * product times its int8 scale summed in int32 over the superblock, + d * xd * sumi at its end
 * (vec_dot_q6_K's order; the -32 is in the int8 values). KI: 0 (off), else the blocks per
 * multiprocessor the registers are allotted for. */
template <int MODE, int WM, bool LEGACY, bool PIPE = false, int WNN = 4 / WM, bool SV = false,
          bool DB = false, int KI = 0>
__global__ void __launch_bounds__(32 * WM * WNN, gemm_min_blocks(KI, WM, WNN, SV))
    gemm_kernel(engine_cu_gemm_args a) {
    constexpr bool KB = KI != 0;
    static_assert(!DB || (PIPE && MODE == 1 && SV), "direct fragments: staged Q4_K / Q5_K, SV");
    static_assert(!KB || DB || (MODE == 0 && SV && !PIPE),
                  "the int superblock order: staged Q4_K / Q5_K (DB), or Q6_K with SV");
    static_assert(!SV || (MODE != 2 && !LEGACY), "the SV scale layout is for int8 forms");
    static_assert(!PIPE || (MODE != 2 && !LEGACY), "the staged pipeline is for int8 forms");
    static_assert(WM * WNN == 4 || (WM == 2 && WNN == 4 && !LEGACY), "4 warps, or 8 of 64 x 128");
    constexpr bool Q = MODE != 2, K32 = MODE == 1 || MODE == 3;
    constexpr bool OFF = LEGACY ? Q : MODE == 1 && !KB;
    /* NT threads; WIDE (8 warps) and SV kernels: the 16-row fragments past the tile's rows skip
     * their products (SKIP) */
    constexpr int NT = 32 * WM * WNN, TBM = 32 * WM, TBN = 32 * WNN;
    constexpr bool WIDE = WM * WNN == 8, SKIP = WIDE || SV;
    constexpr int SROW = Q ? BK + 16 : 2 * BK + 16, NR = K32 ? 4 : 8; /* scale runs */
    constexpr int XV = Q ? (TBM * BK / 16) / NT : (TBM * BK / 8) / NT;
    __shared__ __align__(16) uint8_t sA[TBM * SROW];
    __shared__ __align__(16) uint8_t sB[DB ? 16 : TBN * SROW]; /* DB: not used */
    __shared__ __align__(16) float sWs[Q ? TBN : 1][NR], sWo[OFF ? TBN : 1][NR],
        sXd[Q ? TBM : 1][4], sXs[OFF ? TBM : 1][NR];
    /* SV: the same storage as runs of TBN (TBM) floats */
    float *const vWs = &sWs[0][0], *const vWo = &sWo[0][0], *const vXd = &sXd[0][0],
                 *const vXs = &sXs[0][0];
    __shared__ int sIdx[TBM];
    /* KI: the superblock's X run sums of each tile row, F16: lo of runs 0-7, hi of runs 0-7
     * (rows of 12 words: the fragment loads of a warp hit different banks) */
    __shared__ __align__(16) uint16_t sXb[KB && MODE == 1 ? TBM : 1][24];
    __shared__ float sWd[KB && MODE == 0 ? TBN : 1]; /* KI, Q6_K: each weight row's d */
    int mat, row0, nrow;
    if (!gemm_tile<WM>(a, &mat, &row0, &nrow)) return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WNN, wn = warp % WNN, g = lane >> 2, tig = lane & 3;
    /* SV: the X scales of X run xr (xd) and xo (xs, OFF) for the warp's rows, the weight scales
     * and offsets of run wr for its rows (pairs of rows per column fragment ni) */
    auto sv_load = [&](int xr, int xo, int wr, float xd[2][2], float xs[2][2], float wsv[8],
                       float wov[8]) {
        if constexpr (SV) {
            const float4 x4 = *(const float4 *)(vXd + xr * TBM + wm * 32 + 4 * g);
            xd[0][0] = x4.x, xd[0][1] = x4.y, xd[1][0] = x4.z, xd[1][1] = x4.w;
            xs[0][0] = xs[0][1] = xs[1][0] = xs[1][1] = 0.0f;
            if (OFF) {
                const float4 s4 = *(const float4 *)(vXs + xo * TBM + wm * 32 + 4 * g);
                xs[0][0] = s4.x, xs[0][1] = s4.y, xs[1][0] = s4.z, xs[1][1] = s4.w;
            }
            const float *pw = vWs + wr * TBN + wn * 32 + 8 * tig;
            const float4 w0 = *(const float4 *)pw, w1 = *(const float4 *)(pw + 4);
            wsv[0] = w0.x, wsv[1] = w0.y, wsv[2] = w0.z, wsv[3] = w0.w;
            wsv[4] = w1.x, wsv[5] = w1.y, wsv[6] = w1.z, wsv[7] = w1.w;
#pragma unroll
            for (int e = 0; e < 8; e++)
                wov[e] = 0.0f;
            if (OFF) {
                const float *po = vWo + wr * TBN + wn * 32 + 8 * tig;
                const float4 o0 = *(const float4 *)po, o1 = *(const float4 *)(po + 4);
                wov[0] = o0.x, wov[1] = o0.y, wov[2] = o0.z, wov[3] = o0.w;
                wov[4] = o1.x, wov[5] = o1.y, wov[6] = o1.z, wov[7] = o1.w;
            }
        }
    };
    /* SKIP: the warp's live 16-row fragments (0, 1 or 2; the same for the whole warp) */
    const int nfr = SKIP ? min(2, max(0, (nrow - 32 * wm + 15) >> 4)) : 2;
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
    const uint8_t *const wend = W + (size_t)rows * a.row_bytes; /* this matrix's last byte + 1 */
    const int nch = a.cols / 32;
    const bool bf = a.type == ENGINE_TYPE_BF16;
    const int c0 = LEGACY ? 0 : GEMM_MAGIC;
    if (tid < TBM) {
        const int i = row0 + tid;
        sIdx[tid] = tid < nrow ? (a.x_idx ? a.x_idx[i] : i) : -1;
    }
    __syncthreads();
    float acc[2][4][4];
    int acci[KB ? 2 : 1][4][4]; /* KI: the superblock's sum of sc * (int product) */
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                acc[mi][ni][e] = 0.0f;
                if (KB) acci[KB ? mi : 0][ni][e] = 0;
            }

    /* KI: run ks's int products (prod(mi, ni, c) computes fragment (mi, ni) from 0) times the
     * run's scales of this thread's weight rows (SV layout), summed into acci */
    auto ki_run = [&](int ks, auto prod) {
        const int4 s0 = *(const int4 *)(vWs + ks * TBN + wn * 32 + 8 * tig),
                   s1 = *(const int4 *)(vWs + ks * TBN + wn * 32 + 8 * tig + 4);
        const int scv[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                if (SKIP && mi >= nfr) continue;
                int c[4];
                prod(mi, ni, c);
                int *ai = acci[KB ? mi : 0][ni];
                ai[0] += scv[2 * ni] * c[0];
                ai[1] += scv[2 * ni + 1] * c[1];
                ai[2] += scv[2 * ni] * c[2];
                ai[3] += scv[2 * ni + 1] * c[3];
            }
    };
    /* this thread's X vectors of a step: rows and 16-byte parts; and (int8 forms, not LEGACY)
     * its X scales of the step: (row, 32-column block) pairs idx = tid + 128 j */
    constexpr int XS = Q && !LEGACY ? TBM * 4 / NT : 1;
    int4 xr[XV];
    float xdr[XS], xsr[XS];
    uint32_t xbr[KB ? XS : 1];
    auto load_x = [&](int k0) {
#pragma unroll
        for (int j = 0; j < XV; j++) {
            const int idx = tid + NT * j;
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
                const int idx = tid + NT * j, r = idx >> 2, cd = k0 + 32 * (idx & 3);
                const int src = sIdx[r];
                const bool in = src >= 0 && cd < a.cols;
                xdr[j] = in ? a.x.d[(size_t)src * (a.cols / 32) + cd / 32] : 0.0f;
                xsr[j] = 0.0f;
                if (OFF && in) { /* !LEGACY: only MODE 1 keeps offsets (per 32) */
                    const float *xs = a.x.s + (size_t)src * (a.cols / 16) + cd / 16;
                    xsr[j] = xs[0] + xs[1];
                }
                if constexpr (KB && MODE == 1)
                    xbr[j] = in ? a.x.b[(size_t)src * (a.cols / 32) + cd / 32] : 0u;
            }
    };
    /* the W tile of step k0 for weights of type tc (int8 forms): a chunk outside the matrix
     * decodes row 0's chunk 0 (always there) and stores zeros; then the L2 (a.prefetch_l1: L1)
     * prefetch of the next step's blocks */
    /* the decoded runs of chunk c (of type tc) of tile row r into the tile; zeros unless in */
    auto put = [&](auto tc, int r, int c, int k0, bool in, const uint32_t qa[4],
                   const uint32_t qb[4], float s1, float o1, float s2, float o2) {
        int a0, b0;
        engine_cu_chunk_cols(decltype(tc)::value, c, &a0, &b0);
        a0 -= k0;
        b0 -= k0;
        if constexpr (!DB) {
            const uint32_t mk = in ? 0xffffffffu : 0u;
            *(uint4 *)(sB + r * SROW + a0) =
                make_uint4(qa[0] & mk, qa[1] & mk, qa[2] & mk, qa[3] & mk);
            *(uint4 *)(sB + r * SROW + b0) =
                make_uint4(qb[0] & mk, qb[1] & mk, qb[2] & mk, qb[3] & mk);
        }
        /* K32: both runs of a 32-column block carry its scale (written twice) */
        const int ra = K32 ? a0 >> 5 : a0 >> 4, rb = K32 ? b0 >> 5 : b0 >> 4;
        if constexpr (SV) {
            const int pr = gemm_pw(r);
            vWs[ra * TBN + pr] = in ? s1 : 0.0f;
            vWs[rb * TBN + pr] = in ? s2 : 0.0f;
            if (OFF) {
                vWo[ra * TBN + pr] = in ? o1 : 0.0f;
                vWo[rb * TBN + pr] = in ? o2 : 0.0f;
            }
        } else {
            sWs[r][ra] = in ? s1 : 0.0f;
            sWs[r][rb] = in ? s2 : 0.0f;
            if (OFF) {
                sWo[r][ra] = in ? o1 : 0.0f;
                sWo[r][rb] = in ? o2 : 0.0f;
            }
        }
    };
    auto wtile = [&](auto tc, int k0) {
        constexpr int T = decltype(tc)::value;
        constexpr int NJ = (TBN * 4) / NT;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const int cid = tid + NT * j, r = cid >> 2, c = k0 / 32 + (cid & 3);
            const int grow = n0 + r;
            const bool in = grow < rows && c < nch;
            const uint8_t *row = W + (size_t)(in ? grow : 0) * a.row_bytes;
            uint32_t qa[4], qb[4];
            float s1, o1, s2, o2;
            if constexpr (KB && T == ENGINE_TYPE_Q6_K) { /* int scales, the row's d apart */
                int8_t sc[2];
                float d;
                gemm_decode_q6(row, in ? c : 0, qa, qb, sc, &d);
                sWd[r] = in ? d : 0.0f;
                put(tc, r, c, k0, in, qa, qb, __int_as_float((int)sc[0]), 0.0f,
                    __int_as_float((int)sc[1]), 0.0f);
                continue;
            }
            gemm_decode_q(T, row, in ? c : 0, qa, qb, &s1, &o1, &s2, &o2);
            put(tc, r, c, k0, in, qa, qb, s1, o1, s2, o2);
        }
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const int cid = tid + NT * j, r = cid >> 2, c = k0 / 32 + (cid & 3);
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
     * into one of two staging buffers (dynamic shared memory, GEMM_STAGE_ROW bytes a row, the
     * SV kernels' Q4_K rows GEMM_STAGE_ROW_Q4) with
     * cp.async one step ahead, and the step decodes from there: the weight loads of step k+1
     * fly during the products of step k. Rows past the matrix are staged as zeros. */
    extern __shared__ __align__(16) uint8_t gemm_stage[];
    auto stage = [&](int k0, int buf) {
        if constexpr (PIPE && MODE != 1) { /* Q6_K, Q8_0, Q4_0: covering pieces (above) */
            const int bb = a.type == ENGINE_TYPE_Q8_0 ? 34 : 18;
            uint8_t *st = gemm_stage + (size_t)buf * TBN * GEMM_STAGE_ROW2;
            for (int idx = tid; idx < TBN * GEMM_STAGE_PIECES; idx += NT) {
                const int r = idx / GEMM_STAGE_PIECES, pc = idx - r * GEMM_STAGE_PIECES;
                const int grow = n0 + r;
                uint8_t *dst = st + r * GEMM_STAGE_ROW2 + 16 * pc;
                if (grow >= rows) {
                    *(uint4 *)dst = make_uint4(0, 0, 0, 0);
                    continue;
                }
                const uint8_t *src;
                const int nb = gemm_stage_piece(MODE == 0, bb, W + (size_t)grow * a.row_bytes,
                                                a.row_bytes, k0, pc, &src);
                if (nb > 0 && src + 16 <= wend)
                    gemm_cp_async16n(dst, src, nb);
                else if (nb > 0) /* the last row's last piece: nothing read past the matrix */
                    gemm_copy16n(dst, src, nb);
            }
            gemm_cp_commit();
        } else if constexpr (PIPE) {
            const bool q5 = a.type == ENGINE_TYPE_Q5_K;
            const int nc = q5 ? 7 : 5, h = (k0 >> 7) & 1, bb = q5 ? 176 : 144, qso = q5 ? 48 : 16;
            const int srow = SV && !q5 ? GEMM_STAGE_ROW_Q4 : GEMM_STAGE_ROW;
            uint8_t *st = gemm_stage + (size_t)buf * TBN * srow;
            for (int idx = tid; idx < TBN * nc; idx += NT) {
                const int r = idx / nc, pc = idx - r * nc, grow = n0 + r;
                /* piece pc: 0 the header, then (Q5_K) the two qh pieces, then four qs pieces */
                const int e = pc - (q5 ? 3 : 1);
                const int so = pc == 0 ? 0 : e < 0 ? 16 * pc : qso + 64 * h + 16 * e;
                const int dof = pc == 0 ? 0 : e < 0 ? 16 * pc : qso + 16 * e;
                uint8_t *dst = st + r * srow + dof;
                const uint8_t *blk = W + (size_t)grow * a.row_bytes + (size_t)(k0 >> 8) * bb;
                if (grow < rows)
                    gemm_cp_async16(dst, blk + so);
                else
                    *(uint4 *)dst = make_uint4(0, 0, 0, 0);
            }
            gemm_cp_commit();
        }
    };
    /* the W tile of step k0 from staging buffer buf (as wtile): Q6_K, Q8_0, Q4_0 */
    auto wtile_staged2 = [&](auto tc, int k0, int buf) {
        constexpr int T = decltype(tc)::value;
        constexpr int NJ = (TBN * 4) / NT;
        const uint8_t *st = gemm_stage + (size_t)buf * TBN * GEMM_STAGE_ROW2;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const int cid = tid + NT * j, r = cid >> 2, c = k0 / 32 + (cid & 3);
            const int grow = n0 + r;
            const bool in = grow < rows && c < nch;
            /* the row's address only gives the pieces' offsets (rows past the matrix: zeros) */
            const uintptr_t row = (uintptr_t)(W + (size_t)(grow < rows ? grow : 0) * a.row_bytes);
            const uint8_t *sr = st + r * GEMM_STAGE_ROW2;
            uint32_t qa[4], qb[4];
            float s1, s2;
            if constexpr (T == ENGINE_TYPE_Q6_K) {
                const uintptr_t blk = row + (uintptr_t)(k0 >> 8) * 210;
                const int h = (k0 >> 7) & 1, l1 = (int)(blk & 15),
                          l3 = (int)((blk + 192 + 8 * h) & 15);
                const int q = c & 7, w = (q & 3) >> 1, l0 = 16 * (q & 1);
                uint32_t ql[4], qh[4];
                gemm_lds_a2<4>(sr + l1 + 32 * w + l0, ql);
                gemm_lds_a2<4>(sr + 80 + l1 + l0, qh);
                const uint8_t *sc = sr + 128 + l3; /* the half's scales, then d */
                const float d = engine_cu_h2f(*(const uint16_t *)(sc + 16 - 8 * h));
                const int8_t *scp = (const int8_t *)(sc + (l0 >> 4));
                s1 = d * (float)scp[2 * w];
                s2 = d * (float)scp[4 + 2 * w];
                gemm_bits_q6(w, ql, qh, qa, qb);
            } else {
                constexpr int bb = T == ENGINE_TYPE_Q8_0 ? 34 : 18;
                const uintptr_t s0 = row + (uintptr_t)(k0 >> 5) * bb;
                const uint8_t *b = sr + (int)(s0 & 15) + (cid & 3) * bb;
                s1 = s2 = engine_cu_h2f(*(const uint16_t *)b);
                if constexpr (T == ENGINE_TYPE_Q8_0) {
                    uint32_t v[8];
                    gemm_lds_a2<8>(b + 2, v);
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        qa[i] = v[i];
                        qb[i] = v[i + 4];
                    }
                } else {
                    uint32_t v[4];
                    gemm_lds_a2<4>(b + 2, v);
                    gemm_bits_q40(v, qa, qb);
                }
            }
            put(tc, r, c, k0, in, qa, qb, s1, 0.0f, s2, 0.0f);
        }
    };
    /* the W tile of step k0 from staging buffer buf (as wtile; the type is Q4_K or Q5_K) */
    auto wtile_staged = [&](int k0, int buf) {
        if constexpr (PIPE && MODE == 1) {
            constexpr int NJ = (TBN * 4) / NT;
            const bool q5 = a.type == ENGINE_TYPE_Q5_K;
            const int h = (k0 >> 7) & 1;
            const int srow = SV && !q5 ? GEMM_STAGE_ROW_Q4 : GEMM_STAGE_ROW;
            const uint8_t *st = gemm_stage + (size_t)buf * TBN * srow;
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                const int cid = tid + NT * j, r = cid >> 2, c = k0 / 32 + (cid & 3);
                const bool in = n0 + r < rows && c < nch;
                const uint8_t *sr = st + r * srow;
                const int q = c & 7, jj = q >> 1, half = q & 1;
                if constexpr (KB) { /* the two runs' 6-bit scales as ints (SV layout) */
                    const uint4 hv = *(const uint4 *)sr;
                    int sc[2], mn[2], a0, b0;
                    engine_cu_scale_min_k4w2(jj, hv.y, hv.z, hv.w, sc, mn);
                    engine_cu_chunk_cols(ENGINE_TYPE_Q4_K, c, &a0, &b0);
                    const int pr = gemm_pw(r);
                    vWs[((a0 - k0) >> 5) * TBN + pr] = __int_as_float(in ? sc[0] : 0);
                    vWs[((b0 - k0) >> 5) * TBN + pr] = __int_as_float(in ? sc[1] : 0);
                    continue;
                }
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
                /* Q5_K: the same columns as Q4_K */
                put(std::integral_constant<int, ENGINE_TYPE_Q4_K>(), r, c, k0, in, qa, qb, s1, o1,
                    s2, o2);
            }
        }
    };
    /* split-K (a.kpart, dense mode): block z takes the whole steps [kb, ke) of ksplit (KI:
     * whole superblocks, two steps each) */
    int kb = 0, ke = a.cols;
    if (a.kpart) {
        const int u = KB ? 2 * BK : BK, units = (a.cols + u - 1) / u, z = (int)blockIdx.z;
        kb = u * (int)((long)units * z / a.ksplit);
        ke = min(a.cols, u * (int)((long)units * (z + 1) / a.ksplit));
    }
    load_x(kb);
    if constexpr (PIPE) stage(kb, 0);
    for (int k0 = kb; k0 < ke; k0 += BK) {
        const int buf = ((k0 - kb) / BK) & 1;
        if constexpr (PIPE) { /* the next step's bytes (an empty group at the last step) */
            if (k0 + BK < ke)
                stage(k0 + BK, buf ^ 1);
            else
                gemm_cp_commit();
        }
#pragma unroll
        for (int j = 0; j < XV; j++) {
            const int idx = tid + NT * j;
            const int r = Q ? idx >> 3 : idx >> 4, part = Q ? idx & 7 : idx & 15;
            *(int4 *)(sA + r * SROW + 16 * part) = xr[j];
        }
        if (Q && !LEGACY)
#pragma unroll
            for (int j = 0; j < XS; j++) {
                const int idx = tid + NT * j;
                if constexpr (SV) {
                    const int px = (idx & 3) * TBM + gemm_px(idx >> 2);
                    vXd[px] = xdr[j];
                    if (OFF) vXs[px] = xsr[j];
                    if constexpr (KB && MODE == 1) {
                        const int run = 4 * ((k0 >> 7) & 1) + (idx & 3);
                        sXb[idx >> 2][run] = (uint16_t)(xbr[j] & 0xffffu);
                        sXb[idx >> 2][8 + run] = (uint16_t)(xbr[j] >> 16);
                    }
                } else {
                    sXd[idx >> 2][idx & 3] = xdr[j];
                    if (OFF) sXs[idx >> 2][idx & 3] = xsr[j];
                }
            }
        if (Q && LEGACY)
            for (int idx = tid; idx < TBM * 4; idx += NT) {
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
            if constexpr (MODE == 1)
                wtile_staged(k0, buf);
            else if constexpr (MODE == 0)
                wtile_staged2(std::integral_constant<int, ENGINE_TYPE_Q6_K>(), k0, buf);
            else if (a.type == ENGINE_TYPE_Q8_0)
                wtile_staged2(std::integral_constant<int, ENGINE_TYPE_Q8_0>(), k0, buf);
            else
                wtile_staged2(std::integral_constant<int, ENGINE_TYPE_Q4_0>(), k0, buf);
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
        for (int j = 0; j < (Q && !LEGACY ? 0 : (TBN * 4) / NT); j++) {
            const int cid = tid + NT * j, r = cid >> 2, c = k0 / 32 + (cid & 3);
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
        if (k0 + BK < ke) load_x(k0 + BK);
        if (SKIP && nfr == 0) { /* no rows of this warp's: it only helps load and decode */
        } else if (K32) {
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
                if constexpr (DB) { /* from the staged bytes of step k0 (rows past: zeros) */
                    const bool q5 = a.type == ENGINE_TYPE_Q5_K;
                    const int srow = q5 ? GEMM_STAGE_ROW : GEMM_STAGE_ROW_Q4;
                    const int sh = 4 * (ks & 1), sbk = 4 * ((k0 >> 7) & 1) + ks; /* sub-block */
                    const uint8_t *stb = gemm_stage + (size_t)buf * TBN * srow +
                                         (q5 ? 48 : 16) + 32 * (ks >> 1) + 4 * tig;
#pragma unroll
                    for (int ni = 0; ni < 4; ni++) {
                        const uint8_t *p = stb + (wn * 32 + ni * 8 + g) * srow;
                        bfr[ni][0] = (*(const uint32_t *)p >> sh) & 0x0F0F0F0Fu;
                        bfr[ni][1] = (*(const uint32_t *)(p + 16) >> sh) & 0x0F0F0F0Fu;
                        if (q5) {
                            const uint8_t *ph = p - (48 + 32 * (ks >> 1)) + 16;
                            bfr[ni][0] |= ((*(const uint32_t *)ph >> sbk) & 0x01010101u) << 4;
                            bfr[ni][1] |= ((*(const uint32_t *)(ph + 16) >> sbk) & 0x01010101u)
                                          << 4;
                        }
                    }
                } else {
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    const uint8_t *p = sB + (wn * 32 + ni * 8 + g) * SROW + kk + 4 * tig;
                    bfr[ni][0] = *(const uint32_t *)p;
                    bfr[ni][1] = *(const uint32_t *)(p + 16);
                }
                }
                float xd[2][2], xs[2][2];
                if constexpr (KB) {
                    ki_run(ks, [&](int mi, int ni, int c[4]) {
                        mma_s8_k32(c, af[mi], bfr[ni][0], bfr[ni][1], 0);
                    });
                } else if constexpr (SV) {
                    float wsv[8], wov[8];
                    sv_load(ks, ks, ks, xd, xs, wsv, wov);
#pragma unroll
                    for (int ni = 0; ni < 4; ni++)
#pragma unroll
                        for (int mi = 0; mi < 2; mi++) {
                            if (SKIP && mi >= nfr) continue;
                            int c[4];
                            mma_s8_k32(c, af[mi], bfr[ni][0], bfr[ni][1], c0);
                            gemm_epilogue<LEGACY, OFF>(acc[mi][ni], c, wsv[2 * ni], wov[2 * ni],
                                                       wsv[2 * ni + 1], wov[2 * ni + 1],
                                                       xd[mi], xs[mi]);
                        }
                } else {
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
                        if (SKIP && mi >= nfr) continue;
                        int c[4];
                        mma_s8_k32(c, af[mi], bfr[ni][0], bfr[ni][1], c0);
                        gemm_epilogue<LEGACY, OFF>(acc[mi][ni], c, ws0, wo0, ws1, wo1, xd[mi],
                                                   xs[mi]);
                    }
                }
                }
            }
            if constexpr (KB)
                if ((k0 >> 7) & 1) { /* the superblock's last step (Q8_K rows: 256 columns) */
                    const int srow =
                        a.type == ENGINE_TYPE_Q5_K ? GEMM_STAGE_ROW : GEMM_STAGE_ROW_Q4;
                    const uint8_t *st = gemm_stage + (size_t)buf * TBN * srow;
                    /* the X rows' Q8_K scales (every run of the superblock holds it) */
                    const float4 x4 = *(const float4 *)(vXd + wm * 32 + 4 * g);
                    const float xq[2][2] = {{x4.x, x4.y}, {x4.z, x4.w}};
#pragma unroll
                    for (int ni = 0; ni < 4; ni++) {
                        const int rb = wn * 32 + ni * 8;
                        /* B: m of runs 2 tig, 2 tig + 1 (k 2 tig..), and 64 m (k 8 + 2 tig..)
                         * of weight row rb + g, from its staged header */
                        const uint4 hg = *(const uint4 *)(st + (rb + g) * srow);
                        int scx[2], mx[2];
                        engine_cu_scale_min_k4w2(tig, hg.y, hg.z, hg.w, scx, mx);
                        const uint32_t b0 = (uint32_t)__half_as_ushort(__int2half_rn(mx[0])) |
                                            (uint32_t)__half_as_ushort(__int2half_rn(mx[1])) << 16,
                                       b1 = (uint32_t)__half_as_ushort(__int2half_rn(64 * mx[0])) |
                                            (uint32_t)__half_as_ushort(__int2half_rn(64 * mx[1]))
                                                << 16;
                        /* d and dmin of the rows of this thread's sums */
                        const uint32_t h0 = *(const uint32_t *)(st + (rb + 2 * tig) * srow),
                                       h1 = *(const uint32_t *)(st + (rb + 2 * tig + 1) * srow);
                        const float dr[2] = {engine_cu_h2f((uint16_t)(h0 & 0xffffu)),
                                             engine_cu_h2f((uint16_t)(h1 & 0xffffu))},
                                    nr[2] = {engine_cu_h2f((uint16_t)(h0 >> 16)),
                                             engine_cu_h2f((uint16_t)(h1 >> 16))};
#pragma unroll
                        for (int mi = 0; mi < 2; mi++) {
                            if (SKIP && mi >= nfr) continue;
                            const uint32_t *xa = (const uint32_t *)&sXb[wm * 32 + mi * 16 + g][0];
                            const uint32_t afm[4] = {xa[tig], xa[8 * 12 + tig], xa[4 + tig],
                                                     xa[8 * 12 + 4 + tig]};
                            float sm[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                            mma_f16(sm, afm, b0, b1, false); /* sum_j m_j (X run sum)_j */
                            int *ai = acci[KB ? mi : 0][ni];
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                const float xv = xq[mi][e >> 1];
                                acc[mi][ni][e] =
                                    fmaf(dr[e & 1] * xv, (float)ai[e],
                                         fmaf(-(nr[e & 1] * xv), sm[e], acc[mi][ni][e]));
                                ai[e] = 0;
                            }
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
                    if constexpr (KB) {
                        ki_run(ks, [&](int mi, int ni, int c[4]) {
                            mma_s8(c, af[mi][0], af[mi][1], bfr[ni], 0);
                        });
                    } else if constexpr (SV) { /* MODE 0: no offsets */
                        float wsv[8], wov[8];
                        sv_load(ks >> 1, ks, ks, xd, xs, wsv, wov);
#pragma unroll
                        for (int ni = 0; ni < 4; ni++)
#pragma unroll
                            for (int mi = 0; mi < 2; mi++) {
                                if (SKIP && mi >= nfr) continue;
                                int c[4];
                                mma_s8(c, af[mi][0], af[mi][1], bfr[ni], c0);
                                gemm_epilogue<LEGACY, OFF>(acc[mi][ni], c, wsv[2 * ni], 0.0f,
                                                           wsv[2 * ni + 1], 0.0f, xd[mi], xs[mi]);
                            }
                    } else {
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
                            if (SKIP && mi >= nfr) continue;
                            int c[4];
                            mma_s8(c, af[mi][0], af[mi][1], bfr[ni], c0);
                            gemm_epilogue<LEGACY, OFF>(acc[mi][ni], c, ws0, wo0, ws1, wo1,
                                                       xd[mi], xs[mi]);
                        }
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
                            if (!SKIP || mi < nfr) mma_f16(acc[mi][ni], af[mi], b0, b1, bf);
                    }
                }
            }
            if constexpr (KB && MODE == 0)
                if ((k0 >> 7) & 1) { /* Q6_K superblock's end: += d * xd * sumi (the CPU's) */
                    const float4 x4 = *(const float4 *)(vXd + wm * 32 + 4 * g);
                    const float xq[2][2] = {{x4.x, x4.y}, {x4.z, x4.w}};
#pragma unroll
                    for (int ni = 0; ni < 4; ni++) {
                        const int r = wn * 32 + ni * 8 + 2 * tig;
                        const float dr[2] = {sWd[r], sWd[r + 1]};
#pragma unroll
                        for (int mi = 0; mi < 2; mi++) {
                            if (SKIP && mi >= nfr) continue;
                            int *ai = acci[KB ? mi : 0][ni];
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                acc[mi][ni][e] =
                                    fmaf(dr[e & 1] * xq[mi][e >> 1], (float)ai[e], acc[mi][ni][e]);
                                ai[e] = 0;
                            }
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
            if (a.kpart) { /* partial sums of split z at the launch's column tile */
                const size_t ldp = (size_t)gridDim.x * TBN;
                float *yp = a.kpart + ((size_t)blockIdx.z * a.m + (size_t)(row0 + i)) * ldp +
                            (size_t)blockIdx.x * TBN;
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        yp[wn * 32 + ni * 8 + 2 * tig + e] = acc[mi][ni][2 * h + e];
                continue;
            }
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

/* Split-K: Y (+)= the ksplit partial sums of each element added in split order (the same
 * result for every run); element (X row blockIdx.y, launch column v), tbn columns a tile. */
__global__ void __launch_bounds__(256) gemm_ksum_kernel(engine_cu_gemm_args a, int tbn, int ldp) {
    const int v = (int)(blockIdx.x * blockDim.x + threadIdx.x), i = (int)blockIdx.y;
    if (v >= ldp) return;
    /* the part and weight row of launch column v, as the GEMM kernel maps its column tiles */
    int bx = v / tbn, rows = a.rows, ldy = a.ldy;
    float *Y = a.y;
    for (int j = 0; j < a.n_more; j++) {
        const int nt = (rows + tbn - 1) / tbn;
        if (bx < nt) break;
        bx -= nt;
        Y = a.more[j].y;
        rows = a.more[j].rows;
        ldy = a.more[j].ldy;
    }
    const int r = bx * tbn + v % tbn;
    if (r >= rows) return;
    float s = 0.0f;
    for (int z = 0; z < a.ksplit; z++)
        s += a.kpart[((size_t)z * a.m + (size_t)i) * (size_t)ldp + (size_t)v];
    float *y = Y + (size_t)i * ldy + r;
    *y = a.accumulate ? *y + s : s;
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

/* WNN: warps along the weight rows (4 / WM: 4 warps; 4 with WM = 2: the wide 8-warp tiles). */
template <int WM, bool LEGACY, int WNN = 4 / WM, bool SV = false>
static void gemm_launch(int mode, dim3 grid, const engine_cu_gemm_args *a, cudaStream_t st) {
    constexpr int nt = 32 * WM * WNN;
    if (SV) { /* room for 4 blocks per multiprocessor (the SV kernels' launch bounds) */
        const int m = mode == 0 ? 0 : mode == 1 ? 1 : 3;
        cudaFuncSetAttribute(m == 0   ? gemm_kernel<0, WM, LEGACY, false, WNN, SV>
                             : m == 1 ? gemm_kernel<1, WM, LEGACY, false, WNN, SV>
                                      : gemm_kernel<LEGACY ? 1 : 3, WM, LEGACY, false, WNN, SV>,
                             cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared);
    }
    switch (mode) {
    case 0: gemm_kernel<0, WM, LEGACY, false, WNN, SV><<<grid, nt, 0, st>>>(*a); break;
    case 1: gemm_kernel<1, WM, LEGACY, false, WNN, SV><<<grid, nt, 0, st>>>(*a); break;
    case 2: { /* no int sums; no wide F16 kernel (its shared tiles pass 48 KB): not asked for */
        constexpr int wn2 = WM * WNN == 8 ? 4 / WM : WNN;
        gemm_kernel<2, WM, false, false, wn2, false><<<grid, 32 * WM * wn2, 0, st>>>(*a);
        break;
    }
    default:
        gemm_kernel<LEGACY ? 1 : 3, WM, LEGACY, false, WNN, SV><<<grid, nt, 0, st>>>(*a);
        break;
    }
}

/* The staged (cp.async) kernels of mode 0, 1 or 3: two staging buffers of dynamic shared
 * memory. */
template <int MODE, int WM, int WNN, bool SV, bool DB = false, int KI = 0>
static void gemm_launch_pipe1(dim3 grid, const engine_cu_gemm_args *a, cudaStream_t st) {
    const int srow = MODE != 1                                  ? GEMM_STAGE_ROW2
                     : SV && a->type == ENGINE_TYPE_Q4_K ? GEMM_STAGE_ROW_Q4
                                                         : GEMM_STAGE_ROW;
    const size_t dyn = (size_t)2 * (32 * WNN) * srow;
    cudaFuncSetAttribute(gemm_kernel<MODE, WM, false, true, WNN, SV, DB, KI>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn);
    if (SV) /* room for 4 blocks per multiprocessor (the SV kernels' launch bounds) */
        cudaFuncSetAttribute(gemm_kernel<MODE, WM, false, true, WNN, SV, DB, KI>,
                             cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared);
    gemm_kernel<MODE, WM, false, true, WNN, SV, DB, KI><<<grid, 32 * WM * WNN, dyn, st>>>(*a);
}
template <int WM, int WNN = 4 / WM, bool SV = false>
static void gemm_launch_pipe(int mode, dim3 grid, const engine_cu_gemm_args *a, cudaStream_t st) {
    if (mode == 0)
        gemm_launch_pipe1<0, WM, WNN, SV>(grid, a, st);
    else if (mode == 1 && SV && a->direct && a->kint && WM == 1 && WNN == 4 &&
             (!a->kpart || a->ksplit <= a->cols / (2 * BK))) { /* splits of whole superblocks */
        if (a->kint == 3) /* 32 x 128 tiles only; registers for 3 or 4 blocks an SM */
            gemm_launch_pipe1<1, 1, 4, true, true, 3>(grid, a, st);
        else
            gemm_launch_pipe1<1, 1, 4, true, true, 4>(grid, a, st);
    } else if (mode == 1 && SV && a->direct)
        gemm_launch_pipe1<1, WM, WNN, SV, SV>(grid, a, st);
    else if (mode == 1)
        gemm_launch_pipe1<1, WM, WNN, SV>(grid, a, st);
    else
        gemm_launch_pipe1<3, WM, WNN, SV>(grid, a, st);
}

/* The tile shape and grid of a tensor-core product. */
typedef struct {
    int mode, wm, tbn;
    bool wide;
    unsigned nx, ny;
} gemm_shape;

static gemm_shape gemm_shape_of(const engine_cu_gemm_args *a) {
    gemm_shape g;
    const int form = engine_cu_gemm_xform(a->type);
    g.mode = form == ENGINE_CU_GX_F16 || form == ENGINE_CU_GX_BF16 ? 2
             : a->type == ENGINE_TYPE_Q6_K                         ? 0
             : a->type == ENGINE_TYPE_Q4_K || a->type == ENGINE_TYPE_Q5_K ? 1
                                                                           : 3;
    g.wide = a->wide && !a->legacy && g.mode != 2; /* F16: 4 warps (shared memory) */
    const int tr = a->legacy || g.wide ? 64 : a->tile_rows ? a->tile_rows : a->tiles ? 32 : 64;
    g.wm = tr == 32 ? 1 : 2;
    g.tbn = g.wide ? 128 : 128 / g.wm;
    const int tbm = 32 * g.wm;
    g.ny = a->tiles ? (unsigned)a->max_tiles * (g.wm == 1 ? 2u : 1u)
                    : (unsigned)((a->m + tbm - 1) / tbm);
    g.nx = (unsigned)((a->rows + g.tbn - 1) / g.tbn);
    for (int j = 0; j < a->n_more; j++)
        g.nx += (unsigned)((a->more[j].rows + g.tbn - 1) / g.tbn);
    return g;
}

/* The split count a tensor-core product runs with (split-K: dense, a partial-sum buffer, at
 * most one split per step). */
static int gemm_ksplit(const engine_cu_gemm_args *a) {
    const int steps = (a->cols + BK - 1) / BK;
    return a->kpart && !a->tiles && a->ksplit > 1 ? std::min(a->ksplit, steps) : 1;
}

size_t engine_cu_gemm_kpart_bytes(const engine_cu_gemm_args *a) {
    if (engine_cu_gemm_xform(a->type) == ENGINE_CU_GX_F32 || a->tiles || a->ksplit <= 1) return 0;
    const gemm_shape g = gemm_shape_of(a);
    const int steps = (a->cols + BK - 1) / BK;
    return sizeof(float) * (size_t)std::min(a->ksplit, steps) * (size_t)a->m * g.nx *
           (size_t)g.tbn;
}

unsigned engine_cu_gemm_blocks(const engine_cu_gemm_args *a) {
    if (engine_cu_gemm_xform(a->type) == ENGINE_CU_GX_F32) return 0;
    const gemm_shape g = gemm_shape_of(a);
    return g.nx * g.ny;
}

/* The launch of the tensor-core kernel of shape g on grid. */
static void gemm_run(const engine_cu_gemm_args *a, const gemm_shape &g, dim3 grid,
                     cudaStream_t stream) {
    const int mode = g.mode, wm = g.wm;
    const bool wide = g.wide;
    const int pbit = mode == 1 ? ENGINE_CU_GEMM_PIPE_K45
                     : mode == 0 ? ENGINE_CU_GEMM_PIPE_Q6
                     : mode == 3 ? ENGINE_CU_GEMM_PIPE_Q8 : 0;
    const bool sv = (a->svec || a->direct) && mode != 2; /* the wide kernels always */
    if (mode == 0 && a->kint && !a->legacy && !wide && wm == 1 && !(a->pipeline & pbit) &&
        (!a->kpart || a->ksplit <= a->cols / (2 * BK))) { /* Q6_K in the int superblock order */
        cudaFuncSetAttribute(gemm_kernel<0, 1, false, false, 4, true, false, 3>,
                             cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared);
        gemm_kernel<0, 1, false, false, 4, true, false, 3><<<grid, 128, 0, stream>>>(*a);
        return;
    }
    if ((a->pipeline & pbit) && !a->legacy) {
        if (wide)
            gemm_launch_pipe<2, 4, true>(mode, grid, a, stream);
        else if (wm == 1 && sv)
            gemm_launch_pipe<1, 4, true>(mode, grid, a, stream);
        else if (wm == 1)
            gemm_launch_pipe<1>(mode, grid, a, stream);
        else if (sv)
            gemm_launch_pipe<2, 2, true>(mode, grid, a, stream);
        else
            gemm_launch_pipe<2>(mode, grid, a, stream);
        return;
    }
    if (a->legacy)
        gemm_launch<2, true>(mode, grid, a, stream);
    else if (wide)
        gemm_launch<2, false, 4, true>(mode, grid, a, stream);
    else if (wm == 1 && sv)
        gemm_launch<1, false, 4, true>(mode, grid, a, stream);
    else if (wm == 1)
        gemm_launch<1, false>(mode, grid, a, stream);
    else if (sv)
        gemm_launch<2, false, 2, true>(mode, grid, a, stream);
    else
        gemm_launch<2, false>(mode, grid, a, stream);
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
    const gemm_shape g = gemm_shape_of(a);
    if (g.ny == 0) return;
    engine_cu_gemm_args b = *a;
    const int ks = gemm_ksplit(a);
    if (ks <= 1) {
        b.kpart = nullptr;
        gemm_run(&b, g, dim3(g.nx, g.ny), stream);
        return;
    }
    b.ksplit = ks;
    gemm_run(&b, g, dim3(g.nx, g.ny, (unsigned)ks), stream);
    const int ldp = (int)g.nx * g.tbn;
    gemm_ksum_kernel<<<dim3((unsigned)((ldp + 255) / 256), (unsigned)a->m), 256, 0, stream>>>(
        b, g.tbn, ldp);
}

/* ---------------------------------------------------------------------------------------------
 * Test op (cuda_backend.h): allocates, copies, runs, copies back. SPARK_CUDA_GEMM_OP picks the
 * kernel variant, words separated by anything: "legacy" (the first kernels), "tile32" /
 * "tile64" (X rows per tile), "grouped" (grouped mode: the rows cut into groups of 1 to 70
 * rows, tile list entries of <= 64, alternate entries on a second copy of W, each slot reading
 * X row m-1-i; the result is put back in row order; three list entries past the count),
 * "fused" (the rows cut into three matrices at 5/8 and 7/8 of one launch: .more), "pfl1"
 * (the L1 prefetch), "pipe" (the staged cp.async kernels of every int8 type), "wide" (8 warps of
 * 64 x 128 tiles, the SV scale layout), "svec" (the SV scale layout in the 4-warp kernels),
 * "direct" (svec, and staged Q4_K / Q5_K products reading their weight fragments from the
 * staged bytes),
 * "splitk" (dense tensor-core types: split-K over 3, at most one per step), "kint" (with direct
 * and 32-row tiles: Q4_K / Q5_K in the int superblock order; "kint3": registers for 3 blocks
 * an SM).
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
    float *dx = NULL, *dy = NULL, *dn = NULL, *hy = NULL, *dk = NULL;
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
    a.pipeline = var && strstr(var, "pipe") ? ENGINE_CU_GEMM_PIPE_ALL : 0;
    a.wide = var && strstr(var, "wide");
    a.svec = var && strstr(var, "svec");
    a.direct = var && strstr(var, "direct");
    a.kint = var && strstr(var, "kint3") ? 3 : var && strstr(var, "kint") ? 1 : 0;
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
    if (var && strstr(var, "splitk") && form != ENGINE_CU_GX_F32) {
        a.ksplit = 3;
        const size_t kb = engine_cu_gemm_kpart_bytes(&a);
        if (kb) {
            OPC(cudaMalloc((void **)&dk, kb));
            a.kpart = dk;
        }
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
    cudaFree(dk);
    free(hy);
    free(ht);
    return rc;
}

ENGINE_CU_TRACE_TU(gemm)
