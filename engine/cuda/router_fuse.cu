/* The MoE router folded into the wo launch (contract in router_fuse.cuh), and the build of its
 * F32 matrices; engine_cuda_op_router_fuse for the tests. */
#include <string.h>

#include "router_fuse.cuh"
#include "vmv_dev.cuh"

extern "C" {
#include "cuda/cuda_backend.h"
}

size_t engine_cu_rf_smem(int wo_type, int n_embd, int n_att) {
    const size_t f = sizeof(float) * ((size_t)n_embd + (size_t)n_att);
    return engine_cu_type_quant(wo_type) ? f + engine_cu_xs_bytes(true, n_att) : f;
}

/* Float4s of a router row each thread loads into registers before the wait (all of a row of
 * up to RF_PRE * 4 * 256 values: 6144, the 30B-A3B's row; 8 spill in the Q8_K instance); the
 * rest is asked of L2 then and loaded after it. */
#define RF_PRE 6

static __device__ __forceinline__ float rf_dot4(uint4 w, float4 x, float acc) {
    acc = fmaf(__uint_as_float(w.x), x.x, acc);
    acc = fmaf(__uint_as_float(w.y), x.y, acc);
    acc = fmaf(__uint_as_float(w.z), x.z, acc);
    return fmaf(__uint_as_float(w.w), x.w, acc);
}

/* Router block blk (every thread of the block): RB rows, blk * RB + i, of [R | M] against [x ; â]
 * staged in F32 (raw[e] = the row's dot product), â staged first as the wo blocks stage it
 * (MODE: Wo's staging), then dequantised. A row's threads (the block's 1/RB) take consecutive
 * float4s of it (coalesced), the first RF_PRE (RB 2: half) each loaded into registers before the
 * wait (the rows are written once, at the build); the row's warps' parts are summed by its first
 * thread. RB = 2 when one row per block would not fit the launch in one wave (qwen35: 257 rows). */
template <int MODE, int RB>
__device__ __forceinline__ void rf_router_block(const engine_cu_rf_args &a, int blk, uint8_t *sm) {
    __shared__ float part[ENGINE_CU_MV_WARPS];
    const int t = threadIdx.x, nt = blockDim.x, emb = a.n_embd, na = a.wo.cols;
    /* RB > 1: a block of ENGINE_CU_MV_WARPS warps (the launch), so the row split is constant */
    const int ntr = RB == 1 ? nt : ENGINE_CU_MV_WARPS * 32 / RB, tr = RB == 1 ? t : t % ntr;
    const int e = blk * RB + (RB == 1 ? 0 : t / ntr), n_rows = a.rm.m[0].rows;
    const bool live = RB == 1 || e < n_rows;
    const int n4 = (emb + na) >> 2;
    const uint4 *w4 =
        (const uint4 *)(a.rm.m[0].w + (size_t)(live ? e : n_rows - 1) * a.rm.m[0].row_bytes);
    constexpr int PRE = RB == 1 ? RF_PRE : RF_PRE / 2;
    uint4 pre[PRE];
#pragma unroll
    for (int k = 0; k < PRE; k++)
        if (live && tr + k * ntr < n4) pre[k] = engine_cu_ldq(w4 + tr + k * ntr);
    if (live && n4 > PRE * ntr && tr < 32) /* one warp a row: the rest of it, L2 only */
        engine_cu_prefetch_l2((const uint8_t *)(w4 + PRE * ntr),
                              sizeof(uint4) * (size_t)(n4 - PRE * ntr));
    engine_cu_pdl_wait();
    float *f = (float *)sm;
    for (int i = t; i < (emb >> 2); i += nt)
        ((float4 *)f)[i] = ((const float4 *)a.x)[i];
    if (MODE == ENGINE_CU_X_F32) {
        engine_cu_stage_x<ENGINE_CU_X_F32>(a.wo.x, na, nullptr, 0.0f, (uint8_t *)(f + emb));
    } else {
        uint8_t *qs = sm + sizeof(float) * ((size_t)emb + (size_t)na);
        engine_cu_stage_x<MODE>(a.wo.x, na, nullptr, 0.0f, qs); /* ends with a barrier */
        const engine_cu_xv v = engine_cu_xv_at(qs, na, true, 0);
        for (int j = t; j < na; j += nt)
            f[emb + j] = v.d[j >> 5] * (float)v.q[j];
        __syncthreads();
    }
    ENGINE_CU_TRACE(4); /* [x ; â] staged (trace builds: the router blocks' stages) */
    const float4 *f4 = (const float4 *)f;
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < PRE; k++)
        if (live && tr + k * ntr < n4) acc = rf_dot4(pre[k], f4[tr + k * ntr], acc);
    if (live)
        for (int i = tr + PRE * ntr; i < n4; i += ntr)
            acc = rf_dot4(engine_cu_ldq(w4 + i), f4[i], acc);
    acc = engine_cu_warp_sum(acc);
    if ((t & 31) == 0) part[t >> 5] = acc;
    __syncthreads();
    if (RB == 1 ? t == 0 : tr == 0 && live) {
        float sum = 0.0f;
        for (int k = RB == 1 ? 0 : t >> 5; k < (RB == 1 ? nt >> 5 : (t + ntr) >> 5); k++)
            sum += part[k];
        a.rm.m[0].y[e] = sum;
    }
    ENGINE_CU_TRACE_END(); /* its raw logits stored */
}

