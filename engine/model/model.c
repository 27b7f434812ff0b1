/* Loading a model (GGUF -> typed weights in place, tokenizer from the file's metadata) and the
 * session object around the forward pass. Contracts in engine.h. */
#include "model/model_int.h"
#ifdef SPARK_HAVE_CUDA
#include "cuda/cuda_backend.h"
#include "cuda/q35_mtp.h"
#include "kv/kv.h"
#endif

#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

double engine_time_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

const char *engine_device_name(engine_device d) {
    switch (d) {
    case ENGINE_DEVICE_AUTO: return "auto";
    case ENGINE_DEVICE_CPU: return "cpu";
    case ENGINE_DEVICE_CUDA: return "cuda";
    }
    return "?";
}

int engine_device_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "auto")) return ENGINE_DEVICE_AUTO;
    if (!strcmp(name, "cpu")) return ENGINE_DEVICE_CPU;
    if (!strcmp(name, "cuda")) return ENGINE_DEVICE_CUDA;
    return -1;
}

/* ---------------------------------------------------------------------------------------------
 * Tokenizer from GGUF metadata (tokenizer.ggml.*; the mapping is in tokenizer/tokenizer.h)
 * ------------------------------------------------------------------------------------------- */
static int opt_id(const engine_gguf *g, const char *key, int32_t n_tokens, int32_t *out) {
    if (!engine_gguf_find_key(g, key)) return 0;
    uint32_t v;
    int rc = engine_gguf_get_u32(g, key, &v);
    if (rc) return rc;
    if (v >= (uint32_t)n_tokens)
        return engine_err(ENGINE_EFORMAT, "%s: %s = %u is not a token id (vocabulary %d)",
                          engine_gguf_path(g), key, v, n_tokens);
    *out = (int32_t)v;
    return 0;
}

static int tokenizer_load(engine_tokenizer **out, const engine_gguf *g, uint32_t n_vocab_model) {
    const char *path = engine_gguf_path(g);
    engine_gguf_str model, pre = {"qwen2", 5};
    const engine_gguf_value *tokens, *types = NULL, *merges = NULL;
    int rc;
    if (!engine_gguf_find_key(g, "tokenizer.ggml.model"))
        return engine_err(ENGINE_EFORMAT, "%s: no tokenizer (missing key tokenizer.ggml.model)",
                          path);
    if ((rc = engine_gguf_get_str(g, "tokenizer.ggml.model", &model))) return rc;
    if (model.len != 4 || memcmp(model.ptr, "gpt2", 4) != 0)
        return engine_err(ENGINE_EUNSUPPORTED, "%s: tokenizer.ggml.model = \"%.*s\" is not "
                          "supported (only \"gpt2\" byte-level BPE)", path, (int)model.len,
                          model.ptr);
    if (engine_gguf_find_key(g, "tokenizer.ggml.pre") &&
        (rc = engine_gguf_get_str(g, "tokenizer.ggml.pre", &pre)))
        return rc;
    if ((rc = engine_gguf_get_arr(g, "tokenizer.ggml.tokens", ENGINE_GGUF_STRING, &tokens)))
        return rc;
    if (engine_gguf_find_key(g, "tokenizer.ggml.token_type") &&
        (rc = engine_gguf_get_arr(g, "tokenizer.ggml.token_type", -1, &types)))
        return rc;
    if (engine_gguf_find_key(g, "tokenizer.ggml.merges") &&
        (rc = engine_gguf_get_arr(g, "tokenizer.ggml.merges", ENGINE_GGUF_STRING, &merges)))
        return rc;
    uint64_t nt = tokens->arr.n, nm = merges ? merges->arr.n : 0;
    if (nt == 0 || nt > (1u << 24) || nm > (1u << 24))
        return engine_err(ENGINE_EFORMAT, "%s: tokenizer.ggml.tokens has %llu entries, merges "
                          "%llu (limits 1..2^24)", path, (unsigned long long)nt,
                          (unsigned long long)nm);
    if (types) {
        if (types->arr.n != nt)
            return engine_err(ENGINE_EFORMAT, "%s: tokenizer.ggml.token_type has %llu entries "
                              "but tokenizer.ggml.tokens %llu", path,
                              (unsigned long long)types->arr.n, (unsigned long long)nt);
        if (types->arr.type == ENGINE_GGUF_STRING || types->arr.type == ENGINE_GGUF_ARRAY ||
            types->arr.type == ENGINE_GGUF_FLOAT32 || types->arr.type == ENGINE_GGUF_FLOAT64)
            return engine_err(ENGINE_EFORMAT, "%s: tokenizer.ggml.token_type holds %s, not "
                              "integers", path, engine_gguf_type_name(types->arr.type));
    }
    engine_tokenizer_spec *spec = NULL;
    if ((rc = engine_tokenizer_spec_new(&spec, (int32_t)nt, (int32_t)nm))) return rc;
    if ((rc = engine_tokenizer_spec_set_string(&spec->pre, pre.ptr, pre.len))) goto done;
    for (uint64_t i = 0; i < nt; i++) {
        int64_t ty = types ? engine_gguf_arr_i64(types, i) : ENGINE_TOKEN_NORMAL;
        if (ty < 0 || ty > ENGINE_TOKEN_BYTE) {
            rc = engine_err(ENGINE_EFORMAT, "%s: tokenizer.ggml.token_type[%llu] = %lld is not "
                            "a token type", path, (unsigned long long)i, (long long)ty);
            goto done;
        }
        const engine_gguf_str *t = &tokens->arr.strs[i];
        rc = engine_tokenizer_spec_set_token(spec, (int32_t)i, t->ptr, t->len,
                                             (engine_token_type)ty);
        if (rc) {
            rc = engine_err(rc, "%s: tokenizer.ggml.tokens[%llu]: %s", path,
                            (unsigned long long)i, engine_error_last());
            goto done;
        }
    }
    for (uint64_t i = 0; i < nm; i++) {
        const engine_gguf_str *t = &merges->arr.strs[i];
        if ((rc = engine_tokenizer_spec_set_merge(spec, (int32_t)i, t->ptr, t->len))) {
            rc = engine_err(rc, "%s: tokenizer.ggml.merges[%llu]: %s", path,
                            (unsigned long long)i, engine_error_last());
            goto done;
        }
    }
    if ((rc = opt_id(g, "tokenizer.ggml.bos_token_id", (int32_t)nt, &spec->bos_id)) ||
        (rc = opt_id(g, "tokenizer.ggml.eos_token_id", (int32_t)nt, &spec->eos_id)) ||
        (rc = opt_id(g, "tokenizer.ggml.padding_token_id", (int32_t)nt, &spec->pad_id)))
        goto done;
    if (engine_gguf_find_key(g, "tokenizer.ggml.add_bos_token") &&
        (rc = engine_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &spec->add_bos)))
        goto done;
    if (engine_gguf_find_key(g, "tokenizer.ggml.add_eos_token") &&
        (rc = engine_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &spec->add_eos)))
        goto done;
    if (engine_gguf_find_key(g, "tokenizer.chat_template")) {
        engine_gguf_str ct;
        if ((rc = engine_gguf_get_str(g, "tokenizer.chat_template", &ct))) goto done;
        if ((rc = engine_tokenizer_spec_set_string(&spec->chat_template, ct.ptr, ct.len)))
            goto done;
    }
    if (n_vocab_model > nt && (rc = engine_tokenizer_spec_pad(spec, (int32_t)n_vocab_model)))
        goto done;
    rc = engine_tokenizer_new(out, spec);
    if (rc) rc = engine_err(rc, "%s: %s", path, engine_error_last());
