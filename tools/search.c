/* search: PCRE2 (JIT) or a literal fast path over a parallel, ignore-aware directory walk.
 *
 * Each file is read whole into a per-thread buffer and searched as one subject (MULTILINE), not
 * line by line: the regex engine skips ahead on its own and only lines with a match cost
 * anything more. A match that crosses a newline is re-tried within its first line, so results
 * are line-oriented like grep's. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tool_int.h"

#include <errno.h>
#include <fcntl.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_LINE_SHOWN 400

typedef struct {
    const char *lit;
    size_t len, rare;   /* rare: index of the byte memchr looks for */
    bool icase;         /* ASCII case-insensitive */
} prefilter;

typedef struct {
    char *path;
    json_t *items;      /* matches of this file, in line order */
} file_hits;

typedef struct {
    char *buf;
    size_t cap;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    file_hits *hits;
    size_t n_hits, cap_hits;
    long files, bin, large, limit;
    json_t *limited;    /* files where the match limit stopped the search */
} worker_state;

typedef struct {
    tool_ctx *ctx;
    const char *literal;       /* case-sensitive literal fast path, or NULL */
    size_t lit_len;
    prefilter pf;              /* a literal every match contains (pf.len 0: none) */
    pcre2_code *code;
    bool jit;
    json_t *include, *exclude;
    int context;
    long max_results;
    atomic_long results;
    atomic_long matched_files;
    volatile int stop;
    bool truncated;
    double deadline;
    bool timed_out;
    worker_state *ws;
    int nws;
} search_state;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool any_glob(json_t *arr, const char *rel) {
    size_t i;
    json_t *g;
    json_array_foreach(arr, i, g) if (tool_glob_match(json_string_value(g), rel)) return true;
    return false;
}

static const char *line_start(const char *buf, const char *p) {
    while (p > buf && p[-1] != '\n') p--;
    return p;
}

/* ---- literal prefilter ----
 * A literal that every match must contain is found with memchr on its rarest byte and then
 * verified; only lines holding it are given to the regex engine (as ripgrep does). */

/* Rough rank of how common a byte is in source text and prose (higher = more common). */
static int byte_rank(unsigned char c) {
    static const char common[] = "etaoinsrhldcumfpgwybvkxjqz";
    if (c == ' ' || c == '\n' || c == '\t') return 255;
    if (c >= 'a' && c <= 'z') return 230 - (int)(strchr(common, c) - common) * 4;
    if (c >= 'A' && c <= 'Z') return 140 - (int)(strchr(common, c + 32) - common) * 2;
    if (c >= '0' && c <= '9') return 120;
    if (c == '_' || c == '(' || c == ')' || c == ';' || c == ',' || c == '.') return 200;
    if (strchr("=*/-\"'{}", c)) return 170;
    if (strchr("<>#:[]&|!+", c)) return 150;
    if (c >= 0x80) return 40;
    return 60;
}

static void pf_init(prefilter *pf, const char *lit, size_t len, bool icase) {
    pf->lit = lit;
    pf->len = len;
    pf->icase = icase;
    pf->rare = 0;
    int best = 1000;
    for (size_t i = 0; i < len; i++) {
        int r = byte_rank((unsigned char)lit[i]);
        if (r < best) {
            best = r;
            pf->rare = i;
        }
    }
}

static bool ascii_eq_icase(const char *a, const char *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char x = (unsigned char)a[i], y = (unsigned char)b[i];
        if (x >= 'A' && x <= 'Z') x += 32;
        if (y >= 'A' && y <= 'Z') y += 32;
        if (x != y) return false;
    }
    return true;
}

