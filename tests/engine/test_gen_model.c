/* The random-model generator end to end: deterministic bytes for any thread count, seeds that
 * matter, a file that the GGUF reader parses and the architecture validation accepts, the
 * converter's metadata and the real Qwen3 tokenizer in it, values that follow the documented
 * recipe, and safetensors that hold exactly the dequantised GGUF weights under HF names. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cpu/quant.h"
#include "engine.h"
#include "support.h"
#include "gen/gen.h"
#include "model/arch.h"
#include "model/gguf.h"
#include "tokenizer/json.h"

/* Files go to /dev/shm when it is there (about 800 MB of writes: memory, not disk, keeps the
 * test fast on a busy machine), else /tmp. */
static char tmpdir[64];

static int gen(const char *preset, const char *type, uint64_t seed, int threads, const char *out,
               const char *st_dir) {
    engine_model_gen_params p;
    support_gen_params(&p, preset, type, seed, out);
    p.n_threads = threads;
    p.safetensors_dir = st_dir;
    int rc = engine_model_gen(&p);
    if (rc) fprintf(stderr, "gen %s %s: %s\n", preset, type, engine_error_last());
    return rc;
}

typedef struct {
    uint64_t tensor_bytes, last_done, last_total;
    int n_progress;
    bool monotonic;
} progress_log;

static void log_tensor(void *user, const engine_model_gen_tensor *t) {
    ((progress_log *)user)->tensor_bytes += t->nbytes;
}

static void log_progress(void *user, uint64_t done, uint64_t total) {
    progress_log *l = user;
    if (done < l->last_done || done > total) l->monotonic = false;
    l->last_done = done;
    l->last_total = total;
    l->n_progress++;
}

/* Map a whole file read-only (NULL on failure). */
static const char *map_file(const char *path, size_t *len) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return NULL;
    struct stat sb;
    void *p = MAP_FAILED;
    if (fstat(fd, &sb) == 0 && sb.st_size > 0)
        p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    *len = (size_t)sb.st_size;
    return p == MAP_FAILED ? NULL : p;
}

static bool same_file(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    const char *x = map_file(a, &na), *y = map_file(b, &nb);
    bool same = x && y && na == nb && memcmp(x, y, na) == 0;
    if (x) munmap((void *)x, na);
    if (y) munmap((void *)y, nb);
    return same;
}

static void path_in(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", tmpdir, name);
}

/* The file's metadata is that of a converted Qwen3 GGUF. */
static void check_metadata(engine_gguf *g, const char *preset, uint32_t file_type) {
    const engine_arch_preset *p = engine_arch_preset_find(preset);
    engine_hparams hp;
    CHECK(engine_hparams_read(&hp, g) == 0);
    CHECK(hp.arch == p->hp.arch && hp.n_layer == p->hp.n_layer && hp.n_embd == p->hp.n_embd &&
          hp.n_vocab == 151936 && hp.n_expert == p->hp.n_expert &&
          hp.tied_embeddings == p->hp.tied_embeddings && hp.head_dim_k == p->hp.head_dim_k);
    CHECK(engine_arch_validate(&hp, g) == 0);
    uint32_t u;
    CHECK(engine_gguf_get_u32(g, "general.file_type", &u) == 0 && u == file_type);
    CHECK(engine_gguf_get_u32(g, "general.quantization_version", &u) == 0 && u == 2);
    engine_gguf_str s;
    CHECK(engine_gguf_get_str(g, "tokenizer.ggml.model", &s) == 0 && s.len == 4 &&
          !memcmp(s.ptr, "gpt2", 4));
    CHECK(engine_gguf_get_str(g, "tokenizer.ggml.pre", &s) == 0 && s.len == 5 &&
          !memcmp(s.ptr, "qwen2", 5));
    const engine_gguf_value *v;
    CHECK(engine_gguf_get_arr(g, "tokenizer.ggml.tokens", ENGINE_GGUF_STRING, &v) == 0 &&
          v->arr.n == 151936);
    if (v && v->arr.n == 151936) {
        CHECK(v->arr.strs[151644].len == 12 && !memcmp(v->arr.strs[151644].ptr, "<|im_start|>", 12));
        CHECK(v->arr.strs[151935].len == 11 && !memcmp(v->arr.strs[151935].ptr, "[PAD151935]", 11));
        CHECK(v->arr.strs[220].len == 2 && !memcmp(v->arr.strs[220].ptr, "\xc4\xa0", 2)); /* "Ġ" */
    }
    CHECK(engine_gguf_get_arr(g, "tokenizer.ggml.token_type", ENGINE_GGUF_INT32, &v) == 0 &&
          v->arr.n == 151936);
    if (v && v->arr.n == 151936) {
        CHECK(engine_gguf_arr_i64(v, 0) == 1);      /* NORMAL */
        CHECK(engine_gguf_arr_i64(v, 151645) == 3); /* <|im_end|>: CONTROL */
        CHECK(engine_gguf_arr_i64(v, 151935) == 5); /* padding: UNUSED */
    }
    CHECK(engine_gguf_get_arr(g, "tokenizer.ggml.merges", ENGINE_GGUF_STRING, &v) == 0 &&
          v->arr.n == 151387);
    CHECK(engine_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u) == 0 && u == 151645);
    CHECK(engine_gguf_get_u32(g, "tokenizer.ggml.padding_token_id", &u) == 0 && u == 151643);
    CHECK(engine_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &u) == 0 && u == 151643);
    bool b = true;
    CHECK(engine_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) == 0 && !b);
    CHECK(engine_gguf_get_str(g, "tokenizer.chat_template", &s) == 0 && s.len > 1000);
}

