/* Kernels of the qwen35moe speculative path (MTP drafts and the verify pass of m <= 5 tokens):
 * device code in q35_verify.cu, used by the session code of q35_mtp_host.cuh (qwen35.cu).
 *
 * engine_cu_vmatvec: y_t = W x_t for m activation vectors (x_t at x + t * x_stride, y_t at
 *   y + t * y_stride of each matrix): each block stages all m vectors (qdot.cuh staging, the
 *   optional RMSNorm per vector), a warp owns a row and reads its weights once for all m
 *   products. Each product is summed in exactly the order of the decode matvec (matvec.cu:
 *   lane chunks c = lane, lane + 32, ... then a warp sum; split-K for one matrix of few rows:
 *   warp w chunks 32 w + lane step 256, warp sums, then the 8 warps in order), so every y_t
 *   equals the decode step's bit for bit. mv.r3 (engine_cu_mv): several matrices take three
 *   rows per warp in one wave where two-row groups would need more (as the decode plan).
 * engine_cu_vffn_up / _down: the MoE kernels (moe_dev.cuh) with the token as one more grid
 *   dimension: token t's router, x, h, ids, weights at the given strides. Bit for bit the
 *   per-token launches.
 * engine_cu_vshgate: the shared expert's gate slot of every token (deltanet.cu's shgate).
 * engine_cu_vrmsnorm: out_t = rmsnorm(x_t) * w (as the staging computes it, in F32).
 * engine_cu_vcat_norm: the MTP block's input rows [rmsnorm(e_t) * we | rmsnorm(h_t) * wh].
 * engine_cu_vargmax: y[t] = argmax of logits row t (ties to the lower id, as the samplers).
 * engine_cu_spec_prep / engine_cu_spec_accept / engine_cu_spec_restore: the device side of the
 *   greedy speculative loop (see q35_mtp_host.cuh).
 * engine_cu_vdelta_step (q35_vdelta.cu; SPARK_CUDA_MTP_FUSED): the DeltaNet step of m tokens at
 *   the consecutive positions *d.pos .. *d.pos + m - 1 in one launch (conv widths K where
 *   engine_cu_vdelta_ok: K <= 4; wider ones take the decode step per token), the state read
 *   once and written once: token t's qkv / z / beta / alpha / out at d.<field> + t *
 *   <field>_stride, the state and the ring after token t (as the decode step leaves them) in
 *   snapshot slot ((pos_t + 1) / d.snap_every) % d.n_snap when pos_t + 1 is a multiple of
 *   d.snap_every (d.snap_ring / d.snap_state, or NULL: none), the live state after the last
 *   token. For m > 1 the live ring is NOT updated: call engine_cu_vring_commit (once for all blocks
 *   of the pass, snap_every 1) after it; m = 1 updates it. Per token bit for bit the decode step
 *   (deltanet.cu). ssq: m * nv * dv / 32 floats of scratch; d.counters as the decode step's (zero
 *   between launches, left zero). d.early == 2 (where engine_cu_vdelta_early_ok): the early cluster
 *   kernel (state read before the wait: only where no kernel of the chain writes the state or ring
 *   before it), bit for bit the same.
 * engine_cu_vring_commit: dst[0..n) = src_slot0[slot * slot_stride + i], slot = (*pos + 1) %
 *   n_snap (the ring of every DeltaNet block after the token at *pos; n a multiple of 4). */
#ifndef SPARK_ENGINE_CUDA_Q35_VERIFY_CUH
#define SPARK_ENGINE_CUDA_Q35_VERIFY_CUH

#include <stddef.h>
#include <stdint.h>

#include "common.cuh"
#include "deltanet.cuh"
#include "matvec.cuh"
#include "moe.cuh"
#include "qwen35_attn.cuh"
#include "sample.cuh"

