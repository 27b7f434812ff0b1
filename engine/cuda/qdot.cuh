/* Dot products of weight rows with an activation vector staged in shared memory, for the
 * matrix-vector and MoE kernels (batch-1 decode).
 *
 * Staging (engine_cu_stage_x, the whole block at the start of a kernel): the block reads the
 * F32 activations once from global memory (L2), applies the optional RMSNorm, and keeps them
 * in shared memory in the form the weight type wants, quantised exactly as the CPU backend
 * quantises activations for its dot products (engine/cpu/quant.c), so that the GPU computes
 * the CPU's products up to F32 summation order:
 *   Q4_K, Q5_K, Q6_K (mode Q8_K): int8 in blocks of 256, iscale = 127 / amax, q =
 *     round-to-nearest-even(v * iscale), d = 1 / iscale;
 *   Q8_0, Q4_0 (mode Q8_0): int8 in blocks of 32, d = amax / 127, q = rne(v * (1 / d)), d
 *     then rounded to F16 as the CPU stores it;
 *   F32, F16, BF16 (mode F32): F32, exact.
 * The int8 vector is kept as q[n], d per 32 values and s = d * sum q per 16 values; the
 * products run on integers (dp4a: four 8-bit products per instruction), one F32 multiply per
 * 16 or 32 weights. y = sum_i w_i * xhat_i up to F32 rounding, xhat the dequantised int8.
 * Chunks: as dequant.cuh (32 values of a row, two runs of 16 values, a contiguous piece of the
 * row's bytes), so the lanes of a warp taking consecutive chunks read consecutive bytes. */
#ifndef SPARK_ENGINE_CUDA_QDOT_CUH
#define SPARK_ENGINE_CUDA_QDOT_CUH

#include "dequant.cuh"

/* How a kernel stages its activations for weights of a type (see above). */
enum { ENGINE_CU_X_F32 = 0, ENGINE_CU_X_Q8_0 = 1, ENGINE_CU_X_Q8_K = 2 };

__host__ __device__ constexpr int engine_cu_x_mode(int t) {
    return t == ENGINE_TYPE_Q4_K || t == ENGINE_TYPE_Q5_K || t == ENGINE_TYPE_Q6_K ||
                   t == ENGINE_CU_TYPE_Q6_KR
               ? ENGINE_CU_X_Q8_K
           : t == ENGINE_TYPE_Q8_0 || t == ENGINE_TYPE_Q4_0 ? ENGINE_CU_X_Q8_0
                                                            : ENGINE_CU_X_F32;
}

__host__ __device__ constexpr bool engine_cu_type_quant(int t) {
    return engine_cu_x_mode(t) != ENGINE_CU_X_F32;
}

/* Shared-memory bytes to stage n values (n a multiple of 32, of 256 for mode Q8_K). int8
 * modes: q[n] int8, d[n / 32], s[n / 16] floats; F32: f[n] floats. */
__host__ __device__ __forceinline__ size_t engine_cu_xs_bytes(bool quant, int n) {
    return quant ? (size_t)n + sizeof(float) * ((size_t)n / 32 + (size_t)n / 16)
                 : sizeof(float) * (size_t)n;
}

/* Where a block's copy of its weight rows (bulk copies, common.cuh engine_cu_bulk_g2s) starts
 * in its dynamic shared memory: after the staged vector's xs bytes, at a 128-byte boundary (the
 * kernels' dynamic shared memory starts at one: bulk copies to 16-byte boundaries measured up to
 * 6.6% slower decode, bench/RESULTS.md session 21). */
__host__ __device__ __forceinline__ size_t engine_cu_w_off(size_t xs) {
    return (xs + 127) & ~(size_t)127;
}

/* The stride of consecutive bulk-copied runs of rows in shared memory: the run's bytes rounded
 * up to 128, so that each run lands at a 128-byte boundary too (a run of 8 Q6_K rows of 768
 * values is 5,040 bytes). */
__host__ __device__ __forceinline__ size_t engine_cu_run_stride(size_t run) {
    return (run + 127) & ~(size_t)127;
}

/* A view of the staged vector from value `off` on (off a multiple of 32). */
typedef struct {
    const int8_t *q;
    const float *d, *s, *f;
} engine_cu_xv;

__device__ __forceinline__ engine_cu_xv engine_cu_xv_at(const uint8_t *sm, int n, bool quant,
                                                        int off) {
    engine_cu_xv v;
    if (quant) {
        v.q = (const int8_t *)sm + off;
        v.d = (const float *)(sm + n) + off / 32;
        v.s = (const float *)(sm + n) + n / 32 + off / 16;
        v.f = nullptr;
    } else {
        v.q = nullptr;
        v.d = v.s = nullptr;
        v.f = (const float *)sm + off;
    }
    return v;
}

