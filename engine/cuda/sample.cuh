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
    /* truncation, with temp > 0 and only in a launch of engine_cu_sample_topk (else ignored):
     * top_k in 1..ENGINE_CU_TOPK_MAX keeps the top_k largest logits, then top_p (< 1: the
     * smallest prefix whose probabilities reach it) and min_p (> 0: p >= min_p * p_max), the
     * host sampler's order (engine/sample/sampler.c) */
    int32_t top_k;
    float top_p, min_p;
    int32_t tk_algo; /* the top_k selection: 0 rounds of warp-wide merges, 1 radix select */
    int32_t masked;  /* 1: only the tokens whose bit is set in the launch's allow may be drawn */
} engine_cu_step;

/* The draw's hashes: the key of the draw numbered n_out under seed, and a uniform in (0, 1)
 * from a key's 53 high bits (the Gumbel draw hashes key + i per logit). */
__host__ __device__ __forceinline__ uint64_t engine_cu_splitmix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
__host__ __device__ __forceinline__ uint64_t engine_cu_draw_key(uint64_t seed, int32_t n_out) {
    return engine_cu_splitmix64(seed ^ engine_cu_splitmix64((uint64_t)n_out + 1));
}
__host__ __device__ __forceinline__ double engine_cu_key_uniform(uint64_t key) {
    return ((double)(key >> 11) + 0.5) * 0x1.0p-53;
}

#define ENGINE_CU_SAMPLE_BLOCKS 128
#define ENGINE_CU_TOPK_MAX 64
/* the top-k launch: logits a block holds at most (n <= ENGINE_CU_SAMPLE_BLOCKS * this), its
 * global scratch (the blocks' candidate lists) and its dynamic shared memory */
#define ENGINE_CU_TOPK_SLICE 2048
#define ENGINE_CU_TOPK_KEYS (ENGINE_CU_SAMPLE_BLOCKS * ENGINE_CU_TOPK_MAX)

/* x[t n_embd .. (t + 1) n_embd) = row `step[t].token` of the embedding (any supported type),
 * t < m, in one launch. */
void engine_cu_embed(const uint8_t *emb, size_t row_bytes, int type, int n_embd,
                     const engine_cu_step *step, int m, float *x, cudaStream_t stream);

/* The next step's embedding, gathered by the draw's last block once it has chosen (a decode
 * graph's draw, so that the step starts at its first layer with no launch of its own for the
 * embedding): x[0 .. n_embd) = row `choice` of table (any supported type); x NULL: none. */
typedef struct {
    const uint8_t *table;
    size_t row_bytes;
    int type, n_embd;
    float *x;
} engine_cu_embed_to;

/* Sample from logits[0..n): step->token = choice, out[n_out++] = choice (while n_out < cap),
 * step->pos++. scratch: 2 * ENGINE_CU_SAMPLE_BLOCKS values; counter: one zeroed unsigned.
 * allow: NULL, or n bits that, where step->masked, say which tokens may be drawn (the others
 * count as -inf, as the host sampler's grammar mask makes them). emb: NULL, or the choice's
 * embedding row to gather (engine_cu_embed_to). */
void engine_cu_sample(const float *logits, int n, engine_cu_step *step, int32_t *out,
                      float *scratch, unsigned *counter, cudaStream_t stream,
                      const uint32_t *allow = nullptr, const engine_cu_embed_to *emb = nullptr);
/* engine_cu_sample's kernel (a graph's node), or (greedy) an instance of it that draws
 * greedily whatever step->temp says and holds no other draw's code: the same launch. */
const void *engine_cu_sample_kernel(bool greedy);
/* The same, and where step->temp > 0 and step->top_k is in 1..ENGINE_CU_TOPK_MAX the
 * truncated draw: each block's top_k candidates into keys (ENGINE_CU_TOPK_KEYS values), the
 * last block's merge of them, softmax(l / T), top_p, min_p and a draw with the uniform of
 * (seed, n_out). n <= ENGINE_CU_SAMPLE_BLOCKS * ENGINE_CU_TOPK_SLICE. Launched with ~66 KB
 * of dynamic shared memory, above the default limit:
 * engine_cu_sample_topk_prepare raises it (on the current device; not during a capture). */
cudaError_t engine_cu_sample_topk_prepare(void);
/* engine_cu_step.tk_algo from SPARK_CUDA_TOPK: "radix" 1, else 0 (the warp-wide merges). */
int engine_cu_topk_algo_env(void);
void engine_cu_sample_topk(const float *logits, int n, engine_cu_step *step, int32_t *out,
                           float *scratch, uint64_t *keys, unsigned *counter, cudaStream_t stream,
                           const uint32_t *allow = nullptr,
                           const engine_cu_embed_to *emb = nullptr);

#endif
