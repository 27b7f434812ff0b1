/* Kernels of the qwen35moe speculative path (contracts in q35_verify.cuh). */
#include <string.h>

#include "gatt_dev.cuh"
#include "moe_dev.cuh"
#include "q35_verify.cuh"
#include "vmv_dev.cuh"

/* ---------------------------------------------------------------------------------------------
 * Matrix times m vectors
 * ------------------------------------------------------------------------------------------- */
/* Ask L1 for the m vectors x + t * stride (n floats each) that a block then stages one after
 * the other: one L2 round trip for all of them instead of one per staging. After the wait only
 * (the previous kernel writes them). A hint: no effect on the values. */
__device__ __forceinline__ void v_prefetch_l1(const float *x, size_t stride, int n, int m,
                                              int w0 = 0) {
    const int lines = (n + 31) / 32; /* 32 floats a 128-byte line; warps w0.. take them */
    const int nt = (int)blockDim.x - 32 * w0;
    for (int i = (int)threadIdx.x - 32 * w0; i < m * lines; i += nt) {
        const int t = i / lines, l = i - t * lines;
        asm volatile("prefetch.global.L1 [%0];" ::"l"(x + (size_t)t * stride + (size_t)l * 32));
    }
}

/* R == 0 (split-K, one matrix of few rows): a group is one row, warp w taking chunks 32 w +
 * lane step 256 (matvec.cu's split-K); else a group is 8 R rows, warp w computing rows w,
 * w + 8 (R = 2) with lanes taking chunks lane step 32. */
template <int MODE, int R, int MINB = 2, bool Q6R = false>
__global__ void __launch_bounds__(ENGINE_CU_MV_WARPS * 32, MINB)
    vmv_kernel(engine_cu_vmv a, int n_groups) {
    extern __shared__ uint4 vmv_smem[];
    __shared__ float part[ENGINE_CU_VMAX][ENGINE_CU_MV_WARPS];
    engine_cu_pdl_launch();
    uint8_t *sm = (uint8_t *)vmv_smem;
    /* split: this block's token t0 alone (its vector at x + t0 * x_stride, its y rows at
     * + t0 * y_stride), else all m from token 0 */
    const int t0 = a.split ? (int)blockIdx.y : 0;
    const int m = a.split ? 1 : a.m, cols = a.mv.cols;
    const bool quant = MODE != ENGINE_CU_X_F32;
    const size_t xs = vmv_xs(quant, cols);
    vmv_prefetch_first<R>(a.mv, blockIdx.x); /* while the previous kernel finishes */
    engine_cu_pdl_wait();
    if (m > 1 && a.prefetch) v_prefetch_l1(a.mv.x, a.x_stride, cols, m);
    if (!a.serial_stage && !(a.mv.coop && a.mv.norm_w)) /* the m stagings side by side */
        engine_cu_stage_xm<MODE>(a.mv.x + (size_t)t0 * a.x_stride, a.x_stride, cols, a.mv.norm_w,
                                 a.mv.eps, sm, xs, m);
    for (int t = 0; t < m && (a.serial_stage || (a.mv.coop && a.mv.norm_w)); t++) {
        const float *xt = a.mv.x + (size_t)(t0 + t) * a.x_stride;
        /* engine_cu_mv.coop: the decode's block-wide scale (matvec_dev.cuh mv_stage) */
        const float sc =
            a.mv.coop && a.mv.norm_w
                ? engine_cu_block_scale<false, false>((const float4 *)xt, nullptr, cols, a.mv.eps)
                : -1.0f;
        engine_cu_stage_x<MODE>(xt, cols, a.mv.norm_w, a.mv.eps, sm + (size_t)t * xs, 0, nullptr,
                                sc);
    }
    for (int g = blockIdx.x; g < n_groups; g += gridDim.x)
        vmv_group<MODE, R, Q6R>(a.mv, a.y_stride, g, sm, xs, m, t0, part);
}

size_t engine_cu_vmatvec_smem(int type, int cols, int m) {
    return vmv_xs(engine_cu_type_quant(type), cols) * (size_t)m;
}

