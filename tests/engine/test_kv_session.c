/* Sessions on the shared paged KV pool (engine/kv/kv_session.c): on the tiny random model, a
 * session whose prompt shares a cached prefix computes only the rest, and its logits equal a
 * cold session's (contiguous private cache, no prefix cache) for F32, F16 and Q8_0 KV (Q8_0 is
 * deterministic, so cached == cold holds for it exactly too): after a full
 * hit, a divergence inside a block (copy-on-write), two live sessions sharing blocks, decoding
 * on, rolling back into a shared block, and engine_generate's greedy tokens; an exhausted pool
 * fails an append with ENGINE_ENOMEM after the chunks that fit. At the end every
 * block is released (refcounts zero) and an eviction empties the pool. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"
#include "support.h"
#include "kv/kv.h"
#include "model/model_int.h"

static char tmpdir[] = "/tmp/spark_test_kv_session_XXXXXX";
static int32_t n_vocab;
static double worst;

static void same_logits(engine_session *a, engine_session *b, const char *what) {
    const float *x = engine_session_logits(a), *y = engine_session_logits(b);
    CHECK(x && y);
    if (!x || !y) return;
    double d = support_max_abs_diff(x, y, n_vocab);
    if (d > worst) worst = d;
    if (d > 1e-5) {
        fprintf(stderr, "%s: logits differ by %g\n", what, d);
        support_failures++;
    }
}

static void run(engine_model *cold_m, engine_model *warm_m, engine_kv_type type) {
    engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
    sp.n_ctx = 256;
    sp.n_batch = 24; /* chunks that straddle blocks */
    sp.kv_type = type;
    int32_t p[120], q[120];
    for (int i = 0; i < 120; i++)
        p[i] = q[i] = (int32_t)((i * 7919 + 13) % (n_vocab - 1)) + 1;
    for (int i = 70; i < 120; i++)
        q[i] = (int32_t)((i * 104729 + 5) % (n_vocab - 1)) + 1;

    engine_session *cold = NULL, *w1 = NULL, *w2 = NULL, *w3 = NULL;
    CHECK(engine_session_new(&cold, cold_m, &sp) == 0);
    CHECK(engine_session_new(&w1, warm_m, &sp) == 0);
    if (!cold || !w1) return;
    CHECK(!cold->kv_paged && w1->kv_paged);

    /* cold in both: nothing cached yet */
    CHECK(engine_session_append(cold, p, 100, NULL) == 0);
    CHECK(engine_session_append(w1, p, 100, NULL) == 0);
    CHECK(w1->kv_cached == 0);
    same_logits(cold, w1, "first request");
    engine_session_free(w1); /* inserts its 6 full blocks and the partly filled 7th (4 rows) */

    /* the same prompt again: 99 positions from the cache (6 blocks + 3 rows copied from the
     * partial one), the last one computed for its logits */
    CHECK(engine_session_new(&w2, warm_m, &sp) == 0);
    CHECK(engine_session_append(w2, p, 100, NULL) == 0);
    CHECK(w2->kv_cached == 99 && w2->kv_diverged_at == -1);
    same_logits(cold, w2, "full hit");

    /* a second live session diverging at 70: 64 shared + 6 rows copied */
    CHECK(engine_session_new(&w3, warm_m, &sp) == 0);
    CHECK(engine_session_append(w3, q, 110, NULL) == 0);
    CHECK(w3->kv_cached == 70 && w3->kv_diverged_at == 70);
    CHECK(engine_session_truncate(cold, 0) == 0);
    CHECK(engine_session_append(cold, q, 110, NULL) == 0);
    same_logits(cold, w3, "divergence inside a block");

    /* decode on w3 token by token beside the cold one */
    for (int i = 110; i < 120; i++) {
        int32_t t = (int32_t)((i * 31) % (n_vocab - 1)) + 1;
        CHECK(engine_session_append(w3, &t, 1, NULL) == 0);
        CHECK(engine_session_append(cold, &t, 1, NULL) == 0);
        same_logits(cold, w3, "decode");
    }
    /* roll w2 back into a shared cached block and continue differently (copy-on-write) */
    CHECK(engine_session_truncate(w2, 40) == 0);
    CHECK(engine_session_append(w2, q + 70, 20, NULL) == 0);
    int32_t r[60];
    memcpy(r, p, sizeof(int32_t) * 40);
    memcpy(r + 40, q + 70, sizeof(int32_t) * 20);
    CHECK(engine_session_truncate(cold, 0) == 0);
    CHECK(engine_session_append(cold, r, 60, NULL) == 0);
    same_logits(cold, w2, "rollback into a shared block");
    /* the cached blocks were not written through: the original prompt still hits and matches */
    engine_session_free(w3);
    w3 = NULL;
    CHECK(engine_session_new(&w3, warm_m, &sp) == 0);
    CHECK(engine_session_append(w3, p, 100, NULL) == 0);
    CHECK(w3->kv_cached == 99);
    CHECK(engine_session_truncate(cold, 0) == 0);
    CHECK(engine_session_append(cold, p, 100, NULL) == 0);
    same_logits(cold, w3, "after copy-on-write elsewhere");

    /* engine_generate: greedy tokens equal, prompt served from the cache */
    engine_session_free(w3);
    w3 = NULL;
    CHECK(engine_session_new(&w3, warm_m, &sp) == 0);
    engine_gen_params gp = ENGINE_GEN_PARAMS_INIT;
    gp.prompt = p;
    gp.n_prompt = 100;
    gp.max_tokens = 12;
    gp.sampling.temperature = 0;
    engine_gen_stats sa, sb;
    CHECK(engine_session_truncate(cold, 0) == 0);
    CHECK(engine_generate(cold, &gp, NULL, NULL, &sa) == 0);
    CHECK(engine_generate(w3, &gp, NULL, NULL, &sb) == 0);
    CHECK(sb.cached_tokens == 99 && sa.cached_tokens == 0);
    CHECK(cold->n_tokens == w3->n_tokens &&
          memcmp(cold->tokens, w3->tokens, sizeof(int32_t) * (size_t)cold->n_tokens) == 0);

    engine_session_free(cold);
    engine_session_free(w2);
    engine_session_free(w3);
}

