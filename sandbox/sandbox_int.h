/* Private to sandbox/. */
#ifndef SPARK_SANDBOX_INT_H
#define SPARK_SANDBOX_INT_H
#include "sandbox.h"

#include <linux/filter.h>
#include <sys/types.h>

/* Record the calling thread's last error and return `code`. */
int sandbox_err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---------------------------------------------------------------------------------------------
 * The plan: everything the child processes need, prepared in the caller's process before the
 * clone, so that the children only make system calls (no malloc, no stdio, no locks: the caller
 * may be multi-threaded and the children are raw clones).
 * ------------------------------------------------------------------------------------------- */
typedef enum {
    SANDBOX_OP_BIND_RO,   /* bind src on dst (created), recursive, then read-only */
    SANDBOX_OP_BIND_RW,   /* bind src on dst (created), recursive, nosuid+nodev */
    SANDBOX_OP_PIN,       /* bind dst on itself: a mount point cannot be renamed or removed */
    SANDBOX_OP_MASK,      /* bind /dev/null on the existing file dst, read-only */
    SANDBOX_OP_TMPFS,     /* tmpfs on dst (created) with options `data` */
    SANDBOX_OP_SYMLINK,   /* symlink dst -> src */
    SANDBOX_OP_DEVNODE,   /* bind the host's device node src on a new file dst */
    SANDBOX_OP_PROC,      /* a new procfs on dst */
    SANDBOX_OP_REMOUNT_RO,/* make the mount at dst read-only (not recursive) */
} sandbox_op_kind;

typedef struct {
    sandbox_op_kind kind;
    char *src;            /* host path (BIND_*, DEVNODE), link target (SYMLINK) */
    char *dst;            /* path below the new root's staging directory */
    const char *data;     /* tmpfs options */
    bool host_src;        /* src is a host path below the staging directory: opened (O_PATH)
                             before the root tmpfs hides it, then mounted through src_fd_path
                             ("/proc/self/fd/N"); other host paths stay visible by name */
    signed char src_dir;  /* BIND_*: 1 src is a directory, 0 it is not, -1 unknown (stat) */
    int src_fd;
    char src_fd_path[32];
} sandbox_op;

/* Kinds of records written to the status pipe by the children. */
enum { SANDBOX_REC_RESULT = 1, SANDBOX_REC_SETUP = 2, SANDBOX_REC_UNAVAILABLE = 3,
       SANDBOX_REC_INIT = 4 /* pooled: init started as the caller's child, pid in wait_status */ };

typedef struct {
    int kind;
    int wait_status;      /* RESULT: the command's wait status */
    int err;              /* SETUP/UNAVAILABLE: errno */
    int landlock_abi;     /* RESULT: landlock ABI applied to the command (0 = none) */
    char what[232];       /* SETUP/UNAVAILABLE: the step that failed, NUL-terminated */
} sandbox_record;

typedef struct {
    /* file descriptors in the caller, remapped to 0..3 in the children */
    int fd_stdin, fd_stdout, fd_stderr, fd_status, fd_alive;
    bool isolated;
    /* namespaces and mounts */
    unsigned long clone_flags;
    /* A pooled network namespace (netpool.c), -1 when none: the first child joins its user
     * namespace and it, unshares unshare_flags, clones init into the new PID namespace as the
     * caller's child (CLONE_PARENT; on init_stack, sharing the first child's memory, CLONE_VM),
     * reports init's pid (SANDBOX_REC_INIT) and exits. */
    int ns_user_fd, ns_net_fd;
    unsigned long unshare_flags;
    char *init_stack;
    size_t init_stack_len;
    char uid_map[64], gid_map[64];
    char *stage;          /* host directory the new root is assembled in ("/tmp") */
    sandbox_op *ops;
    size_t n_ops;
    bool network;
    char pid_max[24];     /* value for /proc/sys/kernel/pid_max, "" = leave */
    /* the command */
    char *cwd;            /* inside the new root */
    char *const *argv;
    char *const *envp;
    const char *path;     /* PATH used to find argv[0] */
    char *exec_buf;       /* scratch of exec_buf_len bytes for PATH search */
    size_t exec_buf_len;
    char *cmd_stack;      /* the command's stack until its execve (CLONE_VM | CLONE_VFORK) */
    size_t cmd_stack_len;
    int cap_last;         /* highest capability the kernel knows (bounding set dropped to it) */
    struct rlimit_set {
        int resource;
        unsigned long long soft, hard;
    } rlimits[8];
    int n_rlimits;
    /* landlock: paths inside the new root */
    int landlock_abi;     /* what the kernel offers; 0 = skip */
    const char *ll_write[8];
    int n_ll_write;
    const char *ll_dev;
    /* seccomp */
    struct sock_fprog filters[2]; /* attached from filters[n_filters - 1] to filters[0] */
    int n_filters;
} sandbox_plan;

/* spawn.c: the children (never return). */
_Noreturn void sandbox_child_init(sandbox_plan *p);
_Noreturn void sandbox_child_plain(sandbox_plan *p);
_Noreturn void sandbox_child_joined(sandbox_plan *p);

/* netpool.c: take a (user, network) namespace pair from the pool, creating one when none is
 * free (0 or a negative code); give it back after a run whose processes are all gone
 * (reusable false: close it instead). */
int sandbox_netns_acquire(sandbox_netns_pool *pool, int *user_fd, int *net_fd);
void sandbox_netns_release(sandbox_netns_pool *pool, int user_fd, int net_fd, bool reusable);
/* mounts.c: bring up "lo" in the current network namespace (0 or -errno). */
int sandbox_loopback_up(void);

/* mounts.c: build the mount operations of `plan` for the policy (in the caller). The strings
 * live in `arena` (freed by the caller with sandbox_plan_free_strings). */
typedef struct {
    char **items;
    size_t n, cap;
} sandbox_strings;
char *sandbox_strdup(sandbox_strings *s, const char *str);
char *sandbox_strcat3(sandbox_strings *s, const char *a, const char *b, const char *c);
void sandbox_strings_free(sandbox_strings *s);

/* Placeholders created on the host for protected paths that did not exist. */
typedef struct {
    char *paths[16];
    int fds[16];          /* each holds a shared flock while the run lasts */
    int n;
} sandbox_placeholders;

int sandbox_mounts_plan(sandbox_plan *p, sandbox_strings *arena, const sandbox_policy *policy,
                        const char *workspace, const char *home, sandbox_placeholders *ph);
void sandbox_placeholders_remove(sandbox_placeholders *ph);
/* In the init child: carry out the plan and pivot into the new root. Returns 0 or -errno with
 * *what set to the failing step (a string from the plan or a literal). */
int sandbox_mounts_apply(sandbox_plan *p, const char **what);

/* seccomp.c: the filter (built once per process, read-only afterwards): *n = 1, one program
 * (the libseccomp allow-list merged with the hand-written checks), or 2 when the merge was not
 * possible (out[1] to be attached before out[0]). */
int sandbox_seccomp_filters(struct sock_fprog out[2], int *n);
/* landlock.c */
int sandbox_landlock_abi(void);
int sandbox_landlock_apply(const sandbox_plan *p, const char **what); /* in the child */
/* env.c */
bool sandbox_env_is_secret(const char *entry);

/* Async-signal-safe string helpers for the children. */
size_t sandbox_cstr_len(const char *s);
void sandbox_cstr_copy(char *dst, size_t cap, const char *a, const char *b, const char *c);

#endif
