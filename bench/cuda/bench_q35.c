/* Batch-1 decode speed of the CUDA backend on a qwen35moe model (a benchmark, not a test).
 *
 *   bench_q35 MODEL.gguf [-n N_GEN] [-r REPS] [-d DEPTH] [-c N_CTX] [-a FUSED]... [-e VARIANTS]
 *             [-P PROMPT] [-M MTP_VARIANTS]
 *
 * As bench_decode.c, through the engine_cuda_q35_* calls: per repetition the device-resident
 * loop (one CUDA graph replay per token, greedy sampling on the GPU) generates N_GEN tokens
 * (default 128: tg128) from position DEPTH (filled by the same loop first; a generation from
 * position 0 starts the recurrent state over). Prints tok/s (mean +- sd after a warm-up), the
 * time of one step inside the loop and of one engine_cuda_q35_decode call with its host round
 * trip (logits copied back), the weight bytes a token reads and the achieved GB/s against the
 * card's copy bandwidth, and where an un-captured step's time goes.
 *
 * With an MTP block (qwen35-35b-a3b-mtp) also MTP speculative decoding on a second session
 * (after P = max(DEPTH, 16) prompt tokens): the time of one draft step and of one verify pass
 * of m = 1..5 tokens (CUDA events around 20 graph replays each, so without the host round
 * trip of a step), each pass's cost relative to the plain step of the graph loop above, and
 * the tok/s these step costs give at acceptance rates a = 0.6, 0.8, 0.9 for k = 1..4 drafts:
 * E[tokens per step] = (1 - a^(k+1)) / (1 - a) over k draft steps + one verify pass of k + 1
 * (COMPUTED from the measured costs: random weights cannot measure acceptance). Then the
 * device-resident greedy loop (drafts, verify, acceptance and rollback on the GPU, one host
 * sync per step) measured for k = 1..4: on random weights nearly every draft is rejected, so
 * this is the cost floor (a ~ 0), with the accepted count printed.
 * The MTP figures use SPARK_CUDA_MTP_FUSED as the environment sets it (read when a session turns
 * MTP on); each -a FUSED (up to 8) measures them again with SPARK_CUDA_MTP_FUSED=FUSED in the
 * same process (an A/B on the same model) and says whether the device loop's greedy tokens are
 * those of the first run.
 * -e "A=1 B=2;C=3;..." times the plain decode loop again in the same process, one fresh session
 * per ';'-separated variant with those environment variables set (read at session creation;
 * restored after), each printed with its tok/s and whether its greedy tokens (depth fill and
 * timed ones) equal the first session's. A difference is printed, not an error: diagnosis
 * variants (SPARK_CUDA_DIAG_SKIP / _TWICE, qwen35.cu) change the results on purpose.
 * -P PROMPT (a model with an MTP block): a PROMPT-token prompt from position 0 three ways, each
 * on a fresh session with its prefill (chunks as engine sessions have them: 1024 tokens, or
 * SPARK_CUDA_PREFILL_CHUNK): the plain prefill (no MTP; REPS timed runs after a warm-up), an
 * MTP session's append through the prefill (SPARK_CUDA_MTP_PREFILL=1: the main pass + the MTP
 * block's KV rows; REPS runs; its last logits compared with the plain prefill's, which they
 * must equal bit for bit) and through verify passes of 5 tokens (SPARK_CUDA_MTP_PREFILL=0, the
 * path before; one timed run after the graphs are captured), in tok/s. Then the threshold: short
 * appends (6 .. 64 tokens) at position 0 of an MTP session through either path, us per append
 * (the mean of REPS after a warm-up).
 * -M "A=1 B=2;C=3;..." (a model with an MTP block): the MTP step costs (one draft step, verify
 * passes of m = 1..5; as above, 20 graph replays each) on a fresh MTP session per ';'-separated
 * variant with those environment variables set (read when MTP turns on; restored after), one
 * line each after one with the environment as it is: an A/B of SPARK_CUDA_MTP_FUSED parts or of
 * SPARK_CUDA_MTP_DIAG_SKIP (q35_mtp_host.cuh: verify-pass ops left out, wrong results, so no
 * greedy loop runs here). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_env.h"
#include "cuda/cuda_backend.h"
#include "cuda/q35_mtp.h"
#include "engine.h"

/* Index of the largest value (the first on ties). */
static int32_t support_argmax_f(const float *v, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* reps timed runs of n_gen tokens from position depth after a warm-up (the depth filled from
 * position 0 by the same loop before each: the recurrent state must hold exactly the tokens
 * before it); tok/s mean and sd. pre (depth + 1) gets the fill's tokens, out the timed ones. */
static int timed(engine_cuda_q35_session *gs, int depth, int n_gen, int reps, int32_t *pre,
                 int32_t *out, double *tps, double *mean, double *sd) {
    for (int r = 0; r <= reps; r++) {
        int32_t first = 0;
        if (depth > 0 && engine_cuda_q35_generate(gs, 0, 0, depth, 0.0f, 0, pre)) return -1;
        if (depth > 0) first = pre[depth - 1];
        double a = now_ms();
        if (engine_cuda_q35_generate(gs, first, depth, n_gen, 0.0f, 0, out)) return -1;
        tps[r] = n_gen / ((now_ms() - a) / 1e3);
    }
    *mean = *sd = 0;
    for (int r = 1; r <= reps; r++)
        *mean += tps[r] / reps;
    for (int r = 1; r <= reps; r++)
        *sd += (tps[r] - *mean) * (tps[r] - *mean);
    *sd = reps > 1 ? sqrt(*sd / (reps - 1)) : 0;
    return 0;
}

/* One -e variant: set its variables, time a fresh session, restore them; print its tok/s and
 * whether its tokens equal ref_pre / ref (the first session's). 0, or -1 on an error. */
static int variant(engine_cuda_q35_model *gm, const char *spec, int n_ctx, int depth, int n_gen,
                   int reps, const int32_t *ref_pre, const int32_t *ref, double *tps) {
    int rc = 0, differ = -1;
    int32_t *pre = malloc(sizeof(int32_t) * (size_t)(depth + 1));
    int32_t *out = malloc(sizeof(int32_t) * (size_t)(n_gen + 1));
    bench_env env;
    bench_env_push(&env, spec);
    engine_cuda_q35_session *vs = NULL;
    double mean = 0, sd = 0;
    if (!pre || !out || engine_cuda_q35_session_new(&vs, gm, n_ctx, ENGINE_KV_F16) ||
        timed(vs, depth, n_gen, reps, pre, out, tps, &mean, &sd))
        rc = -1;
    for (int i = 0; !rc && i < depth && differ < 0; i++)
        if (pre[i] != ref_pre[i]) differ = i;
    for (int i = 0; !rc && i < n_gen && differ < 0; i++)
        if (out[i] != ref[i]) differ = depth + i;
    engine_cuda_q35_session_free(vs);
    bench_env_pop(&env);
    free(pre);
    free(out);
    if (rc) {
        fprintf(stderr, "bench_q35: variant \"%s\": %s\n", spec, engine_error_last());
        return -1;
    }
    printf("variant \"%s\": %.1f +- %.1f tok/s (%.1f us/token); greedy tokens %s", spec, mean,
           sd, 1e6 / mean, differ < 0 ? "identical" : "DIFFER");
    if (differ >= 0) printf(" (first at position %d)", differ);
    printf("\n");
    return 0;
}

/* The MTP figures on a fresh session (SPARK_CUDA_MTP_FUSED as the environment holds it now,
 * printed as `label`): step costs, the computed table, the device loop. The loop's first 512
 * tokens of each k go to keep[k - 1] (when non-NULL), or are compared with same[k - 1]. */
static int bench_mtp(engine_cuda_q35_model *gm, engine_model *m, int n_ctx, int depth, int n_gen,
                     double plain_us, float *logits, const char *label, int32_t *keep,
                     const int32_t *same) {
    engine_cuda_q35_session *ms = NULL;
    bool was = false;
    const int32_t P = depth > 16 ? depth : 16, nv = engine_model_n_vocab(m);
    const int32_t nk = n_gen < 512 ? n_gen : 512;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(P + n_gen + 8));
    double draft_us = 0, vus[ENGINE_CUDA_Q35_VMAX + 1];
    int rc = 1;
    if (!toks || engine_cuda_q35_session_new(&ms, gm, n_ctx, ENGINE_KV_F16) ||
        engine_cuda_q35_mtp_enable(ms, &was))
        goto done;
    for (int32_t i = 0; i < P; i++)
        toks[i] = (int32_t)((i * 7919 + 13) % nv);
    if (engine_cuda_q35_append(ms, toks, P, 0, NULL, logits) ||
        engine_cuda_q35_spec_time(ms, P, 20, &draft_us, vus))
        goto done;
    /* SPARK_BENCH_TRACE_MTP=FILE (a -DSPARK_CUDA_TRACE=ON build): the launch timeline of one
     * more timing round (a draft step, then verify passes of m = 1..5, each after a warm-up
     * replay): bench/cuda/trace_summary.py FILE --all */
    if (getenv("SPARK_BENCH_TRACE_MTP")) {
        engine_cuda_trace *tr = NULL;
        double d1 = 0, v1[ENGINE_CUDA_Q35_VMAX + 1];
        if (engine_cuda_trace_start(&tr, 1u << 18) ||
            engine_cuda_q35_spec_time(ms, P, 1, &d1, v1) ||
            engine_cuda_trace_stop(tr, getenv("SPARK_BENCH_TRACE_MTP")))
            printf("trace: %s\n", engine_error_last());
        else
            printf("trace: the MTP timing round written to %s\n", getenv("SPARK_BENCH_TRACE_MTP"));
    }
    printf("MTP, SPARK_CUDA_MTP_FUSED=%s (at position %d): plain step %.0f us (graph loop "
           "above); draft step %.0f us (%.3f x plain)\n",
           label, P, plain_us, draft_us, draft_us / plain_us);
    printf("  verify pass of m tokens (m = k + 1), cost relative to one plain step:\n");
    for (int mm = 1; mm <= ENGINE_CUDA_Q35_VMAX; mm++)
        printf("    verify m %d (k %d): %7.0f us  %.3f x plain\n", mm, mm - 1, vus[mm],
               vus[mm] / plain_us);
    printf("  COMPUTED tok/s from these step costs (k drafts + one verify of k + 1; "
           "E[tokens/step] = (1 - a^(k+1)) / (1 - a)):\n");
    for (int k = 1; k + 1 <= ENGINE_CUDA_Q35_VMAX; k++) {
        const double cost = k * draft_us + vus[k + 1];
        printf("    k %d: step %6.0f us; tok/s", k, cost);
        const double as[3] = {0.6, 0.8, 0.9};
        for (int i = 0; i < 3; i++)
            printf("  a=%.1f %6.1f", as[i], (1.0 - pow(as[i], k + 1)) / (1.0 - as[i]) * 1e6 / cost);
        printf("\n");
    }
    int32_t x = support_argmax_f(logits, nv);
    for (int32_t k = 1; k + 1 <= ENGINE_CUDA_Q35_VMAX; k++) {
        int32_t n_out = 0, n_pos = 0, steps = 0, acc = 0;
        double a = now_ms();
        if (engine_cuda_q35_spec_generate(ms, x, P, n_gen, k, toks + P, &n_out, &n_pos, &steps,
                                          &acc))
            goto done;
        const double ms_ = now_ms() - a;
        const int32_t nc = n_out < nk ? n_out : nk;
        const char *cmp = "";
        if (keep) {
            memcpy(keep + (size_t)(k - 1) * 512, toks + P, sizeof(int32_t) * (size_t)nc);
        } else if (same) {
            cmp = memcmp(same + (size_t)(k - 1) * 512, toks + P, sizeof(int32_t) * (size_t)nc)
                      ? "; tokens DIFFER from the first setting's"
                      : "; tokens identical to the first setting's";
        }
        printf("  device greedy loop k %d (measured, random weights): %d tokens in %d steps, "
               "%d drafts accepted, %.1f tok/s%s\n",
               k, n_out, steps, acc, n_out / (ms_ / 1e3), cmp);
        if (engine_cuda_q35_truncate(ms, toks, n_pos, P)) goto done;
    }
    rc = 0;
done:
    free(toks);
    engine_cuda_q35_session_free(ms);
    return rc;
}

