/* Private to the server core (server.c, chat.c, metrics.c, openai.c, routes.c): what the other
 * front ends do not need. */
#ifndef SPARK_AGENT_SERVER_CORE_H
#define SPARK_AGENT_SERVER_CORE_H
#include "server_int.h"

typedef struct srv_chat srv_chat;

/* Monotonic milliseconds. */
double srv_now_ms(void);
/* Any thread: wake the service loop (it then runs posts and srv_chat_service). */
void srv_wake(srv *s);
/* Open connections (service thread). */
int srv_http_connections(const srv *s);
int srv_ws_connections(const srv *s);

/* Every front end's init function, in order (routes.c). */
int srv_modules_init(srv *s);

/* The chat service (chat.c): the template, the grammar vocabulary and the engine scheduler.
 * max_seqs / n_ctx: scheduler parameters (0: defaults). */
int srv_chat_new(srv_chat **out, srv *s, int32_t max_seqs, int32_t n_ctx);
/* Stops the scheduler (every running request cancelled) and frees the jobs. */
void srv_chat_free(srv_chat *c);
srv_chat *srv_chat_of(srv *s);
/* Service thread, after a wake: deliver the jobs' events (wake callbacks), free finished
 * jobs. */
void srv_chat_service(srv_chat *c);
/* Jobs not finished yet. */
int srv_chat_active(const srv_chat *c);
void srv_chat_cancel_all(srv_chat *c);
/* The scheduler's figures (metrics). */
struct engine_sched *srv_chat_sched(srv_chat *c);

/* The splitter of generated text into events (split.c): a leading <think> block (when think),
 * content, complete tool calls (when tools_json; fmt is the template's markup); raw: all text.
 * Feed the text as it comes; next gives the next event (1) or nothing now (0); done: no more
 * text will come (everything held back is released). Event strings live until the next call.
 * Independent of how the text is cut into pieces. */
typedef struct {
    srv_buf text;
    size_t pos;
    int ps;
    bool think;
    bool thought;           /* the text opened a think block (or the prompt did) */
    const char *tools_json; /* borrowed */
    agent_toolcall_format fmt;
    int n_calls;
    agent_reply reply;
    char call_id[40];
    /* streaming a call's arguments as it is written (srv_split_set_deltas; split.c) */
    bool deltas;
    json_t *tools;        /* tools_json parsed (the XML format's parameter types), lazily */
    int cs;               /* the streamer's state (CS_*) */
    size_t at;            /* bytes of the call markup scanned */
    size_t mark;          /* start of the token being scanned (XML tags and values) */
    bool begun;           /* the call's first TOOL_DELTA (id and name) was given */
    bool in_str, x_str, x_any; /* inside a JSON string; XML: string value, any parameter */
    int depth;            /* Hermes: nesting inside "arguments" */
    int esc;              /* JSON string escape state */
    uint32_t u, hi;       /* \u value being read, pending high surrogate */
    srv_buf name, tok;    /* the call's name; a key / literal / XML value being read */
    srv_buf args;         /* the arguments text produced so far */
    size_t sent;          /* bytes of args given as deltas */
} srv_split;

void srv_split_init(srv_split *sp, bool raw, bool think, const char *tools_json,
                    agent_toolcall_format fmt);
/* Stream tool-call arguments: SRV_EV_TOOL_DELTA events while a call is written (before
 * the first text is fed). */
void srv_split_set_deltas(srv_split *sp, bool on);
/* The prompt opened the think block already: the text starts as reasoning (until
 * </think>). */
void srv_split_think_open(srv_split *sp);

/* Watching generated tokens' bytes for the "</think>" that closes the reasoning (the tag may
 * span tokens or be one special token). Zero-initialize; feed returns true for the token that
 * completes the first tag. */
typedef struct {
    char tail[7]; /* the last bytes fed (a tag that is not whole yet) */
    size_t len;
} srv_think_watch;
bool srv_think_watch_feed(srv_think_watch *w, const char *b, size_t n);
int srv_split_feed(srv_split *sp, const char *d, size_t n);
int srv_split_next(srv_split *sp, bool done, srv_event *ev);
int srv_split_calls(const srv_split *sp);
void srv_split_free(srv_split *sp);

/* Observe the gaps between consecutive tokens of a generation (ms). */
void srv_metrics_token_gaps(srv_metrics *m, const float *gaps_ms, size_t n);

int srv_metrics_new(srv_metrics **out);
void srv_metrics_free(srv_metrics *m);
#endif
