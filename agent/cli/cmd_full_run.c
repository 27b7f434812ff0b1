/* spark-agent run / chat / sessions: the agent loop on the in-process engine (default), a
 * remote OpenAI-compatible server (--model-url) or a scripted reply file (--script, tests),
 * with JSONL transcripts under $XDG_STATE_HOME/spark-agent/sessions. */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "agent.h"

/* Ctrl-C: the first stops the current turn (the loop sees the flag), the second exits. */
static volatile int g_cancel;

static void on_sigint(int sig) {
    (void)sig;
    if (g_cancel) _exit(130);
    g_cancel = 1;
}

static int sessions_dir(char *out, size_t cap, bool create) {
    const char *x = getenv("XDG_STATE_HOME");
    const char *home = getenv("HOME");
    char base[4096];
    if (x && *x) snprintf(base, sizeof base, "%s", x);
    else if (home && *home) snprintf(base, sizeof base, "%s/.local/state", home);
    else return -1;
    snprintf(out, cap, "%s/spark-agent/sessions", base);
    if (!create) return 0;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s", out);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0700) && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(tmp, 0700) && errno != EEXIST) return -1;
    return 0;
}

typedef struct {
    bool json;
    bool tty;
    bool streamed;
    bool stats;    /* --stats: each turn's prompt, cache and speed figures on stderr */
    const char *cmd;
} ui;

/* --stats: "[stats: step S: P prompt tokens (C cached), G generated, T tok/s]" */
static void ui_stats(const char *ev) {
    json_t *e = json_loads(ev, 0, NULL);
    fprintf(stderr, "[stats: step %lld: %lld prompt tokens (%lld cached), %lld generated, "
            "%.1f tok/s]\n", (long long)json_integer_value(json_object_get(e, "step")),
            (long long)json_integer_value(json_object_get(e, "prompt_tokens")),
            (long long)json_integer_value(json_object_get(e, "cached_tokens")),
            (long long)json_integer_value(json_object_get(e, "tokens")),
            json_number_value(json_object_get(e, "tokens_per_s")));
    json_decref(e);
}

static void ui_event(void *user, const char *ev) {
    ui *u = user;
    if (u->stats && strstr(ev, "\"type\":\"assistant\"")) {
        if (u->streamed) fputc('\n', stderr), u->streamed = false;
        ui_stats(ev);
    }
    if (u->json) {
        printf("%s\n", ev);
        fflush(stdout);
        return;
    }
    /* human output: tool calls and refusals on stderr, the answer on stdout at the end */
    if (strstr(ev, "\"type\":\"tool_call\"") || strstr(ev, "\"type\":\"refused\"") ||
        strstr(ev, "\"type\":\"invalid_call\"")) {
        if (u->streamed) fputc('\n', stderr), u->streamed = false;
        fprintf(stderr, "%s%s%s\n", u->tty ? "\033[2m" : "", ev, u->tty ? "\033[0m" : "");
    } else if (strstr(ev, "\"type\":\"assistant\"")) {
        const char *t = strstr(ev, "\"tokens_per_s\":");
        if (t && u->tty) fprintf(stderr, "\033[2m[%.40s]\033[0m\n", t);
    }
}

static void ui_text(void *user, const char *text, size_t len) {
    ui *u = user;
    if (u->json || !u->tty) return;
    fwrite(text, 1, len, stderr);
    u->streamed = true;
}

static bool ui_ask(void *user, const char *tool, const char *args) {
    ui *u = user;
    FILE *t = fopen("/dev/tty", "r+");
    if (!t) return false;
    fprintf(t, "\n%sallow %s %s ? [y/N] ", u->tty ? "\033[1m" : "", tool, args);
    if (u->tty) fputs("\033[0m", t);
    fflush(t);
    char line[64] = "";
    bool yes = fgets(line, sizeof line, t) && (line[0] == 'y' || line[0] == 'Y');
    fclose(t);
    return yes;
}

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, len = 0;
    char *b = malloc(cap);
    size_t n;
    while (b && (n = fread(b + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len < 2) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) free(b);
            b = nb;
        }
    }
    fclose(f);
    if (b) b[len] = 0;
    return b;
}

