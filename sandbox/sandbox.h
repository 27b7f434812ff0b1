/*
 * sandbox.h - run a command isolated: namespaces, seccomp-bpf, landlock, rlimits, timeouts,
 * capped output capture. The one choke point through which the project starts any process on
 * behalf of a tool. Depends on libc and libseccomp only; knows nothing of tools or models.
 *
 * Conventions: functions return 0 or a negative SANDBOX_E* code; sandbox_error_last() holds
 * the calling thread's last error message. Nothing here prints or exits.
 */
#ifndef SPARK_SANDBOX_H
#define SPARK_SANDBOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    SANDBOX_OK = 0,
    SANDBOX_EINVAL = -1,      /* bad policy or argv */
    SANDBOX_ENOMEM = -2,
    SANDBOX_EUNAVAILABLE = -3,/* an isolation feature the policy needs is missing: refused */
    SANDBOX_ESPAWN = -4,      /* fork/exec or set-up failed */
    SANDBOX_EINTERNAL = -5,
};

const char *sandbox_error_last(void);

/* ---------------------------------------------------------------------------------------------
 * What this kernel offers (for `spark-agent doctor` and for failing closed).
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    bool user_namespaces;     /* an unprivileged child could unshare(CLONE_NEWUSER) */
    bool mount_namespaces;
    bool pid_namespaces;
    bool net_namespaces;
    bool seccomp_filter;      /* seccomp(SECCOMP_SET_MODE_FILTER) works */
    int landlock_abi;         /* 0 when landlock is absent or disabled */
    char detail[512];         /* what is missing and why, or "" */
} sandbox_caps;

/* Probe by trying each feature in a short-lived child. Never fails; results in *out. */
void sandbox_caps_probe(sandbox_caps *out);

/* Run `true` under the default policy in an empty temporary workspace, exactly as a tool's
 * command would run (twice, with a network namespace pool: the second run reuses the first
 * one's namespace): proves that the whole set-up works on this machine (mounts, /proc,
 * landlock, seccomp), not only that each feature exists. Returns 0, or the negative code of
 * sandbox_run() (or SANDBOX_ESPAWN when `true` failed) with the reason in
 * sandbox_error_last(). *landlock_abi gets the ABI enforced (0 = none), *wall_ms the time the
 * second run took. Either pointer may be NULL. */
int sandbox_self_test(int *landlock_abi, double *wall_ms);

/* ---------------------------------------------------------------------------------------------
 * Policies and running
 * ------------------------------------------------------------------------------------------- */
typedef enum {
    SANDBOX_FS_READ_ONLY = 0, /* workspace mounted read-only */
    SANDBOX_FS_WORKSPACE_WRITE = 1, /* workspace read-write, protected paths read-only */
} sandbox_fs_mode;

#define SANDBOX_POLICY_VERSION 1

/* A pool of network namespaces for runs without network (a context object; see
 * sandbox_netns_pool_new below). */
typedef struct sandbox_netns_pool sandbox_netns_pool;

typedef struct {
    unsigned version;          /* SANDBOX_POLICY_VERSION */
    const char *workspace;     /* absolute path; the only writable tree (per fs_mode) */
    sandbox_fs_mode fs_mode;
    bool network;              /* false: new network namespace with loopback only */
    bool unsandboxed;          /* explicit user choice to run without isolation (warned) */
    double timeout_s;          /* wall clock; 0 = no limit */
    double cpu_s;              /* RLIMIT_CPU; 0 = no limit */
    uint64_t memory_bytes;     /* RLIMIT_AS; 0 = no limit */
    uint64_t file_size_bytes;  /* RLIMIT_FSIZE; 0 = no limit */
    int max_processes;         /* inside the sandbox; 0 = default 512 */
    int max_open_files;        /* 0 = default 4096 */
    size_t output_cap;         /* bytes kept per stream (head and tail); 0 = default 1 MiB */
    const char *const *extra_ro_paths; /* NULL-terminated: more read-only binds (toolchains) */
    const char *const *protected_paths; /* NULL-terminated: workspace-relative paths kept
                                           read-only even when they do not exist yet, in
                                           addition to the built-in ones (see below) */
    uint64_t output_limit;     /* total bytes per stream after which the command is stopped
                                  (SANDBOX_STOP_OUTPUT_CAP); 0 = default 64 x output_cap */
    const volatile int *cancel; /* optional: set non-zero from another thread to stop the
                                   command (SANDBOX_STOP_CANCELED); checked every 50 ms */
    sandbox_netns_pool *netns_pool; /* optional (network false): reuse a loopback-only network
                                       namespace from this pool instead of creating one */
} sandbox_policy;

