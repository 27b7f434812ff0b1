/*
 * cuda_backend.h - the CUDA backend's C door (private to engine/; plain C types only).
 *
 * Compiled only when the CUDA backend is built (SPARK_HAVE_CUDA): callers guard their use with
 * #ifdef SPARK_HAVE_CUDA. Stage 1 of issue 5: the batch-1 decode step of qwen3moe and qwen3,
 * captured once as a CUDA graph and replayed for every token. Prefill runs through the same
 * step one token at a time; tensor-core prefill, batched decode and the paged KV pool come
 * later (the attention kernel already takes the KV as rows addressed per position, and the
 * step state lives in device memory so a graph per batch bucket can be added beside it).
 *
 * Errors: 0 or a negative ENGINE_E* code with the detail in engine_error_last():
 * ENGINE_ENODEV (no usable GPU), ENGINE_ENOMEM (the memory plan does not fit: the message
 * gives the plan and the free memory), ENGINE_EUNSUPPORTED (a weight type or shape the kernels
 * do not handle), ENGINE_EINTERNAL (a CUDA call failed: the message names it).
 * Thread-safety: a model may be shared; a session is used by one thread at a time.
 */
#ifndef SPARK_ENGINE_CUDA_BACKEND_H
#define SPARK_ENGINE_CUDA_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "model/gguf.h" /* engine_type */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct engine_cuda_model engine_cuda_model;
typedef struct engine_cuda_session engine_cuda_session;

/* 0 when a GPU is usable, else ENGINE_ENODEV with the reason. */
int engine_cuda_usable(void);
/* Page-lock bytes at p (page-aligned, not shared with another registration) for the GPU's
 * copies into it (the logits a host loop reads each token): 0, or an engine error (the memory
 * then stays pageable: copies still work, through the driver's staging). unpin: before free. */
int engine_cuda_host_pin(void *p, size_t bytes);
void engine_cuda_host_unpin(void *p);

/* Copy the weights of m (a loaded, non-vocab-only model) to GPU `device` once, quantised as
 * they are, after checking their size against the free device memory. Logs the plan and the
 * upload progress at INFO. m is borrowed and must outlive the result. */
int engine_cuda_model_new(engine_cuda_model **out, const engine_model *m, int device);
void engine_cuda_model_free(engine_cuda_model *cm);
/* Bytes of weights on the device, and the bytes of weights one decode step reads (attention,
 * router, the k selected experts, head, one embedding row: the traffic of a batch-1 token). */
size_t engine_cuda_model_weight_bytes(const engine_cuda_model *cm);
size_t engine_cuda_model_bytes_per_token(const engine_cuda_model *cm);

/* Launch timeline (diagnosis; a build configured with -DSPARK_CUDA_TRACE=ON, else
 * ENGINE_EUNSUPPORTED): from _start until _stop, thread 0 of every block of every kernel launch
 * records the global timer (ns) where it starts (lets its dependents launch) and where its
 * programmatic-dependent-launch wait returns, with the launch's grid id, block and grid shape:
 * per_sm records per multiprocessor at most (the rest are counted and dropped). _stop
 * synchronises the device and writes one line per record, "t grid block ev gx gy sm"
 * (ev: 0 start, 1 wait returned, + blockDim.x << 8), to path, and frees the trace. Not
 * thread-safe: one trace at a time. bench/cuda/trace_summary.py reads the file. */
typedef struct engine_cuda_trace engine_cuda_trace;
int engine_cuda_trace_start(engine_cuda_trace **out, unsigned per_sm);
int engine_cuda_trace_stop(engine_cuda_trace *t, const char *path);

/* Device-to-device copy bandwidth of GPU `device` in GB/s (bytes read + written per second,
 * over `bytes`-sized buffers, best of `reps`): the ceiling the benchmark compares against. */
int engine_cuda_copy_bandwidth(int device, size_t bytes, int reps, double *gbps);

/* A decode session: KV cache of n_ctx positions (kv F16 or F32) and the step's buffers, all
 * allocated here (checked against free memory first). SPARK_CUDA_TOUCH=1 in the environment
 * makes its kernels load their weight lines into L1 ahead of use (an experiment, measured
 * slower; the default asks L2 only). */
