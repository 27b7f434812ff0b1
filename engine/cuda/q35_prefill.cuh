/* The prefill pass of qwen35moe on the GPU (q35_prefill.cu): n tokens of one session per
 * chunk, each block over all of them at once.
 *
 *   DeltaNet block: qkv, z, beta|alpha on the GEMMs of gemm.cuh (attn_norm in the activation
 *     prep) | engine_cu_q35_conv (causal conv + SiLU over the chunk, the positions before it
 *     from the conv ring) | engine_cu_q35_ring (the ring after the chunk, and its copies at the
 *     snapshot points inside it) | engine_cu_q35_delta_chunk (l2 norms, gates and the chunked
 *     delta rule, snapshots of S) | engine_cu_q35_gnorm (gated RMSNorm) | out_proj (+= x)
 *   attention block: [q|gate], k, v GEMMs | engine_cu_gatt_pf_qk (q/k norms, partial rope, KV
 *     store) | engine_cu_q35_att_tc (F16 cache: tensor cores, output gate fused) or
 *     engine_cu_pf_attention (F32 cache: prefill.cu's SIMT pass) + engine_cu_gatt_pf_gate |
 *     o_proj
 *   MoE: router GEMM (split-K F32) | engine_cu_pf_route / _sort | grouped gate/up and down
 *     GEMMs of the routed experts, dense ones of the shared expert | engine_cu_q35_pf_combine
 *     (x += sigmoid(shared gate) * shared + sum of the routed outputs, in the CPU's order)
 *   head: output_norm + output GEMM of the last row.
 *
 * The chunked delta rule (engine_cu_q35_delta_chunk): per value head h and 32 of its state
 * columns (grid nv x dv / 32, the columns of S are independent in the delta rule), over
 * sub-chunks that end on the snapshot grid (ENGINE_CUDA_Q35_SNAP_EVERY positions, as the CPU's
 * chunks): with S0 the state before the sub-chunk, G_t the cumulative log decay inside it and
 * k, q l2-normalised,
 *   u_t = beta_t (v_t - e^{G_t} S0^T k_t - sum_{s<t} e^{G_t - G_s} (k_t . k_s) u_s)
 *   o_t = e^{G_t} S0^T q_t + sum_{s<=t} e^{G_t - G_s} (q_t . k_s) u_s
 *   S   = e^{G_L} S0 + sum_s e^{G_L - G_s} k_s u_s^T
 * which is the recurrent form (deltanet.cuh) regrouped (the WY form; a forward substitution of
 * L <= 16 unknowns per column). S stays in registers for the whole chunk; at each grid point
 * whose snapshot slot no later grid point of the chunk overwrites, S is copied into the slot
 * (as the decode step does, so rollback works from either path).
 * Host launchers only. */
#ifndef SPARK_ENGINE_CUDA_Q35_PREFILL_CUH
#define SPARK_ENGINE_CUDA_Q35_PREFILL_CUH

#include <stddef.h>
#include <stdint.h>

#include "common.cuh"

extern "C" {
#include "cuda/cuda_backend.h"
}

/* One block's weights as uploaded by qwen35.cu (device pointers). */
typedef struct {
    int attn, slot; /* slot: index among the attention or the DeltaNet blocks */
    const float *attn_norm, *post_norm, *q_norm, *k_norm, *conv, *dt_bias, *a, *ssm_norm;
    const float *shg; /* [E] shared-expert gate */
    /* wbeta holds beta's rows then alpha's when walpha.d is NULL */
    engine_cuda_wview wq, wk, wv, wo, wqkv, wz, wbeta, walpha, wout, router;
    engine_cuda_wview gate_exps, up_exps, down_exps, gate_sh, up_sh, down_sh;
} engine_cu_q35_layer;

/* A session's device state (borrowed from qwen35.cu). */
typedef struct {
    const engine_model *m;
    int device;
    void *stream; /* cudaStream_t */
    int32_t n_ctx;
    int kv_f32, v_tiled, n_lin, n_attn;
    void *const *k_cache, *const *v_cache; /* [n_attn] */
    float *ring, *state, *snap;            /* as engine_cuda_q35_session */
    size_t ring_per, state_per, snap_stride;
    int32_t *snap_pos; /* host [ENGINE_CUDA_Q35_SNAPSHOTS] */
    const float *rope; /* [n_ctx][rot / 2] (cos, sin) */
    engine_cuda_wview tok_embd, output;
    const float *output_norm;
} engine_cu_q35_view;

/* The MTP block of a session's model and, while the session has MTP on, its state (borrowed
 * from q35_mtp_host.cuh). */
typedef struct {
    engine_cu_q35_layer ly;     /* blk.<n_layer>: one gated attention block (+ MoE) */
    engine_cuda_wview eh;       /* fc: E rows over [enorm(embedding) | hnorm(h)] (2E) */
    const float *enorm, *hnorm; /* [E] */
    bool on;                    /* the session feeds the block; the fields below are set */
    void *k_cache, *v_cache;    /* the block's KV [n_ctx][n_kv hd] (F16 or F32 as the session) */
    float *hbuf;                /* row 0: h of the session's last token (its pair is pending) */
    float *snap_hid;            /* [ENGINE_CUDA_Q35_SNAPSHOTS][E]: h before each snapshot point */
    int32_t *win_m;             /* the last verify pass's window (0: none) */
} engine_cu_q35_mtp_view;

