/* The attention and the wo + router products in one launch at short context (contract in
 * att_wo.cuh). */
#include <string.h>

#include <cooperative_groups.h>

#include "att_short_dev.cuh"
#include "att_wo.cuh"
#include "qdot.cuh"

/* Shared memory of a block, in this order (each part 128-byte aligned): the Wo slice (rg x sb),
 * the cluster's M rows (epc x nh hd floats), then sq[nh][hd] and sc[nh][SPLIT], which
 * so[WARPS][nh][hd] overlays once the scores are read, the new K and V rows (hd floats of room
 * each), sa[nh hd] (the outputs), the 8-bit staging of sa, pw[c][rg / c] (the ranks' partials of
 * its rows), pm[8], rx[warps], ssum[nh]. Two blocks fit a multiprocessor for the 30B shape (Q8_0
 * too), so that all 16 clusters of 8 are resident at once (one block a multiprocessor: 15 on the
 * H200). */
typedef struct {
    size_t ws, wm, sq, sc, so, kr, vr, sa, xs, pw, pm, rx, ss, total;
} aw_smem;

__host__ __device__ static inline size_t aw_up(size_t n) {
    return (n + 127) & ~(size_t)127;
}

__host__ __device__ static inline aw_smem aw_layout(const engine_cu_aw_plan &p, int hd,
                                                    int n_embd) {
    aw_smem z;
    const size_t na = (size_t)p.nh * hd, f = sizeof(float);
    z.ws = 0;
    z.wm = z.ws + aw_up((size_t)p.rg * p.sb);
    z.sq = z.wm + aw_up(f * (size_t)p.epc * na);
    z.sc = z.sq + aw_up(f * na);
    z.so = z.sq;
    const size_t qs = aw_up(f * na) + aw_up(f * (size_t)p.nh * ENGINE_CU_ATT_SPLIT),
                 os = aw_up(f * ENGINE_CU_AW_WARPS * na);
    z.kr = z.sq + (qs > os ? qs : os);
    z.vr = z.kr + aw_up(f * hd);
    z.sa = z.vr + aw_up(f * hd);
    z.xs = z.sa + aw_up(f * na);
    z.pw = z.xs + aw_up(engine_cu_xs_bytes(true, (int)na));
    z.pm = z.pw + aw_up(f * p.rg);
    z.rx = z.pm + aw_up(f * 8); /* pm[rank]: the block's expert's partials */
    z.ss = z.rx + aw_up(f * ENGINE_CU_AW_WARPS);
    z.total = z.ss + aw_up(f * p.nh);
    return z;
}

/* Partial dot products of the block's Wo slice rows with the staged slice of â (every thread):
 * NC chunks a row, 32 / NC rows a warp at a time, lane (row r_off, chunk c); the row's chunks
 * summed by shuffles within its NC lanes, in lane order by the butterfly. Row r's sum goes to
 * the block of rank r / rpb (nrank > 1: through distributed shared memory), slot
 * rk rpb + r % rpb of its pw. */
template <int T, int NC>
__device__ __forceinline__ void aw_wo_rows(const uint8_t *ws, size_t sb, int rg,
                                           const engine_cu_xv &xv, float *pw, int nrank, int rk,
                                           int rpb) {
    namespace cg = cooperative_groups;
    constexpr int RPI = 32 / NC;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int ro = lane / NC, c = lane % NC;
#pragma unroll 4
    for (int base = w * RPI; base < rg; base += ENGINE_CU_AW_WARPS * RPI) { /* warp-uniform */
        const int r = base + ro;
        float d = engine_cu_dot_chunk<T, true>(ws + (size_t)min(r, rg - 1) * sb, c, xv);
#pragma unroll
        for (int o = NC / 2; o > 0; o >>= 1)
            d += __shfl_xor_sync(0xffffffffu, d, o);
        if (c == 0 && r < rg) {
            const int owner = r / rpb, slot = rk * rpb + (r - owner * rpb);
            float *dst = nrank > 1 ? cg::this_cluster().map_shared_rank(pw, owner) : pw;
            dst[slot] = d;
        }
    }
}

/* float4s of an R row each thread holds: rows of up to 4 * 4 * ENGINE_CU_AW_THREADS values */
#define AW_RX 2