typedef struct {
    const char *cmd;
    const char *model_flag, *model_url, *api_key, *remote_model, *script, *resume, *root;
    const char *approval, *default_approval, *approval_rules;
    const char *kv_cache; /* --kv-cache auto|MiB */
    const char *kv_type;  /* --kv f16|f32|q8_0 */
    const char *tools;    /* --tools NAME,...|none: the built-in tools offered */
    bool json, no_mcp, stats;
    int max_steps;
    long max_tokens;
    int ctx;
    const char *tools_mode;
} run_args;

/* Everything a run or chat needs, set up and torn down together. */
typedef struct {
    engine_model *model;
    agent_backend *backend;
    agent_policy *policy;
    tool_ctx *tools;
    agent *agent;
    agent_mcp *mcp[16];
    int n_mcp;
    char transcript[4400];
    char id[64];
    char tool_buf[1024];      /* --tools: the names, split in place */
    const char *tool_names[33];
    ui u;
} run_state;

static void state_free(run_state *s) {
    agent_free(s->agent);
    for (int i = 0; i < s->n_mcp; i++) agent_mcp_free(s->mcp[i]);
    agent_backend_free(s->backend);
    engine_model_free(s->model);
    agent_policy_free(s->policy);
    tool_ctx_free(s->tools);
}

static int transcript_meta(run_state *s, const run_args *a) {
    int fd = open(s->transcript, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    char ts[32];
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "type", "session", "id", s->id,
                          "created", ts, "root", tool_ctx_root(s->tools), "approval",
                          a->approval, "backend",
                          a->script ? "script" : a->model_url ? "remote" : "engine");
    char *line = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    ssize_t n = line ? (ssize_t)strlen(line) : -1, w = -1;
    if (line) {
        line[n] = '\n'; /* one write(2) of the whole line */
        w = write(fd, line, (size_t)n + 1) - 1;
    }
    free(line);
    close(fd);
    return w == n ? 0 : -1;
}

static int setup_policy(run_state *s, run_args *a, const cli_config *cfg);

/* The strings of a JSON array (NULL-terminated, borrowed from the array; NULL or not an array:
 * empty), or NULL on a non-string item or no memory. */
static const char **str_array(json_t *arr) {
    size_t n = json_array_size(arr);
    const char **v = calloc(n + 1, sizeof *v);
    for (size_t i = 0; v && i < n; i++) {
        if (!(v[i] = json_string_value(json_array_get(arr, i)))) {
            free(v);
            return NULL;
        }
    }
    return v;
}

/* The config's `mcp.NAME = {"command": "...", "args": [...], "env": {...}, "write": false,
 * "network": false, "read_only_paths": [...], "timeout_s": 120}` servers, started in the
 * workspace. A server that cannot be started fails the command (--no-mcp skips them). */
