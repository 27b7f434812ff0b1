/* Small shared helpers of grammars/: growable arrays and text buffers. */
#include "grammar_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int grammar_grow(void **p, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : 16;
    while (n < need) {
        if (n > SIZE_MAX / 2 / size) return GRAMMAR_ENOMEM;
        n *= 2;
    }
    void *q = realloc(*p, n * size);
    if (!q) return GRAMMAR_ENOMEM;
    *p = q;
    *cap = n;
    return 0;
}

void grammar_buf_put(grammar_buf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (grammar_grow((void **)&b->data, &b->cap, b->len + n + 1, 1) != 0) {
        b->failed = 1;
        return;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

void grammar_buf_puts(grammar_buf *b, const char *s) {
    grammar_buf_put(b, s, strlen(s));
}

void grammar_buf_printf(grammar_buf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = 1;
        return;
    }
    if ((size_t)n < sizeof tmp) {
        grammar_buf_put(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->failed = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    grammar_buf_put(b, big, (size_t)n);
    free(big);
}

void grammar_buf_put_gbnf_literal(grammar_buf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            grammar_buf_put(b, e, 2);
        } else if (c == '\n') {
            grammar_buf_put(b, "\\n", 2);
        } else if (c == '\r') {
            grammar_buf_put(b, "\\r", 2);
        } else if (c == '\t') {
            grammar_buf_put(b, "\\t", 2);
        } else if (c < 0x20 || c == 0x7f) {
            grammar_buf_printf(b, "\\x%02X", c);
        } else {
            grammar_buf_put(b, (const char *)&c, 1);
        }
    }
}
