/* Token-for-token comparison against @huggingface/tokenizers (run by test_tokenizer_hf.sh, which
 * first writes the corpus and the reference ids with tokenizer_ref.js).
 *
 *   test_tokenizer_hf TOKENIZER_JSON TOKENIZER_CONFIG_JSON CORPUS_BIN REF_BIN [NFC_BIN PRETOK_BIN]
 *
 * For every document: ids with parse_special on and off must equal the reference's; our NFC
 * must equal String.normalize('NFC'); decode(encode(x)) == x for valid UTF-8 already in NFC;
 * the streaming detokenizer fed one id at a time must equal the one-shot decode. The first
 * mismatch is reported with context. NFC_BIN and PRETOK_BIN add systematic cases over every
 * code point: our NFC against String.normalize, and our pre-tokenizer's pieces against the
 * reference's Split pre-tokenizer. */
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_int.h"
#include "tokenizer/unicode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    if (!b || fread(b, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(1);
    }
    fclose(f);
    *len = (size_t)n;
    return b;
}

typedef struct {
    const unsigned char *p, *end;
    const char *name;
} reader;

static uint32_t rd_u32(reader *r) {
    if (r->end - r->p < 4) {
        fprintf(stderr, "%s: truncated\n", r->name);
        exit(1);
    }
    uint32_t v = (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 |
                 (uint32_t)r->p[3] << 24;
    r->p += 4;
    return v;
}

static const unsigned char *rd_bytes(reader *r, size_t n) {
    if ((size_t)(r->end - r->p) < n) {
        fprintf(stderr, "%s: truncated\n", r->name);
        exit(1);
    }
    const unsigned char *p = r->p;
    r->p += n;
    return p;
}

static void print_escaped(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", stderr);
        else if (c == '\r') fputs("\\r", stderr);
        else if (c == '\t') fputs("\\t", stderr);
        else if (c < 0x20 || c == 0x7f) fprintf(stderr, "\\x%02x", c);
        else fputc(c, stderr);
    }
}

static void show_tokens(const engine_tokenizer *tok, const char *label, const int32_t *ids,
                        size_t n, size_t at) {
    size_t lo = at > 6 ? at - 6 : 0, hi = at + 6 < n ? at + 6 : n;
    fprintf(stderr, "  %s (%zu tokens), from #%zu:", label, n, lo);
    for (size_t i = lo; i < hi; i++) {
        size_t len;
        const char *b = engine_tokenizer_token_bytes(tok, ids[i], &len);
        fprintf(stderr, "%s %d '", i == at ? " >>>" : "", (int)ids[i]);
        if (b) print_escaped(b, len);
        fputc('\'', stderr);
    }
    fputc('\n', stderr);
}

