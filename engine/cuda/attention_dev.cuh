/* Device side of the decode attention (contract in attention.cuh): the work of one block,
 * shared by the per-op kernel (attention.cu) and the fused decode step (step.cu).
 *
 * A block (KV head, split) of ENGINE_CU_ATT_SPLIT threads: its warps normalise and rotate the
 * group's query heads into shared memory (a warp per head, values in registers), the block of
 * the last split stores the new K/V row; then four threads score one position against every
 * query head of the group (each a quarter of the K row, all its 16-byte loads issued at once,
 * the quarters summed in shuffles), a warp per head takes the softmax of its scores, and for V
 * the lanes spread over the head's dimensions (coalesced rows) while the warps take every 8th
 * position (8 positions' loads in flight), each warp's sums kept apart in shared memory and
 * added in warp order (deterministic). The block asks L2 for its K and V rows before it waits
 * for its inputs. The last block of a KV head to finish merges the splits: per head the split
 * weights and the denominator once (a warp per head), then every thread sums four outputs
 * over the splits with sixteen loads in flight. */
#ifndef SPARK_ENGINE_CUDA_ATTENTION_DEV_CUH
#define SPARK_ENGINE_CUDA_ATTENTION_DEV_CUH

#include <cuda_fp16.h>
#include <math.h>

#include "attention.cuh"
#include "dequant.cuh"
#include "sync.cuh"

#define ATT_THREADS ENGINE_CU_ATT_SPLIT
#define ATT_WARPS (ATT_THREADS / 32)
#define ATT_GP 8  /* query heads per pass of the score and V loops */
#define ATT_TPP 4 /* threads per position in the score loop */

/* v[t] = element lane + 32 t of rope(rmsnorm(src) * w) for one head of HD values (one warp). */
template <int HD>
__device__ __forceinline__ void norm_rope_warp(const float *src, const float *w, const float2 *rope,
                                               float eps, float v[HD / 32]) {
    const int lane = threadIdx.x & 31;
    float ss = 0.0f;
#pragma unroll
    for (int t = 0; t < HD / 32; t++) {
        v[t] = src[lane + 32 * t];
        ss += v[t] * v[t];
    }
    ss = engine_cu_warp_sum(ss);
    const float scale = 1.0f / sqrtf(ss / (float)HD + eps);
#pragma unroll
    for (int t = 0; t < HD / 32; t++)
        v[t] = w[lane + 32 * t] * (v[t] * scale);
    constexpr int H2 = HD / 64; /* element i + HD / 2 sits H2 slots further */
#pragma unroll
    for (int t = 0; t < H2; t++) {
        const float2 cs = rope[lane + 32 * t];
        const float x0 = v[t], x1 = v[t + H2];
        v[t] = x0 * cs.x - x1 * cs.y;
        v[t + H2] = x0 * cs.y + x1 * cs.x;
    }
}

/* 8 values of K or V from element index idx (8-aligned) of a cache. */
__device__ __forceinline__ void kv_load8(const void *cache, int f32, size_t idx, float out[8]) {
    if (f32) {
        const float4 *p = (const float4 *)((const float *)cache + idx);
        const float4 a = p[0], b = p[1];
        out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
        out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
    } else {
        const uint4 u = *(const uint4 *)((const __half *)cache + idx);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            out[2 * k] = engine_cu_h2f((uint16_t)(w[k] & 0xffffu));
            out[2 * k + 1] = engine_cu_h2f((uint16_t)(w[k] >> 16));
        }
    }
}

/* N (2, 4 or 8) consecutive values of a cache from element index idx (N-aligned). */
template <int N>
__device__ __forceinline__ void kv_loadn(const void *cache, int f32, size_t idx, float out[N]) {
    if (N == 8) {
        kv_load8(cache, f32, idx, out);
    } else if (f32) {
        const float *p = (const float *)cache + idx;
        if (N == 4) {
            const float4 a = *(const float4 *)p;
            out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
        } else {
            const float2 a = *(const float2 *)p;
            out[0] = a.x, out[1] = a.y;
        }
    } else {
        const __half *p = (const __half *)cache + idx;
        if (N == 4) {
            const uint2 u = *(const uint2 *)p;
            out[0] = engine_cu_h2f((uint16_t)(u.x & 0xffffu));
            out[1] = engine_cu_h2f((uint16_t)(u.x >> 16));
            out[2] = engine_cu_h2f((uint16_t)(u.y & 0xffffu));
            out[3] = engine_cu_h2f((uint16_t)(u.y >> 16));
        } else {
            const uint32_t u = *(const uint32_t *)p;
            out[0] = engine_cu_h2f((uint16_t)(u & 0xffffu));
            out[1] = engine_cu_h2f((uint16_t)(u >> 16));
        }
    }
}