/* x4[i], or x4[i] + a4[i] with ADD (the residual sum h = x + ao of the router fusion,
 * router_fuse.cuh: the same F32 add as the wo kernel's accumulate epilogue). */
template <bool CG = false, bool ADD = false>
__device__ __forceinline__ float4 engine_cu_ld_x4(const float4 *x4, const float4 *a4, int i) {
    float4 v = CG ? __ldcg(x4 + i) : x4[i];
    if (ADD) {
        const float4 a = CG ? __ldcg(a4 + i) : a4[i];
        v = make_float4(v.x + a.x, v.y + a.y, v.z + a.z, v.w + a.w);
    }
    return v;
}

/* The RMSNorm scale 1 / sqrt(mean(v^2) + eps) of v = x (+ a with ADD), n values, by one warp
 * (every lane gets it): the staging's own computation, so that another warp that needs the
 * scale (the MoE up kernel's routing warp with the router fusion) gets it bit for bit.
 * n4 = n / 4, lane: the thread's lane. */
template <bool CG = false, bool ADD = false>
__device__ __forceinline__ float engine_cu_stage_scale(const float4 *x4, const float4 *a4, int n,
                                                       int n4, int lane, float eps) {
    float ss = 0.0f;
    /* the loads of 2048 values all in flight at once: one L2 round trip, not four */
#pragma unroll 16
    for (int i = lane; i < n4; i += 32) {
        const float4 v = engine_cu_ld_x4<CG, ADD>(x4, a4, i);
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    ss = engine_cu_warp_sum(ss);
    return 1.0f / sqrtf(ss / (float)n + eps);
}

/* engine_cu_block_scale in two halves, so that a warp can work between them (the MoE launch's
 * routing warp picks its experts): engine_cu_block_ss, the loads and the warp's sum of squares,
 * and engine_cu_block_scale_end (every thread), the barrier and the sum of the warps' sums. */
template <bool CG = false, bool ADD = false>
__device__ __forceinline__ float engine_cu_block_ss(const float4 *x4, const float4 *a4, int n,
                                                    int nt = 0) {
    const int nth = nt > 0 ? nt : (int)blockDim.x;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < (n >> 2) && (int)threadIdx.x < nth; i += nth) {
        const float4 v = engine_cu_ld_x4<CG, ADD>(x4, a4, i);
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    return engine_cu_warp_sum(ss);
}

__device__ __forceinline__ float engine_cu_block_scale_end(float ss, int n, float eps, int nt = 0) {
    __shared__ float red[32];
    const int nth = nt > 0 ? nt : (int)blockDim.x;
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    float t = 0.0f;
    for (int k = 0; k < (nth >> 5); k++)
        t += red[k];
    return 1.0f / sqrtf(t / (float)n + eps);
}

/* The same scale computed by the whole block (every thread calls it; blockDim.x / 32 <= 32):
 * each thread sums the squares of its float4s (threadIdx.x + i blockDim.x), then the warps'
 * sums in warp order; every thread gets it. nt > 0 (a multiple of 32): only the first nt threads
 * sum, as a block of nt threads would (the same bits in a larger block). One round trip for the
 * loads of a 2048-value vector, where a warp of engine_cu_stage_scale makes several. Not bit for
 * bit that one (its sum runs in another order). Ends after a barrier; a second call needs another
 * barrier between (its partial sums reuse the same shared words). */
template <bool CG = false, bool ADD = false>
__device__ __forceinline__ float engine_cu_block_scale(const float4 *x4, const float4 *a4, int n,
                                                       float eps, int nt = 0) {
    return engine_cu_block_scale_end(engine_cu_block_ss<CG, ADD>(x4, a4, n, nt), n, eps, nt);
}

template <bool CG = false, bool ADD = false>
__device__ __forceinline__ float4 engine_cu_norm4(const float4 *x4, const float4 *w4, int i,
                                                  float scale, const float4 *a4 = nullptr) {
    float4 v = engine_cu_ld_x4<CG, ADD>(x4, a4, i);
    if (w4) {
        const float4 w = __ldg(w4 + i);
        v = make_float4(w.x * (v.x * scale), w.y * (v.y * scale), w.z * (v.z * scale),
                        w.w * (v.w * scale));
    }
    return v;
}

/* engine_cu_norm4 with the weights read already (engine_cu_nw_pre): the same arithmetic. */
template <bool CG = false, bool ADD = false>
__device__ __forceinline__ float4 engine_cu_norm4w(const float4 *x4, float4 w, int i, float scale,
                                                   const float4 *a4 = nullptr) {
    const float4 v = engine_cu_ld_x4<CG, ADD>(x4, a4, i);
    return make_float4(w.x * (v.x * scale), w.y * (v.y * scale), w.z * (v.z * scale),
                       w.w * (v.w * scale));
}

/* The norm weights of a staging warp's first two float4s (engine_cu_stage_part's order: the
 * first two passes of the Q8_0 loop, the two float4s of the first Q8_K block), read before the
 * block's griddepcontrol.wait: they do not depend on the previous kernel, and after the wait
 * their L2 round trip followed the RMS scale's on the staging's path. Zeros where the warp has
 * none; the F32 staging takes none. */
struct engine_cu_nw_pre {
    float4 v[2];
    bool ok; /* read (else the staging reads the weights itself) */
};

template <int MODE>
__device__ __forceinline__ engine_cu_nw_pre engine_cu_stage_nw(const float *nw, int n, int w,
                                                               int nwarps) {
    engine_cu_nw_pre p;
    p.v[0] = p.v[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    p.ok = nw && w >= 0 && MODE != ENGINE_CU_X_F32;
    const float4 *w4 = (const float4 *)nw;
    const int n4 = n >> 2, lane = threadIdx.x & 31;
    if (!p.ok) return p;
    if (MODE == ENGINE_CU_X_Q8_0) {
        const int i = 32 * w + lane, i1 = i + 32 * nwarps;
        if (i < n4) p.v[0] = __ldg(w4 + i);
        if (i1 < n4) p.v[1] = __ldg(w4 + i1);
    } else if (w < (n >> 8)) { /* Q8_K (p.ok: not F32) */
        const int i = w * 64 + 2 * lane;
        p.v[0] = __ldg(w4 + i);
        p.v[1] = __ldg(w4 + i + 1);
    }
    return p;
}

__device__ __forceinline__ float engine_cu_amax4(float4 v) {
    return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
}

/* rne(v * s) of four values, clamped to [-127, 127] as the CPU does; packed into a word, with
 * their sum in *sum. */
__device__ __forceinline__ int engine_cu_q4x8(float4 v, float s, int *sum) {
    const int a = max(-127, min(127, __float2int_rn(v.x * s)));
    const int b = max(-127, min(127, __float2int_rn(v.y * s)));
    const int c = max(-127, min(127, __float2int_rn(v.z * s)));
    const int e = max(-127, min(127, __float2int_rn(v.w * s)));
    *sum = a + b + c + e;
    return (a & 0xff) | ((b & 0xff) << 8) | ((c & 0xff) << 16) | ((e & 0xff) << 24);
}

/* Stage x[0..n) in shared memory `sm` (engine_cu_xs_bytes(MODE != F32, n) bytes), normalised
 * as engine_cpu_rmsnorm (nw[i] * (x[i] * scale)) when nw != NULL. Done by warps w0 .. (the
 * block's last warp); every thread of the block must call it, since it ends with a barrier
 * (warps below w0 can do other work first, e.g. the MoE routing). Each working warp computes
 * the RMS scale itself (x is read again from L1), so there is no other barrier.
 * CG: x read through L2 only (__ldcg), for a block that stages x before its griddepcontrol.wait
 * (moe.cuh stage_early: x final, written by a kernel that completed before this one launched,
 * but possibly in this multiprocessor's L1 from before that); the same values and arithmetic.
 * ADD: the vector staged is x[i] + xa[i] (one F32 add per value, before the norm).
 * given >= 0: the RMS scale, computed already (engine_cu_block_scale), not by each warp.
 * GIVEN: the caller always passes the scale (given), so that the warps' own computation of it
 * is not in its image (a NaN scale is staged as given, NaN values either way).
 * engine_cu_stage_part: the share of warp w of the nwarps that stage (no barrier). */
template <int MODE, bool CG = false, bool ADD = false, bool GIVEN = false>
__device__ __forceinline__ void engine_cu_stage_part(const float *x, int n, const float *nw,
                                                     float eps, uint8_t *sm, int w, int nwarps,
                                                     const float *xa = nullptr, float given = -1.0f,
                                                     const engine_cu_nw_pre *pre = nullptr) {
    const float4 *x4 = (const float4 *)x, *w4 = (const float4 *)nw, *a4 = (const float4 *)xa;
    const int n4 = n >> 2, lane = threadIdx.x & 31;
    {
        float scale = 1.0f;
        if (nw)
            scale = GIVEN || given >= 0.0f
                        ? given
                        : engine_cu_stage_scale<CG, ADD>(x4, a4, n, n4, lane, eps);
        if (MODE == ENGINE_CU_X_F32) {
            float4 *f = (float4 *)sm;
            for (int i = 32 * w + lane; i < n4; i += 32 * nwarps)
                f[i] = engine_cu_norm4<CG, ADD>(x4, w4, i, scale, a4);
        } else if (MODE == ENGINE_CU_X_Q8_0) {
            int *q4 = (int *)sm;
            float *d = (float *)(sm + n), *s = d + n / 32;
            /* 8 lanes per block of 32 values, 4 values each; every lane of the warp takes part
             * in the shuffles (n4 is a multiple of 8, so a group of 8 is wholly in or out) */
            for (int base = 32 * w, it = 0; base < n4; base += 32 * nwarps, it++) {
                const int i = base + lane;
                const bool in = i < n4;
                const float4 v =
                    !in ? make_float4(0, 0, 0, 0)
                    : pre && pre->ok && w4 && it < 2
                        ? engine_cu_norm4w<CG, ADD>(x4, it ? pre->v[1] : pre->v[0], i, scale, a4)
                        : engine_cu_norm4<CG, ADD>(x4, w4, i, scale, a4);
                float am = engine_cu_amax4(v);
                am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 1));
                am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 2));
                am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 4));
                const float db = am / 127.0f, id = db != 0.0f ? 1.0f / db : 0.0f;
                /* the scale as the CPU stores it, in F16 */
                const float dh = __half2float(__float2half_rn(fminf(db, 65504.0f)));
                int sum;
                const int packed = engine_cu_q4x8(v, id, &sum);
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                if (in) {
                    q4[i] = packed;
                    if ((lane & 7) == 0) d[i >> 3] = dh;
                    if ((lane & 3) == 0) s[i >> 2] = dh * (float)sum;
                }
            }
        } else {
            int *q4 = (int *)sm;
            float *d = (float *)(sm + n), *s = d + n / 32;
            /* a warp per block of 256 values, 8 consecutive values a lane (a warp's blocks'
             * loads in flight together: the MoE down kernel stages 24 blocks) */
#pragma unroll 4
            for (int blk = w; blk < (n >> 8); blk += nwarps) {
                const int i = blk * 64 + 2 * lane;
                const bool p0 = pre && pre->ok && w4 && blk == w; /* the first block: read */
                const float4 v0 = p0 ? engine_cu_norm4w<CG, ADD>(x4, pre->v[0], i, scale, a4)
                                     : engine_cu_norm4<CG, ADD>(x4, w4, i, scale, a4),
                             v1 = p0 ? engine_cu_norm4w<CG, ADD>(x4, pre->v[1], i + 1, scale, a4)
                                     : engine_cu_norm4<CG, ADD>(x4, w4, i + 1, scale, a4);
                const float am =
                    engine_cu_warp_max(fmaxf(engine_cu_amax4(v0), engine_cu_amax4(v1)));
                const float is = am != 0.0f ? 127.0f / am : 0.0f,
                            db = am != 0.0f ? 1.0f / is : 0.0f;
                int s0, s1;
                q4[i] = engine_cu_q4x8(v0, is, &s0);
                q4[i + 1] = engine_cu_q4x8(v1, is, &s1);
                int sum = s0 + s1;
                sum += __shfl_xor_sync(0xffffffffu, sum, 1); /* 16 values: two lanes */
                if ((lane & 3) == 0) d[i >> 3] = db;
                if ((lane & 1) == 0) s[i >> 2] = db * (float)sum;
            }
        }
    }
}

