/*
 * arch.h - model architectures as data: hyper-parameters, GGUF metadata keys, the tensor list
 * with exact GGUF names and shapes, loader-side validation, and size presets.
 * Private to engine/ (the loader, the forward pass, the random-model generator, `model info`).
 *
 * Supported architectures (GGUF `general.architecture`):
 *   qwen35moe Qwen3.5/3.6-35B-A3B: Gated DeltaNet and gated full-attention blocks with MoE and
 *             a shared expert; its keys, tensors and the HF mapping are documented in
 *             arch_qwen35moe.c, which the functions below dispatch to.
 *   qwen3moe  Qwen3-MoE (Qwen3-30B-A3B, ...): GQA attention with per-head q/k RMSNorm, NeoX
 *             RoPE, and in every block a softmax router over n_expert SwiGLU experts of which
 *             n_expert_used run per token (weights renormalised when norm_topk_prob).
 *   qwen3     dense Qwen3: the same attention, one SwiGLU FFN of n_ff per block.
 *
 * Metadata keys are the ones llama.cpp's convert_hf_to_gguf.py writes ("ARCH" stands for the
 * architecture name, e.g. "qwen3moe.block_count"):
 *   general.architecture                       string  "qwen3moe" | "qwen3"
 *   ARCH.block_count                           u32     n_layer
 *   ARCH.context_length                        u32     n_ctx_train
 *   ARCH.embedding_length                      u32     n_embd
 *   ARCH.feed_forward_length                   u32     n_ff (for qwen3moe the HF
 *                                                      intermediate_size, unused by the blocks)
 *   ARCH.attention.head_count                  u32     n_head
 *   ARCH.attention.head_count_kv               u32     n_head_kv
 *   ARCH.attention.key_length                  u32     head_dim_k  (optional: n_embd/n_head)
 *   ARCH.attention.value_length                u32     head_dim_v  (optional: n_embd/n_head)
 *   ARCH.rope.freq_base                        f32     rope_theta  (optional: 10000)
 *   ARCH.attention.layer_norm_rms_epsilon      f32     rms_norm_eps
 *   qwen3moe.expert_count                      u32     n_expert
 *   qwen3moe.expert_used_count                 u32     n_expert_used
 *   qwen3moe.expert_feed_forward_length        u32     n_ff_exp
 *   qwen3moe.expert_weights_norm               bool    norm_topk_prob (optional: converted
 *                                                      Qwen3-MoE files do not carry it, and
 *                                                      llama.cpp always renormalises: true)
 *   ARCH.vocab_size                            u32     n_vocab (optional; else the length of
 *                                                      tokenizer.ggml.tokens, else token_embd)
 * Tied embeddings are not a key: a file without output.weight uses token_embd.weight for the
 * output head (llama.cpp does the same).
 *
 * Tensor shapes are in ggml order: ne[0] is the contiguous row length (the input dimension of
 * a matrix), so a [n_out x n_in] torch weight has ne = {n_in, n_out}.
 *   token_embd.weight            {n_embd, n_vocab}
 *   output_norm.weight           {n_embd}                                        F32
 *   output.weight                {n_embd, n_vocab}     absent when tied
 *   blk.N.attn_norm.weight       {n_embd}                                        F32
 *   blk.N.attn_q.weight          {n_embd, n_head * head_dim_k}
 *   blk.N.attn_k.weight          {n_embd, n_head_kv * head_dim_k}
 *   blk.N.attn_v.weight          {n_embd, n_head_kv * head_dim_v}
 *   blk.N.attn_output.weight     {n_head * head_dim_v, n_embd}
 *   blk.N.attn_q_norm.weight     {head_dim_k}                                    F32
 *   blk.N.attn_k_norm.weight     {head_dim_k}                                    F32
 *   blk.N.ffn_norm.weight        {n_embd}                                        F32
 *   qwen3moe:
 *   blk.N.ffn_gate_inp.weight    {n_embd, n_expert}       the router (F32 in converted files)
 *   blk.N.ffn_gate_exps.weight   {n_embd, n_ff_exp, n_expert}
 *   blk.N.ffn_up_exps.weight     {n_embd, n_ff_exp, n_expert}
 *   blk.N.ffn_down_exps.weight   {n_ff_exp, n_embd, n_expert}
 *   qwen3:
 *   blk.N.ffn_gate.weight        {n_embd, n_ff}
 *   blk.N.ffn_up.weight          {n_embd, n_ff}
 *   blk.N.ffn_down.weight        {n_ff, n_embd}
 * Q and K are stored as in the HF checkpoint (no permutation: Qwen uses NeoX-style RoPE, which
 * rotates the two halves of each head).
 */
