/* bench_env.h - the environment settings of one benchmark variant (bench_decode -e, bench_q35
 * -e / -M): "A=1 B=2" set for the variant's sessions, then restored. Header-only (the bench
 * programs are single files compiled by hand on the GPU machine). */
#ifndef SPARK_BENCH_CUDA_BENCH_ENV_H
#define SPARK_BENCH_CUDA_BENCH_ENV_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_ENV_MAX 16

typedef struct {
    char buf[512];
    char *names[BENCH_ENV_MAX], *olds[BENCH_ENV_MAX];
    int n;
} bench_env;

/* Set each NAME=VALUE word of spec (at most BENCH_ENV_MAX; words without '=' are skipped),
 * remembering the old values. */
static inline void bench_env_push(bench_env *e, const char *spec) {
    e->n = 0;
    snprintf(e->buf, sizeof e->buf, "%s", spec);
    for (char *save = NULL, *t = strtok_r(e->buf, " ", &save); t && e->n < BENCH_ENV_MAX;
         t = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(t, '=');
        if (!eq) continue;
        *eq = 0;
        const char *o = getenv(t);
        e->names[e->n] = t;
        e->olds[e->n] = o ? strdup(o) : NULL;
        setenv(t, eq + 1, 1);
        e->n++;
    }
}

/* Restore what bench_env_push changed. */
static inline void bench_env_pop(bench_env *e) {
    for (int i = 0; i < e->n; i++) {
        if (e->olds[i])
            setenv(e->names[i], e->olds[i], 1);
        else
            unsetenv(e->names[i]);
        free(e->olds[i]);
    }
    e->n = 0;
}

#endif