int engine_cuda_session_new(engine_cuda_session **out, engine_cuda_model *cm, int32_t n_ctx,
                            engine_kv_type kv);
void engine_cuda_session_free(engine_cuda_session *s);
/* Bytes a session of n_ctx positions allocates on the device. */
size_t engine_cuda_session_bytes(const engine_cuda_model *cm, int32_t n_ctx, engine_kv_type kv);

/* One decode step: token at position pos (0 <= pos < n_ctx; positions before pos must hold
 * the earlier tokens). logits: NULL or n_vocab floats (host) for the next-token logits;
 * next: NULL or the greedy choice (largest logit, ties to the lower id), chosen on the GPU.
 * The first call captures the step as a CUDA graph; every later one replays it. */
int engine_cuda_decode(engine_cuda_session *s, int32_t token, int32_t pos, float *logits,
                       int32_t *next);

/* n decode steps back to back on the device: token at pos, then each sampled token at the
 * next position (temperature <= 0: greedy; else sampled with `seed`, reproducibly). out
 * receives the n sampled tokens; nothing else crosses to the host. pos + n <= n_ctx. */
int engine_cuda_generate(engine_cuda_session *s, int32_t token, int32_t pos, int32_t n,
                         float temperature, uint64_t seed, int32_t *out);

/* Generation with every token drawn on the GPU and only token ids crossing to the host, the
 * steps queued ahead of the host so the GPU does not wait for it: step i consumes token (i = 0)
 * or the token step i - 1 drew, at position pos + i, and draws the next; cb(user, t) gets
 * each drawn token in order and returns 0 to go on, > 0 to stop there, or a negative engine
 * error to stop with. At most n_max steps (pos + n_max <= n_ctx); *n_steps = the steps whose
 * tokens cb received. Steps queued past a stop still run (at most ENGINE_CUDA_STREAM_AHEAD - 1
 * = 1): their K/V lies past pos + *n_steps, which later steps overwrite. The draw: greedy
 * (temperature <= 0; ties to the lower id), or the host sampler's truncation (top_k <=
 * 64, then top_p, min_p; engine/sample/sampler.c) and softmax(l / T) with a uniform hashed from
 * (seed, i), or, with no truncation, the Gumbel draw of engine_cuda_generate. No mask, bias
 * or penalties: engine_cuda_stream_ok says whether the GPU can draw with p (else
 * ENGINE_EUNSUPPORTED). Returns 0, cb's error, or an engine error. */
typedef struct {
    float temperature;
    int32_t top_k; /* 0 or >= n_vocab: off */
    float top_p;   /* 1: off */
    float min_p;   /* 0: off */
    uint64_t seed;
    const uint32_t *allow; /* NULL, or n_vocab bits: only those tokens are drawn (a grammar's
                            * mask that holds for every step of the call) */
} engine_cuda_sampling;
typedef int (*engine_cuda_token_fn)(void *user, int32_t token);
bool engine_cuda_stream_ok(const engine_cuda_session *s, const engine_cuda_sampling *p);
int engine_cuda_stream(engine_cuda_session *s, int32_t token, int32_t pos, int32_t n_max,
                       const engine_cuda_sampling *p, engine_cuda_token_fn cb, void *user,
                       int32_t *n_steps);

/* Where a decode step's time goes: the step run un-captured with an event after each launch,
 * reps times; us[i] = mean microseconds per step of category i (embed, qkv, attention, wo,
 * router, ffn_up, ffn_down, head, sample). Launch gaps count towards the next kernel. */
enum { ENGINE_CUDA_PROF_COUNT = 9 };
int engine_cuda_profile(engine_cuda_session *s, int32_t token, int32_t pos, int reps,
                        double us[ENGINE_CUDA_PROF_COUNT]);

/* Test support (qwen3moe): one decode step of token at pos, un-captured per-op launches, with
 * each layer's routing copied out after its MoE up launch: ids [n_layer][n_expert_used] (the
 * chosen experts, rank order), router_logits [n_layer][n_expert] (the logits the routing used:
 * unfused, the router launch's; with the router fusion s * raw, s the RMS scale of x + ao
 * computed on the host in double), logits [n_vocab] (may be NULL); *fused: whether the session
 * runs the router fusion. */
