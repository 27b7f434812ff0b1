/* edit_file, create_file, apply_patch: all checked in memory first, then written atomically. */
#include "tool_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- a growable byte buffer ---- */
typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = (b->n + n + 1) * 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

/* Load a workspace text file for editing. TOOL_ENOTFOUND if absent. */
static int load_text(tool_ctx *ctx, const char *rel, char **data, size_t *len) {
    int fd = tool_path_open(ctx, rel, O_RDONLY, 0, false);
    if (fd < 0) return fd;
    int rc = tool_fd_read_all(fd, ctx->opt.max_file_bytes, data, len);
    close(fd);
    if (rc < 0) return tool_err(rc, "%s: %s", rel, tool_error_last());
    if (tool_is_binary(*data, *len)) {
        free(*data);
        *data = NULL;
        return tool_err(TOOL_EBINARY, "%s is a binary file: not edited", rel);
    }
    return 0;
}

static int set_diff(json_t *res, const char *rel, const char *a, size_t al, const char *b,
                    size_t bl) {
    char *d;
    int rc = tool_diff_text(rel, a, al, b, bl, &d);
    if (rc < 0) return rc;
    json_object_set_new(res, "diff", tool_json_text(d, strlen(d)));
    free(d);
    return 0;
}

/* Create the directories of `rel`'s parent beneath the root (mkdir -p), one level at a time. */
static int make_parents(tool_ctx *ctx, const char *rel) {
    const char *slash = strrchr(rel, '/');
    if (!slash) return 0;
    char *dir = strndup(rel, (size_t)(slash - rel));
    if (!dir) return tool_err(TOOL_ENOMEM, "out of memory");
    int rc = 0;
    for (char *q = dir;; q++) {
        if (*q != '/' && *q != '\0') continue;
        char save = *q;
        *q = '\0';
        int fd = tool_path_open(ctx, dir, O_RDONLY | O_DIRECTORY, 0, false);
        if (fd >= 0) {
            close(fd);
        } else if (fd == TOOL_ENOTFOUND) {
            const char *base;
            int pfd = tool_path_open_parent(ctx, dir, &base);
            if (pfd < 0) {
                rc = pfd;
                break;
            }
            if (mkdirat(pfd, base, 0777) != 0 && errno != EEXIST)
                rc = tool_err(TOOL_EIO, "mkdir %s: %s", dir, strerror(errno));
            close(pfd);
            if (rc < 0) break;
        } else {
            rc = fd;
            break;
        }
        *q = save;
        if (!save) break;
    }
    free(dir);
    return rc;
}

/* ---- edit_file ---- */
typedef struct {
    const char *s;   /* line start */
    size_t n;        /* length without the newline */
} line_ref;

static size_t split_lines(const char *t, size_t len, line_ref **out) {
    size_t cnt = 1;
    for (size_t i = 0; i < len; i++)
        if (t[i] == '\n') cnt++;
    line_ref *l = malloc(cnt * sizeof *l);
    if (!l) {
        *out = NULL;
        return 0;
    }
    size_t k = 0;
    const char *p = t, *e = t + len;
    while (p <= e) {
        const char *nl = memchr(p, '\n', (size_t)(e - p));
        const char *le = nl ? nl : e;
        if (!nl && p == e && k > 0) break; /* text ends with a newline */
        l[k].s = p;
        l[k].n = (size_t)(le - p);
        k++;
        if (!nl) break;
        p = nl + 1;
    }
    *out = l;
    return k;
}

/* Lines equal up to whitespace: leading/trailing dropped, inner runs collapsed, CR ignored. */
static bool ws_equal(const char *a, size_t an, const char *b, size_t bn) {
    size_t i = 0, j = 0;
#define WS(c) ((c) == ' ' || (c) == '\t' || (c) == '\r' || (c) == '\f' || (c) == '\v')
    while (i < an && WS(a[i])) i++;
    while (j < bn && WS(b[j])) j++;
    while (an > i && WS(a[an - 1])) an--;
    while (bn > j && WS(b[bn - 1])) bn--;
    while (i < an && j < bn) {
        if (WS(a[i]) && WS(b[j])) {
            while (i < an && WS(a[i])) i++;
            while (j < bn && WS(b[j])) j++;
            continue;
        }
        if (a[i] != b[j]) return false;
        i++;
        j++;
    }
    return i == an && j == bn;
#undef WS
}

static bool blank(const line_ref *l) {
    for (size_t i = 0; i < l->n; i++)
        if (l->s[i] != ' ' && l->s[i] != '\t' && l->s[i] != '\r') return false;
    return true;
}

