/* The WebSocket JSON-RPC front end (docs/protocol.md): message classification, the lifecycle,
 * documents, dispatch to the methods, cancellation and progress (rpc_int.h). */
#include "rpc_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ----- sending ----- */

void agent_rpc_send(agent_rpc_conn *c, char *text) {
    if (!text) {
        engine_log(ENGINE_LOG_WARN, "rpc: out of memory building a message for %s",
                   srv_conn_peer(c->c));
        return;
    }
    srv_ws_send(c->c, text, strlen(text));
    free(text);
}

void agent_rpc_reply(agent_rpc_conn *c, const json_t *id, json_t *result) {
    agent_rpc_send(c, agent_rpc_result(id, result));
}

void agent_rpc_reply_error(agent_rpc_conn *c, const json_t *id, int code, json_t *data,
                           const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    agent_rpc_send(c, agent_rpc_error(id, code, msg, data));
}

void agent_rpc_notify(agent_rpc_conn *c, const char *method, json_t *params) {
    agent_rpc_send(c, agent_rpc_notification(method, params));
}

/* ----- requests in flight ----- */

agent_rpc_call *agent_rpc_call_new(agent_rpc_conn *c, const json_t *id, const json_t *params) {
    agent_rpc_call *call = calloc(1, sizeof *call);
    if (!call) return NULL;
    call->conn = c;
    call->id = json_deep_copy(id);
    json_t *tok = json_object_get(params, "workDoneToken");
    if (json_is_string(tok) || json_is_integer(tok)) call->progress = json_deep_copy(tok);
    if (!call->id) {
        json_decref(call->progress);
        free(call);
        return NULL;
    }
    call->next = c->calls;
    c->calls = call;
    c->n_calls++;
    return call;
}

static void call_free(agent_rpc_call *call) {
    srv_job_release(call->job);
    if (call->free_state) call->free_state(call->state);
    json_decref(call->id);
    json_decref(call->progress);
    free(call);
}

void agent_rpc_call_end(agent_rpc_call *call) {
    agent_rpc_conn *c = call->conn;
    for (agent_rpc_call **p = &c->calls; *p; p = &(*p)->next)
        if (*p == call) {
            *p = call->next;
            c->n_calls--;
            break;
        }
    call_free(call);
}

static void call_cancel(agent_rpc_call *call) {
    if (call->cancelled) return;
    call->cancelled = true;
    if (call->on_cancel) call->on_cancel(call);
    else if (call->job) srv_job_cancel(call->job);
}

void agent_rpc_progress(agent_rpc_call *call, const char *kind, const char *title,
                        const char *message, int percentage) {
    if (!call->progress) return;
    json_t *v = json_pack("{s:s}", "kind", kind);
    if (!v) return;
    if (title) json_object_set_new(v, "title", json_string(title));
    if (message) json_object_set_new(v, "message", json_string(message));
    if (percentage >= 0) json_object_set_new(v, "percentage", json_integer(percentage));
    agent_rpc_notify(call->conn, "$/progress",
                     json_pack("{s:O, s:o}", "token", call->progress, "value", v));
}

/* ----- params ----- */

int agent_rpc_param_str(agent_rpc_conn *c, const json_t *id, const json_t *params,
                        const char *field, bool required, const char **out) {
    json_t *v = json_object_get(params, field);
    *out = NULL;
    if ((!v || json_is_null(v)) && !required) return 0;
    if (!json_is_string(v)) {
        agent_rpc_reply_error(c, id, RPC_INVALID_PARAMS, json_pack("{s:s}", "field", field),
                              "%s: %s", field, v ? "must be a string" : "required");
        return -1;
    }
    *out = json_string_value(v);
    return 0;
}

int agent_rpc_param_int(agent_rpc_conn *c, const json_t *id, const json_t *params,
                        const char *field, int64_t lo, int64_t hi, int64_t *out) {
    json_t *v = json_object_get(params, field);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        agent_rpc_reply_error(c, id, RPC_INVALID_PARAMS, json_pack("{s:s}", "field", field),
                              "%s: must be an integer in [%lld, %lld]", field, (long long)lo,
                              (long long)hi);
        return -1;
    }
    *out = json_integer_value(v);
    return 0;
}

