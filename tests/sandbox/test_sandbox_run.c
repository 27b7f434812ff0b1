/* sandbox_run() doing its job: real builds, git, byte-exact capture, truncation, exit codes,
 * signals, timeouts, cancellation, death with the caller, the view of the file system, failing
 * closed when isolation is unavailable, and the explicit unsandboxed mode.
 * `test_sandbox_run child ...` is this executable re-run inside the sandbox. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sbx_util.h"

static unsigned char pattern(size_t i, unsigned seed) {
    return (unsigned char)((i * 7u + seed * 13u + (i >> 8)) & 0xff);
}

/* child emit N: N pattern bytes (seed 1) on stdout, N/3 (seed 2) on stderr, interleaved. */
static int child(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[0], "emit")) {
        size_t n = (size_t)atol(argv[1]), e = n / 3, i = 0, j = 0;
        unsigned char buf[1000];
        while (i < n || j < e) {
            size_t k = 0;
            for (; k < 777 && i < n; k++, i++) buf[k] = pattern(i, 1);
            if (k && write(1, buf, k) != (ssize_t)k) return 1;
            k = 0;
            for (; k < 333 && j < e; k++, j++) buf[k] = pattern(j, 2);
            if (k && write(2, buf, k) != (ssize_t)k) return 1;
        }
        return 0;
    }
    return 2;
}

static char self[PATH_MAX], self_dir[PATH_MAX], root[PATH_MAX - 64], ws[PATH_MAX], home[PATH_MAX];

static int run(sandbox_result *r, sandbox_policy *pol, const char *const *argv, const char *cwd) {
    const char *ro[] = {self_dir, NULL};
    if (!pol->extra_ro_paths) pol->extra_ro_paths = ro;
    if (!pol->workspace) pol->workspace = ws;
    int rc = sandbox_run(r, pol, argv, sbx_env(home, NULL), cwd);
    if (rc) printf("  sandbox_run: %d %s\n", rc, sandbox_error_last());
    return rc;
}

static void test_make(void) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/hello.c", ws);
    sbx_write_file(path, "#include <stdio.h>\nint main(void) { printf(\"hello %d\\n\", 6 * 7); "
                         "return 0; }\n");
    snprintf(path, sizeof path, "%s/Makefile", ws);
    sbx_write_file(path, "hello: hello.c\n\tcc -O1 -o hello hello.c\n"
                         "check: hello\n\t./hello > out.txt\n\tgrep -q 'hello 42' out.txt\n"
                         "\t@echo PASS\n");
    sandbox_policy pol = SANDBOX_POLICY_INIT;
    pol.timeout_s = 60;
    sandbox_result r;
    if (run(&r, &pol, (const char *[]){"make", "check", NULL}, NULL)) return;
    snprintf(path, sizeof path, "%s/hello", ws);
    struct stat st;
    if (!sbx_check(r.exit_code == 0 && strstr(r.out.data, "PASS") && stat(path, &st) == 0,
                   "make builds a small C project and its test passes (%.2f s)", r.wall_s))
        sbx_dump("make", &r);
    sandbox_result_deinit(&r);
}

static void test_git(void) {
    /* Set the repository up on the host: through the choke point, unsandboxed. */
    sandbox_policy host = SANDBOX_POLICY_INIT;
    host.unsandboxed = true;
    sandbox_result r;
    const char *init[] = {"sh", "-c", "git init -q && git -c user.email=t@e -c user.name=t "
                          "commit -q --allow-empty -m first && echo x > untracked.txt", NULL};
    if (run(&r, &host, init, NULL)) return;
    bool ok = r.exit_code == 0 && !r.isolated;
    if (!sbx_check(ok, "git repository set up (unsandboxed run: isolated = false)"))
        sbx_dump("git init", &r);
    sandbox_result_deinit(&r);
    sandbox_policy pol = SANDBOX_POLICY_INIT;
    if (run(&r, &pol, (const char *[]){"git", "status", "--porcelain=v1", "-b", NULL}, NULL))
        return;
    ok = r.exit_code == 0 && !strncmp(r.out.data, "## ", 3) &&
         strstr(r.out.data, "?? untracked.txt");
    if (!sbx_check(ok, "git status works in the sandbox")) sbx_dump("git status", &r);
    sandbox_result_deinit(&r);
    const char *commit[] = {"sh", "-c", "git add untracked.txt && git -c user.email=t@e -c "
                            "user.name=t commit -q -m second && git log --oneline | wc -l", NULL};
    if (run(&r, &pol, commit, NULL)) return;
    if (!sbx_check(r.exit_code == 0 && !strcmp(r.out.data, "2\n"),
                   "git add and commit work (the rest of .git is writable)"))
        sbx_dump("git commit", &r);
    sandbox_result_deinit(&r);
}

