/* Tensor types on the CPU: traits, half conversions, dequantisation (ggml's layouts, bit-exact),
 * quantisation, portable scalar dot products and the run-time choice of SIMD kernels. */
#include "cpu/quant.h"
#include "cpu/quant_kernels.h"
#include "common.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Dequantisation must round exactly like ggml's reference C code, which multiplies and adds
 * in separate float operations: forbid the compiler from fusing them into FMAs. (gcc does not
 * contract in ISO C mode, which is what we compile in; clang needs to be told.) */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* ---------------------------------------------------------------------------------------------
 * Traits
 * ------------------------------------------------------------------------------------------- */
#define T(id, nm, bs, ts, sup, vdt) [id] = {nm, bs, ts, sup, vdt}
static const engine_type_traits type_traits[ENGINE_TYPE_COUNT] = {
    T(ENGINE_TYPE_F32, "f32", 1, 4, true, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_F16, "f16", 1, 2, true, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_Q4_0, "q4_0", 32, 18, true, ENGINE_TYPE_Q8_0),
    T(ENGINE_TYPE_Q4_1, "q4_1", 32, 20, false, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_Q5_0, "q5_0", 32, 22, false, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_Q5_1, "q5_1", 32, 24, false, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_Q8_0, "q8_0", 32, 34, true, ENGINE_TYPE_Q8_0),
    T(ENGINE_TYPE_Q8_1, "q8_1", 32, 36, false, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_Q2_K, "q2_K", 256, 84, false, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_Q3_K, "q3_K", 256, 110, false, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_Q4_K, "q4_K", 256, 144, true, ENGINE_TYPE_Q8_K),
    T(ENGINE_TYPE_Q5_K, "q5_K", 256, 176, true, ENGINE_TYPE_Q8_K),
    T(ENGINE_TYPE_Q6_K, "q6_K", 256, 210, true, ENGINE_TYPE_Q8_K),
    /* Q8_K: activations only; it can be (de)quantised but has no weight dot product. */
    T(ENGINE_TYPE_Q8_K, "q8_K", 256, 292, false, ENGINE_TYPE_Q8_K),
    T(ENGINE_TYPE_IQ2_XXS, "iq2_xxs", 256, 66, false, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_IQ2_XS, "iq2_xs", 256, 74, false, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_IQ3_XXS, "iq3_xxs", 256, 98, false, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_IQ1_S, "iq1_s", 256, 50, false, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_IQ4_NL, "iq4_nl", 32, 18, false, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_IQ3_S, "iq3_s", 256, 110, false, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_IQ2_S, "iq2_s", 256, 82, false, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_IQ4_XS, "iq4_xs", 256, 136, false, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_I8, "i8", 1, 1, false, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_I16, "i16", 1, 2, false, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_I32, "i32", 1, 4, false, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_I64, "i64", 1, 8, false, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_F64, "f64", 1, 8, false, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_IQ1_M, "iq1_m", 256, 56, false, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_BF16, "bf16", 1, 2, true, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_TQ1_0, "tq1_0", 256, 54, false, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_TQ2_0, "tq2_0", 256, 66, false, ENGINE_TYPE_F32),
    T(ENGINE_TYPE_MXFP4, "mxfp4", 32, 17, false, ENGINE_TYPE_F32),
};
#undef T

const engine_type_traits *engine_type_traits_get(int t) {
    if (t < 0 || t >= ENGINE_TYPE_COUNT || !type_traits[t].name) return NULL;
    return &type_traits[t];
}

const char *engine_type_name(int t) {
    const engine_type_traits *tr = engine_type_traits_get(t);
    return tr ? tr->name : "?";
}

size_t engine_type_row_size(engine_type t, int64_t n) {
    const engine_type_traits *tr = engine_type_traits_get((int)t);
    if (!tr || n < 0 || n % tr->block_size) return 0;
    return (size_t)(n / tr->block_size) * tr->type_size;
}

/* ---------------------------------------------------------------------------------------------
 * Half precision
 * ------------------------------------------------------------------------------------------- */
