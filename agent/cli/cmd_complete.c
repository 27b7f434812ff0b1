/* spark-agent complete: raw text completion. Generated text only on stdout; stats on stderr.
 * Also the helpers the engine commands share (model resolution, UTF-8 check). */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

#ifdef SPARK_FULL_BUILD
#include "grammar.h"
#endif


int cli_model_resolve(const char *cmd, const char *flag, const cli_config *cfg, char *out,
                      size_t cap) {
    if (flag && *flag) {
        snprintf(out, cap, "%s", flag);
        return 0;
    }
    if (cfg->model[0]) {
        snprintf(out, cap, "%s", cfg->model);
        return 0;
    }
    if (engine_default_model_path(out, cap) != 0) {
        cli_errorf(cmd, "no model given (-m FILE, SPARK_MODEL or model = in the config file) "
                   "and the default model is not available: %s", engine_error_last());
        return -1;
    }
    return 0;
}

bool cli_utf8_valid(const char *s, size_t n, size_t *bad_at) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        size_t len;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            len = 2;
            cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            len = 3;
            cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            len = 4;
            cp = c & 0x07;
        } else {
            goto bad;
        }
        if (i + len > n) goto bad;
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xc0) != 0x80) goto bad;
            cp = (cp << 6) | (p[i + k] & 0x3f);
        }
        /* overlong forms, surrogates, beyond U+10FFFF */
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
            (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
            goto bad;
        i += len;
    }
    return true;
bad:
    if (bad_at) *bad_at = i;
    return false;
}

/* Read a whole file (NUL-terminated). NULL with errno on failure. */
static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 65536;
            if (cap > ((size_t)1 << 30)) { /* a grammar or schema of 1 GiB is a mistake */
                errno = EFBIG;
                goto fail;
            }
            char *nb = realloc(buf, cap);
            if (!nb) goto fail;
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    if (ferror(f)) goto fail;
    fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
fail:;
    int e = errno;
    free(buf);
    fclose(f);
    errno = e;
    return NULL;
}

/* ----- fill in the middle: complete FILE:LINE[:COL] ----- */

/* "FILE:LINE" or "FILE:LINE:COL" (FILE may contain ':'). *col = 0 when not given. */
static bool fim_parse_position(const char *arg, char *path, size_t cap, long *line, long *col) {
    const char *c1 = strrchr(arg, ':');
    if (!c1 || c1 == arg) return false;
    const char *c2 = NULL;
    for (const char *p = c1 - 1; p > arg; p--)
        if (*p == ':') {
            c2 = p;
            break;
        }
    char num[32];
    long a, b;
    snprintf(num, sizeof num, "%s", c1 + 1);
    if (!cli_parse_long(num, 1, INT32_MAX, &b)) return false;
    if (c2 && (size_t)(c1 - c2 - 1) < sizeof num) {
        snprintf(num, sizeof num, "%.*s", (int)(c1 - c2 - 1), c2 + 1);
        if (cli_parse_long(num, 1, INT32_MAX, &a) && c2 > arg) {
            if ((size_t)(c2 - arg) >= cap) return false;
            snprintf(path, cap, "%.*s", (int)(c2 - arg), arg);
            *line = a;
            *col = b;
            return true;
        }
    }
    if ((size_t)(c1 - arg) >= cap) return false;
    snprintf(path, cap, "%.*s", (int)(c1 - arg), arg);
    *line = b;
    *col = 0;
    return true;
}

/* The byte offset of (line, col) in text: line 1-based (one past the last line is the end of a
 * file that ends with a newline), col 1-based in characters (0: the end of the line; the
 * line's length + 1 is its end). Returns NULL or what is wrong. */
static const char *fim_locate(const char *text, size_t len, long line, long col, size_t *cut,
                              long *n_lines) {
    size_t at = 0;
    long ln = 1;
    while (ln < line && at < len) {
        const char *nl = memchr(text + at, '\n', len - at);
        if (!nl) break;
        at = (size_t)(nl - text) + 1;
        ln++;
    }
    *n_lines = ln;
    if (ln < line) {
        /* count the file's lines for the message */
        while (at < len) {
            const char *nl = memchr(text + at, '\n', len - at);
            if (!nl) break;
            at = (size_t)(nl - text) + 1;
            (*n_lines)++;
        }
        return "the file has fewer lines than that";
    }
    const char *nl = memchr(text + at, '\n', len - at);
    size_t end = nl ? (size_t)(nl - text) : len;
    if (col == 0) {
        *cut = end;
        return NULL;
    }
    long ch = 1;
    size_t p = at;
    while (ch < col && p < end) {
        p++;
        while (p < end && ((unsigned char)text[p] & 0xc0) == 0x80) p++;
        ch++;
    }
    if (ch < col) return "the line is shorter than that column";
    *cut = p;
    return NULL;
}