static void test_capture(void) {
    sandbox_policy pol = SANDBOX_POLICY_INIT;
    sandbox_result r;
    if (run(&r, &pol, (const char *[]){self, "child", "emit", "300000", NULL}, NULL)) return;
    bool ok = r.exit_code == 0 && r.out.len == 300000 && r.out.total == 300000 &&
              !r.out.truncated && r.err.len == 100000 && !r.err.truncated;
    for (size_t i = 0; ok && i < r.out.len; i++) ok = (unsigned char)r.out.data[i] == pattern(i, 1);
    for (size_t i = 0; ok && i < r.err.len; i++) ok = (unsigned char)r.err.data[i] == pattern(i, 2);
    if (!sbx_check(ok && r.out.data[r.out.len] == 0, "stdout and stderr captured byte-exact, "
                                                     "separately"))
        sbx_dump("emit", &r);
    sandbox_result_deinit(&r);

    pol.output_cap = 10000;
    if (run(&r, &pol, (const char *[]){self, "child", "emit", "100000", NULL}, NULL)) return;
    ok = r.exit_code == 0 && r.out.truncated && r.out.total == 100000 &&
         r.stopped == SANDBOX_STOP_NONE;
    for (size_t i = 0; ok && i < 5000; i++) ok = (unsigned char)r.out.data[i] == pattern(i, 1);
    const char *tail = r.out.data + r.out.len - 5000;
    for (size_t i = 0; ok && i < 5000; i++)
        ok = (unsigned char)tail[i] == pattern(100000 - 5000 + i, 1);
    ok = ok && strstr(r.out.data + 5000, "[... 90000 bytes omitted by the sandbox ...]");
    if (!sbx_check(ok, "over the cap: head and tail kept exactly, the middle marked"))
        sbx_dump("emit capped", &r);
    sandbox_result_deinit(&r);
}

static void test_status(void) {
    sandbox_policy pol = SANDBOX_POLICY_INIT;
    sandbox_result r;
    if (run(&r, &pol, (const char *[]){"sh", "-c", "echo out; echo err >&2; exit 7", NULL},
            NULL) == 0) {
        sbx_check(r.exit_code == 7 && r.signal == 0 && !strcmp(r.out.data, "out\n") &&
                      !strcmp(r.err.data, "err\n") && r.stopped == SANDBOX_STOP_NONE,
                  "exit status is the command's");
        sandbox_result_deinit(&r);
    }
    if (run(&r, &pol, (const char *[]){"no-such-command-spark", NULL}, NULL) == 0) {
        sbx_check(r.exit_code == 127 && strstr(r.err.data, "not found"),
                  "a missing command exits 127 with the reason");
        sandbox_result_deinit(&r);
    }
    if (run(&r, &pol, (const char *[]){"sh", "-c", "kill -TERM $$", NULL}, NULL) == 0) {
        sbx_check(r.signal == SIGTERM && r.stopped == SANDBOX_STOP_SIGNAL,
                  "death by a signal is reported");
        sandbox_result_deinit(&r);
    }
    char sub[PATH_MAX + 8];
    snprintf(sub, sizeof sub, "%s/sub", ws);
    mkdir(sub, 0755);
    if (run(&r, &pol, (const char *[]){"pwd", NULL}, sub) == 0) {
        char want[PATH_MAX + 16];
        snprintf(want, sizeof want, "%s\n", sub);
        sbx_check(!strcmp(r.out.data, want), "runs in the given directory");
        sandbox_result_deinit(&r);
    }
    pol.timeout_s = 0.5;
    if (run(&r, &pol, (const char *[]){"sleep", "30", NULL}, NULL) == 0) {
        sbx_check(r.stopped == SANDBOX_STOP_TIMEOUT && r.wall_s < 2.5,
                  "wall-clock timeout (%.2f s)", r.wall_s);
        sandbox_result_deinit(&r);
    }
    pol.timeout_s = 20;
    pol.cpu_s = 1;
    if (run(&r, &pol, (const char *[]){"sh", "-c", "while :; do :; done", NULL}, NULL) == 0) {
        sbx_check(r.stopped == SANDBOX_STOP_CPU, "CPU-time limit (%s, %.2f s CPU)",
                  sandbox_stop_reason_name(r.stopped), r.user_s + r.sys_s);
        sandbox_result_deinit(&r);
    }
}

