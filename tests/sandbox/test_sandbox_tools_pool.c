/* The agent's tools run build/test commands through the network namespace pool by default:
 * the namespace a command ran in stays held by the tool context afterwards (a descriptor of
 * this process), the next command runs in the same one, and freeing the context releases it.
 * A build with the network keeps the host's namespace. Without user namespaces the tools still
 * refuse to run anything (fail closed), and run only when the user asked for no sandbox. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sbx_util.h"
#include "tools.h"

static char self[PATH_MAX], self_dir[PATH_MAX], root[PATH_MAX];
static char ws[PATH_MAX + 8], home[PATH_MAX + 8];

/* How many of this process's descriptors refer to namespace `link` ("net:[N]"; "net:[" for
 * any network namespace); with link NULL, how many descriptors are open at all. */
static int fds_on(const char *link) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0, dfd = dirfd(d);
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.' || atoi(de->d_name) == dfd) continue;
        char path[300], target[128];
        snprintf(path, sizeof path, "/proc/self/fd/%s", de->d_name);
        ssize_t k = readlink(path, target, sizeof target - 1);
        if (k <= 0) continue;
        target[k] = 0;
        if (!link || (!strcmp(link, "net:[") ? !strncmp(target, link, 5) : !strcmp(target, link)))
            n++;
    }
    closedir(d);
    return n;
}

static tool_ctx *open_ctx(bool network, bool unsandboxed) {
    tool_options o = TOOL_OPTIONS_INIT;
    o.root = ws;
    o.auto_checkpoint = false;
    o.build_network = network;
    o.unsandboxed = unsandboxed;
    o.build_timeout_s = 60;
    o.env = sbx_env(home, NULL);
    tool_ctx *ctx = NULL;
    if (tool_ctx_new(&ctx, &o) != 0) {
        printf("  tool_ctx_new: %s\n", tool_error_last());
        return NULL;
    }
    return ctx;
}

/* Run `build` with `cmd` (a JSON array); *rc gets tool_call's code; the result's stdout
 * (first line, newline dropped) goes to out. Returns the parsed result (caller frees). */
static json_t *build(tool_ctx *ctx, const char *cmd, int *rc, char *out, size_t cap) {
    char args[512];
    snprintf(args, sizeof args, "{\"command\":%s}", cmd);
    char *res = NULL;
    *rc = tool_call(ctx, "build", args, &res);
    json_t *j = res ? json_loads(res, 0, NULL) : NULL;
    free(res);
    if (out) {
        const char *s = json_string_value(json_object_get(j, "stdout"));
        snprintf(out, cap, "%s", s ? s : "");
        out[strcspn(out, "\n")] = 0;
    }
    return j;
}

