/* NEON dot products for arm64 (NEON is mandatory there, so no run-time check is needed).
 * Baseline ARMv8.0 instructions only (no dotprod/i8mm), kept close to the scalar code: per
 * block exact integer sums through widening multiplies (|q * y| <= 128 * 127 fits int16),
 * float accumulation across blocks. */
#if defined(__aarch64__)
#include "cpu/quant_kernels.h"

#include <arm_neon.h>
#include <stddef.h>
#include <string.h>

/* Sum of 16 products of signed bytes. */
static inline int32x4_t dot_i8x16(int8x16_t a, int8x16_t b) {
    const int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    const int16x8_t hi = vmull_high_s8(a, b);
    return vaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi));
}

static inline int dot_i8x32(const int8_t *a, const int8_t *b) {
    const int32x4_t s = vaddq_s32(dot_i8x16(vld1q_s8(a), vld1q_s8(b)),
                                  dot_i8x16(vld1q_s8(a + 16), vld1q_s8(b + 16)));
    return vaddvq_s32(s);
}

static float vec_dot_f32_neon(int n, const void *w, const void *x) {
    const float *a = w, *b = x;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), vld1q_f32(b + i));
        acc1 = vfmaq_f32(acc1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        acc2 = vfmaq_f32(acc2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        acc3 = vfmaq_f32(acc3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    for (; i + 4 <= n; i += 4)
        acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), vld1q_f32(b + i));
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc0, acc1), vaddq_f32(acc2, acc3)));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static inline float32x4_t load_f16x4(const uint16_t *p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}

static inline float32x4_t load_bf16x4(const uint16_t *p) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}

/* f16 (bf == false) or bf16 weights against f32 activations. */
static inline float dot_half_neon(int n, const uint16_t *a, const float *b, bool bf) {
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const float32x4_t w0 = bf ? load_bf16x4(a + i) : load_f16x4(a + i);
        const float32x4_t w1 = bf ? load_bf16x4(a + i + 4) : load_f16x4(a + i + 4);
        acc0 = vfmaq_f32(acc0, w0, vld1q_f32(b + i));
        acc1 = vfmaq_f32(acc1, w1, vld1q_f32(b + i + 4));
    }
    float s = vaddvq_f32(vaddq_f32(acc0, acc1));
    for (; i < n; i++)
        s += (bf ? engine_bf16_to_fp32(a[i]) : engine_fp16_to_fp32(a[i])) * b[i];
    return s;
}

static float vec_dot_f16_neon(int n, const void *w, const void *x) {
    return dot_half_neon(n, w, x, false);
}

static float vec_dot_bf16_neon(int n, const void *w, const void *x) {
    return dot_half_neon(n, w, x, true);
}

static float vec_dot_q8_0_neon(int n, const void *w, const void *x) {
    const engine_block_q8_0 *a = w, *b = x;
    float s = 0.0f;
    for (int i = 0; i < n / 32; i++)
        s += engine_fp16_to_fp32(a[i].d) * engine_fp16_to_fp32(b[i].d) *
             (float)dot_i8x32(a[i].qs, b[i].qs);
    return s;
}

static float vec_dot_q4_0_neon(int n, const void *w, const void *x) {
    const engine_block_q4_0 *a = w;
    const engine_block_q8_0 *b = x;
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    const int8x16_t eight = vdupq_n_s8(8);
    float s = 0.0f;
    for (int i = 0; i < n / 32; i++) {
        const uint8x16_t raw = vld1q_u8(a[i].qs);
        const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, m4)), eight);
        const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), eight);
        const int32x4_t p =
            vaddq_s32(dot_i8x16(lo, vld1q_s8(b[i].qs)), dot_i8x16(hi, vld1q_s8(b[i].qs + 16)));
        s += engine_fp16_to_fp32(a[i].d) * engine_fp16_to_fp32(b[i].d) * (float)vaddvq_s32(p);
    }
    return s;
}

/* 32 unsigned 4/5/6-bit values (as int8) dotted with 32 activations. */
static inline int dot_u8x32(uint8x16_t q0, uint8x16_t q1, const int8_t *y) {
    const int32x4_t p = vaddq_s32(dot_i8x16(vreinterpretq_s8_u8(q0), vld1q_s8(y)),
                                  dot_i8x16(vreinterpretq_s8_u8(q1), vld1q_s8(y + 16)));
    return vaddvq_s32(p);
}

