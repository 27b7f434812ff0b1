/* spark-agent model info FILE|DIR [--json]: what a GGUF model file, or a Hugging Face
 * checkpoint directory (config.json + safetensors, as `model gen --safetensors` writes), holds -
 * architecture, parameter counts (total, and active per token for mixture-of-experts models),
 * tensor types, file size, tokenizer and chat template. Reads only headers and the small JSON
 * files: nothing of the weights is paged in. */
#include "cli.h"

#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cpu/quant.h"
#include "engine.h"
#include "model/gguf.h"
#include "model/safetensors.h"
#include "tokenizer/json.h"

static void info_usage(FILE *f) {
    fprintf(f, "usage: spark-agent model info FILE|DIR [--json]\n\n"
               "Describe a GGUF model file or a Hugging Face checkpoint directory (config.json +\n"
               "safetensors): architecture, parameters (total and active per token), tensor\n"
               "types, file size, tokenizer and chat template.\n\n"
               "  --json    one JSON object on stdout instead of text\n");
}

typedef struct {
    int64_t tensors;
    uint64_t params, bytes;
} type_stat;

typedef struct {
    engine_gguf_str arch, name, tok_model;
    uint64_t total, active, expert_params, file_size;
    uint32_t expert_count, expert_used;
    bool has_experts_kv, has_template;
    int64_t vocab; /* -1: no token list */
    int64_t n_tensors;
    uint64_t ctx_len, n_layers, n_embd; /* 0: absent */
    type_stat types[ENGINE_TYPE_COUNT];
} model_facts;

/* "<arch>.<suffix>" as an unsigned integer, 0 when absent or not an integer. */
static uint64_t arch_u64(const engine_gguf *g, engine_gguf_str arch, const char *suffix) {
    char key[256];
    snprintf(key, sizeof key, "%.*s.%s", (int)(arch.len < 128 ? arch.len : 128), arch.ptr, suffix);
    uint64_t v = 0;
    return engine_gguf_find_key(g, key) && engine_gguf_get_u64(g, key, &v) == 0 ? v : 0;
}

static void gather(const engine_gguf *g, model_facts *f) {
    memset(f, 0, sizeof *f);
    f->file_size = engine_gguf_file_size(g);
    engine_gguf_get_str(g, "general.architecture", &f->arch);
    if (engine_gguf_find_key(g, "general.name")) engine_gguf_get_str(g, "general.name", &f->name);
    if (engine_gguf_find_key(g, "tokenizer.ggml.model"))
        engine_gguf_get_str(g, "tokenizer.ggml.model", &f->tok_model);
    const engine_gguf_value *toks;
    f->vocab = engine_gguf_find_key(g, "tokenizer.ggml.tokens") &&
                       engine_gguf_get_arr(g, "tokenizer.ggml.tokens", -1, &toks) == 0
                   ? (int64_t)toks->arr.n
                   : -1;
    const engine_gguf_kv *tmpl = engine_gguf_find_key(g, "tokenizer.chat_template");
    f->has_template = tmpl && tmpl->value.type == ENGINE_GGUF_STRING && tmpl->value.str.len > 0;
    f->expert_count = (uint32_t)arch_u64(g, f->arch, "expert_count");
    f->expert_used = (uint32_t)arch_u64(g, f->arch, "expert_used_count");
    f->has_experts_kv =
        f->expert_count > 0 && f->expert_used > 0 && f->expert_used <= f->expert_count;
    f->ctx_len = arch_u64(g, f->arch, "context_length");
    f->n_layers = arch_u64(g, f->arch, "block_count");
    f->n_embd = arch_u64(g, f->arch, "embedding_length");
    f->n_tensors = engine_gguf_tensor_count(g);
    uint64_t dense = 0;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        const engine_gguf_tensor *t = engine_gguf_tensor_at(g, i);
        const uint64_t n = (uint64_t)t->n_elements;
        f->total += n;
        /* Routed expert weights (ffn_gate_exps, ffn_up_exps, ffn_down_exps, ...): only
         * expert_used_count of expert_count experts run for a token. */
        if (strstr(t->name, "_exps."))
            f->expert_params += n;
        else
            dense += n;
        type_stat *ts = &f->types[t->type];
        ts->tensors++;
        ts->params += n;
        ts->bytes += t->nbytes;
    }
    f->active = dense;
    if (f->expert_params) {
        /* Without a usable expert count every expert is counted as active. */
        f->active +=
            f->has_experts_kv
                ? (uint64_t)((long double)f->expert_params * f->expert_used / f->expert_count)
                : f->expert_params;
    }
}

