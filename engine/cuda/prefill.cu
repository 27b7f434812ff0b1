/* Prefill on the GPU: the kernels of prefill.cuh and the pass over a chunk of tokens
 * (engine_cuda_prefill_*, contract in cuda_backend.h).
 *
 * A pass over n tokens at positions pos .. pos + n - 1 of a session (per layer):
 *   prep(x, attn_norm) | q, k, v GEMMs | q/k norm + RoPE + KV store | attention |
 *   prep(att) | wo GEMM (+= x) | prep(x, ffn_norm) | router GEMM (F32) | route | sort |
 *   gate, up grouped GEMMs (selected experts only, tokens gathered) | prep(silu(g) * u) |
 *   down grouped GEMM | weighted combine (+= x)
 * then the final norm and the output head for the rows whose logits are wanted. Everything is
 * enqueued on the session's stream: nothing returns to the host inside a pass (the grouped
 * GEMMs take their tile list from device memory), and the decode graph that follows on the
 * same stream sees the KV rows the pass wrote. */
#include <algorithm>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "att_tc_dev.cuh"
#include "attention.cuh"
#include "dequant.cuh"
#include "gemm.cuh"
#include "prefill.cuh"

extern "C" {
#include "cuda/cuda_backend.h"
#include "model/model_int.h"
}

/* ---------------------------------------------------------------------------------------------
 * Kernels
 * ------------------------------------------------------------------------------------------- */
__global__ void pf_embed_kernel(const uint8_t *emb, size_t row_bytes, int type, int n_embd,
                                const int32_t *tokens, float *x) {
    const int t = blockIdx.x;
    const uint8_t *row = emb + (size_t)tokens[t] * row_bytes;
    float *o = x + (size_t)t * n_embd;
    for (int c = threadIdx.x; c < n_embd / 32; c += blockDim.x) {
        float va[16], vb[16];
        int a0, b0;
        engine_cu_decode_chunk(type, row, c, va, vb);
        engine_cu_chunk_cols(type, c, &a0, &b0);
#pragma unroll
        for (int l = 0; l < 16; l++) {
            o[a0 + l] = va[l];
            o[b0 + l] = vb[l];
        }
    }
}

void engine_cu_pf_embed(const uint8_t *emb, size_t row_bytes, int type, int n_embd,
                        const int32_t *tokens, int n, float *x, cudaStream_t stream) {
    if (n > 0) pf_embed_kernel<<<n, 128, 0, stream>>>(emb, row_bytes, type, n_embd, tokens, x);
}

/* One warp per (token, head): heads 0 .. n_head-1 are q, then n_kv k heads, then n_kv v heads. */
template <int HD> __global__ void pf_qk_kernel(engine_cu_pf_qk_args a) {
    const int warp = (int)(blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5));
    const int lane = threadIdx.x & 31, nh = a.n_head + 2 * a.n_kv;
    if (warp >= a.n * nh) return;
    const int t = warp / nh, h = warp % nh, kv_dim = a.n_kv * HD;
    const int pos = a.pos_of ? a.pos_of[t] : a.pos0 + t, row = a.row_of ? a.row_of[t] : pos;
    constexpr int NV = HD / 32, H2 = HD / 64;
    float v[NV];
    const float *src;
    const float *w;
    if (h < a.n_head) {
        src = a.q + ((size_t)t * a.n_head + h) * HD;
        w = a.q_norm;
    } else if (h < a.n_head + a.n_kv) {
        src = a.k + (size_t)t * kv_dim + (size_t)(h - a.n_head) * HD;
        w = a.k_norm;
    } else {
        src = a.v + (size_t)t * kv_dim + (size_t)(h - a.n_head - a.n_kv) * HD;
        w = nullptr;
    }
#pragma unroll
    for (int i = 0; i < NV; i++)
        v[i] = src[lane + 32 * i];
    if (w) { /* rmsnorm * w, then RoPE, as the decode attention kernel */
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < NV; i++)
            ss += v[i] * v[i];
        ss = engine_cu_warp_sum(ss);
        const float scale = 1.0f / sqrtf(ss / (float)HD + a.eps);
#pragma unroll
        for (int i = 0; i < NV; i++)
            v[i] = w[lane + 32 * i] * (v[i] * scale);
        const float2 *rope = a.rope + (size_t)pos * (HD / 2);
#pragma unroll
        for (int i = 0; i < H2; i++) {
            const float2 cs = rope[lane + 32 * i];
            const float x0 = v[i], x1 = v[i + H2];
            v[i] = x0 * cs.x - x1 * cs.y;
            v[i + H2] = x0 * cs.y + x1 * cs.x;
        }
    }
    if (h < a.n_head) {
        float *dst = a.q + ((size_t)t * a.n_head + h) * HD;
#pragma unroll
        for (int i = 0; i < NV; i++)
            dst[lane + 32 * i] = v[i];
        return;
    }
    const bool is_k = h < a.n_head + a.n_kv;
    const int kvh = is_k ? h - a.n_head : h - a.n_head - a.n_kv;
    void *cache = is_k ? a.k_cache : a.v_cache;
    const size_t off = (size_t)row * kv_dim + (size_t)kvh * HD;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        if (a.kv_f32)
            ((float *)cache)[off + lane + 32 * i] = v[i];
        else
            ((__half *)cache)[off + lane + 32 * i] = __float2half_rn(v[i]);
    }
}

void engine_cu_pf_qk_store(const engine_cu_pf_qk_args *a, cudaStream_t stream) {
    const int warps = a->n * (a->n_head + 2 * a->n_kv);
    if (warps <= 0) return;
    const dim3 grid((unsigned)((warps + 7) / 8)), block(256);
    if (a->hd == 64)
        pf_qk_kernel<64><<<grid, block, 0, stream>>>(*a);
    else if (a->hd == 128)
        pf_qk_kernel<128><<<grid, block, 0, stream>>>(*a);
    else
        pf_qk_kernel<256><<<grid, block, 0, stream>>>(*a);
}

#define PF_QT 32 /* queries per attention block (8 threads each) */

/* Flash attention, SIMT: block (query tile, head), 256 threads = 32 queries x 8. Thread
 * (qi, kl) scores keys kl + 8 j of each key tile, and owns output dimensions kl + 8 u. */
template <int HD>
__global__ void __launch_bounds__(256) pf_att_kernel(engine_cu_pf_att_args a) {
    constexpr int KT = HD == 256 ? 16 : 32, KJ = KT / 8, OU = HD / 8;
    extern __shared__ __align__(16) float smf[];
    float *sQ = smf;                         /* [PF_QT][HD + 1] */
    float *sK = sQ + PF_QT * (HD + 1);       /* [KT][HD + 1] */
    float *sV = sK + KT * (HD + 1);          /* [KT][HD] */
    float *sP = sV + KT * HD;                /* [PF_QT][KT + 1] */
    const int tid = threadIdx.x, qi = tid >> 3, kl = tid & 7;
    const int q0 = (int)blockIdx.x * PF_QT, h = (int)blockIdx.y;
    const int group = a.n_head / a.n_kv, kvh = h / group, kv_dim = a.n_kv * HD;
    const int nq = min(PF_QT, a.n - q0);
    const float scale = 1.0f / sqrtf((float)HD);
    for (int idx = tid; idx < PF_QT * HD; idx += 256) {
        const int r = idx / HD, d = idx % HD;
        sQ[r * (HD + 1) + d] = r < nq ? a.q[((size_t)(q0 + r) * a.n_head + h) * HD + d] : 0.0f;
    }
    const int qpos = a.pos0 + q0 + min(qi, nq - 1); /* this thread's query position */
    const int n_keys = a.pos0 + q0 + nq;           /* keys 0 .. n_keys-1 serve the block */
    float o[OU], m = -INFINITY, l = 0.0f;
#pragma unroll
    for (int u = 0; u < OU; u++)
        o[u] = 0.0f;
    for (int k0 = 0; k0 < n_keys; k0 += KT) {
        __syncthreads(); /* the previous tile's K, V are consumed (and sQ is written) */
        for (int idx = tid; idx < KT * HD; idx += 256) {
            const int r = idx / HD, d = idx % HD, p = k0 + r;
            float kv = 0.0f, vv = 0.0f;
            if (p < n_keys) {
                const size_t off = (size_t)p * kv_dim + (size_t)kvh * HD + d;
                if (a.kv_f32) {
                    kv = ((const float *)a.k_cache)[off];
                    vv = ((const float *)a.v_cache)[off];
                } else {
                    kv = __half2float(((const __half *)a.k_cache)[off]);
                    vv = __half2float(((const __half *)a.v_cache)[off]);
                }
            }
            sK[r * (HD + 1) + d] = kv;
            sV[r * HD + d] = vv;
        }
        __syncthreads();
        float s[KJ], smax = -INFINITY;
#pragma unroll
        for (int j = 0; j < KJ; j++) {
            const int kj = kl + 8 * j;
            const float *qr = sQ + qi * (HD + 1), *kr = sK + kj * (HD + 1);
            float acc = 0.0f;
#pragma unroll 16
            for (int d = 0; d < HD; d++)
                acc = fmaf(qr[d], kr[d], acc);
            s[j] = k0 + kj <= qpos ? acc * scale : -INFINITY;
            smax = fmaxf(smax, s[j]);
        }
        smax = fmaxf(smax, __shfl_xor_sync(0xffffffffu, smax, 1));
        smax = fmaxf(smax, __shfl_xor_sync(0xffffffffu, smax, 2));
        smax = fmaxf(smax, __shfl_xor_sync(0xffffffffu, smax, 4));
        /* a tile wholly after this query (possible past the first tile, where m is already
         * finite: key 0 serves every query) leaves m, l and o as they are: corr 1, p 0 */
        const float mn = fmaxf(m, smax), corr = expf(m - mn);
        float ps = 0.0f;
#pragma unroll
        for (int j = 0; j < KJ; j++) {
            const float p = expf(s[j] - mn);
            sP[qi * (KT + 1) + kl + 8 * j] = p;
            ps += p;
        }
        ps += __shfl_xor_sync(0xffffffffu, ps, 1);
        ps += __shfl_xor_sync(0xffffffffu, ps, 2);
        ps += __shfl_xor_sync(0xffffffffu, ps, 4);
        l = l * corr + ps;
        m = mn;
        __syncwarp();
#pragma unroll
        for (int u = 0; u < OU; u++)
            o[u] *= corr;
        for (int kj = 0; kj < KT; kj++) {
            const float p = sP[qi * (KT + 1) + kj];
            const float *vr = sV + kj * HD + kl;
#pragma unroll
            for (int u = 0; u < OU; u++)
                o[u] = fmaf(p, vr[8 * u], o[u]);
        }
        __syncwarp();
    }
    if (qi < nq) {
        float *dst = a.out + ((size_t)(q0 + qi) * a.n_head + h) * HD;
        const float il = 1.0f / l;
#pragma unroll
        for (int u = 0; u < OU; u++)
            dst[kl + 8 * u] = o[u] * il;
    }
}