template <int HD, int NH, bool F32, int MODE>
__global__ void __launch_bounds__(ENGINE_CU_AW_THREADS, 2) aw_kernel(engine_cu_aw_args a) {
    namespace cg = cooperative_groups;
    extern __shared__ __align__(128) uint8_t aw_sm[];
    __shared__ uint64_t bar_r, bar_w;
    constexpr int NA = NH * HD;      /* the block's columns of Wo */
    constexpr int NC = NA / 32;      /* chunks of a slice row */
    constexpr int DPL = HD / 32;     /* V dimensions per lane */
    constexpr int TPP = 4;           /* threads a position in the scores */
    constexpr int NI = HD / 8 / TPP; /* groups of 8 values a thread in the scores */
    constexpr int PSTEP = ENGINE_CU_AW_THREADS / TPP;
    constexpr int NW = ENGINE_CU_AW_WARPS;
    constexpr int VU = NH >= 4 ? 8 : att_short_vu(HD); /* V rows in flight: registers */
    constexpr size_t elt = F32 ? 4 : 2;
    static_assert(NC <= 32 && 32 % NC == 0, "a slice row's chunks within a warp");
    static_assert(ENGINE_CU_ATT_SPLIT <= 32 * NW, "a warp's positions within its lanes");
    engine_cu_pdl_launch();
    cg::cluster_group cl = cg::this_cluster();
    const engine_cu_aw_plan &p = a.p;
    const aw_smem z = aw_layout(p, HD, a.n_embd);
    const int g = blockIdx.x, q = blockIdx.y; /* = cl.block_rank(): clusters of 1 x c x 1 */
    const int nrank = a.diag_nocl ? 1 : p.c, rk = nrank > 1 ? q : 0, rpb = p.rg / nrank;
    const int t = threadIdx.x, lane = t & 31, w = t >> 5;
    const int emb = a.n_embd, n_att = a.at.n_head * HD;
    const int G = a.at.n_head / a.at.n_kv, h0 = q * NH, kvh = h0 / G;
    const int pos = *a.at.pos; /* set before the step's graph runs */
    const int np = pos + 1, nl = pos;
    const size_t kv_dim = (size_t)a.at.n_kv * HD, col = (size_t)kvh * HD;
    const uintptr_t kc = (uintptr_t)a.at.k_cache + col * elt;
    const uint8_t *vc = (const uint8_t *)a.at.v_cache + col * elt;
    uint8_t *ws = aw_sm + z.ws;
    float *wm = (float *)(aw_sm + z.wm);
    float *sq = (float *)(aw_sm + z.sq), *sc = (float *)(aw_sm + z.sc);
    float *so = (float *)(aw_sm + z.so), *sa = (float *)(aw_sm + z.sa);
    uint8_t *skr = aw_sm + z.kr, *svr = aw_sm + z.vr, *xs = aw_sm + z.xs;
    float *pw = (float *)(aw_sm + z.pw), *pm = (float *)(aw_sm + z.pm);
    float *rx = (float *)(aw_sm + z.rx), *ssum = (float *)(aw_sm + z.ss);

    /* 1. the weights (they do not depend on the step) into shared memory, the cache rows
     * before the position to L2 */
    const size_t rrow = (size_t)(emb + n_att); /* floats of an [R | M] row */
    if (t == 0) {
        int nm = 0;
        while (nm < p.epc && g * p.epc + nm < a.n_expert)
            nm++;
        engine_cu_mbar_init(&bar_r);
        engine_cu_mbar_init(&bar_w);
        engine_cu_mbar_expect(&bar_r, (unsigned)(sizeof(float) * (size_t)nm * NA));
        for (int j = 0; j < nm; j++)
            engine_cu_bulk_g2s(wm + (size_t)j * NA,
                               a.rm + (size_t)(g * p.epc + j) * rrow + emb + h0 * HD,
                               sizeof(float) * NA, &bar_r);
        const size_t wbytes = (size_t)p.rg * p.sb;
        engine_cu_mbar_expect(&bar_w, (unsigned)wbytes);
        engine_cu_bulk_g2s(ws, a.wo_r + (size_t)(g * p.c + q) * wbytes, (unsigned)wbytes, &bar_w);
    }
    __syncthreads(); /* the barriers' init before any wait on them */
    /* the R row of the expert this block sums (j = q; plan: at most one a block), a float4 of
     * it every ENGINE_CU_AW_THREADS, into registers */
    const int ej = g * p.epc + q;
    const bool own = q < p.epc && ej < a.n_expert;
    const float4 *r4 = (const float4 *)(a.rm + (size_t)(own ? ej : 0) * rrow);
    float4 rr[AW_RX];
#pragma unroll
    for (int k = 0; k < AW_RX; k++)
        rr[k] = own && t + k * ENGINE_CU_AW_THREADS < (emb >> 2)
                    ? __ldg(r4 + t + k * ENGINE_CU_AW_THREADS)
                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    {
        const int nb = (G / NH) * p.n_grp, bi = (h0 - kvh * G) / NH + (G / NH) * g;
        for (int r = bi + nb * t; r < nl; r += nb * ENGINE_CU_AW_THREADS) {
            engine_cu_prefetch_rows((const uint8_t *)kc + (size_t)r * kv_dim * elt, HD * elt);
            engine_cu_prefetch_rows(vc + (size_t)r * kv_dim * elt, HD * elt);
        }
    }
    engine_cu_pdl_wait();
    const float2 *rope = a.at.rope + (size_t)pos * (HD / 2);
    float4 xr[AW_RX]; /* x (final now) for R x: its loads in flight beside the q / k work */
#pragma unroll
    for (int k = 0; k < AW_RX; k++)
        xr[k] = own && t + k * ENGINE_CU_AW_THREADS < (emb >> 2)
                    ? ((const float4 *)a.x)[t + k * ENGINE_CU_AW_THREADS]
                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);

    /* 2. q of the block's heads normed and rotated; the new K / V row; R x of its experts */
    if (w < NH) {
        float v[DPL];
        norm_rope_warp<HD>(a.at.q + (size_t)(h0 + w) * HD, a.at.q_norm, rope, a.at.eps, v);
#pragma unroll
        for (int i = 0; i < DPL; i++)
            sq[w * HD + lane + 32 * i] = v[i];
    } else if (w == NH) {
        float v[DPL];
        norm_rope_warp<HD>(a.at.k + col, a.at.k_norm, rope, a.at.eps, v);
        const bool store = g == 0 && h0 == kvh * G; /* one block a KV head stores the row */
        const size_t o = (size_t)pos * kv_dim + col;
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            const int d = lane + 32 * i;
            const float vv = a.at.v[col + d];
            if (F32) {
                ((float *)skr)[d] = v[i];
                ((float *)svr)[d] = vv;
                if (store) {
                    ((float *)a.at.k_cache)[o + d] = v[i];
                    ((float *)a.at.v_cache)[o + d] = vv;
                }
            } else {
                const __half hk = __float2half_rn(v[i]), hv = __float2half_rn(vv);
                ((__half *)skr)[d] = hk;
                ((__half *)svr)[d] = hv;
                if (store) {
                    ((__half *)a.at.k_cache)[o + d] = hk;
                    ((__half *)a.at.v_cache)[o + d] = hv;
                }
            }
        }
    }
    if (own) { /* R x: each thread's float4s, the warps' sums in rx[w] (added in warp order) */
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < AW_RX; k++) {
            acc = fmaf(rr[k].x, xr[k].x, acc);
            acc = fmaf(rr[k].y, xr[k].y, acc);
            acc = fmaf(rr[k].z, xr[k].z, acc);
            acc = fmaf(rr[k].w, xr[k].w, acc);
        }
        acc = engine_cu_warp_sum(acc);
        if (lane == 0) rx[w] = acc;
    }
    __syncthreads();
    ENGINE_CU_TRACE(4);

    /* 3. scores: TPP threads a position, each K load used for the NH heads */
    const float scale = 1.0f / sqrtf((float)HD);
    const int part = t & (TPP - 1);
    for (int jb = 0; jb < np; jb += PSTEP) { /* uniform over the block */
        const int j = jb + t / TPP;
        const uintptr_t kr = kc + (uintptr_t)j * kv_dim * elt;
        const void *row = (const void *)(j < nl ? kr : (uintptr_t)skr);
        float kk[NI][8];
#pragma unroll
        for (int ii = 0; ii < NI; ii++)
            kv_load8(row, F32, 8 * (part + TPP * ii), kk[ii]);
#pragma unroll
        for (int h = 0; h < NH; h++) {
            float d = 0.0f;
#pragma unroll
            for (int ii = 0; ii < NI; ii++) {
                const float *qp = sq + h * HD + 8 * (part + TPP * ii);
                const float4 q0 = *(const float4 *)qp, q1 = *(const float4 *)(qp + 4);
                d += q0.x * kk[ii][0] + q0.y * kk[ii][1] + q0.z * kk[ii][2] + q0.w * kk[ii][3] +
                     q1.x * kk[ii][4] + q1.y * kk[ii][5] + q1.z * kk[ii][6] + q1.w * kk[ii][7];
            }
#pragma unroll
            for (int o = 1; o < TPP; o <<= 1)
                d += __shfl_xor_sync(0xffffffffu, d, o);
            if (part == 0 && j < np) sc[h * ENGINE_CU_ATT_SPLIT + j] = d * scale;
        }
    }
    __syncthreads();
    ENGINE_CU_TRACE(5);

    /* 4. every warp: each head's max and denominator, the weights of its own positions
     * w + NW lane; V with lanes over dimensions, warps over every NW-th position */
    constexpr int NJ = ENGINE_CU_ATT_SPLIT / 32;
    const int jo = w + NW * lane;
    float e[NH];
