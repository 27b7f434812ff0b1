/* git tools through libgit2, in process. libgit2 runs no hooks, no fsmonitor, no external
 * filter drivers and no ssh command, so a hostile repository config cannot run anything. */
#include "tool_int.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int tool_repo(tool_ctx *ctx, git_repository **out) {
    *out = NULL;
    if (!ctx->repo && !ctx->repo_tried) {
        ctx->repo_tried = true;
        git_repository *r = NULL;
        int rc = git_repository_open_ext(&r, ctx->root, 0, NULL);
        if (rc == 0 && git_repository_is_bare(r)) {
            git_repository_free(r);
            rc = GIT_ENOTFOUND;
        }
        if (rc == 0) {
            const char *wd = git_repository_workdir(r); /* ends with '/' */
            size_t wl = strlen(wd);
            char *pre = NULL;
            size_t rl = strlen(ctx->root);
            if (rl + 1 >= wl && !strncmp(ctx->root, wd, wl - 1)) {
                pre = rl + 1 > wl ? malloc(rl - wl + 3) : strdup("");
                if (pre && rl + 1 > wl) {
                    memcpy(pre, ctx->root + wl, rl - wl + 1);
                    strcat(pre, "/");
                }
            }
            if (!pre) {
                git_repository_free(r);
                return tool_err(TOOL_EGIT, "cannot place the workspace inside its repository");
            }
            ctx->repo = r;
            ctx->repo_prefix = pre;
        } else {
            git_error_clear();
        }
    }
    if (!ctx->repo) return tool_err(TOOL_EGIT, "the workspace %s is not in a git repository",
                                    ctx->root);
    *out = ctx->repo;
    return 0;
}

/* Workspace-relative path -> repository-relative (caller frees). */
static int repo_path(tool_ctx *ctx, const char *user, char **out) {
    char *rel;
    int rc = tool_path_clean(ctx, user, &rel);
    if (rc < 0) return rc;
    size_t pl = strlen(ctx->repo_prefix);
    if (!strcmp(rel, ".")) {
        *out = pl ? strndup(ctx->repo_prefix, pl - 1) : strdup("");
    } else {
        *out = malloc(pl + strlen(rel) + 1);
        if (*out) {
            memcpy(*out, ctx->repo_prefix, pl);
            strcpy(*out + pl, rel);
        }
    }
    free(rel);
    return *out ? 0 : tool_err(TOOL_ENOMEM, "out of memory");
}

/* pathspec from args.paths; strings live in the returned array (free with free_spec). */
static int make_spec(tool_ctx *ctx, json_t *paths, git_strarray *spec) {
    spec->count = 0;
    spec->strings = NULL;
    size_t n = json_array_size(paths);
    if (!n) return 0;
    spec->strings = calloc(n, sizeof(char *));
    if (!spec->strings) return tool_err(TOOL_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        int rc = repo_path(ctx, json_string_value(json_array_get(paths, i)), &spec->strings[i]);
        spec->count = i + 1;
        if (rc < 0) return rc;
        if (!spec->strings[i][0]) { /* the root: everything */
            free(spec->strings[i]);
            spec->strings[i] = strdup("*");
        }
    }
    return 0;
}

static void free_spec(git_strarray *spec) {
    for (size_t i = 0; i < spec->count; i++) free(spec->strings[i]);
    free(spec->strings);
    spec->strings = NULL;
    spec->count = 0;
}

static json_t *oid_json(const git_oid *id) {
    char s[GIT_OID_HEXSZ + 1];
    git_oid_tostr(s, sizeof s, id);
    return json_string(s);
}

static json_t *time_json(git_time_t t, int offset_min) {
    time_t tt = (time_t)t + offset_min * 60;
    struct tm tm;
    gmtime_r(&tt, &tm);
    char s[64];
    snprintf(s, sizeof s, "%04d-%02d-%02dT%02d:%02d:%02d%c%02d:%02d", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             offset_min < 0 ? '-' : '+', abs(offset_min) / 60, abs(offset_min) % 60);
    return json_string(s);
}

