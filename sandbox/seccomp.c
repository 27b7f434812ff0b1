/* The seccomp-bpf policy installed on the command: two filters, merged into one program.
 *
 * Filter A (libseccomp): default-deny. An allow-list of the system calls that build tools,
 * compilers, interpreters and test runners use; everything else fails with ENOSYS (programs
 * treat that as "not supported here" and fall back), and the calls an escape needs fail with
 * EPERM so that a test can tell a refusal from a missing feature. A foreign architecture
 * (i386 through int 0x80) kills the process.
 *
 * Filter B (hand-written BPF): what libseccomp cannot say next to an unconditional allow of the
 * same call: ioctl(TIOCSTI/TIOCLINUX) with the request compared on its low 32 bits (the kernel
 * ignores the high ones), clone() with namespace flags, personality() other than a query,
 * clone3() (its flags sit in memory a filter cannot read: ENOSYS makes libc fall back to
 * clone), and x32 system calls, which arrive with the native AUDIT_ARCH and bit 30 set.
 * B only ever narrows A. The two are merged into one program (merge(): one attach, one JIT
 * compilation, one action cache instead of two) that decides exactly as the kernel would with
 * both filters stacked; when the merge is impossible, both are attached.
 *
 * Built once per process (pthread_once), read-only afterwards. */
#include "sandbox_int.h"

#include <errno.h>
#include <linux/audit.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <sched.h>
#include <seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static const char *const allowed[] = {
    /* files and directories */
    "read", "write", "open", "openat", "openat2", "close", "close_range", "creat", "lseek",
    "_llseek", "pread64", "pwrite64", "readv", "writev", "preadv", "pwritev", "preadv2",
    "pwritev2", "stat", "fstat", "lstat", "newfstatat", "fstatat64", "statx", "statfs",
    "fstatfs", "access", "faccessat", "faccessat2", "getdents", "getdents64", "getcwd", "chdir",
    "fchdir", "rename", "renameat", "renameat2", "mkdir", "mkdirat", "rmdir", "link", "linkat",
    "unlink", "unlinkat", "symlink", "symlinkat", "readlink", "readlinkat", "chmod", "fchmod",
    "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat", "umask", "utime", "utimes",
    "utimensat", "futimesat", "mknod", "mknodat", "truncate", "ftruncate", "fallocate",
    "fadvise64", "readahead", "fsync", "fdatasync", "sync", "syncfs", "sync_file_range",
    "flock", "fcntl", "dup", "dup2", "dup3", "pipe", "pipe2", "sendfile", "splice", "tee",
    "vmsplice", "copy_file_range", "getxattr", "lgetxattr", "fgetxattr", "listxattr",
    "llistxattr", "flistxattr", "setxattr", "lsetxattr", "fsetxattr", "removexattr",
    "lremovexattr", "fremovexattr", "inotify_init", "inotify_init1", "inotify_add_watch",
    "inotify_rm_watch", "ioctl", "memfd_create", "cachestat", "statmount", "listmount",
    /* memory */
    "brk", "mmap", "munmap", "mremap", "mprotect", "msync", "mincore", "madvise", "mlock",
    "mlock2", "munlock", "mlockall", "munlockall", "membarrier", "get_mempolicy",
    "set_mempolicy", "mbind", "pkey_alloc", "pkey_free", "pkey_mprotect", "map_shadow_stack",
    /* processes and threads */
    "clone", "clone3", "fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4",
    "waitid", "getpid", "gettid", "getppid", "getpgid", "setpgid", "getpgrp", "getsid",
    "setsid", "set_tid_address", "set_robust_list", "get_robust_list", "rseq", "futex",
    "futex_waitv", "arch_prctl", "prctl", "personality", "sched_yield", "sched_getaffinity",
    "sched_setaffinity", "sched_getparam", "sched_setparam", "sched_getscheduler",
    "sched_setscheduler", "sched_get_priority_max", "sched_get_priority_min",
    "sched_rr_get_interval", "sched_getattr", "sched_setattr", "getpriority", "setpriority",
    "ioprio_get", "ioprio_set", "getcpu", "getrlimit", "setrlimit", "prlimit64", "getrusage",
    "times", "uname", "sysinfo", "getrandom", "capget", "capset", "getuid", "getgid",
    "geteuid", "getegid", "getresuid", "getresgid", "getgroups", "setuid", "setgid",
    "setreuid", "setregid", "setresuid", "setresgid", "setgroups", "setfsuid", "setfsgid",
    "pidfd_open", "pidfd_send_signal", "seccomp", "landlock_create_ruleset",
    "landlock_add_rule", "landlock_restrict_self", "restart_syscall",
    /* signals and time */
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigtimedwait",
    "rt_sigqueueinfo", "rt_tgsigqueueinfo", "rt_sigsuspend", "sigaltstack", "kill", "tkill",
    "tgkill", "pause", "nanosleep", "clock_nanosleep", "clock_gettime", "clock_getres",
    "gettimeofday", "time", "getitimer", "setitimer", "alarm", "timer_create", "timer_settime",
    "timer_gettime", "timer_getoverrun", "timer_delete", "timerfd_create", "timerfd_settime",
    "timerfd_gettime", "signalfd", "signalfd4", "eventfd", "eventfd2",
    /* waiting */
    "poll", "ppoll", "select", "pselect6", "epoll_create", "epoll_create1", "epoll_ctl",
    "epoll_wait", "epoll_pwait", "epoll_pwait2", "io_setup", "io_destroy", "io_getevents",
    "io_pgetevents", "io_submit", "io_cancel",
    /* sockets (the network namespace decides what they reach) */
    "socket", "socketpair", "connect", "accept", "accept4", "bind", "listen", "shutdown",
    "getsockname", "getpeername", "setsockopt", "getsockopt", "sendto", "recvfrom", "sendmsg",
    "recvmsg", "sendmmsg", "recvmmsg",
    /* System V and POSIX IPC (private to the IPC namespace) */
    "shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl", "msgget",
    "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive",
    "mq_notify", "mq_getsetattr",
};