static int start_mcp(run_state *s, const run_args *a, const cli_config *cfg, bool unsandboxed) {
    json_error_t je;
    json_t *all = json_loads(cfg->mcp_servers, 0, &je);
    if (!json_is_object(all)) {
        cli_errorf(a->cmd, "%s: an mcp.NAME value is not a JSON object: %s", cfg->config_path,
                   je.text);
        json_decref(all);
        return CLI_EXIT_FAIL;
    }
    const char *name;
    json_t *sv;
    int rc = 0;
    json_object_foreach(all, name, sv) {
        static const char *const keys[] = {"command", "args", "env", "write", "network",
                                           "read_only_paths", "timeout_s"};
        const char *k;
        json_t *x;
        const char *bad = NULL;
        json_object_foreach(sv, k, x) {
            bool known = false;
            for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) known |= !strcmp(k, keys[i]);
            if (!known) bad = k;
        }
        const char *command = json_string_value(json_object_get(sv, "command"));
        json_t *args = json_object_get(sv, "args"), *env = json_object_get(sv, "env");
        json_t *ro = json_object_get(sv, "read_only_paths"), *to = json_object_get(sv,
                                                                                   "timeout_s");
        const char **argv = NULL, **ro_v = NULL, **env_v = NULL;
        char *env_buf = NULL;
        if (bad) {
            cli_errorf(a->cmd, "%s: mcp.%s: unknown key \"%s\" (command, args, env, write, "
                       "network, read_only_paths, timeout_s)", cfg->config_path, name, bad);
            rc = CLI_EXIT_FAIL;
        } else if (!command || (args && !json_is_array(args)) || (env && !json_is_object(env)) ||
                   (ro && !json_is_array(ro)) || (to && !json_is_number(to))) {
            cli_errorf(a->cmd, "%s: mcp.%s: needs \"command\" (a string); \"args\" and "
                       "\"read_only_paths\" are arrays of strings, \"env\" an object of "
                       "strings, \"timeout_s\" a number", cfg->config_path, name);
            rc = CLI_EXIT_FAIL;
        } else if (s->n_mcp == (int)(sizeof s->mcp / sizeof s->mcp[0])) {
            cli_errorf(a->cmd, "more than %zu MCP servers", sizeof s->mcp / sizeof s->mcp[0]);
            rc = CLI_EXIT_FAIL;
        } else {
            json_t *all_args = json_array();
            json_array_append_new(all_args, json_string(command));
            if (args) json_array_extend(all_args, args);
            argv = str_array(all_args);
            ro_v = str_array(ro);
            /* env: "K=V" strings in one buffer */
            size_t ne = json_object_size(env), cap = 1, at = 0;
            const char *ek;
            json_t *ev;
            json_object_foreach(env, ek, ev) cap += strlen(ek) + (json_is_string(ev) ?
                                                   strlen(json_string_value(ev)) : 0) + 2;
            env_buf = malloc(cap);
            env_v = calloc(ne + 1, sizeof *env_v);
            bool env_ok = env_buf && env_v;
            size_t i = 0;
            json_object_foreach(env, ek, ev) {
                if (!env_ok) break;
                if (!json_is_string(ev)) {
                    env_ok = false;
                    break;
                }
                env_v[i++] = env_buf + at;
                at += (size_t)sprintf(env_buf + at, "%s=%s", ek, json_string_value(ev)) + 1;
            }
            if (!argv || !ro_v || !env_ok) {
                cli_errorf(a->cmd, "%s: mcp.%s: \"args\" and \"read_only_paths\" must hold "
                           "strings, \"env\" string values", cfg->config_path, name);
                rc = CLI_EXIT_FAIL;
            } else {
                agent_mcp_opts mo = AGENT_MCP_OPTS_INIT;
                mo.name = name;
                mo.argv = argv;
                mo.env = env_v;
                mo.workspace = tool_ctx_root(s->tools);
                mo.write = json_is_true(json_object_get(sv, "write"));
                mo.network = json_is_true(json_object_get(sv, "network"));
                mo.unsandboxed = unsandboxed;
                mo.ro_paths = ro_v;
                mo.call_timeout_s = to ? json_number_value(to) : 0;
                if (agent_mcp_start(&s->mcp[s->n_mcp], &mo)) {
                    cli_errorf(a->cmd, "%s (skip MCP servers with --no-mcp)", agent_error_last());
                    rc = CLI_EXIT_FAIL;
                } else {
                    const char *w = agent_mcp_warnings(s->mcp[s->n_mcp]);
                    if (*w) fprintf(stderr, "%s", w);
                    s->n_mcp++;
                }
            }
            json_decref(all_args);
        }
        free(argv);
        free(ro_v);
        free(env_v);
        free(env_buf);
        if (rc) break;
    }
    json_decref(all);
    return rc;
}
static int setup_rest(run_state *s, const run_args *a, const cli_config *cfg, bool interactive);

