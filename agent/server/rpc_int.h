/*
 * rpc_int.h - private to the WebSocket JSON-RPC front end (agent/server/rpc*.c; the protocol is
 * docs/protocol.md).
 *
 *   rpc.c          the WS handler: message parsing, lifecycle, dispatch, cancel, progress,
 *                  server-to-client requests and their answers
 *   rpc_doc.c      open documents: LSP positions (UTF-16 or UTF-8), incremental edits
 *   rpc_complete.c textDocument/inlineCompletion (fill-in-the-middle, result cache)
 *   rpc_chat.c     chat/completion
 *   rpc_agent.c    agent/run on a worker thread, approvals through the client
 *
 * Threads: everything runs on the server's service thread except an agent run's worker
 * (rpc_agent.c says what it touches).
 */
#ifndef SPARK_AGENT_SERVER_RPC_INT_H
#define SPARK_AGENT_SERVER_RPC_INT_H

#include "dialects.h"

/* JSON-RPC and protocol error codes (docs/protocol.md §9). */
enum {
    RPC_PARSE_ERROR = -32700,
    RPC_INVALID_REQUEST = -32600,
    RPC_METHOD_NOT_FOUND = -32601,
    RPC_INVALID_PARAMS = -32602,
    RPC_INTERNAL_ERROR = -32603,
    RPC_SERVER_NOT_INITIALIZED = -32002,
    RPC_REQUEST_CANCELLED = -32800,
    RPC_DOCUMENT_NOT_OPEN = -32010,
    RPC_CONTEXT_TOO_LONG = -32011,
    RPC_BUSY = -32012,
    RPC_UNSUPPORTED = -32013,
    RPC_NOT_ALLOWED = -32014,
    RPC_TOO_LARGE = -32015,
};

#define RPC_PROTOCOL_VERSION 1
#define RPC_MAX_OPEN_DOCS 64
#define RPC_MAX_DOC_BYTES (4u << 20)
#define RPC_MAX_IN_FLIGHT 16
#define RPC_MAX_COMPLETION_TOKENS 256
#define RPC_MAX_EXTRA_CHUNKS 32
#define RPC_MAX_CHUNK_BYTES (64u << 10)

/* ----- a parsed incoming message (rpc.c; pure, fuzzed) -------------------------------------- */
typedef enum {
    RPC_MSG_REQUEST = 1,      /* method + id */
    RPC_MSG_NOTIFICATION = 2, /* method, no id */
    RPC_MSG_RESPONSE = 3,     /* id + result or error (an answer to a server request) */
    RPC_MSG_INVALID = 4,      /* answer with error code/message (id may be null) */
} agent_rpc_msg_kind;

typedef struct {
    agent_rpc_msg_kind kind;
    json_t *root;        /* the whole message (owned) */
    json_t *id;          /* borrowed from root: number or string; NULL for notifications */
    const char *method;  /* borrowed from root */
    json_t *params;      /* borrowed: an object, or NULL when absent */
    json_t *result;      /* RESPONSE */
    json_t *error;       /* RESPONSE */
    int code;            /* INVALID: the error code */
    char message[200];   /* INVALID: why */
} agent_rpc_msg;

/* Classify a parsed message (root: NULL when the text was not JSON; err then says why).
 * Takes root's reference (freed by agent_rpc_msg_clear). Never fails: bad input becomes
 * RPC_MSG_INVALID with the code to answer. */
void agent_rpc_msg_classify(agent_rpc_msg *m, json_t *root, const char *err);
void agent_rpc_msg_clear(agent_rpc_msg *m);

/* Messages to send (compact JSON text, caller frees; NULL when out of memory). id borrowed. */
char *agent_rpc_result(const json_t *id, json_t *result);          /* steals result */
char *agent_rpc_error(const json_t *id, int code, const char *message, json_t *data); /* steals */
char *agent_rpc_notification(const char *method, json_t *params);  /* steals params */

/* ----- a connection and its requests (rpc.c) ------------------------------------------------ */
typedef struct agent_rpc_conn agent_rpc_conn;
typedef struct agent_rpc_call agent_rpc_call;
typedef struct agent_rpc_docs agent_rpc_docs;
typedef struct agent_rpc_module agent_rpc_module;
typedef struct agent_rpc_cache agent_rpc_cache;
typedef struct agent_rpc_run agent_rpc_run;

/* An in-flight request (service thread). */
struct agent_rpc_call {
    agent_rpc_call *next;
    agent_rpc_conn *conn;
    json_t *id;               /* owned */
    json_t *progress;         /* workDoneToken (owned) or NULL */
    srv_job *job;             /* the engine work, or NULL */
    bool cancelled;           /* $/cancelRequest, shutdown or close */
    void *state;              /* the method's */
    void (*on_cancel)(agent_rpc_call *c); /* NULL: srv_job_cancel(job) */
    void (*free_state)(void *state);
};

enum { RPC_PHASE_NEW = 0, RPC_PHASE_READY, RPC_PHASE_SHUTDOWN };

struct agent_rpc_conn {
    srv *s;
    agent_rpc_module *mod;    /* the server's JSON-RPC module (rpc_agent.c) */
    srv_conn *c;
    uint64_t conn_id;
    int phase;
    bool utf8;                /* negotiated positionEncoding utf-8 */
    bool fim;                 /* the model has the fill-in-the-middle tokens */
    agent_rpc_docs *docs;
    json_t *folders;          /* [{"path": "/abs", "name": "proj"}] from initialize */
    agent_rpc_call *calls;
    int n_calls;
    agent_rpc_cache *cache;   /* completion results (rpc_complete.c) */
    agent_rpc_run *run;       /* the agent run (rpc_agent.c), or NULL */
    uint64_t next_server_id;  /* agent runs on this connection (approval ids "sN_M") */
    size_t script_pos;        /* SPARK_SERVE_AGENT_SCRIPT replies used by earlier runs */
};

