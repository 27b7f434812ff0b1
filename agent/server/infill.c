/* llama.cpp's /infill (what llama.vscode and llama.vim send): request -> the raw-completion
 * entry's fill-in-the-middle request, generated text -> llama.cpp's answer (dialects.h). */
#include "dialects.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BAD(e, param, ...) agent_dialect_fail((e), 400, "invalid_request_error", (param), __VA_ARGS__)

/* ----- llama.cpp /infill ----- */

static int get_int(const json_t *body, const char *key, int64_t lo, int64_t *out,
                   agent_dialect_err *e) {
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v)) return 0;
    /* llama.cpp accepts integral floats too (JavaScript clients send 64.0 rarely, but do) */
    double d = json_is_integer(v) ? (double)json_integer_value(v)
               : json_is_real(v) ? json_real_value(v) : -1e300;
    if (d < (double)lo || d > 9.2e18 || d != (double)(int64_t)d)
        return BAD(e, key, "\"%s\" must be an integer >= %lld", key, (long long)lo);
    *out = (int64_t)d;
    return 0;
}

static int get_num(const json_t *body, const char *key, double lo, double hi, double *out,
                   agent_dialect_err *e) {
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v) || json_number_value(v) < lo || json_number_value(v) > hi)
        return BAD(e, key, "\"%s\" must be a number in [%g, %g]", key, lo, hi);
    *out = json_number_value(v);
    return 0;
}

static int get_str(const json_t *body, const char *key, const char **s, size_t *n,
                   agent_dialect_err *e) {
    json_t *v = json_object_get(body, key);
    *s = "";
    *n = 0;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return BAD(e, key, "\"%s\" must be a string", key);
    *s = json_string_value(v);
    *n = json_string_length(v);
    return 0;
}

static int string_array(const json_t *body, const char *key, const json_t **out,
                        agent_dialect_err *e) {
    json_t *v = json_object_get(body, key);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    size_t i;
    json_t *s;
    if (!json_is_array(v)) return BAD(e, key, "\"%s\" must be an array of strings", key);
    json_array_foreach(v, i, s) if (!json_is_string(s))
        return BAD(e, key, "\"%s\"[%zu] must be a string", key, i);
    *out = v;
    return 0;
}