bool engine_cu_pf_att_tc_ok(int kv_f32, int hd) {
    return !kv_f32 && (hd == 64 || hd == 128);
}

#define PF_TQ 64 /* queries per tensor-core attention block: 4 warps of 16 */
#define PF_TK 64 /* keys per tile */

/* Flash attention on tensor cores (F16 cache): block (64 queries, head), warp w the queries
 * 16 w .. 16 w + 15. Lane (g = lane / 4, t = lane % 4) holds, as the mma fragments do, rows g
 * and g + 8 of its warp's 16 and columns 2 t, 2 t + 1 of each 8-column tile. The score tile
 * of two 8-key tiles is the P operand of the next product as it stands (rounded to F16). V is
 * stored transposed in shared memory so that its fragments are 32-bit loads. */
template <int HD>
__global__ void __launch_bounds__(128) pf_att_tc_kernel(engine_cu_pf_att_args a) {
    constexpr int SQ = HD + 8, KS = HD / 16, NT = PF_TK / 8, DT = HD / 8;
    extern __shared__ __align__(16) __half smh[];
    __half *sQ = smh;              /* [PF_TQ][SQ] */
    __half *sK = sQ + PF_TQ * SQ;  /* [PF_TK][SQ] */
    __half *sVt = sK + PF_TK * SQ; /* [HD][PF_TK + 8] */
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3;
    const int q0 = (int)blockIdx.x * PF_TQ, h = (int)blockIdx.y;
    const int kvh = h / (a.n_head / a.n_kv), kv_dim = a.n_kv * HD;
    const int nq = min(PF_TQ, a.n - q0), n_keys = a.pos0 + q0 + nq;
    const float scale = 1.0f / sqrtf((float)HD);
    const __half *kc = (const __half *)a.k_cache, *vc = (const __half *)a.v_cache;
    for (int idx = tid; idx < PF_TQ * HD; idx += 128) {
        const int r = idx / HD, d = idx % HD;
        sQ[r * SQ + d] = __float2half_rn(
            r < nq ? a.q[((size_t)(q0 + r) * a.n_head + h) * HD + d] : 0.0f);
    }
    __syncthreads();
    uint32_t qf[KS][4];
    {
        const __half *qr = sQ + (16 * w + g) * SQ + 2 * t;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            qf[ks][0] = *(const uint32_t *)(qr + 16 * ks);
            qf[ks][1] = *(const uint32_t *)(qr + 8 * SQ + 16 * ks);
            qf[ks][2] = *(const uint32_t *)(qr + 16 * ks + 8);
            qf[ks][3] = *(const uint32_t *)(qr + 8 * SQ + 16 * ks + 8);
        }
    }
    /* the positions of this lane's two query rows (rows past the block's queries repeat the
     * last one: finite scores, never stored) */
    const int qp0 = a.pos0 + q0 + min(16 * w + g, nq - 1);
    const int qp1 = a.pos0 + q0 + min(16 * w + g + 8, nq - 1);
    float o[DT][4], m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
#pragma unroll
    for (int i = 0; i < DT; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    for (int k0 = 0; k0 < n_keys; k0 += PF_TK) {
        __syncthreads(); /* the previous tile is consumed */
        engine_cu_att_tc_tile<HD, PF_TK>(kc, vc, sK, sVt, k0, n_keys, kv_dim, kvh, tid);
        __syncthreads();
        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
            const __half *kr = sK + (8 * nt + g) * SQ + 2 * t;
#pragma unroll
            for (int ks = 0; ks < KS; ks++)
                engine_cu_att_tc_mma(s[nt], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3],
                                     *(const uint32_t *)(kr + 16 * ks),
                                     *(const uint32_t *)(kr + 16 * ks + 8));
        }
        engine_cu_att_tc_softmax_pv<HD, PF_TK>(s, o, m0, m1, l0, l1, k0, qp0, qp1, scale, g, t,
                                               sVt);
    }
    engine_cu_att_tc_row_sums(l0, l1);
    const int r0 = 16 * w + g, r1 = r0 + 8;
    const float i0 = 1.0f / l0, i1 = 1.0f / l1;
#pragma unroll
    for (int i = 0; i < DT; i++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int d = 8 * i + 2 * t + e;
            if (r0 < nq) a.out[((size_t)(q0 + r0) * a.n_head + h) * HD + d] = o[i][e] * i0;
            if (r1 < nq) a.out[((size_t)(q0 + r1) * a.n_head + h) * HD + d] = o[i][2 + e] * i1;
        }
}

template <int HD> static void pf_att_tc_launch(const engine_cu_pf_att_args *a, cudaStream_t st) {
    const size_t smem =
        sizeof(__half) * ((size_t)(PF_TQ + PF_TK) * (HD + 8) + (size_t)HD * (PF_TK + 8));
    cudaFuncSetAttribute(pf_att_tc_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)smem);
    const dim3 grid((unsigned)((a->n + PF_TQ - 1) / PF_TQ), (unsigned)a->n_head);
    pf_att_tc_kernel<HD><<<grid, 128, smem, st>>>(*a);
}

template <int HD> static size_t pf_att_smem() {
    constexpr int KT = HD == 256 ? 16 : 32;
    return sizeof(float) * ((size_t)PF_QT * (HD + 1) + (size_t)KT * (HD + 1) + (size_t)KT * HD +
                            (size_t)PF_QT * (KT + 1));
}

template <int HD> static void pf_att_launch(const engine_cu_pf_att_args *a, cudaStream_t st) {
    const size_t smem = pf_att_smem<HD>();
    cudaFuncSetAttribute(pf_att_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)smem);
    const dim3 grid((unsigned)((a->n + PF_QT - 1) / PF_QT), (unsigned)a->n_head);
    pf_att_kernel<HD><<<grid, 256, smem, st>>>(*a);
}

void engine_cu_pf_attention(const engine_cu_pf_att_args *a, cudaStream_t stream) {
    if (a->n <= 0) return;
    if (a->tc && engine_cu_pf_att_tc_ok(a->kv_f32, a->hd)) {
        if (a->hd == 64)
            pf_att_tc_launch<64>(a, stream);
        else
            pf_att_tc_launch<128>(a, stream);
        return;
    }
    if (a->hd == 64)
        pf_att_launch<64>(a, stream);
    else if (a->hd == 128)
        pf_att_launch<128>(a, stream);
    else
        pf_att_launch<256>(a, stream);
}

