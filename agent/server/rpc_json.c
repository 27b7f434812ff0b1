/* Small helpers shared by the JSON-RPC methods and the HTTP dialects (dialects.h). */
#include "dialects.h"
#include "../template_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int agent_dialect_fail(agent_dialect_err *e, int status, const char *type, const char *param,
                       const char *fmt, ...) {
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type ? type : "invalid_request_error");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return agent_err(AGENT_EINVAL, "%s", e->message);
}

size_t agent_utf8_complete_len(const char *s, size_t n) {
    /* Look back at most 3 bytes for the lead byte of a sequence that runs past the end. */
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned char c = (unsigned char)s[n - k];
        if ((c & 0xC0) == 0x80) continue; /* continuation: keep looking */
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > k ? n - k : n;
    }
    return n;
}

int agent_text_hold(srv_buf *cur, srv_buf *held, const char *text, size_t len, size_t *ready) {
    *ready = 0;
    int rc = srv_buf_add(cur, text, len);
    if (!rc) rc = srv_buf_add(held, text, len);
    if (!rc) *ready = agent_utf8_complete_len(held->p, held->len);
    return rc;
}

void agent_text_release(srv_buf *held, size_t n) {
    memmove(held->p, held->p + n, held->len - n);
    held->len -= n;
}

bool agent_text_flush_held(srv_buf *cur, srv_buf *held, int *rc) {
    *rc = 0;
    if (!held->len) return false;
    held->len = 0;
    cur->len = agent_utf8_complete_len(cur->p, cur->len);
    *rc = srv_buf_add(cur, "\xEF\xBF\xBD", 3);
    return true;
}

char *agent_json_dump(json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return s;
}

void agent_chat_xlat_clear(agent_chat_xlat *x) {
    json_decref(x->messages);
    json_decref(x->tools);
    json_decref(x->hold);
    json_decref(x->echo);
    memset(x, 0, sizeof *x);
}

void agent_chat_xlat_init(agent_chat_xlat *x, int default_max_tokens) {
    memset(x, 0, sizeof *x);
    srv_chat_req *q = &x->req;
    q->enable_thinking = -1;
    q->parallel_tool_calls = true;
    q->sampling = (srv_sampling)SRV_SAMPLING_INIT;
    q->sampling.max_tokens = default_max_tokens;
}

int agent_chat_add_function(json_t *out, const char *name, json_t *params,
                            const json_t *description) {
    json_t *fn = params ? json_pack("{s:s, s:O}", "name", name, "parameters", params)
                        : json_pack("{s:s, s:{s:s, s:{}}}", "name", name, "parameters", "type",
                                    "object", "properties");
    if (fn && json_is_string(description))
        json_object_set(fn, "description", (json_t *)description);
    if (!fn || json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function",
                                                    fn)))
        return agent_err(AGENT_ENOMEM, "out of memory");
    return 0;
}

void agent_chat_xlat_set_tools(agent_chat_xlat *x, json_t *tools) {
    if (json_array_size(tools)) {
        x->tools = tools;
        x->req.tools = tools;
    } else {
        json_decref(tools);
    }
}

json_t *agent_json_text(const char *s, size_t n) {
    if (!s) return json_string("");
    json_t *j = json_stringn(s, n);
    if (j) return j;
    /* Invalid UTF-8 (jansson also refuses encoded surrogates), or out of memory. */
    srv_buf b = {0};
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = tpl_utf8_decode(s, n, i, &cp);
        bool bad = (cp == 0xFFFD && k == 1) || (cp >= 0xD800 && cp <= 0xDFFF);
        int rc = bad ? srv_buf_add(&b, "\xEF\xBF\xBD", 3) : srv_buf_add(&b, s + i, k);
        if (rc) {
            srv_buf_free(&b);
            return NULL;
        }
        i += k;
    }
    j = json_stringn(b.p ? b.p : "", b.len);
    srv_buf_free(&b);
    return j;
}

