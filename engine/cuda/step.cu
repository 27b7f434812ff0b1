/* The fused decode step (contract in step.cuh). */
#include <stdlib.h>
#include <string.h>

#include "attention_dev.cuh"
#include "matvec_dev.cuh"
#include "moe_dev.cuh"
#include "step.cuh"

#define STEP_THREADS 256
static_assert(ENGINE_CU_MV_WARPS * 32 == STEP_THREADS && FFN_WARPS * 32 == STEP_THREADS &&
                  ATT_THREADS == STEP_THREADS,
              "the fused step runs every block body with the same block size");

/* Each body a function of its own (not inlined into one large switch), so that the register
 * allocation of one does not weigh on the others. */
template <int MODE, int R>
__device__ __noinline__ void step_mv(const engine_cu_phase &P, int b, uint8_t *sm,
                                     const engine_cu_dep_sync &sy) {
    mv_block<MODE, R>(P.u.mv, P.gx, b, P.n_blocks, sm, sy);
}

template <int MODE>
__device__ __noinline__ void step_up(const engine_cu_phase &P, int b, uint8_t *sm,
                                     const engine_cu_dep_sync &sy) {
    ffn_up_block<MODE>(P.u.up, b, P.n_blocks, sm, sy);
}

template <int MODE>
__device__ __noinline__ void step_down(const engine_cu_phase &P, int b, uint8_t *sm,
                                       const engine_cu_dep_sync &sy) {
    ffn_down_block<MODE>(P.u.dn, b, P.n_blocks, sm, sy);
}

template <int HD>
__device__ __noinline__ void step_att(const engine_cu_phase &P, int b, uint8_t *sm,
                                      const engine_cu_dep_sync &sy) {
    att_block<HD>(P.u.at, b % P.gx, b / P.gx, P.gy, (float *)sm, sy);
}

/* One instance per attention head dimension HD and per quantised staging mode QM of the model
 * (the kinds the program may hold: matvec of mode QM or F32, up and down of mode QM, attention),
 * which keeps the register needs those of the per-op kernels (nothing spills for HD 128).
 * ctr: [0] ticket, [1] blocks finished, [2, 2 + n_grp) done per op, then the routing flags;
 * n_ctr counters in all, zeroed again by the last block to finish. */
template <int HD, int QM>
__global__ void __launch_bounds__(STEP_THREADS, 3)
    step_kernel(const engine_cu_phase *phases, const uint32_t *map, unsigned *ctr, int n_grp,
                int n_ctr, int total) {
    extern __shared__ uint4 step_smem[];
    __shared__ engine_cu_phase P; /* this block's phase */
    __shared__ unsigned s_t;
    __shared__ int s_last;
    engine_cu_pdl_launch();
    engine_cu_pdl_wait(); /* the kernel before (the embedding) is complete */
    if (threadIdx.x == 0) s_t = atomicAdd(ctr, 1u);
    __syncthreads();
    const uint32_t pb = __ldg(map + s_t);
    const int b = (int)(pb & 0xffffu);
    {
        const uint32_t *src = (const uint32_t *)(phases + (pb >> 16));
        uint32_t *dst = (uint32_t *)&P;
        for (int i = threadIdx.x; i < (int)(sizeof P / 4); i += STEP_THREADS)
            dst[i] = __ldg(src + i);
    }
    __syncthreads();
    engine_cu_dep_sync sy;
    sy.dep = P.dep >= 0 ? ctr + 2 + P.dep : nullptr;
    sy.dep_n = P.dep_n;
    sy.ids = P.flag >= 0 ? ctr + 2 + n_grp + P.flag : nullptr;
    uint8_t *sm = (uint8_t *)step_smem;
    const int kind = P.kind;
    if (kind < ENGINE_CU_PH_UP) { /* matvec: mode F32 or QM (the host checks) */
        const int r = (kind - ENGINE_CU_PH_MV) % 3;
        if ((kind - ENGINE_CU_PH_MV) / 3 == ENGINE_CU_X_F32) {
            if (r == 0)
                step_mv<ENGINE_CU_X_F32, 0>(P, b, sm, sy);
            else if (r == 1)
                step_mv<ENGINE_CU_X_F32, 1>(P, b, sm, sy);
            else
                step_mv<ENGINE_CU_X_F32, 2>(P, b, sm, sy);
        } else if (QM != ENGINE_CU_X_F32) {
            if (r == 0)
                step_mv<QM, 0>(P, b, sm, sy);
            else if (r == 1)
                step_mv<QM, 1>(P, b, sm, sy);
            else
                step_mv<QM, 2>(P, b, sm, sy);
        }
    } else if (kind == ENGINE_CU_PH_UP + QM) {
        step_up<QM>(P, b, sm, sy);
    } else if (kind == ENGINE_CU_PH_DOWN + QM) {
        step_down<QM>(P, b, sm, sy);
    } else if (kind == ENGINE_CU_PH_ATT) {
        step_att<HD>(P, b, sm, sy);
    }
    /* this block's results visible, then counted: done for its op, finished for the launch */
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(ctr + 2 + P.grp, 1u);
        __threadfence();
        s_last = atomicAdd(ctr + 1, 1u) == (unsigned)total - 1;
    }
    __syncthreads();
    if (s_last) { /* every other block is past its last use of the counters */
        __threadfence();
        for (int i = threadIdx.x; i < n_ctr; i += STEP_THREADS)
            ctr[i] = 0;
    }
}