#pragma unroll
    for (int h = 0; h < NH; h++) {
        const float *sh = sc + h * ENGINE_CU_ATT_SPLIT;
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < NJ; i++)
            if (lane + 32 * i < np) mx = fmaxf(mx, sh[lane + 32 * i]);
        mx = engine_cu_warp_max(mx);
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < NJ; i++)
            if (lane + 32 * i < np) sum += expf(sh[lane + 32 * i] - mx);
        sum = engine_cu_warp_sum(sum);
        if (w == 0 && lane == 0) ssum[h] = sum;
        e[h] = jo < np ? expf(sh[jo] - mx) : 0.0f;
    }
    const int nk = (nl - w + NW - 1) / NW; /* this warp's rows < nl */
    float acc[NH][DPL];
#pragma unroll
    for (int h = 0; h < NH; h++)
#pragma unroll
        for (int i = 0; i < DPL; i++)
            acc[h][i] = 0.0f;
    for (int k0 = 0; k0 < nk; k0 += VU) { /* uniform over the warp */
        float vv[VU][DPL];
#pragma unroll
        for (int u = 0; u < VU; u++)
            kv_loadn<DPL>(vc + (size_t)(w + NW * min(k0 + u, nk - 1)) * kv_dim * elt, F32,
                          (size_t)lane * DPL, vv[u]);
#pragma unroll
        for (int u = 0; u < VU; u++) {
#pragma unroll
            for (int h = 0; h < NH; h++) {
                const float pj = __shfl_sync(0xffffffffu, e[h], (k0 + u) & 31);
                if (k0 + u < nk)
#pragma unroll
                    for (int i = 0; i < DPL; i++)
                        acc[h][i] += pj * vv[u][i];
            }
        }
    }
    __syncthreads();    /* every warp past the scores: so overlays sq and sc */
    if (nl % NW == w) { /* row pos, the last of this warp's positions */
        float vv[DPL];
        kv_loadn<DPL>(svr, F32, (size_t)lane * DPL, vv);
#pragma unroll
        for (int h = 0; h < NH; h++) {
            const float pj = __shfl_sync(0xffffffffu, e[h], nl / NW);
#pragma unroll
            for (int i = 0; i < DPL; i++)
                acc[h][i] += pj * vv[i];
        }
    }
