/* The chat service: OpenAI-style chat requests and raw / fill-in-the-middle completions become
 * prompts for the engine scheduler (the model's chat template, the tool-call or JSON-schema
 * grammar), and the generated text becomes events (reasoning, content, tool calls, done).
 *
 * Threads: submit, next, cancel and release run on the service thread. The scheduler thread
 * only appends text to a job and sets its done state under the service's mutex, then wakes
 * the service thread, which hands the job to its owner's wake callback. A job is freed when
 * its owner released it, the scheduler reported it done and it is not queued for a wake. */
#include "server_core.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "../tool_grammar_int.h"

struct srv_job {
    srv_chat *c;
    uint64_t id;
    srv_job_wake_fn wake;
    void *user;
    /* the grammar (used on the scheduler thread while the request runs) */
    grammar *g;
    grammar_index *ix;
    grammar_matcher *gm;
    char *tools_json; /* for parsing calls; NULL: no tools */
    double deadline;  /* time budget end (ms, srv_now_ms), 0: none */
    atomic_int cancel;
    atomic_int timed_out;
    /* shared with the scheduler thread (c->mu) */
    srv_buf raw;
    srv_buf gaps;    /* float ms between consecutive tokens (the per-token histogram) */
    srv_buf tokbytes; /* the generated tokens' bytes (only with stop strings: which one
                       * ended the generation) */
    char *stops[4];  /* the request's stop strings (copies) */
    int n_stops;
    bool think_watch;   /* the turn may start with a think block: watch for </think> */
    srv_think_watch think_w; /* the tokens' bytes so far, for </think> across tokens */
    int32_t n_tokens;   /* tokens generated so far */
    int32_t think_end;  /* tokens through the one that completed the first </think>; -1 */
    double last_tok; /* srv_now_ms of the last token, 0 before the first */
    bool engine_done;
    int done_rc;
    engine_request_stats st;
    bool in_ready;   /* queued in c->ready */
    bool in_service; /* taken by srv_chat_service, not handled yet */
    struct srv_job *ready_next;
    /* service thread */
    bool released, counted, done_given;
    size_t taken;                /* bytes of raw handed to the splitter */
    srv_split split;             /* generated text -> events */
    struct srv_job *prev, *next; /* every live job */
};

struct srv_chat {
    srv *s;
    engine_model *m;
    engine_sched *sched;
    agent_template *tpl;
    const char *tpl_src;
    agent_toolcall_format fmt;
    grammar_vocab *gv;
    int32_t *eog;
    int n_eog;
    char eos_text[64], bos_text[64];
    int32_t fim_prefix, fim_suffix, fim_middle, file_sep, repo_name;
    int32_t n_ctx;
    pthread_mutex_t mu;
    srv_job *ready; /* jobs with news (c->mu) */
    bool no_wake;   /* the service loop is gone (c->mu) */
    srv_job *jobs;  /* live jobs (service thread) */
    srv_job **svc;  /* srv_chat_service's snapshot of the ready list */
    size_t svc_cap;
};

const char *srv_finish_name(srv_finish f) {
    static const char *n[] = {"stop", "length", "tool_calls", "time", "canceled", "error"};
    return (unsigned)f < sizeof n / sizeof n[0] ? n[f] : "error";
}

void srv_random_id(char *out, size_t cap, const char *prefix) {
    static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    unsigned char rnd[24];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        uint64_t x = (uint64_t)(srv_now_ms() * 1000.0) ^ (uint64_t)(uintptr_t)out;
        for (size_t i = 0; i < sizeof rnd; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            rnd[i] = (unsigned char)(x >> 56);
        }
    }
    size_t n = (size_t)snprintf(out, cap, "%s", prefix);
    for (size_t i = 0; i < sizeof rnd && n + 1 < cap; i++)
        out[n++] = al[rnd[i] % 62];
    if (n < cap) out[n] = 0;
}

static int32_t special_id(const engine_model *m, const char *text) {
    int32_t ids[4];
    size_t n = 0;
    if (engine_model_tokenize(m, text, strlen(text), true, ids, 4, &n) || n != 1) return -1;
    return engine_model_token_is_special(m, ids[0]) ? ids[0] : -1;
}

static void token_text(const engine_model *m, int32_t id, char *out, size_t cap) {
    size_t l = 0;
    const char *t = id >= 0 ? engine_model_token_bytes(m, id, &l) : NULL;
    snprintf(out, cap, "%.*s", t ? (int)l : 0, t ? t : "");
}