extern "C" {
/* qwen35.cu: the views of a session and of block l of its model. */
void engine_cuda_q35_view_get(engine_cuda_q35_session *s, engine_cu_q35_view *out);
void engine_cuda_q35_layer_get(engine_cuda_q35_session *s, int l, engine_cu_q35_layer *out);
/* q35_mtp_host.cuh: false (out untouched) when the model has no MTP block on the device. */
bool engine_cuda_q35_mtp_view_get(engine_cuda_q35_session *s, engine_cu_q35_mtp_view *out);
/* q35_mtp_host.cuh: the prefill that serves the session's MTP prompts (the one created last;
 * engine_cuda_q35_prefill_free of it sets NULL). */
void engine_cuda_q35_prefill_set(engine_cuda_q35_session *s, engine_cuda_q35_prefill *p);
engine_cuda_q35_prefill *engine_cuda_q35_prefill_get(engine_cuda_q35_session *s);
}

/* The prefill of a session with MTP on also feeds the MTP block over the same positions (its KV
 * at position p holds the pair (h_p, token p + 1), h_p = rmsnorm(x_p) * output_norm after the
 * last block): per chunk at pos of n tokens the pairs at positions pos - 1 .. pos + n - 2 (from
 * 0 at pos 0: n - 1 pairs), h_{pos-1} from the MTP state's pending row, then h_{pos+n-1} left
 * pending; the hidden state before each snapshot point the chunk keeps goes with it. Only the
 * block's KV rows are computed: embed | [enorm(e) | hnorm(h)] | fc GEMM | attn_norm + k, v
 * GEMMs | k norm, rope, store (engine_cu_gatt_pf_qk with no query heads). The block's attention
 * output, MoE and final norm of a fed pair are never read (a draft starts from h and the
 * pending token, later drafts from the previous draft's output), so they are not computed.
 * False when the block's shapes have no prefill GEMM (such sessions append through verify
 * passes). */
bool engine_cu_q35_prefill_mtp_ok(const engine_cuda_q35_prefill *p);

/* The DeltaNet kernels (deltanet_chunk.cu). */
typedef struct {
    const float *qkv; /* [n][C] projections (before the conv) */
    const float *conv_w;
    float *ring;      /* [C][K]: slot p % K holds the input of position p */
    float *cv;        /* [n][C] silu(conv) */
    float *snap_ring; /* slot 0 of this block's ring in the snapshots (stride snap_stride) */
    size_t snap_stride;
    int n, pos0, C, K;
} engine_cu_q35_conv_args;
void engine_cu_q35_conv(const engine_cu_q35_conv_args *a, cudaStream_t stream);
/* The ring after the chunk (and its copies at the kept snapshot points): after the conv. */
void engine_cu_q35_ring(const engine_cu_q35_conv_args *a, cudaStream_t stream);

typedef struct {
    const float *cv;       /* [n][C] after the conv: q, k (key heads), v (value heads) */
    const float *ba;       /* [n][2 nv]: beta logits then alpha logits */
    const float *dt_bias, *a; /* [nv] */
    float *state;          /* [nv][dk][dv] */
    float *snap_state;     /* slot 0 of this block's state in the snapshots */
    size_t snap_stride;
    float *out;            /* [n][nv * dv] o (before the gated norm) */
    int n, pos0, nk, nv, dk, dv, C, v_tiled;
} engine_cu_q35_delta_args;
bool engine_cu_q35_delta_ok(int dk, int dv);
void engine_cu_q35_delta_chunk(const engine_cu_q35_delta_args *a, cudaStream_t stream);

/* o[t][h] = rmsnorm(o[t][h]) * norm_w * silu(z[t][h]) in place, per token and value head. */
void engine_cu_q35_gnorm(float *o, const float *z, const float *norm_w, int n, int nv, int dv,
                         float eps, cudaStream_t stream);

/* Gated causal attention over an F16 cache on tensor cores (q35_prefill_att.cu): query t of
 * head h at position pos0 + t attends to cache rows 0 .. pos0 + t of KV head h / G (G = n_head
 * / n_kv); out = softmax(q k^T / sqrt(hd)) V * sigmoid(gate). A block takes 64 (query, head)
 * rows: 64 / G queries with every head of one KV group, so the group's heads share each K and
 * V tile (32 keys); S = Q K^T and O += P V with mma.sync m16n8k16 F16 (Q and P rounded to F16),
 * the online softmax in F32 registers. Head size 64, 128 or 256; G dividing 64. */
typedef struct {
    const float *q;              /* [n][n_head][hd], normalised and rotated */
    const float *qg;             /* [n][n_head][2 hd]: the gate is the second half */
    const void *k_cache, *v_cache; /* F16 [n_ctx][n_kv * hd] */
    int n, pos0, n_head, n_kv, hd;
    float *out;                  /* [n][n_head * hd] */
} engine_cu_q35_att_args;
bool engine_cu_q35_att_tc_ok(int kv_f32, int n_head, int n_kv, int hd);
void engine_cu_q35_att_tc(const engine_cu_q35_att_args *a, cudaStream_t stream);

/* Which snapshot points a chunk of n tokens at pos0 writes: grid points b in (pos0, pos0 + n]
 * with b > last - SNAP_EVERY * SNAPSHOTS (the older ones would be overwritten in the same
 * chunk); returns that lower bound (exclusive). */
int32_t engine_cu_q35_snap_floor(int32_t pos0, int32_t n);

#endif