/* Next occurrence of the literal in [p, e), or NULL. */
static const char *pf_find(const prefilter *pf, const char *p, const char *e) {
    size_t n = pf->len, k = pf->rare;
    if ((size_t)(e - p) < n) return NULL;
    const char *q = p + k, *qe = e - (n - k) + 1;
    unsigned char c = (unsigned char)pf->lit[k];
    unsigned char lo = c, up = c;
    if (pf->icase && c >= 'a' && c <= 'z') up = c - 32;
    if (pf->icase && c >= 'A' && c <= 'Z') lo = c + 32;
    const char *h1 = NULL, *h2 = NULL;
    while (q < qe) {
        const char *h;
        if (lo == up) {
            h = memchr(q, c, (size_t)(qe - q));
        } else {
            if (!h1 || h1 < q) h1 = memchr(q, lo, (size_t)(qe - q));
            if (!h2 || h2 < q) h2 = memchr(q, up, (size_t)(qe - q));
            if (!h1) h1 = qe;
            if (!h2) h2 = qe;
            h = h1 < h2 ? h1 : h2;
            if (h == qe) h = NULL;
        }
        if (!h) return NULL;
        const char *st = h - k;
        if (pf->icase ? ascii_eq_icase(st, pf->lit, n) : !memcmp(st, pf->lit, n)) return st;
        q = h + 1;
    }
    return NULL;
}

/* The longest run of literal bytes that every match of `re` must contain, or NULL (then
 * no prefilter). Conservative: any alternation, group option or \Q gives up; runs inside
 * groups or before an optional quantifier are not used. Caller frees. */
static char *required_literal(const char *re, bool icase, size_t *out_len) {
    *out_len = 0;
    if (strstr(re, "(?") || strstr(re, "\\Q")) return NULL;
    size_t n = strlen(re);
    char *run = malloc(n + 1), *best = malloc(n + 1);
    if (!run || !best) {
        free(run);
        free(best);
        return NULL;
    }
    size_t rl = 0, bl = 0;
    int depth = 0;
#define END_RUN()                      \
    do {                               \
        if (rl > bl) {                 \
            memcpy(best, run, rl);     \
            bl = rl;                   \
        }                              \
        rl = 0;                        \
    } while (0)
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)re[i];
        bool lit = false;
        if (c == '\\') {
            if (i + 1 >= n) break;
            unsigned char e = (unsigned char)re[++i];
            if ((e >= '0' && e <= '9') || (e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) {
                END_RUN(); /* \w \d \b \x.. \1 ...: not a literal */
                continue;
            }
            c = e;
            lit = true;
        } else if (c == '[') {
            END_RUN();
            size_t j = i + 1;
            if (j < n && re[j] == '^') j++;
            if (j < n && re[j] == ']') j++;
            while (j < n && re[j] != ']') j += re[j] == '\\' ? 2 : 1;
            i = j;
            continue;
        } else if (c == '(') {
            depth++;
            END_RUN();
            continue;
        } else if (c == ')') {
            depth--;
            END_RUN();
            continue;
        } else if (c == '|') {
            free(run);
            free(best);
            return NULL;
        } else if (c == '.' || c == '^' || c == '$') {
            END_RUN();
            continue;
        } else if (c == '*' || c == '?' || c == '+' || c == '{') {
            size_t j = i + 1;
            if (c == '{') { /* a real quantifier {n}, {n,}, {n,m}; else a literal '{' */
                while (j < n && ((re[j] >= '0' && re[j] <= '9') || re[j] == ',')) j++;
                if (j == i + 1 || j >= n || re[j] != '}') {
                    lit = true;
                } else {
                    bool zero = re[i + 1] == '0';
                    if (zero && rl) rl--;
                    END_RUN();
                    i = j;
                    if (i + 1 < n && (re[i + 1] == '?' || re[i + 1] == '+')) i++;
                    continue;
                }
            }
            if (!lit) {
                if (c != '+' && rl) rl--; /* the atom before * or ? may be absent */
                END_RUN();
                if (i + 1 < n && (re[i + 1] == '?' || re[i + 1] == '+')) i++;
                continue;
            }
        } else {
            lit = true;
        }
        if (lit) {
            /* caseless UTF matching folds k and s with non-ASCII letters (KELVIN SIGN, long
             * s): those cannot be found by an ASCII prefilter */
            if (depth != 0 || (icase && (c >= 0x80 || c == 'k' || c == 'K' || c == 's' ||
                                         c == 'S'))) {
                END_RUN();
                continue;
            }
            run[rl++] = (char)c;
        }
    }
    END_RUN();
#undef END_RUN
    free(run);
    if (bl < 3 || depth != 0) {
        free(best);
        return NULL;
    }
    best[bl] = '\0';
    *out_len = bl;
    return best;
}

