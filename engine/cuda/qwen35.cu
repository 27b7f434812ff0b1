/* qwen35moe on the CUDA backend: weight upload, decode sessions with the recurrent state on the
 * device, the decode step as one CUDA graph, rollback through state snapshots (contracts in
 * cuda_backend.h, the engine_cuda_q35_* calls).
 *
 * The step, every launch with programmatic dependent launch:
 *   embed | per block:
 *     DeltaNet: qkv, z, beta|alpha (attn_norm fused; one launch) | deltanet step (conv, l2
 *       norms, gates, delta rule, gated RMSNorm, snapshots) | out_proj (+= residual)
 *     attention: [q|gate], k, v (attn_norm fused) | attention (q/k norm, partial rope, KV
 *       store, split softmax, output gate) | o_proj (+= residual)
 *     MoE: router + shared-expert gate logit (post_norm fused) | routed gate/up (routing fused)
 *       | shared gate/up | shared gate sigmoid | down of the k routed experts and the shared
 *       one in one launch (+ weighted combine + residual; the shared down matrix is uploaded as
 *       expert X of the routed stack when its shape and type allow, else a second launch)
 *   head (output_norm fused) | sample
 * The token and position live in device memory (engine_cu_step) as in backend.cu. */
#include <algorithm>
#include <cuda_fp16.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.cuh" /* engine_cu_rope_table */
#include "common.cuh"
#include "deltanet.cuh"
#include "matvec.cuh"
#include "moe.cuh"
#include "q35_prefill.cuh"
#include "qdot.cuh"
#include "qwen35_attn.cuh"
#include "router_fuse.cuh"
#include "sample.cuh"

extern "C" {
#include "cuda/cuda_backend.h"
#include "model/model_int.h"
}

#define Q35_MAX_STAGE_BYTES (96 * 1024) /* as backend.cu: sm_120 gives a block 99 KB */

typedef struct {
    const uint8_t *d; /* device: row 0 (of expert 0 for a stack) */
    int type, cols, rows;
    size_t row_bytes;
} q35_w;

typedef struct {
    bool attn;
    int slot; /* index among the attention or the DeltaNet blocks */
    const float *attn_norm, *post_norm, *q_norm, *k_norm, *conv, *dt_bias, *a, *ssm_norm;
    q35_w wq, wk, wv, wo, wqkv, wz, wba, walpha, wout;
    bool ba_fused; /* wba holds beta's rows then alpha's (walpha unused) */
    q35_w router, shg;
    q35_w gate_exps, up_exps, down_exps; /* stacks of X (down: X + 1 when merged) experts */
    q35_w gate_sh, up_sh, down_sh;
    bool down_merged; /* the shared down matrix is expert X of down_exps */
} q35_cl;

/* Dimensions of the model, from its hyper-parameters. */
typedef struct {
    int E, V, nh, nkv, hd, rot, nk, nv, dk, dv, K, C, di, X, k, F, Fs, n_layer;
} q35_dims;

struct engine_cuda_q35_model {
    const engine_model *m;
    int device;
    uint8_t *mem;
    size_t bytes;
    q35_dims d;
    q35_cl *layers;
    q35_w tok_embd, output;
    /* the head's repacked copy (matvec.cuh engine_cu_head_copy; d NULL: none), in head_mem */
    q35_w output_r;
    uint8_t *head_mem;
    const float *output_norm, *inv_freq;
    int n_lin, n_attn;
    bool v_tiled;
    /* the MTP block (q35_mtp_host.cuh): layers[n_layer], its fc and norms */
    bool has_mtp;
    q35_w mtp_eh;
    const float *mtp_enorm, *mtp_hnorm, *mtp_norm;
    /* Router fusion (router_fuse.cuh; SPARK_CUDA_Q35_ROUTER_FUSE), built at the first session
     * that asks for it (q35_rf_prepare): per block [R | M] of X + 1 rows (the router's X and the
     * shared-expert gate's 1, post_norm folded in; M = R times the block's out_proj or o_proj),
     * layer l's at rf_mem + rf_off[l]. rf_state: 0 not built, 1 built, -1 not applicable. */
    float *rf_mem;
    size_t *rf_off;
    int rf_state;
};

static q35_dims q35_dims_of(const engine_hparams *hp) {
    q35_dims d;
    d.E = (int)hp->n_embd;
    d.V = (int)hp->n_vocab;
    d.nh = (int)hp->n_head;
    d.nkv = (int)hp->n_head_kv;
    d.hd = (int)hp->head_dim_k;
    d.rot = (int)hp->n_rot;
    d.nk = (int)hp->ssm_n_group;
    d.nv = (int)hp->ssm_dt_rank;
    d.dk = d.dv = (int)hp->ssm_d_state;
    d.K = (int)hp->ssm_d_conv;
    d.di = (int)hp->ssm_d_inner;
    d.C = 2 * d.nk * d.dk + d.di;
    d.X = (int)hp->n_expert;
    d.k = (int)hp->n_expert_used;
    d.F = (int)hp->n_ff_exp;
    d.Fs = (int)hp->n_ff_shexp;
    d.n_layer = (int)hp->n_layer;
    return d;
}

static int q35_cu_err(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    cudaGetLastError();
    return engine_err(e == cudaErrorMemoryAllocation ? ENGINE_ENOMEM : ENGINE_EINTERNAL,
                      "CUDA %s: %s", what, cudaGetErrorString(e));
}