static void test_view(void) {
    char marker[64];
    snprintf(marker, sizeof marker, "/tmp/spark-sbx-host-marker-%d", (int)getpid());
    sbx_write_file(marker, "x");
    sandbox_policy pol = SANDBOX_POLICY_INIT;
    sandbox_result r;
    char script[1024];
    snprintf(script, sizeof script,
             "test -e %s && echo host-tmp-visible; ls -A \"$HOME\"; touch \"$HOME/h\" /tmp/t "
             "&& echo writable; ls /dev | tr '\\n' ' '; echo; hostname; id -u; "
             "test -e /root/.bashrc -o -e /var/log && echo host-visible; "
             "grep -E '^(NoNewPrivs|CapEff|Seccomp):' /proc/self/status | tr -s '\\t' ' '; "
             "ls /proc | grep -c '^[0-9]'",
             marker);
    if (run(&r, &pol, (const char *[]){"sh", "-c", script, NULL}, NULL) == 0) {
        char want_uid[32];
        snprintf(want_uid, sizeof want_uid, "\n%d\n", (int)geteuid());
        bool ok = r.exit_code == 0 && !strstr(r.out.data, "visible") &&
                  !strncmp(r.out.data, "writable\n", 9) &&
                  strstr(r.out.data, "fd full null random shm stderr stdin stdout urandom zero") &&
                  strstr(r.out.data, "spark-sandbox\n") && strstr(r.out.data, want_uid) &&
                  strstr(r.out.data, "NoNewPrivs: 1") &&
                  strstr(r.out.data, "CapEff: 0000000000000000") &&
                  strstr(r.out.data, "Seccomp: 2");
        if (!sbx_check(ok, "the view: private /tmp, empty writable $HOME, minimal /dev, own "
                           "hostname, same uid, no capabilities, no_new_privs, seccomp"))
            sbx_dump("view", &r);
        sandbox_caps caps;
        sandbox_caps_probe(&caps);
        sbx_check(r.landlock_abi == caps.landlock_abi && r.isolated,
                  "landlock enforced with the kernel's ABI (%d)", r.landlock_abi);
        sandbox_result_deinit(&r);
    }
    unlink(marker);
}

/* A caller that ignores SIGPIPE and blocks SIGTERM (a server): the command gets defaults. */
static void test_signals_reset(void) {
    struct sigaction ign = {.sa_handler = SIG_IGN}, old_pipe;
    sigaction(SIGPIPE, &ign, &old_pipe);
    sigset_t block, old_mask;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigprocmask(SIG_BLOCK, &block, &old_mask);
    const char *argv[] = {"grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status", NULL};
    for (int unsandboxed = 0; unsandboxed < 2; unsandboxed++) {
        sandbox_policy pol = SANDBOX_POLICY_INIT;
        pol.unsandboxed = unsandboxed;
        sandbox_result r;
        if (run(&r, &pol, argv, NULL)) continue;
        const char *want = "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n";
        if (!sbx_check(!strcmp(r.out.data, want),
                       "the command starts with default signals and an empty mask (%s)",
                       unsandboxed ? "unsandboxed" : "sandboxed"))
            sbx_dump("signals", &r);
        sandbox_result_deinit(&r);
    }
    sigprocmask(SIG_SETMASK, &old_mask, NULL);
    sigaction(SIGPIPE, &old_pipe, NULL);
}

/* The build tool protects all of .git; in a workspace without one, the paths below it all
 * lead to one placeholder. */
static void test_protect_whole_git(void) {
    sandbox_policy pol = SANDBOX_POLICY_INIT;
    const char *prot[] = {".git", ".git/info/exclude", NULL};
    pol.protected_paths = prot;
    sandbox_result r;
    if (run(&r, &pol, (const char *[]){"sh", "-c", "test -c .git && mkdir .git 2>/dev/null || "
                                       "echo blocked", NULL}, NULL) != 0) {
        sbx_check(false, "protect .git: runs");
        return;
    }
    char git[PATH_MAX + 8];
    snprintf(git, sizeof git, "%s/.git", ws);
    struct stat st;
    if (!sbx_check(!strcmp(r.out.data, "blocked\n") && lstat(git, &st) != 0,
                   "protecting .git and paths below it without a repository: one placeholder, "
                   "removed after"))
        sbx_dump("protect .git", &r);
    sandbox_result_deinit(&r);
}

