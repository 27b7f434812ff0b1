/* The batched pass over several sequences (engine_cuda_batch_*, contract in cuda_backend.h):
 * the prefill pass of prefill.cu over the tokens of every sequence at once, its KV in a device
 * pool of blocks addressed through each sequence's block table (attention: paged_att.cu).
 *
 * The decode step (every sequence one token, at most 64 sequences) takes its own pass: the
 * rows padded to a bucket of 1, 2, 4, .. 64 (padding rows: token 0 at position 0, their KV in
 * a scratch block past the pool's), per layer
 *   q, k, v (small-m products, batch_mm.cuh, attn_norm staged) | q/k norm + RoPE + KV store |
 *   paged attention | wo (+= x) | router (ffn_norm) | route | sort by expert |
 *   gate+up fused per expert tile (silu(g) * u) | down per expert tile | weighted combine
 * then the output head over every row; captured once per bucket as a CUDA graph and replayed
 * (SPARK_CUDA_BATCH_DECODE=eager: the same pass un-captured; =0: decode steps through the
 * prefill pass as before). Per step the host copies the rows' tokens, positions and block
 * tables into fixed device buffers, replays, and copies back the logits asked for. */
#include <algorithm>
#include <stdlib.h>
#include <string.h>

#include "attention.cuh"
#include "batch_mm.cuh"
#include "gemm.cuh"
#include "matvec.cuh"
#include "prefill.cuh"
#include "qdot.cuh"

extern "C" {
#include "cuda/cuda_backend.h"
#include "model/model_int.h"
}

static size_t pb_al256(size_t n) {
    return (n + 255) & ~(size_t)255;
}

struct engine_cuda_batch {
    engine_cuda_prefill *pf;
    const engine_model *m;
    int device;
    cudaStream_t stream;
    int32_t n_blocks, block_size, max_pos, max_tokens, max_seqs, max_blocks, n_layer;
    int kv_f32;
    uint8_t *pool;          /* device: per layer K then V, n_blocks * block_size rows each */
    size_t pool_bytes;
    void **k_layer, **v_layer; /* host [n_layer]: device pointers into pool */
    float *rope;            /* device [max_pos][hd / 2] (cos, sin) */
    int32_t *meta_d, *meta_h; /* device / pinned host: tok, pos_of, row_of, seq_of, out_rows,
                               * tables ([max_seqs][max_blocks]) */
    float **out;            /* host [max_seqs] */
    /* the decode step's pass (see the top of the file) */
    int dec;                    /* PB_DEC_* */
    int32_t nb_max;             /* the largest bucket */
    engine_cuda_model_view mv;
    engine_cuda_layer_view *lv; /* [n_layer] */
    uint8_t *dec_mem;           /* device: the buffers below */
    int32_t *dmeta_h, *dmeta_d; /* pinned host / device: tok, pos_of, row_of, seq_of [nb_max]
                                 * each, tables [nb_max][max_blocks] */
    int32_t *ids, *sorted, *slot, *tiles, *n_tiles;
    float *x, *q, *k, *v, *att, *router, *wts, *h, *u, *d, *logits;
    cudaGraphExec_t graph[7];   /* per bucket (pb_bucket) */
    /* SPARK_CUDA_BATCH_PROF=1: per bucket, decode steps, their GPU time (tables up to the end
     * of the pass) and their wall time in engine_cuda_batch_run; logged at INFO by _free */
    int prof;
    /* SPARK_CUDA_BMM_STAGE=N: the grouped (expert) launches stage at most N of a tile's items at
     * a time (their shared memory, so more blocks a multiprocessor); 0: as many as the bucket */
    int tile_stage;
    /* SPARK_CUDA_BMM_GPB=G: a grouped launch's block takes G row groups (engine_cu_bmm_args gpb) */
    int tile_gpb;
    /* decode steps of at most this many sequences take the small-m pass, more the prefill
     * pass's tensor-core GEMMs (SPARK_CUDA_BATCH_SMALLM=N; PB_SMALLM_MAX) */
    int smallm_max;
    cudaEvent_t ev[2];
    long prof_steps[7];
    double prof_gpu_ms[7], prof_wall_ms[7];
};

enum { PB_DEC_OFF, PB_DEC_EAGER, PB_DEC_GRAPH };
static const int32_t pb_bucket[7] = {1, 2, 4, 8, 16, 32, 64};
#define PB_MAX_BUCKET 64
/* The small-m pass's last sequence count by default: Qwen3-30B-A3B Q4_K_M, aggregate tok/s of
 * the small-m pass against the prefill pass (H200, session 31 call C): 4 sequences 344.3 /
 * 282.9, 8 435.2 / 470.3, 16 494.5 / 733.4, 32 553.2 / 1,140.3. Its dense products decode
 * each chunk to F32 for every input on the CUDA cores (58% of its step at 32), where the
 * prefill's GEMMs run on the tensor cores. */
