/* Fuzz target for the remote backend's server-sent-events parser (agent/sse.c): the first byte
 * seeds how the rest is cut into pieces; the stream must give the same reply, flags and error
 * whether it arrives whole or in those pieces, and streamed content must equal the reply's
 * content. */
#include "sse_int.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *d;
    size_t n, cap;
} acc;

static void on_text(void *user, const char *text, size_t len) {
    acc *a = user;
    if (a->n + len + 1 > a->cap) {
        size_t nc = (a->n + len + 1) * 2;
        char *p = realloc(a->d, nc);
        if (!p) abort();
        a->d = p;
        a->cap = nc;
    }
    memcpy(a->d + a->n, text, len);
    a->n += len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > (1u << 20)) return 0;
    uint32_t seed = data[0] * 2654435761u + 1;
    const char *in = (const char *)data + 1;
    size_t n = size - 1;
    agent_sse whole, parts;
    acc streamed = {0};
    if (agent_sse_init(&whole, NULL, NULL) || agent_sse_init(&parts, on_text, &streamed))
        abort();
    agent_sse_feed(&whole, in, n);
    agent_sse_finish(&whole);
    for (size_t at = 0; at < n;) {
        seed = seed * 1103515245u + 12345u;
        size_t k = 1 + (seed >> 16) % 64;
        if (k > n - at) k = n - at;
        agent_sse_feed(&parts, in + at, k);
        at += k;
    }
    agent_sse_finish(&parts);
    char *a = agent_sse_reply(&whole), *b = agent_sse_reply(&parts);
    if (!a || !b || strcmp(a, b)) abort();
    if (whole.done != parts.done || whole.finished_length != parts.finished_length ||
        whole.chunks != parts.chunks || strcmp(whole.error, parts.error))
        abort();
    /* the reply starts with the content exactly as streamed */
    if (streamed.n > strlen(b) || (streamed.n && memcmp(b, streamed.d, streamed.n))) abort();
    free(a);
    free(b);
    free(streamed.d);
    agent_sse_deinit(&whole);
    agent_sse_deinit(&parts);
    return 0;
}