/* Block blockIdx.x of the launch for the token a points at: blocks [0, n_rb) router blocks of RB
 * rows each, the rest the wo product's blocks (R rows per warp, n_groups row groups, as
 * engine_cu_matvec_plan says). */
template <int MODE, int R, int RB, int TT = 0, bool TO = false>
__device__ __forceinline__ void rf_wo_block(const engine_cu_rf_args &a, int n_groups, uint8_t *sm) {
    const int n_rb = (a.rm.m[0].rows + RB - 1) / RB;
    if ((int)blockIdx.x < n_rb)
        rf_router_block<MODE, RB>(a, blockIdx.x, sm);
    else
        mv_block<MODE, R, engine_cu_pdl_sync, false, false, TT, TO>(
            a.wo, n_groups, blockIdx.x - n_rb, gridDim.x - n_rb, sm,
            engine_cu_pdl_sync()); /* no norm */
}

/* TT (engine_cu_rf_args.spec): the instance of Wo's type alone (matvec_dev.cuh mv_group); TO:
 * its bulk-copy form alone (launched only with a.wo.tma) */
template <int MODE, int R, int RB, int TT = 0, bool TO = false>
__global__ void __launch_bounds__(ENGINE_CU_MV_WARPS * 32, 3)
    rf_wo_kernel(engine_cu_rf_args a, int n_groups) {
    extern __shared__ __align__(128) uint4 rf_smem[];
    engine_cu_pdl_launch();
    rf_wo_block<MODE, R, RB, TT, TO>(a, n_groups, (uint8_t *)rf_smem);
}

/* rf_wo_kernel for blockIdx.y's token (router_fuse.cuh: m > 1): its pointers moved on, then the
 * same blocks. */
template <int MODE, int R, int RB>
__global__ void __launch_bounds__(ENGINE_CU_MV_WARPS * 32, 3)
    rf_wo_tok_kernel(engine_cu_rf_args a, int n_groups) {
    extern __shared__ __align__(128) uint4 rf_smem[];
    engine_cu_pdl_launch();
    const size_t t = blockIdx.y;
    a.x += t * a.x_stride;
    a.wo.x += t * a.att_stride;
    a.wo.m[0].y += t * a.ao_stride;
    a.rm.m[0].y += t * a.raw_stride;
    rf_wo_block<MODE, R, RB>(a, n_groups, (uint8_t *)rf_smem);
}

/* rf_wo_kernel's blocks with the tokens in turn (router_fuse.cuh: seq): block b does its router
 * rows or wo row groups for token 0, then 1, ..; a barrier between tokens (the staging in shared
 * memory is reused). The first token's wait is the launch's; the later ones return at once. */
