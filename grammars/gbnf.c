/* GBNF text -> grammar IR (AST per rule). The syntax is llama.cpp's: see grammar.h. Errors carry
 * "line:col". */
#include "grammar_int.h"

#include <string.h>

#define GBNF_MAX_NEST 200
#define GBNF_MAX_REPEAT 100000

typedef struct {
    grammar_ir *ir;
    const char *s, *end, *p;
    int nest;
    int err;
} gp;

static void gp_pos(const gp *g, const char *at, int *line, int *col) {
    int l = 1, c = 1;
    for (const char *q = g->s; q < at && q < g->end; q++) {
        if (*q == '\n') {
            l++;
            c = 1;
        } else {
            c++;
        }
    }
    *line = l;
    *col = c;
}

static int gp_fail(gp *g, const char *at, const char *msg) {
    int line, col;
    gp_pos(g, at, &line, &col);
    g->err = grammar_err(GRAMMAR_EINVAL, "%d:%d: %s", line, col, msg);
    return g->err;
}

static int ir_node(grammar_ir *ir, int kind) {
    if (grammar_grow((void **)&ir->nodes, &ir->cap_nodes, ir->n_nodes + 1, sizeof *ir->nodes))
        return -1;
    grammar_ast *n = &ir->nodes[ir->n_nodes];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->ref = -1;
    return (int)ir->n_nodes++;
}

void grammar_ir_free(grammar_ir *ir) {
    if (!ir) return;
    free(ir->nodes);
    free(ir->kids);
    free(ir->ranges);
    free(ir->bytes);
    for (size_t i = 0; i < ir->n_rules; i++) free(ir->names[i]);
    free(ir->names);
    free(ir->rule_body);
    free(ir->rule_line);
    free(ir->rule_col);
    memset(ir, 0, sizeof *ir);
}

static int is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_';
}

/* Rule id of name[0..n), creating an undefined entry. -1 on allocation failure. */
static int32_t ir_rule(gp *g, const char *name, size_t n, const char *at) {
    grammar_ir *ir = g->ir;
    for (size_t i = 0; i < ir->n_rules; i++)
        if (strlen(ir->names[i]) == n && memcmp(ir->names[i], name, n) == 0) return (int32_t)i;
    size_t cap = ir->cap_rules;
    if (grammar_grow((void **)&ir->names, &cap, ir->n_rules + 1, sizeof *ir->names)) return -1;
    cap = ir->cap_rules;
    if (grammar_grow((void **)&ir->rule_body, &cap, ir->n_rules + 1, sizeof(int32_t))) return -1;
    cap = ir->cap_rules;
    if (grammar_grow((void **)&ir->rule_line, &cap, ir->n_rules + 1, sizeof(int32_t))) return -1;
    cap = ir->cap_rules;
    if (grammar_grow((void **)&ir->rule_col, &cap, ir->n_rules + 1, sizeof(int32_t))) return -1;
    ir->cap_rules = cap;
    char *copy = malloc(n + 1);
    if (!copy) return -1;
    memcpy(copy, name, n);
    copy[n] = 0;
    ir->names[ir->n_rules] = copy;
    ir->rule_body[ir->n_rules] = -1;
    int line, col;
    gp_pos(g, at, &line, &col);
    ir->rule_line[ir->n_rules] = line;
    ir->rule_col[ir->n_rules] = col;
    return (int32_t)ir->n_rules++;
}

/* Skip blanks and comments; newlines too when `nl`. */
static void gp_space(gp *g, int nl) {
    while (g->p < g->end) {
        char c = *g->p;
        if (c == ' ' || c == '\t') {
            g->p++;
        } else if (c == '#') {
            while (g->p < g->end && *g->p != '\n') g->p++;
        } else if (nl && (c == '\n' || c == '\r')) {
            g->p++;
        } else {
            break;
        }
    }
}

