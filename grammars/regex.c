/* JSON Schema `pattern` (an ECMAScript regular expression, u flag) -> GBNF over the JSON text of
 * the string's content. Supported: literals, escapes (\d \w \s and their negations, \n \t \r \f
 * \v \0 \xHH \uHHHH \u{H..}, escaped punctuation), classes with ranges and negation, `.`,
 * groups ( ), (?: ), (?<name> ), alternation, quantifiers * + ? {m} {m,} {m,n} (lazy forms
 * too: same language), ^ at the start and $ at the end. Anything else (backreferences,
 * lookaround, \b, inner anchors) is refused. */
#include "grammar_int.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    const char *p, *end;
    grammar_buf *b;
    char *err;
    size_t errcap;
    int failed;
    int depth;
} rx;

typedef struct {
    uint32_t *r;
    size_t n, cap; /* pairs */
} cset;

static int rx_fail(rx *x, const char *msg) {
    if (!x->failed) snprintf(x->err, x->errcap, "%s", msg);
    x->failed = 1;
    return -1;
}

static int cs_add(rx *x, cset *s, uint32_t lo, uint32_t hi) {
    if (grammar_grow((void **)&s->r, &s->cap, 2 * (s->n + 1), sizeof *s->r)) return rx_fail(x, "out of memory");
    s->r[2 * s->n] = lo;
    s->r[2 * s->n + 1] = hi;
    s->n++;
    return 0;
}

static int cmp_pair(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

static void cs_norm(cset *s) {
    if (!s->n) return;
    qsort(s->r, s->n, 2 * sizeof *s->r, cmp_pair);
    size_t o = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (o && s->r[2 * i] <= s->r[2 * o - 1] + 1) {
            if (s->r[2 * i + 1] > s->r[2 * o - 1]) s->r[2 * o - 1] = s->r[2 * i + 1];
        } else {
            s->r[2 * o] = s->r[2 * i];
            s->r[2 * o + 1] = s->r[2 * i + 1];
            o++;
        }
    }
    s->n = o;
}

static int cs_negate(rx *x, cset *s) {
    cs_norm(s);
    cset t = {0};
    uint32_t next = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->r[2 * i] > next && cs_add(x, &t, next, s->r[2 * i] - 1)) return -1;
        next = s->r[2 * i + 1] + 1;
    }
    if (next <= 0x10FFFF && cs_add(x, &t, next, 0x10FFFF)) return -1;
    free(s->r);
    *s = t;
    return 0;
}

static const uint32_t SPACE[] = {0x09, 0x0D, 0x20, 0x20, 0xA0, 0xA0, 0x1680, 0x1680, 0x2000, 0x200A,
                                 0x2028, 0x2029, 0x202F, 0x202F, 0x205F, 0x205F, 0x3000, 0x3000,
                                 0xFEFF, 0xFEFF};

static int add_named(rx *x, cset *s, char k) {
    cset t = {0};
    int neg = k == 'D' || k == 'W' || k == 'S';
    char l = (char)(k | 0x20);
    int rc = 0;
    if (l == 'd') rc = cs_add(x, &t, '0', '9');
    if (l == 'w') rc = cs_add(x, &t, '0', '9') || cs_add(x, &t, 'A', 'Z') || cs_add(x, &t, '_', '_') ||
                       cs_add(x, &t, 'a', 'z');
    if (l == 's')
        for (size_t i = 0; i < sizeof SPACE / sizeof *SPACE && !rc; i += 2) rc = cs_add(x, &t, SPACE[i], SPACE[i + 1]);
    if (!rc && neg) rc = cs_negate(x, &t);
    for (size_t i = 0; i < t.n && !rc; i++) rc = cs_add(x, s, t.r[2 * i], t.r[2 * i + 1]);
    free(t.r);
    return rc;
}

static int utf8_next(rx *x, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)x->p;
    size_t left = (size_t)(x->end - x->p);
    int n = u[0] < 0x80 ? 1 : u[0] < 0xE0 ? 2 : u[0] < 0xF0 ? 3 : 4;
    if ((size_t)n > left) return rx_fail(x, "invalid UTF-8");
    uint32_t v = n == 1 ? u[0] : n == 2 ? u[0] & 0x1F : n == 3 ? u[0] & 0x0F : u[0] & 0x07;
    for (int i = 1; i < n; i++) {
        if ((u[i] & 0xC0) != 0x80) return rx_fail(x, "invalid UTF-8");
        v = (v << 6) | (u[i] & 0x3F);
    }
    *cp = v;
    x->p += n;
    return 0;
}

/* An escape after '\': either a single codepoint (*cp, returns 0) or a class added to s
 * (returns 1). */
