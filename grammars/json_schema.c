/* JSON Schema -> GBNF text. Each schema node becomes a rule; $refs become rule references, so
 * recursive schemas give recursive grammars. What is supported is listed in grammar.h and
 * docs/grammars.md; anything else is GRAMMAR_EUNSUPPORTED naming the JSON pointer. */
#include "grammar_int.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MAX_LENGTH_BOUND 1000   /* minLength / maxLength expanded as counted repetitions */
#define MAX_ITEMS_BOUND 10000
#define INT_BOUND 1000000000000000LL /* |integer bounds| handled (10^15) */

typedef struct {
    char ptr[256];
    char rule[64];
} ref_entry;

typedef struct {
    json_t *root;
    grammar_buf out;
    const char *prefix; /* rule names of this schema start with it */
    int n_rules;
    ref_entry *refs;
    size_t n_refs, cap_refs;
    uint32_t used; /* core rules needed */
    int depth;
    int err;
} sctx;

enum { U_WS = GRAMMAR_CORE_WS, U_STRING = 2, U_NUMBER = 4, U_INTEGER = 8, U_VALUE = 16, U_CHAR = 32 };

static const char CORE_WS[] = "ws ::= ( \" \" | \"\\n\" [ ]{0,16} )?\n";
static const char CORE_STRING[] = "string ::= \"\\\"\" " GRAMMAR_JSON_CHAR "* \"\\\"\"\n";
static const char CORE_INTEGER[] = "integer ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n";
static const char CORE_NUMBER[] =
    "number ::= integer ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?\n";
static const char CORE_VALUE[] =
    "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object ::= \"{\" ws ( member ( ws \",\" ws member )* ws )? \"}\"\n"
    "member ::= string ws \":\" ws value\n"
    "array ::= \"[\" ws ( value ( ws \",\" ws value )* ws )? \"]\"\n";

static int fail(sctx *c, int code, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(sctx *c, int code, const char *path, const char *fmt, ...) {
    if (c->err) return c->err;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->err = grammar_err(code, "schema %s%s: %s", path[0] == '#' ? "" : "#", path, msg);
    return c->err;
}

static void new_rule(sctx *c, char *name, const char *hint) {
    char h[24];
    size_t k = 0;
    for (const char *p = hint; *p && k < sizeof h - 1; p++)
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9'))
            h[k++] = *p;
        else if (k && h[k - 1] != '-')
            h[k++] = '-';
    h[k] = 0;
    snprintf(name, 64, "%sr%d%s%s", c->prefix ? c->prefix : "", c->n_rules++, k ? "-" : "", h);
}

static void path_join(char *dst, size_t cap, const char *path, const char *seg) {
    size_t a = strlen(path), b = strlen(seg);
    if (a > cap / 2) a = cap / 2; /* paths are for messages: cut long ones */
    if (a + b + 2 > cap) b = cap - a - 2;
    memmove(dst, path, a);
    dst[a] = '/';
    memcpy(dst + a + 1, seg, b);
    dst[a + 1 + b] = 0;
}

/* d digits of x with leading zeros (d <= 19). */
static void fixed_digits(char *out, long long x, int d) {
    for (int i = d - 1; i >= 0; i--) {
        out[i] = (char)('0' + x % 10);
        x /= 10;
    }
    out[d] = 0;
}

static int gen(sctx *c, json_t *s, const char *path, char *name);

static const char *const IGNORED[] = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "markdownDescription", "$anchor", "contentMediaType",
    "contentEncoding", "strict", NULL};

static const char *const KNOWN[] = {
    "type", "properties", "required", "additionalProperties", "enum", "const", "items",
    "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "pattern", "format", "anyOf", "oneOf", "allOf",
    "$ref", "$defs", "definitions", "nullable", "uniqueItems", NULL};

static int in_list(const char *k, const char *const *list) {
    for (int i = 0; list[i]; i++)
        if (strcmp(k, list[i]) == 0) return 1;
    return 0;
}

static int check_keywords(sctx *c, json_t *s, const char *path) {
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        if (in_list(k, IGNORED) || in_list(k, KNOWN)) continue;
        char p[512];
        path_join(p, sizeof p, path, k);
        return fail(c, GRAMMAR_EUNSUPPORTED, p, "keyword '%s' is not supported", k);
    }
    json_t *u = json_object_get(s, "uniqueItems");
    if (u && !json_is_false(u))
        return fail(c, GRAMMAR_EUNSUPPORTED, path, "uniqueItems: true is not supported%s", "");
    return 0;
}

/* ----- integers ----- */

/* Digits of a (fixed width w, with leading zeros) to b, same width: GBNF alternatives. */
static void range_fixed(grammar_buf *b, const char *lo, const char *hi, int w) {
    if (w == 0) {
        grammar_buf_puts(b, "\"\"");
        return;
    }
    if (memcmp(lo, hi, (size_t)w) == 0) {
        grammar_buf_put(b, "\"", 1);
        grammar_buf_put(b, lo, (size_t)w);
        grammar_buf_put(b, "\"", 1);
        return;
    }
    int zeros = 1, nines = 1;
    for (int i = 1; i < w; i++) {
        if (lo[i] != '0') zeros = 0;
        if (hi[i] != '9') nines = 0;
    }
    if (lo[0] == hi[0]) {
        grammar_buf_printf(b, "\"%c\" (", lo[0]);
        range_fixed(b, lo + 1, hi + 1, w - 1);
        grammar_buf_puts(b, ")");
        return;
    }
    if (zeros && nines) {
        grammar_buf_printf(b, "[%c-%c]", lo[0], hi[0]);
        if (w > 1) grammar_buf_printf(b, " [0-9]{%d}", w - 1);
        return;
    }
    char nine[20], zero[20];
    memset(nine, '9', sizeof nine);
    memset(zero, '0', sizeof zero);
    grammar_buf_puts(b, "(");
    char first_lo = lo[0], first_hi = hi[0];
    if (!zeros) {
        grammar_buf_printf(b, "\"%c\" (", lo[0]);
        range_fixed(b, lo + 1, nine, w - 1);
        grammar_buf_puts(b, ") | ");
        first_lo++;
    }
    if (!nines) first_hi--;
    if (first_lo <= first_hi) {
        grammar_buf_printf(b, "[%c-%c]", first_lo, first_hi);
        if (w > 1) grammar_buf_printf(b, " [0-9]{%d}", w - 1);
        if (!nines) grammar_buf_puts(b, " | ");
    } else if (nines) {
        /* nothing between: drop the trailing " | " */
        b->len -= 3;
        b->data[b->len] = 0;
    }
    if (!nines) {
        grammar_buf_printf(b, "\"%c\" (", hi[0]);
        range_fixed(b, zero, hi + 1, w - 1);
        grammar_buf_puts(b, ")");
    }
    grammar_buf_puts(b, ")");
}