int agent_infill_parse(const json_t *body, int default_max_tokens, agent_infill_req *r,
                       agent_dialect_err *e) {
    memset(r, 0, sizeof *r);
    r->req.sampling = (srv_sampling)SRV_SAMPLING_INIT;
    srv_sampling *sp = &r->req.sampling;
    /* llama.cpp's defaults */
    sp->temperature = 0.8f;
    sp->top_k = 40;
    sp->top_p = 0.95f;
    if (!json_is_object(body)) return BAD(e, "", "the request body must be a JSON object");
    const char *pre, *mid;
    size_t pre_n, mid_n, suf_n;
    (void)pre_n;
    (void)suf_n;
    int64_t n_predict = -1, top_k = -1, seed = -1, t_max = 0;
    double temp = -1, top_p = -1;
    int rc = get_str(body, "input_prefix", &pre, &pre_n, e);
    if (!rc) rc = get_str(body, "input_suffix", &r->req.suffix, &suf_n, e);
    if (!rc) rc = get_str(body, "prompt", &mid, &mid_n, e);
    if (!rc) rc = get_int(body, "n_predict", -1, &n_predict, e);
    if (!rc) rc = get_num(body, "temperature", 0, 100, &temp, e);
    if (!rc) rc = get_num(body, "top_p", 0, 1, &top_p, e);
    if (!rc) rc = get_int(body, "top_k", 0, &top_k, e);
    if (!rc) rc = get_int(body, "seed", -1, &seed, e);
    if (!rc) rc = get_int(body, "n_indent", 0, &r->n_indent, e);
    if (!rc) rc = get_int(body, "t_max_predict_ms", 0, &t_max, e);
    if (!rc) rc = string_array(body, "response_fields", &r->response_fields, e);
    const json_t *stop = NULL;
    if (!rc) rc = string_array(body, "stop", &stop, e);
    if (!rc && json_array_size(stop) > sizeof sp->stop / sizeof sp->stop[0])
        rc = BAD(e, "stop", "\"stop\": at most %zu strings", sizeof sp->stop / sizeof sp->stop[0]);
    if (rc) return rc;
    for (size_t i = 0; i < json_array_size(stop); i++)
        sp->stop[sp->n_stop++] = json_string_value(json_array_get(stop, i));
    if (temp >= 0) sp->temperature = (float)temp;
    if (top_p >= 0) sp->top_p = (float)top_p;
    if (top_k >= 0) sp->top_k = (int32_t)(top_k > INT32_MAX ? INT32_MAX : top_k);
    if (seed >= 0) {
        sp->seed = (uint64_t)seed;
        sp->has_seed = true;
    }
    sp->max_tokens = n_predict < 0 ? default_max_tokens
                     : n_predict > (1 << 24) ? (1 << 24) : (int32_t)n_predict;
    if (n_predict == 0) return BAD(e, "n_predict", "\"n_predict\" must not be 0");
    r->req.time_budget_ms = t_max > INT32_MAX ? INT32_MAX : (int32_t)t_max;
    json_t *st = json_object_get(body, "stream");
    if (st && !json_is_boolean(st) && !json_is_null(st))
        return BAD(e, "stream", "\"stream\" must be a boolean");
    r->stream = json_is_true(st);
    /* llama.cpp puts "prompt" after <|fim_middle|>: the start of the middle (llama.vscode
     * sends the current line's text before the cursor there) */
    r->req.prompt = pre;
    r->req.middle = mid_n ? mid : NULL;
    json_t *extra = json_object_get(body, "input_extra");
    if (extra && !json_is_null(extra)) {
        if (!json_is_array(extra)) return BAD(e, "input_extra", "\"input_extra\" must be an array");
        size_t n = json_array_size(extra);
        if (n > 4096) return BAD(e, "input_extra", "\"input_extra\": at most 4096 chunks");
        if (n && !(r->extra = calloc(n, sizeof *r->extra)))
            return agent_err(AGENT_ENOMEM, "out of memory");
        size_t i;
        json_t *c;
        json_array_foreach(extra, i, c) {
            json_t *text = json_object_get(c, "text"), *fn = json_object_get(c, "filename");
            /* llama.cpp's own check: every chunk an object with a string text (and filename) */
            if (!json_is_object(c) || !json_is_string(text) || (fn && !json_is_string(fn)))
                return BAD(e, "input_extra", "extra_context chunk must contain a \"text\" field "
                           "with a string value (input_extra[%zu])", i);
            r->extra[i].name = fn ? json_string_value(fn) : "tmp";
            r->extra[i].text = json_string_value(text);
        }
        r->req.extra = r->extra;
        r->req.n_extra = (int)n;
    }
    return 0;
}

void agent_infill_req_clear(agent_infill_req *r) {
    free(r->extra);
    memset(r, 0, sizeof *r);
}

char *agent_infill_error_body(const agent_dialect_err *e) {
    const char *type = e->type[0] ? e->type : e->status == 401 ? "authentication_error"
                                            : e->status == 404 ? "not_found_error"
                                            : e->status == 503 ? "unavailable_error"
                                            : e->status >= 500 ? "server_error"
                                                               : "invalid_request_error";
    return agent_json_dump(json_pack("{s:{s:i, s:s, s:s}}", "error", "code", e->status,
                                     "message", e->message, "type", type));
}

struct agent_infill_enc {
    bool stream;
    char *model;
    agent_sse_fn sink;
    void *user;
    int64_t n_indent;
    json_t *fields;      /* response_fields (owned ref) or NULL */
    srv_buf text;      /* everything generated (cut by n_indent) */
    size_t sent;         /* bytes of text already streamed */
    size_t last_nl;      /* n_indent: start of the line being checked */
    bool has_nl, cut;
};

int agent_infill_enc_new(agent_infill_enc **out, const agent_infill_req *r, const char *model,
                         agent_sse_fn sink, void *user) {
    *out = NULL;
    if (r->stream && !sink) return agent_err(AGENT_EINVAL, "a streaming encoder needs a sink");
    agent_infill_enc *e = calloc(1, sizeof *e);
    if (!e || !(e->model = strdup(model ? model : "spark-agent"))) {
        free(e);
        return agent_err(AGENT_ENOMEM, "out of memory");
    }
    e->stream = r->stream;
    e->sink = sink;
    e->user = user;
    e->n_indent = r->n_indent;
    e->fields = r->response_fields ? json_incref((json_t *)r->response_fields) : NULL;
    *out = e;
    return 0;
}

void agent_infill_enc_free(agent_infill_enc *e) {
    if (!e) return;
    free(e->model);
    json_decref(e->fields);
    srv_buf_free(&e->text);
    free(e);
}