int engine_cuda_route_trace(engine_cuda_session *s, int32_t token, int32_t pos, int32_t *ids,
                            float *router_logits, float *logits, int *fused);

/* ---------------------------------------------------------------------------------------------
 * Single ops on host buffers, for the tests that compare each kernel with the CPU backend
 * (they allocate, copy, run one launch and copy back: not for hot paths).
 * ------------------------------------------------------------------------------------------- */

/* y[rows] = W x (+ y when accumulate), W rows of `type` (row_bytes each); norm_w: NULL or
 * cols weights (x is RMS-normalised with eps first). */
int engine_cuda_op_matvec(engine_type type, const void *w, int64_t rows, int64_t cols,
                          size_t row_bytes, const float *x, const float *norm_w, float eps,
                          bool accumulate, float *y);

/* Decode attention at position pos over a cache holding positions 0..pos-1 (k_cache, v_cache:
 * pos rows of n_kv*hd values, F32 or F16 bits per kv), with the raw q (n_head*hd), k, v
 * (n_kv*hd) of position pos. Writes out (n_head*hd) and the new cache rows k_row, v_row
 * (n_kv*hd, as stored, converted to F32). */
int engine_cuda_op_attention(int n_head, int n_kv, int hd, int32_t pos, int32_t n_ctx,
                             engine_kv_type kv, const void *k_cache, const void *v_cache,
                             const float *q, const float *k, const float *v, const float *q_norm,
                             const float *k_norm, const float *inv_freq, float eps, float *out,
                             float *k_row, float *v_row);

/* The MoE block of one token: route from router logits, gate/up of the selected experts,
 * SwiGLU, down, weighted sum added to x (in place). Weights: [n_expert][rows][cols] stacks of
 * `type`. ids/weights receive the routing. */
int engine_cuda_op_moe(engine_type type, int n_expert, int k, bool norm_topk, int n_embd, int n_ff,
                       const float *router, const void *gate, const void *up, const void *down,
                       size_t row_bytes_in, size_t row_bytes_ff, const float *norm_w, float eps,
                       float *x, int32_t *ids, float *weights);

/* The routing of the MoE up launch's warp on n (<= 256) router logits, top k: flags 0 the warp
 * reductions' top-k (the default), 1 the shuffles' (SPARK_CUDA_ROUTE=shfl). ids / weights
 * receive the k picks in order. */
int engine_cuda_op_route(const float *logits, int n, int k, bool norm_topk, int flags, int32_t *ids,
                         float *weights);

/* The MoE block in one launch (engine/cuda/moe_fused.cuh) against the unfused up + down pair on
 * the same inputs: gate/up of up_type (rb_in bytes a row), down of down_type (rb_ff), x
 * (n_embd; x_add != NULL: the router fusion, the block's input x + x_add and router the raw
 * logits it scales). Writes y_ref (n_embd: x after the unfused pair) and y_fused [reps][n_embd]
 * (x after the fused launch, each from the same x), and the fused launch's routing. slice: 32
 * or 64; flags: 1 engine_cu_moe_fused_args.preload, 2 its class_reduce, (flags >> 2) & 3 its
 * grid (the whole-grid form 1, 2 or 3 = auto; slice then unused), 16 its items (per-item
 * barriers), (flags >> 5) & 7 its pipe and (flags >> 8) & 3 its pipe_down (the order of its
 * copies; 0, 0: all at the start), 2048 its y_pre, 4096 its arrive, 8192 its dn_merge (1: both
 * forms; else 0), 16384 its lanes (1: both forms; else 0), (flags >> 15) & 3 its roll.
 * ENGINE_EUNSUPPORTED (with the reason) when the fused launch cannot run this case;
 * ENGINE_EINTERNAL when its counters are not back at zero afterwards. */
int engine_cuda_op_moe_fused(engine_type up_type, engine_type down_type, int n_expert, int k,
                             bool norm_topk, int n_embd, int n_ff, const float *router,
                             const void *gate, const void *up, const void *down, size_t rb_in,
                             size_t rb_ff, const float *norm_w, float eps, const float *x,
                             const float *x_add, int slice, int flags, int reps, float *y_ref,
                             float *y_fused, int32_t *ids, float *weights);

/* Sample from n logits as a decode step does (temperature <= 0: greedy). step: the value of
 * the per-session draw counter (0 for the first token). */
