/* MoE / dense FFN kernels (contract in moe.cuh). Same warp scheme as matvec.cu: a warp owns
 * ENGINE_CU_MV_ROWS rows, lanes take consecutive 32-value chunks. */
#include <math.h>

#include "dequant.cuh"
#include "matvec.cuh"
#include "moe.cuh"

#define FFN_WARPS 4

/* Softmax + top-k of the router logits by one warp; results in ids[k], wts[k] (shared). Each
 * lane keeps its experts' probabilities in registers; a chosen one is struck out (-1). */
__device__ void route(const float *logits, int n, int k, int norm_topk, int *ids, float *wts) {
    const int lane = threadIdx.x & 31;
    float p[ENGINE_CU_MAX_EXPERT / 32];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < ENGINE_CU_MAX_EXPERT / 32; i++) {
        const int e = lane + 32 * i;
        p[i] = e < n ? logits[e] : -INFINITY;
        mx = fmaxf(mx, p[i]);
    }
    mx = engine_cu_warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < ENGINE_CU_MAX_EXPERT / 32; i++) {
        p[i] = lane + 32 * i < n ? expf(p[i] - mx) : -1.0f;
        sum += p[i] > 0.0f ? p[i] : 0.0f;
    }
    const float inv = 1.0f / engine_cu_warp_sum(sum);
#pragma unroll
    for (int i = 0; i < ENGINE_CU_MAX_EXPERT / 32; i++)
        if (p[i] >= 0.0f) p[i] *= inv;
    float tot = 0.0f;
    for (int j = 0; j < k; j++) {
        float best = -1.0f;
        int bid = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < ENGINE_CU_MAX_EXPERT / 32; i++)
            if (p[i] > best) { /* ascending e per lane: ties keep the lower id */
                best = p[i];
                bid = lane + 32 * i;
            }
        for (int o = 16; o > 0; o >>= 1) {
            float ob = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, bid, o);
            if (ob > best || (ob == best && oi < bid)) {
                best = ob;
                bid = oi;
            }
        }
#pragma unroll
        for (int i = 0; i < ENGINE_CU_MAX_EXPERT / 32; i++)
            if (lane + 32 * i == bid) p[i] = -1.0f;
        if (lane == 0) {
            ids[j] = bid;
            wts[j] = best;
        }
        tot += best;
    }
    __syncwarp();
    if (norm_topk && lane == 0)
        for (int j = 0; j < k; j++)
            wts[j] = wts[j] / tot;
    __syncwarp();
}

