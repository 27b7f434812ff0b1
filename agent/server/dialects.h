/*
 * dialects.h - private to agent/server/: the HTTP dialects other than OpenAI's chat API
 * (anthropic.c: Anthropic Messages; responses.c: OpenAI Responses; infill.c: llama.cpp /infill
 * and the fill-in-the-middle prompt shared with the JSON-RPC completion) and the small JSON
 * helpers they share with rpc*.c (rpc_json.c).
 *
 * Each dialect is two pure translators around the server's chat service:
 *  - a request translator: the dialect's JSON body -> an OpenAI /v1/chat/completions body (the
 *    chat service's input: messages, tools, tool_choice, response_format, max_tokens,
 *    temperature, top_p, seed, stop, parallel_tool_calls) or, for /infill, a FIM request;
 *    (both as server_int.h's srv_chat_req / srv_complete_req);
 *  - an encoder: the chat service's events (text deltas, tool-call deltas, done with usage) ->
 *    the dialect's response: server-sent events while streaming, one JSON body otherwise.
 * Nothing here touches a socket or the engine's scheduler; the route handlers glue them.
 * Bad input is reported in the dialect's own error shape (agent_dialect_err + *_error_body).
 * Thread-safety: every object is used by one thread at a time; no shared state.
 */
#ifndef SPARK_AGENT_SERVER_DIALECTS_H
#define SPARK_AGENT_SERVER_DIALECTS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server_int.h"

/* The init functions of part B's front ends (rows in routes.c). */
int srv_anthropic_init(srv *s); /* POST /v1/messages, /v1/messages/count_tokens */
int srv_responses_init(srv *s); /* POST /v1/responses */
int srv_infill_init(srv *s);    /* POST /infill */
int srv_rpc_init(srv *s);       /* the WebSocket JSON-RPC handler (rpc.c) */

/* ----- shared helpers (rpc_json.c) -------------------------------------------------------- */

/* A request the dialect refuses: HTTP status, the dialect's error type, the offending field
 * (may be empty) and a sentence for people. */
typedef struct {
    int status;
    char type[48];
    char param[96];
    char message[512];
} agent_dialect_err;

/* Fill e and return AGENT_EINVAL. type NULL: "invalid_request_error"; "": the dialect's type
 * for the status (its error_body picks it). */
