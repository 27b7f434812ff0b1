/* Quantised matrix-vector products on the GPU (batch 1 decode).
 *
 * y = W x for weights of type Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, F16, BF16 or F32, read in place
 * (quantised, as uploaded). Each block first stages x in shared memory (qdot.cuh): for the
 * quantised types as the 8-bit values the CPU's dot products use (Q8_K or Q8_0, quantised the
 * same way; integer dot products, dp4a), for the float types as F32. So for the float types y
 * is the exact dot product up to F32 rounding of the sum, and for the quantised ones the exact
 * dot product of the dequantised row with the CPU's 8-bit xhat: |y - sum_i w_i xhat_i| <=
 * ~1e-6 * sum_i |w_i xhat_i| (the test checks 1e-5), the CPU's result up to summation order.
 *
 * A warp computes a row (its lanes take consecutive 32-value chunks: coalesced weight reads),
 * or two rows at once when one row per warp would take more than one wave of blocks; a block
 * has ENGINE_CU_MV_WARPS warps. A matrix of fewer rows than the device has multiprocessors
 * (the MoE router) gets a block per row, its warps splitting the row (split-K). A single large
 * matrix (the output head) is covered by one wave of resident blocks that loop over row
 * groups, so the staging is paid once per block.
 * Before waiting for the previous kernel (programmatic dependent launch) each warp asks L2 for
 * its first rows, so the weight fetch overlaps the previous kernel's tail and the staging.
 * With `touch` (quantised types) it loads one byte of each 128-byte line instead, so the rows
 * land in its multiprocessor's L1; measured 4% slower on the H200 (bench/RESULTS.md, stage 3),
 * so sessions use it only with SPARK_CUDA_TOUCH=1; the op tests run it.
 * Fusions: an optional RMSNorm prologue (in the staging) and an optional accumulate epilogue
 * (y += W x: the residual add). Up to three matrices reading the same x run in one launch
 * (q, k, v). Host launchers only; no CUDA type leaves engine/cuda/. */
#ifndef SPARK_ENGINE_CUDA_MATVEC_CUH
#define SPARK_ENGINE_CUDA_MATVEC_CUH

#include <stddef.h>
#include <stdint.h>

#include "common.cuh"

