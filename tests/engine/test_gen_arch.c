/* Architecture descriptions: tensor lists and shapes of the real presets, metadata keys written
 * and read back through the GGUF writer/reader, validation errors that name the tensor, and
 * the generator's type mixes. No model data is generated here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/quant.h"
#include "engine.h"
#include "gen/gen.h"
#include "model/arch.h"
#include "model/gguf.h"

static int failures;

#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__,  \
                    #cond, engine_error_last());                                               \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)

static const engine_tensor_desc *find(const engine_tensor_desc *d, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(d[i].name, name)) return &d[i];
    return NULL;
}

static bool shape_is(const engine_tensor_desc *d, int n_dims, int64_t a, int64_t b, int64_t c) {
    return d && d->n_dims == n_dims && d->ne[0] == a && d->ne[1] == b && d->ne[2] == c &&
           d->ne[3] == 1;
}

/* The tensor list of Qwen3-30B-A3B as a converted GGUF has it (ggml order). */
static void test_qwen3_30b_a3b_tensors(void) {
    const engine_arch_preset *p = engine_arch_preset_find("qwen3-30b-a3b");
    CHECK(p != NULL);
    if (!p) return;
    const engine_hparams *hp = &p->hp;
    CHECK(hp->arch == ENGINE_ARCH_QWEN3MOE && hp->n_layer == 48 && hp->n_embd == 2048);
    engine_tensor_desc *d;
    size_t n;
    CHECK(engine_arch_tensors(hp, &d, &n) == 0);
    CHECK(n == 1 + 48 * 12 + 2);
    CHECK(!strcmp(d[0].name, "token_embd.weight"));
    CHECK(!strcmp(d[n - 2].name, "output_norm.weight"));
    CHECK(!strcmp(d[n - 1].name, "output.weight"));
    CHECK(shape_is(find(d, n, "token_embd.weight"), 2, 2048, 151936, 1));
    CHECK(shape_is(find(d, n, "output.weight"), 2, 2048, 151936, 1));
    CHECK(shape_is(find(d, n, "output_norm.weight"), 1, 2048, 1, 1));
    CHECK(shape_is(find(d, n, "blk.0.attn_norm.weight"), 1, 2048, 1, 1));
    CHECK(shape_is(find(d, n, "blk.0.attn_q.weight"), 2, 2048, 4096, 1));
    CHECK(shape_is(find(d, n, "blk.0.attn_k.weight"), 2, 2048, 512, 1));
    CHECK(shape_is(find(d, n, "blk.0.attn_v.weight"), 2, 2048, 512, 1));
    CHECK(shape_is(find(d, n, "blk.0.attn_output.weight"), 2, 4096, 2048, 1));
    CHECK(shape_is(find(d, n, "blk.0.attn_q_norm.weight"), 1, 128, 1, 1));
    CHECK(shape_is(find(d, n, "blk.0.attn_k_norm.weight"), 1, 128, 1, 1));
    CHECK(shape_is(find(d, n, "blk.0.ffn_norm.weight"), 1, 2048, 1, 1));
    CHECK(shape_is(find(d, n, "blk.47.ffn_gate_inp.weight"), 2, 2048, 128, 1));
    CHECK(shape_is(find(d, n, "blk.47.ffn_gate_exps.weight"), 3, 2048, 768, 128));
    CHECK(shape_is(find(d, n, "blk.47.ffn_up_exps.weight"), 3, 2048, 768, 128));
    CHECK(shape_is(find(d, n, "blk.47.ffn_down_exps.weight"), 3, 768, 2048, 128));
    CHECK(find(d, n, "blk.48.attn_q.weight") == NULL);
    CHECK(find(d, n, "blk.0.ffn_gate.weight") == NULL);
    const engine_tensor_desc *qn = find(d, n, "blk.5.attn_q_norm.weight");
    CHECK(qn && qn->is_norm && qn->layer == 5 && qn->role == ENGINE_TENSOR_ATTN_Q_NORM);
    const engine_tensor_desc *te = find(d, n, "token_embd.weight");
    CHECK(te && !te->is_norm && te->layer == -1);

    /* Parameter counts: ~30.5B total, ~3.3B active (the published 30.5B / 3.3B). */
    uint64_t total, active;
    engine_arch_param_count(hp, &total, &active);
    CHECK(total > 30400000000ull && total < 30600000000ull);
    CHECK(active > 3200000000ull && active < 3400000000ull);

    /* q4_k_m type mix: ~18.6 GB (17.3 GiB), the size of the published Q4_K_M files. */
    const engine_gen_ftype *ft = engine_gen_ftype_find("q4_k_m");
    CHECK(ft && ft->file_type == 15);
    uint64_t bytes = 0;
    for (size_t i = 0; ft && i < n; i++) {
        engine_type t = engine_gen_tensor_type(ft, hp, &d[i]);
        bytes += engine_type_row_size(t, d[i].ne[0]) * (uint64_t)(d[i].ne[1] * d[i].ne[2]);
        if (d[i].is_norm || d[i].role == ENGINE_TENSOR_FFN_GATE_INP) CHECK(t == ENGINE_TYPE_F32);
    }
    if (!(bytes > 18000000000ull && bytes < 19000000000ull))
        fprintf(stderr, "q4_k_m qwen3-30b-a3b: %llu bytes\n", (unsigned long long)bytes);
    CHECK(bytes > 18000000000ull && bytes < 19000000000ull);
    if (ft) {
        CHECK(engine_gen_tensor_type(ft, hp, find(d, n, "output.weight")) == ENGINE_TYPE_Q6_K);
        CHECK(engine_gen_tensor_type(ft, hp, find(d, n, "token_embd.weight")) == ENGINE_TYPE_Q4_K);
        /* use_more_bits(i, 48): i < 6, i >= 42, (i - 6) % 3 == 2 */
        CHECK(engine_gen_tensor_type(ft, hp, find(d, n, "blk.0.attn_v.weight")) == ENGINE_TYPE_Q6_K);
        CHECK(engine_gen_tensor_type(ft, hp, find(d, n, "blk.6.attn_v.weight")) == ENGINE_TYPE_Q4_K);
        CHECK(engine_gen_tensor_type(ft, hp, find(d, n, "blk.8.ffn_down_exps.weight")) ==
              ENGINE_TYPE_Q6_K);
        CHECK(engine_gen_tensor_type(ft, hp, find(d, n, "blk.9.ffn_down_exps.weight")) ==
              ENGINE_TYPE_Q4_K);
        CHECK(engine_gen_tensor_type(ft, hp, find(d, n, "blk.9.ffn_up_exps.weight")) ==
              ENGINE_TYPE_Q4_K);
        CHECK(engine_gen_tensor_type(ft, hp, find(d, n, "blk.47.attn_q.weight")) == ENGINE_TYPE_Q4_K);
    }
    free(d);
}

