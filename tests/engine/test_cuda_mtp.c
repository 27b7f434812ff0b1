/* MTP speculative decoding on the CUDA backend for qwen35moe (engine/cuda/q35_mtp_host.cuh,
 * q35_verify.cu) on the generator's qwen35-tiny (one MTP block), in f32 and q4_k_m, KV F32.
 *
 * Checks and their bounds (stated, not tuned to pass):
 *   verify     the prompt appended in verify passes of 1..5 tokens with MTP on (logits of every
 *              position) against the plain decode step token by token: bit for bit (the
 *              m-vector matvec sums each product in the decode matvec's order, the MoE,
 *              DeltaNet and attention run the decode's device code per token); the verify,
 *              rollback and fast checks run twice: SPARK_CUDA_MTP_FUSED=0 (every part per
 *              token) and =1 (the fused launches: the DeltaNet step of all m tokens in one
 *              launch, MoE up / down blocks serving all m tokens, the m attention queries in
 *              one launch + one merge, the matvec's L1 prefetch, the MTP feed's KV rows alone,
 *              the tokens of small matvecs as a grid dimension, the heads' m-vector matvec
 *              with four rows per warp (h4; h3, 3 blocks per SM, runs in the default);
 *              each keeps every token's arithmetic and order, so also bit for bit); when =1
 *              fails, each part runs alone too, to say which one; and a third time with
 *              =tok,dn,aearly (every matvec and head as the decode matvec's launch per token,
 *              the tokens as a grid dimension; the DeltaNet steps as the decode's launch with
 *              its early reads / cluster, later tokens launched serially; the attention with
 *              the decode's early prefetch: the decode's device code and launch shapes, so bit
 *              for bit); and =hseq,dn2 (the heads on the decode's grid, the tokens in turn in
 *              each block; the later tokens' DeltaNet steps waiting before their early reads);
 *              and the default parts (SPARK_CUDA_MTP_FUSED empty: dec1, split, h3, dn2, fatt,
 *              dearly; dec1: passes of one token on the decode matvec; dearly: the m tokens'
 *              DeltaNet steps in one launch of the decode's early cluster kernel's shape from
 *              m = 2 on), and those without dearly (a decode DeltaNet launch per token); each
 *              part alone if one of these fails
 *   feed       SPARK_CUDA_MTP_FUSED=feed (the verify pass feeds only the MTP block's K/V rows)
 *              against the whole block: after 48 tokens in verify passes of 3, 4, 5, 1, 2, ..
 *              (the first at p0 = 0, where pairs 0 and 1 share position 0) the MTP K/V rows and
 *              the draft logits of steps 0..3 bit for bit; both also fed in passes of 5, and all
 *              four sessions' drafts against the CPU's (check_draft's bounds), which says which
 *              side is wrong when they differ; and =fatt (the block's launches up to its
 *              attention, which stores the rows: o_proj and MoE left out) in passes of 3, 4, 5,
 *              1, 2, ..: K/V rows and drafts bit for bit the whole block's
 *   draft      GPU draft logits against the CPU's (engine_q35_mtp_step), steps 0..3 chained on
 *              the CPU's greedy drafts after the prompt: f32 max |gpu - cpu| <= 5e-4 (1 + max
 *              |logit|) (test_cuda_qwen35's bound for the whole model: summation order only);
 *              q4_k_m cosine >= 0.9 at every step (test_cuda_qwen35's floor for quantised
 *              files: the 8-bit activations round as the CPU's, but a rounding tie can fall
 *              the other way and swap two near-tied experts of the block's MoE; measured
 *              0.985 .. 0.996 on the H200)
 *   rollback   after a verify pass of 5 tokens, truncation to each point inside it (the
 *              per-token states) and to points before it (a snapshot + recompute), then one more
 *              token: its logits and the draft logits after it equal, bit for bit, those of a
 *              session that only ever saw the kept tokens
 *   greedy     engine_generate (device cuda) with mtp_draft 1..4 emits exactly the tokens of
 *              plain greedy decoding and leaves the session holding the same tokens; with an
 *              oracle drafter (engine_spec_decode_ex: the true continuation, wrong every third
 *              position) drafts are both accepted and rejected and the output is unchanged
 *   fast       the device-resident greedy loop (engine_cuda_q35_spec_generate) for k 1..4
 *              reproduces plain greedy decoding (engine_cuda_q35_generate)
 *   sampling   engine_generate at temperature 1 with mtp_draft 2 runs to max_tokens and a seed
 *              repeats (the distribution test is the CPU's, test_mtp: the same spec.c loop)
 *   prefill    SPARK_CUDA_MTP_PREFILL=6 (appends of >= 6 tokens; the default is 16): prompts of
 *              23 and 300 tokens of an MTP session through its prefill (64-token chunks: the
 *              pending hidden state crosses 4 chunk borders)
 *              which also feeds the MTP block: (a) the last logits equal, bit for bit, those of
 *              the same prefill on a plain session (the feed leaves the main pass alone); (b)
 *              against a session fed by verify passes: the last logits, the MTP KV rows 0..n-2
 *              and the draft logits of steps 0..3 within 5e-5 (1 + max |ref|) (f32: the prefill
 *              against the decode step's arithmetic, summation order only; measured <= 4.4e-6
 *              on the H200), quantised cosine >= 0.97 (logits, KV) / 0.9 (drafts: the
 *              draft check's floor); (c) the device greedy loop k 1..4 after the prefilled
 *              prompt emits exactly the plain session's greedy tokens (prefill + decode steps:
 *              the verify passes equal the decode step bit for bit); (d) truncation into the
 *              prefilled prompt (to 299: snapshot 288 + an 11-token prefill; 260: snapshot 256 +
 *              a verify pass, then a 40-token prefill at 260; 100: no snapshot, from 0) and the
 *              rest appended again: the logits after the prompt and the first draft's within
 *              the bounds of (b) of the first pass's, and (f32) the greedy loop's tokens
 *              identical (quantised: printed; a near-tied expert may swap after the recompute's
 *              rounding, as test_cuda_q35_prefill's rollback bound says); engine_generate
 *              (check_api, below) runs with SPARK_CUDA_MTP_PREFILL=1 (the default threshold),
 *              its plain reference through the same prefill
 *   dec / rf   the verify check (with rollback and fast loop) again with SPARK_CUDA_MTP_MOE=dec
 *              (the verify pass's MoE on the decode step's kernels, the tokens as a grid
 *              dimension) and with SPARK_CUDA_Q35_ROUTER_FUSE=1 and =0 (read at session
 *              creation; 1 is the default: the plain decode step and the verify pass both with
 *              the router and shared-gate logits in the output projection's launch, the tokens
 *              at once in each block (the default), SPARK_CUDA_MTP_RF=seq in turn or =grid as
 *              a grid dimension; the MTP block unfused), FUSED 0 and 1, and the default parts
 *              with SPARK_CUDA_MTP_STAGE=serial (the m vectors staged one after the other
 *              instead of side by side), SPARK_CUDA_MTP_MOE_WAVE=0 (a decode grid of MoE blocks
 *              per token instead of one wave for all), SPARK_CUDA_MTP_FORK=0 (the shared
 *              expert's gate/up and DeltaNet's z in line instead of on the side branch) and
 *              SPARK_CUDA_MTP_FEED_FORK=0 (the MTP feed after the head, not beside it): bit
 *              for bit as above (each token's MoE and
 *              fused launch are the decode step's blocks); that the fusion is on at all: a
 *              =1 session's decode logits differ from a =0 session's somewhere in 16 steps (F32
 *              rounding of the router logits) and keep cosine >= 0.99 (f32) / 0.9 (a near
 *              tie may swap two experts; test_cuda_qwen35 bounds the fused model);
 *              engine_generate (check_api) once more with =0
 * Exits 77 (skip) with the reason when no GPU is usable or the build has no CUDA backend. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"

#ifndef SPARK_HAVE_CUDA
int main(void) {
    printf("skip: this build has no CUDA backend\n");
    return 77;
}
#else
#include "cuda/cuda_backend.h"
#include "cuda/q35_mtp.h"
#include "model/model_int.h"
#include "sample/spec.h"
#include "test_cuda_check.h"

#define N_CTX 256
#define N_PROMPT 23
#define N_GEN 12

static char tmpdir[256];

typedef struct {
    int32_t toks[256];
    int n;
} collect;

static int on_token(void *user, const char *text, size_t len, int32_t token) {
    (void)text;
    (void)len;
    collect *c = user;
    if (token >= 0 && c->n < 256) c->toks[c->n++] = token;
    return 0;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static double max_abs(const float *a, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(a[i]));
    return m;
}

/* engine_cuda_q35_mtp_enable on s with SPARK_CUDA_MTP_FUSED set to fused (read when MTP turns
 * on), the caller's value restored afterwards. */