/* A JSON string literal of bytes that may not be valid UTF-8 (invalid bytes become U+FFFD). */
static void json_str(FILE *out, const char *s, size_t n) {
    fputc('"', out);
    for (size_t i = 0; i < n;) {
        const unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            fprintf(out, "\\%c", c);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            fprintf(out, "\\u%04x", c);
            i++;
        } else if (c < 0x80) {
            fputc(c, out);
            i++;
        } else {
            /* Length of a well-formed sequence (no overlongs, surrogates or > U+10FFFF). */
            size_t len = c >= 0xc2 && c <= 0xdf   ? 2
                         : c >= 0xe0 && c <= 0xef ? 3
                         : c >= 0xf0 && c <= 0xf4 ? 4
                                                  : 0;
            bool ok = len && i + len <= n;
            for (size_t k = 1; ok && k < len; k++)
                ok = ((unsigned char)s[i + k] & 0xc0) == 0x80;
            if (ok && len >= 3) {
                const unsigned char c1 = (unsigned char)s[i + 1];
                if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 >= 0xa0) ||
                    (c == 0xf0 && c1 < 0x90) || (c == 0xf4 && c1 >= 0x90))
                    ok = false;
            }
            if (ok) {
                fwrite(s + i, 1, len, out);
                i += len;
            } else {
                fputs("\\ufffd", out);
                i++;
            }
        }
    }
    fputc('"', out);
}

/* 30532122624 -> "30.53 B" */
static const char *human_count(uint64_t n, char *buf, size_t cap) {
    if (n >= 1000000000ull)
        snprintf(buf, cap, "%.2f B", (double)n / 1e9);
    else if (n >= 1000000ull)
        snprintf(buf, cap, "%.2f M", (double)n / 1e6);
    else if (n >= 1000ull)
        snprintf(buf, cap, "%.2f K", (double)n / 1e3);
    else
        snprintf(buf, cap, "%llu", (unsigned long long)n);
    return buf;
}

static const char *human_bytes(uint64_t n, char *buf, size_t cap) {
    if (n >= (1ull << 30))
        snprintf(buf, cap, "%.2f GiB", (double)n / (double)(1ull << 30));
    else if (n >= (1ull << 20))
        snprintf(buf, cap, "%.2f MiB", (double)n / (double)(1ull << 20));
    else if (n >= 1024)
        snprintf(buf, cap, "%.2f KiB", (double)n / 1024.0);
    else
        snprintf(buf, cap, "%llu bytes", (unsigned long long)n);
    return buf;
}

static void print_json(const engine_gguf *g, const char *path, const model_facts *f) {
    FILE *o = stdout;
    fprintf(o, "{\"file\":");
    json_str(o, path, strlen(path));
    fprintf(o, ",\"file_size\":%llu,\"gguf_version\":%u,\"architecture\":",
            (unsigned long long)f->file_size, engine_gguf_version(g));
    json_str(o, f->arch.ptr, f->arch.len);
    fprintf(o, ",\"name\":");
    if (f->name.ptr)
        json_str(o, f->name.ptr, f->name.len);
    else
        fprintf(o, "null");
    fprintf(o, ",\"parameters\":{\"total\":%llu,\"active\":%llu,\"experts\":%llu}",
            (unsigned long long)f->total, (unsigned long long)f->active,
            (unsigned long long)f->expert_params);
    if (f->expert_count || f->expert_used)
        fprintf(o, ",\"expert_count\":%u,\"expert_used_count\":%u", f->expert_count,
                f->expert_used);
    else
        fprintf(o, ",\"expert_count\":null,\"expert_used_count\":null");
    fprintf(o, ",\"context_length\":%llu,\"block_count\":%llu,\"embedding_length\":%llu",
            (unsigned long long)f->ctx_len, (unsigned long long)f->n_layers,
            (unsigned long long)f->n_embd);
    fprintf(o, ",\"tensor_count\":%lld,\"tensor_types\":{", (long long)f->n_tensors);
    bool first = true;
    for (int t = 0; t < ENGINE_TYPE_COUNT; t++) {
        if (!f->types[t].tensors) continue;
        fprintf(o, "%s\"%s\":{\"tensors\":%lld,\"parameters\":%llu,\"bytes\":%llu}",
                first ? "" : ",", engine_type_name(t), (long long)f->types[t].tensors,
                (unsigned long long)f->types[t].params, (unsigned long long)f->types[t].bytes);
        first = false;
    }
    fprintf(o, "},\"tokenizer\":{\"model\":");
    if (f->tok_model.ptr)
        json_str(o, f->tok_model.ptr, f->tok_model.len);
    else
        fprintf(o, "null");
    if (f->vocab >= 0)
        fprintf(o, ",\"vocab_size\":%lld}", (long long)f->vocab);
    else
        fprintf(o, ",\"vocab_size\":null}");
    fprintf(o, ",\"chat_template\":%s}\n", f->has_template ? "true" : "false");
}

