/*
 * template_int.h - private to agent/template*.c: the Jinja subset interpreter behind
 * agent_template_* (agent.h). Pipeline: preprocess (trailing newline, lstrip_blocks,
 * trim_blocks, generation tags) -> tokens -> AST (per-template arena) -> evaluation over values
 * that live in a per-render arena. Semantics follow @huggingface/jinja 0.5.11, the reference the
 * tests compare against; see agent.h for the documented differences from Python Jinja2.
 */
#ifndef SPARK_AGENT_TEMPLATE_INT_H
#define SPARK_AGENT_TEMPLATE_INT_H

#include "agent_int.h"

#include <jansson.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ----- arena: bump allocation in chunks, freed in one call ----- */
typedef struct tpl_chunk tpl_chunk;
typedef struct {
    tpl_chunk *head;
    size_t total; /* bytes obtained from malloc */
    size_t limit; /* 0 = unlimited */
} tpl_arena;

void *tpl_alloc(tpl_arena *a, size_t n);     /* 16-byte aligned, zeroed; NULL when out of memory */
void *tpl_alloc_raw(tpl_arena *a, size_t n); /* the same, not zeroed (byte buffers) */
void tpl_arena_free(tpl_arena *a);

typedef struct {
    const char *p;
    size_t len;
} tpl_str;

/* ----- string builder (arena-backed) ----- */
typedef struct {
    tpl_arena *a;
    char *p;
    size_t len, cap;
    bool oom;
} tpl_sb;

void tpl_sb_init(tpl_sb *b, tpl_arena *a);
void tpl_sb_put(tpl_sb *b, const char *s, size_t n);
void tpl_sb_putc(tpl_sb *b, char c);
void tpl_sb_puts(tpl_sb *b, const char *s);

/* ----- lexer ----- */
typedef enum {
    TK_EOF = 0,
    TK_TEXT,
    TK_NUMBER,
    TK_STRING,
    TK_IDENT,
    TK_EQUALS,
    TK_LPAREN,
    TK_RPAREN,
    TK_OPEN_STMT,
    TK_CLOSE_STMT,
    TK_OPEN_EXPR,
    TK_CLOSE_EXPR,
    TK_LBRACKET,
    TK_RBRACKET,
    TK_LBRACE,
    TK_RBRACE,
    TK_COMMA,
    TK_DOT,
    TK_COLON,
    TK_PIPE,
    TK_ADD,     /* + - ~ */
    TK_MUL,     /* * / // % */
    TK_POW,     /* ** */
    TK_COMPARE, /* < > <= >= == != */
    TK_UNARY,   /* - + (prefix, not followed by a number) */
    TK_COMMENT,
} tpl_tok_type;

typedef struct {
    tpl_tok_type type;
    tpl_str v;  /* text, decoded string literal, identifier, operator, number text */
    size_t pos; /* byte offset in the original source */
} tpl_tok;

/* Tokenize `src` (UTF-8, len bytes) into an arena array. Errors: AGENT_ETEMPLATE with
 * "line L, column C: ..." recorded. */
int tpl_lex(tpl_arena *a, const char *src, size_t len, tpl_tok **out, size_t *n_out);

/* ----- AST ----- */
typedef enum {
    N_STR = 1, N_INT, N_FLOAT, N_IDENT, N_ARRAY, N_TUPLE, N_OBJECT, N_MEMBER, N_SLICE, N_CALL,
    N_KWARG, N_BINARY, N_UNARY, N_FILTER, N_TEST, N_SELECT, N_TERNARY,
    N_IF, N_FOR, N_SET, N_MACRO, N_BREAK, N_CONTINUE, N_COMMENT, N_FILTER_STMT,
} tpl_node_kind;

typedef enum {
    OP_NONE = 0, OP_ADD, OP_SUB, OP_CONCAT, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
    OP_LT, OP_GT, OP_LE, OP_GE, OP_EQ, OP_NE, OP_IN, OP_NOT_IN, OP_AND, OP_OR, OP_NOT,
    OP_NEG, OP_POS,
} tpl_op;

typedef struct tpl_node tpl_node;
struct tpl_node {
    tpl_node_kind kind;
    tpl_op op;
    size_t pos;          /* byte offset in the original source, for error messages */
    tpl_str s;           /* literal text, identifier, test/macro/kwarg name */
    double num;
    bool flag;           /* MEMBER: computed; TEST: negated; MACRO: reads kwargs */
    bool flag2;          /* MACRO: reads varargs */
    tpl_node *a, *b, *c; /* see template_parse.c for each kind's layout */
    tpl_node **list;
    size_t n;
    tpl_node **list2;
    size_t n2;
};

typedef struct {
    tpl_node **body;
    size_t n;
} tpl_program;

int tpl_parse(tpl_arena *a, const tpl_tok *toks, size_t n, const char *src, size_t src_len,
              tpl_program *out);

/* Line and column (1-based; columns count bytes) of byte offset `pos` in src. */
void tpl_line_col(const char *src, size_t len, size_t pos, int *line, int *col);

/* Record "line L, column C: <msg>" for offset `pos` of `src` and return AGENT_ETEMPLATE. */
int tpl_errf(const char *src, size_t len, size_t pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Resource limits of one render (a template is code: loops and recursion are bounded). */
typedef struct {
    size_t max_bytes;   /* arena bytes for values and output */
    uint64_t max_steps; /* evaluated nodes */
} tpl_limits;

#define TPL_LIMITS_DEFAULT {(size_t)256 << 20, 50000000ull}

/* Change a template's render limits (tests and the fuzz target use small ones). */
void tpl_set_limits(agent_template *t, size_t max_bytes, uint64_t max_steps);

/* Render with the variables of the JSON object `vars` (borrowed). *out: malloc'd, NUL-terminated
 * (the text may contain NUL bytes from the input; *out_len is exact). */
int tpl_render_json(const agent_template *t, json_t *vars, const tpl_limits *lim, char **out,
                    size_t *out_len);

/* The template object (agent.h's opaque agent_template). */
struct agent_template {
    tpl_arena arena;
    tpl_limits limits;
    char *src; /* the original source, NUL-terminated, for error positions */
    size_t src_len;
    tpl_program prog;
};

/* ----- UTF-8 helpers (JavaScript string semantics are UTF-16 based) ----- */
/* Decode one code point at s[i..n); returns its byte length (>= 1). Invalid bytes decode as
 * U+FFFD with length 1. */
size_t tpl_utf8_decode(const char *s, size_t n, size_t i, uint32_t *cp);
size_t tpl_utf8_encode(uint32_t cp, char out[4]);
/* JavaScript's \s / String.prototype.trim() whitespace set. */
bool tpl_is_js_space(uint32_t cp);
bool tpl_utf8_valid(const char *s, size_t n);

#endif