/* The q4_k_m mix of the Qwen3.5-35B-A3B shape as llama.cpp's quantizer picks it: ffn_down
 * rules cover the shared expert's down (layer from the name), attn_v counts attention blocks
 * only (against one attn_v or attn_qkv per block), the DeltaNet attn_qkv is one step up. */
static void test_qwen35_mix(void) {
    const engine_arch_preset *p = engine_arch_preset_find("qwen35-35b-a3b-mtp");
    const engine_gen_ftype *ft = engine_gen_ftype_find("q4_k_m");
    CHECK(p && ft);
    if (!p || !ft) return;
    engine_tensor_desc *d;
    size_t n;
    CHECK(engine_arch_tensors(&p->hp, &d, &n) == 0);
    const engine_hparams *hp = &p->hp;
    struct {
        const char *name;
        engine_type t;
    } want[] = {
        /* use_more_bits(i, 41): i < 5, i >= 35, (i - 5) % 3 == 2 */
        {"blk.0.ffn_down_exps.weight", ENGINE_TYPE_Q6_K},
        {"blk.0.ffn_down_shexp.weight", ENGINE_TYPE_Q6_K},
        {"blk.5.ffn_down_exps.weight", ENGINE_TYPE_Q4_K},
        {"blk.5.ffn_down_shexp.weight", ENGINE_TYPE_Q4_K},
        {"blk.7.ffn_down_shexp.weight", ENGINE_TYPE_Q6_K},
        {"blk.36.ffn_down_shexp.weight", ENGINE_TYPE_Q6_K},
        {"blk.40.ffn_down_exps.weight", ENGINE_TYPE_Q6_K},
        {"blk.5.ffn_up_shexp.weight", ENGINE_TYPE_Q4_K},
        /* attn_v of attention block i (layers 3, 7, ..., 39, then the MTP block 40) */
        {"blk.3.attn_v.weight", ENGINE_TYPE_Q6_K},  /* i = 0 */
        {"blk.19.attn_v.weight", ENGINE_TYPE_Q6_K}, /* i = 4 */
        {"blk.23.attn_v.weight", ENGINE_TYPE_Q4_K}, /* i = 5 */
        {"blk.31.attn_v.weight", ENGINE_TYPE_Q6_K}, /* i = 7 */
        {"blk.35.attn_v.weight", ENGINE_TYPE_Q4_K}, /* i = 8 */
        {"blk.40.attn_v.weight", ENGINE_TYPE_Q6_K}, /* i = 10 */
        {"blk.0.attn_qkv.weight", ENGINE_TYPE_Q5_K},
        {"blk.38.attn_qkv.weight", ENGINE_TYPE_Q5_K},
        {"blk.0.attn_gate.weight", ENGINE_TYPE_Q4_K},
        {"blk.0.ssm_out.weight", ENGINE_TYPE_Q4_K},
        {"output.weight", ENGINE_TYPE_Q6_K},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const engine_tensor_desc *t = find(d, n, want[i].name);
        CHECK(t != NULL);
        if (t && engine_gen_tensor_type(ft, hp, t) != want[i].t) {
            fprintf(stderr, "%s: type %d, want %d\n", want[i].name,
                    (int)engine_gen_tensor_type(ft, hp, t), (int)want[i].t);
            failures++;
        }
    }
    /* q5_k_m: attn_qkv Q6_K */
    const engine_gen_ftype *f5 = engine_gen_ftype_find("q5_k_m");
    const engine_tensor_desc *qkv = find(d, n, "blk.0.attn_qkv.weight");
    CHECK(f5 && qkv && engine_gen_tensor_type(f5, hp, qkv) == ENGINE_TYPE_Q6_K);
    free(d);
}

