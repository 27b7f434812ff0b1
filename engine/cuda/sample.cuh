/* Token in, token out: the embedding gather at the start of a decode step and greedy /
 * temperature sampling at its end, so only token ids cross between host and device.
 *
 * The step state lives in device memory (engine_cu_step): the graph of a decode step reads the
 * token and position from it, and the sampler writes the next token, appends it to `out` and
 * advances the position, so a captured step can be replayed back to back with no host
 * round trip. Temperature sampling uses the Gumbel-max trick: argmax(logit / T + g_i) with
 * g_i = -log(-log(u_i)), u_i a counter-based hash of (seed, step, i): exactly a draw from
 * softmax(logit / T), reproducible for a seed. Greedy (T <= 0): the largest logit, ties to the
 * lower id (as the CPU sampler). */
#ifndef SPARK_ENGINE_CUDA_SAMPLE_CUH
#define SPARK_ENGINE_CUDA_SAMPLE_CUH

#include <stddef.h>
#include <stdint.h>

#include "common.cuh"

typedef struct {
    int32_t token; /* the token this step consumes */
    int32_t pos;   /* its position */
    int32_t n_out; /* tokens appended to out so far */
    int32_t out_cap;
    uint64_t seed;
    float temp; /* <= 0: greedy */
    int32_t pad;
} engine_cu_step;

#define ENGINE_CU_SAMPLE_BLOCKS 128

/* x[t n_embd .. (t + 1) n_embd) = row `step[t].token` of the embedding (any supported type),
 * t < m, in one launch. */
void engine_cu_embed(const uint8_t *emb, size_t row_bytes, int type, int n_embd,
                     const engine_cu_step *step, int m, float *x, cudaStream_t stream);

/* Sample from logits[0..n): step->token = choice, out[n_out++] = choice (while n_out < cap),
 * step->pos++. scratch: 2 * ENGINE_CU_SAMPLE_BLOCKS values; counter: one zeroed unsigned. */
void engine_cu_sample(const float *logits, int n, engine_cu_step *step, int32_t *out,
                      float *scratch, unsigned *counter, cudaStream_t stream);

#endif
