/* Spawn overhead: `true` and a small `make`, side by side in one run, interleaved round by
 * round so that machine noise hits every method alike:
 *   fork/exec     fork + execve + waitpid, output to /dev/null (the floor)
 *   unsandboxed   sandbox_run() with policy.unsandboxed (capture, limits, no isolation)
 *   sandbox       sandbox_run() with the default policy, no pool
 *   sandbox+pool  the same with policy.netns_pool: the network namespace taken from a pool
 *                 (what the agent's tools and `spark-agent sandbox` run by default)
 *   bwrap         bubblewrap with comparable isolation: all namespaces, a read-only system,
 *                 private /proc /dev /tmp, the workspace bound, no capabilities, new session,
 *                 die-with-parent, and our own seccomp filter loaded through --seccomp
 * Each method is timed in wall-clock time and in CPU time (user + system of this process and
 * of its reaped children, getrusage): on a loaded machine the CPU time is the steadier figure
 * (it leaves out waiting for a CPU; it also leaves out kernel work done in kernel threads,
 * such as a network namespace's teardown; not shown for bwrap, whose sandboxed processes are
 * not reaped into our rusage). A third run repeats `true` from a caller holding
 * BIG_MIB MiB of touched memory, as the agent does with a model and its KV cache: every method
 * forks from it, so page tables are copied at least once.
 * usage: bench_spawn WORKSPACE [ROUNDS_TRUE [ROUNDS_MAKE [BIG_MIB]]]  (not a test; see
 * run_bench.sh) */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sandbox.h"
#include "sandbox_int.h"

extern char **environ;

