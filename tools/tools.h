/*
 * tools.h - public door of tools/: the repository tools the agent calls (read, list, find,
 * search, edit, git, build/test, symbols), each described by a JSON Schema for its arguments
 * and answering with a JSON object.
 *
 * Conventions: functions return 0 or a negative TOOL_E* code; tool_error_last() holds the
 * calling thread's last error message. Nothing here prints or exits, and nothing here starts a
 * process itself: build and test commands run through sandbox/ (sandbox_run), git goes through
 * libgit2 in process.
 *
 * Arguments and results cross this door as JSON text (UTF-8, NUL-terminated), so callers need
 * no JSON library type. Strings returned through `char **out` are owned by the caller and
 * released with free().
 *
 * Safety: every path argument is resolved beneath the workspace root (openat2 with
 * RESOLVE_BENEATH where the kernel has it, else a component-by-component walk with file
 * descriptors); `..` above the root, absolute paths outside it and symlinks leading out are
 * refused, and the check and the open are one step (no check-then-open race). Writes are
 * atomic (temporary file, fsync, rename); a failed edit leaves the file byte-for-byte unchanged.
 */
#ifndef SPARK_TOOL_H
#define SPARK_TOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    TOOL_OK = 0,
    TOOL_EINVAL = -1,     /* bad arguments: JSON, schema, or a value out of range */
    TOOL_ENOMEM = -2,
    TOOL_EINTERNAL = -3,
    TOOL_ENOTFOUND = -4,  /* unknown tool, missing file, text not found, unknown revision */
    TOOL_EPATH = -5,      /* a path leads outside the workspace, or is not allowed */
    TOOL_EIO = -6,        /* the operating system refused a read or write */
    TOOL_EGIT = -7,       /* libgit2 failed, or the workspace is not a repository */
    TOOL_ECONFLICT = -8,  /* ambiguous edit, patch that does not apply, dirty checkout */
    TOOL_ETOOLARGE = -9,  /* a file or argument beyond its size cap */
    TOOL_EBINARY = -10,   /* a binary file where text is needed */
    TOOL_ESANDBOX = -11,  /* the sandbox refused or could not run a command */
    TOOL_EUNSUPPORTED = -12, /* no build system detected, language without a grammar, ... */
};

/* The calling thread's last error message ("" if none). Borrowed. */
const char *tool_error_last(void);

/* Short stable name of an error code ("not_found", "path", ...), for JSON results. */
const char *tool_error_name(int code);

/* ---------------------------------------------------------------------------------------------
 * A tool context: one workspace. Not thread-safe: one thread calls into a context at a time
 * (search and the repo map use worker threads of their own inside a call).
 * ------------------------------------------------------------------------------------------- */
typedef struct tool_ctx tool_ctx;

#define TOOL_OPTIONS_VERSION 1

typedef struct {
    unsigned version;          /* TOOL_OPTIONS_VERSION */
    const char *root;          /* workspace root directory; NULL = the current directory */
    size_t result_cap;         /* bytes of result JSON given to the model; 0 = 32 KiB */
    size_t max_file_bytes;     /* largest file read, edited or searched; 0 = 16 MiB */
    int threads;               /* worker threads for search and the repo map; 0 = CPUs */
    bool auto_checkpoint;      /* checkpoint the repository before the first mutating call */
    double build_timeout_s;    /* default build/test timeout; 0 = 600 s */
    bool build_network;        /* build/test commands get the network */
    bool unsandboxed;          /* explicit user choice: run build/test without isolation */
    const char *const *env;    /* NULL-terminated environment for build/test; NULL = inherit */
} tool_options;

#define TOOL_OPTIONS_INIT {TOOL_OPTIONS_VERSION, NULL, 0, 0, 0, true, 0, false, false, NULL}

/* Open a context on opt->root (NULL opt = defaults). The root must be an existing directory;
 * it is opened once and every later path is resolved beneath that descriptor. When the root is
 * inside a git repository, git tools and checkpoints use it. build/test commands without the
 * network run in a network namespace from a pool the context owns (sandbox_netns_pool: made on
 * first use, reused by the next command, released by tool_ctx_free). Errors: TOOL_EINVAL,
 * TOOL_EIO, TOOL_ENOMEM. */
