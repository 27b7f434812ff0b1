/* Bounding what goes back to the model: head and tail kept, a note of what was cut. */
#include "tool_int.h"

#include <stdlib.h>
#include <string.h>

static size_t count_lines(const char *s, size_t n) {
    size_t c = 0;
    for (const char *p = s; (p = memchr(p, '\n', (size_t)(s + n - p))); p++) c++;
    return c;
}

int tool_bound_text(char **out, const char *text, size_t len, size_t cap) {
    *out = NULL;
    if (len <= cap) {
        char *s = malloc(len + 1);
        if (!s) return tool_err(TOOL_ENOMEM, "out of memory");
        memcpy(s, text, len);
        s[len] = '\0';
        *out = s;
        return 0;
    }
    if (cap < 128) cap = 128;
    size_t budget = cap - 80;
    size_t head = budget * 3 / 5, tail = budget - head;
    size_t he = head, ts = len - tail;
    /* Prefer line boundaries when one is near. */
    for (size_t i = he; i > head / 2; i--)
        if (text[i - 1] == '\n') {
            he = i;
            break;
        }
    for (size_t i = ts; i < len && i < ts + tail / 2; i++)
        if (text[i] == '\n') {
            ts = i + 1;
            break;
        }
    while (he > 0 && ((unsigned char)text[he] & 0xC0) == 0x80) he--;
    while (ts < len && ((unsigned char)text[ts] & 0xC0) == 0x80) ts++;
    char note[160];
    size_t cut = ts - he;
    int nl = snprintf(note, sizeof note, "%s[... %zu bytes (%zu lines) cut ...]\n",
                      he && text[he - 1] != '\n' ? "\n" : "", cut, count_lines(text + he, cut));
    size_t total = he + (size_t)nl + (len - ts);
    char *s = malloc(total + 1);
    if (!s) return tool_err(TOOL_ENOMEM, "out of memory");
    memcpy(s, text, he);
    memcpy(s + he, note, (size_t)nl);
    memcpy(s + he + nl, text + ts, len - ts);
    s[total] = '\0';
    *out = s;
    return 0;
}

typedef struct {
    json_t *str;
    size_t str_len;
    json_t *arr;
    const char *arr_key;
    size_t arr_n;
} biggest;

static void find_biggest(json_t *v, const char *key, biggest *b) {
    if (json_is_string(v)) {
        if (json_string_length(v) > b->str_len) {
            b->str = v;
            b->str_len = json_string_length(v);
        }
    } else if (json_is_array(v)) {
        if (json_array_size(v) > b->arr_n) {
            b->arr = v;
            b->arr_n = json_array_size(v);
            b->arr_key = key;
        }
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) find_biggest(x, key, b);
    } else if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) find_biggest(x, k, b);
    }
}

static void add_note(json_t *res, const char *key, size_t cut_n, size_t kept) {
    json_t *cut = json_object_get(res, "cut");
    if (!json_is_array(cut)) {
        cut = json_array();
        if (!cut || json_object_set_new(res, "cut", cut) != 0) return;
    }
    char note[256];
    snprintf(note, sizeof note, "%s: %zu item%s cut from the middle (%zu kept)",
             key ? key : "result", cut_n, cut_n == 1 ? "" : "s", kept);
    json_array_append_new(cut, json_string(note));
    json_object_set_new(res, "truncated", json_true());
}

void tool_bound_json(json_t *res, size_t cap) {
    const size_t flags = JSON_COMPACT;
    for (int iter = 0; iter < 64; iter++) {
        size_t size = json_dumpb(res, NULL, 0, flags);
        if (size <= cap) return;
        size_t excess = size - cap + 64;
        biggest b = {0};
        find_biggest(res, NULL, &b);
        size_t arr_bytes = b.arr && b.arr_n > 2 ? json_dumpb(b.arr, NULL, 0, flags) : 0;
        if (arr_bytes > b.str_len && b.arr_n > 2) {
            size_t per = arr_bytes / b.arr_n + 1;
            size_t k = excess / per + 1;
            if (k > b.arr_n - 2) k = b.arr_n - 2;
            size_t keep_head = (b.arr_n - k) * 2 / 3;
            if (keep_head < 1) keep_head = 1;
            for (size_t i = 0; i < k; i++) json_array_remove(b.arr, keep_head);
            add_note(res, b.arr_key, k, json_array_size(b.arr));
            continue;
        }
        if (b.str && b.str_len > 300) {
            size_t target = b.str_len > excess + 256 ? b.str_len - excess : 256;
            char *s = NULL;
            if (tool_bound_text(&s, json_string_value(b.str), b.str_len, target) != 0) return;
            json_string_set(b.str, s);
            free(s);
            continue;
        }
        if (b.arr && b.arr_n > 1) {
            json_array_remove(b.arr, b.arr_n / 2);
            add_note(res, b.arr_key, 1, json_array_size(b.arr));
            continue;
        }
        return; /* nothing left to cut */
    }
}

json_t *tool_json_text(const char *s, size_t n) {
    json_t *j = json_stringn(s, n);
    if (j) return j;
    /* Not valid UTF-8: replace each bad byte with U+FFFD so the model still sees the text. */
    char *o = malloc(n * 3 + 1);
    if (!o) return NULL;
    size_t k = 0;
    const unsigned char *p = (const unsigned char *)s, *e = p + n;
    while (p < e) {
        unsigned c = *p;
        int len = c < 0x80 ? 1 : c >= 0xC2 && c < 0xE0 ? 2 : c >= 0xE0 && c < 0xF0 ? 3
                : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        bool ok = len > 0 && p + len <= e && c != 0;
        for (int i = 1; ok && i < len; i++) ok = (p[i] & 0xC0) == 0x80;
        if (ok && len == 3) ok = !(c == 0xE0 && p[1] < 0xA0) && !(c == 0xED && p[1] >= 0xA0);
        if (ok && len == 4) ok = !(c == 0xF0 && p[1] < 0x90) && !(c == 0xF4 && p[1] >= 0x90);
        if (ok) {
            memcpy(o + k, p, (size_t)len);
            k += (size_t)len;
            p += len;
        } else {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
            p++;
        }
    }
    j = json_stringn(o, k);
    free(o);
    return j;
}
