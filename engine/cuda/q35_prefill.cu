/* The prefill pass of qwen35moe on the GPU (contracts in cuda_backend.h, engine_cuda_q35_prefill_*,
 * and q35_prefill.cuh). */
#include <algorithm>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gemm.cuh"
#include "prefill.cuh"
#include "q35_prefill.cuh"
#include "q35_verify.cuh"
#include "qwen35_attn.cuh"

extern "C" {
#include "model/model_int.h"
}

#define QP_ROUTER_SPLIT 8     /* split-K of the F32 router GEMM */
#define QP_DEFAULT_CHUNK 1024 /* 256 experts x top-8: ~32 rows per expert and GEMM tile */

/* SPARK_CUDA_PREFILL_PROF=1: events between the phases of every chunk; the per-phase sums are
 * logged at INFO when the prefill object is freed. */
enum {
    QP_P_DN_PROJ, QP_P_DN_CORE, QP_P_DN_OUT, QP_P_AT_PROJ, QP_P_AT_CORE, QP_P_AT_OUT, QP_P_ROUTE,
    QP_P_EXPERTS, QP_P_SHARED, QP_P_DOWN, QP_P_HEAD, QP_P_N
};
static const char *const qp_phase_name[QP_P_N] = {
    "deltanet proj", "conv+delta rule+norm", "deltanet out", "attention proj",
    "qk+attention+gate", "attention out", "router+route+sort", "expert gate/up",
    "shared gate/up", "down+combine", "head"};

struct engine_cuda_q35_prefill {
    engine_cuda_q35_session *s;
    engine_cu_q35_view v;
    engine_cu_q35_layer *ly; /* [n_layer] */
    engine_cu_q35_mtp_view mtp; /* the MTP block's weights (mtp_ok) */
    bool mtp_ok;                /* it can be fed (engine_cu_q35_prefill_mtp_ok) */
    int E, V, nh, nkv, hd, rot, nk, nv, dk, dv, K, C, di, X, k, F, Fs, n_layer;
    float eps;
    int32_t max_tokens;
    int att_tc; /* the tensor-core attention (F16 cache; SPARK_CUDA_Q35_ATT_TC=0: off) */
    /* ENGINE_CU_GEMM_PIPE_* bits of the GEMMs: the staged Q4_K / Q5_K and Q8_0 / Q4_0 kernels as
     * in the qwen3moe prefill (prefill.cu; the same arithmetic, bit for bit), unless
     * SPARK_CUDA_PREFILL_GEMM holds the word "nopipe" (none) or "nopipe8" (not Q8_0 / Q4_0) */
    int gemm_pipe;
    /* the grouped Q4_K / Q5_K products: fragments read from the staged bytes as the qwen3moe
     * prefill's ("nodirect": not; the same bits); "kint" (opt-in) the int superblock order too
     * (engine_cu_gemm_args.kint; other rounding). Session 25, H200, 8-block Qwen3.5-35B-A3B
     * Q4_K_M cut, pp512: 35,426-35,494 tok/s, direct 36,072, kint 37,620-37,898; not the
     * default: with it test_cuda_mtp's 23-token prompt through the prefill against the verify
     * passes fell to cosine 0.964 (bound 0.97; a near-tied expert swapped, carried by the
     * recurrent state), and test_cuda_q35_prefill's worst prompt to 0.995 */
    int gemm_direct, gemm_kint;
    int prof, n_ev, n_mark;
    cudaEvent_t *ev;
    int *ev_cat;
    double prof_ms[QP_P_N];
    long prof_tokens;
    uint8_t *mem;
    size_t bytes;
    int32_t *tok, *ids, *sorted_tok, *slot_pos, *tiles, *n_tiles;
    float *x, *big, *cv, *z, *ba, *att, *q, *k_, *v_, *router, *wts, *shl, *g, *u, *d, *sg, *su,
        *sh, *logits;
    float *hid; /* mtp_ok: [n + 1][E] h_{pos-1}, then the chunk's final normed hidden states */
    void *xbuf;
};

static int qp_err(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    cudaGetLastError();
    return engine_err(e == cudaErrorMemoryAllocation ? ENGINE_ENOMEM : ENGINE_EINTERNAL,
                      "CUDA %s: %s", what, cudaGetErrorString(e));
}

static size_t qp_al(size_t n) {
    return (n + 255) & ~(size_t)255;
}

/* Bytes of prepared activations of m rows of `cols`, in the largest form. */
static size_t qp_xb(int m, int cols) {
    size_t b = 0;
    for (int f = ENGINE_CU_GX_Q8_K; f <= ENGINE_CU_GX_F32; f++)
        b = std::max(b, engine_cu_gemm_x_bytes(f, m, cols));
    return b;
}

typedef struct {
    size_t tok, slots, tiles, ntiles, x, big, cv, z, ba, att, q, kv, router, wts, shl, gu, d, sgu,
        sh, logits, hid, xbuf, total;
} qp_layout;

