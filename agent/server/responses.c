/* OpenAI Responses API (POST /v1/responses), what Codex CLI speaks: request -> chat body, chat
 * events -> response object / stream events (dialects.h). Stateless: store and
 * previous_response_id are not supported (Codex sends store: false and the whole input). */
#include "dialects.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BAD(e, param, ...) agent_dialect_fail((e), 400, "invalid_request_error", (param), __VA_ARGS__)

/* The text of a message's content: a string or an array of parts (input_text, output_text,
 * text, refusal). */
static int content_text(srv_buf *b, const json_t *c, const char *where, agent_dialect_err *e) {
    if (json_is_string(c)) return srv_buf_add(b, json_string_value(c), json_string_length(c));
    if (!json_is_array(c))
        return BAD(e, where, "%s: must be a string or an array of content parts", where);
    size_t i;
    json_t *p;
    json_array_foreach(c, i, p) {
        const char *type = json_string_value(json_object_get(p, "type"));
        if (!json_is_object(p) || !type)
            return BAD(e, where, "%s.%zu: a content part needs a \"type\"", where, i);
        const char *key = !strcmp(type, "refusal") ? "refusal" : "text";
        if (strcmp(type, "input_text") && strcmp(type, "output_text") && strcmp(type, "text") &&
            strcmp(type, "refusal"))
            return BAD(e, where, "%s.%zu: content type \"%s\" is not supported (this model reads "
                       "text only)", where, i, type);
        json_t *t = json_object_get(p, key);
        if (!json_is_string(t)) return BAD(e, where, "%s.%zu.%s: must be a string", where, i, key);
        int rc = b->len ? srv_buf_add(b, "\n", 1) : 0;
        if (!rc) rc = srv_buf_add(b, json_string_value(t), json_string_length(t));
        if (rc) return rc;
    }
    return 0;
}

/* The last message of msgs when it is an assistant message, else a new empty one appended. */
static json_t *assistant_tail(json_t *msgs) {
    size_t n = json_array_size(msgs);
    json_t *last = n ? json_array_get(msgs, n - 1) : NULL;
    const char *role = json_string_value(json_object_get(last, "role"));
    if (last && role && !strcmp(role, "assistant")) return last;
    json_t *m = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
    if (!m || json_array_append_new(msgs, m)) return NULL;
    return m;
}

static int add_call(json_t *msgs, const char *id, const char *name, const char *args) {
    json_t *a = assistant_tail(msgs);
    if (!a) return agent_err(AGENT_ENOMEM, "out of memory");
    json_t *calls = json_object_get(a, "tool_calls");
    if (!calls) {
        calls = json_array();
        if (!calls || json_object_set_new(a, "tool_calls", calls))
            return agent_err(AGENT_ENOMEM, "out of memory");
    }
    if (json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type",
                                               "function", "function", "name", name,
                                               "arguments", args)))
        return agent_err(AGENT_ENOMEM, "out of memory");
    return 0;
}

