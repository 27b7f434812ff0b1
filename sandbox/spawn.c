/* sandbox_run(): the one choke point through which the project starts processes for tools.
 *
 * Process structure (isolated):
 *   caller ──clone(new user/mount/PID/IPC/UTS/cgroup/net ns, pidfd)──▶ init (PID 1)
 *   init: maps its uid/gid, builds the new root, pivots, then clones the command and reaps
 *         everything until the command exits; it reports the command's wait status on the
 *         status pipe and exits, and the kernel kills whatever is left in the namespace.
 *   command: rlimits, no capabilities, no_new_privs, landlock, seccomp, execve. It is cloned
 *         the way posix_spawn does (CLONE_VM | CLONE_VFORK, on a stack of its own): it shares
 *         init's memory only until its execve, while init waits, so no page table of init (a
 *         copy of the caller's: large in a process holding a model) is copied for it and none
 *         is torn down at its execve. Until then it runs only our code on plan data.
 * The caller polls the output pipes and the pidfd; a timeout, the output limit or a cancel
 * kills init, which takes the whole tree with it. init dies with the caller (PDEATHSIG).
 *
 * The children are raw clones of a possibly multi-threaded caller: they use system calls only,
 * on data the caller prepared (sandbox_plan). */
#include "sandbox_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <linux/securebits.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

enum { FD_STATUS = 3, FD_ALIVE = 4, FD_NS_USER = 5, FD_NS_NET = 6 };

#define DEFAULT_OUTPUT_CAP ((size_t)1 << 20)
#define DEFAULT_MAX_PROCESSES 512
#define DEFAULT_MAX_OPEN_FILES 4096
#define CMD_STACK_BYTES ((size_t)64 << 10) /* below malloc's mmap threshold: no munmap */

/* ---------------------------------------------------------------------------------------------
 * Children
 * ------------------------------------------------------------------------------------------- */

static void put(int fd, const char *s) {
    size_t n = sandbox_cstr_len(s);
    while (n) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

static _Noreturn void child_fail(int kind, const char *what, int err) {
    sandbox_record rec;
    memset(&rec, 0, sizeof rec);
    rec.kind = kind;
    rec.err = err;
    sandbox_cstr_copy(rec.what, sizeof rec.what, what, "", "");
    (void)!write(FD_STATUS, &rec, sizeof rec);
    _exit(126);
}

/* 0..4 become stdin, stdout, stderr, status, alive (5 and 6 the pooled namespaces, when
 * used); everything else is closed. */
static void remap_fds(const sandbox_plan *p) {
    int src[7] = {p->fd_stdin, p->fd_stdout, p->fd_stderr, p->fd_status, p->fd_alive,
                  p->ns_user_fd, p->ns_net_fd};
    int n = p->ns_user_fd >= 0 ? 7 : 5;
    /* A source below n could be overwritten by an earlier dup: moved above n first. Then
     * each lands on its number (close-on-exec from FD_STATUS on: only 0..2 reach the command) */
    for (int i = 0; i < n; i++)
        if (src[i] < n && (src[i] = fcntl(src[i], F_DUPFD, n)) < 0) _exit(126);
    for (int i = 0; i < n; i++)
        if (dup3(src[i], i, i >= FD_STATUS ? O_CLOEXEC : 0) < 0) _exit(126);
    syscall(SYS_close_range, (unsigned)n, ~0U, 0);
}

/* Die with the caller; and if it is already gone (before PDEATHSIG was set), die now. */
static void die_with_parent(void) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    struct pollfd pf = {.fd = FD_ALIVE, .events = POLLIN};
    if (poll(&pf, 1, 0) != 0) _exit(126);
}

static const char *errno_text(int e) {
    switch (e) {
    case ENOENT: return "not found";
    case EACCES: return "permission denied";
    case ENOEXEC: return "not an executable format";
    case ENOTDIR: return "a path component is not a directory";
    case ELOOP: return "too many symbolic links";
    case E2BIG: return "argument list too long";
    case ENOMEM: return "out of memory";
    case ETXTBSY: return "text file busy";
    case EPERM: return "operation not permitted";
    case EAGAIN: return "resource limit reached";
    default: return "cannot execute";
    }
}

static _Noreturn void exec_command(const sandbox_plan *p) {
    const char *name = p->argv[0];
    int err = ENOENT;
    bool slash = false;
    for (const char *c = name; *c; c++) slash |= *c == '/';
    if (slash) {
        execve(name, p->argv, p->envp);
        err = errno;
    } else {
        const char *s = p->path;
        while (*s) {
            const char *e = s;
            while (*e && *e != ':') e++;
            size_t dl = (size_t)(e - s), nl = sandbox_cstr_len(name);
            if (dl + nl + 2 <= p->exec_buf_len) {
                char *b = p->exec_buf;
                memcpy(b, dl ? s : ".", dl ? dl : 1);
                size_t k = dl ? dl : 1;
                b[k++] = '/';
                memcpy(b + k, name, nl + 1);
                execve(b, p->argv, p->envp);
                if (errno == EACCES) err = EACCES;
                else if (errno != ENOENT && errno != ENOTDIR) {
                    err = errno;
                    break;
                }
            }
            s = *e ? e + 1 : e;
        }
    }
    put(2, "spark-agent sandbox: cannot execute '");
    put(2, name);
    put(2, "': ");
    put(2, errno_text(err));
    put(2, "\n");
    _exit(err == ENOENT ? 127 : 126);
}

