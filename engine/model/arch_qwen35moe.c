/* qwen35moe: Qwen3.5/3.6-35B-A3B, hybrid Gated DeltaNet / gated attention with MoE, on the CPU.
 *
 * Reference: HF transformers 5.17 `Qwen3_5MoeForCausalLM` (modeling_qwen3_5_moe.py); GGUF
 * layout: llama.cpp's convert_hf_to_gguf.py (Qwen3_5MoeTextModel) and src/models/qwen35moe.cpp.
 *
 * Blocks: layer l is full attention when (l + 1) % full_attention_interval == 0 (HF
 * `layer_types`, default interval 4), else Gated DeltaNet ("linear attention"). Every block:
 *   h = x + mixer(rmsnorm(x) * attn_norm);  x = h + moe(rmsnorm(h) * post_attention_norm)
 * RMSNorm is x / sqrt(mean(x^2) + eps) * (1 + w) in HF; the converter stores 1 + w, so GGUF
 * norms multiply plainly (not ssm_norm: HF's gated norm uses w itself, stored as is).
 *
 * Full attention (16 q / 2 kv heads of 256 in the real model):
 *   [q | gate] per head = Wq xn (2 * head_dim per head, q first); k = Wk xn; v = Wv xn
 *   q, k: RMSNorm per head (q_norm, k_norm), then NeoX RoPE on the first n_rot dims of each
 *   head (partial_rotary_factor 0.25: 64 of 256; theta 1e7). The checkpoint asks for interleaved
 *   MRoPE (sections 11/11/10); for text all three position ids are the token's position, so it is
 *   exactly 1-D RoPE (what this file does; image/video positions are not supported).
 *   out = Wo (softmax(q K^T / sqrt(head_dim)) V * sigmoid(gate))
 * Gated DeltaNet (value heads nv = 32, key heads nk = 16, head dims dk = dv = 128 real):
 *   qkv = Wqkv xn (conv channels 2*nk*dk + nv*dv), z = Wz xn, b = Wbeta xn, a = Walpha xn
 *   qkv = silu(causal depthwise conv1d(qkv)), kernel d_conv = 4, no bias; state: the last
 *         d_conv - 1 inputs per channel
 *   q, k = l2norm per key head (x * rsqrt(sum x^2 + 1e-6)); q *= 1/sqrt(dk)
 *   beta = sigmoid(b); g = exp(A * softplus(a + dt_bias)) with A = -exp(A_log) (GGUF ssm_a)
 *   per value head h (reading key head kh(h)), state S [dk][dv]:
 *       S *= g;  delta = (v - S^T k) * beta;  S += k delta^T;  o = S^T q
 *   o = rmsnorm(o) * ssm_norm * silu(z) per value head;  out = Wout o
 * MoE: p = softmax(router xn), top-k renormalised; y = sum p_j expert_j(xn)
 *      + sigmoid(w_shexp . xn) * shared_expert(xn)   (SwiGLU experts)
 *
 * Value-head order. HF groups value heads by key head (kh(h) = h / (nv/nk), torch's
 * repeat_interleave); llama.cpp's converter reorders every value-head-indexed tensor to the tiled
 * order (kh(h) = h % nk) so that ggml_repeat can broadcast. The arithmetic is per value head, so
 * the forward only needs kh(): GGUF files are tiled (the generator writes them that way and
 * reorders its safetensors output back to HF's grouped order).
 *
 * Names and shapes (GGUF ne order, i.e. {in, out} for a matrix; torch shape reversed):
 *   HF (model.layers.N.)                 GGUF (blk.N.)                 GGUF shape
 *   embed_tokens (model.)                token_embd.weight             {E, V}
 *   norm (model.)                        output_norm.weight (+1)       {E}
 *   lm_head                              output.weight                 {E, V}
 *   input_layernorm                      attn_norm.weight (+1)         {E}
 *   post_attention_layernorm             post_attention_norm (+1)      {E}
 *   self_attn.q_proj                     attn_q.weight                 {E, 2 * nh * hd}
 *   self_attn.k_proj / v_proj            attn_k / attn_v.weight        {E, nkv * hd}
 *   self_attn.o_proj                     attn_output.weight            {nh * hd, E}
 *   self_attn.q_norm / k_norm            attn_q_norm / attn_k_norm (+1) {hd}
 *   linear_attn.in_proj_qkv              attn_qkv.weight (v rows tiled) {E, 2*nk*dk + nv*dv}
 *   linear_attn.in_proj_z                attn_gate.weight (tiled)      {E, nv * dv}
 *   linear_attn.in_proj_b / in_proj_a    ssm_beta / ssm_alpha (tiled)  {E, nv}
 *   linear_attn.conv1d [C, 1, K]         ssm_conv1d.weight (v tiled)   {K, C}
 *   linear_attn.dt_bias                  ssm_dt.bias (tiled)           {nv}
 *   linear_attn.A_log                    ssm_a = -exp(A_log) (tiled)   {nv}
 *   linear_attn.norm                     ssm_norm.weight (as is)       {dv}
 *   linear_attn.out_proj                 ssm_out.weight (cols tiled)   {nv * dv, E}
 *   mlp.gate                             ffn_gate_inp.weight           {E, X}
 *   mlp.experts.gate_up_proj [X, 2F, E]  ffn_gate_exps / ffn_up_exps   {E, F, X} each (gate =
 *                                        rows 0..F-1 of each expert, up = rows F..2F-1)
 *   mlp.experts.down_proj [X, E, F]      ffn_down_exps.weight          {F, E, X}
 *   mlp.shared_expert.gate/up_proj       ffn_gate_shexp / ffn_up_shexp {E, Fs}
 *   mlp.shared_expert.down_proj          ffn_down_shexp.weight         {Fs, E}
 *   mlp.shared_expert_gate [1, E]        ffn_gate_inp_shexp.weight     {E} (or {E, 1})
 *   mtp.* (one MTP block)                blk.<n_layer>.* + nextn.*     not loaded (stage 1)
 * Keys (qwen35moe.*): the common ones (arch.h; feed_forward_length absent), plus
 *   expert_shared_feed_forward_length Fs, ssm.conv_kernel K, ssm.state_size dk, ssm.group_count
 *   nk, ssm.time_step_rank nv, ssm.inner_size nv*dv, full_attention_interval (default 4),
 *   rope.dimension_count n_rot, rope.dimension_sections [4] (IMROPE), nextn_predict_layers
 *   (optional: recent converters append the MTP block as blk.<n_layer>, block_count counts it).
 *
 * Sessions: KV for the full-attention blocks in a private contiguous cache; per Gated DeltaNet
 * block a conv state [C][K-1] and a recurrent state [nv][dk][dv] (F32). The delta rule runs in
 * chunked form (engine_cpu_delta_chunk_rows, issue 11) on chunks that end on the grid of
 * ENGINE_Q35_SNAP_EVERY positions: S is the state at the last grid point (the base), the
 * tokens since then are pending rows per value head (key, correction, cumulative log decay;
 * n_pend of them, the same in every block), and a token's output comes from S and the rows
 * before it; reaching a grid point folds the rows into S. Prefill appends a chunk's rows at
 * once (one pass over S for s^T k and s^T q of all of them); decode appends one. A row's bits
 * depend only on the base and the rows before it, so the logits do not depend on how tokens
 * are split into passes, exactly as with the recurrent form (within ~1e-6 of it:
 * test_q35_chunk). The state covers exactly the session's tokens; at every position that is
 * a multiple of ENGINE_Q35_SNAP_EVERY (16, the paged KV block) the conv and DeltaNet blocks
 * copy it into a ring of ENGINE_Q35_SNAPSHOTS snapshots (inside a chunk too: the conv runs in
 * segments ending there, the delta rule folds and copies S there; no rows are pending at a
 * grid point).
 * Truncation restores the latest snapshot at or before the target and recomputes
 * the rest from the session's tokens (from 0 when none is left), bit-identical to never having
 * gone further. One snapshot of the 35B-A3B shape: 30 DeltaNet blocks x (8192 x 3 conv + 32 x
 * 128 x 128 state) F32 = 65.9 MB (engine_q35_snapshot_bytes). The MoE passes and the row-split
 * matmul are ffn_moe.c's, shared with arch_qwen3moe.c. Nothing allocates after
 * engine_q35_fwd_new. */
#include "model/model_int.h"

#include <math.h>
#include <string.h>

#include "model/ffn_moe.h"
#ifdef SPARK_HAVE_CUDA
#include "cuda/q35_mtp.h" /* MTP on a CUDA session */
#endif
#include "model/safetensors.h"
#include "tokenizer/json.h"

#define Q35_MAX_CONV ENGINE_CPU_MAX_CONV
_Static_assert(ENGINE_Q35_SNAP_EVERY <= ENGINE_CPU_DELTA_CHUNK_MAX,
               "the delta rule's chunks end on the snapshot grid");

/* ---------------------------------------------------------------------------------------------
 * Hyper-parameters and tensors
 * ------------------------------------------------------------------------------------------- */
bool engine_q35_layer_is_attn(const engine_hparams *hp, uint32_t l) {
    return hp->full_attn_interval > 0 && (l + 1) % hp->full_attn_interval == 0;
}

int engine_q35_hparams_check(const engine_hparams *hp) {
    const char *an = "qwen35moe";
    const uint32_t big = 1u << 20;
    if (hp->n_ff_shexp == 0 || hp->n_ff_shexp > big)
        return engine_err(ENGINE_EFORMAT,
                          "%s.expert_shared_feed_forward_length = %u is out of "
                          "range (1..%u)",
                          an, hp->n_ff_shexp, big);
    if (hp->head_dim_k != hp->head_dim_v)
        return engine_err(ENGINE_EFORMAT, "%s: key_length %u != value_length %u", an,
                          hp->head_dim_k, hp->head_dim_v);
    if (hp->n_rot == 0 || hp->n_rot % 2 || hp->n_rot > hp->head_dim_k)
        return engine_err(ENGINE_EFORMAT,
                          "%s.rope.dimension_count = %u must be even and in "
                          "(0, key_length = %u]",
                          an, hp->n_rot, hp->head_dim_k);
    if (hp->full_attn_interval == 0 || hp->full_attn_interval > hp->n_layer)
        return engine_err(ENGINE_EFORMAT,
                          "%s.full_attention_interval = %u is out of range "
                          "(1..block_count = %u)",
                          an, hp->full_attn_interval, hp->n_layer);
    if (hp->ssm_d_conv < 1 || hp->ssm_d_conv > Q35_MAX_CONV)
        return engine_err(ENGINE_EFORMAT, "%s.ssm.conv_kernel = %u is out of range (1..%d)", an,
                          hp->ssm_d_conv, Q35_MAX_CONV);
    if (hp->ssm_d_state == 0 || hp->ssm_d_state > 1024 || hp->ssm_n_group == 0 ||
        hp->ssm_n_group > 4096 || hp->ssm_dt_rank == 0 || hp->ssm_dt_rank > 4096)
        return engine_err(ENGINE_EFORMAT,
                          "%s: ssm.state_size %u (1..1024), group_count %u, "
                          "time_step_rank %u (1..4096) out of range",
                          an, hp->ssm_d_state, hp->ssm_n_group, hp->ssm_dt_rank);
    if (hp->ssm_dt_rank % hp->ssm_n_group)
        return engine_err(ENGINE_EFORMAT,
                          "%s.ssm.time_step_rank = %u (value heads) is not a "
                          "multiple of ssm.group_count = %u (key heads)",
                          an, hp->ssm_dt_rank, hp->ssm_n_group);
    if ((uint64_t)hp->ssm_d_inner != (uint64_t)hp->ssm_dt_rank * hp->ssm_d_state)
        return engine_err(ENGINE_EFORMAT,
                          "%s.ssm.inner_size = %u is not time_step_rank x "
                          "state_size = %u x %u (value heads of the key head size)",
                          an, hp->ssm_d_inner, hp->ssm_dt_rank, hp->ssm_d_state);
    if (hp->n_nextn > 16)
        return engine_err(ENGINE_EFORMAT, "%s.nextn_predict_layers = %u is out of range (0..16)",
                          an, hp->n_nextn);
    if (!hp->norm_topk_prob)
        return engine_err(ENGINE_EUNSUPPORTED,
                          "%s: expert_weights_norm = false (the reference "
                          "always renormalises the top-k weights)",
                          an);
    return 0;
}

static int q35_u32(const engine_gguf *g, const char *an, const char *suffix, uint32_t *out,
                   bool required) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", an, suffix);
    if (!required && !engine_gguf_find_key(g, key)) return 0;
    return engine_gguf_get_u32(g, key, out);
}

int engine_q35_hparams_read(engine_hparams *hp, const engine_gguf *g, const char *an) {
    int rc;
    hp->full_attn_interval = 4;
    if ((rc = q35_u32(g, an, "expert_shared_feed_forward_length", &hp->n_ff_shexp, true)) ||
        (rc = q35_u32(g, an, "ssm.conv_kernel", &hp->ssm_d_conv, true)) ||
        (rc = q35_u32(g, an, "ssm.state_size", &hp->ssm_d_state, true)) ||
        (rc = q35_u32(g, an, "ssm.group_count", &hp->ssm_n_group, true)) ||
        (rc = q35_u32(g, an, "ssm.time_step_rank", &hp->ssm_dt_rank, true)) ||
        (rc = q35_u32(g, an, "ssm.inner_size", &hp->ssm_d_inner, true)) ||
        (rc = q35_u32(g, an, "full_attention_interval", &hp->full_attn_interval, false)) ||
        (rc = q35_u32(g, an, "nextn_predict_layers", &hp->n_nextn, false)))
        return rc;
    hp->n_rot = hp->head_dim_k;
    if ((rc = q35_u32(g, an, "rope.dimension_count", &hp->n_rot, false))) return rc;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", an);
    if (engine_gguf_find_key(g, key)) {
        const engine_gguf_value *v;
        if ((rc = engine_gguf_get_arr(g, key, -1, &v))) return rc;
        if (v->arr.n > 4 || v->arr.type == ENGINE_GGUF_STRING || v->arr.type == ENGINE_GGUF_ARRAY ||
            v->arr.type == ENGINE_GGUF_FLOAT32 || v->arr.type == ENGINE_GGUF_FLOAT64)
            return engine_err(ENGINE_EFORMAT, "%s: %s must be at most 4 integers",
                              engine_gguf_path(g), key);
        for (uint64_t i = 0; i < v->arr.n; i++) {
            int64_t x = engine_gguf_arr_i64(v, i);
            if (x < 0 || x > 4096)
                return engine_err(ENGINE_EFORMAT, "%s: %s[%llu] = %lld is out of range",
                                  engine_gguf_path(g), key, (unsigned long long)i, (long long)x);
            hp->rope_sections[i] = (uint32_t)x;
        }
    }
    /* block_count counts the MTP blocks of recent converters; the main stack is the rest */
    if (hp->n_nextn >= hp->n_layer)
        return engine_err(ENGINE_EFORMAT, "%s: %s.nextn_predict_layers = %u but block_count = %u",
                          engine_gguf_path(g), an, hp->n_nextn, hp->n_layer);
    hp->n_layer -= hp->n_nextn;
    /* a model file that counts an MTP block but carries none of its tensors (a converter that
     * drops them) loads as a plain model: MTP unavailable (a metadata-only file keeps the key) */
    snprintf(key, sizeof key, "blk.%u.nextn.eh_proj.weight", hp->n_layer);
    if (hp->n_nextn && engine_gguf_tensor_count(g) > 0 && !engine_gguf_find_tensor(g, key))
        hp->n_nextn = 0;
    return 0;
}