done:
    engine_tokenizer_spec_free(spec);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Weights
 * ------------------------------------------------------------------------------------------- */
static engine_weight weight_of(const engine_gguf_tensor *t) {
    engine_weight w;
    w.data = t->data;
    w.type = t->type;
    w.cols = t->ne[0];
    w.rows = t->ne[1];
    w.n_mat = t->ne[2];
    w.row_bytes = engine_type_row_size(t->type, t->ne[0]);
    return w;
}

static int tensor_get(engine_model *m, engine_tensor_role role, int layer,
                      const engine_gguf_tensor **out) {
    char name[ENGINE_TENSOR_NAME_MAX];
    int rc = engine_tensor_name(name, sizeof name, role, layer);
    if (rc) return rc;
    *out = engine_gguf_find_tensor(m->gguf, name);
    if (!*out) return engine_err(ENGINE_EFORMAT, "%s: missing tensor %s", m->path, name);
    return 0;
}

static int load_matrix(engine_model *m, engine_tensor_role role, int layer, engine_weight *w) {
    const engine_gguf_tensor *t;
    int rc = tensor_get(m, role, layer, &t);
    if (rc) return rc;
    const engine_type_traits *tr = engine_type_traits_get(t->type);
    if (!tr || !tr->supported)
        return engine_err(ENGINE_EUNSUPPORTED, "%s: tensor %s has type %s, which the CPU "
                          "kernels do not support", m->path, t->name, engine_type_name(t->type));
    *w = weight_of(t);
    return 0;
}

/* Norm weights are used as F32 in place; files with F16/BF16 norms get a converted copy. */
static int load_norm(engine_model *m, engine_tensor_role role, int layer, const float **out) {
    const engine_gguf_tensor *t;
    int rc = tensor_get(m, role, layer, &t);
    if (rc) return rc;
    if (t->type == ENGINE_TYPE_F32 && ((uintptr_t)t->data % sizeof(float)) == 0) {
        *out = t->data;
        return 0;
    }
    float *buf = malloc(sizeof(float) * (size_t)t->n_elements);
    if (!buf) return engine_err(ENGINE_ENOMEM, "out of memory converting %s", t->name);
    if ((rc = engine_dequantize_row(t->type, t->data, buf, t->n_elements))) {
        free(buf);
        return engine_err(rc, "%s: tensor %s: %s", m->path, t->name, engine_error_last());
    }
    m->owned[m->n_owned++] = buf;
    *out = buf;
    return 0;
}

int engine_model_load_matrix(engine_model *m, engine_tensor_role role, int layer,
                             engine_weight *w) {
    return load_matrix(m, role, layer, w);
}

int engine_model_load_f32(engine_model *m, engine_tensor_role role, int layer,
                          const float **out) {
    return load_norm(m, role, layer, out);
}

