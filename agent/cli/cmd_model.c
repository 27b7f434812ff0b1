/* spark-agent model: the dispatcher (gen, info, tokenize) and `model tokenize`. */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

static void tokenize_usage(FILE *f) {
    fprintf(f, "usage: spark-agent model tokenize FILE [--text T] [--decode] [--no-parse-special]\n\n"
               "Tokenize text (from --text, else stdin) with FILE's tokenizer and print the ids as\n"
               "a JSON array; with --decode, read a JSON array of ids and print their text.\n\n"
               "  --text T              the input (default: all of stdin)\n"
               "  --decode              ids in, text out\n"
               "  --no-parse-special    treat special-token text such as <|im_start|> as plain\n"
               "                        text (default: it becomes the special token)\n");
}

/* Read all of stdin into a malloc'ed buffer. */
char *cli_read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) return NULL;
    for (;;) {
        if (n == cap) {
            if (cap > (size_t)1 << 32) { /* 4 GiB of input is a mistake, not a prompt */
                free(buf);
                errno = EFBIG;
                return NULL;
            }
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n, stdin);
        n += r;
        if (r == 0) {
            if (ferror(stdin)) {
                free(buf);
                return NULL;
            }
            break;
        }
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* Parse a JSON array of non-negative integers ("[1, 2, 3]"). Returns the count or -1 with a
 * message in err. *ids is malloc'ed. */
static long parse_id_array(const char *s, int32_t **ids, char *err, size_t err_cap) {
    size_t cap = 64, n = 0;
    int32_t *a = malloc(cap * sizeof *a);
    if (!a) {
        snprintf(err, err_cap, "out of memory");
        return -1;
    }
    const char *p = s;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    if (*p++ != '[') goto bad;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (*p == ']' && n == 0) {
            p++;
            break;
        }
        if (*p < '0' || *p > '9') goto bad;
        errno = 0;
        char *end;
        long v = strtol(p, &end, 10);
        if (errno || v > INT32_MAX) goto bad;
        if (n == cap) {
            int32_t *na = realloc(a, cap * 2 * sizeof *a);
            if (!na) {
                free(a);
                snprintf(err, err_cap, "out of memory");
                return -1;
            }
            a = na;
            cap *= 2;
        }
        a[n++] = (int32_t)v;
        p = end;
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p == ']') {
            p++;
            break;
        }
        goto bad;
    }
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    if (*p) goto bad;
    *ids = a;
    return (long)n;
bad:
    snprintf(err, err_cap, "expected a JSON array of token ids such as [9707, 1879]; "
             "cannot parse at byte %ld", (long)(p - s));
    free(a);
    return -1;
}