/* sandbox_run from several threads at once (the agent runs tools concurrently). */
typedef struct {
    int id, ok;
} par_job;

static void *par_worker(void *arg) {
    par_job *j = arg;
    for (int k = 0; k < 4; k++) {
        char script[64], want[32];
        snprintf(script, sizeof script, "echo %d-%d; test ! -e .git/hooks/x", j->id, k);
        snprintf(want, sizeof want, "%d-%d\n", j->id, k);
        sandbox_policy pol = SANDBOX_POLICY_INIT;
        pol.workspace = ws;
        sandbox_result r;
        if (sandbox_run(&r, &pol, (const char *[]){"sh", "-c", script, NULL}, sbx_env(home, NULL),
                        NULL) != 0)
            return NULL;
        j->ok += r.exit_code == 0 && !strcmp(r.out.data, want);
        sandbox_result_deinit(&r);
    }
    return NULL;
}

static void test_threads(void) {
    pthread_t t[4];
    par_job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (par_job){i, 0};
        pthread_create(&t[i], NULL, par_worker, &jobs[i]);
    }
    int ok = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        ok += jobs[i].ok;
    }
    char git[PATH_MAX + 8];
    snprintf(git, sizeof git, "%s/.git", ws);
    struct stat st;
    bool placeholder_gone = lstat(git, &st) != 0 || S_ISDIR(st.st_mode);
    sbx_check(ok == 16 && placeholder_gone,
              "4 threads x 4 runs at once: %d of 16 right, placeholders cleaned up", ok);
}

static void *cancel_later(void *arg) {
    usleep(300 * 1000);
    *(volatile int *)arg = 1;
    return NULL;
}

static void test_cancel_and_parent_death(void) {
    volatile int cancel = 0;
    pthread_t t;
    pthread_create(&t, NULL, cancel_later, (void *)&cancel);
    sandbox_policy pol = SANDBOX_POLICY_INIT;
    pol.cancel = &cancel;
    sandbox_result r;
    if (run(&r, &pol, (const char *[]){"sleep", "30", NULL}, NULL) == 0) {
        sbx_check(r.stopped == SANDBOX_STOP_CANCELED && r.wall_s < 2, "cancel stops the command");
        sandbox_result_deinit(&r);
    }
    pthread_join(t, NULL);

    /* The caller dies: the whole tree goes with it (also when init was started by a pooled
     * run's first child, which has exited by then: init is the caller's child). */
    for (int pooled = 0; pooled < 2; pooled++) {
        pid_t caller = fork();
        if (caller == 0) {
            sandbox_policy p2 = SANDBOX_POLICY_INIT;
            p2.netns_pool = pooled ? sandbox_netns_pool_new() : NULL;
            sandbox_result r2;
            run(&r2, &p2, (const char *[]){"sh", "-c", "setsid sleep 987661 & sleep 987662",
                                           NULL}, NULL);
            _exit(0);
        }
        int seen = 0;
        for (int i = 0; i < 100 && seen < 3; i++) {
            usleep(50 * 1000);
            seen = sbx_count_procs_with("98766");
        }
        kill(caller, SIGKILL);
        waitpid(caller, NULL, 0);
        int left = -1;
        for (int i = 0; i < 40 && left != 0; i++) {
            usleep(50 * 1000);
            left = sbx_count_procs_with("98766");
        }
        if (!sbx_check(seen == 3 && left == 0, "the tree dies with the caller%s (%d running, "
                       "%d left)", pooled ? ", pooled" : "", seen, left))
            sbx_procs_with("98766", true);
    }
}

/* Without namespaces (refused by a seccomp filter here, as a container runtime would), the
 * sandbox refuses; unsandboxed runs only when asked. */
