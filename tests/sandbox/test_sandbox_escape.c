/* The escape suite: each attempt runs inside the sandbox (this executable re-run as
 * `test_sandbox_escape attempt NAME ARGS...`, or a shell snippet), and the host is checked
 * afterwards. An attempt prints what happened and exits 42 if it got through; the test also
 * checks the host, so a lying attempt cannot pass. Everything an attempt could damage is a
 * planted file in a temporary directory this test owns.
 *
 * Run as root, the suite re-runs itself as `nobody` (setpriv) so the unprivileged path
 * (unprivileged user namespaces) is covered too. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/keyctl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/personality.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "sbx_util.h"

/* ---------------------------------------------------------------------------------------------
 * Attempts (inside the sandbox)
 * ------------------------------------------------------------------------------------------- */
#define ESCAPED 42

static const char *ename(int e) {
    const char *n = strerrorname_np(e);
    return n ? n : "E?";
}

/* Report one try: returns 1 when it got through. */
static int tried(const char *what, long rc) {
    if (rc >= 0) {
        printf("%s: SUCCEEDED\n", what);
        return 1;
    }
    printf("%s: blocked %s\n", what, ename(errno));
    return 0;
}

static int try_write(const char *path) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        (void)!write(fd, "pwned\n", 6);
        close(fd);
    }
    return tried(path, fd);
}

