/* Chat templates: the evaluator. Semantics follow @huggingface/jinja 0.5.11 (what our fixtures
 * are generated with), including its JavaScript-isms: numbers are doubles with an integer/float
 * tag, string lengths and indices count UTF-16 units, `==` is JavaScript's loose equality,
 * strip/lstrip/rstrip ignore their argument and trim all Unicode whitespace. Anything the
 * reference would answer with a crash or an exception is an error here, with a position. */
#include "template_case.h"
#include "template_value.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { R_OK = 0, R_BREAK = 1, R_CONTINUE = 2 };

#define MAX_CALL_DEPTH 100
#define MAX_EVAL_DEPTH 400

typedef struct scope scope;
struct scope {
    scope *parent;
    tpl_obj vars;
};

typedef struct {
    tpl_arena *A;
    const agent_template *T;
    int depth;  /* macro calls in progress */
    int edepth; /* evaluator recursion (expressions and blocks), bounded to protect the stack */
    uint64_t steps, max_steps;
} ctx;

static int rerr(ctx *c, const tpl_node *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int rerr(ctx *c, const tpl_node *n, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tpl_errf(c->T->src, c->T->src_len, n ? n->pos : c->T->src_len, "%s", msg);
}

#define TRY(x)                                                                             \
    do {                                                                                   \
        int rc_ = (x);                                                                     \
        if (rc_) return rc_;                                                               \
    } while (0)
#define OOM() agent_err(AGENT_ENOMEM, "template: out of memory (render limit reached)")

static const char *const TYPE_NAMES[] = {
    "UndefinedValue", "NullValue",   "BooleanValue",  "IntegerValue",
    "FloatValue",     "StringValue", "ArrayValue",    "TupleValue",
    "ObjectValue",    "KeywordArgumentsValue",        "NamespaceValue", "FunctionValue",
};

static const char *tname(const tpl_val *v) {
    return TYPE_NAMES[v->t];
}

/* ----- constructors ----- */
static tpl_val v_undef(void) {
    tpl_val v = {0};
    return v;
}
static tpl_val v_null(void) {
    tpl_val v = {0};
    v.t = V_NULL;
    return v;
}
static tpl_val v_bool(bool b) {
    tpl_val v = {0};
    v.t = V_BOOL;
    v.b = b;
    return v;
}
static tpl_val v_int(double n) {
    tpl_val v = {0};
    v.t = V_INT;
    v.n = n;
    return v;
}
static tpl_val v_float(double n) {
    tpl_val v = {0};
    v.t = V_FLOAT;
    v.n = n;
    return v;
}
static tpl_val v_str(const char *p, size_t len) {
    tpl_val v = {0};
    v.t = V_STR;
    v.s.p = p ? p : "";
    v.s.len = len;
    return v;
}
static tpl_val v_sb(const tpl_sb *b) {
    return v_str(b->p, b->len);
}
static bool is_num(const tpl_val *v) {
    return v->t == V_INT || v->t == V_FLOAT;
}
static bool is_arr(const tpl_val *v) {
    return v->t == V_ARRAY || v->t == V_TUPLE;
}
static bool is_mapping(const tpl_val *v) {
    return v->t == V_OBJECT || v->t == V_KWARGS;
}
static bool str_eq(tpl_str a, const char *b) {
    return a.len == strlen(b) && !memcmp(a.p, b, a.len);
}
static bool str_same(tpl_str a, tpl_str b) {
    return a.len == b.len && !memcmp(a.p, b.p, a.len);
}

static tpl_arr *arr_new(ctx *c, size_t n) {
    tpl_arr *a = tpl_alloc(c->A, sizeof *a);
    if (!a) return NULL;
    a->n = n;
    a->v = n ? tpl_alloc(c->A, n * sizeof *a->v) : NULL;
    if (n && !a->v) return NULL;
    return a;
}
static tpl_val v_arr(tpl_arr *a) {
    tpl_val v = {0};
    v.t = V_ARRAY;
    v.a = a;
    return v;
}
static tpl_obj *obj_new(ctx *c) {
    return tpl_alloc(c->A, sizeof(tpl_obj));
}
static tpl_obj *obj_new_cap(ctx *c, size_t cap) {
    tpl_obj *o = obj_new(c);
    if (!o) return NULL;
    o->k = tpl_alloc(c->A, cap * sizeof *o->k);
    o->v = tpl_alloc(c->A, cap * sizeof *o->v);
    if (!o->k || !o->v) return NULL;
    o->cap = cap;
    return o;
}
static tpl_val v_obj(tpl_vt t, tpl_obj *o) {
    tpl_val v = {0};
    v.t = t;
    v.o = o;
    return v;
}
static tpl_val *obj_get(const tpl_obj *o, tpl_str k) {
    for (size_t i = 0; i < o->n; i++)
        if (str_same(o->k[i], k)) return &o->v[i];
    return NULL;
}
static int obj_set(ctx *c, tpl_obj *o, tpl_str k, tpl_val v) {
    tpl_val *old = obj_get(o, k);
    if (old) {
        *old = v;
        return 0;
    }
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 8;
        tpl_str *nk = tpl_alloc(c->A, cap * sizeof *nk);
        tpl_val *nv = tpl_alloc(c->A, cap * sizeof *nv);
        if (!nk || !nv) return OOM();
        if (o->n) {
            memcpy(nk, o->k, o->n * sizeof *nk);
            memcpy(nv, o->v, o->n * sizeof *nv);
        }
        o->k = nk;
        o->v = nv;
        o->cap = cap;
    }
    o->k[o->n] = k;
    o->v[o->n++] = v;
    return 0;
}
static int obj_set_c(ctx *c, tpl_obj *o, const char *k, tpl_val v) {
    tpl_str s = {k, strlen(k)};
    return obj_set(c, o, s, v);
}
static tpl_fn *fn_new(ctx *c, tpl_fn_kind k, const char *name) {
    tpl_fn *f = tpl_alloc(c->A, sizeof *f);
    if (f) {
        f->k = k;
        f->name = name;
    }
    return f;
}
static tpl_val v_fn(tpl_fn *f) {
    tpl_val v = {0};
    v.t = V_FUNC;
    v.f = f;
    return v;
}

/* ----- scopes ----- */
static scope *scope_new(ctx *c, scope *parent) {
    scope *s = tpl_alloc(c->A, sizeof *s);
    if (s) s->parent = parent;
    return s;
}
static int scope_set(ctx *c, scope *s, tpl_str k, tpl_val v) {
    return obj_set(c, &s->vars, k, v);
}
static tpl_val lookup(const scope *s, tpl_str k) {
    for (; s; s = s->parent) {
        const tpl_val *v = obj_get(&s->vars, k);
        if (v) return *v;
    }
    return v_undef();
}

/* ----- truthiness ----- */
static bool truthy(const tpl_val *v) {
    switch (v->t) {
    case V_UNDEF: case V_NULL: return false;
    case V_BOOL: return v->b;
    case V_INT: case V_FLOAT: return v->n != 0 && !isnan(v->n);
    case V_STR: return v->s.len > 0;
    case V_ARRAY: case V_TUPLE: return v->a->n > 0;
    case V_OBJECT: case V_KWARGS: return v->o->n > 0;
    case V_NS: case V_FUNC: return true;
    }
    return false;
}

/* ----- UTF-16 view of strings ----- */
static size_t u16_len(tpl_str s) {
    size_t n = 0;
    for (size_t i = 0; i < s.len;) {
        uint32_t cp;
        i += tpl_utf8_decode(s.p, s.len, i, &cp);
        n += cp >= 0x10000 ? 2 : 1;
    }
    return n;
}

/* Code points of s as (offset, length) pairs in the arena. */
static int codepoints(ctx *c, tpl_str s, size_t **off, size_t **len, size_t *n) {
    size_t cnt = 0;
    for (size_t i = 0; i < s.len; cnt++) {
        uint32_t cp;
        i += tpl_utf8_decode(s.p, s.len, i, &cp);
    }
    *off = tpl_alloc(c->A, (cnt + 1) * sizeof(size_t));
    *len = tpl_alloc(c->A, (cnt + 1) * sizeof(size_t));
    if (!*off || !*len) return OOM();
    size_t k = 0;
    for (size_t i = 0; i < s.len; k++) {
        uint32_t cp;
        size_t l = tpl_utf8_decode(s.p, s.len, i, &cp);
        (*off)[k] = i;
        (*len)[k] = l;
        i += l;
    }
    *n = cnt;
    return 0;
}

static size_t trim_start(tpl_str s) {
    size_t i = 0;
    while (i < s.len) {
        uint32_t cp;
        size_t k = tpl_utf8_decode(s.p, s.len, i, &cp);
        if (!tpl_is_js_space(cp)) break;
        i += k;
    }
    return i;
}
static size_t trim_end(tpl_str s, size_t start) {
    size_t len = s.len;
    while (len > start) {
        size_t st = len - 1;
        while (st > start && ((unsigned char)s.p[st] & 0xC0) == 0x80) st--;
        uint32_t cp;
        size_t k = tpl_utf8_decode(s.p, len, st, &cp);
        if (st + k != len || !tpl_is_js_space(cp)) break;
        len = st;
    }
    return len;
}
static tpl_val js_trim(tpl_str s, bool start, bool end) {
    size_t a = start ? trim_start(s) : 0;
    size_t b = end ? trim_end(s, a) : s.len;
    return v_str(s.p + a, b - a);
}

/* ----- numbers as JavaScript prints them ----- */
static void js_num(tpl_sb *b, double d) {
    if (isnan(d)) {
        tpl_sb_puts(b, "NaN");
        return;
    }
    if (isinf(d)) {
        tpl_sb_puts(b, d < 0 ? "-Infinity" : "Infinity");
        return;
    }
    if (d == 0) {
        tpl_sb_putc(b, '0');
        return;
    }
    if (d < 0) {
        tpl_sb_putc(b, '-');
        d = -d;
    }
    char buf[40];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, d);
        if (strtod(buf, NULL) == d) break;
    }
    /* buf = D[.DDD]e[+-]XX */
    char digits[24];
    int k = 0;
    const char *q = buf;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9') digits[k++] = *q;
    int e = atoi(q + 1);
    while (k > 1 && digits[k - 1] == '0') k--;
    int n = e + 1;
    char out[64];
    int o = 0;
    if (k <= n && n <= 21) {
        memcpy(out, digits, (size_t)k);
        o = k;
        for (int i = 0; i < n - k; i++) out[o++] = '0';
    } else if (0 < n && n <= 21) {
        memcpy(out, digits, (size_t)n);
        o = n;
        out[o++] = '.';
        memcpy(out + o, digits + n, (size_t)(k - n));
        o += k - n;
    } else if (-6 < n && n <= 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int i = 0; i < -n; i++) out[o++] = '0';
        memcpy(out + o, digits, (size_t)k);
        o += k;
    } else {
        out[o++] = digits[0];
        if (k > 1) {
            out[o++] = '.';
            memcpy(out + o, digits + 1, (size_t)(k - 1));
            o += k - 1;
        }
        o += snprintf(out + o, sizeof out - (size_t)o, "e%c%d", n - 1 < 0 ? '-' : '+',
                      abs(n - 1));
    }
    tpl_sb_put(b, out, (size_t)o);
}

static void float_str(tpl_sb *b, double d) {
    if (d == 0 && signbit(d)) {
        tpl_sb_puts(b, "-0.0");
    } else if (isfinite(d) && fmod(d, 1.0) == 0 && fabs(d) < 1e21) {
        char buf[64];
        snprintf(buf, sizeof buf, "%.1f", d);
        tpl_sb_puts(b, buf);
    } else {
        js_num(b, d);
    }
}

static bool js_is_integer(double d) {
    return isfinite(d) && floor(d) == d;
}

/* ----- JSON (JSON.stringify + the reference's toJSON) ----- */
typedef struct {
    int indent; /* < 0: none */
    bool ascii;
    const char *item_sep, *key_sep;
    size_t item_len, key_len;
    bool undef_null;
} json_opts;

static void json_str(tpl_sb *b, tpl_str s, bool ascii) {
    tpl_sb_putc(b, '"');
    for (size_t i = 0; i < s.len;) {
        unsigned char ch = (unsigned char)s.p[i];
        if (ch < 0x80) {
            char esc[8];
            switch (ch) {
            case '"': tpl_sb_puts(b, "\\\""); break;
            case '\\': tpl_sb_puts(b, "\\\\"); break;
            case '\b': tpl_sb_puts(b, "\\b"); break;
            case '\f': tpl_sb_puts(b, "\\f"); break;
            case '\n': tpl_sb_puts(b, "\\n"); break;
            case '\r': tpl_sb_puts(b, "\\r"); break;
            case '\t': tpl_sb_puts(b, "\\t"); break;
            default:
                if (ch < 0x20 || (ascii && ch == 0x7F)) {
                    snprintf(esc, sizeof esc, "\\u%04x", ch);
                    tpl_sb_puts(b, esc);
                } else {
                    tpl_sb_putc(b, (char)ch);
                }
            }
            i++;
            continue;
        }
        uint32_t cp;
        size_t k = tpl_utf8_decode(s.p, s.len, i, &cp);
        if (ascii) {
            char esc[16];
            if (cp >= 0x10000) {
                uint32_t v = cp - 0x10000;
                snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (v >> 10),
                         0xDC00 + (v & 0x3FF));
            } else {
                snprintf(esc, sizeof esc, "\\u%04x", cp);
            }
            tpl_sb_puts(b, esc);
        } else {
            tpl_sb_put(b, s.p + i, k);
        }
        i += k;
    }
    tpl_sb_putc(b, '"');
}