static int convert_item(json_t *msgs, const json_t *it, size_t idx, json_t *notes,
                        agent_dialect_err *e) {
    char where[48];
    snprintf(where, sizeof where, "input[%zu]", idx);
    if (!json_is_object(it)) return BAD(e, where, "%s: must be an object", where);
    const char *type = json_string_value(json_object_get(it, "type"));
    const char *role = json_string_value(json_object_get(it, "role"));
    if (!type && role) type = "message";
    if (!type) return BAD(e, where, "%s: an input item needs a \"type\"", where);
    int rc = 0;
    if (!strcmp(type, "message")) {
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") &&
                      strcmp(role, "developer")))
            return BAD(e, where, "%s.role: must be user, assistant, system or developer", where);
        char cw[64];
        snprintf(cw, sizeof cw, "%s.content", where);
        srv_buf b = {0};
        rc = content_text(&b, json_object_get(it, "content"), cw, e);
        if (!rc) {
            /* developer messages are the instructions of the newer API: a system message. */
            const char *r = !strcmp(role, "developer") ? "system" : role;
            json_t *m = json_pack("{s:s, s:o}", "role", r, "content", agent_json_text(b.p, b.len));
            if (!m || json_array_append_new(msgs, m)) rc = agent_err(AGENT_ENOMEM, "out of memory");
        }
        srv_buf_free(&b);
        return rc;
    }
    if (!strcmp(type, "function_call")) {
        const char *id = json_string_value(json_object_get(it, "call_id"));
        const char *name = json_string_value(json_object_get(it, "name"));
        const char *args = json_string_value(json_object_get(it, "arguments"));
        if (!id || !name || !args)
            return BAD(e, where, "%s: a function_call needs string call_id, name and arguments",
                       where);
        return add_call(msgs, id, name, args);
    }
    if (!strcmp(type, "function_call_output")) {
        const char *id = json_string_value(json_object_get(it, "call_id"));
        json_t *out = json_object_get(it, "output");
        if (!id || !out)
            return BAD(e, where, "%s: a function_call_output needs call_id and output", where);
        char ow[64];
        snprintf(ow, sizeof ow, "%s.output", where);
        srv_buf b = {0};
        rc = content_text(&b, out, ow, e);
        if (!rc) {
            json_t *m = json_pack("{s:s, s:s, s:o}", "role", "tool", "tool_call_id", id, "content",
                                  agent_json_text(b.p, b.len));
            if (!m || json_array_append_new(msgs, m)) rc = agent_err(AGENT_ENOMEM, "out of memory");
        }
        srv_buf_free(&b);
        return rc;
    }
    if (!strcmp(type, "reasoning")) return 0; /* another model's (often encrypted) reasoning */
    if (!strcmp(type, "item_reference"))
        return BAD(e, where, "%s: item_reference needs stored responses, which this server does "
                   "not keep; send the items themselves", where);
    /* Calls and outputs of built-in tools (local_shell_call, web_search_call, custom tools,
     * ...) that this server never offers: left out, with a note. */
    return agent_dialect_note(notes, "input item type \"%s\" is not supported and was ignored",
                              type);
}

static int convert_tools(agent_chat_xlat *x, const json_t *tools, json_t *notes,
                         agent_dialect_err *e) {
    if (!json_is_array(tools)) return BAD(e, "tools", "tools: must be an array");
    json_t *out = json_array();
    if (!out) return agent_err(AGENT_ENOMEM, "out of memory");
    int rc = 0;
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        char w[32];
        snprintf(w, sizeof w, "tools[%zu]", i);
        const char *type = json_string_value(json_object_get(t, "type"));
        if (!json_is_object(t) || !type) {
            rc = BAD(e, w, "%s: a tool needs a \"type\"", w);
            break;
        }
        if (strcmp(type, "function")) {
            rc = agent_dialect_note(notes, "tool type \"%s\" is not supported and was ignored",
                                    type);
            if (rc) break;
            continue;
        }
        const char *name = json_string_value(json_object_get(t, "name"));
        json_t *params = json_object_get(t, "parameters");
        if (!name) {
            rc = BAD(e, w, "%s.name: must be a string", w);
            break;
        }
        if (params && !json_is_object(params) && !json_is_null(params)) {
            rc = BAD(e, w, "%s.parameters: must be a JSON Schema object", w);
            break;
        }
        rc = agent_chat_add_function(out, name, json_is_object(params) ? params : NULL,
                                     json_object_get(t, "description"));
        if (rc) break;
    }
    if (rc)
        json_decref(out);
    else
        agent_chat_xlat_set_tools(x, out);
    return rc;
}

