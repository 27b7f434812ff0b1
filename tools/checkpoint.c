/* Checkpoints: the worktree (tracked and untracked-not-ignored files, raw bytes, no filters),
 * the index and HEAD, stored as commits under refs/spark-agent/checkpoints/N, and restored
 * exactly. Like `git stash -u`, but nothing in the worktree is touched when snapshotting. */
#include "tool_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define CP_PREFIX "refs/spark-agent/checkpoints/"
/* Files larger than this are not copied into a snapshot (a data set, a core dump): they are
 * named in the checkpoint instead, and a restore neither removes nor rewrites them. */
#define CP_MAX_FILE ((off_t)64 << 20)
#define CP_SKIPPED 1u

/* The paths a snapshot covers: index entries plus untracked, not ignored files. */
static int worktree_paths(git_repository *repo, git_index *idx, json_t *out, json_t *dirty) {
    size_t n = git_index_entrycount(idx);
    const char *last = NULL;
    for (size_t i = 0; i < n; i++) {
        const git_index_entry *e = git_index_get_byindex(idx, i);
        if (last && !strcmp(last, e->path)) continue; /* conflict stages */
        last = e->path;
        json_object_set_new(out, e->path, json_integer(e->mode));
    }
    git_status_options o;
    git_status_options_init(&o, GIT_STATUS_OPTIONS_VERSION);
    o.show = GIT_STATUS_SHOW_WORKDIR_ONLY;
    o.flags = GIT_STATUS_OPT_INCLUDE_UNTRACKED | GIT_STATUS_OPT_RECURSE_UNTRACKED_DIRS;
    git_status_list *list = NULL;
    int rc = git_status_list_new(&list, repo, &o);
    if (rc < 0) return tool_err_git(rc, "status");
    for (size_t i = 0; i < git_status_list_entrycount(list); i++) {
        const git_status_entry *e = git_status_byindex(list, i);
        if ((e->status & GIT_STATUS_WT_NEW) && e->index_to_workdir)
            json_object_set_new(out, e->index_to_workdir->new_file.path, json_integer(0));
        if (dirty && e->index_to_workdir) {
            json_object_set_new(dirty, e->index_to_workdir->new_file.path, json_true());
            json_object_set_new(dirty, e->index_to_workdir->old_file.path, json_true());
        }
    }
    git_status_list_free(list);
    return 0;
}

/* No attribute that makes git transform content between the blob and the file. */
static bool no_filters(git_repository *repo, const char *path) {
    static const char *names[] = {"filter", "text", "eol", "ident", "crlf"};
    const char *vals[5];
    if (git_attr_get_many(vals, repo, 0, path, 5, names) < 0) {
        git_error_clear();
        return false;
    }
    for (int i = 0; i < 5; i++) {
        git_attr_value_t t = git_attr_value(vals[i]);
        if (t != GIT_ATTR_VALUE_UNSPECIFIED && t != GIT_ATTR_VALUE_FALSE) return false;
    }
    return true;
}