/* The decode matvec's plan (matvec.cu, mv_plan_mode) for this kernel's occupancy. */
template <int MODE> static void vmv_launch_mode(const engine_cu_vmv *a0, cudaStream_t st) {
    const int threads = ENGINE_CU_MV_WARPS * 32;
    int dev = 0, sms = 1, per1 = 1, per2 = 1, rows = 0, g1 = 0, g2 = 0;
    for (int i = 0; i < a0->mv.n_mat; i++) {
        rows += a0->mv.m[i].rows;
        g1 += (a0->mv.m[i].rows + ENGINE_CU_MV_WARPS - 1) / ENGINE_CU_MV_WARPS;
        g2 += (a0->mv.m[i].rows + 2 * ENGINE_CU_MV_WARPS - 1) / (2 * ENGINE_CU_MV_WARPS);
    }
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        sms < 1)
        sms = 1;
    /* few row groups (the router, the small projections): the tokens side by side */
    engine_cu_vmv b = *a0;
    b.split = a0->split && a0->m > 1 && g1 < sms ? 1 : 0;
    const engine_cu_vmv *a = &b;
    const unsigned ny = b.split ? (unsigned)b.m : 1u;
    const size_t smem =
        vmv_xs(MODE != ENGINE_CU_X_F32, a->mv.cols) * (size_t)(b.split ? 1 : a->m);
    if constexpr (MODE == ENGINE_CU_X_Q8_K)
        if (a->mv.n_mat == 1 && a->mv.m[0].type == ENGINE_CU_TYPE_Q6_KR) {
            /* the output head's repacked copy (vmv_dev.cuh vmv_group's Q6R instance): a wave
             * of blocks of two-row groups with registers for 3 a multiprocessor ("h3"), one-row
             * groups when those fit one wave (each row's sums as in any other instance) */
            int per = 1;
            if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, vmv_kernel<MODE, 1, 2, true>,
                                                              threads, smem) != cudaSuccess ||
                per < 1)
                per = 1;
            if (g1 <= sms * per) {
                engine_cu_launch(vmv_kernel<MODE, 1, 2, true>, dim3(g1, ny), dim3(threads), smem,
                                 st, *a, g1);
                return;
            }
            auto kq = vmv_kernel<MODE, 2, 3, true>;
            if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kq, threads, smem) !=
                    cudaSuccess ||
                per < 1)
                per = 1;
            engine_cu_launch(kq, dim3(g2 > sms * per ? sms * per : g2), dim3(threads), smem, st, *a,
                             g2);
            return;
        }
    if (a->mv.n_mat == 1 && g1 < sms && a->mv.cols >= 32 * 32 * 2) { /* split-K */
        engine_cu_launch(vmv_kernel<MODE, 0>, dim3(rows, ny), dim3(threads), smem, st, *a, rows);
        return;
    }
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per1, vmv_kernel<MODE, 1>, threads,
                                                      smem) != cudaSuccess ||
        per1 < 1)
        per1 = 1;
    if (g1 <= sms * per1) {
        engine_cu_launch(vmv_kernel<MODE, 1>, dim3(g1, ny), dim3(threads), smem, st, *a, g1);
        return;
    }
    if (a->mv.r3 && a->mv.n_mat > 1 && !a->dense) { /* engine_cu_mv.r3, as the decode plan */
        int g3 = 0, per2 = 1, per3 = 1;
        for (int i = 0; i < a->mv.n_mat; i++)
            g3 += (a->mv.m[i].rows + 3 * ENGINE_CU_MV_WARPS - 1) / (3 * ENGINE_CU_MV_WARPS);
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per2, vmv_kernel<MODE, 2>, threads,
                                                          smem) != cudaSuccess ||
            per2 < 1)
            per2 = 1;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per3, vmv_kernel<MODE, 3>, threads,
                                                          smem) != cudaSuccess ||
            per3 < 1)
            per3 = 1;
        if (g2 > sms * per2 && g3 <= sms * per3) {
            engine_cu_launch(vmv_kernel<MODE, 3>, dim3(g3), dim3(threads), smem, st, *a, g3);
            return;
        }
    }
    if (a->dense == 2) { /* the heads, "h4": four rows per warp in flight */
        int g4 = 0, per4 = 1;
        for (int i = 0; i < a->mv.n_mat; i++)
            g4 += (a->mv.m[i].rows + 4 * ENGINE_CU_MV_WARPS - 1) / (4 * ENGINE_CU_MV_WARPS);
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per4, vmv_kernel<MODE, 4>, threads,
                                                          smem) != cudaSuccess ||
            per4 < 1)
            per4 = 1;
        const int blocks = a->mv.n_mat == 1 && g4 > sms * per4 ? sms * per4 : g4;
        engine_cu_launch(vmv_kernel<MODE, 4>, dim3(blocks), dim3(threads), smem, st, *a, g4);
        return;
    }
    /* dense (the heads, SPARK_CUDA_MTP_FUSED=h3): registers for 3 blocks per SM, as the decode
     * matvec's */
    auto k2 = a->dense ? vmv_kernel<MODE, 2, 3> : vmv_kernel<MODE, 2>;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per2, k2, threads, smem) != cudaSuccess ||
        per2 < 1)
        per2 = 1;
    const int blocks = a->mv.n_mat == 1 && g2 > sms * per2 ? sms * per2 : g2;
    engine_cu_launch(k2, dim3(blocks), dim3(threads), smem, st, *a, g2);
}

/* a's matrices by staging mode (part[mode], n_mat 0 where none). */
static void vmv_split(const engine_cu_vmv *a, engine_cu_vmv part[3]) {
    for (int k = 0; k < 3; k++) {
        part[k] = *a;
        part[k].mv.n_mat = 0;
    }
    for (int i = 0; i < a->mv.n_mat; i++) {
        engine_cu_vmv *p = &part[engine_cu_x_mode(a->mv.m[i].type)];
        p->y_stride[p->mv.n_mat] = a->y_stride[i];
        p->mv.m[p->mv.n_mat++] = a->mv.m[i];
    }
}

void engine_cu_vmatvec(const engine_cu_vmv *a, cudaStream_t stream) {
    engine_cu_vmv part[3];
    vmv_split(a, part);
    if (part[ENGINE_CU_X_F32].mv.n_mat) vmv_launch_mode<ENGINE_CU_X_F32>(&part[0], stream);
    if (part[ENGINE_CU_X_Q8_0].mv.n_mat) vmv_launch_mode<ENGINE_CU_X_Q8_0>(&part[1], stream);
    if (part[ENGINE_CU_X_Q8_K].mv.n_mat) vmv_launch_mode<ENGINE_CU_X_Q8_K>(&part[2], stream);
}

/* Tokens as a grid dimension on the decode matvec's own block code: the per-token arguments
 * (x and y moved on by the strides) in parameter space (__grid_constant__: read in place, no
 * copy), block b serving token b % m with the decode launch's block b / m of gdx. */
typedef struct {
    engine_cu_mv tok[ENGINE_CU_VMAX];
    int m;
} vtok_args;

template <int MODE, int R, bool Q6R = false>
__global__ void __launch_bounds__(ENGINE_CU_MV_WARPS * 32, 3)
    vtok_kernel(const __grid_constant__ vtok_args a, int n_groups, int gdx) {
    extern __shared__ uint4 vtok_smem[];
    engine_cu_pdl_launch();
    const int t = (int)blockIdx.x % a.m, bx = (int)blockIdx.x / a.m;
    mv_block<MODE, R, engine_cu_pdl_sync, Q6R>(a.tok[t], n_groups, bx, gdx, (uint8_t *)vtok_smem,
                                               engine_cu_pdl_sync());
}

