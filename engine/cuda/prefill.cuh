/* The kernels of a prefill pass on the GPU (many tokens of one sequence at once), besides the
 * tensor-core GEMM (gemm.cuh). Host launchers only; the pass itself is in prefill.cu.
 *
 *   engine_cu_pf_embed       x[t] = row tokens[t] of the embedding (any supported type)
 *   engine_cu_pf_qk_store    per token: q and k heads RMS-normalised and rotated (NeoX RoPE at
 *                            position pos0 + t, the session's table) as the decode attention
 *                            does; k and v rows stored in the KV cache (F16 or F32)
 *   engine_cu_pf_attention   causal attention of n queries at pos0.. over the cache rows
 *                            0 .. pos0 + n - 1 (GQA), tiled: a block holds 32 queries of one
 *                            head and streams the key/value tiles through shared memory with an
 *                            online softmax (flash attention; F32 on the SIMT cores)
 *   engine_cu_pf_route       router logits -> the k experts of each token (softmax, top-k with
 *                            ties to the lower id, renormalised), as engine_cpu_moe_route
 *   engine_cu_pf_sort        counting sort of the n * k slots by expert on the GPU: the token of
 *                            each sorted slot, each slot's sorted position, and the tile list of
 *                            the grouped GEMM (expert, first position, count <= 64)
 *   engine_cu_pf_combine     x[t] += sum_j weight[t][j] * D[position of slot (t, j)], j in order */
#ifndef SPARK_ENGINE_CUDA_PREFILL_CUH
#define SPARK_ENGINE_CUDA_PREFILL_CUH

#include <stddef.h>
#include <stdint.h>

#include "common.cuh"

#define ENGINE_CU_PF_MAX_EXPERT 256 /* experts the sort holds in shared memory */

void engine_cu_pf_embed(const uint8_t *emb, size_t row_bytes, int type, int n_embd,
                        const int32_t *tokens, int n, float *x, cudaStream_t stream);

typedef struct {
    float *q;              /* [n][n_head * hd], rotated in place */
    const float *k, *v;    /* [n][n_kv * hd] */
    const float *q_norm, *k_norm;
    const float2 *rope;    /* [n_ctx][hd / 2] */
    float eps;
    void *k_cache, *v_cache; /* [n_ctx][n_kv * hd] */
    int kv_f32;
    int n, pos0, n_head, n_kv, hd;
    /* NULL: token t is at position pos0 + t and stored in cache row pos0 + t; else (the batched
     * pass over a paged pool) at position pos_of[t], stored in pool row row_of[t] */
    const int32_t *pos_of, *row_of;
} engine_cu_pf_qk_args;
void engine_cu_pf_qk_store(const engine_cu_pf_qk_args *a, cudaStream_t stream);

typedef struct {
    const float *q; /* [n][n_head * hd] */
    const void *k_cache, *v_cache;
    int kv_f32;
    int n, pos0, n_head, n_kv, hd;
    float *out; /* [n][n_head * hd] */
    int tc;     /* tensor cores (F16 cache, head size 64 or 128): engine_cu_pf_att_tc_ok */
} engine_cu_pf_att_args;

/* The tensor-core attention (64 queries of one head per block, 4 warps of 16; S = Q K^T and
 * O += P V with mma.sync m16n8k16 F16, Q and P rounded to F16, the online softmax in F32
 * registers) serves an F16 cache of head size 64 or 128. */
bool engine_cu_pf_att_tc_ok(int kv_f32, int hd);
void engine_cu_pf_attention(const engine_cu_pf_att_args *a, cudaStream_t stream);

/* logits: n_split partial sums [n_split][n][n_expert] (a split-K router GEMM), added in split
 * order (deterministic). */
void engine_cu_pf_route(const float *logits, int n_split, int n, int n_expert, int k,
                        int norm_topk, int32_t *ids, float *weights, cudaStream_t stream);

/* tiles: room for engine_cu_pf_max_tiles(n * k, n_expert) entries of 3 ints. */
int engine_cu_pf_max_tiles(int n_slots, int n_expert);
void engine_cu_pf_sort(const int32_t *ids, int n, int k, int n_expert, int32_t *sorted_tok,
                       int32_t *slot_pos, int32_t *tiles, int32_t *n_tiles, cudaStream_t stream);