static int convert_tool_choice(agent_chat_xlat *x, const json_t *tc, json_t *notes,
                               agent_dialect_err *e) {
    if (json_is_string(tc)) {
        const char *s = json_string_value(tc);
        if (!strcmp(s, "auto")) x->req.tool_choice = SRV_TOOLS_AUTO;
        else if (!strcmp(s, "none")) x->req.tool_choice = SRV_TOOLS_NONE;
        else if (!strcmp(s, "required")) x->req.tool_choice = SRV_TOOLS_REQUIRED;
        else return BAD(e, "tool_choice", "tool_choice: \"%s\" is not one of auto, none, "
                        "required", s);
        return 0;
    }
    const char *type = json_string_value(json_object_get(tc, "type"));
    if (!json_is_object(tc) || !type)
        return BAD(e, "tool_choice", "tool_choice: must be a string or an object with a type");
    if (!strcmp(type, "function")) {
        const char *name = json_string_value(json_object_get(tc, "name"));
        if (!name) return BAD(e, "tool_choice.name", "tool_choice.name: must be a string");
        x->req.tool_choice = SRV_TOOLS_NAMED;
        x->req.tool_name = name; /* in the body */
        return 0;
    }
    /* allowed_tools, hosted tools, custom: behave as "auto". */
    return agent_dialect_note(notes, "tool_choice type \"%s\" is not supported; \"auto\" was used",
                              type);
}

static int convert_format(agent_chat_xlat *x, const json_t *text, agent_dialect_err *e) {
    json_t *f = json_object_get(text, "format");
    if (!f || json_is_null(f)) return 0;
    const char *type = json_string_value(json_object_get(f, "type"));
    if (!json_is_object(f) || !type)
        return BAD(e, "text.format", "text.format: must be an object with a type");
    if (!strcmp(type, "text")) return 0;
    if (!strcmp(type, "json_object")) {
        x->req.json_object = true;
        return 0;
    }
    if (!strcmp(type, "json_schema")) {
        json_t *schema = json_object_get(f, "schema");
        if (!json_is_object(schema))
            return BAD(e, "text.format.schema", "text.format.schema: must be a JSON Schema object");
        x->req.json_schema = schema; /* in the body */
        return 0;
    }
    return BAD(e, "text.format.type", "text.format.type: \"%s\" is not one of text, json_object, "
               "json_schema", type);
}

int agent_responses_to_chat(const json_t *body, int default_max_tokens, agent_chat_xlat *x,
                            json_t *notes, agent_dialect_err *e) {
    agent_chat_xlat_init(x, default_max_tokens);
    srv_chat_req *q = &x->req;
    if (!json_is_object(body)) return BAD(e, "", "the request body must be a JSON object");
    json_t *input = json_object_get(body, "input");
    if (!json_is_string(input) && !json_is_array(input))
        return BAD(e, "input", "input: must be a string or an array of input items");
    if (json_is_string(json_object_get(body, "previous_response_id")))
        return BAD(e, "previous_response_id", "previous_response_id: this server does not store "
                   "responses; send the whole conversation in input");
    json_t *st = json_object_get(body, "stream");
    if (st && !json_is_boolean(st) && !json_is_null(st))
        return BAD(e, "stream", "stream: must be a boolean");
    x->stream = json_is_true(st);
    if (!(x->messages = json_array())) return agent_err(AGENT_ENOMEM, "out of memory");
    q->messages = x->messages;
    json_t *msgs = x->messages;
    int rc = 0;
    json_t *ins = json_object_get(body, "instructions");
    if (ins && !json_is_null(ins)) {
        if (!json_is_string(ins))
            rc = BAD(e, "instructions", "instructions: must be a string");
        else if (json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content",
                                                       ins)))
            rc = agent_err(AGENT_ENOMEM, "out of memory");
    }
    if (!rc && json_is_string(input)) {
        if (json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content", input)))
            rc = agent_err(AGENT_ENOMEM, "out of memory");
    } else if (!rc) {
        size_t i;
        json_t *it;
        json_array_foreach(input, i, it) {
            if ((rc = convert_item(msgs, it, i, notes, e))) break;
        }
    }
    if (!rc && json_array_size(msgs) == 0) rc = BAD(e, "input", "input: no messages");
    json_t *tools = json_object_get(body, "tools");
    if (!rc && tools && !json_is_null(tools)) rc = convert_tools(x, tools, notes, e);
    json_t *tc = json_object_get(body, "tool_choice");
    if (!rc && tc && !json_is_null(tc)) rc = convert_tool_choice(x, tc, notes, e);
    json_t *text = json_object_get(body, "text");
    if (!rc && text && !json_is_null(text)) rc = convert_format(x, text, e);
    json_t *mt = json_object_get(body, "max_output_tokens");
    if (!rc && mt && !json_is_null(mt)) {
        if (!json_is_integer(mt) || json_integer_value(mt) < 1)
            rc = BAD(e, "max_output_tokens", "max_output_tokens: must be an integer >= 1");
        else
            q->sampling.max_tokens = json_integer_value(mt) > (1 << 24)
                                         ? (1 << 24) : (int32_t)json_integer_value(mt);
    }
    const char *nums[] = {"temperature", "top_p"};
    for (size_t k = 0; !rc && k < 2; k++) {
        json_t *v = json_object_get(body, nums[k]);
        if (!v || json_is_null(v)) continue;
        double lim = k == 0 ? 2 : 1;
        if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) > lim)
            rc = BAD(e, nums[k], "%s: must be a number in [0, %g]", nums[k], lim);
        else if (k == 0)
            q->sampling.temperature = (float)json_number_value(v);
        else
            q->sampling.top_p = (float)json_number_value(v);
    }
    json_t *ptc = json_object_get(body, "parallel_tool_calls");
    if (!rc && json_is_boolean(ptc)) q->parallel_tool_calls = json_is_true(ptc);
    if (!rc) {
        const char *keys[] = {"instructions", "tools", "tool_choice", "parallel_tool_calls",
                              "temperature", "top_p", "max_output_tokens", "text", "metadata",
                              "reasoning", "user"};
        if (!(x->echo = json_object())) rc = agent_err(AGENT_ENOMEM, "out of memory");
        for (size_t k = 0; !rc && k < sizeof keys / sizeof keys[0]; k++) {
            json_t *v = json_object_get(body, keys[k]);
            if (v) json_object_set(x->echo, keys[k], v);
        }
    }
    return rc;
}