int srv_chat_new(srv_chat **out, srv *s, int32_t max_seqs, int32_t n_ctx) {
    *out = NULL;
    srv_chat *c = calloc(1, sizeof *c);
    if (!c) return agent_err(AGENT_ENOMEM, "out of memory");
    pthread_mutex_init(&c->mu, NULL);
    c->s = s;
    c->m = srv_model(s);
    int rc;
    c->tpl_src = engine_model_chat_template(c->m);
    if (c->tpl_src && (rc = agent_template_new(&c->tpl, c->tpl_src))) {
        rc = agent_err(rc, "the model's chat template: %s", agent_error_last());
        goto fail;
    }
    c->fmt = agent_toolcall_format_of(c->tpl_src);
    if ((rc = agent_grammar_vocab_new(&c->gv, &c->eog, &c->n_eog, c->m))) goto fail;
    token_text(c->m, engine_model_token_eos(c->m), c->eos_text, sizeof c->eos_text);
    token_text(c->m, engine_model_token_bos(c->m), c->bos_text, sizeof c->bos_text);
    c->fim_prefix = special_id(c->m, "<|fim_prefix|>");
    c->fim_suffix = special_id(c->m, "<|fim_suffix|>");
    c->fim_middle = special_id(c->m, "<|fim_middle|>");
    c->file_sep = special_id(c->m, "<|file_sep|>");
    c->repo_name = special_id(c->m, "<|repo_name|>");
    engine_sched_params sp = ENGINE_SCHED_PARAMS_INIT;
    sp.max_seqs = max_seqs;
    sp.n_ctx = n_ctx;
    if (engine_sched_new(&c->sched, c->m, &sp)) {
        rc = agent_err(AGENT_EINVAL, "engine scheduler: %s", engine_error_last());
        goto fail;
    }
    engine_model_info mi;
    engine_model_info_get(c->m, &mi);
    c->n_ctx = n_ctx > 0 ? n_ctx : mi.n_ctx;
    *out = c;
    return 0;
fail:
    srv_chat_free(c);
    return rc;
}

static void job_free(srv_job *j) {
    srv_chat *c = j->c;
    if (j->prev)
        j->prev->next = j->next;
    else if (c->jobs == j)
        c->jobs = j->next;
    if (j->next) j->next->prev = j->prev;
    grammar_matcher_free(j->gm);
    grammar_index_free(j->ix);
    grammar_free(j->g);
    free(j->tools_json);
    free(j->raw.p);
    free(j->gaps.p);
    free(j->tokbytes.p);
    for (int i = 0; i < j->n_stops; i++)
        free(j->stops[i]);
    srv_split_free(&j->split);
    free(j);
}

static void count_done(srv_job *j);

