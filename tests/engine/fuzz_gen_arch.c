/* libFuzzer target for the architecture layer on hostile files: the input becomes a file (a
 * memfd), is opened with the GGUF reader, and when that succeeds the hyper-parameters are read
 * (engine_hparams_read), the tensor list is built and the file validated against it
 * (engine_arch_validate), as the loader does before it touches any weight. Any crash or
 * sanitizer report is a bug; error returns are expected for most inputs.
 * The corpus in tests/fixtures/fuzz/gen_arch/ is written by `test_gen_arch --write-corpus`. */
#include "engine.h"
#include "model/arch.h"
#include "model/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("fuzz_gen_arch", MFD_CLOEXEC);
    if (fd < 0) return 0;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    engine_gguf *g = NULL;
    if (engine_gguf_open(&g, path) == 0) {
        engine_hparams hp;
        if (engine_hparams_read(&hp, g) == 0) {
            (void)engine_arch_validate(&hp, g);
            uint64_t total = 0, active = 0;
            engine_arch_param_count(&hp, &total, &active);
            if (active > total) abort(); /* an invariant, not an input error */
        } else if (!engine_error_last()[0]) {
            abort(); /* every failure must say why */
        }
        engine_gguf_close(g);
    }
    close(fd);
    return 0;
}
