/* The batched GPU pass over several sequences with a paged KV pool (engine_cuda_batch_*,
 * engine/cuda/batch.cu, batch_mm.cu, paged_att.cu) against the same sequences run alone. Passes
 * with prompt tokens go through the prefill pass; decode steps (one token per sequence) through
 * the small-m decode pass, replayed from a CUDA graph per bucket of rows.
 *
 * For 1, 3 and 8 sequences with prompts of different lengths (1 .. 40 tokens, crossing block
 * boundaries of 16), on the generated tiny models (qwen3moe "tiny" and dense "qwen3-tiny") in
 * f32, q8_0 and q4_k_m with an F32 KV pool:
 *   solo: each sequence alone in its own GPU session through the prefill pass (its prompt in one
 *     pass, then N_DEC greedy tokens one pass each): the next-token logits after the prompt and
 *     after each greedy token;
 *   batched: the first half of the sequences' prompts in one pass, then a mixed pass with the
 *     other half's prompts and the first half's first decode token, then one decode token per
 *     sequence per pass (teacher-forced with the solo's greedy tokens), the KV through block
 *     tables taken from an engine/kv cache of the same block count and size (so the blocks of
 *     the sequences interleave in the pool).
 * Error bounds (those of test_cuda_batch's prefill check, stated, not tuned to pass): f32:
 * max |batched - solo| <= 1e-4 * (1 + max |logit|) at every compared position (the batched
 * rows' GEMMs are the solo rows' GEMMs; the attention sums in another order); quantised: cosine
 * >= 0.999 at every position of the dense model, and in the MoE model (where a rounding
 * difference can swap two near-tied experts) at most 1 position in 10 below 0.999 and none
 * below 0.9. f32: the batched greedy choice equals the solo one wherever the solo's top two
 * logits differ by more than 1e-3 * (1 + max |logit|).
 * Block accounting: while the sequences live the cache holds exactly their blocks; after they
 * are released every block is free again. Bad tables, tokens and sizes are refused before any
 * work (ENGINE_EINVAL / ENGINE_ERANGE).
 * Decode steps take the small-m pass here for up to 8 sequences (SPARK_CUDA_BATCH_SMALLM=64
 * unless set; the default sends more than 4 through the prefill pass, which the mixed passes
 * above run).
 * Decode graph: the graph replay against the same decode pass un-captured
 * (SPARK_CUDA_BATCH_DECODE=eager), 8 and 3 sequences ending one after another (buckets 8, 4
 * with padding rows, 2, 1): equal bit for bit at every step.
 * The scheduler on the GPU (f32 models, F32 KV): SPARK_SCHED_GPU_BATCH=1 against =0 (one session
 * per request), 6 requests 4 at a time with 32-token prefill chunks: the same greedy tokens,
 * and every block free at the end.
 * Exits 77 (skip) with the reason when no GPU is usable or the build has no CUDA backend. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"

#ifndef SPARK_HAVE_CUDA
int main(void) {
    printf("skip: this build has no CUDA backend\n");
    return 77;
}
#else
#include "cuda/cuda_backend.h"
#include "kv/kv.h"
#include "test_cuda_check.h"

static char tmpdir[256];

#define MAX_SEQS 8
#define N_DEC 6
#define N_CTX 128
#define N_POOL_BLOCKS 48 /* 8 sequences of up to 46 positions take 8 * 3 blocks */

static const int32_t prompt_len[MAX_SEQS] = {23, 5, 40, 16, 1, 33, 17, 9};

typedef support_logit_stats cmp_stats;

static void compare(cmp_stats *c, const float *ls, const float *lb, int32_t nv, int seq, int d) {
    const support_logit_row r = support_logit_add(c, ls, lb, nv);
    if (c->exact) {
        CHECK(r.max_diff <= 1e-4 * (1 + r.max_ref),
              "%s seq %d step %d: max |batched-solo| %.3g (max |l| %.3g)", c->what, seq, d,
              r.max_diff, r.max_ref);
        const int a = support_argmax(ls, nv), b = support_argmax(lb, nv);
        float second = -INFINITY;
        for (int32_t t = 0; t < nv; t++)
            if (t != a && ls[t] > second) second = ls[t];
        if (a != b && ls[a] - second > 1e-3 * (1 + r.max_ref))
            CHECK(0, "%s seq %d step %d: greedy %d batched, %d solo", c->what, seq, d, b, a);
    } else if (!c->moe) {
        CHECK(r.cosine >= 0.999, "%s seq %d step %d: cosine %.6f", c->what, seq, d, r.cosine);
    }
}

