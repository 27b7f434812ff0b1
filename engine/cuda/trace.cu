/* Launch timeline for diagnosis (common.cuh ENGINE_CU_TRACE; contract in cuda_backend.h). */
#include <stdio.h>
#include <stdlib.h>

#include "common.cuh"

extern "C" {
#include "cuda/cuda_backend.h"
}

#ifdef SPARK_CUDA_TRACE
/* clang-format off */
#define TRACE_TUS(X)                                                                               \
    X(att_short) X(attention) X(batch_mm) X(deltanet) X(deltanet_chunk) X(gemm) X(matvec) X(moe) \
    X(moe_fused) X(paged_att) X(prefill) X(q35_prefill) X(q35_prefill_att) X(q35_vatt)             \
    X(q35_vdelta) X(q35_verify) X(qwen35_attn) X(router_fuse) X(sample) X(step)
/* clang-format on */
#define TRACE_DECL(n) extern "C" int engine_cu_trace_bind_##n(const void *p);
TRACE_TUS(TRACE_DECL)
#undef TRACE_DECL

static int trace_bind(const engine_cu_trace_ptr *p) {
    int bad = 0;
#define TRACE_BIND(n) bad |= engine_cu_trace_bind_##n(p);
    TRACE_TUS(TRACE_BIND)
#undef TRACE_BIND
    return bad ? engine_err(ENGINE_EINTERNAL, "cuda trace: binding the buffer failed") : 0;
}

struct engine_cuda_trace {
    engine_cu_trace_ptr p;
    int n_sm;
};

extern "C" int engine_cuda_trace_start(engine_cuda_trace **out, unsigned per_sm) {
    *out = nullptr;
    int dev = 0, n_sm = 0;
    ENGINE_CUDA_CHECK(cudaGetDevice(&dev));
    ENGINE_CUDA_CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    engine_cuda_trace *t = (engine_cuda_trace *)calloc(1, sizeof *t);
    if (!t) return engine_err(ENGINE_ENOMEM, "cuda trace: out of memory");
    t->n_sm = n_sm;
    t->p.per_sm = per_sm;
    t->p.n_sm = (unsigned)n_sm;
    int rc = 0;
    if (cudaMalloc(&t->p.rec, sizeof(engine_cu_trace_rec) * per_sm * (size_t)n_sm) != cudaSuccess ||
        cudaMalloc(&t->p.ctr, sizeof(unsigned) * (size_t)n_sm) != cudaSuccess ||
        cudaMemset(t->p.ctr, 0, sizeof(unsigned) * (size_t)n_sm) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess)
        rc =
            engine_err(ENGINE_ENOMEM, "cuda trace: no device memory for %u records per SM", per_sm);
    if (!rc) rc = trace_bind(&t->p);
    if (rc) {
        cudaFree(t->p.rec);
        cudaFree(t->p.ctr);
        free(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* Stop recording; write the records as text lines "t grid block ev gx gy" (ns, sorted by
 * nothing: the reader sorts) to path. */
extern "C" int engine_cuda_trace_stop(engine_cuda_trace *t, const char *path) {
    if (!t) return 0;
    const engine_cu_trace_ptr none = {nullptr, nullptr, 0, 0};
    int rc = cudaDeviceSynchronize() != cudaSuccess
                 ? engine_err(ENGINE_EINTERNAL, "cuda trace: the traced work failed")
                 : trace_bind(&none);
    const size_t n = (size_t)t->p.per_sm * t->n_sm;
    engine_cu_trace_rec *h = (engine_cu_trace_rec *)malloc(sizeof *h * n);
    unsigned *c = (unsigned *)malloc(sizeof *c * (size_t)t->n_sm);
    FILE *f = nullptr;
    if (!rc && (!h || !c)) rc = engine_err(ENGINE_ENOMEM, "cuda trace: out of host memory");
    if (!rc &&
        (cudaMemcpy(h, t->p.rec, sizeof *h * n, cudaMemcpyDeviceToHost) != cudaSuccess ||
         cudaMemcpy(c, t->p.ctr, sizeof *c * t->n_sm, cudaMemcpyDeviceToHost) != cudaSuccess))
        rc = engine_err(ENGINE_EINTERNAL, "cuda trace: copying the records back failed");
    if (!rc && !(f = fopen(path, "w")))
        rc = engine_err(ENGINE_EIO, "cuda trace: cannot write %s", path);
    unsigned lost = 0;
    for (int sm = 0; !rc && sm < t->n_sm; sm++) {
        const unsigned k = c[sm] < t->p.per_sm ? c[sm] : t->p.per_sm;
        lost += c[sm] - k;
        for (unsigned i = 0; i < k; i++) {
            const engine_cu_trace_rec *r = &h[(size_t)sm * t->p.per_sm + i];
            fprintf(f, "%llu %llu %u %u %u %u %d\n", r->t, r->grid, r->block, r->ev, r->gx, r->gy,
                    sm);
        }
    }
    if (f && fclose(f) && !rc) rc = engine_err(ENGINE_EIO, "cuda trace: writing %s failed", path);
    if (!rc && lost)
        fprintf(stderr, "cuda trace: %u records did not fit (per_sm %u)\n", lost, t->p.per_sm);
    free(h);
    free(c);
    cudaFree(t->p.rec);
    cudaFree(t->p.ctr);
    free(t);
    return rc;
}
#else
extern "C" int engine_cuda_trace_start(engine_cuda_trace **out, unsigned per_sm) {
    (void)per_sm;
    *out = nullptr;
    return engine_err(ENGINE_EUNSUPPORTED,
                      "cuda trace: this build has no trace (configure with -DSPARK_CUDA_TRACE=ON)");
}
extern "C" int engine_cuda_trace_stop(engine_cuda_trace *t, const char *path) {
    (void)t;
    (void)path;
    return 0;
}
#endif
