/* Private to tools/. */
#ifndef SPARK_TOOL_INT_H
#define SPARK_TOOL_INT_H
#include "tools.h"

#include <git2.h>
#include <jansson.h>
#include <stdio.h>
#include <sys/types.h>

/* Record the calling thread's last error and return `code`. */
int tool_err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Convert the last libgit2 error to TOOL_EGIT (or TOOL_ENOTFOUND for GIT_ENOTFOUND). */
int tool_err_git(int gitrc, const char *what);

struct tool_ctx {
    tool_options opt;
    char *root;                /* realpath of the root, no trailing slash (except "/") */
    int rootfd;                /* O_DIRECTORY|O_PATH-less read descriptor of the root */
    git_repository *repo;      /* NULL when the root is in no repository */
    char *repo_prefix;         /* root relative to the repository's workdir ("" or "sub/") */
    bool repo_tried;
    bool checkpointed;         /* auto checkpoint done in this context */
    int threads;
    /* Loopback-only network namespaces reused by this context's build/test runs without
     * network (sandbox.h): owned here, freed with the context. */
    struct sandbox_netns_pool *netns_pool;
};

/* A tool's implementation: fill *res (an object created by the caller). */
typedef int (*tool_fn)(tool_ctx *ctx, json_t *args, json_t *res);

/* ---- small JSON helpers (args are schema-checked before a tool runs) ---- */
const char *tool_arg_str(json_t *args, const char *key, const char *dflt);
long long tool_arg_int(json_t *args, const char *key, long long dflt);
bool tool_arg_bool(json_t *args, const char *key, bool dflt);
/* Validate `v` against the subset of JSON Schema the registry uses. 0 or TOOL_EINVAL. */
int tool_schema_validate(json_t *schema, json_t *v, const char *where);

/* ---- paths (paths.c) ---- */
/* Turn a user path into a clean workspace-relative one ("." for the root): absolute paths
 * under the root are made relative, others refused; "." and "" components dropped; ".."
 * folded textually where possible; a ".." that would climb above the root is refused. */
int tool_path_clean(tool_ctx *ctx, const char *in, char **out_rel);
/* open(2) `rel` beneath the root with `flags` (O_NOFOLLOW on the last component when
 * nofollow). Returns the fd or a negative TOOL_E*. */
int tool_path_open(tool_ctx *ctx, const char *rel, int flags, mode_t mode, bool nofollow);
/* Open the parent directory of `rel` beneath the root; *base points into rel (borrowed). */
int tool_path_open_parent(tool_ctx *ctx, const char *rel, const char **base);
int tool_path_open_parent_at(int basefd, const char *rel, const char **base);
/* The component walk used where openat2 is missing (exposed for tests). */
int tool_path_openat_walk(int dirfd, const char *rel, int flags, mode_t mode, bool nofollow);
/* The same resolution from an arbitrary directory fd (used by tests through tool_path_open). */
int tool_path_openat_beneath(int dirfd, const char *rel, int flags, mode_t mode, bool nofollow);

/* ---- files (fsutil.c) ---- */
/* Read an open fd fully (up to cap bytes; TOOL_ETOOLARGE beyond). Adds a NUL. */
int tool_fd_read_all(int fd, size_t cap, char **out, size_t *len);
/* Atomically replace `rel` with data (temp file in the same directory, fsync, rename, fsync
 * of the directory). Keeps the old file's mode, else `mode`. Refuses to replace a symlink. */
int tool_file_write_atomic(tool_ctx *ctx, const char *rel, const char *data, size_t len,
                           mode_t mode, bool must_exist, bool must_not_exist);
/* The same beneath any directory fd; force_mode applies `mode` even over an existing file. */
int tool_file_write_atomic_at(int basefd, const char *rel, const char *data, size_t len,
                              mode_t mode, bool force_mode, bool must_exist, bool must_not_exist);
/* Heuristic: a NUL in the first 8 KiB, or invalid UTF-8 dominating, means binary. */
bool tool_is_binary(const char *data, size_t len);
/* Unified diff of old -> new for `path` (libgit2's patch from buffers). Caller frees. */
int tool_diff_text(const char *path, const char *a, size_t alen, const char *b, size_t blen,
                   char **out);

/* ---- globs and ignore rules (glob.c, ignore.c) ---- */
/* Match `path` (slash-separated) against a glob: * ? [..] and ** across directories. A glob
 * without a slash matches the last component only. */
bool tool_glob_match(const char *glob, const char *path);
bool tool_glob_match_full(const char *glob, size_t glen, const char *path, size_t plen);