static void finish(cmp_stats *c) { support_logit_finish(c, "batched-solo", 40); }

/* Each sequence alone: tokens[i] = prompt then N_DEC greedy tokens; logits[i][d][nv]. */
static int run_solo(engine_cuda_model *gm, int n_seqs, int32_t (*tokens)[64], float *logits,
                    int32_t nv) {
    for (int i = 0; i < n_seqs; i++) {
        engine_cuda_session *s = NULL;
        engine_cuda_prefill *p = NULL;
        int rc = engine_cuda_session_new(&s, gm, N_CTX, ENGINE_KV_F32);
        if (!rc) rc = engine_cuda_prefill_new(&p, gm, s, 64);
        const int32_t L = prompt_len[i];
        float *l = logits + (size_t)i * (N_DEC + 1) * nv;
        if (!rc) rc = engine_cuda_prefill_run(p, tokens[i], L, 0, NULL, l);
        for (int d = 1; !rc && d <= N_DEC; d++) {
            tokens[i][L + d - 1] = support_argmax(l + (size_t)(d - 1) * nv, nv);
            rc = engine_cuda_prefill_run(p, &tokens[i][L + d - 1], 1, L + d - 1, NULL,
                                         l + (size_t)d * nv);
        }
        engine_cuda_prefill_free(p);
        engine_cuda_session_free(s);
        if (rc) return rc;
    }
    return 0;
}

typedef struct {
    engine_kv_seq ks;
    int32_t fed; /* tokens given to the batched pass so far */
} seq_state;

/* held: blocks the caller holds in kc besides the sequences' */
static void run_case(engine_cuda_model *gm, engine_kv_cache *kc, engine_cuda_batch *gb,
                     int n_seqs, int held, bool exact, bool moe, const char *name,
                     const int32_t *vocab_seed, int32_t nv) {
    int32_t tokens[MAX_SEQS][64];
    float *solo = malloc(sizeof(float) * MAX_SEQS * (N_DEC + 1) * (size_t)nv);
    float *bat = malloc(sizeof(float) * MAX_SEQS * (size_t)nv);
    seq_state st[MAX_SEQS];
    memset(st, 0, sizeof st);
    const int half = n_seqs > 1 ? n_seqs / 2 : 1; /* sequences whose prompt goes in pass 0 */
    char what[160];
    snprintf(what, sizeof what, "%s, %d sequences", name, n_seqs);
    cmp_stats c = {.exact = exact, .moe = moe, .worst_cos = 1, .what = what};
    if (!solo || !bat) {
        CHECK(0, "out of memory");
        goto done;
    }
    for (int i = 0; i < n_seqs; i++)
        for (int j = 0; j < prompt_len[i]; j++)
            tokens[i][j] = (vocab_seed[i] + 37 * j + 11 * j * j) % nv;
    if (run_solo(gm, n_seqs, tokens, solo, nv) != 0) {
        CHECK(0, "%s: solo run", c.what);
        goto done;
    }
    for (int i = 0; i < n_seqs; i++)
        if (engine_kv_seq_init(kc, &st[i].ks, N_CTX) != 0) {
            CHECK(0, "%s: kv seq init", c.what);
            goto done;
        }
    for (int pass = 0;; pass++) {
        engine_cuda_batch_seq bs[MAX_SEQS];
        int idx[MAX_SEQS], step[MAX_SEQS], nb = 0;
        for (int i = 0; i < n_seqs; i++) {
            const int32_t L = prompt_len[i];
            if (st[i].fed >= L + N_DEC) continue; /* the last greedy token is fed: done */
            if (st[i].fed == 0 && i >= half && pass == 0) continue; /* starts in pass 1 */
            const int32_t n = st[i].fed == 0 ? L : 1;
            if (engine_kv_seq_extend(kc, &st[i].ks, st[i].fed + n) != 0) {
                CHECK(0, "%s: kv extend", c.what);
                goto done;
            }
            bs[nb] = (engine_cuda_batch_seq){tokens[i] + st[i].fed, n, st[i].fed,
                                             st[i].ks.blocks, st[i].ks.n_blocks,
                                             bat + (size_t)nb * nv};
            idx[nb] = i;
            step[nb] = st[i].fed == 0 ? 0 : st[i].fed - L + 1;
            st[i].fed += n;
            nb++;
        }
        if (nb == 0) break;
        if (engine_cuda_batch_run(gb, bs, nb) != 0) {
            CHECK(0, "%s: batched pass %d", c.what, pass);
            goto done;
        }
        for (int j = 0; j < nb; j++)
            compare(&c, solo + ((size_t)idx[j] * (N_DEC + 1) + step[j]) * nv,
                    bat + (size_t)j * nv, nv, idx[j], step[j]);
    }
    {
        engine_kv_stats ks;
        engine_kv_cache_stats(kc, &ks);
        int32_t want = held;
        for (int i = 0; i < n_seqs; i++)
            want += st[i].ks.n_blocks;
        CHECK(ks.n_used == want && ks.n_free == ks.n_blocks - want,
              "%s: %d blocks used, %d free of %d (the sequences hold %d)", c.what, ks.n_used,
              ks.n_free, ks.n_blocks, want);
    }
    finish(&c);
done:
    for (int i = 0; i < n_seqs; i++)
        engine_kv_seq_deinit(kc, &st[i].ks);
    {
        engine_kv_stats ks;
        engine_kv_cache_stats(kc, &ks);
        CHECK(ks.n_used == held && ks.n_free == ks.n_blocks - held,
              "%s: after release %d blocks used, %d free of %d (%d held)", c.what, ks.n_used,
              ks.n_free, ks.n_blocks, held);
    }
    free(solo);
    free(bat);
}