/* ----- lifecycle ----- */

char *agent_rpc_uri_path(const char *uri) {
    if (strncmp(uri, "file://", 7)) return uri[0] == '/' ? strdup(uri) : NULL;
    const char *p = uri + 7;
    if (strncmp(p, "localhost/", 10) == 0) p += 9;
    if (*p != '/') return NULL;
    char *out = malloc(strlen(p) + 1), *o = out;
    if (!out) return NULL;
    for (; *p; p++) {
        if (*p == '%' && p[1] && p[2]) {
            char hex[3] = {p[1], p[2], 0};
            char *end;
            long v = strtol(hex, &end, 16);
            if (*end || v == 0) {
                free(out);
                return NULL;
            }
            *o++ = (char)v;
            p += 2;
        } else {
            *o++ = *p;
        }
    }
    *o = 0;
    return out;
}

int agent_rpc_folder_of(const agent_rpc_conn *c, const char *path, const char **rel) {
    size_t i;
    json_t *f;
    json_array_foreach(c->folders, i, f) {
        const char *root = json_string_value(json_object_get(f, "path"));
        size_t n = strlen(root);
        if (!strncmp(path, root, n) && (path[n] == '/' || path[n] == 0 || n == 1)) {
            if (rel) {
                const char *r = path + n;
                while (*r == '/') r++;
                *rel = r;
            }
            return (int)i;
        }
    }
    return -1;
}

