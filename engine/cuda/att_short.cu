/* Decode attention, the sessions' launch (attention.cuh short_path): a flat grid of blocks
 * that map themselves from the device-side position: below ENGINE_CU_ATT_SPLIT positions (or
 * up to long_splits splits) a block per (query head, split) (att_short_dev.cuh), else
 * att_block's (KV head, split) blocks. A translation unit of its own, so that the per-KV-head
 * kernel (attention.cu) keeps its code, registers and shared variables unchanged. */
#include "att_short_dev.cuh"
#include "attention_dev.cuh"

/* engine_cu_guess (attention.cuh) by block gb of its n_blocks, ATT_THREADS threads: rows
 * [gb rpb, gb rpb + rpb) (rpb <= ATT_GUESS_ROWS) loaded before the wait, n_embd <= 8
 * ATT_THREADS. */
#define ATT_GUESS_ROWS 4
#define ATT_GUESS_TOP 64
#define ATT_GUESS_SMEM (sizeof(float) * (ATT_GUESS_ROWS * ATT_WARPS + ATT_THREADS + ATT_GUESS_TOP))
__device__ __forceinline__ void att_guess_block(const engine_cu_guess &g, int gb, float *sm) {
    float(*red)[ATT_WARPS] = (float(*)[ATT_WARPS])sm; /* the launch's dynamic shared memory */
    float *lg = sm + ATT_GUESS_ROWS * ATT_WARPS;
    int *sel = (int *)(lg + ATT_THREADS);
    const int t = threadIdx.x, lane = t & 31, w = t >> 5, n4 = g.n_embd >> 2;
    const int rpb = g.n_expert / g.n_blocks, r0 = gb * rpb;
    float4 wr[ATT_GUESS_ROWS][2];
#pragma unroll
    for (int r = 0; r < ATT_GUESS_ROWS; r++)
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int c = t + u * ATT_THREADS;
            wr[r][u] = r < rpb && c < n4
                           ? __ldg((const float4 *)(g.rows + (size_t)(r0 + r) * g.row_stride) + c)
                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    engine_cu_pdl_wait(); /* x: the residual entering the layer, complete */
    float4 xv[2];
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const int c = t + u * ATT_THREADS;
        xv[u] = c < n4 ? __ldcg((const float4 *)g.x + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int r = 0; r < ATT_GUESS_ROWS; r++) {
        float d = 0.0f;
#pragma unroll
        for (int u = 0; u < 2; u++)
            d += wr[r][u].x * xv[u].x + wr[r][u].y * xv[u].y + wr[r][u].z * xv[u].z +
                 wr[r][u].w * xv[u].w;
        d = engine_cu_warp_sum(d);
        if (lane == 0) red[r][w] = d;
    }
    __syncthreads();
    if (t < rpb) {
        float d = 0.0f;
        for (int i = 0; i < ATT_WARPS; i++)
            d += red[t][i];
        g.logits[r0 + t] = d;
        __threadfence();
    }
    __syncthreads();
    if (t == 0) atomicAdd(g.counters, 1u);
    engine_cu_spin_bounded(g.counters, (unsigned)g.n_blocks, 10000000000ull); /* 10 s: a trap */
    if (t < g.n_expert) lg[t] = __ldcg(g.logits + t);
    __syncthreads();
    if (t < g.n_expert) { /* the rank of expert t (ties to the lower id) */
        const float v = lg[t];
        int rank = 0;
        for (int u = 0; u < g.n_expert; u++)
            rank += lg[u] > v || (lg[u] == v && u < t);
        if (rank < g.top) sel[rank] = t;
    }
    __syncthreads();
    if (t == 0 && atomicAdd(g.counters + 1, 1u) == (unsigned)g.n_blocks - 1) {
        g.counters[0] = 0; /* every block has passed the wait: zero for the next launch */
        g.counters[1] = 0;
    }
    /* units: (guess i, matrix m of gate, up, down, chunk c), every n_blocks-th from gb */
    const int per = g.down_bytes ? 2 * g.chunks + 1 : 2 * g.chunks;
    const int units = g.how == 1 ? 0 : g.top * per;
    for (int u = gb + t * g.n_blocks; u < units; u += ATT_THREADS * g.n_blocks) {
        const int i = u / per, c = u - i * per;
        const size_t e = (size_t)sel[i];
        const uint8_t *p = c == 2 * g.chunks
                               ? g.down + e * g.down_bytes
                               : (c < g.chunks ? g.gate : g.up) + e * g.expert_bytes +
                                     (size_t)(c < g.chunks ? c : c - g.chunks) * g.chunk_step;
        const size_t n = c == 2 * g.chunks ? g.down_bytes : g.chunk_bytes;
        if (g.how == 2)
            engine_cu_prefetch_rows(p, n);
        else
            engine_cu_prefetch_bulk(p, n);
    }
}

