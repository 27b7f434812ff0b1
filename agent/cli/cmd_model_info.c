/* spark-agent model info FILE [--json]: what a GGUF model file holds - architecture, parameter
 * counts (total, and active per token for mixture-of-experts models), tensor types, file size,
 * tokenizer and chat template. Reads only the header: nothing of the weights is paged in. */
#include "cli.h"

#include <stdint.h>
#include <string.h>

#include "cpu/quant.h"
#include "engine.h"
#include "model/gguf.h"

static void info_usage(FILE *f) {
    fprintf(f, "usage: spark-agent model info FILE [--json]\n\n"
               "Describe a GGUF model file: architecture, parameters (total and active per\n"
               "token), tensor types, file size, tokenizer and chat template.\n\n"
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