/* The id of a special token spelled `text`, or -1 when the model has none. */
static int32_t fim_special(const engine_model *m, const char *text) {
    int32_t ids[4];
    size_t n = 0;
    if (engine_model_tokenize(m, text, strlen(text), true, ids, 4, &n) != 0 || n != 1 ||
        !engine_model_token_is_special(m, ids[0]))
        return -1;
    return ids[0];
}

typedef struct {
    int32_t *ids;
    size_t n, n_prefix, n_suffix;
    bool cut_prefix, cut_suffix;
    int32_t stop[8];
    size_t n_stop;
} fim_prompt;

/* Build <|fim_prefix|>PREFIX<|fim_suffix|>SUFFIX<|fim_middle|> for the cursor at `cut` of
 * text, within `budget` tokens: the prefix keeps its end and the suffix its start (the prefix
 * gets at least three quarters of a tight budget). The file's text is tokenized without
 * special tokens, so a file that spells one cannot inject it. Returns an exit status. */
static int fim_build(const char *cmd, const engine_model *m, const char *text, size_t len,
                     size_t cut, size_t budget, fim_prompt *fp) {
    static const char *const names[3] = {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"};
    int32_t mark[3];
    for (int i = 0; i < 3; i++)
        if ((mark[i] = fim_special(m, names[i])) < 0) {
            cli_errorf(cmd, "this model has no fill-in-the-middle tokens (%s is not a special "
                       "token of its vocabulary)", names[i]);
            return CLI_EXIT_FAIL;
        }
    static const char *const stops[] = {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
                                        "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>",
                                        "<|endoftext|>", "<|im_end|>"};
    for (size_t i = 0; i < sizeof stops / sizeof stops[0]; i++) {
        int32_t id = fim_special(m, stops[i]);
        if (id >= 0) fp->stop[fp->n_stop++] = id;
    }
    if (budget < 8) {
        cli_errorf(cmd, "the context is too small for a fill-in-the-middle prompt (raise -c or "
                   "lower -n)");
        return CLI_EXIT_USAGE;
    }
    int32_t *pre = malloc((cut + 1) * sizeof *pre), *suf = malloc((len - cut + 1) * sizeof *suf);
    fp->ids = malloc((len + 8) * sizeof *fp->ids);
    size_t np = 0, ns = 0;
    int ret = CLI_EXIT_FAIL;
    if (!pre || !suf || !fp->ids) {
        cli_errorf(cmd, "out of memory for the prompt");
        goto done;
    }
    if ((cut && engine_model_tokenize(m, text, cut, false, pre, cut + 1, &np) != 0) ||
        (len > cut &&
         engine_model_tokenize(m, text + cut, len - cut, false, suf, len - cut + 1, &ns) != 0)) {
        cli_errorf(cmd, "%s", engine_error_last());
        goto done;
    }
    size_t room = budget - 3, keep_p = np, keep_s = ns;
    if (np + ns > room) {
        size_t min_p = room * 3 / 4;
        keep_s = ns < room - (np < min_p ? np : min_p) ? ns : room - (np < min_p ? np : min_p);
        keep_p = np < room - keep_s ? np : room - keep_s;
    }
    fp->cut_prefix = keep_p < np;
    fp->cut_suffix = keep_s < ns;
    size_t k = 0;
    fp->ids[k++] = mark[0];
    memcpy(fp->ids + k, pre + (np - keep_p), keep_p * sizeof *pre);
    k += keep_p;
    fp->ids[k++] = mark[1];
    memcpy(fp->ids + k, suf, keep_s * sizeof *suf);
    k += keep_s;
    fp->ids[k++] = mark[2];
    fp->n = k;
    fp->n_prefix = keep_p;
    fp->n_suffix = keep_s;
    ret = CLI_EXIT_OK;
done:
    free(pre);
    free(suf);
    return ret;
}

#ifdef SPARK_FULL_BUILD
/* A grammar matcher over the model's vocabulary, wired into the sampler's hooks. */
typedef struct {
    grammar *g;
    grammar_vocab *v;
    grammar_index *ix;
    grammar_matcher *m;
} cli_grammar;

static void cli_grammar_free(cli_grammar *cg) {
    grammar_matcher_free(cg->m);
    grammar_index_free(cg->ix);
    grammar_vocab_free(cg->v);
    grammar_free(cg->g);
}

/* Returns a CLI exit status (0 on success). */
static int cli_grammar_setup(cli_grammar *cg, engine_model *m, const char *gbnf,
                             const char *schema, engine_sampling_params *sp) {
    const char *cmd = "complete", *path = gbnf ? gbnf : schema;
    size_t len;
    char *text = read_file(path, &len);
    if (!text) {
        cli_errorf(cmd, "cannot read %s: %s", path, strerror(errno));
        return CLI_EXIT_FAIL;
    }
    int rc = gbnf ? grammar_new_gbnf(&cg->g, text, len, NULL)
                  : grammar_new_json_schema(&cg->g, text, len);
    free(text);
    if (rc) {
        cli_errorf(cmd, "%s: %s", path, grammar_error_last());
        return CLI_EXIT_USAGE;
    }
    int32_t nv = engine_model_n_vocab(m);
    const char **pieces = malloc(sizeof(char *) * (size_t)nv);
    uint32_t *lens = malloc(sizeof(uint32_t) * (size_t)nv);
    int32_t *eog = malloc(sizeof(int32_t) * (size_t)nv);
    int n_eog = 0, ret = CLI_EXIT_FAIL;
    if (!pieces || !lens || !eog) {
        cli_errorf(cmd, "out of memory for the grammar's vocabulary");
        goto done;
    }
    for (int32_t i = 0; i < nv; i++) {
        size_t l = 0;
        pieces[i] = engine_model_token_bytes(m, i, &l);
        /* control tokens never appear inside constrained text; EOG ones end it */
        lens[i] = engine_model_token_is_special(m, i) ? 0 : (uint32_t)l;
        if (engine_model_token_is_eog(m, i)) eog[n_eog++] = i;
    }
    if ((rc = grammar_vocab_new(&cg->v, nv, pieces, lens)) ||
        (rc = grammar_index_new(&cg->ix, cg->g, cg->v)) ||
        (rc = grammar_matcher_new(&cg->m, cg->ix, eog, n_eog))) {
        cli_errorf(cmd, "%s: %s", path, grammar_error_last());
        goto done;
    }
    sp->mask = grammar_sampler_mask;
    sp->accept = grammar_sampler_accept;
    sp->free_mask = grammar_sampler_free;
    sp->grammar_user = cg->m;
    ret = CLI_EXIT_OK;
done:
    free(pieces);
    free(lens);
    free(eog);
    return ret;
}
#endif

static void usage(FILE *f) {
    fprintf(f,
            "usage: spark-agent complete [-m FILE] [-p TEXT] [-n N] [-s SEED] [--temp T]\n"
            "                            [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R]\n"
            "                            [-t THREADS] [-c CTX] [--device D] [--kv TYPE]\n"
            "                            [--grammar FILE.gbnf] [--json-schema FILE.json]\n"
            "                            [--mtp K]\n\n"
            "Complete the prompt (from -p, else stdin) as raw text. The generated text goes to\n"
            "stdout, statistics to stderr.\n\n"
            "  -m, --model FILE        GGUF model (default: SPARK_MODEL, the config file, else\n"
            "                          the embedded tiny model)\n"
            "  -p, --prompt TEXT       the prompt (default: all of stdin); special tokens such as\n"
            "                          <|im_start|> are parsed\n"
            "  -n, --n-predict N       tokens to generate at most (default 128; -1: until the\n"
            "                          end of generation or a full context)\n"
            "  -s, --seed N            sampling seed (default: random, printed with the stats)\n"
            "  --temp T                temperature (default 0.8; 0 = greedy)\n"
            "  --top-k K               (default 40; 0 = off)\n"
            "  --top-p P               (default 0.95; 1 = off)\n"
            "  --min-p P               (default 0.05; 0 = off)\n"
            "  --repeat-penalty R      over the last 64 tokens (default 1.0 = off)\n"
            "  --ignore-eos            keep going after end-of-generation tokens\n"
            "  -t, --threads N         CPU threads (default: config, else all cores)\n"
            "  -c, --ctx-size N        context length (default: min(trained, 4096))\n"
            "  --device D              auto, cpu or cuda (default: config, else auto)\n"
            "  --kv TYPE               KV cache type f16, f32 or q8_0 (CPU only; default:\n"
            "                          SPARK_KV_TYPE, the config's kv_type, else f16)\n"
            "  --grammar FILE          constrain the output with a GBNF grammar\n"
            "  --json-schema FILE      constrain the output to JSON matching the schema\n"
            "  --mtp K                 speculative decoding with the model's MTP block: draft K\n"
            "                          tokens (1-4) per verify pass (qwen35moe files that carry\n"
            "                          it, CPU; default: SPARK_MTP, else 0 = off); prints the\n"
            "                          acceptance statistics\n\n"
            "       spark-agent complete [options] FILE:LINE[:COL] [--print-prompt]\n\n"
            "Fill in the middle at a position of a file: the text before the cursor and after\n"
            "it become the model's <|fim_prefix|>/<|fim_suffix|>/<|fim_middle|> prompt (Qwen\n"
            "coder models; the file's text never becomes special tokens) and the generated\n"
            "middle goes to stdout. LINE counts from 1; COL counts characters from 1 (default:\n"
            "the end of the line). A file too long for the context keeps the text nearest to\n"
            "the cursor. --print-prompt prints the prompt's token ids as JSON instead.\n");
}

bool cli_parse_float(const char *s, double lo, double hi, float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return false;
    *out = (float)v;
    return true;
}

bool cli_parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    if (!s[0] || s[0] == '-') return false;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end) return false;
    *out = v;
    return true;
}

