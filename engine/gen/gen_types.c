/* The generator's value recipe and type mixes (contracts in gen.h). */
#include "gen/gen.h"

#include <math.h>
#include <strings.h>

#include "common.h"
#include "cpu/quant.h"

static const engine_gen_ftype ftypes[] = {
    {"f32", 0, ENGINE_TYPE_F32, false},    {"f16", 1, ENGINE_TYPE_F16, false},
    {"bf16", 32, ENGINE_TYPE_BF16, false}, {"q8_0", 7, ENGINE_TYPE_Q8_0, true},
    {"q4_0", 2, ENGINE_TYPE_Q4_0, true},   {"q4_k_m", 15, ENGINE_TYPE_Q4_K, true},
    {"q5_k_m", 17, ENGINE_TYPE_Q5_K, true}, {"q6_k", 18, ENGINE_TYPE_Q6_K, true},
};

const engine_gen_ftype *engine_gen_ftype_find(const char *name) {
    for (size_t i = 0; name && i < sizeof ftypes / sizeof ftypes[0]; i++)
        if (!strcasecmp(ftypes[i].name, name)) return &ftypes[i];
    return NULL;
}

const char *engine_gen_ftype_list(void) {
    return "f32|f16|bf16|q8_0|q4_0|q4_k_m|q5_k_m|q6_k";
}

/* llama.cpp's use_more_bits: the first and last eighth of the layers and every third one in
 * between get more bits for attn_v and ffn_down in the *_M mixes. */
static bool use_more_bits(int i, int n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* llama.cpp counts the attn_v tensors in layer order (i_attention_wv) against the number of
 * attn_v and attn_qkv tensors (n_attention_wv: one per block, the MTP blocks included); in a
 * hybrid model only every full_attn_interval-th block has an attn_v. */
static int attn_v_index(const engine_hparams *hp, int layer) {
    if (hp->full_attn_interval == 0) return layer;
    int i = 0;
    for (int l = 0; l < layer && l < (int)hp->n_layer; l++)
        i += (l + 1) % (int)hp->full_attn_interval == 0;
    return i;
}

static bool fits(engine_type t, int64_t ne0) {
    const engine_type_traits *tr = engine_type_traits_get(t);
    return tr && ne0 % tr->block_size == 0;
}

engine_type engine_gen_tensor_type(const engine_gen_ftype *ft, const engine_hparams *hp,
                                   const engine_tensor_desc *d) {
    if (d->is_norm || d->role == ENGINE_TENSOR_FFN_GATE_INP) return ENGINE_TYPE_F32;
    /* qwen35moe: the small DeltaNet parameters and the shared-expert gate stay F32 as in
     * converted files (llama.cpp keeps 1-D tensors and the conv kernel in F32) */
    if (d->role == ENGINE_TENSOR_SSM_A || d->role == ENGINE_TENSOR_SSM_DT ||
        d->role == ENGINE_TENSOR_SSM_CONV1D || d->role == ENGINE_TENSOR_FFN_GATE_INP_SHEXP)
        return ENGINE_TYPE_F32;
    engine_type t = ft->base;
    bool head = d->role == ENGINE_TENSOR_OUTPUT ||
                (d->role == ENGINE_TENSOR_TOKEN_EMBD && hp->tied_embeddings);
    bool k_mix = ft->base == ENGINE_TYPE_Q4_K || ft->base == ENGINE_TYPE_Q5_K;
    if (head && (k_mix || ft->base == ENGINE_TYPE_Q4_0)) t = ENGINE_TYPE_Q6_K;
    /* llama.cpp's llama_tensor_get_type for the K mixes: ffn_down matches every tensor whose
     * name holds "ffn_down" (a MoE layer's routed and shared experts alike: the layer taken
     * from the name, against the block count), attn_v its own counter, attn_qkv (qwen35moe's
     * DeltaNet q/k/v projection) one step up (Q4_K_M: Q5_K, Q5_K_M: Q6_K). */
    const int n_blk = (int)(hp->n_layer + hp->n_nextn);
    if (k_mix && d->layer >= 0) {
        if ((d->role == ENGINE_TENSOR_FFN_DOWN || d->role == ENGINE_TENSOR_FFN_DOWN_EXPS ||
             d->role == ENGINE_TENSOR_FFN_DOWN_SHEXP) &&
            use_more_bits(d->layer, n_blk))
            t = ENGINE_TYPE_Q6_K;
        else if (d->role == ENGINE_TENSOR_ATTN_V &&
                 use_more_bits(attn_v_index(hp, d->layer), n_blk))
            t = ENGINE_TYPE_Q6_K;
        else if (d->role == ENGINE_TENSOR_ATTN_QKV)
            t = ft->base == ENGINE_TYPE_Q4_K ? ENGINE_TYPE_Q5_K : ENGINE_TYPE_Q6_K;
    }
    if (!fits(t, d->ne[0])) t = ft->quantized ? ENGINE_TYPE_Q8_0 : t;
    if (!fits(t, d->ne[0])) t = ENGINE_TYPE_F32;
    return t;
}

void engine_gen_tensor_scale(const engine_tensor_desc *d, float *center, float *half_width) {
    if (d->is_norm) {
        *center = 1.0f;
        *half_width = 0.25f; /* a power of two: 1 + hw*s is exact up to one rounding */
        return;
    }
    if (d->role == ENGINE_TENSOR_SSM_A) { /* -exp(A_log): a decay rate, must be negative */
        *center = -1.0f;
        *half_width = 0.5f;
        return;
    }
    if (d->role == ENGINE_TENSOR_SSM_DT) { /* dt_bias */
        *center = 1.0f;
        *half_width = 0.5f;
        return;
    }
    *center = 0.0f;
    /* uniform on (-a, a) has std a/sqrt(3) */
    double std = d->role == ENGINE_TENSOR_TOKEN_EMBD ? 1.0 : 1.0 / sqrt((double)d->ne[0]);
    *half_width = (float)(std * sqrt(3.0));
}

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t engine_gen_tensor_key(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    return mix64(seed ^ mix64(h));
}

void engine_gen_fill(float *dst, int64_t n, uint64_t key, uint64_t first, float center,
                     float half_width) {
    const uint64_t golden = 0x9e3779b97f4a7c15ull;
    uint64_t state = key + first * golden;
    /* s = (2k + 1 - 2^24) / 2^24 for a 24-bit k: symmetric in (-1, 1), never 0 or +-1, and
     * exact in float; x = center + hw * s */
    for (int64_t j = 0; j < n; j++, state += golden) {
        uint32_t k = (uint32_t)(mix64(state) >> 40);
        float s = (float)((int32_t)(2 * k + 1) - (1 << 24)) * (1.0f / 16777216.0f);
        dst[j] = center + half_width * s;
    }
}
