/* Small-m products for the batched decode step (contract in batch_mm.cuh). */
#include <algorithm>
#include <math.h>

#include "batch_mm.cuh"
#include "qdot.cuh"

#define BMM_WARPS 8
#define BMM_RPW 2                     /* rows per warp in a row group */
#define BMM_TG 8                      /* staged inputs a warp takes together */
#define BMM_PER (BMM_WARPS * BMM_RPW) /* rows of a row group */
#define BMM_SMEM (96 * 1024)          /* staged inputs of one block at most */
#define BMM_MAX_STAGE 64              /* items staged at once at most */

typedef struct {
    engine_cu_bmm_args a;
    int max_stage;
    int xsb; /* bytes of one staged input (16-byte multiple) */
} bmm_launch;

/* The warp's row (and its fused partner) against nt <= BMM_TG staged inputs (xsb bytes apart):
 * per item the lane's chunks lane, lane + 32, ... summed over the warp (the order of mv_rows
 * with one row, so each item's sum does not depend on the others). The items share each
 * chunk's weight loads and decoding (the same loads in one unrolled body: the compiler keeps
 * one; item 0 always runs, so they are not conditional). */
template <int T, bool UP>
__device__ __forceinline__ void bmm_dot(const uint8_t *row, const uint8_t *row2, int n_chunks,
                                        const uint8_t *xs, int xsb, int cols, int nt,
                                        float s[BMM_TG], float s2[BMM_TG]) {
    constexpr bool quant = engine_cu_type_quant(T);
    float a0[BMM_TG], a1[BMM_TG];
#pragma unroll
    for (int j = 0; j < BMM_TG; j++)
        a0[j] = a1[j] = 0.0f;
    for (int c = threadIdx.x & 31; c < n_chunks; c += 32) {
#pragma unroll
        for (int j = 0; j < BMM_TG; j++) {
            if (j > 0 && j >= nt) break;
            const engine_cu_xv xv = engine_cu_xv_at(xs + (size_t)j * xsb, cols, quant, 0);
            a0[j] += engine_cu_dot_chunk<T>(row, c, xv);
            if (UP) a1[j] += engine_cu_dot_chunk<T>(row2, c, xv);
        }
    }
#pragma unroll
    for (int j = 0; j < BMM_TG; j++) {
        s[j] = engine_cu_warp_sum(a0[j]);
        if (UP) s2[j] = engine_cu_warp_sum(a1[j]);
    }
}

template <int MODE, bool UP>
__global__ void __launch_bounds__(32 * BMM_WARPS) bmm_kernel(bmm_launch L) {
    extern __shared__ uint4 bmm_smem[];
    uint8_t *sm = (uint8_t *)bmm_smem;
    const engine_cu_bmm_args &a = L.a;
    int e = 0, first = 0, cnt = a.m;
    if (a.tiles) {
        const int ti = (int)blockIdx.y;
        if (ti >= *a.n_tiles) return; /* the whole block: no barrier skipped */
        e = a.tiles[3 * ti];
        first = a.tiles[3 * ti + 1];
        cnt = a.tiles[3 * ti + 2];
    }
    const uint8_t *W = a.w + (size_t)e * a.mat_bytes;
    const uint8_t *W2 = UP ? a.w2 + (size_t)e * a.mat_bytes : nullptr;
    const int w = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31);
    const int n_groups = (a.rows + BMM_PER - 1) / BMM_PER, n_chunks = a.cols >> 5;
    for (int s0 = 0; s0 < cnt; s0 += L.max_stage) {
        const int ns = min(L.max_stage, cnt - s0);
        if (s0) __syncthreads(); /* every warp is done with the previous inputs */
        for (int i = 0; i < ns; i++) {
            const int it = first + s0 + i, xr = a.x_idx ? a.x_idx[it] : it;
            engine_cu_stage_x<MODE>(a.x + (size_t)xr * a.cols, a.cols, a.norm_w, a.eps,
                                    sm + (size_t)i * L.xsb);
        }
        for (int g = (int)blockIdx.x; g < n_groups; g += (int)gridDim.x)
            for (int rr = 0; rr < BMM_RPW; rr++) {
                const int r = g * BMM_PER + rr * BMM_WARPS + w;
                if (r >= a.rows) break;
                const uint8_t *row = W + (size_t)r * a.row_bytes;
                const uint8_t *row2 = UP ? W2 + (size_t)r * a.row_bytes : nullptr;
                for (int t0 = 0; t0 < ns; t0 += BMM_TG) {
                    const int nt = min(BMM_TG, ns - t0);
                    const uint8_t *xs = sm + (size_t)t0 * L.xsb;
                    float s[BMM_TG], s2[BMM_TG];
#pragma unroll
                    for (int j = 0; j < BMM_TG; j++)
                        s[j] = s2[j] = 0.0f;
                    switch (a.type) {
#define BMM_CASE(T)                                                                                \
    case T:                                                                                        \
        if (MODE == engine_cu_x_mode(T))                                                           \
            bmm_dot<T, UP>(row, row2, n_chunks, xs, L.xsb, a.cols, nt, s, s2);                     \
        break;
                        ENGINE_CU_QUANT_CASES(BMM_CASE)
                        ENGINE_CU_FLOAT_CASES(BMM_CASE)
#undef BMM_CASE
                    }
                    if (lane == 0)
#pragma unroll
                        for (int j = 0; j < BMM_TG; j++) {
                            if (j >= nt) break;
                            float *y = a.y + (size_t)(first + s0 + t0 + j) * a.ldy + r;
                            const float v = UP ? s[j] / (1.0f + expf(-s[j])) * s2[j] : s[j];
                            *y = a.accumulate ? *y + v : v;
                        }
                }
            }
    }
}