/* The 16 hex digits after `key` in text as a mask; false when absent. */
static bool hex_mask(const char *text, const char *key, uint64_t *out) {
    size_t kl = sandbox_cstr_len(key);
    for (const char *t = text; *t; t++) {
        if (memcmp(t, key, kl) != 0) continue;
        uint64_t v = 0;
        int n = 0;
        for (t += kl; n < 16; t++, n++) {
            char c = *t;
            int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            if (d < 0) return false;
            v = v << 4 | (uint64_t)d;
        }
        *out = v;
        return true;
    }
    return false;
}

/* Signals whose disposition is not the default (ignored or caught: bit n-1 for signal n), read
 * from /proc/self/status in three system calls instead of asking for each of 64 signals; all
 * of them when it cannot be read. */
static uint64_t non_default_signals(void) {
    char buf[2048]; /* the two lines sit near byte 750 (after Groups, which can be long) */
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ~(uint64_t)0;
    size_t n = 0;
    ssize_t r;
    while (n < sizeof buf - 1 && (r = read(fd, buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)r;
    close(fd);
    buf[n] = 0;
    uint64_t ign, cgt;
    if (!hex_mask(buf, "\nSigIgn:\t", &ign) || !hex_mask(buf, "\nSigCgt:\t", &cgt))
        return ~(uint64_t)0;
    return ign | cgt;
}

/* The caller's signal mask and ignored signals survive execve: a server that ignores SIGPIPE
 * would hand that to `yes | head`. The command starts with the defaults (caught signals too:
 * none of the caller's handlers may run in the child before its execve). */
static void reset_signals(void) {
    /* The raw call: libc refuses to touch the signals it reserves for itself (32, 33). */
    struct {
        void (*handler)(int);
        unsigned long flags;
        void (*restorer)(void);
        uint64_t mask;
    } dfl = {SIG_DFL, 0, NULL, 0};
    uint64_t todo = non_default_signals();
    for (int sig = 1; sig <= 64; sig++)
        if (sig != SIGKILL && sig != SIGSTOP && (todo >> (sig - 1) & 1))
            (void)syscall(SYS_rt_sigaction, sig, &dfl, NULL, 8);
    uint64_t none = 0;
    (void)syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, 8);
}

static void apply_rlimits(const sandbox_plan *p) {
    for (int i = 0; i < p->n_rlimits; i++) {
        struct rlimit rl = {.rlim_cur = p->rlimits[i].soft, .rlim_max = p->rlimits[i].hard};
        if (setrlimit(p->rlimits[i].resource, &rl) != 0)
            child_fail(SANDBOX_REC_SETUP, "setrlimit", errno);
    }
}

static void drop_capabilities(const sandbox_plan *p) {
    if (prctl(PR_SET_SECUREBITS, SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
                                     SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED) != 0)
        child_fail(SANDBOX_REC_SETUP, "securebits", errno);
    for (int cap = 0; cap <= p->cap_last; cap++)
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL)
            child_fail(SANDBOX_REC_SETUP, "drop the capability bounding set", errno);
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    if (syscall(SYS_capset, &hdr, data) != 0) child_fail(SANDBOX_REC_SETUP, "capset", errno);
}

static _Noreturn void command_child(const sandbox_plan *p) {
    reset_signals();
    apply_rlimits(p);
    drop_capabilities(p);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        child_fail(SANDBOX_REC_UNAVAILABLE, "no_new_privs", errno);
    const char *what = "landlock";
    int ll = sandbox_landlock_apply(p, &what);
    if (ll < 0) child_fail(SANDBOX_REC_SETUP, what, -ll);
    for (int i = p->n_filters - 1; i >= 0; i--)
        if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &p->filters[i]) != 0)
            child_fail(SANDBOX_REC_UNAVAILABLE, "seccomp filter", errno);
    exec_command(p);
}

#if defined(__SANITIZE_ADDRESS__)
#define SANDBOX_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANDBOX_ASAN 1
#endif
#endif
#ifndef SANDBOX_ASAN
#define SANDBOX_ASAN 0
static int command_entry(void *arg) {
    command_child(arg);
}
#endif

/* Map the caller's uid/gid in the user namespace just created. */
static void write_id_maps(const sandbox_plan *p) {
    int fd = open("/proc/self/setgroups", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        (void)!write(fd, "deny", 4);
        close(fd);
    }
    const char *files[2] = {"/proc/self/uid_map", "/proc/self/gid_map"};
    const char *maps[2] = {p->uid_map, p->gid_map};
    for (int i = 0; i < 2; i++) {
        fd = open(files[i], O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, maps[i], sandbox_cstr_len(maps[i])) < 0)
            child_fail(SANDBOX_REC_SETUP, files[i], errno);
        close(fd);
    }
}

/* init once its namespaces exist and its ids are mapped: build the root, start the command,
 * reap until it ends. */
