/* The generated text of a chat turn -> events: a leading <think> block (reasoning), content,
 * complete <tool_call> blocks (parsed and checked by agent_toolcall_parse). Text that could
 * still turn into a marker ("<tool_", "</thi") is held back until the next bytes decide, so
 * events never depend on how the text was cut into pieces (tests/server/fuzz_split.c checks
 * exactly that). */
#include "server_core.h"

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

void srv_split_free(srv_split *sp) {
    srv_buf_free(&sp->text);
    agent_reply_clear(&sp->reply);
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
                continue;
            }
            return k ? emit(sp, SRV_EV_TEXT, k, ev) : 0;
        case P_TOOL: {
            const char *end = find(t, n, "</tool_call>");
            if (!end) {
                if (!done) return 0;
                /* cut off inside a call (length or cancel): the markup stays text */
                sp->ps = P_CONTENT;
                return n ? emit(sp, SRV_EV_TEXT, n, ev) : 0;
            }
            size_t blen = (size_t)(end - t) + 12;
            agent_reply_clear(&sp->reply);
            int rc = agent_toolcall_parse(&sp->reply, t, blen, sp->fmt, sp->tools_json, NULL, NULL);
            sp->ps = P_SKIP_WS;
            if (rc || sp->reply.n_calls == 0) return emit(sp, SRV_EV_TEXT, blen, ev);
            agent_toolcall *tc = &sp->reply.calls[0];
            srv_random_id(sp->call_id, sizeof sp->call_id, "call_");
            emit(sp, SRV_EV_TOOL_CALL, blen, ev);
            ev->tool_index = sp->n_calls++;
            ev->tool_id = sp->call_id;
            ev->tool_name = tc->name ? tc->name : "";
            ev->tool_args = tc->args_json ? tc->args_json : "{}";
            ev->tool_error = tc->error;
            return 1;
        }
        default:
            return 0;
        }
    }
}
