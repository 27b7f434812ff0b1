/* AVX2 + FMA (+ F16C) dot products. Compiled with per-function target attributes so that the
 * file builds without -march flags; engine_quant_init only installs these after checking the
 * running CPU has the three features. Integer sums per block are exact (no int16 saturation:
 * the bounds are noted at each maddubs), so results differ from the scalar path only in the
 * order of float additions. */
#if defined(__x86_64__)
#include "cpu/quant_kernels.h"

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#define TARGET __attribute__((target("avx2,fma,f16c")))

/* Hardware f16 -> f32 (F16C): bit-identical to engine_fp16_to_fp32 (test_quant checks every
 * half), without its branches. */
TARGET static inline float h2f(uint16_t h) {
    return _cvtsh_ss(h);
}

TARGET static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Sum of the 32 products x[i] * y[i] of signed bytes, as 8 int32 lanes. maddubs needs an
 * unsigned operand: |x| and y * sign(x). |x| <= 128 and our activations stay in [-127, 127],
 * so each int16 pair sum is at most 2 * 128 * 127 < 32767. */
TARGET static inline __m256i dot_i8(__m256i x, __m256i y) {
    const __m256i ax = _mm256_sign_epi8(x, x);
    const __m256i sy = _mm256_sign_epi8(y, x);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
}

TARGET static inline __m256 load_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

TARGET static inline __m256 load_bf16(const uint16_t *p) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

enum { W_F32, W_F16, W_BF16 };

/* Eight weights of the given kind (a compile-time constant after inlining), as floats. */
TARGET __attribute__((always_inline)) static inline __m256 load_w(const void *w, int i, int kind) {
    if (kind == W_F32) return _mm256_loadu_ps((const float *)w + i);
    if (kind == W_F16) return load_f16((const uint16_t *)w + i);
    return load_bf16((const uint16_t *)w + i);
}

TARGET __attribute__((always_inline)) static inline float w_at(const void *w, int i, int kind) {
    if (kind == W_F32) return ((const float *)w)[i];
    if (kind == W_F16) return h2f(((const uint16_t *)w)[i]);
    return engine_bf16_to_fp32(((const uint16_t *)w)[i]);
}

TARGET __attribute__((always_inline)) static inline float dot_float_avx2(int n, const void *w,
                                                                         const float *b, int kind) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm256_fmadd_ps(load_w(w, i, kind), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(load_w(w, i + 8, kind), _mm256_loadu_ps(b + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(load_w(w, i + 16, kind), _mm256_loadu_ps(b + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(load_w(w, i + 24, kind), _mm256_loadu_ps(b + i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(load_w(w, i, kind), _mm256_loadu_ps(b + i), acc0);
    float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++)
        s += w_at(w, i, kind) * b[i];
    return s;
}

TARGET static float vec_dot_f32_avx2(int n, const void *w, const void *x) {
    return dot_float_avx2(n, w, x, W_F32);
}

TARGET static float vec_dot_f16_avx2(int n, const void *w, const void *x) {
    return dot_float_avx2(n, w, x, W_F16);
}

TARGET static float vec_dot_bf16_avx2(int n, const void *w, const void *x) {
    return dot_float_avx2(n, w, x, W_BF16);
}

TARGET static float vec_dot_q8_0_avx2(int n, const void *w, const void *x) {
    const engine_block_q8_0 *a = w, *b = x;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / 32; i++) {
        const __m256 d = _mm256_set1_ps(h2f(a[i].d) * h2f(b[i].d));
        const __m256i qa = _mm256_loadu_si256((const __m256i *)a[i].qs);
        const __m256i qb = _mm256_loadu_si256((const __m256i *)b[i].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(qa, qb)), acc);
    }
    return hsum_ps(acc);
}

TARGET static float vec_dot_q4_0_avx2(int n, const void *w, const void *x) {
    const engine_block_q4_0 *a = w;
    const engine_block_q8_0 *b = x;
    const __m256i m4 = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / 32; i++) {
        const __m256 d = _mm256_set1_ps(h2f(a[i].d) * h2f(b[i].d));
        const __m128i raw = _mm_loadu_si128((const __m128i *)a[i].qs);
        /* low nibbles are values 0..15 (lower lane), high nibbles 16..31 (upper lane) */
        __m256i q = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
        q = _mm256_sub_epi8(_mm256_and_si256(q, m4), eight);
        const __m256i qb = _mm256_loadu_si256((const __m256i *)b[i].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(q, qb)), acc);
    }
    return hsum_ps(acc);
}

/* Sum over a K-quant block of m[j] * (bsums[2j] + bsums[2j+1]). */
static inline int k_mins(const uint8_t m[8], const int16_t bsums[16]) {
    int s = 0;
    for (int j = 0; j < 8; j++)
        s += m[j] * (bsums[2 * j] + bsums[2 * j + 1]);
    return s;
}

/* Q4_K / Q5_K share d, dmin and scales at the start of the block; qh_off < 0 means no fifth
 * bit (Q4_K). Each maddubs pairs unsigned q <= 31 with |y| <= 127: at most 7874 per int16. */
TARGET __attribute__((always_inline)) static inline float dot_k45_avx2(int n, const uint8_t *w,
                                                                       const engine_block_q8_K *b,
                                                                       size_t bsize, size_t qs_off,
                                                                       long qh_off) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    float accm = 0.0f;
    for (int i = 0; i < n / ENGINE_QK_K; i++, w += bsize) {
        uint16_t dh, mh;
        memcpy(&dh, w, 2);
        memcpy(&mh, w + 2, 2);
        uint8_t sc[8], m[8];
        engine_quant_unpack_k4(w + 4, sc, m);
        const __m256i qh = qh_off >= 0 ? _mm256_loadu_si256((const __m256i *)(w + qh_off))
                                       : _mm256_setzero_si256();
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(w + qs_off + 32 * c));
            __m256i lo = _mm256_and_si256(q, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if (qh_off >= 0) {
                /* bit 2c (2c+1) of each qh byte is the fifth bit of sub-block 2c (2c+1); the
                 * mask after the 16-bit shift keeps each byte's own bit. */
                const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one);
                const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(h0, 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(h1, 4));
            }
            const __m256i y0 = _mm256_loadu_si256((const __m256i *)(b[i].qs + 64 * c));
            const __m256i y1 = _mm256_loadu_si256((const __m256i *)(b[i].qs + 64 * c + 32));
            const __m256i p0 =
                _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), _mm256_set1_epi16(sc[2 * c]));
            const __m256i p1 =
                _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1), _mm256_set1_epi16(sc[2 * c + 1]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        const float d = h2f(dh) * b[i].d, dmin = h2f(mh) * b[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        accm += dmin * (float)k_mins(m, b[i].bsums);
    }
    return hsum_ps(acc) - accm;
}