int engine_cuda_op_sample(const float *logits, int n, float temperature, uint64_t seed,
                          int32_t step, int32_t *out);

/* The truncated draw of engine_cuda_stream on n logits (top_k in 1..64): the token, and *u
 * the uniform it drew with (for a reference draw). */
int engine_cuda_op_sample_topk(const float *logits, int n, const engine_cuda_sampling *p,
                               int32_t step, int32_t *out, double *u);

/* The router fusion (router_fuse.cuh) of one layer: builds rm [n_expert][n_embd + n_att] = R | M
 * (R = W_r diag(g), M = R Wo, F32) from wo (n_embd rows of n_att values, wo_rb bytes each) and
 * wr (the router, n_expert rows of n_embd values), then runs the fused launch once on x
 * (n_embd) and the attention output att (n_att): ao (n_embd) = Wo att as the wo kernel computes
 * it, raw (n_expert) = R x + M att-as-staged. rows_per_block: 2 forces two router rows per
 * block (else the launch's own choice). */
int engine_cuda_op_router_fuse(engine_type wo_type, const void *wo, size_t wo_rb,
                               engine_type wr_type, const void *wr, size_t wr_rb, int n_expert,
                               int n_embd, int n_att, const float *g, const float *x,
                               const float *att, int rows_per_block, float *rm, float *ao,
                               float *raw);

/* ---------------------------------------------------------------------------------------------
 * Device views for the batched / prefill path (engine/cuda/batch.cu, prefill.cu, gemm.cu).
 * Borrowed pointers into the model's and the session's device memory: valid while they live.
 * The weights are as uploaded: rows in the engine/cpu/quant.h block layout (a backend that
 * repacks a type at upload must give it a new engine_type here, or the batched kernels would
 * decode it wrongly).
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    const void *d; /* device: matrix 0, row 0 (matrix i at + i * rows * row_bytes); NULL: none */
    int type;      /* engine_type */
    int cols, rows, n_mat;
    size_t row_bytes;
} engine_cuda_wview;

typedef struct {
    const float *attn_norm, *q_norm, *k_norm, *ffn_norm; /* device */
    engine_cuda_wview wq, wk, wv, wo, gate_inp, gate_exps, up_exps, down_exps, ffn_gate, ffn_up,
        ffn_down;
} engine_cuda_layer_view;

typedef struct {
    const engine_model *m;
    int device;
    engine_cuda_wview tok_embd, output;
    const float *output_norm; /* device [n_embd] */
} engine_cuda_model_view;

typedef struct {
    void *stream; /* the session's cudaStream_t: work on its KV goes there */
    int32_t n_ctx;
    int kv_f32;                          /* 1: F32 cache rows, 0: F16 */
    void *const *k_cache, *const *v_cache; /* [n_layer] device: [n_ctx][n_head_kv * head_dim] */
    const float *rope;                   /* device [n_ctx][head_dim / 2] (cos, sin) */
} engine_cuda_session_view;

void engine_cuda_model_view_get(const engine_cuda_model *cm, engine_cuda_model_view *out);
/* layer < n_layer */
void engine_cuda_layer_view_get(const engine_cuda_model *cm, int layer,
                                engine_cuda_layer_view *out);
void engine_cuda_session_view_get(const engine_cuda_session *s, engine_cuda_session_view *out);

/* ---------------------------------------------------------------------------------------------
 * qwen35moe (Qwen3.5/3.6 hybrid Gated DeltaNet / gated attention MoE): engine/cuda/qwen35.cu.
 * The same contracts as the engine_cuda_* calls above, for a model loaded with the qwen35moe
 * architecture (m->q35). The decode step: 8 launches per block + 3 (+1 where the shared
 * expert's down matrix cannot join the routed ones, +1 where beta and alpha differ in type),
 * captured once as a CUDA graph. A session holds on the device the KV cache of the attention
 * blocks (F16 or F32), the conv ring ([C][K]: the input of position p in slot p % K) and the
 * recurrent state ([nv][dk][dv] F32) of every DeltaNet block, and a ring of
 * ENGINE_CUDA_Q35_SNAPSHOTS copies of those two taken after every position that is a multiple
 * of ENGINE_CUDA_Q35_SNAP_EVERY, for rollback.
 * ------------------------------------------------------------------------------------------- */
