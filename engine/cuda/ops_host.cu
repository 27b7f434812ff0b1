/* Single CUDA ops on host buffers (the engine_cuda_op_* entry points of cuda_backend.h), for
 * the tests that hold every kernel against the CPU backend. Each call allocates, copies, runs
 * one op on the default stream and copies back. */
#include <cuda_fp16.h>
#include <stdlib.h>
#include <string.h>

#include "attention.cuh"
#include "common.cuh"
#include "matvec.cuh"
#include "moe.cuh"
#include "sample.cuh"

extern "C" {
#include "cuda/cuda_backend.h"
}

namespace {

/* Device allocations freed together. */
struct dev_arena {
    void *p[16];
    int n = 0;
    int rc = 0;
    ~dev_arena() {
        for (int i = 0; i < n; i++)
            cudaFree(p[i]);
    }
    template <typename T> T *put(const void *src, size_t bytes) {
        if (rc || bytes == 0) return nullptr;
        void *d = nullptr;
        cudaError_t e = cudaMalloc(&d, bytes);
        if (e == cudaSuccess) {
            p[n++] = d;
            e = src ? cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice) : cudaMemset(d, 0, bytes);
        }
        if (e != cudaSuccess) fail(e, "cudaMalloc/cudaMemcpy");
        return (T *)d;
    }
    void fail(cudaError_t e, const char *what) {
        if (!rc)
            rc = engine_err(e == cudaErrorMemoryAllocation ? ENGINE_ENOMEM : ENGINE_EINTERNAL,
                            "CUDA %s: %s", what, cudaGetErrorString(e));
        cudaGetLastError();
    }
    int get(void *dst, const void *src, size_t bytes) {
        if (rc) return rc;
        cudaError_t e = cudaDeviceSynchronize();
        if (e == cudaSuccess) e = cudaGetLastError();
        if (e == cudaSuccess) e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) fail(e, "kernel or cudaMemcpy back");
        return rc;
    }
};

/* SPARK_CUDA_OP_BPS=N (N > 0): the matvec and MoE ops run the decode stage-5 launch options (at
 * most N blocks per multiprocessor looping over their work; the down kernel routing before its
 * wait after an up launch that triggers late; the first weight chunks loaded into registers
 * before the wait); else the stage-4 launches. */
int op_bps() {
    const char *e = getenv("SPARK_CUDA_OP_BPS");
    const int n = e ? atoi(e) : 0;
    return n > 0 ? n : 0;
}

/* SPARK_CUDA_OP_TMA=1: the matvec and MoE ops copy their blocks' weight rows into shared memory
 * with bulk copies (engine_cu_mv.tma, ENGINE_CU_ROUTE_TMA, engine_cu_ffn_down_args.tma: the
 * sessions' default since session 15) where the launchers find them applicable; else loads. */
bool op_tma() {
    const char *e = getenv("SPARK_CUDA_OP_TMA");
    return e && e[0] == '1';
}

/* SPARK_CUDA_OP_RING=N (1..3): the matvec op runs ring form N (engine_cu_mv.ring, the sessions'
 * head launch) and fails with ENGINE_EUNSUPPORTED where it does not apply (engine_cu_mv_ring_bufs),
 * so that a test knows which launch it compared. */
int op_ring() {
    const char *e = getenv("SPARK_CUDA_OP_RING");
    const int v = e ? atoi(e) : 0;
    return v >= 1 && v <= 3 ? v : 0;
}

/* SPARK_CUDA_OP_SPLIT=R (0 < R < rows): the matvec op runs its rows as two matrices, rows
 * [0, R) and [R, rows), with engine_cu_mv.r3 (three-row groups in one wave where two-row groups
 * would not fit one: a session's mixer in-projections). */
int op_split(int64_t rows) {
    const char *e = getenv("SPARK_CUDA_OP_SPLIT");
    const long n = e ? strtol(e, NULL, 10) : 0;
    return n > 0 && n < rows ? (int)n : 0;
}

/* SPARK_CUDA_OP_Q6R=1 (or 4): the matvec op reads its Q6_K matrix through the output head's
 * repacked copy (matvec.cuh engine_cu_q6r_repack, type ENGINE_CU_TYPE_Q6_KR), as the sessions'
 * head launches do (=4: four rows a warp, engine_cu_mv.q6r_rows); other types are refused. */