/* The head with the tokens one after the other in each block (engine_cu_vmatvec_seq): the
 * decode launch's grid and rows, the block staging the m vectors, then per row group the decode
 * block code for token 0, 1, ... (the later tokens' rows from L1 / L2). R > 0 only. */
template <int MODE, int R, bool Q6R = false>
__global__ void __launch_bounds__(ENGINE_CU_MV_WARPS * 32, 3)
    vseq_kernel(const __grid_constant__ vtok_args a, int n_groups) {
    extern __shared__ uint4 vseq_smem[];
    __shared__ float part[ENGINE_CU_MV_WARPS];
    engine_cu_pdl_launch();
    const engine_cu_mv &a0 = a.tok[0];
    const bool quant = MODE != ENGINE_CU_X_F32;
    const size_t xs = vmv_xs(quant, a0.cols);
    uint8_t *sm = (uint8_t *)vseq_smem;
    mv_prefetch_groups<R>(a0, blockIdx.x, gridDim.x, n_groups, false); /* the first group */
    if (a0.norm_w && threadIdx.x >> 5 == ENGINE_CU_MV_WARPS - 1)
        engine_cu_prefetch_l2((const uint8_t *)a0.norm_w, sizeof(float) * (size_t)a0.cols);
    engine_cu_pdl_wait();
    for (int t = 0; t < a.m; t++) {
        const float sc = a0.coop && a0.norm_w
                             ? engine_cu_block_scale<false, false>((const float4 *)a.tok[t].x,
                                                                   nullptr, a0.cols, a0.eps)
                             : -1.0f; /* as mv_stage */
        engine_cu_stage_x<MODE>(a.tok[t].x, a0.cols, a0.norm_w, a0.eps, sm + (size_t)t * xs, 0,
                                nullptr, sc);
    }
    for (int g = blockIdx.x; g < n_groups; g += gridDim.x)
        for (int t = 0; t < a.m; t++)
            mv_group<MODE, R, Q6R>(a.tok[t], g,
                                   engine_cu_xv_at(sm + (size_t)t * xs, a0.cols, quant, 0), part);
}

/* v's per-token arguments. */
static void vtok_fill(const engine_cu_vmv *v, vtok_args *a) {
    memset(a, 0, sizeof *a);
    a->m = v->m;
    for (int t = 0; t < v->m; t++) {
        a->tok[t] = v->mv;
        a->tok[t].r3 = 0; /* the launches below take the plans of one and two rows */
        a->tok[t].q6r_rows = 0;
        a->tok[t].x = v->mv.x + (size_t)t * v->x_stride;
        for (int i = 0; i < v->mv.n_mat; i++)
            a->tok[t].m[i].y = v->mv.m[i].y + (size_t)t * v->y_stride[i];
    }
}

template <int MODE> static void vtok_launch_mode(const engine_cu_vmv *v, bool seq, cudaStream_t st) {
    vtok_args a;
    vtok_fill(v, &a);
    const engine_cu_mv_plan p = engine_cu_matvec_plan(&a.tok[0]);
    /* the decode's grid per token: a block per group, or one wave looping over the groups
     * (the head), then shared by the m tokens so that the launch stays one wave */
    const int nb = p.blocks >= p.n_groups ? p.n_groups : p.blocks >= v->m ? p.blocks / v->m : 1;
    if constexpr (MODE == ENGINE_CU_X_Q8_K)
        if (v->mv.n_mat == 1 && v->mv.m[0].type == ENGINE_CU_TYPE_Q6_KR) {
            /* the output head's repacked copy: the Q6R instances (one or two rows a warp, the
             * decode plan's: matvec.cu never plans split-K for it) */
            const dim3 block(ENGINE_CU_MV_WARPS * 32);
            if (seq) {
                const size_t smem = vmv_xs(true, v->mv.cols) * (size_t)v->m;
                const dim3 grid((unsigned)p.blocks);
                if (p.r == 1)
                    engine_cu_launch(vseq_kernel<MODE, 1, true>, grid, block, smem, st, a,
                                     p.n_groups);
                else
                    engine_cu_launch(vseq_kernel<MODE, 2, true>, grid, block, smem, st, a,
                                     p.n_groups);
                return;
            }
            const dim3 grid((unsigned)(nb * v->m));
            if (p.r == 1)
                engine_cu_launch(vtok_kernel<MODE, 1, true>, grid, block, p.smem, st, a, p.n_groups,
                                 nb);
            else
                engine_cu_launch(vtok_kernel<MODE, 2, true>, grid, block, p.smem, st, a, p.n_groups,
                                 nb);
            return;
        }
    if (seq && p.r > 0) {
        const size_t smem = vmv_xs(MODE != ENGINE_CU_X_F32, v->mv.cols) * (size_t)v->m;
        const dim3 grid((unsigned)p.blocks), block(ENGINE_CU_MV_WARPS * 32);
        if (p.r == 1)
            engine_cu_launch(vseq_kernel<MODE, 1>, grid, block, smem, st, a, p.n_groups);
        else
            engine_cu_launch(vseq_kernel<MODE, 2>, grid, block, smem, st, a, p.n_groups);
        return;
    }
    const dim3 grid((unsigned)(nb * v->m)), block(ENGINE_CU_MV_WARPS * 32);
    if (p.r == 0)
        engine_cu_launch(vtok_kernel<MODE, 0>, grid, block, p.smem, st, a, p.n_groups, nb);
    else if (p.r == 1)
        engine_cu_launch(vtok_kernel<MODE, 1>, grid, block, p.smem, st, a, p.n_groups, nb);
    else
        engine_cu_launch(vtok_kernel<MODE, 2>, grid, block, p.smem, st, a, p.n_groups, nb);
}

