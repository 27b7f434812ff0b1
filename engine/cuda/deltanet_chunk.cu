/* The Gated DeltaNet block of qwen35moe over a prefill chunk: causal conv, conv ring and its
 * snapshots, the chunked delta rule, gated RMSNorm (contracts in q35_prefill.cuh). */
#include <math.h>

#include "deltanet.cuh" /* ENGINE_CU_DELTA_MAX_CONV */
#include "deltanet_dev.cuh"
#include "q35_prefill.cuh"

#define DC_L ENGINE_CUDA_Q35_SNAP_EVERY /* tokens of a sub-chunk at most (the snapshot grid) */
#define DC_ROWS 16                      /* state rows a thread keeps in registers */
#define DC_COLS 32                      /* state columns of a block (its lanes) */
#define DC_MAX_DK 256
#define CONV_T 16 /* tokens per thread of the conv kernel */
static_assert(DC_L <= 32, "a sub-chunk's tokens fit the lanes of one warp");

int32_t engine_cu_q35_snap_floor(int32_t pos0, int32_t n) {
    const int32_t last = (pos0 + n) / ENGINE_CUDA_Q35_SNAP_EVERY * ENGINE_CUDA_Q35_SNAP_EVERY;
    return last - ENGINE_CUDA_Q35_SNAP_EVERY * ENGINE_CUDA_Q35_SNAPSHOTS;
}

/* The conv input of position p for channel c: the chunk's projections from pos0 on, the ring
 * before (zero before position 0). */
__device__ __forceinline__ float dc_xin(const engine_cu_q35_conv_args &a, int p, int c) {
    if (p >= a.pos0) return a.qkv[(size_t)(p - a.pos0) * a.C + c];
    if (p < 0) return 0.0f;
    return a.ring[(size_t)c * a.K + p % a.K];
}

/* Grid (C / 128, n / CONV_T) of 128: thread (channel, CONV_T tokens). */
__global__ void __launch_bounds__(128) q35_conv_kernel(engine_cu_q35_conv_args a) {
    const int c = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    const int t0 = (int)blockIdx.y * CONV_T;
    if (c >= a.C) return;
    const int K = a.K;
    float w[ENGINE_CU_DELTA_MAX_CONV], win[ENGINE_CU_DELTA_MAX_CONV];
    for (int i = 0; i < K; i++)
        w[i] = a.conv_w[(size_t)c * K + i];
    /* win[i]: the input of position pos0 + t - (K - 1) + i */
    for (int i = 0; i < K - 1; i++)
        win[i] = dc_xin(a, a.pos0 + t0 - (K - 1) + i, c);
    for (int t = t0; t < min(t0 + CONV_T, a.n); t++) {
        win[K - 1] = a.qkv[(size_t)t * a.C + c];
        float y = 0.0f;
        for (int i = 0; i < K; i++)
            y += w[i] * win[i];
        a.cv[(size_t)t * a.C + c] = engine_cu_dn_silu(y);
        for (int i = 0; i < K - 1; i++)
            win[i] = win[i + 1];
    }
}

void engine_cu_q35_conv(const engine_cu_q35_conv_args *a, cudaStream_t stream) {
    if (a->n <= 0) return;
    const dim3 grid((unsigned)((a->C + 127) / 128), (unsigned)((a->n + CONV_T - 1) / CONV_T));
    q35_conv_kernel<<<grid, 128, 0, stream>>>(*a);
}

/* A thread per channel: the ring at each kept snapshot point, then the ring after the chunk
 * (read before written: the thread owns its channel's slots). */
__global__ void q35_ring_kernel(engine_cu_q35_conv_args a, int32_t floor) {
    const int c = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (c >= a.C) return;
    const int K = a.K, E = ENGINE_CUDA_Q35_SNAP_EVERY;
    if (a.snap_ring)
        for (int b = (a.pos0 / E + 1) * E; b <= a.pos0 + a.n; b += E) {
            if (b <= floor) continue;
            float *dst = a.snap_ring +
                         (size_t)((b / E) % ENGINE_CUDA_Q35_SNAPSHOTS) * a.snap_stride +
                         (size_t)c * K;
            for (int p = b - K; p < b; p++)
                dst[((p % K) + K) % K] = dc_xin(a, p, c);
        }
    for (int p = max(a.pos0, a.pos0 + a.n - K); p < a.pos0 + a.n; p++)
        a.ring[(size_t)c * K + p % K] = a.qkv[(size_t)(p - a.pos0) * a.C + c];
}

