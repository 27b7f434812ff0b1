/* The Hugging Face side of a generated qwen35moe model: the safetensors layout of
 * Qwen3_5MoeForCausalLM (transformers 5.x names, fused 3-D expert tensors) and its config.json.
 * The GGUF holds the model as llama.cpp's converter writes it; every transformation the
 * converter applies is undone here row by row (see arch_qwen35moe.c's table):
 *   norms (not linear_attn.norm)  GGUF 1 + w            -> HF w
 *   ssm_a                         -exp(A_log)           -> HF A_log = log(-a)
 *   value-head-indexed tensors    tiled (h % nk)        -> HF grouped (h / (nv / nk))
 *   ffn_gate_exps / ffn_up_exps   two {E, F, X} tensors -> mlp.experts.gate_up_proj [X, 2F, E]
 *   ssm_conv1d {K, C}             -> linear_attn.conv1d.weight [C, 1, K]
 *   MTP block blk.<n_layer>.*     -> mtp.layers.0.* (the same mapping as a full-attention block)
 *   nextn.eh_proj {2E, E}         -> mtp.fc.weight [E, 2E] (columns: embedding half first)
 *   nextn.enorm / hnorm / shared_head_norm (1 + w) -> mtp.pre_fc_norm_embedding /
 *                                    pre_fc_norm_hidden / mtp.norm (w) */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "gen/gen.h"
#include "model/safetensors_write.h"

/* The HF index of element j of a value-head-indexed dimension in GGUF (tiled) order, heads of
 * `hd` values: tiled head (v_sub * nk + kh) is HF's grouped head (kh * r + v_sub). */
static int64_t q35_grouped(const engine_hparams *hp, int64_t j, int64_t hd) {
    int64_t nk = hp->ssm_n_group, r = hp->ssm_dt_rank / hp->ssm_n_group;
    int64_t head = j / hd, d = j % hd;
    int64_t v_sub = head / nk, kh = head % nk;
    return (kh * r + v_sub) * hd + d;
}

static bool q35_norm_plus_one(engine_tensor_role role) {
    return role == ENGINE_TENSOR_OUTPUT_NORM || role == ENGINE_TENSOR_ATTN_NORM ||
           role == ENGINE_TENSOR_ATTN_POST_NORM || role == ENGINE_TENSOR_ATTN_Q_NORM ||
           role == ENGINE_TENSOR_ATTN_K_NORM || role == ENGINE_TENSOR_NEXTN_ENORM ||
           role == ENGINE_TENSOR_NEXTN_HNORM || role == ENGINE_TENSOR_NEXTN_SHARED_HEAD_NORM;
}

/* HF name and torch shape of GGUF tensor d; false for the up half of the experts (it shares
 * gate_up_proj with the gate half). */
