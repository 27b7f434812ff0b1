/* Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens), what Claude Code
 * speaks: request -> chat body, chat events -> message / stream events (dialects.h). */
#include "dialects.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BAD(e, param, ...) agent_dialect_fail((e), 400, "invalid_request_error", (param), __VA_ARGS__)

/* Join the text blocks of a "system" array or a tool_result content array into b (separated
 * by newlines). Image blocks inside tool results become a placeholder (Claude Code's Read of
 * an image file); anything else is an error. */
static int join_text(srv_buf *b, const json_t *v, const char *where, bool images_ok,
                     json_t *notes, agent_dialect_err *e) {
    if (json_is_string(v)) return srv_buf_add(b, json_string_value(v), json_string_length(v));
    if (!json_is_array(v)) return BAD(e, where, "%s: must be a string or an array of blocks", where);
    size_t i;
    json_t *blk;
    json_array_foreach(v, i, blk) {
        const char *type = json_string_value(json_object_get(blk, "type"));
        if (!json_is_object(blk) || !type)
            return BAD(e, where, "%s.%zu: a content block needs a \"type\"", where, i);
        int rc = 0;
        if (i) rc = srv_buf_add(b, "\n", 1);
        if (!strcmp(type, "text")) {
            json_t *t = json_object_get(blk, "text");
            if (!json_is_string(t))
                return BAD(e, where, "%s.%zu.text: must be a string", where, i);
            if (!rc) rc = srv_buf_add(b, json_string_value(t), json_string_length(t));
        } else if (images_ok && (!strcmp(type, "image") || !strcmp(type, "document"))) {
            static const char ph[] = "[non-text content omitted: this model reads text only]";
            if (!rc) rc = srv_buf_add(b, ph, sizeof ph - 1);
            if (!rc) rc = agent_dialect_note(notes, "a tool result's %s block was replaced by a placeholder",
                                   type);
        } else {
            return BAD(e, where, "%s.%zu: content block type \"%s\" is not supported here "
                       "(this model reads text only)", where, i, type);
        }
        if (rc) return rc;
    }
    return 0;
}

