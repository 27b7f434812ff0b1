/* The remote backend: an OpenAI-compatible /chat/completions endpoint (vLLM, SGLang,
 * llama.cpp server, our own), streamed as server-sent events through libwebsockets' HTTP
 * client. Structured tool calls in the answer are turned into Hermes markup so that the loop
 * parses and validates them exactly like the engine's. */
#include "loop_int.h"
#include "sse_int.h"

#include <libwebsockets.h>
#include <stdlib.h>
#include <string.h>

/* Seconds a request may wait for the server's response to begin or continue. */
#define AGENT_REMOTE_TIMEOUT_S 600

typedef struct {
    agent_backend base;
    char *url;      /* scratch copy parsed by lws_parse_uri */
    char *host;
    char *path;     /* "/v1/chat/completions" */
    int port;
    bool tls;
    char *api_key;
    char *model;
    const char *tool_choice; /* static string or NULL */
} remote;

typedef struct {
    char *d;
    size_t n, cap;
} buf;

static int buf_add(buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 1024;
        while (nc < b->n + n + 1) nc *= 2;
        char *p = realloc(b->d, nc);
        if (!p) return -1;
        b->d = p;
        b->cap = nc;
    }
    memcpy(b->d + b->n, s, n);
    b->n += n;
    b->d[b->n] = 0;
    return 0;
}

/* One request's state, shared with the lws callback. */
typedef struct {
    remote *r;
    const agent_turn_opts *o;
    buf body;          /* request body */
    size_t sent;
    buf raw;           /* whole response (errors, non-streamed answers) */
    agent_sse sse;     /* the streamed answer (agent/sse.c) */
    int status;
    bool done, failed, oom;
    char err[512];
} req;

static int cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
              size_t len) {
    req *q = user;
    switch (reason) {
    case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
        snprintf(q->err, sizeof q->err, "cannot connect: %s", in ? (const char *)in : "?");
        q->failed = true;
        return -1;
    case LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER: {
        unsigned char **p = (unsigned char **)in, *end = (*p) + len;
        char auth[1100];
        if (q->r->api_key) {
            snprintf(auth, sizeof auth, "Bearer %s", q->r->api_key);
            if (lws_add_http_header_by_name(wsi, (const unsigned char *)"authorization:",
                                            (unsigned char *)auth, (int)strlen(auth), p, end))
                return -1;
        }
        if (lws_add_http_header_by_name(wsi, (const unsigned char *)"content-type:",
                                        (const unsigned char *)"application/json", 16, p, end) ||
            lws_add_http_header_by_name(wsi, (const unsigned char *)"accept:",
                                        (const unsigned char *)"text/event-stream", 17, p, end) ||
            lws_add_http_header_content_length(wsi, q->body.n, p, end))
            return -1;
        lws_client_http_body_pending(wsi, 1);
        lws_callback_on_writable(wsi);
        return 0;
    }
    case LWS_CALLBACK_CLIENT_HTTP_WRITEABLE: {
        size_t left = q->body.n - q->sent, chunk = left > 4096 ? 4096 : left;
        unsigned char tmp[LWS_PRE + 4096];
        memcpy(tmp + LWS_PRE, q->body.d + q->sent, chunk);
        bool last = chunk == left;
        if (lws_write(wsi, tmp + LWS_PRE, chunk, last ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP) !=
            (int)chunk)
            return -1;
        q->sent += chunk;
        if (last) lws_client_http_body_pending(wsi, 0);
        else lws_callback_on_writable(wsi);
        return 0;
    }
    case LWS_CALLBACK_ESTABLISHED_CLIENT_HTTP:
        q->status = (int)lws_http_client_http_response(wsi);
        return 0;
    case LWS_CALLBACK_RECEIVE_CLIENT_HTTP_READ:
        if (buf_add(&q->raw, in, len)) q->oom = true;
        if (q->status >= 200 && q->status < 300) {
            agent_sse_feed(&q->sse, in, len);
            if (q->sse.done) q->done = true;
        }
        if (q->o->cancel && *q->o->cancel) return -1;
        return 0;
    case LWS_CALLBACK_RECEIVE_CLIENT_HTTP: {
        char tmp[LWS_PRE + 4096], *px = tmp + LWS_PRE;
        int lenx = sizeof tmp - LWS_PRE;
        if (lws_http_client_read(wsi, &px, &lenx) < 0) return -1;
        return 0;
    }
    case LWS_CALLBACK_COMPLETED_CLIENT_HTTP:
    case LWS_CALLBACK_CLOSED_CLIENT_HTTP:
        q->done = true;
        return 0;
    default:
        break;
    }
    return lws_callback_http_dummy(wsi, reason, user, in, len);
}

static const struct lws_protocols PROTOCOLS[] = {{"spark-agent-http", cb, 0, 0, 0, NULL, 0},
                                                 {NULL, NULL, 0, 0, 0, NULL, 0}};

