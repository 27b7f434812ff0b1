/* The DeltaNet step of a verify pass over m consecutive tokens in one launch (contract in
 * q35_verify.cuh, engine_cu_vdelta_step). Per token, every value is the decode step's
 * (deltanet.cu) expression on the same operands in the same order; what changes is when:
 *   1. the conv + SiLU of all m tokens (inputs of earlier positions of the pass come from the
 *      pass's own projections, older ones from the ring, which no block writes here), each
 *      token's ring as the decode step leaves it written to its snapshot slot by the channel's
 *      owner; g and beta of all m tokens; the l2 norms of q and k of all m tokens
 *   2. the recurrence: the block's state columns read once into registers, updated token by
 *      token (the state after each written to its snapshot slot), the live state written once
 *   3. the gated RMSNorm of all m outputs by the last column block of the head to finish.
 * For m > 1 the live ring is left as it was: engine_cu_vring_commit copies the last token's ring
 * from its snapshot slot afterwards (blocks of one launch are not ordered, so a block cannot
 * overwrite ring slots that another block of the same key head may still have to read); for
 * m = 1 the kernel writes it as the decode step does, so with m = 1, snapshots as the caller
 * asks, it is the decode step (deltanet.cu's kernel could become this one; that file is not
 * this module's). */
#include <cooperative_groups.h>
#include <math.h>

#include "deltanet_dev.cuh"
#include "q35_verify.cuh"

#define VD_ROWS 16 /* state rows a thread keeps in registers (deltanet.cu's DN_ROWS) */
#define VD_COLS 32 /* state columns of a block (deltanet.cu's DN_COLS) */
#define VD_MAX_DK 512
#define VD_MAX_CONV 4 /* conv widths of this launch (engine_cu_vdelta_ok); wider: per token */

/* This thread's parts of token t's sums of squares of q and k (the decode step's loop). */
__device__ __forceinline__ void vd_l2_parts(const float *sq, const float *sk, int t, int dk,
                                            float &vq, float &vk) {
    const float *q = sq + (size_t)t * dk, *k = sk + (size_t)t * dk;
    vq = vk = 0.0f;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
        vq += q[i] * q[i];
        vk += k[i] * k[i];
    }
}

/* Grid (nv, dv / VD_COLS), dk / VD_ROWS warps, as deltanet.cu's kernel.
 * EARLY (va.d.early == 2; dk <= 128, a head's column blocks one cluster; the MTP part
 * "dearly"): as the decode step's early cluster kernel (deltanet.cu) for m tokens: the block's
 * state rows read into registers and its conv weights and ring rows asked of L2 BEFORE the wait
 * (no kernel of a verify pass writes the state or the ring before its DeltaNet steps: the
 * previous pass and the restore are finished graphs), both l2-norm sums of all m tokens in one
 * block reduction (each in engine_cu_block_sum's order), q and k scaled where used, and the
 * gated RMSNorm of every token by each block for its own columns with the head's sums of
 * squares through distributed shared memory (in column-block order): no counter, fence or last
 * block. The same expressions on the same operands: bit for bit the default. */