/* One Anthropic message -> chat messages appended to msgs. */
static int convert_message(json_t *msgs, const json_t *m, size_t idx, json_t *notes,
                           agent_dialect_err *e) {
    char where[64];
    snprintf(where, sizeof where, "messages.%zu", idx);
    const char *role = json_string_value(json_object_get(m, "role"));
    json_t *content = json_object_get(m, "content");
    if (!json_is_object(m)) return BAD(e, where, "%s: must be an object", where);
    if (!role || (strcmp(role, "user") && strcmp(role, "assistant")))
        return BAD(e, where, "%s.role: must be \"user\" or \"assistant\"", where);
    if (json_is_string(content))
        return json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", role, "content",
                                                     content)) ? AGENT_ENOMEM : 0;
    if (!json_is_array(content))
        return BAD(e, where, "%s.content: must be a string or an array of content blocks", where);
    bool user = !strcmp(role, "user");
    srv_buf text = {0}, reasoning = {0};
    json_t *calls = json_array();
    int rc = calls ? 0 : AGENT_ENOMEM;
    size_t i;
    json_t *blk;
    json_array_foreach(content, i, blk) {
        if (rc) break;
        char bw[96];
        snprintf(bw, sizeof bw, "%s.content.%zu", where, i);
        const char *type = json_string_value(json_object_get(blk, "type"));
        if (!json_is_object(blk) || !type) {
            rc = BAD(e, bw, "%s: a content block needs a \"type\"", bw);
            break;
        }
        if (!strcmp(type, "text")) {
            json_t *t = json_object_get(blk, "text");
            if (!json_is_string(t)) {
                rc = BAD(e, bw, "%s.text: must be a string", bw);
                break;
            }
            if (text.len) rc = srv_buf_add(&text, "\n", 1);
            if (!rc) rc = srv_buf_add(&text, json_string_value(t), json_string_length(t));
        } else if (user && !strcmp(type, "tool_result")) {
            const char *id = json_string_value(json_object_get(blk, "tool_use_id"));
            if (!id) {
                rc = BAD(e, bw, "%s.tool_use_id: must be a string", bw);
                break;
            }
            srv_buf out = {0};
            if (json_is_true(json_object_get(blk, "is_error"))) rc = srv_buf_add(&out, "Error: ", 7);
            json_t *c = json_object_get(blk, "content");
            char cw[128];
            snprintf(cw, sizeof cw, "%s.content", bw);
            if (!rc && c) rc = join_text(&out, c, cw, true, notes, e);
            /* Tool results go first: the chat templates expect them right after the
             * assistant turn that made the calls. */
            if (!rc && json_array_append_new(msgs, json_pack("{s:s, s:s, s:o}", "role", "tool",
                                                             "tool_call_id", id, "content",
                                                             agent_json_text(out.p, out.len))))
                rc = AGENT_ENOMEM;
            srv_buf_free(&out);
        } else if (!user && !strcmp(type, "tool_use")) {
            const char *id = json_string_value(json_object_get(blk, "id"));
            const char *name = json_string_value(json_object_get(blk, "name"));
            json_t *input = json_object_get(blk, "input");
            if (!id || !name || (input && !json_is_object(input))) {
                rc = BAD(e, bw, "%s: tool_use needs a string id and name and an object input", bw);
                break;
            }
            char *args = json_dumps(input ? input : json_object(), JSON_COMPACT);
            if (!args || json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id",
                                                                id, "type", "function",
                                                                "function", "name", name,
                                                                "arguments", args)))
                rc = AGENT_ENOMEM;
            free(args);
        } else if (!user && !strcmp(type, "thinking")) {
            json_t *t = json_object_get(blk, "thinking");
            if (json_is_string(t)) rc = srv_buf_add(&reasoning, json_string_value(t),
                                                      json_string_length(t));
        } else if (!user && !strcmp(type, "redacted_thinking")) {
            /* encrypted reasoning of another model: nothing we can read */
        } else {
            rc = BAD(e, bw, "%s: content block type \"%s\" is not supported in a%s %s message "
                     "(this model reads text only)", bw, type, user ? "" : "n", role);
        }
    }
    if (!rc) {
        json_t *msg = NULL;
        if (user) {
            if (text.len || json_array_size(content) == 0)
                msg = json_pack("{s:s, s:o}", "role", "user", "content", agent_json_text(text.p, text.len));
        } else {
            msg = json_pack("{s:s, s:o}", "role", "assistant", "content", agent_json_text(text.p, text.len));
            if (msg && json_array_size(calls)) json_object_set(msg, "tool_calls", calls);
            if (msg && reasoning.len)
                json_object_set_new(msg, "reasoning_content", agent_json_text(reasoning.p, reasoning.len));
            if (!msg) rc = AGENT_ENOMEM;
        }
        if (msg && json_array_append_new(msgs, msg)) rc = AGENT_ENOMEM;
    }
    json_decref(calls);
    srv_buf_free(&text);
    srv_buf_free(&reasoning);
    if (rc == AGENT_ENOMEM) agent_err(rc, "out of memory");
    return rc;
}

static int convert_tools(agent_chat_xlat *x, const json_t *tools, json_t *notes,
                         agent_dialect_err *e) {
    if (!json_is_array(tools)) return BAD(e, "tools", "tools: must be an array");
    json_t *out = json_array();
    if (!out) return agent_err(AGENT_ENOMEM, "out of memory");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        char w[32];
        snprintf(w, sizeof w, "tools.%zu", i);
        const char *type = json_string_value(json_object_get(t, "type"));
        const char *name = json_string_value(json_object_get(t, "name"));
        if (!json_is_object(t) || !name) {
            json_decref(out);
            return BAD(e, w, "%s: a tool needs a string \"name\"", w);
        }
        if (type && strcmp(type, "custom")) {
            /* Anthropic-hosted or client-defined server tools (bash_*, text_editor_*,
             * web_search_*): their behaviour is Anthropic's, so they are left out. */
            int rc = agent_dialect_note(notes, "tool type \"%s\" is not supported and was ignored", type);
            if (rc) {
                json_decref(out);
                return rc;
            }
            continue;
        }
        json_t *schema = json_object_get(t, "input_schema");
        if (!json_is_object(schema)) {
            json_decref(out);
            return BAD(e, w, "%s.input_schema: must be a JSON Schema object", w);
        }
        int rc = agent_chat_add_function(out, name, schema, json_object_get(t, "description"));
        if (rc) {
            json_decref(out);
            return rc;
        }
    }
    agent_chat_xlat_set_tools(x, out);
    return 0;
}

