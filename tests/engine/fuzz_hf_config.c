/* libFuzzer target for the Hugging Face config.json reader of qwen35moe
 * (engine_q35_hf_config in engine/model/arch_qwen35moe.c): the input is written as config.json
 * into a temporary directory (under /dev/shm when it exists) and read. An error return is the
 * expected outcome for most inputs; a crash or sanitizer report is a bug; a config that is
 * accepted must also pass engine_hparams_check and give a tensor list. Corpus:
 * tests/fixtures/fuzz/hf_config/ (the generator's tiny and 35B-A3B configs, a multimodal one
 * with text_config, broken variants). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/arch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "%s/spark_fuzz_cfg_XXXXXX",
                 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
        if (!mkdtemp(dir)) abort();
    }
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size) fwrite(data, 1, size, f);
    fclose(f);
    engine_hparams hp;
    int32_t bos = -1;
    if (engine_q35_hf_config(&hp, &bos, dir) == 0) {
        if (engine_hparams_check(&hp) != 0) abort();
        engine_tensor_desc *d = NULL;
        size_t n = 0;
        if (engine_arch_tensors(&hp, &d, &n) != 0 || n == 0) abort();
        free(d);
    }
    unlink(path);
    return 0;
}
