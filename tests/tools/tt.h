/* Helpers shared by the tools/ tests: checks, scratch workspaces, calling tools. */
#ifndef SPARK_TESTS_TOOLS_TT_H
#define SPARK_TESTS_TOOLS_TT_H

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tools.h"

static int tt_failures;

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);     \
            tt_failures++;                                                               \
        }                                                                                \
    } while (0)

#define CHECK_MSG(cond, ...)                                                             \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);     \
            fprintf(stderr, __VA_ARGS__);                                                \
            fputc('\n', stderr);                                                         \
            tt_failures++;                                                               \
        }                                                                                \
    } while (0)

static inline int tt_done(const char *name) {
    if (tt_failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, tt_failures);
        return 1;
    }
    printf("%s: all checks passed\n", name);
    return 0;
}

/* A fresh scratch directory (removed by tt_rmtree). Returns a static-lifetime malloc'd path. */
static inline char *tt_tmpdir(void) {
    const char *base = getenv("TMPDIR");
    char tmpl[4096];
    snprintf(tmpl, sizeof tmpl, "%s/spark-tools-XXXXXX", base && *base ? base : "/tmp");
    char *d = mkdtemp(tmpl);
    if (!d) {
        perror("mkdtemp");
        exit(1);
    }
    return realpath(d, NULL);
}

static inline int tt_rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

static inline void tt_rmtree(const char *dir) {
    nftw(dir, tt_rm_cb, 32, FTW_DEPTH | FTW_PHYS);
}

/* Write a file below dir (parents created). */
static inline void tt_write(const char *dir, const char *rel, const char *data, size_t len) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    for (char *p = path + strlen(dir) + 1; (p = strchr(p, '/')); p++) {
        *p = '\0';
        mkdir(path, 0777);
        *p = '/';
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fwrite(data, 1, len, f);
    fclose(f);
}

static inline void tt_puts(const char *dir, const char *rel, const char *text) {
    tt_write(dir, rel, text, strlen(text));
}

/* Whole file content (NUL-terminated) or NULL. */
static inline char *tt_read(const char *dir, const char *rel, size_t *len) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    size_t got = fread(b, 1, (size_t)n, f);
    fclose(f);
    b[got] = '\0';
    if (len) *len = got;
    return b;
}

static inline bool tt_exists(const char *dir, const char *rel) {
    char path[8192];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    return lstat(path, &st) == 0;
}

/* Call a tool; returns the parsed result (caller decrefs) and the status in *rc. */
static inline json_t *tt_call(tool_ctx *ctx, const char *name, const char *args, int *rc) {
    char *out = NULL;
    *rc = tool_call(ctx, name, args, &out);
    json_t *j = out ? json_loads(out, 0, NULL) : NULL;
    if (!j) fprintf(stderr, "tool %s returned unparsable output: %s\n", name, out ? out : "NULL");
    if (getenv("TT_VERBOSE")) fprintf(stderr, "%s %s -> %d %s\n", name, args, *rc, out ? out : "");
    free(out);
    return j;
}

/* A context on dir with defaults (no auto checkpoint unless asked). */
static inline tool_ctx *tt_ctx(const char *dir, bool checkpoint, size_t cap) {
    tool_options o = TOOL_OPTIONS_INIT;
    o.root = dir;
    o.auto_checkpoint = checkpoint;
    o.result_cap = cap ? cap : (1u << 20);
    tool_ctx *c = NULL;
    if (tool_ctx_new(&c, &o) != 0) {
        fprintf(stderr, "tool_ctx_new(%s): %s\n", dir, tool_error_last());
        exit(1);
    }
    return c;
}

static inline const char *tt_err_code(json_t *r) {
    return json_string_value(json_object_get(json_object_get(r, "error"), "code"));
}

#endif