#define PB_SMALLM_MAX 4

static int pb_bucket_of(int32_t n) {
    int i = 0;
    while (i < 6 && pb_bucket[i] < n)
        i++;
    return i;
}

/* The decode pass's device buffers for buckets up to nbm rows: their sizes in carve order. */
enum {
    PB_B_META, PB_B_IDS, PB_B_SORTED, PB_B_SLOT, PB_B_TILES, PB_B_NTILES, PB_B_X, PB_B_Q,
    PB_B_K, PB_B_V, PB_B_ATT, PB_B_ROUTER, PB_B_WTS, PB_B_H, PB_B_U, PB_B_D, PB_B_LOGITS, PB_B_N
};

static size_t pb_dec_sizes(const engine_hparams *hp, int32_t nbm, int32_t mb, size_t sz[PB_B_N]) {
    const bool moe = hp->arch == ENGINE_ARCH_QWEN3MOE;
    const size_t k = moe ? hp->n_expert_used : 1, ne = moe ? hp->n_expert : 1;
    const size_t nff = moe ? hp->n_ff_exp : hp->n_ff, slots = (size_t)nbm * k;
    const size_t qd = (size_t)hp->n_head * hp->head_dim_k;
    const size_t kvd = (size_t)hp->n_head_kv * hp->head_dim_k;
    sz[PB_B_META] = sizeof(int32_t) * ((size_t)4 * nbm + (size_t)nbm * mb);
    sz[PB_B_IDS] = sz[PB_B_SORTED] = sz[PB_B_SLOT] = sizeof(int32_t) * slots;
    sz[PB_B_TILES] = sizeof(int32_t) * 3 * (size_t)engine_cu_pf_max_tiles((int)slots, (int)ne);
    sz[PB_B_NTILES] = sizeof(int32_t);
    sz[PB_B_X] = sizeof(float) * nbm * hp->n_embd;
    sz[PB_B_Q] = sz[PB_B_ATT] = sizeof(float) * nbm * qd;
    sz[PB_B_K] = sz[PB_B_V] = sizeof(float) * nbm * kvd;
    sz[PB_B_ROUTER] = sizeof(float) * nbm * ne;
    sz[PB_B_WTS] = sizeof(float) * slots;
    sz[PB_B_H] = sz[PB_B_U] = sizeof(float) * slots * nff;
    sz[PB_B_D] = moe ? sizeof(float) * slots * hp->n_embd : 0;
    sz[PB_B_LOGITS] = sizeof(float) * nbm * hp->n_vocab;
    size_t tot = 0;
    for (int i = 0; i < PB_B_N; i++)
        tot += pb_al256(sz[i]);
    return tot;
}

static int32_t pb_nb_max(int32_t max_seqs) {
    return pb_bucket[pb_bucket_of(max_seqs < PB_MAX_BUCKET ? max_seqs : PB_MAX_BUCKET)];
}

static size_t pb_meta_ints(int32_t max_tokens, int32_t max_seqs, int32_t max_blocks) {
    return 4 * (size_t)max_tokens + (size_t)max_seqs + (size_t)max_seqs * max_blocks;
}

static size_t pb_pool_bytes(const engine_hparams *hp, int32_t n_blocks, int32_t block_size,
                            engine_kv_type kv) {
    const size_t row = (size_t)hp->n_head_kv * hp->head_dim_k * (kv == ENGINE_KV_F32 ? 4 : 2);
    return pb_al256(row * (size_t)n_blocks * block_size) * 2 * hp->n_layer;
}

extern "C" size_t engine_cuda_batch_bytes(const engine_cuda_model *cm, int32_t n_blocks,
                                          int32_t block_size, int32_t max_pos, int32_t max_tokens,
                                          int32_t max_seqs, engine_kv_type kv) {
    engine_cuda_model_view mv;
    engine_cuda_model_view_get(cm, &mv);
    const engine_hparams *hp = &mv.m->hp;
    const int32_t mb = block_size > 0 ? (max_pos + block_size - 1) / block_size : 0;
    size_t sz[PB_B_N];
    return pb_pool_bytes(hp, n_blocks + 1, block_size, kv) +
           pb_al256(sizeof(float) * (size_t)max_pos * hp->head_dim_k) +
           pb_al256(sizeof(int32_t) * pb_meta_ints(max_tokens, max_seqs, mb)) +
           engine_cuda_prefill_bytes(cm, max_tokens) +
           pb_dec_sizes(hp, pb_nb_max(max_seqs), mb, sz);
}