/* Decode one UTF-8 character at g->p (raw bytes that are not valid UTF-8 are refused). */
static int gp_utf8(gp *g, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)g->p;
    size_t left = (size_t)(g->end - g->p);
    unsigned c = u[0];
    int n;
    uint32_t v, min;
    if (c < 0x80) {
        *cp = c;
        g->p++;
        return 0;
    } else if (c >= 0xC2 && c <= 0xDF) {
        n = 2, v = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3, v = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4, v = c & 0x07, min = 0x10000;
    } else {
        return gp_fail(g, g->p, "invalid UTF-8 in grammar text");
    }
    if (left < (size_t)n) return gp_fail(g, g->p, "truncated UTF-8 in grammar text");
    for (int i = 1; i < n; i++) {
        if ((u[i] & 0xC0) != 0x80) return gp_fail(g, g->p, "invalid UTF-8 in grammar text");
        v = (v << 6) | (u[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return gp_fail(g, g->p, "invalid UTF-8 in grammar text");
    *cp = v;
    g->p += n;
    return 0;
}

/* One character of a literal or class, with escapes. */
static int gp_char(gp *g, uint32_t *cp) {
    if (g->p >= g->end) return gp_fail(g, g->p, "unexpected end of grammar");
    if (*g->p != '\\') return gp_utf8(g, cp);
    const char *at = g->p;
    g->p++;
    if (g->p >= g->end) return gp_fail(g, at, "unfinished escape");
    char c = *g->p++;
    int digits = 0;
    switch (c) {
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case '0': *cp = 0; return 0;
    case '\\': case '"': case '[': case ']': case '-': case '^': case '/': case '\'':
    case '.': case '(': case ')': case '|': case '*': case '+': case '?': case '{': case '}':
        *cp = (unsigned char)c;
        return 0;
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'U': digits = 8; break;
    default: return gp_fail(g, at, "unknown escape");
    }
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        int h = g->p < g->end ? grammar_hexval(*g->p) : -1;
        if (h < 0) return gp_fail(g, at, "bad hexadecimal escape");
        v = v * 16 + (uint32_t)h;
        g->p++;
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return gp_fail(g, at, "escape is not a Unicode scalar value");
    *cp = v;
    return 0;
}

static int put_utf8(uint8_t *out, uint32_t cp) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    } else if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    } else if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

static int gp_literal(gp *g, int *node) {
    grammar_ir *ir = g->ir;
    const char *at = g->p;
    g->p++; /* opening quote */
    int n = ir_node(ir, GA_LIT);
    if (n < 0) return g->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
    ir->nodes[n].first = (int32_t)ir->n_bytes;
    for (;;) {
        if (g->p >= g->end || *g->p == '\n') return gp_fail(g, at, "unterminated string literal");
        if (*g->p == '"') {
            g->p++;
            break;
        }
        uint32_t cp;
        if (gp_char(g, &cp)) return g->err;
        if (grammar_grow((void **)&ir->bytes, &ir->cap_bytes, ir->n_bytes + 4, 1))
            return g->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
        ir->n_bytes += (size_t)put_utf8(ir->bytes + ir->n_bytes, cp);
    }
    ir->nodes[n].count = (int32_t)(ir->n_bytes - (size_t)ir->nodes[n].first);
    *node = n;
    return 0;
}

