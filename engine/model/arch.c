/* Architectures as data: hyper-parameters <-> GGUF metadata, tensor lists, validation,
 * presets. The contracts are in arch.h. */
#include "model/arch.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "cpu/quant.h"

static const char *const arch_names[ENGINE_ARCH_COUNT] = {
    [ENGINE_ARCH_QWEN3MOE] = "qwen3moe",
    [ENGINE_ARCH_QWEN3] = "qwen3",
    [ENGINE_ARCH_QWEN35MOE] = "qwen35moe",
};

const char *engine_arch_name(engine_arch arch) {
    if ((int)arch < 0 || arch >= ENGINE_ARCH_COUNT) return NULL;
    return arch_names[arch];
}

int engine_arch_from_name(const char *name) {
    for (int i = 0; i < ENGINE_ARCH_COUNT; i++)
        if (name && !strcmp(name, arch_names[i])) return i;
    return -1;
}

bool engine_arch_is_moe(engine_arch arch) {
    return arch == ENGINE_ARCH_QWEN3MOE || arch == ENGINE_ARCH_QWEN35MOE;
}

/* ---------------------------------------------------------------------------------------------
 * Hyper-parameters
 * ------------------------------------------------------------------------------------------- */

/* Large enough for anything real, small enough that products of two fit comfortably. */
#define HP_MAX_DIM (1u << 24)

int engine_hparams_check(const engine_hparams *hp) {
    const char *an = engine_arch_name(hp->arch);
    if (!an) return engine_err(ENGINE_EUNSUPPORTED, "unknown architecture %d", (int)hp->arch);
    struct {
        const char *name;
        uint32_t v;
    } dims[] = {
        {"block_count", hp->n_layer},
        {"embedding_length", hp->n_embd},
        {"attention.head_count", hp->n_head},
        {"attention.head_count_kv", hp->n_head_kv},
        {"attention.key_length", hp->head_dim_k},
        {"attention.value_length", hp->head_dim_v},
        {"vocab_size", hp->n_vocab},
        {"context_length", hp->n_ctx_train},
        {"feed_forward_length", hp->n_ff},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        /* converted Qwen3.5 files have no feed_forward_length (no dense FFN) */
        if (hp->arch == ENGINE_ARCH_QWEN35MOE && dims[i].v == 0 && !strcmp(dims[i].name,
                                                                           "feed_forward_length"))
            continue;
        if (dims[i].v == 0 || dims[i].v > HP_MAX_DIM)
            return engine_err(ENGINE_EFORMAT, "%s.%s = %u is out of range (1..%u)", an,
                              dims[i].name, dims[i].v, HP_MAX_DIM);
    }
    if (hp->n_layer > 4096)
        return engine_err(ENGINE_EFORMAT, "%s.block_count = %u is out of range (1..4096)", an,
                          hp->n_layer);
    if (hp->n_head % hp->n_head_kv != 0)
        return engine_err(ENGINE_EFORMAT,
                          "%s.attention.head_count = %u is not a multiple of head_count_kv = %u",
                          an, hp->n_head, hp->n_head_kv);
    if (hp->head_dim_k % 2 != 0)
        return engine_err(ENGINE_EFORMAT, "%s.attention.key_length = %u is odd (RoPE needs pairs)",
                          an, hp->head_dim_k);
    if ((uint64_t)hp->n_head * hp->head_dim_k > HP_MAX_DIM ||
        (uint64_t)hp->n_head * hp->head_dim_v > HP_MAX_DIM)
        return engine_err(ENGINE_EFORMAT, "%s: head_count x key/value_length is too large", an);
    if (!(hp->rope_theta > 0.0f) || !isfinite(hp->rope_theta))
        return engine_err(ENGINE_EFORMAT, "%s.rope.freq_base = %g must be positive and finite",
                          an, (double)hp->rope_theta);
    if (!(hp->rms_norm_eps > 0.0f) || !(hp->rms_norm_eps < 1.0f))
        return engine_err(ENGINE_EFORMAT,
                          "%s.attention.layer_norm_rms_epsilon = %g must be in (0, 1)", an,
                          (double)hp->rms_norm_eps);
    if (engine_arch_is_moe(hp->arch)) {
        if (hp->n_expert == 0 || hp->n_expert > 4096)
            return engine_err(ENGINE_EFORMAT, "%s.expert_count = %u is out of range (1..4096)",
                              an, hp->n_expert);
        if (hp->n_expert_used == 0 || hp->n_expert_used > hp->n_expert)
            return engine_err(ENGINE_EFORMAT,
                              "%s.expert_used_count = %u is out of range (1..expert_count = %u)",
                              an, hp->n_expert_used, hp->n_expert);
        if (hp->n_ff_exp == 0 || hp->n_ff_exp > HP_MAX_DIM)
            return engine_err(ENGINE_EFORMAT,
                              "%s.expert_feed_forward_length = %u is out of range (1..%u)", an,
                              hp->n_ff_exp, HP_MAX_DIM);
    } else if (hp->n_expert || hp->n_expert_used || hp->n_ff_exp) {
        return engine_err(ENGINE_EFORMAT, "%s is dense but has expert parameters", an);
    }
    if (hp->arch == ENGINE_ARCH_QWEN35MOE) return engine_q35_hparams_check(hp);
    return 0;
}

