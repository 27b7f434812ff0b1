/* libFuzzer target for the model loader (engine/model/model.c): the input becomes a GGUF file
 * (a memfd) that is loaded vocabulary-only (hyper-parameters, tokenizer metadata -> spec ->
 * tokenizer) and fully (architecture validation, weights, a session, a short forward pass and
 * greedy generation). A crash or sanitizer report is a bug; an error return is the expected
 * outcome for most inputs. The corpus in tests/fixtures/fuzz/model/ is written by
 * `test_forward_small --write-corpus tests/fixtures/fuzz/model` (small valid models and
 * damaged tokenizer metadata). */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static bool quiet;
    if (!quiet) {
        engine_log_set(NULL, NULL, ENGINE_LOG_NONE);
        quiet = true;
    }
    int fd = memfd_create("fuzz_model", 0);
    if (fd < 0) return 0;
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(fd, data + off, size - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);

    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.vocab_only = true;
    engine_model *m = NULL;
    if (engine_model_load(&m, path, &mp) == 0) {
        int32_t ids[64];
        size_t n = 0;
        engine_model_tokenize(m, "<|im_start|>the tea\xff", 20, true, ids, 64, &n);
        char text[256];
        size_t len;
        if (n > 64) n = 64;
        engine_model_detokenize(m, ids, n, text, sizeof text, &len);
        engine_model_free(m);
    }
    mp = (engine_model_params)ENGINE_MODEL_PARAMS_INIT;
    mp.n_threads = 1;
    mp.n_ctx = 16;
    m = NULL;
    if (engine_model_load(&m, path, &mp) == 0) {
        engine_session *s = NULL;
        engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
        sp.n_batch = 4;
        if (engine_session_new(&s, m, &sp) == 0) {
            int32_t ids[16];
            size_t n = 0;
            if (engine_model_tokenize(m, "the tea", 7, true, ids, 16, &n) == 0 && n > 0) {
                engine_gen_params gp = ENGINE_GEN_PARAMS_INIT;
                gp.prompt = ids;
                gp.n_prompt = n;
                gp.max_tokens = 4;
                gp.sampling.temperature = 0.0f;
                engine_generate(s, &gp, NULL, NULL, NULL);
            }
            engine_session_free(s);
        }
        engine_model_free(m);
    }
    close(fd);
    return 0;
}
