/* The generated text of a chat turn -> events: a leading <think> block (reasoning), content,
 * complete <tool_call> blocks (parsed and checked by agent_toolcall_parse). Text that could
 * still turn into a marker ("<tool_", "</thi") is held back until the next bytes decide, so
 * events never depend on how the text was cut into pieces (tests/server/fuzz_split.c checks
 * exactly that). */
#include "server_core.h"
#include "dialects.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    P_START, /* chat: a leading <think> block or content */
    P_THINK,
    P_SKIP_WS, /* whitespace after </think> or after a tool call */
    P_CONTENT,
    P_TOOL, /* inside <tool_call> ... </tool_call> */
    P_RAW,  /* raw completion: everything is text */
};

void srv_split_init(srv_split *sp, bool raw, bool think, const char *tools_json,
                    agent_toolcall_format fmt) {
    memset(sp, 0, sizeof *sp);
    sp->ps = raw ? P_RAW : P_START;
    sp->think = think;
    sp->tools_json = tools_json;
    sp->fmt = fmt;
}

void srv_split_think_open(srv_split *sp) {
    if (sp->ps == P_START) {
        sp->think = true;
        sp->thought = true;
        sp->ps = P_THINK;
    }
}

bool srv_think_watch_feed(srv_think_watch *w, const char *b, size_t n) {
    static const char tag[] = "</think>";
    const size_t tl = sizeof tag - 1, keep = tl - 1;
    if (!n) return false;
    /* the kept bytes and the token's first bytes: a tag across tokens; then the token */
    char buf[sizeof w->tail + 16];
    size_t k = n < 16 ? n : 16, bl = w->len;
    memcpy(buf, w->tail, bl);
    memcpy(buf + bl, b, k);
    bl += k;
    if (memmem(buf, bl, tag, tl) || (n > k && memmem(b, n, tag, tl))) return true;
    if (n >= keep) {
        memcpy(w->tail, b + n - keep, keep);
        w->len = keep;
    } else {
        size_t from = bl > keep ? bl - keep : 0;
        memmove(w->tail, buf + from, bl - from);
        w->len = bl - from;
    }
    return false;
}

void srv_split_set_deltas(srv_split *sp, bool on) {
    sp->deltas = on;
}

void srv_split_free(srv_split *sp) {
    srv_buf_free(&sp->text);
    agent_reply_clear(&sp->reply);
    json_decref(sp->tools);
    srv_buf_free(&sp->name);
    srv_buf_free(&sp->tok);
    srv_buf_free(&sp->args);
}

int srv_split_feed(srv_split *sp, const char *d, size_t n) {
    return srv_buf_add(&sp->text, d, n);
}

int srv_split_calls(const srv_split *sp) {
    return sp->n_calls;
}

/* Longest suffix of t[0..n) that is a proper prefix of mark (a marker possibly cut off). */
static size_t partial_suffix(const char *t, size_t n, const char *mark) {
    size_t ml = strlen(mark);
    for (size_t k = ml - 1; k > 0; k--)
        if (k <= n && !memcmp(t + n - k, mark, k)) return k;
    return 0;
}

static const char *find(const char *h, size_t hn, const char *needle) {
    size_t nl = strlen(needle);
    if (nl > hn) return NULL;
    for (size_t i = 0; i + nl <= hn; i++)
        if (h[i] == needle[0] && !memcmp(h + i, needle, nl)) return h + i;
    return NULL;
}

/* Text up to a marker: the bytes that cannot be the start of `mark` (all of them when done),
 * or up to it (*found = its offset from pos, else SIZE_MAX). */
static size_t scan_to(const srv_split *sp, const char *mark, bool done, size_t *found) {
    const char *t = sp->text.p + sp->pos;
    size_t n = sp->text.len - sp->pos;
    const char *hit = mark ? find(t, n, mark) : NULL;
    if (hit) {
        *found = (size_t)(hit - t);
        return *found;
    }
    *found = SIZE_MAX;
    if (done || !mark) return n;
    return n - partial_suffix(t, n, mark);
}

