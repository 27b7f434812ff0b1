/* The CUDA backend: weight upload, decode sessions, the decode step as a CUDA graph
 * (contracts in cuda_backend.h).
 *
 * A decode step is 2 + 6 * n_layer launches (MoE; dense 2 + 5 * n_layer), each launched with
 * programmatic dependent launch (a kernel prefetches its weights before it waits for the
 * previous one):
 *   embed | per layer: qkv (RMSNorm fused) | attention (q/k norm, RoPE, KV store fused) |
 *   wo (+= residual) | router (RMSNorm fused) | gate/up + SwiGLU (routing fused) |
 *   down (+ weighted combine + residual) | head (RMSNorm fused) | sample
 * (qwen3moe: the router's product runs in the wo launch unless SPARK_CUDA_ROUTER_FUSE=0:
 * router_fuse.cuh)
 * The token and position live in device memory (engine_cu_step), so the graph captured on the
 * first step is replayed unchanged for every later one. The captured step has no embed launch:
 * its sample gathers the chosen token's embedding into x for the next replay, and a run of
 * replays starts with one embed launch of the host's token (step_embed; SPARK_CUDA_EMBED_DRAW=0
 * keeps embed in the graph). */
#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.cuh"
#include "common.cuh"
#include "matvec.cuh"
#include "moe.cuh"
#include "moe_fused.cuh"
#include "qdot.cuh"
#include "router_fuse.cuh"
#include "sample.cuh"
#include "step.cuh"

extern "C" {
#include "cuda/cuda_backend.h"
#include "model/model_int.h"
}

/* Whether sessions run the layers as one fused kernel (step.cuh) unless SPARK_CUDA_FUSED=0/1
 * says otherwise. */
#define SPARK_CUDA_FUSED_DEFAULT 0
/* Whether qwen3moe sessions fold the router into the wo launch (router_fuse.cuh) unless
 * SPARK_CUDA_ROUTER_FUSE=0/1 says otherwise: +6.7% tok/s on the 12-block Qwen3-30B-A3B Q4_K_M
 * cut (H200, 1449.1 -> 1545.6; the router launch's 4.1 us per layer on the critical path). */
#define SPARK_CUDA_ROUTER_FUSE_DEFAULT 1
/* SPARK_CUDA_COOP_SCALE when unset: the router fusion's up blocks compute h's RMS scale once per
 * block (moe.cuh engine_cu_ffn_up_args.coop): +1.5% tok/s on the 12-block Qwen3-30B-A3B cut,
 * +0.2% on the 8-block Qwen3.5 cut (H200, session 7 call 5); other rounding of the scale than
 * the per-warp sums (greedy tokens of random-weight models move at near-ties). */
#define SPARK_CUDA_COOP_SCALE_DEFAULT 1
/* SPARK_CUDA_ROUTE when unset: 0 the warp reductions' top-k, ENGINE_CU_ROUTE_SHFL the shuffles'
 * (moe.cuh engine_cu_ffn_up_args.route). */
#define SPARK_CUDA_ROUTE_DEFAULT 0

typedef struct {
    const uint8_t *d; /* device: matrix 0, row 0 */
    int type;
    int cols, rows, n_mat;
    size_t row_bytes;
} cu_w;

typedef struct {
    const float *attn_norm, *q_norm, *k_norm, *ffn_norm;
    cu_w wq, wk, wv, wo, gate_inp, gate_exps, up_exps, down_exps, ffn_gate, ffn_up, ffn_down;
} cu_layer;

struct engine_cuda_model {
    const engine_model *m;
    int device;
    uint8_t *mem; /* one allocation for every weight and norm */
    size_t bytes;
    cu_layer *layers;
    cu_w tok_embd, output;
    /* the head's repacked copy (matvec.cuh engine_cu_head_copy; d NULL: none), in head_mem */
    cu_w output_r;
    uint8_t *head_mem;
    const float *output_norm, *inv_freq;
    /* Router fusion (router_fuse.cuh), built at the first session that asks for it
     * (SPARK_CUDA_ROUTER_FUSE=1; rf_prepare): per layer [R | M], n_expert rows of
     * n_embd + n_head * head_dim floats, layer l at rf_mem + l * rf_layer. rf_state: 0 not
     * built yet, 1 built, -1 not applicable to this model (logged once). */
    float *rf_mem;
    size_t rf_layer;
    int rf_state;
};

/* engine_cuda_stream: steps queued ahead of the token the host waits for (the GPU never waits
 * on the host while it handles one token), and the events' ring (> the steps in flight) */
#define ENGINE_CUDA_STREAM_AHEAD 2
#define ENGINE_CUDA_STREAM_RING 4

struct engine_cuda_session {
    engine_cuda_model *cm;
    int32_t n_ctx;
    engine_kv_type kv;
    cudaStream_t stream;
    cudaGraphExec_t exec;
    bool captured;
    /* the step with the truncated draw (engine_cu_sample_topk), captured at its first use */
    cudaGraphExec_t exec_tk;
    /* SPARK_CUDA_ATT_GRID=N: the flat attention launches of exec ([0]) and exec_tk ([1]) get,
     * before a replay, the blocks that work at its position (engine_cu_att_flat_blocks; the
     * rest exit at once: 480 of the 512 at depth 0 with ATT_LONG 4096), but at least N (also
     * past the captured grid, which a context of 1,024 positions or fewer makes smaller than
     * the multiprocessors); 0: the whole grid. Default N: the multiprocessors. Session 37 calls C-D
     * (H200, 132 multiprocessors; tg128 against the whole grid): N = 1 +1.2% / -0.3% (Q4_K_M /
     * Q8_0), 64 +1.4% / -0.3%, 132 +1.6% / +0.2%, 264 +0.6% / +0.5%. Past the positions of
     * the per-head blocks (ATT_LONG; att_block's blocks) N > 1 keeps the whole grid: at 8K
     * depth its 132 working blocks alone were 1.1% slower than the 512 (call E). The graphs are
     * kept for their nodes; att_blocks: the grid in the exec now. */
    int att_grid;
    /* SPARK_CUDA_ATT_ONE=0|1|2 (default 2): below ENGINE_CU_ATT_SPLIT positions the nodes run
     * engine_cu_att_one_kernel (v 1 or 2) instead; 0: the flat kernel throughout. Session 38
     * call D (H200, tg128 against 0, twice each): 1 +0.7% / +0.7% (Q4_K_M / Q8_0), 2 +1.0% /
     * +0.8% (Q4_K_M 604.3, 602.2 against 595.9, 598.2). att_fn: the kernel in the exec now
     * (NULL: as captured) */
    int att_one;
    const void *att_fn[2];
    cudaGraph_t graph[2];
    cudaGraphNode_t *att_nodes[2];
    int n_att_nodes[2];
    unsigned att_blocks[2];
    /* SPARK_CUDA_SAMPLE_GREEDY=1 (off: session 42 measured +0.05% in call D, nothing on top of
     * the embedding in the draw in call G): the draw's node of exec
     * set, before replays that draw greedily, to the sampler's greedy instance
     * (engine_cu_sample_kernel: 728 sm_90 instructions against 856, a thread's logits loaded
     * 8 at a time), else back to the captured one. sample_node: that node of graph[0]
     * (NULL: none), sample_fn: its kernel in the exec now */
    bool sample_greedy;
    bool l2_persist; /* SPARK_CUDA_L2_PERSIST=1: l2_persist_nodes */
    /* the captured step's embedding gathered by the draw of the step before (engine_cu_embed_to;
     * SPARK_CUDA_EMBED_DRAW=0: a launch of its own at the step's start, as uncaptured steps
     * have it); capturing: enqueue_step is being captured */
    bool embed_draw, capturing;
    uint8_t *hot_lo, *hot_hi; /* the step's buffers past the KV cache (the L2 window) */
    cudaGraphNode_t sample_node;
    const void *sample_fn;
    bool tk; /* while capturing: which sampler the step launches */
    int tk_algo; /* its top_k by radix select (1, the default) or SPARK_CUDA_TOPK=merge (0) */
    /* engine_cuda_stream: the tokens' copies on a stream of their own, into pinned memory */
    cudaStream_t copy_st;
    cudaEvent_t ev_step[ENGINE_CUDA_STREAM_RING], ev_copy[ENGINE_CUDA_STREAM_RING];
    int32_t *h_tok; /* [n_ctx], pinned */
    int touch; /* SPARK_CUDA_TOUCH=1: weights into L1 before use (measured slower: off) */
    /* Diagnosis only (wrong results): SPARK_CUDA_DIAG_SKIP / SPARK_CUDA_DIAG_TWICE, bit masks
     * of the per-layer ops (1 qkv, 2 attention, 4 wo, 8 router, 16 up, 32 down) left out of /
     * launched twice in the captured step, so that an A/B of the timing gives each op's cost on
     * the graph's critical path (bench_decode -e "SPARK_CUDA_DIAG_SKIP=8"); SKIP bit 64: the
     * output head's product (the sampler reads the previous logits). */
    unsigned diag_skip, diag_twice;
    int diag_moe; /* SPARK_CUDA_DIAG_MOE: engine_cu_ffn_up_args.diag (the same results) */
    /* SPARK_CUDA_ROUTE (default SPARK_CUDA_ROUTE_DEFAULT): engine_cu_ffn_up_args.route, the up
     * blocks' routing (moe.cuh); also read by qwen35moe sessions */
    int route;
    int coop;    /* SPARK_CUDA_COOP_SCALE (0/1): engine_cu_ffn_up_args.coop (also qwen35moe) */
    int coop_mv; /* SPARK_CUDA_COOP_MV=1: engine_cu_mv.coop of the qkv, router and head launches */
    int nw_late; /* SPARK_CUDA_NW_LATE=1: the normed launches' nw_late, mf.diag 0x40 */
    bool head_r; /* the head launch reads the model's repacked copy (engine_cu_head_copy_wanted) */
    int head_rows; /* engine_cu_mv.q6r_rows (engine_cu_head_rows_env: SPARK_CUDA_HEAD_ROWS) */
    int head_ring; /* engine_cu_mv.ring of the head (engine_cu_head_ring_env) */
    int fused; /* the layers as one fused step kernel (step.cuh); SPARK_CUDA_FUSED=0/1 */
    /* Decode stage 5 (per-op launches), both measured slower on the H200 (bench/RESULTS.md),
     * so off unless asked for: SPARK_CUDA_BPS=mv,up,dn caps the matvec (qkv, wo), up and down
     * launches at that many blocks per multiprocessor (0: the stage-4 grids);
     * SPARK_CUDA_DOWN_ROUTE=1: the down kernel routes before its wait (the up launch then
     * triggers its successor late). */
    int bps_mv, bps_up, bps_dn, down_routes;
    /* SPARK_CUDA_PRELOAD=1: the qkv, wo, head and down kernels load their warps' first weight
     * chunks into registers before the wait / the staging (matvec.cuh, moe.cuh); measured 0.45%
     * slower on the H200 (bench/RESULTS.md, decode stage 5), so off by default */
    int preload;
    /* Decode stage 6 (off by default until measured): SPARK_CUDA_ROUTE_ONCE=1: the router
     * launch's last block routes into ids / wts (matvec.cuh route_ids) and the up kernel's
     * routing warp only reads them (moe.cuh routed); the same ids, weights and logits bit for
     * bit (test_cuda_forward); SPARK_CUDA_UP_EARLY=1 (implies it): the router launches the up
     * kernel only after its own wait, and the up blocks stage x before theirs;
     * SPARK_CUDA_DOWN_EARLY=1 (implies route once): the up launch triggers the down kernel
     * after its wait, and the down blocks read the ids and prefetch their rows before theirs */
    int route_once, up_early, down_early;
    /* Router fusion (qwen3moe, per-op launches; SPARK_CUDA_ROUTER_FUSE, default
     * SPARK_CUDA_ROUTER_FUSE_DEFAULT): the router's product runs in the wo launch and the
     * residual add moves into the up and down kernels (router_fuse.cuh). The stage-6 and
     * DOWN_ROUTE switches change the router launch, so asking for one turns the fusion off. */
    int rf;
    /* SPARK_CUDA_ATT_SHORT (default 1, measured +9.0% tok/s on the 12-block Qwen3-30B-A3B cut,
     * H200, bit-identical tokens): the attention launch serves positions < ENGINE_CU_ATT_SPLIT
     * with a block per query head (attention.cuh short_path; the same outputs bit for bit);
     * =0: the per-KV-head launch */
    int att_short;
    /* SPARK_CUDA_ATT_LONG=N (with ATT_SHORT; default 4096, 0 off): up to N positions the
     * attention launch also takes a block per (query head, split of 256), the last of a head
     * merging them (attention.cuh long_splits; the same outputs bit for bit). Measured on the
     * H200 (12-block Qwen3-30B-A3B cut, -n 64): +15% tok/s at depth 1024, +1.4% at 4096, -14%
     * at 8192 with no limit (K/V read once per head), so the default stops at 4096 */
    int att_long;
    /* SPARK_CUDA_MOE_FUSED=S (32 or 64; 1 means 32; default 0 off): qwen3moe layers run the MoE
     * block as one launch of slices of S intermediate rows (moe_fused.cuh) in place of the up
     * and down launches, with or without the router fusion; a layer it cannot take (logged at
     * session creation) keeps the pair. Not in the fused step (SPARK_CUDA_FUSED) nor the routing
     * trace; the stage-5/6 switches do not apply to fused layers. Measured 5% slower than the
     * pair on the H200 (12-block cut, GPU call 3 of session 6), so off by default. */
    int mfuse;
    /* The whole-grid form instead (moe_fused.cuh grid; qwen3moe's MoE in one launch, the pair's
     * results bit for bit): by default (form 3: 2 where it fits, else 1) unless one of the
     * pair's own switches is set (SPARK_CUDA_BPS, _ROUTE_ONCE, _UP_EARLY, _DOWN_EARLY,
     * _DOWN_ROUTE, _PRELOAD, _TOUCH; the pair's diagnoses SPARK_CUDA_DIAG_MOE and
     * _DIAG_SKIP / _TWICE on ops 4-5) or SPARK_CUDA_TMA leaves out the MoE's copies;
     * SPARK_CUDA_MOE_FUSED=g (form 3), g1 or g2 asks for it, =0 (or a slice) for the pair (or
     * the slices). Measured +3.4% (Q4_K_M) and +4.0% (Q8_0) tok/s over the pair on the full
     * Qwen3-30B-A3B files (H200, session 16 call 4). */
    int mf_grid;
    int mf_pre; /* SPARK_CUDA_MOE_FUSED_PRE=1: its down items preloaded (moe_fused.cuh preload) */
    int mf_items; /* SPARK_CUDA_MOE_ITEMS=1: the grid form's per-item barriers (moe_fused.cuh) */
    int mf_pipe, mf_pipe_dn; /* SPARK_CUDA_MOE_PIPE=I[,D]: the order of its copies (pipe) */
    int mf_y_pre;            /* SPARK_CUDA_MOE_YPRE=0 turns it off (moe_fused.cuh y_pre) */
    int mf_arrive;           /* SPARK_CUDA_MOE_ARRIVE=0 turns it off (moe_fused.cuh arrive) */
    int mf_dn_merge;         /* SPARK_CUDA_MOE_DMERGE=0|1 (moe_fused.cuh dn_merge; default 2) */
    int mf_lanes;            /* SPARK_CUDA_MOE_LANES=0|1 (moe_fused.cuh lanes; default 2) */
    int mf_roll;             /* SPARK_CUDA_MOE_ROLL=bits (moe_fused.cuh roll; default 3) */
    int mf_spec;             /* SPARK_CUDA_MOE_SPEC=0|2|3 (moe_fused.cuh spec; default 1) */
    int rf_spec;             /* SPARK_CUDA_RF_SPEC=0..4 (router_fuse.cuh spec; default 1) */
    int mv_spec;             /* SPARK_CUDA_MV_SPEC=0|1|3|4 (matvec.cuh spec; default 4) */
    int mf_norm;  /* SPARK_CUDA_NEXT_NORM=1: it asks L2 for the next attention norm (pf_norm) */
    int mf_diag; /* SPARK_CUDA_MOE_FUSED_DIAG=bits: phases left out (diagnosis, moe_fused.cuh) */
    int mf_red;  /* SPARK_CUDA_MOE_FUSED_RED=1: its reduction by row class, no wait */
    engine_cu_prog prog; /* the fused step's program, built at the first capture */
    uint8_t *mem;        /* one allocation: KV cache and step buffers */
    size_t bytes;
    void **k_cache, **v_cache; /* [n_layer] device pointers into mem */
    float *x, *q, *k, *v, *att, *router, *h, *logits, *partial, *sscratch, *wts;
    float *ao; /* router fusion: the attention block's output Wo att, apart from x */
    float *mf_part;     /* SPARK_CUDA_MOE_FUSED: the blocks' partial outputs (moe_fused.cuh) */
    unsigned *mf_ctr;   /* and its counters (zero between launches) */
    float *rope;        /* [n_ctx][hd / 2][2] cos, sin */
    unsigned *counters; /* [n_head + 2]: attention heads, sampler, router's routing */
    int32_t *ids, *out;
    uint64_t *skeys; /* the truncated draw's candidate lists (engine_cu_sample_topk) */
    uint32_t *allow; /* engine_cuda_stream's mask: [(n_vocab + 31) / 32] bits */
    engine_cu_step *step;
    engine_cu_step *h_step; /* pinned host copy */
};