typedef struct {
    bool write_failed;
} out_state;

static int on_text(void *user, const char *text, size_t len, int32_t token) {
    (void)token;
    out_state *o = user;
    if (len && (fwrite(text, 1, len, stdout) != len || fflush(stdout) != 0)) {
        o->write_failed = true;
        return 1; /* the reader went away: stop generating */
    }
    return 0;
}

static const char *stop_name(engine_stop_reason r) {
    switch (r) {
    case ENGINE_STOP_NONE: return "none";
    case ENGINE_STOP_LENGTH: return "length";
    case ENGINE_STOP_EOG: return "end of generation";
    case ENGINE_STOP_TOKEN: return "stop token";
    case ENGINE_STOP_STRING: return "stop string";
    case ENGINE_STOP_CONTEXT: return "context full";
    case ENGINE_STOP_CANCELED: return "cancelled";
    }
    return "?";
}

int cli_complete(int argc, char **argv) {
    enum {
        OPT_TEMP = 256, OPT_TOPK, OPT_TOPP, OPT_MINP, OPT_REP, OPT_GRAMMAR, OPT_SCHEMA,
        OPT_DEVICE, OPT_IGNORE_EOS, OPT_PRINT_PROMPT, OPT_KV, OPT_MTP,
    };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"prompt", required_argument, 0, 'p'},
        {"n-predict", required_argument, 0, 'n'},
        {"seed", required_argument, 0, 's'},
        {"temp", required_argument, 0, OPT_TEMP},
        {"top-k", required_argument, 0, OPT_TOPK},
        {"top-p", required_argument, 0, OPT_TOPP},
        {"min-p", required_argument, 0, OPT_MINP},
        {"repeat-penalty", required_argument, 0, OPT_REP},
        {"threads", required_argument, 0, 't'},
        {"ctx-size", required_argument, 0, 'c'},
        {"device", required_argument, 0, OPT_DEVICE},
        {"kv", required_argument, 0, OPT_KV},
        {"grammar", required_argument, 0, OPT_GRAMMAR},
        {"json-schema", required_argument, 0, OPT_SCHEMA},
        {"ignore-eos", no_argument, 0, OPT_IGNORE_EOS},
        {"print-prompt", no_argument, 0, OPT_PRINT_PROMPT},
        {"mtp", required_argument, 0, OPT_MTP},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *cmd = "complete";
    const char *model_flag = NULL, *prompt = NULL, *gbnf_path = NULL, *schema_path = NULL;
    const char *device = NULL, *kv_flag = NULL;
    long n_predict = 128, threads = -1, n_ctx = 0, v = 0;
    bool have_seed = false, print_prompt = false, have_mtp = false;
    engine_gen_params gp = ENGINE_GEN_PARAMS_INIT;
    engine_sampling_params *sp = &gp.sampling;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":m:p:n:s:t:c:h", opts, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case 'm': model_flag = optarg; break;
        case 'p': prompt = optarg; break;
        case 'n': ok = cli_parse_long(optarg, -1, INT32_MAX, &n_predict); break;
        case 's': ok = cli_parse_u64(optarg, &sp->seed); have_seed = true; break;
        case OPT_TEMP: ok = cli_parse_float(optarg, 0.0, 100.0, &sp->temperature); break;
        case OPT_TOPK:
            ok = cli_parse_long(optarg, 0, INT32_MAX, &v);
            sp->top_k = (int32_t)v;
            break;
        case OPT_TOPP: ok = cli_parse_float(optarg, 1e-6, 1.0, &sp->top_p); break;
        case OPT_MINP: ok = cli_parse_float(optarg, 0.0, 1.0, &sp->min_p); break;
        case OPT_REP: ok = cli_parse_float(optarg, 1e-3, 100.0, &sp->repeat_penalty); break;
        case OPT_MTP:
            ok = cli_parse_long(optarg, 0, 4, &v);
            gp.mtp_draft = (int32_t)v;
            have_mtp = true;
            break;
        case 't': ok = cli_parse_long(optarg, 1, 1024, &threads); break;
        case 'c': ok = cli_parse_long(optarg, 1, INT32_MAX, &n_ctx); break;
        case OPT_DEVICE: device = optarg; ok = engine_device_parse(optarg) >= 0; break;
        case OPT_KV: kv_flag = optarg; ok = engine_kv_type_parse(optarg) >= 0; break;
        case OPT_GRAMMAR: gbnf_path = optarg; break;
        case OPT_SCHEMA: schema_path = optarg; break;
        case OPT_IGNORE_EOS: gp.ignore_eog = true; break;
        case OPT_PRINT_PROMPT: print_prompt = true; break;
        case 'h': usage(stdout); return CLI_EXIT_OK;
        case ':': cli_errorf(cmd, "option %s needs a value", argv[optind - 1]); return CLI_EXIT_USAGE;
        default:
            cli_errorf(cmd, "unknown option '%s'", argv[optind - 1]);
            usage(stderr);
            return CLI_EXIT_USAGE;
        }
        if (!ok) {
            cli_errorf(cmd, "bad value '%s' for %s", optarg, argv[optind - 1]);
            return CLI_EXIT_USAGE;
        }
    }
    /* fill in the middle: one FILE:LINE[:COL] argument instead of a prompt */
    const char *fim_arg = optind < argc ? argv[optind] : NULL;
    char fim_path[4096];
    long fim_line = 0, fim_col = 0;
    if (optind + 1 < argc || (fim_arg && prompt)) {
        cli_errorf(cmd, "unexpected argument '%s' (the prompt goes in -p or stdin; a position "
                   "is one FILE:LINE[:COL])", argv[fim_arg && prompt ? optind : optind + 1]);
        return CLI_EXIT_USAGE;
    }
    if (fim_arg && !fim_parse_position(fim_arg, fim_path, sizeof fim_path, &fim_line, &fim_col)) {
        cli_errorf(cmd, "'%s' is not FILE:LINE or FILE:LINE:COL", fim_arg);
        return CLI_EXIT_USAGE;
    }
    if (print_prompt && !fim_arg) {
        cli_errorf(cmd, "--print-prompt goes with a FILE:LINE position");
        return CLI_EXIT_USAGE;
    }
    if (gbnf_path && schema_path) {
        cli_errorf(cmd, "--grammar and --json-schema exclude each other");
        return CLI_EXIT_USAGE;
    }