static bool q35_hf_tensor(const engine_hparams *hp, const engine_tensor_desc *d, char *name,
                          size_t cap, int *n_dims, int64_t *shape) {
    static const char *const names[ENGINE_TENSOR_ROLE_COUNT] = {
        [ENGINE_TENSOR_TOKEN_EMBD] = "model.embed_tokens.weight",
        [ENGINE_TENSOR_OUTPUT_NORM] = "model.norm.weight",
        [ENGINE_TENSOR_OUTPUT] = "lm_head.weight",
        [ENGINE_TENSOR_ATTN_NORM] = "input_layernorm.weight",
        [ENGINE_TENSOR_ATTN_POST_NORM] = "post_attention_layernorm.weight",
        [ENGINE_TENSOR_ATTN_Q] = "self_attn.q_proj.weight",
        [ENGINE_TENSOR_ATTN_K] = "self_attn.k_proj.weight",
        [ENGINE_TENSOR_ATTN_V] = "self_attn.v_proj.weight",
        [ENGINE_TENSOR_ATTN_OUT] = "self_attn.o_proj.weight",
        [ENGINE_TENSOR_ATTN_Q_NORM] = "self_attn.q_norm.weight",
        [ENGINE_TENSOR_ATTN_K_NORM] = "self_attn.k_norm.weight",
        [ENGINE_TENSOR_ATTN_QKV] = "linear_attn.in_proj_qkv.weight",
        [ENGINE_TENSOR_ATTN_GATE] = "linear_attn.in_proj_z.weight",
        [ENGINE_TENSOR_SSM_CONV1D] = "linear_attn.conv1d.weight",
        [ENGINE_TENSOR_SSM_DT] = "linear_attn.dt_bias",
        [ENGINE_TENSOR_SSM_A] = "linear_attn.A_log",
        [ENGINE_TENSOR_SSM_BETA] = "linear_attn.in_proj_b.weight",
        [ENGINE_TENSOR_SSM_ALPHA] = "linear_attn.in_proj_a.weight",
        [ENGINE_TENSOR_SSM_NORM] = "linear_attn.norm.weight",
        [ENGINE_TENSOR_SSM_OUT] = "linear_attn.out_proj.weight",
        [ENGINE_TENSOR_FFN_GATE_INP] = "mlp.gate.weight",
        [ENGINE_TENSOR_FFN_GATE_EXPS] = "mlp.experts.gate_up_proj",
        [ENGINE_TENSOR_FFN_DOWN_EXPS] = "mlp.experts.down_proj",
        [ENGINE_TENSOR_FFN_GATE_INP_SHEXP] = "mlp.shared_expert_gate.weight",
        [ENGINE_TENSOR_FFN_GATE_SHEXP] = "mlp.shared_expert.gate_proj.weight",
        [ENGINE_TENSOR_FFN_UP_SHEXP] = "mlp.shared_expert.up_proj.weight",
        [ENGINE_TENSOR_FFN_DOWN_SHEXP] = "mlp.shared_expert.down_proj.weight",
        [ENGINE_TENSOR_NEXTN_EH_PROJ] = "mtp.fc.weight",
        [ENGINE_TENSOR_NEXTN_ENORM] = "mtp.pre_fc_norm_embedding.weight",
        [ENGINE_TENSOR_NEXTN_HNORM] = "mtp.pre_fc_norm_hidden.weight",
        [ENGINE_TENSOR_NEXTN_SHARED_HEAD_NORM] = "mtp.norm.weight",
    };
    if (d->role == ENGINE_TENSOR_FFN_UP_EXPS || !names[d->role]) return false;
    bool nextn = d->role == ENGINE_TENSOR_NEXTN_EH_PROJ || d->role == ENGINE_TENSOR_NEXTN_ENORM ||
                 d->role == ENGINE_TENSOR_NEXTN_HNORM ||
                 d->role == ENGINE_TENSOR_NEXTN_SHARED_HEAD_NORM;
    if (d->layer < 0 || nextn)
        snprintf(name, cap, "%s", names[d->role]);
    else if ((uint32_t)d->layer >= hp->n_layer) /* the MTP block: HF mtp.layers.<j> */
        snprintf(name, cap, "mtp.layers.%u.%s", (uint32_t)d->layer - hp->n_layer, names[d->role]);
    else
        snprintf(name, cap, "model.layers.%d.%s", d->layer, names[d->role]);
    switch (d->role) {
    case ENGINE_TENSOR_FFN_GATE_EXPS: /* [X, 2F, E] */
        *n_dims = 3;
        shape[0] = d->ne[2];
        shape[1] = 2 * d->ne[1];
        shape[2] = d->ne[0];
        return true;
    case ENGINE_TENSOR_FFN_DOWN_EXPS:
        *n_dims = 3;
        shape[0] = d->ne[2];
        shape[1] = d->ne[1];
        shape[2] = d->ne[0];
        return true;
    case ENGINE_TENSOR_SSM_CONV1D: /* [C, 1, K] */
        *n_dims = 3;
        shape[0] = d->ne[1];
        shape[1] = 1;
        shape[2] = d->ne[0];
        return true;
    case ENGINE_TENSOR_FFN_GATE_INP_SHEXP: /* nn.Linear(E, 1): [1, E] */
        *n_dims = 2;
        shape[0] = 1;
        shape[1] = d->ne[0];
        return true;
    default:
        break;
    }
    if (d->n_dims == 1) {
        *n_dims = 1;
        shape[0] = d->ne[0];
    } else {
        *n_dims = 2;
        shape[0] = d->ne[1];
        shape[1] = d->ne[0];
    }
    return true;
}