static int convert_tool_choice(agent_chat_xlat *x, const json_t *tc, agent_dialect_err *e) {
    const char *type = json_string_value(json_object_get(tc, "type"));
    if (!json_is_object(tc) || !type)
        return BAD(e, "tool_choice", "tool_choice: must be an object with a \"type\"");
    if (!strcmp(type, "auto")) {
        x->req.tool_choice = SRV_TOOLS_AUTO;
    } else if (!strcmp(type, "any")) {
        x->req.tool_choice = SRV_TOOLS_REQUIRED;
    } else if (!strcmp(type, "none")) {
        x->req.tool_choice = SRV_TOOLS_NONE;
    } else if (!strcmp(type, "tool")) {
        const char *name = json_string_value(json_object_get(tc, "name"));
        if (!name) return BAD(e, "tool_choice.name", "tool_choice.name: must be a string");
        x->req.tool_choice = SRV_TOOLS_NAMED;
        x->req.tool_name = name; /* in the body */
    } else {
        return BAD(e, "tool_choice.type", "tool_choice.type: \"%s\" is not one of auto, any, "
                   "tool, none", type);
    }
    if (json_is_true(json_object_get(tc, "disable_parallel_tool_use")))
        x->req.parallel_tool_calls = false;
    return 0;
}

int agent_anthropic_to_chat(const json_t *body, bool count_only, int default_max_tokens,
                            agent_chat_xlat *x, json_t *notes, agent_dialect_err *e) {
    agent_chat_xlat_init(x, default_max_tokens);
    srv_chat_req *q = &x->req;
    if (!json_is_object(body)) return BAD(e, "", "the request body must be a JSON object");
    json_t *messages = json_object_get(body, "messages");
    if (!json_is_array(messages) || json_array_size(messages) == 0)
        return BAD(e, "messages", "messages: must be a non-empty array");
    json_t *mt = json_object_get(body, "max_tokens");
    if (!count_only && !mt) return BAD(e, "max_tokens", "max_tokens: field required");
    if (mt && (!json_is_integer(mt) || json_integer_value(mt) < 1))
        return BAD(e, "max_tokens", "max_tokens: must be an integer >= 1");
    if (mt) q->sampling.max_tokens = json_integer_value(mt) > (1 << 24)
                                         ? (1 << 24) : (int32_t)json_integer_value(mt);
    json_t *st = json_object_get(body, "stream");
    if (st && !json_is_boolean(st)) return BAD(e, "stream", "stream: must be a boolean");
    x->stream = json_is_true(st);
    if (!(x->messages = json_array())) return agent_err(AGENT_ENOMEM, "out of memory");
    q->messages = x->messages;
    int rc = 0;
    json_t *sys = json_object_get(body, "system");
    if (sys) {
        srv_buf b = {0};
        rc = join_text(&b, sys, "system", false, notes, e);
        if (!rc && json_array_append_new(x->messages,
                                         json_pack("{s:s, s:o}", "role", "system", "content",
                                                   agent_json_text(b.p, b.len))))
            rc = agent_err(AGENT_ENOMEM, "out of memory");
        srv_buf_free(&b);
    }
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        if (rc) break;
        rc = convert_message(x->messages, m, i, notes, e);
    }
    json_t *tools = json_object_get(body, "tools");
    if (!rc && tools) rc = convert_tools(x, tools, notes, e);
    json_t *tc = json_object_get(body, "tool_choice");
    if (!rc && tc) rc = convert_tool_choice(x, tc, e);
    json_t *v = json_object_get(body, "temperature");
    if (!rc && v) {
        if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) > 1)
            rc = BAD(e, "temperature", "temperature: must be a number in [0, 1]");
        else
            q->sampling.temperature = (float)json_number_value(v);
    }
    v = json_object_get(body, "top_p");
    if (!rc && v) {
        if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) > 1)
            rc = BAD(e, "top_p", "top_p: must be a number in [0, 1]");
        else
            q->sampling.top_p = (float)json_number_value(v);
    }
    v = json_object_get(body, "top_k");
    if (!rc && v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1000000)
            rc = BAD(e, "top_k", "top_k: must be an integer in [0, 1000000]");
        else
            q->sampling.top_k = (int32_t)json_integer_value(v);
    }
    json_t *ss = json_object_get(body, "stop_sequences");
    if (!rc && ss) {
        json_t *s;
        size_t cap = sizeof q->sampling.stop / sizeof q->sampling.stop[0];
        if (!json_is_array(ss)) rc = BAD(e, "stop_sequences", "stop_sequences: must be an array");
        else if (json_array_size(ss) > cap)
            rc = BAD(e, "stop_sequences", "stop_sequences: at most %zu are supported", cap);
        json_array_foreach(ss, i, s) {
            if (rc) break;
            if (!json_is_string(s) || !json_string_length(s))
                rc = BAD(e, "stop_sequences", "stop_sequences.%zu: must be a non-empty string", i);
            else
                q->sampling.stop[q->sampling.n_stop++] = json_string_value(s);
        }
    }
    json_t *th = json_object_get(body, "thinking");
    const char *tht = json_string_value(json_object_get(th, "type"));
    if (!rc && tht) q->enable_thinking = !strcmp(tht, "enabled") ? 1 : 0;
    if (!rc && json_object_get(body, "mcp_servers"))
        rc = agent_dialect_note(notes, "%s are not supported and were ignored", "mcp_servers");
    return rc;
}