static int cu_err(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    cudaGetLastError();
    return engine_err(e == cudaErrorMemoryAllocation ? ENGINE_ENOMEM : ENGINE_EINTERNAL,
                      "CUDA %s: %s", what, cudaGetErrorString(e));
}

#define CU(call)                                                                                   \
    do {                                                                                           \
        if ((rc = cu_err((call), #call))) goto done;                                               \
    } while (0)

extern "C" int engine_cuda_host_pin(void *p, size_t bytes) {
    int rc = 0;
    CU(cudaHostRegister(p, bytes, cudaHostRegisterPortable)); /* every device's context */
done:
    return rc;
}

extern "C" void engine_cuda_host_unpin(void *p) {
    if (p && cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}

extern "C" int engine_cuda_usable(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        return engine_err(ENGINE_ENODEV, "no usable CUDA GPU (%s)",
                          e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
    }
    return 0;
}

static size_t align256(size_t n) {
    return (n + 255) & ~(size_t)255;
}

static size_t weight_size(const engine_weight *w) {
    return w->data ? (size_t)w->n_mat * (size_t)w->rows * w->row_bytes : 0;
}

/* Check that the kernels handle w: a supported type and rows of whole 32-value chunks. */
static int check_weight(const engine_model *m, const engine_weight *w, const char *what) {
    if (!w->data) return 0;
    if (!engine_cu_type_supported(w->type))
        return engine_err(ENGINE_EUNSUPPORTED, "%s: %s of type %s has no CUDA kernel", m->path,
                          what, engine_type_name(w->type));
    if (w->cols % 32 != 0 || w->rows > INT32_MAX || w->cols > INT32_MAX)
        return engine_err(ENGINE_EUNSUPPORTED,
                          "%s: %s has rows of %lld values (the CUDA kernels "
                          "need a multiple of 32)",
                          m->path, what, (long long)w->cols);
    return 0;
}

typedef struct {
    engine_cuda_model *cm;
    size_t off; /* next free byte of cm->mem */
    size_t done, total, next_report;
} upload_ctx;

static int upload(upload_ctx *u, const void *src, size_t n, const void **dst) {
    *dst = NULL;
    if (!src || n == 0) return 0;
    uint8_t *d = u->cm->mem + u->off;
    /* chunks of 256 MiB keep the progress moving on large tensors */
    for (size_t o = 0; o < n; o += (size_t)256 << 20) {
        size_t c = n - o < ((size_t)256 << 20) ? n - o : ((size_t)256 << 20);
        int rc = cu_err(cudaMemcpy(d + o, (const uint8_t *)src + o, c, cudaMemcpyHostToDevice),
                        "cudaMemcpy (weights)");
        if (rc) return rc;
        u->done += c;
        if (u->done >= u->next_report) {
            engine_log(ENGINE_LOG_INFO, "cuda: uploading weights %3.0f%% (%.2f of %.2f GB)",
                       100.0 * (double)u->done / (double)u->total, (double)u->done / 1e9,
                       (double)u->total / 1e9);
            u->next_report += u->total / 10 + 1;
        }
    }
    u->off += align256(n);
    *dst = d;
    return 0;
}

static int upload_w(upload_ctx *u, const engine_weight *w, cu_w *out) {
    memset(out, 0, sizeof *out);
    if (!w->data) return 0;
    out->type = w->type;
    out->cols = (int)w->cols;
    out->rows = (int)w->rows;
    out->n_mat = (int)w->n_mat;
    out->row_bytes = w->row_bytes;
    const void *d;
    int rc = upload(u, w->data, weight_size(w), &d);
    out->d = (const uint8_t *)d;
    return rc;
}

static int upload_f(upload_ctx *u, const float *src, size_t n, const float **out) {
    const void *d;
    int rc = upload(u, src, n * sizeof(float), &d);
    *out = (const float *)d;
    return rc;
}

/* Shared memory the kernels take to stage an activation vector of n values for weights of
 * `type`; at most ENGINE_CU_MAX_STAGE_BYTES (sm_120 gives a block 99 KB at most). */
#define ENGINE_CU_MAX_STAGE_BYTES (96 * 1024)

static size_t stage_bytes(int type, int64_t n) {
    return engine_cu_xs_bytes(engine_cu_type_quant(type), (int)n);
}

#define FOR_LAYER_WEIGHTS(X)                                                                       \
    X(wq)                                                                                          \
    X(wk)                                                                                          \
    X(wv) X(wo) X(gate_inp) X(gate_exps) X(up_exps) X(down_exps) X(ffn_gate) X(ffn_up) X(ffn_down)

extern "C" int engine_cuda_model_new(engine_cuda_model **out, const engine_model *m, int device) {
    *out = NULL;
    int rc = engine_cuda_usable();
    if (rc) return rc;
    const engine_hparams *hp = &m->hp;
    if (hp->arch == ENGINE_ARCH_QWEN35MOE) /* its own backend: engine/cuda/qwen35.cu */
        return engine_err(ENGINE_EINVAL, "%s: qwen35moe: see engine_cuda_q35_model_new", m->path);
    if (!m->layers) return engine_err(ENGINE_EINVAL, "%s: no weights (vocab-only load)", m->path);
    if (!engine_cu_att_head_dim_ok((int)hp->head_dim_k) || hp->head_dim_k != hp->head_dim_v)
        return engine_err(ENGINE_EUNSUPPORTED,
                          "%s: head dimension %u has no CUDA attention "
                          "kernel (64, 128, 256)",
                          m->path, hp->head_dim_k);
    if (!engine_cu_att_group_ok((int)hp->n_head, (int)hp->n_head_kv))
        return engine_err(ENGINE_EUNSUPPORTED,
                          "%s: %u query heads over %u KV heads have no CUDA attention kernel (at "
                          "most %d per KV head)",
                          m->path, hp->n_head, hp->n_head_kv, ENGINE_CU_ATT_MAX_GROUP);
    if (hp->n_expert > ENGINE_CU_MAX_EXPERT)
        return engine_err(ENGINE_EUNSUPPORTED,
                          "%s: %u experts (the CUDA routing takes at most "
                          "%d)",
                          m->path, hp->n_expert, ENGINE_CU_MAX_EXPERT);
    if (hp->n_expert_used > ENGINE_CU_MAX_EXPERT_USED)
        return engine_err(ENGINE_EUNSUPPORTED,
                          "%s: %u experts per token (the CUDA kernels take "
                          "at most %d)",
                          m->path, hp->n_expert_used, ENGINE_CU_MAX_EXPERT_USED);
    size_t total = 0, stage = 0;
    char what[64];
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const engine_layer *ly = &m->layers[l];
        /* the activation vectors the kernels stage in shared memory */
        const int k = hp->n_expert_used ? (int)hp->n_expert_used : 1;
        const engine_weight *in_w[] = {&ly->wq, &ly->gate_inp, &ly->gate_exps, &ly->ffn_gate};
        for (size_t i = 0; i < sizeof in_w / sizeof in_w[0]; i++)
            if (in_w[i]->data) stage = std::max(stage, stage_bytes(in_w[i]->type, in_w[i]->cols));
        if (ly->wo.data) stage = std::max(stage, stage_bytes(ly->wo.type, ly->wo.cols));
        if (ly->down_exps.data)
            stage = std::max(stage, stage_bytes(ly->down_exps.type, k * ly->down_exps.cols));
        if (ly->ffn_down.data)
            stage = std::max(stage, stage_bytes(ly->ffn_down.type, ly->ffn_down.cols));
#define CHECK_W(f)                                                                                 \
    snprintf(what, sizeof what, "blk.%u." #f, l);                                                  \
    if ((rc = check_weight(m, &ly->f, what))) return rc;                                           \
    total += align256(weight_size(&ly->f));
        FOR_LAYER_WEIGHTS(CHECK_W)
#undef CHECK_W
        if (ly->gate_exps.data && ly->gate_exps.type != ly->up_exps.type)
            return engine_err(ENGINE_EUNSUPPORTED,
                              "%s: blk.%u: gate and up experts of different "
                              "types have no CUDA kernel",
                              m->path, l);
        if (ly->ffn_gate.data && ly->ffn_gate.type != ly->ffn_up.type)
            return engine_err(ENGINE_EUNSUPPORTED,
                              "%s: blk.%u: ffn_gate and ffn_up of different "
                              "types have no CUDA kernel",
                              m->path, l);
        total +=
            2 * align256(sizeof(float) * hp->n_embd) + 2 * align256(sizeof(float) * hp->head_dim_k);
    }
    if (m->output.data) stage = std::max(stage, stage_bytes(m->output.type, m->output.cols));
    if (stage > ENGINE_CU_MAX_STAGE_BYTES)
        return engine_err(ENGINE_EUNSUPPORTED,
                          "%s: an activation vector needs %zu bytes of shared memory in the CUDA "
                          "kernels (at most %d)",
                          m->path, stage, ENGINE_CU_MAX_STAGE_BYTES);
    if ((rc = check_weight(m, &m->tok_embd, "token_embd"))) return rc;
    if ((rc = check_weight(m, &m->output, "output"))) return rc;
    bool tied = m->output.data == m->tok_embd.data;
    total += align256(weight_size(&m->tok_embd)) + (tied ? 0 : align256(weight_size(&m->output)));
    total += align256(sizeof(float) * hp->n_embd) + align256(sizeof(float) * hp->head_dim_k / 2);

    engine_cuda_model *cm = (engine_cuda_model *)calloc(1, sizeof *cm);
    if (!cm) return engine_err(ENGINE_ENOMEM, "out of memory");
    cm->m = m;
    cm->device = device;
    cm->bytes = total;
    upload_ctx u = {cm, 0, 0, total, 0};
    size_t free_b = 0, total_b = 0;
    CU(cudaSetDevice(device));
    CU(cudaMemGetInfo(&free_b, &total_b));
    engine_log(ENGINE_LOG_INFO,
               "cuda: memory plan: weights %.2f GB; device %d has %.2f GB free "
               "of %.2f GB",
               (double)total / 1e9, device, (double)free_b / 1e9, (double)total_b / 1e9);
    if (total + ((size_t)256 << 20) > free_b) {
        rc = engine_err(ENGINE_ENOMEM,
                        "%s: the weights need %.2f GB of GPU memory (+0.27 GB "
                        "reserve) but GPU %d has %.2f GB free",
                        m->path, (double)total / 1e9, device, (double)free_b / 1e9);
        goto done;
    }
    if (!(cm->layers = (cu_layer *)calloc(hp->n_layer, sizeof(cu_layer)))) {
        rc = engine_err(ENGINE_ENOMEM, "out of memory");
        goto done;
    }
    CU(cudaMalloc((void **)&cm->mem, total));
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const engine_layer *ly = &m->layers[l];
        cu_layer *cl = &cm->layers[l];
#define UP_W(f)                                                                                    \
    if ((rc = upload_w(&u, &ly->f, &cl->f))) goto done;
        FOR_LAYER_WEIGHTS(UP_W)
#undef UP_W
        if ((rc = upload_f(&u, ly->attn_norm, hp->n_embd, &cl->attn_norm))) goto done;
        if ((rc = upload_f(&u, ly->ffn_norm, hp->n_embd, &cl->ffn_norm))) goto done;
        if ((rc = upload_f(&u, ly->q_norm, hp->head_dim_k, &cl->q_norm))) goto done;
        if ((rc = upload_f(&u, ly->k_norm, hp->head_dim_k, &cl->k_norm))) goto done;
    }
    if ((rc = upload_w(&u, &m->tok_embd, &cm->tok_embd))) goto done;
    if (tied)
        cm->output = cm->tok_embd;
    else if ((rc = upload_w(&u, &m->output, &cm->output)))
        goto done;
    if ((rc = upload_f(&u, m->output_norm, hp->n_embd, &cm->output_norm))) goto done;
    if ((rc = upload_f(&u, m->rope_inv_freq, hp->head_dim_k / 2, &cm->inv_freq))) goto done;
    ENGINE_ASSERT(u.off <= total);
    if (!tied && (rc = engine_cu_head_copy_view(cm->output, &cm->output_r, &cm->head_mem)))
        goto done;
    *out = cm;
    cm = NULL;
done:
    engine_cuda_model_free(cm);
    return rc;
}

extern "C" void engine_cuda_model_free(engine_cuda_model *cm) {
    if (!cm) return;
    if (cm->mem || cm->rf_mem || cm->head_mem) {
        cudaSetDevice(cm->device);
        cudaFree(cm->mem);
        cudaFree(cm->rf_mem);
        cudaFree(cm->head_mem);
    }
    free(cm->layers);
    free(cm);
}

extern "C" size_t engine_cuda_model_weight_bytes(const engine_cuda_model *cm) {
    return cm->bytes;
}

static size_t mat_bytes(const cu_w *w) {
    return (size_t)w->rows * w->row_bytes;
}

extern "C" size_t engine_cuda_model_bytes_per_token(const engine_cuda_model *cm) {
    const engine_hparams *hp = &cm->m->hp;
    size_t b = cm->tok_embd.row_bytes + mat_bytes(&cm->output);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const cu_layer *ly = &cm->layers[l];
        b += mat_bytes(&ly->wq) + mat_bytes(&ly->wk) + mat_bytes(&ly->wv) + mat_bytes(&ly->wo);
        if (hp->arch == ENGINE_ARCH_QWEN3MOE)
            b += mat_bytes(&ly->gate_inp) +
                 hp->n_expert_used * (mat_bytes(&ly->gate_exps) + mat_bytes(&ly->up_exps) +
                                      mat_bytes(&ly->down_exps));
        else
            b += mat_bytes(&ly->ffn_gate) + mat_bytes(&ly->ffn_up) + mat_bytes(&ly->ffn_down);
    }
    return b;
}

extern "C" int engine_cuda_copy_bandwidth(int device, size_t bytes, int reps, double *gbps) {
    *gbps = 0;
    int rc = engine_cuda_usable();
    if (rc) return rc;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    CU(cudaSetDevice(device));
    CU(cudaMalloc(&a, bytes));
    CU(cudaMalloc(&b, bytes));
    CU(cudaMemset(a, 1, bytes));
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    for (int i = 0; i < reps + 1; i++) {
        float ms = 0;
        CU(cudaEventRecord(e0));
        CU(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
        CU(cudaEventRecord(e1));
        CU(cudaEventSynchronize(e1));
        CU(cudaEventElapsedTime(&ms, e0, e1));
        double g = 2.0 * (double)bytes / (ms * 1e-3) / 1e9;
        if (i > 0 && g > *gbps) *gbps = g; /* the first is a warm-up */
    }
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return rc;
}

/* Build the router fusion's matrices of every layer (router_fuse.cuh) once per model, at the
 * first session that asks for it (so that bench_decode -e can time it beside the default on one
 * upload): 0 with cm->rf_state 1 when built, 0 with rf_state -1 (logged) when the model cannot
 * use it, else an error (no memory, a CUDA failure). Sessions of one model are created from one
 * thread (engine.h), so no lock. */
static int rf_prepare(engine_cuda_model *cm) {
    if (cm->rf_state) return 0;
    const engine_hparams *hp = &cm->m->hp;
    const int emb = (int)hp->n_embd, na = (int)(hp->n_head * hp->head_dim_k);
    const int ne = (int)hp->n_expert;
    const char *why = NULL;
    if (hp->arch != ENGINE_ARCH_QWEN3MOE || ne < 1) why = "not a qwen3moe model";
    for (uint32_t l = 0; !why && l < hp->n_layer; l++) {
        const cu_layer *ly = &cm->layers[l];
        if (!ly->wo.d || !ly->gate_inp.d || ly->wo.rows != emb || ly->wo.cols != na ||
            ly->gate_inp.rows != ne || ly->gate_inp.cols != emb)
            why = "a layer's wo or router has another shape";
        else if (engine_cu_rf_smem(ly->wo.type, emb, na) > ENGINE_CU_MAX_STAGE_BYTES)
            why = "its router blocks would need more shared memory than a block has";
    }
    if (why) {
        cm->rf_state = -1;
        engine_log(ENGINE_LOG_INFO, "cuda: router fusion off: %s", why);
        return 0;
    }
    int rc = 0;
    float *scratch = NULL;
    size_t free_b = 0, total_b = 0;
    cm->rf_layer = align256(sizeof(float) * (size_t)ne * (size_t)(emb + na)) / sizeof(float);
    const size_t bytes = sizeof(float) * cm->rf_layer * hp->n_layer;
    const size_t scratch_b = sizeof(float) * (size_t)emb * (size_t)na;
    CU(cudaSetDevice(cm->device));
    CU(cudaMemGetInfo(&free_b, &total_b));
    engine_log(ENGINE_LOG_INFO,
               "cuda: memory plan: router fusion %.1f MB (F32 [R | M] of %u layers, %.2f MB each)"
               " + %.1f MB while it is built; %.2f GB free",
               (double)bytes / 1e6, hp->n_layer, (double)bytes / 1e6 / hp->n_layer,
               (double)scratch_b / 1e6, (double)free_b / 1e9);
    if (bytes + scratch_b + ((size_t)64 << 20) > free_b) {
        rc = engine_err(ENGINE_ENOMEM,
                        "router fusion needs %.2f GB of GPU memory but %.2f GB are free "
                        "(SPARK_CUDA_ROUTER_FUSE=0 leaves it off)",
                        (double)(bytes + scratch_b) / 1e9, (double)free_b / 1e9);
        goto done;
    }
    CU(cudaMalloc((void **)&cm->rf_mem, bytes));
    CU(cudaMalloc((void **)&scratch, scratch_b));
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const cu_layer *ly = &cm->layers[l];
        if ((rc = engine_cu_rf_build(ly->wo.d, ly->wo.type, ly->wo.row_bytes, ly->gate_inp.d,
                                     ly->gate_inp.type, ly->gate_inp.row_bytes, ly->ffn_norm, ne,
                                     emb, na, scratch, cm->rf_mem + (size_t)l * cm->rf_layer, 0)))
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

/* ---------------------------------------------------------------------------------------------
 * Sessions
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    size_t kv_layer, x, q, kv, att, router, h, logits, partial, sscratch, skeys, allow, ids, wts,
        counters, step, out, rope, ao, mf_part, mf_ctr, total;
} sess_layout;

static sess_layout layout(const engine_cuda_model *cm, int32_t n_ctx, engine_kv_type kv) {
    const engine_hparams *hp = &cm->m->hp;
    sess_layout z;
    size_t hd = hp->head_dim_k, kv_dim = (size_t)hp->n_head_kv * hd;
    size_t k = hp->n_expert_used ? hp->n_expert_used : 1;
    size_t nff = hp->n_expert ? hp->n_ff_exp : hp->n_ff;
    z.kv_layer = align256((size_t)n_ctx * kv_dim * (kv == ENGINE_KV_F32 ? 4 : 2));
    z.x = align256(sizeof(float) * hp->n_embd);
    z.q = align256(sizeof(float) * hp->n_head * hd);
    z.kv = align256(sizeof(float) * kv_dim);
    z.att = z.q;
    z.router = align256(sizeof(float) * (hp->n_expert ? hp->n_expert : 1));
    z.h = align256(sizeof(float) * k * nff);
    z.logits = align256(sizeof(float) * hp->n_vocab);
    z.partial =
        align256(sizeof(float) * hp->n_head * (size_t)engine_cu_att_max_splits(n_ctx) * (hd + 2));
    z.sscratch = align256(sizeof(float) * 2 * ENGINE_CU_SAMPLE_BLOCKS);
    z.skeys = align256(sizeof(uint64_t) * ENGINE_CU_TOPK_KEYS);
    z.allow = align256(sizeof(uint32_t) * ((hp->n_vocab + 31) / 32));
    z.ids = align256(sizeof(int32_t) * k);
    z.wts = align256(sizeof(float) * k);
    z.counters = align256(sizeof(unsigned) * (hp->n_head + 2));
    z.step = align256(sizeof(engine_cu_step));
    z.out = align256(sizeof(int32_t) * (size_t)n_ctx);
    z.rope = align256(sizeof(float) * (size_t)n_ctx * hd);
    z.ao = z.x;
    z.mf_part = z.mf_ctr = 0; /* MoE: SPARK_CUDA_MOE_FUSED's scratch, 1.5 MB for the 30B shape */
    if (hp->n_expert) {
        z.mf_part = align256(sizeof(float) * engine_cu_moe_fused_partial_floats(
                                                 (int)k, (int)nff, (int)hp->n_embd));
        z.mf_ctr = align256(sizeof(unsigned) * engine_cu_moe_fused_counters((int)k, (int)nff));
    }
    z.total = 2 * hp->n_layer * z.kv_layer + z.x + z.q + 2 * z.kv + z.att + z.router + z.h +
              z.logits + z.partial + z.sscratch + z.skeys + z.allow + z.ids + z.wts + z.counters +
              z.step + z.out + z.rope + z.ao + z.mf_part + z.mf_ctr;
    return z;
}

/* SPARK_CUDA_PAD="FIELD:BYTES[,FIELD:BYTES...]" (a diagnosis: which of the step's buffers sets
 * its speed by where it lands? SPARK_CUDA_SCRATCH_FIRST moved them all and cost 1.2% at n_ctx
 * 512, session 42 call D): BYTES (rounded up to 256) left free before the named buffer of the
 * session's layout ("kv": before the KV cache). Unknown names are an error. When it is set, the
 * session logs where x, ao and mf_ctr landed in their 2 MiB pages ("kv:0": the default layout),
 * to set against bench/cuda/bench_place.cu's map of offsets. */
typedef struct {
    char name[16];
    size_t bytes;
} sess_pad;
enum { SESS_PADS = 8 };

static int pads_parse(const char *e, sess_pad *pads, size_t *sum) {
    int n = 0;
    *sum = 0;
    memset(pads, 0, sizeof(sess_pad) * SESS_PADS);
    while (e && *e) {
        const char *c = strchr(e, ':');
        char *end = NULL;
        if (!c || c == e || (size_t)(c - e) >= sizeof pads[0].name || n == SESS_PADS)
            return engine_err(ENGINE_EINVAL, "SPARK_CUDA_PAD: bad entry at \"%s\"", e);
        memcpy(pads[n].name, e, (size_t)(c - e));
        pads[n].name[c - e] = 0;
        unsigned long long b = strtoull(c + 1, &end, 0);
        if (end == c + 1 || (*end && *end != ',') || b > ((size_t)1 << 32))
            return engine_err(ENGINE_EINVAL, "SPARK_CUDA_PAD: bad size at \"%s\"", c + 1);
        pads[n].bytes = align256((size_t)b);
        *sum += pads[n++].bytes;
        e = *end ? end + 1 : end;
    }
    return 0;
}

static size_t pad_of(const sess_pad *pads, const char *name, int *used) {
    size_t b = 0;
    for (int i = 0; i < SESS_PADS; i++)
        if (pads[i].name[0] && !strcmp(pads[i].name, name)) b += pads[i].bytes, ++*used;
    return b;
}

extern "C" size_t engine_cuda_session_bytes(const engine_cuda_model *cm, int32_t n_ctx,
                                            engine_kv_type kv) {
    return layout(cm, n_ctx, kv).total;
}

static void mf_log(const engine_cuda_session *s);
static int capture(engine_cuda_session *s, bool tk);

extern "C" int engine_cuda_session_new(engine_cuda_session **out, engine_cuda_model *cm,
                                       int32_t n_ctx, engine_kv_type kv) {
    *out = NULL;
    const engine_hparams *hp = &cm->m->hp;
    if (n_ctx < 1 || (uint32_t)n_ctx > hp->n_ctx_train)
        return engine_err(ENGINE_ERANGE, "cuda session: context %d is not in [1, %u]", n_ctx,
                          hp->n_ctx_train);
    int rc = 0;
    sess_layout z = layout(cm, n_ctx, kv);
    size_t free_b = 0, total_b = 0, pad_sum = 0;
    sess_pad pads[SESS_PADS];
    int pads_used = 0, pads_n = 0;
    if ((rc = pads_parse(getenv("SPARK_CUDA_PAD"), pads, &pad_sum))) return rc;
    for (int i = 0; i < SESS_PADS; i++)
        pads_n += pads[i].name[0] != 0;
    z.total += pad_sum;
    uint8_t *p;
    engine_cuda_session *s = (engine_cuda_session *)calloc(1, sizeof *s);
    if (!s) return engine_err(ENGINE_ENOMEM, "out of memory");
    s->cm = cm;
    s->n_ctx = n_ctx;
    s->kv = kv;
    {
        const char *e = getenv("SPARK_CUDA_TOUCH");
        s->touch = e && e[0] == '1';
        s->head_r = engine_cu_head_copy_wanted();
        s->head_rows = engine_cu_head_rows_env();
        s->head_ring = engine_cu_head_ring_env(1);
        e = getenv("SPARK_CUDA_FUSED");
        s->fused = e ? e[0] == '1' : SPARK_CUDA_FUSED_DEFAULT;
        e = getenv("SPARK_CUDA_BPS");
        if (e && sscanf(e, "%d,%d,%d", &s->bps_mv, &s->bps_up, &s->bps_dn) != 3)
            s->bps_mv = s->bps_up = s->bps_dn = 0;
        e = getenv("SPARK_CUDA_DOWN_ROUTE");
        s->down_routes = e && e[0] == '1';
        e = getenv("SPARK_CUDA_PRELOAD");
        s->preload = e && e[0] == '1';
        e = getenv("SPARK_CUDA_ROUTE_ONCE");
        s->route_once = e && e[0] == '1';
        e = getenv("SPARK_CUDA_UP_EARLY");
        s->up_early = e && e[0] == '1';
        e = getenv("SPARK_CUDA_DOWN_EARLY");
        s->down_early = e && e[0] == '1';
        if (s->up_early || s->down_early) s->route_once = 1;
        e = getenv("SPARK_CUDA_ATT_SHORT");
        s->att_short = e ? e[0] != '0' : 1;
        e = getenv("SPARK_CUDA_ATT_LONG");
        {
            long n = e ? strtol(e, NULL, 10) : 4096; /* positions, at most 256 splits */
            n = n < 0 ? 0 : n > 256L * ENGINE_CU_ATT_SPLIT ? 256L * ENGINE_CU_ATT_SPLIT : n;
            s->att_long = (int)((n + ENGINE_CU_ATT_SPLIT - 1) / ENGINE_CU_ATT_SPLIT);
        }
        e = getenv("SPARK_CUDA_SAMPLE_GREEDY");
        s->sample_greedy = e && e[0] == '1';
        e = getenv("SPARK_CUDA_L2_PERSIST");
        s->l2_persist = e && e[0] == '1';
        e = getenv("SPARK_CUDA_EMBED_DRAW");
        s->embed_draw = !e || e[0] != '0';
        e = getenv("SPARK_CUDA_ATT_ONE");
        s->att_one = e && e[0] >= '0' && e[0] <= '2' ? e[0] - '0' : 2;
        e = getenv("SPARK_CUDA_ATT_GRID");
        if (e) {
            s->att_grid = atoi(e);
        } else if (cudaDeviceGetAttribute(&s->att_grid, cudaDevAttrMultiProcessorCount,
                                          cm->device) != cudaSuccess) {
            cudaGetLastError();
            s->att_grid = 1;
        }
        if (s->att_grid < 0) s->att_grid = 0;
        e = getenv("SPARK_CUDA_MOE_FUSED_PRE");
        s->mf_pre = e && e[0] == '1';
        e = getenv("SPARK_CUDA_MOE_ITEMS");
        s->mf_items = e && e[0] == '1';
        /* default 1,2: session 35 call G, with form 2's down runs merged (1,1 from session 21) */
        e = getenv("SPARK_CUDA_MOE_PIPE");
        s->mf_pipe = 1;
        s->mf_pipe_dn = 2;
        if (e) {
            char *end = NULL;
            const long pi = strtol(e, &end, 10);
            const long pd = end && *end == ',' ? strtol(end + 1, NULL, 10) : 0;
            s->mf_pipe = pi > 0 && pi < 8 ? (int)pi : 0;
            s->mf_pipe_dn = pd > 0 && pd < 3 ? (int)pd : 0;
        }
        e = getenv("SPARK_CUDA_MOE_ARRIVE"); /* on: session 35 call C */
        s->mf_arrive = !e || e[0] != '0';
        e = getenv("SPARK_CUDA_MOE_DMERGE"); /* 2, form 2 only: session 35 call E */
        s->mf_dn_merge = e && (e[0] == '0' || e[0] == '1') ? e[0] - '0' : 2;
        e = getenv("SPARK_CUDA_MOE_LANES"); /* 2, form 2 only: session 36 calls A-B */
        s->mf_lanes = e && (e[0] == '0' || e[0] == '1') ? e[0] - '0' : 2;
        e = getenv("SPARK_CUDA_MOE_ROLL"); /* 3, both loops: session 36 calls G-H */
        s->mf_roll = e && e[0] >= '0' && e[0] <= '3' ? e[0] - '0' : 3;
        e = getenv("SPARK_CUDA_MOE_SPEC");
        s->mf_spec = e && (e[0] == '0' || e[0] == '2' || e[0] == '3') ? e[0] - '0' : 1; /* 1: s39 */
        e = getenv("SPARK_CUDA_RF_SPEC");
        s->rf_spec = e && e[0] >= '0' && e[0] <= '4' ? e[0] - '0' : 1; /* 1: session 40 F */
        e = getenv("SPARK_CUDA_MV_SPEC");
        s->mv_spec =
            e && e[0] >= '0' && e[0] <= '4' && e[0] != '2' ? e[0] - '0' : 4; /* 4: session 40 F */
        e = getenv("SPARK_CUDA_MOE_YPRE"); /* on: session 32 calls A-B */
        s->mf_y_pre = !e || e[0] != '0';
        e = getenv("SPARK_CUDA_NEXT_NORM");
        s->mf_norm = e && e[0] == '1';
        e = getenv("SPARK_CUDA_MOE_FUSED_RED");
        s->mf_red = e && e[0] == '1';
        e = getenv("SPARK_CUDA_MOE_FUSED_DIAG");
        s->mf_diag = e ? (int)strtol(e, NULL, 0) : 0;
        e = getenv("SPARK_CUDA_DIAG_SKIP");
        s->diag_skip = e ? (unsigned)strtoul(e, NULL, 0) : 0u;
        e = getenv("SPARK_CUDA_DIAG_TWICE");
        s->diag_twice = e ? (unsigned)strtoul(e, NULL, 0) : 0u;
        e = getenv("SPARK_CUDA_DIAG_MOE");
        s->diag_moe = e ? atoi(e) : 0;
        s->route = engine_cu_route_parse(getenv("SPARK_CUDA_ROUTE"), SPARK_CUDA_ROUTE_DEFAULT);
        e = getenv("SPARK_CUDA_MOE_FUSED");
        s->mf_grid = !e ? 3 : e[0] == 'g' ? (e[1] == '1' || e[1] == '2' ? e[1] - '0' : 3) : 0;
        s->mfuse = e && !s->mf_grid ? atoi(e) : 0;
        s->mfuse = s->mfuse == 1 ? 32 : s->mfuse == 32 || s->mfuse == 64 ? s->mfuse : 0;
        /* the default whole-grid form steps aside for the switches of the up / down pair's own
         * paths, for the diagnoses of the pair's launches (SPARK_CUDA_DIAG_MOE, and
         * SPARK_CUDA_DIAG_SKIP / _TWICE on ops 4 and 5, the up and the down), and where the
         * MoE's bulk copies are turned off, so those still run as they say */
        if (!e && (s->bps_up || s->bps_dn || s->route_once || s->down_routes || s->preload ||
                   s->touch || s->diag_moe || ((s->diag_skip | s->diag_twice) & 0x30u) ||
                   (~s->route & (ENGINE_CU_ROUTE_TMA | ENGINE_CU_ROUTE_TMA_DN))))
            s->mf_grid = 0;
        e = getenv("SPARK_CUDA_COOP_SCALE");
        s->coop = e ? e[0] == '1' : SPARK_CUDA_COOP_SCALE_DEFAULT;
        e = getenv("SPARK_CUDA_COOP_MV");
        s->coop_mv = e && e[0] == '1';
        e = getenv("SPARK_CUDA_NW_LATE");
        s->nw_late = e && e[0] == '1';
        s->tk_algo = engine_cu_topk_algo_env();
        e = getenv("SPARK_CUDA_ROUTER_FUSE");
        s->rf = (e ? e[0] == '1' : SPARK_CUDA_ROUTER_FUSE_DEFAULT) && !s->fused &&
                !s->route_once && !s->down_routes;
    }
    if (s->rf && (rc = rf_prepare(cm))) goto done;
    if (s->rf && cm->rf_state != 1) s->rf = 0;
    s->k_cache = (void **)calloc(hp->n_layer, sizeof(void *));
    s->v_cache = (void **)calloc(hp->n_layer, sizeof(void *));
    if (!s->k_cache || !s->v_cache) {
        rc = engine_err(ENGINE_ENOMEM, "out of memory");
        goto done;
    }
    CU(cudaSetDevice(cm->device));
    CU(cudaMemGetInfo(&free_b, &total_b));
    engine_log(ENGINE_LOG_INFO,
               "cuda: session plan: KV cache %.1f MiB (%d positions, %s), "
               "buffers %.1f MiB; %.2f GB free",
               (double)(2 * hp->n_layer * z.kv_layer) / 1048576.0, n_ctx,
               kv == ENGINE_KV_F32 ? "f32" : "f16",
               (double)(z.total - 2 * hp->n_layer * z.kv_layer) / 1048576.0, (double)free_b / 1e9);
    if (z.total + ((size_t)64 << 20) > free_b) {
        rc = engine_err(ENGINE_ENOMEM,
                        "cuda session of %d positions needs %.2f GB of GPU memory "
                        "(KV cache and buffers) but %.2f GB are free",
                        n_ctx, (double)z.total / 1e9, (double)free_b / 1e9);
        goto done;
    }
    CU(cudaMalloc((void **)&s->mem, z.total));
    s->bytes = z.total;
    CU(cudaMemset(s->mem, 0, z.total));
    p = s->mem;
    {
        /* SPARK_CUDA_SCRATCH_FIRST=1 (a diagnosis: does the decode step's speed follow where
         * its small buffers land?): the step's buffers of fixed size first, at offsets that do
         * not depend on the context's length, then the others, then the KV cache; default: the
         * KV cache first. Session 42 call D: -1.2% at `bench -p 512` / 2048, nothing at -p 0 */
        const char *e = getenv("SPARK_CUDA_SCRATCH_FIRST");
        const bool first = e && e[0] == '1';
        if (first && pad_sum) {
            rc = engine_err(ENGINE_EINVAL, "SPARK_CUDA_PAD and SPARK_CUDA_SCRATCH_FIRST together");
            goto done;
        }
        const size_t kv_bytes = 2 * hp->n_layer * z.kv_layer, sized = z.partial + z.out + z.rope;
        /* the KV cache (first: at the end), and with first the context-sized buffers before it */
        uint8_t *pk = first ? s->mem + z.total - kv_bytes : p + pad_of(pads, "kv", &pads_used),
                *pn = first ? pk - sized : NULL;
        for (uint32_t l = 0; l < hp->n_layer; l++) {
            s->k_cache[l] = pk;
            pk += z.kv_layer;
            s->v_cache[l] = pk;
            pk += z.kv_layer;
        }
        if (!first) p = pk;
#define CARVE_AT(at, field, size, T)                                                               \
    do {                                                                                           \
        at += pad_of(pads, #field, &pads_used);                                                    \
        s->field = (T *)at;                                                                        \
        at += z.size;                                                                              \
    } while (0)
#define CARVE(field, size, T) CARVE_AT(p, field, size, T)
#define CARVE_N(field, size, T) CARVE_AT((*(first ? &pn : &p)), field, size, T)
        CARVE(x, x, float);
        CARVE(q, q, float);
        CARVE(k, kv, float);
        CARVE(v, kv, float);
        CARVE(att, att, float);
        CARVE(router, router, float);
        CARVE(h, h, float);
        CARVE(logits, logits, float);
        CARVE_N(partial, partial, float);
        CARVE(sscratch, sscratch, float);
        CARVE(skeys, skeys, uint64_t);
        CARVE(allow, allow, uint32_t);
        CARVE(ids, ids, int32_t);
        CARVE(wts, wts, float);
        CARVE(counters, counters, unsigned);
        CARVE(step, step, engine_cu_step);
        CARVE_N(out, out, int32_t);
        CARVE_N(rope, rope, float);
        CARVE(ao, ao, float);
        CARVE(mf_part, mf_part, float);
        CARVE(mf_ctr, mf_ctr, unsigned);
#undef CARVE_N
#undef CARVE
#undef CARVE_AT
        s->hot_lo = (uint8_t *)s->x;
        s->hot_hi = p;
        if (pads_used != pads_n) {
            rc = engine_err(ENGINE_EINVAL, "SPARK_CUDA_PAD names a buffer the session lacks");
            goto done;
        }
        if (getenv("SPARK_CUDA_PAD")) { /* where they landed ("kv:0": the default layout) */
            const uintptr_t page = ((uintptr_t)2 << 20) - 1;
            engine_log(ENGINE_LOG_INFO,
                       "cuda: SPARK_CUDA_PAD: x, ao, mf_ctr at %zu, %zu, %zu bytes into their "
                       "2 MiB pages (the session's memory at %zu)",
                       (size_t)((uintptr_t)s->x & page), (size_t)((uintptr_t)s->ao & page),
                       (size_t)((uintptr_t)s->mf_ctr & page), (size_t)((uintptr_t)s->mem & page));
        }
        ENGINE_ASSERT(first ? p == s->mem + z.total - kv_bytes - sized &&
                                  pn == s->mem + z.total - kv_bytes
                            : (size_t)(p - s->mem) == z.total);
    }
    {
        size_t rb = sizeof(float) * (size_t)n_ctx * hp->head_dim_k;
        float *t = (float *)malloc(rb);
        if (!t) {
            rc = engine_err(ENGINE_ENOMEM, "out of memory");
            goto done;
        }
        engine_cu_rope_table(t, cm->m->rope_inv_freq, (int)hp->head_dim_k, n_ctx);
        rc = cu_err(cudaMemcpy(s->rope, t, rb, cudaMemcpyHostToDevice), "cudaMemcpy (rope)");
        free(t);
        if (rc) goto done;
    }
    CU(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    CU(cudaMallocHost((void **)&s->h_step, sizeof *s->h_step));
    memset(s->h_step, 0, sizeof *s->h_step); /* top_k 0: no truncation unless asked */
    if ((s->mfuse || s->mf_grid) && hp->n_expert) mf_log(s);
    {
        /* SPARK_CUDA_CAPTURE_EARLY=1 (a diagnosis: does a prefill before the step's capture,
         * the order of every real session, slow the step?): the step captured here, before any
         * other launch of the session, instead of at its first decode. Session 42 call D: within
         * +0.05% at -p 512, nothing at -p 0 / 2048: no */
        const char *e = getenv("SPARK_CUDA_CAPTURE_EARLY");
        if (e && e[0] == '1' && (rc = capture(s, false))) goto done;
    }
    *out = s;
    s = NULL;
done:
    engine_cuda_session_free(s);
    return rc;
}

extern "C" void engine_cuda_session_free(engine_cuda_session *s) {
    if (!s) return;
    cudaSetDevice(s->cm->device);
    if (s->exec) cudaGraphExecDestroy(s->exec);
    if (s->exec_tk) cudaGraphExecDestroy(s->exec_tk);
    for (int i = 0; i < 2; i++) {
        if (s->graph[i]) cudaGraphDestroy(s->graph[i]);
        free(s->att_nodes[i]);
    }
    engine_cu_prog_free(&s->prog);
    if (s->stream) cudaStreamDestroy(s->stream);
    if (s->copy_st) cudaStreamDestroy(s->copy_st);
    for (int i = 0; i < ENGINE_CUDA_STREAM_RING; i++) {
        if (s->ev_step[i]) cudaEventDestroy(s->ev_step[i]);
        if (s->ev_copy[i]) cudaEventDestroy(s->ev_copy[i]);
    }
    cudaFreeHost(s->h_tok);
    cudaFreeHost(s->h_step);
    cudaFree(s->mem);
    free(s->k_cache);
    free(s->v_cache);
    free(s);
}

static engine_cu_mat mat(const cu_w *w, float *y, int accumulate) {
    engine_cu_mat m = {w->d, w->row_bytes, w->type, w->rows, y, accumulate};
    return m;
}

/* Events after each launch of an un-captured step (engine_cuda_profile). */
typedef struct {
    cudaEvent_t *ev;
    int *cat;
    int n;
} step_prof;

static void mark(step_prof *p, int cat, cudaStream_t st) {
    if (!p) return;
    cudaEventRecord(p->ev[p->n], st);
    p->cat[p->n++] = cat;
}

/* The arguments of one layer's ops (the same for the per-op launches and the fused step). */
typedef struct {
    engine_cu_mv qkv, wo, router;
    engine_cu_att at;
    engine_cu_ffn_up_args up;
    engine_cu_ffn_down_args dn;
    bool moe;
    bool fuse; /* router fusion: rf replaces the wo and router launches */
    engine_cu_rf_args rf;
    bool mfuse; /* SPARK_CUDA_MOE_FUSED: mf replaces the up and down launches */
    engine_cu_moe_fused_args mf;
} layer_ops;

static void layer_ops_get(const engine_cuda_session *s, uint32_t l, layer_ops *o) {
    const engine_cuda_model *cm = s->cm;
    const engine_hparams *hp = &cm->m->hp;
    const cu_layer *ly = &cm->layers[l];
    const int emb = (int)hp->n_embd, hd = (int)hp->head_dim_k;
    const float eps = hp->rms_norm_eps;
    memset(o, 0, sizeof *o);
    engine_cu_mv *mv = &o->qkv;
    mv->m[0] = mat(&ly->wq, s->q, 0);
    mv->m[1] = mat(&ly->wk, s->k, 0);
    mv->m[2] = mat(&ly->wv, s->v, 0);
    mv->n_mat = 3;
    mv->touch = s->touch;
    mv->max_bps = s->bps_mv;
    mv->preload = s->preload;
    mv->cols = emb;
    mv->x = s->x;
    mv->norm_w = ly->attn_norm;
    mv->eps = eps;
    mv->coop = s->coop_mv;
    mv->nw_late = s->nw_late;
    mv->tma = (s->route & ENGINE_CU_ROUTE_TMA_MV) != 0; /* the launchers check it applies */
    mv->spec = s->mv_spec;

    engine_cu_att at = {s->q,
                        s->k,
                        s->v,
                        ly->q_norm,
                        ly->k_norm,
                        (const float2 *)s->rope,
                        eps,
                        s->att_long,
                        s->k_cache[l],
                        s->v_cache[l],
                        s->kv == ENGINE_KV_F32,
                        s->att_short,
                        &s->step->pos,
                        s->n_ctx,
                        (int)hp->n_head,
                        (int)hp->n_head_kv,
                        hd,
                        s->partial,
                        s->counters,
                        s->att};
    o->at = at;

    mv = &o->wo;
    mv->m[0] = mat(&ly->wo, s->x, 1);
    mv->n_mat = 1;
    mv->touch = s->touch;
    mv->max_bps = s->bps_mv;
    mv->preload = s->preload;
    mv->cols = (int)hp->n_head * hd;
    mv->x = s->att;
    mv->tma = (s->route & ENGINE_CU_ROUTE_TMA_MV) != 0;
    mv->spec = s->mv_spec;

    engine_cu_ffn_up_args *up = &o->up;
    engine_cu_ffn_down_args *dn = &o->dn;
    dn->touch = s->touch;
    o->moe = hp->arch == ENGINE_ARCH_QWEN3MOE;
    if (o->moe) {
        mv = &o->router;
        mv->m[0] = mat(&ly->gate_inp, s->router, 0);
        mv->n_mat = 1;
        mv->touch = s->touch;
        mv->cols = emb;
        mv->x = s->x;
        mv->norm_w = ly->ffn_norm;
        mv->eps = eps;
        mv->coop = s->coop_mv;
        mv->nw_late = s->nw_late;
        up->router = s->router;
        up->n_expert = (int)hp->n_expert;
        up->k = (int)hp->n_expert_used;
        up->norm_topk = hp->norm_topk_prob;
        up->gate = ly->gate_exps.d;
        up->up = ly->up_exps.d;
        up->expert_bytes = (size_t)ly->gate_exps.rows * ly->gate_exps.row_bytes;
        up->row_bytes = ly->gate_exps.row_bytes;
        up->type = ly->gate_exps.type;
        up->rows = ly->gate_exps.rows;
        dn->down = ly->down_exps.d;
        dn->expert_bytes = (size_t)ly->down_exps.rows * ly->down_exps.row_bytes;
        dn->row_bytes = ly->down_exps.row_bytes;
        dn->type = ly->down_exps.type;
        dn->rows = ly->down_exps.rows;
        dn->k = up->k;
        dn->ids = s->ids;
        dn->weights = s->wts;
        dn->pf_bulk = (s->route & ENGINE_CU_ROUTE_BULK) != 0;
        if (s->route_once) { /* the router's last block routes; up reads the ids */
            mv->route_ids = s->ids;
            mv->route_wts = s->wts;
            mv->route_count = s->counters + hp->n_head + 1;
            mv->route_n = up->n_expert;
            mv->route_k = up->k;
            mv->route_norm = up->norm_topk;
            up->routed = 1;
            mv->route_late = up->stage_early = s->up_early;
            if (s->down_early && !s->down_routes) {
                up->trigger_late = 1;
                dn->ids_early = 1;
            }
        }
        if (s->down_routes) { /* routes before its wait: the up launch triggers it late */
            up->trigger_late = 1;
            dn->router = s->router;
            dn->n_expert = up->n_expert;
            dn->norm_topk = up->norm_topk;
        }
    } else {
        up->k = 1;
        up->gate = ly->ffn_gate.d;
        up->up = ly->ffn_up.d;
        up->row_bytes = ly->ffn_gate.row_bytes;
        up->type = ly->ffn_gate.type;
        up->rows = ly->ffn_gate.rows;
        dn->down = ly->ffn_down.d;
        dn->row_bytes = ly->ffn_down.row_bytes;
        dn->type = ly->ffn_down.type;
        dn->rows = ly->ffn_down.rows;
        dn->k = 1;
    }
    up->cols = emb;
    up->x = s->x;
    up->norm_w = ly->ffn_norm;
    up->eps = eps;
    up->h = s->h;
    up->ids = s->ids;
    up->weights = s->wts;
    up->max_bps = s->bps_up;
    dn->max_bps = s->bps_dn;
    dn->preload = s->preload;
    dn->cols = up->rows;
    dn->tma = (s->route & ENGINE_CU_ROUTE_TMA_DN) != 0; /* the launcher checks it applies */
    dn->h = s->h;
    dn->y = s->x;
    if (s->rf && o->moe) { /* router fusion: wo into ao; its residual add in up and down */
        const int na = o->wo.cols;
        o->fuse = true;
        o->wo.m[0] = mat(&ly->wo, s->ao, 0);
        o->rf.wo = o->wo;
        engine_cu_mat rm = {(const uint8_t *)(cm->rf_mem + (size_t)l * cm->rf_layer),
                            sizeof(float) * (size_t)(emb + na), ENGINE_TYPE_F32, (int)hp->n_expert,
                            s->router, 0};
        o->rf.rm.m[0] = rm;
        o->rf.rm.n_mat = 1;
        o->rf.rm.cols = emb + na;
        o->rf.x = s->x;
        o->rf.n_embd = emb;
        o->rf.spec = s->rf_spec;
        up->x_add = s->ao;
        dn->y_add = s->ao;
    }
    up->diag = dn->diag = s->diag_moe;
    up->route = s->route;
    up->coop = s->coop;
    if ((s->mfuse || s->mf_grid) && o->moe && s->mf_part) {
        o->mf.up = *up;
        o->mf.dn = *dn;
        o->mf.slice = s->mfuse;
        o->mf.preload = s->mf_pre;
        o->mf.diag = s->mf_diag | (s->nw_late ? 0x40 : 0);
        o->mf.class_reduce = s->mf_red;
        o->mf.grid = s->mf_grid;
        o->mf.items = s->mf_items;
        o->mf.pipe = s->mf_pipe;
        o->mf.pipe_down = s->mf_pipe_dn;
        o->mf.y_pre = s->mf_y_pre;
        o->mf.arrive = s->mf_arrive;
        o->mf.dn_merge = s->mf_dn_merge;
        o->mf.lanes = s->mf_lanes;
        o->mf.roll = s->mf_roll;
        o->mf.spec = s->mf_spec;
        if (s->mf_norm && l + 1 < hp->n_layer) {
            o->mf.pf_norm = cm->layers[l + 1].attn_norm;
            o->mf.pf_norm_n = emb;
        }
        o->mf.partial = s->mf_part;
        o->mf.counters = s->mf_ctr;
        o->mfuse = engine_cu_moe_fused_why(&o->mf) == NULL;
    }
}

/* Log which layers SPARK_CUDA_MOE_FUSED's launch takes (at session creation). */
static void mf_log(const engine_cuda_session *s) {
    const engine_hparams *hp = &s->cm->m->hp;
    uint32_t n = 0;
    const char *why = hp->n_expert ? NULL : "not an MoE model";
    for (uint32_t l = 0; hp->n_expert && l < hp->n_layer; l++) {
        layer_ops o;
        layer_ops_get(s, l, &o);
        n += o.mfuse;
        if (!o.mfuse && !why) why = engine_cu_moe_fused_why(&o.mf);
    }
    engine_log(ENGINE_LOG_INFO, "cuda: MoE block in one launch (%s%d) in %u of %u layers%s%s",
               s->mf_grid ? "whole grid, form " : "slices of ", s->mf_grid ? s->mf_grid : s->mfuse,
               n, hp->n_layer, why ? "; not: " : "", why ? why : "");
}

/* Build and upload the fused step's program: per layer the ops in the per-op order, each
 * waiting for the one before (step.cuh). */
static int prog_build(engine_cuda_session *s) {
    const engine_hparams *hp = &s->cm->m->hp;
    engine_cu_prog *pr = &s->prog;
    engine_cu_prog_free(pr);
    pr->hd = (int)hp->head_dim_k;
    int rc = 0;
    for (uint32_t l = 0; l < hp->n_layer && !rc; l++) {
        layer_ops o;
        layer_ops_get(s, l, &o);
        engine_cu_phase ph[3];
        int n = engine_cu_matvec_phases(&o.qkv, ph);
        if ((rc = engine_cu_prog_add(pr, ph, n, -1))) break;
        ph[0] = engine_cu_attention_phase(&o.at);
        if ((rc = engine_cu_prog_add(pr, ph, 1, -1))) break;
        n = engine_cu_matvec_phases(&o.wo, ph);
        if ((rc = engine_cu_prog_add(pr, ph, n, -1))) break;
        int flag = -1;
        if (o.moe) {
            n = engine_cu_matvec_phases(&o.router, ph);
            if ((rc = engine_cu_prog_add(pr, ph, n, -1))) break;
            flag = engine_cu_prog_flag(pr);
        }
        ph[0] = engine_cu_ffn_up_phase(&o.up);
        if ((rc = engine_cu_prog_add(pr, ph, 1, flag))) break;
        ph[0] = engine_cu_ffn_down_phase(&o.dn);
        rc = engine_cu_prog_add(pr, ph, 1, flag);
    }
    if (!rc) rc = cu_err(cudaGetLastError(), "occupancy query (fused step)");
    if (!rc) rc = engine_cu_prog_upload(pr);
    if (rc) engine_cu_prog_free(pr);
    return rc;
}

/* Host copies of each MoE layer's routing inputs after its up launch (engine_cuda_route_trace):
 * ids [n_layer][k], raw router logits [n_layer][n_expert], and with the fusion x and ao
 * [n_layer][n_embd] (the up kernel's input h = x + ao). */
typedef struct {
    int32_t *ids;
    float *raw, *x, *ao;
} route_trace;

/* Enqueue one decode step (state in s->step) on s->stream; p: NULL, or events to record (then
 * always the per-op launches, so that each op's time shows); t: NULL, or the routing to copy out
 * (also per-op launches). */
static void enqueue_step(engine_cuda_session *s, step_prof *p, route_trace *t) {
    const engine_cuda_model *cm = s->cm;
    const engine_hparams *hp = &cm->m->hp;
    cudaStream_t st = s->stream;
    const int emb = (int)hp->n_embd;
    const float eps = hp->rms_norm_eps;
    /* a captured step's embedding comes from the draw before it (step_embed before the first) */
    const bool draw_embeds = s->embed_draw && s->capturing;
    engine_cu_embed_to next = {cm->tok_embd.d, cm->tok_embd.row_bytes, cm->tok_embd.type, emb,
                               s->x};
    mark(p, -1, st);
    if (!draw_embeds)
        engine_cu_embed(cm->tok_embd.d, cm->tok_embd.row_bytes, cm->tok_embd.type, emb, s->step, 1,
                        s->x, st);
    mark(p, 0, st);
    if (s->fused && s->prog.total && !p && !t) {
        engine_cu_prog_launch(&s->prog, st);
    } else {
        for (uint32_t l = 0; l < hp->n_layer; l++) {
            layer_ops o;
            layer_ops_get(s, l, &o);
            for (unsigned op = 0; op < 6; op++) {
                const unsigned bit = 1u << op;
                const int n_launch = s->diag_skip & bit ? 0 : s->diag_twice & bit ? 2 : 1;
                for (int i = 0; i < n_launch; i++) {
                    switch (op) {
                    case 0: engine_cu_matvec(&o.qkv, st); break;
                    case 1: engine_cu_attention(&o.at, st); break;
                    case 2:
                        if (o.fuse)
                            engine_cu_rf_wo(&o.rf, st);
                        else
                            engine_cu_matvec(&o.wo, st);
                        break;
                    case 3:
                        if (o.moe && !o.fuse) engine_cu_matvec(&o.router, st);
                        break;
                    case 4:
                        if (o.mfuse && !t)
                            engine_cu_moe_fused(&o.mf, st);
                        else
                            engine_cu_ffn_up(&o.up, st);
                        break;
                    default:
                        if (!o.mfuse || t) engine_cu_ffn_down(&o.dn, st);
                        break;
                    }
                }
                if (op != 3 || (o.moe && !o.fuse)) mark(p, (int)op + 1, st);
                if (t && op == 4 && o.moe) {
                    const size_t k = hp->n_expert_used, ne = hp->n_expert;
                    cudaMemcpyAsync(t->ids + l * k, s->ids, sizeof(int32_t) * k,
                                    cudaMemcpyDeviceToHost, st);
                    cudaMemcpyAsync(t->raw + l * ne, s->router, sizeof(float) * ne,
                                    cudaMemcpyDeviceToHost, st);
                    if (o.fuse) {
                        cudaMemcpyAsync(t->x + l * (size_t)emb, s->x, sizeof(float) * emb,
                                        cudaMemcpyDeviceToHost, st);
                        cudaMemcpyAsync(t->ao + l * (size_t)emb, s->ao, sizeof(float) * emb,
                                        cudaMemcpyDeviceToHost, st);
                    }
                }
            }
        }
    }
    engine_cu_mv mv;
    memset(&mv, 0, sizeof mv);
    mv.m[0] = mat(s->head_r && cm->output_r.d ? &cm->output_r : &cm->output, s->logits, 0);
    mv.n_mat = 1;
    mv.touch = s->touch;
    mv.preload = s->preload;
    mv.cols = emb;
    mv.x = s->x;
    mv.norm_w = cm->output_norm;
    mv.eps = eps;
    mv.coop = s->coop_mv;
    mv.nw_late = s->nw_late;
    mv.q6r_rows = s->head_rows;
    mv.ring = s->head_ring;
    if (!(s->diag_skip & 64u)) engine_cu_matvec(&mv, st);
    mark(p, 7, st);
    if (s->tk)
        engine_cu_sample_topk(s->logits, (int)hp->n_vocab, s->step, s->out, s->sscratch, s->skeys,
                              s->counters + hp->n_head, st, s->allow, draw_embeds ? &next : NULL);
    else
        engine_cu_sample(s->logits, (int)hp->n_vocab, s->step, s->out, s->sscratch,
                         s->counters + hp->n_head, st, s->allow, draw_embeds ? &next : NULL);
    mark(p, 8, st);
}

/* Before the first replay of a captured step whose embedding the draw gathers: the embedding
 * of the step state's token (the host's), as the step without embed_draw starts. */
static void step_embed(const engine_cuda_session *s) {
    const engine_cuda_model *cm = s->cm;
    if (s->embed_draw)
        engine_cu_embed(cm->tok_embd.d, cm->tok_embd.row_bytes, cm->tok_embd.type,
                        (int)cm->m->hp.n_embd, s->step, 1, s->x, s->stream);
}

/* The kernel nodes of graph g that launch fn (NULL: every kernel node), into *out (allocated
 * here, freed by the caller also on an error), *n of them. */
static int graph_kernel_nodes(cudaGraph_t g, const void *fn, cudaGraphNode_t **out, int *n) {
    int rc = 0;
    size_t nn = 0;
    cudaGraphNode_t *nodes = NULL;
    *n = 0;
    CU(cudaGraphGetNodes(g, NULL, &nn));
    nodes = (cudaGraphNode_t *)malloc(sizeof *nodes * (nn ? nn : 1));
    *out = (cudaGraphNode_t *)malloc(sizeof *nodes * (nn ? nn : 1));
    if (!nodes || !*out) {
        rc = engine_err(ENGINE_ENOMEM, "out of memory");
        goto done;
    }
    CU(cudaGraphGetNodes(g, nodes, &nn));
    for (size_t i = 0; i < nn; i++) {
        cudaGraphNodeType t;
        cudaKernelNodeParams kp;
        CU(cudaGraphNodeGetType(nodes[i], &t));
        if (t != cudaGraphNodeTypeKernel) continue;
        CU(cudaGraphKernelNodeGetParams(nodes[i], &kp));
        if (!fn || kp.func == fn) (*out)[(*n)++] = nodes[i];
    }
done:
    free(nodes);
    return rc;
}

/* SPARK_CUDA_L2_PERSIST=1 (a diagnosis: the step's speed moved by up to 1% with where its
 * buffers land, session 42 calls D-E, and a 4 KiB shift of the wo output's buffer alone cost
 * 0.4%; are its activations pushed out of L2 between a write and the next launch's read?): every
 * kernel node of graph g gets an access-policy window over the session's buffers past the KV
 * cache (x .. the MoE counters) with persisting hits, and the device sets aside that much of L2
 * for persisting lines (at most its limit; a window larger than that persists a fraction). The
 * limit is the device's and stays raised after the session. Measured (call F): +0.06% at
 * `bench -p 512`; it took back a 16 KiB shift's loss but not a 4 KiB one's: not the mechanism. */
static int l2_persist_nodes(engine_cuda_session *s, cudaGraph_t g) {
    if (!s->l2_persist) return 0;
    int rc = 0, n = 0, max_p = 0, max_w = 0;
    cudaGraphNode_t *nodes = NULL;
    size_t cur = 0, bytes = (size_t)(s->hot_hi - s->hot_lo);
    CU(cudaDeviceGetAttribute(&max_p, cudaDevAttrMaxPersistingL2CacheSize, s->cm->device));
    CU(cudaDeviceGetAttribute(&max_w, cudaDevAttrMaxAccessPolicyWindowSize, s->cm->device));
    if (max_p <= 0 || max_w <= 0) {
        engine_log(ENGINE_LOG_INFO, "cuda: SPARK_CUDA_L2_PERSIST: no persisting L2 here");
        return 0;
    }
    bytes = bytes < (size_t)max_w ? bytes : (size_t)max_w;
    {
        const size_t want = bytes < (size_t)max_p ? bytes : (size_t)max_p;
        CU(cudaDeviceGetLimit(&cur, cudaLimitPersistingL2CacheSize));
        if (cur < want) CU(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, want));
        CU(cudaDeviceGetLimit(&cur, cudaLimitPersistingL2CacheSize));
    }
    {
        cudaKernelNodeAttrValue v;
        memset(&v, 0, sizeof v);
        v.accessPolicyWindow.base_ptr = s->hot_lo;
        v.accessPolicyWindow.num_bytes = bytes;
        v.accessPolicyWindow.hitRatio = cur >= bytes ? 1.0f : (float)cur / (float)bytes;
        v.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
        v.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
        if ((rc = graph_kernel_nodes(g, NULL, &nodes, &n))) goto done;
        for (int i = 0; i < n; i++)
            CU(cudaGraphKernelNodeSetAttribute(nodes[i], cudaKernelNodeAttributeAccessPolicyWindow,
                                               &v));
        engine_log(ENGINE_LOG_INFO,
                   "cuda: L2 window of %.2f MiB (persisting %.2f MiB, hit ratio %.2f) on %d "
                   "launches",
                   (double)bytes / 1048576.0, (double)cur / 1048576.0,
                   (double)v.accessPolicyWindow.hitRatio, n);
    }
done:
    free(nodes);
    return rc;
}

/* The draw's launch of graph g (the step without the truncated draw), into s->sample_node,
 * where the session takes SPARK_CUDA_SAMPLE_GREEDY. */
static int sample_node_find(engine_cuda_session *s, cudaGraph_t g) {
    const void *fn = engine_cu_sample_kernel(false);
    s->sample_node = NULL;
    s->sample_fn = fn;
    if (!s->sample_greedy) return 0;
    cudaGraphNode_t *found = NULL;
    int n = 0;
    const int rc = graph_kernel_nodes(g, fn, &found, &n);
    if (!rc && n > 0) s->sample_node = found[0];
    free(found);
    return rc;
}

/* Before replays of exec that draw greedily (greedy) or not: its draw's node set to the
 * sampler's greedy instance or back to the captured kernel, where that changes. */
static int sample_set(engine_cuda_session *s, bool greedy) {
    int rc = 0;
    const void *fn = engine_cu_sample_kernel(greedy);
    if (!s->sample_node || fn == s->sample_fn) return 0;
    cudaKernelNodeParams kp; /* the node as captured */
    CU(cudaGraphKernelNodeGetParams(s->sample_node, &kp));
    kp.func = (void *)fn;
    CU(cudaGraphExecKernelNodeSetParams(s->exec, s->sample_node, &kp));
    s->sample_fn = fn;
done:
    return rc;
}

/* The flat attention launches of graph g (one a layer), into s->att_nodes[tk]: none when the
 * session does not take them (SPARK_CUDA_ATT_GRID=0, ATT_SHORT=0). */
static int att_nodes_find(engine_cuda_session *s, cudaGraph_t g, int tk) {
    if ((!s->att_grid && !s->att_one) || !s->att_short) return 0;
    const int rc = graph_kernel_nodes(g, engine_cu_att_flat_kernel((int)s->cm->m->hp.head_dim_k),
                                      &s->att_nodes[tk], &s->n_att_nodes[tk]);
    if (rc) {
        s->n_att_nodes[tk] = 0; /* none updated: the graph is freed with the error */
        return rc;
    }
    if (s->n_att_nodes[tk] != (int)s->cm->m->hp.n_layer)
        engine_log(ENGINE_LOG_INFO,
                   "cuda: %d flat attention launches found in the step of %u layers",
                   s->n_att_nodes[tk], s->cm->m->hp.n_layer);
    return 0;
}

/* Before a replay of exec (tk: exec_tk) at position pos: its attention launches' grids set to
 * the blocks that work at pos, when that changed (every ENGINE_CU_ATT_SPLIT positions). The
 * change applies to the replays launched after it, not to those already launched. */
static int att_grid_set(engine_cuda_session *s, int tk, int32_t pos) {
    int rc = 0;
    if (!s->n_att_nodes[tk]) return 0;
    const engine_hparams *hp = &s->cm->m->hp;
    const unsigned all =
        engine_cu_att_flat_blocks((int)hp->n_head, (int)hp->n_head_kv, s->att_long, s->n_ctx, -1);
    unsigned nb =
        engine_cu_att_flat_blocks((int)hp->n_head, (int)hp->n_head_kv, s->att_long, s->n_ctx, pos);
    const int n_act = pos / ENGINE_CU_ATT_SPLIT + 1;
    if (s->att_grid > 1 && n_act > 1 && n_act > s->att_long)
        nb = all; /* att_block's path: the whole grid (measured faster at 8K, see att_grid) */
    /* the floor holds past the captured grid too (the blocks past the working ones exit before
     * any load in both kernels), so a short context runs the grid a long one runs */
    if (nb < (unsigned)s->att_grid) nb = (unsigned)s->att_grid;
    if (!s->att_grid) nb = all;
    const void *fn =
        s->att_one && n_act == 1
            ? engine_cu_att_one_kernel((int)hp->head_dim_k, s->kv == ENGINE_KV_F32, s->att_one)
            : NULL;
    if (nb == s->att_blocks[tk] && fn == s->att_fn[tk]) return 0;
    for (int i = 0; i < s->n_att_nodes[tk]; i++) {
        cudaKernelNodeParams kp; /* the node as captured (exec updates leave it) */
        CU(cudaGraphKernelNodeGetParams(s->att_nodes[tk][i], &kp));
        kp.gridDim.x = nb;
        if (fn) {
            kp.func = (void *)fn;
            kp.sharedMemBytes = (unsigned)engine_cu_att_one_smem((int)hp->head_dim_k);
        }
        CU(cudaGraphExecKernelNodeSetParams(tk ? s->exec_tk : s->exec, s->att_nodes[tk][i], &kp));
    }
    s->att_blocks[tk] = nb;
    s->att_fn[tk] = fn;
done:
    return rc;
}

/* Capture the step (tk: with the truncated draw) into s->exec or s->exec_tk. */
static int capture(engine_cuda_session *s, bool tk) {
    int rc = 0;
    cudaGraph_t g = NULL;
    if (s->fused && !s->prog.total && (rc = prog_build(s))) {
        if (rc != ENGINE_EUNSUPPORTED) return rc;
        engine_log(ENGINE_LOG_INFO, "cuda: per-op decode step (%s)", engine_error_last());
        s->fused = 0;
        rc = 0;
    }
    if (tk) CU(engine_cu_sample_topk_prepare());
    s->tk = tk;
    CU(cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal));
    s->capturing = true;
    enqueue_step(s, NULL, NULL);
    s->capturing = false;
    s->tk = false;
    CU(cudaStreamEndCapture(s->stream, &g));
    CU(cudaGetLastError());
    if ((rc = l2_persist_nodes(s, g))) goto done;
    CU(cudaGraphInstantiate(tk ? &s->exec_tk : &s->exec, g, 0));
    if (!tk) s->captured = true;
    s->att_blocks[tk] = 0; /* the whole grid, as captured */
    s->att_fn[tk] = NULL;
    if ((rc = att_nodes_find(s, g, tk))) goto done;
    if (!tk && (rc = sample_node_find(s, g))) goto done;
    s->graph[tk] = g; /* its nodes name the attention launches to update */
    g = NULL;
done:
    s->tk = false;
    if (g) cudaGraphDestroy(g);
    return rc;
}

/* Set the step state and run n steps. */
/* The positions and token of n steps from token at pos: 0 or an engine error. */
static int run_steps_check(const engine_cuda_session *s, int32_t token, int32_t pos, int32_t n) {
    const engine_hparams *hp = &s->cm->m->hp;
    if (pos < 0 || n < 1 || pos > s->n_ctx - n)
        return engine_err(ENGINE_ERANGE,
                          "cuda decode: positions %d..%d do not fit the context "
                          "of %d",
                          pos, pos + n - 1, s->n_ctx);
    if (token < 0 || (uint32_t)token >= hp->n_vocab)
        return engine_err(ENGINE_EINVAL, "cuda decode: token id %d is not in [0, %u)", token,
                          hp->n_vocab);
    return 0;
}

static int run_steps(engine_cuda_session *s, int32_t token, int32_t pos, int32_t n, float temp,
                     uint64_t seed) {
    int rc = run_steps_check(s, token, pos, n);
    if (rc) return rc;
    CU(cudaSetDevice(s->cm->device));
    if (!s->captured && (rc = capture(s, false))) goto done;
    s->h_step->token = token;
    s->h_step->pos = pos;
    s->h_step->n_out = 0;
    s->h_step->out_cap = n;
    s->h_step->seed = seed;
    s->h_step->temp = temp;
    s->h_step->top_k = 0;
    s->h_step->masked = 0;
    CU(cudaMemcpyAsync(s->step, s->h_step, sizeof *s->h_step, cudaMemcpyHostToDevice, s->stream));
    if ((rc = sample_set(s, temp <= 0.0f))) goto done;
    step_embed(s);
    for (int32_t i = 0; i < n; i++) {
        if ((rc = att_grid_set(s, 0, pos + i))) goto done;
        CU(cudaGraphLaunch(s->exec, s->stream));
    }
done:
    return rc;
}

extern "C" int engine_cuda_decode(engine_cuda_session *s, int32_t token, int32_t pos, float *logits,
                                  int32_t *next) {
    int rc = run_steps(s, token, pos, 1, 0.0f, 0);
    if (rc) return rc;
    const engine_hparams *hp = &s->cm->m->hp;
    if (logits)
        CU(cudaMemcpyAsync(logits, s->logits, sizeof(float) * hp->n_vocab, cudaMemcpyDeviceToHost,
                           s->stream));
    if (next) CU(cudaMemcpyAsync(next, s->out, sizeof *next, cudaMemcpyDeviceToHost, s->stream));
    CU(cudaStreamSynchronize(s->stream));
done:
    return rc;
}

extern "C" int engine_cuda_generate(engine_cuda_session *s, int32_t token, int32_t pos, int32_t n,
                                    float temperature, uint64_t seed, int32_t *out) {
    int rc = run_steps(s, token, pos, n, temperature, seed);
    if (rc) return rc;
    CU(cudaMemcpyAsync(out, s->out, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost,
                       s->stream));
    CU(cudaStreamSynchronize(s->stream));
done:
    return rc;
}

extern "C" bool engine_cuda_stream_ok(const engine_cuda_session *s, const engine_cuda_sampling *p) {
    if (p->temperature <= 0.0f) return true; /* greedy: the truncation does not apply */
    const int32_t nv = (int32_t)s->cm->m->hp.n_vocab;
    if (p->top_k > 0 && p->top_k < nv) /* the host sampler truncates only below n_vocab */
        return p->top_k <= ENGINE_CU_TOPK_MAX &&
               nv <= ENGINE_CU_SAMPLE_BLOCKS * ENGINE_CU_TOPK_SLICE;
    return p->top_p >= 1.0f && p->min_p <= 0.0f; /* the whole softmax: the Gumbel draw */
}

/* The pinned token ring, the copy stream and its events, at a session's first stream. */
static int stream_prepare(engine_cuda_session *s) {
    int rc = 0;
    if (s->h_tok) return 0;
    CU(cudaStreamCreateWithFlags(&s->copy_st, cudaStreamNonBlocking));
    for (int i = 0; i < ENGINE_CUDA_STREAM_RING; i++) {
        CU(cudaEventCreateWithFlags(&s->ev_step[i], cudaEventDisableTiming));
        CU(cudaEventCreateWithFlags(&s->ev_copy[i], cudaEventDisableTiming));
    }
    CU(cudaMallocHost((void **)&s->h_tok, sizeof(int32_t) * (size_t)s->n_ctx));
done:
    return rc;
}

extern "C" int engine_cuda_stream(engine_cuda_session *s, int32_t token, int32_t pos, int32_t n_max,
                                  const engine_cuda_sampling *p, engine_cuda_token_fn cb,
                                  void *user, int32_t *n_steps) {
    int rc = 0, cb_rc = 0;
    int32_t launched = 0, done_n = 0;
    *n_steps = 0;
    if (!engine_cuda_stream_ok(s, p))
        return engine_err(ENGINE_EUNSUPPORTED,
                          "cuda stream: this sampling (top_k %d, top_p %g, min_p %g) is the host "
                          "sampler's",
                          p->top_k, (double)p->top_p, (double)p->min_p);
    const int32_t nv = (int32_t)s->cm->m->hp.n_vocab;
    const bool tk = p->temperature > 0.0f && p->top_k > 0 && p->top_k < nv;
    if ((rc = run_steps_check(s, token, pos, n_max))) return rc;
    CU(cudaSetDevice(s->cm->device));
    if ((rc = stream_prepare(s))) goto done;
    if (!s->captured && (rc = capture(s, false))) goto done;
    if (tk && !s->exec_tk && (rc = capture(s, true))) goto done;
    s->h_step->token = token;
    s->h_step->pos = pos;
    s->h_step->n_out = 0;
    s->h_step->out_cap = n_max;
    s->h_step->seed = p->seed;
    s->h_step->temp = p->temperature;
    s->h_step->top_k = tk ? p->top_k : 0;
    s->h_step->top_p = p->top_p;
    s->h_step->min_p = p->min_p;
    s->h_step->tk_algo = s->tk_algo;
    s->h_step->masked = p->allow != NULL;
    if (p->allow)
        CU(cudaMemcpyAsync(s->allow, p->allow, sizeof(uint32_t) * (((size_t)nv + 31) / 32),
                           cudaMemcpyHostToDevice, s->stream));
    CU(cudaMemcpyAsync(s->step, s->h_step, sizeof *s->h_step, cudaMemcpyHostToDevice, s->stream));
    if (!tk && (rc = sample_set(s, p->temperature <= 0.0f))) goto done;
    step_embed(s);
    /* step i samples token i: its copy follows it on the copy stream, so the step stream runs
     * on while the host reads; at most ENGINE_CUDA_STREAM_AHEAD steps past the one awaited */
    while (done_n < n_max) {
        while (launched < n_max && launched < done_n + ENGINE_CUDA_STREAM_AHEAD) {
            const int e = launched % ENGINE_CUDA_STREAM_RING;
            if ((rc = att_grid_set(s, tk, pos + launched))) goto done;
            CU(cudaGraphLaunch(tk ? s->exec_tk : s->exec, s->stream));
            CU(cudaEventRecord(s->ev_step[e], s->stream));
            CU(cudaStreamWaitEvent(s->copy_st, s->ev_step[e], 0));
            CU(cudaMemcpyAsync(s->h_tok + launched, s->out + launched, sizeof(int32_t),
                               cudaMemcpyDeviceToHost, s->copy_st));
            CU(cudaEventRecord(s->ev_copy[e], s->copy_st));
            launched++;
        }
        CU(cudaEventSynchronize(s->ev_copy[done_n % ENGINE_CUDA_STREAM_RING]));
        const int32_t t = s->h_tok[done_n++];
        if ((cb_rc = cb(user, t)) != 0) break;
    }
done:
    /* the steps queued past a stop run out; their positions hold nothing the caller keeps */
    if (s->stream) {
        const cudaError_t e1 = cudaStreamSynchronize(s->stream);
        const cudaError_t e2 = s->copy_st ? cudaStreamSynchronize(s->copy_st) : cudaSuccess;
        if (!rc) rc = cu_err(e1 != cudaSuccess ? e1 : e2, "cudaStreamSynchronize (stream)");
    }
    *n_steps = done_n;
    return rc ? rc : cb_rc < 0 ? cb_rc : 0;
}

extern "C" int engine_cuda_profile(engine_cuda_session *s, int32_t token, int32_t pos, int reps,
                                   double us[ENGINE_CUDA_PROF_COUNT]) {
    int rc = 0;
    const engine_hparams *hp = &s->cm->m->hp;
    const int n_ev = 3 + 6 * (int)hp->n_layer + 2;
    step_prof p = {(cudaEvent_t *)calloc((size_t)n_ev, sizeof(cudaEvent_t)),
                   (int *)calloc((size_t)n_ev, sizeof(int)), 0};
    memset(us, 0, sizeof(double) * ENGINE_CUDA_PROF_COUNT);
    if (!p.ev || !p.cat) {
        rc = engine_err(ENGINE_ENOMEM, "out of memory");
        goto done;
    }
    if (pos < 0 || pos >= s->n_ctx || token < 0 || (uint32_t)token >= hp->n_vocab || reps < 1) {
        rc = engine_err(ENGINE_EINVAL, "cuda profile: bad token, position or repetitions");
        goto done;
    }
    CU(cudaSetDevice(s->cm->device));
    for (int i = 0; i < n_ev; i++)
        CU(cudaEventCreate(&p.ev[i]));
    for (int r = 0; r < reps; r++) {
        s->h_step->token = token;
        s->h_step->pos = pos;
        s->h_step->n_out = 0;
        s->h_step->out_cap = 1;
        s->h_step->temp = 0;
        s->h_step->masked = 0;
        CU(cudaMemcpyAsync(s->step, s->h_step, sizeof *s->h_step, cudaMemcpyHostToDevice,
                           s->stream));
        p.n = 0;
        enqueue_step(s, &p, NULL);
        CU(cudaGetLastError());
        CU(cudaStreamSynchronize(s->stream));
        for (int i = 1; i < p.n; i++) {
            float ms = 0;
            CU(cudaEventElapsedTime(&ms, p.ev[i - 1], p.ev[i]));
            us[p.cat[i]] += 1e3 * ms / reps;
        }
    }
done:
    for (int i = 0; p.ev && i < n_ev; i++)
        if (p.ev[i]) cudaEventDestroy(p.ev[i]);
    free(p.ev);
    free(p.cat);
    return rc;
}

extern "C" int engine_cuda_route_trace(engine_cuda_session *s, int32_t token, int32_t pos,
                                       int32_t *ids, float *router_logits, float *logits,
                                       int *fused) {
    int rc = 0;
    const engine_hparams *hp = &s->cm->m->hp;
    const size_t nl = hp->n_layer, emb = hp->n_embd, ne = hp->n_expert;
    route_trace t = {ids, router_logits, NULL, NULL};
    *fused = s->rf;
    if (hp->arch != ENGINE_ARCH_QWEN3MOE)
        return engine_err(ENGINE_EINVAL, "cuda route trace: not a qwen3moe model");
    if (pos < 0 || pos >= s->n_ctx || token < 0 || (uint32_t)token >= hp->n_vocab)
        return engine_err(ENGINE_EINVAL, "cuda route trace: bad token or position");
    if (s->rf) {
        t.x = (float *)malloc(sizeof(float) * nl * emb);
        t.ao = (float *)malloc(sizeof(float) * nl * emb);
        if (!t.x || !t.ao) {
            rc = engine_err(ENGINE_ENOMEM, "out of memory");
            goto done;
        }
    }
    CU(cudaSetDevice(s->cm->device));
    s->h_step->token = token;
    s->h_step->pos = pos;
    s->h_step->n_out = 0;
    s->h_step->out_cap = 1;
    s->h_step->temp = 0;
    s->h_step->masked = 0;
    CU(cudaMemcpyAsync(s->step, s->h_step, sizeof *s->h_step, cudaMemcpyHostToDevice, s->stream));
    enqueue_step(s, NULL, &t);
    if (logits)
        CU(cudaMemcpyAsync(logits, s->logits, sizeof(float) * hp->n_vocab, cudaMemcpyDeviceToHost,
                           s->stream));
    CU(cudaGetLastError());
    CU(cudaStreamSynchronize(s->stream));
    /* the fused routing's logits: s * raw, s the RMS scale of h = x + ao (the F32 add of the
     * staging) computed here in double */
    for (size_t l = 0; s->rf && l < nl; l++) {
        double ss = 0;
        for (size_t i = 0; i < emb; i++) {
            const float h = t.x[l * emb + i] + t.ao[l * emb + i];
            ss += (double)h * h;
        }
        const double sc = 1.0 / sqrt(ss / (double)emb + (double)hp->rms_norm_eps);
        for (size_t e = 0; e < ne; e++)
            router_logits[l * ne + e] = (float)(sc * router_logits[l * ne + e]);
    }
done:
    free(t.x);
    free(t.ao);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Views for the batched / prefill path (cuda_backend.h)
 * ------------------------------------------------------------------------------------------- */
static engine_cuda_wview wview(const cu_w *w) {
    engine_cuda_wview v = {w->d, w->type, w->cols, w->rows, w->n_mat, w->row_bytes};
    return v;
}

extern "C" void engine_cuda_model_view_get(const engine_cuda_model *cm,
                                           engine_cuda_model_view *out) {
    out->m = cm->m;
    out->device = cm->device;
    out->tok_embd = wview(&cm->tok_embd);
    out->output = wview(&cm->output);
    out->output_norm = cm->output_norm;
}

extern "C" void engine_cuda_layer_view_get(const engine_cuda_model *cm, int layer,
                                           engine_cuda_layer_view *out) {
    const cu_layer *l = &cm->layers[layer];
    out->attn_norm = l->attn_norm;
    out->q_norm = l->q_norm;
    out->k_norm = l->k_norm;
    out->ffn_norm = l->ffn_norm;
#define VIEW_W(f) out->f = wview(&l->f);
    FOR_LAYER_WEIGHTS(VIEW_W)
#undef VIEW_W
}

extern "C" void engine_cuda_session_view_get(const engine_cuda_session *s,
                                             engine_cuda_session_view *out) {
    out->stream = (void *)s->stream;
    out->n_ctx = s->n_ctx;
    out->kv_f32 = s->kv == ENGINE_KV_F32;
    out->k_cache = s->k_cache;
    out->v_cache = s->v_cache;
    out->rope = s->rope;
}