static json_t *branch_json(git_repository *repo) {
    git_reference *head = NULL;
    int rc = git_repository_head(&head, repo);
    json_t *j;
    if (rc == GIT_EUNBORNBRANCH || rc == GIT_ENOTFOUND) {
        git_reference *sym = NULL;
        j = json_string("(no commits yet)");
        if (git_reference_lookup(&sym, repo, "HEAD") == 0 && git_reference_symbolic_target(sym)) {
            const char *t = git_reference_symbolic_target(sym);
            json_decref(j);
            j = json_string(!strncmp(t, "refs/heads/", 11) ? t + 11 : t);
        }
        git_reference_free(sym);
        git_error_clear();
        return j;
    }
    if (rc < 0) {
        git_error_clear();
        return json_null();
    }
    if (git_repository_head_detached(repo)) {
        char s[64] = "detached at ";
        git_oid_tostr(s + 12, 13, git_reference_target(head));
        j = json_string(s);
    } else {
        j = json_string(git_reference_shorthand(head));
    }
    git_reference_free(head);
    return j;
}

static const char *delta_name(git_delta_t s) {
    switch (s) {
    case GIT_DELTA_ADDED: return "added";
    case GIT_DELTA_DELETED: return "deleted";
    case GIT_DELTA_MODIFIED: return "modified";
    case GIT_DELTA_RENAMED: return "renamed";
    case GIT_DELTA_COPIED: return "copied";
    case GIT_DELTA_TYPECHANGE: return "typechange";
    case GIT_DELTA_UNTRACKED: return "untracked";
    case GIT_DELTA_CONFLICTED: return "conflicted";
    default: return "changed";
    }
}

int tool_git_status(tool_ctx *ctx, json_t *args, json_t *res) {
    git_repository *repo;
    int rc = tool_repo(ctx, &repo);
    if (rc < 0) return rc;
    git_status_options o;
    git_status_options_init(&o, GIT_STATUS_OPTIONS_VERSION);
    o.show = GIT_STATUS_SHOW_INDEX_AND_WORKDIR;
    o.flags = GIT_STATUS_OPT_INCLUDE_UNTRACKED | GIT_STATUS_OPT_RECURSE_UNTRACKED_DIRS |
              GIT_STATUS_OPT_RENAMES_HEAD_TO_INDEX | GIT_STATUS_OPT_SORT_CASE_SENSITIVELY;
    if ((rc = make_spec(ctx, json_object_get(args, "paths"), &o.pathspec)) < 0) {
        free_spec(&o.pathspec);
        return rc;
    }
    git_status_list *list = NULL;
    rc = git_status_list_new(&list, repo, &o);
    free_spec(&o.pathspec);
    if (rc < 0) return tool_err_git(rc, "status");
    json_t *staged = json_array(), *unstaged = json_array(), *untracked = json_array(),
           *conflicted = json_array();
    size_t n = git_status_list_entrycount(list);
    for (size_t i = 0; i < n; i++) {
        const git_status_entry *e = git_status_byindex(list, i);
        if (e->status & GIT_STATUS_CONFLICTED) {
            const git_diff_delta *d = e->index_to_workdir ? e->index_to_workdir : e->head_to_index;
            if (d) json_array_append_new(conflicted, json_string(d->new_file.path));
            continue;
        }
        if (e->head_to_index) {
            const git_diff_delta *d = e->head_to_index;
            json_t *x = json_pack("{s:s, s:s}", "path", d->new_file.path, "status",
                                  delta_name(d->status));
            if (d->status == GIT_DELTA_RENAMED)
                json_object_set_new(x, "from", json_string(d->old_file.path));
            json_array_append_new(staged, x);
        }
        if (e->index_to_workdir) {
            const git_diff_delta *d = e->index_to_workdir;
            if (d->status == GIT_DELTA_UNTRACKED)
                json_array_append_new(untracked, json_string(d->new_file.path));
            else if (d->status != GIT_DELTA_IGNORED)
                json_array_append_new(unstaged, json_pack("{s:s, s:s}", "path", d->new_file.path,
                                                          "status", delta_name(d->status)));
        }
    }
    git_status_list_free(list);
    json_object_set_new(res, "branch", branch_json(repo));
    json_object_set_new(res, "staged", staged);
    json_object_set_new(res, "unstaged", unstaged);
    json_object_set_new(res, "untracked", untracked);
    if (json_array_size(conflicted)) json_object_set_new(res, "conflicted", conflicted);
    else json_decref(conflicted);
    json_object_set_new(res, "clean", json_boolean(n == 0));
    if (ctx->repo_prefix[0])
        json_object_set_new(res, "note", json_string("paths are relative to the repository root"));
    return 0;
}

