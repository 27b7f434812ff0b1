/* Pieces of the CPU forward pass shared by the architectures (arch_qwen3moe.c,
 * arch_qwen35moe.c): the row-split matmul, the grouping of MoE slots by expert and the expert
 * work items. Private to engine/model. */
#ifndef SPARK_ENGINE_FFN_MOE_H
#define SPARK_ENGINE_FFN_MOE_H

#include "model/model_int.h"

#define ENGINE_FFN_ROW_BLOCK 16 /* rows per block: a block of weights stays in cache over the
                                 * batch's tokens */
#define ENGINE_MOE_CHUNK 32     /* rows of one expert matrix per MoE work item */

/* Thread ith of nth: y_i[t] = W_i x[t] for its share of the rows of up to 4 weights that read
 * the same input (n tokens, x_stride bytes apart, already in the weights' vec_dot type). Every
 * output value is computed by one thread with the same arithmetic whatever nth is. */
void engine_ffn_matmul_part(int n_w, const engine_weight *const *w, float *const *y,
                            const size_t *y_stride, const uint8_t *x, size_t x_stride, int32_t n,
                            int ith, int nth);

/* Thread ith of nth: its share of n rows of F32 (src_stride floats apart, cols wide) converted
 * to `type` (dst_stride bytes apart). */
void engine_ffn_convert_part(engine_type type, const float *src, size_t src_stride, int cols,
                             uint8_t *dst, size_t dst_stride, int32_t n, int ith, int nth);

/* Thread ith of nth: its share of n rows g = silu(g) * u (stride floats apart, cols wide),
 * each then converted to `type` into dst (dst_stride bytes apart) unless type is F32. */
void engine_ffn_swiglu_part(float *g, const float *u, size_t stride, int cols, engine_type type,
                            uint8_t *dst, size_t dst_stride, int32_t n, int ith, int nth);

/* The experts of one MoE layer. gate/up rows of expert e start gu_stride rows after those of
 * e - 1 (rows in GGUF, 2 * rows in HF's fused gate_up_proj); exp_ptr, when not NULL, holds
 * per-expert matrices instead ([3][n_expert]: gate, up, down). */
typedef struct {
    const engine_weight *gate, *up, *down;
    int64_t gu_stride;
    const uint8_t *const *exp_ptr;
} engine_moe_weights;

/* Matrix `which` (0 gate, 1 up, 2 down) of expert e. */
const uint8_t *engine_moe_expert_rows(const engine_moe_weights *w, int which, int32_t e);

/* Group the n_slots slots (token t's choice jj is slot t * k + jj; sel[slot] its expert) by
 * expert, in slot order: exp_slots[exp_start[e] .. exp_start[e+1]) are expert e's slots,
 * active[0 .. return) the experts with at least one slot, ascending. exp_start has
 * n_expert + 1 entries. */
int engine_moe_group(const int32_t *sel, int32_t n_slots, int n_expert, int32_t *exp_start,
                     int32_t *exp_slots, int32_t *active);

/* One expert pass over the grouped slots, a job for engine_pool_run. The items (an active
 * expert x ENGINE_MOE_CHUNK rows) are claimed through `next` (0 before the run). up: g[slot],
 * u[slot] = gate/up rows of the slot's expert times xg/xu of its token (slot / k); down:
 * out[slot] = down rows times x of the slot. */
typedef struct {
    engine_moe_weights w;
    const int32_t *exp_start, *exp_slots, *active;
    int n_active, k;
    const uint8_t *xg, *xu, *x; /* up: per token; down: per slot */
    size_t xg_stride, xu_stride, x_stride;
    float *g, *u;               /* up: [slots][rows of gate] */
    float *out;                 /* down: [slots][rows of down] */
    int64_t chunks, n_items, next;
} engine_moe_job;

/* Set the item count of j for the up (down = false) or down pass and reset its counter. */
void engine_moe_job_items(engine_moe_job *j, bool down);
void engine_moe_up_fn(void *job, int ith, int nth);
void engine_moe_down_fn(void *job, int ith, int nth);

#endif