/* split-K of the F32 router GEMM (the default; =1 with ..._NEXT=0; SPARK_CUDA_PREFILL_RSPLIT=N,
 * 1..PF_ROUTER_SPLIT_MAX, for A/B runs). Its N (tokens) x n_expert outputs fill few 64 x 64
 * tiles (Qwen3-30B-A3B, 512 tokens: 16), so the splits are what spread it over the GPU. */
#define PF_ROUTER_SPLIT 32
#define PF_ROUTER_SPLIT_MAX 32

/* PF_ROUTE_TOK tokens a block of 32 * PF_ROUTE_TOK threads: first the block sums each (token,
 * expert) logit's n_split (<= PF_ROUTER_SPLIT_MAX) split-K partials in split order, all of a
 * sum's loads in flight together, into shared memory; then a warp per token routes from there;
 * n_expert <= 256 (8 per lane). Until session 24 each lane summed its experts' partials itself,
 * a round trip per split (on the H200 the route grew from 8 to ~20 us a layer with 32 splits). */
#define PF_ROUTE_TOK 8
__global__ void __launch_bounds__(32 * PF_ROUTE_TOK)
    pf_route_kernel(const float *logits, int n_split, int n, int n_expert, int k, int norm_topk,
                    int32_t *ids, float *weights) {
    __shared__ float sl[PF_ROUTE_TOK][ENGINE_CU_PF_MAX_EXPERT];
    const int tb = (int)blockIdx.x * PF_ROUTE_TOK;
    const size_t zs = (size_t)n * n_expert; /* one split's partials */
    for (int idx = threadIdx.x; idx < PF_ROUTE_TOK * n_expert; idx += blockDim.x) {
        const int tt = idx / n_expert, e = idx - tt * n_expert;
        if (tb + tt >= n) break;
        const float *q = logits + (size_t)(tb + tt) * n_expert + e;
        float b[PF_ROUTER_SPLIT_MAX];
#pragma unroll
        for (int z = 1; z < PF_ROUTER_SPLIT_MAX; z++)
            b[z] = z < n_split ? q[(size_t)z * zs] : 0.0f;
        float v = q[0];
#pragma unroll
        for (int z = 1; z < PF_ROUTER_SPLIT_MAX; z++)
            if (z < n_split) v += b[z];
        sl[tt][e] = v;
    }
    __syncthreads();
    const int t = tb + (int)(threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (t >= n) return;
    const float *lg = sl[threadIdx.x >> 5];
    float p[8];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int e = lane + 32 * i;
        p[i] = e < n_expert ? lg[e] : -INFINITY;
        mx = fmaxf(mx, p[i]);
    }
    mx = engine_cu_warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        p[i] = lane + 32 * i < n_expert ? expf(p[i] - mx) : 0.0f;
        sum += p[i];
    }
    sum = engine_cu_warp_sum(sum);
    const float inv = 1.0f / sum;
#pragma unroll
    for (int i = 0; i < 8; i++)
        p[i] = lane + 32 * i < n_expert ? p[i] * inv : -1.0f; /* -1: not a candidate */
    float wsum = 0.0f, wk = 0.0f;
    for (int j = 0; j < k; j++) {
        float bv = -2.0f;
        int be = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (p[i] > bv) { /* strictly greater: the lowest id of this lane wins a tie */
                bv = p[i];
                be = lane + 32 * i;
            }
        engine_cu_warp_argmax(bv, be);
        if ((be & 31) == lane) p[be >> 5] = -1.0f;
        wsum += bv;
        if (lane == j) wk = bv;
        if (lane == 0) ids[(size_t)t * k + j] = be;
    }
    if (lane < k) weights[(size_t)t * k + lane] = norm_topk ? wk / wsum : wk;
}

void engine_cu_pf_route(const float *logits, int n_split, int n, int n_expert, int k,
                        int norm_topk, int32_t *ids, float *weights, cudaStream_t stream) {
    /* the kernel holds a sum's partials in PF_ROUTER_SPLIT_MAX registers */
    ENGINE_ASSERT(n_split >= 1 && n_split <= PF_ROUTER_SPLIT_MAX);
    if (n > 0)
        pf_route_kernel<<<(n + PF_ROUTE_TOK - 1) / PF_ROUTE_TOK, 32 * PF_ROUTE_TOK, 0, stream>>>(
            logits, n_split, n, n_expert, k, norm_topk, ids, weights);
}

int engine_cu_pf_max_tiles(int n_slots, int n_expert) {
    return (n_slots + ENGINE_CU_GEMM_BM - 1) / ENGINE_CU_GEMM_BM + n_expert;
}

/* One block: counts per expert; warp 0 scans them (PF_SORT_EPL consecutive experts a lane, the
 * lanes' sums of slots and of tiles scanned with shuffles) and writes the tile list in expert
 * order; then every slot takes its place (the order inside an expert does not matter: each row
 * of the grouped GEMM is computed alone). The scan was one thread's loop over the experts until
 * session 24 (20 us a layer for 128 experts on the H200, Nsight Compute; the same list). */
#define PF_SORT_EPL (ENGINE_CU_PF_MAX_EXPERT / 32)
__global__ void __launch_bounds__(1024)
    pf_sort_kernel(const int32_t *ids, int n_slots, int k, int n_expert, int32_t *sorted_tok,
                   int32_t *slot_pos, int32_t *tiles, int32_t *n_tiles) {
    __shared__ int cnt[ENGINE_CU_PF_MAX_EXPERT], off[ENGINE_CU_PF_MAX_EXPERT],
        cur[ENGINE_CU_PF_MAX_EXPERT];
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
        cnt[e] = 0;
        cur[e] = 0;
    }
    __syncthreads();
    for (int s = threadIdx.x; s < n_slots; s += blockDim.x)
        atomicAdd(&cnt[ids[s]], 1);
    __syncthreads();
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x, e0 = lane * PF_SORT_EPL;
        int c[PF_SORT_EPL], ns = 0, nt = 0;
#pragma unroll
        for (int i = 0; i < PF_SORT_EPL; i++) {
            c[i] = e0 + i < n_expert ? cnt[e0 + i] : 0;
            ns += c[i];
            nt += (c[i] + ENGINE_CU_GEMM_BM - 1) / ENGINE_CU_GEMM_BM;
        }
        int is = ns, it = nt; /* inclusive scans over the lanes */
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int vs = __shfl_up_sync(0xffffffffu, is, o),
                      vt = __shfl_up_sync(0xffffffffu, it, o);
            if (lane >= o) {
                is += vs;
                it += vt;
            }
        }
        int o = is - ns, t = it - nt;
#pragma unroll
        for (int i = 0; i < PF_SORT_EPL; i++) {
            if (e0 + i >= n_expert) break;
            off[e0 + i] = o;
            for (int r = 0; r < c[i]; r += ENGINE_CU_GEMM_BM, t++) {
                tiles[3 * t] = e0 + i;
                tiles[3 * t + 1] = o + r;
                tiles[3 * t + 2] = min(ENGINE_CU_GEMM_BM, c[i] - r);
            }
            o += c[i];
        }
        if (lane == 31) *n_tiles = it;
    }
    __syncthreads();
    for (int s = threadIdx.x; s < n_slots; s += blockDim.x) {
        const int e = ids[s], p = off[e] + atomicAdd(&cur[e], 1);
        sorted_tok[p] = s / k;
        slot_pos[s] = p;
    }
}

void engine_cu_pf_sort(const int32_t *ids, int n, int k, int n_expert, int32_t *sorted_tok,
                       int32_t *slot_pos, int32_t *tiles, int32_t *n_tiles, cudaStream_t stream) {
    pf_sort_kernel<<<1, 1024, 0, stream>>>(ids, n * k, k, n_expert, sorted_tok, slot_pos, tiles,
                                           n_tiles);
}

/* Token blockIdx.x's row of x += sum over its k slots of weight * d[slot] (fmaf in slot order,
 * from 0, then added to x: the CPU's order), four columns a thread where n_embd allows (16-byte
 * loads: the k rows' loads in flight together; 21 us a layer with one column a thread for 512
 * tokens of Qwen3-30B-A3B on the H200, session 24). */
__global__ void pf_combine_kernel(float *x, const float *d, const int32_t *slot_pos,
                                  const float *weights, int k, int n_embd) {
    const int t = blockIdx.x;
    float *xr = x + (size_t)t * n_embd;
    const int32_t *sp = slot_pos + (size_t)t * k;
    const float *wt = weights + (size_t)t * k;
    if ((n_embd & 3) == 0) {
        for (int i = threadIdx.x; i < n_embd / 4; i += blockDim.x) {
            float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
            for (int j = 0; j < k; j++) {
                const float w = wt[j];
                const float4 v = ((const float4 *)(d + (size_t)sp[j] * n_embd))[i];
                acc.x = fmaf(w, v.x, acc.x);
                acc.y = fmaf(w, v.y, acc.y);
                acc.z = fmaf(w, v.z, acc.z);
                acc.w = fmaf(w, v.w, acc.w);
            }
            float4 o = ((float4 *)xr)[i];
            o.x += acc.x;
            o.y += acc.y;
            o.z += acc.z;
            o.w += acc.w;
            ((float4 *)xr)[i] = o;
        }
        return;
    }
    for (int i = threadIdx.x; i < n_embd; i += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < k; j++)
            acc = fmaf(wt[j], d[(size_t)sp[j] * n_embd + i], acc);
        xr[i] += acc;
    }
}