static int tree_of(git_repository *repo, const char *spec, git_tree **out) {
    git_object *obj = NULL;
    int rc = git_revparse_single(&obj, repo, spec);
    if (rc < 0) return tool_err_git(rc, spec);
    rc = git_object_peel((git_object **)out, obj, GIT_OBJECT_TREE);
    git_object_free(obj);
    return rc < 0 ? tool_err_git(rc, spec) : 0;
}

/* HEAD's tree, or NULL (no error) on an unborn branch. */
static int head_tree(git_repository *repo, git_tree **out) {
    *out = NULL;
    if (git_repository_head_unborn(repo) == 1) return 0;
    return tree_of(repo, "HEAD", out);
}

static int diff_result(git_diff *diff, json_t *res) {
    git_buf buf = {0};
    int rc = git_diff_to_buf(&buf, diff, GIT_DIFF_FORMAT_PATCH);
    if (rc < 0) return tool_err_git(rc, "diff");
    json_t *files = json_array();
    size_t n = git_diff_num_deltas(diff);
    for (size_t i = 0; i < n; i++) {
        const git_diff_delta *d = git_diff_get_delta(diff, i);
        json_array_append_new(files, json_pack("{s:s, s:s}", "path", d->new_file.path, "status",
                                               delta_name(d->status)));
    }
    json_object_set_new(res, "files", files);
    json_object_set_new(res, "diff", tool_json_text(buf.ptr ? buf.ptr : "", buf.size));
    git_buf_dispose(&buf);
    return 0;
}

int tool_git_diff(tool_ctx *ctx, json_t *args, json_t *res) {
    git_repository *repo;
    int rc = tool_repo(ctx, &repo);
    if (rc < 0) return rc;
    const char *mode = tool_arg_str(args, "mode", "worktree");
    git_diff_options o;
    git_diff_options_init(&o, GIT_DIFF_OPTIONS_VERSION);
    o.context_lines = (uint32_t)tool_arg_int(args, "context", 3);
    if (tool_arg_bool(args, "untracked", false))
        o.flags |= GIT_DIFF_INCLUDE_UNTRACKED | GIT_DIFF_RECURSE_UNTRACKED_DIRS |
                   GIT_DIFF_SHOW_UNTRACKED_CONTENT;
    git_tree *a = NULL, *b = NULL;
    git_diff *diff = NULL;
    git_index *idx = NULL;
    if ((rc = make_spec(ctx, json_object_get(args, "paths"), &o.pathspec)) < 0) goto done;
    if (!strcmp(mode, "worktree")) {
        rc = git_diff_index_to_workdir(&diff, repo, NULL, &o);
    } else if (!strcmp(mode, "staged")) {
        if ((rc = head_tree(repo, &a)) < 0) goto done;
        if ((rc = git_repository_index(&idx, repo)) == 0)
            rc = git_diff_tree_to_index(&diff, repo, a, idx, &o);
    } else if (!strcmp(mode, "head")) {
        if ((rc = head_tree(repo, &a)) < 0) goto done;
        rc = git_diff_tree_to_workdir_with_index(&diff, repo, a, &o);
    } else {
        const char *from = tool_arg_str(args, "from", NULL);
        if (!from) {
            rc = tool_err(TOOL_EINVAL, "mode 'refs' needs 'from' (and optionally 'to')");
            goto done;
        }
        if ((rc = tree_of(repo, from, &a)) < 0) goto done;
        const char *to = tool_arg_str(args, "to", NULL);
        if (to) {
            if ((rc = tree_of(repo, to, &b)) < 0) goto done;
            rc = git_diff_tree_to_tree(&diff, repo, a, b, &o);
        } else {
            rc = git_diff_tree_to_workdir_with_index(&diff, repo, a, &o);
        }
    }
    if (rc < 0) {
        rc = tool_err_git(rc, "diff");
        goto done;
    }
    json_object_set_new(res, "mode", json_string(mode));
    rc = diff_result(diff, res);
done:
    free_spec(&o.pathspec);
    git_diff_free(diff);
    git_index_free(idx);
    git_tree_free(a);
    git_tree_free(b);
    return rc;
}