static void vtok_run(const engine_cu_vmv *a, bool seq, cudaStream_t stream) {
    if (a->m <= 1) { /* the decode launch itself */
        engine_cu_matvec(&a->mv, stream);
        return;
    }
    engine_cu_vmv part[3];
    vmv_split(a, part);
    if (part[ENGINE_CU_X_F32].mv.n_mat) vtok_launch_mode<ENGINE_CU_X_F32>(&part[0], seq, stream);
    if (part[ENGINE_CU_X_Q8_0].mv.n_mat) vtok_launch_mode<ENGINE_CU_X_Q8_0>(&part[1], seq, stream);
    if (part[ENGINE_CU_X_Q8_K].mv.n_mat) vtok_launch_mode<ENGINE_CU_X_Q8_K>(&part[2], seq, stream);
}

void engine_cu_vmatvec_tok(const engine_cu_vmv *a, cudaStream_t stream) {
    vtok_run(a, false, stream);
}

void engine_cu_vmatvec_seq(const engine_cu_vmv *a, cudaStream_t stream) {
    vtok_run(a, true, stream);
}

/* ---------------------------------------------------------------------------------------------
 * MoE over m tokens
 * ------------------------------------------------------------------------------------------- */
/* Rows r and r + FFN_WARPS of the gate and up products of expert e (slot j) against the staged
 * x in sm, into h (one token's [k][rows]); lane 0 stores. */
template <int MODE>
__device__ __forceinline__ void vup_rows(const engine_cu_ffn_up_args &a, int e, int j, int r,
                                         const uint8_t *sm, float *h) {
    const size_t off = (size_t)e * a.expert_bytes + (size_t)r * a.row_bytes;
    const uint8_t *gr = a.gate + off, *ur = a.up + off;
    const bool two = r + FFN_WARPS < a.rows;
    const size_t stride = two ? (size_t)FFN_WARPS * a.row_bytes : 0;
    const engine_cu_xv xv = engine_cu_xv_at(sm, a.cols, MODE != ENGINE_CU_X_F32, 0);
    float hv[2] = {0.0f, 0.0f};
    switch (a.type) {
#define VUP_CASE(T)                                                                                \
    case T:                                                                                        \
        if (MODE == engine_cu_x_mode(T)) up_rows<T>(gr, ur, stride, a.cols >> 5, xv, hv);          \
        break;
        ENGINE_CU_QUANT_CASES(VUP_CASE)
#undef VUP_CASE
#define VUP_CASE(T)                                                                                \
    case T:                                                                                        \
        if (MODE == ENGINE_CU_X_F32) up_rows<T>(gr, ur, stride, a.cols >> 5, xv, hv);              \
        break;
        ENGINE_CU_FLOAT_CASES(VUP_CASE)
#undef VUP_CASE
    }
    if ((threadIdx.x & 31) == 0) {
        h += (size_t)j * a.rows;
        h[r] = hv[0];
        if (two) h[r + FFN_WARPS] = hv[1];
    }
}

/* Row r of the down product of one token (its ids, weights and staged h). */
template <int MODE>
__device__ __forceinline__ float vdown_row(const engine_cu_ffn_down_args &a, int r, const int *ids,
                                           const float *wts, const uint8_t *sm) {
    float s = 0.0f;
    switch (a.type) {
#define VDOWN_CASE(T)                                                                              \
    case T:                                                                                        \
        if (MODE == engine_cu_x_mode(T)) s = down_row<T>(a, r, ids, wts, sm, true);                \
        break;
        ENGINE_CU_QUANT_CASES(VDOWN_CASE)
#undef VDOWN_CASE
#define VDOWN_CASE(T)                                                                              \
    case T:                                                                                        \
        if (MODE == ENGINE_CU_X_F32) s = down_row<T>(a, r, ids, wts, sm, false);                   \
        break;
        ENGINE_CU_FLOAT_CASES(VDOWN_CASE)
#undef VDOWN_CASE
    }
    return s;
}

/* The MoE kernels' per-row work (moe_dev.cuh: route, up_rows, down_row) with the token as a
 * grid dimension; the same staging and products as the per-token launches. */
template <int MODE>
__global__ void __launch_bounds__(FFN_WARPS * 32, 3)
    vup_kernel(engine_cu_ffn_up_args a, size_t rs, size_t xs, size_t hs, size_t is) {
    extern __shared__ uint4 vup_smem[];
    __shared__ int ids[ENGINE_CU_MAX_EXPERT_USED];
    __shared__ float wts[ENGINE_CU_MAX_EXPERT_USED];
    engine_cu_pdl_launch();
    uint8_t *sm = (uint8_t *)vup_smem;
    const size_t t = blockIdx.z;
    const int j = blockIdx.y, w = threadIdx.x >> 5;
    const float *router = a.router ? a.router + t * rs : nullptr;
    const int r0 = blockIdx.x * 2 * FFN_WARPS, nr = min(2 * FFN_WARPS, a.rows - r0);
    /* the block's gate and up rows (two runs of an expert) asked of L2: dense before the wait,
     * routed as soon as warp 0 has routed, while the others stage x */
    if (!router && w == 0) {
        engine_cu_prefetch_l2(a.gate + (size_t)r0 * a.row_bytes, (size_t)nr * a.row_bytes);
        engine_cu_prefetch_l2(a.up + (size_t)r0 * a.row_bytes, (size_t)nr * a.row_bytes);
    }
    engine_cu_pdl_wait();
    if (router) {
        if (w == 0) {
            route(router, a.n_expert, a.k, a.norm_topk, ids, wts);
            const size_t off = (size_t)ids[j] * a.expert_bytes + (size_t)r0 * a.row_bytes;
            engine_cu_prefetch_l2(a.gate + off, (size_t)nr * a.row_bytes);
            engine_cu_prefetch_l2(a.up + off, (size_t)nr * a.row_bytes);
        }
    } else if (threadIdx.x == 0) {
        ids[0] = 0;
    }
    /* warp 0 routes meanwhile; the staging ends with a barrier */
    engine_cu_stage_x<MODE>(a.x + t * xs, a.cols, a.norm_w, a.eps, sm, router ? 1 : 0);
    if (router && blockIdx.x == 0 && j == 0 && threadIdx.x < a.k) {
        a.ids[t * is + threadIdx.x] = ids[threadIdx.x];
        a.weights[t * is + threadIdx.x] = wts[threadIdx.x];
    }
    const int r = r0 + w;
    if (r >= a.rows) return;
    vup_rows<MODE>(a, ids[j], j, r, sm, a.h + t * hs);
}