static int enable_with(engine_cuda_q35_session *s, const char *fused, bool *was) {
    const char *e = getenv("SPARK_CUDA_MTP_FUSED");
    char keep[64] = "";
    const bool had = e != NULL;
    if (had) snprintf(keep, sizeof keep, "%s", e);
    setenv("SPARK_CUDA_MTP_FUSED", fused, 1);
    const int rc = engine_cuda_q35_mtp_enable(s, was);
    if (had)
        setenv("SPARK_CUDA_MTP_FUSED", keep, 1);
    else
        unsetenv("SPARK_CUDA_MTP_FUSED");
    return rc;
}

/* name = value (NULL: unset) for what follows; returns the previous value (malloc'd, or NULL)
 * for env_restore. */
static char *env_set(const char *name, const char *value) {
    const char *e = getenv(name);
    char *old = e ? strdup(e) : NULL;
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    return old;
}

static void env_restore(const char *name, char *old) {
    if (old)
        setenv(name, old, 1);
    else
        unsetenv(name);
    free(old);
}

/* SPARK_CUDA_Q35_ROUTER_FUSE=1 takes effect: plain decode sessions with =1 and =0 on the same
 * tokens give logits that differ (the fused router logits round differently) but agree
 * closely. */
static void check_rf_on(engine_model *m, engine_cuda_q35_model *gm, const char *type) {
    const int32_t nv = engine_model_n_vocab(m);
    engine_cuda_q35_session *s[2] = {NULL, NULL};
    float *l[2] = {malloc(sizeof(float) * nv), malloc(sizeof(float) * nv)};
    for (int f = 0; f < 2; f++) {
        char *old = env_set("SPARK_CUDA_Q35_ROUTER_FUSE", f ? "1" : "0");
        CHECK(engine_cuda_q35_session_new(&s[f], gm, N_CTX, ENGINE_KV_F32) == 0, "session");
        env_restore("SPARK_CUDA_Q35_ROUTER_FUSE", old);
    }
    double worst = 0, cmin = 1;
    for (int i = 0; s[0] && s[1] && l[0] && l[1] && i < 16; i++) {
        const int32_t tok = (int32_t)((i * 7919 + 13) % nv);
        for (int f = 0; f < 2; f++)
            CHECK(engine_cuda_q35_decode(s[f], tok, i, l[f], NULL) == 0, "decode %d", i);
        const support_logit_row r = support_logit_compare(l[0], l[1], nv);
        worst = fmax(worst, r.max_diff);
        cmin = fmin(cmin, r.cosine);
    }
    printf("%-6s router fusion on vs off, 16 decode steps: max |diff| %.3g, min cosine %.6f\n",
           type, worst, cmin);
    CHECK(worst > 0, "%s: SPARK_CUDA_Q35_ROUTER_FUSE=1 gives the logits of =0 bit for bit: is "
          "the fusion on?", type);
    CHECK(cmin >= (!strcmp(type, "f32") ? 0.99 : 0.9), "%s: router fusion cosine %.6f", type,
          cmin);
    for (int f = 0; f < 2; f++) {
        engine_cuda_q35_session_free(s[f]);
        free(l[f]);
    }
}

/* SPARK_CUDA_MTP_PREFILL = value for what follows (read when a session turns MTP on); returns
 * the previous value (malloc'd, or NULL) for pf_restore. */
static char *pf_set(const char *value) {
    const char *e = getenv("SPARK_CUDA_MTP_PREFILL");
    char *old = e ? strdup(e) : NULL;
    setenv("SPARK_CUDA_MTP_PREFILL", value, 1);
    return old;
}

static void pf_restore(char *old) {
    if (old)
        setenv("SPARK_CUDA_MTP_PREFILL", old, 1);
    else
        unsetenv("SPARK_CUDA_MTP_PREFILL");
    free(old);
}

/* ref vs got: exact (f32 weights) within rel * (1 + max |ref|), else cosine >= cmin; returns the
 * relative error or the cosine. */
