/* The vocabulary: token bytes, their lexicographic order and a preorder prefix trie. */
#include "grammar_int.h"

#include <string.h>

/* Tokens by bytes (then by id): the order of the trie. */
static int cmp_tok(const grammar_vocab *v, int32_t x, int32_t y) {
    uint32_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static void merge_sort(const grammar_vocab *v, int32_t *a, int32_t *tmp, size_t n) {
    if (n < 2) return;
    size_t h = n / 2;
    merge_sort(v, a, tmp, h);
    merge_sort(v, a + h, tmp, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        tmp[k++] = cmp_tok(v, a[i], a[j]) <= 0 ? a[i++] : a[j++];
    }
    while (i < h) tmp[k++] = a[i++];
    while (j < n) tmp[k++] = a[j++];
    memcpy(a, tmp, n * sizeof *a);
}

void grammar_vocab_free(grammar_vocab *v) {
    if (!v) return;
    free(v->bytes);
    free(v->off);
    free(v->order);
    free(v->rank);
    free(v->tn_byte);
    free(v->tn_depth);
    free(v->tn_skip);
    free(v->tn_rank);
    free(v->tn_nrank);
    free(v->tn_parent);
    free(v->tn_nchild);
    free(v->nonempty);
    free(v);
}

int32_t grammar_vocab_size(const grammar_vocab *v) {
    return v ? v->n_vocab : 0;
}

int grammar_vocab_new(grammar_vocab **out, int32_t n_vocab, const char *const *tokens,
                      const uint32_t *lens) {
    if (!out || n_vocab <= 0 || !tokens || !lens)
        return grammar_err(GRAMMAR_EINVAL, "grammar_vocab_new: bad arguments");
    *out = NULL;
    int rc = GRAMMAR_ENOMEM;
    int32_t *tmp = NULL, *stack = NULL;
    grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) goto fail;
    v->n_vocab = n_vocab;
    size_t total = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        if (tokens[i] && lens[i] > 65535) {
            rc = grammar_err(GRAMMAR_EINVAL, "token %d is longer than 65535 bytes", i);
            goto fail;
        }
        total += tokens[i] ? lens[i] : 0;
    }
    if (total > UINT32_MAX - 1) {
        rc = grammar_err(GRAMMAR_EINVAL, "vocabulary too large");
        goto fail;
    }
    v->bytes = malloc(total + 1);
    v->off = malloc(((size_t)n_vocab + 1) * sizeof *v->off);
    v->rank = malloc((size_t)n_vocab * sizeof *v->rank);
    v->order = malloc((size_t)n_vocab * sizeof *v->order);
    tmp = malloc((size_t)n_vocab * sizeof *tmp);
    v->nonempty = calloc(((size_t)n_vocab + 31) / 32, sizeof *v->nonempty);
    if (!v->bytes || !v->off || !v->rank || !v->order || !tmp || !v->nonempty) goto fail;
    size_t at = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        v->off[i] = (uint32_t)at;
        uint32_t l = tokens[i] ? lens[i] : 0;
        if (l) {
            memcpy(v->bytes + at, tokens[i], l);
            at += l;
            v->order[v->n_order++] = i;
            v->nonempty[i / 32] |= 1u << (i % 32);
            if (l > v->max_len) v->max_len = l;
        }
        v->rank[i] = -1;
    }
    v->off[n_vocab] = (uint32_t)at;
    merge_sort(v, v->order, tmp, (size_t)v->n_order);
    for (int32_t r = 0; r < v->n_order; r++) v->rank[v->order[r]] = r;

    /* trie: one node per distinct prefix, in preorder = sorted order */
    size_t cap = 1024, n = 0;
    v->tn_byte = malloc(cap);
    v->tn_depth = malloc(cap * sizeof *v->tn_depth);
    v->tn_rank = malloc(cap * sizeof *v->tn_rank);
    v->tn_nrank = malloc(cap * sizeof *v->tn_nrank);
    stack = malloc(((size_t)v->max_len + 1) * sizeof *stack); /* node per depth on the path */
    if (!v->tn_byte || !v->tn_depth || !v->tn_rank || !v->tn_nrank || !stack) goto fail;
    const uint8_t *prev = NULL;
    uint32_t prev_len = 0;
    for (int32_t r = 0; r < v->n_order; r++) {
        int32_t id = v->order[r];
        const uint8_t *b = v->bytes + v->off[id];
        uint32_t l = v->off[id + 1] - v->off[id];
        uint32_t lcp = 0;
        while (prev && lcp < l && lcp < prev_len && b[lcp] == prev[lcp]) lcp++;
        for (uint32_t d = lcp; d < l; d++) {
            if (n + 1 > cap) {
                cap *= 2;
                uint8_t *nb = realloc(v->tn_byte, cap);
                if (!nb) goto fail;
                v->tn_byte = nb;
                uint16_t *nd = realloc(v->tn_depth, cap * sizeof *nd);
                if (!nd) goto fail;
                v->tn_depth = nd;
                int32_t *nr = realloc(v->tn_rank, cap * sizeof *nr);
                if (!nr) goto fail;
                v->tn_rank = nr;
                int32_t *nn = realloc(v->tn_nrank, cap * sizeof *nn);
                if (!nn) goto fail;
                v->tn_nrank = nn;
            }
            v->tn_byte[n] = b[d];
            v->tn_depth[n] = (uint16_t)(d + 1);
            v->tn_rank[n] = r;
            v->tn_nrank[n] = 0;
            stack[d + 1] = (int32_t)n;
            n++;
        }
        /* the node of the whole token (same bytes as the previous token: same node) */
        int32_t node = stack[l];
        if (v->tn_nrank[node] == 0) v->tn_rank[node] = r;
        v->tn_nrank[node]++;
        prev = b;
        prev_len = l;
    }
    v->n_nodes = (int32_t)n;
    v->tn_skip = malloc((n + 1) * sizeof *v->tn_skip);
    v->tn_parent = malloc((n + 1) * sizeof *v->tn_parent);
    v->tn_nchild = calloc(n + 1, sizeof *v->tn_nchild);
    if (!v->tn_skip || !v->tn_parent || !v->tn_nchild) goto fail;
    /* subtree end: the next node whose depth is not greater; the parent: the node left on
     * the stack below */
    {
        size_t sp = 0;
        for (size_t i = 0; i < n; i++) {
            while (sp && v->tn_depth[stack[sp - 1]] >= v->tn_depth[i]) v->tn_skip[stack[--sp]] = (int32_t)i;
            if (sp > v->max_len) { /* cannot happen: depth bounds the path */
                rc = grammar_err(GRAMMAR_EINTERNAL, "trie construction");
                goto fail;
            }
            v->tn_parent[i] = sp ? stack[sp - 1] : -1;
            if (sp) v->tn_nchild[stack[sp - 1]]++;
            stack[sp++] = (int32_t)i;
        }
        while (sp) v->tn_skip[stack[--sp]] = (int32_t)n;
    }
    free(tmp);
    free(stack);
    *out = v;
    return 0;
fail:
    if (rc == GRAMMAR_ENOMEM) grammar_err(GRAMMAR_ENOMEM, "out of memory");
    free(tmp);
    free(stack);
    grammar_vocab_free(v);
    return rc;
}
