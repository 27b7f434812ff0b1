/* Open documents of a JSON-RPC connection: LSP positions and incremental edits (rpc_int.h). */
#include "rpc_int.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    char *uri;
    int64_t version;
    char *text;
    size_t len, cap;
} rpc_doc;

struct agent_rpc_docs {
    rpc_doc *docs;
    size_t n, max_docs, max_bytes;
};

int agent_rpc_docs_new(agent_rpc_docs **out, size_t max_docs, size_t max_bytes) {
    *out = calloc(1, sizeof **out);
    if (!*out) return agent_err(AGENT_ENOMEM, "out of memory");
    (*out)->docs = calloc(max_docs ? max_docs : 1, sizeof(rpc_doc));
    if (!(*out)->docs) {
        free(*out);
        *out = NULL;
        return agent_err(AGENT_ENOMEM, "out of memory");
    }
    (*out)->max_docs = max_docs;
    (*out)->max_bytes = max_bytes;
    return 0;
}

static void doc_drop(agent_rpc_docs *d, size_t i) {
    free(d->docs[i].uri);
    free(d->docs[i].text);
    d->docs[i] = d->docs[--d->n];
}

void agent_rpc_docs_free(agent_rpc_docs *d) {
    if (!d) return;
    while (d->n) doc_drop(d, d->n - 1);
    free(d->docs);
    free(d);
}

static rpc_doc *find(const agent_rpc_docs *d, const char *uri, size_t *idx) {
    for (size_t i = 0; i < d->n; i++)
        if (!strcmp(d->docs[i].uri, uri)) {
            if (idx) *idx = i;
            return &d->docs[i];
        }
    return NULL;
}

int agent_rpc_doc_open(agent_rpc_docs *d, const char *uri, int64_t version, const char *text,
                       size_t len) {
    if (len > d->max_bytes)
        return agent_err(AGENT_EINVAL, "%s: %zu bytes is more than the %zu a document may have",
                         uri, len, d->max_bytes);
    rpc_doc *doc = find(d, uri, NULL);
    if (!doc && d->n == d->max_docs)
        return agent_err(AGENT_EINVAL, "%s: %zu documents are open already (the limit)", uri,
                         d->max_docs);
    char *copy = malloc(len + 1);
    if (!copy) return agent_err(AGENT_ENOMEM, "out of memory");
    memcpy(copy, text, len);
    copy[len] = 0;
    if (!doc) {
        char *u = strdup(uri);
        if (!u) {
            free(copy);
            return agent_err(AGENT_ENOMEM, "out of memory");
        }
        doc = &d->docs[d->n++];
        memset(doc, 0, sizeof *doc);
        doc->uri = u;
    }
    free(doc->text);
    doc->text = copy;
    doc->len = len;
    doc->cap = len + 1;
    doc->version = version;
    return 0;
}

int agent_rpc_doc_close(agent_rpc_docs *d, const char *uri) {
    size_t i;
    if (!find(d, uri, &i)) return agent_err(AGENT_EINVAL, "%s is not open", uri);
    doc_drop(d, i);
    return 0;
}

const char *agent_rpc_doc_text(const agent_rpc_docs *d, const char *uri, size_t *len,
                               int64_t *version) {
    rpc_doc *doc = find(d, uri, NULL);
    if (!doc) return NULL;
    if (len) *len = doc->len;
    if (version) *version = doc->version;
    return doc->text;
}

size_t agent_rpc_docs_count(const agent_rpc_docs *d) {
    return d->n;
}

/* End of the line starting at `start` (the offset of its terminator, or len). */
static size_t line_end(const char *t, size_t len, size_t start) {
    size_t i = start;
    while (i < len && t[i] != '\n' && t[i] != '\r') i++;
    return i;
}

/* Start of the next line after the terminator at `end` (end < len). */
static size_t next_line(const char *t, size_t len, size_t end) {
    if (t[end] == '\r' && end + 1 < len && t[end + 1] == '\n') return end + 2;
    return end + 1;
}

/* Bytes of the UTF-8 sequence led by c (1 for invalid lead bytes: counted as one unit). */
static size_t seq_len(unsigned char c) {
    return c >= 0xF0 && c < 0xF8 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
}

int agent_rpc_pos_offset(const char *text, size_t len, int64_t line, int64_t character,
                         bool utf8, size_t *off) {
    if (line < 0 || character < 0)
        return agent_err(AGENT_EINVAL, "position (%lld, %lld): negative", (long long)line,
                         (long long)character);
    size_t start = 0;
    for (int64_t l = 0; l < line; l++) {
        size_t end = line_end(text, len, start);
        if (end == len)
            return agent_err(AGENT_EINVAL, "line %lld is past the end of the document (%lld "
                             "lines)", (long long)line, (long long)(l + 1));
        start = next_line(text, len, end);
    }
    size_t end = line_end(text, len, start);
    if (utf8) {
        size_t i = (uint64_t)character < end - start ? start + (size_t)character : end;
        while (i > start && ((unsigned char)text[i] & 0xC0) == 0x80) i--;
        *off = i;
        return 0;
    }
    size_t i = start;
    int64_t units = 0;
    while (i < end) {
        size_t k = seq_len((unsigned char)text[i]);
        if (i + k > end) k = 1;
        int64_t u = k == 4 ? 2 : 1;
        if (units + u > character) break; /* at or inside this character */
        units += u;
        i += k;
    }
    *off = i;
    return 0;
}

