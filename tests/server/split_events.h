/* Shared by test_split.c and fuzz_split.c: run agent/server/split.c over a text fed in pieces
 * and describe its events as one string ("R:reasoning|T:text|C0:name:args|E:name:error|"),
 * adjacent text events of one kind merged, so that results compare across different cuts.
 * With tool-call deltas on, a streamed call is described by its pieces plus the rest its
 * TOOL_CALL event adds (aborting when the pieces and the call disagree), so the description
 * equals the one without deltas. */
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
    /* tool-call deltas (srv_split_set_deltas): the call being streamed */
    int delta_index;      /* -1: none */
    char delta_id[40];
    char *delta_name;
    char *delta_args;     /* concatenated pieces */
    size_t delta_len;
    int n_deltas;         /* delta events with bytes */
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

/* Calls whose streamed pieces disagreed with the parsed call (the splitter's tool_error for
 * it), counted over every run: never expected. */
static int split_mismatches;

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
    } else if (ev->type == SRV_EV_TOOL_DELTA) {
        if ((!ev->text && ev->len) || !ev->tool_id || !ev->tool_name) abort();
        if (ev->tool_index != d->delta_index) {
            /* a new call: id and name come with its first piece */
            if (d->delta_index >= 0 || strncmp(ev->tool_id, "call_", 5)) abort();
            d->delta_index = ev->tool_index;
            snprintf(d->delta_id, sizeof d->delta_id, "%s", ev->tool_id);
            d->delta_name = strdup(ev->tool_name);
            d->delta_len = 0;
        } else if (strcmp(ev->tool_id, d->delta_id) || strcmp(ev->tool_name, d->delta_name)) {
            abort();
        }
        char *p = realloc(d->delta_args, d->delta_len + ev->len + 1);
        if (!p) abort();
        memcpy(p + d->delta_len, ev->text, ev->len);
        d->delta_len += ev->len;
        p[d->delta_len] = 0;
        d->delta_args = p;
        d->n_deltas += ev->len > 0;
    } else if (ev->type == SRV_EV_TOOL_CALL) {
        char head[64];
        if (d->last) desc_add(d, "|", 1);
        int n = snprintf(head, sizeof head, "%s%d:", ev->tool_error ? "E" : "C", ev->tool_index);
        desc_add(d, head, (size_t)n);
        desc_add(d, ev->tool_name, strlen(ev->tool_name));
        desc_add(d, ":", 1);
        if (ev->tool_begun) {
            /* what a client that followed the deltas holds: the pieces, then the rest */
            if (ev->tool_index != d->delta_index || strcmp(ev->tool_id, d->delta_id) ||
                strcmp(ev->tool_name, d->delta_name) || ev->tool_streamed != d->delta_len)
                abort();
            if (!ev->tool_error && (strlen(ev->tool_args) < d->delta_len ||
                                    memcmp(ev->tool_args, d->delta_args, d->delta_len)))
                abort();
            free(d->delta_name);
            d->delta_name = NULL;
            d->delta_index = -1;
        } else if (d->delta_index >= 0) {
            abort(); /* deltas for a call that did not end as announced */
        }
        if (ev->tool_error &&
            (!strcmp(ev->tool_error, "the call's arguments differ from what was streamed") ||
             !strcmp(ev->tool_error, "the call's name differs from what was streamed")))
            split_mismatches++;
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
static char *split_run_ex(const char *text, size_t n, const size_t *cuts, size_t n_cuts,
                          bool raw, bool think, const char *tools_json,
                          agent_toolcall_format fmt, int *calls, bool deltas, int *n_deltas) {
    srv_split sp;
    srv_split_init(&sp, raw, think, tools_json, fmt);
    srv_split_set_deltas(&sp, deltas);
    split_desc d = {0};
    d.delta_index = -1;
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
    if (n_deltas) *n_deltas = d.n_deltas;
    if (d.delta_index >= 0) abort(); /* an announced call never ended */
    free(d.delta_args);
    srv_split_free(&sp);
    return d.p;
}

static inline char *split_run(const char *text, size_t n, const size_t *cuts, size_t n_cuts,
                              bool raw, bool think, const char *tools_json,
                              agent_toolcall_format fmt, int *calls) {
    return split_run_ex(text, n, cuts, n_cuts, raw, think, tools_json, fmt, calls, false, NULL);
}
#endif
