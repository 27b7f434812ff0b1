/* Decode attention with fused q/k norm, RoPE and KV store: launchers (contract in
 * attention.cuh; the block's work in attention_dev.cuh). */
#include <string.h>

#include "attention_dev.cuh"
#include "step.cuh"

bool engine_cu_att_head_dim_ok(int hd) {
    return hd == 64 || hd == 128 || hd == 256;
}

bool engine_cu_att_group_ok(int n_head, int n_kv) {
    return n_kv >= 1 && n_head % n_kv == 0 && n_head / n_kv <= ENGINE_CU_ATT_MAX_GROUP;
}

int engine_cu_att_max_splits(int n_ctx) {
    return (n_ctx + ENGINE_CU_ATT_SPLIT - 1) / ENGINE_CU_ATT_SPLIT;
}

void engine_cu_rope_table(float *cs, const float *inv_freq, int hd, int n_pos) {
    /* the CPU's arithmetic exactly: the angle rounded to F32, cos and sin in double */
    for (int p = 0; p < n_pos; p++)
        for (int i = 0; i < hd / 2; i++) {
            float ang = (float)p * inv_freq[i];
            cs[((size_t)p * (hd / 2) + i) * 2] = (float)cos((double)ang);
            cs[((size_t)p * (hd / 2) + i) * 2 + 1] = (float)sin((double)ang);
        }
}

template <int HD> __global__ void __launch_bounds__(ATT_THREADS) att_kernel(engine_cu_att a) {
    extern __shared__ float att_smem[];
    engine_cu_pdl_launch();
    att_block<HD>(a, blockIdx.x, blockIdx.y, gridDim.y, att_smem, engine_cu_pdl_sync());
}

void engine_cu_attention(const engine_cu_att *a, cudaStream_t stream) {
    if (a->short_path) { /* att_short.cu (a translation unit of its own: this one's code stays) */
        engine_cu_attention_flat(a, stream);
        return;
    }
    dim3 grid(a->n_kv, engine_cu_att_max_splits(a->n_ctx));
    const size_t smem = att_smem_bytes(a->n_head / a->n_kv, a->hd);
    switch (a->hd) {
    case 64:
        engine_cu_launch(att_kernel<64>, grid, dim3(ATT_THREADS), smem, stream, *a);
        break;
    case 128:
        engine_cu_launch(att_kernel<128>, grid, dim3(ATT_THREADS), smem, stream, *a);
        break;
    default:
        engine_cu_launch(att_kernel<256>, grid, dim3(ATT_THREADS), smem, stream, *a);
        break;
    }
}

engine_cu_phase engine_cu_attention_phase(const engine_cu_att *a) {
    engine_cu_phase ph;
    memset(&ph, 0, sizeof ph);
    ph.kind = ENGINE_CU_PH_ATT;
    ph.gx = a->n_kv;
    ph.gy = engine_cu_att_max_splits(a->n_ctx);
    ph.n_blocks = ph.gx * ph.gy;
    ph.smem = att_smem_bytes(a->n_head / a->n_kv, a->hd);
    ph.u.at = *a;
    return ph;
}

ENGINE_CU_TRACE_TU(attention)