void engine_cu_q35_ring(const engine_cu_q35_conv_args *a, cudaStream_t stream) {
    if (a->n <= 0) return;
    q35_ring_kernel<<<(a->C + 255) / 256, 256, 0, stream>>>(
        *a, engine_cu_q35_snap_floor(a->pos0, a->n));
}

bool engine_cu_q35_delta_ok(int dk, int dv) {
    return dk >= 32 && dk % 32 == 0 && dk <= DC_MAX_DK && dv >= 32 && dv % DC_COLS == 0;
}

/* dst[t][j] = sum over the row warps w of red[w][t][j] (t < L, j < DC_COLS), the block's
 * threads striding over (t, j). */
__device__ __forceinline__ void dc_colsum(const float *red, float *dst, int L, int nrw) {
    for (int idx = threadIdx.x; idx < L * DC_COLS; idx += blockDim.x) {
        const int t = idx / DC_COLS, j = idx - t * DC_COLS;
        float sum = 0.0f;
        for (int w = 0; w < nrw; w++)
            sum += red[(w * DC_L + t) * DC_COLS + j];
        dst[idx] = sum;
    }
}

/* red[wi][t][lane] = this thread's rows of S0 times x_t (rows r0 .. r0 + DC_ROWS of x[t]). */
__device__ __forceinline__ void dc_rowdot(const float s[DC_ROWS], const float *x, int LD, int L,
                                          int r0, float *red) {
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
#pragma unroll
    for (int t = 0; t < DC_L; t++)
        if (t < L) {
            float acc = 0.0f;
#pragma unroll
            for (int i = 0; i < DC_ROWS; i++)
                acc += s[i] * x[t * LD + r0 + i];
            red[(wi * DC_L + t) * DC_COLS + lane] = acc;
        }
}

static size_t dc_smem_floats(int dk) {
    const int nrw = dk / DC_ROWS;
    return 2 * (size_t)DC_L * (dk + 1) + 4 * (size_t)DC_L * DC_COLS +
           (size_t)nrw * DC_L * DC_COLS + 2 * (size_t)DC_L * (DC_L + 1) + 3 * (size_t)DC_L;
}

/* Grid (nv, dv / DC_COLS); dk / DC_ROWS warps: lane = column c0 + lane, warp w = state rows
 * w * DC_ROWS .. + DC_ROWS, as the decode step (deltanet.cu). */
