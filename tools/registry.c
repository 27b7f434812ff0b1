/* The tool registry: names, descriptions for the model, argument schemas, dispatch. */
#include "tool_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sandbox.h"

typedef struct {
    const char *name;
    const char *description;
    const char *schema;   /* JSON Schema of the arguments */
    tool_fn fn;
    bool mutating;
} tool_def;

#define OBJ(props, req) "{\"type\":\"object\",\"properties\":{" props "},\"required\":[" req \
                        "],\"additionalProperties\":false}"
#define PATH_PROP(what) "\"path\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":4000," \
                        "\"description\":\"" what "\"}"

static const tool_def TOOLS[] = {
    {"read_file",
     "Read a text file of the workspace, with line numbers. Use start_line/end_line for a range "
     "of a long file. Binary files are refused; very long output is cut in the middle.",
     OBJ(PATH_PROP("file path relative to the workspace root") ","
         "\"start_line\":{\"type\":\"integer\",\"minimum\":1,\"description\":\"first line (1-based)\"},"
         "\"end_line\":{\"type\":\"integer\",\"minimum\":1,\"description\":\"last line, inclusive\"},"
         "\"line_numbers\":{\"type\":\"boolean\",\"description\":\"prefix lines with their number (default true)\"}",
         "\"path\""),
     tool_read_file, false},
    {"list_dir",
     "List a directory of the workspace as a tree (directories end with '/'). Files ignored by "
     ".gitignore/.ignore and hidden files are left out unless asked.",
     OBJ("\"path\":{\"type\":\"string\",\"maxLength\":4000,\"description\":\"directory (default: the root)\"},"
         "\"depth\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":20,\"description\":\"levels to show (default 2)\"},"
         "\"hidden\":{\"type\":\"boolean\",\"description\":\"include dot files\"},"
         "\"no_ignore\":{\"type\":\"boolean\",\"description\":\"also list ignored files\"}",
         ""),
     tool_list_dir, false},
    {"find_files",
     "Find files whose path matches a glob (e.g. '**/*.c', 'src/*.py', 'Makefile'). A glob "
     "without '/' matches file names at any depth.",
     OBJ("\"glob\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":1000,\"description\":\"glob with * ? [..] and **\"},"
         "\"path\":{\"type\":\"string\",\"maxLength\":4000,\"description\":\"directory to search (default: the root)\"},"
         "\"max_results\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":100000,\"description\":\"default 500\"},"
         "\"hidden\":{\"type\":\"boolean\"},\"no_ignore\":{\"type\":\"boolean\"}",
         "\"glob\""),
     tool_find_files, false},
    {"search",
     "Search file contents with a regular expression (PCRE2 syntax) or a literal string, like "
     "ripgrep: .gitignore honoured, binary files skipped. Returns matching lines with file and "
     "line number, optionally with context lines.",
     OBJ("\"pattern\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":10000,\"description\":\"regular expression, or text when literal is true\"},"
         "\"literal\":{\"type\":\"boolean\",\"description\":\"treat pattern as plain text\"},"
         "\"case_insensitive\":{\"type\":\"boolean\"},"
         "\"word\":{\"type\":\"boolean\",\"description\":\"match whole words only\"},"
         "\"path\":{\"type\":\"string\",\"maxLength\":4000,\"description\":\"file or directory to search (default: the root)\"},"
         "\"include\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":1000},\"description\":\"globs of files to search, e.g. ['*.c','*.h']\"},"
         "\"exclude\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":1000},\"description\":\"globs of files or directories to skip\"},"
         "\"context\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":20,\"description\":\"lines of context before and after each match\"},"
         "\"max_results\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":1000000,\"description\":\"matching lines to return (default 200)\"},"
         "\"hidden\":{\"type\":\"boolean\"},\"no_ignore\":{\"type\":\"boolean\"}",
         "\"pattern\""),
     tool_search, false},
    {"edit_file",
     "Replace an exact piece of text in a file. old_text must occur exactly once (or set "
     "replace_all); if it is not found exactly, a match that differs only in whitespace and "
     "line endings is tried and reported. Returns the diff. The file is unchanged on failure.",
     OBJ(PATH_PROP("file to edit") ","
         "\"old_text\":{\"type\":\"string\",\"minLength\":1,\"description\":\"text to replace, copied exactly from the file\"},"
         "\"new_text\":{\"type\":\"string\",\"description\":\"replacement text\"},"
         "\"replace_all\":{\"type\":\"boolean\",\"description\":\"replace every occurrence\"},"
         "\"fuzzy\":{\"type\":\"boolean\",\"description\":\"allow the whitespace-tolerant fallback (default true)\"}",
         "\"path\",\"old_text\",\"new_text\""),
     tool_edit_file, true},
    {"create_file",
     "Create a new file (parent directories must exist), or overwrite an existing one when "
     "overwrite is true. Returns the diff.",
     OBJ(PATH_PROP("file to create") ","
         "\"content\":{\"type\":\"string\"},"
         "\"overwrite\":{\"type\":\"boolean\",\"description\":\"replace an existing file\"}",
         "\"path\",\"content\""),
     tool_create_file, true},
    {"apply_patch",
     "Apply a unified diff (as produced by 'git diff' or 'diff -u') to the workspace; may touch "
     "several files, create and delete files. All hunks must apply or nothing is written.",
     OBJ("\"patch\":{\"type\":\"string\",\"minLength\":1,\"description\":\"unified diff text\"}",
         "\"patch\""),
     tool_apply_patch, true},
    {"git_status",
     "Show the git status: staged, unstaged and untracked files, and the current branch.",
     OBJ("\"paths\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":4000}}", ""),
     tool_git_status, false},
    {"git_diff",
     "Show a git diff: 'worktree' (unstaged changes, default), 'staged' (index vs HEAD), 'head' "
     "(worktree vs HEAD) or 'refs' (between revisions 'from' and 'to'), optionally for paths.",
     OBJ("\"mode\":{\"type\":\"string\",\"enum\":[\"worktree\",\"staged\",\"head\",\"refs\"]},"
         "\"from\":{\"type\":\"string\",\"maxLength\":200},\"to\":{\"type\":\"string\",\"maxLength\":200},"
         "\"paths\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":4000}},"
         "\"context\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":100},"
         "\"untracked\":{\"type\":\"boolean\",\"description\":\"worktree/head modes: also show new untracked files\"}",
         ""),
     tool_git_diff, false},
    {"git_log",
     "Show commit history (newest first) of a revision, optionally only commits touching paths.",
     OBJ("\"rev\":{\"type\":\"string\",\"maxLength\":200,\"description\":\"default HEAD\"},"
         "\"paths\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":4000}},"
         "\"max_count\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":10000,\"description\":\"default 20\"}",
         ""),
     tool_git_log, false},
    {"git_show",
     "Show a commit (message and diff), or a file at a revision with 'REV:path'.",
     OBJ("\"rev\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":4200}", "\"rev\""),
     tool_git_show, false},
    {"git_blame",
     "Show who last changed each line of a file (optionally a line range).",
     OBJ(PATH_PROP("file") ","
         "\"start_line\":{\"type\":\"integer\",\"minimum\":1},\"end_line\":{\"type\":\"integer\",\"minimum\":1}",
         "\"path\""),
     tool_git_blame, false},
    {"git_branch",
     "List branches, create one (from HEAD or 'start'), or switch to one (refuses to overwrite "
     "local changes).",
     OBJ("\"action\":{\"type\":\"string\",\"enum\":[\"list\",\"create\",\"switch\"]},"
         "\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":200},"
         "\"start\":{\"type\":\"string\",\"maxLength\":200}",
         "\"action\""),
     tool_git_branch, true},
    {"git_add",
     "Stage files (deleted files are staged as deletions). 'all' stages every change.",
     OBJ("\"paths\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":4000}},"
         "\"all\":{\"type\":\"boolean\"}",
         ""),
     tool_git_add, true},
    {"git_commit",
     "Commit the staged changes with a message; the author comes from the user's git config. "
     "No hooks are run.",
     OBJ("\"message\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":100000}", "\"message\""),
     tool_git_commit, true},
    {"git_checkpoint",
     "Snapshot the worktree, index and HEAD to a private ref ('create'), list snapshots, or "
     "restore one ('restore', default the newest).",
     OBJ("\"action\":{\"type\":\"string\",\"enum\":[\"create\",\"list\",\"restore\"]},"
         "\"ref\":{\"type\":\"string\",\"maxLength\":200}",
         "\"action\""),
     tool_git_checkpoint, true},
    {"build",
     "Build the project with its detected build system (make, cmake, ninja, meson, cargo, go, "
     "npm) or the given command, inside the sandbox. Returns the exit status, compiler "
     "diagnostics as file:line:col items and the output (cut in the middle when long).",
     OBJ("\"command\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":10000},\"description\":\"argv to run instead of the detected command\"},"
         "\"timeout_s\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":7200}",
         ""),
     tool_build, false},
    {"test",
     "Run the project's tests (make test, ctest, cargo test, go test, npm test, pytest) or the "
     "given command, inside the sandbox; returns the exit status, diagnostics and the output.",
     OBJ("\"command\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":10000}},"
         "\"timeout_s\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":7200}",
         ""),
     tool_test, false},
    {"outline",
     "Outline a source file: its functions, types, classes and methods with line ranges "
     "(C, C++, Python, JavaScript, TypeScript, TSX, Go, Rust, Java).",
     OBJ(PATH_PROP("source file"), "\"path\""),
     tool_outline, false},
    {"repo_map",
     "A map of the repository: the most referenced definitions across its source files, with "
     "their files and lines, within a token budget. Good for a first look at a codebase.",
     OBJ("\"path\":{\"type\":\"string\",\"maxLength\":4000,\"description\":\"directory (default: the root)\"},"
         "\"max_tokens\":{\"type\":\"integer\",\"minimum\":64,\"maximum\":65536,\"description\":\"default 2048\"}",
         ""),
     tool_repo_map, false},
};