int engine_q35_hparams_write(const engine_hparams *hp, engine_gguf_writer *w, const char *an) {
    char key[128];
    int rc = 0;
    struct {
        const char *suffix;
        uint32_t v;
    } keys[] = {
        {"expert_shared_feed_forward_length", hp->n_ff_shexp},
        {"ssm.conv_kernel", hp->ssm_d_conv},
        {"ssm.state_size", hp->ssm_d_state},
        {"ssm.group_count", hp->ssm_n_group},
        {"ssm.time_step_rank", hp->ssm_dt_rank},
        {"ssm.inner_size", hp->ssm_d_inner},
        {"full_attention_interval", hp->full_attn_interval},
        {"rope.dimension_count", hp->n_rot},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0] && rc == 0; i++) {
        snprintf(key, sizeof key, "%s.%s", an, keys[i].suffix);
        rc = engine_gguf_writer_set_u32(w, key, keys[i].v);
    }
    if (rc) return rc;
    int32_t sec[4];
    for (int i = 0; i < 4; i++)
        sec[i] = (int32_t)hp->rope_sections[i];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", an);
    if ((rc = engine_gguf_writer_set_arr(w, key, ENGINE_GGUF_INT32, sec, 4))) return rc;
    /* block_count (written by the caller) counts the MTP blocks too, as recent converters
     * write it */
    if (hp->n_nextn) {
        snprintf(key, sizeof key, "%s.nextn_predict_layers", an);
        rc = engine_gguf_writer_set_u32(w, key, hp->n_nextn);
    }
    return rc;
}

static size_t q35_layer_tensors(const engine_hparams *hp, uint32_t l) {
    return 2 + (engine_q35_layer_is_attn(hp, l) ? 6 : 9) + 8;
}

/* The tensors of block l (a full-attention block when attn) at d[*i], in converter order. */
static void q35_block_tensors(const engine_hparams *hp, engine_tensor_desc *d, size_t *i, int l,
                              bool attn) {
    const int64_t E = hp->n_embd, hd = hp->head_dim_k;
    const int64_t nh = hp->n_head, nkv = hp->n_head_kv;
    const int64_t dk = hp->ssm_d_state, nk = hp->ssm_n_group, nv = hp->ssm_dt_rank;
    const int64_t di = hp->ssm_d_inner, conv = 2 * nk * dk + di;
    const int64_t X = hp->n_expert, F = hp->n_ff_exp, Fs = hp->n_ff_shexp;
    size_t k = *i;
    engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_ATTN_NORM, l, 1, E, 1, 1);
    if (attn) {
        engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_ATTN_Q, l, 2, E, 2 * nh * hd, 1);
        engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_ATTN_K, l, 2, E, nkv * hd, 1);
        engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_ATTN_V, l, 2, E, nkv * hd, 1);
        engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_ATTN_OUT, l, 2, nh * hd, E, 1);
        engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_ATTN_Q_NORM, l, 1, hd, 1, 1);
        engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_ATTN_K_NORM, l, 1, hd, 1, 1);
    } else {
        engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_ATTN_QKV, l, 2, E, conv, 1);
        engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_ATTN_GATE, l, 2, E, di, 1);
        engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_SSM_CONV1D, l, 2, hp->ssm_d_conv, conv, 1);
        engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_SSM_DT, l, 1, nv, 1, 1);
        engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_SSM_A, l, 1, nv, 1, 1);
        engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_SSM_BETA, l, 2, E, nv, 1);
        engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_SSM_ALPHA, l, 2, E, nv, 1);
        engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_SSM_NORM, l, 1, dk, 1, 1);
        engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_SSM_OUT, l, 2, di, E, 1);
    }
    engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_ATTN_POST_NORM, l, 1, E, 1, 1);
    engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_FFN_GATE_INP, l, 2, E, X, 1);
    engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_FFN_GATE_EXPS, l, 3, E, F, X);
    engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_FFN_UP_EXPS, l, 3, E, F, X);
    engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_FFN_DOWN_EXPS, l, 3, F, E, X);
    engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_FFN_GATE_INP_SHEXP, l, 1, E, 1, 1);
    engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_FFN_GATE_SHEXP, l, 2, E, Fs, 1);
    engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_FFN_UP_SHEXP, l, 2, E, Fs, 1);
    engine_tensor_desc_set(&d[k++], ENGINE_TENSOR_FFN_DOWN_SHEXP, l, 2, Fs, E, 1);
    *i = k;
}

/* The MTP blocks (n_nextn, at most 1 supported by the forward) follow the main stack as
 * blk.<n_layer + j>: a full-attention block plus the four nextn tensors; they share the
 * embedding and the output head with the main model (Qwen3.5 has no nextn.embed_tokens or
 * nextn.shared_head_head). */
#define Q35_MTP_TENSORS (2 + 6 + 8 + 4)

int engine_q35_tensors(const engine_hparams *hp, engine_tensor_desc **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    size_t n = 2 + (hp->tied_embeddings ? 0 : 1) + (size_t)hp->n_nextn * Q35_MTP_TENSORS;
    for (uint32_t l = 0; l < hp->n_layer; l++)
        n += q35_layer_tensors(hp, l);
    engine_tensor_desc *d = calloc(n, sizeof *d);
    if (!d) return engine_err(ENGINE_ENOMEM, "out of memory for %zu tensor descriptions", n);
    const int64_t E = hp->n_embd, V = hp->n_vocab;
    size_t i = 0;
    engine_tensor_desc_set(&d[i++], ENGINE_TENSOR_TOKEN_EMBD, -1, 2, E, V, 1);
    for (int l = 0; l < (int)hp->n_layer; l++)
        q35_block_tensors(hp, d, &i, l, engine_q35_layer_is_attn(hp, (uint32_t)l));
    engine_tensor_desc_set(&d[i++], ENGINE_TENSOR_OUTPUT_NORM, -1, 1, E, 1, 1);
    if (!hp->tied_embeddings) engine_tensor_desc_set(&d[i++], ENGINE_TENSOR_OUTPUT, -1, 2, E, V, 1);
    for (uint32_t j = 0; j < hp->n_nextn; j++) {
        int l = (int)(hp->n_layer + j);
        q35_block_tensors(hp, d, &i, l, true);
        engine_tensor_desc_set(&d[i++], ENGINE_TENSOR_NEXTN_EH_PROJ, l, 2, 2 * E, E, 1);
        engine_tensor_desc_set(&d[i++], ENGINE_TENSOR_NEXTN_ENORM, l, 1, E, 1, 1);
        engine_tensor_desc_set(&d[i++], ENGINE_TENSOR_NEXTN_HNORM, l, 1, E, 1, 1);
        engine_tensor_desc_set(&d[i++], ENGINE_TENSOR_NEXTN_SHARED_HEAD_NORM, l, 1, E, 1, 1);
    }
    ENGINE_ASSERT(i == n);
    *out = d;
    *n_out = n;
    return 0;
}

void engine_q35_param_count(const engine_hparams *hp, uint64_t *total, uint64_t *active) {
    const uint64_t E = hp->n_embd, V = hp->n_vocab, hd = hp->head_dim_k;
    const uint64_t nh = hp->n_head, nkv = hp->n_head_kv;
    const uint64_t dk = hp->ssm_d_state, nk = hp->ssm_n_group, nv = hp->ssm_dt_rank;
    const uint64_t di = hp->ssm_d_inner, conv = 2 * nk * dk + di;
    const uint64_t attn = E * 2 * nh * hd + 2 * E * nkv * hd + nh * hd * E + 2 * hd;
    const uint64_t lin =
        E * conv + E * di + 2 * E * nv + hp->ssm_d_conv * conv + 2 * nv + dk + di * E;
    const uint64_t per_expert = 3 * E * hp->n_ff_exp;
    const uint64_t ffn_common = 2 * E + E * hp->n_expert + E + 3 * E * hp->n_ff_shexp;
    uint64_t t = E * V + E + (hp->tied_embeddings ? 0 : E * V), a = t;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        uint64_t mix = engine_q35_layer_is_attn(hp, l) ? attn : lin;
        t += mix + ffn_common + per_expert * hp->n_expert;
        a += mix + ffn_common + per_expert * hp->n_expert_used;
    }
    /* the MTP blocks are in the file but not on the path of a plain token */
    t += (uint64_t)hp->n_nextn * (attn + ffn_common + per_expert * hp->n_expert + 2 * E * E + 3 * E);
    if (total) *total = t;
    if (active) *active = a;
}

/* ---------------------------------------------------------------------------------------------
 * Weights
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    bool attn;
    int32_t slot;           /* index among the attention or the DeltaNet blocks */
    const float *attn_norm; /* [E] */
    const float *post_norm; /* [E] */
    /* full attention */
    const float *q_norm, *k_norm; /* [hd] */
    engine_weight wq;             /* E -> nh * 2hd ([q | gate] per head) */
    engine_weight wk, wv;         /* E -> nkv * hd */
    engine_weight wo;             /* nh * hd -> E */
    /* Gated DeltaNet */
    engine_weight wqkv;          /* E -> conv channels */
    engine_weight wz;            /* E -> nv * dv */
    engine_weight wbeta, walpha; /* E -> nv */
    engine_weight wout;          /* nv * dv -> E */
    const float *conv;           /* [channels][d_conv] */
    const float *dt_bias, *a;    /* [nv]; a = -exp(A_log) */
    const float *ssm_norm;       /* [dv] */
    /* MoE */
    engine_weight gate_inp; /* E -> X */
    engine_weight gate_exps, up_exps, down_exps;
    int64_t gu_stride;             /* rows from one expert's gate (up) matrix to the next: F in
                                    * GGUF, 2F in HF's fused gate_up_proj */
    const uint8_t *const *exp_ptr; /* HF checkpoints with one tensor per expert: [3][X] gate,
                                    * up, down matrices; NULL when each stack is contiguous */
    engine_weight gate_shexp, up_shexp, down_shexp;
    const float *gate_inp_shexp; /* [E] */
} q35_layer;

struct engine_q35_model {
    engine_st *st;            /* HF checkpoint (weights point into it), or NULL for GGUF */
    const uint8_t **exp_ptrs; /* [n_layer][3][X] for per-expert HF checkpoints */
    bool v_tiled;             /* value heads in llama.cpp's tiled order (GGUF) */
    q35_layer *layers;
    int32_t n_attn, n_lin;
    float *rope_inv_freq; /* [n_rot / 2] */
    size_t cap_owned;     /* converted copies go on m->owned (model.c frees them) */
    /* the MTP block (blk.<n_layer> / HF mtp.*), when the file has one: a full-attention block
     * whose KV is the session's attention slot n_attn */
    bool has_mtp;
    q35_layer mtp;
    engine_weight mtp_eh;      /* 2E -> E over [enorm(embedding) | hnorm(hidden)] */
    const float *mtp_enorm;    /* [E] */
    const float *mtp_hnorm;    /* [E] */
    const float *mtp_norm;     /* [E] the block's final norm (shared_head_norm, HF mtp.norm) */
};

void engine_q35_model_free(engine_q35_model *qm) {
    if (!qm) return;
    free(qm->layers);
    free(qm->rope_inv_freq);
    engine_st_close(qm->st);
    free(qm->exp_ptrs);
    free(qm);
}

/* The tensors of block L of a GGUF file into ly (ly->attn set by the caller). */
static int q35_gguf_block(engine_model *m, q35_layer *ly, int L) {
    int rc;
    if ((rc = engine_model_load_f32(m, ENGINE_TENSOR_ATTN_NORM, L, &ly->attn_norm)) ||
        (rc = engine_model_load_f32(m, ENGINE_TENSOR_ATTN_POST_NORM, L, &ly->post_norm)))
        return rc;
    if (ly->attn) {
        if ((rc = engine_model_load_attn(m, L, &ly->q_norm, &ly->k_norm, &ly->wq, &ly->wk, &ly->wv,
                                         &ly->wo)))
            return rc;
    } else {
        if ((rc = engine_model_load_matrix(m, ENGINE_TENSOR_ATTN_QKV, L, &ly->wqkv)) ||
            (rc = engine_model_load_matrix(m, ENGINE_TENSOR_ATTN_GATE, L, &ly->wz)) ||
            (rc = engine_model_load_matrix(m, ENGINE_TENSOR_SSM_BETA, L, &ly->wbeta)) ||
            (rc = engine_model_load_matrix(m, ENGINE_TENSOR_SSM_ALPHA, L, &ly->walpha)) ||
            (rc = engine_model_load_matrix(m, ENGINE_TENSOR_SSM_OUT, L, &ly->wout)) ||
            (rc = engine_model_load_f32(m, ENGINE_TENSOR_SSM_CONV1D, L, &ly->conv)) ||
            (rc = engine_model_load_f32(m, ENGINE_TENSOR_SSM_DT, L, &ly->dt_bias)) ||
            (rc = engine_model_load_f32(m, ENGINE_TENSOR_SSM_A, L, &ly->a)) ||
            (rc = engine_model_load_f32(m, ENGINE_TENSOR_SSM_NORM, L, &ly->ssm_norm)))
            return rc;
    }
    if ((rc = engine_model_load_experts(m, L, &ly->gate_inp, &ly->gate_exps, &ly->up_exps,
                                        &ly->down_exps)) ||
        (rc = engine_model_load_matrix(m, ENGINE_TENSOR_FFN_GATE_SHEXP, L, &ly->gate_shexp)) ||
        (rc = engine_model_load_matrix(m, ENGINE_TENSOR_FFN_UP_SHEXP, L, &ly->up_shexp)) ||
        (rc = engine_model_load_matrix(m, ENGINE_TENSOR_FFN_DOWN_SHEXP, L, &ly->down_shexp)) ||
        (rc = engine_model_load_f32(m, ENGINE_TENSOR_FFN_GATE_INP_SHEXP, L, &ly->gate_inp_shexp)))
        return rc;
    ly->gu_stride = ly->gate_exps.rows;
    return 0;
}

