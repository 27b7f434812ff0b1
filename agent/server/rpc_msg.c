/* JSON-RPC 2.0 messages: classifying what a client sent, building what the server sends
 * (rpc_int.h). Pure: no server, fuzzed by tests/server/fuzz_rpc.c. */
#include "rpc_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void invalid(agent_rpc_msg *m, json_t *id, int code, const char *msg) {
    m->kind = RPC_MSG_INVALID;
    m->id = id;
    m->code = code;
    snprintf(m->message, sizeof m->message, "%s", msg);
}

void agent_rpc_msg_classify(agent_rpc_msg *m, json_t *root, const char *err) {
    memset(m, 0, sizeof *m);
    m->root = root;
    if (!root) {
        char msg[200];
        snprintf(msg, sizeof msg, "parse error: %s", err ? err : "not JSON");
        invalid(m, NULL, RPC_PARSE_ERROR, msg);
        return;
    }
    if (json_is_array(root)) {
        invalid(m, NULL, RPC_INVALID_REQUEST, "batches are not supported: send one message per "
                "frame");
        return;
    }
    if (!json_is_object(root)) {
        invalid(m, NULL, RPC_INVALID_REQUEST, "a message must be a JSON object");
        return;
    }
    json_t *id = json_object_get(root, "id");
    if (id && !json_is_string(id) && !json_is_integer(id)) {
        invalid(m, NULL, RPC_INVALID_REQUEST, "\"id\" must be a string or an integer");
        return;
    }
    const char *v = json_string_value(json_object_get(root, "jsonrpc"));
    if (!v || strcmp(v, "2.0")) {
        invalid(m, id, RPC_INVALID_REQUEST, "\"jsonrpc\" must be \"2.0\"");
        return;
    }
    json_t *method = json_object_get(root, "method");
    if (!method) {
        json_t *res = json_object_get(root, "result"), *er = json_object_get(root, "error");
        if (!id || (res && er) || (!res && !er)) {
            invalid(m, id, RPC_INVALID_REQUEST, "neither a request, a notification nor a "
                    "response (a response has an id and either result or error)");
            return;
        }
        m->kind = RPC_MSG_RESPONSE;
        m->id = id;
        m->result = res;
        m->error = er;
        return;
    }
    if (!json_is_string(method)) {
        invalid(m, id, RPC_INVALID_REQUEST, "\"method\" must be a string");
        return;
    }
    m->method = json_string_value(method);
    m->id = id;
    m->kind = id ? RPC_MSG_REQUEST : RPC_MSG_NOTIFICATION;
    json_t *params = json_object_get(root, "params");
    if (params && !json_is_null(params) && !json_is_object(params)) {
        if (id)
            invalid(m, id, json_is_array(params) ? RPC_INVALID_PARAMS : RPC_INVALID_REQUEST,
                    "\"params\" must be an object (parameters by name)");
        return; /* a notification with bad params: params stays NULL, ignored */
    }
    m->params = json_is_object(params) ? params : NULL;
}

void agent_rpc_msg_clear(agent_rpc_msg *m) {
    json_decref(m->root);
    memset(m, 0, sizeof *m);
}

char *agent_rpc_result(const json_t *id, json_t *result) {
    return agent_json_dump(json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id",
                                     id ? id : json_null(), "result",
                                     result ? result : json_null()));
}

char *agent_rpc_error(const json_t *id, int code, const char *message, json_t *data) {
    json_t *err = json_pack("{s:i, s:s}", "code", code, "message", message);
    if (err && data) json_object_set_new(err, "data", data);
    else json_decref(data);
    return agent_json_dump(json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id",
                                     id ? id : json_null(), "error", err));
}

char *agent_rpc_notification(const char *method, json_t *params) {
    return agent_json_dump(json_pack("{s:s, s:s, s:o}", "jsonrpc", "2.0", "method", method,
                                     "params", params ? params : json_object()));
}

