/* Glob matching for find_files, include/exclude filters and ignore files. */
#include "tool_int.h"

#include <string.h>

typedef struct {
    long budget;   /* steps left: hostile globs end as "no match" instead of running away */
} gstate;

/* Match a bracket class at g (just after '['); returns bytes consumed in g or 0 if malformed. */
static size_t class_match(const char *g, const char *ge, char c, bool *hit) {
    const char *p = g;
    bool neg = false;
    if (p < ge && (*p == '!' || *p == '^')) {
        neg = true;
        p++;
    }
    bool found = false, first = true;
    while (p < ge && (*p != ']' || first)) {
        first = false;
        char lo = *p;
        if (lo == '\\' && p + 1 < ge) lo = *++p;
        p++;
        char hi = lo;
        if (p + 1 < ge && *p == '-' && p[1] != ']') {
            hi = p[1];
            if (hi == '\\' && p + 2 < ge) {
                hi = p[2];
                p++;
            }
            p += 2;
        }
        if ((unsigned char)c >= (unsigned char)lo && (unsigned char)c <= (unsigned char)hi)
            found = true;
    }
    if (p >= ge) return 0;
    *hit = (found != neg) && c != '/';
    return (size_t)(p - g) + 1;
}

static bool gmatch(gstate *st, const char *g, const char *ge, const char *s, const char *se) {
    while (g < ge) {
        if (--st->budget < 0) return false;
        char c = *g;
        if (c == '*') {
            bool dbl = g + 1 < ge && g[1] == '*';
            if (dbl) {
                const char *after = g + 2;
                /* "**" followed by "/" also matches zero directories */
                if (after < ge && *after == '/') {
                    if (gmatch(st, after + 1, ge, s, se)) return true;
                    for (const char *q = s; q < se; q++)
                        if (*q == '/' && gmatch(st, after + 1, ge, q + 1, se)) return true;
                    return false;
                }
                for (const char *q = s; q <= se; q++)
                    if (gmatch(st, after, ge, q, se)) return true;
                return false;
            }
            g++;
            for (const char *q = s;; q++) {
                if (gmatch(st, g, ge, q, se)) return true;
                if (q >= se || *q == '/') return false;
                if (st->budget < 0) return false;
            }
        }
        if (s >= se) return false;
        if (c == '?') {
            if (*s == '/') return false;
            g++;
            s++;
            continue;
        }
        if (c == '[') {
            bool hit = false;
            size_t used = class_match(g + 1, ge, *s, &hit);
            if (used) {
                if (!hit) return false;
                g += 1 + used;
                s++;
                continue;
            }
            /* malformed class: '[' is literal */
        }
        if (c == '\\' && g + 1 < ge) c = *++g;
        if (c != *s) return false;
        g++;
        s++;
    }
    return s == se;
}

bool tool_glob_match_full(const char *glob, size_t glen, const char *path, size_t plen) {
    gstate st = {200000};
    return gmatch(&st, glob, glob + glen, path, path + plen);
}

bool tool_glob_match(const char *glob, const char *path) {
    size_t gl = strlen(glob);
    if (gl && glob[0] == '/') return tool_glob_match_full(glob + 1, gl - 1, path, strlen(path));
    if (!memchr(glob, '/', gl)) {
        const char *b = strrchr(path, '/');
        b = b ? b + 1 : path;
        return tool_glob_match_full(glob, gl, b, strlen(b));
    }
    return tool_glob_match_full(glob, gl, path, strlen(path));
}
