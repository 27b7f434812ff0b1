/* KV type benchmark (not a test): memory per token and CPU decode speed with F16 vs Q8_0 KV.
 * Built and run by kv_type.sh.
 *
 *   kv_type PRESET WEIGHT_TYPE DEPTH N_GEN THREADS REPS
 *
 * For each KV type: a session of DEPTH + N_GEN + 1 positions, a prompt of DEPTH tokens (pp),
 * then N_GEN greedy decode steps (tg), REPS times (the best and the mean are printed); KV
 * bytes per token from the engine's row size. Then the attention op alone over DEPTH
 * positions for one GQA group of the preset's shape (what the KV type changes), best of
 * REPS x 20 calls. */
#define _DEFAULT_SOURCE /* mkstemps */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/cpu.h"
#include "engine.h"
#include "model/model_int.h"

static int32_t argmax(const float *v, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* One KV type: pp and tg in tokens per second (best of reps and mean). */
static int run_model(engine_model *m, engine_kv_type kv, int32_t depth, int32_t n_gen, int reps,
                     double pp[2], double tg[2]) {
    engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
    sp.n_ctx = depth + n_gen + 1;
    sp.n_batch = 64;
    sp.kv_type = kv;
    int32_t nv = engine_model_n_vocab(m);
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)depth);
    if (!prompt) return -1;
    for (int32_t i = 0; i < depth; i++)
        prompt[i] = (int32_t)((i * 7919u + 13u) % (uint32_t)(nv - 1)) + 1;
    pp[0] = tg[0] = 0;
    pp[1] = tg[1] = 0;
    for (int r = 0; r < reps; r++) {
        engine_session *s = NULL;
        if (engine_session_new(&s, m, &sp)) {
            free(prompt);
            return -1;
        }
        double t0 = engine_time_ms();
        int rc = engine_session_append(s, prompt, (size_t)depth, NULL);
        double t1 = engine_time_ms();
        for (int32_t i = 0; rc == 0 && i < n_gen; i++) {
            int32_t t = argmax(engine_session_logits(s), nv);
            rc = engine_session_append(s, &t, 1, NULL);
        }
        double t2 = engine_time_ms();
        engine_session_free(s);
        if (rc) {
            free(prompt);
            return -1;
        }
        double a = depth / ((t1 - t0) / 1000), b = n_gen / ((t2 - t1) / 1000);
        pp[0] = fmax(pp[0], a);
        tg[0] = fmax(tg[0], b);
        pp[1] += a / reps;
        tg[1] += b / reps;
    }
    free(prompt);
    return 0;
}