/* Attention of n queries of several sequences over a paged KV pool (the batched pass): token t
 * of sequence seq_of[t] at position pos_of[t] attends to that sequence's positions
 * 0 .. pos_of[t], position p being pool row tables[seq][p / block_size] * block_size +
 * p % block_size (its own row stored before). One block of 4 warps per (token, head): each
 * warp streams every fourth group of 32 keys with an online softmax (a lane scores one key, then
 * the warp accumulates the 32 value rows, a lane owning hd / 32 dimensions); the warps' partial
 * results are merged at the end. F32 arithmetic on F16 or F32 rows; head size 64, 128 or 256. */
typedef struct {
    const float *q; /* [n][n_head * hd], normalised and rotated */
    const void *k_cache, *v_cache; /* pool rows [n_blocks * block_size][n_kv * hd] */
    int kv_f32;
    int n, n_head, n_kv, hd;
    const int32_t *pos_of, *seq_of; /* [n] */
    const int32_t *tables;          /* [n_seqs][max_blocks] */
    int max_blocks, block_size;
    float *out; /* [n][n_head * hd] */
} engine_cu_pg_att_args;
void engine_cu_pg_attention(const engine_cu_pg_att_args *a, cudaStream_t stream);

/* dst[i] = src[rows[i]] for i < n (rows of `cols` floats). */
void engine_cu_pf_gather_rows(const float *src, const int32_t *rows, int n, int cols, float *dst,
                              cudaStream_t stream);

void engine_cu_pf_combine(float *x, const float *d, const int32_t *slot_pos, const float *weights,
                          int n, int k, int n_embd, cudaStream_t stream);

/* ---------------------------------------------------------------------------------------------
 * The prefill pass's entry points for the batched pass (batch.cu drives the pass of prefill.cu
 * over a paged KV pool).
 * ------------------------------------------------------------------------------------------- */
extern "C" {
#include "cuda/cuda_backend.h"
}

/* The batched pass's addressing (device arrays) and the rows whose logits go out. */
typedef struct {
    const int32_t *pos_of, *row_of, *seq_of, *tables; /* device */
    int max_blocks, block_size;
    const int32_t *out_rows_d; /* device [n_out]: rows of the pass */
    int n_out;
    float *const *out; /* host [n_out]: n_vocab floats each, or NULL */
} engine_cu_pf_paged;

/* A CUDA error as an engine error naming `what` (0 for cudaSuccess; clears the sticky error). */
int engine_cu_pf_err(cudaError_t e, const char *what);

/* The profiles of the prefill passes (SPARK_CUDA_PROFILE): ms[cat[i]] += the time between
 * events i - 1 and i, for i < n_mark; the log line "<what> profile: <tokens> tokens, ..." of
 * the n phases' totals (names[i]); the events' release (ev, cat: malloc'd; NULL ev: none). */
void engine_cu_pf_prof_add(const cudaEvent_t *ev, const int *cat, int n_mark, double *ms);
void engine_cu_pf_prof_log(const char *what, long tokens, const double *ms,
                           const char *const *names, int n);
void engine_cu_pf_prof_free(cudaEvent_t *ev, int n_ev, int *cat);

/* The weight fields of a product's arguments (engine_cu_gemm_args, engine_cu_bmm_args) from w:
 * matrix 0 (w, row_bytes, mat_bytes), type, rows, cols. */
template <class A> static inline void engine_cu_args_weight(A &a, const engine_cuda_wview *w) {
    a.w = (const uint8_t *)w->d;
    a.row_bytes = w->row_bytes;
    a.mat_bytes = (size_t)w->rows * w->row_bytes;
    a.type = w->type;
    a.rows = w->rows;
    a.cols = w->cols;
}

/* The pass's buffers over the KV of view sv (a session's, s != NULL, or the batched pass's pool,
 * s == NULL), for passes of at most max_tokens tokens. */
int engine_cu_pf_new_view(engine_cuda_prefill **out, engine_cuda_model *cm, engine_cuda_session *s,
                          const engine_cuda_session_view *sv, int32_t max_tokens);

/* One chunk of n <= max_tokens tokens at pos (pg NULL), or the batched pass's tokens (pg): the
 * logits of every row (logits_all) and/or the last (logits_last); with pg, the rows pg lists. */
int engine_cu_pf_chunk(engine_cuda_prefill *p, const int32_t *tokens, int32_t n, int32_t pos,
                       float *logits_all, float *logits_last, const engine_cu_pf_paged *pg);

#endif
