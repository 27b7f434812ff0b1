/* .gitignore / .ignore rules (gitignore syntax), one rule set per directory. */
#include "tool_int.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    char *pat;
    size_t len;
    bool negate, dir_only, anchored;
} ig_rule;

struct tool_ignore {
    char *dir;        /* "" for the workspace root, else "a/b" */
    size_t dir_len;
    ig_rule *rules;
    size_t n, cap;
};

void tool_ignore_free(tool_ignore *ig) {
    if (!ig) return;
    for (size_t i = 0; i < ig->n; i++) free(ig->rules[i].pat);
    free(ig->rules);
    free(ig->dir);
    free(ig);
}

int tool_ignore_parse(tool_ignore **out, const char *dir_rel, const char *text, size_t len) {
    *out = NULL;
    tool_ignore *ig = calloc(1, sizeof *ig);
    if (!ig) return tool_err(TOOL_ENOMEM, "out of memory");
    if (!strcmp(dir_rel, ".")) dir_rel = "";
    ig->dir = strdup(dir_rel);
    if (!ig->dir) goto oom;
    ig->dir_len = strlen(dir_rel);
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        const char *ls = p;
        p = nl ? nl + 1 : end;
        if (le > ls && le[-1] == '\r') le--;
        /* trailing unescaped spaces are dropped */
        while (le > ls && le[-1] == ' ' && !(le - 1 > ls && le[-2] == '\\')) le--;
        if (le == ls || *ls == '#') continue;
        ig_rule r = {0};
        if (*ls == '!') {
            r.negate = true;
            ls++;
        } else if (*ls == '\\' && ls + 1 < le && (ls[1] == '#' || ls[1] == '!')) {
            ls++;
        }
        if (le > ls && le[-1] == '/') {
            r.dir_only = true;
            le--;
        }
        if (le == ls) continue;
        if (*ls == '/') {
            r.anchored = true;
            ls++;
        }
        if (memchr(ls, '/', (size_t)(le - ls))) r.anchored = true;
        if (le == ls) continue;
        r.len = (size_t)(le - ls);
        r.pat = malloc(r.len + 1); /* not strndup: a NUL inside must not shorten it */
        if (!r.pat) goto oom;
        memcpy(r.pat, ls, r.len);
        r.pat[r.len] = '\0';
        if (ig->n == ig->cap) {
            size_t nc = ig->cap ? ig->cap * 2 : 16;
            ig_rule *nr = realloc(ig->rules, nc * sizeof *nr);
            if (!nr) {
                free(r.pat);
                goto oom;
            }
            ig->rules = nr;
            ig->cap = nc;
        }
        ig->rules[ig->n++] = r;
    }
    *out = ig;
    return 0;
oom:
    tool_ignore_free(ig);
    return tool_err(TOOL_ENOMEM, "out of memory");
}

int tool_ignore_check(const tool_ignore *ig, const char *rel, bool is_dir) {
    const char *sub = rel;
    if (ig->dir_len) {
        if (strncmp(rel, ig->dir, ig->dir_len) != 0 || rel[ig->dir_len] != '/') return 0;
        sub = rel + ig->dir_len + 1;
    }
    size_t sl = strlen(sub);
    const char *base = strrchr(sub, '/');
    base = base ? base + 1 : sub;
    size_t bl = strlen(base);
    for (size_t i = ig->n; i-- > 0;) {
        const ig_rule *r = &ig->rules[i];
        if (r->dir_only && !is_dir) continue;
        bool m = r->anchored ? tool_glob_match_full(r->pat, r->len, sub, sl)
                             : tool_glob_match_full(r->pat, r->len, base, bl);
        if (m) return r->negate ? -1 : 1;
    }
    return 0;
}