int tool_edit_file(tool_ctx *ctx, json_t *args, json_t *res) {
    char *rel = NULL, *data = NULL;
    size_t len = 0;
    line_ref *fl = NULL, *ol = NULL;
    sbuf out = {0};
    int rc = tool_path_clean(ctx, tool_arg_str(args, "path", NULL), &rel);
    if (rc < 0) return rc;
    json_t *jold = json_object_get(args, "old_text"), *jnew = json_object_get(args, "new_text");
    const char *old = json_string_value(jold), *nw = json_string_value(jnew);
    size_t oldn = json_string_length(jold), nwn = json_string_length(jnew);
    bool all = tool_arg_bool(args, "replace_all", false);
    if ((rc = load_text(ctx, rel, &data, &len)) < 0) goto done;
    /* exact occurrences */
    size_t count = 0;
    long first_line = 0;
    json_t *lines_at = json_array();
    for (const char *p = data; (p = memmem(p, (size_t)(data + len - p), old, oldn)); p += oldn) {
        count++;
        long ln = 1;
        for (const char *q = data; (q = memchr(q, '\n', (size_t)(p - q))); q++) ln++;
        if (!first_line) first_line = ln;
        if (json_array_size(lines_at) < 20) json_array_append_new(lines_at, json_integer(ln));
    }
    const char *how = "exact";
    if (count > 1 && !all) {
        char *s = json_dumps(lines_at, JSON_COMPACT);
        rc = tool_err(TOOL_ECONFLICT, "old_text occurs %zu times in %s (at lines %s); include "
                      "more surrounding text to make it unique, or set replace_all", count, rel,
                      s ? s : "?");
        free(s);
        json_decref(lines_at);
        goto done;
    }
    json_decref(lines_at);
    if (count >= 1) {
        const char *p = data;
        for (const char *q; (q = memmem(p, (size_t)(data + len - p), old, oldn)); p = q + oldn) {
            sb_add(&out, p, (size_t)(q - p));
            sb_add(&out, nw, nwn);
        }
        sb_add(&out, p, (size_t)(data + len - p));
    } else {
        if (!tool_arg_bool(args, "fuzzy", true)) {
            rc = tool_err(TOOL_ENOTFOUND, "old_text not found in %s (exact match required)", rel);
            goto done;
        }
        /* whitespace-tolerant: whole lines equal up to whitespace and line endings */
        size_t nf = split_lines(data, len, &fl), no = split_lines(old, oldn, &ol);
        if (!fl || !ol) {
            rc = tool_err(TOOL_ENOMEM, "out of memory");
            goto done;
        }
        size_t o0 = 0, o1 = no;
        while (o0 < o1 && blank(&ol[o0])) o0++;
        while (o1 > o0 && blank(&ol[o1 - 1])) o1--;
        size_t k = o1 - o0, hits = 0, at = 0;
        for (size_t i = 0; k && i + k <= nf; i++) {
            size_t j = 0;
            while (j < k && ws_equal(fl[i + j].s, fl[i + j].n, ol[o0 + j].s, ol[o0 + j].n)) j++;
            if (j == k) {
                if (!hits) at = i;
                hits++;
            }
        }
        if (hits == 0) {
            rc = tool_err(TOOL_ENOTFOUND, "old_text not found in %s, not even ignoring "
                          "whitespace; read the file again and copy the text exactly", rel);
            goto done;
        }
        if (hits > 1) {
            rc = tool_err(TOOL_ECONFLICT, "old_text matches %zu places in %s when whitespace "
                          "is ignored; include more surrounding text", hits, rel);
            goto done;
        }
        how = "whitespace-insensitive";
        const char *ms = fl[at].s, *me = fl[at + k - 1].s + fl[at + k - 1].n;
        if (me > ms && me[-1] == '\r') me--;
        bool crlf = fl[at].n && fl[at].s[fl[at].n - 1] == '\r';
        sb_add(&out, data, (size_t)(ms - data));
        /* old_text missing the same indentation on every line (a model that dropped it):
         * give the new text that indentation too */
        const char *pre = NULL;
        size_t pl = 0;
        bool uniform = true;
        for (size_t j = 0; j < k && uniform; j++) {
            const line_ref *f = &fl[at + j], *o = &ol[o0 + j];
            if (blank(o)) continue;
            size_t fw = 0, ow = 0;
            while (fw < f->n && (f->s[fw] == ' ' || f->s[fw] == '\t')) fw++;
            while (ow < o->n && (o->s[ow] == ' ' || o->s[ow] == '\t')) ow++;
            if (fw < ow || memcmp(f->s + fw - ow, o->s, ow) != 0) {
                uniform = false;
            } else if (!pre) {
                pre = f->s;
                pl = fw - ow;
            } else if (pl != fw - ow || memcmp(pre, f->s, pl) != 0) {
                uniform = false;
            }
        }
        if (!uniform) pl = 0;
        if (pl) json_object_set_new(res, "reindented", json_integer((json_int_t)pl));
        /* new text in the file's line ending style (and indentation, see above) */
        bool at_line_start = true;
        for (size_t i = 0; i < nwn; i++) {
            if (at_line_start && pl && nw[i] != '\n' && nw[i] != '\r') sb_add(&out, pre, pl);
            at_line_start = nw[i] == '\n';
            if (crlf && nw[i] == '\n' && (i == 0 || nw[i - 1] != '\r')) sb_add(&out, "\r", 1);
            sb_add(&out, &nw[i], 1);
        }
        /* a new text ending in a newline would double the line break kept from the file */
        if (nwn && nw[nwn - 1] == '\n' && *me == '\r' ) out.n -= crlf ? 2 : 1;
        else if (nwn && nw[nwn - 1] == '\n' && *me == '\n') out.n -= 1;
        sb_add(&out, me, (size_t)(data + len - me));
        json_object_set_new(res, "matched_text", tool_json_text(ms, (size_t)(me - ms)));
        first_line = (long)at + 1;
        count = 1;
    }
    if (out.oom) {
        rc = tool_err(TOOL_ENOMEM, "out of memory");
        goto done;
    }
    if (out.n > ctx->opt.max_file_bytes) {
        rc = tool_err(TOOL_ETOOLARGE, "the edited file would be over the size cap");
        goto done;
    }
    if ((rc = tool_file_write_atomic(ctx, rel, out.p ? out.p : "", out.n, 0644, true, false)) < 0)
        goto done;
    json_object_set_new(res, "path", json_string(rel));
    json_object_set_new(res, "replacements", json_integer((json_int_t)count));
    json_object_set_new(res, "match", json_string(how));
    json_object_set_new(res, "first_line", json_integer(first_line));
    rc = set_diff(res, rel, data, len, out.p ? out.p : "", out.n);
done:
    free(fl);
    free(ol);
    free(out.p);
    free(data);
    free(rel);
    return rc;
}

