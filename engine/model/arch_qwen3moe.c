/* The forward pass of qwen3moe (Qwen3-MoE) and qwen3 (dense) on the CPU.
 *
 * One block, for a batch of B tokens at positions p0 .. p0+B-1:
 *   xn = rmsnorm(x) * attn_norm
 *   q, k, v = Wq xn, Wk xn, Wv xn              (one pass over the three weights)
 *   q, k = rmsnorm per head (q_norm, k_norm), then NeoX RoPE; k, v -> KV cache
 *   a = softmax(q K^T / sqrt(d)) V per head     (causal; GQA: head h reads kv head h / group)
 *   x += Wo a
 *   xn = rmsnorm(x) * ffn_norm
 *   MoE:   p = softmax(router xn); top-k; renormalise when norm_topk_prob;
 *          x += sum_j p_j * down_j(silu(gate_j xn) * up_j xn)   (only the selected experts)
 *   dense: x += down(silu(gate xn) * up xn)
 * then logits = Wout (rmsnorm(x) * output_norm).
 *
 * Weights are read in place from the mapping. A batch reads each weight once: the product loops
 * over row blocks and, inside, over the batch's tokens, and the MoE groups the batch's tokens by
 * expert so each selected expert's rows are streamed once per batch. Every output value is
 * computed by exactly one thread with the same arithmetic whatever the thread count or batch
 * split, so 1 thread and N threads, batch prefill and token-by-token, give identical bits.
 * Nothing is allocated here after engine_fwd_new. */
#include "model/model_int.h"
#include "model/ffn_moe.h"

#include <math.h>
#include <string.h>


struct engine_fwd {
    int32_t n_ctx, B, k_used, n_threads;
    int32_t max_seqs;             /* sequences one pass may carry (1 for a session) */
    /* KV cache of a session: one contiguous block per layer (NULL when paged) */
    void *kv_mem;
    void **k_blocks, **v_blocks;  /* [n_layer] */
    engine_kv_view *views;        /* [n_layer] */
    /* the pass's tokens: position and sequence of each, and each sequence's KV views */
    int32_t *pos, *tok_seq;       /* [B] */
    const engine_kv_view **seq_views; /* [max_seqs] -> [n_layer] */
    float *out_logits;            /* batched passes: [max_seqs][n_vocab] */
    /* activations, [B][...] */
    float *x, *xn, *q, *k, *v, *att, *tmp;
    float *g, *u;                 /* [B * k_used][n_ff_max] */
    float *ffn_out;               /* [B * k_used][n_embd] (MoE) */
    float *router, *probs;        /* [B][n_expert] */
    int32_t *sel;                 /* [B * k_used] expert of each slot */
    float *selw;                  /* [B * k_used] */
    int32_t *exp_start;           /* [n_expert + 1] */
    int32_t *exp_slots;           /* [B * k_used] slots grouped by expert */
    int32_t *active;              /* [n_expert] experts with tokens */
    uint8_t *conv, *conv2;        /* converted activations [B][conv_stride] */
    uint8_t *hconv;               /* [B * k_used][hconv_stride] */
    size_t conv_stride, hconv_stride;
    float *scores;                /* [n_threads][group][n_ctx] */
};

static size_t fsz(size_t n) {
    return n * sizeof(float);
}

static int64_t n_ff_max(const engine_hparams *hp) {
    return hp->arch == ENGINE_ARCH_QWEN3MOE ? hp->n_ff_exp : hp->n_ff;
}

static int32_t k_used(const engine_hparams *hp) {
    return hp->arch == ENGINE_ARCH_QWEN3MOE ? (int32_t)hp->n_expert_used : 1;
}

/* Layout of everything engine_fwd_new allocates, shared with engine_fwd_bytes. */
typedef struct {
    size_t kv, act, conv, hconv, scores, moe, seqs;
} fwd_sizes;