static int ndigits(long long x) {
    int d = 1;
    while (x >= 10) {
        x /= 10;
        d++;
    }
    return d;
}

/* Non-negative integers in [lo, hi] (hi < 0: unbounded, up to 16 digits), no leading zeros. */
static void nonneg_range(grammar_buf *b, long long lo, long long hi) {
    int dl = ndigits(lo), dh = hi < 0 ? 16 : ndigits(hi);
    grammar_buf_puts(b, "(");
    for (int d = dl; d <= dh; d++) {
        long long p = 1;
        for (int i = 1; i < d; i++) p *= 10;
        long long a = d == 1 ? 0 : p, z = p * 10 - 1;
        if (a < lo) a = lo;
        if (hi >= 0 && z > hi) z = hi;
        if (a > z) continue;
        if (d > dl) grammar_buf_puts(b, " | ");
        char sa[20], sz[20];
        fixed_digits(sa, a, d);
        fixed_digits(sz, z, d);
        range_fixed(b, sa, sz, d);
    }
    grammar_buf_puts(b, ")");
}

static int get_bound(sctx *c, json_t *s, const char *key, const char *path, int integral,
                     int *has, long long *val, double *real) {
    json_t *v = json_object_get(s, key);
    *has = 0;
    if (!v) return 0;
    if (!json_is_number(v)) return fail(c, GRAMMAR_EINVAL, path, "'%s' is not a number", key);
    double d = json_number_value(v);
    *real = d;
    if (integral && d != floor(d))
        return fail(c, GRAMMAR_EUNSUPPORTED, path, "a fractional '%s' is not supported here", key);
    if (fabs(d) > (double)INT_BOUND)
        return fail(c, GRAMMAR_EUNSUPPORTED, path, "'%s' beyond 10^15 is not supported", key);
    *has = 1;
    *val = (long long)d;
    return 0;
}

static int gen_integer(sctx *c, json_t *s, const char *path, grammar_buf *b) {
    int hlo, hhi, hxlo, hxhi;
    long long lo = 0, hi = 0, xlo = 0, xhi = 0;
    double r;
    /* bounds of an integer: a fractional bound rounds inward */
    json_t *v;
    if ((v = json_object_get(s, "minimum")) && json_is_number(v) && json_number_value(v) != floor(json_number_value(v)))
        json_object_set_new(s, "minimum", json_real(ceil(json_number_value(v))));
    if ((v = json_object_get(s, "maximum")) && json_is_number(v) && json_number_value(v) != floor(json_number_value(v)))
        json_object_set_new(s, "maximum", json_real(floor(json_number_value(v))));
    if (get_bound(c, s, "minimum", path, 1, &hlo, &lo, &r) ||
        get_bound(c, s, "maximum", path, 1, &hhi, &hi, &r))
        return c->err;
    v = json_object_get(s, "exclusiveMinimum");
    if (json_is_boolean(v)) { /* draft 4 */
        if (json_is_true(v) && hlo) lo++;
    } else {
        if (get_bound(c, s, "exclusiveMinimum", path, 0, &hxlo, &xlo, &r)) return c->err;
        if (hxlo) {
            long long e = (long long)floor(r) + 1;
            if (!hlo || e > lo) lo = e;
            hlo = 1;
        }
    }
    v = json_object_get(s, "exclusiveMaximum");
    if (json_is_boolean(v)) {
        if (json_is_true(v) && hhi) hi--;
    } else {
        if (get_bound(c, s, "exclusiveMaximum", path, 0, &hxhi, &xhi, &r)) return c->err;
        if (hxhi) {
            long long e = (long long)ceil(r) - 1;
            if (!hhi || e < hi) hi = e;
            hhi = 1;
        }
    }
    if (hlo && hhi && lo > hi) return fail(c, GRAMMAR_EINVAL, path, "no integer fits the bounds%s", "");
    if (!hlo && !hhi) {
        c->used |= U_INTEGER;
        grammar_buf_puts(b, "integer");
        return 0;
    }
    if (hlo && lo >= 0) {
        nonneg_range(b, lo, hhi ? hi : -1);
    } else if (hhi && hi < 0) {
        grammar_buf_puts(b, "\"-\" ");
        nonneg_range(b, -hi, hlo ? -lo : -1);
    } else { /* lo < 0 (or none) <= hi (or none) */
        grammar_buf_puts(b, "( \"-\" ");
        nonneg_range(b, 1, hlo ? -lo : -1);
        grammar_buf_puts(b, " | ");
        nonneg_range(b, 0, hhi ? hi : -1);
        grammar_buf_puts(b, " )");
    }
    return 0;
}

static int gen_number(sctx *c, json_t *s, const char *path, grammar_buf *b) {
    int hlo, hhi, h;
    long long lo = 0, hi = 0, x;
    double r;
    if (get_bound(c, s, "minimum", path, 1, &hlo, &lo, &r) ||
        get_bound(c, s, "maximum", path, 1, &hhi, &hi, &r))
        return c->err;
    if (json_object_get(s, "exclusiveMinimum") || json_object_get(s, "exclusiveMaximum")) {
        (void)h;
        (void)x;
        return fail(c, GRAMMAR_EUNSUPPORTED, path, "exclusive bounds on numbers are not supported%s", "");
    }
    if (!hlo && !hhi) {
        c->used |= U_NUMBER | U_INTEGER;
        grammar_buf_puts(b, "number");
        return 0;
    }
    if (!hlo || lo < 0)
        return fail(c, GRAMMAR_EUNSUPPORTED, path,
                    "number bounds need an integral minimum >= 0 (else use type integer)%s", "");
    if (hhi && hi < lo) return fail(c, GRAMMAR_EINVAL, path, "no number fits the bounds%s", "");
    if (hhi && hi == lo) {
        grammar_buf_printf(b, "\"%lld\" ( \".\" \"0\"{1,16} )?", lo);
        return 0;
    }
    grammar_buf_puts(b, "( ");
    nonneg_range(b, lo, hhi ? hi - 1 : -1);
    grammar_buf_puts(b, " ( \".\" [0-9]{1,16} )?");
    if (hhi) grammar_buf_printf(b, " | \"%lld\" ( \".\" \"0\"{1,16} )?", hi);
    grammar_buf_puts(b, " )");
    return 0;
}