template <int T>
__device__ __forceinline__ void up_warp(const engine_cu_ffn_up_args &a, const uint8_t *g,
                                        const uint8_t *u, int r0, float scale, float *h) {
    const int lane = threadIdx.x & 31, R = ENGINE_CU_MV_ROWS;
    float ag[R], au[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        ag[r] = au[r] = 0.0f;
    const int nr = a.rows - r0 < R ? a.rows - r0 : R;
    scale = engine_cu_warp_rms_scale(a.x, a.cols, a.eps);
    for (int c = lane; c < (a.cols >> 5); c += 32) {
        int a0, b0;
        engine_cu_chunk_cols(T, c, &a0, &b0);
        float xa[16], xb[16];
        engine_cu_load_run(a.x, a.norm_w, 1.0f, a0, xa); /* nw * x; RMS scale applied last */
        engine_cu_load_run(a.x, a.norm_w, 1.0f, b0, xb);
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r < nr) {
                float va[16], vb[16];
                engine_cu_decode_chunk(T, g + (size_t)(r0 + r) * a.row_bytes, c, va, vb);
                ag[r] += engine_cu_dot32(va, vb, xa, xb);
                engine_cu_decode_chunk(T, u + (size_t)(r0 + r) * a.row_bytes, c, va, vb);
                au[r] += engine_cu_dot32(va, vb, xa, xb);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float gs = engine_cu_warp_sum(ag[r]) * scale, us = engine_cu_warp_sum(au[r]) * scale;
        if (lane == 0 && r < nr) h[r0 + r] = gs / (1.0f + expf(-gs)) * us;
    }
}

#define TYPE_CASES(X)                                                                              \
    X(ENGINE_TYPE_Q4_K)                                                                            \
    X(ENGINE_TYPE_Q5_K) X(ENGINE_TYPE_Q6_K) X(ENGINE_TYPE_Q8_0) X(ENGINE_TYPE_Q4_0)                \
        X(ENGINE_TYPE_F16) X(ENGINE_TYPE_BF16) X(ENGINE_TYPE_F32)

__global__ void __launch_bounds__(FFN_WARPS * 32, 4) ffn_up_kernel(engine_cu_ffn_up_args a) {
    __shared__ int ids[ENGINE_CU_MAX_EXPERT_USED];
    __shared__ float wts[ENGINE_CU_MAX_EXPERT_USED];
    const int j = blockIdx.y;
    if (a.router) {
        if (threadIdx.x < 32) route(a.router, a.n_expert, a.k, a.norm_topk, ids, wts);
        if (blockIdx.x == 0 && j == 0 && threadIdx.x < a.k) {
            a.ids[threadIdx.x] = ids[threadIdx.x];
            a.weights[threadIdx.x] = wts[threadIdx.x];
        }
    } else if (threadIdx.x == 0) {
        ids[0] = 0;
    }
    __syncthreads();
    const float scale = 1.0f; /* computed per warp in up_warp */
    const int e = ids[j];
    const uint8_t *g = a.gate + (size_t)e * a.expert_bytes, *u = a.up + (size_t)e * a.expert_bytes;
    const int r0 = (blockIdx.x * FFN_WARPS + (threadIdx.x >> 5)) * ENGINE_CU_MV_ROWS;
    if (r0 >= a.rows) return;
    float *h = a.h + (size_t)j * a.rows;
    switch (a.type) { /* gate and up share a type (checked at upload) */
#define SAME(T)                                                                                    \
    case T:                                                                                        \
        up_warp<T>(a, g, u, r0, scale, h);                                                         \
        break;
        TYPE_CASES(SAME)
#undef SAME
    }
}

/* A lane takes (expert slot, chunk) items, so all 32 lanes work and the loads of different
 * experts are in flight together. */
template <int T>
__device__ __forceinline__ void down_warp(const engine_cu_ffn_down_args &a, int r0, const int *ids,
                                          const float *wts) {
    const int lane = threadIdx.x & 31, R = ENGINE_CU_MV_ROWS;
    float tot[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        tot[r] = 0.0f;
    const int nr = a.rows - r0 < R ? a.rows - r0 : R;
    const int nch = a.cols >> 5, n_items = a.k * nch;
#pragma unroll 2
    for (int it = lane; it < n_items; it += 32) {
        const int j = it / nch, c = it - j * nch;
        const uint8_t *d = a.down + (size_t)ids[j] * a.expert_bytes;
        const float *h = a.h + (size_t)j * a.cols;
        int a0, b0;
        engine_cu_chunk_cols(T, c, &a0, &b0);
        float xa[16], xb[16];
        engine_cu_load_run(h, nullptr, 1.0f, a0, xa);
        engine_cu_load_run(h, nullptr, 1.0f, b0, xb);
        const float wj = wts[j];
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r < nr) {
                float va[16], vb[16];
                engine_cu_decode_chunk(T, d + (size_t)(r0 + r) * a.row_bytes, c, va, vb);
                tot[r] += wj * engine_cu_dot32(va, vb, xa, xb);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float s = engine_cu_warp_sum(tot[r]);
        if (lane == 0 && r < nr) a.y[r0 + r] += s;
    }
}

__global__ void __launch_bounds__(FFN_WARPS * 32) ffn_down_kernel(engine_cu_ffn_down_args a) {
    __shared__ int ids[ENGINE_CU_MAX_EXPERT_USED];
    __shared__ float wts[ENGINE_CU_MAX_EXPERT_USED];
    if (threadIdx.x < a.k) {
        ids[threadIdx.x] = a.ids ? a.ids[threadIdx.x] : 0;
        wts[threadIdx.x] = a.ids ? a.weights[threadIdx.x] : 1.0f;
    }
    __syncthreads();
    const int r0 = (blockIdx.x * FFN_WARPS + (threadIdx.x >> 5)) * ENGINE_CU_MV_ROWS;
    if (r0 >= a.rows) return;
    switch (a.type) {
#define DOWN(T)                                                                                    \
    case T:                                                                                        \
        down_warp<T>(a, r0, ids, wts);                                                             \
        break;
        TYPE_CASES(DOWN)
#undef DOWN
    }
}

void engine_cu_ffn_up(const engine_cu_ffn_up_args *a, cudaStream_t stream) {
    int per_block = FFN_WARPS * ENGINE_CU_MV_ROWS;
    dim3 grid((a->rows + per_block - 1) / per_block, a->router ? a->k : 1);
    ffn_up_kernel<<<grid, FFN_WARPS * 32, 0, stream>>>(*a);
}

void engine_cu_ffn_down(const engine_cu_ffn_down_args *a, cudaStream_t stream) {
    int per_block = FFN_WARPS * ENGINE_CU_MV_ROWS;
    ffn_down_kernel<<<(a->rows + per_block - 1) / per_block, FFN_WARPS * 32, 0, stream>>>(*a);
}