typedef struct {
    engine_cu_mv mv;     /* matrices, cols, x (token 0), norm_w, eps */
    int m;               /* vectors, 1 .. ENGINE_CU_VMAX */
    size_t x_stride;     /* floats from x_t to x_{t+1} */
    size_t y_stride[3];  /* floats from y_t to y_{t+1} of each matrix */
    int prefetch;        /* m > 1: each block asks L1 for all m vectors before staging them */
    int split;           /* m > 1: a launch of fewer row groups than SMs takes the tokens as a
                          * grid dimension (a block per group and token, one vector staged), so
                          * the tokens' products run side by side instead of one after the other
                          * in each warp; each product the same sum (SPARK_CUDA_MTP_FUSED=split) */
    int dense;           /* a launch of two rows per warp (the heads): 1: compiled for 3 blocks
                          * per SM (registers as the decode matvec's; SPARK_CUDA_MTP_FUSED=h3);
                          * 2: four rows per warp instead, their loads in flight together (h4) */
    int serial_stage;    /* m > 1: each block stages the m vectors one after the other (before
                          * session 8; SPARK_CUDA_MTP_STAGE=serial) instead of side by side
                          * (qdot.cuh engine_cu_stage_xm; the same values). With engine_cu_mv.coop
                          * and a norm they are staged one after the other either way. */
} engine_cu_vmv;

/* engine_cu_vmatvec_tok (SPARK_CUDA_MTP_FUSED=head / tok): the same products with the tokens
 * as a grid dimension, each block running the decode matvec's block code (matvec_dev.cuh
 * mv_block) on one token's vector under the decode launch's plan (engine_cu_matvec_plan: rows
 * per warp or split-K, so each y_t is the decode's bit for bit): block b serves token b % m as
 * the decode launch's block b / m, so the m blocks of the same rows are adjacent in launch order
 * and all but the first find the rows in L2; a plan of one wave looping over its row groups
 * (the head) keeps one wave, its blocks shared by the m tokens. a->split and a->prefetch are
 * not used; m = 1: engine_cu_matvec itself. */
void engine_cu_vmatvec_tok(const engine_cu_vmv *a, cudaStream_t stream);
/* engine_cu_vmatvec_seq (SPARK_CUDA_MTP_FUSED=hseq): the same sums on the decode launch's grid
 * and rows with the tokens one after the other in each block: it stages the m vectors
 * (engine_cu_vmatvec_smem bytes), then runs the decode block code on each row group for token
 * 0, 1, ..., so each row is read from memory once and again from L1 / L2. A plan of split-K
 * rows takes engine_cu_vmatvec_tok's launch; m = 1: engine_cu_matvec. */
void engine_cu_vmatvec_seq(const engine_cu_vmv *a, cudaStream_t stream);

/* Shared memory one block of engine_cu_vmatvec needs for m vectors of cols values. */
size_t engine_cu_vmatvec_smem(int type, int cols, int m);
void engine_cu_vmatvec(const engine_cu_vmv *a, cudaStream_t stream);

/* a: token 0's arguments; token t's router + t * router_stride, x + t * x_stride, h + t *
 * h_stride, ids / weights + t * id_stride. */
void engine_cu_vffn_up(const engine_cu_ffn_up_args *a, int m, size_t router_stride,
                       size_t x_stride, size_t h_stride, size_t id_stride, cudaStream_t stream);
void engine_cu_vffn_down(const engine_cu_ffn_down_args *a, int m, size_t h_stride,
                         size_t id_stride, size_t y_stride, cudaStream_t stream);
/* The same with one block serving all m tokens (grid of the decode step's launch; each block
 * stages the m tokens' vectors: engine_cu_vffn_all_smem(type, cols of the staged vector, m)
 * bytes of shared memory, at most ENGINE_CU_VFFN_ALL_SMEM: above it use the per-token
 * launches). Bit for bit engine_cu_vffn_up / _down (+ engine_cu_vshgate).
 * up_all: b, when non-NULL, a dense FFN (router NULL, k 1: the shared expert) on the same x,
 *   norm and staging mode as a, in the same launch (h strides as a's).
 * down_all: a->sh_logit, when set, gives slot k - 1 of token t id a->sh_id and weight
 *   sigmoid(sh_logit[t * logit_stride]) (its ids / weights entries are not read; a->ids may
 *   then be NULL for k = 1). */