#ifndef SPARK_FULL_BUILD
    if (gbnf_path || schema_path) {
        cli_errorf(cmd, "%s: not in this build: it was built with SPARK_ENGINE_ONLY=ON, "
                   "without the grammar library", gbnf_path ? "--grammar" : "--json-schema");
        return CLI_EXIT_USAGE;
    }
#endif
    cli_config cfg;
    if (cli_config_load(&cfg) != 0) {
        cli_errorf(cmd, "%s", cfg.error);
        return CLI_EXIT_USAGE;
    }
    char path[4096];
    if (cli_model_resolve(cmd, model_flag, &cfg, path, sizeof path) != 0) return CLI_EXIT_FAIL;
    if (!have_seed) sp->seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    const char *mtp_env = getenv("SPARK_MTP");
    if (!have_mtp && mtp_env && mtp_env[0]) {
        if (!cli_parse_long(mtp_env, 0, 4, &v)) {
            cli_errorf(cmd, "SPARK_MTP=%s is not a draft count 0..4", mtp_env);
            return CLI_EXIT_USAGE;
        }
        gp.mtp_draft = (int32_t)v;
    }
    gp.max_tokens = n_predict < 0 ? 0 : (int32_t)n_predict;

    char *in = NULL;
    size_t plen, fim_cut = 0;
    if (fim_arg) {
        if (!(in = read_file(fim_path, &plen))) {
            cli_errorf(cmd, "cannot read %s: %s", fim_path, strerror(errno));
            return CLI_EXIT_FAIL;
        }
        long n_lines = 0;
        const char *why = fim_locate(in, plen, fim_line, fim_col, &fim_cut, &n_lines);
        if (why) {
            cli_errorf(cmd, "%s: no position %ld:%ld: %s (%ld lines)", fim_path, fim_line,
                       fim_col, why, n_lines);
            free(in);
            return CLI_EXIT_USAGE;
        }
        prompt = in;
    } else if (prompt) {
        plen = strlen(prompt);
    } else {
        if (!(in = cli_read_stdin(&plen))) {
            cli_errorf(cmd, "cannot read the prompt from stdin: %s", strerror(errno));
            return CLI_EXIT_FAIL;
        }
        prompt = in;
    }
    int ret = CLI_EXIT_FAIL;
    engine_model *m = NULL;
    engine_session *s = NULL;
    int32_t *ids = NULL;
    size_t bad;