bool op_q6r() {
    const char *e = getenv("SPARK_CUDA_OP_Q6R");
    return e && atoi(e) != 0;
}

} // namespace

extern "C" int engine_cuda_op_matvec(engine_type type, const void *w, int64_t rows, int64_t cols,
                                     size_t row_bytes, const float *x, const float *norm_w,
                                     float eps, bool accumulate, float *y) {
    int rc = engine_cuda_usable();
    if (rc) return rc;
    if (!engine_cu_type_supported(type) || cols % 32 || rows < 1 || rows > INT32_MAX)
        return engine_err(ENGINE_EINVAL, "matvec: type %d, %lld x %lld", (int)type, (long long)rows,
                          (long long)cols);
    dev_arena a;
    const uint8_t *dw = a.put<uint8_t>(w, (size_t)rows * row_bytes);
    const float *dx = a.put<float>(x, sizeof(float) * (size_t)cols);
    const float *dn = norm_w ? a.put<float>(norm_w, sizeof(float) * (size_t)cols) : nullptr;
    float *dy = a.put<float>(y, sizeof(float) * (size_t)rows);
    if (a.rc) return a.rc;
    int mtype = (int)type;
    if (op_q6r()) {
        if (type != ENGINE_TYPE_Q6_K)
            return engine_err(ENGINE_EINVAL, "matvec: SPARK_CUDA_OP_Q6R takes Q6_K, not type %d",
                              (int)type);
        const size_t rb = engine_cu_q6r_row_bytes(row_bytes);
        uint8_t *rw = a.put<uint8_t>(nullptr, (size_t)rows * rb);
        if (a.rc) return a.rc;
        engine_cu_q6r_repack(dw, row_bytes, rw, (int)rows, (int)cols, 0);
        dw = rw;
        row_bytes = rb;
        mtype = ENGINE_CU_TYPE_Q6_KR;
    }
    const char *q6e = getenv("SPARK_CUDA_OP_Q6R");
    engine_cu_mv mv;
    memset(&mv, 0, sizeof mv);
    mv.m[0] = {dw, row_bytes, mtype, (int)rows, dy, accumulate};
    mv.n_mat = 1;
    if (const int sp = op_split(rows)) {
        mv.m[0].rows = sp;
        mv.m[1] = {
            dw + (size_t)sp * row_bytes, row_bytes, mtype, (int)rows - sp, dy + sp, accumulate};
        mv.n_mat = 2;
        mv.r3 = 1;
    }
    mv.touch = 1;
    mv.max_bps = op_bps();
    if (mv.max_bps) { /* as sessions run it: no L1 touch, the first chunks preloaded */
        mv.touch = 0;
        mv.preload = 1;
    }
    mv.cols = (int)cols;
    mv.x = dx;
    mv.norm_w = dn;
    mv.eps = eps;
    mv.q6r_rows = q6e && atoi(q6e) == 4 ? 4 : 0;
    if (op_tma()) { /* as sessions run it: no L1 touch */
        mv.tma = 1;
        mv.touch = 0;
    }
    if (op_ring()) {
        size_t smem = 0;
        mv.ring = op_ring();
        mv.touch = 0;
        if (!engine_cu_mv_ring_bufs(&mv, &smem))
            return engine_err(ENGINE_EUNSUPPORTED,
                              "matvec: the ring form does not apply (type %d, %lld x %lld)", mtype,
                              (long long)rows, (long long)cols);
    }
    engine_cu_matvec(&mv, 0);
    return a.get(y, dy, sizeof(float) * (size_t)rows);
}

