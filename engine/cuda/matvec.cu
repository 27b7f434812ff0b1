/* Quantised matrix-vector products (contract in matvec.cuh). */
#include "matvec.cuh"
#include "qdot.cuh"

bool engine_cu_type_supported(int type) {
    switch (type) {
    case ENGINE_TYPE_F32:
    case ENGINE_TYPE_F16:
    case ENGINE_TYPE_BF16:
    case ENGINE_TYPE_Q4_0:
    case ENGINE_TYPE_Q8_0:
    case ENGINE_TYPE_Q4_K:
    case ENGINE_TYPE_Q5_K:
    case ENGINE_TYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

/* The lane's partial dot products of R rows (row0, row0 + stride, ...) with the staged x over
 * chunks c0, c0 + step, ... (the R rows' loads are in flight together). */
template <int T, int R>
__device__ __forceinline__ void mv_rows(const uint8_t *row0, size_t stride, int c0, int step,
                                        int n_chunks, const engine_cu_xv &xv, float acc[R]) {
#pragma unroll
    for (int i = 0; i < R; i++)
        acc[i] = 0.0f;
#pragma unroll(R == 1 ? 2 : 1)
    for (int c = c0; c < n_chunks; c += step)
#pragma unroll
        for (int i = 0; i < R; i++)
            acc[i] += engine_cu_dot_chunk<T>(row0 + i * stride, c, xv);
}

/* Row groups: matrix i owns groups [start_i, start_i + n_i), of `per` rows each. */
__device__ __forceinline__ int mv_find(const engine_cu_mv &a, int g, int per, int *first) {
    int start = 0;
    for (int i = 0; i < a.n_mat; i++) {
        const int n = (a.m[i].rows + per - 1) / per;
        if (g < start + n) {
            *first = start;
            return i;
        }
        start += n;
    }
    *first = start;
    return -1;
}

/* MODE: the activation staging (qdot.cuh) of the weight types this instance handles.
 * R > 0: a group is 8 * R rows, warp w computing rows w, w + 8, ... of it (R at once).
 * R == 0 (split-K, for matrices of few rows): a group is one row, warp w taking chunks
 * w, w + 8, ... and the block summing the warps' parts. */
template <int MODE, int R>
__global__ void __launch_bounds__(ENGINE_CU_MV_WARPS * 32, 3)
    mv_kernel(engine_cu_mv a, int n_groups) {
    constexpr int NR = R > 0 ? R : 1, PER = R > 0 ? ENGINE_CU_MV_WARPS * R : 1;
    extern __shared__ uint4 mv_smem[];
    __shared__ float part[ENGINE_CU_MV_WARPS];
    uint8_t *sm = (uint8_t *)mv_smem;
    engine_cu_pdl_launch();
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int first;
    /* a block's groups all lie in one matrix: several matrices get one group per block */
    const int mi = mv_find(a, blockIdx.x, PER, &first);
    if (mi < 0) return; /* never: the grid has at most n_groups blocks */
    const uint8_t *mw = a.m[mi].w;
    const size_t rb = a.m[mi].row_bytes;
    const int rows = a.m[mi].rows, type = a.m[mi].type, accumulate = a.m[mi].accumulate;
    float *y = a.m[mi].y;
    uint32_t tv[NR][2]; /* touched bytes (a.touch), consumed at the end */
    /* the first group's weights: fetched while the previous kernel finishes */
    {
        const int r0 = (blockIdx.x - first) * PER;
#pragma unroll
        for (int i = 0; i < NR; i++) {
            const uint8_t *p = nullptr;
            size_t n = 0;
            if (R == 0) {
                const size_t part_b = (rb + ENGINE_CU_MV_WARPS - 1) / ENGINE_CU_MV_WARPS;
                if (w * part_b < rb) {
                    p = mw + (size_t)r0 * rb + w * part_b;
                    n = min(part_b, rb - w * part_b);
                }
            } else if (r0 + w + 8 * i < rows) {
                p = mw + (size_t)(r0 + w + 8 * i) * rb;
                n = rb;
            }
            tv[i][0] = tv[i][1] = 0;
            if (p && a.touch && MODE != ENGINE_CU_X_F32) /* F32: registers are short */
                engine_cu_touch<2>(p, n, tv[i]);
            else if (p)
                engine_cu_prefetch_l2(p, n);
        }
    }
    if (a.norm_w && w == ENGINE_CU_MV_WARPS - 1) /* read by every block: L2 */
        engine_cu_prefetch_l2((const uint8_t *)a.norm_w, sizeof(float) * (size_t)a.cols);
    engine_cu_pdl_wait();
    engine_cu_stage_x<MODE>(a.x, a.cols, a.norm_w, a.eps, sm);
    const engine_cu_xv xv = engine_cu_xv_at(sm, a.cols, MODE != ENGINE_CU_X_F32, 0);
    const int n_chunks = a.cols >> 5;
    const int end = a.n_mat == 1 ? n_groups : blockIdx.x + 1;
    for (int g = blockIdx.x; g < end; g += gridDim.x) {
        const int r0 = (g - first) * PER + (R > 0 ? w : 0);
        float acc[NR];
        if (R > 0 && r0 >= rows) continue; /* no barrier below when R > 0 */
        /* rows past the end compute on the last row and are not stored */
        const uint8_t *row = mw + (size_t)r0 * rb;
        const size_t stride = (size_t)8 * rb;
        const int c0 = R > 0 ? lane : 32 * w + lane, step = R > 0 ? 32 : 32 * ENGINE_CU_MV_WARPS;
        switch (type) {
#define MV_CASE(T)                                                                                 \
    case T:                                                                                        \
        if (MODE == engine_cu_x_mode(T))                                                           \
            mv_rows<T, NR>(row, r0 + 8 * (NR - 1) < rows ? stride : 0, c0, step, n_chunks, xv,     \
                           acc);                                                                   \
        break;
            ENGINE_CU_QUANT_CASES(MV_CASE)
#undef MV_CASE
#define MV_CASE(T)                                                                                 \
    case T:                                                                                        \
        if (MODE == ENGINE_CU_X_F32)                                                               \
            mv_rows<T, NR>(row, r0 + 8 * (NR - 1) < rows ? stride : 0, c0, step, n_chunks, xv,     \
                           acc);                                                                   \
        break;
            ENGINE_CU_FLOAT_CASES(MV_CASE)
#undef MV_CASE
        default:
            for (int i = 0; i < NR; i++)
                acc[i] = 0.0f;
        }
        if (R > 0) {
#pragma unroll
            for (int i = 0; i < NR; i++) {
                const float s = engine_cu_warp_sum(acc[i]);
                const int r = r0 + 8 * i;
                if (lane == 0 && r < rows) y[r] = accumulate ? y[r] + s : s;
            }
        } else {
            const float s = engine_cu_warp_sum(acc[0]);
            if (lane == 0) part[w] = s;
            __syncthreads();
            if (threadIdx.x == 0) {
                float t = 0.0f;
                for (int k = 0; k < ENGINE_CU_MV_WARPS; k++)
                    t += part[k];
                y[r0] = accumulate ? y[r0] + t : t;
            }
            __syncthreads();
        }
    }
    uint32_t sum = 0;
#pragma unroll
    for (int i = 0; i < NR; i++)
        sum += tv[i][0] + tv[i][1];
    engine_cu_sink(sum, y);
}

template <int MODE> static void mv_launch_mode(const engine_cu_mv *a, cudaStream_t stream) {
    const size_t smem = engine_cu_xs_bytes(MODE != ENGINE_CU_X_F32, a->cols);
    const int threads = ENGINE_CU_MV_WARPS * 32;
    int dev = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mv_kernel<MODE, 1>, threads, smem) !=
            cudaSuccess ||
        sms < 1 || per_sm < 1)
        sms = per_sm = 1; /* the error stays for the caller's cudaGetLastError */
    const int slots = sms * per_sm;
    int rows = 0, g1 = 0, g2 = 0;
    for (int i = 0; i < a->n_mat; i++) {
        rows += a->m[i].rows;
        g1 += (a->m[i].rows + ENGINE_CU_MV_WARPS - 1) / ENGINE_CU_MV_WARPS;
        g2 += (a->m[i].rows + 2 * ENGINE_CU_MV_WARPS - 1) / (2 * ENGINE_CU_MV_WARPS);
    }
    /* Few rows (the router): a block per row, its warps splitting the row. Else a warp per
     * row, two rows per warp when one per warp would not fit in one wave; a single matrix
     * larger than that (the output head) is looped over by one wave of blocks. */
    if (a->n_mat == 1 && g1 < sms && a->cols >= 32 * 32 * 2) {
        engine_cu_launch(mv_kernel<MODE, 0>, dim3(rows), dim3(threads), smem, stream, *a, rows);
    } else if (g1 <= slots) {
        engine_cu_launch(mv_kernel<MODE, 1>, dim3(g1), dim3(threads), smem, stream, *a, g1);
    } else {
        int per2 = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per2, mv_kernel<MODE, 2>, threads,
                                                          smem) != cudaSuccess ||
            per2 < 1)
            per2 = 1;
        const int blocks = a->n_mat == 1 && g2 > sms * per2 ? sms * per2 : g2;
        engine_cu_launch(mv_kernel<MODE, 2>, dim3(blocks), dim3(threads), smem, stream, *a, g2);
    }
}

void engine_cu_matvec(const engine_cu_mv *a, cudaStream_t stream) {
    /* one launch per staging mode present (one launch in practice: q, k, v share a mode) */
    engine_cu_mv part[3];
    for (int k = 0; k < 3; k++) {
        part[k] = *a;
        part[k].n_mat = 0;
    }
    for (int i = 0; i < a->n_mat; i++) {
        engine_cu_mv *p = &part[engine_cu_x_mode(a->m[i].type)];
        p->m[p->n_mat++] = a->m[i];
    }
    if (part[ENGINE_CU_X_F32].n_mat) mv_launch_mode<ENGINE_CU_X_F32>(&part[0], stream);
    if (part[ENGINE_CU_X_Q8_0].n_mat) mv_launch_mode<ENGINE_CU_X_Q8_0>(&part[1], stream);
    if (part[ENGINE_CU_X_Q8_K].n_mat) mv_launch_mode<ENGINE_CU_X_Q8_K>(&part[2], stream);
}