static int attempt(int argc, char **argv) {
    const char *name = argv[0];
    int got = 0;
    if (!strcmp(name, "write")) { /* write PATH... */
        for (int i = 1; i < argc; i++) got += try_write(argv[i]);
    } else if (!strcmp(name, "read")) { /* read PATH... : prints what it could read */
        for (int i = 1; i < argc; i++) {
            char buf[256];
            long n = sbx_read_file(argv[i], buf, sizeof buf);
            if (n >= 0) printf("read %s: %s\n", argv[i], buf), got++;
            else printf("read %s: blocked %s\n", argv[i], ename(errno));
        }
    } else if (!strcmp(name, "read-nothing")) { /* read-nothing PATH: empty or unreadable */
        char buf[256];
        long n = sbx_read_file(argv[1], buf, sizeof buf);
        printf("read %s: %ld bytes\n", argv[1], n);
        got = n > 0;
    } else if (!strcmp(name, "hardlink")) { /* hardlink TARGET LINK */
        int rc = link(argv[1], argv[2]);
        if (rc == 0) got += try_write(argv[2]);
        else tried("link", rc);
    } else if (!strcmp(name, "symlink-write")) { /* symlink-write TARGET LINK */
        if (symlink(argv[1], argv[2]) != 0) tried("symlink", -1);
        got += try_write(argv[2]);
    } else if (!strcmp(name, "connect")) { /* connect PORT */
        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        got += tried("connect", connect(s, (struct sockaddr *)&a, sizeof a));
    } else if (!strcmp(name, "syscalls")) { /* the refused system calls, one by one */
        got += tried("ptrace-attach-parent", ptrace(PTRACE_ATTACH, getppid(), 0, 0));
        got += tried("ptrace-traceme", ptrace(PTRACE_TRACEME, 0, 0, 0));
        got += tried("process_vm_readv", syscall(SYS_process_vm_readv, getppid(), NULL, 0, NULL,
                                                 0, 0));
        got += tried("mount", mount("tmpfs", "/tmp", "tmpfs", 0, NULL));
        got += tried("umount", umount2("/proc", MNT_DETACH));
        got += tried("unshare-user", unshare(CLONE_NEWUSER));
        got += tried("unshare-mount", unshare(CLONE_NEWNS));
        got += tried("setns", syscall(SYS_setns, 0, 0));
        long c = syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, NULL, NULL, NULL, 0);
        if (c == 0) _exit(0);
        got += tried("clone-newuser", c);
        got += tried("keyctl", syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID,
                                       KEY_SPEC_SESSION_KEYRING, 0));
        got += tried("add_key", syscall(SYS_add_key, "user", "x", "y", 1,
                                        KEY_SPEC_SESSION_KEYRING));
        char attr[128] = {0};
        got += tried("bpf", syscall(SYS_bpf, 5 /* BPF_PROG_LOAD */, attr, sizeof attr));
        got += tried("perf_event_open", syscall(SYS_perf_event_open, attr, 0, -1, -1, 0));
        got += tried("userfaultfd", syscall(SYS_userfaultfd, 0));
        char params[120] = {0};
        got += tried("io_uring_setup", syscall(SYS_io_uring_setup, 1, params));
        got += tried("personality-linux32", personality(0x0008 /* PER_LINUX32 */));
        got += tried("kexec_load", syscall(SYS_kexec_load, 0, 0, NULL, 0));
        got += tried("init_module", syscall(SYS_init_module, NULL, 0, ""));
        got += tried("chroot", chroot("/tmp"));
        got += tried("open_by_handle_at", syscall(SYS_open_by_handle_at, AT_FDCWD, attr, 0));
    } else if (!strcmp(name, "tiocsti")) { /* type into the terminal */
        char c = 'x';
        got += tried("tiocsti", ioctl(0, TIOCSTI, &c));
        got += tried("tiocsti-highbits",
                     syscall(SYS_ioctl, 0, (unsigned long)TIOCSTI | (1UL << 32), &c));
        got += tried("tioclinux", syscall(SYS_ioctl, 0, 0x541C, &c));
        got += tried("open-dev-tty", open("/dev/tty", O_RDWR));
    } else if (!strcmp(name, "x32")) {
        long rc = syscall(0x40000000L | SYS_getpid);
        printf("x32 getpid returned %ld (%s)\n", rc, ename(errno));
        got = 1;
    } else if (!strcmp(name, "i386")) {
#if defined(__x86_64__)
        signal(SIGSEGV, SIG_DFL); /* not a sanitizer's report: the plain fault */
        long rc = 20;             /* i386 getpid */
        __asm__ volatile("int $0x80" : "+a"(rc) : : "memory");
        printf("int 0x80 returned %ld\n", rc);
        got = 1;
#else
        printf("no i386 ABI on this architecture\n");
#endif
    } else if (!strcmp(name, "kill")) { /* kill HOSTPID */
        got += tried("kill-host-pid", kill((pid_t)atol(argv[1]), SIGKILL));
        kill(-1, SIGKILL); /* everything it can see */
    } else if (!strcmp(name, "git-hooks")) { /* in the workspace root */
        got += try_write(".git/hooks/pre-commit");
        got += try_write(".git/config");
        got += tried("rename-.git", rename(".git", "git-moved"));
        got += tried("rename-hooks", rename(".git/hooks", ".git/hooks-moved"));
        got += tried("rmdir-hooks", rmdir(".git/hooks"));
        got += tried("mkdir-hooks", mkdir(".git/hooks", 0755));
        if (try_write(".git/new-file-is-fine")) printf("(the rest of .git stays writable)\n");
    } else if (!strcmp(name, "git-nohooks")) { /* .git exists without hooks/ */
        got += tried("mkdir-hooks", mkdir(".git/hooks", 0755));
        got += try_write(".git/hooks/pre-commit");
        got += tried("unlink-placeholder", unlink(".git/hooks"));
        got += tried("rename-.git", rename(".git", "git-moved"));
    } else if (!strcmp(name, "no-git")) { /* no .git at all: a repo must not appear */
        got += tried("mkdir-.git", mkdir(".git", 0755));
        got += try_write(".git/config");
    } else {
        fprintf(stderr, "unknown attempt %s\n", name);
        return 2;
    }
    fflush(stdout);
    return got ? ESCAPED : 0;
}

/* ---------------------------------------------------------------------------------------------
 * The suite (on the host)
 * ------------------------------------------------------------------------------------------- */
static char self[PATH_MAX], self_dir[PATH_MAX], root[PATH_MAX - 64], ws[PATH_MAX], home[PATH_MAX],
    outside[PATH_MAX], rodir[PATH_MAX];
static sandbox_netns_pool *pool; /* SPARK_SBX_POOL set: every run through a pool */

static int run_in(sandbox_result *r, sandbox_policy *pol, const char *const *argv,
                  const char *const *extra_env, const char *cwd) {
    const char *ro[] = {self_dir, rodir, NULL};
    pol->extra_ro_paths = ro;
    pol->workspace = ws;
    pol->netns_pool = pool;
    int rc = sandbox_run(r, pol, argv, sbx_env(home, extra_env), cwd);
    if (rc) printf("  sandbox_run: %d %s\n", rc, sandbox_error_last());
    return rc;
}