/* ---- create_file ---- */
int tool_create_file(tool_ctx *ctx, json_t *args, json_t *res) {
    char *rel = NULL, *old = NULL;
    size_t oldn = 0;
    json_t *jc = json_object_get(args, "content");
    bool overwrite = tool_arg_bool(args, "overwrite", false);
    int rc = tool_path_clean(ctx, tool_arg_str(args, "path", NULL), &rel);
    if (rc < 0) return rc;
    if (json_string_length(jc) > ctx->opt.max_file_bytes) {
        rc = tool_err(TOOL_ETOOLARGE, "content is over the size cap");
        goto done;
    }
    int fd = tool_path_open(ctx, rel, O_RDONLY, 0, true);
    if (fd >= 0) {
        rc = overwrite ? tool_fd_read_all(fd, ctx->opt.max_file_bytes, &old, &oldn)
                       : tool_err(TOOL_ECONFLICT, "%s already exists (set overwrite to replace "
                                  "it, or use edit_file)", rel);
        close(fd);
        if (rc < 0) goto done;
    } else if (fd != TOOL_ENOTFOUND) {
        rc = fd;
        goto done;
    }
    if ((rc = make_parents(ctx, rel)) < 0) goto done;
    rc = tool_file_write_atomic(ctx, rel, json_string_value(jc), json_string_length(jc), 0644,
                                false, !overwrite);
    if (rc < 0) goto done;
    json_object_set_new(res, "path", json_string(rel));
    json_object_set_new(res, "created", json_boolean(old == NULL));
    json_object_set_new(res, "bytes", json_integer((json_int_t)json_string_length(jc)));
    rc = set_diff(res, rel, old ? old : "", oldn, json_string_value(jc), json_string_length(jc));
done:
    free(old);
    free(rel);
    return rc;
}

/* ---- apply_patch ---- */
typedef struct {
    char *rel;          /* target path (new name) */
    char *old_rel;      /* source path when renamed or deleted, else NULL */
    char *before;       /* NULL: file is new */
    size_t before_n;
    sbuf after;
    bool remove;        /* deleted by the patch */
} patched;

