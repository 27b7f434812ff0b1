/* The gated attention of a verify pass over m query positions in two launches
 * (contract in q35_verify.cuh, engine_cu_vgatt_run; SPARK_CUDA_MTP_FUSED=attn). Per query the
 * arithmetic of the decode kernels (qwen35_attn.cu: gatt_kernel, gatt_merge_kernel) on the same
 * operands in the same order: the same grid of (KV head, runner) blocks, the same assignment of
 * splits to runners for each query (its own number of active runners), the same running merge
 * and the same final merge, so each query's output equals the decode step's bit for bit.
 * Causality: a block takes the queries in order; query t's K/V row (its position) is stored by
 * the runner that owns its split, which is also the only block that reads that row for any
 * later query of the pass (positions do not decrease: split s goes to runner s % nact, and nact
 * only grows with the position while it is below the grid, where s % nact = s), after a
 * barrier; a later query at the same position (the MTP feed at p0 = 0) overwrites the row
 * after the earlier one has attended, as one launch per query would.
 * The cache load, the q/k normalisation and the merge's weights and sums are gatt_dev.cuh's,
 * the decode kernels' own; the per-query body repeats gatt_kernel's (as a shared inline function
 * it changes the decode kernels' code; with m = 1 this is the decode step, so its decode kernel
 * could become this one). */
#include <cuda_fp16.h>
#include <math.h>

#include "gatt_dev.cuh"
#include "q35_verify.cuh"

#define VA_THREADS 256
#define VA_WARPS (VA_THREADS / 32)
#define VA_SPL ENGINE_CU_GATT_SPLIT

