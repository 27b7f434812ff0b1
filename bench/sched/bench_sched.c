/* Scheduler benchmark (not a test), built and run by bench/sched/run.sh.
 *
 *   bench_sched gen PRESET TYPE MODEL.gguf
 *       write the random model (seed 1) the other modes load.
 *   bench_sched MODEL.gguf decode N_THREADS TOKENS CONC...
 *       aggregate decode tok/s with CONC concurrent greedy requests (short distinct prompts,
 *       TOKENS tokens each, end-of-generation ignored), through one scheduler; the same
 *       requests one after another through engine_generate as the baseline.
 *   bench_sched MODEL.gguf replay N_THREADS TURNS SYSTEM NEW ANSWER
 *       a TURNS-turn agent conversation (bench/kv/kv_replay.c's shape) through a scheduler on a
 *       model with a prefix cache: each turn re-sends everything before plus NEW tokens of text
 *       and tool results, and the model's ANSWER tokens (generated) join the conversation, as
 *       in an agent. Per turn: the prompt, the tokens served from the cache, time to first
 *       token.
 *   bench_sched MODEL.gguf replay-off N_THREADS TURNS SYSTEM NEW ANSWER
 *       the same conversation with the prefix cache off: each turn a fresh session computing
 *       its whole prompt (the baseline for the TTFT column). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "model/model_int.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int n_left;
static engine_request_stats last;

static void on_done(void *user, uint64_t id, int rc, const engine_request_stats *st) {
    (void)user;
    (void)id;
    if (rc) fprintf(stderr, "request failed: %s\n", engine_error_name(rc));
    pthread_mutex_lock(&mu);
    last = *st;
    n_left--;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static void wait_all(void) {
    pthread_mutex_lock(&mu);
    while (n_left > 0) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

static int submit(engine_sched *s, const int32_t *prompt, size_t n, int32_t max_tokens) {
    engine_request r;
    memset(&r, 0, sizeof r);
    engine_gen_params g = ENGINE_GEN_PARAMS_INIT;
    r.gen = g;
    r.gen.prompt = prompt;
    r.gen.n_prompt = n;
    r.gen.max_tokens = max_tokens;
    r.gen.sampling.temperature = 0;
    r.gen.ignore_eog = true;
    r.on_done = on_done;
    uint64_t id;
    pthread_mutex_lock(&mu);
    n_left++;
    pthread_mutex_unlock(&mu);
    int rc = engine_sched_submit(s, &r, &id);
    if (rc) {
        fprintf(stderr, "submit: %s\n", engine_error_last());
        pthread_mutex_lock(&mu);
        n_left--;
        pthread_mutex_unlock(&mu);
    }
    return rc;
}

static int decode(engine_model *m, int32_t tokens, int n_conc, const int *conc) {
    enum { PROMPT = 16 };
    int32_t nv = engine_model_n_vocab(m);
    printf("# aggregate decode: %d tokens per request, %d-token prompts, greedy\n", tokens, PROMPT);
    printf("%5s %10s %10s %12s %12s\n", "conc", "wall_s", "tokens", "agg_tok/s", "serial_tok/s");
    for (int c = 0; c < n_conc; c++) {
        int n = conc[c];
        int32_t *prompts = malloc(sizeof(int32_t) * PROMPT * (size_t)n);
        if (!prompts) return 1;
        for (int i = 0; i < PROMPT * n; i++)
            prompts[i] = (int32_t)(((uint32_t)i * 2654435761u + 17) % (uint32_t)(nv - 1000));
        engine_sched_params sp = ENGINE_SCHED_PARAMS_INIT;
        sp.max_seqs = n;
        sp.n_ctx = PROMPT + tokens + 16;
        engine_sched *s = NULL;
        if (engine_sched_new(&s, m, &sp)) {
            fprintf(stderr, "%s\n", engine_error_last());
            free(prompts);
            return 1;
        }
        double t0 = engine_time_ms();
        for (int i = 0; i < n; i++) submit(s, prompts + PROMPT * i, PROMPT, tokens);
        wait_all();
        double wall = (engine_time_ms() - t0) / 1000;
        engine_sched_stats st;
        engine_sched_stats_get(s, &st);
        engine_sched_free(s);
        /* baseline: the first request alone through engine_generate (per-token rate) */
        engine_session_params pp = ENGINE_SESSION_PARAMS_INIT;
        pp.n_ctx = sp.n_ctx;
        engine_session *ss = NULL;
        double serial = 0;
        if (engine_session_new(&ss, m, &pp) == 0) {
            engine_gen_params g = ENGINE_GEN_PARAMS_INIT;
            g.prompt = prompts;
            g.n_prompt = PROMPT;
            g.max_tokens = tokens;
            g.sampling.temperature = 0;
            g.ignore_eog = true;
            double t1 = engine_time_ms();
            engine_gen_stats gs;
            if (engine_generate(ss, &g, NULL, NULL, &gs) == 0)
                serial = gs.generated_tokens / ((engine_time_ms() - t1) / 1000);
            engine_session_free(ss);
        }
        printf("%5d %10.2f %10llu %12.1f %12.1f\n", n, wall,
               (unsigned long long)st.generated_tokens, st.generated_tokens / wall, serial);
        fflush(stdout);
        free(prompts);
    }
    return 0;
}