/* Refused with EPERM: what escapes and attacks on the host are made of. */
static const char *const refused[] = {
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "process_mrelease",
    "pidfd_getfd", "kcmp", "mount", "umount", "umount2", "pivot_root", "chroot", "move_mount",
    "open_tree", "open_tree_attr", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "unshare", "setns", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "bpf", "perf_event_open", "add_key", "request_key", "keyctl",
    "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "reboot", "swapon",
    "swapoff", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "acct", "quotactl",
    "quotactl_fd", "syslog", "vhangup", "iopl", "ioperm", "modify_ldt", "uselib", "sethostname",
    "setdomainname", "name_to_handle_at", "open_by_handle_at", "fanotify_init",
    "lookup_dcookie", "nfsservctl", "move_pages", "migrate_pages", "memfd_secret",
};

typedef struct {
    struct sock_fprog progs[2]; /* [0] attached last */
    int n;                      /* 1: one merged program; 2: progs[1] attached first */
    int rc;
    char err[256];
} filters_t;

static filters_t g_filters; /* written once under pthread_once, read-only afterwards */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static int export_libseccomp(scmp_filter_ctx ctx, struct sock_fprog *out) {
    int fd = memfd_create("spark-seccomp", MFD_CLOEXEC);
    if (fd < 0) return -errno;
    int rc = seccomp_export_bpf(ctx, fd);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    off_t size = lseek(fd, 0, SEEK_END);
    if (size <= 0 || size % (off_t)sizeof(struct sock_filter) != 0 ||
        size / (off_t)sizeof(struct sock_filter) > BPF_MAXINSNS) {
        close(fd);
        return -EINVAL;
    }
    struct sock_filter *f = malloc((size_t)size);
    if (!f) {
        close(fd);
        return -ENOMEM;
    }
    ssize_t got = pread(fd, f, (size_t)size, 0);
    close(fd);
    if (got != size) {
        free(f);
        return -EIO;
    }
    out->filter = f;
    out->len = (unsigned short)(size / (off_t)sizeof(struct sock_filter));
    return 0;
}