static _Noreturn void init_main(sandbox_plan *p) {
    (void)sethostname("spark-sandbox", 13);
    const char *what = "";
    int rc = sandbox_mounts_apply(p, &what);
    if (rc) child_fail(SANDBOX_REC_SETUP, what, -rc);
    if (chdir(p->cwd) != 0) child_fail(SANDBOX_REC_SETUP, p->cwd, errno);
    /* init is a copy of the caller's memory (its secrets too): not readable through /proc by
     * the command (it also lacks init's capabilities). The command's execve resets this. */
    prctl(PR_SET_DUMPABLE, 0);

#if SANDBOX_ASAN
    /* AddressSanitizer cannot follow a child running on another stack in shared memory (it
     * warns on the command's stderr): a copy, as fork does. */
    pid_t cmd = (pid_t)syscall(SYS_clone, SIGCHLD, NULL, NULL, NULL, 0);
    if (cmd == 0) command_child(p);
#else
    /* glibc's clone() runs command_entry on the given stack (a raw clone with a new stack
     * could not return); the stack grows down from its end. */
    pid_t cmd = clone(command_entry, p->cmd_stack + p->cmd_stack_len,
                      CLONE_VM | CLONE_VFORK | SIGCHLD, p);
#endif
    if (cmd < 0) child_fail(SANDBOX_REC_SETUP, "clone the command", errno);
    close(0);
    close(1);
    close(2);
    for (;;) {
        int st = 0;
        pid_t w = (pid_t)wait4(-1, &st, __WALL, NULL);
        if (w == cmd) {
            sandbox_record rec;
            memset(&rec, 0, sizeof rec);
            rec.kind = SANDBOX_REC_RESULT;
            rec.wait_status = st;
            rec.landlock_abi = p->landlock_abi;
            (void)!write(FD_STATUS, &rec, sizeof rec);
            _exit(0);
        }
        if (w < 0 && errno != EINTR) child_fail(SANDBOX_REC_SETUP, "lost the command", errno);
    }
}

_Noreturn void sandbox_child_init(sandbox_plan *p) {
    remap_fds(p);
    die_with_parent();
    setsid();
    write_id_maps(p);
    init_main(p);
}

/* init under sandbox_child_joined: the caller's child (CLONE_PARENT), so it dies with the
 * caller as an unpooled init does. */
static _Noreturn void joined_init(sandbox_plan *p) {
    die_with_parent();
    setsid();
    init_main(p);
}

#if !SANDBOX_ASAN
static int joined_init_entry(void *arg) {
    joined_init(arg);
}
#endif

_Noreturn void sandbox_child_joined(sandbox_plan *p) {
    remap_fds(p);
    die_with_parent();
    setsid();
    if (setns(FD_NS_USER, CLONE_NEWUSER) != 0)
        child_fail(SANDBOX_REC_SETUP, "join the pooled user namespace", errno);
    if (setns(FD_NS_NET, CLONE_NEWNET) != 0)
        child_fail(SANDBOX_REC_SETUP, "join the pooled network namespace", errno);
    close(FD_NS_USER);
    close(FD_NS_NET);
    if (unshare((int)p->unshare_flags) != 0)
        child_fail(SANDBOX_REC_UNAVAILABLE, "create the namespaces", errno);
    write_id_maps(p);
    /* A copy of the caller's memory, as init is (after the maps: a non-dumpable process's
     * /proc/self files belong to root). */
    prctl(PR_SET_DUMPABLE, 0);
    /* init becomes the caller's child (CLONE_PARENT, with this process's exit signal, 0): the
     * caller waits for it directly and this process exits now, one process fewer to wake when
     * the command ends. */
#if SANDBOX_ASAN
    pid_t init = (pid_t)syscall(SYS_clone, CLONE_PARENT, NULL, NULL, NULL, 0);
    if (init == 0) joined_init(p);
#else
    /* init shares this process's memory (no page tables copied), which outlives this exit. */
    pid_t init = clone(joined_init_entry, p->init_stack + p->init_stack_len,
                       CLONE_VM | CLONE_PARENT, p);
#endif
    if (init < 0) child_fail(SANDBOX_REC_SETUP, "clone init", errno);
    sandbox_record rec;
    memset(&rec, 0, sizeof rec);
    rec.kind = SANDBOX_REC_INIT;
    rec.wait_status = init;
    (void)!write(FD_STATUS, &rec, sizeof rec);
    _exit(0);
}

_Noreturn void sandbox_child_plain(sandbox_plan *p) {
    remap_fds(p);
    die_with_parent();
    setsid();
    if (chdir(p->cwd) != 0) child_fail(SANDBOX_REC_SETUP, p->cwd, errno);
    reset_signals();
    apply_rlimits(p);
    exec_command(p);
}

/* ---------------------------------------------------------------------------------------------
 * Output capture: the first half of the cap and a ring of the last half. The buffers grow with
 * the output (most commands write little; `true` writes nothing): no allocation of the whole
 * cap, and no unmapping of it, per run.
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    int fd;
    char *head, *ring;
    size_t head_cap, head_len, head_alloc, ring_cap, ring_len, ring_pos;
    uint64_t total;
    bool oom; /* a buffer could not grow: the run fails with SANDBOX_ENOMEM */
} capture;

static void capture_init(capture *c, int fd, size_t cap) {
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->head_cap = cap / 2;
    c->ring_cap = cap - c->head_cap;
}

