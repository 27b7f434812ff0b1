/* OpenAI-compatible routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models.
 * Requests are validated field by field (a wrong type is a 400 naming the field), mapped to
 * the chat service, and answered as one JSON object or as Server-Sent Events ending with
 * "data: [DONE]". A streamed response starts with the first event, so a request that fails in
 * the engine before producing anything still gets a proper error status. */
#include "server_core.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    srv_req *r;
    srv_job *job;
    bool chat, stream, include_usage, started;
    char id[48];
    json_int_t created;
    char *content, *reasoning; /* accumulated (non-streamed) */
    size_t content_len, reasoning_len;
    json_t *calls; /* accumulated tool calls (non-streamed) */
    int n_calls;
    int open_call; /* streaming: the tool call the last delta belonged to */
    const char *stop_reason; /* the stop string for the last chunk (vLLM's stop_reason) */
} oai;

static void oai_cleanup(srv_req *r, void *user) {
    (void)r;
    oai *o = user;
    srv_job_release(o->job);
    free(o->content);
    free(o->reasoning);
    json_decref(o->calls);
    free(o);
}

static int append(char **p, size_t *len, const char *t, size_t n) {
    char *q = realloc(*p, *len + n + 1);
    if (!q) return -1;
    memcpy(q + *len, t, n);
    *len += n;
    q[*len] = 0;
    *p = q;
    return 0;
}

/* ----- request parsing ------------------------------------------------------------------- */
typedef struct {
    char msg[256];
    const char *param;
} perr;

static int bad(perr *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(perr *e, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    e->param = param;
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

static int get_num(json_t *b, const char *k, double lo, double hi, double *out, perr *e) {
    json_t *v = json_object_get(b, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return bad(e, k, "%s must be a number", k);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) {
        e->param = k;
        snprintf(e->msg, sizeof e->msg, "%s must be between %g and %g", k, lo, hi);
        return -1;
    }
    *out = d;
    return 1;
}

static int parse_sampling(json_t *b, srv_sampling *sp, bool chat, const srv_limits *lim, perr *e) {
    *sp = (srv_sampling)SRV_SAMPLING_INIT;
    double d = 0;
    int rc;
    if ((rc = get_num(b, "temperature", 0, 2, &d, e)) < 0) return -1;
    if (rc) sp->temperature = (float)d;
    if ((rc = get_num(b, "top_p", 0, 1, &d, e)) < 0) return -1;
    if (rc) sp->top_p = (float)d;
    if ((rc = get_num(b, "top_k", 0, 1e6, &d, e)) < 0) return -1;
    if (rc) sp->top_k = (int32_t)d;
    if ((rc = get_num(b, "min_p", 0, 1, &d, e)) < 0) return -1;
    if (rc) sp->min_p = (float)d;
    if ((rc = get_num(b, "presence_penalty", -2, 2, &d, e)) < 0) return -1;
    if (rc) sp->presence_penalty = (float)d;
    if ((rc = get_num(b, "frequency_penalty", -2, 2, &d, e)) < 0) return -1;
    if (rc) sp->frequency_penalty = (float)d;
    if ((rc = get_num(b, "repetition_penalty", 0.01, 10, &d, e)) < 0) return -1;
    if (rc) sp->repeat_penalty = (float)d;
    json_t *seed = json_object_get(b, "seed");
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed)) return bad(e, "seed", "%s must be an integer", "seed");
        sp->seed = (uint64_t)json_integer_value(seed);
        sp->has_seed = true;
    }
    const char *mk = chat && json_object_get(b, "max_completion_tokens") ? "max_completion_tokens"
                                                                         : "max_tokens";
    json_t *mt = json_object_get(b, mk);
    if (mt && !json_is_null(mt)) {
        if (!json_is_integer(mt) || json_integer_value(mt) < 1 ||
            json_integer_value(mt) > (1 << 24))
            return bad(e, mk, "%s must be a positive integer", mk);
        sp->max_tokens = (int32_t)json_integer_value(mt);
    } else {
        /* the legacy completions API defaults to 16 tokens */
        sp->max_tokens = chat ? lim->max_tokens_default : 16;
    }
    json_t *stop = json_object_get(b, "stop");
    if (json_is_string(stop)) {
        sp->stop[sp->n_stop++] = json_string_value(stop);
    } else if (json_is_array(stop)) {
        if (json_array_size(stop) > 4) return bad(e, "stop", "%s: at most 4 sequences", "stop");
        size_t i;
        json_t *x;
        json_array_foreach(stop, i, x) {
            if (!json_is_string(x)) return bad(e, "stop", "%s must hold strings", "stop");
            sp->stop[sp->n_stop++] = json_string_value(x);
        }
    } else if (stop && !json_is_null(stop)) {
        return bad(e, "stop", "%s must be a string or an array of strings", "stop");
    }
    json_t *ie = json_object_get(b, "ignore_eos"); /* llama.cpp / vLLM extension */
    if (ie && !json_is_null(ie) && !json_is_boolean(ie))
        return bad(e, "ignore_eos", "%s must be a boolean", "ignore_eos");
    sp->ignore_eos = json_is_true(ie);
    json_t *n = json_object_get(b, "n");
    if (n && !json_is_null(n) && (!json_is_integer(n) || json_integer_value(n) != 1))
        return bad(e, "n", "%s: only one choice per request is supported", "n");
    json_t *lp = json_object_get(b, "logprobs");
    if (json_is_true(lp) || (json_is_integer(lp) && json_integer_value(lp) > 0))
        return bad(e, "logprobs", "%s are not supported", "logprobs");
    return 0;
}

