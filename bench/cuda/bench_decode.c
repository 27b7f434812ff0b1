/* Batch-1 decode speed of the CUDA backend (a benchmark, not a test).
 *
 *   bench_decode MODEL.gguf [-n N_GEN] [-r REPS] [-d DEPTH] [-c N_CTX] [-a 0|1] [-e VARIANTS]
 *                [-k 0|1]
 *
 * Uploads the model, then per repetition: the device-resident loop (one CUDA graph replay per
 * token, greedy sampling on the GPU, nothing crossing to the host until the end) generates
 * N_GEN tokens (default 128: llama-bench's tg128) starting at position DEPTH (default 0; the
 * first DEPTH positions are filled by the same loop beforehand). Prints tok/s (mean +- sd
 * after one warm-up run), the weight bytes a token reads, the achieved GB/s of weight traffic
 * and the card's device-to-device copy bandwidth measured here. Sessions run as the
 * environment says (SPARK_CUDA_FUSED; default: the per-op launches). Then the same with a
 * session of the other kind (fused step kernel <-> per-op launches), whose greedy tokens (the
 * depth fill and the timed ones) must equal the first session's; the program exits 1 when
 * they differ (-a 0 skips this second session). -e "A=1 B=2;C=3;..." times more sessions in the
 * same process, one per ';'-separated variant with those environment variables set (restored
 * after), each printed with its tok/s and whether its greedy tokens equal the first session's
 * (an A/B of run-time switches without reloading the model; exit 1 when any differ). Where a
 * variant's tokens differ, it also prints, at the first differing position, the default
 * session's top-2 logit margin and the largest |logit difference| between the two sessions
 * (both fed the same history), and that difference one position earlier: a margin below the
 * difference is a near-tie that a rounding difference flips. -k 0 frees the first session (and
 * the second) before the variants, so that each variant's session is the process's only one
 * (no diagnosis of differing tokens then, and no per-kernel profile at the end). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_env.h"
#include "cuda/cuda_backend.h"
#include "engine.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* reps timed runs of n_gen tokens from (first, depth) after a warm-up; tok/s mean and sd. */
static int timed(engine_cuda_session *gs, int32_t first, int depth, int n_gen, int reps,
                 int32_t *out, double *tps, double *mean, double *sd) {
    for (int r = 0; r <= reps; r++) {
        double a = now_ms();
        if (engine_cuda_generate(gs, first, depth, n_gen, 0.0f, 0, out)) return -1;
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

/* Largest |a[i] - b[i]| over n logits. */
static double max_diff(const float *a, const float *b, int n) {
    double d = 0;
    for (int i = 0; i < n; i++)
        if (fabs((double)a[i] - b[i]) > d) d = fabs((double)a[i] - b[i]);
    return d;
}

/* The first differing position p of a variant: both sessions decode position p - 1 and p again
 * from the default's tokens (equal before p; the token at position q is pre[q] below the depth,
 * else ref[q - depth], and the input at q is the token at q - 1, token 0 at q = 0), and the line
 * says the default's top-2 margin at p against the largest |logit difference| there. */
static void differ_diag(engine_cuda_session *gs, engine_cuda_session *vs, int nv, int p,
                        int depth, const int32_t *pre, const int32_t *ref) {
    float *a = malloc(sizeof(float) * (size_t)nv), *b = malloc(sizeof(float) * (size_t)nv);
    double before = -1;
    int rc = !a || !b;
    for (int q = p > 0 ? p - 1 : p; !rc && q <= p; q++) {
        const int32_t in = q == 0 ? 0 : q - 1 < depth ? pre[q - 1] : ref[q - 1 - depth];
        rc = engine_cuda_decode(gs, in, q, a, NULL) || engine_cuda_decode(vs, in, q, b, NULL);
        if (!rc && q < p) before = max_diff(a, b, nv);
    }
    if (!rc) {
        int t1 = 0, t2 = -1, v1 = 0;
        for (int i = 1; i < nv; i++)
            if (a[i] > a[t1]) t1 = i;
        for (int i = 0; i < nv; i++)
            if (i != t1 && (t2 < 0 || a[i] > a[t2])) t2 = i;
        for (int i = 1; i < nv; i++)
            if (b[i] > b[v1]) v1 = i;
        const double margin = (double)a[t1] - a[t2], diff = max_diff(a, b, nv);
        printf("  at position %d: default top-2 margin %.3g (ids %d, %d; variant's top %d), max "
               "|logit diff| %.3g (%s); at %d: max |logit diff| %.3g\n",
               p, margin, t1, t2, v1, diff, margin < diff ? "a near-tie" : "NOT a near-tie",
               p - 1, before);
    } else {
        printf("  at position %d: no diagnosis (%s)\n", p, engine_error_last());
    }
    free(a);
    free(b);
}

/* One -e variant: set its variables, time a fresh session, restore them. 1: tokens differ, 0:
 * identical, -1: error. */
static int variant(engine_cuda_model *gm, engine_cuda_session *gs, int nv_logits, const char *spec,
                   int n_ctx, int32_t first, int depth, int n_gen, int reps, const int32_t *pre,
                   const int32_t *ref, int32_t *out, double *tps) {
    int rc = 0, differ = -1;
    bench_env env;
    bench_env_push(&env, spec);
    engine_cuda_session *vs = NULL;
    double mean = 0, sd = 0;
    if (engine_cuda_session_new(&vs, gm, n_ctx, ENGINE_KV_F16)) rc = -1;
    if (!rc && depth > 0 && engine_cuda_generate(vs, 0, 0, depth, 0.0f, 0, out)) rc = -1;
    for (int i = 0; !rc && i < depth && differ < 0; i++)
        if (out[i] != pre[i]) differ = i;
    if (!rc && timed(vs, first, depth, n_gen, reps, out, tps, &mean, &sd)) rc = -1;
    for (int i = 0; !rc && i < n_gen && differ < 0; i++)
        if (out[i] != ref[i]) differ = depth + i;
    if (!rc && differ >= 0) {
        printf("variant \"%s\": greedy tokens differ at position %d\n", spec, differ);
        if (gs) differ_diag(gs, vs, nv_logits, differ, depth, pre, ref);
    }
    engine_cuda_session_free(vs);
    bench_env_pop(&env);
    if (rc) {
        fprintf(stderr, "bench_decode: variant \"%s\": %s\n", spec, engine_error_last());
        return -1;
    }
    printf("variant \"%s\": %.1f +- %.1f tok/s; greedy tokens %s", spec, mean, sd,
           differ < 0 ? "identical" : "DIFFER");
    if (differ >= 0) printf(" (first at position %d)", differ);
    printf("\n");
    return differ >= 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr,
                "usage: %s MODEL.gguf [-n N_GEN] [-r REPS] [-d DEPTH] [-c N_CTX] [-a 0|1] "
                "[-e VARIANTS] [-k 0|1]\n",
                argv[0]);
        return 2;
    }
    const char *path = argv[1];
    int n_gen = 128, reps = 5, depth = 0, n_ctx = 0, ab = 1, keep = 1;
    const char *variants = NULL;
    for (int i = 2; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "-e"))
            variants = argv[i + 1];
        else if (!strcmp(argv[i], "-n"))
            n_gen = v;
        else if (!strcmp(argv[i], "-r"))
            reps = v;
        else if (!strcmp(argv[i], "-d"))
            depth = v;
        else if (!strcmp(argv[i], "-c"))
            n_ctx = v;
        else if (!strcmp(argv[i], "-a"))
            ab = v;
        else if (!strcmp(argv[i], "-k"))
            keep = v;
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (n_gen < 1 || reps < 1 || depth < 0) return 2;
    if (n_ctx == 0) n_ctx = depth + n_gen + 1 > 4096 ? depth + n_gen + 1 : 4096;
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.device = ENGINE_DEVICE_CPU; /* the bench drives the CUDA backend itself */
    mp.n_threads = 1;
    engine_model *m = NULL;
    engine_cuda_model *gm = NULL;
    engine_cuda_session *gs = NULL, *gs2 = NULL;
    double t0 = now_ms();
    if (engine_model_load(&m, path, &mp)) goto fail;
    double t1 = now_ms();
    if (engine_cuda_model_new(&gm, m, 0)) goto fail;
    double t2 = now_ms();
    const char *fe = getenv("SPARK_CUDA_FUSED");
    const int fused = fe && fe[0] == '1';
    if (engine_cuda_session_new(&gs, gm, n_ctx, ENGINE_KV_F16)) goto fail;
    engine_model_info info;
    engine_model_info_get(m, &info);
    int32_t *out = malloc(sizeof(int32_t) * (size_t)(depth + n_gen + 1));
    int32_t *out2 = malloc(sizeof(int32_t) * (size_t)(depth + n_gen + 1));
    int32_t *pre = malloc(sizeof(int32_t) * (size_t)(depth + 1));
    double *tps = malloc(sizeof(double) * (size_t)(reps + 1));
    int32_t first = 0;
    if (!out || !out2 || !pre || !tps) return 1;
    if (depth > 0 && engine_cuda_generate(gs, 0, 0, depth, 0.0f, 0, pre)) goto fail;
    if (depth > 0) first = pre[depth - 1];
    double mean = 0, sd = 0;
    if (timed(gs, first, depth, n_gen, reps, out, tps, &mean, &sd)) goto fail;
    /* SPARK_BENCH_TRACE=FILE (a -DSPARK_CUDA_TRACE=ON build): the launch timeline of 4 steps
     * of the graph loop after the timed ones (bench/cuda/trace_summary.py reads it) */
    if (getenv("SPARK_BENCH_TRACE") && depth + n_gen + 4 < n_ctx) {
        engine_cuda_trace *tr = NULL;
        int32_t o4[4];
        if (engine_cuda_trace_start(&tr, 1u << 16) ||
            engine_cuda_generate(gs, out[n_gen - 1], depth + n_gen, 4, 0.0f, 0, o4) ||
            engine_cuda_trace_stop(tr, getenv("SPARK_BENCH_TRACE")))
            printf("trace: %s\n", engine_error_last());
        else
            printf("trace: 4 steps written to %s\n", getenv("SPARK_BENCH_TRACE"));
    }
    /* the per-op launches: speed, and the same greedy tokens */
    double mean2 = 0, sd2 = 0;
    int differ = -1;
    if (!ab) goto report;
    setenv("SPARK_CUDA_FUSED", fused ? "0" : "1", 1);
    if (engine_cuda_session_new(&gs2, gm, n_ctx, ENGINE_KV_F16)) goto fail;
    if (fe)
        setenv("SPARK_CUDA_FUSED", fe, 1);
    else
        unsetenv("SPARK_CUDA_FUSED");
    if (depth > 0 && engine_cuda_generate(gs2, 0, 0, depth, 0.0f, 0, out2)) goto fail;
    for (int i = 0; i < depth && differ < 0; i++)
        if (out2[i] != pre[i]) differ = i;
    if (timed(gs2, first, depth, n_gen, reps, out2, tps, &mean2, &sd2)) goto fail;
    for (int i = 0; i < n_gen && differ < 0; i++)
        if (out2[i] != out[i]) differ = depth + i;
    engine_cuda_session_free(gs2);
    gs2 = NULL;