/* pre: this warp's engine_cu_stage_nw(nw, n, w - w0, warps - w0), read before the wait. */
template <int MODE, bool CG = false, bool ADD = false, bool GIVEN = false>
__device__ __forceinline__ void engine_cu_stage_x(const float *x, int n, const float *nw, float eps,
                                                  uint8_t *sm, int w0 = 0,
                                                  const float *xa = nullptr, float given = -1.0f,
                                                  const engine_cu_nw_pre *pre = nullptr) {
    const int w = engine_cu_warp_id() - w0;
    if (w >= 0)
        engine_cu_stage_part<MODE, CG, ADD, GIVEN>(x, n, nw, eps, sm, w, (blockDim.x >> 5) - w0, xa,
                                                   given, pre);
    __syncthreads();
}

/* engine_cu_stage_nw for engine_cu_stage_x's warp (every thread may call it). */
template <int MODE>
__device__ __forceinline__ engine_cu_nw_pre engine_cu_stage_x_nw(const float *nw, int n,
                                                                 int w0 = 0) {
    return engine_cu_stage_nw<MODE>(nw, n, (int)(threadIdx.x >> 5) - w0,
                                    (int)(blockDim.x >> 5) - w0);
}

/* m vectors, x + t * x_stride for t < m, staged side by side at sm + t * sm_stride (each as
 * engine_cu_stage_x stages it, per-warp RMS scale) in one pass: warps w0 + i take vector i % m
 * together with the other warps of that residue (with fewer warps than vectors, warp w0 + i
 * stages vectors i, i + warps, ... alone), so the m stagings run side by side behind one
 * barrier instead of one after the other. Each staged value is a function of the vector alone
 * (the scale: a warp's own sum in engine_cu_stage_scale's order; the blocks of 32 or 256 values
 * each within one warp), so every vector is engine_cu_stage_x's bit for bit. Every thread calls
 * it; it ends with a barrier. */
