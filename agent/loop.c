/* The agent loop: model turn -> tool calls (parsed, validated) -> approval policy -> tools/ ->
 * results -> next turn, with budgets, repeated-call detection, cancel and a JSONL transcript. */
#include "loop_int.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char DEFAULT_SYSTEM[] =
    "You are spark-agent, a coding agent working in a git repository. Use the tools to read, "
    "search, edit, build and test the code. Make small, correct edits, build and test after "
    "changing code, and answer briefly without a tool call when the task is done.";

struct agent {
    agent_backend *b;
    agent_loop_opts o;
    char *system;
    char *tools_json;
    json_t *msgs;
    int next_call_id;
};

const char *agent_stop_name(agent_stop s) {
    static const char *const n[] = {"answer", "steps", "tokens", "canceled", "repeat", "error"};
    return (unsigned)s < sizeof n / sizeof n[0] ? n[s] : "?";
}

static int transcript_write(agent *a, json_t *obj) {
    if (!a->o.transcript_path) return 0;
    char *line = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!line) return agent_err(AGENT_ENOMEM, "out of memory");
    size_t n = strlen(line);
    line[n] = '\n'; /* json_dumps' NUL replaced: one write(2) of the whole line */
    int fd = open(a->o.transcript_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    int rc = 0;
    if (fd < 0) {
        rc = agent_err(AGENT_EINVAL, "transcript %s: %s", a->o.transcript_path,
                       strerror(errno));
    } else {
        ssize_t w = write(fd, line, n + 1);
        if (w != (ssize_t)(n + 1))
            rc = agent_err(AGENT_EINVAL, "transcript %s: short write", a->o.transcript_path);
        close(fd);
    }
    free(line);
    return rc;
}

static void emit(agent *a, json_t *ev) {
    if (a->o.on_event && ev) {
        char *s = json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (s) a->o.on_event(a->o.user, s);
        free(s);
    }
    json_decref(ev);
}

/* Append a message to the conversation and the transcript (steals m). */
static int add_msg(agent *a, json_t *m) {
    if (!m) return agent_err(AGENT_ENOMEM, "out of memory");
    int rc = transcript_write(a, m);
    json_array_append_new(a->msgs, m);
    return rc;
}

