/* The gated full-attention block of qwen35moe on the GPU, one query position (decode).
 *
 * engine_cu_gatt_prep (a block per query head and per KV head):
 *   q_h = rope(rmsnorm(q_h) * q_norm) into q, from the projection [q_h | gate_h] of each head
 *   k_j = rope(rmsnorm(k_j) * k_norm), v_j: stored at row `pos` of the cache (F16 or F32)
 *   rope: NeoX on the first `rot` dimensions of a head (pairs i, i + rot / 2), the angle table
 *   of engine_cu_rope_table over rot; dimensions past rot are left as they are (text positions:
 *   the checkpoint's interleaved MRoPE is exactly this 1-D rope).
 * engine_cu_gatt: out_h = softmax(q_h K^T / sqrt(hd)) V * sigmoid(gate_h) over positions
 *   0..pos of KV head h / group. Blocks (KV head, split runner) take splits of
 *   ENGINE_CU_GATT_SPLIT positions in turn (flash-decoding): per split each query head's max,
 *   sum and weighted V go to `partial`; the last block of a KV head to finish (an atomic
 *   counter, reset by it) merges the splits and applies the output gate. The position comes
 *   from device memory, so one launch serves every step of a captured graph.
 * Limits (engine_cu_gatt_ok): hd a multiple of 32 and at most 256, rot even and <= hd, at
 * most 16 query heads per KV head. */
#ifndef SPARK_ENGINE_CUDA_QWEN35_ATTN_CUH
#define SPARK_ENGINE_CUDA_QWEN35_ATTN_CUH

#include <stdint.h>

#include "common.cuh"

#define ENGINE_CU_GATT_SPLIT 64    /* positions per split */
#define ENGINE_CU_GATT_RUNNERS 128 /* blocks per KV head at most */
#define ENGINE_CU_GATT_MAX_GROUP 16

typedef struct {
    const float *qg;              /* [n_head][2 hd]: q then gate of each head */
    const float *k, *v;           /* [n_kv * hd] this position's projections */
    const float *q_norm, *k_norm; /* [hd] */
    const float2 *rope;           /* [n_ctx][rot / 2] (cos, sin) */
    int rot;
    float eps;
    void *k_cache, *v_cache; /* [n_ctx][n_kv * hd] F16 (kv_f32 = 0) or F32 */
    int kv_f32;
    const int32_t *pos; /* device */
    int n_ctx, n_head, n_kv, hd;
    float *q;           /* [n_head * hd] scratch: the prepared queries */
    float *partial;     /* [n_head][engine_cu_gatt_splits(n_ctx)][hd + 2] */
    unsigned *counters; /* [n_kv], zero between launches */
    float *out;         /* [n_head * hd] */
} engine_cu_gatt;

bool engine_cu_gatt_ok(int n_head, int n_kv, int hd, int rot);
int engine_cu_gatt_splits(int n_ctx);
void engine_cu_gatt_prep(const engine_cu_gatt *a, cudaStream_t stream);
void engine_cu_gatt_run(const engine_cu_gatt *a, cudaStream_t stream);

#endif