/* The conversation in OpenAI's wire form: tool-call arguments as strings, our extra fields
 * ("raw", "reasoning_content") left out. */
static json_t *wire_messages(json_t *msgs) {
    json_t *out = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        json_t *w = json_pack("{s:s, s:O}", "role", role ? role : "user", "content",
                              json_object_get(m, "content") ? json_object_get(m, "content")
                                                            : json_string(""));
        if (!w) continue;
        json_t *id = json_object_get(m, "tool_call_id");
        if (id) json_object_set(w, "tool_call_id", id);
        json_t *calls = json_object_get(m, "tool_calls");
        if (json_array_size(calls)) {
            json_t *wc = json_array();
            size_t k;
            json_t *c;
            json_array_foreach(calls, k, c) {
                json_t *f = json_object_get(c, "function");
                char *args = json_dumps(json_object_get(f, "arguments"), JSON_COMPACT |
                                        JSON_ENCODE_ANY);
                json_array_append_new(wc, json_pack("{s:O, s:s, s:{s:O, s:s}}", "id",
                                                    json_object_get(c, "id"), "type",
                                                    "function", "function", "name",
                                                    json_object_get(f, "name"), "arguments",
                                                    args ? args : "{}"));
                free(args);
            }
            json_object_set_new(w, "tool_calls", wc);
        }
        json_array_append_new(out, w);
    }
    return out;
}

static int remote_turn(agent_backend *b, json_t *msgs, const char *tools_json,
                       const agent_turn_opts *o, char **out, agent_turn_info *info) {
    remote *r = (remote *)b;
    memset(info, 0, sizeof *info);
    *out = NULL;
    req q;
    memset(&q, 0, sizeof q);
    q.r = r;
    q.o = o;
    if (agent_sse_init(&q.sse, o->on_text, o->user)) return AGENT_ENOMEM;
    json_t *body = json_pack("{s:s, s:o, s:b}", "model", r->model, "messages",
                             wire_messages(msgs), "stream", 1);
    if (tools_json) json_object_set_new(body, "tools", json_loads(tools_json, 0, NULL));
    if (tools_json && r->tool_choice)
        json_object_set_new(body, "tool_choice", json_string(r->tool_choice));
    if (o->max_tokens > 0) json_object_set_new(body, "max_tokens", json_integer(o->max_tokens));
    char *bj = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    int rc = 0;
    if (!bj || buf_add(&q.body, bj, strlen(bj))) {
        free(bj);
        rc = agent_err(AGENT_ENOMEM, "out of memory");
        goto done;
    }
    free(bj);
    lws_set_log_level(0, NULL); /* a library does not print; errors come back as messages */
    struct lws_context_creation_info ci;
    memset(&ci, 0, sizeof ci);
    ci.port = CONTEXT_PORT_NO_LISTEN;
    ci.protocols = PROTOCOLS;
    ci.gid = (gid_t)-1;
    ci.uid = (uid_t)-1;
    if (r->tls) ci.options |= LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
    /* a server answers a long prompt only after its prefill (minutes on a loaded CPU): lws's
     * default 20 s for the response closed such requests without a word. Ctrl-C still stops
     * the wait (the service loop checks the cancel flag) */
    ci.timeout_secs = AGENT_REMOTE_TIMEOUT_S;
    struct lws_context *ctx = lws_create_context(&ci);
    if (!ctx) {
        rc = agent_err(AGENT_EINTERNAL, "libwebsockets: cannot create a client context");
        goto done;
    }
    struct lws_client_connect_info cc;
    memset(&cc, 0, sizeof cc);
    cc.context = ctx;
    cc.address = r->host;
    cc.port = r->port;
    cc.path = r->path;
    /* Host names the port when it is not the scheme's (RFC 7230 5.4: servers that guard
     * against DNS rebinding, ours included, refuse a Host without it); no Origin header: this
     * is not a browser */
    char host_hdr[300];
    bool v6 = strchr(r->host, ':') != NULL;
    if (r->port == (r->tls ? 443 : 80))
        snprintf(host_hdr, sizeof host_hdr, v6 ? "[%s]" : "%s", r->host);
    else
        snprintf(host_hdr, sizeof host_hdr, v6 ? "[%s]:%d" : "%s:%d", r->host, r->port);
    cc.host = host_hdr;
    cc.method = "POST";
    cc.protocol = PROTOCOLS[0].name;
    cc.ssl_connection = r->tls ? LCCSCF_USE_SSL : 0;
    cc.userdata = &q;
    struct lws *wsi = NULL;
    cc.pwsi = &wsi;
    if (!lws_client_connect_via_info(&cc)) {
        lws_context_destroy(ctx);
        rc = agent_err(AGENT_EINVAL, "%s: cannot connect to %s:%d", r->url, r->host, r->port);
        goto done;
    }
    while (!q.done && !q.failed) {
        if (o->cancel && *o->cancel) break;
        if (lws_service(ctx, 0) < 0) break;
    }
    lws_context_destroy(ctx);
    agent_sse_finish(&q.sse);
    if (q.oom || q.sse.oom) {
        rc = agent_err(AGENT_ENOMEM, "out of memory reading the response");
        goto done;
    }
    if (o->cancel && *o->cancel) {
        rc = agent_err(AGENT_ECANCELED, "canceled");
    } else if (q.failed) {
        rc = agent_err(AGENT_EINVAL, "%s: %s", r->path, q.err);
        goto done;
    } else if (q.status == 0) {
        rc = agent_err(AGENT_EINVAL, "%s:%d%s: the connection closed without a response (no "
                       "answer within %d s, or the server reset it)", r->host, r->port, r->path,
                       AGENT_REMOTE_TIMEOUT_S);
        goto done;
    } else if (q.status < 200 || q.status >= 300) {
        rc = agent_err(AGENT_EINVAL, "%s:%d%s: HTTP %d: %.300s", r->host, r->port, r->path,
                       q.status, q.raw.d ? q.raw.d : "");
        goto done;
    } else if (q.sse.error[0]) {
        rc = agent_err(AGENT_EINVAL, "%s:%d%s: %s", r->host, r->port, r->path, q.sse.error);
        goto done;
    }
    /* the reply as text with Hermes markup for the structured calls */
    if (!(*out = agent_sse_reply(&q.sse))) {
        rc = agent_err(AGENT_ENOMEM, "out of memory");
        goto done;
    }
    info->tokens = q.sse.chunks;
    info->length = q.sse.finished_length;
done:
    free(q.body.d);
    free(q.raw.d);
    agent_sse_deinit(&q.sse);
    return rc;
}

