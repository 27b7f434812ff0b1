/* Unified diff parser (git diff, diff -u). Untrusted input: every count is checked. */
#include "tool_int.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

void tool_patch_deinit(tool_patch *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_files; i++) {
        tool_patch_file *f = &p->files[i];
        for (size_t h = 0; h < f->n_hunks; h++) {
            for (size_t l = 0; l < f->hunks[h].n_lines; l++) free(f->hunks[h].lines[l]);
            free(f->hunks[h].lines);
            free(f->hunks[h].no_eol);
        }
        free(f->hunks);
        free(f->old_path);
        free(f->new_path);
    }
    free(p->files);
    p->files = NULL;
    p->n_files = 0;
}

/* "a/src/x.c\t2020-..." -> "a/src/x.c"; "/dev/null" -> NULL with *is_null. Quoted git paths
 * ("a/with space") have their quotes and simple escapes removed. */
static int header_path(const char *s, size_t n, char **out, bool *is_null) {
    *out = NULL;
    *is_null = false;
    while (n && (*s == ' ' || *s == '\t')) s++, n--;
    const char *tab = memchr(s, '\t', n);
    if (tab) n = (size_t)(tab - s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\r')) n--;
    if (n == 9 && !memcmp(s, "/dev/null", 9)) {
        *is_null = true;
        return 0;
    }
    if (n >= 2 && s[0] == '"' && s[n - 1] == '"') {
        char *o = malloc(n);
        if (!o) return TOOL_ENOMEM;
        size_t k = 0;
        for (size_t i = 1; i + 1 < n; i++) {
            char c = s[i];
            if (c == '\\' && i + 2 < n) {
                c = s[++i];
                c = c == 't' ? '\t' : c == 'n' ? '\n' : c;
            }
            o[k++] = c;
        }
        o[k] = '\0';
        *out = o;
        return 0;
    }
    if (!n) return TOOL_EINVAL;
    *out = strndup(s, n);
    return *out ? 0 : TOOL_ENOMEM;
}

/* "a/" + the path of a rename line (git writes those without the prefix). */
static int prefixed(const char *pfx, const char *s, size_t n, char **out) {
    bool dn;
    char *tmp;
    *out = NULL;
    int rc = header_path(s, n, &tmp, &dn);
    if (rc < 0) return rc;
    if (!tmp) return TOOL_EINVAL;
    size_t tl = strlen(tmp);
    *out = malloc(tl + 3);
    if (*out) {
        memcpy(*out, pfx, 2);
        memcpy(*out + 2, tmp, tl + 1);
    }
    free(tmp);
    return *out ? 0 : TOOL_ENOMEM;
}

/* "12" or "12,3" within [*pp, e); digits only, bounded (the input need not end in NUL). */
static bool parse_num(const char **pp, const char *e, long *out) {
    const char *p = *pp;
    long v = 0;
    int k = 0;
    while (p < e && *p >= '0' && *p <= '9') {
        if (++k > 9) return false;
        v = v * 10 + (*p++ - '0');
    }
    if (!k) return false;
    *out = v;
    *pp = p;
    return true;
}

static bool parse_range(const char **pp, const char *e, long *start, long *count) {
    const char *p = *pp;
    long a, b = 1;
    if (!parse_num(&p, e, &a)) return false;
    if (p < e && *p == ',') {
        p++;
        if (!parse_num(&p, e, &b)) return false;
    }
    *start = a;
    *count = b;
    *pp = p;
    return true;
}

static tool_patch_file *new_file(tool_patch *p) {
    tool_patch_file *nf = realloc(p->files, (p->n_files + 1) * sizeof *nf);
    if (!nf) return NULL;
    p->files = nf;
    memset(&nf[p->n_files], 0, sizeof *nf);
    return &nf[p->n_files++];
}

int tool_patch_parse(tool_patch *out, const char *text, size_t len) {
    memset(out, 0, sizeof *out);
    const char *p = text, *end = text + len;
    long lineno = 0;
    tool_patch_file *cur = NULL;
    bool git_header = false;  /* a "diff --git" block waiting for ---/+++ or rename lines */
    int rc = 0;
#define FAIL(code, ...)                       \
    do {                                      \
        rc = tool_err(code, __VA_ARGS__);     \
        goto fail;                            \
    } while (0)
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        const char *ls = p;
        size_t ll = (size_t)(le - ls);
        p = nl ? nl + 1 : end;
        lineno++;
        if (ll >= 11 && !memcmp(ls, "diff --git ", 11)) {
            cur = new_file(out);
            if (!cur) FAIL(TOOL_ENOMEM, "out of memory");
            git_header = true;
            /* "diff --git a/x b/x": take the paths now, ---/+++ override them */
            const char *b = NULL;
            for (const char *q = le - 3; q > ls + 11; q--) /* q[1], q[2] stay in the line */
                if (q[0] == ' ' && q[1] == 'b' && q[2] == '/') {
                    b = q;
                    break;
                }
            if (b) {
                bool dn;
                if (header_path(ls + 11, (size_t)(b - ls - 11), &cur->old_path, &dn) < 0 ||
                    header_path(b + 1, (size_t)(le - b - 1), &cur->new_path, &dn) < 0)
                    FAIL(TOOL_ENOMEM, "out of memory");
            }
            continue;
        }
        if (git_header && cur && ll > 12 && !memcmp(ls, "rename from ", 12)) {
            free(cur->old_path);
            if ((rc = prefixed("a/", ls + 12, ll - 12, &cur->old_path)) < 0)
                FAIL(rc, "line %ld: bad rename line", lineno);
            continue;
        }
        if (git_header && cur && ll > 10 && !memcmp(ls, "rename to ", 10)) {
            free(cur->new_path);
            if ((rc = prefixed("b/", ls + 10, ll - 10, &cur->new_path)) < 0)
                FAIL(rc, "line %ld: bad rename line", lineno);
            continue;
        }
        if (git_header && cur && ll >= 13 && !memcmp(ls, "new file mode", 13)) {
            free(cur->old_path);
            cur->old_path = NULL;
            continue;
        }
        if (git_header && cur && ll >= 17 && !memcmp(ls, "deleted file mode", 17)) {
            free(cur->new_path);
            cur->new_path = NULL;
            continue;
        }
        if (ll >= 4 && !memcmp(ls, "--- ", 4) && p < end && end - p >= 4 && !memcmp(p, "+++ ", 4)) {
            if (!git_header || !cur || cur->n_hunks) {
                cur = new_file(out);
                if (!cur) FAIL(TOOL_ENOMEM, "out of memory");
            }
            git_header = false;
            bool on, nn;
            char *op, *np;
            const char *nl2 = memchr(p, '\n', (size_t)(end - p));
            const char *le2 = nl2 ? nl2 : end;
            if (header_path(ls + 4, ll - 4, &op, &on) < 0)
                FAIL(TOOL_EINVAL, "line %ld: bad file header", lineno);
            if (header_path(p + 4, (size_t)(le2 - p - 4), &np, &nn) < 0) {
                free(op);
                FAIL(TOOL_EINVAL, "line %ld: bad file header", lineno + 1);
            }
            free(cur->old_path);
            free(cur->new_path);
            cur->old_path = op;
            cur->new_path = np;
            if (on && nn) FAIL(TOOL_EINVAL, "line %ld: both sides are /dev/null", lineno);
            p = nl2 ? nl2 + 1 : end;
            lineno++;
            continue;
        }
        if (ll >= 4 && !memcmp(ls, "@@ -", 4)) {
            if (!cur) FAIL(TOOL_EINVAL, "line %ld: hunk before any file header", lineno);
            git_header = false;
            const char *q = ls + 4;
            tool_hunk h;
            memset(&h, 0, sizeof h);
            if (!parse_range(&q, le, &h.old_start, &h.old_count) || q + 2 > le || q[0] != ' ' ||
                q[1] != '+')
                FAIL(TOOL_EINVAL, "line %ld: bad hunk header", lineno);
            q += 2;
            if (!parse_range(&q, le, &h.new_start, &h.new_count) || q + 3 > le || memcmp(q, " @@", 3))
                FAIL(TOOL_EINVAL, "line %ld: bad hunk header", lineno);
            long need_old = h.old_count, need_new = h.new_count;
            size_t cap = 0;
            while ((need_old > 0 || need_new > 0 || (p < end && *p == '\\')) && p < end) {
                const char *n2 = memchr(p, '\n', (size_t)(end - p));
                const char *e2 = n2 ? n2 : end;
                const char *s2 = p;
                p = n2 ? n2 + 1 : end;
                lineno++;
                char kind = s2 < e2 ? *s2 : ' ';
                if (kind == '\\') {
                    if (h.n_lines) h.no_eol[h.n_lines - 1] = true;
                    continue;
                }
                if (kind == '\r' && e2 == s2 + 1) kind = ' ';
                if (kind != ' ' && kind != '-' && kind != '+') {
                    rc = tool_err(TOOL_EINVAL, "line %ld: unexpected line in hunk (expected ' ', "
                                  "'-' or '+')", lineno);
                    goto hunk_fail;
                }
                if (kind != '+') need_old--;
                if (kind != '-') need_new--;
                if (need_old < 0 || need_new < 0) {
                    rc = tool_err(TOOL_EINVAL, "line %ld: hunk longer than its header says",
                                  lineno);
                    goto hunk_fail;
                }
                if (h.n_lines == cap) {
                    size_t nc = cap ? cap * 2 : 16;
                    char **nl3 = realloc(h.lines, nc * sizeof *nl3);
                    if (!nl3) goto hunk_oom;
                    h.lines = nl3;
                    bool *ne = realloc(h.no_eol, nc * sizeof *ne);
                    if (!ne) goto hunk_oom;
                    h.no_eol = ne;
                    cap = nc;
                }
                size_t l2 = (size_t)(e2 - s2);
                char *line = malloc(l2 + 2);
                if (!line) goto hunk_oom;
                if (l2 == 0) {
                    line[0] = ' ';
                    line[1] = '\0';
                } else {
                    memcpy(line, s2, l2);
                    line[0] = kind;
                    line[l2] = '\0';
                }
                h.no_eol[h.n_lines] = false;
                h.lines[h.n_lines++] = line;
            }
            if (need_old > 0 || need_new > 0) {
                rc = tool_err(TOOL_EINVAL, "line %ld: hunk shorter than its header says", lineno);
                goto hunk_fail;
            }
            tool_hunk *nh = realloc(cur->hunks, (cur->n_hunks + 1) * sizeof *nh);
            if (!nh) goto hunk_oom;
            cur->hunks = nh;
            cur->hunks[cur->n_hunks++] = h;
            continue;
        hunk_oom:
            rc = tool_err(TOOL_ENOMEM, "out of memory");
        hunk_fail:
            for (size_t i = 0; i < h.n_lines; i++) free(h.lines[i]);
            free(h.lines);
            free(h.no_eol);
            goto fail;
        }
        /* anything else (index lines, commentary) is skipped */
    }
    if (!out->n_files) FAIL(TOOL_EINVAL, "no file headers found: not a unified diff");
    for (size_t i = 0; i < out->n_files; i++) {
        tool_patch_file *f = &out->files[i];
        if (!f->old_path && !f->new_path)
            FAIL(TOOL_EINVAL, "a file in the patch has no name");
        if (!f->n_hunks && f->old_path && f->new_path && !strcmp(f->old_path + 0, f->new_path))
            FAIL(TOOL_EINVAL, "the patch for %s has no hunks", f->new_path);
    }
    return 0;
fail:
    tool_patch_deinit(out);
    return rc;
#undef FAIL
}
