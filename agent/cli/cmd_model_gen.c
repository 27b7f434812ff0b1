/* spark-agent model gen: write a deterministic random-weight model (engine_model_gen). */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"

typedef struct {
    bool list;          /* print each tensor (dry run) */
    bool progress;      /* stderr is a terminal: show a progress line */
    bool progress_shown;
    uint64_t n_tensors;
    uint64_t bytes;
} gen_report;

static void on_progress(void *user, uint64_t done, uint64_t total) {
    gen_report *r = user;
    if (!r->progress || !total) return;
    fprintf(stderr, "\rspark-agent model gen: %3d%% of %.2f GB", (int)(100.0 * done / total),
            total / 1e9);
    r->progress_shown = true;
}

static void on_tensor(void *user, const engine_model_gen_tensor *t) {
    gen_report *r = user;
    r->n_tensors++;
    r->bytes += t->nbytes;
    if (!r->list) return;
    char shape[96];
    int n = 0;
    for (int i = 0; i < t->n_dims; i++)
        n += snprintf(shape + n, sizeof shape - (size_t)n, "%s%" PRId64, i ? ", " : "{", t->ne[i]);
    snprintf(shape + n, sizeof shape - (size_t)n, "}");
    printf("%-36s %-5s %-26s %" PRIu64 "\n", t->name, t->type, shape, t->nbytes);
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: spark-agent model gen --preset NAME [--type T] [-s SEED] -o FILE\n"
            "                             [--safetensors DIR] [--tokenizer-dir DIR] [-t N]\n"
            "                             [--layers N]\n"
            "       spark-agent model gen --preset NAME [--type T] --dry-run\n"
            "       spark-agent model gen --list-presets\n\n"
            "Write a model with deterministic random weights (the seed fixes every byte, for any\n"
            "thread count), the exact tensor names and metadata of a converted GGUF, and the\n"
            "real Qwen3 tokenizer.\n\n"
            "  --preset NAME        model shape (--list-presets; default tiny)\n"
            "  --type T             %s (default f32)\n"
            "  -s, --seed N         seed (default 0)\n"
            "  -o, --output FILE    the GGUF file to write\n"
            "  --safetensors DIR    also write the same weights (F32) as Hugging Face\n"
            "                       safetensors + config.json + tokenizer files into DIR\n"
            "  --tokenizer-dir DIR  where tokenizer.json and tokenizer_config.json are\n"
            "                       (default: the copy embedded in this build%s)\n"
            "  -t, --threads N      threads (default: all cores)\n"
            "  --layers N           only N blocks of the preset's shape (quick per-layer timing)\n"
            "  --dry-run            list the tensors (name, type, ggml shape, bytes), write nothing\n",
            engine_model_gen_types(),
            engine_model_gen_tokenizer_embedded() ? "" : "; this build has none");
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int cli_model_gen(int argc, char **argv) {
    enum { OPT_PRESET = 256, OPT_TYPE, OPT_ST, OPT_TOKDIR, OPT_DRY, OPT_LIST, OPT_LAYERS };
    static const struct option opts[] = {
        {"preset", required_argument, 0, OPT_PRESET},
        {"type", required_argument, 0, OPT_TYPE},
        {"seed", required_argument, 0, 's'},
        {"output", required_argument, 0, 'o'},
        {"safetensors", required_argument, 0, OPT_ST},
        {"tokenizer-dir", required_argument, 0, OPT_TOKDIR},
        {"threads", required_argument, 0, 't'},
        {"dry-run", no_argument, 0, OPT_DRY},
        {"list-presets", no_argument, 0, OPT_LIST},
        {"layers", required_argument, 0, OPT_LAYERS},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    engine_model_gen_params p;
    engine_model_gen_params_init(&p);
    bool list_presets = false;
    uint64_t v;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":s:o:t:h", opts, NULL)) != -1) {
        switch (c) {
        case OPT_PRESET: p.preset = optarg; break;
        case OPT_TYPE: p.type = optarg; break;
        case OPT_ST: p.safetensors_dir = optarg; break;
        case OPT_TOKDIR: p.tokenizer_dir = optarg; break;
        case OPT_DRY: p.dry_run = true; break;
        case OPT_LIST: list_presets = true; break;
        case 'o': p.out_path = optarg; break;
        case 's':
            if (!cli_parse_u64(optarg, &p.seed)) {
                cli_errorf("model gen", "bad seed '%s' (a non-negative integer)", optarg);
                return CLI_EXIT_USAGE;
            }
            break;
        case 't':
            if (!cli_parse_u64(optarg, &v) || v < 1 || v > 1024) {
                cli_errorf("model gen", "bad thread count '%s' (1..1024)", optarg);
                return CLI_EXIT_USAGE;
            }
            p.n_threads = (int)v;
            break;
        case OPT_LAYERS:
            if (!cli_parse_u64(optarg, &v) || v < 1 || v > 4096) {
                cli_errorf("model gen", "bad layer count '%s' (1..4096)", optarg);
                return CLI_EXIT_USAGE;
            }
            p.n_layer = (uint32_t)v;
            break;
        case 'h': usage(stdout); return CLI_EXIT_OK;
        case ':':
            cli_errorf("model gen", "option %s needs a value", argv[optind - 1]);
            return CLI_EXIT_USAGE;
        default:
            cli_errorf("model gen", "unknown option '%s'", argv[optind - 1]);
            usage(stderr);
            return CLI_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        cli_errorf("model gen", "unexpected argument '%s'", argv[optind]);
        return CLI_EXIT_USAGE;
    }
    if (list_presets) {
        for (size_t i = 0; i < engine_model_gen_preset_count(); i++) {
            const char *desc;
            const char *name = engine_model_gen_preset(i, &desc);
            printf("%-14s %s\n", name, desc);
        }
        return CLI_EXIT_OK;
    }
    if (!p.dry_run && !p.out_path) {
        cli_errorf("model gen", "no output file: give -o FILE (or --dry-run)");
        return CLI_EXIT_USAGE;
    }

    gen_report rep = {.list = p.dry_run, .progress = isatty(STDERR_FILENO) == 1};
    p.on_tensor = on_tensor;
    p.on_progress = on_progress;
    p.user = &rep;
    double t0 = now_s();
    int rc = engine_model_gen(&p);
    double dt = now_s() - t0;
    if (rep.progress_shown) fputc('\n', stderr);
    if (rc) {
        cli_errorf("model gen", "%s", engine_error_last());
        return rc == ENGINE_EINVAL ? CLI_EXIT_USAGE : CLI_EXIT_FAIL;
    }
    if (p.dry_run) {
        printf("%" PRIu64 " tensors, %" PRIu64 " bytes of tensor data\n", rep.n_tensors,
               rep.bytes);
        return CLI_EXIT_OK;
    }
    fprintf(stderr, "spark-agent model gen: wrote %s (%s, %s, seed %" PRIu64 ", %" PRIu64
                    " tensors, %.2f GB of weights) in %.1f s%s%s\n",
            p.out_path, p.preset, p.type, p.seed, rep.n_tensors, rep.bytes / 1e9, dt,
            p.safetensors_dir ? "; safetensors in " : "",
            p.safetensors_dir ? p.safetensors_dir : "");
    return CLI_EXIT_OK;
}