/* Tensor `name` in the file equals the recipe: fill -> (quantise -> dequantise). */
static void check_values(engine_gguf *g, const char *name, uint64_t seed) {
    const engine_gguf_tensor *t = engine_gguf_find_tensor(g, name);
    CHECK(t != NULL);
    if (!t) return;
    engine_tensor_desc d;
    memset(&d, 0, sizeof d);
    snprintf(d.name, sizeof d.name, "%s", name);
    d.n_dims = t->n_dims;
    for (int i = 0; i < 4; i++) d.ne[i] = t->ne[i];
    d.is_norm = strstr(name, "norm") != NULL;
    d.role = d.is_norm ? ENGINE_TENSOR_ATTN_NORM : ENGINE_TENSOR_ATTN_Q;
    if (!strcmp(name, "token_embd.weight")) d.role = ENGINE_TENSOR_TOKEN_EMBD;
    float center, hw;
    engine_gen_tensor_scale(&d, &center, &hw);
    uint64_t key = engine_gen_tensor_key(seed, name);
    const int64_t ne0 = t->ne[0], rows = t->n_elements / ne0;
    size_t rb = engine_type_row_size(t->type, ne0);
    float *want = malloc((size_t)ne0 * sizeof *want), *got = malloc((size_t)ne0 * sizeof *got);
    void *q = malloc(rb);
    int bad = 0;
    for (int64_t r = 0; r < rows; r += (rows > 64 ? rows / 61 : 1)) {
        engine_gen_fill(want, ne0, key, (uint64_t)(r * ne0), center, hw);
        if (t->type != ENGINE_TYPE_F32) {
            CHECK(engine_quantize_row(t->type, want, q, ne0) == 0);
            CHECK(engine_dequantize_row(t->type, q, want, ne0) == 0);
        }
        CHECK(engine_dequantize_row(t->type, (const char *)t->data + (size_t)r * rb, got, ne0) == 0);
        for (int64_t j = 0; j < ne0; j++) {
            if (want[j] != got[j] && bad++ < 3)
                fprintf(stderr, "%s[%lld][%lld]: %g in the file, %g by the recipe\n", name,
                        (long long)r, (long long)j, (double)got[j], (double)want[j]);
        }
    }
    CHECK(bad == 0);
    free(want);
    free(got);
    free(q);
}

