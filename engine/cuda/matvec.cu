/* Quantised matrix-vector products (contract in matvec.cuh). A warp computes
 * ENGINE_CU_MV_ROWS rows: its lanes take consecutive 32-value chunks of the rows (coalesced
 * reads of the weight bytes), each lane loads the matching activations once and dots them
 * with every row of the warp, and a shuffle reduction finishes each row. */
#include "dequant.cuh"
#include "matvec.cuh"

bool engine_cu_type_supported(int type) {
    switch (type) {
    case ENGINE_TYPE_F32:
    case ENGINE_TYPE_F16:
    case ENGINE_TYPE_BF16:
    case ENGINE_TYPE_Q4_0:
    case ENGINE_TYPE_Q8_0:
    case ENGINE_TYPE_Q4_K:
    case ENGINE_TYPE_Q5_K:
    case ENGINE_TYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

template <int T>
__device__ __forceinline__ void mv_warp(const engine_cu_mat &m, int r0, int cols, const float *x,
                                        const float *nw, float eps) {
    float scale = 1.0f;
    const int lane = threadIdx.x & 31;
    const int R = ENGINE_CU_MV_ROWS;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = 0.0f;
    const int nr = m.rows - r0 < R ? m.rows - r0 : R;
    const int n_chunks = cols >> 5;
#pragma unroll 2
    for (int c = lane; c < n_chunks; c += 32) {
        int a0, b0;
        engine_cu_chunk_cols(T, c, &a0, &b0);
        float xa[16], xb[16];
        engine_cu_load_run(x, nw, 1.0f, a0, xa); /* nw * x; the RMS scale is applied last */
        engine_cu_load_run(x, nw, 1.0f, b0, xb);
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r < nr) {
                float va[16], vb[16];
                engine_cu_decode_chunk(T, m.w + (size_t)(r0 + r) * m.row_bytes, c, va, vb);
                acc[r] += engine_cu_dot32(va, vb, xa, xb);
            }
        }
    }
    if (nw) scale = engine_cu_warp_rms_scale(x, cols, eps);
#pragma unroll
    for (int r = 0; r < R; r++) {
        float s = engine_cu_warp_sum(acc[r]) * scale;
        if (lane == 0 && r < nr) {
            float *y = m.y + r0 + r;
            *y = m.accumulate ? *y + s : s;
        }
    }
}

__global__ void __launch_bounds__(ENGINE_CU_MV_WARPS * 32) mv_kernel(engine_cu_mv a) {
    const int R = ENGINE_CU_MV_ROWS;
    int g = (blockIdx.x * ENGINE_CU_MV_WARPS + (threadIdx.x >> 5)) * R;
    /* each matrix owns a range of the row space padded to a multiple of R */
    int i = 0;
    for (; i < a.n_mat; i++) {
        int span = (a.m[i].rows + R - 1) / R * R;
        if (g < span) break;
        g -= span;
    }
    if (i >= a.n_mat) return;
    const engine_cu_mat &m = a.m[i];
    switch (m.type) {
    case ENGINE_TYPE_Q4_K:
        mv_warp<ENGINE_TYPE_Q4_K>(m, g, a.cols, a.x, a.norm_w, a.eps);
        break;
    case ENGINE_TYPE_Q5_K:
        mv_warp<ENGINE_TYPE_Q5_K>(m, g, a.cols, a.x, a.norm_w, a.eps);
        break;
    case ENGINE_TYPE_Q6_K:
        mv_warp<ENGINE_TYPE_Q6_K>(m, g, a.cols, a.x, a.norm_w, a.eps);
        break;
    case ENGINE_TYPE_Q8_0:
        mv_warp<ENGINE_TYPE_Q8_0>(m, g, a.cols, a.x, a.norm_w, a.eps);
        break;
    case ENGINE_TYPE_Q4_0:
        mv_warp<ENGINE_TYPE_Q4_0>(m, g, a.cols, a.x, a.norm_w, a.eps);
        break;
    case ENGINE_TYPE_F16:
        mv_warp<ENGINE_TYPE_F16>(m, g, a.cols, a.x, a.norm_w, a.eps);
        break;
    case ENGINE_TYPE_BF16:
        mv_warp<ENGINE_TYPE_BF16>(m, g, a.cols, a.x, a.norm_w, a.eps);
        break;
    default:
        mv_warp<ENGINE_TYPE_F32>(m, g, a.cols, a.x, a.norm_w, a.eps);
        break;
    }
}

void engine_cu_matvec(const engine_cu_mv *a, cudaStream_t stream) {
    const int R = ENGINE_CU_MV_ROWS;
    int warps = 0;
    for (int i = 0; i < a->n_mat; i++)
        warps += (a->m[i].rows + R - 1) / R;
    int blocks = (warps + ENGINE_CU_MV_WARPS - 1) / ENGINE_CU_MV_WARPS;
    mv_kernel<<<blocks, ENGINE_CU_MV_WARPS * 32, 0, stream>>>(*a);
}