static void print_text(const engine_gguf *g, const char *path, const model_facts *f) {
    char a[32], b[32];
    printf("file:            %s\n", path);
    printf("size:            %s (%llu bytes), GGUF v%u\n", human_bytes(f->file_size, a, sizeof a),
           (unsigned long long)f->file_size, engine_gguf_version(g));
    printf("architecture:    %.*s\n", (int)f->arch.len, f->arch.ptr);
    if (f->name.ptr) printf("name:            %.*s\n", (int)f->name.len, f->name.ptr);
    if (f->n_layers) printf("layers:          %llu\n", (unsigned long long)f->n_layers);
    if (f->n_embd) printf("embedding:       %llu\n", (unsigned long long)f->n_embd);
    if (f->ctx_len) printf("context length:  %llu\n", (unsigned long long)f->ctx_len);
    printf("parameters:      %s total (%llu)\n", human_count(f->total, a, sizeof a),
           (unsigned long long)f->total);
    if (f->expert_params) {
        printf("active/token:    %s (%llu)", human_count(f->active, b, sizeof b),
               (unsigned long long)f->active);
        if (f->has_experts_kv)
            printf(", %u of %u experts used\n", f->expert_used, f->expert_count);
        else
            printf(", expert counts missing: every expert counted\n");
    } else {
        printf("active/token:    all (dense model)\n");
    }
    printf("tensors:         %lld\n", (long long)f->n_tensors);
    for (int t = 0; t < ENGINE_TYPE_COUNT; t++) {
        if (!f->types[t].tensors) continue;
        const engine_type_traits *tr = engine_type_traits_get(t);
        printf("  %-8s %6lld tensors  %12s params  %12s%s\n", engine_type_name(t),
               (long long)f->types[t].tensors, human_count(f->types[t].params, a, sizeof a),
               human_bytes(f->types[t].bytes, b, sizeof b),
               tr && tr->supported ? "" : "  (not supported by the CPU kernels)");
    }
    if (f->tok_model.ptr || f->vocab >= 0) {
        printf("tokenizer:       %.*s", f->tok_model.ptr ? (int)f->tok_model.len : 7,
               f->tok_model.ptr ? f->tok_model.ptr : "unknown");
        if (f->vocab >= 0) printf(", vocabulary %lld tokens", (long long)f->vocab);
        printf("\n");
    } else {
        printf("tokenizer:       none\n");
    }
    printf("chat template:   %s\n", f->has_template ? "present" : "absent");
}

/* ---- Hugging Face checkpoint directories ------------------------------------------------ */

#define HF_TYPES 16

typedef struct {
    char dtype[16];
    int64_t tensors;
    uint64_t params, bytes;
} hf_type_stat;

typedef struct {
    const char *model_type, *hf_arch, *dtype, *tok_model; /* borrowed from the JSON docs */
    uint64_t total, active, expert_params, file_size;
    int64_t expert_count, expert_used, ctx_len, n_layers, n_embd, vocab; /* -1: absent */
    int64_t tok_vocab, tok_added; /* tokenizer.json: -1 when absent */
    int64_t n_tensors, n_files;
    bool has_template, loadable;
    hf_type_stat types[HF_TYPES];
    int n_types;
} hf_facts;

/* An integer member of obj (else of the root), -1 when absent. */
static int64_t hf_int(const engine_json *doc, const engine_json_node *obj, const char *key) {
    const engine_json_node *n = engine_json_get(doc, obj, key);
    if (!n) n = engine_json_get(doc, &doc->nodes[0], key);
    return n && n->type == ENGINE_JSON_NUMBER && n->is_int && n->ival >= 0 ? n->ival : -1;
}

static const char *hf_str(const engine_json *doc, const engine_json_node *obj, const char *key) {
    const engine_json_node *n = engine_json_get(doc, obj, key);
    if (!n) n = engine_json_get(doc, &doc->nodes[0], key);
    return n && n->type == ENGINE_JSON_STRING ? engine_json_str(doc, n) : NULL;
}

