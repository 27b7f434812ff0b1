/* Device side of the short-context decode attention (SPARK_CUDA_ATT_SHORT=1, engine_cu_att's
 * short_path; contract in attention.cuh): one block per query head while the context holds at
 * most ENGINE_CU_ATT_SPLIT positions, instead of att_block's one block per KV head doing its
 * group's query heads in series (4 blocks for Qwen3-30B-A3B's 32 heads).
 *
 * A block (head h of KV head kvh, the g-th of its group) of ATT_THREADS threads:
 *   warp 0 normalises and rotates q_h into shared memory; warp 1 the new K row and V's new row,
 *     rounded to the cache type, into shared memory in the cache's format; only the group's
 *     first block (g == 0) stores them at row `pos` of the cache. The other blocks of the group
 *     never read row `pos` from the cache (it races with that store): every load of a row picks
 *     its address once, the cache for rows < pos and the shared copy for row pos (generic
 *     loads, the address chosen by a select so that no branch sits between the loads).
 *   one barrier; the scores as in att_block (4 threads per position, each a quarter of the
 *     row, the parts summed in shuffles), with PP positions per thread per pass so that the
 *     loads of several positions are in flight together.
 *   one barrier; every warp takes the max and the sum over all the scores itself (the same
 *     lane-strided order and butterfly as att_block's softmax warp, so the same values: no
 *     softmax warp, no barrier), and the weight exp(s - max) of its own positions (w, w + 8,
 *     ...: lane l holds position w + 8 l's); V as in att_block (lanes over the dimensions,
 *     warps over every 8th position, weights taken by shuffle), in chunks of VU rows whose
 *     loads are all issued at once (a chunk's rows past the last clamped, their terms skipped:
 *     no one-row-at-a-time remainder loop), row pos last from shared memory.
 *   one barrier; each output summed over the warps in warp order and divided by the sum.
 * The arithmetic, and its order, is att_block's for n_act == 1 (same dot product expression,
 * same exp inputs, same V accumulation order, same warp order), so the outputs are meant to
 * equal the per-KV-head path's bit for bit; the tests check it. (Copying the first K rows and
 * V chunk into shared memory with cp.async before the wait was measured no faster on the H200:
 * removed.) The kernel is att_short.cu's. */
#ifndef SPARK_ENGINE_CUDA_ATT_SHORT_DEV_CUH
#define SPARK_ENGINE_CUDA_ATT_SHORT_DEV_CUH

#include "attention_dev.cuh"

/* Positions per thread and score pass, and V rows in flight per warp (a chunk). At HD 128 one
 * position and 8 rows (were 2 and 16): less code, which each launch fetches anew, for more
 * passes at longer positions. Qwen3-30B-A3B on the H200 (session 37 call G, one process, the
 * same sums in the same order): tg128 +1.0% (Q4_K_M and Q8_0), at 4096 depth 0.0%, at 1024
 * -0.5%; 4 rows: +0.3% at depth 0, -1.3% at 1024. HD 64 and 256 as they were (not measured). */
__host__ __device__ constexpr int att_short_pp(int hd) {
    return hd <= 64 ? 4 : 1;
}
__host__ __device__ constexpr int att_short_vu(int hd) {
    return hd <= 64 ? 16 : hd <= 128 ? 8 : 4;
}
/* Shared memory of a per-head block: sq[HD], sc[SPLIT], so[ATT_WARPS][HD] floats, then the new
 * K and V rows in the cache's format (HD floats of room each). */
static inline size_t att_short_smem_bytes(int hd) {
    return sizeof(float) * ((size_t)hd + ENGINE_CU_ATT_SPLIT + (size_t)ATT_WARPS * hd + 2 * hd);
}

