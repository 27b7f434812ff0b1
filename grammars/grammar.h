/*
 * grammar.h - public door of grammars/: grammar-constrained decoding.
 *
 * Conventions: functions return 0 or a negative GRAMMAR_E* code; grammar_error_last() holds the
 * calling thread's last error message. Nothing here prints or exits. The library knows nothing
 * of models: it takes a vocabulary (one byte string per token id) once and answers which tokens
 * may come next, advances by a token, rolls back n tokens and says whether the text so far is a
 * complete sentence of the grammar.
 *
 * Objects and lifetimes
 *   grammar          a compiled grammar (from GBNF, a JSON Schema or a tool list). Immutable:
 *                    one grammar may serve any number of indexes and threads.
 *   grammar_vocab    token id -> bytes, with a prefix trie. Immutable after creation.
 *   grammar_index    grammar x vocabulary: per grammar state, the tokens accepted whatever the
 *                    stack below, and the few that need the stack (filled lazily, or all at once
 *                    with grammar_index_precompute). Borrows both; they must outlive it. Not
 *                    thread-safe while it fills; after grammar_index_precompute it is read-only
 *                    and may be shared by matchers in several threads.
 *   grammar_matcher  one generation's state: a set of parse stacks per byte, with history for
 *                    rollback. Borrows its index. One thread at a time.
 *
 * Wiring the engine sampler (engine_sampling_params in engine/engine.h):
 *
 *     grammar *g;              grammar_new_gbnf(&g, text, len, NULL)   (or _json_schema)
 *     grammar_vocab *v;        grammar_vocab_new(&v, n_vocab, pieces, lens)
 *     grammar_index *ix;       grammar_index_new(&ix, g, v)
 *     grammar_matcher *m;      grammar_matcher_new(&m, ix, eog_ids, n_eog)
 *     params.mask = grammar_sampler_mask;
 *     params.accept = grammar_sampler_accept;
 *     params.grammar_user = m;
 *
 * `pieces` are the token byte strings as the model writes them (for a GPT-2 byte-level BPE
 * vocabulary, the decoded raw bytes). Give control tokens that must never appear inside
 * constrained text a length of 0: they are never allowed, except the end-of-generation ids passed
 * to grammar_matcher_new, which are allowed exactly when the grammar is complete (and in lazy
 * mode while the grammar has not been triggered).
 */
#ifndef SPARK_GRAMMAR_H
#define SPARK_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    GRAMMAR_OK = 0,
    GRAMMAR_EINVAL = -1,       /* bad argument, or a syntax error (message has line:column) */
    GRAMMAR_ENOMEM = -2,
    GRAMMAR_EINTERNAL = -3,
    GRAMMAR_EUNSUPPORTED = -4, /* a valid input this library does not handle (e.g. a schema
                                  keyword), named in the message */
    GRAMMAR_EREJECT = -5,      /* the token or bytes are not allowed here; state unchanged */
    GRAMMAR_ELIMIT = -6,       /* a size limit (states, stack depth, ambiguity) was exceeded */
};

typedef struct grammar grammar;
typedef struct grammar_vocab grammar_vocab;
typedef struct grammar_index grammar_index;
typedef struct grammar_matcher grammar_matcher;

/* The calling thread's last error message ("" if none). Borrowed. */
const char *grammar_error_last(void);

/* ----- grammars ----- */

/* Compile GBNF text (llama.cpp syntax: `name ::= ...` rules, "literals", [classes] with ranges,
 * negation and escapes, `.`, ( ) groups, |, * + ? {m} {m,} {m,n}, # comments). `root` names the
 * start rule (NULL: "root"). Syntax errors: GRAMMAR_EINVAL with "line:col: message". Left
 * recursion is refused (GRAMMAR_EINVAL naming the rule). *out is the caller's (grammar_free). */
int grammar_new_gbnf(grammar **out, const char *text, size_t len, const char *root);

