/* The Gated DeltaNet decode step and the shared-expert gate (contracts in deltanet.cuh). */
#include <math.h>

#include "deltanet.cuh"

#define DN_ROWS 32          /* state rows a thread keeps in registers */
#define DN_MAX_THREADS 512  /* dk * dv / DN_ROWS */

bool engine_cu_deltanet_ok(int dk, int dv, int K) {
    return dk >= 32 && dv >= 32 && dk % 32 == 0 && dv % 32 == 0 &&
           dk * dv / DN_ROWS <= DN_MAX_THREADS && K >= 1 && K <= ENGINE_CU_DELTA_MAX_CONV;
}

__device__ __forceinline__ float dn_silu(float y) {
    return y / (1.0f + expf(-y));
}

__device__ __forceinline__ float dn_softplus(float x) {
    return x > 20.0f ? x : log1pf(expf(x)); /* torch's threshold, as the CPU */
}

/* Grid: one block per value head; dk * dv / DN_ROWS threads (warp w: column group w % (dv /
 * 32), row group w / (dv / 32)). */
__global__ void __launch_bounds__(DN_MAX_THREADS) deltanet_kernel(engine_cu_delta a) {
    extern __shared__ float dn_smem[];
    __shared__ float red32[32];
    __shared__ float gb[2]; /* g, beta */
    const int dk = a.dk, dv = a.dv, K = a.K, nk = a.nk, nv = a.nv;
    float *sq = dn_smem, *sk = sq + dk, *sv = sk + dk, *so = sv + dv, *red = so + dv;
    const int h = blockIdx.x, tid = threadIdx.x, nt = blockDim.x, lane = tid & 31;
    const int grp = nv / nk, kh = a.v_tiled ? h % nk : h / grp;
    const bool owner = a.v_tiled ? h < nk : h % grp == 0;
    const int wi = tid >> 5, ncg = dv >> 5, cg = wi % ncg, rg = wi / ncg;
    const int c = cg * 32 + lane, r0 = rg * DN_ROWS;
    float *S = a.state + (size_t)h * dk * dv;
    engine_cu_pdl_launch();
    /* this head's state lines into L2 while the projections finish (a line: 32 columns) */
    if (lane == 0)
        for (int i = 0; i < DN_ROWS; i++)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(S + (size_t)(r0 + i) * dv + cg * 32));
    engine_cu_pdl_wait();
    const int32_t pos = *a.pos;
    const bool snap = a.snap_state && (pos + 1) % a.snap_every == 0;
    const size_t snap_off = snap ? (size_t)(((pos + 1) / a.snap_every) % a.n_snap) * a.snap_stride
                                 : 0;

    /* causal conv + SiLU of the head's 2 dk + dv channels */
    for (int t = tid; t < 2 * dk + dv; t += nt) {
        int ch;
        bool own;
        float *dst;
        if (t < dk) {
            ch = kh * dk + t, own = owner, dst = sq + t;
        } else if (t < 2 * dk) {
            ch = nk * dk + kh * dk + (t - dk), own = owner, dst = sk + (t - dk);
        } else {
            ch = 2 * nk * dk + h * dv + (t - 2 * dk), own = true, dst = sv + (t - 2 * dk);
        }
        const float xin = a.qkv[ch];
        const float *w = a.conv_w + (size_t)ch * K;
        float *ring = a.ring + (size_t)ch * K;
        float y = w[K - 1] * xin;
        for (int i = 0; i < K - 1; i++) {
            const int p = pos - (K - 1) + i;
            y += w[i] * ring[((p % K) + K) % K];
        }
        *dst = dn_silu(y);
        if (own) {
            ring[pos % K] = xin;
            if (snap)
                for (int i = 0; i < K; i++)
                    a.snap_ring[snap_off + (size_t)ch * K + i] = ring[i];
        }
    }
    if (tid == 0) {
        const float b = a.beta[h], al = a.alpha[h];
        gb[0] = expf(a.a[h] * dn_softplus(al + a.dt_bias[h]));
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
    red[rg * dv + c] = part;
    __syncthreads();
    if (rg == 0) {
        float t = 0.0f;
        for (int j = 0; j < dk / DN_ROWS; j++)
            t += red[j * dv + c];
        so[c] = (sv[c] - t) * beta;
    }
    __syncthreads();
    const float d = so[c];
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
    red[rg * dv + c] = part;
    __syncthreads();
    float o = 0.0f;
    if (rg == 0)
        for (int j = 0; j < dk / DN_ROWS; j++)
            o += red[j * dv + c];
    /* gated RMSNorm over the head's dv outputs (threads tid < dv hold them: rg 0, c = tid) */
    const float ss = engine_cu_block_sum(rg == 0 ? o * o : 0.0f, red32);
    if (rg == 0) {
        const float scale = 1.0f / sqrtf(ss / (float)dv + a.eps);
        const float zv = a.z[(size_t)h * dv + c];
        float y = a.norm_w[c] * (o * scale);
        a.out[(size_t)h * dv + c] = y * (zv / (1.0f + expf(-zv)));
    }
}

void engine_cu_deltanet_step(const engine_cu_delta *a, cudaStream_t stream) {
    const int threads = a->dk * a->dv / DN_ROWS;
    const size_t smem = sizeof(float) * (2 * (size_t)a->dk + 2 * (size_t)a->dv +
                                         (size_t)(a->dk / DN_ROWS) * a->dv);
    engine_cu_launch(deltanet_kernel, dim3(a->nv), dim3(threads), smem, stream, *a);
}

__global__ void shgate_kernel(const float *logit, float *w, int32_t *id, int32_t id_value) {
    engine_cu_pdl_launch();
    engine_cu_pdl_wait();
    if (threadIdx.x == 0) {
        w[0] = 1.0f / (1.0f + expf(-logit[0]));
        id[0] = id_value;
    }
}

void engine_cu_q35_shgate(const float *logit, float *w, int32_t *id, int32_t id_value,
                          cudaStream_t stream) {
    engine_cu_launch(shgate_kernel, dim3(1), dim3(32), 0, stream, logit, w, id, id_value);
}