template <int MODE, int R, int RB>
__global__ void __launch_bounds__(ENGINE_CU_MV_WARPS * 32, 3)
    rf_wo_seq_kernel(engine_cu_rf_args a, int n_groups) {
    extern __shared__ __align__(128) uint4 rf_smem[];
    engine_cu_pdl_launch();
    const float *x0 = a.x, *att0 = a.wo.x;
    float *ao0 = a.wo.m[0].y, *raw0 = a.rm.m[0].y;
    for (int t = 0; t < a.m; t++) {
        if (t) __syncthreads();
        a.x = x0 + (size_t)t * a.x_stride;
        a.wo.x = att0 + (size_t)t * a.att_stride;
        a.wo.m[0].y = ao0 + (size_t)t * a.ao_stride;
        a.rm.m[0].y = raw0 + (size_t)t * a.raw_stride;
        rf_wo_block<MODE, R, RB>(a, n_groups, (uint8_t *)rf_smem);
    }
}

/* Router block blk of rf_wo_vec_kernel: rf_router_block's rows for the m tokens at once. Each
 * weight float4 is loaded once (the same loads, before and after the wait) and multiplied with
 * every token's [x ; â] float4: x read from memory (the values rf_router_block copies into shared
 * memory), â dequantised from the m stagings (d * q, as rf_router_block dequantises its own);
 * each token's sum in rf_router_block's order (the thread's float4s in turn, the warp sum, the
 * row's warps in order), so raw is the decode launch's bit for bit. */
template <int MODE, int RB>
__device__ __forceinline__ void rf_router_vec(const engine_cu_rf_args &a, int blk,
                                              const uint8_t *sm, size_t xs,
                                              float (*part)[ENGINE_CU_MV_WARPS]) {
    const int t = threadIdx.x, nt = blockDim.x, emb = a.n_embd, na = a.wo.cols, m = a.m;
    const int ntr = RB == 1 ? nt : ENGINE_CU_MV_WARPS * 32 / RB, tr = RB == 1 ? t : t % ntr;
    const int e = blk * RB + (RB == 1 ? 0 : t / ntr), n_rows = a.rm.m[0].rows;
    const bool live = RB == 1 || e < n_rows;
    const int n4 = (emb + na) >> 2, e4 = emb >> 2;
    const uint4 *w4 =
        (const uint4 *)(a.rm.m[0].w + (size_t)(live ? e : n_rows - 1) * a.rm.m[0].row_bytes);
    constexpr int PRE = RB == 1 ? RF_PRE : RF_PRE / 2;
    uint4 pre[PRE];
#pragma unroll
    for (int k = 0; k < PRE; k++)
        if (live && tr + k * ntr < n4) pre[k] = engine_cu_ldq(w4 + tr + k * ntr);
    if (live && n4 > PRE * ntr && tr < 32)
        engine_cu_prefetch_l2((const uint8_t *)(w4 + PRE * ntr),
                              sizeof(uint4) * (size_t)(n4 - PRE * ntr));
    engine_cu_pdl_wait();
    engine_cu_stage_xm<MODE>(a.wo.x, a.att_stride, na, nullptr, 0.0f, (uint8_t *)sm, xs, m);
    float acc[ENGINE_CU_VMAX];
#pragma unroll
    for (int k = 0; k < ENGINE_CU_VMAX; k++)
        acc[k] = 0.0f;
    /* float4 i of token k's [x ; â] */
    auto fv = [&](int i, int k) -> float4 {
        if (i < e4) return ((const float4 *)(a.x + (size_t)k * a.x_stride))[i];
        const engine_cu_xv v = vmv_xv(sm, xs, na, true, k);
        const int j = 4 * i - emb;
        const float d = v.d[j >> 5];
        const char4 q = *(const char4 *)(v.q + j);
        return make_float4(d * (float)q.x, d * (float)q.y, d * (float)q.z, d * (float)q.w);
    };
#pragma unroll
    for (int p = 0; p < PRE; p++)
        if (live && tr + p * ntr < n4)
#pragma unroll
            for (int k = 0; k < ENGINE_CU_VMAX; k++)
                if (k < m) acc[k] = rf_dot4(pre[p], fv(tr + p * ntr, k), acc[k]);
    if (live)
        for (int i = tr + PRE * ntr; i < n4; i += ntr) {
            const uint4 wv = engine_cu_ldq(w4 + i);
#pragma unroll
            for (int k = 0; k < ENGINE_CU_VMAX; k++)
                if (k < m) acc[k] = rf_dot4(wv, fv(i, k), acc[k]);
        }
#pragma unroll
    for (int k = 0; k < ENGINE_CU_VMAX; k++) {
        if (k >= m) break;
        const float s = engine_cu_warp_sum(acc[k]);
        if ((t & 31) == 0) part[k][t >> 5] = s;
    }
    __syncthreads();
    if (tr < m && live) { /* the row's first thread's sum, for token tr */
        const int k0 = (t - tr) >> 5, k1 = (t - tr + ntr) >> 5;
        float sum = 0.0f;
        for (int k = k0; k < k1; k++)
            sum += part[tr][k];
        a.rm.m[0].y[(size_t)tr * a.raw_stride + e] = sum;
    }
}

