/* Persisted prefixes (engine/kv/persist.c) on the tiny random model with an F16 prefix cache:
 *   - save computes the missing blocks once, pins them (pins nest, unpin undoes them), and a
 *     second save computes nothing;
 *   - a fresh model that loads the file serves the prefix from it: the logits equal those of
 *     the model that computed the prefix bit for bit, those of a cold session without a prefix
 *     cache within 1e-5, and greedy generation gives the same tokens;
 *   - a truncated, extended, bit-flipped or crafted file, another model (same KV layout),
 *     another KV type, other tokens, a pool too small, a model without a prefix cache: a clear
 *     error naming the problem and nothing inserted (the pool's stats unchanged);
 *   - the model fingerprint sees a byte changed in a sampled data page;
 *   - atomic writes: a save that runs out of file-size limit leaves the old file intact and no
 *     temporary behind, and loads racing with repeated saves never see a partial file;
 *   - engine_prefix_default_path: under $XDG_CACHE_HOME/spark-agent/prefixes, one name per
 *     model and prefix;
 *   - Q8_0 KV: save/load gives the saving model's logits bit for bit and a cold Q8_0 session's
 *     tokens; F16 and Q8_0 pools refuse each other's files naming both types.
 * `test_prefix_persist --write-corpus DIR` writes the seed corpus of fuzz_prefix_load (files
 * for the default model). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine.h"
#include "kv/kv.h"
#include "model/model_int.h"
#include "support.h"

#define HDR ENGINE_KV_PERSIST_HEADER_BYTES
#define N_PRE 70    /* prefix tokens given: 64 saved (4 blocks of 16) */
#define N_FULL 64
#define N_PROMPT 100

static char dir[256];
static int32_t n_vocab;

static engine_model *load_cached_kv(const char *path, size_t cache_bytes, engine_kv_type kv) {
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.kv_type = kv;
    mp.n_threads = 1; /* no worker threads: the fork tests below stay simple */
    mp.n_ctx = 256;
    mp.device = ENGINE_DEVICE_CPU; /* the prefix cache serves CPU sessions */
    mp.prefix_cache_bytes = cache_bytes;
    engine_model *m = NULL;
    if (engine_model_load(&m, path, &mp) != 0) support_fail("load %s: %s", path, engine_error_last());
    return m;
}

static engine_model *load_cached(const char *path, size_t cache_bytes) {
    return load_cached_kv(path, cache_bytes, ENGINE_KV_F16);
}

static void stats(engine_model *m, engine_kv_stats *st) {
    engine_kv_cache_stats(m->kvc, st);
}

static bool same_stats(const engine_kv_stats *a, const engine_kv_stats *b) {
    return a->n_free == b->n_free && a->n_used == b->n_used && a->n_cached == b->n_cached &&
           a->n_pinned == b->n_pinned && a->n_nodes == b->n_nodes;
}

static char *read_file(const char *path, size_t *len) {
    char *b = support_slurp(path, len);
    if (!b) support_fail("cannot read %s: %s", path, strerror(errno));
    return b;
}