void engine_cu_pf_combine(float *x, const float *d, const int32_t *slot_pos, const float *weights,
                          int n, int k, int n_embd, cudaStream_t stream) {
    if (n > 0)
        pf_combine_kernel<<<n, (n_embd & 3) == 0 ? 128 : 256, 0, stream>>>(x, d, slot_pos, weights,
                                                                           k, n_embd);
}

/* ---------------------------------------------------------------------------------------------
 * The pass
 * ------------------------------------------------------------------------------------------- */
#define PF_LOGIT_ROWS 32 /* rows of the output head per launch when every token's logits go out */

/* SPARK_CUDA_PREFILL_PROF=1: time the phases of every pass with events (the per-phase sums
 * are logged at INFO when the prefill object is freed). */
enum { PF_P_QKV, PF_P_ATT, PF_P_WO, PF_P_ROUTE, PF_P_UP, PF_P_DOWN, PF_P_HEAD, PF_P_N };
static const char *const pf_phase_name[PF_P_N] = {"embed+norm+qkv", "rope+attention", "wo",
                                                  "router+route+sort", "gate/up", "down+combine",
                                                  "head"};

struct engine_cuda_prefill {
    engine_cuda_session *s;
    int prof;
    int next;   /* tensor-core attention, split-K router (SPARK_CUDA_PREFILL_NEXT=0: off) */
    int ksplit; /* router GEMM splits */
    /* SPARK_CUDA_PREFILL_GEMM (words, for A/B runs): "legacy" the first GEMM kernels, "tile64"
     * 64-row tiles in the grouped expert GEMMs (default 32), "nofuse" q, k, v as three
     * launches and gate, up as two (default: one launch each where their types match),
     * "pfl1" the next step's weight blocks prefetched into L1 (default L2), "nopipe" the
     * unstaged kernels for every type (default: the staged cp.async ones for Q4_K / Q5_K and
     * Q8_0 / Q4_0), "nopipe8" not for Q8_0 / Q4_0, "pipe6" for Q6_K too, "wide" the 8-warp
     * 64 x 128 tiles in the grouped expert GEMMs (one block per expert tile), "wided" in the
     * dense ones too, "svec" the scales in shared memory in the warps' fragment order (16-byte
     * loads), empty 16-row fragments skipped, 4 blocks per SM (the wide tiles: the first two),
     * "direct" (the grouped expert GEMMs only) svec with the staged Q4_K / Q5_K products
     * reading their weight fragments from the staged raw bytes (all of these: the default's
     * bits), "splitk" the dense
     * products (q, k,
     * v; wo) split along K where the launch fills less than whole waves of the GPU (up to 4
     * splits, their partial sums in the free gate/up buffers; other rounding) */
    int gemm_legacy, gemm_tile_rows, gemm_nofuse, gemm_pfl1, gemm_pipe, gemm_wide, gemm_wided;
    int gemm_svec, gemm_direct, gemm_ksplit, gemm_ksplit_narrow, gemm_wo_split, n_sm;
    int gemm_kint;      /* the grouped direct Q4_K / Q5_K products in the int superblock order
                         * (engine_cu_gemm_args.kint; other rounding than "nokint"); "kint3" with
                         * registers for 3 blocks an SM */
    int gemm_kintd;     /* the dense Q4_K / Q5_K products as well ("nokintd": not) */
    int gemm_kint6;     /* the Q6_K products too ("nokint6": not) */
    int gemm_t32d;      /* "t32d": the other dense products in 32-row tiles too (A/B runs) */
    size_t kpart_bytes; /* g and u: the split-K buffer outside the FFN phase */
    cudaEvent_t *ev; /* [2 + 6 * n_layer] */
    int *ev_cat, n_ev;
    double prof_ms[PF_P_N];
    long prof_tokens;
    engine_cuda_model_view mv;
    engine_cuda_session_view sv;
    engine_cuda_layer_view *lv; /* [n_layer] */
    int32_t max_tokens;
    uint8_t *mem;
    size_t bytes;
    int32_t *tok, *ids, *sorted_tok, *slot_pos, *tiles, *n_tiles;
    float *x, *q, *k, *v, *att, *router, *wts, *g, *u, *d, *logits, *xrows;
    void *xbuf; /* prepared activations */
    size_t xbuf_bytes;
};

typedef struct {
    size_t tok, ids, sorted, slot, tiles, ntiles, x, q, kv, att, router, wts, g, d, logits, xrows,
        xbuf, total;
} pf_layout;

static size_t al256(size_t n) {
    return (n + 255) & ~(size_t)255;
}

static pf_layout pf_plan(const engine_model *m, int32_t n) {
    const engine_hparams *hp = &m->hp;
    const size_t hd = hp->head_dim_k, qd = hp->n_head * hd, kvd = hp->n_head_kv * hd;
    const size_t k = hp->n_expert ? hp->n_expert_used : 1;
    const size_t nff = hp->n_expert ? hp->n_ff_exp : hp->n_ff;
    const size_t slots = (size_t)n * k, lr = std::min<size_t>((size_t)n, PF_LOGIT_ROWS);
    pf_layout z;
    z.tok = al256(sizeof(int32_t) * n);
    z.ids = al256(sizeof(int32_t) * slots);
    z.sorted = z.ids;
    z.slot = z.ids;
    z.tiles = al256(sizeof(int32_t) * 3 *
                    (size_t)engine_cu_pf_max_tiles((int)slots, (int)std::max(1u, hp->n_expert)));
    z.ntiles = 256;
    z.x = al256(sizeof(float) * n * hp->n_embd);
    z.q = al256(sizeof(float) * n * qd);
    z.kv = al256(sizeof(float) * n * kvd);
    z.att = z.q;
    z.router = al256(sizeof(float) * PF_ROUTER_SPLIT_MAX * n * std::max(1u, hp->n_expert));
    z.wts = al256(sizeof(float) * slots);
    z.g = al256(sizeof(float) * slots * nff);
    z.d = hp->n_expert ? al256(sizeof(float) * slots * hp->n_embd) : 0;
    z.logits = al256(sizeof(float) * lr * hp->n_vocab);
    z.xrows = al256(sizeof(float) * lr * hp->n_embd);
    /* the largest activation a GEMM prepares, in its largest form (F32) */
    size_t big = std::max({(size_t)n * hp->n_embd, (size_t)n * qd, slots * nff});
    z.xbuf = al256(4 * big) + 3 * 256;
    z.total = z.tok + z.ids + z.sorted + z.slot + z.tiles + z.ntiles + z.x + z.q + 2 * z.kv +
              z.att + z.router + z.wts + 2 * z.g + z.d + z.logits + z.xrows + z.xbuf;
    return z;
}

extern "C" size_t engine_cuda_prefill_bytes(const engine_cuda_model *cm, int32_t max_tokens) {
    engine_cuda_model_view mv;
    engine_cuda_model_view_get(cm, &mv);
    return pf_plan(mv.m, max_tokens).total;
}

static int pf_err(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    cudaGetLastError();
    return engine_err(e == cudaErrorMemoryAllocation ? ENGINE_ENOMEM : ENGINE_EINTERNAL,
                      "CUDA %s: %s", what, cudaGetErrorString(e));
}

int engine_cu_pf_err(cudaError_t e, const char *what) {
    return pf_err(e, what);
}

void engine_cu_pf_prof_add(const cudaEvent_t *ev, const int *cat, int n_mark, double *ms) {
    for (int i = 1; i < n_mark; i++) {
        float t = 0.0f;
        if (cudaEventElapsedTime(&t, ev[i - 1], ev[i]) == cudaSuccess) ms[cat[i]] += t;
    }
}

void engine_cu_pf_prof_log(const char *what, long tokens, const double *ms,
                           const char *const *names, int n) {
    double tot = 0;
    char line[640];
    int o = 0;
    for (int i = 0; i < n; i++)
        tot += ms[i];
    for (int i = 0; i < n && o < (int)sizeof line; i++)
        o += snprintf(line + o, sizeof line - (size_t)o, "%s%s %.1f ms (%.0f%%)", i ? ", " : "",
                      names[i], ms[i], 100.0 * ms[i] / (tot + 1e-9));
    engine_log(ENGINE_LOG_INFO, "%s profile: %ld tokens, %.1f ms (%.0f tok/s): %s", what, tokens,
               tot, 1e3 * (double)tokens / (tot + 1e-9), line);
}