/* The diff of commit c against its first parent (or the empty tree). libgit2 status. */
static int commit_diff(git_repository *repo, git_commit *c, const git_diff_options *o,
                       git_diff **out) {
    git_tree *t = NULL, *pt = NULL;
    git_commit *p = NULL;
    *out = NULL;
    int rc = git_commit_tree(&t, c);
    if (rc == 0 && git_commit_parentcount(c) > 0 && (rc = git_commit_parent(&p, c, 0)) == 0)
        rc = git_commit_tree(&pt, p);
    if (rc == 0) rc = git_diff_tree_to_tree(out, repo, pt, t, o);
    git_tree_free(t);
    git_tree_free(pt);
    git_commit_free(p);
    return rc;
}

/* Does commit c change anything under pathspec compared with its first parent? */
static int touches(git_repository *repo, git_commit *c, git_diff_options *o) {
    git_diff *d = NULL;
    int rc = commit_diff(repo, c, o, &d);
    int hit = rc == 0 ? git_diff_num_deltas(d) > 0 : rc;
    git_diff_free(d);
    return hit;
}

static json_t *commit_json(const git_commit *c) {
    const git_signature *a = git_commit_author(c);
    json_t *j = json_object();
    json_object_set_new(j, "id", oid_json(git_commit_id(c)));
    json_object_set_new(j, "author", json_string(a->name ? a->name : ""));
    json_object_set_new(j, "email", json_string(a->email ? a->email : ""));
    json_object_set_new(j, "date", time_json(a->when.time, a->when.offset));
    const char *s = git_commit_summary((git_commit *)c);
    json_object_set_new(j, "summary", tool_json_text(s ? s : "", s ? strlen(s) : 0));
    return j;
}

