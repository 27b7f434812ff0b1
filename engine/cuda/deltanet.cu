/* The Gated DeltaNet decode step and the shared-expert gate (contracts in deltanet.cuh). */
#include <cooperative_groups.h>
#include <math.h>

#include "deltanet.cuh"
#include "deltanet_dev.cuh"

#define DN_ROWS 16 /* state rows a thread keeps in registers */
#define DN_COLS 32 /* state columns of a block (its lanes) */
#define DN_MAX_DK 512

bool engine_cu_deltanet_ok(int dk, int dv, int K) {
    return dk >= 32 && dv >= 32 && dk % 32 == 0 && dv % DN_COLS == 0 && dk <= DN_MAX_DK && K >= 1 &&
           K <= ENGINE_CU_DELTA_MAX_CONV;
}

/* Conv channel of conv-loop item t of a block (key head kh, value head h, columns c0..):
 * its index, whether the block writes its ring slot, and its shared-memory destination. */
__device__ __forceinline__ int dn_channel(int t, int dk, int nk, int kh, int h, int dv, int c0,
                                          bool owner, bool &own) {
    if (t < dk) {
        own = owner;
        return kh * dk + t;
    }
    if (t < 2 * dk) {
        own = owner;
        return nk * dk + kh * dk + (t - dk);
    }
    own = true;
    return 2 * nk * dk + h * dv + c0 + (t - 2 * dk);
}

/* Grid (nv, dv / DN_COLS); dk / DN_ROWS warps: lane = column c0 + lane, warp w = rows
 * w * DN_ROWS .. + DN_ROWS.
 * EARLY (engine_cu_delta.early, the decode step's SPARK_CUDA_Q35_DN_EARLY; dv <= threads <= 256,
 * else the default runs): the position, this thread's state rows, its conv channels' weights
 * and ring inputs, the gates' weights and norm_w are read BEFORE the wait (none of them is
 * written by the kernels this one waits for: the state and ring by this kernel of the previous
 * step, a finished graph), the activations right after it; the two l2-norm sums share one block
 * reduction and q, k are scaled where used. The same expressions on the same operands: bit for
 * bit the default's.
 * CLUSTER (with EARLY; early = 2): the column blocks of a head form a thread block cluster
 * (dims 1 x dv / 32, at most 8) that adds their sums of squares through distributed shared
 * memory (in column-block order, as the last block does), so each block normalises its own
 * columns: no counter, fence or last block. */