/* rf_wo_kernel's blocks for the m tokens at once (router_fuse.cuh: seq 2): the decode launch's
 * grid; every block stages the m tokens' â side by side (engine_cu_stage_xm: the wo blocks'
 * staging, m times); router blocks as rf_router_vec, wo blocks the m-vector products of the
 * decode's rows (vmv_group: each weight chunk loaded once, each sum the decode's). */
template <int MODE, int R, int RB>
__global__ void __launch_bounds__(ENGINE_CU_MV_WARPS * 32, 3)
    rf_wo_vec_kernel(engine_cu_rf_args a, int n_groups) {
    extern __shared__ __align__(128) uint4 rf_smem[];
    __shared__ float part[ENGINE_CU_VMAX][ENGINE_CU_MV_WARPS];
    engine_cu_pdl_launch();
    const uint8_t *sm = (const uint8_t *)rf_smem;
    const size_t xs = vmv_xs(true, a.wo.cols);
    const int n_rb = (a.rm.m[0].rows + RB - 1) / RB;
    if ((int)blockIdx.x < n_rb) {
        rf_router_vec<MODE, RB>(a, blockIdx.x, sm, xs, part);
        return;
    }
    const int bx = blockIdx.x - n_rb, gdx = gridDim.x - n_rb;
    vmv_prefetch_first<R>(a.wo, bx);
    engine_cu_pdl_wait();
    engine_cu_stage_xm<MODE>(a.wo.x, a.att_stride, a.wo.cols, nullptr, 0.0f, (uint8_t *)sm, xs,
                             a.m);
    const size_t ys[1] = {a.ao_stride};
    for (int g = bx; g < n_groups; g += gdx)
        vmv_group<MODE, R>(a.wo, ys, g, sm, xs, a.m, 0, part);
}

/* rf_wo_kernel's instance of Wo's type T for r rows a warp (1, 2), with the bulk-copy form alone
 * (to) or every form */
typedef void (*rf_kernel_fn)(engine_cu_rf_args, int);
template <int MODE, int RB, int T> static rf_kernel_fn rf_spec_kernel(int r, bool to) {
    if (r == 1) return to ? rf_wo_kernel<MODE, 1, RB, T, true> : rf_wo_kernel<MODE, 1, RB, T>;
    return to ? rf_wo_kernel<MODE, 2, RB, T, true> : rf_wo_kernel<MODE, 2, RB, T>;
}

