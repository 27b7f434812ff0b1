/* The loaded model and its sessions: private to engine/ (model.c loads, arch_qwen3moe.c runs
 * the forward pass, sample/generate.c drives generation). */
#ifndef SPARK_ENGINE_MODEL_INT_H
#define SPARK_ENGINE_MODEL_INT_H

#include <pthread.h>

#include "common.h"
#include "cpu/cpu.h"
#include "cpu/quant.h"
#include "kv/kv.h"
#include "model/arch.h"
#include "model/gguf.h"
#include "tokenizer/tokenizer.h"

/* A weight matrix (or a stack of expert matrices) inside the mapping. Row r of matrix e is at
 * data + (e * rows + r) * row_bytes; a row holds `cols` values of `type`. */
typedef struct {
    const void *data;
    engine_type type;
    int64_t cols;       /* ne[0] */
    int64_t rows;       /* ne[1] */
    int64_t n_mat;      /* ne[2]: experts (1 for a plain matrix) */
    size_t row_bytes;
} engine_weight;

typedef struct {
    const float *attn_norm;   /* [n_embd] */
    const float *q_norm;      /* [head_dim] */
    const float *k_norm;      /* [head_dim] */
    const float *ffn_norm;    /* [n_embd] */
    engine_weight wq;         /* n_embd -> n_head * head_dim */
    engine_weight wk;         /* n_embd -> n_head_kv * head_dim */
    engine_weight wv;         /* n_embd -> n_head_kv * head_dim */
    engine_weight wo;         /* n_head * head_dim -> n_embd */
    engine_weight gate_inp;   /* router: n_embd -> n_expert (MoE) */
    engine_weight gate_exps;  /* [n_expert] x (n_embd -> n_ff_exp) */
    engine_weight up_exps;    /* [n_expert] x (n_embd -> n_ff_exp) */
    engine_weight down_exps;  /* [n_expert] x (n_ff_exp -> n_embd) */
    engine_weight ffn_gate;   /* n_embd -> n_ff (dense) */
    engine_weight ffn_up;     /* n_embd -> n_ff */
    engine_weight ffn_down;   /* n_ff -> n_embd */
} engine_layer;

struct engine_model {
    char *path;
    engine_gguf *gguf;
    engine_hparams hp;
    engine_tokenizer *tok;
    engine_model_info info;
    char *chat_template;      /* owned copy, NUL-terminated, or NULL */

    /* weights (absent for a vocab-only model) */
    engine_layer *layers;     /* [n_layer] */
    engine_weight tok_embd;   /* n_vocab rows of n_embd */
    engine_weight output;     /* n_embd -> n_vocab (tok_embd when tied) */
    const float *output_norm; /* [n_embd] */
    float **owned;            /* norm weights converted to F32 (files with F16/BF16 norms) */
    size_t n_owned;
    float *rope_inv_freq;     /* [head_dim / 2] */

    engine_pool *pool;
    pthread_mutex_t pool_mu;  /* one forward pass at a time on the pool */
    void *cuda;               /* engine_cuda_model (cuda/cuda_backend.h) when on the GPU */
    int n_sessions;           /* live sessions (model_free asserts none) */
    engine_kv_cache *kvc;     /* shared paged KV + prefix cache (engine/kv), or NULL; pool_mu */
    engine_kv_type kv_type;   /* sessions' default KV type and kvc's (engine_model_params) */
    struct engine_q35_model *q35; /* qwen35moe weights (arch_qwen35moe.c), else NULL */
};

/* Forward state of one session: the architecture's buffers (arch_qwen3moe.c). */
typedef struct engine_fwd engine_fwd;

struct engine_session {
    engine_model *m;
    int32_t n_ctx;
    int32_t n_batch;
    engine_kv_type kv_type;
    int32_t n_tokens;
    int32_t *tokens;          /* [n_ctx] */
    float *logits;            /* [n_vocab] after the last token */
    bool logits_valid;
    bool logits_pinned;       /* page-locked for the GPU's copies (engine_cuda_host_pin) */
    /* SPARK_CUDA_GEN_LOOP, _GEN_FREE (each not 0) at creation: engine_session_gpu_draws */
    bool gen_loop, gen_free;
    engine_fwd *fwd;          /* CPU forward state (NULL on the GPU) */
    struct engine_q35_fwd *q35; /* qwen35moe forward state instead of fwd (arch_qwen35moe.c) */
    void *cuda;               /* engine_cuda_session when the model is on the GPU */
    void *cuda_pf;            /* engine_cuda_prefill: prompts on the GPU (qwen3/qwen3moe) */
    /* paged KV on m->kvc (engine/kv/kv_session.c) when kv_paged */
    bool kv_paged;
    engine_kv_seq kvs;        /* block table; kvs.n_pos >= n_tokens */
    int32_t kv_committed;     /* full blocks already inserted into the prefix tree */
    int32_t kv_cached;        /* positions the last append took from the prefix cache */
    int32_t kv_diverged_at;   /* cache-miss explainer of that append (engine_kv_match) */
};

