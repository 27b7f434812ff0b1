/*
 * tokenizer.h - byte-level BPE tokenizer (GPT-2 / Qwen2 family), private to the engine.
 *
 * Two objects:
 *
 *   engine_tokenizer_spec  the tokenizer as a model file carries it (GGUF `tokenizer.ggml.*`):
 *                          plain arrays, filled by the GGUF loader, by the HF reader below, or
 *                          by hand. Owned by whoever created it; engine_tokenizer_spec_free().
 *   engine_tokenizer       the compiled, immutable tokenizer built from a spec (hash tables,
 *                          merge ranks, raw token bytes). It copies what it needs: the spec may
 *                          be freed right after engine_tokenizer_new(). Every function taking a
 *                          `const engine_tokenizer *` is thread-safe.
 *
 * plus a streaming detokenizer (engine_detok) that turns ids into complete UTF-8 text.
 *
 * Encoding follows Hugging Face `tokenizers` for a Qwen2/Qwen3 tokenizer.json token for token
 * (the reference is @huggingface/tokenizers running the real Qwen3 tokenizer.json):
 *   1. added tokens (type CONTROL or USER_DEFINED) are split out first, leftmost-longest;
 *      with parse_special=false the CONTROL ones are not matched (HF split_special_tokens),
 *   2. each remaining section is NFC-normalised (the tokenizer.json normalizer),
 *   3. pre-tokenised with the Qwen2 regex (hand-written matcher, no regex engine)
 *        (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *        \s*[\r\n]+|\s+(?!\S)|\s+
 *      with \s = Unicode White_Space and the (?i:...) folding ASCII letters only, as the
 *      reference does,
 *   4. byte-level BPE by merge rank (lowest rank first, leftmost on ties).
 * Invalid UTF-8 in the input is first replaced by U+FFFD, one per maximal ill-formed subpart
 * (the WHATWG / Unicode "substitution of maximal subparts" rule, i.e. what a JavaScript
 * TextDecoder or Buffer.toString('utf8') does before the reference ever sees the text).
 */
#ifndef SPARK_ENGINE_TOKENIZER_H
#define SPARK_ENGINE_TOKENIZER_H

#include "engine.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* GGUF `tokenizer.ggml.token_type` values (llama.cpp's llama_token_type). */
typedef enum {
    ENGINE_TOKEN_UNDEFINED = 0,
    ENGINE_TOKEN_NORMAL = 1,
    ENGINE_TOKEN_UNKNOWN = 2,
    ENGINE_TOKEN_CONTROL = 3,      /* special tokens: <|im_start|>, <|endoftext|>, ... */
    ENGINE_TOKEN_USER_DEFINED = 4, /* added but not special: <think>, <tool_call>, ... */
    ENGINE_TOKEN_UNUSED = 5,       /* padding entries [PAD151669] ... up to the model's vocab */
    ENGINE_TOKEN_BYTE = 6,
} engine_token_type;

/* ---------------------------------------------------------------------------------------------
 * Spec: the tokenizer as stored in a model file.
 *
 * GGUF mapping (what a converted Qwen3 GGUF carries, and what the HF reader produces):
 *   tokenizer.ggml.model          = model          "gpt2" (byte-level BPE)
 *   tokenizer.ggml.pre            = pre            "qwen2" (or "qwen35": Qwen3.5's marks)
 *   tokenizer.ggml.tokens         = tokens[]       see "token form" below
 *   tokenizer.ggml.token_type     = token_types[]  NORMAL for the BPE vocab; CONTROL for added
 *                                                  tokens marked special, or that look special
 *                                                  (<|...|>, as convert_hf_to_gguf.py decides);
 *                                                  USER_DEFINED for the other added tokens;
 *                                                  UNUSED for "[PADn]" (engine_tokenizer_spec_pad)
 *   tokenizer.ggml.merges         = merges[]       "left right", token form, one space
 *   tokenizer.ggml.bos_token_id   = bos_id         (-1: absent; see spec_from_hf)
 *   tokenizer.ggml.eos_token_id   = eos_id
 *   tokenizer.ggml.padding_token_id = pad_id
 *   tokenizer.ggml.add_bos_token  = add_bos        false for Qwen
 *   tokenizer.ggml.add_eos_token  = add_eos        false for Qwen
 *   tokenizer.chat_template       = chat_template  (NULL: absent)
 *
 * Token form: NORMAL tokens (and merges) are stored in the GPT-2 byte-to-unicode encoding, as
 * GGUF and tokenizer.json store them: every byte is one printable code point ("Ġthe" is " the",
 * "Ċ" is "\n"). Added tokens (CONTROL, USER_DEFINED) and UNUSED ones are stored as their literal
 * UTF-8 text ("<|im_start|>"). All strings are NUL-terminated UTF-8 without embedded NULs.
 * ------------------------------------------------------------------------------------------- */