template <int MODE>
__global__ void __launch_bounds__(FFN_WARPS * 32, 3)
    vdown_kernel(engine_cu_ffn_down_args a, size_t hs, size_t is, size_t ys) {
    extern __shared__ uint4 vdown_smem[];
    __shared__ int ids[ENGINE_CU_MAX_EXPERT_USED];
    __shared__ float wts[ENGINE_CU_MAX_EXPERT_USED];
    engine_cu_pdl_launch();
    uint8_t *sm = (uint8_t *)vdown_smem;
    const size_t t = blockIdx.y;
    engine_cu_pdl_wait();
    if (threadIdx.x < a.k) {
        ids[threadIdx.x] = a.ids ? a.ids[t * is + threadIdx.x] : 0;
        wts[threadIdx.x] = a.ids ? a.weights[t * is + threadIdx.x] : 1.0f;
    }
    __syncthreads();
    const int r = blockIdx.x * FFN_WARPS + (threadIdx.x >> 5);
    if (r < a.rows) /* the warp's rows of the k experts, asked of L2 while the block stages h */
        for (int j = 0; j < a.k; j++)
            engine_cu_prefetch_l2(a.down + (size_t)ids[j] * a.expert_bytes +
                                      (size_t)r * a.row_bytes,
                                  a.row_bytes);
    engine_cu_stage_x<MODE>(a.h + t * hs, a.k * a.cols, nullptr, 0.0f, sm); /* ends in a barrier */
    if (r >= a.rows) return;
    const float s = vdown_row<MODE>(a, r, ids, wts, sm);
    if ((threadIdx.x & 31) == 0) a.y[t * ys + r] += s;
}

void engine_cu_vffn_up(const engine_cu_ffn_up_args *a, int m, size_t router_stride,
                       size_t x_stride, size_t h_stride, size_t id_stride, cudaStream_t stream) {
    const dim3 grid((a->rows + 2 * FFN_WARPS - 1) / (2 * FFN_WARPS), a->router ? a->k : 1, m);
    const int mode = engine_cu_x_mode(a->type);
    const size_t smem = engine_cu_xs_bytes(engine_cu_type_quant(a->type), a->cols);
    engine_cu_launch(mode == ENGINE_CU_X_Q8_K   ? vup_kernel<ENGINE_CU_X_Q8_K>
                     : mode == ENGINE_CU_X_Q8_0 ? vup_kernel<ENGINE_CU_X_Q8_0>
                                                : vup_kernel<ENGINE_CU_X_F32>,
                     grid, dim3(FFN_WARPS * 32), smem, stream, *a, router_stride, x_stride,
                     h_stride, id_stride);
}

void engine_cu_vffn_down(const engine_cu_ffn_down_args *a, int m, size_t h_stride,
                         size_t id_stride, size_t y_stride, cudaStream_t stream) {
    const int mode = engine_cu_x_mode(a->type);
    const size_t smem = engine_cu_xs_bytes(engine_cu_type_quant(a->type), a->k * a->cols);
    engine_cu_launch(mode == ENGINE_CU_X_Q8_K   ? vdown_kernel<ENGINE_CU_X_Q8_K>
                     : mode == ENGINE_CU_X_Q8_0 ? vdown_kernel<ENGINE_CU_X_Q8_0>
                                                : vdown_kernel<ENGINE_CU_X_F32>,
                     dim3((a->rows + FFN_WARPS - 1) / FFN_WARPS, m), dim3(FFN_WARPS * 32), smem,
                     stream, *a, h_stride, id_stride, y_stride);
}

/* The same work with one block serving all m tokens (SPARK_CUDA_MTP_FUSED=moe): the grid of
 * the decode step's launch, so more tokens do not add waves of blocks that each wait, route and
 * stage again. Up: block (row group, slot j); warp t < m routes token t while the others
 * stage, then the block stages the other tokens' x, and warp w computes rows w and w +
 * FFN_WARPS of token t's expert in slot j for every t; with has_b, the slots past a's are the
 * dense FFN b (the shared expert) on the same staged x. Down: block (8 rows); the m tokens'
 * ids, weights (the shared expert's slot from sigmoid(sh_logit[t * ls]) when set) and h staged,
 * warp w computes row w for every t. Per (token, row) the calls of vup_kernel / vdown_kernel on
 * the same staged operands (and vshgate's expression): bit for bit. */