/* dir/name parsed into doc; 1 when the file does not exist, 0, or a negative ENGINE_E*. */
static int hf_json(engine_json *doc, const char *dir, const char *name) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    memset(doc, 0, sizeof *doc);
    struct stat sb;
    if (stat(path, &sb) != 0) return 1;
    size_t len = 0;
    char *text = engine_st_read_text(path, &len);
    if (!text) {
        cli_errorf("model info", "%s: cannot read it", path);
        return ENGINE_EIO;
    }
    int rc = engine_json_parse(doc, text, len, path);
    free(text);
    if (rc) cli_errorf("model info", "%s", engine_error_last());
    return rc;
}

static void hf_tensors(const engine_st *st, hf_facts *f) {
    uint64_t dense = 0;
    f->n_tensors = engine_st_count(st);
    for (int64_t i = 0; i < f->n_tensors; i++) {
        const engine_st_tensor *t = engine_st_at(st, i);
        const uint64_t n = (uint64_t)t->n_elements;
        f->total += n;
        /* routed experts: "mlp.experts.E.gate_proj.weight" or fused "mlp.experts.gate_up_proj";
         * a shared expert is "mlp.shared_expert." */
        if (strstr(t->name, ".experts."))
            f->expert_params += n;
        else
            dense += n;
        int k = 0;
        while (k < f->n_types && strcmp(f->types[k].dtype, t->dtype)) k++;
        if (k == f->n_types && f->n_types < HF_TYPES) {
            snprintf(f->types[k].dtype, sizeof f->types[k].dtype, "%s", t->dtype);
            f->n_types++;
        }
        if (k < f->n_types) {
            f->types[k].tensors++;
            f->types[k].params += n;
            f->types[k].bytes += t->nbytes;
        }
    }
    f->active = dense;
    if (f->expert_params) {
        bool counts = f->expert_count > 0 && f->expert_used > 0 && f->expert_used <= f->expert_count;
        f->active += counts ? (uint64_t)((long double)f->expert_params * f->expert_used /
                                         f->expert_count)
                            : f->expert_params;
    }
}

/* Bytes and number of the *.safetensors files in dir. */
static void hf_files(const char *dir, hf_facts *f) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[4400];
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        struct stat sb;
        if (len <= 12 || strcmp(e->d_name + len - 12, ".safetensors")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
            f->file_size += (uint64_t)sb.st_size;
            f->n_files++;
        }
    }
    closedir(d);
}

static void hf_print_json(const char *dir, const hf_facts *f) {
    FILE *o = stdout;
#define JSTR(s) ((s) ? json_str(o, (s), strlen(s)) : (void)fputs("null", o))
#define JINT(v) ((v) >= 0 ? (void)fprintf(o, "%lld", (long long)(v)) : (void)fputs("null", o))
    fprintf(o, "{\"directory\":");
    JSTR(dir);
    fprintf(o, ",\"format\":\"safetensors\",\"file_size\":%llu,\"files\":%lld,\"architecture\":",
            (unsigned long long)f->file_size, (long long)f->n_files);
    JSTR(f->model_type);
    fprintf(o, ",\"hf_architecture\":");
    JSTR(f->hf_arch);
    fprintf(o, ",\"dtype\":");
    JSTR(f->dtype);
    fprintf(o, ",\"parameters\":{\"total\":%llu,\"active\":%llu,\"experts\":%llu}",
            (unsigned long long)f->total, (unsigned long long)f->active,
            (unsigned long long)f->expert_params);
    fprintf(o, ",\"expert_count\":");
    JINT(f->expert_count);
    fprintf(o, ",\"expert_used_count\":");
    JINT(f->expert_used);
    fprintf(o, ",\"context_length\":");
    JINT(f->ctx_len);
    fprintf(o, ",\"block_count\":");
    JINT(f->n_layers);
    fprintf(o, ",\"embedding_length\":");
    JINT(f->n_embd);
    fprintf(o, ",\"tensor_count\":%lld,\"tensor_types\":{", (long long)f->n_tensors);
    for (int k = 0; k < f->n_types; k++) {
        fprintf(o, "%s", k ? "," : "");
        JSTR(f->types[k].dtype);
        fprintf(o, ":{\"tensors\":%lld,\"parameters\":%llu,\"bytes\":%llu}",
                (long long)f->types[k].tensors, (unsigned long long)f->types[k].params,
                (unsigned long long)f->types[k].bytes);
    }
    fprintf(o, "},\"tokenizer\":{\"model\":");
    JSTR(f->tok_model);
    fprintf(o, ",\"vocab_size\":");
    JINT(f->vocab);
    fprintf(o, ",\"tokenizer_json_tokens\":");
    JINT(f->tok_vocab);
    fprintf(o, ",\"added_tokens\":");
    JINT(f->tok_added);
    fprintf(o, "},\"chat_template\":%s,\"loadable\":%s}\n", f->has_template ? "true" : "false",
            f->loadable ? "true" : "false");
#undef JSTR
#undef JINT
}

