/* Hand-built small models (a 261-token byte-level vocabulary, tiny dimensions) written with the
 * GGUF writer: they load, tokenize, run and generate, batch and token-by-token agree, and a file
 * whose tokenizer metadata is damaged in each of several ways fails with a message naming the
 * key, as do an unsupported architecture and an unsupported tensor type. They are also the seed corpus of fuzz_model_load:
 *     test_forward_small --write-corpus tests/fixtures/fuzz/model */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cpu/quant.h"
#include "engine.h"
#include "support.h"
#include "model/arch.h"
#include "model/gguf.h"

#define N_BYTES 256
#define N_VOCAB 261 /* 256 bytes, 2 merges, 3 control tokens */

/* GPT-2's byte -> printable code point mapping, UTF-8 encoded into out (NUL-terminated). */
static void byte_token(int b, char *out) {
    int cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
        cp = b;
    } else {
        int n = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = 0;
    }
}

typedef enum {
    DAMAGE_NONE,
    DAMAGE_NO_MODEL,
    DAMAGE_TYPES_SHORT,
    DAMAGE_BAD_MERGE,
    DAMAGE_EOS,
    DAMAGE_ARCH, /* general.architecture = "llama": valid, not supported */
    DAMAGE_TYPE, /* blk.0.attn_q.weight in Q4_1: valid, no CPU kernel */
} damage;

static uint64_t rng = 88172645463325252ull;

static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static int write_model(const char *path, engine_arch arch, engine_type type, damage dmg) {
    engine_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.arch = arch;
    hp.n_layer = 2;
    hp.n_embd = 32;
    hp.n_head = 4;
    hp.n_head_kv = 2;
    hp.head_dim_k = hp.head_dim_v = 8;
    hp.n_ff = 32;
    if (arch == ENGINE_ARCH_QWEN3MOE) {
        hp.n_expert = 4;
        hp.n_expert_used = 2;
        hp.n_ff_exp = 32;
    }
    hp.n_vocab = N_VOCAB;
    hp.n_ctx_train = 128;
    hp.rope_theta = 10000.0f;
    hp.rms_norm_eps = 1e-6f;
    hp.norm_topk_prob = true;
    hp.tied_embeddings = arch == ENGINE_ARCH_QWEN3;
    engine_gguf_writer *w = NULL;
    engine_tensor_desc *desc = NULL;
    size_t n_desc = 0;
    void **data = NULL;
    int rc = engine_gguf_writer_new(&w);
    if (!rc) rc = engine_hparams_write(&hp, w);
    if (!rc && dmg == DAMAGE_ARCH) rc = engine_gguf_writer_set_str(w, "general.architecture", "llama");
    /* tokenizer */
    char tok_store[N_VOCAB][16];
    const char *toks[N_VOCAB];
    int32_t types[N_VOCAB];
    for (int b = 0; b < N_BYTES; b++) {
        byte_token(b, tok_store[b]);
        types[b] = 1;
    }
    snprintf(tok_store[256], 16, "\xc4\xa0t"); /* "Ġt" = " t" */
    snprintf(tok_store[257], 16, "he");
    snprintf(tok_store[258], 16, "<|endoftext|>");
    snprintf(tok_store[259], 16, "<|im_start|>");
    snprintf(tok_store[260], 16, "<|im_end|>");
    types[256] = types[257] = 1;
    types[258] = types[259] = types[260] = 3;
    for (int i = 0; i < N_VOCAB; i++) toks[i] = tok_store[i];
    const char *merges[2] = {"\xc4\xa0 t", dmg == DAMAGE_BAD_MERGE ? "h zz" : "h e"};
    if (!rc && dmg != DAMAGE_NO_MODEL) rc = engine_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    if (!rc) rc = engine_gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2");
    if (!rc) rc = engine_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, N_VOCAB);
    if (!rc)
        rc = engine_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", ENGINE_GGUF_INT32, types,
                                        dmg == DAMAGE_TYPES_SHORT ? N_VOCAB - 1 : N_VOCAB);
    if (!rc) rc = engine_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, NULL, 2);
    if (!rc) rc = engine_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", dmg == DAMAGE_EOS ? 5000 : 260);
    if (!rc) rc = engine_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 258);
    if (!rc) rc = engine_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    if (!rc) rc = engine_gguf_writer_set_str(w, "tokenizer.chat_template", "{{ messages }}");
    /* tensors: random values, norms near 1 */
    if (!rc) rc = engine_arch_tensors(&hp, &desc, &n_desc);
    if (!rc && !(data = calloc(n_desc, sizeof(void *)))) rc = ENGINE_ENOMEM;
    for (size_t i = 0; i < n_desc && !rc; i++) {
        engine_tensor_desc *d = &desc[i];
        int64_t n = d->ne[0] * d->ne[1] * d->ne[2] * d->ne[3];
        engine_type t = d->is_norm ? ENGINE_TYPE_F32 : type;
        float *f = malloc(sizeof(float) * (size_t)n);
        data[i] = malloc(engine_type_row_size(t, d->ne[0]) * (size_t)(n / d->ne[0]));
        if (!f || !data[i]) {
            free(f);
            rc = ENGINE_ENOMEM;
            break;
        }
        float scale = 1.0f / sqrtf((float)d->ne[0]);
        for (int64_t k = 0; k < n; k++) f[k] = d->is_norm ? 1.0f + 0.1f * frand() : frand() * scale * 1.7f;
        rc = engine_quantize_row(t, f, data[i], n);
        free(f);
        if (!rc && dmg == DAMAGE_TYPE && !strcmp(d->name, "blk.0.attn_q.weight")) {
            t = ENGINE_TYPE_Q4_1; /* 20 bytes per 32 values: fits in the F32 buffer; zeros */
            memset(data[i], 0, engine_type_row_size(t, d->ne[0]) * (size_t)(n / d->ne[0]));
        }
        int64_t r = rc ? rc : engine_gguf_writer_add_tensor(w, d->name, t, d->n_dims, d->ne, data[i]);
        if (r < 0) rc = (int)r;
    }
    if (!rc) rc = engine_gguf_writer_write(w, path, NULL, NULL, 1);
    for (size_t i = 0; data && i < n_desc; i++) free(data[i]);
    free(data);
    free(desc);
    engine_gguf_writer_free(w);
    return rc;
}