char *agent_anthropic_error_body(const agent_dialect_err *e) {
    return agent_json_dump(json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type",
                                     e->type, "message", e->message));
}

char *agent_anthropic_count_body(int64_t input_tokens) {
    return agent_json_dump(json_pack("{s:I}", "input_tokens", (json_int_t)input_tokens));
}

/* ----- the encoder ----- */

enum { BLK_NONE, BLK_TEXT, BLK_TOOL, BLK_THINKING };

struct agent_anthropic_enc {
    char id[48];
    char *model;
    bool stream, failed, any_tool;
    agent_sse_fn sink;
    void *user;
    int64_t prompt_tokens;
    int open;           /* BLK_*: the block being written */
    int open_tool;      /* its tool index */
    int n_blocks;       /* blocks started so far (the next block's index) */
    srv_buf cur;      /* the open block's text or arguments */
    srv_buf held;     /* streamed text bytes held back until their UTF-8 character completes */
    char *cur_id, *cur_name;
    json_t *content;    /* finished blocks (non-streaming answer) */
};

static int send_event(agent_anthropic_enc *e, const char *event, json_t *data) {
    if (!data) return agent_err(AGENT_ENOMEM, "out of memory");
    char *s = json_dumps(data, JSON_COMPACT);
    json_decref(data);
    if (!s) return agent_err(AGENT_ENOMEM, "out of memory");
    int rc = e->sink(e->user, event, s, strlen(s)) ? agent_err(AGENT_EINTERNAL, "client gone") : 0;
    free(s);
    if (rc) e->failed = true;
    return rc;
}

int agent_anthropic_enc_new(agent_anthropic_enc **out, const char *model, bool stream,
                            int64_t prompt_tokens, agent_sse_fn sink, void *user) {
    *out = NULL;
    if (stream && !sink) return agent_err(AGENT_EINVAL, "a streaming encoder needs a sink");
    agent_anthropic_enc *e = calloc(1, sizeof *e);
    if (!e) return agent_err(AGENT_ENOMEM, "out of memory");
    e->model = strdup(model ? model : "spark-agent");
    e->content = json_array();
    if (!e->model || !e->content) {
        agent_anthropic_enc_free(e);
        return agent_err(AGENT_ENOMEM, "out of memory");
    }
    srv_random_id(e->id, sizeof e->id, "msg_");
    e->stream = stream;
    e->sink = sink;
    e->user = user;
    e->prompt_tokens = prompt_tokens;
    if (stream) {
        int rc = send_event(e, "message_start",
                            json_pack("{s:s, s:{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:{s:I, s:i}}}",
                                      "type", "message_start", "message", "id", e->id, "type",
                                      "message", "role", "assistant", "model", e->model,
                                      "content", "stop_reason", "stop_sequence", "usage",
                                      "input_tokens", (json_int_t)prompt_tokens,
                                      "output_tokens", 0));
        if (!rc) rc = send_event(e, "ping", json_pack("{s:s}", "type", "ping"));
        if (rc) {
            agent_anthropic_enc_free(e);
            return rc;
        }
    }
    *out = e;
    return 0;
}