extern "C" int engine_cuda_op_attention(int n_head, int n_kv, int hd, int32_t pos, int32_t n_ctx,
                                        engine_kv_type kv, const void *k_cache, const void *v_cache,
                                        const float *q, const float *k, const float *v,
                                        const float *q_norm, const float *k_norm,
                                        const float *inv_freq, float eps, float *out, float *k_row,
                                        float *v_row) {
    int rc = engine_cuda_usable();
    if (rc) return rc;
    if (!engine_cu_att_head_dim_ok(hd) || !engine_cu_att_group_ok(n_head, n_kv) || pos < 0 ||
        pos >= n_ctx)
        return engine_err(ENGINE_EINVAL, "attention: bad shape");
    const size_t kv_dim = (size_t)n_kv * hd, elt = kv == ENGINE_KV_F32 ? 4 : 2;
    dev_arena a;
    uint8_t *dk = a.put<uint8_t>(nullptr, (size_t)n_ctx * kv_dim * elt);
    uint8_t *dv = a.put<uint8_t>(nullptr, (size_t)n_ctx * kv_dim * elt);
    if (a.rc) return a.rc;
    if (pos > 0) {
        cudaError_t e = cudaMemcpy(dk, k_cache, (size_t)pos * kv_dim * elt, cudaMemcpyHostToDevice);
        if (e == cudaSuccess)
            e = cudaMemcpy(dv, v_cache, (size_t)pos * kv_dim * elt, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) a.fail(e, "cudaMemcpy (cache)");
    }
    const float *dq = a.put<float>(q, sizeof(float) * (size_t)n_head * hd);
    const float *dkn = a.put<float>(k, sizeof(float) * kv_dim);
    const float *dvn = a.put<float>(v, sizeof(float) * kv_dim);
    const float *dqw = a.put<float>(q_norm, sizeof(float) * hd);
    const float *dkw = a.put<float>(k_norm, sizeof(float) * hd);
    float *tab = (float *)malloc(sizeof(float) * (size_t)n_ctx * hd);
    if (!tab) return engine_err(ENGINE_ENOMEM, "out of memory");
    engine_cu_rope_table(tab, inv_freq, hd, n_ctx);
    const float2 *dif = a.put<float2>(tab, sizeof(float) * (size_t)n_ctx * hd);
    free(tab);
    const int32_t *dpos = a.put<int32_t>(&pos, sizeof pos);
    float *dpart = a.put<float>(nullptr, sizeof(float) * n_head *
                                             (size_t)engine_cu_att_max_splits(n_ctx) * (hd + 2));
    unsigned *dcnt = a.put<unsigned>(nullptr, sizeof(unsigned) * n_head);
    float *dout = a.put<float>(nullptr, sizeof(float) * (size_t)n_head * hd);
    if (a.rc) return a.rc;
    engine_cu_att at = {dq, dkn,  dvn,   dqw,    dkw,  dif, eps,   0,    dk,  dv,
                        kv == ENGINE_KV_F32, 0, dpos, n_ctx, n_head, n_kv, hd, dpart, dcnt, dout};
    { /* SPARK_CUDA_OP_ATT_SHORT=1 [SPARK_CUDA_OP_ATT_LONG=N]: the sessions' launch (their
       * default; SPARK_CUDA_ATT_LONG) (attention.cuh); else the per-KV-head launch */
        const char *e = getenv("SPARK_CUDA_OP_ATT_SHORT");
        at.short_path = e && e[0] == '1';
        e = getenv("SPARK_CUDA_OP_ATT_LONG");
        at.long_splits = e ? (atoi(e) + ENGINE_CU_ATT_SPLIT - 1) / ENGINE_CU_ATT_SPLIT : 0;
        if (at.long_splits < 0 || at.long_splits > ENGINE_CU_ATT_SPLIT) at.long_splits = 0;
    }
    engine_cu_attention(&at, 0);
    if ((rc = a.get(out, dout, sizeof(float) * (size_t)n_head * hd))) return rc;
    /* the stored row, widened to F32 */
    void *row = malloc(2 * kv_dim * elt);
    if (!row) return engine_err(ENGINE_ENOMEM, "out of memory");
    rc = a.get(row, dk + (size_t)pos * kv_dim * elt, kv_dim * elt);
    if (!rc)
        rc = a.get((uint8_t *)row + kv_dim * elt, dv + (size_t)pos * kv_dim * elt, kv_dim * elt);
    for (size_t i = 0; !rc && i < kv_dim; i++) {
        if (kv == ENGINE_KV_F32) {
            k_row[i] = ((float *)row)[i];
            v_row[i] = ((float *)row)[kv_dim + i];
        } else {
            __half_raw hk, hv;
            hk.x = ((uint16_t *)row)[i];
            hv.x = ((uint16_t *)row)[kv_dim + i];
            k_row[i] = __half2float(__half(hk));
            v_row[i] = __half2float(__half(hv));
        }
    }
    free(row);
    return rc;
}

