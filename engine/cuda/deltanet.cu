/* The Gated DeltaNet decode step and the shared-expert gate (contracts in deltanet.cuh). */
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

/* Grid (nv, dv / DN_COLS); dk / DN_ROWS warps: lane = column c0 + lane, warp w = rows
 * w * DN_ROWS .. + DN_ROWS. */
__global__ void __launch_bounds__(DN_MAX_DK / DN_ROWS * 32) deltanet_kernel(engine_cu_delta a) {
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
    /* this block's state lines into L2 while the projections finish (a line: 32 columns) */
    if (lane < DN_ROWS)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(S + (size_t)(r0 + lane) * dv + c0));
    engine_cu_pdl_wait();
    const int32_t pos = *a.pos;
    const bool snap = a.snap_state && (pos + 1) % a.snap_every == 0;
    const size_t snap_off =
        snap ? (size_t)(((pos + 1) / a.snap_every) % a.n_snap) * a.snap_stride : 0;

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

void engine_cu_deltanet_step(const engine_cu_delta *a, cudaStream_t stream) {
    const int threads = a->dk / DN_ROWS * 32;
    const size_t smem = sizeof(float) * (2 * (size_t)a->dk + (size_t)(a->dk / DN_ROWS) * DN_COLS);
    engine_cu_launch(deltanet_kernel, dim3(a->nv, a->dv / DN_COLS), dim3(threads), smem, stream,
                     *a);
}
