/* MTP speculative decoding cost on the CPU (a benchmark, not a test): for a generated qwen35moe
 * preset with an MTP block, at a context depth, the median time of
 *   plain   one decode step of a session without MTP
 *   fed     one decode step of a session with MTP on (the block also runs over the new pair)
 *   draft   one MTP draft step (the block + the output head)
 *   verify  one pass over k+1 tokens with every position's logits, k = 1..4
 *   reject  the rollback after a rejection at the first draft (checkpoint restore + 1 token)
 * and, computed from those (random weights cannot measure acceptance), the decode speed for a
 * per-draft acceptance a in {0.6, 0.8, 0.9}: tokens per step E = (1 - a^(k+1)) / (1 - a), time
 * per step k * draft + verify(k+1) + (1 - a^k) * reject.
 * Usage: verify_cost PRESET TYPE THREADS REPS DEPTH (see verify_cost.sh). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "model/model_int.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void die(const char *what) {
    fprintf(stderr, "verify_cost: %s: %s\n", what, engine_error_last());
    exit(1);
}

int main(int argc, char **argv) {
    const char *preset = argc > 1 ? argv[1] : "qwen35-tiny";
    const char *type = argc > 2 ? argv[2] : "q8_0";
    int threads = argc > 3 ? atoi(argv[3]) : 2, reps = argc > 4 ? atoi(argv[4]) : 5;
    int depth = argc > 5 ? atoi(argv[5]) : 256;
    if (reps < 1 || reps > 64 || depth < 8) return 2;
    char path[512];
    snprintf(path, sizeof path, "%s/spark_mtp_%s_%s.gguf", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             preset, type);
    engine_model_gen_params gp;
    engine_model_gen_params_init(&gp);
    gp.preset = preset;
    gp.type = type;
    gp.seed = 1;
    gp.out_path = path;
    gp.tokenizer_dir = getenv("SPARK_TOKENIZER_DIR");
    if (engine_model_gen(&gp)) die("gen");
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.n_threads = threads;
    mp.n_ctx = depth + 64;
    mp.device = ENGINE_DEVICE_CPU;
    engine_model *m = NULL;
    if (engine_model_load(&m, path, &mp)) die("load");
    int32_t nv = engine_model_n_vocab(m);
    engine_session *plain = NULL, *s = NULL;
    engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
    sp.kv_type = ENGINE_KV_F16;
    if (engine_session_new(&plain, m, &sp) || engine_session_new(&s, m, &sp)) die("session");
    bool was;
    if (engine_q35_mtp_enable(s, &was)) die("mtp");
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(depth + 16));
    float *logits = malloc(sizeof(float) * (size_t)nv * 6);
    for (int i = 0; i < depth + 16; i++)
        ids[i] = 1000 + 7919 * i % 100000;
    if (engine_session_append(plain, ids, (size_t)depth, NULL) ||
        engine_session_append(s, ids, (size_t)depth, NULL))
        die("prefill");
    double t_plain[64], t_fed[64], t_draft[64], t_ver[5][64], t_rej[64];
    for (int r = 0; r < reps; r++) {
        double t = engine_time_ms();
        if (engine_session_append(plain, ids + depth, 1, NULL)) die("plain");
        t_plain[r] = engine_time_ms() - t;
        if (engine_session_truncate(plain, depth)) die("truncate");
        t = engine_time_ms();
        if (engine_session_append(s, ids + depth, 1, NULL)) die("fed");
        t_fed[r] = engine_time_ms() - t;
        if (engine_session_truncate(s, depth)) die("truncate");
        t = engine_time_ms();
        if (engine_q35_mtp_step(s, 0, ids[depth], logits)) die("draft");
        t_draft[r] = engine_time_ms() - t;
        for (int k = 1; k <= 4; k++) {
            engine_q35_checkpoint(s);
            t = engine_time_ms();
            if (engine_session_append(s, ids + depth, (size_t)k + 1, logits)) die("verify");
            t_ver[k][r] = engine_time_ms() - t;
            t = engine_time_ms();
            if (engine_session_truncate(s, depth + (k == 4 ? 1 : 0))) die("reject");
            if (k == 4) t_rej[r] = engine_time_ms() - t;
            if (k == 4 && engine_session_truncate(s, depth)) die("truncate");
        }
    }
    double plain_ms = median(t_plain, reps), fed = median(t_fed, reps);
    double draft = median(t_draft, reps), rej = median(t_rej, reps), ver[5];
    for (int k = 1; k <= 4; k++)
        ver[k] = median(t_ver[k], reps);
    printf("%s %s, %d threads, depth %d, median of %d\n", preset, type, threads, depth, reps);
    printf("plain step %.2f ms (%.1f tok/s); with MTP fed %.2f ms; draft step %.2f ms; "
           "rollback after a first-draft rejection %.2f ms\n",
           plain_ms, 1e3 / plain_ms, fed, draft, rej);
    printf("k  verify(k+1) ms  x plain  | computed tok/s at acceptance 0.6 / 0.8 / 0.9 (plain "
           "%.1f)\n",
           1e3 / plain_ms);
    for (int k = 1; k <= 4; k++) {
        printf("%d  %8.2f        %5.2f    |", k, ver[k], ver[k] / plain_ms);
        const double acc[3] = {0.6, 0.8, 0.9};
        for (int i = 0; i < 3; i++) {
            double a = acc[i], ak = 1, ak1;
            for (int j = 0; j < k; j++)
                ak *= a;
            ak1 = ak * a;
            double e = (1 - ak1) / (1 - a), step = k * draft + ver[k] + (1 - ak) * rej;
            printf(" %8.1f", e * 1e3 / step);
        }
        printf("\n");
    }
    engine_session_free(plain);
    engine_session_free(s);
    engine_model_free(m);
    free(ids);
    free(logits);
    remove(path);
    return 0;
}
