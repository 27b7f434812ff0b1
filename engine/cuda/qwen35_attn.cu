/* Gated decode attention of qwen35moe (contract in qwen35_attn.cuh). */
#include <cuda_fp16.h>
#include <math.h>

#include "qwen35_attn.cuh"

#define GATT_THREADS 256
#define GATT_WARPS (GATT_THREADS / 32)

bool engine_cu_gatt_ok(int n_head, int n_kv, int hd, int rot) {
    return hd >= 32 && hd % 32 == 0 && hd <= GATT_THREADS && rot >= 2 && rot % 2 == 0 &&
           rot <= hd && n_kv >= 1 && n_head % n_kv == 0 &&
           n_head / n_kv <= ENGINE_CU_GATT_MAX_GROUP;
}

int engine_cu_gatt_splits(int n_ctx) {
    return (n_ctx + ENGINE_CU_GATT_SPLIT - 1) / ENGINE_CU_GATT_SPLIT;
}

/* Grid n_head + n_kv blocks of hd threads. */
__global__ void gatt_prep_kernel(engine_cu_gatt a) {
    extern __shared__ float gp_smem[];
    __shared__ float red[32];
    const int b = blockIdx.x, t = threadIdx.x, hd = a.hd, half = a.rot / 2;
    const bool is_q = b < a.n_head;
    const int j = is_q ? b : b - a.n_head;
    engine_cu_pdl_launch();
    engine_cu_pdl_wait();
    const int32_t pos = *a.pos;
    const float x = is_q ? a.qg[(size_t)j * 2 * hd + t] : a.k[(size_t)j * hd + t];
    const float ss = engine_cu_block_sum(x * x, red);
    const float scale = 1.0f / sqrtf(ss / (float)hd + a.eps);
    const float y = (is_q ? a.q_norm : a.k_norm)[t] * (x * scale);
    gp_smem[t] = y;
    __syncthreads();
    float r = y;
    if (t < half) {
        const float2 cs = a.rope[(size_t)pos * half + t];
        r = y * cs.x - gp_smem[t + half] * cs.y;
    } else if (t < 2 * half) {
        const float2 cs = a.rope[(size_t)pos * half + (t - half)];
        r = gp_smem[t - half] * cs.y + y * cs.x;
    }
    if (is_q) {
        a.q[(size_t)j * hd + t] = r;
        return;
    }
    const size_t o = (size_t)pos * a.n_kv * hd + (size_t)j * hd + t;
    const float v = a.v[(size_t)j * hd + t];
    if (a.kv_f32) {
        ((float *)a.k_cache)[o] = r;
        ((float *)a.v_cache)[o] = v;
    } else {
        ((__half *)a.k_cache)[o] = __float2half_rn(r);
        ((__half *)a.v_cache)[o] = __float2half_rn(v);
    }
}

__device__ __forceinline__ float gatt_load(const void *cache, int f32, size_t i) {
    return f32 ? ((const float *)cache)[i] : __half2float(((const __half *)cache)[i]);
}