#ifndef SPARK_ENGINE_ARCH_H
#define SPARK_ENGINE_ARCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    ENGINE_ARCH_QWEN3MOE = 0,
    ENGINE_ARCH_QWEN3 = 1,
    ENGINE_ARCH_QWEN35MOE = 2, /* hybrid Gated DeltaNet + gated attention MoE (arch_qwen35moe.c) */
    ENGINE_ARCH_COUNT
} engine_arch;

/* The GGUF name ("qwen3moe"), static; NULL for an out-of-range value. */
const char *engine_arch_name(engine_arch arch);
/* The architecture named `name` (exact match), or -1. */
int engine_arch_from_name(const char *name);
/* True for architectures whose blocks are mixture-of-experts. */
bool engine_arch_is_moe(engine_arch arch);

typedef struct {
    engine_arch arch;
    uint32_t n_layer;       /* transformer blocks */
    uint32_t n_embd;        /* hidden size */
    uint32_t n_head;        /* query heads */
    uint32_t n_head_kv;     /* key/value heads (GQA: n_head % n_head_kv == 0) */
    uint32_t head_dim_k;    /* key_length: per-head q/k size */
    uint32_t head_dim_v;    /* value_length: per-head v size */
    uint32_t n_ff;          /* dense FFN size (qwen3); qwen3moe: written, unused */
    uint32_t n_expert;      /* qwen3moe only, else 0 */
    uint32_t n_expert_used; /* qwen3moe only, else 0 */
    uint32_t n_ff_exp;      /* per-expert FFN size, qwen3moe only, else 0 */
    uint32_t n_vocab;
    uint32_t n_ctx_train;   /* context_length */
    float rope_theta;       /* rope.freq_base */
    float rms_norm_eps;
    bool norm_topk_prob;    /* renormalise the top-k router weights to sum to 1 */
    bool tied_embeddings;   /* no output.weight: the head uses token_embd.weight */
    /* qwen35moe only (0 elsewhere); GGUF keys and HF names in arch_qwen35moe.c */
    uint32_t n_ff_shexp;    /* shared expert FFN size */
    uint32_t n_rot;         /* rope.dimension_count: rotated dims per head (partial rotary) */
    uint32_t rope_sections[4]; /* rope.dimension_sections (IMROPE; text positions: unused) */
    uint32_t full_attn_interval; /* every n-th block is full attention, the rest Gated DeltaNet */
    uint32_t n_nextn;       /* nextn_predict_layers: MTP blocks after the n_layer main blocks */
    uint32_t ssm_d_conv;    /* ssm.conv_kernel */
    uint32_t ssm_d_state;   /* ssm.state_size: linear-attention key head dim (= value head dim) */
    uint32_t ssm_n_group;   /* ssm.group_count: linear-attention key heads */
    uint32_t ssm_dt_rank;   /* ssm.time_step_rank: linear-attention value heads */
    uint32_t ssm_d_inner;   /* ssm.inner_size: value heads x value head dim */
} engine_hparams;

/* Check the hyper-parameters for consistency (non-zero sizes, n_head % n_head_kv, expert
 * counts, finite positive eps/theta, ...). ENGINE_EFORMAT naming the offending field. */
int engine_hparams_check(const engine_hparams *hp);

/* Read the hyper-parameters from a parsed GGUF file. Errors (ENGINE_EFORMAT, or
 * ENGINE_EUNSUPPORTED for an unknown architecture) name the file and the missing or bad key,
 * e.g. "m.gguf: missing key qwen3moe.expert_count". Also decides tied_embeddings (no
 * output.weight tensor) and n_vocab (see above), then runs engine_hparams_check. */
int engine_hparams_read(engine_hparams *out, const engine_gguf *g);

