/* Decode attention with fused q/k norm, RoPE and KV store (contract in attention.cuh).
 *
 * Inside a block (4 warps) each warp takes batches of 32 positions: lane j scores position
 * p0 + j against q (whole K row per lane, 16-byte loads), the warp updates its running max and
 * sum (online softmax), then accumulates the 32 V rows with the lanes spread over the head's
 * dimensions (coalesced). The warps' partials merge in shared memory, the splits' partials
 * through global scratch in the last block of the head. */
#include <cuda_fp16.h>
#include <math.h>

#include "attention.cuh"
#include "dequant.cuh"

#define ATT_WARPS 4

bool engine_cu_att_head_dim_ok(int hd) {
    return hd == 64 || hd == 128 || hd == 256;
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

/* dst = rope(rmsnorm(src) * w) for one head of HD values (block-wide; synchronises). */
template <int HD>
__device__ void norm_rope(const float *src, const float *w, const float2 *rope, float eps,
                          float *dst, float *red) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < HD; i += blockDim.x)
        ss += src[i] * src[i];
    ss = engine_cu_block_sum(ss, red);
    float scale = 1.0f / sqrtf(ss / (float)HD + eps);
    for (int i = threadIdx.x; i < HD; i += blockDim.x)
        dst[i] = w[i] * (src[i] * scale);
    __syncthreads();
    for (int i = threadIdx.x; i < HD / 2; i += blockDim.x) {
        const float2 cs = rope[i];
        const float c = cs.x, s = cs.y;
        float x0 = dst[i], x1 = dst[i + HD / 2];
        dst[i] = x0 * c - x1 * s;
        dst[i + HD / 2] = x0 * s + x1 * c;
    }
    __syncthreads();
}

__device__ __forceinline__ float round_kv(float v, int f32) {
    return f32 ? v : __half2float(__float2half_rn(v));
}

/* K or V row p of KV head kvh: 8 values from index i8 * 8. */
__device__ __forceinline__ void kv_load8(const void *cache, int f32, size_t row, int i8,
                                         float out[8]) {
    if (f32) {
        const float4 *p = (const float4 *)((const float *)cache + row) + 2 * i8;
        float4 a = p[0], b = p[1];
        out[0] = a.x;
        out[1] = a.y;
        out[2] = a.z;
        out[3] = a.w;
        out[4] = b.x;
        out[5] = b.y;
        out[6] = b.z;
        out[7] = b.w;
    } else {
        uint4 u = ((const uint4 *)((const __half *)cache + row))[i8];
        uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            out[2 * k] = engine_cu_h2f((uint16_t)(w[k] & 0xffffu));
            out[2 * k + 1] = engine_cu_h2f((uint16_t)(w[k] >> 16));
        }
    }
}

__device__ __forceinline__ float kv_load1(const void *cache, int f32, size_t idx) {
    return f32 ? ((const float *)cache)[idx] : __half2float(((const __half *)cache)[idx]);
}

template <int HD> __global__ void __launch_bounds__(ATT_WARPS * 32) att_kernel(engine_cu_att a) {
    constexpr int DPL = HD / 32;
    __shared__ float sq[HD], sk[HD], sv[HD], red[32];
    __shared__ float wm[ATT_WARPS], wl[ATT_WARPS], wacc[ATT_WARPS][HD];
    __shared__ int s_last;
    const int h = blockIdx.x, s = blockIdx.y;
    const int pos = *a.pos, n_pos = pos + 1;
    const int n_act = (n_pos + ENGINE_CU_ATT_SPLIT - 1) / ENGINE_CU_ATT_SPLIT;
    if (s >= n_act) return;
    const int group = a.n_head / a.n_kv, kvh = h / group;
    const size_t kv_dim = (size_t)a.n_kv * HD;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;

    const float2 *rope = a.rope + (size_t)pos * (HD / 2);
    norm_rope<HD>(a.q + (size_t)h * HD, a.q_norm, rope, a.eps, sq, red);
    const bool has_new = s == n_act - 1;
    if (has_new) {
        norm_rope<HD>(a.k + (size_t)kvh * HD, a.k_norm, rope, a.eps, sk, red);
        for (int i = threadIdx.x; i < HD; i += blockDim.x) {
            float kr = round_kv(sk[i], a.kv_f32),
                  vr = round_kv(a.v[(size_t)kvh * HD + i], a.kv_f32);
            sk[i] = kr;
            sv[i] = vr;
            if (h % group == 0) {
                size_t o = (size_t)pos * kv_dim + (size_t)kvh * HD + i;
                if (a.kv_f32) {
                    ((float *)a.k_cache)[o] = kr;
                    ((float *)a.v_cache)[o] = vr;
                } else {
                    ((__half *)a.k_cache)[o] = __float2half_rn(kr);
                    ((__half *)a.v_cache)[o] = __float2half_rn(vr);
                }
            }
        }
        __syncthreads();
    }

    const float scale = 1.0f / sqrtf((float)HD);
    const int p_begin = s * ENGINE_CU_ATT_SPLIT;
    const int p_end = min(p_begin + ENGINE_CU_ATT_SPLIT, n_pos);
    float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++)
        acc[i] = 0.0f;
    for (int p0 = p_begin + 32 * w; p0 < p_end; p0 += 32 * ATT_WARPS) {
        const int p = p0 + lane;
        float sc = -INFINITY;
        if (p < p_end) {
            float dot = 0.0f;
            if (p == pos) {
#pragma unroll 8
                for (int i = 0; i < HD; i++)
                    dot += sq[i] * sk[i];
            } else {
                size_t row = (size_t)p * kv_dim + (size_t)kvh * HD;
#pragma unroll
                for (int i8 = 0; i8 < HD / 8; i8++) {
                    float kk[8];
                    kv_load8(a.k_cache, a.kv_f32, row, i8, kk);
#pragma unroll
                    for (int t = 0; t < 8; t++)
                        dot += sq[8 * i8 + t] * kk[t];
                }
            }
            sc = dot * scale;
        }
        const float bm = engine_cu_warp_max(sc);
        const float mn = fmaxf(m, bm);
        const float pe = p < p_end ? expf(sc - mn) : 0.0f;
        const float corr = expf(m - mn);
        l = l * corr + engine_cu_warp_sum(pe);
#pragma unroll
        for (int i = 0; i < DPL; i++)
            acc[i] *= corr;
        m = mn;
        const int nb = min(32, p_end - p0);
        const size_t base = (size_t)p0 * kv_dim + (size_t)kvh * HD + lane;
#pragma unroll 16
        for (int j = 0; j < 32; j++) {
            if (j < nb) {
                const float pj = __shfl_sync(0xffffffffu, pe, j);
                const size_t row = base + (size_t)j * kv_dim;
#pragma unroll
                for (int i = 0; i < DPL; i++) {
                    /* row pos may be being written by another block: its value is not used */
                    float vv = kv_load1(a.v_cache, a.kv_f32, row + 32 * i);
                    if (p0 + j == pos) vv = sv[lane + 32 * i];
                    acc[i] += pj * vv;
                }
            }
        }
    }
    if (lane == 0) {
        wm[w] = m;
        wl[w] = l;
    }
