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
    engine_fwd *fwd;          /* CPU forward state (NULL on the GPU) */
    void *cuda;               /* engine_cuda_session when the model is on the GPU */
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
/* Bytes engine_fwd_new will allocate for a session of n_ctx positions and batch n_batch. */
size_t engine_fwd_bytes(const engine_model *m, int32_t n_ctx, int32_t n_batch,
                        engine_kv_type kv);

/* Monotonic clock in milliseconds. */
double engine_time_ms(void);

#endif
