/*
 * gen.h - the random-model generator's internals (private to engine/; the public entry points
 * are engine_model_gen() and engine_default_model_path() in engine.h).
 *
 * Determinism: element j (in ggml memory order) of the tensor named N gets
 *     u = uniform01(splitmix64(key(seed, N) + j * golden))      (24 random bits, never 0 or 1)
 *     x = center + half_width * (2u - 1)
 * so a tensor's values depend on the seed and its name only: not on the thread count, the
 * order in which threads fill it, or the other tensors. The arithmetic is exact up to one
 * rounding (half_width is a power of two whenever center != 0), so FMA contraction cannot
 * change a bit either. Scales: matrices are uniform with std 1/sqrt(fan_in) (fan_in = ne[0],
 * the row length), so every matmul keeps activations near unit scale; the embedding has std 1;
 * norm weights lie in (0.75, 1.25) so that a wrong norm index shows in the logits. An untied
 * head gives logits of std ~1; a tied one (the embedding, std 1) logits of std ~sqrt(n_embd):
 * sharply peaked but finite, and the forward tests' quantisation tolerances rely on it.
 *
 * Type mixes (general.file_type numbers are llama.cpp's llama_ftype):
 *   f32 (0), f16 (1), bf16 (32), q8_0 (7), q4_0 (2), q6_k (18): every matrix that type;
 *     q4_0 files get a Q6_K output head, as llama-quantize does.
 *   q4_k_m (15) / q5_k_m (17): Q4_K / Q5_K, except Q6_K for the output head (and a tied
 *     token_embd, which is the head), and for attn_v and ffn_down(_exps) in the layers where
 *     llama.cpp's use_more_bits(i, n) holds: i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2.
 *   Always F32: norm weights and the MoE router (ffn_gate_inp), as in converted files.
 *   A K-quant needs a row length that is a multiple of 256, Q4_0/Q8_0 one of 32: otherwise
 *   the tensor falls back to Q8_0 (or F32 when even that does not fit). llama.cpp falls back
 *   to Q5_0/Q5_1 here, types this engine does not implement; Q8_0 is the closest we have.
 */
#ifndef SPARK_ENGINE_GEN_H
#define SPARK_ENGINE_GEN_H

#include <stdbool.h>
#include <stdint.h>

#include "model/arch.h"

#define ENGINE_GEN_VERSION 1 /* bump when the bytes a seed produces change */

typedef struct {
    const char *name;       /* "q4_k_m" */
    uint32_t file_type;     /* general.file_type */
    engine_type base;       /* type of most matrices */
    bool quantized;
} engine_gen_ftype;

/* The file type named `name` (case-insensitive), or NULL. */
const engine_gen_ftype *engine_gen_ftype_find(const char *name);
/* "f32|f16|bf16|q8_0|q4_0|q4_k_m|q5_k_m|q6_k" (static). */
const char *engine_gen_ftype_list(void);

/* The GGUF type of tensor d in a file of type ft (rules above). */
engine_type engine_gen_tensor_type(const engine_gen_ftype *ft, const engine_hparams *hp,
                                   const engine_tensor_desc *d);

/* The value recipe of a tensor: center and half-width of its uniform distribution. */
void engine_gen_tensor_scale(const engine_tensor_desc *d, float *center, float *half_width);

/* The 64-bit stream key of the tensor called `name` under `seed`. */
uint64_t engine_gen_tensor_key(uint64_t seed, const char *name);

/* Fill dst[0..n) with elements [first, first + n) of the tensor with this key and scale. */
void engine_gen_fill(float *dst, int64_t n, uint64_t key, uint64_t first, float center,
                     float half_width);

/* The tokenizer bytes compiled into this build (tokenizer_embed.c): json and config point to the
 * file contents (NUL-terminated, borrowed, static) and return true; false when the build found
 * no tokenizer at configure time. */
bool engine_gen_embedded_tokenizer(const char **json, size_t *json_len, const char **config,
                                   size_t *config_len);

/* qwen35moe's Hugging Face side (gen_qwen35.c; the mapping is described there). */
struct engine_st_writer;
/* Add the HF tensors of the n GGUF tensors desc[] to sw; st_index[i] receives the HF tensor
 * that GGUF tensor i's rows go to (both expert halves share mlp.experts.gate_up_proj). */
int engine_gen_q35_st_add(const engine_hparams *hp, const engine_tensor_desc *desc, size_t n,
                          struct engine_st_writer *sw, int64_t *st_index);
/* Store row r (ne[0] values as the GGUF holds them) of tensor d into its HF tensor at base. */
void engine_gen_q35_st_row(const engine_hparams *hp, const engine_tensor_desc *d, float *base,
                           int64_t r, const float *row);
/* config.json of Qwen3_5MoeForCausalLM into buf; returns its length or a negative error. */
int engine_gen_q35_config(const engine_hparams *hp, int32_t bos, int32_t eos, const char *eps,
                          const char *theta, char *buf, size_t cap);

#endif