static int send_json(agent_infill_enc *e, json_t *j) {
    if (!j) return agent_err(AGENT_ENOMEM, "out of memory");
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return agent_err(AGENT_ENOMEM, "out of memory");
    int rc = e->sink(e->user, NULL, s, strlen(s)) ? agent_err(AGENT_EINTERNAL, "client gone") : 0;
    free(s);
    return rc;
}

/* llama.cpp's n_indent rule: once a line has started after a newline, a line whose
 * indentation is below n_indent ends the completion, cut just after that indentation. */
static bool indent_stop(agent_infill_enc *e) {
    for (;;) {
        if (e->has_nl) {
            size_t pos = e->last_nl, ind = 0;
            while (pos < e->text.len && (e->text.p[pos] == ' ' || e->text.p[pos] == '\t')) {
                pos++;
                ind++;
            }
            if (pos < e->text.len && (int64_t)ind < e->n_indent) {
                e->text.len = pos;
                e->text.p[pos] = 0;
                return true;
            }
        }
        const char *nl = e->last_nl < e->text.len
                             ? memchr(e->text.p + e->last_nl, '\n', e->text.len - e->last_nl) : NULL;
        if (!nl) return false;
        e->has_nl = true;
        e->last_nl = (size_t)(nl - e->text.p) + 1;
    }
}

int agent_infill_enc_text(agent_infill_enc *e, const char *text, size_t len) {
    if (e->cut) return 1;
    int rc = srv_buf_add(&e->text, text, len);
    if (rc) return rc;
    if (e->n_indent > 0 && indent_stop(e)) e->cut = true;
    if (e->stream) {
        size_t end = agent_utf8_complete_len(e->text.p, e->text.len);
        if (end > e->sent) {
            rc = send_json(e, json_pack("{s:i, s:o, s:[], s:b, s:i}", "index", 0, "content",
                                        agent_json_text(e->text.p + e->sent, end - e->sent),
                                        "tokens", "stop", false, "id_slot", -1));
            e->sent = end;
            if (rc) return rc;
        }
    }
    return e->cut ? 1 : 0;
}

int agent_infill_enc_fail(agent_infill_enc *e, const agent_dialect_err *err) {
    /* llama.cpp ends a failed stream with its error object as the last data line */
    if (!e->stream) return 0;
    char *body = agent_infill_error_body(err);
    if (!body) return agent_err(AGENT_ENOMEM, "out of memory");
    int rc = e->sink(e->user, NULL, body, strlen(body)) ? agent_err(AGENT_EINTERNAL, "client gone")
                                                        : 0;
    free(body);
    return rc;
}

static double per(double a, double b) {
    return b > 0 ? a / b : 0;
}

/* The value at a "a/b/c" path of j, or NULL. */
static json_t *path_get(json_t *j, const char *path) {
    char key[128];
    while (j && *path) {
        const char *slash = strchr(path, '/');
        size_t n = slash ? (size_t)(slash - path) : strlen(path);
        if (n >= sizeof key) return NULL;
        memcpy(key, path, n);
        key[n] = 0;
        j = json_object_get(j, key);
        path += n + (slash ? 1 : 0);
    }
    return j;
}