__global__ void __launch_bounds__(DC_MAX_DK / DC_ROWS * 32)
    q35_delta_chunk_kernel(engine_cu_q35_delta_args a, int32_t floor) {
    extern __shared__ float dc_smem[];
    const int dk = a.dk, dv = a.dv, nk = a.nk, nv = a.nv, C = a.C, LD = dk + 1;
    const int nrw = dk / DC_ROWS;
    float *sQ = dc_smem;                 /* [DC_L][LD] */
    float *sK = sQ + DC_L * LD;          /* [DC_L][LD] */
    float *sV = sK + DC_L * LD;          /* [DC_L][DC_COLS] */
    float *sKS = sV + DC_L * DC_COLS;    /* S0^T k_t */
    float *sQS = sKS + DC_L * DC_COLS;   /* S0^T q_t */
    float *sU = sQS + DC_L * DC_COLS;    /* u_t */
    float *red = sU + DC_L * DC_COLS;    /* [nrw][DC_L][DC_COLS] */
    float *sKK = red + nrw * DC_L * DC_COLS; /* [DC_L][DC_L + 1] k_t . k_s */
    float *sQK = sKK + DC_L * (DC_L + 1);    /* q_t . k_s */
    float *sG = sQK + DC_L * (DC_L + 1);     /* cumulative log decay */
    float *sB = sG + DC_L;                   /* beta */
    float *sLg = sB + DC_L;                  /* log decay */
    const int h = blockIdx.x, c0 = blockIdx.y * DC_COLS;
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, wi = tid >> 5;
    const int kh = a.v_tiled ? h % nk : h / (nv / nk);
    const int c = c0 + lane, r0 = wi * DC_ROWS;
    const float A = a.a[h], dt = a.dt_bias[h], qscale = 1.0f / sqrtf((float)dk);
    float *S = a.state + (size_t)h * dk * dv;
    float s[DC_ROWS];
#pragma unroll
    for (int i = 0; i < DC_ROWS; i++)
        s[i] = S[(size_t)(r0 + i) * dv + c];
    for (int t0 = 0; t0 < a.n;) {
        const int L = min(a.n - t0, DC_L - (a.pos0 + t0) % DC_L);
        __syncthreads(); /* the previous sub-chunk's shared values are consumed */
        for (int idx = tid; idx < L * dk; idx += nt) {
            const int t = idx / dk, r = idx - t * dk;
            const float *row = a.cv + (size_t)(t0 + t) * C;
            sQ[t * LD + r] = row[kh * dk + r];
            sK[t * LD + r] = row[nk * dk + kh * dk + r];
        }
        for (int idx = tid; idx < L * DC_COLS; idx += nt) {
            const int t = idx / DC_COLS, j = idx - t * DC_COLS;
            sV[idx] = a.cv[(size_t)(t0 + t) * C + 2 * nk * dk + h * dv + c0 + j];
        }
        if (tid < L) {
            const float *br = a.ba + (size_t)(t0 + tid) * 2 * nv;
            sB[tid] = 1.0f / (1.0f + expf(-br[h]));
            sLg[tid] = A * engine_cu_dn_softplus(br[nv + h] + dt);
        }
        __syncthreads();
        /* l2norm of q (times 1 / sqrt(dk)) and k: a warp per token */
        for (int t = wi; t < L; t += nrw) {
            float vq = 0.0f, vk = 0.0f;
            for (int r = lane; r < dk; r += 32) {
                vq += sQ[t * LD + r] * sQ[t * LD + r];
                vk += sK[t * LD + r] * sK[t * LD + r];
            }
            vq = engine_cu_warp_sum(vq);
            vk = engine_cu_warp_sum(vk);
            const float iq = 1.0f / sqrtf(vq + 1e-6f) * qscale, ik = 1.0f / sqrtf(vk + 1e-6f);
            for (int r = lane; r < dk; r += 32) {
                sQ[t * LD + r] *= iq;
                sK[t * LD + r] *= ik;
            }
        }
        if (tid == 0) {
            float g = 0.0f;
            for (int t = 0; t < L; t++) {
                g += sLg[t];
                sG[t] = g;
            }
        }
        __syncthreads();
        /* S0^T k_t: this thread's rows, then the sum over the row warps; then S0^T q_t */
        dc_rowdot(s, sK, LD, L, r0, red);
        __syncthreads();
        dc_colsum(red, sKS, L, nrw);
        __syncthreads();
        dc_rowdot(s, sQ, LD, L, r0, red);
        /* k_t . k_s (s < t) and q_t . k_s (s <= t) */
        for (int idx = tid; idx < L * L; idx += nt) {
            const int t = idx / L, u = idx - t * L;
            if (u > t) continue;
            float kk = 0.0f, qk = 0.0f;
            for (int r = 0; r < dk; r++) {
                kk += sK[t * LD + r] * sK[u * LD + r];
                qk += sQ[t * LD + r] * sK[u * LD + r];
            }
            sKK[t * (DC_L + 1) + u] = kk;
            sQK[t * (DC_L + 1) + u] = qk;
        }
        __syncthreads();
        dc_colsum(red, sQS, L, nrw);
        /* the corrections u_t, one column per lane of warp 0 (forward substitution) */
        if (wi == 0)
            for (int t = 0; t < L; t++) {
                float acc = sV[t * DC_COLS + lane] - expf(sG[t]) * sKS[t * DC_COLS + lane];
                for (int u = 0; u < t; u++)
                    acc -= expf(sG[t] - sG[u]) * sKK[t * (DC_L + 1) + u] * sU[u * DC_COLS + lane];
                sU[t * DC_COLS + lane] = sB[t] * acc;
            }
        __syncthreads();
        /* outputs: a warp per token */
        for (int t = wi; t < L; t += nrw) {
            float o = expf(sG[t]) * sQS[t * DC_COLS + lane];
            for (int u = 0; u <= t; u++)
                o += expf(sG[t] - sG[u]) * sQK[t * (DC_L + 1) + u] * sU[u * DC_COLS + lane];
            a.out[(size_t)(t0 + t) * nv * dv + (size_t)h * dv + c] = o;
        }
        /* the fold: S = e^{G_L} S0 + sum_t e^{G_L - G_t} k_t u_t^T */
        const float gl = sG[L - 1], el = expf(gl);
#pragma unroll
        for (int i = 0; i < DC_ROWS; i++)
            s[i] *= el;
        for (int t = 0; t < L; t++) {
            const float w = expf(gl - sG[t]) * sU[t * DC_COLS + lane];
#pragma unroll
            for (int i = 0; i < DC_ROWS; i++)
                s[i] += sK[t * LD + r0 + i] * w;
        }
        t0 += L;
        const int b = a.pos0 + t0;
        if (a.snap_state && b % DC_L == 0 && b > floor) {
            float *dst = a.snap_state +
                         (size_t)((b / DC_L) % ENGINE_CUDA_Q35_SNAPSHOTS) * a.snap_stride +
                         (size_t)h * dk * dv;
#pragma unroll
            for (int i = 0; i < DC_ROWS; i++)
                dst[(size_t)(r0 + i) * dv + c] = s[i];
        }
    }
#pragma unroll
    for (int i = 0; i < DC_ROWS; i++)
        S[(size_t)(r0 + i) * dv + c] = s[i];
}