extern "C" void engine_cuda_batch_free(engine_cuda_batch *b) {
    if (!b) return;
    cudaSetDevice(b->device);
    engine_cuda_prefill_free(b->pf);
    if (b->stream) cudaStreamSynchronize(b->stream);
    cudaFree(b->pool);
    cudaFree(b->rope);
    cudaFree(b->meta_d);
    cudaFreeHost(b->meta_h);
    for (int i = 0; i < 7; i++) {
        if (b->prof && b->prof_steps[i] > 0)
            engine_log(ENGINE_LOG_INFO, "cuda batched decode, bucket %d: %ld steps, GPU %.3f ms "
                       "a step, wall %.3f ms a step (%s)", pb_bucket[i], b->prof_steps[i],
                       b->prof_gpu_ms[i] / (double)b->prof_steps[i],
                       b->prof_wall_ms[i] / (double)b->prof_steps[i],
                       b->dec == PB_DEC_GRAPH ? "graph" : "un-captured");
        if (b->graph[i]) cudaGraphExecDestroy(b->graph[i]);
    }
    for (int i = 0; i < 2; i++)
        if (b->ev[i]) cudaEventDestroy(b->ev[i]);
    cudaFree(b->dec_mem);
    cudaFreeHost(b->dmeta_h);
    free(b->lv);
    if (b->stream) cudaStreamDestroy(b->stream);
    free(b->k_layer);
    free(b->v_layer);
    free(b->out);
    free(b);
}

/* The weights the decode pass reads: a type the small-m products decode, rows of whole
 * staging blocks, an input that fits their shared memory. */
static bool pb_dec_w_ok(const engine_cuda_wview *w) {
    if (!w->d) return true;
    const int blk = engine_cu_x_mode(w->type) == ENGINE_CU_X_Q8_K ? 256 : 32;
    return engine_cu_type_supported(w->type) && w->cols % blk == 0 && w->cols <= 16384;
}

static int pb_dec_new(engine_cuda_batch *b, engine_cuda_model *cm) {
    const engine_hparams *hp = &b->m->hp;
    const char *e = getenv("SPARK_CUDA_BATCH_DECODE");
    b->dec = e && !strcmp(e, "0") ? PB_DEC_OFF : e && !strcmp(e, "eager") ? PB_DEC_EAGER
                                                                            : PB_DEC_GRAPH;
    engine_cuda_model_view_get(cm, &b->mv);
    b->lv = (engine_cuda_layer_view *)calloc(hp->n_layer, sizeof *b->lv);
    if (!b->lv) return engine_err(ENGINE_ENOMEM, "out of memory");
    bool ok = pb_dec_w_ok(&b->mv.output);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        engine_cuda_layer_view *v = &b->lv[l];
        engine_cuda_layer_view_get(cm, (int)l, v);
        ok = ok && pb_dec_w_ok(&v->wq) && pb_dec_w_ok(&v->wk) && pb_dec_w_ok(&v->wv) &&
             pb_dec_w_ok(&v->wo) && pb_dec_w_ok(&v->gate_inp) && pb_dec_w_ok(&v->gate_exps) &&
             pb_dec_w_ok(&v->up_exps) && pb_dec_w_ok(&v->down_exps) &&
             pb_dec_w_ok(&v->ffn_gate) && pb_dec_w_ok(&v->ffn_up) && pb_dec_w_ok(&v->ffn_down);
    }
    if (!ok && b->dec != PB_DEC_OFF) {
        engine_log(ENGINE_LOG_INFO, "cuda: batched decode steps take the prefill pass (a weight "
                   "type or shape the small-m products do not take)");
        b->dec = PB_DEC_OFF;
    }
    b->nb_max = pb_nb_max(b->max_seqs);
    e = getenv("SPARK_CUDA_BATCH_PROF");
    b->prof = e && e[0] == '1';
    e = getenv("SPARK_CUDA_BMM_STAGE");
    b->tile_stage = e ? (int)strtol(e, NULL, 10) : 0;
    e = getenv("SPARK_CUDA_BATCH_SMALLM");
    b->smallm_max = e ? (int)strtol(e, NULL, 10) : PB_SMALLM_MAX;
    e = getenv("SPARK_CUDA_BMM_GPB");
    b->tile_gpb = e ? (int)strtol(e, NULL, 10) : 1;
    for (int i = 0; b->prof && i < 2; i++) {
        const int r = engine_cu_pf_err(cudaEventCreate(&b->ev[i]), "cudaEventCreate");
        if (r) return r;
    }
    size_t sz[PB_B_N];
    const size_t tot = pb_dec_sizes(hp, b->nb_max, b->max_blocks, sz);
    int rc;
    if ((rc = engine_cu_bmm_init())) return rc;
    if ((rc = engine_cu_pf_err(cudaMalloc((void **)&b->dec_mem, tot), "cudaMalloc (decode)")))
        return rc;
    if ((rc = engine_cu_pf_err(cudaMallocHost((void **)&b->dmeta_h, sz[PB_B_META]),
                               "cudaMallocHost (decode tables)")))
        return rc;
    uint8_t *p = b->dec_mem;
    void *dst[PB_B_N] = {&b->dmeta_d, &b->ids, &b->sorted, &b->slot, &b->tiles, &b->n_tiles,
                         &b->x, &b->q, &b->k, &b->v, &b->att, &b->router, &b->wts, &b->h,
                         &b->u, &b->d, &b->logits};
    for (int i = 0; i < PB_B_N; i++) {
        *(void **)dst[i] = sz[i] ? (void *)p : NULL;
        p += pb_al256(sz[i]);
    }
    return 0;
}