static int emit(srv_split *sp, srv_ev_type type, size_t n, srv_event *ev) {
    ev->type = type;
    ev->text = sp->text.p + sp->pos;
    ev->len = n;
    sp->pos += n;
    return 1;
}


/* ----- streaming a call's arguments ---------------------------------------------------------
 * While a <tool_call> block is written, its arguments are rewritten as they come into the
 * exact text the finished call's parse gives (agent_toolcall_parse: jansson's compact dump
 * with the keys in order): whitespace outside strings dropped, strings re-escaped the way
 * jansson writes them, numbers and literals re-dumped by jansson once complete. The bytes
 * produced are given as TOOL_DELTA events; at </tool_call> the parsed arguments must start
 * with them (else the call is reported with tool_error). Anything the streamer does not
 * expect stops it (CS_OFF): the rest of the arguments then comes with the TOOL_CALL event. */
enum {
    CS_OFF,      /* not streaming (any more) */
    CS_H_OPEN,   /* Hermes: expecting the body's '{' */
    CS_H_KEY,    /* expecting "name" (or "arguments" once the name is known) */
    CS_H_KEYSTR, /* inside that key */
    CS_H_COLON,  /* ':' after the key */
    CS_H_NAME,   /* the name's string value (after its quote) */
    CS_H_NAMEQ,  /* expecting the name value's opening quote */
    CS_H_COMMA,  /* ',' after the name */
    CS_H_ARGS0,  /* expecting the arguments' '{' */
    CS_H_ARGS,   /* inside the arguments */
    CS_X_FUNC,   /* XML: expecting <function=NAME> */
    CS_X_PARAMS, /* expecting <parameter=NAME> or </function> */
    CS_X_VALUE,  /* inside a parameter's value */
    CS_DONE,     /* the arguments are complete */
};

static int cs_put(srv_split *sp, const char *s, size_t n) {
    return srv_buf_add(&sp->args, s, n);
}

/* Bytes inside a JSON string as jansson escapes them (UTF-8 passes unchanged). */
static int cs_put_escaped(srv_buf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[8];
        const char *out = e;
        size_t len = 2;
        e[0] = '\\';
        switch (c) {
        case '"': e[1] = '"'; break;
        case '\\': e[1] = '\\'; break;
        case '\b': e[1] = 'b'; break;
        case '\f': e[1] = 'f'; break;
        case '\n': e[1] = 'n'; break;
        case '\r': e[1] = 'r'; break;
        case '\t': e[1] = 't'; break;
        default:
            if (c < 0x20) {
                snprintf(e, sizeof e, "\\u%04X", c);
                len = 6;
            } else {
                size_t k = i;
                while (k < n && (unsigned char)s[k] >= 0x20 && s[k] != '"' && s[k] != '\\')
                    k++;
                out = s + i;
                len = k - i;
                i = k - 1;
            }
        }
        if (srv_buf_add(b, out, len)) return -1;
    }
    return 0;
}

/* A code point as UTF-8. */
static int cs_put_cp(srv_buf *b, uint32_t cp) {
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp, n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 63)), n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | (cp >> 6 & 63));
        u[2] = (char)(0x80 | (cp & 63)), n = 3;
    } else {
        u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | (cp >> 12 & 63));
        u[2] = (char)(0x80 | (cp >> 6 & 63)), u[3] = (char)(0x80 | (cp & 63)), n = 4;
    }
    return srv_buf_add(b, u, n);
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* One byte inside a JSON string (after its opening quote). Decoded text goes to `raw` (when
 * non-NULL) or re-escaped to `enc`. 1 at the closing quote, 0 to go on, -1 for what jansson
 * refuses (control characters, bad escapes, lone surrogates, \u0000). */