static void test_dense_and_tied(void) {
    const engine_arch_preset *p = engine_arch_preset_find("qwen3-tiny");
    CHECK(p && p->hp.arch == ENGINE_ARCH_QWEN3 && p->hp.tied_embeddings);
    if (!p) return;
    engine_tensor_desc *d;
    size_t n;
    CHECK(engine_arch_tensors(&p->hp, &d, &n) == 0);
    CHECK(n == 1 + p->hp.n_layer * 11 + 1);
    CHECK(find(d, n, "output.weight") == NULL);
    CHECK(shape_is(find(d, n, "blk.1.ffn_gate.weight"), 2, 256, 512, 1));
    CHECK(shape_is(find(d, n, "blk.1.ffn_up.weight"), 2, 256, 512, 1));
    CHECK(shape_is(find(d, n, "blk.1.ffn_down.weight"), 2, 512, 256, 1));
    CHECK(find(d, n, "blk.1.ffn_gate_inp.weight") == NULL);
    /* A tied embedding is the output head: Q6_K in a q4_k_m file. */
    const engine_gen_ftype *ft = engine_gen_ftype_find("Q4_K_M");
    CHECK(ft != NULL);
    if (ft) CHECK(engine_gen_tensor_type(ft, &p->hp, &d[0]) == ENGINE_TYPE_Q6_K);
    free(d);
    /* Every preset describes a consistent model whose matrices suit every K-quant (the
     * tensors kept in F32 whatever the type, norms and qwen35moe's small DeltaNet parameters,
     * aside). */
    const engine_gen_ftype *q4 = engine_gen_ftype_find("q4_k_m");
    for (size_t i = 0; i < engine_arch_preset_count(); i++) {
        const engine_arch_preset *q = engine_arch_preset_at(i);
        CHECK(engine_hparams_check(&q->hp) == 0);
        CHECK(engine_arch_tensors(&q->hp, &d, &n) == 0);
        for (size_t k = 0; k < n; k++)
            if (engine_gen_tensor_type(q4, &q->hp, &d[k]) != ENGINE_TYPE_F32)
                CHECK(d[k].ne[0] % 256 == 0);
        free(d);
    }
    CHECK(engine_arch_preset_find("nope") == NULL);
    CHECK(engine_gen_ftype_find("q3_k") == NULL);
}