#pragma unroll
    for (int i = 0; i < DPL; i++)
        wacc[w][lane + 32 * i] = acc[i];
    __syncthreads();
    float M = -INFINITY;
    for (int k = 0; k < ATT_WARPS; k++)
        M = fmaxf(M, wm[k]);
    float L = 0.0f, f[ATT_WARPS];
    for (int k = 0; k < ATT_WARPS; k++) {
        f[k] = wl[k] > 0.0f ? expf(wm[k] - M) : 0.0f;
        L += wl[k] * f[k];
    }
    const int max_splits = gridDim.y;
    if (n_act == 1) {
        for (int i = threadIdx.x; i < HD; i += blockDim.x) {
            float o = 0.0f;
            for (int k = 0; k < ATT_WARPS; k++)
                o += wacc[k][i] * f[k];
            a.out[(size_t)h * HD + i] = o / L;
        }
        return;
    }
    float *part = a.partial + ((size_t)h * max_splits + s) * (HD + 2);
    for (int i = threadIdx.x; i < HD; i += blockDim.x) {
        float o = 0.0f;
        for (int k = 0; k < ATT_WARPS; k++)
            o += wacc[k][i] * f[k];
        part[2 + i] = o;
    }
    if (threadIdx.x == 0) {
        part[0] = M;
        part[1] = L;
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned done = atomicAdd(a.counters + h, 1u);
        s_last = done == (unsigned)(n_act - 1);
        if (s_last) a.counters[h] = 0; /* ready for the next launch */
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    const float *ph = a.partial + (size_t)h * max_splits * (HD + 2);
    float MM = -INFINITY;
    for (int k = 0; k < n_act; k++)
        MM = fmaxf(MM, __ldcg(ph + (size_t)k * (HD + 2)));
    float LL = 0.0f;
    for (int k = 0; k < n_act; k++) {
        const float *pk = ph + (size_t)k * (HD + 2);
        LL += __ldcg(pk + 1) * expf(__ldcg(pk) - MM);
    }
    for (int i = threadIdx.x; i < HD; i += blockDim.x) {
        float o = 0.0f;
        for (int k = 0; k < n_act; k++) {
            const float *pk = ph + (size_t)k * (HD + 2);
            o += __ldcg(pk + 2 + i) * expf(__ldcg(pk) - MM);
        }
        a.out[(size_t)h * HD + i] = o / LL;
    }
}

void engine_cu_attention(const engine_cu_att *a, cudaStream_t stream) {
    dim3 grid(a->n_head, engine_cu_att_max_splits(a->n_ctx));
    switch (a->hd) {
    case 64:
        att_kernel<64><<<grid, ATT_WARPS * 32, 0, stream>>>(*a);
        break;
    case 128:
        att_kernel<128><<<grid, ATT_WARPS * 32, 0, stream>>>(*a);
        break;
    default:
        att_kernel<256><<<grid, ATT_WARPS * 32, 0, stream>>>(*a);
        break;
    }
}