/* The tiles engine_cu_pf_sort makes of n_slots slots at most: an expert of c > 0 slots takes
 * ceil(c / ENGINE_CU_GEMM_BM) <= 1 + c / ENGINE_CU_GEMM_BM, and at most min(n_slots, n_expert)
 * experts have slots (the grouped launches' grid: few empty blocks at small batches). */
static int pb_max_tiles(int n_slots, int n_expert) {
    return std::min(n_slots, n_expert) + n_slots / ENGINE_CU_GEMM_BM + 1;
}

/* Small-m product args for weight w over m rows of x. */
static engine_cu_bmm_args pb_mm(const engine_cuda_wview *w, const float *x, const float *norm,
                                float eps, float *y, int ldy, int accumulate, int m) {
    engine_cu_bmm_args a;
    memset(&a, 0, sizeof a);
    engine_cu_args_weight(a, w);
    a.x = x;
    a.norm_w = norm;
    a.eps = eps;
    a.y = y;
    a.ldy = ldy;
    a.accumulate = accumulate;
    a.m = m;
    a.max_items = m;
    return a;
}

/* h = silu(G x) * (U x) for m rows (or the tiles of the last sort when grouped). */
static void pb_ffn_up(engine_cuda_batch *b, const engine_cuda_wview *g, const engine_cuda_wview *u,
                      const float *norm, int m, bool grouped, cudaStream_t st) {
    const engine_hparams *hp = &b->m->hp;
    const int k = grouped ? (int)hp->n_expert_used : 1;
    engine_cu_bmm_args a = pb_mm(g, b->x, norm, hp->rms_norm_eps, b->h, g->rows, 0, m);
    if (grouped) {
        a.x_idx = b->sorted;
        a.tiles = b->tiles;
        a.n_tiles = b->n_tiles;
        a.max_tiles = pb_max_tiles(m * k, (int)hp->n_expert);
        if (b->tile_stage > 0) a.max_items = std::min(a.max_items, b->tile_stage);
        a.gpb = b->tile_gpb;
    }
    if (g->type == u->type) {
        a.w2 = (const uint8_t *)u->d;
        engine_cu_bmm(&a, st);
        return;
    }
    engine_cu_bmm(&a, st);
    a.w = (const uint8_t *)u->d;
    a.row_bytes = u->row_bytes;
    a.mat_bytes = (size_t)u->rows * u->row_bytes;
    a.type = u->type;
    a.y = b->u;
    engine_cu_bmm(&a, st);
    engine_cu_bmm_swiglu(b->h, b->u, m * k * g->rows, st);
}