/* Mean and std of a whole tensor (dequantised) against the recipe. */
static void check_stats(engine_gguf *g, const char *name, double want_mean, double want_std) {
    const engine_gguf_tensor *t = engine_gguf_find_tensor(g, name);
    CHECK(t != NULL);
    if (!t) return;
    const int64_t ne0 = t->ne[0], rows = t->n_elements / ne0;
    size_t rb = engine_type_row_size(t->type, ne0);
    float *row = malloc((size_t)ne0 * sizeof *row);
    double sum = 0, sum2 = 0, mn = 1e30, mx = -1e30;
    for (int64_t r = 0; r < rows; r++) {
        engine_dequantize_row(t->type, (const char *)t->data + (size_t)r * rb, row, ne0);
        for (int64_t j = 0; j < ne0; j++) {
            sum += row[j];
            sum2 += (double)row[j] * row[j];
            if (row[j] < mn) mn = row[j];
            if (row[j] > mx) mx = row[j];
        }
    }
    free(row);
    double n = (double)t->n_elements, mean = sum / n, sd = sqrt(sum2 / n - mean * mean);
    if (!(fabs(mean - want_mean) < 0.05 * want_std + 1e-3 && fabs(sd - want_std) < 0.1 * want_std)) {
        fprintf(stderr, "%s: mean %g std %g (min %g max %g), want mean %g std %g\n", name, mean,
                sd, mn, mx, want_mean, want_std);
        support_failures++;
    }
}