static fwd_sizes fwd_layout(const engine_model *m, int32_t n_ctx, int32_t B, int32_t max_seqs,
                            bool batch, engine_kv_type kvt, size_t *conv_stride,
                            size_t *hconv_stride) {
    const engine_hparams *hp = &m->hp;
    fwd_sizes z;
    size_t kv_dim = (size_t)hp->n_head_kv * hp->head_dim_k;
    z.kv = 2 * (size_t)hp->n_layer * (size_t)n_ctx *
           engine_cpu_kv_row_bytes(kvt, (int)hp->n_head_kv, (int)hp->head_dim_k);
    size_t q_dim = (size_t)hp->n_head * hp->head_dim_k;
    size_t emb = hp->n_embd;
    size_t slots = (size_t)B * (size_t)k_used(hp);
    z.act = fsz((size_t)B * (3 * emb + 2 * q_dim + 2 * kv_dim)) +
            fsz(slots * 2 * (size_t)n_ff_max(hp));
    /* F32 is the widest vec_dot type: 4 bytes per value covers every conversion. */
    size_t widest_in = emb > q_dim ? emb : q_dim;
    *conv_stride = (fsz(widest_in) + 63) & ~(size_t)63;
    *hconv_stride = (fsz((size_t)n_ff_max(hp)) + 63) & ~(size_t)63;
    z.conv = 2 * (size_t)B * *conv_stride;
    z.hconv = slots * *hconv_stride;
    z.scores = fsz((size_t)engine_pool_size(m->pool) * (hp->n_head / hp->n_head_kv) *
                   (size_t)n_ctx);
    z.seqs = 2 * (size_t)B * sizeof(int32_t) + (size_t)max_seqs * sizeof(void *);
    if (batch) z.seqs += fsz((size_t)max_seqs * hp->n_vocab);
    z.moe = 0;
    if (hp->arch == ENGINE_ARCH_QWEN3MOE) {
        size_t ne = hp->n_expert;
        z.moe = fsz(slots * emb) + 2 * fsz((size_t)B * ne) + slots * (sizeof(int32_t) + 4) +
                (ne + 1) * sizeof(int32_t) + slots * sizeof(int32_t) + ne * sizeof(int32_t);
    }
    return z;
}

size_t engine_fwd_bytes(const engine_model *m, int32_t n_ctx, int32_t n_batch,
                        engine_kv_type kv) {
    size_t a, b;
    fwd_sizes z = fwd_layout(m, n_ctx, n_batch, 1, false, kv, &a, &b);
    return z.kv + z.act + z.conv + z.hconv + z.scores + z.moe + z.seqs;
}

void engine_fwd_free(engine_fwd *f) {
    if (!f) return;
    free(f->kv_mem);
    free(f->k_blocks);
    free(f->v_blocks);
    free(f->views);
    free(f->pos);
    free(f->tok_seq);
    free(f->seq_views);
    free(f->out_logits);
    free(f->x);
    free(f->g);
    free(f->ffn_out);
    free(f->router);
    free(f->probs);
    free(f->sel);
    free(f->selw);
    free(f->exp_start);
    free(f->exp_slots);
    free(f->active);
    free(f->conv);
    free(f->hconv);
    free(f->scores);
    free(f);
}

/* Allocate the state of passes over up to B tokens of up to max_seqs sequences with at most
 * n_ctx positions each; kv_type other than -1: also a contiguous KV cache of n_ctx positions
 * (a session without the paged pool). */
