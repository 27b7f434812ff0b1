/* One choke point: every process the project starts for a tool goes through sandbox_run().
 * This test scans the tree's C and CUDA sources (outside sandbox/) for calls that start
 * processes - fork, vfork, the exec family, posix_spawn, system, popen, clone/clone3 and their
 * raw system-call numbers - with comments and string literals removed, and fails on any file
 * that is not on the allow-list (tests/sandbox/chokepoint_allow.txt, each entry with its
 * reason). A self-check first proves the scanner finds a planted call and ignores comments and
 * strings. */
#include <dirent.h>
#include <fnmatch.h>
#include <limits.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sbx_util.h"

#define MAX_ALLOW 64

static regex_t re;
static struct {
    char glob[600];
    char reason[600];
    int used;
} allow[MAX_ALLOW];
static int n_allow;
static int violations, scanned;

/* Blank out comments, string and character literals (keeping newlines for line numbers). */
static void strip(char *s) {
    enum { CODE, LINE, BLOCK, STR, CHR } st = CODE;
    for (char *p = s; *p; p++) {
        switch (st) {
        case CODE:
            if (p[0] == '/' && p[1] == '/') st = LINE, *p = ' ';
            else if (p[0] == '/' && p[1] == '*') st = BLOCK, *p = ' ';
            else if (*p == '"') st = STR;
            else if (*p == '\'') st = CHR;
            break;
        case LINE:
            if (*p == '\n') st = CODE;
            else *p = ' ';
            break;
        case BLOCK:
            if (p[0] == '*' && p[1] == '/') st = CODE, p[0] = ' ', p[1] = ' ', p++;
            else if (*p != '\n') *p = ' ';
            break;
        case STR:
        case CHR:
            if (*p == '\\' && p[1]) p[0] = ' ', p[1] = p[1] == '\n' ? '\n' : ' ', p++;
            else if (*p == (st == STR ? '"' : '\'')) st = CODE;
            else if (*p != '\n') *p = ' ';
            break;
        }
    }
}

/* Calls found in text (already stripped): count, and print them with `path` when non-NULL. */
static int find_calls(const char *path, const char *text) {
    int found = 0;
    const char *p = text;
    regmatch_t m[2];
    while (regexec(&re, p, 2, m, p == text ? 0 : REG_NOTBOL) == 0) {
        int line = 1;
        for (const char *q = text; q < p + m[0].rm_so; q++) line += *q == '\n';
        if (path)
            printf("  %s:%d: %.*s\n", path, line, (int)(m[0].rm_eo - m[0].rm_so), p + m[0].rm_so);
        found++;
        p += m[0].rm_eo;
    }
    return found;
}

static const char *allowed(const char *rel) {
    for (int i = 0; i < n_allow; i++)
        if (fnmatch(allow[i].glob, rel, 0) == 0) {
            allow[i].used = 1;
            return allow[i].reason;
        }
    return NULL;
}

static void scan_file(const char *root, const char *rel) {
    char path[PATH_MAX * 2];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    FILE *f = fopen(path, "rb");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return;
    }
    fclose(f);
    buf[n] = 0;
    strip(buf);
    scanned++;
    if (strncmp(rel, "sandbox/", 8) != 0 && find_calls(NULL, buf)) {
        const char *why = allowed(rel);
        if (why) {
            printf("allowed %s (%s)\n", rel, why);
        } else {
            printf("VIOLATION %s starts processes outside sandbox_run():\n", rel);
            find_calls(rel, buf);
            violations++;
        }
    }
    free(buf);
}

static void walk(const char *root, const char *rel) {
    char path[PATH_MAX * 2];
    snprintf(path, sizeof path, "%s%s%s", root, rel[0] ? "/" : "", rel);
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        if (n[0] == '.' || !strcmp(n, "node_modules") || !strncmp(n, "build", 5)) continue;
        char sub[PATH_MAX + 300];
        if (strlen(rel) + strlen(n) + 2 > PATH_MAX) continue;
        snprintf(sub, sizeof sub, "%s%s%s", rel, rel[0] ? "/" : "", n);
        char full[PATH_MAX * 4];
        snprintf(full, sizeof full, "%s/%s", root, sub);
        struct stat st;
        if (lstat(full, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
            walk(root, sub);
        } else if (S_ISREG(st.st_mode)) {
            size_t l = strlen(n);
            if ((l > 2 && (!strcmp(n + l - 2, ".c") || !strcmp(n + l - 2, ".h"))) ||
                (l > 3 && (!strcmp(n + l - 3, ".cu"))) || (l > 4 && !strcmp(n + l - 4, ".cuh")))
                scan_file(root, sub);
        }
    }
    closedir(d);
}

static void load_allow(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        sbx_check(false, "read the allow-list %s", path);
        exit(1);
    }
    char line[600];
    while (fgets(line, sizeof line, f) && n_allow < MAX_ALLOW) {
        if (line[0] == '#' || line[0] == '\n') continue;
        line[strcspn(line, "\n")] = 0;
        char *tab = strchr(line, '\t');
        if (!tab || !tab[1]) {
            sbx_check(false, "allow-list entry '%s' has a glob, a tab and a reason", line);
            continue;
        }
        *tab = 0;
        snprintf(allow[n_allow].glob, sizeof allow[n_allow].glob, "%s", line);
        snprintf(allow[n_allow].reason, sizeof allow[n_allow].reason, "%s", tab + 1);
        n_allow++;
    }
    fclose(f);
}

int main(void) {
    const char *root = getenv("SPARK_SOURCE_DIR");
    if (!root) root = ".";
    const char *pat = "(^|[^A-Za-z0-9_.>])(fork|vfork|execl|execlp|execle|execv|execvp|execvpe|"
                      "execve|execveat|fexecve|posix_spawnp?|system|popen|clone3?)[[:space:]]*\\("
                      "|SYS_(clone3?|v?fork|execve(at)?)([^A-Za-z0-9_]|$)";
    if (regcomp(&re, pat, REG_EXTENDED | REG_NEWLINE) != 0) return 1;

    char sample[] = "/* fork() in a comment */ const char *s = \"system(x)\";\n"
                    "int f(void) { return me->fork(1) + posix_spawn_file_actions_init(0) + "
                    "engine_system(2); }\n"
                    "int g(void) { pid_t p = vfork (); return syscall(SYS_clone3, 0); }\n";
    strip(sample);
    sbx_check(find_calls(NULL, sample) == 2,
              "self-check: a planted vfork() and SYS_clone3 are found, comments, strings and "
              "look-alike names are not");

    char allow_path[PATH_MAX];
    snprintf(allow_path, sizeof allow_path, "%s/tests/sandbox/chokepoint_allow.txt", root);
    load_allow(allow_path);
    walk(root, "");
    sbx_check(scanned > 20, "scanned %d source files under %s", scanned, root);
    sbx_check(violations == 0, "no process is started outside sandbox_run() except where "
                               "allowed (%d violation%s)", violations, violations == 1 ? "" : "s");
    for (int i = 0; i < n_allow; i++)
        if (!allow[i].used) printf("note: allow-list entry '%s' matches nothing now\n",
                                   allow[i].glob);
    regfree(&re);
    return sbx_failures ? 1 : 0;
}
