/*
 * server_int.h - private to agent/server/: the interface shared by the server core (server.c,
 * part A), the OpenAI routes (openai.c), the chat service (chat.c), metrics (metrics.c) and the
 * other front ends (JSON-RPC rpc*.c, anthropic.c, responses.c, infill.c: part B).
 *
 * Threads. Everything here runs on the ONE service thread (the libwebsockets event loop)
 * unless a function says "any thread". Engine callbacks arrive on the scheduler thread; the
 * chat service copies them into its job and wakes the service thread (lws_cancel_service),
 * which then calls the job's wake function: front ends never see the scheduler thread.
 * Other threads (an agent run's worker) reach the loop with srv_post() / srv_conn_post().
 *
 * Errors. Functions return 0 or a negative AGENT_E* code with agent_error_last() set, like the
 * rest of agent/. Nothing here prints: diagnostics go through engine_log().
 *
 * Life of an HTTP request. The core reads the request line and headers, checks Host, Origin
 * and the token (Authorization: Bearer, or x-api-key), the body size (Content-Length required
 * for bodies) and, for a JSON body, parses it with the JSON depth limit; then it calls the
 * route's handler with a srv_req. A handler either answers at once (srv_reply_*), or keeps
 * the request (srv_req_hold) and answers later: a complete response (srv_reply_*) or a stream
 * (srv_stream_start, srv_sse_*, srv_stream_end). Output is buffered in the request and written
 * when the socket is writable; a client that does not read (more than
 * srv_limits.max_pending_out bytes queued) is dropped. When the client goes away, the server
 * stops or the response has been written, the hold's cleanup runs exactly once: it must
 * cancel and release the request's jobs. After cleanup the srv_req is gone.
 *
 * Life of a WebSocket connection. Path /rpc, subprotocol "spark-agent.jsonrpc.v1" (a client
 * that offers none is accepted too). The token comes in the Authorization header or as an
 * offered subprotocol "spark-agent.token.<token>" (never selected, never echoed); missing or
 * wrong: HTTP 401 before the upgrade. The front end registered with srv_ws_handler_set gets
 * open / message (one whole text message, reassembled, at most max_ws_message bytes, JSON
 * depth not checked: the handler parses with srv_json_parse) / close. Binary frames close the
 * connection with 1003, oversized messages with 1009.
 */
#ifndef SPARK_AGENT_SERVER_INT_H
#define SPARK_AGENT_SERVER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "../agent_int.h"

/* Every function of the server is exported from libagent under the module's prefix: the code
 * says srv_x, the linker sees agent_srv_x (like zlib's Z_PREFIX). A front end adds its own
 * cross-file functions here too. */