/* ----- strings ----- */

/* GBNF alternatives for a codepoint set inside a JSON string's content: safe characters as a
 * class, the ones JSON must escape as their escapes. */
void grammar_json_char_class(grammar_buf *b, const uint32_t *r, size_t pairs, int *first) {
    /* safe part: [lo-hi] minus 0x00-0x1F, '"', '\\' */
    grammar_buf tmp = {0};
    for (size_t i = 0; i < pairs; i++) {
        uint32_t lo = r[2 * i], hi = r[2 * i + 1];
        uint32_t a = lo < 0x20 ? 0x20 : lo;
        while (a <= hi) {
            uint32_t z = hi;
            if (a <= '"' && z >= '"') z = a == '"' ? '"' : '"' - 1;
            if (a <= '\\' && z >= '\\') z = a == '\\' ? '\\' : '\\' - 1;
            if (a != '"' && a != '\\') {
                if (a == z) grammar_buf_printf(&tmp, "\\U%08X", a);
                else grammar_buf_printf(&tmp, "\\U%08X-\\U%08X", a, z);
            }
            if (z == 0x10FFFF) break;
            a = z + 1;
        }
    }
    if (tmp.len) {
        grammar_buf_printf(b, "%s[%s]", *first ? "" : " | ", tmp.data);
        *first = 0;
    }
    free(tmp.data);
    /* escaped members */
    for (size_t i = 0; i < pairs; i++) {
        uint32_t lo = r[2 * i], hi = r[2 * i + 1];
        for (uint32_t ch = lo; ch <= hi && ch < 0x20; ch++) {
            grammar_buf_printf(b, "%s\"\\\\u%04X\"", *first ? "" : " | ", ch);
            *first = 0;
            const char *e = ch == '\n' ? "n" : ch == '\t' ? "t" : ch == '\r' ? "r" : ch == '\b' ? "b" : ch == '\f' ? "f" : NULL;
            if (e) grammar_buf_printf(b, " | \"\\\\%s\"", e);
        }
        if (lo <= '"' && hi >= '"') {
            grammar_buf_printf(b, "%s\"\\\\\\\"\"", *first ? "" : " | ");
            *first = 0;
        }
        if (lo <= '\\' && hi >= '\\') {
            grammar_buf_printf(b, "%s\"\\\\\\\\\"", *first ? "" : " | ");
            *first = 0;
        }
        if (lo <= '/' && hi >= '/') grammar_buf_puts(b, " | \"\\\\/\"");
    }
}

static int gen_string(sctx *c, json_t *s, const char *path, grammar_buf *b) {
    json_t *jmin = json_object_get(s, "minLength"), *jmax = json_object_get(s, "maxLength");
    json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    if ((jmin && !json_is_integer(jmin)) || (jmax && !json_is_integer(jmax)))
        return fail(c, GRAMMAR_EINVAL, path, "minLength/maxLength must be integers%s", "");
    long long mn = jmin ? json_integer_value(jmin) : 0, mx = jmax ? json_integer_value(jmax) : -1;
    if (mn < 0 || (jmax && mx < 0) || (jmax && mx < mn))
        return fail(c, GRAMMAR_EINVAL, path, "bad minLength/maxLength%s", "");
    if (mn > MAX_LENGTH_BOUND || mx > MAX_LENGTH_BOUND)
        return fail(c, GRAMMAR_EUNSUPPORTED, path, "minLength/maxLength above %s are not supported",
                    "1000");
    int n_cons = (jmin || jmax) + (pat != NULL) + (fmt != NULL);
    if (n_cons > 1)
        return fail(c, GRAMMAR_EUNSUPPORTED, path,
                    "only one of length bounds, pattern and format per string is supported%s", "");
    if (pat) {
        if (!json_is_string(pat)) return fail(c, GRAMMAR_EINVAL, path, "pattern is not a string%s", "");
        char err[200];
        grammar_buf_puts(b, "\"\\\"\" ( ");
        if (grammar_regex_to_gbnf(b, json_string_value(pat), err, sizeof err))
            return fail(c, GRAMMAR_EUNSUPPORTED, path, "pattern: %s", err);
        grammar_buf_puts(b, " ) \"\\\"\"");
        c->used |= U_CHAR;
        return 0;
    }
    if (fmt) {
        const char *f = json_string_value(fmt);
        if (!f) return fail(c, GRAMMAR_EINVAL, path, "format is not a string%s", "");
        static const char DATE[] =
            "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] )";
        static const char TIME[] =
            "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,6} )? "
            "( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )";
        grammar_buf_puts(b, "\"\\\"\" ");
        if (strcmp(f, "date") == 0) {
            grammar_buf_puts(b, DATE);
        } else if (strcmp(f, "time") == 0) {
            grammar_buf_puts(b, TIME);
        } else if (strcmp(f, "date-time") == 0) {
            grammar_buf_printf(b, "%s \"T\" %s", DATE, TIME);
        } else if (strcmp(f, "uuid") == 0) {
            grammar_buf_puts(b, "[0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{12}");
        } else if (strcmp(f, "email") == 0) {
            grammar_buf_puts(b, "[a-zA-Z0-9_] [a-zA-Z0-9._+-]{0,30} \"@\" [a-zA-Z0-9] ( [a-zA-Z0-9-]{0,20} [a-zA-Z0-9] )? ( \".\" [a-zA-Z]{2,6} ){1,2}");
        } else if (strcmp(f, "uri") == 0) {
            grammar_buf_puts(b, "( \"https\" | \"http\" ) \"://\" [a-z0-9] [a-z0-9.-]{0,30} ( \"/\" [a-zA-Z0-9._~%-]{0,20} ){0,6}");
        } else if (strcmp(f, "ipv4") == 0) {
            grammar_buf_puts(b, "( [0-9] | [1-9] [0-9] | \"1\" [0-9]{2} | \"2\" [0-4] [0-9] | \"25\" [0-5] ) ( \".\" ( [0-9] | [1-9] [0-9] | \"1\" [0-9]{2} | \"2\" [0-4] [0-9] | \"25\" [0-5] ) ){3}");
        } else {
            return fail(c, GRAMMAR_EUNSUPPORTED, path, "format '%s' is not supported", f);
        }
        grammar_buf_puts(b, " \"\\\"\"");
        return 0;
    }
    c->used |= U_CHAR;
    if (!jmin && !jmax) {
        c->used |= U_STRING;
        grammar_buf_puts(b, "string");
        return 0;
    }
    if (mx < 0) grammar_buf_printf(b, "\"\\\"\" %s{%lld,} \"\\\"\"", GRAMMAR_JSON_CHAR, mn);
    else grammar_buf_printf(b, "\"\\\"\" %s{%lld,%lld} \"\\\"\"", GRAMMAR_JSON_CHAR, mn, mx);
    return 0;
}