int engine_model_load_head(engine_model *m) {
    int rc;
    if ((rc = load_matrix(m, ENGINE_TENSOR_TOKEN_EMBD, -1, &m->tok_embd)) ||
        (rc = load_norm(m, ENGINE_TENSOR_OUTPUT_NORM, -1, &m->output_norm)))
        return rc;
    if (m->hp.tied_embeddings)
        m->output = m->tok_embd;
    else if ((rc = load_matrix(m, ENGINE_TENSOR_OUTPUT, -1, &m->output)))
        return rc;
    return 0;
}

int engine_model_load_attn(engine_model *m, int L, const float **q_norm, const float **k_norm,
                           engine_weight *wq, engine_weight *wk, engine_weight *wv,
                           engine_weight *wo) {
    int rc;
    if ((rc = load_norm(m, ENGINE_TENSOR_ATTN_Q_NORM, L, q_norm)) ||
        (rc = load_norm(m, ENGINE_TENSOR_ATTN_K_NORM, L, k_norm)) ||
        (rc = load_matrix(m, ENGINE_TENSOR_ATTN_Q, L, wq)) ||
        (rc = load_matrix(m, ENGINE_TENSOR_ATTN_K, L, wk)) ||
        (rc = load_matrix(m, ENGINE_TENSOR_ATTN_V, L, wv)) ||
        (rc = load_matrix(m, ENGINE_TENSOR_ATTN_OUT, L, wo)))
        return rc;
    return 0;
}

int engine_model_load_experts(engine_model *m, int L, engine_weight *gate_inp,
                              engine_weight *gate_exps, engine_weight *up_exps,
                              engine_weight *down_exps) {
    int rc;
    if ((rc = load_matrix(m, ENGINE_TENSOR_FFN_GATE_INP, L, gate_inp)) ||
        (rc = load_matrix(m, ENGINE_TENSOR_FFN_GATE_EXPS, L, gate_exps)) ||
        (rc = load_matrix(m, ENGINE_TENSOR_FFN_UP_EXPS, L, up_exps)) ||
        (rc = load_matrix(m, ENGINE_TENSOR_FFN_DOWN_EXPS, L, down_exps)))
        return rc;
    return 0;
}

static int load_weights(engine_model *m) {
    const engine_hparams *hp = &m->hp;
    int rc;
    /* converted copies: 4 norms per block (qwen35moe: up to 7 small tensors) and the output's */
    size_t cap = ENGINE_Q35_OWNED_PER_LAYER * (size_t)hp->n_layer + 2;
    m->owned = calloc(cap, sizeof(float *));
    if (m->owned && hp->arch == ENGINE_ARCH_QWEN35MOE) return engine_q35_load(m);
    m->layers = calloc(hp->n_layer, sizeof *m->layers);
    m->rope_inv_freq = malloc(sizeof(float) * (hp->head_dim_k / 2));
    if (!m->owned || !m->layers || !m->rope_inv_freq)
        return engine_err(ENGINE_ENOMEM, "out of memory loading %s", m->path);
    engine_cpu_rope_inv_freq(m->rope_inv_freq, (int)hp->head_dim_k, hp->rope_theta);
    if ((rc = engine_model_load_head(m))) return rc;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        engine_layer *ly = &m->layers[l];
        int L = (int)l;
        if ((rc = load_norm(m, ENGINE_TENSOR_ATTN_NORM, L, &ly->attn_norm)) ||
            (rc = load_norm(m, ENGINE_TENSOR_FFN_NORM, L, &ly->ffn_norm)) ||
            (rc = engine_model_load_attn(m, L, &ly->q_norm, &ly->k_norm, &ly->wq, &ly->wk,
                                         &ly->wv, &ly->wo)))
            return rc;
        if (hp->arch == ENGINE_ARCH_QWEN3MOE) {
            if ((rc = engine_model_load_experts(m, L, &ly->gate_inp, &ly->gate_exps, &ly->up_exps,
                                                &ly->down_exps)))
                return rc;
        } else {
            if ((rc = load_matrix(m, ENGINE_TENSOR_FFN_GATE, L, &ly->ffn_gate)) ||
                (rc = load_matrix(m, ENGINE_TENSOR_FFN_UP, L, &ly->ffn_up)) ||
                (rc = load_matrix(m, ENGINE_TENSOR_FFN_DOWN, L, &ly->ffn_down)))
                return rc;
        }
    }
    return 0;
}

static void fill_info(engine_model *m) {
    engine_model_info *in = &m->info;
    const engine_hparams *hp = &m->hp;
    in->file_size = engine_gguf_file_size(m->gguf);
    engine_gguf_str s;
    if (engine_gguf_find_key(m->gguf, "general.name") &&
        engine_gguf_get_str(m->gguf, "general.name", &s) == 0)
        snprintf(in->name, sizeof in->name, "%.*s", (int)(s.len < 127 ? s.len : 127), s.ptr);
    uint64_t by_type[ENGINE_TYPE_COUNT] = {0};
    for (int64_t i = 0; i < engine_gguf_tensor_count(m->gguf); i++) {
        const engine_gguf_tensor *t = engine_gguf_tensor_at(m->gguf, i);
        in->weight_bytes += t->nbytes;
        if ((int)t->type >= 0 && t->type < ENGINE_TYPE_COUNT) by_type[t->type] += t->nbytes;
    }
    int best = 0;
    for (int t = 1; t < ENGINE_TYPE_COUNT; t++)
        if (by_type[t] > by_type[best]) best = t;
    snprintf(in->weight_type, sizeof in->weight_type, "%s", engine_type_name(best));
    if (in->vocab_only && hp->n_layer == 0) return;
    engine_model_info_dims(in, hp);
}