/* Dense products over m >= 2 items (every item shares every row): each chunk's weights are
 * decoded once to F32 (dequant.cuh, exact) and dotted with each item's F32 input (normalised),
 * as the decode step's float path (fdot_chunk) does per item. The inputs are staged with 4
 * floats of padding after every 64, so that the runs the lanes of a quarter warp read (16 floats
 * at the chunk columns of Q4_K / Q5_K) fall in distinct banks. */
__device__ __forceinline__ int bmm_pad(int col) {
    return col + 4 * (col >> 6);
}

template <bool UP>
__device__ __forceinline__ void bmm_fdot(int type, const uint8_t *row, const uint8_t *row2,
                                         int n_chunks, const float *xs, int xsf, int nt,
                                         float s[BMM_TG], float s2[BMM_TG]) {
    float a0[BMM_TG], a1[BMM_TG];
#pragma unroll
    for (int j = 0; j < BMM_TG; j++)
        a0[j] = a1[j] = 0.0f;
    for (int c = threadIdx.x & 31; c < n_chunks; c += 32) {
        int ca, cb;
        engine_cu_chunk_cols(type, c, &ca, &cb);
        ca = bmm_pad(ca);
        cb = bmm_pad(cb);
        float va[16], vb[16], ua[16], ub[16];
        engine_cu_decode_chunk(type, row, c, va, vb);
        if (UP) engine_cu_decode_chunk(type, row2, c, ua, ub);
#pragma unroll
        for (int j = 0; j < BMM_TG; j++) {
            if (j >= nt) break;
            float xa[16], xb[16];
            engine_cu_load_run(xs + (size_t)j * xsf, nullptr, 1.0f, ca, xa);
            engine_cu_load_run(xs + (size_t)j * xsf, nullptr, 1.0f, cb, xb);
            a0[j] += engine_cu_dot32(va, vb, xa, xb);
            if (UP) a1[j] += engine_cu_dot32(ua, ub, xa, xb);
        }
    }
#pragma unroll
    for (int j = 0; j < BMM_TG; j++) {
        s[j] = engine_cu_warp_sum(a0[j]);
        if (UP) s2[j] = engine_cu_warp_sum(a1[j]);
    }
}

template <bool UP> __global__ void __launch_bounds__(32 * BMM_WARPS) bmm_f_kernel(bmm_launch L) {
    extern __shared__ uint4 bmm_smem[];
    float *sm = (float *)bmm_smem;
    __shared__ float scale[BMM_MAX_STAGE];
    const engine_cu_bmm_args &a = L.a;
    const int w = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31);
    const int n_groups = (a.rows + BMM_PER - 1) / BMM_PER, n_chunks = a.cols >> 5;
    const int xsf = L.xsb / 4;
    for (int s0 = 0; s0 < a.m; s0 += L.max_stage) {
        const int ns = min(L.max_stage, a.m - s0);
        if (s0) __syncthreads(); /* every warp is done with the previous inputs */
        for (int i = w; i < ns; i += BMM_WARPS) {
            const float *x = a.x + (size_t)(s0 + i) * a.cols;
            const float sc = a.norm_w ? engine_cu_warp_rms_scale(x, a.cols, a.eps) : 1.0f;
            if (lane == 0) scale[i] = sc;
        }
        __syncthreads();
        for (int i = 0; i < ns; i++) {
            const float *x = a.x + (size_t)(s0 + i) * a.cols;
            float *d = sm + (size_t)i * xsf;
            for (int col = (int)threadIdx.x; col < a.cols; col += (int)blockDim.x)
                d[bmm_pad(col)] = a.norm_w ? a.norm_w[col] * (x[col] * scale[i]) : x[col];
        }
        __syncthreads();
        for (int g = (int)blockIdx.x; g < n_groups; g += (int)gridDim.x)
            for (int rr = 0; rr < BMM_RPW; rr++) {
                const int r = g * BMM_PER + rr * BMM_WARPS + w;
                if (r >= a.rows) break;
                const uint8_t *row = a.w + (size_t)r * a.row_bytes;
                const uint8_t *row2 = UP ? a.w2 + (size_t)r * a.row_bytes : nullptr;
                for (int t0 = 0; t0 < ns; t0 += BMM_TG) {
                    const int nt = min(BMM_TG, ns - t0);
                    float s[BMM_TG], s2[BMM_TG];
                    bmm_fdot<UP>(a.type, row, row2, n_chunks, sm + (size_t)t0 * xsf, xsf, nt, s,
                                 s2);
                    if (lane == 0)
#pragma unroll
                        for (int j = 0; j < BMM_TG; j++) {
                            if (j >= nt) break;
                            float *y = a.y + (size_t)(s0 + t0 + j) * a.ldy + r;
                            const float v = UP ? s[j] / (1.0f + expf(-s[j])) * s2[j] : s[j];
                            *y = a.accumulate ? *y + v : v;
                        }
                }
            }
    }
}