template <bool EARLY>
__global__ void __launch_bounds__(EARLY ? 256 : VD_MAX_DK / VD_ROWS * 32, EARLY ? 1 : 0)
    vdelta_kernel(engine_cu_vdelta va) {
    extern __shared__ float vd_smem[];
    __shared__ float red32[32];
    __shared__ float gb[ENGINE_CU_VMAX][2]; /* g, beta of each token */
    __shared__ float sv[ENGINE_CU_VMAX][VD_COLS], so[VD_COLS];
    __shared__ int last;
    const engine_cu_delta &a = va.d;
    const int m = va.m, dk = a.dk, dv = a.dv, K = a.K, nk = a.nk, nv = a.nv;
    const int nrw = dk / VD_ROWS, per = 2 * dk + VD_COLS;
    float *sq = vd_smem, *sk = sq + (size_t)m * dk, *red = sk + (size_t)m * dk;
    const int h = blockIdx.x, cb = blockIdx.y, c0 = cb * VD_COLS;
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, wi = tid >> 5;
    const int grp = nv / nk, kh = a.v_tiled ? h % nk : h / grp;
    const bool owner = (a.v_tiled ? h < nk : h % grp == 0) && cb == 0;
    const int c = c0 + lane, r0 = wi * VD_ROWS;
    float *S = a.state + (size_t)h * dk * dv;
    float s[VD_ROWS];
    engine_cu_pdl_launch();
    if constexpr (EARLY) {
#pragma unroll
        for (int i = 0; i < VD_ROWS; i++)
            s[i] = S[(size_t)(r0 + i) * dv + c];
        for (int e = tid; e < per; e += nt) { /* the block's conv weights and ring rows: L2 */
            const int ch = e < dk       ? kh * dk + e
                           : e < 2 * dk ? nk * dk + kh * dk + (e - dk)
                                        : 2 * nk * dk + h * dv + c0 + (e - 2 * dk);
            asm volatile("prefetch.global.L2 [%0];" ::"l"(a.conv_w + (size_t)ch * K));
            asm volatile("prefetch.global.L2 [%0];" ::"l"(a.ring + (size_t)ch * K));
        }
    } else if (lane < VD_ROWS) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(S + (size_t)(r0 + lane) * dv + c0));
    }
    engine_cu_pdl_wait();
    const int32_t p0 = *a.pos;
    const size_t qs = va.qkv_stride;
    float be = 0.0f, al = 0.0f;
    if (tid < m) {
        be = a.beta[(size_t)tid * va.ba_stride + h];
        al = a.alpha[(size_t)tid * va.ba_stride + h];
    }

    /* 1a. conv + SiLU of every token of this thread's channels (u = tid, tid + nt, ... of the
     * block's per), each channel's operands in registers at compile-time indices, loaded at
     * once: its conv weights right-aligned (cw[VD_MAX_CONV - K + i] = w[i]), the inputs of the
     * K - 1 positions before the pass (xw[VD_MAX_CONV - 1 - d]: position p0 - 1 - d; a window
     * that slides by one position a token) and the m tokens' inputs (xt[t]); each token's ring
     * as the decode step leaves it to its snapshot slot by the channel's owner */
    constexpr int KM = VD_MAX_CONV;