/* ----- JSON values as literals (enum, const) ----- */

static int put_json_literal(sctx *c, grammar_buf *b, json_t *v, const char *path) {
    char *txt = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!txt) return fail(c, GRAMMAR_ENOMEM, path, "cannot serialize a value%s", "");
    grammar_buf_puts(b, "\"");
    grammar_buf_put_gbnf_literal(b, txt, strlen(txt));
    grammar_buf_puts(b, "\"");
    free(txt);
    return 0;
}

/* ----- objects ----- */

typedef struct {
    const char *key;
    json_t *schema;
    int required;
} prop;

/* Keys made of [a-zA-Z0-9_.-] that are not any of the given names: a trie walk in GBNF. */
static void gen_key_not_in(sctx *c, grammar_buf *rules, const char *name, prop *p, size_t n,
                           const char *prefix, size_t plen) {
    grammar_buf b = {0};
    char kids[128];
    size_t nk = 0;
    int is_word = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(p[i].key);
        if (l < plen || memcmp(p[i].key, prefix, plen) != 0) continue;
        if (l == plen) {
            is_word = 1;
            continue;
        }
        char ch = p[i].key[plen];
        if (!memchr(kids, ch, nk) && nk < sizeof kids) kids[nk++] = ch;
    }
    grammar_buf_printf(&b, "%s ::= ", name);
    int first = 1;
    if (plen > 0 && !is_word) {
        grammar_buf_puts(&b, "\"\"");
        first = 0;
    }
    /* an allowed character that leaves the trie: anything after it is fine */
    grammar_buf cls = {0};
    const char *alpha = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-";
    for (const char *a = alpha; *a; a++)
        if (!memchr(kids, *a, nk)) {
            if (*a == '-') grammar_buf_puts(&cls, "\\-");
            else grammar_buf_put(&cls, a, 1);
        }
    if (cls.len) {
        grammar_buf_printf(&b, "%s[%s] [a-zA-Z0-9_.\\-]{0,24}", first ? "" : " | ", cls.data);
        first = 0;
    }
    free(cls.data);
    for (size_t k = 0; k < nk; k++) {
        if (!strchr(alpha, kids[k])) continue; /* a name with other characters: never produced */
        char sub[64];
        new_rule(c, sub, "key");
        char pre[256];
        if (plen + 1 >= sizeof pre) continue;
        memcpy(pre, prefix, plen);
        pre[plen] = kids[k];
        grammar_buf_printf(&b, "%s\"%c\" %s", first ? "" : " | ", kids[k], sub);
        first = 0;
        gen_key_not_in(c, rules, sub, p, n, pre, plen + 1);
    }
    if (first) grammar_buf_puts(&b, "\"\"");
    grammar_buf_puts(&b, "\n");
    grammar_buf_put(rules, b.data ? b.data : "", b.len);
    free(b.data);
}