/* One -P way (mode 0: plain prefill, 1: MTP through the prefill, 2: MTP through verify passes):
 * tok/s mean and sd over runs timed appends of P tokens at position 0 after a warm-up; the last
 * logits into logits. 0, or -1 on an error. */
static int prompt_way(engine_cuda_q35_model *gm, int n_ctx, const int32_t *toks, int32_t P,
                      int mode, int runs, float *logits, double *mean, double *sd) {
    engine_cuda_q35_session *s = NULL;
    engine_cuda_q35_prefill *pf = NULL;
    bench_env env;
    double *t = malloc(sizeof(double) * (size_t)(runs + 1));
    bool was = false;
    int rc = -1;
    bench_env_push(&env, mode == 1 ? "SPARK_CUDA_MTP_PREFILL=1" : "SPARK_CUDA_MTP_PREFILL=0");
    /* read when MTP turns on */
    if (!t || engine_cuda_q35_session_new(&s, gm, n_ctx, ENGINE_KV_F16) ||
        engine_cuda_q35_prefill_new(&pf, s, 0) || !pf ||
        (mode > 0 && engine_cuda_q35_mtp_enable(s, &was)))
        goto done;
    /* warm-up: the full prompt, or (verify passes) enough tokens to capture the pass graphs */
    for (int r = 0; r <= runs; r++) {
        const int32_t n = mode == 2 && r == 0 ? 16 : P;
        double a = now_ms();
        if (mode == 0 ? engine_cuda_q35_prefill_run(pf, toks, n, 0, logits)
                      : engine_cuda_q35_append(s, toks, n, 0, NULL, logits))
            goto done;
        t[r] = n / ((now_ms() - a) / 1e3);
    }
    *mean = *sd = 0;
    for (int r = 1; r <= runs; r++)
        *mean += t[r] / runs;
    for (int r = 1; r <= runs; r++)
        *sd += (t[r] - *mean) * (t[r] - *mean);
    *sd = runs > 1 ? sqrt(*sd / (runs - 1)) : 0;
    rc = 0;
done:
    bench_env_pop(&env);
    free(t);
    engine_cuda_q35_prefill_free(pf);
    engine_cuda_q35_session_free(s);
    return rc;
}