static int write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(p, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

/* logits after the whole prompt on a session of m (n_vocab floats, malloc'd) */
static float *prompt_logits(engine_model *m, const int32_t *prompt, int32_t *cached) {
    engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
    sp.n_ctx = 256;
    sp.n_batch = 24;
    engine_session *s = NULL;
    float *out = malloc(sizeof(float) * (size_t)n_vocab);
    CHECK(engine_session_new(&s, m, &sp) == 0);
    if (!s || !out) {
        engine_session_free(s);
        free(out);
        return NULL;
    }
    CHECK(engine_session_append(s, prompt, N_PROMPT, NULL) == 0);
    if (cached) *cached = s->kv_cached;
    memcpy(out, engine_session_logits(s), sizeof(float) * (size_t)n_vocab);
    engine_session_free(s);
    return out;
}

static void greedy(engine_model *m, const int32_t *prompt, int32_t *out, int n) {
    engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
    sp.n_ctx = 256;
    engine_session *s = NULL;
    CHECK(engine_session_new(&s, m, &sp) == 0);
    if (!s) return;
    engine_gen_params gp = ENGINE_GEN_PARAMS_INIT;
    gp.prompt = prompt;
    gp.n_prompt = N_PROMPT;
    gp.max_tokens = n;
    gp.ignore_eog = true;
    gp.sampling.temperature = 0;
    CHECK(engine_generate(s, &gp, NULL, NULL, NULL) == 0);
    CHECK(engine_session_n_tokens(s) == N_PROMPT + n);
    memcpy(out, engine_session_tokens(s) + N_PROMPT, sizeof(int32_t) * (size_t)n);
    engine_session_free(s);
}

/* Load `path` into m expecting error `code` with `needle` in the message and no change to the
 * pool. */
static void expect_refused(engine_model *m, const char *path, const int32_t *toks, size_t n,
                           int code, const char *needle, const char *what) {
    engine_kv_stats before, after;
    stats(m, &before);
    engine_prefix_info info;
    int rc = engine_prefix_load(m, path, toks, n, &info);
    stats(m, &after);
    const char *msg = engine_error_last();
    if (rc != code || !strstr(msg, needle) || !same_stats(&before, &after) || info.n_tokens)
        support_fail("%s: load gave %d (want %d), message \"%s\" (want \"%s\"), pool %s", what, rc,
                     code, msg, needle, same_stats(&before, &after) ? "unchanged" : "CHANGED");
}

/* Write a variant of the good file and expect it refused. */
static void variant(engine_model *m, const char *good, size_t len, size_t cut, long flip,
                    const void *append, int code, const char *needle, const char *what) {
    char path[512];
    snprintf(path, sizeof path, "%s/variant.kvp", dir);
    char *b = malloc(len + 1);
    memcpy(b, good, len);
    if (flip >= 0) b[flip] ^= 0x10;
    size_t n = cut < len ? cut : len;
    if (append) b[n++] = *(const char *)append;
    CHECK(write_file(path, b, n) == 0);
    expect_refused(m, path, NULL, 0, code, needle, what);
    free(b);
    unlink(path);
}

/* A crafted file: the good one with a header field changed and the hashes made to fit again, so
 * the check of that field itself is what refuses it. */
static void crafted(engine_model *m, const char *good, size_t len, size_t off, uint64_t value,
                    int width, int code, const char *needle, const char *what) {
    char path[512];
    snprintf(path, sizeof path, "%s/crafted.kvp", dir);
    char *b = malloc(len);
    memcpy(b, good, len);
    if (width == 4) {
        uint32_t v = (uint32_t)value;
        memcpy(b + off, &v, 4);
    } else {
        memcpy(b + off, &value, 8);
    }
    if (off >= HDR) { /* a token: fix the tokens' hash */
        uint64_t th = engine_kv_persist_hash(b + HDR, N_FULL * 4, ENGINE_KV_PERSIST_SEED_TOKENS);
        memcpy(b + 80, &th, 8);
    }
    uint64_t hh = engine_kv_persist_hash(b, 120, ENGINE_KV_PERSIST_SEED_HEADER);
    memcpy(b + 120, &hh, 8);
    CHECK(write_file(path, b, len) == 0);
    expect_refused(m, path, NULL, 0, code, needle, what);
    free(b);
    unlink(path);
}

static int count_temporaries(void) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, ".kvp.")) n++;
    if (d) closedir(d);
    return n;
}

