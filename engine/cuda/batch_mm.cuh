/* Products of a weight matrix with a few activation rows (m = 1 .. 64: the batched decode step),
 * reading each weight row once per step for all of them.
 *
 * engine_cu_bmm: y[i][r] = W_e[r] . xhat_i for the items i of each tile (e, first, count): the
 * items first .. first + count - 1, item i's input row x[x_idx ? x_idx[i] : i] (cols floats),
 * normalised with norm_w first when given (RMSNorm, as the decode step). Dense: one tile
 * (0, 0, m). Grouped (MoE): the tile list of engine_cu_pf_sort in device memory, so the tokens
 * routed to one expert share one read of its rows. Fused gate/up (w2 != NULL, same type):
 * y[i][r] = silu(W x) * (W2 x). accumulate: y += instead of y =.
 * A block stages up to max_stage items' inputs in shared memory in the decode step's form
 * (qdot.cuh: the CPU's 8-bit quantisation for the quantised types, F32 for the float types),
 * then each of its 8 warps takes rows (lanes over consecutive 32-value chunks) and computes the
 * row against every staged item: the row comes from DRAM once and from L1 for the other items.
 * Each output is one warp's sum in a fixed order: the result of an item does not depend on the
 * other items of its tile (bit for bit), and equals the decode step's matrix-vector product
 * (matvec_dev.cuh: same staging, same chunk order). */
#ifndef SPARK_ENGINE_CUDA_BATCH_MM_CUH
#define SPARK_ENGINE_CUDA_BATCH_MM_CUH

#include <stddef.h>
#include <stdint.h>

#include "common.cuh"

typedef struct {
    const uint8_t *w, *w2; /* matrix 0 (expert e at + e * mat_bytes); w2: fused up, or NULL */
    size_t row_bytes, mat_bytes;
    int type, rows, cols; /* cols: a multiple of 32 (of 256 for Q4_K, Q5_K, Q6_K) */
    const float *x;       /* input rows of cols floats */
    const int32_t *x_idx; /* NULL: item i reads row i */
    const float *norm_w;  /* device [cols] or NULL */
    float eps;
    float *y; /* item i at y + i * ldy */
    int ldy, accumulate;
    int m;                          /* dense: items */
    const int32_t *tiles, *n_tiles; /* grouped (device), or NULL: dense */
    int max_tiles;                  /* grouped: the grid's tiles (n_tiles <= max_tiles) */
    int max_items;                  /* the most items of one tile (dense: m) */
    int gpb; /* grouped: row groups a block takes (> 1: a tile's inputs staged once for them) */
} engine_cu_bmm_args;

/* Once per process before the first launch (not while a stream is being captured): the
 * kernels' shared-memory limit. 0 or a negative engine error. */
int engine_cu_bmm_init(void);
void engine_cu_bmm(const engine_cu_bmm_args *a, cudaStream_t stream);

/* g[i] = silu(g[i]) * u[i], i < n. */
void engine_cu_bmm_swiglu(float *g, const float *u, int n, cudaStream_t stream);

#endif