/* One -M line: the step costs of a fresh MTP session with the variables of spec set (NULL: none)
 * at position P = max(depth, 16). 0, or -1 on an error. */
static int mtp_costs(engine_cuda_q35_model *gm, engine_model *m, int n_ctx, int depth,
                     double plain_us, const char *spec) {
    int rc = -1;
    const int32_t P = depth > 16 ? depth : 16, nv = engine_model_n_vocab(m);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)P);
    engine_cuda_q35_session *s = NULL;
    double draft_us = 0, vus[ENGINE_CUDA_Q35_VMAX + 1];
    bool was = false;
    bench_env env;
    bench_env_push(&env, spec ? spec : "");
    if (!toks || engine_cuda_q35_session_new(&s, gm, n_ctx, ENGINE_KV_F16) ||
        engine_cuda_q35_mtp_enable(s, &was))
        goto done;
    for (int32_t i = 0; i < P; i++)
        toks[i] = (int32_t)((i * 7919 + 13) % nv);
    if (engine_cuda_q35_append(s, toks, P, 0, NULL, NULL) ||
        engine_cuda_q35_spec_time(s, P, 20, &draft_us, vus))
        goto done;
    printf("MTP variant \"%s\": draft %.0f us; verify m 1..5:", spec ? spec : "(environment)",
           draft_us);
    for (int mm = 1; mm <= ENGINE_CUDA_Q35_VMAX; mm++)
        printf(" %.0f", vus[mm]);
    printf(" us (");
    for (int mm = 1; mm <= ENGINE_CUDA_Q35_VMAX; mm++)
        printf("%s%.3f", mm > 1 ? " " : "", vus[mm] / plain_us);
    printf(" x plain)\n");
    rc = 0;