char *agent_responses_error_body(const agent_dialect_err *e) {
    const char *type = e->type[0] ? e->type : e->status >= 500 ? "server_error"
                                            : e->status == 429 ? "rate_limit_error"
                                            : e->status == 401 ? "authentication_error"
                                                               : "invalid_request_error";
    return agent_json_dump(json_pack("{s:{s:s, s:s, s:o, s:n}}", "error", "message",
                                     e->message, "type", type, "param",
                                     e->param[0] ? json_string(e->param) : json_null(), "code"));
}

/* ----- the encoder ----- */

enum { ITEM_NONE, ITEM_MESSAGE, ITEM_CALL, ITEM_REASONING };

struct agent_responses_enc {
    char id[48];
    char *model;
    json_t *echo;
    bool stream, failed;
    agent_sse_fn sink;
    void *user;
    int64_t created_at;
    int64_t seq;            /* sequence_number of the next event */
    int open;               /* ITEM_*: the output item being written */
    int open_tool;          /* its tool index */
    char item_id[48];       /* the open item's id */
    char *call_id, *name;   /* the open function call's */
    srv_buf cur;          /* the open item's text or arguments */
    srv_buf held;         /* streamed text held back until its UTF-8 character completes */
    json_t *output;         /* finished output items */
};

static int send_event(agent_responses_enc *e, const char *type, json_t *data) {
    if (!data) return agent_err(AGENT_ENOMEM, "out of memory");
    /* every event carries its type and a sequence number, first in the object as OpenAI's */
    json_t *ev = json_pack("{s:s, s:I}", "type", type, "sequence_number", (json_int_t)e->seq++);
    if (!ev || json_object_update(ev, data)) {
        json_decref(ev);
        json_decref(data);
        return agent_err(AGENT_ENOMEM, "out of memory");
    }
    json_decref(data);
    char *s = json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(ev);
    if (!s) return agent_err(AGENT_ENOMEM, "out of memory");
    int rc = e->sink(e->user, type, s, strlen(s)) ? agent_err(AGENT_EINTERNAL, "client gone") : 0;
    free(s);
    if (rc) e->failed = true;
    return rc;
}