/* arch_qwen3moe.c: allocate/free the forward state of s (KV cache, activations) and run the
 * forward pass over n tokens at positions s->n_tokens.. (the caller has checked the context
 * and ids, and holds the model's pool lock). logits_all: NULL or n * n_vocab floats; the last
 * token's logits always go to s->logits. */
int engine_fwd_new(engine_session *s);
void engine_fwd_free(engine_fwd *f);
int engine_fwd_run(engine_session *s, const int32_t *tokens, int32_t n, float *logits_all);
/* Batched passes (the scheduler, engine/sched): one pass over the tokens of several sequences,
 * each with its own positions and KV (a block table on the paged pool). Norms, matmuls and the
 * MoE run over all the tokens together (each expert's rows are read once per pass); attention
 * runs per sequence. A token's results do not depend on the other tokens of the pass. */
typedef struct {
    const int32_t *tokens;          /* n tokens at positions p0 .. p0+n-1 */
    int32_t n, p0;
    const engine_kv_view *views;    /* [n_layer]: positions < p0 + n must be writable */
    bool logits;                    /* wants the logits after its last token */
    const float *logits_out;        /* set by the pass: n_vocab floats in the pass's buffer,
                                     * valid until the next pass (NULL when not wanted) */
} engine_fwd_seq;

/* State for passes of up to n_tokens tokens over up to max_seqs (>= 1) sequences of at most
 * n_ctx positions: every buffer a pass needs, allocated here. ENGINE_EUNSUPPORTED for an
 * architecture without a batched pass, ENGINE_EINVAL, ENGINE_ENOMEM. Free with
 * engine_fwd_free. */
int engine_fwd_batch_new(engine_fwd **out, const engine_model *m, int32_t n_ctx,
                         int32_t n_tokens, int32_t max_seqs);
/* Run one pass (the caller holds the model's pool lock and has reserved the KV positions). */
int engine_fwd_run_batch(const engine_model *m, engine_fwd *f, engine_fwd_seq *seqs,
                         int32_t n_seqs);
/* Bytes engine_fwd_new will allocate for a session of n_ctx positions and batch n_batch. */
size_t engine_fwd_bytes(const engine_model *m, int32_t n_ctx, int32_t n_batch,
                        engine_kv_type kv);

/* Generation with the tokens drawn on the GPU (engine_cuda_stream; model.c). gpu_draws: whether
 * s runs there with p: a qwen3 / qwen3moe session on the GPU, and nothing in p that only the
 * host sampler has (logit bias, penalties, a top_k above 64, top_p or min_p without top_k, a
 * grammar without free_mask, or with SPARK_CUDA_GEN_FREE=0); SPARK_CUDA_GEN_LOOP=0 says no
 * (the host loop, for an A/B). gpu_generate: token (drawn, not yet appended) is appended and
 * the next drawn, then that one, n_max times at most, only the tokens of allow (a grammar's
 * free mask; NULL without a grammar); cb(user, t) gets each drawn token in order (0: go on,
 * > 0: stop there,
 * < 0: stop with that error), which the session does not hold until a later step appends it.
 * Holds the model's pool lock throughout (cb must not run the same model). The session's
 * logits are not kept (engine_session_logits: NULL until the next append). Returns 0, cb's
 * error or an engine error; s->n_tokens counts the tokens appended either way. */
bool engine_session_gpu_draws(const engine_session *s, const engine_sampling_params *p);
int engine_session_gpu_generate(engine_session *s, int32_t token, int32_t n_max,
                                const engine_sampling_params *p, const uint32_t *allow,
                                int (*cb)(void *, int32_t), void *user);
/* A grammar's free stretch on the GPU (sample/generate.c), after each token the grammar
 * accepted: 1 while p's free_mask still says free with the mask allow (cmp: scratch of the
 * same words), 0 once the stretch has ended (the next token needs the mask hook), or an error
 * (ENGINE_ECANCELED: the hook aborted). */