done:
    free(toks);
    engine_cuda_q35_session_free(s);
    bench_env_pop(&env);
    return rc;
}

/* -P's threshold lines: us per append of ns[i] tokens at position 0 of an MTP session through the
 * prefill (mode 1) or verify passes (mode 2), the mean of reps after a warm-up. */
static int short_way(engine_cuda_q35_model *gm, const int32_t *toks, int mode, const int32_t *ns,
                     int count, int reps, double *us) {
    engine_cuda_q35_session *s = NULL;
    engine_cuda_q35_prefill *pf = NULL;
    bench_env env;
    bool was = false;
    int rc = -1;
    /* 2: from 2 tokens on */
    bench_env_push(&env, mode == 1 ? "SPARK_CUDA_MTP_PREFILL=2" : "SPARK_CUDA_MTP_PREFILL=0");
    if (engine_cuda_q35_session_new(&s, gm, 256, ENGINE_KV_F16) ||
        engine_cuda_q35_prefill_new(&pf, s, 0) || !pf || engine_cuda_q35_mtp_enable(s, &was))
        goto done;
    for (int i = 0; i < count; i++) {
        for (int r = 0; r <= reps; r++) {
            double a = now_ms();
            if (engine_cuda_q35_append(s, toks, ns[i], 0, NULL, NULL)) goto done;
            if (r == 0) us[i] = 0;
            else us[i] += 1e3 * (now_ms() - a) / reps;
        }
    }
    rc = 0;
done:
    bench_env_pop(&env);
    engine_cuda_q35_prefill_free(pf);
    engine_cuda_q35_session_free(s);
    return rc;
}