/* Offer the MCP servers' tools after the built-in ones. */
static int add_mcp_tools(agent *a) {
    json_t *all = json_loads(a->tools_json, 0, NULL);
    for (int i = 0; all && i < a->o.n_mcp; i++) {
        json_t *more = json_loads(agent_mcp_tools_json(a->o.mcp[i]), 0, NULL);
        if (!more || json_array_extend(all, more)) {
            json_decref(more);
            json_decref(all);
            return -1;
        }
        json_decref(more);
    }
    char *s = all ? json_dumps(all, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(all);
    if (!s) return -1;
    free(a->tools_json);
    a->tools_json = s;
    return 0;
}

static agent_mcp *mcp_of(const agent *a, const char *tool) {
    if (!tool || strncmp(tool, "mcp__", 5)) return NULL;
    for (int i = 0; i < a->o.n_mcp; i++)
        if (agent_mcp_has_tool(a->o.mcp[i], tool)) return a->o.mcp[i];
    return NULL;
}

/* The validator the parser applies: MCP tools against their server's schema, the rest against
 * the registry's. */
static int validate_call(void *user, const char *name, const char *args_json, char **err) {
    agent_mcp *m = mcp_of(user, name);
    if (m) return agent_mcp_check_args(m, name, args_json, err);
    return agent_validate_builtin(NULL, name, args_json, err);
}

void agent_free(agent *a) {
    if (!a) return;
    json_decref(a->msgs);
    free(a->system);
    free(a->tools_json);
    free(a);
}

int agent_new(agent **out, agent_backend *b, const agent_loop_opts *opts) {
    if (!out || !b || !opts) return agent_err(AGENT_EINVAL, "agent_new: NULL argument");
    *out = NULL;
    if (!opts->tools) return agent_err(AGENT_EINVAL, "agent_new: no tool context");
    agent *a = calloc(1, sizeof *a);
    if (!a) return agent_err(AGENT_ENOMEM, "out of memory");
    a->b = b;
    a->o = *opts;
    if (!a->o.max_steps) a->o.max_steps = 50;
    if (!a->o.max_turn_tokens) a->o.max_turn_tokens = 4096;
    if (!a->o.tool_output_cap) a->o.tool_output_cap = 16 * 1024;
    if (!a->o.repeat_limit) a->o.repeat_limit = 3;
    a->system = strdup(opts->system_prompt ? opts->system_prompt : DEFAULT_SYSTEM);
    a->msgs = json_array();
    if (!a->system || !a->msgs || tool_schemas_json(&a->tools_json, TOOL_FORMAT_OPENAI) < 0) {
        agent_free(a);
        return agent_err(AGENT_ENOMEM, "agent_new: %s", tool_error_last());
    }
    if (opts->tool_names) { /* offer only the named tools */
        json_t *all = json_loads(a->tools_json, 0, NULL), *keep = json_array();
        size_t i;
        json_t *t;
        json_array_foreach(all, i, t) {
            const char *n = json_string_value(
                json_object_get(json_object_get(t, "function"), "name"));
            for (const char *const *w = opts->tool_names; n && *w; w++)
                if (!strcmp(*w, n)) json_array_append(keep, t);
        }
        free(a->tools_json);
        a->tools_json = keep ? json_dumps(keep, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(all);
        json_decref(keep);
        if (!a->tools_json) {
            agent_free(a);
            return agent_err(AGENT_ENOMEM, "out of memory");
        }
    }
    if (opts->n_mcp > 0 && add_mcp_tools(a) != 0) {
        agent_free(a);
        return agent_err(AGENT_ENOMEM, "out of memory");
    }
    json_array_append_new(a->msgs, json_pack("{s:s, s:s}", "role", "system", "content",
                                             a->system));
    *out = a;
    return 0;
}

int agent_resume(agent *a, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return agent_err(AGENT_EINVAL, "transcript %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = 0, lineno = 0;
    while ((n = getline(&line, &cap, f)) > 0) {
        lineno++;
        json_error_t je;
        json_t *m = json_loadb(line, (size_t)n, 0, &je);
        if (!m) {
            /* a torn last line (a crash mid-write) is skipped; anything else is an error */
            int c = fgetc(f);
            if (c == EOF) break;
            rc = agent_err(AGENT_EINVAL, "transcript %s line %d: %s", path, lineno, je.text);
            break;
        }
        const char *role = json_string_value(json_object_get(m, "role"));
        if (role && strcmp(role, "system")) {
            json_array_append(a->msgs, m);
            if (!strcmp(role, "tool")) a->next_call_id++;
        }
        json_decref(m);
    }
    free(line);
    fclose(f);
    return rc;
}

char *agent_messages_json(const agent *a) {
    return json_dumps(a->msgs, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
}

/* Split a leading "<think>...</think>" off the content. */
static json_t *assistant_msg(const char *raw, const agent_reply *r, int *call_id) {
    const char *c = r->content;
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string("assistant"));
    const char *te;
    if (!strncmp(c, "<think>", 7) && (te = strstr(c, "</think>"))) {
        const char *rs = c + 7;
        size_t rl = (size_t)(te - rs);
        while (rl && (*rs == '\n')) rs++, rl--;
        while (rl && rs[rl - 1] == '\n') rl--;
        json_object_set_new(m, "reasoning_content", json_stringn(rs, rl));
        c = te + 8;
        while (*c == '\n' || *c == ' ') c++;
    }
    json_object_set_new(m, "content", json_string(c));
    if (r->n_calls) {
        json_t *calls = json_array();
        for (size_t i = 0; i < r->n_calls; i++) {
            json_t *args = r->calls[i].args_json ? json_loads(r->calls[i].args_json, 0, NULL)
                                                 : json_object();
            char id[32];
            snprintf(id, sizeof id, "call_%d", (*call_id)++);
            json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:o}}", "id", id, "type",
                                                   "function", "function", "name",
                                                   r->calls[i].name ? r->calls[i].name : "",
                                                   "arguments", args ? args : json_object()));
        }
        json_object_set_new(m, "tool_calls", calls);
    }
    json_object_set_new(m, "raw", json_string(raw));
    return m;
}

static char *error_json(const char *code, const char *msg) {
    json_t *e = json_pack("{s:{s:s, s:s}}", "error", "code", code, "message", msg);
    char *s = e ? json_dumps(e, JSON_COMPACT) : NULL;
    json_decref(e);
    return s;
}

