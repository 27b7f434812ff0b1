/* Device-side decoding of weight rows, shared by the matrix-vector, MoE and embedding kernels.
 *
 * Every supported type is read in "chunks" of 32 values: chunk c of a row decodes into two runs
 * of 16 values, run A at columns a0..a0+15 and run B at b0..b0+15 (chunk_cols gives a0, b0).
 * The runs follow the block layouts of engine/cpu/quant.h so that one chunk is a contiguous
 * piece of the row's bytes (coalesced when the 32 lanes of a warp take consecutive chunks):
 *   Q4_0, Q8_0     one block of 32 values: A = values 0..15, B = 16..31
 *   Q4_K, Q5_K     16 bytes of nibbles: low nibbles = sub-block 2j, high = sub-block 2j+1
 *   Q6_K           16 bytes of ql: low nibbles = values l, high = l + 64 of a 128-value half
 *   F32, F16, BF16 32 consecutive values
 * Decoding is exact: the same products (d * sc) * q - dmin * m as the CPU's dequantisation, in
 * F32, so a decoded value equals engine_dequantize_row's bit for bit. */
#ifndef SPARK_ENGINE_CUDA_DEQUANT_CUH
#define SPARK_ENGINE_CUDA_DEQUANT_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "common.cuh"

extern "C" {
#include "model/gguf.h" /* engine_type */
}

__device__ __forceinline__ float engine_cu_h2f(uint16_t h) {
    return __half2float(__ushort_as_half(h));
}

__device__ __forceinline__ float engine_cu_bf2f(uint16_t h) {
    return __uint_as_float((uint32_t)h << 16);
}

/* Bytes of 16 consecutive bytes at a 2-byte-aligned address, as four words. */
__device__ __forceinline__ void engine_cu_load16_a2(const uint8_t *p, uint32_t w[4]) {
    const uint16_t *h = (const uint16_t *)p;
#pragma unroll
    for (int i = 0; i < 4; i++)
        w[i] = (uint32_t)__ldg(h + 2 * i) | ((uint32_t)__ldg(h + 2 * i + 1) << 16);
}

__device__ __forceinline__ void engine_cu_load16_a16(const uint8_t *p, uint32_t w[4]) {
    uint4 v = __ldg((const uint4 *)p);
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
}

__device__ __forceinline__ int engine_cu_byte(const uint32_t w[4], int i) {
    return (int)((w[i >> 2] >> (8 * (i & 3))) & 0xffu);
}

/* (scale, min) j of a K-quant's 12 packed bytes, as engine_quant_scale_min_k4. */
__device__ __forceinline__ void engine_cu_scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* The pairs (scale, min) 2 j and 2 j + 1 (j < 4: the two sub-blocks of a 64-value run) from the
 * 12 bytes held as three words (no local array: j is a run-time value), as engine_cu_scale_min_k4
 * gives them. Without a branch: the lanes of a warp take runs on both sides of j = 2 (a lane's
 * chunk c has j = (c & 7) >> 1), so a branch ran both paths on every chunk (session 19 call 1:
 * the branch s18-k4-sel, the select a value at a time and the grid launch's routing on 4
 * experts a lane, 533.3 against 498.8 tok/s, Qwen3-30B-A3B Q4_K_M tg128, H200). Both pairs in one
 * pass: their bytes sit side by side at the same shift of each word and on the same side of 4, so
 * one shift a word and one select a value pair. The same integers (checked on the host against
 * engine_cu_scale_min_k4 for every j over 16M random and all repeated-byte words). */
__device__ __forceinline__ void engine_cu_scale_min_k4w2(int j, uint32_t w0, uint32_t w1,
                                                         uint32_t w2, int sc[2], int m[2]) {
    const int s = 16 * (j & 1);
    const uint32_t b0 = w0 >> s, b1 = w1 >> s, b2 = w2 >> s;
    const bool hi = j >= 2;
    const uint32_t scp = hi ? (b2 & 0x0F0Fu) | ((b0 >> 2) & 0x3030u) : b0 & 0x3F3Fu;
    const uint32_t mp = hi ? ((b2 >> 4) & 0x0F0Fu) | ((b1 >> 2) & 0x3030u) : b1 & 0x3F3Fu;
    sc[0] = (int)(scp & 0xFFu);
    sc[1] = (int)(scp >> 8);
    m[0] = (int)(mp & 0xFFu);
    m[1] = (int)(mp >> 8);
}