static int cli_model_tokenize(int argc, char **argv) {
    enum { OPT_TEXT = 256, OPT_DECODE, OPT_NOSPECIAL };
    static const struct option opts[] = {
        {"text", required_argument, 0, OPT_TEXT},
        {"decode", no_argument, 0, OPT_DECODE},
        {"no-parse-special", no_argument, 0, OPT_NOSPECIAL},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *text = NULL;
    bool decode = false, special = true;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case OPT_TEXT: text = optarg; break;
        case OPT_DECODE: decode = true; break;
        case OPT_NOSPECIAL: special = false; break;
        case 'h': tokenize_usage(stdout); return CLI_EXIT_OK;
        case ':':
            cli_errorf("model tokenize", "option %s needs a value", argv[optind - 1]);
            return CLI_EXIT_USAGE;
        default:
            cli_errorf("model tokenize", "unknown option '%s'", argv[optind - 1]);
            tokenize_usage(stderr);
            return CLI_EXIT_USAGE;
        }
    }
    if (optind != argc - 1) {
        cli_errorf("model tokenize", optind >= argc ? "no model file given"
                                                    : "more than one model file given");
        tokenize_usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *path = argv[optind];
    char *in = NULL;
    size_t in_len;
    if (text) {
        in_len = strlen(text);
    } else {
        if (!(in = cli_read_stdin(&in_len))) {
            cli_errorf("model tokenize", "cannot read stdin: %s", strerror(errno));
            return CLI_EXIT_FAIL;
        }
        text = in;
    }
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.vocab_only = true;
    engine_model *m = NULL;
    int rc = engine_model_load(&m, path, &mp);
    if (rc) {
        cli_errorf("model tokenize", "%s", engine_error_last());
        free(in);
        return CLI_EXIT_FAIL;
    }
    int ret = CLI_EXIT_OK;
    int32_t *ids = NULL;
    char *out = NULL;
    if (decode) {
        char err[160];
        long n = parse_id_array(text, &ids, err, sizeof err);
        if (n < 0) {
            cli_errorf("model tokenize", "%s", err);
            ret = CLI_EXIT_USAGE;
            goto done;
        }
        size_t len = 0;
        rc = engine_model_detokenize(m, ids, (size_t)n, NULL, 0, &len);
        if (rc && rc != ENGINE_ERANGE) {
            cli_errorf("model tokenize", "%s", engine_error_last());
            ret = CLI_EXIT_FAIL;
            goto done;
        }
        if (!(out = malloc(len + 1))) {
            cli_errorf("model tokenize", "out of memory");
            ret = CLI_EXIT_FAIL;
            goto done;
        }
        engine_model_detokenize(m, ids, (size_t)n, out, len + 1, &len);
        fwrite(out, 1, len, stdout);
    } else {
        size_t n = 0, cap = in_len + 16;
        if (!(ids = malloc(cap * sizeof *ids))) {
            cli_errorf("model tokenize", "out of memory");
            ret = CLI_EXIT_FAIL;
            goto done;
        }
        /* a byte-level BPE never makes more tokens than bytes; specials only fewer */
        if ((rc = engine_model_tokenize(m, text, in_len, special, ids, cap, &n))) {
            cli_errorf("model tokenize", "%s", engine_error_last());
            ret = CLI_EXIT_FAIL;
            goto done;
        }
        putchar('[');
        for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
        printf("]\n");
    }
    if (fflush(stdout) != 0) ret = CLI_EXIT_FAIL;
done:
    free(out);
    free(ids);
    free(in);
    engine_model_free(m);
    return ret;
}

/* The subcommands of other helpers are linked weakly until their files land, so the
 * dispatcher says "not available yet" instead of failing to link. */
int cli_model_gen(int argc, char **argv) __attribute__((weak));
int cli_model_info(int argc, char **argv) __attribute__((weak));

static void usage(FILE *f) {
    fprintf(f, "usage: spark-agent model <gen|info|tokenize> ...\n\n"
               "  gen       write a deterministic random-weight model\n"
               "  info      inspect a model file\n"
               "  tokenize  text to token ids (JSON array), or back with --decode\n"
               "  render    render a chat (messages on stdin) with the model's chat template\n\n"
               "'spark-agent model <sub> --help' for the options.\n");
}

int cli_model(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    cli_command_fn fn = NULL;
    if (!strcmp(sub, "tokenize")) fn = cli_model_tokenize;
    else if (!strcmp(sub, "gen")) fn = cli_model_gen;
    else if (!strcmp(sub, "info")) fn = cli_model_info;
    else if (!strcmp(sub, "render")) {
#ifdef SPARK_FULL_BUILD
        fn = cli_model_render;
#else
        cli_errorf("model", "render: not in this build: it was built with SPARK_ENGINE_ONLY=ON, "
                   "without the chat-template interpreter");
        return CLI_EXIT_USAGE;
#endif
    } else {
        cli_errorf("model", "unknown subcommand '%s'", sub);
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (!fn) {
        cli_errorf("model", "%s: not available yet", sub);
        return CLI_EXIT_USAGE;
    }
    return fn(argc - 1, argv + 1);
}