static double within(const float *ref, const float *got, size_t n, bool exact, double rel,
                     double cmin, const char *what) {
    const support_logit_row r = support_logit_compare(ref, got, (int32_t)n);
    if (exact) {
        const double e = r.max_diff / (1 + r.max_ref);
        CHECK(e <= rel, "%s: max |diff| / (1 + max |ref|) = %.3g > %.1g", what, e, rel);
        return e;
    }
    CHECK(r.cosine >= cmin, "%s: cosine %.6f < %.2f", what, r.cosine, cmin);
    return r.cosine;
}

/* verify passes against the decode step; rollback; fast loop, with the verify pass's parts
 * per token (fused "0") or in one launch for all tokens (fused "1": q35_vdelta.cu ...), each
 * bit for bit the decode step. The model m is loaded on the CPU; gm is its upload. */
static void check_direct(engine_model *m, engine_cuda_q35_model *gm, const char *type0,
                         const char *fused) {
    char type[32];
    snprintf(type, sizeof type, "%s/%s", type0, *fused ? fused : "default");
    const int32_t nv = engine_model_n_vocab(m);
    engine_cuda_q35_session *plain = NULL, *sp = NULL, *cold = NULL;
    enum { N = 40 };
    int32_t toks[N + 8];
    for (int i = 0; i < N + 8; i++)
        toks[i] = (int32_t)((i * 7919 + 13) % nv);
    float *ref = malloc(sizeof(float) * nv * (N + 8)), *got = malloc(sizeof(float) * nv * (N + 8));
    float *la = malloc(sizeof(float) * nv), *lb = malloc(sizeof(float) * nv);
    float *da = malloc(sizeof(float) * nv), *db = malloc(sizeof(float) * nv);
    bool was = false;
    CHECK(engine_cuda_q35_session_new(&plain, gm, N_CTX, ENGINE_KV_F32) == 0, "plain session");
    CHECK(engine_cuda_q35_session_new(&sp, gm, N_CTX, ENGINE_KV_F32) == 0, "mtp session");
    CHECK(engine_cuda_q35_session_new(&cold, gm, N_CTX, ENGINE_KV_F32) == 0, "cold session");
    if (!plain || !sp || !cold || !ref || !got || !la || !lb || !da || !db) goto out;
    CHECK(enable_with(sp, fused, &was) == 0 && was, "enable");
    CHECK(enable_with(cold, fused, &was) == 0 && was, "enable");
    CHECK(engine_cuda_q35_mtp_step(sp, 0, 1, 0, la) == ENGINE_EINVAL, "draft before any token");
    CHECK(engine_cuda_q35_decode(sp, 1, 0, NULL, NULL) == ENGINE_EINVAL, "plain step with MTP");

    /* verify passes of 1..5 tokens == the decode step, bit for bit */
    for (int i = 0; i < N + 8; i++)
        CHECK(engine_cuda_q35_decode(plain, toks[i], i, ref + (size_t)i * nv, NULL) == 0,
              "decode %d", i);
    {
        int at = 0, width = 1, bad = -1;
        while (at < N + 8) {
            int w = at + width > N + 8 ? N + 8 - at : width;
            CHECK(engine_cuda_q35_append(sp, toks + at, w, at, got + (size_t)at * nv, NULL) == 0,
                  "verify %d at %d", w, at);
            at += w;
            width = width % ENGINE_CUDA_Q35_VMAX + 1;
        }
        double worst = 0;
        for (int i = 0; i < N + 8; i++) {
            double dd = max_diff(ref + (size_t)i * nv, got + (size_t)i * nv, (size_t)nv);
            worst = fmax(worst, dd);
            if (dd != 0 && bad < 0) bad = i;
        }
        printf("%-6s verify passes of 1..5 vs decode steps: max |diff| %.3g over %d positions\n",
               type, worst, N + 8);
        CHECK(bad < 0, "%s: verify logits differ from the decode step's from position %d", type,
              bad);
    }

    /* rollback: a pass of 5 tokens at N, truncated to N + j (and to points before it), then one
     * more token: logits and draft logits as a session that only saw the kept tokens */
    const int32_t targets[] = {N + 1, N + 2, N + 3, N + 4, 33, 16, 7, 0};
    for (size_t ti = 0; ti < sizeof targets / sizeof targets[0]; ti++) {
        const int32_t n = targets[ti];
        CHECK(engine_cuda_q35_truncate(sp, toks, N + 8, N) == 0, "truncate to %d", N);
        CHECK(engine_cuda_q35_append(sp, toks + N, 5, N, NULL, NULL) == 0, "window");
        CHECK(engine_cuda_q35_truncate(sp, toks, N + 5, n) == 0, "truncate %d -> %d", N + 5, n);
        CHECK(engine_cuda_q35_append(sp, toks + n, 1, n, NULL, la) == 0, "append at %d", n);
        CHECK(engine_cuda_q35_mtp_step(sp, 0, toks[n + 1], n + 1, da) == 0, "draft at %d", n);
        /* a fresh sequence (an append at position 0 starts over) */
        CHECK(engine_cuda_q35_append(cold, toks, n + 1, 0, NULL, lb) == 0, "cold %d", n + 1);
        CHECK(engine_cuda_q35_mtp_step(cold, 0, toks[n + 1], n + 1, db) == 0, "cold draft");
        CHECK(!memcmp(la, ref + (size_t)n * nv, sizeof(float) * nv) && !memcmp(la, lb,
              sizeof(float) * nv), "%s rollback %d -> %d: logits differ (%.3g)", type, N + 5, n,
              max_diff(la, lb, (size_t)nv));
        CHECK(!memcmp(da, db, sizeof(float) * nv), "%s rollback %d -> %d: draft logits differ "
              "(%.3g)", type, N + 5, n, max_diff(da, db, (size_t)nv));
        CHECK(engine_cuda_q35_truncate(sp, toks, n + 1, 0) == 0, "truncate to 0");
        CHECK(engine_cuda_q35_append(sp, toks, N + 8, 0, NULL, NULL) == 0, "refill");
    }
    printf("%-6s rollback inside a verify window and to snapshots: checked %zu targets\n", type,
           sizeof targets / sizeof targets[0]);

    /* the device-resident greedy loop == plain greedy decoding */
    for (int32_t k = 1; k <= 4; k++) {
        int32_t plain_out[N_GEN + 8], fast_out[N_GEN + 8], n_out = 0, n_pos = 0, steps = 0,
                acc = 0;
        for (int i = 0; i < N_PROMPT - 1; i++)
            CHECK(engine_cuda_q35_decode(plain, toks[i], i, NULL, NULL) == 0, "replay");
        CHECK(engine_cuda_q35_generate(plain, toks[N_PROMPT - 1], N_PROMPT - 1, N_GEN + 1, 0.0f,
                                       0, plain_out) == 0, "plain greedy");
        CHECK(engine_cuda_q35_truncate(sp, toks, N + 8, 0) == 0, "truncate");
        CHECK(engine_cuda_q35_append(sp, toks, N_PROMPT, 0, NULL, NULL) == 0, "prompt");
        /* x: the token plain greedy chose after the prompt */
        CHECK(engine_cuda_q35_spec_generate(sp, plain_out[0], N_PROMPT, N_GEN, k, fast_out,
                                            &n_out, &n_pos, &steps, &acc) == 0, "fast k %d", k);
        bool same = n_out >= N_GEN && !memcmp(fast_out, plain_out + 1, sizeof(int32_t) * N_GEN) &&
                    n_pos == N_PROMPT + n_out;
        printf("%-6s device greedy loop k %d: %s (%d tokens, %d steps, %d drafts accepted)\n",
               type, k, same ? "identical" : "DIFFERENT", n_out, steps, acc);
        CHECK(same, "%s fast loop k %d", type, k);
        CHECK(engine_cuda_q35_truncate(sp, toks, n_pos, 0) == 0, "truncate");
        CHECK(engine_cuda_q35_append(sp, toks, N + 8, 0, NULL, NULL) == 0, "refill");
    }
out:
    free(ref), free(got), free(la), free(lb), free(da), free(db);
    engine_cuda_q35_session_free(plain);
    engine_cuda_q35_session_free(sp);
    engine_cuda_q35_session_free(cold);
}