#define N_TOOLS (sizeof TOOLS / sizeof TOOLS[0])

size_t tool_count(void) {
    return N_TOOLS;
}

const char *tool_name(size_t i) {
    return i < N_TOOLS ? TOOLS[i].name : NULL;
}

static const tool_def *find_tool(const char *name) {
    for (size_t i = 0; i < N_TOOLS; i++)
        if (!strcmp(TOOLS[i].name, name)) return &TOOLS[i];
    return NULL;
}

bool tool_is_mutating(const char *name) {
    const tool_def *t = name ? find_tool(name) : NULL;
    return t && t->mutating;
}

static json_t *schema_of(const tool_def *t) {
    json_error_t e;
    return json_loads(t->schema, 0, &e);
}

int tool_schema_json(char **out, const char *name) {
    *out = NULL;
    const tool_def *t = name ? find_tool(name) : NULL;
    if (!t) return tool_err(TOOL_ENOTFOUND, "unknown tool '%s'", name ? name : "(null)");
    *out = strdup(t->schema);
    return *out ? 0 : tool_err(TOOL_ENOMEM, "out of memory");
}

int tool_schemas_json(char **out, tool_format format) {
    *out = NULL;
    json_t *arr = json_array();
    if (!arr) return tool_err(TOOL_ENOMEM, "out of memory");
    for (size_t i = 0; i < N_TOOLS; i++) {
        json_t *s = schema_of(&TOOLS[i]);
        if (!s) {
            json_decref(arr);
            return tool_err(TOOL_EINTERNAL, "schema of %s does not parse", TOOLS[i].name);
        }
        json_t *item;
        if (format == TOOL_FORMAT_GRAMMAR) {
            item = json_pack("{s:s, s:s, s:o}", "name", TOOLS[i].name, "description",
                             TOOLS[i].description, "schema", s);
        } else {
            item = json_pack("{s:s, s:{s:s, s:s, s:o}}", "type", "function", "function", "name",
                             TOOLS[i].name, "description", TOOLS[i].description, "parameters", s);
        }
        if (!item || json_array_append_new(arr, item) != 0) {
            json_decref(arr);
            return tool_err(TOOL_ENOMEM, "out of memory");
        }
    }
    *out = json_dumps(arr, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(arr);
    return *out ? 0 : tool_err(TOOL_ENOMEM, "out of memory");
}

/* ---- argument helpers ---- */
const char *tool_arg_str(json_t *args, const char *key, const char *dflt) {
    json_t *v = json_object_get(args, key);
    return json_is_string(v) ? json_string_value(v) : dflt;
}

long long tool_arg_int(json_t *args, const char *key, long long dflt) {
    json_t *v = json_object_get(args, key);
    return json_is_integer(v) ? json_integer_value(v) : dflt;
}

bool tool_arg_bool(json_t *args, const char *key, bool dflt) {
    json_t *v = json_object_get(args, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* ---- the schema subset validator ---- */
static bool type_ok(const char *ty, json_t *v) {
    if (!strcmp(ty, "object")) return json_is_object(v);
    if (!strcmp(ty, "array")) return json_is_array(v);
    if (!strcmp(ty, "string")) return json_is_string(v);
    if (!strcmp(ty, "integer")) return json_is_integer(v) ||
               (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
    if (!strcmp(ty, "number")) return json_is_number(v);
    if (!strcmp(ty, "boolean")) return json_is_boolean(v);
    if (!strcmp(ty, "null")) return json_is_null(v);
    return false;
}

static size_t utf8_len(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) c++;
    return c;
}

int tool_schema_validate(json_t *schema, json_t *v, const char *where) {
    json_t *ty = json_object_get(schema, "type");
    if (json_is_string(ty) && !type_ok(json_string_value(ty), v))
        return tool_err(TOOL_EINVAL, "%s must be of type %s", where, json_string_value(ty));
    json_t *en = json_object_get(schema, "enum");
    if (json_is_array(en)) {
        size_t i;
        json_t *x;
        bool hit = false;
        json_array_foreach(en, i, x) hit = hit || json_equal(x, v);
        if (!hit) {
            char *s = json_dumps(en, JSON_COMPACT);
            tool_err(TOOL_EINVAL, "%s must be one of %s", where, s ? s : "the enum");
            free(s);
            return TOOL_EINVAL;
        }
    }
    if (json_is_number(v)) {
        double d = json_number_value(v);
        json_t *mn = json_object_get(schema, "minimum"), *mx = json_object_get(schema, "maximum");
        if (json_is_number(mn) && d < json_number_value(mn))
            return tool_err(TOOL_EINVAL, "%s must be >= %g", where, json_number_value(mn));
        if (json_is_number(mx) && d > json_number_value(mx))
            return tool_err(TOOL_EINVAL, "%s must be <= %g", where, json_number_value(mx));
    }
    if (json_is_string(v)) {
        size_t n = utf8_len(json_string_value(v), json_string_length(v));
        json_t *mn = json_object_get(schema, "minLength"), *mx = json_object_get(schema, "maxLength");
        if (json_is_integer(mn) && n < (size_t)json_integer_value(mn))
            return tool_err(TOOL_EINVAL, "%s must have at least %lld characters", where,
                            json_integer_value(mn));
        if (json_is_integer(mx) && n > (size_t)json_integer_value(mx))
            return tool_err(TOOL_EINVAL, "%s must have at most %lld characters", where,
                            json_integer_value(mx));
        if (memchr(json_string_value(v), '\0', json_string_length(v)))
            return tool_err(TOOL_EINVAL, "%s contains a NUL character", where);
    }
    if (json_is_array(v)) {
        json_t *mn = json_object_get(schema, "minItems"), *mx = json_object_get(schema, "maxItems");
        if (json_is_integer(mn) && json_array_size(v) < (size_t)json_integer_value(mn))
            return tool_err(TOOL_EINVAL, "%s needs at least %lld items", where,
                            json_integer_value(mn));
        if (json_is_integer(mx) && json_array_size(v) > (size_t)json_integer_value(mx))
            return tool_err(TOOL_EINVAL, "%s takes at most %lld items", where,
                            json_integer_value(mx));
        json_t *items = json_object_get(schema, "items");
        if (json_is_object(items)) {
            size_t i;
            json_t *x;
            json_array_foreach(v, i, x) {
                char w[256];
                snprintf(w, sizeof w, "%s[%zu]", where, i);
                int rc = tool_schema_validate(items, x, w);
                if (rc < 0) return rc;
            }
        }
    }
    if (json_is_object(v)) {
        json_t *props = json_object_get(schema, "properties");
        json_t *req = json_object_get(schema, "required");
        size_t i;
        json_t *x;
        json_array_foreach(req, i, x) {
            if (json_is_string(x) && !json_object_get(v, json_string_value(x)))
                return tool_err(TOOL_EINVAL, "%s: missing required argument '%s'", where,
                                json_string_value(x));
        }
        const char *k;
        json_object_foreach(v, k, x) {
            json_t *ps = json_object_get(props, k);
            char w[256];
            snprintf(w, sizeof w, "%s.%s", where, k);
            if (!ps) {
                if (json_is_false(json_object_get(schema, "additionalProperties")))
                    return tool_err(TOOL_EINVAL, "%s: unknown argument '%s'", where, k);
                continue;
            }
            int rc = tool_schema_validate(ps, x, w);
            if (rc < 0) return rc;
        }
    }
    return 0;
}

/* ---- contexts ---- */
int tool_ctx_new(tool_ctx **out, const tool_options *opt) {
    *out = NULL;
    tool_options o = TOOL_OPTIONS_INIT;
    if (opt) {
        if (opt->version != TOOL_OPTIONS_VERSION)
            return tool_err(TOOL_EINVAL, "tool_options version %u, expected %u", opt->version,
                            TOOL_OPTIONS_VERSION);
        o = *opt;
    }
    if (!o.result_cap) o.result_cap = 32 * 1024;
    if (o.result_cap < 1024) o.result_cap = 1024;
    if (!o.max_file_bytes) o.max_file_bytes = 16u << 20;
    if (o.build_timeout_s <= 0) o.build_timeout_s = 600;
    tool_ctx *c = calloc(1, sizeof *c);
    if (!c) return tool_err(TOOL_ENOMEM, "out of memory");
    c->opt = o;
    c->opt.root = NULL;
    c->rootfd = -1;
    c->root = realpath(o.root ? o.root : ".", NULL);
    if (!c->root) {
        int e = errno;
        free(c);
        return tool_err(e == ENOENT ? TOOL_ENOTFOUND : TOOL_EIO, "workspace root '%s': %s",
                        o.root ? o.root : ".", strerror(e));
    }
    c->rootfd = open(c->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (c->rootfd < 0) {
        int e = errno;
        tool_err(TOOL_EIO, "workspace root '%s': %s", c->root, strerror(e));
        free(c->root);
        free(c);
        return e == ENOTDIR ? TOOL_EINVAL : TOOL_EIO;
    }
    /* build/test runs take their network namespace from this pool (the fast path of
     * sandbox_run; namespaces are made on first use, so a context that never builds pays
     * nothing). Without user namespaces the runs still fail closed in sandbox_run. */
    if (!(c->netns_pool = sandbox_netns_pool_new())) {
        tool_err(TOOL_ENOMEM, "%s", sandbox_error_last());
        close(c->rootfd);
        free(c->root);
        free(c);
        return TOOL_ENOMEM;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    c->threads = o.threads > 0 ? o.threads : (n > 0 ? (int)(n > 16 ? 16 : n) : 2);
    git_libgit2_init();
    *out = c;
    return 0;
}

void tool_ctx_free(tool_ctx *ctx) {
    if (!ctx) return;
    if (ctx->repo) git_repository_free(ctx->repo);
    free(ctx->repo_prefix);
    if (ctx->rootfd >= 0) close(ctx->rootfd);
    sandbox_netns_pool_free(ctx->netns_pool);
    free(ctx->root);
    free(ctx);
    git_libgit2_shutdown();
}

const char *tool_ctx_root(const tool_ctx *ctx) {
    return ctx->root;
}

/* ---- calling ---- */
static char *error_json(int code) {
    json_t *e = json_pack("{s:{s:s, s:s}}", "error", "code", tool_error_name(code), "message",
                          tool_error_last());
    char *s = e ? json_dumps(e, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(e);
    return s;
}

/* Find tool `name`, parse args_json (NULL or "" = {}) and check it against the tool's schema.
 * On success *args_out holds the parsed arguments (caller-owned). */
static int args_parse_checked(const char *name, const char *args_json, const tool_def **t_out,
                              json_t **args_out) {
    *args_out = NULL;
    const tool_def *t = name ? find_tool(name) : NULL;
    if (!t) return tool_err(TOOL_ENOTFOUND, "unknown tool '%s'", name ? name : "(null)");
    *t_out = t;
    if (!args_json || !*args_json) args_json = "{}";
    json_error_t je;
    json_t *args = json_loads(args_json, JSON_REJECT_DUPLICATES, &je);
    if (!args)
        return tool_err(TOOL_EINVAL, "arguments are not valid JSON: %s (line %d, column %d)",
                        je.text, je.line, je.column);
    json_t *schema = schema_of(t);
    int rc = schema ? tool_schema_validate(schema, args, "arguments")
                    : tool_err(TOOL_EINTERNAL, "schema of %s does not parse", t->name);
    json_decref(schema);
    if (rc < 0) {
        json_decref(args);
        return rc;
    }
    *args_out = args;
    return 0;
}

int tool_args_check(const char *name, const char *args_json) {
    const tool_def *t = NULL;
    json_t *args = NULL;
    int rc = args_parse_checked(name, args_json, &t, &args);
    json_decref(args);
    return rc;
}

int tool_schema_check(const char *schema_json, const char *args_json) {
    json_error_t je;
    json_t *schema = json_loads(schema_json ? schema_json : "", 0, &je);
    if (!json_is_object(schema)) {
        json_decref(schema);
        return tool_err(TOOL_EINVAL, "the schema is not a JSON object");
    }
    json_t *args = json_loads(args_json && *args_json ? args_json : "{}",
                              JSON_REJECT_DUPLICATES, &je);
    int rc = args ? tool_schema_validate(schema, args, "arguments")
                  : tool_err(TOOL_EINVAL, "arguments are not valid JSON: %s (line %d, column %d)",
                             je.text, je.line, je.column);
    json_decref(args);
    json_decref(schema);
    return rc;
}

int tool_call(tool_ctx *ctx, const char *name, const char *args_json, char **out) {
    *out = NULL;
    const tool_def *t = NULL;
    json_t *args = NULL, *res = NULL;
    int rc = args_parse_checked(name, args_json, &t, &args);
    if (rc < 0) goto done;
    if (t->mutating && t->fn != tool_git_checkpoint && ctx->opt.auto_checkpoint &&
        (rc = tool_maybe_checkpoint(ctx, t->name)) < 0)
        goto done;
    res = json_object();
    if (!res) {
        rc = tool_err(TOOL_ENOMEM, "out of memory");
        goto done;
    }
    tool_err(0, "%s", "");
    rc = t->fn(ctx, args, res);
    if (rc < 0) goto done;
    tool_bound_json(res, ctx->opt.result_cap);
    *out = json_dumps(res, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!*out) rc = tool_err(TOOL_ENOMEM, "out of memory");
done:
    if (rc < 0) *out = error_json(rc);
    json_decref(args);
    json_decref(res);
    return rc;
}