static int setup(run_state *s, run_args *a, bool interactive) {
    memset(s, 0, sizeof *s);
    s->u.cmd = a->cmd;
    s->u.json = a->json;
    s->u.tty = isatty(2);
    s->u.stats = a->stats;
    cli_config *cfgp = malloc(sizeof *cfgp);
    if (!cfgp) {
        cli_errorf(a->cmd, "out of memory");
        return CLI_EXIT_FAIL;
    }
    int rc = cli_config_load(cfgp);
    if (rc != 0) {
        cli_errorf(a->cmd, "%s", cfgp->error);
        free(cfgp);
        return CLI_EXIT_FAIL;
    }
    rc = setup_policy(s, a, cfgp);
    if (!rc) rc = setup_rest(s, a, cfgp, interactive);
    free(cfgp);
    return rc;
}

/* Approval: --approval > SPARK_APPROVAL > the config's `approval` > the command's default;
 * rules from the config file, then SPARK_APPROVAL_RULES, then --approval-rules (later rules
 * win for the same tool). */
static int setup_policy(run_state *s, run_args *a, const cli_config *cfg) {
    const char *name = a->approval, *from = "--approval";
    if (!name && cfg->approval[0]) name = cfg->approval, from = cfg->approval_source;
    if (!name) name = a->default_approval, from = NULL;
    int mode = agent_approval_parse(name);
    if (mode < 0) {
        cli_errorf(a->cmd, "%s%sunknown approval mode '%s' (read-only, ask, auto-edit, "
                   "full-auto)", from ? from : "", from ? ": " : "", name);
        /* a bad file is a failure (as any config error); a bad flag or variable is usage */
        return from == cfg->approval_source && strcmp(from, "SPARK_APPROVAL") ? CLI_EXIT_FAIL
                                                                               : CLI_EXIT_USAGE;
    }
    a->approval = agent_approval_name((agent_approval_mode)mode);
    if (agent_policy_new(&s->policy, (agent_approval_mode)mode)) return CLI_EXIT_FAIL;
    struct {
        const char *json;
        char where[4200];
        int exit;
    } src[3] = {{cfg->approval_rules_file, "", CLI_EXIT_FAIL},
                {cfg->approval_rules_env, "SPARK_APPROVAL_RULES", CLI_EXIT_USAGE},
                {a->approval_rules, "--approval-rules", CLI_EXIT_USAGE}};
    snprintf(src[0].where, sizeof src[0].where, "%s:%d (approval_rules)", cfg->config_path,
             cfg->approval_rules_line);
    for (int i = 0; i < 3; i++) {
        if (!src[i].json || !src[i].json[0]) continue;
        if (agent_policy_add_rules_json(s->policy, src[i].json)) {
            cli_errorf(a->cmd, "%s: %s", src[i].where, agent_error_last());
            return src[i].exit;
        }
    }
    return 0;
}