int engine_q35_load(engine_model *m) {
    const engine_hparams *hp = &m->hp;
    engine_q35_model *qm = calloc(1, sizeof *qm);
    if (!qm) return engine_err(ENGINE_ENOMEM, "out of memory loading %s", m->path);
    m->q35 = qm;
    qm->v_tiled = true;
    qm->cap_owned = ENGINE_Q35_OWNED_PER_LAYER * (size_t)hp->n_layer + 2;
    qm->layers = calloc(hp->n_layer, sizeof *qm->layers);
    qm->rope_inv_freq = malloc(sizeof(float) * (hp->n_rot / 2));
    if (!m->owned || !qm->layers || !qm->rope_inv_freq)
        return engine_err(ENGINE_ENOMEM, "out of memory loading %s", m->path);
    engine_cpu_rope_inv_freq(qm->rope_inv_freq, (int)hp->n_rot, hp->rope_theta);
    int rc;
    if ((rc = engine_model_load_head(m))) return rc;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        q35_layer *ly = &qm->layers[l];
        ly->attn = engine_q35_layer_is_attn(hp, l);
        ly->slot = ly->attn ? qm->n_attn++ : qm->n_lin++;
        if ((rc = q35_gguf_block(m, ly, (int)l))) return rc;
    }
    if (hp->n_nextn) {
        int L = (int)hp->n_layer;
        qm->mtp.attn = true;
        qm->mtp.slot = qm->n_attn;
        if ((rc = q35_gguf_block(m, &qm->mtp, L)) ||
            (rc = engine_model_load_matrix(m, ENGINE_TENSOR_NEXTN_EH_PROJ, L, &qm->mtp_eh)) ||
            (rc = engine_model_load_f32(m, ENGINE_TENSOR_NEXTN_ENORM, L, &qm->mtp_enorm)) ||
            (rc = engine_model_load_f32(m, ENGINE_TENSOR_NEXTN_HNORM, L, &qm->mtp_hnorm)) ||
            (rc = engine_model_load_f32(m, ENGINE_TENSOR_NEXTN_SHARED_HEAD_NORM, L,
                                        &qm->mtp_norm)))
            return rc;
        qm->has_mtp = true;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Session state
 * ------------------------------------------------------------------------------------------- */
struct engine_q35_fwd {
    int32_t n_ctx, B, k_used, n_threads;
    /* dims */
    int E, hd, nh, nkv, nk, nv, dk, dv, K, C, di, X, F, Fs;
    int32_t n_attn, n_lin;
    bool v_tiled; /* value head h reads key head h % nk (GGUF), else h / r */
    /* full attention KV: one contiguous block of n_ctx positions per attention block */
    void *kv_mem;
    void **k_blocks, **v_blocks;
    engine_kv_view *views; /* [n_attn] */
    /* Gated DeltaNet state */
    float *conv_state; /* [n_lin][C][K-1] */
    float *ssm_state;  /* [n_lin][nv][dk][dv] */
    size_t conv_per_layer, ssm_per_layer;
    /* state snapshots at block boundaries (positions b = k * ENGINE_Q35_SNAP_EVERY): slot
     * (b / ENGINE_Q35_SNAP_EVERY) % ENGINE_Q35_SNAPSHOTS holds the conv and recurrent state
     * after b tokens, laid out as conv_state then ssm_state */
    float *snap;                               /* [ENGINE_Q35_SNAPSHOTS][state floats] */
    int32_t snap_pos[ENGINE_Q35_SNAPSHOTS];    /* b of each slot, -1 when empty */
    engine_session *s;                         /* the owner (truncation recomputes) */
    /* activations [B][...] */
    float *x, *xn, *tmp;   /* [B][E] */
    float *big;            /* [B][max(2 nh hd, C)] q+gate or qkv */
    float *q, *gate, *att; /* [B][nh hd]; att also holds o [B][di] */
    float *k, *v;          /* [B][nkv hd] */
    float *z;              /* [B][di] */
    float *bb, *aa;        /* [B][nv] */
    float *router, *probs; /* [B][X], [X] */
    int32_t *sel;          /* [B k] */
    float *selw;           /* [B k] */
    int32_t *exp_start, *exp_slots, *active;
    float *g, *u;          /* [B k][F] */
    float *eout;           /* [B k][E] */
    float *sg, *su;        /* [B][Fs] */
    float *shgate;         /* [B] */
    uint8_t *conv, *hconv; /* converted inputs */
    size_t conv_stride, hconv_stride;
    float *scores;  /* [n_threads][group][n_ctx] */
    /* MTP (when the model has the block): its KV is attention slot n_attn. The MTP KV at
     * position p holds the pair (h_p, token p+1), h_p the main model's final normed hidden
     * state after token p; every main pass appends the pairs its tokens complete, so the MTP
     * KV covers positions 0 .. n_tokens-2 and `pend` holds h_{n_tokens-1} (pend_ok). */
    bool mtp;        /* the model has the block (buffers allocated) */
    bool mtp_on;     /* passes feed it (engine_q35_mtp_enable) */
    bool pend_ok;
    bool no_head;    /* truncation's recompute: the logits are dropped, skip the head */
    float *hid;      /* [B][E] final normed hidden of the last pass's tokens */
    float *pend;     /* [E] */
    float *mtp_in;   /* [B + 1][2E] [enorm(embedding) | hnorm(hidden)] rows */
    float *mtp_h;    /* [E] the last MTP output (normed), the hidden of the next chained step */
    float *snap_hid; /* [ENGINE_Q35_SNAPSHOTS][E] h of the token before each snapshot */
    /* the speculative checkpoint: the recurrent state (and pend) at position ckpt_pos, taken
     * before a verify pass so that rejecting drafts recomputes only the accepted tokens */
    float *ckpt;     /* [state floats + E] */
    int32_t ckpt_pos; /* -1: none */
    /* chunked delta rule: rows since the base, per DeltaNet block and value head */
    float *dpend;       /* [n_lin][nv][ENGINE_CPU_DELTA_PEND_FLOATS(SNAP_EVERY, dk, dv)] */
    float *dscratch;    /* [n_threads][SNAP_EVERY (2 dk + 3 dv + 2)] */
    int32_t n_pend;     /* rows pending (positions since the base) */
    int32_t ckpt_npend; /* n_pend at ckpt_pos; the checkpoint holds the rows after its E */
    bool recurrent;     /* SPARK_Q35_DELTA=recurrent: token by token (benchmarks, checks) */
};

static size_t q35_fsz(size_t n) {
    return n * sizeof(float);
}

void engine_q35_fwd_free(engine_q35_fwd *f) {
    if (!f) return;
    free(f->kv_mem);
    free(f->k_blocks);
    free(f->v_blocks);
    free(f->views);
    free(f->conv_state);
    free(f->ssm_state);
    free(f->snap);
    free(f->x);
    free(f->big);
    free(f->q);
    free(f->router);
    free(f->sel);
    free(f->exp_start);
    free(f->g);
    free(f->sg);
    free(f->conv);
    free(f->hconv);
    free(f->scores);
    free(f->hid);
    free(f->mtp_in);
    free(f->snap_hid);
    free(f->ckpt);
    free(f->dpend);
    free(f->dscratch);
    free(f);
}

/* Floats of the chunked delta rule's pending rows (every DeltaNet block and value head). */
static size_t q35_dpend_floats(const engine_q35_fwd *f) {
    return ENGINE_CPU_DELTA_PEND_FLOATS(ENGINE_Q35_SNAP_EVERY, f->dk, f->dv) * (size_t)f->nv *
           (size_t)f->n_lin;
}

/* Floats of one copy of the recurrent state (conv_state then ssm_state, every DeltaNet block). */
static size_t q35_state_floats(const engine_q35_fwd *f) {
    return (f->conv_per_layer + f->ssm_per_layer) * (size_t)f->n_lin;
}

void engine_q35_fwd_reset(engine_q35_fwd *f) {
    memset(f->conv_state, 0, q35_fsz(f->conv_per_layer * (size_t)f->n_lin));
    memset(f->ssm_state, 0, q35_fsz(f->ssm_per_layer * (size_t)f->n_lin));
    for (int i = 0; i < ENGINE_Q35_SNAPSHOTS; i++)
        f->snap_pos[i] = -1;
    f->pend_ok = false;
    f->ckpt_pos = -1;
    f->n_pend = 0;
}

size_t engine_q35_snapshot_bytes(const engine_hparams *hp) {
    uint32_t n_lin = 0;
    for (uint32_t l = 0; l < hp->n_layer; l++)
        n_lin += !engine_q35_layer_is_attn(hp, l);
    size_t C = 2 * (size_t)hp->ssm_n_group * hp->ssm_d_state + hp->ssm_d_inner;
    size_t per_layer = C * (hp->ssm_d_conv - 1) +
                       (size_t)hp->ssm_dt_rank * hp->ssm_d_state * hp->ssm_d_state;
    return q35_fsz(per_layer * n_lin);
}

int engine_q35_fwd_truncate(engine_q35_fwd *f, int32_t n_tokens, int32_t n) {
    if (n == n_tokens) return 0;
    /* the latest snapshot at or before n; later ones describe tokens about to be dropped */
    int best = -1;
    for (int i = 0; i < ENGINE_Q35_SNAPSHOTS; i++) {
        if (f->snap_pos[i] > n) f->snap_pos[i] = -1;
        else if (f->snap_pos[i] > 0 && (best < 0 || f->snap_pos[i] > f->snap_pos[best])) best = i;
    }
    if (f->ckpt_pos > n) f->ckpt_pos = -1;
    bool use_ckpt = f->ckpt_pos > 0 && (best < 0 || f->ckpt_pos > f->snap_pos[best]);
    int32_t b = 0;
    size_t nc = f->conv_per_layer * (size_t)f->n_lin;
    if (use_ckpt) {
        b = f->ckpt_pos;
        memcpy(f->conv_state, f->ckpt, q35_fsz(nc));
        memcpy(f->ssm_state, f->ckpt + nc, q35_fsz(f->ssm_per_layer * (size_t)f->n_lin));
        if (f->mtp) memcpy(f->pend, f->ckpt + q35_state_floats(f), q35_fsz((size_t)f->E));
        f->pend_ok = f->mtp;
        memcpy(f->dpend, f->ckpt + q35_state_floats(f) + f->E, q35_fsz(q35_dpend_floats(f)));
        f->n_pend = f->ckpt_npend;
    } else if (best < 0) {
        int32_t keep = f->ckpt_pos;
        engine_q35_fwd_reset(f);
        f->ckpt_pos = keep;
    } else {
        b = f->snap_pos[best];
        const float *src = f->snap + (size_t)best * q35_state_floats(f);
        memcpy(f->conv_state, src, q35_fsz(nc));
        memcpy(f->ssm_state, src + nc, q35_fsz(f->ssm_per_layer * (size_t)f->n_lin));
        if (f->mtp) memcpy(f->pend, f->snap_hid + (size_t)best * f->E, q35_fsz((size_t)f->E));
        f->pend_ok = f->mtp;
        f->n_pend = 0; /* a grid point */
    }
    if (b == n) return 0;
    /* recompute tokens b .. n-1 from the restored state: the same bits as the first time (the
     * forward pass does not depend on the chunking); their KV entries are rewritten as they
     * were, and the snapshots between b and n are taken again */
    engine_session *s = f->s;
    pthread_mutex_lock(&s->m->pool_mu);
    int32_t saved = s->n_tokens;
    int rc = 0;
    for (s->n_tokens = b; s->n_tokens < n && rc == 0;) {
        int32_t k = ENGINE_MIN(f->B, n - s->n_tokens);
        f->no_head = true;
        rc = engine_q35_fwd_run(s, s->tokens + s->n_tokens, k, NULL);
        f->no_head = false;
        s->n_tokens += k;
    }
    s->n_tokens = saved;
    pthread_mutex_unlock(&s->m->pool_mu);
    return rc;
}

int engine_q35_state_copy(const engine_session *s, int32_t pos, void *dst) {
    const engine_q35_fwd *f = s->q35;
    size_t nc = f->conv_per_layer * (size_t)f->n_lin, ns = f->ssm_per_layer * (size_t)f->n_lin;
    /* the live state is S only with no delta-rule rows pending (always so on the grid) */
    if (pos == s->n_tokens && f->n_pend == 0) {
        memcpy(dst, f->conv_state, q35_fsz(nc));
        memcpy((float *)dst + nc, f->ssm_state, q35_fsz(ns));
        return 0;
    }
    int slot = (pos / ENGINE_Q35_SNAP_EVERY) % ENGINE_Q35_SNAPSHOTS;
    if (pos <= 0 || pos % ENGINE_Q35_SNAP_EVERY || f->snap_pos[slot] != pos)
        return engine_err(ENGINE_ERANGE, "no recurrent-state snapshot at position %d", pos);
    memcpy(dst, f->snap + (size_t)slot * q35_state_floats(f), q35_fsz(nc + ns));
    return 0;
}

int engine_q35_state_restore(engine_session *s, const void *src, int32_t pos) {
    engine_q35_fwd *f = s->q35;
    if (f->mtp_on)
        return engine_err(ENGINE_EUNSUPPORTED, "the prefix cache does not hold the MTP block's "
                          "KV");
    size_t nc = f->conv_per_layer * (size_t)f->n_lin, ns = f->ssm_per_layer * (size_t)f->n_lin;
    engine_q35_fwd_reset(f);
    memcpy(f->conv_state, src, q35_fsz(nc));
    memcpy(f->ssm_state, (const float *)src + nc, q35_fsz(ns));
    if (pos > 0 && pos % ENGINE_Q35_SNAP_EVERY == 0) { /* a rollback target too */
        int slot = (pos / ENGINE_Q35_SNAP_EVERY) % ENGINE_Q35_SNAPSHOTS;
        memcpy(f->snap + (size_t)slot * q35_state_floats(f), src, q35_fsz(nc + ns));
        f->snap_pos[slot] = pos;
    }
    return 0;
}

static size_t q35_align(size_t n) {
    return (n + 63) & ~(size_t)63;
}

int engine_q35_fwd_new(engine_session *s) {
    const engine_model *m = s->m;
    const engine_hparams *hp = &m->hp;
    const engine_q35_model *qm = m->q35;
    if (hp->head_dim_k > ENGINE_CPU_MAX_HEAD_DIM)
        return engine_err(ENGINE_EUNSUPPORTED, "%s: head size %u is above the supported %d",
                          m->path, hp->head_dim_k, ENGINE_CPU_MAX_HEAD_DIM);
    engine_q35_fwd *f = calloc(1, sizeof *f);
    if (!f) return engine_err(ENGINE_ENOMEM, "out of memory for a session");
    int32_t B = s->n_batch, n_ctx = s->n_ctx;
    f->n_ctx = n_ctx;
    f->B = B;
    f->k_used = (int32_t)hp->n_expert_used;
    f->n_threads = engine_pool_size(m->pool);
    f->E = (int)hp->n_embd;
    f->hd = (int)hp->head_dim_k;
    f->nh = (int)hp->n_head;
    f->nkv = (int)hp->n_head_kv;
    f->nk = (int)hp->ssm_n_group;
    f->nv = (int)hp->ssm_dt_rank;
    f->dk = f->dv = (int)hp->ssm_d_state;
    f->K = (int)hp->ssm_d_conv;
    f->di = (int)hp->ssm_d_inner;
    f->C = 2 * f->nk * f->dk + f->di;
    f->X = (int)hp->n_expert;
    f->F = (int)hp->n_ff_exp;
    f->Fs = (int)hp->n_ff_shexp;
    f->n_attn = qm->n_attn + (qm->has_mtp ? 1 : 0); /* the MTP block's KV is the last slot */
    f->n_lin = qm->n_lin;
    f->v_tiled = qm->v_tiled;
    f->mtp = qm->has_mtp;
    f->ckpt_pos = -1;
    const char *dm = getenv("SPARK_Q35_DELTA");
    f->recurrent = dm && !strcmp(dm, "recurrent");
    size_t Bz = (size_t)B, kslots = Bz * (size_t)f->k_used;
    size_t qd = (size_t)f->nh * f->hd, kvd = (size_t)f->nkv * f->hd;
    size_t kv_layer = (size_t)n_ctx * engine_cpu_kv_row_bytes(s->kv_type, f->nkv, f->hd);
    size_t bigw = ENGINE_MAX(2 * qd, (size_t)f->C), attw = ENGINE_MAX(qd, (size_t)f->di);
    size_t widest =
        ENGINE_MAX(ENGINE_MAX((size_t)f->E, qd), ENGINE_MAX((size_t)f->di, (size_t)f->Fs));
    if (f->mtp) widest = ENGINE_MAX(widest, 2 * (size_t)f->E); /* the MTP fc input */
    f->conv_stride = q35_align(q35_fsz(ENGINE_MAX(widest, (size_t)f->F)));
    f->hconv_stride = q35_align(q35_fsz((size_t)ENGINE_MAX(f->F, f->Fs)));
    f->conv_per_layer = (size_t)f->C * (size_t)(f->K - 1);
    f->ssm_per_layer = (size_t)f->nv * f->dk * f->dv;
    int group = f->nh / f->nkv;

    /* on the model's paged pool (engine/kv) the attention blocks' KV is the session's block
     * table; only the MTP slot stays here */
    int32_t n_paged = s->kv_paged ? qm->n_attn : 0;
    f->kv_mem = malloc(ENGINE_MAX((size_t)1, 2 * (size_t)(f->n_attn - n_paged) * kv_layer));
    f->k_blocks = calloc((size_t)ENGINE_MAX(1, f->n_attn), sizeof(void *));
    f->v_blocks = calloc((size_t)ENGINE_MAX(1, f->n_attn), sizeof(void *));
    f->views = calloc((size_t)ENGINE_MAX(1, f->n_attn), sizeof *f->views);
    f->snap = malloc(ENGINE_MAX((size_t)1, q35_fsz(q35_state_floats(f)) * ENGINE_Q35_SNAPSHOTS));
    f->conv_state =
        calloc(ENGINE_MAX((size_t)1, f->conv_per_layer * (size_t)f->n_lin), sizeof(float));
    f->ssm_state =
        calloc(ENGINE_MAX((size_t)1, f->ssm_per_layer * (size_t)f->n_lin), sizeof(float));
    f->x = malloc(q35_fsz(Bz * 3 * (size_t)f->E));
    f->big = malloc(q35_fsz(Bz * bigw));
    f->q = malloc(q35_fsz(Bz * (2 * qd + attw + 2 * kvd + (size_t)f->di + 2 * (size_t)f->nv + 1)));
    f->router = malloc(q35_fsz(Bz * (size_t)f->X + (size_t)f->X + kslots));
    f->sel = malloc(sizeof(int32_t) * kslots);
    f->exp_start = malloc(sizeof(int32_t) * ((size_t)f->X + 1 + kslots + (size_t)f->X));
    f->g = malloc(q35_fsz(kslots * (2 * (size_t)f->F + (size_t)f->E)));
    f->sg = malloc(q35_fsz(Bz * 2 * (size_t)f->Fs));
    f->conv = aligned_alloc(64, 2 * Bz * f->conv_stride);
    f->hconv = aligned_alloc(64, kslots * f->hconv_stride);
    f->scores = malloc(q35_fsz((size_t)f->n_threads * (size_t)group * (size_t)n_ctx));
    f->hid = malloc(q35_fsz((Bz + 2) * (size_t)f->E));
    f->mtp_in = malloc(q35_fsz((Bz + 1) * 2 * (size_t)f->E));
    f->snap_hid = malloc(q35_fsz(ENGINE_Q35_SNAPSHOTS * (size_t)f->E));
    f->ckpt = malloc(q35_fsz(q35_state_floats(f) + (size_t)f->E + q35_dpend_floats(f)));
    f->dpend = malloc(ENGINE_MAX((size_t)1, q35_fsz(q35_dpend_floats(f))));
    f->dscratch = malloc(q35_fsz((size_t)f->n_threads * ENGINE_Q35_SNAP_EVERY *
                                 (2 * (size_t)f->dk + 3 * (size_t)f->dv + 2)));
    if (!f->dpend || !f->dscratch) {
        engine_q35_fwd_free(f);
        return engine_err(ENGINE_ENOMEM, "out of memory for a qwen35moe session's delta rule");
    }
    if (!f->hid || !f->mtp_in || !f->snap_hid || !f->ckpt || !f->kv_mem || !f->k_blocks || !f->v_blocks || !f->views || !f->conv_state || !f->snap ||
        !f->ssm_state || !f->x || !f->big || !f->q || !f->router || !f->sel || !f->exp_start ||
        !f->g || !f->sg || !f->conv || !f->hconv || !f->scores) {
        engine_q35_fwd_free(f);
        return engine_err(ENGINE_ENOMEM,
                          "out of memory for a qwen35moe session of %d "
                          "positions",
                          n_ctx);
    }
    f->xn = f->x + Bz * (size_t)f->E;
    f->tmp = f->xn + Bz * (size_t)f->E;
    f->gate = f->q + Bz * qd;
    f->att = f->gate + Bz * qd;
    f->k = f->att + Bz * attw;
    f->v = f->k + Bz * kvd;
    f->z = f->v + Bz * kvd;
    f->bb = f->z + Bz * (size_t)f->di;
    f->aa = f->bb + Bz * (size_t)f->nv;
    f->shgate = f->aa + Bz * (size_t)f->nv;
    f->probs = f->router + Bz * (size_t)f->X;
    f->selw = f->probs + f->X;
    f->exp_slots = f->exp_start + f->X + 1;
    f->active = f->exp_slots + kslots;
    f->u = f->g + kslots * (size_t)f->F;
    f->eout = f->u + kslots * (size_t)f->F;
    f->su = f->sg + Bz * (size_t)f->Fs;
    f->pend = f->hid + Bz * (size_t)f->E;
    f->mtp_h = f->pend + f->E;
    for (int32_t l = 0; l < f->n_attn; l++) {
        if (l < n_paged) {
            f->views[l] = engine_kv_seq_view(m->kvc, &s->kvs, l);
            continue;
        }
        f->k_blocks[l] = (uint8_t *)f->kv_mem + (2 * (size_t)(l - n_paged)) * kv_layer;
        f->v_blocks[l] = (uint8_t *)f->kv_mem + (2 * (size_t)(l - n_paged) + 1) * kv_layer;
        f->views[l] =
            (engine_kv_view){&f->k_blocks[l], &f->v_blocks[l], n_ctx, s->kv_type, f->nkv, f->hd};
    }
    for (int i = 0; i < ENGINE_Q35_SNAPSHOTS; i++)
        f->snap_pos[i] = -1;
    f->s = s;
    s->q35 = f;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Jobs for the thread pool
 * ------------------------------------------------------------------------------------------- */
typedef enum {
    Q_MATMUL,    /* up to 4 weights sharing one converted input */
    Q_CONVERT,   /* rows of F32 -> a vec_dot type */
    Q_NORM,      /* (x += add) then xn = rmsnorm(x) * w */
    Q_ATTN_PREP, /* split q/gate, q/k norms, partial RoPE, store k/v */
    Q_ATTENTION, /* (token, kv head) pairs */
    Q_ATTN_GATE, /* att *= sigmoid(gate) */
    Q_CONV,      /* causal depthwise conv + SiLU per channel, over the chunk's tokens */
    Q_DELTA,     /* gated delta rule + gated RMSNorm per value head, over the tokens */
    Q_SWIGLU,    /* h = silu(g) * u, converted for the down projection */
    Q_COMBINE,   /* x += sum_j w_j expert_j + sigmoid(gate . xn) * shared */
} q35_op;

typedef struct {
    q35_op op;
    const engine_model *m;
    engine_q35_fwd *f;
    const q35_layer *ly;
    int32_t n, p0, t0;
    /* Q_MATMUL */
    int n_w;
    const engine_weight *w[4];
    float *y[4];
    size_t y_stride[4];
    const uint8_t *x;
    size_t x_stride;
    /* Q_CONVERT / Q_SWIGLU */
    engine_type type;
    const float *src;
    float *g, *u;
    size_t src_stride;
    int cols;
    uint8_t *dst;
    size_t dst_stride;
    /* Q_NORM */
    const float *add, *norm_w;
    /* Q_ATTN_PREP / Q_ATTENTION */
    const engine_kv_view *kv;
    /* Q_CONV / Q_DELTA */
    float *conv_state, *ssm_state;
} q35_job;

static void q_matmul(q35_job *j, int ith, int nth) {
    engine_ffn_matmul_part(j->n_w, j->w, j->y, j->y_stride, j->x, j->x_stride, j->n, ith, nth);
}

static void q_convert(q35_job *j, int ith, int nth) {
    engine_ffn_convert_part(j->type, j->src, j->src_stride, j->cols, j->dst, j->dst_stride, j->n,
                            ith, nth);
}

static void q_norm(q35_job *j, int ith, int nth) {
    engine_q35_fwd *f = j->f;
    size_t e = (size_t)f->E;
    int64_t a, b;
    engine_split(j->n - j->t0, ith, nth, &a, &b);
    for (int64_t t = j->t0 + a; t < j->t0 + b; t++) {
        float *x = f->x + (size_t)t * e;
        if (j->add) {
            const float *d = j->add + (size_t)t * e;
            for (size_t i = 0; i < e; i++)
                x[i] += d[i];
        }
        engine_cpu_rmsnorm(f->xn + (size_t)t * e, x, j->norm_w, (int)e, j->m->hp.rms_norm_eps);
    }
}

static void q_attn_prep(q35_job *j, int ith, int nth) {
    engine_q35_fwd *f = j->f;
    const engine_hparams *hp = &j->m->hp;
    const float *inv_freq = j->m->q35->rope_inv_freq;
    int hd = f->hd, nh = f->nh, nkv = f->nkv, rot = (int)hp->n_rot;
    float eps = hp->rms_norm_eps;
    int64_t a, b;
    engine_split(j->n, ith, nth, &a, &b);
    for (int64_t t = a; t < b; t++) {
        const float *qg = f->big + (size_t)t * 2 * nh * hd;
        float *q = f->q + (size_t)t * nh * hd, *gt = f->gate + (size_t)t * nh * hd;
        float *k = f->k + (size_t)t * nkv * hd;
        int32_t pos = j->p0 + (int32_t)t;
        for (int h = 0; h < nh; h++) {
            memcpy(gt + h * hd, qg + (size_t)h * 2 * hd + hd, q35_fsz((size_t)hd));
            engine_cpu_rmsnorm(q + h * hd, qg + (size_t)h * 2 * hd, j->ly->q_norm, hd, eps);
            engine_cpu_rope_neox(q + h * hd, 1, rot, pos, inv_freq);
        }
        for (int h = 0; h < nkv; h++) {
            engine_cpu_rmsnorm(k + h * hd, k + h * hd, j->ly->k_norm, hd, eps);
            engine_cpu_rope_neox(k + h * hd, 1, rot, pos, inv_freq);
        }
        engine_cpu_kv_store(j->kv, pos, k, f->v + (size_t)t * nkv * hd);
    }
}

static void q_attention(q35_job *j, int ith, int nth) {
    engine_q35_fwd *f = j->f;
    int hd = f->hd, nh = f->nh, nkv = f->nkv, group = nh / nkv;
    float scale = 1.0f / sqrtf((float)hd);
    float *scores = f->scores + (size_t)ith * group * f->n_ctx;
    int64_t a, b;
    engine_split((int64_t)j->n * nkv, ith, nth, &a, &b);
    for (int64_t i = a; i < b; i++) {
        int64_t t = i / nkv;
        int g = (int)(i % nkv);
        size_t off = ((size_t)t * nh + (size_t)g * group) * hd;
        engine_cpu_attention_group(f->att + off, f->q + off, group, j->kv, g,
                                   j->p0 + (int32_t)t + 1, scale, scores);
    }
}

static void q_attn_gate(q35_job *j, int ith, int nth) {
    engine_q35_fwd *f = j->f;
    size_t w = (size_t)f->nh * f->hd;
    int64_t a, b;
    engine_split(j->n, ith, nth, &a, &b);
    for (int64_t t = a; t < b; t++) {
        float *o = f->att + (size_t)t * w;
        const float *g = f->gate + (size_t)t * w;
        for (size_t i = 0; i < w; i++)
            o[i] *= 1.0f / (1.0f + expf(-g[i]));
    }
}

/* Tokens t < n of a pass starting at position p0 after which the state is snapshotted: the
 * first is *t (none when >= n), the next ENGINE_Q35_SNAP_EVERY later. */
static int32_t q35_first_snap(int32_t p0) {
    return ENGINE_Q35_SNAP_EVERY - 1 - p0 % ENGINE_Q35_SNAP_EVERY;
}

/* Where the snapshot after token t (position p0 + t + 1, a block boundary) goes: the slot's
 * conv state (ssm false) or recurrent state of DeltaNet block li. */
static float *q35_snap_at(const engine_q35_fwd *f, int32_t pos, int32_t li, bool ssm) {
    size_t slot = (size_t)(pos / ENGINE_Q35_SNAP_EVERY) % ENGINE_Q35_SNAPSHOTS;
    float *base = f->snap + slot * q35_state_floats(f);
    if (!ssm) return base + (size_t)li * f->conv_per_layer;
    return base + f->conv_per_layer * (size_t)f->n_lin + (size_t)li * f->ssm_per_layer;
}

static void q_conv(q35_job *j, int ith, int nth) {
    engine_q35_fwd *f = j->f;
    int K = f->K, C = f->C;
    int64_t c0, c1;
    engine_split(C, ith, nth, &c0, &c1);
    for (int64_t c = c0; c < c1; c++) {
        const float *w = j->ly->conv + (size_t)c * K;
        float *st = j->conv_state + (size_t)c * (K - 1);
        /* in segments that end at the snapshot points (same bits: the state carries over) */
        for (int32_t t = 0, ts = q35_first_snap(j->p0); t < j->n; ts += ENGINE_Q35_SNAP_EVERY) {
            int32_t e = ENGINE_MIN(ts + 1, j->n);
            engine_cpu_conv1d_causal(f->big + (size_t)t * C + c, (size_t)C, e - t, w, K, st, true);
            if (ts < j->n)
                memcpy(q35_snap_at(f, j->p0 + ts + 1, j->ly->slot, false) + (size_t)c * (K - 1),
                       st, q35_fsz((size_t)K - 1));
            t = e;
        }
    }
}

static float q35_softplus(float x) {
    return x > 20.0f ? x : log1pf(expf(x)); /* torch's softplus, threshold 20 */
}

/* The recurrent form, token by token, for value heads h0 .. h1 (scratch: 2 dk + 2 dv). */
static void q35_delta_recurrent(q35_job *j, int64_t h0, int64_t h1, float *scratch) {
    engine_q35_fwd *f = j->f;
    const q35_layer *ly = j->ly;
    int nk = f->nk, nv = f->nv, dk = f->dk, dv = f->dv, C = f->C, di = f->di;
    int r = nv / nk;
    float qscale = 1.0f / sqrtf((float)dk), eps = j->m->hp.rms_norm_eps;
    float *qn = scratch, *kn = qn + dk, *o = kn + dk, *tmp = o + dv;
    for (int64_t h = h0; h < h1; h++) {
        int kh = f->v_tiled ? (int)(h % nk) : (int)(h / r);
        float *S = j->ssm_state + (size_t)h * dk * dv;
        float A = ly->a[h], dt = ly->dt_bias[h];
        for (int32_t t = 0; t < j->n; t++) {
            const float *row = f->big + (size_t)t * C;
            const float *v = row + 2 * (size_t)nk * dk + (size_t)h * dv;
            engine_cpu_l2norm(qn, row + (size_t)kh * dk, dk, 1e-6f, qscale);
            engine_cpu_l2norm(kn, row + (size_t)nk * dk + (size_t)kh * dk, dk, 1e-6f, 1.0f);
            float beta = 1.0f / (1.0f + expf(-f->bb[(size_t)t * nv + h]));
            float g = expf(A * q35_softplus(f->aa[(size_t)t * nv + h] + dt));
            engine_cpu_delta_rule(S, dk, dv, qn, kn, v, g, beta, o, tmp);
            engine_cpu_rmsnorm_gated(f->att + (size_t)t * di + (size_t)h * dv, o, ly->ssm_norm,
                                     f->z + (size_t)t * di + (size_t)h * dv, dv, eps);
            if ((j->p0 + t + 1) % ENGINE_Q35_SNAP_EVERY == 0)
                memcpy(q35_snap_at(f, j->p0 + t + 1, ly->slot, true) + (size_t)h * dk * dv, S,
                       q35_fsz((size_t)dk * dv));
        }
    }
}

/* The delta rule of the block's value heads over the pass's tokens, in chunks that end on the
 * snapshot grid (engine_cpu_delta_chunk_rows, then a fold and a snapshot at each grid point). */
static void q_delta(q35_job *j, int ith, int nth) {
    engine_q35_fwd *f = j->f;
    const q35_layer *ly = j->ly;
    enum { CAP = ENGINE_Q35_SNAP_EVERY };
    int nk = f->nk, nv = f->nv, dk = f->dk, dv = f->dv, C = f->C, di = f->di;
    int r = nv / nk;
    float qscale = 1.0f / sqrtf((float)dk), eps = j->m->hp.rms_norm_eps;
    float *qs = f->dscratch + (size_t)ith * CAP * (2 * (size_t)dk + 3 * (size_t)dv + 2);
    float *ks = qs + (size_t)CAP * dk, *os = ks + (size_t)CAP * dk, *rs = os + (size_t)CAP * dv;
    float *lg = rs + 2 * (size_t)CAP * dv, *bt = lg + CAP;
    size_t pf = ENGINE_CPU_DELTA_PEND_FLOATS(CAP, dk, dv);
    int64_t h0, h1;
    engine_split(nv, ith, nth, &h0, &h1);
    if (f->recurrent) {
        q35_delta_recurrent(j, h0, h1, qs);
        return;
    }
    for (int64_t h = h0; h < h1; h++) {
        int kh = f->v_tiled ? (int)(h % nk) : (int)(h / r);
        float *S = j->ssm_state + (size_t)h * dk * dv;
        float *P = f->dpend + ((size_t)ly->slot * nv + (size_t)h) * pf;
        float A = ly->a[h], dt = ly->dt_bias[h];
        int m = f->n_pend;
        for (int32_t t = 0; t < j->n;) {
            int32_t pos = j->p0 + t;
            int np = (int)ENGINE_MIN(j->n - t, CAP - pos % CAP);
            ENGINE_ASSERT(m + np <= CAP);
            for (int u = 0; u < np; u++) {
                const float *row = f->big + (size_t)(t + u) * C;
                engine_cpu_l2norm(qs + (size_t)u * dk, row + (size_t)kh * dk, dk, 1e-6f, qscale);
                engine_cpu_l2norm(ks + (size_t)u * dk, row + (size_t)nk * dk + (size_t)kh * dk, dk,
                                  1e-6f, 1.0f);
                bt[u] = 1.0f / (1.0f + expf(-f->bb[(size_t)(t + u) * nv + h]));
                lg[u] = A * q35_softplus(f->aa[(size_t)(t + u) * nv + h] + dt);
            }
            const float *v = f->big + (size_t)t * C + 2 * (size_t)nk * dk + (size_t)h * dv;
            engine_cpu_delta_chunk_rows(S, P, CAP, m, np, dk, dv, qs, ks, v, (size_t)C, lg, bt,
                                        os, rs);
            for (int u = 0; u < np; u++)
                engine_cpu_rmsnorm_gated(f->att + (size_t)(t + u) * di + (size_t)h * dv,
                                         os + (size_t)u * dv, ly->ssm_norm,
                                         f->z + (size_t)(t + u) * di + (size_t)h * dv, dv, eps);
            m += np;
            t += np;
            if ((j->p0 + t) % CAP == 0) {
                engine_cpu_delta_chunk_fold(S, P, CAP, m, dk, dv);
                m = 0;
                memcpy(q35_snap_at(f, j->p0 + t, ly->slot, true) + (size_t)h * dk * dv, S,
                       q35_fsz((size_t)dk * dv));
            }
        }
    }
}

/* g = silu(g) * u for n rows of `cols` (src_stride apart), converted to `type` into dst unless
 * the down weight dots F32 rows. */
static void q_swiglu(q35_job *j, int ith, int nth) {
    engine_ffn_swiglu_part(j->g, j->u, j->src_stride, j->cols, j->type, j->dst, j->dst_stride,
                           j->n, ith, nth);
}

static void q_combine(q35_job *j, int ith, int nth) {
    engine_q35_fwd *f = j->f;
    size_t e = (size_t)f->E;
    int k = f->k_used;
    const float *wg = j->ly->gate_inp_shexp;
    int64_t a, b;
    engine_split(j->n, ith, nth, &a, &b);
    for (int64_t t = a; t < b; t++) {
        float *x = f->x + (size_t)t * e;
        const float *xn = f->xn + (size_t)t * e, *sh = f->tmp + (size_t)t * e;
        double dot = 0.0;
        for (size_t i = 0; i < e; i++)
            dot += (double)wg[i] * xn[i];
        float sgate = 1.0f / (1.0f + expf(-(float)dot));
        for (size_t i = 0; i < e; i++)
            x[i] += sgate * sh[i];
        for (int jj = 0; jj < k; jj++) {
            size_t slot = (size_t)t * k + jj;
            float w = f->selw[slot];
            const float *o = f->eout + slot * e;
            for (size_t i = 0; i < e; i++)
                x[i] += w * o[i];
        }
    }
}

static void q35_job_fn(void *ctx, int ith, int nth) {
    q35_job *j = ctx;
    switch (j->op) {
    case Q_MATMUL:
        q_matmul(j, ith, nth);
        break;
    case Q_CONVERT:
        q_convert(j, ith, nth);
        break;
    case Q_NORM:
        q_norm(j, ith, nth);
        break;
    case Q_ATTN_PREP:
        q_attn_prep(j, ith, nth);
        break;
    case Q_ATTENTION:
        q_attention(j, ith, nth);
        break;
    case Q_ATTN_GATE:
        q_attn_gate(j, ith, nth);
        break;
    case Q_CONV:
        q_conv(j, ith, nth);
        break;
    case Q_DELTA:
        q_delta(j, ith, nth);
        break;
    case Q_SWIGLU:
        q_swiglu(j, ith, nth);
        break;
    case Q_COMBINE:
        q_combine(j, ith, nth);
        break;
    }
}

/* Per-token ops over one or two tokens cost less than waking the pool; results do not depend
 * on the split (each value is computed by one thread the same way), so this changes no bits. */
static void q35_run(const engine_model *m, q35_job *j, q35_op op) {
    j->op = op;
    bool inline_ok = (op == Q_NORM || op == Q_ATTN_PREP || op == Q_ATTN_GATE || op == Q_CONVERT ||
                      op == Q_COMBINE) &&
                     j->n <= 2;
    if (inline_ok)
        q35_job_fn(j, 0, 1);
    else
        engine_pool_run(m->pool, q35_job_fn, j);
}

static engine_type q35_vdt(const engine_weight *w) {
    return engine_type_traits_get(w->type)->vec_dot_type;
}

/* Rows t0 .. t0+n of src (src_stride floats apart) in w's vec_dot type: F32 in place, others
 * converted into dst (conv_stride bytes apart). */
static void q35_input(const engine_model *m, engine_q35_fwd *f, const engine_weight *w,
                      const float *src, size_t src_stride, int cols, int32_t t0, int32_t n,
                      uint8_t *dst, const uint8_t **x, size_t *x_stride) {
    engine_type vt = q35_vdt(w);
    if (vt == ENGINE_TYPE_F32) {
        *x = (const uint8_t *)(src + (size_t)t0 * src_stride);
        *x_stride = src_stride * sizeof(float);
        return;
    }
    q35_job cj;
    memset(&cj, 0, sizeof cj);
    cj.m = m;
    cj.f = f;
    cj.n = n;
    cj.type = vt;
    cj.src = src + (size_t)t0 * src_stride;
    cj.src_stride = src_stride;
    cj.cols = cols;
    cj.dst = dst;
    cj.dst_stride = f->conv_stride;
    q35_run(m, &cj, Q_CONVERT);
    *x = dst;
    *x_stride = f->conv_stride;
}

/* y_i = W_i x for up to four weights reading the same input (rows t0 .. t0+n of src). */
static void q35_matmul(const engine_model *m, engine_q35_fwd *f, int n_w,
                       const engine_weight *const *w, float *const *y, const size_t *ys,
                       const float *src, size_t src_stride, int32_t t0, int32_t n) {
    int done[4] = {0, 0, 0, 0};
    for (int i = 0; i < n_w; i++) {
        if (done[i]) continue;
        q35_job mj;
        memset(&mj, 0, sizeof mj);
        mj.m = m;
        mj.f = f;
        mj.n = n;
        q35_input(m, f, w[i], src, src_stride, (int)w[i]->cols, t0, n, f->conv, &mj.x,
                  &mj.x_stride);
        for (int k = i; k < n_w; k++) {
            if (done[k] || q35_vdt(w[k]) != q35_vdt(w[i])) continue;
            done[k] = 1;
            mj.w[mj.n_w] = w[k];
            mj.y[mj.n_w] = y[k];
            mj.y_stride[mj.n_w] = ys[k];
            mj.n_w++;
        }
        q35_run(m, &mj, Q_MATMUL);
    }
}

static void q35_attention_block(const engine_model *m, engine_q35_fwd *f, const q35_layer *ly,
                                int32_t n, int32_t p0) {
    size_t E = (size_t)f->E, qd = (size_t)f->nh * f->hd, kvd = (size_t)f->nkv * f->hd;
    const engine_weight *w[3] = {&ly->wq, &ly->wk, &ly->wv};
    float *y[3] = {f->big, f->k, f->v};
    size_t ys[3] = {2 * qd, kvd, kvd};
    q35_matmul(m, f, 3, w, y, ys, f->xn, E, 0, n);
    q35_job j;
    memset(&j, 0, sizeof j);
    j.m = m;
    j.f = f;
    j.ly = ly;
    j.n = n;
    j.p0 = p0;
    j.kv = &f->views[ly->slot];
    q35_run(m, &j, Q_ATTN_PREP);
    q35_run(m, &j, Q_ATTENTION);
    q35_run(m, &j, Q_ATTN_GATE);
    const engine_weight *wo = &ly->wo;
    q35_matmul(m, f, 1, &wo, &f->tmp, &E, f->att, qd, 0, n);
}

static void q35_deltanet_block(const engine_model *m, engine_q35_fwd *f, const q35_layer *ly,
                               int32_t n, int32_t p0) {
    size_t E = (size_t)f->E, di = (size_t)f->di, nv = (size_t)f->nv;
    const engine_weight *w[4] = {&ly->wqkv, &ly->wz, &ly->wbeta, &ly->walpha};
    float *y[4] = {f->big, f->z, f->bb, f->aa};
    size_t ys[4] = {(size_t)f->C, di, nv, nv};
    q35_matmul(m, f, 4, w, y, ys, f->xn, E, 0, n);
    q35_job j;
    memset(&j, 0, sizeof j);
    j.m = m;
    j.f = f;
    j.ly = ly;
    j.n = n;
    j.p0 = p0;
    j.conv_state = f->conv_state + (size_t)ly->slot * f->conv_per_layer;
    j.ssm_state = f->ssm_state + (size_t)ly->slot * f->ssm_per_layer;
    q35_run(m, &j, Q_CONV);
    q35_run(m, &j, Q_DELTA);
    const engine_weight *wo = &ly->wout;
    q35_matmul(m, f, 1, &wo, &f->tmp, &E, f->att, di, 0, n);
}

static void q35_moe(const engine_model *m, engine_q35_fwd *f, const q35_layer *ly, int32_t n) {
    int ne = f->X, k = f->k_used;
    size_t E = (size_t)f->E;
    const engine_weight *rw = &ly->gate_inp;
    size_t rs = (size_t)ne;
    q35_matmul(m, f, 1, &rw, &f->router, &rs, f->xn, E, 0, n);
    for (int32_t t = 0; t < n; t++)
        engine_cpu_moe_route(f->router + (size_t)t * ne, ne, k, 1, f->sel + (size_t)t * k,
                             f->selw + (size_t)t * k, f->probs);
    int n_active = engine_moe_group(f->sel, n * k, ne, f->exp_start, f->exp_slots, f->active);

    /* the shared expert's gate and up, then the routed experts' gate and up */
    const engine_weight *sw[2] = {&ly->gate_shexp, &ly->up_shexp};
    float *sy[2] = {f->sg, f->su};
    size_t sys[2] = {(size_t)f->Fs, (size_t)f->Fs};
    q35_matmul(m, f, 2, sw, sy, sys, f->xn, E, 0, n);
    engine_moe_job ej = {
        .w = {&ly->gate_exps, &ly->up_exps, &ly->down_exps, ly->gu_stride, ly->exp_ptr},
        .exp_start = f->exp_start,
        .exp_slots = f->exp_slots,
        .active = f->active,
        .n_active = n_active,
        .k = k,
        .g = f->g,
        .u = f->u,
        .out = f->eout,
    };
    q35_input(m, f, &ly->gate_exps, f->xn, E, (int)E, 0, n, f->conv, &ej.xg, &ej.xg_stride);
    if (q35_vdt(&ly->up_exps) == q35_vdt(&ly->gate_exps)) {
        ej.xu = ej.xg;
        ej.xu_stride = ej.xg_stride;
    } else {
        q35_input(m, f, &ly->up_exps, f->xn, E, (int)E, 0, n,
                  f->conv + (size_t)f->B * f->conv_stride, &ej.xu, &ej.xu_stride);
    }
    int64_t nff = ly->gate_exps.rows;
    engine_moe_job_items(&ej, false);
    engine_pool_run(m->pool, engine_moe_up_fn, &ej);

    q35_job sj;
    memset(&sj, 0, sizeof sj);
    sj.m = m;
    sj.f = f;
    sj.ly = ly;
    sj.n = n * k;
    sj.g = f->g;
    sj.u = f->u;
    sj.cols = (int)nff;
    sj.src_stride = (size_t)nff;
    sj.type = q35_vdt(&ly->down_exps);
    sj.dst = f->hconv;
    sj.dst_stride = f->hconv_stride;
    q35_run(m, &sj, Q_SWIGLU);

    if (sj.type == ENGINE_TYPE_F32) {
        ej.x = (const uint8_t *)f->g;
        ej.x_stride = (size_t)nff * sizeof(float);
    } else {
        ej.x = f->hconv;
        ej.x_stride = f->hconv_stride;
    }
    engine_moe_job_items(&ej, true);
    engine_pool_run(m->pool, engine_moe_down_fn, &ej);

    /* shared expert: h = silu(g) * u (in sg), down into tmp */
    q35_job hj = sj;
    hj.n = n;
    hj.g = f->sg;
    hj.u = f->su;
    hj.cols = f->Fs;
    hj.src_stride = (size_t)f->Fs;
    hj.type = ENGINE_TYPE_F32; /* q35_matmul converts for the down weight */
    q35_run(m, &hj, Q_SWIGLU);
    const engine_weight *wd = &ly->down_shexp;
    q35_matmul(m, f, 1, &wd, &f->tmp, &E, f->sg, (size_t)f->Fs, 0, n);

    q35_job cj = sj;
    cj.n = n;
    q35_run(m, &cj, Q_COMBINE);
}

/* The MTP block over cnt pairs at positions pos0 .. pos0+cnt-1: pair t is (hidden row t,
 * token toks[t]), the hidden rows being h_first (when non-NULL) then h_rest's rows (E floats
 * apart). Writes the block's KV at those positions, leaves the normed output of the last pair
 * in f->mtp_h and, when logits is non-NULL, its logits there. cnt <= B. */
static void q35_mtp_pass(const engine_model *m, engine_q35_fwd *f, const float *h_first,
                         const float *h_rest, const int32_t *toks, int32_t cnt, int32_t pos0,
                         float *logits) {
    const engine_q35_model *qm = m->q35;
    const q35_layer *ly = &qm->mtp;
    size_t E = (size_t)f->E, E2 = 2 * E;
    float eps = m->hp.rms_norm_eps;
    for (int32_t t = 0; t < cnt; t++) {
        const float *h = h_first ? (t == 0 ? h_first : h_rest + (size_t)(t - 1) * E)
                                 : h_rest + (size_t)t * E;
        float *in = f->mtp_in + (size_t)t * E2, *x = f->x + (size_t)t * E;
        const uint8_t *row =
            (const uint8_t *)m->tok_embd.data + (size_t)toks[t] * m->tok_embd.row_bytes;
        engine_dequantize_row(m->tok_embd.type, row, x, (int64_t)E);
        engine_cpu_rmsnorm(in, x, qm->mtp_enorm, (int)E, eps);
        engine_cpu_rmsnorm(in + E, h, qm->mtp_hnorm, (int)E, eps);
    }
    const engine_weight *eh = &qm->mtp_eh;
    q35_matmul(m, f, 1, &eh, &f->x, &E, f->mtp_in, E2, 0, cnt);
    q35_job j;
    memset(&j, 0, sizeof j);
    j.m = m;
    j.f = f;
    j.n = cnt;
    j.ly = ly;
    j.norm_w = ly->attn_norm;
    q35_run(m, &j, Q_NORM);
    q35_attention_block(m, f, ly, cnt, pos0);
    j.add = f->tmp;
    j.norm_w = ly->post_norm;
    q35_run(m, &j, Q_NORM);
    q35_moe(m, f, ly, cnt);
    j.add = NULL;
    j.norm_w = qm->mtp_norm;
    j.t0 = cnt - 1;
    q35_run(m, &j, Q_NORM);
    memcpy(f->mtp_h, f->xn + (size_t)(cnt - 1) * E, q35_fsz(E));
    if (logits) {
        const engine_weight *wout = &m->output;
        size_t vs = m->hp.n_vocab;
        q35_matmul(m, f, 1, &wout, &logits, &vs, f->xn, E, cnt - 1, 1);
    }
}

bool engine_q35_has_mtp(const engine_model *m) {
    return m->q35 && m->q35->has_mtp;
}

int engine_q35_mtp_enable(engine_session *s, bool *was_off) {
    engine_q35_fwd *f = s->q35;
    *was_off = false;
#ifdef SPARK_HAVE_CUDA
    if (s->cuda) return engine_cuda_q35_mtp_enable(s->cuda, was_off);
#endif
    if (!f || !f->mtp)
        return engine_err(ENGINE_EUNSUPPORTED,
                          "%s has no MTP block (nextn_predict_layers / mtp.* tensors): "
                          "speculative decoding with MTP is unavailable",
                          s->m->path);
    if (!f->mtp_on) {
        /* the MTP KV must cover every position: start over */
        f->mtp_on = true;
        *was_off = true;
    }
    return 0;
}

void engine_q35_checkpoint(engine_session *s) {
    engine_q35_fwd *f = s->q35;
    if (!f) return; /* CUDA: every pass keeps the state after each of its tokens */
    size_t nc = f->conv_per_layer * (size_t)f->n_lin;
    memcpy(f->ckpt, f->conv_state, q35_fsz(nc));
    memcpy(f->ckpt + nc, f->ssm_state, q35_fsz(f->ssm_per_layer * (size_t)f->n_lin));
    if (f->mtp) memcpy(f->ckpt + q35_state_floats(f), f->pend, q35_fsz((size_t)f->E));
    memcpy(f->ckpt + q35_state_floats(f) + f->E, f->dpend, q35_fsz(q35_dpend_floats(f)));
    f->ckpt_npend = f->n_pend;
    f->ckpt_pos = s->n_tokens;
}

const float *engine_q35_mtp_hidden(const engine_session *s) {
    return s->q35 && s->q35->mtp ? s->q35->mtp_h : NULL;
}

int engine_q35_mtp_step(engine_session *s, int32_t i, int32_t token, float *logits) {
    engine_q35_fwd *f = s->q35;
#ifdef SPARK_HAVE_CUDA
    if (s->cuda) {
        pthread_mutex_lock(&s->m->pool_mu);
        int rc = engine_cuda_q35_mtp_step(s->cuda, i, token, s->n_tokens, logits);
        pthread_mutex_unlock(&s->m->pool_mu);
        return rc;
    }
#endif
    if (!f || !f->mtp_on || !f->pend_ok || s->n_tokens < 1)
        return engine_err(ENGINE_EINVAL, "MTP step: the session has no MTP state (enable it, "
                          "then append at least one token)");
    int32_t pos = s->n_tokens - 1 + i;
    if (i < 0 || pos >= f->n_ctx || token < 0 || token >= (int32_t)s->m->hp.n_vocab)
        return engine_err(ENGINE_EINVAL, "MTP step %d at position %d (context %d), token %d", i,
                          pos, f->n_ctx, token);
    pthread_mutex_lock(&s->m->pool_mu);
    /* step 0 pairs the main model's last hidden state with the token sampled after it; later
     * steps chain on the block's own output */
    q35_mtp_pass(s->m, f, NULL, i == 0 ? f->pend : f->mtp_h, &token, 1, pos, logits);
    pthread_mutex_unlock(&s->m->pool_mu);
    return 0;
}

int engine_q35_fwd_run(engine_session *s, const int32_t *tokens, int32_t n, float *logits_all) {
    const engine_model *m = s->m;
    const engine_hparams *hp = &m->hp;
    const engine_q35_model *qm = m->q35;
    engine_q35_fwd *f = s->q35;
    ENGINE_ASSERT(n >= 1 && n <= f->B && s->n_tokens + n <= f->n_ctx);
    size_t E = (size_t)f->E;
    int32_t p0 = s->n_tokens;
    for (int32_t t = 0; t < n; t++) {
        const uint8_t *row =
            (const uint8_t *)m->tok_embd.data + (size_t)tokens[t] * m->tok_embd.row_bytes;
        engine_dequantize_row(m->tok_embd.type, row, f->x + (size_t)t * E, (int64_t)E);
    }
    /* the snapshots this pass takes (every block overwrites them) */
    for (int32_t ts = q35_first_snap(p0); ts < n; ts += ENGINE_Q35_SNAP_EVERY)
        f->snap_pos[((p0 + ts + 1) / ENGINE_Q35_SNAP_EVERY) % ENGINE_Q35_SNAPSHOTS] = p0 + ts + 1;
    q35_job j;
    memset(&j, 0, sizeof j);
    j.m = m;
    j.f = f;
    j.n = n;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const q35_layer *ly = &qm->layers[l];
        j.ly = ly;
        j.add = NULL;
        j.norm_w = ly->attn_norm;
        j.t0 = 0;
        q35_run(m, &j, Q_NORM);
        if (ly->attn)
            q35_attention_block(m, f, ly, n, p0);
        else
            q35_deltanet_block(m, f, ly, n, p0);
        j.add = f->tmp;
        j.norm_w = ly->post_norm;
        q35_run(m, &j, Q_NORM);
        q35_moe(m, f, ly, n);
    }
    /* the delta rule's rows now pending: those since the last grid point the pass reached */
    if (f->recurrent)
        f->n_pend = 0;
    else if ((p0 + n) / ENGINE_Q35_SNAP_EVERY > p0 / ENGINE_Q35_SNAP_EVERY)
        f->n_pend = (p0 + n) % ENGINE_Q35_SNAP_EVERY;
    else
        f->n_pend += n;
    /* output head: every token's logits when asked, else only the last token's (the final
     * norm of every token when the MTP block needs their hidden states) */
    int32_t t0 = logits_all ? 0 : n - 1;
    j.add = NULL;
    j.norm_w = m->output_norm;
    j.t0 = f->mtp_on ? 0 : t0;
    q35_run(m, &j, Q_NORM);
    if (f->mtp_on) memcpy(f->hid, f->xn, q35_fsz((size_t)n * E));
    const engine_weight *wout = &m->output;
    size_t vs = hp->n_vocab;
    float *dst = logits_all ? logits_all : s->logits;
    if (!f->no_head || logits_all) {
        q35_matmul(m, f, 1, &wout, &dst, &vs, f->xn, E, t0, n - t0);
        if (logits_all) memcpy(s->logits, logits_all + (size_t)(n - 1) * vs, q35_fsz(vs));
    }
    if (!f->mtp_on) return 0;
    /* the MTP pairs these tokens complete: (h_{p0-1}, tokens[0]) .. (h_{p0+n-2}, tokens[n-1]) */
    for (int32_t ts = q35_first_snap(p0); ts < n; ts += ENGINE_Q35_SNAP_EVERY) {
        size_t slot = (size_t)((p0 + ts + 1) / ENGINE_Q35_SNAP_EVERY) % ENGINE_Q35_SNAPSHOTS;
        memcpy(f->snap_hid + slot * E, f->hid + (size_t)ts * E, q35_fsz(E));
    }
    if (p0 > 0 && !f->pend_ok)
        return engine_err(ENGINE_EINTERNAL, "qwen35moe: MTP hidden state of position %d lost",
                          p0 - 1);
    bool first = p0 > 0;
    int32_t cnt = first ? n : n - 1;
    if (cnt > 0)
        q35_mtp_pass(m, f, first ? f->pend : NULL, f->hid, tokens + (first ? 0 : 1), cnt,
                     first ? p0 - 1 : p0, NULL);
    memcpy(f->pend, f->hid + (size_t)(n - 1) * E, q35_fsz(E));
    f->pend_ok = true;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Hugging Face checkpoints: config.json + tokenizer files + safetensors (text model only)
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    const engine_json *doc;
    const engine_json_node *obj;
    const char *path;
} q35_cfg;

static int q35_cfg_u32(const q35_cfg *c, const char *key, uint32_t *out, bool required) {
    const engine_json_node *n = engine_json_get(c->doc, c->obj, key);
    if (!n || n->type == ENGINE_JSON_NULL) {
        return required ? engine_err(ENGINE_EFORMAT, "%s: missing \"%s\"", c->path, key) : 0;
    }
    if (n->type != ENGINE_JSON_NUMBER || !n->is_int || n->ival < 0 || n->ival > (1 << 30))
        return engine_err(ENGINE_EFORMAT, "%s: \"%s\" is not a count", c->path, key);
    *out = (uint32_t)n->ival;
    return 0;
}

static int q35_cfg_f32(const q35_cfg *c, const engine_json_node *obj, const char *key, float *out) {
    const engine_json_node *n = obj ? engine_json_get(c->doc, obj, key) : NULL;
    if (!n || n->type == ENGINE_JSON_NULL) return 0;
    if (n->type != ENGINE_JSON_NUMBER)
        return engine_err(ENGINE_EFORMAT, "%s: \"%s\" is not a number", c->path, key);
    *out = (float)n->dval;
    return 0;
}

static bool q35_cfg_is(const q35_cfg *c, const engine_json_node *obj, const char *key,
                       const char *want) {
    const engine_json_node *n = engine_json_get(c->doc, obj, key);
    return n && n->type == ENGINE_JSON_STRING && !strcmp(engine_json_str(c->doc, n), want);
}

/* config.json (Qwen3_5MoeForCausalLM's text config, or the multimodal one's text_config) into
 * hyper-parameters; *bos is its bos_token_id or -1. */
int engine_q35_hf_config(engine_hparams *hp, int32_t *bos, const char *dir) {
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", dir) >= sizeof path)
        return engine_err(ENGINE_EINVAL, "%s: path too long", dir);
    size_t len = 0;
    char *text = engine_st_read_text(path, &len);
    if (!text)
        return engine_err(ENGINE_EIO,
                          "%s: cannot read (a Hugging Face checkpoint "
                          "directory needs config.json)",
                          path);
    engine_json doc;
    memset(&doc, 0, sizeof doc);
    int rc = engine_json_parse(&doc, text, len, path);
    free(text);
    if (rc) return rc;
    q35_cfg c = {&doc, &doc.nodes[0], path};
    const engine_json_node *tc = engine_json_get(&doc, c.obj, "text_config");
    if (tc && tc->type == ENGINE_JSON_OBJECT) c.obj = tc;
    memset(hp, 0, sizeof *hp);
    *bos = -1;
    if (c.obj->type != ENGINE_JSON_OBJECT ||
        !q35_cfg_is(&c, c.obj, "model_type", "qwen3_5_moe_text")) {
        bool root = q35_cfg_is(&c, &doc.nodes[0], "model_type", "qwen3_5_moe");
        if (!root || c.obj == &doc.nodes[0]) {
            engine_json_deinit(&doc);
            return engine_err(ENGINE_EUNSUPPORTED,
                              "%s: only Qwen3.5/3.6 MoE checkpoints "
                              "(model_type qwen3_5_moe_text or qwen3_5_moe) load from safetensors; "
                              "convert other models to GGUF",
                              path);
        }
    }
    hp->arch = ENGINE_ARCH_QWEN35MOE;
    hp->norm_topk_prob = true;
    hp->rope_theta = 10000.0f;
    hp->rms_norm_eps = 1e-6f;
    hp->ssm_d_conv = 4;
    hp->n_ctx_train = 32768;
    uint32_t dv = 0, lv = 0;
    if ((rc = q35_cfg_u32(&c, "vocab_size", &hp->n_vocab, true)) ||
        (rc = q35_cfg_u32(&c, "hidden_size", &hp->n_embd, true)) ||
        (rc = q35_cfg_u32(&c, "num_hidden_layers", &hp->n_layer, true)) ||
        (rc = q35_cfg_u32(&c, "num_attention_heads", &hp->n_head, true)) ||
        (rc = q35_cfg_u32(&c, "num_key_value_heads", &hp->n_head_kv, true)) ||
        (rc = q35_cfg_u32(&c, "max_position_embeddings", &hp->n_ctx_train, false)) ||
        (rc = q35_cfg_u32(&c, "linear_conv_kernel_dim", &hp->ssm_d_conv, false)) ||
        (rc = q35_cfg_u32(&c, "linear_key_head_dim", &hp->ssm_d_state, true)) ||
        (rc = q35_cfg_u32(&c, "linear_value_head_dim", &dv, true)) ||
        (rc = q35_cfg_u32(&c, "linear_num_key_heads", &hp->ssm_n_group, true)) ||
        (rc = q35_cfg_u32(&c, "linear_num_value_heads", &lv, true)) ||
        (rc = q35_cfg_u32(&c, "moe_intermediate_size", &hp->n_ff_exp, true)) ||
        (rc = q35_cfg_u32(&c, "shared_expert_intermediate_size", &hp->n_ff_shexp, true)) ||
        (rc = q35_cfg_u32(&c, "num_experts", &hp->n_expert, true)) ||
        (rc = q35_cfg_u32(&c, "num_experts_per_tok", &hp->n_expert_used, true)))
        goto done;
    hp->head_dim_k = hp->n_head ? hp->n_embd / hp->n_head : 0;
    if ((rc = q35_cfg_u32(&c, "head_dim", &hp->head_dim_k, false))) goto done;
    hp->head_dim_v = hp->head_dim_k;
    if (dv != hp->ssm_d_state) {
        rc = engine_err(ENGINE_EUNSUPPORTED,
                        "%s: linear_value_head_dim %u != linear_key_head_dim "
                        "%u is not supported",
                        path, dv, hp->ssm_d_state);
        goto done;
    }
    hp->ssm_dt_rank = lv;
    hp->ssm_d_inner = lv * dv;
    const engine_json_node *n = engine_json_get(&doc, c.obj, "tie_word_embeddings");
    hp->tied_embeddings = n && n->type == ENGINE_JSON_TRUE;
    float prf = 0.25f;
    const engine_json_node *rp = engine_json_get(&doc, c.obj, "rope_parameters");
    if (rp && rp->type != ENGINE_JSON_OBJECT) rp = NULL;
    if ((rc = q35_cfg_f32(&c, c.obj, "rms_norm_eps", &hp->rms_norm_eps)) ||
        (rc = q35_cfg_f32(&c, c.obj, "rope_theta", &hp->rope_theta)) ||
        (rc = q35_cfg_f32(&c, c.obj, "partial_rotary_factor", &prf)) ||
        (rc = q35_cfg_f32(&c, rp, "rope_theta", &hp->rope_theta)) ||
        (rc = q35_cfg_f32(&c, rp, "partial_rotary_factor", &prf)))
        goto done;
    if (!(prf > 0.0f && prf <= 1.0f)) {
        rc = engine_err(ENGINE_EFORMAT, "%s: partial_rotary_factor %g is not in (0, 1]", path,
                        (double)prf);
        goto done;
    }
    hp->n_rot = (uint32_t)((float)hp->head_dim_k * prf);
    const engine_json_node *ms = rp ? engine_json_get(&doc, rp, "mrope_section") : NULL;
    int ns = 0;
    for (const engine_json_node *x =
             ms && ms->type == ENGINE_JSON_ARRAY ? engine_json_first(&doc, ms) : NULL;
         x && ns < 4; x = engine_json_next(&doc, x))
        if (x->type == ENGINE_JSON_NUMBER && x->is_int && x->ival >= 0 && x->ival < 4096)
            hp->rope_sections[ns++] = (uint32_t)x->ival;
    /* the block pattern: every full_attention_interval-th block is full attention */
    hp->full_attn_interval = 4;
    if ((rc = q35_cfg_u32(&c, "full_attention_interval", &hp->full_attn_interval, false)))
        goto done;
    const engine_json_node *lt = engine_json_get(&doc, c.obj, "layer_types");
    if (lt && lt->type == ENGINE_JSON_ARRAY) {
        uint32_t l = 0, first = 0;
        for (const engine_json_node *x = engine_json_first(&doc, lt); x;
             x = engine_json_next(&doc, x), l++)
            if (!first && x->type == ENGINE_JSON_STRING &&
                !strcmp(engine_json_str(&doc, x), "full_attention"))
                first = l + 1;
        if (first) hp->full_attn_interval = first;
        l = 0;
        for (const engine_json_node *x = engine_json_first(&doc, lt); x;
             x = engine_json_next(&doc, x), l++) {
            bool want = engine_q35_layer_is_attn(hp, l);
            bool full = x->type == ENGINE_JSON_STRING &&
                        !strcmp(engine_json_str(&doc, x), "full_attention");
            bool lin = x->type == ENGINE_JSON_STRING &&
                       !strcmp(engine_json_str(&doc, x), "linear_attention");
            if (!(want ? full : lin) || l >= hp->n_layer) {
                rc = engine_err(ENGINE_EUNSUPPORTED,
                                "%s: layer_types[%u] breaks the pattern of "
                                "one full-attention block every %u (the only one supported)",
                                path, l, hp->full_attn_interval);
                goto done;
            }
        }
        if (l != hp->n_layer) {
            rc = engine_err(ENGINE_EFORMAT, "%s: layer_types has %u entries for %u layers", path, l,
                            hp->n_layer);
            goto done;
        }
    }
    n = engine_json_get(&doc, c.obj, "bos_token_id");
    if (!n) n = engine_json_get(&doc, &doc.nodes[0], "bos_token_id");
    if (n && n->type == ENGINE_JSON_NUMBER && n->is_int && n->ival >= 0 &&
        n->ival < (int64_t)hp->n_vocab)
        *bos = (int32_t)n->ival;
    if ((rc = engine_hparams_check(hp))) rc = engine_err(rc, "%s: %s", path, engine_error_last());
done:
    engine_json_deinit(&doc);
    return rc;
}

/* Tensor `name` with the expected torch shape (trailing zeros in `want` end the list). */
static int q35_st_get(const engine_model *m, const char *name, const int64_t *want, int nd,
                      const engine_st_tensor **out) {
    const engine_st_tensor *t = engine_st_find(m->q35->st, name);
    if (!t) return engine_err(ENGINE_EFORMAT, "%s: missing tensor %s", m->path, name);
    bool same = t->n_dims == nd;
    for (int i = 0; same && i < nd; i++)
        same = t->shape[i] == want[i];
    if (!same)
        return engine_err(
            ENGINE_EFORMAT,
            "%s: tensor %s has shape [%lld, %lld, %lld] (%d dims), "
            "expected [%lld, %lld, %lld]",
            m->path, name, (long long)t->shape[0], (long long)(t->n_dims > 1 ? t->shape[1] : 0),
            (long long)(t->n_dims > 2 ? t->shape[2] : 0), t->n_dims, (long long)want[0],
            (long long)(nd > 1 ? want[1] : 0), (long long)(nd > 2 ? want[2] : 0));
    if (t->type < 0)
        return engine_err(ENGINE_EUNSUPPORTED,
                          "%s: tensor %s has dtype %s (supported: F32, F16, "
                          "BF16)",
                          m->path, name, t->dtype);
    *out = t;
    return 0;
}

/* A matrix [rows, cols] (n_mat 0), or experts [n_mat, rows, cols], read in place. */
static int q35_st_matrix(const engine_model *m, const char *name, int64_t n_mat, int64_t rows,
                         int64_t cols, engine_weight *w) {
    const engine_st_tensor *t;
    int64_t want[3] = {n_mat, rows, cols};
    int rc = n_mat > 0 ? q35_st_get(m, name, want, 3, &t) : q35_st_get(m, name, want + 1, 2, &t);
    if (rc) return rc;
    w->data = t->data;
    w->type = (engine_type)t->type;
    w->cols = cols;
    w->rows = rows;
    w->n_mat = n_mat > 0 ? n_mat : 1;
    w->row_bytes = engine_type_row_size(w->type, cols);
    return 0;
}

typedef enum { Q35_AS_IS, Q35_PLUS_ONE, Q35_NEG_EXP } q35_xform;

/* A small tensor as F32 (n values), transformed as the converter would: in place when it is
 * F32 already and needs no change, else an owned copy. */
static int q35_st_f32(engine_model *m, const char *name, const int64_t *want, int nd, q35_xform x,
                      const float **out) {
    engine_q35_model *qm = m->q35;
    const engine_st_tensor *t;
    int rc = q35_st_get(m, name, want, nd, &t);
    if (rc) return rc;
    if (t->type == ENGINE_TYPE_F32 && x == Q35_AS_IS && (uintptr_t)t->data % sizeof(float) == 0) {
        *out = t->data;
        return 0;
    }
    ENGINE_ASSERT(m->n_owned < qm->cap_owned);
    float *buf = malloc(sizeof(float) * (size_t)t->n_elements);
    if (!buf) return engine_err(ENGINE_ENOMEM, "out of memory converting %s", name);
    if ((rc = engine_dequantize_row((engine_type)t->type, t->data, buf, t->n_elements))) {
        free(buf);
        return engine_err(rc, "%s: tensor %s: %s", m->path, name, engine_error_last());
    }
    for (int64_t i = 0; i < t->n_elements; i++)
        buf[i] = x == Q35_PLUS_ONE ? buf[i] + 1.0f : x == Q35_NEG_EXP ? -expf(buf[i]) : buf[i];
    m->owned[m->n_owned++] = buf;
    *out = buf;
    return 0;
}

/* The routed experts of layer l: transformers 5.x's fused mlp.experts.gate_up_proj [X, 2F, E]
 * (gate rows 0..F-1, up rows F..2F-1 of each expert) and down_proj [X, E, F], read through an
 * expert stride; or one tensor per expert (mlp.experts.N.{gate,up,down}_proj.weight, the
 * per-expert layout other writers use), read through a pointer table. */
static int q35_hf_experts(engine_model *m, const char *lp, q35_layer *ly, uint32_t l) {
    const engine_hparams *hp = &m->hp;
    engine_q35_model *qm = m->q35;
    const int64_t E = hp->n_embd, X = hp->n_expert, F = hp->n_ff_exp;
    char nm[256];
    int rc;
    snprintf(nm, sizeof nm, "%smlp.experts.gate_up_proj", lp);
    if (engine_st_find(qm->st, nm)) {
        if ((rc = q35_st_matrix(m, nm, X, 2 * F, E, &ly->gate_exps))) return rc;
        snprintf(nm, sizeof nm, "%smlp.experts.down_proj", lp);
        if ((rc = q35_st_matrix(m, nm, X, E, F, &ly->down_exps))) return rc;
        ly->gate_exps.rows = F;
        ly->up_exps = ly->gate_exps;
        ly->up_exps.data =
            (const uint8_t *)ly->gate_exps.data + (size_t)F * ly->gate_exps.row_bytes;
        ly->gu_stride = 2 * F;
        return 0;
    }
    if (!qm->exp_ptrs &&
        !(qm->exp_ptrs = calloc(((size_t)hp->n_layer + hp->n_nextn) * 3 * (size_t)X,
                                sizeof *qm->exp_ptrs)))
        return engine_err(ENGINE_ENOMEM, "out of memory loading %s", m->path);
    const uint8_t **tab = qm->exp_ptrs + (size_t)l * 3 * (size_t)X;
    static const char *const part[3] = {"gate_proj", "up_proj", "down_proj"};
    engine_weight *dst[3] = {&ly->gate_exps, &ly->up_exps, &ly->down_exps};
    for (int which = 0; which < 3; which++) {
        for (int64_t e = 0; e < X; e++) {
            engine_weight w;
            snprintf(nm, sizeof nm, "%smlp.experts.%lld.%s.weight", lp, (long long)e, part[which]);
            if ((rc = q35_st_matrix(m, nm, 0, which == 2 ? E : F, which == 2 ? F : E, &w)))
                return rc;
            if (e == 0)
                *dst[which] = w;
            else if (w.type != dst[which]->type)
                return engine_err(ENGINE_EFORMAT, "%s: tensor %s is %s but expert 0's is %s",
                                  m->path, nm, engine_type_name(w.type),
                                  engine_type_name(dst[which]->type));
            tab[(size_t)which * (size_t)X + (size_t)e] = w.data;
        }
        dst[which]->n_mat = X;
    }
    ly->gu_stride = F;
    ly->exp_ptr = tab;
    return 0;
}

#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)

/* Block l's tensors under the prefix lp ("model.layers.3.", "mtp.layers.0.") into ly (ly->attn
 * set by the caller); l indexes the per-expert pointer table. */
static int q35_hf_block(engine_model *m, q35_layer *ly, const char *lp, uint32_t l) {
    const engine_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, hd = hp->head_dim_k, nh = hp->n_head;
    const int64_t nkv = hp->n_head_kv, dk = hp->ssm_d_state, nk = hp->ssm_n_group;
    const int64_t nv = hp->ssm_dt_rank, di = hp->ssm_d_inner, C = 2 * nk * dk + di;
    const int64_t X = hp->n_expert, Fs = hp->n_ff_shexp;
    char nm[256];
    int rc;
    int64_t e1[1] = {E}, hd1[1] = {hd}, nv1[1] = {nv}, dk1[1] = {dk};
    int64_t conv[3] = {C, 1, hp->ssm_d_conv}, sg[2] = {1, E};
    if ((rc = q35_st_f32(m, NAME("%sinput_layernorm.weight", lp), e1, 1, Q35_PLUS_ONE,
                         &ly->attn_norm)) ||
        (rc = q35_st_f32(m, NAME("%spost_attention_layernorm.weight", lp), e1, 1, Q35_PLUS_ONE,
                         &ly->post_norm)))
        return rc;
    if (ly->attn) {
        if ((rc = q35_st_f32(m, NAME("%sself_attn.q_norm.weight", lp), hd1, 1, Q35_PLUS_ONE,
                             &ly->q_norm)) ||
            (rc = q35_st_f32(m, NAME("%sself_attn.k_norm.weight", lp), hd1, 1, Q35_PLUS_ONE,
                             &ly->k_norm)) ||
            (rc = q35_st_matrix(m, NAME("%sself_attn.q_proj.weight", lp), 0, 2 * nh * hd, E,
                                &ly->wq)) ||
            (rc = q35_st_matrix(m, NAME("%sself_attn.k_proj.weight", lp), 0, nkv * hd, E,
                                &ly->wk)) ||
            (rc = q35_st_matrix(m, NAME("%sself_attn.v_proj.weight", lp), 0, nkv * hd, E,
                                &ly->wv)) ||
            (rc = q35_st_matrix(m, NAME("%sself_attn.o_proj.weight", lp), 0, E, nh * hd,
                                &ly->wo)))
            return rc;
    } else {
        if ((rc = q35_st_matrix(m, NAME("%slinear_attn.in_proj_qkv.weight", lp), 0, C, E,
                                &ly->wqkv)) ||
            (rc = q35_st_matrix(m, NAME("%slinear_attn.in_proj_z.weight", lp), 0, di, E,
                                &ly->wz)) ||
            (rc = q35_st_matrix(m, NAME("%slinear_attn.in_proj_b.weight", lp), 0, nv, E,
                                &ly->wbeta)) ||
            (rc = q35_st_matrix(m, NAME("%slinear_attn.in_proj_a.weight", lp), 0, nv, E,
                                &ly->walpha)) ||
            (rc = q35_st_matrix(m, NAME("%slinear_attn.out_proj.weight", lp), 0, E, di,
                                &ly->wout)) ||
            (rc = q35_st_f32(m, NAME("%slinear_attn.conv1d.weight", lp), conv, 3, Q35_AS_IS,
                             &ly->conv)) ||
            (rc = q35_st_f32(m, NAME("%slinear_attn.dt_bias", lp), nv1, 1, Q35_AS_IS,
                             &ly->dt_bias)) ||
            (rc = q35_st_f32(m, NAME("%slinear_attn.A_log", lp), nv1, 1, Q35_NEG_EXP, &ly->a)) ||
            (rc = q35_st_f32(m, NAME("%slinear_attn.norm.weight", lp), dk1, 1, Q35_AS_IS,
                             &ly->ssm_norm)))
            return rc;
    }
    if ((rc = q35_st_matrix(m, NAME("%smlp.gate.weight", lp), 0, X, E, &ly->gate_inp)) ||
        (rc = q35_hf_experts(m, lp, ly, l)) ||
        (rc = q35_st_matrix(m, NAME("%smlp.shared_expert.gate_proj.weight", lp), 0, Fs, E,
                            &ly->gate_shexp)) ||
        (rc = q35_st_matrix(m, NAME("%smlp.shared_expert.up_proj.weight", lp), 0, Fs, E,
                            &ly->up_shexp)) ||
        (rc = q35_st_matrix(m, NAME("%smlp.shared_expert.down_proj.weight", lp), 0, E, Fs,
                            &ly->down_shexp)) ||
        (rc = q35_st_f32(m, NAME("%smlp.shared_expert_gate.weight", lp), sg, 2, Q35_AS_IS,
                         &ly->gate_inp_shexp)))
        return rc;
    return 0;
}

static int q35_hf_weights(engine_model *m) {
    const engine_hparams *hp = &m->hp;
    engine_q35_model *qm = m->q35;
    const int64_t E = hp->n_embd, V = hp->n_vocab;
    /* text-only checkpoints say model.layers, multimodal ones model.language_model.layers */
    const char *pre = engine_st_find(qm->st, "model.language_model.embed_tokens.weight")
                          ? "model.language_model."
                          : "model.";
    char nm[256];
    int rc;
    int64_t e1[1] = {E};
    snprintf(nm, sizeof nm, "%sembed_tokens.weight", pre);
    if ((rc = q35_st_matrix(m, nm, 0, V, E, &m->tok_embd)) ||
        (rc = q35_st_f32(m, NAME("%snorm.weight", pre), e1, 1, Q35_PLUS_ONE, &m->output_norm)))
        return rc;
    if (hp->tied_embeddings)
        m->output = m->tok_embd;
    else if ((rc = q35_st_matrix(m, "lm_head.weight", 0, V, E, &m->output)))
        return rc;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        q35_layer *ly = &qm->layers[l];
        ly->attn = engine_q35_layer_is_attn(hp, l);
        ly->slot = ly->attn ? qm->n_attn++ : qm->n_lin++;
        char lp[160];
        snprintf(lp, sizeof lp, "%slayers.%u.", pre, l);
        if ((rc = q35_hf_block(m, ly, lp, l))) return rc;
    }
    if (hp->n_nextn) {
        /* mtp.fc [E, 2E] over [pre_fc_norm_embedding(embedding) | pre_fc_norm_hidden(h)] */
        qm->mtp.attn = true;
        qm->mtp.slot = qm->n_attn;
        if ((rc = q35_hf_block(m, &qm->mtp, "mtp.layers.0.", hp->n_layer)) ||
            (rc = q35_st_matrix(m, "mtp.fc.weight", 0, E, 2 * E, &qm->mtp_eh)) ||
            (rc = q35_st_f32(m, "mtp.pre_fc_norm_embedding.weight", e1, 1, Q35_PLUS_ONE,
                             &qm->mtp_enorm)) ||
            (rc = q35_st_f32(m, "mtp.pre_fc_norm_hidden.weight", e1, 1, Q35_PLUS_ONE,
                             &qm->mtp_hnorm)) ||
            (rc = q35_st_f32(m, "mtp.norm.weight", e1, 1, Q35_PLUS_ONE, &qm->mtp_norm)))
            return rc;
        qm->has_mtp = true;
    }
    return 0;
}
#undef NAME