static int fwd_alloc(engine_fwd **out, const engine_model *m, int32_t n_ctx, int32_t B,
                     int32_t max_seqs, bool batch, int kv_type) {
    const engine_hparams *hp = &m->hp;
    *out = NULL;
    if (hp->head_dim_k != hp->head_dim_v)
        return engine_err(ENGINE_EUNSUPPORTED, "%s: key_length %u != value_length %u is not "
                          "supported", m->path, hp->head_dim_k, hp->head_dim_v);
    if (hp->head_dim_k > ENGINE_CPU_MAX_HEAD_DIM)
        return engine_err(ENGINE_EUNSUPPORTED, "%s: head size %u is above the supported %d",
                          m->path, hp->head_dim_k, ENGINE_CPU_MAX_HEAD_DIM);
    engine_fwd *f = calloc(1, sizeof *f);
    if (!f) return engine_err(ENGINE_ENOMEM, "out of memory for a forward pass");
    f->n_ctx = n_ctx;
    f->B = B;
    f->max_seqs = max_seqs;
    f->k_used = k_used(hp);
    f->n_threads = engine_pool_size(m->pool);
    bool own_kv = kv_type >= 0;
    engine_kv_type kvt = own_kv ? (engine_kv_type)kv_type : ENGINE_KV_F16;
    fwd_sizes z = fwd_layout(m, n_ctx, B, max_seqs, batch, kvt, &f->conv_stride, &f->hconv_stride);
    size_t L = hp->n_layer, emb = hp->n_embd, hd = hp->head_dim_k;
    size_t kv_dim = (size_t)hp->n_head_kv * hd, q_dim = (size_t)hp->n_head * hd;
    size_t slots = (size_t)B * (size_t)f->k_used, nff = (size_t)n_ff_max(hp);
    size_t kv_layer = z.kv / (2 * L);

    f->kv_mem = own_kv ? malloc(z.kv) : NULL;
    f->k_blocks = calloc(L, sizeof(void *));
    f->v_blocks = calloc(L, sizeof(void *));
    f->views = calloc(L, sizeof *f->views);
    f->pos = malloc((size_t)B * sizeof(int32_t));
    f->tok_seq = calloc((size_t)B, sizeof(int32_t));
    f->seq_views = calloc((size_t)max_seqs, sizeof *f->seq_views);
    if (batch) f->out_logits = malloc(fsz((size_t)max_seqs * hp->n_vocab));
    f->x = malloc(fsz((size_t)B * (3 * emb + 2 * q_dim + 2 * kv_dim)));
    f->g = malloc(fsz(slots * 2 * nff));
    f->conv = aligned_alloc(64, z.conv);
    f->hconv = aligned_alloc(64, z.hconv);
    f->scores = malloc(z.scores);
    bool ok = (f->kv_mem || !own_kv) && f->k_blocks && f->v_blocks && f->views && f->pos &&
              f->tok_seq && f->seq_views && (f->out_logits || !batch) && f->x && f->g &&
              f->conv && f->hconv && f->scores;
    if (ok && hp->arch == ENGINE_ARCH_QWEN3MOE) {
        size_t ne = hp->n_expert;
        f->ffn_out = malloc(fsz(slots * emb));
        f->router = malloc(fsz((size_t)B * ne));
        f->probs = malloc(fsz((size_t)B * ne));
        f->sel = malloc(slots * sizeof(int32_t));
        f->selw = malloc(fsz(slots));
        f->exp_start = malloc((ne + 1) * sizeof(int32_t));
        f->exp_slots = malloc(slots * sizeof(int32_t));
        f->active = malloc(ne * sizeof(int32_t));
        ok = f->ffn_out && f->router && f->probs && f->sel && f->selw && f->exp_start &&
             f->exp_slots && f->active;
    }
    if (!ok) {
        engine_fwd_free(f);
        return engine_err(ENGINE_ENOMEM, "out of memory for %d positions x %d tokens (%.1f MiB "
                          "of KV cache and buffers)", n_ctx, B,
                          (double)(z.kv * own_kv + z.act + z.conv + z.hconv + z.scores + z.moe +
                                   z.seqs) / (1 << 20));
    }
    f->conv2 = f->conv + (size_t)B * f->conv_stride;
    f->xn = f->x + (size_t)B * emb;
    f->tmp = f->xn + (size_t)B * emb;
    f->q = f->tmp + (size_t)B * emb;
    f->att = f->q + (size_t)B * q_dim;
    f->k = f->att + (size_t)B * q_dim;
    f->v = f->k + (size_t)B * kv_dim;
    f->u = f->g + slots * nff;
    for (size_t l = 0; own_kv && l < L; l++) {
        f->k_blocks[l] = (uint8_t *)f->kv_mem + (2 * l) * kv_layer;
        f->v_blocks[l] = (uint8_t *)f->kv_mem + (2 * l + 1) * kv_layer;
        f->views[l] = (engine_kv_view){&f->k_blocks[l], &f->v_blocks[l], n_ctx, kvt,
                                       (int)hp->n_head_kv, (int)hd};
    }
    *out = f;
    return 0;
}