static void test_hparams_check(void) {
    engine_hparams hp = engine_arch_preset_find("tiny")->hp;
    hp.n_head_kv = 3;
    CHECK(engine_hparams_check(&hp) == ENGINE_EFORMAT);
    CHECK(strstr(engine_error_last(), "head_count_kv") != NULL);
    hp = engine_arch_preset_find("tiny")->hp;
    hp.n_expert_used = 9;
    CHECK(engine_hparams_check(&hp) == ENGINE_EFORMAT);
    CHECK(strstr(engine_error_last(), "expert_used_count") != NULL);
    hp = engine_arch_preset_find("tiny")->hp;
    hp.rms_norm_eps = 0.0f;
    CHECK(engine_hparams_check(&hp) == ENGINE_EFORMAT);
    hp = engine_arch_preset_find("qwen3-tiny")->hp;
    hp.n_expert = 4;
    CHECK(engine_hparams_check(&hp) == ENGINE_EFORMAT);
}

/* Write a GGUF with the tiny preset's metadata and zero tensors of the right shapes, in a
 * temporary file; `mutate` may break one thing. */
typedef enum {
    MUT_NONE,
    MUT_DROP_KEY,
    MUT_DROP_TENSOR,
    MUT_BAD_SHAPE,
    MUT_NORM_F16,
    MUT_COUNT_STR,    /* block_count as a string */
    MUT_UNKNOWN_ARCH, /* general.architecture = "llama" */
    MUT_HEADS_ZERO,   /* attention.head_count = 0 */
    MUT_USED_GT,      /* expert_used_count > expert_count */
    MUT_COUNT
} mutation;

static const char *const mutation_names[MUT_COUNT] = {
    "valid", "no_expert_count", "no_ffn_up_exps", "bad_attn_k_shape", "norm_f16",
    "block_count_string", "arch_llama", "head_count_0", "expert_used_99",
};

static int write_model(const char *path, const engine_hparams *hp, mutation m) {
    engine_gguf_writer *w;
    int rc = engine_gguf_writer_new(&w);
    if (rc) return rc;
    if (m != MUT_DROP_KEY) {
        rc = engine_hparams_write(hp, w);
    } else { /* every required key but qwen3moe.expert_count */
        engine_gguf_writer_set_str(w, "general.architecture", "qwen3moe");
        engine_gguf_writer_set_u32(w, "qwen3moe.block_count", hp->n_layer);
        engine_gguf_writer_set_u32(w, "qwen3moe.context_length", hp->n_ctx_train);
        engine_gguf_writer_set_u32(w, "qwen3moe.embedding_length", hp->n_embd);
        engine_gguf_writer_set_u32(w, "qwen3moe.feed_forward_length", hp->n_ff);
        engine_gguf_writer_set_u32(w, "qwen3moe.attention.head_count", hp->n_head);
        engine_gguf_writer_set_u32(w, "qwen3moe.attention.head_count_kv", hp->n_head_kv);
        engine_gguf_writer_set_f32(w, "qwen3moe.attention.layer_norm_rms_epsilon",
                                   hp->rms_norm_eps);
        engine_gguf_writer_set_u32(w, "qwen3moe.expert_used_count", hp->n_expert_used);
    }
    const char *an = engine_arch_name(hp->arch);
    char key[96];
    if (!rc && m == MUT_COUNT_STR) {
        snprintf(key, sizeof key, "%s.block_count", an);
        rc = engine_gguf_writer_set_str(w, key, "3");
    }
    if (!rc && m == MUT_UNKNOWN_ARCH) rc = engine_gguf_writer_set_str(w, "general.architecture", "llama");
    if (!rc && m == MUT_HEADS_ZERO) {
        snprintf(key, sizeof key, "%s.attention.head_count", an);
        rc = engine_gguf_writer_set_u32(w, key, 0);
    }
    if (!rc && m == MUT_USED_GT) {
        snprintf(key, sizeof key, "%s.expert_used_count", an);
        rc = engine_gguf_writer_set_u32(w, key, 99);
    }
    engine_tensor_desc *d = NULL;
    size_t n = 0;
    if (!rc) rc = engine_arch_tensors(hp, &d, &n);
    for (size_t i = 0; !rc && i < n; i++) {
        if (m == MUT_DROP_TENSOR && !strcmp(d[i].name, "blk.1.ffn_up_exps.weight")) continue;
        int64_t ne[4] = {d[i].ne[0], d[i].ne[1], d[i].ne[2], d[i].ne[3]};
        if (m == MUT_BAD_SHAPE && !strcmp(d[i].name, "blk.2.attn_k.weight")) ne[1] *= 2;
        engine_type t = ENGINE_TYPE_F16;
        if (d[i].is_norm && m != MUT_NORM_F16) t = ENGINE_TYPE_F32;
        int64_t idx = engine_gguf_writer_add_tensor(w, d[i].name, t, d[i].n_dims, ne, NULL);
        if (idx < 0) rc = (int)idx;
    }
    free(d);
    if (!rc) {
        engine_gguf_out *o;
        rc = engine_gguf_writer_begin(w, path, &o);
        if (!rc) rc = engine_gguf_out_commit(o); /* holes read as zeros */
    }
    engine_gguf_writer_free(w);
    return rc;
}