/* Run an attempt of this executable; expects it blocked (exit 0). */
static void expect_blocked(const char *label, const char *const *args, const char *must_contain) {
    const char *argv[16] = {self, "attempt"};
    int n = 2;
    for (const char *const *a = args; *a && n < 15; a++) argv[n++] = *a;
    argv[n] = NULL;
    sandbox_policy pol = SANDBOX_POLICY_INIT;
    pol.timeout_s = 20;
    sandbox_result r;
    if (run_in(&r, &pol, argv, NULL, NULL)) {
        sbx_check(false, "%s: ran", label);
        return;
    }
    bool ok = r.exit_code == 0 && r.signal == 0 &&
              (!must_contain || strstr(r.out.data, must_contain));
    if (!sbx_check(ok, "%s", label)) sbx_dump(label, &r);
    sandbox_result_deinit(&r);
}

static bool file_is(const char *path, const char *content) {
    char buf[256];
    return sbx_read_file(path, buf, sizeof buf) >= 0 && !strcmp(buf, content);
}

static bool missing(const char *path) {
    struct stat st;
    return lstat(path, &st) != 0 && errno == ENOENT;
}

static void test_files(void) {
    char target[PATH_MAX + 32], fresh[PATH_MAX + 32], rel[PATH_MAX], link_[PATH_MAX + 32],
        rofile[PATH_MAX + 32], hl[PATH_MAX + 32], id_rsa[PATH_MAX + 32];
    snprintf(target, sizeof target, "%s/target.txt", outside);
    snprintf(fresh, sizeof fresh, "%s/fresh.txt", outside);
    snprintf(rofile, sizeof rofile, "%s/ro.txt", rodir);
    snprintf(id_rsa, sizeof id_rsa, "%s/.ssh/id_rsa", home);
    sbx_write_file(target, "original\n");
    sbx_write_file(rofile, "original\n");

    expect_blocked("write outside the workspace, absolute path",
                   (const char *[]){"write", target, fresh, NULL}, "blocked ENOENT");
    snprintf(rel, sizeof rel, "../../%s/target.txt", strrchr(outside, '/') + 1);
    char dotdot[PATH_MAX + 64];
    snprintf(dotdot, sizeof dotdot, "../../../../../../../..%s", target);
    expect_blocked("write outside the workspace through ..",
                   (const char *[]){"write", rel, dotdot, NULL}, "blocked");
    expect_blocked("write a read-only bound tree", (const char *[]){"write", rofile, NULL},
                   "blocked EROFS");
    /* A symlink planted in the workspace pointing out of it, and one made inside. */
    snprintf(link_, sizeof link_, "%s/planted-link", ws);
    if (symlink(target, link_) != 0) perror("symlink");
    expect_blocked("write through a planted symlink", (const char *[]){"write", link_, NULL},
                   "blocked ENOENT");
    expect_blocked("write through a symlink made inside",
                   (const char *[]){"symlink-write", rofile, "made-link", NULL}, "blocked EROFS");
    snprintf(hl, sizeof hl, "%s/hardlink", ws);
    expect_blocked("hardlink a file outside the workspace, then write it",
                   (const char *[]){"hardlink", rofile, hl, NULL}, "link: blocked EXDEV");
    sbx_check(file_is(target, "original\n") && missing(fresh) && file_is(rofile, "original\n") &&
                  missing(hl),
              "host: planted files unchanged, nothing created outside the workspace");

    expect_blocked("read a planted ~/.ssh/id_rsa",
                   (const char *[]){"read", id_rsa, "~/.ssh/id_rsa", NULL}, "blocked ENOENT");
    expect_blocked("read init's memory and environment (a copy of the caller's)",
                   (const char *[]){"read", "/proc/1/environ", "/proc/1/mem", NULL},
                   "/proc/1/environ: blocked EACCES");
    expect_blocked("read /etc/shadow (masked)",
                   (const char *[]){"read-nothing", "/etc/shadow", NULL}, NULL);
}