int engine_gen_q35_st_add(const engine_hparams *hp, const engine_tensor_desc *desc, size_t n,
                          engine_st_writer *sw, int64_t *st_index) {
    int64_t gate_up = -1;
    for (size_t i = 0; i < n; i++) {
        const engine_tensor_desc *d = &desc[i];
        char name[160];
        int nd = 0;
        int64_t shape[3];
        if (!q35_hf_tensor(hp, d, name, sizeof name, &nd, shape)) {
            /* the up half goes into the gate_up_proj just added for this layer */
            if (gate_up < 0) return engine_err(ENGINE_EINTERNAL, "%s before its gate", d->name);
            st_index[i] = gate_up;
            continue;
        }
        int64_t idx = engine_st_writer_add(sw, name, ENGINE_ST_F32, nd, shape);
        if (idx < 0) return (int)idx;
        st_index[i] = idx;
        if (d->role == ENGINE_TENSOR_FFN_GATE_EXPS) gate_up = idx;
    }
    return 0;
}

void engine_gen_q35_st_row(const engine_hparams *hp, const engine_tensor_desc *d, float *base,
                           int64_t r, const float *row) {
    const int64_t ne0 = d->ne[0];
    const int64_t qk = 2 * (int64_t)hp->ssm_n_group * hp->ssm_d_state;
    const int64_t dv = hp->ssm_d_state;
    switch (d->role) {
    case ENGINE_TENSOR_ATTN_QKV:
    case ENGINE_TENSOR_SSM_CONV1D: /* rows are conv channels: q, k, then tiled v */
        if (r >= qk) r = qk + q35_grouped(hp, r - qk, dv);
        memcpy(base + r * ne0, row, sizeof(float) * (size_t)ne0);
        return;
    case ENGINE_TENSOR_ATTN_GATE:
        memcpy(base + q35_grouped(hp, r, dv) * ne0, row, sizeof(float) * (size_t)ne0);
        return;
    case ENGINE_TENSOR_SSM_BETA:
    case ENGINE_TENSOR_SSM_ALPHA:
        memcpy(base + q35_grouped(hp, r, 1) * ne0, row, sizeof(float) * (size_t)ne0);
        return;
    case ENGINE_TENSOR_SSM_DT:
        for (int64_t j = 0; j < ne0; j++)
            base[q35_grouped(hp, j, 1)] = row[j];
        return;
    case ENGINE_TENSOR_SSM_A:
        for (int64_t j = 0; j < ne0; j++)
            base[q35_grouped(hp, j, 1)] = logf(-row[j]);
        return;
    case ENGINE_TENSOR_SSM_OUT: /* columns are value-head-indexed */
        for (int64_t j = 0; j < ne0; j++)
            base[r * ne0 + q35_grouped(hp, j, dv)] = row[j];
        return;
    case ENGINE_TENSOR_FFN_GATE_EXPS:
    case ENGINE_TENSOR_FFN_UP_EXPS: {
        int64_t F = d->ne[1], e = r / F, f = r % F;
        int64_t hr = e * 2 * F + (d->role == ENGINE_TENSOR_FFN_UP_EXPS ? F : 0) + f;
        memcpy(base + hr * ne0, row, sizeof(float) * (size_t)ne0);
        return;
    }
    default:
        break;
    }
    float *dst = base + r * ne0;
    if (q35_norm_plus_one(d->role)) {
        for (int64_t j = 0; j < ne0; j++)
            dst[j] = row[j] - 1.0f; /* exact for (0.5, 2) */
        return;
    }
    memcpy(dst, row, sizeof(float) * (size_t)ne0);
}