static void remote_destroy(agent_backend *b) {
    remote *r = (remote *)b;
    free(r->url);
    free(r->host);
    free(r->path);
    free(r->api_key);
    free(r->model);
    free(r);
}

static agent_session *no_session(agent_backend *b) {
    (void)b;
    return NULL;
}

int agent_backend_remote_new(agent_backend **out, const char *base_url, const char *api_key,
                             const char *model) {
    if (!out || !base_url) return agent_err(AGENT_EINVAL, "agent_backend_remote_new: NULL");
    *out = NULL;
    remote *r = calloc(1, sizeof *r);
    if (!r) return agent_err(AGENT_ENOMEM, "out of memory");
    r->base.turn = remote_turn;
    r->base.destroy = remote_destroy;
    r->base.session = no_session;
    r->base.format = AGENT_TOOLCALL_HERMES;
    char *scratch = strdup(base_url);
    const char *prot = NULL, *addr = NULL, *path = NULL;
    int port = 0;
    if (!scratch || !(r->url = strdup(base_url)) ||
        !(r->model = strdup(model ? model : "default")) ||
        (api_key && !(r->api_key = strdup(api_key)))) {
        free(scratch);
        remote_destroy(&r->base);
        return agent_err(AGENT_ENOMEM, "out of memory");
    }
    if (lws_parse_uri(scratch, &prot, &addr, &port, &path) || !*addr ||
        (strcmp(prot, "http") && strcmp(prot, "https"))) {
        free(scratch);
        remote_destroy(&r->base);
        return agent_err(AGENT_EINVAL, "--model-url %s: expected http://HOST[:PORT]/PATH or "
                         "https://...", base_url);
    }
    r->tls = !strcmp(prot, "https");
    r->port = port;
    r->host = strdup(addr);
    size_t pl = strlen(path);
    while (pl && path[pl - 1] == '/') pl--;
    r->path = malloc(pl + 20);
    if (r->path) snprintf(r->path, pl + 20, "/%.*s/chat/completions", (int)pl, path);
    if (r->path && !pl) strcpy(r->path, "/chat/completions");
    free(scratch);
    if (!r->host || !r->path) {
        remote_destroy(&r->base);
        return agent_err(AGENT_ENOMEM, "out of memory");
    }
    *out = &r->base;
    return 0;
}

int agent_backend_remote_set_tool_choice(agent_backend *b, const char *choice) {
    static const char *const known[] = {"auto", "required", "none"};
    if (!b || b->turn != remote_turn)
        return agent_err(AGENT_EINVAL, "tool_choice: not a remote backend");
    if (!choice) {
        ((remote *)b)->tool_choice = NULL;
        return 0;
    }
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (!strcmp(choice, known[i])) {
            ((remote *)b)->tool_choice = known[i];
            return 0;
        }
    }
    return agent_err(AGENT_EINVAL, "tool_choice %.32s: expected auto, required or none", choice);
}