#define ENGINE_CUDA_Q35_SNAP_EVERY 16
#define ENGINE_CUDA_Q35_SNAPSHOTS 4

typedef struct engine_cuda_q35_model engine_cuda_q35_model;
typedef struct engine_cuda_q35_session engine_cuda_q35_session;

int engine_cuda_q35_model_new(engine_cuda_q35_model **out, const engine_model *m, int device);
void engine_cuda_q35_model_free(engine_cuda_q35_model *cm);
size_t engine_cuda_q35_model_weight_bytes(const engine_cuda_q35_model *cm);
/* Weight bytes a batch-1 token reads (mixers, router, k experts + the shared one, head). */
size_t engine_cuda_q35_model_bytes_per_token(const engine_cuda_q35_model *cm);

int engine_cuda_q35_session_new(engine_cuda_q35_session **out, engine_cuda_q35_model *cm,
                                int32_t n_ctx, engine_kv_type kv);
void engine_cuda_q35_session_free(engine_cuda_q35_session *s);
size_t engine_cuda_q35_session_bytes(const engine_cuda_q35_model *cm, int32_t n_ctx,
                                     engine_kv_type kv);

/* One step at pos; the session's recurrent state must hold exactly the tokens 0..pos-1 (steps
 * run in order, or after engine_cuda_q35_truncate). logits / next as engine_cuda_decode. */
int engine_cuda_q35_decode(engine_cuda_q35_session *s, int32_t token, int32_t pos, float *logits,
                           int32_t *next);
/* n steps on the device from (token, pos), as engine_cuda_generate. */
int engine_cuda_q35_generate(engine_cuda_q35_session *s, int32_t token, int32_t pos, int32_t n,
                             float temperature, uint64_t seed, int32_t *out);
/* Roll the state back from n_tokens to n (0 <= n <= n_tokens): restore the latest snapshot at
 * or before n (or the empty state) and run tokens[b..n) again; the result equals a session
 * that never went past n. tokens: the session's n_tokens tokens. */
int engine_cuda_q35_truncate(engine_cuda_q35_session *s, const int32_t *tokens, int32_t n_tokens,
                             int32_t n);

/* Where a step's time goes (the step un-captured with an event after each launch, reps
 * times, at pos >= 1: it changes the state as a step there does); us[i]: mean microseconds per
 * step of category i: embed, mixer in (projections), deltanet, attention (prep + attention),
 * mixer out, router (+ shared gate logit), ffn up (routed + shared), shared gate, ffn down,
 * head, sample. Launch gaps count towards the next kernel. */
enum { ENGINE_CUDA_Q35_PROF_COUNT = 11 };
int engine_cuda_q35_profile(engine_cuda_q35_session *s, int32_t token, int32_t pos, int reps,
                            double us[ENGINE_CUDA_Q35_PROF_COUNT]);

/* Single ops for the tests (host buffers). One DeltaNet step of one block at position pos:
 * qkv [C = 2 nk dk + nv dv], z [nv dv], beta / alpha [nv], conv_w [C][K], dt_bias / a [nv],
 * norm_w [dv]; ring [C][K] and state [nv][dk][dv] are updated in place; out [nv dv]. */
int engine_cuda_op_q35_deltanet(int nk, int nv, int dk, int dv, int K, bool v_tiled, int32_t pos,
                                const float *qkv, const float *z, const float *beta,
                                const float *alpha, const float *conv_w, const float *dt_bias,
                                const float *a, const float *norm_w, float eps, float *ring,
                                float *state, float *out);
/* Gated attention at pos over a cache holding positions 0..pos-1 (n_kv * hd values per row,
 * F16 bits or F32 per kv): qg [n_head][2 hd] (q then gate), k, v [n_kv hd], q_norm / k_norm
 * [hd], inv_freq [rot / 2]. Writes out [n_head hd] and the stored rows k_row, v_row (F32). */
int engine_cuda_op_q35_attention(int n_head, int n_kv, int hd, int rot, int32_t pos,
                                 engine_kv_type kv, const void *k_cache, const void *v_cache,
                                 const float *qg, const float *k, const float *v,
                                 const float *q_norm, const float *k_norm, const float *inv_freq,
                                 float eps, float *out, float *k_row, float *v_row);