/* An MTP session's prompts through its prefill (the "prefill" checks above). */
static void check_prefill(engine_model *m, engine_cuda_q35_model *gm, const char *type) {
    enum { NC = 512, L = 300, CH = 64, KD = 2 };
    const bool exact = !strcmp(type, "f32");
    const int32_t nv = engine_model_n_vocab(m);
    const size_t V = (size_t)nv, kvd = (size_t)m->hp.n_head_kv * m->hp.head_dim_k;
    const int32_t lens[2] = {N_PROMPT, L};
    int32_t toks[L], hold[L + N_GEN + 8], pout[N_GEN + 8], fout[N_GEN + 8], ref[N_GEN + 8];
    engine_cuda_q35_session *a = NULL, *b = NULL, *c = NULL;
    engine_cuda_q35_prefill *pfa = NULL, *pfc = NULL;
    char *old = pf_set("6");
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
    float *lc = malloc(sizeof(float) * V), *da = malloc(sizeof(float) * V);
    float *db = malloc(sizeof(float) * V);
    float *ka = malloc(sizeof(float) * L * kvd), *kb = malloc(sizeof(float) * L * kvd);
    float *va = malloc(sizeof(float) * L * kvd), *vb = malloc(sizeof(float) * L * kvd);
    bool was = false;
    for (int i = 0; i < L; i++)
        toks[i] = (int32_t)((i * 7919 + 13) % nv);
    CHECK(engine_cuda_q35_session_new(&a, gm, NC, ENGINE_KV_F32) == 0, "session");
    CHECK(engine_cuda_q35_session_new(&b, gm, NC, ENGINE_KV_F32) == 0, "session");
    CHECK(engine_cuda_q35_session_new(&c, gm, NC, ENGINE_KV_F32) == 0, "session");
    if (a) CHECK(engine_cuda_q35_prefill_new(&pfa, a, CH) == 0 && pfa, "prefill (mtp session)");
    if (c) CHECK(engine_cuda_q35_prefill_new(&pfc, c, CH) == 0 && pfc, "prefill (plain)");
    if (!pfa || !b || !pfc || !la || !lb || !lc || !da || !db || !ka || !kb || !va || !vb)
        goto out;
    CHECK(enable_with(a, "0", &was) == 0 && was, "enable");
    CHECK(enable_with(b, "0", &was) == 0 && was, "enable");

    for (int li = 0; li < 2; li++) { /* (a), (b) */
        const int32_t n = lens[li];
        char what[96];
        CHECK(engine_cuda_q35_append(a, toks, n, 0, NULL, la) == 0, "prefilled prompt %d", n);
        CHECK(engine_cuda_q35_append(b, toks, n, 0, NULL, lb) == 0, "verify-fed prompt %d", n);
        CHECK(engine_cuda_q35_prefill_run(pfc, toks, n, 0, lc) == 0, "plain prefill %d", n);
        CHECK(!memcmp(la, lc, sizeof(float) * V), "%s prompt %d: the MTP session's logits differ "
              "from the plain prefill's (%.3g): the prompt did not go through the prefill, or "
              "the feed changed the main pass", type, n, max_diff(lc, la, V));
        CHECK(engine_cuda_q35_mtp_kv_get(a, n - 1, ka, va) == 0, "kv");
        CHECK(engine_cuda_q35_mtp_kv_get(b, n - 1, kb, vb) == 0, "kv");
        snprintf(what, sizeof what, "%s prompt %d logits, prefill vs verify passes", type, n);
        const double rl = within(lb, la, V, exact, 5e-5, 0.97, what);
        snprintf(what, sizeof what, "%s prompt %d MTP K rows", type, n);
        const double rk = within(kb, ka, (size_t)(n - 1) * kvd, exact, 5e-5, 0.97, what);
        snprintf(what, sizeof what, "%s prompt %d MTP V rows", type, n);
        const double rv = within(vb, va, (size_t)(n - 1) * kvd, exact, 5e-5, 0.97, what);
        double rd = exact ? 0 : 1;
        int32_t tok = support_argmax(lb, nv);
        for (int i = 0; i < 4; i++) {
            CHECK(engine_cuda_q35_mtp_step(a, i, tok, n, da) == 0, "draft %d", i);
            CHECK(engine_cuda_q35_mtp_step(b, i, tok, n, db) == 0, "draft %d", i);
            snprintf(what, sizeof what, "%s prompt %d draft step %d", type, n, i);
            const double r = within(db, da, V, exact, 5e-5, 0.9, what);
            rd = exact ? fmax(rd, r) : fmin(rd, r);
            tok = support_argmax(db, nv);
        }
        printf("%-6s MTP prompt of %3d through the prefill vs verify passes (%s): logits %.3g, "
               "K %.3g, V %.3g, drafts 0..3 %.3g; logits = the plain prefill's: %s\n",
               type, n, exact ? "max rel diff" : "cosine", rl, rk, rv, rd,
               memcmp(la, lc, sizeof(float) * V) ? "NO" : "bit for bit");
    }

    for (int li = 0; li < 2; li++) { /* (c) */
        const int32_t n = lens[li];
        CHECK(engine_cuda_q35_prefill_run(pfc, toks, n, 0, lc) == 0, "plain prefill %d", n);
        const int32_t x = support_argmax(lc, nv);
        CHECK(engine_cuda_q35_generate(c, x, n, N_GEN, 0.0f, 0, pout) == 0, "plain greedy");
        for (int32_t k = 1; k <= 4; k++) {
            int32_t n_out = 0, n_pos = 0, steps = 0, acc = 0;
            CHECK(engine_cuda_q35_append(a, toks, n, 0, NULL, la) == 0, "prompt %d", n);
            CHECK(engine_cuda_q35_spec_generate(a, x, n, N_GEN, k, fout, &n_out, &n_pos, &steps,
                                                &acc) == 0, "device loop k %d", k);
            const bool same = n_out >= N_GEN && !memcmp(fout, pout, sizeof(int32_t) * N_GEN) &&
                              n_pos == n + n_out;
            printf("%-6s prompt of %3d prefilled, device greedy loop k %d: %s (%d tokens, %d "
                   "steps, %d accepted)\n", type, n, k, same ? "identical" : "DIFFERENT", n_out,
                   steps, acc);
            CHECK(same, "%s prefilled prompt %d, device loop k %d vs plain greedy", type, n, k);
        }
    }

    { /* (d) */
        const int32_t to[3] = {L - 1, 260, 100};
        for (int ti = 0; ti < 3; ti++) {
            const int32_t t = to[ti];
            int32_t n_out = 0, n_pos = 0, steps = 0, acc = 0;
            char what[96];
            CHECK(engine_cuda_q35_append(a, toks, L, 0, NULL, la) == 0, "prompt");
            const int32_t x = support_argmax(la, nv);
            CHECK(engine_cuda_q35_mtp_step(a, 0, x, L, da) == 0, "draft");
            CHECK(engine_cuda_q35_spec_generate(a, x, L, N_GEN, KD, ref, &n_out, &n_pos, &steps,
                                                &acc) == 0 && n_pos == L + n_out &&
                      n_out >= N_GEN && n_out < N_GEN + 8,
                  "device loop");
            memcpy(hold, toks, sizeof toks);
            hold[L] = x;
            memcpy(hold + L + 1, ref, sizeof(int32_t) * (size_t)(n_out - 1));
            CHECK(engine_cuda_q35_truncate(a, hold, n_pos, t) == 0, "truncate %d -> %d", n_pos, t);
            CHECK(engine_cuda_q35_append(a, toks + t, L - t, t, NULL, lb) == 0, "re-append %d", t);
            CHECK(engine_cuda_q35_mtp_step(a, 0, x, L, db) == 0, "draft");
            snprintf(what, sizeof what, "%s truncation to %d, logits after the prompt", type, t);
            const double rl = within(la, lb, V, exact, 5e-5, 0.97, what);
            snprintf(what, sizeof what, "%s truncation to %d, draft step 0", type, t);
            const double rd = within(da, db, V, exact, 5e-5, 0.9, what);
            CHECK(engine_cuda_q35_spec_generate(a, x, L, N_GEN, KD, fout, &n_out, &n_pos, &steps,
                                                &acc) == 0, "device loop");
            const bool same = n_out >= N_GEN && !memcmp(fout, ref, sizeof(int32_t) * N_GEN);
            printf("%-6s truncation of the prefilled prompt to %3d, the rest again: logits %.3g, "
                   "draft %.3g (%s), greedy loop k %d %s\n", type, t, rl, rd,
                   exact ? "max rel diff" : "cosine", KD, same ? "identical" : "DIFFERENT");
            if (exact) CHECK(same, "%s truncation to %d: greedy tokens differ", type, t);
        }
    }
out:
    free(la), free(lb), free(lc), free(da), free(db), free(ka), free(kb), free(va), free(vb);
    engine_cuda_q35_prefill_free(pfa);
    engine_cuda_q35_prefill_free(pfc);
    engine_cuda_q35_session_free(a);
    engine_cuda_q35_session_free(b);
    engine_cuda_q35_session_free(c);
    pf_restore(old);
}