/* The response object; status "in_progress", "completed", "incomplete" or "failed". */
static json_t *response_obj(const agent_responses_enc *e, const char *status, json_t *output,
                            json_t *usage, json_t *incomplete, json_t *error) {
    json_t *r = json_pack("{s:s, s:s, s:I, s:s, s:s, s:o, s:o, s:o, s:o, s:b}", "id", e->id,
                          "object", "response", "created_at", (json_int_t)e->created_at, "status",
                          status, "model", e->model, "output", output, "usage",
                          usage ? usage : json_null(), "incomplete_details",
                          incomplete ? incomplete : json_null(), "error",
                          error ? error : json_null(), "store", false);
    if (!r) return NULL;
    static const struct {
        const char *key;
        int kind; /* 0 null, 1 [] , 2 true, 3 "auto", 4 {"format":{"type":"text"}} */
    } defaults[] = {{"instructions", 0}, {"tools", 1}, {"tool_choice", 3},
                    {"parallel_tool_calls", 2}, {"temperature", 0}, {"top_p", 0},
                    {"max_output_tokens", 0}, {"text", 4}, {"metadata", 0}, {"reasoning", 0}};
    for (size_t k = 0; k < sizeof defaults / sizeof defaults[0]; k++) {
        json_t *v = e->echo ? json_object_get(e->echo, defaults[k].key) : NULL;
        if (v) {
            json_object_set(r, defaults[k].key, v);
            continue;
        }
        json_t *d = defaults[k].kind == 0 ? json_null()
                    : defaults[k].kind == 1 ? json_array()
                    : defaults[k].kind == 2 ? json_true()
                    : defaults[k].kind == 3 ? json_string("auto")
                    : json_pack("{s:{s:s}}", "format", "type", "text");
        json_object_set_new(r, defaults[k].key, d);
    }
    return r;
}

int agent_responses_enc_new(agent_responses_enc **out, const char *model, const json_t *echo,
                            bool stream, agent_sse_fn sink, void *user) {
    *out = NULL;
    if (stream && !sink) return agent_err(AGENT_EINVAL, "a streaming encoder needs a sink");
    agent_responses_enc *e = calloc(1, sizeof *e);
    if (!e) return agent_err(AGENT_ENOMEM, "out of memory");
    e->model = strdup(model ? model : "spark-agent");
    e->output = json_array();
    e->echo = echo ? json_incref((json_t *)echo) : NULL;
    if (!e->model || !e->output) {
        agent_responses_enc_free(e);
        return agent_err(AGENT_ENOMEM, "out of memory");
    }
    srv_random_id(e->id, sizeof e->id, "resp_");
    e->stream = stream;
    e->sink = sink;
    e->user = user;
    e->created_at = (int64_t)time(NULL);
    if (stream) {
        int rc = send_event(e, "response.created",
                            json_pack("{s:o}", "response",
                                      response_obj(e, "in_progress", json_array(), NULL, NULL,
                                                   NULL)));
        if (!rc)
            rc = send_event(e, "response.in_progress",
                            json_pack("{s:o}", "response",
                                      response_obj(e, "in_progress", json_array(), NULL, NULL,
                                                   NULL)));
        if (rc) {
            agent_responses_enc_free(e);
            return rc;
        }
    }
    *out = e;
    return 0;
}

void agent_responses_enc_free(agent_responses_enc *e) {
    if (!e) return;
    free(e->model);
    free(e->call_id);
    free(e->name);
    srv_buf_free(&e->cur);
    srv_buf_free(&e->held);
    json_decref(e->output);
    json_decref(e->echo);
    free(e);
}

static json_t *message_item(const agent_responses_enc *e, const char *status, bool with_text) {
    json_t *content = with_text
                          ? json_pack("[{s:s, s:o, s:[], s:[]}]", "type", "output_text", "text",
                                      agent_json_text(e->cur.p, e->cur.len), "annotations",
                                      "logprobs")
                          : json_array();
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", e->item_id, "type", "message", "status",
                     status, "role", "assistant", "content", content);
}

static json_t *call_item(const agent_responses_enc *e, const char *status) {
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:o}", "id", e->item_id, "type", "function_call",
                     "status", status, "call_id", e->call_id ? e->call_id : "", "name",
                     e->name ? e->name : "", "arguments", agent_json_text(e->cur.p, e->cur.len));
}