#define DN_EARLY_THREADS 256 /* EARLY: dk <= 128 (registers for the state rows and conv) */
#define DN_MAX_CLUSTER 8
template <bool EARLY, bool CLUSTER = false>
__global__ void
    __launch_bounds__(EARLY ? DN_EARLY_THREADS : DN_MAX_DK / DN_ROWS * 32, EARLY ? 1 : 0)
        deltanet_kernel(engine_cu_delta a) {
    extern __shared__ float dn_smem[];
    __shared__ float red32[32];
    __shared__ float gb[2]; /* g, beta */
    __shared__ float sv[DN_COLS], so[DN_COLS];
    __shared__ int last;
    const int dk = a.dk, dv = a.dv, K = a.K, nk = a.nk, nv = a.nv;
    const int nrw = dk / DN_ROWS;                       /* row warps */
    float *sq = dn_smem, *sk = sq + dk, *red = sk + dk; /* red: [nrw][DN_COLS] */
    const int h = blockIdx.x, cb = blockIdx.y, c0 = cb * DN_COLS;
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, wi = tid >> 5;
    const int grp = nv / nk, kh = a.v_tiled ? h % nk : h / grp;
    const bool owner = (a.v_tiled ? h < nk : h % grp == 0) && cb == 0;
    const int c = c0 + lane, r0 = wi * DN_ROWS;
    float *S = a.state + (size_t)h * dk * dv;
    engine_cu_pdl_launch();
    int32_t pos;
    float se[DN_ROWS];                       /* EARLY: the state rows */
    float cwe[2][ENGINE_CU_DELTA_MAX_CONV];  /* EARLY: conv weights 0..K-2 of items 0, 1 */
    float cwl[2] = {0.0f, 0.0f};             /* EARLY: their last conv weight (K - 1) */
    float rge[2][ENGINE_CU_DELTA_MAX_CONV];  /* EARLY: their ring inputs of earlier positions */
    float ae = 0.0f, dte = 0.0f, nwe = 0.0f; /* EARLY: a[h], dt_bias[h] (tid 0), norm_w[tid] */
    if constexpr (EARLY) {
        if (a.serial == 2) engine_cu_pdl_wait(); /* the previous token's state first */
        pos = *a.pos;
#pragma unroll
        for (int i = 0; i < DN_ROWS; i++)
            se[i] = S[(size_t)(r0 + i) * dv + c];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int t = tid + j * nt;
            if (t >= 2 * dk + DN_COLS) continue;
            bool own;
            const int ch = dn_channel(t, dk, nk, kh, h, dv, c0, owner, own);
            const float *w = a.conv_w + (size_t)ch * K;
            const float *ring = a.ring + (size_t)ch * K;
            cwl[j] = w[K - 1];
#pragma unroll
            for (int i = 0; i < ENGINE_CU_DELTA_MAX_CONV - 1; i++) {
                const int p = pos - (K - 1) + i;
                cwe[j][i] = i < K - 1 ? w[i] : 0.0f;
                rge[j][i] = i < K - 1 ? ring[((p % K) + K) % K] : 0.0f;
            }
        }
        if (tid == 0) {
            ae = a.a[h];
            dte = a.dt_bias[h];
        }
        if constexpr (CLUSTER)
            nwe = a.norm_w[c];
        else if (tid < dv)
            nwe = a.norm_w[tid];
    } else {
        /* this block's state lines into L2 while the projections finish (a line: 32 columns) */
        if (lane < DN_ROWS)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(S + (size_t)(r0 + lane) * dv + c0));
    }
    engine_cu_pdl_wait();
    if constexpr (!EARLY) pos = *a.pos;
    const bool snap = a.snap_state && (pos + 1) % a.snap_every == 0;
    const size_t snap_off =
        snap ? (size_t)(((pos + 1) / a.snap_every) % a.n_snap) * a.snap_stride : 0;

    if constexpr (EARLY) {
        /* the activations first (one round trip), then the conv from registers */
        float be = 0.0f, ale = 0.0f, ze = 0.0f;
        if (tid == 0) {
            be = a.beta[h];
            ale = a.alpha[h];
        }
        if constexpr (CLUSTER)
            ze = a.z[(size_t)h * dv + c];
        else if (tid < dv)
            ze = a.z[(size_t)h * dv + tid];
        float xin[2];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int t = tid + j * nt;
            bool own;
            xin[j] = t < 2 * dk + DN_COLS
                         ? a.qkv[dn_channel(t, dk, nk, kh, h, dv, c0, owner, own)]
                         : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int t = tid + j * nt;
            if (t >= 2 * dk + DN_COLS) continue;
            bool own;
            const int ch = dn_channel(t, dk, nk, kh, h, dv, c0, owner, own);
            float *dst = t < dk ? sq + t : t < 2 * dk ? sk + (t - dk) : sv + (t - 2 * dk);
            float y = cwl[j] * xin[j];
#pragma unroll
            for (int i = 0; i < ENGINE_CU_DELTA_MAX_CONV - 1; i++)
                if (i < K - 1) y += cwe[j][i] * rge[j][i];
            *dst = engine_cu_dn_silu(y);
            if (own) {
                float *ring = a.ring + (size_t)ch * K;
                ring[pos % K] = xin[j];
                if (snap)
                    for (int i = 0; i < K; i++)
                        a.snap_ring[snap_off + (size_t)ch * K + i] = ring[i];
            }
        }
        if (tid == 0) {
            gb[0] = expf(ae * engine_cu_dn_softplus(ale + dte));
            gb[1] = 1.0f / (1.0f + expf(-be));
        }
        __syncthreads();
        /* both l2-norm sums in one block reduction (each in engine_cu_block_sum's order) */
        float vq = 0.0f, vk = 0.0f;
        for (int t = tid; t < dk; t += nt) {
            vq += sq[t] * sq[t];
            vk += sk[t] * sk[t];
        }
        __shared__ float2 red2[32];
        vq = engine_cu_warp_sum(vq);
        vk = engine_cu_warp_sum(vk);
        if (lane == 0) red2[wi] = make_float2(vq, vk);
        __syncthreads();
        const int nw = nt >> 5;
        const float2 rv = lane < nw ? red2[lane] : make_float2(0.0f, 0.0f);
        const float ssq = engine_cu_warp_sum(rv.x), ssk = engine_cu_warp_sum(rv.y);
        const float iq = 1.0f / sqrtf(ssq + 1e-6f), ik = 1.0f / sqrtf(ssk + 1e-6f);
        const float qscale = 1.0f / sqrtf((float)dk);
        /* the delta rule on this thread's column slice (q, k scaled where used, as the default
         * path scales them in shared memory: the same products) */
        const float g = gb[0], beta = gb[1];
        float s[DN_ROWS], kn[DN_ROWS];
        float part = 0.0f;
