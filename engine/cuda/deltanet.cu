/* The Gated DeltaNet decode step and the shared-expert gate (contracts in deltanet.cuh). */
#include <cooperative_groups.h>
#include <math.h>

#include "deltanet.cuh"
#include "deltanet_dev.cuh"
#include "matvec_dev.cuh"

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
/* The work of one block: value head h, column block cb of the head's nc (the kernel below:
 * blockIdx.x, blockIdx.y); with CLUSTER the head's column block j is cluster rank rank0 + j.
 * `wait()` where the block waits for its inputs (the kernel below: the PDL wait; the fused
 * in-projection kernel: its projections and a cluster barrier). */
template <bool EARLY, bool CLUSTER, typename W>
__device__ __forceinline__ void dn_block(const engine_cu_delta &a, float *dn_smem, int h, int cb,
                                         int nc, unsigned rank0, const W &wait) {
    __shared__ float red32[32];
    __shared__ float gb[2]; /* g, beta */
    __shared__ float sv[DN_COLS], so[DN_COLS];
    __shared__ int last;
    const int dk = a.dk, dv = a.dv, K = a.K, nk = a.nk, nv = a.nv;
    const int nrw = dk / DN_ROWS;                       /* row warps */
    float *sq = dn_smem, *sk = sq + dk, *red = sk + dk; /* red: [nrw][DN_COLS] */
    const int c0 = cb * DN_COLS;
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
    wait();
    if constexpr (!EARLY) pos = *a.pos;
    const bool snap = a.snap_state && (pos + 1) % a.snap_every == 0;
    const size_t snap_off =
        snap ? (size_t)(((pos + 1) / a.snap_every) % a.n_snap) * a.snap_stride : 0;

    if constexpr (EARLY) {
        /* the activations first (one round trip), then the conv from registers */
        float be = 0.0f, ale = 0.0f, ze = 0.0f;
        if (tid == 0) {
            be = __ldcg(a.beta + h);
            ale = __ldcg(a.alpha + h);
        }
        if constexpr (CLUSTER)
            ze = __ldcg(a.z + (size_t)h * dv + c);
        else if (tid < dv)
            ze = __ldcg(a.z + (size_t)h * dv + tid);
        float xin[2];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int t = tid + j * nt;
            bool own;
            xin[j] = t < 2 * dk + DN_COLS
                         ? __ldcg(a.qkv + dn_channel(t, dk, nk, kh, h, dv, c0, owner, own))
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
                for (int j = 0; j < nc; j++)
                    ss += *cl.map_shared_rank(&ssq_mine, rank0 + j);
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
            if (lane == 0) a.ssq[(size_t)h * nc + cb] = sq2;
        }
        __threadfence();
        __syncthreads();
        if (tid == 0) last = atomicAdd(&a.counters[h], 1u) == nc - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
        float ss = 0.0f;
        for (int j = 0; j < nc; j++)
            ss += __ldcg(a.ssq + (size_t)h * nc + j);
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
            if (lane == 0) a.ssq[(size_t)h * nc + cb] = sq2;
        }
        __threadfence();
        __syncthreads();
        if (tid == 0) last = atomicAdd(&a.counters[h], 1u) == nc - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
        /* the last column block of the head: gated RMSNorm over all dv outputs */
        float ss = 0.0f;
        for (int j = 0; j < nc; j++)
            ss += __ldcg(a.ssq + (size_t)h * nc + j);
        const float scale = 1.0f / sqrtf(ss / (float)dv + a.eps);
        for (int i = tid; i < dv; i += nt) {
            const float o = __ldcg(oh + i), zv = a.z[(size_t)h * dv + i];
            const float y = a.norm_w[i] * (o * scale);
            oh[i] = y * (zv / (1.0f + expf(-zv)));
        }
        if (tid == 0) a.counters[h] = 0;
    }
}

struct dn_pdl_wait {
    __device__ __forceinline__ void operator()() const {
        engine_cu_pdl_wait();
    }
};

template <bool EARLY, bool CLUSTER = false>
__global__ void
    __launch_bounds__(EARLY ? DN_EARLY_THREADS : DN_MAX_DK / DN_ROWS * 32, EARLY ? 1 : 0)
        deltanet_kernel(engine_cu_delta a) {
    extern __shared__ float dn_smem[];
    dn_block<EARLY, CLUSTER>(a, dn_smem, blockIdx.x, blockIdx.y, gridDim.y, 0u, dn_pdl_wait());
}