void engine_cu_pf_prof_free(cudaEvent_t *ev, int n_ev, int *cat) {
    for (int i = 0; ev && i < n_ev; i++)
        if (ev[i]) cudaEventDestroy(ev[i]);
    free(ev);
    free(cat);
}

static int pf_check_w(const engine_model *m, const engine_cuda_wview *w, const char *what,
                      int layer) {
    if (!w->d) return 0;
    if (!engine_cu_gemm_ok(w->type, w->cols))
        return engine_err(ENGINE_EUNSUPPORTED,
                          "%s: blk.%d.%s (%s, rows of %d) has no CUDA prefill GEMM", m->path, layer,
                          what, engine_type_name((engine_type)w->type), w->cols);
    return 0;
}

/* The default chunk: 4x the rows per expert of 512-token chunks (pp4096 on the H200: +36% with
 * the tensor-core kernels), ~390 MB of buffers for Qwen3-30B-A3B; engine_cuda_prefill_new
 * halves it (down to PF_CHUNK_MIN) where the buffers would take more than 1/16 of the free
 * device memory. */
#define PF_CHUNK_DEFAULT 2048
#define PF_CHUNK_MIN 512

extern "C" int32_t engine_cuda_prefill_chunk(void) {
    const char *e = getenv("SPARK_CUDA_PREFILL_CHUNK");
    const long v = e ? strtol(e, NULL, 10) : 0;
    return v >= 16 && v <= 8192 ? (int32_t)v : PF_CHUNK_DEFAULT;
}

extern "C" void engine_cuda_prefill_free(engine_cuda_prefill *p) {
    if (!p) return;
    cudaSetDevice(p->mv.device);
    if (p->prof && p->prof_tokens > 0)
        engine_cu_pf_prof_log("cuda prefill", p->prof_tokens, p->prof_ms, pf_phase_name, PF_P_N);
    engine_cu_pf_prof_free(p->ev, p->n_ev, p->ev_cat);
    cudaFree(p->mem);
    free(p->lv);
    free(p);
}