template <int MODE>
__device__ __forceinline__ void engine_cu_stage_xm(const float *x, size_t x_stride, int n,
                                                   const float *nw, float eps, uint8_t *sm,
                                                   size_t sm_stride, int m, int w0 = 0) {
    const int nwarps = (int)(blockDim.x >> 5) - w0, i = engine_cu_warp_id() - w0;
    if (i >= 0 && nwarps >= m) {
        const int t = i % m;
        engine_cu_stage_part<MODE>(x + (size_t)t * x_stride, n, nw, eps, sm + (size_t)t * sm_stride,
                                   i / m, nwarps / m + (t < nwarps % m ? 1 : 0));
    } else if (i >= 0) {
        for (int t = i; t < m; t += nwarps)
            engine_cu_stage_part<MODE>(x + (size_t)t * x_stride, n, nw, eps,
                                       sm + (size_t)t * sm_stride, 0, 1);
    }
    __syncthreads();
}

/* 4 * N bytes from a 2-byte-aligned address as N words (aligned word loads and funnel
 * shifts; the last piece of a misaligned run is a 2-byte load: no byte past the 4 * N). */
template <int N> __device__ __forceinline__ void engine_cu_ldw_a2(const uint8_t *p, uint32_t w[N]) {
    const uintptr_t a = (uintptr_t)p;
    const uint32_t *b = (const uint32_t *)(a & ~(uintptr_t)3);
    const int sh = (int)(a & 3) * 8;
    uint32_t u[N + 1];
#pragma unroll
    for (int i = 0; i < N; i++)
        u[i] = __ldg(b + i);
    u[N] = sh ? (uint32_t)__ldg((const uint16_t *)(b + N)) : 0u;
#pragma unroll
    for (int i = 0; i < N; i++)
        w[i] = __funnelshift_r(u[i], u[i + 1], sh);
}

