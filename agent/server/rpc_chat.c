/* chat/completion: an OpenAI chat body, streamed as chat/delta notifications, answered with the
 * complete message (docs/protocol.md §6). */
#include "rpc_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    json_t *body;       /* the params (a copy: the request's JSON dies with its message) */
    srv_chat_req req;
    srv_buf content;
    srv_buf held;       /* streamed text held back until its UTF-8 character completes */
    json_t *calls;      /* complete tool calls, OpenAI shape */
    bool reasoning;     /* a reasoning block was streamed */
    int open_call;      /* the tool call the last piece belonged to (-1: none) */
    srv_buf reasoning_text;
} chat;

static void chat_free(void *state) {
    chat *q = state;
    if (!q) return;
    json_decref(q->body);
    json_decref(q->calls);
    srv_buf_free(&q->content);
    srv_buf_free(&q->held);
    srv_buf_free(&q->reasoning_text);
    free(q);
}

static void delta(agent_rpc_call *call, const char *key, json_t *value) {
    json_t *p = json_pack("{s:O}", "id", call->id);
    if (!p || !value) {
        json_decref(p);
        json_decref(value);
        return;
    }
    json_object_set_new(p, key, value);
    agent_rpc_notify(call->conn, "chat/delta", p);
}

/* Stream the complete UTF-8 part of held text. */
static void flush_text(agent_rpc_call *call, chat *q, const char *key, bool all) {
    size_t n = all ? q->held.len : agent_utf8_complete_len(q->held.p ? q->held.p : "",
                                                           q->held.len);
    if (!n) return;
    delta(call, key, agent_json_text(q->held.p, n));
    memmove(q->held.p, q->held.p + n, q->held.len - n);
    q->held.len -= n;
}

static json_t *message(chat *q) {
    json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content",
                          agent_json_text(q->content.p, q->content.len));
    if (m && json_array_size(q->calls)) json_object_set(m, "tool_calls", q->calls);
    if (m && q->reasoning_text.len)
        json_object_set_new(m, "reasoning_content",
                            agent_json_text(q->reasoning_text.p, q->reasoning_text.len));
    return m;
}

