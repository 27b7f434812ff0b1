/* The gated delta rule of one head, recurrent (engine_cpu_delta_rule) vs chunked
 * (engine_cpu_delta_chunk_rows + _fold, chunks of CHUNK rows): microseconds per token at the
 * real model's head size, for prefill (a chunk's rows at once) and decode (one row at a time).
 * A benchmark, not a test; built and run by bench/qwen35/delta_op.sh. Single thread. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu.h"

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); /* CPU time: the machine is shared */
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static float frand(unsigned *x) {
    *x = *x * 1664525u + 1013904223u;
    return (float)(*x >> 8) / 16777216.0f - 0.5f;
}

int main(int argc, char **argv) {
    int dk = argc > 1 ? atoi(argv[1]) : 128, dv = argc > 2 ? atoi(argv[2]) : 128;
    int n = argc > 3 ? atoi(argv[3]) : 2048, cap = argc > 4 ? atoi(argv[4]) : 16;
    if (dk < 1 || dv < 1 || n < 1 || cap < 1 || cap > ENGINE_CPU_DELTA_CHUNK_MAX) {
        fprintf(stderr, "usage: delta_op [DK DV N CHUNK<=%d]\n", ENGINE_CPU_DELTA_CHUNK_MAX);
        return 2;
    }
    unsigned seed = 1;
    float *q = malloc(sizeof(float) * (size_t)n * dk), *k = malloc(sizeof(float) * (size_t)n * dk);
    float *v = malloc(sizeof(float) * (size_t)n * dv), *o = malloc(sizeof(float) * (size_t)n * dv);
    float *lg = malloc(sizeof(float) * (size_t)n), *beta = malloc(sizeof(float) * (size_t)n);
    float *s = calloc((size_t)dk * dv, sizeof(float)), *tmp = malloc(sizeof(float) * (size_t)dv);
    float *pend = malloc(sizeof(float) * ENGINE_CPU_DELTA_PEND_FLOATS(cap, dk, dv));
    float *scr = malloc(sizeof(float) * 2 * (size_t)cap * dv);
    if (!q || !k || !v || !o || !lg || !beta || !s || !tmp || !pend || !scr) return 1;
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < dk; i++) {
            q[(size_t)t * dk + i] = frand(&seed);
            k[(size_t)t * dk + i] = frand(&seed);
        }
        engine_cpu_l2norm(q + (size_t)t * dk, q + (size_t)t * dk, dk, 1e-6f, 1.0f / sqrtf(dk));
        engine_cpu_l2norm(k + (size_t)t * dk, k + (size_t)t * dk, dk, 1e-6f, 1.0f);
        for (int c = 0; c < dv; c++)
            v[(size_t)t * dv + c] = frand(&seed);
        lg[t] = -0.05f + 0.04f * frand(&seed);
        beta[t] = 0.5f + frand(&seed);
    }
    double best[3] = {1e30, 1e30, 1e30};
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_us();
        for (int t = 0; t < n; t++)
            engine_cpu_delta_rule(s, dk, dv, q + (size_t)t * dk, k + (size_t)t * dk,
                                  v + (size_t)t * dv, expf(lg[t]), beta[t], o + (size_t)t * dv,
                                  tmp);
        double t1 = now_us();
        memset(s, 0, sizeof(float) * (size_t)dk * dv);
        for (int pass = 0; pass < 2; pass++) { /* 0: chunks at once, 1: one row at a time */
            double a = now_us();
            int m = 0;
            for (int t = 0; t < n;) {
                int np = pass ? 1 : (cap - m < n - t ? cap - m : n - t);
                engine_cpu_delta_chunk_rows(s, pend, cap, m, np, dk, dv, q + (size_t)t * dk,
                                            k + (size_t)t * dk, v + (size_t)t * dv, (size_t)dv,
                                            lg + t, beta + t, o + (size_t)t * dv, scr);
                m += np;
                t += np;
                if (m == cap) {
                    engine_cpu_delta_chunk_fold(s, pend, cap, m, dk, dv);
                    m = 0;
                }
            }
            double b = now_us();
            if (b - a < best[1 + pass]) best[1 + pass] = b - a;
            memset(s, 0, sizeof(float) * (size_t)dk * dv);
        }
        if (t1 - t0 < best[0]) best[0] = t1 - t0;
    }
    printf("head %dx%d, %d tokens, chunk %d (best of 5, CPU us/token): recurrent %.3f, chunked "
           "prefill %.3f (%.2fx), chunked one row at a time %.3f (%.2fx)\n",
           dk, dv, n, cap, best[0] / n, best[1] / n, best[0] / best[1], best[2] / n,
           best[0] / best[2]);
    return 0;
}