static void put_pad(tpl_sb *b, int indent, int depth) {
    tpl_sb_putc(b, '\n');
    for (int i = 0; i < indent * depth; i++) tpl_sb_putc(b, ' ');
}

static int to_json(ctx *c, const tpl_node *at, tpl_sb *b, const tpl_val *v, const json_opts *o,
                   int depth) {
    if (depth > 512) return rerr(c, at, "tojson: value nested too deeply");
    switch (v->t) {
    case V_NULL: tpl_sb_puts(b, "null"); return 0;
    case V_UNDEF: tpl_sb_puts(b, o->undef_null ? "null" : "undefined"); return 0;
    case V_INT: case V_FLOAT:
        if (!isfinite(v->n)) tpl_sb_puts(b, "null");
        else js_num(b, v->n);
        return 0;
    case V_BOOL: tpl_sb_puts(b, v->b ? "true" : "false"); return 0;
    case V_STR: json_str(b, v->s, o->ascii); return 0;
    case V_TUPLE: return rerr(c, at, "cannot convert a tuple to JSON");
    case V_ARRAY: {
        bool ind = o->indent > 0 && v->a->n > 0;
        tpl_sb_putc(b, '[');
        for (size_t i = 0; i < v->a->n; i++) {
            if (i) tpl_sb_put(b, o->item_sep, o->item_len);
            if (ind) put_pad(b, o->indent, depth + 1);
            TRY(to_json(c, at, b, &v->a->v[i], o, depth + 1));
        }
        if (ind) put_pad(b, o->indent, depth);
        tpl_sb_putc(b, ']');
        return 0;
    }
    case V_OBJECT: case V_KWARGS: case V_NS: {
        bool ind = o->indent > 0 && v->o->n > 0;
        tpl_sb_putc(b, '{');
        for (size_t i = 0; i < v->o->n; i++) {
            if (i) tpl_sb_put(b, o->item_sep, o->item_len);
            if (ind) put_pad(b, o->indent, depth + 1);
            json_str(b, v->o->k[i], o->ascii);
            tpl_sb_put(b, o->key_sep, o->key_len);
            TRY(to_json(c, at, b, &v->o->v[i], o, depth + 1));
        }
        if (ind) put_pad(b, o->indent, depth);
        tpl_sb_putc(b, '}');
        return 0;
    }
    case V_FUNC: return rerr(c, at, "cannot convert a function to JSON");
    }
    return 0;
}

static const json_opts JSON_DEFAULT = {-1, false, ", ", ": ", 2, 2, true};

/* RuntimeValue.toString() of the reference: what {{ v }} prints. */
static int to_string(ctx *c, const tpl_node *at, tpl_sb *b, const tpl_val *v) {
    switch (v->t) {
    /* the reference's NullValue holds JavaScript undefined, so it prints like undefined */
    case V_UNDEF: case V_NULL: tpl_sb_puts(b, "undefined"); return 0;
    case V_BOOL: tpl_sb_puts(b, v->b ? "true" : "false"); return 0;
    case V_INT: js_num(b, v->n); return 0;
    case V_FLOAT: float_str(b, v->n); return 0;
    case V_STR: tpl_sb_put(b, v->s.p, v->s.len); return 0;
    case V_FUNC: return rerr(c, at, "cannot print a function");
    default: {
        json_opts o = JSON_DEFAULT;
        o.undef_null = false;
        return to_json(c, at, b, v, &o, 0);
    }
    }
}

/* JavaScript's String(value.value): what `+` and `~` concatenate. */
static int js_value_str(ctx *c, const tpl_node *at, tpl_sb *b, const tpl_val *v) {
    switch (v->t) {
    case V_INT: case V_FLOAT: js_num(b, v->n); return 0;
    case V_ARRAY: case V_TUPLE:
        for (size_t i = 0; i < v->a->n; i++) {
            if (i) tpl_sb_putc(b, ',');
            TRY(to_string(c, at, b, &v->a->v[i]));
        }
        return 0;
    case V_OBJECT: case V_KWARGS: case V_NS: tpl_sb_puts(b, "[object Map]"); return 0;
    default: return to_string(c, at, b, v);
    }
}

/* Array.prototype.join over the items' .value (the `join` filter). */
static int js_join_item(ctx *c, const tpl_node *at, tpl_sb *b, const tpl_val *v) {
    if (v->t == V_NULL || v->t == V_UNDEF) return 0;
    return js_value_str(c, at, b, v);
}

/* ----- JavaScript equality ----- */
typedef struct {
    int k; /* 0 undefined (also NullValue), 2 bool, 3 number, 4 string, 5 object */
    bool b;
    double n;
    tpl_str s;
    const void *ref;
    const tpl_val *v;
} jsprim;

static jsprim to_prim(const tpl_val *v) {
    jsprim p = {0};
    p.v = v;
    switch (v->t) {
    case V_UNDEF: case V_NULL: p.k = 0; break; /* both hold JavaScript undefined */
    case V_BOOL: p.k = 2; p.b = v->b; break;
    case V_INT: case V_FLOAT: p.k = 3; p.n = v->n; break;
    case V_STR: p.k = 4; p.s = v->s; break;
    case V_ARRAY: case V_TUPLE: p.k = 5; p.ref = v->a; break;
    case V_OBJECT: case V_KWARGS: case V_NS: p.k = 5; p.ref = v->o; break;
    case V_FUNC: p.k = 5; p.ref = v->f; break;
    }
    return p;
}

/* Number(string) */
static double js_to_number(tpl_str s) {
    size_t a = trim_start(s), e = trim_end(s, a);
    if (a == e) return 0;
    char buf[128];
    size_t len = e - a;
    if (len >= sizeof buf) return NAN;
    memcpy(buf, s.p + a, len);
    buf[len] = 0;
    const char *p = buf;
    if (!strcmp(p, "Infinity") || !strcmp(p, "+Infinity")) return INFINITY;
    if (!strcmp(p, "-Infinity")) return -INFINITY;
    if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X' || p[1] == 'o' || p[1] == 'O' || p[1] == 'b' ||
                        p[1] == 'B')) {
        int base = (p[1] == 'x' || p[1] == 'X') ? 16 : (p[1] == 'o' || p[1] == 'O') ? 8 : 2;
        double v = 0;
        if (!p[2]) return NAN;
        for (const char *q = p + 2; *q; q++) {
            int d = (*q >= '0' && *q <= '9') ? *q - '0'
                    : (*q >= 'a' && *q <= 'f') ? *q - 'a' + 10
                    : (*q >= 'A' && *q <= 'F') ? *q - 'A' + 10
                                               : 99;
            if (d >= base) return NAN;
            v = v * base + d;
        }
        return v;
    }
    /* [+-]? (digits [. digits?] | . digits) ([eE][+-]?digits)? */
    const char *q = p;
    if (*q == '+' || *q == '-') q++;
    int nd = 0;
    while (*q >= '0' && *q <= '9') q++, nd++;
    if (*q == '.') {
        q++;
        while (*q >= '0' && *q <= '9') q++, nd++;
    }
    if (!nd) return NAN;
    if (*q == 'e' || *q == 'E') {
        q++;
        if (*q == '+' || *q == '-') q++;
        int ne = 0;
        while (*q >= '0' && *q <= '9') q++, ne++;
        if (!ne) return NAN;
    }
    if (*q) return NAN;
    return strtod(p, NULL);
}

static int js_loose_eq(ctx *c, const tpl_node *at, jsprim x, jsprim y, bool *out, int depth) {
    if (depth > 4) {
        *out = false;
        return 0;
    }
    if (x.k == y.k) {
        switch (x.k) {
        case 0: case 1: *out = true; break;
        case 2: *out = x.b == y.b; break;
        case 3: *out = x.n == y.n; break;
        case 4: *out = str_same(x.s, y.s); break;
        default: *out = x.ref == y.ref;
        }
        return 0;
    }
    if (x.k <= 1 || y.k <= 1) {
        *out = x.k <= 1 && y.k <= 1;
        return 0;
    }
    if (x.k == 3 && y.k == 4) {
        *out = x.n == js_to_number(y.s);
        return 0;
    }
    if (x.k == 4 && y.k == 3) {
        *out = js_to_number(x.s) == y.n;
        return 0;
    }
    if (x.k == 2) {
        x.k = 3;
        x.n = x.b ? 1 : 0;
        return js_loose_eq(c, at, x, y, out, depth + 1);
    }
    if (y.k == 2) {
        y.k = 3;
        y.n = y.b ? 1 : 0;
        return js_loose_eq(c, at, x, y, out, depth + 1);
    }
    /* object vs number/string: ToPrimitive(object) */
    jsprim *o = x.k == 5 ? &x : &y;
    if (o->v->t == V_FUNC) {
        *out = false;
        return 0;
    }
    tpl_sb b;
    tpl_sb_init(&b, c->A);
    TRY(js_value_str(c, at, &b, o->v));
    if (b.oom) return OOM();
    o->k = 4;
    o->s.p = b.p ? b.p : "";
    o->s.len = b.len;
    return js_loose_eq(c, at, x, y, out, depth + 1);
}

static bool js_strict_eq(const tpl_val *a, const tpl_val *b) {
    jsprim x = to_prim(a), y = to_prim(b);
    if (x.k != y.k) return false;
    switch (x.k) {
    case 0: case 1: return true;
    case 2: return x.b == y.b;
    case 3: return x.n == y.n;
    case 4: return str_same(x.s, y.s);
    default: return x.ref == y.ref;
    }
}

/* ----- comparisons for sort/dictsort ----- */
static int case_map(ctx *c, tpl_str s, int mode, tpl_val *out);
static int utf16_cmp(tpl_str a, tpl_str b) {
    size_t i = 0, j = 0;
    while (i < a.len && j < b.len) {
        uint32_t x, y;
        i += tpl_utf8_decode(a.p, a.len, i, &x);
        j += tpl_utf8_decode(b.p, b.len, j, &y);
        /* compare the first UTF-16 unit, then the second */
        uint32_t x1 = x >= 0x10000 ? 0xD800 + ((x - 0x10000) >> 10) : x;
        uint32_t y1 = y >= 0x10000 ? 0xD800 + ((y - 0x10000) >> 10) : y;
        if (x1 != y1) return x1 < y1 ? -1 : 1;
        if (x != y) return x < y ? -1 : 1;
    }
    if (i < a.len) return 1;
    if (j < b.len) return -1;
    return 0;
}

static int compare_values(ctx *c, const tpl_node *at, const tpl_val *a, const tpl_val *b,
                          bool case_sensitive, int *out) {
    if (a->t == V_NULL && b->t == V_NULL) return *out = 0, 0;
    if (a->t == V_NULL || b->t == V_NULL || a->t == V_UNDEF || b->t == V_UNDEF) {
        if (a->t == V_UNDEF && b->t == V_UNDEF) return *out = 0, 0;
        return rerr(c, at, "cannot compare %s with %s", tname(a), tname(b));
    }
    bool an = is_num(a) || a->t == V_BOOL, bn = is_num(b) || b->t == V_BOOL;
    if (an && bn) {
        double x = a->t == V_BOOL ? a->b : a->n, y = b->t == V_BOOL ? b->b : b->n;
        *out = x < y ? -1 : x > y ? 1 : 0;
        return 0;
    }
    if (a->t != b->t) return rerr(c, at, "cannot compare %s and %s", tname(a), tname(b));
    if (a->t != V_STR) return rerr(c, at, "cannot compare type %s", tname(a));
    tpl_str x = a->s, y = b->s;
    if (!case_sensitive) {
        tpl_val lx, ly;
        TRY(case_map(c, x, 1, &lx));
        TRY(case_map(c, y, 1, &ly));
        x = lx.s;
        y = ly.s;
    }
    *out = utf16_cmp(x, y);
    return 0;
}

/* Stable merge sort with a fallible comparator. */
typedef struct {
    ctx *c;
    const tpl_node *at;
    bool case_sensitive, reverse;
    const tpl_val *keys; /* parallel to the items being sorted */
} sort_ctx;

static int merge_sort(sort_ctx *s, size_t *idx, size_t *tmp, size_t n) {
    if (n < 2) return 0;
    size_t h = n / 2;
    TRY(merge_sort(s, idx, tmp, h));
    TRY(merge_sort(s, idx + h, tmp, n - h));
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int r = 0;
        TRY(compare_values(s->c, s->at, &s->keys[idx[j]], &s->keys[idx[i]], s->case_sensitive,
                           &r));
        if (s->reverse) r = -r;
        if (r < 0) tmp[k++] = idx[j++];
        else tmp[k++] = idx[i++];
    }
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
    return 0;
}

