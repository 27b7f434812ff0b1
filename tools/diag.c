/* Compiler and test-runner output -> structured diagnostics. Untrusted input (whatever a build
 * prints): every scan is bounded by the line it is on. */
#include "tool_int.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_DIAGS 500
#define MAX_LINE 4096

typedef struct {
    json_t *arr;
    /* rustc: "error[E0308]: msg" waits for its "  --> file:line:col" line */
    char pend_sev[16];
    char pend_msg[512];
    char pend_code[40];
    bool pending;
} dstate;

/* Copy a line without ANSI colour sequences and without the trailing CR. */
static size_t clean_line(const char *s, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n && o < MAX_LINE - 1; i++) {
        if (s[i] == '\x1b' && i + 1 < n && s[i + 1] == '[') {
            i += 2;
            while (i < n && !(s[i] >= '@' && s[i] <= '~')) i++;
            continue;
        }
        out[o++] = s[i];
    }
    while (o && (out[o - 1] == '\r' || out[o - 1] == ' ')) o--;
    out[o] = '\0';
    return o;
}

static void add(dstate *st, const char *file, size_t fl, long line, long col, const char *sev,
                const char *msg, const char *code, const char *tool) {
    if (json_array_size(st->arr) >= MAX_DIAGS || !fl) return;
    json_t *d = json_object();
    json_object_set_new(d, "file", tool_json_text(file, fl));
    if (line > 0) json_object_set_new(d, "line", json_integer(line));
    if (col > 0) json_object_set_new(d, "col", json_integer(col));
    json_object_set_new(d, "severity", json_string(sev));
    json_object_set_new(d, "message", tool_json_text(msg, strlen(msg)));
    if (code && *code) json_object_set_new(d, "code", json_string(code));
    json_object_set_new(d, "tool", json_string(tool));
    /* the same diagnostic twice (gcc repeats some) is kept once */
    size_t i;
    json_t *x;
    json_array_foreach(st->arr, i, x) {
        if (json_equal(x, d)) {
            json_decref(d);
            return;
        }
    }
    json_array_append_new(st->arr, d);
}

static long num(const char **p, const char *e) {
    long v = 0;
    int k = 0;
    while (*p < e && isdigit((unsigned char)**p) && k < 9) {
        v = v * 10 + (**p - '0');
        (*p)++;
        k++;
    }
    if (k == 0 || (*p < e && isdigit((unsigned char)**p))) return -1;
    return v;
}

/* "error: m", "error[E0308]: m", "fatal error: m", "warning: m", "note: m", "error TS2322: m".
 * Returns the severity (static) and sets *msg, *code; NULL when `s` starts with none. */
static const char *severity(const char *s, const char **msg, char *code, size_t codecap) {
    static const char *const words[] = {"fatal error", "error", "warning", "note", "remark",
                                        "info", "help"};
    static const char *const names[] = {"error", "error", "warning", "note", "note", "note",
                                        "note"};
    code[0] = '\0';
    for (size_t w = 0; w < sizeof words / sizeof words[0]; w++) {
        size_t wl = strlen(words[w]);
        if (strncasecmp(s, words[w], wl)) continue;
        const char *p = s + wl;
        if (*p == '[') {
            const char *q = strchr(p, ']');
            if (!q || (size_t)(q - p) > 30) continue;
            snprintf(code, codecap, "%.*s", (int)(q - p - 1), p + 1);
            p = q + 1;
        } else if (*p == ' ' && p[1] == 'T' && p[2] == 'S' && isdigit((unsigned char)p[3])) {
            const char *q = p + 1;
            while (*q && *q != ':') q++;
            if (!*q || (size_t)(q - p) > 30) continue;
            snprintf(code, codecap, "%.*s", (int)(q - p - 1), p + 1);
            p = q;
        }
        if (*p != ':') continue;
        p++;
        while (*p == ' ') p++;
        *msg = p;
        return names[w];
    }
    return NULL;
}

static bool ends_with(const char *s, size_t n, const char *suf) {
    size_t k = strlen(suf);
    return n >= k && !memcmp(s + n - k, suf, k);
}