int tool_git_log(tool_ctx *ctx, json_t *args, json_t *res) {
    git_repository *repo;
    int rc = tool_repo(ctx, &repo);
    if (rc < 0) return rc;
    const char *rev = tool_arg_str(args, "rev", "HEAD");
    long max = (long)tool_arg_int(args, "max_count", 20);
    git_revwalk *w = NULL;
    git_object *obj = NULL;
    git_diff_options o;
    git_diff_options_init(&o, GIT_DIFF_OPTIONS_VERSION);
    json_t *commits = json_array();
    if ((rc = make_spec(ctx, json_object_get(args, "paths"), &o.pathspec)) < 0) goto done;
    if ((rc = git_revparse_single(&obj, repo, rev)) < 0) {
        rc = git_repository_head_unborn(repo) == 1 ? tool_err(TOOL_ENOTFOUND, "no commits yet")
                                                   : tool_err_git(rc, rev);
        goto done;
    }
    git_object *peeled = NULL;
    if ((rc = git_object_peel(&peeled, obj, GIT_OBJECT_COMMIT)) < 0) {
        rc = tool_err_git(rc, rev);
        goto done;
    }
    rc = git_revwalk_new(&w, repo);
    if (rc == 0) rc = git_revwalk_sorting(w, GIT_SORT_TIME | GIT_SORT_TOPOLOGICAL);
    if (rc == 0) rc = git_revwalk_push(w, git_object_id(peeled));
    git_object_free(peeled);
    if (rc < 0) {
        rc = tool_err_git(rc, "log");
        goto done;
    }
    git_oid id;
    long scanned = 0;
    while ((long)json_array_size(commits) < max && git_revwalk_next(&id, w) == 0) {
        git_commit *c;
        if (git_commit_lookup(&c, repo, &id) < 0) continue;
        if (++scanned > 200000) {
            git_commit_free(c);
            break;
        }
        if (o.pathspec.count) {
            int t = touches(repo, c, &o);
            if (t <= 0) {
                git_commit_free(c);
                continue;
            }
        }
        json_array_append_new(commits, commit_json(c));
        git_commit_free(c);
    }
    json_object_set_new(res, "commits", commits);
    commits = NULL;
done:
    json_decref(commits);
    free_spec(&o.pathspec);
    git_revwalk_free(w);
    git_object_free(obj);
    return rc;
}

int tool_git_show(tool_ctx *ctx, json_t *args, json_t *res) {
    git_repository *repo;
    int rc = tool_repo(ctx, &repo);
    if (rc < 0) return rc;
    const char *rev = tool_arg_str(args, "rev", "HEAD");
    git_object *obj = NULL;
    if ((rc = git_revparse_single(&obj, repo, rev)) < 0) return tool_err_git(rc, rev);
    if (git_object_type(obj) == GIT_OBJECT_BLOB) {
        const git_blob *b = (const git_blob *)obj;
        const char *data = git_blob_rawcontent(b);
        size_t n = (size_t)git_blob_rawsize(b);
        json_object_set_new(res, "rev", json_string(rev));
        json_object_set_new(res, "bytes", json_integer((json_int_t)n));
        if (tool_is_binary(data, n))
            json_object_set_new(res, "content", json_string("(binary file)"));
        else
            json_object_set_new(res, "content", tool_json_text(data, n));
        git_object_free(obj);
        return 0;
    }
    if (git_object_type(obj) == GIT_OBJECT_TREE) {
        json_t *entries = json_array();
        const git_tree *t = (const git_tree *)obj;
        for (size_t i = 0; i < git_tree_entrycount(t); i++) {
            const git_tree_entry *e = git_tree_entry_byindex(t, i);
            json_array_append_new(entries, json_string(git_tree_entry_name(e)));
        }
        json_object_set_new(res, "entries", entries);
        git_object_free(obj);
        return 0;
    }
    git_commit *c = NULL;
    rc = git_object_peel((git_object **)&c, obj, GIT_OBJECT_COMMIT);
    git_object_free(obj);
    if (rc < 0) return tool_err_git(rc, rev);
    json_t *cj = commit_json(c);
    const char *msg = git_commit_message(c);
    json_object_set_new(cj, "message", tool_json_text(msg ? msg : "", msg ? strlen(msg) : 0));
    json_object_set_new(res, "commit", cj);
    git_diff *d = NULL;
    rc = commit_diff(repo, c, NULL, &d);
    rc = rc < 0 ? tool_err_git(rc, "show") : diff_result(d, res);
    git_diff_free(d);
    git_commit_free(c);
    return rc;
}

