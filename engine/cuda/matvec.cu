/* Quantised matrix-vector products (contract in matvec.cuh). */
#include <stdlib.h>
#include <string.h>

#include "matvec_dev.cuh"
#include "moe_dev.cuh" /* route */
#include "step.cuh"

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

/* TT (engine_cu_mv.spec): the instance of one weight type alone (matvec_dev.cuh mv_group) */
/* TO: the bulk-copy form alone (matvec_dev.cuh mv_block; launched only with a.tma) */
template <int MODE, int R, bool Q6R = false, int TT = 0, bool TO = false>
__global__ void __launch_bounds__(ENGINE_CU_MV_WARPS * 32, 3)
    mv_kernel(engine_cu_mv a, int n_groups) {
    extern __shared__ __align__(128) uint4 mv_smem[];
    engine_cu_pdl_launch();
    mv_block<MODE, R, engine_cu_pdl_sync, Q6R, true, TT, TO>(
        a, n_groups, blockIdx.x, gridDim.x, (uint8_t *)mv_smem, engine_cu_pdl_sync());
}

/* The instance of mv_kernel<MODE, R> for a's one weight type where a.spec asks for it and every
 * matrix is of that type (Q8_0 in its mode, Q4_K in Q8_K's); else the generic one. */
typedef void (*mv_kernel_fn)(engine_cu_mv, int);
template <int MODE, int R> static mv_kernel_fn mv_kernel_for(const engine_cu_mv *a) {
    int t = a->m[0].type;
    for (int i = 1; i < a->n_mat; i++)
        if (a->m[i].type != t) t = -1;
    /* spec 3: the type's instance with every form in its image (session 39 call A's) */
    const bool to = a->spec != 3 && a->tma && !a->coop && !a->nw_late; /* mv_block TO */
    if constexpr (MODE == ENGINE_CU_X_Q8_0)
        if (a->spec && t == ENGINE_TYPE_Q8_0)
            return to ? mv_kernel<MODE, R, false, ENGINE_TYPE_Q8_0, true>
                      : mv_kernel<MODE, R, false, ENGINE_TYPE_Q8_0>;
    if constexpr (MODE == ENGINE_CU_X_Q8_K)
        if (a->spec && t == ENGINE_TYPE_Q4_K)
            return to ? mv_kernel<MODE, R, false, ENGINE_TYPE_Q4_K, true>
                      : mv_kernel<MODE, R, false, ENGINE_TYPE_Q4_K>;
    /* spec 4: the mixed types' generic instance with the bulk-copy form alone as well */
    if (a->spec == 4 && to) return mv_kernel<MODE, R, false, 0, true>;
    return mv_kernel<MODE, R>;
}

/* The repacked head with four rows a warp (engine_cu_mv.q6r_rows): registers for two blocks a
 * multiprocessor, so that a lane has the loads of 8 chunks in flight. */
__global__ void __launch_bounds__(ENGINE_CU_MV_WARPS * 32, 2)
    mv_q6r4_kernel(engine_cu_mv a, int n_groups) {
    extern __shared__ __align__(128) uint4 mv_smem[];
    engine_cu_pdl_launch();
    mv_block<ENGINE_CU_X_Q8_K, 4, engine_cu_pdl_sync, true>(
        a, n_groups, blockIdx.x, gridDim.x, (uint8_t *)mv_smem, engine_cu_pdl_sync());
}

/* The ring form (matvec_dev.cuh mv_block_ring): one block a multiprocessor of NW warps, R rows a
 * tile, nbuf buffers a warp. */
template <int MODE, bool Q6R, int NW, int R>
__global__ void __launch_bounds__(NW * 32, 1) mv_ring_kernel(engine_cu_mv a, int nbuf) {
    extern __shared__ __align__(128) uint4 mv_smem[];
    engine_cu_pdl_launch();
    mv_block_ring<MODE, NW, R, Q6R>(a, nbuf, (uint8_t *)mv_smem, engine_cu_pdl_sync());
}