template <int MODE, int RB>
static void rf_launch_rb(const engine_cu_rf_args *a, const engine_cu_mv_plan &p, size_t smem,
                         cudaStream_t stream) {
    const dim3 grid((a->rm.m[0].rows + RB - 1) / RB + p.blocks), block(ENGINE_CU_MV_WARPS * 32);
    if (MODE != ENGINE_CU_X_F32 && a->m > 1 && a->seq == 2) { /* the tokens at once */
        const size_t vs = vmv_xs(true, a->wo.cols) * (size_t)a->m;
        if (p.r == 0)
            engine_cu_launch(rf_wo_vec_kernel<MODE, 0, RB>, grid, block, vs, stream, *a,
                             p.n_groups);
        else if (p.r == 1)
            engine_cu_launch(rf_wo_vec_kernel<MODE, 1, RB>, grid, block, vs, stream, *a,
                             p.n_groups);
        else
            engine_cu_launch(rf_wo_vec_kernel<MODE, 2, RB>, grid, block, vs, stream, *a,
                             p.n_groups);
        return;
    }
    if (a->m > 1 && a->seq) { /* the tokens in turn in each block */
        if (p.r == 0)
            engine_cu_launch(rf_wo_seq_kernel<MODE, 0, RB>, grid, block, smem, stream, *a,
                             p.n_groups);
        else if (p.r == 1)
            engine_cu_launch(rf_wo_seq_kernel<MODE, 1, RB>, grid, block, smem, stream, *a,
                             p.n_groups);
        else
            engine_cu_launch(rf_wo_seq_kernel<MODE, 2, RB>, grid, block, smem, stream, *a,
                             p.n_groups);
        return;
    }
    if (a->m > 1) { /* tokens as a grid dimension */
        const dim3 tg(grid.x, (unsigned)a->m);
        if (p.r == 0)
            engine_cu_launch(rf_wo_tok_kernel<MODE, 0, RB>, tg, block, smem, stream, *a,
                             p.n_groups);
        else if (p.r == 1)
            engine_cu_launch(rf_wo_tok_kernel<MODE, 1, RB>, tg, block, smem, stream, *a,
                             p.n_groups);
        else
            engine_cu_launch(rf_wo_tok_kernel<MODE, 2, RB>, tg, block, smem, stream, *a,
                             p.n_groups);
        return;
    }
    /* router_fuse.cuh spec: instances only in the type's own staging mode */
    const int wt = a->wo.m[0].type;
    /* the bulk-copy form alone where the wo blocks take it (spec 3: every form, as before) */
    const bool to = a->spec != 3 && a->wo.tma && !a->wo.coop && !a->wo.nw_late &&
                    !a->wo.norm_w; /* matvec_dev.cuh mv_block TO, without a norm */
    if constexpr (MODE == ENGINE_CU_X_Q8_K)
        if (a->spec == 1 && p.r > 0 && wt == ENGINE_TYPE_Q4_K) {
            engine_cu_launch(rf_spec_kernel<MODE, RB, ENGINE_TYPE_Q4_K>(p.r, to), grid, block, smem,
                             stream, *a, p.n_groups);
            return;
        }
    if constexpr (MODE == ENGINE_CU_X_Q8_0)
        if (a->spec && p.r > 0 && wt == ENGINE_TYPE_Q8_0) {
            engine_cu_launch(rf_spec_kernel<MODE, RB, ENGINE_TYPE_Q8_0>(p.r, to), grid, block, smem,
                             stream, *a, p.n_groups);
            return;
        }
    if constexpr (MODE != ENGINE_CU_X_F32)   /* to: a quantised mode's (rf_launch) */
        if (a->spec == 4 && to && p.r > 0) { /* the generic instance, the copy form alone */
            engine_cu_launch(p.r == 1 ? rf_wo_kernel<MODE, 1, RB, 0, true>
                                      : rf_wo_kernel<MODE, 2, RB, 0, true>,
                             grid, block, smem, stream, *a, p.n_groups);
            return;
        }
    if (p.r == 0)
        engine_cu_launch(rf_wo_kernel<MODE, 0, RB>, grid, block, smem, stream, *a, p.n_groups);
    else if (p.r == 1)
        engine_cu_launch(rf_wo_kernel<MODE, 1, RB>, grid, block, smem, stream, *a, p.n_groups);
    else
        engine_cu_launch(rf_wo_kernel<MODE, 2, RB>, grid, block, smem, stream, *a, p.n_groups);
}

