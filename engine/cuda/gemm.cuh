/* Matrix-matrix products on tensor cores for prefill and batched passes: Y[m][rows] = X W^T.
 *
 * The weights stay as uploaded (quantised, engine/cpu/quant.h layouts) and are decoded tile by
 * tile into shared memory; the activations are prepared once per matrix input by
 * engine_cu_gemm_prep into the form the weight type wants:
 *   Q4_K, Q5_K, Q6_K (Q8_K activations) and Q8_0, Q4_0 (Q8_0 activations): int8 quantised
 *     exactly as the CPU quantises activations for its dot products (qdot.cuh staging, the
 *     same code as the decode kernels). The product runs on int8 tensor cores (mma.sync
 *     m16n8k16 s8): each 16-value run of a weight row is s * q + o (q int8: Q4_K/Q5_K q with
 *     o = -dmin * m, Q6_K q - 32, Q4_0 q - 8), and each 16-column step adds
 *     s * dx * (sum q xq) + o * (dx * sum xq) in F32: the CPU's products up to summation order
 *     (with engine_cu_gemm_args.kint, Q4_K / Q5_K / Q6_K: the CPU's integer sums over each
 *     256-column superblock, converted once per superblock).
 *   F16 and BF16: X rounded to the weight's own 16-bit type, products on F16/BF16 tensor cores
 *     (mma.sync m16n8k16, F32 accumulation): exact products of the rounded X.
 *   F32 (the MoE router): F32 SIMT tiles, exact F32 products (routing must match the CPU).
 * One kernel body for the seven tensor-core types: the decode switches on the type at run time
 * inside the tile load (two instantiations: int8 and 16-bit float).
 *
 * Tiles: 64 X rows x 64 weight rows, or 32 X rows x 128 weight rows (the default of grouped
 * mode: at a few dozen rows per expert half of a 64-row tile would be padding), x 128 columns
 * per step, 4 warps of 32 x 32. Columns must be a multiple of 128 for the tensor-core types
 * (every K-quant row is; Q8_0 / Q4_0 / F16 rows of 32-multiple lengths are zero-padded per
 * tile). The int8 sums start from a float bias, so that one F32 subtraction converts them.
 * Grouped mode (MoE): a device list of tiles (matrix index, first X row, X row count), the X
 * rows gathered through an index (the token of each sorted expert slot); blocks past the
 * device count exit at once, so the grid is sized by an upper bound and nothing returns to the
 * host. Host launchers only. */
#ifndef SPARK_ENGINE_CUDA_GEMM_CUH
#define SPARK_ENGINE_CUDA_GEMM_CUH

#include <stddef.h>
#include <stdint.h>

#include "common.cuh"

#define ENGINE_CU_GEMM_BM 64  /* X rows of a grouped-mode tile list entry (at most) */
#define ENGINE_CU_GEMM_BN 64  /* weight rows per block tile (64-row tiles) */
#define ENGINE_CU_GEMM_BK 128 /* columns per step */

/* engine_cu_gemm_args.pipeline bits */
#define ENGINE_CU_GEMM_PIPE_K45 1 /* Q4_K, Q5_K */
#define ENGINE_CU_GEMM_PIPE_Q6 2  /* Q6_K */
#define ENGINE_CU_GEMM_PIPE_Q8 4  /* Q8_0, Q4_0 */
#define ENGINE_CU_GEMM_PIPE_ALL 7

/* Activation forms (engine_cu_gemm_xform). */
enum {
    ENGINE_CU_GX_Q8_K = 0, /* int8 per 256, d per 32 entry, s = d * sum q per 16, b (below) */
    ENGINE_CU_GX_Q8_0 = 1, /* int8 per 32, d rounded to F16 */
    ENGINE_CU_GX_F16 = 2,
    ENGINE_CU_GX_BF16 = 3,
    ENGINE_CU_GX_F32 = 4,
};

/* The activation form weights of `type` take; -1 when the GEMM does not handle the type. */
int engine_cu_gemm_xform(int type);
/* True when the GEMM handles rows of `cols` values of `type`. */
bool engine_cu_gemm_ok(int type, int cols);

/* Prepared activations: m rows of `cols` values in form `form`. Buffers are the caller's;
 * engine_cu_gemm_x_bytes gives the size of one block holding all of its parts. */
typedef struct {
    int form, cols;
    const void *v;   /* int8 [m][cols] | uint16 [m][cols] | float [m][cols] */
    const float *d;  /* int8 forms: [m][cols / 32] */
    const float *s;  /* int8 forms: [m][cols / 16] */
    /* Q8_K: [m][cols / 32] the int sum of each 32-value run as two F16 halves, low 16 bits
     * lo = sum & 63, high 16 bits hi = sum >> 6 (sum = 64 hi + lo, both exact in F16), for the
     * int superblock epilogue (engine_cu_gemm_args.kint); NULL for the other forms */
    const uint32_t *b;
} engine_cu_gx;

size_t engine_cu_gemm_x_bytes(int form, int m, int cols);

/* Prepare m rows of X for form `form` into buf (engine_cu_gemm_x_bytes bytes), filling *gx.
 * Row t of the input is x + t * ldx (F32), RMS-normalised with norm_w (NULL: none) and eps;
 * with g != NULL the input is instead silu(g) * x elementwise (SwiGLU, g + t * ldx; no norm).
 * cols a multiple of 32 (of 256 for Q8_K). */