static bool hp_equal(const engine_hparams *a, const engine_hparams *b) {
    return a->arch == b->arch && a->n_layer == b->n_layer && a->n_embd == b->n_embd &&
           a->n_head == b->n_head && a->n_head_kv == b->n_head_kv &&
           a->head_dim_k == b->head_dim_k && a->head_dim_v == b->head_dim_v && a->n_ff == b->n_ff &&
           a->n_expert == b->n_expert && a->n_expert_used == b->n_expert_used &&
           a->n_ff_exp == b->n_ff_exp && a->n_vocab == b->n_vocab &&
           a->n_ctx_train == b->n_ctx_train && a->rope_theta == b->rope_theta &&
           a->rms_norm_eps == b->rms_norm_eps && a->norm_topk_prob == b->norm_topk_prob &&
           a->tied_embeddings == b->tied_embeddings;
}

static void test_roundtrip_and_validate(void) {
    char path[] = "/tmp/spark_test_gen_arch_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    close(fd);
    engine_hparams tiny = engine_arch_preset_find("tiny")->hp;
    tiny.n_vocab = 1024; /* keep the file small; no tokenizer in it, so n_vocab comes from
                          * token_embd.weight */

    CHECK(write_model(path, &tiny, MUT_NONE) == 0);
    engine_gguf *g = NULL;
    CHECK(engine_gguf_open(&g, path) == 0);
    if (g) {
        const char *keys[] = {"general.architecture", "qwen3moe.block_count",
                              "qwen3moe.context_length", "qwen3moe.embedding_length",
                              "qwen3moe.feed_forward_length", "qwen3moe.attention.head_count",
                              "qwen3moe.attention.head_count_kv", "qwen3moe.rope.freq_base",
                              "qwen3moe.attention.layer_norm_rms_epsilon",
                              "qwen3moe.expert_used_count", "qwen3moe.attention.key_length",
                              "qwen3moe.attention.value_length", "qwen3moe.expert_count",
                              "qwen3moe.expert_feed_forward_length"};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
            if (!engine_gguf_find_key(g, keys[i])) {
                fprintf(stderr, "missing key %s\n", keys[i]);
                failures++;
            }
        }
        engine_hparams hp;
        CHECK(engine_hparams_read(&hp, g) == 0);
        CHECK(hp_equal(&hp, &tiny));
        CHECK(engine_arch_validate(&hp, g) == 0);
        engine_gguf_close(g);
    }

    struct {
        mutation m;
        const char *needle;
        int code;
    } read_cases[] = {
        {MUT_DROP_KEY, "qwen3moe.expert_count", ENGINE_EFORMAT},
        {MUT_COUNT_STR, "qwen3moe.block_count", ENGINE_EFORMAT},
        {MUT_UNKNOWN_ARCH, "llama", ENGINE_EUNSUPPORTED},
        {MUT_HEADS_ZERO, "head_count", ENGINE_EFORMAT},
        {MUT_USED_GT, "expert_used_count", ENGINE_EFORMAT},
    };
    for (size_t i = 0; i < sizeof read_cases / sizeof read_cases[0]; i++) {
        CHECK(write_model(path, &tiny, read_cases[i].m) == 0);
        CHECK(engine_gguf_open(&g, path) == 0);
        if (!g) continue;
        engine_hparams hp;
        CHECK(engine_hparams_read(&hp, g) == read_cases[i].code);
        if (!strstr(engine_error_last(), read_cases[i].needle) ||
            !strstr(engine_error_last(), path)) {
            fprintf(stderr, "read case %zu: error \"%s\" does not name %s and the file\n", i,
                    engine_error_last(), read_cases[i].needle);
            failures++;
        }
        engine_gguf_close(g);
    }

    struct {
        mutation m;
        const char *needle;
        int code;
    } cases[] = {
        {MUT_DROP_TENSOR, "blk.1.ffn_up_exps.weight", ENGINE_EFORMAT},
        {MUT_BAD_SHAPE, "blk.2.attn_k.weight", ENGINE_EFORMAT},
        {MUT_NORM_F16, "norm", ENGINE_EUNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(write_model(path, &tiny, cases[i].m) == 0);
        CHECK(engine_gguf_open(&g, path) == 0);
        if (!g) continue;
        engine_hparams hp;
        CHECK(engine_hparams_read(&hp, g) == 0);
        CHECK(engine_arch_validate(&hp, g) == cases[i].code);
        if (!strstr(engine_error_last(), cases[i].needle)) {
            fprintf(stderr, "case %zu: error \"%s\" does not name %s\n", i, engine_error_last(),
                    cases[i].needle);
            failures++;
        }
        engine_gguf_close(g);
    }
    unlink(path);
}

