/* The server core: one libwebsockets context, one listener for HTTP and WebSocket, one service
 * thread. Requests are checked (Host, Origin, token, sizes, JSON depth) before a route sees
 * them; responses are buffered per request and written when the socket is writable; other
 * threads reach the loop through a locked post queue and lws_cancel_service(). */
#include "server_int.h"
#include "server_core.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <libwebsockets.h>

#define SRV_WS_PROTOCOL "spark-agent.jsonrpc.v1"
#define SRV_WS_TOKEN_PREFIX "spark-agent.token."
#define SRV_CHUNK 16384

typedef struct {
    char method[8];
    char path[128];
    srv_route_fn fn;
    int flags;
} srv_route;

int srv_buf_add(srv_buf *b, const void *d, size_t n) {
    if (b->off && b->off == b->len) b->off = b->len = 0;
    if (b->len + n + 1 > b->cap) {
        if (b->off > b->cap / 2) { /* compact before growing */
            memmove(b->p, b->p + b->off, b->len - b->off);
            b->len -= b->off;
            b->off = 0;
        }
        size_t cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > cap)
            cap *= 2;
        if (cap != b->cap) {
            char *p = realloc(b->p, cap);
            if (!p) return agent_err(AGENT_ENOMEM, "out of memory");
            b->p = p;
            b->cap = cap;
        }
    }
    if (n) memcpy(b->p + b->len, d, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int srv_buf_printf(srv_buf *b, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return agent_err(AGENT_EINVAL, "srv_buf_printf: bad format");
    if ((size_t)n < sizeof small) return srv_buf_add(b, small, (size_t)n);
    char *big = malloc((size_t)n + 1);
    if (!big) return agent_err(AGENT_ENOMEM, "out of memory");
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    int rc = srv_buf_add(b, big, (size_t)n);
    free(big);
    return rc;
}

void srv_buf_free(srv_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

static size_t sbuf_pending(const srv_buf *b) {
    return b->len - b->off;
}

struct srv_req {
    srv *s;
    struct lws *wsi;
    char method[8];
    char path[512];
    char query[1024];
    char peer[64];
    char origin[256]; /* an allowed Origin to answer CORS for, or "" */
    const srv_route *route;
    srv_buf body;
    size_t body_expected;
    bool body_done;
    bool drain;       /* refused before its body was read: the body is read and dropped, then
                       * the refusal is written (a response sent while the client still sends
                       * ends in a reset that can lose it) */
    size_t drained;
    json_t *json;
    /* response */
    int status;
    bool started, stream, finished, gone, close_after, counted;
    unsigned char *hdr; /* LWS_PRE + headers */
    size_t hdr_len, hdr_cap;
    bool hdr_sent;
    srv_buf out;
    void (*cleanup)(srv_req *r, void *user);
    void *cleanup_user;
    double t0;
};

typedef struct msg {
    struct msg *next;
    size_t len;
    char text[];
} msg;

struct srv_conn {
    srv *s;
    struct lws *wsi;
    uint64_t id;
    char peer[64];
    void *state;
    srv_buf rx;
    bool rx_too_big;
    msg *q_head, *q_tail;
    size_t q_bytes;
    bool closing;
    int close_code;
    char close_reason[96];
    struct srv_conn *next;
};

typedef struct post {
    struct post *next;
    void (*fn)(srv *s, void *arg);
    void *arg;
    uint64_t conn; /* fn == NULL: a message for this connection */
    size_t len;
    char text[];
} post;

typedef struct {
    struct lws *wsi;
    int peer; /* index into peers */
} conn_rec;

typedef struct {
    char addr[64];
    int n;
} peer_rec;

/* Per-connection data lws allocates for our protocol. */
typedef struct {
    srv_req *req;
    srv_conn *conn;
} pss;

struct srv {
    struct lws_context *ctx;
    struct lws_vhost *vh;
    engine_model *model;
    char model_name[256];
    char token[256];
    char host[256];
    int port;
    bool listen_public;
    char **allow_hosts, **allow_origins;
    srv_limits lim;
    int drain_timeout_s;
    srv_route *routes;
    int n_routes, cap_routes;
    srv_ws_handler ws;
    bool has_ws;
    srv_conn *conns;
    uint64_t next_conn_id;
    int n_ws, n_http;
    conn_rec *recs;
    int n_recs, cap_recs;
    peer_rec *peers;
    int n_peers, cap_peers;
    srv_metrics *metrics;
    srv_chat *chat;
    void (*at_free)(srv *s, void *arg);
    void *at_free_arg;
    /* cross-thread */
    pthread_mutex_t mu;
    post *posts_head, *posts_tail;
    bool closed; /* no more posts */
    volatile sig_atomic_t stop_requested;
    /* service thread */
    bool draining, canceled_all, exit_loop;
    double drain_deadline;
    lws_sorted_usec_list_t tick;
    unsigned char scratch[LWS_PRE + SRV_CHUNK];
    struct lws_protocols protocols[2];
    lws_retry_bo_t retry;
};

double srv_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ----- accessors --------------------------------------------------------------------------- */
const srv_limits *srv_limits_get(const srv *s) {
    return &s->lim;
}
engine_model *srv_model(const srv *s) {
    return s->model;
}
const char *srv_model_name(const srv *s) {
    return s->model_name;
}
bool srv_draining(const srv *s) {
    /* from the signal on, even before the loop's wake-up has begun the drain: a request the
     * same loop pass reads must not slip through */
    return s->draining || s->stop_requested;
}
srv_metrics *srv_metrics_of(srv *s) {
    return s->metrics;
}
srv_chat *srv_chat_of(srv *s) {
    return s->chat;
}
int srv_http_connections(const srv *s) {
    return s->n_http;
}
int srv_ws_connections(const srv *s) {
    return s->n_ws;
}

const char *srv_req_method(const srv_req *r) {
    return r->method;
}
const char *srv_req_path(const srv_req *r) {
    return r->path;
}
const char *srv_req_query(const srv_req *r) {
    return r->query;
}
json_t *srv_req_json(const srv_req *r) {
    return r->json;
}
srv *srv_req_server(const srv_req *r) {
    return r->s;
}
const char *srv_req_peer(const srv_req *r) {
    return r->peer;
}
bool srv_req_gone(const srv_req *r) {
    return r->gone;
}

const char *srv_req_body(const srv_req *r, size_t *len) {
    if (len) *len = r->body.len;
    return r->body.p ? r->body.p : "";
}

uint64_t srv_conn_id(const srv_conn *c) {
    return c->id;
}
srv *srv_conn_server(const srv_conn *c) {
    return c->s;
}
const char *srv_conn_peer(const srv_conn *c) {
    return c->peer;
}

/* ----- routes ------------------------------------------------------------------------------ */
int srv_route_add(srv *s, const char *method, const char *path, srv_route_fn fn, int flags) {
    if (!method || !path || !fn || strlen(method) >= 8 || strlen(path) >= 128)
        return agent_err(AGENT_EINVAL, "srv_route_add: bad route");
    if (s->n_routes == s->cap_routes) {
        int cap = s->cap_routes ? s->cap_routes * 2 : 16;
        srv_route *r = realloc(s->routes, (size_t)cap * sizeof *r);
        if (!r) return agent_err(AGENT_ENOMEM, "out of memory");
        s->routes = r;
        s->cap_routes = cap;
    }
    srv_route *r = &s->routes[s->n_routes++];
    snprintf(r->method, sizeof r->method, "%s", method);
    snprintf(r->path, sizeof r->path, "%s", path);
    r->fn = fn;
    r->flags = flags;
    return 0;
}

int srv_at_free(srv *s, void (*fn)(srv *s, void *arg), void *arg) {
    if (s->at_free) return agent_err(AGENT_EINVAL, "srv_at_free: the slot is taken");
    s->at_free = fn;
    s->at_free_arg = arg;
    return 0;
}

void srv_ws_handler_set(srv *s, const srv_ws_handler *h) {
    s->ws = *h;
    s->has_ws = true;
}

/* ----- JSON -------------------------------------------------------------------------------- */

/* Nesting depth of JSON text, counted outside strings (jansson's own limit is 2048). */
static int json_depth(const char *t, size_t n) {
    int d = 0, max = 0;
    bool str = false;
    for (size_t i = 0; i < n; i++) {
        char c = t[i];
        if (str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                str = false;
        } else if (c == '"') {
            str = true;
        } else if (c == '[' || c == '{') {
            if (++d > max) max = d;
        } else if (c == ']' || c == '}') {
            d--;
        }
    }
    return max;
}

json_t *srv_json_parse(const srv *s, const char *text, size_t len, char err[160]) {
    int d = json_depth(text, len);
    if (d > s->lim.max_json_depth) {
        snprintf(err, 160, "JSON nested %d deep (limit %d)", d, s->lim.max_json_depth);
        return NULL;
    }
    json_error_t je;
    json_t *j = json_loadb(text, len, 0, &je);
    if (!j)
        snprintf(err, 160, "malformed JSON: line %d column %d: %.80s", je.line, je.column, je.text);
    return j;
}

/* ----- responses --------------------------------------------------------------------------- */
static void req_writable(srv_req *r) {
    if (r->wsi && !r->gone) lws_callback_on_writable(r->wsi);
}

static void req_drop(srv_req *r, const char *why) {
    if (r->gone || !r->wsi) return;
    engine_log(ENGINE_LOG_WARN, "serve: dropping %s %s from %s: %s", r->method, r->path, r->peer,
               why);
    r->close_after = true;
    r->gone = true;
    lws_set_timeout(r->wsi, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_ASYNC);
}

static int req_headers(srv_req *r, int status, const char *ctype, size_t content_len, bool stream) {
    if (r->started) return agent_err(AGENT_EINVAL, "response already started");
    if (r->gone) return agent_err(AGENT_EINVAL, "client gone");
    r->hdr_cap = LWS_PRE + 2048;
    r->hdr = malloc(r->hdr_cap);
    if (!r->hdr) return agent_err(AGENT_ENOMEM, "out of memory");
    unsigned char *start = r->hdr + LWS_PRE, *p = start, *end = r->hdr + r->hdr_cap - 1;
    struct lws *w = r->wsi;
    if (lws_add_http_common_headers(w, (unsigned)status, ctype,
                                    stream ? LWS_ILLEGAL_HTTP_CONTENT_LEN : content_len, &p, end))
        goto fail;
    static const char nosniff[] = "nosniff", nostore[] = "no-store";
    if (lws_add_http_header_by_name(w, (const unsigned char *)"x-content-type-options:",
                                    (const unsigned char *)nosniff, sizeof nosniff - 1, &p, end))
        goto fail;
    if (stream && lws_add_http_header_by_name(
                      w, (const unsigned char *)"cache-control:", (const unsigned char *)nostore,
                      sizeof nostore - 1, &p, end))
        goto fail;
    if (r->origin[0]) {
        /* an explicitly allowed Origin, never reflected blindly and never with credentials */
        if (lws_add_http_header_by_name(w, (const unsigned char *)"access-control-allow-origin:",
                                        (const unsigned char *)r->origin, (int)strlen(r->origin),
                                        &p, end) ||
            lws_add_http_header_by_name(
                w, (const unsigned char *)"vary:", (const unsigned char *)"Origin", 6, &p, end))
            goto fail;
    }
    if (r->close_after && !stream &&
        lws_add_http_header_by_name(
            w, (const unsigned char *)"connection:", (const unsigned char *)"close", 5, &p, end))
        goto fail;
    if (lws_finalize_http_header(w, &p, end)) goto fail;
    r->hdr_len = (size_t)(p - start);
    r->status = status;
    r->started = true;
    r->stream = stream;
    if (r->s->metrics && !r->counted) {
        r->counted = true;
        srv_metrics_request(r->s->metrics, r->route ? r->route->path : "other", status);
    }
    /* a stream may stay quiet for long (queueing, a long prefill): no timeout while it runs
     * (lws_http_mark_sse would do the same but only knows h2) */
    if (stream) lws_set_timeout(w, NO_PENDING_TIMEOUT, 0);
    req_writable(r);
    return 0;
fail:
    free(r->hdr);
    r->hdr = NULL;
    return agent_err(AGENT_EINTERNAL, "response headers do not fit");
}

int srv_reply_raw(srv_req *r, int status, const char *ctype, const char *body, size_t len) {
    if (r->gone) return 0;
    int rc = req_headers(r, status, ctype, len, false);
    if (rc) return rc;
    if (len && srv_buf_add(&r->out, body, len)) return agent_err(AGENT_ENOMEM, "out of memory");
    r->finished = true;
    return 0;
}

int srv_reply_json(srv_req *r, int status, json_t *body) {
    char *t = body ? json_dumps(body, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(body);
    if (!t) return agent_err(AGENT_ENOMEM, "out of memory");
    int rc = srv_reply_raw(r, status, "application/json", t, strlen(t));
    free(t);
    return rc;
}

int srv_reply_error(srv_req *r, int status, const char *type, const char *code, const char *fmt,
                    ...) {
    char m[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    json_t *e = json_pack("{s:{s:s, s:s, s:n, s:s?}}", "error", "message", m, "type", type, "param",
                          "code", code);
    if (!e) return agent_err(AGENT_ENOMEM, "out of memory");
    return srv_reply_json(r, status, e);
}

int srv_stream_start(srv_req *r, int status, const char *ctype) {
    if (r->gone) return agent_err(AGENT_EINVAL, "client gone");
    return req_headers(r, status, ctype, 0, true);
}

int srv_stream_write(srv_req *r, const char *data, size_t len) {
    if (r->gone) return agent_err(AGENT_EINVAL, "client gone");
    if (!r->started || !r->stream || r->finished)
        return agent_err(AGENT_EINVAL, "srv_stream_write: no open stream");
    if (srv_buf_add(&r->out, data, len)) return agent_err(AGENT_ENOMEM, "out of memory");
    if (sbuf_pending(&r->out) > r->s->lim.max_pending_out) {
        req_drop(r, "the client does not read its stream");
        return agent_err(AGENT_EINVAL, "client too slow");
    }
    req_writable(r);
    return 0;
}

int srv_sse_send(srv_req *r, const char *event, const char *data, size_t len) {
    char head[160];
    int n = event ? snprintf(head, sizeof head, "event: %s\ndata: ", event)
                  : snprintf(head, sizeof head, "data: ");
    if (n < 0 || (size_t)n >= sizeof head) return agent_err(AGENT_EINVAL, "event name too long");
    int rc = srv_stream_write(r, head, (size_t)n);
    if (!rc) rc = srv_stream_write(r, data, len);
    if (!rc) rc = srv_stream_write(r, "\n\n", 2);
    return rc;
}

int srv_sse_json(srv_req *r, const char *event, json_t *data) {
    char *t = json_dumps(data, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!t) return agent_err(AGENT_ENOMEM, "out of memory");
    int rc = srv_sse_send(r, event, t, strlen(t));
    free(t);
    return rc;
}

void srv_stream_end(srv_req *r) {
    r->finished = true;
    req_writable(r);
}

void srv_req_hold(srv_req *r, void (*cleanup)(srv_req *r, void *user), void *user) {
    r->cleanup = cleanup;
    r->cleanup_user = user;
    if (r->wsi) lws_set_timeout(r->wsi, NO_PENDING_TIMEOUT, 0);
}

const char *srv_req_header(srv_req *r, const char *name) {
    static _Thread_local char v[4096];
    if (!r->wsi || r->gone) return NULL;
    char key[128];
    int n = snprintf(key, sizeof key, "%s:", name);
    if (n <= 1 || (size_t)n >= sizeof key) return NULL;
    for (int i = 0; key[i]; i++)
        if (key[i] >= 'A' && key[i] <= 'Z') key[i] = (char)(key[i] - 'A' + 'a');
    /* the headers lws parses itself are not in its custom-header list */
    static const struct {
        const char *name;
        enum lws_token_indexes tok;
    } known[] = {
        {"content-type:", WSI_TOKEN_HTTP_CONTENT_TYPE},
        {"authorization:", WSI_TOKEN_HTTP_AUTHORIZATION},
        {"user-agent:", WSI_TOKEN_HTTP_USER_AGENT},
        {"accept:", WSI_TOKEN_HTTP_ACCEPT},
        {"host:", WSI_TOKEN_HOST},
        {"origin:", WSI_TOKEN_ORIGIN},
        {"content-length:", WSI_TOKEN_HTTP_CONTENT_LENGTH},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (strcmp(known[i].name, key)) continue;
        if (lws_hdr_total_length(r->wsi, known[i].tok) <= 0) return NULL;
        return lws_hdr_copy(r->wsi, v, sizeof v, known[i].tok) < 0 ? NULL : v;
    }
    if (lws_hdr_custom_length(r->wsi, key, n) < 0) return NULL;
    return lws_hdr_custom_copy(r->wsi, v, sizeof v, key, n) < 0 ? NULL : v;
}

/* ----- security checks --------------------------------------------------------------------- */
static bool ct_equal(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned char d = (unsigned char)(la != lb);
    for (size_t i = 0; i < la && i < lb; i++)
        d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

static bool list_has(char **list, const char *v) {
    for (size_t i = 0; list && list[i]; i++)
        if (!strcasecmp(list[i], v)) return true;
    return false;
}

/* Host: an IP literal or "localhost" with our port (not reachable by DNS rebinding: a rebound
 * name arrives with the attacker's host name), or a name allowed explicitly. */
static bool host_ok(srv *s, const char *h) {
    if (list_has(s->allow_hosts, h)) return true;
    char name[256];
    const char *colon = h[0] == '[' ? strstr(h, "]:") : strrchr(h, ':');
    size_t nl = colon ? (size_t)(colon - h) + (h[0] == '[') : strlen(h);
    if (nl >= sizeof name) return false;
    memcpy(name, h, nl);
    name[nl] = 0;
    if (colon) {
        const char *ps = colon + (h[0] == '[' ? 2 : 1);
        char *e;
        long port = strtol(ps, &e, 10);
        if (*e || port != s->port) return false;
    } else if (s->port != 80) {
        return false;
    }
    if (!strcasecmp(name, "localhost")) return true;
    unsigned char tmp[16];
    if (inet_pton(AF_INET, name, tmp) == 1) return true;
    if (name[0] == '[' && nl > 2) {
        name[nl - 1] = 0;
        if (inet_pton(AF_INET6, name + 1, tmp) == 1) return true;
    }
    return false;
}

/* Origin: absent (not a browser), or our own loopback origin, or allowed explicitly. */
static bool origin_ok(srv *s, const char *o, bool *explicit_allowed) {
    *explicit_allowed = false;
    if (list_has(s->allow_origins, o)) {
        *explicit_allowed = true;
        return true;
    }
    char own[3][64];
    snprintf(own[0], sizeof own[0], "http://127.0.0.1:%d", s->port);
    snprintf(own[1], sizeof own[1], "http://localhost:%d", s->port);
    snprintf(own[2], sizeof own[2], "http://[::1]:%d", s->port);
    for (int i = 0; i < 3; i++)
        if (!strcasecmp(o, own[i])) return true;
    return false;
}

static int hdr(struct lws *w, enum lws_token_indexes t, char *buf, int cap) {
    if (lws_hdr_total_length(w, t) <= 0) {
        buf[0] = 0;
        return 0;
    }
    if (lws_hdr_copy(w, buf, cap, t) < 0) return -1;
    return 1;
}

/* The token from Authorization: Bearer, x-api-key, or (WebSocket only) an offered subprotocol
 * "spark-agent.token.<token>". */
static bool token_ok(srv *s, struct lws *w, bool ws) {
    char v[512];
    if (hdr(w, WSI_TOKEN_HTTP_AUTHORIZATION, v, sizeof v) > 0) {
        if (!strncasecmp(v, "Bearer ", 7)) {
            const char *t = v + 7;
            while (*t == ' ')
                t++;
            return ct_equal(t, s->token);
        }
        return false;
    }
    static const char xk[] = "x-api-key:";
    if (lws_hdr_custom_length(w, xk, (int)sizeof xk - 1) > 0 &&
        lws_hdr_custom_copy(w, v, sizeof v, xk, (int)sizeof xk - 1) >= 0)
        return ct_equal(v, s->token);
    if (ws && hdr(w, WSI_TOKEN_PROTOCOL, v, sizeof v) > 0) {
        char *save = NULL;
        for (char *t = strtok_r(v, ", ", &save); t; t = strtok_r(NULL, ", ", &save))
            if (!strncmp(t, SRV_WS_TOKEN_PREFIX, sizeof SRV_WS_TOKEN_PREFIX - 1))
                return ct_equal(t + sizeof SRV_WS_TOKEN_PREFIX - 1, s->token);
    }
    return false;
}

/* Host, Origin and token for a request or a WebSocket handshake. 0 when allowed, else the HTTP
 * status to refuse with and *why. */
static int check_access(srv *s, struct lws *w, bool ws, char *origin_out, size_t ocap,
                        const char **why) {
    char v[512];
    origin_out[0] = 0;
    if (hdr(w, WSI_TOKEN_HOST, v, sizeof v) <= 0) {
        *why = "missing or oversized Host header";
        return 400;
    }
    if (!host_ok(s, v)) {
        *why = "Host not allowed (start the server with --allow-host to accept it)";
        return 403;
    }
    int o = hdr(w, WSI_TOKEN_ORIGIN, v, sizeof v);
    if (o < 0) {
        *why = "oversized Origin header";
        return 403;
    }
    if (o > 0) {
        bool explicit_allowed;
        if (!origin_ok(s, v, &explicit_allowed)) {
            *why = "Origin not allowed (start the server with --allow-origin to accept it)";
            return 403;
        }
        if (explicit_allowed) snprintf(origin_out, ocap, "%s", v);
    }
    if (!token_ok(s, w, ws)) {
        *why = "missing or wrong token (Authorization: Bearer <token> or x-api-key)";
        return 401;
    }
    return 0;
}

/* ----- connection accounting ---------------------------------------------------------------- */
static int peer_index(srv *s, const char *addr, bool add) {
    for (int i = 0; i < s->n_peers; i++)
        if (!strcmp(s->peers[i].addr, addr)) return i;
    if (!add) return -1;
    for (int i = 0; i < s->n_peers; i++)
        if (s->peers[i].n == 0) {
            snprintf(s->peers[i].addr, sizeof s->peers[i].addr, "%s", addr);
            return i;
        }
    if (s->n_peers == s->cap_peers) {
        int cap = s->cap_peers ? s->cap_peers * 2 : 16;
        peer_rec *p = realloc(s->peers, (size_t)cap * sizeof *p);
        if (!p) return -1;
        s->peers = p;
        s->cap_peers = cap;
    }
    peer_rec *p = &s->peers[s->n_peers];
    snprintf(p->addr, sizeof p->addr, "%s", addr);
    p->n = 0;
    return s->n_peers++;
}

static void addr_string(const struct sockaddr_storage *a, char *out, size_t cap) {
    out[0] = 0;
    if (a->ss_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)a)->sin_addr, out, (socklen_t)cap);
    else if (a->ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)a)->sin6_addr, out, (socklen_t)cap);
}

static void conn_count(srv *s, struct lws *w) {
    char addr[64];
    lws_get_peer_simple(w, addr, sizeof addr);
    int pi = peer_index(s, addr, true);
    if (pi < 0) return;
    if (s->n_recs == s->cap_recs) {
        int cap = s->cap_recs ? s->cap_recs * 2 : 64;
        conn_rec *r = realloc(s->recs, (size_t)cap * sizeof *r);
        if (!r) return;
        s->recs = r;
        s->cap_recs = cap;
    }
    s->recs[s->n_recs++] = (conn_rec){w, pi};
    s->peers[pi].n++;
}

static void conn_uncount(srv *s, struct lws *w) {
    for (int i = 0; i < s->n_recs; i++) {
        if (s->recs[i].wsi != w) continue;
        s->peers[s->recs[i].peer].n--;
        s->recs[i] = s->recs[--s->n_recs];
        return;
    }
}

/* ----- HTTP requests ----------------------------------------------------------------------- */
static void req_free(pss *ps) {
    srv_req *r = ps ? ps->req : NULL;
    if (!r) return;
    ps->req = NULL;
    r->gone = true;
    if (r->cleanup) {
        void (*fn)(srv_req *, void *) = r->cleanup;
        r->cleanup = NULL;
        fn(r, r->cleanup_user);
    }
    json_decref(r->json);
    srv_buf_free(&r->body);
    srv_buf_free(&r->out);
    free(r->hdr);
    free(r);
}

static const srv_route *route_find(srv *s, const char *method, const char *path, bool *path_known) {
    *path_known = false;
    for (int i = 0; i < s->n_routes; i++) {
        if (strcmp(s->routes[i].path, path)) continue;
        *path_known = true;
        if (!strcmp(s->routes[i].method, method)) return &s->routes[i];
    }
    return NULL;
}

static void dispatch(srv_req *r) {
    srv *s = r->s;
    if (r->route->flags & SRV_ROUTE_JSON) {
        char err[160];
        r->json = srv_json_parse(s, r->body.p ? r->body.p : "", r->body.len, err);
        if (!r->json) {
            srv_reply_error(r, 400, "invalid_request_error", "invalid_json", "%s", err);
            return;
        }
        if (!json_is_object(r->json)) {
            srv_reply_error(r, 400, "invalid_request_error", "invalid_json",
                            "the request body must be a JSON object");
            return;
        }
    }
    if (srv_draining(s) && !(r->route->flags & SRV_ROUTE_NO_DRAIN)) {
        srv_reply_error(r, 503, "server_error", "shutting_down", "the server is shutting down");
        return;
    }
    int rc = r->route->fn(r);
    if (rc < 0 && !r->started && !r->gone)
        srv_reply_error(r, 500, "server_error", NULL, "%s", agent_error_last());
    else if (!r->started && !r->cleanup && !r->gone)
        srv_reply_error(r, 500, "server_error", NULL, "the handler gave no answer");
}

/* A request refused before its body was read: read the body (up to SRV_DRAIN_MAX bytes, within
 * the idle timeout) and drop it before the refusal is written, so that a client still sending
 * sees the answer instead of a connection reset. Not for a client that waits for "100
 * Continue" (it sends nothing until answered) or a larger body (answered at once, best
 * effort). */
#define SRV_DRAIN_MAX (64u << 20)
static void refuse_after_body(srv *s, srv_req *r, struct lws *w) {
    char cl[32], ex[64];
    if (hdr(w, WSI_TOKEN_HTTP_CONTENT_LENGTH, cl, sizeof cl) <= 0) return;
    if (hdr(w, WSI_TOKEN_HTTP_EXPECT, ex, sizeof ex) != 0) return;
    char *e;
    unsigned long long n = strtoull(cl, &e, 10);
    if (*e || cl[0] == '-' || n == 0 || n > SRV_DRAIN_MAX) return;
    r->drain = true;
    r->body_expected = (size_t)n;
    lws_set_timeout(w, PENDING_TIMEOUT_HTTP_CONTENT, s->lim.idle_timeout_s);
}

static int on_http(srv *s, pss *ps, struct lws *w, const char *uri) {
    req_free(ps); /* a previous transaction on a kept-alive connection */
    srv_req *r = calloc(1, sizeof *r);
    if (!r) return -1;
    ps->req = r;
    r->s = s;
    r->wsi = w;
    r->t0 = srv_now_ms();
    lws_get_peer_simple(w, r->peer, sizeof r->peer);
    char *muri;
    int mlen;
    int m = lws_http_get_uri_and_method(w, &muri, &mlen);
    static const char *names[] = {"GET",   "POST",   "OPTIONS", "PUT",
                                  "PATCH", "DELETE", "CONNECT", "HEAD"};
    snprintf(r->method, sizeof r->method, "%s",
             m >= 0 && m < (int)(sizeof names / sizeof names[0]) ? names[m] : "?");
    snprintf(r->path, sizeof r->path, "%s", uri && *uri ? uri : "/");
    /* the query: lws splits it into '&'-separated fragments */
    size_t ql = 0;
    char frag[512];
    for (int i = 0; lws_hdr_copy_fragment(w, frag, sizeof frag, WSI_TOKEN_HTTP_URI_ARGS, i) > 0;
         i++) {
        int n = snprintf(r->query + ql, sizeof r->query - ql, "%s%s", i ? "&" : "", frag);
        if (n < 0 || (size_t)n >= sizeof r->query - ql) break;
        ql += (size_t)n;
    }
    bool explicit_origin = false;
    char origin[256];
    const char *why = NULL;
    int deny;
    if (!strcmp(r->method, "OPTIONS")) {
        /* CORS preflight: only for an Origin allowed explicitly (never reflected) */
        int o = hdr(w, WSI_TOKEN_ORIGIN, origin, sizeof origin);
        if (o > 0 && origin_ok(s, origin, &explicit_origin) && explicit_origin) {
            snprintf(r->origin, sizeof r->origin, "%s", origin);
            r->hdr = malloc(LWS_PRE + 1024);
            if (!r->hdr) return -1;
            int n = snprintf((char *)r->hdr + LWS_PRE, 1024,
                             "HTTP/1.1 204 No Content\r\naccess-control-allow-origin: %s\r\n"
                             "access-control-allow-methods: GET, POST, OPTIONS\r\n"
                             "access-control-allow-headers: authorization, content-type, "
                             "x-api-key, anthropic-version\r\naccess-control-max-age: 600\r\n"
                             "vary: Origin\r\ncontent-length: 0\r\n\r\n",
                             r->origin);
            if (n < 0 || n >= 1024) return -1;
            r->hdr_len = (size_t)n;
            r->status = 204;
            r->started = true;
            srv_metrics_request(s->metrics, "preflight", 204);
            req_writable(r);
            r->finished = true;
            return 0;
        }
        r->close_after = true;
        srv_reply_error(r, 403, "permission_error", "origin_not_allowed",
                        "CORS preflight refused: Origin not allowed");
        return 0;
    }
    if ((deny = check_access(s, w, false, r->origin, sizeof r->origin, &why))) {
        r->close_after = true;
        refuse_after_body(s, r, w);
        srv_reply_error(r, deny, deny == 401 ? "authentication_error" : "permission_error",
                        deny == 401 ? "invalid_api_key" : "forbidden", "%s", why);
        return 0;
    }
    bool known;
    r->route = route_find(s, r->method, r->path, &known);
    if (!r->route) {
        r->close_after = lws_hdr_total_length(w, WSI_TOKEN_HTTP_CONTENT_LENGTH) > 0;
        refuse_after_body(s, r, w);
        if (known)
            srv_reply_error(r, 405, "invalid_request_error", "method_not_allowed",
                            "%s is not allowed on %s", r->method, r->path);
        else
            srv_reply_error(r, 404, "invalid_request_error", "not_found", "no route %s %s",
                            r->method, r->path);
        return 0;
    }
    if (!strcmp(r->method, "POST") || !strcmp(r->method, "PUT") || !strcmp(r->method, "PATCH")) {
        char cl[32];
        if (hdr(w, WSI_TOKEN_HTTP_CONTENT_LENGTH, cl, sizeof cl) <= 0) {
            r->close_after = true;
            srv_reply_error(r, 411, "invalid_request_error", "length_required",
                            "a request body needs Content-Length");
            return 0;
        }
        char *e;
        unsigned long long n = strtoull(cl, &e, 10);
        if (*e || cl[0] == '-') {
            r->close_after = true;
            srv_reply_error(r, 400, "invalid_request_error", NULL, "bad Content-Length");
            return 0;
        }
        if (n > s->lim.max_body) {
            r->close_after = true;
            refuse_after_body(s, r, w);
            srv_reply_error(r, 413, "invalid_request_error", "body_too_large",
                            "request body of %llu bytes exceeds the limit of %zu bytes", n,
                            s->lim.max_body);
            return 0;
        }
        r->body_expected = (size_t)n;
        if (n == 0) {
            r->body_done = true;
            dispatch(r);
            return 0;
        }
        /* the body must arrive within the idle timeout (slow senders) */
        lws_set_timeout(w, PENDING_TIMEOUT_HTTP_CONTENT, s->lim.idle_timeout_s);
        return 0;
    }
    r->body_done = true;
    dispatch(r);
    return 0;
}

static int on_http_writeable(srv *s, pss *ps, struct lws *w) {
    srv_req *r = ps->req;
    if (!r || !r->started) return 0;
    if (r->drain && !r->body_done) return 0; /* written once the body is read */
    if (!r->hdr_sent) {
        if (lws_write(w, r->hdr + LWS_PRE, r->hdr_len, LWS_WRITE_HTTP_HEADERS) != (int)r->hdr_len)
            return -1;
        r->hdr_sent = true;
        if (sbuf_pending(&r->out) || !r->finished) {
            if (sbuf_pending(&r->out)) lws_callback_on_writable(w);
            return 0;
        }
    }
    size_t n = sbuf_pending(&r->out);
    if (n) {
        if (n > SRV_CHUNK) n = SRV_CHUNK;
        bool last = r->finished && n == sbuf_pending(&r->out);
        memcpy(s->scratch + LWS_PRE, r->out.p + r->out.off, n);
        if (lws_write(w, s->scratch + LWS_PRE, n,
                      last && !r->stream ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP) < (int)n)
            return -1;
        r->out.off += n;
        if (!last) {
            if (sbuf_pending(&r->out)) lws_callback_on_writable(w);
            return 0;
        }
    } else if (!r->finished) {
        return 0;
    }
    /* the response is complete */
    bool close = r->close_after || r->stream;
    req_free(ps);
    if (close) return -1;
    return lws_http_transaction_completed(w) ? -1 : 0;
}

/* ----- WebSocket ----------------------------------------------------------------------------- */
int srv_ws_send(srv_conn *c, const char *text, size_t len) {
    if (c->closing) return agent_err(AGENT_EINVAL, "connection closing");
    msg *m = malloc(sizeof *m + LWS_PRE + len);
    if (!m) return agent_err(AGENT_ENOMEM, "out of memory");
    m->next = NULL;
    m->len = len;
    memcpy(m->text + LWS_PRE, text, len);
    if (c->q_tail)
        c->q_tail->next = m;
    else
        c->q_head = m;
    c->q_tail = m;
    c->q_bytes += len;
    if (c->q_bytes > c->s->lim.max_pending_out) {
        engine_log(ENGINE_LOG_WARN, "serve: closing WebSocket %llu from %s: it does not read",
                   (unsigned long long)c->id, c->peer);
        srv_conn_close(c, LWS_CLOSE_STATUS_POLICY_VIOLATION, "client too slow");
        return agent_err(AGENT_EINVAL, "client too slow");
    }
    lws_callback_on_writable(c->wsi);
    return 0;
}

int srv_ws_send_json(srv_conn *c, json_t *m) {
    char *t = json_dumps(m, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!t) return agent_err(AGENT_ENOMEM, "out of memory");
    int rc = srv_ws_send(c, t, strlen(t));
    free(t);
    return rc;
}

void srv_conn_close(srv_conn *c, int code, const char *reason) {
    if (c->closing) return;
    c->closing = true;
    c->close_code = code;
    snprintf(c->close_reason, sizeof c->close_reason, "%s", reason ? reason : "");
    lws_callback_on_writable(c->wsi);
}

srv_conn *srv_conn_find(srv *s, uint64_t id) {
    for (srv_conn *c = s->conns; c; c = c->next)
        if (c->id == id) return c;
    return NULL;
}

static void conn_free(srv *s, pss *ps) {
    srv_conn *c = ps ? ps->conn : NULL;
    if (!c) return;
    ps->conn = NULL;
    if (s->has_ws && s->ws.close) s->ws.close(c, c->state);
    for (srv_conn **pp = &s->conns; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    for (msg *m = c->q_head, *n; m; m = n) {
        n = m->next;
        free(m);
    }
    srv_buf_free(&c->rx);
    free(c);
    s->n_ws--;
}

static int on_ws_receive(srv *s, srv_conn *c, struct lws *w, const void *in, size_t len) {
    if (lws_frame_is_binary(w)) {
        lws_close_reason(w, LWS_CLOSE_STATUS_UNACCEPTABLE_OPCODE,
                         (unsigned char *)"binary frames are not accepted", 30);
        return -1;
    }
    if (lws_is_first_fragment(w)) {
        c->rx.len = c->rx.off = 0;
        c->rx_too_big = false;
    }
    if (c->rx.len + len > s->lim.max_ws_message) {
        static const char why[] = "message too big";
        lws_close_reason(w, LWS_CLOSE_STATUS_MESSAGE_TOO_LARGE, (unsigned char *)why,
                         sizeof why - 1);
        return -1;
    }
    if (srv_buf_add(&c->rx, in, len)) return -1;
    if (lws_is_final_fragment(w) && !lws_remaining_packet_payload(w)) {
        if (!c->closing && s->ws.message)
            s->ws.message(c, c->state, c->rx.p ? c->rx.p : "", c->rx.len);
        c->rx.len = c->rx.off = 0;
        if (c->rx.cap > 65536) srv_buf_free(&c->rx);
    }
    return 0;
}

static int on_ws_writeable(srv_conn *c, struct lws *w) {
    msg *m = c->q_head;
    if (m) {
        c->q_head = m->next;
        if (!c->q_head) c->q_tail = NULL;
        c->q_bytes -= m->len;
        int n = lws_write(w, (unsigned char *)m->text + LWS_PRE, m->len, LWS_WRITE_TEXT);
        free(m);
        if (n < 0) return -1;
        if (c->q_head || c->closing) lws_callback_on_writable(w);
        return 0;
    }
    if (c->closing) {
        lws_close_reason(w, (enum lws_close_status)c->close_code, (unsigned char *)c->close_reason,
                         strlen(c->close_reason));
        return -1;
    }
    return 0;
}

/* ----- cross-thread posts ------------------------------------------------------------------- */
static int post_push(srv *s, post *p) {
    pthread_mutex_lock(&s->mu);
    if (s->closed) {
        pthread_mutex_unlock(&s->mu);
        return agent_err(AGENT_EINVAL, "the server has stopped");
    }
    if (s->posts_tail)
        s->posts_tail->next = p;
    else
        s->posts_head = p;
    s->posts_tail = p;
    pthread_mutex_unlock(&s->mu);
    lws_cancel_service(s->ctx);
    return 0;
}

int srv_post(srv *s, void (*fn)(srv *s, void *arg), void *arg) {
    post *p = calloc(1, sizeof *p);
    if (!p) return agent_err(AGENT_ENOMEM, "out of memory");
    p->fn = fn;
    p->arg = arg;
    int rc = post_push(s, p);
    if (rc) free(p);
    return rc;
}

int srv_conn_post(srv *s, uint64_t id, const char *text, size_t len) {
    post *p = malloc(sizeof *p + len);
    if (!p) return agent_err(AGENT_ENOMEM, "out of memory");
    memset(p, 0, sizeof *p);
    p->conn = id;
    p->len = len;
    memcpy(p->text, text, len);
    int rc = post_push(s, p);
    if (rc) free(p);
    return rc;
}

void srv_wake(srv *s) {
    lws_cancel_service(s->ctx);
}

static void run_posts(srv *s) {
    pthread_mutex_lock(&s->mu);
    post *p = s->posts_head;
    s->posts_head = s->posts_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    while (p) {
        post *n = p->next;
        if (p->fn) {
            p->fn(s, p->arg);
        } else {
            srv_conn *c = srv_conn_find(s, p->conn);
            if (c) srv_ws_send(c, p->text, p->len);
        }
        free(p);
        p = n;
    }
}

/* SIGTERM seen (from the wake-up agent_server_stop sends, or the timer): refuse new work from
 * now on. */
static void drain_begin(srv *s) {
    if (!s->stop_requested || s->draining) return;
    s->draining = true;
    s->drain_deadline = srv_now_ms() + s->drain_timeout_s * 1000.0;
    engine_log(ENGINE_LOG_INFO, "serve: stopping: %d request(s) running, waiting up to %d s",
               s->chat ? srv_chat_active(s->chat) : 0, s->drain_timeout_s);
}

/* ----- the protocol callback ------------------------------------------------------------------ */
static int callback(struct lws *w, enum lws_callback_reasons reason, void *user, void *in,
                    size_t len) {
    srv *s = lws_context_user(lws_get_context(w));
    pss *ps = user;
    switch (reason) {
    case LWS_CALLBACK_FILTER_NETWORK_CONNECTION: {
        const struct lws_filter_network_conn_args *a = user;
        char addr[64];
        if (!a) return 0;
        addr_string(&a->cli_addr, addr, sizeof addr);
        int pi = peer_index(s, addr, false);
        if (pi >= 0 && s->peers[pi].n >= s->lim.max_conns_per_client) {
            engine_log(ENGINE_LOG_WARN,
                       "serve: refusing a connection from %s: %d open "
                       "(limit %d)",
                       addr, s->peers[pi].n, s->lim.max_conns_per_client);
            return 1;
        }
        return 0;
    }
    case LWS_CALLBACK_SERVER_NEW_CLIENT_INSTANTIATED:
        conn_count(s, w);
        return 0;
    case LWS_CALLBACK_WSI_DESTROY:
        conn_uncount(s, w);
        return 0;
    case LWS_CALLBACK_HTTP_BIND_PROTOCOL:
        s->n_http++;
        return 0;
    case LWS_CALLBACK_HTTP_DROP_PROTOCOL:
        s->n_http--;
        return 0;
    case LWS_CALLBACK_HTTP:
        return ps ? on_http(s, ps, w, in) : -1;
    case LWS_CALLBACK_HTTP_BODY: {
        srv_req *r = ps ? ps->req : NULL;
        if (r && r->drain) {
            r->drained += len;
            return r->drained > r->body_expected ? -1 : 0;
        }
        if (!r || r->gone || r->started) return 0; /* answered already: the body is dropped */
        if (r->body.len + len > r->body_expected) return -1;
        if (srv_buf_add(&r->body, in, len)) return -1;
        return 0;
    }
    case LWS_CALLBACK_HTTP_BODY_COMPLETION: {
        srv_req *r = ps ? ps->req : NULL;
        if (r && r->drain && !r->body_done) {
            /* the refused request's body is read: now its answer */
            r->body_done = true;
            lws_set_timeout(w, NO_PENDING_TIMEOUT, 0);
            lws_callback_on_writable(w);
            return 0;
        }
        if (!r || r->started || r->body_done) return 0;
        r->body_done = true;
        lws_set_timeout(w, NO_PENDING_TIMEOUT, 0);
        dispatch(r);
        return 0;
    }
    case LWS_CALLBACK_HTTP_WRITEABLE:
        return ps ? on_http_writeable(s, ps, w) : 0;
    case LWS_CALLBACK_CLOSED_HTTP:
        req_free(ps);
        return 0;
    case LWS_CALLBACK_HTTP_CONFIRM_UPGRADE: {
        /* the WebSocket handshake: path, Host, Origin and token before the upgrade (no
         * per-connection data exists yet here) */
        if (ps) req_free(ps);
        char uri[256];
        const char *why = NULL;
        char origin[256];
        /* access first: without the token nobody learns which paths exist */
        int deny = check_access(s, w, true, origin, sizeof origin, &why);
        if (!deny && (hdr(w, WSI_TOKEN_GET_URI, uri, sizeof uri) <= 0 || strcmp(uri, "/rpc") ||
                      !s->has_ws || !in || strcmp(in, "websocket"))) {
            deny = 404;
            why = "no WebSocket endpoint here (use /rpc)";
        } else if (!deny && srv_draining(s)) {
            deny = 503;
            why = "the server is shutting down";
        }
        if (!deny) return 0;
        engine_log(ENGINE_LOG_INFO, "serve: WebSocket handshake refused (%d): %s", deny, why);
        if (s->metrics) srv_metrics_request(s->metrics, "/rpc", deny);
        lws_return_http_status(w, (unsigned)deny, why);
        return 1;
    }
    case LWS_CALLBACK_ESTABLISHED: {
        srv_conn *c = ps ? calloc(1, sizeof *c) : NULL;
        if (!c) return -1;
        c->s = s;
        c->wsi = w;
        c->id = ++s->next_conn_id;
        lws_get_peer_simple(w, c->peer, sizeof c->peer);
        c->next = s->conns;
        s->conns = c;
        ps->conn = c;
        s->n_ws++;
        if (s->metrics) srv_metrics_request(s->metrics, "/rpc", 101);
        if (s->ws.open) c->state = s->ws.open(c, s->ws.user);
        return 0;
    }
    case LWS_CALLBACK_RECEIVE:
        if (!ps || !ps->conn) return -1;
        return on_ws_receive(s, ps->conn, w, in, len);
    case LWS_CALLBACK_SERVER_WRITEABLE:
        if (!ps || !ps->conn) return -1;
        return on_ws_writeable(ps->conn, w);
    case LWS_CALLBACK_CLOSED:
        conn_free(s, ps);
        return 0;
    case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
        if (s) {
            drain_begin(s);
            run_posts(s);
            if (s->chat) srv_chat_service(s->chat);
        }
        return 0;
    default:
        return 0;
    }
}

/* ----- lifecycle ------------------------------------------------------------------------------ */
static void tick(lws_sorted_usec_list_t *sul) {
    srv *s = lws_container_of(sul, srv, tick);
    drain_begin(s);
    if (s->draining) {
        int active = s->chat ? srv_chat_active(s->chat) : 0;
        if (active && !s->canceled_all && srv_now_ms() >= s->drain_deadline) {
            engine_log(ENGINE_LOG_INFO, "serve: cancelling %d request(s)", active);
            srv_chat_cancel_all(s->chat);
            s->canceled_all = true;
        }
        if (!active) {
            for (srv_conn *c = s->conns; c; c = c->next)
                srv_conn_close(c, LWS_CLOSE_STATUS_GOINGAWAY, "server shutting down");
            /* give the closes and the last stream bytes a moment, then leave the loop */
            if (!s->conns || srv_now_ms() >= s->drain_deadline + 2000) {
                s->exit_loop = true;
                lws_cancel_service(s->ctx); /* lws_service is about to poll again */
            }
        }
    }
    if (!s->exit_loop) lws_sul_schedule(s->ctx, 0, &s->tick, tick, 100 * LWS_US_PER_MS);
}

static void lws_log_sink(int level, const char *line) {
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        n--;
    engine_log(level & LLL_ERR ? ENGINE_LOG_ERROR : ENGINE_LOG_WARN, "libwebsockets: %.*s", (int)n,
               line);
}

static char **strv_dup(const char *const *v) {
    size_t n = 0;
    while (v && v[n])
        n++;
    char **o = calloc(n + 1, sizeof *o);
    if (!o) return NULL;
    for (size_t i = 0; i < n; i++)
        if (!(o[i] = strdup(v[i]))) {
            for (size_t j = 0; j < i; j++)
                free(o[j]);
            free(o);
            return NULL;
        }
    return o;
}

static void strv_free(char **v) {
    for (size_t i = 0; v && v[i]; i++)
        free(v[i]);
    free(v);
}

static bool is_loopback(const char *h) {
    unsigned char a[16];
    if (!strcmp(h, "localhost")) return true;
    if (inet_pton(AF_INET, h, a) == 1) return a[0] == 127;
    if (inet_pton(AF_INET6, h, a) == 1) {
        static const unsigned char one[16] = {[15] = 1};
        return !memcmp(a, one, 16);
    }
    return false;
}

struct agent_server {
    srv s;
};

int agent_server_new(agent_server **out, engine_model *m, const agent_server_opts *o) {
    *out = NULL;
    if (!m || !o) return agent_err(AGENT_EINVAL, "agent_server_new: NULL");
    if (!o->token || strlen(o->token) < 16 || strlen(o->token) >= 256)
        return agent_err(AGENT_EINVAL, "the server needs a token of 16 to 255 characters");
    for (const char *t = o->token; *t; t++)
        if (*t <= ' ' || *t == ',' || *t >= 127)
            return agent_err(AGENT_EINVAL, "the token must be printable ASCII without spaces "
                                           "or commas");
    const char *host = o->host && *o->host ? o->host : "127.0.0.1";
    if (!is_loopback(host) && !o->listen_public)
        return agent_err(AGENT_EINVAL,
                         "listening on %s (not a loopback address) needs "
                         "--listen-public",
                         host);
    if (o->port < 0 || o->port > 65535) return agent_err(AGENT_EINVAL, "bad port %d", o->port);
    agent_server *as = calloc(1, sizeof *as);
    if (!as) return agent_err(AGENT_ENOMEM, "out of memory");
    srv *s = &as->s;
    pthread_mutex_init(&s->mu, NULL);
    s->model = m;
    snprintf(s->token, sizeof s->token, "%s", o->token);
    snprintf(s->host, sizeof s->host, "%s", host);
    s->listen_public = o->listen_public;
    s->lim.max_body = o->max_body ? o->max_body : 8u << 20;
    s->lim.max_ws_message = o->max_ws_message ? o->max_ws_message : 8u << 20;
    s->lim.max_json_depth = o->max_json_depth > 0 ? o->max_json_depth : 64;
    s->lim.max_conns_per_client = o->max_conns_per_client > 0 ? o->max_conns_per_client : 64;
    s->lim.max_pending_out = 16u << 20;
    s->lim.max_tokens_default = o->max_tokens_default > 0 ? o->max_tokens_default : 512;
    s->lim.idle_timeout_s = o->idle_timeout_s > 0 ? o->idle_timeout_s : 60;
    s->drain_timeout_s = o->drain_timeout_s > 0 ? o->drain_timeout_s : 10;
    if (o->model_name && *o->model_name) {
        snprintf(s->model_name, sizeof s->model_name, "%s", o->model_name);
    } else {
        engine_model_info mi;
        engine_model_info_get(m, &mi);
        snprintf(s->model_name, sizeof s->model_name, "%s", mi.name[0] ? mi.name : mi.arch);
    }
    s->allow_hosts = strv_dup(o->allow_hosts);
    s->allow_origins = strv_dup(o->allow_origins);
    int rc;
    if (!s->allow_hosts || !s->allow_origins) {
        rc = agent_err(AGENT_ENOMEM, "out of memory");
        goto fail;
    }
    if ((rc = srv_metrics_new(&s->metrics))) goto fail;
    if ((rc = srv_chat_new(&s->chat, s, o->max_seqs, o->n_ctx))) goto fail;
    if ((rc = srv_modules_init(s))) goto fail;

    lws_set_log_level(LLL_ERR | LLL_WARN, lws_log_sink);
    s->protocols[0] = (struct lws_protocols){
        .name = SRV_WS_PROTOCOL,
        .callback = callback,
        .per_session_data_size = sizeof(pss),
        .rx_buffer_size = 65536,
    };
    s->retry = (lws_retry_bo_t){
        .secs_since_valid_ping = (uint16_t)(s->lim.idle_timeout_s / 2 + 1),
        .secs_since_valid_hangup = (uint16_t)s->lim.idle_timeout_s,
    };
    struct lws_context_creation_info info;
    memset(&info, 0, sizeof info);
    info.port = o->port;
    info.iface = s->host;
    info.protocols = s->protocols;
    info.user = s;
    info.options = LWS_SERVER_OPTION_FAIL_UPON_UNABLE_TO_BIND | LWS_SERVER_OPTION_VALIDATE_UTF8 |
                   LWS_SERVER_OPTION_DISABLE_IPV6 * 0;
    info.timeout_secs = (unsigned)s->lim.idle_timeout_s;
    info.keepalive_timeout = s->lim.idle_timeout_s;
    info.timeout_secs_ah_idle = (unsigned)s->lim.idle_timeout_s; /* connected, says nothing */
    info.retry_and_idle_policy = &s->retry;
    info.max_http_header_data = 8192;
    info.max_http_header_pool = 64;
    s->ctx = lws_create_context(&info);
    if (!s->ctx) {
        rc = agent_err(AGENT_EIO, "cannot listen on %s:%d (address in use or not available)",
                       s->host, o->port);
        goto fail;
    }
    s->vh = lws_get_vhost_by_name(s->ctx, "default");
    s->port = s->vh ? lws_get_vhost_listen_port(s->vh) : o->port;
    *out = as;
    return 0;
fail:
    agent_server_free(as);
    return rc;
}

int agent_server_port(const agent_server *as) {
    return as->s.port;
}

void agent_server_stop(agent_server *as) {
    as->s.stop_requested = 1;
    if (as->s.ctx) lws_cancel_service(as->s.ctx);
}

int agent_server_run(agent_server *as) {
    srv *s = &as->s;
    lws_sul_schedule(s->ctx, 0, &s->tick, tick, 100 * LWS_US_PER_MS);
    while (!s->exit_loop)
        if (lws_service(s->ctx, 0) < 0) break;
    return 0;
}

void agent_server_free(agent_server *as) {
    if (!as) return;
    srv *s = &as->s;
    if (s->ctx) {
        lws_sul_cancel(&s->tick);
        lws_context_destroy(s->ctx); /* closes every connection: cleanups release their jobs */
        s->ctx = NULL;
    }
    if (s->at_free) s->at_free(s, s->at_free_arg);
    pthread_mutex_lock(&s->mu);
    s->closed = true;
    post *p = s->posts_head;
    s->posts_head = s->posts_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    while (p) {
        post *n = p->next;
        free(p);
        p = n;
    }
    srv_chat_free(s->chat); /* joins the scheduler, then frees the jobs */
    srv_metrics_free(s->metrics);
    strv_free(s->allow_hosts);
    strv_free(s->allow_origins);
    free(s->routes);
    free(s->recs);
    free(s->peers);
    pthread_mutex_destroy(&s->mu);
    free(as);
}