#pragma unroll 1
    for (int u = tid; u < per; u += nt) {
        int ch, dst_t;
        bool own;
        float *dst;
        if (u < dk)
            ch = kh * dk + u, own = owner, dst = sq + u, dst_t = dk;
        else if (u < 2 * dk)
            ch = nk * dk + kh * dk + (u - dk), own = owner, dst = sk + (u - dk), dst_t = dk;
        else
            ch = 2 * nk * dk + h * dv + c0 + (u - 2 * dk), own = true,
            dst = &sv[0][0] + (u - 2 * dk), dst_t = VD_COLS;
        float cw[KM], xw[KM], xt[ENGINE_CU_VMAX];
#pragma unroll
        for (int i = 0; i < KM; i++) {
            const int d = KM - 1 - i, p = p0 - 1 - d;
            cw[i] = i >= KM - K ? a.conv_w[(size_t)ch * K + (i - (KM - K))] : 0.0f;
            xw[i] = d < K - 1 ? a.ring[(size_t)ch * K + ((p % K) + K) % K] : 0.0f;
        }
#pragma unroll
        for (int t = 0; t < ENGINE_CU_VMAX; t++)
            xt[t] = t < m ? a.qkv[(size_t)t * qs + ch] : 0.0f;
#pragma unroll
        for (int t = 0; t < ENGINE_CU_VMAX; t++) {
            if (t >= m) continue;
            const int pos = p0 + t;
            float y = cw[KM - 1] * xt[t];
#pragma unroll
            for (int i = 0; i < KM - 1; i++) /* w[i] x[pos - (K - 1) + i], i < K - 1 */
                if (i >= KM - K) y += cw[i] * xw[i + 1];
#pragma unroll
            for (int i = 0; i < KM - 1; i++)
                xw[i] = xw[i + 1];
            xw[KM - 1] = xt[t]; /* now xw[KM - 1 - d]: position pos - d */
            dst[(size_t)t * dst_t] = engine_cu_dn_silu(y);
            if (own && m == 1) /* no other block reads slot pos % K of this token */
                a.ring[(size_t)ch * K + pos % K] = xt[t];
            if (own && a.snap_ring && (pos + 1) % a.snap_every == 0) {
                /* the ring after this token: slot i holds the latest position = i mod K */
                float *snap = a.snap_ring +
                              (size_t)(((pos + 1) / a.snap_every) % a.n_snap) * a.snap_stride +
                              (size_t)ch * K;
#pragma unroll
                for (int d = 0; d < KM; d++)
                    if (d < K) snap[((pos - d) % K + K) % K] = xw[KM - 1 - d];
            }
        }
    }
    if (tid < m) {
        gb[tid][0] = expf(a.a[h] * engine_cu_dn_softplus(al + a.dt_bias[h]));
        gb[tid][1] = 1.0f / (1.0f + expf(-be));
    }
    __syncthreads();
    /* 1b. l2norm of q (times 1 / sqrt(dk)) and k of every token */
    float iq[ENGINE_CU_VMAX], ik[ENGINE_CU_VMAX];
    const float qscale = 1.0f / sqrtf((float)dk);
    __shared__ float siq[ENGINE_CU_VMAX], sik[ENGINE_CU_VMAX]; /* EARLY: the l2 scales */
    if constexpr (EARLY) { /* one block reduction for the 2 m sums, scaled where used */
        __shared__ float2 red2[ENGINE_CU_VMAX][32];
        const int nw = nt >> 5;
#pragma unroll
        for (int t = 0; t < ENGINE_CU_VMAX; t++) {
            if (t >= m) continue;
            float vq, vk;
            vd_l2_parts(sq, sk, t, dk, vq, vk);
            vq = engine_cu_warp_sum(vq);
            vk = engine_cu_warp_sum(vk);
            if (lane == 0) red2[t][wi] = make_float2(vq, vk);
        }
        __syncthreads();
#pragma unroll
        for (int t = 0; t < ENGINE_CU_VMAX; t++) {
            iq[t] = ik[t] = 0.0f;
            if (t >= m) continue;
            const float2 rv = lane < nw ? red2[t][lane] : make_float2(0.0f, 0.0f);
            const float ssq = engine_cu_warp_sum(rv.x), ssk = engine_cu_warp_sum(rv.y);
            iq[t] = 1.0f / sqrtf(ssq + 1e-6f);
            ik[t] = 1.0f / sqrtf(ssk + 1e-6f);
        }
        if (tid == 0) /* read by token index below: shared memory, not a local array */
#pragma unroll
            for (int t = 0; t < ENGINE_CU_VMAX; t++) {
                siq[t] = iq[t];
                sik[t] = ik[t];
            }
        __syncthreads();
    } else {
#pragma unroll
        for (int t = 0; t < ENGINE_CU_VMAX; t++) {
            iq[t] = ik[t] = 0.0f;
            if (t >= m) continue;
            float vq, vk;
            vd_l2_parts(sq, sk, t, dk, vq, vk);
            const float ssq = engine_cu_block_sum(vq, red32);
            const float ssk = engine_cu_block_sum(vk, red32);
            iq[t] = 1.0f / sqrtf(ssq + 1e-6f);
            ik[t] = 1.0f / sqrtf(ssk + 1e-6f);
        }
        __syncthreads();
#pragma unroll
        for (int t = 0; t < ENGINE_CU_VMAX; t++) {
            if (t >= m) continue;
            float *q = sq + (size_t)t * dk, *k = sk + (size_t)t * dk;
            for (int i = tid; i < dk; i += nt) {
                q[i] = q[i] * iq[t] * qscale;
                k[i] = k[i] * ik[t];
            }
        }
        __syncthreads();
    }

    /* 2. the delta rule on this thread's column slice, token by token */
    if constexpr (!EARLY) {
#pragma unroll
        for (int i = 0; i < VD_ROWS; i++)
            s[i] = S[(size_t)(r0 + i) * dv + c];
    }
    __shared__ float ssq_mine[ENGINE_CU_VMAX]; /* EARLY: token t's sum of squares of the block */
    float o_t[ENGINE_CU_VMAX];                 /* EARLY, warp 0: token t's output of column c */
    for (int t = 0; t < m; t++) {
        const float *q = sq + (size_t)t * dk, *k = sk + (size_t)t * dk;
        const float g = gb[t][0], beta = gb[t][1];
        /* EARLY: q and k as scaled in shared memory by the default (the same products) */
        const float kq = EARLY ? sik[t] : 1.0f, qq = EARLY ? siq[t] : 1.0f;
        float kn[VD_ROWS];
        float part = 0.0f;
#pragma unroll
        for (int i = 0; i < VD_ROWS; i++) {
            kn[i] = EARLY ? k[r0 + i] * kq : k[r0 + i];
            s[i] = s[i] * g;
            part += s[i] * kn[i];
        }
        red[wi * VD_COLS + lane] = part;
        __syncthreads();
        if (wi == 0) {
            float tt = 0.0f;
            for (int j = 0; j < nrw; j++)
                tt += red[j * VD_COLS + lane];
            so[lane] = (sv[t][lane] - tt) * beta;
        }
        __syncthreads();
        const float d = so[lane];
        part = 0.0f;
        const int pos1 = p0 + t + 1;
        float *snap_s = a.snap_state && pos1 % a.snap_every == 0
                            ? a.snap_state +
                                  (size_t)((pos1 / a.snap_every) % a.n_snap) * a.snap_stride +
                                  (size_t)h * dk * dv
                            : nullptr;
#pragma unroll
        for (int i = 0; i < VD_ROWS; i++) {
            s[i] += kn[i] * d;
            part += s[i] * (EARLY ? q[r0 + i] * qq * qscale : q[r0 + i]);
            if (snap_s) snap_s[(size_t)(r0 + i) * dv + c] = s[i];
        }
        red[wi * VD_COLS + lane] = part;
        __syncthreads();
        if (wi == 0) { /* o of the block's columns and their sum of squares */
            float o = 0.0f;
            for (int j = 0; j < nrw; j++)
                o += red[j * VD_COLS + lane];
            const float sq2 = engine_cu_warp_sum(o * o);
            if constexpr (EARLY) {
#pragma unroll
                for (int u = 0; u < ENGINE_CU_VMAX; u++)
                    if (u == t) o_t[u] = o;
                if (lane == 0) ssq_mine[t] = sq2;
            } else {
                a.out[(size_t)t * va.out_stride + (size_t)h * dv + c] = o;
                if (lane == 0) va.ssq[((size_t)t * nv + h) * gridDim.y + cb] = sq2;
            }
        }
        __syncthreads(); /* red and so are rewritten by the next token */
    }