static int key_fmt(char *buf, size_t cap, const char *arch, const char *suffix) {
    int n = snprintf(buf, cap, "%s.%s", arch, suffix);
    return n > 0 && (size_t)n < cap ? 0 : engine_err(ENGINE_EINTERNAL, "key too long");
}

/* A required u32 key ARCH.suffix. The reader's getters name the file and key on failure. */
static int get_u32_req(const engine_gguf *g, const char *arch, const char *suffix,
                       uint32_t *out) {
    char key[128];
    int rc = key_fmt(key, sizeof key, arch, suffix);
    return rc ? rc : engine_gguf_get_u32(g, key, out);
}

/* An optional u32 key: keeps *out when absent, fails only on a wrong type or range. */
static int get_u32_opt(const engine_gguf *g, const char *arch, const char *suffix,
                       uint32_t *out) {
    char key[128];
    int rc = key_fmt(key, sizeof key, arch, suffix);
    if (rc) return rc;
    if (!engine_gguf_find_key(g, key)) return 0;
    return engine_gguf_get_u32(g, key, out);
}

int engine_hparams_read(engine_hparams *out, const engine_gguf *g) {
    const char *path = engine_gguf_path(g);
    engine_gguf_str s;
    int rc = engine_gguf_get_str(g, "general.architecture", &s);
    if (rc) return rc;
    char an[64];
    if (s.len >= sizeof an)
        return engine_err(ENGINE_EUNSUPPORTED, "%s: unsupported architecture \"%.*s\"", path,
                          (int)ENGINE_MIN(s.len, 64), s.ptr);
    memcpy(an, s.ptr, s.len);
    an[s.len] = '\0';
    int arch = engine_arch_from_name(an);
    if (arch < 0)
        return engine_err(ENGINE_EUNSUPPORTED,
                          "%s: unsupported architecture \"%s\" (supported: qwen3moe, qwen3, "
                          "qwen35moe)", path,
                          an);

    engine_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.arch = (engine_arch)arch;
    if ((rc = get_u32_req(g, an, "block_count", &hp.n_layer)) ||
        (rc = get_u32_req(g, an, "context_length", &hp.n_ctx_train)) ||
        (rc = get_u32_req(g, an, "embedding_length", &hp.n_embd)) ||
        (rc = (hp.arch == ENGINE_ARCH_QWEN35MOE ? get_u32_opt : get_u32_req)(
             g, an, "feed_forward_length", &hp.n_ff)) ||
        (rc = get_u32_req(g, an, "attention.head_count", &hp.n_head)) ||
        (rc = get_u32_req(g, an, "attention.head_count_kv", &hp.n_head_kv)))
        return rc;
    if (hp.n_head == 0)
        return engine_err(ENGINE_EFORMAT, "%s: %s.attention.head_count is 0", path, an);
    hp.head_dim_k = hp.head_dim_v = hp.n_embd / hp.n_head;
    if ((rc = get_u32_opt(g, an, "attention.key_length", &hp.head_dim_k)) ||
        (rc = get_u32_opt(g, an, "attention.value_length", &hp.head_dim_v)))
        return rc;

    char key[128];
    hp.rope_theta = 10000.0f;
    if ((rc = key_fmt(key, sizeof key, an, "rope.freq_base"))) return rc;
    if (engine_gguf_find_key(g, key) && (rc = engine_gguf_get_f32(g, key, &hp.rope_theta)))
        return rc;
    if ((rc = key_fmt(key, sizeof key, an, "attention.layer_norm_rms_epsilon")) ||
        (rc = engine_gguf_get_f32(g, key, &hp.rms_norm_eps)))
        return rc;

    if (engine_arch_is_moe(hp.arch)) {
        if ((rc = get_u32_req(g, an, "expert_count", &hp.n_expert)) ||
            (rc = get_u32_req(g, an, "expert_used_count", &hp.n_expert_used)) ||
            (rc = get_u32_req(g, an, "expert_feed_forward_length", &hp.n_ff_exp)))
            return rc;
        hp.norm_topk_prob = true;
        if ((rc = key_fmt(key, sizeof key, an, "expert_weights_norm"))) return rc;
        if (engine_gguf_find_key(g, key) && (rc = engine_gguf_get_bool(g, key, &hp.norm_topk_prob)))
            return rc;
    }

    /* n_vocab: explicit key, else the tokenizer's token list, else the embedding's rows. */
    if ((rc = get_u32_opt(g, an, "vocab_size", &hp.n_vocab))) return rc;
    if (hp.n_vocab == 0 && engine_gguf_find_key(g, "tokenizer.ggml.tokens")) {
        const engine_gguf_value *v;
        if ((rc = engine_gguf_get_arr(g, "tokenizer.ggml.tokens", ENGINE_GGUF_STRING, &v)))
            return rc;
        if (v->arr.n > HP_MAX_DIM)
            return engine_err(ENGINE_EFORMAT, "%s: tokenizer.ggml.tokens has %llu entries (max %u)",
                              path, (unsigned long long)v->arr.n, HP_MAX_DIM);
        hp.n_vocab = (uint32_t)v->arr.n;
    }
    if (hp.n_vocab == 0) {
        const engine_gguf_tensor *t = engine_gguf_find_tensor(g, "token_embd.weight");
        if (!t)
            return engine_err(ENGINE_EFORMAT, "%s: missing tensor token_embd.weight", path);
        if (t->n_dims != 2 || t->ne[1] <= 0 || t->ne[1] > (int64_t)HP_MAX_DIM)
            return engine_err(ENGINE_EFORMAT, "%s: tensor token_embd.weight has a bad shape",
                              path);
        hp.n_vocab = (uint32_t)t->ne[1];
    }
    hp.tied_embeddings = engine_gguf_find_tensor(g, "output.weight") == NULL;
    if (hp.arch == ENGINE_ARCH_QWEN35MOE && (rc = engine_q35_hparams_read(&hp, g, an))) return rc;

    if ((rc = engine_hparams_check(&hp)))
        return engine_err(rc, "%s: %s", path, engine_error_last());
    *out = hp;
    return 0;
}

