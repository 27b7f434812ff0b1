/* Helpers shared by the sandbox tests (tests/sandbox/). */
#ifndef SPARK_TESTS_SBX_UTIL_H
#define SPARK_TESTS_SBX_UTIL_H

#include <stdbool.h>
#include <stddef.h>

#include "sandbox.h"

extern int sbx_failures;

/* Print "ok   what" or "FAIL what" and count failures. Returns cond. */
bool sbx_check(bool cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Start of a test: line-buffered stdout, the path of this executable and its directory.
 * Returns 0, or 77 (with the reason printed) when this machine cannot sandbox. */
int sbx_start(char *self, size_t self_cap, char *dir, size_t dir_cap);
/* When root (and not already the re-run): run this executable again as nobody through
 * setpriv, so the unprivileged path (unprivileged user namespaces) is covered, and check it. */
void sbx_rerun_as_nobody(const char *self);
/* A fresh directory under $TMPDIR or /tmp, mode 0755 (out gets the path). */
void sbx_mkdtemp(char *out, size_t cap);
void sbx_write_file(const char *path, const char *content);
/* Whole file into buf (NUL-terminated); -1 when it cannot be read. */
long sbx_read_file(const char *path, char *buf, size_t cap);
void sbx_rm_rf(const char *path);
/* The directory of the running executable. */
void sbx_self_dir(char *out, size_t cap);
/* Processes on the host whose command line contains token. */
int sbx_count_procs_with(const char *token);
/* The same, and SIGKILL them when kill_them: a test cleans up after an escape it detected. */
int sbx_procs_with(const char *token, bool kill_them);
/* A minimal environment for commands under test: PATH, HOME=home, LANG=C, sanitizer options
 * that work under seccomp, plus extra (NULL-terminated, may be NULL). Static storage. */
const char *const *sbx_env(const char *home, const char *const *extra);
/* In a forked child: refuse user namespaces from now on with a seccomp filter (unshare and
 * clone with CLONE_NEWUSER fail with EPERM, clone3 with ENOSYS), as a container runtime or a
 * sysctl would. Returns 0, or -1 when the filter cannot be loaded. */
int sbx_deny_user_namespaces(void);
/* Print the result briefly (for failing checks). */
void sbx_dump(const char *what, const sandbox_result *r);

#endif