static int parse_stream(json_t *b, oai *o, perr *e) {
    json_t *st = json_object_get(b, "stream");
    if (st && !json_is_null(st) && !json_is_boolean(st))
        return bad(e, "stream", "%s must be a boolean", "stream");
    o->stream = json_is_true(st);
    json_t *so = json_object_get(b, "stream_options");
    if (json_is_object(so)) o->include_usage = json_is_true(json_object_get(so, "include_usage"));
    return 0;
}

static int parse_chat(json_t *b, srv_chat_req *q, const srv_limits *lim, perr *e) {
    memset(q, 0, sizeof *q);
    q->enable_thinking = -1;
    q->parallel_tool_calls = true;
    q->messages = json_object_get(b, "messages");
    if (!json_is_array(q->messages) || json_array_size(q->messages) == 0)
        return bad(e, "messages", "%s must be a non-empty array", "messages");
    json_t *tools = json_object_get(b, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) return bad(e, "tools", "%s must be an array", "tools");
        q->tools = tools;
    }
    json_t *tc = json_object_get(b, "tool_choice");
    if (json_is_string(tc)) {
        const char *v = json_string_value(tc);
        if (!strcmp(v, "auto"))
            q->tool_choice = SRV_TOOLS_AUTO;
        else if (!strcmp(v, "none"))
            q->tool_choice = SRV_TOOLS_NONE;
        else if (!strcmp(v, "required"))
            q->tool_choice = SRV_TOOLS_REQUIRED;
        else
            return bad(e, "tool_choice", "%s must be none, auto, required or a function",
                       "tool_choice");
    } else if (json_is_object(tc)) {
        const char *name =
            json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
        if (!name)
            return bad(e, "tool_choice",
                       "%s: {\"type\": \"function\", \"function\": "
                       "{\"name\": ...}} expected",
                       "tool_choice");
        q->tool_choice = SRV_TOOLS_NAMED;
        q->tool_name = name;
    } else if (tc && !json_is_null(tc)) {
        return bad(e, "tool_choice", "%s must be a string or an object", "tool_choice");
    }
    json_t *ptc = json_object_get(b, "parallel_tool_calls");
    if (json_is_boolean(ptc)) q->parallel_tool_calls = json_is_true(ptc);
    json_t *rf = json_object_get(b, "response_format");
    if (rf && !json_is_null(rf)) {
        const char *ty = json_string_value(json_object_get(rf, "type"));
        if (!ty) return bad(e, "response_format", "%s needs a type", "response_format");
        if (!strcmp(ty, "json_object")) {
            q->json_object = true;
        } else if (!strcmp(ty, "json_schema")) {
            json_t *schema = json_object_get(json_object_get(rf, "json_schema"), "schema");
            if (!json_is_object(schema))
                return bad(e, "response_format", "%s: json_schema.schema must be an object",
                           "response_format");
            q->json_schema = schema;
        } else if (strcmp(ty, "text")) {
            return bad(e, "response_format",
                       "%s: type must be text, json_object or "
                       "json_schema",
                       "response_format");
        }
    }
    json_t *kw = json_object_get(b, "chat_template_kwargs");
    json_t *et = json_object_get(kw, "enable_thinking");
    if (json_is_boolean(et)) q->enable_thinking = json_is_true(et);
    return parse_sampling(b, &q->sampling, true, lim, e);
}