/* The ring forms' warps a block and rows a tile (engine_cu_mv.ring 1, 2, 3). */
static void mv_ring_shape(int ring, int *nw, int *r) {
    *nw = ring == 1 ? 8 : 16;
    *r = ring == 2 ? 2 : 4;
}

/* Whether a launch is the output head's repacked copy (matvec_dev.cuh mv_group's Q6R instance). */
static bool mv_is_q6r(const engine_cu_mv *a) {
    return a->n_mat == 1 && a->m[0].type == ENGINE_CU_TYPE_Q6_KR;
}

/* The tail of mv_route_kernel below (every thread of the block; a function of its own, so that
 * the routing's registers do not add to the products'): every block counts itself done once
 * its logits are stored (each thread fences its own stores first, then the block meets: the
 * pattern of cooperative groups' grid sync), and the block that counts last reads the complete
 * logits through L2 and routes with moe_dev.cuh's route_block (route's results bit for bit, the
 * top-k by ranks over the whole block instead of k rounds of shuffles), so the ids and weights
 * are those the up kernel's routing warp would compute; it zeroes the counter again. */
static __device__ __noinline__ void mv_route_last(const float *logits, int n, int k, int norm,
                                                  int32_t *out_ids, float *out_wts,
                                                  unsigned *count) {
    __shared__ int ids[ENGINE_CU_MAX_EXPERT_USED];
    __shared__ float wts[ENGINE_CU_MAX_EXPERT_USED], sp[ENGINE_CU_MAX_EXPERT];
    __shared__ unsigned ticket;
    __threadfence(); /* this thread's logits (if any) visible device-wide before the count */
    __syncthreads();
    if (threadIdx.x == 0) ticket = atomicAdd(count, 1u);
    __syncthreads();
    if (ticket != gridDim.x - 1) return; /* the whole block alike */
    __threadfence(); /* every other block's logits are visible: read them through L2 */
    route_block(logits, n, k, norm, ids, wts, sp, true);
    const int t = threadIdx.x;
    if (t < k) {
        out_ids[t] = ids[t];
        out_wts[t] = wts[t];
    }
    if (t == 0) *count = 0u; /* for the next layer's router */
}

/* mv_kernel with the MoE routing at its end (a.route_ids, matvec.cuh). The up kernel reads
 * the ids after its griddepcontrol.wait, which returns only once this whole grid, tail
 * included, is complete and its memory visible. With a.route_late the up kernel is launched
 * only after every block of this one has waited (x final for its early staging). */
template <int MODE, int R>
__global__ void __launch_bounds__(ENGINE_CU_MV_WARPS * 32, 3)
    mv_route_kernel(engine_cu_mv a, int n_groups) {
    extern __shared__ __align__(128) uint4 mv_smem[];
    if (!a.route_late) engine_cu_pdl_launch();
    mv_block<MODE, R>(a, n_groups, blockIdx.x, gridDim.x, (uint8_t *)mv_smem,
                      engine_cu_pdl_late_sync{a.route_late != 0});
    mv_route_last(a.m[0].y, a.route_n, a.route_k, a.route_norm, a.route_ids, a.route_wts,
                  a.route_count);
}

/* How a launch of one staging mode covers its rows: the kernel's rows per warp (R, 0 for
 * split-K), its blocks and row groups. */
typedef engine_cu_mv_plan mv_plan;