typedef struct engine_tokenizer_spec {
    char *model;              /* "gpt2" */
    char *pre;                /* "qwen2" or "qwen35" */
    int32_t n_tokens;
    char **tokens;            /* [n_tokens] */
    int32_t *token_types;     /* [n_tokens] engine_token_type */
    int32_t n_merges;
    char **merges;            /* [n_merges], rank = index */
    int32_t bos_id, eos_id, pad_id; /* -1 when absent */
    bool add_bos, add_eos;
    char *chat_template;      /* NULL when absent */
} engine_tokenizer_spec;

/* An empty spec with room for n_tokens tokens and n_merges merges: strings NULL, types
 * UNDEFINED, ids -1, model "gpt2", pre "qwen2", add_bos/add_eos false. Fill it with the setters
 * below. Errors: EINVAL (negative counts), ENOMEM. */
int engine_tokenizer_spec_new(engine_tokenizer_spec **out, int32_t n_tokens, int32_t n_merges);

/* Free the spec and every string it holds. NULL is a no-op. */
void engine_tokenizer_spec_free(engine_tokenizer_spec *spec);

/* Copy `len` bytes of `text` (no NUL needed, none allowed inside) into tokens[id] / merges[i] /
 * the named string field, replacing what was there. Errors: EINVAL (index out of range, NUL in
 * the text), ENOMEM. */
int engine_tokenizer_spec_set_token(engine_tokenizer_spec *spec, int32_t id, const char *text,
                                    size_t len, engine_token_type type);
int engine_tokenizer_spec_set_merge(engine_tokenizer_spec *spec, int32_t i, const char *text,
                                    size_t len);
int engine_tokenizer_spec_set_string(char **field, const char *text, size_t len);

/* Grow the vocabulary to n_vocab entries (a model's embedding rows usually exceed the
 * tokenizer's vocabulary: Qwen3 151,669 -> 151,936), filling the new ids with "[PAD<id>]" of
 * type UNUSED, as convert_hf_to_gguf.py does. n_vocab < n_tokens: EINVAL. */
int engine_tokenizer_spec_pad(engine_tokenizer_spec *spec, int32_t n_vocab);

/* Build a spec from the Hugging Face files, given as their contents (not paths):
 *   tokenizer_json          tokenizer.json: model.type "BPE", model.vocab, model.merges (both
 *                           the "a b" and the ["a","b"] forms), added_tokens (id, content,
 *                           special), normalizer / pre_tokenizer checked to be the Qwen2 ones
 *                           (NFC + the Qwen2 Split regex + ByteLevel without prefix space);
 *                           anything else is EUNSUPPORTED, as is a vocab with gaps in its ids.
 *   tokenizer_config_json   tokenizer_config.json (may be NULL): eos_token, pad_token,
 *                           bos_token (each a string or {"content": ...}, looked up in the
 *                           vocabulary), add_bos_token, add_eos_token, chat_template (a string;
 *                           the list-of-named-templates form takes the "default" entry).
 * bos_id: from bos_token when set. Qwen3's tokenizer_config.json has "bos_token": null, and a
 * converted Qwen3 GGUF takes bos_token_id = 151643 ("<|endoftext|>") from config.json instead,
 * which is not among these files: the caller sets spec->bos_id if it wants that value.
 * The JSON reader is strict (RFC 8259, depth limit 64) and safe on hostile input.
 * Errors: EFORMAT (malformed JSON or a missing/mistyped field, message says which),
 * EUNSUPPORTED, ENOMEM. */
int engine_tokenizer_spec_from_hf(engine_tokenizer_spec **out, const char *tokenizer_json,
                                  size_t tokenizer_json_len, const char *tokenizer_config_json,
                                  size_t tokenizer_config_json_len);

/* The same, reading the two files (config_path may be NULL). EIO when a file cannot be read. */
int engine_tokenizer_spec_from_hf_files(engine_tokenizer_spec **out, const char *tokenizer_path,
                                        const char *config_path);

/* ---------------------------------------------------------------------------------------------
 * Tokenizer
 * ------------------------------------------------------------------------------------------- */
typedef struct engine_tokenizer engine_tokenizer;

/* Compile a spec. Supports model "gpt2" with pre "qwen2" or "qwen35" (else EUNSUPPORTED). Errors:
 * EFORMAT (a token that is not valid in its form, a merge whose parts or result are not in the
 * vocabulary, duplicate tokens, a byte without a token, ids out of range), EUNSUPPORTED,
 * ENOMEM. */
int engine_tokenizer_new(engine_tokenizer **out, const engine_tokenizer_spec *spec);
void engine_tokenizer_free(engine_tokenizer *tok);