static int gen_object(sctx *c, json_t *s, const char *path, grammar_buf *b) {
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return fail(c, GRAMMAR_EINVAL, path, "properties is not an object%s", "");
    if (req && !json_is_array(req)) return fail(c, GRAMMAR_EINVAL, path, "required is not an array%s", "");
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return fail(c, GRAMMAR_EINVAL, path, "additionalProperties must be a boolean or a schema%s", "");
    size_t n = 0, cap = json_object_size(props) + json_array_size(req) + 1;
    prop *p = calloc(cap, sizeof *p);
    if (!p) return fail(c, GRAMMAR_ENOMEM, path, "out of memory%s", "");
    const char *k;
    json_t *v;
    json_object_foreach(props, k, v) {
        p[n].key = k;
        p[n].schema = v;
        n++;
    }
    size_t i;
    json_array_foreach(req, i, v) {
        const char *rk = json_string_value(v);
        if (!rk) {
            free(p);
            return fail(c, GRAMMAR_EINVAL, path, "required holds a non-string%s", "");
        }
        size_t j;
        for (j = 0; j < n; j++)
            if (strcmp(p[j].key, rk) == 0) break;
        if (j == n) { /* required but not described: any value */
            p[n].key = rk;
            p[n].schema = NULL;
            n++;
        }
        p[j].required = 1;
    }
    c->used |= U_WS;
    /* no properties and additionalProperties absent/true: any object */
    if (n == 0 && (!addl || json_is_true(addl))) {
        c->used |= U_VALUE | U_STRING | U_CHAR | U_NUMBER | U_INTEGER;
        grammar_buf_puts(b, "object");
        free(p);
        return 0;
    }
    /* property rules */
    char (*kv)[64] = calloc(n + 1, sizeof *kv);
    if (!kv) {
        free(p);
        return fail(c, GRAMMAR_ENOMEM, path, "out of memory%s", "");
    }
    for (i = 0; i < n && !c->err; i++) {
        char sub0[512], sub[512], vname[64];
        path_join(sub0, sizeof sub0, path, "properties");
        path_join(sub, sizeof sub, sub0, p[i].key);
        if (p[i].schema) {
            gen(c, p[i].schema, sub, vname);
        } else {
            c->used |= U_VALUE | U_STRING | U_CHAR | U_NUMBER | U_INTEGER;
            strcpy(vname, "value");
        }
        if (c->err) break;
        new_rule(c, kv[i], p[i].key);
        grammar_buf r = {0};
        json_t *ks = json_string(p[i].key);
        grammar_buf_printf(&r, "%s ::= ", kv[i]);
        char *kt = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
        json_decref(ks);
        if (!kt) {
            free(r.data);
            fail(c, GRAMMAR_ENOMEM, path, "out of memory%s", "");
            break;
        }
        grammar_buf_puts(&r, "\"");
        grammar_buf_put_gbnf_literal(&r, kt, strlen(kt));
        free(kt);
        grammar_buf_printf(&r, "\" ws \":\" ws %s\n", vname);
        grammar_buf_put(&c->out, r.data, r.len);
        free(r.data);
    }
    /* extra members */
    char extra[64] = "";
    if (!c->err && addl && (json_is_object(addl) || json_is_true(addl))) {
        char vname[64], keyname[64];
        if (json_is_object(addl)) {
            char sub[512];
            path_join(sub, sizeof sub, path, "additionalProperties");
            gen(c, addl, sub, vname);
        } else {
            c->used |= U_VALUE | U_STRING | U_CHAR | U_NUMBER | U_INTEGER;
            strcpy(vname, "value");
        }
        if (!c->err) {
            new_rule(c, extra, "extra");
            if (n == 0) {
                c->used |= U_STRING | U_CHAR;
                grammar_buf_printf(&c->out, "%s ::= string ws \":\" ws %s\n", extra, vname);
            } else {
                new_rule(c, keyname, "extra-key");
                gen_key_not_in(c, &c->out, keyname, p, n, "", 0);
                grammar_buf_printf(&c->out, "%s ::= \"\\\"\" %s \"\\\"\" ws \":\" ws %s\n", extra,
                                   keyname, vname);
            }
        }
    }
    if (c->err) {
        free(p);
        free(kv);
        return c->err;
    }
    /* body: members in order, optional ones optional, commas between present ones.
     * first_i = "members from i on, none emitted yet"; rest_i = "from i on, some emitted". */
    char (*first)[64] = calloc(n + 1, sizeof *first), (*rest)[64] = calloc(n + 1, sizeof *rest);
    if (!first || !rest) {
        free(first);
        free(rest);
        free(p);
        free(kv);
        return fail(c, GRAMMAR_ENOMEM, path, "out of memory%s", "");
    }
    for (size_t j = 0; j <= n; j++) {
        new_rule(c, first[j], "first");
        new_rule(c, rest[j], "rest");
    }
    const char *tail = extra[0] ? extra : NULL;
    for (size_t j = n + 1; j-- > 0;) {
        if (j == n) {
            if (tail) {
                grammar_buf_printf(&c->out, "%s ::= ( %s ( ws \",\" ws %s )* )?\n", first[j], tail, tail);
                grammar_buf_printf(&c->out, "%s ::= ( ws \",\" ws %s )*\n", rest[j], tail);
            } else {
                grammar_buf_printf(&c->out, "%s ::= \"\"\n%s ::= \"\"\n", first[j], rest[j]);
            }
            continue;
        }
        if (p[j].required) {
            grammar_buf_printf(&c->out, "%s ::= %s %s\n", first[j], kv[j], rest[j + 1]);
            grammar_buf_printf(&c->out, "%s ::= ws \",\" ws %s %s\n", rest[j], kv[j], rest[j + 1]);
        } else {
            grammar_buf_printf(&c->out, "%s ::= %s %s | %s\n", first[j], kv[j], rest[j + 1], first[j + 1]);
            grammar_buf_printf(&c->out, "%s ::= ( ws \",\" ws %s )? %s\n", rest[j], kv[j], rest[j + 1]);
        }
    }
    grammar_buf_printf(b, "\"{\" ws %s ws \"}\"", first[0]);
    free(first);
    free(rest);
    free(p);
    free(kv);
    return 0;
}

/* ----- arrays ----- */

static int gen_array(sctx *c, json_t *s, const char *path, grammar_buf *b) {
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    json_t *jmin = json_object_get(s, "minItems"), *jmax = json_object_get(s, "maxItems");
    if ((jmin && !json_is_integer(jmin)) || (jmax && !json_is_integer(jmax)))
        return fail(c, GRAMMAR_EINVAL, path, "minItems/maxItems must be integers%s", "");
    long long mn = jmin ? json_integer_value(jmin) : 0, mx = jmax ? json_integer_value(jmax) : -1;
    if (mn < 0 || (jmax && (mx < 0 || mx < mn)))
        return fail(c, GRAMMAR_EINVAL, path, "bad minItems/maxItems%s", "");
    if (mn > MAX_ITEMS_BOUND || mx > MAX_ITEMS_BOUND)
        return fail(c, GRAMMAR_EUNSUPPORTED, path, "minItems/maxItems above %s are not supported", "10000");
    if (json_is_array(items)) { /* draft 4 tuple form */
        if (prefix) return fail(c, GRAMMAR_EINVAL, path, "items array and prefixItems together%s", "");
        prefix = items;
        items = json_object_get(s, "additionalItems");
    }
    if (prefix && !json_is_array(prefix)) return fail(c, GRAMMAR_EINVAL, path, "prefixItems is not an array%s", "");
    size_t k = json_array_size(prefix);
    if (k > 64) return fail(c, GRAMMAR_EUNSUPPORTED, path, "more than 64 prefixItems%s", "");
    char pn[64][64], in[64] = "";
    for (size_t i = 0; i < k && !c->err; i++) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s/prefixItems/%zu", path, i);
        gen(c, json_array_get(prefix, i), sub, pn[i]);
    }
    int items_false = json_is_false(items);
    if (!c->err && !items_false) {
        if (!items || json_is_true(items)) {
            c->used |= U_VALUE | U_STRING | U_CHAR | U_NUMBER | U_INTEGER | U_WS;
            strcpy(in, "value");
        } else {
            char sub[512];
            path_join(sub, sizeof sub, path, "items");
            gen(c, items, sub, in);
        }
    }
    if (c->err) return c->err;
    if (items_false && mn > (long long)k)
        return fail(c, GRAMMAR_EINVAL, path, "minItems exceeds the prefixItems with items: false%s", "");
    c->used |= U_WS;
    grammar_buf_puts(b, "\"[\" ws ");
    /* positions 0..k-1 from prefixItems, each optional once minItems is met */
    int open = 0;
    size_t i = 0;
    for (; i < k && (mx < 0 || (long long)i < mx); i++) {
        if ((long long)i >= mn) {
            grammar_buf_puts(b, "( ");
            open++;
        }
        if (i) grammar_buf_puts(b, "ws \",\" ws ");
        grammar_buf_printf(b, "%s ", pn[i]);
    }
    if (!items_false && (mx < 0 || (long long)i < mx)) {
        long long lo = mn - (long long)i, hi = mx < 0 ? -1 : mx - (long long)i;
        if (lo < 0) lo = 0;
        if (i == 0) {
            if (lo >= 1) {
                grammar_buf_printf(b, "%s ( ws \",\" ws %s ){%lld,", in, in, lo - 1);
                if (hi >= 0) grammar_buf_printf(b, "%lld", hi - 1);
                grammar_buf_puts(b, "} ");
            } else if (hi != 0) {
                grammar_buf_printf(b, "( %s ( ws \",\" ws %s ){0,", in, in);
                if (hi >= 0) grammar_buf_printf(b, "%lld", hi - 1);
                grammar_buf_puts(b, "} )? ");
            }
        } else if (hi != 0) {
            grammar_buf_printf(b, "( ws \",\" ws %s ){%lld,", in, lo);
            if (hi >= 0) grammar_buf_printf(b, "%lld", hi);
            grammar_buf_puts(b, "} ");
        }
    }
    for (; open > 0; open--) grammar_buf_puts(b, ")? ");
    grammar_buf_puts(b, "ws \"]\"");
    return 0;
}