/* Grid (n_kv, runners) of GATT_THREADS. */
__global__ void __launch_bounds__(GATT_THREADS) gatt_kernel(engine_cu_gatt a) {
    extern __shared__ float ga_smem[];
    __shared__ float ml[ENGINE_CU_GATT_MAX_GROUP][2];
    __shared__ int last;
    const int g = blockIdx.x, G = a.n_head / a.n_kv, hd = a.hd, tid = threadIdx.x;
    const int lane = tid & 31, wi = tid >> 5;
    float *qs = ga_smem;                            /* [G][hd] */
    float *e = qs + G * hd;                         /* [G][SPLIT] */
    float *red = e + G * ENGINE_CU_GATT_SPLIT;      /* [GATT_THREADS / hd][G][hd] */
    engine_cu_pdl_launch();
    engine_cu_pdl_wait();
    const int n = *a.pos + 1, nsplit = (n + ENGINE_CU_GATT_SPLIT - 1) / ENGINE_CU_GATT_SPLIT;
    const int nact = min((int)gridDim.y, nsplit);
    if ((int)blockIdx.y >= nact) return;
    const int max_splits = (a.n_ctx + ENGINE_CU_GATT_SPLIT - 1) / ENGINE_CU_GATT_SPLIT;
    const int row = a.n_kv * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int i = tid; i < G * hd; i += GATT_THREADS)
        qs[i] = a.q[(size_t)g * G * hd + i];
    __syncthreads();
    const int pg = tid / hd, d = tid - pg * hd, PG = GATT_THREADS / hd;
    for (int s = blockIdx.y; s < nsplit; s += nact) {
        const int p0 = s * ENGINE_CU_GATT_SPLIT, np = min(ENGINE_CU_GATT_SPLIT, n - p0);
        /* scores: a warp per position */
        for (int pi = wi; pi < np; pi += GATT_WARPS) {
            const size_t base = (size_t)(p0 + pi) * row + (size_t)g * hd;
            float kv[GATT_THREADS / 32];
            for (int t = 0; t < hd / 32; t++)
                kv[t] = gatt_load(a.k_cache, a.kv_f32, base + lane + 32 * t);
            for (int h = 0; h < G; h++) {
                float acc = 0.0f;
                for (int t = 0; t < hd / 32; t++)
                    acc += qs[h * hd + lane + 32 * t] * kv[t];
                acc = engine_cu_warp_sum(acc);
                if (lane == 0) e[h * ENGINE_CU_GATT_SPLIT + pi] = acc * scale;
            }
        }
        __syncthreads();
        /* each head's max and sum over the split, e := exp(score - max) */
        for (int h = wi; h < G; h += GATT_WARPS) {
            float *eh = e + h * ENGINE_CU_GATT_SPLIT;
            float m = -INFINITY;
            for (int i = lane; i < np; i += 32)
                m = fmaxf(m, eh[i]);
            m = engine_cu_warp_max(m);
            float l = 0.0f;
            for (int i = lane; i < np; i += 32) {
                const float x = expf(eh[i] - m);
                eh[i] = x;
                l += x;
            }
            l = engine_cu_warp_sum(l);
            if (lane == 0) {
                ml[h][0] = m;
                ml[h][1] = l;
            }
        }
        __syncthreads();
        /* weighted V: thread (position group pg, dimension d) */
        float acc[ENGINE_CU_GATT_MAX_GROUP];
        for (int h = 0; h < G; h++)
            acc[h] = 0.0f;
        if (pg < PG)
            for (int pi = pg; pi < np; pi += PG) {
                const float v = gatt_load(a.v_cache, a.kv_f32,
                                          (size_t)(p0 + pi) * row + (size_t)g * hd + d);
                for (int h = 0; h < G; h++)
                    acc[h] += e[h * ENGINE_CU_GATT_SPLIT + pi] * v;
            }
        if (pg < PG)
            for (int h = 0; h < G; h++)
                red[((size_t)pg * G + h) * hd + d] = acc[h];
        __syncthreads();
        for (int i = tid; i < G * hd; i += GATT_THREADS) {
            const int h = i / hd, dd = i - h * hd;
            float sum = 0.0f;
            for (int k = 0; k < PG; k++)
                sum += red[((size_t)k * G + h) * hd + dd];
            float *pp = a.partial + ((size_t)(g * G + h) * max_splits + s) * (hd + 2);
            pp[dd] = sum;
            if (dd == 0) {
                pp[hd] = ml[h][0];
                pp[hd + 1] = ml[h][1];
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
    for (int i = tid; i < G * hd; i += GATT_THREADS) {
        const int h = i / hd, dd = i - h * hd;
        const float *pp = a.partial + (size_t)(g * G + h) * max_splits * (hd + 2);
        float m = -INFINITY;
        for (int s = 0; s < nsplit; s++)
            m = fmaxf(m, __ldcg(pp + (size_t)s * (hd + 2) + hd));
        float num = 0.0f, den = 0.0f;
        for (int s = 0; s < nsplit; s++) {
            const float *ps = pp + (size_t)s * (hd + 2);
            const float w = expf(__ldcg(ps + hd) - m);
            num += __ldcg(ps + dd) * w;
            den += __ldcg(ps + hd + 1) * w;
        }
        const float gate = a.qg[(size_t)(g * G + h) * 2 * hd + hd + dd];
        a.out[(size_t)(g * G + h) * hd + dd] = num / den * (1.0f / (1.0f + expf(-gate)));
    }
    if (tid == 0) a.counters[g] = 0;
}

void engine_cu_gatt_prep(const engine_cu_gatt *a, cudaStream_t stream) {
    engine_cu_launch(gatt_prep_kernel, dim3(a->n_head + a->n_kv), dim3(a->hd),
                     sizeof(float) * (size_t)a->hd, stream, *a);
}

void engine_cu_gatt_run(const engine_cu_gatt *a, cudaStream_t stream) {
    const int G = a->n_head / a->n_kv;
    const size_t smem =
        sizeof(float) * ((size_t)G * a->hd + (size_t)G * ENGINE_CU_GATT_SPLIT +
                         (size_t)(GATT_THREADS / a->hd) * G * a->hd);
    const int runners = min(engine_cu_gatt_splits(a->n_ctx), ENGINE_CU_GATT_RUNNERS);
    engine_cu_launch(gatt_kernel, dim3(a->n_kv, runners), dim3(GATT_THREADS), smem, stream, *a);
}