/* The safetensors hold the dequantised GGUF values under HF names, torch shapes. */
static void check_safetensors(engine_gguf *g, const char *dir, bool moe) {
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    size_t len;
    const char *st = map_file(path, &len);
    CHECK(st != NULL && len > 8);
    if (!st) return;
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)(uint8_t)st[i] << (8 * i);
    CHECK(hl % 8 == 0 && 8 + hl <= len);
    engine_json doc;
    memset(&doc, 0, sizeof doc);
    CHECK(engine_json_parse(&doc, st + 8, hl, "safetensors header") == 0);
    const char *data = st + 8 + hl;
    uint64_t covered = 0;
    int n_tensors = 0;
    for (const engine_json_node *m = engine_json_first(&doc, &doc.nodes[0]); m;
         m = engine_json_next(&doc, m)) {
        if (!strcmp(engine_json_key(&doc, m), "__metadata__")) continue;
        const engine_json_node *off = engine_json_get(&doc, m, "data_offsets");
        const engine_json_node *b = engine_json_first(&doc, off);
        const engine_json_node *e = engine_json_next(&doc, b);
        covered += (uint64_t)(e->ival - b->ival);
        n_tensors++;
    }
    CHECK(covered == len - 8 - hl); /* back to back, no gaps */

    /* name, GGUF tensor, expert index (-1: whole tensor), torch shape */
    struct {
        const char *hf, *gguf;
        int expert;
        int64_t d0, d1;
    } probes[] = {
        {"model.embed_tokens.weight", "token_embd.weight", -1, 151936, 256},
        {"model.norm.weight", "output_norm.weight", -1, 256, 0},
        {"model.layers.1.self_attn.q_proj.weight", "blk.1.attn_q.weight", -1, 256, 256},
        {"model.layers.1.self_attn.k_proj.weight", "blk.1.attn_k.weight", -1, 128, 256},
        {"model.layers.2.self_attn.o_proj.weight", "blk.2.attn_output.weight", -1, 256, 256},
        {"model.layers.3.self_attn.k_norm.weight", "blk.3.attn_k_norm.weight", -1, 64, 0},
        {"model.layers.0.input_layernorm.weight", "blk.0.attn_norm.weight", -1, 256, 0},
        {"model.layers.0.post_attention_layernorm.weight", "blk.0.ffn_norm.weight", -1, 256, 0},
        {"model.layers.2.mlp.gate.weight", "blk.2.ffn_gate_inp.weight", -1, 8, 256},
        {"model.layers.2.mlp.experts.5.gate_proj.weight", "blk.2.ffn_gate_exps.weight", 5, 256, 256},
        {"model.layers.3.mlp.experts.7.down_proj.weight", "blk.3.ffn_down_exps.weight", 7, 256, 256},
        {"lm_head.weight", "output.weight", -1, 151936, 256},
        {"model.layers.1.mlp.gate_proj.weight", "blk.1.ffn_gate.weight", -1, 512, 256},
        {"model.layers.1.mlp.down_proj.weight", "blk.1.ffn_down.weight", -1, 256, 512},
    };
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
        bool moe_only = probes[i].expert >= 0 || strstr(probes[i].hf, "mlp.gate.") ||
                        strstr(probes[i].hf, "lm_head");
        bool dense_only = strstr(probes[i].hf, "mlp.gate_proj") || strstr(probes[i].hf, "mlp.down_proj");
        const engine_json_node *m = engine_json_get(&doc, &doc.nodes[0], probes[i].hf);
        if ((moe && dense_only) || (!moe && moe_only)) {
            CHECK(m == NULL);
            continue;
        }
        CHECK(m != NULL);
        if (!m) {
            fprintf(stderr, "missing %s\n", probes[i].hf);
            continue;
        }
        const engine_json_node *dt = engine_json_get(&doc, m, "dtype");
        CHECK(dt && !strcmp(engine_json_str(&doc, dt), "F32"));
        const engine_json_node *sh = engine_json_get(&doc, m, "shape");
        const engine_json_node *s0 = engine_json_first(&doc, sh);
        const engine_json_node *s1 = s0 ? engine_json_next(&doc, s0) : NULL;
        CHECK(s0 && s0->ival == probes[i].d0);
        CHECK(probes[i].d1 ? (s1 && s1->ival == probes[i].d1) : s1 == NULL);
        const engine_json_node *off = engine_json_first(&doc, engine_json_get(&doc, m, "data_offsets"));
        const float *val = (const float *)(data + off->ival);
        const engine_gguf_tensor *t = engine_gguf_find_tensor(g, probes[i].gguf);
        CHECK(t != NULL);
        if (!t) continue;
        int64_t ne0 = t->ne[0], rows = probes[i].expert >= 0 ? t->ne[1] : t->n_elements / ne0;
        int64_t row0 = probes[i].expert >= 0 ? probes[i].expert * t->ne[1] : 0;
        size_t rb = engine_type_row_size(t->type, ne0);
        float *row = malloc((size_t)ne0 * sizeof *row);
        int bad = 0;
        for (int64_t r = 0; r < rows; r += rows > 4096 ? 97 : 1) { /* sample the 151936-row ones */
            engine_dequantize_row(t->type, (const char *)t->data + (size_t)(row0 + r) * rb, row, ne0);
            if (memcmp(row, val + r * ne0, (size_t)ne0 * sizeof *row) != 0) bad++;
        }
        if (bad) fprintf(stderr, "%s: %d rows differ from %s\n", probes[i].hf, bad, probes[i].gguf);
        CHECK(bad == 0);
        free(row);
    }
    engine_json_deinit(&doc);
    munmap((void *)st, len);

    snprintf(path, sizeof path, "%s/config.json", dir);
    char *cfg = support_slurp(path, &len);
    CHECK(cfg != NULL);
    if (cfg) {
        CHECK(engine_json_parse(&doc, cfg, len, "config.json") == 0);
        const engine_json_node *a = engine_json_get(&doc, &doc.nodes[0], "architectures");
        const char *want = moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM";
        CHECK(a && !strcmp(engine_json_str(&doc, engine_json_first(&doc, a)), want));
        const engine_json_node *tie = engine_json_get(&doc, &doc.nodes[0], "tie_word_embeddings");
        CHECK(tie && tie->type == (moe ? ENGINE_JSON_FALSE : ENGINE_JSON_TRUE));
        const engine_json_node *ne = engine_json_get(&doc, &doc.nodes[0], "num_experts");
        CHECK(moe ? (ne && ne->ival == 8) : ne == NULL);
        engine_json_deinit(&doc);
        free(cfg);
    }
    struct stat sb;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    CHECK(stat(path, &sb) == 0 && sb.st_size > 10000000);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    CHECK(stat(path, &sb) == 0 && sb.st_size > 1000);
}