static void hf_print_text(const char *dir, const hf_facts *f) {
    char a[32], b[32];
    printf("directory:       %s\n", dir);
    printf("size:            %s (%llu bytes) in %lld safetensors file%s\n",
           human_bytes(f->file_size, a, sizeof a), (unsigned long long)f->file_size,
           (long long)f->n_files, f->n_files == 1 ? "" : "s");
    printf("architecture:    %s", f->model_type ? f->model_type : "unknown (no model_type)");
    if (f->hf_arch) printf(" (%s)", f->hf_arch);
    printf("\n");
    if (f->dtype) printf("dtype:           %s\n", f->dtype);
    if (f->n_layers >= 0) printf("layers:          %lld\n", (long long)f->n_layers);
    if (f->n_embd >= 0) printf("embedding:       %lld\n", (long long)f->n_embd);
    if (f->ctx_len >= 0) printf("context length:  %lld\n", (long long)f->ctx_len);
    printf("parameters:      %s total (%llu)\n", human_count(f->total, a, sizeof a),
           (unsigned long long)f->total);
    if (f->expert_params) {
        printf("active/token:    %s (%llu)", human_count(f->active, b, sizeof b),
               (unsigned long long)f->active);
        if (f->expert_count > 0 && f->expert_used > 0 && f->expert_used <= f->expert_count)
            printf(", %lld of %lld experts used\n", (long long)f->expert_used,
                   (long long)f->expert_count);
        else
            printf(", expert counts missing: every expert counted\n");
    } else {
        printf("active/token:    all (dense model)\n");
    }
    printf("tensors:         %lld\n", (long long)f->n_tensors);
    for (int k = 0; k < f->n_types; k++)
        printf("  %-8s %6lld tensors  %12s params  %12s\n", f->types[k].dtype,
               (long long)f->types[k].tensors, human_count(f->types[k].params, a, sizeof a),
               human_bytes(f->types[k].bytes, b, sizeof b));
    if (f->tok_vocab >= 0) {
        printf("tokenizer:       tokenizer.json, %s, %lld tokens + %lld added", f->tok_model
               ? f->tok_model : "unknown model", (long long)f->tok_vocab, (long long)f->tok_added);
        if (f->vocab >= 0) printf("; vocab_size %lld", (long long)f->vocab);
        printf("\n");
    } else {
        printf("tokenizer:       no tokenizer.json");
        if (f->vocab >= 0) printf(" (vocab_size %lld)", (long long)f->vocab);
        printf("\n");
    }
    printf("chat template:   %s\n", f->has_template ? "present" : "absent");
    printf("loads here:      %s\n", f->loadable ? "yes (safetensors, qwen35moe)"
                                                : "no: spark-agent loads only Qwen3.5/3.6 MoE "
                                                  "checkpoints from safetensors (convert to GGUF)");
}