static void test_errors(const char *model_path, const char *other_path, const char *file,
                        const int32_t *pre, const int32_t *other_pre) {
    engine_model *e = load_cached(model_path, 2u << 20);
    if (!e) return;
    size_t len = 0;
    char *good = read_file(file, &len);
    if (!good) goto out;
    CHECK(len == HDR + N_FULL * 4 + 4 * (size_t)e->kvc->p.n_layer * 2 * e->kvc->block_rows_bytes);

    /* truncations, a trailing byte, bit flips: damaged files */
    variant(e, good, len, 0, -1, NULL, ENGINE_EFORMAT, "truncated", "empty file");
    variant(e, good, len, 7, -1, NULL, ENGINE_EFORMAT, "truncated", "7 bytes");
    variant(e, good, len, HDR - 1, -1, NULL, ENGINE_EFORMAT, "truncated", "header - 1");
    variant(e, good, len, HDR, -1, NULL, ENGINE_EFORMAT, "truncated", "header only");
    variant(e, good, len, HDR + 100, -1, NULL, ENGINE_EFORMAT, "truncated", "inside the tokens");
    variant(e, good, len, len / 2, -1, NULL, ENGINE_EFORMAT, "truncated", "half");
    variant(e, good, len, len - 1, -1, NULL, ENGINE_EFORMAT, "truncated", "last byte missing");
    variant(e, good, len, len, -1, "x", ENGINE_EFORMAT, "trailing bytes", "one byte more");
    variant(e, good, len, len, 0, NULL, ENGINE_EFORMAT, "bad magic", "flip in the magic");
    variant(e, good, len, len, 8, NULL, ENGINE_EUNSUPPORTED, "version", "flip in the version");
    variant(e, good, len, len, 12, NULL, ENGINE_EFORMAT, "header size", "flip in header size");
    long header_flips[] = {17, 33, 41, 53, 57, 66, 73, 81, 90, 100, 121};
    for (size_t i = 0; i < sizeof header_flips / sizeof *header_flips; i++)
        variant(e, good, len, len, header_flips[i], NULL, ENGINE_EFORMAT, "header is damaged",
                "flip in the header");
    variant(e, good, len, len, HDR + 5, NULL, ENGINE_EFORMAT, "token ids are damaged",
            "flip in a token");
    long payload_flips[] = {HDR + N_FULL * 4, (long)len / 2 + 3, (long)len - 1};
    for (size_t i = 0; i < 3; i++)
        variant(e, good, len, len, payload_flips[i], NULL, ENGINE_EFORMAT, "KV data is damaged",
                "flip in the KV data");

    /* crafted headers whose hash fits: each field's own check */
    crafted(e, good, len, 8, 2, 4, ENGINE_EUNSUPPORTED, "version 2", "version 2");
    crafted(e, good, len, 16, 12345, 8, ENGINE_EINVAL, "another model", "fingerprint");
    crafted(e, good, len, 32, ENGINE_KV_F32, 4, ENGINE_EINVAL, "KV type f32", "type");
    crafted(e, good, len, 32, 7, 4, ENGINE_EINVAL, "KV type unknown", "type 7");
    crafted(e, good, len, 40, 5, 4, ENGINE_EINVAL, "KV layout", "n_layer");
    crafted(e, good, len, 36, 32, 4, ENGINE_EINVAL, "KV layout", "block size");
    crafted(e, good, len, 64, 1, 8, ENGINE_EFORMAT, "row size", "row bytes");
    crafted(e, good, len, 52, 65, 4, ENGINE_EFORMAT, "65 tokens in 4 blocks", "n_tokens");
    crafted(e, good, len, 56, 0, 4, ENGINE_EFORMAT, "in 0 blocks", "no blocks");
    crafted(e, good, len, 72, 1, 8, ENGINE_EFORMAT, "payload", "payload bytes");
    crafted(e, good, len, 60, 1, 4, ENGINE_EFORMAT, "reserved", "reserved field");
    crafted(e, good, len, 100, 1, 4, ENGINE_EFORMAT, "reserved", "reserved bytes");
    crafted(e, good, len, HDR + 8, (uint64_t)n_vocab, 4, ENGINE_EFORMAT, "out of range",
            "token id = n_vocab");
    crafted(e, good, len, HDR + 8, (uint64_t)-1, 4, ENGINE_EFORMAT, "out of range",
            "token id -1");
    {   /* 1,000 blocks (tokens to match): more than the pool has */
        char path[512];
        snprintf(path, sizeof path, "%s/crafted.kvp", dir);
        char *b = malloc(len);
        memcpy(b, good, len);
        uint32_t nt = 16000, nb = 1000;
        memcpy(b + 52, &nt, 4);
        memcpy(b + 56, &nb, 4);
        uint64_t hh = engine_kv_persist_hash(b, 120, ENGINE_KV_PERSIST_SEED_HEADER);
        memcpy(b + 120, &hh, 8);
        CHECK(write_file(path, b, len) == 0);
        expect_refused(e, path, NULL, 0, ENGINE_ENOMEM, "holds 1000 KV blocks", "1000 blocks");
        free(b);
        unlink(path);
    }

    /* not there / not a file */
    char path[512];
    snprintf(path, sizeof path, "%s/missing.kvp", dir);
    expect_refused(e, path, NULL, 0, ENGINE_EIO, "cannot open", "missing file");
    expect_refused(e, dir, NULL, 0, ENGINE_EIO, "not a regular file", "a directory");

    /* other tokens expected than the file holds */
    expect_refused(e, file, other_pre, N_PRE, ENGINE_EINVAL, "another prefix", "other tokens");
    expect_refused(e, file, pre, 50, ENGINE_EINVAL, "not the 48 expected", "shorter prefix");
    expect_refused(e, file, pre, 90, ENGINE_EINVAL, "not the 80 expected", "longer prefix");

    /* another model of the same KV layout (dense qwen3-tiny: 4 layers x 2 heads x 64) */
    engine_model *o = load_cached(other_path, 2u << 20);
    if (o) {
        CHECK(o->kvc->row_bytes == e->kvc->row_bytes && o->kvc->p.n_layer == e->kvc->p.n_layer);
        expect_refused(o, file, NULL, 0, ENGINE_EINVAL, "another model", "another model");
        engine_model_free(o);
    }
    /* a pool of 3 blocks cannot take 4 */
    engine_model *small =
        load_cached(model_path, 3 * (size_t)e->kvc->p.n_layer * 2 * e->kvc->block_rows_bytes);
    if (small) {
        CHECK(small->kvc->n_blocks == 3);
        expect_refused(small, file, NULL, 0, ENGINE_ENOMEM, "3 in all", "pool too small");
        engine_model_free(small);
    }
    /* an F32 pool (engine-private switch) */
    engine_model *f32 = load_cached(model_path, 0);
    if (f32) {
        CHECK(engine_kv_model_enable(f32, 2u << 20, ENGINE_KV_F32) == 0);
        expect_refused(f32, file, NULL, 0, ENGINE_EINVAL, "KV type f16", "f32 pool");
        engine_model_free(f32);
    }
    /* no prefix cache at all */
    engine_model *none = load_cached(model_path, 0);
    if (none) {
        CHECK(engine_prefix_load(none, file, NULL, 0, NULL) == ENGINE_EINVAL &&
              strstr(engine_error_last(), "no prefix cache"));
        CHECK(engine_prefix_save(none, pre, N_PRE, file, NULL) == ENGINE_EINVAL);
        engine_model_free(none);
    }
    /* bad save arguments: nothing pinned, nothing written */
    engine_kv_stats before, after;
    stats(e, &before);
    snprintf(path, sizeof path, "%s/never.kvp", dir);
    CHECK(engine_prefix_save(e, pre, 15, path, NULL) == ENGINE_EINVAL &&
          strstr(engine_error_last(), "fewer than one KV block"));
    int32_t bad[N_PRE];
    memcpy(bad, pre, sizeof bad);
    bad[20] = n_vocab;
    CHECK(engine_prefix_save(e, bad, N_PRE, path, NULL) == ENGINE_EINVAL &&
          strstr(engine_error_last(), "index 20"));
    CHECK(engine_prefix_save(e, pre, N_PRE, NULL, NULL) == ENGINE_EINVAL);
    stats(e, &after);
    CHECK(same_stats(&before, &after));
    CHECK(access(path, F_OK) != 0);
    /* an unwritable place: EIO, and the computed blocks stay cached but not pinned */
    CHECK(engine_prefix_save(e, pre, N_PRE, "/nonexistent-dir/p.kvp", NULL) == ENGINE_EIO &&
          strstr(engine_error_last(), "/nonexistent-dir/p.kvp"));
    stats(e, &after);
    CHECK(after.n_pinned == 0 && after.n_nodes == 4);
    CHECK(engine_prefix_unpin(e, pre, N_PRE) == ENGINE_EINVAL);
out:
    free(good);
    engine_model_free(e);
}