int srv_openai_chat_parse(json_t *body, srv_chat_req *q, const srv_limits *lim, char msg[256],
                          const char **param) {
    perr e = {{0}, NULL};
    int rc = parse_chat(body, q, lim, &e);
    if (rc) {
        snprintf(msg, 256, "%s", e.msg);
        *param = e.param;
    }
    return rc;
}

static int reply_perr(srv_req *r, const perr *e) {
    json_t *j = json_pack("{s:{s:s, s:s, s:s?, s:n}}", "error", "message", e->msg, "type",
                          "invalid_request_error", "param", e->param, "code");
    return j ? srv_reply_json(r, 400, j) : agent_err(AGENT_ENOMEM, "out of memory");
}

/* ----- responses -------------------------------------------------------------------------- */
static const char *finish_reason(srv_finish f) {
    switch (f) {
    case SRV_FINISH_LENGTH:
    case SRV_FINISH_TIME:
        return "length";
    case SRV_FINISH_TOOL_CALLS:
        return "tool_calls";
    default:
        return "stop";
    }
}

static json_t *usage_json(const srv_usage *u) {
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", u->prompt_tokens,
                     "completion_tokens", u->completion_tokens, "total_tokens",
                     u->prompt_tokens + u->completion_tokens, "prompt_tokens_details",
                     "cached_tokens", u->cached_tokens);
}

static json_t *chunk_base(oai *o) {
    srv *s = srv_req_server(o->r);
    return json_pack("{s:s, s:s, s:I, s:s}", "id", o->id, "object",
                     o->chat ? "chat.completion.chunk" : "text_completion", "created", o->created,
                     "model", srv_model_name(s));
}

/* One streamed chunk with a single choice: delta (chat, stolen) or text (completions). */
static void send_chunk(oai *o, json_t *delta, const char *text, size_t len, const char *finish) {
    json_t *c = chunk_base(o);
    json_t *choice = json_pack("{s:i}", "index", 0);
    if (!c || !choice) goto done;
    if (o->chat)
        json_object_set_new(choice, "delta", delta ? delta : json_object());
    else
        json_object_set_new(choice, "text", json_stringn(text ? text : "", len));
    delta = NULL;
    if (!o->chat) json_object_set_new(choice, "logprobs", json_null());
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    if (finish && o->stop_reason)
        json_object_set_new(choice, "stop_reason", json_string(o->stop_reason));
    json_object_set_new(c, "choices", json_pack("[o]", choice));
    choice = NULL;
    srv_sse_json(o->r, NULL, c);
done:
    json_decref(delta);
    json_decref(choice);
    json_decref(c);
}

static void start_stream(oai *o) {
    if (o->started) return;
    o->started = true;
    srv_stream_start(o->r, 200, "text/event-stream");
    if (o->chat)
        send_chunk(o, json_pack("{s:s, s:s}", "role", "assistant", "content", ""), NULL, 0, NULL);
}

static json_t *call_json(const srv_event *ev, bool with_index) {
    json_t *c = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", ev->tool_id, "type", "function",
                          "function", "name", ev->tool_name, "arguments", ev->tool_args);
    if (c && with_index) json_object_set_new(c, "index", json_integer(ev->tool_index));
    return c;
}

/* A streamed piece of tool call `index`: its id, type and name with the first piece. */
static void send_call_piece(oai *o, const srv_event *ev, const char *args, size_t len,
                            bool first) {
    json_t *fn = json_pack("{s:s%}", "arguments", args, len);
    if (fn && first) json_object_set_new(fn, "name", json_string(ev->tool_name));
    json_t *c = json_pack("{s:i}", "index", ev->tool_index);
    if (c && first) {
        json_object_set_new(c, "id", json_string(ev->tool_id));
        json_object_set_new(c, "type", json_string("function"));
    }
    if (!fn || !c) {
        json_decref(fn);
        json_decref(c);
        return;
    }
    json_object_set_new(c, "function", fn);
    start_stream(o);
    send_chunk(o, json_pack("{s:[o]}", "tool_calls", c), NULL, 0, NULL);
}