#define srv_at_free agent_srv_at_free
#define srv_buf_add agent_srv_buf_add
#define srv_buf_free agent_srv_buf_free
#define srv_buf_printf agent_srv_buf_printf
#define srv_chat_active agent_srv_chat_active
#define srv_chat_cancel_all agent_srv_chat_cancel_all
#define srv_chat_count_tokens agent_srv_chat_count_tokens
#define srv_chat_free agent_srv_chat_free
#define srv_chat_new agent_srv_chat_new
#define srv_chat_of agent_srv_chat_of
#define srv_chat_sched agent_srv_chat_sched
#define srv_chat_service agent_srv_chat_service
#define srv_chat_submit agent_srv_chat_submit
#define srv_complete_submit agent_srv_complete_submit
#define srv_conn_close agent_srv_conn_close
#define srv_conn_find agent_srv_conn_find
#define srv_conn_id agent_srv_conn_id
#define srv_conn_peer agent_srv_conn_peer
#define srv_conn_post agent_srv_conn_post
#define srv_conn_server agent_srv_conn_server
#define srv_draining agent_srv_draining
#define srv_finish_name agent_srv_finish_name
#define srv_http_connections agent_srv_http_connections
#define srv_job_cancel agent_srv_job_cancel
#define srv_job_next agent_srv_job_next
#define srv_job_release agent_srv_job_release
#define srv_json_parse agent_srv_json_parse
#define srv_limits_get agent_srv_limits_get
#define srv_metrics_free agent_srv_metrics_free
#define srv_metrics_init agent_srv_metrics_init
#define srv_metrics_job agent_srv_metrics_job
#define srv_metrics_new agent_srv_metrics_new
#define srv_metrics_of agent_srv_metrics_of
#define srv_metrics_request agent_srv_metrics_request
#define srv_metrics_token_gaps agent_srv_metrics_token_gaps
#define srv_model agent_srv_model
#define srv_model_name agent_srv_model_name
#define srv_modules_init agent_srv_modules_init
#define srv_now_ms agent_srv_now_ms
#define srv_openai_chat_parse agent_srv_openai_chat_parse
#define srv_openai_init agent_srv_openai_init
#define srv_post agent_srv_post
#define srv_random_id agent_srv_random_id
#define srv_reply_error agent_srv_reply_error
#define srv_reply_json agent_srv_reply_json
#define srv_reply_raw agent_srv_reply_raw
#define srv_req_body agent_srv_req_body
#define srv_req_gone agent_srv_req_gone
#define srv_req_header agent_srv_req_header
#define srv_req_hold agent_srv_req_hold
#define srv_req_json agent_srv_req_json
#define srv_req_method agent_srv_req_method
#define srv_req_path agent_srv_req_path
#define srv_req_peer agent_srv_req_peer
#define srv_req_query agent_srv_req_query
#define srv_req_server agent_srv_req_server
#define srv_route_add agent_srv_route_add
#define srv_sse_json agent_srv_sse_json
#define srv_split_calls agent_srv_split_calls
#define srv_split_feed agent_srv_split_feed
#define srv_split_free agent_srv_split_free
#define srv_split_init agent_srv_split_init
#define srv_split_next agent_srv_split_next
#define srv_split_set_deltas agent_srv_split_set_deltas
#define srv_split_think_open agent_srv_split_think_open
#define srv_think_watch_feed agent_srv_think_watch_feed
#define srv_sse_send agent_srv_sse_send
#define srv_stream_end agent_srv_stream_end
#define srv_stream_start agent_srv_stream_start
#define srv_stream_write agent_srv_stream_write
#define srv_wake agent_srv_wake
#define srv_ws_connections agent_srv_ws_connections
#define srv_ws_handler_set agent_srv_ws_handler_set
#define srv_ws_send agent_srv_ws_send
#define srv_ws_send_json agent_srv_ws_send_json
#define srv_rpc_init agent_srv_rpc_init
#define srv_anthropic_init agent_srv_anthropic_init
#define srv_responses_init agent_srv_responses_init
#define srv_infill_init agent_srv_infill_init

typedef struct srv srv;           /* the server (one per process) */
typedef struct srv_req srv_req;   /* one HTTP request */
typedef struct srv_conn srv_conn; /* one WebSocket connection */
typedef struct srv_job srv_job;   /* one generation in the engine scheduler */

/* ----- limits (srv_limits(s); read-only after start) ------------------------------------- */
typedef struct {
    size_t max_body;          /* HTTP request body bytes (default 8 MiB): 413 above */
    size_t max_ws_message;    /* one reassembled WebSocket message (default 8 MiB): close 1009 */
    int max_json_depth;       /* nesting of arrays/objects in a JSON body (default 64): 400 */
    int max_conns_per_client; /* open connections per peer address (default 64): refused */
    size_t max_pending_out;   /* bytes queued for one client not reading (default 16 MiB) */
    int max_tokens_default;   /* max_tokens when a request gives none (default 512) */
    int idle_timeout_s;       /* idle keep-alive / WebSocket without pong (default 60) */
} srv_limits;

const srv_limits *srv_limits_get(const srv *s);

/* The model the server runs (borrowed; shared, immutable) and its public name ("model" in
 * requests and /v1/models). */
engine_model *srv_model(const srv *s);
const char *srv_model_name(const srv *s);

/* True once SIGTERM (or srv_stop) is seen, also before the loop has begun the drain: front ends
 * refuse new work with 503 (HTTP) or the JSON-RPC "server shutting down" error. */