/* HD 256 may take more than 128 registers (one block per multiprocessor; else it spills). */
template <int HD>
__global__ void __launch_bounds__(ATT_THREADS, HD > 128 ? 1 : 2) att_flat_kernel(engine_cu_att a) {
    extern __shared__ __align__(16) float att_smem[];
    engine_cu_pdl_launch();
    if ((int)blockIdx.x >= (int)gridDim.x - a.guess.n_blocks) { /* the guess's blocks, last */
        att_guess_block(a.guess, (int)blockIdx.x - ((int)gridDim.x - a.guess.n_blocks), att_smem);
        return;
    }
    /* the position is set before the step's graph runs (no kernel of the step writes it) */
    const int pos = *a.pos;
    const int n_act = (pos + ENGINE_CU_ATT_SPLIT) / ENGINE_CU_ATT_SPLIT;
    const int max_splits = (a.n_ctx + ENGINE_CU_ATT_SPLIT - 1) / ENGINE_CU_ATT_SPLIT;
    if (n_act == 1 || n_act <= a.long_splits) { /* a block per (query head, split) */
        /* blocks past them end before any wait (a block that ends counts as having triggered
         * its dependents; all have, at engine_cu_pdl_launch above) */
        if ((int)blockIdx.x >= a.n_head * n_act) return;
        const int s = blockIdx.x / a.n_head, h = blockIdx.x - s * a.n_head;
        if (a.kv_f32)
            att_short_block<HD, true>(a, h, s, pos, max_splits, att_smem, engine_cu_pdl_sync{});
        else
            att_short_block<HD, false>(a, h, s, pos, max_splits, att_smem, engine_cu_pdl_sync{});
        return;
    }
    const int s = blockIdx.x / a.n_kv;
    if (s >= max_splits) return;
    att_block<HD, 8>(a, blockIdx.x - s * a.n_kv, s, max_splits, att_smem, engine_cu_pdl_sync());
}

template <int HD> static void att_flat_launch(const engine_cu_att *a, cudaStream_t stream) {
    const int max_splits = engine_cu_att_max_splits(a->n_ctx);
    const int ls = a->long_splits < 1            ? 1
                   : a->long_splits < max_splits ? a->long_splits
                                                 : max_splits;
    const int nb = a->n_head * ls; /* the per-head blocks of the longest per-head position */
    const dim3 grid((unsigned)((nb > a->n_kv * max_splits ? nb : a->n_kv * max_splits) +
                               a->guess.n_blocks));
    size_t smem = att_smem_bytes(a->n_head / a->n_kv, a->hd);
    if (att_short_smem_bytes(a->hd) > smem) smem = att_short_smem_bytes(a->hd);
    if (a->guess.n_blocks && ATT_GUESS_SMEM > smem) smem = ATT_GUESS_SMEM;
    engine_cu_launch(att_flat_kernel<HD>, grid, dim3(ATT_THREADS), smem, stream, *a);
}

void engine_cu_attention_flat(const engine_cu_att *a, cudaStream_t stream) {
    switch (a->hd) {
    case 64: att_flat_launch<64>(a, stream); break;
    case 128: att_flat_launch<128>(a, stream); break;
    default: att_flat_launch<256>(a, stream); break;
    }
}

ENGINE_CU_TRACE_TU(att_short)