#pragma unroll
        for (int i = 0; i < DN_ROWS; i++) {
            kn[i] = sk[r0 + i] * ik;
            s[i] = se[i] * g;
            part += s[i] * kn[i];
        }
        red[wi * DN_COLS + lane] = part;
        __syncthreads();
        if (wi == 0) {
            float t = 0.0f;
            for (int j = 0; j < nrw; j++)
                t += red[j * DN_COLS + lane];
            so[lane] = (sv[lane] - t) * beta;
        }
        __syncthreads();
        const float d = so[lane];
        part = 0.0f;
        float *snap_s = snap ? a.snap_state + snap_off + (size_t)h * dk * dv : nullptr;
#pragma unroll
        for (int i = 0; i < DN_ROWS; i++) {
            s[i] += kn[i] * d;
            part += s[i] * (sq[r0 + i] * iq * qscale);
            const size_t o = (size_t)(r0 + i) * dv + c;
            S[o] = s[i];
            if (snap_s) snap_s[o] = s[i];
        }
        red[wi * DN_COLS + lane] = part;
        __syncthreads();
        float *oh = a.out + (size_t)h * dv;
        if constexpr (CLUSTER) {
            /* the head's sum of squares from the cluster's blocks (block rank = column block) */
            namespace cg = cooperative_groups;
            cg::cluster_group cl = cg::this_cluster();
            __shared__ float ssq_mine;
            float o = 0.0f;
            if (wi == 0) {
                for (int j = 0; j < nrw; j++)
                    o += red[j * DN_COLS + lane];
                const float sq2 = engine_cu_warp_sum(o * o);
                if (lane == 0) ssq_mine = sq2;
            }
            cl.sync();
            if (wi == 0) {
                float ss = 0.0f;
                for (unsigned j = 0; j < gridDim.y; j++)
                    ss += *cl.map_shared_rank(&ssq_mine, j);
                const float scale = 1.0f / sqrtf(ss / (float)dv + a.eps);
                const float y = nwe * (o * scale);
                oh[c] = y * (ze / (1.0f + expf(-ze)));
            }
            cl.sync(); /* ssq_mine stays until every block of the cluster has read it */
            return;
        }
        if (wi == 0) {
            float o = 0.0f;
            for (int j = 0; j < nrw; j++)
                o += red[j * DN_COLS + lane];
            oh[c] = o;
            const float sq2 = engine_cu_warp_sum(o * o);
            if (lane == 0) a.ssq[(size_t)h * gridDim.y + cb] = sq2;
        }
        __threadfence();
        __syncthreads();
        if (tid == 0) last = atomicAdd(&a.counters[h], 1u) == gridDim.y - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
        float ss = 0.0f;
        for (unsigned j = 0; j < gridDim.y; j++)
            ss += __ldcg(a.ssq + (size_t)h * gridDim.y + j);
        const float scale = 1.0f / sqrtf(ss / (float)dv + a.eps);
        if (tid < dv) { /* the host launches EARLY only with dv <= threads */
            const float o = __ldcg(oh + tid);
            const float y = nwe * (o * scale);
            oh[tid] = y * (ze / (1.0f + expf(-ze)));
        }
        if (tid == 0) a.counters[h] = 0;
    } else {
        /* causal conv + SiLU of the key head's q and k channels and this block's v channels */
        for (int t = tid; t < 2 * dk + DN_COLS; t += nt) {
            int ch;
            bool own;
            float *dst;
            if (t < dk) {
                ch = kh * dk + t, own = owner, dst = sq + t;
            } else if (t < 2 * dk) {
                ch = nk * dk + kh * dk + (t - dk), own = owner, dst = sk + (t - dk);
            } else {
                ch = 2 * nk * dk + h * dv + c0 + (t - 2 * dk), own = true, dst = sv + (t - 2 * dk);
            }
            const float xin = a.qkv[ch];
            const float *w = a.conv_w + (size_t)ch * K;
            float *ring = a.ring + (size_t)ch * K;
            float y = w[K - 1] * xin;
            for (int i = 0; i < K - 1; i++) {
                const int p = pos - (K - 1) + i;
                y += w[i] * ring[((p % K) + K) % K];
            }
            *dst = engine_cu_dn_silu(y);
            if (own) {
                ring[pos % K] = xin;
                if (snap)
                    for (int i = 0; i < K; i++)
                        a.snap_ring[snap_off + (size_t)ch * K + i] = ring[i];
            }
        }
        if (tid == 0) {
            const float b = a.beta[h], al = a.alpha[h];
            gb[0] = expf(a.a[h] * engine_cu_dn_softplus(al + a.dt_bias[h]));
            gb[1] = 1.0f / (1.0f + expf(-b));
        }
        __syncthreads();
        /* l2norm of q (times 1 / sqrt(dk)) and k */
        float vq = 0.0f, vk = 0.0f;
        for (int t = tid; t < dk; t += nt) {
            vq += sq[t] * sq[t];
            vk += sk[t] * sk[t];
        }
        const float ssq = engine_cu_block_sum(vq, red32);
        const float ssk = engine_cu_block_sum(vk, red32);
        const float iq = 1.0f / sqrtf(ssq + 1e-6f), ik = 1.0f / sqrtf(ssk + 1e-6f);
        const float qscale = 1.0f / sqrtf((float)dk);
        __syncthreads();
        for (int t = tid; t < dk; t += nt) {
            sq[t] = sq[t] * iq * qscale;
            sk[t] = sk[t] * ik;
        }
        __syncthreads();

        /* the delta rule on this thread's column slice */
        const float g = gb[0], beta = gb[1];
        float s[DN_ROWS];
        float part = 0.0f;
    #pragma unroll
        for (int i = 0; i < DN_ROWS; i++) {
            s[i] = S[(size_t)(r0 + i) * dv + c] * g;
            part += s[i] * sk[r0 + i];
        }
        red[wi * DN_COLS + lane] = part;
        __syncthreads();
        if (wi == 0) {
            float t = 0.0f;
            for (int j = 0; j < nrw; j++)
                t += red[j * DN_COLS + lane];
            so[lane] = (sv[lane] - t) * beta;
        }
        __syncthreads();
        const float d = so[lane];
        part = 0.0f;
        float *snap_s = snap ? a.snap_state + snap_off + (size_t)h * dk * dv : nullptr;
    #pragma unroll
        for (int i = 0; i < DN_ROWS; i++) {
            s[i] += sk[r0 + i] * d;
            part += s[i] * sq[r0 + i];
            const size_t o = (size_t)(r0 + i) * dv + c;
            S[o] = s[i];
            if (snap_s) snap_s[o] = s[i];
        }
        red[wi * DN_COLS + lane] = part;
        __syncthreads();
        /* o of the block's columns, and their sum of squares, for the head's RMSNorm */
        float *oh = a.out + (size_t)h * dv;
        if (wi == 0) {
            float o = 0.0f;
            for (int j = 0; j < nrw; j++)
                o += red[j * DN_COLS + lane];
            oh[c] = o;
            const float sq2 = engine_cu_warp_sum(o * o);
            if (lane == 0) a.ssq[(size_t)h * gridDim.y + cb] = sq2;
        }
        __threadfence();
        __syncthreads();
        if (tid == 0) last = atomicAdd(&a.counters[h], 1u) == gridDim.y - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
        /* the last column block of the head: gated RMSNorm over all dv outputs */
        float ss = 0.0f;
        for (unsigned j = 0; j < gridDim.y; j++)
            ss += __ldcg(a.ssq + (size_t)h * gridDim.y + j);
        const float scale = 1.0f / sqrtf(ss / (float)dv + a.eps);
        for (int i = tid; i < dv; i += nt) {
            const float o = __ldcg(oh + i), zv = a.z[(size_t)h * dv + i];
            const float y = a.norm_w[i] * (o * scale);
            oh[i] = y * (zv / (1.0f + expf(-zv)));
        }
        if (tid == 0) a.counters[h] = 0;
    }
}

void engine_cu_deltanet_step(const engine_cu_delta *a, cudaStream_t stream) {
    const int threads = a->dk / DN_ROWS * 32;
    const size_t smem = sizeof(float) * (2 * (size_t)a->dk + (size_t)(a->dk / DN_ROWS) * DN_COLS);
    const dim3 grid(a->nv, a->dv / DN_COLS);
    const bool early = a->early && a->dv <= threads && threads <= DN_EARLY_THREADS;
    if (early && a->early == 2 && grid.y <= DN_MAX_CLUSTER) {
        /* programmatic serialisation (not for serial 1) plus the cluster of a head's blocks */
        engine_cu_launch_ex(deltanet_kernel<true, true>, grid, dim3(threads), smem, stream,
                            a->serial != 1, grid.y, *a);
    } else if (early && a->serial == 1) {
        deltanet_kernel<true><<<grid, dim3(threads), smem, stream>>>(*a);
    } else if (early) {
        engine_cu_launch(deltanet_kernel<true>, grid, dim3(threads), smem, stream, *a);
    } else {
        engine_cu_launch(deltanet_kernel<false>, grid, dim3(threads), smem, stream, *a);
    }
}

ENGINE_CU_TRACE_TU(deltanet)