#pragma unroll
    for (int i = 0; i < VD_ROWS; i++)
        S[(size_t)(r0 + i) * dv + c] = s[i];
    if constexpr (EARLY) {
        /* 3. every token's gated RMSNorm of this block's columns, the head's sums of squares
         * from the cluster's blocks (block rank = column block) */
        namespace cg = cooperative_groups;
        cg::cluster_group cl = cg::this_cluster();
        float zr[ENGINE_CU_VMAX]; /* every token's z of column c in one round trip */
#pragma unroll
        for (int t = 0; t < ENGINE_CU_VMAX; t++)
            zr[t] = wi == 0 && t < m ? a.z[(size_t)t * va.z_stride + (size_t)h * dv + c] : 0.0f;
        cl.sync();
        if (wi == 0) {
            const float nwe = a.norm_w[c];
#pragma unroll
            for (int t = 0; t < ENGINE_CU_VMAX; t++) {
                if (t >= m) continue;
                float ss = 0.0f;
                for (unsigned j = 0; j < gridDim.y; j++)
                    ss += cl.map_shared_rank(ssq_mine, j)[t];
                const float scale = 1.0f / sqrtf(ss / (float)dv + a.eps);
                const float ze = zr[t];
                const float y = nwe * (o_t[t] * scale);
                a.out[(size_t)t * va.out_stride + (size_t)h * dv + c] =
                    y * (ze / (1.0f + expf(-ze)));
            }
        }
        cl.sync(); /* ssq_mine stays until every block of the cluster has read it */
        return;
    }

    /* 3. the last column block of the head: gated RMSNorm of every token's dv outputs */
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(&a.counters[h], 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int t = 0; t < m; t++) {
        float ss = 0.0f;
        for (unsigned j = 0; j < gridDim.y; j++)
            ss += __ldcg(va.ssq + ((size_t)t * nv + h) * gridDim.y + j);
        const float scale = 1.0f / sqrtf(ss / (float)dv + a.eps);
        float *oh = a.out + (size_t)t * va.out_stride + (size_t)h * dv;
        const float *z = a.z + (size_t)t * va.z_stride + (size_t)h * dv;
        for (int i = tid; i < dv; i += nt) {
            const float o = __ldcg(oh + i), zv = z[i];
            const float y = a.norm_w[i] * (o * scale);
            oh[i] = y * (zv / (1.0f + expf(-zv)));
        }
    }
    if (tid == 0) a.counters[h] = 0;
}