int engine_fwd_new(engine_session *s) {
    const engine_model *m = s->m;
    engine_fwd *f;
    int rc = fwd_alloc(&f, m, s->n_ctx, s->n_batch, 1, false, s->kv_paged ? -1 : (int)s->kv_type);
    if (rc) return rc;
    for (uint32_t l = 0; s->kv_paged && l < m->hp.n_layer; l++) /* the block table (engine/kv) */
        f->views[l] = engine_kv_seq_view(m->kvc, &s->kvs, (int32_t)l);
    f->seq_views[0] = f->views;
    s->fwd = f;
    return 0;
}

int engine_fwd_batch_new(engine_fwd **out, const engine_model *m, int32_t n_ctx,
                         int32_t n_tokens, int32_t max_seqs) {
    if (m->hp.arch != ENGINE_ARCH_QWEN3MOE && m->hp.arch != ENGINE_ARCH_QWEN3)
        return engine_err(ENGINE_EUNSUPPORTED, "%s: no batched forward for this architecture",
                          m->path);
    if (n_ctx < 1 || n_tokens < 1 || max_seqs < 1 || max_seqs > n_tokens)
        return engine_err(ENGINE_EINVAL, "batched forward of %d tokens, %d sequences, %d "
                          "positions", n_tokens, max_seqs, n_ctx);
    return fwd_alloc(out, m, n_ctx, n_tokens, max_seqs, true, -1);
}

/* ---------------------------------------------------------------------------------------------
 * Jobs for the thread pool. One struct describes whichever op runs; the pool calls job_fn.
 * ------------------------------------------------------------------------------------------- */
typedef enum {
    OP_MATMUL,      /* up to 3 weights sharing one converted input */
    OP_CONVERT,     /* rows of F32 -> a vec_dot type */
    OP_NORM,        /* (x += add) then xn = rmsnorm(x) * w, per token */
    OP_QK_ROPE,     /* per-head q/k norm, RoPE, store k/v */
    OP_ATTENTION,   /* (token, head) pairs */
    OP_SWIGLU,      /* h = silu(g) * u, then convert for the down projection */
    OP_COMBINE,     /* x += sum_j w_j * expert_out_j */
} job_op;

typedef struct {
    job_op op;
    const engine_model *m;
    engine_fwd *f;
    const engine_layer *layer;
    int32_t l;                     /* layer index (KV views) */
    int32_t n;                     /* tokens in the batch */
    /* OP_MATMUL */
    int n_w;
    const engine_weight *w[3];
    float *y[3];
    size_t y_stride[3];            /* floats per token */
    const uint8_t *x;              /* converted input */
    size_t x_stride;               /* bytes per token */
    /* OP_CONVERT / OP_SWIGLU */
    engine_type type;
    const float *src;
    size_t src_stride;             /* floats */
    int cols;
    uint8_t *dst;
    size_t dst_stride;             /* bytes */
    /* OP_NORM */
    const float *add;              /* NULL: no residual add */
    const float *norm_w;
    int32_t t0;                    /* first token to normalise */
} fwd_job;

static void job_matmul(fwd_job *j, int ith, int nth) {
    engine_ffn_matmul_part(j->n_w, j->w, j->y, j->y_stride, j->x, j->x_stride, j->n, ith, nth);
}

static void job_convert(fwd_job *j, int ith, int nth) {
    engine_ffn_convert_part(j->type, j->src, j->src_stride, j->cols, j->dst, j->dst_stride, j->n,
                            ith, nth);
}

static void job_norm(fwd_job *j, int ith, int nth) {
    const engine_hparams *hp = &j->m->hp;
    engine_fwd *f = j->f;
    size_t e = hp->n_embd;
    int64_t a, b;
    engine_split(j->n - j->t0, ith, nth, &a, &b);
    for (int64_t t = j->t0 + a; t < j->t0 + b; t++) {
        float *x = f->x + (size_t)t * e;
        if (j->add) {
            const float *d = j->add + (size_t)t * e;
            for (size_t i = 0; i < e; i++) x[i] += d[i];
        }
        engine_cpu_rmsnorm(f->xn + (size_t)t * e, x, j->norm_w, (int)e, hp->rms_norm_eps);
    }
}