int engine_gen_free_still(const engine_sampling_params *p, const uint32_t *allow, uint32_t *cmp,
                          int32_t n_vocab);

/* Generated text as engine_generate streams it (sample/generate.c), shared with the scheduler:
 * token -> streaming detokenizer (complete UTF-8) -> held back while it may begin a stop
 * string -> callback. p is borrowed for the stream's life. */
typedef struct {
    const engine_model *m;
    const engine_gen_params *p;
    engine_token_fn cb;
    void *user;
    engine_detok *dt;
    char *pending;            /* text not yet emitted (a possible stop-string beginning) */
    size_t n_pending, cap_pending;
} engine_gen_text;

/* The checks engine_generate applies to its params (version, prompt, stops): ENGINE_EINVAL. */
int engine_gen_check_params(const engine_gen_params *p);
int engine_gen_text_init(engine_gen_text *g, const engine_model *m, const engine_gen_params *p,
                         engine_token_fn cb, void *user);
void engine_gen_text_deinit(engine_gen_text *g);
/* A sampled (and accepted) token: *stop = EOG/TOKEN (not emitted), STRING (the text before it
 * emitted), CANCELED (the callback returned non-zero; returns ENGINE_ECANCELED) or NONE (go
 * on). Other errors: ENGINE_ENOMEM, those of the detokenizer. */
int engine_gen_text_token(engine_gen_text *g, int32_t tok, engine_stop_reason *stop);
/* End of the stream with *stop decided: release the held-back tail (token -1), unless a stop
 * string ended it. The callback may still cancel (*stop = CANCELED, ENGINE_ECANCELED). */
int engine_gen_text_finish(engine_gen_text *g, engine_stop_reason *stop);

/* model.c's GGUF weight loaders for the architecture files: a matrix read in place (type
 * checked), a small tensor as F32 (in place, or a converted copy on m->owned, which holds
 * ENGINE_Q35_OWNED_PER_LAYER per block + 2). Errors name the file and tensor. */
#define ENGINE_Q35_OWNED_PER_LAYER 8
int engine_model_load_matrix(engine_model *m, engine_tensor_role role, int layer,
                             engine_weight *w);
int engine_model_load_f32(engine_model *m, engine_tensor_role role, int layer,
                          const float **out);
/* The weights every architecture shares, through the loaders above: the token embedding,
 * output norm and output matrix (the embedding when tied) into m; block L's Q/K norms and
 * attention projections; block L's router and routed expert stacks. */
int engine_model_load_head(engine_model *m);
int engine_model_load_attn(engine_model *m, int L, const float **q_norm, const float **k_norm,
                           engine_weight *wq, engine_weight *wk, engine_weight *wv,
                           engine_weight *wo);
int engine_model_load_experts(engine_model *m, int L, engine_weight *gate_inp,
                              engine_weight *gate_exps, engine_weight *up_exps,
                              engine_weight *down_exps);
/* The model's dimensions (n_ctx_train, layers, widths, heads, experts, parameter counts) from
 * its hyperparameters into in. */
void engine_model_info_dims(engine_model_info *in, const engine_hparams *hp);

/* qwen35moe (arch_qwen35moe.c), used instead of engine_fwd_* for that architecture: load the
 * weights into m->q35 (after engine_arch_validate), free them; a session's state in s->q35
 * (KV of the attention blocks, conv and recurrent state of the Gated DeltaNet blocks) and its
 * forward pass (same contract as engine_fwd_run). The pass snapshots the recurrent state at
 * every position that is a multiple of ENGINE_Q35_SNAP_EVERY (the paged KV block size), keeping
 * the last ENGINE_Q35_SNAPSHOTS of them (engine_q35_snapshot_bytes each). Truncation to n
 * (called without the pool lock; takes it) restores the latest snapshot at or before n (or
 * the empty state) and recomputes the tokens from there to n from s->tokens: any n works, with
 * the same bits as a session that never went past n. */
