/* read_file, list_dir, find_files. */
#include "tool_int.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int tool_read_file(tool_ctx *ctx, json_t *args, json_t *res) {
    char *rel = NULL, *data = NULL, *outbuf = NULL;
    size_t len = 0;
    int rc = tool_path_clean(ctx, tool_arg_str(args, "path", NULL), &rel);
    if (rc < 0) return rc;
    int fd = tool_path_open(ctx, rel, O_RDONLY, 0, false);
    if (fd < 0) {
        rc = fd;
        goto done;
    }
    rc = tool_fd_read_all(fd, ctx->opt.max_file_bytes, &data, &len);
    close(fd);
    if (rc < 0) {
        tool_err(rc, "%s: %s", rel, tool_error_last());
        goto done;
    }
    if (tool_is_binary(data, len)) {
        rc = tool_err(TOOL_EBINARY, "%s is a binary file (%zu bytes)", rel, len);
        goto done;
    }
    long long start = tool_arg_int(args, "start_line", 1);
    long long end = tool_arg_int(args, "end_line", 0);
    bool numbers = tool_arg_bool(args, "line_numbers", true);
    if (end && end < start) {
        rc = tool_err(TOOL_EINVAL, "end_line %lld is before start_line %lld", end, start);
        goto done;
    }
    long long total = 0;
    for (size_t i = 0; i < len; i++)
        if (data[i] == '\n') total++;
    if (len && data[len - 1] != '\n') total++;
    if (start > total && !(start == 1 && total == 0)) {
        rc = tool_err(TOOL_EINVAL, "start_line %lld is past the end (%lld lines)", start, total);
        goto done;
    }
    if (!end || end > total) end = total;
    size_t cap = len + (size_t)(end - start + 1 > 0 ? end - start + 1 : 0) * 12 + 1;
    outbuf = malloc(cap);
    if (!outbuf) {
        rc = tool_err(TOOL_ENOMEM, "out of memory");
        goto done;
    }
    size_t o = 0;
    long long ln = 1;
    const char *p = data, *e = data + len;
    while (p < e && ln <= end) {
        const char *nl = memchr(p, '\n', (size_t)(e - p));
        const char *le = nl ? nl + 1 : e;
        if (ln >= start) {
            if (numbers) o += (size_t)snprintf(outbuf + o, cap - o, "%6lld\t", ln);
            memcpy(outbuf + o, p, (size_t)(le - p));
            o += (size_t)(le - p);
        }
        p = le;
        ln++;
    }
    outbuf[o] = '\0';
    json_object_set_new(res, "path", json_string(rel));
    json_object_set_new(res, "start_line", json_integer(total ? start : 0));
    json_object_set_new(res, "end_line", json_integer(end));
    json_object_set_new(res, "total_lines", json_integer(total));
    json_object_set_new(res, "bytes", json_integer((json_int_t)len));
    json_object_set_new(res, "content", tool_json_text(outbuf, o));
done:
    free(outbuf);
    free(data);
    free(rel);
    return rc;
}

typedef struct {
    json_t *arr;
    size_t max, count;
    const char *glob;
    size_t base_len;       /* strip this many bytes of rel before glob matching */
    bool dirs;             /* list_dir: record directories too */
    bool truncated;
    volatile int stop;
} list_state;

static int list_cb(void *user, const tool_walk_entry *e, int worker) {
    (void)worker;
    list_state *s = user;
    if (s->glob) {
        if (e->is_dir) return 0;
        if (!tool_glob_match(s->glob, e->rel + s->base_len)) return 0;
    }
    if (s->count >= s->max) {
        s->truncated = true;
        s->stop = 1;
        return 1;
    }
    s->count++;
    if (e->is_dir && s->dirs) {
        size_t n = strlen(e->rel);
        char *d = malloc(n + 2);
        if (!d) return tool_err(TOOL_ENOMEM, "out of memory");
        memcpy(d, e->rel, n);
        d[n] = '/';
        d[n + 1] = '\0';
        json_array_append_new(s->arr, json_string(d));
        free(d);
    } else {
        json_array_append_new(s->arr, json_string(e->rel));
    }
    return 0;
}

static int walk_listing(tool_ctx *ctx, json_t *args, json_t *res, const char *glob, int depth,
                        size_t max) {
    char *rel = NULL;
    int rc = tool_path_clean(ctx, tool_arg_str(args, "path", "."), &rel);
    if (rc < 0) return rc;
    list_state s = {0};
    s.arr = json_array();
    s.max = max;
    s.glob = glob;
    s.dirs = glob == NULL;
    s.base_len = strcmp(rel, ".") ? strlen(rel) + 1 : 0;
    tool_walk_opts o = {rel, depth, tool_arg_bool(args, "hidden", false),
                        tool_arg_bool(args, "no_ignore", false), 1, &s.stop};
    rc = tool_walk(ctx, &o, list_cb, &s);
    if (rc < 0) {
        json_decref(s.arr);
        free(rel);
        return rc;
    }
    json_object_set_new(res, "path", json_string(rel));
    json_object_set_new(res, glob ? "files" : "entries", s.arr);
    json_object_set_new(res, "count", json_integer((json_int_t)s.count));
    if (s.truncated) {
        json_object_set_new(res, "truncated", json_true());
        json_object_set_new(res, "note", json_string("more entries exist: narrow the path or "
                                                     "the glob, or raise max_results"));
    }
    free(rel);
    return 0;
}

int tool_list_dir(tool_ctx *ctx, json_t *args, json_t *res) {
    return walk_listing(ctx, args, res, NULL, (int)tool_arg_int(args, "depth", 2), 2000);
}

int tool_find_files(tool_ctx *ctx, json_t *args, json_t *res) {
    return walk_listing(ctx, args, res, tool_arg_str(args, "glob", "*"), 0,
                        (size_t)tool_arg_int(args, "max_results", 500));
}