static void test_secret_env(void) {
    const char *extra[] = {"MY_API_KEY=sekrit-1", "GITHUB_TOKEN=sekrit-2",
                           "aws_secret_access_key=sekrit-3", "DB_PASSWORD=sekrit-4",
                           "SSH_AUTH_SOCK=/run/sekrit-5", "HARMLESS=visible", NULL};
    sandbox_policy pol = SANDBOX_POLICY_INIT;
    sandbox_result r;
    if (run_in(&r, &pol, (const char *[]){"env", NULL}, extra, NULL)) {
        sbx_check(false, "env ran");
        return;
    }
    bool ok = r.exit_code == 0 && !strstr(r.out.data, "sekrit") &&
              strstr(r.out.data, "HARMLESS=visible");
    char want_home[PATH_MAX + 8];
    snprintf(want_home, sizeof want_home, "HOME=%s\n", home);
    ok = ok && strstr(r.out.data, want_home);
    if (!sbx_check(ok, "secret environment variables filtered, others and HOME kept"))
        sbx_dump("env", &r);
    sandbox_result_deinit(&r);
}

static void test_network(void) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 4) ||
        getsockname(s, (struct sockaddr *)&a, &len)) {
        sbx_check(false, "host listener: %s", strerror(errno));
        return;
    }
    char port[16];
    snprintf(port, sizeof port, "%u", ntohs(a.sin_port));
    expect_blocked("connect to a TCP port on the host's loopback",
                   (const char *[]){"connect", port, NULL}, "connect: blocked ECONNREFUSED");
    struct pollfd pf = {.fd = s, .events = POLLIN};
    sbx_check(poll(&pf, 1, 0) == 0, "host: the listener saw no connection");
    /* With the network on, the same connection goes through: the test above is not vacuous. */
    sandbox_policy pol = SANDBOX_POLICY_INIT;
    pol.network = true;
    sandbox_result r;
    if (run_in(&r, &pol, (const char *[]){self, "attempt", "connect", port, NULL}, NULL, NULL) ==
        0) {
        sbx_check(r.exit_code == ESCAPED && poll(&pf, 1, 1000) == 1,
                  "with --network the host port is reachable (control)");
        sandbox_result_deinit(&r);
    }
    close(s);
}

static void test_syscalls(void) {
    expect_blocked("refused system calls: ptrace, process_vm, mount, unshare, setns, clone "
                   "flags, keyctl, add_key, bpf, perf, userfaultfd, io_uring, personality, kexec, "
                   "modules, chroot, open_by_handle_at",
                   (const char *[]){"syscalls", NULL}, "ptrace-attach-parent: blocked EPERM");
    expect_blocked("TIOCSTI/TIOCLINUX (also with high bits set), /dev/tty",
                   (const char *[]){"tiocsti", NULL}, "tiocsti-highbits: blocked EPERM");
    const char *abis[] = {"x32", "i386"};
    for (int i = 0; i < 2; i++) {
        sandbox_policy pol = SANDBOX_POLICY_INIT;
        sandbox_result r;
        if (run_in(&r, &pol, (const char *[]){self, "attempt", abis[i], NULL}, NULL, NULL))
            continue;
        bool ok = r.signal == SIGSYS && r.stopped == SANDBOX_STOP_SIGNAL;
        const char *how = "SIGSYS from the seccomp filter";
        if (i == 1 && r.signal == SIGSEGV) {
            /* Kernels without IA32 emulation fault on int 0x80 before seccomp sees it. */
            ok = r.stopped == SANDBOX_STOP_SIGNAL;
            how = "SIGSEGV: this kernel has no i386 ABI at all";
        }
#if !defined(__x86_64__)
        ok = r.exit_code == 0;
        how = "no such ABI on this architecture";
#endif
        if (!sbx_check(ok, "%s system call does not run (%s)", abis[i], how))
            sbx_dump(abis[i], &r);
        sandbox_result_deinit(&r);
    }
}

static void test_kill_host(void) {
    pid_t victim = fork();
    if (victim == 0) {
        pause();
        _exit(0);
    }
    char pid[16];
    snprintf(pid, sizeof pid, "%d", (int)victim);
    expect_blocked("kill a host process (and kill -1)", (const char *[]){"kill", pid, NULL},
                   "kill-host-pid: blocked ESRCH");
    int st;
    sbx_check(waitpid(victim, &st, WNOHANG) == 0, "host: the victim process is alive");
    kill(victim, SIGKILL);
    waitpid(victim, &st, 0);
}