static void job_qk_rope(fwd_job *j, int ith, int nth) {
    const engine_model *m = j->m;
    const engine_hparams *hp = &m->hp;
    engine_fwd *f = j->f;
    int hd = (int)hp->head_dim_k, nh = (int)hp->n_head, nkv = (int)hp->n_head_kv;
    int64_t a, b;
    engine_split(j->n, ith, nth, &a, &b);
    for (int64_t t = a; t < b; t++) {
        float *q = f->q + (size_t)t * nh * hd, *k = f->k + (size_t)t * nkv * hd;
        for (int h = 0; h < nh; h++)
            engine_cpu_rmsnorm(q + h * hd, q + h * hd, j->layer->q_norm, hd, hp->rms_norm_eps);
        for (int h = 0; h < nkv; h++)
            engine_cpu_rmsnorm(k + h * hd, k + h * hd, j->layer->k_norm, hd, hp->rms_norm_eps);
        int32_t pos = f->pos[t];
        engine_cpu_rope_neox(q, nh, hd, pos, m->rope_inv_freq);
        engine_cpu_rope_neox(k, nkv, hd, pos, m->rope_inv_freq);
        engine_cpu_kv_store(&f->seq_views[f->tok_seq[t]][j->l], pos, k,
                            f->v + (size_t)t * nkv * hd);
    }
}

static void job_attention(fwd_job *j, int ith, int nth) {
    const engine_hparams *hp = &j->m->hp;
    engine_fwd *f = j->f;
    int hd = (int)hp->head_dim_k, nh = (int)hp->n_head, nkv = (int)hp->n_head_kv;
    int group = nh / nkv;
    float scale = 1.0f / sqrtf((float)hd);
    float *scores = f->scores + (size_t)ith * group * f->n_ctx;
    int64_t a, b;
    engine_split((int64_t)j->n * nkv, ith, nth, &a, &b);
    for (int64_t i = a; i < b; i++) { /* (token, kv head): the query heads of one group */
        int64_t t = i / nkv;
        int g = (int)(i % nkv);
        size_t off = ((size_t)t * nh + (size_t)g * group) * hd;
        engine_cpu_attention_group(f->att + off, f->q + off, group,
                                   &f->seq_views[f->tok_seq[t]][j->l], g, f->pos[t] + 1, scale,
                                   scores);
    }
}

/* h = silu(g) * u for n rows, converted to `type` unless the down weight dots F32 rows. */
static void job_swiglu(fwd_job *j, int ith, int nth) {
    engine_ffn_swiglu_part(j->f->g, j->f->u, j->src_stride, j->cols, j->type, j->dst,
                           j->dst_stride, j->n, ith, nth);
}

static void job_combine(fwd_job *j, int ith, int nth) {
    engine_fwd *f = j->f;
    size_t e = j->m->hp.n_embd;
    int k = f->k_used;
    int64_t a, b;
    engine_split(j->n, ith, nth, &a, &b);
    for (int64_t t = a; t < b; t++) {
        float *x = f->x + (size_t)t * e;
        for (int jj = 0; jj < k; jj++) {
            size_t slot = (size_t)t * k + jj;
            float w = f->selw[slot];
            const float *o = f->ffn_out + slot * e;
            for (size_t i = 0; i < e; i++) x[i] += w * o[i];
        }
    }
}

static void job_fn(void *ctx, int ith, int nth) {
    fwd_job *j = ctx;
    switch (j->op) {
    case OP_MATMUL: job_matmul(j, ith, nth); break;
    case OP_CONVERT: job_convert(j, ith, nth); break;
    case OP_NORM: job_norm(j, ith, nth); break;
    case OP_QK_ROPE: job_qk_rope(j, ith, nth); break;
    case OP_ATTENTION: job_attention(j, ith, nth); break;
    case OP_SWIGLU: job_swiglu(j, ith, nth); break;
    case OP_COMBINE: job_combine(j, ith, nth); break;
    }
}

/* Per-token ops over a handful of rows cost less than waking the pool (a barrier is a few
 * microseconds, far more on a loaded machine): the caller runs them alone. Results do not
 * depend on the split, so this changes no bits. */
