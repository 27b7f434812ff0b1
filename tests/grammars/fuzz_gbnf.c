/* Fuzz target: GBNF text -> grammar; when it compiles, feed the same bytes to a matcher over a
 * byte vocabulary, compute a mask and roll back. Must never crash or leak. */
#include "grammar.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    grammar *g = NULL;
    if (grammar_new_gbnf(&g, (const char *)data, size, NULL) != 0) return 0;
    static const char *pieces[258];
    static uint32_t lens[258];
    static char raw[256];
    for (int i = 0; i < 256; i++) {
        raw[i] = (char)i;
        pieces[i] = &raw[i];
        lens[i] = 1;
    }
    pieces[256] = "ab";
    lens[256] = 2;
    pieces[257] = NULL;
    lens[257] = 0;
    grammar_vocab *v = NULL;
    grammar_index *ix = NULL;
    grammar_matcher *m = NULL;
    int32_t eog = 257;
    uint32_t mask[(258 + 31) / 32];
    if (grammar_vocab_new(&v, 258, pieces, lens) == 0 && grammar_index_new(&ix, g, v) == 0 &&
        grammar_matcher_new(&m, ix, &eog, 1) == 0) {
        for (size_t i = 0; i < size && i < 64; i++) {
            grammar_matcher_mask(m, mask, 258);
            if (grammar_matcher_accept(m, data[i]) != 0) break;
        }
        grammar_matcher_is_complete(m);
        grammar_matcher_distance(m);
        grammar_matcher_rollback(m, grammar_matcher_n_tokens(m) / 2);
        grammar_matcher_mask(m, mask, 258);
    }
    grammar_matcher_free(m);
    grammar_index_free(ix);
    grammar_vocab_free(v);
    grammar_free(g);
    return 0;
}
