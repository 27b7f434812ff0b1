/* The attention and the wo + router launch of a qwen3moe decode layer as ONE launch at short
 * context (SPARK_CUDA_ATT_WO; sessions below ENGINE_CU_ATT_SPLIT positions replay a graph of
 * their own with it, backend.cu).
 *
 * Why: at short context the attention launch costs ~5.6 us a layer on the step's critical path
 * for ~0 bytes, and the wo + router launch (router_fuse.cuh) ~5.9 us for ~2 us of bytes; between
 * them the attention output goes through L2 and every wo block stages all of it again.
 *
 * Shape: the wo product is split by columns as well as rows. A thread block cluster of C blocks
 * covers all query heads, block q of it the NH = n_head / C consecutive heads q NH .. (one KV
 * head's), and cluster g the rows [g RG, (g + 1) RG) of Wo. So each block
 *   1. before its wait: bulk-copies its Wo slice (RG rows x NH hd columns, from a copy of Wo
 *      repacked once per model so that the slice is one contiguous run, engine_cu_aw_repack),
 *      its cluster's rows of M = R Wo restricted to its columns, and the R rows of the experts
 *      it sums (router_fuse.cuh: raw = R x + M â);
 *   2. computes the attention of its NH heads over the cache (as att_short_dev.cuh does for one
 *      head, each K and V row loaded once for the NH heads; the new K / V row stored by one
 *      block per KV head), and R x for its experts beside it;
 *   3. stages its NH hd outputs as the wo blocks stage â (the same 8-bit blocks: a slice
 *      starts on a block boundary), and computes its RG partial sums of Wo â and its cluster's
 *      partial M â from shared memory;
 *   4. after a cluster barrier, block q sums rows q RG / C .. of its cluster over the C blocks'
 *      partials (distributed shared memory, rank order) into ao, and its experts' raw logits.
 * The attention runs once per cluster (n_grp times per head): the K / V rows it reads are few
 * at short context. ao and raw are what the wo + router launch writes, up to F32 summation
 * order (each row a sum of C partial sums instead of one); the MoE launch after it is
 * unchanged. The K / V cache rows are the attention launch's bit for bit.
 *
 * Applies (engine_cu_aw_plan) to quantised Wo types whose activation blocks (256 values for the
 * K-quants, 32 for Q8_0 / Q4_0) fit a block's columns, head dims 64 and 128, C <= 8, and F16 /
 * F32 caches. Host launchers only; no CUDA type leaves engine/cuda/. */
#ifndef SPARK_ENGINE_CUDA_ATT_WO_CUH
#define SPARK_ENGINE_CUDA_ATT_WO_CUH

#include <stddef.h>
#include <stdint.h>

#include "attention.cuh"
#include "common.cuh"

#define ENGINE_CU_AW_THREADS 256
#define ENGINE_CU_AW_WARPS (ENGINE_CU_AW_THREADS / 32)

/* The split of one model's layers (the same for every layer). */
typedef struct {
    int nh;    /* query heads a block */
    int c;     /* blocks a cluster: n_head / nh */
    int n_grp; /* clusters: n_embd / rg */
    int rg;    /* Wo rows a cluster (a multiple of c) */
    int epc;   /* experts a cluster: ceil(n_expert / n_grp) */
    size_t sb; /* bytes of a row's slice of nh * hd columns */
} engine_cu_aw_plan;

typedef struct {
    engine_cu_att at;    /* the attention's inputs; at.out unused */
    const uint8_t *wo_r; /* Wo repacked: [n_grp][c][rg][sb] bytes */
    int wo_type;
    engine_cu_aw_plan p;
    const float *rm; /* [n_expert][n_embd + n_att] F32: R | M (router_fuse.cuh) */
    const float *x;  /* the residual [n_embd] */
    int n_embd, n_expert;
    float *ao;  /* [n_embd]: Wo â */
    float *raw; /* [n_expert]: R x + M â */
    /* Diagnosis only (wrong results, SPARK_CUDA_ATT_WO=2): no clusters; each block stores its
     * own partial sums where its rank's share of the sums would go */
    int diag_nocl;
} engine_cu_aw_args;

/* The split for a model of this shape on this device, or NULL with *p set; else the reason it
 * does not apply (a static string). */
const char *engine_cu_aw_plan_for(engine_cu_aw_plan *p, int wo_type, size_t wo_row_bytes,
                                  int n_embd, int n_head, int n_kv, int hd, int n_expert);

/* Bytes of Wo's repacked copy for one layer (n_embd rows of wo_row_bytes). */
size_t engine_cu_aw_repack_bytes(const engine_cu_aw_plan *p);

/* Enqueue the repack of one layer's Wo (device, n_embd rows of row_bytes) into dst. */
int engine_cu_aw_repack(const engine_cu_aw_plan *p, const uint8_t *wo, size_t row_bytes,
                        uint8_t *dst, cudaStream_t stream);

/* Enqueue the launch (programmatic dependent launch, clusters of p.c blocks). The caller keeps
 * positions below ENGINE_CU_ATT_SPLIT (one split). */
void engine_cu_att_wo(const engine_cu_aw_args *a, cudaStream_t stream);

/* Clusters of the launch resident at once on this device (cudaOccupancyMaxActiveClusters), or
 * -1 when the query fails. */
int engine_cu_aw_max_clusters(const engine_cu_aw_plan *p, int hd, int wo_type, int kv_f32,
                              int n_embd);

#endif