static int sort_by_keys(ctx *c, const tpl_node *at, const tpl_val *items, const tpl_val *keys,
                        size_t n, bool cs, bool rev, tpl_arr **out) {
    size_t *idx = tpl_alloc(c->A, (n + 1) * sizeof *idx);
    size_t *tmp = tpl_alloc(c->A, (n + 1) * sizeof *tmp);
    tpl_arr *r = arr_new(c, n);
    if (!idx || !tmp || !r) return OOM();
    for (size_t i = 0; i < n; i++) idx[i] = i;
    sort_ctx s = {c, at, cs, rev, keys};
    TRY(merge_sort(&s, idx, tmp, n));
    for (size_t i = 0; i < n; i++) r->v[i] = items[idx[i]];
    *out = r;
    return 0;
}

/* ----- evaluation ----- */
static int ev(ctx *c, scope *sc, const tpl_node *n, tpl_val *out);
static int ev_block(ctx *c, scope *sc, tpl_node *const *list, size_t n, tpl_sb *out);

static int step(ctx *c, const tpl_node *n) {
    if (++c->steps > c->max_steps)
        return rerr(c, n, "evaluation budget exceeded (%llu steps)",
                    (unsigned long long)c->max_steps);
    return 0;
}

typedef struct {
    tpl_val *pos;
    size_t npos;
    tpl_obj *kw; /* NULL when none */
} argv_t;

static int ev_args(ctx *c, scope *sc, tpl_node *const *list, size_t n, argv_t *out) {
    out->pos = tpl_alloc(c->A, (n + 1) * sizeof(tpl_val));
    if (!out->pos) return OOM();
    out->npos = 0;
    out->kw = NULL;
    for (size_t i = 0; i < n; i++)
        if (list[i]->kind != N_KWARG) TRY(ev(c, sc, list[i], &out->pos[out->npos++]));
    for (size_t i = 0; i < n; i++)
        if (list[i]->kind == N_KWARG) {
            if (!out->kw && !(out->kw = obj_new(c))) return OOM();
            if (obj_get(out->kw, list[i]->s))
                return rerr(c, list[i], "got multiple values for keyword argument '%.*s'",
                            (int)list[i]->s.len, list[i]->s.p);
            tpl_val v;
            TRY(ev(c, sc, list[i]->a, &v));
            TRY(obj_set(c, out->kw, list[i]->s, v));
        }
    return 0;
}

static tpl_val *kwarg(const argv_t *a, const char *name) {
    if (!a->kw) return NULL;
    tpl_str s = {name, strlen(name)};
    return obj_get(a->kw, s);
}

/* args as the reference's function values see them: positional, then a KeywordArguments
 * object when any keyword was given. */
static tpl_val *flat_arg(const argv_t *a, size_t i, tpl_val *tmp) {
    if (i < a->npos) return &a->pos[i];
    if (i == a->npos && a->kw) {
        *tmp = v_obj(V_KWARGS, a->kw);
        return tmp;
    }
    return NULL;
}

static int call_value(ctx *c, scope *sc, const tpl_node *at, const tpl_val *fn, argv_t *a,
                      tpl_val *out);

/* ----- string methods ----- */
static int str_split(ctx *c, const tpl_node *at, tpl_str s, argv_t *a, tpl_val *out) {
    tpl_val tmp0, tmp1;
    tpl_val *sep = flat_arg(a, 0, &tmp0), *mx = flat_arg(a, 1, &tmp1);
    tpl_val nullv = v_null(), m1 = v_int(-1);
    if (!sep) sep = &nullv;
    if (!mx) mx = &m1;
    if (sep->t != V_STR && sep->t != V_NULL)
        return rerr(c, at, "split(): sep argument must be a string or null");
    if (mx->t != V_INT) return rerr(c, at, "split(): maxsplit argument must be a number");
    double maxsplit = mx->n;
    size_t cap = 16, n = 0;
    tpl_val *items = tpl_alloc(c->A, cap * sizeof *items);
    if (!items) return OOM();
#define PUSH_ITEM(val)                                                                     \
    do {                                                                                   \
        if (n == cap) {                                                                    \
            tpl_val *ni = tpl_alloc(c->A, cap * 2 * sizeof *ni);                           \
            if (!ni) return OOM();                                                         \
            memcpy(ni, items, n * sizeof *ni);                                             \
            items = ni;                                                                    \
            cap *= 2;                                                                      \
        }                                                                                  \
        items[n++] = (val);                                                                \
    } while (0)
    if (sep->t == V_NULL) {
        size_t st = trim_start(s);
        tpl_str text = {s.p + st, s.len - st};
        size_t i = 0;
        while (i < text.len) {
            /* next \S+ run */
            while (i < text.len) {
                uint32_t cp;
                size_t k = tpl_utf8_decode(text.p, text.len, i, &cp);
                if (!tpl_is_js_space(cp)) break;
                i += k;
            }
            if (i >= text.len) break;
            size_t ms = i;
            while (i < text.len) {
                uint32_t cp;
                size_t k = tpl_utf8_decode(text.p, text.len, i, &cp);
                if (tpl_is_js_space(cp)) break;
                i += k;
            }
            if (maxsplit != -1 && (double)n >= maxsplit) {
                PUSH_ITEM(v_str(text.p + ms, text.len - ms));
                break;
            }
            PUSH_ITEM(v_str(text.p + ms, i - ms));
        }
    } else {
        tpl_str d = sep->s;
        if (d.len == 0) return rerr(c, at, "split(): empty separator");
        size_t i = 0, st = 0;
        while (i + d.len <= s.len) {
            if (!memcmp(s.p + i, d.p, d.len)) {
                PUSH_ITEM(v_str(s.p + st, i - st));
                i += d.len;
                st = i;
            } else {
                i++;
            }
        }
        PUSH_ITEM(v_str(s.p + st, s.len - st));
        if (maxsplit != -1 && (double)n > maxsplit) {
            /* splice(maxsplit) and push the rest joined by sep */
            double m = maxsplit;
            size_t keep = m < 0 ? (size_t)((double)n + m > 0 ? (double)n + m : 0) : (size_t)m;
            if (keep > n) keep = n;
            tpl_sb b;
            tpl_sb_init(&b, c->A);
            for (size_t k = keep; k < n; k++) {
                if (k > keep) tpl_sb_put(&b, d.p, d.len);
                tpl_sb_put(&b, items[k].s.p, items[k].s.len);
            }
            if (b.oom) return OOM();
            n = keep;
            PUSH_ITEM(v_sb(&b));
        }
    }
#undef PUSH_ITEM
    tpl_arr *r = arr_new(c, 0);
    if (!r) return OOM();
    r->n = n;
    r->v = items;
    *out = v_arr(r);
    return 0;
}

static int str_replace(ctx *c, const tpl_node *at, tpl_str s, argv_t *a, tpl_val *out) {
    tpl_val tmp;
    if (a->npos + (a->kw ? 1 : 0) < 2) return rerr(c, at, "replace() requires two arguments");
    tpl_val *ov = flat_arg(a, 0, &tmp);
    tpl_val ovv = *ov;
    tpl_val *nv = flat_arg(a, 1, &tmp);
    if (ovv.t != V_STR || nv->t != V_STR) return rerr(c, at, "replace() arguments must be strings");
    tpl_val nvv = *nv;
    tpl_val cnt = v_null();
    if (a->npos + (a->kw ? 1 : 0) > 2) {
        tpl_val *x = flat_arg(a, 2, &tmp);
        if (x->t == V_KWARGS) {
            tpl_str k = {"count", 5};
            tpl_val *cv = obj_get(x->o, k);
            cnt = cv ? *cv : v_null();
        } else {
            cnt = *x;
        }
    }
    if (cnt.t != V_INT && cnt.t != V_NULL)
        return rerr(c, at, "replace() count argument must be a number or null");
    if (cnt.t == V_INT && cnt.n == 0) {
        *out = v_str(s.p, s.len);
        return 0;
    }
    double remaining = (cnt.t == V_NULL || cnt.n < 0) ? INFINITY : cnt.n;
    tpl_sb b;
    tpl_sb_init(&b, c->A);
    tpl_str o = ovv.s, r = nvv.s;
    if (o.len == 0) {
        for (size_t i = 0;; ) {
            if (remaining > 0) {
                tpl_sb_put(&b, r.p, r.len);
                remaining--;
            }
            if (i >= s.len) break;
            uint32_t cp;
            size_t k = tpl_utf8_decode(s.p, s.len, i, &cp);
            tpl_sb_put(&b, s.p + i, k);
            i += k;
        }
    } else {
        size_t i = 0;
        while (i < s.len) {
            if (remaining > 0 && i + o.len <= s.len && !memcmp(s.p + i, o.p, o.len)) {
                tpl_sb_put(&b, r.p, r.len);
                i += o.len;
                remaining--;
            } else {
                tpl_sb_putc(&b, s.p[i]);
                i++;
            }
        }
    }
    if (b.oom) return OOM();
    *out = v_sb(&b);
    return 0;
}

static int str_affix(ctx *c, const tpl_node *at, tpl_str s, argv_t *a, bool start,
                     tpl_val *out) {
    const char *nm = start ? "startswith" : "endswith";
    tpl_val tmp;
    tpl_val *p = flat_arg(a, 0, &tmp);
    if (!p) return rerr(c, at, "%s() requires at least one argument", nm);
    size_t np = 1;
    const tpl_val *pats = p;
    if (is_arr(p)) {
        np = p->a->n;
        pats = p->a->v;
    } else if (p->t != V_STR) {
        return rerr(c, at, "%s() argument must be a string or tuple of strings", nm);
    }
    for (size_t i = 0; i < np; i++) {
        if (pats[i].t != V_STR) return rerr(c, at, "%s() tuple elements must be strings", nm);
        tpl_str x = pats[i].s;
        if (x.len <= s.len && !memcmp(start ? s.p : s.p + s.len - x.len, x.p, x.len)) {
            *out = v_bool(true);
            return 0;
        }
    }
    *out = v_bool(false);
    return 0;
}

static const char *case_lookup(const tpl_case_map *t, size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (t[mid].cp == cp) return t[mid].utf8;
        if (t[mid].cp < cp) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

static bool in_ranges(const tpl_case_range *r, size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid].lo) hi = mid;
        else if (cp > r[mid].hi) lo = mid + 1;
        else return true;
    }
    return false;
}

/* Unicode's Final_Sigma condition for the capital sigma at s[i..i+2): preceded by a cased
 * letter (skipping case-ignorables) and not followed by one. */
static bool final_sigma(tpl_str s, size_t i) {
    bool before = false;
    for (size_t j = i; j > 0;) {
        size_t st = j - 1;
        while (st > 0 && ((unsigned char)s.p[st] & 0xC0) == 0x80) st--;
        uint32_t cp;
        tpl_utf8_decode(s.p, s.len, st, &cp);
        j = st;
        if (in_ranges(tpl_case_ignorable, tpl_case_ignorable_len, cp)) continue;
        before = in_ranges(tpl_cased, tpl_cased_len, cp);
        break;
    }
    if (!before) return false;
    for (size_t j = i + 2; j < s.len;) {
        uint32_t cp;
        j += tpl_utf8_decode(s.p, s.len, j, &cp);
        if (in_ranges(tpl_case_ignorable, tpl_case_ignorable_len, cp)) continue;
        return !in_ranges(tpl_cased, tpl_cased_len, cp);
    }
    return true;
}

static bool ascii_word(char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_';
}

/* JavaScript case mapping. mode 0: toUpperCase, 1: toLowerCase (with the final sigma rule),
 * 2: the reference's title (/\b\w/ upper-cased: ASCII only), 3: capitalize (first UTF-16 unit
 * upper-cased, the rest as is). */
static int case_map(ctx *c, tpl_str s, int mode, tpl_val *out) {
    tpl_sb b;
    tpl_sb_init(&b, c->A);
    for (size_t i = 0; i < s.len;) {
        uint32_t cp;
        size_t k = tpl_utf8_decode(s.p, s.len, i, &cp);
        bool up = mode == 0 || (mode == 3 && i == 0) ||
                  (mode == 2 && ascii_word(s.p[i]) && (i == 0 || !ascii_word(s.p[i - 1])));
        bool low = mode == 1;
        if (cp < 0x80) {
            char ch = s.p[i];
            if (up && ch >= 'a' && ch <= 'z') ch = (char)(ch - 32);
            if (low && ch >= 'A' && ch <= 'Z') ch = (char)(ch + 32);
            tpl_sb_putc(&b, ch);
        } else {
            const char *m = NULL;
            /* capitalize upper-cases a UTF-16 unit: half of a pair maps to itself */
            if (up && (mode == 0 || (mode == 3 && cp < 0x10000)))
                m = case_lookup(tpl_case_upper, tpl_case_upper_len, cp);
            if (low) m = cp == 0x3A3 && final_sigma(s, i)
                             ? "\xcf\x82"
                             : case_lookup(tpl_case_lower, tpl_case_lower_len, cp);
            if (m) tpl_sb_puts(&b, m);
            else tpl_sb_put(&b, s.p + i, k);
        }
        i += k;
    }
    if (b.oom) return OOM();
    *out = v_sb(&b);
    return 0;
}