bool srv_draining(const srv *s);

/* ----- routes (registered at start by the front ends' init functions) --------------------- */

/* A route handler. Returns 0 when it answered or held the request; a negative value makes the
 * core answer 500 with agent_error_last(). */
typedef int (*srv_route_fn)(srv_req *r);

enum {
    SRV_ROUTE_JSON = 1 << 0,   /* POST body must be JSON (parsed into srv_req_json) */
    SRV_ROUTE_NO_DRAIN = 1 << 1, /* still served while draining (health, metrics, models) */
};

/* Register METHOD PATH (exact match, query ignored) at start-up. A path registered with another
 * method answers 405; an unknown path 404. */
int srv_route_add(srv *s, const char *method, const char *path, srv_route_fn fn, int flags);

/* The front ends' init functions, called in this order by srv_new (agent/server/routes.c holds
 * the list; a front end adds its row there). Each registers its routes / WS handler. */
typedef int (*srv_module_init_fn)(srv *s);
int srv_openai_init(srv *s);    /* openai.c: /v1/chat/completions, /v1/completions, /v1/models */
int srv_metrics_init(srv *s);   /* metrics.c: /metrics, /health */
/* part B: srv_rpc_init (WS JSON-RPC), srv_anthropic_init, srv_responses_init, srv_infill_init */

/* ----- one HTTP request ---------------------------------------------------------------------- */
const char *srv_req_method(const srv_req *r);   /* "GET", "POST", ... */
const char *srv_req_path(const srv_req *r);     /* "/v1/chat/completions" (no query) */
const char *srv_req_query(const srv_req *r);    /* raw query after '?', "" when none */
/* A request header by lower-case name ("anthropic-version"), or NULL. Valid during the
 * handler call only (copy what you keep). */
const char *srv_req_header(srv_req *r, const char *name);
const char *srv_req_body(const srv_req *r, size_t *len); /* NUL-terminated; "" for GET */
json_t *srv_req_json(const srv_req *r);         /* SRV_ROUTE_JSON: the parsed body (borrowed) */
srv *srv_req_server(const srv_req *r);
const char *srv_req_peer(const srv_req *r);     /* client address, for logs */

/* Keep the request after the handler returns. cleanup(r, user) runs exactly once, on the
 * service thread, when the request ends for any reason (response written, client gone,
 * server stopping); the handler's state is freed there and its jobs released. */
void srv_req_hold(srv_req *r, void (*cleanup)(srv_req *r, void *user), void *user);

/* True when the client went away (the request is only waiting for its cleanup). */
bool srv_req_gone(const srv_req *r);

/* Complete responses. Each ends the request (once written). body is copied. */
int srv_reply_raw(srv_req *r, int status, const char *content_type, const char *body,
                  size_t len);
int srv_reply_json(srv_req *r, int status, json_t *body);      /* steals body's reference */
/* OpenAI's error shape {"error": {"message", "type", "param": null, "code"}}; type e.g.
 * "invalid_request_error", "authentication_error", "server_error"; code may be NULL. */