void srv_chat_free(srv_chat *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->no_wake = true;
    pthread_mutex_unlock(&c->mu);
    engine_sched_free(c->sched); /* on_done for every request still there */
    while (c->jobs) {
        srv_job *j = c->jobs;
        c->jobs = j->next;
        j->prev = j->next = NULL;
        count_done(j);
        job_free(j);
    }
    grammar_vocab_free(c->gv);
    free(c->eog);
    free(c->svc);
    agent_template_free(c->tpl);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

engine_sched *srv_chat_sched(srv_chat *c) {
    return c->sched;
}

/* ----- the scheduler thread's side ------------------------------------------------------ */
static void job_ready_locked(srv_job *j, bool *wake) {
    if (j->in_ready) return;
    j->in_ready = true;
    j->ready_next = j->c->ready;
    j->c->ready = j;
    *wake = !j->c->no_wake;
}

static int on_token(void *user, const char *text, size_t len, int32_t token) {
    srv_job *j = user;
    srv_chat *c = j->c;
    bool wake = false;
    double now = token >= 0 ? srv_now_ms() : 0;
    pthread_mutex_lock(&c->mu);
    if (len && srv_buf_add(&j->raw, text, len)) atomic_store(&j->cancel, 1);
    if (token >= 0 && j->n_stops) {
        size_t tl = 0;
        const char *tb = engine_model_token_bytes(c->m, token, &tl);
        if (tb && tl && srv_buf_add(&j->tokbytes, tb, tl)) atomic_store(&j->cancel, 1);
    }
    if (token >= 0) {
        j->n_tokens++;
        size_t tl = 0;
        const char *tb = j->think_watch && j->think_end < 0
                             ? engine_model_token_bytes(c->m, token, &tl) : NULL;
        if (tb && srv_think_watch_feed(&j->think_w, tb, tl)) j->think_end = j->n_tokens;
        float gap = (float)(now - j->last_tok);
        if (j->last_tok > 0 && srv_buf_add(&j->gaps, &gap, sizeof gap)) atomic_store(&j->cancel, 1);
        j->last_tok = now;
    }
    if (len) job_ready_locked(j, &wake);
    pthread_mutex_unlock(&c->mu);
    if (wake) srv_wake(c->s);
    if (j->deadline > 0 && srv_now_ms() > j->deadline) {
        atomic_store(&j->timed_out, 1);
        return 1;
    }
    return atomic_load(&j->cancel);
}

static void on_done(void *user, uint64_t id, int rc, const engine_request_stats *st) {
    (void)id;
    srv_job *j = user;
    srv_chat *c = j->c;
    bool wake = false;
    pthread_mutex_lock(&c->mu);
    j->engine_done = true;
    j->done_rc = rc;
    if (st) j->st = *st;
    job_ready_locked(j, &wake);
    pthread_mutex_unlock(&c->mu);
    if (wake) srv_wake(c->s);
}

/* ----- the service thread's side ---------------------------------------------------------- */
static srv_finish job_finish(srv_job *j, int *status, const char **err) {
    *status = 200;
    *err = NULL;
    if (j->done_rc == ENGINE_ECANCELED)
        return atomic_load(&j->timed_out) ? SRV_FINISH_TIME : SRV_FINISH_CANCELED;
    if (j->done_rc) {
        *status = j->done_rc == ENGINE_ERANGE ? 400 : j->done_rc == ENGINE_ENOMEM ? 503 : 500;
        *err = j->done_rc == ENGINE_ERANGE   ? "the prompt does not fit the context"
               : j->done_rc == ENGINE_ENOMEM ? "the request needs more KV blocks than the "
                                               "server has"
                                             : "the engine failed";
        return SRV_FINISH_ERROR;
    }
    if (j->st.gen.stop == ENGINE_STOP_LENGTH || j->st.gen.stop == ENGINE_STOP_CONTEXT)
        return SRV_FINISH_LENGTH;
    if (j->st.gen.stop == ENGINE_STOP_CANCELED) return SRV_FINISH_CANCELED;
    return srv_split_calls(&j->split) ? SRV_FINISH_TOOL_CALLS : SRV_FINISH_STOP;
}

static void usage_of(const srv_job *j, srv_usage *u) {
    u->prompt_tokens = j->st.gen.prompt_tokens;
    u->cached_tokens = j->st.gen.cached_tokens;
    u->completion_tokens = j->st.gen.generated_tokens;
    /* a think block that was not closed: every token was reasoning */
    int32_t r = !j->split.thought ? 0 : j->think_end >= 0 ? j->think_end : j->n_tokens;
    u->reasoning_tokens = r < u->completion_tokens ? r : u->completion_tokens;
    u->queue_ms = j->st.queue_ms;
    u->ttft_ms = j->st.ttft_ms;
    u->total_ms = j->st.total_ms;
}

static void count_done(srv_job *j) {
    if (j->counted || !j->engine_done) return;
    j->counted = true;
    srv_usage u;
    usage_of(j, &u);
    int status;
    const char *err;
    srv_metrics *m = srv_metrics_of(j->c->s);
    if (!m) return;
    srv_metrics_job(m, &u, job_finish(j, &status, &err));
    /* engine_done was set under the lock after the last on_token: gaps is final */
    srv_metrics_token_gaps(m, (const float *)(const void *)j->gaps.p, j->gaps.len / sizeof(float));
}

void srv_chat_service(srv_chat *c) {
    /* a snapshot: the scheduler thread may queue the same jobs again meanwhile, and a wake
     * callback may release other jobs of the snapshot (they stay until handled here) */
    size_t n = 0;
    pthread_mutex_lock(&c->mu);
    for (srv_job *j = c->ready; j; j = j->ready_next)
        n++;
    if (n > c->svc_cap) {
        srv_job **p = realloc(c->svc, n * 2 * sizeof *p);
        if (!p) {
            pthread_mutex_unlock(&c->mu);
            srv_wake(c->s); /* try again on the next turn */
            return;
        }
        c->svc = p;
        c->svc_cap = n * 2;
    }
    n = 0;
    for (srv_job *j = c->ready; j; j = j->ready_next) {
        c->svc[n++] = j;
        j->in_ready = false;
        j->in_service = true;
    }
    c->ready = NULL;
    pthread_mutex_unlock(&c->mu);
    srv_job **list = c->svc;
    for (size_t i = 0; i < n; i++) {
        srv_job *j = list[i];
        if (!j->released && j->wake) j->wake(j, j->user);
        pthread_mutex_lock(&c->mu);
        j->in_service = false;
        bool done = j->engine_done, queued = j->in_ready;
        pthread_mutex_unlock(&c->mu);
        if (done) count_done(j);
        if (j->released && done && !queued) job_free(j);
    }
}

int srv_chat_active(const srv_chat *c) {
    int n = 0;
    pthread_mutex_lock((pthread_mutex_t *)&c->mu);
    for (srv_job *j = c->jobs; j; j = j->next)
        n += !j->engine_done;
    pthread_mutex_unlock((pthread_mutex_t *)&c->mu);
    return n;
}

void srv_chat_cancel_all(srv_chat *c) {
    for (srv_job *j = c->jobs; j; j = j->next)
        srv_job_cancel(j);
}

void srv_job_cancel(srv_job *j) {
    if (!j || atomic_exchange(&j->cancel, 1)) return;
    engine_sched_cancel(j->c->sched, j->id); /* EINVAL when it finished meanwhile: fine */
}

void srv_job_release(srv_job *j) {
    if (!j) return;
    srv_chat *c = j->c;
    j->released = true;
    j->wake = NULL;
    pthread_mutex_lock(&c->mu);
    bool done = j->engine_done, busy = j->in_ready || j->in_service;
    pthread_mutex_unlock(&c->mu);
    if (!done) {
        srv_job_cancel(j);
        return; /* freed when on_done has been serviced */
    }
    count_done(j);
    if (!busy) job_free(j);
}

/* The stop string that ended the generation: the engine emitted the text before it (raw),
 * so it is the one whose occurrence in the generated tokens' bytes ends first (none of them
 * occurs earlier: the engine would have stopped there). The window starts a little before
 * the emitted text's end in case the token bytes and the emitted text differ slightly. */
static const char *job_stop_sequence(srv_job *j) {
    const char *best = NULL;
    size_t best_end = SIZE_MAX;
    const char *t = j->tokbytes.p;
    size_t n = j->tokbytes.len, from = j->raw.len > 64 ? j->raw.len - 64 : 0;
    for (int i = 0; i < j->n_stops && t; i++) {
        size_t sl = strlen(j->stops[i]);
        for (size_t p = from; p + sl <= n && p + sl < best_end; p++) {
            if (!memcmp(t + p, j->stops[i], sl)) {
                best_end = p + sl;
                best = j->stops[i];
                break;
            }
        }
    }
    /* one stop string and no trace of it in the bytes: it is still the one */
    if (!best && j->n_stops == 1) best = j->stops[0];
    return best;
}

int srv_job_next(srv_job *j, srv_event *ev) {
    memset(ev, 0, sizeof *ev);
    if (j->done_given) return 0;
    srv_chat *c = j->c;
    pthread_mutex_lock(&c->mu);
    bool done = j->engine_done;
    if (j->raw.len > j->taken) {
        if (srv_split_feed(&j->split, j->raw.p + j->taken, j->raw.len - j->taken)) {
            pthread_mutex_unlock(&c->mu);
            return 0;
        }
        j->taken = j->raw.len;
    }
    pthread_mutex_unlock(&c->mu);
    if (srv_split_next(&j->split, done, ev)) return 1;
    if (!done) return 0;
    /* everything parsed and the scheduler is done */
    j->done_given = true;
    ev->type = SRV_EV_DONE;
    ev->finish = job_finish(j, &ev->status, &ev->error);
    usage_of(j, &ev->usage);
    if (ev->finish == SRV_FINISH_STOP && j->st.gen.stop == ENGINE_STOP_STRING)
        ev->stop_sequence = job_stop_sequence(j);
    return 1;
}

/* ----- building requests -------------------------------------------------------------------- */
/* Set the HTTP status of a failed request and pass its error code on. */
static int fail_st(int *status_out, int status, int rc) {
    if (status_out) *status_out = status;
    return rc;
}

/* Message content as the templates want it: a string (text parts concatenated). */
static json_t *content_string(json_t *content, const char **why) {
    if (!content || json_is_null(content)) return json_string("");
    if (json_is_string(content)) return json_incref(content);
    if (!json_is_array(content)) {
        *why = "content must be a string or an array of parts";
        return NULL;
    }
    srv_buf b = {0};
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part) {
        const char *ty = json_string_value(json_object_get(part, "type"));
        const char *tx = json_string_value(json_object_get(part, "text"));
        if (json_is_string(part)) tx = json_string_value(part), ty = "text";
        if (!ty || (strcmp(ty, "text") && strcmp(ty, "input_text") && strcmp(ty, "output_text"))) {
            free(b.p);
            *why = "only text content parts are supported";
            return NULL;
        }
        if (!tx || srv_buf_add(&b, tx, strlen(tx))) {
            free(b.p);
            *why = "a text part needs its text";
            return NULL;
        }
    }
    json_t *s = json_stringn(b.p ? b.p : "", b.len);
    free(b.p);
    if (!s) *why = "content is not valid UTF-8";
    return s;
}