static bool run_inline(const fwd_job *j) {
    switch (j->op) {
    case OP_NORM:
    case OP_QK_ROPE:
    case OP_CONVERT:
    case OP_COMBINE: return j->n <= 2;
    case OP_SWIGLU: return j->n <= 16;
    default: return false;
    }
}

static void run(fwd_job *j, job_op op) {
    j->op = op;
    if (run_inline(j)) job_fn(j, 0, 1);
    else engine_pool_run(j->m->pool, job_fn, j);
}

static engine_type vec_dot_type(const engine_weight *w) {
    return engine_type_traits_get(w->type)->vec_dot_type;
}

/* Make n rows of F32 (src, src_stride floats apart, cols wide) available in w's vec_dot type:
 * F32 rows are used in place; others are converted into dst. */
static void prepare_input(fwd_job *j, const engine_weight *w, const float *src,
                          size_t src_stride, int cols, int32_t t0, int32_t n, uint8_t *dst,
                          const uint8_t **x, size_t *x_stride) {
    engine_type vt = vec_dot_type(w);
    if (vt == ENGINE_TYPE_F32) {
        *x = (const uint8_t *)(src + (size_t)t0 * src_stride);
        *x_stride = src_stride * sizeof(float);
        return;
    }
    j->type = vt;
    j->src = src + (size_t)t0 * src_stride;
    j->src_stride = src_stride;
    j->cols = cols;
    j->dst = dst;
    j->dst_stride = j->f->conv_stride;
    int32_t saved = j->n;
    j->n = n;
    run(j, OP_CONVERT);
    j->n = saved;
    *x = dst;
    *x_stride = j->f->conv_stride;
}

/* y_i = W_i x for up to three weights that read the same input (rows t0 .. t0+n of src). */
static void matmul(fwd_job *j, int n_w, const engine_weight *const *w,
                   float *const *y, const size_t *y_stride, const float *src, size_t src_stride,
                   int32_t t0, int32_t n) {
    engine_fwd *f = j->f;
    int done[3] = {0, 0, 0};
    for (int i = 0; i < n_w; i++) {
        if (done[i]) continue;
        /* Weights with the same vec_dot type share one conversion and one pool job. */
        fwd_job mj = *j;
        prepare_input(j, w[i], src, src_stride, (int)w[i]->cols, t0, n, f->conv, &mj.x,
                      &mj.x_stride);
        mj.n_w = 0;
        mj.n = n;
        for (int k = i; k < n_w; k++) {
            if (done[k] || vec_dot_type(w[k]) != vec_dot_type(w[i])) continue;
            done[k] = 1;
            mj.w[mj.n_w] = w[k];
            mj.y[mj.n_w] = y[k];
            mj.y_stride[mj.n_w] = y_stride[k];
            mj.n_w++;
        }
        run(&mj, OP_MATMUL);
    }
}