template <int MODE>
__global__ void __launch_bounds__(FFN_WARPS * 32, 3)
    vup_all_kernel(engine_cu_ffn_up_args a, engine_cu_ffn_up_args b, int has_b, int m, size_t rs,
                   size_t xs, size_t hs, size_t is) {
    extern __shared__ uint4 vupa_smem[];
    __shared__ int ids[ENGINE_CU_VMAX][ENGINE_CU_MAX_EXPERT_USED];
    __shared__ float wts[ENGINE_CU_VMAX][ENGINE_CU_MAX_EXPERT_USED];
    engine_cu_pdl_launch();
    uint8_t *sm = (uint8_t *)vupa_smem;
    const int na = a.router ? a.k : 1, w = threadIdx.x >> 5;
    const bool on_b = has_b && (int)blockIdx.y >= na, routed = a.router && !on_b;
    const int j = on_b ? 0 : blockIdx.y;
    const uint8_t *gate = on_b ? b.gate : a.gate, *up = on_b ? b.up : a.up;
    const size_t row_bytes = on_b ? b.row_bytes : a.row_bytes;
    const int rows = on_b ? b.rows : a.rows;
    const int r0 = blockIdx.x * 2 * FFN_WARPS;
    if (r0 >= rows) return; /* the whole block (the grid covers the larger of a and b) */
    const int nr = min(2 * FFN_WARPS, rows - r0);
    const size_t xsz = vmv_xs(MODE != ENGINE_CU_X_F32, a.cols);
    if (!routed && w == 0) {
        engine_cu_prefetch_l2(gate + (size_t)r0 * row_bytes, (size_t)nr * row_bytes);
        engine_cu_prefetch_l2(up + (size_t)r0 * row_bytes, (size_t)nr * row_bytes);
    }
    engine_cu_pdl_wait();
    if (m > 1 && !routed) v_prefetch_l1(a.x, xs, a.cols, m);
    if (routed) {
        if (w < m) {
            route(a.router + (size_t)w * rs, a.n_expert, a.k, a.norm_topk, ids[w], wts[w]);
            const size_t off = (size_t)ids[w][j] * a.expert_bytes + (size_t)r0 * a.row_bytes;
            engine_cu_prefetch_l2(a.gate + off, (size_t)nr * a.row_bytes);
            engine_cu_prefetch_l2(a.up + off, (size_t)nr * a.row_bytes);
        }
    } else if ((int)threadIdx.x < m) {
        ids[threadIdx.x][0] = 0;
    }
    /* the routing warps join from the second token's staging on (each ends in a barrier) */
    if (m > 1 && routed && w >= m) v_prefetch_l1(a.x, xs, a.cols, m, m);
    for (int t = 0; t < m; t++)
        engine_cu_stage_x<MODE>(a.x + (size_t)t * xs, a.cols, a.norm_w, a.eps, sm + t * xsz,
                                routed && t == 0 ? m : 0);
    if (routed && blockIdx.x == 0 && j == 0)
        for (int i = threadIdx.x; i < m * a.k; i += blockDim.x) {
            const int t = i / a.k, jj = i - t * a.k;
            a.ids[(size_t)t * is + jj] = ids[t][jj];
            a.weights[(size_t)t * is + jj] = wts[t][jj];
        }
    const int r = r0 + w;
    if (r >= rows) return;
    for (int t = 0; t < m; t++) /* two call sites: no local copy of a parameter struct */
        if (on_b)
            vup_rows<MODE>(b, 0, 0, r, sm + t * xsz, b.h + t * hs);
        else
            vup_rows<MODE>(a, ids[t][j], j, r, sm + t * xsz, a.h + t * hs);
}

template <int MODE>
__global__ void __launch_bounds__(FFN_WARPS * 32, 3)
    vdown_all_kernel(engine_cu_ffn_down_args a, int m, size_t hs, size_t is, size_t ys,
                     size_t ls) {
    extern __shared__ uint4 vdowna_smem[];
    __shared__ int ids[ENGINE_CU_VMAX][ENGINE_CU_MAX_EXPERT_USED];
    __shared__ float wts[ENGINE_CU_VMAX][ENGINE_CU_MAX_EXPERT_USED];
    engine_cu_pdl_launch();
    uint8_t *sm = (uint8_t *)vdowna_smem;
    const size_t xsz = vmv_xs(MODE != ENGINE_CU_X_F32, a.k * a.cols);
    engine_cu_pdl_wait();
    if (m > 1) v_prefetch_l1(a.h, hs, a.k * a.cols, m);
    for (int i = threadIdx.x; i < m * a.k; i += blockDim.x) {
        const int t = i / a.k, j = i - t * a.k;
        int id = a.ids ? a.ids[(size_t)t * is + j] : 0;
        float wt = a.ids ? a.weights[(size_t)t * is + j] : 1.0f;
        if (a.sh_logit && j == a.k - 1) { /* as vshgate_kernel */
            id = a.sh_id;
            wt = 1.0f / (1.0f + expf(-a.sh_logit[(size_t)t * ls]));
        }
        ids[t][j] = id;
        wts[t][j] = wt;
    }
    __syncthreads();
    const int r = blockIdx.x * FFN_WARPS + (threadIdx.x >> 5);
    if (r < a.rows) /* the warp's rows of every token's experts, asked of L2 during the staging */
        for (int i = 0; i < m * a.k; i++)
            engine_cu_prefetch_l2(a.down + (size_t)ids[i / a.k][i % a.k] * a.expert_bytes +
                                      (size_t)r * a.row_bytes,
                                  a.row_bytes);
    for (int t = 0; t < m; t++) /* each ends in a barrier */
        engine_cu_stage_x<MODE>(a.h + (size_t)t * hs, a.k * a.cols, nullptr, 0.0f, sm + t * xsz);
    if (r >= a.rows) return;
    for (int t = 0; t < m; t++) {
        const float s = vdown_row<MODE>(a, r, ids[t], wts[t], sm + t * xsz);
        if ((threadIdx.x & 31) == 0) a.y[t * ys + r] += s;
    }
}

size_t engine_cu_vffn_all_smem(int type, int cols, int m) {
    return vmv_xs(engine_cu_type_quant(type), cols) * (size_t)m;
}

void engine_cu_vffn_up_all(const engine_cu_ffn_up_args *a, const engine_cu_ffn_up_args *b,
                           int m, size_t router_stride, size_t x_stride, size_t h_stride,
                           size_t id_stride, cudaStream_t stream) {
    const int na = a->router ? a->k : 1;
    const int rows = b && b->rows > a->rows ? b->rows : a->rows;
    const dim3 grid((rows + 2 * FFN_WARPS - 1) / (2 * FFN_WARPS), na + (b ? 1 : 0));
    const int mode = engine_cu_x_mode(a->type);
    const size_t smem = engine_cu_vffn_all_smem(a->type, a->cols, m);
    engine_cu_ffn_up_args bb;
    if (b)
        bb = *b;
    else
        memset(&bb, 0, sizeof bb);
    engine_cu_launch(mode == ENGINE_CU_X_Q8_K   ? vup_all_kernel<ENGINE_CU_X_Q8_K>
                     : mode == ENGINE_CU_X_Q8_0 ? vup_all_kernel<ENGINE_CU_X_Q8_0>
                                                : vup_all_kernel<ENGINE_CU_X_F32>,
                     grid, dim3(FFN_WARPS * 32), smem, stream, *a, bb, b ? 1 : 0, m,
                     router_stride, x_stride, h_stride, id_stride);
}