int engine_cu_prog_flag(engine_cu_prog *p) {
    return p->n_flag++;
}

int engine_cu_prog_add(engine_cu_prog *p, const engine_cu_phase *ph, int n, int flag) {
    if (p->n_ph + n > p->cap) {
        const int cap = p->cap ? 2 * p->cap + n : 64 + n;
        engine_cu_phase *q =
            (engine_cu_phase *)realloc(p->ph, sizeof(engine_cu_phase) * (size_t)cap);
        if (!q) return engine_err(ENGINE_ENOMEM, "out of memory");
        p->ph = q;
        p->cap = cap;
    }
    unsigned blocks = 0;
    for (int i = 0; i < n; i++) {
        engine_cu_phase *d = &p->ph[p->n_ph + i];
        *d = ph[i];
        if (d->n_blocks < 1 || d->n_blocks > 0xffff || d->kind < 0 || d->kind >= ENGINE_CU_PH_KINDS)
            return engine_err(ENGINE_EUNSUPPORTED,
                              "cuda step: an op of %d blocks (kind %d) does not fit the fused "
                              "step",
                              d->n_blocks, d->kind);
        d->grp = p->n_grp;
        d->dep = p->n_grp - 1;
        d->dep_n = p->last_n;
        d->flag = flag;
        blocks += (unsigned)d->n_blocks;
    }
    p->n_ph += n;
    p->n_grp++;
    p->last_n = blocks;
    return 0;
}

