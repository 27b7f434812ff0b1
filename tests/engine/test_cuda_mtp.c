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
 *              one launch + one merge, the matvec's L1 prefetch; each keeps every token's
 *              arithmetic and order, so also bit for bit); when =1 fails, each part runs alone
 *              too, to say which one
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

/* verify passes against the decode step; rollback; fast loop, with the verify pass's parts
 * per token (fused "0") or in one launch for all tokens (fused "1": q35_vdelta.cu ...), each
 * bit for bit the decode step. The model m is loaded on the CPU; gm is its upload. */
static void check_direct(engine_model *m, engine_cuda_q35_model *gm, const char *type0,
                         const char *fused) {
    char type[32];
    snprintf(type, sizeof type, "%s/%s", type0, fused);
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
    engine_session *plain = support_session(m, 8, ENGINE_KV_F32);
    engine_session *sp = support_session(m, 8, ENGINE_KV_F32);
    const int32_t nv = engine_model_n_vocab(m), max = 14;
    int32_t prompt[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++)
        prompt[i] = (int32_t)((500 + 311 * i) % nv);
    collect ref, got;
    engine_gen_stats st;
    if (!plain || !sp) goto out;
    /* the reference through the decode step only (the prompt token by token: generate reuses
     * them and appends the last one), which the verify passes equal bit for bit */
    for (int i = 0; i + 1 < N_PROMPT; i++)
        CHECK(engine_session_append(plain, prompt + i, 1, NULL) == 0, "prompt token %d", i);
    CHECK(gen(plain, prompt, N_PROMPT, 0, 0.0f, 0, max, &ref, &st) == 0 && ref.n == max &&
              st.cached_tokens == N_PROMPT - 1,
          "plain greedy");
    for (int32_t k = 1; k <= 4; k++) {
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
    if (gm) {
        CHECK(engine_cuda_q35_has_mtp(gm), "the upload has the MTP block");
        check_direct(m, gm, type, "0");
        const int before = support_failures;
        check_direct(m, gm, type, "1");
        if (support_failures > before) { /* which part: each alone (failures count again) */
            static const char *const parts[] = {"delta", "moe", "attn", "pf"};
            for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
                check_direct(m, gm, type, parts[i]);
        }
        check_draft(m, gm, type);
    }
    engine_cuda_q35_model_free(gm);
    engine_model_free(m);
    check_api(path, type);
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
    run_model("q4_k_m");
    support_rmtree(tmpdir);
    return support_finish("test_cuda_mtp");
}
#endif