/* Block of query head h over split s (positions s * ENGINE_CU_ATT_SPLIT ..; the only split
 * below ENGINE_CU_ATT_SPLIT positions) of a launch at position pos; F32 = a.kv_f32 (a template
 * argument, so that each loop's loads sit in one basic block with no per-load branch on the
 * cache type). One split: the block writes the head's output; more: att_block's partial for
 * the split, the head's last block (counters[h]) merging them into the output. att_smem:
 * att_short_smem_bytes of dynamic shared memory (16-byte aligned); sync.wait() before the
 * inputs are read (every thread calls it). */
template <int HD, bool F32, bool ONE = false, int VU_ = 0, typename S>
__device__ __forceinline__ void att_short_block(const engine_cu_att &a, int h, int s, int pos,
                                                int max_splits, float *att_smem, const S &sync) {
    constexpr int DPL = HD / 32;         /* V dimensions per lane */
    constexpr int NI = HD / 8 / ATT_TPP; /* groups of 8 values per thread in the score loop */
    constexpr int PP = att_short_pp(HD);
    constexpr int PSTEP = ATT_THREADS / ATT_TPP; /* positions per pass and u */
    /* V rows in flight per warp: a chunk's loads are all issued (the rows past the warp's last
     * clamped to it, their terms skipped), so a short tail costs one round trip, not one per
     * row */
    constexpr int VU = VU_ ? VU_ : att_short_vu(HD);
    constexpr size_t elt = F32 ? 4 : 2;
    const int G = a.n_head / a.n_kv, kvh = h / G, g = h - kvh * G;
    /* ONE: the caller's position is below ENGINE_CU_ATT_SPLIT (att_one_kernel) */
    const int n_act = ONE ? 1 : (pos + ENGINE_CU_ATT_SPLIT) / ENGINE_CU_ATT_SPLIT;
    const int p_begin = s * ENGINE_CU_ATT_SPLIT, np = min(ENGINE_CU_ATT_SPLIT, pos + 1 - p_begin);
    const bool last = s == n_act - 1;   /* the split holding row pos */
    const int nl = last ? np - 1 : np;  /* this split's rows to read from the cache */
    const size_t kv_dim = (size_t)a.n_kv * HD, col = (size_t)kvh * HD;
    const int lane = threadIdx.x & 31, w = engine_cu_warp_id();
    const int part = threadIdx.x & (ATT_TPP - 1);
    const size_t off0 = ((size_t)p_begin * kv_dim + col) * elt; /* the split's first row */
    const uintptr_t kc = (uintptr_t)a.k_cache + off0;
    const uint8_t *vc = (const uint8_t *)a.v_cache + off0;
    const int nk = (nl - w + ATT_WARPS - 1) / ATT_WARPS; /* this warp's rows < nl */
    float *sq = att_smem, *sc = sq + HD, *so = sc + ENGINE_CU_ATT_SPLIT;
    uint8_t *skr = (uint8_t *)(so + ATT_WARPS * HD), *svr = skr + sizeof(float) * HD;
    { /* the split's final rows (before the position) to L2, a share per block of the group */
        const int p = g + G * (int)threadIdx.x;
        if (p < nl) {
            engine_cu_prefetch_rows((const uint8_t *)kc + (size_t)p * kv_dim * elt, HD * elt);
            engine_cu_prefetch_rows(vc + (size_t)p * kv_dim * elt, HD * elt);
        }
    }
    sync.wait();
    const float2 *rope = a.rope + (size_t)pos * (HD / 2);

    if (w == 0) {
        float v[DPL];
        norm_rope_warp<HD>(a.q + (size_t)h * HD, a.q_norm, rope, a.eps, v);
#pragma unroll
        for (int t = 0; t < DPL; t++)
            sq[lane + 32 * t] = v[t];
    } else if (w == 1 && last) {
        float v[DPL];
        norm_rope_warp<HD>(a.k + col, a.k_norm, rope, a.eps, v);
        const size_t o = (size_t)pos * kv_dim + col;
#pragma unroll
        for (int t = 0; t < DPL; t++) {
            const int i = lane + 32 * t;
            const float vv = a.v[col + i];
            if (F32) {
                ((float *)skr)[i] = v[t];
                ((float *)svr)[i] = vv;
                if (g == 0) {
                    ((float *)a.k_cache)[o + i] = v[t];
                    ((float *)a.v_cache)[o + i] = vv;
                }
            } else {
                const __half hk = __float2half_rn(v[t]), hv = __float2half_rn(vv);
                ((__half *)skr)[i] = hk;
                ((__half *)svr)[i] = hv;
                if (g == 0) {
                    ((__half *)a.k_cache)[o + i] = hk;
                    ((__half *)a.v_cache)[o + i] = hv;
                }
            }
        }
    }
    __syncthreads();

    /* scores: ATT_TPP threads per position, PP positions per thread, all their loads issued
     * before any math (row pos, or past the end, from shared memory; both addresses formed
     * first, so that the choice is a select, not a branch between the loads); the dot product
     * written as att_block writes it */
    const float scale = 1.0f / sqrtf((float)HD);
    for (int jb = 0; jb < np; jb += PP * PSTEP) { /* uniform over the block */
        float kk[PP][NI][8];
#pragma unroll
        for (int u = 0; u < PP; u++) {
            const int j = jb + u * PSTEP + (int)threadIdx.x / ATT_TPP;
            const uintptr_t rg = kc + (uintptr_t)j * kv_dim * elt;
            const void *row = (const void *)(j < nl ? rg : (uintptr_t)skr);
#pragma unroll
            for (int ii = 0; ii < NI; ii++)
                kv_load8(row, F32, 8 * (part + ATT_TPP * ii), kk[u][ii]);
        }
#pragma unroll
        for (int u = 0; u < PP; u++) {
            const int j = jb + u * PSTEP + (int)threadIdx.x / ATT_TPP;
            float d = 0.0f;
#pragma unroll
            for (int ii = 0; ii < NI; ii++) {
                const float *qp = sq + 8 * (part + ATT_TPP * ii);
                const float4 q0 = *(const float4 *)qp, q1 = *(const float4 *)(qp + 4);
                d += q0.x * kk[u][ii][0] + q0.y * kk[u][ii][1] + q0.z * kk[u][ii][2] +
                     q0.w * kk[u][ii][3] + q1.x * kk[u][ii][4] + q1.y * kk[u][ii][5] +
                     q1.z * kk[u][ii][6] + q1.w * kk[u][ii][7];
            }
#pragma unroll
            for (int o = 1; o < ATT_TPP; o <<= 1)
                d += __shfl_xor_sync(0xffffffffu, d, o);
            if (part == 0 && j < np) sc[j] = d * scale;
        }
    }
    __syncthreads();

    /* every warp: the max and the denominator over all the scores (att_block's order), the
     * numerator of its own positions w + ATT_WARPS * lane */
    constexpr int NJ = ENGINE_CU_ATT_SPLIT / 32; /* positions per lane (fixed trip count) */
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < NJ; i++)
        if (lane + 32 * i < np) mx = fmaxf(mx, sc[lane + 32 * i]);
    mx = engine_cu_warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < NJ; i++)
        if (lane + 32 * i < np) sum += expf(sc[lane + 32 * i] - mx);
    sum = engine_cu_warp_sum(sum);
    const int jo = w + ATT_WARPS * lane; /* < ATT_WARPS * 32 = ENGINE_CU_ATT_SPLIT */
    const float e = jo < np ? expf(sc[jo] - mx) : 0.0f;

    /* V: lane over dimensions lane * DPL .., warp over positions w, w + ATT_WARPS, ... */
    float acc[DPL];
