/* Tensor types: half conversions, bit-exact dequantisation of hand-built blocks (expected
 * values computed here from the published layouts, chosen so every product is exact in float),
 * quantize -> dequantize error bounds, and every dot-product path against a double-precision
 * reference and against each other. */
#include "cpu/quant.h"
#include "cpu/quant_kernels.h"
#include "engine.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

static int failures;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

/* Deterministic random numbers (xorshift64*), independent of libc. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd_u64(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}
static float rnd_unit(void) { /* [0, 1) */
    return (float)(rnd_u64() >> 40) / (float)(1 << 24);
}
static float rnd_normal(void) {
    float u = rnd_unit(), v = rnd_unit();
    if (u < 1e-7f) u = 1e-7f;
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

/* ---------------------------------------------------------------------------------------------
 * Half conversions
 * ------------------------------------------------------------------------------------------- */
#if defined(__x86_64__)
__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f) {
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
__attribute__((target("f16c"))) static float hw_f16_to_f32(uint16_t h) {
    return _cvtsh_ss(h);
}
#endif

static void test_half(void) {
    /* Every half value survives a round trip (NaNs stay NaNs). */
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = engine_fp16_to_fp32((uint16_t)h);
        const uint16_t back = engine_fp32_to_fp16(f);
        if (isnan(f))
            CHECK(isnan(engine_fp16_to_fp32(back)), "nan %04x", h);
        else
            CHECK(back == h, "half %04x -> %g -> %04x", h, f, back);
    }
    /* Known values. */
    CHECK(engine_fp16_to_fp32(0x3c00) == 1.0f, "1.0");
    CHECK(engine_fp16_to_fp32(0xc000) == -2.0f, "-2.0");
    CHECK(engine_fp16_to_fp32(0x7bff) == 65504.0f, "max half");
    CHECK(engine_fp16_to_fp32(0x0001) == ldexpf(1.0f, -24), "smallest subnormal");
    CHECK(engine_fp16_to_fp32(0x03ff) == ldexpf(1023.0f, -24), "largest subnormal");
    CHECK(engine_fp32_to_fp16(65519.0f) == 0x7bff, "65519 rounds down");
    CHECK(engine_fp32_to_fp16(65520.0f) == 0x7c00, "65520 rounds to inf");
    CHECK(engine_fp32_to_fp16(ldexpf(1.0f, -25)) == 0x0000, "2^-25 ties to even zero");
    CHECK(engine_fp32_to_fp16(ldexpf(1.5f, -25)) == 0x0001, "1.5*2^-25 rounds up");
    CHECK(engine_fp32_to_fp16(1.0f + ldexpf(1.0f, -11)) == 0x3c00, "tie to even (down)");
    CHECK(engine_fp32_to_fp16(1.0f + 3 * ldexpf(1.0f, -11)) == 0x3c02, "tie to even (up)");
    /* bf16 */
    CHECK(engine_bf16_to_fp32(0x3f80) == 1.0f, "bf16 1.0");
    CHECK(engine_fp32_to_bf16(1.0f) == 0x3f80, "bf16 from 1.0");
    CHECK(engine_fp32_to_bf16(1.0f + ldexpf(1.0f, -8)) == 0x3f80, "bf16 tie to even");
    CHECK(engine_fp32_to_bf16(1.0f + 3 * ldexpf(1.0f, -8)) == 0x3f82, "bf16 tie up");
    CHECK(isnan(engine_bf16_to_fp32(engine_fp32_to_bf16(NAN))), "bf16 nan");
#if defined(__x86_64__)
    engine_cpu_info ci;
    engine_cpu_info_get(&ci);
    if (ci.f16c) {
        /* Against the hardware converter on every half and on random float bit patterns. */
        for (uint32_t h = 0; h < 65536; h++) {
            const float a = engine_fp16_to_fp32((uint16_t)h), b = hw_f16_to_f32((uint16_t)h);
            CHECK((isnan(a) && isnan(b)) || memcmp(&a, &b, 4) == 0, "f16->f32 %04x", h);
        }
        for (int i = 0; i < 2000000; i++) {
            uint32_t bits = (uint32_t)rnd_u64();
            if (i & 1) bits = (bits & 0x87ffffffu) | 0x30000000u; /* near the half range */
            float f;
            memcpy(&f, &bits, 4);
            const uint16_t a = engine_fp32_to_fp16(f), b = hw_f32_to_f16(f);
            if (isnan(f))
                CHECK((a & 0x7c00) == 0x7c00 && (a & 0x3ff), "nan %08x", bits);
            else
                CHECK(a == b, "f32 %08x (%g): %04x vs hardware %04x", bits, f, a, b);
        }
    } else {
        printf("note: no F16C on this CPU: half conversion checked against known values only\n");
    }
#endif
}