void engine_cu_q35_delta_chunk(const engine_cu_q35_delta_args *a, cudaStream_t stream) {
    if (a->n <= 0) return;
    const size_t smem = sizeof(float) * dc_smem_floats(a->dk);
    cudaFuncSetAttribute(q35_delta_chunk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)smem);
    q35_delta_chunk_kernel<<<dim3((unsigned)a->nv, (unsigned)(a->dv / DC_COLS)),
                             (unsigned)(a->dk / DC_ROWS * 32), smem, stream>>>(
        *a, engine_cu_q35_snap_floor(a->pos0, a->n));
}

/* Block (token, value head): gated RMSNorm over the head's dv outputs. */
__global__ void q35_gnorm_kernel(float *o, const float *z, const float *norm_w, int nv, int dv,
                                 float eps) {
    __shared__ float red[32];
    const int t = blockIdx.x / nv, h = blockIdx.x - t * nv;
    float *oh = o + ((size_t)t * nv + h) * dv;
    const float *zh = z + ((size_t)t * nv + h) * dv;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dv; i += blockDim.x)
        ss += oh[i] * oh[i];
    ss = engine_cu_block_sum(ss, red);
    const float scale = 1.0f / sqrtf(ss / (float)dv + eps);
    for (int i = threadIdx.x; i < dv; i += blockDim.x) {
        const float zv = zh[i];
        oh[i] = norm_w[i] * (oh[i] * scale) * (zv / (1.0f + expf(-zv)));
    }
}

void engine_cu_q35_gnorm(float *o, const float *z, const float *norm_w, int n, int nv, int dv,
                         float eps, cudaStream_t stream) {
    if (n > 0) q35_gnorm_kernel<<<n * nv, 128, 0, stream>>>(o, z, norm_w, nv, dv, eps);
}

ENGINE_CU_TRACE_TU(deltanet_chunk)