/* The messages the chat template sees. */
static json_t *normalize_messages(json_t *msgs, char *why_buf, size_t cap) {
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        snprintf(why_buf, cap, "messages must be a non-empty array");
        return NULL;
    }
    json_t *out = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        const char *why = NULL;
        if (!json_is_object(m) || !role) {
            snprintf(why_buf, cap, "messages[%zu]: an object with a role is needed", i);
            goto bad;
        }
        if (!strcmp(role, "developer")) role = "system";
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") &&
            strcmp(role, "tool")) {
            snprintf(why_buf, cap, "messages[%zu]: unknown role '%.40s'", i, role);
            goto bad;
        }
        json_t *content = content_string(json_object_get(m, "content"), &why);
        if (!content) {
            snprintf(why_buf, cap, "messages[%zu]: %s", i, why);
            goto bad;
        }
        json_t *n = json_pack("{s:s, s:o}", "role", role, "content", content);
        if (!n) goto nomem;
        json_t *rc = json_object_get(m, "reasoning_content");
        if (json_is_string(rc)) json_object_set(n, "reasoning_content", rc);
        json_t *tcid = json_object_get(m, "tool_call_id");
        if (json_is_string(tcid)) json_object_set(n, "tool_call_id", tcid);
        json_t *nm = json_object_get(m, "name");
        if (json_is_string(nm)) json_object_set(n, "name", nm);
        json_t *calls = json_object_get(m, "tool_calls");
        if (json_is_array(calls) && json_array_size(calls)) {
            json_t *nc = json_array();
            size_t k;
            json_t *call;
            json_array_foreach(calls, k, call) {
                json_t *fn = json_object_get(call, "function");
                const char *name = json_string_value(json_object_get(fn, "name"));
                json_t *args = json_object_get(fn, "arguments");
                if (!name) {
                    json_decref(nc);
                    json_decref(n);
                    snprintf(why_buf, cap, "messages[%zu].tool_calls[%zu]: no function name", i, k);
                    goto bad;
                }
                /* templates iterate the arguments: give them an object */
                json_t *obj = json_is_string(args) ? json_loads(json_string_value(args), 0, NULL)
                                                   : json_incref(args);
                if (!json_is_object(obj)) {
                    json_decref(obj);
                    obj = json_object();
                }
                json_t *c = json_pack("{s:s, s:s, s:{s:s, s:o}}", "type", "function", "id",
                                      json_string_value(json_object_get(call, "id"))
                                          ? json_string_value(json_object_get(call, "id"))
                                          : "",
                                      "function", "name", name, "arguments", obj);
                if (!c) {
                    json_decref(nc);
                    json_decref(n);
                    goto nomem;
                }
                json_array_append_new(nc, c);
            }
            json_object_set_new(n, "tool_calls", nc);
        }
        json_array_append_new(out, n);
    }
    return out;