typedef struct tool_ignore tool_ignore;   /* rules from one directory's ignore files */
/* Parse ignore-file text (gitignore syntax) for a directory at `dir_rel` ("" for the root). */
int tool_ignore_parse(tool_ignore **out, const char *dir_rel, const char *text, size_t len);
void tool_ignore_free(tool_ignore *ig);
/* Verdict of one rule set on path (relative to the workspace): 1 ignored, -1 re-included by a
 * negation, 0 no rule matched. */
int tool_ignore_check(const tool_ignore *ig, const char *rel, bool is_dir);

/* ---- directory walk (walk.c) ---- */
typedef struct {
    const char *rel;       /* workspace-relative path */
    int dirfd;             /* the containing directory, open */
    const char *name;      /* last component */
    bool is_dir;
    int depth;             /* 1 for entries of the start directory */
} tool_walk_entry;

/* Return 0 to go on, 1 to skip (a directory: don't descend), negative to stop with an error. */
typedef int (*tool_walk_fn)(void *user, const tool_walk_entry *e, int worker);

typedef struct {
    const char *start_rel;   /* directory to walk (workspace-relative) */
    int max_depth;           /* 0 = unlimited */
    bool hidden;             /* include dot files */
    bool no_ignore;          /* don't read .gitignore/.ignore */
    int threads;             /* 1 = in order on the calling thread (sorted) */
    const volatile int *stop;/* set non-zero by a callback to end the walk early */
} tool_walk_opts;

/* Walk files (and directories, reported before descending) beneath start_rel. Symlinks are
 * never followed; .git is skipped; ignore files honoured per directory. With threads > 1
 * callbacks come from several threads concurrently (worker = 0..threads-1). */
int tool_walk(tool_ctx *ctx, const tool_walk_opts *o, tool_walk_fn fn, void *user);

/* ---- diagnostics (diag.c), patches (patch.c) ---- */
/* Parse compiler/test output into [{file,line,col,severity,message,tool}]. */
int tool_diag_parse(const char *text, size_t len, json_t **out);

typedef struct {
    char *old_path, *new_path;   /* NULL for /dev/null */
    struct tool_hunk *hunks;
    size_t n_hunks;
} tool_patch_file;

typedef struct tool_hunk {
    long old_start, old_count, new_start, new_count;
    char **lines;                /* each begins with ' ', '-' or '+' ; no newline */
    bool *no_eol;                /* "\ No newline at end of file" after this line */
    size_t n_lines;
} tool_hunk;

typedef struct {
    tool_patch_file *files;
    size_t n_files;
} tool_patch;

int tool_patch_parse(tool_patch *out, const char *text, size_t len);
void tool_patch_deinit(tool_patch *p);

/* ---- repository (git.c) ---- */
/* The repository holding the root (opened on first use). TOOL_EGIT when none. */
int tool_repo(tool_ctx *ctx, git_repository **out);
/* Auto-checkpoint before a mutating tool (once per context; no-op outside a repository). */
int tool_maybe_checkpoint(tool_ctx *ctx, const char *tool);

/* ---- the tools ---- */
int tool_read_file(tool_ctx *ctx, json_t *args, json_t *res);
int tool_list_dir(tool_ctx *ctx, json_t *args, json_t *res);
int tool_find_files(tool_ctx *ctx, json_t *args, json_t *res);
int tool_search(tool_ctx *ctx, json_t *args, json_t *res);
int tool_edit_file(tool_ctx *ctx, json_t *args, json_t *res);
int tool_create_file(tool_ctx *ctx, json_t *args, json_t *res);
int tool_apply_patch(tool_ctx *ctx, json_t *args, json_t *res);
int tool_git_status(tool_ctx *ctx, json_t *args, json_t *res);
int tool_git_diff(tool_ctx *ctx, json_t *args, json_t *res);
int tool_git_log(tool_ctx *ctx, json_t *args, json_t *res);
int tool_git_show(tool_ctx *ctx, json_t *args, json_t *res);
int tool_git_blame(tool_ctx *ctx, json_t *args, json_t *res);
int tool_git_branch(tool_ctx *ctx, json_t *args, json_t *res);
int tool_git_add(tool_ctx *ctx, json_t *args, json_t *res);
int tool_git_commit(tool_ctx *ctx, json_t *args, json_t *res);
int tool_git_checkpoint(tool_ctx *ctx, json_t *args, json_t *res);
int tool_build(tool_ctx *ctx, json_t *args, json_t *res);
int tool_test(tool_ctx *ctx, json_t *args, json_t *res);
int tool_outline(tool_ctx *ctx, json_t *args, json_t *res);
int tool_repo_map(tool_ctx *ctx, json_t *args, json_t *res);

/* A JSON string of text that may not be UTF-8 (bad bytes become U+FFFD). New reference. */
json_t *tool_json_text(const char *s, size_t n);

/* Bound a result object in place to about cap bytes of JSON (see tool_call). */
void tool_bound_json(json_t *res, size_t cap);

#endif