#pragma unroll
    for (int h = 0; h < NH; h++)
#pragma unroll
        for (int i = 0; i < DPL; i++)
            so[((size_t)w * NH + h) * HD + lane * DPL + i] = acc[h][i];
    __syncthreads();
    for (int i = t; i < NA; i += ENGINE_CU_AW_THREADS) {
        const int h = i / HD, d = i - h * HD;
        float o = 0.0f;
#pragma unroll
        for (int k = 0; k < NW; k++)
            o += so[((size_t)k * NH + h) * HD + d];
        sa[i] = o / ssum[h];
    }
    __syncthreads();
    ENGINE_CU_TRACE(2);

    /* 5. the outputs staged as the wo blocks stage â; the slice's partial sums */
    engine_cu_stage_part<MODE>(sa, NA, nullptr, 0.0f, xs, w, NW);
    __syncthreads();
    const engine_cu_xv xv = engine_cu_xv_at(xs, NA, true, 0);
    ENGINE_CU_TRACE(6);
    engine_cu_mbar_wait(&bar_w, 0);
    ENGINE_CU_TRACE(7);
    switch (a.wo_type) {
#define AW_CASE(T)                                                                                 \
    case T:                                                                                        \
        if (MODE == engine_cu_x_mode(T))                                                           \
            aw_wo_rows<T, NC>(ws, p.sb, p.rg, xv, pw, nrank, rk, rpb);                             \
        break;
        ENGINE_CU_QUANT_CASES(AW_CASE)
#undef AW_CASE
    default:
        break;
    }
    {
        engine_cu_mbar_wait(&bar_r, 0);
        for (int j = w; j < p.epc; j += NW) {
            if (g * p.epc + j >= a.n_expert) break;
            const float *mr = wm + (size_t)j * NA;
            float s = 0.0f;
#pragma unroll 4
            for (int i = lane; i < NA; i += 32)
                s = fmaf(mr[i], xv.d[i >> 5] * (float)xv.q[i], s);
            s = engine_cu_warp_sum(s);
            /* expert j's partial to the block that sums it (rank j), slot rk */
            if (lane == 0 && (nrank > 1 || j == q))
                (nrank > 1 ? cl.map_shared_rank(pm, j) : pm)[rk] = s;
        }
    }
    if (nrank > 1) cl.sync(); /* every partial in its summing block's shared memory */
    ENGINE_CU_TRACE(8);

    /* 6. the block's rows and expert: the ranks' partials in rank order, from its own shared
     * memory (no block reads another's after the barrier, so none waits to exit) */
    for (int i = t; i < rpb; i += ENGINE_CU_AW_THREADS) {
        float s = 0.0f;
        for (int k = 0; k < nrank; k++)
            s += pw[k * rpb + i];
        a.ao[(size_t)g * p.rg + rk * rpb + i] = s;
    }
    if (own && t == 0) {
        float s = 0.0f;
#pragma unroll
        for (int b = 0; b < NW; b++)
            s += rx[b];
        for (int b = 0; b < nrank; b++)
            s += pm[b];
        a.raw[ej] = s;
    }
    ENGINE_CU_TRACE_END();
}

