/* Private to the quant*.c files: the dot-product kernel tables each SIMD path fills, and the
 * helpers they share. Nothing outside engine/cpu/quant*.c includes this. */
#ifndef SPARK_ENGINE_QUANT_KERNELS_H
#define SPARK_ENGINE_QUANT_KERNELS_H

#include "cpu/quant.h"

/* A weight row of n values dotted with an activation row in the type's vec_dot type. */
typedef float (*engine_vec_dot_fn)(int n, const void *w_row, const void *x_conv);

/* Fill table[type] for every supported weight type (scalar), or override the entries a SIMD
 * path accelerates. The AVX2 file compiles its functions with target("avx2,fma,f16c"): only
 * call engine_quant_fill_avx2 after checking the CPU has them. */
void engine_quant_fill_scalar(engine_vec_dot_fn table[ENGINE_TYPE_COUNT]);
#if defined(__x86_64__)
void engine_quant_fill_avx2(engine_vec_dot_fn table[ENGINE_TYPE_COUNT]);
#endif
#if defined(__aarch64__)
void engine_quant_fill_neon(engine_vec_dot_fn table[ENGINE_TYPE_COUNT]);
#endif

/* Q4_K/Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes q. */
void engine_quant_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m);

/* All eight at once (the same unpacking, inlined for the dot-product loops). */
static inline void engine_quant_unpack_k4(const uint8_t *q, uint8_t sc[8], uint8_t m[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        m[j] = q[j + 4] & 63;
        sc[j + 4] = (uint8_t)((q[j + 8] & 0xF) | ((q[j] >> 6) << 4));
        m[j + 4] = (uint8_t)((q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4));
    }
}

/* Q8_K activations (reference quantizer, also used by the SIMD paths). */
void engine_quant_q8_K_ref(const float *x, engine_block_q8_K *y, int64_t nb);

#endif
