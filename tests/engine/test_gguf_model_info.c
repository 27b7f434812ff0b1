/* `spark-agent model info` (agent/cli/cmd_model_info.c) driven directly: a small
 * mixture-of-experts GGUF written here, its JSON and text reports checked against counts
 * computed in the test, and the exit statuses for bad input. */
#include "cli.h"
#include "cpu/quant.h"
#include "model/gguf.h"
#include "engine.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int failures;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

static char out_path[600];

/* Run cli_model_info with stdout captured; returns the exit status, output in buf. */
static int run(char *buf, size_t cap, int argc, char **argv) {
    fflush(stdout);
    const int saved = dup(1);
    const int fd = open(out_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 1);
    const int rc = cli_model_info(argc, argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    lseek(fd, 0, SEEK_SET);
    const ssize_t n = read(fd, buf, cap - 1);
    buf[n > 0 ? n : 0] = 0;
    close(fd);
    return rc;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static int zero_fill(int64_t i, void *dst, size_t n, void *u) {
    (void)i, (void)u;
    memset(dst, 0, n);
    return 0;
}

int main(void) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/spark_test_info_XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) return 1;
    snprintf(out_path, sizeof out_path, "%s/stdout", dir);
    char model[600];
    snprintf(model, sizeof model, "%s/moe.gguf", dir);

    engine_gguf_writer *w;
    engine_gguf_writer_new(&w);
    engine_gguf_writer_set_str(w, "general.architecture", "qwen3moe");
    engine_gguf_writer_set_str(w, "general.name", "Tiny \"MoE\"\n");
    engine_gguf_writer_set_u32(w, "qwen3moe.expert_count", 8);
    engine_gguf_writer_set_u32(w, "qwen3moe.expert_used_count", 2);
    engine_gguf_writer_set_u32(w, "qwen3moe.block_count", 1);
    engine_gguf_writer_set_u32(w, "qwen3moe.context_length", 4096);
    engine_gguf_writer_set_u32(w, "qwen3moe.embedding_length", 256);
    engine_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    const char *toks[5] = {"a", "b", "c", "<|im_start|>", "<|im_end|>"};
    engine_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 5);
    engine_gguf_writer_set_str(w, "tokenizer.chat_template", "{% for m in messages %}{% endfor %}");
    const int64_t emb[2] = {256, 5}, q[2] = {256, 256}, exps[3] = {256, 64, 8},
                  dn[3] = {256, 64, 8}, norm[1] = {256};
    int64_t added = 0;
    added += engine_gguf_writer_add_tensor(w, "token_embd.weight", ENGINE_TYPE_Q8_0, 2, emb, NULL);
    added += engine_gguf_writer_add_tensor(w, "blk.0.attn_q.weight", ENGINE_TYPE_Q4_K, 2, q, NULL);
    added +=
        engine_gguf_writer_add_tensor(w, "blk.0.attn_norm.weight", ENGINE_TYPE_F32, 1, norm, NULL);
    added += engine_gguf_writer_add_tensor(w, "blk.0.ffn_gate_exps.weight", ENGINE_TYPE_Q4_K, 3,
                                           exps, NULL);
    added += engine_gguf_writer_add_tensor(w, "blk.0.ffn_up_exps.weight", ENGINE_TYPE_Q4_K, 3, exps,
                                           NULL);
    added += engine_gguf_writer_add_tensor(w, "blk.0.ffn_down_exps.weight", ENGINE_TYPE_Q6_K, 3, dn,
                                           NULL);
    CHECK(added == 0 + 1 + 2 + 3 + 4 + 5, "add_tensor: %s", engine_error_last());
    CHECK(engine_gguf_writer_write(w, model, zero_fill, NULL, 2) == 0, "write: %s",
          engine_error_last());
    engine_gguf_writer_free(w);

    const unsigned long long dense = 256 * 5 + 256 * 256 + 256, experts = 3ull * 256 * 64 * 8;
    const unsigned long long total = dense + experts, active = dense + experts * 2 / 8;
    static char buf[16384], want[256];
    char *a_json[] = {"info", model, "--json"};
    CHECK(run(buf, sizeof buf, 3, a_json) == CLI_EXIT_OK, "json run");
    snprintf(want, sizeof want, "\"parameters\":{\"total\":%llu,\"active\":%llu,\"experts\":%llu}",
             total, active, experts);
    CHECK(strstr(buf, want), "want %s in %s", want, buf);
    CHECK(strstr(buf, "\"architecture\":\"qwen3moe\""), "arch: %s", buf);
    CHECK(strstr(buf, "\"name\":\"Tiny \\\"MoE\\\"\\u000a\""), "escaped name: %s", buf);
    CHECK(strstr(buf, "\"expert_count\":8,\"expert_used_count\":2"), "experts: %s", buf);
    CHECK(strstr(buf, "\"tensor_count\":6"), "tensor count");
    CHECK(strstr(buf, "\"q4_K\":{\"tensors\":3,\"parameters\":327680,\"bytes\":184320}"),
          "q4_K: %s", buf);
    CHECK(strstr(buf, "\"q8_0\":{\"tensors\":1,\"parameters\":1280,\"bytes\":1360}"), "q8_0: %s",
          buf);
    CHECK(strstr(buf, "\"tokenizer\":{\"model\":\"gpt2\",\"vocab_size\":5}"), "tokenizer: %s", buf);
    CHECK(strstr(buf, "\"chat_template\":true"), "template");
    CHECK(strstr(buf, "\"context_length\":4096,\"block_count\":1,\"embedding_length\":256"), "hp");
    snprintf(want, sizeof want, "\"file_size\":%lld", (long long)0);
    { /* the file size matches the file */
        FILE *f = fopen(model, "rb");
        fseek(f, 0, SEEK_END);
        snprintf(want, sizeof want, "\"file_size\":%ld,", ftell(f));
        fclose(f);
        CHECK(strstr(buf, want), "want %s", want);
    }
    char *a_text[] = {"info", model};
    CHECK(run(buf, sizeof buf, 2, a_text) == CLI_EXIT_OK, "text run");
    snprintf(want, sizeof want, "active/token:    %.2f K (%llu), 2 of 8 experts used",
             (double)active / 1e3, active);
    CHECK(strstr(buf, want), "want '%s' in:\n%s", want, buf);
    CHECK(strstr(buf, "chat template:   present") && strstr(buf, "vocabulary 5 tokens"), "text: %s",
          buf);

    /* Bad input: exit statuses. */
    char *a_none[] = {"info"};
    CHECK(run(buf, sizeof buf, 1, a_none) == CLI_EXIT_USAGE, "no file");
    char *a_opt[] = {"info", model, "--bogus"};
    CHECK(run(buf, sizeof buf, 3, a_opt) == CLI_EXIT_USAGE, "unknown option");
    char *a_two[] = {"info", model, model};
    CHECK(run(buf, sizeof buf, 3, a_two) == CLI_EXIT_USAGE, "two files");
    char *a_missing[] = {"info", "/nonexistent.gguf"};
    CHECK(run(buf, sizeof buf, 2, a_missing) == CLI_EXIT_FAIL && buf[0] == 0, "missing file");
    char *a_dir[] = {"info", dir};
    CHECK(run(buf, sizeof buf, 2, a_dir) == CLI_EXIT_FAIL, "directory");
    /* A truncated copy fails with status 1. */
    char trunc[600];
    snprintf(trunc, sizeof trunc, "%s/trunc.gguf", dir);
    FILE *in = fopen(model, "rb"), *out = fopen(trunc, "wb");
    char chunk[700];
    size_t n = fread(chunk, 1, sizeof chunk, in);
    fwrite(chunk, 1, n, out);
    fclose(in);
    fclose(out);
    char *a_trunc[] = {"info", trunc, "--json"};
    CHECK(run(buf, sizeof buf, 3, a_trunc) == CLI_EXIT_FAIL && buf[0] == 0, "truncated");
    /* A GGUF without an architecture is not a model. */
    engine_gguf_writer_new(&w);
    engine_gguf_writer_set_u32(w, "general.architecture", 3);
    engine_gguf_writer_write(w, trunc, NULL, NULL, 1);
    engine_gguf_writer_free(w);
    CHECK(run(buf, sizeof buf, 2, a_trunc) == CLI_EXIT_FAIL, "no architecture");
    char *a_help[] = {"info", "--help"};
    CHECK(run(buf, sizeof buf, 2, a_help) == CLI_EXIT_OK && strstr(buf, "usage:"), "help");

    /* A Hugging Face checkpoint directory: config.json + a safetensors file written here by
     * hand (BF16 embedding, four F32 routed experts, an F16 norm), tokenizer_config.json with a
     * template, no tokenizer.json. */
    char hf[700], path[800];
    snprintf(hf, sizeof hf, "%s/hf", dir);
    mkdir(hf, 0700);
    char *a_hf[] = {"info", hf, "--json"};
    CHECK(run(buf, sizeof buf, 3, a_hf) == CLI_EXIT_FAIL && buf[0] == 0, "dir without config");
    snprintf(path, sizeof path, "%s/config.json", hf);
    write_text(path, "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": "
                     "\"qwen3_moe\", \"hidden_size\": 8, \"num_hidden_layers\": 1, "
                     "\"max_position_embeddings\": 2048, \"vocab_size\": 5, \"num_experts\": 4, "
                     "\"num_experts_per_tok\": 2, \"torch_dtype\": \"bfloat16\"}");
    CHECK(run(buf, sizeof buf, 3, a_hf) == CLI_EXIT_FAIL && buf[0] == 0, "no safetensors");
    {
        char hdr[1024];
        int o = snprintf(hdr, sizeof hdr, "{\"model.embed_tokens.weight\":{\"dtype\":\"BF16\","
                         "\"shape\":[5,8],\"data_offsets\":[0,80]}");
        size_t off = 80;
        for (int e = 0; e < 4; e++, off += 128)
            o += snprintf(hdr + o, sizeof hdr - (size_t)o,
                          ",\"model.layers.0.mlp.experts.%d.up_proj.weight\":{\"dtype\":\"F32\","
                          "\"shape\":[4,8],\"data_offsets\":[%zu,%zu]}", e, off, off + 128);
        o += snprintf(hdr + o, sizeof hdr - (size_t)o, ",\"model.norm.weight\":{\"dtype\":"
                      "\"F16\",\"shape\":[8],\"data_offsets\":[%zu,%zu]}}", off, off + 16);
        off += 16;
        snprintf(path, sizeof path, "%s/model.safetensors", hf);
        FILE *sf = fopen(path, "wb");
        uint64_t hl = (uint64_t)o; /* little-endian hosts only (as the loader) */
        fwrite(&hl, 8, 1, sf);
        fwrite(hdr, 1, (size_t)o, sf);
        static const char zeros[1024];
        fwrite(zeros, 1, off, sf);
        fclose(sf);
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", hf);
    write_text(path, "{\"chat_template\": \"{{ messages }}\"}");
    CHECK(run(buf, sizeof buf, 3, a_hf) == CLI_EXIT_OK, "hf json run: %s", buf);
    /* dense 40 + 8, experts 4 x 32, 2 of 4 active */
    CHECK(strstr(buf, "\"parameters\":{\"total\":176,\"active\":112,\"experts\":128}"),
          "hf params: %s", buf);
    CHECK(strstr(buf, "\"architecture\":\"qwen3_moe\",\"hf_architecture\":"
                      "\"Qwen3MoeForCausalLM\",\"dtype\":\"bfloat16\""), "hf arch: %s", buf);
    CHECK(strstr(buf, "\"expert_count\":4,\"expert_used_count\":2,\"context_length\":2048,"
                      "\"block_count\":1,\"embedding_length\":8,\"tensor_count\":6"), "hf hp: %s",
          buf);
    CHECK(strstr(buf, "\"BF16\":{\"tensors\":1,\"parameters\":40,\"bytes\":80}") &&
              strstr(buf, "\"F32\":{\"tensors\":4,\"parameters\":128,\"bytes\":512}") &&
              strstr(buf, "\"F16\":{\"tensors\":1,\"parameters\":8,\"bytes\":16}"),
          "hf types: %s", buf);
    CHECK(strstr(buf, "\"tokenizer_json_tokens\":null") && strstr(buf, "\"vocab_size\":5") &&
              strstr(buf, "\"chat_template\":true,\"loadable\":false}"),
          "hf tokenizer, template: %s", buf);
    char *a_hft[] = {"info", hf};
    CHECK(run(buf, sizeof buf, 2, a_hft) == CLI_EXIT_OK, "hf text run");
    CHECK(strstr(buf, "active/token:    112 (112), 2 of 4 experts used") &&
              strstr(buf, "no tokenizer.json (vocab_size 5)") &&
              strstr(buf, "loads here:      no"),
          "hf text: %s", buf);
    /* a damaged config.json is an error naming the file */
    snprintf(path, sizeof path, "%s/config.json", hf);
    write_text(path, "{\"model_type\": ");
    CHECK(run(buf, sizeof buf, 2, a_hft) == CLI_EXIT_FAIL && buf[0] == 0, "bad config.json");
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", hf);
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", hf);
    unlink(path);
    rmdir(hf);

    unlink(model);
    unlink(trunc);
    unlink(out_path);
    rmdir(dir);
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("test_gguf_model_info: ok\n");
    return 0;
}
