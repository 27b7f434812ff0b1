/* Persisted prefixes for the hybrid qwen35moe (engine/kv/persist.c, format version 2: the
 * attention layers' KV plus the recurrent conv + DeltaNet state at the prefix's end). On the
 * tiny qwen35 preset:
 *   - save computes the prefix once (a second save computes nothing) and writes a version 2
 *     file of the expected size; a model that had the prefix cached without a snapshot at its
 *     end computes it and writes the same bytes;
 *   - a fresh model loads the file (its snapshot slot filled, the prefix pinned) and a prompt
 *     over the prefix hits it: its logits and greedy tokens equal a cold run's bit for bit;
 *   - a damaged state section (bit flip, truncation, a wrong state size in a header whose hash
 *     fits, a version 1 header) is refused with a clear error and the pool unchanged. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "kv/kv.h"
#include "model/model_int.h"
#include "support.h"

#define HDR ENGINE_KV_PERSIST_HEADER_BYTES
#define N_CTX 256
#define N_PRE 70 /* 64 saved: 4 blocks of 16 */
#define N_FULL 64
#define N_PROMPT 100
#define N_GEN 8

static int32_t n_vocab;
static char dir[256];

static engine_model *load(const char *path, size_t cache_bytes) {
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.device = ENGINE_DEVICE_CPU;
    mp.n_threads = 2;
    mp.n_ctx = N_CTX;
    mp.prefix_cache_bytes = cache_bytes;
    engine_model *m = NULL;
    if (engine_model_load(&m, path, &mp) != 0) support_fail("load %s: %s", path, engine_error_last());
    return m;
}

/* The prompt's logits (into lp) and n_gen greedy tokens; returns the positions from the cache. */
static int32_t run(engine_model *m, const int32_t *prompt, float *lp, int32_t *gen) {
    engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
    sp.n_ctx = N_CTX;
    sp.n_batch = 24;
    engine_session *s = NULL;
    CHECK(engine_session_new(&s, m, &sp) == 0);
    if (!s) return -1;
    CHECK(engine_session_append(s, prompt, N_PROMPT, NULL) == 0);
    int32_t cached = s->kv_cached;
    const float *l = engine_session_logits(s);
    CHECK(l != NULL);
    if (l) memcpy(lp, l, sizeof(float) * (size_t)n_vocab);
    for (int i = 0; i < N_GEN && l; i++) {
        gen[i] = support_argmax(engine_session_logits(s), n_vocab);
        CHECK(engine_session_append(s, &gen[i], 1, NULL) == 0);
    }
    engine_session_free(s);
    return cached;
}

static bool same_stats(const engine_kv_stats *a, const engine_kv_stats *b) {
    return a->n_free == b->n_free && a->n_used == b->n_used && a->n_cached == b->n_cached &&
           a->n_pinned == b->n_pinned && a->n_nodes == b->n_nodes &&
           a->n_snaps_used == b->n_snaps_used;
}

/* Write b (n bytes) and expect the load refused with code and needle, the pool unchanged. */
static void refused(engine_model *m, const char *b, size_t n, int code, const char *needle,
                    const char *what) {
    char path[512];
    snprintf(path, sizeof path, "%s/bad.kvp", dir);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(b, 1, n, f) == n);
    if (f) fclose(f);
    engine_kv_stats before, after;
    engine_kv_cache_stats(m->kvc, &before);
    engine_prefix_info info;
    int rc = engine_prefix_load(m, path, NULL, 0, &info);
    engine_kv_cache_stats(m->kvc, &after);
    const char *msg = engine_error_last();
    if (rc != code || !strstr(msg, needle) || !same_stats(&before, &after) || info.n_tokens)
        support_fail("%s: load gave %d (want %d), message \"%s\" (want \"%s\"), pool %s", what, rc,
                     code, msg, needle, same_stats(&before, &after) ? "unchanged" : "CHANGED");
    else
        printf("%s: refused: %s\n", what, msg);
    unlink(path);
}

static void refix_header(char *b) {
    uint64_t hh = engine_kv_persist_hash(b, 120, ENGINE_KV_PERSIST_SEED_HEADER);
    memcpy(b + 120, &hh, 8);
}