void engine_cu_deltanet_step(const engine_cu_delta *a, cudaStream_t stream) {
    const int threads = a->dk / DN_ROWS * 32;
    const size_t smem = sizeof(float) * (2 * (size_t)a->dk + (size_t)(a->dk / DN_ROWS) * DN_COLS);
    const dim3 grid(a->nv, a->dv / DN_COLS);
    const bool early = a->early && a->dv <= threads && threads <= DN_EARLY_THREADS;
    if (early && a->early == 2 && grid.y <= DN_MAX_CLUSTER) {
        /* engine_cu_launch's programmatic serialisation plus the cluster of a head's blocks */
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = grid;
        cfg.blockDim = dim3(threads);
        cfg.dynamicSmemBytes = smem;
        cfg.stream = stream;
        cudaLaunchAttribute at[2];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = a->serial == 1 ? 0 : 1;
        at[1].id = cudaLaunchAttributeClusterDimension;
        at[1].val.clusterDim.x = 1;
        at[1].val.clusterDim.y = grid.y;
        at[1].val.clusterDim.z = 1;
        cfg.attrs = at;
        cfg.numAttrs = 2;
        cudaLaunchKernelEx(&cfg, deltanet_kernel<true, true>, *a);
    } else if (early && a->serial == 1) {
        deltanet_kernel<true><<<grid, dim3(threads), smem, stream>>>(*a);
    } else if (early) {
        engine_cu_launch(deltanet_kernel<true>, grid, dim3(threads), smem, stream, *a);
    } else {
        engine_cu_launch(deltanet_kernel<false>, grid, dim3(threads), smem, stream, *a);
    }
}

/* ---- The in-projection and the step in one launch (engine_cu_dn_fused, deltanet.cuh) ---- */


/* Warp w's rows row0 + w, row0 + w + nw, ... (n rows) of matrix m: into L2. */
__device__ __forceinline__ void dn_in_prefetch(const engine_cu_mat &m, int row0, int n) {
    const int w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int i = w; i < n; i += nw)
        engine_cu_prefetch_l2(m.w + (size_t)(row0 + i) * m.row_bytes, m.row_bytes);
}

/* Warp w's rows of the n rows from row0 of m against the staged x: each row's sum is
 * mv_rows' (lane l takes chunks l, l + 32, ..., then the warp sum), so the decode matvec's bit
 * for bit whichever warp computes it. */
template <int MODE, int DN_IN_R>
__device__ __forceinline__ void dn_in_rows(const engine_cu_mat &m, int row0, int n, int n_chunks,
                                           const engine_cu_xv &xv) {
    const int w = threadIdx.x >> 5, nw = blockDim.x >> 5, lane = threadIdx.x & 31;
    const size_t rb = m.row_bytes;
    for (int i = w; i < n; i += DN_IN_R * nw) {
        const int nvalid = min(DN_IN_R, (n - i + nw - 1) / nw);
        const uint8_t *row = m.w + (size_t)(row0 + i) * rb;
        float acc[DN_IN_R];
        switch (m.type) {
#define DN_IN_CASE(T)                                                                              \
    case T:                                                                                        \
        if (MODE == engine_cu_x_mode(T))                                                           \
            mv_rows<T, DN_IN_R>(row, (size_t)nw * rb, nvalid, lane, 32, n_chunks, xv, acc);        \
        break;
            ENGINE_CU_QUANT_CASES(DN_IN_CASE)
#undef DN_IN_CASE
#define DN_IN_CASE(T)                                                                              \
    case T:                                                                                        \
        if (MODE == ENGINE_CU_X_F32)                                                               \
            mv_rows<T, DN_IN_R>(row, (size_t)nw * rb, nvalid, lane, 32, n_chunks, xv, acc);        \
        break;
            ENGINE_CU_FLOAT_CASES(DN_IN_CASE)
#undef DN_IN_CASE
        default:
#pragma unroll
            for (int j = 0; j < DN_IN_R; j++)
                acc[j] = 0.0f;
        }
#pragma unroll
        for (int j = 0; j < DN_IN_R; j++) {
            const float s = engine_cu_warp_sum(acc[j]);
            const int r = row0 + i + j * nw;
            if (lane == 0 && j < nvalid) m.y[r] = m.accumulate ? m.y[r] + s : s;
        }
    }
}

/* The block's projection rows (cluster rank r of key head kh; value head h, column block cb):
 * its share of kh's q and k channels, the v channels and z values of its columns, and (column
 * block 0) beta and alpha of h. */
struct dn_in_part {
    int qk0, n_qk; /* channels qk0 .. + n_qk (q or k of kh) */
    int v0, z0, n_col;
    bool ba;
};