/* Q6_K rows repacked for coalesced loads (an internal type, never in a file: the copy of the
 * output head that the decode and MTP head launches read, engine_cu_q6r_repack in matvec.cuh).
 * A row's chunks (Q6_K's chunk numbering and columns) go in groups of 64, eight superblocks,
 * 1680 bytes like Q6_K's eight; the row's last group holds the G <= 64 chunks left. Rows start
 * 16-byte aligned (the copy's row stride is rounded up to 16). Chunk k of a group of G keeps
 *   at 16 k:            its 16 ql bytes as Q6_K has them (low nibbles run A, high nibbles run B);
 *   at 16 G + 8 k:      its 32 two-bit high parts, a nibble per ql byte i (bits 0-1 run A's,
 *                       bits 2-3 run B's), byte j of word 0 holding those of bytes i = j and
 *                       j + 4 (low, high nibble), word 1 those of bytes 8 + j and 12 + j;
 *   at 24 G + 2 k:      its two int8 scales (run A's, run B's);
 *   at 26 G + 2 (k / 8): its superblock's F16 d.
 * So the 32 lanes of a warp taking consecutive chunks load 512, 256, 64 and 8 consecutive
 * bytes, four loads a lane, where Q6_K's 2-byte-aligned superblocks take thirteen. */
/* (ENGINE_CU_TYPE_Q6_KR and ENGINE_CU_Q6R_GROUP: common.cuh) */

/* Where chunk c of a Q6_KR row of n_chunks chunks keeps its ql bytes, high parts, scales and
 * d (byte offsets from the row). */
__host__ __device__ __forceinline__ void engine_cu_q6r_at(int c, int n_chunks, size_t *ql,
                                                          size_t *qh, size_t *sc, size_t *d) {
    const int k = c & 63, rest = n_chunks - (c & ~63), G = rest < 64 ? rest : 64;
    const size_t g = (size_t)(c >> 6) * ENGINE_CU_Q6R_GROUP;
    *ql = g + 16 * (size_t)k;
    *qh = g + 16 * (size_t)G + 8 * (size_t)k;
    *sc = g + 24 * (size_t)G + 2 * (size_t)k;
    *d = g + 26 * (size_t)G + 2 * (size_t)(k >> 3);
}

/* A Q6_KR chunk's 6-bit values (Q6_K's q, before the - 32), four a word: run A into lo, run B
 * into hi, from its ql words and its two words of high parts. */
__device__ __forceinline__ void engine_cu_q6r_unpack(const uint32_t ql[4], uint32_t u0, uint32_t u1,
                                                     uint32_t lo[4], uint32_t hi[4]) {
    lo[0] = (ql[0] & 0x0F0F0F0Fu) | ((u0 & 0x03030303u) << 4);
    hi[0] = ((ql[0] >> 4) & 0x0F0F0F0Fu) | ((u0 & 0x0C0C0C0Cu) << 2);
    lo[1] = (ql[1] & 0x0F0F0F0Fu) | (u0 & 0x30303030u);
    hi[1] = ((ql[1] >> 4) & 0x0F0F0F0Fu) | ((u0 >> 2) & 0x30303030u);
    lo[2] = (ql[2] & 0x0F0F0F0Fu) | ((u1 & 0x03030303u) << 4);
    hi[2] = ((ql[2] >> 4) & 0x0F0F0F0Fu) | ((u1 & 0x0C0C0C0Cu) << 2);
    lo[3] = (ql[3] & 0x0F0F0F0Fu) | (u1 & 0x30303030u);
    hi[3] = ((ql[3] >> 4) & 0x0F0F0F0Fu) | ((u1 >> 2) & 0x30303030u);
}

/* Columns of chunk c's two runs. */
__device__ __forceinline__ void engine_cu_chunk_cols(int type, int c, int *a0, int *b0) {
    switch (type) {
    case ENGINE_TYPE_Q4_K:
    case ENGINE_TYPE_Q5_K: {
        int sb = c >> 3, q = c & 7, j = q >> 1, half = q & 1;
        *a0 = 256 * sb + 64 * j + 16 * half;
        *b0 = *a0 + 32;
        break;
    }
    case ENGINE_TYPE_Q6_K:
    case ENGINE_CU_TYPE_Q6_KR: {
        int sb = c >> 3, q = c & 7, hh = q >> 2, r = q & 3, w = r >> 1, l0 = 16 * (r & 1);
        *a0 = 256 * sb + 128 * hh + 32 * w + l0;
        *b0 = *a0 + 64;
        break;
    }
    default:
        *a0 = 32 * c;
        *b0 = *a0 + 16;
        break;
    }
}

