/* agent/run: the agent loop on a repository, on a worker thread, with its model turns served
 * by the chat service (so they share the scheduler with every other client) and approvals
 * asked from the client (docs/protocol.md §7).
 *
 * Threads. The worker runs agent_run_task: tool calls, approval waits, the loop's events (sent
 * with srv_conn_post). A model turn is handed to the service thread (srv_post), which submits
 * it and streams its text to the client; the worker waits for the end. Everything is in the
 * run, guarded by its mutex; the run is reference counted (the connection's call, the worker,
 * a pending post, a submitted turn). The module (one per server) lists the runs so that the
 * server's end can cancel them and wait for their workers (srv_at_free). */
#include "rpc_int.h"
#include "../loop_int.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

struct agent_rpc_run {
    agent_rpc_module *mod;
    agent_rpc_run *next_in_mod;
    srv *s;
    uint64_t conn_id;
    agent_rpc_call *call;       /* service thread: NULL once the connection let go */
    json_t *id;                 /* the agent/run request id (copy) */
    json_t *progress;           /* its workDoneToken (copy) or NULL */
    int step;                   /* model turns so far (worker) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    volatile int cancel;        /* the loop's cancel flag */
    bool end_posted, end_ran;
    char *final_text;           /* the agent/run answer, sent by run_end */
    bool turn_posted;           /* turn_submit queued and not run yet */
    /* approvals (worker asks, service thread answers) */
    char pending[48];           /* the outstanding request id, "" when none */
    int answer;                 /* -1 waiting, 0 denied, 1 approved */
    unsigned serial, n_asks;
    int call_k;                 /* the current callId number (worker) */
    /* the model turn in progress */
    json_t *turn_msgs, *turn_tools;
    int32_t turn_max;
    srv_job *job;               /* service thread */
    bool turn_done, turn_reasoning, turn_content;
    int turn_rc;
    char turn_err[256];
    agent_turn_info turn_info;
    srv_buf turn_text;
    /* the agent (worker thread) */
    agent *agent;
    agent_backend *backend;
    tool_ctx *tools;
    agent_policy *policy;
    char *task;
    int steps;
};

struct agent_rpc_module {
    srv *s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    agent_rpc_run *runs;
    int live;                   /* workers not finished */
    bool stopping;              /* the server is being freed: no more posts */
};

/* ----- reference counting ----- */

static void run_unref(agent_rpc_run *r) {
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left) return;
    agent_rpc_module *m = r->mod;
    pthread_mutex_lock(&m->mu);
    for (agent_rpc_run **p = &m->runs; *p; p = &(*p)->next_in_mod)
        if (*p == r) {
            *p = r->next_in_mod;
            break;
        }
    pthread_mutex_unlock(&m->mu);
    json_decref(r->id);
    json_decref(r->progress);
    free(r->final_text);
    json_decref(r->turn_tools);
    srv_buf_free(&r->turn_text);
    free(r->task);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static void run_ref(agent_rpc_run *r) {
    pthread_mutex_lock(&r->mu);
    r->refs++;
    pthread_mutex_unlock(&r->mu);
}

/* Worker: queue a message for the client (dropped when the server is going away). */
static void post_text(agent_rpc_run *r, char *text) {
    if (!text) return;
    pthread_mutex_lock(&r->mod->mu);
    if (!r->mod->stopping) srv_conn_post(r->s, r->conn_id, text, strlen(text));
    pthread_mutex_unlock(&r->mod->mu);
    free(text);
}

/* Worker: run fn on the service thread with a reference on r. False when it cannot. */
static bool post_fn(agent_rpc_run *r, void (*fn)(srv *s, void *arg)) {
    bool ok = false;
    run_ref(r);
    pthread_mutex_lock(&r->mod->mu);
    if (!r->mod->stopping) ok = srv_post(r->s, fn, r) == 0;
    pthread_mutex_unlock(&r->mod->mu);
    if (!ok) run_unref(r);
    return ok;
}

static void send_event(agent_rpc_run *r, json_t *event) {
    if (!event) return;
    post_text(r, agent_rpc_notification("agent/event",
                                        json_pack("{s:O, s:o}", "id", r->id, "event", event)));
}