report:;
    int vdiffer = 0;
    if (variants && !keep) { /* -k 0: each variant's session alone in the process */
        engine_cuda_session_free(gs);
        gs = NULL;
    }
    if (variants) {
        char vb[2048];
        snprintf(vb, sizeof vb, "%s", variants);
        for (char *save = NULL, *t = strtok_r(vb, ";", &save); t; t = strtok_r(NULL, ";", &save)) {
            const int r = variant(gm, gs, engine_model_n_vocab(m), t, n_ctx, first, depth, n_gen,
                                  reps, pre, out, out2, tps);
            if (r < 0) goto fail;
            vdiffer |= r;
        }
    }
    double bw = 0;
    engine_cuda_copy_bandwidth(0, (size_t)2 << 30, 5, &bw);
    double bpt = (double)engine_cuda_model_bytes_per_token(gm);
    printf("model %s: %s, %s, %.2f GB on the GPU (load %.1f s, upload %.1f s)\n", path, info.arch,
           info.weight_type, engine_cuda_model_weight_bytes(gm) / 1e9, (t1 - t0) / 1e3,
           (t2 - t1) / 1e3);
    printf("tg%d at depth %d (%s): %.1f +- %.1f tok/s (%d reps after a warm-up)\n", n_gen, depth,
           fused ? "fused step" : "per-op launches", mean, sd, reps);
    if (ab)
        printf("%s (SPARK_CUDA_FUSED=%d): %.1f +- %.1f tok/s; greedy tokens of the %d positions "
               "%s\n",
               fused ? "per-op launches" : "fused step", !fused, mean2, sd2, depth + n_gen,
               differ < 0 ? "identical" : "DIFFER");
    if (differ >= 0) printf("first difference at position %d\n", differ);
    printf("weights read per token: %.3f GB -> %.0f GB/s achieved; copy bandwidth %.0f GB/s "
           "(%.0f%%); ceiling at that bandwidth %.0f tok/s\n",
           bpt / 1e9, bpt * mean / 1e9, bw, 100.0 * bpt * mean / 1e9 / bw, bw * 1e9 / bpt);
    double us[ENGINE_CUDA_PROF_COUNT];
    static const char *names[ENGINE_CUDA_PROF_COUNT] = {
        "embed", "qkv", "attention", "wo", "router", "ffn_up", "ffn_down", "head", "sample"};
    if (gs && engine_cuda_profile(gs, first, depth + n_gen / 2, 5, us) == 0) {
        double tot = 0;
        for (int i = 0; i < ENGINE_CUDA_PROF_COUNT; i++)
            tot += us[i];
        printf("un-captured step by kernel (us/token, events after each launch): total %.0f\n",
               tot);
        for (int i = 0; i < ENGINE_CUDA_PROF_COUNT; i++)
            printf("  %-10s %8.1f\n", names[i], us[i]);
    }
    printf("first tokens:");
    for (int i = 0; i < 8 && i < n_gen; i++)
        printf(" %d", out[i]);
    printf("\n");
    free(out);
    free(out2);
    free(pre);
    free(tps);
    engine_cuda_session_free(gs);
    engine_cuda_model_free(gm);
    engine_model_free(m);
    return differ >= 0 || vdiffer ? 1 : 0;
fail:
    fprintf(stderr, "bench_decode: %s\n", engine_error_last());
    return 1;
}
