/* Helpers shared by the sandbox tests. */
#include "sbx_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <limits.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

int sbx_failures;

bool sbx_check(bool cond, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", cond ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    if (!cond) sbx_failures++;
    return cond;
}

int sbx_start(char *self, size_t self_cap, char *dir, size_t dir_cap) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    ssize_t n = readlink("/proc/self/exe", self, self_cap - 1);
    if (n <= 0) {
        perror("readlink /proc/self/exe");
        exit(1);
    }
    self[n] = 0;
    sbx_self_dir(dir, dir_cap);
    sandbox_caps caps;
    sandbox_caps_probe(&caps);
    if (!caps.user_namespaces || !caps.seccomp_filter) {
        printf("SKIP: this machine cannot sandbox (%s)\n", caps.detail);
        return 77;
    }
    return 0;
}

void sbx_mkdtemp(char *out, size_t cap) {
    const char *t = getenv("TMPDIR");
    snprintf(out, cap, "%s/spark-sbx-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(out)) {
        perror("mkdtemp");
        exit(1);
    }
    chmod(out, 0755);
}

void sbx_write_file(const char *path, const char *content) {
    FILE *f = fopen(path, "w");
    if (!f || fputs(content, f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
}

long sbx_read_file(const char *path, char *buf, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fd, buf + n, cap - 1 - n)) > 0) n += (size_t)r;
    close(fd);
    buf[n] = 0;
    return (long)n;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    if (flag == FTW_DP || flag == FTW_D) rmdir(path);
    else unlink(path);
    return 0;
}

void sbx_rm_rf(const char *path) {
    nftw(path, rm_one, 32, FTW_DEPTH | FTW_PHYS);
}

void sbx_self_dir(char *out, size_t cap) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        perror("readlink /proc/self/exe");
        exit(1);
    }
    exe[n] = 0;
    *strrchr(exe, '/') = 0;
    snprintf(out, cap, "%s", exe);
}

int sbx_count_procs_with(const char *token) {
    return sbx_procs_with(token, false);
}

int sbx_procs_with(const char *token, bool kill_them) {
    DIR *d = opendir("/proc");
    if (!d) return -1;
    int count = 0;
    struct dirent *de;
    size_t tl = strlen(token);
    while ((de = readdir(d))) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9') continue;
        char path[300], buf[4096];
        snprintf(path, sizeof path, "/proc/%s/cmdline", de->d_name);
        long n = sbx_read_file(path, buf, sizeof buf);
        for (long i = 0; n > 0 && i + (long)tl <= n; i++)
            if (!memcmp(buf + i, token, tl)) {
                count++;
                if (kill_them) kill((pid_t)atol(de->d_name), SIGKILL);
                break;
            }
    }
    closedir(d);
    return count;
}

const char *const *sbx_env(const char *home, const char *const *extra) {
    static char home_var[PATH_MAX + 8];
    static const char *env[64];
    snprintf(home_var, sizeof home_var, "HOME=%s", home);
    int n = 0;
    env[n++] = "PATH=/usr/local/bin:/usr/bin:/bin";
    env[n++] = home_var;
    env[n++] = "LANG=C";
    /* LeakSanitizer stops the world with ptrace, which the sandbox refuses. */
    env[n++] = "ASAN_OPTIONS=detect_leaks=0";
    for (const char *const *e = extra; e && *e && n < 62; e++) env[n++] = *e;
    env[n] = NULL;
    return env;
}

void sbx_dump(const char *what, const sandbox_result *r) {
    printf("  [%s] exit %d signal %d stopped %s wall %.3f s\n  stdout (%zu of %llu): %.400s\n"
           "  stderr (%zu of %llu): %.600s\n",
           what, r->exit_code, r->signal, sandbox_stop_reason_name(r->stopped), r->wall_s,
           r->out.len, (unsigned long long)r->out.total, r->out.data ? r->out.data : "",
           r->err.len, (unsigned long long)r->err.total, r->err.data ? r->err.data : "");
}

void sbx_rerun_as_nobody(const char *self) {
    if (geteuid() != 0 || getenv("SPARK_SBX_NO_NOBODY")) return;
    if (access("/usr/bin/setpriv", X_OK) != 0) {
        printf("note: not re-run as nobody: no /usr/bin/setpriv\n");
        return;
    }
    char *env[] = {"PATH=/usr/bin:/bin", "SPARK_SBX_NO_NOBODY=1", "TMPDIR=/tmp",
                   getenv("SPARK_SBX_POOL") ? "SPARK_SBX_POOL=1" : NULL, NULL};
    pid_t pid;
    int st;
    /* nobody must reach the executable's directory (the suite binds it read-only into its
     * sandboxes and runs itself there): a checkout under a 0700 directory (mktemp -d, a private
     * home) is out of its reach. So the re-run runs a copy of the executable in a directory of
     * its own under /tmp that every user can traverse (the tests read nothing else beside it). */
    char tdir[] = "/tmp/spark-sbx-nobody-XXXXXX", copy[PATH_MAX];
    if (!mkdtemp(tdir) || chmod(tdir, 0755) != 0) {
        sbx_check(false, "a directory for the nobody re-run (%s)", strerror(errno));
        return;
    }
    const char *base = strrchr(self, '/');
    snprintf(copy, sizeof copy, "%s/%s", tdir, base ? base + 1 : self);
    int in = open(self, O_RDONLY | O_CLOEXEC);
    int out = open(copy, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
    bool copied = in >= 0 && out >= 0;
    char buf[65536];
    for (ssize_t n; copied && (n = read(in, buf, sizeof buf)) != 0;)
        copied = n > 0 && write(out, buf, (size_t)n) == n;
    if (in >= 0) close(in);
    if (out >= 0) {
        if (fchmod(out, 0755) != 0) copied = false;
        if (close(out) != 0) copied = false;
    }
    char *argv[] = {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", copy,
                    NULL};
    /* A test driver starts its own re-run directly (allow-listed in the choke-point test). */
    if (!copied || posix_spawn(&pid, "/usr/bin/setpriv", NULL, NULL, argv, env) != 0) {
        sbx_check(false, "copy %s to %s and spawn setpriv", self, copy);
        unlink(copy);
        rmdir(tdir);
        return;
    }
    waitpid(pid, &st, 0);
    unlink(copy);
    rmdir(tdir);
    sbx_check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the whole suite again as nobody (exit %d)",
              WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

int sbx_deny_user_namespaces(void) {
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (!ctx) return -1;
    int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(unshare), 0);
    if (rc == 0)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                              SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER));
    if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
    if (rc == 0) rc = seccomp_load(ctx);
    seccomp_release(ctx);
    return rc == 0 ? 0 : -1;
}
