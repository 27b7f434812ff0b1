/* Server-sent events of a streamed /chat/completions answer -> content and tool calls. */
#include "sse_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool grow(char **d, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    size_t nc = *cap ? *cap : 256;
    while (nc < need) nc *= 2;
    char *p = realloc(*d, nc);
    if (!p) return false;
    *d = p;
    *cap = nc;
    return true;
}

int agent_sse_init(agent_sse *s, agent_text_fn on_text, void *user) {
    memset(s, 0, sizeof *s);
    s->on_text = on_text;
    s->user = user;
    s->calls = json_array();
    if (!s->calls) return agent_err(AGENT_ENOMEM, "out of memory");
    return 0;
}

void agent_sse_deinit(agent_sse *s) {
    free(s->line);
    free(s->data);
    free(s->content);
    json_decref(s->calls);
    memset(s, 0, sizeof *s);
}

static void fail(agent_sse *s, const char *msg) {
    if (!s->error[0]) snprintf(s->error, sizeof s->error, "%s", msg);
}

static bool count_text(agent_sse *s, size_t n) {
    if (s->text_total + n > AGENT_SSE_MAX_TEXT) {
        fail(s, "the answer is longer than 64 MiB");
        return false;
    }
    s->text_total += n;
    return true;
}

/* One event's data: a chat.completion.chunk, an error object, or [DONE]. */
static void event(agent_sse *s, const char *data, size_t n) {
    if (n == 6 && !memcmp(data, "[DONE]", 6)) {
        s->done = true;
        return;
    }
    json_t *v = json_loadb(data, n, 0, NULL);
    if (!json_is_object(v)) { /* not JSON: keep-alives and oddities are skipped */
        json_decref(v);
        return;
    }
    json_t *err = json_object_get(v, "error");
    if (err) {
        const char *m = json_string_value(json_object_get(err, "message"));
        if (!m) m = json_string_value(err);
        char msg[400];
        snprintf(msg, sizeof msg, "the server reported an error in the stream: %.300s",
                 m ? m : "(no message)");
        fail(s, msg);
        json_decref(v);
        return;
    }
    json_t *ch = json_array_get(json_object_get(v, "choices"), 0);
    json_t *d = json_object_get(ch, "delta");
    const char *fr = json_string_value(json_object_get(ch, "finish_reason"));
    if (fr && !strcmp(fr, "length")) s->finished_length = true;
    json_t *cj = json_object_get(d, "content");
    const char *c = json_string_value(cj);
    size_t cl = json_string_length(cj);
    if (c && cl && count_text(s, cl)) {
        if (!grow(&s->content, &s->content_cap, s->content_n + cl + 1)) {
            s->oom = true;
        } else {
            memcpy(s->content + s->content_n, c, cl);
            s->content_n += cl;
            s->content[s->content_n] = 0;
            if (s->on_text) s->on_text(s->user, c, cl);
        }
        s->chunks++;
    }
    size_t i;
    json_t *tc;
    json_array_foreach(json_object_get(d, "tool_calls"), i, tc) {
        json_t *ij = json_object_get(tc, "index");
        json_int_t idx = json_is_integer(ij) ? json_integer_value(ij) : (json_int_t)i;
        if (idx < 0 || idx >= AGENT_SSE_MAX_CALLS) {
            fail(s, "a tool call index out of range (0..63)");
            continue;
        }
        while ((json_int_t)json_array_size(s->calls) <= idx)
            if (json_array_append_new(s->calls, json_pack("{s:s, s:s}", "name", "", "arguments",
                                                          ""))) {
                s->oom = true;
                break;
            }
        json_t *slot = json_array_get(s->calls, (size_t)idx);
        if (!slot) break;
        json_t *f = json_object_get(tc, "function");
        const char *nm = json_string_value(json_object_get(f, "name"));
        json_t *aj = json_object_get(f, "arguments");
        const char *ar = json_string_value(aj);
        if (nm && *nm) json_object_set_new(slot, "name", json_string(nm));
        if (ar && count_text(s, json_string_length(aj))) {
            json_t *old = json_object_get(slot, "arguments");
            size_t ol = json_string_length(old), al = json_string_length(aj);
            char *cat = malloc(ol + al + 1);
            if (!cat) {
                s->oom = true;
                break;
            }
            memcpy(cat, json_string_value(old), ol);
            memcpy(cat + ol, ar, al);
            cat[ol + al] = 0;
            json_object_set_new(slot, "arguments", json_stringn(cat, ol + al));
            free(cat);
        }
        s->chunks++;
    }
    json_decref(v);
}