int agent_dialect_note(json_t *notes, const char *fmt, ...) {
    if (!notes) return 0;
    char m[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    return json_array_append_new(notes, json_string(m)) ? agent_err(AGENT_ENOMEM, "out of memory")
                                                        : 0;
}

/* ----- the dialect runner ----- */

struct agent_dialect_run {
    srv_req *r;
    srv_job *job;
    const agent_dialect_ops *ops;
    void *ctx;
    bool stream, enc_started, stream_started, finished;
    bool stopping;      /* the encoder asked to stop (infill's n_indent): cancel = normal end */
};

static void run_cleanup(srv_req *r, void *user) {
    (void)r;
    agent_dialect_run *run = user;
    srv_job_release(run->job);
    run->ops->free(run->ctx);
    free(run);
}

int agent_dialect_sse(void *user, const char *event, const char *data, size_t len) {
    agent_dialect_run *run = user;
    if (srv_req_gone(run->r)) return -1;
    if (!run->stream_started) {
        if (srv_stream_start(run->r, 200, "text/event-stream")) return -1;
        run->stream_started = true;
    }
    return srv_sse_send(run->r, event, data, len) ? -1 : 0;
}

int agent_dialect_reply_error(srv_req *r, const agent_dialect_err *e,
                              char *(*error_body)(const agent_dialect_err *e)) {
    char *body = error_body(e);
    if (!body) return agent_err(AGENT_ENOMEM, "out of memory");
    int rc = srv_reply_raw(r, e->status ? e->status : 400, "application/json", body,
                           strlen(body));
    free(body);
    return rc;
}

agent_dialect_done agent_dialect_done_of(const srv_event *ev) {
    agent_dialect_done d = {agent_dialect_finish(ev->finish), ev->stop_sequence,
                            {ev->usage.prompt_tokens, ev->usage.completion_tokens,
                             ev->usage.cached_tokens, ev->usage.reasoning_tokens}};
    return d;
}

const char *agent_dialect_finish(srv_finish f) {
    switch (f) {
    case SRV_FINISH_LENGTH:
    case SRV_FINISH_TIME: return "length";
    case SRV_FINISH_TOOL_CALLS: return "tool_calls";
    default: return "stop";
    }
}

void agent_dialect_log_notes(const char *route, const json_t *notes) {
    size_t i;
    json_t *n;
    json_array_foreach(notes, i, n) engine_log(ENGINE_LOG_INFO, "%s: %s", route,
                                               json_string_value(n));
}

/* The request failed after it started: close the stream with the dialect's error event, or
 * answer with its error body. */
static void run_fail(agent_dialect_run *run, int status, const char *msg) {
    agent_dialect_err e;
    agent_dialect_fail(&e, status, "", NULL, "%s", msg);
    if (run->stream_started) {
        run->ops->fail(run->ctx, &e);
        srv_stream_end(run->r);
    } else {
        agent_dialect_reply_error(run->r, &e, run->ops->error_body);
    }
    run->finished = true;
}

static void run_wake(srv_job *j, void *user) {
    agent_dialect_run *run = user;
    srv_event ev;
    while (!run->finished && srv_job_next(j, &ev) == 1) {
        if (srv_req_gone(run->r)) {
            srv_job_cancel(j);
            run->finished = true;
            return;
        }
        if (ev.type == SRV_EV_DONE && ev.finish == SRV_FINISH_ERROR && !run->stream_started) {
            run_fail(run, ev.status ? ev.status : 500, ev.error ? ev.error : "generation failed");
            return;
        }
        if (ev.type == SRV_EV_DONE && ev.finish == SRV_FINISH_CANCELED && run->stopping)
            ev.finish = SRV_FINISH_STOP;
        if (ev.type == SRV_EV_DONE && ev.finish == SRV_FINISH_CANCELED) {
            run_fail(run, 503, "the request was cancelled (server shutting down)");
            return;
        }
        int rc = 0;
        if (!run->enc_started) {
            rc = run->ops->start(run, run->ctx);
            run->enc_started = rc == 0;
        }
        if (!rc && ev.type == SRV_EV_TEXT && !run->stopping) {
            rc = run->ops->text(run->ctx, ev.text, ev.len);
            if (rc > 0) {
                /* the encoder has what it needs: stop the engine, finish normally */
                run->stopping = true;
                srv_job_cancel(j);
                rc = 0;
            }
        } else if (!rc && ev.type == SRV_EV_REASONING && !run->stopping) {
            if (run->ops->reasoning) rc = run->ops->reasoning(run->ctx, ev.text, ev.len);
        } else if (!rc && ev.type == SRV_EV_TOOL_DELTA && !run->stopping) {
            if (run->ops->tool) rc = run->ops->tool(run->ctx, &ev);
        } else if (!rc && ev.type == SRV_EV_TOOL_CALL && !run->stopping) {
            /* a call that is not valid stays visible as text, never as a call (unless it
             * was announced already while streamed: then it stays as it went) */
            if (ev.tool_begun)
                rc = run->ops->tool ? run->ops->tool(run->ctx, &ev) : 0;
            else
                rc = ev.tool_error || !run->ops->tool ? run->ops->text(run->ctx, ev.text, ev.len)
                                                      : run->ops->tool(run->ctx, &ev);
        } else if (!rc && ev.type == SRV_EV_DONE) {
            if (ev.finish == SRV_FINISH_ERROR) {
                run_fail(run, ev.status ? ev.status : 500, ev.error ? ev.error : "generation failed");
                return;
            }
            char *body = NULL;
            rc = run->ops->done(run->ctx, &ev, &body);
            if (!rc) {
                if (body) srv_reply_raw(run->r, 200, "application/json", body, strlen(body));
                else if (run->stream_started) srv_stream_end(run->r);
                else srv_reply_raw(run->r, 200, "application/json", "{}", 2);
                run->finished = true;
            }
            free(body);
        }
        if (rc) {
            srv_job_cancel(j);
            if (srv_req_gone(run->r)) run->finished = true;
            else run_fail(run, 500, agent_error_last());
            return;
        }
    }
}

int agent_dialect_submit(srv_req *r, const srv_chat_req *x, const srv_complete_req *cq,
                         bool stream, const agent_dialect_ops *ops, void *ctx) {
    agent_dialect_run *run = calloc(1, sizeof *run);
    if (!run) {
        ops->free(ctx);
        return agent_err(AGENT_ENOMEM, "out of memory");
    }
    run->r = r;
    run->ops = ops;
    run->ctx = ctx;
    run->stream = stream;
    int status = 400;
    int rc = x ? srv_chat_submit(srv_req_server(r), x, run_wake, run, &run->job, &status)
               : srv_complete_submit(srv_req_server(r), cq, run_wake, run, &run->job, &status);
    if (rc) {
        agent_dialect_err e;
        agent_dialect_fail(&e, status, "", NULL, "%s", agent_error_last());
        int rrc = agent_dialect_reply_error(r, &e, ops->error_body);
        ops->free(ctx);
        free(run);
        return rrc;
    }
    srv_req_hold(r, run_cleanup, run);
    return 0;
}

/* ----- a chat dialect's route ----- */

void agent_chat_ctx_free(agent_chat_ctx *c) {
    if (!c) return;
    agent_chat_xlat_clear(&c->x);
    free(c->model);
    free(c);
}

bool agent_dialect_tool_piece(const srv_event *ev, const char **args, size_t *len) {
    if (ev->type == SRV_EV_TOOL_DELTA) {
        *args = ev->text;
        *len = ev->len;
        return true;
    }
    const char *a = ev->tool_args ? ev->tool_args : "{}";
    size_t skip = ev->tool_begun ? ev->tool_streamed : 0, al = strlen(a);
    if (ev->tool_begun && (ev->tool_error || skip >= al)) return false; /* stays as streamed */
    *args = a + skip;
    *len = al - skip;
    return true;
}

int agent_dialect_chat_route(srv_req *r, const char *route, agent_chat_to_fn to_chat,
                             const agent_dialect_ops *ops) {
    srv *s = srv_req_server(r);
    agent_dialect_err e = {0};
    if (srv_draining(s)) {
        agent_dialect_fail(&e, 503, "", NULL, "the server is shutting down");
        return agent_dialect_reply_error(r, &e, ops->error_body);
    }
    json_t *body = srv_req_json(r);
    agent_chat_ctx *c = calloc(1, sizeof *c);
    json_t *notes = json_array();
    if (!c || !notes) {
        free(c);
        json_decref(notes);
        return agent_err(AGENT_ENOMEM, "out of memory");
    }
    int rc = to_chat(body, srv_limits_get(s)->max_tokens_default, &c->x, notes, &e);
    agent_dialect_log_notes(route, notes);
    json_decref(notes);
    if (rc) {
        ops->free(c);
        return rc == AGENT_EINVAL ? agent_dialect_reply_error(r, &e, ops->error_body) : rc;
    }
    const char *model = json_string_value(json_object_get(body, "model"));
    if (!(c->model = strdup(model ? model : srv_model_name(s)))) {
        ops->free(c);
        return agent_err(AGENT_ENOMEM, "out of memory");
    }
    c->x.req.stream_tool_args = c->x.stream;
    return agent_dialect_submit(r, &c->x.req, NULL, c->x.stream, ops, c);
}
