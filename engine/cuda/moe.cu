/* MoE / dense FFN kernels and launchers (contract in moe.cuh; device side in moe_dev.cuh). */
#include <stdlib.h>
#include <string.h>

#include "moe_dev.cuh"
#include "step.cuh"

/* S6: the decode stage-6 paths (routed, stage_early: moe.cuh) in an instance of their own, so
 * that the default kernel's code stays as it was; RF likewise the router fusion's (x_add,
 * y_add). */
template <int MODE, bool S6, bool RF = false>
__global__ void __launch_bounds__(FFN_WARPS * 32, 3) ffn_up_kernel(engine_cu_ffn_up_args a) {
    extern __shared__ __align__(128) uint4 up_smem[];
    if (!a.trigger_late) engine_cu_pdl_launch();
    ffn_up_block<MODE, engine_cu_pdl_sync, S6, RF>(a, blockIdx.x, gridDim.x, (uint8_t *)up_smem,
                                                   engine_cu_pdl_sync());
}

template <int MODE, bool RF = false>
__global__ void __launch_bounds__(FFN_WARPS * 32, 3) ffn_down_kernel(engine_cu_ffn_down_args a) {
    extern __shared__ __align__(128) uint4 down_smem[];
    engine_cu_pdl_launch();
    ffn_down_block<MODE, engine_cu_pdl_sync, RF>(a, blockIdx.x, gridDim.x, (uint8_t *)down_smem,
                                                 engine_cu_pdl_sync());
}

/* Tokens as a grid dimension (moe.cuh: m > 1): blockIdx.y's token, its pointers moved on, then
 * exactly the decode kernel's block (the stage-4 path: trigger at the start, every block routes;
 * RF the router fusion's instance). */
template <int MODE, bool RF>
__global__ void __launch_bounds__(FFN_WARPS * 32, 3) ffn_up_tok_kernel(engine_cu_ffn_up_args a) {
    extern __shared__ __align__(128) uint4 up_smem[];
    engine_cu_pdl_launch();
    const size_t t = blockIdx.y;
    a.x += t * a.x_stride;
    if (RF) a.x_add += t * a.x_stride;
    if (a.router) {
        a.router += t * a.router_stride;
        a.ids += t * a.ids_stride;
        a.weights += t * a.ids_stride;
    }
    if (RF && a.rf_sh) a.rf_sh += t;
    a.h += t * a.h_stride;
    a.max_bps = a.tok_blocks > 0; /* every item's rows asked of L2 */
    ffn_up_block<MODE, engine_cu_pdl_sync, false, RF>(a, blockIdx.x, gridDim.x, (uint8_t *)up_smem,
                                                      engine_cu_pdl_sync());
}

template <int MODE, bool RF>
__global__ void __launch_bounds__(FFN_WARPS * 32, 3)
    ffn_down_tok_kernel(engine_cu_ffn_down_args a) {
    extern __shared__ __align__(128) uint4 down_smem[];
    engine_cu_pdl_launch();
    const size_t t = blockIdx.y;
    a.h += t * a.h_stride;
    if (a.ids) {
        a.ids += t * a.ids_stride;
        a.weights += t * a.ids_stride;
    }
    a.y += t * a.y_stride;
    if (RF) a.y_add += t * a.y_stride;
    if (a.sh_logit) a.sh_logit += t;
    a.max_bps = a.tok_blocks > 0;
    ffn_down_block<MODE, engine_cu_pdl_sync, RF>(a, blockIdx.x, gridDim.x, (uint8_t *)down_smem,
                                                 engine_cu_pdl_sync());
}