static void check_errors(engine_cuda_batch *gb, int32_t nv) {
    int32_t tok[4] = {1, 2, 3, 4}, blocks[2] = {0, 1};
    float *l = malloc(sizeof(float) * (size_t)nv);
    engine_cuda_batch_seq s = {tok, 4, 0, blocks, 1, l};
    s.blocks = blocks;
    blocks[0] = N_POOL_BLOCKS;
    CHECK(engine_cuda_batch_run(gb, &s, 1) == ENGINE_EINVAL, "block id past the pool");
    blocks[0] = -1;
    CHECK(engine_cuda_batch_run(gb, &s, 1) == ENGINE_EINVAL, "negative block id");
    blocks[0] = 0;
    s.pos = 14; /* positions 14..17 need two blocks */
    CHECK(engine_cuda_batch_run(gb, &s, 1) == ENGINE_EINVAL, "short block table");
    s.pos = N_CTX - 2;
    CHECK(engine_cuda_batch_run(gb, &s, 1) == ENGINE_ERANGE, "past the positions");
    s.pos = 0;
    tok[2] = nv;
    CHECK(engine_cuda_batch_run(gb, &s, 1) == ENGINE_EINVAL, "token id past the vocabulary");
    tok[2] = 3;
    engine_cuda_batch_seq many[MAX_SEQS + 1];
    for (int i = 0; i <= MAX_SEQS; i++)
        many[i] = s;
    CHECK(engine_cuda_batch_run(gb, many, MAX_SEQS + 1) == ENGINE_EINVAL, "too many sequences");
    CHECK(engine_cuda_batch_run(gb, many, 0) == ENGINE_EINVAL, "no sequence");
    free(l);
}

/* The scheduler on a GPU model (F32 KV): SPARK_SCHED_GPU_BATCH=1 (one batched pass per step)
 * against the default (one session per request): 6 requests, 4 at a time, prompts in chunks of
 * 32 tokens per step, 8 greedy tokens each; the same tokens (f32 weights: the two paths differ
 * by summation order only, far below the gap of the top two logits of these models), and every
 * block free again at the end. Requests 1 and 4 carry a grammar stand-in (support.h: not free
 * at its 3rd and 4th tokens, its mask another from the 6th), which a GPU streak draws through
 * its free stretches only. */
#define SCHED_REQS 6
#define SCHED_GEN 8

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending;
    int rc[SCHED_REQS];
    int32_t toks[SCHED_REQS][SCHED_GEN];
    int n[SCHED_REQS];
} sched_run;

typedef struct {
    sched_run *r;
    int i;
} sched_ctx;