template <int MODE> static void rf_launch(const engine_cu_rf_args *in, cudaStream_t stream) {
    engine_cu_rf_args b = *in;
    const engine_cu_rf_args *a = &b;
    const engine_cu_mv_plan p = engine_cu_matvec_plan(&a->wo);
    const size_t rs = engine_cu_rf_smem(a->wo.m[0].type, a->n_embd, a->wo.cols);
    size_t smem = rs > p.smem ? rs : p.smem;
    /* the wo blocks' rows bulk-copied into shared memory (engine_cu_mv.tma) when the launch
     * still fits one wave with that memory; one token only */
    b.wo.tma = 0;
    if constexpr (MODE != ENGINE_CU_X_F32) {
        const size_t tsm = a->m <= 1 ? engine_cu_mv_tma_smem(&in->wo, &p) : 0;
        if (tsm && p.r >= 1 && p.r <= 2) {
            const size_t s2 = tsm > smem ? tsm : smem;
            if (engine_cu_one_wave(p.r == 1 ? rf_wo_kernel<MODE, 1, 2> : rf_wo_kernel<MODE, 2, 2>,
                                   ENGINE_CU_MV_WARPS * 32, s2, a->rm.m[0].rows + p.blocks)) {
                b.wo.tma = 1;
                smem = s2;
            }
        }
    }
    /* two rows per router block when a block per row would not fit the resident slots */
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &per_sm, rf_wo_kernel<MODE, 1, 1>, ENGINE_CU_MV_WARPS * 32, smem) != cudaSuccess ||
        per_sm < 1)
        per_sm = 1; /* the error stays for the caller's cudaGetLastError */
    if (a->rows_per_block == 2 || a->rm.m[0].rows + p.blocks > engine_cu_sm_count() * per_sm)
        rf_launch_rb<MODE, 2>(a, p, smem, stream);
    else
        rf_launch_rb<MODE, 1>(a, p, smem, stream);
}

void engine_cu_rf_wo(const engine_cu_rf_args *a, cudaStream_t stream) {
    switch (engine_cu_x_mode(a->wo.m[0].type)) {
    case ENGINE_CU_X_Q8_K:
        rf_launch<ENGINE_CU_X_Q8_K>(a, stream);
        break;
    case ENGINE_CU_X_Q8_0:
        rf_launch<ENGINE_CU_X_Q8_0>(a, stream);
        break;
    default:
        rf_launch<ENGINE_CU_X_F32>(a, stream);
        break;
    }
}

/* ---------------------------------------------------------------------------------------------
 * The build (once per model): dequantise, scale, multiply
 * ------------------------------------------------------------------------------------------- */

/* out[r * ld + c] = w[r][c] * (g ? g[c] : 1), w dequantised (dequant.cuh): a thread per 32-value
 * chunk of a row. */
__global__ void rf_dequant_kernel(const uint8_t *w, size_t rb, int type, int rows, int cols,
                                  const float *g, float *out, size_t ld) {
    const int nch = cols >> 5;
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)rows * nch) return;
    const int r = (int)(t / nch), c = (int)(t - (long long)r * nch);
    float va[16], vb[16];
    engine_cu_decode_chunk(type, w + (size_t)r * rb, c, va, vb);
    int a0, b0;
    engine_cu_chunk_cols(type, c, &a0, &b0);
    float *o = out + (size_t)r * ld;
#pragma unroll
    for (int l = 0; l < 16; l++) {
        o[a0 + l] = g ? va[l] * g[a0 + l] : va[l];
        o[b0 + l] = g ? vb[l] * g[b0 + l] : vb[l];
    }
}

#define RF_TM 64
#define RF_TN 64
#define RF_TK 16

/* C[m][n] = sum_k A[m][k] B[k][n] (row-major, leading dimensions lda, ldb, ldc), F32: a block
 * per 64 x 64 tile of C, each thread 4 x 4 of it (rows ty + 16 i, columns tx + 16 j); each
 * 16-deep slice of k summed apart and then added (shorter chains of rounding than one running
 * sum over k). */