static bool line_eq(const line_ref *f, const char *pl, bool loose) {
    size_t pn = strlen(pl);
    if (!loose) return f->n == pn && !memcmp(f->s, pl, pn);
    size_t a = f->n, b = pn;
    while (a && (f->s[a - 1] == ' ' || f->s[a - 1] == '\t' || f->s[a - 1] == '\r')) a--;
    while (b && (pl[b - 1] == ' ' || pl[b - 1] == '\t' || pl[b - 1] == '\r')) b--;
    return a == b && !memcmp(f->s, pl, a);
}

/* Does the hunk's old side match the file at line index `at`? */
static bool hunk_at(const tool_hunk *h, const line_ref *fl, size_t nf, size_t at, bool loose) {
    size_t k = at;
    for (size_t i = 0; i < h->n_lines; i++) {
        if (h->lines[i][0] == '+') continue;
        if (k >= nf || !line_eq(&fl[k], h->lines[i] + 1, loose)) return false;
        k++;
    }
    return true;
}

static const char *strip_ab(const char *p, bool strip) {
    if (strip && (!strncmp(p, "a/", 2) || !strncmp(p, "b/", 2))) return p + 2;
    return p;
}

static int apply_one(tool_ctx *ctx, const tool_patch_file *pf, patched *out, bool strip) {
    line_ref *fl = NULL;
    int rc = 0;
    const char *src = pf->old_path ? strip_ab(pf->old_path, strip) : NULL;
    const char *dst = pf->new_path ? strip_ab(pf->new_path, strip) : NULL;
    if ((rc = tool_path_clean(ctx, dst ? dst : src, &out->rel)) < 0) return rc;
    if (src && dst && strcmp(src, dst) && (rc = tool_path_clean(ctx, src, &out->old_rel)) < 0)
        return rc;
    if (!dst && (rc = tool_path_clean(ctx, src, &out->old_rel)) < 0) return rc;
    out->remove = !dst;
    if (src) {
        rc = load_text(ctx, out->old_rel ? out->old_rel : out->rel, &out->before, &out->before_n);
        if (rc < 0) return rc;
    } else {
        int fd = tool_path_open(ctx, out->rel, O_RDONLY, 0, true);
        if (fd >= 0) {
            close(fd);
            return tool_err(TOOL_ECONFLICT, "the patch creates %s, which already exists",
                            out->rel);
        }
    }
    const char *text = out->before ? out->before : "";
    size_t tn = out->before_n;
    size_t nf = tn ? split_lines(text, tn, &fl) : 0;
    if (tn && !fl) return tool_err(TOOL_ENOMEM, "out of memory");
    bool ends_nl = tn && text[tn - 1] == '\n';
    size_t cur = 0;       /* next file line not yet copied */
    long offset = 0;      /* drift between header line numbers and where hunks applied */
    bool last_no_eol = !ends_nl && tn;
    for (size_t h = 0; h < pf->n_hunks; h++) {
        const tool_hunk *hk = &pf->hunks[h];
        long want = (hk->old_count ? hk->old_start - 1 : hk->old_start) + offset;
        if (want < (long)cur) want = (long)cur;
        long found = -1;
        for (int loose = 0; loose < 2 && found < 0; loose++) {
            for (long d = 0; d <= (long)nf + 1 && found < 0; d++) {
                long cand[2] = {want - d, want + d};
                for (int c = 0; c < (d ? 2 : 1); c++) {
                    long at = cand[c];
                    if (at < (long)cur || at > (long)nf) continue;
                    if (hunk_at(hk, fl, nf, (size_t)at, loose)) {
                        found = at;
                        break;
                    }
                }
            }
        }
        if (found < 0) {
            rc = tool_err(TOOL_ECONFLICT, "hunk %zu of %s does not apply: its context and "
                          "removed lines are not in the file (expected near line %ld)", h + 1,
                          out->rel, hk->old_start);
            goto done;
        }
        for (size_t i = cur; i < (size_t)found; i++) {
            sb_add(&out->after, fl[i].s, fl[i].n);
            sb_add(&out->after, "\n", 1);
        }
        cur = (size_t)found;
        for (size_t i = 0; i < hk->n_lines; i++) {
            char k = hk->lines[i][0];
            if (k == '-') {
                cur++;
                continue;
            }
            if (k == ' ') cur++;
            sb_add(&out->after, hk->lines[i] + 1, strlen(hk->lines[i] + 1));
            bool no_eol = hk->no_eol[i];
            if (!no_eol) sb_add(&out->after, "\n", 1);
        }
        /* the old side's "no newline" on the last line is resolved by the new side */
        if (cur >= nf) last_no_eol = false;
        offset = (long)found - (hk->old_count ? hk->old_start - 1 : hk->old_start);
    }
    for (size_t i = cur; i < nf; i++) {
        sb_add(&out->after, fl[i].s, fl[i].n);
        if (i + 1 < nf || !last_no_eol) sb_add(&out->after, "\n", 1);
    }
    if (out->after.oom) rc = tool_err(TOOL_ENOMEM, "out of memory");
    if (!rc && out->remove && out->after.n)
        rc = tool_err(TOOL_ECONFLICT, "the patch deletes %s but leaves lines in it", out->rel);
done:
    free(fl);
    return rc;
}