#define SANDBOX_POLICY_INIT {SANDBOX_POLICY_VERSION, NULL, SANDBOX_FS_WORKSPACE_WRITE, false, \
                             false, 60.0, 0, 0, 0, 0, 0, 0, NULL, NULL, 0, NULL, NULL}

/* What a sandboxed command sees (the contract the escape tests check):
 * - new user, mount, PID, IPC, UTS, cgroup and (unless policy->network) network namespaces;
 *   without network only a loopback interface exists. It runs as the caller's uid/gid, with no
 *   capabilities, no_new_privs, in a new session without a controlling terminal, stdin
 *   /dev/null.
 * - a new root: /usr /bin /sbin /lib* /etc and policy->extra_ro_paths read-only (secret files
 *   of /etc such as shadow and SSH host keys masked), its own /proc, a minimal /dev (null,
 *   zero, full, random, urandom, shm), a private /tmp, an empty $HOME (a tmpfs at the same
 *   path; /tmp/home when $HOME is unusable), the workspace at its own path. Nothing else of
 *   the host file system exists.
 * - protected paths, read-only even in SANDBOX_FS_WORKSPACE_WRITE: `.git/hooks`, `.git/config`
 *   and policy->protected_paths; their directories cannot be renamed or removed. A protected
 *   path that does not exist is blocked by a placeholder: an empty file of mode 0400 created
 *   on the host, seen as /dev/null inside, removed by the last run using it (concurrent runs
 *   share it). A non-directory on the way (a worktree's `.git` file) is kept read-only.
 * - environment: `env` minus variables whose name contains KEY, TOKEN, SECRET, PASSW,
 *   CREDENTIAL, PRIVATE or COOKIE (any case) and SSH_AUTH_SOCK, SSH_AGENT_PID, GPG_AGENT_INFO,
 *   KRB5CCNAME; HOME and TMPDIR set; PATH defaulted when missing. Default signal dispositions
 *   and an empty signal mask, whatever the caller's.
 * - seccomp-bpf: an allow-list (unknown system calls fail with ENOSYS) plus explicit EPERM for
 *   ptrace, process_vm_*, the mount family, unshare/setns/namespace clone flags, kexec,
 *   modules, bpf, perf_event_open, keyrings, userfaultfd, io_uring, personality changes,
 *   reboot/swap/clock setting, TIOCSTI/TIOCLINUX; other ABIs (x32, i386) kill the process.
 * - landlock (when the kernel has it): read/execute everywhere, write only in the workspace
 *   (workspace-write), /tmp, $HOME and /dev; signals and abstract UNIX sockets scoped to the
 *   sandbox (landlock ABI >= 6).
 * - rlimits from the policy, no core dumps; a process cap for the whole PID namespace (also for
 *   root, through the namespace's pid_max where the kernel has it, Linux >= 6.14).
 * - the wall-clock timeout, the output limit, cancellation and the death of the caller kill
 *   the whole process tree (the PID namespace's init). */

typedef enum {
    SANDBOX_STOP_NONE = 0,    /* the command ended on its own */
    SANDBOX_STOP_TIMEOUT,
    SANDBOX_STOP_MEMORY,
    SANDBOX_STOP_OUTPUT_CAP,
    SANDBOX_STOP_CPU,
    SANDBOX_STOP_FILE_SIZE,
    SANDBOX_STOP_SIGNAL,      /* killed by a signal it did not ask for (e.g. seccomp SIGSYS) */
    SANDBOX_STOP_CANCELED,
} sandbox_stop_reason;

