/* Device side of the causal prefill attention on tensor cores, shared by the plain kernel
 * (prefill.cu: pf_att_tc_kernel) and the gated grouped one of qwen35moe (q35_prefill_att.cu:
 * q35_att_tc_kernel): the F16 mma, the K/V tile load (V transposed) and the online softmax of a
 * score tile with its P V product. Layout (both kernels): a block of 4 warps of 16 rows; lane
 * (g = lane / 4, t = lane % 4) holds rows g and g + 8 of its warp's 16 and columns 2 t, 2 t + 1
 * of each 8-column tile (the m16n8k16 fragments); the score tile of two 8-key tiles is the P
 * operand of the next product as it stands (rounded to F16). */
#ifndef SPARK_ENGINE_CUDA_ATT_TC_DEV_CUH
#define SPARK_ENGINE_CUDA_ATT_TC_DEV_CUH

#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

__device__ __forceinline__ uint32_t engine_cu_att_tc_h2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *(const uint32_t *)&h;
}

/* d += a b (m16n8k16, F16 in, F32 accumulate). */
__device__ __forceinline__ void engine_cu_att_tc_mma(float d[4], uint32_t a0, uint32_t a1,
                                                     uint32_t a2, uint32_t a3, uint32_t b0,
                                                     uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

/* Keys k0 .. k0 + TK - 1 of KV head kvh (F16 cache rows of kv_dim; zeros past n_keys) into sK
 * ([TK][HD + 8]) and, transposed, sVt ([HD][TK + 8]) by the block's 128 threads; consecutive
 * threads take consecutive keys, so the transposed V stores of a warp fall in different banks. */
template <int HD, int TK>
__device__ __forceinline__ void engine_cu_att_tc_tile(const __half *kc, const __half *vc,
                                                      __half *sK, __half *sVt, int k0, int n_keys,
                                                      int kv_dim, int kvh, int tid) {
    constexpr int SQ = HD + 8, SV = TK + 8;
    for (int idx = tid; idx < TK * (HD / 8); idx += 128) {
        const int r = idx % TK, c8 = 8 * (idx / TK), p = k0 + r;
        uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
        if (p < n_keys) {
            const size_t off = (size_t)p * kv_dim + (size_t)kvh * HD + c8;
            kv = *(const uint4 *)(kc + off);
            vv = *(const uint4 *)(vc + off);
        }
        *(uint4 *)(sK + r * SQ + c8) = kv;
        const __half *vh = (const __half *)&vv;
#pragma unroll
        for (int e = 0; e < 8; e++)
            sVt[(c8 + e) * SV + r] = vh[e];
    }
}

/* The online softmax of the score tile s (keys k0 .., this lane's rows at query positions qp0
 * and qp1: later keys masked) into the running max m, sum l and output o of the two rows, and
 * o += P V from sVt. */
template <int HD, int TK>
__device__ __forceinline__ void
engine_cu_att_tc_softmax_pv(float (&s)[TK / 8][4], float (&o)[HD / 8][4], float &m0, float &m1,
                            float &l0, float &l1, int k0, int qp0, int qp1, float scale, int g,
                            int t, const __half *sVt) {
    constexpr int SV = TK + 8, NT = TK / 8, DT = HD / 8;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int key = k0 + 8 * nt + 2 * t + e;
            s[nt][e] = key <= qp0 ? s[nt][e] * scale : -INFINITY;
            s[nt][2 + e] = key <= qp1 ? s[nt][2 + e] * scale : -INFINITY;
            mx0 = fmaxf(mx0, s[nt][e]);
            mx1 = fmaxf(mx1, s[nt][2 + e]);
        }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    /* key 0 serves every row, so m is finite from the first tile on; a later tile wholly after
     * a row leaves it as it is (correction 1, p 0) */
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float c0 = expf(m0 - mn0), c1 = expf(m1 - mn1);
    m0 = mn0;
    m1 = mn1;
    l0 *= c0;
    l1 *= c1;
#pragma unroll
    for (int i = 0; i < DT; i++) {
        o[i][0] *= c0;
        o[i][1] *= c0;
        o[i][2] *= c1;
        o[i][3] *= c1;
    }
#pragma unroll
    for (int j = 0; j < NT / 2; j++) { /* 16 keys: score tiles 2 j and 2 j + 1 */
        float pr[2][4];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            pr[u][0] = expf(s[2 * j + u][0] - mn0);
            pr[u][1] = expf(s[2 * j + u][1] - mn0);
            pr[u][2] = expf(s[2 * j + u][2] - mn1);
            pr[u][3] = expf(s[2 * j + u][3] - mn1);
            l0 += pr[u][0] + pr[u][1];
            l1 += pr[u][2] + pr[u][3];
        }
        const uint32_t p0 = engine_cu_att_tc_h2(pr[0][0], pr[0][1]);
        const uint32_t p1 = engine_cu_att_tc_h2(pr[0][2], pr[0][3]);
        const uint32_t p2 = engine_cu_att_tc_h2(pr[1][0], pr[1][1]);
        const uint32_t p3 = engine_cu_att_tc_h2(pr[1][2], pr[1][3]);
#pragma unroll
        for (int i = 0; i < DT; i++) {
            const __half *vr = sVt + (8 * i + g) * SV + 16 * j + 2 * t;
            engine_cu_att_tc_mma(o[i], p0, p1, p2, p3, *(const uint32_t *)vr,
                                 *(const uint32_t *)(vr + 8));
        }
    }
}

/* l0, l1: the sums of the four lanes of each row. */
__device__ __forceinline__ void engine_cu_att_tc_row_sums(float &l0, float &l1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
}

#endif