static int compare_ids(const engine_tokenizer *tok, size_t doc, const char *what,
                       const unsigned char *text, size_t text_len, const int32_t *got,
                       size_t n_got, const int32_t *want, size_t n_want) {
    size_t i = 0;
    while (i < n_got && i < n_want && got[i] == want[i]) i++;
    if (i == n_got && i == n_want) return 0;
    fprintf(stderr, "MISMATCH in document %zu (%s) at token %zu:\n", doc, what, i);
    show_tokens(tok, "ours", got, n_got, i);
    show_tokens(tok, "reference", want, n_want, i);
    /* where in the text: the bytes of the common prefix */
    size_t off = 0;
    for (size_t k = 0; k < i; k++) {
        size_t len;
        engine_tokenizer_token_bytes(tok, want[k], &len);
        off += len;
    }
    size_t lo = off > 40 ? off - 40 : 0, hi = off + 40 < text_len ? off + 40 : text_len;
    fprintf(stderr, "  text near byte %zu (approximate after NFC): '", off);
    print_escaped((const char *)text + lo, hi - lo);
    fprintf(stderr, "'\n");
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 5 && argc != 7) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON CONFIG_JSON CORPUS_BIN REF_BIN "
                "[NFC_BIN PRETOK_BIN]\n", argv[0]);
        return 2;
    }
    engine_tokenizer_spec *spec;
    engine_tokenizer *tok;
    int rc = engine_tokenizer_spec_from_hf_files(&spec, argv[1], argv[2]);
    if (rc) {
        fprintf(stderr, "spec_from_hf: %s\n", engine_error_last());
        return 1;
    }
    rc = engine_tokenizer_new(&tok, spec);
    engine_tokenizer_spec_free(spec);
    if (rc) {
        fprintf(stderr, "tokenizer_new: %s\n", engine_error_last());
        return 1;
    }
    engine_detok *dt;
    if (engine_detok_new(&dt, tok, false)) return 1;

    size_t clen, rlen;
    unsigned char *corpus = read_all(argv[3], &clen), *ref = read_all(argv[4], &rlen);
    reader c = {corpus, corpus + clen, "corpus"}, r = {ref, ref + rlen, "reference"};
    uint32_t n_docs = rd_u32(&c);
    size_t failures = 0, total_bytes = 0, total_tokens = 0, roundtrips = 0;
    char *stream = NULL;
    size_t stream_cap = 0;
    for (uint32_t d = 0; d < n_docs && failures < 5; d++) {
        uint32_t len = rd_u32(&c);
        const unsigned char *text = rd_bytes(&c, len);
        total_bytes += len;
        char *saved_dec = NULL;
        size_t saved_dec_len = 0;
        for (int variant = 0; variant < 2; variant++) {
            uint32_t n_want = rd_u32(&r);
            int32_t *want = malloc(((size_t)n_want + 1) * sizeof *want);
            const unsigned char *wp = rd_bytes(&r, (size_t)n_want * 4);
            for (uint32_t i = 0; i < n_want; i++)
                want[i] = (int32_t)((uint32_t)wp[4 * i] | (uint32_t)wp[4 * i + 1] << 8 |
                                    (uint32_t)wp[4 * i + 2] << 16 | (uint32_t)wp[4 * i + 3] << 24);
            int32_t *got;
            size_t n_got;
            rc = engine_tokenizer_encode_alloc(tok, (const char *)text, len, variant == 0, &got,
                                               &n_got);
            if (rc) {
                fprintf(stderr, "document %u: encode failed: %s\n", d, engine_error_last());
                return 1;
            }
            /* the fixed-capacity variant must agree and report ERANGE when short */
            if (variant == 0 && n_got > 0) {
                size_t n2;
                int32_t *ids2 = malloc(n_got * sizeof *ids2);
                int rc2 = engine_tokenizer_encode(tok, (const char *)text, len, true, ids2,
                                                  n_got - 1, &n2);
                if (rc2 != ENGINE_ERANGE || n2 != n_got || memcmp(ids2, got, (n_got - 1) * 4)) {
                    fprintf(stderr, "document %u: encode with a short buffer misbehaves\n", d);
                    failures++;
                }
                free(ids2);
            }
            failures += (size_t)compare_ids(tok, d, variant == 0 ? "parse_special on"
                                                                 : "parse_special off",
                                            text, len, got, n_got, want, n_want);
            if (variant == 0) {
                total_tokens += n_got;
                /* one-shot decode vs streaming, id by id */
                char *dec;
                size_t dec_len, sn = 0;
                if (engine_tokenizer_decode(tok, got, n_got, false, &dec, &dec_len)) return 1;
                if (stream_cap < dec_len + 16) {
                    stream_cap = dec_len + 16;
                    stream = realloc(stream, stream_cap);
                }
                engine_detok_reset(dt);
                for (size_t i = 0; i < n_got; i++) {
                    const char *piece;
                    size_t pl;
                    if (engine_detok_feed(dt, got[i], &piece, &pl) || sn + pl > dec_len) break;
                    memcpy(stream + sn, piece, pl);
                    sn += pl;
                }
                const char *piece;
                size_t pl;
                engine_detok_flush(dt, &piece, &pl);
                if (sn + pl <= dec_len) {
                    memcpy(stream + sn, piece, pl);
                    sn += pl;
                }
                if (sn != dec_len || memcmp(stream, dec, dec_len) != 0) {
                    fprintf(stderr, "document %u: streaming detok differs from decode\n", d);
                    failures++;
                }
                saved_dec = dec;
                saved_dec_len = dec_len;
            }
            free(got);
            free(want);
        }
        /* NFC against String.normalize, and the round trip */
        char *clean, *nfc;
        size_t clean_len, nfc_len;
        if (engine_utf8_sanitize((const char *)text, len, &clean, &clean_len)) return 1;
        const char *s = clean ? clean : (const char *)text;
        size_t sl = clean ? clean_len : len;
        if (engine_unicode_nfc(s, sl, &nfc, &nfc_len)) return 1;
        uint32_t ref_nfc_len = rd_u32(&r);
        const unsigned char *ref_nfc = rd_bytes(&r, ref_nfc_len);
        const char *ours = nfc ? nfc : s;
        size_t ours_len = nfc ? nfc_len : sl;
        if (ours_len != ref_nfc_len || memcmp(ours, ref_nfc, ours_len) != 0) {
            size_t k = 0;
            while (k < ours_len && k < ref_nfc_len && ours[k] == (char)ref_nfc[k]) k++;
            size_t lo = k > 20 ? k - 20 : 0;
            fprintf(stderr, "document %u: NFC differs at byte %zu: ours '", d, k);
            print_escaped(ours + lo, (ours_len < k + 20 ? ours_len : k + 20) - lo);
            fprintf(stderr, "' reference '");
            print_escaped((const char *)ref_nfc + lo,
                          (ref_nfc_len < k + 20 ? ref_nfc_len : k + 20) - lo);
            fprintf(stderr, "'\n");
            failures++;
        }
        if (!clean && !nfc) {
            roundtrips++;
            if (saved_dec_len != len || memcmp(saved_dec, text, len) != 0) {
                fprintf(stderr, "document %u: decode(encode(x)) != x\n", d);
                failures++;
            }
        }
        free(clean);
        free(nfc);
        free(saved_dec);
    }
    size_t nfc_cases = 0;
    if (argc == 7 && failures == 0) {
        size_t nlen;
        unsigned char *nb = read_all(argv[5], &nlen);
        reader nr = {nb, nb + nlen, "nfc"};
        uint32_t n_cases = rd_u32(&nr);
        for (uint32_t k = 0; k < n_cases && failures < 5; k++) {
            uint32_t il = rd_u32(&nr);
            const char *in = (const char *)rd_bytes(&nr, il);
            uint32_t wl = rd_u32(&nr);
            const char *want = (const char *)rd_bytes(&nr, wl);
            char *nfc;
            size_t nl;
            if (engine_unicode_nfc(in, il, &nfc, &nl)) return 1;
            const char *got = nfc ? nfc : in;
            size_t gl = nfc ? nl : il;
            if (gl != wl || memcmp(got, want, wl) != 0) {
                size_t i = 0;
                while (i < gl && i < wl && got[i] == want[i]) i++;
                size_t lo = i > 24 ? i - 24 : 0;
                fprintf(stderr, "NFC case %u differs at byte %zu: ours '", k, i);
                print_escaped(got + lo, (gl < i + 24 ? gl : i + 24) - lo);
                fprintf(stderr, "' reference '");
                print_escaped(want + lo, (wl < i + 24 ? wl : i + 24) - lo);
                fprintf(stderr, "'\n");
                failures++;
            }
            free(nfc);
            nfc_cases++;
        }
        free(nb);
    }
    size_t pretok_pieces = 0;
    if (argc == 7 && failures == 0) {
        size_t plen;
        unsigned char *pb = read_all(argv[6], &plen);
        reader pr = {pb, pb + plen, "pretok"};
        uint32_t n_blocks = rd_u32(&pr);
        for (uint32_t k = 0; k < n_blocks && failures < 5; k++) {
            uint32_t tl = rd_u32(&pr);
            const unsigned char *t = rd_bytes(&pr, tl);
            uint32_t nl = rd_u32(&pr);
            const unsigned char *lens = rd_bytes(&pr, nl);
            size_t pos = 0, li = 0;
            while (li < nl) {
                size_t want = lens[li++];
                if (want == 255) {
                    const unsigned char *x = lens + li;
                    if (nl - li < 4) {
                        fprintf(stderr, "pretok: truncated\n");
                        return 1;
                    }
                    want = (size_t)x[0] | (size_t)x[1] << 8 | (size_t)x[2] << 16 | (size_t)x[3] << 24;
                    li += 4;
                }
                size_t end = pos < tl ? engine_pretok_qwen2_next(t, tl, pos) : pos;
                if (end - pos != want) {
                    size_t lo = pos > 16 ? pos - 16 : 0;
                    fprintf(stderr, "pre-tokenizer block %u at byte %zu: our piece has %zu bytes, "
                            "the reference's %zu; text '", k, pos, end - pos, want);
                    print_escaped((const char *)t + lo, (pos + want + 16 < tl ? pos + want + 16 : tl) - lo);
                    fprintf(stderr, "'\n");
                    failures++;
                    break;
                }
                pos = end;
                pretok_pieces++;
            }
            if (pos != tl && failures == 0) {
                fprintf(stderr, "pre-tokenizer block %u: pieces cover %zu of %u bytes\n", k, pos, tl);
                failures++;
            }
        }
        free(pb);
    }
    if (r.p != r.end && failures == 0) {
        fprintf(stderr, "reference file has trailing data\n");
        failures++;
    }
    printf("test_tokenizer_hf: %u documents, %zu bytes, %zu tokens, %zu round trips, %zu NFC "
           "blocks, %zu pre-tokenizer pieces: %s\n", n_docs, total_bytes, total_tokens,
           roundtrips, nfc_cases, pretok_pieces, failures ? "FAILED" : "all identical");
    free(stream);
    free(corpus);
    free(ref);
    engine_detok_free(dt);
    engine_tokenizer_free(tok);
    return failures ? 1 : 0;
}