/* ---------------------------------------------------------------------------------------------
 * Prefill on tensor cores (engine/cuda/prefill.cu): many tokens of one session per pass.
 * ------------------------------------------------------------------------------------------- */
typedef struct engine_cuda_prefill engine_cuda_prefill;

/* Buffers for passes of up to max_tokens tokens (1 <= max_tokens <= the session's context) over
 * session s of model cm, checked against the free device memory (ENGINE_ENOMEM with the plan);
 * ENGINE_EUNSUPPORTED when a weight has no prefill GEMM. cm and s are borrowed and must outlive
 * the result. By default the attention runs on tensor cores (F16 caches of head size 64 or
 * 128; else the F32 SIMT kernel) and the F32 router GEMM is split over 8 blocks along K;
 * SPARK_CUDA_PREFILL_NEXT=0 in the environment selects the SIMT attention and the unsplit
 * router (the first version, kept as a control). SPARK_CUDA_PREFILL_PROF=1 logs per-phase
 * times at free. */
/* Tokens per prefill chunk sessions use: 2048 (engine_cuda_prefill_new halves it, down to 512,
 * where the buffers would take more than 1/16 of free device memory), or
 * SPARK_CUDA_PREFILL_CHUNK (16 .. 8192) from the environment (bigger chunks give each expert
 * more rows per GEMM tile, at more memory). */
int32_t engine_cuda_prefill_chunk(void);
int engine_cuda_prefill_new(engine_cuda_prefill **out, engine_cuda_model *cm,
                            engine_cuda_session *s, int32_t max_tokens);
void engine_cuda_prefill_free(engine_cuda_prefill *p);
size_t engine_cuda_prefill_bytes(const engine_cuda_model *cm, int32_t max_tokens);

/* Run tokens[0..n) at positions pos .. pos+n-1 through the session (chunks of max_tokens): the
 * KV rows of those positions are written, as decode steps would write them, so decoding goes on
 * at pos + n. logits_all: NULL or n * n_vocab floats (host) for every token's next-token logits;
 * logits_last: NULL or n_vocab floats for the last token's. Positions before pos must hold the
 * earlier tokens. Synchronous (returns when the logits are on the host). */
int engine_cuda_prefill_run(engine_cuda_prefill *p, const int32_t *tokens, int32_t n,
                            int32_t pos, float *logits_all, float *logits_last);

/* Test op: y[m][rows] = X W^T (+ y when accumulate) through the prefill GEMM, X = m rows of
 * cols floats (host), RMS-normalised with norm_w (NULL: none) first. */
int engine_cuda_op_gemm(engine_type type, const void *w, int64_t rows, int64_t cols,
                        size_t row_bytes, int m, const float *x, const float *norm_w, float eps,
                        bool accumulate, float *y);

/* ---------------------------------------------------------------------------------------------
 * Batched pass over several sequences (engine/cuda/prefill.cu, paged_att.cu): the prefill pass
 * over the tokens of n_seqs sequences at once (prefill chunks and single decode tokens mixed),
 * each with its own positions and its KV in a device pool of blocks addressed through its
 * block table, as engine/kv addresses the CPU pool (position p: row p % block_size of block
 * blocks[p / block_size]; the same block ids when the caller takes them from an engine_kv
 * cache of the same n_blocks and block_size). The GEMMs run with m = all the pass's tokens, so
 * one step reads the weights once for every sequence. Attention: per (token, head), F32 SIMT
 * over the sequence's blocks (no tensor cores on this path yet).
 * ------------------------------------------------------------------------------------------- */
typedef struct engine_cuda_batch engine_cuda_batch;

typedef struct {
    const int32_t *tokens; /* n_tokens ids at positions pos .. pos + n_tokens - 1 */
    int32_t n_tokens;
    int32_t pos;            /* positions before pos hold the sequence's earlier tokens */
    const int32_t *blocks;  /* block table: at least ceil((pos + n_tokens) / block_size) ids */
    int32_t n_blocks;
    float *logits; /* NULL or n_vocab floats (host): the last token's next-token logits */
} engine_cuda_batch_seq;