#define ENGINE_Q35_SNAP_EVERY ENGINE_KV_BLOCK_SIZE
#define ENGINE_Q35_SNAPSHOTS 4
typedef struct engine_q35_model engine_q35_model;
typedef struct engine_q35_fwd engine_q35_fwd;
int engine_q35_load(engine_model *m);
void engine_q35_model_free(engine_q35_model *qm);
int engine_q35_fwd_new(engine_session *s);
void engine_q35_fwd_free(engine_q35_fwd *f);
int engine_q35_fwd_run(engine_session *s, const int32_t *tokens, int32_t n, float *logits_all);
void engine_q35_fwd_reset(engine_q35_fwd *f);
int engine_q35_fwd_truncate(engine_q35_fwd *f, int32_t n_tokens, int32_t n);
/* The prefix cache (engine/kv/kv_session.c): copy the recurrent state after pos tokens
 * (engine_q35_snapshot_bytes: conv states then DeltaNet states) out of s, from its current
 * state (pos = n_tokens) or its snapshot ring (ENGINE_ERANGE when it has none at pos); restore
 * such a copy into an empty session about to continue at pos (ENGINE_EUNSUPPORTED while MTP
 * feeds it: the MTP block's KV is not cached). Under the pool lock. */
int engine_q35_state_copy(const engine_session *s, int32_t pos, void *dst);
int engine_q35_state_restore(engine_session *s, const void *src, int32_t pos);
/* MTP (the model's nextn block, arch_qwen35moe.c). has_mtp: the model carries one. enable:
 * from now on every pass of s also feeds the block (its KV at position p holds the pair
 * (h_p, token p+1), h_p the final normed hidden state); *was_off tells the caller that the
 * tokens already in s were not fed, so it must truncate s to 0 and recompute them.
 * ENGINE_EUNSUPPORTED without the block. checkpoint: keep the recurrent state at the current
 * length (taken before a verify pass; a later truncation to >= that length restarts from it).
 * mtp_step: draft step i after the n tokens of s: the pair (h_{n-1} for i = 0, else the
 * previous step's output; token) at position n - 1 + i -> logits (n_vocab floats). Takes the
 * model's pool lock. ENGINE_EINVAL when s has no MTP state or the position is out of range. */
bool engine_q35_has_mtp(const engine_model *m);
int engine_q35_mtp_enable(engine_session *s, bool *was_off);
void engine_q35_checkpoint(engine_session *s);
int engine_q35_mtp_step(engine_session *s, int32_t i, int32_t token, float *logits);
/* The block's normed output (n_embd floats) of the last step or pass (tests), or NULL. */
const float *engine_q35_mtp_hidden(const engine_session *s);
/* A Hugging Face checkpoint directory (config.json, tokenizer.json + tokenizer_config.json,
 * model.safetensors or shards): hyper-parameters, tokenizer, info and, unless vocab_only, the
 * weights (read in place where the layout allows). Only Qwen3.5/3.6 MoE text models:
 * ENGINE_EUNSUPPORTED for other model types. */
int engine_q35_hf_open(engine_model *m, const char *dir, bool vocab_only);
/* The weights of qwen35moe block l for another backend (the CUDA upload), copied from the
 * architecture's private layer record; unused fields are zero (attention or DeltaNet). Experts:
 * gate/up matrix e at data + e * gu_stride * row_bytes (GGUF: gu_stride = rows; HF's fused
 * gate_up_proj: 2 * rows), or through exp_ptr[0..3][X] when non-NULL (one tensor per expert).
 * v_tiled: value head h reads key head h % nk (GGUF), else h / (nv / nk). */
typedef struct {
    bool attn, v_tiled;
    const float *attn_norm, *post_norm, *q_norm, *k_norm;
    engine_weight wq, wk, wv, wo, wqkv, wz, wbeta, walpha, wout;
    const float *conv, *dt_bias, *a, *ssm_norm, *gate_inp_shexp;
    engine_weight gate_inp, gate_exps, up_exps, down_exps, gate_shexp, up_shexp, down_shexp;
    int64_t gu_stride;
    const uint8_t *const *exp_ptr;
    const float *rope_inv_freq; /* [n_rot / 2] (model-wide) */
} engine_q35_layer_w;
void engine_q35_layer_weights(const engine_model *m, uint32_t l, engine_q35_layer_w *out);
/* The MTP block for another backend: engine_q35_layer_weights(m, n_layer) gives its attention
 * block and MoE; this its fc (eh_proj, 2E -> E over [enorm(embedding) | hnorm(hidden)]), the
 * two input norms and its final norm. false when the model has no MTP block. */
bool engine_q35_mtp_weights(const engine_model *m, engine_weight *eh, const float **enorm,
                            const float **hnorm, const float **norm);

/* Monotonic clock in milliseconds. */
double engine_time_ms(void);

#endif