uint16_t engine_fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((x >> 13) & 0x3ffu); /* NaN */
    if (x >= 0x477ff000u) return sign | 0x7c00u;     /* >= 65520 (incl. inf): rounds to inf */
    if (x >= 0x38800000u) {                          /* normal half: >= 2^-14 */
        uint32_t r = x + 0x0fffu + ((x >> 13) & 1u); /* round to nearest even at bit 13 */
        return sign | (uint16_t)((r >> 13) - (112u << 10));
    }
    if (x < 0x33000000u) return sign; /* < 2^-25 (ties at 2^-25 go to even = 0) */
    /* Subnormal half: round |f| * 2^24 to the nearest even integer. */
    uint32_t mant = (x & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - (x >> 23); /* 14 .. 24 */
    uint32_t m = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (m & 1u))) m++;
    return sign | (uint16_t)m;
}

/* ---------------------------------------------------------------------------------------------
 * Dequantisation (the formulas of ggml's reference code, evaluated in the same order)
 * ------------------------------------------------------------------------------------------- */
void engine_quant_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void dequant_q4_0(const engine_block_q4_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = engine_fp16_to_fp32(x[i].d);
        for (int j = 0; j < 16; j++) {
            y[i * 32 + j] = (float)((x[i].qs[j] & 0x0F) - 8) * d;
            y[i * 32 + j + 16] = (float)((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void dequant_q8_0(const engine_block_q8_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = engine_fp16_to_fp32(x[i].d);
        for (int j = 0; j < 32; j++)
            y[i * 32 + j] = (float)x[i].qs[j] * d;
    }
}

static void dequant_q4_K(const engine_block_q4_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *q = x[i].qs;
        const float d = engine_fp16_to_fp32(x[i].d), dmin = engine_fp16_to_fp32(x[i].dmin);
        for (int j = 0, is = 0; j < ENGINE_QK_K; j += 64, is += 2, q += 32) {
            uint8_t sc, m;
            engine_quant_scale_min_k4(is, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            engine_quant_scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

static void dequant_q5_K(const engine_block_q5_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        const float d = engine_fp16_to_fp32(x[i].d), dmin = engine_fp16_to_fp32(x[i].dmin);
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0, is = 0; j < ENGINE_QK_K; j += 64, is += 2, ql += 32) {
            uint8_t sc, m;
            engine_quant_scale_min_k4(is, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            engine_quant_scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            u1 = (uint8_t)(u1 << 2);
            u2 = (uint8_t)(u2 << 2);
        }
    }
}

static void dequant_q6_K(const engine_block_q6_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = engine_fp16_to_fp32(x[i].d);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        for (int n = 0; n < ENGINE_QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * (float)sc[is] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

static void dequant_q8_K(const engine_block_q8_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++)
        for (int j = 0; j < ENGINE_QK_K; j++)
            *y++ = x[i].d * (float)x[i].qs[j];
}

/* The argument checks of engine_dequantize_row and engine_quantize_row. */
static int check_row(const char *op, engine_type t, int64_t n, const engine_type_traits **out) {
    const engine_type_traits *tr = engine_type_traits_get((int)t);
    if (!tr) return engine_err(ENGINE_EINVAL, "%s: unknown tensor type %d", op, (int)t);
    if (!tr->supported && t != ENGINE_TYPE_Q8_K)
        return engine_err(ENGINE_EUNSUPPORTED, "%s: tensor type %s is not supported", op, tr->name);
    if (n < 0 || n % tr->block_size)
        return engine_err(ENGINE_EINVAL, "%s %s: %lld values is not a multiple of %lld", op,
                          tr->name, (long long)n, (long long)tr->block_size);
    *out = tr;
    return 0;
}

int engine_dequantize_row(engine_type t, const void *src, float *dst, int64_t n) {
    const engine_type_traits *tr;
    const int rc = check_row("dequantize", t, n, &tr);
    if (rc) return rc;
    const int64_t nb = n / tr->block_size;
    switch (t) {
    case ENGINE_TYPE_F32:
        memmove(dst, src, (size_t)n * sizeof(float));
        break;
    case ENGINE_TYPE_F16: {
        const uint8_t *s = src;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = engine_fp16_to_fp32(h);
        }
        break;
    }
    case ENGINE_TYPE_BF16: {
        const uint8_t *s = src;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = engine_bf16_to_fp32(h);
        }
        break;
    }
    case ENGINE_TYPE_Q4_0:
        dequant_q4_0(src, dst, nb);
        break;
    case ENGINE_TYPE_Q8_0:
        dequant_q8_0(src, dst, nb);
        break;
    case ENGINE_TYPE_Q4_K:
        dequant_q4_K(src, dst, nb);
        break;
    case ENGINE_TYPE_Q5_K:
        dequant_q5_K(src, dst, nb);
        break;
    case ENGINE_TYPE_Q6_K:
        dequant_q6_K(src, dst, nb);
        break;
    case ENGINE_TYPE_Q8_K:
        dequant_q8_K(src, dst, nb);
        break;
    default:
        return engine_err(ENGINE_EINTERNAL, "dequantize: no kernel for %s", tr->name);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Quantisation
 *
 * Every quantizer rounds to nearest; the block scale is chosen by a small search over
 * candidate scales (the one with the least squared error wins), then the values are rounded
 * once more with the scale exactly as it will be decoded (after f16 / 6-bit rounding), so the
 * stored integers match the stored scales.
 * ------------------------------------------------------------------------------------------- */
static inline int nearest_int(float f) {
    /* Adding 1.5 * 2^23 leaves round-to-nearest-even(f) in the low mantissa bits for |f| < 2^22:
     * no branch, and no undefined float-to-int conversion for NaN or huge inputs (those give
     * a meaningless value that every caller clamps; finite inputs never get near 2^22 because
     * each scale is derived from the block's own largest value). */
    const float v = f + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* max/min that ignore a NaN in b (as fmaxf/fminf do), inlined: libm's are calls. */
static inline float maxf(float a, float b) {
    return b > a ? b : a;
}

static inline float minf(float a, float b) {
    return b < a ? b : a;
}

static inline int clampi(int v, int lo, int hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

/* Symmetric quantisation of n values to integers in [qmin, qmax] with one signed scale d
 * (x ~= d * q): the value of largest magnitude is mapped to a few candidate levels near qmin
 * and qmax, and the candidate with the least squared error wins. */
static float symmetric_scale(const float *x, int n, int qmin, int qmax) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++) {
        const float a = fabsf(x[i]);
        if (a > amax) {
            amax = a;
            max = x[i];
        }
    }
    if (!(amax > 0.0f) || !isfinite(amax)) return 0.0f;
    const float levels[] = {(float)qmin,        (float)qmin + 0.5f, (float)qmin + 1.0f,
                            (float)qmin + 2.0f, (float)qmax,        (float)qmax - 0.5f};
    float best_d = max / (float)qmin, best_err = INFINITY;
    const float flo = (float)qmin, fhi = (float)qmax;
    for (size_t c = 0; c < sizeof levels / sizeof levels[0]; c++) {
        const float d = max / levels[c], id = 1.0f / d;
        float err = 0.0f;
        for (int i = 0; i < n; i++) {
            /* clamp (NaN goes to qmin) and round in float, branch-free (see fit_scale_min) */
            float f = x[i] * id;
            f = f > flo ? f : flo;
            f = f < fhi ? f : fhi;
            const float e = x[i] - d * ((f + 12582912.0f) - 12582912.0f);
            err += e * e;
        }
        if (err < best_err) {
            best_err = err;
            best_d = d;
        }
    }
    return best_d;
}

/* A block scale as f16: magnitudes beyond the largest finite half saturate (the block then
 * clips) instead of becoming inf and poisoning every value of the block. */
static uint16_t fp16_scale(float d) {
    if (!(fabsf(d) <= 65504.0f)) return d != d ? 0 : d < 0 ? 0xfbff : 0x7bff;
    return engine_fp32_to_fp16(d);
}

static void quant_q8_0(const float *x, engine_block_q8_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = maxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = fp16_scale(d);
        for (int j = 0; j < 32; j++)
            y[i].qs[j] = (int8_t)clampi(nearest_int(x[j] * id), -127, 127);
    }
}

static void quant_q4_0(const float *x, engine_block_q4_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        const uint16_t dh = fp16_scale(symmetric_scale(x, 32, -8, 7));
        const float d = engine_fp16_to_fp32(dh), id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = dh;
        for (int j = 0; j < 16; j++) {
            const int q0 = clampi(nearest_int(x[j] * id), -8, 7) + 8;
            const int q1 = clampi(nearest_int(x[j + 16] * id), -8, 7) + 8;
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void engine_quant_q8_K_ref(const float *x, engine_block_q8_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += ENGINE_QK_K) {
        float amax = 0.0f;
        for (int j = 0; j < ENGINE_QK_K; j++)
            amax = maxf(amax, fabsf(x[j]));
        const float iscale = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[i].d = amax != 0.0f ? 1.0f / iscale : 0.0f;
        for (int j = 0; j < ENGINE_QK_K; j++)
            y[i].qs[j] = (int8_t)clampi(nearest_int(x[j] * iscale), -127, 127);
        for (int g = 0; g < ENGINE_QK_K / 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++)
                s += y[i].qs[g * 16 + j];
            y[i].bsums[g] = (int16_t)s;
        }
    }
}

/* Fit x ~= s * L - m (s > 0, m >= 0, L in [0, nmax]) for one sub-block of n values: try a few
 * ranges, refit s and m by least squares for each, keep the best. */
static void fit_scale_min(const float *x, int n, int nmax, float *s_out, float *m_out) {
    float xmin = INFINITY, xmax = -INFINITY; /* NaNs are skipped */
    for (int i = 0; i < n; i++) {
        xmin = minf(xmin, x[i]);
        xmax = maxf(xmax, x[i]);
    }
    if (xmin > 0.0f) xmin = 0.0f;
    if (xmax <= xmin) {
        *s_out = 0.0f;
        *m_out = -xmin;
        return;
    }
    /* The squared error of a fit follows from sums taken once per candidate (in double, so
     * that subtracting them loses nothing that matters): a single pass over the values. */
    double sx = 0, sxx = 0;
    for (int i = 0; i < n; i++) {
        sx += x[i];
        sxx += (double)x[i] * x[i];
    }
    float best_s = (xmax - xmin) / (float)nmax, best_m = -xmin;
    double best_err = INFINITY;
    for (int c = -2; c <= 2; c++) {
        const float iscale = ((float)nmax + 0.5f * (float)c) / (xmax - xmin);
        /* All in float, branch-free: clamp (NaN goes to 0), then round to an integer value
         * by adding and subtracting 1.5 * 2^23. Sums of small integers are exact in float. */
        float fsl = 0, fsl2 = 0, fslx = 0;
        const float fmax = (float)nmax;
        for (int i = 0; i < n; i++) {
            float f = (x[i] - xmin) * iscale;
            f = f > 0.0f ? f : 0.0f;
            f = f < fmax ? f : fmax;
            const float l = (f + 12582912.0f) - 12582912.0f;
            fsl += l;
            fsl2 += l * l;
            fslx += l * x[i];
        }
        const double sl = fsl, sl2 = fsl2, slx = fslx;
        const double det = n * sl2 - sl * sl;
        double sd, md;
        if (det > 0) {
            sd = (n * slx - sl * sx) / det;
            md = (sd * sl - sx) / n; /* x ~= s L - m */
            if (md < 0) {            /* the offset must not be positive: refit without it */
                md = 0;
                sd = sl2 > 0 ? slx / sl2 : 0;
            }
        } else {
            sd = 1.0 / iscale;
            md = -xmin;
        }
        if (!(sd > 0)) continue;
        /* sum (s L - m - x)^2 expanded */
        const double err =
            sd * sd * sl2 + n * md * md + sxx - 2 * sd * md * sl - 2 * sd * slx + 2 * md * sx;
        if (err < best_err) {
            best_err = err;
            best_s = (float)sd;
            best_m = (float)md;
        }
    }
    *s_out = best_s;
    *m_out = best_m;
}

/* Shared by Q4_K and Q5_K: sub-block scales/mins to 6 bits, then the integers L[256] rounded
 * with the decoded scales. Fills d, dmin, scales[12]. */
static void quant_k_scales(const float *x, int nmax, uint16_t *d_out, uint16_t *dmin_out,
                           uint8_t scales[12], uint8_t L[ENGINE_QK_K]) {
    float s[8], m[8], max_s = 0, max_m = 0;
    for (int j = 0; j < 8; j++) {
        fit_scale_min(x + 32 * j, 32, nmax, &s[j], &m[j]);
        max_s = maxf(max_s, s[j]);
        max_m = maxf(max_m, m[j]);
    }
    const uint16_t dh = fp16_scale(max_s / 63.0f);
    const uint16_t mh = fp16_scale(max_m / 63.0f);
    const float d = engine_fp16_to_fp32(dh), dmin = engine_fp16_to_fp32(mh);
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)(d > 0 ? clampi(nearest_int(s[j] / d), 0, 63) : 0);
        mn[j] = (uint8_t)(dmin > 0 ? clampi(nearest_int(m[j] / dmin), 0, 63) : 0);
    }
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        scales[j + 4] = (uint8_t)((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
        scales[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
    }
    for (int j = 0; j < 8; j++) {
        const float ds = d * (float)sc[j], dm = dmin * (float)mn[j];
        const float ids = ds > 0 ? 1.0f / ds : 0.0f;
        for (int i = 0; i < 32; i++)
            L[32 * j + i] = (uint8_t)clampi(nearest_int((x[32 * j + i] + dm) * ids), 0, nmax);
    }
    *d_out = dh;
    *dmin_out = mh;
}

static void quant_q4_K(const float *x, engine_block_q4_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += ENGINE_QK_K) {
        uint8_t L[ENGINE_QK_K];
        quant_k_scales(x, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                y[i].qs[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
    }
}

static void quant_q5_K(const float *x, engine_block_q5_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += ENGINE_QK_K) {
        uint8_t L[ENGINE_QK_K];
        quant_k_scales(x, 31, &y[i].d, &y[i].dmin, y[i].scales, L);
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                const int a = L[64 * c + l], b = L[64 * c + 32 + l];
                y[i].qs[32 * c + l] = (uint8_t)((a & 0xF) | ((b & 0xF) << 4));
                y[i].qh[l] |= (uint8_t)(((a >> 4) << (2 * c)) | ((b >> 4) << (2 * c + 1)));
            }
    }
}

static void quant_q6_K(const float *x, engine_block_q6_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += ENGINE_QK_K) {
        float s[16], smax = 0, samax = 0;
        for (int j = 0; j < 16; j++) {
            s[j] = symmetric_scale(x + 16 * j, 16, -32, 31);
            if (fabsf(s[j]) > samax) {
                samax = fabsf(s[j]);
                smax = s[j];
            }
        }
        /* The sub-block scales are int8 in [-128, 127] times d. */
        const uint16_t dh = fp16_scale(smax / -128.0f);
        const float d = engine_fp16_to_fp32(dh);
        y[i].d = dh;
        uint8_t L[ENGINE_QK_K];
        for (int j = 0; j < 16; j++) {
            const int sc = d != 0.0f ? clampi(nearest_int(s[j] / d), -128, 127) : 0;
            y[i].scales[j] = (int8_t)sc;
            const float ds = d * (float)sc, ids = ds != 0.0f ? 1.0f / ds : 0.0f;
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (uint8_t)(clampi(nearest_int(x[16 * j + l] * ids), -32, 31) + 32);
        }
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int c = 0; c < ENGINE_QK_K; c += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                const uint8_t *Lc = L + c;
                ql[l] = (uint8_t)((Lc[l] & 0xF) | ((Lc[l + 64] & 0xF) << 4));
                ql[l + 32] = (uint8_t)((Lc[l + 32] & 0xF) | ((Lc[l + 96] & 0xF) << 4));
                qh[l] = (uint8_t)((Lc[l] >> 4) | ((Lc[l + 32] >> 4) << 2) |
                                  ((Lc[l + 64] >> 4) << 4) | ((Lc[l + 96] >> 4) << 6));
            }
        }
    }
}

int engine_quantize_row(engine_type t, const float *src, void *dst, int64_t n) {
    const engine_type_traits *tr;
    const int rc = check_row("quantize", t, n, &tr);
    if (rc) return rc;
    const int64_t nb = n / tr->block_size;
    switch (t) {
    case ENGINE_TYPE_F32:
        memmove(dst, src, (size_t)n * sizeof(float));
        break;
    case ENGINE_TYPE_F16: {
        uint8_t *d = dst;
        for (int64_t i = 0; i < n; i++) {
            const uint16_t h = engine_fp32_to_fp16(src[i]);
            memcpy(d + 2 * i, &h, 2);
        }
        break;
    }
    case ENGINE_TYPE_BF16: {
        uint8_t *d = dst;
        for (int64_t i = 0; i < n; i++) {
            const uint16_t h = engine_fp32_to_bf16(src[i]);
            memcpy(d + 2 * i, &h, 2);
        }
        break;
    }
    case ENGINE_TYPE_Q4_0:
        quant_q4_0(src, dst, nb);
        break;
    case ENGINE_TYPE_Q8_0:
        quant_q8_0(src, dst, nb);
        break;
    case ENGINE_TYPE_Q4_K:
        quant_q4_K(src, dst, nb);
        break;
    case ENGINE_TYPE_Q5_K:
        quant_q5_K(src, dst, nb);
        break;
    case ENGINE_TYPE_Q6_K:
        quant_q6_K(src, dst, nb);
        break;
    case ENGINE_TYPE_Q8_K:
        engine_quant_q8_K_ref(src, dst, nb);
        break;
    default:
        return engine_err(ENGINE_EINTERNAL, "quantize: no kernel for %s", tr->name);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Scalar dot products: exact integer sums per block, float per block.
 * ------------------------------------------------------------------------------------------- */
static float vec_dot_f32_scalar(int n, const void *w, const void *x) {
    const float *a = w, *b = x;
    float s = 0.0f;
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static float vec_dot_f16_scalar(int n, const void *w, const void *x) {
    const uint16_t *a = w;
    const float *b = x;
    float s = 0.0f;
    for (int i = 0; i < n; i++)
        s += engine_fp16_to_fp32(a[i]) * b[i];
    return s;
}

static float vec_dot_bf16_scalar(int n, const void *w, const void *x) {
    const uint16_t *a = w;
    const float *b = x;
    float s = 0.0f;
    for (int i = 0; i < n; i++)
        s += engine_bf16_to_fp32(a[i]) * b[i];
    return s;
}

static float vec_dot_q8_0_scalar(int n, const void *w, const void *x) {
    const engine_block_q8_0 *a = w, *b = x;
    float s = 0.0f;
    for (int i = 0; i < n / 32; i++) {
        int sum = 0;
        for (int j = 0; j < 32; j++)
            sum += a[i].qs[j] * b[i].qs[j];
        s += engine_fp16_to_fp32(a[i].d) * engine_fp16_to_fp32(b[i].d) * (float)sum;
    }
    return s;
}

static float vec_dot_q4_0_scalar(int n, const void *w, const void *x) {
    const engine_block_q4_0 *a = w;
    const engine_block_q8_0 *b = x;
    float s = 0.0f;
    for (int i = 0; i < n / 32; i++) {
        int sum = 0;
        for (int j = 0; j < 16; j++) {
            sum += ((a[i].qs[j] & 0xF) - 8) * b[i].qs[j];
            sum += ((a[i].qs[j] >> 4) - 8) * b[i].qs[j + 16];
        }
        s += engine_fp16_to_fp32(a[i].d) * engine_fp16_to_fp32(b[i].d) * (float)sum;
    }
    return s;
}

/* One Q4_K or Q5_K block (the layouts share d, dmin and scales; qh is NULL for Q4_K) against
 * one Q8_K block. Inlined into each caller with a constant qh so the inner loops vectorize. */
__attribute__((always_inline)) static inline float dot_k45_block(const uint8_t *blk,
                                                                 const uint8_t *qs,
                                                                 const uint8_t *qh,
                                                                 const engine_block_q8_K *b) {
    uint16_t dh, mh;
    memcpy(&dh, blk, 2);
    memcpy(&mh, blk + 2, 2);
    uint8_t sc[8], m[8];
    engine_quant_unpack_k4(blk + 4, sc, m);
    int sumi = 0, summ = 0;
    for (int c = 0; c < 4; c++) { /* sub-blocks 2c (low nibbles) and 2c + 1 (high) */
        const uint8_t *q = qs + 32 * c;
        const int8_t *y = b->qs + 64 * c;
        int lo = 0, hi = 0;
        for (int l = 0; l < 32; l++) {
            int vl = q[l] & 0xF, vh = q[l] >> 4;
            if (qh) {
                vl |= ((qh[l] >> (2 * c)) & 1) << 4;
                vh |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
            }
            lo += vl * y[l];
            hi += vh * y[l + 32];
        }
        sumi += sc[2 * c] * lo + sc[2 * c + 1] * hi;
        summ += m[2 * c] * (b->bsums[4 * c] + b->bsums[4 * c + 1]) +
                m[2 * c + 1] * (b->bsums[4 * c + 2] + b->bsums[4 * c + 3]);
    }
    const float d = engine_fp16_to_fp32(dh) * b->d, dmin = engine_fp16_to_fp32(mh) * b->d;
    return d * (float)sumi - dmin * (float)summ;
}

static float vec_dot_q4_K_scalar(int n, const void *w, const void *x) {
    const engine_block_q4_K *a = w;
    const engine_block_q8_K *b = x;
    float s = 0.0f;
    for (int i = 0; i < n / ENGINE_QK_K; i++)
        s += dot_k45_block((const uint8_t *)&a[i], a[i].qs, NULL, &b[i]);
    return s;
}

static float vec_dot_q5_K_scalar(int n, const void *w, const void *x) {
    const engine_block_q5_K *a = w;
    const engine_block_q8_K *b = x;
    float s = 0.0f;
    for (int i = 0; i < n / ENGINE_QK_K; i++)
        s += dot_k45_block((const uint8_t *)&a[i], a[i].qs, a[i].qh, &b[i]);
    return s;
}

static float vec_dot_q6_K_scalar(int n, const void *w, const void *x) {
    const engine_block_q6_K *a = w;
    const engine_block_q8_K *b = x;
    float s = 0.0f;
    for (int i = 0; i < n / ENGINE_QK_K; i++) {
        const int8_t *scales = a[i].scales;
        /* the -32 offset of every value, through the activation's sums of 16 */
        int sumi = 0;
        for (int g = 0; g < 16; g++)
            sumi -= 32 * scales[g] * b[i].bsums[g];
        for (int c = 0; c < 2; c++) {
            const uint8_t *ql = a[i].ql + 64 * c, *qh = a[i].qh + 32 * c;
            const int8_t *y = b[i].qs + 128 * c, *sc = scales + 8 * c;
            for (int h = 0; h < 2; h++) { /* l in [16h, 16h + 16): one scale per quarter */
                int s1 = 0, s2 = 0, s3 = 0, s4 = 0;
                for (int l = 16 * h; l < 16 * h + 16; l++) {
                    s1 += ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) * y[l];
                    s2 += ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) * y[l + 32];
                    s3 += ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) * y[l + 64];
                    s4 += ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) * y[l + 96];
                }
                sumi += sc[h] * s1 + sc[h + 2] * s2 + sc[h + 4] * s3 + sc[h + 6] * s4;
            }
        }
        s += engine_fp16_to_fp32(a[i].d) * b[i].d * (float)sumi;
    }
    return s;
}

