/* Prefix-cache benchmark (not a test): replay an agent transcript of T turns, each turn a new
 * session that re-sends every earlier turn plus new text, a tool result and the previous
 * answer, with the model's prefix cache on and off. Prints, per turn, the prompt length, the
 * tokens computed and the time to first token (the prefill). Built and run by replay.sh.
 *
 *   kv_replay PRESET TYPE [TURNS] [SYSTEM_TOKENS] [NEW_TOKENS_PER_TURN] [ANSWER_TOKENS] */
#define _DEFAULT_SOURCE /* mkstemps */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "kv/kv.h"
#include "model/model_int.h"

static int replay(engine_model *m, const int32_t *tr, const int32_t *turn_end, int turns,
                  int32_t n_ctx, int32_t *computed, double *ttft) {
    engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
    sp.n_ctx = n_ctx;
    for (int t = 0; t < turns; t++) {
        engine_session *s = NULL;
        if (engine_session_new(&s, m, &sp)) return -1;
        double t0 = engine_time_ms();
        if (engine_session_append(s, tr, (size_t)turn_end[t], NULL)) {
            engine_session_free(s);
            return -1;
        }
        ttft[t] = engine_time_ms() - t0;
        computed[t] = turn_end[t] - s->kv_cached;
        engine_session_free(s); /* with the cache on, inserts the turn's blocks */
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s PRESET TYPE [TURNS] [SYSTEM] [NEW] [ANSWER]\n", argv[0]);
        return 2;
    }
    int turns = argc > 3 ? atoi(argv[3]) : 20;
    int32_t sys = argc > 4 ? atoi(argv[4]) : 512, add = argc > 5 ? atoi(argv[5]) : 96;
    int32_t ans = argc > 6 ? atoi(argv[6]) : 32;
    if (turns < 1 || turns > 200 || sys < 1 || add < 1 || ans < 0) return 2;
    char path[] = "/tmp/spark_kv_replay_XXXXXX.gguf";
    int fd = mkstemps(path, 5);
    if (fd < 0) return 1;
    close(fd);
    engine_model_gen_params gp;
    engine_model_gen_params_init(&gp);
    gp.preset = argv[1];
    gp.type = argv[2];
    gp.seed = 1;
    gp.out_path = path;
    engine_model *cold = NULL, *warm = NULL;
    int32_t *tr = NULL, *end = NULL, *c_on = NULL, *c_off = NULL;
    double *t_on = NULL, *t_off = NULL;
    int rc = 1;
    if (engine_model_gen(&gp) || engine_model_load(&cold, path, NULL) ||
        engine_model_load(&warm, path, NULL)) {
        fprintf(stderr, "%s\n", engine_error_last());
        goto done;
    }
    int32_t n = sys + turns * (add + ans), nv = cold->info.n_vocab;
    tr = malloc(sizeof(int32_t) * (size_t)n);
    end = malloc(sizeof(int32_t) * turns);
    c_on = malloc(sizeof(int32_t) * turns);
    c_off = malloc(sizeof(int32_t) * turns);
    t_on = malloc(sizeof(double) * turns);
    t_off = malloc(sizeof(double) * turns);
    if (!tr || !end || !c_on || !c_off || !t_on || !t_off) goto done;
    for (int32_t i = 0; i < n; i++)
        tr[i] = (int32_t)(((uint32_t)i * 2654435761u) % (uint32_t)nv);
    /* turn t sends the system prompt, every earlier turn with its answer, and its new text */
    for (int t = 0; t < turns; t++)
        end[t] = sys + t * (add + ans) + add;
    size_t budget = (size_t)256 << 20;
    if (engine_kv_model_enable(warm, budget, ENGINE_KV_F16)) {
        fprintf(stderr, "%s\n", engine_error_last());
        goto done;
    }
    if (replay(cold, tr, end, turns, n, c_off, t_off) ||
        replay(warm, tr, end, turns, n, c_on, t_on)) {
        fprintf(stderr, "%s\n", engine_error_last());
        goto done;
    }
    engine_kv_stats st;
    engine_kv_cache_stats(warm->kvc, &st);
    printf("# preset %s %s, %d turns: system %d, +%d new and %d answer tokens per turn; pool %d "
           "blocks of %zu bytes (F16)\n",
           argv[1], argv[2], turns, sys, add, ans, st.n_blocks, st.block_bytes);
    printf("%4s %7s | %9s %9s %7s | %9s %9s\n", "turn", "prompt", "on:comp", "on:ttft", "cached",
           "off:comp", "off:ttft");
    for (int t = 0; t < turns; t++)
        printf("%4d %7d | %9d %7.1fms %6.1f%% | %9d %7.1fms\n", t + 1, end[t], c_on[t], t_on[t],
               100.0 * (end[t] - c_on[t]) / end[t], c_off[t], t_off[t]);
    rc = 0;
done:
    free(tr);
    free(end);
    free(c_on);
    free(c_off);
    free(t_on);
    free(t_off);
    engine_model_free(cold);
    engine_model_free(warm);
    unlink(path);
    return rc;
}