/* The attention op alone: microseconds per call for one group over depth positions. */
static double run_op(engine_kv_type kv, int n_kv, int hd, int group, int32_t depth, int reps) {
    int32_t bs = 16, nb = (depth + bs - 1) / bs;
    size_t rb = engine_cpu_kv_row_bytes(kv, n_kv, hd);
    void **kb = calloc((size_t)nb, sizeof *kb), **vb = calloc((size_t)nb, sizeof *vb);
    float *row = malloc(sizeof(float) * (size_t)n_kv * hd * 2);
    float *q = malloc(sizeof(float) * (size_t)group * hd), *o = malloc(sizeof(float) * group * hd);
    float *sc = malloc(sizeof(float) * (size_t)group * depth);
    double best = INFINITY;
    if (!kb || !vb || !row || !q || !o || !sc) goto out;
    for (int32_t b = 0; b < nb; b++) {
        kb[b] = malloc(rb * (size_t)bs);
        vb[b] = malloc(rb * (size_t)bs);
        if (!kb[b] || !vb[b]) goto out;
    }
    engine_kv_view v = {kb, vb, bs, kv, n_kv, hd};
    unsigned x = 1;
    for (int32_t p = 0; p < depth; p++) {
        for (int i = 0; i < n_kv * hd * 2; i++) {
            x = x * 1103515245u + 12345u;
            row[i] = (float)((x >> 8) & 0xffff) / 32768.0f - 1.0f;
        }
        engine_cpu_kv_store(&v, p, row, row + n_kv * hd);
    }
    for (int i = 0; i < group * hd; i++) q[i] = row[i];
    for (int r = 0; r < reps; r++) {
        double t0 = engine_time_ms();
        for (int k = 0; k < 20; k++)
            engine_cpu_attention_group(o, q, group, &v, k % n_kv, depth,
                                       1.0f / sqrtf((float)hd), sc);
        best = fmin(best, (engine_time_ms() - t0) * 1000 / 20);
    }
out:
    for (int32_t b = 0; kb && vb && b < nb; b++) {
        free(kb[b]);
        free(vb[b]);
    }
    free(kb);
    free(vb);
    free(row);
    free(q);
    free(o);
    free(sc);
    return best;
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s PRESET WEIGHT_TYPE DEPTH N_GEN THREADS REPS\n", argv[0]);
        return 2;
    }
    int32_t depth = atoi(argv[3]), n_gen = atoi(argv[4]);
    int threads = atoi(argv[5]), reps = atoi(argv[6]);
    if (depth < 1 || n_gen < 1 || threads < 1 || reps < 1) return 2;
    char path[] = "/tmp/spark_kv_type_XXXXXX.gguf";
    int fd = mkstemps(path, 5);
    if (fd < 0) return 1;
    close(fd);
    engine_model_gen_params gp;
    engine_model_gen_params_init(&gp);
    gp.preset = argv[1];
    gp.type = argv[2];
    gp.seed = 1;
    gp.out_path = path;
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.n_threads = threads;
    mp.device = ENGINE_DEVICE_CPU;
    mp.n_ctx = depth + n_gen + 1;
    engine_model *m = NULL;
    int rc = 1;
    if (engine_model_gen(&gp) || engine_model_load(&m, path, &mp)) {
        fprintf(stderr, "%s\n", engine_error_last());
        goto out;
    }
    const engine_hparams *hp = &m->hp;
    int n_attn = (int)hp->n_layer; /* every layer has KV (qwen3moe / qwen3) */
    printf("preset %s, weights %s, %u layers with KV, %u kv heads of %u, group %u; depth %d, "
           "%d decode tokens, %d threads, best / mean of %d\n", argv[1], argv[2], hp->n_layer,
           hp->n_head_kv, hp->head_dim_k, hp->n_head / hp->n_head_kv, depth, n_gen, threads,
           reps);
    printf("| KV   | bytes/token | KV at depth (MiB) | pp tok/s (best/mean) | tg tok/s (best/mean) "
           "| attention op us (1 group, depth) |\n");
    printf("|------|------------:|------------------:|---------------------:|---------------------:"
           "|---------------------------------:|\n");
    static const engine_kv_type kinds[] = {ENGINE_KV_F16, ENGINE_KV_Q8_0};
    for (int k = 0; k < 2; k++) {
        size_t per_tok =
            2 * (size_t)n_attn *
            engine_cpu_kv_row_bytes(kinds[k], (int)hp->n_head_kv, (int)hp->head_dim_k);
        double pp[2], tg[2];
        if (run_model(m, kinds[k], depth, n_gen, reps, pp, tg)) {
            fprintf(stderr, "%s\n", engine_error_last());
            goto out;
        }
        double op = run_op(kinds[k], (int)hp->n_head_kv, (int)hp->head_dim_k,
                           (int)(hp->n_head / hp->n_head_kv), depth, reps);
        printf("| %-4s | %11zu | %17.2f | %9.1f / %8.1f | %9.2f / %8.2f | %32.1f |\n",
               engine_kv_type_name(kinds[k]), per_tok, (double)per_tok * depth / (1 << 20),
               pp[0], pp[1], tg[0], tg[1], op);
    }
    rc = 0;
out:
    engine_model_free(m);
    unlink(path);
    return rc;
}