/* Find the next match at or after `pos`; returns 1 with [*ms,*me), 0 for none, <0 error. */
static int find_next(search_state *s, worker_state *w, const char *buf, size_t len, size_t pos,
                     size_t *ms, size_t *me) {
    if (s->literal) {
        if (pos >= len) return 0;
        const char *p = pf_find(&s->pf, buf + pos, buf + len);
        if (!p) return 0;
        *ms = (size_t)(p - buf);
        *me = *ms + s->lit_len;
        return 1;
    }
    if (s->pf.len) {
        /* only lines holding the required literal go to the regex engine, one at a time */
        while (pos < len) {
            const char *h = pf_find(&s->pf, buf + pos, buf + len);
            if (!h) return 0;
            const char *ls = line_start(buf, h);
            const char *nl = memchr(h, '\n', (size_t)(buf + len - h));
            size_t le = nl ? (size_t)(nl - buf) : len;
            size_t from = (size_t)(ls - buf) > pos ? (size_t)(ls - buf) : pos;
            int r = s->jit ? pcre2_jit_match(s->code, (PCRE2_SPTR)buf, le, from, 0, w->md, w->mctx)
                           : pcre2_match(s->code, (PCRE2_SPTR)buf, le, from, 0, w->md, w->mctx);
            if (r >= 0) {
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
                *ms = ov[0];
                *me = ov[1];
                return 1;
            }
            if (r != PCRE2_ERROR_NOMATCH) return r;
            pos = le + 1;
        }
        return 0;
    }
    int r = s->jit ? pcre2_jit_match(s->code, (PCRE2_SPTR)buf, len, pos, 0, w->md, w->mctx)
                   : pcre2_match(s->code, (PCRE2_SPTR)buf, len, pos, 0, w->md, w->mctx);
    if (r == PCRE2_ERROR_NOMATCH) return 0;
    if (r < 0) return r;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

static json_t *line_json(const char *ls, const char *le) {
    if (le > ls && le[-1] == '\r') le--;
    size_t n = (size_t)(le - ls);
    bool cut = n > MAX_LINE_SHOWN;
    if (cut) {
        n = MAX_LINE_SHOWN;
        while (n > 0 && ((unsigned char)ls[n] & 0xC0) == 0x80) n--;
    }
    json_t *j = tool_json_text(ls, n);
    if (cut && j) {
        size_t l = json_string_length(j);
        char *t = malloc(l + 8);
        if (t) {
            memcpy(t, json_string_value(j), l);
            memcpy(t + l, " [...]", 7);
            json_string_setn(j, t, l + 6);
            free(t);
        }
    }
    return j;
}

static json_t *context_lines(const char *buf, size_t len, const char *ls, const char *le,
                             int n, bool before) {
    json_t *arr = json_array();
    if (before) {
        const char *cur = ls;
        const char *starts[32];
        int k = 0;
        while (k < n && cur > buf) {
            const char *pe = cur - 1; /* the '\n' ending the previous line */
            const char *ps = line_start(buf, pe);
            starts[k++] = ps;
            cur = ps;
        }
        for (int i = k - 1; i >= 0; i--) {
            const char *e = memchr(starts[i], '\n', (size_t)(buf + len - starts[i]));
            json_array_append_new(arr, line_json(starts[i], e ? e : buf + len));
        }
    } else {
        const char *cur = le < buf + len ? le + 1 : buf + len;
        for (int i = 0; i < n && cur < buf + len; i++) {
            const char *e = memchr(cur, '\n', (size_t)(buf + len - cur));
            json_array_append_new(arr, line_json(cur, e ? e : buf + len));
            cur = e ? e + 1 : buf + len;
        }
    }
    return arr;
}

static int search_buffer(search_state *s, worker_state *w, const char *rel, const char *buf,
                         size_t len) {
    size_t pos = 0, counted_to = 0;
    long line_no = 1;
    json_t *items = NULL;
    int rc = 0;
    while (pos <= len && !s->stop) {
        size_t ms, me;
        int r = find_next(s, w, buf, len, pos, &ms, &me);
        if (r == 0) break;
        if (r < 0) {
            if (r == PCRE2_ERROR_MATCHLIMIT || r == PCRE2_ERROR_DEPTHLIMIT ||
                r == PCRE2_ERROR_HEAPLIMIT || r == PCRE2_ERROR_JIT_STACKLIMIT) {
                w->limit++;
                if (json_array_size(w->limited) < 20)
                    json_array_append_new(w->limited, json_string(rel));
                break;
            }
            rc = tool_err(TOOL_EINTERNAL, "regex match failed (%d) in %s", r, rel);
            break;
        }
        const char *ls = line_start(buf, buf + ms);
        const char *nl = memchr(buf + ms, '\n', len - ms);
        const char *le = nl ? nl : buf + len;
        if (me > (size_t)(le - buf)) {
            /* crossed a newline: a match within this line only, if any */
            size_t ms2, me2;
            int r2 = s->literal ? 0
                                : find_next(s, w, buf, (size_t)(le - buf),
                                            (size_t)(ls - buf) > pos ? (size_t)(ls - buf) : pos,
                                            &ms2, &me2);
            if (r2 <= 0) {
                pos = (size_t)(le - buf) + 1;
                continue;
            }
        }
        if (me == ms && ms == len && ms > 0 && buf[len - 1] == '\n') break; /* past last line */
        /* line number: count newlines since the last counted position */
        for (const char *p = buf + counted_to; p < ls;) {
            const char *q = memchr(p, '\n', (size_t)(ls - p));
            if (!q) break;
            line_no++;
            p = q + 1;
        }
        counted_to = (size_t)(ls - buf);
        long n = atomic_fetch_add(&s->results, 1);
        if (n >= s->max_results) {
            s->truncated = true;
            s->stop = 1;
            break;
        }
        if (!items) items = json_array();
        json_t *m = json_object();
        json_object_set_new(m, "line", json_integer(line_no));
        json_object_set_new(m, "text", line_json(ls, le));
        if (s->context > 0) {
            json_object_set_new(m, "before", context_lines(buf, len, ls, le, s->context, true));
            json_object_set_new(m, "after", context_lines(buf, len, ls, le, s->context, false));
        }
        json_array_append_new(items, m);
        pos = (size_t)(le - buf) + 1;
        if (now_s() > s->deadline) {
            s->timed_out = true;
            s->stop = 1;
        }
    }
    if (items) {
        if (w->n_hits == w->cap_hits) {
            size_t nc = w->cap_hits ? w->cap_hits * 2 : 64;
            file_hits *nh = realloc(w->hits, nc * sizeof *nh);
            if (!nh) {
                json_decref(items);
                return tool_err(TOOL_ENOMEM, "out of memory");
            }
            w->hits = nh;
            w->cap_hits = nc;
        }
        w->hits[w->n_hits].path = strdup(rel);
        w->hits[w->n_hits++].items = items;
        atomic_fetch_add(&s->matched_files, 1);
    }
    return rc;
}

static int search_fd(search_state *s, worker_state *w, const char *rel, int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    if ((uint64_t)st.st_size > s->ctx->opt.max_file_bytes) {
        w->large++;
        return 0;
    }
    size_t need = (size_t)st.st_size + 1;
    if (need > w->cap) {
        size_t nc = need < (1u << 16) ? (1u << 16) : need + need / 4;
        char *nb = realloc(w->buf, nc);
        if (!nb) return tool_err(TOOL_ENOMEM, "out of memory");
        w->buf = nb;
        w->cap = nc;
    }
    size_t n = 0;
    while (n < (size_t)st.st_size) {
        ssize_t r = read(fd, w->buf + n, (size_t)st.st_size - n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        n += (size_t)r;
    }
    w->files++;
    if (memchr(w->buf, '\0', n)) {
        w->bin++;
        return 0;
    }
    return search_buffer(s, w, rel, w->buf, n);
}

static int walk_cb(void *user, const tool_walk_entry *e, int worker) {
    search_state *s = user;
    if (s->stop) return 1;
    if (e->is_dir) return s->exclude && any_glob(s->exclude, e->rel) ? 1 : 0;
    if (s->exclude && any_glob(s->exclude, e->rel)) return 0;
    if (s->include && !any_glob(s->include, e->rel)) return 0;
    if (now_s() > s->deadline) {
        s->timed_out = true;
        s->stop = 1;
        return 1;
    }
    int fd = openat(e->dirfd, e->name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return 0;
    int rc = search_fd(s, &s->ws[worker], e->rel, fd);
    close(fd);
    return rc < 0 ? rc : 0;
}

static int hits_cmp(const void *a, const void *b) {
    return strcmp(((const file_hits *)a)->path, ((const file_hits *)b)->path);
}

/* A literal turned into a regex that matches it exactly. */
static char *escape_literal(const char *p) {
    size_t n = strlen(p);
    char *o = malloc(n * 2 + 1);
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c < 0x80 && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                          (c >= 'A' && c <= 'Z') || c == '_' || c == ' '))
            o[k++] = '\\';
        o[k++] = (char)c;
    }
    o[k] = '\0';
    return o;
}