static int build_a(struct sock_fprog *out, char *err, size_t errlen) {
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ERRNO(ENOSYS));
    if (!ctx) {
        snprintf(err, errlen, "libseccomp: seccomp_init failed");
        return -ENOMEM;
    }
    int rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
    if (rc == 0) rc = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0); /* we set it ourselves */
    /* A binary tree instead of a linear list: the kernel emulates the filter for every system
     * call number when it is attached (its action cache), which made attaching cost 0.7 ms. */
    if (rc == 0) rc = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2);
    for (size_t i = 0; rc == 0 && i < sizeof allowed / sizeof allowed[0]; i++) {
        int nr = seccomp_syscall_resolve_name(allowed[i]);
        if (nr == __NR_SCMP_ERROR || nr < 0) continue; /* not on this architecture */
        rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0);
        if (rc) snprintf(err, errlen, "libseccomp: cannot allow %s: %s", allowed[i],
                         strerror(-rc));
    }
    for (size_t i = 0; rc == 0 && i < sizeof refused / sizeof refused[0]; i++) {
        int nr = seccomp_syscall_resolve_name(refused[i]);
        if (nr == __NR_SCMP_ERROR || nr < 0) continue;
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
        if (rc) snprintf(err, errlen, "libseccomp: cannot refuse %s: %s", refused[i],
                         strerror(-rc));
    }
    if (rc == 0) {
        rc = export_libseccomp(ctx, out);
        if (rc) snprintf(err, errlen, "libseccomp: cannot export the filter: %s", strerror(-rc));
    }
    seccomp_release(ctx);
    return rc;
}

#if defined(__x86_64__)
#define SANDBOX_AUDIT_ARCH AUDIT_ARCH_X86_64
#define SANDBOX_X32_BIT 0x40000000u
#elif defined(__aarch64__)
#define SANDBOX_AUDIT_ARCH AUDIT_ARCH_AARCH64
#else
#error "sandbox/seccomp.c: add this architecture's AUDIT_ARCH"
#endif

#ifndef TIOCLINUX
#define TIOCLINUX 0x541C
#endif

#define LD_ABS(off) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (off))
#define RET(v) BPF_STMT(BPF_RET | BPF_K, (v))
#define JEQ(v, t, f) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (v), (t), (f))
#define JSET(v, t, f) BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, (v), (t), (f))
#define JGE(v, t, f) BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, (v), (t), (f))
/* Low 32 bits of argument i (little-endian: the first word). */
#define ARG_LO(i) (offsetof(struct seccomp_data, args) + 8 * (i))

#define NS_CLONE_FLAGS (CLONE_NEWNS | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | \
                        CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP | 0x00000080 /* TIME */)

/* What libseccomp cannot express next to an unconditional allow, in two parts that wrap the
 * libseccomp program (see merge()): first the foreign-ABI kills, last the argument checks. */
static const struct sock_filter filter_prefix[] = {
    LD_ABS(offsetof(struct seccomp_data, arch)),
    JEQ(SANDBOX_AUDIT_ARCH, 1, 0),
    RET(SECCOMP_RET_KILL_PROCESS),
#ifdef SANDBOX_X32_BIT
    LD_ABS(offsetof(struct seccomp_data, nr)),
    JGE(SANDBOX_X32_BIT, 0, 1),
    RET(SECCOMP_RET_KILL_PROCESS),
#endif
};

