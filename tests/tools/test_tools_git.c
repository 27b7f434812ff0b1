/* git tools on real repositories made here: status, diff, log, show, blame, branch, add,
 * commit; checkpoint-then-restore giving back worktree, index and HEAD exactly; and a hostile
 * repository config (hooks, fsmonitor, filter drivers, sshCommand) that never runs. */
#include "tt.h"

#include <ftw.h>
#include <git2.h>

static char *dir;
static tool_ctx *ctx;

static json_t *call(const char *tool, const char *args, int want) {
    int rc;
    json_t *r = tt_call(ctx, tool, args, &rc);
    CHECK_MSG(rc == want, "%s %s: %d (want %d): %s", tool, args, rc, want, tool_error_last());
    return r;
}

static void run_ok(const char *tool, const char *args) {
    json_decref(call(tool, args, 0));
}

/* ---- snapshots of the worktree and the index, for byte-for-byte comparison ---- */
static json_t *snap_files;
static size_t snap_skip;

static int snap_cb(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)ftw;
    const char *rel = p + snap_skip;
    if (!strncmp(rel, ".git", 4) && (rel[4] == '/' || !rel[4])) return 0;
    if (!*rel || flag == FTW_D || flag == FTW_DP) return 0;
    char buf[65536];
    char key[4200];
    snprintf(key, sizeof key, "%s", rel);
    if (S_ISLNK(st->st_mode)) {
        ssize_t n = readlink(p, buf, sizeof buf - 1);
        buf[n < 0 ? 0 : n] = '\0';
        json_object_set_new(snap_files, key, json_pack("{s:s, s:s}", "type", "link", "to", buf));
    } else if (S_ISREG(st->st_mode)) {
        FILE *f = fopen(p, "rb");
        size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
        if (f) fclose(f);
        json_object_set_new(snap_files, key, json_pack("{s:s, s:i, s:s%}", "type", "file", "x",
                                                       (st->st_mode & 0100) != 0, "data", buf, n));
    }
    return 0;
}

static json_t *snapshot(void) {
    snap_files = json_object();
    snap_skip = strlen(dir) + 1;
    nftw(dir, snap_cb, 32, FTW_PHYS);
    /* the index: path, mode, id, stage */
    git_index *idx;
    char ip[8300];
    snprintf(ip, sizeof ip, "%s/.git/index", dir);
    json_t *ix = json_array();
    if (git_index_open(&idx, ip) == 0) {
        for (size_t i = 0; i < git_index_entrycount(idx); i++) {
            const git_index_entry *e = git_index_get_byindex(idx, i);
            char id[GIT_OID_HEXSZ + 1];
            git_oid_tostr(id, sizeof id, &e->id);
            json_array_append_new(ix, json_pack("{s:s, s:i, s:s, s:i}", "path", e->path, "mode",
                                                (int)e->mode, "id", id, "stage",
                                                git_index_entry_stage(e)));
        }
        git_index_free(idx);
    }
    /* HEAD */
    git_repository *repo;
    json_t *head = json_null();
    if (git_repository_open(&repo, dir) == 0) {
        git_reference *h;
        if (git_reference_lookup(&h, repo, "HEAD") == 0) {
            git_reference *res = NULL;
            const char *sym = git_reference_symbolic_target(h);
            char id[GIT_OID_HEXSZ + 1] = "";
            if (git_reference_resolve(&res, h) == 0) {
                git_oid_tostr(id, sizeof id, git_reference_target(res));
                git_reference_free(res);
            }
            json_decref(head);
            head = json_pack("{s:s, s:s}", "ref", sym ? sym : "", "id", id);
            git_reference_free(h);
        }
        git_repository_free(repo);
    }
    return json_pack("{s:o, s:o, s:o}", "files", snap_files, "index", ix, "head", head);
}

static void sh_file(const char *rel, const char *text, int mode) {
    tt_puts(dir, rel, text);
    char p[8300];
    snprintf(p, sizeof p, "%s/%s", dir, rel);
    chmod(p, (mode_t)mode);
}