int engine_hparams_write(const engine_hparams *hp, engine_gguf_writer *w) {
    int rc = engine_hparams_check(hp);
    if (rc) return rc;
    const char *an = engine_arch_name(hp->arch);
    char key[128];
#define SET_U32(suffix, val)                                                                   \
    do {                                                                                       \
        if ((rc = key_fmt(key, sizeof key, an, suffix)) ||                                     \
            (rc = engine_gguf_writer_set_u32(w, key, (val))))                                  \
            return rc;                                                                         \
    } while (0)
#define SET_F32(suffix, val)                                                                   \
    do {                                                                                       \
        if ((rc = key_fmt(key, sizeof key, an, suffix)) ||                                     \
            (rc = engine_gguf_writer_set_f32(w, key, (val))))                                  \
            return rc;                                                                         \
    } while (0)
    /* The order convert_hf_to_gguf.py writes them in. */
    if ((rc = engine_gguf_writer_set_str(w, "general.architecture", an))) return rc;
    SET_U32("block_count", hp->n_layer + hp->n_nextn); /* qwen35moe: MTP blocks count */
    SET_U32("context_length", hp->n_ctx_train);
    SET_U32("embedding_length", hp->n_embd);
    if (hp->n_ff || hp->arch != ENGINE_ARCH_QWEN35MOE) SET_U32("feed_forward_length", hp->n_ff);
    SET_U32("attention.head_count", hp->n_head);
    SET_U32("attention.head_count_kv", hp->n_head_kv);
    SET_F32("rope.freq_base", hp->rope_theta);
    SET_F32("attention.layer_norm_rms_epsilon", hp->rms_norm_eps);
    if (engine_arch_is_moe(hp->arch)) SET_U32("expert_used_count", hp->n_expert_used);
    SET_U32("attention.key_length", hp->head_dim_k);
    SET_U32("attention.value_length", hp->head_dim_v);
    if (engine_arch_is_moe(hp->arch)) {
        SET_U32("expert_count", hp->n_expert);
        SET_U32("expert_feed_forward_length", hp->n_ff_exp);
        /* Converted Qwen3-MoE files carry no expert_weights_norm (readers assume true); only
         * a non-default value needs saying. */
        if (!hp->norm_topk_prob) {
            if ((rc = key_fmt(key, sizeof key, an, "expert_weights_norm")) ||
                (rc = engine_gguf_writer_set_bool(w, key, false)))
                return rc;
        }
    }
#undef SET_U32
#undef SET_F32
    if (hp->arch == ENGINE_ARCH_QWEN35MOE) return engine_q35_hparams_write(hp, w, an);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Tensors
 * ------------------------------------------------------------------------------------------- */
static const char *const role_names[ENGINE_TENSOR_ROLE_COUNT] = {
    [ENGINE_TENSOR_TOKEN_EMBD] = "token_embd",
    [ENGINE_TENSOR_OUTPUT_NORM] = "output_norm",
    [ENGINE_TENSOR_OUTPUT] = "output",
    [ENGINE_TENSOR_ATTN_NORM] = "attn_norm",
    [ENGINE_TENSOR_ATTN_Q] = "attn_q",
    [ENGINE_TENSOR_ATTN_K] = "attn_k",
    [ENGINE_TENSOR_ATTN_V] = "attn_v",
    [ENGINE_TENSOR_ATTN_OUT] = "attn_output",
    [ENGINE_TENSOR_ATTN_Q_NORM] = "attn_q_norm",
    [ENGINE_TENSOR_ATTN_K_NORM] = "attn_k_norm",
    [ENGINE_TENSOR_FFN_NORM] = "ffn_norm",
    [ENGINE_TENSOR_FFN_GATE_INP] = "ffn_gate_inp",
    [ENGINE_TENSOR_FFN_GATE_EXPS] = "ffn_gate_exps",
    [ENGINE_TENSOR_FFN_UP_EXPS] = "ffn_up_exps",
    [ENGINE_TENSOR_FFN_DOWN_EXPS] = "ffn_down_exps",
    [ENGINE_TENSOR_FFN_GATE] = "ffn_gate",
    [ENGINE_TENSOR_FFN_UP] = "ffn_up",
    [ENGINE_TENSOR_FFN_DOWN] = "ffn_down",
    [ENGINE_TENSOR_ATTN_POST_NORM] = "post_attention_norm",
    [ENGINE_TENSOR_ATTN_QKV] = "attn_qkv",
    [ENGINE_TENSOR_ATTN_GATE] = "attn_gate",
    [ENGINE_TENSOR_SSM_CONV1D] = "ssm_conv1d",
    [ENGINE_TENSOR_SSM_DT] = "ssm_dt",
    [ENGINE_TENSOR_SSM_A] = "ssm_a",
    [ENGINE_TENSOR_SSM_BETA] = "ssm_beta",
    [ENGINE_TENSOR_SSM_ALPHA] = "ssm_alpha",
    [ENGINE_TENSOR_SSM_NORM] = "ssm_norm",
    [ENGINE_TENSOR_SSM_OUT] = "ssm_out",
    [ENGINE_TENSOR_FFN_GATE_INP_SHEXP] = "ffn_gate_inp_shexp",
    [ENGINE_TENSOR_FFN_GATE_SHEXP] = "ffn_gate_shexp",
    [ENGINE_TENSOR_FFN_UP_SHEXP] = "ffn_up_shexp",
    [ENGINE_TENSOR_FFN_DOWN_SHEXP] = "ffn_down_shexp",
    [ENGINE_TENSOR_NEXTN_EH_PROJ] = "nextn.eh_proj",
    [ENGINE_TENSOR_NEXTN_ENORM] = "nextn.enorm",
    [ENGINE_TENSOR_NEXTN_HNORM] = "nextn.hnorm",
    [ENGINE_TENSOR_NEXTN_SHARED_HEAD_NORM] = "nextn.shared_head_norm",
};

const char *engine_tensor_role_name(engine_tensor_role role) {
    if ((int)role < 0 || role >= ENGINE_TENSOR_ROLE_COUNT) return "?";
    return role_names[role];
}

static bool role_is_global(engine_tensor_role role) {
    return role == ENGINE_TENSOR_TOKEN_EMBD || role == ENGINE_TENSOR_OUTPUT_NORM ||
           role == ENGINE_TENSOR_OUTPUT;
}

int engine_tensor_name(char *buf, size_t cap, engine_tensor_role role, int layer) {
    if ((int)role < 0 || role >= ENGINE_TENSOR_ROLE_COUNT)
        return engine_err(ENGINE_EINVAL, "tensor role %d out of range", (int)role);
    /* llama.cpp names dt_bias "ssm_dt.bias" and the decay "ssm_a" (a parameter, no suffix) */
    const char *suffix = role == ENGINE_TENSOR_SSM_DT ? ".bias"
                         : role == ENGINE_TENSOR_SSM_A ? ""
                                                       : ".weight";
    int n = role_is_global(role)
                ? snprintf(buf, cap, "%s%s", role_names[role], suffix)
                : snprintf(buf, cap, "blk.%d.%s%s", layer, role_names[role], suffix);
    if (n < 0 || (size_t)n >= cap)
        return engine_err(ENGINE_EINVAL, "tensor name does not fit in %zu bytes", cap);
    return 0;
}

static void desc_set(engine_tensor_desc *d, engine_tensor_role role, int layer, int n_dims,
                     int64_t ne0, int64_t ne1, int64_t ne2) {
    memset(d, 0, sizeof *d);
    int rc = engine_tensor_name(d->name, sizeof d->name, role, layer);
    ENGINE_ASSERT(rc == 0); /* layer <= 4096 always fits */
    d->role = role;
    d->layer = role_is_global(role) ? -1 : layer;
    d->n_dims = n_dims;
    d->ne[0] = ne0;
    d->ne[1] = n_dims > 1 ? ne1 : 1;
    d->ne[2] = n_dims > 2 ? ne2 : 1;
    d->ne[3] = 1;
    d->is_norm = role == ENGINE_TENSOR_OUTPUT_NORM || role == ENGINE_TENSOR_ATTN_NORM ||
                 role == ENGINE_TENSOR_ATTN_Q_NORM || role == ENGINE_TENSOR_ATTN_K_NORM ||
                 role == ENGINE_TENSOR_FFN_NORM || role == ENGINE_TENSOR_ATTN_POST_NORM ||
                 role == ENGINE_TENSOR_SSM_NORM || role == ENGINE_TENSOR_NEXTN_ENORM ||
                 role == ENGINE_TENSOR_NEXTN_HNORM || role == ENGINE_TENSOR_NEXTN_SHARED_HEAD_NORM;
}

void engine_tensor_desc_set(engine_tensor_desc *d, engine_tensor_role role, int layer,
                            int n_dims, int64_t ne0, int64_t ne1, int64_t ne2) {
    desc_set(d, role, layer, n_dims, ne0, ne1, ne2);
}

static size_t tensors_per_layer(const engine_hparams *hp) {
    return 8 + (engine_arch_is_moe(hp->arch) ? 4 : 3);
}

int engine_arch_tensors(const engine_hparams *hp, engine_tensor_desc **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    int rc = engine_hparams_check(hp);
    if (rc) return rc;
    if (hp->arch == ENGINE_ARCH_QWEN35MOE) return engine_q35_tensors(hp, out, n_out);
    size_t n = 1 + (size_t)hp->n_layer * tensors_per_layer(hp) + 1 + (hp->tied_embeddings ? 0 : 1);
    engine_tensor_desc *d = calloc(n, sizeof *d);
    if (!d) return engine_err(ENGINE_ENOMEM, "out of memory for %zu tensor descriptions", n);
    const int64_t E = hp->n_embd, V = hp->n_vocab;
    const int64_t q = (int64_t)hp->n_head * hp->head_dim_k;
    const int64_t k = (int64_t)hp->n_head_kv * hp->head_dim_k;
    const int64_t v = (int64_t)hp->n_head_kv * hp->head_dim_v;
    const int64_t o = (int64_t)hp->n_head * hp->head_dim_v;
    size_t i = 0;
    desc_set(&d[i++], ENGINE_TENSOR_TOKEN_EMBD, -1, 2, E, V, 1);
    for (int l = 0; l < (int)hp->n_layer; l++) {
        desc_set(&d[i++], ENGINE_TENSOR_ATTN_NORM, l, 1, E, 1, 1);
        desc_set(&d[i++], ENGINE_TENSOR_ATTN_Q, l, 2, E, q, 1);
        desc_set(&d[i++], ENGINE_TENSOR_ATTN_K, l, 2, E, k, 1);
        desc_set(&d[i++], ENGINE_TENSOR_ATTN_V, l, 2, E, v, 1);
        desc_set(&d[i++], ENGINE_TENSOR_ATTN_OUT, l, 2, o, E, 1);
        desc_set(&d[i++], ENGINE_TENSOR_ATTN_Q_NORM, l, 1, hp->head_dim_k, 1, 1);
        desc_set(&d[i++], ENGINE_TENSOR_ATTN_K_NORM, l, 1, hp->head_dim_k, 1, 1);
        desc_set(&d[i++], ENGINE_TENSOR_FFN_NORM, l, 1, E, 1, 1);
        if (engine_arch_is_moe(hp->arch)) {
            const int64_t X = hp->n_expert, F = hp->n_ff_exp;
            desc_set(&d[i++], ENGINE_TENSOR_FFN_GATE_INP, l, 2, E, X, 1);
            desc_set(&d[i++], ENGINE_TENSOR_FFN_GATE_EXPS, l, 3, E, F, X);
            desc_set(&d[i++], ENGINE_TENSOR_FFN_UP_EXPS, l, 3, E, F, X);
            desc_set(&d[i++], ENGINE_TENSOR_FFN_DOWN_EXPS, l, 3, F, E, X);
        } else {
            const int64_t F = hp->n_ff;
            desc_set(&d[i++], ENGINE_TENSOR_FFN_GATE, l, 2, E, F, 1);
            desc_set(&d[i++], ENGINE_TENSOR_FFN_UP, l, 2, E, F, 1);
            desc_set(&d[i++], ENGINE_TENSOR_FFN_DOWN, l, 2, F, E, 1);
        }
    }
    desc_set(&d[i++], ENGINE_TENSOR_OUTPUT_NORM, -1, 1, E, 1, 1);
    if (!hp->tied_embeddings) desc_set(&d[i++], ENGINE_TENSOR_OUTPUT, -1, 2, E, V, 1);
    ENGINE_ASSERT(i == n);
    *out = d;
    *n_out = n;
    return 0;
}

void engine_arch_param_count(const engine_hparams *hp, uint64_t *total, uint64_t *active) {
    if (hp->arch == ENGINE_ARCH_QWEN35MOE) {
        engine_q35_param_count(hp, total, active);
        return;
    }
    const uint64_t E = hp->n_embd, V = hp->n_vocab;
    const uint64_t attn = E * hp->n_head * hp->head_dim_k + E * hp->n_head_kv * hp->head_dim_k +
                          E * hp->n_head_kv * hp->head_dim_v + (uint64_t)hp->n_head * hp->head_dim_v * E +
                          2ull * hp->head_dim_k + 2 * E;
    uint64_t ffn_total, ffn_active;
    if (engine_arch_is_moe(hp->arch)) {
        const uint64_t per_expert = 3 * E * hp->n_ff_exp;
        ffn_total = E * hp->n_expert + per_expert * hp->n_expert;
        ffn_active = E * hp->n_expert + per_expert * hp->n_expert_used;
    } else {
        ffn_total = ffn_active = 3 * E * hp->n_ff;
    }
    const uint64_t global = E * V + E + (hp->tied_embeddings ? 0 : E * V);
    if (total) *total = global + hp->n_layer * (attn + ffn_total);
    if (active) *active = global + hp->n_layer * (attn + ffn_active);
}

static int fmt_shape(char *buf, size_t cap, int n_dims, const int64_t *ne) {
    int n = 0;
    buf[0] = '\0';
    for (int i = 0; i < n_dims && (size_t)n < cap; i++)
        n += snprintf(buf + n, cap - (size_t)n, "%s%lld", i ? ", " : "{", (long long)ne[i]);
    if ((size_t)n < cap) snprintf(buf + n, cap - (size_t)n, "}");
    return 0;
}

int engine_arch_validate(const engine_hparams *hp, const engine_gguf *g) {
    const char *path = engine_gguf_path(g);
    engine_tensor_desc *d;
    size_t n;
    int rc = engine_arch_tensors(hp, &d, &n);
    if (rc) return engine_err(rc, "%s: %s", path, engine_error_last());
    for (size_t i = 0; i < n && rc == 0; i++) {
        const engine_tensor_desc *e = &d[i];
        const engine_gguf_tensor *t = engine_gguf_find_tensor(g, e->name);
        if (!t) {
            rc = engine_err(ENGINE_EFORMAT, "%s: missing tensor %s (%s)", path, e->name,
                            engine_arch_name(hp->arch));
            break;
        }
        /* Trailing dimensions of 1 may be written or not: compare the 4-D extents. */
        bool same = true;
        for (int k = 0; k < 4; k++) {
            int64_t have = k < t->n_dims ? t->ne[k] : 1;
            if (have != e->ne[k]) same = false;
        }
        if (!same) {
            char want[96], have[96];
            fmt_shape(want, sizeof want, e->n_dims, e->ne);
            fmt_shape(have, sizeof have, t->n_dims, t->ne);
            rc = engine_err(ENGINE_EFORMAT, "%s: tensor %s: shape %s but expected %s", path,
                            e->name, have, want);
            break;
        }
        const engine_type_traits *tr = engine_type_traits_get(t->type);
        if (!tr || !tr->supported) {
            rc = engine_err(ENGINE_EUNSUPPORTED,
                            "%s: tensor %s: type %s is not supported (supported: f32, f16, bf16, "
                            "q8_0, q4_0, q4_K, q5_K, q6_K)",
                            path, e->name, engine_type_name(t->type));
            break;
        }
        if (e->is_norm && t->type != ENGINE_TYPE_F32) {
            rc = engine_err(ENGINE_EUNSUPPORTED, "%s: tensor %s: norm weights must be f32, not %s",
                            path, e->name, engine_type_name(t->type));
            break;
        }
        if (t->ne[0] % tr->block_size != 0) {
            rc = engine_err(ENGINE_EFORMAT,
                            "%s: tensor %s: row length %lld is not a multiple of the %s block "
                            "size %lld",
                            path, e->name, (long long)t->ne[0], tr->name,
                            (long long)tr->block_size);
            break;
        }
    }
    free(d);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Presets. The tiny ones keep ne[0] of every matrix a multiple of 256 so that every K-quant
 * type applies to them (a 128-wide tiny model would fall back to Q8_0 everywhere and never
 * exercise the K-quant kernels). n_head * head_dim != n_embd on purpose, as in the real
 * Qwen3-30B-A3B (32 x 128 = 4096 vs 2048), to catch code that confuses the two.
 * ------------------------------------------------------------------------------------------- */
static const engine_arch_preset presets[] = {
    {"tiny",
     "qwen3moe, 4 layers, hidden 256, 4 q / 2 kv heads of 64, 8 experts (2 active) of 256, "
     "real Qwen3 vocabulary; the embedded default model",
     {.arch = ENGINE_ARCH_QWEN3MOE, .n_layer = 4, .n_embd = 256, .n_head = 4, .n_head_kv = 2,
      .head_dim_k = 64, .head_dim_v = 64, .n_ff = 768, .n_expert = 8, .n_expert_used = 2,
      .n_ff_exp = 256, .n_vocab = 151936, .n_ctx_train = 40960, .rope_theta = 1e6f,
      .rms_norm_eps = 1e-6f, .norm_topk_prob = true, .tied_embeddings = false}},
    {"qwen3-tiny",
     "dense qwen3, 4 layers, hidden 256, 4 q / 2 kv heads of 64, FFN 512, tied embeddings",
     {.arch = ENGINE_ARCH_QWEN3, .n_layer = 4, .n_embd = 256, .n_head = 4, .n_head_kv = 2,
      .head_dim_k = 64, .head_dim_v = 64, .n_ff = 512, .n_vocab = 151936, .n_ctx_train = 40960,
      .rope_theta = 1e6f, .rms_norm_eps = 1e-6f, .tied_embeddings = true}},
    {"small",
     "qwen3moe, 12 layers, hidden 1024, 16 q / 4 kv heads of 128, 32 experts (8 active) of "
     "512: ~1.1B parameters for CPU benchmarks",
     {.arch = ENGINE_ARCH_QWEN3MOE, .n_layer = 12, .n_embd = 1024, .n_head = 16, .n_head_kv = 4,
      .head_dim_k = 128, .head_dim_v = 128, .n_ff = 3072, .n_expert = 32, .n_expert_used = 8,
      .n_ff_exp = 512, .n_vocab = 151936, .n_ctx_train = 40960, .rope_theta = 1e6f,
      .rms_norm_eps = 1e-6f, .norm_topk_prob = true, .tied_embeddings = false}},
    {"qwen3-0.6b",
     "dense qwen3, the shape of Qwen3-0.6B: 28 layers, hidden 1024, 16 q / 8 kv heads of 128, "
     "FFN 3072, tied embeddings",
     {.arch = ENGINE_ARCH_QWEN3, .n_layer = 28, .n_embd = 1024, .n_head = 16, .n_head_kv = 8,
      .head_dim_k = 128, .head_dim_v = 128, .n_ff = 3072, .n_vocab = 151936,
      .n_ctx_train = 40960, .rope_theta = 1e6f, .rms_norm_eps = 1e-6f,
      .tied_embeddings = true}},
    {"qwen3-30b-a3b",
     "qwen3moe, the shape of Qwen3-30B-A3B: 48 layers, hidden 2048, 32 q / 4 kv heads of 128, "
     "128 experts (8 active) of 768, untied output",
     {.arch = ENGINE_ARCH_QWEN3MOE, .n_layer = 48, .n_embd = 2048, .n_head = 32, .n_head_kv = 4,
      .head_dim_k = 128, .head_dim_v = 128, .n_ff = 6144, .n_expert = 128,
      .n_expert_used = 8, .n_ff_exp = 768, .n_vocab = 151936, .n_ctx_train = 40960,
      .rope_theta = 1e6f, .rms_norm_eps = 1e-6f, .norm_topk_prob = true,
      .tied_embeddings = false}},
    {"qwen35-tiny",
     "qwen35moe hybrid, 8 layers (every 4th full attention), hidden 256, 4 q / 2 kv heads of 64 "
     "(16 rotated), DeltaNet 2 k / 4 v heads of 64, 8 experts (2 active) of 256 + shared 256, "
     "one MTP block",
     {.arch = ENGINE_ARCH_QWEN35MOE, .n_layer = 8, .n_embd = 256, .n_head = 4, .n_head_kv = 2,
      .head_dim_k = 64, .head_dim_v = 64, .n_ff = 0, .n_expert = 8, .n_expert_used = 2,
      .n_ff_exp = 256, .n_vocab = 151936, .n_ctx_train = 262144, .rope_theta = 1e7f,
      .rms_norm_eps = 1e-6f, .norm_topk_prob = true, .tied_embeddings = false,
      .n_ff_shexp = 256, .n_rot = 16, .rope_sections = {3, 3, 2, 0}, .full_attn_interval = 4,
      .ssm_d_conv = 4, .ssm_d_state = 64, .ssm_n_group = 2, .ssm_dt_rank = 4,
      .ssm_d_inner = 256, .n_nextn = 1}},
    {"qwen35-35b-a3b",
     "qwen35moe, the shape of Qwen3.5/3.6-35B-A3B: 40 layers (30 Gated DeltaNet, 10 gated "
     "attention 16 q / 2 kv of 256), hidden 2048, 256 experts (8 active) of 512 + shared 512, "
     "vocabulary 248320 (the Qwen3 tokenizer padded), no MTP block",
     {.arch = ENGINE_ARCH_QWEN35MOE, .n_layer = 40, .n_embd = 2048, .n_head = 16,
      .n_head_kv = 2, .head_dim_k = 256, .head_dim_v = 256, .n_ff = 0, .n_expert = 256,
      .n_expert_used = 8, .n_ff_exp = 512, .n_vocab = 248320, .n_ctx_train = 262144,
      .rope_theta = 1e7f, .rms_norm_eps = 1e-6f, .norm_topk_prob = true,
      .tied_embeddings = false, .n_ff_shexp = 512, .n_rot = 64, .rope_sections = {11, 11, 10, 0},
      .full_attn_interval = 4, .ssm_d_conv = 4, .ssm_d_state = 128, .ssm_n_group = 16,
      .ssm_dt_rank = 32, .ssm_d_inner = 4096}},
    {"qwen35-35b-a3b-mtp",
     "qwen35moe, the shape of Qwen3.5/3.6-35B-A3B: 40 layers (30 Gated DeltaNet, 10 gated "
     "attention 16 q / 2 kv of 256), hidden 2048, 256 experts (8 active) of 512 + shared 512, "
     "vocabulary 248320 (the Qwen3 tokenizer padded), with its MTP block (blk.40, nextn.*)",
     {.arch = ENGINE_ARCH_QWEN35MOE, .n_layer = 40, .n_embd = 2048, .n_head = 16,
      .n_head_kv = 2, .head_dim_k = 256, .head_dim_v = 256, .n_ff = 0, .n_expert = 256,
      .n_expert_used = 8, .n_ff_exp = 512, .n_vocab = 248320, .n_ctx_train = 262144,
      .rope_theta = 1e7f, .rms_norm_eps = 1e-6f, .norm_topk_prob = true,
      .tied_embeddings = false, .n_ff_shexp = 512, .n_rot = 64, .rope_sections = {11, 11, 10, 0},
      .full_attn_interval = 4, .ssm_d_conv = 4, .ssm_d_state = 128, .ssm_n_group = 16,
      .ssm_dt_rank = 32, .ssm_d_inner = 4096, .n_nextn = 1}},
};

size_t engine_arch_preset_count(void) {
    return sizeof presets / sizeof presets[0];
}

const engine_arch_preset *engine_arch_preset_at(size_t i) {
    return i < engine_arch_preset_count() ? &presets[i] : NULL;
}

const engine_arch_preset *engine_arch_preset_find(const char *name) {
    for (size_t i = 0; name && i < engine_arch_preset_count(); i++)
        if (!strcmp(presets[i].name, name)) return &presets[i];
    return NULL;
}