static int str_method(ctx *c, const tpl_node *at, const tpl_fn *f, argv_t *a, tpl_val *out) {
    tpl_str s = f->self.s;
    const char *m = f->name;
    if (!strcmp(m, "upper")) return case_map(c, s, 0, out);
    if (!strcmp(m, "lower")) return case_map(c, s, 1, out);
    if (!strcmp(m, "title")) return case_map(c, s, 2, out);
    if (!strcmp(m, "capitalize")) return case_map(c, s, 3, out);
    if (!strcmp(m, "strip")) return *out = js_trim(s, true, true), 0;
    if (!strcmp(m, "lstrip")) return *out = js_trim(s, true, false), 0;
    if (!strcmp(m, "rstrip")) return *out = js_trim(s, false, true), 0;
    if (!strcmp(m, "startswith")) return str_affix(c, at, s, a, true, out);
    if (!strcmp(m, "endswith")) return str_affix(c, at, s, a, false, out);
    if (!strcmp(m, "split")) return str_split(c, at, s, a, out);
    if (!strcmp(m, "replace")) return str_replace(c, at, s, a, out);
    return rerr(c, at, "unknown string method %s", m);
}

static const char *const STR_METHODS[] = {"upper", "lower", "strip", "title", "capitalize",
                                          "rstrip", "lstrip", "startswith", "endswith",
                                          "split", "replace", NULL};
static const char *const OBJ_METHODS[] = {"get", "items", "keys", "values", "dictsort", NULL};

static const char *find_name(const char *const *names, tpl_str s) {
    for (; *names; names++)
        if (str_eq(s, *names)) return *names;
    return NULL;
}

/* ----- object methods ----- */
static int obj_items(ctx *c, const tpl_obj *o, tpl_val *out) {
    tpl_arr *r = arr_new(c, o->n);
    if (!r) return OOM();
    for (size_t i = 0; i < o->n; i++) {
        tpl_arr *pair = arr_new(c, 2);
        if (!pair) return OOM();
        pair->v[0] = v_str(o->k[i].p, o->k[i].len);
        pair->v[1] = o->v[i];
        r->v[i] = v_arr(pair);
    }
    *out = v_arr(r);
    return 0;
}

static int obj_keys(ctx *c, const tpl_obj *o, tpl_val *out) {
    tpl_arr *r = arr_new(c, o->n);
    if (!r) return OOM();
    for (size_t i = 0; i < o->n; i++) r->v[i] = v_str(o->k[i].p, o->k[i].len);
    *out = v_arr(r);
    return 0;
}

static int obj_method(ctx *c, const tpl_node *at, const tpl_fn *f, argv_t *a, tpl_val *out) {
    const tpl_obj *o = f->self.o;
    const char *m = f->name;
    tpl_val tmp;
    if (!strcmp(m, "get")) {
        tpl_val *k = flat_arg(a, 0, &tmp);
        if (!k || k->t != V_STR)
            return rerr(c, at, "object key must be a string: got %s",
                        k ? tname(k) : "UndefinedValue");
        tpl_val *v = obj_get(o, k->s);
        if (v) return *out = *v, 0;
        tpl_val tmp2;
        tpl_val *d = flat_arg(a, 1, &tmp2);
        *out = d ? *d : v_null();
        return 0;
    }
    if (!strcmp(m, "items")) return obj_items(c, o, out);
    if (!strcmp(m, "keys")) return obj_keys(c, o, out);
    if (!strcmp(m, "values")) {
        tpl_arr *r = arr_new(c, o->n);
        if (!r) return OOM();
        for (size_t i = 0; i < o->n; i++) r->v[i] = o->v[i];
        *out = v_arr(r);
        return 0;
    }
    if (!strcmp(m, "dictsort")) {
        tpl_val fv = v_bool(false), kv = v_str("key", 3);
        tpl_val *cs = a->npos > 0 ? &a->pos[0] : kwarg(a, "case_sensitive");
        tpl_val *by = a->npos > 1 ? &a->pos[1] : kwarg(a, "by");
        tpl_val *rv = a->npos > 2 ? &a->pos[2] : kwarg(a, "reverse");
        if (!cs) cs = &fv;
        if (!by) by = &kv;
        if (!rv) rv = &fv;
        if (cs->t != V_BOOL) return rerr(c, at, "case_sensitive must be a boolean");
        if (by->t != V_STR) return rerr(c, at, "by must be a string");
        if (!str_eq(by->s, "key") && !str_eq(by->s, "value"))
            return rerr(c, at, "by must be either 'key' or 'value'");
        if (rv->t != V_BOOL) return rerr(c, at, "reverse must be a boolean");
        tpl_val items;
        TRY(obj_items(c, o, &items));
        size_t n = items.a->n;
        tpl_val *keys = tpl_alloc(c->A, (n + 1) * sizeof *keys);
        if (!keys) return OOM();
        int which = str_eq(by->s, "key") ? 0 : 1;
        for (size_t i = 0; i < n; i++) keys[i] = items.a->v[i].a->v[which];
        tpl_arr *r;
        TRY(sort_by_keys(c, at, items.a->v, keys, n, cs->b, rv->b, &r));
        *out = v_arr(r);
        return 0;
    }
    return rerr(c, at, "unknown object method %s", m);
}

/* ----- globals ----- */
static int fn_range(ctx *c, const tpl_node *at, argv_t *a, tpl_val *out) {
    if (a->kw || a->npos < 1 || a->npos > 3) return rerr(c, at, "range() takes 1 to 3 numbers");
    for (size_t i = 0; i < a->npos; i++)
        if (!is_num(&a->pos[i])) return rerr(c, at, "range() arguments must be numbers");
    double start = 0, stop, stp = 1;
    if (a->npos == 1) {
        stop = a->pos[0].n;
    } else {
        start = a->pos[0].n;
        stop = a->pos[1].n;
        if (a->npos == 3) stp = a->pos[2].n;
    }
    if (stp == 0) return rerr(c, at, "range() step must not be zero");
    if (isnan(start) || isnan(stop) || isnan(stp)) return rerr(c, at, "range() of NaN");
    double cnt = stp > 0 ? ceil((stop - start) / stp) : ceil((start - stop) / -stp);
    if (!(cnt > 0)) cnt = 0;
    if (cnt > 1e7) return rerr(c, at, "range() too long");
    tpl_arr *r = arr_new(c, (size_t)cnt);
    if (!r) return OOM();
    size_t n = 0;
    for (double x = start; (stp > 0 ? x < stop : x > stop) && n < (size_t)cnt; x += stp)
        r->v[n++] = js_is_integer(x) ? v_int(x) : v_float(x);
    r->n = n;
    *out = v_arr(r);
    return 0;
}

static int fn_namespace(ctx *c, const tpl_node *at, argv_t *a, tpl_val *out) {
    if (a->npos > 1) return rerr(c, at, "namespace expected at most 1 argument");
    tpl_obj *o = obj_new(c);
    if (!o) return OOM();
    if (a->npos == 1) {
        tpl_val *src = &a->pos[0];
        if (is_mapping(src)) {
            for (size_t i = 0; i < src->o->n; i++) TRY(obj_set(c, o, src->o->k[i], src->o->v[i]));
        } else if (is_arr(src)) {
            for (size_t i = 0; i < src->a->n; i++) {
                tpl_val *p = &src->a->v[i];
                if (!is_arr(p) || p->a->n != 2 || p->a->v[0].t != V_STR)
                    return rerr(c, at, "namespace expected an object or [key, value] pairs");
                TRY(obj_set(c, o, p->a->v[0].s, p->a->v[1]));
            }
        } else {
            return rerr(c, at, "'%s' object is not iterable", tname(src));
        }
    }
    if (a->kw)
        for (size_t i = 0; i < a->kw->n; i++) TRY(obj_set(c, o, a->kw->k[i], a->kw->v[i]));
    *out = v_obj(V_NS, o);
    return 0;
}

static int fn_strftime(ctx *c, const tpl_node *at, argv_t *a, tpl_val *out) {
    if (a->npos < 1 || a->pos[0].t != V_STR) return rerr(c, at, "strftime_now() needs a format");
    static const char *const MON[] = {"January", "February", "March", "April", "May", "June",
                                      "July", "August", "September", "October", "November",
                                      "December"};
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    tpl_str f = a->pos[0].s;
    tpl_sb b;
    tpl_sb_init(&b, c->A);
    for (size_t i = 0; i < f.len; i++) {
        char buf[32];
        if (f.p[i] == '%' && i + 1 < f.len && strchr("YmdbBHM%", f.p[i + 1])) {
            switch (f.p[++i]) {
            case 'Y': snprintf(buf, sizeof buf, "%d", tm.tm_year + 1900); break;
            case 'm': snprintf(buf, sizeof buf, "%02d", tm.tm_mon + 1); break;
            case 'd': snprintf(buf, sizeof buf, "%02d", tm.tm_mday); break;
            case 'b': snprintf(buf, sizeof buf, "%.3s", MON[tm.tm_mon]); break;
            case 'B': snprintf(buf, sizeof buf, "%s", MON[tm.tm_mon]); break;
            case 'H': snprintf(buf, sizeof buf, "%02d", tm.tm_hour); break;
            case 'M': snprintf(buf, sizeof buf, "%02d", tm.tm_min); break;
            default: snprintf(buf, sizeof buf, "%%"); break;
            }
            tpl_sb_puts(&b, buf);
        } else {
            tpl_sb_putc(&b, f.p[i]);
        }
    }
    if (b.oom) return OOM();
    *out = v_sb(&b);
    return 0;
}

static int call_macro(ctx *c, scope *sc, const tpl_node *at, const tpl_node *m, argv_t *a,
                      tpl_val *out) {
    if (c->depth >= MAX_CALL_DEPTH) return rerr(c, at, "macro calls nested too deeply");
    scope *ms = scope_new(c, sc);
    if (!ms) return OOM();
    tpl_obj *kw = obj_new(c);
    if (!kw) return OOM();
    if (a->kw)
        for (size_t i = 0; i < a->kw->n; i++) TRY(obj_set(c, kw, a->kw->k[i], a->kw->v[i]));
    bool *pending = tpl_alloc(c->A, m->n + 1);
    if (!pending) return OOM();
    for (size_t i = 0; i < m->n; i++) {
        const tpl_node *p = m->list[i];
        tpl_val v = v_undef();
        bool have = false;
        if (i < a->npos) {
            v = a->pos[i];
            have = true;
        } else {
            for (size_t k = 0; k < kw->n; k++)
                if (str_same(kw->k[k], p->s)) {
                    v = kw->v[k];
                    have = true;
                    memmove(&kw->k[k], &kw->k[k + 1], (kw->n - k - 1) * sizeof *kw->k);
                    memmove(&kw->v[k], &kw->v[k + 1], (kw->n - k - 1) * sizeof *kw->v);
                    kw->n--;
                    break;
                }
        }
        pending[i] = !have && p->kind == N_KWARG;
        TRY(scope_set(c, ms, p->s, v));
    }
    if (m->flag) {
        TRY(scope_set(c, ms, (tpl_str){"kwargs", 6}, v_obj(V_OBJECT, kw)));
    } else if (kw->n > 0) {
        return rerr(c, at, "macro '%.*s' takes no keyword argument '%.*s'", (int)m->s.len,
                    m->s.p, (int)kw->k[0].len, kw->k[0].p);
    }
    if (m->flag2) {
        size_t extra = a->npos > m->n ? a->npos - m->n : 0;
        tpl_arr *va = arr_new(c, extra);
        if (!va) return OOM();
        for (size_t i = 0; i < extra; i++) va->v[i] = a->pos[m->n + i];
        TRY(scope_set(c, ms, (tpl_str){"varargs", 7}, v_arr(va)));
    } else if (a->npos > m->n) {
        return rerr(c, at, "macro '%.*s' takes not more than %zu argument(s)", (int)m->s.len,
                    m->s.p, m->n);
    }
    for (size_t i = 0; i < m->n; i++)
        if (pending[i]) {
            tpl_val v;
            TRY(ev(c, ms, m->list[i]->a, &v));
            TRY(scope_set(c, ms, m->list[i]->s, v));
        }
    tpl_sb b;
    tpl_sb_init(&b, c->A);
    c->depth++;
    int rc = ev_block(c, ms, m->list2, m->n2, &b);
    c->depth--;
    if (rc == R_BREAK || rc == R_CONTINUE)
        return rerr(c, at, "break/continue escaping a macro is not supported");
    if (rc) return rc;
    if (b.oom) return OOM();
    *out = v_sb(&b);
    return 0;
}