static void dispatch(agent_sse *s) {
    if (s->have_data) event(s, s->data ? s->data : "", s->data_n);
    s->have_data = false;
    s->data_n = 0;
}

/* A complete line (without its end). */
static void line(agent_sse *s, const char *l, size_t n) {
    if (n == 0) {
        dispatch(s);
        return;
    }
    if (l[0] == ':') return; /* a comment */
    const char *colon = memchr(l, ':', n);
    size_t fl = colon ? (size_t)(colon - l) : n;
    if (fl != 4 || memcmp(l, "data", 4)) return; /* event:, id:, retry: do not matter here */
    const char *v = colon ? colon + 1 : l + n;
    if (v < l + n && *v == ' ') v++;
    size_t vl = (size_t)(l + n - v);
    if (!grow(&s->data, &s->data_cap, s->data_n + vl + 2)) {
        s->oom = true;
        return;
    }
    if (s->have_data) s->data[s->data_n++] = '\n';
    memcpy(s->data + s->data_n, v, vl);
    s->data_n += vl;
    s->data[s->data_n] = 0;
    s->have_data = true;
}

void agent_sse_feed(agent_sse *s, const char *in, size_t len) {
    for (size_t i = 0; i < len; i++) {
        char c = in[i];
        bool after_cr = s->last_cr;
        s->last_cr = c == '\r';
        if (c == '\n' && after_cr) continue; /* the LF of a CRLF */
        if (c == '\n' || c == '\r') {
            if (s->line_dropped) fail(s, "a line of the stream is longer than 16 MiB");
            else line(s, s->line ? s->line : "", s->line_n);
            s->line_n = 0;
            s->line_dropped = false;
            continue;
        }
        if (s->line_dropped) continue;
        if (s->line_n + 1 > AGENT_SSE_MAX_LINE) {
            s->line_dropped = true;
            continue;
        }
        if (!grow(&s->line, &s->line_cap, s->line_n + 1)) {
            s->oom = true;
            continue;
        }
        s->line[s->line_n++] = c;
    }
}

void agent_sse_finish(agent_sse *s) {
    if (s->line_n && !s->line_dropped) line(s, s->line, s->line_n);
    s->line_n = 0;
    dispatch(s);
}

char *agent_sse_reply(const agent_sse *s) {
    json_t *parts = json_array();
    size_t cap = s->content_n + 1, n = 0;
    size_t i;
    json_t *c;
    json_array_foreach(s->calls, i, c) {
        const char *nm = json_string_value(json_object_get(c, "name"));
        json_t *nj = json_string(nm ? nm : "");
        char *ns = nj ? json_dumps(nj, JSON_ENCODE_ANY) : NULL;
        json_decref(nj);
        if (!ns) {
            json_decref(parts);
            return NULL;
        }
        json_array_append_new(parts, json_string(ns));
        cap += strlen(ns) + json_string_length(json_object_get(c, "arguments")) + 64;
        free(ns);
    }
    char *t = parts ? malloc(cap) : NULL;
    if (!t) {
        json_decref(parts);
        return NULL;
    }
    if (s->content_n) memcpy(t, s->content, s->content_n);
    n = s->content_n;
    json_array_foreach(s->calls, i, c) {
        const char *ns = json_string_value(json_array_get(parts, i));
        json_t *aj = json_object_get(c, "arguments");
        const char *args = json_string_length(aj) ? json_string_value(aj) : "{}";
        size_t al = json_string_length(aj) ? json_string_length(aj) : 2;
        n += (size_t)sprintf(t + n, "\n<tool_call>\n{\"name\": %s, \"arguments\": ", ns);
        memcpy(t + n, args, al);
        n += al;
        n += (size_t)sprintf(t + n, "}\n</tool_call>");
    }
    t[n] = 0;
    json_decref(parts);
    return t;
}