static void test_git(void) {
    char git[PATH_MAX + 16], path[PATH_MAX + 64];
    snprintf(git, sizeof git, "%s/.git", ws);
    mkdir(git, 0755);
    snprintf(path, sizeof path, "%s/hooks", git);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/config", git);
    sbx_write_file(path, "[core]\n");
    expect_blocked("write .git/hooks/pre-commit and .git/config, move .git or hooks away",
                   (const char *[]){"git-hooks", NULL}, "pre-commit: blocked EROFS");
    snprintf(path, sizeof path, "%s/hooks/pre-commit", git);
    bool ok = missing(path);
    snprintf(path, sizeof path, "%s/config", git);
    ok = ok && file_is(path, "[core]\n");
    snprintf(path, sizeof path, "%s/git-moved", ws);
    ok = ok && missing(path);
    snprintf(path, sizeof path, "%s/new-file-is-fine", git);
    sbx_check(ok, "host: hooks and config unchanged, .git in place");
    /* The rest of .git stays writable (git add/commit work). */
    sbx_check(file_is(path, "pwned\n"), "other files in .git stay writable");
    unlink(path);

    /* A protected path that does not exist yet. */
    snprintf(path, sizeof path, "%s/hooks", git);
    rmdir(path);
    expect_blocked("create .git/hooks when it does not exist",
                   (const char *[]){"git-nohooks", NULL}, "mkdir-hooks: blocked EEXIST");
    sbx_check(missing(path), "host: no .git/hooks afterwards (the placeholder is gone)");

    /* No .git at all: a repository with hooks must not appear. */
    snprintf(path, sizeof path, "%s/config", git);
    unlink(path);
    rmdir(git);
    expect_blocked("create .git in a workspace without one", (const char *[]){"no-git", NULL},
                   "mkdir-.git: blocked EEXIST");
    sbx_check(missing(git), "host: no .git afterwards");

    /* Two runs at once share the placeholder: the first to finish must not remove it. */
    pid_t first = fork();
    if (first == 0) {
        sandbox_policy pol = SANDBOX_POLICY_INIT;
        sandbox_result r;
        _exit(run_in(&r, &pol, (const char *[]){"sleep", "0.5", NULL}, NULL, NULL) == 0 &&
                      r.exit_code == 0
                  ? 0
                  : 1);
    }
    usleep(150 * 1000);
    sandbox_policy pol = SANDBOX_POLICY_INIT;
    sandbox_result r;
    const char *late[] = {"sh", "-c", "sleep 1.2; mkdir .git/hooks .git 2>&1; echo done", NULL};
    if (run_in(&r, &pol, late, NULL, NULL) == 0) {
        int st;
        waitpid(first, &st, 0);
        bool shared = WIFEXITED(st) && WEXITSTATUS(st) == 0 && strstr(r.out.data, "done") &&
                      strstr(r.out.data, "exists") && missing(git);
        if (!sbx_check(shared, "concurrent runs share the placeholder; the last one removes it"))
            sbx_dump("concurrent", &r);
        sandbox_result_deinit(&r);
    }

    /* A worktree's .git file: kept, read-only, not replaceable. */
    sbx_write_file(git, "gitdir: /nonexistent/worktree\n");
    const char *wt[] = {"sh", "-c", "cat .git; rm -f .git 2>&1; mv .git x 2>&1; "
                        "echo gitdir: /tmp/evil > .git 2>&1; cat .git", NULL};
    if (run_in(&r, &pol, wt, NULL, NULL) == 0) {
        bool kept = file_is(git, "gitdir: /nonexistent/worktree\n") &&
                    !strstr(r.out.data, "evil\n");
        if (!sbx_check(kept, "a .git file (worktree) stays as it is")) sbx_dump(".git file", &r);
        sandbox_result_deinit(&r);
    } else {
        sbx_check(false, "a .git file (worktree): the sandbox runs");
    }
    unlink(git);
}