int tool_git_blame(tool_ctx *ctx, json_t *args, json_t *res) {
    git_repository *repo;
    int rc = tool_repo(ctx, &repo);
    if (rc < 0) return rc;
    char *rp = NULL, *data = NULL, *rel = NULL;
    size_t len = 0;
    git_blame *base = NULL, *blame = NULL;
    if ((rc = repo_path(ctx, tool_arg_str(args, "path", NULL), &rp)) < 0) return rc;
    if ((rc = tool_path_clean(ctx, tool_arg_str(args, "path", NULL), &rel)) < 0) goto done;
    int fd = tool_path_open(ctx, rel, O_RDONLY, 0, false);
    if (fd < 0) {
        rc = fd;
        goto done;
    }
    rc = tool_fd_read_all(fd, ctx->opt.max_file_bytes, &data, &len);
    close(fd);
    if (rc < 0) goto done;
    if (tool_is_binary(data, len)) {
        rc = tool_err(TOOL_EBINARY, "%s is binary", rel);
        goto done;
    }
    git_blame_options bo;
    git_blame_options_init(&bo, GIT_BLAME_OPTIONS_VERSION);
    if ((rc = git_blame_file(&base, repo, rp, &bo)) < 0) {
        rc = tool_err_git(rc, "blame");
        goto done;
    }
    /* blame the worktree content: uncommitted lines have a zero id */
    if ((rc = git_blame_buffer(&blame, base, data, len)) < 0) {
        rc = tool_err_git(rc, "blame");
        goto done;
    }
    long start = (long)tool_arg_int(args, "start_line", 1);
    long end = (long)tool_arg_int(args, "end_line", 0);
    json_t *lines = json_array();
    const char *p = data, *e = data + len;
    for (long ln = 1; p < e; ln++) {
        const char *nl = memchr(p, '\n', (size_t)(e - p));
        const char *le = nl ? nl : e;
        if (ln >= start && (!end || ln <= end)) {
            const git_blame_hunk *h = git_blame_get_hunk_byline(blame, (size_t)ln);
            json_t *x = json_object();
            json_object_set_new(x, "line", json_integer(ln));
            if (h && !git_oid_is_zero(&h->final_commit_id)) {
                char s[13];
                git_oid_tostr(s, sizeof s, &h->final_commit_id);
                json_object_set_new(x, "commit", json_string(s));
                if (h->final_signature) {
                    json_object_set_new(x, "author", json_string(h->final_signature->name));
                    json_object_set_new(x, "date", time_json(h->final_signature->when.time,
                                                             h->final_signature->when.offset));
                }
            } else {
                json_object_set_new(x, "commit", json_string("uncommitted"));
            }
            json_object_set_new(x, "text", tool_json_text(p, (size_t)(le - p)));
            json_array_append_new(lines, x);
        }
        p = nl ? nl + 1 : e;
    }
    json_object_set_new(res, "path", json_string(rel));
    json_object_set_new(res, "lines", lines);
done:
    git_blame_free(blame);
    git_blame_free(base);
    free(data);
    free(rel);
    free(rp);
    return rc;
}

static int checkout_notify(git_checkout_notify_t why, const char *path, const git_diff_file *b,
                           const git_diff_file *t, const git_diff_file *w, void *payload) {
    (void)why;
    (void)b;
    (void)t;
    (void)w;
    json_t *arr = payload;
    if (json_array_size(arr) < 50) json_array_append_new(arr, json_string(path));
    return 0;
}