nomem:
    snprintf(why_buf, cap, "out of memory");
bad:
    json_decref(out);
    return NULL;
}

static int check_tools(json_t *tools, char *why, size_t cap) {
    if (!json_is_array(tools)) {
        snprintf(why, cap, "tools must be an array");
        return -1;
    }
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        const char *ty = json_string_value(json_object_get(t, "type"));
        if (!json_is_object(fn) || (ty && strcmp(ty, "function")) ||
            !json_is_string(json_object_get(fn, "name"))) {
            snprintf(why, cap,
                     "tools[%zu]: expected {\"type\": \"function\", \"function\": "
                     "{\"name\", \"parameters\"}}",
                     i);
            return -1;
        }
        json_t *p = json_object_get(fn, "parameters");
        if (p && !json_is_object(p)) {
            snprintf(why, cap, "tools[%zu].function.parameters must be an object", i);
            return -1;
        }
    }
    return 0;
}

static int tokenize_alloc(const engine_model *m, const char *text, size_t len, bool special,
                          int32_t **ids, size_t *n) {
    size_t cap = len / 2 + 16;
    for (int tries = 0; tries < 2; tries++) {
        int32_t *p = malloc(cap * sizeof *p);
        if (!p) return agent_err(AGENT_ENOMEM, "out of memory");
        int rc = engine_model_tokenize(m, text, len, special, p, cap, n);
        if (rc == 0) {
            *ids = p;
            return 0;
        }
        free(p);
        if (rc != ENGINE_ERANGE)
            return agent_err(AGENT_EINVAL, "tokenize: %s", engine_error_last());
        cap = *n;
    }
    return agent_err(AGENT_EINTERNAL, "tokenize: size changed");
}

