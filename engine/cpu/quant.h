/*
 * quant.h - tensor types on the CPU: block layouts, (de)quantisation, dot products.
 * Private to engine/.
 *
 * Block layouts are ggml's, byte for byte (so real community GGUF files load as they are):
 *   Q4_0: 32 values = f16 d + 16 bytes; value j<16 is the low nibble of qs[j], value j+16 the
 *         high nibble; x = d * (q - 8).
 *   Q8_0: 32 values = f16 d + 32 int8; x = d * q.
 *   Q4_K: 256 values = f16 d, f16 dmin, 12 bytes of packed 6-bit (scale, min) for 8 sub-blocks
 *         of 32, 128 bytes of nibbles; x = d*sc*q - dmin*m.
 *   Q5_K: as Q4_K plus 32 bytes qh holding the fifth bit.
 *   Q6_K: 256 values = 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits), 16 int8 scales
 *         (one per 16 values), f16 d; x = d * scale * (q - 32).
 *   Q8_K: 256 values = f32 d, 256 int8, 16 int16 sums of each group of 16 (activations only).
 *
 * Matrix-vector products: a weight row of type T is dotted with the activation vector after
 * the activation was converted ONCE per token to T's vec_dot type (traits->vec_dot_type):
 *   F32, F16, BF16  -> F32          Q4_0, Q8_0 -> Q8_0          Q4_K, Q5_K, Q6_K -> Q8_K
 * Convert with engine_quantize_row(vec_dot_type, x, buf, n) into a buffer of
 * engine_type_row_size(vec_dot_type, n) bytes, then call engine_vec_dot / engine_quant_matvec.
 *
 * SIMD: AVX2+FMA on x86-64, NEON on arm64, portable scalar everywhere; the path is chosen at
 * run time from the CPU's features the first time any kernel is used (engine_quant_init), and
 * SPARK_CPU_SIMD=scalar in the environment forces the scalar path (tests compare the two);
 * "auto" or unset is the default, any other value is logged as a warning and ignored.
 * Everything here is thread-safe and allocation-free after initialisation.
 */
#ifndef SPARK_ENGINE_QUANT_H
#define SPARK_ENGINE_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "model/gguf.h" /* engine_type */

#ifdef __cplusplus
extern "C" {
#endif

#define ENGINE_QK4_0 32
#define ENGINE_QK8_0 32
#define ENGINE_QK_K 256
#define ENGINE_K_SCALE_SIZE 12

typedef struct {
    uint16_t d;                   /* f16 scale */
    uint8_t qs[ENGINE_QK4_0 / 2]; /* nibbles: low = values 0..15, high = 16..31 */
} engine_block_q4_0;

typedef struct {
    uint16_t d; /* f16 scale */
    int8_t qs[ENGINE_QK8_0];
} engine_block_q8_0;

typedef struct {
    uint16_t d;                          /* f16 super-block scale for the scales */
    uint16_t dmin;                       /* f16 super-block scale for the mins */
    uint8_t scales[ENGINE_K_SCALE_SIZE]; /* 8 x (6-bit scale, 6-bit min), packed */
    uint8_t qs[ENGINE_QK_K / 2];         /* nibbles, 64 values per 32 bytes */
} engine_block_q4_K;

typedef struct {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[ENGINE_K_SCALE_SIZE];
    uint8_t qh[ENGINE_QK_K / 8]; /* fifth bit of each value */
    uint8_t qs[ENGINE_QK_K / 2]; /* low four bits */
} engine_block_q5_K;

typedef struct {
    uint8_t ql[ENGINE_QK_K / 2];     /* low four bits */
    uint8_t qh[ENGINE_QK_K / 4];     /* high two bits */
    int8_t scales[ENGINE_QK_K / 16]; /* one per 16 values */
    uint16_t d;                      /* f16 super-block scale */
} engine_block_q6_K;

typedef struct {
    float d;
    int8_t qs[ENGINE_QK_K];
    int16_t bsums[ENGINE_QK_K / 16]; /* sum of each group of 16 qs */
} engine_block_q8_K;

_Static_assert(sizeof(engine_block_q4_0) == 18, "block_q4_0 layout");
_Static_assert(sizeof(engine_block_q8_0) == 34, "block_q8_0 layout");
_Static_assert(sizeof(engine_block_q4_K) == 144, "block_q4_K layout");
_Static_assert(sizeof(engine_block_q5_K) == 176, "block_q5_K layout");
_Static_assert(sizeof(engine_block_q6_K) == 210, "block_q6_K layout");
_Static_assert(sizeof(engine_block_q8_K) == 292, "block_q8_K layout");

typedef struct {
    const char *name;         /* "q4_K", as ggml names it */
    int64_t block_size;       /* values per block (1 for plain types) */
    size_t type_size;         /* bytes per block */
    bool supported;           /* the CPU kernels can dequantise / dot this type */
    engine_type vec_dot_type; /* what activations are converted to (supported types only) */
} engine_type_traits;

/* Traits of tensor type `t`, or NULL when `t` is not a ggml type number. Static. */
const engine_type_traits *engine_type_traits_get(int t);

/* Static name of a type ("q4_K"), "?" when unknown. */
const char *engine_type_name(int t);

/* Bytes of a row of n values; n must be a multiple of the block size (else 0). */
size_t engine_type_row_size(engine_type t, int64_t n);

/* Decode n values (a multiple of the block size). ENGINE_EUNSUPPORTED for types without CPU
 * kernels, ENGINE_EINVAL for a bad n. Bit-exact with ggml's reference dequantisation. */
int engine_dequantize_row(engine_type t, const void *src, float *dst, int64_t n);

/* Encode n values (a multiple of the block size) into n / block_size blocks at dst.
 * Round-to-nearest with a per-block scale (and, for K-quants, a small scale/min search).
 * Deterministic: identical input gives identical bytes on every SIMD path. */
int engine_quantize_row(engine_type t, const float *src, void *dst, int64_t n);

/* Dot product of one weight row of type t (n values) with an activation row already converted
 * to t's vec_dot_type. n must be a multiple of the block size; t must be supported (both are
 * asserted, not checked: this is the hot path). */
float engine_vec_dot(engine_type t, int n, const void *w_row, const void *x_conv);

/* y[r] = dot(W row r, x_conv) for r in [r0, r1). W is row-major, row r at
 * (const char *)W + r * row_stride_bytes; y is indexed by absolute row. Callers split [0, rows)
 * across threads. */
void engine_quant_matvec(engine_type t, const void *W, size_t row_stride_bytes, int n_cols, int r0,
                         int r1, const void *x_conv, float *y);

/* Choose the kernels (idempotent, thread-safe; called implicitly by the functions above). */
void engine_quant_init(void);

/* "avx2+fma", "neon" or "scalar": the path the dispatch chose. Static. */
const char *engine_quant_simd_path(void);

/* Half-precision conversions (IEEE binary16 and bfloat16), exact for every input; f32 -> f16
 * and f32 -> bf16 round to nearest even, NaN stays NaN. */
static inline float engine_fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400u));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t engine_fp32_to_fp16(float f);

static inline float engine_bf16_to_fp32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t engine_fp32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* quiet NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

#ifdef __cplusplus
}
#endif
#endif /* SPARK_ENGINE_QUANT_H */