#pragma unroll
    for (int t = 0; t < DPL; t++)
        acc[t] = 0.0f;
    for (int k0 = 0; k0 < nk; k0 += VU) { /* uniform over the warp */
        float vv[VU][DPL];
#pragma unroll
        for (int u = 0; u < VU; u++)
            kv_loadn<DPL>(vc + (size_t)(w + ATT_WARPS * min(k0 + u, nk - 1)) * kv_dim * elt, F32,
                          (size_t)lane * DPL, vv[u]);
#pragma unroll
        for (int u = 0; u < VU; u++) {
            const float pj = __shfl_sync(0xffffffffu, e, (k0 + u) & 31);
            if (k0 + u < nk)
#pragma unroll
                for (int t = 0; t < DPL; t++)
                    acc[t] += pj * vv[u][t];
        }
    }
    if (last && (nl & (ATT_WARPS - 1)) == w) { /* row pos, the last of this warp's positions */
        float vv[DPL];
        kv_loadn<DPL>(svr, F32, (size_t)lane * DPL, vv);
        const float pj = __shfl_sync(0xffffffffu, e, nl / ATT_WARPS);
#pragma unroll
        for (int t = 0; t < DPL; t++)
            acc[t] += pj * vv[t];
    }
    float *sw = so + (size_t)w * HD;