static void stopf(agent_result *res, agent_stop s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void stopf(agent_result *res, agent_stop s, const char *fmt, ...) {
    res->stop = s;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(res->message, sizeof res->message, fmt, ap);
    va_end(ap);
}

int agent_run_task(agent *a, const char *task, agent_result *res) {
    if (!res) return agent_err(AGENT_EINVAL, "agent_run_task: NULL result");
    memset(res, 0, sizeof *res);
    res->stop = AGENT_STOP_ERROR;
    if (!a || !task) {
        snprintf(res->message, sizeof res->message, "no task");
        return agent_err(AGENT_EINVAL, "agent_run_task: NULL argument");
    }
    int rc = add_msg(a, json_pack("{s:s, s:s}", "role", "user", "content", task));
    if (rc) {
        snprintf(res->message, sizeof res->message, "%s", agent_error_last());
        return rc;
    }
    char *last_sig = NULL;
    size_t last_len = 0;
    int repeats = 0;
    bool done = false;
    while (!done) {
        if (a->o.cancel && *a->o.cancel) {
            stopf(res, AGENT_STOP_CANCELED, "canceled");
            break;
        }
        if (res->steps >= a->o.max_steps) {
            snprintf(res->message, sizeof res->message, "step budget reached (%d model turns)",
                     a->o.max_steps);
            res->stop = AGENT_STOP_STEPS;
            break;
        }
        if (a->o.max_tokens && res->tokens >= a->o.max_tokens) {
            snprintf(res->message, sizeof res->message, "token budget reached (%lld tokens)",
                     (long long)res->tokens);
            res->stop = AGENT_STOP_TOKENS;
            break;
        }
        int32_t turn_max = a->o.max_turn_tokens;
        if (a->o.max_tokens && a->o.max_tokens - res->tokens < turn_max)
            turn_max = (int32_t)(a->o.max_tokens - res->tokens); /* the task's budget bounds it */
        agent_turn_opts to = {turn_max, a->o.cancel, a->o.on_text, a->o.user};
        char *text = NULL;
        agent_turn_info info;
        int trc = a->b->turn(a->b, a->msgs, a->tools_json, &to, &text, &info);
        res->steps++;
        res->tokens += info.tokens;
        if (trc < 0 && trc != AGENT_ECANCELED) {
            stopf(res, AGENT_STOP_ERROR, "model backend: %s", agent_error_last());
            free(text);
            rc = trc;
            break;
        }
        agent_reply r;
        rc = agent_toolcall_parse(&r, text ? text : "", text ? strlen(text) : 0, a->b->format,
                                  a->tools_json, validate_call, a);
        if (rc) {
            stopf(res, AGENT_STOP_ERROR, "%s", agent_error_last());
            free(text);
            break;
        }
        json_t *am = assistant_msg(text ? text : "", &r, &a->next_call_id);
        free(text);
        int first_id = a->next_call_id - (int)r.n_calls;
        emit(a, json_pack("{s:s, s:i, s:O, s:O, s:I, s:b, s:f, s:I, s:I}", "type", "assistant",
                          "step", res->steps, "content", json_object_get(am, "content"),
                          "reasoning", json_object_get(am, "reasoning_content") ?
                          json_object_get(am, "reasoning_content") : json_null(), "tokens",
                          (json_int_t)info.tokens, "truncated", info.length, "tokens_per_s",
                          info.tokens_per_s, "prompt_tokens", (json_int_t)info.prompt_tokens,
                          "cached_tokens", (json_int_t)info.cached_tokens));
        if ((rc = add_msg(a, am))) {
            agent_reply_clear(&r);
            stopf(res, AGENT_STOP_ERROR, "%s", agent_error_last());
            break;
        }
        if (trc == AGENT_ECANCELED) {
            agent_reply_clear(&r);
            stopf(res, AGENT_STOP_CANCELED, "canceled during the model's turn");
            rc = 0;
            break;
        }
        size_t n_valid = 0;
        for (size_t i = 0; i < r.n_calls; i++) n_valid += !r.calls[i].error;
        if (info.length && !n_valid) {
            snprintf(res->message, sizeof res->message, "the model's turn did not end within "
                     "%d tokens", turn_max);
            res->stop = AGENT_STOP_TOKENS;
            agent_reply_clear(&r);
            break;
        }
        if (!r.n_calls) {
            res->stop = AGENT_STOP_ANSWER;
            res->answer = strdup(json_string_value(json_object_get(am, "content")));
            snprintf(res->message, sizeof res->message, "answered");
            agent_reply_clear(&r);
            break;
        }
        for (size_t i = 0; i < r.n_calls && !done; i++) {
            agent_toolcall *c = &r.calls[i];
            char *result = NULL;
            const char *kind = "tool_result";
            bool ok = false;
            if (c->error) {
                res->invalid++;
                result = error_json("invalid_call", c->error);
                kind = "invalid_call";
            } else {
                size_t nl = strlen(c->name), al = strlen(c->args_json);
                char *sig = malloc(nl + al + 2);
                if (sig) {
                    memcpy(sig, c->name, nl + 1);
                    memcpy(sig + nl + 1, c->args_json, al + 1);
                    repeats = last_sig && last_len == nl + al + 2 &&
                                      !memcmp(last_sig, sig, nl + al + 2) ? repeats + 1 : 1;
                    free(last_sig);
                    last_sig = sig;
                    last_len = nl + al + 2;
                }
                if (repeats >= a->o.repeat_limit) {
                    char m[256];
                    snprintf(m, sizeof m, "the call %s was repeated %d times in a row with the "
                             "same arguments", c->name, repeats);
                    snprintf(res->message, sizeof res->message, "%s", m);
                    res->stop = AGENT_STOP_REPEAT;
                    result = error_json("repeated_call", m);
                    kind = "refused";
                    done = true;
                } else {
                    agent_decision d = agent_policy_decide(a->o.policy, c->name);
                    if (d == AGENT_DECIDE_ASK)
                        d = a->o.ask && a->o.ask(a->o.user, c->name, c->args_json)
                                ? AGENT_DECIDE_ALLOW : AGENT_DECIDE_DENY;
                    emit(a, json_pack("{s:s, s:s, s:s, s:s}", "type", "tool_call", "name",
                                      c->name, "arguments", c->args_json, "decision",
                                      agent_decision_name(d)));
                    if (d != AGENT_DECIDE_ALLOW) {
                        char m[512];
                        snprintf(m, sizeof m, "%s was not run: the approval policy (%s%s) does "
                                 "not allow it here. Do the task without it or explain what "
                                 "you need.", c->name,
                                 agent_approval_name(agent_policy_mode(a->o.policy)),
                                 a->o.ask ? ", the user declined" : ", non-interactive");
                        res->refused++;
                        result = error_json("refused", m);
                        kind = "refused";
                    } else {
                        char *out = NULL;
                        agent_mcp *mcp = mcp_of(a, c->name);
                        int tr;
                        if (mcp) {
                            bool is_err = false;
                            tr = agent_mcp_call(mcp, c->name, c->args_json, a->o.cancel, &out,
                                                &is_err);
                            if (tr == 0 && is_err) tr = -1;
                            if (!out) out = error_json(tr == AGENT_ECANCELED ? "canceled"
                                                                             : "mcp_error",
                                                       agent_error_last());
                        } else {
                            tr = tool_call(a->o.tools, c->name, c->args_json, &out);
                            if (!out) out = error_json(tool_error_name(tr), tool_error_last());
                        }
                        ok = tr == 0;
                        res->tool_calls++;
                        if (tr) res->tool_errors++;
                        if (out && strlen(out) > a->o.tool_output_cap) {
                            char *cut = NULL;
                            if (!tool_bound_text(&cut, out, strlen(out), a->o.tool_output_cap)) {
                                free(out);
                                out = cut;
                            }
                        }
                        result = out;
                    }
                }
            }
            if (!result) {
                rc = agent_err(AGENT_ENOMEM, "out of memory");
                stopf(res, AGENT_STOP_ERROR, "%s", "out of memory");
                done = true;
                break;
            }
            char id[32];
            snprintf(id, sizeof id, "call_%d", first_id + (int)i);
            emit(a, json_pack("{s:s, s:s, s:b, s:s}", "type", kind, "name",
                              c->name ? c->name : "", "ok", ok, "content", result));
            int arc = add_msg(a, json_pack("{s:s, s:s, s:s, s:s}", "role", "tool",
                                           "tool_call_id", id, "name", c->name ? c->name : "",
                                           "content", result));
            free(result);
            if (arc) {
                rc = arc;
                stopf(res, AGENT_STOP_ERROR, "%s", agent_error_last());
                done = true;
            }
            if (a->o.cancel && *a->o.cancel && !done) {
                stopf(res, AGENT_STOP_CANCELED, "canceled");
                done = true;
            }
        }
        agent_reply_clear(&r);
    }
    free(last_sig);
    emit(a, json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:I}", "type", "stop",
                      "reason", agent_stop_name(res->stop), "message", res->message, "steps",
                      res->steps, "tool_calls", res->tool_calls, "refused", res->refused,
                      "invalid", res->invalid, "tool_errors", res->tool_errors, "tokens",
                      (json_int_t)res->tokens));
    return rc;
}