/* Worker: $/progress for the run (when the client gave a workDoneToken). */
static void progress(agent_rpc_run *r, const char *kind, const char *tool) {
    if (!r->progress) return;
    json_t *v = json_pack("{s:s}", "kind", kind);
    if (v && strcmp(kind, "end")) {
        char m[200];
        snprintf(m, sizeof m, "step %d%s%s", r->step, tool ? ": " : "", tool ? tool : "");
        json_object_set_new(v, "message", json_string(m));
    }
    if (v)
        post_text(r, agent_rpc_notification("$/progress", json_pack("{s:O, s:o}", "token",
                                                                    r->progress, "value", v)));
}

/* ----- the model turn through the chat service ----- */

static void turn_end(agent_rpc_run *r, int rc, const char *err) {
    pthread_mutex_lock(&r->mu);
    r->turn_rc = rc;
    snprintf(r->turn_err, sizeof r->turn_err, "%s", err ? err : "");
    r->turn_done = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* Service thread: a piece of the turn's raw text, kept and shown to the client. */
static void turn_piece(agent_rpc_run *r, const char *t, size_t n) {
    if (!n) return;
    pthread_mutex_lock(&r->mu);
    int rc = srv_buf_add(&r->turn_text, t, n);
    pthread_mutex_unlock(&r->mu);
    if (rc || !r->call) return;
    agent_rpc_send(r->call->conn,
                   agent_rpc_notification("agent/event",
                                          json_pack("{s:O, s:{s:s, s:o}}", "id", r->id, "event",
                                                    "type", "text", "text",
                                                    agent_json_text(t, n))));
}

static void turn_wake(srv_job *j, void *user) {
    agent_rpc_run *r = user;
    srv_event ev;
    while (srv_job_next(j, &ev) == 1) {
        if (ev.type == SRV_EV_REASONING) {
            if (!r->turn_reasoning) turn_piece(r, "<think>\n", 8);
            r->turn_reasoning = true;
            turn_piece(r, ev.text, ev.len);
            continue;
        }
        if (r->turn_reasoning && !r->turn_content && ev.type != SRV_EV_DONE)
            turn_piece(r, "\n</think>\n\n", 11);
        if (ev.type == SRV_EV_TEXT || ev.type == SRV_EV_TOOL_CALL) {
            r->turn_content = true;
            if (ev.type == SRV_EV_TOOL_CALL && r->turn_text.len) turn_piece(r, "\n", 1);
            turn_piece(r, ev.text, ev.len);
            continue;
        }
        /* DONE */
        pthread_mutex_lock(&r->mu);
        r->turn_info.tokens = ev.usage.completion_tokens;
        r->turn_info.length = ev.finish == SRV_FINISH_LENGTH;
        double ms = ev.usage.total_ms - ev.usage.ttft_ms;
        r->turn_info.tokens_per_s = ms > 0 && ev.usage.completion_tokens > 1
                                        ? (ev.usage.completion_tokens - 1) * 1000.0 / ms : 0;
        pthread_mutex_unlock(&r->mu);
        srv_job *done = r->job;
        r->job = NULL;
        turn_end(r, ev.finish == SRV_FINISH_CANCELED ? AGENT_ECANCELED
                    : ev.finish == SRV_FINISH_ERROR ? AGENT_EINTERNAL : 0,
                 ev.finish == SRV_FINISH_ERROR && ev.error ? ev.error : NULL);
        srv_job_release(done); /* no more wakes after this */
        run_unref(r);          /* the submitted turn's reference */
        return;
    }
}

/* Service thread: submit the turn the worker prepared. */
static void turn_submit(srv *s, void *arg) {
    agent_rpc_run *r = arg;
    pthread_mutex_lock(&r->mu);
    r->turn_posted = false;
    pthread_mutex_unlock(&r->mu);
    if (r->cancel || !r->call) {
        turn_end(r, AGENT_ECANCELED, NULL);
        run_unref(r);
        return;
    }
    srv_chat_req q;
    memset(&q, 0, sizeof q);
    q.messages = r->turn_msgs;
    q.tools = json_array_size(r->turn_tools) ? r->turn_tools : NULL;
    q.tool_choice = SRV_TOOLS_AUTO;
    q.parallel_tool_calls = true;
    q.enable_thinking = -1;
    q.sampling = (srv_sampling)SRV_SAMPLING_INIT;
    q.sampling.temperature = 0.7f;
    q.sampling.max_tokens = r->turn_max;
    r->turn_reasoning = r->turn_content = false;
    int status;
    /* the post's reference now belongs to the submitted turn (released at its DONE) */
    if (srv_chat_submit(s, &q, turn_wake, r, &r->job, &status)) {
        turn_end(r, AGENT_EINTERNAL, agent_error_last());
        run_unref(r);
    }
}

typedef struct {
    agent_backend base;
    agent_rpc_run *run;
} chat_backend;

static int chat_turn(agent_backend *b, json_t *msgs, const char *tools_json,
                     const agent_turn_opts *o, char **out, agent_turn_info *info) {
    agent_rpc_run *r = ((chat_backend *)b)->run;
    memset(info, 0, sizeof *info);
    *out = NULL;
    json_t *tools = tools_json ? json_loads(tools_json, 0, NULL) : NULL;
    pthread_mutex_lock(&r->mu);
    json_decref(r->turn_tools);
    r->turn_msgs = msgs;
    r->turn_tools = tools;
    r->turn_max = o->max_tokens;
    r->turn_done = false;
    r->turn_text.len = 0;
    memset(&r->turn_info, 0, sizeof r->turn_info);
    r->turn_posted = true;
    pthread_mutex_unlock(&r->mu);
    if (!post_fn(r, turn_submit)) {
        pthread_mutex_lock(&r->mu);
        r->turn_posted = false;
        pthread_mutex_unlock(&r->mu);
        return agent_err(AGENT_ECANCELED, "the server is stopping");
    }
    pthread_mutex_lock(&r->mu);
    while (!r->turn_done) pthread_cond_wait(&r->cv, &r->mu);
    int rc = r->turn_rc;
    *info = r->turn_info;
    r->turn_msgs = NULL;
    *out = strndup(r->turn_text.p ? r->turn_text.p : "", r->turn_text.len);
    char err[256];
    snprintf(err, sizeof err, "%s", r->turn_err);
    pthread_mutex_unlock(&r->mu);
    if (!*out) return agent_err(AGENT_ENOMEM, "out of memory");
    if (rc == AGENT_ECANCELED) return agent_err(rc, "canceled");
    if (rc) return agent_err(rc, "%s", err[0] ? err : "the model turn failed");
    return 0;
}

static void chat_destroy(agent_backend *b) {
    free(b);
}

static agent_session *no_session(agent_backend *b) {
    (void)b;
    return NULL;
}

static int chat_backend_new(agent_backend **out, agent_rpc_run *r) {
    chat_backend *b = calloc(1, sizeof *b);
    if (!b) return agent_err(AGENT_ENOMEM, "out of memory");
    const char *tpl = engine_model_chat_template(srv_model(r->s));
    b->base.turn = chat_turn;
    b->base.destroy = chat_destroy;
    b->base.session = no_session;
    b->base.format = tpl && strstr(tpl, "<function=") ? AGENT_TOOLCALL_XML : AGENT_TOOLCALL_HERMES;
    b->run = r;
    *out = &b->base;
    return 0;
}

/* ----- the loop's callbacks (worker) ----- */

static void on_event(void *user, const char *event_json) {
    agent_rpc_run *r = user;
    json_t *ev = json_loads(event_json, 0, NULL);
    const char *type = json_string_value(json_object_get(ev, "type"));
    if (!type) {
        json_decref(ev);
        return;
    }
    char call_id[32];
    snprintf(call_id, sizeof call_id, "call_%d", r->call_k);
    bool outcome = !strcmp(type, "tool_result") || !strcmp(type, "refused") ||
                   !strcmp(type, "invalid_call");
    if (outcome || !strcmp(type, "tool_call")) json_object_set_new(ev, "callId",
                                                                   json_string(call_id));
    json_t *diff = NULL;
    if (!strcmp(type, "tool_result")) {
        json_t *res = json_loads(json_string_value(json_object_get(ev, "content")), 0, NULL);
        json_t *d = json_object_get(res, "diff");
        if (json_is_string(d) && json_string_length(d))
            diff = json_pack("{s:s, s:s, s:O, s:O}", "type", "diff", "callId", call_id, "name",
                             json_object_get(ev, "name"), "diff", d);
        json_decref(res);
    }
    json_object_del(ev, "tokens_per_s");
    if (!strcmp(type, "assistant")) {
        r->step = (int)json_integer_value(json_object_get(ev, "step"));
        progress(r, "report", NULL);
    } else if (!strcmp(type, "tool_call")) {
        progress(r, "report", json_string_value(json_object_get(ev, "name")));
    }
    send_event(r, ev);
    send_event(r, diff);
    if (outcome) r->call_k++;
}

static void on_text(void *user, const char *text, size_t len) {
    agent_rpc_run *r = user;
    send_event(r, json_pack("{s:s, s:o}", "type", "text", "text", agent_json_text(text, len)));
}

#define APPROVAL_WAIT_S 600

static bool ask(void *user, const char *tool, const char *args_json) {
    agent_rpc_run *r = user;
    pthread_mutex_lock(&r->mu);
    if (r->cancel) {
        pthread_mutex_unlock(&r->mu);
        return false;
    }
    snprintf(r->pending, sizeof r->pending, "s%u_%u", r->serial, ++r->n_asks);
    r->answer = -1;
    char id[48], call_id[32];
    snprintf(id, sizeof id, "%s", r->pending);
    snprintf(call_id, sizeof call_id, "call_%d", r->call_k);
    pthread_mutex_unlock(&r->mu);
    json_t *msg = json_pack("{s:s, s:s, s:s, s:{s:O, s:s, s:s, s:s, s:s}}", "jsonrpc", "2.0",
                            "id", id, "method", "agent/approval", "params", "runId", r->id,
                            "callId", call_id, "tool", tool, "arguments", args_json, "kind",
                            tool_is_mutating(tool) ? "edit" : "command");
    char *text = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
    json_decref(msg);
    post_text(r, text);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += APPROVAL_WAIT_S;
    pthread_mutex_lock(&r->mu);
    while (r->answer < 0 && !r->cancel)
        if (pthread_cond_timedwait(&r->cv, &r->mu, &until) == ETIMEDOUT) break;
    bool ok = r->answer == 1 && !r->cancel;
    r->pending[0] = 0;
    pthread_mutex_unlock(&r->mu);
    return ok;
}

void agent_rpc_agent_answer(agent_rpc_conn *c, const json_t *id, const json_t *result,
                            const json_t *error) {
    agent_rpc_run *r = c->run;
    const char *sid = json_string_value(id);
    if (!r || !sid) return;
    pthread_mutex_lock(&r->mu);
    if (r->pending[0] && !strcmp(r->pending, sid)) {
        r->answer = !error && json_is_true(json_object_get(result, "approved")) ? 1 : 0;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

/* ----- start, end, cancel ----- */

/* Service thread: the worker finished; its final answer was queued before this. */
static void run_end(srv *s, void *arg) {
    (void)s;
    agent_rpc_run *r = arg;
    r->end_ran = true;
    agent_rpc_call *call = r->call;
    if (call) {
        agent_rpc_conn *c = call->conn;
        /* the answer and the end of the run in one step: a next agent/run sent on receipt of
         * the answer finds the connection free */
        agent_rpc_send(c, r->final_text);
        r->final_text = NULL;
        c->script_pos += (size_t)r->steps;
        if (c->run == r) c->run = NULL;
        agent_rpc_call_end(call); /* releases the call's reference (run_free_state) */
    }
    run_unref(r);
}

static void *worker(void *arg) {
    agent_rpc_run *r = arg;
    agent_result res;
    memset(&res, 0, sizeof res);
    int rc = agent_run_task(r->agent, r->task, &res);
    r->steps = res.steps;
    json_t *summary = json_pack("{s:s, s:s, s:o, s:i, s:i, s:i, s:i, s:i, s:I}", "stop",
                                agent_stop_name(res.stop), "message", res.message, "answer",
                                res.answer ? json_string(res.answer) : json_null(), "steps",
                                res.steps, "toolCalls", res.tool_calls, "toolErrors",
                                res.tool_errors, "refused", res.refused, "invalid", res.invalid,
                                "tokens", (json_int_t)res.tokens);
    char *text;
    if (res.stop == AGENT_STOP_CANCELED)
        text = agent_rpc_error(r->id, RPC_REQUEST_CANCELLED, "request cancelled", summary);
    else if (rc < 0 && res.steps == 0)
        text = (json_decref(summary), agent_rpc_error(r->id, RPC_INTERNAL_ERROR,
                                                      res.message[0] ? res.message
                                                                     : agent_error_last(),
                                                      NULL));
    else
        text = agent_rpc_result(r->id, summary);
    free(res.answer);
    progress(r, "end", NULL);
    r->final_text = text; /* read by run_end on the service thread, after the post */
    bool posted = post_fn(r, run_end);
    pthread_mutex_lock(&r->mu);
    r->end_posted = posted;
    pthread_mutex_unlock(&r->mu);
    agent_free(r->agent);
    agent_backend_free(r->backend);
    tool_ctx_free(r->tools);
    agent_policy_free(r->policy);
    r->agent = NULL;
    r->backend = NULL;
    r->tools = NULL;
    r->policy = NULL;
    agent_rpc_module *m = r->mod;
    run_unref(r); /* the worker's reference */
    pthread_mutex_lock(&m->mu);
    m->live--;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

/* Stop a run: the loop sees the flag at its next token or call, an approval wait ends as a
 * denial, the model turn in progress is cancelled (service thread). */
static void run_cancel(agent_rpc_run *r) {
    pthread_mutex_lock(&r->mu);
    r->cancel = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (r->job) srv_job_cancel(r->job);
}

static void call_cancel(agent_rpc_call *call) {
    run_cancel(call->state);
}

/* The call lets go of the run (answered, or the connection closed). */
static void call_free_state(void *state) {
    agent_rpc_run *r = state;
    r->call = NULL;
    run_unref(r);
}

void agent_rpc_agent_close(agent_rpc_conn *c) {
    if (c->run) run_cancel(c->run);
    c->run = NULL;
}

/* The root, resolved, inside one of the connection's workspace folders. NULL after answering
 * the request with the error. */
static char *resolve_root(agent_rpc_conn *c, const json_t *id, const char *root) {
    char *path = agent_rpc_uri_path(root);
    char *real = path ? realpath(path, NULL) : NULL;
    free(path);
    struct stat st;
    if (!real || stat(real, &st) || !S_ISDIR(st.st_mode)) {
        agent_rpc_reply_error(c, id, RPC_NOT_ALLOWED, NULL, "root %s: not an existing directory",
                              root);
        free(real);
        return NULL;
    }
    size_t i;
    json_t *f;
    json_array_foreach(c->folders, i, f) {
        char *fr = realpath(json_string_value(json_object_get(f, "path")), NULL);
        size_t n = fr ? strlen(fr) : 0;
        bool inside = fr && !strncmp(real, fr, n) && (real[n] == '/' || !real[n] || n == 1);
        free(fr);
        if (inside) return real;
    }
    agent_rpc_reply_error(c, id, RPC_NOT_ALLOWED, NULL, "root %s is not inside a workspace "
                          "folder given to initialize", root);
    free(real);
    return NULL;
}

/* The test hook: SPARK_SERVE_AGENT_SCRIPT names a JSON array of replies; this connection's
 * runs use them in order (c->script_pos). NULL when unset; *err on a bad file. */
static char *script_replies(agent_rpc_conn *c, bool *err) {
    const char *path = getenv("SPARK_SERVE_AGENT_SCRIPT");
    *err = false;
    if (!path || !*path) return NULL;
    json_error_t je;
    json_t *all = json_load_file(path, 0, &je);
    *err = !json_is_array(all);
    json_t *rest = json_array();
    for (size_t i = c->script_pos; !*err && rest && i < json_array_size(all); i++)
        json_array_append(rest, json_array_get(all, i));
    char *s = !*err && rest ? json_dumps(rest, JSON_COMPACT) : NULL;
    json_decref(all);
    json_decref(rest);
    if (!s) *err = true;
    return s;
}

void agent_rpc_agent_run(agent_rpc_conn *c, const json_t *id, const json_t *params) {
    if (c->run) {
        agent_rpc_reply_error(c, id, RPC_BUSY, NULL, "an agent run is already active on this "
                              "connection");
        return;
    }
    const char *root = NULL, *task = NULL, *approval = NULL;
    int64_t max_steps = 0, max_tokens = 0;
    if (agent_rpc_param_str(c, id, params, "root", true, &root) ||
        agent_rpc_param_str(c, id, params, "task", true, &task) ||
        agent_rpc_param_str(c, id, params, "approval", false, &approval) ||
        agent_rpc_param_int(c, id, params, "maxSteps", 1, 10000, &max_steps) ||
        agent_rpc_param_int(c, id, params, "maxTokens", 1, INT64_MAX / 2, &max_tokens))
        return;
    int mode = approval ? agent_approval_parse(approval) : AGENT_APPROVAL_ASK;
    if (mode < 0) {
        agent_rpc_reply_error(c, id, RPC_INVALID_PARAMS, json_pack("{s:s}", "field", "approval"),
                              "approval: \"%s\" is not one of read-only, ask, auto-edit, "
                              "full-auto", approval);
        return;
    }
    json_t *rules = json_object_get(params, "rules");
    if (rules && !json_is_null(rules) && !json_is_object(rules)) {
        agent_rpc_reply_error(c, id, RPC_INVALID_PARAMS, json_pack("{s:s}", "field", "rules"),
                              "rules: must be an object {\"pattern\": \"allow|ask|deny\"}");
        return;
    }
    char *real = resolve_root(c, id, root);
    if (!real) return;
    agent_rpc_run *r = calloc(1, sizeof *r);
    if (!r) {
        free(real);
        agent_rpc_reply_error(c, id, RPC_INTERNAL_ERROR, NULL, "out of memory");
        return;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->mod = c->mod;
    r->s = c->s;
    r->conn_id = c->conn_id;
    r->id = json_deep_copy(id);
    json_t *tok = json_object_get(params, "workDoneToken");
    if (json_is_string(tok) || json_is_integer(tok)) r->progress = json_deep_copy(tok);
    r->task = strdup(task);
    r->serial = (unsigned)++c->next_server_id;
    r->refs = 1; /* the call's, below */
    char why[512] = "out of memory";
    int rc = r->id && r->task ? agent_policy_new(&r->policy, (agent_approval_mode)mode)
                              : AGENT_ENOMEM;
    if (!rc && rules && json_object_size(rules)) {
        char *rj = json_dumps(rules, JSON_COMPACT);
        rc = rj ? agent_policy_add_rules_json(r->policy, rj) : AGENT_ENOMEM;
        free(rj);
        if (rc) snprintf(why, sizeof why, "rules: %s", agent_error_last());
    }
    tool_options to = TOOL_OPTIONS_INIT;
    to.root = real;
    to.auto_checkpoint = true;
    if (!rc && tool_ctx_new(&r->tools, &to)) {
        rc = AGENT_EINVAL;
        snprintf(why, sizeof why, "root %s: %s", real, tool_error_last());
    }
    free(real);
    bool bad_script = false;
    char *script = rc ? NULL : script_replies(c, &bad_script);
    if (!rc && bad_script) {
        rc = AGENT_EINVAL;
        snprintf(why, sizeof why, "SPARK_SERVE_AGENT_SCRIPT: not a JSON array of replies");
    } else if (!rc) {
        rc = script ? agent_backend_scripted_new(&r->backend, script) : chat_backend_new(&r->backend, r);
        if (rc) snprintf(why, sizeof why, "%s", agent_error_last());
    }
    free(script);
    agent_loop_opts o = AGENT_LOOP_OPTS_INIT;
    o.tools = r->tools;
    o.policy = r->policy;
    o.max_steps = (int)max_steps;
    o.max_tokens = max_tokens;
    o.cancel = &r->cancel;
    o.on_event = on_event;
    o.on_text = on_text;
    o.ask = ask;
    o.user = r;
    if (!rc && agent_new(&r->agent, r->backend, &o)) {
        rc = AGENT_EINVAL;
        snprintf(why, sizeof why, "%s", agent_error_last());
    }
    agent_rpc_call *call = rc ? NULL : agent_rpc_call_new(c, id, params);
    if (!rc && !call) rc = AGENT_ENOMEM;
    if (rc) {
        agent_rpc_reply_error(c, id, rc == AGENT_ENOMEM ? RPC_INTERNAL_ERROR : RPC_INVALID_PARAMS,
                              NULL, "%s", why);
        agent_free(r->agent);
        agent_backend_free(r->backend);
        tool_ctx_free(r->tools);
        agent_policy_free(r->policy);
        run_unref(r);
        return;
    }
    call->state = r;
    call->free_state = call_free_state;
    call->on_cancel = call_cancel;
    r->call = call;
    r->refs = 2; /* the call's and the worker's */
    agent_rpc_module *m = c->mod;
    pthread_mutex_lock(&m->mu);
    r->next_in_mod = m->runs;
    m->runs = r;
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int trc = m->stopping ? EINVAL : pthread_create(&th, &attr, worker, r);
    pthread_attr_destroy(&attr);
    if (!trc) m->live++;
    pthread_mutex_unlock(&m->mu);
    if (trc) {
        r->refs = 1;
        agent_free(r->agent);
        agent_backend_free(r->backend);
        tool_ctx_free(r->tools);
        agent_policy_free(r->policy);
        r->agent = NULL;
        r->backend = NULL;
        r->tools = NULL;
        r->policy = NULL;
        agent_rpc_reply_error(c, id, RPC_INTERNAL_ERROR, NULL, "cannot start a thread: %s",
                              strerror(trc));
        agent_rpc_call_end(call);
        return;
    }
    c->run = r;
    agent_rpc_progress(call, "begin", "agent run", NULL, -1);
}

/* ----- the module ----- */

static void module_at_free(srv *s, void *arg) {
    (void)s;
    agent_rpc_module *m = arg;
    pthread_mutex_lock(&m->mu);
    m->stopping = true;
    for (agent_rpc_run *r = m->runs; r; r = r->next_in_mod) {
        pthread_mutex_lock(&r->mu);
        r->cancel = 1;
        if (!r->turn_done) {
            /* the service loop is gone: nobody will finish this turn */
            r->turn_done = true;
            r->turn_rc = AGENT_ECANCELED;
        }
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
    }
    while (m->live) pthread_cond_wait(&m->cv, &m->mu);
    pthread_mutex_unlock(&m->mu);
    /* references held by posts and turns the stopped loop will never run */
    for (;;) {
        pthread_mutex_lock(&m->mu);
        agent_rpc_run *r = m->runs;
        while (r && !((r->end_posted && !r->end_ran) || r->job || r->turn_posted))
            r = r->next_in_mod;
        pthread_mutex_unlock(&m->mu);
        if (!r) break;
        if (r->turn_posted) {
            r->turn_posted = false;
            run_unref(r);
        } else if (r->job) {
            r->job = NULL; /* freed with the chat service */
            run_unref(r);
        } else {
            r->end_ran = true;
            run_unref(r);
        }
    }
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

int agent_rpc_module_new(agent_rpc_module **out, srv *s) {
    agent_rpc_module *m = calloc(1, sizeof *m);
    if (!m) return agent_err(AGENT_ENOMEM, "out of memory");
    m->s = s;
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    int rc = srv_at_free(s, module_at_free, m);
    if (rc) {
        pthread_cond_destroy(&m->cv);
        pthread_mutex_destroy(&m->mu);
        free(m);
        return rc;
    }
    *out = m;
    return 0;
}