static void wake(srv_job *j, void *user) {
    agent_rpc_call *call = user;
    chat *q = call->state;
    agent_rpc_conn *c = call->conn;
    srv_event ev;
    while (srv_job_next(j, &ev) == 1) {
        switch (ev.type) {
        case SRV_EV_REASONING:
            if (!srv_buf_add(&q->reasoning_text, ev.text, ev.len) &&
                !srv_buf_add(&q->held, ev.text, ev.len)) {
                q->reasoning = true;
                flush_text(call, q, "reasoning", false);
            }
            break;
        case SRV_EV_TEXT:
            if (q->reasoning) {
                flush_text(call, q, "reasoning", true);
                q->reasoning = false;
            }
            if (!srv_buf_add(&q->content, ev.text, ev.len) &&
                !srv_buf_add(&q->held, ev.text, ev.len))
                flush_text(call, q, "content", false);
            break;
        case SRV_EV_TOOL_DELTA: {
            /* a piece of a call being written: id and name with its first piece */
            flush_text(call, q, q->reasoning ? "reasoning" : "content", true);
            q->reasoning = false;
            bool first = ev.tool_index != q->open_call;
            q->open_call = ev.tool_index;
            json_t *tc = json_pack("{s:i, s:s%}", "index", ev.tool_index, "arguments", ev.text,
                                   ev.len);
            if (tc && first) {
                json_object_set_new(tc, "id", json_string(ev.tool_id));
                json_object_set_new(tc, "name", json_string(ev.tool_name));
            }
            delta(call, "toolCall", tc);
            break;
        }
        case SRV_EV_TOOL_CALL:
            flush_text(call, q, q->reasoning ? "reasoning" : "content", true);
            q->reasoning = false;
            if (ev.tool_begun) {
                /* streamed: the rest of its arguments; an invalid or cut-off one is not a
                 * call of the final message (its markup is kept as content there) */
                size_t al = strlen(ev.tool_args);
                if (ev.tool_error) {
                    srv_buf_add(&q->content, ev.text, ev.len);
                    break;
                }
                if (al > ev.tool_streamed)
                    delta(call, "toolCall",
                          json_pack("{s:i, s:s%}", "index", ev.tool_index, "arguments",
                                    ev.tool_args + ev.tool_streamed, al - ev.tool_streamed));
                json_array_append_new(q->calls,
                                      json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", ev.tool_id,
                                                "type", "function", "function", "name",
                                                ev.tool_name, "arguments", ev.tool_args));
                break;
            }
            if (ev.tool_error) {
                /* complete markup that is not a valid call: content, never a call */
                if (!srv_buf_add(&q->content, ev.text, ev.len))
                    delta(call, "content", agent_json_text(ev.text, ev.len));
                break;
            }
            json_array_append_new(q->calls,
                                  json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", ev.tool_id, "type",
                                            "function", "function", "name", ev.tool_name,
                                            "arguments", ev.tool_args ? ev.tool_args : "{}"));
            delta(call, "toolCall",
                  json_pack("{s:i, s:s, s:s, s:s}", "index", ev.tool_index, "id", ev.tool_id,
                            "name", ev.tool_name, "arguments",
                            ev.tool_args ? ev.tool_args : "{}"));
            break;
        case SRV_EV_DONE: {
            flush_text(call, q, q->reasoning ? "reasoning" : "content", true);
            agent_rpc_progress(call, "end", NULL, NULL, -1);
            const srv_usage *u = &ev.usage;
            double ms = u->total_ms - u->ttft_ms;
            if (ev.finish == SRV_FINISH_CANCELED || call->cancelled) {
                agent_rpc_reply_error(c, call->id, RPC_REQUEST_CANCELLED,
                                      json_pack("{s:o}", "message", message(q)),
                                      "request cancelled");
            } else if (ev.finish == SRV_FINISH_ERROR) {
                agent_rpc_reply_error(c, call->id, ev.status == 400 ? RPC_CONTEXT_TOO_LONG
                                                                    : RPC_INTERNAL_ERROR,
                                      NULL, "%s", ev.error ? ev.error : "generation failed");
            } else {
                json_t *res =
                    json_pack("{s:o, s:s, s:{s:i, s:i, s:i, s:f, s:f}}", "message", message(q),
                              "finishReason", agent_dialect_finish(ev.finish), "usage",
                              "promptTokens", u->prompt_tokens, "completionTokens",
                              u->completion_tokens, "cachedTokens", u->cached_tokens, "ttftMs",
                              u->ttft_ms, "tokensPerSecond",
                              ms > 0 && u->completion_tokens > 1
                                  ? (u->completion_tokens - 1) * 1000.0 / ms : 0.0);
                /* the stop string that ended the generation (absent otherwise) */
                if (res && ev.stop_sequence)
                    json_object_set_new(res, "stopSequence", json_string(ev.stop_sequence));
                agent_rpc_reply(c, call->id, res);
            }
            agent_rpc_call_end(call);
            return;
        }
        }
    }
}

void agent_rpc_chat(agent_rpc_conn *c, const json_t *id, const json_t *params) {
    chat *q = calloc(1, sizeof *q);
    if (!q || !(q->body = json_deep_copy(params ? params : json_object())) ||
        !(q->calls = json_array())) {
        chat_free(q);
        agent_rpc_reply_error(c, id, RPC_INTERNAL_ERROR, NULL, "out of memory");
        return;
    }
    char msg[256] = "";
    const char *param = NULL;
    if (srv_openai_chat_parse(q->body, &q->req, srv_limits_get(c->s), msg, &param)) {
        agent_rpc_reply_error(c, id, RPC_INVALID_PARAMS,
                              param ? json_pack("{s:s}", "field", param) : NULL, "%s", msg);
        chat_free(q);
        return;
    }
    q->req.stream_tool_args = true;
    q->open_call = -1;
    agent_rpc_call *call = agent_rpc_call_new(c, id, params);
    if (!call) {
        chat_free(q);
        agent_rpc_reply_error(c, id, RPC_INTERNAL_ERROR, NULL, "out of memory");
        return;
    }
    call->state = q;
    call->free_state = chat_free;
    agent_rpc_progress(call, "begin", "chat", NULL, -1);
    int status = 400;
    if (srv_chat_submit(c->s, &q->req, wake, call, &call->job, &status)) {
        int code = status == 429 || status == 503 ? RPC_BUSY
                   : status >= 500 ? RPC_INTERNAL_ERROR
                   : status == 413 ? RPC_CONTEXT_TOO_LONG : RPC_INVALID_PARAMS;
        agent_rpc_progress(call, "end", NULL, NULL, -1);
        agent_rpc_reply_error(c, id, code, NULL, "%s", agent_error_last());
        agent_rpc_call_end(call);
    }
}