static void check_runs(const char *path, const char *what) {
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.n_threads = 2;
    engine_model *m = NULL;
    CHECK(engine_model_load(&m, path, &mp) == 0);
    if (!m) return;
    CHECK(engine_model_n_vocab(m) == N_VOCAB);
    int32_t ids[32];
    size_t n = 0;
    CHECK(engine_model_tokenize(m, "<|im_start|>the tea", 19, true, ids, 32, &n) == 0);
    /* <|im_start|>, t, he, " t", e, a (byte b is token b here) */
    const int32_t want[6] = {259, 't', 257, 256, 'e', 'a'};
    CHECK(n == 6 && memcmp(ids, want, sizeof want) == 0);
    CHECK(engine_model_token_is_eog(m, 260) && engine_model_token_eos(m) == 260);
    engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
    sp.n_batch = 4;
    sp.kv_type = ENGINE_KV_F32;
    engine_session *a = NULL, *b = NULL;
    CHECK(engine_session_new(&a, m, &sp) == 0);
    sp.n_batch = 1;
    CHECK(engine_session_new(&b, m, &sp) == 0);
    if (a && b) {
        float *all = malloc(sizeof(float) * n * N_VOCAB), one[N_VOCAB];
        CHECK(engine_session_append(a, ids, n, all) == 0);
        bool same = true, finite = true;
        for (size_t t = 0; t < n; t++) {
            CHECK(engine_session_append(b, &ids[t], 1, one) == 0);
            if (memcmp(one, all + t * N_VOCAB, sizeof one) != 0) same = false;
            for (int i = 0; i < N_VOCAB; i++)
                if (!isfinite(one[i])) finite = false;
        }
        if (!same) fprintf(stderr, "%s: batch and token-by-token differ\n", what);
        CHECK(same && finite);
        free(all);
        engine_gen_params gp = ENGINE_GEN_PARAMS_INIT;
        gp.prompt = ids;
        gp.n_prompt = n;
        gp.max_tokens = 20;
        gp.sampling.seed = 1;
        engine_gen_stats st;
        CHECK(engine_generate(a, &gp, NULL, NULL, &st) == 0);
        CHECK(st.generated_tokens >= 1 && st.cached_tokens == (int32_t)n - 1);
    }
    engine_session_free(a);
    engine_session_free(b);
    engine_model_free(m);
}

