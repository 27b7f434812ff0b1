/* Gated decode attention of qwen35moe (contract in qwen35_attn.cuh). */
#include <cuda_fp16.h>
#include <math.h>

#include "qwen35_attn.cuh"

#define GATT_THREADS 256
#define GATT_WARPS (GATT_THREADS / 32)
#define SPL ENGINE_CU_GATT_SPLIT
static_assert(SPL <= 32, "the softmax takes a split's scores one per lane");

bool engine_cu_gatt_ok(int n_head, int n_kv, int hd, int rot) {
    if (n_kv < 1 || n_head % n_kv) return false;
    const int g = n_head / n_kv;
    return (hd == 64 || hd == 128 || hd == 256) &&
           (g == 1 || g == 2 || g == 4 || g == 8 || g == 16) && rot >= 2 && rot % 2 == 0 &&
           rot <= hd;
}

int engine_cu_gatt_splits(int n_ctx) {
    return (n_ctx + SPL - 1) / SPL;
}

__device__ __forceinline__ float gatt_load(const void *cache, int f32, size_t i) {
    return f32 ? ((const float *)cache)[i] : __half2float(((const __half *)cache)[i]);
}

/* dst[0..HD) = rope(rmsnorm(src) * w) by one warp (dst in shared memory). */
template <int HD>
__device__ __forceinline__ void gatt_norm_rope(const float *src, const float *w, float eps,
                                               const float2 *cs, int half, float *dst) {
    const int lane = threadIdx.x & 31;
    float v[HD / 32], ss = 0.0f;
#pragma unroll
    for (int t = 0; t < HD / 32; t++) {
        v[t] = src[lane + 32 * t];
        ss += v[t] * v[t];
    }
    ss = engine_cu_warp_sum(ss);
    const float scale = 1.0f / sqrtf(ss / (float)HD + eps);
#pragma unroll
    for (int t = 0; t < HD / 32; t++) {
        v[t] = w[lane + 32 * t] * (v[t] * scale);
        dst[lane + 32 * t] = v[t];
    }
    __syncwarp();
    float r[HD / 32];
#pragma unroll
    for (int t = 0; t < HD / 32; t++) {
        const int i = lane + 32 * t;
        r[t] = v[t];
        if (i < half) {
            const float2 c = cs[i];
            r[t] = v[t] * c.x - dst[i + half] * c.y;
        } else if (i < 2 * half) {
            const float2 c = cs[i - half];
            r[t] = dst[i - half] * c.y + v[t] * c.x;
        }
    }
    __syncwarp();
#pragma unroll
    for (int t = 0; t < HD / 32; t++)
        dst[lane + 32 * t] = r[t];
    __syncwarp();
}