/* The answer being generated in replay (the scheduler thread appends, main reads after done). */
static int32_t *answer;
static int32_t n_answer, cap_answer;

static int on_answer(void *user, const char *text, size_t len, int32_t token) {
    (void)user;
    (void)text;
    (void)len;
    if (token >= 0 && n_answer < cap_answer) answer[n_answer++] = token;
    return 0;
}

/* Cache off: the same turn through engine_generate on a fresh session of a model without a
 * prefix cache, so the whole prompt is computed; time to first token = prefill + first sample
 * (the greedy answer is the same as with the cache). */
static int turn_cold(engine_model *m, int32_t n_ctx, const int32_t *tr, int32_t len, int32_t ans,
                     engine_request_stats *out) {
    engine_session_params pp = ENGINE_SESSION_PARAMS_INIT;
    pp.n_ctx = n_ctx;
    engine_session *ss = NULL;
    if (engine_session_new(&ss, m, &pp)) return -1;
    engine_gen_params g = ENGINE_GEN_PARAMS_INIT;
    g.prompt = tr;
    g.n_prompt = (size_t)len;
    g.max_tokens = ans;
    g.sampling.temperature = 0;
    g.ignore_eog = true;
    engine_gen_stats gs;
    double t0 = engine_time_ms();
    int rc = engine_generate(ss, &g, on_answer, NULL, &gs);
    double all = engine_time_ms() - t0;
    engine_session_free(ss);
    memset(out, 0, sizeof *out);
    out->gen = gs;
    /* prefill plus the first token's share of sampling */
    out->ttft_ms = gs.prefill_ms + (gs.generated_tokens ? gs.sample_ms / gs.generated_tokens : 0);
    out->total_ms = all;
    return rc;
}

