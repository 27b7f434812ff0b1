/* The prefix cache for the hybrid qwen35moe (issue 11): the attention layers' KV in the paged
 * pool, the recurrent (conv + DeltaNet) state as snapshots in tree nodes at chosen block
 * boundaries (a prompt's last, a finished session's last). On the tiny qwen35 preset:
 *   - cached vs cold: the same prompt again hits at the last snapshot boundary before its last
 *     token and gives the cold session's logits and greedy tokens bit for bit;
 *   - the next turn of a conversation (prompt + answer + new text) hits at the previous
 *     session's last boundary; a prompt diverging before any snapshot gets no hit (and its
 *     explainer says where it diverged);
 *   - rollback inside and beyond the restored prefix recomputes exactly;
 *   - the scheduler's session mode serves the prefix too (cached_tokens, same tokens);
 *   - a pool with one snapshot slot: newer snapshots take it, eviction of the blocks frees the
 *     snapshots; at the end no block is referenced (refcounts balanced; ASan checks the rest).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "kv/kv.h"
#include "model/model_int.h"
#include "support.h"

#define N_CTX 256
static int32_t n_vocab;
static int32_t last_diverged; /* the cache-miss explainer of run()'s prompt */

static void fill(int32_t *p, int n, uint32_t seed) {
    for (int i = 0; i < n; i++) p[i] = (int32_t)((i * 7919u + seed * 104729u + 13u) % 150000u) + 1;
}

static engine_session *session(engine_model *m) {
    engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
    sp.n_ctx = N_CTX;
    sp.n_batch = 24; /* chunks that straddle blocks */
    engine_session *s = NULL;
    CHECK(engine_session_new(&s, m, &sp) == 0);
    return s;
}

/* Append prompt[0, n) and greedy-decode g tokens into out; the logits after the prompt into
 * lp (n_vocab floats). Returns the positions served from the cache. */
static int32_t run(engine_model *m, const int32_t *prompt, int n, int g, int32_t *out, float *lp,
                   bool keep, engine_session **kept) {
    engine_session *s = session(m);
    if (!s) return -1;
    CHECK(engine_session_append(s, prompt, (size_t)n, NULL) == 0);
    int32_t cached = s->kv_cached;
    last_diverged = s->kv_diverged_at;
    const float *l = engine_session_logits(s);
    CHECK(l != NULL);
    if (l) memcpy(lp, l, sizeof(float) * (size_t)n_vocab);
    for (int i = 0; i < g && l; i++) {
        out[i] = support_argmax(engine_session_logits(s), n_vocab);
        CHECK(engine_session_append(s, &out[i], 1, NULL) == 0);
    }
    if (keep) *kept = s;
    else engine_session_free(s);
    return cached;
}

static void same(const float *a, const float *b, const int32_t *ta, const int32_t *tb, int g,
                 const char *what) {
    double d = support_max_abs_diff(a, b, n_vocab);
    bool toks = memcmp(ta, tb, sizeof(int32_t) * (size_t)g) == 0;
    printf("%s: logits differ by %g, tokens %s\n", what, d, toks ? "equal" : "DIFFER");
    if (d != 0 || !toks) support_fail("%s: cached != cold", what);
}

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    int rc;
    engine_request_stats st;
    int32_t toks[16];
    int n;
} req;

static int on_tok(void *user, const char *text, size_t len, int32_t token) {
    (void)text;
    (void)len;
    req *r = user;
    if (token >= 0 && r->n < 16) r->toks[r->n++] = token;
    return 0;
}