/* One warp routes as an up block's routing warp does (engine_cuda_op_route, test_cuda_ops). */
__global__ void route_test_kernel(const float *logits, int n, int k, int norm, int flags,
                                  int32_t *ids_out, float *wts_out) {
    __shared__ int ids[ENGINE_CU_MAX_EXPERT_USED];
    __shared__ float wts[ENGINE_CU_MAX_EXPERT_USED];
    if (flags & ENGINE_CU_ROUTE_SHFL)
        route<false>(logits, n, k, norm, ids, wts);
    else
        route<true>(logits, n, k, norm, ids, wts);
    __syncwarp();
    if ((int)threadIdx.x < k) {
        ids_out[threadIdx.x] = ids[threadIdx.x];
        wts_out[threadIdx.x] = wts[threadIdx.x];
    }
}

void engine_cu_route_test(const float *logits, int n, int k, int norm, int flags, int32_t *ids,
                          float *wts, cudaStream_t stream) {
    route_test_kernel<<<1, 32, 0, stream>>>(logits, n, k, norm, flags, ids, wts);
}

int engine_cu_route_parse(const char *v, int dflt) {
    const char *b = getenv("SPARK_CUDA_PF_BULK"), *t = getenv("SPARK_CUDA_TMA");
    int bulk = b && b[0] == '0' ? 0 : ENGINE_CU_ROUTE_BULK;
    if (!t || !strcmp(t, "1")) /* the default */
        bulk |= ENGINE_CU_ROUTE_TMA | ENGINE_CU_ROUTE_TMA_DN | ENGINE_CU_ROUTE_TMA_MV;
    else if (strcmp(t, "0"))
        bulk |= (strchr(t, 'u') ? ENGINE_CU_ROUTE_TMA : 0) |
                (strchr(t, 'd') ? ENGINE_CU_ROUTE_TMA_DN : 0) |
                (strchr(t, 'm') ? ENGINE_CU_ROUTE_TMA_MV : 0);
    if (!v) return dflt | bulk;
    return (strstr(v, "shfl") ? ENGINE_CU_ROUTE_SHFL : 0) | bulk;
}

/* Blocks of a launch of n work items: one per item, or at most max_bps per multiprocessor. */
static int ffn_blocks(int n, int max_bps) {
    if (max_bps <= 0) return n;
    const int cap = engine_cu_sm_count() * max_bps;
    return n < cap ? n : cap;
}

/* Blocks per token of a launch with the tokens as a grid dimension: one per item, or at most
 * tok_blocks (> 0). */
static unsigned ffn_tok_blocks(int n, int tok_blocks) {
    return (unsigned)(tok_blocks > 0 && tok_blocks < n ? tok_blocks : n);
}

static size_t engine_cu_ffn_up_smem(int type, int cols) {
    return engine_cu_xs_bytes(engine_cu_type_quant(type), cols);
}

static size_t engine_cu_ffn_down_smem(int type, int k, int cols) {
    return engine_cu_xs_bytes(engine_cu_type_quant(type), k * cols);
}

/* The bulk copies (ENGINE_CU_ROUTE_TMA) fit this decode launch: sm_90+, a quantised type, runs
 * of `run` bytes at 16-byte-aligned offsets from a 16-byte-aligned base, and shared memory of
 * `smem` bytes in all for a block. */
static bool ffn_tma_fits(const void *base, size_t expert_bytes, size_t run, size_t smem, int type) {
    int dev = 0, optin = 0;
    if (!engine_cu_type_quant(type) || ((uintptr_t)base & 15) != 0 || expert_bytes % 16 != 0 ||
        run % 16 != 0 || !engine_cu_bulk_ok())
        return false;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
            cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return smem <= (size_t)optin;
}

