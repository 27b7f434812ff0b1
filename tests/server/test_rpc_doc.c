/* The JSON-RPC front end's pure parts: message classification (every JSON-RPC error case the
 * protocol names) and the open-document store (LSP positions in UTF-16 and UTF-8, \n, \r\n and
 * \r line ends, incremental and full changes, bad changes drop the document, limits, the FIM
 * window around a cursor). */
#include "server/rpc_int.h"

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

static agent_rpc_msg_kind classify(const char *text, int *code, json_int_t *id) {
    json_error_t je;
    json_t *root = json_loads(text, JSON_DECODE_ANY, &je);
    agent_rpc_msg m;
    agent_rpc_msg_classify(&m, root, root ? NULL : je.text);
    agent_rpc_msg_kind k = m.kind;
    *code = m.code;
    *id = json_is_integer(m.id) ? json_integer_value(m.id) : -1;
    agent_rpc_msg_clear(&m);
    return k;
}

static void test_classify(void) {
    int code;
    json_int_t id;
    CHECK(classify("{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"m\",\"params\":{}}", &code, &id) ==
          RPC_MSG_REQUEST && id == 3);
    CHECK(classify("{\"jsonrpc\":\"2.0\",\"method\":\"m\"}", &code, &id) == RPC_MSG_NOTIFICATION);
    CHECK(classify("{\"jsonrpc\":\"2.0\",\"id\":\"s1_1\",\"result\":{}}", &code, &id) ==
          RPC_MSG_RESPONSE);
    CHECK(classify("{\"jsonrpc\":\"2.0\",\"id\":4,\"error\":{\"code\":1}}", &code, &id) ==
          RPC_MSG_RESPONSE);
    struct {
        const char *text;
        int code;
        json_int_t id;
    } bad[] = {
        {"{\"jsonrpc\": \"2.0\", \"id\": 2, \"method\": ", RPC_PARSE_ERROR, -1},
        {"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\"}]", RPC_INVALID_REQUEST, -1},
        {"7", RPC_INVALID_REQUEST, -1},
        {"{\"id\":4,\"method\":\"shutdown\"}", RPC_INVALID_REQUEST, 4},
        {"{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":17}", RPC_INVALID_REQUEST, 5},
        {"{\"jsonrpc\":\"2.0\",\"id\":[1],\"method\":\"m\"}", RPC_INVALID_REQUEST, -1},
        {"{\"jsonrpc\":\"2.0\",\"id\":1.5,\"method\":\"m\"}", RPC_INVALID_REQUEST, -1},
        {"{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"m\",\"params\":[]}", RPC_INVALID_PARAMS, 8},
        {"{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"m\",\"params\":3}", RPC_INVALID_REQUEST, 9},
        {"{\"jsonrpc\":\"2.0\",\"id\":6,\"result\":1,\"error\":{}}", RPC_INVALID_REQUEST, 6},
        {"{\"jsonrpc\":\"2.0\",\"result\":1}", RPC_INVALID_REQUEST, -1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        agent_rpc_msg_kind k = classify(bad[i].text, &code, &id);
        if (k != RPC_MSG_INVALID || code != bad[i].code || id != bad[i].id) {
            fprintf(stderr, "  %s: kind %d code %d id %lld\n", bad[i].text, k, code,
                    (long long)id);
            failures++;
        }
    }
    /* a notification with bad params is still a notification (never answered) */
    CHECK(classify("{\"jsonrpc\":\"2.0\",\"method\":\"m\",\"params\":5}", &code, &id) ==
          RPC_MSG_NOTIFICATION);
    char *e = agent_rpc_error(NULL, -32700, "parse error", NULL);
    CHECK(e && !strcmp(e, "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32700,"
                          "\"message\":\"parse error\"}}"));
    free(e);
    json_t *sid = json_string("a");
    e = agent_rpc_result(sid, json_pack("{s:i}", "x", 1));
    CHECK(e && !strcmp(e, "{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"result\":{\"x\":1}}"));
    free(e);
    json_decref(sid);
}

static size_t off_of(const char *t, int64_t l, int64_t c, bool utf8) {
    size_t off = (size_t)-1;
    if (agent_rpc_pos_offset(t, strlen(t), l, c, utf8, &off)) return (size_t)-1;
    return off;
}

static void test_positions(void) {
    /* "😀" is 4 UTF-8 bytes and 2 UTF-16 units; "é" 2 bytes, 1 unit */
    const char *t = "a\xF0\x9F\x98\x80" "b\r\n\xC3\xA9x\rz\n";
    CHECK(off_of(t, 0, 0, false) == 0);
    CHECK(off_of(t, 0, 1, false) == 1);
    CHECK(off_of(t, 0, 2, false) == 1); /* inside the surrogate pair: its start */
    CHECK(off_of(t, 0, 3, false) == 5);
    CHECK(off_of(t, 0, 4, false) == 6);
    CHECK(off_of(t, 0, 99, false) == 6); /* past the end of the line: the end */
    CHECK(off_of(t, 1, 0, false) == 8);  /* after \r\n */
    CHECK(off_of(t, 1, 1, false) == 10);
    CHECK(off_of(t, 2, 0, false) == 12); /* after a lone \r */
    CHECK(off_of(t, 3, 0, false) == 14); /* the empty last line */
    CHECK(off_of(t, 4, 0, false) == (size_t)-1);
    CHECK(off_of(t, -1, 0, false) == (size_t)-1);
    CHECK(off_of(t, 0, 3, true) == 3 - 2); /* byte 3 is inside the emoji: its start (1) */
    CHECK(off_of(t, 0, 5, true) == 5);
    CHECK(off_of(t, 1, 1, true) == 8);     /* inside é */
    CHECK(off_of(t, 1, 2, true) == 10);
    int64_t l, c;
    agent_rpc_offset_pos(t, strlen(t), 5, false, &l, &c);
    CHECK(l == 0 && c == 3);
    agent_rpc_offset_pos(t, strlen(t), 10, false, &l, &c);
    CHECK(l == 1 && c == 1);
    agent_rpc_offset_pos(t, strlen(t), 10, true, &l, &c);
    CHECK(l == 1 && c == 2);
    agent_rpc_offset_pos(t, strlen(t), 14, false, &l, &c);
    CHECK(l == 3 && c == 0);
    agent_rpc_offset_pos(t, strlen(t), 7, false, &l, &c); /* between \r and \n */
    CHECK(l == 0 && c == 5);
}

static json_t *J(const char *s) {
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    if (!j) {
        fprintf(stderr, "bad test JSON: %s\n", e.text);
        exit(2);
    }
    return j;
}

static bool text_is(agent_rpc_docs *d, const char *uri, const char *want) {
    size_t len;
    const char *t = agent_rpc_doc_text(d, uri, &len, NULL);
    bool ok = t && len == strlen(want) && !memcmp(t, want, len);
    if (!ok) fprintf(stderr, "  %s is '%s', want '%s'\n", uri, t ? t : "(closed)", want);
    return ok;
}

static void test_documents(void) {
    agent_rpc_docs *d;
    CHECK(agent_rpc_docs_new(&d, 2, 64) == 0);
    const char *u = "file:///p/emoji.py";
    const char *t0 = "s = \"\xF0\x9F\x98\x80\"\ndef f(x):\n    return x\n";
    CHECK(agent_rpc_doc_open(d, u, 1, t0, strlen(t0)) == 0);
    json_t *ch = J("[{\"range\":{\"start\":{\"line\":0,\"character\":7},\"end\":{\"line\":0,"
                   "\"character\":7}},\"text\":\"!\"},{\"range\":{\"start\":{\"line\":2,"
                   "\"character\":11},\"end\":{\"line\":2,\"character\":12}},\"text\":\"x * 2\"}]");
    CHECK(agent_rpc_doc_change(d, u, 2, ch, false) == 0);
    json_decref(ch);
    CHECK(text_is(d, u, "s = \"\xF0\x9F\x98\x80!\"\ndef f(x):\n    return x * 2\n"));
    /* the same edit in UTF-8 columns */
    ch = J("[{\"range\":{\"start\":{\"line\":0,\"character\":9},\"end\":{\"line\":0,"
           "\"character\":10}},\"text\":\"?\"}]");
    CHECK(agent_rpc_doc_change(d, u, 3, ch, true) == 0);
    json_decref(ch);
    CHECK(text_is(d, u, "s = \"\xF0\x9F\x98\x80?\"\ndef f(x):\n    return x * 2\n"));
    /* a full replacement, then a range across a \r\n */
    ch = J("[{\"text\":\"a\\r\\nb\"},{\"range\":{\"start\":{\"line\":0,\"character\":1},"
           "\"end\":{\"line\":1,\"character\":0}},\"text\":\"-\"}]");
    CHECK(agent_rpc_doc_change(d, u, 4, ch, false) == 0);
    json_decref(ch);
    CHECK(text_is(d, u, "a-b"));
    /* bad changes drop the document */
    const char *bad[] = {
        "[{\"range\":{\"start\":{\"line\":7,\"character\":0},\"end\":{\"line\":7,\"character\":1}},\"text\":\"x\"}]",
        "[{\"range\":{\"start\":{\"line\":0,\"character\":2},\"end\":{\"line\":0,\"character\":1}},\"text\":\"x\"}]",
        "[{\"range\":{\"start\":{\"line\":0}},\"text\":\"x\"}]",
        "[{\"text\":5}]",
        "{}",
        "[{\"text\":\"0123456789012345678901234567890123456789012345678901234567890123456789\"}]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(agent_rpc_doc_open(d, u, 1, "abc", 3) == 0);
        ch = J(bad[i]);
        CHECK(agent_rpc_doc_change(d, u, 2, ch, false) == AGENT_EINVAL);
        CHECK(agent_rpc_doc_text(d, u, NULL, NULL) == NULL);
        json_decref(ch);
    }
    /* versions must increase */
    CHECK(agent_rpc_doc_open(d, u, 5, "abc", 3) == 0);
    ch = J("[{\"text\":\"x\"}]");
    CHECK(agent_rpc_doc_change(d, u, 5, ch, false) == AGENT_EINVAL);
    CHECK(strstr(agent_error_last(), "version"));
    CHECK(agent_rpc_doc_change(d, "file:///nope", 9, ch, false) == AGENT_EINVAL);
    json_decref(ch);
    /* limits: two documents, 64 bytes */
    CHECK(agent_rpc_doc_open(d, "a", 1, "x", 1) == 0);
    CHECK(agent_rpc_doc_open(d, "b", 1, "x", 1) == 0);
    CHECK(agent_rpc_doc_open(d, "c", 1, "x", 1) == AGENT_EINVAL);
    CHECK(agent_rpc_doc_open(d, "a", 2, "y", 1) == 0); /* replacing is fine */
    char big[65];
    memset(big, 'x', sizeof big);
    CHECK(agent_rpc_doc_open(d, "a", 3, big, 65) == AGENT_EINVAL);
    CHECK(agent_rpc_docs_count(d) == 2);
    CHECK(agent_rpc_doc_close(d, "a") == 0);
    CHECK(agent_rpc_doc_close(d, "a") == AGENT_EINVAL);
    agent_rpc_docs_free(d);
}

static void test_window(void) {
    const char *t = "l0\nl1\r\nl2\nl3 cursor|here\nl4\nl5\nl6";
    size_t off = (size_t)(strchr(t, '|') - t), a, b;
    agent_rpc_fim_window(t, strlen(t), off, 1, 1, &a, &b);
    CHECK(!strncmp(t + a, "l2\nl3 cursor", off - a) && off - a == strlen("l2\nl3 cursor"));
    CHECK(b - off == strlen("|here\nl4\n"));
    agent_rpc_fim_window(t, strlen(t), off, 2, 0, &a, &b);
    CHECK(a == (size_t)(strstr(t, "l1") - t));
    CHECK(b - off == strlen("|here\n"));
    agent_rpc_fim_window(t, strlen(t), off, 100, 100, &a, &b);
    CHECK(a == 0 && b == strlen(t));
    agent_rpc_fim_window(t, strlen(t), off, 0, 0, &a, &b);
    CHECK(a == (size_t)(strstr(t, "l3") - t));
}

int main(void) {
    test_classify();
    test_positions();
    test_documents();
    test_window();
    if (failures) {
        fprintf(stderr, "test_rpc_doc: %d check(s) failed\n", failures);
        return 1;
    }
    printf("test_rpc_doc: all checks passed\n");
    return 0;
}