/* ----- $ref ----- */

static json_t *resolve_pointer(json_t *root, const char *ref) {
    if (strcmp(ref, "#") == 0) return root;
    if (strncmp(ref, "#/", 2) != 0) return NULL;
    json_t *cur = root;
    const char *p = ref + 2;
    char seg[256];
    while (*p && cur) {
        size_t n = 0;
        while (*p && *p != '/') {
            char ch = *p++;
            if (ch == '~' && *p == '1') ch = '/', p++;
            else if (ch == '~' && *p == '0') ch = '~', p++;
            else if (ch == '%' && p[0] && p[1]) { /* percent-encoded */
                unsigned x;
                if (sscanf(p, "%2x", &x) == 1) ch = (char)x, p += 2;
            }
            if (n + 1 >= sizeof seg) return NULL;
            seg[n++] = ch;
        }
        seg[n] = 0;
        if (*p == '/') p++;
        if (json_is_object(cur)) {
            cur = json_object_get(cur, seg);
        } else if (json_is_array(cur)) {
            char *end;
            long i = strtol(seg, &end, 10);
            cur = *end ? NULL : json_array_get(cur, (size_t)i);
        } else {
            return NULL;
        }
    }
    return cur;
}

static int gen_ref(sctx *c, const char *ref, const char *path, char *name) {
    for (size_t i = 0; i < c->n_refs; i++)
        if (strcmp(c->refs[i].ptr, ref) == 0) {
            strcpy(name, c->refs[i].rule);
            return 0;
        }
    json_t *target = resolve_pointer(c->root, ref);
    if (!target)
        return fail(c, GRAMMAR_EUNSUPPORTED, path, "$ref '%s' does not resolve in this document", ref);
    if (strlen(ref) >= sizeof c->refs[0].ptr)
        return fail(c, GRAMMAR_EUNSUPPORTED, path, "$ref too long%s", "");
    if (grammar_grow((void **)&c->refs, &c->cap_refs, c->n_refs + 1, sizeof *c->refs))
        return fail(c, GRAMMAR_ENOMEM, path, "out of memory%s", "");
    ref_entry *e = &c->refs[c->n_refs++];
    strcpy(e->ptr, ref);
    const char *slash = strrchr(ref, '/');
    new_rule(c, e->rule, slash ? slash + 1 : "root");
    strcpy(name, e->rule);
    char body[64], rule[64];
    strcpy(rule, e->rule);
    if (gen(c, target, ref, body)) return c->err;
    grammar_buf_printf(&c->out, "%s ::= %s\n", rule, body);
    return 0;
}

/* ----- allOf of objects ----- */

static json_t *deref(sctx *c, json_t *s) {
    for (int i = 0; i < 32 && json_is_object(s) && json_object_get(s, "$ref"); i++) {
        json_t *t = resolve_pointer(c->root, json_string_value(json_object_get(s, "$ref")) ?
                                                 json_string_value(json_object_get(s, "$ref")) : "");
        if (!t) return NULL;
        s = t;
    }
    return s;
}

static int gen_allof(sctx *c, json_t *s, const char *path, char *name) {
    json_t *all = json_object_get(s, "allOf");
    if (!json_is_array(all) || json_array_size(all) == 0)
        return fail(c, GRAMMAR_EINVAL, path, "allOf must be a non-empty array%s", "");
    json_t *m = json_object(), *props = json_object(), *req = json_array();
    json_t *parts = json_array();
    if (!m || !props || !req || !parts) goto oom;
    json_t *self = json_deep_copy(s);
    if (!self) goto oom;
    json_object_del(self, "allOf");
    json_array_append_new(parts, self);
    size_t i;
    json_t *x;
    json_array_foreach(all, i, x) json_array_append(parts, x);
    int closed = 0;
    json_array_foreach(parts, i, x) {
        json_t *r = deref(c, x);
        if (!json_is_object(r)) {
            json_decref(m), json_decref(props), json_decref(req), json_decref(parts);
            return fail(c, GRAMMAR_EUNSUPPORTED, path, "allOf: only object schemas can be merged%s", "");
        }
        const char *k;
        json_t *v;
        json_object_foreach(r, k, v) {
            if (strcmp(k, "properties") == 0) {
                const char *pk;
                json_t *pv;
                json_object_foreach(v, pk, pv) {
                    json_t *old = json_object_get(props, pk);
                    if (old && !json_equal(old, pv)) {
                        json_decref(m), json_decref(props), json_decref(req), json_decref(parts);
                        return fail(c, GRAMMAR_EUNSUPPORTED, path,
                                    "allOf: property '%s' has different schemas", pk);
                    }
                    json_object_set(props, pk, pv);
                }
            } else if (strcmp(k, "required") == 0) {
                size_t j;
                json_t *rv;
                json_array_foreach(v, j, rv) json_array_append(req, rv);
            } else if (strcmp(k, "additionalProperties") == 0) {
                if (json_is_false(v)) closed++;
                else if (!json_is_true(v)) {
                    json_decref(m), json_decref(props), json_decref(req), json_decref(parts);
                    return fail(c, GRAMMAR_EUNSUPPORTED, path, "allOf: additionalProperties schemas cannot be merged%s", "");
                }
            } else if (strcmp(k, "type") == 0) {
                if (!json_is_string(v) || strcmp(json_string_value(v), "object") != 0) {
                    json_decref(m), json_decref(props), json_decref(req), json_decref(parts);
                    return fail(c, GRAMMAR_EUNSUPPORTED, path, "allOf: only object schemas can be merged%s", "");
                }
            } else if (!in_list(k, IGNORED) && strcmp(k, "$defs") != 0 && strcmp(k, "definitions") != 0) {
                json_decref(m), json_decref(props), json_decref(req), json_decref(parts);
                return fail(c, GRAMMAR_EUNSUPPORTED, path, "allOf: keyword '%s' cannot be merged", k);
            }
        }
    }
    if (closed) {
        /* one part closed: every property must be declared by every closed part */
        json_array_foreach(parts, i, x) {
            json_t *r = deref(c, x);
            if (!json_is_false(json_object_get(r, "additionalProperties"))) continue;
            const char *pk;
            json_t *pv;
            json_object_foreach(props, pk, pv) if (!json_object_get(json_object_get(r, "properties"), pk)) {
                json_decref(m), json_decref(props), json_decref(req), json_decref(parts);
                return fail(c, GRAMMAR_EUNSUPPORTED, path,
                            "allOf: property '%s' is excluded by a part with additionalProperties: false", pk);
            }
        }
    }
    json_object_set_new(m, "type", json_string("object"));
    json_object_set(m, "properties", props);
    json_object_set(m, "required", req);
    json_object_set_new(m, "additionalProperties", json_false());
    json_decref(props);
    json_decref(req);
    json_decref(parts);
    int rc = gen(c, m, path, name);
    json_decref(m);
    return rc;
oom:
    json_decref(m), json_decref(props), json_decref(req), json_decref(parts);
    return fail(c, GRAMMAR_ENOMEM, path, "out of memory%s", "");
}