static void moe_ffn(fwd_job *j, const engine_layer *ly, int32_t n) {
    engine_fwd *f = j->f;
    const engine_hparams *hp = &j->m->hp;
    int ne = (int)hp->n_expert, k = f->k_used;
    size_t emb = hp->n_embd;

    /* router logits, then top-k per token (cheap: serial) */
    const engine_weight *rw = &ly->gate_inp;
    size_t rs = (size_t)ne;
    matmul(j, 1, &rw, &f->router, &rs, f->xn, emb, 0, n);
    for (int32_t t = 0; t < n; t++)
        engine_cpu_moe_route(f->router + (size_t)t * ne, ne, k, hp->norm_topk_prob,
                             f->sel + (size_t)t * k, f->selw + (size_t)t * k, f->probs);

    /* group slots (token t, choice jj) by expert, in token order */
    engine_moe_job ej = {
        .w = {&ly->gate_exps, &ly->up_exps, &ly->down_exps, ly->gate_exps.rows, NULL},
        .exp_start = f->exp_start,
        .exp_slots = f->exp_slots,
        .active = f->active,
        .n_active = engine_moe_group(f->sel, n * k, ne, f->exp_start, f->exp_slots, f->active),
        .k = k,
        .g = f->g,
        .u = f->u,
        .out = f->ffn_out,
    };

    /* gate and up of the selected experts */
    prepare_input(j, &ly->gate_exps, f->xn, emb, (int)emb, 0, n, f->conv, &ej.xg, &ej.xg_stride);
    if (vec_dot_type(&ly->up_exps) == vec_dot_type(&ly->gate_exps)) {
        ej.xu = ej.xg;
        ej.xu_stride = ej.xg_stride;
    } else {
        prepare_input(j, &ly->up_exps, f->xn, emb, (int)emb, 0, n, f->conv2, &ej.xu,
                      &ej.xu_stride);
    }
    int64_t nff = ly->gate_exps.rows;
    engine_moe_job_items(&ej, false);
    engine_pool_run(j->m->pool, engine_moe_up_fn, &ej);

    /* h = silu(g) * u, converted for the down projection */
    fwd_job sj = *j;
    sj.n = n * k;
    sj.cols = (int)nff;
    sj.src_stride = (size_t)nff;
    sj.type = vec_dot_type(&ly->down_exps);
    sj.dst = f->hconv;
    sj.dst_stride = f->hconv_stride;
    run(&sj, OP_SWIGLU);

    if (sj.type == ENGINE_TYPE_F32) {
        ej.x = (const uint8_t *)f->g;
        ej.x_stride = (size_t)nff * sizeof(float);
    } else {
        ej.x = f->hconv;
        ej.x_stride = f->hconv_stride;
    }
    engine_moe_job_items(&ej, true);
    engine_pool_run(j->m->pool, engine_moe_down_fn, &ej);

    fwd_job cj = *j;
    cj.n = n;
    run(&cj, OP_COMBINE);
}

static void dense_ffn(fwd_job *j, const engine_layer *ly, int32_t n) {
    engine_fwd *f = j->f;
    const engine_hparams *hp = &j->m->hp;
    size_t emb = hp->n_embd, nff = hp->n_ff;
    const engine_weight *w[2] = {&ly->ffn_gate, &ly->ffn_up};
    float *y[2] = {f->g, f->u};
    size_t ys[2] = {nff, nff};
    matmul(j, 2, w, y, ys, f->xn, emb, 0, n);
    fwd_job sj = *j;
    sj.n = n;
    sj.cols = (int)nff;
    sj.src_stride = nff;
    sj.type = vec_dot_type(&ly->ffn_down);
    sj.dst = f->hconv;
    sj.dst_stride = f->hconv_stride;
    run(&sj, OP_SWIGLU);
    fwd_job mj = *j;
    mj.n = n;
    mj.n_w = 1;
    mj.w[0] = &ly->ffn_down;
    mj.y[0] = f->tmp;
    mj.y_stride[0] = emb;
    if (sj.type == ENGINE_TYPE_F32) {
        mj.x = (const uint8_t *)f->g;
        mj.x_stride = nff * sizeof(float);
    } else {
        mj.x = f->hconv;
        mj.x_stride = f->hconv_stride;
    }
    run(&mj, OP_MATMUL);
    /* x += tmp (the next norm adds it; a last add here keeps x complete for the head) */
    for (int32_t t = 0; t < n; t++) {
        float *x = f->x + (size_t)t * emb;
        const float *d = f->tmp + (size_t)t * emb;
        for (size_t i = 0; i < emb; i++) x[i] += d[i];
    }
}

/* Rows t0 .. t0+n of x = the embeddings of tokens. */
static void embed(const engine_model *m, engine_fwd *f, int32_t t0, const int32_t *tokens,
                  int32_t n) {
    size_t emb = m->hp.n_embd;
    for (int32_t t = 0; t < n; t++) {
        const uint8_t *row =
            (const uint8_t *)m->tok_embd.data + (size_t)tokens[t] * m->tok_embd.row_bytes;
        engine_dequantize_row(m->tok_embd.type, row, f->x + (size_t)(t0 + t) * emb,
                              (int64_t)emb);
    }
}