/* Write the architecture's metadata keys (general.architecture and every ARCH.* key above
 * except the optional vocab_size/expert_weights_norm, exactly as the converter does). */
int engine_hparams_write(const engine_hparams *hp, engine_gguf_writer *w);

/* ---------------------------------------------------------------------------------------------
 * Tensors
 * ------------------------------------------------------------------------------------------- */
typedef enum {
    /* global */
    ENGINE_TENSOR_TOKEN_EMBD = 0,
    ENGINE_TENSOR_OUTPUT_NORM,
    ENGINE_TENSOR_OUTPUT,
    /* per block */
    ENGINE_TENSOR_ATTN_NORM,
    ENGINE_TENSOR_ATTN_Q,
    ENGINE_TENSOR_ATTN_K,
    ENGINE_TENSOR_ATTN_V,
    ENGINE_TENSOR_ATTN_OUT,
    ENGINE_TENSOR_ATTN_Q_NORM,
    ENGINE_TENSOR_ATTN_K_NORM,
    ENGINE_TENSOR_FFN_NORM,
    ENGINE_TENSOR_FFN_GATE_INP,  /* router */
    ENGINE_TENSOR_FFN_GATE_EXPS, /* 3-D, one [n_ff_exp x n_embd] matrix per expert */
    ENGINE_TENSOR_FFN_UP_EXPS,
    ENGINE_TENSOR_FFN_DOWN_EXPS,
    ENGINE_TENSOR_FFN_GATE,      /* dense */
    ENGINE_TENSOR_FFN_UP,
    ENGINE_TENSOR_FFN_DOWN,
    /* qwen35moe (hybrid) */
    ENGINE_TENSOR_ATTN_POST_NORM,     /* post_attention_norm: the norm before the FFN */
    ENGINE_TENSOR_ATTN_QKV,           /* linear attention: q, k, v in one (conv input) */
    ENGINE_TENSOR_ATTN_GATE,          /* linear attention: z, the output norm's gate */
    ENGINE_TENSOR_SSM_CONV1D,         /* depthwise causal conv, {d_conv, conv channels} */
    ENGINE_TENSOR_SSM_DT,             /* "ssm_dt.bias": dt_bias per value head */
    ENGINE_TENSOR_SSM_A,              /* "ssm_a" (no suffix): -exp(A_log) per value head */
    ENGINE_TENSOR_SSM_BETA,
    ENGINE_TENSOR_SSM_ALPHA,
    ENGINE_TENSOR_SSM_NORM,           /* gated RMSNorm over a value head */
    ENGINE_TENSOR_SSM_OUT,
    ENGINE_TENSOR_FFN_GATE_INP_SHEXP, /* the shared expert's sigmoid gate, {n_embd} */
    ENGINE_TENSOR_FFN_GATE_SHEXP,
    ENGINE_TENSOR_FFN_UP_SHEXP,
    ENGINE_TENSOR_FFN_DOWN_SHEXP,
    /* qwen35moe MTP block (blk.<n_layer>.nextn.*, beside that block's attention and MoE) */
    ENGINE_TENSOR_NEXTN_EH_PROJ,          /* fc over [enorm(embedding) | hnorm(hidden)] */
    ENGINE_TENSOR_NEXTN_ENORM,
    ENGINE_TENSOR_NEXTN_HNORM,
    ENGINE_TENSOR_NEXTN_SHARED_HEAD_NORM, /* the MTP block's final norm (HF mtp.norm) */
    ENGINE_TENSOR_ROLE_COUNT
} engine_tensor_role;

#define ENGINE_TENSOR_NAME_MAX 64

typedef struct {
    char name[ENGINE_TENSOR_NAME_MAX]; /* exact GGUF name, e.g. "blk.3.ffn_up_exps.weight" */
    engine_tensor_role role;
    int layer;                         /* block index, -1 for global tensors */
    int n_dims;                        /* 1..3 */
    int64_t ne[4];                     /* ggml order; unused dimensions are 1 */
    bool is_norm;                      /* an RMSNorm weight: always F32 */
} engine_tensor_desc;

/* The GGUF base name of a role ("attn_q", "ffn_gate_exps", ...), static. */
const char *engine_tensor_role_name(engine_tensor_role role);