/* Grid (n_kv, runners) of GATT_THREADS. */
template <int G, int HD>
__global__ void __launch_bounds__(GATT_THREADS) gatt_kernel(engine_cu_gatt a) {
    constexpr int PG = GATT_THREADS / HD; /* position groups of the V sums */
    extern __shared__ float ga_smem[];
    __shared__ float ml[G][2];
    __shared__ int last;
    const int g = blockIdx.x, tid = threadIdx.x, lane = tid & 31, wi = tid >> 5;
    float *qs = ga_smem;           /* [G][HD] */
    float *e = qs + G * HD;        /* [G][SPL] */
    float *red = e + G * SPL;      /* [PG][G][HD] */
    float *kr = red + PG * G * HD; /* [HD] */
    engine_cu_pdl_launch();
    engine_cu_pdl_wait();
    const int pos = *a.pos, n = pos + 1, nsplit = (n + SPL - 1) / SPL;
    const int nact = min((int)gridDim.y, nsplit);
    if ((int)blockIdx.y >= nact) return;
    const int max_splits = (a.n_ctx + SPL - 1) / SPL, half = a.rot / 2;
    const size_t row = (size_t)a.n_kv * HD;
    const float2 *cs = a.rope + (size_t)pos * half;
    for (int h = wi; h < G; h += GATT_WARPS)
        gatt_norm_rope<HD>(a.qg + (size_t)(g * G + h) * 2 * HD, a.q_norm, a.eps, cs, half,
                           qs + h * HD);
    if ((int)blockIdx.y == (pos / SPL) % nact && wi == GATT_WARPS - 1) {
        /* this position's K and V rows, read by this block alone */
        gatt_norm_rope<HD>(a.k + (size_t)g * HD, a.k_norm, a.eps, cs, half, kr);
        const size_t o = (size_t)pos * row + (size_t)g * HD;
#pragma unroll
        for (int t = 0; t < HD / 32; t++) {
            const int i = lane + 32 * t;
            const float vv = a.v[(size_t)g * HD + i];
            if (a.kv_f32) {
                ((float *)a.k_cache)[o + i] = kr[i];
                ((float *)a.v_cache)[o + i] = vv;
            } else {
                ((__half *)a.k_cache)[o + i] = __float2half_rn(kr[i]);
                ((__half *)a.v_cache)[o + i] = __float2half_rn(vv);
            }
        }
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf((float)HD);
    const int pg = tid / HD, d = tid - pg * HD;
    for (int s = blockIdx.y; s < nsplit; s += nact) {
        const int p0 = s * SPL, np = min(SPL, n - p0);
        /* scores: a warp per position */
        for (int pi = wi; pi < np; pi += GATT_WARPS) {
            const size_t base = (size_t)(p0 + pi) * row + (size_t)g * HD;
            float kv[HD / 32];
#pragma unroll
            for (int t = 0; t < HD / 32; t++)
                kv[t] = gatt_load(a.k_cache, a.kv_f32, base + lane + 32 * t);
#pragma unroll
            for (int h = 0; h < G; h++) {
                float acc = 0.0f;
#pragma unroll
                for (int t = 0; t < HD / 32; t++)
                    acc += qs[h * HD + lane + 32 * t] * kv[t];
                acc = engine_cu_warp_sum(acc);
                if (lane == 0) e[h * SPL + pi] = acc * scale;
            }
        }
        __syncthreads();
        /* each head's max and sum over the split; e := exp(score - max) */
        for (int h = wi; h < G; h += GATT_WARPS) {
            float *eh = e + h * SPL;
            const float x = lane < np ? eh[lane] : -INFINITY;
            const float m = engine_cu_warp_max(x);
            const float ex = lane < np ? expf(x - m) : 0.0f;
            if (lane < np) eh[lane] = ex;
            const float l = engine_cu_warp_sum(ex);
            if (lane == 0) {
                ml[h][0] = m;
                ml[h][1] = l;
            }
        }
        __syncthreads();
        /* weighted V: thread (position group pg, dimension d) */
        float acc[G];
#pragma unroll
        for (int h = 0; h < G; h++)
            acc[h] = 0.0f;
#pragma unroll 4
        for (int pi = pg; pi < np; pi += PG) {
            const float v =
                gatt_load(a.v_cache, a.kv_f32, (size_t)(p0 + pi) * row + (size_t)g * HD + d);
#pragma unroll
            for (int h = 0; h < G; h++)
                acc[h] += e[h * SPL + pi] * v;
        }
#pragma unroll
        for (int h = 0; h < G; h++)
            red[((size_t)pg * G + h) * HD + d] = acc[h];
        __syncthreads();
        for (int i = tid; i < G * HD; i += GATT_THREADS) {
            const int h = i / HD, dd = i - h * HD;
            float sum = 0.0f;
#pragma unroll
            for (int k = 0; k < PG; k++)
                sum += red[((size_t)k * G + h) * HD + dd];
            float *pp = a.partial + ((size_t)(g * G + h) * max_splits + s) * (HD + 2);
            pp[dd] = sum;
            if (dd == 0) {
                pp[HD] = ml[h][0];
                pp[HD + 1] = ml[h][1];
            }
        }
        __syncthreads();
    }
    /* the last runner of this KV head merges the splits */
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(&a.counters[g], 1u) == (unsigned)(nact - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int i = tid; i < G * HD; i += GATT_THREADS) {
        const int h = i / HD, dd = i - h * HD;
        const float *pp = a.partial + (size_t)(g * G + h) * max_splits * (HD + 2);
        float m = -INFINITY;
        for (int s = 0; s < nsplit; s++)
            m = fmaxf(m, __ldcg(pp + (size_t)s * (HD + 2) + HD));
        float num = 0.0f, den = 0.0f;
        for (int s = 0; s < nsplit; s++) {
            const float *ps = pp + (size_t)s * (HD + 2);
            const float w = expf(__ldcg(ps + HD) - m);
            num += __ldcg(ps + dd) * w;
            den += __ldcg(ps + HD + 1) * w;
        }
        const float gate = a.qg[(size_t)(g * G + h) * 2 * HD + HD + dd];
        a.out[(size_t)(g * G + h) * HD + dd] = num / den * (1.0f / (1.0f + expf(-gate)));
    }
    if (tid == 0) a.counters[g] = 0;
}

template <int G, int HD> static void gatt_launch(const engine_cu_gatt *a, cudaStream_t stream) {
    constexpr int PG = GATT_THREADS / HD;
    const size_t smem =
        sizeof(float) * ((size_t)G * HD + (size_t)G * SPL + (size_t)PG * G * HD + HD);
    const int runners = min(engine_cu_gatt_splits(a->n_ctx), ENGINE_CU_GATT_RUNNERS);
    engine_cu_launch(gatt_kernel<G, HD>, dim3(a->n_kv, runners), dim3(GATT_THREADS), smem, stream,
                     *a);
}

template <int HD> static void gatt_launch_hd(const engine_cu_gatt *a, cudaStream_t stream) {
    switch (a->n_head / a->n_kv) {
    case 1:
        gatt_launch<1, HD>(a, stream);
        break;
    case 2:
        gatt_launch<2, HD>(a, stream);
        break;
    case 4:
        gatt_launch<4, HD>(a, stream);
        break;
    case 8:
        gatt_launch<8, HD>(a, stream);
        break;
    default:
        gatt_launch<16, HD>(a, stream);
        break;
    }
}

void engine_cu_gatt_run(const engine_cu_gatt *a, cudaStream_t stream) {
    if (a->hd == 64)
        gatt_launch_hd<64>(a, stream);
    else if (a->hd == 128)
        gatt_launch_hd<128>(a, stream);
    else
        gatt_launch_hd<256>(a, stream);
}