int tool_apply_patch(tool_ctx *ctx, json_t *args, json_t *res) {
    json_t *jp = json_object_get(args, "patch");
    tool_patch p;
    int rc = tool_patch_parse(&p, json_string_value(jp), json_string_length(jp));
    if (rc < 0) return rc;
    patched *pt = calloc(p.n_files, sizeof *pt);
    if (!pt) {
        tool_patch_deinit(&p);
        return tool_err(TOOL_ENOMEM, "out of memory");
    }
    /* git-style a/ b/ prefixes: strip them unless the unstripped names exist */
    bool strip = true;
    for (size_t i = 0; i < p.n_files; i++) {
        const char *n = p.files[i].new_path ? p.files[i].new_path : p.files[i].old_path;
        if (strncmp(n, "a/", 2) && strncmp(n, "b/", 2)) strip = false;
    }
    size_t done_n = 0;
    for (size_t i = 0; i < p.n_files && rc == 0; i++) rc = apply_one(ctx, &p.files[i], &pt[i], strip);
    if (rc < 0) goto done;
    /* write everything; on a failure put back what was already written */
    json_t *files = json_array();
    sbuf diff = {0};
    for (size_t i = 0; i < p.n_files; i++) {
        patched *f = &pt[i];
        if (f->remove) {
            const char *base;
            int dfd = tool_path_open_parent(ctx, f->old_rel, &base);
            rc = dfd < 0 ? dfd : (unlinkat(dfd, base, 0) == 0 ? 0 : tool_err(TOOL_EIO,
                                  "delete %s: %s", f->old_rel, strerror(errno)));
            if (dfd >= 0) close(dfd);
        } else {
            rc = make_parents(ctx, f->rel);
            if (!rc)
                rc = tool_file_write_atomic(ctx, f->rel, f->after.p ? f->after.p : "",
                                            f->after.n, 0644, false, false);
            if (!rc && f->old_rel) {
                const char *base;
                int dfd = tool_path_open_parent(ctx, f->old_rel, &base);
                if (dfd >= 0) {
                    unlinkat(dfd, base, 0);
                    close(dfd);
                }
            }
        }
        if (rc < 0) break;
        done_n++;
        char *d = NULL;
        if (tool_diff_text(f->rel, f->before ? f->before : "", f->before_n,
                           f->after.p ? f->after.p : "", f->after.n, &d) == 0) {
            sb_add(&diff, d, strlen(d));
            free(d);
        }
        json_array_append_new(files, json_pack("{s:s, s:s}", "path", f->rel, "action",
                                               f->remove ? "deleted"
                                               : !f->before ? "created"
                                               : f->old_rel ? "renamed" : "modified"));
    }
    if (rc < 0) {
        int keep = rc;
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", tool_error_last());
        for (size_t i = 0; i < done_n; i++) {
            patched *f = &pt[i];
            if (f->before)
                tool_file_write_atomic(ctx, f->old_rel ? f->old_rel : f->rel, f->before,
                                       f->before_n, 0644, false, false);
            if (!f->before || (f->old_rel && !f->remove)) {
                const char *base;
                int dfd = tool_path_open_parent(ctx, f->rel, &base);
                if (dfd >= 0) {
                    unlinkat(dfd, base, 0);
                    close(dfd);
                }
            }
        }
        json_decref(files);
        free(diff.p);
        rc = tool_err(keep, "%s (files already written were restored)", msg);
        goto done;
    }
    json_object_set_new(res, "files", files);
    json_object_set_new(res, "diff", tool_json_text(diff.p ? diff.p : "", diff.n));
    free(diff.p);
done:
    for (size_t i = 0; i < p.n_files; i++) {
        free(pt[i].rel);
        free(pt[i].old_rel);
        free(pt[i].before);
        free(pt[i].after.p);
    }
    free(pt);
    tool_patch_deinit(&p);
    return rc;
}