static int bmm_xsb(int mode, int cols) {
    return (int)((engine_cu_xs_bytes(mode != ENGINE_CU_X_F32, cols) + 15) & ~(size_t)15);
}

int engine_cu_bmm_init(void) {
#define BMM_ATTR(M, U)                                                                             \
    ENGINE_CUDA_CHECK(cudaFuncSetAttribute(                                                        \
        bmm_kernel<M, U>, cudaFuncAttributeMaxDynamicSharedMemorySize, BMM_SMEM));
    BMM_ATTR(ENGINE_CU_X_F32, false)
    BMM_ATTR(ENGINE_CU_X_F32, true)
    BMM_ATTR(ENGINE_CU_X_Q8_0, false)
    BMM_ATTR(ENGINE_CU_X_Q8_0, true)
    BMM_ATTR(ENGINE_CU_X_Q8_K, false)
    BMM_ATTR(ENGINE_CU_X_Q8_K, true)
#undef BMM_ATTR
    ENGINE_CUDA_CHECK(cudaFuncSetAttribute(bmm_f_kernel<false>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, BMM_SMEM));
    ENGINE_CUDA_CHECK(cudaFuncSetAttribute(bmm_f_kernel<true>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, BMM_SMEM));
    return 0;
}

void engine_cu_bmm(const engine_cu_bmm_args *a, cudaStream_t stream) {
    if (a->rows < 1 || (a->tiles ? a->max_tiles < 1 : a->m < 1)) return;
    const int mode = engine_cu_x_mode(a->type);
    /* dense over several items: weights decoded once per chunk for all of them */
    const bool fdec = !a->tiles && a->m >= 2;
    bmm_launch L;
    L.a = *a;
    L.xsb = fdec ? (int)((sizeof(float) * (a->cols + a->cols / 16) + 15) & ~(size_t)15)
                 : bmm_xsb(mode, a->cols);
    L.max_stage =
        std::max(1, std::min({std::max(1, a->max_items), BMM_SMEM / L.xsb, BMM_MAX_STAGE}));
    const size_t smem = (size_t)L.max_stage * L.xsb;
    const int n_groups = (a->rows + BMM_PER - 1) / BMM_PER;
    /* a dense matrix of many rows (the output head): a few waves of blocks looping over the
     * row groups, so the inputs are staged once per block */
    const int gx = a->tiles ? (n_groups + std::max(1, a->gpb) - 1) / std::max(1, a->gpb)
                            : std::min(n_groups, 1024);
    const dim3 grid((unsigned)gx, a->tiles ? (unsigned)a->max_tiles : 1u);
    const bool up = a->w2 != NULL;
    if (fdec) {
        if (up)
            bmm_f_kernel<true><<<grid, 32 * BMM_WARPS, smem, stream>>>(L);
        else
            bmm_f_kernel<false><<<grid, 32 * BMM_WARPS, smem, stream>>>(L);
        return;
    }
    switch (mode) {
#define BMM_GO(M)                                                                                  \
    case M:                                                                                        \
        if (up)                                                                                    \
            bmm_kernel<M, true><<<grid, 32 * BMM_WARPS, smem, stream>>>(L);                        \
        else                                                                                       \
            bmm_kernel<M, false><<<grid, 32 * BMM_WARPS, smem, stream>>>(L);                       \
        break;
        BMM_GO(ENGINE_CU_X_F32)
        BMM_GO(ENGINE_CU_X_Q8_0)
        BMM_GO(ENGINE_CU_X_Q8_K)
#undef BMM_GO
    }
}

__global__ void bmm_swiglu_kernel(float *g, const float *u, int n) {
    for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n;
         i += (int)(gridDim.x * blockDim.x)) {
        const float v = g[i];
        g[i] = v / (1.0f + expf(-v)) * u[i];
    }
}

void engine_cu_bmm_swiglu(float *g, const float *u, int n, cudaStream_t stream) {
    if (n > 0) bmm_swiglu_kernel<<<std::min((n + 255) / 256, 4096), 256, 0, stream>>>(g, u, n);
}

ENGINE_CU_TRACE_TU(batch_mm)
