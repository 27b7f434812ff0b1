/* Paths: everything resolves beneath the workspace root; escapes are refused by both the
 * openat2 path and the fallback component walk, and tools report them as path_refused. */
#include "tt.h"
#include "tool_int.h"

static void check_open(tool_ctx *ctx, const char *rel, int want) {
    int fd = tool_path_open(ctx, rel, O_RDONLY, 0, false);
    int fd2 = tool_path_openat_walk(ctx->rootfd, rel, O_RDONLY, 0, false);
    if (want >= 0) {
        CHECK_MSG(fd >= 0, "openat2 %s: %s", rel, tool_error_last());
        CHECK_MSG(fd2 >= 0, "walk %s: %s", rel, tool_error_last());
    } else {
        CHECK_MSG(fd == want, "openat2 %s gave %d, want %d", rel, fd, want);
        CHECK_MSG(fd2 == want, "walk %s gave %d, want %d", rel, fd2, want);
    }
    if (fd >= 0) close(fd);
    if (fd2 >= 0) close(fd2);
}

int main(void) {
    char *dir = tt_tmpdir();
    char *outside = tt_tmpdir();
    tt_puts(outside, "secret.txt", "top secret\n");
    tt_puts(dir, "ws/a/b.txt", "hello\n");
    tt_puts(dir, "ws/c.txt", "see\n");
    char ws[4096], p[8300], target[8300];
    snprintf(ws, sizeof ws, "%s/ws", dir);
    /* links: inside (relative), out (absolute), out (relative), a dir link out */
    snprintf(p, sizeof p, "%s/in_link", ws);
    CHECK(symlink("a/b.txt", p) == 0);
    snprintf(p, sizeof p, "%s/abs_out", ws);
    snprintf(target, sizeof target, "%s/secret.txt", outside);
    CHECK(symlink(target, p) == 0);
    snprintf(p, sizeof p, "%s/a/rel_out", ws);
    CHECK(symlink("../../../../../../../../../../etc/passwd", p) == 0);
    snprintf(p, sizeof p, "%s/dir_out", ws);
    CHECK(symlink(outside, p) == 0);
    snprintf(p, sizeof p, "%s/a/up", ws);
    CHECK(symlink("..", p) == 0); /* stays inside: a/up -> ws */

    tool_ctx *ctx = tt_ctx(ws, false, 0);
    char *rel = NULL;
    CHECK(tool_path_clean(ctx, "a/./b.txt", &rel) == 0 && !strcmp(rel, "a/b.txt"));
    free(rel);
    CHECK(tool_path_clean(ctx, "a/../c.txt", &rel) == 0 && !strcmp(rel, "c.txt"));
    free(rel);
    CHECK(tool_path_clean(ctx, "", &rel) == 0 && !strcmp(rel, "."));
    free(rel);
    CHECK(tool_path_clean(ctx, "../x", &rel) == TOOL_EPATH);
    CHECK(tool_path_clean(ctx, "a/../../x", &rel) == TOOL_EPATH);
    CHECK(tool_path_clean(ctx, "/etc/passwd", &rel) == TOOL_EPATH);
    snprintf(p, sizeof p, "%s/a/b.txt", ws);
    CHECK(tool_path_clean(ctx, p, &rel) == 0 && !strcmp(rel, "a/b.txt"));
    free(rel);
    snprintf(p, sizeof p, "%s-other/x", ws); /* a sibling sharing the prefix is outside */
    CHECK(tool_path_clean(ctx, p, &rel) == TOOL_EPATH);

    check_open(ctx, "a/b.txt", 0);
    check_open(ctx, "in_link", 0);
    check_open(ctx, "a/up/c.txt", 0);
    check_open(ctx, "abs_out", TOOL_EPATH);
    check_open(ctx, "a/rel_out", TOOL_EPATH);
    check_open(ctx, "dir_out/secret.txt", TOOL_EPATH);
    check_open(ctx, "a/up/../c.txt", TOOL_EPATH); /* ".." from the root's level */
    check_open(ctx, "nope.txt", TOOL_ENOTFOUND);

    /* tools refuse the same, and never show the secret */
    int rc;
    const char *bad[] = {"{\"path\":\"../outside\"}", "{\"path\":\"/etc/passwd\"}",
                         "{\"path\":\"abs_out\"}", "{\"path\":\"dir_out/secret.txt\"}",
                         "{\"path\":\"a/rel_out\"}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *r = tt_call(ctx, "read_file", bad[i], &rc);
        CHECK_MSG(rc == TOOL_EPATH, "%s -> %d", bad[i], rc);
        CHECK(r && !strcmp(tt_err_code(r), "path_refused"));
        char *s = json_dumps(r, 0);
        CHECK(!strstr(s, "top secret"));
        free(s);
        json_decref(r);
    }
    /* writes through links are refused and leave the target alone */
    json_t *r = tt_call(ctx, "create_file",
                        "{\"path\":\"dir_out/new.txt\",\"content\":\"x\"}", &rc);
    CHECK(rc == TOOL_EPATH);
    json_decref(r);
    CHECK(!tt_exists(outside, "new.txt"));
    r = tt_call(ctx, "create_file", "{\"path\":\"abs_out\",\"content\":\"x\",\"overwrite\":true}",
                &rc);
    CHECK(rc == TOOL_EPATH);
    json_decref(r);
    char *sec = tt_read(outside, "secret.txt", NULL);
    CHECK(sec && !strcmp(sec, "top secret\n"));
    free(sec);
    r = tt_call(ctx, "edit_file",
                "{\"path\":\"in_link\",\"old_text\":\"hello\",\"new_text\":\"bye\"}", &rc);
    CHECK_MSG(rc == TOOL_EPATH, "editing through a symlink gave %d", rc);
    json_decref(r);
    /* a search from the root does not follow the link out */
    r = tt_call(ctx, "search", "{\"pattern\":\"top secret\",\"hidden\":true}", &rc);
    CHECK(rc == 0 && json_integer_value(json_object_get(r, "match_count")) == 0);
    json_decref(r);

    tool_ctx_free(ctx);
    tt_rmtree(dir);
    tt_rmtree(outside);
    free(dir);
    free(outside);
    return tt_done("test_tools_paths");
}
