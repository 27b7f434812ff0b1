/* Benchmark (not a test): vec_dot throughput per tensor type, scalar versus the SIMD path the
 * dispatch chose, as GB/s of weight bytes streamed and ns per row; plus quantize and dequantize
 * speed (values/s), which bounds how fast the generator can write a model.
 *
 * Build and run (see bench/quant/run.sh):
 *   bench/quant/run.sh [BUILD_DIR] [ROWS] [THREADS]      defaults: build, 4096, 1
 * With THREADS > 1 it also measures quantize throughput on that many threads (each quantizes
 * its own rows), the figure that bounds the random-model generator.
 * One thread. Weights: a matrix of ROWS x COLS that is larger than the last-level cache
 * (64 MiB of f32), so the figures are memory-bound the way the decode step is. */
#include "cpu/quant.h"
#include "cpu/quant_kernels.h"
#include "engine.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    engine_type t;
    const float *src;
    int cols, rows;
    uint8_t *dst;
} qjob;

static void *quantize_rows(void *arg) {
    qjob *j = arg;
    const size_t stride = engine_type_row_size(j->t, j->cols);
    for (int r = 0; r < j->rows; r++)
        engine_quantize_row(j->t, j->src + (size_t)(r % 64) * j->cols, j->dst + r * stride,
                            j->cols);
    return NULL;
}

/* Values per second quantized by n threads together. */
static double parallel_quantize(engine_type t, const float *src, int cols, int rows, int n) {
    pthread_t tid[256];
    qjob jobs[256];
    const size_t stride = engine_type_row_size(t, cols);
    for (int i = 0; i < n; i++) {
        jobs[i] = (qjob){t, src, cols, rows, malloc(stride * (size_t)rows)};
        memset(jobs[i].dst, 0, stride * (size_t)rows);
    }
    const double t0 = now();
    for (int i = 0; i < n; i++)
        pthread_create(&tid[i], NULL, quantize_rows, &jobs[i]);
    for (int i = 0; i < n; i++)
        pthread_join(tid[i], NULL);
    const double dt = now() - t0;
    for (int i = 0; i < n; i++)
        free(jobs[i].dst);
    return (double)n * rows * cols / dt;
}

int main(int argc, char **argv) {
    const int cols = 4096;
    const int rows = argc > 1 ? atoi(argv[1]) : 4096;
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    const engine_type types[] = {ENGINE_TYPE_F32,  ENGINE_TYPE_F16,  ENGINE_TYPE_BF16,
                                 ENGINE_TYPE_Q8_0, ENGINE_TYPE_Q4_0, ENGINE_TYPE_Q4_K,
                                 ENGINE_TYPE_Q5_K, ENGINE_TYPE_Q6_K};
    engine_vec_dot_fn scalar[ENGINE_TYPE_COUNT] = {0};
    engine_quant_fill_scalar(scalar);
    float *x = malloc(sizeof(float) * cols), *row = malloc(sizeof(float) * (size_t)cols * 64);
    float *y = malloc(sizeof(float) * (size_t)rows);
    uint64_t s = 88172645463325252ull;
    for (int i = 0; i < cols * 64; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        row[i] = (float)((int64_t)(s % 2001) - 1000) / 1000.0f;
    }
    memcpy(x, row, sizeof(float) * cols);
    printf("CPU path: %s; matrix %d x %d, one thread\n", engine_quant_simd_path(), rows, cols);
    printf("%-5s %10s %12s %12s %9s %14s %14s\n", "type", "MiB", "scalar GB/s", "SIMD GB/s",
           "speed-up", "quantize Mv/s", "dequant Mv/s");
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const engine_type t = types[k];
        const engine_type vt = engine_type_traits_get(t)->vec_dot_type;
        const size_t stride = engine_type_row_size(t, cols);
        uint8_t *W = malloc(stride * (size_t)rows);
        uint8_t *xc = malloc(engine_type_row_size(vt, cols) + 64);
        memset(W, 0, stride * (size_t)rows); /* page faults out of the timings */
        /* quantize speed: 64 distinct rows, repeated */
        double t0 = now();
        for (int r = 0; r < rows; r++)
            engine_quantize_row(t, row + (size_t)(r % 64) * cols, W + (size_t)r * stride, cols);
        const double tq = now() - t0;
        float *deq = malloc(sizeof(float) * cols);
        t0 = now();
        for (int r = 0; r < rows; r++)
            engine_dequantize_row(t, W + (size_t)r * stride, deq, cols);
        const double td = now() - t0;
        engine_quantize_row(vt, x, xc, cols);
        double best[2] = {1e9, 1e9};
        volatile float sink = 0;
        for (int rep = 0; rep < 5; rep++) {
            for (int path = 0; path < 2; path++) {
                t0 = now();
                if (path == 0)
                    for (int r = 0; r < rows; r++)
                        y[r] = scalar[t](cols, W + (size_t)r * stride, xc);
                else
                    engine_quant_matvec(t, W, stride, cols, 0, rows, xc, y);
                const double dt = now() - t0;
                sink += y[rows / 2];
                if (dt < best[path]) best[path] = dt;
            }
        }
        const double bytes = (double)stride * rows;
        printf("%-5s %10.1f %12.2f %12.2f %8.1fx %14.1f %14.1f\n", engine_type_name(t),
               bytes / (1 << 20), bytes / best[0] / 1e9, bytes / best[1] / 1e9, best[0] / best[1],
               (double)rows * cols / tq / 1e6, (double)rows * cols / td / 1e6);
        free(W);
        free(xc);
        free(deq);
    }
    if (threads > 1) {
        const engine_type qt[] = {ENGINE_TYPE_Q4_K, ENGINE_TYPE_Q5_K, ENGINE_TYPE_Q6_K,
                                  ENGINE_TYPE_Q8_0, ENGINE_TYPE_Q4_0};
        printf("quantize on %d threads (%d rows of %d each):", threads, rows / 4, cols);
        for (size_t k = 0; k < sizeof qt / sizeof qt[0]; k++)
            printf(" %s %.0f Mv/s%s", engine_type_name(qt[k]),
                   parallel_quantize(qt[k], row, cols, rows / 4, threads) / 1e6,
                   k + 1 < sizeof qt / sizeof qt[0] ? "," : "\n");
    }
    free(x);
    free(row);
    free(y);
    return 0;
}