void engine_cu_vffn_down_all(const engine_cu_ffn_down_args *a, int m, size_t h_stride,
                             size_t id_stride, size_t y_stride, size_t logit_stride,
                             cudaStream_t stream) {
    const int mode = engine_cu_x_mode(a->type);
    const size_t smem = engine_cu_vffn_all_smem(a->type, a->k * a->cols, m);
    engine_cu_launch(mode == ENGINE_CU_X_Q8_K   ? vdown_all_kernel<ENGINE_CU_X_Q8_K>
                     : mode == ENGINE_CU_X_Q8_0 ? vdown_all_kernel<ENGINE_CU_X_Q8_0>
                                                : vdown_all_kernel<ENGINE_CU_X_F32>,
                     dim3((a->rows + FFN_WARPS - 1) / FFN_WARPS), dim3(FFN_WARPS * 32), smem,
                     stream, *a, m, h_stride, id_stride, y_stride, logit_stride);
}

__global__ void vshgate_kernel(const float *logit, float *w, int32_t *id, size_t stride,
                               int32_t id_value, int m) {
    engine_cu_pdl_launch();
    engine_cu_pdl_wait();
    const int t = threadIdx.x;
    if (t < m) { /* as deltanet.cu's shgate */
        w[(size_t)t * stride] = 1.0f / (1.0f + expf(-logit[t]));
        id[(size_t)t * stride] = id_value;
    }
}

void engine_cu_vshgate(const float *logit, float *w, int32_t *id, size_t stride, int32_t id_value,
                       int m, cudaStream_t stream) {
    engine_cu_launch(vshgate_kernel, dim3(1), dim3(32), 0, stream, logit, w, id, stride, id_value,
                     m);
}

/* ---------------------------------------------------------------------------------------------
 * Norms, argmax
 * ------------------------------------------------------------------------------------------- */
__device__ __forceinline__ void vnorm_row(const float *x, const float *w, float eps, int n,
                                          float *out, float *red) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        ss += x[i] * x[i];
    ss = engine_cu_block_sum(ss, red);
    const float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        out[i] = w[i] * (x[i] * scale);
}

__global__ void vrmsnorm_kernel(const float *x, size_t xs, const float *w, float eps, int n,
                                float *out, size_t os) {
    __shared__ float red[32];
    engine_cu_pdl_launch();
    engine_cu_pdl_wait();
    const size_t t = blockIdx.x;
    vnorm_row(x + t * xs, w, eps, n, out + t * os, red);
}

void engine_cu_vrmsnorm(const float *x, size_t x_stride, const float *w, float eps, int n, int m,
                        float *out, size_t out_stride, cudaStream_t stream) {
    engine_cu_launch(vrmsnorm_kernel, dim3(m), dim3(256), 0, stream, x, x_stride, w, eps, n, out,
                     out_stride);
}

__global__ void vcat_kernel(const float *e, const float *h, const float *we, const float *wh,
                            float eps, int n, float *out) {
    __shared__ float red[32];
    engine_cu_pdl_launch();
    engine_cu_pdl_wait();
    const size_t t = blockIdx.x;
    if (blockIdx.y == 0)
        vnorm_row(e + t * n, we, eps, n, out + t * 2 * n, red);
    else
        vnorm_row(h + t * n, wh, eps, n, out + t * 2 * n + n, red);
}

void engine_cu_vcat_norm(const float *e, const float *h, const float *we, const float *wh,
                         float eps, int n, int m, float *out, cudaStream_t stream) {
    engine_cu_launch(vcat_kernel, dim3(m, 2), dim3(256), 0, stream, e, h, we, wh, eps, n, out);
}

template <int HD> __global__ void __launch_bounds__(256) vkv_kernel(engine_cu_vkv a) {
    __shared__ float buf[8][HD];
    engine_cu_pdl_launch();
    engine_cu_pdl_wait();
    const int wi = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j = (int)blockIdx.x * 8 + wi;
    if (j >= a.m * a.n_kv) return;
    const int t = j / a.n_kv, g = j - t * a.n_kv, half = a.rot / 2;
    const int32_t pos = a.pos[(size_t)t * a.pos_stride];
    if (t + 1 < a.m && a.pos[(size_t)(t + 1) * a.pos_stride] == pos) return;
    const size_t src = (size_t)t * a.kv_stride + (size_t)g * HD;
    engine_cu_gatt_norm_rope<HD>(a.k + src, a.k_norm, a.eps, a.rope + (size_t)pos * half, half,
                                 buf[wi]);
    engine_cu_gatt_store_kv<HD>(buf[wi], a.v, src, a.k_cache, a.v_cache, a.kv_f32,
                                (size_t)pos * a.n_kv * HD + (size_t)g * HD, lane);
}

void engine_cu_vkv_store(const engine_cu_vkv *a, cudaStream_t stream) {
    const dim3 grid((unsigned)((a->m * a->n_kv + 7) / 8));
    if (a->m * a->n_kv <= 0) return;
    if (a->hd == 64)
        engine_cu_launch(vkv_kernel<64>, grid, dim3(256), 0, stream, *a);
    else if (a->hd == 128)
        engine_cu_launch(vkv_kernel<128>, grid, dim3(256), 0, stream, *a);
    else
        engine_cu_launch(vkv_kernel<256>, grid, dim3(256), 0, stream, *a);
}