#pragma unroll
    for (int t = 0; t < DPL; t++)
        sw[lane * DPL + t] = acc[t];
    __syncthreads();
    float *ph = a.partial + (size_t)h * max_splits * (HD + 2); /* this head's splits */
    for (int i = threadIdx.x; i < HD; i += ATT_THREADS) {
        float o = 0.0f;
#pragma unroll
        for (int k = 0; k < ATT_WARPS; k++)
            o += so[(size_t)k * HD + i];
        if (n_act == 1) {
            a.out[(size_t)h * HD + i] = o / sum;
        } else { /* att_block's partial: max, denominator, unnormalised sums */
            float *part = ph + (size_t)s * (HD + 2);
            part[2 + i] = o;
            if (i == 0) {
                part[0] = mx;
                part[1] = sum;
            }
        }
    }
    if (n_act == 1) return;

    /* the last block of this head merges its splits, as att_block merges a head (the same
     * order: the bits of the per-KV-head launch) */
    __shared__ int s_last;
    __shared__ float s_ll;
    __syncthreads(); /* every partial written, then published (as att_block does) */
    __threadfence();
    if (threadIdx.x == 0) {
        const unsigned done = atomicAdd(a.counters + h, 1u);
        s_last = done == (unsigned)(n_act - 1);
        if (s_last) a.counters[h] = 0; /* ready for the next launch */
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    if (w == 0) { /* the split weights f_k = exp(m_k - M) into sc, the denominator */
        float mm = -INFINITY;
        for (int k = lane; k < n_act; k += 32)
            mm = fmaxf(mm, __ldcg(ph + (size_t)k * (HD + 2)));
        mm = engine_cu_warp_max(mm);
        float ll = 0.0f;
        for (int k = lane; k < n_act; k += 32) {
            const float f = expf(__ldcg(ph + (size_t)k * (HD + 2)) - mm);
            ll += __ldcg(ph + (size_t)k * (HD + 2) + 1) * f;
            sc[k] = f;
        }
        ll = engine_cu_warp_sum(ll);
        if (lane == 0) s_ll = ll;
    }
    __syncthreads();
    /* output d: the splits' sums in split order, MK loads in flight (the tail clamped) */
    constexpr int MK = 16;
    for (int d = threadIdx.x; d < HD; d += ATT_THREADS) {
        const float *pp = ph + 2 + d;
        float o = 0.0f;
        for (int k0 = 0; k0 < n_act; k0 += MK) {
            float v[MK];
#pragma unroll
            for (int u = 0; u < MK; u++)
                v[u] = __ldcg(pp + (size_t)min(k0 + u, n_act - 1) * (HD + 2));
#pragma unroll
            for (int u = 0; u < MK; u++)
                if (k0 + u < n_act) o += v[u] * sc[k0 + u];
        }
        a.out[(size_t)h * HD + d] = o / s_ll;
    }
}

#endif