static int sched_tok(void *user, const char *text, size_t len, int32_t token) {
    (void)text;
    (void)len;
    sched_ctx *c = user;
    if (token >= 0 && c->r->n[c->i] < SCHED_GEN) c->r->toks[c->i][c->r->n[c->i]++] = token;
    return 0;
}

static void sched_done(void *user, uint64_t id, int rc, const engine_request_stats *st) {
    (void)id;
    (void)st;
    sched_ctx *c = user;
    pthread_mutex_lock(&c->r->mu);
    c->r->rc[c->i] = rc;
    c->r->pending--;
    pthread_cond_signal(&c->r->cv);
    pthread_mutex_unlock(&c->r->mu);
}

/* streak: SPARK_SCHED_GPU_STREAK=1 (the default; sessions mode: a request decoding alone draws
 * on the GPU), else =0;
 * serial: each request submitted once the one before it is done (so every one runs alone). */
static void sched_once(engine_model *m, bool gpu_batch, bool streak, bool serial, sched_run *run,
                       const char *name) {
    memset(run, 0, sizeof *run);
    pthread_mutex_init(&run->mu, NULL);
    pthread_cond_init(&run->cv, NULL);
    setenv("SPARK_SCHED_GPU_BATCH", gpu_batch ? "1" : "0", 1);
    setenv("SPARK_SCHED_GPU_STREAK", streak ? "1" : "0", 1);
    engine_sched_params sp = ENGINE_SCHED_PARAMS_INIT;
    sp.max_seqs = 4;
    sp.n_ctx = N_CTX;
    sp.prefill_chunk = 32;
    engine_sched *s = NULL;
    int rc = engine_sched_new(&s, m, &sp);
    unsetenv("SPARK_SCHED_GPU_BATCH");
    unsetenv("SPARK_SCHED_GPU_STREAK");
    CHECK(rc == 0, "%s: scheduler (%s)", name, gpu_batch ? "GPU batched" : "sessions");
    if (rc) {
        for (int i = 0; i < SCHED_REQS; i++)
            run->rc[i] = rc;
        return;
    }
    const int32_t nv = engine_model_n_vocab(m);
    static int32_t prompts[SCHED_REQS][64];
    static support_fake_grammar fg[SCHED_REQS];
    sched_ctx ctx[SCHED_REQS];
    for (int i = 0; i < SCHED_REQS; i++) {
        for (int j = 0; j < prompt_len[i]; j++)
            prompts[i][j] = (17 * i + 41 * j + 5 * j * j + 1) % nv;
        ctx[i] = (sched_ctx){run, i};
        engine_request r = {ENGINE_GEN_PARAMS_INIT, sched_tok, sched_done, &ctx[i]};
        r.gen.prompt = prompts[i];
        r.gen.n_prompt = (size_t)prompt_len[i];
        r.gen.max_tokens = SCHED_GEN;
        r.gen.ignore_eog = true;
        r.gen.sampling.temperature = 0.0f;
        if (i % 3 == 1) support_fake_grammar_use(&r.gen.sampling, &fg[i], 3, 5, 6);
        uint64_t id;
        pthread_mutex_lock(&run->mu);
        run->pending++;
        pthread_mutex_unlock(&run->mu);
        if ((rc = engine_sched_submit(s, &r, &id)) != 0) {
            CHECK(0, "%s: submit %d", name, i);
            pthread_mutex_lock(&run->mu);
            run->pending--;
            run->rc[i] = rc;
            pthread_mutex_unlock(&run->mu);
        }
        if (serial) {
            pthread_mutex_lock(&run->mu);
            while (run->pending > 0)
                pthread_cond_wait(&run->cv, &run->mu);
            pthread_mutex_unlock(&run->mu);
        }
    }
    pthread_mutex_lock(&run->mu);
    while (run->pending > 0)
        pthread_cond_wait(&run->cv, &run->mu);
    pthread_mutex_unlock(&run->mu);
    if (gpu_batch) { /* the stats are refreshed after the step that ended the last request */
        engine_sched_stats st;
        memset(&st, 0, sizeof st);
        for (int t = 0; t < 200; t++) {
            engine_sched_stats_get(s, &st);
            if (st.requests_done == SCHED_REQS && st.blocks_used == 0) break;
            usleep(5000);
        }
        CHECK(st.blocks_used == 0 && st.blocks_total > 0 && st.requests_done == SCHED_REQS,
              "%s: GPU batched scheduler: %d of %d blocks used at the end, %llu requests done",
              name, st.blocks_used, st.blocks_total, (unsigned long long)st.requests_done);
    }
    engine_sched_free(s);
    pthread_cond_destroy(&run->cv);
    pthread_mutex_destroy(&run->mu);
}