int engine_q35_hf_open(engine_model *m, const char *dir, bool vocab_only) {
    int32_t bos = -1;
    int rc = engine_q35_hf_config(&m->hp, &bos, dir);
    if (rc) return rc;
    const engine_hparams *hp = &m->hp;
    char tj[4096], tc[4096];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    snprintf(tc, sizeof tc, "%s/tokenizer_config.json", dir);
    engine_tokenizer_spec *spec = NULL;
    if ((rc = engine_tokenizer_spec_from_hf_files(&spec, tj, tc))) return rc;
    if (spec->n_tokens > (int32_t)hp->n_vocab)
        rc = engine_err(ENGINE_EFORMAT, "%s: the tokenizer has %d tokens, more than vocab_size %u",
                        dir, spec->n_tokens, hp->n_vocab);
    if (!rc) rc = engine_tokenizer_spec_pad(spec, (int32_t)hp->n_vocab);
    if (!rc && spec->bos_id < 0) spec->bos_id = bos;
    if (!rc) rc = engine_tokenizer_new(&m->tok, spec);
    engine_tokenizer_spec_free(spec);
    if (rc) return rc;
    const char *ct = engine_tokenizer_chat_template(m->tok);
    if (ct && !(m->chat_template = strdup(ct)))
        return engine_err(ENGINE_ENOMEM, "out of memory loading %s", dir);

    engine_model_info *in = &m->info;
    snprintf(in->arch, sizeof in->arch, "qwen35moe");
    const char *base = strrchr(dir, '/');
    snprintf(in->name, sizeof in->name, "%s", base && base[1] ? base + 1 : dir);
    in->n_vocab = engine_tokenizer_n_vocab(m->tok);
    in->vocab_only = vocab_only;
    engine_model_info_dims(in, hp);
    if (vocab_only) return 0;

    engine_q35_model *qm = calloc(1, sizeof *qm);
    if (!qm) return engine_err(ENGINE_ENOMEM, "out of memory loading %s", dir);
    m->q35 = qm;
    qm->v_tiled = false; /* HF's grouped value heads */
    if ((rc = engine_st_open(&qm->st, dir))) return rc;
    /* Qwen3.5 checkpoints carry one MTP block (config mtp_num_hidden_layers = 1); HF's own
     * model class ignores it, this loader reads it when the tensors are there */
    m->hp.n_nextn = engine_st_find(qm->st, "mtp.fc.weight") ? 1 : 0;
    in->file_size = in->weight_bytes = engine_st_bytes(qm->st);
    uint64_t by[3] = {0, 0, 0}; /* F32, F16, BF16 */
    for (int64_t i = 0; i < engine_st_count(qm->st); i++) {
        const engine_st_tensor *t = engine_st_at(qm->st, i);
        int k = t->type == ENGINE_TYPE_F32 ? 0 : t->type == ENGINE_TYPE_F16 ? 1 : 2;
        if (t->type >= 0) by[k] += t->nbytes;
    }
    int best = by[1] > by[0] ? (by[2] > by[1] ? 2 : 1) : (by[2] > by[0] ? 2 : 0);
    snprintf(in->weight_type, sizeof in->weight_type, "%s",
             engine_type_name(best == 0   ? ENGINE_TYPE_F32
                              : best == 1 ? ENGINE_TYPE_F16
                                          : ENGINE_TYPE_BF16));
    qm->cap_owned = ENGINE_Q35_OWNED_PER_LAYER * ((size_t)hp->n_layer + hp->n_nextn) + 2;
    m->owned = calloc(qm->cap_owned, sizeof(float *));
    qm->layers = calloc(hp->n_layer, sizeof *qm->layers);
    qm->rope_inv_freq = malloc(sizeof(float) * (hp->n_rot / 2));
    if (!m->owned || !qm->layers || !qm->rope_inv_freq)
        return engine_err(ENGINE_ENOMEM, "out of memory loading %s", dir);
    engine_cpu_rope_inv_freq(qm->rope_inv_freq, (int)hp->n_rot, hp->rope_theta);
    return q35_hf_weights(m);
}

