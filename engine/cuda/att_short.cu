/* Decode attention, the sessions' launch (attention.cuh short_path): a flat grid of blocks
 * that map themselves from the device-side position: below ENGINE_CU_ATT_SPLIT positions (or
 * up to long_splits splits) a block per (query head, split) (att_short_dev.cuh), else
 * att_block's (KV head, split) blocks. A translation unit of its own, so that the per-KV-head
 * kernel (attention.cu) keeps its code, registers and shared variables unchanged. */
#include "att_short_dev.cuh"
#include "attention_dev.cuh"

/* HD 256 may take more than 128 registers (one block per multiprocessor; else it spills). */
template <int HD>
__global__ void __launch_bounds__(ATT_THREADS, HD > 128 ? 1 : 2) att_flat_kernel(engine_cu_att a) {
    extern __shared__ __align__(16) float att_smem[];
    engine_cu_pdl_launch();
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

/* Positions below ENGINE_CU_ATT_SPLIT alone (SPARK_CUDA_ATT_ONE: a step graph's attention
 * nodes take it there, backend.cu att_grid_set): att_flat_kernel's block per query head at one
 * split, without its other paths' code and with the cache type fixed; VU 0 att_short_vu's V
 * rows in flight, else VU. The same sums in the same order. */
template <int HD, bool F32, int VU>
__global__ void __launch_bounds__(ATT_THREADS, HD > 128 ? 1 : 2) att_one_kernel(engine_cu_att a) {
    extern __shared__ __align__(16) float att_smem[];
    engine_cu_pdl_launch();
    if ((int)blockIdx.x >= a.n_head) return; /* before any load */
    const int max_splits = (a.n_ctx + ENGINE_CU_ATT_SPLIT - 1) / ENGINE_CU_ATT_SPLIT;
    att_short_block<HD, F32, true, VU>(a, blockIdx.x, 0, *a.pos, max_splits, att_smem,
                                       engine_cu_pdl_sync{});
}

template <int HD> static const void *att_one_fn(bool f32, int v) {
    constexpr int VH = att_short_vu(HD) / 2;
    if (f32)
        return v == 2 ? (const void *)att_one_kernel<HD, true, VH>
                      : (const void *)att_one_kernel<HD, true, 0>;
    return v == 2 ? (const void *)att_one_kernel<HD, false, VH>
                  : (const void *)att_one_kernel<HD, false, 0>;
}

const void *engine_cu_att_one_kernel(int hd, bool f32, int v) {
    switch (hd) {
    case 64:
        return att_one_fn<64>(f32, v);
    case 128:
        return att_one_fn<128>(f32, v);
    default:
        return att_one_fn<256>(f32, v);
    }
}

size_t engine_cu_att_one_smem(int hd) {
    return att_short_smem_bytes(hd);
}

unsigned engine_cu_att_flat_blocks(int n_head, int n_kv, int long_splits, int n_ctx, int pos) {
    const int max_splits = engine_cu_att_max_splits(n_ctx);
    if (pos >= 0) { /* the kernel's own choice of path at pos */
        const int n_act = (pos + ENGINE_CU_ATT_SPLIT) / ENGINE_CU_ATT_SPLIT;
        return (unsigned)(n_act == 1 || n_act <= long_splits ? n_head * n_act : n_kv * n_act);
    }
    const int ls = long_splits < 1 ? 1 : long_splits < max_splits ? long_splits : max_splits;
    const int nb = n_head * ls; /* the per-head blocks of the longest per-head position */
    return (unsigned)(nb > n_kv * max_splits ? nb : n_kv * max_splits);
}

const void *engine_cu_att_flat_kernel(int hd) {
    switch (hd) {
    case 64:
        return (const void *)att_flat_kernel<64>;
    case 128:
        return (const void *)att_flat_kernel<128>;
    default:
        return (const void *)att_flat_kernel<256>;
    }
}

template <int HD> static void att_flat_launch(const engine_cu_att *a, cudaStream_t stream) {
    const dim3 grid(engine_cu_att_flat_blocks(a->n_head, a->n_kv, a->long_splits, a->n_ctx, -1));
    size_t smem = att_smem_bytes(a->n_head / a->n_kv, a->hd);
    if (att_short_smem_bytes(a->hd) > smem) smem = att_short_smem_bytes(a->hd);
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