/* Atomic replacement: a save cut short by RLIMIT_FSIZE, and loads racing with saves. */
static void test_atomic(engine_model *a, const char *model_path, const char *file,
                        const int32_t *pre) {
    size_t len0 = 0;
    char *before = read_file(file, &len0);
    if (!before) return;
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {len0 / 2, len0 / 2};
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(3);
        int rc = engine_prefix_save(a, pre, N_PRE, file, NULL);
        _exit(rc == ENGINE_EIO && strstr(engine_error_last(), "cannot write") ? 0 : 4);
    }
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    size_t len1 = 0;
    char *after = read_file(file, &len1);
    CHECK(after && len1 == len0 && memcmp(before, after, len0) == 0);
    CHECK(count_temporaries() == 0);
    free(before);
    free(after);

    /* a child saves 40 times over the file while we load it */
    engine_model *b = load_cached(model_path, 2u << 20);
    if (!b) return;
    pid = fork();
    if (pid == 0) {
        for (int i = 0; i < 40; i++)
            if (engine_prefix_save(a, pre, N_PRE, file, NULL) != 0) _exit(5);
        _exit(0);
    }
    int loads = 0, bad = 0;
    for (;;) {
        int done = waitpid(pid, &st, WNOHANG) == pid;
        int rc = engine_prefix_load(b, file, pre, N_PRE, NULL);
        if (rc == 0) {
            loads++;
            CHECK(engine_prefix_unpin(b, pre, N_PRE) == 0);
        } else if (bad++ < 3) {
            support_fail("load during saves: %d %s", rc, engine_error_last());
        }
        if (done) break;
    }
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(loads >= 1 && bad == 0);
    CHECK(count_temporaries() == 0);
    printf("atomic: %d loads raced with 40 saves, none saw a partial file\n", loads);
    engine_model_free(b);
}