void engine_model_info_dims(engine_model_info *in, const engine_hparams *hp) {
    in->n_ctx_train = (int32_t)hp->n_ctx_train;
    in->n_layer = (int32_t)hp->n_layer;
    in->n_embd = (int32_t)hp->n_embd;
    in->n_head = (int32_t)hp->n_head;
    in->n_head_kv = (int32_t)hp->n_head_kv;
    in->head_dim = (int32_t)hp->head_dim_k;
    in->n_expert = (int32_t)hp->n_expert;
    in->n_expert_used = (int32_t)hp->n_expert_used;
    engine_arch_param_count(hp, &in->n_params, &in->n_params_active);
}

/* Can m's sessions keep their KV as type t? Q8_0 is CPU-only and needs whole blocks per head. */
static int kv_type_check(const engine_model *m, engine_kv_type t) {
    if (t != ENGINE_KV_Q8_0) return 0;
    if (m->info.device == ENGINE_DEVICE_CUDA)
        return engine_err(ENGINE_EUNSUPPORTED, "KV type q8_0 is not supported on the GPU yet "
                          "(use --kv f16, or --device cpu)");
    if (engine_cpu_kv_row_bytes(t, (int)m->hp.n_head_kv, (int)m->hp.head_dim_k) == 0)
        return engine_err(ENGINE_EUNSUPPORTED, "KV type q8_0 needs a head size that is a "
                          "multiple of 32 (%s has %u)", m->path, m->hp.head_dim_k);
    return 0;
}

int engine_model_load(engine_model **out, const char *path, const engine_model_params *params) {
    *out = NULL;
    engine_model_params p = ENGINE_MODEL_PARAMS_INIT;
    if (params) {
        if (params->version != ENGINE_MODEL_PARAMS_VERSION)
            return engine_err(ENGINE_EINVAL, "model params of version %d (this engine knows %d)",
                              params->version, ENGINE_MODEL_PARAMS_VERSION);
        p = *params;
    }
    if (!path || !*path) return engine_err(ENGINE_EINVAL, "no model file given");
    if (p.n_threads < 0 || p.n_threads > 1024 || p.n_ctx < 0)
        return engine_err(ENGINE_EINVAL, "threads %d or context %d out of range", p.n_threads,
                          p.n_ctx);
    if ((int)p.device < ENGINE_DEVICE_AUTO || p.device > ENGINE_DEVICE_CUDA)
        return engine_err(ENGINE_EINVAL, "unknown device %d", (int)p.device);
    if (p.kv_type != ENGINE_KV_F16 && p.kv_type != ENGINE_KV_F32 && p.kv_type != ENGINE_KV_Q8_0)
        return engine_err(ENGINE_EINVAL, "unknown KV cache type %d", (int)p.kv_type);
    if (p.device == ENGINE_DEVICE_CUDA && !p.vocab_only && !engine_cuda_built())
        return engine_err(ENGINE_ENODEV, "device cuda: this build has no CUDA backend (built "
                          "without nvcc); use --device cpu or auto");

    engine_model *m = calloc(1, sizeof *m);
    if (!m) return engine_err(ENGINE_ENOMEM, "out of memory loading %s", path);
    pthread_mutex_init(&m->pool_mu, NULL);
    int rc = 0;
    if (!(m->path = strdup(path))) {
        rc = engine_err(ENGINE_ENOMEM, "out of memory loading %s", path);
        goto fail;
    }
    struct stat sb;
    bool hf = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode); /* a Hugging Face checkpoint */
    if (hf) {
        if ((rc = engine_q35_hf_open(m, path, p.vocab_only))) goto fail;
    } else {
        if ((rc = engine_gguf_open(&m->gguf, path))) goto fail;
        engine_gguf_str arch;
        if ((rc = engine_gguf_get_str(m->gguf, "general.architecture", &arch))) goto fail;
        snprintf(m->info.arch, sizeof m->info.arch, "%.*s", (int)(arch.len < 31 ? arch.len : 31),
                 arch.ptr);
        m->info.vocab_only = p.vocab_only;
        rc = engine_hparams_read(&m->hp, m->gguf);
        if (rc && !p.vocab_only) goto fail;
        bool have_hp = rc == 0;
        if (!have_hp) memset(&m->hp, 0, sizeof m->hp); /* vocab-only load of another arch */
        if ((rc = tokenizer_load(&m->tok, m->gguf, have_hp ? m->hp.n_vocab : 0))) goto fail;
        int32_t nv = engine_tokenizer_n_vocab(m->tok);
        m->info.n_vocab = nv;
        if (have_hp && (int64_t)nv != (int64_t)m->hp.n_vocab && !p.vocab_only) {
            rc = engine_err(ENGINE_EFORMAT, "%s: the tokenizer has %d tokens but the model %u rows",
                            path, nv, m->hp.n_vocab);
            goto fail;
        }
        const char *ct = engine_tokenizer_chat_template(m->tok);
        if (ct && !(m->chat_template = strdup(ct))) {
            rc = engine_err(ENGINE_ENOMEM, "out of memory loading %s", path);
            goto fail;
        }
        fill_info(m);
    }
    if (!p.vocab_only) {
        if (!hf && ((rc = engine_arch_validate(&m->hp, m->gguf)) || (rc = load_weights(m))))
            goto fail;
        int nt = p.n_threads > 0 ? p.n_threads : engine_cpu_count();
        if ((rc = engine_pool_new(&m->pool, nt))) goto fail;
        m->info.n_threads = nt;
        int32_t train = (int32_t)m->hp.n_ctx_train;
        if (p.n_ctx > train) {
            rc = engine_err(ENGINE_ERANGE, "context %d exceeds %s's trained context of %d "
                            "tokens", p.n_ctx, path, train);
            goto fail;
        }
        m->info.n_ctx = p.n_ctx > 0 ? p.n_ctx : (train < 4096 ? train : 4096);
    }
    m->info.device = ENGINE_DEVICE_CPU;