template <int MODE> static mv_plan mv_plan_mode(const engine_cu_mv *a) {
    mv_plan p;
    p.smem = engine_cu_xs_bytes(MODE != ENGINE_CU_X_F32, a->cols);
    const int threads = ENGINE_CU_MV_WARPS * 32;
    int dev = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mv_kernel<MODE, 1>, threads,
                                                      p.smem) != cudaSuccess ||
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
    if (MODE == ENGINE_CU_X_Q8_K && mv_is_q6r(a) && a->q6r_rows == 4) {
        int per4 = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per4, mv_q6r4_kernel, threads, p.smem) !=
                cudaSuccess ||
            per4 < 1)
            per4 = 1;
        p.r = 4;
        p.n_groups = (rows + 4 * ENGINE_CU_MV_WARPS - 1) / (4 * ENGINE_CU_MV_WARPS);
        p.blocks = p.n_groups < sms * per4 ? p.n_groups : sms * per4;
    } else if (a->n_mat == 1 && g1 < sms && a->cols >= 32 * 32 * 2 && !mv_is_q6r(a)) {
        p.r = 0;
        p.blocks = p.n_groups = rows;
    } else if (a->max_bps > 0) {
        /* stage 5: at most max_bps blocks per multiprocessor, looping over their groups */
        const int cap = sms * a->max_bps;
        p.r = g1 <= cap || a->route_ids ? 1 : 2; /* routing: no two-row instance */
        p.n_groups = p.r == 1 ? g1 : g2;
        p.blocks = p.n_groups < cap ? p.n_groups : cap;
    } else if (g1 <= slots || a->route_ids) { /* routing: no two-row plan (not instantiated) */
        p.r = 1;
        p.blocks = p.n_groups = g1;
    } else {
        int per2 = 0, per3 = 0, g3 = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per2, mv_kernel<MODE, 2>, threads,
                                                          p.smem) != cudaSuccess ||
            per2 < 1)
            per2 = 1;
        for (int i = 0; i < a->n_mat; i++)
            g3 += (a->m[i].rows + 3 * ENGINE_CU_MV_WARPS - 1) / (3 * ENGINE_CU_MV_WARPS);
        if (a->r3 && a->n_mat > 1 && g2 > sms * per2 &&
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per3, mv_kernel<MODE, 3>, threads,
                                                          p.smem) == cudaSuccess &&
            g3 <= sms * per3) { /* one wave of three-row groups (engine_cu_mv.r3) */
            p.r = 3;
            p.blocks = p.n_groups = g3;
            return p;
        }
        p.r = 2;
        p.n_groups = g2;
        p.blocks = a->n_mat == 1 && g2 > sms * per2 ? sms * per2 : g2;
    }
    return p;
}

size_t engine_cu_mv_tma_smem(const engine_cu_mv *a, const engine_cu_mv_plan *p) {
    if (!a->tma || p->r <= 0 || p->blocks != p->n_groups || a->touch || a->preload ||
        a->route_ids || a->max_bps > 0 || mv_is_q6r(a) || !engine_cu_bulk_ok())
        return 0;
    size_t rb = 0;
    for (int i = 0; i < a->n_mat; i++) {
        if (!engine_cu_type_quant(a->m[i].type) || a->m[i].row_bytes % 16 != 0 ||
            ((uintptr_t)a->m[i].w & 15) != 0)
            return 0;
        if (a->m[i].row_bytes > rb) rb = a->m[i].row_bytes;
    }
    return engine_cu_w_off(p->smem) + (size_t)ENGINE_CU_MV_WARPS * p->r * rb;
}

int engine_cu_mv_ring_bufs(const engine_cu_mv *a, size_t *smem) {
    *smem = 0;
    if (a->ring < 1 || a->ring > 3 || a->n_mat != 1 || a->route_ids || !engine_cu_bulk_ok())
        return 0;
    int nw, rr;
    mv_ring_shape(a->ring, &nw, &rr);
    const engine_cu_mat &m = a->m[0];
    const int type = m.type;
    if ((!engine_cu_type_quant(type) && type != ENGINE_CU_TYPE_Q6_KR) || m.row_bytes % 16 ||
        ((uintptr_t)m.w & 15) || a->cols % 256)
        return 0;
    const size_t tile = (size_t)rr * m.row_bytes;
    const size_t off = engine_cu_w_off(engine_cu_xs_bytes(true, a->cols));
    const int sms = engine_cu_sm_count();
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
            cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    /* the kernel's static shared memory: its barriers, the staging's scratch (~1 KB spare) */
    const size_t room = (size_t)optin > off + 2048 ? (size_t)optin - off - 2048 : 0;
    int nbuf = (int)(room / ((size_t)nw * tile));
    if (nbuf > ENGINE_CU_MV_RING_MAX) nbuf = ENGINE_CU_MV_RING_MAX;
    const long tiles = (m.rows + rr - 1) / rr;
    if (nbuf < 2 || tiles < 2L * sms * nw) return 0;
    *smem = off + (size_t)nw * nbuf * tile;
    return nbuf;
}

