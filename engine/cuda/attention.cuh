/* Decode attention on the GPU: one query position against the KV cache of one layer.
 *
 * One launch does, for every query head h:
 *   q_h = rope(rmsnorm(q_h) * q_norm)         (NeoX, angle pos * inv_freq[i] rounded to F32)
 *   k, v of the new position = rope(rmsnorm(k) * k_norm), v (rounded to the cache type) and
 *     stored at row `pos` of the cache
 *   out_h = softmax(q_h K^T / sqrt(d)) V over positions 0..pos of KV head h / group
 * A block serves one KV head and all the query heads of its GQA group (each K and V row is read
 * once for the group), over a split of ENGINE_CU_ATT_SPLIT positions (flash-decoding): it
 * computes each head's partial (max, sum, weighted V), and the last block of a KV head to
 * finish (an atomic counter) merges the splits. The position is read from device memory, so
 * the grid is sized for the whole context and blocks past the position exit at once: the same
 * launch serves every step of a captured graph. The cache is contiguous per layer
 * ([n_ctx][n_head_kv * head_dim], F16 or F32); the paged KV pool will pass a block table.
 * With short_path set (sessions: by default; SPARK_CUDA_ATT_SHORT=0 clears it), the launch is
 * a flat grid of blocks that map themselves from the device-side position: while it is below
 * ENGINE_CU_ATT_SPLIT (or needs at most long_splits splits), block b < n_head * n_act serves
 * query head b % n_head over split b / n_head alone (att_short_dev.cuh; the last block of a head
 * merges its splits; the other blocks exit before any wait), else block b is (KV head b % n_kv,
 * split b / n_kv) as above. Both give the same outputs and cache rows (bit for bit, by
 * construction; the tests check it). The fused step (step.cuh) ignores short_path. */
#ifndef SPARK_ENGINE_CUDA_ATTENTION_CUH
#define SPARK_ENGINE_CUDA_ATTENTION_CUH

#include <stdint.h>

#include "common.cuh"

#define ENGINE_CU_ATT_SPLIT 256    /* positions per block (= its threads) */
#define ENGINE_CU_ATT_MAX_GROUP 16 /* query heads per KV head */

typedef struct {
    const float *q, *k, *v;       /* this position's projections [n_head*hd], [n_kv*hd] x 2 */
    const float *q_norm, *k_norm; /* [hd] */
    const float2 *rope;           /* [n_ctx][hd / 2] (cos, sin): engine_cu_rope_table */
    float eps;
    /* With short_path: while the position needs at most long_splits splits (of
     * ENGINE_CU_ATT_SPLIT), a block per (query head, split) too, the last of a head merging
     * them (att_short_dev.cuh); past that att_block's blocks. 0: from 256 on att_block's. In the
     * padding before k_cache (the default kernel's parameter layout stays). */
    int long_splits;
    void *k_cache, *v_cache; /* [n_ctx][n_kv * hd] of F16 (kv_f32 = 0) or F32 */
    int kv_f32;
    /* 1: a block per query head at short context (see above). In the padding before pos, so
     * that the per-KV-head kernel's parameter layout stays as it was. */
    int short_path;
    const int32_t *pos; /* device: the position of this token */
    int n_ctx, n_head, n_kv, hd;
    float *partial;     /* [n_head][max_splits][hd + 2] scratch */
    unsigned *counters; /* [n_kv], zero between launches */
    float *out;         /* [n_head * hd] */
} engine_cu_att;

/* Head dimensions the kernel is instantiated for (64, 128, 256). */
bool engine_cu_att_head_dim_ok(int hd);
/* True when n_head / n_kv query heads per KV head fit the kernel. */
bool engine_cu_att_group_ok(int n_head, int n_kv);
int engine_cu_att_max_splits(int n_ctx);
/* Host: cs[p][i] = (cos, sin) of the angle (float)p * inv_freq[i], computed as the CPU does
 * (engine_cpu_rope_neox), for p < n_pos: 2 * n_pos * hd / 2 floats. */
void engine_cu_rope_table(float *cs, const float *inv_freq, int hd, int n_pos);
void engine_cu_attention(const engine_cu_att *a, cudaStream_t stream);
/* The short_path launch (att_short.cu); engine_cu_attention calls it when short_path is set. */
void engine_cu_attention_flat(const engine_cu_att *a, cudaStream_t stream);
/* The flat launch's blocks: its whole grid (pos < 0: what engine_cu_attention_flat launches),
 * or the blocks that do any work at position pos (the others exit at once), for a captured
 * launch's grid to be set to (SPARK_CUDA_ATT_GRID); and its kernel for head dimension hd, to
 * find such launches in a graph. */
unsigned engine_cu_att_flat_blocks(int n_head, int n_kv, int long_splits, int n_ctx, int pos);
const void *engine_cu_att_flat_kernel(int hd);
/* The kernel that serves positions below ENGINE_CU_ATT_SPLIT alone (att_short.cu; v 1 its V
 * rows as att_short_vu says, 2 half as many), with the flat launch's parameters, a block per
 * query head (more blocks leave at once) and engine_cu_att_one_smem bytes of dynamic shared
 * memory: a captured flat launch's node may be set to it there (SPARK_CUDA_ATT_ONE). */
const void *engine_cu_att_one_kernel(int hd, bool f32, int v);
size_t engine_cu_att_one_smem(int hd);

#endif