static int escape(rx *x, uint32_t *cp, cset *s) {
    if (x->p >= x->end) return rx_fail(x, "trailing backslash");
    char c = *x->p++;
    switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
        return add_named(x, s, c) ? -1 : 1;
    case 'n': *cp = '\n'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case '0': *cp = 0; return 0;
    case 'x': {
        int h1 = x->p + 1 < x->end ? grammar_hexval(x->p[0]) : -1, h2 = x->p + 1 < x->end ? grammar_hexval(x->p[1]) : -1;
        if (h1 < 0 || h2 < 0) return rx_fail(x, "bad \\x escape");
        x->p += 2;
        *cp = (uint32_t)(h1 * 16 + h2);
        return 0;
    }
    case 'u': {
        uint32_t v = 0;
        if (x->p < x->end && *x->p == '{') {
            x->p++;
            int n = 0;
            while (x->p < x->end && *x->p != '}') {
                int h = grammar_hexval(*x->p++);
                if (h < 0 || ++n > 6) return rx_fail(x, "bad \\u{} escape");
                v = v * 16 + (uint32_t)h;
            }
            if (x->p >= x->end || n == 0) return rx_fail(x, "bad \\u{} escape");
            x->p++;
        } else {
            for (int i = 0; i < 4; i++) {
                int h = x->p < x->end ? grammar_hexval(*x->p) : -1;
                if (h < 0) return rx_fail(x, "bad \\u escape");
                v = v * 16 + (uint32_t)h;
                x->p++;
            }
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return rx_fail(x, "\\u escape is not a scalar value");
        *cp = v;
        return 0;
    }
    default:
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
            return rx_fail(x, "unsupported escape (backreference, \\b, \\p, ...)");
        *cp = (unsigned char)c;
        return 0;
    }
}

static int emit_set(rx *x, cset *s) {
    cs_norm(s);
    if (!s->n) return rx_fail(x, "empty character class");
    int first = 1;
    grammar_buf_puts(x->b, "( ");
    grammar_json_char_class(x->b, s->r, s->n, &first);
    grammar_buf_puts(x->b, " )");
    return 0;
}

static int emit_cp(rx *x, uint32_t cp) {
    cset s = {0};
    int rc = cs_add(x, &s, cp, cp);
    if (!rc) rc = emit_set(x, &s);
    free(s.r);
    return rc;
}

static int parse_class(rx *x) {
    cset s = {0};
    int neg = 0;
    x->p++; /* [ */
    if (x->p < x->end && *x->p == '^') {
        neg = 1;
        x->p++;
    }
    for (;;) {
        if (x->p >= x->end) {
            free(s.r);
            return rx_fail(x, "unterminated class");
        }
        if (*x->p == ']') {
            x->p++;
            break;
        }
        uint32_t lo, hi;
        int k;
        if (*x->p == '\\') {
            x->p++;
            k = escape(x, &lo, &s);
            if (k < 0) {
                free(s.r);
                return -1;
            }
            if (k == 1) continue;
        } else if (utf8_next(x, &lo)) {
            free(s.r);
            return -1;
        }
        hi = lo;
        if (x->p + 1 < x->end && *x->p == '-' && x->p[1] != ']') {
            x->p++;
            if (*x->p == '\\') {
                x->p++;
                cset dummy = {0};
                k = escape(x, &hi, &dummy);
                free(dummy.r);
                if (k != 0) {
                    free(s.r);
                    return rx_fail(x, "bad class range");
                }
            } else if (utf8_next(x, &hi)) {
                free(s.r);
                return -1;
            }
            if (hi < lo) {
                free(s.r);
                return rx_fail(x, "class range out of order");
            }
        }
        if (cs_add(x, &s, lo, hi)) {
            free(s.r);
            return -1;
        }
    }
    int rc = neg ? cs_negate(x, &s) : 0;
    if (!rc) rc = emit_set(x, &s);
    free(s.r);
    return rc;
}

static int parse_alt(rx *x);

static int parse_atom(rx *x) {
    char c = *x->p;
    if (c == '(') {
        x->p++;
        if (x->p < x->end && *x->p == '?') {
            if (x->p + 1 < x->end && x->p[1] == ':') {
                x->p += 2;
            } else if (x->p + 1 < x->end && x->p[1] == '<' && x->p + 2 < x->end && x->p[2] != '=' && x->p[2] != '!') {
                const char *q = memchr(x->p, '>', (size_t)(x->end - x->p));
                if (!q) return rx_fail(x, "bad group name");
                x->p = q + 1;
            } else {
                return rx_fail(x, "lookaround and other (? groups are not supported");
            }
        }
        if (++x->depth > 100) return rx_fail(x, "groups nested too deeply");
        grammar_buf_puts(x->b, "( ");
        if (parse_alt(x)) return -1;
        x->depth--;
        if (x->p >= x->end || *x->p != ')') return rx_fail(x, "missing )");
        x->p++;
        grammar_buf_puts(x->b, " )");
        return 0;
    }
    if (c == '[') return parse_class(x);
    if (c == '.') {
        x->p++;
        cset s = {0};
        int rc = cs_add(x, &s, '\n', '\n') || cs_add(x, &s, '\r', '\r') || cs_add(x, &s, 0x2028, 0x2029) ||
                 cs_negate(x, &s) || emit_set(x, &s);
        free(s.r);
        return rc ? -1 : 0;
    }
    if (c == '\\') {
        x->p++;
        cset s = {0};
        uint32_t cp;
        int k = escape(x, &cp, &s);
        int rc = k < 0 ? -1 : k == 1 ? emit_set(x, &s) : emit_cp(x, cp);
        free(s.r);
        return rc;
    }
    if (c == '^' || c == '$') return rx_fail(x, "anchors are only supported at the start and end");
    if (c == '*' || c == '+' || c == '?' || c == '{') return rx_fail(x, "nothing to repeat");
    if (c == ']' || c == '}') {
        x->p++;
        return emit_cp(x, (unsigned char)c);
    }
    uint32_t cp;
    if (utf8_next(x, &cp)) return -1;
    return emit_cp(x, cp);
}