enum { M_FORK, M_PLAIN, M_SANDBOX, M_POOL, M_BWRAP, N_METHODS };
static const char *method_names[] = {"fork/exec", "unsandboxed", "sandbox", "sandbox+pool",
                                     "bwrap"};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double cpu_now(void) {
    struct rusage a, b;
    getrusage(RUSAGE_SELF, &a);
    getrusage(RUSAGE_CHILDREN, &b);
    return (double)(a.ru_utime.tv_sec + a.ru_stime.tv_sec + b.ru_utime.tv_sec +
                    b.ru_stime.tv_sec) +
           (double)(a.ru_utime.tv_usec + a.ru_stime.tv_usec + b.ru_utime.tv_usec +
                    b.ru_stime.tv_usec) * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static const char *ws;
static int seccomp_fd = -1;
static sandbox_netns_pool *pool;

static int fork_exec(char *const *argv) {
    pid_t p = fork();
    if (p == 0) {
        int fd = open("/dev/null", O_RDWR);
        dup2(fd, 0), dup2(fd, 1), dup2(fd, 2);
        if (chdir(ws) != 0) _exit(126);
        execvp(argv[0], argv);
        _exit(127);
    }
    int st;
    waitpid(p, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static int run_sandbox(char *const *argv, bool unsandboxed, sandbox_netns_pool *np) {
    sandbox_policy pol = SANDBOX_POLICY_INIT;
    pol.workspace = ws;
    pol.unsandboxed = unsandboxed;
    pol.netns_pool = np;
    sandbox_result r;
    int rc = sandbox_run(&r, &pol, (const char *const *)argv, (const char *const *)environ, NULL);
    if (rc) {
        fprintf(stderr, "sandbox_run: %s\n", sandbox_error_last());
        exit(1);
    }
    int code = r.exit_code;
    sandbox_result_deinit(&r);
    return code;
}

static int run_bwrap(char *const *cmd) {
    char *argv[64];
    int n = 0;
    char fdarg[16];
    snprintf(fdarg, sizeof fdarg, "%d", seccomp_fd);
    const char *pre[] = {"bwrap", "--unshare-all", "--die-with-parent", "--new-session",
                         "--cap-drop", "ALL", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin",
                         "/bin", "--symlink", "usr/sbin", "/sbin", "--symlink", "usr/lib", "/lib",
                         "--symlink", "usr/lib64", "/lib64", "--ro-bind", "/etc", "/etc",
                         "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--bind", ws, ws,
                         "--chdir", ws, "--seccomp", fdarg, "--", NULL};
    for (int i = 0; pre[i]; i++) argv[n++] = (char *)pre[i];
    for (int i = 0; cmd[i] && n < 63; i++) argv[n++] = cmd[i];
    argv[n] = NULL;
    /* bwrap reads the filter from the fd, so each run needs it at offset 0. */
    lseek(seccomp_fd, 0, SEEK_SET);
    pid_t p = fork();
    if (p == 0) {
        int fd = open("/dev/null", O_RDWR);
        dup2(fd, 0), dup2(fd, 1), dup2(fd, 2);
        execvp("bwrap", argv);
        _exit(127);
    }
    int st;
    waitpid(p, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static int run_method(int m, char *const *argv) {
    switch (m) {
    case M_FORK: return fork_exec(argv);
    case M_PLAIN: return run_sandbox(argv, true, NULL);
    case M_SANDBOX: return run_sandbox(argv, false, NULL);
    case M_POOL: return run_sandbox(argv, false, pool);
    default: return run_bwrap(argv);
    }
}

static void bench(const char *label, char *const *argv, int rounds) {
    double *t[N_METHODS], *c[N_METHODS];
    for (int m = 0; m < N_METHODS; m++) {
        t[m] = calloc((size_t)rounds, sizeof(double));
        c[m] = calloc((size_t)rounds, sizeof(double));
    }
    for (int m = 0; m < N_METHODS; m++) /* warm-up, and each method must work */
        if (run_method(m, argv) != 0) {
            fprintf(stderr, "%s: %s failed\n", label, method_names[m]);
            exit(1);
        }
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < N_METHODS; k++) {
            int m = (r + k) % N_METHODS; /* rotate the order too */
            double t0 = now(), c0 = cpu_now();
            run_method(m, argv);
            t[m][r] = now() - t0;
            c[m][r] = cpu_now() - c0;
        }
    double base = 0, cbase = 0;
    printf("\n%s (%d rounds)\n%-13s %10s %10s %10s %12s %12s %12s\n", label, rounds, "method",
           "median ms", "mean ms", "min ms", "vs fork/exec", "median cpu", "cpu vs f/e");
    for (int m = 0; m < N_METHODS; m++) {
        double sum = 0;
        for (int r = 0; r < rounds; r++) sum += t[m][r];
        qsort(t[m], (size_t)rounds, sizeof(double), cmp_double);
        qsort(c[m], (size_t)rounds, sizeof(double), cmp_double);
        double med = t[m][rounds / 2], cmed = c[m][rounds / 2];
        if (m == M_FORK) base = med, cbase = cmed;
        if (m == M_BWRAP) /* its sandboxed processes are not reaped into our rusage */
            printf("%-13s %10.2f %10.2f %10.2f %11.2fx %12s %12s\n", method_names[m],
                   med * 1e3, sum / rounds * 1e3, t[m][0] * 1e3, med / base, "n/a", "n/a");
        else
            printf("%-13s %10.2f %10.2f %10.2f %11.2fx %9.2f ms %11.2fx\n", method_names[m],
                   med * 1e3, sum / rounds * 1e3, t[m][0] * 1e3, med / base, cmed * 1e3,
                   cmed / cbase);
        free(t[m]);
        free(c[m]);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s WORKSPACE [ROUNDS_TRUE [ROUNDS_MAKE]]\n", argv[0]);
        return 2;
    }
    ws = argv[1];
    int rounds_true = argc > 2 ? atoi(argv[2]) : 100, rounds_make = argc > 3 ? atoi(argv[3]) : 20;
    long big_mib = argc > 4 ? atol(argv[4]) : 512;
    struct sock_fprog f[2];
    int n_filters = 0;
    if (sandbox_seccomp_filters(f, &n_filters) != 0 || n_filters != 1) {
        fprintf(stderr, "%s\n", sandbox_error_last());
        return 1;
    }
    if (!(pool = sandbox_netns_pool_new())) {
        fprintf(stderr, "%s\n", sandbox_error_last());
        return 1;
    }
    seccomp_fd = memfd_create("bench-seccomp", 0);
    if (write(seccomp_fd, f[0].filter, f[0].len * sizeof(struct sock_filter)) < 0) return 1;

    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/hello.c", ws);
    FILE *c = fopen(path, "w");
    snprintf(path, sizeof path, "%s/Makefile", ws);
    FILE *mk = fopen(path, "w");
    if (!c || !mk) {
        perror("write the make project");
        return 1;
    }
    fputs("int main(void) { return 0; }\n", c);
    fputs("all: hello\nhello: hello.o\n\tcc -o hello hello.o\nhello.o: hello.c\n"
          "\tcc -O0 -c hello.c\n",
          mk);
    fclose(c);
    fclose(mk);
    printf("spawn overhead, workspace %s; each column the same command, interleaved\n", ws);
    bench("true", (char *[]){"true", NULL}, rounds_true);
    bench("make -B (compile and link hello.c)", (char *[]){"make", "-s", "-B", NULL},
          rounds_make);
    if (big_mib > 0) {
        size_t n = (size_t)big_mib << 20;
        char *big = malloc(n);
        if (!big) return 1;
        for (size_t i = 0; i < n; i += 4096) big[i] = 1;
        char label[96];
        snprintf(label, sizeof label, "true, from a caller holding %ld MiB", big_mib);
        bench(label, (char *[]){"true", NULL}, rounds_true);
        free(big);
    }
    sandbox_netns_pool_free(pool);
    return 0;
}
