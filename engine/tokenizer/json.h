/* A small, strict JSON reader (RFC 8259) for the tokenizer's Hugging Face files. Private to the
 * engine, which cannot depend on Jansson. Safe on hostile input: depth limit, UTF-8 validation,
 * no lone surrogates, no control characters in strings, integer overflow checks. */
#ifndef SPARK_ENGINE_TOKENIZER_JSON_H
#define SPARK_ENGINE_TOKENIZER_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    ENGINE_JSON_NULL,
    ENGINE_JSON_FALSE,
    ENGINE_JSON_TRUE,
    ENGINE_JSON_NUMBER,
    ENGINE_JSON_STRING,
    ENGINE_JSON_ARRAY,
    ENGINE_JSON_OBJECT,
} engine_json_type;

typedef struct {
    uint8_t type;
    bool is_int;       /* NUMBER without fraction or exponent that fits int64 */
    int64_t ival;
    double dval;       /* NUMBER: its value as a double (strtod), also for integers */
    uint32_t str, len; /* STRING: offset and length of the unescaped bytes in doc->strs */
    uint32_t key, klen;/* member of an OBJECT: its key, likewise */
    uint32_t child;    /* ARRAY/OBJECT: first element (0 = none; node 0 is always the root) */
    uint32_t next;     /* next sibling (0 = none) */
    uint32_t count;    /* ARRAY/OBJECT: number of elements */
} engine_json_node;

typedef struct {
    engine_json_node *nodes;
    size_t n, cap;
    char *strs;        /* unescaped strings, each NUL-terminated */
    size_t sn;
} engine_json;

/* Parse text[0..len) into doc (root = doc->nodes[0]). Returns 0, or ENGINE_EFORMAT with the
 * message "<what> at byte N" (prefixed by `name`) recorded by engine_err, or ENGINE_ENOMEM. */
int engine_json_parse(engine_json *doc, const char *text, size_t len, const char *name);
void engine_json_deinit(engine_json *doc);

/* Member `key` of object node `obj`, or NULL (also when obj is not an object). */
const engine_json_node *engine_json_get(const engine_json *doc, const engine_json_node *obj,
                                        const char *key);

/* Child iteration: first child / next sibling, NULL at the end. */
const engine_json_node *engine_json_first(const engine_json *doc, const engine_json_node *n);
const engine_json_node *engine_json_next(const engine_json *doc, const engine_json_node *n);

/* String contents, NUL-terminated; may hold an escaped "\u0000" inside, so use ->len.
 */
static inline const char *engine_json_str(const engine_json *doc, const engine_json_node *n) {
    return doc->strs + n->str;
}
static inline const char *engine_json_key(const engine_json *doc, const engine_json_node *n) {
    return doc->strs + n->key;
}

#endif
