/* The scheduler (engine/sched) and the batched forward pass (engine_fwd_run_batch) on the tiny
 * random model:
 *   - a batched pass over 6 (--stress: 64) sequences, prompts of different lengths with shared
 *     prefixes, then a decode token each, gives every sequence the logits it gets alone and the
 *     logits of an ordinary session;
 *   - 64 greedy requests (different lengths, shared prefixes, stop strings) batched together
 *     stream the same tokens and text as engine_generate on a fresh session, each;
 *   - a repeated prompt is served from the prefix cache (cached_tokens, the explainer) with
 *     the same output as cold;
 *   - cancel while queued, during prefill, during decode (from on_token), a callback that
 *     returns non-zero;
 *   - a small pool: preemption, with the same tokens as unpreempted runs; an oversized request
 *     ends with ENGINE_ENOMEM;
 *   - admission: a small request passes a large one waiting for blocks and completes first;
 *     the large one runs once blocks free up; max_bypass bounds the passing (and -1 is FCFS);
 *   - grammar hooks (mask, accept) run per request and give engine_generate's tokens; a mask
 *     that aborts ends the request cancelled;
 *   - the session path (engine_sched_new_mode SESSIONS: what a GPU model runs) gives the same
 *     tokens;
 *   - 1,000 random submits and cancels from 3 threads: on_done exactly once each, and every
 *     block back (refcounts zero, pool free or cached) at the end;
 *   - bad input is refused with the documented codes;
 *   - with Q8_0 KV (engine_model_params.kv_type): the batched pass, batched and session-mode
 *     greedy requests and the prefix cache again, against Q8_0 references. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv/kv.h"
#include "model/model_int.h"
#include "sched/sched_int.h"
#include "support.h"

#define N_CTX 512
#define MAX_OUT 64

static int32_t n_vocab;
/* --stress (label slow): the full sizes (64 batched requests, a longer pressure run, the random
 * operations run to completion). Without it the same cases run smaller, so that the test stays
 * quick in an unoptimised ASan build, where every token's output head takes most of a second. */
static bool stress;
/* the KV type of the reference sessions and test_batch_pass's pool (main runs the batched
 * cases once more with a Q8_0 model) */
static engine_kv_type kv_type = ENGINE_KV_F16;

/* ---- what a request streamed ------------------------------------------------------------- */
typedef struct {
    int32_t toks[MAX_OUT];
    int n_toks;
    char text[1024];
    size_t n_text;
    int rc;
    int n_done;          /* on_done calls */
    engine_request_stats st;
    /* cancel from on_token after this many tokens (0: never), through engine_sched_cancel or
     * by returning non-zero */
    int cancel_after;
    bool cancel_by_return;
    engine_sched *s;
    uint64_t id;
    bool *gate;          /* non-NULL: the first token waits (on the scheduler thread) until
                          * *gate is true (under mu), after setting at_gate */
    bool at_gate;
    uint64_t done_step;  /* engine_sched_stats.steps when on_done ran */
} outcome;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

static int on_token(void *user, const char *text, size_t len, int32_t token) {
    outcome *o = user;
    if (token >= 0 && o->n_toks < MAX_OUT) o->toks[o->n_toks++] = token;
    if (o->gate && o->n_toks == 1) {
        pthread_mutex_lock(&mu);
        o->at_gate = true;
        pthread_cond_broadcast(&cv);
        while (!*o->gate) pthread_cond_wait(&cv, &mu);
        pthread_mutex_unlock(&mu);
    }
    if (o->n_text + len < sizeof o->text) {
        memcpy(o->text + o->n_text, text, len);
        o->n_text += len;
    }
    if (o->cancel_after && token >= 0 && o->n_toks == o->cancel_after) {
        if (o->cancel_by_return) return 1;
        CHECK(engine_sched_cancel(o->s, o->id) == 0);
    }
    return 0;
}