/* The fingerprint changes with one byte of a sampled data page. */
static void test_fingerprint(const char *model_path, const char *file) {
    char copy[512];
    snprintf(copy, sizeof copy, "%s/patched.gguf", dir);
    size_t len = 0;
    char *b = read_file(model_path, &len);
    engine_model *m = load_cached(model_path, 0);
    if (!b || !m) goto out;
    uint64_t off = engine_gguf_data_offset(m->gguf);
    engine_model_free(m);
    m = NULL;
    b[off] ^= 1; /* the first sampled page: a weight of the first tensor */
    CHECK(write_file(copy, b, len) == 0);
    m = load_cached(copy, 2u << 20);
    if (m) expect_refused(m, file, NULL, 0, ENGINE_EINVAL, "another model", "patched weight");
out:
    engine_model_free(m);
    free(b);
    unlink(copy);
}

static void make_prompt(int32_t *p, uint32_t mul, uint32_t add) {
    for (int i = 0; i < N_PROMPT; i++)
        p[i] = (int32_t)(((uint32_t)i * mul + add) % (uint32_t)(n_vocab - 1)) + 1;
}

/* The fuzz seed corpus: a good file for the default model and a few damaged ones. */
static int write_corpus(const char *out) {
    char path[4096];
    if (engine_default_model_path(path, sizeof path) != 0) {
        fprintf(stderr, "default model: %s\n", engine_error_last());
        return 1;
    }
    engine_model *m = load_cached(path, 1u << 20);
    if (!m) return 1;
    n_vocab = engine_model_n_vocab(m);
    int32_t p[N_PROMPT];
    make_prompt(p, 7919, 13);
    char f[4600];
    snprintf(f, sizeof f, "%s/one-block.kvp", out);
    int rc = engine_prefix_save(m, p, 16, f, NULL);
    snprintf(f, sizeof f, "%s/two-blocks.kvp", out);
    if (!rc) rc = engine_prefix_save(m, p, 40, f, NULL);
    size_t len = 0;
    char *g = rc ? NULL : support_slurp(f, &len);
    if (g) {
        snprintf(f, sizeof f, "%s/header-only.kvp", out);
        write_file(f, g, HDR);
        snprintf(f, sizeof f, "%s/tokens-only.kvp", out);
        write_file(f, g, HDR + 32 * 4);
        g[HDR + 32 * 4 + 77] ^= 4;
        snprintf(f, sizeof f, "%s/flipped-data.kvp", out);
        write_file(f, g, len);
        free(g);
    }
    engine_model_free(m);
    if (rc) fprintf(stderr, "save: %s\n", engine_error_last());
    return rc ? 1 : 0;
}

/* Q8_0 KV (engine_model_params.kv_type): save on one model, load into a fresh one; the loaded
 * prefix gives the logits and greedy tokens of the saving model and of a cold Q8_0 session;
 * the file records the type, so F16 and Q8_0 pools refuse each other's files. */