__device__ __forceinline__ int engine_cu_dp4a4(const uint32_t w[4], int4 x, int acc) {
    acc = __dp4a((int)w[0], x.x, acc);
    acc = __dp4a((int)w[1], x.y, acc);
    acc = __dp4a((int)w[2], x.z, acc);
    return __dp4a((int)w[3], x.w, acc);
}

/* The same with w's bytes unsigned (0..255) against x's signed ones (dp4a.u32.s32). */
__device__ __forceinline__ int engine_cu_dp4a4u(const uint32_t w[4], int4 x, int acc) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int xi = i == 0 ? x.x : i == 1 ? x.y : i == 2 ? x.z : x.w;
        asm("dp4a.u32.s32 %0, %1, %2, %0;" : "+r"(acc) : "r"(w[i]), "r"(xi));
    }
    return acc;
}

/* Weight loads from global memory (the L2 streaming policy) or, with SH, from a copy of the
 * rows in shared memory (common.cuh engine_cu_bulk_g2s: the same bytes at the same address
 * modulo 16, so the same words and shifts). */
template <bool SH> __device__ __forceinline__ uint32_t qd_w(const uint32_t *p) {
    return SH ? *p : engine_cu_ldw(p);
}

template <bool SH> __device__ __forceinline__ uint16_t qd_h(const uint16_t *p) {
    return SH ? *p : engine_cu_ldh(p);
}

template <bool SH> __device__ __forceinline__ int qd_sb(const int8_t *p) {
    return SH ? (int)*p : engine_cu_ldsb(p);
}

/* 16 weight bytes from a 16-byte-aligned address. */
template <bool SH = false>
__device__ __forceinline__ void qd_load16(const uint8_t *p, uint32_t w[4]) {
    const uint4 v = SH ? *(const uint4 *)p : engine_cu_ldq((const uint4 *)p);
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
}

/* A chunk's weight bytes as loaded (engine_cu_qload), before any arithmetic on them: a warp
 * can issue the loads of its first chunks before it waits for its inputs and compute on them
 * after the staging (engine_cu_qdot_raw). Misaligned runs (Q6_K, Q8_0, Q4_0: 2-byte-aligned
 * blocks) keep their aligned words; the funnel shifts happen in the compute. */
