/* The feed-forward block on the GPU: MoE experts (qwen3moe) and the dense SwiGLU (qwen3).
 *
 * engine_cu_ffn_up: h[j] = silu(G_e x) * U_e x for each of the k selected experts e = id[j]
 *   (x normalised with norm_w on the fly). For MoE every block first routes from the router
 *   logits itself (softmax over n_expert, top-k with ties to the lower id, renormalised when
 *   norm_topk), so the expert ids never leave the device and no routing launch is needed; the
 *   first block also stores ids and weights for the down kernel; the routing warp asks L2 for
 *   the block's gate and up rows as soon as it has routed. With `routed` (stage 6) the router
 *   launch's last block has routed into ids / weights and the routing warp only reads them. Dense: one "expert" 0 of
 *   weight 1 (n_expert = 0).
 * engine_cu_ffn_down: y += sum_j weight[j] * D_e h[j]: the down products of the selected
 *   experts, the weighted combine and the residual add in one kernel (a warp owns its output
 *   rows across all k experts: no atomics, deterministic).
 * With the router fusion (router_fuse.cuh; qwen3moe sessions by default) the residual add of the
 * attention block moves into these two kernels (x_add, y_add) and the routing scales the
 * fused launch's raw logits. */
#ifndef SPARK_ENGINE_CUDA_MOE_CUH
#define SPARK_ENGINE_CUDA_MOE_CUH

#include <stddef.h>
#include <stdint.h>

#include "common.cuh"

#define ENGINE_CU_MAX_EXPERT_USED 16
#define ENGINE_CU_MAX_EXPERT 256 /* router width the routing kernel holds in registers */

typedef struct {
    const float *router; /* device [n_expert] logits, or NULL for a dense FFN */
    int n_expert, k, norm_topk;
    const uint8_t *gate, *up; /* expert 0's rows; expert e at + e * expert_bytes */
    size_t expert_bytes, row_bytes;
    int type;       /* gate and up share it */
    int cols, rows; /* n_embd, n_ff */
    const float *x, *norm_w;
    float eps;
    float *h;       /* [k][rows] */
    int32_t *ids;   /* [k] written by the first block (MoE) */
    float *weights; /* [k] */
    /* Decode stage 5 (zero: the stage-4 launch). max_bps > 0: at most max_bps blocks per
     * multiprocessor, each looping over its (row group, expert) items, all of their rows asked
     * of L2 once routed. trigger_late: the next kernel is launched only once this one has
     * waited for its inputs (the router's logits are then complete, so a down kernel with
     * `router` set can route before its own wait). */
    int max_bps, trigger_late;
    /* Decode stage 6 (with router): the router launch before this one has routed already
     * (engine_cu_mv.route_ids == ids): the routing warp reads ids after the wait instead of
     * routing, and no block stores them. Zero: every block routes (stage 4). */
    int routed;
    /* Decode stage 6: every warp stages x (read through L2) BEFORE the wait; only when x is
     * final at this kernel's launch (after a router launch with route_late, matvec.cuh). */
    int stage_early;
    /* Router fusion (router_fuse.cuh; MoE, with router): x_add != NULL: the FFN input is h =
     * x + x_add (the attention block's output ao, which the fused wo launch wrote apart from the
     * residual x), staged with the norm; `router` holds the raw logits R x + M ao, which the
     * routing warp scales by h's RMS scale (computed as the staging does) before the softmax.
     * NULL: the FFN input is x and `router` the logits. */
    const float *x_add;
    /* With x_add and a router: rf_sh != NULL: router[n_expert] is one more raw logit (qwen35's
     * shared-expert gate), which block 0 stores scaled into *rf_sh for the down kernel. */
    float *rf_sh;
    /* Tokens as a grid dimension (the MTP verify pass, q35_mtp_host.cuh): m > 1: blockIdx.y = t
     * of m, and token t's blocks run this launch's decode block code on x + t x_stride, x_add +
     * t x_stride, router + t router_stride, rf_sh + t, h + t h_stride, ids and weights + t
     * ids_stride (each token bit for bit a decode launch of its own); m <= 1: one token, the
     * decode kernels (strides unused). Not with the stage-5/6 fields. tok_blocks > 0 (with
     * m > 1): at most tok_blocks blocks per token, each looping over its items with all of
     * their rows asked of L2 once routed (as max_bps does), so that the m tokens' blocks fit
     * one wave; each row's sum is the same whichever block computes it. */
    int m, tok_blocks;
    size_t x_stride, router_stride, h_stride, ids_stride;
    /* Diagnosis (SPARK_CUDA_DIAG_MOE, the same results): bit 1 the routing warp routes twice,
     * bit 2 the block stages x twice; an A/B of the timing gives each stage's cost. */
    int diag;
    /* Routing in the up blocks (SPARK_CUDA_ROUTE, backend.cu): ENGINE_CU_ROUTE_SHFL the top-k by
     * rounds of warp shuffles, else by warp reductions (sm_80+; the same results bit for bit;
     * measured +1.25% tok/s on the 12-block Qwen3-30B-A3B cut, +0.95% on the 8-block Qwen3.5
     * cut, H200, session 7 call 3). */
    int route;
    /* Router fusion (x_add): the RMS scale of h by the whole block in one round trip
     * (qdot.cuh engine_cu_block_scale) for the routing warp and the staging, instead of by
     * each warp (SPARK_CUDA_COOP_SCALE, default on; another summation order than the unfused
     * path's). */
    int coop;
} engine_cu_ffn_up_args;

#define ENGINE_CU_ROUTE_SHFL 1
/* The routing warp asks L2 for its item's gate and up runs with one bulk prefetch each
 * (common.cuh engine_cu_prefetch_bulk, lane 0) instead of a line prefetch per lane and line:
 * SPARK_CUDA_PF_BULK, default on (session 13: the loop of line prefetches took ~1 us of the
 * routing warp's time, between its routing and the block's barrier). */