#define CU(call)                                                                                   \
    do {                                                                                           \
        if ((rc = q35_cu_err((call), #call))) goto done;                                           \
    } while (0)

static size_t q35_align(size_t n) {
    return (n + 255) & ~(size_t)255;
}

static size_t q35_stage(int type, int n) {
    return engine_cu_xs_bytes(engine_cu_type_quant(type), n);
}

/* ---------------------------------------------------------------------------------------------
 * Upload: a planning pass (dry: offsets only) and a copying pass over the same calls.
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    engine_cuda_q35_model *cm;
    bool dry;
    size_t off, done, total, next_report;
    int rc;
} q35_up;

/* n bytes of device memory (NULL in the dry pass). */
static uint8_t *q35_reserve(q35_up *u, size_t n) {
    uint8_t *d = u->dry ? NULL : u->cm->mem + u->off;
    u->off += q35_align(n);
    return d;
}

static void q35_copy(q35_up *u, uint8_t *dst, const void *src, size_t n) {
    if (u->dry || u->rc || !src || n == 0) return;
    for (size_t o = 0; o < n && !u->rc; o += (size_t)256 << 20) {
        size_t c = std::min(n - o, (size_t)256 << 20);
        u->rc = q35_cu_err(cudaMemcpy(dst + o, (const uint8_t *)src + o, c, cudaMemcpyHostToDevice),
                           "cudaMemcpy (weights)");
        u->done += c;
        if (u->done >= u->next_report) {
            engine_log(ENGINE_LOG_INFO, "cuda: uploading weights %3.0f%% (%.2f of %.2f GB)",
                       100.0 * (double)u->done / (double)u->total, (double)u->done / 1e9,
                       (double)u->total / 1e9);
            u->next_report += u->total / 10 + 1;
        }
    }
}

static q35_w q35_desc(const engine_weight *w) {
    q35_w o = {NULL, (int)w->type, (int)w->cols, (int)w->rows, w->row_bytes};
    return o;
}

static q35_w q35_put_w(q35_up *u, const engine_weight *w) {
    q35_w o = q35_desc(w);
    size_t n = (size_t)w->rows * w->row_bytes;
    o.d = q35_reserve(u, n);
    q35_copy(u, (uint8_t *)o.d, w->data, n);
    return o;
}

static const float *q35_put_f(q35_up *u, const float *src, size_t n) {
    uint8_t *d = q35_reserve(u, n * sizeof(float));
    q35_copy(u, d, src, n * sizeof(float));
    return (const float *)d;
}

/* An expert stack made contiguous: expert e of w (matrix `which` of exp_ptr, or data + e *
 * stride_rows rows), then `extra` (NULL or one more matrix of the same shape). */
static q35_w q35_put_stack(q35_up *u, const engine_weight *w, int X, int64_t stride_rows,
                           const uint8_t *const *exp_ptr, int which, const engine_weight *extra) {
    q35_w o = q35_desc(w);
    const size_t eb = (size_t)w->rows * w->row_bytes;
    uint8_t *d = q35_reserve(u, eb * (size_t)(X + (extra ? 1 : 0)));
    o.d = d;
    if (!exp_ptr && stride_rows == w->rows) {
        q35_copy(u, d, w->data, eb * (size_t)X);
    } else {
        for (int e = 0; e < X; e++) {
            const uint8_t *src =
                exp_ptr ? exp_ptr[(size_t)which * X + e]
                        : (const uint8_t *)w->data + (size_t)e * (size_t)stride_rows * w->row_bytes;
            q35_copy(u, u->dry ? NULL : d + (size_t)e * eb, src, eb);
        }
    }
    if (extra) q35_copy(u, u->dry ? NULL : d + (size_t)X * eb, extra->data, eb);
    return o;
}

static int q35_check_w(const engine_model *m, const engine_weight *w, uint32_t l,
                       const char *what) {
    if (!w->data) return engine_err(ENGINE_EFORMAT, "%s: blk.%u.%s is missing", m->path, l, what);
    if (!engine_cu_type_supported(w->type))
        return engine_err(ENGINE_EUNSUPPORTED, "%s: blk.%u.%s of type %s has no CUDA kernel",
                          m->path, l, what, engine_type_name(w->type));
    if (w->cols % 32 != 0 || w->rows > INT32_MAX || w->cols > INT32_MAX)
        return engine_err(ENGINE_EUNSUPPORTED,
                          "%s: blk.%u.%s has rows of %lld values (the CUDA kernels need a "
                          "multiple of 32)",
                          m->path, l, what, (long long)w->cols);
    return 0;
}

/* MTP (q35_mtp_host.cuh, included at the end of this file) */
typedef struct q35_spec q35_spec;
static void q35_mtp_upload(q35_up *u);
static int q35_mtp_check(engine_cuda_q35_model *cm);

/* Plan (dry) or upload every weight; also fills the layer records. */
static int q35_upload_all(q35_up *u) {
    engine_cuda_q35_model *cm = u->cm;
    const engine_model *m = cm->m;
    const q35_dims *d = &cm->d;
    cm->n_lin = cm->n_attn = 0;
    for (int l = 0; l < d->n_layer + (cm->has_mtp ? 1 : 0); l++) {
        engine_q35_layer_w w;
        engine_q35_layer_weights(m, (uint32_t)l, &w);
        q35_cl *cl = &cm->layers[l];
        memset(cl, 0, sizeof *cl);
        cl->attn = w.attn;
        cl->slot = l == d->n_layer ? -1 : w.attn ? cm->n_attn++ : cm->n_lin++; /* -1: MTP */
        cm->v_tiled = w.v_tiled;
        cm->inv_freq = w.rope_inv_freq;
        cl->attn_norm = q35_put_f(u, w.attn_norm, (size_t)d->E);
        cl->post_norm = q35_put_f(u, w.post_norm, (size_t)d->E);
        if (w.attn) {
            cl->q_norm = q35_put_f(u, w.q_norm, (size_t)d->hd);
            cl->k_norm = q35_put_f(u, w.k_norm, (size_t)d->hd);
            cl->wq = q35_put_w(u, &w.wq);
            cl->wk = q35_put_w(u, &w.wk);
            cl->wv = q35_put_w(u, &w.wv);
            cl->wo = q35_put_w(u, &w.wo);
        } else {
            cl->conv = q35_put_f(u, w.conv, (size_t)d->C * d->K);
            cl->dt_bias = q35_put_f(u, w.dt_bias, (size_t)d->nv);
            cl->a = q35_put_f(u, w.a, (size_t)d->nv);
            cl->ssm_norm = q35_put_f(u, w.ssm_norm, (size_t)d->dv);
            cl->wqkv = q35_put_w(u, &w.wqkv);
            cl->wz = q35_put_w(u, &w.wz);
            cl->wout = q35_put_w(u, &w.wout);
            cl->ba_fused = w.wbeta.type == w.walpha.type && w.wbeta.row_bytes == w.walpha.row_bytes;
            if (cl->ba_fused) { /* beta's rows then alpha's: one matrix of 2 nv rows */
                size_t n = (size_t)w.wbeta.rows * w.wbeta.row_bytes;
                cl->wba = q35_desc(&w.wbeta);
                cl->wba.rows *= 2;
                uint8_t *p = q35_reserve(u, 2 * n);
                cl->wba.d = p;
                q35_copy(u, p, w.wbeta.data, n);
                q35_copy(u, u->dry ? NULL : p + n, w.walpha.data, n);
            } else {
                cl->wba = q35_put_w(u, &w.wbeta);
                cl->walpha = q35_put_w(u, &w.walpha);
            }
        }
        cl->router = q35_put_w(u, &w.gate_inp);
        cl->shg.type = ENGINE_TYPE_F32;
        cl->shg.cols = d->E;
        cl->shg.rows = 1;
        cl->shg.row_bytes = sizeof(float) * (size_t)d->E;
        cl->shg.d = (const uint8_t *)q35_put_f(u, w.gate_inp_shexp, (size_t)d->E);
        cl->gate_exps = q35_put_stack(u, &w.gate_exps, d->X, w.gu_stride, w.exp_ptr, 0, NULL);
        cl->up_exps = q35_put_stack(u, &w.up_exps, d->X, w.gu_stride, w.exp_ptr, 1, NULL);
        cl->down_merged = d->F == d->Fs && w.down_shexp.type == w.down_exps.type &&
                          w.down_shexp.row_bytes == w.down_exps.row_bytes &&
                          w.down_shexp.rows == w.down_exps.rows;
        cl->down_exps = q35_put_stack(u, &w.down_exps, d->X, w.down_exps.rows, w.exp_ptr, 2,
                                      cl->down_merged ? &w.down_shexp : NULL);
        cl->gate_sh = q35_put_w(u, &w.gate_shexp);
        cl->up_sh = q35_put_w(u, &w.up_shexp);
        if (!cl->down_merged) cl->down_sh = q35_put_w(u, &w.down_shexp);
        if (u->rc) return u->rc;
    }
    cm->tok_embd = q35_put_w(u, &m->tok_embd);
    if (m->output.data == m->tok_embd.data)
        cm->output = cm->tok_embd;
    else
        cm->output = q35_put_w(u, &m->output);
    cm->output_norm = q35_put_f(u, m->output_norm, (size_t)d->E);
    q35_mtp_upload(u);
    return u->rc;
}

/* Everything the kernels cannot take, as a clear error before any allocation. */
static int q35_check(const engine_model *m, const q35_dims *d) {
    const engine_hparams *hp = &m->hp;
    if (!m->q35) return engine_err(ENGINE_EINVAL, "%s: no qwen35moe weights loaded", m->path);
    if (!engine_cu_deltanet_ok(d->dk, d->dv, d->K))
        return engine_err(ENGINE_EUNSUPPORTED,
                          "%s: DeltaNet heads of %d x %d with a conv kernel of %d have no CUDA "
                          "kernel (multiples of 32, dk <= 512, kernel <= %d)",
                          m->path, d->dk, d->dv, d->K, ENGINE_CU_DELTA_MAX_CONV);
    if (!engine_cu_gatt_ok(d->nh, d->nkv, d->hd, d->rot))
        return engine_err(ENGINE_EUNSUPPORTED,
                          "%s: attention of %d query / %d KV heads of %d (%d rotated) has no "
                          "CUDA kernel (head size a multiple of 32 up to 256, at most %d query "
                          "heads per KV head)",
                          m->path, d->nh, d->nkv, d->hd, d->rot, ENGINE_CU_GATT_MAX_GROUP);
    if (d->X > ENGINE_CU_MAX_EXPERT || d->k + 1 > ENGINE_CU_MAX_EXPERT_USED || d->k < 1)
        return engine_err(ENGINE_EUNSUPPORTED,
                          "%s: %d experts, %d per token (the CUDA kernels take at most %d, and "
                          "%d per token with the shared one)",
                          m->path, d->X, d->k, ENGINE_CU_MAX_EXPERT, ENGINE_CU_MAX_EXPERT_USED);
    size_t stage = 0;
    for (uint32_t l = 0; l < hp->n_layer + (engine_q35_has_mtp(m) ? 1u : 0u); l++) {
        engine_q35_layer_w w;
        engine_q35_layer_weights(m, l, &w);
        int rc;
        struct {
            const engine_weight *w;
            const char *name;
            int in; /* the activation length it stages */
        } mats[] = {
            {&w.gate_inp, "ffn_gate_inp", d->E},
            {&w.gate_exps, "ffn_gate_exps", d->E},
            {&w.up_exps, "ffn_up_exps", d->E},
            {&w.down_exps, "ffn_down_exps", 0},
            {&w.gate_shexp, "ffn_gate_shexp", d->E},
            {&w.up_shexp, "ffn_up_shexp", d->E},
            {&w.down_shexp, "ffn_down_shexp", d->Fs},
            {w.attn ? &w.wq : &w.wqkv, w.attn ? "attn_q" : "attn_qkv", d->E},
            {w.attn ? &w.wk : &w.wz, w.attn ? "attn_k" : "attn_gate", d->E},
            {w.attn ? &w.wv : &w.wbeta, w.attn ? "attn_v" : "ssm_beta", d->E},
            {w.attn ? &w.wo : &w.wout, w.attn ? "attn_output" : "ssm_out", 0},
            {w.attn ? &w.wv : &w.walpha, w.attn ? "attn_v" : "ssm_alpha", d->E},
        };
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
            if ((rc = q35_check_w(m, mats[i].w, l, mats[i].name))) return rc;
            int n = mats[i].in ? mats[i].in : (int)mats[i].w->cols;
            stage = std::max(stage, q35_stage(mats[i].w->type, n));
        }
        stage = std::max(stage, q35_stage(w.down_exps.type, (d->k + 1) * (int)w.down_exps.cols));
        if (w.gate_exps.type != w.up_exps.type || w.gate_shexp.type != w.up_shexp.type)
            return engine_err(ENGINE_EUNSUPPORTED,
                              "%s: blk.%u: gate and up matrices of different types have no CUDA "
                              "kernel",
                              m->path, l);
    }
    if (!m->output.data || !m->tok_embd.data || !engine_cu_type_supported(m->output.type) ||
        !engine_cu_type_supported(m->tok_embd.type) || m->output.cols % 32)
        return engine_err(ENGINE_EUNSUPPORTED,
                          "%s: the embedding or output head has no CUDA kernel", m->path);
    stage = std::max(stage, q35_stage(m->output.type, d->E));
    if (stage > Q35_MAX_STAGE_BYTES)
        return engine_err(ENGINE_EUNSUPPORTED,
                          "%s: an activation vector needs %zu bytes of shared memory in the "
                          "CUDA kernels (at most %d)",
                          m->path, stage, Q35_MAX_STAGE_BYTES);
    return 0;
}

extern "C" int engine_cuda_q35_model_new(engine_cuda_q35_model **out, const engine_model *m,
                                         int device) {
    *out = NULL;
    int rc = engine_cuda_usable();
    if (rc) return rc;
    if (m->hp.arch != ENGINE_ARCH_QWEN35MOE)
        return engine_err(ENGINE_EINVAL, "%s: not a qwen35moe model", m->path);
    q35_dims d = q35_dims_of(&m->hp);
    if ((rc = q35_check(m, &d))) return rc;
    size_t free_b = 0, total_b = 0;
    engine_cuda_q35_model *cm = (engine_cuda_q35_model *)calloc(1, sizeof *cm);
    if (!cm) return engine_err(ENGINE_ENOMEM, "out of memory");
    cm->m = m;
    cm->device = device;
    cm->d = d;
    if ((rc = q35_mtp_check(cm))) goto done;
    q35_up u;
    memset(&u, 0, sizeof u);
    u.cm = cm;
    u.dry = true;
    if (!(cm->layers = (q35_cl *)calloc((size_t)d.n_layer + 1, sizeof(q35_cl)))) {
        rc = engine_err(ENGINE_ENOMEM, "out of memory");
        goto done;
    }
    if ((rc = q35_upload_all(&u))) goto done;
    cm->bytes = u.off;
    CU(cudaSetDevice(device));
    CU(cudaMemGetInfo(&free_b, &total_b));
    engine_log(ENGINE_LOG_INFO,
               "cuda: memory plan (qwen35moe): weights %.2f GB; device %d has %.2f GB free of "
               "%.2f GB",
               (double)cm->bytes / 1e9, device, (double)free_b / 1e9, (double)total_b / 1e9);
    if (cm->bytes + ((size_t)256 << 20) > free_b) {
        rc = engine_err(ENGINE_ENOMEM,
                        "%s: the weights need %.2f GB of GPU memory (+0.27 GB reserve) but GPU "
                        "%d has %.2f GB free",
                        m->path, (double)cm->bytes / 1e9, device, (double)free_b / 1e9);
        goto done;
    }
    CU(cudaMalloc((void **)&cm->mem, cm->bytes));
    u.dry = false;
    u.off = 0;
    u.total = cm->bytes;
    if ((rc = q35_upload_all(&u))) goto done;
    ENGINE_ASSERT(u.off == cm->bytes);
    if (cm->output.d != cm->tok_embd.d &&
        (rc = engine_cu_head_copy_view(cm->output, &cm->output_r, &cm->head_mem)))
        goto done;
    *out = cm;
    cm = NULL;
done:
    engine_cuda_q35_model_free(cm);
    return rc;
}

extern "C" void engine_cuda_q35_model_free(engine_cuda_q35_model *cm) {
    if (!cm) return;
    if (cm->mem || cm->rf_mem || cm->head_mem) {
        cudaSetDevice(cm->device);
        cudaFree(cm->mem);
        cudaFree(cm->rf_mem);
        cudaFree(cm->head_mem);
    }
    free(cm->rf_off);
    free(cm->layers);
    free(cm);
}

extern "C" size_t engine_cuda_q35_model_weight_bytes(const engine_cuda_q35_model *cm) {
    return cm->bytes;
}

static size_t q35_mat_bytes(const q35_w *w) {
    return (size_t)w->rows * w->row_bytes;
}

extern "C" size_t engine_cuda_q35_model_bytes_per_token(const engine_cuda_q35_model *cm) {
    const q35_dims *d = &cm->d;
    size_t b = cm->tok_embd.row_bytes + q35_mat_bytes(&cm->output);
    for (int l = 0; l < d->n_layer; l++) {
        const q35_cl *c = &cm->layers[l];
        if (c->attn)
            b += q35_mat_bytes(&c->wq) + q35_mat_bytes(&c->wk) + q35_mat_bytes(&c->wv) +
                 q35_mat_bytes(&c->wo);
        else
            b += q35_mat_bytes(&c->wqkv) + q35_mat_bytes(&c->wz) + q35_mat_bytes(&c->wba) +
                 q35_mat_bytes(&c->walpha) + q35_mat_bytes(&c->wout);
        b += q35_mat_bytes(&c->router) + q35_mat_bytes(&c->shg) +
             (size_t)d->k * (q35_mat_bytes(&c->gate_exps) + q35_mat_bytes(&c->up_exps) +
                             q35_mat_bytes(&c->down_exps)) +
             q35_mat_bytes(&c->gate_sh) + q35_mat_bytes(&c->up_sh) +
             (c->down_merged ? q35_mat_bytes(&c->down_exps) : q35_mat_bytes(&c->down_sh));
    }
    return b;
}

/* ---------------------------------------------------------------------------------------------
 * Sessions
 * ------------------------------------------------------------------------------------------- */
struct engine_cuda_q35_session {
    engine_cuda_q35_model *cm;
    int32_t n_ctx;
    engine_kv_type kv;
    cudaStream_t stream;
    cudaGraphExec_t exec;
    bool captured;
    uint8_t *mem;
    size_t bytes;
    void **k_cache, **v_cache;               /* [n_attn] */
    float *ring, *state;                     /* [n_lin][C][K], [n_lin][nv][dk][dv] */
    float *snap;                             /* [SNAPSHOTS][ring | state] */
    size_t ring_per, state_per, snap_stride; /* floats */
    int32_t snap_pos[ENGINE_CUDA_Q35_SNAPSHOTS];
    float *x, *big, *z, *ba, *k, *v, *att, *router, *shl, *h, *logits, *partial, *sscratch;
    float *wts, *rope, *dssq; /* dssq: the DeltaNet step's [nv][dv / 32] sums of squares */
    /* router fusion: the mixer's output projection, apart from x */
    float *ao;
    engine_cuda_q35_prefill *pf; /* the prefill serving MTP prompts (q35_mtp_host.cuh), or NULL */
    int32_t *ids, *out;
    unsigned *counters; /* [n_kv + 1 + nv]: attention, sampler, DeltaNet step */
    engine_cu_step *step, *h_step;
    q35_spec *spec; /* MTP buffers and graphs, NULL until enabled (q35_mtp_host.cuh) */
    /* Diagnosis only (wrong results): SPARK_CUDA_DIAG_SKIP / SPARK_CUDA_DIAG_TWICE, bit masks
     * (Q35_DIAG_*) of the decode step's per-block launch kinds left out of / launched twice in
     * the captured step (and the profile), read at session creation, so that an A/B of the
     * timing gives each op's cost on the graph's critical path
     * (bench_q35 -e "SPARK_CUDA_DIAG_SKIP=16"). The MTP passes ignore them. */
    unsigned diag_skip, diag_twice;
    /* SPARK_CUDA_Q35_ATT_SHORT (read at session creation; default on, =0 off): positions
     * n <= att_short take the gated attention's short path (engine_cu_gatt.short_n,
     * qwen35_attn.cuh: a block per query head, bit for bit the split path) */
    int att_short;
    /* SPARK_CUDA_Q35_SH_FORK (read at session creation; default on, =0 off): the shared expert's
     * gate/up launch on a side branch of the captured step (side stream, fork after the mixer's
     * out projection, join before the down launch), parallel to router + routed gate/up instead
     * of after them; NULL / 0 when off. The un-captured profile keeps the single chain. */
    cudaStream_t side;
    cudaEvent_t ev_fork, ev_join;
    int sh_fork;
    int diag_moe; /* SPARK_CUDA_DIAG_MOE (backend.cu): engine_cu_ffn_up_args.diag */
    int route;    /* SPARK_CUDA_ROUTE (backend.cu): engine_cu_ffn_up_args.route */
    int coop;     /* SPARK_CUDA_COOP_SCALE (backend.cu): engine_cu_ffn_up_args.coop */
    /* SPARK_CUDA_COOP_MV=1 (backend.cu; no gain measured in session 8): engine_cu_mv.coop of
     * the normed launches, the verify pass's alike (q35_mtp_host.cuh q35m_vmv) */
    int coop_mv;
    /* SPARK_CUDA_MV_R3 (read at session creation; default on, =0 off): engine_cu_mv.r3 of the
     * decode step's matvecs (the mixers' in-projections: one wave of three-row groups).
     * Session 9 call 1 (bench/cuda/s9a.plan): test_cuda_ops' two-matrix case green, full model
     * 465.7 against 451.4 tok/s (+3.2%, same process), greedy tokens identical. */
    int mv_r3;
    /* the head launches (decode, MTP drafts and verify passes) read the model's repacked copy
     * (matvec.cuh engine_cu_head_copy_wanted: SPARK_CUDA_HEAD_REPACK, default on) */
    bool head_r;
    int head_rows; /* engine_cu_mv.q6r_rows (engine_cu_head_rows_env: SPARK_CUDA_HEAD_ROWS) */
    int head_ring; /* engine_cu_mv.ring of the decode head (engine_cu_head_ring_env) */
    /* SPARK_CUDA_Q35_Z_FORK (read at session creation; default on, =0 off): the DeltaNet blocks' z
     * projection (only the step's last phase reads it) on the side branch, parallel to the
     * qkv|beta|alpha projection, joined before the step */
    int z_fork;
    /* SPARK_CUDA_Q35_DN_EARLY (read at session creation; q35_dn_early_env): the DeltaNet step
     * reads its state, ring, position and weights before its PDL wait (engine_cu_delta.early);
     * 2 (the default): and a head's column blocks add their norms through a block cluster */
    int dn_early;
    /* SPARK_CUDA_Q35_ATT_EARLY (read at session creation; default on, =0 off): the gated
     * attention reads the position and asks L2 for its K/V rows before its PDL wait
     * (ENGINE_CU_GATT_EARLY, with the short-capable instance only; call 3 on the H200, 8-block
     * cut: 600.8 -> 598.1 us per token at depth 0, 638.2 -> 631.5 at 4K, identical tokens) */
    int att_early;
    /* SPARK_CUDA_Q35_ROUTER_FUSE (read at session creation; on unless "0"): the router and the
     * shared-expert gate logit in the mixer's out_proj / o_proj launch (router_fuse.cuh; raw
     * logits in router[0..X]), the residual add in the up and down kernels; the MTP verify pass
     * likewise (q35_mtp_host.cuh q35m_rf_out: bit for bit the decode step). Measured on the
     * H200 (session 5, full Q4_K_M): 417 -> 455.7 tok/s. */
    int rf;
};

/* SPARK_CUDA_Q35_DN_EARLY: 0 off, 1 the early reads, 2 (unset: the default) also the cluster
 * norm. Measured on the H200 (8-block cut, with Z_FORK): 620.0 -> 588.0 us per token. */
static int q35_dn_early_env(void) {
    const char *e = getenv("SPARK_CUDA_Q35_DN_EARLY");
    if (!e || !*e) return 2;
    return e[0] == '1' || e[0] == '2' ? e[0] - '0' : 0;
}

/* SPARK_CUDA_Q35_ATT_SHORT: 0: off; unset or 1: ENGINE_CU_GATT_SHORT_MAX (256) positions;
 * N >= 2: N positions (at most that). Measured on the H200 (8-block cut): 7 us less per
 * attention block at positions < 128. */
static int q35_att_short_env(void) {
    const char *e = getenv("SPARK_CUDA_Q35_ATT_SHORT");
    const long v = e && *e ? strtol(e, NULL, 10) : 1;
    if (v <= 0) return 0;
    return v == 1 ? ENGINE_CU_GATT_SHORT_MAX : (int)std::min(v, (long)ENGINE_CU_GATT_SHORT_MAX);
}

/* The bits of SPARK_CUDA_DIAG_SKIP / _TWICE (each covers every launch of its kind) */
enum {
    Q35_DIAG_DN_IN = 1,      /* DeltaNet in-projections qkv|z|beta|alpha (+ alpha's own launch) */
    Q35_DIAG_DN_STEP = 2,    /* DeltaNet step (conv, norms, delta rule, gated RMSNorm) */
    Q35_DIAG_DN_OUT = 4,     /* DeltaNet out_proj (+= residual) */
    Q35_DIAG_AT_QKV = 8,     /* attention [q|gate], k, v projections */
    Q35_DIAG_AT = 16,        /* gated attention (its kernel and its merge launch) */
    Q35_DIAG_AT_O = 32,      /* attention o_proj (+= residual) */
    Q35_DIAG_ROUTER = 64,    /* router + shared-expert gate logit */
    Q35_DIAG_UP = 128,       /* routed gate/up (routing fused) */
    Q35_DIAG_SH_UP = 256,    /* shared expert gate/up */
    Q35_DIAG_DOWN = 512,     /* down of the routed + shared experts (+ the shared one's own) */
};

/* How many times the decode step launches the ops of diagnosis bit `bit` (0, 1 or 2). */
static int q35_diag_n(const engine_cuda_q35_session *s, unsigned bit) {
    return s->diag_skip & bit ? 0 : s->diag_twice & bit ? 2 : 1;
}

static void q35m_free(engine_cuda_q35_session *s);
static bool q35m_on(const engine_cuda_q35_session *s);
static int q35m_truncate(engine_cuda_q35_session *s, const int32_t *tokens, int32_t n_tokens,
                         int32_t n);

typedef struct {
    size_t kv_layer, ring, state, snap, x, big, z, ba, kv, att, router, shl, h, logits, partial,
        sscratch, wts, ids, counters, step, out, rope, dssq, ao, total;
} q35_layout;

static q35_layout q35_layout_of(const engine_cuda_q35_model *cm, int32_t n_ctx, engine_kv_type kv) {
    const q35_dims *d = &cm->d;
    q35_layout z;
    size_t f = sizeof(float), kvd = (size_t)d->nkv * d->hd;
    z.kv_layer = q35_align((size_t)n_ctx * kvd * (kv == ENGINE_KV_F32 ? 4 : 2));
    z.ring = q35_align(f * (size_t)cm->n_lin * d->C * d->K);
    z.state = q35_align(f * (size_t)cm->n_lin * d->nv * d->dk * d->dv);
    z.snap =
        q35_align(f * ENGINE_CUDA_Q35_SNAPSHOTS *
                  ((size_t)cm->n_lin * d->C * d->K + (size_t)cm->n_lin * d->nv * d->dk * d->dv));
    z.x = q35_align(f * d->E);
    z.big = q35_align(f * std::max((size_t)d->C, 2 * (size_t)d->nh * d->hd));
    z.z = q35_align(f * d->di);
    z.ba = q35_align(f * 2 * d->nv);
    z.kv = q35_align(f * kvd);
    z.att = q35_align(f * std::max((size_t)d->nh * d->hd, (size_t)d->di));
    z.router = q35_align(f * (d->X + 1)); /* + 1: the router fusion's shared-gate row */
    z.shl = q35_align(f);
    z.h = q35_align(f * ((size_t)d->k * d->F + (size_t)std::max(d->F, d->Fs)));
    z.logits = q35_align(f * d->V);
    z.partial = q35_align(f * d->nh * (size_t)engine_cu_gatt_splits(n_ctx) * (d->hd + 2));
    z.sscratch = q35_align(f * 2 * ENGINE_CU_SAMPLE_BLOCKS);
    z.wts = q35_align(f * (d->k + 1));
    z.ids = q35_align(sizeof(int32_t) * (d->k + 1));
    z.counters = q35_align(sizeof(unsigned) * (d->nkv + 1 + d->nv));
    z.step = q35_align(sizeof(engine_cu_step));
    z.out = q35_align(sizeof(int32_t) * (size_t)n_ctx);
    z.rope = q35_align(f * (size_t)n_ctx * d->rot);
    z.dssq = q35_align(f * d->nv * (d->dv / 32));
    z.ao = z.x;
    z.total = 2 * (size_t)cm->n_attn * z.kv_layer + z.ring + z.state + z.snap + z.x + z.big + z.z +
              z.ba + 2 * z.kv + z.att + z.router + z.shl + z.h + z.logits + z.partial + z.sscratch +
              z.wts + z.ids + z.counters + z.step + z.out + z.rope + z.dssq + z.ao;
    return z;
}

/* The mixer's output projection of block ly (n_embd rows): o_proj or the DeltaNet out_proj. */
static const q35_w *q35_out_w(const q35_cl *ly) {
    return ly->attn ? &ly->wo : &ly->wout;
}

/* Build the router fusion's [R | M] of every block once per model, at the first session that
 * asks for it: 0 with cm->rf_state 1 when built, 0 with rf_state -1 (logged) when the model
 * cannot use it or the GPU lacks the memory for it, else an error. Sessions of one model are
 * created from one thread. */
static int q35_rf_prepare(engine_cuda_q35_model *cm) {
    if (cm->rf_state) return 0;
    const q35_dims *d = &cm->d;
    const int E = d->E, X = d->X;
    const char *why = NULL;
    size_t total = 0, scratch_n = 0;
    if (!cm->rf_off && !(cm->rf_off = (size_t *)calloc((size_t)d->n_layer, sizeof(size_t))))
        return engine_err(ENGINE_ENOMEM, "out of memory");
    for (int l = 0; !why && l < d->n_layer; l++) {
        const q35_cl *ly = &cm->layers[l];
        const q35_w *wo = q35_out_w(ly);
        if (!wo->d || wo->rows != E || !ly->router.d || ly->router.rows != X ||
            ly->router.cols != E || !ly->shg.d || ly->shg.cols != E)
            why = "a block's output projection or router has another shape";
        else if (engine_cu_rf_smem(wo->type, E, wo->cols) > Q35_MAX_STAGE_BYTES)
            why = "its router blocks would need more shared memory than a block has";
        cm->rf_off[l] = total;
        total +=
            q35_align(sizeof(float) * (size_t)(X + 1) * (size_t)(E + wo->cols)) / sizeof(float);
        scratch_n = std::max(scratch_n, (size_t)E * (size_t)wo->cols);
    }
    if (why) {
        cm->rf_state = -1;
        engine_log(ENGINE_LOG_INFO, "cuda: router fusion (qwen35moe) off: %s", why);
        return 0;
    }
    int rc = 0;
    float *scratch = NULL;
    size_t free_b = 0, total_b = 0;
    CU(cudaSetDevice(cm->device));
    CU(cudaMemGetInfo(&free_b, &total_b));
    engine_log(ENGINE_LOG_INFO,
               "cuda: memory plan: router fusion (qwen35moe) %.1f MB (F32 [R | M] of %d blocks) + "
               "%.1f MB while it is built; %.2f GB free",
               (double)(sizeof(float) * total) / 1e6, d->n_layer,
               (double)(sizeof(float) * scratch_n) / 1e6, (double)free_b / 1e9);
    if (sizeof(float) * (total + scratch_n) + ((size_t)64 << 20) > free_b) {
        /* the default: a session without it rather than none (it is an optimisation) */
        cm->rf_state = -1;
        engine_log(ENGINE_LOG_INFO,
                   "cuda: router fusion (qwen35moe) off: it needs %.2f GB of GPU memory but "
                   "%.2f GB are free",
                   (double)(sizeof(float) * (total + scratch_n)) / 1e9, (double)free_b / 1e9);
        goto done;
    }
    CU(cudaMalloc((void **)&cm->rf_mem, sizeof(float) * total));
    CU(cudaMalloc((void **)&scratch, sizeof(float) * scratch_n));
    for (int l = 0; l < d->n_layer; l++) {
        const q35_cl *ly = &cm->layers[l];
        const q35_w *wo = q35_out_w(ly);
        float *rm = cm->rf_mem + cm->rf_off[l];
        /* rows 0..X-1: the router; row X: the shared-expert gate */
        if ((rc = engine_cu_rf_build(wo->d, wo->type, wo->row_bytes, ly->router.d, ly->router.type,
                                     ly->router.row_bytes, ly->post_norm, X, E, wo->cols, scratch,
                                     rm, 0)) ||
            (rc = engine_cu_rf_build(wo->d, wo->type, wo->row_bytes, ly->shg.d, ly->shg.type,
                                     ly->shg.row_bytes, ly->post_norm, 1, E, wo->cols, scratch,
                                     rm + (size_t)X * (size_t)(E + wo->cols), 0)))
            goto done;
    }
    CU(cudaDeviceSynchronize());
    cm->rf_state = 1;
done:
    cudaFree(scratch);
    if (rc) {
        cudaFree(cm->rf_mem);
        cm->rf_mem = NULL;
    }
    return rc;
}

extern "C" size_t engine_cuda_q35_session_bytes(const engine_cuda_q35_model *cm, int32_t n_ctx,
                                                engine_kv_type kv) {
    return q35_layout_of(cm, n_ctx, kv).total;
}

static void q35_reset_state(engine_cuda_q35_session *s) {
    for (int i = 0; i < ENGINE_CUDA_Q35_SNAPSHOTS; i++)
        s->snap_pos[i] = -1;
}

extern "C" int engine_cuda_q35_session_new(engine_cuda_q35_session **out, engine_cuda_q35_model *cm,
                                           int32_t n_ctx, engine_kv_type kv) {
    *out = NULL;
    const engine_hparams *hp = &cm->m->hp;
    const q35_dims *d = &cm->d;
    if (n_ctx < 1 || (uint32_t)n_ctx > hp->n_ctx_train)
        return engine_err(ENGINE_ERANGE, "cuda session: context %d is not in [1, %u]", n_ctx,
                          hp->n_ctx_train);
    if (kv != ENGINE_KV_F16 && kv != ENGINE_KV_F32)
        return engine_err(ENGINE_EUNSUPPORTED,
                          "cuda session (qwen35moe): KV cache type %d (only F16 and F32)", (int)kv);
    int rc = 0;
    q35_layout z = q35_layout_of(cm, n_ctx, kv);
    size_t free_b = 0, total_b = 0;
    uint8_t *p;
    engine_cuda_q35_session *s = (engine_cuda_q35_session *)calloc(1, sizeof *s);
    if (!s) return engine_err(ENGINE_ENOMEM, "out of memory");
    s->cm = cm;
    s->n_ctx = n_ctx;
    s->kv = kv;
    q35_reset_state(s);
    {
        const char *e = getenv("SPARK_CUDA_DIAG_SKIP");
        s->diag_skip = e ? (unsigned)strtoul(e, NULL, 0) : 0u;
        e = getenv("SPARK_CUDA_DIAG_TWICE");
        s->diag_twice = e ? (unsigned)strtoul(e, NULL, 0) : 0u;
        s->att_short = q35_att_short_env();
        s->dn_early = q35_dn_early_env();
        e = getenv("SPARK_CUDA_Q35_ATT_EARLY");
        s->att_early = !(e && e[0] == '0');
        e = getenv("SPARK_CUDA_Q35_ROUTER_FUSE");
        s->rf = !(e && e[0] == '0');
        e = getenv("SPARK_CUDA_DIAG_MOE");
        s->diag_moe = e ? atoi(e) : 0;
        s->route = engine_cu_route_parse(getenv("SPARK_CUDA_ROUTE"), 0);
        e = getenv("SPARK_CUDA_COOP_SCALE"); /* default on, as backend.cu */
        s->coop = !(e && e[0] == '0');
        e = getenv("SPARK_CUDA_COOP_MV");
        s->coop_mv = e && e[0] == '1';
        e = getenv("SPARK_CUDA_MV_R3"); /* default on (session 9), =0 off */
        s->mv_r3 = !(e && e[0] == '0');
        s->head_r = engine_cu_head_copy_wanted();
        s->head_rows = engine_cu_head_rows_env();
        s->head_ring = engine_cu_head_ring_env(0);
    }
    if (s->rf && (rc = q35_rf_prepare(cm))) goto done;
    if (s->rf && cm->rf_state != 1) s->rf = 0;
    s->k_cache = (void **)calloc((size_t)std::max(cm->n_attn, 1), sizeof(void *));
    s->v_cache = (void **)calloc((size_t)std::max(cm->n_attn, 1), sizeof(void *));
    if (!s->k_cache || !s->v_cache) {
        rc = engine_err(ENGINE_ENOMEM, "out of memory");
        goto done;
    }
    CU(cudaSetDevice(cm->device));
    CU(cudaMemGetInfo(&free_b, &total_b));
    engine_log(ENGINE_LOG_INFO,
               "cuda: session plan (qwen35moe): KV cache %.1f MiB (%d positions, %s), recurrent "
               "state %.1f MiB + %d snapshots %.1f MiB, buffers %.1f MiB; %.2f GB free",
               (double)(2 * cm->n_attn * z.kv_layer) / 1048576.0, n_ctx,
               kv == ENGINE_KV_F32 ? "f32" : "f16", (double)(z.ring + z.state) / 1048576.0,
               ENGINE_CUDA_Q35_SNAPSHOTS, (double)z.snap / 1048576.0,
               (double)(z.total - 2 * cm->n_attn * z.kv_layer - z.ring - z.state - z.snap) /
                   1048576.0,
               (double)free_b / 1e9);
    if (z.total + ((size_t)64 << 20) > free_b) {
        rc = engine_err(ENGINE_ENOMEM,
                        "cuda session of %d positions needs %.2f GB of GPU memory (KV cache, "
                        "recurrent state, snapshots, buffers) but %.2f GB are free",
                        n_ctx, (double)z.total / 1e9, (double)free_b / 1e9);
        goto done;
    }
    CU(cudaMalloc((void **)&s->mem, z.total));
    s->bytes = z.total;
    CU(cudaMemset(s->mem, 0, z.total));
    p = s->mem;
    for (int l = 0; l < cm->n_attn; l++) {
        s->k_cache[l] = p;
        p += z.kv_layer;
        s->v_cache[l] = p;
        p += z.kv_layer;
    }
    s->ring_per = (size_t)d->C * d->K;
    s->state_per = (size_t)d->nv * d->dk * d->dv;
    s->snap_stride = (s->ring_per + s->state_per) * (size_t)cm->n_lin;
#define CARVE(field, size, T)                                                                      \
    s->field = (T *)p;                                                                             \
    p += z.size;
    CARVE(ring, ring, float)
    CARVE(state, state, float)
    CARVE(snap, snap, float)
    CARVE(x, x, float)
    CARVE(big, big, float)
    CARVE(z, z, float)
    CARVE(ba, ba, float)
    CARVE(k, kv, float)
    CARVE(v, kv, float)
    CARVE(att, att, float)
    CARVE(router, router, float)
    CARVE(shl, shl, float)
    CARVE(h, h, float)
    CARVE(logits, logits, float)
    CARVE(partial, partial, float)
    CARVE(sscratch, sscratch, float)
    CARVE(wts, wts, float)
    CARVE(ids, ids, int32_t)
    CARVE(counters, counters, unsigned)
    CARVE(step, step, engine_cu_step)
    CARVE(out, out, int32_t)
    CARVE(rope, rope, float)
    CARVE(dssq, dssq, float)
    CARVE(ao, ao, float)
#undef CARVE
    ENGINE_ASSERT((size_t)(p - s->mem) == z.total);
    {
        size_t rb = sizeof(float) * (size_t)n_ctx * d->rot;
        float *t = (float *)malloc(rb);
        if (!t) {
            rc = engine_err(ENGINE_ENOMEM, "out of memory");
            goto done;
        }
        engine_cu_rope_table(t, cm->inv_freq, d->rot, n_ctx);
        rc = q35_cu_err(cudaMemcpy(s->rope, t, rb, cudaMemcpyHostToDevice), "cudaMemcpy (rope)");
        free(t);
        if (rc) goto done;
    }
    CU(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    {
        /* default on (measured 6.4 us less per block on the H200, 8-block cut) */
        const char *e = getenv("SPARK_CUDA_Q35_SH_FORK");
        s->sh_fork = !(e && e[0] == '0');
        e = getenv("SPARK_CUDA_Q35_Z_FORK"); /* default on since call 2 (with DN_EARLY=2) */
        s->z_fork = !(e && e[0] == '0');
        if (s->sh_fork || s->z_fork) {
            CU(cudaStreamCreateWithFlags(&s->side, cudaStreamNonBlocking));
            CU(cudaEventCreateWithFlags(&s->ev_fork, cudaEventDisableTiming));
            CU(cudaEventCreateWithFlags(&s->ev_join, cudaEventDisableTiming));
        }
    }
    CU(cudaMallocHost((void **)&s->h_step, sizeof *s->h_step));
    *out = s;
    s = NULL;
done:
    engine_cuda_q35_session_free(s);
    return rc;
}

extern "C" void engine_cuda_q35_session_free(engine_cuda_q35_session *s) {
    if (!s) return;
    q35m_free(s);
    cudaSetDevice(s->cm->device);
    if (s->exec) cudaGraphExecDestroy(s->exec);
    if (s->stream) cudaStreamDestroy(s->stream);
    if (s->side) cudaStreamDestroy(s->side);
    if (s->ev_fork) cudaEventDestroy(s->ev_fork);
    if (s->ev_join) cudaEventDestroy(s->ev_join);
    cudaFreeHost(s->h_step);
    cudaFree(s->mem);
    free(s->k_cache);
    free(s->v_cache);
    free(s);
}

/* The prefill pass's views of a session and its model's blocks (q35_prefill.cuh). */
static engine_cuda_wview q35_wview(const q35_w *w, int n_mat) {
    engine_cuda_wview v = {w->d, w->type, w->cols, w->rows, n_mat, w->row_bytes};
    return v;
}

extern "C" void engine_cuda_q35_view_get(engine_cuda_q35_session *s, engine_cu_q35_view *v) {
    const engine_cuda_q35_model *cm = s->cm;
    memset(v, 0, sizeof *v);
    v->m = cm->m;
    v->device = cm->device;
    v->stream = s->stream;
    v->n_ctx = s->n_ctx;
    v->kv_f32 = s->kv == ENGINE_KV_F32;
    v->v_tiled = cm->v_tiled;
    v->n_lin = cm->n_lin;
    v->n_attn = cm->n_attn;
    v->k_cache = s->k_cache;
    v->v_cache = s->v_cache;
    v->ring = s->ring;
    v->state = s->state;
    v->snap = s->snap;
    v->ring_per = s->ring_per;
    v->state_per = s->state_per;
    v->snap_stride = s->snap_stride;
    v->snap_pos = s->snap_pos;
    v->rope = s->rope;
    v->tok_embd = q35_wview(&cm->tok_embd, 1);
    v->output = q35_wview(&cm->output, 1);
    v->output_norm = cm->output_norm;
}

extern "C" void engine_cuda_q35_layer_get(engine_cuda_q35_session *s, int l,
                                          engine_cu_q35_layer *o) {
    const engine_cuda_q35_model *cm = s->cm;
    const q35_cl *c = &cm->layers[l];
    const int X = cm->d.X;
    memset(o, 0, sizeof *o);
    o->attn = c->attn;
    o->slot = c->slot;
    o->attn_norm = c->attn_norm;
    o->post_norm = c->post_norm;
    o->q_norm = c->q_norm;
    o->k_norm = c->k_norm;
    o->conv = c->conv;
    o->dt_bias = c->dt_bias;
    o->a = c->a;
    o->ssm_norm = c->ssm_norm;
    o->shg = (const float *)c->shg.d;
    if (c->attn) {
        o->wq = q35_wview(&c->wq, 1);
        o->wk = q35_wview(&c->wk, 1);
        o->wv = q35_wview(&c->wv, 1);
        o->wo = q35_wview(&c->wo, 1);
    } else {
        o->wqkv = q35_wview(&c->wqkv, 1);
        o->wz = q35_wview(&c->wz, 1);
        o->wbeta = q35_wview(&c->wba, 1);
        if (!c->ba_fused) o->walpha = q35_wview(&c->walpha, 1);
        o->wout = q35_wview(&c->wout, 1);
    }
    o->router = q35_wview(&c->router, 1);
    o->gate_exps = q35_wview(&c->gate_exps, X);
    o->up_exps = q35_wview(&c->up_exps, X);
    o->down_exps = q35_wview(&c->down_exps, X);
    o->gate_sh = q35_wview(&c->gate_sh, 1);
    o->up_sh = q35_wview(&c->up_sh, 1);
    if (c->down_merged) { /* expert X of the routed stack */
        o->down_sh = q35_wview(&c->down_exps, 1);
        o->down_sh.d = c->down_exps.d + (size_t)X * q35_mat_bytes(&c->down_exps);
    } else {
        o->down_sh = q35_wview(&c->down_sh, 1);
    }
}

/* The output head a session's head launches read: the repacked copy where there is one. */
static const q35_w *q35_head(const engine_cuda_q35_session *s) {
    return s->head_r && s->cm->output_r.d ? &s->cm->output_r : &s->cm->output;
}

static engine_cu_mat q35_mat(const q35_w *w, float *y, int accumulate) {
    engine_cu_mat m = {w->d, w->row_bytes, w->type, w->rows, y, accumulate};
    return m;
}

/* Events after each launch of an un-captured step (engine_cuda_q35_profile); NULL: none. */
typedef struct {
    cudaEvent_t *ev;
    int *cat;
    int n, cap;
} q35_prof;

static void q35_mark(q35_prof *p, int cat, cudaStream_t st) {
    if (!p || p->n >= p->cap) return;
    cudaEventRecord(p->ev[p->n], st);
    p->cat[p->n++] = cat;
}

static void q35_mv(const engine_cuda_q35_session *s, cudaStream_t st, const float *x, int cols,
                   const float *norm_w, float eps, int n, const engine_cu_mat *mats, int ring = 0) {
    engine_cu_mv mv;
    memset(&mv, 0, sizeof mv);
    mv.ring = ring; /* the launcher checks it applies */
    mv.coop = s->coop_mv;
    mv.r3 = s->mv_r3;
    mv.q6r_rows = s->head_rows; /* only the repacked head reads it */
    mv.tma = (s->route & ENGINE_CU_ROUTE_TMA_MV) != 0; /* the launcher checks it applies */
    for (int i = 0; i < n; i++)
        mv.m[i] = mats[i];
    mv.n_mat = n;
    mv.cols = cols;
    mv.x = x;
    mv.norm_w = norm_w;
    mv.eps = eps;
    engine_cu_matvec(&mv, st);
}

/* The arguments of a block's DeltaNet step, gated attention and MoE up launches that do not
 * depend on the token (the decode step here, the verify pass in q35_mtp_host.cuh): the caller
 * sets the activations, the position and (DeltaNet) the snapshot slots. */
static engine_cu_delta q35_delta_args(const engine_cuda_q35_session *s, const q35_cl *ly,
                                      float eps) {
    const engine_cuda_q35_model *cm = s->cm;
    const q35_dims *d = &cm->d;
    engine_cu_delta a;
    memset(&a, 0, sizeof a);
    a.conv_w = ly->conv;
    a.dt_bias = ly->dt_bias;
    a.a = ly->a;
    a.norm_w = ly->ssm_norm;
    a.ring = s->ring + (size_t)ly->slot * s->ring_per;
    a.state = s->state + (size_t)ly->slot * s->state_per;
    a.nk = d->nk;
    a.nv = d->nv;
    a.dk = d->dk;
    a.dv = d->dv;
    a.K = d->K;
    a.v_tiled = cm->v_tiled;
    a.eps = eps;
    a.ssq = s->dssq;
    a.counters = s->counters + d->nkv + 1;
    return a;
}

static engine_cu_gatt q35_gatt_args(const engine_cuda_q35_session *s, const q35_cl *ly, float eps,
                                    void *k_cache, void *v_cache) {
    const q35_dims *d = &s->cm->d;
    engine_cu_gatt a;
    memset(&a, 0, sizeof a);
    a.q_norm = ly->q_norm;
    a.k_norm = ly->k_norm;
    a.rope = (const float2 *)s->rope;
    a.rot = d->rot;
    a.eps = eps;
    a.k_cache = k_cache;
    a.v_cache = v_cache;
    a.kv_f32 = s->kv == ENGINE_KV_F32;
    a.n_ctx = s->n_ctx;
    a.n_head = d->nh;
    a.n_kv = d->nkv;
    a.hd = d->hd;
    a.partial = s->partial;
    a.counters = s->counters;
    a.short_n = s->att_short; /* bit for bit the split path: the MTP passes may take it too */
    return a;
}

/* shared: the shared expert's gate/up (one "expert", no router), else the routed experts. */
static engine_cu_ffn_up_args q35_up_args(const q35_dims *d, const q35_cl *ly, float eps,
                                         bool shared) {
    engine_cu_ffn_up_args up;
    memset(&up, 0, sizeof up);
    const q35_w *g = shared ? &ly->gate_sh : &ly->gate_exps;
    up.k = shared ? 1 : d->k;
    up.gate = g->d;
    up.up = shared ? ly->up_sh.d : ly->up_exps.d;
    up.row_bytes = g->row_bytes;
    up.type = g->type;
    up.cols = d->E;
    up.rows = g->rows;
    up.norm_w = ly->post_norm;
    up.eps = eps;
    if (!shared) {
        up.n_expert = d->X;
        up.norm_topk = 1;
        up.expert_bytes = q35_mat_bytes(&ly->gate_exps);
    }
    return up;
}

/* The router fusion's launch arguments for block ly (a main block: the MTP block has no
 * [R | M]): the output projection of att into ao (not into x) and, in the same launch, the raw
 * router and shared-gate logits of x + ao into raw[0..X] (router_fuse.cuh). */
static engine_cu_rf_args q35_rf_args(const engine_cuda_q35_session *s, const q35_cl *ly,
                                     const float *x, const float *att, float *ao, float *raw) {
    const engine_cuda_q35_model *cm = s->cm;
    const q35_dims *d = &cm->d;
    const q35_w *wo = q35_out_w(ly);
    const int l = (int)(ly - cm->layers);
    engine_cu_rf_args a;
    memset(&a, 0, sizeof a);
    a.wo.m[0] = q35_mat(wo, ao, 0);
    a.wo.n_mat = 1;
    a.wo.cols = wo->cols;
    a.wo.x = att;
    a.wo.tma = (s->route & ENGINE_CU_ROUTE_TMA_MV) != 0; /* one token only: engine_cu_rf_wo */
    a.rm.m[0].w = (const uint8_t *)(cm->rf_mem + cm->rf_off[l]);
    a.rm.m[0].row_bytes = sizeof(float) * (size_t)(d->E + wo->cols);
    a.rm.m[0].type = ENGINE_TYPE_F32;
    a.rm.m[0].rows = d->X + 1;
    a.rm.m[0].y = raw;
    a.rm.n_mat = 1;
    a.rm.cols = d->E + wo->cols;
    a.x = x;
    a.n_embd = d->E;
    return a;
}

/* Router fusion in the decode step: s->att's projection into s->ao, the raw logits into
 * s->router. */
static void q35_rf_out(engine_cuda_q35_session *s, const q35_cl *ly, cudaStream_t st) {
    const engine_cu_rf_args a = q35_rf_args(s, ly, s->x, s->att, s->ao, s->router);
    engine_cu_rf_wo(&a, st);
}

static void q35_deltanet(engine_cuda_q35_session *s, const q35_cl *ly, float eps, q35_prof *p) {
    const engine_cuda_q35_model *cm = s->cm;
    const q35_dims *d = &cm->d;
    cudaStream_t st = s->stream;
    const engine_cu_mat mz = q35_mat(&ly->wz, s->z, 0);
    const bool zf = s->z_fork && !p; /* z on the side branch */
    engine_cu_mat in[3] = {q35_mat(&ly->wqkv, s->big, 0), mz, q35_mat(&ly->wba, s->ba, 0)};
    if (zf) {
        in[1] = in[2];
        cudaEventRecord(s->ev_fork, st);
        cudaStreamWaitEvent(s->side, s->ev_fork, 0);
        for (int i = 0; i < q35_diag_n(s, Q35_DIAG_DN_IN); i++)
            q35_mv(s, s->side, s->x, d->E, ly->attn_norm, eps, 1, &mz);
        cudaEventRecord(s->ev_join, s->side);
    }
    for (int i = 0; i < q35_diag_n(s, Q35_DIAG_DN_IN); i++) {
        q35_mv(s, st, s->x, d->E, ly->attn_norm, eps, zf ? 2 : 3, in);
        if (!ly->ba_fused) {
            engine_cu_mat al = q35_mat(&ly->walpha, s->ba + d->nv, 0);
            q35_mv(s, st, s->x, d->E, ly->attn_norm, eps, 1, &al);
        }
    }
    if (zf) cudaStreamWaitEvent(st, s->ev_join, 0); /* the step reads z */
    q35_mark(p, 1, st);
    engine_cu_delta a = q35_delta_args(s, ly, eps);
    a.qkv = s->big;
    a.z = s->z;
    a.beta = s->ba;
    a.alpha = s->ba + d->nv;
    a.snap_ring = s->snap + (size_t)ly->slot * s->ring_per;
    a.snap_state = s->snap + s->ring_per * (size_t)cm->n_lin + (size_t)ly->slot * s->state_per;
    a.snap_stride = s->snap_stride;
    a.snap_every = ENGINE_CUDA_Q35_SNAP_EVERY;
    a.n_snap = ENGINE_CUDA_Q35_SNAPSHOTS;
    a.pos = &s->step->pos;
    a.out = s->att;
    a.early = s->dn_early; /* nothing of this step's chain writes state, ring or position */
    for (int i = 0; i < q35_diag_n(s, Q35_DIAG_DN_STEP); i++)
        engine_cu_deltanet_step(&a, st);
    q35_mark(p, 2, st);
    engine_cu_mat o = q35_mat(&ly->wout, s->x, 1);
    for (int i = 0; i < q35_diag_n(s, Q35_DIAG_DN_OUT); i++)
        if (s->rf)
            q35_rf_out(s, ly, st);
        else
            q35_mv(s, st, s->att, d->di, NULL, 0.0f, 1, &o);
    q35_mark(p, 4, st);
}

static void q35_attention(engine_cuda_q35_session *s, const q35_cl *ly, float eps, q35_prof *p) {
    const q35_dims *d = &s->cm->d;
    cudaStream_t st = s->stream;
    engine_cu_mat in[3] = {q35_mat(&ly->wq, s->big, 0), q35_mat(&ly->wk, s->k, 0),
                           q35_mat(&ly->wv, s->v, 0)};
    for (int i = 0; i < q35_diag_n(s, Q35_DIAG_AT_QKV); i++)
        q35_mv(s, st, s->x, d->E, ly->attn_norm, eps, 3, in);
    q35_mark(p, 1, st);
    engine_cu_gatt a = q35_gatt_args(s, ly, eps, s->k_cache[ly->slot], s->v_cache[ly->slot]);
    a.qg = s->big;
    a.k = s->k;
    a.v = s->v;
    a.pos = &s->step->pos;
    a.out = s->att;
    if (s->att_early && a.short_n > 0) a.short_n |= ENGINE_CU_GATT_EARLY; /* decode only */
    for (int i = 0; i < q35_diag_n(s, Q35_DIAG_AT); i++)
        engine_cu_gatt_run(&a, st);
    q35_mark(p, 3, st);
    engine_cu_mat o = q35_mat(&ly->wo, s->x, 1);
    for (int i = 0; i < q35_diag_n(s, Q35_DIAG_AT_O); i++)
        if (s->rf)
            q35_rf_out(s, ly, st);
        else
            q35_mv(s, st, s->att, d->nh * d->hd, NULL, 0.0f, 1, &o);
    q35_mark(p, 4, st);
}

static void q35_moe(engine_cuda_q35_session *s, const q35_cl *ly, float eps, q35_prof *p) {
    const q35_dims *d = &s->cm->d;
    cudaStream_t st = s->stream;
    /* the shared expert's gate/up: on the side branch (SPARK_CUDA_Q35_SH_FORK) it reads x as
     * the mixer left it, like the router, and writes its own rows of h */
    engine_cu_ffn_up_args sh = q35_up_args(d, ly, eps, true);
    sh.x = s->x;
    sh.x_add = s->rf ? s->ao : NULL; /* router fusion: the FFN input is x + ao */
    sh.coop = s->coop;
    sh.h = s->h + (size_t)d->k * d->F;
    const bool fork = s->sh_fork && !p;
    if (fork) {
        cudaEventRecord(s->ev_fork, st);
        cudaStreamWaitEvent(s->side, s->ev_fork, 0);
        for (int i = 0; i < q35_diag_n(s, Q35_DIAG_SH_UP); i++)
            engine_cu_ffn_up(&sh, s->side);
        cudaEventRecord(s->ev_join, s->side);
    }
    engine_cu_mat r[2] = {q35_mat(&ly->router, s->router, 0), q35_mat(&ly->shg, s->shl, 0)};
    for (int i = 0; !s->rf && i < q35_diag_n(s, Q35_DIAG_ROUTER); i++)
        q35_mv(s, st, s->x, d->E, ly->post_norm, eps, 2, r);
    q35_mark(p, 5, st);
    engine_cu_ffn_up_args up = q35_up_args(d, ly, eps, false);
    up.router = s->router;
    up.x = s->x;
    up.h = s->h;
    up.ids = s->ids;
    up.weights = s->wts;
    if (s->rf) { /* raw logits (scaled in the routing), the shared gate's scaled into shl */
        up.x_add = s->ao;
        up.rf_sh = s->shl;
    }
    up.diag = s->diag_moe;
    up.route = s->route;
    up.coop = s->coop;
    for (int i = 0; i < q35_diag_n(s, Q35_DIAG_UP); i++)
        engine_cu_ffn_up(&up, st);
    if (fork)
        cudaStreamWaitEvent(st, s->ev_join, 0); /* the down launch reads both parts of h */
    else
        for (int i = 0; i < q35_diag_n(s, Q35_DIAG_SH_UP); i++)
            engine_cu_ffn_up(&sh, st);
    q35_mark(p, 6, st);
    q35_mark(p, 7, st); /* the shared expert's gate: sigmoid of its logit inside the down kernel */
    engine_cu_ffn_down_args dn;
    memset(&dn, 0, sizeof dn);
    dn.down = ly->down_exps.d;
    dn.expert_bytes = q35_mat_bytes(&ly->down_exps);
    dn.row_bytes = ly->down_exps.row_bytes;
    dn.type = ly->down_exps.type;
    dn.cols = d->F;
    dn.rows = d->E;
    dn.k = ly->down_merged ? d->k + 1 : d->k;
    dn.h = s->h;
    dn.ids = s->ids;
    dn.weights = s->wts;
    dn.y = s->x;
    /* router fusion: the first down launch also adds the mixer's output */
    dn.y_add = s->rf ? s->ao : NULL;
    if (ly->down_merged) { /* slot k: the shared expert, stored as expert X */
        dn.sh_logit = s->shl;
        dn.sh_id = d->X;
    }
    dn.diag = s->diag_moe;
    dn.pf_bulk = (s->route & ENGINE_CU_ROUTE_BULK) != 0;
    dn.tma = (s->route & ENGINE_CU_ROUTE_TMA_DN) != 0;
    const int n_down = q35_diag_n(s, Q35_DIAG_DOWN);
    for (int i = 0; i < n_down; i++)
        engine_cu_ffn_down(&dn, st);
    if (!ly->down_merged && n_down) {
        dn.down = ly->down_sh.d;
        dn.expert_bytes = 0;
        dn.row_bytes = ly->down_sh.row_bytes;
        dn.type = ly->down_sh.type;
        dn.cols = d->Fs;
        dn.k = 1;
        dn.h = s->h + (size_t)d->k * d->F;
        dn.ids = NULL;
        dn.weights = NULL;
        dn.sh_logit = s->shl;
        dn.sh_id = 0;
        dn.y_add = NULL;
        for (int i = 0; i < n_down; i++)
            engine_cu_ffn_down(&dn, st);
    }
    q35_mark(p, 8, st);
}

/* Enqueue one decode step (token and position in s->step) on s->stream. */
static void q35_enqueue_step(engine_cuda_q35_session *s, q35_prof *p) {
    const engine_cuda_q35_model *cm = s->cm;
    const q35_dims *d = &cm->d;
    const float eps = cm->m->hp.rms_norm_eps;
    cudaStream_t st = s->stream;
    q35_mark(p, -1, st);
    engine_cu_embed(cm->tok_embd.d, cm->tok_embd.row_bytes, cm->tok_embd.type, d->E, s->step, 1,
                    s->x, st);
    q35_mark(p, 0, st);
    for (int l = 0; l < d->n_layer; l++) {
        const q35_cl *ly = &cm->layers[l];
        if (ly->attn)
            q35_attention(s, ly, eps, p);
        else
            q35_deltanet(s, ly, eps, p);
        q35_moe(s, ly, eps, p);
    }
    engine_cu_mat hm = q35_mat(q35_head(s), s->logits, 0);
    q35_mv(s, st, s->x, d->E, cm->output_norm, eps, 1, &hm, s->head_ring);
    q35_mark(p, 9, st);
    engine_cu_sample(s->logits, d->V, s->step, s->out, s->sscratch, s->counters + d->nkv, st);
    q35_mark(p, 10, st);
}

static int q35_capture(engine_cuda_q35_session *s) {
    int rc = 0;
    cudaGraph_t g = NULL;
    CU(cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal));
    q35_enqueue_step(s, NULL);
    CU(cudaStreamEndCapture(s->stream, &g));
    CU(cudaGetLastError());
    CU(cudaGraphInstantiate(&s->exec, g, 0));
    s->captured = true;
done:
    if (g) cudaGraphDestroy(g);
    return rc;
}

/* Set the step state and enqueue n steps; note the snapshots they take. */
static int q35_run_steps(engine_cuda_q35_session *s, int32_t token, int32_t pos, int32_t n,
                         float temp, uint64_t seed) {
    int rc = 0;
    const q35_dims *d = &s->cm->d;
    if (pos < 0 || n < 1 || pos > s->n_ctx - n)
        return engine_err(ENGINE_ERANGE,
                          "cuda decode: positions %d..%d do not fit the context of %d", pos,
                          pos + n - 1, s->n_ctx);
    if (token < 0 || token >= d->V)
        return engine_err(ENGINE_EINVAL, "cuda decode: token id %d is not in [0, %d)", token, d->V);
    if (q35m_on(s)) /* its passes also feed the MTP block */
        return engine_err(ENGINE_EINVAL, "cuda decode: MTP is on (engine_cuda_q35_append)");
    CU(cudaSetDevice(s->cm->device));
    if (!s->captured && (rc = q35_capture(s))) goto done;
    if (pos == 0) { /* a new sequence: the conv ring and the recurrent state start at zero */
        const size_t nl = (size_t)s->cm->n_lin;
        CU(cudaMemsetAsync(s->ring, 0, sizeof(float) * s->ring_per * nl, s->stream));
        CU(cudaMemsetAsync(s->state, 0, sizeof(float) * s->state_per * nl, s->stream));
        q35_reset_state(s);
    }
    s->h_step->token = token;
    s->h_step->pos = pos;
    s->h_step->n_out = 0;
    s->h_step->out_cap = n;
    s->h_step->seed = seed;
    s->h_step->temp = temp;
    CU(cudaMemcpyAsync(s->step, s->h_step, sizeof *s->h_step, cudaMemcpyHostToDevice, s->stream));
    for (int32_t i = 0; i < n; i++)
        CU(cudaGraphLaunch(s->exec, s->stream));
    for (int32_t b = pos + 1; b <= pos + n; b++)
        if (b % ENGINE_CUDA_Q35_SNAP_EVERY == 0)
            s->snap_pos[(b / ENGINE_CUDA_Q35_SNAP_EVERY) % ENGINE_CUDA_Q35_SNAPSHOTS] = b;
done:
    return rc;
}

extern "C" int engine_cuda_q35_decode(engine_cuda_q35_session *s, int32_t token, int32_t pos,
                                      float *logits, int32_t *next) {
    int rc = q35_run_steps(s, token, pos, 1, 0.0f, 0);
    if (rc) return rc;
    if (logits)
        CU(cudaMemcpyAsync(logits, s->logits, sizeof(float) * (size_t)s->cm->d.V,
                           cudaMemcpyDeviceToHost, s->stream));
    if (next) CU(cudaMemcpyAsync(next, s->out, sizeof *next, cudaMemcpyDeviceToHost, s->stream));
    CU(cudaStreamSynchronize(s->stream));
done:
    return rc;
}

extern "C" int engine_cuda_q35_generate(engine_cuda_q35_session *s, int32_t token, int32_t pos,
                                        int32_t n, float temperature, uint64_t seed, int32_t *out) {
    int rc = q35_run_steps(s, token, pos, n, temperature, seed);
    if (rc) return rc;
    CU(cudaMemcpyAsync(out, s->out, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost,
                       s->stream));
    CU(cudaStreamSynchronize(s->stream));
done:
    return rc;
}

extern "C" int engine_cuda_q35_truncate(engine_cuda_q35_session *s, const int32_t *tokens,
                                        int32_t n_tokens, int32_t n) {
    if (n < 0 || n > n_tokens)
        return engine_err(ENGINE_EINVAL, "cannot truncate a session of %d tokens to %d", n_tokens,
                          n);
    if (n == n_tokens) return 0;
    if (q35m_on(s)) return q35m_truncate(s, tokens, n_tokens, n);
    int rc = 0, best = -1;
    for (int i = 0; i < ENGINE_CUDA_Q35_SNAPSHOTS; i++) {
        if (s->snap_pos[i] > n)
            s->snap_pos[i] = -1; /* describes tokens about to be dropped */
        else if (s->snap_pos[i] > 0 && (best < 0 || s->snap_pos[i] > s->snap_pos[best]))
            best = i;
    }
    const size_t nr = s->ring_per * (size_t)s->cm->n_lin, ns = s->state_per * (size_t)s->cm->n_lin;
    int32_t b = 0;
    CU(cudaSetDevice(s->cm->device));
    if (best < 0) {
        CU(cudaMemsetAsync(s->ring, 0, sizeof(float) * nr, s->stream));
        CU(cudaMemsetAsync(s->state, 0, sizeof(float) * ns, s->stream));
        q35_reset_state(s);
    } else {
        b = s->snap_pos[best];
        const float *src = s->snap + (size_t)best * s->snap_stride;
        CU(cudaMemcpyAsync(s->ring, src, sizeof(float) * nr, cudaMemcpyDeviceToDevice, s->stream));
        CU(cudaMemcpyAsync(s->state, src + nr, sizeof(float) * ns, cudaMemcpyDeviceToDevice,
                           s->stream));
    }
    /* tokens b .. n-1 again from the restored state (their KV rows are rewritten as they were,
     * and the snapshots between b and n taken again); one step at a time, as a prompt */
    for (int32_t p = b; p < n && rc == 0; p++) {
        rc = q35_run_steps(s, tokens[p], p, 1, 0.0f, 0);
        if (rc == 0) CU(cudaStreamSynchronize(s->stream));
    }
    if (rc == 0) CU(cudaStreamSynchronize(s->stream));
done:
    return rc;
}

extern "C" int engine_cuda_q35_profile(engine_cuda_q35_session *s, int32_t token, int32_t pos,
                                       int reps, double us[ENGINE_CUDA_Q35_PROF_COUNT]) {
    int rc = 0;
    const int cap = 4 + 10 * s->cm->d.n_layer;
    q35_prof p = {(cudaEvent_t *)calloc((size_t)cap, sizeof(cudaEvent_t)),
                  (int *)calloc((size_t)cap, sizeof(int)), 0, cap};
    memset(us, 0, sizeof(double) * ENGINE_CUDA_Q35_PROF_COUNT);
    if (!p.ev || !p.cat) {
        rc = engine_err(ENGINE_ENOMEM, "out of memory");
        goto done;
    }
    if (pos < 1 || pos >= s->n_ctx || token < 0 || token >= s->cm->d.V || reps < 1) {
        rc = engine_err(ENGINE_EINVAL, "cuda profile: bad token, position or repetitions");
        goto done;
    }
    CU(cudaSetDevice(s->cm->device));
    for (int i = 0; i < cap; i++)
        CU(cudaEventCreate(&p.ev[i]));
    for (int r = 0; r < reps; r++) {
        s->h_step->token = token;
        s->h_step->pos = pos;
        s->h_step->n_out = 0;
        s->h_step->out_cap = 1;
        s->h_step->temp = 0;
        CU(cudaMemcpyAsync(s->step, s->h_step, sizeof *s->h_step, cudaMemcpyHostToDevice,
                           s->stream));
        p.n = 0;
        q35_enqueue_step(s, &p);
        CU(cudaGetLastError());
        CU(cudaStreamSynchronize(s->stream));
        for (int i = 1; i < p.n; i++) {
            float ms = 0;
            CU(cudaEventElapsedTime(&ms, p.ev[i - 1], p.ev[i]));
            us[p.cat[i]] += 1e3 * ms / reps;
        }
    }
done:
    for (int i = 0; p.ev && i < cap; i++)
        if (p.ev[i]) cudaEventDestroy(p.ev[i]);
    free(p.ev);
    free(p.cat);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Single ops on host buffers (tests)
 * ------------------------------------------------------------------------------------------- */
namespace {

/* Device copies of host buffers, freed together. */
struct q35_bufs {
    void *p[24];
    int n = 0, rc = 0;
    ~q35_bufs() {
        for (int i = 0; i < n; i++)
            cudaFree(p[i]);
    }
    template <typename T> T *put(const void *src, size_t bytes) {
        void *d = nullptr;
        if (rc || n == 24) return nullptr;
        rc = q35_cu_err(cudaMalloc(&d, bytes ? bytes : 4), "cudaMalloc (op)");
        if (rc) return nullptr;
        p[n++] = d;
        rc = q35_cu_err(src ? cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice)
                            : cudaMemset(d, 0, bytes ? bytes : 4),
                        "cudaMemcpy (op)");
        return (T *)d;
    }
    int get(void *dst, const void *src, size_t bytes) {
        if (rc) return rc;
        rc = q35_cu_err(cudaDeviceSynchronize(), "kernel (op)");
        if (!rc) rc = q35_cu_err(cudaGetLastError(), "launch (op)");
        if (!rc) rc = q35_cu_err(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "copy back");
        return rc;
    }
};

} // namespace

extern "C" int engine_cuda_op_q35_deltanet(int nk, int nv, int dk, int dv, int K, bool v_tiled,
                                           int32_t pos, const float *qkv, const float *z,
                                           const float *beta, const float *alpha,
                                           const float *conv_w, const float *dt_bias,
                                           const float *a, const float *norm_w, float eps,
                                           float *ring, float *state, float *out) {
    int rc = engine_cuda_usable();
    if (rc) return rc;
    if (!engine_cu_deltanet_ok(dk, dv, K) || nk < 1 || nv % nk || pos < 0)
        return engine_err(ENGINE_EINVAL, "deltanet op: unsupported shape");
    const size_t f = sizeof(float), C = 2 * (size_t)nk * dk + (size_t)nv * dv;
    const size_t S = (size_t)nv * dk * dv;
    q35_bufs b;
    engine_cu_delta g;
    memset(&g, 0, sizeof g);
    g.qkv = b.put<float>(qkv, f * C);
    g.z = b.put<float>(z, f * nv * dv);
    g.beta = b.put<float>(beta, f * nv);
    g.alpha = b.put<float>(alpha, f * nv);
    g.conv_w = b.put<float>(conv_w, f * C * K);
    g.dt_bias = b.put<float>(dt_bias, f * nv);
    g.a = b.put<float>(a, f * nv);
    g.norm_w = b.put<float>(norm_w, f * dv);
    g.ring = b.put<float>(ring, f * C * K);
    g.state = b.put<float>(state, f * S);
    g.pos = b.put<int32_t>(&pos, sizeof pos);
    g.out = b.put<float>(NULL, f * nv * dv);
    g.nk = nk;
    g.nv = nv;
    g.dk = dk;
    g.dv = dv;
    g.K = K;
    g.v_tiled = v_tiled;
    g.eps = eps;
    g.snap_every = 1;
    g.n_snap = 1;
    g.ssq = b.put<float>(NULL, f * nv * (dv / 32));
    g.counters = b.put<unsigned>(NULL, sizeof(unsigned) * nv);
    g.early = q35_dn_early_env(); /* as a session would take it */
    if (b.rc) return b.rc;
    engine_cu_deltanet_step(&g, 0);
    if ((rc = b.get(out, g.out, f * nv * dv)) || (rc = b.get(ring, g.ring, f * C * K)) ||
        (rc = b.get(state, g.state, f * S)))
        return rc;
    return 0;
}

extern "C" int engine_cuda_op_q35_attention(int n_head, int n_kv, int hd, int rot, int32_t pos,
                                            engine_kv_type kv, const void *k_cache,
                                            const void *v_cache, const float *qg, const float *k,
                                            const float *v, const float *q_norm,
                                            const float *k_norm, const float *inv_freq, float eps,
                                            float *out, float *k_row, float *v_row) {
    int rc = engine_cuda_usable();
    if (rc) return rc;
    if (!engine_cu_gatt_ok(n_head, n_kv, hd, rot) || pos < 0 ||
        (kv != ENGINE_KV_F16 && kv != ENGINE_KV_F32))
        return engine_err(ENGINE_EINVAL, "attention op: unsupported shape or KV type");
    const int n_ctx = pos + 1;
    const size_t f = sizeof(float), elt = kv == ENGINE_KV_F32 ? 4 : 2;
    const size_t row = (size_t)n_kv * hd, cache = (size_t)n_ctx * row * elt;
    float *rope = (float *)malloc(f * (size_t)n_ctx * rot);
    if (!rope) return engine_err(ENGINE_ENOMEM, "out of memory");
    engine_cu_rope_table(rope, inv_freq, rot, n_ctx);
    q35_bufs b;
    engine_cu_gatt g;
    memset(&g, 0, sizeof g);
    g.qg = b.put<float>(qg, f * 2 * n_head * hd);
    g.k = b.put<float>(k, f * row);
    g.v = b.put<float>(v, f * row);
    g.q_norm = b.put<float>(q_norm, f * hd);
    g.k_norm = b.put<float>(k_norm, f * hd);
    g.rope = b.put<float2>(rope, f * (size_t)n_ctx * rot);
    free(rope);
    g.rot = rot;
    g.eps = eps;
    g.k_cache = b.put<uint8_t>(NULL, cache);
    g.v_cache = b.put<uint8_t>(NULL, cache);
    if (!b.rc && pos > 0) {
        b.rc = q35_cu_err(
            cudaMemcpy(g.k_cache, k_cache, (size_t)pos * row * elt, cudaMemcpyHostToDevice),
            "cudaMemcpy (op)");
        if (!b.rc)
            b.rc = q35_cu_err(
                cudaMemcpy(g.v_cache, v_cache, (size_t)pos * row * elt, cudaMemcpyHostToDevice),
                "cudaMemcpy (op)");
    }
    g.kv_f32 = kv == ENGINE_KV_F32;
    g.pos = b.put<int32_t>(&pos, sizeof pos);
    g.n_ctx = n_ctx;
    g.n_head = n_head;
    g.n_kv = n_kv;
    g.hd = hd;
    g.partial = b.put<float>(NULL, f * n_head * (size_t)engine_cu_gatt_splits(n_ctx) * (hd + 2));
    g.counters = b.put<unsigned>(NULL, sizeof(unsigned) * n_kv);
    g.out = b.put<float>(NULL, f * n_head * hd);
    g.short_n = q35_att_short_env(); /* as a session would take it */
    if (b.rc) return b.rc;
    engine_cu_gatt_run(&g, 0);
    if ((rc = b.get(out, g.out, f * n_head * hd))) return rc;
    uint8_t *tmp = (uint8_t *)malloc(2 * row * elt);
    if (!tmp) return engine_err(ENGINE_ENOMEM, "out of memory");
    if ((rc = b.get(tmp, (uint8_t *)g.k_cache + (size_t)pos * row * elt, row * elt)) == 0 &&
        (rc = b.get(tmp + row * elt, (uint8_t *)g.v_cache + (size_t)pos * row * elt, row * elt)) ==
            0)
        for (size_t i = 0; i < row; i++) {
            if (kv == ENGINE_KV_F32) {
                k_row[i] = ((const float *)tmp)[i];
                v_row[i] = ((const float *)(tmp + row * elt))[i];
            } else {
                k_row[i] = __half2float(((const __half *)tmp)[i]);
                v_row[i] = __half2float(((const __half *)(tmp + row * elt))[i]);
            }
        }
    free(tmp);
    return rc;
}

#include "q35_mtp_host.cuh"