static qp_layout qp_plan(const engine_cuda_q35_prefill *p, int32_t N) {
    const size_t f = sizeof(float), n = (size_t)N, nk = n * p->k;
    qp_layout z;
    z.tok = qp_al(sizeof(int32_t) * n);
    z.slots = qp_al(sizeof(int32_t) * nk);
    z.tiles = qp_al(sizeof(int32_t) * 3 * (size_t)engine_cu_pf_max_tiles((int)nk, p->X));
    z.ntiles = 256;
    z.x = qp_al(f * n * p->E);
    /* big also holds the MTP block's fc input [n][2E] */
    z.big = qp_al(f * n * std::max({(size_t)p->C, 2 * (size_t)p->nh * p->hd,
                                    p->mtp_ok ? 2 * (size_t)p->E : (size_t)0}));
    z.cv = qp_al(f * n * p->C);
    z.z = qp_al(f * n * p->di);
    z.ba = qp_al(f * n * 2 * p->nv);
    z.att = qp_al(f * n * std::max((size_t)p->nh * p->hd, (size_t)p->di));
    z.q = qp_al(f * n * p->nh * p->hd);
    z.kv = qp_al(f * n * p->nkv * p->hd);
    z.router = qp_al(f * QP_ROUTER_SPLIT * n * p->X);
    z.wts = qp_al(f * nk);
    z.shl = qp_al(f * n);
    z.gu = qp_al(f * nk * p->F);
    z.d = qp_al(f * nk * p->E);
    z.sgu = qp_al(f * n * p->Fs);
    z.sh = qp_al(f * n * p->E);
    z.logits = qp_al(f * p->V);
    z.hid = p->mtp_ok ? qp_al(f * (n + 1) * p->E) : 0;
    z.xbuf = std::max({qp_xb(N, p->E), qp_xb(N, p->nh * p->hd), qp_xb(N, p->di),
                       qp_xb(N * p->k, p->F), qp_xb(N, p->Fs),
                       p->mtp_ok ? qp_xb(N, 2 * p->E) : (size_t)0});
    z.total = z.tok + 3 * z.slots + z.tiles + z.ntiles + z.x + z.big + z.cv + z.z + z.ba + z.att +
              z.q + 2 * z.kv + z.router + z.wts + z.shl + 2 * z.gu + z.d + 2 * z.sgu + z.sh +
              z.logits + z.hid + z.xbuf;
    return z;
}

static void qp_mark(engine_cuda_q35_prefill *p, int cat, cudaStream_t st) {
    if (!p->prof || p->n_mark >= p->n_ev) return;
    cudaEventRecord(p->ev[p->n_mark], st);
    p->ev_cat[p->n_mark++] = cat;
}

extern "C" void engine_cuda_q35_prefill_free(engine_cuda_q35_prefill *p) {
    if (!p) return;
    if (engine_cuda_q35_prefill_get(p->s) == p) engine_cuda_q35_prefill_set(p->s, NULL);
    cudaSetDevice(p->v.device);
    if (p->prof && p->prof_tokens > 0)
        engine_cu_pf_prof_log("cuda qwen35moe prefill", p->prof_tokens, p->prof_ms, qp_phase_name,
                              QP_P_N);
    engine_cu_pf_prof_free(p->ev, p->n_ev, p->ev_cat);
    cudaFree(p->mem);
    free(p->ly);
    free(p);
}

/* Every shape the pass needs a kernel for; false (with the reason logged) when one has none. */
static bool qp_supported(const engine_cuda_q35_prefill *p) {
    const char *why = NULL;
    if (!engine_cu_q35_delta_ok(p->dk, p->dv))
        why = "DeltaNet heads beyond the chunked kernel (multiples of 32, key heads <= 256)";
    else if (p->hd != 64 && p->hd != 128 && p->hd != 256)
        why = "attention heads not of 64, 128 or 256";
    else if (p->X > ENGINE_CU_PF_MAX_EXPERT || p->k > 32)
        why = "more than 256 experts or 32 per token";
    else if (!engine_cu_gemm_ok(p->v.output.type, p->v.output.cols))
        why = "the output head has no prefill GEMM";
    for (int l = 0; !why && l < p->n_layer; l++) {
        const engine_cu_q35_layer *y = &p->ly[l];
        const engine_cuda_wview *w[] = {&y->wq,     &y->wk,        &y->wv,      &y->wo,
                                        &y->wqkv,   &y->wz,        &y->wbeta,   &y->walpha,
                                        &y->wout,   &y->router,    &y->gate_exps, &y->up_exps,
                                        &y->down_exps, &y->gate_sh, &y->up_sh,   &y->down_sh};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
            if (w[i]->d && !engine_cu_gemm_ok(w[i]->type, w[i]->cols)) {
                why = "a weight type or row length has no prefill GEMM";
                break;
            }
    }
    if (why)
        engine_log(ENGINE_LOG_INFO, "cuda: qwen35moe prompts go through the decode step (%s)",
                   why);
    return why == NULL;
}

/* Whether the MTP block's KV rows have prefill GEMMs (fc, k, v); logs why not. */
static bool qp_mtp_supported(const engine_cuda_q35_prefill *p) {
    const engine_cu_q35_mtp_view *w = &p->mtp;
    const engine_cuda_wview *mats[] = {&w->eh, &w->ly.wk, &w->ly.wv};
    bool ok = w->ly.attn && w->eh.rows == p->E && w->eh.cols == 2 * p->E;
    for (size_t i = 0; ok && i < sizeof mats / sizeof mats[0]; i++)
        ok = mats[i]->d && engine_cu_gemm_ok(mats[i]->type, mats[i]->cols);
    if (!ok)
        engine_log(ENGINE_LOG_INFO, "cuda: qwen35moe prompts of MTP sessions go through verify "
                   "passes (the MTP block's fc, k or v has no prefill GEMM)");
    return ok;
}

bool engine_cu_q35_prefill_mtp_ok(const engine_cuda_q35_prefill *p) {
    return p && p->mtp_ok;
}