#define ENGINE_CU_ROUTE_BULK 2
/* The block's weight rows copied into shared memory by bulk copies (common.cuh
 * engine_cu_bulk_g2s, sm_90+), all in flight at once, and its products computed from there: the
 * up launch's routing warp copies its item's gate and up runs once routed (a dense FFN's before
 * the wait), the down launch's thread 0 its row group of each chosen expert once the ids are
 * read. SPARK_CUDA_TMA (below). The launchers take it only where it applies (one item or row group
 * per block, a quantised type, 16-byte-aligned runs, the stage-4 decode launch) and run the
 * path before it otherwise; the same products and sums, bit for bit. */
#define ENGINE_CU_ROUTE_TMA 4
/* The bulk copies of the MoE down launch (engine_cu_ffn_down_args.tma) and of the decode
 * matvecs (engine_cu_mv.tma), set from the same setting: SPARK_CUDA_TMA unset or 1 all three
 * (the default since session 15), 0 none, or letters for parts: u the up launch, d the down, m
 * the matvecs. (An "s" part, the up copies started from the raw router logits' ranks before the
 * scale and the softmax and checked after, measured slower in session 15: 472.6 against 476.8
 * tok/s on Qwen3; removed.) */
#define ENGINE_CU_ROUTE_TMA_DN 16
#define ENGINE_CU_ROUTE_TMA_MV 32
/* The value of a SPARK_CUDA_ROUTE setting: "shfl" ENGINE_CU_ROUTE_SHFL, anything else ("redux")
 * 0; NULL: dflt; | ENGINE_CU_ROUTE_BULK unless SPARK_CUDA_PF_BULK=0; | the bulk-copy flags
 * SPARK_CUDA_TMA asks for (above). (A "fast" form, the lanes' keys sorted first, ran bit for bit
 * but slower in session 14: 478.3 vs 483.5 tok/s Qwen3.5, 473.5 vs 475.9 Qwen3; removed.) */
int engine_cu_route_parse(const char *v, int dflt);
/* One warp's routing of n logits (device pointers; ids / wts: k each), as the up launch's
 * routing warp with those ENGINE_CU_ROUTE_* flags routes (the op test). */
void engine_cu_route_test(const float *logits, int n, int k, int norm, int flags, int32_t *ids,
                          float *wts, cudaStream_t stream);

typedef struct {
    const uint8_t *down; /* expert 0's rows */
    size_t expert_bytes, row_bytes;
    int type;
    int cols, rows; /* n_ff, n_embd */
    int k;
    const float *h;     /* [k][cols] */
    const int32_t *ids; /* [k] or NULL (dense: expert 0, weight 1) */
    const float *weights;
    float *y;  /* [rows], accumulated into */
    int touch; /* bring the warp's rows of the k experts into L1 first (else L2 only) */
    /* Decode stage 5 (zero: the stage-4 launch). max_bps > 0: at most max_bps blocks per
     * multiprocessor, each looping over its row groups, every expert row asked of L2 before the
     * wait. router != NULL (only after an up launch with trigger_late): each block routes from
     * these logits itself (n_expert, norm_topk; ids and weights then unused) BEFORE its wait,
     * so that it fetches its experts' rows while the up kernel runs. sh_logit != NULL: slot
     * k - 1 is a shared expert of id sh_id and weight sigmoid(*sh_logit) (qwen35moe; its
     * ids / weights entries are not read). */
    int max_bps;
    /* Decode stage 6: ids / weights are final when this kernel starts (the router launch routed
     * them and the up launch triggered late: engine_cu_mv.route_ids, ffn_up_args.trigger_late),
     * so each block reads them (through L2) and asks L2 for its experts' rows BEFORE its wait. */
    int ids_early;
    const float *router;
    int n_expert, norm_topk;
    const float *sh_logit;
    int sh_id;
    /* Decode stage 5: each warp loads its first two (expert, chunk) items into registers as
     * soon as the ids are known (before the wait with `router`, else before the staging of h;
     * quantised types, not with touch); bit for bit the results without. */
    int preload;
    /* Router fusion: y_add != NULL: y[r] = (y[r] + y_add[r]) + sum (the residual add the fused
     * wo launch left out, in the order the unfused path rounds it); NULL: y[r] += sum. */
    const float *y_add;
    /* Tokens as a grid dimension (as engine_cu_ffn_up_args.m): m > 1: token t's blocks
     * (blockIdx.y) take h + t h_stride, ids and weights + t ids_stride, y and y_add + t
     * y_stride, sh_logit + t; m <= 1: the decode kernels. Not with the stage-5/6 fields.
     * tok_blocks: as engine_cu_ffn_up_args.tok_blocks (row groups per block). */
    int m, tok_blocks;
    size_t h_stride, ids_stride, y_stride;
    int diag; /* as engine_cu_ffn_up_args.diag: bit 2 the block stages h twice */
    /* Lane j of each warp asks L2 for the warp's row of expert slot j with one bulk prefetch
     * (engine_cu_prefetch_bulk) instead of the warp's line prefetches per slot (the up
     * launch's ENGINE_CU_ROUTE_BULK; set from it). */
    int pf_bulk;
    /* The block's rows of the k experts copied into shared memory once the ids are read
     * (ENGINE_CU_ROUTE_TMA; set from the up launch's flags). */
    int tma;
} engine_cu_ffn_down_args;

void engine_cu_ffn_up(const engine_cu_ffn_up_args *a, cudaStream_t stream);
void engine_cu_ffn_down(const engine_cu_ffn_down_args *a, cudaStream_t stream);

#endif