static int setup_rest(run_state *s, const run_args *a, const cli_config *cfg,
                      bool interactive) {
    tool_options to = TOOL_OPTIONS_INIT;
    to.root = a->root;
    to.auto_checkpoint = true; /* git safety: snapshot before the first edit; `undo` restores */
    to.unsandboxed = !cfg->sandbox_required && getenv("SPARK_UNSANDBOXED");
    if (tool_ctx_new(&s->tools, &to)) {
        cli_errorf(a->cmd, "%s", tool_error_last());
        return CLI_EXIT_FAIL;
    }
    int rc;
    if (a->script) {
        char *sc = read_all(a->script);
        if (!sc) {
            cli_errorf(a->cmd, "cannot read %s: %s", a->script, strerror(errno));
            return CLI_EXIT_FAIL;
        }
        rc = agent_backend_scripted_new(&s->backend, sc);
        free(sc);
    } else if (a->model_url) {
        rc = agent_backend_remote_new(&s->backend, a->model_url, a->api_key, a->remote_model);
        /* --tool-calls required: the server constrains every turn to tool calls */
        if (rc == 0 && a->tools_mode && !strcmp(a->tools_mode, "required"))
            rc = agent_backend_remote_set_tool_choice(s->backend, "required");
    } else {
        char path[4096];
        if (cli_model_resolve(a->cmd, a->model_flag, cfg, path, sizeof path)) return 1;
        engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
        mp.n_threads = cfg->threads;
        mp.device = (engine_device)engine_device_parse(cfg->device);
        /* the prefix cache: the persisted system block (agent/backend_engine.c) and cached
         * prefixes need the model's paged KV pool */
        if (cli_kv_type_plan(a->cmd, a->kv_type, cfg, &mp) ||
            cli_kv_cache_plan(a->cmd, a->kv_cache, cfg, path, a->ctx, &mp, true))
            return CLI_EXIT_USAGE;
        if (a->stats) engine_log_set(NULL, NULL, ENGINE_LOG_DEBUG); /* prefix loads and saves */
        if (cli_model_load(a->cmd, &s->model, path, &mp)) return CLI_EXIT_FAIL;
        agent_engine_opts eo = AGENT_ENGINE_OPTS_INIT;
        eo.n_ctx = a->ctx;
        if (a->tools_mode && !strcmp(a->tools_mode, "required"))
            eo.tools_mode = AGENT_TOOLS_REQUIRED;
        else if (a->tools_mode && !strcmp(a->tools_mode, "none"))
            eo.tools_mode = AGENT_TOOLS_UNCONSTRAINED;
        rc = agent_backend_engine_new(&s->backend, s->model, &eo);
    }
    if (rc) {
        cli_errorf(a->cmd, "%s", agent_error_last());
        return CLI_EXIT_FAIL;
    }
    char dir[4200];
    if (sessions_dir(dir, sizeof dir, true)) {
        cli_errorf(a->cmd, "cannot create the sessions directory (XDG_STATE_HOME or HOME)");
        return CLI_EXIT_FAIL;
    }
    if (a->resume) {
        if (strchr(a->resume, '/') || strlen(a->resume) >= sizeof s->id) {
            cli_errorf(a->cmd, "bad session id '%s' (see spark-agent sessions)", a->resume);
            return CLI_EXIT_USAGE;
        }
        snprintf(s->id, sizeof s->id, "%s", a->resume);
    } else {
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        char ts[32];
        strftime(ts, sizeof ts, "%Y%m%d-%H%M%S", &tm);
        snprintf(s->id, sizeof s->id, "%s-%d", ts, (int)getpid());
    }
    snprintf(s->transcript, sizeof s->transcript, "%s/%s.jsonl", dir, s->id);
    if (a->resume && access(s->transcript, R_OK)) {
        cli_errorf(a->cmd, "no session %s (%s)", a->resume, s->transcript);
        return CLI_EXIT_FAIL;
    }
    if (!a->resume && transcript_meta(s, a)) {
        cli_errorf(a->cmd, "cannot write %s: %s", s->transcript, strerror(errno));
        return CLI_EXIT_FAIL;
    }
    if (!a->no_mcp && cfg->mcp_servers[0] &&
        (rc = start_mcp(s, a, cfg, to.unsandboxed)) != 0)
        return rc;
    agent_loop_opts o = AGENT_LOOP_OPTS_INIT;
    if (a->tools) { /* the built-in tools offered ("none": only the MCP servers' tools) */
        size_t n = 0;
        snprintf(s->tool_buf, sizeof s->tool_buf, "%s", strcmp(a->tools, "none") ? a->tools : "");
        char *save = NULL;
        for (char *t = strtok_r(s->tool_buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            char *schema = NULL;
            if (n == sizeof s->tool_names / sizeof s->tool_names[0] - 1 ||
                tool_schema_json(&schema, t) < 0) {
                cli_errorf(a->cmd, "--tools: no built-in tool '%s' (spark-agent tool --list)", t);
                return CLI_EXIT_USAGE;
            }
            free(schema);
            s->tool_names[n++] = t;
        }
        s->tool_names[n] = NULL;
        o.tool_names = s->tool_names;
    }
    o.mcp = s->mcp;
    o.n_mcp = s->n_mcp;
    o.tools = s->tools;
    o.policy = s->policy;
    o.max_steps = a->max_steps;
    o.max_tokens = a->max_tokens;
    o.cancel = &g_cancel;
    o.on_event = ui_event;
    o.on_text = ui_text;
    o.ask = interactive ? ui_ask : NULL;
    o.user = &s->u;
    o.transcript_path = s->transcript;
    if (agent_new(&s->agent, s->backend, &o)) {
        cli_errorf(a->cmd, "%s", agent_error_last());
        return CLI_EXIT_FAIL;
    }
    if (a->resume && agent_resume(s->agent, s->transcript)) {
        cli_errorf(a->cmd, "%s", agent_error_last());
        return CLI_EXIT_FAIL;
    }
    return 0;
}

static int parse_args(run_args *a, int argc, char **argv, int *first_arg) {
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},   {"model-url", required_argument, NULL, 'U'},
        {"api-key", required_argument, NULL, 'K'}, {"remote-model", required_argument, NULL, 'R'},
        {"approval", required_argument, NULL, 'a'}, {"json", no_argument, NULL, 'j'},
        {"max-steps", required_argument, NULL, 's'}, {"max-tokens", required_argument, NULL, 't'},
        {"resume", required_argument, NULL, 'r'},  {"script", required_argument, NULL, 'S'},
        {"root", required_argument, NULL, 'C'},    {"ctx", required_argument, NULL, 'c'},
        {"tool-calls", required_argument, NULL, 'T'}, {"help", no_argument, NULL, 'h'},
        {"approval-rules", required_argument, NULL, 'A'}, {"no-mcp", no_argument, NULL, 'N'},
        {"kv-cache", required_argument, NULL, 'k'}, {"stats", no_argument, NULL, 'x'},
        {"tools", required_argument, NULL, 'L'}, {"kv", required_argument, NULL, 'V'},
        {NULL, 0, NULL, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "+m:h", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'm': a->model_flag = optarg; break;
        case 'U': a->model_url = optarg; break;
        case 'K': a->api_key = optarg; break;
        case 'R': a->remote_model = optarg; break;
        case 'a': a->approval = optarg; break;
        case 'A': a->approval_rules = optarg; break;
        case 'N': a->no_mcp = true; break;
        case 'k': a->kv_cache = optarg; break;
        case 'V':
            a->kv_type = optarg;
            if (engine_kv_type_parse(optarg) < 0) {
                cli_errorf(a->cmd, "--kv %s: expected f16, f32 or q8_0", optarg);
                return -1;
            }
            break;
        case 'L': a->tools = optarg; break;
        case 'x': a->stats = true; break;
        case 'j': a->json = true; break;
        case 'r': a->resume = optarg; break;
        case 'S': a->script = optarg; break;
        case 'C': a->root = optarg; break;
        case 'T': a->tools_mode = optarg; break;
        case 's':
            a->max_steps = (int)strtol(optarg, &end, 10);
            if (*end || a->max_steps < 1) goto bad;
            break;
        case 't':
            a->max_tokens = strtol(optarg, &end, 10);
            if (*end || a->max_tokens < 1) goto bad;
            break;
        case 'c':
            a->ctx = (int)strtol(optarg, &end, 10);
            if (*end || a->ctx < 64) goto bad;
            break;
        case 'h':
            printf("usage: spark-agent %s %s[-m FILE | --model-url URL [--api-key K]] "
                   "[--approval MODE]\n       [--approval-rules JSON] [--json] [--max-steps N] [--max-tokens N] "
                   "[--resume ID] [--root DIR] [--ctx N]\n       [--tool-calls auto|required|none]"
                   " [--script REPLIES.json] [--no-mcp]\n       [--kv-cache auto|MiB] "
                   "[--kv f16|f32|q8_0] "
                   "[--stats] [--tools NAME,...|none]\n\n"
                   "Approval modes: read-only, ask (default for chat), auto-edit (default for "
                   "run),\nfull-auto; --approval > SPARK_APPROVAL > `approval =` in the config "
                   "file.\nPer-tool rules: --approval-rules / SPARK_APPROVAL_RULES / "
                   "`approval_rules =`,\ne.g. '{\"build\":\"allow\",\"git_*\":\"deny\"}' "
                   "(all apply; flag over variable over file).\n"
                   "Transcripts: $XDG_STATE_HOME/spark-agent/sessions/ID.jsonl.\n"
                   "--kv-cache: the prefix cache's KV pool (> SPARK_KV_CACHE > `kv_cache =`;\n"
                   "auto sizes it for the context; 0 off); the system block's KV is kept under\n"
                   "$XDG_CACHE_HOME/spark-agent/prefixes. --kv: the KV type (> SPARK_KV_TYPE >\n"
                   "`kv_type =`; default f16; q8_0 is about half of f16's memory, CPU only).\n"
                   "--stats: prompt and cached tokens per turn.\n--tools: offer only these built-in tools (none: only MCP servers' "
                   "tools).\n--tool-calls required with --model-url sends tool_choice "
                   "\"required\".\n"
                   "Exit status: 0 answered, 1 stopped otherwise (budget, refusal loop, error),\n"
                   "2 usage, 130 canceled.\n",
                   a->cmd, strcmp(a->cmd, "run") ? "" : "\"TASK\" ");
            return 1;
        default: return -1;
        }
    }
    if (a->model_flag && (a->model_url || a->script)) {
        cli_errorf(a->cmd, "-m and --model-url/--script exclude each other");
        return -1;
    }
    *first_arg = optind;
    return 0;