static void check_drained(engine_model *m) {
    engine_kv_stats st;
    engine_kv_cache_stats(m->kvc, &st);
    CHECK(st.n_used == 0 && st.n_nodes > 0);
    for (int32_t b = 0; b < st.n_blocks; b++)
        CHECK(engine_kv_block_refcount(m->kvc, b) == 0);
    engine_kv_evict(m->kvc, st.n_blocks);
    engine_kv_cache_stats(m->kvc, &st);
    CHECK(st.n_free == st.n_blocks && st.n_nodes == 0);
}

int main(void) {
    int skip = support_init();
    if (skip) return skip;
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/tiny-f32.gguf", tmpdir);
    engine_model *cold = NULL, *warm = NULL;
    CHECK(support_gen("tiny", "f32", 11, path) == 0);
    /* The paged pool serves CPU sessions; pin the device so that a GPU machine (where auto
     * picks the GPU) tests the same thing. */
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.device = ENGINE_DEVICE_CPU;
    CHECK(engine_model_load(&cold, path, &mp) == 0);
    CHECK(engine_model_load(&warm, path, &mp) == 0);
    if (!cold || !warm) goto done;
    engine_model_info info;
    engine_model_info_get(cold, &info);
    n_vocab = info.n_vocab;

    for (int t = 0; t < 3; t++) {
        static const engine_kv_type types[3] = {ENGINE_KV_F32, ENGINE_KV_F16, ENGINE_KV_Q8_0};
        engine_kv_type type = types[t];
        CHECK(engine_kv_model_enable(warm, 8u << 20, type) == 0);
        CHECK(engine_kv_model_enable(warm, 8u << 20, type) == ENGINE_EINVAL);
        engine_kv_stats st;
        engine_kv_cache_stats(warm->kvc, &st);
        CHECK(st.type == type);
        printf("%s: pool of %d blocks of %zu bytes\n", engine_kv_type_name(type), st.n_blocks,
               st.block_bytes);
        run(cold, warm, type);
        check_drained(warm);
        /* a session of the other KV type keeps a private cache */
        engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
        sp.n_ctx = 64;
        sp.kv_type = types[(t + 1) % 3];
        engine_session *o = NULL;
        CHECK(engine_session_new(&o, warm, &sp) == 0 && o && !o->kv_paged);
        engine_session_free(o);
        engine_kv_cache_free(warm->kvc);
        warm->kvc = NULL;
    }
    /* a pool of 4 blocks (64 positions): an append beyond it fails cleanly with ENGINE_ENOMEM
     * after the chunks that fit, and the session goes on from there */
    {
        engine_kv_stats st;
        engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
        sp.n_ctx = 256;
        sp.n_batch = 24;
        sp.kv_type = ENGINE_KV_F32;
        CHECK(engine_kv_model_enable(warm, 4 * (size_t)65536, ENGINE_KV_F32) == 0);
        engine_kv_cache_stats(warm->kvc, &st);
        CHECK(st.n_blocks == 4 && st.block_bytes == 65536);
        int32_t p[100];
        for (int i = 0; i < 100; i++)
            p[i] = (int32_t)((i * 7919 + 13) % (n_vocab - 1)) + 1;
        engine_session *w = NULL, *c = NULL;
        CHECK(engine_session_new(&w, warm, &sp) == 0 && engine_session_new(&c, cold, &sp) == 0);
        if (w && c) {
            CHECK(engine_session_append(w, p, 100, NULL) == ENGINE_ENOMEM);
            CHECK(strstr(engine_error_last(), "4 blocks") != NULL);
            CHECK(engine_session_n_tokens(w) == 48 && w->kvs.n_pos == 48);
            CHECK(engine_session_truncate(w, 0) == 0);
            CHECK(engine_session_append(w, p, 60, NULL) == 0);
            CHECK(engine_session_append(c, p, 60, NULL) == 0);
            same_logits(c, w, "small pool");
        }
        engine_session_free(w);
        engine_session_free(c);
        check_drained(warm);
    }
    /* the public switch: engine_model_params.prefix_cache_bytes gives the model the pool */
    {
        engine_model_params pp = ENGINE_MODEL_PARAMS_INIT;
        pp.device = ENGINE_DEVICE_CPU;
        pp.prefix_cache_bytes = 8u << 20;
        engine_model *pm = NULL;
        CHECK(engine_model_load(&pm, path, &pp) == 0 && pm && pm->kvc);
        int32_t p[40];
        for (int i = 0; i < 40; i++) p[i] = (int32_t)((i * 104729 + 7) % (n_vocab - 1)) + 1;
        engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
        sp.n_ctx = 64; /* kv_type f16 by default: the pool's type */
        for (int round = 0; pm && round < 2; round++) {
            engine_session *ps = NULL;
            CHECK(engine_session_new(&ps, pm, &sp) == 0 && ps && ps->kv_paged);
            if (ps) {
                CHECK(engine_session_append(ps, p, 40, NULL) == 0);
                /* the second session finds the two full blocks the first one left behind and
                 * copies 7 of the 8 rows of its partial third: 39, all but the last token */
                CHECK(ps->kv_cached == (round ? 39 : 0));
            }
            engine_session_free(ps);
        }
        engine_model_free(pm);
        pp.prefix_cache_bytes = 1; /* smaller than one block: refused with the size needed */
        CHECK(engine_model_load(&pm, path, &pp) == ENGINE_ERANGE && !pm);
    }
    printf("largest logit difference cached vs cold: %g\n", worst);
done:
    engine_model_free(cold);
    engine_model_free(warm);
    unlink(path);
    rmdir(tmpdir);
    return support_finish("test_kv_session");
}