typedef struct {
    uint32_t h;     /* Q4_K/Q5_K: d | dmin << 16; Q6_K/Q8_0/Q4_0: the F16 scale */
    uint32_t s[3];  /* Q4_K/Q5_K: the 12 packed scale bytes; Q6_K: the two int8 scales */
    uint32_t q[10]; /* Q4_K: qs[4]; Q5_K: qs[4], qh[4]; Q6_K: ql[5], qh[5]; Q8_0: 9 words;
                       Q4_0: 5 words (aligned words of the run) */
} engine_cu_qraw;

/* Aligned words of a run of 4 * N bytes from a 2-byte-aligned address (engine_cu_ldw_a2 in
 * two halves: loads here, funnel shifts in qd_funnel). The aligned base is p moved back by its
 * misalignment (pointer arithmetic, not an integer mask: the compiler keeps a shared-memory p
 * in the shared window, ld.shared with 32-bit addresses, where the mask made generic loads with
 * 64-bit address arithmetic). u[N], the half word past the words, counts only for a misaligned
 * run (qd_funnel's shift 0 returns u[i] whatever u[i + 1] holds); for an aligned one it is the
 * run's own first half word (in bounds), so it is a load without a branch either way. */
template <int N, bool SH = false>
__device__ __forceinline__ void qd_ld_a2(const uint8_t *p, uint32_t u[N + 1]) {
    const int mis = (int)((uintptr_t)p & 3);
    const uint32_t *b = (const uint32_t *)(p - mis);
#pragma unroll
    for (int i = 0; i < N; i++)
        u[i] = qd_w<SH>(b + i);
    u[N] = (uint32_t)qd_h<SH>((const uint16_t *)(mis ? b + N : b));
}

template <int N>
__device__ __forceinline__ void qd_funnel(const uint8_t *p, const uint32_t u[N + 1],
                                          uint32_t w[N]) {
    const int sh = (int)((uintptr_t)p & 3) * 8;
#pragma unroll
    for (int i = 0; i < N; i++)
        w[i] = __funnelshift_r(u[i], u[i + 1], sh);
}

/* Load chunk c of a quantised row (SH: from its copy in shared memory, see qd_w). */
template <int T, bool SH = false>
__device__ __forceinline__ void engine_cu_qload(const uint8_t *row, int c, engine_cu_qraw &r) {
    if (T == ENGINE_TYPE_Q4_K || T == ENGINE_TYPE_Q5_K) {
        const bool q5 = T == ENGINE_TYPE_Q5_K;
        const uint8_t *b = row + (size_t)(c >> 3) * (q5 ? 176 : 144);
        const int q = c & 7, j = q >> 1, half = q & 1;
        r.h = qd_w<SH>((const uint32_t *)b);
        r.s[0] = qd_w<SH>((const uint32_t *)(b + 4));
        r.s[1] = qd_w<SH>((const uint32_t *)(b + 8));
        r.s[2] = qd_w<SH>((const uint32_t *)(b + 12));
        qd_load16<SH>(b + (q5 ? 48 : 16) + 32 * j + 16 * half, r.q);
        if (q5) qd_load16<SH>(b + 16 + 16 * half, r.q + 4);
    } else if (T == ENGINE_TYPE_Q6_K) {
        const uint8_t *b = row + (size_t)(c >> 3) * 210;
        const int q = c & 7, hh = q >> 2, rr = q & 3, w = rr >> 1, l0 = 16 * (rr & 1);
        r.h = qd_h<SH>((const uint16_t *)(b + 208));
        qd_ld_a2<4, SH>(b + 64 * hh + 32 * w + l0, r.q);
        qd_ld_a2<4, SH>(b + 128 + 32 * hh + l0, r.q + 5);
        const int8_t *scp = (const int8_t *)(b + 192 + 8 * hh + (l0 >> 4));
        r.s[0] = (uint32_t)qd_sb<SH>(scp + 2 * w);
        r.s[1] = (uint32_t)qd_sb<SH>(scp + 4 + 2 * w);
    } else if (T == ENGINE_TYPE_Q8_0) {
        const uint8_t *b = row + (size_t)c * 34;
        r.h = qd_h<SH>((const uint16_t *)b);
        qd_ld_a2<8, SH>(b + 2, r.q);
    } else { /* Q4_0 */
        const uint8_t *b = row + (size_t)c * 18;
        r.h = qd_h<SH>((const uint16_t *)b);
        qd_ld_a2<4, SH>(b + 2, r.q);
    }
}

/* Chunk c (loaded into r from `row`) against the staged int8 vector (the row's column 0 at
 * xv). */
