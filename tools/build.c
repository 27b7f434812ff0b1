/* build and test: detect the build system, run through sandbox_run, parse diagnostics. */
#include "tool_int.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sandbox.h"

extern char **environ;

typedef struct {
    const char *name;
    const char *marker;                 /* file whose presence selects this system */
    const char *const build[6];
    const char *const test[6];
} build_system;

/* Checked in order: the first marker present wins. Multi-step commands go through sh -c. */
static const build_system SYSTEMS[] = {
    {"cargo", "Cargo.toml", {"cargo", "build", "--message-format=short", NULL},
     {"cargo", "test", "--message-format=short", NULL}},
    {"go", "go.mod", {"go", "build", "./...", NULL}, {"go", "test", "./...", NULL}},
    {"make", "Makefile", {"make", NULL}, {"make", "test", NULL}},
    {"make", "GNUmakefile", {"make", NULL}, {"make", "test", NULL}},
    {"make", "makefile", {"make", NULL}, {"make", "test", NULL}},
    {"cmake", "CMakeLists.txt",
     {"sh", "-c", "cmake -S . -B build && cmake --build build", NULL},
     {"sh", "-c", "cmake -S . -B build && cmake --build build && "
                  "ctest --test-dir build --output-on-failure", NULL}},
    {"meson", "meson.build",
     {"sh", "-c", "[ -d build ] || meson setup build; ninja -C build", NULL},
     {"sh", "-c", "[ -d build ] || meson setup build; meson test -C build", NULL}},
    {"ninja", "build.ninja", {"ninja", NULL}, {"ninja", "test", NULL}},
    {"npm", "package.json", {"npm", "run", "build", NULL}, {"npm", "test", NULL}},
    {"pytest", "pytest.ini", {NULL}, {"python3", "-m", "pytest", "-q", NULL}},
    {"pytest", "pyproject.toml", {NULL}, {"python3", "-m", "pytest", "-q", NULL}},
    {"pytest", "setup.py", {NULL}, {"python3", "-m", "pytest", "-q", NULL}},
    {"pytest", "tox.ini", {NULL}, {"python3", "-m", "pytest", "-q", NULL}},
    {"pytest", "conftest.py", {NULL}, {"python3", "-m", "pytest", "-q", NULL}},
};

static const build_system *detect(tool_ctx *ctx) {
    for (size_t i = 0; i < sizeof SYSTEMS / sizeof SYSTEMS[0]; i++) {
        struct stat st;
        if (fstatat(ctx->rootfd, SYSTEMS[i].marker, &st, 0) == 0 && S_ISREG(st.st_mode))
            return &SYSTEMS[i];
    }
    return NULL;
}