static int open_workdir(git_repository *repo) {
    const char *wd = git_repository_workdir(repo);
    int fd = wd ? open(wd, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    return fd >= 0 ? fd : tool_err(TOOL_EIO, "cannot open the repository's worktree");
}

/* Raw content and git mode of a worktree path; *mode 0 when absent. Caller frees *data. */
static int read_wt(int wdfd, const char *path, char **data, size_t *len, unsigned *mode) {
    *data = NULL;
    *len = 0;
    *mode = 0;
    const char *base;
    int dfd = tool_path_open_parent_at(wdfd, path, &base);
    if (dfd < 0) return dfd == TOOL_ENOTFOUND ? 0 : dfd;
    struct stat st;
    int rc = 0;
    if (fstatat(dfd, base, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        rc = errno == ENOENT || errno == ENOTDIR ? 0 : tool_err(TOOL_EIO, "%s: %s", path,
                                                               strerror(errno));
    } else if (S_ISLNK(st.st_mode)) {
        char buf[4096];
        ssize_t n = readlinkat(dfd, base, buf, sizeof buf);
        if (n < 0) {
            rc = tool_err(TOOL_EIO, "%s: %s", path, strerror(errno));
        } else if ((*data = malloc((size_t)n + 1))) {
            memcpy(*data, buf, (size_t)n);
            (*data)[n] = '\0';
            *len = (size_t)n;
            *mode = GIT_FILEMODE_LINK;
        } else {
            rc = tool_err(TOOL_ENOMEM, "out of memory");
        }
    } else if (S_ISREG(st.st_mode) && st.st_size > CP_MAX_FILE) {
        *mode = CP_SKIPPED;
    } else if (S_ISREG(st.st_mode)) {
        int fd = openat(dfd, base, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
            rc = tool_err(TOOL_EIO, "%s: %s", path, strerror(errno));
        } else {
            rc = tool_fd_read_all(fd, (size_t)1 << 40, data, len);
            close(fd);
            *mode = (st.st_mode & 0111) ? GIT_FILEMODE_BLOB_EXECUTABLE : GIT_FILEMODE_BLOB;
        }
    } else if (S_ISDIR(st.st_mode)) {
        *mode = GIT_FILEMODE_TREE; /* a submodule's checkout, or a directory in the way */
    }
    close(dfd);
    return rc;
}

static int next_number(git_repository *repo, long *out) {
    git_reference_iterator *it = NULL;
    long max = 0;
    int rc = git_reference_iterator_glob_new(&it, repo, CP_PREFIX "*");
    if (rc < 0) return tool_err_git(rc, "refs");
    const char *name;
    while (git_reference_next_name(&name, it) == 0) {
        long v = strtol(name + strlen(CP_PREFIX), NULL, 10);
        if (v > max) max = v;
    }
    git_reference_iterator_free(it);
    *out = max + 1;
    return 0;
}

int tool_checkpoint_create(tool_ctx *ctx, const char *reason, char **out_ref) {
    if (out_ref) *out_ref = NULL;
    git_repository *repo;
    int rc = tool_repo(ctx, &repo);
    if (rc < 0) return rc;
    git_index *idx = NULL, *snap = NULL;
    git_tree *itree = NULL, *wtree = NULL;
    git_commit *head = NULL, *icommit = NULL;
    git_signature *sig = NULL;
    git_reference *headref = NULL, *newref = NULL;
    json_t *paths = json_object(), *dirty = json_object(), *skipped = json_array();
    int wdfd = -1;
    char *msg = NULL, *skipped_s = NULL;
    if ((rc = git_repository_index(&idx, repo)) < 0 || (rc = git_index_read(idx, true)) < 0) {
        rc = tool_err_git(rc, "index");
        goto done;
    }
    if (git_index_has_conflicts(idx)) {
        rc = tool_err(TOOL_ECONFLICT, "the index has unresolved conflicts: cannot checkpoint");
        goto done;
    }
    git_oid itid, wtid, icid, wcid;
    if ((rc = git_index_write_tree(&itid, idx)) < 0 ||
        (rc = git_tree_lookup(&itree, repo, &itid)) < 0) {
        rc = tool_err_git(rc, "index tree");
        goto done;
    }
    if ((rc = worktree_paths(repo, idx, paths, dirty)) < 0) goto done;
    if ((wdfd = open_workdir(repo)) < 0) {
        rc = wdfd;
        goto done;
    }
    bool autocrlf = false;
    git_config *cfg = NULL;
    if (git_repository_config_snapshot(&cfg, repo) == 0) {
        const char *v = NULL;
        if (git_config_get_string(&v, cfg, "core.autocrlf") == 0 && strcasecmp(v, "false"))
            autocrlf = true;
        git_config_free(cfg);
    }
    git_error_clear();
    if ((rc = git_index_new(&snap)) < 0) {
        rc = tool_err_git(rc, "index");
        goto done;
    }
    const char *path;
    json_t *jm;
    json_object_foreach(paths, path, jm) {
        char *data;
        size_t len;
        unsigned mode;
        git_index_entry e;
        memset(&e, 0, sizeof e);
        e.path = path;
        /* a tracked file git sees unchanged, with no filter between blob and bytes: the
         * index already holds its exact content */
        const git_index_entry *ie = git_index_get_bypath(idx, path, 0);
        if (ie && !json_object_get(dirty, path) && !autocrlf && no_filters(repo, path) &&
            (ie->mode == GIT_FILEMODE_BLOB || ie->mode == GIT_FILEMODE_BLOB_EXECUTABLE ||
             ie->mode == GIT_FILEMODE_LINK)) {
            e.mode = ie->mode;
            e.id = ie->id;
            if ((rc = git_index_add(snap, &e)) < 0) {
                rc = tool_err_git(rc, path);
                goto done;
            }
            continue;
        }
        if ((rc = read_wt(wdfd, path, &data, &len, &mode)) < 0) goto done;
        if (mode == GIT_FILEMODE_TREE) {
            /* keep a submodule's recorded commit; a plain directory is skipped */
            if (json_integer_value(jm) == GIT_FILEMODE_COMMIT) {
                if (ie) {
                    e.mode = GIT_FILEMODE_COMMIT;
                    e.id = ie->id;
                    rc = git_index_add(snap, &e);
                }
            }
        } else if (mode == CP_SKIPPED) {
            json_array_append_new(skipped, json_string(path));
        } else if (mode) {
            rc = git_blob_create_from_buffer(&e.id, repo, data ? data : "", len);
            e.mode = mode;
            if (rc == 0) rc = git_index_add(snap, &e);
        }
        free(data);
        if (rc < 0) {
            rc = tool_err_git(rc, path);
            goto done;
        }
    }
    if ((rc = git_index_write_tree_to(&wtid, snap, repo)) < 0 ||
        (rc = git_tree_lookup(&wtree, repo, &wtid)) < 0) {
        rc = tool_err_git(rc, "worktree tree");
        goto done;
    }
    /* HEAD: the symbolic name and the commit, if any */
    const char *head_name = "";
    if (git_reference_lookup(&headref, repo, "HEAD") == 0 &&
        git_reference_type(headref) == GIT_REFERENCE_SYMBOLIC)
        head_name = git_reference_symbolic_target(headref);
    git_error_clear();
    if (git_repository_head_unborn(repo) != 1) {
        git_object *h = NULL;
        if (git_revparse_single(&h, repo, "HEAD^{commit}") == 0) head = (git_commit *)h;
        git_error_clear();
    }
    char hid[GIT_OID_HEXSZ + 1] = "";
    if (head) git_oid_tostr(hid, sizeof hid, git_commit_id(head));
    if ((rc = git_signature_now(&sig, "spark-agent", "spark-agent@localhost")) < 0) {
        rc = tool_err_git(rc, "signature");
        goto done;
    }
    const git_commit *p1[1] = {head};
    if ((rc = git_commit_create(&icid, repo, NULL, sig, sig, NULL, "spark-agent checkpoint index",
                                itree, head ? 1 : 0, p1)) < 0 ||
        (rc = git_commit_lookup(&icommit, repo, &icid)) < 0) {
        rc = tool_err_git(rc, "checkpoint");
        goto done;
    }
    char icid_s[GIT_OID_HEXSZ + 1];
    git_oid_tostr(icid_s, sizeof icid_s, &icid);
    skipped_s = json_dumps(skipped, JSON_COMPACT);
    size_t ml = strlen(reason ? reason : "") + strlen(head_name) + 256 +
                (skipped_s ? strlen(skipped_s) : 0);
    msg = malloc(ml);
    if (!msg || !skipped_s) {
        rc = tool_err(TOOL_ENOMEM, "out of memory");
        goto done;
    }
    snprintf(msg, ml, "spark-agent checkpoint: %s\n\nhead-ref: %s\nhead-commit: %s\n"
             "index-commit: %s\nskipped: %s\n", reason ? reason : "manual", head_name, hid,
             icid_s, skipped_s);
    const git_commit *p2[2] = {icommit, head};
    if ((rc = git_commit_create(&wcid, repo, NULL, sig, sig, NULL, msg, wtree, head ? 2 : 1,
                                p2)) < 0) {
        rc = tool_err_git(rc, "checkpoint");
        goto done;
    }
    long num = 0; /* set by next_number; gcc -O3 cannot see that through tool_err_git */
    if ((rc = next_number(repo, &num)) < 0) goto done;
    char refname[128];
    snprintf(refname, sizeof refname, CP_PREFIX "%06ld", num);
    if ((rc = git_reference_create(&newref, repo, refname, &wcid, 0, "spark-agent checkpoint")) < 0) {
        rc = tool_err_git(rc, "checkpoint ref");
        goto done;
    }
    if (out_ref && !(*out_ref = strdup(refname))) rc = tool_err(TOOL_ENOMEM, "out of memory");
done:
    if (wdfd >= 0) close(wdfd);
    free(msg);
    free(skipped_s);
    json_decref(skipped);
    json_decref(paths);
    json_decref(dirty);
    git_index_free(idx);
    git_index_free(snap);
    git_tree_free(itree);
    git_tree_free(wtree);
    git_commit_free(head);
    git_commit_free(icommit);
    git_signature_free(sig);
    git_reference_free(headref);
    git_reference_free(newref);
    return rc;
}

static int newest(git_repository *repo, char *out, size_t cap) {
    long n = 0;
    int rc = next_number(repo, &n);
    if (rc < 0) return rc;
    if (n == 1) return tool_err(TOOL_ENOTFOUND, "no checkpoint in this repository");
    snprintf(out, cap, CP_PREFIX "%06ld", n - 1);
    return 0;
}

static const char *msg_field(const char *msg, const char *key, char *out, size_t cap) {
    out[0] = '\0';
    const char *p = strstr(msg, key);
    if (!p) return out;
    p += strlen(key);
    size_t n = strcspn(p, "\n");
    if (n >= cap) n = cap - 1;
    memcpy(out, p, n);
    out[n] = '\0';
    return out;
}

/* Remove a file and then its parent directories while they are empty. */
static bool remove_path(int wdfd, const char *path) {
    const char *base;
    int dfd = tool_path_open_parent_at(wdfd, path, &base);
    if (dfd < 0) return false;
    bool gone = unlinkat(dfd, base, 0) == 0;
    close(dfd);
    char *dir = gone ? strdup(path) : NULL;
    if (!dir) return gone;
    for (char *s; (s = strrchr(dir, '/'));) {
        *s = '\0';
        int pfd = tool_path_open_parent_at(wdfd, dir, &base);
        if (pfd < 0) break;
        int r = unlinkat(pfd, base, AT_REMOVEDIR);
        close(pfd);
        if (r != 0) break;
    }
    free(dir);
    return true;
}

static int make_dirs_at(int wdfd, const char *path) {
    char *dir = strdup(path);
    if (!dir) return tool_err(TOOL_ENOMEM, "out of memory");
    int rc = 0;
    for (char *q = dir; (q = strchr(q, '/')); q++) {
        *q = '\0';
        const char *base;
        int pfd = tool_path_open_parent_at(wdfd, dir, &base);
        if (pfd >= 0) {
            struct stat st;
            if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(st.st_mode))
                unlinkat(pfd, base, 0); /* a file where the snapshot has a directory */
            if (mkdirat(pfd, base, 0777) != 0 && errno != EEXIST)
                rc = tool_err(TOOL_EIO, "mkdir %s: %s", dir, strerror(errno));
            close(pfd);
        } else {
            rc = pfd;
        }
        *q = '/';
        if (rc < 0) break;
    }
    free(dir);
    return rc;
}

typedef struct {
    git_repository *repo;
    int wdfd;
    json_t *written;
    int rc;
} restore_walk;

static int restore_entry(const char *root, const git_tree_entry *te, void *payload) {
    restore_walk *rw = payload;
    git_filemode_t mode = git_tree_entry_filemode(te);
    if (mode == GIT_FILEMODE_TREE || mode == GIT_FILEMODE_COMMIT) return 0;
    size_t rl = strlen(root), nl = strlen(git_tree_entry_name(te));
    char *path = malloc(rl + nl + 1);
    if (!path) {
        rw->rc = tool_err(TOOL_ENOMEM, "out of memory");
        return -1;
    }
    memcpy(path, root, rl);
    memcpy(path + rl, git_tree_entry_name(te), nl + 1);
    char *cur;
    size_t curn;
    unsigned curmode;
    int rc = read_wt(rw->wdfd, path, &cur, &curn, &curmode);
    git_blob *blob = NULL;
    if (rc == 0) rc = git_blob_lookup(&blob, rw->repo, git_tree_entry_id(te)) < 0
                          ? tool_err_git(-1, path) : 0;
    if (rc == 0) {
        const char *want = git_blob_rawcontent(blob);
        size_t wn = (size_t)git_blob_rawsize(blob);
        bool same = curmode == (unsigned)mode && curn == wn && (!wn || !memcmp(cur, want, wn));
        if (!same) {
            if ((rc = make_dirs_at(rw->wdfd, path)) == 0) {
                const char *base;
                int dfd = tool_path_open_parent_at(rw->wdfd, path, &base);
                if (dfd < 0) {
                    rc = dfd;
                } else {
                    struct stat st;
                    if (fstatat(dfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                        (S_ISLNK(st.st_mode) || mode == GIT_FILEMODE_LINK))
                        unlinkat(dfd, base, 0);
                    else if (curmode == GIT_FILEMODE_TREE)
                        unlinkat(dfd, base, AT_REMOVEDIR);
                    if (mode == GIT_FILEMODE_LINK) {
                        char *t = strndup(want, wn);
                        if (!t || symlinkat(t, dfd, base) != 0)
                            rc = tool_err(TOOL_EIO, "symlink %s: %s", path, strerror(errno));
                        free(t);
                    } else {
                        rc = tool_file_write_atomic_at(rw->wdfd, path, want, wn,
                                                       mode == GIT_FILEMODE_BLOB_EXECUTABLE
                                                           ? 0755 : 0644,
                                                       curmode != (unsigned)mode, false, false);
                    }
                    close(dfd);
                }
            }
            if (rc == 0) json_array_append_new(rw->written, json_string(path));
        }
    }
    git_blob_free(blob);
    free(cur);
    free(path);
    if (rc < 0) {
        rw->rc = rc;
        return -1;
    }
    return 0;
}

int tool_checkpoint_restore(tool_ctx *ctx, const char *ref, char **out_json) {
    if (out_json) *out_json = NULL;
    git_repository *repo;
    int rc = tool_repo(ctx, &repo);
    if (rc < 0) return rc;
    char name[256];
    if (ref) {
        char *end;
        long num = strtol(ref, &end, 10);
        if (*ref && !*end && num > 0) snprintf(name, sizeof name, CP_PREFIX "%06ld", num);
        else if (strncmp(ref, "refs/", 5)) snprintf(name, sizeof name, CP_PREFIX "%s", ref);
        else snprintf(name, sizeof name, "%s", ref);
    } else if ((rc = newest(repo, name, sizeof name)) < 0) {
        return rc;
    }
    git_reference *r = NULL;
    git_commit *cp = NULL, *icommit = NULL;
    git_tree *wtree = NULL, *itree = NULL;
    git_index *idx = NULL;
    json_t *paths = json_object(), *removed = json_array(), *written = json_array();
    json_t *skipped = NULL;
    int wdfd = -1;
    if ((rc = git_reference_lookup(&r, repo, name)) < 0) {
        rc = rc == GIT_ENOTFOUND ? tool_err(TOOL_ENOTFOUND, "no checkpoint %s", name)
                                 : tool_err_git(rc, name);
        goto done;
    }
    if ((rc = git_commit_lookup(&cp, repo, git_reference_target(r))) < 0 ||
        (rc = git_commit_tree(&wtree, cp)) < 0) {
        rc = tool_err_git(rc, name);
        goto done;
    }
    const char *msg = git_commit_message(cp);
    if (!msg || strncmp(msg, "spark-agent checkpoint", 22)) {
        rc = tool_err(TOOL_EINVAL, "%s is not a spark-agent checkpoint", name);
        goto done;
    }
    char head_ref[256], head_commit[64], index_commit[64];
    msg_field(msg, "\nhead-ref: ", head_ref, sizeof head_ref);
    msg_field(msg, "\nhead-commit: ", head_commit, sizeof head_commit);
    msg_field(msg, "\nindex-commit: ", index_commit, sizeof index_commit);
    const char *sk = strstr(msg, "\nskipped: ");
    skipped = sk ? json_loadb(sk + 10, strcspn(sk + 10, "\n"), 0, NULL) : NULL;
    git_oid iid;
    if (git_oid_fromstr(&iid, index_commit) < 0 || (rc = git_commit_lookup(&icommit, repo, &iid)) < 0 ||
        (rc = git_commit_tree(&itree, icommit)) < 0) {
        rc = tool_err(TOOL_EINVAL, "checkpoint %s is damaged (index commit)", name);
        goto done;
    }
    if ((rc = git_repository_index(&idx, repo)) < 0 || (rc = git_index_read(idx, true)) < 0) {
        rc = tool_err_git(rc, "index");
        goto done;
    }
    if ((wdfd = open_workdir(repo)) < 0) {
        rc = wdfd;
        goto done;
    }
    /* 1. files present now but not in the snapshot go */
    if ((rc = worktree_paths(repo, idx, paths, NULL)) < 0) goto done;
    const char *path;
    json_t *jm;
    json_object_foreach(paths, path, jm) {
        git_tree_entry *te = NULL;
        if (git_tree_entry_bypath(&te, wtree, path) == 0) {
            git_tree_entry_free(te);
            continue;
        }
        git_error_clear();
        if (json_integer_value(jm) == GIT_FILEMODE_COMMIT) continue; /* submodules stay */
        bool was_skipped = false;
        size_t si;
        json_t *sv;
        json_array_foreach(skipped, si, sv) was_skipped = was_skipped || !strcmp(json_string_value(sv), path);
        if (was_skipped) continue; /* too large to snapshot: never removed */
        if (remove_path(wdfd, path)) json_array_append_new(removed, json_string(path));
    }
    /* 2. snapshot files written back where they differ */
    restore_walk rw = {repo, wdfd, written, 0};
    if (git_tree_walk(wtree, GIT_TREEWALK_PRE, restore_entry, &rw) < 0) {
        rc = rw.rc ? rw.rc : tool_err_git(-1, "restore");
        goto done;
    }
    /* 3. HEAD */
    if (head_ref[0]) {
        git_oid hid;
        if (head_commit[0] && git_oid_fromstr(&hid, head_commit) == 0) {
            git_reference *br = NULL;
            rc = git_reference_create(&br, repo, head_ref, &hid, 1, "spark-agent undo");
            git_reference_free(br);
        } else {
            git_reference *br = NULL; /* unborn then: commits made since are dropped */
            if (git_reference_lookup(&br, repo, head_ref) == 0) git_reference_delete(br);
            git_reference_free(br);
            git_error_clear();
        }
        if (rc == 0) rc = git_repository_set_head(repo, head_ref);
        if (rc == GIT_ENOTFOUND) rc = 0; /* unborn branch: set_head fails harmlessly */
    } else if (head_commit[0]) {
        git_oid hid;
        if (git_oid_fromstr(&hid, head_commit) == 0)
            rc = git_repository_set_head_detached(repo, &hid);
    }
    if (rc < 0) {
        rc = tool_err_git(rc, "restore HEAD");
        goto done;
    }
    /* 4. the index */
    if ((rc = git_index_read_tree(idx, itree)) < 0 || (rc = git_index_write(idx)) < 0) {
        rc = tool_err_git(rc, "restore index");
        goto done;
    }
    if (out_json) {
        json_t *j = json_pack("{s:s, s:O, s:O}", "restored", name, "written", written, "removed",
                              removed);
        *out_json = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(j);
    }
done:
    if (wdfd >= 0) close(wdfd);
    json_decref(skipped);
    json_decref(paths);
    json_decref(removed);
    json_decref(written);
    git_reference_free(r);
    git_commit_free(cp);
    git_commit_free(icommit);
    git_tree_free(wtree);
    git_tree_free(itree);
    git_index_free(idx);
    return rc;
}

int tool_maybe_checkpoint(tool_ctx *ctx, const char *tool) {
    if (ctx->checkpointed) return 0;
    git_repository *repo;
    if (tool_repo(ctx, &repo) < 0) {
        ctx->checkpointed = true; /* not a repository: nothing to snapshot */
        tool_err(0, "%s", "");
        return 0;
    }
    char reason[128];
    snprintf(reason, sizeof reason, "before %s", tool);
    int rc = tool_checkpoint_create(ctx, reason, NULL);
    if (rc < 0)
        return tool_err(rc, "could not checkpoint the repository before %s: %s", tool,
                        tool_error_last());
    ctx->checkpointed = true;
    return 0;
}

int tool_git_checkpoint(tool_ctx *ctx, json_t *args, json_t *res) {
    git_repository *repo;
    int rc = tool_repo(ctx, &repo);
    if (rc < 0) return rc;
    const char *action = tool_arg_str(args, "action", "list");
    if (!strcmp(action, "create")) {
        char *ref = NULL;
        if ((rc = tool_checkpoint_create(ctx, "requested", &ref)) < 0) return rc;
        ctx->checkpointed = true;
        json_object_set_new(res, "created", json_string(ref));
        free(ref);
        return 0;
    }
    if (!strcmp(action, "restore")) {
        char *js = NULL;
        if ((rc = tool_checkpoint_restore(ctx, tool_arg_str(args, "ref", NULL), &js)) < 0)
            return rc;
        json_t *j = js ? json_loads(js, 0, NULL) : NULL;
        free(js);
        if (j) json_object_update(res, j);
        json_decref(j);
        return 0;
    }
    git_reference_iterator *it = NULL;
    if ((rc = git_reference_iterator_glob_new(&it, repo, CP_PREFIX "*")) < 0)
        return tool_err_git(rc, "refs");
    json_t *arr = json_array();
    git_reference *ref;
    while (git_reference_next(&ref, it) == 0) {
        git_commit *c = NULL;
        json_t *x = json_pack("{s:s}", "ref", git_reference_name(ref));
        if (git_reference_target(ref) && git_commit_lookup(&c, repo, git_reference_target(ref)) == 0) {
            const char *s = git_commit_summary(c);
            json_object_set_new(x, "summary", json_string(s ? s : ""));
            git_time_t t = git_commit_time(c);
            json_object_set_new(x, "time", json_integer((json_int_t)t));
            git_commit_free(c);
        }
        json_array_append_new(arr, x);
        git_reference_free(ref);
    }
    git_reference_iterator_free(it);
    json_object_set_new(res, "checkpoints", arr);
    return 0;
}