/* JSON Schema -> GBNF text (NUL-terminated, caller frees with free()). Supported: type (also
 * arrays of types), properties, required, additionalProperties (false, true, or a schema),
 * enum, const, items, prefixItems, minItems/maxItems, minLength/maxLength, minimum/maximum and
 * exclusive bounds for integers (numbers: integral bounds, minimum >= 0), pattern (regex
 * subset), format date, time, date-time, uuid, email, uri, ipv4 (generated subsets), anyOf,
 * oneOf (generated as anyOf), allOf of object schemas, $ref to any JSON pointer of the document
 * (recursion allowed), $defs/definitions, nullable; annotations (title, description, default,
 * examples, $schema, $id, $comment, ...) are ignored. The grammar generates a documented subset
 * of the valid documents (schema property order, bounded whitespace and number sizes): see
 * grammars/README.md. An unknown keyword or unsupported combination is GRAMMAR_EUNSUPPORTED
 * (GRAMMAR_EINVAL for a malformed schema), the message naming the JSON pointer. */
int grammar_schema_to_gbnf(char **out, const char *schema_json, size_t len);

/* grammar_schema_to_gbnf followed by grammar_new_gbnf. */
int grammar_new_json_schema(grammar **out, const char *schema_json, size_t len);

/* Tool-call grammars. The tools are an OpenAI-style JSON array: [{"type":"function",
 * "function":{"name":..., "parameters":{schema}}}, ...] (a bare {"name","parameters"} object per
 * tool is accepted too). */
typedef enum {
    GRAMMAR_TOOLS_HERMES = 0,   /* Qwen3 / Hermes: <tool_call>\n{"name": "N", "arguments": {..}}\n</tool_call> */
    GRAMMAR_TOOLS_QWEN3_XML = 1 /* Qwen3-Coder / Qwen3.5: <tool_call>\n<function=N>\n<parameter=P>\nV\n</parameter>\n...</function>\n</tool_call> */
} grammar_tool_format;

typedef enum {
    GRAMMAR_TOOLS_AUTO = 0,     /* free text; the grammar switches on at "<tool_call>" (lazy) */
    GRAMMAR_TOOLS_REQUIRED = 1, /* the output is one or more calls */
    GRAMMAR_TOOLS_NAMED = 2,    /* the output is calls of the one tool `name` */
    GRAMMAR_TOOLS_NONE = 3      /* no tool calls: any text without "<tool_call>" */
} grammar_tool_mode;

typedef struct {
    int version;                /* GRAMMAR_TOOL_OPTIONS_VERSION */
    grammar_tool_format format;
    grammar_tool_mode mode;
    const char *name;           /* GRAMMAR_TOOLS_NAMED: the tool */
    bool parallel;              /* allow several calls in one turn */
} grammar_tool_options;

#define GRAMMAR_TOOL_OPTIONS_VERSION 1
#define GRAMMAR_TOOL_OPTIONS_INIT \
    { GRAMMAR_TOOL_OPTIONS_VERSION, GRAMMAR_TOOLS_HERMES, GRAMMAR_TOOLS_AUTO, NULL, true }

/* The GBNF text of a tool-call grammar (caller frees with free()); *trigger_out (may be NULL)
 * receives the lazy trigger string or NULL when the grammar is not lazy (borrowed, static). */
int grammar_tools_to_gbnf(char **out, const char **trigger_out, const char *tools_json,
                          size_t len, const grammar_tool_options *opt);

/* Compile a tool-call grammar; in AUTO mode it is lazy (see grammar_set_triggers). */
int grammar_new_tools(grammar **out, const char *tools_json, size_t len,
                      const grammar_tool_options *opt);

/* Make g lazy: any text is allowed until one of the trigger strings appears; from the first byte
 * of that occurrence on, the text must match the grammar. At most 8 triggers of 1..63 bytes.
 * Call before creating indexes of g. */
int grammar_set_triggers(grammar *g, const char *const *triggers, int n);

void grammar_free(grammar *g);

/* Number of rules / DFA states (for statistics). */
int32_t grammar_n_states(const grammar *g);

/* ----- vocabulary ----- */

/* tokens[i] with lens[i] bytes is token i (copied). lens[i] == 0 (or tokens[i] NULL): a token
 * the grammar never allows (control tokens, unused ids). */
