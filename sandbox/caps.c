/* Probing what isolation the running kernel offers. Each feature is tried for real in a
 * short-lived child, because sysctls, LSMs and container runtimes can each forbid it. */
#include "sandbox_int.h"

#include <errno.h>
#include <linux/landlock.h>
#include <linux/seccomp.h>
#include <linux/filter.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* Returns the child's exit status (0 = the feature works) or -1 when fork failed. */
static int try_in_child(int (*fn)(void)) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) _exit(fn() == 0 ? 0 : 1);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

static int try_userns(void) { return unshare(CLONE_NEWUSER); }
static int try_mountns(void) { return unshare(CLONE_NEWUSER | CLONE_NEWNS); }
static int try_pidns(void) { return unshare(CLONE_NEWUSER | CLONE_NEWPID); }
static int try_netns(void) { return unshare(CLONE_NEWUSER | CLONE_NEWNET); }
static int try_otherns(void) {
    return unshare(CLONE_NEWUSER | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP);
}

static int try_seccomp(void) {
    struct sock_filter allow[] = {BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
    struct sock_fprog prog = {.len = 1, .filter = allow};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog);
}

void sandbox_caps_probe(sandbox_caps *out) {
    memset(out, 0, sizeof *out);
    out->user_namespaces = try_in_child(try_userns) == 0;
    out->mount_namespaces = try_in_child(try_mountns) == 0;
    out->pid_namespaces = try_in_child(try_pidns) == 0;
    out->net_namespaces = try_in_child(try_netns) == 0;
    out->seccomp_filter = try_in_child(try_seccomp) == 0;
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
    out->landlock_abi = abi > 0 ? (int)abi : 0;

    size_t n = 0;
    out->detail[0] = 0;
#define MISSING(cond, what)                                                                    \
    if (!(cond) && n < sizeof out->detail)                                                     \
        n += (size_t)snprintf(out->detail + n, sizeof out->detail - n, "%s%s", n ? "; " : "", what)
    MISSING(out->user_namespaces, "user namespaces refused (kernel.unprivileged_userns_clone "
                                  "or a container runtime forbids them)");
    MISSING(out->mount_namespaces, "mount namespaces refused");
    MISSING(out->pid_namespaces, "PID namespaces refused");
    MISSING(out->net_namespaces, "network namespaces refused");
    MISSING(out->seccomp_filter, "seccomp filters refused");
    /* Not fields of their own (the struct is part of the API): the sandbox needs them too. */
    MISSING(!out->user_namespaces || try_in_child(try_otherns) == 0,
            "IPC, UTS or cgroup namespaces refused");
    MISSING(out->landlock_abi > 0, "landlock absent (optional extra layer)");
#undef MISSING
}

int sandbox_self_test(int *landlock_abi, double *wall_ms) {
    if (landlock_abi) *landlock_abi = 0;
    if (wall_ms) *wall_ms = 0;
    const char *t = getenv("TMPDIR");
    char ws[512];
    snprintf(ws, sizeof ws, "%s/spark-sandbox-selftest-XXXXXX", t && t[0] == '/' ? t : "/tmp");
    if (!mkdtemp(ws))
        return sandbox_err(SANDBOX_ESPAWN, "sandbox self-test: cannot make a directory %s: %s",
                           ws, strerror(errno));
    /* As the tools run commands: the network namespace from a pool, made by the first run and
     * reused by the second (the one timed). */
    sandbox_netns_pool *pool = sandbox_netns_pool_new();
    if (!pool) {
        rmdir(ws);
        return SANDBOX_ENOMEM;
    }
    sandbox_policy pol = SANDBOX_POLICY_INIT;
    pol.workspace = ws;
    pol.timeout_s = 30;
    pol.netns_pool = pool;
    const char *argv[] = {"true", NULL};
    const char *env[] = {"PATH=/usr/local/bin:/usr/bin:/bin", NULL};
    sandbox_result r;
    int rc = sandbox_run(&r, &pol, argv, env, NULL);
    if (rc == 0) {
        sandbox_result_deinit(&r);
        rc = sandbox_run(&r, &pol, argv, env, NULL);
    }
    sandbox_netns_pool_free(pool);
    if (rc == 0) {
        if (landlock_abi) *landlock_abi = r.landlock_abi;
        if (wall_ms) *wall_ms = r.wall_s * 1e3;
        if (r.exit_code != 0 || r.signal)
            rc = sandbox_err(SANDBOX_ESPAWN, "sandbox self-test: `true` failed inside the "
                             "sandbox (exit %d, signal %d, stop %s): %.200s", r.exit_code,
                             r.signal, sandbox_stop_reason_name(r.stopped), r.err.data);
        sandbox_result_deinit(&r);
    }
    rmdir(ws);
    return rc;
}