__device__ __forceinline__ void vbest(float &bv, int &bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

__device__ __forceinline__ void vbest_block(float &bv, int &bi) {
    __shared__ float sv[32];
    __shared__ int si[32];
    for (int o = 16; o > 0; o >>= 1)
        vbest(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) {
        sv[w] = bv;
        si[w] = bi;
    }
    __syncthreads();
    if (w == 0) {
        bv = lane < (int)(blockDim.x >> 5) ? sv[lane] : -INFINITY;
        bi = lane < (int)(blockDim.x >> 5) ? si[lane] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1)
            vbest(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o),
                  __shfl_xor_sync(0xffffffffu, bi, o));
    }
}

__global__ void vargmax_part(const float *logits, int n, float *scratch) {
    engine_cu_pdl_launch();
    engine_cu_pdl_wait();
    const size_t t = blockIdx.y;
    const float *l = logits + t * n;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        vbest(bv, bi, l[i], i);
    vbest_block(bv, bi);
    if (threadIdx.x == 0) {
        scratch[2 * (t * gridDim.x + blockIdx.x)] = bv;
        scratch[2 * (t * gridDim.x + blockIdx.x) + 1] = __int_as_float(bi);
    }
}

__global__ void vargmax_final(const float *scratch, int nb, int32_t *y) {
    engine_cu_pdl_launch();
    engine_cu_pdl_wait();
    const size_t t = blockIdx.x;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int b = threadIdx.x; b < nb; b += blockDim.x)
        vbest(bv, bi, scratch[2 * (t * nb + b)], __float_as_int(scratch[2 * (t * nb + b) + 1]));
    vbest_block(bv, bi);
    if (threadIdx.x == 0) y[t] = bi == 0x7fffffff ? 0 : bi; /* all NaN: token 0 */
}

void engine_cu_vargmax(const float *logits, int n, int m, float *scratch, int32_t *y,
                       cudaStream_t stream) {
    engine_cu_launch(vargmax_part, dim3(ENGINE_CU_VARGMAX_BLOCKS, m), dim3(256), 0, stream, logits,
                     n, scratch);
    engine_cu_launch(vargmax_final, dim3(m), dim3(64), 0, stream, (const float *)scratch,
                     (int)ENGINE_CU_VARGMAX_BLOCKS, y);
}

/* ---------------------------------------------------------------------------------------------
 * The greedy speculative loop's device steps
 * ------------------------------------------------------------------------------------------- */
__global__ void spec_prep_kernel(engine_cu_spec_ctl *ctl, engine_cu_step *vstep,
                                 engine_cu_step *dstep, const int32_t *drafts, int m,
                                 int with_drafts) {
    engine_cu_pdl_launch();
    engine_cu_pdl_wait();
    if (threadIdx.x != 0) return;
    const int32_t p0 = ctl->p0;
    for (int t = 0; t < m && !with_drafts; t++) {
        vstep[t].pos = p0 + t;
        ctl->mpos[t] = p0 - 1 + t > 0 ? p0 - 1 + t : 0;
    }
    if (with_drafts) { /* the positions are the step's first prep's (p0 unchanged since) */
        for (int i = 0; i + 1 < m; i++)
            vstep[1 + i].token = drafts[i];
    } else {
        dstep->token = vstep[0].token;
        dstep->pos = p0 - 1;
        dstep->n_out = 0;
        dstep->out_cap = ENGINE_CU_VMAX;
        dstep->temp = 0.0f;
    }
}

void engine_cu_spec_prep(engine_cu_spec_ctl *ctl, engine_cu_step *vstep, engine_cu_step *dstep,
                         const int32_t *drafts, int m, bool with_drafts, bool serial,
                         cudaStream_t stream) {
    if (serial)
        spec_prep_kernel<<<1, 32, 0, stream>>>(ctl, vstep, dstep, drafts, m, (int)with_drafts);
    else
        engine_cu_launch(spec_prep_kernel, dim3(1), dim3(32), 0, stream, ctl, vstep, dstep,
                         drafts, m, (int)with_drafts);
}

__global__ void spec_accept_kernel(engine_cu_spec_ctl *ctl, const int32_t *y,
                                   const int32_t *drafts, float *hbuf, int n,
                                   engine_cu_step *vstep) {
    __shared__ int sj;
    engine_cu_pdl_launch();
    engine_cu_pdl_wait();
    if (threadIdx.x == 0) {
        const int k = ctl->k;
        int j = 0;
        while (j < k && drafts[j] == y[j]) {
            ctl->emit[j] = drafts[j];
            j++;
        }
        ctl->emit[j] = y[j];
        ctl->j = j;
        ctl->n_emit = j + 1;
        vstep[0].token = y[j];
        ctl->p0 += j + 1;
        sj = j;
    }
    __syncthreads();
    const float *src = hbuf + (size_t)(sj + 1) * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        hbuf[i] = src[i];
}

void engine_cu_spec_accept(engine_cu_spec_ctl *ctl, const int32_t *y, const int32_t *drafts,
                           float *hbuf, int n_embd, engine_cu_step *vstep, cudaStream_t stream) {
    engine_cu_launch(spec_accept_kernel, dim3(1), dim3(256), 0, stream, ctl, y, drafts, hbuf,
                     n_embd, vstep);
}

__global__ void spec_restore_kernel(const engine_cu_spec_ctl *ctl, const float4 *src0,
                                    size_t stride4, float4 *dst, size_t n4) {
    engine_cu_pdl_launch();
    engine_cu_pdl_wait();
    if (ctl->j >= ctl->k) return;
    const float4 *src = src0 + (size_t)(ctl->p0 % ENGINE_CU_VMAX) * stride4;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

void engine_cu_spec_restore(const engine_cu_spec_ctl *ctl, const float *src_slot0,
                            size_t slot_stride, float *dst, size_t n, cudaStream_t stream) {
    engine_cu_launch(spec_restore_kernel, dim3(264), dim3(256), 0, stream, ctl,
                     (const float4 *)src_slot0, slot_stride / 4, (float4 *)dst, n / 4);
}

ENGINE_CU_TRACE_TU(q35_verify)