size_t engine_cu_vdelta_smem(int dk, int m) {
    return sizeof(float) * (2 * (size_t)m * dk + (size_t)(dk / VD_ROWS) * VD_COLS);
}

bool engine_cu_vdelta_ok(int K) {
    return K >= 1 && K <= VD_MAX_CONV;
}

bool engine_cu_vdelta_early_ok(int dk, int dv) {
    return dk / VD_ROWS * 32 <= 256 && dv / VD_COLS <= 8;
}

void engine_cu_vdelta_step(const engine_cu_vdelta *a, cudaStream_t stream) {
    const int threads = a->d.dk / VD_ROWS * 32;
    const dim3 grid(a->d.nv, a->d.dv / VD_COLS);
    const size_t smem = engine_cu_vdelta_smem(a->d.dk, a->m);
    if (a->d.early == 2 && engine_cu_vdelta_early_ok(a->d.dk, a->d.dv))
        engine_cu_launch_ex(vdelta_kernel<true>, grid, dim3(threads), smem, stream, true, grid.y,
                            *a); /* the cluster of a head's column blocks */
    else
        engine_cu_launch(vdelta_kernel<false>, grid, dim3(threads), smem, stream, *a);
}

__global__ void vring_commit_kernel(const float4 *src0, size_t stride4, float4 *dst, size_t n4,
                                    const int32_t *pos, int n_snap) {
    engine_cu_pdl_launch();
    engine_cu_pdl_wait();
    const float4 *src = src0 + (size_t)((*pos + 1) % n_snap) * stride4;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

void engine_cu_vring_commit(const float *src_slot0, size_t slot_stride, float *dst, size_t n,
                            const int32_t *pos, int n_snap, cudaStream_t stream) {
    engine_cu_launch(vring_commit_kernel, dim3(264), dim3(256), 0, stream,
                     (const float4 *)src_slot0, slot_stride / 4, (float4 *)dst, n / 4, pos,
                     n_snap);
}

ENGINE_CU_TRACE_TU(q35_vdelta)
