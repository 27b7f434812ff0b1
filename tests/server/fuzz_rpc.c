/* Fuzz target: one WebSocket message as a client may send it. The JSON-RPC classifier and the
 * message builders, then, with the message's params, the open-document store (didOpen text,
 * didChange contentChanges in both position encodings) and the position helpers, with their
 * invariants checked. */
#include "server/rpc_int.h"

#include <stdlib.h>
#include <string.h>

#define REQUIRE(c)                                                                             \
    do {                                                                                       \
        if (!(c)) abort();                                                                     \
    } while (0)

static void documents(const json_t *params) {
    agent_rpc_docs *d;
    if (agent_rpc_docs_new(&d, 4, 1 << 16)) return;
    const char *seed = "s = \"\xF0\x9F\x98\x80\"\r\ndef f(x):\n\treturn x\r\rend";
    json_t *td = json_object_get(params, "textDocument");
    json_t *text = json_object_get(td, "text");
    const char *t = json_is_string(text) ? json_string_value(text) : seed;
    size_t tl = json_is_string(text) ? json_string_length(text) : strlen(seed);
    for (int utf8 = 0; utf8 < 2; utf8++) {
        if (agent_rpc_doc_open(d, "file:///a", 1, t, tl)) break;
        json_t *changes = json_object_get(params, "contentChanges");
        int rc = agent_rpc_doc_change(d, "file:///a", 2, changes, utf8);
        size_t len;
        const char *now = agent_rpc_doc_text(d, "file:///a", &len, NULL);
        REQUIRE(rc ? now == NULL : now != NULL);
        if (!now) continue;
        REQUIRE(len <= (1 << 16) && now[len] == 0);
        json_t *pos = json_object_get(params, "position");
        json_t *l = json_object_get(pos, "line"), *c = json_object_get(pos, "character");
        size_t off;
        if (json_is_integer(l) && json_is_integer(c) &&
            !agent_rpc_pos_offset(now, len, json_integer_value(l), json_integer_value(c), utf8,
                                  &off)) {
            REQUIRE(off <= len);
            int64_t pl, pc;
            agent_rpc_offset_pos(now, len, off, utf8, &pl, &pc);
            size_t back;
            /* the position of an offset leads back to it */
            REQUIRE(!agent_rpc_pos_offset(now, len, pl, pc, utf8, &back) && back == off);
            size_t a, b;
            agent_rpc_fim_window(now, len, off, json_integer_value(l) % 5, 3, &a, &b);
            REQUIRE(a <= off && off <= b && b <= len);
        }
    }
    agent_rpc_docs_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_error_t je;
    json_t *root = json_loadb((const char *)data, size, 0, &je);
    agent_rpc_msg m;
    agent_rpc_msg_classify(&m, root, root ? NULL : je.text);
    char *out = NULL;
    switch (m.kind) {
    case RPC_MSG_INVALID:
        REQUIRE(m.code < 0 && m.message[0]);
        out = agent_rpc_error(m.id, m.code, m.message, NULL);
        break;
    case RPC_MSG_REQUEST:
        REQUIRE(m.id && m.method);
        out = agent_rpc_result(m.id, json_incref(m.params));
        break;
    case RPC_MSG_RESPONSE:
        REQUIRE(m.id && (m.result || m.error) && !(m.result && m.error));
        out = agent_rpc_error(m.id, RPC_INTERNAL_ERROR, "x", json_incref(m.error));
        break;
    case RPC_MSG_NOTIFICATION:
        REQUIRE(m.method && !m.id);
        out = agent_rpc_notification(m.method, json_incref(m.params));
        break;
    }
    /* what the server sends is valid JSON */
    if (out) {
        json_t *back = json_loads(out, 0, &je);
        REQUIRE(back);
        json_decref(back);
    }
    free(out);
    if (m.params) documents(m.params);
    agent_rpc_msg_clear(&m);
    return 0;
}