/* Grid (n_kv, runners) of VA_THREADS; the m queries in turn. */
template <int G, int HD>
__global__ void __launch_bounds__(VA_THREADS) vgatt_kernel(engine_cu_vgatt va) {
    constexpr int PG = VA_THREADS / HD;
    constexpr int EPT = (G * HD + VA_THREADS - 1) / VA_THREADS;
    extern __shared__ float vga_smem[];
    __shared__ float ml[G][2], rml[G][2];
    const engine_cu_gatt &a = va.a;
    const int g = blockIdx.x, tid = threadIdx.x, lane = tid & 31, wi = tid >> 5;
    float *qs = vga_smem;
    float *e = qs + G * HD;
    float *red = e + G * VA_SPL;
    float *kr = red + PG * G * HD;
    engine_cu_pdl_launch();
    engine_cu_pdl_wait();
    const int R = gridDim.y, half = a.rot / 2;
    const size_t row = (size_t)a.n_kv * HD;
    const float scale = 1.0f / sqrtf((float)HD);
    const int pg = tid / HD, d = tid - pg * HD;
    for (int t = 0; t < va.m; t++) {
        const int pos = a.pos[(size_t)t * va.pos_stride], n = pos + 1;
        const int nsplit = (n + VA_SPL - 1) / VA_SPL;
        const int nact = min(R, nsplit);
        if ((int)blockIdx.y >= nact) continue; /* the whole block */
        const float *qg = a.qg + (size_t)t * va.qg_stride;
        const float2 *cs = a.rope + (size_t)pos * half;
        for (int h = wi; h < G; h += VA_WARPS)
            engine_cu_gatt_norm_rope<HD>(qg + (size_t)(g * G + h) * 2 * HD, a.q_norm, a.eps, cs,
                                         half, qs + h * HD);
        if ((int)blockIdx.y == (pos / VA_SPL) % nact && wi == VA_WARPS - 1) {
            const float *kp = a.k + (size_t)t * va.kv_stride, *vp = a.v + (size_t)t * va.kv_stride;
            engine_cu_gatt_norm_rope<HD>(kp + (size_t)g * HD, a.k_norm, a.eps, cs, half, kr);
            const size_t o = (size_t)pos * row + (size_t)g * HD;
#pragma unroll
            for (int u = 0; u < HD / 32; u++) {
                const int i = lane + 32 * u;
                const float vv = vp[(size_t)g * HD + i];
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
        float run[EPT];
#pragma unroll
        for (int j = 0; j < EPT; j++)
            run[j] = 0.0f;
        if (tid < G) {
            rml[tid][0] = -INFINITY;
            rml[tid][1] = 0.0f;
        }
        for (int s = blockIdx.y; s < nsplit; s += nact) {
            const int p0 = s * VA_SPL, np = min(VA_SPL, n - p0);
            for (int pi = wi; pi < np; pi += VA_WARPS) {
                const size_t base = (size_t)(p0 + pi) * row + (size_t)g * HD;
                float kv[HD / 32];
#pragma unroll
                for (int u = 0; u < HD / 32; u++)
                    kv[u] = engine_cu_gatt_load(a.k_cache, a.kv_f32, base + lane + 32 * u);
#pragma unroll
                for (int h = 0; h < G; h++) {
                    float acc = 0.0f;
#pragma unroll
                    for (int u = 0; u < HD / 32; u++)
                        acc += qs[h * HD + lane + 32 * u] * kv[u];
                    acc = engine_cu_warp_sum(acc);
                    if (lane == 0) e[h * VA_SPL + pi] = acc * scale;
                }
            }
            __syncthreads();
            for (int h = wi; h < G; h += VA_WARPS) {
                float *eh = e + h * VA_SPL;
                const float x = lane < np ? eh[lane] : -INFINITY;
                const float mx = engine_cu_warp_max(x);
                const float ex = lane < np ? expf(x - mx) : 0.0f;
                if (lane < np) eh[lane] = ex;
                const float l = engine_cu_warp_sum(ex);
                if (lane == 0) {
                    ml[h][0] = mx;
                    ml[h][1] = l;
                }
            }
            __syncthreads();
            float acc[G];
#pragma unroll
            for (int h = 0; h < G; h++)
                acc[h] = 0.0f;
#pragma unroll 4
            for (int pi = pg; pi < np; pi += PG) {
                const float v = engine_cu_gatt_load(a.v_cache, a.kv_f32,
                                                    (size_t)(p0 + pi) * row + (size_t)g * HD + d);
#pragma unroll
                for (int h = 0; h < G; h++)
                    acc[h] += e[h * VA_SPL + pi] * v;
            }
#pragma unroll
            for (int h = 0; h < G; h++)
                red[((size_t)pg * G + h) * HD + d] = acc[h];
            __syncthreads();
#pragma unroll
            for (int j = 0; j < EPT; j++) {
                const int i = tid + j * VA_THREADS;
                if (i < G * HD) {
                    const int h = i / HD, dd = i - h * HD;
                    float sum = 0.0f;
#pragma unroll
                    for (int k = 0; k < PG; k++)
                        sum += red[((size_t)k * G + h) * HD + dd];
                    const float mo = rml[h][0], ms = ml[h][0], mn = fmaxf(mo, ms);
                    run[j] = run[j] * expf(mo - mn) + sum * expf(ms - mn);
                }
            }
            __syncthreads();
            if (tid < G) {
                const float mo = rml[tid][0], ms = ml[tid][0], mn = fmaxf(mo, ms);
                rml[tid][1] = rml[tid][1] * expf(mo - mn) + ml[tid][1] * expf(ms - mn);
                rml[tid][0] = mn;
            }
            __syncthreads();
        }
        float *part = va.partial + (size_t)t * va.partial_stride;
#pragma unroll
        for (int j = 0; j < EPT; j++) {
            const int i = tid + j * VA_THREADS;
            if (i < G * HD) {
                const int h = i / HD, dd = i - h * HD;
                float *pp = part + ((size_t)(g * G + h) * R + blockIdx.y) * (HD + 2);
                pp[dd] = run[j];
                if (dd == 0) {
                    pp[HD] = rml[h][0];
                    pp[HD + 1] = rml[h][1];
                }
            }
        }
        __syncthreads(); /* qs, e, red, ml, rml are the next query's */
    }
}

/* Block (head, 64 dimensions, query) of 64 threads: the decode merge of that query's runners. */
template <int HD> __global__ void __launch_bounds__(64) vgatt_merge_kernel(engine_cu_vgatt va) {
    __shared__ float wr[ENGINE_CU_GATT_RUNNERS];
    __shared__ float inv_den;
    engine_cu_pdl_launch();
    engine_cu_pdl_wait();
    const engine_cu_gatt &a = va.a;
    const int h = blockIdx.x, tid = threadIdx.x, lane = tid & 31, t = blockIdx.z;
    const int n = a.pos[(size_t)t * va.pos_stride] + 1, nsplit = (n + VA_SPL - 1) / VA_SPL;
    const int R = va.runners;
    const int nact = min(R, nsplit);
    const float *ph = va.partial + (size_t)t * va.partial_stride + (size_t)h * R * (HD + 2);
    engine_cu_gatt_merge_weights<HD>(ph, nact, tid, lane, wr, inv_den);
    __syncthreads();
    const int dd = (int)blockIdx.y * 64 + tid;
    const float num = engine_cu_gatt_merge_num<HD>(ph, nact, dd, wr);
    const float *qg = a.qg + (size_t)t * va.qg_stride;
    const float gate = qg[(size_t)h * 2 * HD + HD + dd];
    a.out[(size_t)t * va.out_stride + (size_t)h * HD + dd] =
        num * inv_den * (1.0f / (1.0f + expf(-gate)));
}

int engine_cu_vgatt_runners(int n_ctx) {
    return min(engine_cu_gatt_splits(n_ctx), ENGINE_CU_GATT_RUNNERS);
}

template <int G, int HD> static void vgatt_launch(const engine_cu_vgatt *a, cudaStream_t st) {
    constexpr int PG = VA_THREADS / HD;
    const size_t smem =
        sizeof(float) * ((size_t)G * HD + (size_t)G * VA_SPL + (size_t)PG * G * HD + HD);
    engine_cu_launch(vgatt_kernel<G, HD>, dim3(a->a.n_kv, a->runners), dim3(VA_THREADS), smem,
                     st, *a);
    engine_cu_launch(vgatt_merge_kernel<HD>, dim3(a->a.n_head, HD / 64, a->m), dim3(64), 0, st,
                     *a);
}

template <int HD> static void vgatt_launch_hd(const engine_cu_vgatt *a, cudaStream_t st) {
    switch (a->a.n_head / a->a.n_kv) {
    case 1:
        vgatt_launch<1, HD>(a, st);
        break;
    case 2:
        vgatt_launch<2, HD>(a, st);
        break;
    case 4:
        vgatt_launch<4, HD>(a, st);
        break;
    case 8:
        vgatt_launch<8, HD>(a, st);
        break;
    default:
        vgatt_launch<16, HD>(a, st);
        break;
    }
}

void engine_cu_vgatt_run(const engine_cu_vgatt *a, cudaStream_t stream) {
    if (a->a.hd == 64)
        vgatt_launch_hd<64>(a, stream);
    else if (a->a.hd == 128)
        vgatt_launch_hd<128>(a, stream);
    else
        vgatt_launch_hd<256>(a, stream);
}

ENGINE_CU_TRACE_TU(q35_vatt)