__global__ void __launch_bounds__(256)
    rf_gemm_kernel(const float *A, size_t lda, const float *B, size_t ldb, float *C, size_t ldc,
                   int M, int N, int K) {
    __shared__ float as[RF_TK][RF_TM + 1], bs[RF_TK][RF_TN];
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int m0 = blockIdx.y * RF_TM, n0 = blockIdx.x * RF_TN;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += RF_TK) {
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int idx = threadIdx.x + 256 * q;
            const int am = idx / RF_TK, ak = idx % RF_TK;
            as[ak][am] = m0 + am < M && k0 + ak < K ? A[(size_t)(m0 + am) * lda + k0 + ak] : 0.0f;
            const int bk = idx / RF_TN, bn = idx % RF_TN;
            bs[bk][bn] = k0 + bk < K && n0 + bn < N ? B[(size_t)(k0 + bk) * ldb + n0 + bn] : 0.0f;
        }
        __syncthreads();
        float p[4][4] = {};
#pragma unroll
        for (int k = 0; k < RF_TK; k++) {
            float av[4], bv[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                av[i] = as[k][ty + 16 * i];
                bv[i] = bs[k][tx + 16 * i];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    p[i][j] = fmaf(av[i], bv[j], p[i][j]);
        }
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                acc[i][j] += p[i][j];
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
            if (m < M && n < N) C[(size_t)m * ldc + n] = acc[i][j];
        }
}

static void rf_dequant(const uint8_t *w, size_t rb, int type, int rows, int cols, const float *g,
                       float *out, size_t ld, cudaStream_t stream) {
    const long long n = (long long)rows * (cols >> 5);
    rf_dequant_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(w, rb, type, rows, cols, g,
                                                                       out, ld);
}