/* A reasoning item: the model's thoughts as reasoning_text content (no summary). */
static json_t *reasoning_item(const agent_responses_enc *e, const char *status, bool with_text) {
    json_t *content = with_text ? json_pack("[{s:s, s:o}]", "type", "reasoning_text", "text",
                                            agent_json_text(e->cur.p, e->cur.len))
                                : json_array();
    return json_pack("{s:s, s:s, s:[], s:o, s:s}", "id", e->item_id, "type", "reasoning",
                     "summary", "content", content, "status", status);
}

static int close_item(agent_responses_enc *e) {
    if (e->open == ITEM_NONE) return 0;
    int rc = 0;
    int idx = (int)json_array_size(e->output);
    if (e->stream && e->open == ITEM_REASONING) {
        rc = send_event(e, "response.reasoning_text.done",
                        json_pack("{s:s, s:i, s:i, s:o}", "item_id", e->item_id, "output_index",
                                  idx, "content_index", 0, "text",
                                  agent_json_text(e->cur.p, e->cur.len)));
        if (!rc)
            rc = send_event(e, "response.content_part.done",
                            json_pack("{s:s, s:i, s:i, s:{s:s, s:o}}", "item_id", e->item_id,
                                      "output_index", idx, "content_index", 0, "part", "type",
                                      "reasoning_text", "text",
                                      agent_json_text(e->cur.p, e->cur.len)));
    } else if (e->stream && e->open == ITEM_MESSAGE) {
        json_t *part = json_pack("{s:s, s:o, s:[]}", "type", "output_text", "text",
                                 agent_json_text(e->cur.p, e->cur.len), "annotations");
        rc = send_event(e, "response.output_text.done",
                        json_pack("{s:s, s:i, s:i, s:o, s:[]}", "item_id", e->item_id,
                                  "output_index", idx, "content_index", 0, "text",
                                  agent_json_text(e->cur.p, e->cur.len), "logprobs"));
        if (!rc)
            rc = send_event(e, "response.content_part.done",
                            json_pack("{s:s, s:i, s:i, s:O}", "item_id", e->item_id,
                                      "output_index", idx, "content_index", 0, "part", part));
        json_decref(part);
    } else if (e->stream) {
        rc = send_event(e, "response.function_call_arguments.done",
                        json_pack("{s:s, s:i, s:s, s:o}", "item_id", e->item_id, "output_index",
                                  idx, "name", e->name ? e->name : "", "arguments",
                                  agent_json_text(e->cur.p, e->cur.len)));
    }
    json_t *item = e->open == ITEM_MESSAGE     ? message_item(e, "completed", true)
                   : e->open == ITEM_REASONING ? reasoning_item(e, "completed", true)
                                               : call_item(e, "completed");
    if (!item) return agent_err(AGENT_ENOMEM, "out of memory");
    if (!rc && e->stream)
        rc = send_event(e, "response.output_item.done",
                        json_pack("{s:i, s:O}", "output_index", idx, "item", item));
    if (json_array_append_new(e->output, item) && !rc) rc = agent_err(AGENT_ENOMEM, "out of memory");
    e->open = ITEM_NONE;
    e->cur.len = 0;
    free(e->call_id);
    free(e->name);
    e->call_id = e->name = NULL;
    return rc;
}

static int stream_text(agent_responses_enc *e, const char *s, size_t n) {
    if (!e->stream || !n) return 0;
    if (e->open == ITEM_REASONING)
        return send_event(e, "response.reasoning_text.delta",
                          json_pack("{s:s, s:i, s:i, s:o}", "item_id", e->item_id,
                                    "output_index", (int)json_array_size(e->output),
                                    "content_index", 0, "delta", agent_json_text(s, n)));
    return send_event(e, "response.output_text.delta",
                      json_pack("{s:s, s:i, s:i, s:o, s:[]}", "item_id", e->item_id,
                                "output_index", (int)json_array_size(e->output), "content_index",
                                0, "delta", agent_json_text(s, n), "logprobs"));
}

static int flush_held(agent_responses_enc *e);