#define ENGINE_CU_MV_WARPS 8 /* warps per block, a row each */
#define ENGINE_CU_VMAX 5     /* vectors of one m-vector product (the MTP verify pass: k + 1 tokens for
                                k <= 4 drafts; q35_verify.cuh, vmv_dev.cuh) */

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
    int touch; /* bring each warp's first rows into L1 before the wait (else L2 only) */
    /* Decode stage 5: > 0: at most max_bps blocks per multiprocessor, each looping over its row
     * groups, with ALL of its rows asked of L2 before the wait (so that the next kernels' blocks
     * stay resident beside this one and fetch their weights while it runs); 0: a block per row
     * group (stage 4). Zero-initialised callers keep the stage-4 plan. */
    int max_bps;
    /* Decode stage 5: each warp loads the first chunk of its first rows into registers before
     * the wait (quantised types, not with touch), so that those loads overlap the wait and the
     * staging; the results are bit for bit those without. */
    int preload;
    /* Decode stage 6 (route_ids != NULL; the MoE router: one matrix of route_n <= 256 rows):
     * after its rows each block counts itself done on *route_count (zero before the launch,
     * zero again after it), and the block that finishes last routes from the complete logits
     * (softmax, top route_k with ties to the lower id, renormalised when route_norm: the same
     * device function and arithmetic as the MoE up kernel's routing, moe_dev.cuh) into
     * route_ids / route_wts, so that the up and down kernels read the ids after their wait
     * instead of routing in every up block (engine_cu_ffn_up_args.routed). Per-op launches
     * only: the fused step's phases drop it. */
    int32_t *route_ids;
    float *route_wts;
    unsigned *route_count;
    int route_n, route_k, route_norm;
    /* with route_ids: the next kernel is launched only once every block has waited for its
     * inputs (x final then: the up kernel may stage it before its own wait, moe.cuh) */
    int route_late;
    /* With norm_w: the RMS scale of x computed once by the whole block (qdot.cuh
     * engine_cu_block_scale) and handed to the staging, instead of by each warp
     * (SPARK_CUDA_COOP_MV=1: the normed launches of qwen3moe and qwen35moe sessions and of the
     * MTP verify pass; off by default: no gain measured in session 8; another summation order,
     * so not bit for bit the per-warp scale). */
    int coop;
    /* Several matrices whose two-row groups would not fit one wave of blocks (qwen35moe's mixer
     * in-projections: 8256 and 9216 rows): three rows per warp when that fits one wave, so no
     * block starts after the first ones finish (each row's sum is the same whichever warp
     * computes it). 0: two-row groups in more than one wave. */
    int r3;
    /* The output head's repacked copy (one matrix of type ENGINE_CU_TYPE_Q6_KR): 4 = four rows a
     * warp in blocks with registers for two a multiprocessor (the sessions' default,
     * engine_cu_head_rows_env); 0 the plan's one or two rows a warp at three blocks a
     * multiprocessor. The same sums either way. */
    int q6r_rows;
    /* Each block's rows bulk-copied into shared memory before the wait and computed from there
     * (matvec_dev.cuh mv_block_tma; SPARK_CUDA_TMA, moe.cuh ENGINE_CU_ROUTE_TMA_MV). Asked by the
     * session; the launchers (engine_cu_matvec, engine_cu_rf_wo) keep it only where it applies
     * (engine_cu_mv_tma_smem) and clear it otherwise. */
    int tma;
    /* One large matrix of a quantised type (the output head) looped over by one block a
     * multiprocessor whose warps stream their rows through rings of bulk copies in shared
     * memory (matvec_dev.cuh mv_block_ring; SPARK_CUDA_HEAD_RING): 1 = 8 warps of 4-row tiles,
     * 2 = 16 warps of 2-row tiles, 3 = 16 warps of 4-row tiles; 0 the plan above. Asked by the
     * session; the launcher takes it only where it applies (engine_cu_mv_ring_bufs). The same
     * sums either way. */
    int ring;
    /* With norm_w: the staging warps read their norm weights after the wait, as before session
     * 27 (SPARK_CUDA_NW_LATE=1, for an A/B), instead of before it (qdot.cuh engine_cu_stage_nw).
     * The same values either way. */
    int nw_late;
    /* 1: where every matrix is Q8_0, or every one Q4_K, the bulk-copy form (tma) runs in a
     * kernel instance holding that type's products alone (matvec_dev.cuh TT;
     * SPARK_CUDA_MV_SPEC=0 off). The same sums. Session 39 call A, one process per
     * order: Q4_K_M +0.2-0.3% in both orders, Q8_0 +1.0% in one and 0 in the other. The
     * instance holds the bulk-copy form alone (matvec_dev.cuh mv_block TO); 3: the type's
     * instance with every form in its image, as in call A; 4 (the sessions' default since
     * session 40): as 1, and matrices of mixed or other types in the generic instance with the
     * bulk-copy form alone. Session 40 call F (spark-agent bench tg128 gen, Q4_K_M, whose
     * layers with a Q6_K v take it; with RF_SPEC=1): 680.53 / 680.47 against 675.64 / 675.31
     * (+0.7%). */
    int spec;
} engine_cu_mv;
#define ENGINE_CU_MV_RING_MAX 8 /* buffers a warp, at most */

/* True for the weight types the GPU kernels decode. */
bool engine_cu_type_supported(int type);

/* Enqueue y_i = W_i x on `stream`. */
void engine_cu_matvec(const engine_cu_mv *a, cudaStream_t stream);

/* How engine_cu_matvec's launch covers the rows of a's matrices (all of one staging mode, no
 * routing): rows per warp r (0: split-K, a block per row), blocks, row groups, and the dynamic
 * shared memory; for a launch of its own that runs mv_block (matvec_dev.cuh) on them with the
 * same row split, so the same sums (router_fuse.cu). */