extern "C" int engine_cuda_q35_prefill_new(engine_cuda_q35_prefill **out,
                                           engine_cuda_q35_session *s, int32_t max_tokens) {
    *out = NULL;
    const char *e = getenv("SPARK_CUDA_Q35_PREFILL");
    if (e && e[0] == '0') return 0;
    int rc = 0;
    size_t free_b = 0, total_b = 0;
    uint8_t *b;
    qp_layout z;
    engine_cuda_q35_prefill *p = (engine_cuda_q35_prefill *)calloc(1, sizeof *p);
    if (!p) return engine_err(ENGINE_ENOMEM, "out of memory");
    p->s = s;
    engine_cuda_q35_view_get(s, &p->v);
    const engine_hparams *hp = &p->v.m->hp;
    p->E = (int)hp->n_embd;
    p->V = (int)hp->n_vocab;
    p->nh = (int)hp->n_head;
    p->nkv = (int)hp->n_head_kv;
    p->hd = (int)hp->head_dim_k;
    p->rot = (int)hp->n_rot;
    p->nk = (int)hp->ssm_n_group;
    p->nv = (int)hp->ssm_dt_rank;
    p->dk = p->dv = (int)hp->ssm_d_state;
    p->K = (int)hp->ssm_d_conv;
    p->di = (int)hp->ssm_d_inner;
    p->C = 2 * p->nk * p->dk + p->di;
    p->X = (int)hp->n_expert;
    p->k = (int)hp->n_expert_used;
    p->F = (int)hp->n_ff_exp;
    p->Fs = (int)hp->n_ff_shexp;
    p->n_layer = (int)hp->n_layer;
    p->eps = hp->rms_norm_eps;
    if (max_tokens <= 0) {
        const char *c = getenv("SPARK_CUDA_PREFILL_CHUNK");
        max_tokens = c ? engine_cuda_prefill_chunk() : QP_DEFAULT_CHUNK;
    }
    p->max_tokens = std::min(max_tokens, p->v.n_ctx);
    if (!(p->ly = (engine_cu_q35_layer *)calloc((size_t)p->n_layer, sizeof *p->ly))) {
        rc = engine_err(ENGINE_ENOMEM, "out of memory");
        goto done;
    }
    for (int l = 0; l < p->n_layer; l++)
        engine_cuda_q35_layer_get(s, l, &p->ly[l]);
    if (!qp_supported(p)) goto done; /* rc 0, *out NULL: the decode step serves prompts */
    if (engine_cuda_q35_mtp_view_get(s, &p->mtp)) p->mtp_ok = qp_mtp_supported(p);
    z = qp_plan(p, p->max_tokens);
    if ((rc = qp_err(cudaSetDevice(p->v.device), "cudaSetDevice"))) goto done;
    if ((rc = qp_err(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo"))) goto done;
    engine_log(ENGINE_LOG_INFO,
               "cuda: qwen35moe prefill buffers %.1f MiB (chunks of %d tokens); %.2f GB free",
               (double)z.total / 1048576.0, p->max_tokens, (double)free_b / 1e9);
    if (z.total + ((size_t)64 << 20) > free_b) { /* the session works without: decode steps */
        engine_log(ENGINE_LOG_WARN,
                   "cuda: qwen35moe prompts go through the decode step: the prefill's %d-token "
                   "chunks need %.2f GB of GPU memory but %.2f GB are free "
                   "(SPARK_CUDA_PREFILL_CHUNK sets a smaller chunk)",
                   p->max_tokens, (double)z.total / 1e9, (double)free_b / 1e9);
        goto done;
    }
    if ((rc = qp_err(cudaMalloc((void **)&p->mem, z.total), "cudaMalloc (prefill)"))) goto done;
    p->bytes = z.total;
    b = p->mem;
#define QP_CARVE(field, size, T)                                                                   \
    p->field = (T *)b;                                                                             \
    b += z.size;
    QP_CARVE(tok, tok, int32_t)
    QP_CARVE(ids, slots, int32_t)
    QP_CARVE(sorted_tok, slots, int32_t)
    QP_CARVE(slot_pos, slots, int32_t)
    QP_CARVE(tiles, tiles, int32_t)
    QP_CARVE(n_tiles, ntiles, int32_t)
    QP_CARVE(x, x, float)
    QP_CARVE(big, big, float)
    QP_CARVE(cv, cv, float)
    QP_CARVE(z, z, float)
    QP_CARVE(ba, ba, float)
    QP_CARVE(att, att, float)
    QP_CARVE(q, q, float)
    QP_CARVE(k_, kv, float)
    QP_CARVE(v_, kv, float)
    QP_CARVE(router, router, float)
    QP_CARVE(wts, wts, float)
    QP_CARVE(shl, shl, float)
    QP_CARVE(g, gu, float)
    QP_CARVE(u, gu, float)
    QP_CARVE(d, d, float)
    QP_CARVE(sg, sgu, float)
    QP_CARVE(su, sgu, float)
    QP_CARVE(sh, sh, float)
    QP_CARVE(logits, logits, float)
    QP_CARVE(hid, hid, float)
    QP_CARVE(xbuf, xbuf, void)
#undef QP_CARVE
    ENGINE_ASSERT((size_t)(b - p->mem) == z.total);
    e = getenv("SPARK_CUDA_Q35_ATT_TC");
    p->att_tc = !(e && e[0] == '0') && engine_cu_q35_att_tc_ok(p->v.kv_f32, p->nh, p->nkv, p->hd);
    e = getenv("SPARK_CUDA_PREFILL_GEMM");
    p->gemm_pipe = engine_cu_env_word(e, "nopipe")
                       ? 0
                       : ENGINE_CU_GEMM_PIPE_K45 |
                             (engine_cu_env_word(e, "nopipe8") ? 0 : ENGINE_CU_GEMM_PIPE_Q8);
    p->gemm_direct = !engine_cu_env_word(e, "nodirect");
    p->gemm_kint = p->gemm_direct && engine_cu_env_word(e, "kint");
    e = getenv("SPARK_CUDA_PREFILL_PROF");
    if (e && e[0] == '1') {
        p->prof = 1;
        p->n_ev = 2 + 10 * p->n_layer;
        p->ev = (cudaEvent_t *)calloc((size_t)p->n_ev, sizeof(cudaEvent_t));
        p->ev_cat = (int *)calloc((size_t)p->n_ev, sizeof(int));
        if (!p->ev || !p->ev_cat) {
            rc = engine_err(ENGINE_ENOMEM, "out of memory");
            goto done;
        }
        for (int i = 0; i < p->n_ev; i++)
            if ((rc = qp_err(cudaEventCreate(&p->ev[i]), "cudaEventCreate"))) goto done;
    }
    engine_cuda_q35_prefill_set(s, p); /* the session's MTP prompts come here */
    *out = p;
    p = NULL;
done:
    engine_cuda_q35_prefill_free(p);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * The pass
 * ------------------------------------------------------------------------------------------- */

/* The prepared form of X last made (q, k and v, or the experts' gate and up, share one). */
typedef struct {
    const float *x, *norm;
    int form, m, cols;
    engine_cu_gx gx;
} qp_prep_cache;

static const engine_cu_gx *qp_prep(const engine_cuda_q35_prefill *p, qp_prep_cache *c, int type,
                                   const float *x, const float *g, int m, int cols,
                                   const float *norm_w, cudaStream_t st) {
    const int form = engine_cu_gemm_xform(type);
    if (!g && c->x == x && c->norm == norm_w && c->form == form && c->m == m && c->cols == cols)
        return &c->gx;
    engine_cu_gemm_prep(&c->gx, p->xbuf, form, m, cols, x, g, cols, norm_w, p->eps, st);
    c->x = g ? nullptr : x;
    c->norm = norm_w;
    c->form = form;
    c->m = m;
    c->cols = cols;
    return &c->gx;
}

/* Y = X W^T into y (row stride ldy): dense over X rows 0 .. m-1, or grouped over the tiles of
 * the last sort (m slots, X rows through x_idx, NULL: the slot itself). */
static void qp_gemm(const engine_cuda_q35_prefill *p, const engine_cuda_wview *w,
                    const engine_cu_gx *gx, int m, float *y, int ldy, int accumulate, bool grouped,
                    const int32_t *x_idx, int ksplit, cudaStream_t st) {
    engine_cu_gemm_args a;
    memset(&a, 0, sizeof a);
    engine_cu_args_weight(a, w);
    a.x = *gx;
    a.m = m;
    a.x_idx = x_idx;
    a.y = y;
    a.ldy = ldy;
    a.accumulate = accumulate;
    a.ksplit = ksplit;
    a.pipeline = p->gemm_pipe;
    if (grouped) {
        a.tiles = p->tiles;
        a.n_tiles = p->n_tiles;
        a.max_tiles = engine_cu_pf_max_tiles(m, p->X);
        if (a.type == ENGINE_TYPE_Q4_K || a.type == ENGINE_TYPE_Q5_K) {
            a.direct = p->gemm_direct;
            a.kint = p->gemm_kint;
        }
    }
    engine_cu_gemm(&a, st);
}

/* shl[t] = shg . (rmsnorm(x[t]) * norm_w): the shared expert's gate logit, a warp per token. */
__global__ void qp_shgate_kernel(const float *x, const float *norm_w, const float *shg, int n,
                                 int E, float eps, float *shl) {
    const int t = (int)(blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)), lane = threadIdx.x & 31;
    if (t >= n) return;
    const float *xr = x + (size_t)t * E;
    float ss = 0.0f, dot = 0.0f;
    for (int i = lane; i < E; i += 32) {
        ss += xr[i] * xr[i];
        dot += shg[i] * norm_w[i] * xr[i];
    }
    ss = engine_cu_warp_sum(ss);
    dot = engine_cu_warp_sum(dot);
    if (lane == 0) shl[t] = dot / sqrtf(ss / (float)E + eps);
}

/* x[t] += sigmoid(shl[t]) * sh[t] + sum_j w[t][j] * d[slot of (t, j)] (the CPU's order). */
__global__ void qp_combine_kernel(float *x, const float *sh, const float *shl, const float *d,
                                  const int32_t *slot_pos, const float *wts, int k, int E) {
    const int t = blockIdx.x;
    const float gs = 1.0f / (1.0f + expf(-shl[t]));
    float *xr = x + (size_t)t * E;
    for (int i = threadIdx.x; i < E; i += blockDim.x) {
        float acc = xr[i] + gs * sh[(size_t)t * E + i];
        for (int j = 0; j < k; j++)
            acc += wts[(size_t)t * k + j] * d[(size_t)slot_pos[(size_t)t * k + j] * E + i];
        xr[i] = acc;
    }
}

static void qp_deltanet(engine_cuda_q35_prefill *p, const engine_cu_q35_layer *ly, int n,
                        int32_t pos, qp_prep_cache *pc, cudaStream_t st) {
    const engine_cu_q35_view *v = &p->v;
    const engine_cu_gx *gx;
    gx = qp_prep(p, pc, ly->wqkv.type, p->x, NULL, n, p->E, ly->attn_norm, st);
    qp_gemm(p, &ly->wqkv, gx, n, p->big, p->C, 0, false, NULL, 1, st);
    gx = qp_prep(p, pc, ly->wz.type, p->x, NULL, n, p->E, ly->attn_norm, st);
    qp_gemm(p, &ly->wz, gx, n, p->z, p->di, 0, false, NULL, 1, st);
    gx = qp_prep(p, pc, ly->wbeta.type, p->x, NULL, n, p->E, ly->attn_norm, st);
    qp_gemm(p, &ly->wbeta, gx, n, p->ba, 2 * p->nv, 0, false, NULL, 1, st);
    if (ly->walpha.d) {
        gx = qp_prep(p, pc, ly->walpha.type, p->x, NULL, n, p->E, ly->attn_norm, st);
        qp_gemm(p, &ly->walpha, gx, n, p->ba + p->nv, 2 * p->nv, 0, false, NULL, 1, st);
    }
    qp_mark(p, QP_P_DN_PROJ, st);
    engine_cu_q35_conv_args ca;
    memset(&ca, 0, sizeof ca);
    ca.qkv = p->big;
    ca.conv_w = ly->conv;
    ca.ring = v->ring + (size_t)ly->slot * v->ring_per;
    ca.cv = p->cv;
    ca.snap_ring = v->snap + (size_t)ly->slot * v->ring_per;
    ca.snap_stride = v->snap_stride;
    ca.n = n;
    ca.pos0 = pos;
    ca.C = p->C;
    ca.K = p->K;
    engine_cu_q35_conv(&ca, st);
    engine_cu_q35_ring(&ca, st);
    engine_cu_q35_delta_args da;
    memset(&da, 0, sizeof da);
    da.cv = p->cv;
    da.ba = p->ba;
    da.dt_bias = ly->dt_bias;
    da.a = ly->a;
    da.state = v->state + (size_t)ly->slot * v->state_per;
    da.snap_state =
        v->snap + v->ring_per * (size_t)v->n_lin + (size_t)ly->slot * v->state_per;
    da.snap_stride = v->snap_stride;
    da.out = p->att;
    da.n = n;
    da.pos0 = pos;
    da.nk = p->nk;
    da.nv = p->nv;
    da.dk = p->dk;
    da.dv = p->dv;
    da.C = p->C;
    da.v_tiled = v->v_tiled;
    engine_cu_q35_delta_chunk(&da, st);
    engine_cu_q35_gnorm(p->att, p->z, ly->ssm_norm, n, p->nv, p->dv, p->eps, st);
    qp_mark(p, QP_P_DN_CORE, st);
    gx = qp_prep(p, pc, ly->wout.type, p->att, NULL, n, p->di, NULL, st);
    qp_gemm(p, &ly->wout, gx, n, p->x, p->E, 1, false, NULL, 1, st);
    qp_mark(p, QP_P_DN_OUT, st);
    pc->x = NULL; /* x changed */
}

/* The F32-cache path: prefill.cu's causal SIMT attention, then the output gate. */
static void qp_att_simt(engine_cuda_q35_prefill *p, const engine_cu_q35_layer *ly, int n,
                        int32_t pos, cudaStream_t st) {
    const engine_cu_q35_view *v = &p->v;
    engine_cu_pf_att_args aa;
    memset(&aa, 0, sizeof aa);
    aa.q = p->q;
    aa.k_cache = v->k_cache[ly->slot];
    aa.v_cache = v->v_cache[ly->slot];
    aa.kv_f32 = v->kv_f32;
    aa.n = n;
    aa.pos0 = pos;
    aa.n_head = p->nh;
    aa.n_kv = p->nkv;
    aa.hd = p->hd;
    aa.out = p->att;
    aa.tc = 1; /* where prefill.cu has a tensor-core kernel for the cache and head size */
    engine_cu_pf_attention(&aa, st);
    engine_cu_gatt_pf_gate(p->att, p->big, n, p->nh, p->hd, st);
}

static void qp_attention(engine_cuda_q35_prefill *p, const engine_cu_q35_layer *ly, int n,
                         int32_t pos, qp_prep_cache *pc, cudaStream_t st) {
    const engine_cu_q35_view *v = &p->v;
    const int qd = p->nh * p->hd, kvd = p->nkv * p->hd;
    const engine_cu_gx *gx;
    gx = qp_prep(p, pc, ly->wq.type, p->x, NULL, n, p->E, ly->attn_norm, st);
    qp_gemm(p, &ly->wq, gx, n, p->big, 2 * qd, 0, false, NULL, 1, st);
    gx = qp_prep(p, pc, ly->wk.type, p->x, NULL, n, p->E, ly->attn_norm, st);
    qp_gemm(p, &ly->wk, gx, n, p->k_, kvd, 0, false, NULL, 1, st);
    gx = qp_prep(p, pc, ly->wv.type, p->x, NULL, n, p->E, ly->attn_norm, st);
    qp_gemm(p, &ly->wv, gx, n, p->v_, kvd, 0, false, NULL, 1, st);
    qp_mark(p, QP_P_AT_PROJ, st);
    engine_cu_gatt_pf qa;
    memset(&qa, 0, sizeof qa);
    qa.qg = p->big;
    qa.k = p->k_;
    qa.v = p->v_;
    qa.q_norm = ly->q_norm;
    qa.k_norm = ly->k_norm;
    qa.rope = (const float2 *)v->rope;
    qa.rot = p->rot;
    qa.eps = p->eps;
    qa.k_cache = v->k_cache[ly->slot];
    qa.v_cache = v->v_cache[ly->slot];
    qa.kv_f32 = v->kv_f32;
    qa.n = n;
    qa.pos0 = pos;
    qa.n_head = p->nh;
    qa.n_kv = p->nkv;
    qa.hd = p->hd;
    qa.q = p->q;
    engine_cu_gatt_pf_qk(&qa, st);
    if (p->att_tc) {
        engine_cu_q35_att_args ta;
        memset(&ta, 0, sizeof ta);
        ta.q = p->q;
        ta.qg = p->big;
        ta.k_cache = v->k_cache[ly->slot];
        ta.v_cache = v->v_cache[ly->slot];
        ta.n = n;
        ta.pos0 = pos;
        ta.n_head = p->nh;
        ta.n_kv = p->nkv;
        ta.hd = p->hd;
        ta.out = p->att;
        engine_cu_q35_att_tc(&ta, st);
    } else {
        qp_att_simt(p, ly, n, pos, st);
    }
    qp_mark(p, QP_P_AT_CORE, st);
    gx = qp_prep(p, pc, ly->wo.type, p->att, NULL, n, qd, NULL, st);
    qp_gemm(p, &ly->wo, gx, n, p->x, p->E, 1, false, NULL, 1, st);
    qp_mark(p, QP_P_AT_OUT, st);
    pc->x = NULL;
}

static void qp_moe(engine_cuda_q35_prefill *p, const engine_cu_q35_layer *ly, int n,
                   qp_prep_cache *pc, cudaStream_t st) {
    const int E = p->E, X = p->X, k = p->k, nk = n * k;
    const engine_cu_gx *gx;
    gx = qp_prep(p, pc, ly->router.type, p->x, NULL, n, E, ly->post_norm, st);
    const int ksplit = ly->router.type == ENGINE_TYPE_F32 ? QP_ROUTER_SPLIT : 1;
    qp_gemm(p, &ly->router, gx, n, p->router, X, 0, false, NULL, ksplit, st);
    qp_shgate_kernel<<<(n + 7) / 8, 256, 0, st>>>(p->x, ly->post_norm, ly->shg, n, E, p->eps,
                                                  p->shl);
    engine_cu_pf_route(p->router, ksplit, n, X, k, 1, p->ids, p->wts, st);
    engine_cu_pf_sort(p->ids, n, k, X, p->sorted_tok, p->slot_pos, p->tiles, p->n_tiles, st);
    qp_mark(p, QP_P_ROUTE, st);
    gx = qp_prep(p, pc, ly->gate_exps.type, p->x, NULL, n, E, ly->post_norm, st);
    qp_gemm(p, &ly->gate_exps, gx, nk, p->g, p->F, 0, true, p->sorted_tok, 1, st);
    gx = qp_prep(p, pc, ly->up_exps.type, p->x, NULL, n, E, ly->post_norm, st);
    qp_gemm(p, &ly->up_exps, gx, nk, p->u, p->F, 0, true, p->sorted_tok, 1, st);
    qp_mark(p, QP_P_EXPERTS, st);
    gx = qp_prep(p, pc, ly->gate_sh.type, p->x, NULL, n, E, ly->post_norm, st);
    qp_gemm(p, &ly->gate_sh, gx, n, p->sg, p->Fs, 0, false, NULL, 1, st);
    gx = qp_prep(p, pc, ly->up_sh.type, p->x, NULL, n, E, ly->post_norm, st);
    qp_gemm(p, &ly->up_sh, gx, n, p->su, p->Fs, 0, false, NULL, 1, st);
    qp_mark(p, QP_P_SHARED, st);
    gx = qp_prep(p, pc, ly->down_exps.type, p->u, p->g, nk, p->F, NULL, st);
    qp_gemm(p, &ly->down_exps, gx, nk, p->d, E, 0, true, NULL, 1, st);
    gx = qp_prep(p, pc, ly->down_sh.type, p->su, p->sg, n, p->Fs, NULL, st);
    qp_gemm(p, &ly->down_sh, gx, n, p->sh, E, 0, false, NULL, 1, st);
    qp_combine_kernel<<<n, 256, 0, st>>>(p->x, p->sh, p->shl, p->d, p->slot_pos, p->wts, k, E);
    qp_mark(p, QP_P_DOWN, st);
    pc->x = NULL;
}

/* The MTP block's KV rows of the pairs the chunk at pos of n tokens completes (contract in
 * q35_prefill.cuh, engine_cu_q35_prefill_mtp_ok), after the main pass left the last block's
 * output in x: hid row 0 = h_{pos-1} (the pending row), rows 1..n = rmsnorm(x_t) * output_norm;
 * the pairs (hid row t, token t) at positions pos - 1 + t (at pos 0: rows and tokens 1..n-1 at
 * 0..n-2). x, sh, big, k_ and v_ are free once the head has read x. */
static int qp_mtp_feed(engine_cuda_q35_prefill *p, const engine_cu_q35_mtp_view *mv, int n,
                       int32_t pos, cudaStream_t st) {
    const engine_cu_q35_view *v = &p->v;
    const engine_cu_q35_layer *ly = &mv->ly;
    const size_t E = (size_t)p->E, f = sizeof(float);
    const int first = pos > 0 ? 0 : 1, cnt = n - first, kvd = p->nkv * p->hd;
    int rc;
    engine_cu_vrmsnorm(p->x, E, v->output_norm, p->eps, p->E, n, p->hid + E, E, st);
    if (pos > 0 && (rc = qp_err(cudaMemcpyAsync(p->hid, mv->hbuf, f * E,
                                                cudaMemcpyDeviceToDevice, st),
                                "cudaMemcpyAsync (MTP hidden)")))
        return rc;
    if (cnt > 0) {
        qp_prep_cache pc;
        memset(&pc, 0, sizeof pc);
        pc.form = -1;
        engine_cu_pf_embed((const uint8_t *)v->tok_embd.d, v->tok_embd.row_bytes,
                           v->tok_embd.type, p->E, p->tok + first, cnt, p->sh, st);
        engine_cu_vcat_norm(p->sh, p->hid + (size_t)first * E, mv->enorm, mv->hnorm, p->eps, p->E,
                            cnt, p->big, st);
        const engine_cu_gx *gx;
        gx = qp_prep(p, &pc, mv->eh.type, p->big, NULL, cnt, 2 * p->E, NULL, st);
        qp_gemm(p, &mv->eh, gx, cnt, p->x, p->E, 0, false, NULL, 1, st);
        gx = qp_prep(p, &pc, ly->wk.type, p->x, NULL, cnt, p->E, ly->attn_norm, st);
        qp_gemm(p, &ly->wk, gx, cnt, p->k_, kvd, 0, false, NULL, 1, st);
        gx = qp_prep(p, &pc, ly->wv.type, p->x, NULL, cnt, p->E, ly->attn_norm, st);
        qp_gemm(p, &ly->wv, gx, cnt, p->v_, kvd, 0, false, NULL, 1, st);
        engine_cu_gatt_pf qa; /* no query heads: k norm + rope, K and V stored */
        memset(&qa, 0, sizeof qa);
        qa.k = p->k_;
        qa.v = p->v_;
        qa.k_norm = ly->k_norm;
        qa.rope = (const float2 *)v->rope;
        qa.rot = p->rot;
        qa.eps = p->eps;
        qa.k_cache = mv->k_cache;
        qa.v_cache = mv->v_cache;
        qa.kv_f32 = v->kv_f32;
        qa.n = cnt;
        qa.pos0 = pos - 1 + first;
        qa.n_head = 0;
        qa.n_kv = p->nkv;
        qa.hd = p->hd;
        engine_cu_gatt_pf_qk(&qa, st);
    }
    /* the hidden state before each snapshot point the chunk keeps (as the verify passes' grid) */
    const int32_t floor = engine_cu_q35_snap_floor(pos, n);
    for (int32_t b = (pos / ENGINE_CUDA_Q35_SNAP_EVERY + 1) * ENGINE_CUDA_Q35_SNAP_EVERY;
         b <= pos + n; b += ENGINE_CUDA_Q35_SNAP_EVERY) {
        if (b <= floor) continue;
        const size_t slot = (size_t)(b / ENGINE_CUDA_Q35_SNAP_EVERY) % ENGINE_CUDA_Q35_SNAPSHOTS;
        if ((rc = qp_err(cudaMemcpyAsync(mv->snap_hid + slot * E, p->hid + (size_t)(b - pos) * E,
                                         f * E, cudaMemcpyDeviceToDevice, st),
                         "cudaMemcpyAsync (MTP snapshot hidden)")))
            return rc;
    }
    if ((rc = qp_err(cudaMemcpyAsync(mv->hbuf, p->hid + (size_t)n * E, f * E,
                                     cudaMemcpyDeviceToDevice, st),
                     "cudaMemcpyAsync (MTP pending hidden)")))
        return rc;
    return qp_err(cudaGetLastError(), "prefill MTP launch");
}

static int qp_chunk(engine_cuda_q35_prefill *p, const int32_t *tokens, int32_t n, int32_t pos,
                    float *logits_last, const engine_cu_q35_mtp_view *mv) {
    engine_cu_q35_view *v = &p->v;
    cudaStream_t st = (cudaStream_t)v->stream;
    int rc;
    qp_prep_cache pc;
    memset(&pc, 0, sizeof pc);
    pc.form = -1;
    if (pos == 0) { /* a new sequence: the conv ring and the recurrent state start at zero */
        if ((rc = qp_err(cudaMemsetAsync(v->ring, 0, sizeof(float) * v->ring_per * v->n_lin, st),
                         "cudaMemsetAsync")) ||
            (rc = qp_err(cudaMemsetAsync(v->state, 0, sizeof(float) * v->state_per * v->n_lin,
                                         st),
                         "cudaMemsetAsync")))
            return rc;
        for (int i = 0; i < ENGINE_CUDA_Q35_SNAPSHOTS; i++)
            v->snap_pos[i] = -1;
    }
    if ((rc = qp_err(cudaMemcpyAsync(p->tok, tokens, sizeof(int32_t) * (size_t)n,
                                     cudaMemcpyHostToDevice, st),
                     "cudaMemcpyAsync (tokens)")))
        return rc;
    p->n_mark = 0;
    qp_mark(p, -1, st);
    engine_cu_pf_embed((const uint8_t *)v->tok_embd.d, v->tok_embd.row_bytes, v->tok_embd.type,
                       p->E, p->tok, n, p->x, st);
    for (int l = 0; l < p->n_layer; l++) {
        const engine_cu_q35_layer *ly = &p->ly[l];
        if (ly->attn)
            qp_attention(p, ly, n, pos, &pc, st);
        else
            qp_deltanet(p, ly, n, pos, &pc, st);
        qp_moe(p, ly, n, &pc, st);
        if ((rc = qp_err(cudaGetLastError(), "prefill layer launch"))) return rc;
    }
    /* the snapshots the pass took (engine_cu_q35_snap_floor: the ones it kept) */
    const int32_t floor = engine_cu_q35_snap_floor(pos, n);
    for (int32_t b = (pos / ENGINE_CUDA_Q35_SNAP_EVERY + 1) * ENGINE_CUDA_Q35_SNAP_EVERY;
         b <= pos + n; b += ENGINE_CUDA_Q35_SNAP_EVERY)
        if (b > floor)
            v->snap_pos[(b / ENGINE_CUDA_Q35_SNAP_EVERY) % ENGINE_CUDA_Q35_SNAPSHOTS] = b;
    if (logits_last) {
        const engine_cu_gx *gx = qp_prep(p, &pc, v->output.type, p->x + (size_t)(n - 1) * p->E,
                                         NULL, 1, p->E, v->output_norm, st);
        qp_gemm(p, &v->output, gx, 1, p->logits, p->V, 0, false, NULL, 1, st);
        if ((rc = qp_err(cudaMemcpyAsync(logits_last, p->logits, sizeof(float) * (size_t)p->V,
                                         cudaMemcpyDeviceToHost, st),
                         "cudaMemcpyAsync (logits)")))
            return rc;
        qp_mark(p, QP_P_HEAD, st);
    }
    if (mv && (rc = qp_mtp_feed(p, mv, n, pos, st))) return rc;
    if ((rc = qp_err(cudaStreamSynchronize(st), "prefill (qwen35moe)"))) return rc;
    if (p->prof) engine_cu_pf_prof_add(p->ev, p->ev_cat, p->n_mark, p->prof_ms);
    if (p->prof) p->prof_tokens += n;
    return 0;
}

extern "C" int engine_cuda_q35_prefill_run(engine_cuda_q35_prefill *p, const int32_t *tokens,
                                           int32_t n, int32_t pos, float *logits_last) {
    if (n < 1 || pos < 0 || pos > p->v.n_ctx - n)
        return engine_err(ENGINE_ERANGE,
                          "cuda prefill: positions %d..%d do not fit the context of %d", pos,
                          pos + n - 1, p->v.n_ctx);
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= p->V)
            return engine_err(ENGINE_EINVAL, "cuda prefill: token id %d is not in [0, %d)",
                              tokens[i], p->V);
    /* a session with MTP on: every chunk also feeds its MTP block */
    engine_cu_q35_mtp_view mv;
    const bool feed = engine_cuda_q35_mtp_view_get(p->s, &mv) && mv.on;
    if (feed && !p->mtp_ok)
        return engine_err(ENGINE_EUNSUPPORTED, "cuda prefill: the session has MTP on but the MTP "
                          "block has no prefill GEMM (append through verify passes)");
    if (feed) *mv.win_m = 0; /* no per-token states of these tokens: truncation recomputes */
    int rc = qp_err(cudaSetDevice(p->v.device), "cudaSetDevice");
    for (int32_t i = 0; rc == 0 && i < n; i += p->max_tokens) {
        const int32_t c = std::min(p->max_tokens, n - i);
        rc = qp_chunk(p, tokens + i, c, pos + i, i + c == n ? logits_last : NULL,
                      feed ? &mv : NULL);
    }
    return rc;
}

extern "C" int engine_cuda_q35_state_get(engine_cuda_q35_session *s, float *ring, size_t *ring_n,
                                         float *state, size_t *state_n) {
    engine_cu_q35_view v;
    engine_cuda_q35_view_get(s, &v);
    *ring_n = v.ring_per * (size_t)v.n_lin;
    *state_n = v.state_per * (size_t)v.n_lin;
    int rc = qp_err(cudaSetDevice(v.device), "cudaSetDevice");
    if (rc == 0) rc = qp_err(cudaStreamSynchronize((cudaStream_t)v.stream), "sync");
    if (rc == 0 && ring)
        rc = qp_err(cudaMemcpy(ring, v.ring, sizeof(float) * *ring_n, cudaMemcpyDeviceToHost),
                    "cudaMemcpy (ring)");
    if (rc == 0 && state)
        rc = qp_err(cudaMemcpy(state, v.state, sizeof(float) * *state_n, cudaMemcpyDeviceToHost),
                    "cudaMemcpy (state)");
    return rc;
}

extern "C" int engine_cuda_op_q35_prefill_att(int n_head, int n_kv, int hd, int n, int pos0,
                                              const float *q, const float *qg, const uint16_t *k,
                                              const uint16_t *v, int tc, float *out) {
    int rc = engine_cuda_usable();
    if (rc) return rc;
    if (n < 1 || pos0 < 0 || !engine_cu_q35_att_tc_ok(0, n_head, n_kv, hd))
        return engine_err(ENGINE_EINVAL, "prefill attention op: unsupported shape");
    const size_t f = sizeof(float), qd = (size_t)n * n_head * hd;
    const size_t kvb = (size_t)(pos0 + n) * n_kv * hd * sizeof(uint16_t);
    float *dq = NULL, *dqg = NULL, *dout = NULL;
    void *dk = NULL, *dv = NULL;
    if ((rc = qp_err(cudaMalloc((void **)&dq, f * qd), "cudaMalloc")) ||
        (rc = qp_err(cudaMalloc((void **)&dqg, 2 * f * qd), "cudaMalloc")) ||
        (rc = qp_err(cudaMalloc((void **)&dout, f * qd), "cudaMalloc")) ||
        (rc = qp_err(cudaMalloc(&dk, kvb), "cudaMalloc")) ||
        (rc = qp_err(cudaMalloc(&dv, kvb), "cudaMalloc")) ||
        (rc = qp_err(cudaMemcpy(dq, q, f * qd, cudaMemcpyHostToDevice), "cudaMemcpy")) ||
        (rc = qp_err(cudaMemcpy(dqg, qg, 2 * f * qd, cudaMemcpyHostToDevice), "cudaMemcpy")) ||
        (rc = qp_err(cudaMemcpy(dk, k, kvb, cudaMemcpyHostToDevice), "cudaMemcpy")) ||
        (rc = qp_err(cudaMemcpy(dv, v, kvb, cudaMemcpyHostToDevice), "cudaMemcpy")))
        goto done;
    if (tc) {
        engine_cu_q35_att_args ta;
        memset(&ta, 0, sizeof ta);
        ta.q = dq;
        ta.qg = dqg;
        ta.k_cache = dk;
        ta.v_cache = dv;
        ta.n = n;
        ta.pos0 = pos0;
        ta.n_head = n_head;
        ta.n_kv = n_kv;
        ta.hd = hd;
        ta.out = dout;
        engine_cu_q35_att_tc(&ta, 0);
    } else {
        engine_cu_pf_att_args aa;
        memset(&aa, 0, sizeof aa);
        aa.q = dq;
        aa.k_cache = dk;
        aa.v_cache = dv;
        aa.n = n;
        aa.pos0 = pos0;
        aa.n_head = n_head;
        aa.n_kv = n_kv;
        aa.hd = hd;
        aa.out = dout;
        engine_cu_pf_attention(&aa, 0);
        engine_cu_gatt_pf_gate(dout, dqg, n, n_head, hd, 0);
    }
    if ((rc = qp_err(cudaDeviceSynchronize(), "prefill attention op")) == 0)
        rc = qp_err(cudaMemcpy(out, dout, f * qd, cudaMemcpyDeviceToHost), "cudaMemcpy");
done:
    cudaFree(dq);
    cudaFree(dqg);
    cudaFree(dout);
    cudaFree(dk);
    cudaFree(dv);
    return rc;
}

ENGINE_CU_TRACE_TU(q35_prefill)
