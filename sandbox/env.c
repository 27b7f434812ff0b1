/* The environment a command gets, and the small string helpers of the plan. */
#include "sandbox_int.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Names that carry credentials by convention: matched anywhere in the name, any case. */
static const char *const secret_words[] = {"KEY", "TOKEN", "SECRET", "PASSW", "CREDENTIAL",
                                           "PRIVATE", "COOKIE"};
/* Exact names that point at credential agents. */
static const char *const secret_names[] = {"SSH_AUTH_SOCK", "SSH_AGENT_PID", "GPG_AGENT_INFO",
                                           "SPARK_API_KEY", "KRB5CCNAME"};

bool sandbox_env_is_secret(const char *entry) {
    const char *eq = strchr(entry, '=');
    size_t n = eq ? (size_t)(eq - entry) : strlen(entry);
    for (size_t i = 0; i < sizeof secret_names / sizeof secret_names[0]; i++)
        if (strlen(secret_names[i]) == n && !strncmp(entry, secret_names[i], n)) return true;
    for (size_t i = 0; i < sizeof secret_words / sizeof secret_words[0]; i++) {
        size_t w = strlen(secret_words[i]);
        for (size_t j = 0; j + w <= n; j++)
            if (!strncasecmp(entry + j, secret_words[i], w)) return true;
    }
    return false;
}

char *sandbox_strdup(sandbox_strings *s, const char *str) {
    return sandbox_strcat3(s, str, "", "");
}

char *sandbox_strcat3(sandbox_strings *s, const char *a, const char *b, const char *c) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 32;
        char **items = realloc(s->items, cap * sizeof *items);
        if (!items) return NULL;
        s->items = items;
        s->cap = cap;
    }
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    char *r = malloc(la + lb + lc + 1);
    if (!r) return NULL;
    memcpy(r, a, la);
    memcpy(r + la, b, lb);
    memcpy(r + la + lb, c, lc + 1);
    s->items[s->n++] = r;
    return r;
}

void sandbox_strings_free(sandbox_strings *s) {
    for (size_t i = 0; i < s->n; i++) free(s->items[i]);
    free(s->items);
    s->items = NULL;
    s->n = s->cap = 0;
}

size_t sandbox_cstr_len(const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    return n;
}

/* dst = a b c, truncated to cap - 1 bytes, always NUL-terminated. */
void sandbox_cstr_copy(char *dst, size_t cap, const char *a, const char *b, const char *c) {
    const char *parts[3] = {a, b, c};
    size_t n = 0;
    for (int i = 0; i < 3; i++)
        for (const char *q = parts[i]; q && *q && n + 1 < cap; q++) dst[n++] = *q;
    if (cap) dst[n] = 0;
}