static void finish_whole(oai *o, const srv_event *ev) {
    srv *s = srv_req_server(o->r);
    json_t *choice;
    if (o->chat) {
        json_t *m = json_pack("{s:s}", "role", "assistant");
        json_object_set_new(m, "content",
                            o->content || !o->n_calls
                                ? json_stringn(o->content ? o->content : "", o->content_len)
                                : json_null());
        if (o->reasoning)
            json_object_set_new(m, "reasoning_content",
                                json_stringn(o->reasoning, o->reasoning_len));
        if (o->n_calls) json_object_set(m, "tool_calls", o->calls);
        choice = json_pack("{s:i, s:o, s:n, s:s}", "index", 0, "message", m, "logprobs",
                           "finish_reason", finish_reason(ev->finish));
        if (choice && ev->stop_sequence)
            json_object_set_new(choice, "stop_reason", json_string(ev->stop_sequence));
    } else {
        choice =
            json_pack("{s:i, s:s%, s:n, s:s}", "index", 0, "text", o->content ? o->content : "",
                      o->content_len, "logprobs", "finish_reason", finish_reason(ev->finish));
        if (choice && ev->stop_sequence)
            json_object_set_new(choice, "stop_reason", json_string(ev->stop_sequence));
    }
    json_t *resp =
        json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", o->id, "object",
                  o->chat ? "chat.completion" : "text_completion", "created", o->created, "model",
                  srv_model_name(s), "choices", choice, "usage", usage_json(&ev->usage));
    if (!resp) {
        srv_reply_error(o->r, 500, "server_error", NULL, "out of memory");
        return;
    }
    srv_reply_json(o->r, 200, resp);
}

static void on_event(oai *o, const srv_event *ev) {
    switch (ev->type) {
    case SRV_EV_REASONING:
        if (!o->stream) {
            append(&o->reasoning, &o->reasoning_len, ev->text, ev->len);
        } else if (ev->len) {
            start_stream(o);
            send_chunk(o, json_pack("{s:s%}", "reasoning_content", ev->text, ev->len), NULL, 0,
                       NULL);
        }
        break;
    case SRV_EV_TOOL_DELTA:
        /* only streaming requests ask for deltas */
        send_call_piece(o, ev, ev->text, ev->len, !o->n_calls || ev->tool_index != o->open_call);
        if (!o->n_calls || ev->tool_index != o->open_call) o->n_calls++;
        o->open_call = ev->tool_index;
        break;
    case SRV_EV_TOOL_CALL:
        if (ev->tool_begun) {
            /* announced by deltas: the rest of its arguments (an invalid or cut-off call
             * stays as far as it was streamed; finish_reason tells why) */
            size_t al = strlen(ev->tool_args);
            if (!ev->tool_error && al > ev->tool_streamed)
                send_call_piece(o, ev, ev->tool_args + ev->tool_streamed, al - ev->tool_streamed,
                                false);
            break;
        }
        if (ev->tool_error) {
            /* not a valid call: the model's markup stays text, never a call to run */
            srv_event t = *ev;
            t.type = SRV_EV_TEXT;
            on_event(o, &t);
            break;
        }
        o->n_calls++;
        if (!o->stream) {
            if (!o->calls) o->calls = json_array();
            json_array_append_new(o->calls, call_json(ev, false));
        } else {
            start_stream(o);
            send_chunk(o, json_pack("{s:[o]}", "tool_calls", call_json(ev, true)), NULL, 0, NULL);
        }
        break;
    case SRV_EV_TEXT:
        if (!o->stream) {
            append(&o->content, &o->content_len, ev->text, ev->len);
        } else if (ev->len) {
            start_stream(o);
            if (o->chat)
                send_chunk(o, json_pack("{s:s%}", "content", ev->text, ev->len), NULL, 0, NULL);
            else
                send_chunk(o, NULL, ev->text, ev->len, NULL);
        }
        break;
    case SRV_EV_DONE:
        if (ev->finish == SRV_FINISH_ERROR && !o->started) {
            srv_reply_error(o->r, ev->status ? ev->status : 500,
                            ev->status == 400 ? "invalid_request_error" : "server_error",
                            ev->status == 400 ? "context_length_exceeded" : NULL, "%s",
                            ev->error ? ev->error : "generation failed");
            break;
        }
        if (!o->stream) {
            finish_whole(o, ev);
            break;
        }
        start_stream(o);
        if (ev->finish == SRV_FINISH_ERROR) {
            json_t *err =
                json_pack("{s:{s:s, s:s}}", "error", "message",
                          ev->error ? ev->error : "generation failed", "type", "server_error");
            if (err) srv_sse_json(o->r, NULL, err);
            json_decref(err);
        } else {
            o->stop_reason = ev->stop_sequence;
            send_chunk(o, NULL, NULL, 0, finish_reason(ev->finish));
            if (o->include_usage) {
                json_t *c = chunk_base(o);
                if (c) {
                    json_object_set_new(c, "choices", json_array());
                    json_object_set_new(c, "usage", usage_json(&ev->usage));
                    srv_sse_json(o->r, NULL, c);
                    json_decref(c);
                }
            }
        }
        srv_sse_send(o->r, NULL, "[DONE]", 6);
        srv_stream_end(o->r);
        break;
    }
}

