/* libFuzzer target for the safetensors reader (engine/model/safetensors.c): the input is parsed
 * as one file and every listed tensor's first and last byte is read. Any crash or sanitizer
 * report is a bug; an error return is the expected outcome for most inputs. The corpus in
 * tests/fixtures/fuzz/safetensors/ holds a valid two-tensor file and malformed variants. */
#include <stdint.h>

#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    engine_st *st = NULL;
    if (engine_st_new(&st)) return 0;
    if (engine_st_parse(st, data, size, "fuzz") == 0) {
        for (int64_t i = 0; i < engine_st_count(st); i++) {
            const engine_st_tensor *t = engine_st_at(st, i);
            const uint8_t *p = t->data;
            if (t->nbytes) sink += p[0] + p[t->nbytes - 1];
            if (engine_st_find(st, t->name) != t) __builtin_trap();
        }
    }
    engine_st_close(st);
    return 0;
}