bad:
    cli_errorf(a->cmd, "bad number '%s'", optarg);
    return -1;
}

int cli_run(int argc, char **argv) {
    run_args a = {.cmd = "run", .default_approval = "auto-edit"};
    int first, pr = parse_args(&a, argc, argv, &first);
    if (pr) return pr > 0 ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    if (argc - first != 1) {
        cli_errorf("run", "give the task as one argument: spark-agent run \"TASK\"");
        return CLI_EXIT_USAGE;
    }
    run_state s;
    /* Ctrl-C from here on: a first one during the model's load or a turn stops the task
     * cleanly (transcript written, session resumable), a second one exits at once */
    signal(SIGINT, on_sigint);
    /* on a terminal "ask" decisions are asked; otherwise they are refusals */
    int rc = setup(&s, &a, isatty(0) && !a.json);
    if (rc) {
        state_free(&s);
        return rc;
    }
    agent_result res;
    agent_run_task(s.agent, argv[first], &res);
    if (!a.json) {
        if (s.u.streamed) fputc('\n', stderr);
        if (res.answer) printf("%s\n", res.answer);
        fprintf(stderr, "[%s: %s; %d steps, %d tool calls, %d refused, %d invalid; session %s]\n",
                agent_stop_name(res.stop), res.message, res.steps, res.tool_calls, res.refused,
                res.invalid, s.id);
    }
    free(res.answer);
    state_free(&s);
    if (res.stop == AGENT_STOP_CANCELED) return 130;
    return res.stop == AGENT_STOP_ANSWER ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}