__device__ __forceinline__ dn_in_part dn_in_part_of(const engine_cu_delta &a, int kh, int r,
                                                    int h, int cb) {
    const int csize = gridDim.x, n_qk = 2 * a.dk / csize, i0 = r * n_qk; /* r < csize */
    dn_in_part p;
    p.n_qk = n_qk;
    p.qk0 = i0 < a.dk ? kh * a.dk + i0 : a.nk * a.dk + kh * a.dk + (i0 - a.dk);
    p.v0 = 2 * a.nk * a.dk + h * a.dv + cb * DN_COLS;
    p.z0 = h * a.dv + cb * DN_COLS;
    p.n_col = DN_COLS;
    p.ba = cb == 0;
    return p;
}

/* dn_block's wait in the fused kernel: the PDL wait, the staging of attn_norm(x), the block's
 * projection rows into the activation buffers, and a cluster barrier (release / acquire: the
 * cluster's rows are visible to every block of it after it). */
template <int MODE, int R> struct dn_in_wait {
    const engine_cu_dn_in &in;
    const engine_cu_delta &a;
    uint8_t *sm;
    dn_in_part p;
    int h;
    __device__ __forceinline__ void operator()() const {
        const engine_cu_mv &mv = in.mv;
        dn_in_prefetch(mv.m[0], p.qk0, p.n_qk);
        dn_in_prefetch(mv.m[0], p.v0, p.n_col);
        dn_in_prefetch(mv.m[1], p.z0, p.n_col);
        if (mv.norm_w && (threadIdx.x >> 5) == 0)
            engine_cu_prefetch_l2((const uint8_t *)mv.norm_w, sizeof(float) * (size_t)mv.cols);
        engine_cu_pdl_wait();
        mv_stage<MODE>(mv, sm);
        const engine_cu_xv xv = engine_cu_xv_at(sm, mv.cols, MODE != ENGINE_CU_X_F32, 0);
        const int n_chunks = mv.cols >> 5;
        /* one call site (the row code once in the kernel: it runs cold from L2 otherwise):
         * q|k, v, z and (column block 0) beta's row h and alpha's (row nv + h) */
#pragma unroll 1
        for (int i = 0; i < (p.ba ? 5 : 3); i++) {
            const int mi = i < 2 ? 0 : i - 1 - (i == 4);
            const int r0 = i == 0 ? p.qk0 : i == 1 ? p.v0 : i == 2 ? p.z0 : i == 3 ? h : a.nv + h;
            const int n = i == 0 ? p.n_qk : i < 3 ? p.n_col : 1;
            engine_cu_mat m;
            m.w = mi == 0 ? mv.m[0].w : mi == 1 ? mv.m[1].w : mv.m[2].w;
            m.row_bytes = mi == 0 ? mv.m[0].row_bytes : mi == 1 ? mv.m[1].row_bytes : mv.m[2].row_bytes;
            m.type = mi == 0 ? mv.m[0].type : mi == 1 ? mv.m[1].type : mv.m[2].type;
            m.rows = 0; /* unused */
            m.y = mi == 0 ? mv.m[0].y : mi == 1 ? mv.m[1].y : mv.m[2].y;
            m.accumulate = mi == 0 ? mv.m[0].accumulate : mi == 1 ? mv.m[1].accumulate : mv.m[2].accumulate;
            dn_in_rows<MODE, R>(m, r0, n, n_chunks, xv);
        }
        cooperative_groups::this_cluster().sync();
    }
};

/* Grid (cluster size grp * nc, nk), clusters along x: rank r = jv * nc + cb serves value head
 * jv of key head blockIdx.y (h = kh + jv nk when v_tiled, else kh grp + jv), column block cb.
 * in.per_vhead: grid (nc, nv), a cluster per value head (rank = column block), each computing
 * its share of the key head's q and k rows (the value heads of a key head compute and store
 * the same values). */
template <int MODE, int R>
__global__ void __launch_bounds__(DN_EARLY_THREADS, 2)
    dn_fused_kernel(engine_cu_delta a, engine_cu_dn_in in) {
    extern __shared__ uint4 dnf_smem[];
    const int nc = a.dv / DN_COLS, r = blockIdx.x;
    int h, cb, kh, jv;
    if (in.per_vhead) {
        h = blockIdx.y, cb = r, jv = 0;
        kh = a.v_tiled ? h % a.nk : h / (a.nv / a.nk);
    } else {
        kh = blockIdx.y, jv = r / nc, cb = r % nc;
        h = a.v_tiled ? kh + jv * a.nk : kh * (a.nv / a.nk) + jv;
    }
    uint8_t *sm = (uint8_t *)dnf_smem;
    const size_t xs = (engine_cu_xs_bytes(MODE != ENGINE_CU_X_F32, in.mv.cols) + 15) & ~(size_t)15;
    const dn_in_wait<MODE, R> wait{in, a, sm, dn_in_part_of(a, kh, r, h, cb), h};
    dn_block<true, true>(a, (float *)(sm + xs), h, cb, nc, (unsigned)(jv * nc), wait);
}