static void capture_add(capture *c, const char *buf, size_t n) {
    c->total += n;
    if (c->oom) return;
    size_t h = c->head_cap - c->head_len < n ? c->head_cap - c->head_len : n;
    if (c->head_len + h > c->head_alloc) {
        size_t na = c->head_alloc ? c->head_alloc : 4096;
        while (na < c->head_len + h) na *= 2;
        if (na > c->head_cap) na = c->head_cap;
        char *q = realloc(c->head, na);
        if (!q) {
            c->oom = true;
            return;
        }
        c->head = q;
        c->head_alloc = na;
    }
    memcpy(c->head + c->head_len, buf, h);
    c->head_len += h;
    buf += h;
    n -= h;
    if (!n) return;
    if (!c->ring && !(c->ring = malloc(c->ring_cap))) {
        c->oom = true;
        return;
    }
    if (n >= c->ring_cap) {
        memcpy(c->ring, buf + n - c->ring_cap, c->ring_cap);
        c->ring_len = c->ring_cap;
        c->ring_pos = 0;
        return;
    }
    while (n) {
        size_t room = c->ring_cap - c->ring_pos, k = n < room ? n : room;
        memcpy(c->ring + c->ring_pos, buf, k);
        c->ring_pos = (c->ring_pos + k) % c->ring_cap;
        c->ring_len = c->ring_len + k > c->ring_cap ? c->ring_cap : c->ring_len + k;
        buf += k;
        n -= k;
    }
}

static int capture_finish(capture *c, sandbox_output *o) {
    if (c->oom) return -1;
    char marker[96] = "";
    uint64_t kept = c->head_len + c->ring_len;
    o->total = c->total;
    o->truncated = c->total > kept;
    if (o->truncated)
        snprintf(marker, sizeof marker, "\n[... %llu bytes omitted by the sandbox ...]\n",
                 (unsigned long long)(c->total - kept));
    size_t ml = strlen(marker);
    o->data = malloc(c->head_len + ml + c->ring_len + 1);
    if (!o->data) return -1;
    size_t n = 0;
    if (c->head_len) memcpy(o->data, c->head, c->head_len);
    n += c->head_len;
    memcpy(o->data + n, marker, ml);
    n += ml;
    if (c->ring_len) {
        size_t start = c->ring_len < c->ring_cap ? 0 : c->ring_pos;
        size_t first = c->ring_len < c->ring_cap ? c->ring_len : c->ring_cap - start;
        memcpy(o->data + n, c->ring + start, first);
        n += first;
        memcpy(o->data + n, c->ring, c->ring_len - first);
        n += c->ring_len - first;
    }
    o->data[n] = 0;
    o->len = n;
    return 0;
}

static void capture_free(capture *c) {
    free(c->head);
    free(c->ring);
    c->head = c->ring = NULL;
}

/* ---------------------------------------------------------------------------------------------
 * The caller's side
 * ------------------------------------------------------------------------------------------- */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool path_within(const char *path, const char *dir) {
    size_t n = strlen(dir);
    if (n == 1) return true;
    return !strncmp(path, dir, n) && (path[n] == 0 || path[n] == '/');
}

/* $HOME inside: the caller's value when it is a clean absolute path a tmpfs can go on. */
static const char *choose_home(const char *const *env, const char *ws) {
    const char *h = NULL;
    for (const char *const *e = env; e && *e; e++)
        if (!strncmp(*e, "HOME=", 5)) h = *e + 5;
    static const char *const bad[] = {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64",
                                      "/libx32", "/etc", "/proc", "/dev"};
    if (!h || h[0] != '/' || !h[1] || strlen(h) >= PATH_MAX / 2 || strstr(h, "//") ||
        strstr(h, "/./") || strstr(h, "/../") || h[strlen(h) - 1] == '/' ||
        (strlen(h) >= 2 && !strcmp(h + strlen(h) - 2, "/.")) ||
        (strlen(h) >= 3 && !strcmp(h + strlen(h) - 3, "/..")))
        return "/tmp/home";
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (path_within(h, bad[i])) return "/tmp/home";
    if (path_within(h, ws)) return "/tmp/home";
    return h;
}

/* What the kernel offers, read once per process (it does not change while it runs):
 * /proc/sys/kernel/cap_last_cap (63 when it cannot be read: the command drops the bounding
 * set up to it instead of trying all 64 numbers) and the landlock ABI. */
static int g_cap_last = 63, g_landlock_abi;
static pthread_once_t g_kernel_once = PTHREAD_ONCE_INIT;

static void read_kernel_facts(void) {
    FILE *f = fopen("/proc/sys/kernel/cap_last_cap", "re");
    int v;
    if (f && fscanf(f, "%d", &v) == 1 && v > 0 && v < 63) g_cap_last = v;
    if (f) fclose(f);
    g_landlock_abi = sandbox_landlock_abi();
}

static void add_rlimit(sandbox_plan *p, int res, unsigned long long soft,
                       unsigned long long hard) {
    struct rlimit cur;
    if (getrlimit(res, &cur) == 0 && cur.rlim_max != RLIM_INFINITY) {
        if (hard > cur.rlim_max) hard = cur.rlim_max;
        if (soft > hard) soft = hard;
    }
    p->rlimits[p->n_rlimits].resource = res;
    p->rlimits[p->n_rlimits].soft = soft;
    p->rlimits[p->n_rlimits].hard = hard;
    p->n_rlimits++;
}