/* The decode pass over nb rows (the tables already on the device): launches only. */
static void pb_dec_pass(engine_cuda_batch *b, int nb, cudaStream_t st) {
    const engine_hparams *hp = &b->m->hp;
    const int emb = (int)hp->n_embd, hd = (int)hp->head_dim_k, nh = (int)hp->n_head,
              nkv = (int)hp->n_head_kv, nbm = b->nb_max;
    const float eps = hp->rms_norm_eps;
    const bool moe = hp->arch == ENGINE_ARCH_QWEN3MOE;
    const int32_t *tok = b->dmeta_d, *pos_of = tok + nbm, *row_of = tok + 2 * nbm,
                  *seq_of = tok + 3 * nbm, *tables = tok + 4 * nbm;
    engine_cu_bmm_args a;
    engine_cu_pf_embed((const uint8_t *)b->mv.tok_embd.d, b->mv.tok_embd.row_bytes,
                       b->mv.tok_embd.type, emb, tok, nb, b->x, st);
    for (int32_t l = 0; l < b->n_layer; l++) {
        const engine_cuda_layer_view *ly = &b->lv[l];
        a = pb_mm(&ly->wq, b->x, ly->attn_norm, eps, b->q, nh * hd, 0, nb);
        engine_cu_bmm(&a, st);
        a = pb_mm(&ly->wk, b->x, ly->attn_norm, eps, b->k, nkv * hd, 0, nb);
        engine_cu_bmm(&a, st);
        a = pb_mm(&ly->wv, b->x, ly->attn_norm, eps, b->v, nkv * hd, 0, nb);
        engine_cu_bmm(&a, st);
        engine_cu_pf_qk_args qa = {b->q, b->k, b->v, ly->q_norm, ly->k_norm,
                                   (const float2 *)b->rope, eps, b->k_layer[l], b->v_layer[l],
                                   b->kv_f32, nb, 0, nh, nkv, hd, pos_of, row_of};
        engine_cu_pf_qk_store(&qa, st);
        engine_cu_pg_att_args ga = {b->q, b->k_layer[l], b->v_layer[l], b->kv_f32, nb, nh, nkv,
                                    hd, pos_of, seq_of, tables, b->max_blocks, b->block_size,
                                    b->att};
        engine_cu_pg_attention(&ga, st);
        a = pb_mm(&ly->wo, b->att, NULL, eps, b->x, emb, 1, nb);
        engine_cu_bmm(&a, st);
        if (moe) {
            const int ne = (int)hp->n_expert, k = (int)hp->n_expert_used;
            a = pb_mm(&ly->gate_inp, b->x, ly->ffn_norm, eps, b->router, ne, 0, nb);
            engine_cu_bmm(&a, st);
            engine_cu_pf_route(b->router, 1, nb, ne, k, hp->norm_topk_prob, b->ids, b->wts, st);
            engine_cu_pf_sort(b->ids, nb, k, ne, b->sorted, b->slot, b->tiles, b->n_tiles, st);
            pb_ffn_up(b, &ly->gate_exps, &ly->up_exps, ly->ffn_norm, nb, true, st);
            a = pb_mm(&ly->down_exps, b->h, NULL, eps, b->d, emb, 0, nb);
            a.tiles = b->tiles;
            a.n_tiles = b->n_tiles;
            a.max_tiles = pb_max_tiles(nb * k, ne);
            if (b->tile_stage > 0) a.max_items = std::min(a.max_items, b->tile_stage);
            a.gpb = b->tile_gpb;
            engine_cu_bmm(&a, st);
            engine_cu_pf_combine(b->x, b->d, b->slot, b->wts, nb, k, emb, st);
        } else {
            pb_ffn_up(b, &ly->ffn_gate, &ly->ffn_up, ly->ffn_norm, nb, false, st);
            a = pb_mm(&ly->ffn_down, b->h, NULL, eps, b->x, emb, 1, nb);
            engine_cu_bmm(&a, st);
        }
    }
    a = pb_mm(&b->mv.output, b->x, b->mv.output_norm, eps, b->logits, (int)hp->n_vocab, 0, nb);
    engine_cu_bmm(&a, st);
}