void engine_cu_ffn_up(const engine_cu_ffn_up_args *a, cudaStream_t stream) {
    const int n_items = engine_cu_up_groups(a->rows) * (a->router ? a->k : 1);
    const dim3 grid(ffn_blocks(n_items, a->max_bps));
    const int mode = engine_cu_x_mode(a->type);
    const bool s6 = a->routed || a->stage_early;
    if (a->m > 1) { /* tokens as a grid dimension (the stage-4 block code) */
        const dim3 tg(ffn_tok_blocks(n_items, a->tok_blocks), (unsigned)a->m);
        const bool rf = a->x_add != nullptr;
        engine_cu_ffn_up_args b = *a;
        b.route &= ~ENGINE_CU_ROUTE_TMA;
        engine_cu_launch(
            mode == ENGINE_CU_X_Q8_K   ? (rf ? ffn_up_tok_kernel<ENGINE_CU_X_Q8_K, true>
                                             : ffn_up_tok_kernel<ENGINE_CU_X_Q8_K, false>)
            : mode == ENGINE_CU_X_Q8_0 ? (rf ? ffn_up_tok_kernel<ENGINE_CU_X_Q8_0, true>
                                             : ffn_up_tok_kernel<ENGINE_CU_X_Q8_0, false>)
            : rf                       ? ffn_up_tok_kernel<ENGINE_CU_X_F32, true>
                                       : ffn_up_tok_kernel<ENGINE_CU_X_F32, false>,
            tg, dim3(FFN_WARPS * 32), engine_cu_ffn_up_smem(a->type, a->cols), stream, b);
        return;
    }
    engine_cu_ffn_up_args b = *a;
    size_t smem = engine_cu_ffn_up_smem(a->type, a->cols);
    if (b.route & ENGINE_CU_ROUTE_TMA) { /* one item per block, two runs of 2 FFN_WARPS rows */
        const size_t run = (size_t)2 * FFN_WARPS * a->row_bytes,
                     tsm = engine_cu_w_off(smem) + 2 * run;
        if (!s6 && a->max_bps <= 0 && a->rows % (2 * FFN_WARPS) == 0 &&
            ((uintptr_t)a->up & 15) == 0 &&
            ffn_tma_fits(a->gate, a->router ? a->expert_bytes : 0, run, tsm, a->type))
            smem = tsm;
        else
            b.route &= ~ENGINE_CU_ROUTE_TMA;
    }
    if (a->x_add) { /* router fusion (not with the stage-6 paths) */
        engine_cu_launch(mode == ENGINE_CU_X_Q8_K   ? ffn_up_kernel<ENGINE_CU_X_Q8_K, false, true>
                         : mode == ENGINE_CU_X_Q8_0 ? ffn_up_kernel<ENGINE_CU_X_Q8_0, false, true>
                                                    : ffn_up_kernel<ENGINE_CU_X_F32, false, true>,
                         grid, dim3(FFN_WARPS * 32), smem, stream, b);
        return;
    }
    engine_cu_launch(
        mode == ENGINE_CU_X_Q8_K
            ? (s6 ? ffn_up_kernel<ENGINE_CU_X_Q8_K, true> : ffn_up_kernel<ENGINE_CU_X_Q8_K, false>)
        : mode == ENGINE_CU_X_Q8_0
            ? (s6 ? ffn_up_kernel<ENGINE_CU_X_Q8_0, true> : ffn_up_kernel<ENGINE_CU_X_Q8_0, false>)
        : s6 ? ffn_up_kernel<ENGINE_CU_X_F32, true>
             : ffn_up_kernel<ENGINE_CU_X_F32, false>,
        grid, dim3(FFN_WARPS * 32), smem, stream, b);
}