/* Send a message (text copied). Errors are the connection's problem (it closes): ignored. */
void agent_rpc_send(agent_rpc_conn *c, char *text); /* frees text (NULL: nothing) */
void agent_rpc_reply(agent_rpc_conn *c, const json_t *id, json_t *result); /* steals */
void agent_rpc_reply_error(agent_rpc_conn *c, const json_t *id, int code, json_t *data,
                           const char *fmt, ...) __attribute__((format(printf, 5, 6)));
void agent_rpc_notify(agent_rpc_conn *c, const char *method, json_t *params); /* steals */

/* Register an in-flight request (counted against RPC_MAX_IN_FLIGHT by the dispatcher). */
agent_rpc_call *agent_rpc_call_new(agent_rpc_conn *c, const json_t *id, const json_t *params);
/* The request answered: unlink, release its job, free. */
void agent_rpc_call_end(agent_rpc_call *call);
/* $/progress for a request that gave a workDoneToken (nothing otherwise). kind "begin",
 * "report" or "end"; title/message may be NULL; percentage < 0: none. */
void agent_rpc_progress(agent_rpc_call *call, const char *kind, const char *title,
                        const char *message, int percentage);

/* The workspace folder containing path (absolute): its index in c->folders and the path
 * relative to it (borrowed from path); -1 when none. */
int agent_rpc_folder_of(const agent_rpc_conn *c, const char *path, const char **rel);
/* "file:///a%20b" -> "/a b" (caller frees), or NULL when not a local file URI / absolute path. */
char *agent_rpc_uri_path(const char *uri);

/* Helpers for params. Return 0, or answer the request with -32602 naming the field and
 * return -1. */
int agent_rpc_param_str(agent_rpc_conn *c, const json_t *id, const json_t *params,
                        const char *field, bool required, const char **out);
int agent_rpc_param_int(agent_rpc_conn *c, const json_t *id, const json_t *params,
                        const char *field, int64_t lo, int64_t hi, int64_t *out);

/* The methods (each answers the request itself, now or later). */
void agent_rpc_complete(agent_rpc_conn *c, const json_t *id, const json_t *params);
void agent_rpc_chat(agent_rpc_conn *c, const json_t *id, const json_t *params);
void agent_rpc_agent_run(agent_rpc_conn *c, const json_t *id, const json_t *params);
/* A response from the client to a server request (an approval). */
void agent_rpc_agent_answer(agent_rpc_conn *c, const json_t *id, const json_t *result,
                            const json_t *error);
/* The module: one per server, created by srv_rpc_init; it cancels the runs and waits for
 * their workers when the server is freed (srv_at_free). */
int agent_rpc_module_new(agent_rpc_module **out, srv *s);
/* The connection closes: stop and release the run (rpc_agent.c). */
void agent_rpc_agent_close(agent_rpc_conn *c);
void agent_rpc_cache_free(agent_rpc_cache *cache);

/* ----- open documents (rpc_doc.c; pure) ----------------------------------------------------- */

int agent_rpc_docs_new(agent_rpc_docs **out, size_t max_docs, size_t max_bytes);
void agent_rpc_docs_free(agent_rpc_docs *d);

/* didOpen: add or replace. AGENT_EINVAL (too large, too many documents). */
int agent_rpc_doc_open(agent_rpc_docs *d, const char *uri, int64_t version, const char *text,
                       size_t len);
/* didChange: apply contentChanges (a JSON array of {range?, text}) in order; positions in
 * UTF-16 code units, or bytes when utf8. On any error (unknown uri, version not increasing, a
 * bad range, too large) the document is dropped (when it was open) and AGENT_EINVAL returned
 * with the reason in agent_error_last(). */
int agent_rpc_doc_change(agent_rpc_docs *d, const char *uri, int64_t version,
                         const json_t *changes, bool utf8);
/* didClose. AGENT_EINVAL when not open. */
int agent_rpc_doc_close(agent_rpc_docs *d, const char *uri);
/* The text of an open document (borrowed until the next change), or NULL. */
const char *agent_rpc_doc_text(const agent_rpc_docs *d, const char *uri, size_t *len,
                               int64_t *version);
size_t agent_rpc_docs_count(const agent_rpc_docs *d);

/* The byte offset of LSP position (line, character) in text. A character past the end of its
 * line means the end of the line; inside a UTF-8 sequence (utf8) or a surrogate pair it
 * rounds down to the character's start. AGENT_EINVAL for a line past the end or negatives. */
int agent_rpc_pos_offset(const char *text, size_t len, int64_t line, int64_t character,
                         bool utf8, size_t *off);
/* The LSP position of byte offset off (<= len). */
void agent_rpc_offset_pos(const char *text, size_t len, size_t off, bool utf8, int64_t *line,
                          int64_t *character);
/* The prefix and suffix around byte offset off: at most max_before whole lines before the
 * cursor's line (plus that line up to the cursor) and max_after lines after it. */
void agent_rpc_fim_window(const char *text, size_t len, size_t off, int64_t max_before,
                          int64_t max_after, size_t *pre_start, size_t *suf_end);

#endif
