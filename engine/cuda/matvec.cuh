/* Quantised matrix-vector products on the GPU (batch 1 decode).
 *
 * y = W x for weights of type Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, F16, BF16 or F32, read in place
 * (quantised, as uploaded) and decoded in registers; activations stay F32 and every product is
 * accumulated in F32. So the result is the exact dot product of the dequantised row with x up
 * to F32 rounding of the sum: |y - y_exact| <= ~n * 2^-24 * sum_i |w_i x_i| (the test checks
 * 1e-5 * sum |w_i x_i|). The CPU path instead quantises x to Q8_K / Q8_0 first, so GPU and CPU
 * differ by the CPU's activation quantisation error (~0.5% of sum |w_i x_i| at most).
 *
 * Fusions: an optional RMSNorm prologue (x is normalised with norm_w on the fly: every block
 * computes the scale itself, which costs an L2 read of x and saves a launch) and an optional
 * accumulate epilogue (y += W x: the residual add). Up to three matrices reading the same x
 * run in one launch (q, k, v). Host launchers only; no CUDA type leaves engine/cuda/. */
#ifndef SPARK_ENGINE_CUDA_MATVEC_CUH
#define SPARK_ENGINE_CUDA_MATVEC_CUH

#include <stddef.h>
#include <stdint.h>

#include "common.cuh"

#define ENGINE_CU_MV_ROWS 1  /* rows per warp: the x chunk in registers serves them all */
#define ENGINE_CU_MV_WARPS 4 /* warps per block */

typedef struct {
    const uint8_t *w; /* device: row r at w + r * row_bytes */
    size_t row_bytes;
    int type; /* engine_type */
    int rows;
    float *y;       /* device: rows outputs */
    int accumulate; /* y += W x instead of y = W x */
} engine_cu_mat;

typedef struct {
    engine_cu_mat m[3];
    int n_mat;
    int cols;            /* multiple of 32 */
    const float *x;      /* device: cols values */
    const float *norm_w; /* device or NULL: x := rmsnorm(x) * norm_w first */
    float eps;
} engine_cu_mv;

/* True for the weight types the GPU kernels decode. */
bool engine_cu_type_supported(int type);

/* Enqueue y_i = W_i x on `stream`. */
void engine_cu_matvec(const engine_cu_mv *a, cudaStream_t stream);

#endif
