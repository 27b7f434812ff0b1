/* Chat templates: arena, string builder, UTF-8 helpers, preprocessing and the tokenizer.
 * The token rules mirror @huggingface/jinja's lexer (the reference our tests compare with),
 * including its textual preprocessing for lstrip_blocks/trim_blocks. */
#include "template_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ----- arena ----- */
struct tpl_chunk {
    tpl_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *tpl_alloc(tpl_arena *a, size_t n) {
    void *p = tpl_alloc_raw(a, n);
    if (p) memset(p, 0, n);
    return p;
}

void *tpl_alloc_raw(tpl_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (n > ((size_t)1 << 40)) return NULL;
    tpl_chunk *c = a->head;
    if (c && c->cap - c->used >= n) {
        void *p = c->data + c->used;
        c->used += n;
        return p;
    }
    bool big = n > 16384; /* a dedicated chunk, so the current one keeps its free space */
    size_t cap = big ? n : 65536;
    if (a->limit && a->total + cap + sizeof(tpl_chunk) > a->limit) return NULL;
    tpl_chunk *nc = malloc(sizeof(tpl_chunk) + cap);
    if (!nc) return NULL;
    a->total += cap + sizeof(tpl_chunk);
    nc->cap = cap;
    nc->used = n;
    if (big && c) {
        nc->next = c->next;
        c->next = nc;
    } else {
        nc->next = c;
        a->head = nc;
    }
    return nc->data;
}

void tpl_arena_free(tpl_arena *a) {
    tpl_chunk *c = a->head;
    while (c) {
        tpl_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->total = 0;
}

/* ----- string builder ----- */
void tpl_sb_init(tpl_sb *b, tpl_arena *a) {
    memset(b, 0, sizeof *b);
    b->a = a;
}

void tpl_sb_put(tpl_sb *b, const char *s, size_t n) {
    if (b->oom || n == 0) return;
    if (b->cap - b->len < n + 1) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap - b->len < n + 1) cap *= 2;
        char *p = tpl_alloc_raw(b->a, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        if (b->len) memcpy(p, b->p, b->len);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void tpl_sb_putc(tpl_sb *b, char c) {
    tpl_sb_put(b, &c, 1);
}

void tpl_sb_puts(tpl_sb *b, const char *s) {
    tpl_sb_put(b, s, strlen(s));
}

/* ----- errors ----- */
void tpl_line_col(const char *src, size_t len, size_t pos, int *line, int *col) {
    int l = 1;
    size_t start = 0;
    if (pos > len) pos = len;
    for (size_t i = 0; i < pos; i++)
        if (src[i] == '\n') {
            l++;
            start = i + 1;
        }
    *line = l;
    *col = (int)(pos - start) + 1;
}

int tpl_errf(const char *src, size_t len, size_t pos, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    tpl_line_col(src, len, pos, &line, &col);
    return agent_err(AGENT_ETEMPLATE, "template line %d, column %d: %s", line, col, msg);
}

/* ----- UTF-8 ----- */
size_t tpl_utf8_decode(const char *s, size_t n, size_t i, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    unsigned char c = u[i];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t need;
    uint32_t v, min;
    if ((c & 0xE0) == 0xC0) {
        need = 1, v = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        need = 2, v = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        need = 3, v = c & 0x07, min = 0x10000;
    } else {
        *cp = 0xFFFD;
        return 1;
    }
    for (size_t k = 1; k <= need; k++) {
        if (i + k >= n || (u[i + k] & 0xC0) != 0x80) {
            *cp = 0xFFFD;
            return 1;
        }
        v = (v << 6) | (u[i + k] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        *cp = 0xFFFD;
        return 1;
    }
    *cp = v;
    return need + 1;
}

size_t tpl_utf8_encode(uint32_t cp, char out[4]) {
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD; /* a lone surrogate prints as U+FFFD */
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

bool tpl_is_js_space(uint32_t cp) {
    switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000: case 0xFEFF:
        return true;
    default:
        return cp >= 0x2000 && cp <= 0x200A;
    }
}

bool tpl_utf8_valid(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = tpl_utf8_decode(s, n, i, &cp);
        if (cp == 0xFFFD && !(k == 3 && (unsigned char)s[i] == 0xEF)) return false;
        i += k;
    }
    return true;
}

/* ----- preprocessing -----
 * A text transformation with a byte map back to the original source (for error positions):
 * out[i] came from src[map[i]]. */
typedef struct {
    char *p;
    size_t *map;
    size_t len;
} pp_buf;

static void pp_put(pp_buf *b, const char *s, size_t origin, size_t n) {
    memcpy(b->p + b->len, s, n);
    for (size_t k = 0; k < n; k++) b->map[b->len + k] = origin + k;
    b->len += n;
}

/* Whitespace length at s[i] (a JS \s character), 0 if none. */
static size_t space_at(const char *s, size_t n, size_t i) {
    if (i >= n) return 0;
    uint32_t cp;
    size_t k = tpl_utf8_decode(s, n, i, &cp);
    return tpl_is_js_space(cp) ? k : 0;
}

static bool is_line_start(const char *s, size_t i) {
    if (i == 0) return true;
    unsigned char c = (unsigned char)s[i - 1];
    if (c == '\n' || c == '\r') return true;
    /* U+2028 / U+2029 (E2 80 A8 / E2 80 A9) also start a line for a JS /m regex */
    return i >= 3 && (unsigned char)s[i - 3] == 0xE2 && (unsigned char)s[i - 2] == 0x80 &&
           (c == 0xA8 || c == 0xA9);
}

/* Match "{%" "-"? \s* "end"? "generation" \s* "-"? "%}" at s[i]; sets end and strip flags. */
static bool generation_tag(const char *s, size_t n, size_t i, size_t *end, bool *ls, bool *rs) {
    if (i + 2 > n || s[i] != '{' || s[i + 1] != '%') return false;
    size_t j = i + 2;
    *ls = j < n && s[j] == '-';
    if (*ls) j++;
    size_t k;
    while ((k = space_at(s, n, j))) j += k;
    if (j + 3 <= n && !memcmp(s + j, "end", 3)) j += 3;
    if (j + 10 > n || memcmp(s + j, "generation", 10)) return false;
    j += 10;
    while ((k = space_at(s, n, j))) j += k;
    *rs = j < n && s[j] == '-';
    if (*rs) j++;
    if (j + 2 > n || s[j] != '%' || s[j + 1] != '}') return false;
    *end = j + 2;
    return true;
}

static int preprocess(tpl_arena *a, const char *src, size_t n, pp_buf *out) {
    pp_buf b1, b2;
    b1.p = tpl_alloc_raw(a, n + 1);
    b1.map = tpl_alloc_raw(a, (n + 1) * sizeof(size_t));
    b2.p = tpl_alloc_raw(a, n + 1);
    b2.map = tpl_alloc_raw(a, (n + 1) * sizeof(size_t));
    if (!b1.p || !b1.map || !b2.p || !b2.map) return agent_err(AGENT_ENOMEM, "out of memory");
    b1.len = b2.len = 0;
    if (n && src[n - 1] == '\n') n--; /* a single trailing newline is dropped */

    /* lstrip_blocks: /^[ \t]*({[#%-])/gm -> "$1" */
    for (size_t i = 0; i < n;) {
        if (is_line_start(src, i) && (src[i] == ' ' || src[i] == '\t' || src[i] == '{')) {
            size_t j = i;
            while (j < n && (src[j] == ' ' || src[j] == '\t')) j++;
            if (j + 1 < n && src[j] == '{' && (src[j + 1] == '#' || src[j + 1] == '%' ||
                                               src[j + 1] == '-')) {
                i = j;
                pp_put(&b1, src + i, i, 2);
                i += 2;
                continue;
            }
        }
        pp_put(&b1, src + i, i, 1);
        i++;
    }
    /* trim_blocks: /([#%-]})\n/g -> "$1" */
    for (size_t i = 0; i < b1.len;) {
        if (i + 2 < b1.len && (b1.p[i] == '#' || b1.p[i] == '%' || b1.p[i] == '-') &&
            b1.p[i + 1] == '}' && b1.p[i + 2] == '\n') {
            pp_put(&b2, b1.p + i, 0, 2);
            b2.map[b2.len - 2] = b1.map[i];
            b2.map[b2.len - 1] = b1.map[i + 1];
            i += 3;
            continue;
        }
        pp_put(&b2, b1.p + i, 0, 1);
        b2.map[b2.len - 1] = b1.map[i];
        i++;
    }
    /* generation tags: /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs */
    b1.len = 0;
    const char *s = b2.p;
    size_t m = b2.len;
    for (size_t i = 0; i < m;) {
        size_t j = i, k;
        while ((k = space_at(s, m, j))) j += k;
        size_t end;
        bool ls, rs;
        if ((j < m && s[j] == '{') && generation_tag(s, m, j, &end, &ls, &rs)) {
            size_t e = end;
            while ((k = space_at(s, m, e))) e += k;
            for (size_t q = i; !ls && q < j; q++) {
                pp_put(&b1, s + q, 0, 1);
                b1.map[b1.len - 1] = b2.map[q];
            }
            for (size_t q = end; !rs && q < e; q++) {
                pp_put(&b1, s + q, 0, 1);
                b1.map[b1.len - 1] = b2.map[q];
            }
            i = e;
            continue;
        }
        size_t stop = j > i ? j : i + 1; /* a whitespace run not before a tag is copied whole */
        for (size_t q = i; q < stop; q++) {
            pp_put(&b1, s + q, 0, 1);
            b1.map[b1.len - 1] = b2.map[q];
        }
        i = stop;
    }
    b1.p[b1.len] = 0;
    b1.map[b1.len] = n;
    *out = b1;
    return 0;
}

/* ----- tokenizer ----- */
typedef struct {
    tpl_arena *a;
    const char *osrc; /* original source, for errors */
    size_t olen;
    const char *s; /* preprocessed */
    size_t n;
    const size_t *map;
    size_t i;
    tpl_tok *toks;
    size_t ntok, cap;
} lexer;

static size_t opos(const lexer *L, size_t i) {
    return i <= L->n ? L->map[i] : L->olen;
}

static int lex_err(const lexer *L, size_t i, const char *msg) {
    return tpl_errf(L->osrc, L->olen, opos(L, i), "%s", msg);
}

static int push(lexer *L, tpl_tok_type t, const char *v, size_t vlen, size_t at) {
    if (L->ntok == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        tpl_tok *nt = tpl_alloc(L->a, cap * sizeof *nt);
        if (!nt) return agent_err(AGENT_ENOMEM, "out of memory");
        if (L->ntok) memcpy(nt, L->toks, L->ntok * sizeof *nt);
        L->toks = nt;
        L->cap = cap;
    }
    tpl_tok *t0 = &L->toks[L->ntok++];
    t0->type = t;
    t0->v.p = v;
    t0->v.len = vlen;
    t0->pos = opos(L, at);
    return 0;
}

static tpl_tok_type last_type(const lexer *L) {
    return L->ntok ? L->toks[L->ntok - 1].type : TK_EOF;
}

static void strip_trailing_ws(lexer *L) {
    if (!L->ntok || L->toks[L->ntok - 1].type != TK_TEXT) return;
    tpl_tok *t = &L->toks[L->ntok - 1];
    size_t len = t->v.len;
    /* trimEnd(): walk back over whitespace code points */
    while (len > 0) {
        size_t st = len - 1;
        while (st > 0 && ((unsigned char)t->v.p[st] & 0xC0) == 0x80) st--;
        uint32_t cp;
        size_t k = tpl_utf8_decode(t->v.p, len, st, &cp);
        if (st + k != len || !tpl_is_js_space(cp)) break;
        len = st;
    }
    t->v.len = len;
    if (len == 0) L->ntok--;
}

static void skip_ws(lexer *L) {
    size_t k;
    while ((k = space_at(L->s, L->n, L->i))) L->i += k;
}

static bool is_digit(char c) {
    return c >= '0' && c <= '9';
}

static bool is_word(char c) {
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A quoted string literal starting after the quote at L->i; leaves L->i after the closing quote. */
static int lex_string(lexer *L, char quote, size_t start) {
    tpl_sb b;
    tpl_sb_init(&b, L->a);
    uint32_t pending_hi = 0; /* a \uD8xx waiting for its low half */
    while (1) {
        if (L->i >= L->n) return lex_err(L, start, "unterminated string literal");
        char c = L->s[L->i];
        if (c == quote) break;
        if (c == '\\') {
            size_t at = L->i++;
            if (L->i >= L->n) return lex_err(L, at, "unexpected end of input in escape");
            char e = L->s[L->i++];
            if (e == 'x' || e == 'u') {
                int len = e == 'x' ? 2 : 4;
                uint32_t v = 0;
                for (int k = 0; k < len; k++) {
                    int h = L->i + (size_t)k < L->n ? hexval(L->s[L->i + (size_t)k]) : -1;
                    if (h < 0) return lex_err(L, at, "invalid hexadecimal escape sequence");
                    v = v * 16 + (uint32_t)h;
                }
                L->i += (size_t)len;
                char enc[4];
                if (v >= 0xD800 && v <= 0xDBFF) {
                    if (pending_hi) tpl_sb_put(&b, enc, tpl_utf8_encode(0xFFFD, enc));
                    pending_hi = v;
                    continue;
                }
                if (v >= 0xDC00 && v <= 0xDFFF && pending_hi) {
                    v = 0x10000 + ((pending_hi - 0xD800) << 10) + (v - 0xDC00);
                    pending_hi = 0;
                }
                tpl_sb_put(&b, enc, tpl_utf8_encode(v, enc));
                continue;
            }
            char u;
            switch (e) {
            case 'n': u = '\n'; break;
            case 't': u = '\t'; break;
            case 'r': u = '\r'; break;
            case 'b': u = '\b'; break;
            case 'f': u = '\f'; break;
            case 'v': u = '\v'; break;
            case '\'': u = '\''; break;
            case '"': u = '"'; break;
            case '\\': u = '\\'; break;
            default: return lex_err(L, at, "unexpected escaped character");
            }
            if (pending_hi) {
                char enc[4];
                tpl_sb_put(&b, enc, tpl_utf8_encode(0xFFFD, enc));
                pending_hi = 0;
            }
            tpl_sb_putc(&b, u);
            continue;
        }
        if (pending_hi) {
            char enc[4];
            tpl_sb_put(&b, enc, tpl_utf8_encode(0xFFFD, enc));
            pending_hi = 0;
        }
        tpl_sb_putc(&b, c);
        L->i++;
    }
    if (pending_hi) {
        char enc[4];
        tpl_sb_put(&b, enc, tpl_utf8_encode(0xFFFD, enc));
    }
    if (b.oom) return agent_err(AGENT_ENOMEM, "out of memory");
    L->i++; /* closing quote */
    return push(L, TK_STRING, b.p ? b.p : "", b.len, start);
}

typedef struct {
    const char *seq;
    tpl_tok_type type;
    size_t len;
} tok_rule;

static const tok_rule RULES[] = {
    {"{%", TK_OPEN_STMT, 2}, {"%}", TK_CLOSE_STMT, 2}, {"{{", TK_OPEN_EXPR, 2},
    {"}}", TK_CLOSE_EXPR, 2}, {"(", TK_LPAREN, 1}, {")", TK_RPAREN, 1}, {"{", TK_LBRACE, 1},
    {"}", TK_RBRACE, 1}, {"[", TK_LBRACKET, 1}, {"]", TK_RBRACKET, 1}, {",", TK_COMMA, 1},
    {".", TK_DOT, 1}, {":", TK_COLON, 1}, {"|", TK_PIPE, 1}, {"<=", TK_COMPARE, 2},
    {">=", TK_COMPARE, 2}, {"==", TK_COMPARE, 2}, {"!=", TK_COMPARE, 2}, {"<", TK_COMPARE, 1},
    {">", TK_COMPARE, 1}, {"+", TK_ADD, 1}, {"-", TK_ADD, 1}, {"~", TK_ADD, 1}, {"**", TK_POW, 2},
    {"*", TK_MUL, 1}, {"//", TK_MUL, 2}, {"/", TK_MUL, 1}, {"%", TK_MUL, 1}, {"=", TK_EQUALS, 1},
};

static bool at_seq_n(const lexer *L, const char *seq, size_t k) {
    return L->i + k <= L->n && L->s[L->i] == seq[0] && !memcmp(L->s + L->i, seq, k);
}

static bool at_seq(const lexer *L, const char *seq) {
    return at_seq_n(L, seq, strlen(seq));
}

int tpl_lex(tpl_arena *a, const char *src, size_t len, tpl_tok **out, size_t *n_out) {
    pp_buf pp = {0};
    int rc = preprocess(a, src, len, &pp);
    if (rc) return rc;
    lexer L = {.a = a, .osrc = src, .olen = len, .s = pp.p, .n = pp.len, .map = pp.map};
    int curly = 0;
    while (L.i < L.n) {
        tpl_tok_type lt = last_type(&L);
        if (lt == TK_EOF || lt == TK_CLOSE_STMT || lt == TK_CLOSE_EXPR || lt == TK_COMMENT) {
            size_t st = L.i;
            while (L.i < L.n && !(L.s[L.i] == '{' && L.i + 1 < L.n &&
                                  (L.s[L.i + 1] == '%' || L.s[L.i + 1] == '{' ||
                                   L.s[L.i + 1] == '#')))
                L.i++;
            if (L.i > st) {
                if ((rc = push(&L, TK_TEXT, L.s + st, L.i - st, st))) return rc;
                continue;
            }
        }
        if (at_seq(&L, "{#")) {
            size_t st = L.i;
            L.i += 2;
            bool strip_before = L.i < L.n && L.s[L.i] == '-';
            if (strip_before) L.i++;
            size_t cst = L.i;
            while (!(L.i + 1 < L.n && L.s[L.i] == '#' && L.s[L.i + 1] == '}')) {
                if (L.i + 2 >= L.n) return lex_err(&L, st, "missing end of comment tag");
                L.i++;
            }
            size_t cend = L.i;
            bool strip_after = cend > cst && L.s[cend - 1] == '-';
            if (strip_after) cend--;
            if (strip_before) strip_trailing_ws(&L);
            if ((rc = push(&L, TK_COMMENT, L.s + cst, cend - cst, st))) return rc;
            L.i += 2;
            if (strip_after) skip_ws(&L);
            continue;
        }
        if (at_seq(&L, "{%-")) {
            strip_trailing_ws(&L);
            if ((rc = push(&L, TK_OPEN_STMT, "{%", 2, L.i))) return rc;
            L.i += 3;
            continue;
        }
        if (at_seq(&L, "{{-")) {
            strip_trailing_ws(&L);
            if ((rc = push(&L, TK_OPEN_EXPR, "{{", 2, L.i))) return rc;
            curly = 0;
            L.i += 3;
            continue;
        }
        skip_ws(&L);
        if (L.i >= L.n) break;
        if (at_seq(&L, "-%}")) {
            if ((rc = push(&L, TK_CLOSE_STMT, "%}", 2, L.i))) return rc;
            L.i += 3;
            skip_ws(&L);
            continue;
        }
        if (at_seq(&L, "-}}")) {
            if ((rc = push(&L, TK_CLOSE_EXPR, "}}", 2, L.i))) return rc;
            L.i += 3;
            skip_ws(&L);
            continue;
        }
        char c = L.s[L.i];
        if (c == '-' || c == '+') {
            lt = last_type(&L);
            if (lt == TK_TEXT || lt == TK_EOF) return lex_err(&L, L.i, "unexpected character");
            if (!(lt == TK_IDENT || lt == TK_NUMBER || lt == TK_STRING || lt == TK_RPAREN ||
                  lt == TK_RBRACKET)) {
                size_t st = L.i++;
                while (L.i < L.n && is_digit(L.s[L.i])) L.i++;
                bool has_num = L.i > st + 1;
                if (has_num && L.i + 1 < L.n && L.s[L.i] == '.' && is_digit(L.s[L.i + 1])) {
                    L.i++;
                    while (L.i < L.n && is_digit(L.s[L.i])) L.i++;
                }
                if ((rc = push(&L, has_num ? TK_NUMBER : TK_UNARY, L.s + st, L.i - st, st)))
                    return rc;
                continue;
            }
        }
        bool matched = false;
        for (size_t r = 0; r < sizeof RULES / sizeof RULES[0]; r++) {
            if (RULES[r].type == TK_CLOSE_EXPR && curly > 0) continue;
            size_t k = RULES[r].len;
            if (!at_seq_n(&L, RULES[r].seq, k)) continue;
            if ((rc = push(&L, RULES[r].type, L.s + L.i, k, L.i))) return rc;
            if (RULES[r].type == TK_OPEN_EXPR) curly = 0;
            else if (RULES[r].type == TK_LBRACE) curly++;
            else if (RULES[r].type == TK_RBRACE) curly--;
            L.i += k;
            matched = true;
            break;
        }
        if (matched) continue;
        if (c == '\'' || c == '"') {
            size_t st = L.i++;
            if ((rc = lex_string(&L, c, st))) return rc;
            continue;
        }
        if (is_digit(c)) {
            size_t st = L.i;
            while (L.i < L.n && is_digit(L.s[L.i])) L.i++;
            if (last_type(&L) != TK_DOT && L.i + 1 < L.n && L.s[L.i] == '.' &&
                is_digit(L.s[L.i + 1])) {
                L.i++;
                while (L.i < L.n && is_digit(L.s[L.i])) L.i++;
            }
            if ((rc = push(&L, TK_NUMBER, L.s + st, L.i - st, st))) return rc;
            continue;
        }
        if (is_word(c)) {
            size_t st = L.i;
            while (L.i < L.n && is_word(L.s[L.i])) L.i++;
            if ((rc = push(&L, TK_IDENT, L.s + st, L.i - st, st))) return rc;
            continue;
        }
        if ((unsigned char)c >= 0x20 && (unsigned char)c < 0x7F)
            return tpl_errf(src, len, opos(&L, L.i), "unexpected character '%c'", c);
        return tpl_errf(src, len, opos(&L, L.i), "unexpected byte 0x%02x",
                        (unsigned)(unsigned char)c);
    }
    *out = L.toks;
    *n_out = L.ntok;
    return 0;
}