template <int T>
__device__ __forceinline__ float engine_cu_qdot_raw(const engine_cu_qraw &r, const uint8_t *row,
                                                    int c, const engine_cu_xv &xv) {
    int a0, b0;
    engine_cu_chunk_cols(T, c, &a0, &b0);
    const int4 xa = *(const int4 *)(xv.q + a0), xb = *(const int4 *)(xv.q + b0);
    const float da = xv.d[a0 >> 5], db = xv.d[b0 >> 5], sa = xv.s[a0 >> 4], sb = xv.s[b0 >> 4];
    uint32_t lo[4], hi[4];
    if (T == ENGINE_TYPE_Q4_K || T == ENGINE_TYPE_Q5_K) {
        const bool q5 = T == ENGINE_TYPE_Q5_K;
        const int q = c & 7, j = q >> 1;
        const float d = engine_cu_h2f((uint16_t)(r.h & 0xffffu)),
                    dmin = engine_cu_h2f((uint16_t)(r.h >> 16));
        int sc[2], m[2];
        engine_cu_scale_min_k4w2(j, r.s[0], r.s[1], r.s[2], sc, m);
        const float d1 = d * (float)sc[0], m1 = dmin * (float)m[0];
        const float d2 = d * (float)sc[1], m2 = dmin * (float)m[1];
        int ia, ib;
        if (q5) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                lo[i] = (r.q[i] & 0x0F0F0F0Fu) | (((r.q[4 + i] >> (2 * j)) & 0x01010101u) << 4);
                hi[i] = ((r.q[i] >> 4) & 0x0F0F0F0Fu) |
                        (((r.q[4 + i] >> (2 * j + 1)) & 0x01010101u) << 4);
            }
            ia = engine_cu_dp4a4(lo, xa, 0);
            ib = engine_cu_dp4a4(hi, xb, 0);
        } else { /* the high nibbles in place (16 q): one mask a word, the sum shifted once */
#pragma unroll
            for (int i = 0; i < 4; i++) {
                lo[i] = r.q[i] & 0x0F0F0F0Fu;
                hi[i] = r.q[i] & 0xF0F0F0F0u;
            }
            ia = engine_cu_dp4a4(lo, xa, 0);
            ib = engine_cu_dp4a4u(hi, xb, 0) >> 4; /* 16 x the sum: exact */
        }
        return d1 * (da * (float)ia) - m1 * sa + (d2 * (db * (float)ib) - m2 * sb);
    } else if (T == ENGINE_TYPE_Q6_K) {
        const uint8_t *b = row + (size_t)(c >> 3) * 210;
        const int q = c & 7, hh = q >> 2, rr = q & 3, w = rr >> 1, l0 = 16 * (rr & 1);
        const float d = engine_cu_h2f((uint16_t)r.h);
        uint32_t ql[4], qh[4];
        qd_funnel<4>(b + 64 * hh + 32 * w + l0, r.q, ql);
        qd_funnel<4>(b + 128 + 32 * hh + l0, r.q + 5, qh);
        const float d1 = d * (float)(int)r.s[0], d2 = d * (float)(int)r.s[1];
        /* the two high bits of each value moved straight to bits 4-5 of its byte: bits 2w, 2w + 1
         * of each qh byte for lo (a left shift by 4 - 2w), 2w + 4, 2w + 5 for hi (a right shift by
         * 2w), then one mask: the same bytes as ((qh >> s) & 3) << 4 */
        const int sl = 4 - 2 * w, sr = 2 * w;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo[i] = (ql[i] & 0x0F0F0F0Fu) | ((qh[i] << sl) & 0x30303030u);
            hi[i] = ((ql[i] >> 4) & 0x0F0F0F0Fu) | ((qh[i] >> sr) & 0x30303030u);
        }
        const int ia = engine_cu_dp4a4(lo, xa, 0), ib = engine_cu_dp4a4(hi, xb, 0);
        /* values q - 32: sum (q - 32) xq = sum q xq - 32 sum xq */
        return d1 * (da * (float)ia - 32.0f * sa) + d2 * (db * (float)ib - 32.0f * sb);
    } else if (T == ENGINE_TYPE_Q8_0) {
        const float d = engine_cu_h2f((uint16_t)r.h);
        uint32_t v[8];
        qd_funnel<8>(row + (size_t)c * 34 + 2, r.q, v);
        const int ia = engine_cu_dp4a4(v, xa, 0), ib = engine_cu_dp4a4(v + 4, xb, 0);
        return d * (da * (float)(ia + ib)); /* da == db: one block of 32 */
    } else {                                /* Q4_0 */
        const float d = engine_cu_h2f((uint16_t)r.h);
        uint32_t v[4];
        qd_funnel<4>(row + (size_t)c * 18 + 2, r.q, v);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo[i] = v[i] & 0x0F0F0F0Fu;
            hi[i] = (v[i] >> 4) & 0x0F0F0F0Fu;
        }
        const int ia = engine_cu_dp4a4(lo, xa, 0), ib = engine_cu_dp4a4(hi, xb, 0);
        /* values q - 8 */
        return d * (da * (float)(ia + ib) - 8.0f * (sa + sb));
    }
}