int cli_chat(int argc, char **argv) {
    run_args a = {.cmd = "chat", .default_approval = "ask"};
    int first, pr = parse_args(&a, argc, argv, &first);
    if (pr) return pr > 0 ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    if (argc != first) {
        cli_errorf("chat", "no arguments expected (type messages at the prompt)");
        return CLI_EXIT_USAGE;
    }
    run_state s;
    int rc = setup(&s, &a, isatty(0));
    if (rc) {
        state_free(&s);
        return rc;
    }
    signal(SIGINT, on_sigint);
    bool tty = isatty(0);
    fprintf(stderr, "spark-agent chat (session %s). /help for commands, Ctrl-D to leave.\n",
            s.id);
    char *line = NULL;
    size_t cap = 0;
    for (;;) {
        if (tty) fprintf(stderr, "%s> %s", s.u.tty ? "\033[1m" : "", s.u.tty ? "\033[0m" : "");
        g_cancel = 0;
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0) break;
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (!n) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/help")) {
            fprintf(stderr, "/exit leave, /session show the transcript path, /messages print "
                    "the conversation as JSON. Ctrl-C stops a turn, twice exits.\n");
            continue;
        }
        if (!strcmp(line, "/session")) {
            fprintf(stderr, "%s\n", s.transcript);
            continue;
        }
        if (!strcmp(line, "/messages")) {
            char *m = agent_messages_json(s.agent);
            if (m) printf("%s\n", m);
            free(m);
            continue;
        }
        if (line[0] == '/') {
            fprintf(stderr, "unknown command %s (/help)\n", line);
            continue;
        }
        agent_result res;
        agent_run_task(s.agent, line, &res);
        if (s.u.streamed) fputc('\n', stderr), s.u.streamed = false;
        if (!a.json) {
            if (res.answer) printf("%s\n", res.answer);
            else fprintf(stderr, "[%s: %s]\n", agent_stop_name(res.stop), res.message);
            fflush(stdout);
        }
        free(res.answer);
    }
    free(line);
    state_free(&s);
    return CLI_EXIT_OK;
}