int tool_ctx_new(tool_ctx **out, const tool_options *opt);
void tool_ctx_free(tool_ctx *ctx);

/* The absolute, resolved workspace root. Borrowed, valid while ctx lives. */
const char *tool_ctx_root(const tool_ctx *ctx);

/* ---------------------------------------------------------------------------------------------
 * The registry. Tool names, descriptions and argument schemas are process-wide constants.
 * ------------------------------------------------------------------------------------------- */
size_t tool_count(void);
const char *tool_name(size_t i);          /* NULL past the end */
bool tool_is_mutating(const char *name);  /* writes to the workspace or the repository */

typedef enum {
    TOOL_FORMAT_OPENAI = 0,   /* [{"type":"function","function":{name,description,parameters}}] */
    TOOL_FORMAT_GRAMMAR = 1,  /* [{"name":..., "schema":{...}}] for the tool-call grammar */
} tool_format;

/* The whole set as JSON text in `format`. *out is caller-owned. */
int tool_schemas_json(char **out, tool_format format);

/* One tool's argument schema as JSON text. TOOL_ENOTFOUND for an unknown name. */
int tool_schema_json(char **out, const char *name);

/* Check `args_json` (a JSON object; NULL or "" = {}) against tool `name`'s schema without
 * running anything: 0, or TOOL_ENOTFOUND / TOOL_EINVAL with the reason (naming the argument)
 * in tool_error_last(). What tool_call() checks first; the agent uses it to refuse a model's
 * call before asking for approval. Thread-safe. */
int tool_args_check(const char *name, const char *args_json);

/* The same check against a schema given as JSON text, for tools defined outside the registry
 * (MCP servers): the keywords the registry's schemas use are checked (type, enum, minimum,
 * maximum, minLength, maxLength, items, minItems, maxItems, properties, required,
 * additionalProperties false); others are not. 0, or TOOL_EINVAL with the reason. Thread-safe. */
int tool_schema_check(const char *schema_json, const char *args_json);

/* Run tool `name` with `args_json` (a JSON object; NULL or "" = {}). The arguments are checked
 * against the tool's schema first. On success returns 0 and *out holds the result object; on
 * failure returns the negative code and *out (when memory allows) holds
 * {"error":{"code":NAME,"message":TEXT}} so the model can read what went wrong. Results are
 * bounded to the context's result_cap: long strings keep their head and tail, long arrays
 * their first and last items, with a note of what was cut. *out is caller-owned. */
int tool_call(tool_ctx *ctx, const char *name, const char *args_json, char **out);

/* Keep the head and tail of text[0..len) within about `cap` bytes, with a line in the middle
 * saying how many bytes and lines were cut (cut on line boundaries where possible, never inside
 * a UTF-8 sequence). *out is caller-owned and NUL-terminated. */
int tool_bound_text(char **out, const char *text, size_t len, size_t cap);

/* ---------------------------------------------------------------------------------------------
 * Checkpoints (git workspaces): the worktree (tracked files and untracked, not ignored ones),
 * the index and HEAD, snapshotted to private refs refs/spark-agent/checkpoints/N.
 * ------------------------------------------------------------------------------------------- */

/* Snapshot now. *out_ref (optional, caller-owned) receives the ref name. */
int tool_checkpoint_create(tool_ctx *ctx, const char *reason, char **out_ref);

/* Restore checkpoint `ref` (NULL = the newest): files written since are put back byte for
 * byte, files created since (untracked, not ignored) removed, the index and HEAD reset. The
 * restored checkpoint stays, so undo can be repeated. *out_json (optional) summarises what
 * changed. TOOL_ENOTFOUND when there is no checkpoint. */
int tool_checkpoint_restore(tool_ctx *ctx, const char *ref, char **out_json);

#ifdef __cplusplus
}
#endif
#endif
