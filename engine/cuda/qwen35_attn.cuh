/* The gated full-attention block of qwen35moe on the GPU, one query position (decode).
 *
 * engine_cu_gatt_run, one launch: out_h = softmax(q_h K^T / sqrt(hd)) V * sigmoid(gate_h) over
 * positions 0..pos of KV head h / group, where
 *   q_h = rope(rmsnorm(q_h) * q_norm), from the projection [q_h | gate_h] of each head
 *   k_j = rope(rmsnorm(k_j) * k_norm) and v_j of this position are stored at row `pos` of the
 *     cache (F16 or F32) first, by the block whose split holds pos (no other block reads that
 *     row)
 *   rope: NeoX on the first `rot` dimensions of a head (pairs i, i + rot / 2), the angle table
 *     of engine_cu_rope_table over rot; dimensions past rot are left as they are (text
 *     positions: the checkpoint's interleaved MRoPE is exactly this 1-D rope).
 * Blocks (KV head, split runner) take splits of ENGINE_CU_GATT_SPLIT positions in turn
 * (flash-decoding): each block prepares its group's queries in shared memory (a warp per head);
 * per split a warp scores a position against every query head of the group, a warp per head
 * takes the softmax, and the threads (dimension, position group) sum V into the block's running
 * merge of its splits (registers, rescaled to the running max); each block's merged weighted V,
 * max and sum go to `partial` (one entry per block). A second launch merges them: a block per
 * (head, 64 dimensions) takes the blocks' weights exp(m_b - m) once by a warp (shared memory)
 * and the denominator, then its threads sum their dimension over the blocks (coalesced rows)
 * and apply the output gate. The kernel is instantiated per
 * (query heads per KV head, head size), so every per-head loop is unrolled into registers. The
 * position comes from device memory: one launch serves every step of a captured graph.
 * Limits (engine_cu_gatt_ok): head size 64, 128 or 256, 1, 2, 4, 8 or 16 query heads per KV
 * head, rot even and <= head size.
 * Short path (short_n > 0; the decode step's SPARK_CUDA_Q35_ATT_SHORT, on by default): the same
 * two launches, the first with at least G runners per KV head; while pos + 1 <= short_n
 * (device memory, so one graph serves both) block (KV head g, y < G) does query head g G + y
 * alone over all positions (at most 8 splits) and the merge launch returns at once; the group's
 * first head's block alone stores the K/V row, the others use their shared copy of it (rounded
 * as stored). Bit for bit the split path: each score, split softmax, per-dimension V chain and
 * the merge of the splits are that path's expressions in its order, computed by other threads
 * (qwen35_attn.cu). Past short_n: the split path above. */
#ifndef SPARK_ENGINE_CUDA_QWEN35_ATTN_CUH
#define SPARK_ENGINE_CUDA_QWEN35_ATTN_CUH

#include <stdint.h>

#include "common.cuh"

#define ENGINE_CU_GATT_SPLIT 32    /* positions per split */
#define ENGINE_CU_GATT_RUNNERS 128 /* blocks per KV head at most */
#define ENGINE_CU_GATT_MAX_GROUP 16
#define ENGINE_CU_GATT_SHORT_MAX 256 /* short_n at most (8 splits) */
/* Or'ed into short_n by the decode step: read the position and ask L2 for the block's K/V rows
 * before the PDL wait (only where no kernel of the chain writes the position or those rows: the
 * decode step; the MTP passes chain one position per launch, so they leave it out). */
#define ENGINE_CU_GATT_EARLY 0x10000

typedef struct {
    const float *qg;              /* [n_head][2 hd]: q then gate of each head */
    const float *k, *v;           /* [n_kv * hd] this position's projections */
    const float *q_norm, *k_norm; /* [hd] */
    const float2 *rope;           /* [n_ctx][rot / 2] (cos, sin) */
    int rot;
    float eps;
    void *k_cache, *v_cache; /* [n_ctx][n_kv * hd] F16 (kv_f32 = 0) or F32 */
    int kv_f32;
    int short_n;        /* 0: off; else (1..ENGINE_CU_GATT_SHORT_MAX) the short path below,
                         * | ENGINE_CU_GATT_EARLY */
    const int32_t *pos; /* device */
    int n_ctx, n_head, n_kv, hd;
    float *partial;     /* [n_head][engine_cu_gatt_splits(n_ctx)][hd + 2] (a block's at its
                         * index: the blocks are never more than the splits) */
    unsigned *counters; /* unused since the merge is a launch of its own (callers pass it) */
    float *out;         /* [n_head * hd] */
} engine_cu_gatt;

bool engine_cu_gatt_ok(int n_head, int n_kv, int hd, int rot);
int engine_cu_gatt_splits(int n_ctx);
void engine_cu_gatt_run(const engine_cu_gatt *a, cudaStream_t stream);

/* Prefill: per token t (position pos0 + t) and head, q = rope(rmsnorm(q) * q_norm) from the
 * projection [q_h | gate_h] into q ([n][n_head][hd]); k likewise with k_norm, stored with v at
 * cache row pos0 + t (F16 or F32). Head size 64, 128 or 256. */
typedef struct {
    const float *qg;              /* [n][n_head][2 hd] */
    const float *k, *v;           /* [n][n_kv * hd] */
    const float *q_norm, *k_norm; /* [hd] */
    const float2 *rope;           /* [n_ctx][rot / 2] */
    int rot;
    float eps;
    void *k_cache, *v_cache;
    int kv_f32;
    int n, pos0, n_head, n_kv, hd;
    float *q; /* [n][n_head * hd] */
} engine_cu_gatt_pf;
void engine_cu_gatt_pf_qk(const engine_cu_gatt_pf *a, cudaStream_t stream);
/* att[t][h] *= sigmoid(gate of head h of token t) ([n][n_head * hd]; qg as above). */
void engine_cu_gatt_pf_gate(float *att, const float *qg, int n, int n_head, int hd,
                            cudaStream_t stream);

#endif