void agent_anthropic_enc_free(agent_anthropic_enc *e) {
    if (!e) return;
    free(e->model);
    free(e->cur_id);
    free(e->cur_name);
    srv_buf_free(&e->cur);
    srv_buf_free(&e->held);
    json_decref(e->content);
    free(e);
}

/* Close the open block: remember it for the final message, tell a streaming client. */
static int close_block(agent_anthropic_enc *e) {
    if (e->open == BLK_NONE) return 0;
    json_t *blk;
    int rc = 0;
    if (e->open == BLK_TEXT) {
        blk = json_pack("{s:s, s:o}", "type", "text", "text", agent_json_text(e->cur.p, e->cur.len));
    } else if (e->open == BLK_THINKING) {
        /* no signature: nothing here verifies one; clients send the block back as it is */
        blk = json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking",
                        agent_json_text(e->cur.p, e->cur.len), "signature", "");
        if (e->stream)
            rc = send_event(e, "content_block_delta",
                            json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta",
                                      "index", e->n_blocks - 1, "delta", "type", "signature_delta",
                                      "signature", ""));
    } else {
        json_error_t je;
        json_t *input = e->cur.len ? json_loadb(e->cur.p, e->cur.len, 0, &je) : json_object();
        /* The grammar makes the arguments an object; anything else is kept visible. */
        if (!json_is_object(input)) {
            json_decref(input);
            input = json_pack("{s:o}", "_arguments", agent_json_text(e->cur.p, e->cur.len));
        }
        blk = json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id",
                        e->cur_id ? e->cur_id : "", "name", e->cur_name ? e->cur_name : "",
                        "input", input);
    }
    if (!blk || json_array_append_new(e->content, blk)) return agent_err(AGENT_ENOMEM, "out of memory");
    if (e->stream && !rc)
        rc = send_event(e, "content_block_stop", json_pack("{s:s, s:i}", "type",
                                                           "content_block_stop", "index",
                                                           e->n_blocks - 1));
    e->open = BLK_NONE;
    e->cur.len = 0;
    free(e->cur_id);
    free(e->cur_name);
    e->cur_id = e->cur_name = NULL;
    return rc;
}

static int stream_text(agent_anthropic_enc *e, const char *s, size_t n) {
    if (!e->stream || !n) return 0;
    bool th = e->open == BLK_THINKING;
    return send_event(e, "content_block_delta",
                      json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta", "index",
                                e->n_blocks - 1, "delta", "type",
                                th ? "thinking_delta" : "text_delta", th ? "thinking" : "text",
                                agent_json_text(s, n)));
}

static int flush_held(agent_anthropic_enc *e);

/* Text into a text or thinking block (opened when another block is open). */
static int block_text(agent_anthropic_enc *e, int kind, const char *text, size_t len) {
    if (e->failed) return agent_err(AGENT_EINTERNAL, "the response already failed");
    if (!len) return 0;
    int rc = 0;
    if (e->open != kind) {
        if ((rc = flush_held(e)) || (rc = close_block(e))) return rc;
        e->open = kind;
        e->n_blocks++;
        const char *ty = kind == BLK_THINKING ? "thinking" : "text";
        if (e->stream &&
            (rc = send_event(e, "content_block_start",
                             json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_start",
                                       "index", e->n_blocks - 1, "content_block", "type", ty, ty,
                                       ""))))
            return rc;
    }
    size_t ok;
    if ((rc = agent_text_hold(&e->cur, &e->held, text, len, &ok))) return rc;
    rc = stream_text(e, e->held.p, ok);
    agent_text_release(&e->held, ok);
    return rc;
}

int agent_anthropic_enc_text(agent_anthropic_enc *e, const char *text, size_t len) {
    return block_text(e, BLK_TEXT, text, len);
}

int agent_anthropic_enc_thinking(agent_anthropic_enc *e, const char *text, size_t len) {
    return block_text(e, BLK_THINKING, text, len);
}

/* Flush text held back at a block boundary (only a text or thinking block holds any): an
 * incomplete character becomes U+FFFD. */