/* ----- dispatch ----- */

enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_NUM = 8, T_STR = 16, T_ARR = 32, T_OBJ = 64, T_ALL = 127 };

static int type_bit(const char *t) {
    static const char *const names[] = {"null", "boolean", "integer", "number", "string", "array", "object"};
    for (int i = 0; i < 7; i++)
        if (strcmp(t, names[i]) == 0) return 1 << i;
    return 0;
}

static int json_type_bits(json_t *v) {
    switch (json_typeof(v)) {
    case JSON_NULL: return T_NULL;
    case JSON_TRUE: case JSON_FALSE: return T_BOOL;
    case JSON_INTEGER: return T_INT | T_NUM;
    case JSON_REAL: return json_real_value(v) == floor(json_real_value(v)) ? T_INT | T_NUM : T_NUM;
    case JSON_STRING: return T_STR;
    case JSON_ARRAY: return T_ARR;
    case JSON_OBJECT: return T_OBJ;
    }
    return 0;
}

static int gen(sctx *c, json_t *s, const char *path, char *name) {
    if (c->err) return c->err;
    if (++c->depth > 200) return fail(c, GRAMMAR_ELIMIT, path, "schema nested too deeply%s", "");
    grammar_buf b = {0};
    int rc = 0;
    if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) {
        c->used |= U_VALUE | U_STRING | U_CHAR | U_NUMBER | U_INTEGER | U_WS;
        strcpy(name, "value");
        goto done;
    }
    if (json_is_false(s)) {
        rc = fail(c, GRAMMAR_EINVAL, path, "schema false admits no value%s", "");
        goto done;
    }
    if (!json_is_object(s)) {
        rc = fail(c, GRAMMAR_EINVAL, path, "a schema must be an object or a boolean%s", "");
        goto done;
    }
    if ((rc = check_keywords(c, s, path))) goto done;
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        const char *k;
        json_t *v;
        json_object_foreach(s, k, v) if (strcmp(k, "$ref") && !in_list(k, IGNORED) &&
                                         strcmp(k, "$defs") && strcmp(k, "definitions")) {
            rc = fail(c, GRAMMAR_EUNSUPPORTED, path, "keyword '%s' beside $ref is not supported", k);
            goto done;
        }
        if (!json_is_string(ref)) {
            rc = fail(c, GRAMMAR_EINVAL, path, "$ref is not a string%s", "");
            goto done;
        }
        rc = gen_ref(c, json_string_value(ref), path, name);
        goto done;
    }
    if (json_object_get(s, "allOf")) {
        rc = gen_allof(c, s, path, name);
        goto done;
    }
    const char *hint = strrchr(path, '/');
    new_rule(c, name, hint ? hint + 1 : "root");
    int nullable = json_is_true(json_object_get(s, "nullable"));
    json_t *any = json_object_get(s, "anyOf");
    if (!any) any = json_object_get(s, "oneOf");
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    json_t *type = json_object_get(s, "type");
    int tmask = 0;
    if (type) {
        if (json_is_string(type)) {
            tmask = type_bit(json_string_value(type));
        } else if (json_is_array(type)) {
            size_t i;
            json_t *t;
            json_array_foreach(type, i, t) tmask |= json_is_string(t) ? type_bit(json_string_value(t)) : 0;
        }
        if (!tmask) {
            rc = fail(c, GRAMMAR_EINVAL, path, "bad type%s", "");
            goto done;
        }
    }
    if (any) {
        if (!json_is_array(any) || json_array_size(any) == 0) {
            rc = fail(c, GRAMMAR_EINVAL, path, "anyOf/oneOf must be a non-empty array%s", "");
            goto done;
        }
        const char *k;
        json_t *v;
        json_object_foreach(s, k, v) if (strcmp(k, "anyOf") && strcmp(k, "oneOf") && strcmp(k, "nullable") &&
                                         !in_list(k, IGNORED) && strcmp(k, "$defs") && strcmp(k, "definitions")) {
            rc = fail(c, GRAMMAR_EUNSUPPORTED, path, "keyword '%s' beside anyOf/oneOf is not supported", k);
            goto done;
        }
        size_t i;
        json_t *alt;
        json_array_foreach(any, i, alt) {
            char sub[512], an[64];
            snprintf(sub, sizeof sub, "%s/%s/%zu", path, json_object_get(s, "anyOf") ? "anyOf" : "oneOf", i);
            if ((rc = gen(c, alt, sub, an))) goto done;
            grammar_buf_printf(&b, "%s%s", i ? " | " : "", an);
        }
    } else if (en || cn) {
        const char *k;
        json_t *v;
        json_object_foreach(s, k, v) if (strcmp(k, "enum") && strcmp(k, "const") && strcmp(k, "type") &&
                                         strcmp(k, "nullable") && !in_list(k, IGNORED)) {
            rc = fail(c, GRAMMAR_EUNSUPPORTED, path, "keyword '%s' beside enum/const is not supported", k);
            goto done;
        }
        if (en && !json_is_array(en)) {
            rc = fail(c, GRAMMAR_EINVAL, path, "enum is not an array%s", "");
            goto done;
        }
        int first = 1;
        size_t i;
        json_t *ev;
        json_t *one = cn ? json_pack("[O]", cn) : NULL;
        json_array_foreach(cn ? one : en, i, ev) {
            if (tmask && !(json_type_bits(ev) & tmask)) continue;
            if (en && cn && !json_equal(ev, cn)) continue;
            if (!first) grammar_buf_puts(&b, " | ");
            first = 0;
            put_json_literal(c, &b, ev, path);
        }
        json_decref(one);
        if (first) {
            rc = fail(c, GRAMMAR_EINVAL, path, "no enum/const value fits the type%s", "");
            goto done;
        }
    } else {
        if (!tmask) { /* infer from keywords; otherwise any value */
            if (json_object_get(s, "properties") || json_object_get(s, "required") ||
                json_object_get(s, "additionalProperties"))
                tmask |= T_OBJ;
            if (json_object_get(s, "items") || json_object_get(s, "prefixItems") ||
                json_object_get(s, "minItems") || json_object_get(s, "maxItems"))
                tmask |= T_ARR;
            if (json_object_get(s, "minLength") || json_object_get(s, "maxLength") ||
                json_object_get(s, "pattern") || json_object_get(s, "format"))
                tmask |= T_STR;
            if (json_object_get(s, "minimum") || json_object_get(s, "maximum") ||
                json_object_get(s, "exclusiveMinimum") || json_object_get(s, "exclusiveMaximum"))
                tmask |= T_NUM;
            if (!tmask) tmask = T_ALL;
        }
        if ((tmask & T_INT) && (tmask & T_NUM)) tmask &= ~T_INT;
        int first = 1;
        for (int t = 1; t < 128; t <<= 1) {
            if (!(tmask & t)) continue;
            if (!first) grammar_buf_puts(&b, " | ");
            first = 0;
            switch (t) {
            case T_NULL: grammar_buf_puts(&b, "\"null\""); break;
            case T_BOOL: grammar_buf_puts(&b, "\"true\" | \"false\""); break;
            case T_INT: rc = gen_integer(c, s, path, &b); break;
            case T_NUM: rc = gen_number(c, s, path, &b); break;
            case T_STR: rc = gen_string(c, s, path, &b); break;
            case T_ARR: rc = gen_array(c, s, path, &b); break;
            case T_OBJ: rc = gen_object(c, s, path, &b); break;
            }
            if (rc) goto done;
        }
    }
    if (nullable) grammar_buf_puts(&b, " | \"null\"");
    if (b.failed) {
        rc = fail(c, GRAMMAR_ENOMEM, path, "out of memory%s", "");
        goto done;
    }
    grammar_buf_printf(&c->out, "%s ::= %s\n", name, b.data);
