/* Private to agent/: the streamed answer of an OpenAI-compatible /chat/completions endpoint
 * (server-sent events), turned into reply text (agent/sse.c). Fed by the remote backend; a
 * fuzz target (tests/agent/fuzz_sse.c) feeds it arbitrary bytes in arbitrary pieces. */
#ifndef SPARK_AGENT_SSE_INT_H
#define SPARK_AGENT_SSE_INT_H
#include "agent_int.h"

#include <jansson.h>

/* Limits against a hostile or broken server: a longer line, more content or more argument
 * text is an error (agent_sse.error), not unbounded memory. */
#define AGENT_SSE_MAX_LINE (16u << 20)
#define AGENT_SSE_MAX_TEXT (64u << 20)
#define AGENT_SSE_MAX_CALLS 64

typedef struct {
    agent_text_fn on_text;   /* streamed content deltas (may be NULL) */
    void *user;
    char *line, *data, *content;
    size_t line_n, line_cap, data_n, data_cap, content_n, content_cap;
    bool line_dropped;       /* the current line went past the limit */
    bool last_cr;            /* the previous byte was a CR (a following LF is part of it) */
    bool have_data;          /* the event being assembled has a data field */
    json_t *calls;           /* [{"name", "arguments" (string)}] by index */
    size_t text_total;       /* content and argument bytes so far */
    bool done;               /* [DONE] seen */
    bool finished_length;    /* a choice ended with finish_reason "length" */
    bool oom;
    int64_t chunks;          /* deltas received */
    char error[512];         /* "" or why the stream is unusable (an error event, a limit) */
} agent_sse;

int agent_sse_init(agent_sse *s, agent_text_fn on_text, void *user);
void agent_sse_deinit(agent_sse *s);
/* Feed bytes as they arrive, in any pieces: lines end with LF, CRLF or CR; an event is
 * dispatched at a blank line (its data lines joined with "\n"); comments and other fields are
 * ignored. */
void agent_sse_feed(agent_sse *s, const char *in, size_t len);
/* The stream ended: dispatch an event left without its blank line. */
void agent_sse_finish(agent_sse *s);
/* The reply: content, then each structured call as Hermes markup (caller frees; NULL when out
 * of memory). */
char *agent_sse_reply(const agent_sse *s);
#endif