/* Render and tokenize a chat request. */
static int chat_prompt(srv_chat *c, const srv_chat_req *r, int enable_thinking, int32_t **ids,
                       size_t *n, int *status, bool *think_open) {
    if (!c->tpl)
        return fail_st(status, 400,
                       agent_err(AGENT_EINVAL, "%s", "the model has no chat template"));
    char why[256];
    json_t *msgs = normalize_messages(r->messages, why, sizeof why);
    if (!msgs) return fail_st(status, 400, agent_err(AGENT_EINVAL, "%s", why));
    char *mj = json_dumps(msgs, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(msgs);
    char *tj = r->tools && json_array_size(r->tools)
                   ? json_dumps(r->tools, JSON_COMPACT | JSON_PRESERVE_ORDER)
                   : NULL;
    agent_template_opts to = AGENT_TEMPLATE_OPTS_INIT;
    to.enable_thinking = enable_thinking;
    to.bos_token = c->bos_text;
    to.eos_token = c->eos_text;
    char *prompt = NULL;
    size_t plen = 0;
    int rc = mj ? agent_template_render(c->tpl, mj, tj, &to, &prompt, &plen)
                : agent_err(AGENT_ENOMEM, "out of memory");
    free(mj);
    free(tj);
    if (rc) {
        if (status) *status = rc == AGENT_ENOMEM ? 500 : 400;
        return agent_err(AGENT_EINVAL, "chat template: %s", agent_error_last());
    }
    /* a template that opens the think block itself (Qwen3's Thinking-2507 models end the
     * generation prompt with "<think>\n"): the generation starts inside it */
    if (think_open) {
        size_t e = plen;
        while (e && (prompt[e - 1] == '\n' || prompt[e - 1] == ' ')) e--;
        *think_open = e >= 7 && !memcmp(prompt + e - 7, "<think>", 7);
    }
    rc = tokenize_alloc(c->m, prompt, plen, true, ids, n);
    free(prompt);
    if (rc && status) *status = 500;
    return rc;
}

int srv_chat_count_tokens(srv *s, const srv_chat_req *req, int32_t *n_tokens, int *status) {
    srv_chat *c = srv_chat_of(s);
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = chat_prompt(c, req, req->enable_thinking, &ids, &n, status, NULL);
    free(ids);
    if (!rc) *n_tokens = (int32_t)n;
    return rc;
}

static int job_grammar(srv_chat *c, srv_job *j, const srv_chat_req *r, int *status) {
    bool tools = r->tools && json_array_size(r->tools) > 0;
    int rc = 0;
    if (tools) {
        json_t *copy = json_deep_copy(r->tools);
        if (!copy) return fail_st(status, 500, agent_err(AGENT_ENOMEM, "%s", "out of memory"));
        /* as the engine backend does: maxLength up to 128 kept, longer and unbounded strings
         * unbounded in the grammar's copy (bounds cost DFA states per character: the agent's
         * own tool set went past the compiler's state limit bounded at 1000); the parsed call
         * is still checked against the full schema */
        agent_schema_relax_ex(copy, 128, c->fmt == AGENT_TOOLCALL_XML, false);
        char *tj = json_dumps(copy, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(copy);
        j->tools_json = json_dumps(r->tools, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!tj || !j->tools_json) {
            free(tj);
            return fail_st(status, 500, agent_err(AGENT_ENOMEM, "%s", "out of memory"));
        }
        grammar_tool_options go = GRAMMAR_TOOL_OPTIONS_INIT;
        go.format = c->fmt == AGENT_TOOLCALL_XML ? GRAMMAR_TOOLS_QWEN3_XML : GRAMMAR_TOOLS_HERMES;
        go.mode = r->tool_choice == SRV_TOOLS_REQUIRED ? GRAMMAR_TOOLS_REQUIRED
                  : r->tool_choice == SRV_TOOLS_NAMED  ? GRAMMAR_TOOLS_NAMED
                  : r->tool_choice == SRV_TOOLS_NONE   ? GRAMMAR_TOOLS_NONE
                                                       : GRAMMAR_TOOLS_AUTO;
        go.name = r->tool_name;
        go.parallel = r->parallel_tool_calls;
        rc = grammar_new_tools(&j->g, tj, strlen(tj), &go);
        free(tj);
        if (rc < 0)
            return fail_st(status, 400,
                           agent_err(AGENT_EINVAL, "tool-call grammar: %s", grammar_error_last()));
        if (r->tool_choice == SRV_TOOLS_NONE) {
            free(j->tools_json); /* no calls can come: nothing to parse */
            j->tools_json = NULL;
        }
    } else if (r->json_schema || r->json_object) {
        json_t *copy =
            r->json_schema ? json_deep_copy(r->json_schema) : json_pack("{s:s}", "type", "object");
        if (!copy) return fail_st(status, 500, agent_err(AGENT_ENOMEM, "%s", "out of memory"));
        agent_schema_relax(copy, 1000, false);
        char *sj = json_dumps(copy, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(copy);
        if (!sj) return fail_st(status, 500, agent_err(AGENT_ENOMEM, "%s", "out of memory"));
        rc = grammar_new_json_schema(&j->g, sj, strlen(sj));
        free(sj);
        if (rc < 0)
            return fail_st(
                status, 400,
                agent_err(AGENT_EINVAL, "response_format schema: %s", grammar_error_last()));
    } else {
        return 0;
    }
    if (grammar_index_new(&j->ix, j->g, c->gv) < 0 ||
        grammar_matcher_new(&j->gm, j->ix, c->eog, c->n_eog) < 0)
        return fail_st(status, 500,
                       agent_err(AGENT_EINTERNAL, "grammar: %s", grammar_error_last()));
    return 0;
}

static void sampling_params(const srv_sampling *in, engine_sampling_params *sp) {
    *sp = (engine_sampling_params)ENGINE_SAMPLING_PARAMS_INIT;
    sp->temperature = in->temperature;
    sp->top_k = in->top_k;
    sp->top_p = in->top_p > 0 && in->top_p < 1 ? in->top_p : 1.0f;
    sp->min_p = in->min_p;
    sp->presence_penalty = in->presence_penalty;
    sp->frequency_penalty = in->frequency_penalty;
    sp->repeat_penalty = in->repeat_penalty > 0 ? in->repeat_penalty : 1.0f;
    if (in->has_seed) {
        sp->seed = in->seed;
    } else if (getrandom(&sp->seed, sizeof sp->seed, 0) != (ssize_t)sizeof sp->seed) {
        sp->seed = (uint64_t)(srv_now_ms() * 1e3);
    }
}

static int job_new(srv_chat *c, srv_job_wake_fn wake, void *user, srv_job **out) {
    srv_job *j = calloc(1, sizeof *j);
    if (!j) return agent_err(AGENT_ENOMEM, "out of memory");
    j->c = c;
    j->wake = wake;
    j->user = user;
    j->think_end = -1;
    *out = j;
    return 0;
}

static int job_submit(srv_chat *c, srv_job *j, const int32_t *ids, size_t n, const srv_sampling *sm,
                      const int32_t *stop_ids, size_t n_stop_ids, int *status) {
    if (n + 1 > (size_t)c->n_ctx) {
        if (status) *status = 400;
        return agent_err(AGENT_EINVAL, "the prompt has %zu tokens; the context holds %d", n,
                         (int)c->n_ctx);
    }
    engine_request rq;
    memset(&rq, 0, sizeof rq);
    rq.gen = (engine_gen_params)ENGINE_GEN_PARAMS_INIT;
    rq.gen.prompt = ids;
    rq.gen.n_prompt = n;
    rq.gen.max_tokens =
        sm->max_tokens > 0 ? sm->max_tokens : srv_limits_get(c->s)->max_tokens_default;
    sampling_params(sm, &rq.gen.sampling);
    if (j->gm) {
        rq.gen.sampling.mask = grammar_sampler_mask;
        rq.gen.sampling.accept = grammar_sampler_accept;
        rq.gen.sampling.free_mask = grammar_sampler_free;
        rq.gen.sampling.grammar_user = j->gm;
    }
    const char *stops[4];
    size_t ns = 0;
    for (int i = 0; i < sm->n_stop && i < 4; i++)
        if (sm->stop[i] && sm->stop[i][0]) stops[ns++] = sm->stop[i];
    for (size_t i = 0; i < ns; i++) {
        if (!(j->stops[i] = strdup(stops[i]))) {
            if (status) *status = 500;
            return agent_err(AGENT_ENOMEM, "out of memory");
        }
        j->n_stops = (int)i + 1;
    }
    rq.gen.ignore_eog = sm->ignore_eos;
    rq.gen.stop_strings = ns ? stops : NULL;
    rq.gen.n_stop_strings = ns;
    rq.gen.stop_tokens = n_stop_ids ? stop_ids : NULL;
    rq.gen.n_stop_tokens = n_stop_ids;
    rq.on_token = on_token;
    rq.on_done = on_done;
    rq.user = j;
    /* linked before submit: on_done may run at once on the scheduler thread */
    j->next = c->jobs;
    if (c->jobs) c->jobs->prev = j;
    c->jobs = j;
    int rc = engine_sched_submit(c->sched, &rq, &j->id);
    if (rc) {
        if (status) *status = rc == ENGINE_ERANGE ? 429 : rc == ENGINE_EINVAL ? 400 : 500;
        return agent_err(AGENT_EINVAL, "%s%s", rc == ENGINE_ERANGE ? "the server is busy: " : "",
                         engine_error_last());
    }
    return 0;
}

int srv_chat_submit(srv *s, const srv_chat_req *req, srv_job_wake_fn wake, void *user,
                    srv_job **out, int *status) {
    srv_chat *c = srv_chat_of(s);
    *out = NULL;
    if (status) *status = 400;
    char why[256];
    if (req->tools && check_tools(req->tools, why, sizeof why))
        return agent_err(AGENT_EINVAL, "%s", why);
    bool tools = req->tools && json_array_size(req->tools) > 0;
    if (req->tool_choice == SRV_TOOLS_NAMED || req->tool_choice == SRV_TOOLS_REQUIRED) {
        if (!tools) return agent_err(AGENT_EINVAL, "tool_choice needs tools");
    }
    if (req->tool_choice == SRV_TOOLS_NAMED && !req->tool_name)
        return agent_err(AGENT_EINVAL, "tool_choice names no function");
    srv_job *j = NULL;
    int rc = job_new(c, wake, user, &j);
    if (rc) return rc;
    /* a grammar from the first token leaves no room for a <think> block */
    bool constrained =
        (tools && req->tool_choice != SRV_TOOLS_AUTO && req->tool_choice != SRV_TOOLS_NONE) ||
        (!tools && (req->json_schema || req->json_object));
    int think = req->enable_thinking;
    if (think < 0 && constrained) think = 0;
    bool think_capable = c->tpl_src && strstr(c->tpl_src, "<think>") && think != 0;
    int32_t *ids = NULL;
    size_t n = 0;
    rc = job_grammar(c, j, req, status);
    srv_split_init(&j->split, false, think_capable, j->tools_json, c->fmt);
    srv_split_set_deltas(&j->split, req->stream_tool_args);
    j->think_watch = think_capable;
    bool think_open = false;
    if (!rc && !(rc = chat_prompt(c, req, think, &ids, &n, status, &think_open)) && think_open)
        srv_split_think_open(&j->split);
    if (rc || (rc = job_submit(c, j, ids, n, &req->sampling, NULL, 0, status))) {
        free(ids);
        j->engine_done = true; /* never reached the scheduler */
        j->released = true;
        job_free(j);
        return rc;
    }
    free(ids);
    *out = j;
    return 0;
}

/* Append the tokens of text (specials not parsed) or one special id. */
typedef struct {
    int32_t *p;
    size_t n, cap;
} ids_buf;

static int ids_add(ids_buf *b, const int32_t *ids, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->n + n > cap)
            cap *= 2;
        int32_t *p = realloc(b->p, cap * sizeof *p);
        if (!p) return agent_err(AGENT_ENOMEM, "out of memory");
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, ids, n * sizeof *ids);
    b->n += n;
    return 0;
}

static int ids_text(const engine_model *m, ids_buf *b, const char *text, bool special) {
    if (!text || !*text) return 0;
    int32_t *ids;
    size_t n;
    int rc = tokenize_alloc(m, text, strlen(text), special, &ids, &n);
    if (rc) return rc;
    rc = ids_add(b, ids, n);
    free(ids);
    return rc;
}

int srv_complete_submit(srv *s, const srv_complete_req *req, srv_job_wake_fn wake, void *user,
                        srv_job **out, int *status) {
    srv_chat *c = srv_chat_of(s);
    *out = NULL;
    if (status) *status = 400;
    if (!req->prompt) return agent_err(AGENT_EINVAL, "no prompt");
    ids_buf b = {0};
    int32_t stop_ids[5];
    size_t n_stop = 0;
    int rc = 0;
    if (req->suffix) {
        if (c->fim_prefix < 0 || c->fim_suffix < 0 || c->fim_middle < 0)
            return agent_err(AGENT_EINVAL, "the model has no fill-in-the-middle tokens");
        bool repo = req->repo_name || req->n_extra || req->file_name;
        if (repo && (c->file_sep < 0 || c->repo_name < 0))
            return agent_err(AGENT_EINVAL, "the model has no repository-context tokens");
        if (repo) {
            rc = ids_add(&b, &c->repo_name, 1);
            if (!rc) rc = ids_text(c->m, &b, req->repo_name ? req->repo_name : "repo", false);
            if (!rc) rc = ids_text(c->m, &b, "\n", false);
        }
        for (int i = 0; !rc && i < req->n_extra; i++) {
            rc = ids_add(&b, &c->file_sep, 1);
            if (!rc && req->extra[i].name) rc = ids_text(c->m, &b, req->extra[i].name, false);
            if (!rc) rc = ids_text(c->m, &b, "\n", false);
            if (!rc) rc = ids_text(c->m, &b, req->extra[i].text, false);
            if (!rc) rc = ids_text(c->m, &b, "\n", false);
        }
        if (!rc && repo) {
            /* Qwen2.5-Coder's repo-level layout: the current file's name, then its FIM */
            rc = ids_add(&b, &c->file_sep, 1);
            if (!rc && req->file_name) rc = ids_text(c->m, &b, req->file_name, false);
            if (!rc && req->file_name) rc = ids_text(c->m, &b, "\n", false);
        }
        if (!rc) rc = ids_add(&b, &c->fim_prefix, 1);
        if (!rc) rc = ids_text(c->m, &b, req->prompt, false);
        if (!rc) rc = ids_add(&b, &c->fim_suffix, 1);
        if (!rc) rc = ids_text(c->m, &b, req->suffix, false);
        if (!rc) rc = ids_add(&b, &c->fim_middle, 1);
        if (!rc && req->middle) rc = ids_text(c->m, &b, req->middle, false);
        /* a model that goes on past the middle starts another file or FIM block */
        const int32_t cand[] = {c->file_sep, c->fim_prefix, c->fim_suffix, c->fim_middle,
                                c->repo_name};
        for (size_t i = 0; i < 5; i++)
            if (cand[i] >= 0) stop_ids[n_stop++] = cand[i];
    } else {
        rc = ids_text(c->m, &b, req->prompt, true);
    }
    if (!rc && b.n == 0) rc = agent_err(AGENT_EINVAL, "the prompt is empty");
    srv_job *j = NULL;
    if (!rc) rc = job_new(c, wake, user, &j);
    if (!rc && j) {
        srv_split_init(&j->split, true, false, NULL, c->fmt);
        if (req->time_budget_ms > 0) j->deadline = srv_now_ms() + req->time_budget_ms;
        rc = job_submit(c, j, b.p, b.n, &req->sampling, stop_ids, n_stop, status);
        if (rc) {
            j->engine_done = true;
            j->released = true;
            job_free(j);
            j = NULL;
        }
    } else if (status && *status == 400 && rc == AGENT_ENOMEM) {
        *status = 500;
    }
    free(b.p);
    *out = j;
    return rc;
}