static int call_value(ctx *c, scope *sc, const tpl_node *at, const tpl_val *fn, argv_t *a,
                      tpl_val *out) {
    if (fn->t != V_FUNC)
        return rerr(c, at, "cannot call something that is not a function: got %s", tname(fn));
    const tpl_fn *f = fn->f;
    switch (f->k) {
    case FN_MACRO: return call_macro(c, sc, at, f->macro, a, out);
    case FN_STR_METHOD: return str_method(c, at, f, a, out);
    case FN_OBJ_METHOD: return obj_method(c, at, f, a, out);
    case FN_RANGE: return fn_range(c, at, a, out);
    case FN_NAMESPACE: return fn_namespace(c, at, a, out);
    case FN_STRFTIME: return fn_strftime(c, at, a, out);
    case FN_RAISE: {
        tpl_sb b;
        tpl_sb_init(&b, c->A);
        if (a->npos > 0 && a->pos[0].t != V_UNDEF && a->pos[0].t != V_NULL) {
            if (a->pos[0].t == V_STR) tpl_sb_put(&b, a->pos[0].s.p, a->pos[0].s.len);
            else TRY(js_value_str(c, at, &b, &a->pos[0]));
        }
        return rerr(c, at, "raise_exception: %.*s", (int)(b.len > 400 ? 400 : b.len),
                    b.p ? b.p : "");
    }
    }
    return rerr(c, at, "unknown function");
}

/* ----- member access and slices ----- */
static void slice_bounds(double len, const tpl_val *st, const tpl_val *sp, double step,
                         double *start, double *stop) {
    if (step >= 0) {
        double s = st->t == V_UNDEF ? 0 : st->n;
        double e = sp->t == V_UNDEF ? len : sp->n;
        *start = s < 0 ? fmax(len + s, 0) : fmin(s, len);
        *stop = e < 0 ? fmax(len + e, 0) : fmin(e, len);
    } else {
        double s = st->t == V_UNDEF ? len - 1 : st->n;
        double e = sp->t == V_UNDEF ? -1 : sp->n;
        *start = s < 0 ? fmax(len + s, -1) : fmin(s, len - 1);
        *stop = e < -1 ? fmax(len + e, -1) : fmin(e, len - 1);
    }
}

static int ev_slice(ctx *c, scope *sc, const tpl_node *n, const tpl_val *obj, tpl_val *out) {
    if (!is_arr(obj) && obj->t != V_STR)
        return rerr(c, n, "slice object must be an array or string");
    tpl_val st = v_undef(), sp = v_undef(), se = v_undef();
    if (n->a) TRY(ev(c, sc, n->a, &st));
    if (n->b) TRY(ev(c, sc, n->b, &sp));
    if (n->c) TRY(ev(c, sc, n->c, &se));
    if ((st.t != V_INT && st.t != V_UNDEF) || (sp.t != V_INT && sp.t != V_UNDEF) ||
        (se.t != V_INT && se.t != V_UNDEF))
        return rerr(c, n, "slice indices must be integers or undefined");
    double step = se.t == V_UNDEF ? 1 : se.n;
    double dir = step > 0 ? 1 : step < 0 ? -1 : 0;
    size_t len = 0;
    size_t *off = NULL, *clen = NULL;
    if (is_arr(obj)) len = obj->a->n;
    else TRY(codepoints(c, obj->s, &off, &clen, &len));
    double start, stop;
    slice_bounds((double)len, &st, &sp, step, &start, &stop);
    size_t cnt = 0;
    if (dir != 0)
        for (double i = start; dir * i < dir * stop; i += step) cnt++;
    if (is_arr(obj)) {
        tpl_arr *r = arr_new(c, cnt);
        if (!r) return OOM();
        size_t k = 0;
        if (dir != 0)
            for (double i = start; dir * i < dir * stop; i += step)
                r->v[k++] = (i >= 0 && i < (double)len) ? obj->a->v[(size_t)i] : v_undef();
        *out = v_arr(r);
        return 0;
    }
    tpl_sb b;
    tpl_sb_init(&b, c->A);
    if (dir != 0)
        for (double i = start; dir * i < dir * stop; i += step)
            if (i >= 0 && i < (double)len) tpl_sb_put(&b, obj->s.p + off[(size_t)i], clen[(size_t)i]);
    if (b.oom) return OOM();
    *out = v_sb(&b);
    return 0;
}

/* The UTF-16 unit at index i (negative: from the end) as a string; U+FFFD for half a pair. */
static int str_at(ctx *c, tpl_str s, double idx, tpl_val *out) {
    double len = (double)u16_len(s);
    if (idx < 0) idx += len;
    if (idx < 0 || idx >= len || !js_is_integer(idx)) {
        *out = v_undef();
        return 0;
    }
    size_t u = 0;
    for (size_t i = 0; i < s.len;) {
        uint32_t cp;
        size_t k = tpl_utf8_decode(s.p, s.len, i, &cp);
        size_t w = cp >= 0x10000 ? 2 : 1;
        if ((double)(u + w) > idx) {
            if (w == 2) {
                char *p = tpl_alloc(c->A, 4);
                if (!p) return OOM();
                *out = v_str(p, tpl_utf8_encode(0xFFFD, p));
            } else {
                *out = v_str(s.p + i, k);
            }
            return 0;
        }
        u += w;
        i += k;
    }
    *out = v_undef();
    return 0;
}

/* A bound method value (`"x".strip`, `d.items`), or undefined when `m` is NULL. */
static int bound_method(ctx *c, tpl_fn_kind k, const char *m, const tpl_val *self,
                        tpl_val *out) {
    if (!m) return *out = v_undef(), 0;
    tpl_fn *f = fn_new(c, k, m);
    if (!f) return OOM();
    f->self = *self;
    *out = v_fn(f);
    return 0;
}

static int member_get(ctx *c, const tpl_node *at, const tpl_val *obj, const tpl_val *prop,
                      tpl_val *out) {
    if (obj->t == V_OBJECT || obj->t == V_KWARGS || obj->t == V_NS) {
        if (prop->t != V_STR)
            return rerr(c, at, "cannot access property with non-string: got %s", tname(prop));
        tpl_val *v = obj_get(obj->o, prop->s);
        if (v) return *out = *v, 0;
        return bound_method(c, FN_OBJ_METHOD,
                            obj->t != V_NS ? find_name(OBJ_METHODS, prop->s) : NULL, obj, out);
    }
    if (is_arr(obj) || obj->t == V_STR) {
        if (prop->t == V_INT) {
            if (obj->t == V_STR) return str_at(c, obj->s, prop->n, out);
            double i = prop->n < 0 ? prop->n + (double)obj->a->n : prop->n;
            *out = (i >= 0 && i < (double)obj->a->n && js_is_integer(i)) ? obj->a->v[(size_t)i]
                                                                         : v_undef();
            return 0;
        }
        if (prop->t == V_STR) {
            if (str_eq(prop->s, "length")) {
                *out = v_int(is_arr(obj) ? (double)obj->a->n : (double)u16_len(obj->s));
                return 0;
            }
            return bound_method(c, FN_STR_METHOD,
                                obj->t == V_STR ? find_name(STR_METHODS, prop->s) : NULL, obj,
                                out);
        }
        return rerr(c, at, "cannot access property with non-string/non-number: got %s",
                    tname(prop));
    }
    if (prop->t != V_STR)
        return rerr(c, at, "cannot access property with non-string: got %s", tname(prop));
    *out = v_undef();
    return 0;
}

static int ev_member(ctx *c, scope *sc, const tpl_node *n, tpl_val *out) {
    tpl_val obj, prop;
    TRY(ev(c, sc, n->a, &obj));
    if (n->flag) {
        if (n->b->kind == N_SLICE) return ev_slice(c, sc, n->b, &obj, out);
        TRY(ev(c, sc, n->b, &prop));
    } else if (n->b->kind == N_INT) {
        prop = v_int(n->b->num);
    } else {
        prop = v_str(n->b->s.p, n->b->s.len);
    }
    return member_get(c, n, &obj, &prop, out);
}

/* ----- binary operators ----- */
static int ev_binary(ctx *c, scope *sc, const tpl_node *n, tpl_val *out) {
    tpl_val l, r;
    TRY(ev(c, sc, n->a, &l));
    if (n->op == OP_AND) return truthy(&l) ? ev(c, sc, n->b, out) : (*out = l, 0);
    if (n->op == OP_OR) return truthy(&l) ? (*out = l, 0) : ev(c, sc, n->b, out);
    TRY(ev(c, sc, n->b, &r));
    if (n->op == OP_EQ || n->op == OP_NE) {
        bool eq;
        TRY(js_loose_eq(c, n, to_prim(&l), to_prim(&r), &eq, 0));
        *out = v_bool(n->op == OP_EQ ? eq : !eq);
        return 0;
    }
    if (l.t == V_UNDEF || r.t == V_UNDEF) {
        if (r.t == V_UNDEF && (n->op == OP_IN || n->op == OP_NOT_IN)) {
            *out = v_bool(n->op == OP_NOT_IN);
            return 0;
        }
        return rerr(c, n, "cannot perform this operation on undefined values");
    }
    if (l.t == V_NULL || r.t == V_NULL)
        return rerr(c, n, "cannot perform this operation on null values");
    if (n->op == OP_CONCAT) {
        tpl_sb b;
        tpl_sb_init(&b, c->A);
        TRY(js_value_str(c, n, &b, &l));
        TRY(js_value_str(c, n, &b, &r));
        if (b.oom) return OOM();
        *out = v_sb(&b);
        return 0;
    }
    bool lnl = is_num(&l) || l.t == V_BOOL, rnl = is_num(&r) || r.t == V_BOOL;
    if (n->op == OP_POW && lnl && rnl) {
        double a = l.t == V_BOOL ? l.b : l.n, b = r.t == V_BOOL ? r.b : r.n;
        if (a == 0 && b < 0) return rerr(c, n, "0.0 cannot be raised to a negative power");
        double res = pow(a, b);
        if (!isfinite(res)) return rerr(c, n, "exponentiation result is not a finite number");
        bool fl = l.t == V_FLOAT || r.t == V_FLOAT || b < 0;
        *out = fl ? v_float(res) : v_int(res);
        return 0;
    }
    if (is_num(&l) && is_num(&r)) {
        double a = l.n, b = r.n;
        bool fl = l.t == V_FLOAT || r.t == V_FLOAT;
        switch (n->op) {
        case OP_ADD: *out = fl ? v_float(a + b) : v_int(a + b); return 0;
        case OP_SUB: *out = fl ? v_float(a - b) : v_int(a - b); return 0;
        case OP_MUL: *out = fl ? v_float(a * b) : v_int(a * b); return 0;
        case OP_DIV: *out = v_float(a / b); return 0;
        case OP_FLOORDIV: *out = fl ? v_float(floor(a / b)) : v_int(floor(a / b)); return 0;
        case OP_MOD: *out = fl ? v_float(fmod(a, b)) : v_int(fmod(a, b)); return 0;
        case OP_LT: *out = v_bool(a < b); return 0;
        case OP_GT: *out = v_bool(a > b); return 0;
        case OP_GE: *out = v_bool(a >= b); return 0;
        case OP_LE: *out = v_bool(a <= b); return 0;
        default: break;
        }
    } else if (is_arr(&l) && is_arr(&r)) {
        if (n->op == OP_ADD) {
            tpl_arr *a = arr_new(c, l.a->n + r.a->n);
            if (!a) return OOM();
            if (l.a->n) memcpy(a->v, l.a->v, l.a->n * sizeof *a->v);
            if (r.a->n) memcpy(a->v + l.a->n, r.a->v, r.a->n * sizeof *a->v);
            *out = v_arr(a);
            return 0;
        }
    } else if (is_arr(&r)) {
        if (n->op == OP_IN || n->op == OP_NOT_IN) {
            bool found = false;
            for (size_t i = 0; i < r.a->n && !found; i++) found = js_strict_eq(&r.a->v[i], &l);
            *out = v_bool(n->op == OP_IN ? found : !found);
            return 0;
        }
    }
    if ((l.t == V_STR || r.t == V_STR) && n->op == OP_ADD) {
        tpl_sb b;
        tpl_sb_init(&b, c->A);
        TRY(js_value_str(c, n, &b, &l));
        TRY(js_value_str(c, n, &b, &r));
        if (b.oom) return OOM();
        *out = v_sb(&b);
        return 0;
    }
    if (l.t == V_STR && r.t == V_STR && (n->op == OP_IN || n->op == OP_NOT_IN)) {
        bool found = l.s.len == 0;
        for (size_t i = 0; !found && i + l.s.len <= r.s.len; i++)
            found = !memcmp(r.s.p + i, l.s.p, l.s.len);
        *out = v_bool(n->op == OP_IN ? found : !found);
        return 0;
    }
    if (l.t == V_STR && is_mapping(&r) && (n->op == OP_IN || n->op == OP_NOT_IN)) {
        bool found = obj_get(r.o, l.s) != NULL;
        *out = v_bool(n->op == OP_IN ? found : !found);
        return 0;
    }
    static const char *const OPS[] = {"?", "+", "-", "~", "*", "/", "//", "%", "**", "<", ">",
                                      "<=", ">=", "==", "!=", "in", "not in", "and", "or",
                                      "not", "-", "+"};
    return rerr(c, n, "unknown operator \"%s\" between %s and %s", OPS[n->op], tname(&l),
                tname(&r));
}