/* ---------------------------------------------------------------------------------------------
 * Bit-exact dequantisation of hand-built blocks
 * ------------------------------------------------------------------------------------------- */
/* Pack 8 six-bit scales and mins the way ggml's Q4_K/Q5_K store them: bytes 0-3 hold sc[0..3]
 * in their low 6 bits and bits 4-5 of sc[4..7] in their top 2; bytes 4-7 the same for the
 * mins; bytes 8-11 hold the low nibbles of sc[4..7] (low) and m[4..7] (high). */
static void pack_k_scales(const int sc[8], const int m[8], uint8_t out[12]) {
    for (int j = 0; j < 4; j++) {
        out[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        out[j + 4] = (uint8_t)(m[j] | ((m[j + 4] >> 4) << 6));
        out[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
}

static void expect_row(const char *what, engine_type t, const void *blocks, const float *want,
                       int n) {
    float got[512];
    CHECK(engine_dequantize_row(t, blocks, got, n) == 0, "%s: %s", what, engine_error_last());
    int bad = 0;
    for (int i = 0; i < n && bad < 5; i++)
        if (memcmp(&got[i], &want[i], 4) != 0) {
            CHECK(0, "%s[%d]: got %.9g want %.9g", what, i, got[i], want[i]);
            bad++;
        }
}

static void test_dequant_exact(void) {
    float want[512];
    { /* Q4_0: two blocks, d = 0.5 and -0.25 */
        engine_block_q4_0 b[2];
        const uint16_t ds[2] = {0x3800, 0xb400};
        const float dv[2] = {0.5f, -0.25f};
        for (int k = 0; k < 2; k++) {
            b[k].d = ds[k];
            for (int j = 0; j < 16; j++) {
                const int lo = (j + 3 * k) & 15, hi = (15 - j + k) & 15;
                b[k].qs[j] = (uint8_t)(lo | (hi << 4));
                want[32 * k + j] = (float)(lo - 8) * dv[k];
                want[32 * k + j + 16] = (float)(hi - 8) * dv[k];
            }
        }
        expect_row("q4_0", ENGINE_TYPE_Q4_0, b, want, 64);
    }
    { /* Q8_0: d = 0.25 */
        engine_block_q8_0 b[2];
        for (int k = 0; k < 2; k++) {
            b[k].d = k ? 0x3400 : 0x4000; /* 0.25, 2.0 */
            for (int j = 0; j < 32; j++) {
                b[k].qs[j] = (int8_t)(j * 7 - 100 + k * 9);
                want[32 * k + j] = (float)b[k].qs[j] * (k ? 0.25f : 2.0f);
            }
        }
        b[1].qs[5] = -128;
        want[32 + 5] = -32.0f;
        expect_row("q8_0", ENGINE_TYPE_Q8_0, b, want, 64);
    }
    { /* Q4_K: d = 1/8, dmin = 1/32; scales and mins >= 16 to exercise the high bits */
        engine_block_q4_K b;
        int sc[8], m[8], q[256];
        for (int j = 0; j < 8; j++) {
            sc[j] = 10 + 7 * j; /* 10 .. 59 */
            m[j] = 63 - 6 * j;  /* 63 .. 21 */
        }
        b.d = 0x3000;
        b.dmin = 0x2800;
        pack_k_scales(sc, m, b.scales);
        for (int p = 0; p < 256; p++)
            q[p] = (p * 7 + 3) & 15;
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                b.qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
        for (int p = 0; p < 256; p++)
            want[p] = (float)(0.125 * sc[p / 32] * q[p] - 0.03125 * m[p / 32]);
        expect_row("q4_K", ENGINE_TYPE_Q4_K, &b, want, 256);
    }
    { /* Q5_K: as Q4_K with a fifth bit per value in qh (bit j of qh[l] for value 32j + l) */
        engine_block_q5_K b;
        int sc[8], m[8], q[256];
        for (int j = 0; j < 8; j++) {
            sc[j] = 63 - 5 * j;
            m[j] = 5 + 8 * j;
        }
        b.d = 0x2c00;    /* 1/16 */
        b.dmin = 0x3400; /* 1/4 */
        pack_k_scales(sc, m, b.scales);
        for (int p = 0; p < 256; p++)
            q[p] = (p * 11 + 5) & 31;
        memset(b.qh, 0, sizeof b.qh);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                b.qs[32 * c + l] =
                    (uint8_t)((q[64 * c + l] & 15) | ((q[64 * c + 32 + l] & 15) << 4));
        for (int p = 0; p < 256; p++)
            b.qh[p % 32] |= (uint8_t)((q[p] >> 4) << (p / 32));
        for (int p = 0; p < 256; p++)
            want[p] = (float)(0.0625 * sc[p / 32] * q[p] - 0.25 * m[p / 32]);
        expect_row("q5_K", ENGINE_TYPE_Q5_K, &b, want, 256);
    }
    { /* Q6_K: per 128 values, ql[l] = low4(v[l]) | low4(v[l+64]) << 4,
       * ql[l+32] = low4(v[l+32]) | low4(v[l+96]) << 4, qh[l] = high2 of v[l], v[l+32], v[l+64],
       * v[l+96] at bits 0, 2, 4, 6; value = d * scale[p / 16] * (v - 32). */
        engine_block_q6_K b;
        int q[256];
        for (int j = 0; j < 16; j++)
            b.scales[j] = (int8_t)((j * 17) % 41 - 20);
        b.scales[3] = -128;
        b.scales[12] = 127;
        b.d = 0x2400; /* 1/64 */
        for (int p = 0; p < 256; p++)
            q[p] = (p * 13 + 1) & 63;
        for (int c = 0; c < 2; c++) {
            const int *v = q + 128 * c;
            for (int l = 0; l < 32; l++) {
                b.ql[64 * c + l] = (uint8_t)((v[l] & 15) | ((v[l + 64] & 15) << 4));
                b.ql[64 * c + l + 32] = (uint8_t)((v[l + 32] & 15) | ((v[l + 96] & 15) << 4));
                b.qh[32 * c + l] = (uint8_t)((v[l] >> 4) | ((v[l + 32] >> 4) << 2) |
                                             ((v[l + 64] >> 4) << 4) | ((v[l + 96] >> 4) << 6));
            }
        }
        for (int p = 0; p < 256; p++)
            want[p] = (float)(b.scales[p / 16] / 64.0 * (q[p] - 32)); /* keeps ggml's -0 */
        expect_row("q6_K", ENGINE_TYPE_Q6_K, &b, want, 256);
    }
    { /* F16, BF16, F32 */
        uint16_t h[4] = {0x3c00, 0xc000, 0x0001, 0x7bff};
        float w4[4] = {1.0f, -2.0f, ldexpf(1.0f, -24), 65504.0f};
        expect_row("f16", ENGINE_TYPE_F16, h, w4, 4);
        uint16_t bf[3] = {0x3f80, 0xc040, 0x4049};
        float wb[3] = {1.0f, -3.0f, 3.140625f};
        expect_row("bf16", ENGINE_TYPE_BF16, bf, wb, 3);
        expect_row("f32", ENGINE_TYPE_F32, w4, w4, 4);
    }
    /* Errors: unsupported type, bad length. */
    float out[64];
    uint8_t junk[256] = {0};
    CHECK(engine_dequantize_row(ENGINE_TYPE_Q2_K, junk, out, 256) == ENGINE_EUNSUPPORTED,
          "q2_K unsupported");
    CHECK(strstr(engine_error_last(), "q2_K") != NULL, "message names the type: %s",
          engine_error_last());
    CHECK(engine_dequantize_row(ENGINE_TYPE_Q4_0, junk, out, 33) == ENGINE_EINVAL, "bad n");
    CHECK(engine_dequantize_row((engine_type)4, junk, out, 32) == ENGINE_EINVAL, "removed type");
    CHECK(engine_type_row_size(ENGINE_TYPE_Q4_K, 512) == 288, "row size");
    CHECK(engine_type_row_size(ENGINE_TYPE_Q4_K, 100) == 0, "row size of a partial block");
}

/* ---------------------------------------------------------------------------------------------
 * quantize -> dequantize accuracy
 * ------------------------------------------------------------------------------------------- */
#define NQ 8192

static double rel_rmse(engine_type t, const float *x, int n) {
    static uint8_t buf[NQ * 4];
    static float y[NQ];
    CHECK(engine_quantize_row(t, x, buf, n) == 0, "quantize %s: %s", engine_type_name(t),
          engine_error_last());
    CHECK(engine_dequantize_row(t, buf, y, n) == 0, "dequantize %s", engine_type_name(t));
    double e = 0, s = 0;
    for (int i = 0; i < n; i++) {
        CHECK(isfinite(y[i]), "%s: non-finite output", engine_type_name(t));
        e += (double)(y[i] - x[i]) * (y[i] - x[i]);
        s += (double)x[i] * x[i];
    }
    return s > 0 ? sqrt(e / s) : sqrt(e);
}

static void test_quant_accuracy(void) {
    static float x[NQ];
    /* Bounds: ~1.5x the error measured for Gaussian data; the uniform-step theory gives
     * step/sqrt(12) relative to sigma with step ~ 2.5 sigma / levels. */
    const struct {
        engine_type t;
        double bound;
    } cases[] = {
        {ENGINE_TYPE_F32, 0.0},    {ENGINE_TYPE_F16, 4e-4},  {ENGINE_TYPE_BF16, 3e-3},
        {ENGINE_TYPE_Q8_0, 0.012}, {ENGINE_TYPE_Q6_K, 0.03}, {ENGINE_TYPE_Q5_K, 0.05},
        {ENGINE_TYPE_Q4_K, 0.10},  {ENGINE_TYPE_Q4_0, 0.12}, {ENGINE_TYPE_Q8_K, 0.012},
    };
    for (int dist = 0; dist < 3; dist++) {
        for (int i = 0; i < NQ; i++) {
            x[i] = rnd_normal();
            if (dist == 1) x[i] = x[i] * 0.02f + 0.01f; /* small, shifted weights */
            if (dist == 2) x[i] = (i % 256 < 128) ? fabsf(x[i]) * 3 : -fabsf(x[i]); /* skewed */
        }
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            const double e = rel_rmse(cases[c].t, x, NQ);
            CHECK(e <= cases[c].bound, "%s dist %d: relative RMSE %.5f > %.5f",
                  engine_type_name(cases[c].t), dist, e, cases[c].bound);
            if (dist == 0)
                printf("  %-5s relative RMSE %.5f (bound %.4f)\n", engine_type_name(cases[c].t), e,
                       cases[c].bound);
        }
    }
    /* Degenerate inputs: zeros, a constant, one spike, tiny and huge values: finite output,
     * zeros stay zeros, the spike survives. */
    const engine_type types[] = {ENGINE_TYPE_Q4_0, ENGINE_TYPE_Q8_0, ENGINE_TYPE_Q4_K,
                                 ENGINE_TYPE_Q5_K, ENGINE_TYPE_Q6_K, ENGINE_TYPE_Q8_K};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        static uint8_t buf[1024 * 4];
        float in[512], out[512];
        for (int mode = 0; mode < 5; mode++) {
            for (int i = 0; i < 512; i++) {
                in[i] = mode == 0   ? 0.0f
                        : mode == 1 ? -0.75f
                        : mode == 2 ? (i == 77 ? 5.0f : 0.0f)
                        : mode == 3 ? ldexpf(rnd_normal(), -30)
                                    : rnd_normal() * 1e6f;
            }
            CHECK(engine_quantize_row(types[k], in, buf, 512) == 0, "quantize");
            CHECK(engine_dequantize_row(types[k], buf, out, 512) == 0, "dequantize");
            for (int i = 0; i < 512; i++)
                CHECK(isfinite(out[i]), "%s mode %d: not finite", engine_type_name(types[k]), mode);
            if (mode == 0)
                for (int i = 0; i < 512; i++)
                    CHECK(out[i] == 0.0f, "zeros stay zero");
            if (mode == 1)
                CHECK(fabsf(out[3] + 0.75f) < 0.05f, "%s constant: %g", engine_type_name(types[k]),
                      out[3]);
            if (mode == 2)
                CHECK(fabsf(out[77] - 5.0f) < 0.05f && fabsf(out[78]) < 0.05f, "%s spike: %g %g",
                      engine_type_name(types[k]), out[77], out[78]);
        }
    }
    /* Deterministic. */
    static uint8_t a[NQ], b[NQ];
    for (int i = 0; i < 1024; i++)
        x[i] = rnd_normal();
    engine_quantize_row(ENGINE_TYPE_Q4_K, x, a, 1024);
    engine_quantize_row(ENGINE_TYPE_Q4_K, x, b, 1024);
    CHECK(memcmp(a, b, engine_type_row_size(ENGINE_TYPE_Q4_K, 1024)) == 0, "deterministic");
}

/* ---------------------------------------------------------------------------------------------
 * Dot products: scalar, dispatched (SIMD) and a double reference
 * ------------------------------------------------------------------------------------------- */
static const engine_type dot_types[] = {ENGINE_TYPE_F32,  ENGINE_TYPE_F16,  ENGINE_TYPE_BF16,
                                        ENGINE_TYPE_Q8_0, ENGINE_TYPE_Q4_0, ENGINE_TYPE_Q4_K,
                                        ENGINE_TYPE_Q5_K, ENGINE_TYPE_Q6_K};

/* Both paths compute exact integer sums per block and differ from the exact value only by
 * float rounding: the products d_w * d_x (one rounding), one rounding per block product, and
 * the summation of nb terms, whose error is bounded by (nb - 1) * u * sum|terms| (u = 2^-24)
 * for any summation order. We allow (nb + 4) * FLT_EPSILON * sum|terms| (twice that bound
 * plus slack), measured against a double reference computed from the dequantised operands. */
static void check_dot(engine_type t, int n, const void *w, const void *xc, const char *what,
                      engine_vec_dot_fn scalar_fn) {
    const engine_type_traits *tr = engine_type_traits_get(t);
    static float wf[4096], xf[4096];
    engine_dequantize_row(t, w, wf, n);
    engine_dequantize_row(tr->vec_dot_type, xc, xf, n);
    double ref = 0, mag = 0;
    for (int i = 0; i < n; i++) {
        ref += (double)wf[i] * xf[i];
        mag += fabs((double)wf[i] * xf[i]);
    }
    const int terms = (int)(n / tr->block_size) + 4;
    /* The Q8_K activation's f32 scale makes dequantised x round once more than the integer
     * path sees: one more ulp per value, covered by the extra 4 * eps. */
    const double tol = (double)terms * FLT_EPSILON * mag + 1e-30;
    const float s = scalar_fn(n, w, xc), v = engine_vec_dot(t, n, w, xc);
    CHECK(fabs(s - ref) <= tol, "%s %s n=%d: scalar %.9g vs reference %.9g (tol %.3g)",
          engine_type_name(t), what, n, s, ref, tol);
    CHECK(fabs(v - ref) <= tol, "%s %s n=%d: %s %.9g vs reference %.9g (tol %.3g)",
          engine_type_name(t), what, n, engine_quant_simd_path(), v, ref, tol);
}

static void test_dots(void) {
    engine_vec_dot_fn scalar[ENGINE_TYPE_COUNT] = {0};
    engine_quant_fill_scalar(scalar);
    static float w[4096], x[4096];
    static uint8_t wq[4096 * 4], xq[4096 * 4 + 1024];
    const int sizes[] = {256, 512, 4096, 2048 + 256};
    for (size_t k = 0; k < sizeof dot_types / sizeof dot_types[0]; k++) {
        const engine_type t = dot_types[k];
        const engine_type vt = engine_type_traits_get(t)->vec_dot_type;
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            const int n = sizes[si];
            for (int rep = 0; rep < 4; rep++) {
                for (int i = 0; i < n; i++) {
                    w[i] = rnd_normal() * (rep == 3 ? 50.0f : 1.0f);
                    x[i] = rnd_normal() * (rep == 2 ? 1e-3f : 1.0f);
                }
                engine_quantize_row(t, w, wq, n);
                engine_quantize_row(vt, x, xq, n);
                check_dot(t, n, wq, xq, "random", scalar[t]);
                if (rep == 0) { /* random bytes as weights: any bit pattern with finite scales */
                    const size_t bytes = engine_type_row_size(t, n);
                    for (size_t i = 0; i < bytes; i++)
                        wq[i] = (uint8_t)rnd_u64();
                    const size_t bs = engine_type_traits_get(t)->type_size;
                    /* clamp every f16/bf16/f32 value or block scale to something finite */
                    for (size_t i = 0; i < bytes; i += bs) {
                        if (t == ENGINE_TYPE_F32) {
                            float f = rnd_normal();
                            memcpy(wq + i, &f, 4);
                        } else if (t == ENGINE_TYPE_F16 || t == ENGINE_TYPE_BF16) {
                            wq[i + 1] &= 0x3f; /* exponent well below inf/nan */
                        } else if (t == ENGINE_TYPE_Q6_K) {
                            wq[i + 209] &= 0x3b;
                        } else {
                            wq[i + 1] &= 0x3b;
                            if (t == ENGINE_TYPE_Q4_K || t == ENGINE_TYPE_Q5_K) wq[i + 3] &= 0x3b;
                        }
                    }
                    check_dot(t, n, wq, xq, "random bytes", scalar[t]);
                }
            }
        }
        /* Extremes: every weight byte at its most negative / largest value against |x| max. */
        const int n = 512;
        for (int i = 0; i < n; i++)
            x[i] = (i & 1) ? 1.0f : -1.0f;
        engine_quantize_row(vt, x, xq, n);
        const size_t bytes = engine_type_row_size(t, n), bs = engine_type_traits_get(t)->type_size;
        memset(wq, 0x80, bytes); /* int8 -128, nibbles 8/0, ... */
        for (size_t i = 0; i < bytes; i += bs) {
            if (t == ENGINE_TYPE_F32 || t == ENGINE_TYPE_F16 || t == ENGINE_TYPE_BF16) break;
            if (t == ENGINE_TYPE_Q6_K) {
                wq[i + 208] = 0x00;
                wq[i + 209] = 0x3c;
            } else {
                wq[i] = 0x00;
                wq[i + 1] = 0x3c;
            }
        }
        if (t == ENGINE_TYPE_F32 || t == ENGINE_TYPE_F16 || t == ENGINE_TYPE_BF16)
            engine_quantize_row(t, x, wq, n);
        check_dot(t, n, wq, xq, "extremes", scalar[t]);
        memset(wq, 0xff, bytes); /* all bits set: largest quants and scales */
        for (size_t i = 0; i < bytes; i += bs) {
            if (t == ENGINE_TYPE_F32 || t == ENGINE_TYPE_F16 || t == ENGINE_TYPE_BF16) break;
            if (t == ENGINE_TYPE_Q6_K) {
                wq[i + 208] = 0x00;
                wq[i + 209] = 0x3c;
            } else {
                wq[i] = 0x00;
                wq[i + 1] = 0x3c;
                if (t == ENGINE_TYPE_Q4_K || t == ENGINE_TYPE_Q5_K) {
                    wq[i + 2] = 0;
                    wq[i + 3] = 0x3c;
                }
            }
        }
        if (t != ENGINE_TYPE_F32 && t != ENGINE_TYPE_F16 && t != ENGINE_TYPE_BF16)
            check_dot(t, n, wq, xq, "all ones", scalar[t]);
    }
    /* matvec over a row range equals row-by-row dots and leaves other rows alone. */
    {
        const int rows = 7, cols = 512;
        static uint8_t W[7 * 512 * 2];
        const size_t stride = engine_type_row_size(ENGINE_TYPE_Q4_K, cols);
        for (int r = 0; r < rows; r++) {
            for (int i = 0; i < cols; i++)
                w[i] = rnd_normal();
            engine_quantize_row(ENGINE_TYPE_Q4_K, w, W + r * stride, cols);
        }
        for (int i = 0; i < cols; i++)
            x[i] = rnd_normal();
        engine_quantize_row(ENGINE_TYPE_Q8_K, x, xq, cols);
        float y[7];
        for (int r = 0; r < rows; r++)
            y[r] = -123.0f;
        engine_quant_matvec(ENGINE_TYPE_Q4_K, W, stride, cols, 2, 6, xq, y);
        for (int r = 0; r < rows; r++) {
            if (r >= 2 && r < 6)
                CHECK(y[r] == engine_vec_dot(ENGINE_TYPE_Q4_K, cols, W + r * stride, xq),
                      "matvec row %d", r);
            else
                CHECK(y[r] == -123.0f, "matvec touched row %d", r);
        }
    }
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--expect-path")) {
        /* Child mode: report whether the dispatch honoured the environment. */
        const char *p = engine_quant_simd_path();
        if (strcmp(p, argv[2]) != 0) {
            fprintf(stderr, "dispatch chose %s, expected %s\n", p, argv[2]);
            return 1;
        }
        test_dots();
        return failures ? 1 : 0;
    }
    printf("SIMD path: %s\n", engine_quant_simd_path());
    CHECK(!strcmp(engine_cpu_simd_path(), engine_quant_simd_path()), "engine_cpu_simd_path");
#if defined(__x86_64__)
    engine_cpu_info ci;
    engine_cpu_info_get(&ci);
    const char *env = getenv("SPARK_CPU_SIMD");
    if (ci.avx2 && ci.fma && ci.f16c && !(env && !strcmp(env, "scalar")))
        CHECK(!strcmp(engine_quant_simd_path(), "avx2+fma"), "AVX2 CPU but path %s",
              engine_quant_simd_path());
#endif
    test_half();
    test_dequant_exact();
    test_quant_accuracy();
    test_dots();
    /* SPARK_CPU_SIMD=scalar forces the scalar path: run the dot tests again in a child. */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("SPARK_CPU_SIMD", "scalar", 1);
        execl("/proc/self/exe", argv[0], "--expect-path", "scalar", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "scalar child failed (status %d)", status);
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("test_quant: ok\n");
    return 0;
}