static void run_sched(const char *path, const char *name) {
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.device = ENGINE_DEVICE_CUDA;
    mp.n_ctx = N_CTX;
    mp.kv_type = ENGINE_KV_F32;
    engine_model *m = NULL;
    if (engine_model_load(&m, path, &mp) != 0) {
        CHECK(0, "load %s on cuda", path);
        return;
    }
    static sched_run a, b, c, d;
    sched_once(m, false, false, false, &a, name);
    sched_once(m, true, false, false, &b, name);
    /* the GPU streak: every request alone (serial), and the four at once (the last one left
     * runs alone; a submission or the end stops a streak) */
    sched_once(m, false, true, true, &c, name);
    sched_once(m, false, true, false, &d, name);
    int same_streak = 0;
    for (int i = 0; i < SCHED_REQS; i++) {
        const sched_run *v[2] = {&c, &d};
        for (int k = 0; k < 2; k++) {
            bool eq = v[k]->rc[i] == 0 && v[k]->n[i] == a.n[i] &&
                      !memcmp(v[k]->toks[i], a.toks[i], sizeof(int32_t) * SCHED_GEN);
            CHECK(eq, "%s: request %d: the GPU streak's tokens (%s) differ from the sessions' (rc "
                      "%d, %d tokens)",
                  name, i, k ? "together" : "serial", v[k]->rc[i], v[k]->n[i]);
            same_streak += eq;
        }
    }
    printf("%-40s: scheduler, sessions with the GPU streak vs without: %d of %d runs identical\n",
           name, same_streak, 2 * SCHED_REQS);
    int banned = 0; /* the grammar requests' tokens: none the stand-in bans */
    for (int i = 1; i < SCHED_REQS; i += 3)
        for (int j = 0; j < d.n[i]; j++)
            banned += d.toks[i][j] % 5 == (j >= 6 ? 2 : 1);
    CHECK(banned == 0, "%s: %d tokens the grammar stand-in bans", name, banned);
    int same = 0;
    for (int i = 0; i < SCHED_REQS; i++) {
        CHECK(a.rc[i] == 0 && b.rc[i] == 0, "%s: request %d: rc %d (sessions), %d (GPU batched)",
              name, i, a.rc[i], b.rc[i]);
        CHECK(a.n[i] == SCHED_GEN && b.n[i] == SCHED_GEN, "%s: request %d: %d and %d tokens",
              name, i, a.n[i], b.n[i]);
        bool eq = a.n[i] == b.n[i] && !memcmp(a.toks[i], b.toks[i], sizeof(int32_t) * SCHED_GEN);
        CHECK(eq, "%s: request %d: the GPU batched scheduler's tokens differ from the sessions'",
              name, i);
        same += eq;
    }
    printf("%-40s: scheduler, GPU batched vs sessions: %d of %d requests identical\n", name,
           same, SCHED_REQS);
    engine_model_free(m);
}

/* The decode step's CUDA graph per bucket against the same pass un-captured
 * (SPARK_CUDA_BATCH_DECODE=eager), two batch objects over the same block tables: the prompts in
 * one pass, then decode steps (greedy from the un-captured logits, fed to both) while the
 * sequences end one after another (sequence i takes N_DEC + 2 - i tokens), so the steps take
 * buckets 8, 4 (with padding rows), 2 and 1 and replay each bucket's graph several times. The
 * logits must be equal bit for bit at every step. */