int tool_git_branch(tool_ctx *ctx, json_t *args, json_t *res) {
    git_repository *repo;
    int rc = tool_repo(ctx, &repo);
    if (rc < 0) return rc;
    const char *action = tool_arg_str(args, "action", "list");
    const char *name = tool_arg_str(args, "name", NULL);
    if (!strcmp(action, "list")) {
        git_branch_iterator *it = NULL;
        if ((rc = git_branch_iterator_new(&it, repo, GIT_BRANCH_LOCAL)) < 0)
            return tool_err_git(rc, "branch list");
        json_t *arr = json_array();
        git_reference *ref;
        git_branch_t ty;
        while (git_branch_next(&ref, &ty, it) == 0) {
            const char *bn = NULL;
            git_branch_name(&bn, ref);
            json_t *x = json_pack("{s:s, s:b}", "name", bn ? bn : "?", "current",
                                  git_branch_is_head(ref) == 1);
            if (git_reference_target(ref))
                json_object_set_new(x, "id", oid_json(git_reference_target(ref)));
            json_array_append_new(arr, x);
            git_reference_free(ref);
        }
        git_branch_iterator_free(it);
        json_object_set_new(res, "branches", arr);
        json_object_set_new(res, "current", branch_json(repo));
        return 0;
    }
    if (!name) return tool_err(TOOL_EINVAL, "action '%s' needs a branch name", action);
    if (!strcmp(action, "create")) {
        git_object *start = NULL;
        git_commit *c = NULL;
        git_reference *ref = NULL;
        const char *from = tool_arg_str(args, "start", "HEAD");
        if ((rc = git_revparse_single(&start, repo, from)) < 0) return tool_err_git(rc, from);
        rc = git_object_peel((git_object **)&c, start, GIT_OBJECT_COMMIT);
        git_object_free(start);
        if (rc < 0) return tool_err_git(rc, from);
        rc = git_branch_create(&ref, repo, name, c, 0);
        if (rc == GIT_EEXISTS) rc = tool_err(TOOL_ECONFLICT, "branch '%s' already exists", name);
        else if (rc < 0) rc = tool_err_git(rc, "branch create");
        else {
            json_object_set_new(res, "created", json_string(name));
            json_object_set_new(res, "id", oid_json(git_commit_id(c)));
        }
        git_reference_free(ref);
        git_commit_free(c);
        return rc;
    }
    /* switch */
    git_reference *ref = NULL;
    git_object *target = NULL;
    if ((rc = git_branch_lookup(&ref, repo, name, GIT_BRANCH_LOCAL)) < 0)
        return rc == GIT_ENOTFOUND ? tool_err(TOOL_ENOTFOUND, "no branch '%s'", name)
                                   : tool_err_git(rc, "switch");
    rc = git_reference_peel(&target, ref, GIT_OBJECT_COMMIT);
    json_t *conflicts = json_array();
    if (rc == 0) {
        git_checkout_options co;
        git_checkout_options_init(&co, GIT_CHECKOUT_OPTIONS_VERSION);
        co.checkout_strategy = GIT_CHECKOUT_SAFE;
        co.notify_flags = GIT_CHECKOUT_NOTIFY_CONFLICT;
        co.notify_cb = checkout_notify;
        co.notify_payload = conflicts;
        rc = git_checkout_tree(repo, target, &co);
        if (rc == GIT_ECONFLICT || json_array_size(conflicts)) {
            char *s = json_dumps(conflicts, JSON_COMPACT);
            rc = tool_err(TOOL_ECONFLICT, "switching to '%s' would overwrite local changes in %s;"
                          " commit or undo them first", name, s ? s : "some files");
            free(s);
        } else if (rc < 0) {
            rc = tool_err_git(rc, "checkout");
        } else if ((rc = git_repository_set_head(repo, git_reference_name(ref))) < 0) {
            rc = tool_err_git(rc, "switch");
        } else {
            json_object_set_new(res, "switched_to", json_string(name));
        }
    } else {
        rc = tool_err_git(rc, "switch");
    }
    json_decref(conflicts);
    git_object_free(target);
    git_reference_free(ref);
    return rc;
}