extern "C" int engine_cuda_op_moe(engine_type type, int n_expert, int k, bool norm_topk, int n_embd,
                                  int n_ff, const float *router, const void *gate, const void *up,
                                  const void *down, size_t row_bytes_in, size_t row_bytes_ff,
                                  const float *norm_w, float eps, float *x, int32_t *ids,
                                  float *weights) {
    int rc = engine_cuda_usable();
    if (rc) return rc;
    if (!engine_cu_type_supported(type) || k < 1 || k > ENGINE_CU_MAX_EXPERT_USED || k > n_expert ||
        n_expert > ENGINE_CU_MAX_EXPERT || n_embd % 32 || n_ff % 32)
        return engine_err(ENGINE_EINVAL, "moe: bad shape");
    dev_arena a;
    size_t ge = (size_t)n_ff * row_bytes_in, de = (size_t)n_embd * row_bytes_ff;
    const float *dr = a.put<float>(router, sizeof(float) * n_expert);
    const uint8_t *dg = a.put<uint8_t>(gate, ge * n_expert);
    const uint8_t *du = a.put<uint8_t>(up, ge * n_expert);
    const uint8_t *dd = a.put<uint8_t>(down, de * n_expert);
    const float *dn = a.put<float>(norm_w, sizeof(float) * n_embd);
    float *dx = a.put<float>(x, sizeof(float) * n_embd);
    float *dh = a.put<float>(nullptr, sizeof(float) * (size_t)k * n_ff);
    int32_t *di = a.put<int32_t>(nullptr, sizeof(int32_t) * k);
    float *dw = a.put<float>(nullptr, sizeof(float) * k);
    if (a.rc) return a.rc;
    engine_cu_ffn_up_args u;
    memset(&u, 0, sizeof u);
    u.router = dr;
    u.n_expert = n_expert;
    u.k = k;
    u.norm_topk = norm_topk;
    u.gate = dg;
    u.up = du;
    u.expert_bytes = ge;
    u.row_bytes = row_bytes_in;
    u.type = type;
    u.cols = n_embd;
    u.rows = n_ff;
    u.x = dx;
    u.norm_w = dn;
    u.eps = eps;
    u.h = dh;
    u.ids = di;
    u.weights = dw;
    engine_cu_ffn_down_args d;
    memset(&d, 0, sizeof d);
    d.down = dd;
    d.expert_bytes = de;
    d.row_bytes = row_bytes_ff;
    d.type = (int)type;
    d.cols = n_ff;
    d.rows = n_embd;
    d.k = k;
    d.h = dh;
    d.ids = di;
    d.weights = dw;
    d.y = dx;
    d.touch = 1;
    if ((u.max_bps = d.max_bps = op_bps())) {
        u.trigger_late = 1;
        d.router = dr;
        d.n_expert = n_expert;
        d.norm_topk = norm_topk;
        d.touch = 0;
        d.preload = 1;
    }
    if (op_tma() && !u.max_bps) {
        u.route = ENGINE_CU_ROUTE_TMA;
        d.tma = 1;
        d.touch = 0;
    }
    engine_cu_ffn_up(&u, 0);
    engine_cu_ffn_down(&d, 0);
    if ((rc = a.get(x, dx, sizeof(float) * n_embd))) return rc;
    if ((rc = a.get(ids, di, sizeof(int32_t) * k))) return rc;
    return a.get(weights, dw, sizeof(float) * k);
}