/* Decode chunk c of `row` (type `type`) into va[16] (run A) and vb[16] (run B). */
__device__ __forceinline__ void engine_cu_decode_chunk(int type, const uint8_t *row, int c,
                                                       float va[16], float vb[16]) {
    switch (type) {
    case ENGINE_TYPE_Q4_K:
    case ENGINE_TYPE_Q5_K: {
        const bool q5 = type == ENGINE_TYPE_Q5_K;
        const uint8_t *b = row + (size_t)(c >> 3) * (q5 ? 176 : 144);
        int q = c & 7, j = q >> 1, half = q & 1;
        float d = engine_cu_h2f(__ldg((const uint16_t *)b));
        float dmin = engine_cu_h2f(__ldg((const uint16_t *)b + 1));
        const uint32_t w0 = __ldg((const uint32_t *)(b + 4)), w1 = __ldg((const uint32_t *)(b + 8)),
                       w2 = __ldg((const uint32_t *)(b + 12));
        int sc[2], m[2];
        engine_cu_scale_min_k4w2(j, w0, w1, w2, sc, m);
        float d1 = d * (float)sc[0], m1 = dmin * (float)m[0];
        float d2 = d * (float)sc[1], m2 = dmin * (float)m[1];
        uint32_t qs[4];
        engine_cu_load16_a16(b + (q5 ? 48 : 16) + 32 * j + 16 * half, qs);
        if (!q5) {
#pragma unroll
            for (int l = 0; l < 16; l++) {
                int v = engine_cu_byte(qs, l);
                va[l] = d1 * (float)(v & 0xF) - m1;
                vb[l] = d2 * (float)(v >> 4) - m2;
            }
        } else {
            uint32_t qh[4];
            engine_cu_load16_a16(b + 16 + 16 * half, qh);
            int u1 = 1 << (2 * j), u2 = 2 << (2 * j);
#pragma unroll
            for (int l = 0; l < 16; l++) {
                int v = engine_cu_byte(qs, l), h = engine_cu_byte(qh, l);
                va[l] = d1 * (float)((v & 0xF) + (h & u1 ? 16 : 0)) - m1;
                vb[l] = d2 * (float)((v >> 4) + (h & u2 ? 16 : 0)) - m2;
            }
        }
        break;
    }
    case ENGINE_TYPE_Q6_K: {
        const uint8_t *b = row + (size_t)(c >> 3) * 210;
        int q = c & 7, hh = q >> 2, r = q & 3, w = r >> 1, l0 = 16 * (r & 1);
        float d = engine_cu_h2f(__ldg((const uint16_t *)(b + 208)));
        uint32_t ql[4], qh[4];
        engine_cu_load16_a2(b + 64 * hh + 32 * w + l0, ql);
        engine_cu_load16_a2(b + 128 + 32 * hh + l0, qh);
        const int8_t *sc = (const int8_t *)(b + 192 + 8 * hh + (l0 >> 4));
        float da = d * (float)sc[2 * w], db = d * (float)sc[4 + 2 * w];
        int sa = 2 * w, sb = 4 + 2 * w;
#pragma unroll
        for (int l = 0; l < 16; l++) {
            int v = engine_cu_byte(ql, l), h = engine_cu_byte(qh, l);
            va[l] = da * (float)(((v & 0xF) | (((h >> sa) & 3) << 4)) - 32);
            vb[l] = db * (float)(((v >> 4) | (((h >> sb) & 3) << 4)) - 32);
        }
        break;
    }
    case ENGINE_TYPE_Q8_0: {
        const uint8_t *b = row + (size_t)c * 34;
        float d = engine_cu_h2f(__ldg((const uint16_t *)b));
        uint32_t x0[4], x1[4];
        engine_cu_load16_a2(b + 2, x0);
        engine_cu_load16_a2(b + 18, x1);
#pragma unroll
        for (int l = 0; l < 16; l++) {
            va[l] = (float)(int8_t)engine_cu_byte(x0, l) * d;
            vb[l] = (float)(int8_t)engine_cu_byte(x1, l) * d;
        }
        break;
    }
    case ENGINE_TYPE_Q4_0: {
        const uint8_t *b = row + (size_t)c * 18;
        float d = engine_cu_h2f(__ldg((const uint16_t *)b));
        uint32_t x0[4];
        engine_cu_load16_a2(b + 2, x0);
#pragma unroll
        for (int l = 0; l < 16; l++) {
            int v = engine_cu_byte(x0, l);
            va[l] = (float)((v & 0xF) - 8) * d;
            vb[l] = (float)((v >> 4) - 8) * d;
        }
        break;
    }
    case ENGINE_TYPE_F16:
    case ENGINE_TYPE_BF16: {
        const uint4 *p = (const uint4 *)(row + (size_t)c * 64);
        bool bf = type == ENGINE_TYPE_BF16;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint4 v = __ldg(p + k);
            uint32_t u[4] = {v.x, v.y, v.z, v.w};
            float *dst = k < 2 ? va + 8 * k : vb + 8 * (k - 2);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                uint16_t lo = (uint16_t)(u[i] & 0xffffu), hi = (uint16_t)(u[i] >> 16);
                dst[2 * i] = bf ? engine_cu_bf2f(lo) : engine_cu_h2f(lo);
                dst[2 * i + 1] = bf ? engine_cu_bf2f(hi) : engine_cu_h2f(hi);
            }
        }
        break;
    }
    default: { /* F32 (the only other type the upload accepts) */
        const float4 *p = (const float4 *)(row + (size_t)c * 128);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float4 v = __ldg(p + k);
            float *dst = k < 4 ? va + 4 * k : vb + 4 * (k - 4);
            dst[0] = v.x;
            dst[1] = v.y;
            dst[2] = v.z;
            dst[3] = v.w;
        }
        break;
    }
    }
}