/* Text into a message or reasoning item (opened when another item is open). */
static int item_text(agent_responses_enc *e, int kind, const char *text, size_t len) {
    if (e->failed) return agent_err(AGENT_EINTERNAL, "the response already failed");
    if (!len) return 0;
    int rc = 0;
    if (e->open != kind) {
        if ((rc = flush_held(e)) || (rc = close_item(e))) return rc;
        e->open = kind;
        bool msg = kind == ITEM_MESSAGE;
        srv_random_id(e->item_id, sizeof e->item_id, msg ? "msg_" : "rs_");
        if (e->stream) {
            int idx = (int)json_array_size(e->output);
            rc = send_event(e, "response.output_item.added",
                            json_pack("{s:i, s:o}", "output_index", idx, "item",
                                      msg ? message_item(e, "in_progress", false)
                                          : reasoning_item(e, "in_progress", false)));
            if (!rc && msg)
                rc = send_event(e, "response.content_part.added",
                                json_pack("{s:s, s:i, s:i, s:{s:s, s:s, s:[]}}", "item_id",
                                          e->item_id, "output_index", idx, "content_index", 0,
                                          "part", "type", "output_text", "text", "",
                                          "annotations"));
            else if (!rc)
                rc = send_event(e, "response.content_part.added",
                                json_pack("{s:s, s:i, s:i, s:{s:s, s:s}}", "item_id", e->item_id,
                                          "output_index", idx, "content_index", 0, "part",
                                          "type", "reasoning_text", "text", ""));
            if (rc) return rc;
        }
    }
    size_t ok;
    if ((rc = agent_text_hold(&e->cur, &e->held, text, len, &ok))) return rc;
    rc = stream_text(e, e->held.p, ok);
    agent_text_release(&e->held, ok);
    return rc;
}

int agent_responses_enc_text(agent_responses_enc *e, const char *text, size_t len) {
    return item_text(e, ITEM_MESSAGE, text, len);
}

int agent_responses_enc_reasoning(agent_responses_enc *e, const char *text, size_t len) {
    return item_text(e, ITEM_REASONING, text, len);
}

/* An incomplete character at the end of a text item: shown as U+FFFD. */
static int flush_held(agent_responses_enc *e) {
    int rc;
    if (!agent_text_flush_held(&e->cur, &e->held, &rc) || rc) return rc;
    return stream_text(e, "\xEF\xBF\xBD", 3);
}

int agent_responses_enc_tool(agent_responses_enc *e, int index, const char *id, const char *name,
                             const char *args, size_t len) {
    if (e->failed) return agent_err(AGENT_EINTERNAL, "the response already failed");
    int rc = 0;
    if (e->open != ITEM_CALL || e->open_tool != index) {
        if ((rc = flush_held(e)) || (rc = close_item(e))) return rc;
        e->open = ITEM_CALL;
        e->open_tool = index;
        srv_random_id(e->item_id, sizeof e->item_id, "fc_");
        char gen[48];
        if (!id) srv_random_id(gen, sizeof gen, "call_");
        e->call_id = strdup(id ? id : gen);
        e->name = strdup(name ? name : "");
        if (!e->call_id || !e->name) return agent_err(AGENT_ENOMEM, "out of memory");
        if (e->stream &&
            (rc = send_event(e, "response.output_item.added",
                             json_pack("{s:i, s:o}", "output_index",
                                       (int)json_array_size(e->output), "item",
                                       call_item(e, "in_progress")))))
            return rc;
    }
    if (!len) return 0;
    if ((rc = srv_buf_add(&e->cur, args, len))) return rc;
    if (e->stream)
        rc = send_event(e, "response.function_call_arguments.delta",
                        json_pack("{s:s, s:i, s:o}", "item_id", e->item_id, "output_index",
                                  (int)json_array_size(e->output), "delta",
                                  agent_json_text(args, len)));
    return rc;
}