static int aw_gran(int wo_type) {
    return engine_cu_x_mode(wo_type) == ENGINE_CU_X_Q8_K ? 256 : 32;
}

/* The heads a block takes for this head dim (the kernel's instances). */
static bool aw_shape_ok(int hd, int nh) {
    return (hd == 128 && (nh == 4 || nh == 2)) || (hd == 64 && nh == 1);
}

const char *engine_cu_aw_plan_for(engine_cu_aw_plan *p, int wo_type, size_t wo_row_bytes,
                                  int n_embd, int n_head, int n_kv, int hd, int n_expert) {
    memset(p, 0, sizeof *p);
    if (!engine_cu_type_quant(wo_type)) return "Wo is not of a quantised type";
    if (!engine_cu_bulk_ok()) return "the device has no bulk copies (sm_90 and later)";
    if (n_kv < 1 || n_head % n_kv) return "the heads do not split into KV groups";
    const int G = n_head / n_kv, n_att = n_head * hd;
    int nh = 0;
    for (int c = 8; c >= 1 && !nh; c >>= 1) { /* the most blocks a cluster first */
        if (n_head % c) continue;
        const int h = n_head / c;
        if (G % h == 0 && (h * hd) % aw_gran(wo_type) == 0 && aw_shape_ok(hd, h)) nh = h;
    }
    if (!nh) return "no split of the heads fits a cluster of at most 8 blocks";
    p->nh = nh;
    p->c = n_head / nh;
    p->sb = wo_row_bytes / (size_t)(n_att / (nh * hd));
    if (p->sb * (size_t)(n_att / (nh * hd)) != wo_row_bytes) return "Wo's rows do not split";
    int n_grp = engine_cu_sm_count() / p->c;
    while (n_grp > 1 && (n_embd % n_grp || (n_embd / n_grp) % p->c))
        n_grp--;
    if (n_grp < 1 || n_embd % n_grp || (n_embd / n_grp) % p->c)
        return "the rows do not split into clusters";
    p->n_grp = n_grp;
    p->rg = n_embd / n_grp;
    p->epc = (n_expert + n_grp - 1) / n_grp;
    if (p->epc > p->c) return "more experts a cluster than blocks";
    if (n_embd > 4 * AW_RX * ENGINE_CU_AW_THREADS)
        return "the hidden size is past the R rows' registers";
    if (((size_t)p->rg * p->sb) % 16) return "a block's slice is not a whole number of 16 bytes";
    const aw_smem z = aw_layout(*p, hd, n_embd);
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
            cudaSuccess) {
        cudaGetLastError();
        return "the device's shared memory per block is unknown";
    }
    if (z.total + 1024 > (size_t)optin) return "a block's shared memory would not fit";
    return NULL;
}