int engine_cu_rf_build(const uint8_t *wo, int wo_type, size_t wo_rb, const uint8_t *wr, int wr_type,
                       size_t wr_rb, const float *g, int n_expert, int n_embd, int n_att,
                       float *scratch, float *rm, cudaStream_t stream) {
    const size_t ld = (size_t)n_embd + (size_t)n_att;
    rf_dequant(wr, wr_rb, wr_type, n_expert, n_embd, g, rm, ld, stream); /* R */
    rf_dequant(wo, wo_rb, wo_type, n_embd, n_att, nullptr, scratch, (size_t)n_att, stream);
    const dim3 grid((unsigned)((n_att + RF_TN - 1) / RF_TN),
                    (unsigned)((n_expert + RF_TM - 1) / RF_TM));
    rf_gemm_kernel<<<grid, 256, 0, stream>>>(rm, ld, scratch, (size_t)n_att, rm + n_embd, ld,
                                             n_expert, n_att, n_embd); /* M = R Wo */
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return engine_err(e == cudaErrorMemoryAllocation ? ENGINE_ENOMEM : ENGINE_EINTERNAL,
                          "CUDA router fusion build: %s", cudaGetErrorString(e));
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Test entry point (cuda_backend.h)
 * ------------------------------------------------------------------------------------------- */
extern "C" int engine_cuda_op_router_fuse(engine_type wo_type, const void *wo, size_t wo_rb,
                                          engine_type wr_type, const void *wr, size_t wr_rb,
                                          int n_expert, int n_embd, int n_att, const float *g,
                                          const float *x, const float *att, int rows_per_block,
                                          float *rm, float *ao, float *raw) {
    int rc = engine_cuda_usable();
    if (rc) return rc;
    if (!engine_cu_type_supported(wo_type) || !engine_cu_type_supported(wr_type) || n_expert < 1 ||
        n_embd < 32 || n_att < 32 || n_embd % 32 || n_att % 32 ||
        (engine_cu_x_mode(wo_type) == ENGINE_CU_X_Q8_K && n_att % 256))
        return engine_err(ENGINE_EINVAL, "router fusion: wo type %d, router type %d, %d x %d x %d",
                          (int)wo_type, (int)wr_type, n_expert, n_embd, n_att);
    const size_t ld = (size_t)n_embd + (size_t)n_att;
    const size_t b_wo = (size_t)n_embd * wo_rb, b_wr = (size_t)n_expert * wr_rb;
    const size_t b_rm = sizeof(float) * (size_t)n_expert * ld;
    const size_t b_scr = sizeof(float) * (size_t)n_embd * (size_t)n_att;
    const size_t f_emb = sizeof(float) * (size_t)n_embd, f_att = sizeof(float) * (size_t)n_att;
    const size_t f_raw = sizeof(float) * (size_t)n_expert;
    /* one allocation, each piece 256-byte aligned */
    size_t off[9], total = 0;
    const size_t sizes[9] = {b_wo, b_wr, b_rm, b_scr, f_emb, f_emb, f_att, f_emb, f_raw};
    for (int i = 0; i < 9; i++) {
        off[i] = total;
        total += (sizes[i] + 255) & ~(size_t)255;
    }
    uint8_t *d = nullptr;
    cudaError_t e = cudaMalloc((void **)&d, total);
    if (e != cudaSuccess) goto fail;
    {
        uint8_t *dwo = d + off[0], *dwr = d + off[1];
        float *drm = (float *)(d + off[2]), *dscr = (float *)(d + off[3]);
        float *dg = (float *)(d + off[4]), *dx = (float *)(d + off[5]);
        float *datt = (float *)(d + off[6]), *dao = (float *)(d + off[7]);
        float *draw = (float *)(d + off[8]);
        if ((e = cudaMemcpy(dwo, wo, b_wo, cudaMemcpyHostToDevice)) != cudaSuccess ||
            (e = cudaMemcpy(dwr, wr, b_wr, cudaMemcpyHostToDevice)) != cudaSuccess ||
            (e = cudaMemcpy(dg, g, f_emb, cudaMemcpyHostToDevice)) != cudaSuccess ||
            (e = cudaMemcpy(dx, x, f_emb, cudaMemcpyHostToDevice)) != cudaSuccess ||
            (e = cudaMemcpy(datt, att, f_att, cudaMemcpyHostToDevice)) != cudaSuccess)
            goto fail;
        if ((rc = engine_cu_rf_build(dwo, wo_type, wo_rb, dwr, wr_type, wr_rb, dg, n_expert, n_embd,
                                     n_att, dscr, drm, 0)))
            goto done;
        engine_cu_rf_args a;
        memset(&a, 0, sizeof a);
        a.wo.m[0] = {dwo, wo_rb, (int)wo_type, n_embd, dao, 0};
        a.wo.n_mat = 1;
        a.wo.cols = n_att;
        a.wo.x = datt;
        a.rm.m[0] = {(const uint8_t *)drm, sizeof(float) * ld, ENGINE_TYPE_F32, n_expert, draw, 0};
        a.rm.n_mat = 1;
        a.rm.cols = (int)ld;
        a.x = dx;
        a.n_embd = n_embd;
        a.rows_per_block = rows_per_block;
        engine_cu_rf_wo(&a, 0);
        if ((e = cudaGetLastError()) != cudaSuccess ||
            (e = cudaDeviceSynchronize()) != cudaSuccess ||
            (e = cudaMemcpy(rm, drm, b_rm, cudaMemcpyDeviceToHost)) != cudaSuccess ||
            (e = cudaMemcpy(ao, dao, f_emb, cudaMemcpyDeviceToHost)) != cudaSuccess ||
            (e = cudaMemcpy(raw, draw, f_raw, cudaMemcpyDeviceToHost)) != cudaSuccess)
            goto fail;
    }
    goto done;
fail:
    cudaGetLastError();
    rc = engine_err(e == cudaErrorMemoryAllocation ? ENGINE_ENOMEM : ENGINE_EINTERNAL,
                    "CUDA router fusion op: %s", cudaGetErrorString(e));
done:
    cudaFree(d);
    return rc;
}

ENGINE_CU_TRACE_TU(router_fuse)