/* A decode step of n_seqs <= nb_max sequences, one token each (checked by the caller). */
static int pb_decode(engine_cuda_batch *b, const engine_cuda_batch_seq *seqs, int32_t n_seqs) {
    const int bi = pb_bucket_of(n_seqs), nb = pb_bucket[bi], nbm = b->nb_max, mb = b->max_blocks;
    const size_t nv = b->m->hp.n_vocab;
    int32_t *tok = b->dmeta_h, *pos_of = tok + nbm, *row_of = tok + 2 * nbm,
            *seq_of = tok + 3 * nbm, *tables = tok + 4 * nbm;
    for (int32_t i = 0; i < nb; i++) {
        seq_of[i] = i;
        if (i < n_seqs) {
            const engine_cuda_batch_seq *q = &seqs[i];
            const int32_t p = q->pos, need = p / b->block_size + 1;
            tok[i] = q->tokens[0];
            pos_of[i] = p;
            row_of[i] = q->blocks[p / b->block_size] * b->block_size + p % b->block_size;
            memcpy(tables + (size_t)i * mb, q->blocks, sizeof(int32_t) * (size_t)need);
        } else { /* padding: token 0 at position 0 of the scratch block */
            tok[i] = 0;
            pos_of[i] = 0;
            row_of[i] = b->n_blocks * b->block_size;
            tables[(size_t)i * mb] = b->n_blocks;
        }
    }
    cudaStream_t st = b->stream;
    const double t0 = b->prof ? engine_time_ms() : 0.0;
    int rc = engine_cu_pf_err(cudaSetDevice(b->device), "cudaSetDevice");
    const size_t bytes = sizeof(int32_t) * (4 * (size_t)nbm + (size_t)nb * mb);
    if (!rc && b->prof) cudaEventRecord(b->ev[0], st);
    if (!rc)
        rc = engine_cu_pf_err(cudaMemcpyAsync(b->dmeta_d, b->dmeta_h, bytes,
                                              cudaMemcpyHostToDevice, st),
                              "cudaMemcpyAsync (decode tables)");
    if (!rc && b->dec == PB_DEC_EAGER) {
        pb_dec_pass(b, nb, st);
        rc = engine_cu_pf_err(cudaGetLastError(), "batched decode launch");
    } else if (!rc) {
        if (!b->graph[bi]) {
            cudaGraph_t g = NULL;
            rc = engine_cu_pf_err(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal),
                                  "cudaStreamBeginCapture");
            if (!rc) {
                pb_dec_pass(b, nb, st);
                const cudaError_t le = cudaGetLastError();
                rc = engine_cu_pf_err(cudaStreamEndCapture(st, &g), "cudaStreamEndCapture");
                if (!rc) rc = engine_cu_pf_err(le, "batched decode capture");
            }
            if (!rc)
                rc = engine_cu_pf_err(cudaGraphInstantiate(&b->graph[bi], g, 0),
                                      "cudaGraphInstantiate (batched decode)");
            if (g) cudaGraphDestroy(g);
            if (rc) b->graph[bi] = NULL;
        }
        if (!rc)
            rc = engine_cu_pf_err(cudaGraphLaunch(b->graph[bi], st), "cudaGraphLaunch");
    }
    if (!rc && b->prof) cudaEventRecord(b->ev[1], st);
    /* the logits asked for: one copy per run of rows whose destinations follow each other
     * (the scheduler's rows are one array) */
    for (int32_t i = 0, j; !rc && i < n_seqs; i = j) {
        for (j = i + 1; j < n_seqs && seqs[i].logits &&
                        seqs[j].logits == seqs[i].logits + (size_t)(j - i) * nv;
             j++) {
        }
        if (seqs[i].logits)
            rc = engine_cu_pf_err(cudaMemcpyAsync(seqs[i].logits, b->logits + (size_t)i * nv,
                                                  sizeof(float) * nv * (size_t)(j - i),
                                                  cudaMemcpyDeviceToHost, st),
                                  "cudaMemcpyAsync (logits)");
    }
    /* the pinned tables are rewritten by the next call: wait for this step to have read them */
    const int rs = engine_cu_pf_err(cudaStreamSynchronize(st), "batched decode");
    float gpu_ms = 0.0f;
    if (!rc && !rs && b->prof && cudaEventElapsedTime(&gpu_ms, b->ev[0], b->ev[1]) == cudaSuccess) {
        b->prof_steps[bi]++;
        b->prof_gpu_ms[bi] += gpu_ms;
        b->prof_wall_ms[bi] += engine_time_ms() - t0;
    }
    return rc ? rc : rs;
}