/* -P: the prompt three ways and the threshold (the header comment). */
static int bench_prompt(engine_cuda_q35_model *gm, engine_model *m, int n_ctx, int32_t P,
                        int reps) {
    const int32_t nv = engine_model_n_vocab(m);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)P);
    float *lp = malloc(sizeof(float) * (size_t)nv), *lm = malloc(sizeof(float) * (size_t)nv);
    double mp = 0, sp = 0, mm = 0, sm = 0, mv = 0, sv = 0;
    int rc = -1;
    if (n_ctx < P) n_ctx = P;
    if (!toks || !lp || !lm) goto done;
    for (int32_t i = 0; i < P; i++)
        toks[i] = (int32_t)((i * 7919 + 13) % nv);
    if (prompt_way(gm, n_ctx, toks, P, 0, reps, lp, &mp, &sp)) goto done;
    printf("prompt of %d tokens: plain prefill %.1f +- %.1f tok/s (%d runs after a warm-up)\n", P,
           mp, sp, reps);
    if (prompt_way(gm, n_ctx, toks, P, 1, reps, lm, &mm, &sm)) goto done;
    printf("prompt of %d tokens: MTP on, through the prefill (SPARK_CUDA_MTP_PREFILL=1) %.1f +- "
           "%.1f tok/s (%.3f x the plain prefill); last logits %s\n", P, mm, sm, mm / mp,
           memcmp(lp, lm, sizeof(float) * (size_t)nv) ? "DIFFER from the plain prefill's"
                                                       : "bit for bit the plain prefill's");
    if (prompt_way(gm, n_ctx, toks, P, 2, 1, lm, &mv, &sv)) goto done;
    printf("prompt of %d tokens: MTP on, verify passes of %d (SPARK_CUDA_MTP_PREFILL=0) %.1f "
           "tok/s (1 run); through the prefill %.1f x faster\n", P, ENGINE_CUDA_Q35_VMAX, mv,
           mm / mv);
    {
        static const int32_t ns[] = {2, 4, 6, 8, 12, 16, 24, 32, 64};
        enum { NS = sizeof ns / sizeof ns[0] };
        double up[NS], uv[NS];
        if (P < 64 || short_way(gm, toks, 1, ns, NS, reps, up) ||
            short_way(gm, toks, 2, ns, NS, reps, uv))
            goto done;
        printf("short appends at position 0 with MTP on (us per append, %d runs): the threshold "
               "of SPARK_CUDA_MTP_PREFILL\n", reps);
        for (int i = 0; i < NS; i++)
            printf("  prompt of %2d tokens: through the prefill %8.0f us, verify passes %8.0f us "
                   "(%.2f x)\n", ns[i], up[i], uv[i], uv[i] / up[i]);
    }
    rc = 0;