static int flush_held(agent_anthropic_enc *e) {
    int rc;
    if (!agent_text_flush_held(&e->cur, &e->held, &rc) || rc) return rc;
    return stream_text(e, "\xEF\xBF\xBD", 3);
}

int agent_anthropic_enc_tool(agent_anthropic_enc *e, int index, const char *id, const char *name,
                             const char *args, size_t len) {
    if (e->failed) return agent_err(AGENT_EINTERNAL, "the response already failed");
    int rc = 0;
    if (e->open != BLK_TOOL || e->open_tool != index) {
        if ((rc = flush_held(e)) || (rc = close_block(e))) return rc;
        e->open = BLK_TOOL;
        e->open_tool = index;
        e->any_tool = true;
        e->n_blocks++;
        char gen[48];
        if (!id) srv_random_id(gen, sizeof gen, "toolu_");
        e->cur_id = strdup(id ? id : gen);
        e->cur_name = strdup(name ? name : "");
        if (!e->cur_id || !e->cur_name) return agent_err(AGENT_ENOMEM, "out of memory");
        if (e->stream &&
            (rc = send_event(e, "content_block_start",
                             json_pack("{s:s, s:i, s:{s:s, s:s, s:s, s:{}}}", "type",
                                       "content_block_start", "index", e->n_blocks - 1,
                                       "content_block", "type", "tool_use", "id", e->cur_id,
                                       "name", e->cur_name, "input"))))
            return rc;
    }
    if (!len) return 0;
    if ((rc = srv_buf_add(&e->cur, args, len))) return rc;
    if (e->stream)
        rc = send_event(e, "content_block_delta",
                        json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta",
                                  "index", e->n_blocks - 1, "delta", "type", "input_json_delta",
                                  "partial_json", agent_json_text(args, len)));
    return rc;
}

static const char *stop_reason(const agent_anthropic_enc *e, const agent_dialect_done *d) {
    const char *f = d->finish ? d->finish : "stop";
    if (!strcmp(f, "length")) return "max_tokens";
    if (!strcmp(f, "tool_calls") || e->any_tool) return "tool_use";
    if (d->stop_sequence) return "stop_sequence";
    return "end_turn";
}

int agent_anthropic_enc_done(agent_anthropic_enc *e, const agent_dialect_done *d, char **body) {
    *body = NULL;
    if (e->failed) return agent_err(AGENT_EINTERNAL, "the response already failed");
    int rc = flush_held(e);
    if (!rc) rc = close_block(e);
    if (rc) return rc;
    const agent_dialect_usage *u = &d->usage;
    int64_t cached = u->cached_tokens < u->prompt_tokens ? u->cached_tokens : u->prompt_tokens;
    json_t *usage = json_pack("{s:I, s:I, s:i, s:I}", "input_tokens",
                              (json_int_t)(u->prompt_tokens - cached), "output_tokens",
                              (json_int_t)u->completion_tokens, "cache_creation_input_tokens", 0,
                              "cache_read_input_tokens", (json_int_t)cached);
    json_t *seq = d->stop_sequence && !e->any_tool && strcmp(d->finish ? d->finish : "", "length")
                      ? json_string(d->stop_sequence) : json_null();
    if (!usage || !seq) {
        json_decref(usage);
        json_decref(seq);
        return agent_err(AGENT_ENOMEM, "out of memory");
    }
    if (e->stream) {
        rc = send_event(e, "message_delta",
                        json_pack("{s:s, s:{s:s, s:o}, s:o}", "type", "message_delta", "delta",
                                  "stop_reason", stop_reason(e, d), "stop_sequence", seq,
                                  "usage", usage));
        if (!rc) rc = send_event(e, "message_stop", json_pack("{s:s}", "type", "message_stop"));
        return rc;
    }
    json_t *msg = json_pack("{s:s, s:s, s:s, s:s, s:O, s:s, s:o, s:o}", "id", e->id, "type",
                            "message", "role", "assistant", "model", e->model, "content",
                            e->content, "stop_reason", stop_reason(e, d), "stop_sequence", seq,
                            "usage", usage);
    *body = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
    json_decref(msg);
    return *body ? 0 : agent_err(AGENT_ENOMEM, "out of memory");
}

int agent_anthropic_enc_fail(agent_anthropic_enc *e, const agent_dialect_err *err) {
    if (e->failed || !e->stream) return 0;
    int rc = send_event(e, "error", json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error",
                                              "type", err->type, "message", err->message));
    e->failed = true;
    return rc;
}