#ifdef SPARK_FULL_BUILD
    cli_grammar cg = {NULL, NULL, NULL, NULL};
#endif
    fim_prompt fp = {0};
    if (!cli_utf8_valid(prompt, plen, &bad)) {
        if (fim_arg) cli_errorf(cmd, "%s is not valid UTF-8 text (byte %zu)", fim_path, bad);
        else cli_errorf(cmd, "the prompt is not valid UTF-8 (byte %zu)", bad);
        ret = CLI_EXIT_USAGE;
        goto done;
    }
    if (plen == 0 && !fim_arg) {
        cli_errorf(cmd, "the prompt is empty");
        ret = CLI_EXIT_USAGE;
        goto done;
    }
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.n_threads = threads > 0 ? (int)threads : cfg.threads;
    mp.device = (engine_device)engine_device_parse(device ? device : cfg.device);
    if (cli_kv_type_plan(cmd, kv_flag, &cfg, &mp)) {
        ret = CLI_EXIT_USAGE;
        goto done;
    }
    if (cli_model_load(cmd, &m, path, &mp) != 0) goto done;
#ifdef SPARK_FULL_BUILD
    if (gbnf_path || schema_path) {
        int grc = cli_grammar_setup(&cg, m, gbnf_path, schema_path, sp);
        if (grc) {
            ret = grc;
            goto done;
        }
    }