/* ---------------------------------------------------------------------------------------------
 * Run-time dispatch
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    engine_vec_dot_fn vec_dot[ENGINE_TYPE_COUNT];
    const char *path;
} dispatch_table;

/* Filled once by pthread_once, read-only afterwards. */
static dispatch_table dispatch;
static pthread_once_t dispatch_once = PTHREAD_ONCE_INIT;

void engine_quant_fill_scalar(engine_vec_dot_fn table[ENGINE_TYPE_COUNT]) {
    table[ENGINE_TYPE_F32] = vec_dot_f32_scalar;
    table[ENGINE_TYPE_F16] = vec_dot_f16_scalar;
    table[ENGINE_TYPE_BF16] = vec_dot_bf16_scalar;
    table[ENGINE_TYPE_Q8_0] = vec_dot_q8_0_scalar;
    table[ENGINE_TYPE_Q4_0] = vec_dot_q4_0_scalar;
    table[ENGINE_TYPE_Q4_K] = vec_dot_q4_K_scalar;
    table[ENGINE_TYPE_Q5_K] = vec_dot_q5_K_scalar;
    table[ENGINE_TYPE_Q6_K] = vec_dot_q6_K_scalar;
}

static void dispatch_init(void) {
    engine_quant_fill_scalar(dispatch.vec_dot);
    dispatch.path = "scalar";
    const char *env = getenv("SPARK_CPU_SIMD");
    if (env && !strcmp(env, "scalar")) return;
    if (env && env[0] && strcmp(env, "auto") != 0)
        engine_log(ENGINE_LOG_WARN,
                   "SPARK_CPU_SIMD=%s: unknown value (use 'scalar' or 'auto'); "
                   "choosing the kernels from the CPU's features",
                   env);
#if defined(__x86_64__)
    engine_cpu_info ci;
    engine_cpu_info_get(&ci);
    if (ci.avx2 && ci.fma && ci.f16c) {
        engine_quant_fill_avx2(dispatch.vec_dot);
        dispatch.path = "avx2+fma";
    }
#elif defined(__aarch64__)
    engine_quant_fill_neon(dispatch.vec_dot);
    dispatch.path = "neon";
#endif
}

