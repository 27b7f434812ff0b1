/* The feed-forward block on the GPU: MoE experts (qwen3moe) and the dense SwiGLU (qwen3).
 *
 * engine_cu_ffn_up: h[j] = silu(G_e x) * U_e x for each of the k selected experts e = id[j]
 *   (x normalised with norm_w on the fly). For MoE every block first routes from the router
 *   logits itself (softmax over n_expert, top-k with ties to the lower id, renormalised when
 *   norm_topk), so the expert ids never leave the device and no routing launch is needed; the
 *   first block also stores ids and weights for the down kernel; the routing warp asks L2 for
 *   the block's gate and up rows as soon as it has routed. Dense: one "expert" 0 of
 *   weight 1 (n_expert = 0).
 * engine_cu_ffn_down: y += sum_j weight[j] * D_e h[j]: the down products of the selected
 *   experts, the weighted combine and the residual add in one kernel (a warp owns its output
 *   rows across all k experts: no atomics, deterministic). */
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
} engine_cu_ffn_up_args;

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
} engine_cu_ffn_down_args;

void engine_cu_ffn_up(const engine_cu_ffn_up_args *a, cudaStream_t stream);
void engine_cu_ffn_down(const engine_cu_ffn_down_args *a, cudaStream_t stream);

#endif