int agent_dialect_fail(agent_dialect_err *e, int status, const char *type, const char *param,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* A JSON string of s[0..n) (NULL s: ""), invalid UTF-8 replaced by U+FFFD (NUL bytes kept).
 * NULL only when out of memory. */
json_t *agent_json_text(const char *s, size_t n);

/* The compact JSON text of j, which it takes (NULL j, or out of memory: NULL; caller frees). */
char *agent_json_dump(json_t *j);

/* Append a formatted note to the JSON array notes (NULL: nothing). 0 or AGENT_ENOMEM. */
int agent_dialect_note(json_t *notes, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Length of the longest prefix of s[0..n) that does not end inside a UTF-8 sequence (the rest
 * is held back by streaming encoders until it completes). */
size_t agent_utf8_complete_len(const char *s, size_t n);

/* A streaming encoder's open text block: text goes into cur (the whole block) and held (what
 * is not streamed yet); *ready is how many bytes at held->p are whole characters to send now,
 * after which agent_text_release(held, *ready) drops them. 0 or AGENT_ENOMEM. */
int agent_text_hold(srv_buf *cur, srv_buf *held, const char *text, size_t len, size_t *ready);
void agent_text_release(srv_buf *held, size_t n);
/* At the block's end with bytes still held (an incomplete character): drop them and end cur
 * with U+FFFD instead of its incomplete character (jansson refuses invalid UTF-8). Returns
 * true when the caller must stream U+FFFD ("\xEF\xBF\xBD", *rc 0) or *rc is AGENT_ENOMEM;
 * false when nothing was held. */
bool agent_text_flush_held(srv_buf *cur, srv_buf *held, int *rc);

/* Usage of a finished generation. cached <= prompt; reasoning (the leading think block's
 * tokens) <= completion. */
typedef struct {
    int64_t prompt_tokens;
    int64_t completion_tokens;
    int64_t cached_tokens;
    int64_t reasoning_tokens;
} agent_dialect_usage;

/* The end of a chat generation, as the chat service reports it. finish is OpenAI's
 * finish_reason: "stop", "length" or "tool_calls"; stop_sequence the stop string that ended
 * it (NULL: none / end of turn). */
typedef struct {
    const char *finish;
    const char *stop_sequence;
    agent_dialect_usage usage;
} agent_dialect_done;

/* The dialects' view of the chat service's DONE event. */
agent_dialect_done agent_dialect_done_of(const srv_event *ev);

/* A request translated for the chat service. req.messages / req.tools point to the owned
 * JSON below, req.tool_name and req.sampling.stop into `hold` or the request body: keep the
 * body alive until srv_chat_submit returns. */
typedef struct {
    srv_chat_req req;
    json_t *messages; /* OpenAI-style messages (owned) */
    json_t *tools;    /* OpenAI tool array (owned) or NULL */
    json_t *hold;     /* other owned values the request points into */
    json_t *echo;     /* Responses: request fields the response repeats (owned) or NULL */
    bool stream;
} agent_chat_xlat;

void agent_chat_xlat_clear(agent_chat_xlat *x);

/* Clear x and set the chat request's defaults: thinking as the template says, parallel tool
 * calls, SRV_SAMPLING_INIT with max_tokens default_max_tokens. */
void agent_chat_xlat_init(agent_chat_xlat *x, int default_max_tokens);

/* Append an OpenAI function tool {"type":"function","function":{name, parameters,
 * description}} to the array out: params (borrowed) NULL gives an empty object schema,
 * description (borrowed) is copied when it is a string. 0 or AGENT_ENOMEM. */
int agent_chat_add_function(json_t *out, const char *name, json_t *params,
                            const json_t *description);

/* x takes the tool array (the request's tools) when it is not empty; else it is freed. */
void agent_chat_xlat_set_tools(agent_chat_xlat *x, json_t *tools);

/* Where a streaming encoder writes one server-sent event: event is the "event:" field (NULL:
 * none), data the JSON text. Returns 0, or non-zero to make the encoder fail with
 * AGENT_EINTERNAL (the client went away). */
typedef int (*agent_sse_fn)(void *user, const char *event, const char *data, size_t len);

/* ----- running a dialect request on the chat service (rpc_json.c) -------------------------
 * The route handlers of anthropic.c, responses.c and infill.c share this: submit, hold the
 * request, create the encoder at the first event (so a request that fails before producing
 * anything gets a plain error status), feed it the events, end the response. */
typedef struct agent_dialect_run agent_dialect_run;

typedef struct {
    /* Create the encoder; stream: its events go through agent_dialect_sse(run, ...). */
    int (*start)(agent_dialect_run *run, void *ctx);
    /* Text; returns 0, 1 to end the response normally here (the generation is cancelled),
     * or a negative error. */
    int (*text)(void *ctx, const char *text, size_t len);
    /* A tool call: SRV_EV_TOOL_DELTA pieces (streaming) and the SRV_EV_TOOL_CALL that ends
     * it (ev->tool_error NULL, or set with ev->tool_begun: the call stays as streamed).
     * Returns like text. May be NULL for dialects without tools. */
    int (*tool)(void *ctx, const srv_event *ev);
    int (*done)(void *ctx, const srv_event *ev, char **body);
    int (*fail)(void *ctx, const agent_dialect_err *e);
    char *(*error_body)(const agent_dialect_err *e);
    void (*free)(void *ctx);
    /* Reasoning text (a leading <think> block). Returns like text. NULL: not shown. */
    int (*reasoning)(void *ctx, const char *text, size_t len);
} agent_dialect_ops;

/* Submit x (chat) or cq (raw completion; exactly one of them non-NULL) for request r with
 * the dialect's ops and ctx (owned from here on: ops->free runs at the request's end, also
 * when this fails). Answers r itself in every case; returns 0 (or a negative code for the
 * core's 500 when even that failed). */
int agent_dialect_submit(srv_req *r, const srv_chat_req *x, const srv_complete_req *cq,
                         bool stream, const agent_dialect_ops *ops, void *ctx);
/* The SSE sink for encoders (user = the run): starts the event stream on first use. */
int agent_dialect_sse(void *user, const char *event, const char *data, size_t len);
/* Answer a refused request with the dialect's error body. */
int agent_dialect_reply_error(srv_req *r, const agent_dialect_err *e,
                              char *(*error_body)(const agent_dialect_err *e));
/* OpenAI finish_reason of a chat service finish ("stop", "length", "tool_calls"; time counts
 * as length). */
const char *agent_dialect_finish(srv_finish f);
/* Log the notes a translation left (info level), one line per note, naming the route. */
void agent_dialect_log_notes(const char *route, const json_t *notes);

/* ----- a chat dialect's route (rpc_json.c): Anthropic Messages and OpenAI Responses -------
 * Both translate the body for the chat service and answer through one encoder; they share
 * the request's context, the tool-event rule and the route handler itself. */
typedef struct {
    char *model;       /* the body's "model", else the server's model name */
    agent_chat_xlat x; /* the translated request */
    void *enc;         /* the dialect's encoder (ops->start makes it, ops->free frees it) */
} agent_chat_ctx;

/* Free c's translation, model and c itself (not c->enc). NULL: nothing. */
void agent_chat_ctx_free(agent_chat_ctx *c);

/* The piece of tool call ev to give the encoder: a SRV_EV_TOOL_DELTA's text, or the arguments
 * ("{}" when none) of the SRV_EV_TOOL_CALL that ends the call, past what was streamed. false:
 * nothing to give (a streamed call that failed or is complete stays as it went). */
bool agent_dialect_tool_piece(const srv_event *ev, const char **args, size_t *len);

/* agent_anthropic_to_chat / agent_responses_to_chat for a route. */
typedef int (*agent_chat_to_fn)(const json_t *body, int default_max_tokens, agent_chat_xlat *x,
                                json_t *notes, agent_dialect_err *e);

/* The route handler: refuses while the server drains (503), translates the body with to_chat
 * (its notes logged naming route; a bad request answered with ops->error_body), names the
 * model, streams tool arguments when the request streams, and submits a fresh agent_chat_ctx
 * with ops (ops->free frees it, whatever happens). */
int agent_dialect_chat_route(srv_req *r, const char *route, agent_chat_to_fn to_chat,
                             const agent_dialect_ops *ops);

/* ----- Anthropic Messages (anthropic.c): POST /v1/messages, /v1/messages/count_tokens ------- */

/* Translate a Messages request body (borrowed; must outlive the submit) for the chat service
 * (x is cleared first; agent_chat_xlat_clear frees it, also after an error). For count_tokens
 * (count_only) max_tokens is not required. default_max_tokens: srv_limits.max_tokens_default.
 * notes (may be NULL) receives strings about parts that were accepted but ignored (server
 * tools, unsupported options). Errors: AGENT_EINVAL with e filled (Anthropic error types:
 * invalid_request_error, ...), AGENT_ENOMEM. */
int agent_anthropic_to_chat(const json_t *body, bool count_only, int default_max_tokens,
                            agent_chat_xlat *x, json_t *notes, agent_dialect_err *e);

/* {"type":"error","error":{"type":...,"message":...}} (caller frees). */
char *agent_anthropic_error_body(const agent_dialect_err *e);

/* The count_tokens answer {"input_tokens": n} (caller frees). */
char *agent_anthropic_count_body(int64_t input_tokens);

typedef struct agent_anthropic_enc agent_anthropic_enc;

/* An encoder for one response. model is echoed; stream: events go to sink as they happen
 * (message_start ... message_stop), else nothing is sent and agent_anthropic_enc_done returns
 * the whole message. prompt_tokens: the rendered prompt's length (message_start's usage). */
int agent_anthropic_enc_new(agent_anthropic_enc **out, const char *model, bool stream,
                            int64_t prompt_tokens, agent_sse_fn sink, void *user);
void agent_anthropic_enc_free(agent_anthropic_enc *e);
/* A piece of assistant text (any split, also inside a UTF-8 character). */
int agent_anthropic_enc_text(agent_anthropic_enc *e, const char *text, size_t len);
/* A piece of the model's reasoning: a "thinking" content block (thinking_delta events). */
int agent_anthropic_enc_thinking(agent_anthropic_enc *e, const char *text, size_t len);
/* A piece of tool call `index` (0, 1, ... in order): id and name with its first piece (NULL
 * afterwards), args a piece of its arguments' JSON text. */
int agent_anthropic_enc_tool(agent_anthropic_enc *e, int index, const char *id, const char *name,
                             const char *args, size_t len);
/* The end. Non-streaming: *body (caller frees) is the message JSON; streaming: NULL after
 * message_delta and message_stop were sent. */
int agent_anthropic_enc_done(agent_anthropic_enc *e, const agent_dialect_done *d, char **body);
/* A failure after the response started (streaming: an "error" event). */
int agent_anthropic_enc_fail(agent_anthropic_enc *e, const agent_dialect_err *err);

/* ----- OpenAI Responses (responses.c): POST /v1/responses --------------------------------- */

/* Translate a Responses request (input items, instructions, function tools; built-in tool
 * types are ignored with a note). x->echo holds the request fields a response repeats
 * (instructions, tools, tool_choice, ...). Otherwise as agent_anthropic_to_chat, with OpenAI
 * error types (invalid_request_error). */
int agent_responses_to_chat(const json_t *body, int default_max_tokens, agent_chat_xlat *x,
                            json_t *notes, agent_dialect_err *e);

/* {"error":{"message","type","param","code"}} (caller frees). */
char *agent_responses_error_body(const agent_dialect_err *e);

typedef struct agent_responses_enc agent_responses_enc;

/* echo: from agent_responses_to_chat (borrowed; NULL allowed). Streaming sends
 * response.created and response.in_progress at once. */
int agent_responses_enc_new(agent_responses_enc **out, const char *model, const json_t *echo,
                            bool stream, agent_sse_fn sink, void *user);
void agent_responses_enc_free(agent_responses_enc *e);
int agent_responses_enc_text(agent_responses_enc *e, const char *text, size_t len);
/* A piece of the model's reasoning: a "reasoning" output item with reasoning_text content
 * (response.reasoning_text.delta events). */
int agent_responses_enc_reasoning(agent_responses_enc *e, const char *text, size_t len);
int agent_responses_enc_tool(agent_responses_enc *e, int index, const char *id, const char *name,
                             const char *args, size_t len);
int agent_responses_enc_done(agent_responses_enc *e, const agent_dialect_done *d, char **body);
/* Streaming: response.failed. Non-streaming callers send the error body instead. */
int agent_responses_enc_fail(agent_responses_enc *e, const agent_dialect_err *err);

/* ----- llama.cpp /infill (infill.c) ------------------------------------------------------- */

/* An /infill request mapped to the raw-completion entry. The FIM layout (repository header,
 * file separators, <|fim_prefix|> ... <|fim_middle|>) is the chat service's. */
typedef struct {
    srv_complete_req req;   /* prompt = input_prefix, middle = prompt, suffix, extra
                             * chunks, sampling, time budget (strings in the body) */
    srv_chunk *extra;       /* owned: req.extra (strings point into the body) */
    int64_t n_indent;       /* 0: off */
    bool stream;
    const json_t *response_fields; /* array of strings or NULL (borrowed from the body) */
} agent_infill_req;

/* Parse an /infill body (borrowed; must outlive the submit). default_max_tokens for
 * n_predict < 0. Errors: AGENT_EINVAL with e (llama.cpp's error shape), AGENT_ENOMEM. r is
 * cleared first; agent_infill_req_clear frees it (also after an error). */
int agent_infill_parse(const json_t *body, int default_max_tokens, agent_infill_req *r,
                       agent_dialect_err *e);
void agent_infill_req_clear(agent_infill_req *r);

/* {"error":{"code":status,"message","type"}} (caller frees). */
char *agent_infill_error_body(const agent_dialect_err *e);

typedef struct agent_infill_enc agent_infill_enc;

/* Figures for the final answer. */
typedef struct {
    int64_t prompt_tokens, cached_tokens, predicted_tokens;
    double prompt_ms, predicted_ms;
    const char *stop_type;     /* "eos", "limit", "word", "time" */
    const char *stopping_word; /* NULL: "" */
    bool truncated;            /* the prompt was cut to fit */
} agent_infill_stats;

int agent_infill_enc_new(agent_infill_enc **out, const agent_infill_req *r, const char *model,
                         agent_sse_fn sink, void *user);
void agent_infill_enc_free(agent_infill_enc *e);
/* Generated text. Returns 1 when n_indent says the completion is over (the caller cancels the
 * generation and calls _done with stop_type "eos"), 0 to go on, < 0 on error. */
int agent_infill_enc_text(agent_infill_enc *e, const char *text, size_t len);
/* Final answer (non-streaming body, or the last "data:" chunk with stop: true). */
int agent_infill_enc_done(agent_infill_enc *e, const agent_infill_stats *st, char **body);
/* Streaming: the error object as the last data line. */
int agent_infill_enc_fail(agent_infill_enc *e, const agent_dialect_err *err);

#endif