static void hostile_config(void) {
    /* Every one of these would run `touch PWNED` if anything executed it. */
    const char *touch = "#!/bin/sh\ntouch \"$(git rev-parse --show-toplevel 2>/dev/null || pwd)"
                        "/PWNED\"\ntouch /tmp/spark-tools-PWNED\n";
    static const char *const hooks[] = {"pre-commit", "post-commit", "commit-msg",
                                        "prepare-commit-msg", "post-checkout", "pre-auto-gc",
                                        "post-index-change", "reference-transaction", NULL};
    for (int i = 0; hooks[i]; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, ".git/hooks/%s", hooks[i]);
        sh_file(rel, touch, 0755);
    }
    sh_file(".git/evil.sh", touch, 0755);
    git_repository *repo;
    git_config *cfg;
    CHECK(git_repository_open(&repo, dir) == 0);
    CHECK(git_repository_config(&cfg, repo) == 0);
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "%s/.git/evil.sh", dir);
    git_config_set_string(cfg, "core.fsmonitor", cmd);
    git_config_set_string(cfg, "core.hooksPath", ".git/hooks");
    git_config_set_string(cfg, "core.sshCommand", cmd);
    git_config_set_string(cfg, "core.pager", cmd);
    git_config_set_string(cfg, "core.editor", cmd);
    git_config_set_string(cfg, "filter.evil.clean", cmd);
    git_config_set_string(cfg, "filter.evil.smudge", cmd);
    git_config_set_string(cfg, "filter.evil.process", cmd);
    git_config_set_string(cfg, "diff.evil.textconv", cmd);
    git_config_set_string(cfg, "gpg.program", cmd);
    git_config_set_bool(cfg, "commit.gpgsign", 1);
    git_config_set_string(cfg, "user.name", "Test User");
    git_config_set_string(cfg, "user.email", "test@example.com");
    git_config_free(cfg);
    git_repository_free(repo);
    tt_puts(dir, ".gitattributes", "*.txt filter=evil diff=evil\n");
}

static void check_not_pwned(const char *when) {
    CHECK_MSG(!tt_exists(dir, "PWNED") && access("/tmp/spark-tools-PWNED", F_OK) != 0,
              "something ran a hostile command (%s)", when);
}