int srv_reply_error(srv_req *r, int status, const char *type, const char *code,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* A streamed response: headers now (no Content-Length: the connection closes after
 * srv_stream_end), then data as it comes. */
int srv_stream_start(srv_req *r, int status, const char *content_type);
int srv_stream_write(srv_req *r, const char *data, size_t len);
/* One Server-Sent Event: "event: EVENT\n" (when event is non-NULL) + "data: DATA\n\n". data
 * must not contain a newline (compact JSON never does). */
int srv_sse_send(srv_req *r, const char *event, const char *data, size_t len);
int srv_sse_json(srv_req *r, const char *event, json_t *data); /* borrowed; compact */
void srv_stream_end(srv_req *r);

/* ----- WebSocket connections ------------------------------------------------------------------ */
typedef struct {
    /* A connection was established (token checked). Returns the per-connection state (may be
     * NULL). */
    void *(*open)(srv_conn *c, void *user);
    /* One complete text message. */
    void (*message)(srv_conn *c, void *state, const char *text, size_t len);
    /* The connection is gone (client, timeout, srv_conn_close or server stop): cancel its work
     * and free state. After this the srv_conn is invalid. */
    void (*close)(srv_conn *c, void *state);
    void *user;
} srv_ws_handler;

/* Install the WebSocket handler (one; from a module init). Without one, /rpc answers 404. */
void srv_ws_handler_set(srv *s, const srv_ws_handler *h);

/* Queue one text message (copied). AGENT_ENOMEM, or AGENT_EINVAL when the connection is
 * closing; a client that lets more than max_pending_out bytes pile up is closed (1008). */
int srv_ws_send(srv_conn *c, const char *text, size_t len);
int srv_ws_send_json(srv_conn *c, json_t *msg); /* borrowed; compact */
/* Close after the queued messages are written (code 1000, 1008, 1011, ...). */
void srv_conn_close(srv_conn *c, int code, const char *reason);
uint64_t srv_conn_id(const srv_conn *c);       /* unique for the server's life, never 0 */
srv *srv_conn_server(const srv_conn *c);
const char *srv_conn_peer(const srv_conn *c);

/* Run fn(s, arg) once in agent_server_free, after every connection is closed (their close /
 * cleanup callbacks have run) and before pending posts are dropped and the chat service is
 * freed (a front end joins its worker threads there). One slot: AGENT_EINVAL when taken. */
int srv_at_free(srv *s, void (*fn)(srv *s, void *arg), void *arg);

/* ----- reaching the service thread from other threads --------------------------------------- */

/* Any thread: run fn(s, arg) on the service thread soon. AGENT_ENOMEM, AGENT_EINVAL after the
 * server stopped (fn is then not called and arg stays the caller's). */
int srv_post(srv *s, void (*fn)(srv *s, void *arg), void *arg);
/* Any thread: queue a text message (copied) for connection `conn_id`; silently dropped when
 * that connection has closed meanwhile. */
int srv_conn_post(srv *s, uint64_t conn_id, const char *text, size_t len);
/* Service thread: the live connection with this id, or NULL. */
srv_conn *srv_conn_find(srv *s, uint64_t conn_id);

/* ----- a growable byte buffer -------------------------------------------------------------- */
typedef struct {
    char *p;                /* NUL-terminated after every add (NULL while empty) */
    size_t len, cap;
    size_t off;             /* bytes consumed at the front (a writer's progress); an add
                             * reuses that room once it is past half the capacity */
} srv_buf;

/* Append n bytes / formatted text. AGENT_ENOMEM. */
int srv_buf_add(srv_buf *b, const void *d, size_t n);
int srv_buf_printf(srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void srv_buf_free(srv_buf *b);

/* ----- JSON --------------------------------------------------------------------------------- */

/* Parse text with the server's depth limit. NULL with *err (a static or caller buffer of 160
 * bytes) set: malformed ("line L column C: ...") or too deep. */
json_t *srv_json_parse(const srv *s, const char *text, size_t len, char err[160]);

/* ----- the chat service: every front end's way to the model ---------------------------------
 * A chat request (OpenAI messages + tools + tool_choice + response_format + sampling) is
 * rendered with the model's chat template (agent_template_render), tokenized and submitted to
 * the engine scheduler with the tool-call grammar (lazy at <tool_call>, or required / named /
 * none) or the json_schema grammar. Its output is split into events: reasoning text (a
 * leading <think> block), content text, complete tool calls (parsed and checked against the
 * request's tool schemas), done. A raw completion (prompt text, or FIM prefix + suffix + extra
 * context chunks) gives text events and done.
 * ----------------------------------------------------------------------------------------- */
typedef enum {
    SRV_TOOLS_AUTO = 0,     /* the model chooses; the grammar switches on at <tool_call> */
    SRV_TOOLS_NONE = 1,     /* tools are shown but no call may be made */
    SRV_TOOLS_REQUIRED = 2, /* only tool calls (one or more) */
    SRV_TOOLS_NAMED = 3,    /* only calls of tool_name */
} srv_tool_choice;

typedef struct {
    float temperature;      /* <= 0: greedy. Default 1.0 (OpenAI) */
    float top_p;            /* 1: off */
    int32_t top_k;          /* 0: off */
    float min_p;            /* 0: off */
    float presence_penalty, frequency_penalty, repeat_penalty;
    uint64_t seed;          /* has_seed false: a random seed per request */
    bool has_seed;
    int32_t max_tokens;     /* <= 0: srv_limits.max_tokens_default */
    const char *stop[4];    /* stop strings (borrowed until submit returns) */
    int n_stop;
    bool ignore_eos;        /* go on past the model's end-of-generation tokens (benchmarks) */
} srv_sampling;

#define SRV_SAMPLING_INIT {1.0f, 1.0f, 0, 0.0f, 0.0f, 0.0f, 1.0f, 0, false, 0, {0}, 0, false}

typedef struct {
    json_t *messages;       /* OpenAI-style messages (borrowed until submit returns):
                             * role system|developer|user|assistant|tool; content a string or
                             * an array of {"type":"text","text"} parts; assistant tool_calls
                             * (arguments a JSON string or object); reasoning_content */
    json_t *tools;          /* OpenAI tool array, or NULL */
    srv_tool_choice tool_choice;
    const char *tool_name;  /* SRV_TOOLS_NAMED */
    bool parallel_tool_calls; /* default true */
    json_t *json_schema;    /* response_format json_schema's "schema" (borrowed), or NULL */
    bool json_object;       /* response_format {"type":"json_object"}: any JSON object */
    int enable_thinking;    /* -1 the template's default, 0, 1 */
    bool stream_tool_args;  /* give SRV_EV_TOOL_DELTA events while a call is written */
    srv_sampling sampling;
} srv_chat_req;

/* One FIM context chunk from another file (repo-level FIM: "<|file_sep|>name\ntext"). */
typedef struct {
    const char *name;       /* file name, may be NULL */
    const char *text;
} srv_chunk;

typedef struct {
    const char *prompt;     /* raw prompt text, or the FIM prefix when suffix != NULL */
    const char *suffix;     /* non-NULL: fill-in-the-middle */
    const srv_chunk *extra; /* FIM context from other files (borrowed until submit returns) */
    int n_extra;
    const char *repo_name;  /* FIM: "<|repo_name|>" when non-NULL */
    const char *file_name;  /* FIM: the current file ("<|file_sep|>name\n" before the
                             * prefix), may be NULL */
    const char *middle;     /* FIM: text after <|fim_middle|> that the generation continues
                             * (llama.cpp /infill's "prompt"); not repeated in the events */
    int32_t time_budget_ms; /* > 0: stop generating after this long (finish "time") */
    srv_sampling sampling;
} srv_complete_req;

typedef enum {
    SRV_EV_REASONING = 1,   /* text inside a leading <think> block */
    SRV_EV_TEXT = 2,        /* content text */
    SRV_EV_TOOL_CALL = 3,   /* one complete tool call */
    SRV_EV_DONE = 4,        /* last event */
    SRV_EV_TOOL_DELTA = 5,  /* a piece of a tool call being written (srv_chat_req.
                             * stream_tool_args): the first of a call has tool_index,
                             * tool_id and tool_name (text may be empty), every one text/len
                             * = the next bytes of its arguments' JSON text */
} srv_ev_type;

typedef enum {
    SRV_FINISH_STOP = 0,    /* end of turn or a stop string */
    SRV_FINISH_LENGTH,      /* max_tokens or the context */
    SRV_FINISH_TOOL_CALLS,  /* the turn ended after tool calls */
    SRV_FINISH_TIME,        /* time_budget_ms */
    SRV_FINISH_CANCELED,
    SRV_FINISH_ERROR,       /* error names it */
} srv_finish;

/* "stop", "length", "tool_calls", "time", "canceled", "error" (static). */
const char *srv_finish_name(srv_finish f);

typedef struct {
    int32_t prompt_tokens, cached_tokens, completion_tokens;
    int32_t reasoning_tokens; /* of completion_tokens: the leading think block's (through the
                               * token that closed it with </think>) */
    double queue_ms, ttft_ms, total_ms;
} srv_usage;

typedef struct {
    srv_ev_type type;
    const char *text;       /* REASONING/TEXT: the delta (UTF-8, not NUL-terminated);
                             * TOOL_CALL: the call's markup as the model wrote it */
    size_t len;
    int tool_index;         /* TOOL_CALL: 0, 1, ... within the turn */
    const char *tool_id;    /* "call_<random>" */
    const char *tool_name;
    const char *tool_args;  /* compact JSON object text */
    const char *tool_error; /* non-NULL: complete markup but not a valid call (unknown
                             * name, arguments not a JSON object): never run it; a
                             * front end may pass the markup (text) on as content (unless
                             * tool_begun: then the call was announced already and stays
                             * as far as it was streamed, finish tells why) */
    bool tool_begun;        /* TOOL_CALL: TOOL_DELTA events announced this call */
    size_t tool_streamed;   /* TOOL_CALL with tool_begun: bytes of tool_args already given
                             * as deltas (tool_args starts with them when no tool_error) */
    srv_finish finish;      /* DONE */
    const char *error;      /* DONE with SRV_FINISH_ERROR */
    int status;             /* DONE with SRV_FINISH_ERROR: the HTTP status it maps to */
    srv_usage usage;        /* DONE */
    const char *stop_sequence; /* DONE: the request's stop string that ended the generation,
                                * or NULL */
} srv_event;

/* Wake-up: the job has events (service thread). Called once per batch of new events, not
 * per event; drain with srv_job_next. */
typedef void (*srv_job_wake_fn)(srv_job *j, void *user);

/* Start a chat / raw completion. Request errors (bad messages, template failure, a schema the
 * grammar cannot compile, prompt too long, queue full) return AGENT_EINVAL with the message
 * and *status_out (may be NULL) the HTTP status (400, 413, 429, 503); nothing is started then.
 * On success *out is the job (owned by the caller: srv_job_release). */
int srv_chat_submit(srv *s, const srv_chat_req *req, srv_job_wake_fn wake, void *user,
                    srv_job **out, int *status_out);
int srv_complete_submit(srv *s, const srv_complete_req *req, srv_job_wake_fn wake, void *user,
                        srv_job **out, int *status_out);

/* The OpenAI chat body -> a chat request (the fields /v1/chat/completions takes; q borrows
 * from body). 0, or -1 with msg (the error) and *param (the field, or NULL). stream and
 * stream_options are not read. */
int srv_openai_chat_parse(json_t *body, srv_chat_req *q, const srv_limits *lim, char msg[256],
                          const char **param);

/* Render and tokenize a chat request without running it (count_tokens). */
int srv_chat_count_tokens(srv *s, const srv_chat_req *req, int32_t *n_tokens, int *status_out);

/* The next event (1), none pending now (0). The event's strings are valid until the next call
 * or the release. After DONE it returns 0 forever. */
int srv_job_next(srv_job *j, srv_event *ev);
/* Stop the generation (within one engine step); a DONE with SRV_FINISH_CANCELED follows. */
void srv_job_cancel(srv_job *j);
/* The caller is done with the job: cancels it if running; no more wake calls. NULL: no-op. */
void srv_job_release(srv_job *j);

/* Random OpenAI-style ids: prefix + 24 url-safe characters ("chatcmpl-", "call_"). */
void srv_random_id(char *out, size_t cap, const char *prefix);

/* ----- metrics (metrics.c; service thread) ------------------------------------------------- */
typedef struct srv_metrics srv_metrics;
srv_metrics *srv_metrics_of(srv *s);
/* Counted by the core for every answered request. */
void srv_metrics_request(srv_metrics *m, const char *route, int status);
/* Counted by the chat service for every finished job. */
void srv_metrics_job(srv_metrics *m, const srv_usage *u, srv_finish f);

#endif