static int cs_str_byte(srv_split *sp, char c, srv_buf *raw, srv_buf *enc) {
    uint32_t cp;
    if (sp->esc == 0) {
        if (c == '"') return sp->hi ? -1 : 1;
        if (c == '\\') {
            sp->esc = 1;
            return 0;
        }
        if ((unsigned char)c < 0x20 || sp->hi) return -1;
        return (raw ? srv_buf_add(raw, &c, 1) : cs_put_escaped(enc, &c, 1)) ? -1 : 0;
    }
    if (sp->esc == 1) {
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
        const char *k = c ? strchr(from, c) : NULL;
        if (c == 'u') {
            sp->esc = 2;
            sp->u = 0;
            return 0;
        }
        sp->esc = 0;
        if (!k || sp->hi) return -1;
        char d = to[k - from];
        return (raw ? srv_buf_add(raw, &d, 1) : cs_put_escaped(enc, &d, 1)) ? -1 : 0;
    }
    int h = hexval(c);
    if (h < 0) return -1;
    sp->u = sp->u << 4 | (uint32_t)h;
    if (++sp->esc < 6) return 0;
    sp->esc = 0;
    cp = sp->u;
    if (cp >= 0xD800 && cp < 0xDC00) {
        if (sp->hi) return -1;
        sp->hi = cp;
        return 0;
    }
    if (cp >= 0xDC00 && cp < 0xE000) {
        if (!sp->hi) return -1;
        cp = 0x10000 + ((sp->hi - 0xD800) << 10) + (cp - 0xDC00);
        sp->hi = 0;
    } else if (sp->hi || cp == 0) {
        return -1;
    }
    if (raw) return cs_put_cp(raw, cp) ? -1 : 0;
    srv_buf t = {0};
    int rc = cs_put_cp(&t, cp) || cs_put_escaped(enc, t.p, t.len) ? -1 : 0;
    srv_buf_free(&t);
    return rc;
}

static bool is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static bool is_literal(char c) {
    return (c >= '0' && c <= '9') || strchr("+-.eEtrufalsn", c) != NULL;
}

/* A complete number or literal (sp->tok), dumped by jansson. */
static int cs_literal(srv_split *sp) {
    json_t *v = json_loadb(sp->tok.p, sp->tok.len, JSON_DECODE_ANY, NULL);
    char *d = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    json_decref(v);
    sp->tok.len = 0;
    int rc = d ? cs_put(sp, d, strlen(d)) : -1;
    free(d);
    return rc;
}