int main(void) {
    int rc = support_init();
    if (rc) return rc;
    setvbuf(stdout, NULL, _IONBF, 0);
    if (support_tmpdir(dir, sizeof dir, "prefix_persist_q35", false)) return 1;
    char path[512], file[512], file2[512];
    snprintf(path, sizeof path, "%s/q35.gguf", dir);
    snprintf(file, sizeof file, "%s/prefix.kvp", dir);
    snprintf(file2, sizeof file2, "%s/prefix2.kvp", dir);
    engine_model *a = NULL, *b = NULL, *c = NULL, *cold = NULL;
    float *lc = NULL, *lb = NULL;
    char *good = NULL, *bad = NULL, *good2 = NULL;
    if (support_gen("qwen35-tiny", "f32", 5, path)) {
        support_fail("cannot generate qwen35-tiny");
        goto out;
    }
    a = load(path, 8u << 20);
    cold = load(path, 0);
    if (!a || !cold) goto out;
    n_vocab = engine_model_n_vocab(a);
    lc = malloc(sizeof(float) * (size_t)n_vocab);
    lb = malloc(sizeof(float) * (size_t)n_vocab);
    int32_t prompt[N_PROMPT], gc[N_GEN], gb[N_GEN];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (int32_t)((i * 7919u + 13u) % (uint32_t)n_vocab);
    engine_kv_stats st;
    engine_kv_cache_stats(a->kvc, &st);
    size_t snap = st.snap_bytes;
    CHECK(st.n_snaps >= 1 && snap == engine_q35_snapshot_bytes(&a->hp));

    /* save: computes the 4 blocks and the state at position 64; again: nothing computed */
    engine_prefix_info info;
    CHECK(engine_prefix_save(a, prompt, N_PRE, file, &info) == 0);
    CHECK(info.n_tokens == N_FULL && info.n_blocks == 4 && info.computed_tokens == N_FULL);
    size_t kv_bytes = 4 * (size_t)a->kvc->p.n_layer * 2 * a->kvc->block_rows_bytes;
    CHECK(info.file_bytes == HDR + N_FULL * 4 + kv_bytes + snap);
    CHECK(engine_prefix_save(a, prompt, N_PRE, file, &info) == 0 && info.computed_tokens == 0);
    engine_kv_cache_stats(a->kvc, &st);
    CHECK(st.n_pinned == 4 && st.n_snaps_used >= 1);
    size_t len = 0;
    good = support_slurp(file, &len);
    CHECK(good && len == HDR + N_FULL * 4 + kv_bytes + snap);
    if (!good || len != HDR + N_FULL * 4 + kv_bytes + snap) goto out;
    uint32_t version;
    uint64_t state_bytes;
    memcpy(&version, good + 8, 4);
    memcpy(&state_bytes, good + 96, 8);
    CHECK(version == 2 && state_bytes == snap);
    printf("saved %zu bytes: %zu of KV, %zu of recurrent state\n", len, kv_bytes, snap);

    /* a model with the prefix cached but its only snapshots beyond it (at 96): save computes
     * the prefix's state and writes the same file */
    c = load(path, 8u << 20);
    if (!c || !lc || !lb) goto out;
    CHECK(run(c, prompt, lb, gb) == 0);
    CHECK(engine_prefix_save(c, prompt, N_PRE, file2, &info) == 0);
    CHECK(info.computed_tokens == N_FULL);
    size_t len2 = 0;
    good2 = support_slurp(file2, &len2);
    CHECK(good2 && len2 == len && !memcmp(good, good2, len));

    /* cold reference, then a fresh model that loads the file: a hit with the cold results */
    CHECK(run(cold, prompt, lc, gc) == 0);
    b = load(path, 8u << 20);
    if (!b) goto out;
    CHECK(engine_prefix_load(b, file, prompt, N_PRE, &info) == 0);
    CHECK(info.n_tokens == N_FULL && info.inserted_blocks == 4);
    engine_kv_cache_stats(b->kvc, &st);
    CHECK(st.n_pinned == 4 && st.n_nodes == 4 && st.n_snaps_used == 1 && st.n_used == 0);
    int32_t cached = run(b, prompt, lb, gb);
    printf("after the load: %d of %d prompt positions from the cache\n", (int)cached, N_PROMPT);
    CHECK(cached == N_FULL);
    CHECK(!memcmp(lb, lc, sizeof(float) * (size_t)n_vocab));
    CHECK(!memcmp(gb, gc, sizeof gb));
    /* loading again: nothing new, the existing snapshot kept, the pin nests */
    CHECK(engine_prefix_load(b, file, NULL, 0, &info) == 0 && info.inserted_blocks == 0);
    CHECK(engine_prefix_unpin(b, prompt, N_PRE) == 0 && engine_prefix_unpin(b, prompt, N_PRE) == 0);

    /* damaged state sections, refused by a model with nothing cached */
    engine_model_free(b);
    b = load(path, 8u << 20);
    if (!b) goto out;
    bad = malloc(len);
    if (!bad) goto out;
    memcpy(bad, good, len);
    bad[len - 1] ^= 0x10;
    refused(b, bad, len, ENGINE_EFORMAT, "recurrent state is damaged", "flip in the state");
    memcpy(bad, good, len);
    bad[len - snap] ^= 0x01;
    refused(b, bad, len, ENGINE_EFORMAT, "recurrent state is damaged", "flip at the state's start");
    refused(b, good, len - 1, ENGINE_EFORMAT, "truncated", "last state byte missing");
    refused(b, good, len - snap, ENGINE_EFORMAT, "truncated", "no state section");
    memcpy(bad, good, len);
    uint64_t wrong = snap - 8;
    memcpy(bad + 96, &wrong, 8);
    refix_header(bad);
    refused(b, bad, len - 8, ENGINE_EFORMAT, "recurrent state of", "state size - 8 (hash fits)");
    memcpy(bad, good, len);
    memset(bad + 96, 0, 8);
    uint32_t v1 = 1;
    memcpy(bad + 8, &v1, 4);
    refix_header(bad);
    refused(b, bad, len - snap, ENGINE_EUNSUPPORTED, "needs version 2", "version 1 file");
    /* the good file still loads after all that */
    CHECK(engine_prefix_load(b, file, prompt, N_PRE, &info) == 0 && info.inserted_blocks == 4);
out:
    free(lc);
    free(lb);
    free(good);
    free(good2);
    free(bad);
    engine_model_free(a);
    engine_model_free(b);
    engine_model_free(c);
    engine_model_free(cold);
    support_rmtree(dir);
    return support_finish("test_prefix_persist_q35");
}