template <int MODE> static void mv_launch_mode(const engine_cu_mv *a, cudaStream_t stream) {
    if constexpr (MODE != ENGINE_CU_X_F32) {
        size_t rsm = 0;
        if (const int nbuf = engine_cu_mv_ring_bufs(a, &rsm)) {
            int nw, rr;
            mv_ring_shape(a->ring, &nw, &rr);
            const dim3 grid(engine_cu_sm_count()), block(nw * 32);
            void (*k)(engine_cu_mv, int) = nullptr;
            if (!mv_is_q6r(a))
                k = a->ring == 1   ? mv_ring_kernel<MODE, false, 8, 4>
                    : a->ring == 2 ? mv_ring_kernel<MODE, false, 16, 2>
                                   : mv_ring_kernel<MODE, false, 16, 4>;
            else if constexpr (MODE == ENGINE_CU_X_Q8_K) /* the repacked copy's staging mode */
                k = a->ring == 1   ? mv_ring_kernel<MODE, true, 8, 4>
                    : a->ring == 2 ? mv_ring_kernel<MODE, true, 16, 2>
                                   : mv_ring_kernel<MODE, true, 16, 4>;
            if (k) {
                engine_cu_launch(k, grid, block, rsm, stream, *a, nbuf);
                return;
            }
        }
    }
    const mv_plan p = mv_plan_mode<MODE>(a);
    const dim3 grid(p.blocks), block(ENGINE_CU_MV_WARPS * 32);
    if constexpr (MODE != ENGINE_CU_X_F32)
        if (a->tma && p.r >= 1 && p.r <= 3) { /* the rows' copies, where they fit one wave */
            const mv_kernel_fn k = p.r == 1   ? mv_kernel_for<MODE, 1>(a)
                                   : p.r == 2 ? mv_kernel_for<MODE, 2>(a)
                                              : mv_kernel_for<MODE, 3>(a);
            const size_t tsm = engine_cu_mv_tma_smem(a, &p);
            if (tsm && engine_cu_one_wave(k, ENGINE_CU_MV_WARPS * 32, tsm, p.blocks)) {
                engine_cu_launch(k, grid, block, tsm, stream, *a, p.n_groups);
                return;
            }
        }
    engine_cu_mv b = *a;
    b.tma = 0;
    a = &b;
    if constexpr (MODE == ENGINE_CU_X_Q8_K)
        if (mv_is_q6r(a)) { /* one, two or four rows a warp (mv_plan_mode) */
            if (p.r == 4)
                engine_cu_launch(mv_q6r4_kernel, grid, block, p.smem, stream, *a, p.n_groups);
            else if (p.r == 1)
                engine_cu_launch(mv_kernel<MODE, 1, true>, grid, block, p.smem, stream, *a,
                                 p.n_groups);
            else
                engine_cu_launch(mv_kernel<MODE, 2, true>, grid, block, p.smem, stream, *a,
                                 p.n_groups);
            return;
        }
    if (a->route_ids && p.r == 0)
        engine_cu_launch(mv_route_kernel<MODE, 0>, grid, block, p.smem, stream, *a, p.n_groups);
    else if (a->route_ids)
        engine_cu_launch(mv_route_kernel<MODE, 1>, grid, block, p.smem, stream, *a, p.n_groups);
    else if (p.r == 0)
        engine_cu_launch(mv_kernel<MODE, 0>, grid, block, p.smem, stream, *a, p.n_groups);
    else if (p.r == 1)
        engine_cu_launch(mv_kernel<MODE, 1>, grid, block, p.smem, stream, *a, p.n_groups);
    else if (p.r == 3)
        engine_cu_launch(mv_kernel<MODE, 3>, grid, block, p.smem, stream, *a, p.n_groups);
    else
        engine_cu_launch(mv_kernel<MODE, 2>, grid, block, p.smem, stream, *a, p.n_groups);
}