/* Shared memory of a block: sq[GP][HD], sc[GP][SPLIT], so[ATT_WARPS][ATT_GP][HD] floats (GP =
 * the group rounded up to ATT_GP). */
static inline size_t att_smem_bytes(int group, int hd) {
    const int gp = (group + ATT_GP - 1) / ATT_GP * ATT_GP;
    return sizeof(float) *
           ((size_t)gp * hd + (size_t)gp * ENGINE_CU_ATT_SPLIT + (size_t)ATT_WARPS * ATT_GP * hd);
}

/* Block (kvh, s) of a grid (n_kv, max_splits); att_smem: att_smem_bytes of dynamic shared
 * memory; sync.wait() before the inputs are read (every thread calls it). UK: the splits whose
 * sums the merge loads together (the same sums in the same order whatever it is; 4 for the
 * per-KV-head launch and the fused step, 8 for att_short.cu's flat launch). */
template <int HD, int UK = 4, typename S>
__device__ __forceinline__ void att_block(const engine_cu_att &a, int kvh, int s, int max_splits,
                                          float *att_smem, const S &sync) {
    constexpr int DPL = HD / 32; /* V dimensions per lane */
    __shared__ float hm[ENGINE_CU_ATT_MAX_GROUP], hl[ENGINE_CU_ATT_MAX_GROUP];
    __shared__ int s_last;
    const size_t kv_dim = (size_t)a.n_kv * HD;
    const size_t elt = a.kv_f32 ? 4 : 2;
    /* the position is set before the step's graph runs (no kernel of the step writes it) */
    const int pos = *a.pos, n_pos = pos + 1;
    const int n_act = (n_pos + ENGINE_CU_ATT_SPLIT - 1) / ENGINE_CU_ATT_SPLIT;
    if (s >= n_act) return;
    { /* this split's K and V rows (before the position: final) to L2 while the previous
       * kernel finishes */
        const int p = s * ENGINE_CU_ATT_SPLIT + (int)threadIdx.x;
        if (p < pos) {
            const size_t off = ((size_t)p * kv_dim + (size_t)kvh * HD) * elt;
            engine_cu_prefetch_rows((const uint8_t *)a.k_cache + off, HD * elt);
            engine_cu_prefetch_rows((const uint8_t *)a.v_cache + off, HD * elt);
        }
    }
    sync.wait();
    const int G = a.n_head / a.n_kv, GP = (G + ATT_GP - 1) / ATT_GP * ATT_GP;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float *sq = att_smem, *sc = sq + (size_t)GP * HD, *so = sc + (size_t)GP * ENGINE_CU_ATT_SPLIT;
    const float2 *rope = a.rope + (size_t)pos * (HD / 2);

    /* the group's query heads (padding heads zero), and the new K/V row */
    for (int g = w; g < GP; g += ATT_WARPS) {
        float v[DPL];
        if (g < G) norm_rope_warp<HD>(a.q + (size_t)(kvh * G + g) * HD, a.q_norm, rope, a.eps, v);
#pragma unroll
        for (int t = 0; t < DPL; t++)
            sq[g * HD + lane + 32 * t] = g < G ? v[t] : 0.0f;
    }
    if (s == n_act - 1 && w == ATT_WARPS - 1) {
        float v[DPL];
        norm_rope_warp<HD>(a.k + (size_t)kvh * HD, a.k_norm, rope, a.eps, v);
        const size_t o = (size_t)pos * kv_dim + (size_t)kvh * HD;
#pragma unroll
        for (int t = 0; t < DPL; t++) {
            const int i = lane + 32 * t;
            const float vv = a.v[(size_t)kvh * HD + i];
            if (a.kv_f32) {
                ((float *)a.k_cache)[o + i] = v[t];
                ((float *)a.v_cache)[o + i] = vv;
            } else {
                ((__half *)a.k_cache)[o + i] = __float2half_rn(v[t]);
                ((__half *)a.v_cache)[o + i] = __float2half_rn(vv);
            }
        }
    }
    __syncthreads(); /* also makes the stored row visible to the block */

    /* scores: ATT_TPP threads per position (each a quarter of the head dimensions, its K loads
     * all issued before any math), every head of the group; the parts meet in shuffles */
    const float scale = 1.0f / sqrtf((float)HD);
    const int p_begin = s * ENGINE_CU_ATT_SPLIT, np = min(ENGINE_CU_ATT_SPLIT, n_pos - p_begin);
    constexpr int NI = HD / 8 / ATT_TPP; /* groups of 8 values per thread: part, part + TPP, .. */
    const int part = threadIdx.x & (ATT_TPP - 1);
    for (int jb = 0; jb < np; jb += ATT_THREADS / ATT_TPP) { /* uniform over the block */
        const int j = jb + (int)threadIdx.x / ATT_TPP;
        const size_t row = (size_t)(p_begin + min(j, np - 1)) * kv_dim + (size_t)kvh * HD;
        float kk[NI][8];
#pragma unroll
        for (int ii = 0; ii < NI; ii++)
            kv_load8(a.k_cache, a.kv_f32, row + 8 * (part + ATT_TPP * ii), kk[ii]);
        for (int g0 = 0; g0 < GP; g0 += ATT_GP) {
            float d[ATT_GP];
#pragma unroll
            for (int gg = 0; gg < ATT_GP; gg++) {
                d[gg] = 0.0f;
#pragma unroll
                for (int ii = 0; ii < NI; ii++) {
                    const float *qp = sq + (g0 + gg) * HD + 8 * (part + ATT_TPP * ii);
                    const float4 q0 = *(const float4 *)qp, q1 = *(const float4 *)(qp + 4);
                    d[gg] += q0.x * kk[ii][0] + q0.y * kk[ii][1] + q0.z * kk[ii][2] +
                             q0.w * kk[ii][3] + q1.x * kk[ii][4] + q1.y * kk[ii][5] +
                             q1.z * kk[ii][6] + q1.w * kk[ii][7];
                }
#pragma unroll
                for (int o = 1; o < ATT_TPP; o <<= 1)
                    d[gg] += __shfl_xor_sync(0xffffffffu, d[gg], o);
            }
            if (part == 0 && j < np)
#pragma unroll
                for (int gg = 0; gg < ATT_GP; gg++)
                    sc[(g0 + gg) * ENGINE_CU_ATT_SPLIT + j] = d[gg] * scale;
        }
    }
    __syncthreads();
    /* softmax numerators per head (a warp per head); padding heads keep zeros (q = 0) */
    for (int g = w; g < G; g += ATT_WARPS) {
        float *r = sc + g * ENGINE_CU_ATT_SPLIT;
        float mx = -INFINITY;
        for (int j = lane; j < np; j += 32)
            mx = fmaxf(mx, r[j]);
        mx = engine_cu_warp_max(mx);
        float sum = 0.0f;
        for (int j = lane; j < np; j += 32) {
            const float e = expf(r[j] - mx);
            r[j] = e;
            sum += e;
        }
        sum = engine_cu_warp_sum(sum);
        if (lane == 0) {
            hm[g] = mx;
            hl[g] = sum;
        }
    }
    __syncthreads();

    /* V: lane over dimensions lane * DPL .., warp over positions w, w + ATT_WARPS, ... */
    for (int g0 = 0; g0 < GP; g0 += ATT_GP) {
        float acc[ATT_GP][DPL];
#pragma unroll
        for (int gg = 0; gg < ATT_GP; gg++)
#pragma unroll
            for (int t = 0; t < DPL; t++)
                acc[gg][t] = 0.0f;
#pragma unroll(DPL <= 4 ? 8 : 4)
        for (int j = w; j < np; j += ATT_WARPS) {
            float vv[DPL];
            kv_loadn<DPL>(a.v_cache, a.kv_f32,
                          (size_t)(p_begin + j) * kv_dim + (size_t)kvh * HD + lane * DPL, vv);
#pragma unroll
            for (int gg = 0; gg < ATT_GP; gg++) {
                const float pj = sc[(g0 + gg) * ENGINE_CU_ATT_SPLIT + j];
#pragma unroll
                for (int t = 0; t < DPL; t++)
                    acc[gg][t] += pj * vv[t];
            }
        }
        /* each warp's sums to its own slice; then every output is summed over the warps in a
         * fixed order (deterministic: no atomics, one barrier) */
        float *sw = so + (size_t)w * ATT_GP * HD;
#pragma unroll
        for (int gg = 0; gg < ATT_GP; gg++)
#pragma unroll
            for (int t = 0; t < DPL; t++)
                sw[gg * HD + lane * DPL + t] = acc[gg][t];
        __syncthreads();
        for (int i = threadIdx.x; i < ATT_GP * HD; i += ATT_THREADS) {
            const int gg = i / HD, d = i - gg * HD, g = g0 + gg, h = kvh * G + g;
            if (g >= G) continue;
            float o = 0.0f;
#pragma unroll
            for (int k = 0; k < ATT_WARPS; k++)
                o += so[(size_t)k * ATT_GP * HD + i];
            if (n_act == 1) {
                a.out[(size_t)h * HD + d] = o / hl[g];
            } else {
                float *part = a.partial + ((size_t)h * max_splits + s) * (HD + 2);
                part[2 + d] = o;
                if (d == 0) {
                    part[0] = hm[g];
                    part[1] = hl[g];
                }
            }
        }
        __syncthreads(); /* before so is written again */
    }
    if (n_act == 1) return;

    /* the last block of this KV head merges the splits of its heads */
    __threadfence();
    if (threadIdx.x == 0) {
        const unsigned done = atomicAdd(a.counters + kvh, 1u);
        s_last = done == (unsigned)(n_act - 1);
        if (s_last) a.counters[kvh] = 0; /* ready for the next launch */
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    if (n_act > ENGINE_CU_ATT_SPLIT) { /* longer than 65536 positions: per output, in turn */
        for (int i = threadIdx.x; i < G * HD; i += ATT_THREADS) {
            const int g = i / HD, d = i - g * HD, h = kvh * G + g;
            const float *ph = a.partial + (size_t)h * max_splits * (HD + 2);
            float mm = -INFINITY;
            for (int k = 0; k < n_act; k++)
                mm = fmaxf(mm, __ldcg(ph + (size_t)k * (HD + 2)));
            float ll = 0.0f, o = 0.0f;
            for (int k = 0; k < n_act; k++) {
                const float *pk = ph + (size_t)k * (HD + 2);
                const float f = expf(__ldcg(pk) - mm);
                ll += __ldcg(pk + 1) * f;
                o += __ldcg(pk + 2 + d) * f;
            }
            a.out[(size_t)h * HD + d] = o / ll;
        }
        return;
    }
    /* per head, once: the split weights f_k = exp(m_k - M) into the score memory and the
     * denominator sum_k l_k f_k (a warp per head, lanes over the splits) */
    for (int g = w; g < G; g += ATT_WARPS) {
        const float *ph = a.partial + (size_t)(kvh * G + g) * max_splits * (HD + 2);
        float mm = -INFINITY;
        for (int k = lane; k < n_act; k += 32)
            mm = fmaxf(mm, __ldcg(ph + (size_t)k * (HD + 2)));
        mm = engine_cu_warp_max(mm);
        float ll = 0.0f;
        for (int k = lane; k < n_act; k += 32) {
            const float f = expf(__ldcg(ph + (size_t)k * (HD + 2)) - mm);
            ll += __ldcg(ph + (size_t)k * (HD + 2) + 1) * f;
            sc[g * ENGINE_CU_ATT_SPLIT + k] = f;
        }
        ll = engine_cu_warp_sum(ll);
        if (lane == 0) hl[g] = ll;
    }
    __syncthreads();
    /* then each thread sums MO outputs (consecutive threads, consecutive dimensions: coalesced)
     * over the splits, the MO loads of UK splits in flight together */
    constexpr int MO = 4;
    for (int i0 = threadIdx.x; i0 < G * HD; i0 += MO * ATT_THREADS) {
        float o[MO];
        const float *pp[MO];
        const float *wk[MO];
#pragma unroll
        for (int m = 0; m < MO; m++) {
            const int i = min(i0 + m * ATT_THREADS, G * HD - 1), g = i / HD, d = i - g * HD;
            pp[m] = a.partial + (size_t)(kvh * G + g) * max_splits * (HD + 2) + 2 + d;
            wk[m] = sc + g * ENGINE_CU_ATT_SPLIT;
            o[m] = 0.0f;
        }
        int k = 0;
        for (; k + UK <= n_act; k += UK) {
            float v[UK][MO];
#pragma unroll
            for (int u = 0; u < UK; u++)
#pragma unroll
                for (int m = 0; m < MO; m++)
                    v[u][m] = __ldcg(pp[m] + (size_t)(k + u) * (HD + 2));
#pragma unroll
            for (int u = 0; u < UK; u++)
#pragma unroll
                for (int m = 0; m < MO; m++)
                    o[m] += v[u][m] * wk[m][k + u];
        }
        for (; k < n_act; k++)
#pragma unroll
            for (int m = 0; m < MO; m++)
                o[m] += __ldcg(pp[m] + (size_t)k * (HD + 2)) * wk[m][k];
#pragma unroll
        for (int m = 0; m < MO; m++) {
            const int i = i0 + m * ATT_THREADS, g = i / HD, d = i - g * HD;
            if (i < G * HD) a.out[(size_t)(kvh * G + g) * HD + d] = o[m] / hl[g];
        }
    }
}

#endif