static void test_default_pool(void) {
    char host[64] = "";
    ssize_t k = readlink("/proc/self/ns/net", host, sizeof host - 1);
    if (k > 0) host[k] = 0;
    int fds_before = fds_on(NULL);
    tool_ctx *ctx = open_ctx(false, false);
    if (!sbx_check(ctx != NULL, "a tool context")) return;
    sbx_check(fds_on("net:[") == 0, "a new context holds no network namespace yet (%d)",
              fds_on("net:["));

    int rc;
    char a[64], b[64];
    json_decref(build(ctx, "[\"readlink\",\"/proc/self/ns/net\"]", &rc, a, sizeof a));
    sbx_check(rc == 0 && !strncmp(a, "net:[", 5) && strcmp(a, host),
              "build runs in a network namespace of its own (%s; host %s)", a, host);
    sbx_check(fds_on(a) == 1, "after the run the tool context holds that namespace: it came "
              "from the context's pool (%d descriptors on %s)", fds_on(a), a);
    json_decref(build(ctx, "[\"readlink\",\"/proc/self/ns/net\"]", &rc, b, sizeof b));
    sbx_check(rc == 0 && !strcmp(a, b), "the next build reuses it (%s, %s)", a, b);

    /* What a pooled namespace must not carry from one command to the next. */
    json_decref(build(ctx, "[\"sh\",\"-c\",\"echo x > /tmp/left; echo y > $HOME/left\"]", &rc,
                      NULL, 0));
    char seen[64];
    json_decref(build(ctx, "[\"sh\",\"-c\",\"ls /tmp/left $HOME/left 2>/dev/null; echo end\"]",
                      &rc, seen, sizeof seen));
    sbx_check(rc == 0 && !strcmp(seen, "end"), "a file left in /tmp or $HOME by one build is not "
              "there for the next (first line: %s)", seen);

    tool_ctx_free(ctx);
    sbx_check(fds_on(a) == 0 && fds_on(NULL) == fds_before, "freeing the context releases the "
              "namespace and every descriptor (%d left on %s; %d -> %d)", fds_on(a), a,
              fds_before, fds_on(NULL));

    ctx = open_ctx(true, false);
    if (!sbx_check(ctx != NULL, "a tool context with the network")) return;
    json_decref(build(ctx, "[\"readlink\",\"/proc/self/ns/net\"]", &rc, a, sizeof a));
    sbx_check(rc == 0 && !strcmp(a, host) && fds_on("net:[") == 0,
              "build_network: the host's namespace, nothing pooled (%s)", a);
    tool_ctx_free(ctx);
}

/* Namespaces refused (a seccomp filter here, as a container runtime would): the pooled
 * default refuses exactly as an unpooled run does, and nothing runs. */
static void test_fail_closed(void) {
    pid_t pid = fork();
    if (pid == 0) {
        if (sbx_deny_user_namespaces() != 0) _exit(3);
        tool_ctx *ctx = open_ctx(false, false);
        if (!ctx) _exit(4);
        int ok = 1, rc;
        json_t *j = build(ctx, "[\"touch\",\"ran-without-sandbox\"]", &rc, NULL, 0);
        const char *code = json_string_value(json_object_get(json_object_get(j, "error"),
                                                             "code"));
        const char *msg = json_string_value(json_object_get(json_object_get(j, "error"),
                                                            "message"));
        printf("  refusal: %s\n", msg ? msg : "(none)");
        ok &= rc == TOOL_ESANDBOX && code && msg && strstr(msg, "user namespaces") &&
              strstr(msg, "unsandboxed");
        char marker[PATH_MAX + 32];
        snprintf(marker, sizeof marker, "%s/ran-without-sandbox", ws);
        ok &= access(marker, F_OK) != 0;
        json_decref(j);
        tool_ctx_free(ctx);
        if (!ok) _exit(1);
        /* The user's explicit choice still works. */
        ctx = open_ctx(false, true);
        if (!ctx) _exit(4);
        j = build(ctx, "[\"touch\",\"ran-without-sandbox\"]", &rc, NULL, 0);
        ok &= rc == 0 && access(marker, F_OK) == 0;
        unlink(marker);
        json_decref(j);
        tool_ctx_free(ctx);
        _exit(ok ? 0 : 2);
    }
    int st;
    waitpid(pid, &st, 0);
    sbx_check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "no user namespaces: build refuses, naming "
              "them, and runs nothing; with unsandboxed it runs (exit %d)",
              WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

int main(void) {
    int start = sbx_start(self, sizeof self, self_dir, sizeof self_dir);
    if (start) return start;
    sbx_mkdtemp(root, sizeof root);
    snprintf(ws, sizeof ws, "%s/ws", root);
    snprintf(home, sizeof home, "%s/home", root);
    mkdir(ws, 0755);
    mkdir(home, 0755);
    test_default_pool();
    test_fail_closed();
    sbx_rm_rf(root);
    sbx_rerun_as_nobody(self);
    printf(sbx_failures ? "test_sandbox_tools_pool: %d FAILED\n"
                        : "test_sandbox_tools_pool: all checks passed\n", sbx_failures);
    return sbx_failures ? 1 : 0;
}