/* The verify pass's KV-only MTP feed against the whole block's (the "feed" check above), each
 * fed in verify passes of 3, 4, 5, 1, 2, ... and of 5 (4 sessions), with every draft also held
 * against the CPU's (check_draft's bounds) so that a difference says which side is wrong. */
static int first_row_diff(const float *a, const float *b, size_t rows, size_t row) {
    for (size_t r = 0; r < rows; r++)
        if (memcmp(a + r * row, b + r * row, sizeof(float) * row)) return (int)r;
    return -1;
}

static void check_feed(engine_model *m, engine_cuda_q35_model *gm, const char *type) {
    enum { N = 48, NS = 5 };
    static const char *const fused[NS] = {"0", "feed", "0", "feed", "fatt"};
    const bool exact = !strcmp(type, "f32");
    const int32_t nv = engine_model_n_vocab(m);
    const size_t V = (size_t)nv, kvd = (size_t)m->hp.n_head_kv * m->hp.head_dim_k;
    int32_t toks[N];
    engine_cuda_q35_session *gs[NS] = {NULL, NULL, NULL, NULL, NULL};
    engine_session *cs = support_session(m, 8, ENGINE_KV_F32);
    float *k[NS], *v[NS], *d[NS], *dc = malloc(sizeof(float) * V);
    bool was = false, ok = cs && dc;
    int bad_step = -1, bad_fatt = -1;
    double worst[NS] = {0, 0, 0, 0, 0};
    for (int i = 0; i < NS; i++) {
        k[i] = malloc(sizeof(float) * N * kvd);
        v[i] = malloc(sizeof(float) * N * kvd);
        d[i] = malloc(sizeof(float) * V);
        ok = ok && k[i] && v[i] && d[i];
        CHECK(engine_cuda_q35_session_new(&gs[i], gm, N_CTX, ENGINE_KV_F32) == 0, "session");
        ok = ok && gs[i];
    }
    for (int i = 0; i < N; i++)
        toks[i] = (int32_t)((i * 7919 + 13) % nv);
    if (!ok) goto out;
    for (int i = 0; i < NS; i++)
        CHECK(enable_with(gs[i], fused[i], &was) == 0, "enable %s", fused[i]);
    CHECK(engine_q35_mtp_enable(cs, &was) == 0, "cpu enable");
    CHECK(engine_session_append(cs, toks, N, NULL) == 0, "cpu append");
    for (int i = 0; i < NS; i++)
        for (int at = 0, width = i < 2 || i == 4 ? 3 : 5; at < N;
             width = i < 2 || i == 4 ? width % ENGINE_CUDA_Q35_VMAX + 1 : 5) {
            const int w = at + width > N ? N - at : width;
            CHECK(engine_cuda_q35_append(gs[i], toks + at, w, at, NULL, NULL) == 0, "verify");
            at += w;
        }
    for (int i = 0; i < NS; i++)
        CHECK(engine_cuda_q35_mtp_kv_get(gs[i], N - 1, k[i], v[i]) == 0, "kv");
    int32_t tok = toks[N - 1] ^ 1;
    for (int st = 0; st < 4; st++) {
        CHECK(engine_q35_mtp_step(cs, st, tok, dc) == 0, "cpu draft %d", st);
        for (int i = 0; i < NS; i++) {
            CHECK(engine_cuda_q35_mtp_step(gs[i], st, tok, N, d[i]) == 0, "draft %d", st);
            const double r = exact ? max_diff(dc, d[i], V) / (1.0 + max_abs(dc, V))
                                   : support_cosine(dc, d[i], nv);
            worst[i] = st == 0 ? r : exact ? fmax(worst[i], r) : fmin(worst[i], r);
        }
        if (bad_step < 0 && memcmp(d[0], d[1], sizeof(float) * V)) bad_step = st;
        if (bad_fatt < 0 && memcmp(d[0], d[4], sizeof(float) * V)) bad_fatt = st;
        tok = support_argmax(dc, nv);
    }
    const size_t rows = N - 1;
    const int rk01 = first_row_diff(k[0], k[1], rows, kvd);
    const int rv01 = first_row_diff(v[0], v[1], rows, kvd);
    const int rk02 = first_row_diff(k[0], k[2], rows, kvd);
    const int rk13 = first_row_diff(k[1], k[3], rows, kvd);
    const int rk23 = first_row_diff(k[2], k[3], rows, kvd);
    printf("%-6s verify pass feeding only the MTP KV rows vs the whole block: first differing K "
           "row %d, V row %d (-1: none; passes of 3,4,5,1,2..); whole 3.. vs whole 5s K %d, feed "
           "3.. vs feed 5s %d, whole 5s vs feed 5s %d; drafts vs cpu (%s): whole %.3g, feed %.3g, "
           "whole "
           "5s %.3g, feed 5s %.3g\n", type, rk01, rv01, rk02, rk13, rk23,
           exact ? "max rel diff" : "cosine", worst[0], worst[1], worst[2], worst[3]);
    for (int i = 0; i < NS; i++) {
        if (exact)
            CHECK(worst[i] <= 5e-4, "%s: drafts of session %d (fused %s) vs cpu: %.3g", type, i,
                  fused[i], worst[i]);
        else
            CHECK(worst[i] >= 0.9, "%s: drafts of session %d (fused %s) vs cpu: cosine %.4f",
                  type, i, fused[i], worst[i]);
    }
    CHECK(rk01 < 0 && rv01 < 0, "%s: the KV-only feed's MTP rows differ from the whole block's "
          "(K %.3g, V %.3g)", type, max_diff(k[0], k[1], rows * kvd),
          max_diff(v[0], v[1], rows * kvd));
    CHECK(bad_step < 0, "%s: draft step %d after the KV-only feed differs (%.3g)", type, bad_step,
          max_diff(d[0], d[1], V));
    { /* fatt: the block up to its attention (its own KV stores) == the whole block */
        const int rk04 = first_row_diff(k[0], k[4], rows, kvd);
        const int rv04 = first_row_diff(v[0], v[4], rows, kvd);
        printf("%-6s verify pass feeding the block up to its attention (fatt) vs the whole block: "
               "first differing K row %d, V row %d, draft step %d (-1: none); drafts vs cpu "
               "%.3g\n", type, rk04, rv04, bad_fatt, worst[4]);
        CHECK(rk04 < 0 && rv04 < 0 && bad_fatt < 0, "%s: fatt feed differs from the whole "
              "block's (K %.3g, V %.3g, draft step %d)", type, max_diff(k[0], k[4], rows * kvd),
              max_diff(v[0], v[4], rows * kvd), bad_fatt);
    }
out:
    for (int i = 0; i < NS; i++) {
        free(k[i]), free(v[i]), free(d[i]);
        engine_cuda_q35_session_free(gs[i]);
    }
    free(dc);
    engine_session_free(cs);
}