int tool_git_add(tool_ctx *ctx, json_t *args, json_t *res) {
    git_repository *repo;
    int rc = tool_repo(ctx, &repo);
    if (rc < 0) return rc;
    git_index *idx = NULL;
    git_strarray spec = {0};
    json_t *paths = json_object_get(args, "paths");
    bool all = tool_arg_bool(args, "all", false);
    if (!all && !json_array_size(paths))
        return tool_err(TOOL_EINVAL, "give 'paths' to stage, or set 'all'");
    if ((rc = git_repository_index(&idx, repo)) < 0) return tool_err_git(rc, "index");
    if ((rc = git_index_read(idx, false)) < 0) {
        rc = tool_err_git(rc, "index");
        goto done;
    }
    if ((rc = make_spec(ctx, all ? NULL : paths, &spec)) < 0) goto done;
    char *star = "*";
    git_strarray allspec = {&star, 1};
    git_strarray *use = all ? &allspec : &spec;
    /* add_all stages new and modified files (ignored ones only when named), update_all
     * stages deletions */
    if ((rc = git_index_add_all(idx, use, GIT_INDEX_ADD_DEFAULT, NULL, NULL)) < 0 ||
        (rc = git_index_update_all(idx, use, NULL, NULL)) < 0) {
        rc = tool_err_git(rc, "add");
        goto done;
    }
    if ((rc = git_index_write(idx)) < 0) {
        rc = tool_err_git(rc, "index write");
        goto done;
    }
    json_t *none = json_object();
    rc = none ? tool_git_status(ctx, none, res) : tool_err(TOOL_ENOMEM, "out of memory");
    json_decref(none);
done:
    free_spec(&spec);
    git_index_free(idx);
    return rc;
}

int tool_git_commit(tool_ctx *ctx, json_t *args, json_t *res) {
    git_repository *repo;
    int rc = tool_repo(ctx, &repo);
    if (rc < 0) return rc;
    git_signature *sig = NULL;
    git_index *idx = NULL;
    git_tree *tree = NULL, *htree = NULL;
    git_commit *parent = NULL;
    git_oid tid, cid;
    if ((rc = git_signature_default(&sig, repo)) < 0) {
        git_error_clear();
        return tool_err(TOOL_EGIT, "no author: set user.name and user.email in git config");
    }
    if ((rc = git_repository_index(&idx, repo)) < 0 || (rc = git_index_read(idx, false)) < 0) {
        rc = tool_err_git(rc, "index");
        goto done;
    }
    if (git_index_has_conflicts(idx)) {
        rc = tool_err(TOOL_ECONFLICT, "the index has unresolved conflicts");
        goto done;
    }
    if ((rc = git_index_write_tree(&tid, idx)) < 0 || (rc = git_tree_lookup(&tree, repo, &tid)) < 0) {
        rc = tool_err_git(rc, "write tree");
        goto done;
    }
    if (git_repository_head_unborn(repo) != 1) {
        git_object *h = NULL;
        if ((rc = git_revparse_single(&h, repo, "HEAD^{commit}")) < 0) {
            rc = tool_err_git(rc, "HEAD");
            goto done;
        }
        parent = (git_commit *)h;
        if ((rc = git_commit_tree(&htree, parent)) < 0) {
            rc = tool_err_git(rc, "HEAD tree");
            goto done;
        }
        if (git_oid_equal(git_tree_id(htree), &tid)) {
            rc = tool_err(TOOL_EINVAL, "nothing staged to commit (use git_add first)");
            goto done;
        }
    }
    const git_commit *parents[1] = {parent};
    const char *msg = tool_arg_str(args, "message", "");
    rc = git_commit_create(&cid, repo, "HEAD", sig, sig, NULL, msg, tree, parent ? 1 : 0, parents);
    if (rc < 0) {
        rc = tool_err_git(rc, "commit");
        goto done;
    }
    json_object_set_new(res, "id", oid_json(&cid));
    json_object_set_new(res, "branch", branch_json(repo));
    json_object_set_new(res, "author", json_pack("{s:s, s:s}", "name", sig->name, "email",
                                                 sig->email));
    git_diff *d = NULL;
    if (git_diff_tree_to_tree(&d, repo, htree, tree, NULL) == 0) {
        json_object_set_new(res, "files_changed", json_integer((json_int_t)git_diff_num_deltas(d)));
        git_diff_free(d);
    }
done:
    git_signature_free(sig);
    git_index_free(idx);
    git_tree_free(tree);
    git_tree_free(htree);
    git_commit_free(parent);
    return rc;
}