/* Split a's matrices by staging mode (one part per mode present). */
static void mv_split(const engine_cu_mv *a, engine_cu_mv part[3]) {
    for (int k = 0; k < 3; k++) {
        part[k] = *a;
        part[k].n_mat = 0;
    }
    for (int i = 0; i < a->n_mat; i++) {
        engine_cu_mv *p = &part[engine_cu_x_mode(a->m[i].type)];
        p->m[p->n_mat++] = a->m[i];
    }
}

int engine_cu_matvec_phases(const engine_cu_mv *a, engine_cu_phase out[3]) {
    engine_cu_mv part[3];
    mv_split(a, part);
    for (int k = 0; k < 3; k++) {
        part[k].max_bps = 0; /* the fused step keeps the stage-4 plan */
        part[k].route_ids = nullptr; /* and routes in its up phase */
        part[k].route_late = 0;
        part[k].tma = 0; /* the fused step's smem is the staging's */
    }
    int n = 0;
    for (int mode = 0; mode < 3; mode++) {
        if (!part[mode].n_mat) continue;
        const mv_plan p = mode == ENGINE_CU_X_F32    ? mv_plan_mode<ENGINE_CU_X_F32>(&part[mode])
                          : mode == ENGINE_CU_X_Q8_0 ? mv_plan_mode<ENGINE_CU_X_Q8_0>(&part[mode])
                                                     : mv_plan_mode<ENGINE_CU_X_Q8_K>(&part[mode]);
        engine_cu_phase *ph = &out[n++];
        memset(ph, 0, sizeof *ph);
        ph->kind = ENGINE_CU_PH_MV + 3 * mode + p.r;
        ph->n_blocks = p.blocks;
        ph->gx = p.n_groups;
        ph->smem = p.smem;
        ph->u.mv = part[mode];
    }
    return n;
}

engine_cu_mv_plan engine_cu_matvec_plan(const engine_cu_mv *a) {
    const int mode = a->n_mat > 0 ? engine_cu_x_mode(a->m[0].type) : ENGINE_CU_X_F32;
    return mode == ENGINE_CU_X_F32    ? mv_plan_mode<ENGINE_CU_X_F32>(a)
           : mode == ENGINE_CU_X_Q8_0 ? mv_plan_mode<ENGINE_CU_X_Q8_0>(a)
                                      : mv_plan_mode<ENGINE_CU_X_Q8_K>(a);
}

void engine_cu_matvec(const engine_cu_mv *a, cudaStream_t stream) {
    /* one launch per staging mode present (one launch in practice: q, k, v share a mode) */
    engine_cu_mv part[3];
    mv_split(a, part);
    if (part[ENGINE_CU_X_F32].n_mat) mv_launch_mode<ENGINE_CU_X_F32>(&part[0], stream);
    if (part[ENGINE_CU_X_Q8_0].n_mat) mv_launch_mode<ENGINE_CU_X_Q8_0>(&part[1], stream);
    if (part[ENGINE_CU_X_Q8_K].n_mat) mv_launch_mode<ENGINE_CU_X_Q8_K>(&part[2], stream);
}

/* ---------------------------------------------------------------------------------------------
 * The head's repacked copy (dequant.cuh ENGINE_CU_TYPE_Q6_KR)
 * ------------------------------------------------------------------------------------------- */
size_t engine_cu_q6r_row_bytes(size_t row_bytes) {
    return (row_bytes + 15) & ~(size_t)15;
}