/* Q4_K / Q5_K share d, dmin and scales at the start of the block; qh_off < 0: no fifth bit. */
static inline float dot_k45_neon(int n, const uint8_t *w, const engine_block_q8_K *b, size_t bsize,
                                 size_t qs_off, long qh_off) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F), one = vdupq_n_u8(1);
    float s = 0.0f;
    for (int i = 0; i < n / ENGINE_QK_K; i++, w += bsize) {
        uint16_t dh, mh;
        memcpy(&dh, w, 2);
        memcpy(&mh, w + 2, 2);
        uint8_t scs[8], ms[8];
        engine_quant_unpack_k4(w + 4, scs, ms);
        const uint8x16_t h0 = qh_off >= 0 ? vld1q_u8(w + qh_off) : vdupq_n_u8(0);
        const uint8x16_t h1 = qh_off >= 0 ? vld1q_u8(w + qh_off + 16) : vdupq_n_u8(0);
        int sumi = 0, summ = 0;
        for (int c = 0; c < 4; c++) {
            const uint8x16_t q0 = vld1q_u8(w + qs_off + 32 * c);
            const uint8x16_t q1 = vld1q_u8(w + qs_off + 32 * c + 16);
            uint8x16_t lo0 = vandq_u8(q0, m4), lo1 = vandq_u8(q1, m4);
            uint8x16_t hi0 = vshrq_n_u8(q0, 4), hi1 = vshrq_n_u8(q1, 4);
            if (qh_off >= 0) { /* bit 2c / 2c+1 of qh[l] is the fifth bit */
                const int8x16_t shl = vdupq_n_s8((int8_t) - (2 * c));
                const int8x16_t shh = vdupq_n_s8((int8_t) - (2 * c + 1));
                lo0 = vorrq_u8(lo0, vshlq_n_u8(vandq_u8(vshlq_u8(h0, shl), one), 4));
                lo1 = vorrq_u8(lo1, vshlq_n_u8(vandq_u8(vshlq_u8(h1, shl), one), 4));
                hi0 = vorrq_u8(hi0, vshlq_n_u8(vandq_u8(vshlq_u8(h0, shh), one), 4));
                hi1 = vorrq_u8(hi1, vshlq_n_u8(vandq_u8(vshlq_u8(h1, shh), one), 4));
            }
            const int8_t *y = b[i].qs + 64 * c;
            sumi += scs[2 * c] * dot_u8x32(lo0, lo1, y);
            sumi += scs[2 * c + 1] * dot_u8x32(hi0, hi1, y + 32);
            summ += ms[2 * c] * (b[i].bsums[4 * c] + b[i].bsums[4 * c + 1]);
            summ += ms[2 * c + 1] * (b[i].bsums[4 * c + 2] + b[i].bsums[4 * c + 3]);
        }
        const float d = engine_fp16_to_fp32(dh) * b[i].d, dmin = engine_fp16_to_fp32(mh) * b[i].d;
        s += d * (float)sumi - dmin * (float)summ;
    }
    return s;
}

static float vec_dot_q4_K_neon(int n, const void *w, const void *x) {
    return dot_k45_neon(n, w, x, sizeof(engine_block_q4_K), offsetof(engine_block_q4_K, qs), -1);
}

static float vec_dot_q5_K_neon(int n, const void *w, const void *x) {
    return dot_k45_neon(n, w, x, sizeof(engine_block_q5_K), offsetof(engine_block_q5_K, qs),
                        (long)offsetof(engine_block_q5_K, qh));
}

/* Sum of 16 products of unsigned 6-bit values (as int8) with activations. */
static inline int dot_u8x16(uint8x16_t q, const int8_t *y) {
    return vaddvq_s32(dot_i8x16(vreinterpretq_s8_u8(q), vld1q_s8(y)));
}

static float vec_dot_q6_K_neon(int n, const void *w, const void *x) {
    const engine_block_q6_K *a = w;
    const engine_block_q8_K *b = x;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m2 = vdupq_n_u8(3);
    float s = 0.0f;
    for (int i = 0; i < n / ENGINE_QK_K; i++) {
        const int8_t *sc = a[i].scales;
        int sumi = 0;
        for (int g = 0; g < 16; g++)
            sumi -= 32 * sc[g] * b[i].bsums[g];
        for (int c = 0; c < 2; c++) {
            const uint8_t *ql = a[i].ql + 64 * c, *qhp = a[i].qh + 32 * c;
            const int8_t *y = b[i].qs + 128 * c;
            for (int half = 0; half < 2; half++) { /* l in [16*half, 16*half + 16) */
                const uint8x16_t l0 = vld1q_u8(ql + 16 * half), l1 = vld1q_u8(ql + 32 + 16 * half);
                const uint8x16_t qh = vld1q_u8(qhp + 16 * half);
                const uint8x16_t q1 = vorrq_u8(vandq_u8(l0, m4), vshlq_n_u8(vandq_u8(qh, m2), 4));
                const uint8x16_t q2 =
                    vorrq_u8(vandq_u8(l1, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(qh, 2), m2), 4));
                const uint8x16_t q3 =
                    vorrq_u8(vshrq_n_u8(l0, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(qh, 4), m2), 4));
                const uint8x16_t q4 = vorrq_u8(vshrq_n_u8(l1, 4), vshlq_n_u8(vshrq_n_u8(qh, 6), 4));
                const int8_t *s8 = sc + 8 * c + half;
                sumi += s8[0] * dot_u8x16(q1, y + 16 * half);
                sumi += s8[2] * dot_u8x16(q2, y + 32 + 16 * half);
                sumi += s8[4] * dot_u8x16(q3, y + 64 + 16 * half);
                sumi += s8[6] * dot_u8x16(q4, y + 96 + 16 * half);
            }
        }
        s += engine_fp16_to_fp32(a[i].d) * b[i].d * (float)sumi;
    }
    return s;
}

void engine_quant_fill_neon(engine_vec_dot_fn table[ENGINE_TYPE_COUNT]) {
    table[ENGINE_TYPE_F32] = vec_dot_f32_neon;
    table[ENGINE_TYPE_F16] = vec_dot_f16_neon;
    table[ENGINE_TYPE_BF16] = vec_dot_bf16_neon;
    table[ENGINE_TYPE_Q8_0] = vec_dot_q8_0_neon;
    table[ENGINE_TYPE_Q4_0] = vec_dot_q4_0_neon;
    table[ENGINE_TYPE_Q4_K] = vec_dot_q4_K_neon;
    table[ENGINE_TYPE_Q5_K] = vec_dot_q5_K_neon;
    table[ENGINE_TYPE_Q6_K] = vec_dot_q6_K_neon;
}
#else
typedef int engine_quant_neon_unused;
#endif