/* Every block over the n tokens embedded in x (positions, sequences and views set). */
static void blocks(const engine_model *m, engine_fwd *f, fwd_job *j, int32_t n) {
    const engine_hparams *hp = &m->hp;
    size_t emb = hp->n_embd, hd = hp->head_dim_k;
    size_t q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    memset(j, 0, sizeof *j);
    j->m = m;
    j->f = f;
    j->n = n;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const engine_layer *ly = &m->layers[l];
        j->layer = ly;
        j->l = (int32_t)l;

        j->add = NULL;
        j->norm_w = ly->attn_norm;
        j->t0 = 0;
        run(j, OP_NORM);

        const engine_weight *w[3] = {&ly->wq, &ly->wk, &ly->wv};
        float *y[3] = {f->q, f->k, f->v};
        size_t ys[3] = {q_dim, kv_dim, kv_dim};
        matmul(j, 3, w, y, ys, f->xn, emb, 0, n);
        run(j, OP_QK_ROPE);
        run(j, OP_ATTENTION);

        const engine_weight *wo = &ly->wo;
        size_t es = emb;
        matmul(j, 1, &wo, &f->tmp, &es, f->att, q_dim, 0, n);

        j->add = f->tmp;
        j->norm_w = ly->ffn_norm;
        run(j, OP_NORM);

        if (hp->arch == ENGINE_ARCH_QWEN3MOE) moe_ffn(j, ly, n);
        else dense_ffn(j, ly, n);
    }
}

/* dst[r] = logits of rows t0 .. t0+n of x (n_vocab floats apart). */
static void head(const engine_model *m, engine_fwd *f, fwd_job *j, int32_t t0, int32_t n,
                 float *dst) {
    j->add = NULL;
    j->norm_w = m->output_norm;
    j->t0 = t0;
    j->n = t0 + n;
    run(j, OP_NORM);
    const engine_weight *wout = &m->output;
    size_t vs = m->hp.n_vocab;
    matmul(j, 1, &wout, &dst, &vs, f->xn, m->hp.n_embd, t0, n);
}

int engine_fwd_run(engine_session *s, const int32_t *tokens, int32_t n, float *logits_all) {
    engine_model *m = s->m;
    engine_fwd *f = s->fwd;
    ENGINE_ASSERT(n >= 1 && n <= f->B && s->n_tokens + n <= f->n_ctx);
    for (int32_t t = 0; t < n; t++) {
        f->pos[t] = s->n_tokens + t;
        f->tok_seq[t] = 0;
    }
    embed(m, f, 0, tokens, n);
    fwd_job j;
    blocks(m, f, &j, n);
    /* output head: every token's logits when asked, else only the last token's */
    if (logits_all) {
        head(m, f, &j, 0, n, logits_all);
        memcpy(s->logits, logits_all + (size_t)(n - 1) * m->hp.n_vocab, fsz(m->hp.n_vocab));
    } else {
        head(m, f, &j, n - 1, 1, s->logits);
    }
    return 0;
}

int engine_fwd_run_batch(const engine_model *m, engine_fwd *f, engine_fwd_seq *seqs,
                         int32_t n_seqs) {
    ENGINE_ASSERT(n_seqs >= 1 && n_seqs <= f->max_seqs);
    int32_t n = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        const engine_fwd_seq *q = &seqs[i];
        ENGINE_ASSERT(q->n >= 1 && n + q->n <= f->B && q->p0 + q->n <= f->n_ctx);
        f->seq_views[i] = q->views;
        for (int32_t t = 0; t < q->n; t++) {
            f->pos[n + t] = q->p0 + t;
            f->tok_seq[n + t] = i;
        }
        embed(m, f, n, q->tokens, q->n);
        n += q->n;
    }
    fwd_job j;
    blocks(m, f, &j, n);
    /* the head runs over the last token of each sequence that wants logits: move those rows of
     * x to the front (row r comes from a row >= r, so copying in order is safe) */
    size_t emb = m->hp.n_embd;
    int32_t n_out = 0, end = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        end += seqs[i].n;
        seqs[i].logits_out = NULL;
        if (!seqs[i].logits) continue;
        if (end - 1 != n_out)
            memcpy(f->x + (size_t)n_out * emb, f->x + (size_t)(end - 1) * emb, fsz(emb));
        seqs[i].logits_out = f->out_logits + (size_t)n_out * m->hp.n_vocab;
        n_out++;
    }
    if (n_out) head(m, f, &j, 0, n_out, f->out_logits);
    return 0;
}