void agent_rpc_offset_pos(const char *text, size_t len, size_t off, bool utf8, int64_t *line,
                          int64_t *character) {
    if (off > len) off = len;
    size_t start = 0;
    int64_t l = 0;
    for (;;) {
        size_t end = line_end(text, len, start);
        if (end >= off || end == len) break;
        size_t nx = next_line(text, len, end);
        if (nx > off) break; /* off inside a \r\n pair: on this line */
        start = nx;
        l++;
    }
    int64_t c = 0;
    if (utf8) {
        c = (int64_t)(off - start);
    } else {
        for (size_t i = start; i < off;) {
            size_t k = seq_len((unsigned char)text[i]);
            if (i + k > off) k = off - i;
            c += k == 4 ? 2 : 1;
            i += k;
        }
    }
    *line = l;
    *character = c;
}

void agent_rpc_fim_window(const char *text, size_t len, size_t off, int64_t max_before,
                          int64_t max_after, size_t *pre_start, size_t *suf_end) {
    /* back to the start of the cursor's line, then max_before more line starts */
    size_t s = off;
    while (s > 0 && text[s - 1] != '\n' && text[s - 1] != '\r') s--;
    for (int64_t k = 0; k < max_before && s > 0; k++) {
        s--; /* onto the previous line's terminator */
        if (s > 0 && text[s] == '\n' && text[s - 1] == '\r') s--;
        while (s > 0 && text[s - 1] != '\n' && text[s - 1] != '\r') s--;
    }
    *pre_start = s;
    /* forward to the end of the cursor's line, then max_after more lines */
    size_t e = line_end(text, len, off);
    for (int64_t k = 0; k < max_after && e < len; k++)
        e = line_end(text, len, next_line(text, len, e));
    if (e < len) e = next_line(text, len, e); /* keep the last line's terminator */
    *suf_end = e;
}

/* Replace text[a..b) of doc by s[0..n). */
static int splice(rpc_doc *doc, size_t a, size_t b, const char *s, size_t n, size_t max) {
    size_t len = doc->len - (b - a) + n;
    if (len > max) return agent_err(AGENT_EINVAL, "the edit makes the document %zu bytes, more "
                                    "than the %zu allowed", len, max);
    if (len + 1 > doc->cap) {
        size_t cap = doc->cap * 2 > len + 1 ? doc->cap * 2 : len + 1;
        char *p = realloc(doc->text, cap);
        if (!p) return agent_err(AGENT_ENOMEM, "out of memory");
        doc->text = p;
        doc->cap = cap;
    }
    memmove(doc->text + a + n, doc->text + b, doc->len - b);
    memcpy(doc->text + a, s, n);
    doc->len = len;
    doc->text[len] = 0;
    return 0;
}

static int get_pos(const json_t *p, int64_t *line, int64_t *ch) {
    json_t *l = json_object_get(p, "line"), *c = json_object_get(p, "character");
    if (!json_is_integer(l) || !json_is_integer(c)) return -1;
    *line = json_integer_value(l);
    *ch = json_integer_value(c);
    return 0;
}

static int apply(agent_rpc_docs *d, rpc_doc *doc, const json_t *changes, bool utf8) {
    if (!json_is_array(changes)) return agent_err(AGENT_EINVAL, "contentChanges: not an array");
    size_t i;
    json_t *ch;
    json_array_foreach(changes, i, ch) {
        json_t *text = json_object_get(ch, "text"), *range = json_object_get(ch, "range");
        if (!json_is_string(text))
            return agent_err(AGENT_EINVAL, "contentChanges[%zu].text: not a string", i);
        const char *s = json_string_value(text);
        size_t n = json_string_length(text);
        int rc;
        if (!range || json_is_null(range)) {
            rc = splice(doc, 0, doc->len, s, n, d->max_bytes);
        } else {
            int64_t l0, c0, l1, c1;
            size_t a, b;
            if (get_pos(json_object_get(range, "start"), &l0, &c0) ||
                get_pos(json_object_get(range, "end"), &l1, &c1))
                return agent_err(AGENT_EINVAL, "contentChanges[%zu].range: needs start and end "
                                 "positions {line, character}", i);
            if (agent_rpc_pos_offset(doc->text, doc->len, l0, c0, utf8, &a) ||
                agent_rpc_pos_offset(doc->text, doc->len, l1, c1, utf8, &b))
                return agent_err(AGENT_EINVAL, "contentChanges[%zu].range: %s", i,
                                 agent_error_last());
            if (b < a)
                return agent_err(AGENT_EINVAL, "contentChanges[%zu].range: the end is before "
                                 "the start", i);
            rc = splice(doc, a, b, s, n, d->max_bytes);
        }
        if (rc) return rc;
    }
    return 0;
}

int agent_rpc_doc_change(agent_rpc_docs *d, const char *uri, int64_t version,
                         const json_t *changes, bool utf8) {
    size_t idx;
    rpc_doc *doc = find(d, uri, &idx);
    if (!doc) return agent_err(AGENT_EINVAL, "%s is not open", uri);
    int rc = 0;
    if (version <= doc->version)
        rc = agent_err(AGENT_EINVAL, "version %lld does not follow %lld", (long long)version,
                       (long long)doc->version);
    if (!rc) rc = apply(d, doc, changes, utf8);
    if (rc) {
        /* the client's copy and ours differ now: drop ours, the client reopens */
        doc_drop(d, idx);
        return rc == AGENT_ENOMEM ? rc : agent_err(AGENT_EINVAL, "%s", agent_error_last());
    }
    doc->version = version;
    return 0;
}