static const struct sock_filter filter_rest[] = {
    LD_ABS(offsetof(struct seccomp_data, nr)),
    JEQ(__NR_ioctl, 0, 5),
    LD_ABS(ARG_LO(1)),
    JEQ(TIOCSTI, 2, 0),
    JEQ(TIOCLINUX, 1, 0),
    RET(SECCOMP_RET_ALLOW),
    RET(SECCOMP_RET_ERRNO | EPERM),
    JEQ(__NR_clone, 0, 4),
    LD_ABS(ARG_LO(0)),
    JSET(NS_CLONE_FLAGS, 1, 0),
    RET(SECCOMP_RET_ALLOW),
    RET(SECCOMP_RET_ERRNO | EPERM),
#ifdef __NR_clone3
    JEQ(__NR_clone3, 0, 1),
    RET(SECCOMP_RET_ERRNO | ENOSYS),
#endif
    JEQ(__NR_personality, 0, 5),
    LD_ABS(ARG_LO(0)),
    JEQ(0xffffffffu, 2, 0), /* query */
    JEQ(0, 1, 0),           /* PER_LINUX */
    RET(SECCOMP_RET_ERRNO | EPERM),
    RET(SECCOMP_RET_ALLOW),
    RET(SECCOMP_RET_ALLOW),
};

#define N_PREFIX (sizeof filter_prefix / sizeof filter_prefix[0])
#define N_REST (sizeof filter_rest / sizeof filter_rest[0])

/* One program instead of two: attaching a filter costs a JIT compilation and the emulation of
 * its action cache, per filter. prefix, then the libseccomp program with each "return allow"
 * turned into a jump to the rest, then the rest. The result is what the kernel would decide
 * with the two filters stacked (the libseccomp one attached last): the foreign-ABI kills first
 * (the highest precedence); then the libseccomp program's own result unless it allows (on a
 * tie of two errno results the last attached filter's errno won, and that was the libseccomp
 * program); else the argument checks. Fails (and the two filters are used) when the program
 * returns anything but constants. */
static int merge(const struct sock_fprog *a, struct sock_fprog *out) {
    size_t na = a->len, n = N_PREFIX + na + N_REST;
    if (n > BPF_MAXINSNS) return -E2BIG;
    struct sock_filter *f = malloc(n * sizeof *f);
    if (!f) return -ENOMEM;
    memcpy(f, filter_prefix, sizeof filter_prefix);
    for (size_t i = 0; i < na; i++) {
        struct sock_filter ins = a->filter[i];
        if (BPF_CLASS(ins.code) == BPF_RET) {
            if (BPF_RVAL(ins.code) != BPF_K) {
                free(f);
                return -EINVAL;
            }
            if (ins.k == SECCOMP_RET_ALLOW) { /* to the first instruction after the program */
                struct sock_filter ja = BPF_JUMP(BPF_JMP | BPF_JA, (uint32_t)(na - 1 - i), 0, 0);
                ins = ja;
            }
        }
        f[N_PREFIX + i] = ins;
    }
    memcpy(f + N_PREFIX + na, filter_rest, sizeof filter_rest);
    out->filter = f;
    out->len = (unsigned short)n;
    return 0;
}

static void build_once(void) {
    filters_t *f = &g_filters;
    f->rc = build_a(&f->progs[0], f->err, sizeof f->err);
    if (f->rc) return;
    struct sock_fprog merged;
    if (merge(&f->progs[0], &merged) == 0) {
        free(f->progs[0].filter);
        f->progs[0] = merged;
        f->n = 1;
        return;
    }
    /* the two filters stacked: the hand-written one (prefix + rest) attached first */
    static struct sock_filter both[N_PREFIX + N_REST];
    memcpy(both, filter_prefix, sizeof filter_prefix);
    memcpy(both + N_PREFIX, filter_rest, sizeof filter_rest);
    f->progs[1].filter = both;
    f->progs[1].len = (unsigned short)(N_PREFIX + N_REST);
    f->n = 2;
}

int sandbox_seccomp_filters(struct sock_fprog out[2], int *n) {
    pthread_once(&g_once, build_once);
    if (g_filters.rc != 0) return sandbox_err(SANDBOX_EINTERNAL, "%s", g_filters.err);
    out[0] = g_filters.progs[0];
    out[1] = g_filters.progs[1];
    *n = g_filters.n;
    return 0;
}