static void test_bombs(void) {
    /* Fork bomb: bounded by the process limit, ended by the timeout, nothing left. */
    sandbox_policy pol = SANDBOX_POLICY_INIT;
    pol.timeout_s = 5;
    pol.max_processes = 64;
    sandbox_result r;
    /* the shell then waits in a loop of builtins: a `sleep` would need a fork of its own, and
     * when the bomb has taken every process slot first the shell exits at once ("Cannot fork")
     * instead of being stopped (seen in CI, ASan run) */
    const char *bomb[] = {"sh", "-c", "b() { b | b & }; b; while :; do :; done", "spark-bomb-31337",
                          NULL};
    if (run_in(&r, &pol, bomb, NULL, NULL) == 0) {
        /* stopped by the timeout; or, where the bomb took every slot before the shell's own
         * loop, the shell ending on its failed fork (the limit held either way; seen again in
         * the CI's ASan run under load, session 30) -- what is left is checked below */
        const bool bounded =
            r.stopped == SANDBOX_STOP_TIMEOUT ||
            (r.signal == 0 && r.exit_code != 0 && strstr(r.err.data, "Cannot fork"));
        if (!sbx_check(bounded && strstr(r.err.data, "fork"),
                       "fork bomb hits the process limit (\"%.40s\") and is stopped (%s, "
                       "%.2f s)",
                       r.err.data, sandbox_stop_reason_name(r.stopped), r.wall_s))
            sbx_dump("fork bomb", &r);
        sandbox_result_deinit(&r);
    }
    /* init's end takes the namespace with it; processes still being torn down may show for a
     * moment on a loaded machine, so look a few times. */
    int left = -1;
    for (int i = 0; i < 20 && left != 0; i++) {
        usleep(100 * 1000);
        left = sbx_count_procs_with("spark-bomb-31337");
    }
    if (!sbx_check(left == 0, "host: no fork-bomb process left (%d)", left))
        for (int i = 0; i < 50 && sbx_procs_with("spark-bomb-31337", true) > 0; i++)
            usleep(20 * 1000); /* escaped: clean up all the same */

    /* Memory bomb: a shell doubling a string until the address-space limit. */
    sandbox_policy mp = SANDBOX_POLICY_INIT;
    mp.memory_bytes = 256u << 20;
    mp.timeout_s = 30;
    const char *mem[] = {"sh", "-c", "x=0123456789abcdef; while :; do x=$x$x; done", NULL};
    if (run_in(&r, &mp, mem, NULL, NULL) == 0) {
        if (!sbx_check(r.stopped == SANDBOX_STOP_MEMORY && r.exit_code != 0,
                       "memory bomb stops at the limit (%s, peak RSS %llu MiB)",
                       sandbox_stop_reason_name(r.stopped),
                       (unsigned long long)(r.peak_rss_bytes >> 20)))
            sbx_dump("memory bomb", &r);
        sandbox_result_deinit(&r);
    }

    /* File-size bomb. */
    sandbox_policy fp = SANDBOX_POLICY_INIT;
    fp.file_size_bytes = 1u << 20;
    const char *dd[] = {"dd", "if=/dev/zero", "of=big", "bs=65536", "count=1000", NULL};
    char big[PATH_MAX + 8];
    snprintf(big, sizeof big, "%s/big", ws);
    if (run_in(&r, &fp, dd, NULL, NULL) == 0) {
        struct stat st;
        bool ok = r.stopped == SANDBOX_STOP_FILE_SIZE && r.signal == SIGXFSZ &&
                  stat(big, &st) == 0 && st.st_size <= (1 << 20);
        if (!sbx_check(ok, "file-size bomb is stopped at the limit")) sbx_dump("dd", &r);
        sandbox_result_deinit(&r);
    }
    unlink(big);

    /* Endless output: capped, flagged, stopped. */
    sandbox_policy op = SANDBOX_POLICY_INIT;
    op.output_cap = 4096;
    op.output_limit = 4u << 20;
    if (run_in(&r, &op, (const char *[]){"yes", "spark", NULL}, NULL, NULL) == 0) {
        bool ok = r.stopped == SANDBOX_STOP_OUTPUT_CAP && r.out.truncated &&
                  r.out.len < 4096 + 100 && r.out.total > (4u << 20) &&
                  !strncmp(r.out.data, "spark\nspark\n", 12) &&
                  strstr(r.out.data, "bytes omitted by the sandbox");
        if (!sbx_check(ok, "endless output is capped (kept %zu of %llu bytes) and stopped",
                       r.out.len, (unsigned long long)r.out.total))
            sbx_dump("yes", &r);
        sandbox_result_deinit(&r);
    }

    /* A grandchild that leaves the session and sleeps past the timeout; and one left behind
     * by a command that exits at once. */
    sandbox_policy tp = SANDBOX_POLICY_INIT;
    tp.timeout_s = 1;
    const char *daemon1[] = {"sh", "-c", "setsid sleep 987651 & sleep 987652", NULL};
    if (run_in(&r, &tp, daemon1, NULL, NULL) == 0) {
        sbx_check(r.stopped == SANDBOX_STOP_TIMEOUT && r.wall_s < 3,
                  "timeout stops the command (%.2f s)", r.wall_s);
        sandbox_result_deinit(&r);
    }
    const char *daemon2[] = {"sh", "-c", "setsid sleep 987653 >/dev/null 2>&1 & exit 0", NULL};
    if (run_in(&r, &tp, daemon2, NULL, NULL) == 0) {
        sbx_check(r.exit_code == 0 && r.stopped == SANDBOX_STOP_NONE,
                  "a command that leaves a daemon behind exits normally");
        sandbox_result_deinit(&r);
    }
    int survivors = -1;
    for (int i = 0; i < 20 && survivors != 0; i++) {
        usleep(100 * 1000);
        survivors = sbx_count_procs_with("98765");
    }
    if (!sbx_check(survivors == 0, "host: no setsid grandchild survived (%d)", survivors))
        sbx_procs_with("98765", true);
}