static void test_fail_closed(void) {
    pid_t pid = fork();
    if (pid == 0) {
        if (sbx_deny_user_namespaces() != 0) _exit(3);
        sandbox_policy pol = SANDBOX_POLICY_INIT;
        sandbox_result r;
        int rc = run(&r, &pol, (const char *[]){"true", NULL}, NULL);
        const char *msg = sandbox_error_last();
        int ok = rc == SANDBOX_EUNAVAILABLE && strstr(msg, "user namespaces") &&
                 strstr(msg, "unsandboxed");
        printf("  refusal: %s\n", msg);
        pol.unsandboxed = true;
        rc = run(&r, &pol, (const char *[]){"sh", "-c", "echo $MY_TOKEN.", NULL}, NULL);
        ok = ok && rc == 0 && !r.isolated && r.exit_code == 0;
        if (rc == 0) sandbox_result_deinit(&r);
        _exit(ok ? 0 : 1);
    }
    int st;
    waitpid(pid, &st, 0);
    sbx_check(WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "no user namespaces: refused with a message naming them; unsandboxed on request");

    pid = fork();
    if (pid == 0) {
        scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
        seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EINVAL), SCMP_SYS(seccomp), 0);
        if (seccomp_load(ctx) != 0) _exit(3);
        sandbox_policy pol = SANDBOX_POLICY_INIT;
        sandbox_result r;
        int rc = run(&r, &pol, (const char *[]){"true", NULL}, NULL);
        printf("  refusal: %s\n", sandbox_error_last());
        _exit(rc == SANDBOX_EUNAVAILABLE && strstr(sandbox_error_last(), "seccomp") ? 0 : 1);
    }
    waitpid(pid, &st, 0);
    sbx_check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "no seccomp: refused, naming seccomp");
}

static void test_bad_input(void) {
    sandbox_policy pol = SANDBOX_POLICY_INIT;
    sandbox_result r;
    pol.workspace = ws;
    const char *const *env = sbx_env(home, NULL);
    sbx_check(sandbox_run(&r, &pol, (const char *[]){NULL}, env, NULL) == SANDBOX_EINVAL,
              "empty argv: EINVAL");
    sbx_check(sandbox_run(&r, &pol, (const char *[]){"true", NULL}, env, "/") == SANDBOX_EINVAL &&
                  strstr(sandbox_error_last(), "outside the workspace"),
              "a directory outside the workspace: EINVAL");
    pol.workspace = "/";
    sbx_check(sandbox_run(&r, &pol, (const char *[]){"true", NULL}, env, NULL) == SANDBOX_EINVAL,
              "workspace /: EINVAL");
    pol.workspace = "relative/path";
    sbx_check(sandbox_run(&r, &pol, (const char *[]){"true", NULL}, env, NULL) == SANDBOX_EINVAL,
              "relative workspace: EINVAL");
    pol.workspace = ws;
    pol.version = 99;
    sbx_check(sandbox_run(&r, &pol, (const char *[]){"true", NULL}, env, NULL) == SANDBOX_EINVAL,
              "unknown policy version: EINVAL");
    pol.version = SANDBOX_POLICY_VERSION;
    pol.cpu_s = 1e300;
    sbx_check(sandbox_run(&r, &pol, (const char *[]){"true", NULL}, env, NULL) == SANDBOX_EINVAL,
              "an absurd CPU limit: EINVAL");
    pol.cpu_s = 0;
    pol.timeout_s = -1;
    sbx_check(sandbox_run(&r, &pol, (const char *[]){"true", NULL}, env, NULL) == SANDBOX_EINVAL,
              "a negative timeout: EINVAL");
    pol.timeout_s = 10;
    char file[PATH_MAX + 16];
    snprintf(file, sizeof file, "%s/a-file", ws);
    sbx_write_file(file, "x");
    pol.workspace = file;
    sbx_check(sandbox_run(&r, &pol, (const char *[]){"true", NULL}, env, NULL) == SANDBOX_EINVAL &&
                  strstr(sandbox_error_last(), "not a directory"),
              "a workspace that is a file: EINVAL");
    pol.workspace = ws;
    unlink(file);
    const char *bad_prot[] = {"../outside", NULL};
    pol.protected_paths = bad_prot;
    sbx_check(sandbox_run(&r, &pol, (const char *[]){"true", NULL}, env, NULL) == SANDBOX_EINVAL,
              "a protected path leaving the workspace: EINVAL");
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "child")) return child(argc - 2, argv + 2);
    int start = sbx_start(self, sizeof self, self_dir, sizeof self_dir);
    if (start) return start;
    sbx_mkdtemp(root, sizeof root);
    snprintf(ws, sizeof ws, "%s/ws", root);
    snprintf(home, sizeof home, "%s/home", root);
    mkdir(ws, 0755);
    mkdir(home, 0755);
    test_threads();
    test_protect_whole_git();
    test_capture();
    test_status();
    test_view();
    test_signals_reset();
    test_make();
    test_git();
    test_cancel_and_parent_death();
    test_fail_closed();
    test_bad_input();
    sbx_rm_rf(root);
    sbx_rerun_as_nobody(self);
    printf("%d failure%s\n", sbx_failures, sbx_failures == 1 ? "" : "s");
    return sbx_failures ? 1 : 0;
}