int grammar_vocab_new(grammar_vocab **out, int32_t n_vocab, const char *const *tokens,
                      const uint32_t *lens);
void grammar_vocab_free(grammar_vocab *v);
int32_t grammar_vocab_size(const grammar_vocab *v);

/* ----- index ----- */

int grammar_index_new(grammar_index **out, const grammar *g, const grammar_vocab *v);
/* Fill the per-state caches of every state now (else each is filled on first use). */
int grammar_index_precompute(grammar_index *ix);
/* Milliseconds spent filling caches so far, and bytes they hold. */
double grammar_index_build_ms(const grammar_index *ix);
size_t grammar_index_bytes(const grammar_index *ix);
void grammar_index_free(grammar_index *ix);

/* ----- matcher ----- */

/* eog_ids[0..n_eog): end-of-generation tokens (copied), allowed only when the grammar is
 * complete. */
int grammar_matcher_new(grammar_matcher **out, grammar_index *ix, const int32_t *eog_ids,
                        int n_eog);
void grammar_matcher_free(grammar_matcher *m);
/* Back to the start (no tokens). */
void grammar_matcher_reset(grammar_matcher *m);

/* Set allowed (n_vocab bits: bit i of allowed[i / 32], (n_vocab + 31) / 32 words, all
 * written) to the tokens that may come next. n_vocab must equal the vocabulary's size.
 * Allocates nothing in the steady state. */
int grammar_matcher_mask(grammar_matcher *m, uint32_t *allowed, int32_t n_vocab);

/* The same result computed the slow way, every token against the stacks one by one (the way
 * llama.cpp's GBNF sampler works); for tests and benchmarks. */
int grammar_matcher_mask_naive(grammar_matcher *m, uint32_t *allowed, int32_t n_vocab);

/* Advance by a token. GRAMMAR_EREJECT (state unchanged) when it is not allowed. Accepting an
 * end-of-generation id when allowed ends the matcher (further accepts are refused). */
int grammar_matcher_accept(grammar_matcher *m, int32_t token);

/* Advance by raw bytes, counted as one token for rollback. GRAMMAR_EREJECT (state unchanged)
 * when the bytes cannot continue the text. */
int grammar_matcher_accept_bytes(grammar_matcher *m, const void *bytes, size_t n);

/* Forget the last n accepted tokens (an accepted end-of-generation token counts as one).
 * GRAMMAR_EINVAL when n exceeds the number of tokens accepted. */
int grammar_matcher_rollback(grammar_matcher *m, int n);

/* Tokens accepted so far. */
int grammar_matcher_n_tokens(const grammar_matcher *m);

/* True when the text so far is a complete sentence (end of generation allowed here). */
bool grammar_matcher_is_complete(const grammar_matcher *m);

/* True after an end-of-generation token was accepted. */
bool grammar_matcher_is_finished(const grammar_matcher *m);

/* Fewest further bytes that make the text complete (0 when complete; UINT32_MAX when the
 * grammar cannot be completed from here). Lets a caller steer toward an end near a limit. */
uint32_t grammar_matcher_distance(const grammar_matcher *m);

/* A tokenization-independent hash of the parse state (equal states, equal hashes); tests use it
 * to compare rollback with replay. */
uint64_t grammar_matcher_state_hash(const grammar_matcher *m);

/* ----- the engine sampler's hooks (engine_mask_fn / engine_accept_fn); user = the matcher ----- */

int grammar_sampler_mask(void *user, uint32_t *allowed, int32_t n_vocab);
int grammar_sampler_accept(void *user, int32_t token);
/* The engine sampler's free_mask hook: 1 while a lazy grammar has not been triggered and the
 * text does not end in a trigger's beginning -- its mask is then the same at every such state
 * (any text; tokens that would trigger and break the grammar excluded), filled into allowed
 * when it is not NULL -- else 0 (the mask hook is needed for the next token); < 0 an error. */
int grammar_sampler_free(void *user, uint32_t *allowed, int32_t n_vocab);

#ifdef __cplusplus
}
#endif
#endif