#ifdef SPARK_HAVE_CUDA
    if (!p.vocab_only && p.device != ENGINE_DEVICE_CPU) {
        /* the GPU when asked for or usable; asking for it and not getting it is an error,
         * auto falls back to the CPU loudly */
        int crc = engine_cuda_usable();
        if (crc == 0)
            crc = m->q35 ? engine_cuda_q35_model_new((engine_cuda_q35_model **)&m->cuda, m, 0)
                         : engine_cuda_model_new((engine_cuda_model **)&m->cuda, m, 0);
        if (crc == 0) {
            m->info.device = ENGINE_DEVICE_CUDA;
        } else if (p.device == ENGINE_DEVICE_CUDA) {
            char why[512];
            snprintf(why, sizeof why, "%s", engine_error_last());
            rc = engine_err(crc, "device cuda: %s", why);
            goto fail;
        } else {
            engine_log(ENGINE_LOG_WARN, "running on the CPU: %s", engine_error_last());
        }
    }
#endif
    m->kv_type = p.kv_type;
    if (!p.vocab_only && (rc = kv_type_check(m, p.kv_type))) goto fail;
    if (p.prefix_cache_bytes && !p.vocab_only) {
        /* qwen35moe too: attention KV in the pool, recurrent-state snapshots in the tree */
        if (m->info.device == ENGINE_DEVICE_CPU) {
            if ((rc = engine_kv_model_enable(m, p.prefix_cache_bytes, p.kv_type))) goto fail;
        } else {
            engine_log(ENGINE_LOG_WARN, "the prefix cache is not available on the GPU yet: "
                                        "sessions compute their whole prompt");
        }
    }
    *out = m;
    return 0;
fail:
    engine_model_free(m);
    return rc;
}

void engine_model_free(engine_model *m) {
    if (!m) return;
    ENGINE_ASSERT(m->n_sessions == 0);
#ifdef SPARK_HAVE_CUDA
    if (m->q35)
        engine_cuda_q35_model_free(m->cuda);
    else
        engine_cuda_model_free(m->cuda);
#endif
    engine_kv_cache_free(m->kvc);
    engine_pool_free(m->pool);
    engine_q35_model_free(m->q35);
    for (size_t i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    free(m->rope_inv_freq);
    engine_tokenizer_free(m->tok);
    engine_gguf_close(m->gguf);
    free(m->chat_template);
    free(m->path);
    pthread_mutex_destroy(&m->pool_mu);
    free(m);
}

void engine_model_info_get(const engine_model *m, engine_model_info *out) {
    *out = m->info;
}

/* ---------------------------------------------------------------------------------------------
 * Tokens
 * ------------------------------------------------------------------------------------------- */
int engine_model_tokenize(const engine_model *m, const char *text, size_t len, bool parse_special,
                          int32_t *ids, size_t cap, size_t *n_out) {
    int rc = engine_tokenizer_encode(m->tok, text, len, parse_special, ids, cap, n_out);
    if (rc == ENGINE_ERANGE)
        return engine_err(ENGINE_ERANGE, "%zu tokens do not fit a buffer of %zu", *n_out, cap);
    return rc;
}

const char *engine_model_token_bytes(const engine_model *m, int32_t id, size_t *len) {
    return engine_tokenizer_token_bytes(m->tok, id, len);
}

int engine_model_detokenize(const engine_model *m, const int32_t *ids, size_t n, char *buf,
                            size_t cap, size_t *len_out) {
    size_t total = 0;
    int32_t nv = engine_tokenizer_n_vocab(m->tok);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= nv)
            return engine_err(ENGINE_EINVAL, "token id %d at %zu is not in [0, %d)", ids[i], i,
                              nv);
        size_t l;
        const char *b = engine_tokenizer_token_bytes(m->tok, ids[i], &l);
        if (total + l <= cap) memcpy(buf + total, b, l);
        total += l;
    }
    *len_out = total;
    if (total >= cap) {
        if (total > cap)
            return engine_err(ENGINE_ERANGE, "the text needs %zu bytes, the buffer has %zu", total,
                              cap);
        return 0; /* fits exactly, without the NUL */
    }
    buf[total] = 0;
    return 0;
}

int32_t engine_model_n_vocab(const engine_model *m) {
    return engine_tokenizer_n_vocab(m->tok);
}

int32_t engine_model_token_bos(const engine_model *m) {
    return engine_tokenizer_bos(m->tok);
}

int32_t engine_model_token_eos(const engine_model *m) {
    return engine_tokenizer_eos(m->tok);
}