static void test_read_only_policy(void) {
    sandbox_policy pol = SANDBOX_POLICY_INIT;
    pol.fs_mode = SANDBOX_FS_READ_ONLY;
    sandbox_result r;
    const char *argv[] = {self, "attempt", "write", "ro-policy.txt", NULL};
    if (run_in(&r, &pol, argv, NULL, NULL) == 0) {
        char path[PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/ro-policy.txt", ws);
        sbx_check(r.exit_code == 0 && strstr(r.out.data, "blocked EROFS") && missing(path),
                  "read-only policy: the workspace cannot be written");
        sandbox_result_deinit(&r);
    }
}

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "attempt")) return attempt(argc - 2, argv + 2);
    int start = sbx_start(self, sizeof self, self_dir, sizeof self_dir);
    if (start) return start;
    printf("running as uid %d\n", (int)geteuid());
    if (getenv("SPARK_SBX_POOL")) {
        pool = sandbox_netns_pool_new();
        if (!sbx_check(pool != NULL, "a network namespace pool")) return 1;
        printf("every run takes its network namespace from a pool\n");
    }
    sbx_mkdtemp(root, sizeof root);
    snprintf(home, sizeof home, "%s/home", root);
    snprintf(ws, sizeof ws, "%s/home/project", root);
    snprintf(outside, sizeof outside, "%s/outside", root);
    snprintf(rodir, sizeof rodir, "%s/ro", root);
    char ssh[PATH_MAX + 8], key[PATH_MAX + 16];
    snprintf(ssh, sizeof ssh, "%s/.ssh", home);
    snprintf(key, sizeof key, "%s/id_rsa", ssh);
    mkdir(home, 0755);
    mkdir(ws, 0755);
    mkdir(outside, 0755);
    mkdir(rodir, 0755);
    mkdir(ssh, 0700);
    sbx_write_file(key, "-----BEGIN SECRET-----\n");

    test_files();
    test_secret_env();
    test_network();
    test_syscalls();
    test_kill_host();
    test_git();
    test_bombs();
    test_read_only_policy();
    sbx_check(file_is(key, "-----BEGIN SECRET-----\n"), "host: the planted key is unchanged");
    sbx_rm_rf(root);
    sandbox_netns_pool_free(pool);
    sbx_rerun_as_nobody(self);
    printf("%d failure%s\n", sbx_failures, sbx_failures == 1 ? "" : "s");
    return sbx_failures ? 1 : 0;
}
