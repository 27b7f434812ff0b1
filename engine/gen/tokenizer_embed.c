/* The Qwen3 tokenizer compiled into the engine (see embed_tokenizer.cmake), if any. */
#include "gen/gen.h"

#include <stdint.h>

#ifdef SPARK_EMBED_TOKENIZER
extern const char engine_gen_tok_json[], engine_gen_tok_json_end[];
extern const char engine_gen_tok_config[], engine_gen_tok_config_end[];

bool engine_gen_embedded_tokenizer(const char **json, size_t *json_len, const char **config,
                                   size_t *config_len) {
    *json = engine_gen_tok_json;
    *json_len = (size_t)((uintptr_t)engine_gen_tok_json_end - (uintptr_t)engine_gen_tok_json);
    *config = engine_gen_tok_config;
    *config_len = (size_t)((uintptr_t)engine_gen_tok_config_end - (uintptr_t)engine_gen_tok_config);
    return true;
}
#else
bool engine_gen_embedded_tokenizer(const char **json, size_t *json_len, const char **config,
                                   size_t *config_len) {
    *json = *config = NULL;
    *json_len = *config_len = 0;
    return false;
}
#endif
