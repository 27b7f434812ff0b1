/* Shared by test_split.c and fuzz_split.c: run agent/server/split.c over a text fed in pieces
 * and describe its events as one string ("R:reasoning|T:text|C0:name:args|E:name:error|"),
 * adjacent text events of one kind merged, so that results compare across different cuts. */
#ifndef SPARK_TESTS_SPLIT_EVENTS_H
#define SPARK_TESTS_SPLIT_EVENTS_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../agent/server/server_core.h"

typedef struct {
    char *p;
    size_t len, cap;
    char last; /* kind of the last piece appended: 'R', 'T' or 0 */
} split_desc;

static void desc_add(split_desc *d, const char *s, size_t n) {
    if (d->len + n + 1 > d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 256;
        while (cap < d->len + n + 1) cap *= 2;
        char *p = realloc(d->p, cap);
        if (!p) abort();
        d->p = p;
        d->cap = cap;
    }
    memcpy(d->p + d->len, s, n);
    d->len += n;
    d->p[d->len] = 0;
}

static void desc_event(split_desc *d, const srv_event *ev, size_t text_len) {
    if (ev->type == SRV_EV_TEXT || ev->type == SRV_EV_REASONING) {
        if ((!ev->text && ev->len) || ev->len > text_len) abort(); /* out of bounds */
        char k = ev->type == SRV_EV_TEXT ? 'T' : 'R';
        if (!ev->len) return;
        if (d->last != k) {
            if (d->last) desc_add(d, "|", 1);
            desc_add(d, k == 'T' ? "T:" : "R:", 2);
        }
        desc_add(d, ev->text, ev->len);
        d->last = k;
    } else if (ev->type == SRV_EV_TOOL_CALL) {
        char head[64];
        if (d->last) desc_add(d, "|", 1);
        int n = snprintf(head, sizeof head, "%s%d:", ev->tool_error ? "E" : "C", ev->tool_index);
        desc_add(d, head, (size_t)n);
        desc_add(d, ev->tool_name, strlen(ev->tool_name));
        desc_add(d, ":", 1);
        if (ev->tool_error) desc_add(d, ev->tool_error, strlen(ev->tool_error));
        else desc_add(d, ev->tool_args, strlen(ev->tool_args));
        if (!ev->tool_id || strncmp(ev->tool_id, "call_", 5)) abort();
        d->last = 'C';
    } else {
        abort(); /* the splitter never gives DONE */
    }
}

/* Feed text[0..n) cut at the given offsets (ascending, < n), draining events after each
 * piece, then finish. Returns the malloc'd description; *calls gets srv_split_calls. */
static char *split_run(const char *text, size_t n, const size_t *cuts, size_t n_cuts, bool raw,
                       bool think, const char *tools_json, agent_toolcall_format fmt,
                       int *calls) {
    srv_split sp;
    srv_split_init(&sp, raw, think, tools_json, fmt);
    split_desc d = {0};
    desc_add(&d, "", 0);
    size_t at = 0;
    srv_event ev;
    for (size_t i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : n;
        if (end < at) end = at;
        if (srv_split_feed(&sp, text + at, end - at)) abort();
        at = end;
        while (srv_split_next(&sp, false, &ev)) desc_event(&d, &ev, n);
    }
    while (srv_split_next(&sp, true, &ev)) desc_event(&d, &ev, n);
    if (calls) *calls = srv_split_calls(&sp);
    srv_split_free(&sp);
    return d.p;
}
#endif
