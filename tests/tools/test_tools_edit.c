/* edit_file, create_file, apply_patch: results, diffs, and every failure mode leaving the
 * file byte-for-byte unchanged. */
#include "tt.h"

static tool_ctx *ctx;
static char *dir;

/* Run an edit that must fail with `want`, and check `file` kept its bytes. */
static void expect_fail(const char *tool, const char *args, int want, const char *file) {
    size_t n0 = 0, n1 = 0;
    char *before = tt_read(dir, file, &n0);
    int rc;
    json_t *r = tt_call(ctx, tool, args, &rc);
    CHECK_MSG(rc == want, "%s %s: got %d want %d", tool, args, rc, want);
    CHECK(r && json_object_get(r, "error"));
    json_decref(r);
    char *after = tt_read(dir, file, &n1);
    CHECK_MSG(before && after && n0 == n1 && !memcmp(before, after, n0), "%s changed", file);
    free(before);
    free(after);
}

static void expect_content(const char *file, const char *want) {
    char *got = tt_read(dir, file, NULL);
    CHECK_MSG(got && !strcmp(got, want), "%s is [%s], want [%s]", file, got ? got : "(none)",
              want);
    free(got);
}

static bool no_temp_files(void) {
    json_t *r;
    int rc;
    r = tt_call(ctx, "find_files", "{\"glob\":\"*.tmp\",\"hidden\":true,\"no_ignore\":true}", &rc);
    bool ok = rc == 0 && json_array_size(json_object_get(r, "files")) == 0;
    json_decref(r);
    return ok;
}

