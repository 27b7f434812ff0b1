/* Attention over a paged KV pool for the batched pass (engine_cu_pg_attention, contract in
 * prefill.cuh), and the row gather the batched pass's output head uses. */
#include <cuda_fp16.h>
#include <math.h>

#include "prefill.cuh"

#define PG_WARPS 4

template <int HD>
__device__ __forceinline__ float pg_dot(const float *sq, const void *cache, int kv_f32,
                                        size_t off) {
    float acc = 0.0f;
    if (kv_f32) {
        const float4 *r = (const float4 *)((const float *)cache + off);
#pragma unroll 8
        for (int d = 0; d < HD / 4; d++) {
            const float4 k = r[d];
            acc = fmaf(sq[4 * d], k.x, acc);
            acc = fmaf(sq[4 * d + 1], k.y, acc);
            acc = fmaf(sq[4 * d + 2], k.z, acc);
            acc = fmaf(sq[4 * d + 3], k.w, acc);
        }
    } else {
        const __half2 *r = (const __half2 *)((const __half *)cache + off);
#pragma unroll 8
        for (int d = 0; d < HD / 2; d++) {
            const float2 k = __half22float2(r[d]);
            acc = fmaf(sq[2 * d], k.x, acc);
            acc = fmaf(sq[2 * d + 1], k.y, acc);
        }
    }
    return acc;
}

template <int HD>
__global__ void __launch_bounds__(32 * PG_WARPS) pg_att_kernel(engine_cu_pg_att_args a) {
    constexpr int NV = HD / 32;
    __shared__ __align__(16) float sq[HD];
    __shared__ float sm[PG_WARPS], sl[PG_WARPS];
    __shared__ float so[PG_WARPS][HD];
    const int t = (int)blockIdx.x, h = (int)blockIdx.y;
    const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31);
    const int kvh = h / (a.n_head / a.n_kv), kv_dim = a.n_kv * HD;
    const int pos = a.pos_of[t], bs = a.block_size;
    const int32_t *table = a.tables + (size_t)a.seq_of[t] * a.max_blocks;
    const float scale = 1.0f / sqrtf((float)HD);
    for (int i = (int)threadIdx.x; i < HD; i += 32 * PG_WARPS)
        sq[i] = a.q[((size_t)t * a.n_head + h) * HD + i];
    __syncthreads();
    float m = -INFINITY, l = 0.0f, o[NV];
#pragma unroll
    for (int u = 0; u < NV; u++)
        o[u] = 0.0f;
    for (int k0 = warp * 32; k0 <= pos; k0 += 32 * PG_WARPS) {
        const int p = k0 + lane;
        int row = 0;
        float s = -INFINITY;
        if (p <= pos) {
            row = table[p / bs] * bs + p % bs;
            s = pg_dot<HD>(sq, a.k_cache, a.kv_f32, (size_t)row * kv_dim + (size_t)kvh * HD) *
                scale;
        }
        /* key k0 <= pos is valid, so the group's maximum is finite */
        const float mn = fmaxf(m, engine_cu_warp_max(s)), corr = expf(m - mn);
        const float pw = p <= pos ? expf(s - mn) : 0.0f;
        l = l * corr + engine_cu_warp_sum(pw);
        m = mn;
#pragma unroll
        for (int u = 0; u < NV; u++)
            o[u] *= corr;
        const int nk = min(32, pos - k0 + 1);
        for (int j = 0; j < nk; j++) {
            const float pj = __shfl_sync(0xffffffffu, pw, j);
            const int rj = __shfl_sync(0xffffffffu, row, j);
            const size_t off = (size_t)rj * kv_dim + (size_t)kvh * HD + lane;
#pragma unroll
            for (int u = 0; u < NV; u++) {
                const float v = a.kv_f32
                                    ? ((const float *)a.v_cache)[off + 32 * u]
                                    : __half2float(((const __half *)a.v_cache)[off + 32 * u]);
                o[u] = fmaf(pj, v, o[u]);
            }
        }
    }
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int u = 0; u < NV; u++)
        so[warp][lane + 32 * u] = o[u];
    __syncthreads();
    if (warp != 0) return;
    float mx = -INFINITY, lt = 0.0f, acc[NV];
#pragma unroll
    for (int u = 0; u < NV; u++)
        acc[u] = 0.0f;
    for (int w = 0; w < PG_WARPS; w++)
        mx = fmaxf(mx, sm[w]);
    for (int w = 0; w < PG_WARPS; w++) {
        if (sm[w] == -INFINITY) continue; /* a warp that had no keys */
        const float c = expf(sm[w] - mx);
        lt += sl[w] * c;
#pragma unroll
        for (int u = 0; u < NV; u++)
            acc[u] = fmaf(so[w][lane + 32 * u], c, acc[u]);
    }
    const float il = 1.0f / lt;
    float *dst = a.out + ((size_t)t * a.n_head + h) * HD;
#pragma unroll
    for (int u = 0; u < NV; u++)
        dst[lane + 32 * u] = acc[u] * il;
}

void engine_cu_pg_attention(const engine_cu_pg_att_args *a, cudaStream_t stream) {
    if (a->n <= 0) return;
    const dim3 grid((unsigned)a->n, (unsigned)a->n_head), block(32 * PG_WARPS);
    if (a->hd == 64)
        pg_att_kernel<64><<<grid, block, 0, stream>>>(*a);
    else if (a->hd == 128)
        pg_att_kernel<128><<<grid, block, 0, stream>>>(*a);
    else
        pg_att_kernel<256><<<grid, block, 0, stream>>>(*a);
}

__global__ void pf_gather_kernel(const float *src, const int32_t *rows, int cols, float *dst) {
    const float *s = src + (size_t)rows[blockIdx.x] * cols;
    float *d = dst + (size_t)blockIdx.x * cols;
    for (int c = (int)threadIdx.x; c < cols; c += (int)blockDim.x)
        d[c] = s[c];
}

void engine_cu_pf_gather_rows(const float *src, const int32_t *rows, int n, int cols, float *dst,
                              cudaStream_t stream) {
    if (n > 0) pf_gather_kernel<<<n, 256, 0, stream>>>(src, rows, cols, dst);
}

ENGINE_CU_TRACE_TU(paged_att)