static void on_done(void *user, uint64_t id, int rc, const engine_request_stats *st) {
    (void)id;
    req *r = user;
    pthread_mutex_lock(&r->mu);
    r->rc = rc;
    r->st = *st;
    r->done = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void sched_run(engine_sched *s, const int32_t *p, int n, req *r) {
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    engine_request q;
    memset(&q, 0, sizeof q);
    engine_gen_params g = ENGINE_GEN_PARAMS_INIT;
    q.gen = g;
    q.gen.prompt = p;
    q.gen.n_prompt = (size_t)n;
    q.gen.max_tokens = 3;
    q.gen.ignore_eog = true;
    q.gen.sampling.temperature = 0;
    q.on_token = on_tok;
    q.on_done = on_done;
    q.user = r;
    uint64_t id;
    CHECK(engine_sched_submit(s, &q, &id) == 0);
    pthread_mutex_lock(&r->mu);
    while (!r->done) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
}

int main(void) {
    int rc = support_init();
    if (rc) return rc;
    setvbuf(stdout, NULL, _IONBF, 0);
    char dir[256], path[512];
    if (support_tmpdir(dir, sizeof dir, "prefix_q35", true)) return 1;
    snprintf(path, sizeof path, "%s/q35.gguf", dir);
    engine_model *cold = NULL, *warm = NULL;
    float *lc = NULL, *lw = NULL;
    if (support_gen("qwen35-tiny", "f32", 5, path)) {
        support_fail("cannot generate qwen35-tiny");
        goto out;
    }
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.device = ENGINE_DEVICE_CPU;
    mp.n_threads = 2;
    mp.n_ctx = N_CTX;
    CHECK(engine_model_load(&cold, path, &mp) == 0);
    mp.prefix_cache_bytes = 8u << 20;
    CHECK(engine_model_load(&warm, path, &mp) == 0);
    if (!cold || !warm) goto out;
    CHECK(warm->kvc && !cold->kvc);
    if (!warm->kvc) goto out;
    n_vocab = engine_model_n_vocab(cold);
    lc = malloc(sizeof(float) * (size_t)n_vocab);
    lw = malloc(sizeof(float) * (size_t)n_vocab);
    engine_kv_stats st;
    engine_kv_cache_stats(warm->kvc, &st);
    printf("pool: %d blocks of %zu bytes (attention layers only), %d snapshot slots of %zu "
           "bytes\n", st.n_blocks, st.block_bytes, st.n_snaps, st.snap_bytes);
    CHECK(st.n_snaps >= 1 && st.snap_bytes == engine_q35_snapshot_bytes(&warm->hp));

    static int32_t p[200], q[200], t2[200];
    int32_t gc[8], gw[8];
    fill(p, 90, 1);
    /* 1. cold everywhere; the warm session leaves snapshots at 80 (its prompt's last boundary)
     * and 96 (its end after 8 answer tokens: 98 positions) */
    run(cold, p, 90, 8, gc, lc, false, NULL);
    CHECK(run(warm, p, 90, 8, gw, lw, false, NULL) == 0);
    same(lc, lw, gc, gw, 8, "first request (paged vs contiguous)");
    engine_kv_cache_stats(warm->kvc, &st);
    CHECK(st.n_snaps_used == 2 && st.n_used == 0);
    /* 2. the same prompt: the hit is the last snapshot boundary before its last token, 80 */
    CHECK(run(warm, p, 90, 8, gw, lw, false, NULL) == 80);
    same(lc, lw, gc, gw, 8, "same prompt (hit 80)");
    /* 3. the next turn: prompt + the answer + new text: the hit is the first session's end */
    memcpy(t2, p, 90 * sizeof *t2);
    memcpy(t2 + 90, gc, 8 * sizeof *t2);
    fill(t2 + 98, 30, 2);
    int32_t gc2[4], gw2[4];
    run(cold, t2, 128, 4, gc2, lc, false, NULL);
    CHECK(run(warm, t2, 128, 4, gw2, lw, false, NULL) == 96);
    same(lc, lw, gc2, gw2, 4, "next turn (hit 96)");
    /* 4. diverging at 70, before any snapshot at or below it (they are at 80, 96, 112, ...):
     * no hit, and the explainer says where */
    memcpy(q, p, 70 * sizeof *q);
    fill(q + 70, 20, 3);
    run(cold, q, 90, 2, gc, lc, false, NULL);
    CHECK(run(warm, q, 90, 2, gw, lw, false, NULL) == 0);
    CHECK(last_diverged == 70);
    same(lc, lw, gc, gw, 2, "diverged at 70 (no snapshot below)");
    /* 5. rollback of a session that started from a hit: inside the restored prefix (the state
     * comes from position 0) and beyond it (from a snapshot taken again on the way) */
    run(cold, p, 90, 0, gc, lc, false, NULL);
    engine_session *ks = NULL;
    CHECK(run(warm, p, 90, 0, gw, lw, true, &ks) == 80);
    if (ks) {
        for (int k = 0; k < 2; k++) {
            int32_t to = k ? 88 : 50;
            CHECK(engine_session_truncate(ks, to) == 0);
            CHECK(engine_session_append(ks, p + to, (size_t)(90 - to), NULL) == 0);
            same(lc, engine_session_logits(ks), gc, gc, 0,
                 k ? "rollback to 88 after a hit" : "rollback to 50 after a hit");
        }
        engine_session_free(ks);
    }
    /* 6. the scheduler's session mode (qwen35moe has no batched pass) */
    {
        engine_sched *s = NULL;
        engine_sched_params sp = ENGINE_SCHED_PARAMS_INIT;
        sp.n_ctx = N_CTX;
        sp.max_seqs = 2;
        CHECK(engine_sched_new(&s, warm, &sp) == 0);
        static int32_t r3[100];
        fill(r3, 90, 4);
        req a, b;
        if (s) {
            sched_run(s, r3, 90, &a); /* leaves a snapshot at 80 (prompt; its end, 92, too) */
            sched_run(s, r3, 90, &b);
            engine_sched_free(s);
            printf("scheduler: cached %d then %d, tokens %s\n", a.st.gen.cached_tokens,
                   b.st.gen.cached_tokens,
                   a.n == b.n && !memcmp(a.toks, b.toks, sizeof(int32_t) * (size_t)a.n)
                       ? "equal" : "DIFFER");
            CHECK(a.rc == 0 && b.rc == 0 && a.n == 3 && b.n == 3);
            CHECK(a.st.gen.cached_tokens == 0 && b.st.gen.cached_tokens == 80);
            CHECK(!memcmp(a.toks, b.toks, sizeof a.toks));
        }
    }
    engine_kv_cache_stats(warm->kvc, &st);
    CHECK(st.n_used == 0);
    /* persisted prefixes with the recurrent state: test_prefix_persist_q35 */
    /* 7. eviction frees the snapshots with their blocks */
    int32_t ev = engine_kv_evict(warm->kvc, st.n_blocks);
    engine_kv_cache_stats(warm->kvc, &st);
    printf("evicted %d blocks: %d snapshots left, %d of %d blocks free\n", ev, st.n_snaps_used,
           st.n_free, st.n_blocks);
    CHECK(ev > 0 && st.n_snaps_used == 0 && st.n_nodes == 0 && st.n_free == st.n_blocks);
    engine_model_free(warm);
    warm = NULL;
    /* 8. a pool of one snapshot slot (the smallest budget that holds one snapshot and some
     * KV): each new prompt's snapshot takes the slot; hits follow the slot */
    mp.prefix_cache_bytes = engine_q35_snapshot_bytes(&cold->hp) + ((size_t)1 << 20);
    CHECK(engine_model_load(&warm, path, &mp) == 0);
    if (warm) {
        engine_kv_cache_stats(warm->kvc, &st);
        CHECK(st.n_snaps == 1);
        run(warm, p, 90, 0, gw, lw, false, NULL); /* snapshot at 80 */
        run(warm, q, 90, 0, gw, lw, false, NULL); /* its own at 80: takes the slot */
        engine_kv_cache_stats(warm->kvc, &st);
        CHECK(st.n_snaps_used == 1 && st.n_snaps_evicted == 1);
        CHECK(run(warm, q, 90, 0, gw, lw, false, NULL) == 80);
        CHECK(run(warm, p, 90, 0, gw, lw, false, NULL) == 0); /* its snapshot is gone */
        run(cold, p, 90, 0, gc, lc, false, NULL);
        same(lc, lw, gc, gc, 0, "after losing the slot (cold again)");
        engine_kv_cache_stats(warm->kvc, &st);
        CHECK(st.n_used == 0);
    }
    /* too small for a snapshot and a block: a clear ENGINE_ERANGE */
    engine_model_free(warm);
    warm = NULL;
    mp.prefix_cache_bytes = engine_q35_snapshot_bytes(&cold->hp);
    CHECK(engine_model_load(&warm, path, &mp) == ENGINE_ERANGE && !warm);
    CHECK(strstr(engine_error_last(), "snapshot") != NULL);
out:
    free(lc);
    free(lw);
    engine_model_free(warm);
    engine_model_free(cold);
    support_rmtree(dir);
    return support_finish("test_prefix_q35");
}