/* Encode `len` bytes of `text` (any bytes; see the header comment for invalid UTF-8). No BOS
 * or EOS is added. Writes at most `cap` ids; *n_out receives the full count. Returns 0, or
 * ERANGE when the ids did not fit (then *n_out says how many are needed and the first `cap`
 * ids are written), ERANGE also for a text of 1 GiB or more, ENOMEM. */
int engine_tokenizer_encode(const engine_tokenizer *tok, const char *text, size_t len,
                            bool parse_special, int32_t *ids, size_t cap, size_t *n_out);

/* As engine_tokenizer_encode, into a malloc'ed array the caller frees (*ids may be NULL when
 * *n_out is 0). */
int engine_tokenizer_encode_alloc(const engine_tokenizer *tok, const char *text, size_t len,
                                  bool parse_special, int32_t **ids, size_t *n_out);

/* Number of ids (the vocabulary including added and padding tokens). */
int32_t engine_tokenizer_n_vocab(const engine_tokenizer *tok);

/* The raw bytes of token `id` (byte-level mapping undone; added tokens are their text). Borrowed
 * from the tokenizer, not NUL-terminated. NULL (and *len = 0) when id is out of range. */
const char *engine_tokenizer_token_bytes(const engine_tokenizer *tok, int32_t id, size_t *len);

/* The token's type; ENGINE_TOKEN_UNDEFINED when id is out of range. */
engine_token_type engine_tokenizer_token_type(const engine_tokenizer *tok, int32_t id);

/* True for CONTROL tokens (what HF calls special and skip_special_tokens drops). */
bool engine_tokenizer_is_special(const engine_tokenizer *tok, int32_t id);

/* True for end-of-generation tokens: eos_id, and the CONTROL tokens "<|endoftext|>",
 * "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>". */
bool engine_tokenizer_is_eog(const engine_tokenizer *tok, int32_t id);

/* bos/eos/pad ids from the spec (-1 when absent). */
int32_t engine_tokenizer_bos(const engine_tokenizer *tok);
int32_t engine_tokenizer_eos(const engine_tokenizer *tok);
int32_t engine_tokenizer_pad(const engine_tokenizer *tok);

/* The id of the token whose raw bytes are exactly `text` (e.g. "<think>"), or -1. */
int32_t engine_tokenizer_find(const engine_tokenizer *tok, const char *text, size_t len);

/* The chat template from the spec (NULL when none). Borrowed. */
const char *engine_tokenizer_chat_template(const engine_tokenizer *tok);

/* One-shot decode into a malloc'ed NUL-terminated string (*len excludes the NUL): the tokens'
 * raw bytes concatenated, ill-formed UTF-8 replaced by U+FFFD per maximal subpart (as HF's
 * decoder does), CONTROL tokens dropped when skip_special. Ids out of range: EINVAL. */
int engine_tokenizer_decode(const engine_tokenizer *tok, const int32_t *ids, size_t n,
                            bool skip_special, char **text, size_t *len);

/* ---------------------------------------------------------------------------------------------
 * Streaming detokenizer
 *
 * Feed ids one at a time; each call hands back the text that is now complete. The rule:
 *   - bytes that form complete, valid UTF-8 characters are emitted at once;
 *   - an incomplete but so-far valid sequence at the end (e.g. the first 2 bytes of a 4-byte
 *     emoji) is held back until the next token completes it or proves it invalid;
 *   - a sequence that is proven ill-formed (a byte that cannot continue it, or a byte that can
 *     never start a character) becomes one U+FFFD per maximal subpart immediately;
 *   - engine_detok_flush() turns a still-incomplete tail into one U+FFFD.
 * So the concatenation of everything emitted (with a final flush) equals
 * engine_tokenizer_decode() of the same ids, whatever the split; half a character is never
 * emitted. The detokenizer allocates nothing after engine_detok_new(). Not thread-safe (one per
 * stream); the tokenizer it borrows must outlive it.
 * ------------------------------------------------------------------------------------------- */
typedef struct engine_detok engine_detok;

int engine_detok_new(engine_detok **out, const engine_tokenizer *tok, bool skip_special);
void engine_detok_free(engine_detok *d);

/* Forget any held bytes (start a new stream). */
void engine_detok_reset(engine_detok *d);

/* Feed one id. *text and *len receive the newly complete text (possibly empty), borrowed from the
 * detokenizer and valid until the next call on it. Ids out of range: EINVAL (state unchanged). */
int engine_detok_feed(engine_detok *d, int32_t id, const char **text, size_t *len);

/* End of stream: emit U+FFFD for an incomplete tail (or nothing) and reset. */
void engine_detok_flush(engine_detok *d, const char **text, size_t *len);

/* Bytes currently held back (0..3). */
size_t engine_detok_pending(const engine_detok *d);

#endif /* SPARK_ENGINE_TOKENIZER_H */