bool engine_model_token_is_eog(const engine_model *m, int32_t id) {
    return engine_tokenizer_is_eog(m->tok, id);
}

bool engine_model_token_is_special(const engine_model *m, int32_t id) {
    return engine_tokenizer_is_special(m->tok, id);
}

const char *engine_model_chat_template(const engine_model *m) {
    return m->chat_template;
}

/* ---------------------------------------------------------------------------------------------
 * Sessions
 * ------------------------------------------------------------------------------------------- */
int engine_session_new(engine_session **out, engine_model *m, const engine_session_params *p) {
    *out = NULL;
    engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
    if (p) {
        if (p->version != ENGINE_SESSION_PARAMS_VERSION)
            return engine_err(ENGINE_EINVAL, "session params of version %d (this engine knows "
                              "%d)", p->version, ENGINE_SESSION_PARAMS_VERSION);
        sp = *p;
    }
    if (m->info.vocab_only)
        return engine_err(ENGINE_EINVAL, "%s was loaded for its vocabulary only: no sessions",
                          m->path);
    int32_t train = (int32_t)m->hp.n_ctx_train;
    if (sp.n_ctx == 0) sp.n_ctx = m->info.n_ctx;
    if (sp.n_ctx < 1 || sp.n_ctx > train)
        return engine_err(ENGINE_ERANGE, "session context %d is not in [1, %d] (the model's "
                          "trained context)", sp.n_ctx, train);
    if (sp.n_batch == 0) sp.n_batch = 64;
    if (sp.n_batch < 1 || sp.n_batch > 8192)
        return engine_err(ENGINE_EINVAL, "batch size %d is not in [1, 8192]", sp.n_batch);
    if (sp.n_batch > sp.n_ctx) sp.n_batch = sp.n_ctx;
    if (sp.kv_type == ENGINE_KV_DEFAULT) sp.kv_type = m->kv_type;
    if (sp.kv_type != ENGINE_KV_F16 && sp.kv_type != ENGINE_KV_F32 &&
        sp.kv_type != ENGINE_KV_Q8_0)
        return engine_err(ENGINE_EINVAL, "unknown KV cache type %d", (int)sp.kv_type);
    int krc = kv_type_check(m, sp.kv_type);
    if (krc) return krc;
    engine_session *s = calloc(1, sizeof *s);
    if (!s) return engine_err(ENGINE_ENOMEM, "out of memory for a session");
    s->m = m;
    s->n_ctx = sp.n_ctx;
    s->n_batch = sp.n_batch;
    s->kv_type = sp.kv_type;
    s->tokens = malloc(sizeof(int32_t) * (size_t)sp.n_ctx);
    /* whole pages: on the GPU they are page-locked, so each token's logits copy straight in */
    const size_t lb = (sizeof(float) * m->hp.n_vocab + 4095) & ~(size_t)4095;
    if (posix_memalign((void **)&s->logits, 4096, lb)) s->logits = NULL;
    if (!s->tokens || !s->logits) {
        free(s->tokens);
        free(s->logits);
        free(s);
        return engine_err(ENGINE_ENOMEM, "out of memory for a session");
    }
#ifdef SPARK_HAVE_CUDA
    int rc = 0;
    if (m->cuda && m->q35) /* KV, conv and recurrent state on the GPU */
        rc = engine_cuda_q35_session_new((engine_cuda_q35_session **)&s->cuda, m->cuda,
                                         sp.n_ctx, sp.kv_type);
    else if (m->cuda) /* KV on the GPU, contiguous (stage 1): no paged pool, no prefix cache */
        rc = engine_cuda_session_new((engine_cuda_session **)&s->cuda, m->cuda, sp.n_ctx,
                                     sp.kv_type);
    else if ((rc = engine_kv_session_init(s)) == 0)
        rc = m->q35 ? engine_q35_fwd_new(s) : engine_fwd_new(s);
    if (rc == 0 && m->cuda && !m->q35) { /* prompts through the tensor-core prefill */
        rc = engine_cuda_prefill_new((engine_cuda_prefill **)&s->cuda_pf, m->cuda, s->cuda,
                                     ENGINE_MIN(sp.n_ctx, engine_cuda_prefill_chunk()));
        if (rc) engine_cuda_session_free(s->cuda);
    }
    if (rc == 0 && m->cuda && m->q35) { /* prompts through the qwen35moe prefill (or, with
                                         * none for the shapes, the decode step) */
        rc = engine_cuda_q35_prefill_new((engine_cuda_q35_prefill **)&s->cuda_pf, s->cuda, 0);
        if (rc) engine_cuda_q35_session_free(s->cuda);
    }
    if (rc == 0 && m->cuda) { /* unpinned, the copies still work (the driver stages them) */
        s->logits_pinned = engine_cuda_host_pin(s->logits, lb) == 0;
        const char *e = getenv("SPARK_CUDA_GEN_LOOP"), *f = getenv("SPARK_CUDA_GEN_FREE");
        s->gen_loop = !(e && e[0] == '0');
        s->gen_free = !(f && f[0] == '0'); /* on by default since session 31 (model_int.h) */
    }
#else
    int rc = engine_kv_session_init(s);
    if (rc == 0) rc = m->q35 ? engine_q35_fwd_new(s) : engine_fwd_new(s);
#endif
    if (rc) {
        engine_kv_seq_deinit(m->kvc, &s->kvs);
        free(s->tokens);
        free(s->logits);
        free(s);
        return rc;
    }
    pthread_mutex_lock(&m->pool_mu);
    m->n_sessions++;
    pthread_mutex_unlock(&m->pool_mu);
    *out = s;
    return 0;
}