#define ENGINE_CU_VFFN_ALL_SMEM (48 * 1024)
size_t engine_cu_vffn_all_smem(int type, int cols, int m);
void engine_cu_vffn_up_all(const engine_cu_ffn_up_args *a, const engine_cu_ffn_up_args *b,
                           int m, size_t router_stride, size_t x_stride, size_t h_stride,
                           size_t id_stride, cudaStream_t stream);
void engine_cu_vffn_down_all(const engine_cu_ffn_down_args *a, int m, size_t h_stride,
                             size_t id_stride, size_t y_stride, size_t logit_stride,
                             cudaStream_t stream);
/* w[t * stride] = sigmoid(logit[t]), id[t * stride] = id_value for t < m. */
void engine_cu_vshgate(const float *logit, float *w, int32_t *id, size_t stride, int32_t id_value,
                       int m, cudaStream_t stream);
void engine_cu_vrmsnorm(const float *x, size_t x_stride, const float *w, float eps, int n, int m,
                        float *out, size_t out_stride, cudaStream_t stream);
/* out_t[0..n) = rmsnorm(e_t) * we, out_t[n..2n) = rmsnorm(h_t) * wh (out rows of 2n). */
void engine_cu_vcat_norm(const float *e, const float *h, const float *we, const float *wh,
                         float eps, int n, int m, float *out, cudaStream_t stream);
/* y[t] = argmax logits[t * n .. t * n + n); scratch: 2 * ENGINE_CU_VARGMAX_BLOCKS * m. */
#define ENGINE_CU_VARGMAX_BLOCKS 64
void engine_cu_vargmax(const float *logits, int n, int m, float *scratch, int32_t *y,
                       cudaStream_t stream);

/* The speculative loop's control block (device). */
typedef struct {
    int32_t p0;                         /* position of the verify pass's first token */
    int32_t k;                          /* drafts this step */
    int32_t j;                          /* drafts accepted (set by accept) */
    int32_t n_emit;                     /* tokens emitted this step: j + 1 */
    int32_t emit[ENGINE_CU_VMAX];       /* d_1 .. d_j, then the target's token */
    int32_t mpos[ENGINE_CU_VMAX];       /* positions of the MTP pairs of the verify pass */
} engine_cu_spec_ctl;

/* Before a step (one thread), !with_drafts: vstep[t].pos = p0 + t for t < m, the MTP pair
 * positions max(p0 - 1 + t, 0), and the draft state dstep (token vstep[0].token, position
 * p0 - 1, n_out 0); with_drafts (after the drafts; p0 unchanged since): vstep[1 + i].token =
 * drafts[i] for i < m - 1 alone. p0 comes from the control block. serial: launched without
 * programmatic dependent launch (it starts once every earlier kernel is complete, and so the
 * verify pass's kernels after it start after the first prep's positions are stored). */
void engine_cu_spec_prep(engine_cu_spec_ctl *ctl, engine_cu_step *vstep, engine_cu_step *dstep,
                         const int32_t *drafts, int m, bool with_drafts, bool serial,
                         cudaStream_t stream);
/* After a verify pass of k + 1 tokens with the target's choices y[0..k]: j = the drafts
 * kept (d_{i+1} == y[i]), emit = d_1 .. d_j, y[j]; hidden row 0 = row j + 1 (the new last
 * token's), vstep[0].token = y[j]; the next step's p0 = p0 + j + 1. */
void engine_cu_spec_accept(engine_cu_spec_ctl *ctl, const int32_t *y, const int32_t *drafts,
                           float *hbuf, int n_embd, engine_cu_step *vstep, cudaStream_t stream);