int engine_gen_q35_config(const engine_hparams *hp, int32_t bos, int32_t eos, const char *eps,
                          const char *theta, char *buf, size_t cap) {
    char types[4096];
    size_t t = 0;
    types[0] = '\0';
    for (uint32_t l = 0; l < hp->n_layer && t < sizeof types; l++)
        t += (size_t)snprintf(types + t, sizeof types - t, "%s\"%s\"", l ? ", " : "",
                              engine_q35_layer_is_attn(hp, l) ? "full_attention"
                                                              : "linear_attention");
    if (t >= sizeof types) return engine_err(ENGINE_EINTERNAL, "layer_types does not fit");
    char prf[32];
    snprintf(prf, sizeof prf, "%.9g", (double)hp->n_rot / (double)hp->head_dim_k);
    int n =
        snprintf(buf, cap,
                 "{\n"
                 "  \"architectures\": [\"Qwen3_5MoeForCausalLM\"],\n"
                 "  \"model_type\": \"qwen3_5_moe_text\",\n"
                 "  \"vocab_size\": %u,\n"
                 "  \"hidden_size\": %u,\n"
                 "  \"num_hidden_layers\": %u,\n"
                 "  \"num_attention_heads\": %u,\n"
                 "  \"num_key_value_heads\": %u,\n"
                 "  \"head_dim\": %u,\n"
                 "  \"hidden_act\": \"silu\",\n"
                 "  \"max_position_embeddings\": %u,\n"
                 "  \"rms_norm_eps\": %s,\n"
                 "  \"partial_rotary_factor\": %s,\n"
                 "  \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": %s, "
                 "\"partial_rotary_factor\": %s, \"mrope_section\": [%u, %u, %u], "
                 "\"mrope_interleaved\": true},\n"
                 "  \"attention_bias\": false,\n"
                 "  \"attention_dropout\": 0.0,\n"
                 "  \"linear_conv_kernel_dim\": %u,\n"
                 "  \"linear_key_head_dim\": %u,\n"
                 "  \"linear_value_head_dim\": %u,\n"
                 "  \"linear_num_key_heads\": %u,\n"
                 "  \"linear_num_value_heads\": %u,\n"
                 "  \"moe_intermediate_size\": %u,\n"
                 "  \"shared_expert_intermediate_size\": %u,\n"
                 "  \"num_experts\": %u,\n"
                 "  \"num_experts_per_tok\": %u,\n"
                 "  \"output_router_logits\": false,\n"
                 "  \"router_aux_loss_coef\": 0.001,\n"
                 "  \"layer_types\": [%s],\n"
                 "  \"mtp_num_hidden_layers\": %u,\n"
                 "  \"tie_word_embeddings\": %s,\n"
                 "  \"initializer_range\": 0.02,\n"
                 "  \"use_cache\": true,\n"
                 "  \"bos_token_id\": %d,\n"
                 "  \"eos_token_id\": %d,\n"
                 "  \"dtype\": \"float32\"\n"
                 "}\n",
                 hp->n_vocab, hp->n_embd, hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim_k,
                 hp->n_ctx_train, eps, prf, theta, prf, hp->rope_sections[0], hp->rope_sections[1],
                 hp->rope_sections[2], hp->ssm_d_conv, hp->ssm_d_state, hp->ssm_d_state,
                 hp->ssm_n_group, hp->ssm_dt_rank, hp->n_ff_exp, hp->n_ff_shexp, hp->n_expert,
                 hp->n_expert_used, types, hp->n_nextn, hp->tied_embeddings ? "true" : "false", bos, eos);
    if (n <= 0 || (size_t)n >= cap)
        return engine_err(ENGINE_EINTERNAL, "config.json does not fit its buffer");
    return n;
}
