/* Gated causal attention of the qwen35moe prefill on tensor cores (contract in q35_prefill.cuh,
 * engine_cu_q35_att_tc). */
#include <cuda_fp16.h>
#include <math.h>

#include "att_tc_dev.cuh"
#include "q35_prefill.cuh"

#define QA_ROWS 64 /* (query, head) rows of a block: 4 warps of 16 */
#define QA_TK 32   /* keys per tile */

bool engine_cu_q35_att_tc_ok(int kv_f32, int n_head, int n_kv, int hd) {
    if (kv_f32 || n_kv < 1 || n_head % n_kv) return false;
    const int g = n_head / n_kv;
    return (hd == 64 || hd == 128 || hd == 256) && g >= 1 && g <= QA_ROWS && QA_ROWS % g == 0;
}

/* Block (64 / G queries, KV head): row r = query r / G, query head r % G of the group, so the
 * group's heads share every K and V tile. Lane (g = lane / 4, t = lane % 4) of warp w holds
 * rows 16 w + g and 16 w + g + 8, columns 2 t, 2 t + 1 of each 8-column tile (the mma
 * fragments); a score tile is the P operand of the next product as it stands. */
template <int HD>
__global__ void __launch_bounds__(128) q35_att_tc_kernel(engine_cu_q35_att_args a) {
    constexpr int SQ = HD + 8, KS = HD / 16, NT = QA_TK / 8, DT = HD / 8;
    extern __shared__ __align__(16) __half qa_smem[];
    __half *sQ = qa_smem;           /* [QA_ROWS][SQ] */
    __half *sK = sQ + QA_ROWS * SQ; /* [QA_TK][SQ] */
    __half *sVt = sK + QA_TK * SQ;  /* [HD][QA_TK + 8]: V transposed */
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3;
    const int G = a.n_head / a.n_kv, QB = QA_ROWS / G;
    const int kvh = (int)blockIdx.y, q0 = (int)blockIdx.x * QB;
    const int nq = min(QB, a.n - q0), n_keys = a.pos0 + q0 + nq, kv_dim = a.n_kv * HD;
    const float scale = 1.0f / sqrtf((float)HD);
    const __half *kc = (const __half *)a.k_cache, *vc = (const __half *)a.v_cache;
    for (int idx = tid; idx < QA_ROWS * HD; idx += 128) {
        const int r = idx / HD, d = idx - r * HD, i = r / G, h = r - i * G;
        sQ[r * SQ + d] = __float2half_rn(
            i < nq ? a.q[((size_t)(q0 + i) * a.n_head + kvh * G + h) * HD + d] : 0.0f);
    }
    /* this lane's two rows: their query positions (rows past the block's queries repeat the
     * last one: finite scores, never stored) */
    const int r0 = 16 * w + g, r1 = r0 + 8;
    const int qp0 = a.pos0 + q0 + min(r0 / G, nq - 1), qp1 = a.pos0 + q0 + min(r1 / G, nq - 1);
    float o[DT][4], m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
#pragma unroll
    for (int i = 0; i < DT; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    for (int k0 = 0; k0 < n_keys; k0 += QA_TK) {
        __syncthreads(); /* the previous tile is consumed (and sQ written) */
        engine_cu_att_tc_tile<HD, QA_TK>(kc, vc, sK, sVt, k0, n_keys, kv_dim, kvh, tid);
        __syncthreads();
        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        const __half *qa = sQ + r0 * SQ + 2 * t;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            const uint32_t a0 = *(const uint32_t *)(qa + 16 * ks);
            const uint32_t a1 = *(const uint32_t *)(qa + 8 * SQ + 16 * ks);
            const uint32_t a2 = *(const uint32_t *)(qa + 16 * ks + 8);
            const uint32_t a3 = *(const uint32_t *)(qa + 8 * SQ + 16 * ks + 8);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const __half *kr = sK + (8 * nt + g) * SQ + 2 * t + 16 * ks;
                engine_cu_att_tc_mma(s[nt], a0, a1, a2, a3, *(const uint32_t *)kr,
                       *(const uint32_t *)(kr + 8));
            }
        }
        engine_cu_att_tc_softmax_pv<HD, QA_TK>(s, o, m0, m1, l0, l1, k0, qp0, qp1, scale, g, t,
                                               sVt);
    }
    engine_cu_att_tc_row_sums(l0, l1);
    /* out = o / l * sigmoid(gate) for the rows of real queries */
    const int i0 = r0 / G, h0 = kvh * G + (r0 - i0 * G), i1 = r1 / G, h1 = kvh * G + (r1 - i1 * G);
    const float il0 = 1.0f / l0, il1 = 1.0f / l1;
    const size_t b0 = ((size_t)(q0 + i0) * a.n_head + h0), b1 = ((size_t)(q0 + i1) * a.n_head + h1);
#pragma unroll
    for (int i = 0; i < DT; i++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int d = 8 * i + 2 * t + e;
            if (i0 < nq) {
                const float gt = a.qg[b0 * 2 * HD + HD + d];
                a.out[b0 * HD + d] = o[i][e] * il0 * (1.0f / (1.0f + expf(-gt)));
            }
            if (i1 < nq) {
                const float gt = a.qg[b1 * 2 * HD + HD + d];
                a.out[b1 * HD + d] = o[i][2 + e] * il1 * (1.0f / (1.0f + expf(-gt)));
            }
        }
}

template <int HD> static void qa_launch(const engine_cu_q35_att_args *a, cudaStream_t st) {
    const size_t smem =
        sizeof(__half) * ((size_t)(QA_ROWS + QA_TK) * (HD + 8) + (size_t)HD * (QA_TK + 8));
    cudaFuncSetAttribute(q35_att_tc_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)smem);
    const int qb = QA_ROWS / (a->n_head / a->n_kv);
    const dim3 grid((unsigned)((a->n + qb - 1) / qb), (unsigned)a->n_kv);
    q35_att_tc_kernel<HD><<<grid, 128, smem, st>>>(*a);
}

void engine_cu_q35_att_tc(const engine_cu_q35_att_args *a, cudaStream_t stream) {
    if (a->n <= 0) return;
    if (a->hd == 64)
        qa_launch<64>(a, stream);
    else if (a->hd == 128)
        qa_launch<128>(a, stream);
    else
        qa_launch<256>(a, stream);
}

ENGINE_CU_TRACE_TU(q35_prefill_att)