done:
    free(toks);
    free(lp);
    free(lm);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [-n N_GEN] [-r REPS] [-d DEPTH] [-c N_CTX] "
                "[-a FUSED]... [-e VARIANTS] [-P PROMPT] [-M MTP_VARIANTS]\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    int n_gen = 128, reps = 5, depth = 0, n_ctx = 0, prompt = 0;
    const char *alt[8], *variants = NULL, *mtp_variants = NULL;
    int n_alt = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "-a") && n_alt < 8)
            alt[n_alt++] = argv[i + 1];
        else if (!strcmp(argv[i], "-e"))
            variants = argv[i + 1];
        else if (!strcmp(argv[i], "-n"))
            n_gen = v;
        else if (!strcmp(argv[i], "-r"))
            reps = v;
        else if (!strcmp(argv[i], "-d"))
            depth = v;
        else if (!strcmp(argv[i], "-c"))
            n_ctx = v;
        else if (!strcmp(argv[i], "-P"))
            prompt = v;
        else if (!strcmp(argv[i], "-M"))
            mtp_variants = argv[i + 1];
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (n_gen < 1 || reps < 1 || depth < 0 || prompt < 0) return 2;
    if (n_ctx == 0) n_ctx = depth + n_gen + 1 > 4096 ? depth + n_gen + 1 : 4096;
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.device = ENGINE_DEVICE_CPU; /* the bench drives the CUDA backend itself */
    mp.n_threads = 1;
    engine_model *m = NULL;
    engine_cuda_q35_model *gm = NULL;
    engine_cuda_q35_session *gs = NULL;
    int32_t *out = NULL, *pre = NULL;
    double *tps = NULL;
    float *logits = NULL;
    double t0 = now_ms();
    if (engine_model_load(&m, path, &mp)) goto fail;
    double t1 = now_ms();
    if (engine_cuda_q35_model_new(&gm, m, 0)) goto fail;
    double t2 = now_ms();
    if (engine_cuda_q35_session_new(&gs, gm, n_ctx, ENGINE_KV_F16)) goto fail;
    engine_model_info info;
    engine_model_info_get(m, &info);
    out = malloc(sizeof(int32_t) * (size_t)(depth + n_gen + 1));
    pre = malloc(sizeof(int32_t) * (size_t)(depth + 1));
    tps = malloc(sizeof(double) * (size_t)(reps + 1));
    logits = malloc(sizeof(float) * (size_t)engine_model_n_vocab(m));
    if (!out || !pre || !tps || !logits) goto fail;
    double mean = 0, sd = 0;
    if (timed(gs, depth, n_gen, reps, pre, out, tps, &mean, &sd)) goto fail;
    if (variants) {
        printf("tg%d at depth %d: %.1f +- %.1f tok/s (%.1f us/token): the first session, as the "
               "environment says\n",
               n_gen, depth, mean, sd, 1e6 / mean);
        char vb[2048];
        snprintf(vb, sizeof vb, "%s", variants);
        for (char *save = NULL, *t = strtok_r(vb, ";", &save); t; t = strtok_r(NULL, ";", &save))
            if (variant(gm, t, n_ctx, depth, n_gen, reps, pre, out, tps)) goto fail;
    }
    /* one step with its host round trip, at the position after the loop */
    double one = 0;
    {
        int32_t pos = depth + n_gen, tok = out[n_gen - 1];
        const int n_one = 16;
        double a = now_ms();
        for (int i = 0; i < n_one && pos + i < n_ctx; i++) {
            int32_t next = 0;
            if (engine_cuda_q35_decode(gs, tok, pos + i, logits, &next)) goto fail;
            tok = next;
        }
        one = (now_ms() - a) / n_one;
    }
    /* SPARK_BENCH_TRACE=FILE (a -DSPARK_CUDA_TRACE=ON build): the launch timeline of 4 steps
     * of the graph loop after the one-step calls (bench/cuda/trace_summary.py reads it) */
    if (getenv("SPARK_BENCH_TRACE") && depth + n_gen + 16 + 4 < n_ctx) {
        engine_cuda_trace *tr = NULL;
        int32_t o4[4];
        if (engine_cuda_trace_start(&tr, 1u << 18) ||
            engine_cuda_q35_generate(gs, out[n_gen - 1], depth + n_gen + 16, 4, 0.0f, 0, o4) ||
            engine_cuda_trace_stop(tr, getenv("SPARK_BENCH_TRACE")))
            printf("trace: %s\n", engine_error_last());
        else
            printf("trace: 4 steps written to %s\n", getenv("SPARK_BENCH_TRACE"));
    }
    double bw = 0;
    engine_cuda_copy_bandwidth(0, (size_t)2 << 30, 5, &bw);
    double bpt = (double)engine_cuda_q35_model_bytes_per_token(gm);
    printf("model %s: %s, %s, %.2f GB on the GPU (load %.1f s, upload %.1f s)\n", path, info.arch,
           info.weight_type, engine_cuda_q35_model_weight_bytes(gm) / 1e9, (t1 - t0) / 1e3,
           (t2 - t1) / 1e3);
    printf("tg%d at depth %d: %.1f +- %.1f tok/s (%d reps after a warm-up): %.0f us per step in "
           "the graph loop; one engine_cuda_q35_decode with logits to the host: %.0f us\n",
           n_gen, depth, mean, sd, reps, 1e6 / mean, one * 1e3);
    printf("weights read per token: %.3f GB -> %.0f GB/s achieved; copy bandwidth %.0f GB/s "
           "(%.0f%%); ceiling at that bandwidth %.0f tok/s\n",
           bpt / 1e9, bpt * mean / 1e9, bw, 100.0 * bpt * mean / 1e9 / bw, bw * 1e9 / bpt);
    double us[ENGINE_CUDA_Q35_PROF_COUNT];
    static const char *names[ENGINE_CUDA_Q35_PROF_COUNT] = {
        "embed",  "mixer_in", "deltanet", "attention", "mixer_out", "router",
        "ffn_up", "shgate",   "ffn_down", "head",      "sample"};
    if (engine_cuda_q35_profile(gs, out[0], depth + n_gen / 2, 5, us) == 0) {
        double tot = 0;
        for (int i = 0; i < ENGINE_CUDA_Q35_PROF_COUNT; i++)
            tot += us[i];
        printf("un-captured step by kernel (us/token, events after each launch): total %.0f\n",
               tot);
        for (int i = 0; i < ENGINE_CUDA_Q35_PROF_COUNT; i++)
            printf("  %-10s %8.1f\n", names[i], us[i]);
    } else {
        printf("profile: %s\n", engine_error_last());
    }
    if (engine_cuda_q35_has_mtp(gm)) {
        const char *e = getenv("SPARK_CUDA_MTP_FUSED");
        int32_t ref[4 * 512] = {0};
        if (bench_mtp(gm, m, n_ctx, depth, n_gen, 1e6 / mean, logits, e ? e : "(unset)", ref,
                      NULL))
            goto fail;
        for (int i = 0; i < n_alt; i++) /* the same figures with other settings, in-process */
            if (setenv("SPARK_CUDA_MTP_FUSED", alt[i], 1) ||
                bench_mtp(gm, m, n_ctx, depth, n_gen, 1e6 / mean, logits, alt[i], NULL, ref))
                goto fail;
    }
    if (mtp_variants && engine_cuda_q35_has_mtp(gm)) {
        char vb[2048];
        snprintf(vb, sizeof vb, "%s", mtp_variants);
        if (mtp_costs(gm, m, n_ctx, depth, 1e6 / mean, NULL)) goto fail;
        for (char *save = NULL, *t = strtok_r(vb, ";", &save); t; t = strtok_r(NULL, ";", &save))
            if (mtp_costs(gm, m, n_ctx, depth, 1e6 / mean, t)) goto fail;
    }
    if (prompt > 0 && !engine_cuda_q35_has_mtp(gm)) {
        printf("-P: the model has no MTP block\n");
    } else if (prompt > 0) {
        engine_cuda_q35_session_free(gs); /* room for the prompt sessions */
        gs = NULL;
        if (bench_prompt(gm, m, n_ctx, prompt, reps)) goto fail;
    }
    printf("first tokens:");
    for (int i = 0; i < 8 && i < n_gen; i++)
        printf(" %d", out[i]);
    printf("\n");
    free(out);
    free(pre);
    free(tps);
    free(logits);
    engine_cuda_q35_session_free(gs);
    engine_cuda_q35_model_free(gm);
    engine_model_free(m);
    return 0;
fail:
    fprintf(stderr, "bench_q35: %s\n", engine_error_last());
    free(out);
    free(pre);
    free(tps);
    free(logits);
    engine_cuda_q35_session_free(gs);
    engine_cuda_q35_model_free(gm);
    engine_model_free(m);
    return 1;
}
