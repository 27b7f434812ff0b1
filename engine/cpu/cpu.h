/*
 * cpu.h - the CPU backend's thread pool and F32 ops (private to engine/).
 *
 * Activations are F32 throughout. Weights stay where the model file maps them and are read
 * through quant.h's dot products (see engine_cpu_matmul). Every op here has a naive
 * counterpart in the tests (tests/engine/test_forward_ops.c) that it is checked against.
 *
 * None of these functions allocate; the caller provides all scratch memory.
 */
#ifndef SPARK_ENGINE_CPU_H
#define SPARK_ENGINE_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"

/* ---------------------------------------------------------------------------------------------
 * Thread pool: persistent workers, one job at a time, the caller works as thread 0.
 *
 * engine_pool_run(pool, fn, ctx) calls fn(ctx, ith, nth) once on each of the nth threads and
 * returns when all have returned (a full barrier). Workers spin for a short while after a job
 * and then sleep on a condition variable, so a token loop pays no syscall between ops while an
 * idle engine burns no CPU. One pool serves one caller thread at a time (not re-entrant).
 * ------------------------------------------------------------------------------------------- */
typedef struct engine_pool engine_pool;
typedef void (*engine_pool_fn)(void *ctx, int ith, int nth);

/* n_threads >= 1 (1 = no worker threads). ENGINE_ENOMEM / ENGINE_EINTERNAL on failure. */
int engine_pool_new(engine_pool **out, int n_threads);
void engine_pool_free(engine_pool *pool);
int engine_pool_size(const engine_pool *pool);
void engine_pool_run(engine_pool *pool, engine_pool_fn fn, void *ctx);

/* The [*r0, *r1) share of thread ith of nth over n items, in contiguous chunks. */
static inline void engine_split(int64_t n, int ith, int nth, int64_t *r0, int64_t *r1) {
    int64_t per = (n + nth - 1) / nth;
    int64_t a = per * ith, b = a + per;
    *r0 = a < n ? a : n;
    *r1 = b < n ? b : n;
}

/* The number of logical CPUs this process may run on (sched_getaffinity), at least 1. */
int engine_cpu_count(void);

/* ---------------------------------------------------------------------------------------------
 * Ops on F32 vectors
 * ------------------------------------------------------------------------------------------- */

/* y = x / sqrt(mean(x^2) + eps) * w, n elements; y may alias x. */
void engine_cpu_rmsnorm(float *y, const float *x, const float *w, int n, float eps);

/* In-place softmax over n values; returns nothing, values sum to 1. */
void engine_cpu_softmax(float *x, int n);

/* NeoX-style rotary embedding ("rotate halves") of n_heads heads of head_dim values (head_dim
 * even) at position pos: for i < head_dim/2, the pair (x[i], x[i + head_dim/2]) turns by the
 * angle pos * inv_freq[i]. inv_freq comes from engine_cpu_rope_inv_freq. */
void engine_cpu_rope_neox(float *x, int n_heads, int head_dim, int32_t pos,
                          const float *inv_freq);

/* inv_freq[i] = 1 / theta^(2i / head_dim), computed in F32 as the reference implementation
 * does, for i < head_dim/2. */
void engine_cpu_rope_inv_freq(float *inv_freq, int head_dim, float theta);

/* y[i] = silu(g[i]) * u[i] for n values; y may alias g. */
void engine_cpu_swiglu(float *y, const float *g, const float *u, int n);

/* ---------------------------------------------------------------------------------------------
 * Attention over a KV cache seen through a block table.
 *
 * The cache of one layer is a list of blocks of `block_size` positions each; position p lives in
 * block blocks[p / block_size] at row p % block_size; a row holds n_head_kv * head_dim values
 * (K and V separately) of type F32 or F16. Today's contiguous per-session cache is one block of
 * n_ctx positions; the paged pool (issue 4) passes its block table unchanged.
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    void *const *k_blocks;   /* [n_blocks] -> [block_size][n_head_kv * head_dim] */
    void *const *v_blocks;
    int32_t block_size;
    engine_kv_type type;
    int n_head_kv;
    int head_dim;
} engine_kv_view;

/* Bytes of one K (or V) row of n_head_kv * head_dim values of type t: 4 or 2 per value for F32
 * and F16; Q8_0 stores each head's head_dim values as head_dim / 32 blocks of 34 bytes (an F16
 * scale + 32 int8), so a head starts on a block boundary. 0 when the type is unknown or Q8_0
 * with head_dim not a multiple of 32. */
size_t engine_cpu_kv_row_bytes(engine_kv_type t, int n_head_kv, int head_dim);

/* Store one position's K and V rows (each n_head_kv * head_dim F32 values) at position pos
 * (rounded to F16, or quantised to Q8_0 per block of 32). */
void engine_cpu_kv_store(const engine_kv_view *kv, int32_t pos, const float *k, const float *v);

#define ENGINE_CPU_MAX_HEAD_DIM 1024