void engine_session_free(engine_session *s) {
    if (!s) return;
    pthread_mutex_lock(&s->m->pool_mu);
    s->m->n_sessions--;
    engine_kv_session_deinit(s);
    pthread_mutex_unlock(&s->m->pool_mu);
    engine_fwd_free(s->fwd);
    engine_q35_fwd_free(s->q35);
#ifdef SPARK_HAVE_CUDA
    if (s->m->q35)
        engine_cuda_q35_prefill_free(s->cuda_pf);
    else
        engine_cuda_prefill_free(s->cuda_pf);
    if (s->m->q35)
        engine_cuda_q35_session_free(s->cuda);
    else
        engine_cuda_session_free(s->cuda);
    if (s->logits_pinned) engine_cuda_host_unpin(s->logits);
#endif
    free(s->tokens);
    free(s->logits);
    free(s);
}

int32_t engine_session_n_ctx(const engine_session *s) {
    return s->n_ctx;
}

int32_t engine_session_n_tokens(const engine_session *s) {
    return s->n_tokens;
}

const int32_t *engine_session_tokens(const engine_session *s) {
    return s->tokens;
}

bool engine_session_gpu_draws(const engine_session *s, const engine_sampling_params *p) {
#ifdef SPARK_HAVE_CUDA
    /* a grammar: only through its free stretches, where its mask is one mask (free_mask) */
    const bool grammar_ok = p->free_mask && p->mask && s->gen_free;
    if (!s->cuda || s->m->q35 || !s->gen_loop || ((p->mask || p->accept) && !grammar_ok) ||
        p->n_logit_bias || p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f ||
        p->frequency_penalty != 0.0f)
        return false;
    const engine_cuda_sampling cs = {p->temperature, p->top_k, p->top_p, p->min_p, p->seed, NULL};
    return engine_cuda_stream_ok(s->cuda, &cs);
#else
    (void)s;
    (void)p;
    return false;
#endif
}

#ifdef SPARK_HAVE_CUDA
typedef struct {
    engine_session *s;
    int32_t prev; /* the token the step that drew the next one consumed */
    int (*cb)(void *, int32_t);
    void *user;
} gpu_gen;

static int gpu_gen_token(void *user, int32_t t) {
    gpu_gen *g = user;
    g->s->tokens[g->s->n_tokens++] = g->prev;
    g->prev = t;
    return g->cb(g->user, t);
}
#endif

int engine_session_gpu_generate(engine_session *s, int32_t token, int32_t n_max,
                                const engine_sampling_params *p, const uint32_t *allow,
                                int (*cb)(void *, int32_t), void *user) {
#ifdef SPARK_HAVE_CUDA
    if (!engine_session_gpu_draws(s, p))
        return engine_err(ENGINE_EUNSUPPORTED, "generate: this session or sampling is not drawn "
                                               "on the GPU");
    if (n_max < 1 || n_max > s->n_ctx - s->n_tokens)
        return engine_err(ENGINE_ERANGE,
                          "generate: %d steps from position %d do not fit the "
                          "context of %d",
                          n_max, s->n_tokens, s->n_ctx);
    if ((p->mask != NULL) != (allow != NULL))
        return engine_err(ENGINE_EINVAL, "generate: a grammar's mask goes with its allowed bits");
    const engine_cuda_sampling cs = {p->temperature, p->top_k, p->top_p, p->min_p, p->seed, allow};
    gpu_gen g = {s, token, cb, user};
    int32_t n_steps = 0;
    pthread_mutex_lock(&s->m->pool_mu);
    s->logits_valid = false; /* the last step's logits stay on the GPU */
    s->kv_cached = 0;
    s->kv_diverged_at = -1;
    int rc =
        engine_cuda_stream(s->cuda, token, s->n_tokens, n_max, &cs, gpu_gen_token, &g, &n_steps);
    pthread_mutex_unlock(&s->m->pool_mu);
    return rc;
#else
    (void)s;
    (void)token;
    (void)n_max;
    (void)p;
    (void)allow;
    (void)cb;
    (void)user;
    return engine_err(ENGINE_EUNSUPPORTED, "generate: this build has no CUDA backend");
#endif
}

const float *engine_session_logits(const engine_session *s) {
    return s->logits_valid ? s->logits : NULL;
}

int engine_session_truncate(engine_session *s, int32_t n) {
    if (n < 0 || n > s->n_tokens)
        return engine_err(ENGINE_EINVAL, "cannot truncate a session of %d tokens to %d",
                          s->n_tokens, n);
    if (s->q35) {
        int rc = engine_q35_fwd_truncate(s->q35, s->n_tokens, n);
        if (rc) return rc;
    }
#ifdef SPARK_HAVE_CUDA
    if (s->cuda && s->m->q35) { /* the recurrent state from a snapshot on the device */
        pthread_mutex_lock(&s->m->pool_mu);
        int rc = engine_cuda_q35_truncate(s->cuda, s->tokens, s->n_tokens, n);
        pthread_mutex_unlock(&s->m->pool_mu);
        if (rc) return rc;
    }
#endif
    if (n < s->n_tokens) s->logits_valid = false;
    pthread_mutex_lock(&s->m->pool_mu);
    engine_kv_session_truncate(s, n);
    pthread_mutex_unlock(&s->m->pool_mu);
    s->n_tokens = n;
    return 0;
}