static int replay(engine_model *m, int turns, int32_t sys, int32_t add, int32_t ans, bool off) {
    int32_t n = sys + turns * (add + ans), nv = engine_model_n_vocab(m);
    int32_t *tr = malloc(sizeof(int32_t) * (size_t)n);
    if (!tr) return 1;
    for (int32_t i = 0; i < sys; i++) tr[i] = (int32_t)(((uint32_t)i * 2654435761u) % (uint32_t)nv);
    engine_sched_params sp = ENGINE_SCHED_PARAMS_INIT;
    sp.n_ctx = n + 1;
    sp.max_seqs = 4;
    engine_sched *s = NULL;
    if (!off && engine_sched_new(&s, m, &sp)) {
        fprintf(stderr, "%s\n", engine_error_last());
        free(tr);
        return 1;
    }
    printf("# replay %s: %d turns, system %d, +%d new tokens per turn, then the model's answer "
           "(%d tokens, greedy) goes into the next turn's prompt\n",
           off ? "with the prefix cache OFF (a fresh session per turn)" : "through the scheduler",
           turns, sys, add, ans);
    printf("%4s %7s %9s %8s %9s\n", "turn", "prompt", "computed", "cached", "ttft_ms");
    uint64_t sum_prompt = 0, sum_cached = 0;
    int32_t len = sys;
    for (int t = 0; t < turns; t++) {
        for (int32_t i = 0; i < add; i++, len++)
            tr[len] = (int32_t)(((uint32_t)len * 2654435761u) % (uint32_t)nv);
        answer = tr + len;
        n_answer = 0;
        cap_answer = ans;
        if (off) {
            if (turn_cold(m, n + 1, tr, len, ans, &last)) {
                fprintf(stderr, "turn %d: %s\n", t + 1, engine_error_last());
                break;
            }
        } else {
            engine_request r;
            memset(&r, 0, sizeof r);
            engine_gen_params g = ENGINE_GEN_PARAMS_INIT;
            r.gen = g;
            r.gen.prompt = tr;
            r.gen.n_prompt = (size_t)len;
            r.gen.max_tokens = ans;
            r.gen.sampling.temperature = 0;
            r.gen.ignore_eog = true;
            r.on_token = on_answer;
            r.on_done = on_done;
            uint64_t id;
            pthread_mutex_lock(&mu);
            n_left = 1;
            pthread_mutex_unlock(&mu);
            if (engine_sched_submit(s, &r, &id)) {
                fprintf(stderr, "submit: %s\n", engine_error_last());
                break;
            }
            wait_all();
        }
        printf("%4d %7d %9d %7.1f%% %9.1f\n", t + 1, len, len - last.gen.cached_tokens,
               100.0 * last.gen.cached_tokens / len, last.ttft_ms);
        sum_prompt += (uint64_t)len;
        sum_cached += (uint64_t)last.gen.cached_tokens;
        len += n_answer;
    }
    engine_sched_stats st;
    memset(&st, 0, sizeof st);
    if (s) engine_sched_stats_get(s, &st);
    printf("# total: %llu of %llu prompt tokens from the cache (%.1f%%); pool %d blocks of %d "
           "positions\n", (unsigned long long)sum_cached, (unsigned long long)sum_prompt,
           100.0 * (double)sum_cached / (double)sum_prompt, st.blocks_total, st.block_tokens);
    engine_sched_free(s);
    free(tr);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "gen") == 0) {
        engine_model_gen_params gp;
        engine_model_gen_params_init(&gp);
        gp.preset = argv[2];
        gp.type = argv[3];
        gp.seed = 1;
        gp.out_path = argv[4];
        if (engine_model_gen(&gp) == 0) return 0;
        fprintf(stderr, "%s\n", engine_error_last());
        return 1;
    }
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL decode N_THREADS TOKENS CONC...\n"
                        "       %s MODEL replay|replay-off N_THREADS TURNS SYSTEM NEW ANSWER\n",
                argv[0], argv[0]);
        return 2;
    }
    bool off = strcmp(argv[2], "replay-off") == 0;
    bool rep = off || strcmp(argv[2], "replay") == 0;
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.n_threads = atoi(argv[3]);
    mp.device = ENGINE_DEVICE_CPU;
    if (rep && !off) mp.prefix_cache_bytes = (size_t)256 << 20;
    engine_model *m = NULL;
    if (engine_model_load(&m, argv[1], &mp)) {
        fprintf(stderr, "%s\n", engine_error_last());
        return 1;
    }
    engine_model_info info;
    engine_model_info_get(m, &info);
    printf("# %s (%s, %s), %d threads, SIMD %s\n", argv[1], info.arch, info.weight_type,
           info.n_threads, engine_cpu_simd_path());
    int rc;
    if (rep) {
        if (argc < 8) return 2;
        rc = replay(m, atoi(argv[4]), atoi(argv[5]), atoi(argv[6]), atoi(argv[7]), off);
    } else {
        int conc[16], n_conc = 0;
        for (int i = 5; i < argc && n_conc < 16; i++) conc[n_conc++] = atoi(argv[i]);
        rc = decode(m, atoi(argv[4]), n_conc, conc);
    }
    engine_model_free(m);
    return rc;
}