void engine_cu_gemm_prep(engine_cu_gx *gx, void *buf, int form, int m, int cols, const float *x,
                         const float *g, int ldx, const float *norm_w, float eps,
                         cudaStream_t stream);

/* A further matrix of a product over the same X (engine_cu_gemm_args.more). */
typedef struct {
    const uint8_t *w; /* device: row 0 (grouped mode: of matrix 0, matrix i at + i * mat_bytes) */
    float *y;         /* device: Y row i at y + i * ldy */
    int rows, ldy;
} engine_cu_gemm_part;

typedef struct {
    const uint8_t *w; /* device: matrix 0, row 0 */
    size_t row_bytes, mat_bytes; /* mat_bytes: matrix i at w + i * mat_bytes */
    int type, rows, cols;
    engine_cu_gx x;   /* prepared X (the form of this type) */
    int m;            /* X rows (dense mode) */
    const int32_t *x_idx; /* NULL, or device: tile row i reads X row x_idx[i] (grouped mode) */
    float *y;         /* device: Y row i at y + i * ldy */
    int ldy;
    int accumulate;   /* Y += X W^T */
    /* grouped mode: tiles[j] = (matrix, first row, row count) for j < *n_tiles, at most
     * max_tiles; NULL: dense, matrix 0, X rows 0 .. m-1 */
    const int32_t *tiles, *n_tiles;
    int max_tiles;
    /* F32 weights: split the columns over ksplit (>= 1) blocks, split z writing its partial
     * sums to y + z * m * ldy (no accumulate); the reader adds them in order. Tensor-core
     * types, dense mode, with kpart set: split-K over ksplit (at most one per 128-column step)
     * blocks writing partial sums to kpart (engine_cu_gemm_kpart_bytes), then one launch adds
     * each element's splits in order into y (accumulate: y += their sum); other arithmetic
     * than the unsplit product (the partial sums round apart), the same for every run */
    int ksplit;
    float *kpart;
    /* tensor-core types: X rows per block tile, 32 or 64 (0: 32 in grouped mode, else 64) */
    int tile_rows;
    /* nonzero: the first kernels (64-row tiles, int-to-float conversions), for A/B runs */
    int legacy;
    /* n_more (<= 2) further matrices of the same type, columns, row_bytes (and mat_bytes)
     * over the same X and tiles in the same launch (their column tiles follow w's), so that
     * narrow products (k, v) share the launch of a wide one (q), and gate and up one launch;
     * accumulate applies to all (F32 weights: one launch each) */
    engine_cu_gemm_part more[2];
    int n_more;
    /* nonzero: the next step's weight blocks are prefetched into L1 (default: L2 only) */
    int prefetch_l1;
    /* ENGINE_CU_GEMM_PIPE_* bits: the staged kernels for those types (each step's raw weight
     * bytes copied into shared memory with cp.async one step ahead, decoded from there; the
     * same arithmetic). Q6_K / Q8_0 / Q4_0 blocks are 2-byte aligned: covering 16-byte
     * pieces, nothing read past a row's end */
    int pipeline;
    /* nonzero, tensor-core types: 64 X rows x 128 weight rows per block of 8 warps (grouped
     * mode: one block per list entry, so a weight tile is decoded once for all of an entry's
     * rows), the 16-row fragments past the tile's rows skipping their products, the SV scale
     * layout. Opt-in */
    int wide;
    /* nonzero, int8 forms: the scales in shared memory in the warps' fragment order, so that
     * each 32-column step loads them as six 16-byte vectors per thread instead of 24 words,
     * the 16-row fragments past the tile's rows skipping their products, <= 128 registers and
     * 4 blocks per multiprocessor (the same arithmetic). Opt-in */
    int svec;
    /* nonzero: svec, and the staged Q4_K / Q5_K kernels read their weight fragments straight
     * from the staged raw bytes (no decoded int8 tile in shared memory; the same values and
     * arithmetic). Opt-in */
    int direct;
    /* nonzero, 32-row tiles (tile_rows 32 or grouped mode): the CPU's integer order inside a
     * superblock. Q4_K / Q5_K (with direct; dot_k45_block's order): each 32-column run's int8
     * product times its 6-bit scale summed in int32 over a superblock, the minimums' term
     * sum m * (x run sum) on F16 tensor cores (exact integers), and d * sumi - dmin * summ
     * added once per superblock in F32. Q6_K (not staged): each 16-column product times its
     * int8 scale summed in int32, d * xd * sumi once per superblock. Split-K splits whole
     * superblocks (the F32 epilogue runs where the splits outnumber them). Other rounding than
     * the F32 epilogue; fewer instructions per product (the prefill's default). 3: Q4_K / Q5_K
     * with registers for 3 blocks a multiprocessor instead of 4 */
    int kint;
} engine_cu_gemm_args;

void engine_cu_gemm(const engine_cu_gemm_args *a, cudaStream_t stream);

/* The bytes of kpart a's split-K needs (0: it runs unsplit); the blocks of a's launch (0 for
 * F32 weights). */
size_t engine_cu_gemm_kpart_bytes(const engine_cu_gemm_args *a);
unsigned engine_cu_gemm_blocks(const engine_cu_gemm_args *a);

#endif