/* Chunk c of a Q6_KR row of n_chunks chunks (dequant.cuh) against the staged int8 vector:
 * engine_cu_qdot_raw's Q6_K expression on the same operands, so the same float. SH: the row
 * from a copy in shared memory (16-byte aligned, as the row is). */
template <bool SH = false>
__device__ __forceinline__ float engine_cu_q6r_dot(const uint8_t *row, int c, int n_chunks,
                                                   const engine_cu_xv &xv) {
    size_t oq, oh, os, od;
    engine_cu_q6r_at(c, n_chunks, &oq, &oh, &os, &od);
    uint32_t ql[4], lo[4], hi[4];
    qd_load16<SH>(row + oq, ql);
    const uint2 u = SH ? *(const uint2 *)(row + oh) : engine_cu_ldd((const uint2 *)(row + oh));
    const uint32_t sc = qd_h<SH>((const uint16_t *)(row + os));
    const float d = engine_cu_h2f(qd_h<SH>((const uint16_t *)(row + od)));
    int a0, b0;
    engine_cu_chunk_cols(ENGINE_CU_TYPE_Q6_KR, c, &a0, &b0);
    const int4 xa = *(const int4 *)(xv.q + a0), xb = *(const int4 *)(xv.q + b0);
    const float da = xv.d[a0 >> 5], db = xv.d[b0 >> 5], sa = xv.s[a0 >> 4], sb = xv.s[b0 >> 4];
    engine_cu_q6r_unpack(ql, u.x, u.y, lo, hi);
    const float d1 = d * (float)(int)(int8_t)(sc & 0xffu), d2 = d * (float)(int)(int8_t)(sc >> 8);
    const int ia = engine_cu_dp4a4(lo, xa, 0), ib = engine_cu_dp4a4(hi, xb, 0);
    return d1 * (da * (float)ia - 32.0f * sa) + d2 * (db * (float)ib - 32.0f * sb);
}

/* Chunk c of a quantised row against the staged int8 vector (the row's column 0 at xv). */
template <int T, bool SH = false>
__device__ __forceinline__ float engine_cu_qdot_chunk(const uint8_t *row, int c,
                                                      const engine_cu_xv &xv) {
    engine_cu_qraw r;
    engine_cu_qload<T, SH>(row, c, r);
    return engine_cu_qdot_raw<T>(r, row, c, xv);
}

/* Chunk c of an F32 / F16 / BF16 row against the staged F32 vector. */
template <int T>
__device__ __forceinline__ float engine_cu_fdot_chunk(const uint8_t *row, int c,
                                                      const engine_cu_xv &xv) {
    int a0, b0;
    engine_cu_chunk_cols(T, c, &a0, &b0);
    float va[16], vb[16], xa[16], xb[16];
    engine_cu_decode_chunk(T, row, c, va, vb);
    engine_cu_load_run(xv.f, nullptr, 1.0f, a0, xa);
    engine_cu_load_run(xv.f, nullptr, 1.0f, b0, xb);
    return engine_cu_dot32(va, vb, xa, xb);
}

/* SH: a quantised row's copy in shared memory (the float types read global memory: the bulk
 * copies serve the quantised types only). */
template <int T, bool SH = false>
__device__ __forceinline__ float engine_cu_dot_chunk(const uint8_t *row, int c,
                                                     const engine_cu_xv &xv) {
    if (engine_cu_type_quant(T)) return engine_cu_qdot_chunk<T, SH>(row, c, xv);
    return engine_cu_fdot_chunk<T>(row, c, xv);
}

/* The types of each kernel class (X(type) once each): a kernel is instantiated per class, so
 * the float types' register needs do not weigh on the quantised ones. */
#define ENGINE_CU_QUANT_CASES(X)                                                                   \
    X(ENGINE_TYPE_Q4_K)                                                                            \
    X(ENGINE_TYPE_Q5_K) X(ENGINE_TYPE_Q6_K) X(ENGINE_TYPE_Q8_0) X(ENGINE_TYPE_Q4_0)
#define ENGINE_CU_FLOAT_CASES(X) X(ENGINE_TYPE_F16) X(ENGINE_TYPE_BF16) X(ENGINE_TYPE_F32)

#endif