#endif
    engine_session_params ssp = ENGINE_SESSION_PARAMS_INIT;
    ssp.n_ctx = (int32_t)n_ctx;
    if (engine_session_new(&s, m, &ssp) != 0) {
        cli_errorf(cmd, "%s", engine_error_last());
        goto done;
    }
    size_t n_ids = 0, cap = plen + 16;
    if (fim_arg) {
        size_t nctx = (size_t)engine_session_n_ctx(s);
        size_t gen = gp.max_tokens > 0 ? (size_t)gp.max_tokens : nctx / 4;
        int frc = fim_build(cmd, m, prompt, plen, fim_cut, nctx > gen ? nctx - gen : 0, &fp);
        if (frc) {
            ret = frc;
            goto done;
        }
        if (print_prompt) {
            printf("{\"prefix_tokens\":%zu,\"suffix_tokens\":%zu,\"prefix_cut\":%s,"
                   "\"suffix_cut\":%s,\"ids\":[", fp.n_prefix, fp.n_suffix,
                   fp.cut_prefix ? "true" : "false", fp.cut_suffix ? "true" : "false");
            for (size_t i = 0; i < fp.n; i++) printf("%s%d", i ? "," : "", fp.ids[i]);
            printf("]}\n");
            ret = CLI_EXIT_OK;
            goto done;
        }
        ids = fp.ids;
        fp.ids = NULL;
        n_ids = fp.n;
        gp.stop_tokens = fp.stop;
        gp.n_stop_tokens = fp.n_stop;
    } else if (!(ids = malloc(cap * sizeof *ids))) {
        cli_errorf(cmd, "out of memory for the prompt");
        goto done;
    } else if (engine_model_tokenize(m, prompt, plen, true, ids, cap, &n_ids) != 0) {
        cli_errorf(cmd, "%s", engine_error_last());
        goto done;
    }
    if (n_ids > (size_t)engine_session_n_ctx(s)) {
        cli_errorf(cmd, "the prompt has %zu tokens but the context holds %d (raise -c, up to "
                   "the model's trained context)", n_ids, engine_session_n_ctx(s));
        goto done;
    }
    gp.prompt = ids;
    gp.n_prompt = n_ids;
    out_state os = {false};
    engine_gen_stats st;
    int rc = engine_generate(s, &gp, on_text, &os, &st);
    if (rc && !(rc == ENGINE_ECANCELED && os.write_failed)) {
        cli_errorf(cmd, "%s", engine_error_last());
        goto done;
    }
    engine_model_info info;
    engine_model_info_get(m, &info);
    if (info.device == ENGINE_DEVICE_CUDA)
        fprintf(stderr, "\n\nspark-agent complete: %s (%s, %s), on cuda, seed %llu\n", path,
                info.arch, info.weight_type, (unsigned long long)sp->seed);
    else
        fprintf(stderr, "\n\nspark-agent complete: %s (%s, %s), on cpu with %d threads, seed %llu\n",
                path, info.arch, info.weight_type, info.n_threads, (unsigned long long)sp->seed);
    fprintf(stderr, "  prompt    %6d tokens (%d cached) in %8.1f ms  %8.1f tok/s\n",
            st.prompt_tokens, st.cached_tokens, st.prefill_ms,
            st.prefill_ms > 0 ? (st.prompt_tokens - st.cached_tokens) * 1e3 / st.prefill_ms : 0.0);
    fprintf(stderr, "  generated %6d tokens            in %8.1f ms  %8.1f tok/s (stop: %s)\n",
            st.generated_tokens, st.decode_ms, st.decode_ms > 0 ? st.decode_tokens * 1e3 / st.decode_ms : 0.0,
            stop_name(st.stop));
    if (gp.mtp_draft > 0) {
        fprintf(stderr, "  mtp k=%d   %6d verify steps, %d of %d drafts accepted (%.1f%%), "
                "%.2f tokens per step, %.1f tok/s emitted; by position:",
                gp.mtp_draft, st.spec_steps, st.spec_accepted, st.spec_drafted,
                st.spec_drafted ? 100.0 * st.spec_accepted / st.spec_drafted : 0.0,
                st.spec_steps ? (double)(st.spec_accepted + st.spec_steps) / st.spec_steps : 0.0,
                st.decode_ms > 0 ? st.generated_tokens * 1e3 / st.decode_ms : 0.0);
        for (int i = 0; i < gp.mtp_draft; i++)
            fprintf(stderr, " %d/%d", st.spec_accepted_at[i], st.spec_drafted_at[i]);
        fprintf(stderr, "\n");
    }
    ret = os.write_failed ? CLI_EXIT_FAIL : CLI_EXIT_OK;
done:
    free(fp.ids);
    free(ids);
    free(in);
    engine_session_free(s);
#ifdef SPARK_FULL_BUILD
    cli_grammar_free(&cg);
#endif
    engine_model_free(m);
    return ret;
}