static int run(tool_ctx *ctx, json_t *args, json_t *res, bool test) {
    const char *argv_buf[202];
    const char *const *argv;
    const char *sysname = "custom";
    json_t *cmd = json_object_get(args, "command");
    if (json_array_size(cmd)) {
        size_t n = json_array_size(cmd);
        if (n > 200) return tool_err(TOOL_EINVAL, "command has more than 200 arguments");
        for (size_t i = 0; i < n; i++) argv_buf[i] = json_string_value(json_array_get(cmd, i));
        argv_buf[n] = NULL;
        argv = argv_buf;
    } else {
        const build_system *bs = detect(ctx);
        if (!bs)
            return tool_err(TOOL_EUNSUPPORTED, "no build system found in the workspace root "
                            "(looked for Cargo.toml, go.mod, Makefile, CMakeLists.txt, meson.build, "
                            "build.ninja, package.json, pytest files); pass 'command'");
        argv = test ? bs->test : bs->build;
        if (!argv[0])
            return tool_err(TOOL_EUNSUPPORTED, "a %s project has no build step; use 'test', or "
                            "pass 'command'", bs->name);
        sysname = bs->name;
    }
    sandbox_policy pol = SANDBOX_POLICY_INIT;
    static const char *const protected_paths[] = {".git", NULL};
    pol.workspace = ctx->root;
    pol.fs_mode = SANDBOX_FS_WORKSPACE_WRITE;
    pol.network = ctx->opt.build_network;
    pol.unsandboxed = ctx->opt.unsandboxed;
    pol.timeout_s = (double)tool_arg_int(args, "timeout_s", 0);
    if (pol.timeout_s <= 0) pol.timeout_s = ctx->opt.build_timeout_s;
    pol.protected_paths = protected_paths; /* a build may not rewrite hooks or config */
    pol.netns_pool = ctx->netns_pool;      /* used when pol.network is false */
    sandbox_result r;
    memset(&r, 0, sizeof r);
    const char *const *env = ctx->opt.env ? ctx->opt.env : (const char *const *)environ;
    int rc = sandbox_run(&r, &pol, argv, env, ctx->root);
    if (rc < 0)
        return tool_err(TOOL_ESANDBOX, "the sandbox did not run the command: %s",
                        sandbox_error_last());
    json_t *jargv = json_array();
    for (size_t i = 0; argv[i]; i++) json_array_append_new(jargv, json_string(argv[i]));
    json_object_set_new(res, "build_system", json_string(sysname));
    json_object_set_new(res, "command", jargv);
    bool ok = r.stopped == SANDBOX_STOP_NONE && r.signal == 0 && r.exit_code == 0;
    json_object_set_new(res, "ok", json_boolean(ok));
    if (r.signal) json_object_set_new(res, "signal", json_integer(r.signal));
    else json_object_set_new(res, "exit_code", json_integer(r.exit_code));
    if (r.stopped != SANDBOX_STOP_NONE)
        json_object_set_new(res, "stopped", json_string(sandbox_stop_reason_name(r.stopped)));
    json_object_set_new(res, "wall_s", json_real(r.wall_s));
    json_t *diags = NULL;
    /* diagnostics come from both streams: compilers write stderr, test runners stdout */
    size_t tl = r.out.len + r.err.len + 1;
    char *all = malloc(tl + 1);
    if (!all) {
        sandbox_result_deinit(&r);
        return tool_err(TOOL_ENOMEM, "out of memory");
    }
    memcpy(all, r.err.data ? r.err.data : "", r.err.len);
    all[r.err.len] = '\n';
    memcpy(all + r.err.len + 1, r.out.data ? r.out.data : "", r.out.len);
    all[tl] = '\0';
    rc = tool_diag_parse(all, tl, &diags);
    free(all);
    if (rc == 0) {
        long errors = 0, warnings = 0;
        size_t i;
        json_t *d;
        json_array_foreach(diags, i, d) {
            const char *s = json_string_value(json_object_get(d, "severity"));
            if (!strcmp(s, "error")) errors++;
            else if (!strcmp(s, "warning")) warnings++;
        }
        json_object_set_new(res, "errors", json_integer(errors));
        json_object_set_new(res, "warnings", json_integer(warnings));
        json_object_set_new(res, "diagnostics", diags);
    }
    /* the tail of a build log matters most: keep a third head, two thirds tail */
    size_t cap = ctx->opt.result_cap / 3;
    char *b = NULL;
    if (tool_bound_text(&b, r.out.data ? r.out.data : "", r.out.len, cap) == 0) {
        json_object_set_new(res, "stdout", tool_json_text(b, strlen(b)));
        free(b);
    }
    if (tool_bound_text(&b, r.err.data ? r.err.data : "", r.err.len, cap) == 0) {
        json_object_set_new(res, "stderr", tool_json_text(b, strlen(b)));
        free(b);
    }
    if (r.out.truncated || r.err.truncated)
        json_object_set_new(res, "output_truncated_by_sandbox", json_true());
    sandbox_result_deinit(&r);
    return rc;
}

int tool_build(tool_ctx *ctx, json_t *args, json_t *res) {
    return run(ctx, args, res, false);
}

int tool_test(tool_ctx *ctx, json_t *args, json_t *res) {
    return run(ctx, args, res, true);
}