/* When ctl->j < ctl->k: dst[i] = src_slot0[slot * slot_stride + i] for i < n, slot = (p0 + j +
 * 1) % ENGINE_CU_VMAX, with p0 the pass's (before accept moved it: p0_old = ctl->p0 - j - 1). */
void engine_cu_spec_restore(const engine_cu_spec_ctl *ctl, const float *src_slot0,
                            size_t slot_stride, float *dst, size_t n, cudaStream_t stream);

/* engine_cu_vgatt_run (q35_vatt.cu; SPARK_CUDA_MTP_FUSED=attn): the gated attention of m
 * queries at the positions a.pos[t * pos_stride] (device; not decreasing) in two launches,
 * each query as one launch of the decode step after the previous ones would: query t's
 * [q | gate] at a.qg + t * qg_stride, its K / V projections at a.k / a.v + t * kv_stride
 * (stored at its cache row before any later query reads it), its output at a.out + t *
 * out_stride; partial: m * partial_stride floats, partial_stride >= n_head * runners * (hd + 2),
 * runners = engine_cu_vgatt_runners(n_ctx). a.partial and a.counters are not used. Per query
 * bit for bit the decode step's engine_cu_gatt_run (qwen35_attn.cu). */
typedef struct {
    engine_cu_gatt a; /* query 0's arguments */
    int m, runners;
    size_t pos_stride;                                       /* int32 from query to query */
    size_t qg_stride, kv_stride, out_stride, partial_stride; /* floats */
    float *partial;
} engine_cu_vgatt;

int engine_cu_vgatt_runners(int n_ctx);
void engine_cu_vgatt_run(const engine_cu_vgatt *a, cudaStream_t stream);

/* engine_cu_vkv_store (q35_verify.cu; SPARK_CUDA_MTP_FUSED=feed): the MTP feed's K/V rows of m
 * pairs at the positions pos[t * pos_stride] (device; not decreasing): per (pair t, KV head g) a
 * warp takes k = rope(rmsnorm(k_t,g) * k_norm) and stores it with v_t,g at cache row pos_t, the
 * decode attention's code (gatt_dev.cuh), so each row is bit for bit what the attention launch
 * of that pair would store. A pair whose position the next pair repeats (pair 0 at p0 = 0) is
 * not stored: the later pair's row is the one kept, as with launches in order. */
typedef struct {
    const float *k, *v; /* pair t's projections [n_kv][hd] at + t * kv_stride */
    size_t kv_stride;
    const float *k_norm; /* [hd] */
    const float2 *rope;  /* [n_ctx][rot / 2] */
    int rot;
    float eps;
    void *k_cache, *v_cache; /* [n_ctx][n_kv hd], F16 or F32 (kv_f32) */
    int kv_f32;
    const int32_t *pos; /* device */
    size_t pos_stride;  /* int32 from pair to pair */
    int m, n_kv, hd;    /* hd: 64, 128 or 256 */
} engine_cu_vkv;

void engine_cu_vkv_store(const engine_cu_vkv *a, cudaStream_t stream);

typedef struct {
    engine_cu_delta d; /* token 0's arguments */
    int m;             /* tokens, 1 .. ENGINE_CU_VMAX */
    size_t qkv_stride, z_stride, ba_stride, out_stride; /* floats from token t to t + 1 */
    float *ssq;                                         /* [m][nv][dv / 32] scratch */
} engine_cu_vdelta;

size_t engine_cu_vdelta_smem(int dk, int m);
bool engine_cu_vdelta_ok(int K);
bool engine_cu_vdelta_early_ok(int dk, int dv);
void engine_cu_vdelta_step(const engine_cu_vdelta *a, cudaStream_t stream);
void engine_cu_vring_commit(const float *src_slot0, size_t slot_stride, float *dst, size_t n,
                            const int32_t *pos, int n_snap, cudaStream_t stream);

#endif