done:
    free(b.data);
    c->depth--;
    return rc ? rc : c->err;
}

static void put_core(grammar_buf *out, uint32_t used) {
    if (used & U_VALUE) used |= U_WS | U_STRING | U_CHAR | U_NUMBER | U_INTEGER;
    if (used & U_STRING) used |= U_CHAR;
    if (used & U_NUMBER) used |= U_INTEGER;
    if (used & U_WS) grammar_buf_puts(out, CORE_WS);
    if (used & U_STRING) grammar_buf_puts(out, CORE_STRING);
    if (used & U_INTEGER) grammar_buf_puts(out, CORE_INTEGER);
    if (used & U_NUMBER) grammar_buf_puts(out, CORE_NUMBER);
    if (used & U_VALUE) grammar_buf_puts(out, CORE_VALUE);
}

int grammar_schema_rules(grammar_buf *out, json_t *schema, const char *prefix, char *name,
                         uint32_t *used) {
    sctx c = {0};
    c.root = schema;
    c.prefix = prefix;
    c.out = *out;
    int rc = gen(&c, schema, "", name);
    *out = c.out;
    *used |= c.used;
    free(c.refs);
    return rc;
}

void grammar_schema_core(grammar_buf *out, uint32_t used) {
    put_core(out, used);
}

int grammar_schema_to_gbnf(char **out, const char *schema_json, size_t len) {
    if (!out || !schema_json) return grammar_err(GRAMMAR_EINVAL, "NULL argument");
    *out = NULL;
    json_error_t e;
    json_t *root = json_loadb(schema_json, len, JSON_DECODE_ANY, &e);
    if (!root)
        return grammar_err(GRAMMAR_EINVAL, "schema JSON %d:%d: %s", e.line, e.column, e.text);
    grammar_buf b = {0};
    uint32_t used = 0;
    char top[64];
    int rc = grammar_schema_rules(&b, root, NULL, top, &used);
    if (!rc) {
        grammar_buf_printf(&b, "root ::= %s\n", top);
        put_core(&b, used);
        if (b.failed) rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
    }
    json_decref(root);
    if (rc) {
        free(b.data);
        return rc;
    }
    *out = b.data;
    return 0;
}

int grammar_new_json_schema(grammar **out, const char *schema_json, size_t len) {
    if (!out) return grammar_err(GRAMMAR_EINVAL, "out is NULL");
    *out = NULL;
    char *text;
    int rc = grammar_schema_to_gbnf(&text, schema_json, len);
    if (rc) return rc;
    rc = grammar_new_gbnf(out, text, strlen(text), "root");
    if (rc) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", grammar_error_last());
        if (rc == GRAMMAR_ELIMIT) /* a size limit is the schema's doing, not ours */
            grammar_err(rc, "schema too complex: %s", msg);
        else
            grammar_err(rc, "internal: the grammar made from the schema does not compile: %s", msg);
    }
    free(text);
    return rc;
}