static const char *jstr(json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

int main(void) {
    git_libgit2_init();
    unlink("/tmp/spark-tools-PWNED");
    dir = tt_tmpdir();
    /* HOME elsewhere: the author must come from this repository's config */
    char *home = tt_tmpdir();
    setenv("HOME", home, 1);
    setenv("XDG_CONFIG_HOME", home, 1);
    git_repository *repo;
    CHECK(git_repository_init(&repo, dir, 0) == 0);
    git_repository_free(repo);
    hostile_config();
    ctx = tt_ctx(dir, false, 0);
    int rc;

    /* not a repository: a clear error */
    {
        char *plain = tt_tmpdir();
        tool_ctx *p = tt_ctx(plain, false, 0);
        json_t *r = tt_call(p, "git_status", "{}", &rc);
        CHECK(rc == TOOL_EGIT && strstr(json_string_value(json_object_get(json_object_get(r,
                                         "error"), "message")), "not in a git repository"));
        json_decref(r);
        tool_ctx_free(p);
        tt_rmtree(plain);
        free(plain);
    }

    /* first commit */
    tt_puts(dir, "a.txt", "alpha\nbeta\ngamma\n");
    tt_puts(dir, "dir/b.txt", "bee\n");
    sh_file("run.sh", "#!/bin/sh\necho hi\n", 0755);
    char lp[8300];
    snprintf(lp, sizeof lp, "%s/link", dir);
    CHECK(symlink("a.txt", lp) == 0);
    tt_puts(dir, ".gitignore", "*.log\n");
    json_t *r = call("git_status", "{}", 0);
    CHECK(json_array_size(json_object_get(r, "untracked")) == 6);
    CHECK(!strcmp(jstr(r, "branch"), "master") || !strcmp(jstr(r, "branch"), "main"));
    json_decref(r);
    r = call("git_log", "{}", TOOL_ENOTFOUND);
    json_decref(r);
    run_ok("git_add", "{\"all\":true}");
    r = call("git_commit", "{\"message\":\"first commit\\n\\nbody\"}", 0);
    CHECK(!strcmp(jstr(json_object_get(r, "author"), "name"), "Test User"));
    CHECK(json_integer_value(json_object_get(r, "files_changed")) == 6);
    char first[64];
    snprintf(first, sizeof first, "%s", jstr(r, "id"));
    json_decref(r);
    check_not_pwned("first commit");
    r = call("git_commit", "{\"message\":\"empty\"}", TOOL_EINVAL);
    json_decref(r);

    /* second commit touching one file */
    tt_puts(dir, "second.txt", "two\n");
    run_ok("git_add", "{\"paths\":[\"second.txt\"]}");
    run_ok("git_commit", "{\"message\":\"second\"}");
    r = call("git_log", "{}", 0);
    json_t *commits = json_object_get(r, "commits");
    CHECK(json_array_size(commits) == 2);
    CHECK(!strcmp(jstr(json_array_get(commits, 0), "summary"), "second"));
    CHECK(!strcmp(jstr(json_array_get(commits, 1), "id"), first));
    json_decref(r);
    r = call("git_log", "{\"paths\":[\"a.txt\"]}", 0);
    CHECK(json_array_size(json_object_get(r, "commits")) == 1);
    json_decref(r);
    r = call("git_log", "{\"max_count\":1}", 0);
    CHECK(json_array_size(json_object_get(r, "commits")) == 1);
    json_decref(r);
    r = call("git_show", "{\"rev\":\"HEAD\"}", 0);
    CHECK(strstr(jstr(r, "diff"), "+two"));
    CHECK(strstr(jstr(json_object_get(r, "commit"), "message"), "second"));
    json_decref(r);
    r = call("git_show", "{\"rev\":\"HEAD~1:a.txt\"}", 0);
    CHECK(!strcmp(jstr(r, "content"), "alpha\nbeta\ngamma\n"));
    json_decref(r);
    r = call("git_show", "{\"rev\":\"no-such-rev\"}", TOOL_ENOTFOUND);
    json_decref(r);
    r = call("git_diff", "{\"mode\":\"refs\",\"from\":\"HEAD~1\",\"to\":\"HEAD\"}", 0);
    CHECK(json_array_size(json_object_get(r, "files")) == 1 && strstr(jstr(r, "diff"), "+two"));
    json_decref(r);

    /* staged, unstaged and untracked changes */
    tt_puts(dir, "a.txt", "alpha\nBETA\ngamma\n");
    run_ok("git_add", "{\"paths\":[\"a.txt\"]}");
    tt_puts(dir, "a.txt", "alpha\nBETA\ngamma\ndelta\n");
    snprintf(lp, sizeof lp, "%s/dir/b.txt", dir);
    unlink(lp);
    tt_puts(dir, "u.txt", "untracked\n");
    tt_puts(dir, "dir/nested/n.txt", "nested untracked\n");
    tt_puts(dir, "x.log", "ignored\n");
    r = call("git_status", "{}", 0);
    char *s = json_dumps(r, JSON_COMPACT);
    CHECK_MSG(strstr(s, "\"staged\":[{\"path\":\"a.txt\",\"status\":\"modified\"}]") &&
              strstr(s, "{\"path\":\"dir/b.txt\",\"status\":\"deleted\"}") &&
              strstr(s, "\"untracked\":[\"dir/nested/n.txt\",\"u.txt\"]") && !strstr(s, "x.log"),
              "%s", s);
    free(s);
    json_decref(r);
    r = call("git_diff", "{}", 0);
    CHECK(strstr(jstr(r, "diff"), "+delta") && !strstr(jstr(r, "diff"), "+BETA"));
    json_decref(r);
    r = call("git_diff", "{\"untracked\":true}", 0);
    CHECK(strstr(jstr(r, "diff"), "+untracked") && strstr(jstr(r, "diff"), "+nested untracked"));
    json_decref(r);
    r = call("git_diff", "{\"mode\":\"staged\"}", 0);
    CHECK(strstr(jstr(r, "diff"), "+BETA") && !strstr(jstr(r, "diff"), "+delta"));
    json_decref(r);
    r = call("git_diff", "{\"mode\":\"head\",\"paths\":[\"a.txt\"]}", 0);
    CHECK(strstr(jstr(r, "diff"), "+BETA") && strstr(jstr(r, "diff"), "+delta") &&
          json_array_size(json_object_get(r, "files")) == 1);
    json_decref(r);
    r = call("git_blame", "{\"path\":\"a.txt\",\"start_line\":1,\"end_line\":2}", 0);
    json_t *lines = json_object_get(r, "lines");
    CHECK(json_array_size(lines) == 2);
    CHECK(!strncmp(jstr(json_array_get(lines, 0), "commit"), first, 12));
    CHECK(!strcmp(jstr(json_array_get(lines, 0), "author"), "Test User"));
    CHECK(!strcmp(jstr(json_array_get(lines, 1), "commit"), "uncommitted"));
    json_decref(r);
    check_not_pwned("status/diff/blame");

    /* checkpoint, then make a mess, then restore: exactly the same state */
    json_t *before = snapshot();
    char *ref = NULL;
    CHECK_MSG(tool_checkpoint_create(ctx, "test", &ref) == 0, "%s", tool_error_last());
    json_t *after_cp = snapshot();
    CHECK_MSG(json_equal(before, after_cp), "checkpoint changed the worktree or index");
    json_decref(after_cp);
    run_ok("edit_file", "{\"path\":\"a.txt\",\"old_text\":\"delta\",\"new_text\":\"DELTA\"}");
    run_ok("create_file", "{\"path\":\"brand/new.txt\",\"content\":\"new\\n\"}");
    snprintf(lp, sizeof lp, "%s/u.txt", dir);
    unlink(lp);
    snprintf(lp, sizeof lp, "%s/run.sh", dir);
    chmod(lp, 0644);
    snprintf(lp, sizeof lp, "%s/link", dir);
    unlink(lp);
    tt_puts(dir, "link", "now a file\n");
    run_ok("git_add", "{\"all\":true}");
    run_ok("git_commit", "{\"message\":\"agent commit\"}");
    tt_puts(dir, "later.log", "ignored, created later\n");
    json_t *messy = snapshot();
    CHECK(!json_equal(before, messy));
    json_decref(messy);
    char *summary = NULL;
    CHECK_MSG(tool_checkpoint_restore(ctx, NULL, &summary) == 0, "%s", tool_error_last());
    CHECK(summary && strstr(summary, ref));
    free(summary);
    json_t *restored = snapshot();
    json_object_del(json_object_get(restored, "files"), "later.log"); /* ignored: left alone */
    if (!json_equal(before, restored)) {
        char *a = json_dumps(before, JSON_COMPACT | JSON_SORT_KEYS);
        char *b = json_dumps(restored, JSON_COMPACT | JSON_SORT_KEYS);
        CHECK_MSG(0, "restore differs:\nbefore  %s\nrestored %s", a, b);
        free(a);
        free(b);
    }
    json_decref(restored);
    free(ref);
    check_not_pwned("checkpoint/restore");
    /* undo can be repeated: a second restore of the same checkpoint changes nothing */
    CHECK(tool_checkpoint_restore(ctx, NULL, &summary) == 0);
    CHECK_MSG(summary && strstr(summary, "\"written\":[]") && strstr(summary, "\"removed\":[]"), "%s", summary);
    free(summary);

    /* a file too large to snapshot is named, not copied, and a restore never removes it */
    {
        char bp[8300];
        snprintf(bp, sizeof bp, "%s/big.bin", dir);
        int fd = open(bp, O_CREAT | O_WRONLY | O_TRUNC, 0644);
        CHECK(fd >= 0 && ftruncate(fd, (off_t)65 << 20) == 0); /* sparse: instant */
        if (fd >= 0) close(fd);
        char *bref = NULL;
        CHECK_MSG(tool_checkpoint_create(ctx, "big", &bref) == 0, "%s", tool_error_last());
        tt_puts(dir, "after-big.txt", "x\n");
        CHECK(tool_checkpoint_restore(ctx, bref, &summary) == 0);
        struct stat st;
        CHECK(stat(bp, &st) == 0 && st.st_size == (off_t)65 << 20);
        CHECK(!tt_exists(dir, "after-big.txt"));
        free(summary);
        free(bref);
        unlink(bp);
    }

    /* branches: create, switch refused over local changes, switch when clean */
    r = call("git_branch", "{\"action\":\"create\",\"name\":\"feature\"}", 0);
    json_decref(r);
    r = call("git_branch", "{\"action\":\"create\",\"name\":\"feature\"}", TOOL_ECONFLICT);
    json_decref(r);
    run_ok("git_add", "{\"all\":true}");
    run_ok("git_commit", "{\"message\":\"everything\"}");
    r = call("git_branch", "{\"action\":\"switch\",\"name\":\"feature\"}", 0);
    json_decref(r);
    r = call("git_status", "{}", 0);
    CHECK(!strcmp(jstr(r, "branch"), "feature") && json_is_true(json_object_get(r, "clean")));
    json_decref(r);
    tt_puts(dir, "a.txt", "local change\n");
    r = call("git_branch", "{\"action\":\"switch\",\"name\":\"master\"}", TOOL_ECONFLICT);
    json_decref(r);
    r = call("git_branch", "{\"action\":\"list\"}", 0);
    CHECK(json_array_size(json_object_get(r, "branches")) == 2);
    json_decref(r);
    check_not_pwned("branch");

    /* auto checkpoint: once, before the first mutating call of a context */
    tool_ctx *auto_ctx = tt_ctx(dir, true, 0);
    json_t *x = tt_call(auto_ctx, "git_checkpoint", "{\"action\":\"list\"}", &rc);
    size_t n0 = json_array_size(json_object_get(x, "checkpoints"));
    json_decref(x);
    x = tt_call(auto_ctx, "create_file", "{\"path\":\"auto1.txt\",\"content\":\"1\"}", &rc);
    json_decref(x);
    x = tt_call(auto_ctx, "create_file", "{\"path\":\"auto2.txt\",\"content\":\"2\"}", &rc);
    json_decref(x);
    x = tt_call(auto_ctx, "git_checkpoint", "{\"action\":\"list\"}", &rc);
    CHECK_MSG(json_array_size(json_object_get(x, "checkpoints")) == n0 + 1, "%zu vs %zu",
              json_array_size(json_object_get(x, "checkpoints")), n0);
    json_decref(x);
    x = tt_call(auto_ctx, "git_checkpoint", "{\"action\":\"restore\"}", &rc);
    CHECK(rc == 0);
    json_decref(x);
    CHECK(!tt_exists(dir, "auto1.txt") && !tt_exists(dir, "auto2.txt"));
    char *sc = tt_read(dir, "a.txt", NULL);
    CHECK(sc && !strcmp(sc, "local change\n"));
    free(sc);
    tool_ctx_free(auto_ctx);
    check_not_pwned("end");

    json_decref(before);
    tool_ctx_free(ctx);
    tt_rmtree(dir);
    tt_rmtree(home);
    free(dir);
    free(home);
    git_libgit2_shutdown();
    return tt_done("test_tools_git");
}