/* ----- tests ----- */
/* The named test `t` applied to v (at: the node for error positions). */
static int test_value(ctx *c, const tpl_node *n, tpl_str t, const tpl_val *vp, bool *out) {
    tpl_val v = *vp;
    bool r;
    if (str_eq(t, "boolean")) r = v.t == V_BOOL;
    else if (str_eq(t, "callable")) r = v.t == V_FUNC;
    else if (str_eq(t, "odd") || str_eq(t, "even")) {
        if (v.t != V_INT) return rerr(c, n, "cannot %.*s on %s", (int)t.len, t.p, tname(&v));
        bool odd = fmod(v.n, 2) != 0;
        r = str_eq(t, "odd") ? odd : !odd;
    } else if (str_eq(t, "false")) r = v.t == V_BOOL && !v.b;
    else if (str_eq(t, "true")) r = v.t == V_BOOL && v.b;
    else if (str_eq(t, "none")) r = v.t == V_NULL;
    else if (str_eq(t, "string")) r = v.t == V_STR;
    else if (str_eq(t, "number")) r = is_num(&v);
    else if (str_eq(t, "integer")) r = v.t == V_INT;
    else if (str_eq(t, "iterable")) r = v.t == V_ARRAY || v.t == V_STR;
    else if (str_eq(t, "mapping")) r = is_mapping(&v);
    else if (str_eq(t, "sequence")) r = is_arr(&v) || is_mapping(&v) || v.t == V_STR;
    else if (str_eq(t, "lower") || str_eq(t, "upper")) {
        if (v.t != V_STR) {
            r = false;
        } else {
            tpl_val m;
            TRY(case_map(c, v.s, str_eq(t, "lower") ? 1 : 0, &m));
            r = str_same(m.s, v.s);
        }
    } else if (str_eq(t, "defined")) r = v.t != V_UNDEF;
    else if (str_eq(t, "undefined")) r = v.t == V_UNDEF;
    else if (str_eq(t, "equalto") || str_eq(t, "eq"))
        return rerr(c, n, "test '%.*s' needs an argument", (int)t.len, t.p);
    else return rerr(c, n, "unknown test: %.*s", (int)t.len, t.p);
    *out = r;
    return 0;
}

static int ev_test(ctx *c, scope *sc, const tpl_node *n, tpl_val *out) {
    tpl_val v;
    TRY(ev(c, sc, n->a, &v));
    bool r;
    TRY(test_value(c, n, n->s, &v, &r));
    *out = v_bool(n->flag ? !r : r);
    return 0;
}

/* A named test applied to (a, b) for selectattr/rejectattr. */
static int apply_named_test(ctx *c, const tpl_node *at, tpl_str t, const tpl_val *a,
                            const tpl_val *b, bool *out) {
    if (str_eq(t, "equalto") || str_eq(t, "eq")) {
        if (!b) return rerr(c, at, "test '%.*s' needs a value", (int)t.len, t.p);
        *out = js_strict_eq(a, b);
        return 0;
    }
    return test_value(c, at, t, a, out);
}

/* ----- filters ----- */
static int parse_int_prefix(tpl_str s, double *out) {
    size_t i = trim_start(s);
    double sign = 1;
    if (i < s.len && (s.p[i] == '+' || s.p[i] == '-')) sign = s.p[i++] == '-' ? -1 : 1;
    size_t st = i;
    double v = 0;
    while (i < s.len && s.p[i] >= '0' && s.p[i] <= '9') v = v * 10 + (s.p[i++] - '0');
    if (i == st) return -1;
    *out = sign * v;
    return 0;
}

static int parse_float_prefix(tpl_str s, double *out) {
    size_t i = trim_start(s);
    char buf[256];
    size_t n = 0;
    size_t j = i;
    if (j < s.len && (s.p[j] == '+' || s.p[j] == '-')) j++;
    if (s.len - j >= 8 && !memcmp(s.p + j, "Infinity", 8)) {
        *out = (i < s.len && s.p[i] == '-') ? -INFINITY : INFINITY;
        return 0;
    }
    size_t nd = 0;
    size_t k = j;
    while (k < s.len && s.p[k] >= '0' && s.p[k] <= '9') k++, nd++;
    if (k < s.len && s.p[k] == '.') {
        k++;
        while (k < s.len && s.p[k] >= '0' && s.p[k] <= '9') k++, nd++;
    }
    if (!nd) return -1;
    if (k < s.len && (s.p[k] == 'e' || s.p[k] == 'E')) {
        size_t e = k + 1;
        if (e < s.len && (s.p[e] == '+' || s.p[e] == '-')) e++;
        size_t ed = e;
        while (e < s.len && s.p[e] >= '0' && s.p[e] <= '9') e++;
        if (e > ed) k = e;
    }
    n = k - i;
    if (n >= sizeof buf) n = sizeof buf - 1;
    memcpy(buf, s.p + i, n);
    buf[n] = 0;
    *out = strtod(buf, NULL);
    return 0;
}

static int indent_str(ctx *c, tpl_str s, size_t width, bool first, bool blank, tpl_val *out) {
    tpl_sb b;
    tpl_sb_init(&b, c->A);
    size_t line = 0, st = 0;
    for (size_t i = 0; i <= s.len; i++) {
        if (i < s.len && s.p[i] != '\n') continue;
        size_t len = i - st;
        if (line) tpl_sb_putc(&b, '\n');
        if (!((!first && line == 0) || (!blank && len == 0)))
            for (size_t k = 0; k < width; k++) tpl_sb_putc(&b, ' ');
        tpl_sb_put(&b, s.p + st, len);
        st = i + 1;
        line++;
    }
    if (b.oom) return OOM();
    *out = v_sb(&b);
    return 0;
}

static int attr_path(ctx *c, const tpl_val *item, tpl_str path, tpl_val *out) {
    (void)c;
    tpl_val v = *item;
    size_t st = 0;
    for (size_t i = 0; i <= path.len; i++) {
        if (i < path.len && path.p[i] != '.') continue;
        tpl_str part = {path.p + st, i - st};
        st = i + 1;
        if (v.t == V_OBJECT || v.t == V_KWARGS || v.t == V_NS) {
            tpl_val *x = obj_get(v.o, part);
            v = x ? *x : v_undef();
        } else if (is_arr(&v)) {
            /* parseInt(part, 10) */
            double idx;
            if (parse_int_prefix(part, &idx) || idx < 0 || idx >= (double)v.a->n) {
                *out = v_undef();
                return 0;
            }
            v = v.a->v[(size_t)idx];
        } else {
            *out = v_undef();
            return 0;
        }
    }
    *out = v;
    return 0;
}

static int filter_ident(ctx *c, const tpl_node *at, tpl_str f, const tpl_val *v,
                        tpl_val *out) {
    if (str_eq(f, "safe")) return *out = *v, 0;
    if (str_eq(f, "tojson")) {
        tpl_sb b;
        tpl_sb_init(&b, c->A);
        TRY(to_json(c, at, &b, v, &JSON_DEFAULT, 0));
        if (b.oom) return OOM();
        return *out = v_sb(&b), 0;
    }
    if (is_arr(v)) {
        tpl_arr *a = v->a;
        if (str_eq(f, "list")) return *out = *v, 0;
        if (str_eq(f, "first") || str_eq(f, "last")) {
            if (!a->n) return rerr(c, at, "%.*s of an empty list", (int)f.len, f.p);
            return *out = str_eq(f, "first") ? a->v[0] : a->v[a->n - 1], 0;
        }
        if (str_eq(f, "length")) return *out = v_int((double)a->n), 0;
        if (str_eq(f, "reverse")) {
            tpl_arr *r = arr_new(c, a->n);
            if (!r) return OOM();
            for (size_t i = 0; i < a->n; i++) r->v[i] = a->v[a->n - 1 - i];
            return *out = v_arr(r), 0;
        }
        if (str_eq(f, "sort")) {
            tpl_arr *r;
            TRY(sort_by_keys(c, at, a->v, a->v, a->n, false, false, &r));
            return *out = v_arr(r), 0;
        }
        if (str_eq(f, "join")) {
            tpl_sb b;
            tpl_sb_init(&b, c->A);
            for (size_t i = 0; i < a->n; i++) TRY(js_join_item(c, at, &b, &a->v[i]));
            if (b.oom) return OOM();
            return *out = v_sb(&b), 0;
        }
        if (str_eq(f, "string")) {
            tpl_sb b;
            tpl_sb_init(&b, c->A);
            json_opts o = JSON_DEFAULT;
            o.undef_null = false;
            TRY(to_json(c, at, &b, v, &o, 0));
            if (b.oom) return OOM();
            return *out = v_sb(&b), 0;
        }
        if (str_eq(f, "unique")) {
            tpl_arr *r = arr_new(c, a->n);
            if (!r) return OOM();
            size_t k = 0;
            for (size_t i = 0; i < a->n; i++) {
                bool seen = false;
                for (size_t j = 0; j < k && !seen; j++)
                    seen = js_strict_eq(&r->v[j], &a->v[i]) ||
                           (is_num(&r->v[j]) && is_num(&a->v[i]) && isnan(r->v[j].n) &&
                            isnan(a->v[i].n));
                if (!seen) r->v[k++] = a->v[i];
            }
            r->n = k;
            return *out = v_arr(r), 0;
        }
        return rerr(c, at, "unknown ArrayValue filter: %.*s", (int)f.len, f.p);
    }
    if (v->t == V_STR) {
        if (str_eq(f, "length")) return *out = v_int((double)u16_len(v->s)), 0;
        if (str_eq(f, "upper")) return case_map(c, v->s, 0, out);
        if (str_eq(f, "lower")) return case_map(c, v->s, 1, out);
        if (str_eq(f, "title")) return case_map(c, v->s, 2, out);
        if (str_eq(f, "capitalize")) return case_map(c, v->s, 3, out);
        if (str_eq(f, "trim")) return *out = js_trim(v->s, true, true), 0;
        if (str_eq(f, "indent")) return indent_str(c, v->s, 4, false, false, out);
        if (str_eq(f, "join") || str_eq(f, "string")) return *out = *v, 0;
        if (str_eq(f, "int")) {
            double d;
            *out = v_int(parse_int_prefix(v->s, &d) ? 0 : d);
            return 0;
        }
        if (str_eq(f, "float")) {
            double d;
            *out = v_float(parse_float_prefix(v->s, &d) ? 0 : d);
            return 0;
        }
        return rerr(c, at, "unknown StringValue filter: %.*s", (int)f.len, f.p);
    }
    if (is_num(v)) {
        if (str_eq(f, "abs")) return *out = v->t == V_INT ? v_int(fabs(v->n)) : v_float(fabs(v->n)), 0;
        if (str_eq(f, "int")) return *out = v_int(floor(v->n)), 0;
        if (str_eq(f, "float")) return *out = v_float(v->n), 0;
        if (str_eq(f, "string")) {
            tpl_sb b;
            tpl_sb_init(&b, c->A);
            TRY(to_string(c, at, &b, v));
            if (b.oom) return OOM();
            return *out = v_sb(&b), 0;
        }
        return rerr(c, at, "unknown NumericValue filter: %.*s", (int)f.len, f.p);
    }
    if (is_mapping(v)) {
        if (str_eq(f, "items")) return obj_items(c, v->o, out);
        if (str_eq(f, "length")) return *out = v_int((double)v->o->n), 0;
        const char *m = find_name(OBJ_METHODS, f);
        if (m) {
            tpl_fn fn = {FN_OBJ_METHOD, m, *v, NULL};
            argv_t none = {NULL, 0, NULL};
            return obj_method(c, at, &fn, &none, out);
        }
        return rerr(c, at, "unknown ObjectValue filter: %.*s", (int)f.len, f.p);
    }
    if (v->t == V_BOOL) {
        if (str_eq(f, "bool")) return *out = *v, 0;
        if (str_eq(f, "int")) return *out = v_int(v->b), 0;
        if (str_eq(f, "float")) return *out = v_float(v->b), 0;
        if (str_eq(f, "string")) return *out = v->b ? v_str("true", 4) : v_str("false", 5), 0;
        return rerr(c, at, "unknown BooleanValue filter: %.*s", (int)f.len, f.p);
    }
    return rerr(c, at, "cannot apply filter \"%.*s\" to type: %s", (int)f.len, f.p, tname(v));
}