int main(void) {
    dir = tt_tmpdir();
    ctx = tt_ctx(dir, false, 0);
    tt_puts(dir, "f.c", "int a = 1;\nint b = 2;\nint a2 = 1;\n");
    char path[8300];
    snprintf(path, sizeof path, "%s/f.c", dir);
    chmod(path, 0751);
    int rc;
    json_t *r = tt_call(ctx, "edit_file",
                        "{\"path\":\"f.c\",\"old_text\":\"int b = 2;\",\"new_text\":\"int b = 3;\"}",
                        &rc);
    CHECK(rc == 0);
    CHECK(!strcmp(json_string_value(json_object_get(r, "match")), "exact"));
    const char *d = json_string_value(json_object_get(r, "diff"));
    CHECK(d && strstr(d, "-int b = 2;") && strstr(d, "+int b = 3;"));
    json_decref(r);
    expect_content("f.c", "int a = 1;\nint b = 3;\nint a2 = 1;\n");
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 07777) == 0751); /* mode kept */

    /* failure modes: absent, ambiguous, binary, too large, missing file */
    expect_fail("edit_file", "{\"path\":\"f.c\",\"old_text\":\"int c\",\"new_text\":\"x\"}",
                TOOL_ENOTFOUND, "f.c");
    expect_fail("edit_file", "{\"path\":\"f.c\",\"old_text\":\" = 1;\",\"new_text\":\"x\"}",
                TOOL_ECONFLICT, "f.c");
    tt_write(dir, "bin.dat", "abc\0def", 7);
    expect_fail("edit_file", "{\"path\":\"bin.dat\",\"old_text\":\"abc\",\"new_text\":\"x\"}",
                TOOL_EBINARY, "bin.dat");
    {
        tool_options o = TOOL_OPTIONS_INIT;
        o.root = dir;
        o.auto_checkpoint = false;
        o.max_file_bytes = 16;
        tool_ctx *small;
        CHECK(tool_ctx_new(&small, &o) == 0);
        tool_ctx *keep = ctx;
        ctx = small;
        expect_fail("edit_file", "{\"path\":\"f.c\",\"old_text\":\"int b\",\"new_text\":\"x\"}",
                    TOOL_ETOOLARGE, "f.c");
        ctx = keep;
        tool_ctx_free(small);
    }
    r = tt_call(ctx, "edit_file", "{\"path\":\"nope.c\",\"old_text\":\"a\",\"new_text\":\"b\"}", &rc);
    CHECK(rc == TOOL_ENOTFOUND);
    json_decref(r);
    /* replace_all */
    r = tt_call(ctx, "edit_file", "{\"path\":\"f.c\",\"old_text\":\" = 1;\",\"new_text\":\" = 9;\","
                                  "\"replace_all\":true}", &rc);
    CHECK(rc == 0 && json_integer_value(json_object_get(r, "replacements")) == 2);
    json_decref(r);
    expect_content("f.c", "int a = 9;\nint b = 3;\nint a2 = 9;\n");

    /* CRLF file, LF old_text: exact-only fails and leaves it; the fallback matches, reports
     * what it matched, and keeps CRLF line endings */
    tt_puts(dir, "w.txt", "if (x) {\r\n    call(1);\r\n    call(2);\r\n}\r\n");
    expect_fail("edit_file", "{\"path\":\"w.txt\",\"old_text\":\"    call(1);\\n    call(2);\\n\","
                             "\"new_text\":\"    call(3);\\n\",\"fuzzy\":false}",
                TOOL_ENOTFOUND, "w.txt");
    r = tt_call(ctx, "edit_file", "{\"path\":\"w.txt\",\"old_text\":\"call(1);\\n  call(2);\","
                                  "\"new_text\":\"    call(3);\\n    call(4);\"}", &rc);
    CHECK(rc == 0);
    CHECK(r && !strcmp(json_string_value(json_object_get(r, "match")), "whitespace-insensitive"));
    CHECK(r && !strcmp(json_string_value(json_object_get(r, "matched_text")),
                       "    call(1);\r\n    call(2);"));
    json_decref(r);
    expect_content("w.txt", "if (x) {\r\n    call(3);\r\n    call(4);\r\n}\r\n");
    /* old and new text both missing the indentation the file has: the new text gets it */
    tt_puts(dir, "ind.py", "def f():\n    a = 1\n\n    b = 2\nc = 3\n");
    r = tt_call(ctx, "edit_file", "{\"path\":\"ind.py\",\"old_text\":\"a = 1\\n\\nb = 2\\n\","
                                  "\"new_text\":\"a = 10\\n\\nb = 20\\nb2 = 21\\n\"}", &rc);
    CHECK_MSG(rc == 0, "%s", tool_error_last());
    CHECK(r && json_integer_value(json_object_get(r, "reindented")) == 4);
    json_decref(r);
    expect_content("ind.py", "def f():\n    a = 10\n\n    b = 20\n    b2 = 21\nc = 3\n");
    /* the fallback is refused when ambiguous */
    tt_puts(dir, "amb.txt", "  x();\ny();\n\tx();\ny();\n");
    expect_fail("edit_file", "{\"path\":\"amb.txt\",\"old_text\":\"x();\\ny();\",\"new_text\":\"z\"}",
                TOOL_ECONFLICT, "amb.txt");

    /* create_file */
    r = tt_call(ctx, "create_file", "{\"path\":\"new/dir/n.txt\",\"content\":\"hi\\n\"}", &rc);
    CHECK(rc == 0 && json_is_true(json_object_get(r, "created")));
    CHECK(strstr(json_string_value(json_object_get(r, "diff")), "+hi"));
    json_decref(r);
    expect_content("new/dir/n.txt", "hi\n");
    expect_fail("create_file", "{\"path\":\"new/dir/n.txt\",\"content\":\"other\"}", TOOL_ECONFLICT,
                "new/dir/n.txt");
    r = tt_call(ctx, "create_file", "{\"path\":\"new/dir/n.txt\",\"content\":\"other\","
                                    "\"overwrite\":true}", &rc);
    CHECK(rc == 0 && json_is_false(json_object_get(r, "created")));
    json_decref(r);
    expect_content("new/dir/n.txt", "other");

    /* apply_patch: two files, one hunk shifted by lines added above it, a new file, a delete */
    tt_puts(dir, "p1.txt", "extra 1\nextra 2\nl1\nl2\nl3\nl4\nl5\n");
    tt_puts(dir, "p2.txt", "keep\nold\n");
    tt_puts(dir, "gone.txt", "bye\n");
    const char *patch =
        "{\"patch\":\"diff --git a/p1.txt b/p1.txt\\n--- a/p1.txt\\n+++ b/p1.txt\\n"
        "@@ -2,3 +2,3 @@\\n l2\\n-l3\\n+L3\\n l4\\n"
        "--- a/p2.txt\\n+++ b/p2.txt\\n@@ -1,2 +1,2 @@\\n keep\\n-old\\n+new\\n"
        "--- /dev/null\\n+++ b/made.txt\\n@@ -0,0 +1,2 @@\\n+m1\\n+m2\\n"
        "diff --git a/gone.txt b/gone.txt\\ndeleted file mode 100644\\n--- a/gone.txt\\n"
        "+++ /dev/null\\n@@ -1 +0,0 @@\\n-bye\\n\"}";
    r = tt_call(ctx, "apply_patch", patch, &rc);
    CHECK_MSG(rc == 0, "%s", tool_error_last());
    CHECK(json_array_size(json_object_get(r, "files")) == 4);
    json_decref(r);
    expect_content("p1.txt", "extra 1\nextra 2\nl1\nl2\nL3\nl4\nl5\n");
    expect_content("p2.txt", "keep\nnew\n");
    expect_content("made.txt", "m1\nm2\n");
    CHECK(!tt_exists(dir, "gone.txt"));
    /* a patch whose second file does not apply writes nothing at all */
    const char *bad =
        "{\"patch\":\"--- a/p2.txt\\n+++ b/p2.txt\\n@@ -1,2 +1,2 @@\\n keep\\n-new\\n+newer\\n"
        "--- a/p1.txt\\n+++ b/p1.txt\\n@@ -1,1 +1,1 @@\\n-nothing like this\\n+x\\n\"}";
    expect_fail("apply_patch", bad, TOOL_ECONFLICT, "p2.txt");
    expect_content("p1.txt", "extra 1\nextra 2\nl1\nl2\nL3\nl4\nl5\n");
    expect_fail("apply_patch", "{\"patch\":\"this is not a diff\"}", TOOL_EINVAL, "p2.txt");
    expect_fail("apply_patch", "{\"patch\":\"--- a/../x\\n+++ b/../x\\n@@ -1 +1 @@\\n-a\\n+b\\n\"}",
                TOOL_EPATH, "p2.txt");
    /* no newline at end of file, both ways */
    tt_puts(dir, "ne.txt", "a\nb");
    r = tt_call(ctx, "apply_patch", "{\"patch\":\"--- a/ne.txt\\n+++ b/ne.txt\\n@@ -1,2 +1,2 @@\\n"
                                    " a\\n-b\\n\\\\ No newline at end of file\\n+c\\n\"}", &rc);
    CHECK_MSG(rc == 0, "%s", tool_error_last());
    json_decref(r);
    expect_content("ne.txt", "a\nc\n");
    CHECK(no_temp_files());
    tool_ctx_free(ctx);
    tt_rmtree(dir);
    free(dir);
    return tt_done("test_tools_edit");
}