/* A KV pool of n_blocks blocks of block_size positions (kv F16 or F32) on model cm's device,
 * positions 0 .. max_pos-1 per sequence, passes of up to max_tokens tokens over up to max_seqs
 * sequences; all device memory checked against the free memory first (ENGINE_ENOMEM with the
 * plan). qwen3moe and qwen3 models (head size 64, 128 or 256). cm is borrowed. */
int engine_cuda_batch_new(engine_cuda_batch **out, engine_cuda_model *cm, int32_t n_blocks,
                          int32_t block_size, int32_t max_pos, int32_t max_tokens,
                          int32_t max_seqs, engine_kv_type kv);
void engine_cuda_batch_free(engine_cuda_batch *b);
size_t engine_cuda_batch_bytes(const engine_cuda_model *cm, int32_t n_blocks, int32_t block_size,
                               int32_t max_pos, int32_t max_tokens, int32_t max_seqs,
                               engine_kv_type kv);
/* One pass: writes the KV rows of every token given, then fills each seqs[i].logits. The
 * sequences must not share a block that this pass writes. Synchronous; nothing on the host is
 * allocated. ENGINE_EINVAL / ENGINE_ERANGE for a bad table, token or size, before any work. */
int engine_cuda_batch_run(engine_cuda_batch *b, const engine_cuda_batch_seq *seqs,
                          int32_t n_seqs);

/* ---------------------------------------------------------------------------------------------
 * Prefill of qwen35moe on the GPU (engine/cuda/q35_prefill.cu, deltanet_chunk.cu): a prompt's
 * tokens in chunks of up to max_tokens, each block over the whole chunk (tensor-core GEMMs of
 * every projection and of the grouped experts, the chunked delta rule, causal attention), the
 * conv ring, recurrent state, KV rows and snapshots left as decode steps would leave them (the
 * delta rule's summation order differs: within ~1e-5 of the recurrent form, not bit for bit).
 * ------------------------------------------------------------------------------------------- */
typedef struct engine_cuda_q35_prefill engine_cuda_q35_prefill;

/* Buffers for chunks of up to max_tokens (<= 0: 1024, or SPARK_CUDA_PREFILL_CHUNK; at most the
 * session's context) over session s (borrowed, must outlive the result). *out stays NULL (and 0
 * is returned, the reason logged) when SPARK_CUDA_Q35_PREFILL=0 is set, a shape has no prefill
 * kernel (a weight type without a GEMM, DeltaNet heads beyond 256) or the buffers do not fit
 * the free device memory (~257 MB for the 35B-A3B shape at 1024 tokens): prompts then go
 * through the decode step. */
int engine_cuda_q35_prefill_new(engine_cuda_q35_prefill **out, engine_cuda_q35_session *s,
                                int32_t max_tokens);
void engine_cuda_q35_prefill_free(engine_cuda_q35_prefill *p);

/* Run tokens[0..n) at positions pos .. pos + n - 1 (positions before pos hold the earlier
 * tokens; pos 0 starts the recurrent state over); logits_last: NULL or n_vocab floats (host)
 * for the last token's next-token logits. Synchronous. */
int engine_cuda_q35_prefill_run(engine_cuda_q35_prefill *p, const int32_t *tokens, int32_t n,
                                int32_t pos, float *logits_last);

/* Test op: the prefill's gated causal attention of n queries at positions pos0.. (q [n][n_head
 * * hd] normalised and rotated, qg [n][n_head][2 hd] for the gate) over an F16 cache of pos0 + n
 * rows (k, v: [pos0 + n][n_kv * hd] F16 bits): tc != 0 the tensor-core kernel, else the SIMT
 * one plus the gate. out: [n][n_head * hd]. */
int engine_cuda_op_q35_prefill_att(int n_head, int n_kv, int hd, int n, int pos0, const float *q,
                                   const float *qg, const uint16_t *k, const uint16_t *v, int tc,
                                   float *out);

/* Test op: the session's conv rings (ring_n floats: [n_lin][C][K]) and recurrent states
 * (state_n: [n_lin][nv][dk][dv]) copied to the host; NULL buffers: only the counts. */
int engine_cuda_q35_state_get(engine_cuda_q35_session *s, float *ring, size_t *ring_n,
                              float *state, size_t *state_n);

#ifdef __cplusplus
}
#endif
#endif