int cli_sessions(int argc, char **argv) {
    bool json = false;
    const char *show = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "show") && i + 1 < argc) show = argv[++i];
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: spark-agent sessions [--json] | sessions show ID\n\nLists the "
                   "transcripts under $XDG_STATE_HOME/spark-agent/sessions (resume one with "
                   "run/chat --resume ID).\n");
            return CLI_EXIT_OK;
        } else {
            cli_errorf("sessions", "unknown argument '%s'", argv[i]);
            return CLI_EXIT_USAGE;
        }
    }
    char dir[4200];
    if (sessions_dir(dir, sizeof dir, false)) {
        cli_errorf("sessions", "neither XDG_STATE_HOME nor HOME is set");
        return CLI_EXIT_FAIL;
    }
    if (show) {
        if (strchr(show, '/')) return CLI_EXIT_USAGE;
        char p[4400];
        snprintf(p, sizeof p, "%s/%s.jsonl", dir, show);
        char *t = read_all(p);
        if (!t) {
            cli_errorf("sessions", "no session %s", show);
            return CLI_EXIT_FAIL;
        }
        fputs(t, stdout);
        free(t);
        return CLI_EXIT_OK;
    }
    struct dirent **ents = NULL;
    int n = scandir(dir, &ents, NULL, alphasort);
    if (n < 0) {
        if (!json) printf("no sessions yet (%s)\n", dir);
        else printf("[]\n");
        return CLI_EXIT_OK;
    }
    if (json) printf("[");
    int shown = 0;
    for (int i = 0; i < n; i++) {
        const char *nm = ents[i]->d_name;
        size_t l = strlen(nm);
        if (l > 6 && !strcmp(nm + l - 6, ".jsonl")) {
            char p[4400];
            snprintf(p, sizeof p, "%s/%s", dir, nm);
            FILE *f = fopen(p, "r");
            char line[512] = "", task[81] = "";
            int msgs = 0;
            while (f && fgets(line, sizeof line, f)) {
                if (strstr(line, "\"role\"")) msgs++;
                static const char key[] = "{\"role\":\"user\",\"content\":\"";
                const char *u = strstr(line, key);
                if (u && !task[0]) {
                    snprintf(task, sizeof task, "%s", u + sizeof key - 1);
                    char *q = strchr(task, '"');
                    if (q) *q = 0;
                }
                /* a long line: skip to its end */
                while (f && !strchr(line, '\n') && fgets(line, sizeof line, f)) {}
            }
            if (f) fclose(f);
            if (json)
                printf("%s{\"id\":\"%.*s\",\"messages\":%d,\"path\":\"%s\"}", shown ? "," : "",
                       (int)(l - 6), nm, msgs, p);
            else
                printf("%-28.*s %4d messages  %s\n", (int)(l - 6), nm, msgs, task);
            shown++;
        }
        free(ents[i]);
    }
    free(ents);
    if (json) printf("]\n");
    else if (!shown) printf("no sessions yet (%s)\n", dir);
    return CLI_EXIT_OK;
}