static int dn_fused_csize(const engine_cu_delta *a, const engine_cu_dn_in *in) {
    return in->per_vhead ? a->dv / DN_COLS : a->nv / a->nk * (a->dv / DN_COLS);
}

bool engine_cu_dn_fused_ok(const engine_cu_delta *a, const engine_cu_dn_in *in) {
    const int threads = a->dk / DN_ROWS * 32;
    if (a->nk <= 0 || a->nv % a->nk != 0) return false;
    const int csize = dn_fused_csize(a, in);
    if (a->dv > threads || threads > DN_EARLY_THREADS || csize > DN_MAX_CLUSTER) return false;
    if ((2 * a->dk) % csize != 0 || a->dk % (2 * a->dk / csize) != 0) return false;
    const engine_cu_mv *mv = &in->mv;
    if (mv->n_mat != 3 || mv->cols % 32 != 0 || mv->m[2].rows != 2 * a->nv) return false;
    if (mv->m[0].rows != 2 * a->nk * a->dk + a->nv * a->dv || mv->m[1].rows != a->nv * a->dv)
        return false;
    const int mode = engine_cu_x_mode(mv->m[0].type);
    for (int i = 0; i < 3; i++)
        if (!engine_cu_type_supported(mv->m[i].type) || engine_cu_x_mode(mv->m[i].type) != mode)
            return false;
    return true;
}

typedef void (*dn_fused_fn)(engine_cu_delta, engine_cu_dn_in);

template <int R> static dn_fused_fn dn_fused_pick(int mode) {
    return mode == ENGINE_CU_X_F32    ? dn_fused_kernel<ENGINE_CU_X_F32, R>
           : mode == ENGINE_CU_X_Q8_0 ? dn_fused_kernel<ENGINE_CU_X_Q8_0, R>
                                      : dn_fused_kernel<ENGINE_CU_X_Q8_K, R>;
}

/* The launch of engine_cu_dn_fused (kernel, grid, cluster, shared memory). */
static cudaLaunchConfig_t dn_fused_cfg(const engine_cu_delta *a, const engine_cu_dn_in *in,
                                       cudaStream_t stream, cudaLaunchAttribute at[2],
                                       dn_fused_fn *k) {
    const int threads = a->dk / DN_ROWS * 32, csize = dn_fused_csize(a, in);
    const int mode = engine_cu_x_mode(in->mv.m[0].type);
    const size_t xs = (engine_cu_xs_bytes(mode != ENGINE_CU_X_F32, in->mv.cols) + 15) & ~(size_t)15;
    const size_t smem =
        xs + sizeof(float) * (2 * (size_t)a->dk + (size_t)(a->dk / DN_ROWS) * DN_COLS);
    *k = in->rows_at_once == 2 ? dn_fused_pick<2>(mode) : dn_fused_pick<4>(mode);
    if (smem > 48 * 1024)
        cudaFuncSetAttribute(*k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = in->per_vhead ? dim3(csize, a->nv) : dim3(csize, a->nk);
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    at[1].id = cudaLaunchAttributeClusterDimension;
    at[1].val.clusterDim.x = csize;
    at[1].val.clusterDim.y = 1;
    at[1].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 2;
    return cfg;
}

void engine_cu_dn_fused(const engine_cu_delta *a, const engine_cu_dn_in *in, cudaStream_t stream) {
    cudaLaunchAttribute at[2];
    dn_fused_fn k;
    const cudaLaunchConfig_t cfg = dn_fused_cfg(a, in, stream, at, &k);
    cudaLaunchKernelEx(&cfg, k, *a, *in);
}

int engine_cu_dn_fused_clusters(const engine_cu_delta *a, const engine_cu_dn_in *in) {
    cudaLaunchAttribute at[2];
    dn_fused_fn k;
    cudaLaunchConfig_t cfg = dn_fused_cfg(a, in, 0, at, &k);
    cfg.attrs = at + 1; /* the cluster only */
    cfg.numAttrs = 1;
    int n = 0;
    return cudaOccupancyMaxActiveClusters(&n, k, &cfg) == cudaSuccess ? n : -1;
}