static void on_done(void *user, uint64_t id, int rc, const engine_request_stats *st) {
    outcome *o = user;
    engine_sched_stats ss;
    memset(&ss, 0, sizeof ss);
    if (o->s) engine_sched_stats_get(o->s, &ss); /* allowed from a callback */
    pthread_mutex_lock(&mu);
    o->done_step = ss.steps;
    if (o->id && o->id != id) support_fail("on_done for id %llu on request %llu",
                                           (unsigned long long)id, (unsigned long long)o->id);
    o->rc = rc;
    o->st = *st;
    o->n_done++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static void wait_done(outcome *o, int n) {
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n; i++)
        while (o[i].n_done == 0) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

static void fill_prompt(int32_t *p, int n, uint32_t seed) {
    for (int i = 0; i < n; i++) p[i] = (int32_t)((seed * 2654435761u + (uint32_t)i * 7919u) %
                                                 (uint32_t)(n_vocab - 1000)) + 1;
}

static uint64_t submit(engine_sched *s, outcome *o, const int32_t *prompt, size_t n,
                       int32_t max_tokens, const char *const *stops, size_t n_stops) {
    engine_request r;
    memset(&r, 0, sizeof r);
    engine_gen_params g = ENGINE_GEN_PARAMS_INIT;
    r.gen = g;
    r.gen.prompt = prompt;
    r.gen.n_prompt = n;
    r.gen.max_tokens = max_tokens;
    r.gen.sampling.temperature = 0; /* greedy */
    r.gen.stop_strings = stops;
    r.gen.n_stop_strings = n_stops;
    r.on_token = on_token;
    r.on_done = on_done;
    r.user = o;
    o->s = s;
    uint64_t id = 0;
    pthread_mutex_lock(&mu); /* o->id is read by on_done */
    int rc = engine_sched_submit(s, &r, &id);
    o->id = id;
    pthread_mutex_unlock(&mu);
    CHECK(rc == 0 && id != 0);
    return id;
}

/* engine_generate on a fresh session of m (KV kv_type): the reference output. */
static void reference(engine_model *m, outcome *o, const int32_t *prompt, size_t n,
                      int32_t max_tokens, const char *const *stops, size_t n_stops) {
    engine_session *ss = support_session(m, 0, kv_type);
    if (!ss) return;
    engine_gen_params g = ENGINE_GEN_PARAMS_INIT;
    g.prompt = prompt;
    g.n_prompt = n;
    g.max_tokens = max_tokens;
    g.sampling.temperature = 0;
    g.stop_strings = stops;
    g.n_stop_strings = n_stops;
    engine_gen_stats st;
    o->rc = engine_generate(ss, &g, on_token, o, &st);
    o->st.gen = st;
    engine_session_free(ss);
}

static void same_output(const outcome *got, const outcome *want, const char *what, int i) {
    bool same = got->rc == want->rc && got->n_toks == want->n_toks &&
                got->n_text == want->n_text &&
                memcmp(got->toks, want->toks, sizeof(int32_t) * (size_t)got->n_toks) == 0 &&
                memcmp(got->text, want->text, got->n_text) == 0 &&
                got->st.gen.stop == want->st.gen.stop &&
                got->st.gen.generated_tokens == want->st.gen.generated_tokens;
    if (!same)
        support_fail("%s %d: rc %d/%d, %d/%d tokens, %zu/%zu bytes, stop %d/%d", what, i, got->rc,
                     want->rc, got->n_toks, want->n_toks, got->n_text, want->n_text,
                     (int)got->st.gen.stop, (int)want->st.gen.stop);
}

/* ---- the batched pass against single passes and a session -------------------------------- */
static void test_batch_pass(engine_model *m) {
    enum { NS = 64 };
    int ns = stress ? NS : 6;
    engine_kv_params kp = {(int32_t)m->hp.n_layer, (int32_t)m->hp.n_head_kv,
                           (int32_t)m->hp.head_dim_k, kv_type, 0, 0, 0, 0};
    size_t block_bytes = (size_t)kp.n_layer * 2 * ENGINE_KV_BLOCK_SIZE *
                         engine_cpu_kv_row_bytes(kv_type, kp.n_head_kv, kp.head_dim);
    kp.budget_bytes = block_bytes * 2 * NS * 8;
    engine_kv_cache *c = NULL;
    CHECK(engine_kv_cache_new(&c, &kp) == 0);
    engine_fwd *fb = NULL, *f1 = NULL;
    CHECK(engine_fwd_batch_new(&fb, m, 128, 64 * NS, NS) == 0);
    CHECK(engine_fwd_batch_new(&f1, m, 128, 128, 1) == 0);
    if (!c || !fb || !f1) goto out;
    engine_kv_seq a[NS], b[NS];
    engine_kv_view va[NS][4], vb[NS][4]; /* the tiny preset has 4 layers */
    int32_t prompt[NS][64];
    int32_t len[NS];
    float *want[NS];
    engine_fwd_seq q[NS];
    CHECK(m->hp.n_layer == 4);
    for (int i = 0; i < ns; i++) {
        CHECK(engine_kv_seq_init(c, &a[i], 128) == 0);
        CHECK(engine_kv_seq_init(c, &b[i], 128) == 0);
        for (int l = 0; l < 4; l++) {
            va[i][l] = engine_kv_seq_view(c, &a[i], l);
            vb[i][l] = engine_kv_seq_view(c, &b[i], l);
        }
        len[i] = 1 + (i * 13) % 40;
        want[i] = malloc(sizeof(float) * (size_t)n_vocab);
        fill_prompt(prompt[i], 64, (uint32_t)(i % 5)); /* some share prefixes */
    }
    /* pass 1: every prompt in one batched pass; alone: one pass per sequence */
    int32_t total = 0;
    for (int i = 0; i < ns; i++) {
        CHECK(engine_kv_seq_extend(c, &a[i], len[i]) == 0);
        CHECK(engine_kv_seq_extend(c, &b[i], len[i]) == 0);
        q[i] = (engine_fwd_seq){prompt[i], len[i], 0, va[i], i % 3 != 1, NULL};
        total += len[i];
        engine_fwd_seq one = {prompt[i], len[i], 0, vb[i], true, NULL};
        CHECK(engine_fwd_run_batch(m, f1, &one, 1) == 0);
        memcpy(want[i], one.logits_out, sizeof(float) * (size_t)n_vocab);
    }
    CHECK(total <= 64 * NS);
    CHECK(engine_fwd_run_batch(m, fb, q, ns) == 0);
    double worst = 0;
    for (int i = 0; i < ns; i++) {
        if (i % 3 == 1) {
            CHECK(q[i].logits_out == NULL);
            continue;
        }
        worst = fmax(worst, support_max_abs_diff(q[i].logits_out, want[i], n_vocab));
    }
    /* pass 2: a decode token each (positions len[i]) together */
    for (int i = 0; i < ns; i++) {
        CHECK(engine_kv_seq_extend(c, &a[i], len[i] + 1) == 0);
        CHECK(engine_kv_seq_extend(c, &b[i], len[i] + 1) == 0);
        q[i] = (engine_fwd_seq){&prompt[i][len[i]], 1, len[i], va[i], true, NULL};
        engine_fwd_seq one = {&prompt[i][len[i]], 1, len[i], vb[i], true, NULL};
        CHECK(engine_fwd_run_batch(m, f1, &one, 1) == 0);
        memcpy(want[i], one.logits_out, sizeof(float) * (size_t)n_vocab);
    }
    CHECK(engine_fwd_run_batch(m, fb, q, ns) == 0);
    for (int i = 0; i < ns; i++)
        worst = fmax(worst, support_max_abs_diff(q[i].logits_out, want[i], n_vocab));
    /* and an ordinary session (contiguous cache of the same type) over the same tokens */
    engine_session *ss = support_session(m, 0, kv_type);
    if (ss) {
        CHECK(engine_session_append(ss, prompt[ns - 1], (size_t)len[ns - 1] + 1, NULL) == 0);
        worst = fmax(worst, support_max_abs_diff(engine_session_logits(ss), q[ns - 1].logits_out,
                                                 n_vocab));
        engine_session_free(ss);
    }
    printf("batched pass over %d sequences (%s KV) vs alone and a session: largest logit "
           "difference %g\n", ns, engine_kv_type_name(kv_type), worst);
    CHECK(worst <= 1e-5);
    for (int i = 0; i < ns; i++) {
        engine_kv_seq_deinit(c, &a[i]);
        engine_kv_seq_deinit(c, &b[i]);
        free(want[i]);
    }
    engine_kv_stats ks;
    engine_kv_cache_stats(c, &ks);
    CHECK(ks.n_used == 0 && ks.n_free == ks.n_blocks);
out:
    engine_fwd_free(fb);
    engine_fwd_free(f1);
    engine_kv_cache_free(c);
}

/* ---- 64 greedy requests batched vs engine_generate alone --------------------------------- */
static const char *const stop_a[] = {"e", "th"};

static void test_greedy(engine_model *ref, engine_model *m, engine_sched_mode mode, int n_req,
                        const char *what) {
    enum { MAXR = 64 };
    static int32_t prompts[MAXR][96];
    static outcome got[MAXR], want[MAXR];
    int lens[MAXR];
    memset(got, 0, sizeof got);
    memset(want, 0, sizeof want);
    engine_sched_params sp = ENGINE_SCHED_PARAMS_INIT;
    sp.max_seqs = 64;
    sp.prefill_chunk = 64;
    sp.n_ctx = N_CTX;
    engine_sched *s = NULL;
    CHECK(engine_sched_new_mode(&s, m, &sp, mode) == 0);
    if (!s) return;
    for (int i = 0; i < n_req; i++) {
        lens[i] = 2 + (i * 37) % 90;
        fill_prompt(prompts[i], 96, (uint32_t)(i % 7)); /* groups of shared prefixes */
        bool stops = i % 4 == 3;
        submit(s, &got[i], prompts[i], (size_t)lens[i], 2 + i % 3, stops ? stop_a : NULL,
               stops ? 2 : 0);
    }
    wait_done(got, n_req);
    engine_sched_stats ss;
    engine_sched_stats_get(s, &ss);
    engine_sched_free(s);
    for (int i = 0; i < n_req; i++) {
        bool stops = i % 4 == 3;
        reference(ref, &want[i], prompts[i], (size_t)lens[i], 2 + i % 3, stops ? stop_a : NULL,
                  stops ? 2 : 0);
        CHECK(got[i].n_done == 1);
        same_output(&got[i], &want[i], what, i);
    }
    printf("%s: %d requests in %llu steps (%llu prompt tokens, %llu from the cache)\n", what,
           n_req, (unsigned long long)ss.steps, (unsigned long long)ss.prompt_tokens,
           (unsigned long long)ss.cached_tokens);
    CHECK(ss.requests_done == (uint64_t)n_req && ss.requests_canceled == 0);
    /* one pass per step over many sequences: far fewer steps than tokens */
    if (mode != ENGINE_SCHED_MODE_SESSIONS) CHECK(ss.steps < (uint64_t)n_req * 3);
}

/* ---- the prefix cache through the scheduler ---------------------------------------------- */
static void test_cached(engine_model *ref, engine_model *m) {
    static int32_t p[200], q[200], t2[220], t3[240];
    fill_prompt(p, 200, 99);
    memcpy(q, p, sizeof p);
    q[150] = (q[150] + 1) % n_vocab; /* diverges at 150 */
    engine_sched *s = NULL;
    engine_sched_params sp = ENGINE_SCHED_PARAMS_INIT;
    sp.n_ctx = N_CTX;
    sp.prefill_chunk = 48;
    CHECK(engine_sched_new(&s, m, &sp) == 0);
    if (!s) return;
    outcome o[5], w[4];
    memset(o, 0, sizeof o);
    memset(w, 0, sizeof w);
    submit(s, &o[0], p, 180, 3, NULL, 0);
    wait_done(&o[0], 1);
    submit(s, &o[1], p, 180, 3, NULL, 0); /* the same again: all but the last token cached */
    wait_done(&o[1], 1);
    submit(s, &o[2], q, 180, 3, NULL, 0);
    wait_done(&o[2], 1);
    /* the next turn of a conversation: the first prompt, its answer, new text. Position 182
     * (the answer's last token) never had KV; the partly filled block 11 (176..181) is copied */
    CHECK(o[0].n_toks == 3);
    int32_t n2 = 0, n3 = 0;
    memcpy(t2, p, 180 * sizeof *p);
    n2 = 180;
    for (int i = 0; i < o[0].n_toks && i < 3; i++) t2[n2++] = o[0].toks[i];
    fill_prompt(t2 + n2, 20, 7);
    n2 += 20;
    submit(s, &o[3], t2, (size_t)n2, 4, NULL, 0);
    wait_done(&o[3], 1);
    /* and the turn after (its tail block 12 is partly filled: 192..206) */
    memcpy(t3, t2, (size_t)n2 * sizeof *t2);
    n3 = n2;
    for (int i = 0; i < o[3].n_toks && i < 4; i++) t3[n3++] = o[3].toks[i];
    fill_prompt(t3 + n3, 9, 8);
    n3 += 9;
    submit(s, &o[4], t3, (size_t)n3, 3, NULL, 0);
    wait_done(&o[4], 1);
    engine_sched_free(s);
    reference(ref, &w[0], p, 180, 3, NULL, 0);
    reference(ref, &w[1], q, 180, 3, NULL, 0);
    reference(ref, &w[2], t2, (size_t)n2, 4, NULL, 0);
    reference(ref, &w[3], t3, (size_t)n3, 3, NULL, 0);
    same_output(&o[0], &w[0], "cold", 0);
    same_output(&o[1], &w[0], "cached", 1);
    same_output(&o[2], &w[1], "diverged", 2);
    same_output(&o[3], &w[2], "next turn", 3);
    same_output(&o[4], &w[3], "turn after", 4);
    /* the first may hit blocks of earlier tests' prompts (other seeds: not these) */
    CHECK(o[0].st.gen.cached_tokens == 0);
    /* the first fed 182 positions: 11 full blocks went to the tree, the 12th (6 rows) as a
     * partial leaf: 179 = all but the last prompt token */
    CHECK(o[1].st.gen.cached_tokens == 179 && o[1].st.cache_diverged_at == -1);
    /* 144 = 9 full blocks, then 6 rows of the 10th copied: 150 positions */
    CHECK(o[2].st.gen.cached_tokens == 150 && o[2].st.cache_diverged_at == 150);
    /* every position the first request computed: 182 */
    CHECK(o[3].st.gen.cached_tokens == 182);
    /* o[3] fed n2 + 3 positions (its 4th token has no KV) */
    CHECK(o[3].n_toks == 4 && o[4].st.gen.cached_tokens == n2 + 3);
    CHECK(o[1].st.ttft_ms >= o[1].st.queue_ms && o[1].st.total_ms >= o[1].st.ttft_ms);
}

/* ---- grammar hooks (run on the scheduler thread) ---------------------------------------- */
typedef struct {
    int accepts, outside, abort_after;
} grammar;

static int g_mask(void *user, uint32_t *allowed, int32_t nv) {
    grammar *g = user;
    if (g->abort_after && g->accepts >= g->abort_after) return 1;
    for (int32_t i = 3; i < nv; i += 7) allowed[i / 32] |= 1u << (i % 32);
    return 0;
}

static int g_accept(void *user, int32_t token) {
    grammar *g = user;
    g->accepts++;
    if (token % 7 != 3) g->outside++;
    return 0;
}

static void test_hooks(engine_model *ref, engine_model *m) {
    static int32_t p[40];
    fill_prompt(p, 40, 4242);
    engine_sched *s = NULL;
    engine_sched_params sp = ENGINE_SCHED_PARAMS_INIT;
    sp.n_ctx = N_CTX;
    CHECK(engine_sched_new(&s, m, &sp) == 0);
    if (!s) return;
    grammar g[3] = {{0, 0, 0}, {0, 0, 2}, {0, 0, 0}};
    outcome o[2], w;
    memset(o, 0, sizeof o);
    memset(&w, 0, sizeof w);
    for (int i = 0; i < 2; i++) {
        engine_request r;
        memset(&r, 0, sizeof r);
        engine_gen_params gp = ENGINE_GEN_PARAMS_INIT;
        r.gen = gp;
        r.gen.prompt = p;
        r.gen.n_prompt = 40;
        r.gen.max_tokens = 4;
        r.gen.sampling.temperature = 0;
        r.gen.sampling.mask = g_mask;
        r.gen.sampling.accept = g_accept;
        r.gen.sampling.grammar_user = &g[i];
        r.on_token = on_token;
        r.on_done = on_done;
        r.user = &o[i];
        pthread_mutex_lock(&mu);
        CHECK(engine_sched_submit(s, &r, &o[i].id) == 0);
        pthread_mutex_unlock(&mu);
    }
    wait_done(o, 2);
    engine_sched_free(s);
    /* the reference with the same hooks */
    engine_session *ss = support_session(ref, 0, ENGINE_KV_F16);
    if (ss) {
        engine_gen_params gp = ENGINE_GEN_PARAMS_INIT;
        gp.prompt = p;
        gp.n_prompt = 40;
        gp.max_tokens = 4;
        gp.sampling.temperature = 0;
        gp.sampling.mask = g_mask;
        gp.sampling.accept = g_accept;
        gp.sampling.grammar_user = &g[2];
        engine_gen_stats st;
        w.rc = engine_generate(ss, &gp, on_token, &w, &st);
        w.st.gen = st;
        engine_session_free(ss);
    }
    same_output(&o[0], &w, "grammar hooks", 0);
    CHECK(g[0].accepts == 4 && g[0].outside == 0 && o[0].rc == 0);
    /* a mask that aborts: ECANCELED after the tokens before it */
    CHECK(o[1].rc == ENGINE_ECANCELED && o[1].st.gen.stop == ENGINE_STOP_CANCELED);
    CHECK(g[1].accepts == 2 && o[1].n_toks == 2);
}

/* ---- cancellation ------------------------------------------------------------------------- */
static void test_cancel(engine_model *m) {
    static int32_t p[400];
    fill_prompt(p, 400, 5);
    engine_sched *s = NULL;
    engine_sched_params sp = ENGINE_SCHED_PARAMS_INIT;
    sp.n_ctx = N_CTX;
    sp.prefill_chunk = 4; /* 100 steps of prefill */
    sp.max_seqs = 2;
    CHECK(engine_sched_new(&s, m, &sp) == 0);
    if (!s) return;
    outcome o[5];
    memset(o, 0, sizeof o);
    /* during prefill: wait until admitted, then cancel */
    uint64_t id = submit(s, &o[0], p, 400, 4, NULL, 0);
    engine_sched_stats st;
    for (int i = 0; i < 20000; i++) {
        engine_sched_stats_get(s, &st);
        if (st.running == 1 && st.steps >= 2) break;
        usleep(500);
    }
    CHECK(engine_sched_cancel(s, id) == 0);
    wait_done(&o[0], 1);
    CHECK(o[0].rc == ENGINE_ECANCELED && o[0].st.gen.stop == ENGINE_STOP_CANCELED);
    CHECK(o[0].st.gen.generated_tokens == 0 && o[0].n_toks == 0);
    CHECK(engine_sched_cancel(s, id) == ENGINE_EINVAL); /* already done */

    /* during decode, from the token callback; and by returning non-zero */
    o[1].cancel_after = 3;
    o[2].cancel_after = 2;
    o[2].cancel_by_return = true;
    submit(s, &o[1], p + 100, 20, 40, NULL, 0);
    submit(s, &o[2], p + 200, 30, 40, NULL, 0);
    /* while both slots are busy a third waits in the queue: cancel it there */
    uint64_t id3 = submit(s, &o[3], p + 300, 10, 40, NULL, 0);
    CHECK(engine_sched_cancel(s, id3) == 0);
    wait_done(&o[1], 3);
    CHECK(o[1].rc == ENGINE_ECANCELED && o[1].n_toks >= 3 && o[1].n_toks <= 4);
    CHECK(o[2].rc == ENGINE_ECANCELED && o[2].n_toks == 2);
    CHECK(o[3].rc == ENGINE_ECANCELED && o[3].n_toks == 0);
    CHECK(engine_sched_cancel(s, 999999) == ENGINE_EINVAL);
    /* freeing cancels what is left: on_done once each */
    submit(s, &o[4], p, 300, 40, NULL, 0);
    engine_sched_free(s);
    CHECK(o[4].n_done == 1 && o[4].rc == ENGINE_ECANCELED);
    for (int i = 0; i < 5; i++) CHECK(o[i].n_done == 1);
}

/* ---- admission without head-of-line blocking --------------------------------------------- */
/* On a pool of 8 blocks, A (50 + 12 positions) runs and holds its first token until B (81
 * positions: 6 blocks, fits the pool alone but not beside A) and the small ones are queued.
 * max_bypass 8: C (12 + 3) is admitted past the waiting B and completes before B is admitted;
 * B runs once A is done, with the same output as alone. max_bypass 1: C1 passes B, C2 may not.
 * max_bypass -1 (FCFS): C waits behind B. */
static void test_admission(engine_model *ref, const char *path) {
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.n_threads = 2;
    mp.device = ENGINE_DEVICE_CPU;
    mp.n_ctx = N_CTX;
    mp.prefix_cache_bytes = (size_t)8 * 4 * 2 * ENGINE_KV_BLOCK_SIZE * 2 * 64 * 2;
    engine_model *m = NULL;
    CHECK(engine_model_load(&m, path, &mp) == 0);
    if (!m) return;
    CHECK(m->kvc->n_blocks == 8);
    static int32_t pa[50], pb[80], pc[2][12];
    fill_prompt(pa, 50, 3001);
    fill_prompt(pb, 80, 3002);
    fill_prompt(pc[0], 12, 3003);
    fill_prompt(pc[1], 12, 3004);
    outcome want[4];
    memset(want, 0, sizeof want);
    reference(ref, &want[0], pa, 50, 12, NULL, 0);
    reference(ref, &want[1], pb, 80, 4, NULL, 0);
    reference(ref, &want[2], pc[0], 12, 3, NULL, 0);
    reference(ref, &want[3], pc[1], 12, 3, NULL, 0);
    static const int32_t bypass[3] = {0, 1, -1};
    for (int round = 0; round < 3; round++) {
        engine_sched_params sp = ENGINE_SCHED_PARAMS_INIT;
        sp.n_ctx = N_CTX;
        sp.max_seqs = 4;
        sp.max_bypass = bypass[round];
        engine_sched *s = NULL;
        CHECK(engine_sched_new(&s, m, &sp) == 0);
        if (!s) break;
        outcome o[4];
        memset(o, 0, sizeof o);
        bool gate = false;
        o[0].gate = &gate;
        int n = round == 1 ? 4 : 3;
        submit(s, &o[0], pa, 50, 12, NULL, 0);
        pthread_mutex_lock(&mu); /* A runs (its prompt's blocks taken) before the others come */
        while (!o[0].at_gate) pthread_cond_wait(&cv, &mu);
        pthread_mutex_unlock(&mu);
        submit(s, &o[1], pb, 80, 4, NULL, 0);
        for (int i = 2; i < n; i++) submit(s, &o[i], pc[i - 2], 12, 3, NULL, 0);
        pthread_mutex_lock(&mu);
        gate = true;
        pthread_cond_broadcast(&cv);
        pthread_mutex_unlock(&mu);
        wait_done(o, n);
        engine_sched_free(s);
        for (int i = 0; i < n; i++) same_output(&o[i], &want[i], "admission", round * 4 + i);
        printf("admission, max_bypass %d: A admitted at step %llu, B at %llu, C at %llu (done "
               "at %llu)\n", bypass[round], (unsigned long long)o[0].st.admitted_step,
               (unsigned long long)o[1].st.admitted_step,
               (unsigned long long)o[2].st.admitted_step, (unsigned long long)o[2].done_step);
        if (n == 4) printf("  C2 admitted at step %llu\n",
                           (unsigned long long)o[3].st.admitted_step);
        uint64_t a = o[0].st.admitted_step, b = o[1].st.admitted_step;
        uint64_t c = o[2].st.admitted_step;
        /* B cannot run beside A: it starts after A's last step */
        CHECK(b > a && b >= o[0].done_step);
        if (round == 0) CHECK(c < b && o[2].done_step < b); /* C done while B waited */
        if (round == 1) CHECK(c < b && o[3].st.admitted_step >= b); /* the bound */
        if (round == 2) CHECK(c >= b); /* FCFS: C waits behind B */
    }
    engine_kv_stats ks;
    engine_kv_cache_stats(m->kvc, &ks);
    CHECK(ks.n_used == 0 && ks.n_free + ks.n_cached == ks.n_blocks);
    engine_model_free(m);
}

/* ---- a small pool: preemption and an oversized request ----------------------------------- */
static void test_pressure(engine_model *ref, const char *path) {
    enum { NR = 6 };
    /* 6 x 70-75 positions on 20 blocks; or 3 x 38-40 on 5 (two are admitted with 2 blocks each
     * and 1 to spare, and both need a third after 2 tokens) */
    int nr = stress ? NR : 3, gen = stress ? 30 : 5, blocks = stress ? 20 : 5;
    size_t plen = stress ? 40 : 30;
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.n_threads = 2;
    mp.device = ENGINE_DEVICE_CPU;
    mp.n_ctx = N_CTX;
    mp.prefix_cache_bytes = (size_t)blocks * 4 * 2 * ENGINE_KV_BLOCK_SIZE * 2 * 64 * 2;
    engine_model *m = NULL;
    CHECK(engine_model_load(&m, path, &mp) == 0);
    if (!m) return;
    static int32_t p[NR][64], big[400];
    outcome o[NR + 1], w[NR];
    memset(o, 0, sizeof o);
    memset(w, 0, sizeof w);
    engine_sched *s = NULL;
    engine_sched_params sp = ENGINE_SCHED_PARAMS_INIT;
    sp.n_ctx = N_CTX;
    sp.max_seqs = nr;
    sp.prefill_chunk = 32;
    CHECK(engine_sched_new(&s, m, &sp) == 0);
    if (!s) goto out;
    for (int i = 0; i < nr; i++) {
        fill_prompt(p[i], 64, (uint32_t)(1000 + i));
        submit(s, &o[i], p[i], plen + (size_t)i, gen, NULL, 0);
    }
    fill_prompt(big, 400, 7);
    submit(s, &o[nr], big, 400, 4, NULL, 0); /* 26 blocks: more than the pool */
    wait_done(o, nr);
    wait_done(&o[nr], 1);
    engine_sched_stats ss;
    engine_sched_stats_get(s, &ss);
    engine_sched_free(s);
    int preempted = 0;
    for (int i = 0; i < nr; i++) {
        reference(ref, &w[i], p[i], plen + (size_t)i, gen, NULL, 0);
        same_output(&o[i], &w[i], "under pressure", i);
        preempted += o[i].st.preemptions;
    }
    printf("pressure: %d preemptions over %d requests of a %d-block pool\n", preempted, nr, blocks);
    CHECK(preempted > 0 && (uint64_t)preempted == ss.preemptions);
    CHECK(o[nr].rc == ENGINE_ENOMEM && o[nr].n_done == 1);
    engine_kv_stats ks;
    engine_kv_cache_stats(m->kvc, &ks);
    CHECK(ks.n_used == 0 && ks.n_free + ks.n_cached == ks.n_blocks);
    CHECK(ks.n_evicted > 0); /* the preempted requests' cached blocks were reclaimed */
out:
    engine_model_free(m);
}

/* ---- 1,000 random operations from 3 threads ---------------------------------------------- */
#define N_OPS 1000
static outcome rnd[N_OPS];
static int32_t rnd_prompt[256];

typedef struct {
    engine_sched *s;
    int first, n;
    uint32_t seed;
} rnd_arg;

static uint32_t xs(uint32_t *st) {
    *st ^= *st << 13;
    *st ^= *st >> 17;
    *st ^= *st << 5;
    return *st;
}

static void *rnd_thread(void *arg) {
    rnd_arg *a = arg;
    uint32_t st = a->seed;
    for (int k = a->first; k < a->first + a->n; k++) {
        uint32_t r = xs(&st);
        if (r % 3 == 0 && k > a->first) { /* cancel one of ours, maybe already done */
            int t = a->first + (int)(xs(&st) % (uint32_t)(k - a->first));
            pthread_mutex_lock(&mu);
            uint64_t id = rnd[t].id;
            pthread_mutex_unlock(&mu);
            int rc = engine_sched_cancel(a->s, id);
            if (rc != 0 && rc != ENGINE_EINVAL) support_fail("cancel: %d", rc);
            rnd[k].n_done = -1; /* not a request */
            continue;
        }
        size_t n = 1 + xs(&st) % 60;
        submit(a->s, &rnd[k], rnd_prompt + xs(&st) % 100, n, (int32_t)(1 + xs(&st) % 4), NULL,
               0);
        usleep(2000); /* requests keep arriving while others run */
    }
    return NULL;
}

static void test_random(const char *path) {
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.n_threads = 1;
    mp.device = ENGINE_DEVICE_CPU;
    mp.n_ctx = N_CTX;
    mp.prefix_cache_bytes = (size_t)24 * 4 * 2 * ENGINE_KV_BLOCK_SIZE * 2 * 64 * 2; /* 24 blocks */
    engine_model *m = NULL;
    CHECK(engine_model_load(&m, path, &mp) == 0);
    if (!m) return;
    fill_prompt(rnd_prompt, 256, 3);
    engine_sched *s = NULL;
    engine_sched_params sp = ENGINE_SCHED_PARAMS_INIT;
    sp.n_ctx = 128;
    sp.max_seqs = 8;
    sp.prefill_chunk = 32;
    CHECK(engine_sched_new(&s, m, &sp) == 0);
    if (s) {
        pthread_t th[3];
        rnd_arg args[3];
        for (int i = 0; i < 3; i++) {
            args[i] = (rnd_arg){s, i * (N_OPS / 3), i < 2 ? N_OPS / 3 : N_OPS - 2 * (N_OPS / 3),
                                (uint32_t)(12345 + i * 777)};
            pthread_create(&th[i], NULL, rnd_thread, &args[i]);
        }
        for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
        /* --stress: let the rest run to the end; else until 25 requests completed (some do
         * while the cancels and submits go on; under ASan a token costs most of a second) or
         * 30 s; engine_sched_free cancels what is left */
        engine_sched_stats ss;
        for (int i = 0; i < (stress ? 1000000 : 3000); i++) {
            engine_sched_stats_get(s, &ss);
            if (ss.running == 0 && ss.queued == 0) break;
            if (!stress && ss.requests_done - ss.requests_canceled >= 25) break;
            usleep(10000);
        }
        engine_sched_free(s); /* cancels whatever is still queued or running */
        int n_req = 0, canceled = 0;
        for (int k = 0; k < N_OPS; k++) {
            if (rnd[k].n_done == -1) continue;
            n_req++;
            if (rnd[k].n_done != 1) support_fail("request %d: on_done %d times", k, rnd[k].n_done);
            if (rnd[k].rc == ENGINE_ECANCELED) canceled++;
            else if (rnd[k].rc != 0) support_fail("request %d: rc %d", k, rnd[k].rc);
        }
        printf("random: %d requests, %d cancelled, %llu preemptions\n", n_req, canceled,
               (unsigned long long)ss.preemptions);
        engine_kv_stats ks;
        engine_kv_cache_stats(m->kvc, &ks);
        CHECK(ks.n_used == 0 && ks.n_free + ks.n_cached == ks.n_blocks);
        for (int32_t b = 0; b < ks.n_blocks; b++) CHECK(engine_kv_block_refcount(m->kvc, b) == 0);
        CHECK(engine_kv_evict(m->kvc, ks.n_blocks) == ks.n_cached);
        engine_kv_cache_stats(m->kvc, &ks);
        CHECK(ks.n_free == ks.n_blocks);
    }
    engine_model_free(m);
}

/* ---- bad input ---------------------------------------------------------------------------- */
static void test_bad_input(engine_model *m, const char *path) {
    engine_sched *s = NULL;
    engine_model_params vp = ENGINE_MODEL_PARAMS_INIT;
    vp.vocab_only = true;
    engine_model *vm = NULL;
    CHECK(engine_model_load(&vm, path, &vp) == 0);
    if (vm) CHECK(engine_sched_new(&s, vm, NULL) == ENGINE_EINVAL && !s);
    engine_model_free(vm);
    engine_sched_params sp = ENGINE_SCHED_PARAMS_INIT;
    sp.max_seqs = -1;
    CHECK(engine_sched_new(&s, m, &sp) == ENGINE_EINVAL && !s);
    sp = (engine_sched_params)ENGINE_SCHED_PARAMS_INIT;
    sp.version = 99;
    CHECK(engine_sched_new(&s, m, &sp) == ENGINE_EINVAL && !s);
    sp = (engine_sched_params)ENGINE_SCHED_PARAMS_INIT;
    sp.n_ctx = 64;
    sp.max_queue = 2;
    sp.max_seqs = 1;
    CHECK(engine_sched_new(&s, m, &sp) == 0);
    if (!s) return;
    int32_t p[100];
    fill_prompt(p, 100, 1);
    engine_request r;
    memset(&r, 0, sizeof r);
    engine_gen_params g = ENGINE_GEN_PARAMS_INIT;
    r.gen = g;
    uint64_t id = 77;
    CHECK(engine_sched_submit(s, &r, &id) == ENGINE_EINVAL && id == 0); /* no prompt */
    r.gen.prompt = p;
    r.gen.n_prompt = 65;
    CHECK(engine_sched_submit(s, &r, &id) == ENGINE_ERANGE); /* beyond n_ctx */
    r.gen.n_prompt = 3;
    p[1] = n_vocab;
    CHECK(engine_sched_submit(s, &r, &id) == ENGINE_EINVAL); /* id out of range */
    p[1] = 5;
    const char *empty[] = {""};
    r.gen.stop_strings = empty;
    r.gen.n_stop_strings = 1;
    CHECK(engine_sched_submit(s, &r, &id) == ENGINE_EINVAL);
    r.gen.n_stop_strings = 0;
    r.gen.version = 0;
    CHECK(engine_sched_submit(s, &r, &id) == ENGINE_EINVAL);
    CHECK(engine_sched_submit(s, NULL, &id) == ENGINE_EINVAL);
    CHECK(engine_sched_cancel(s, 0) == ENGINE_EINVAL);
    /* one slot, a queue of 2: after 3 long requests the 4th is refused */
    outcome o[4];
    memset(o, 0, sizeof o);
    submit(s, &o[0], p, 20, 40, NULL, 0);
    engine_sched_stats st;
    do {
        usleep(200);
        engine_sched_stats_get(s, &st);
    } while (st.running == 0 && o[0].n_done == 0);
    submit(s, &o[1], p, 60, 50, NULL, 0);
    submit(s, &o[2], p, 60, 50, NULL, 0);
    r.gen = g;
    r.gen.prompt = p;
    r.gen.n_prompt = 60;
    r.on_done = on_done;
    r.user = &o[3];
    CHECK(engine_sched_submit(s, &r, &id) == ENGINE_ERANGE && id == 0);
    engine_sched_free(s); /* cancels the three */
    for (int i = 0; i < 3; i++) /* the first may have filled its context already */
        CHECK(o[i].n_done == 1 && (o[i].rc == ENGINE_ECANCELED || o[i].rc == 0));
    CHECK(o[3].n_done == 0);
    engine_sched_free(NULL);
}

int main(int argc, char **argv) {
    stress = argc > 1 && strcmp(argv[1], "--stress") == 0;
    setvbuf(stdout, NULL, _IONBF, 0);
    int rc = support_init();
    if (rc) return rc;
    char dir[256], path[512];
    if (support_tmpdir(dir, sizeof dir, "test_sched", true)) return 1;
    snprintf(path, sizeof path, "%s/tiny.gguf", dir);
    if (support_gen("tiny", "q8_0", 21, path) != 0) return 1;
    engine_model *ref = support_load(path, 2, N_CTX, ENGINE_DEVICE_CPU);
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.n_threads = 2;
    mp.device = ENGINE_DEVICE_CPU;
    mp.n_ctx = N_CTX;
    mp.prefix_cache_bytes = (size_t)8 << 20;
    engine_model *m = NULL;
    CHECK(engine_model_load(&m, path, &mp) == 0);
    if (ref && m) {
        n_vocab = engine_model_n_vocab(m);
        double t = engine_time_ms();
#define STEP(call)                                                                             \
    do {                                                                                       \
        call;                                                                                  \
        printf("  (%s: %.1f s)\n", #call, (engine_time_ms() - t) / 1000);                      \
        t = engine_time_ms();                                                                  \
    } while (0)
        STEP(test_bad_input(m, path));
        STEP(test_batch_pass(ref));
        STEP(test_greedy(ref, m, ENGINE_SCHED_MODE_AUTO, stress ? 64 : 8, "batched"));
        STEP(test_greedy(ref, m, ENGINE_SCHED_MODE_SESSIONS, stress ? 8 : 3, "sessions"));
        STEP(test_cached(ref, m));
        STEP(test_hooks(ref, m));
        STEP(test_cancel(m));
        engine_kv_stats ks;
        engine_kv_cache_stats(m->kvc, &ks);
        CHECK(ks.n_used == 0);
        STEP(test_pressure(ref, path));
        STEP(test_admission(ref, path));
        STEP(test_random(path));
        /* Q8_0 KV (the model's type, so the scheduler's pool and the sessions use it): batched
         * == alone == a session with Q8_0 references (--stress: also the session path and the
         * prefix cache; test_kv_session and test_prefix_persist cover cached == cold for Q8_0
         * in the unit run) */
        engine_model *m8 = NULL;
        mp.kv_type = ENGINE_KV_Q8_0;
        CHECK(engine_model_load(&m8, path, &mp) == 0);
        kv_type = ENGINE_KV_Q8_0;
        if (m8) {
            CHECK(m8->kvc && m8->kvc->p.type == ENGINE_KV_Q8_0);
            STEP(test_batch_pass(ref));
            STEP(test_greedy(ref, m8, ENGINE_SCHED_MODE_AUTO, stress ? 64 : 4, "batched q8_0"));
            if (stress) {
                STEP(test_greedy(ref, m8, ENGINE_SCHED_MODE_SESSIONS, 3, "sessions q8_0"));
                STEP(test_cached(ref, m8));
            }
            engine_kv_cache_stats(m8->kvc, &ks);
            CHECK(ks.n_used == 0);
        }
        engine_model_free(m8);
    }
    engine_model_free(m);
    engine_model_free(ref);
    support_rmtree(dir);
    return support_finish(stress ? "test_sched --stress" : "test_sched");
}
