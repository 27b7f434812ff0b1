/* MCP client, stdio transport: the server runs under sandbox_run() in a thread of its own for
 * as long as it lives; we talk to it through two FIFOs (see agent.h). JSON-RPC 2.0 messages,
 * one per line. */
#include "agent_int.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "grammar.h"
#include "sandbox.h"

extern char **environ;

#define MCP_PROTOCOL "2025-06-18"
#define MCP_MAX_LINE (64u << 20) /* the largest message we accept from a server */
#define MCP_MAX_TOOLS 256

struct agent_mcp {
    char name[40];
    char dir[PATH_MAX];      /* the FIFOs' private directory ("" until created) */
    char in_path[PATH_MAX + 8], out_path[PATH_MAX + 8];
    int in_fd, out_fd;       /* we write the server's stdin, read its stdout */
    /* the sandbox run, owned by the thread until `done` */
    pthread_t thread;
    bool thread_started;
    volatile int stop;       /* sandbox_policy.cancel */
    int done;                /* atomic: sandbox_run returned */
    int run_rc;
    char run_err[512];
    sandbox_result res;
    sandbox_policy pol;
    char **argv, **env, **ro;
    /* the connection */
    char *buf;               /* bytes read and not yet consumed */
    size_t len, cap;
    long long next_id;
    double call_timeout_s;
    json_t *tools;           /* OpenAI-style array of the offered tools */
    char *tools_json;
    char *warnings;
    char tail[420];          /* scratch for stderr_tail */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char **strv_dup(const char *const *v, size_t extra_front, size_t extra_back) {
    size_t n = 0;
    while (v && v[n]) n++;
    char **out = calloc(extra_front + n + extra_back + 1, sizeof *out);
    if (!out) return NULL;
    for (size_t i = 0; i < n; i++)
        if (!(out[extra_front + i] = strdup(v[i]))) return out; /* caller checks and frees */
    return out;
}

static void strv_free(char **v) {
    for (size_t i = 0; v && v[i]; i++) free(v[i]);
    free(v);
}

/* The server's tail of stderr, for error messages (after its run ended). */
static const char *stderr_tail(agent_mcp *m) {
    if (!m->res.err.data || !m->res.err.len) return "";
    const char *d = m->res.err.data;
    size_t n = m->res.err.len;
    while (n && (d[n - 1] == '\n' || d[n - 1] == ' ')) n--;
    size_t from = n > 400 ? n - 400 : 0;
    snprintf(m->tail, sizeof m->tail, "%.*s", (int)(n - from), d + from);
    return m->tail;
}

static void *server_thread(void *p) {
    agent_mcp *m = p;
    m->run_rc = sandbox_run(&m->res, &m->pol, (const char *const *)m->argv,
                            (const char *const *)m->env, NULL);
    if (m->run_rc) snprintf(m->run_err, sizeof m->run_err, "%s", sandbox_error_last());
    __atomic_store_n(&m->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static bool server_done(const agent_mcp *m) {
    return __atomic_load_n(&m->done, __ATOMIC_ACQUIRE) != 0;
}

/* The error for a server that is gone: join its thread and say how it ended. */
static int server_gone(agent_mcp *m, const char *doing) {
    if (m->thread_started) {
        pthread_join(m->thread, NULL);
        m->thread_started = false;
    }
    if (m->run_rc)
        return agent_err(AGENT_EMCP, "MCP server %s could not be started: %s", m->name,
                         m->run_err);
    const char *tail = stderr_tail(m);
    char how[64];
    if (m->res.signal) snprintf(how, sizeof how, "was killed by signal %d", m->res.signal);
    else snprintf(how, sizeof how, "exited with status %d", m->res.exit_code);
    return agent_err(AGENT_EMCP, "MCP server %s %s while %s%s%s", m->name, how, doing,
                     *tail ? "; its stderr ends: " : " (no stderr output)", tail);
}

/* ----- messages ----- */

static int send_json(agent_mcp *m, json_t *msg, double deadline) {
    char *s = json_dumps(msg, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!s) return agent_err(AGENT_ENOMEM, "out of memory");
    size_t n = strlen(s), off = 0;
    s[n] = '\n'; /* the NUL becomes the line's end; we write n + 1 bytes */
    int rc = 0;
    while (off < n + 1) {
        ssize_t w = write(m->in_fd, s + off, n + 1 - off);
        if (w > 0) {
            off += (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EINTR) {
            rc = agent_err(AGENT_EMCP, "MCP server %s: writing its stdin: %s", m->name,
                           strerror(errno));
            break;
        }
        if (server_done(m)) {
            rc = server_gone(m, "a request was written");
            break;
        }
        double left = deadline - now_s();
        if (left <= 0) {
            rc = agent_err(AGENT_EMCP, "MCP server %s does not read its stdin", m->name);
            break;
        }
        struct pollfd pf = {.fd = m->in_fd, .events = POLLOUT};
        poll(&pf, 1, left > 0.1 ? 100 : (int)(left * 1000) + 1);
    }
    free(s);
    return rc;
}

/* Answer a request the server sent us: ping, or "method not found". */
static int answer_server(agent_mcp *m, json_t *req, double deadline) {
    const char *method = json_string_value(json_object_get(req, "method"));
    json_t *r = method && !strcmp(method, "ping")
                    ? json_pack("{s:s, s:O, s:{}}", "jsonrpc", "2.0", "id",
                                json_object_get(req, "id"), "result")
                    : json_pack("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id",
                                json_object_get(req, "id"), "error", "code", -32601, "message",
                                "method not supported by this client");
    if (!r) return agent_err(AGENT_ENOMEM, "out of memory");
    int rc = send_json(m, r, deadline);
    json_decref(r);
    return rc;
}

/* Read messages until the response to request `id`; *out gets the whole response. */
static int await_response(agent_mcp *m, long long id, double deadline, volatile int *cancel,
                          const char *doing, json_t **out) {
    *out = NULL;
    for (;;) {
        char *nl = m->len ? memchr(m->buf, '\n', m->len) : NULL;
        if (nl) {
            size_t ll = (size_t)(nl - m->buf);
            json_error_t je;
            json_t *msg = ll ? json_loadb(m->buf, ll, 0, &je) : NULL;
            bool blank = ll == 0 || (ll == 1 && m->buf[0] == '\r');
            if (!msg && !blank) {
                int rc = agent_err(AGENT_EMCP, "MCP server %s wrote a line that is not JSON-RPC "
                                   "(%s) while %s: %.80s", m->name, je.text, doing, m->buf);
                memmove(m->buf, nl + 1, m->len - ll - 1);
                m->len -= ll + 1;
                return rc;
            }
            memmove(m->buf, nl + 1, m->len - ll - 1);
            m->len -= ll + 1;
            if (!msg) continue;
            json_t *jid = json_object_get(msg, "id");
            bool is_request = json_object_get(msg, "method") != NULL;
            if (is_request && jid) {
                int rc = answer_server(m, msg, deadline);
                json_decref(msg);
                if (rc) return rc;
                continue;
            }
            if (!is_request && json_is_integer(jid) && json_integer_value(jid) == id) {
                *out = msg;
                return 0;
            }
            json_decref(msg); /* a notification, or the late answer to a cancelled request */
            continue;
        }
        if (cancel && *cancel) return agent_err(AGENT_ECANCELED, "canceled");
        if (m->cap - m->len < 65536) {
            if (m->cap >= MCP_MAX_LINE)
                return agent_err(AGENT_EMCP, "MCP server %s: a message longer than %u MiB",
                                 m->name, MCP_MAX_LINE >> 20);
            size_t nc = m->cap ? m->cap * 2 : 131072;
            char *nb = realloc(m->buf, nc);
            if (!nb) return agent_err(AGENT_ENOMEM, "out of memory");
            m->buf = nb;
            m->cap = nc;
        }
        ssize_t r = read(m->out_fd, m->buf + m->len, m->cap - m->len);
        if (r > 0) {
            m->len += (size_t)r;
            continue;
        }
        if (r < 0 && errno != EAGAIN && errno != EINTR)
            return agent_err(AGENT_EMCP, "MCP server %s: reading its stdout: %s", m->name,
                             strerror(errno));
        /* r == 0: no writer now (not yet opened, or closed: the thread tells which) */
        if (server_done(m)) return server_gone(m, doing);
        double left = deadline - now_s();
        if (left <= 0)
            return agent_err(AGENT_EMCP, "MCP server %s did not answer within the time limit "
                             "while %s", m->name, doing);
        struct pollfd pf = {.fd = m->out_fd, .events = POLLIN};
        int ms = left > 0.1 ? 100 : (int)(left * 1000) + 1;
        if (poll(&pf, 1, ms) > 0 && (pf.revents & POLLHUP) && !(pf.revents & POLLIN)) {
            /* the writer closed: wait a little for the thread to notice the exit */
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
}

/* A request and its response's "result" (*result, caller-owned). A JSON-RPC error response
 * is returned as 1 with *rpc_error set to its message (caller frees). */
static int request(agent_mcp *m, const char *method, json_t *params, double timeout_s,
                   volatile int *cancel, json_t **result, char **rpc_error) {
    *result = NULL;
    if (rpc_error) *rpc_error = NULL;
    long long id = ++m->next_id;
    json_t *req = json_pack("{s:s, s:I, s:s}", "jsonrpc", "2.0", "id", (json_int_t)id, "method",
                            method);
    if (!req) return agent_err(AGENT_ENOMEM, "out of memory");
    if (params) json_object_set(req, "params", params);
    double deadline = now_s() + timeout_s;
    int rc = send_json(m, req, deadline);
    json_decref(req);
    if (rc) return rc;
    char doing[96];
    snprintf(doing, sizeof doing, "answering %s", method);
    json_t *resp = NULL;
    rc = await_response(m, id, deadline, cancel, doing, &resp);
    if (rc == AGENT_ECANCELED || (rc == AGENT_EMCP && !server_done(m))) {
        /* tell the server to stop working on it (best effort; its late answer is skipped) */
        char keep[512];
        snprintf(keep, sizeof keep, "%s", agent_error_last());
        json_t *n = json_pack("{s:s, s:s, s:{s:I, s:s}}", "jsonrpc", "2.0", "method",
                              "notifications/cancelled", "params", "requestId", (json_int_t)id,
                              "reason", rc == AGENT_ECANCELED ? "canceled by the user"
                                                              : "timed out");
        if (n) send_json(m, n, now_s() + 1.0);
        json_decref(n);
        agent_err(rc, "%s", keep);
        return rc;
    }
    if (rc) return rc;
    json_t *err = json_object_get(resp, "error");
    json_t *res = json_object_get(resp, "result");
    if (err) {
        const char *msg = json_string_value(json_object_get(err, "message"));
        char *e = NULL;
        if (asprintf(&e, "%s (JSON-RPC error %lld)", msg ? msg : "error",
                     (long long)json_integer_value(json_object_get(err, "code"))) < 0)
            e = NULL;
        json_decref(resp);
        if (!rpc_error) {
            rc = agent_err(AGENT_EMCP, "MCP server %s: %s: %s", m->name, method, e ? e : "error");
            free(e);
            return rc;
        }
        *rpc_error = e;
        return 1;
    }
    if (!json_is_object(res)) {
        json_decref(resp);
        return agent_err(AGENT_EMCP, "MCP server %s: the answer to %s has no result object",
                         m->name, method);
    }
    *result = json_incref(res);
    json_decref(resp);
    return 0;
}

static int notify(agent_mcp *m, const char *method) {
    json_t *n = json_pack("{s:s, s:s}", "jsonrpc", "2.0", "method", method);
    if (!n) return agent_err(AGENT_ENOMEM, "out of memory");
    int rc = send_json(m, n, now_s() + 5.0);
    json_decref(n);
    return rc;
}

/* ----- tools ----- */

static bool name_ok(const char *s, size_t max, bool dot) {
    size_t n = s ? strlen(s) : 0;
    if (!n || n > max) return false;
    for (; *s; s++)
        if (!(*s >= 'a' && *s <= 'z') && !(*s >= 'A' && *s <= 'Z') && !(*s >= '0' && *s <= '9') &&
            *s != '_' && *s != '-' && !(dot && *s == '.'))
            return false;
    return true;
}

static int warn(agent_mcp *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int warn(agent_mcp *m, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    size_t have = m->warnings ? strlen(m->warnings) : 0;
    char *w = realloc(m->warnings, have + strlen(line) + 2);
    if (!w) return agent_err(AGENT_ENOMEM, "out of memory");
    memcpy(w + have, line, strlen(line));
    w[have + strlen(line)] = '\n';
    w[have + strlen(line) + 1] = 0;
    m->warnings = w;
    return 0;
}

/* One tool of tools/list -> the offered array (or a warning). */
static int add_tool(agent_mcp *m, json_t *t) {
    const char *tn = json_string_value(json_object_get(t, "name"));
    json_t *schema = json_object_get(t, "inputSchema");
    if (!name_ok(tn, 64, true))
        return warn(m, "MCP server %s: tool name '%.64s' left out (expected [A-Za-z0-9_.-]{1,64})",
                    m->name, tn ? tn : "(none)");
    if (!json_is_object(schema))
        return warn(m, "MCP server %s: tool %s left out: no inputSchema object", m->name, tn);
    if (json_array_size(m->tools) >= MCP_MAX_TOOLS)
        return warn(m, "MCP server %s: tool %s left out: more than %d tools", m->name, tn,
                    MCP_MAX_TOOLS);
    char *sj = json_dumps(schema, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!sj) return agent_err(AGENT_ENOMEM, "out of memory");
    char *gbnf = NULL;
    int grc = grammar_schema_to_gbnf(&gbnf, sj, strlen(sj));
    free(gbnf);
    free(sj);
    if (grc < 0)
        return warn(m, "MCP server %s: tool %s left out: its schema cannot be constrained (%s)",
                    m->name, tn, grammar_error_last());
    char full[160];
    snprintf(full, sizeof full, "mcp__%s__%s", m->name, tn);
    size_t i;
    json_t *x;
    json_array_foreach(m->tools, i, x) {
        if (!strcmp(json_string_value(json_object_get(json_object_get(x, "function"), "name")),
                    full))
            return warn(m, "MCP server %s: tool %s listed twice; the first kept", m->name, tn);
    }
    const char *desc = json_string_value(json_object_get(t, "description"));
    json_t *f = json_pack("{s:s, s:s, s:O}", "name", full, "description", desc ? desc : "",
                          "parameters", schema);
    json_t *o = f ? json_pack("{s:s, s:o}", "type", "function", "function", f) : NULL;
    if (!o || json_array_append_new(m->tools, o)) return agent_err(AGENT_ENOMEM, "out of memory");
    return 0;
}

static int list_tools(agent_mcp *m, double timeout_s) {
    json_t *cursor = NULL;
    for (int page = 0; page < 100; page++) {
        json_t *params = cursor ? json_pack("{s:O}", "cursor", cursor) : json_object();
        json_decref(cursor);
        cursor = NULL;
        json_t *res = NULL;
        int rc = request(m, "tools/list", params, timeout_s, NULL, &res, NULL);
        json_decref(params);
        if (rc) return rc;
        json_t *tools = json_object_get(res, "tools");
        if (!json_is_array(tools)) {
            json_decref(res);
            return agent_err(AGENT_EMCP, "MCP server %s: tools/list answered without a tools "
                             "array", m->name);
        }
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t) {
            if ((rc = add_tool(m, t))) {
                json_decref(res);
                return rc;
            }
        }
        json_t *next = json_object_get(res, "nextCursor");
        if (json_is_string(next)) cursor = json_incref(next);
        json_decref(res);
        if (!cursor) return 0;
    }
    json_decref(cursor);
    return agent_err(AGENT_EMCP, "MCP server %s: tools/list goes on for more than 100 pages",
                     m->name);
}

/* ----- life cycle ----- */

static int start_server(agent_mcp *m, const agent_mcp_opts *o) {
    const char *tmp = "/tmp"; /* the sandbox binds it read-only at the same path inside */
    snprintf(m->dir, sizeof m->dir, "%s/spark-mcp-XXXXXX", tmp);
    if (!mkdtemp(m->dir)) {
        int e = errno;
        m->dir[0] = 0;
        return agent_err(AGENT_EMCP, "MCP server %s: cannot create a directory in %s: %s",
                         m->name, tmp, strerror(e));
    }
    snprintf(m->in_path, sizeof m->in_path, "%s/in", m->dir);
    snprintf(m->out_path, sizeof m->out_path, "%s/out", m->dir);
    if (mkfifo(m->in_path, 0600) || mkfifo(m->out_path, 0600))
        return agent_err(AGENT_EMCP, "MCP server %s: mkfifo: %s", m->name, strerror(errno));
    /* Opened before the server starts, so that its opens do not block: read-write on its stdin
     * (a FIFO opened this way has a reader, us), non-blocking read on its stdout. */
    m->in_fd = open(m->in_path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    m->out_fd = open(m->out_path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (m->in_fd < 0 || m->out_fd < 0)
        return agent_err(AGENT_EMCP, "MCP server %s: open a FIFO: %s", m->name, strerror(errno));

    /* argv: sh -c 'exec "$@" <DIR/in >DIR/out' DIR COMMAND ARGS... */
    static const char *const front[] = {"/bin/sh", "-c", "exec \"$@\" <\"$0/in\" >\"$0/out\""};
    m->argv = strv_dup(o->argv, 4, 0);
    if (!m->argv) return agent_err(AGENT_ENOMEM, "out of memory");
    for (int i = 0; i < 3; i++) m->argv[i] = strdup(front[i]);
    m->argv[3] = strdup(m->dir);
    size_t na = 0, ne = 0, nx = 0, nr = 0;
    while (o->argv[na]) na++;
    for (size_t i = 0; i < 4 + na; i++)
        if (!m->argv[i]) return agent_err(AGENT_ENOMEM, "out of memory");
    /* environment: ours, with opts.env overriding same-named variables */
    while (environ && environ[ne]) ne++;
    while (o->env && o->env[nx]) nx++;
    m->env = calloc(ne + nx + 1, sizeof *m->env);
    if (!m->env) return agent_err(AGENT_ENOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < ne; i++) {
        const char *eq = strchr(environ[i], '=');
        size_t nl = eq ? (size_t)(eq - environ[i]) : strlen(environ[i]);
        bool over = false;
        for (size_t j = 0; j < nx && !over; j++)
            over = !strncmp(o->env[j], environ[i], nl) && o->env[j][nl] == '=';
        if (!over && !(m->env[k++] = strdup(environ[i])))
            return agent_err(AGENT_ENOMEM, "out of memory");
    }
    for (size_t j = 0; j < nx; j++) {
        if (!strchr(o->env[j], '=') || o->env[j][0] == '=')
            return agent_err(AGENT_EINVAL, "MCP server %s: environment entry '%s' is not "
                             "NAME=VALUE", m->name, o->env[j]);
        if (!(m->env[k++] = strdup(o->env[j]))) return agent_err(AGENT_ENOMEM, "out of memory");
    }
    while (o->ro_paths && o->ro_paths[nr]) nr++;
    m->ro = strv_dup(o->ro_paths, 1, 0);
    if (!m->ro || !(m->ro[0] = strdup(m->dir))) return agent_err(AGENT_ENOMEM, "out of memory");
    for (size_t i = 0; i < nr; i++)
        if (!m->ro[1 + i]) return agent_err(AGENT_ENOMEM, "out of memory");

    sandbox_policy pol = SANDBOX_POLICY_INIT;
    pol.workspace = o->workspace;
    pol.fs_mode = o->write ? SANDBOX_FS_WORKSPACE_WRITE : SANDBOX_FS_READ_ONLY;
    pol.network = o->network;
    pol.unsandboxed = o->unsandboxed;
    pol.timeout_s = 0;                  /* it lives as long as the session */
    pol.output_cap = 16 * 1024;         /* its stderr: head and tail for error messages */
    pol.output_limit = (uint64_t)1 << 40; /* a chatty log is no reason to stop it */
    pol.extra_ro_paths = (const char *const *)m->ro;
    pol.cancel = &m->stop;
    m->pol = pol;
    if (pthread_create(&m->thread, NULL, server_thread, m))
        return agent_err(AGENT_EMCP, "MCP server %s: cannot start a thread", m->name);
    m->thread_started = true;
    return 0;
}

void agent_mcp_free(agent_mcp *m) {
    if (!m) return;
    if (m->in_fd >= 0) close(m->in_fd); /* EOF on its stdin: the spec's way to ask it to exit */
    m->in_fd = -1;
    if (m->thread_started) {
        double until = now_s() + 2.0;
        while (!server_done(m) && now_s() < until) {
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        m->stop = 1; /* the sandbox kills the whole tree */
        pthread_join(m->thread, NULL);
    }
    if (m->out_fd >= 0) close(m->out_fd);
    sandbox_result_deinit(&m->res);
    if (m->dir[0]) {
        unlink(m->in_path);
        unlink(m->out_path);
        rmdir(m->dir);
    }
    strv_free(m->argv);
    strv_free(m->env);
    strv_free(m->ro);
    free(m->buf);
    json_decref(m->tools);
    free(m->tools_json);
    free(m->warnings);
    free(m);
}

int agent_mcp_start(agent_mcp **out, const agent_mcp_opts *o) {
    if (!out || !o) return agent_err(AGENT_EINVAL, "agent_mcp_start: NULL argument");
    *out = NULL;
    if (o->version != AGENT_MCP_OPTS_VERSION)
        return agent_err(AGENT_EINVAL, "agent_mcp_opts version %d, expected %d", o->version,
                         AGENT_MCP_OPTS_VERSION);
    if (!name_ok(o->name, 32, false))
        return agent_err(AGENT_EINVAL, "MCP server name '%s': expected [A-Za-z0-9_-]{1,32}",
                         o->name ? o->name : "(null)");
    if (!o->argv || !o->argv[0] || !o->argv[0][0])
        return agent_err(AGENT_EINVAL, "MCP server %s: no command", o->name);
    if (!o->workspace || o->workspace[0] != '/')
        return agent_err(AGENT_EINVAL, "MCP server %s: the workspace must be an absolute path",
                         o->name);
    agent_mcp *m = calloc(1, sizeof *m);
    if (!m) return agent_err(AGENT_ENOMEM, "out of memory");
    snprintf(m->name, sizeof m->name, "%s", o->name);
    m->in_fd = m->out_fd = -1;
    m->call_timeout_s = o->call_timeout_s > 0 ? o->call_timeout_s : 120;
    m->tools = json_array();
    int rc = m->tools ? start_server(m, o) : agent_err(AGENT_ENOMEM, "out of memory");
    double t0 = o->start_timeout_s > 0 ? o->start_timeout_s : 30;
    json_t *res = NULL;
    if (!rc) {
        json_t *params = json_pack("{s:s, s:{}, s:{s:s, s:s}}", "protocolVersion", MCP_PROTOCOL,
                                   "capabilities", "clientInfo", "name", "spark-agent",
                                   "version", engine_version());
        rc = params ? request(m, "initialize", params, t0, NULL, &res, NULL)
                    : agent_err(AGENT_ENOMEM, "out of memory");
        json_decref(params);
    }
    if (!rc && !json_is_string(json_object_get(res, "protocolVersion")))
        rc = agent_err(AGENT_EMCP, "MCP server %s: initialize answered without a "
                       "protocolVersion", m->name);
    json_decref(res);
    if (!rc) rc = notify(m, "notifications/initialized");
    if (!rc) rc = list_tools(m, t0);
    if (!rc) {
        m->tools_json = json_dumps(m->tools, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!m->tools_json) rc = agent_err(AGENT_ENOMEM, "out of memory");
    }
    if (rc) {
        char keep[1024];
        snprintf(keep, sizeof keep, "%s", agent_error_last());
        agent_mcp_free(m);
        return agent_err(rc, "%s", keep);
    }
    *out = m;
    return 0;
}

const char *agent_mcp_name(const agent_mcp *m) {
    return m ? m->name : "";
}

const char *agent_mcp_tools_json(const agent_mcp *m) {
    return m && m->tools_json ? m->tools_json : "[]";
}

const char *agent_mcp_warnings(const agent_mcp *m) {
    return m && m->warnings ? m->warnings : "";
}

static json_t *find_tool(const agent_mcp *m, const char *tool) {
    if (!m || !tool) return NULL;
    size_t i;
    json_t *x;
    json_array_foreach(m->tools, i, x) {
        json_t *f = json_object_get(x, "function");
        if (!strcmp(json_string_value(json_object_get(f, "name")), tool)) return f;
    }
    return NULL;
}

bool agent_mcp_has_tool(const agent_mcp *m, const char *tool) {
    return find_tool(m, tool) != NULL;
}

int agent_mcp_check_args(const agent_mcp *m, const char *tool, const char *args_json,
                         char **err) {
    *err = NULL;
    json_t *f = find_tool(m, tool);
    if (!f) {
        *err = strdup("unknown tool");
        return -1;
    }
    char *sj = json_dumps(json_object_get(f, "parameters"), JSON_COMPACT);
    if (!sj) {
        *err = strdup("out of memory");
        return -1;
    }
    int rc = tool_schema_check(sj, args_json);
    free(sj);
    if (rc < 0) {
        *err = strdup(tool_error_last());
        return -1;
    }
    return 0;
}

/* tools/call's result -> the JSON object the model reads. */
static char *result_for_model(json_t *res, bool *is_error) {
    *is_error = json_is_true(json_object_get(res, "isError"));
    json_t *content = json_object_get(res, "content");
    size_t cap = 256, len = 0;
    char *text = malloc(cap);
    json_t *other = json_array();
    if (!text || !other) {
        free(text);
        json_decref(other);
        return NULL;
    }
    text[0] = 0;
    size_t i;
    json_t *c;
    json_array_foreach(content, i, c) {
        const char *type = json_string_value(json_object_get(c, "type"));
        const char *t = json_string_value(json_object_get(c, "text"));
        if (type && !strcmp(type, "text") && t) {
            size_t tl = strlen(t);
            if (len + tl + 2 > cap) {
                while (len + tl + 2 > cap) cap *= 2;
                char *nt = realloc(text, cap);
                if (!nt) {
                    free(text);
                    json_decref(other);
                    return NULL;
                }
                text = nt;
            }
            if (len) text[len++] = '\n';
            memcpy(text + len, t, tl + 1);
            len += tl;
        } else {
            const char *mime = json_string_value(json_object_get(c, "mimeType"));
            const char *data = json_string_value(json_object_get(c, "data"));
            char d[160];
            snprintf(d, sizeof d, "[%s content%s%s, %zu bytes not shown]", type ? type : "unknown",
                     mime ? " " : "", mime ? mime : "", data ? strlen(data) : (size_t)0);
            json_array_append_new(other, json_string(d));
        }
    }
    json_t *o;
    if (*is_error) {
        o = json_pack("{s:{s:s, s:s}}", "error", "code", "tool_error", "message",
                      len ? text : "the tool reported an error");
    } else {
        o = json_pack("{s:s}", "text", text);
        json_t *sc = json_object_get(res, "structuredContent");
        if (o && sc) json_object_set(o, "structured", sc);
        if (o && json_array_size(other)) json_object_set(o, "other", other);
    }
    free(text);
    json_decref(other);
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    return s;
}

int agent_mcp_call(agent_mcp *m, const char *tool, const char *args_json, volatile int *cancel,
                   char **out_json, bool *is_error) {
    if (!out_json || !is_error) return agent_err(AGENT_EINVAL, "agent_mcp_call: NULL output");
    *out_json = NULL;
    *is_error = false;
    if (!find_tool(m, tool)) return agent_err(AGENT_EINVAL, "unknown MCP tool %s",
                                              tool ? tool : "(null)");
    if (server_done(m)) return server_gone(m, "idle");
    json_error_t je;
    json_t *args = json_loads(args_json && *args_json ? args_json : "{}", 0, &je);
    if (!json_is_object(args)) {
        json_decref(args);
        return agent_err(AGENT_EINVAL, "MCP tool %s: the arguments are not a JSON object", tool);
    }
    const char *bare = tool + strlen("mcp__") + strlen(m->name) + 2;
    json_t *params = json_pack("{s:s, s:o}", "name", bare, "arguments", args);
    if (!params) return agent_err(AGENT_ENOMEM, "out of memory");
    json_t *res = NULL;
    char *rpc_error = NULL;
    int rc = request(m, "tools/call", params, m->call_timeout_s, cancel, &res, &rpc_error);
    json_decref(params);
    if (rc < 0) return rc;
    if (rc == 1) { /* a JSON-RPC error: the tool could not run; tell the model */
        json_t *o = json_pack("{s:{s:s, s:s}}", "error", "code", "tool_error", "message",
                              rpc_error ? rpc_error : "error");
        free(rpc_error);
        *out_json = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(o);
        *is_error = true;
        return *out_json ? 0 : agent_err(AGENT_ENOMEM, "out of memory");
    }
    *out_json = result_for_model(res, is_error);
    json_decref(res);
    return *out_json ? 0 : agent_err(AGENT_ENOMEM, "out of memory");
}