int agent_responses_enc_done(agent_responses_enc *e, const agent_dialect_done *d, char **body) {
    *body = NULL;
    if (e->failed) return agent_err(AGENT_EINTERNAL, "the response already failed");
    int rc = flush_held(e);
    if (!rc) rc = close_item(e);
    if (rc) return rc;
    const agent_dialect_usage *u = &d->usage;
    int64_t cached = u->cached_tokens < u->prompt_tokens ? u->cached_tokens : u->prompt_tokens;
    int64_t reasoning = u->reasoning_tokens < u->completion_tokens ? u->reasoning_tokens
                                                                   : u->completion_tokens;
    json_t *usage = json_pack("{s:I, s:{s:I}, s:I, s:{s:I}, s:I}", "input_tokens",
                              (json_int_t)u->prompt_tokens, "input_tokens_details",
                              "cached_tokens", (json_int_t)cached, "output_tokens",
                              (json_int_t)u->completion_tokens, "output_tokens_details",
                              "reasoning_tokens", (json_int_t)reasoning, "total_tokens",
                              (json_int_t)(u->prompt_tokens + u->completion_tokens));
    bool incomplete = d->finish && !strcmp(d->finish, "length");
    json_t *r = response_obj(e, incomplete ? "incomplete" : "completed", json_incref(e->output),
                             usage, incomplete ? json_pack("{s:s}", "reason", "max_output_tokens")
                                               : NULL, NULL);
    if (!r) return agent_err(AGENT_ENOMEM, "out of memory");
    if (e->stream)
        return send_event(e, incomplete ? "response.incomplete" : "response.completed",
                          json_pack("{s:o}", "response", r));
    *body = json_dumps(r, JSON_COMPACT);
    json_decref(r);
    return *body ? 0 : agent_err(AGENT_ENOMEM, "out of memory");
}

int agent_responses_enc_fail(agent_responses_enc *e, const agent_dialect_err *err) {
    if (e->failed || !e->stream) return 0;
    json_t *r = response_obj(e, "failed", json_incref(e->output), NULL, NULL,
                             json_pack("{s:s, s:s}", "code", err->status >= 500 ? "server_error"
                                                                                  : err->type,
                                       "message", err->message));
    int rc = send_event(e, "response.failed", json_pack("{s:o}", "response", r));
    e->failed = true;
    return rc;
}

/* ----- route ----- */

static int resp_start(agent_dialect_run *run, void *ctx) {
    agent_chat_ctx *c = ctx;
    agent_responses_enc *enc = NULL;
    int rc = agent_responses_enc_new(&enc, c->model, c->x.echo, c->x.stream, agent_dialect_sse,
                                     run);
    c->enc = enc;
    return rc;
}

static int resp_text(void *ctx, const char *text, size_t len) {
    return agent_responses_enc_text(((agent_chat_ctx *)ctx)->enc, text, len);
}

static int resp_tool(void *ctx, const srv_event *ev) {
    const char *args;
    size_t len;
    if (!agent_dialect_tool_piece(ev, &args, &len)) return 0;
    return agent_responses_enc_tool(((agent_chat_ctx *)ctx)->enc, ev->tool_index, ev->tool_id,
                                    ev->tool_name, args, len);
}

static int resp_reasoning(void *ctx, const char *text, size_t len) {
    return agent_responses_enc_reasoning(((agent_chat_ctx *)ctx)->enc, text, len);
}

static int resp_done(void *ctx, const srv_event *ev, char **body) {
    agent_dialect_done d = agent_dialect_done_of(ev);
    return agent_responses_enc_done(((agent_chat_ctx *)ctx)->enc, &d, body);
}

static int resp_fail(void *ctx, const agent_dialect_err *e) {
    return agent_responses_enc_fail(((agent_chat_ctx *)ctx)->enc, e);
}

static void resp_free(void *ctx) {
    agent_chat_ctx *c = ctx;
    if (c) agent_responses_enc_free(c->enc);
    agent_chat_ctx_free(c);
}

static const agent_dialect_ops resp_ops = {resp_start, resp_text, resp_tool, resp_done,
                                           resp_fail, agent_responses_error_body, resp_free,
                                           resp_reasoning};

static int route_responses(srv_req *r) {
    return agent_dialect_chat_route(r, "/v1/responses", agent_responses_to_chat, &resp_ops);
}

int srv_responses_init(srv *s) {
    return srv_route_add(s, "POST", "/v1/responses", route_responses, SRV_ROUTE_JSON);
}