int engine_cu_prog_upload(engine_cu_prog *p) {
    if (p->hd != 64 && p->hd != 128 && p->hd != 256)
        return engine_err(ENGINE_EUNSUPPORTED, "cuda step: head dimension %d", p->hd);
    if (p->n_ph > 0xffff)
        return engine_err(ENGINE_EUNSUPPORTED, "cuda step: %d phases (at most 65535)", p->n_ph);
    /* the one quantised staging mode the program may use besides F32 matvecs (see above) */
    int qm = -1;
    for (int i = 0; i < p->n_ph; i++) {
        const int k = p->ph[i].kind;
        const int mode = k < ENGINE_CU_PH_UP     ? (k - ENGINE_CU_PH_MV) / 3
                         : k < ENGINE_CU_PH_DOWN ? k - ENGINE_CU_PH_UP
                         : k < ENGINE_CU_PH_ATT  ? k - ENGINE_CU_PH_DOWN
                                                 : -1;
        if (mode < 0 || (k < ENGINE_CU_PH_UP && mode == ENGINE_CU_X_F32)) continue;
        if (qm >= 0 && mode != qm)
            return engine_err(ENGINE_EUNSUPPORTED,
                              "cuda step: weights of two quantised families (the fused step "
                              "takes one)");
        qm = mode;
    }
    p->qm = qm < 0 ? ENGINE_CU_X_F32 : qm;
    size_t total = 0;
    p->smem = 0;
    for (int i = 0; i < p->n_ph; i++) {
        total += (size_t)p->ph[i].n_blocks;
        if (p->ph[i].smem > p->smem) p->smem = p->ph[i].smem;
    }
    if (total > INT32_MAX) return engine_err(ENGINE_EUNSUPPORTED, "cuda step: too many blocks");
    p->total = (int)total;
    const int n_ctr = 2 + p->n_grp + p->n_flag;
    const size_t b_ph = (sizeof(engine_cu_phase) * (size_t)p->n_ph + 255) & ~(size_t)255;
    const size_t b_map = (sizeof(uint32_t) * total + 255) & ~(size_t)255;
    uint32_t *map = (uint32_t *)malloc(sizeof(uint32_t) * total);
    if (!map) return engine_err(ENGINE_ENOMEM, "out of memory");
    for (int i = 0, t = 0; i < p->n_ph; i++)
        for (int b = 0; b < p->ph[i].n_blocks; b++)
            map[t++] = (uint32_t)i << 16 | (uint32_t)b;
    cudaError_t e = cudaMalloc((void **)&p->mem, b_ph + b_map + sizeof(unsigned) * n_ctr);
    if (e == cudaSuccess)
        e = cudaMemcpy(p->mem, p->ph, sizeof(engine_cu_phase) * (size_t)p->n_ph,
                       cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = cudaMemcpy(p->mem + b_ph, map, sizeof(uint32_t) * total, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemset(p->mem + b_ph + b_map, 0, sizeof(unsigned) * n_ctr);
    free(map);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return engine_err(e == cudaErrorMemoryAllocation ? ENGINE_ENOMEM : ENGINE_EINTERNAL,
                          "CUDA (fused step upload): %s", cudaGetErrorString(e));
    }
    p->d_ph = (engine_cu_phase *)p->mem;
    p->d_map = (uint32_t *)(p->mem + b_ph);
    p->d_ctr = (unsigned *)(p->mem + b_ph + b_map);
    return 0;
}

void engine_cu_prog_launch(const engine_cu_prog *p, cudaStream_t stream) {
    const int n_ctr = 2 + p->n_grp + p->n_flag;
    typedef void (*kernel_t)(const engine_cu_phase *, const uint32_t *, unsigned *, int, int, int);
    static const kernel_t kernels[3][3] = {
        {step_kernel<64, 0>, step_kernel<64, 1>, step_kernel<64, 2>},
        {step_kernel<128, 0>, step_kernel<128, 1>, step_kernel<128, 2>},
        {step_kernel<256, 0>, step_kernel<256, 1>, step_kernel<256, 2>}};
    const kernel_t k = kernels[p->hd == 64 ? 0 : p->hd == 128 ? 1 : 2][p->qm];
    engine_cu_launch(k, dim3(p->total), dim3(STEP_THREADS), p->smem, stream,
                     (const engine_cu_phase *)p->d_ph, (const uint32_t *)p->d_map, p->d_ctr,
                     p->n_grp, n_ctr, p->total);
}

void engine_cu_prog_free(engine_cu_prog *p) {
    if (!p) return;
    free(p->ph);
    if (p->mem) cudaFree(p->mem);
    memset(p, 0, sizeof *p);
}

ENGINE_CU_TRACE_TU(step)