static json_t *model_json(srv *s) {
    engine_model *m = srv_model(s);
    engine_model_info info;
    engine_model_info_get(m, &info);
    bool fim = true;
    const char *marks[] = {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"};
    for (size_t i = 0; i < 3; i++) {
        int32_t ids[4];
        size_t n = 0;
        if (engine_model_tokenize(m, marks[i], strlen(marks[i]), true, ids, 4, &n) || n != 1 ||
            !engine_model_token_is_special(m, ids[0]))
            fim = false;
    }
    const char *tpl = engine_model_chat_template(m);
    return json_pack("{s:s, s:s, s:i, s:b, s:s}", "id", srv_model_name(s), "architecture",
                     info.arch, "contextLength", info.n_ctx, "fim", fim, "toolCallFormat",
                     tpl && strstr(tpl, "<function=") ? "xml" : "hermes");
}

static void on_initialize(agent_rpc_conn *c, const json_t *id, const json_t *params) {
    if (c->phase != RPC_PHASE_NEW) {
        agent_rpc_reply_error(c, id, RPC_INVALID_REQUEST, NULL, "initialize was already done");
        return;
    }
    json_t *encs = json_object_get(json_object_get(json_object_get(params, "capabilities"),
                                                   "general"), "positionEncodings");
    const char *enc = "utf-16";
    size_t i;
    json_t *v;
    json_array_foreach(encs, i, v) {
        const char *e = json_string_value(v);
        if (e && (!strcmp(e, "utf-16") || !strcmp(e, "utf-8"))) {
            enc = e;
            break;
        }
    }
    c->utf8 = !strcmp(enc, "utf-8");
    json_t *folders = json_object_get(params, "workspaceFolders");
    json_t *list = json_array();
    if (!list) {
        agent_rpc_reply_error(c, id, RPC_INTERNAL_ERROR, NULL, "out of memory");
        return;
    }
    if (folders && !json_is_null(folders) && !json_is_array(folders)) {
        json_decref(list);
        agent_rpc_reply_error(c, id, RPC_INVALID_PARAMS,
                              json_pack("{s:s}", "field", "workspaceFolders"),
                              "workspaceFolders: must be an array of {uri, name}");
        return;
    }
    json_array_foreach(folders, i, v) {
        const char *uri = json_string_value(json_object_get(v, "uri"));
        const char *name = json_string_value(json_object_get(v, "name"));
        char *path = uri ? agent_rpc_uri_path(uri) : NULL;
        if (!path) {
            json_decref(list);
            agent_rpc_reply_error(c, id, RPC_INVALID_PARAMS,
                                  json_pack("{s:s}", "field", "workspaceFolders"),
                                  "workspaceFolders[%zu].uri: not a file:// URI", i);
            return;
        }
        size_t n = strlen(path);
        while (n > 1 && path[n - 1] == '/') path[--n] = 0;
        const char *base = strrchr(path, '/');
        json_array_append_new(list, json_pack("{s:s, s:s}", "path", path, "name",
                                              name ? name : base && base[1] ? base + 1 : "repo"));
        free(path);
    }
    json_decref(c->folders);
    c->folders = list;
    const char *client = json_string_value(json_object_get(json_object_get(params, "clientInfo"),
                                                           "name"));
    engine_log(ENGINE_LOG_INFO, "rpc: %s initialized %s (positions %s, %zu workspace folders)",
               srv_conn_peer(c->c), client ? client : "a client", enc, json_array_size(list));
    json_t *model = model_json(c->s);
    bool fim = json_is_true(json_object_get(model, "fim"));
    c->fim = fim;
    json_t *res = json_pack(
        "{s:i, s:{s:s, s:s}, s:s, s:{s:{s:b, s:i}, s:{s:b, s:b, s:b}, s:{s:b, s:b, s:[s, s]},"
        " s:{s:[s, s, s, s]}}, s:o, s:{s:I, s:i, s:I, s:i, s:i, s:i}}",
        "protocolVersion", RPC_PROTOCOL_VERSION, "serverInfo", "name", "spark-agent", "version",
        engine_version(), "positionEncoding", enc, "capabilities", "textDocumentSync", "openClose",
        true, "change", 2, "inlineCompletion", "fim", fim, "extraChunks", true, "cache", true,
        "chat", "streaming", true, "tools", true, "responseFormat", "text", "json_schema",
        "agent", "approvalModes", "read-only", "ask", "auto-edit", "full-auto", "model", model,
        "limits", "maxMessageBytes", (json_int_t)srv_limits_get(c->s)->max_ws_message,
        "maxOpenDocuments", RPC_MAX_OPEN_DOCS, "maxDocumentBytes", (json_int_t)RPC_MAX_DOC_BYTES,
        "maxConcurrentRequests", RPC_MAX_IN_FLIGHT, "maxCompletionTokens",
        RPC_MAX_COMPLETION_TOKENS, "maxExtraChunks", RPC_MAX_EXTRA_CHUNKS);
    if (!res) {
        agent_rpc_reply_error(c, id, RPC_INTERNAL_ERROR, NULL, "out of memory");
        return;
    }
    c->phase = RPC_PHASE_READY;
    agent_rpc_reply(c, id, res);
}

static void cancel_all(agent_rpc_conn *c) {
    for (agent_rpc_call *call = c->calls; call; call = call->next) call_cancel(call);
}

static void on_shutdown(agent_rpc_conn *c, const json_t *id) {
    cancel_all(c);
    agent_rpc_docs *fresh; /* drop every document */
    if (!agent_rpc_docs_new(&fresh, RPC_MAX_OPEN_DOCS, RPC_MAX_DOC_BYTES)) {
        agent_rpc_docs_free(c->docs);
        c->docs = fresh;
    }
    c->phase = RPC_PHASE_SHUTDOWN;
    agent_rpc_reply(c, id, json_null());
}

/* ----- documents ----- */

static void on_document(agent_rpc_conn *c, const char *method, const json_t *params) {
    json_t *td = json_object_get(params, "textDocument");
    const char *uri = json_string_value(json_object_get(td, "uri"));
    json_t *ver = json_object_get(td, "version");
    int rc;
    char why[400];
    if (!uri) {
        snprintf(why, sizeof why, "%s: textDocument.uri missing", method);
        rc = AGENT_EINVAL;
    } else if (!strcmp(method, "textDocument/didOpen")) {
        json_t *text = json_object_get(td, "text");
        if (!json_is_string(text) || !json_is_integer(ver)) {
            rc = agent_err(AGENT_EINVAL, "textDocument needs a string text and an integer "
                           "version");
        } else {
            rc = agent_rpc_doc_open(c->docs, uri, json_integer_value(ver), json_string_value(text),
                                    json_string_length(text));
        }
    } else if (!strcmp(method, "textDocument/didChange")) {
        if (!json_is_integer(ver)) {
            /* an unversioned change cannot be ordered: drop the document */
            agent_rpc_doc_close(c->docs, uri);
            rc = agent_err(AGENT_EINVAL, "textDocument.version: an integer is required");
        } else {
            rc = agent_rpc_doc_change(c->docs, uri, json_integer_value(ver),
                                      json_object_get(params, "contentChanges"), c->utf8);
        }
    } else {
        rc = agent_rpc_doc_close(c->docs, uri);
    }
    if (!rc) return;
    if (uri)
        snprintf(why, sizeof why, "%s %s: %s; the document was closed, open it again", method,
                 uri, agent_error_last());
    agent_rpc_notify(c, "window/logMessage", json_pack("{s:i, s:s}", "type", 1, "message", why));
}

static void on_document_text(agent_rpc_conn *c, const json_t *id, const json_t *params) {
    const char *uri = json_string_value(json_object_get(json_object_get(params, "textDocument"),
                                                        "uri"));
    if (!uri) {
        agent_rpc_reply_error(c, id, RPC_INVALID_PARAMS,
                              json_pack("{s:s}", "field", "textDocument.uri"),
                              "textDocument.uri: required");
        return;
    }
    size_t len;
    int64_t version;
    const char *text = agent_rpc_doc_text(c->docs, uri, &len, &version);
    if (!text) {
        agent_rpc_reply_error(c, id, RPC_DOCUMENT_NOT_OPEN, NULL, "%s is not open", uri);
        return;
    }
    agent_rpc_reply(c, id, json_pack("{s:I, s:o}", "version", (json_int_t)version, "text",
                                     agent_json_text(text, len)));
}

/* ----- dispatch ----- */

static void on_request(agent_rpc_conn *c, const agent_rpc_msg *m) {
    const char *meth = m->method;
    if (!strncmp(meth, "$/", 2)) {
        agent_rpc_reply_error(c, m->id, RPC_METHOD_NOT_FOUND, json_pack("{s:s}", "method", meth),
                              "%s is a notification, not a request", meth);
        return;
    }
    if (c->phase == RPC_PHASE_NEW && strcmp(meth, "initialize")) {
        agent_rpc_reply_error(c, m->id, RPC_SERVER_NOT_INITIALIZED, NULL,
                              "the first request must be initialize");
        return;
    }
    if (c->phase == RPC_PHASE_SHUTDOWN && strcmp(meth, "shutdown")) {
        agent_rpc_reply_error(c, m->id, RPC_INVALID_REQUEST, NULL,
                              "the connection is shutting down (shutdown was requested)");
        return;
    }
    if (!strcmp(meth, "initialize")) return on_initialize(c, m->id, m->params);
    if (!strcmp(meth, "shutdown")) return on_shutdown(c, m->id);
    if (!strcmp(meth, "spark/documentText")) return on_document_text(c, m->id, m->params);
    bool known = !strcmp(meth, "textDocument/inlineCompletion") ||
                 !strcmp(meth, "chat/completion") || !strcmp(meth, "agent/run");
    if (!known) {
        agent_rpc_reply_error(c, m->id, RPC_METHOD_NOT_FOUND, json_pack("{s:s}", "method", meth),
                              "unknown method %s", meth);
        return;
    }
    if (srv_draining(c->s)) {
        agent_rpc_reply_error(c, m->id, RPC_REQUEST_CANCELLED, NULL,
                              "the server is shutting down");
        return;
    }
    for (agent_rpc_call *call = c->calls; call; call = call->next)
        if (json_equal(call->id, m->id)) {
            agent_rpc_reply_error(c, m->id, RPC_INVALID_REQUEST, NULL,
                                  "a request with this id is still running");
            return;
        }
    if (c->n_calls >= RPC_MAX_IN_FLIGHT) {
        agent_rpc_reply_error(c, m->id, RPC_BUSY, NULL, "%d requests are in flight already",
                              c->n_calls);
        return;
    }
    if (!strcmp(meth, "textDocument/inlineCompletion")) agent_rpc_complete(c, m->id, m->params);
    else if (!strcmp(meth, "chat/completion")) agent_rpc_chat(c, m->id, m->params);
    else agent_rpc_agent_run(c, m->id, m->params);
}

static void on_notification(agent_rpc_conn *c, const agent_rpc_msg *m) {
    const char *meth = m->method;
    if (!strcmp(meth, "exit")) {
        cancel_all(c);
        srv_conn_close(c->c, 1000, "exit");
        return;
    }
    if (c->phase == RPC_PHASE_NEW) return; /* dropped before initialize */
    if (!strcmp(meth, "initialized")) return;
    if (!strcmp(meth, "$/cancelRequest")) {
        json_t *id = json_object_get(m->params, "id");
        for (agent_rpc_call *call = c->calls; id && call; call = call->next)
            if (json_equal(call->id, id)) {
                call_cancel(call);
                break;
            }
        return;
    }
    if (!strncmp(meth, "textDocument/did", 16) &&
        (!strcmp(meth + 16, "Open") || !strcmp(meth + 16, "Change") ||
         !strcmp(meth + 16, "Close"))) {
        if (c->phase == RPC_PHASE_READY) on_document(c, meth, m->params);
        return;
    }
    if (strncmp(meth, "$/", 2))
        engine_log(ENGINE_LOG_DEBUG, "rpc: %s sent the unknown notification %s",
                   srv_conn_peer(c->c), meth);
}

/* ----- the WebSocket handler ----- */

static void *ws_open(srv_conn *sc, void *user) {
    agent_rpc_conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->mod = user;
    c->s = srv_conn_server(sc);
    c->c = sc;
    c->conn_id = srv_conn_id(sc);
    c->folders = json_array();
    if (!c->folders || agent_rpc_docs_new(&c->docs, RPC_MAX_OPEN_DOCS, RPC_MAX_DOC_BYTES)) {
        json_decref(c->folders);
        free(c);
        return NULL;
    }
    return c;
}

static void ws_message(srv_conn *sc, void *state, const char *text, size_t len) {
    agent_rpc_conn *c = state;
    if (!c) {
        srv_conn_close(sc, 1011, "out of memory");
        return;
    }
    char err[160] = "";
    json_t *root = srv_json_parse(c->s, text, len, err);
    agent_rpc_msg m;
    agent_rpc_msg_classify(&m, root, err);
    switch (m.kind) {
    case RPC_MSG_INVALID: agent_rpc_reply_error(c, m.id, m.code, NULL, "%s", m.message); break;
    case RPC_MSG_RESPONSE: agent_rpc_agent_answer(c, m.id, m.result, m.error); break;
    case RPC_MSG_NOTIFICATION: on_notification(c, &m); break;
    case RPC_MSG_REQUEST: on_request(c, &m); break;
    }
    agent_rpc_msg_clear(&m);
}

static void ws_close(srv_conn *sc, void *state) {
    (void)sc;
    agent_rpc_conn *c = state;
    if (!c) return;
    agent_rpc_agent_close(c);
    /* the client is gone: stop the work, answer nobody */
    while (c->calls) {
        agent_rpc_call *call = c->calls;
        c->calls = call->next;
        call->cancelled = true;
        call_free(call);
    }
    agent_rpc_docs_free(c->docs);
    agent_rpc_cache_free(c->cache);
    json_decref(c->folders);
    free(c);
}

int srv_rpc_init(srv *s) {
    agent_rpc_module *m;
    int rc = agent_rpc_module_new(&m, s);
    if (rc) return rc;
    srv_ws_handler h = {ws_open, ws_message, ws_close, m};
    srv_ws_handler_set(s, &h);
    return 0;
}
