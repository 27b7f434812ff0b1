/* The remote backend's server-sent-events parser (agent/sse.c): content deltas, tool calls
 * assembled across chunks and turned into Hermes markup, CRLF / CR line ends, events of several
 * data lines, comments and other fields, [DONE], finish_reason length, error events, limits. */
#include "sse_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(c)                                                                               \
    do {                                                                                       \
        if (!(c)) {                                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);              \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)

static char streamed[256];
static void on_text(void *user, const char *t, size_t n) {
    (void)user;
    strncat(streamed, t, n < sizeof streamed - strlen(streamed) - 1 ? n :
                         sizeof streamed - strlen(streamed) - 1);
}

/* Feed `in` one byte at a time; return the reply (caller frees); *s is left for checks. */
static char *run(agent_sse *s, const char *in) {
    streamed[0] = 0;
    if (agent_sse_init(s, on_text, NULL)) abort();
    for (const char *p = in; *p; p++) agent_sse_feed(s, p, 1);
    agent_sse_finish(s);
    return agent_sse_reply(s);
}

int main(void) {
    agent_sse s;
    char *r = run(&s, "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n"
                      "data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\ndata: [DONE]\n\n");
    CHECK(r && !strcmp(r, "Hello") && !strcmp(streamed, "Hello") && s.done && s.chunks == 2);
    CHECK(!s.error[0] && !s.finished_length);
    free(r);
    agent_sse_deinit(&s);

    r = run(&s, "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":"
                "{\"name\":\"read_file\",\"arguments\":\"\"}}]}}]}\r\n\r\n"
                "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":"
                "{\"arguments\":\"{\\\"path\\\": \"}}]}}]}\r\n\r\n"
                "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":"
                "{\"arguments\":\"\\\"a.txt\\\"}\"}}]}}]}\r\n\r\n"
                "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":1,\"function\":"
                "{\"name\":\"list_dir\"}}]}}]}\r\n\r\n");
    CHECK(r && !strcmp(r, "\n<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": "
                          "\"a.txt\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"list_dir\", "
                          "\"arguments\": {}}\n</tool_call>"));
    CHECK(!s.done && s.chunks == 4);
    free(r);
    agent_sse_deinit(&s);

    /* two data lines make one event; comments, event/id fields and a non-JSON event are
     * skipped; CR alone ends lines; "data:" without a space; finish_reason length */
    r = run(&s, ": keep-alive\n\nevent: message\nid: 3\n"
                "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\n"
                "data: \"finish_reason\":\"length\"}]}\n\n"
                "data:{\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\r\r"
                "data: not json\n\n");
    CHECK(r && !strcmp(r, "ab") && s.finished_length && !s.error[0]);
    free(r);
    agent_sse_deinit(&s);

    /* an event the server did not close with a blank line still counts at the end */
    r = run(&s, "data: {\"choices\":[{\"delta\":{\"content\":\"tail\"}}]}");
    CHECK(r && !strcmp(r, "tail"));
    free(r);
    agent_sse_deinit(&s);

    /* an error event */
    r = run(&s, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n"
                "data: {\"error\":{\"message\":\"model overloaded\",\"code\":503}}\n\n");
    CHECK(strstr(s.error, "the server reported an error in the stream: model overloaded"));
    free(r);
    agent_sse_deinit(&s);

    /* a call index out of range */
    r = run(&s, "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":99,\"function\":"
                "{\"name\":\"x\"}}]}}]}\n\n");
    CHECK(strstr(s.error, "index out of range") && r && !strcmp(r, ""));
    free(r);
    agent_sse_deinit(&s);

    /* a line over the limit: an error, and the parser goes on with the next line */
    if (agent_sse_init(&s, NULL, NULL)) abort();
    size_t big = AGENT_SSE_MAX_LINE + 10;
    char *l = malloc(big);
    if (!l) abort();
    memset(l, 'x', big);
    memcpy(l, "data: ", 6);
    agent_sse_feed(&s, l, big);
    free(l);
    const char *after = "\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n\n";
    agent_sse_feed(&s, after, strlen(after));
    agent_sse_finish(&s);
    r = agent_sse_reply(&s);
    CHECK(strstr(s.error, "longer than 16 MiB") && r && !strcmp(r, "ok"));
    free(r);
    agent_sse_deinit(&s);

    if (failures) fprintf(stderr, "%d failure(s)\n", failures);
    else printf("test_sse: ok\n");
    return failures ? 1 : 0;
}