/* GPU draft logits against the CPU's. */
static void check_draft(engine_model *m, engine_cuda_q35_model *gm, const char *type) {
    const int32_t nv = engine_model_n_vocab(m);
    int32_t toks[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++)
        toks[i] = (int32_t)((i * 104729 + 7) % nv);
    engine_session *cs = support_session(m, 8, ENGINE_KV_F32);
    engine_cuda_q35_session *gs = NULL;
    float *lc = malloc(sizeof(float) * nv), *lg = malloc(sizeof(float) * nv);
    bool was = false;
    CHECK(engine_cuda_q35_session_new(&gs, gm, N_CTX, ENGINE_KV_F32) == 0, "session");
    if (!cs || !gs || !lc || !lg) goto out;
    CHECK(engine_q35_mtp_enable(cs, &was) == 0, "cpu enable");
    CHECK(engine_cuda_q35_mtp_enable(gs, &was) == 0, "gpu enable");
    CHECK(engine_session_append(cs, toks, N_PROMPT, NULL) == 0, "cpu prompt");
    CHECK(engine_cuda_q35_append(gs, toks, N_PROMPT, 0, NULL, NULL) == 0, "gpu prompt");
    int32_t tok = toks[N_PROMPT - 1] ^ 1;
    for (int i = 0; i < 4; i++) {
        CHECK(engine_q35_mtp_step(cs, i, tok, lc) == 0, "cpu draft %d", i);
        CHECK(engine_cuda_q35_mtp_step(gs, i, tok, N_PROMPT, lg) == 0, "gpu draft %d", i);
        double d = max_diff(lc, lg, (size_t)nv), mx = max_abs(lc, (size_t)nv);
        double c = support_cosine(lc, lg, nv);
        printf("%-6s draft step %d: max |gpu - cpu| %.3g (max |l| %.3g), cosine %.6f\n", type, i,
               d, mx, c);
        if (!strcmp(type, "f32"))
            CHECK(d <= 5e-4 * (1.0 + mx), "%s draft %d: %.3g", type, i, d);
        else
            CHECK(c >= 0.9, "%s draft %d: cosine %.6f", type, i, c);
        tok = support_argmax(lc, nv);
    }
out:
    free(lc), free(lg);
    engine_cuda_q35_session_free(gs);
    engine_session_free(cs);
}