void engine_cu_ffn_down(const engine_cu_ffn_down_args *a, cudaStream_t stream) {
    const int mode = engine_cu_x_mode(a->type);
    const bool rf = a->y_add != nullptr;
    const unsigned gx = (unsigned)ffn_blocks((a->rows + FFN_WARPS - 1) / FFN_WARPS, a->max_bps);
    if (a->m > 1) { /* tokens as a grid dimension */
        engine_cu_ffn_down_args b = *a;
        b.tma = 0;
        engine_cu_launch(
            mode == ENGINE_CU_X_Q8_K   ? (rf ? ffn_down_tok_kernel<ENGINE_CU_X_Q8_K, true>
                                             : ffn_down_tok_kernel<ENGINE_CU_X_Q8_K, false>)
            : mode == ENGINE_CU_X_Q8_0 ? (rf ? ffn_down_tok_kernel<ENGINE_CU_X_Q8_0, true>
                                             : ffn_down_tok_kernel<ENGINE_CU_X_Q8_0, false>)
            : rf                       ? ffn_down_tok_kernel<ENGINE_CU_X_F32, true>
                                       : ffn_down_tok_kernel<ENGINE_CU_X_F32, false>,
            dim3(ffn_tok_blocks((a->rows + FFN_WARPS - 1) / FFN_WARPS, a->tok_blocks),
                 (unsigned)a->m),
            dim3(FFN_WARPS * 32), engine_cu_ffn_down_smem(a->type, a->k, a->cols), stream, b);
        return;
    }
    engine_cu_ffn_down_args b = *a;
    size_t smem = engine_cu_ffn_down_smem(a->type, a->k, a->cols);
    b.tma = 0;
    if (a->tma) { /* one row group per block: a run of FFN_WARPS rows per expert */
        const size_t run = (size_t)FFN_WARPS * a->row_bytes,
                     tsm = engine_cu_w_off(smem) + (size_t)a->k * engine_cu_run_stride(run);
        b.tma = a->max_bps <= 0 && !a->touch && !a->preload && !a->router && !a->ids_early &&
                a->rows % FFN_WARPS == 0 &&
                ffn_tma_fits(a->down, a->ids ? a->expert_bytes : 0, run, tsm, a->type);
        if (b.tma) smem = tsm;
    }
    engine_cu_launch(
        mode == ENGINE_CU_X_Q8_K
            ? (rf ? ffn_down_kernel<ENGINE_CU_X_Q8_K, true> : ffn_down_kernel<ENGINE_CU_X_Q8_K>)
        : mode == ENGINE_CU_X_Q8_0
            ? (rf ? ffn_down_kernel<ENGINE_CU_X_Q8_0, true> : ffn_down_kernel<ENGINE_CU_X_Q8_0>)
        : rf ? ffn_down_kernel<ENGINE_CU_X_F32, true>
             : ffn_down_kernel<ENGINE_CU_X_F32>,
        dim3(gx), dim3(FFN_WARPS * 32), smem, stream, b);
}

engine_cu_phase engine_cu_ffn_up_phase(const engine_cu_ffn_up_args *a) {
    engine_cu_phase ph;
    memset(&ph, 0, sizeof ph);
    ph.kind = ENGINE_CU_PH_UP + engine_cu_x_mode(a->type);
    ph.gx = engine_cu_up_groups(a->rows);
    ph.gy = a->router ? a->k : 1;
    ph.n_blocks = ph.gx * ph.gy; /* one item per block: the fused step keeps the stage-4 plan */
    ph.smem = engine_cu_ffn_up_smem(a->type, a->cols);
    ph.u.up = *a;
    ph.u.up.max_bps = ph.u.up.trigger_late = 0;
    ph.u.up.routed = 0; /* the fused step's router phase does not route (matvec.cu) */
    ph.u.up.stage_early = 0;
    ph.u.up.route &= ~ENGINE_CU_ROUTE_TMA; /* the fused step's smem is the staging's */
    return ph;
}

engine_cu_phase engine_cu_ffn_down_phase(const engine_cu_ffn_down_args *a) {
    engine_cu_phase ph;
    memset(&ph, 0, sizeof ph);
    ph.kind = ENGINE_CU_PH_DOWN + engine_cu_x_mode(a->type);
    ph.gx = ph.n_blocks = (a->rows + FFN_WARPS - 1) / FFN_WARPS;
    ph.gy = 1;
    ph.smem = engine_cu_ffn_down_smem(a->type, a->k, a->cols);
    ph.u.dn = *a;
    ph.u.dn.max_bps = 0;
    ph.u.dn.ids_early = 0;
    ph.u.dn.router = nullptr; /* the fused step waits for the routing flag instead */
    ph.u.dn.tma = 0;
    return ph;
}

ENGINE_CU_TRACE_TU(moe)