/* A micro model (3 layers, hidden 16, vocab 32: a few KB) and its mutations, as the seed
 * corpus of fuzz_gen_arch (tests/fixtures/fuzz/gen_arch). */
static int write_corpus(const char *dir) {
    engine_hparams moe = {.arch = ENGINE_ARCH_QWEN3MOE, .n_layer = 3, .n_embd = 16, .n_head = 2,
                          .n_head_kv = 1, .head_dim_k = 8, .head_dim_v = 8, .n_ff = 32,
                          .n_expert = 2, .n_expert_used = 1, .n_ff_exp = 16, .n_vocab = 32,
                          .n_ctx_train = 64, .rope_theta = 1e6f, .rms_norm_eps = 1e-6f,
                          .norm_topk_prob = true};
    engine_hparams dense = moe;
    dense.arch = ENGINE_ARCH_QWEN3;
    dense.n_expert = dense.n_expert_used = dense.n_ff_exp = 0;
    dense.norm_topk_prob = false;
    dense.tied_embeddings = true;
    char path[4096];
    for (int m = 0; m < MUT_COUNT; m++) {
        snprintf(path, sizeof path, "%s/qwen3moe_%s.gguf", dir, mutation_names[m]);
        if (write_model(path, &moe, (mutation)m)) return 1;
    }
    snprintf(path, sizeof path, "%s/qwen3_tied_valid.gguf", dir);
    if (write_model(path, &dense, MUT_NONE)) return 1;
    snprintf(path, sizeof path, "%s/qwen3_bad_attn_k_shape.gguf", dir);
    if (write_model(path, &dense, MUT_BAD_SHAPE)) return 1;
    printf("corpus written to %s\n", dir);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--write-corpus")) return write_corpus(argv[2]);
    test_qwen3_30b_a3b_tensors();
    test_qwen35_mix();
    test_dense_and_tied();
    test_hparams_check();
    test_roundtrip_and_validate();
    if (failures) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