static int parse_quant(rx *x) {
    if (x->p >= x->end) return 0;
    char c = *x->p;
    if (c == '*' || c == '+' || c == '?') {
        x->p++;
        grammar_buf_put(x->b, &c, 1);
    } else if (c == '{') {
        const char *q = x->p + 1;
        long m = -1, n = -1;
        int comma = 0;
        if (q < x->end && *q >= '0' && *q <= '9') {
            m = 0;
            while (q < x->end && *q >= '0' && *q <= '9') m = m * 10 + (*q++ - '0');
        }
        if (q < x->end && *q == ',') {
            comma = 1;
            q++;
            if (q < x->end && *q >= '0' && *q <= '9') {
                n = 0;
                while (q < x->end && *q >= '0' && *q <= '9') n = n * 10 + (*q++ - '0');
            }
        }
        if (m < 0 || q >= x->end || *q != '}') { /* a literal '{' in ECMAScript (not with u flag) */
            return rx_fail(x, "bad {m,n} quantifier");
        }
        if (m > 1000 || n > 1000) return rx_fail(x, "quantifier bound above 1000");
        if (n >= 0 && n < m) return rx_fail(x, "quantifier {m,n} with n < m");
        x->p = q + 1;
        if (!comma) grammar_buf_printf(x->b, "{%ld}", m);
        else if (n < 0) grammar_buf_printf(x->b, "{%ld,}", m);
        else grammar_buf_printf(x->b, "{%ld,%ld}", m, n);
    } else {
        return 0;
    }
    if (x->p < x->end && *x->p == '?') x->p++; /* lazy: same language */
    if (x->p < x->end && (*x->p == '*' || *x->p == '+' || *x->p == '{'))
        return rx_fail(x, "nested quantifier");
    return 0;
}

static int parse_concat(rx *x) {
    int n = 0;
    while (x->p < x->end && *x->p != '|' && *x->p != ')') {
        if (n++) grammar_buf_puts(x->b, " ");
        grammar_buf_puts(x->b, "( ");
        if (parse_atom(x)) return -1;
        grammar_buf_puts(x->b, " )");
        if (parse_quant(x)) return -1;
    }
    if (!n) grammar_buf_puts(x->b, "\"\"");
    return 0;
}

static int parse_alt(rx *x) {
    if (parse_concat(x)) return -1;
    while (x->p < x->end && *x->p == '|') {
        x->p++;
        grammar_buf_puts(x->b, " | ");
        if (parse_concat(x)) return -1;
    }
    return 0;
}

int grammar_regex_to_gbnf(grammar_buf *b, const char *re, char *err, size_t errcap) {
    size_t n = strlen(re);
    int start = n && re[0] == '^';
    int end = n > (size_t)start && re[n - 1] == '$';
    if (end) { /* an escaped $ is a literal */
        size_t bs = 0;
        for (size_t i = n - 1; i > 0 && re[i - 1] == '\\'; i--) bs++;
        if (bs % 2) end = 0;
    }
    rx x = {re + start, re + n - end, b, err, errcap, 0, 0};
    if ((start || end) && n > 0) { /* a top-level | with anchors would change their meaning */
        int depth = 0, cls = 0;
        for (const char *p = x.p; p < x.end; p++) {
            if (*p == '\\') {
                p++;
                continue;
            }
            if (cls) {
                if (*p == ']') cls = 0;
                continue;
            }
            if (*p == '[') cls = 1;
            else if (*p == '(') depth++;
            else if (*p == ')') depth--;
            else if (*p == '|' && depth == 0) {
                grammar_buf_puts(b, "( ");
                x.p = re + start;
                start = end = 0; /* re-parse below with explicit anchors: refuse for now */
                snprintf(err, errcap, "anchors with a top-level | are not supported");
                return -1;
            }
        }
    }
    if (!start) grammar_buf_puts(b, GRAMMAR_JSON_CHAR "* ");
    grammar_buf_puts(b, "( ");
    if (parse_alt(&x)) return -1;
    if (x.p != x.end) return rx_fail(&x, "unbalanced )");
    grammar_buf_puts(b, " )");
    if (!end) grammar_buf_puts(b, " " GRAMMAR_JSON_CHAR "*");
    return b->failed ? rx_fail(&x, "out of memory") : 0;
}