int agent_infill_enc_done(agent_infill_enc *e, const agent_infill_stats *st, char **body) {
    *body = NULL;
    int rc = 0;
    /* a trailing incomplete UTF-8 character is dropped, as llama.cpp does */
    size_t end = agent_utf8_complete_len(e->text.p ? e->text.p : "", e->text.len);
    const char *stop_type = st->stop_type ? st->stop_type : "eos";
    if (e->cut || !strcmp(stop_type, "time")) stop_type = "limit";
    json_t *timings = json_pack(
        "{s:I, s:f, s:f, s:f, s:I, s:f, s:f, s:f}", "prompt_n",
        (json_int_t)(st->prompt_tokens - st->cached_tokens), "prompt_ms", st->prompt_ms,
        "prompt_per_token_ms", per(st->prompt_ms, (double)(st->prompt_tokens - st->cached_tokens)),
        "prompt_per_second",
        per((double)(st->prompt_tokens - st->cached_tokens) * 1000.0, st->prompt_ms),
        "predicted_n", (json_int_t)st->predicted_tokens, "predicted_ms", st->predicted_ms,
        "predicted_per_token_ms", per(st->predicted_ms, (double)st->predicted_tokens),
        "predicted_per_second", per((double)st->predicted_tokens * 1000.0, st->predicted_ms));
    json_t *j = json_pack("{s:i, s:o, s:[], s:i, s:b, s:s, s:I, s:I, s:I, s:b, s:b, s:s, s:s, "
                          "s:o}",
                          "index", 0, "content",
                          e->stream ? json_string("")
                                    : agent_json_text(e->text.p + 0, end),
                          "tokens", "id_slot", -1, "stop", true, "model", e->model,
                          "tokens_predicted", (json_int_t)st->predicted_tokens,
                          "tokens_evaluated", (json_int_t)st->prompt_tokens, "tokens_cached",
                          (json_int_t)st->cached_tokens, "has_new_line",
                          memchr(e->text.p ? e->text.p : "", '\n', end) != NULL, "truncated",
                          st->truncated, "stop_type", stop_type, "stopping_word",
                          st->stopping_word ? st->stopping_word : "", "timings", timings);
    if (!j) return agent_err(AGENT_ENOMEM, "out of memory");
    if (e->stream && end > e->sent) {
        /* the held-back tail that completed nothing: send what is valid */
        json_object_set_new(j, "content", agent_json_text(e->text.p + e->sent, end - e->sent));
        e->sent = end;
    }
    if (e->fields) {
        /* response_fields: only these, keyed by their path as given */
        json_t *sel = json_object();
        size_t i;
        json_t *f;
        if (!sel) rc = agent_err(AGENT_ENOMEM, "out of memory");
        json_array_foreach(e->fields, i, f) {
            if (rc) break;
            json_t *v = path_get(j, json_string_value(f));
            if (v) json_object_set(sel, json_string_value(f), v);
        }
        json_decref(j);
        j = sel;
    }
    if (rc) return rc;
    if (e->stream) return send_json(e, j);
    *body = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return *body ? 0 : agent_err(AGENT_ENOMEM, "out of memory");
}

/* ----- route ----- */

typedef struct {
    char *model;
    agent_infill_req q;
    agent_infill_enc *enc;
} infill_ctx;

static int inf_start(agent_dialect_run *run, void *ctx) {
    infill_ctx *c = ctx;
    return agent_infill_enc_new(&c->enc, &c->q, c->model, agent_dialect_sse, run);
}

static int inf_text(void *ctx, const char *text, size_t len) {
    return agent_infill_enc_text(((infill_ctx *)ctx)->enc, text, len);
}

static int inf_done(void *ctx, const srv_event *ev, char **body) {
    const srv_usage *u = &ev->usage;
    agent_infill_stats st = {u->prompt_tokens, u->cached_tokens, u->completion_tokens,
                             u->ttft_ms > u->queue_ms ? u->ttft_ms - u->queue_ms : 0,
                             u->total_ms > u->ttft_ms ? u->total_ms - u->ttft_ms : 0,
                             ev->finish == SRV_FINISH_LENGTH ? "limit"
                             : ev->finish == SRV_FINISH_TIME ? "time"
                             : ev->stop_sequence             ? "word"
                                                             : "eos",
                             ev->stop_sequence, false};
    return agent_infill_enc_done(((infill_ctx *)ctx)->enc, &st, body);
}

static int inf_fail(void *ctx, const agent_dialect_err *e) {
    return agent_infill_enc_fail(((infill_ctx *)ctx)->enc, e);
}

static void inf_free(void *ctx) {
    infill_ctx *c = ctx;
    if (!c) return;
    agent_infill_enc_free(c->enc);
    agent_infill_req_clear(&c->q);
    free(c->model);
    free(c);
}

static const agent_dialect_ops inf_ops = {inf_start, inf_text, NULL, inf_done, inf_fail,
                                          agent_infill_error_body, inf_free, NULL};

static int route_infill(srv_req *r) {
    srv *s = srv_req_server(r);
    agent_dialect_err e = {0};
    if (srv_draining(s)) {
        agent_dialect_fail(&e, 503, "", NULL, "the server is shutting down");
        return agent_dialect_reply_error(r, &e, agent_infill_error_body);
    }
    infill_ctx *c = calloc(1, sizeof *c);
    if (!c || !(c->model = strdup(srv_model_name(s)))) {
        free(c);
        return agent_err(AGENT_ENOMEM, "out of memory");
    }
    int rc = agent_infill_parse(srv_req_json(r), srv_limits_get(s)->max_tokens_default, &c->q, &e);
    if (rc) {
        inf_free(c);
        return rc == AGENT_EINVAL ? agent_dialect_reply_error(r, &e, agent_infill_error_body) : rc;
    }
    return agent_dialect_submit(r, NULL, &c->q.req, c->q.stream, &inf_ops, c);
}

int srv_infill_init(srv *s) {
    return srv_route_add(s, "POST", "/infill", route_infill, SRV_ROUTE_JSON);
}