/* Write the full name of (role, layer) into buf ("blk.3.attn_q.weight"; layer ignored for
 * global roles). ENGINE_EINVAL when it does not fit. */
int engine_tensor_name(char *buf, size_t cap, engine_tensor_role role, int layer);

/* The architecture's tensors in file order: token_embd, then each block (attn_norm, attn_q,
 * attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm, ffn_norm, FFN tensors), then
 * output_norm and output (absent when tied). *out is allocated (free() it); *n_out is its
 * length. ENGINE_EFORMAT when hp fails engine_hparams_check, ENGINE_ENOMEM. */
int engine_arch_tensors(const engine_hparams *hp, engine_tensor_desc **out, size_t *n_out);

/* Total parameters, and those active per token (experts count n_expert_used/n_expert of their
 * size; the output head counts once even when tied to the embedding). */
void engine_arch_param_count(const engine_hparams *hp, uint64_t *total, uint64_t *active);

/* Loader-side validation: every tensor the architecture needs exists in g with the expected
 * shape and a type the CPU kernels support (norms must be F32... or any float type), and the
 * row length is a multiple of the type's block size. Extra tensors are allowed (llama.cpp
 * ignores e.g. rope_freqs). Errors name the file and the tensor:
 *   "m.gguf: tensor blk.3.attn_q.weight: shape {2048, 512} but expected {2048, 4096}". */
int engine_arch_validate(const engine_hparams *hp, const engine_gguf *g);

/* ---------------------------------------------------------------------------------------------
 * Presets: named sizes for the random-model generator (and tests/benchmarks).
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    const char *name;        /* "tiny", "qwen3-30b-a3b", ... */
    const char *description; /* one line */
    engine_hparams hp;
} engine_arch_preset;

/* Number of presets and the i-th (static; NULL out of range). */
size_t engine_arch_preset_count(void);
const engine_arch_preset *engine_arch_preset_at(size_t i);
/* The preset named `name`, or NULL. */
const engine_arch_preset *engine_arch_preset_find(const char *name);

/* The shape setter engine_arch_tensors uses (name from role and layer, is_norm from role). */
void engine_tensor_desc_set(engine_tensor_desc *d, engine_tensor_role role, int layer,
                            int n_dims, int64_t ne0, int64_t ne1, int64_t ne2);

/* qwen35moe (arch_qwen35moe.c), called by the generic functions above for that architecture:
 * the extra checks, the extra keys read into *hp (an: the architecture name; block_count
 * minus nextn_predict_layers becomes n_layer) and written, the tensor list, parameter counts. */
int engine_q35_hparams_check(const engine_hparams *hp);
int engine_q35_hparams_read(engine_hparams *hp, const engine_gguf *g, const char *an);
int engine_q35_hparams_write(const engine_hparams *hp, engine_gguf_writer *w, const char *an);
int engine_q35_tensors(const engine_hparams *hp, engine_tensor_desc **out, size_t *n_out);
void engine_q35_param_count(const engine_hparams *hp, uint64_t *total, uint64_t *active);
/* True when layer l (< n_layer) is a full-attention block (else Gated DeltaNet). */
bool engine_q35_layer_is_attn(const engine_hparams *hp, uint32_t l);
/* Bytes of one recurrent-state snapshot (conv + DeltaNet state of every DeltaNet block, F32):
 * what a session keeps per snapshot for rollback (model_int.h: ENGINE_Q35_SNAPSHOTS). */
size_t engine_q35_snapshot_bytes(const engine_hparams *hp);
/* Hyper-parameters from a Hugging Face checkpoint's dir/config.json (Qwen3_5MoeForCausalLM's
 * text config, or the multimodal config's text_config), checked; *bos = bos_token_id or -1.
 * ENGINE_EIO (no file), ENGINE_EFORMAT (bad JSON or values), ENGINE_EUNSUPPORTED (another
 * model type, a block pattern other than one full-attention block every n). */
int engine_q35_hf_config(engine_hparams *hp, int32_t *bos, const char *dir);

#ifdef __cplusplus
}
#endif
#endif /* SPARK_ENGINE_ARCH_H */