static void test_q8(const char *model_path, const char *f16_file, const int32_t *prompt) {
    char file[600];
    snprintf(file, sizeof file, "%s/prefix-q8_0.kvp", dir);
    engine_model *a = load_cached_kv(model_path, 1u << 20, ENGINE_KV_Q8_0);
    engine_model *b = load_cached_kv(model_path, 1u << 20, ENGINE_KV_Q8_0);
    engine_model *cold = load_cached_kv(model_path, 0, ENGINE_KV_Q8_0);
    engine_model *f16 = load_cached(model_path, 2u << 20);
    float *la = NULL, *lb = NULL, *lc = NULL;
    if (!a || !b || !cold || !f16) goto out;
    engine_prefix_info info;
    engine_kv_stats st;
    CHECK(engine_prefix_save(a, prompt, N_PRE, file, &info) == 0);
    /* 4 blocks x 4 layers x K,V x 16 rows x (2 heads x 2 blocks of 34 bytes) */
    CHECK(info.n_blocks == 4 && info.file_bytes == HDR + N_FULL * 4 + 4 * 4 * 2 * 16 * 136);
    int32_t cached = -1;
    la = prompt_logits(a, prompt, &cached);
    CHECK(cached == N_FULL);
    CHECK(engine_prefix_load(b, file, prompt, N_PRE, &info) == 0 && info.inserted_blocks == 4);
    lb = prompt_logits(b, prompt, &cached);
    CHECK(cached == N_FULL);
    lc = prompt_logits(cold, prompt, NULL);
    if (la && lb && lc) {
        CHECK(memcmp(la, lb, sizeof(float) * (size_t)n_vocab) == 0);
        double d = support_max_abs_diff(lb, lc, n_vocab);
        printf("q8_0: loaded prefix vs cold: largest logit difference %g\n", d);
        CHECK(d <= 1e-5);
    }
    int32_t gb[8], gc[8];
    greedy(b, prompt, gb, 8);
    greedy(cold, prompt, gc, 8);
    CHECK(memcmp(gb, gc, sizeof gb) == 0);
    /* the type is part of the file and is checked */
    expect_refused(f16, file, NULL, 0, ENGINE_EINVAL, "KV type q8_0", "q8_0 file, f16 pool");
    stats(b, &st);
    CHECK(engine_prefix_load(b, f16_file, NULL, 0, NULL) == ENGINE_EINVAL &&
          strstr(engine_error_last(), "KV type f16") && strstr(engine_error_last(), "q8_0"));
    engine_kv_stats st2;
    stats(b, &st2);
    CHECK(same_stats(&st, &st2));
    CHECK(engine_prefix_unpin(a, prompt, N_PRE) == 0 && engine_prefix_unpin(b, prompt, N_PRE) == 0);
out:
    free(la);
    free(lb);
    free(lc);
    engine_model_free(a);
    engine_model_free(b);
    engine_model_free(cold);
    engine_model_free(f16);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--write-corpus")) return write_corpus(argv[2]);
    int skip = support_init();
    if (skip) return skip;
    if (support_tmpdir(dir, sizeof dir, "test_prefix", false) != 0) return 1;
    char model_path[512], other_path[512], file[512];
    snprintf(model_path, sizeof model_path, "%s/tiny-q8_0.gguf", dir);
    snprintf(other_path, sizeof other_path, "%s/qwen3-tiny-q8_0.gguf", dir);
    snprintf(file, sizeof file, "%s/prefix.kvp", dir);
    engine_model *a = NULL, *b = NULL, *cold = NULL;
    float *la = NULL, *lb = NULL, *lc = NULL;
    if (support_gen("tiny", "q8_0", 21, model_path) || support_gen("qwen3-tiny", "q8_0", 21,
                                                                   other_path)) {
        support_failures++;
        goto out;
    }
    a = load_cached(model_path, 2u << 20); /* 64 blocks of 32 KiB */
    if (!a) goto out;
    n_vocab = engine_model_n_vocab(a);
    int32_t prompt[N_PROMPT], other[N_PROMPT];
    make_prompt(prompt, 7919, 13);
    make_prompt(other, 104729, 5);

    /* save: computes the 4 blocks, pins them; again: computes nothing; pins nest */
    engine_prefix_info info;
    engine_kv_stats st;
    CHECK(engine_prefix_save(a, prompt, N_PRE, file, &info) == 0);
    CHECK(info.n_tokens == N_FULL && info.n_blocks == 4 && info.computed_tokens == N_FULL);
    CHECK(info.file_bytes == HDR + N_FULL * 4 + 4 * 4 * 2 * 16 * 256);
    stats(a, &st);
    CHECK(st.n_pinned == 4 && st.n_nodes == 4 && st.n_used == 0);
    CHECK(engine_prefix_save(a, prompt, N_PRE, file, &info) == 0 && info.computed_tokens == 0);
    CHECK(engine_prefix_unpin(a, prompt, N_PRE) == 0);
    stats(a, &st);
    CHECK(st.n_pinned == 4);
    CHECK(engine_prefix_unpin(a, prompt, N_PRE) == 0);
    stats(a, &st);
    CHECK(st.n_pinned == 0 && st.n_nodes == 4);
    CHECK(engine_prefix_unpin(a, prompt, N_PRE) == ENGINE_EINVAL);
    CHECK(engine_prefix_save(a, prompt, N_PRE, file, &info) == 0 && info.computed_tokens == 0);
    CHECK(count_temporaries() == 0);

    /* the reference logits: the model that computed the prefix, and a cold session */
    int32_t cached = -1;
    la = prompt_logits(a, prompt, &cached);
    CHECK(cached == N_FULL);
    cold = load_cached(model_path, 0);
    if (cold) lc = prompt_logits(cold, prompt, NULL);

    /* a fresh model loads the file: the prompt takes its first 64 positions from it */
    b = load_cached(model_path, 2u << 20);
    if (!b || !la || !lc) goto out;
    stats(b, &st);
    CHECK(st.n_nodes == 0);
    CHECK(engine_prefix_load(b, file, prompt, N_PRE, &info) == 0);
    CHECK(info.n_tokens == N_FULL && info.n_blocks == 4 && info.inserted_blocks == 4);
    stats(b, &st);
    CHECK(st.n_pinned == 4 && st.n_nodes == 4 && st.n_used == 0);
    lb = prompt_logits(b, prompt, &cached);
    CHECK(cached == N_FULL);
    if (lb) {
        CHECK(memcmp(la, lb, sizeof(float) * (size_t)n_vocab) == 0);
        double d = support_max_abs_diff(lb, lc, n_vocab);
        printf("loaded prefix vs cold: largest logit difference %g\n", d);
        CHECK(d <= 1e-5);
        CHECK(support_argmax(lb, n_vocab) == support_argmax(lc, n_vocab));
    }
    int32_t gb[8], gc[8];
    greedy(b, prompt, gb, 8);
    greedy(cold, prompt, gc, 8);
    CHECK(memcmp(gb, gc, sizeof gb) == 0);
    /* loading again: already cached, nothing inserted, the pin nests */
    CHECK(engine_prefix_load(b, file, NULL, 0, &info) == 0 && info.inserted_blocks == 0 &&
          info.n_tokens == N_FULL);
    CHECK(engine_prefix_unpin(b, prompt, N_PRE) == 0 && engine_prefix_unpin(b, prompt, N_PRE) == 0);
    stats(b, &st);
    CHECK(st.n_pinned == 0);

    /* default path: one name per model and prefix, under the XDG cache */
    {
        char cache[400], p1[4096], p2[4096], p3[4096], p4[4096];
        snprintf(cache, sizeof cache, "%s/cache", dir);
        setenv("XDG_CACHE_HOME", cache, 1);
        CHECK(engine_prefix_default_path(a, prompt, N_PRE, p1, sizeof p1) == 0);
        CHECK(engine_prefix_default_path(b, prompt, N_FULL, p2, sizeof p2) == 0);
        CHECK(engine_prefix_default_path(a, other, N_PRE, p3, sizeof p3) == 0);
        CHECK(!strcmp(p1, p2) && strcmp(p1, p3));
        CHECK(!strncmp(p1, cache, strlen(cache)) && strstr(p1, "/spark-agent/prefixes/") &&
              strlen(strrchr(p1, '/')) == 1 + 32 + 4);
        engine_model *o = load_cached(other_path, 2u << 20);
        if (o) {
            CHECK(engine_prefix_default_path(o, prompt, N_PRE, p4, sizeof p4) == 0 &&
                  strcmp(p1, p4));
            engine_model_free(o);
        }
        struct stat sb;
        *strrchr(p1, '/') = '\0';
        CHECK(stat(p1, &sb) == 0 && S_ISDIR(sb.st_mode));
        CHECK(engine_prefix_default_path(a, prompt, N_PRE, p2, 20) == ENGINE_ERANGE);
        CHECK(engine_prefix_default_path(a, prompt, 8, p2, sizeof p2) == ENGINE_EINVAL);
    }

    test_q8(model_path, file, prompt);
    test_errors(model_path, other_path, file, prompt, other);
    test_fingerprint(model_path, file);
    test_atomic(a, model_path, file, prompt);
out:
    free(la);
    free(lb);
    free(lc);
    engine_model_free(a);
    engine_model_free(b);
    engine_model_free(cold);
    support_rmtree(dir);
    return support_finish("test_prefix_persist");
}