static void run_graph_case(engine_cuda_model *gm, engine_kv_cache *kc, int n_seqs,
                           const char *name, const int32_t *vocab_seed, int32_t nv) {
    engine_kv_stats kst;
    engine_kv_cache_stats(kc, &kst);
    engine_cuda_batch *ge = NULL, *gg = NULL;
    setenv("SPARK_CUDA_BATCH_DECODE", "eager", 1);
    int rc = engine_cuda_batch_new(&ge, gm, kst.n_blocks, kst.block_size, N_CTX, 256, MAX_SEQS,
                                   ENGINE_KV_F32);
    unsetenv("SPARK_CUDA_BATCH_DECODE");
    if (!rc)
        rc = engine_cuda_batch_new(&gg, gm, kst.n_blocks, kst.block_size, N_CTX, 256, MAX_SEQS,
                                   ENGINE_KV_F32);
    CHECK(rc == 0, "%s: two batch objects", name);
    float *le = malloc(sizeof(float) * MAX_SEQS * (size_t)nv);
    float *lg = malloc(sizeof(float) * MAX_SEQS * (size_t)nv);
    engine_kv_seq ks[MAX_SEQS];
    int32_t tokens[MAX_SEQS][64], fed[MAX_SEQS], n_dec[MAX_SEQS];
    int n_init = 0, steps = 0, rows = 0, differ = 0;
    if (rc || !le || !lg) {
        CHECK(!rc, "%s: out of memory", name);
        goto done;
    }
    for (int i = 0; i < n_seqs; i++) {
        for (int j = 0; j < prompt_len[i]; j++)
            tokens[i][j] = (vocab_seed[i] + 13 * j + 7 * j * j) % nv;
        fed[i] = 0;
        n_dec[i] = N_DEC + 2 - i > 1 ? N_DEC + 2 - i : 1;
        if (engine_kv_seq_init(kc, &ks[i], N_CTX) != 0) {
            CHECK(0, "%s: kv seq init", name);
            goto done;
        }
        n_init++;
    }
    for (int pass = 0;; pass++) {
        engine_cuda_batch_seq be[MAX_SEQS], bg[MAX_SEQS];
        int idx[MAX_SEQS], nb = 0;
        for (int i = 0; i < n_seqs; i++) {
            const int32_t L = prompt_len[i], n = fed[i] == 0 ? L : 1;
            if (fed[i] >= L + n_dec[i]) continue;
            if (engine_kv_seq_extend(kc, &ks[i], fed[i] + n) != 0) {
                CHECK(0, "%s: kv extend", name);
                goto done;
            }
            be[nb] = (engine_cuda_batch_seq){tokens[i] + fed[i], n, fed[i], ks[i].blocks,
                                             ks[i].n_blocks, le + (size_t)nb * nv};
            bg[nb] = be[nb];
            bg[nb].logits = lg + (size_t)nb * nv;
            idx[nb++] = i;
            fed[i] += n;
        }
        if (nb == 0) break;
        if (engine_cuda_batch_run(ge, be, nb) != 0 || engine_cuda_batch_run(gg, bg, nb) != 0) {
            CHECK(0, "%s: pass %d", name, pass);
            goto done;
        }
        steps += pass > 0;
        for (int j = 0; j < nb; j++) {
            const int i = idx[j];
            const bool same = !memcmp(le + (size_t)j * nv, lg + (size_t)j * nv,
                                      sizeof(float) * (size_t)nv);
            CHECK(same, "%s: pass %d (%d sequences), sequence %d: graph and un-captured logits "
                  "differ", name, pass, nb, i);
            differ += !same;
            rows += pass > 0;
            tokens[i][fed[i]] = support_argmax(le + (size_t)j * nv, nv);
        }
    }
    printf("%-40s: decode graph vs un-captured, %d sequences: %d steps, %d rows, %d differ\n",
           name, n_seqs, steps, rows, differ);
done:
    for (int i = 0; i < n_init; i++)
        engine_kv_seq_deinit(kc, &ks[i]);
    free(le);
    free(lg);
    engine_cuda_batch_free(ge);
    engine_cuda_batch_free(gg);
}