/* The pass's buffers over the KV of view sv (a session's, or the batched pass's pool). */
int engine_cu_pf_new_view(engine_cuda_prefill **out, engine_cuda_model *cm, engine_cuda_session *s,
                          const engine_cuda_session_view *svp, int32_t max_tokens) {
    *out = NULL;
    engine_cuda_prefill *p = NULL;
    int rc = 0;
    size_t free_b = 0, total_b = 0;
    uint8_t *b;
    engine_cuda_model_view mv;
    engine_cuda_model_view_get(cm, &mv);
    const engine_model *m = mv.m;
    const engine_hparams *hp = &m->hp;
    const engine_cuda_session_view sv = *svp;
    /* a session's chunk lies inside its context; a batched pass's tokens belong to many
     * sequences, each bounded by the pool's positions (checked per pass) */
    if (max_tokens < 1 || (s && max_tokens > sv.n_ctx))
        return engine_err(ENGINE_EINVAL, "cuda prefill: chunk of %d tokens (context %d)",
                          max_tokens, sv.n_ctx);
    if (hp->n_expert > ENGINE_CU_PF_MAX_EXPERT)
        return engine_err(ENGINE_EUNSUPPORTED, "%s: %u experts (the CUDA prefill takes at most %d)",
                          m->path, hp->n_expert, ENGINE_CU_PF_MAX_EXPERT);
    if (hp->n_expert && hp->n_expert_used > 32)
        return engine_err(ENGINE_EUNSUPPORTED, "%s: %u experts per token (the CUDA prefill "
                          "takes at most 32)", m->path, hp->n_expert_used);
    p = (engine_cuda_prefill *)calloc(1, sizeof *p);
    if (!p) return engine_err(ENGINE_ENOMEM, "out of memory");
    p->s = s;
    p->mv = mv;
    p->sv = sv;
    p->max_tokens = max_tokens;
    p->lv = (engine_cuda_layer_view *)calloc(hp->n_layer, sizeof *p->lv);
    if (!p->lv) {
        rc = engine_err(ENGINE_ENOMEM, "out of memory");
        goto done;
    }
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        engine_cuda_layer_view *v = &p->lv[l];
        engine_cuda_layer_view_get(cm, (int)l, v);
#define PF_CHECK(f)                                                                                \
    if ((rc = pf_check_w(m, &v->f, #f, (int)l))) goto done;
        PF_CHECK(wq) PF_CHECK(wk) PF_CHECK(wv) PF_CHECK(wo) PF_CHECK(gate_inp)
        PF_CHECK(gate_exps) PF_CHECK(up_exps) PF_CHECK(down_exps) PF_CHECK(ffn_gate)
        PF_CHECK(ffn_up) PF_CHECK(ffn_down)
#undef PF_CHECK
    }
    if (!engine_cu_gemm_ok(mv.output.type, mv.output.cols)) {
        rc = engine_err(ENGINE_EUNSUPPORTED, "%s: output (%s) has no CUDA prefill GEMM", m->path,
                        engine_type_name((engine_type)mv.output.type));
        goto done;
    }
    {
        const pf_layout z = pf_plan(m, max_tokens);
        if ((rc = pf_err(cudaSetDevice(mv.device), "cudaSetDevice"))) goto done;
        if ((rc = pf_err(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo"))) goto done;
        if ((rc = pf_err(cudaDeviceGetAttribute(&p->n_sm, cudaDevAttrMultiProcessorCount,
                                                mv.device),
                         "cudaDeviceGetAttribute")))
            goto done;
        engine_log(ENGINE_LOG_INFO, "cuda: prefill buffers %.1f MiB (chunks of %d tokens); "
                   "%.2f GB free", (double)z.total / 1048576.0, max_tokens, (double)free_b / 1e9);
        if (z.total + ((size_t)64 << 20) > free_b) {
            rc = engine_err(ENGINE_ENOMEM, "cuda prefill of %d-token chunks needs %.2f GB of GPU "
                            "memory but %.2f GB are free", max_tokens, (double)z.total / 1e9,
                            (double)free_b / 1e9);
            goto done;
        }
        if ((rc = pf_err(cudaMalloc((void **)&p->mem, z.total), "cudaMalloc (prefill)")))
            goto done;
        p->bytes = z.total;
        b = p->mem;
#define PF_CARVE(field, size, T)                                                                   \
    p->field = (T *)b;                                                                             \
    b += z.size;
        PF_CARVE(tok, tok, int32_t)
        PF_CARVE(ids, ids, int32_t)
        PF_CARVE(sorted_tok, sorted, int32_t)
        PF_CARVE(slot_pos, slot, int32_t)
        PF_CARVE(tiles, tiles, int32_t)
        PF_CARVE(n_tiles, ntiles, int32_t)
        PF_CARVE(x, x, float)
        PF_CARVE(q, q, float)
        PF_CARVE(k, kv, float)
        PF_CARVE(v, kv, float)
        PF_CARVE(att, att, float)
        PF_CARVE(router, router, float)
        PF_CARVE(wts, wts, float)
        PF_CARVE(g, g, float)
        PF_CARVE(u, g, float)
        PF_CARVE(d, d, float)
        PF_CARVE(logits, logits, float)
        PF_CARVE(xrows, xrows, float)
        PF_CARVE(xbuf, xbuf, void)
#undef PF_CARVE
        p->xbuf_bytes = z.xbuf;
        p->kpart_bytes = 2 * z.g; /* g, u carved one after the other */
        ENGINE_ASSERT((size_t)(b - p->mem) == z.total);
    }
    {
        const char *e = getenv("SPARK_CUDA_PREFILL_PROF");
        p->prof = e && e[0] == '1';
        e = getenv("SPARK_CUDA_PREFILL_NEXT"); /* default on; =0: the SIMT attention path */
        p->next = !(e && e[0] == '0');
        p->ksplit = p->next ? PF_ROUTER_SPLIT : 1;
        e = getenv("SPARK_CUDA_PREFILL_RSPLIT");
        if (p->next && e && atoi(e) >= 1) p->ksplit = std::min(atoi(e), PF_ROUTER_SPLIT_MAX);
        e = getenv("SPARK_CUDA_PREFILL_GEMM");
        p->gemm_legacy = e && strstr(e, "legacy");
        p->gemm_tile_rows = e && strstr(e, "tile64") ? 64 : 0;
        p->gemm_nofuse = e && strstr(e, "nofuse");
        p->gemm_pfl1 = e && strstr(e, "pfl1");
        /* the staged kernels by default since session 5 (H200: pp512 of a 12-block cut 34,055
         * -> 38,374 tok/s, the same bits: test_cuda_batch); "nopipe" the unstaged ones */
        /* Q8_0 / Q4_0 staged too since session 25 (H200, full Qwen3-30B-A3B Q8_0: pp512
         * 10,929-10,981 -> 11,774 tok/s, the same bits); "nopipe8" not those */
        p->gemm_pipe = engine_cu_env_word(e, "nopipe")
                           ? 0
                           : ENGINE_CU_GEMM_PIPE_K45 |
                                 (engine_cu_env_word(e, "nopipe8") ? 0 : ENGINE_CU_GEMM_PIPE_Q8);
        if (engine_cu_env_word(e, "pipe6")) p->gemm_pipe |= ENGINE_CU_GEMM_PIPE_Q6;
        p->gemm_wided = e && strstr(e, "wided");
        p->gemm_ksplit = e && strstr(e, "splitk") ? 4 : 1;
        p->gemm_ksplit_narrow = e && strstr(e, "nonarrow") ? 1 : 4; /* pf_ksplit */
        /* SPARK_CUDA_PREFILL_WOSPLIT=N: wo split along K into N whatever the tokens (A/B runs;
         * unset: PF_WO_SPLIT_KINT where wo takes the int superblock order, else 1) */
        const char *ws = getenv("SPARK_CUDA_PREFILL_WOSPLIT");
        p->gemm_wo_split = ws && atoi(ws) >= 1 ? std::min(atoi(ws), 8) : 0;
        p->gemm_svec = e && strstr(e, "svec");
        /* the grouped expert GEMMs read their Q4_K / Q5_K fragments straight from the staged
         * raw blocks by default (session 6, H200, full Qwen3-30B-A3B Q4_K_M: pp512 10,569.2 ->
         * 10,731.4 tok/s, the same bits: test_cuda_batch); "nodirect" the decoded-tile path */
        p->gemm_direct = !(e && strstr(e, "nodirect"));
        p->gemm_wide = p->gemm_wided || (e && strstr(e, "wide"));
        /* the grouped Q4_K / Q5_K products in the int superblock order by default (session
         * 25, H200, full Qwen3-30B-A3B Q4_K_M: pp512 11,561-11,572 -> 12,768-12,883 tok/s);
         * "nokint" the F32 epilogue of every 32-column product; the dense Q4_K / Q5_K
         * products too (32-row tiles, fragments from the staged bytes: pp512 12,750-12,785 ->
         * 12,845-12,855, pp4096 13,250 -> 13,834), "nokintd" not those */
        p->gemm_kint = engine_cu_env_word(e, "nokint") ? 0 : engine_cu_env_word(e, "kint3") ? 3 : 1;
        p->gemm_kintd = !engine_cu_env_word(e, "nokintd");
        /* the Q6_K products too (32-row tiles, SV scales; session 25: pp512 13,181-13,188 ->
         * 13,517-13,526 tok/s, pp4096 13,798 -> 14,056); "nokint6" not those */
        p->gemm_kint6 = !engine_cu_env_word(e, "nokint6");
        p->gemm_t32d = engine_cu_env_word(e, "t32d");
    }
    if (p->prof) {
        const int n_ev = 2 + 6 * (int)hp->n_layer;
        p->ev = (cudaEvent_t *)calloc((size_t)n_ev, sizeof(cudaEvent_t));
        p->ev_cat = (int *)calloc((size_t)n_ev, sizeof(int));
        if (!p->ev || !p->ev_cat) {
            rc = engine_err(ENGINE_ENOMEM, "out of memory");
            goto done;
        }
        p->n_ev = n_ev;
        for (int i = 0; i < n_ev; i++)
            if ((rc = pf_err(cudaEventCreate(&p->ev[i]), "cudaEventCreate"))) goto done;
    }
    *out = p;
    p = NULL;
done:
    engine_cuda_prefill_free(p);
    return rc;
}

extern "C" int engine_cuda_prefill_new(engine_cuda_prefill **out, engine_cuda_model *cm,
                                       engine_cuda_session *s, int32_t max_tokens) {
    engine_cuda_session_view sv;
    engine_cuda_session_view_get(s, &sv);
    /* without SPARK_CUDA_PREFILL_CHUNK, chunks above PF_CHUNK_MIN shrink to fit 1/16 of the
     * free memory (the rest stays for KV caches and other sessions) */
    size_t free_b = 0, total_b = 0;
    engine_cuda_model_view mv;
    engine_cuda_model_view_get(cm, &mv);
    if (!getenv("SPARK_CUDA_PREFILL_CHUNK") && max_tokens > PF_CHUNK_MIN) {
        if (cudaSetDevice(mv.device) == cudaSuccess &&
            cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
            while (max_tokens > PF_CHUNK_MIN && pf_plan(mv.m, max_tokens).total > free_b / 16)
                max_tokens = std::max(PF_CHUNK_MIN, max_tokens / 2);
        else
            cudaGetLastError(); /* engine_cu_pf_new_view reports it */
    }
    return engine_cu_pf_new_view(out, cm, s, &sv, max_tokens);
}

/* The prepared form of X last made (so that q, k and v, or gate and up, share one). */
typedef struct {
    const float *x;
    const float *norm;
    int form, m, cols;
    engine_cu_gx gx;
} pf_prep_cache;

static const engine_cu_gx *pf_prep(engine_cuda_prefill *p, pf_prep_cache *c, int type,
                                   const float *x, const float *g, int m, int cols,
                                   const float *norm_w, cudaStream_t st) {
    const int form = engine_cu_gemm_xform(type);
    if (!g && c->x == x && c->norm == norm_w && c->form == form && c->m == m && c->cols == cols)
        return &c->gx;
    engine_cu_gemm_prep(&c->gx, p->xbuf, form, m, cols, x, g, cols, norm_w,
                        p->mv.m->hp.rms_norm_eps, st);
    c->x = g ? nullptr : x;
    c->norm = norm_w;
    c->form = form;
    c->m = m;
    c->cols = cols;
    return &c->gx;
}

/* The GEMM of weight w on prepared X into y (row stride ldy). Dense: X rows 0 .. m-1. Grouped:
 * the tiles of the last sort, X rows gathered through x_idx (NULL: the sorted slot itself),
 * n_slots slots. ksplit > 1 (F32 weights, dense): partial sums per split, y holding ksplit
 * blocks of m rows. */
static void pf_gemm_args(const engine_cuda_prefill *p, bool grouped, const engine_cuda_wview *w,
                         const engine_cu_gx *gx, int m, const int32_t *x_idx, float *y, int ldy,
                         int accumulate, int ksplit, engine_cu_gemm_args *out) {
    engine_cu_gemm_args &a = *out;
    memset(&a, 0, sizeof a);
    engine_cu_args_weight(a, w);
    a.x = *gx;
    a.m = m;
    a.x_idx = x_idx;
    a.y = y;
    a.ldy = ldy;
    a.accumulate = accumulate;
    a.ksplit = ksplit;
    a.legacy = p->gemm_legacy;
    a.prefetch_l1 = p->gemm_pfl1;
    a.pipeline = p->gemm_pipe;
    a.wide = grouped ? p->gemm_wide : p->gemm_wided;
    a.svec = p->gemm_svec;
    /* dense: call 3 measured it slower; other types than Q4_K / Q5_K would only get the SV
     * scale layout with it (gemm.cu), which lost on its own (session 6 call 3: -2.9%), and the
     * Q8_0 model's pp512 was 9,650.6 tok/s with it (closing call B) against 10,498.0 without
     * (session 5) */
    a.direct = grouped && (a.type == ENGINE_TYPE_Q4_K || a.type == ENGINE_TYPE_Q5_K)
                   ? p->gemm_direct
                   : 0;
    const bool k45 = a.type == ENGINE_TYPE_Q4_K || a.type == ENGINE_TYPE_Q5_K;
    if (!grouped && k45 && p->gemm_kint && p->gemm_kintd && !a.wide && !a.legacy &&
        (a.pipeline & ENGINE_CU_GEMM_PIPE_K45)) {
        a.direct = 1;
        a.tile_rows = 32;
    }
    a.kint = a.direct && !a.wide ? p->gemm_kint : 0;
    if (a.type == ENGINE_TYPE_Q6_K && p->gemm_kint && p->gemm_kint6 && !a.wide && !a.legacy &&
        !(a.pipeline & ENGINE_CU_GEMM_PIPE_Q6)) {
        a.tile_rows = 32;
        a.kint = p->gemm_kint;
    }
    if (grouped) {
        a.tiles = p->tiles;
        a.n_tiles = p->n_tiles;
        a.max_tiles = engine_cu_pf_max_tiles(m, (int)p->mv.m->hp.n_expert);
        a.tile_rows = p->gemm_tile_rows;
    } else if (p->gemm_t32d && !a.tile_rows) {
        a.tile_rows = 32;
    }
}

/* Split-K of a dense tensor-core product (its parts all set; q, k, v and wo only, whose phases
 * leave g and u free; the partial sums added in split order by one more launch):
 * - "splitk": into the count (<= gemm_ksplit) that fills the GPU's block slots best,
 *   ceil(blocks * ks / slots) / ks waves of a whole product's time, where that saves at least a
 *   tenth and the buffer holds it (the count depends on the tokens of the pass);
 * - by default, a narrow product (at most PF_NARROW_ROWS weight rows in the launch: a v or k
 *   of another type than q, launched alone) into gemm_ksplit_narrow splits whatever the tokens,
 *   so that a token's results still do not depend on the chunking. Qwen3-30B-A3B Q4_K_M's Q6_K
 *   v: 8 column tiles, 64 blocks at 512 tokens, 41 us of a ~1 ms layer on the H200 (session 24,
 *   Nsight Compute). "nonarrow" leaves them whole. */
#define PF_NARROW_ROWS 512
/* wo's split along K where it takes the int superblock order (32 x 128 tiles, 4 blocks an SM:
 * Qwen3-30B-A3B's 2048 x 4096 wo is 256 blocks at 512 tokens, half the H200's slots; session
 * 25: pp512 12,845-12,855 -> 13,126 tok/s with 2, 13,017 with 3) */
#define PF_WO_SPLIT_KINT 2
static void pf_ksplit(const engine_cuda_prefill *p, engine_cu_gemm_args *a, int fixed = 1) {
    const unsigned blocks = engine_cu_gemm_blocks(a);
    if (a->tiles || blocks == 0) return;
    int best = 1;
    if (p->gemm_ksplit > 1) {
        const double slots = (double)p->n_sm * (a->wide ? 2 : 3);
        double bt = ceil(blocks / slots);
        for (int ks = 2; ks <= p->gemm_ksplit; ks++) {
            const double t = ceil(blocks * (double)ks / slots) / ks;
            if (t < 0.9 * bt) {
                best = ks;
                bt = t;
            }
        }
    } else if (p->gemm_ksplit_narrow > 1) {
        int rows = a->rows;
        for (int j = 0; j < a->n_more; j++)
            rows += a->more[j].rows;
        if (rows <= PF_NARROW_ROWS) best = p->gemm_ksplit_narrow;
    }
    if (p->gemm_ksplit <= 1 && best <= 1 && fixed > 1) best = fixed;
    if (best <= 1) return;
    a->kpart = p->g;
    for (a->ksplit = best; a->ksplit > 1; a->ksplit--)
        if (engine_cu_gemm_kpart_bytes(a) <= p->kpart_bytes) return;
    a->kpart = NULL;
    a->ksplit = 1;
}

static void pf_gemm_run(const engine_cuda_prefill *p, bool grouped, const engine_cuda_wview *w,
                        const engine_cu_gx *gx, int m, const int32_t *x_idx, float *y, int ldy,
                        int accumulate, int ksplit, cudaStream_t st) {
    engine_cu_gemm_args a;
    pf_gemm_args(p, grouped, w, gx, m, x_idx, y, ldy, accumulate, ksplit, &a);
    engine_cu_gemm(&a, st);
}

static void pf_gemm(const engine_cuda_prefill *p, const engine_cuda_wview *w,
                    const engine_cu_gx *gx, int m, float *y, int ldy, int accumulate,
                    cudaStream_t st) {
    pf_gemm_run(p, false, w, gx, m, NULL, y, ldy, accumulate, 1, st);
}

static void pf_gemm_grouped(const engine_cuda_prefill *p, const engine_cuda_wview *w,
                            const engine_cu_gx *gx, const int32_t *x_idx, int n_slots, float *y,
                            cudaStream_t st) {
    pf_gemm_run(p, true, w, gx, n_slots, x_idx, y, w->rows, 0, 1, st);
}

/* The gate and up expert GEMMs of the normalised x (n tokens, k slots each, sorted) in one
 * launch where their shapes and types match (gemm.cuh .more), else two. */
static void pf_gate_up(engine_cuda_prefill *p, const engine_cuda_layer_view *ly, int n, int k,
                       pf_prep_cache *pc, cudaStream_t st) {
    const engine_cuda_wview *g = &ly->gate_exps, *u = &ly->up_exps;
    const int emb = (int)p->mv.m->hp.n_embd, n_slots = n * k;
    const engine_cu_gx *gx = pf_prep(p, pc, g->type, p->x, NULL, n, emb, ly->ffn_norm, st);
    engine_cu_gemm_args a;
    pf_gemm_args(p, true, g, gx, n_slots, p->sorted_tok, p->g, g->rows, 0, 1, &a);
    const bool fuse = !p->gemm_nofuse && u->type == g->type && u->rows == g->rows &&
                      u->cols == g->cols && u->row_bytes == g->row_bytes &&
                      g->type != ENGINE_TYPE_F32;
    if (fuse) {
        a.n_more = 1;
        a.more[0].w = (const uint8_t *)u->d;
        a.more[0].y = p->u;
        a.more[0].rows = u->rows;
        a.more[0].ldy = u->rows;
    }
    engine_cu_gemm(&a, st);
    if (!fuse) { /* after the gate's launch: a prep may rewrite the X buffer */
        gx = pf_prep(p, pc, u->type, p->x, NULL, n, emb, ly->ffn_norm, st);
        pf_gemm_grouped(p, u, gx, p->sorted_tok, n_slots, p->u, st);
    }
}

/* q, k and v of the normalised x: the narrow k and v (a few dozen column tiles each) share the
 * launch of q where their types match (gemm.cuh .more), else one launch each after it. */
static void pf_qkv(engine_cuda_prefill *p, const engine_cuda_layer_view *ly, int n,
                   cudaStream_t st, pf_prep_cache *pc) {
    const engine_hparams *hp = &p->mv.m->hp;
    const int emb = (int)hp->n_embd, qd = (int)(hp->n_head * hp->head_dim_k),
              kvd = (int)(hp->n_head_kv * hp->head_dim_k);
    const engine_cuda_wview *ws[3] = {&ly->wq, &ly->wk, &ly->wv};
    float *ys[3] = {p->q, p->k, p->v};
    const int lds[3] = {qd, kvd, kvd};
    bool own[3] = {false, true, true};
    const engine_cu_gx *gx = pf_prep(p, pc, ly->wq.type, p->x, NULL, n, emb, ly->attn_norm, st);
    engine_cu_gemm_args a;
    pf_gemm_args(p, false, &ly->wq, gx, n, NULL, p->q, qd, 0, 1, &a);
    for (int j = 1; j < 3; j++) {
        const engine_cuda_wview *w = ws[j];
        if (p->gemm_nofuse || w->type != a.type || w->cols != a.cols ||
            w->row_bytes != a.row_bytes || a.type == ENGINE_TYPE_F32)
            continue;
        engine_cu_gemm_part *pt = &a.more[a.n_more++];
        pt->w = (const uint8_t *)w->d;
        pt->y = ys[j];
        pt->rows = w->rows;
        pt->ldy = lds[j];
        own[j] = false;
    }
    pf_ksplit(p, &a);
    engine_cu_gemm(&a, st);
    for (int j = 1; j < 3; j++) /* after q's launch: a prep may rewrite the X buffer */
        if (own[j]) {
            gx = pf_prep(p, pc, ws[j]->type, p->x, NULL, n, emb, ly->attn_norm, st);
            pf_gemm_args(p, false, ws[j], gx, n, NULL, ys[j], lds[j], 0, 1, &a);
            pf_ksplit(p, &a);
            engine_cu_gemm(&a, st);
        }
}

/* One chunk of n <= max_tokens tokens at pos (pg NULL), or the batched pass's tokens (pg). */
int engine_cu_pf_chunk(engine_cuda_prefill *p, const int32_t *tokens, int32_t n, int32_t pos,
                       float *logits_all, float *logits_last, const engine_cu_pf_paged *pg) {
    const engine_model *m = p->mv.m;
    const engine_hparams *hp = &m->hp;
    cudaStream_t st = (cudaStream_t)p->sv.stream;
    const int emb = (int)hp->n_embd, hd = (int)hp->head_dim_k, nh = (int)hp->n_head,
              nkv = (int)hp->n_head_kv;
    const float eps = hp->rms_norm_eps;
    const bool moe = hp->arch == ENGINE_ARCH_QWEN3MOE;
    const int k = moe ? (int)hp->n_expert_used : 1;
    int rc, n_mark = 0;
#define PF_MARK(c)                                                                                 \
    do {                                                                                           \
        if (p->prof && n_mark < p->n_ev) {                                                         \
            cudaEventRecord(p->ev[n_mark], st);                                                    \
            p->ev_cat[n_mark++] = (c);                                                             \
        }                                                                                          \
    } while (0)
    pf_prep_cache pc;
    memset(&pc, 0, sizeof pc);
    pc.form = -1;
    if ((rc = pf_err(cudaMemcpyAsync(p->tok, tokens, sizeof(int32_t) * (size_t)n,
                                     cudaMemcpyHostToDevice, st),
                     "cudaMemcpyAsync (tokens)")))
        return rc;
    PF_MARK(-1);
    engine_cu_pf_embed((const uint8_t *)p->mv.tok_embd.d, p->mv.tok_embd.row_bytes,
                       p->mv.tok_embd.type, emb, p->tok, n, p->x, st);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const engine_cuda_layer_view *ly = &p->lv[l];
        const engine_cu_gx *gx;
        pf_qkv(p, ly, n, st, &pc);
        PF_MARK(PF_P_QKV);
        engine_cu_pf_qk_args qa = {p->q, p->k, p->v, ly->q_norm, ly->k_norm,
                                   (const float2 *)p->sv.rope, eps, p->sv.k_cache[l],
                                   p->sv.v_cache[l], p->sv.kv_f32, n, pos, nh, nkv, hd,
                                   pg ? pg->pos_of : NULL, pg ? pg->row_of : NULL};
        engine_cu_pf_qk_store(&qa, st);
        if (pg) {
            engine_cu_pg_att_args ga = {p->q, p->sv.k_cache[l], p->sv.v_cache[l], p->sv.kv_f32,
                                        n, nh, nkv, hd, pg->pos_of, pg->seq_of, pg->tables,
                                        pg->max_blocks, pg->block_size, p->att};
            engine_cu_pg_attention(&ga, st);
        } else {
            engine_cu_pf_att_args aa = {p->q, p->sv.k_cache[l], p->sv.v_cache[l], p->sv.kv_f32,
                                        n, pos, nh, nkv, hd, p->att, p->next};
            engine_cu_pf_attention(&aa, st);
        }
        PF_MARK(PF_P_ATT);
        gx = pf_prep(p, &pc, ly->wo.type, p->att, NULL, n, nh * hd, NULL, st);
        {
            engine_cu_gemm_args a;
            pf_gemm_args(p, false, &ly->wo, gx, n, NULL, p->x, emb, 1, 1, &a);
            pf_ksplit(p, &a, p->gemm_wo_split ? p->gemm_wo_split : a.kint ? PF_WO_SPLIT_KINT : 1);
            engine_cu_gemm(&a, st);
        }
        pc.x = NULL; /* x changed */
        PF_MARK(PF_P_WO);
        if (moe) {
            const int ne = (int)hp->n_expert, nff = ly->gate_exps.rows;
            gx = pf_prep(p, &pc, ly->gate_inp.type, p->x, NULL, n, emb, ly->ffn_norm, st);
            const int ksplit = ly->gate_inp.type == ENGINE_TYPE_F32 ? p->ksplit : 1;
            pf_gemm_run(p, false, &ly->gate_inp, gx, n, NULL, p->router, ne, 0, ksplit, st);
            engine_cu_pf_route(p->router, ksplit, n, ne, k, hp->norm_topk_prob, p->ids, p->wts,
                               st);
            engine_cu_pf_sort(p->ids, n, k, ne, p->sorted_tok, p->slot_pos, p->tiles,
                              p->n_tiles, st);
            PF_MARK(PF_P_ROUTE);
            pf_gate_up(p, ly, n, k, &pc, st);
            PF_MARK(PF_P_UP);
            gx = pf_prep(p, &pc, ly->down_exps.type, p->u, p->g, n * k, nff, NULL, st);
            pf_gemm_grouped(p, &ly->down_exps, gx, NULL, n * k, p->d, st);
            engine_cu_pf_combine(p->x, p->d, p->slot_pos, p->wts, n, k, emb, st);
            PF_MARK(PF_P_DOWN);
        } else {
            const int nff = ly->ffn_gate.rows;
            gx = pf_prep(p, &pc, ly->ffn_gate.type, p->x, NULL, n, emb, ly->ffn_norm, st);
            pf_gemm(p, &ly->ffn_gate, gx, n, p->g, nff, 0, st);
            gx = pf_prep(p, &pc, ly->ffn_up.type, p->x, NULL, n, emb, ly->ffn_norm, st);
            pf_gemm(p, &ly->ffn_up, gx, n, p->u, nff, 0, st);
            PF_MARK(PF_P_UP);
            gx = pf_prep(p, &pc, ly->ffn_down.type, p->u, p->g, n, nff, NULL, st);
            pf_gemm(p, &ly->ffn_down, gx, n, p->x, emb, 1, st);
            PF_MARK(PF_P_DOWN);
        }
        pc.x = NULL;
        if ((rc = pf_err(cudaGetLastError(), "prefill layer launch"))) return rc;
    }
    const engine_cuda_wview *ow = &p->mv.output;
    const size_t nv = hp->n_vocab;
    /* the batched pass: the listed rows, gathered in groups */
    for (int r0 = 0; pg && r0 < pg->n_out; r0 += PF_LOGIT_ROWS) {
        const int rows = std::min(PF_LOGIT_ROWS, pg->n_out - r0);
        engine_cu_pf_gather_rows(p->x, pg->out_rows_d + r0, rows, emb, p->xrows, st);
        const engine_cu_gx *gx = pf_prep(p, &pc, ow->type, p->xrows, NULL, rows, emb,
                                         p->mv.output_norm, st);
        pc.x = NULL; /* xrows is rewritten by the next group */
        pf_gemm(p, ow, gx, rows, p->logits, (int)nv, 0, st);
        for (int i = 0; i < rows; i++)
            if (pg->out[r0 + i] &&
                (rc = pf_err(cudaMemcpyAsync(pg->out[r0 + i], p->logits + (size_t)i * nv,
                                             sizeof(float) * nv, cudaMemcpyDeviceToHost, st),
                             "cudaMemcpyAsync (logits)")))
                return rc;
        PF_MARK(PF_P_HEAD);
        if ((rc = pf_err(cudaStreamSynchronize(st), "batched pass"))) return rc;
    }
    /* the rows whose logits are wanted: every row (in groups), or the last */
    for (int r0 = pg ? n : logits_all ? 0 : n - 1; r0 < n; r0 += PF_LOGIT_ROWS) {
        const int rows = std::min(PF_LOGIT_ROWS, n - r0);
        const engine_cu_gx *gx = pf_prep(p, &pc, ow->type, p->x + (size_t)r0 * emb, NULL, rows,
                                         emb, p->mv.output_norm, st);
        pf_gemm(p, ow, gx, rows, p->logits, (int)nv, 0, st);
        float *dst = logits_all ? logits_all + (size_t)r0 * nv : logits_last;
        if (dst && (rc = pf_err(cudaMemcpyAsync(dst, p->logits, sizeof(float) * nv * rows,
                                                cudaMemcpyDeviceToHost, st),
                                "cudaMemcpyAsync (logits)")))
            return rc;
        if (logits_all && logits_last && r0 + rows == n)
            if ((rc = pf_err(cudaMemcpyAsync(logits_last, p->logits + (size_t)(rows - 1) * nv,
                                             sizeof(float) * nv, cudaMemcpyDeviceToHost, st),
                             "cudaMemcpyAsync (logits)")))
                return rc;
        PF_MARK(PF_P_HEAD);
        if ((rc = pf_err(cudaStreamSynchronize(st), "prefill"))) return rc;
    }
    if (p->prof) {
        engine_cu_pf_prof_add(p->ev, p->ev_cat, n_mark, p->prof_ms);
        p->prof_tokens += n;
    }
#undef PF_MARK
    return 0;
}

extern "C" int engine_cuda_prefill_run(engine_cuda_prefill *p, const int32_t *tokens, int32_t n,
                                       int32_t pos, float *logits_all, float *logits_last) {
    const engine_hparams *hp = &p->mv.m->hp;
    if (n < 1 || pos < 0 || pos > p->sv.n_ctx - n)
        return engine_err(ENGINE_ERANGE, "cuda prefill: positions %d..%d do not fit the context "
                          "of %d", pos, pos + n - 1, p->sv.n_ctx);
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= hp->n_vocab)
            return engine_err(ENGINE_EINVAL, "cuda prefill: token id %d is not in [0, %u)",
                              tokens[i], hp->n_vocab);
    int rc = pf_err(cudaSetDevice(p->mv.device), "cudaSetDevice");
    for (int32_t i = 0; rc == 0 && i < n; i += p->max_tokens) {
        const int32_t c = std::min(p->max_tokens, n - i);
        rc = engine_cu_pf_chunk(p, tokens + i, c, pos + i,
                      logits_all ? logits_all + (size_t)i * hp->n_vocab : NULL,
                      i + c == n ? logits_last : NULL, NULL);
    }
    return rc;
}

ENGINE_CU_TRACE_TU(prefill)