/* Hermes: {"name": "N", "arguments": {...}} — one byte. */
static int cs_hermes(srv_split *sp, char c) {
    int r;
    switch (sp->cs) {
    case CS_H_OPEN:
        if (is_ws(c)) return 0;
        if (c != '{') return -1;
        sp->cs = CS_H_KEY;
        return 0;
    case CS_H_KEY:
        if (is_ws(c)) return 0;
        if (c != '"') return -1;
        sp->tok.len = 0;
        sp->cs = CS_H_KEYSTR;
        return 0;
    case CS_H_KEYSTR:
        if ((r = cs_str_byte(sp, c, &sp->tok, NULL)) <= 0) return r;
        if (sp->tok.len == 4 && !memcmp(sp->tok.p, "name", 4) && !sp->name.len)
            sp->in_str = false;
        else if (sp->tok.len == 9 && !memcmp(sp->tok.p, "arguments", 9) && sp->name.len)
            sp->in_str = true;
        else
            return -1; /* arguments before the name: not streamed */
        sp->cs = CS_H_COLON;
        return 0;
    case CS_H_COLON:
        if (is_ws(c)) return 0;
        if (c != ':') return -1;
        sp->cs = sp->in_str ? CS_H_ARGS0 : CS_H_NAMEQ;
        sp->in_str = false;
        return 0;
    case CS_H_NAMEQ:
        if (is_ws(c)) return 0;
        if (c != '"') return -1;
        sp->cs = CS_H_NAME;
        return 0;
    case CS_H_NAME:
        if ((r = cs_str_byte(sp, c, &sp->name, NULL)) <= 0) return r;
        if (!sp->name.len || memchr(sp->name.p, 0, sp->name.len)) return -1;
        sp->cs = CS_H_COMMA;
        return 0;
    case CS_H_COMMA:
        if (is_ws(c)) return 0;
        if (c != ',') return -1;
        sp->cs = CS_H_KEY;
        return 0;
    case CS_H_ARGS0:
        if (is_ws(c)) return 0;
        if (c != '{') return -1;
        sp->depth = 1;
        sp->tok.len = 0;
        sp->cs = CS_H_ARGS;
        return cs_put(sp, "{", 1);
    case CS_H_ARGS:
        if (sp->in_str) {
            if ((r = cs_str_byte(sp, c, NULL, &sp->args)) <= 0) return r;
            sp->in_str = false;
            return cs_put(sp, "\"", 1);
        }
        if (sp->tok.len) {
            if (is_literal(c)) return srv_buf_add(&sp->tok, &c, 1);
            if (cs_literal(sp)) return -1;
        }
        if (is_ws(c)) return 0;
        if (c == '"') {
            sp->in_str = true;
            return cs_put(sp, "\"", 1);
        }
        if (c == '{' || c == '[') {
            sp->depth++;
            return cs_put(sp, &c, 1);
        }
        if (c == '}' || c == ']') {
            if (--sp->depth == 0) sp->cs = CS_DONE;
            return cs_put(sp, &c, 1);
        }
        if (c == ',' || c == ':') return cs_put(sp, &c, 1);
        if (is_literal(c)) return srv_buf_add(&sp->tok, &c, 1);
        return -1;
    default:
        return 0;
    }
}

/* Whether the XML format takes parameter `param` of the call's tool verbatim as a string
 * (its schema says "string", or says nothing); as the parser decides. */
static bool cs_param_is_string(srv_split *sp, const char *param) {
    if (!sp->tools) sp->tools = json_loads(sp->tools_json, 0, NULL);
    json_t *fn = NULL;
    size_t i;
    json_t *t;
    json_array_foreach(sp->tools, i, t) {
        json_t *f = json_object_get(t, "function");
        if (!f) f = t;
        const char *n = json_string_value(json_object_get(f, "name"));
        if (n && strlen(n) == sp->name.len && !memcmp(n, sp->name.p, sp->name.len)) {
            fn = f;
            break;
        }
    }
    if (!fn) return false; /* unknown tool: every value is tried as JSON */
    json_t *ps = json_object_get(json_object_get(json_object_get(fn, "parameters"),
                                                 "properties"), param);
    json_t *ty = json_object_get(ps, "type");
    if (!ps || !ty) return true;
    if (json_is_string(ty)) return !strcmp(json_string_value(ty), "string");
    json_array_foreach(ty, i, t) if (json_is_string(t) && !strcmp(json_string_value(t), "string"))
        return true;
    return false;
}

/* XML: <function=N> (<parameter=P>\nV\n</parameter>)* </function>, over body[0..n) (the
 * markup after <tool_call>, the possible start of </tool_call> held back). */
