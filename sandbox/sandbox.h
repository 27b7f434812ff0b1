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

/* ---------------------------------------------------------------------------------------------
 * Policies and running
 * ------------------------------------------------------------------------------------------- */
typedef enum {
    SANDBOX_FS_READ_ONLY = 0, /* workspace mounted read-only */
    SANDBOX_FS_WORKSPACE_WRITE = 1, /* workspace read-write, protected paths read-only */
} sandbox_fs_mode;

#define SANDBOX_POLICY_VERSION 1

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
    int max_processes;         /* inside the sandbox; 0 = default */
    int max_open_files;        /* 0 = default */
    size_t output_cap;         /* bytes kept per stream (head and tail); 0 = default 1 MiB */
    const char *const *extra_ro_paths; /* NULL-terminated: more read-only binds (toolchains) */
    const char *const *protected_paths; /* NULL-terminated: workspace-relative paths kept
                                           read-only even when they do not exist yet */
} sandbox_policy;

#define SANDBOX_POLICY_INIT {SANDBOX_POLICY_VERSION, NULL, SANDBOX_FS_WORKSPACE_WRITE, false, \
                             false, 60.0, 0, 0, 0, 0, 0, 0, NULL, NULL}

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
} sandbox_result;

/* Run argv (argv[0] looked up in PATH of `env`) with environment `env` (NULL-terminated;
 * secrets are filtered out regardless) in directory `cwd` (inside the workspace) under
 * `policy`. Fills *out; the caller frees it with sandbox_result_deinit(). Returns
 * SANDBOX_EUNAVAILABLE, without running anything, when the policy needs isolation the kernel
 * lacks and policy->unsandboxed is false. Thread-safe. */
int sandbox_run(sandbox_result *out, const sandbox_policy *policy, const char *const *argv,
                const char *const *env, const char *cwd);

void sandbox_result_deinit(sandbox_result *r);

const char *sandbox_stop_reason_name(sandbox_stop_reason r);

#ifdef __cplusplus
}
#endif
#endif /* SPARK_SANDBOX_H */