typedef struct {
    char *data;               /* head and tail of what was written, NUL-terminated; owned */
    size_t len;               /* bytes in data */
    uint64_t total;           /* bytes the process wrote in all */
    bool truncated;           /* total > len: the middle was dropped (marked in data) */
} sandbox_output;

typedef struct {
    int exit_code;            /* valid when signal == 0 */
    int signal;               /* terminating signal, or 0 */
    sandbox_stop_reason stopped;
    double wall_s, user_s, sys_s;
    sandbox_output out, err;
    bool isolated;            /* false: ran unsandboxed (policy->unsandboxed) */
    int landlock_abi;         /* landlock ABI enforced on the command; 0 = not applied */
    uint64_t peak_rss_bytes;  /* largest resident set of any process of the command */
    bool netns_pooled;        /* it ran in a network namespace from policy->netns_pool */
} sandbox_result;

/* Run argv (argv[0] looked up in PATH of `env`) with environment `env` (NULL-terminated;
 * secrets are filtered out regardless) in directory `cwd` (inside the workspace; NULL = the
 * workspace) under `policy`. Fills *out; the caller frees it with sandbox_result_deinit().
 * Returns SANDBOX_EUNAVAILABLE, without running anything, when the policy needs isolation the
 * kernel lacks and policy->unsandboxed is false (the message names what is missing);
 * SANDBOX_ESPAWN when setting the sandbox up failed. A command that cannot be executed is not
 * an error: it exits 127 (not found) or 126 with the reason on its stderr, like a shell.
 * Stop reasons: TIMEOUT, OUTPUT_CAP and CANCELED are certain (the sandbox did it); CPU and
 * FILE_SIZE come from the kernel's rlimit signals; MEMORY is a best guess: the command failed
 * and its peak resident set reached half of policy->memory_bytes (RLIMIT_AS makes allocations
 * fail, it does not kill). With policy->unsandboxed the command runs with the limits and
 * capture but without any isolation (out->isolated false); the caller must warn the user.
 * Thread-safe; uses no signal handlers, does not disturb SIGCHLD handling of the caller. */
int sandbox_run(sandbox_result *out, const sandbox_policy *policy, const char *const *argv,
                const char *const *env, const char *cwd);

void sandbox_result_deinit(sandbox_result *r);

/* ---------------------------------------------------------------------------------------------
 * Network namespace pool: creating (and tearing down) a network namespace is the most expensive
 * step of an isolated run. A pool keeps loopback-only network namespaces, each in a user
 * namespace of its own (P) mapping only the caller's uid/gid, and hands one to a run at a time:
 * the run joins P and the network namespace, then creates its own user, mount, PID, IPC, UTS
 * and cgroup namespaces below P as usual. What a command shares with the commands that used
 * the same namespace before it (never with one running at the same time: a namespace is taken
 * exclusively, the pool creates another when all are in use): the loopback interface and its
 * configuration, which nothing inside can change (no process of a run holds a capability over
 * P, which owns the network namespace), and kernel state that outlives every process of a run,
 * in practice TIME_WAIT entries. Sockets, listeners and abstract UNIX names die with the
 * processes that hold them, and every process of a run dies with its PID namespace.
 * Thread-safe. sandbox_netns_pool_new returns NULL (sandbox_error_last() says why) when out of
 * memory; namespaces are created lazily, and a run whose pool cannot create one falls back to
 * a namespace of its own. */
sandbox_netns_pool *sandbox_netns_pool_new(void);
void sandbox_netns_pool_free(sandbox_netns_pool *pool); /* NULL: no-op; no run may use it */

const char *sandbox_stop_reason_name(sandbox_stop_reason r);

#ifdef __cplusplus
}
#endif
#endif /* SPARK_SANDBOX_H */