int tool_search(tool_ctx *ctx, json_t *args, json_t *res) {
    const char *pattern = tool_arg_str(args, "pattern", "");
    bool literal = tool_arg_bool(args, "literal", false);
    bool icase = tool_arg_bool(args, "case_insensitive", false);
    bool word = tool_arg_bool(args, "word", false);
    char *rel = NULL, *rx = NULL;
    int rc = tool_path_clean(ctx, tool_arg_str(args, "path", "."), &rel);
    if (rc < 0) return rc;
    search_state s;
    memset(&s, 0, sizeof s);
    s.ctx = ctx;
    s.context = (int)tool_arg_int(args, "context", 0);
    s.max_results = (long)tool_arg_int(args, "max_results", 200);
    s.include = json_array_size(json_object_get(args, "include")) ? json_object_get(args, "include")
                                                                   : NULL;
    s.exclude = json_array_size(json_object_get(args, "exclude")) ? json_object_get(args, "exclude")
                                                                   : NULL;
    s.deadline = now_s() + 30.0;
    char *req = NULL;
    if (literal && !icase && !word) {
        s.literal = pattern;
        s.lit_len = strlen(pattern);
        pf_init(&s.pf, pattern, s.lit_len, false);
    } else {
        const char *src = pattern;
        if (literal) {
            rx = escape_literal(pattern);
            if (!rx) {
                rc = tool_err(TOOL_ENOMEM, "out of memory");
                goto done;
            }
            src = rx;
        }
        size_t rq = 0;
        req = required_literal(src, icase, &rq);
        if (req) pf_init(&s.pf, req, rq, icase);
        if (word) {
            size_t n = strlen(src);
            char *w = malloc(n + 32);
            if (!w) {
                rc = tool_err(TOOL_ENOMEM, "out of memory");
                goto done;
            }
            snprintf(w, n + 32, "(?<!\\w)(?:%s)(?!\\w)", src);
            free(rx);
            rx = w;
            src = rx;
        }
        int err;
        PCRE2_SIZE off;
        uint32_t opts = PCRE2_MULTILINE | PCRE2_UTF | PCRE2_MATCH_INVALID_UTF |
                        (icase ? PCRE2_CASELESS : 0);
        s.code = pcre2_compile((PCRE2_SPTR)src, PCRE2_ZERO_TERMINATED, opts, &err, &off, NULL);
        if (!s.code) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            rc = tool_err(TOOL_EINVAL, "bad regular expression at offset %zu: %s", (size_t)off,
                          (const char *)msg);
            goto done;
        }
        s.jit = pcre2_jit_compile(s.code, PCRE2_JIT_COMPLETE) == 0;
    }
    s.nws = ctx->threads;
    s.ws = calloc((size_t)s.nws, sizeof *s.ws);
    if (!s.ws) {
        rc = tool_err(TOOL_ENOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < s.nws; i++) {
        worker_state *w = &s.ws[i];
        w->limited = json_array();
        if (!s.code) continue;
        w->md = pcre2_match_data_create_from_pattern(s.code, NULL);
        w->mctx = pcre2_match_context_create(NULL);
        if (!w->md || !w->mctx) {
            rc = tool_err(TOOL_ENOMEM, "out of memory");
            goto done;
        }
        pcre2_set_match_limit(w->mctx, 20u * 1000 * 1000);
        pcre2_set_depth_limit(w->mctx, 100000);
        pcre2_set_heap_limit(w->mctx, 64 * 1024); /* KiB */
        if (s.jit) {
            w->jstack = pcre2_jit_stack_create(32 * 1024, 4 << 20, NULL);
            if (w->jstack) pcre2_jit_stack_assign(w->mctx, NULL, w->jstack);
        }
    }
    /* A single file is searched directly (even if an ignore rule names it). */
    struct stat st;
    int fd = tool_path_open(ctx, rel, O_RDONLY | O_NOCTTY, 0, false);
    if (fd < 0) {
        rc = fd;
        goto done;
    }
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        rc = search_fd(&s, &s.ws[0], rel, fd);
        close(fd);
    } else {
        close(fd);
        tool_walk_opts o = {rel, 0, tool_arg_bool(args, "hidden", false),
                            tool_arg_bool(args, "no_ignore", false), s.nws, &s.stop};
        rc = tool_walk(ctx, &o, walk_cb, &s);
    }
    if (rc < 0) goto done;
    /* Merge per-thread results in path order. */
    size_t total = 0;
    for (int i = 0; i < s.nws; i++) total += s.ws[i].n_hits;
    file_hits *all = calloc(total ? total : 1, sizeof *all);
    if (!all) {
        rc = tool_err(TOOL_ENOMEM, "out of memory");
        goto done;
    }
    size_t k = 0;
    long files = 0, bin = 0, large = 0, limit = 0;
    json_t *limited = json_array();
    for (int i = 0; i < s.nws; i++) {
        worker_state *w = &s.ws[i];
        if (w->n_hits) memcpy(all + k, w->hits, w->n_hits * sizeof *all);
        k += w->n_hits;
        w->n_hits = 0;
        files += w->files;
        bin += w->bin;
        large += w->large;
        limit += w->limit;
        json_array_extend(limited, w->limited);
    }
    qsort(all, total, sizeof *all, hits_cmp);
    json_t *matches = json_array();
    long count = 0;
    for (size_t i = 0; i < total; i++) {
        size_t j;
        json_t *m;
        json_array_foreach(all[i].items, j, m) {
            json_t *o = json_object();
            json_object_set_new(o, "path", json_string(all[i].path));
            json_object_update(o, m);
            json_array_append_new(matches, o);
            count++;
        }
        json_decref(all[i].items);
        free(all[i].path);
    }
    free(all);
    json_object_set_new(res, "matches", matches);
    json_object_set_new(res, "match_count", json_integer(count));
    json_object_set_new(res, "files_matched", json_integer((json_int_t)total));
    json_object_set_new(res, "files_searched", json_integer(files));
    if (bin) json_object_set_new(res, "binary_files_skipped", json_integer(bin));
    if (large) json_object_set_new(res, "large_files_skipped", json_integer(large));
    if (limit) {
        json_object_set_new(res, "match_limit_files", limited);
        json_object_set_new(res, "note", json_string("the pattern backtracks too much on some "
                                                     "files: their search stopped early"));
    } else {
        json_decref(limited);
    }
    if (s.truncated || s.timed_out) {
        json_object_set_new(res, "truncated", json_true());
        json_object_set_new(res, "truncated_by", json_string(s.timed_out ? "time limit (30 s)"
                                                                         : "max_results"));
    }
done:
    if (s.ws) {
        for (int i = 0; i < s.nws; i++) {
            worker_state *w = &s.ws[i];
            for (size_t j = 0; j < w->n_hits; j++) {
                free(w->hits[j].path);
                json_decref(w->hits[j].items);
            }
            free(w->hits);
            free(w->buf);
            json_decref(w->limited);
            if (w->md) pcre2_match_data_free(w->md);
            if (w->mctx) pcre2_match_context_free(w->mctx);
            if (w->jstack) pcre2_jit_stack_free(w->jstack);
        }
        free(s.ws);
    }
    if (s.code) pcre2_code_free(s.code);
    free(req);
    free(rx);
    free(rel);
    return rc;
}