void engine_quant_init(void) {
    pthread_once(&dispatch_once, dispatch_init);
}

const char *engine_quant_simd_path(void) {
    engine_quant_init();
    return dispatch.path;
}

/* The public report of engine.h: the path the dispatch really chose. */
const char *engine_cpu_simd_path(void) {
    return engine_quant_simd_path();
}

float engine_vec_dot(engine_type t, int n, const void *w_row, const void *x_conv) {
    engine_quant_init();
    ENGINE_ASSERT((unsigned)t < ENGINE_TYPE_COUNT && dispatch.vec_dot[t]);
    ENGINE_ASSERT(n % type_traits[t].block_size == 0);
    return dispatch.vec_dot[t](n, w_row, x_conv);
}

void engine_quant_matvec(engine_type t, const void *W, size_t row_stride_bytes, int n_cols, int r0,
                         int r1, const void *x_conv, float *y) {
    engine_quant_init();
    ENGINE_ASSERT((unsigned)t < ENGINE_TYPE_COUNT && dispatch.vec_dot[t]);
    ENGINE_ASSERT(n_cols % type_traits[t].block_size == 0);
    const engine_vec_dot_fn fn = dispatch.vec_dot[t];
    const char *w = W;
    for (int r = r0; r < r1; r++)
        y[r] = fn(n_cols, w + (size_t)r * row_stride_bytes, x_conv);
}