static int filter_call(ctx *c, scope *sc, const tpl_node *at, const tpl_node *call,
                       const tpl_val *v, tpl_val *out) {
    if (!call->a || call->a->kind != N_IDENT) return rerr(c, at, "unknown filter expression");
    tpl_str f = call->a->s;
    argv_t a;
    if (str_eq(f, "selectattr") || str_eq(f, "rejectattr")) {
        bool sel = str_eq(f, "selectattr");
        if (!is_arr(v)) return rerr(c, at, "unknown %s filter: %.*s", tname(v), (int)f.len, f.p);
        for (size_t i = 0; i < v->a->n; i++)
            if (!(v->a->v[i].t == V_OBJECT || v->a->v[i].t == V_KWARGS ||
                  v->a->v[i].t == V_NS))
                return rerr(c, at, "`%.*s` can only be applied to array of objects", (int)f.len,
                            f.p);
        for (size_t i = 0; i < call->n; i++)
            if (call->list[i]->kind != N_STR)
                return rerr(c, at, "arguments of `%.*s` must be strings", (int)f.len, f.p);
        if (call->n < 1) return rerr(c, at, "`%.*s` needs an attribute name", (int)f.len, f.p);
        tpl_str attr = call->list[0]->s;
        tpl_val val;
        if (call->n > 2) val = v_str(call->list[2]->s.p, call->list[2]->s.len);
        tpl_arr *r = arr_new(c, v->a->n);
        if (!r) return OOM();
        size_t k = 0;
        for (size_t i = 0; i < v->a->n; i++) {
            tpl_val *x = obj_get(v->a->v[i].o, attr);
            bool res = false;
            if (x) {
                if (call->n > 1)
                    TRY(apply_named_test(c, at, call->list[1]->s, x, call->n > 2 ? &val : NULL,
                                         &res));
                else res = truthy(x);
            }
            if (sel ? res : !res) r->v[k++] = v->a->v[i];
        }
        r->n = k;
        return *out = v_arr(r), 0;
    }
    TRY(ev_args(c, sc, call->list, call->n, &a));
    if (str_eq(f, "tojson")) {
        json_opts o = JSON_DEFAULT;
        tpl_val *ind = kwarg(&a, "indent"), *asc = kwarg(&a, "ensure_ascii"),
                *sk = kwarg(&a, "sort_keys"), *sep = kwarg(&a, "separators");
        if (ind && ind->t != V_INT && ind->t != V_NULL)
            return rerr(c, at, "if set, indent must be a number");
        if (asc && asc->t != V_BOOL) return rerr(c, at, "if set, ensure_ascii must be a boolean");
        if (sk && sk->t != V_BOOL) return rerr(c, at, "if set, sort_keys must be a boolean");
        if (sk && sk->b)
            return rerr(c, at, "tojson(sort_keys=true) is not supported (locale collation)");
        if (ind && ind->t == V_INT) {
            if (ind->n > 64) return rerr(c, at, "tojson indent too large");
            o.indent = ind->n > 0 ? (int)ind->n : -1;
            if (o.indent > 0) o.item_sep = ",", o.item_len = 1;
        }
        if (asc) o.ascii = asc->b;
        if (sep && sep->t != V_NULL) {
            if (!is_arr(sep) || sep->a->n != 2 || sep->a->v[0].t != V_STR ||
                sep->a->v[1].t != V_STR)
                return rerr(c, at, "separators must be a tuple of two strings");
            o.item_sep = sep->a->v[0].s.p;
            o.item_len = sep->a->v[0].s.len;
            o.key_sep = sep->a->v[1].s.p;
            o.key_len = sep->a->v[1].s.len;
        }
        tpl_sb b;
        tpl_sb_init(&b, c->A);
        TRY(to_json(c, at, &b, v, &o, 0));
        if (b.oom) return OOM();
        return *out = v_sb(&b), 0;
    }
    if (str_eq(f, "join")) {
        if (v->t != V_STR && !is_arr(v))
            return rerr(c, at, "cannot apply filter \"join\" to type: %s", tname(v));
        tpl_val empty = v_str("", 0);
        tpl_val *sep = a.npos ? &a.pos[0] : kwarg(&a, "separator");
        if (!sep) sep = &empty;
        if (sep->t != V_STR) return rerr(c, at, "separator must be a string");
        tpl_sb b;
        tpl_sb_init(&b, c->A);
        if (v->t == V_STR) {
            for (size_t i = 0; i < v->s.len;) {
                uint32_t cp;
                size_t k = tpl_utf8_decode(v->s.p, v->s.len, i, &cp);
                if (i) tpl_sb_put(&b, sep->s.p, sep->s.len);
                tpl_sb_put(&b, v->s.p + i, k);
                i += k;
            }
        } else {
            for (size_t i = 0; i < v->a->n; i++) {
                if (i) tpl_sb_put(&b, sep->s.p, sep->s.len);
                TRY(js_join_item(c, at, &b, &v->a->v[i]));
            }
        }
        if (b.oom) return OOM();
        return *out = v_sb(&b), 0;
    }
    if (str_eq(f, "int") || str_eq(f, "float")) {
        bool isint = str_eq(f, "int");
        tpl_val dflt = isint ? v_int(0) : v_float(0);
        tpl_val *d = a.npos ? &a.pos[0] : kwarg(&a, "default");
        if (!d) d = &dflt;
        if (v->t == V_STR) {
            double x;
            if (isint ? parse_int_prefix(v->s, &x) : parse_float_prefix(v->s, &x))
                return *out = *d, 0;
            return *out = isint ? v_int(x) : v_float(x), 0;
        }
        if (is_num(v)) return *out = *v, 0;
        if (v->t == V_BOOL) return *out = isint ? v_int(v->b) : v_float(v->b), 0;
        return rerr(c, at, "cannot apply filter \"%.*s\" to type: %s", (int)f.len, f.p,
                    tname(v));
    }
    if (str_eq(f, "default")) {
        tpl_val empty = v_str("", 0), fv = v_bool(false);
        tpl_val *d = a.npos ? &a.pos[0] : &empty;
        tpl_val *bo = a.npos > 1 ? &a.pos[1] : kwarg(&a, "boolean");
        if (!bo) bo = &fv;
        if (bo->t != V_BOOL) return rerr(c, at, "`default` filter flag must be a boolean");
        if (v->t == V_UNDEF || (bo->b && !truthy(v))) return *out = *d, 0;
        return *out = *v, 0;
    }
    if (is_arr(v)) {
        if (str_eq(f, "sort")) {
            tpl_val fv = v_bool(false), nv = v_null();
            tpl_val *rev = a.npos > 0 ? &a.pos[0] : kwarg(&a, "reverse");
            tpl_val *cs = a.npos > 1 ? &a.pos[1] : kwarg(&a, "case_sensitive");
            tpl_val *at_ = a.npos > 2 ? &a.pos[2] : kwarg(&a, "attribute");
            if (!rev) rev = &fv;
            if (!cs) cs = &fv;
            if (!at_) at_ = &nv;
            if (rev->t != V_BOOL) return rerr(c, at, "reverse must be a boolean");
            if (cs->t != V_BOOL) return rerr(c, at, "case_sensitive must be a boolean");
            if (at_->t != V_STR && at_->t != V_INT && at_->t != V_NULL)
                return rerr(c, at, "attribute must be a string, integer, or null");
            size_t n = v->a->n;
            tpl_val *keys = tpl_alloc(c->A, (n + 1) * sizeof *keys);
            if (!keys) return OOM();
            for (size_t i = 0; i < n; i++) {
                if (at_->t == V_NULL) {
                    keys[i] = v->a->v[i];
                } else {
                    tpl_str path = at_->s;
                    if (at_->t == V_INT) {
                        tpl_sb b;
                        tpl_sb_init(&b, c->A);
                        js_num(&b, at_->n);
                        if (b.oom) return OOM();
                        path.p = b.p;
                        path.len = b.len;
                    }
                    TRY(attr_path(c, &v->a->v[i], path, &keys[i]));
                }
            }
            tpl_arr *r;
            TRY(sort_by_keys(c, at, v->a->v, keys, n, cs->b, rev->b, &r));
            return *out = v_arr(r), 0;
        }
        if (str_eq(f, "map")) {
            tpl_val *attr = kwarg(&a, "attribute");
            if (!attr)
                return rerr(c, at, "`map` expressions without `attribute` set are not "
                                   "supported");
            if (attr->t != V_STR) return rerr(c, at, "attribute must be a string");
            tpl_val *d = kwarg(&a, "default");
            tpl_arr *r = arr_new(c, v->a->n);
            if (!r) return OOM();
            for (size_t i = 0; i < v->a->n; i++) {
                tpl_val *it = &v->a->v[i];
                if (!(it->t == V_OBJECT || it->t == V_KWARGS || it->t == V_NS))
                    return rerr(c, at, "items in map must be an object");
                tpl_val x;
                TRY(attr_path(c, it, attr->s, &x));
                r->v[i] = x.t == V_UNDEF ? (d ? *d : v_undef()) : x;
            }
            return *out = v_arr(r), 0;
        }
        return rerr(c, at, "unknown ArrayValue filter: %.*s", (int)f.len, f.p);
    }
    if (v->t == V_STR) {
        if (str_eq(f, "indent")) {
            tpl_val w4 = v_int(4), fv = v_bool(false);
            tpl_val *w = a.npos > 0 ? &a.pos[0] : kwarg(&a, "width");
            tpl_val *first = a.npos > 1 ? &a.pos[1] : kwarg(&a, "first");
            tpl_val *blank = a.npos > 2 ? &a.pos[2] : kwarg(&a, "blank");
            if (!w) w = &w4;
            if (!first) first = &fv;
            if (!blank) blank = &fv;
            if (w->t != V_INT) return rerr(c, at, "width must be a number");
            if (w->n > 1024) return rerr(c, at, "indent width too large");
            return indent_str(c, v->s, w->n > 0 ? (size_t)w->n : 0, truthy(first),
                              truthy(blank), out);
        }
        if (str_eq(f, "replace")) {
            tpl_fn fn = {FN_STR_METHOD, "replace", *v, NULL};
            return str_method(c, at, &fn, &a, out);
        }
        return rerr(c, at, "unknown StringValue filter: %.*s", (int)f.len, f.p);
    }
    if (is_mapping(v)) {
        const char *m = find_name(OBJ_METHODS, f);
        if (m) {
            tpl_fn fn = {FN_OBJ_METHOD, m, *v, NULL};
            return obj_method(c, at, &fn, &a, out);
        }
        return rerr(c, at, "unknown ObjectValue filter: %.*s", (int)f.len, f.p);
    }
    return rerr(c, at, "cannot apply filter \"%.*s\" to type: %s", (int)f.len, f.p, tname(v));
}

static int apply_filter(ctx *c, scope *sc, const tpl_node *at, const tpl_node *f,
                        const tpl_val *v, tpl_val *out) {
    if (f->kind == N_IDENT) return filter_ident(c, at, f->s, v, out);
    if (f->kind == N_CALL) return filter_call(c, sc, at, f, v, out);
    return rerr(c, at, "unknown filter expression");
}

/* ----- expressions ----- */
static int ev_node(ctx *c, scope *sc, const tpl_node *n, tpl_val *out);

static int ev(ctx *c, scope *sc, const tpl_node *n, tpl_val *out) {
    if (c->edepth >= MAX_EVAL_DEPTH) return rerr(c, n, "template evaluation nested too deeply");
    c->edepth++;
    int rc = ev_node(c, sc, n, out);
    c->edepth--;
    return rc;
}

static int ev_node(ctx *c, scope *sc, const tpl_node *n, tpl_val *out) {
    TRY(step(c, n));
    switch (n->kind) {
    case N_STR: *out = v_str(n->s.p, n->s.len); return 0;
    case N_INT: *out = v_int(n->num); return 0;
    case N_FLOAT: *out = v_float(n->num); return 0;
    case N_IDENT: *out = lookup(sc, n->s); return 0;
    case N_ARRAY: case N_TUPLE: {
        tpl_arr *a = arr_new(c, n->n);
        if (!a) return OOM();
        for (size_t i = 0; i < n->n; i++) TRY(ev(c, sc, n->list[i], &a->v[i]));
        *out = v_arr(a);
        if (n->kind == N_TUPLE) out->t = V_TUPLE;
        return 0;
    }
    case N_OBJECT: {
        tpl_obj *o = obj_new(c);
        if (!o) return OOM();
        for (size_t i = 0; i < n->n; i++) {
            tpl_val k, v;
            TRY(ev(c, sc, n->list[i], &k));
            if (k.t != V_STR)
                return rerr(c, n->list[i], "object keys must be strings: got %s", tname(&k));
            TRY(ev(c, sc, n->list2[i], &v));
            TRY(obj_set(c, o, k.s, v));
        }
        *out = v_obj(V_OBJECT, o);
        return 0;
    }
    case N_MEMBER: return ev_member(c, sc, n, out);
    case N_CALL: {
        argv_t a;
        TRY(ev_args(c, sc, n->list, n->n, &a));
        tpl_val fn;
        TRY(ev(c, sc, n->a, &fn));
        return call_value(c, sc, n, &fn, &a, out);
    }
    case N_BINARY: return ev_binary(c, sc, n, out);
    case N_UNARY: {
        tpl_val v;
        TRY(ev(c, sc, n->a, &v));
        if (n->op == OP_NOT) return *out = v_bool(!truthy(&v)), 0;
        double sign = n->op == OP_NEG ? -1 : 1;
        if (v.t == V_FLOAT) return *out = v_float(sign * v.n), 0;
        if (v.t == V_INT) return *out = v_int(sign * v.n), 0;
        if (v.t == V_BOOL) return *out = v_int(sign * (v.b ? 1 : 0)), 0;
        return rerr(c, n, "unknown operator \"%s\" for %s", n->op == OP_NEG ? "-" : "+",
                    tname(&v));
    }
    case N_FILTER: {
        tpl_val v;
        TRY(ev(c, sc, n->a, &v));
        return apply_filter(c, sc, n, n->b, &v, out);
    }
    case N_TEST: return ev_test(c, sc, n, out);
    case N_SELECT: {
        tpl_val t;
        TRY(ev(c, sc, n->b, &t));
        if (!truthy(&t)) return *out = v_undef(), 0;
        return ev(c, sc, n->a, out);
    }
    case N_TERNARY: {
        tpl_val t;
        TRY(ev(c, sc, n->a, &t));
        return ev(c, sc, truthy(&t) ? n->b : n->c, out);
    }
    case N_KWARG: return rerr(c, n, "keyword argument outside a call");
    case N_SLICE: return rerr(c, n, "slice outside a subscript");
    default: return rerr(c, n, "statement used as an expression");
    }
}