/* ----- routes ----- */

static const char *anthropic_type(int status) {
    switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

/* e with the Anthropic error type of its status when it names none. */
static agent_dialect_err typed(const agent_dialect_err *e) {
    agent_dialect_err t = *e;
    if (!t.type[0]) snprintf(t.type, sizeof t.type, "%s", anthropic_type(t.status));
    return t;
}

static char *error_body(const agent_dialect_err *e) {
    agent_dialect_err t = typed(e);
    return agent_anthropic_error_body(&t);
}

static int anth_start(agent_dialect_run *run, void *ctx) {
    agent_chat_ctx *c = ctx;
    agent_anthropic_enc *enc = NULL;
    int rc = agent_anthropic_enc_new(&enc, c->model, c->x.stream, 0, agent_dialect_sse, run);
    c->enc = enc;
    return rc;
}

static int anth_text(void *ctx, const char *text, size_t len) {
    return agent_anthropic_enc_text(((agent_chat_ctx *)ctx)->enc, text, len);
}

static int anth_tool(void *ctx, const srv_event *ev) {
    const char *args;
    size_t len;
    if (!agent_dialect_tool_piece(ev, &args, &len)) return 0;
    return agent_anthropic_enc_tool(((agent_chat_ctx *)ctx)->enc, ev->tool_index, ev->tool_id,
                                    ev->tool_name, args, len);
}

static int anth_thinking(void *ctx, const char *text, size_t len) {
    return agent_anthropic_enc_thinking(((agent_chat_ctx *)ctx)->enc, text, len);
}

static int anth_done(void *ctx, const srv_event *ev, char **body) {
    agent_dialect_done d = agent_dialect_done_of(ev);
    return agent_anthropic_enc_done(((agent_chat_ctx *)ctx)->enc, &d, body);
}

static int anth_fail(void *ctx, const agent_dialect_err *e) {
    agent_dialect_err t = typed(e);
    return agent_anthropic_enc_fail(((agent_chat_ctx *)ctx)->enc, &t);
}

static void anth_free(void *ctx) {
    agent_chat_ctx *c = ctx;
    if (c) agent_anthropic_enc_free(c->enc);
    agent_chat_ctx_free(c);
}

static const agent_dialect_ops anth_ops = {anth_start, anth_text, anth_tool, anth_done,
                                           anth_fail, error_body, anth_free, anth_thinking};

static int messages_to_chat(const json_t *body, int default_max_tokens, agent_chat_xlat *x,
                            json_t *notes, agent_dialect_err *e) {
    return agent_anthropic_to_chat(body, false, default_max_tokens, x, notes, e);
}

static int route_messages(srv_req *r) {
    return agent_dialect_chat_route(r, "/v1/messages", messages_to_chat, &anth_ops);
}

static int route_count_tokens(srv_req *r) {
    srv *s = srv_req_server(r);
    agent_dialect_err e = {0};
    agent_chat_xlat x;
    int rc = agent_anthropic_to_chat(srv_req_json(r), true, srv_limits_get(s)->max_tokens_default,
                                     &x, NULL, &e);
    if (rc) {
        agent_chat_xlat_clear(&x);
        return rc == AGENT_EINVAL ? agent_dialect_reply_error(r, &e, error_body) : rc;
    }
    int32_t n = 0;
    int status = 400;
    rc = srv_chat_count_tokens(s, &x.req, &n, &status);
    agent_chat_xlat_clear(&x);
    if (rc) {
        agent_dialect_fail(&e, status, "", NULL, "%s", agent_error_last());
        return agent_dialect_reply_error(r, &e, error_body);
    }
    char *out = agent_anthropic_count_body(n);
    if (!out) return agent_err(AGENT_ENOMEM, "out of memory");
    rc = srv_reply_raw(r, 200, "application/json", out, strlen(out));
    free(out);
    return rc;
}

int srv_anthropic_init(srv *s) {
    int rc = srv_route_add(s, "POST", "/v1/messages", route_messages, SRV_ROUTE_JSON);
    if (!rc) rc = srv_route_add(s, "POST", "/v1/messages/count_tokens", route_count_tokens,
                                SRV_ROUTE_JSON);
    return rc;
}
