/* Strict recursive-descent JSON reader; see json.h. */
#include "json.h"

#include "common.h"
#include "unicode.h"

#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 64

typedef struct {
    engine_json *doc;
    const unsigned char *s;
    size_t len, pos;
    const char *name;
} parser;

static int fail(parser *p, const char *what) {
    return engine_err(ENGINE_EFORMAT, "%s: invalid JSON: %s at byte %zu", p->name, what, p->pos);
}

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static int new_node(parser *p, engine_json_type type, uint32_t *idx) {
    engine_json *d = p->doc;
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 1024 + p->len / 12; /* ~ one value per 12 bytes */
        if (cap > UINT32_MAX) return engine_err(ENGINE_ERANGE, "%s: JSON too large", p->name);
        engine_json_node *nn = realloc(d->nodes, cap * sizeof *nn);
        if (!nn) return engine_err(ENGINE_ENOMEM, "%s: out of memory parsing JSON", p->name);
        d->nodes = nn;
        d->cap = cap;
    }
    memset(&d->nodes[d->n], 0, sizeof d->nodes[0]);
    d->nodes[d->n].type = (uint8_t)type;
    *idx = (uint32_t)d->n++;
    return 0;
}

static int hex4(parser *p, uint32_t *out) {
    uint32_t v = 0;
    if (p->len - p->pos < 4) return fail(p, "truncated \\u escape");
    for (int i = 0; i < 4; i++) {
        unsigned char c = p->s[p->pos++];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else return fail(p, "bad hex digit in \\u escape");
    }
    *out = v;
    return 0;
}

/* Parse a string at p->pos (the opening quote); its bytes go to doc->strs. */
static int parse_string(parser *p, uint32_t *off, uint32_t *len) {
    engine_json *d = p->doc;
    size_t start = d->sn;
    p->pos++; /* quote */
    for (;;) {
        if (p->pos >= p->len) return fail(p, "unterminated string");
        unsigned char c = p->s[p->pos];
        if (c == '"') {
            p->pos++;
            break;
        }
        if (c < 0x20) return fail(p, "control character in string");
        if (c == '\\') {
            p->pos++;
            if (p->pos >= p->len) return fail(p, "unterminated escape");
            unsigned char e = p->s[p->pos++];
            uint32_t cp;
            switch (e) {
            case '"': d->strs[d->sn++] = '"'; continue;
            case '\\': d->strs[d->sn++] = '\\'; continue;
            case '/': d->strs[d->sn++] = '/'; continue;
            case 'b': d->strs[d->sn++] = '\b'; continue;
            case 'f': d->strs[d->sn++] = '\f'; continue;
            case 'n': d->strs[d->sn++] = '\n'; continue;
            case 'r': d->strs[d->sn++] = '\r'; continue;
            case 't': d->strs[d->sn++] = '\t'; continue;
            case 'u': break;
            default: p->pos--; return fail(p, "bad escape");
            }
            int rc = hex4(p, &cp);
            if (rc) return rc;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(p, "lone low surrogate");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (p->len - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
                    return fail(p, "lone high surrogate");
                p->pos += 2;
                if ((rc = hex4(p, &lo))) return rc;
                if (lo < 0xDC00 || lo > 0xDFFF) return fail(p, "bad low surrogate");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            d->sn += engine_utf8_put(cp, (unsigned char *)d->strs + d->sn);
            continue;
        }
        if (c < 0x80) {
            d->strs[d->sn++] = (char)c;
            p->pos++;
            continue;
        }
        /* raw UTF-8: one whole, valid character */
        int complete, invalid;
        size_t k = engine_utf8_scan(p->s + p->pos, p->len - p->pos, &complete, &invalid);
        if (!complete) return fail(p, "invalid UTF-8 in string");
        memcpy(d->strs + d->sn, p->s + p->pos, k);
        d->sn += k;
        p->pos += k;
    }
    d->strs[d->sn++] = 0;
    *off = (uint32_t)start;
    *len = (uint32_t)(d->sn - start - 1);
    return 0;
}

static int parse_number(parser *p, uint32_t idx) {
    size_t start = p->pos;
    bool neg = false, is_int = true, overflow = false;
    uint64_t v = 0;
    if (p->s[p->pos] == '-') {
        neg = true;
        p->pos++;
    }
    if (p->pos >= p->len) return fail(p, "truncated number");
    if (p->s[p->pos] == '0') {
        p->pos++;
    } else if (p->s[p->pos] >= '1' && p->s[p->pos] <= '9') {
        while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
            unsigned d = p->s[p->pos++] - '0';
            if (v > (UINT64_MAX - d) / 10) overflow = true;
            else v = v * 10 + d;
        }
    } else return fail(p, "bad number");
    if (p->pos < p->len && p->s[p->pos] == '.') {
        is_int = false;
        p->pos++;
        if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9')
            return fail(p, "bad fraction");
        while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
    }
    if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
        is_int = false;
        p->pos++;
        if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-')) p->pos++;
        if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9')
            return fail(p, "bad exponent");
        while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
    }
    engine_json_node *n = &p->doc->nodes[idx];
    char num[64]; /* the text is not NUL-terminated: strtod reads a bounded copy (numbers
                   * longer than 63 characters keep only their first 63) */
    size_t nl = p->pos - start < sizeof num - 1 ? p->pos - start : sizeof num - 1;
    memcpy(num, p->s + start, nl);
    num[nl] = '\0';
    n->dval = strtod(num, NULL);
    if (is_int && !overflow && v <= (uint64_t)INT64_MAX) {
        n->is_int = true;
        n->ival = neg ? -(int64_t)v : (int64_t)v;
    }
    return 0;
}