static void run_model(const char *preset, const char *type) {
    char path[600], name[64];
    snprintf(path, sizeof path, "%s/%s-%s.gguf", tmpdir, preset, type);
    snprintf(name, sizeof name, "%s %s", preset, type);
    if (support_gen(preset, type, 29, path) != 0) {
        CHECK(0, "model gen %s", name);
        return;
    }
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.device = ENGINE_DEVICE_CPU;
    mp.n_ctx = N_CTX;
    engine_model *m = NULL;
    engine_cuda_model *gm = NULL;
    engine_cuda_batch *gb = NULL;
    engine_kv_cache *kc = NULL;
    if (engine_model_load(&m, path, &mp) != 0) {
        CHECK(0, "load %s", path);
        unlink(path);
        return;
    }
    engine_model_info info;
    engine_model_info_get(m, &info);
    const int32_t nv = engine_model_n_vocab(m);
    engine_kv_params kp;
    memset(&kp, 0, sizeof kp);
    kp.n_layer = info.n_layer;
    kp.n_head_kv = info.n_head_kv;
    kp.head_dim = info.head_dim;
    kp.type = ENGINE_KV_F32;
    kp.block_size = ENGINE_KV_BLOCK_SIZE;
    kp.budget_bytes = (size_t)N_POOL_BLOCKS * kp.n_layer * 2 * ENGINE_KV_BLOCK_SIZE *
                      (size_t)kp.n_head_kv * kp.head_dim * sizeof(float);
    CHECK(engine_kv_cache_new(&kc, &kp) == 0, "kv cache");
    CHECK(engine_cuda_model_new(&gm, m, 0) == 0, "cuda model %s", name);
    if (kc && gm) {
        engine_kv_stats ks;
        engine_kv_cache_stats(kc, &ks);
        CHECK(ks.n_blocks == N_POOL_BLOCKS, "kv cache of %d blocks", ks.n_blocks);
        CHECK(engine_cuda_batch_new(&gb, gm, ks.n_blocks, ks.block_size, N_CTX, 256, MAX_SEQS,
                                    ENGINE_KV_F32) == 0,
              "cuda batch %s", name);
    }
    if (gb) {
        const bool exact = strcmp(type, "f32") == 0, moe = strcmp(info.arch, "qwen3moe") == 0;
        const int32_t seeds[MAX_SEQS] = {3, 101, 577, 1009, 7, 2203, 99, 4001};
        /* a few blocks taken first, so that the sequences' blocks are not 0, 1, 2, ... */
        int32_t hold[5];
        for (int i = 0; i < 5; i++)
            CHECK(engine_kv_block_alloc(kc, &hold[i]) == 0, "hold a block");
        engine_kv_block_unref(kc, hold[1]);
        engine_kv_block_unref(kc, hold[3]);
        const int counts[3] = {1, 3, 8};
        for (int i = 0; i < 3; i++)
            run_case(gm, kc, gb, counts[i], 3, exact, moe, name, seeds, nv);
        engine_kv_block_unref(kc, hold[0]);
        engine_kv_block_unref(kc, hold[2]);
        engine_kv_block_unref(kc, hold[4]);
        run_graph_case(gm, kc, MAX_SEQS, name, seeds, nv);
        run_graph_case(gm, kc, 3, name, seeds, nv);
        check_errors(gb, nv);
        engine_kv_stats ks;
        engine_kv_cache_stats(kc, &ks);
        CHECK(ks.n_used == 0 && ks.n_free == ks.n_blocks, "%s: at the end %d used, %d free of %d",
              name, ks.n_used, ks.n_free, ks.n_blocks);
    }
    engine_cuda_batch_free(gb);
    engine_cuda_model_free(gm);
    engine_kv_cache_free(kc);
    engine_model_free(m);
    if (!strcmp(type, "f32")) run_sched(path, name);
    unlink(path);
}

int main(int argc, char **argv) {
    if (engine_cuda_usable() != 0) {
        printf("skip: %s\n", engine_error_last());
        return 77;
    }
    /* every decode step of up to MAX_SEQS sequences through the small-m pass (by default more
     * than 4 take the prefill pass, which the mixed passes here run anyway), unless the caller
     * set the threshold */
    setenv("SPARK_CUDA_BATCH_SMALLM", "64", 0);
    const int rc = support_init();
    if (rc) return rc;
    if (support_tmpdir(tmpdir, sizeof tmpdir, "test_cuda_batch_paged", false) != 0) return 1;
    if (argc == 3) {
        run_model(argv[1], argv[2]);
    } else {
        const char *types[] = {"f32", "q8_0", "q4_k_m"};
        for (int i = 0; i < 3; i++) {
            run_model("tiny", types[i]);
            run_model("qwen3-tiny", types[i]);
        }
    }
    support_rmtree(tmpdir);
    return support_finish("test_cuda_batch_paged");
}
#endif