static int cmp_range(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Sort and merge the pairs in place; returns the new pair count. (Surrogates are dropped later,
 * when classes become UTF-8 byte sequences.) */
static size_t normalize_ranges(uint32_t *r, size_t pairs) {
    qsort(r, pairs, 2 * sizeof *r, cmp_range);
    size_t out = 0;
    for (size_t i = 0; i < pairs; i++) {
        uint32_t lo = r[2 * i], hi = r[2 * i + 1];
        if (out && lo <= r[2 * out - 1] + 1) {
            if (hi > r[2 * out - 1]) r[2 * out - 1] = hi;
        } else {
            r[2 * out] = lo;
            r[2 * out + 1] = hi;
            out++;
        }
    }
    return out;
}

static int ranges_push(grammar_ir *ir, uint32_t lo, uint32_t hi) {
    if (grammar_grow((void **)&ir->ranges, &ir->cap_ranges, ir->n_ranges + 2, sizeof(uint32_t)))
        return GRAMMAR_ENOMEM;
    ir->ranges[ir->n_ranges++] = lo;
    ir->ranges[ir->n_ranges++] = hi;
    return 0;
}

/* Turn the class at ranges[first..] into its normalized (and maybe complemented) form. */
static int class_finish(gp *g, int node, int negate) {
    grammar_ir *ir = g->ir;
    size_t first = (size_t)ir->nodes[node].first;
    size_t pairs = (ir->n_ranges - first) / 2;
    if (pairs) pairs = normalize_ranges(ir->ranges + first, pairs);
    ir->n_ranges = first + 2 * pairs;
    if (negate) {
        uint32_t *tmp = malloc((pairs + 1) * 2 * sizeof *tmp);
        if (!tmp) return g->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
        size_t k = 0;
        uint32_t next = 0;
        for (size_t i = 0; i < pairs; i++) {
            uint32_t lo = ir->ranges[first + 2 * i], hi = ir->ranges[first + 2 * i + 1];
            if (lo > next) {
                tmp[2 * k] = next;
                tmp[2 * k + 1] = lo - 1;
                k++;
            }
            next = hi + 1;
        }
        if (next <= 0x10FFFF) {
            tmp[2 * k] = next;
            tmp[2 * k + 1] = 0x10FFFF;
            k++;
        }
        ir->n_ranges = first;
        for (size_t i = 0; i < k; i++)
            if (ranges_push(ir, tmp[2 * i], tmp[2 * i + 1])) {
                free(tmp);
                return g->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
            }
        free(tmp);
        pairs = k;
    }
    ir->nodes[node].count = (int32_t)pairs;
    return 0;
}

static int gp_class(gp *g, int *node) {
    grammar_ir *ir = g->ir;
    const char *at = g->p;
    g->p++; /* [ */
    int negate = 0;
    if (g->p < g->end && *g->p == '^') {
        negate = 1;
        g->p++;
    }
    int n = ir_node(ir, GA_CLASS);
    if (n < 0) return g->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
    ir->nodes[n].first = (int32_t)ir->n_ranges;
    for (;;) {
        if (g->p >= g->end || *g->p == '\n') return gp_fail(g, at, "unterminated character class");
        if (*g->p == ']') {
            g->p++;
            break;
        }
        const char *cat = g->p;
        uint32_t lo, hi;
        if (gp_char(g, &lo)) return g->err;
        hi = lo;
        if (g->p + 1 < g->end && *g->p == '-' && g->p[1] != ']') {
            g->p++;
            if (gp_char(g, &hi)) return g->err;
            if (hi < lo) return gp_fail(g, cat, "character range out of order");
        }
        if (ranges_push(ir, lo, hi)) return g->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
    }
    if (class_finish(g, n, negate)) return g->err;
    *node = n;
    return 0;
}

static int gp_alternatives(gp *g, int *node);

static int gp_number(gp *g, int32_t *v) {
    if (g->p >= g->end || *g->p < '0' || *g->p > '9') return gp_fail(g, g->p, "expected a number");
    long x = 0;
    while (g->p < g->end && *g->p >= '0' && *g->p <= '9') {
        x = x * 10 + (*g->p - '0');
        if (x > GBNF_MAX_REPEAT) return gp_fail(g, g->p, "repetition count too large");
        g->p++;
    }
    *v = (int32_t)x;
    return 0;
}

static int wrap_rep(gp *g, int kid, int32_t min, int32_t max, int *node) {
    int n = ir_node(g->ir, GA_REP);
    if (n < 0) return g->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
    g->ir->nodes[n].first = kid;
    g->ir->nodes[n].min = min;
    g->ir->nodes[n].max = max;
    *node = n;
    return 0;
}

/* A sequence of items with postfix operators; stops at | ) or (outside groups) a newline. */
static int gp_sequence(gp *g, int *node) {
    grammar_ir *ir = g->ir;
    int32_t items[256];
    int n_items = 0;
    int32_t *big = NULL;
    size_t cap_big = 0, n_big = 0;
    int rc = 0;
    for (;;) {
        gp_space(g, g->nest > 0);
        if (g->p >= g->end) break;
        char c = *g->p;
        if (c == '|' || c == ')' || c == '\n' || c == '\r') break;
        const char *at = g->p;
        int item = -1;
        if (c == '"') {
            if ((rc = gp_literal(g, &item))) goto done;
        } else if (c == '[') {
            if ((rc = gp_class(g, &item))) goto done;
        } else if (c == '.') {
            g->p++;
            item = ir_node(ir, GA_CLASS);
            if (item < 0 || (ir->nodes[item].first = (int32_t)ir->n_ranges, 0) ||
                ranges_push(ir, 0, 0x10FFFF)) {
                rc = g->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
                goto done;
            }
            if ((rc = class_finish(g, item, 0))) goto done;
        } else if (c == '(') {
            g->p++;
            if (++g->nest > GBNF_MAX_NEST) {
                rc = gp_fail(g, at, "groups nested too deeply");
                goto done;
            }
            if ((rc = gp_alternatives(g, &item))) goto done;
            g->nest--;
            gp_space(g, 1);
            if (g->p >= g->end || *g->p != ')') {
                rc = gp_fail(g, at, "expected ')' to close this group");
                goto done;
            }
            g->p++;
        } else if (is_word(c)) {
            const char *name = g->p;
            while (g->p < g->end && is_word(*g->p)) g->p++;
            const char *q = g->p;
            while (q < g->end && (*q == ' ' || *q == '\t')) q++;
            if (q + 2 < g->end && q[0] == ':' && q[1] == ':' && q[2] == '=') {
                g->p = name; /* the next rule starts here: a missing newline */
                rc = gp_fail(g, name, "expected a newline before the next rule");
                goto done;
            }
            int32_t r = ir_rule(g, name, (size_t)(g->p - name), name);
            item = ir_node(ir, GA_REF);
            if (r < 0 || item < 0) {
                rc = g->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
                goto done;
            }
            ir->nodes[item].ref = r;
        } else if (c == '<') {
            rc = gp_fail(g, at, "token references (<...>) are not supported");
            goto done;
        } else {
            rc = gp_fail(g, at, "unexpected character");
            goto done;
        }
        /* postfix operators */
        for (;;) {
            gp_space(g, g->nest > 0);
            if (g->p >= g->end) break;
            char o = *g->p;
            int32_t min, max;
            const char *oat = g->p;
            if (o == '*') {
                min = 0, max = -1, g->p++;
            } else if (o == '+') {
                min = 1, max = -1, g->p++;
            } else if (o == '?') {
                min = 0, max = 1, g->p++;
            } else if (o == '{') {
                g->p++;
                gp_space(g, 0);
                min = 0;
                if (g->p < g->end && *g->p != ',') {
                    if ((rc = gp_number(g, &min))) goto done;
                }
                gp_space(g, 0);
                max = min;
                if (g->p < g->end && *g->p == ',') {
                    g->p++;
                    gp_space(g, 0);
                    max = -1;
                    if (g->p < g->end && *g->p != '}') {
                        if ((rc = gp_number(g, &max))) goto done;
                    }
                    gp_space(g, 0);
                }
                if (g->p >= g->end || *g->p != '}') {
                    rc = gp_fail(g, oat, "expected '}' to close the repetition");
                    goto done;
                }
                g->p++;
                if (max >= 0 && max < min) {
                    rc = gp_fail(g, oat, "repetition maximum below its minimum");
                    goto done;
                }
            } else {
                break;
            }
            if ((rc = wrap_rep(g, item, min, max, &item))) goto done;
        }
        if (n_items < 256) {
            items[n_items++] = item;
        } else {
            if (grammar_grow((void **)&big, &cap_big, n_big + 1, sizeof *big)) {
                rc = g->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
                goto done;
            }
            big[n_big++] = item;
        }
    }
    {
        size_t total = (size_t)n_items + n_big;
        if (total == 1) {
            *node = items[0];
            goto done;
        }
        int n = ir_node(ir, total == 0 ? GA_EMPTY : GA_SEQ);
        if (n < 0 || grammar_grow((void **)&ir->kids, &ir->cap_kids, ir->n_kids + total,
                                  sizeof *ir->kids)) {
            rc = g->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
            goto done;
        }
        ir->nodes[n].first = (int32_t)ir->n_kids;
        ir->nodes[n].count = (int32_t)total;
        if (n_items) memcpy(ir->kids + ir->n_kids, items, (size_t)n_items * sizeof *items);
        if (n_big) memcpy(ir->kids + ir->n_kids + n_items, big, n_big * sizeof *big);
        ir->n_kids += total;
        *node = n;
    }
done:
    free(big);
    return rc;
}

static int gp_alternatives(gp *g, int *node) {
    grammar_ir *ir = g->ir;
    int32_t *alts = NULL;
    size_t n_alts = 0, cap = 0;
    int rc = 0;
    for (;;) {
        int seq;
        if ((rc = gp_sequence(g, &seq))) goto done;
        if (grammar_grow((void **)&alts, &cap, n_alts + 1, sizeof *alts)) {
            rc = g->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
            goto done;
        }
        alts[n_alts++] = seq;
        if (g->p < g->end && *g->p == '|') {
            g->p++;
            gp_space(g, 1);
            continue;
        }
        break;
    }
    if (n_alts == 1) {
        *node = alts[0];
    } else {
        int n = ir_node(ir, GA_ALT);
        if (n < 0 ||
            grammar_grow((void **)&ir->kids, &ir->cap_kids, ir->n_kids + n_alts, sizeof *ir->kids)) {
            rc = g->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
            goto done;
        }
        ir->nodes[n].first = (int32_t)ir->n_kids;
        ir->nodes[n].count = (int32_t)n_alts;
        memcpy(ir->kids + ir->n_kids, alts, n_alts * sizeof *alts);
        ir->n_kids += n_alts;
        *node = n;
    }
done:
    free(alts);
    return rc;
}

int grammar_gbnf_parse(grammar_ir *ir, const char *text, size_t len) {
    gp g = {ir, text, text + len, text, 0, 0};
    if (!text) return grammar_err(GRAMMAR_EINVAL, "no grammar text");
    if (memchr(text, 0, len)) {
        g.p = memchr(text, 0, len);
        return gp_fail(&g, g.p, "NUL byte in grammar text");
    }
    for (;;) {
        gp_space(&g, 1);
        if (g.p >= g.end) break;
        const char *at = g.p;
        if (!is_word(*g.p)) return gp_fail(&g, at, "expected a rule name");
        while (g.p < g.end && is_word(*g.p)) g.p++;
        size_t nlen = (size_t)(g.p - at);
        gp_space(&g, 0);
        if (g.end - g.p < 3 || memcmp(g.p, "::=", 3) != 0)
            return gp_fail(&g, g.p, "expected '::=' after the rule name");
        g.p += 3;
        int32_t r = ir_rule(&g, at, nlen, at);
        if (r < 0) return grammar_err(GRAMMAR_ENOMEM, "out of memory");
        if (ir->rule_body[r] >= 0) return gp_fail(&g, at, "rule defined twice");
        int line, col;
        gp_pos(&g, at, &line, &col);
        ir->rule_line[r] = line;
        ir->rule_col[r] = col;
        gp_space(&g, 1);
        int body;
        if (gp_alternatives(&g, &body)) return g.err;
        ir->rule_body[r] = body;
        if (g.p < g.end) {
            if (*g.p == ')') return gp_fail(&g, g.p, "unmatched ')'");
            if (*g.p == '\r') g.p++;
            if (g.p < g.end && *g.p != '\n') return gp_fail(&g, g.p, "expected end of line");
        }
    }
    for (size_t i = 0; i < ir->n_rules; i++)
        if (ir->rule_body[i] < 0)
            return grammar_err(GRAMMAR_EINVAL, "%d:%d: undefined rule '%s'", ir->rule_line[i],
                               ir->rule_col[i], ir->names[i]);
    if (ir->n_rules == 0) return grammar_err(GRAMMAR_EINVAL, "1:1: the grammar has no rules");
    return 0;
}