static int parse_value(parser *p, uint32_t *out, int depth);

static int parse_container(parser *p, uint32_t idx, bool object, int depth) {
    uint32_t last = 0, count = 0;
    unsigned char close = object ? '}' : ']';
    p->pos++;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        return 0;
    }
    for (;;) {
        uint32_t key = 0, klen = 0, child;
        int rc;
        skip_ws(p);
        if (object) {
            if (p->pos >= p->len || p->s[p->pos] != '"') return fail(p, "expected a key");
            if ((rc = parse_string(p, &key, &klen))) return rc;
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') return fail(p, "expected ':'");
            p->pos++;
        }
        if ((rc = parse_value(p, &child, depth + 1))) return rc;
        engine_json_node *c = &p->doc->nodes[child];
        c->key = key;
        c->klen = klen;
        if (last) p->doc->nodes[last].next = child;
        else p->doc->nodes[idx].child = child;
        last = child;
        if (count == UINT32_MAX) return fail(p, "too many elements");
        count++;
        skip_ws(p);
        if (p->pos >= p->len) return fail(p, "unterminated container");
        if (p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->s[p->pos] == close) {
            p->pos++;
            break;
        }
        return fail(p, object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
    p->doc->nodes[idx].count = count;
    return 0;
}

static int literal(parser *p, const char *word) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) return fail(p, "bad literal");
    p->pos += n;
    return 0;
}

static int parse_value(parser *p, uint32_t *out, int depth) {
    int rc;
    if (depth > JSON_MAX_DEPTH) return fail(p, "nesting too deep");
    skip_ws(p);
    if (p->pos >= p->len) return fail(p, "expected a value");
    unsigned char c = p->s[p->pos];
    uint32_t idx;
    switch (c) {
    case '{':
    case '[':
        if ((rc = new_node(p, c == '{' ? ENGINE_JSON_OBJECT : ENGINE_JSON_ARRAY, &idx))) return rc;
        if ((rc = parse_container(p, idx, c == '{', depth))) return rc;
        break;
    case '"': {
        uint32_t off, len;
        if ((rc = new_node(p, ENGINE_JSON_STRING, &idx))) return rc;
        if ((rc = parse_string(p, &off, &len))) return rc;
        p->doc->nodes[idx].str = off;
        p->doc->nodes[idx].len = len;
        break;
    }
    case 't':
        if ((rc = new_node(p, ENGINE_JSON_TRUE, &idx)) || (rc = literal(p, "true"))) return rc;
        break;
    case 'f':
        if ((rc = new_node(p, ENGINE_JSON_FALSE, &idx)) || (rc = literal(p, "false"))) return rc;
        break;
    case 'n':
        if ((rc = new_node(p, ENGINE_JSON_NULL, &idx)) || (rc = literal(p, "null"))) return rc;
        break;
    default:
        if (c != '-' && (c < '0' || c > '9')) return fail(p, "unexpected character");
        if ((rc = new_node(p, ENGINE_JSON_NUMBER, &idx)) || (rc = parse_number(p, idx))) return rc;
        break;
    }
    *out = idx;
    return 0;
}

int engine_json_parse(engine_json *doc, const char *text, size_t len, const char *name) {
    memset(doc, 0, sizeof *doc);
    if (len >= UINT32_MAX) return engine_err(ENGINE_ERANGE, "%s: JSON file too large", name);
    /* unescaped strings never exceed the input, plus one NUL each (at most len/2 strings) */
    doc->strs = malloc(len + len / 2 + 2);
    if (!doc->strs) return engine_err(ENGINE_ENOMEM, "%s: out of memory parsing JSON", name);
    parser p = {doc, (const unsigned char *)text, len, 0, name};
    uint32_t root;
    int rc = parse_value(&p, &root, 0);
    if (!rc) {
        skip_ws(&p);
        if (p.pos != p.len) rc = fail(&p, "trailing characters");
    }
    if (rc) engine_json_deinit(doc);
    return rc;
}

void engine_json_deinit(engine_json *doc) {
    free(doc->nodes);
    free(doc->strs);
    memset(doc, 0, sizeof *doc);
}

const engine_json_node *engine_json_first(const engine_json *doc, const engine_json_node *n) {
    if (!n || (n->type != ENGINE_JSON_ARRAY && n->type != ENGINE_JSON_OBJECT) || !n->child)
        return NULL;
    return &doc->nodes[n->child];
}

const engine_json_node *engine_json_next(const engine_json *doc, const engine_json_node *n) {
    return n && n->next ? &doc->nodes[n->next] : NULL;
}

const engine_json_node *engine_json_get(const engine_json *doc, const engine_json_node *obj,
                                        const char *key) {
    if (!obj || obj->type != ENGINE_JSON_OBJECT) return NULL;
    size_t kl = strlen(key);
    for (const engine_json_node *c = engine_json_first(doc, obj); c; c = engine_json_next(doc, c))
        if (c->klen == kl && memcmp(doc->strs + c->key, key, kl) == 0) return c;
    return NULL;
}