static void close_fd(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

typedef struct {
    sandbox_strings strings;
    sandbox_placeholders ph;
    char **envp;
    char *exec_buf;
    char *cmd_stack, *init_stack;
    int ns_user_fd, ns_net_fd; /* a pooled namespace pair, -1 when none */
    sandbox_netns_pool *pool;
    bool ns_reusable;
    int pipes[4][2]; /* stdout, stderr, status, alive */
    int devnull, pidfd;
    capture cap[2];
} run_state;

static int build_env(run_state *rs, sandbox_plan *p, const char *const *env, const char *home,
                     bool isolated) {
    size_t n = 0;
    for (const char *const *e = env; e && *e; e++) n++;
    rs->envp = calloc(n + 4, sizeof *rs->envp);
    if (!rs->envp) return sandbox_err(SANDBOX_ENOMEM, "sandbox: out of memory");
    size_t k = 0;
    p->path = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";
    bool have_path = false;
    for (const char *const *e = env; e && *e; e++) {
        if (!strchr(*e, '=') || sandbox_env_is_secret(*e)) continue;
        if (isolated && (!strncmp(*e, "HOME=", 5) || !strncmp(*e, "TMPDIR=", 7))) continue;
        if (!strncmp(*e, "PATH=", 5)) {
            p->path = *e + 5;
            have_path = true;
        }
        rs->envp[k++] = (char *)*e;
    }
    if (!have_path) rs->envp[k++] = sandbox_strcat3(&rs->strings, "PATH=", p->path, "");
    if (isolated) {
        rs->envp[k++] = sandbox_strcat3(&rs->strings, "HOME=", home, "");
        rs->envp[k++] = sandbox_strdup(&rs->strings, "TMPDIR=/tmp");
    }
    for (size_t i = 0; i < k; i++)
        if (!rs->envp[i]) return sandbox_err(SANDBOX_ENOMEM, "sandbox: out of memory");
    p->envp = rs->envp;
    return 0;
}

static void run_state_free(run_state *rs) {
    for (int i = 0; i < 4; i++) {
        close_fd(&rs->pipes[i][0]);
        close_fd(&rs->pipes[i][1]);
    }
    close_fd(&rs->devnull);
    close_fd(&rs->pidfd);
    sandbox_placeholders_remove(&rs->ph);
    sandbox_strings_free(&rs->strings);
    free(rs->envp);
    free(rs->exec_buf);
    free(rs->cmd_stack);
    free(rs->init_stack);
    if (rs->pool) sandbox_netns_release(rs->pool, rs->ns_user_fd, rs->ns_net_fd, rs->ns_reusable);
    capture_free(&rs->cap[0]);
    capture_free(&rs->cap[1]);
}

static void kill_tree(run_state *rs, pid_t pid, bool isolated) {
    /* Isolated: init is PID 1 of the namespace, its death kills the rest. Plain: the session
     * the command started (it may have left it: unsandboxed means unsandboxed). */
    if (!isolated) kill(-pid, SIGKILL);
    if (syscall(SYS_pidfd_send_signal, rs->pidfd, SIGKILL, NULL, 0) != 0) kill(pid, SIGKILL);
}

static const char *unavailable_hint(void) {
    return "pass --unsandboxed (policy.unsandboxed) to run without isolation at your own risk";
}

/* The error a child's SETUP or UNAVAILABLE record stands for. */
static int setup_error(sandbox_record *rec) {
    rec->what[sizeof rec->what - 1] = 0;
    bool unavailable = rec->kind == SANDBOX_REC_UNAVAILABLE;
    return sandbox_err(unavailable ? SANDBOX_EUNAVAILABLE : SANDBOX_ESPAWN,
                       "sandbox: set-up failed: %s: %s%s%s", rec->what, strerror(rec->err),
                       unavailable ? "; refusing to run: " : "",
                       unavailable ? unavailable_hint() : "");
}

int sandbox_run(sandbox_result *out, const sandbox_policy *pol, const char *const *argv,
                const char *const *env, const char *cwd) {
    if (!out) return sandbox_err(SANDBOX_EINVAL, "sandbox_run: no result");
    memset(out, 0, sizeof *out);
    if (!pol || pol->version != SANDBOX_POLICY_VERSION)
        return sandbox_err(SANDBOX_EINVAL, "sandbox_run: no policy or wrong policy version");
    if (!argv || !argv[0] || !argv[0][0])
        return sandbox_err(SANDBOX_EINVAL, "sandbox_run: empty argv");
    if (!pol->workspace || pol->workspace[0] != '/')
        return sandbox_err(SANDBOX_EINVAL, "sandbox_run: the workspace must be an absolute path");
    /* (the negated comparisons also refuse NaN) */
    if (!(pol->timeout_s >= 0 && pol->timeout_s <= 1e9) ||
        !(pol->cpu_s >= 0 && pol->cpu_s <= 1e9) || pol->max_processes < 0 ||
        pol->max_open_files < 0)
        return sandbox_err(SANDBOX_EINVAL, "sandbox_run: a limit in the policy is negative or "
                                           "absurd (times up to 1e9 s)");
    char ws[PATH_MAX], cwd_real[PATH_MAX];
    struct stat st;
    if (!realpath(pol->workspace, ws) || stat(ws, &st) != 0)
        return sandbox_err(SANDBOX_EINVAL, "sandbox_run: workspace %s: %s", pol->workspace,
                           strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return sandbox_err(SANDBOX_EINVAL, "sandbox_run: workspace %s: not a directory",
                           pol->workspace);
    if (!strcmp(ws, "/"))
        return sandbox_err(SANDBOX_EINVAL, "sandbox_run: the workspace cannot be /");
    if (!cwd || !strcmp(cwd, pol->workspace)) /* (resolved already) */
        memcpy(cwd_real, ws, strlen(ws) + 1);
    else if (!realpath(cwd, cwd_real))
        return sandbox_err(SANDBOX_EINVAL, "sandbox_run: directory %s: %s", cwd,
                           strerror(errno));
    if (!path_within(cwd_real, ws))
        return sandbox_err(SANDBOX_EINVAL, "sandbox_run: directory %s is outside the workspace "
                                           "%s", cwd_real, ws);
    bool isolated = !pol->unsandboxed;

    sandbox_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.ns_user_fd = plan.ns_net_fd = -1;
    run_state rs;
    memset(&rs, 0, sizeof rs);
    for (int i = 0; i < 4; i++) rs.pipes[i][0] = rs.pipes[i][1] = -1;
    rs.devnull = rs.pidfd = rs.ns_user_fd = rs.ns_net_fd = -1;
    int rc = 0;
    double t0 = now_s();

    const char *home = isolated ? choose_home(env, ws) : "";
    plan.isolated = isolated;
    plan.argv = (char *const *)argv;
    plan.cwd = cwd_real;
    plan.network = pol->network;
    if ((rc = build_env(&rs, &plan, env, home, isolated))) goto done;
    size_t longest = 1;
    for (const char *s = plan.path; *s;) {
        const char *e = strchr(s, ':');
        size_t l = e ? (size_t)(e - s) : strlen(s);
        if (l > longest) longest = l;
        s += l + (e ? 1 : 0);
    }
    plan.exec_buf_len = longest + strlen(argv[0]) + 2;
    plan.cmd_stack_len = CMD_STACK_BYTES;
    if (!(plan.exec_buf = rs.exec_buf = malloc(plan.exec_buf_len)) ||
        !(plan.cmd_stack = rs.cmd_stack = malloc(plan.cmd_stack_len))) {
        rc = sandbox_err(SANDBOX_ENOMEM, "sandbox: out of memory");
        goto done;
    }

    add_rlimit(&plan, RLIMIT_CORE, 0, 0);
    if (pol->memory_bytes) add_rlimit(&plan, RLIMIT_AS, pol->memory_bytes, pol->memory_bytes);
    if (pol->cpu_s > 0) {
        unsigned long long c = (unsigned long long)pol->cpu_s;
        if ((double)c < pol->cpu_s) c++;
        add_rlimit(&plan, RLIMIT_CPU, c, c + 1);
    }
    if (pol->file_size_bytes)
        add_rlimit(&plan, RLIMIT_FSIZE, pol->file_size_bytes, pol->file_size_bytes);
    int nproc = pol->max_processes ? pol->max_processes : DEFAULT_MAX_PROCESSES;
    add_rlimit(&plan, RLIMIT_NPROC, (unsigned long long)nproc, (unsigned long long)nproc);
    int nofile = pol->max_open_files ? pol->max_open_files : DEFAULT_MAX_OPEN_FILES;
    add_rlimit(&plan, RLIMIT_NOFILE, (unsigned long long)nofile, (unsigned long long)nofile);
    snprintf(plan.pid_max, sizeof plan.pid_max, "%d", nproc + 2 > 301 ? nproc + 2 : 301);

    if (isolated) {
        if ((rc = sandbox_seccomp_filters(plan.filters, &plan.n_filters))) goto done;
        pthread_once(&g_kernel_once, read_kernel_facts);
        plan.cap_last = g_cap_last;
        plan.landlock_abi = g_landlock_abi;
        unsigned uid = (unsigned)geteuid(), gid = (unsigned)getegid();
        snprintf(plan.uid_map, sizeof plan.uid_map, "%u %u 1\n", uid, uid);
        snprintf(plan.gid_map, sizeof plan.gid_map, "%u %u 1\n", gid, gid);
        plan.clone_flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC |
                           CLONE_NEWUTS | CLONE_NEWCGROUP | (pol->network ? 0 : CLONE_NEWNET);
        /* A pooled network namespace when the policy brings a pool and one can be had;
         * otherwise (the pool cannot create one) a namespace of the run's own, as without. */
        if (!pol->network && pol->netns_pool &&
            sandbox_netns_acquire(pol->netns_pool, &rs.ns_user_fd, &rs.ns_net_fd) == 0) {
            rs.pool = pol->netns_pool;
            plan.init_stack_len = CMD_STACK_BYTES;
            if (!(plan.init_stack = rs.init_stack = malloc(plan.init_stack_len))) {
                rc = sandbox_err(SANDBOX_ENOMEM, "sandbox: out of memory");
                goto done;
            }
            plan.ns_user_fd = rs.ns_user_fd;
            plan.ns_net_fd = rs.ns_net_fd;
            plan.unshare_flags = plan.clone_flags & ~(unsigned long)CLONE_NEWNET;
            plan.clone_flags = 0;
        }
        if ((rc = sandbox_mounts_plan(&plan, &rs.strings, pol, ws, home, &rs.ph))) goto done;
        if (pol->fs_mode == SANDBOX_FS_WORKSPACE_WRITE) plan.ll_write[plan.n_ll_write++] = ws;
        plan.ll_write[plan.n_ll_write++] = "/tmp";
        plan.ll_write[plan.n_ll_write++] = home;
        plan.ll_write[plan.n_ll_write++] = "/dev/shm";
        plan.ll_dev = "/dev";
    }

    size_t cap = pol->output_cap ? pol->output_cap : DEFAULT_OUTPUT_CAP;
    if (cap < 64) cap = 64;
    uint64_t limit = pol->output_limit ? pol->output_limit : (uint64_t)cap * 64;
    for (int i = 0; i < 4; i++)
        if (pipe2(rs.pipes[i], O_CLOEXEC) != 0) {
            rc = sandbox_err(SANDBOX_ESPAWN, "sandbox: pipe: %s", strerror(errno));
            goto done;
        }
    rs.devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (rs.devnull < 0) {
        rc = sandbox_err(SANDBOX_ESPAWN, "sandbox: /dev/null: %s", strerror(errno));
        goto done;
    }
    capture_init(&rs.cap[0], rs.pipes[0][0], cap);
    capture_init(&rs.cap[1], rs.pipes[1][0], cap);
    plan.fd_stdin = rs.devnull;
    plan.fd_stdout = rs.pipes[0][1];
    plan.fd_stderr = rs.pipes[1][1];
    plan.fd_status = rs.pipes[2][1];
    plan.fd_alive = rs.pipes[3][0];

    /* Exit signal 0: a caller that ignores SIGCHLD or reaps with waitpid(-1) cannot steal it. */
    int pidfd = -1;
    pid_t pid = (pid_t)syscall(SYS_clone, (unsigned long)(plan.clone_flags | CLONE_PIDFD), NULL,
                               &pidfd, NULL, 0);
    if (pid == 0) {
        if (plan.ns_user_fd >= 0) sandbox_child_joined(&plan);
        if (isolated) sandbox_child_init(&plan);
        sandbox_child_plain(&plan);
    }
    if (pid < 0) {
        int e = errno;
        if (isolated && (e == EPERM || e == EINVAL || e == ENOSPC || e == EUSERS)) {
            sandbox_caps caps;
            sandbox_caps_probe(&caps);
            rc = sandbox_err(SANDBOX_EUNAVAILABLE, "sandbox: cannot create the namespaces "
                             "(clone: %s): %s; refusing to run unsandboxed: %s", strerror(e),
                             caps.detail[0] ? caps.detail : "no detail", unavailable_hint());
        } else {
            rc = sandbox_err(SANDBOX_ESPAWN, "sandbox: clone: %s", strerror(e));
        }
        goto done;
    }
    rs.pidfd = pidfd;
    close_fd(&rs.pipes[0][1]);
    close_fd(&rs.pipes[1][1]);
    close_fd(&rs.pipes[2][1]);
    close_fd(&rs.pipes[3][0]);
    close_fd(&rs.devnull);

    sandbox_record rec, got_result = {0}, got_error = {0};
    bool have_result = false, have_error = false;
    if (rs.pool) {
        /* The first child only joins the pooled namespaces, starts init as our child and
         * reports its pid: from then on init is the run's process, as without a pool. */
        while (wait4(pid, NULL, __WALL, NULL) < 0 && errno == EINTR) {
        }
        close_fd(&rs.pidfd);
        pid_t init = 0;
        struct pollfd sp = {rs.pipes[2][0], POLLIN, 0};
        /* what it wrote is there (and perhaps already init's records) */
        while (poll(&sp, 1, 0) == 1 && (sp.revents & POLLIN) &&
               read(rs.pipes[2][0], &rec, sizeof rec) == (ssize_t)sizeof rec) {
            if (rec.kind == SANDBOX_REC_INIT) init = rec.wait_status;
            else if (rec.kind == SANDBOX_REC_RESULT) got_result = rec, have_result = true;
            else if (!have_error) got_error = rec, have_error = true;
        }
        if (init <= 0) { /* it failed before: its record says why */
            rc = have_error ? setup_error(&got_error)
                            : sandbox_err(SANDBOX_ESPAWN, "sandbox: joining the pooled "
                                                          "namespaces failed");
            goto done;
        }
        pid = init;
        rs.pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
        if (rs.pidfd < 0) { /* (init is our unreaped child: the pid is still its own) */
            rc = sandbox_err(SANDBOX_ESPAWN, "sandbox: pidfd_open: %s", strerror(errno));
            kill(pid, SIGKILL);
            while (wait4(pid, NULL, __WALL, NULL) < 0 && errno == EINTR) {
            }
            goto done;
        }
    }

    bool open_[2] = {true, true}, exited = false, killed = false;
    double deadline = pol->timeout_s > 0 ? t0 + pol->timeout_s : 0, exited_at = 0;
    char buf[65536];
    while (open_[0] || open_[1] || !exited) {
        double t = now_s();
        int wait_ms = -1;
        if (deadline && !killed) wait_ms = t >= deadline ? 0 : (int)((deadline - t) * 1000) + 1;
        if (pol->cancel && !killed && (wait_ms < 0 || wait_ms > 50)) wait_ms = 50;
        if (exited) {
            /* Everything in the namespace is gone; the pipes are at EOF or about to be.
             * (Unsandboxed, a daemonised grandchild may hold them: stop waiting.) */
            if (!exited_at) exited_at = t;
            double left = exited_at + (isolated ? 5.0 : 0.2) - t;
            if (left <= 0) break;
            wait_ms = (int)(left * 1000) + 1;
        }
        struct pollfd pf[3] = {{rs.cap[0].fd, POLLIN, 0}, {rs.cap[1].fd, POLLIN, 0},
                               {rs.pidfd, POLLIN, 0}};
        if (!open_[0]) pf[0].fd = -1;
        if (!open_[1]) pf[1].fd = -1;
        if (exited) pf[2].fd = -1;
        int n = poll(pf, 3, wait_ms);
        if (n < 0 && errno != EINTR) {
            kill_tree(&rs, pid, isolated);
            killed = true;
            break;
        }
        for (int i = 0; n > 0 && i < 2; i++) {
            if (!pf[i].revents) continue;
            ssize_t r = read(rs.cap[i].fd, buf, sizeof buf);
            if (r > 0) {
                capture_add(&rs.cap[i], buf, (size_t)r);
                if (rs.cap[i].total > limit && !killed) {
                    kill_tree(&rs, pid, isolated);
                    killed = true;
                    out->stopped = SANDBOX_STOP_OUTPUT_CAP;
                }
            } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
                open_[i] = false;
            }
        }
        if (n > 0 && pf[2].revents) exited = true;
        if (!killed && deadline && now_s() >= deadline) {
            kill_tree(&rs, pid, isolated);
            killed = true;
            out->stopped = SANDBOX_STOP_TIMEOUT;
        }
        if (!killed && pol->cancel && *pol->cancel) {
            kill_tree(&rs, pid, isolated);
            killed = true;
            out->stopped = SANDBOX_STOP_CANCELED;
        }
    }
    int wst = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    while (wait4(pid, &wst, __WALL, &ru) < 0 && errno == EINTR) {
    }
    out->wall_s = now_s() - t0;
    out->user_s = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6;
    out->sys_s = (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
    out->peak_rss_bytes = (uint64_t)ru.ru_maxrss * 1024;
    out->isolated = isolated;
    out->netns_pooled = rs.pool != NULL;
    close_fd(&rs.pipes[3][1]);

    while (read(rs.pipes[2][0], &rec, sizeof rec) == (ssize_t)sizeof rec) {
        if (rec.kind == SANDBOX_REC_RESULT) got_result = rec, have_result = true;
        else if (!have_error) got_error = rec, have_error = true;
    }
    if (have_error) { /* set-up failed, in init or in the command before its execve */
        rc = setup_error(&got_error);
        goto done;
    }
    int cst = isolated ? got_result.wait_status : wst;
    if (isolated && !have_result) {
        /* init was killed before the command ended: by us (stop reason set) or by someone. */
        out->signal = SIGKILL;
        out->exit_code = -1;
        if (out->stopped == SANDBOX_STOP_NONE) out->stopped = SANDBOX_STOP_SIGNAL;
    } else if (WIFEXITED(cst)) {
        out->exit_code = WEXITSTATUS(cst);
    } else if (WIFSIGNALED(cst)) {
        out->signal = WTERMSIG(cst);
        out->exit_code = -1;
    }
    if (isolated && have_result) out->landlock_abi = got_result.landlock_abi;
    /* init reported and exited on its own: its exit waited for every process of the PID
     * namespace, so nothing of this run is left in the network namespace. Otherwise (killed,
     * set-up failed) some process may still be dying: the namespace is not reused. */
    rs.ns_reusable = have_result && !killed;
    if (out->stopped == SANDBOX_STOP_NONE) {
        bool failed = out->signal || out->exit_code != 0;
        if (out->signal == SIGXCPU ||
            (out->signal == SIGKILL && pol->cpu_s > 0 && out->user_s + out->sys_s >= pol->cpu_s))
            out->stopped = SANDBOX_STOP_CPU;
        else if (out->signal == SIGXFSZ)
            out->stopped = SANDBOX_STOP_FILE_SIZE;
        else if (failed && pol->memory_bytes && out->peak_rss_bytes >= pol->memory_bytes / 2)
            out->stopped = SANDBOX_STOP_MEMORY;
        else if (out->signal)
            out->stopped = SANDBOX_STOP_SIGNAL;
    }
    if (capture_finish(&rs.cap[0], &out->out) || capture_finish(&rs.cap[1], &out->err)) {
        sandbox_result_deinit(out);
        rc = sandbox_err(SANDBOX_ENOMEM, "sandbox: out of memory for the output");
    }
done:
    run_state_free(&rs);
    free(plan.ops);
    if (rc) {
        free(out->out.data);
        free(out->err.data);
        memset(out, 0, sizeof *out);
    }
    return rc;
}

void sandbox_result_deinit(sandbox_result *r) {
    if (!r) return;
    free(r->out.data);
    free(r->err.data);
    r->out.data = r->err.data = NULL;
    r->out.len = r->err.len = 0;
}

const char *sandbox_stop_reason_name(sandbox_stop_reason r) {
    switch (r) {
    case SANDBOX_STOP_NONE: return "none";
    case SANDBOX_STOP_TIMEOUT: return "timeout";
    case SANDBOX_STOP_MEMORY: return "memory";
    case SANDBOX_STOP_OUTPUT_CAP: return "output-cap";
    case SANDBOX_STOP_CPU: return "cpu";
    case SANDBOX_STOP_FILE_SIZE: return "file-size";
    case SANDBOX_STOP_SIGNAL: return "signal";
    case SANDBOX_STOP_CANCELED: return "canceled";
    }
    return "unknown";
}