/* The RMSNorm scale 1 / sqrt(mean(x^2) + eps) of x[0..n), computed by the whole block (every
 * thread gets it; synchronises). `red`: 32 floats of shared scratch. */
__device__ __forceinline__ float engine_cu_rms_scale(const float *x, int n, float eps, float *red) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = x[i];
        ss += v * v;
    }
    ss = engine_cu_block_sum(ss, red);
    return 1.0f / sqrtf(ss / (float)n + eps);
}

/* 1 / sqrt(mean(x^2) + eps) computed by one warp (every lane gets it; no block sync, so the
 * weight loads of the warp need not wait for it). */
__device__ __forceinline__ float engine_cu_warp_rms_scale(const float *x, int n, float eps) {
    float ss = 0.0f;
    const float4 *p = (const float4 *)x;
    for (int i = threadIdx.x & 31; i < (n >> 2); i += 32) {
        float4 v = p[i];
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    ss = engine_cu_warp_sum(ss);
    return 1.0f / sqrtf(ss / (float)n + eps);
}

/* The 16 activations of one run starting at column a0, normalised when nw != NULL exactly as
 * engine_cpu_rmsnorm: nw[i] * (x[i] * scale). */
__device__ __forceinline__ void engine_cu_load_run(const float *x, const float *nw, float scale,
                                                   int a0, float v[16]) {
    const float4 *p = (const float4 *)(x + a0);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float4 t = p[k];
        v[4 * k] = t.x;
        v[4 * k + 1] = t.y;
        v[4 * k + 2] = t.z;
        v[4 * k + 3] = t.w;
    }
    if (nw) {
        const float4 *q = (const float4 *)(nw + a0);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float4 t = __ldg(q + k);
            v[4 * k] = t.x * (v[4 * k] * scale);
            v[4 * k + 1] = t.y * (v[4 * k + 1] * scale);
            v[4 * k + 2] = t.z * (v[4 * k + 2] * scale);
            v[4 * k + 3] = t.w * (v[4 * k + 3] * scale);
        }
    }
}

/* sum va*xa + vb*xb */
__device__ __forceinline__ float engine_cu_dot32(const float va[16], const float vb[16],
                                                 const float xa[16], const float xb[16]) {
    float s = 0.0f;
#pragma unroll
    for (int l = 0; l < 16; l++)
        s = fmaf(va[l], xa[l], s);
#pragma unroll
    for (int l = 0; l < 16; l++)
        s = fmaf(vb[l], xb[l], s);
    return s;
}

#endif