int engine_session_append(engine_session *s, const int32_t *tokens, size_t n, float *logits_all) {
    if (n == 0) return 0;
    if (!tokens) return engine_err(ENGINE_EINVAL, "no tokens given");
    if (n > (size_t)(s->n_ctx - s->n_tokens))
        return engine_err(ENGINE_ERANGE, "%zu tokens do not fit the context: %d of %d positions "
                          "are used", n, s->n_tokens, s->n_ctx);
    int32_t nv = (int32_t)s->m->hp.n_vocab;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= nv)
            return engine_err(ENGINE_EINVAL, "token id %d at %zu is not in [0, %d)", tokens[i], i,
                              nv);
    pthread_mutex_lock(&s->m->pool_mu);
    int rc = 0;
#ifdef SPARK_HAVE_CUDA
    if (s->cuda && s->m->q35 && engine_cuda_q35_mtp_on(s->cuda)) {
        /* MTP on: verify passes of up to ENGINE_CUDA_Q35_VMAX tokens that also feed the MTP
         * block (engine/cuda/q35_mtp_host.cuh) */
        rc = engine_cuda_q35_append(s->cuda, tokens, (int32_t)n, s->n_tokens, logits_all,
                                    s->logits);
        if (rc == 0) {
            memcpy(s->tokens + s->n_tokens, tokens, sizeof(int32_t) * n);
            s->n_tokens += (int32_t)n;
        }
        s->logits_valid = rc == 0;
        s->kv_cached = 0;
        s->kv_diverged_at = -1;
        pthread_mutex_unlock(&s->m->pool_mu);
        return rc;
    }
    if (s->cuda) {
        if (s->cuda_pf && n > 1 && !logits_all) {
            /* a prompt: chunks through the tensor-core prefill (engine/cuda/prefill.cu); with
             * logits_all each token goes through the decode step (its logits bit for bit) */
            rc = s->m->q35 ? engine_cuda_q35_prefill_run(s->cuda_pf, tokens, (int32_t)n,
                                                         s->n_tokens, s->logits)
                           : engine_cuda_prefill_run(s->cuda_pf, tokens, (int32_t)n,
                                                     s->n_tokens, NULL, s->logits);
            if (rc == 0) {
                memcpy(s->tokens + s->n_tokens, tokens, sizeof(int32_t) * n);
                s->n_tokens += (int32_t)n;
            }
            s->logits_valid = rc == 0;
            s->kv_cached = 0;
            s->kv_diverged_at = -1;
            pthread_mutex_unlock(&s->m->pool_mu);
            return rc;
        }
        /* CUDA stage 1: every token through the captured decode step (no prefix cache) */
        for (size_t i = 0; i < n && rc == 0; i++) {
            float *dst = logits_all ? logits_all + i * (size_t)nv : i + 1 == n ? s->logits : NULL;
            rc = s->m->q35 ? engine_cuda_q35_decode(s->cuda, tokens[i], s->n_tokens, dst, NULL)
                           : engine_cuda_decode(s->cuda, tokens[i], s->n_tokens, dst, NULL);
            if (rc == 0) s->tokens[s->n_tokens++] = tokens[i];
        }
        if (rc == 0) {
            if (logits_all)
                memcpy(s->logits, logits_all + (n - 1) * (size_t)nv, sizeof(float) * (size_t)nv);
            s->logits_valid = true;
        } else {
            s->logits_valid = false;
        }
        s->kv_cached = 0;
        s->kv_diverged_at = -1;
        pthread_mutex_unlock(&s->m->pool_mu);
        return rc;
    }
#endif
    size_t i0 = 0;
    s->kv_cached = 0;
    s->kv_diverged_at = -1;
    if (!logits_all) { /* a prefix served from the cache has no per-token logits */
        i0 = (size_t)engine_kv_session_attach(s, tokens, (int32_t)n);
        if (i0 > 0) { /* only an empty session attaches */
            memcpy(s->tokens, tokens, sizeof(int32_t) * i0);
            s->n_tokens = (int32_t)i0;
            s->kv_cached = (int32_t)i0;
        }
    }
    for (size_t i = i0; i < n && rc == 0; i += (size_t)s->n_batch) {
        int32_t chunk = (int32_t)ENGINE_MIN((size_t)s->n_batch, n - i);
        rc = engine_kv_session_reserve(s, s->n_tokens + chunk);
        if (rc == 0)
            rc = (s->q35 ? engine_q35_fwd_run : engine_fwd_run)(
                s, tokens + i, chunk, logits_all ? logits_all + i * (size_t)nv : NULL);
        if (rc == 0) {
            memcpy(s->tokens + s->n_tokens, tokens + i, sizeof(int32_t) * (size_t)chunk);
            s->n_tokens += chunk;
            s->logits_valid = true;
        }
    }
    engine_kv_session_commit(s);
    /* a prompt's end (hybrid models; not a speculative verify pass, which wants logits_all) */
    if (n > 1 && !logits_all) engine_kv_session_snapshot(s);
    pthread_mutex_unlock(&s->m->pool_mu);
    return rc;
}
