/* spark-agent model render FILE [--tools TOOLS.json] [--no-generation-prompt]
 *                               [--enable-thinking=BOOL] [--template FILE.jinja]
 * Render an OpenAI-style conversation from stdin with the model's chat template (the GGUF's
 * tokenizer.chat_template), exactly as Hugging Face's apply_chat_template renders it through
 * @huggingface/jinja. The text goes to stdout as is (no newline added). */
#include "cli.h"

#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "engine.h"

static void render_usage(FILE *f) {
    fprintf(f,
            "usage: spark-agent model render FILE [--tools TOOLS.json] [--no-generation-prompt]\n"
            "                                [--enable-thinking=true|false] [--template T.jinja]\n\n"
            "Render the conversation on stdin with FILE's chat template (tokenizer.chat_template)\n"
            "as Hugging Face's apply_chat_template would, and print the text.\n\n"
            "stdin: a JSON array of messages, or an object with \"messages\" (and \"tools\"), as in\n"
            "an OpenAI chat request.\n\n"
            "  --tools FILE            a JSON array of tool definitions\n"
            "  --no-generation-prompt  do not end with the assistant header\n"
            "  --enable-thinking=BOOL  pass enable_thinking to the template (Qwen3: false adds an\n"
            "                          empty <think></think> block)\n"
            "  --template FILE         use this Jinja file instead of the model's template (FILE\n"
            "                          may then be omitted)\n");
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 14, n = 0, got;
    char *buf = malloc(cap + 1);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *nb = cap > ((size_t)1 << 30) ? NULL : realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    bool err = ferror(f);
    fclose(f);
    if (!buf || err) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

/* The text of token `id` as a NUL-terminated string, or NULL. */
static char *token_text(const engine_model *m, int32_t id) {
    if (id < 0) return NULL;
    size_t len = 0;
    const char *p = engine_model_token_bytes(m, id, &len);
    if (!p) return NULL;
    char *s = malloc(len + 1);
    if (!s) return NULL;
    memcpy(s, p, len);
    s[len] = 0;
    return s;
}

int cli_model_render(int argc, char **argv) {
    static const struct option opts[] = {
        {"tools", required_argument, NULL, 't'},
        {"no-generation-prompt", no_argument, NULL, 'n'},
        {"enable-thinking", required_argument, NULL, 'e'},
        {"template", required_argument, NULL, 'T'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *tools_path = NULL, *template_path = NULL;
    agent_template_opts ro = AGENT_TEMPLATE_OPTS_INIT;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 't': tools_path = optarg; break;
        case 'n': ro.add_generation_prompt = false; break;
        case 'T': template_path = optarg; break;
        case 'e':
            if (!strcmp(optarg, "true") || !strcmp(optarg, "1")) ro.enable_thinking = 1;
            else if (!strcmp(optarg, "false") || !strcmp(optarg, "0")) ro.enable_thinking = 0;
            else {
                cli_errorf("model render", "--enable-thinking takes true or false, not '%s'",
                           optarg);
                return CLI_EXIT_USAGE;
            }
            break;
        case 'h': render_usage(stdout); return CLI_EXIT_OK;
        default:
            cli_errorf("model render", "unknown or incomplete option '%s'", argv[optind - 1]);
            render_usage(stderr);
            return CLI_EXIT_USAGE;
        }
    }
    const char *model_path = optind < argc ? argv[optind] : NULL;
    if (optind + 1 < argc) {
        cli_errorf("model render", "unexpected argument '%s'", argv[optind + 1]);
        return CLI_EXIT_USAGE;
    }
    if (!model_path && !template_path) {
        cli_errorf("model render", "a model FILE (or --template FILE.jinja) is required");
        render_usage(stderr);
        return CLI_EXIT_USAGE;
    }

    int ret = CLI_EXIT_FAIL;
    engine_model *m = NULL;
    char *source = NULL, *bos = NULL, *eos = NULL, *tools_text = NULL, *in = NULL;
    char *msgs_text = NULL, *stdin_tools = NULL, *out = NULL;
    json_t *req = NULL;
    agent_template *t = NULL;

    if (template_path) {
        if (!(source = slurp(template_path, NULL))) {
            cli_errorf("model render", "cannot read %s", template_path);
            goto done;
        }
    }
    if (model_path) {
        engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
        mp.vocab_only = true;
        mp.device = ENGINE_DEVICE_CPU;
        if (engine_model_load(&m, model_path, &mp)) {
            cli_errorf("model render", "%s", engine_error_last());
            goto done;
        }
        if (!source) {
            const char *ct = engine_model_chat_template(m);
            if (!ct) {
                cli_errorf("model render", "%s has no tokenizer.chat_template; pass --template",
                           model_path);
                goto done;
            }
            if (!(source = strdup(ct))) goto oom;
        }
        bos = token_text(m, engine_model_token_bos(m));
        eos = token_text(m, engine_model_token_eos(m));
        ro.bos_token = bos;
        ro.eos_token = eos;
    }
    if (agent_template_new(&t, source)) {
        cli_errorf("model render", "chat template%s%s: %s", template_path ? " " : "",
                   template_path ? template_path : "", agent_error_last());
        goto done;
    }
    if (tools_path && !(tools_text = slurp(tools_path, NULL))) {
        cli_errorf("model render", "cannot read %s", tools_path);
        goto done;
    }
    size_t in_len = 0;
    if (!(in = cli_read_stdin(&in_len))) {
        cli_errorf("model render", "cannot read stdin");
        goto done;
    }
    json_error_t je;
    if (!(req = json_loadb(in, in_len, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, &je))) {
        cli_errorf("model render", "stdin: invalid JSON at line %d, column %d: %s", je.line,
                   je.column, je.text);
        ret = CLI_EXIT_USAGE;
        goto done;
    }
    if (json_is_object(req)) {
        json_t *msgs = json_object_get(req, "messages");
        if (!json_is_array(msgs)) {
            cli_errorf("model render", "stdin: the object has no \"messages\" array");
            ret = CLI_EXIT_USAGE;
            goto done;
        }
        if (!(msgs_text = json_dumps(msgs, JSON_COMPACT | JSON_REAL_PRECISION(17)))) goto oom;
        json_t *tools = json_object_get(req, "tools");
        if (tools && !tools_text &&
            !(stdin_tools = json_dumps(tools, JSON_COMPACT | JSON_ENCODE_ANY |
                                                  JSON_REAL_PRECISION(17))))
            goto oom;
    } else if (!json_is_array(req)) {
        cli_errorf("model render", "stdin: expected a JSON array of messages or an object with "
                                   "\"messages\"");
        ret = CLI_EXIT_USAGE;
        goto done;
    }
    size_t out_len = 0;
    if (agent_template_render(t, msgs_text ? msgs_text : in, tools_text ? tools_text : stdin_tools,
                              &ro, &out, &out_len)) {
        cli_errorf("model render", "%s", agent_error_last());
        goto done;
    }
    if (fwrite(out, 1, out_len, stdout) != out_len || fflush(stdout)) {
        cli_errorf("model render", "cannot write the output");
        goto done;
    }
    ret = CLI_EXIT_OK;
    goto done;
oom:
    cli_errorf("model render", "out of memory");
done:
    free(out);
    free(msgs_text);
    free(stdin_tools);
    json_decref(req);
    free(in);
    free(tools_text);
    agent_template_free(t);
    free(bos);
    free(eos);
    free(source);
    engine_model_free(m);
    return ret;
}