static void oai_wake(srv_job *j, void *user) {
    oai *o = user;
    srv_event ev;
    while (!srv_req_gone(o->r) && srv_job_next(j, &ev) == 1)
        on_event(o, &ev);
}

static oai *oai_new(srv_req *r, bool chat) {
    oai *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->r = r;
    o->chat = chat;
    o->created = (json_int_t)time(NULL);
    srv_random_id(o->id, sizeof o->id, chat ? "chatcmpl-" : "cmpl-");
    return o;
}

static int submit_failed(srv_req *r, oai *o, int status) {
    free(o);
    return srv_reply_error(r, status ? status : 400,
                           status == 429 || status >= 500 ? "server_error"
                                                          : "invalid_request_error",
                           status == 429 ? "rate_limit_exceeded" : NULL, "%s", agent_error_last());
}

static int route_chat(srv_req *r) {
    srv *s = srv_req_server(r);
    json_t *b = srv_req_json(r);
    perr e = {{0}, NULL};
    srv_chat_req q;
    oai *o = oai_new(r, true);
    if (!o) return agent_err(AGENT_ENOMEM, "out of memory");
    if (parse_chat(b, &q, srv_limits_get(s), &e) || parse_stream(b, o, &e)) {
        free(o);
        return reply_perr(r, &e);
    }
    q.stream_tool_args = o->stream;
    int status = 400;
    if (srv_chat_submit(s, &q, oai_wake, o, &o->job, &status)) return submit_failed(r, o, status);
    srv_req_hold(r, oai_cleanup, o);
    return 0;
}

static int route_completions(srv_req *r) {
    srv *s = srv_req_server(r);
    json_t *b = srv_req_json(r);
    perr e = {{0}, NULL};
    srv_complete_req q;
    memset(&q, 0, sizeof q);
    oai *o = oai_new(r, false);
    if (!o) return agent_err(AGENT_ENOMEM, "out of memory");
    json_t *p = json_object_get(b, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1) p = json_array_get(p, 0);
    json_t *suffix = json_object_get(b, "suffix");
    json_t *echo = json_object_get(b, "echo");
    int rc = 0;
    if (!json_is_string(p))
        rc = bad(&e, "prompt", "%s must be a string (or an array of one string)", "prompt");
    else if (suffix && !json_is_null(suffix) && !json_is_string(suffix))
        rc = bad(&e, "suffix", "%s must be a string", "suffix");
    else if (json_is_true(echo))
        rc = bad(&e, "echo", "%s is not supported", "echo");
    if (!rc) rc = parse_sampling(b, &q.sampling, false, srv_limits_get(s), &e);
    if (!rc) rc = parse_stream(b, o, &e);
    if (rc) {
        free(o);
        return reply_perr(r, &e);
    }
    q.prompt = json_string_value(p);
    q.suffix = json_string_value(suffix);
    int status = 400;
    if (srv_complete_submit(s, &q, oai_wake, o, &o->job, &status))
        return submit_failed(r, o, status);
    srv_req_hold(r, oai_cleanup, o);
    return 0;
}

static int route_models(srv_req *r) {
    srv *s = srv_req_server(r);
    engine_model_info mi;
    engine_model_info_get(srv_model(s), &mi);
    return srv_reply_json(r, 200,
                          json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:{s:s, s:i, s:I}}]}", "object",
                                    "list", "data", "id", srv_model_name(s), "object", "model",
                                    "created", (json_int_t)0, "owned_by", "spark-agent", "meta",
                                    "arch", mi.arch, "n_ctx", mi.n_ctx, "n_params",
                                    (json_int_t)mi.n_params));
}

int srv_openai_init(srv *s) {
    int rc = srv_route_add(s, "POST", "/v1/chat/completions", route_chat, SRV_ROUTE_JSON);
    if (!rc) rc = srv_route_add(s, "POST", "/v1/completions", route_completions, SRV_ROUTE_JSON);
    if (!rc) rc = srv_route_add(s, "GET", "/v1/models", route_models, SRV_ROUTE_NO_DRAIN);
    return rc;
}