/* ----- statements ----- */
static int assign(ctx *c, scope *sc, const tpl_node *target, const tpl_val *v) {
    if (target->kind == N_IDENT) return scope_set(c, sc, target->s, *v);
    if (target->kind == N_TUPLE) {
        if (!is_arr(v)) return rerr(c, target, "cannot unpack non-iterable type %s", tname(v));
        if (v->a->n != target->n)
            return rerr(c, target, "too %s items to unpack", target->n > v->a->n ? "few" : "many");
        for (size_t i = 0; i < target->n; i++) {
            if (target->list[i]->kind != N_IDENT)
                return rerr(c, target->list[i], "cannot unpack to a non-name");
            TRY(scope_set(c, sc, target->list[i]->s, v->a->v[i]));
        }
        return 0;
    }
    if (target->kind == N_MEMBER) {
        tpl_val obj;
        TRY(ev(c, sc, target->a, &obj));
        if (obj.t != V_NS) return rerr(c, target, "cannot assign attribute on non-namespace object");
        if (target->b->kind != N_IDENT)
            return rerr(c, target, "cannot assign to member with non-identifier property");
        return obj_set(c, obj.o, target->b->s, *v);
    }
    return rerr(c, target, "invalid assignment target");
}

static int ev_for(ctx *c, scope *env, const tpl_node *n, tpl_sb *out) {
    scope *sc = scope_new(c, env);
    if (!sc) return OOM();
    tpl_val it;
    const tpl_node *test = NULL;
    if (n->b->kind == N_SELECT) {
        TRY(ev(c, sc, n->b->a, &it));
        test = n->b->b;
    } else {
        TRY(ev(c, sc, n->b, &it));
    }
    if (is_mapping(&it)) {
        TRY(obj_keys(c, it.o, &it));
    } else if (!is_arr(&it)) {
        return rerr(c, n->b, "expected iterable or object type in for loop: got %s", tname(&it));
    }
    tpl_val *items = it.a->v;
    size_t count = it.a->n;
    if (test) {
        tpl_val *kept = tpl_alloc(c->A, (count + 1) * sizeof *kept);
        if (!kept) return OOM();
        size_t k = 0;
        for (size_t i = 0; i < count; i++) {
            scope *ls = scope_new(c, sc);
            if (!ls) return OOM();
            TRY(assign(c, ls, n->a, &items[i]));
            tpl_val t;
            TRY(ev(c, ls, test, &t));
            if (truthy(&t)) kept[k++] = items[i];
        }
        items = kept;
        count = k;
    }
    bool none = true;
    for (size_t i = 0; i < count; i++) {
        TRY(step(c, n));
        tpl_obj *lo = obj_new_cap(c, 9);
        if (!lo) return OOM();
        TRY(obj_set_c(c, lo, "index", v_int((double)i + 1)));
        TRY(obj_set_c(c, lo, "index0", v_int((double)i)));
        TRY(obj_set_c(c, lo, "revindex", v_int((double)(count - i))));
        TRY(obj_set_c(c, lo, "revindex0", v_int((double)(count - i - 1))));
        TRY(obj_set_c(c, lo, "first", v_bool(i == 0)));
        TRY(obj_set_c(c, lo, "last", v_bool(i == count - 1)));
        TRY(obj_set_c(c, lo, "length", v_int((double)count)));
        TRY(obj_set_c(c, lo, "previtem", i > 0 ? items[i - 1] : v_undef()));
        TRY(obj_set_c(c, lo, "nextitem", i + 1 < count ? items[i + 1] : v_undef()));
        TRY(scope_set(c, sc, (tpl_str){"loop", 4}, v_obj(V_OBJECT, lo)));
        TRY(assign(c, sc, n->a, &items[i]));
        size_t mark = out->len;
        int rc = ev_block(c, sc, n->list, n->n, out);
        if (rc == R_CONTINUE || rc == R_BREAK) {
            /* the reference discards the output of an interrupted iteration */
            out->len = mark;
            if (out->p) out->p[mark] = 0;
            if (rc == R_BREAK) break;
            continue;
        }
        if (rc) return rc;
        none = false;
    }
    if (none) {
        int rc = ev_block(c, sc, n->list2, n->n2, out);
        if (rc) return rc;
    }
    return 0;
}

static int ev_block_items(ctx *c, scope *sc, tpl_node *const *list, size_t n, tpl_sb *out);

static int ev_block(ctx *c, scope *sc, tpl_node *const *list, size_t n, tpl_sb *out) {
    if (c->edepth >= MAX_EVAL_DEPTH)
        return rerr(c, n ? list[0] : NULL, "template evaluation nested too deeply");
    c->edepth++;
    int rc = ev_block_items(c, sc, list, n, out);
    c->edepth--;
    return rc;
}

static int ev_block_items(ctx *c, scope *sc, tpl_node *const *list, size_t n, tpl_sb *out) {
    for (size_t i = 0; i < n; i++) {
        const tpl_node *s = list[i];
        TRY(step(c, s));
        switch (s->kind) {
        case N_COMMENT: break;
        case N_BREAK: return R_BREAK;
        case N_CONTINUE: return R_CONTINUE;
        case N_IF: {
            tpl_val t;
            TRY(ev(c, sc, s->a, &t));
            if (truthy(&t)) TRY(ev_block(c, sc, s->list, s->n, out));
            else TRY(ev_block(c, sc, s->list2, s->n2, out));
            break;
        }
        case N_FOR: TRY(ev_for(c, sc, s, out)); break;
        case N_SET: {
            tpl_val v;
            if (s->b) {
                TRY(ev(c, sc, s->b, &v));
            } else {
                tpl_sb b;
                tpl_sb_init(&b, c->A);
                TRY(ev_block(c, sc, s->list, s->n, &b));
                if (b.oom) return OOM();
                v = v_sb(&b);
            }
            TRY(assign(c, sc, s->a, &v));
            break;
        }
        case N_MACRO: {
            tpl_fn *f = fn_new(c, FN_MACRO, "macro");
            if (!f) return OOM();
            f->macro = s;
            TRY(scope_set(c, sc, s->s, v_fn(f)));
            break;
        }
        case N_FILTER_STMT: {
            tpl_sb b;
            tpl_sb_init(&b, c->A);
            TRY(ev_block(c, sc, s->list, s->n, &b));
            if (b.oom) return OOM();
            tpl_val v = v_sb(&b), r;
            TRY(apply_filter(c, sc, s, s->b, &v, &r));
            if (r.t != V_NULL && r.t != V_UNDEF) TRY(to_string(c, s, out, &r));
            break;
        }
        default: {
            tpl_val v;
            TRY(ev(c, sc, s, &v));
            if (v.t != V_NULL && v.t != V_UNDEF) TRY(to_string(c, s, out, &v));
        }
        }
        if (out->oom) return OOM();
    }
    return 0;
}

/* ----- JSON input -> values ----- */

static bool is_array_index(const char *k, size_t len) {
    if (len == 0 || len > 10) return false;
    if (len > 1 && k[0] == '0') return false;
    double v = 0;
    for (size_t i = 0; i < len; i++) {
        if (k[i] < '0' || k[i] > '9') return false;
        v = v * 10 + (k[i] - '0');
    }
    return v <= 4294967294.0;
}

static int from_json(ctx *c, json_t *j, tpl_val *out, int depth) {
    if (depth > 256) return agent_err(AGENT_EINVAL, "template input: JSON nested too deeply");
    switch (json_typeof(j)) {
    case JSON_NULL: *out = v_null(); return 0;
    case JSON_TRUE: *out = v_bool(true); return 0;
    case JSON_FALSE: *out = v_bool(false); return 0;
    case JSON_INTEGER: {
        double d = (double)json_integer_value(j);
        *out = v_int(d);
        return 0;
    }
    case JSON_REAL: {
        double d = json_real_value(j);
        *out = js_is_integer(d) ? v_int(d) : v_float(d);
        return 0;
    }
    case JSON_STRING: *out = v_str(json_string_value(j), json_string_length(j)); return 0;
    case JSON_ARRAY: {
        tpl_arr *a = arr_new(c, json_array_size(j));
        if (!a) return OOM();
        for (size_t i = 0; i < a->n; i++) TRY(from_json(c, json_array_get(j, i), &a->v[i], depth + 1));
        *out = v_arr(a);
        return 0;
    }
    case JSON_OBJECT: {
        /* JavaScript objects list integer-like keys first, ascending, then the rest in
         * insertion order; the reference iterates them that way. */
        tpl_obj *o = obj_new(c);
        if (!o) return OOM();
        size_t n = json_object_size(j), ni = 0;
        const char **idx = tpl_alloc(c->A, (n + 1) * sizeof *idx);
        if (!idx) return OOM();
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v) {
            if (is_array_index(k, strlen(k))) idx[ni++] = k;
        }
        for (size_t i = 1; i < ni; i++) /* insertion sort by numeric value */
            for (size_t m = i; m > 0; m--) {
                size_t la = strlen(idx[m - 1]), lb = strlen(idx[m]);
                if (la < lb || (la == lb && strcmp(idx[m - 1], idx[m]) < 0)) break;
                const char *t = idx[m];
                idx[m] = idx[m - 1];
                idx[m - 1] = t;
            }
        for (size_t i = 0; i < ni; i++) {
            tpl_val x;
            TRY(from_json(c, json_object_get(j, idx[i]), &x, depth + 1));
            TRY(obj_set(c, o, (tpl_str){idx[i], strlen(idx[i])}, x));
        }
        json_object_foreach(j, k, v) {
            size_t kl = strlen(k);
            if (is_array_index(k, kl)) continue;
            tpl_val x;
            TRY(from_json(c, v, &x, depth + 1));
            TRY(obj_set(c, o, (tpl_str){k, kl}, x));
        }
        *out = v_obj(V_OBJECT, o);
        return 0;
    }
    }
    return agent_err(AGENT_EINVAL, "template input: unknown JSON type");
}

int tpl_render_json(const agent_template *t, json_t *vars, const tpl_limits *lim, char **out,
                    size_t *out_len) {
    if (!json_is_object(vars)) return agent_err(AGENT_EINVAL, "template variables: not an object");
    tpl_arena arena = {0};
    arena.limit = lim->max_bytes;
    ctx c = {.A = &arena, .T = t, .max_steps = lim->max_steps};
    int rc = 0;
    scope *root = scope_new(&c, NULL);
    if (!root) {
        rc = OOM();
        goto done;
    }
    static const char *const CONSTS[] = {"false", "true", "none", "True", "False", "None"};
    for (size_t i = 0; i < 6; i++) {
        tpl_val v = (i == 2 || i == 5) ? v_null() : v_bool(i == 1 || i == 3);
        if ((rc = scope_set(&c, root, (tpl_str){CONSTS[i], strlen(CONSTS[i])}, v))) goto done;
    }
    static const struct {
        const char *name;
        tpl_fn_kind k;
    } FNS[] = {{"raise_exception", FN_RAISE}, {"range", FN_RANGE}, {"namespace", FN_NAMESPACE},
               {"strftime_now", FN_STRFTIME}};
    for (size_t i = 0; i < sizeof FNS / sizeof FNS[0]; i++) {
        tpl_fn *f = fn_new(&c, FNS[i].k, FNS[i].name);
        if (!f) {
            rc = OOM();
            goto done;
        }
        if ((rc = scope_set(&c, root, (tpl_str){FNS[i].name, strlen(FNS[i].name)}, v_fn(f))))
            goto done;
    }
    const char *k;
    json_t *jv;
    json_object_foreach(vars, k, jv) {
        tpl_str ks = {k, strlen(k)};
        for (size_t i = 0; i < root->vars.n; i++)
            if (str_same(root->vars.k[i], ks)) {
                rc = agent_err(AGENT_EINVAL, "template variable '%s' is a built-in name", k);
                goto done;
            }
        tpl_val v;
        if ((rc = from_json(&c, jv, &v, 0))) goto done;
        if ((rc = scope_set(&c, root, ks, v))) goto done;
    }
    tpl_sb b;
    tpl_sb_init(&b, &arena);
    rc = ev_block(&c, root, t->prog.body, t->prog.n, &b);
    if (rc == R_BREAK || rc == R_CONTINUE) {
        rc = tpl_errf(t->src, t->src_len, t->src_len, "break or continue outside a loop");
        goto done;
    }
    if (rc) goto done;
    if (b.oom) {
        rc = OOM();
        goto done;
    }
    *out = malloc(b.len + 1);
    if (!*out) {
        rc = agent_err(AGENT_ENOMEM, "out of memory");
        goto done;
    }
    if (b.len) memcpy(*out, b.p, b.len);
    (*out)[b.len] = 0;
    if (out_len) *out_len = b.len;
done:
    tpl_arena_free(&arena);
    return rc;
}