typedef struct {
    int r, blocks, n_groups;
    size_t smem;
} engine_cu_mv_plan;
engine_cu_mv_plan engine_cu_matvec_plan(const engine_cu_mv *a);

/* With a->tma: the dynamic shared memory a block of plan p's launch needs for the bulk copies
 * (the staging's and a group's rows), or 0 where they do not apply: split-K or looping plans
 * (the output head), the stage-5/6 fields, an architecture before sm_90, float types, rows not
 * a multiple of 16 bytes or not 16-byte aligned. The caller checks that its kernel still fits
 * p's blocks in one wave with that memory. */
size_t engine_cu_mv_tma_smem(const engine_cu_mv *a, const engine_cu_mv_plan *p);
/* The ring form's buffers a warp (>= 2) where it applies to a (a.ring, one quantised matrix of
 * 16-byte rows at a 16-byte boundary, more tiles than a wave has warps, sm_90 and later), else
 * 0; *smem its dynamic shared memory. */
int engine_cu_mv_ring_bufs(const engine_cu_mv *a, size_t *smem);

/* The output head's repacked copy (ENGINE_CU_TYPE_Q6_KR, dequant.cuh: the same values, laid out
 * for coalesced loads), read by the decode and MTP head launches; the prefill and batch GEMMs
 * keep reading the file's Q6_K rows. Rows of the copy are engine_cu_q6r_row_bytes apart. */
size_t engine_cu_q6r_row_bytes(size_t row_bytes); /* a Q6_K row's bytes rounded up to 16 */
void engine_cu_q6r_repack(const uint8_t *src, size_t src_rb, uint8_t *dst, int rows, int cols,
                          cudaStream_t stream);
/* At model load: *out = a new device allocation (rows x engine_cu_q6r_row_bytes; cudaFree it)
 * holding the repacked copy of the head at src, or NULL where there is none to make: the head
 * is not Q6_K, SPARK_CUDA_HEAD_REPACK=0 at load, or the device lacks the memory (a warning: the
 * head stays as it is). 0, or an engine error of a failing CUDA call. */
int engine_cu_head_copy(const uint8_t *src, int type, int rows, int cols, size_t row_bytes,
                        uint8_t **out);
/* engine_cu_head_copy for a backend's weight view W (fields d, type, rows, cols, row_bytes):
 * *copy = the view of the copy in *mem (d NULL where none was made). */
template <typename W> int engine_cu_head_copy_view(const W &head, W *copy, uint8_t **mem) {
    int rc = engine_cu_head_copy(head.d, head.type, head.rows, head.cols, head.row_bytes, mem);
    if (rc || !*mem) return rc;
    *copy = head;
    copy->d = *mem;
    copy->type = ENGINE_CU_TYPE_Q6_KR;
    copy->row_bytes = engine_cu_q6r_row_bytes(head.row_bytes);
    return 0;
}
/* Whether a session reads the copy (SPARK_CUDA_HEAD_REPACK, default 1; read at session
 * creation). */
bool engine_cu_head_copy_wanted(void);
/* engine_cu_mv.q6r_rows of a session's head launches: 4 (SPARK_CUDA_HEAD_ROWS unset or 4), or
 * 0 (any other value: the plan's one or two rows a warp). Session 12 call 5, same process:
 * Qwen3.5-35B-A3B 475.0 against 473.7 tok/s, Qwen3-30B-A3B 473.8 against 472.2, the MTP draft
 * step 189 against 202 us. */
int engine_cu_head_rows_env(void);
/* engine_cu_mv.ring of a session's head launch: SPARK_CUDA_HEAD_RING (0..3), else dflt. Session 26
 * call D (H200, tg128, one process each): form 1 against 0 gave Qwen3-30B-A3B Q4_K_M 577.8
 * against 575.8 tok/s and Q8_0 493.5 against 488.9, so qwen3moe sessions take 1; Qwen3.5's
 * 8-layer cut 466.1 against 464.0 us a token, so qwen35moe sessions take 0. */
int engine_cu_head_ring_env(int dflt);

#endif