size_t engine_cu_aw_repack_bytes(const engine_cu_aw_plan *p) {
    return (size_t)p->n_grp * p->c * p->rg * p->sb;
}

int engine_cu_aw_repack(const engine_cu_aw_plan *p, const uint8_t *wo, size_t row_bytes,
                        uint8_t *dst, cudaStream_t stream) {
    for (int g = 0; g < p->n_grp; g++)
        for (int q = 0; q < p->c; q++) {
            const cudaError_t e =
                cudaMemcpy2DAsync(dst + ((size_t)g * p->c + q) * p->rg * p->sb, p->sb,
                                  wo + (size_t)g * p->rg * row_bytes + (size_t)q * p->sb, row_bytes,
                                  p->sb, (size_t)p->rg, cudaMemcpyDeviceToDevice, stream);
            if (e != cudaSuccess)
                return engine_err(ENGINE_EINTERNAL, "cudaMemcpy2DAsync (Wo repack): %s",
                                  cudaGetErrorString(e));
        }
    return 0;
}

template <int HD, int NH, bool F32, int MODE>
static void aw_launch(const engine_cu_aw_args *a, size_t smem, cudaStream_t st) {
    engine_cu_launch_ex(aw_kernel<HD, NH, F32, MODE>, dim3((unsigned)a->p.n_grp, (unsigned)a->p.c),
                        dim3(ENGINE_CU_AW_THREADS), smem, st, true,
                        a->diag_nocl ? 0u : (unsigned)a->p.c, *a);
}

template <int HD, int NH, bool F32, int MODE>
static int aw_clusters(const engine_cu_aw_plan *p, size_t smem) {
    auto k = aw_kernel<HD, NH, F32, MODE>;
    if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
        cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)p->n_grp, (unsigned)p->c);
    cfg.blockDim = dim3(ENGINE_CU_AW_THREADS);
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeClusterDimension;
    at.val.clusterDim.x = 1;
    at.val.clusterDim.y = (unsigned)p->c;
    at.val.clusterDim.z = 1;
    cfg.attrs = &at;
    cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, k, &cfg) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return n;
}

template <int HD, int NH>
static void aw_launch_kv(const engine_cu_aw_args *a, size_t smem, cudaStream_t st) {
    const bool q8k = engine_cu_x_mode(a->wo_type) == ENGINE_CU_X_Q8_K;
    if (a->at.kv_f32) {
        if (q8k)
            aw_launch<HD, NH, true, ENGINE_CU_X_Q8_K>(a, smem, st);
        else
            aw_launch<HD, NH, true, ENGINE_CU_X_Q8_0>(a, smem, st);
    } else {
        if (q8k)
            aw_launch<HD, NH, false, ENGINE_CU_X_Q8_K>(a, smem, st);
        else
            aw_launch<HD, NH, false, ENGINE_CU_X_Q8_0>(a, smem, st);
    }
}

int engine_cu_aw_max_clusters(const engine_cu_aw_plan *p, int hd, int wo_type, int kv_f32,
                              int n_embd) {
    const size_t smem = aw_layout(*p, hd, n_embd).total;
    const bool q8k = engine_cu_x_mode(wo_type) == ENGINE_CU_X_Q8_K;
#define AW_CL(HD, NH)                                                                              \
    return kv_f32 ? (q8k ? aw_clusters<HD, NH, true, ENGINE_CU_X_Q8_K>(p, smem)                    \
                         : aw_clusters<HD, NH, true, ENGINE_CU_X_Q8_0>(p, smem))                   \
                  : (q8k ? aw_clusters<HD, NH, false, ENGINE_CU_X_Q8_K>(p, smem)                   \
                         : aw_clusters<HD, NH, false, ENGINE_CU_X_Q8_0>(p, smem))
    if (hd == 128 && p->nh == 4) AW_CL(128, 4);
    if (hd == 128 && p->nh == 2) AW_CL(128, 2);
    AW_CL(64, 1);
#undef AW_CL
}

void engine_cu_att_wo(const engine_cu_aw_args *a, cudaStream_t stream) {
    const size_t smem = aw_layout(a->p, a->at.hd, a->n_embd).total;
    if (a->at.hd == 128 && a->p.nh == 4)
        aw_launch_kv<128, 4>(a, smem, stream);
    else if (a->at.hd == 128 && a->p.nh == 2)
        aw_launch_kv<128, 2>(a, smem, stream);
    else
        aw_launch_kv<64, 1>(a, smem, stream);
}

ENGINE_CU_TRACE_TU(att_wo)