TARGET static float vec_dot_q4_K_avx2(int n, const void *w, const void *x) {
    return dot_k45_avx2(n, w, x, sizeof(engine_block_q4_K), offsetof(engine_block_q4_K, qs), -1);
}

TARGET static float vec_dot_q5_K_avx2(int n, const void *w, const void *x) {
    return dot_k45_avx2(n, w, x, sizeof(engine_block_q5_K), offsetof(engine_block_q5_K, qs),
                        (long)offsetof(engine_block_q5_K, qh));
}

/* Q6_K: q in [0, 63] unsigned against |y| <= 127: at most 16002 per int16 pair; the -32 offset
 * is applied once per block through the activation's group sums. */
TARGET static float vec_dot_q6_K_avx2(int n, const void *w, const void *x) {
    const engine_block_q6_K *a = w;
    const engine_block_q8_K *b = x;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / ENGINE_QK_K; i++) {
        const int8_t *sc = a[i].scales;
        int offset = 0;
        for (int g = 0; g < 16; g++)
            offset += sc[g] * b[i].bsums[g];
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 2; c++) {
            const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(a[i].ql + 64 * c));
            const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(a[i].ql + 64 * c + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(a[i].qh + 32 * c));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
            q[1] = _mm256_or_si256(
                _mm256_and_si256(ql1, m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
            q[2] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
            q[3] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
            for (int k = 0; k < 4; k++) {
                const __m256i y = _mm256_loadu_si256((const __m256i *)(b[i].qs + 128 * c + 32 * k));
                /* lower lane: values 0..15 of this group (scale 2k), upper: 16..31 (2k+1) */
                const __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[8 * c + 2 * k + 1]),
                                                   _mm_set1_epi16(sc[8 * c + 2 * k]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], y), s));
            }
        }
        const float d = h2f(a[i].d) * b[i].d;
        /* lanes hold partial sums; the offset goes into lane 0 */
        sumi = _mm256_sub_epi32(sumi, _mm256_setr_epi32(32 * offset, 0, 0, 0, 0, 0, 0, 0));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps(acc);
}

void engine_quant_fill_avx2(engine_vec_dot_fn table[ENGINE_TYPE_COUNT]) {
    table[ENGINE_TYPE_F32] = vec_dot_f32_avx2;
    table[ENGINE_TYPE_F16] = vec_dot_f16_avx2;
    table[ENGINE_TYPE_BF16] = vec_dot_bf16_avx2;
    table[ENGINE_TYPE_Q8_0] = vec_dot_q8_0_avx2;
    table[ENGINE_TYPE_Q4_0] = vec_dot_q4_0_avx2;
    table[ENGINE_TYPE_Q4_K] = vec_dot_q4_K_avx2;
    table[ENGINE_TYPE_Q5_K] = vec_dot_q5_K_avx2;
    table[ENGINE_TYPE_Q6_K] = vec_dot_q6_K_avx2;
}
#else
/* ISO C forbids an empty translation unit. */
typedef int engine_quant_avx2_unused;
#endif