static void parse_line(dstate *st, const char *l, size_t n) {
    const char *e = l + n;
    char code[40];
    const char *msg;
    /* rustc's header line and its location line */
    const char *sev = severity(l, &msg, code, sizeof code);
    if (sev && l[0] != ' ') {
        snprintf(st->pend_sev, sizeof st->pend_sev, "%s", sev);
        snprintf(st->pend_msg, sizeof st->pend_msg, "%s", msg);
        snprintf(st->pend_code, sizeof st->pend_code, "%s", code);
        st->pending = true;
        return;
    }
    const char *p = l;
    while (p < e && *p == ' ') p++;
    if (st->pending && e - p > 4 && !memcmp(p, "--> ", 4)) {
        p += 4;
        const char *c1 = memchr(p, ':', (size_t)(e - p));
        if (c1) {
            const char *q = c1 + 1;
            long line = num(&q, e), col = -1;
            if (q < e && *q == ':') {
                q++;
                col = num(&q, e);
            }
            if (line > 0)
                add(st, p, (size_t)(c1 - p), line, col, st->pend_sev, st->pend_msg,
                    st->pend_code, "rustc");
        }
        st->pending = false;
        return;
    }
    if (l[0] == ' ' || l[0] == '\t' || n < 3) return;
    /* pytest summary: "FAILED tests/test_a.py::test_x - AssertionError: ..." */
    if (!strncmp(l, "FAILED ", 7) || !strncmp(l, "ERROR ", 6)) {
        const char *f = l + (l[0] == 'F' ? 7 : 6);
        const char *sep = strstr(f, "::");
        const char *dash = strstr(f, " - ");
        const char *fe = sep ? sep : dash ? dash : e;
        if (ends_with(f, (size_t)(fe - f), ".py")) {
            char m[600];
            snprintf(m, sizeof m, "%s", dash ? dash + 3 : l[0] == 'F' ? "test failed" : "error");
            char test[300] = "";
            if (sep) snprintf(test, sizeof test, "%.*s", (int)((dash ? dash : e) - sep - 2), sep + 2);
            add(st, f, (size_t)(fe - f), -1, -1, "error", m, test, "pytest");
        }
        return;
    }
    /* tsc: "src/a.ts(3,7): error TS2322: msg" */
    const char *par = memchr(l, '(', n);
    if (par && par > l) {
        const char *q = par + 1;
        long line = num(&q, e);
        if (line > 0 && q < e && *q == ',') {
            q++;
            long col = num(&q, e);
            if (col > 0 && e - q > 3 && q[0] == ')' && q[1] == ':' && q[2] == ' ') {
                sev = severity(q + 3, &msg, code, sizeof code);
                if (sev) {
                    add(st, l, (size_t)(par - l), line, col, sev, msg, code, "tsc");
                    return;
                }
            }
        }
    }
    /* file:line[:col]: severity: msg  (gcc, clang, cargo short, go, pytest, tsc --pretty) */
    for (const char *c = l; c < e; c++) {
        if (*c == ' ' && c == l) return;
        if (*c != ':' || c == l || c + 1 >= e || !isdigit((unsigned char)c[1])) continue;
        const char *q = c + 1;
        long line = num(&q, e), col = -1;
        if (line <= 0) continue;
        if (q < e && *q == ':' && q + 1 < e && isdigit((unsigned char)q[1])) {
            q++;
            col = num(&q, e);
        }
        const char *rest;
        if (q < e && *q == ':') rest = q + 1;
        else if (e - q >= 3 && !memcmp(q, " - ", 3)) rest = q + 3; /* tsc --pretty */
        else continue;
        while (rest < e && *rest == ' ') rest++;
        size_t fl = (size_t)(c - l);
        sev = severity(rest, &msg, code, sizeof code);
        const char *tool = ends_with(l, fl, ".go") ? "go"
                           : ends_with(l, fl, ".ts") || ends_with(l, fl, ".tsx") ? "tsc"
                           : ends_with(l, fl, ".rs") ? "rustc"
                           : ends_with(l, fl, ".py") ? "pytest" : "cc";
        if (sev) {
            add(st, l, fl, line, col, sev, msg, code, tool);
        } else if (ends_with(l, fl, ".go") && rest < e) {
            add(st, l, fl, line, col, "error", rest, "", "go");
        } else if (ends_with(l, fl, ".py") && rest < e && (strstr(rest, "Error") ||
                                                           strstr(rest, "Exception"))) {
            add(st, l, fl, line, col, "error", rest, "", "pytest");
        }
        return;
    }
}

int tool_diag_parse(const char *text, size_t len, json_t **out) {
    *out = NULL;
    dstate st;
    memset(&st, 0, sizeof st);
    st.arr = json_array();
    if (!st.arr) return tool_err(TOOL_ENOMEM, "out of memory");
    char *line = malloc(MAX_LINE);
    if (!line) {
        json_decref(st.arr);
        return tool_err(TOOL_ENOMEM, "out of memory");
    }
    const char *p = text, *e = text + len;
    while (p < e && json_array_size(st.arr) < MAX_DIAGS) {
        const char *nl = memchr(p, '\n', (size_t)(e - p));
        const char *le = nl ? nl : e;
        size_t n = clean_line(p, (size_t)(le - p), line);
        if (n) parse_line(&st, line, n);
        p = nl ? nl + 1 : e;
    }
    free(line);
    *out = st.arr;
    return 0;
}