static int gen(engine_session *s, const int32_t *prompt, size_t n, int32_t k, float temp,
               uint64_t seed, int32_t max, collect *out, engine_gen_stats *st) {
    engine_gen_params gp = ENGINE_GEN_PARAMS_INIT;
    gp.prompt = prompt;
    gp.n_prompt = n;
    gp.max_tokens = max;
    gp.sampling.temperature = temp;
    gp.sampling.seed = seed;
    gp.sampling.top_k = temp > 0 ? 8 : 0;
    gp.ignore_eog = true;
    gp.mtp_draft = k;
    out->n = 0;
    return engine_generate(s, &gp, on_token, out, st);
}

typedef struct {
    const int32_t *all;
    int32_t n_all, nv;
} oracle;

static void oracle_draft(void *user, int32_t pos, int32_t *tok) {
    const oracle *o = user;
    if (pos < o->n_all) *tok = pos % 3 ? o->all[pos] : (o->all[pos] + 1) % o->nv;
}

/* engine_generate's path with the draft hook (a fresh prompt on s, MTP on). */
static int spec_run(engine_model *m, engine_session *s, const engine_gen_params *gp,
                    const engine_spec_hooks *hooks, collect *out, engine_gen_stats *st) {
    engine_sampler *smp = NULL;
    engine_gen_text g;
    memset(st, 0, sizeof *st);
    out->n = 0;
    int rc = engine_sampler_new(&smp, &gp->sampling, engine_model_n_vocab(m));
    if (rc) return rc;
    if ((rc = engine_gen_text_init(&g, m, gp, on_token, out))) {
        engine_sampler_free(smp);
        return rc;
    }
    rc = engine_session_truncate(s, 0);
    for (size_t i = 0; i < gp->n_prompt && rc == 0; i++)
        rc = engine_sampler_accept(smp, gp->prompt[i], false);
    if (rc == 0) rc = engine_session_append(s, gp->prompt, gp->n_prompt, NULL);
    if (rc == 0) rc = engine_spec_decode_ex(s, gp, smp, &g, st, hooks);
    if (rc == 0) rc = engine_gen_text_finish(&g, &st->stop);
    engine_gen_text_deinit(&g);
    engine_sampler_free(smp);
    return rc;
}

/* Through engine.h with the model on the GPU. */
static void check_api(const char *path, const char *type) {
    engine_model_params mg = ENGINE_MODEL_PARAMS_INIT;
    mg.device = ENGINE_DEVICE_CUDA;
    mg.n_ctx = N_CTX;
    engine_model *m = NULL;
    CHECK(engine_model_load(&m, path, &mg) == 0, "load %s on cuda", path);
    if (!m) return;
    char *old = pf_set("1"); /* MTP prompts through the session's prefill */
    engine_session *plain = support_session(m, 8, ENGINE_KV_F32);
    engine_session *sp = support_session(m, 8, ENGINE_KV_F32);
    const int32_t nv = engine_model_n_vocab(m), max = 14;
    int32_t prompt[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++)
        prompt[i] = (int32_t)((500 + 311 * i) % nv);
    collect ref, got;
    engine_gen_stats st;
    if (!plain || !sp) goto out;
    /* the reference: the prompt through the session's prefill, then decode steps; an MTP
     * session's prompt goes through the same prefill (bit for bit the same pass) and its verify
     * passes equal the decode step bit for bit. Each MTP run starts over (a truncation into
     * the prefilled prompt recomputes it, equal only up to summation order). */
    CHECK(gen(plain, prompt, N_PROMPT, 0, 0.0f, 0, max, &ref, &st) == 0 && ref.n == max &&
              st.cached_tokens == 0,
          "plain greedy");
    for (int32_t k = 1; k <= 4; k++) {
        CHECK(engine_session_truncate(sp, 0) == 0, "start over");
        CHECK(gen(sp, prompt, N_PROMPT, k, 0.0f, 0, max, &got, &st) == 0, "mtp k %d", k);
        bool same = got.n == ref.n && !memcmp(got.toks, ref.toks, sizeof(int32_t) * ref.n) &&
                    engine_session_n_tokens(sp) == engine_session_n_tokens(plain) &&
                    !memcmp(engine_session_tokens(sp), engine_session_tokens(plain),
                            sizeof(int32_t) * (size_t)engine_session_n_tokens(plain));
        printf("%-6s engine_generate greedy, mtp_draft %d: %s, %d verify steps, %d/%d accepted\n",
               type, k, same ? "identical" : "DIFFERENT", st.spec_steps, st.spec_accepted,
               st.spec_drafted);
        CHECK(same && st.spec_steps > 0, "%s greedy with mtp_draft %d", type, k);
    }
    {
        int32_t all[N_PROMPT + 16];
        memcpy(all, prompt, sizeof prompt);
        memcpy(all + N_PROMPT, ref.toks, sizeof(int32_t) * (size_t)ref.n);
        oracle o = {all, N_PROMPT + ref.n, nv};
        engine_spec_hooks hooks = {oracle_draft, NULL, &o};
        for (int32_t k = 1; k <= 4; k += 3) {
            engine_gen_params gp = ENGINE_GEN_PARAMS_INIT;
            gp.prompt = prompt;
            gp.n_prompt = N_PROMPT;
            gp.max_tokens = max;
            gp.sampling.temperature = 0.0f;
            gp.ignore_eog = true;
            gp.mtp_draft = k;
            CHECK(spec_run(m, sp, &gp, &hooks, &got, &st) == 0, "oracle k %d", k);
            bool same = got.n == ref.n && !memcmp(got.toks, ref.toks, sizeof(int32_t) * ref.n);
            printf("%-6s oracle drafts k %d: %s, %d/%d accepted in %d steps\n", type, k,
                   same ? "identical" : "DIFFERENT", st.spec_accepted, st.spec_drafted,
                   st.spec_steps);
            CHECK(same && st.spec_accepted > 0 && st.spec_accepted < st.spec_drafted,
                  "%s oracle k %d", type, k);
        }
    }
    { /* sampling: runs, and a seed repeats */
        collect a, b;
        CHECK(gen(sp, prompt, N_PROMPT, 2, 1.0f, 42, max, &a, &st) == 0 && a.n == max,
              "sampling with mtp");
        CHECK(gen(sp, prompt, N_PROMPT, 2, 1.0f, 42, max, &b, &st) == 0 && b.n == max &&
                  !memcmp(a.toks, b.toks, sizeof(int32_t) * max),
              "a seed repeats");
        printf("%-6s sampling with mtp_draft 2: %d tokens, %d/%d accepted\n", type, a.n,
               st.spec_accepted, st.spec_drafted);
    }
out:
    engine_session_free(plain);
    engine_session_free(sp);
    engine_model_free(m);
    pf_restore(old);
}

