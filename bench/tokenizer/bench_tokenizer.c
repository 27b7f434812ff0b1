/* Encoding throughput of the engine's tokenizer over a corpus written by
 * tests/engine/tokenizer_ref.js (u32 n_docs, then u32 length + bytes per document).
 *   bench_tokenizer TOKENIZER_JSON TOKENIZER_CONFIG_JSON CORPUS_BIN
 * One run, one thread; the time (wall and CPU) covers engine_tokenizer_encode_alloc over every document (parse_special on),
 * not loading. Run through bench/tokenizer/bench.sh. */
#define _POSIX_C_SOURCE 200809L
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static double now(void) { return clock_s(CLOCK_MONOTONIC); }
static double cpu(void) { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON CONFIG_JSON CORPUS_BIN\n", argv[0]);
        return 2;
    }
    engine_tokenizer_spec *spec;
    engine_tokenizer *tok;
    double t0 = now();
    if (engine_tokenizer_spec_from_hf_files(&spec, argv[1], argv[2]) ||
        engine_tokenizer_new(&tok, spec)) {
        fprintf(stderr, "load: %s\n", engine_error_last());
        return 1;
    }
    engine_tokenizer_spec_free(spec);
    double t_load = now() - t0;
    FILE *f = fopen(argv[3], "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", argv[3]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *c = malloc((size_t)n);
    if (!c || fread(c, 1, (size_t)n, f) != (size_t)n) return 1;
    fclose(f);
    uint32_t n_docs;
    memcpy(&n_docs, c, 4);
    size_t pos = 4, bytes = 0, tokens = 0;
    double t1 = now(), c1 = cpu();
    for (uint32_t d = 0; d < n_docs && pos + 4 <= (size_t)n; d++) {
        uint32_t len;
        memcpy(&len, c + pos, 4);
        pos += 4;
        if (len > (size_t)n - pos) break;
        int32_t *ids;
        size_t ni;
        if (engine_tokenizer_encode_alloc(tok, (const char *)c + pos, len, true, &ids, &ni)) {
            fprintf(stderr, "encode: %s\n", engine_error_last());
            return 1;
        }
        free(ids);
        tokens += ni;
        bytes += len;
        pos += len;
    }
    double sec = now() - t1, csec = cpu() - c1;
    printf("spark-agent engine tokenizer: %u docs, %.2f MB, %zu tokens in %.3f s = %.2f MB/s "
           "(CPU time %.3f s = %.2f MB/s; load %.3f s)\n", n_docs, (double)bytes / 1e6, tokens,
           sec, (double)bytes / 1e6 / sec, csec, (double)bytes / 1e6 / csec, t_load);
    engine_tokenizer_free(tok);
    free(c);
    return 0;
}