/* A thread per (row, chunk): the chunk's bytes from the Q6_K superblock to their Q6_KR places. */
__global__ void q6r_repack_kernel(const uint8_t *src, size_t src_rb, uint8_t *dst, size_t dst_rb,
                                  int rows, int n_chunks) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * n_chunks) return;
    const size_t r = i / (size_t)n_chunks;
    const int c = (int)(i - r * (size_t)n_chunks);
    const uint8_t *b = src + r * src_rb + (size_t)(c >> 3) * 210;
    const int q = c & 7, hh = q >> 2, rr = q & 3, w = rr >> 1, l0 = 16 * (rr & 1);
    uint8_t *o = dst + r * dst_rb;
    size_t oq, oh, os, od;
    engine_cu_q6r_at(c, n_chunks, &oq, &oh, &os, &od);
    uint8_t nib[16];
    for (int j = 0; j < 16; j++) {
        o[oq + j] = b[64 * hh + 32 * w + l0 + j];
        const int h = b[128 + 32 * hh + l0 + j];
        nib[j] = (uint8_t)(((h >> (2 * w)) & 3) | (((h >> (4 + 2 * w)) & 3) << 2));
    }
    for (int j = 0; j < 4; j++) {
        o[oh + j] = (uint8_t)(nib[j] | nib[j + 4] << 4);
        o[oh + 4 + j] = (uint8_t)(nib[8 + j] | nib[12 + j] << 4);
    }
    const uint8_t *sc = b + 192 + 8 * hh + (l0 >> 4);
    o[os] = sc[2 * w];
    o[os + 1] = sc[4 + 2 * w];
    if ((c & 7) == 0) {
        o[od] = b[208];
        o[od + 1] = b[209];
    }
    if (c == n_chunks - 1) /* the stride's padding: defined bytes */
        for (size_t p = (size_t)n_chunks / 8 * 210; p < dst_rb; p++)
            o[p] = 0;
}

void engine_cu_q6r_repack(const uint8_t *src, size_t src_rb, uint8_t *dst, int rows, int cols,
                          cudaStream_t stream) {
    const int n_chunks = cols / 32;
    const size_t n = (size_t)rows * n_chunks;
    if (!n) return;
    q6r_repack_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(
        src, src_rb, dst, engine_cu_q6r_row_bytes(src_rb), rows, n_chunks);
}

int engine_cu_head_rows_env(void) {
    const char *e = getenv("SPARK_CUDA_HEAD_ROWS");
    return !e || atoi(e) == 4 ? 4 : 0;
}

int engine_cu_head_ring_env(int dflt) {
    const char *e = getenv("SPARK_CUDA_HEAD_RING");
    const int v = e ? atoi(e) : dflt;
    return v >= 0 && v <= 3 ? v : dflt;
}

bool engine_cu_head_copy_wanted(void) {
    const char *e = getenv("SPARK_CUDA_HEAD_REPACK");
    return !e || atoi(e) != 0;
}

int engine_cu_head_copy(const uint8_t *src, int type, int rows, int cols, size_t row_bytes,
                        uint8_t **out) {
    *out = nullptr;
    if (type != ENGINE_TYPE_Q6_K || cols % 256 || !engine_cu_head_copy_wanted()) return 0;
    const size_t bytes = (size_t)rows * engine_cu_q6r_row_bytes(row_bytes);
    size_t free_b = 0, total_b = 0;
    cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
    if (e == cudaSuccess && bytes + ((size_t)256 << 20) > free_b) {
        engine_log(ENGINE_LOG_WARN,
                   "cuda: no room for the output head's repacked copy (%.2f GB, %.2f GB free): "
                   "the decode head reads the file's Q6_K rows (slower)",
                   (double)bytes / 1e9, (double)free_b / 1e9);
        return 0;
    }
    uint8_t *p = nullptr;
    if (e == cudaSuccess) e = cudaMalloc((void **)&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        engine_log(ENGINE_LOG_WARN,
                   "cuda: no room for the output head's repacked copy (%.2f GB): the decode head "
                   "reads the file's Q6_K rows (slower)",
                   (double)bytes / 1e9);
        return 0;
    }
    if (e == cudaSuccess) {
        engine_cu_q6r_repack(src, row_bytes, p, rows, cols, 0);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        cudaGetLastError();
        cudaFree(p);
        return engine_err(ENGINE_EINTERNAL, "CUDA: the output head's repacked copy: %s",
                          cudaGetErrorString(e));
    }
    engine_log(ENGINE_LOG_INFO,
               "cuda: memory plan: + %.2f GB, the output head repacked for the decode step "
               "(SPARK_CUDA_HEAD_REPACK=0: none)",
               (double)bytes / 1e9);
    *out = p;
    return 0;
}

ENGINE_CU_TRACE_TU(matvec)