/* Causal attention of the n_q query heads that share KV head kv_head (a GQA group) over
 * positions [0, n_pos): out[h] = softmax(q[h] . K^T * scale) V for h < n_q, each head_dim
 * values (q and out hold n_q * head_dim). Each K and V row is read (and, for F16, converted)
 * once for the whole group. Q8_0: each query head is quantised to Q8_0 once and dotted with
 * the K rows of a block by the integer kernels of quant.h (AVX2 / NEON); V rows are
 * dequantised on the fly into the weighted sums. `scores` is scratch of n_q * n_pos floats.
 * head_dim <= ENGINE_CPU_MAX_HEAD_DIM. */
void engine_cpu_attention_group(float *out, const float *q, int n_q, const engine_kv_view *kv,
                                int kv_head, int32_t n_pos, float scale, float *scores);

/* The same for one query head (n_q = 1). */
void engine_cpu_attention_head(float *out, const float *q, const engine_kv_view *kv,
                               int kv_head, int32_t n_pos, float scale, float *scores);

/* ---------------------------------------------------------------------------------------------
 * MoE routing
 * ------------------------------------------------------------------------------------------- */

/* Softmax over n_expert router logits, pick the k largest (ties: lower id first), and when
 * norm_topk renormalise their weights to sum to 1. Writes ids[k] (descending weight) and
 * weights[k]. `probs` is scratch of n_expert floats. */
void engine_cpu_moe_route(const float *logits, int n_expert, int k, int norm_topk,
                          int32_t *ids, float *weights, float *probs);

/* ---------------------------------------------------------------------------------------------
 * Gated DeltaNet (linear attention) ops (ops_ssm.c)
 * ------------------------------------------------------------------------------------------- */
#define ENGINE_CPU_MAX_CONV 16

/* y = x * scale / sqrt(sum(x^2) + eps) over n values (the FLA library's l2norm; y may alias x). */
void engine_cpu_l2norm(float *y, const float *x, int n, float eps, float scale);

/* Causal depthwise convolution of one channel over n steps, in place: x[t * stride] becomes
 * sum_i w[i] * in[t - (k-1) + i] (w[k-1] weighs the current input), SiLU'd when silu. `state`
 * holds the k-1 inputs before step 0 (oldest first) and is advanced to the last k-1 inputs.
 * 1 <= k <= ENGINE_CPU_MAX_CONV. */
void engine_cpu_conv1d_causal(float *x, size_t stride, int n, const float *w, int k,
                              float *state, bool silu);

/* One step of the gated delta rule for one head, state s [dk][dv] (row i for key dim i):
 *   s *= g;  s += k ((v - s^T k) * beta)^T;  o = s^T q
 * q is expected already scaled (1/sqrt(dk)); tmp is scratch of dv floats. */
void engine_cpu_delta_rule(float *s, int dk, int dv, const float *q, const float *k,
                           const float *v, float g, float beta, float *o, float *tmp);

/* The same rule in chunked form (issue 11): the state s [dk][dv] is kept at a base position
 * and the tokens since then are held as pending rows `pend` (ENGINE_CPU_DELTA_PEND_FLOATS
 * floats for up to `cap` rows: keys [cap][dk], corrections [cap][dv], then the cumulative log
 * decays since the base [cap]). With c_t the cumulative log gate and gamma_t = exp(c_t),
 *   delta_t = beta_t (v_t - gamma_t s^T k_t - sum_{j<t} exp(c_t - c_j) (k_t . k_j) delta_j)
 *   o_t     = gamma_t s^T q_t + sum_{j<=t} exp(c_t - c_j) (q_t . k_j) delta_j
 * (forward substitution through the chunk's unit lower-triangular system), which is what the
 * recurrent form computes token by token. engine_cpu_delta_chunk_rows appends n rows to the m
 * pending ones (m + n <= cap <= ENGINE_CPU_DELTA_CHUNK_MAX): q and k hold n rows of dk values
 * (normalised; q scaled), v n rows v_stride floats apart, lg the log gates (<= 0), beta the
 * betas; o receives n rows of dv. s^T k and s^T q of all n rows come from one pass over s.
 * Row t's bits depend only on s and the rows before it, never on n: a chunk appended in any
 * split gives the same outputs and pending rows. scratch: 2 n dv floats. */
#define ENGINE_CPU_DELTA_CHUNK_MAX 64
#define ENGINE_CPU_DELTA_PEND_FLOATS(cap, dk, dv) \
    ((size_t)(cap) * ((size_t)(dk) + (size_t)(dv) + 1))
void engine_cpu_delta_chunk_rows(const float *s, float *pend, int cap, int m, int n, int dk,
                                 int dv, const float *q, const float *k, const float *v,
                                 size_t v_stride, const float *lg, const float *beta, float *o,
                                 float *scratch);

/* Fold the m pending rows into s, which becomes the state after them (then m = 0):
 *   s = gamma_{m-1} s + sum_j exp(c_{m-1} - c_j) k_j delta_j^T */
void engine_cpu_delta_chunk_fold(float *s, const float *pend, int cap, int m, int dk, int dv);

/* y = rmsnorm(x) * w * silu(z) over n values (the gated RMSNorm of the DeltaNet output). */
void engine_cpu_rmsnorm_gated(float *y, const float *x, const float *w, const float *z, int n,
                              float eps);

#endif