extern "C" int engine_cuda_batch_new(engine_cuda_batch **out, engine_cuda_model *cm,
                                     int32_t n_blocks, int32_t block_size, int32_t max_pos,
                                     int32_t max_tokens, int32_t max_seqs, engine_kv_type kv) {
    *out = NULL;
    engine_cuda_model_view mv;
    engine_cuda_model_view_get(cm, &mv);
    const engine_model *m = mv.m;
    const engine_hparams *hp = &m->hp;
    const int hd = (int)hp->head_dim_k;
    if (hp->arch != ENGINE_ARCH_QWEN3MOE && hp->arch != ENGINE_ARCH_QWEN3)
        return engine_err(ENGINE_EUNSUPPORTED, "%s: the CUDA batched pass serves qwen3moe and "
                          "qwen3", m->path);
    if (hd != 64 && hd != 128 && hd != 256)
        return engine_err(ENGINE_EUNSUPPORTED, "%s: head size %d (the CUDA batched pass takes "
                          "64, 128 or 256)", m->path, hd);
    if (kv != ENGINE_KV_F16 && kv != ENGINE_KV_F32)
        return engine_err(ENGINE_EUNSUPPORTED, "cuda batch: KV type %d (F16 or F32 only)", (int)kv);
    if (n_blocks < 1 || block_size < 1 || block_size > 4096 || max_pos < 1 || max_tokens < 1 ||
        max_seqs < 1 || max_seqs > max_tokens ||
        (int64_t)(n_blocks + 1) * block_size > INT32_MAX)
        return engine_err(ENGINE_EINVAL, "cuda batch: %d blocks of %d positions, %d positions, "
                          "%d tokens, %d sequences", n_blocks, block_size, max_pos, max_tokens,
                          max_seqs);
    engine_cuda_batch *b = (engine_cuda_batch *)calloc(1, sizeof *b);
    if (!b) return engine_err(ENGINE_ENOMEM, "out of memory");
    int rc = 0;
    size_t free_b = 0, total_b = 0;
    float *t = NULL;
    b->m = m;
    b->device = mv.device;
    b->n_blocks = n_blocks;
    b->block_size = block_size;
    b->max_pos = max_pos;
    b->max_tokens = max_tokens;
    b->max_seqs = max_seqs;
    b->max_blocks = (max_pos + block_size - 1) / block_size;
    b->n_layer = (int32_t)hp->n_layer;
    b->kv_f32 = kv == ENGINE_KV_F32;
    b->k_layer = (void **)calloc(hp->n_layer, sizeof(void *));
    b->v_layer = (void **)calloc(hp->n_layer, sizeof(void *));
    b->out = (float **)calloc((size_t)max_seqs, sizeof(float *));
    if (!b->k_layer || !b->v_layer || !b->out) {
        rc = engine_err(ENGINE_ENOMEM, "out of memory");
        goto done;
    }
    {
        const size_t need = engine_cuda_batch_bytes(cm, n_blocks, block_size, max_pos, max_tokens,
                                                    max_seqs, kv);
        const size_t meta = pb_meta_ints(max_tokens, max_seqs, b->max_blocks);
        /* block n_blocks: the decode pass's padding rows write there */
        const size_t layer = pb_pool_bytes(hp, n_blocks + 1, block_size, kv) / (2 * hp->n_layer);
        const size_t rb = sizeof(float) * (size_t)max_pos * hd;
        if ((rc = engine_cu_pf_err(cudaSetDevice(mv.device), "cudaSetDevice"))) goto done;
        if ((rc = engine_cu_pf_err(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo"))) goto done;
        engine_log(ENGINE_LOG_INFO, "cuda: batched pass: KV pool %d blocks of %d positions "
                   "(%.1f MiB, %s), %.1f MiB in all; %.2f GB free", n_blocks, block_size,
                   (double)(2 * layer * hp->n_layer) / 1048576.0, b->kv_f32 ? "F32" : "F16",
                   (double)need / 1048576.0, (double)free_b / 1e9);
        if (need + ((size_t)64 << 20) > free_b) {
            rc = engine_err(ENGINE_ENOMEM, "cuda batched pass (%d KV blocks, %d-token passes) "
                            "needs %.2f GB of GPU memory but %.2f GB are free", n_blocks,
                            max_tokens, (double)need / 1e9, (double)free_b / 1e9);
            goto done;
        }
        if ((rc = engine_cu_pf_err(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking),
                                   "cudaStreamCreate")))
            goto done;
        if ((rc = engine_cu_pf_err(cudaMalloc((void **)&b->pool, 2 * layer * hp->n_layer),
                                   "cudaMalloc (KV pool)")))
            goto done;
        b->pool_bytes = 2 * layer * hp->n_layer;
        for (uint32_t l = 0; l < hp->n_layer; l++) {
            b->k_layer[l] = b->pool + (2 * (size_t)l) * layer;
            b->v_layer[l] = b->pool + (2 * (size_t)l + 1) * layer;
        }
        if ((rc = engine_cu_pf_err(cudaMalloc((void **)&b->meta_d, sizeof(int32_t) * meta),
                                   "cudaMalloc (batch tables)")))
            goto done;
        if ((rc = engine_cu_pf_err(cudaMallocHost((void **)&b->meta_h, sizeof(int32_t) * meta),
                                   "cudaMallocHost (batch tables)")))
            goto done;
        if ((rc = engine_cu_pf_err(cudaMalloc((void **)&b->rope, rb), "cudaMalloc (rope)")))
            goto done;
        t = (float *)malloc(rb);
        if (!t) {
            rc = engine_err(ENGINE_ENOMEM, "out of memory");
            goto done;
        }
        engine_cu_rope_table(t, m->rope_inv_freq, hd, max_pos);
        if ((rc = engine_cu_pf_err(cudaMemcpy(b->rope, t, rb, cudaMemcpyHostToDevice),
                                   "cudaMemcpy (rope)")))
            goto done;
    }
    {
        engine_cuda_session_view sv;
        sv.stream = (void *)b->stream;
        sv.n_ctx = max_pos;
        sv.kv_f32 = b->kv_f32;
        sv.k_cache = b->k_layer;
        sv.v_cache = b->v_layer;
        sv.rope = b->rope;
        if ((rc = engine_cu_pf_new_view(&b->pf, cm, NULL, &sv, max_tokens))) goto done;
    }
    if ((rc = pb_dec_new(b, cm))) goto done;
    *out = b;
    b = NULL;
done:
    free(t);
    engine_cuda_batch_free(b);
    return rc;
}

extern "C" int engine_cuda_batch_run(engine_cuda_batch *b, const engine_cuda_batch_seq *seqs,
                                     int32_t n_seqs) {
    const engine_hparams *hp = &b->m->hp;
    if (n_seqs < 1 || n_seqs > b->max_seqs)
        return engine_err(ENGINE_EINVAL, "cuda batch: %d sequences (1 .. %d)", n_seqs,
                          b->max_seqs);
    int32_t n = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        const engine_cuda_batch_seq *q = &seqs[i];
        if (q->n_tokens < 1 || q->pos < 0 || q->pos > b->max_pos - q->n_tokens)
            return engine_err(ENGINE_ERANGE, "cuda batch: sequence %d: positions %d..%d (the "
                              "pass holds %d)", i, q->pos, q->pos + q->n_tokens - 1, b->max_pos);
        if (q->n_tokens > b->max_tokens - n)
            return engine_err(ENGINE_ERANGE, "cuda batch: more than %d tokens in one pass",
                              b->max_tokens);
        const int32_t need = (q->pos + q->n_tokens + b->block_size - 1) / b->block_size;
        if (!q->blocks || q->n_blocks < need || q->n_blocks > b->max_blocks)
            return engine_err(ENGINE_EINVAL, "cuda batch: sequence %d: a block table of %d "
                              "blocks for positions up to %d (blocks of %d)", i, q->n_blocks,
                              q->pos + q->n_tokens - 1, b->block_size);
        for (int32_t j = 0; j < need; j++)
            if (q->blocks[j] < 0 || q->blocks[j] >= b->n_blocks)
                return engine_err(ENGINE_EINVAL, "cuda batch: sequence %d: block id %d is not "
                                  "in [0, %d)", i, q->blocks[j], b->n_blocks);
        for (int32_t j = 0; j < q->n_tokens; j++)
            if (q->tokens[j] < 0 || (uint32_t)q->tokens[j] >= hp->n_vocab)
                return engine_err(ENGINE_EINVAL, "cuda batch: token id %d is not in [0, %u)",
                                  q->tokens[j], hp->n_vocab);
        n += q->n_tokens;
    }
    bool decode = b->dec != PB_DEC_OFF && n_seqs <= b->nb_max && n_seqs <= b->smallm_max;
    for (int32_t i = 0; decode && i < n_seqs; i++)
        decode = seqs[i].n_tokens == 1;
    if (decode) return pb_decode(b, seqs, n_seqs);
    const int32_t mt = b->max_tokens, mb = b->max_blocks;
    int32_t *tok = b->meta_h, *pos_of = tok + mt, *row_of = pos_of + mt, *seq_of = row_of + mt,
            *out_rows = seq_of + mt, *tables = out_rows + b->max_seqs;
    int32_t t = 0, n_out = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        const engine_cuda_batch_seq *q = &seqs[i];
        const int32_t need = (q->pos + q->n_tokens + b->block_size - 1) / b->block_size;
        memcpy(tables + (size_t)i * mb, q->blocks, sizeof(int32_t) * (size_t)need);
        for (int32_t j = 0; j < q->n_tokens; j++, t++) {
            const int32_t p = q->pos + j;
            tok[t] = q->tokens[j];
            pos_of[t] = p;
            row_of[t] = q->blocks[p / b->block_size] * b->block_size + p % b->block_size;
            seq_of[t] = i;
        }
        if (q->logits) {
            out_rows[n_out] = t - 1;
            b->out[n_out++] = q->logits;
        }
    }
    cudaStream_t st = b->stream;
    int rc = engine_cu_pf_err(cudaSetDevice(b->device), "cudaSetDevice");
    const size_t bytes = sizeof(int32_t) * (4 * (size_t)mt + b->max_seqs + (size_t)n_seqs * mb);
    if (!rc)
        rc = engine_cu_pf_err(cudaMemcpyAsync(b->meta_d, b->meta_h, bytes,
                                              cudaMemcpyHostToDevice, st),
                              "cudaMemcpyAsync (batch tables)");
    if (!rc) {
        const int32_t *d = b->meta_d;
        engine_cu_pf_paged pg;
        pg.pos_of = d + mt;
        pg.row_of = d + 2 * mt;
        pg.seq_of = d + 3 * mt;
        pg.out_rows_d = d + 4 * mt;
        pg.tables = d + 4 * mt + b->max_seqs;
        pg.max_blocks = mb;
        pg.block_size = b->block_size;
        pg.n_out = n_out;
        pg.out = b->out;
        rc = engine_cu_pf_chunk(b->pf, tok, n, 0, NULL, NULL, &pg);
    }
    /* the pinned tables are rewritten by the next call: wait for this pass to have read them */
    const int rs = engine_cu_pf_err(cudaStreamSynchronize(st), "batched pass");
    return rc ? rc : rs;
}