int main(void) {
    int skip = support_init();
    if (skip) return skip;
    if (support_tmpdir(tmpdir, sizeof tmpdir, "test_gen", true) != 0) return 1;
    char a[512], b[512], c[512], d[512], st_moe[512], st_dense[512];
    path_in(a, sizeof a, "tiny-1.gguf");
    path_in(b, sizeof b, "tiny-3.gguf");
    path_in(c, sizeof c, "tiny-seed2.gguf");
    path_in(d, sizeof d, "dense.gguf");
    path_in(st_moe, sizeof st_moe, "hf-moe");
    path_in(st_dense, sizeof st_dense, "hf-dense");

    /* Determinism: 1 thread vs 3 threads (and with safetensors on) -> identical bytes. */
    CHECK(gen("tiny", "q8_0", 1, 1, a, NULL) == 0);
    CHECK(gen("tiny", "q8_0", 1, 3, b, st_moe) == 0);
    CHECK(same_file(a, b));
    /* Another seed, other weights. */
    CHECK(gen("tiny", "q8_0", 2, 2, c, NULL) == 0);
    CHECK(!same_file(a, c));
    /* Dense, tied, K-quants (Q4_K matrices, Q6_K tied embedding/head). */
    CHECK(gen("qwen3-tiny", "q4_k_m", 7, 2, d, st_dense) == 0);

    engine_gguf *g = NULL;
    CHECK(engine_gguf_open(&g, a) == 0);
    if (g) {
        check_metadata(g, "tiny", 7);
        check_values(g, "blk.1.attn_q.weight", 1);
        check_values(g, "blk.2.ffn_down_exps.weight", 1);
        check_values(g, "blk.0.attn_k_norm.weight", 1);
        check_values(g, "token_embd.weight", 1);
        check_stats(g, "blk.3.ffn_up_exps.weight", 0.0, 1.0 / 16.0);
        check_stats(g, "blk.0.attn_norm.weight", 1.0, 0.25 / sqrt(3.0));
        check_stats(g, "blk.1.attn_q.weight", 0.0, 1.0 / 16.0);
        CHECK(engine_gguf_find_tensor(g, "blk.0.ffn_gate_inp.weight")->type == ENGINE_TYPE_F32);
        CHECK(engine_gguf_find_tensor(g, "blk.0.attn_q.weight")->type == ENGINE_TYPE_Q8_0);
        CHECK(engine_gguf_find_tensor(g, "output_norm.weight")->type == ENGINE_TYPE_F32);
        engine_gguf_close(g);
    }
    CHECK(engine_gguf_open(&g, b) == 0);
    if (g) {
        check_safetensors(g, st_moe, true);
        engine_gguf_close(g);
    }
    CHECK(engine_gguf_open(&g, d) == 0);
    if (g) {
        check_metadata(g, "qwen3-tiny", 15);
        CHECK(engine_gguf_find_tensor(g, "output.weight") == NULL);
        CHECK(engine_gguf_find_tensor(g, "token_embd.weight")->type == ENGINE_TYPE_Q6_K);
        CHECK(engine_gguf_find_tensor(g, "blk.1.ffn_up.weight")->type == ENGINE_TYPE_Q4_K);
        CHECK(engine_gguf_find_tensor(g, "blk.0.ffn_down.weight")->type == ENGINE_TYPE_Q4_K);
        CHECK(engine_gguf_find_tensor(g, "blk.2.ffn_down.weight")->type == ENGINE_TYPE_Q6_K);
        check_values(g, "blk.1.ffn_up.weight", 7);
        check_values(g, "token_embd.weight", 7);
        check_safetensors(g, st_dense, false);
        engine_gguf_close(g);
    }

    /* A cut-down model (--layers): that many blocks of the preset's shape, the same tensors
     * per block; block counts the preset does not allow are refused. */
    {
        engine_model_gen_params p;
        support_gen_params(&p, "tiny", "q8_0", 1, c);
        p.n_layer = 2;
        CHECK(engine_model_gen(&p) == 0);
        CHECK(engine_gguf_open(&g, c) == 0);
        if (g) {
            CHECK(engine_gguf_find_tensor(g, "blk.1.ffn_up_exps.weight") != NULL);
            CHECK(engine_gguf_find_tensor(g, "blk.2.attn_q.weight") == NULL);
            check_values(g, "blk.1.attn_q.weight", 1);
            engine_gguf_close(g);
        }
        engine_model *m = NULL;
        CHECK(engine_model_load(&m, c, NULL) == 0 && m);
        engine_model_free(m);
        p.n_layer = 1000;
        CHECK(engine_model_gen(&p) == ENGINE_EINVAL && strstr(engine_error_last(), "--layers"));
        p.preset = "qwen35-tiny";
        p.n_layer = 3; /* not a multiple of the full-attention interval */
        CHECK(engine_model_gen(&p) == ENGINE_EINVAL && strstr(engine_error_last(), "interval"));
    }

    /* Callbacks: every tensor before the data, progress ending at done == total. */
    {
        progress_log log = {.monotonic = true};
        engine_model_gen_params p;
        support_gen_params(&p, "qwen3-tiny", "q8_0", 0, c);
        p.on_tensor = log_tensor;
        p.on_progress = log_progress;
        p.user = &log;
        CHECK(engine_model_gen(&p) == 0);
        CHECK(log.n_progress >= 1 && log.monotonic);
        CHECK(log.tensor_bytes > 0 && log.last_done == log.tensor_bytes &&
              log.last_total == log.tensor_bytes);
    }

    /* The default model: generated once into $XDG_CACHE_HOME/spark-agent/models, then reused. */
    char cache[600], want[700], got[4096];
    snprintf(cache, sizeof cache, "%s/cache", tmpdir);
    snprintf(want, sizeof want, "%s/spark-agent/models/tiny-q8_0-s0-g%d.gguf", cache,
             ENGINE_GEN_VERSION);
    setenv("XDG_CACHE_HOME", cache, 1);
    int drc = engine_default_model_path(got, sizeof got);
    if (support_tokenizer_dir()) {
        CHECK(drc == ENGINE_EINVAL && strstr(engine_error_last(), "tokenizer"));
    } else {
        CHECK(drc == 0 && !strcmp(got, want));
        CHECK(engine_gguf_open(&g, got) == 0);
        if (g) {
            check_metadata(g, "tiny", 7);
            engine_gguf_close(g);
        }
        struct stat s1, s2;
        CHECK(stat(want, &s1) == 0);
        CHECK(engine_default_model_path(got, sizeof got) == 0 && !strcmp(got, want));
        CHECK(stat(want, &s2) == 0 && s1.st_mtim.tv_sec == s2.st_mtim.tv_sec &&
              s1.st_mtim.tv_nsec == s2.st_mtim.tv_nsec); /* reused, not rewritten */
    }
    CHECK(engine_default_model_path(got, 10) == ENGINE_ERANGE);
    /* A relative XDG_CACHE_HOME is ignored (XDG spec): $HOME/.cache is used. An existing file
     * there is reused as it is. */
    char home[600], dummy[700];
    snprintf(home, sizeof home, "%s/home", tmpdir);
    snprintf(dummy, sizeof dummy, "%s/.cache/spark-agent/models", home);
    char mk[1600];
    snprintf(mk, sizeof mk, "mkdir -p '%s' && echo x > '%s/tiny-q8_0-s0-g%d.gguf'", dummy, dummy,
             ENGINE_GEN_VERSION);
    CHECK(system(mk) == 0);
    setenv("XDG_CACHE_HOME", "relative/cache", 1);
    setenv("HOME", home, 1);
    CHECK(engine_default_model_path(got, sizeof got) == 0 && !strncmp(got, dummy, strlen(dummy)));

    /* Bad input: unknown preset/type, unwritable output. */
    engine_model_gen_params p;
    engine_model_gen_params_init(&p);
    p.preset = "huge";
    p.out_path = a;
    CHECK(engine_model_gen(&p) == ENGINE_EINVAL && strstr(engine_error_last(), "qwen3-30b-a3b"));
    p.preset = "tiny";
    p.type = "q2_k";
    CHECK(engine_model_gen(&p) == ENGINE_EINVAL && strstr(engine_error_last(), "q4_k_m"));
    p.type = "q8_0";
    p.tokenizer_dir = support_tokenizer_dir();
    p.out_path = "/nonexistent-dir/x.gguf";
    CHECK(engine_model_gen(&p) == ENGINE_EIO);
    p.out_path = a;
    p.tokenizer_dir = "/nonexistent-dir";
    CHECK(engine_model_gen(&p) == ENGINE_EIO && strstr(engine_error_last(), "tokenizer.json"));

    support_rmtree(tmpdir);
    return support_finish("test_gen_model");
}