static int cs_xml(srv_split *sp, const char *body, size_t n) {
    static const char fo[] = "<function=", po[] = "<parameter=", pc[] = "</parameter>",
                      fc[] = "</function>";
    while (sp->cs != CS_OFF && sp->cs != CS_DONE) {
        while (sp->cs != CS_X_VALUE && sp->at < n && is_ws(body[sp->at]))
            sp->at++;
        const char *t = body + sp->at;
        size_t left = n - sp->at;
        if (sp->cs == CS_X_FUNC || sp->cs == CS_X_PARAMS) {
            bool func = sp->cs == CS_X_FUNC;
            const char *open = func ? fo : po;
            size_t ol = strlen(open);
            if (!func && left && !memcmp(t, fc, left < 11 ? left : 11)) {
                if (left < 11) return 0;
                sp->at += 11;
                sp->cs = CS_DONE;
                return cs_put(sp, sp->x_any ? "}" : "{}", sp->x_any ? 1 : 2);
            }
            if (memcmp(t, open, left < ol ? left : ol)) return -1;
            const char *gt = left > ol ? memchr(t + ol, '>', left - ol) : NULL;
            if (!gt) {
                if (memchr(t, '\n', left)) return -1;
                return 0;
            }
            size_t nl = (size_t)(gt - t) - ol;
            if (!nl || memchr(t + ol, '\n', nl)) return -1;
            sp->at += ol + nl + 1;
            if (func) {
                if (srv_buf_add(&sp->name, t + ol, nl) || memchr(t + ol, 0, nl)) return -1;
                sp->cs = CS_X_PARAMS;
                continue;
            }
            if (memchr(t + ol, 0, nl)) return -1; /* the parser's name ends at a NUL */
            char *pname = malloc(nl + 1);
            if (!pname) return -1;
            memcpy(pname, t + ol, nl);
            pname[nl] = 0;
            sp->x_str = cs_param_is_string(sp, pname);
            int rc = cs_put(sp, sp->x_any ? "," : "{", 1) || cs_put(sp, "\"", 1) ||
                     cs_put_escaped(&sp->args, pname, nl) || cs_put(sp, "\":", 2);
            free(pname);
            if (rc) return -1;
            sp->x_any = true;
            sp->mark = sp->at; /* the value's first byte */
            sp->in_str = false; /* not yet past the leading newline */
            sp->tok.len = 0;
            sp->cs = CS_X_VALUE;
            if (sp->x_str && cs_put(sp, "\"", 1)) return -1;
            continue;
        }
        /* CS_X_VALUE: from sp->mark (the value's start) */
        const char *v = body + sp->mark;
        size_t vn = n - sp->mark;
        if (!sp->in_str) {
            if (!vn) return 0;
            if (v[0] == '\n') sp->mark++, v++, vn--;
            sp->in_str = true;
            sp->at = sp->mark;
        }
        const char *end = find(v, vn, pc);
        if (!end) {
            if (!sp->x_str) return 0; /* a typed value is converted once complete */
            size_t safe = vn - partial_suffix(v, vn, pc);
            if (safe && v[safe - 1] == '\n') safe--;
            size_t from = sp->at - sp->mark;
            if (safe > from && cs_put_escaped(&sp->args, v + from, safe - from)) return -1;
            if (safe > from) sp->at = sp->mark + safe;
            return 0;
        }
        size_t e = (size_t)(end - v), from = sp->at - sp->mark;
        if (e && v[e - 1] == '\n') e--;
        if (sp->x_str) {
            if ((e > from && cs_put_escaped(&sp->args, v + from, e - from)) || cs_put(sp, "\"", 1))
                return -1;
        } else {
            json_t *jv = json_loadb(v, e, JSON_DECODE_ANY, NULL);
            char *d = jv ? json_dumps(jv, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
            json_decref(jv);
            int rc = 0;
            if (d)
                rc = cs_put(sp, d, strlen(d));
            else if (!jv)
                rc = cs_put(sp, "\"", 1) || cs_put_escaped(&sp->args, v, e) || cs_put(sp, "\"", 1);
            else
                rc = -1;
            free(d);
            if (rc) return -1;
        }
        sp->at = (size_t)(end - body) + 12;
        sp->cs = CS_X_PARAMS;
    }
    return 0;
}

/* Scan the call markup t[0..n) (from "<tool_call>"; the end tag or its possible start
 * excluded) as far as it goes. */
static void cs_scan(srv_split *sp, const char *t, size_t n) {
    if (n < 11) return;
    const char *body = t + 11;
    size_t bn = n - 11;
    int rc = 0;
    if (sp->fmt == AGENT_TOOLCALL_XML) {
        rc = cs_xml(sp, body, bn);
    } else {
        for (; sp->at < bn && sp->cs != CS_OFF && sp->cs != CS_DONE && !rc; sp->at++)
            rc = cs_hermes(sp, body[sp->at]);
    }
    if (rc) sp->cs = CS_OFF;
}

/* A new call starts: reset the streamer. */
static void cs_reset(srv_split *sp) {
    sp->cs = !sp->deltas || !sp->tools_json  ? CS_OFF
             : sp->fmt == AGENT_TOOLCALL_XML ? CS_X_FUNC
                                             : CS_H_OPEN;
    sp->at = sp->mark = 0;
    sp->begun = sp->in_str = sp->x_str = sp->x_any = false;
    sp->depth = sp->esc = 0;
    sp->u = sp->hi = 0;
    sp->name.len = sp->tok.len = sp->args.len = 0;
    sp->sent = 0;
}

/* The next TOOL_DELTA of the call being written, if any. */
static int cs_delta(srv_split *sp, const char *t, size_t n, srv_event *ev) {
    if (sp->cs == CS_OFF && !sp->begun) return 0;
    cs_scan(sp, t, n);
    /* announced once the arguments start: how far the scan got before that depends on how
     * the text was cut, what it produced does not */
    bool announce = !sp->begun && sp->name.len && sp->args.len;
    if (!announce && (!sp->begun || sp->args.len == sp->sent)) return 0;
    if (announce) {
        if (srv_buf_add(&sp->name, "", 1)) { /* NUL-terminate */
            sp->cs = CS_OFF;
            return 0;
        }
        sp->name.len--;
        srv_random_id(sp->call_id, sizeof sp->call_id, "call_");
        sp->begun = true;
    }
    /* never a piece that ends inside a UTF-8 character */
    size_t len = sp->args.p ? agent_utf8_complete_len(sp->args.p + sp->sent,
                                                      sp->args.len - sp->sent)
                            : 0;
    ev->type = SRV_EV_TOOL_DELTA;
    ev->tool_index = sp->n_calls;
    ev->tool_id = sp->call_id;
    ev->tool_name = sp->name.p;
    ev->text = sp->args.p ? sp->args.p + sp->sent : "";
    ev->len = len;
    sp->sent += len;
    return announce || len ? 1 : 0;
}

int srv_split_next(srv_split *sp, bool done, srv_event *ev) {
    memset(ev, 0, sizeof *ev);
    for (;;) {
        const char *t = sp->text.p ? sp->text.p + sp->pos : "";
        size_t n = sp->text.len - sp->pos, found, k;
        switch (sp->ps) {
        case P_RAW:
            return n ? emit(sp, SRV_EV_TEXT, n, ev) : 0;
        case P_START:
            if (!sp->think) {
                sp->ps = P_CONTENT;
                continue;
            }
            if (n < 8 && !done && !memcmp(t, "<think>\n", n)) return 0;
            if (n >= 7 && !memcmp(t, "<think>", 7)) {
                sp->pos += 7 + (n > 7 && t[7] == '\n');
                sp->thought = true;
                sp->ps = P_THINK;
            } else {
                sp->ps = P_CONTENT;
            }
            continue;
        case P_THINK: {
            /* reasoning ends at the first </think>; the template writes "\n</think>", so a
             * newline right before it is markup (and is held back until that is known) */
            const char *end = find(t, n, "</think>");
            if (end) {
                size_t e = (size_t)(end - t), r = e && t[e - 1] == '\n' ? e - 1 : e;
                size_t start = sp->pos;
                if (r) emit(sp, SRV_EV_REASONING, r, ev);
                sp->pos = start + e + 8;
                sp->ps = P_SKIP_WS;
                if (r) return 1;
                continue;
            }
            k = done ? n : n - partial_suffix(t, n, "</think>");
            if (!done && k && t[k - 1] == '\n') k--;
            return k ? emit(sp, SRV_EV_REASONING, k, ev) : 0;
        }
        case P_SKIP_WS:
            while (sp->pos < sp->text.len && strchr(" \t\r\n", sp->text.p[sp->pos]))
                sp->pos++;
            if (sp->pos < sp->text.len || done) {
                sp->ps = P_CONTENT;
                continue;
            }
            return 0;
        case P_CONTENT:
            k = scan_to(sp, sp->tools_json ? "<tool_call>" : NULL, done, &found);
            if (found != SIZE_MAX) {
                if (found) return emit(sp, SRV_EV_TEXT, found, ev);
                sp->ps = P_TOOL;
                cs_reset(sp);
                continue;
            }
            return k ? emit(sp, SRV_EV_TEXT, k, ev) : 0;
        case P_TOOL: {
            const char *end = find(t, n, "</tool_call>");
            size_t avail = end ? (size_t)(end - t) : n - partial_suffix(t, n, "</tool_call>");
            if (sp->deltas && cs_delta(sp, t, avail, ev)) return 1;
            if (!end) {
                if (!done) return 0;
                sp->ps = P_CONTENT;
                if (sp->begun) {
                    /* cut off inside a call that was announced: it ends as far as it went */
                    emit(sp, SRV_EV_TOOL_CALL, n, ev);
                    ev->tool_index = sp->n_calls++;
                    ev->tool_id = sp->call_id;
                    ev->tool_name = sp->name.p;
                    ev->tool_args = sp->args.p ? sp->args.p : "";
                    ev->tool_error = "the tool call was cut off";
                    ev->tool_begun = true;
                    ev->tool_streamed = sp->sent;
                    return 1;
                }
                /* cut off inside a call (length or cancel): the markup stays text */
                return n ? emit(sp, SRV_EV_TEXT, n, ev) : 0;
            }
            size_t blen = (size_t)(end - t) + 12;
            agent_reply_clear(&sp->reply);
            int rc = agent_toolcall_parse(&sp->reply, t, blen, sp->fmt, sp->tools_json, NULL, NULL);
            sp->ps = P_SKIP_WS;
            if (!sp->begun && (rc || sp->reply.n_calls == 0))
                return emit(sp, SRV_EV_TEXT, blen, ev);
            agent_toolcall *tc = !rc && sp->reply.n_calls ? &sp->reply.calls[0] : NULL;
            if (!sp->begun) srv_random_id(sp->call_id, sizeof sp->call_id, "call_");
            emit(sp, SRV_EV_TOOL_CALL, blen, ev);
            ev->tool_index = sp->n_calls++;
            ev->tool_id = sp->call_id;
            ev->tool_name = tc && tc->name ? tc->name : "";
            ev->tool_args = tc && tc->args_json ? tc->args_json : "{}";
            ev->tool_error = tc ? tc->error : "the tool call could not be parsed";
            if (sp->begun) {
                ev->tool_begun = true;
                ev->tool_streamed = sp->sent;
                ev->tool_name = sp->name.p;
                if (!ev->tool_error && (strlen(ev->tool_args) < sp->sent ||
                                        (sp->sent && memcmp(ev->tool_args, sp->args.p,
                                                            sp->sent)))) {
                    ev->tool_error = "the call's arguments differ from what was streamed";
                }
                if (ev->tool_error) ev->tool_args = sp->args.p ? sp->args.p : "";
                if (tc && tc->name && strcmp(tc->name, sp->name.p) && !ev->tool_error)
                    ev->tool_error = "the call's name differs from what was streamed";
            }
            return 1;
        }
        default:
            return 0;
        }
    }
}
