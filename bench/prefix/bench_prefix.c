/* Persisted-prefix benchmark (not a test): the first turn of a fresh process, whose prompt is a
 * system block of SYSTEM tokens (system prompt + tool definitions) and a first user message of
 * NEW tokens, with and without the system block's KV loaded from a prefix file
 * (engine_prefix_load). Each repetition loads the model afresh (a new process in real life; the
 * weights are in the page cache for both), then times:
 *   cold:      the first turn's time to first token (prefill of SYSTEM + NEW tokens, one sample)
 *   persisted: engine_prefix_load + the first turn's time to first token (NEW tokens computed)
 * and prints the medians. Built and run by run.sh.
 *
 *   bench_prefix PRESET TYPE [SYSTEM] [NEW] [REPS] */
#define _DEFAULT_SOURCE /* mkstemps, clock_gettime */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

typedef struct {
    double t0, first;
} ttft_clock;

static int on_token(void *user, const char *text, size_t len, int32_t token) {
    ttft_clock *c = user;
    (void)text, (void)len;
    if (token >= 0 && c->first == 0) c->first = now_ms() - c->t0;
    return 0;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One first turn on a fresh model; with prefix_file, the prefix is loaded first. */
static int first_turn(const char *model, size_t cache, const int32_t *prompt, int32_t n,
                      const char *prefix_file, int32_t n_sys, double *load_ms, double *ttft,
                      int32_t *cached) {
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.device = ENGINE_DEVICE_CPU;
    mp.prefix_cache_bytes = cache;
    mp.n_ctx = n + 16;
    engine_model *m = NULL;
    if (engine_model_load(&m, model, &mp)) return -1;
    int rc = 0;
    double t0 = now_ms();
    *load_ms = 0;
    if (prefix_file && (rc = engine_prefix_load(m, prefix_file, prompt, (size_t)n_sys, NULL)))
        goto out;
    *load_ms = now_ms() - t0;
    engine_session *s = NULL;
    if ((rc = engine_session_new(&s, m, NULL))) goto out;
    engine_gen_params gp = ENGINE_GEN_PARAMS_INIT;
    gp.prompt = prompt;
    gp.n_prompt = (size_t)n;
    gp.max_tokens = 1;
    gp.ignore_eog = true;
    gp.sampling.temperature = 0;
    ttft_clock c = {now_ms(), 0};
    engine_gen_stats st;
    rc = engine_generate(s, &gp, on_token, &c, &st);
    *ttft = c.first;
    *cached = st.cached_tokens;
    if (!prefix_file && !rc) {
        char tmp[] = "/tmp/spark_bench_prefix_XXXXXX.kvp";
        int fd = mkstemps(tmp, 4);
        if (fd >= 0) close(fd);
        engine_prefix_info info;
        double ts = now_ms();
        rc = engine_prefix_save(m, prompt, (size_t)n_sys, tmp, &info);
        if (!rc)
            printf("  save: %d tokens, %.1f MiB, %.1f ms\n", info.n_tokens,
                   info.file_bytes / 1048576.0, now_ms() - ts);
        unlink(tmp);
    }
    engine_session_free(s);
out:
    if (rc) fprintf(stderr, "error: %s\n", engine_error_last());
    engine_model_free(m);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s PRESET TYPE [SYSTEM] [NEW] [REPS]\n", argv[0]);
        return 2;
    }
    int32_t n_sys = argc > 3 ? atoi(argv[3]) : 1024, n_new = argc > 4 ? atoi(argv[4]) : 64;
    int reps = argc > 5 ? atoi(argv[5]) : 3;
    if (n_sys < 16 || n_new < 1 || reps < 1 || reps > 50) return 2;
    char model[512], file[512];
    snprintf(model, sizeof model, "%s/spark_bench_prefix_%s_%s.gguf",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", argv[1], argv[2]);
    snprintf(file, sizeof file, "%s.kvp", model);
    struct stat sb;
    if (stat(model, &sb) != 0) { /* generated once, reused by later runs */
        engine_model_gen_params gp;
        engine_model_gen_params_init(&gp);
        gp.preset = argv[1];
        gp.type = argv[2];
        gp.seed = 1;
        gp.out_path = model;
        if (engine_model_gen(&gp)) {
            fprintf(stderr, "gen: %s\n", engine_error_last());
            return 1;
        }
    }
    engine_log_set(NULL, NULL, ENGINE_LOG_WARN);
    int32_t n = n_sys + n_new;
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n);
    for (int32_t i = 0; i < n; i++) prompt[i] = (int32_t)((i * 7919u + 13) % 150000u) + 1;
    size_t cache = (size_t)64 << 20;
    double *cold = calloc((size_t)reps, sizeof(double)), *warm = calloc((size_t)reps, sizeof(double));
    double *load = calloc((size_t)reps, sizeof(double)), dummy;
    int32_t cached_cold = 0, cached_warm = 0;
    printf("# %s %s: system block %d tokens, first user message %d tokens, %d repetitions\n",
           argv[1], argv[2], (int)n_sys, (int)n_new, reps);
    /* the prefix file for the persisted runs */
    {
        engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
        mp.device = ENGINE_DEVICE_CPU;
        mp.prefix_cache_bytes = cache;
        engine_model *m = NULL;
        engine_prefix_info info;
        if (engine_model_load(&m, model, &mp) ||
            engine_prefix_save(m, prompt, (size_t)n_sys, file, &info)) {
            fprintf(stderr, "prefix file: %s\n", engine_error_last());
            return 1;
        }
        printf("  prefix file: %d tokens, %.1f MiB\n", info.n_tokens,
               info.file_bytes / 1048576.0);
        engine_model_free(m);
    }
    for (int r = 0; r < reps; r++) {
        if (first_turn(model, cache, prompt, n, NULL, n_sys, &dummy, &cold[r], &cached_cold) ||
            first_turn(model, cache, prompt, n, file, n_sys, &load[r], &warm[r], &cached_warm))
            return 1;
        printf("  rep %d: cold TTFT %.1f ms | persisted: load %.1f ms + TTFT %.1f ms\n", r,
               cold[r], load[r], warm[r]);
    }
    double mc = median(cold, reps), ml = median(load, reps), mw = median(warm, reps);
    printf("cold first turn:      TTFT %8.1f ms (%d of %d prompt tokens cached)\n", mc,
           (int)cached_cold, (int)n);
    printf("persisted prefix:     TTFT %8.1f ms + prefix load %.1f ms = %.1f ms (%d cached)\n", mw,
           ml, mw + ml, (int)cached_warm);
    printf("speed-up of the first turn: %.1fx\n", mc / (mw + ml));
    unlink(file);
    free(prompt);
    free(cold);
    free(warm);
    free(load);
    return 0;
}
