/* Device helpers of the gated attention of qwen35moe (contract in qwen35_attn.cuh), shared by
 * the decode and prefill kernels (qwen35_attn.cu) and the verify pass over m queries
 * (q35_vatt.cu): the cache load, the q/k normalisation with rope, the K/V row store and the
 * merge of the runners' partials, one code for all so that each query of a verify pass takes the
 * decode step's arithmetic (bit for bit). */
#ifndef SPARK_ENGINE_CUDA_GATT_DEV_CUH
#define SPARK_ENGINE_CUDA_GATT_DEV_CUH

#include <cuda_fp16.h>
#include <math.h>

#include "qwen35_attn.cuh"

__device__ __forceinline__ float engine_cu_gatt_load(const void *cache, int f32, size_t i) {
    return f32 ? ((const float *)cache)[i] : __half2float(((const __half *)cache)[i]);
}

/* dst[0..HD) = rope(rmsnorm(src) * w) by one warp (dst in shared memory). */
template <int HD>
__device__ __forceinline__ void engine_cu_gatt_norm_rope(const float *src, const float *w,
                                                         float eps, const float2 *cs, int half,
                                                         float *dst) {
    const int lane = threadIdx.x & 31;
    float v[HD / 32], ss = 0.0f;
#pragma unroll
    for (int t = 0; t < HD / 32; t++) {
        v[t] = src[lane + 32 * t];
        ss += v[t] * v[t];
    }
    ss = engine_cu_warp_sum(ss);
    const float scale = 1.0f / sqrtf(ss / (float)HD + eps);
#pragma unroll
    for (int t = 0; t < HD / 32; t++) {
        v[t] = w[lane + 32 * t] * (v[t] * scale);
        dst[lane + 32 * t] = v[t];
    }
    __syncwarp();
    float r[HD / 32];
#pragma unroll
    for (int t = 0; t < HD / 32; t++) {
        const int i = lane + 32 * t;
        r[t] = v[t];
        if (i < half) {
            const float2 c = cs[i];
            r[t] = v[t] * c.x - dst[i + half] * c.y;
        } else if (i < 2 * half) {
            const float2 c = cs[i - half];
            r[t] = dst[i - half] * c.y + v[t] * c.x;
        }
    }
    __syncwarp();
#pragma unroll
    for (int t = 0; t < HD / 32; t++)
        dst[lane + 32 * t] = r[t];
    __syncwarp();
}

/* One warp: the K row kr[0..HD) (shared memory) and the V row v[vo ..) at offset o of the
 * caches (F16, kv_f32 = 0, or F32). */
template <int HD>
__device__ __forceinline__ void engine_cu_gatt_store_kv(const float *kr, const float *v, size_t vo,
                                                        void *k_cache, void *v_cache, int kv_f32,
                                                        size_t o, int lane) {
#pragma unroll
    for (int t = 0; t < HD / 32; t++) {
        const int i = lane + 32 * t;
        const float vv = v[vo + i];
        if (kv_f32) {
            ((float *)k_cache)[o + i] = kr[i];
            ((float *)v_cache)[o + i] = vv;
        } else {
            ((__half *)k_cache)[o + i] = __float2half_rn(kr[i]);
            ((__half *)v_cache)[o + i] = __float2half_rn(vv);
        }
    }
}

/* The merge of one head's nact runner partials ph ([r][HD + 2]: weighted V, max, sum), warp 0
 * (tid < 32): the runners' weights exp(m_r - m) into wr (shared) and 1 / the denominator into
 * inv_den (shared); the caller's barrier follows. */
template <int HD>
__device__ __forceinline__ void engine_cu_gatt_merge_weights(const float *ph, int nact, int tid,
                                                             int lane, float *wr, float &inv_den) {
    if (tid < 32) {
        float m = -INFINITY;
        for (int r = lane; r < nact; r += 32)
            m = fmaxf(m, ph[(size_t)r * (HD + 2) + HD]);
        m = engine_cu_warp_max(m);
        float den = 0.0f;
        for (int r = lane; r < nact; r += 32) {
            const float w = expf(ph[(size_t)r * (HD + 2) + HD] - m);
            wr[r] = w;
            den += w * ph[(size_t)r * (HD + 2) + HD + 1];
        }
        den = engine_cu_warp_sum(den);
        if (lane == 0) inv_den = 1.0f / den;
    }
}

/* Dimension dd of the merge: the weighted sum of the runners' partials (coalesced rows). */
template <int HD>
__device__ __forceinline__ float engine_cu_gatt_merge_num(const float *ph, int nact, int dd,
                                                          const float *wr) {
    float num = 0.0f;
#pragma unroll 8
    for (int r = 0; r < nact; r++)
        num += wr[r] * ph[(size_t)r * (HD + 2) + dd];
    return num;
}

#endif