/* SPARK_TEST_MTP_ONLY=feed (for compute-sanitizer runs): only check_feed, on the f32 model. */
static bool only_feed(void) {
    const char *e = getenv("SPARK_TEST_MTP_ONLY");
    return e && !strcmp(e, "feed");
}

static void run_model(const char *type) {
    char path[600];
    snprintf(path, sizeof path, "%s/qwen35-tiny-%s.gguf", tmpdir, type);
    if (support_gen("qwen35-tiny", type, 11, path) != 0) {
        CHECK(0, "model gen qwen35-tiny %s", type);
        return;
    }
    engine_model *m = support_load(path, 0, N_CTX, ENGINE_DEVICE_CPU);
    engine_cuda_q35_model *gm = NULL;
    if (m) CHECK(engine_cuda_q35_model_new(&gm, m, 0) == 0, "cuda model");
    if (gm && only_feed()) {
        check_feed(m, gm, type);
    } else if (gm) {
        CHECK(engine_cuda_q35_has_mtp(gm), "the upload has the MTP block");
        check_direct(m, gm, type, "0");
        const int before = support_failures;
        check_direct(m, gm, type, "1");
        if (support_failures > before) { /* which part: each alone (failures count again) */
            static const char *const parts[] = {"delta", "moe",   "attn", "pf",
                                                "feed",  "split", "h3",   "h4"};
            for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
                check_direct(m, gm, type, parts[i]);
        }
        const int before_dec = support_failures;
        check_direct(m, gm, type, "tok,dn,aearly"); /* the parts outside "1": decode launches */
        check_direct(m, gm, type, "hseq,dn2");
        check_direct(m, gm, type, ""); /* the default parts (SPARK_CUDA_MTP_FUSED empty) */
        /* the default before "dearly": a decode DeltaNet launch per token */
        check_direct(m, gm, type, "dec1,split,h3,dn2,fatt");
        if (support_failures > before_dec) {
            static const char *const parts[] = {"head", "tok",   "dn", "aearly", "hseq",  "dn2",
                                                "dec1", "split", "h3", "fatt",   "dearly"};
            for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
                check_direct(m, gm, type, parts[i]);
        }
        /* the MoE on the decode kernels, the router fusion on and off (whatever the
         * defaults), its verify launch with the tokens in turn: {ROUTER_FUSE, MTP_MOE, MTP_RF,
         * FUSED} */
        check_rf_on(m, gm, type);
        static const char *const runs[][4] = {
            {"0", "dec", NULL, "0"}, {"0", "dec", NULL, "1"}, {"1", NULL, NULL, "0"},
            {"1", NULL, NULL, "1"},  {"1", "dec", NULL, "0"}, {"0", NULL, NULL, "0"},
            {"1", NULL, "seq", "0"}, {"1", NULL, "grid", "0"}, {"1", NULL, "grid", "1"}};
        for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
            char label[24];
            snprintf(label, sizeof label, "%s rf%s%s%s%s", type, runs[i][0],
                     runs[i][1] ? " dec" : "", runs[i][2] ? " " : "", runs[i][2] ? runs[i][2] : "");
            char *rf = env_set("SPARK_CUDA_Q35_ROUTER_FUSE", runs[i][0]);
            char *md = env_set("SPARK_CUDA_MTP_MOE", runs[i][1]);
            char *rs = env_set("SPARK_CUDA_MTP_RF", runs[i][2]);
            check_direct(m, gm, label, runs[i][3]);
            env_restore("SPARK_CUDA_MTP_RF", rs);
            env_restore("SPARK_CUDA_MTP_MOE", md);
            env_restore("SPARK_CUDA_Q35_ROUTER_FUSE", rf);
        }
        { /* the default parts with session 7's stagings, MoE grids and no side branch */
            char label[24], *st = env_set("SPARK_CUDA_MTP_STAGE", "serial");
            char *mw = env_set("SPARK_CUDA_MTP_MOE_WAVE", "0");
            char *fk = env_set("SPARK_CUDA_MTP_FORK", "0");
            char *ff = env_set("SPARK_CUDA_MTP_FEED_FORK", "0");
            snprintf(label, sizeof label, "%s serial", type);
            check_direct(m, gm, label, "");
            env_restore("SPARK_CUDA_MTP_FEED_FORK", ff);
            env_restore("SPARK_CUDA_MTP_FORK", fk);
            env_restore("SPARK_CUDA_MTP_MOE_WAVE", mw);
            env_restore("SPARK_CUDA_MTP_STAGE", st);
        }
        check_draft(m, gm, type);
        check_feed(m, gm, type);
        check_prefill(m, gm, type);
    }
    engine_cuda_q35_model_free(gm);
    engine_model_free(m);
    if (!only_feed()) check_api(path, type);
    if (!only_feed()) { /* engine_generate with the router fusion off (the default: on) */
        char label[24], *rf = env_set("SPARK_CUDA_Q35_ROUTER_FUSE", "0");
        snprintf(label, sizeof label, "%s rf0", type);
        check_api(path, label);
        env_restore("SPARK_CUDA_Q35_ROUTER_FUSE", rf);
    }
    unlink(path);
}

int main(void) {
    if (engine_cuda_usable() != 0) {
        printf("skip: %s\n", engine_error_last());
        return 77;
    }
    const int rc = support_init();
    if (rc) return rc;
    if (support_tmpdir(tmpdir, sizeof tmpdir, "test_cuda_mtp", false) != 0) return 1;
    run_model("f32");
    if (!only_feed()) run_model("q4_k_m");
    support_rmtree(tmpdir);
    return support_finish("test_cuda_mtp");
}
#endif