int main(int argc, char **argv) {
    const char *corpus = argc == 3 && !strcmp(argv[1], "--write-corpus") ? argv[2] : NULL;
    char dir[] = "/tmp/spark_test_small_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    struct {
        const char *name;
        engine_arch arch;
        engine_type type;
        damage dmg;
    } cases[] = {
        {"qwen3-f32", ENGINE_ARCH_QWEN3, ENGINE_TYPE_F32, DAMAGE_NONE}, /* not in the corpus */
        {"qwen3-f16", ENGINE_ARCH_QWEN3, ENGINE_TYPE_F16, DAMAGE_NONE},
        {"qwen3moe-q8_0", ENGINE_ARCH_QWEN3MOE, ENGINE_TYPE_Q8_0, DAMAGE_NONE},
        {"qwen3moe-q4_0", ENGINE_ARCH_QWEN3MOE, ENGINE_TYPE_Q4_0, DAMAGE_NONE},
        {"no-tokenizer-model", ENGINE_ARCH_QWEN3, ENGINE_TYPE_Q8_0, DAMAGE_NO_MODEL},
        {"token-types-short", ENGINE_ARCH_QWEN3, ENGINE_TYPE_Q8_0, DAMAGE_TYPES_SHORT},
        {"bad-merge", ENGINE_ARCH_QWEN3, ENGINE_TYPE_Q8_0, DAMAGE_BAD_MERGE},
        {"eos-out-of-range", ENGINE_ARCH_QWEN3, ENGINE_TYPE_Q8_0, DAMAGE_EOS},
        {"arch-llama", ENGINE_ARCH_QWEN3, ENGINE_TYPE_Q8_0, DAMAGE_ARCH},
        {"type-q4_1", ENGINE_ARCH_QWEN3, ENGINE_TYPE_F32, DAMAGE_TYPE}, /* not in the corpus */
    };
    const char *expect_in_error[] = {NULL, NULL, NULL, NULL, "tokenizer.ggml.model",
                                     "tokenizer.ggml.token_type", "merge 1",
                                     "tokenizer.ggml.eos_token_id", "llama",
                                     "blk.0.attn_q.weight"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[4200];
        /* the corpus stays small: no F32 models */
        bool to_corpus = corpus && cases[i].type != ENGINE_TYPE_F32;
        snprintf(path, sizeof path, "%s/%s.gguf", to_corpus ? corpus : dir, cases[i].name);
        CHECK(write_model(path, cases[i].arch, cases[i].type, cases[i].dmg) == 0);
        if (cases[i].dmg == DAMAGE_NONE) {
            check_runs(path, cases[i].name);
        } else {
            engine_model *m = NULL;
            int rc = engine_model_load(&m, path, NULL);
            if (cases[i].dmg == DAMAGE_ARCH || cases[i].dmg == DAMAGE_TYPE)
                CHECK(rc == ENGINE_EUNSUPPORTED);
            else
                CHECK(rc == ENGINE_EFORMAT || rc == ENGINE_EUNSUPPORTED);
            CHECK(m == NULL);
            if (!strstr(engine_error_last(), expect_in_error[i]))
                fprintf(stderr, "%s: error \"%s\" does not name %s\n", cases[i].name,
                        engine_error_last(), expect_in_error[i]);
            CHECK(strstr(engine_error_last(), expect_in_error[i]) != NULL);
            if (cases[i].dmg == DAMAGE_ARCH) { /* the tokenizer of any architecture still loads */
                engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
                mp.vocab_only = true;
                CHECK(engine_model_load(&m, path, &mp) == 0);
                engine_model_free(m);
            }
        }
        if (!to_corpus) unlink(path);
    }
    rmdir(dir);
    return support_finish("test_forward_small");
}