extern "C" int engine_cuda_op_route(const float *logits, int n, int k, bool norm_topk, int flags,
                                    int32_t *ids, float *weights) {
    int rc = engine_cuda_usable();
    if (rc) return rc;
    if (n < 1 || n > ENGINE_CU_MAX_EXPERT || k < 1 || k > n || k > ENGINE_CU_MAX_EXPERT_USED)
        return engine_err(ENGINE_EINVAL, "route: %d of %d logits", k, n);
    dev_arena a;
    const float *dl = a.put<float>(logits, sizeof(float) * (size_t)n);
    int32_t *di = a.put<int32_t>(nullptr, sizeof(int32_t) * (size_t)k);
    float *dw = a.put<float>(nullptr, sizeof(float) * (size_t)k);
    if (a.rc) return a.rc;
    engine_cu_route_test(dl, n, k, norm_topk, flags, di, dw, 0);
    if ((rc = a.get(ids, di, sizeof(int32_t) * (size_t)k))) return rc;
    return a.get(weights, dw, sizeof(float) * (size_t)k);
}

extern "C" int engine_cuda_op_sample_topk(const float *logits, int n, const engine_cuda_sampling *p,
                                          int32_t step, int32_t *out, double *u) {
    int rc = engine_cuda_usable();
    if (rc) return rc;
    if (n < 1 || n > ENGINE_CU_SAMPLE_BLOCKS * ENGINE_CU_TOPK_SLICE || p->temperature <= 0.0f ||
        p->top_k < 1 || p->top_k > ENGINE_CU_TOPK_MAX)
        return engine_err(ENGINE_EINVAL, "sample_topk: %d logits, top_k %d, T %g", n, p->top_k,
                          (double)p->temperature);
    engine_cu_step hs;
    memset(&hs, 0, sizeof hs);
    hs.n_out = step;
    hs.out_cap = step + 1;
    hs.seed = p->seed;
    hs.temp = p->temperature;
    hs.top_k = p->top_k;
    hs.top_p = p->top_p;
    hs.min_p = p->min_p;
    hs.tk_algo = engine_cu_topk_algo_env();
    dev_arena a;
    const float *dl = a.put<float>(logits, sizeof(float) * (size_t)n);
    engine_cu_step *ds = a.put<engine_cu_step>(&hs, sizeof hs);
    int32_t *dout = a.put<int32_t>(nullptr, sizeof(int32_t) * (size_t)(step + 1));
    float *dsc = a.put<float>(nullptr, sizeof(float) * 2 * ENGINE_CU_SAMPLE_BLOCKS);
    uint64_t *dk = a.put<uint64_t>(nullptr, sizeof(uint64_t) * ENGINE_CU_TOPK_KEYS);
    unsigned *dc = a.put<unsigned>(nullptr, sizeof(unsigned));
    if (a.rc) return a.rc;
    if (cudaError_t e = engine_cu_sample_topk_prepare()) {
        a.fail(e, "cudaFuncSetAttribute (sample_topk)");
        return a.rc;
    }
    engine_cu_sample_topk(dl, n, ds, dout, dsc, dk, dc, 0);
    if ((rc = a.get(&hs, ds, sizeof hs))) return rc;
    *out = hs.token;
    *u = engine_cu_key_uniform(engine_cu_draw_key(p->seed, step));
    return 0;
}

extern "C" int engine_cuda_op_sample(const float *logits, int n, float temperature, uint64_t seed,
                                     int32_t step, int32_t *out) {
    int rc = engine_cuda_usable();
    if (rc) return rc;
    if (n < 1) return engine_err(ENGINE_EINVAL, "sample: %d logits", n);
    engine_cu_step hs;
    memset(&hs, 0, sizeof hs);
    hs.n_out = step;
    hs.out_cap = step + 1;
    hs.seed = seed;
    hs.temp = temperature;
    dev_arena a;
    const float *dl = a.put<float>(logits, sizeof(float) * (size_t)n);
    engine_cu_step *ds = a.put<engine_cu_step>(&hs, sizeof hs);
    int32_t *dout = a.put<int32_t>(nullptr, sizeof(int32_t) * (size_t)(step + 1));
    float *dsc = a.put<float>(nullptr, sizeof(float) * 2 * ENGINE_CU_SAMPLE_BLOCKS);
    unsigned *dc = a.put<unsigned>(nullptr, sizeof(unsigned));
    if (a.rc) return a.rc;
    engine_cu_sample(dl, n, ds, dout, dsc, dc, 0);
    if ((rc = a.get(&hs, ds, sizeof hs))) return rc;
    *out = hs.token;
    return 0;
}