static int hf_info(const char *dir, bool json) {
    hf_facts f;
    memset(&f, 0, sizeof f);
    engine_json cfg, tok, tcfg;
    memset(&tok, 0, sizeof tok);
    memset(&tcfg, 0, sizeof tcfg);
    int rc = hf_json(&cfg, dir, "config.json");
    if (rc == 1) {
        cli_errorf("model info", "%s: a directory without config.json: not a Hugging Face "
                                 "checkpoint (model info takes a GGUF file or such a directory)",
                   dir);
        return CLI_EXIT_FAIL;
    }
    if (rc) return CLI_EXIT_FAIL;
    const engine_json_node *root = &cfg.nodes[0], *obj = root;
    if (root->type != ENGINE_JSON_OBJECT) {
        cli_errorf("model info", "%s/config.json: not a JSON object", dir);
        engine_json_deinit(&cfg);
        return CLI_EXIT_FAIL;
    }
    /* multimodal checkpoints keep the language model's settings in text_config */
    const engine_json_node *tc = engine_json_get(&cfg, root, "text_config");
    if (tc && tc->type == ENGINE_JSON_OBJECT) obj = tc;
    f.model_type = hf_str(&cfg, obj, "model_type");
    const engine_json_node *archs = engine_json_get(&cfg, root, "architectures");
    const engine_json_node *a0 = archs && archs->type == ENGINE_JSON_ARRAY
                                     ? engine_json_first(&cfg, archs) : NULL;
    if (a0 && a0->type == ENGINE_JSON_STRING) f.hf_arch = engine_json_str(&cfg, a0);
    f.dtype = hf_str(&cfg, obj, "torch_dtype");
    if (!f.dtype) f.dtype = hf_str(&cfg, obj, "dtype");
    f.n_layers = hf_int(&cfg, obj, "num_hidden_layers");
    f.n_embd = hf_int(&cfg, obj, "hidden_size");
    f.ctx_len = hf_int(&cfg, obj, "max_position_embeddings");
    f.vocab = hf_int(&cfg, obj, "vocab_size");
    f.expert_count = hf_int(&cfg, obj, "num_experts");
    if (f.expert_count < 0) f.expert_count = hf_int(&cfg, obj, "num_local_experts");
    f.expert_used = hf_int(&cfg, obj, "num_experts_per_tok");
    f.loadable = f.model_type && (!strcmp(f.model_type, "qwen3_5_moe_text") ||
                                  !strcmp(f.model_type, "qwen3_5_moe"));
    engine_st *st = NULL;
    if (engine_st_open(&st, dir)) {
        cli_errorf("model info", "%s", engine_error_last());
        engine_json_deinit(&cfg);
        return CLI_EXIT_FAIL;
    }
    hf_tensors(st, &f);
    hf_files(dir, &f);
    f.tok_vocab = f.tok_added = -1;
    rc = hf_json(&tok, dir, "tokenizer.json");
    if (rc < 0) goto fail;
    if (rc == 0) {
        const engine_json_node *model = engine_json_get(&tok, &tok.nodes[0], "model");
        const engine_json_node *v = model ? engine_json_get(&tok, model, "vocab") : NULL;
        const engine_json_node *added = engine_json_get(&tok, &tok.nodes[0], "added_tokens");
        f.tok_model = model ? hf_str(&tok, model, "type") : NULL;
        f.tok_vocab = v && v->type == ENGINE_JSON_OBJECT ? v->count : 0;
        f.tok_added = added && added->type == ENGINE_JSON_ARRAY ? added->count : 0;
    }
    rc = hf_json(&tcfg, dir, "tokenizer_config.json");
    if (rc < 0) goto fail;
    if (rc == 0) {
        const engine_json_node *t = engine_json_get(&tcfg, &tcfg.nodes[0], "chat_template");
        f.has_template = t && t->type == ENGINE_JSON_STRING && t->len > 0;
    }
    if (!f.has_template) { /* newer checkpoints keep it in its own file */
        char path[4400];
        struct stat sb;
        snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
        f.has_template = stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0;
    }
    if (json)
        hf_print_json(dir, &f);
    else
        hf_print_text(dir, &f);
    rc = fflush(stdout) == 0 ? CLI_EXIT_OK : CLI_EXIT_FAIL;
    goto done;
fail:
    rc = CLI_EXIT_FAIL;
done:
    engine_json_deinit(&tcfg);
    engine_json_deinit(&tok);
    engine_json_deinit(&cfg);
    engine_st_close(st);
    return rc;
}

int cli_model_info(int argc, char **argv) {
    const char *path = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            info_usage(stdout);
            return CLI_EXIT_OK;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            cli_errorf("model info", "unknown option '%s'", argv[i]);
            info_usage(stderr);
            return CLI_EXIT_USAGE;
        } else if (path) {
            cli_errorf("model info", "one FILE only ('%s' and '%s')", path, argv[i]);
            return CLI_EXIT_USAGE;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        info_usage(stderr);
        return CLI_EXIT_USAGE;
    }
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) return hf_info(path, json);
    engine_gguf *g;
    if (engine_gguf_open(&g, path) != 0) {
        cli_errorf("model info", "%s", engine_error_last());
        return CLI_EXIT_FAIL;
    }
    model_facts f;
    gather(g, &f);
    if (!f.arch.ptr) {
        cli_errorf("model info", "%s: no general.architecture string: not a model file", path);
        engine_gguf_close(g);
        return CLI_EXIT_FAIL;
    }
    if (json)
        print_json(g, path, &f);
    else
        print_text(g, path, &f);
    engine_gguf_close(g);
    return fflush(stdout) == 0 ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}