void engine_q35_layer_weights(const engine_model *m, uint32_t l, engine_q35_layer_w *out) {
    const engine_q35_model *qm = m->q35;
    const q35_layer *ly = l == m->hp.n_layer && qm->has_mtp ? &qm->mtp : &qm->layers[l];
    *out = (engine_q35_layer_w){
        .attn = ly->attn, .v_tiled = qm->v_tiled, .attn_norm = ly->attn_norm,
        .post_norm = ly->post_norm, .q_norm = ly->q_norm, .k_norm = ly->k_norm, .wq = ly->wq,
        .wk = ly->wk, .wv = ly->wv, .wo = ly->wo, .wqkv = ly->wqkv, .wz = ly->wz,
        .wbeta = ly->wbeta, .walpha = ly->walpha, .wout = ly->wout, .conv = ly->conv,
        .dt_bias = ly->dt_bias, .a = ly->a, .ssm_norm = ly->ssm_norm,
        .gate_inp_shexp = ly->gate_inp_shexp, .gate_inp = ly->gate_inp,
        .gate_exps = ly->gate_exps, .up_exps = ly->up_exps, .down_exps = ly->down_exps,
        .gate_shexp = ly->gate_shexp, .up_shexp = ly->up_shexp, .down_shexp = ly->down_shexp,
        .gu_stride = ly->gu_stride, .exp_ptr = ly->exp_ptr, .rope_inv_freq = qm->rope_inv_freq};
}

bool engine_q35_mtp_weights(const engine_model *m, engine_weight *eh, const float **enorm,
                            const float **hnorm, const float **norm) {
    const engine_q35_model *qm = m->q35;
    if (!qm || !qm->has_mtp) return false;
    *eh = qm->mtp_eh;
    *enorm = qm->mtp_enorm;
    *hnorm = qm->mtp_hnorm;
    *norm = qm->mtp_norm;
    return true;
}
