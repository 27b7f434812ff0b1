/* spark-agent bench: prefill and decode speed of the in-process engine, as llama-bench reports
 * them (pp = prompt processing, tg = text generation; mean ± sd over repetitions). */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "engine.h"

static void usage(FILE *f) {
    fprintf(f, "usage: spark-agent bench [-m FILE] [-p N_PROMPT] [-n N_GEN] [-t THREADS] "
               "[-r REPS] [-d DEPTH] [-B SEQS] [--kv f16|f32|q8_0]\n\n"
               "Measure prefill (pp) and decode (tg) speed as llama-bench does: a prompt of\n"
               "N_PROMPT tokens, and apart from it N_GEN tokens decoded one at a time after one\n"
               "token of context; mean ± sd over REPS runs (after one warm-up run). With -d,\n"
               "both run after DEPTH tokens of context (filled untimed, as llama-bench's -d).\n"
               "Prints a table and the peak resident memory; on the GPU also\n"
               "the card and driver (the device: config or SPARK_DEVICE), and a 'tg gen' row:\n"
               "the N_GEN tokens through the generation loop (greedy), every token drawn on the\n"
               "GPU and only ids crossing to the host, as `complete` and the agent run it.\n\n"
               "  -m, --model FILE   GGUF model (default: SPARK_MODEL, config, embedded tiny)\n"
               "  -p, --n-prompt N   prompt tokens (default 512; 0 skips pp)\n"
               "  -n, --n-gen N      generated tokens (default 128; 0 skips tg)\n"
               "  -t, --threads N    CPU threads (default: config, else all cores)\n"
               "  -r, --reps N       repetitions (default 3)\n"
               "  -b, --batch N      prompt tokens per forward batch (default 64; the GPU\n"
               "                     prefills in chunks of SPARK_CUDA_PREFILL_CHUNK, default 2048)\n"
               "  -d, --depth N      context tokens before each measurement (default 0)\n"
               "  -B, --seqs N       aggregate decode of N sequences at once through the\n"
               "                     scheduler instead (each: a distinct N_PROMPT-token prompt,\n"
               "                     then N_GEN tokens); t/s = all sequences' tokens per second\n"
               "                     once every one of them decodes. On the GPU the scheduler\n"
               "                     runs one session per request unless SPARK_SCHED_GPU_BATCH=1\n"
               "                     (one batched pass per step over a paged KV pool)\n"
               "  --kv TYPE          KV cache type f16, f32 or q8_0 (CPU only) (default:\n"
               "                     SPARK_KV_TYPE, the config's kv_type, else f16)\n");
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static double cpu_ms(void) { /* CPU time of every thread of the process */
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void mean_sd(const double *x, int n, double *mean, double *sd) {
    double s = 0, ss = 0;
    for (int i = 0; i < n; i++) s += x[i];
    *mean = s / n;
    for (int i = 0; i < n; i++) ss += (x[i] - *mean) * (x[i] - *mean);
    *sd = n > 1 ? sqrt(ss / (n - 1)) : 0.0;
}

static int argmax(const float *l, int32_t n) {
    int best = 0;
    for (int32_t i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    return best;
}

/* Current anonymous and file-backed resident memory in MiB (Linux /proc/self/status), or -1. */
static void rss_split(double *anon, double *file) {
    *anon = *file = -1;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char line[256];
    long kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "RssAnon: %ld kB", &kb) == 1) *anon = kb / 1024.0;
        if (sscanf(line, "RssFile: %ld kB", &kb) == 1) *file = kb / 1024.0;
    }
    fclose(f);
}

static void fmt_count(char *buf, size_t cap, double v) {
    if (v >= 1e9) snprintf(buf, cap, "%.2f B", v / 1e9);
    else if (v >= 1e6) snprintf(buf, cap, "%.2f M", v / 1e6);
    else snprintf(buf, cap, "%.0f", v);
}

/* -B: N requests through the scheduler; the decode window starts when the last of them has
 * its first token (every sequence decodes from then on) and ends at the last token. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    long n_seqs, pending, started, tokens, tokens_at_start;
    double t_all_started, t_last;
    int rc;
    char err[256];
} agg_run;

typedef struct {
    agg_run *a;
    bool first;
} agg_seq;

static int agg_on_token(void *user, const char *text, size_t len, int32_t token) {
    (void)text;
    (void)len;
    agg_seq *q = user;
    agg_run *a = q->a;
    if (token < 0) return 0;
    pthread_mutex_lock(&a->mu);
    a->tokens++;
    a->t_last = now_ms();
    if (!q->first) {
        q->first = true;
        if (++a->started == a->n_seqs) {
            a->t_all_started = a->t_last;
            a->tokens_at_start = a->tokens;
        }
    }
    pthread_mutex_unlock(&a->mu);
    return 0;
}

static void agg_on_done(void *user, uint64_t id, int rc, const engine_request_stats *st) {
    (void)id;
    (void)st;
    agg_run *a = ((agg_seq *)user)->a;
    pthread_mutex_lock(&a->mu);
    if (rc && !a->rc) {
        a->rc = rc;
        snprintf(a->err, sizeof a->err, "%s", engine_error_last());
    }
    a->pending--;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

/* One run of n_seqs requests on sched; *tps: aggregate decode tokens per second, *wall_tps: all
 * generated tokens over the whole wall time (prefill included). */
static int agg_once(engine_sched *sched, long n_seqs, const int32_t *prompts, long n_prompt,
                    long n_gen, double *tps, double *wall_tps, char *err, size_t err_cap) {
    agg_run a;
    memset(&a, 0, sizeof a);
    pthread_mutex_init(&a.mu, NULL);
    pthread_cond_init(&a.cv, NULL);
    a.n_seqs = n_seqs;
    agg_seq *seqs = calloc((size_t)n_seqs, sizeof *seqs);
    if (!seqs) {
        snprintf(err, err_cap, "out of memory");
        return -1;
    }
    double t0 = now_ms();
    int rc = 0;
    for (long i = 0; i < n_seqs; i++) {
        seqs[i].a = &a;
        engine_request r = {ENGINE_GEN_PARAMS_INIT, agg_on_token, agg_on_done, &seqs[i]};
        r.gen.prompt = prompts + i * n_prompt;
        r.gen.n_prompt = (size_t)n_prompt;
        r.gen.max_tokens = (int32_t)n_gen;
        r.gen.ignore_eog = true;
        r.gen.sampling.temperature = 0.0f;
        uint64_t id;
        pthread_mutex_lock(&a.mu);
        a.pending++;
        pthread_mutex_unlock(&a.mu);
        if ((rc = engine_sched_submit(sched, &r, &id)) != 0) {
            snprintf(err, err_cap, "%s", engine_error_last());
            pthread_mutex_lock(&a.mu);
            a.pending--;
            pthread_mutex_unlock(&a.mu);
            break;
        }
    }
    pthread_mutex_lock(&a.mu);
    while (a.pending > 0)
        pthread_cond_wait(&a.cv, &a.mu);
    pthread_mutex_unlock(&a.mu);
    double t1 = now_ms();
    if (!rc && a.rc) {
        rc = a.rc;
        snprintf(err, err_cap, "%s", a.err);
    }
    if (!rc && a.started < n_seqs) {
        rc = -1;
        snprintf(err, err_cap, "only %ld of %ld sequences generated a token", a.started, n_seqs);
    }
    if (!rc) {
        double win = a.t_last - a.t_all_started;
        long n = a.tokens - a.tokens_at_start;
        *tps = n > 0 && win > 0 ? n * 1e3 / win : 0.0;
        *wall_tps = a.tokens * 1e3 / (t1 - t0);
    }
    free(seqs);
    pthread_cond_destroy(&a.cv);
    pthread_mutex_destroy(&a.mu);
    return rc;
}

/* -B: the aggregate decode of n_seqs sequences, warm-up then reps runs. */
static int bench_seqs(const char *cmd, engine_model *m, const engine_model_info *info,
                      long n_seqs, long n_prompt, long n_gen, long reps) {
    int ret = CLI_EXIT_FAIL;
    engine_sched *sched = NULL;
    int32_t *prompts = malloc(sizeof(int32_t) * (size_t)(n_seqs * n_prompt));
    double *tps = calloc((size_t)reps, sizeof *tps), *wall = calloc((size_t)reps, sizeof *wall);
    char err[256];
    if (!prompts || !tps || !wall) {
        cli_errorf(cmd, "out of memory");
        goto done;
    }
    engine_sched_params sp = ENGINE_SCHED_PARAMS_INIT;
    sp.max_seqs = (int32_t)n_seqs;
    sp.n_ctx = (int32_t)(n_prompt + n_gen + 1);
    sp.prefill_chunk = 512;
    if (engine_sched_new(&sched, m, &sp) != 0) {
        cli_errorf(cmd, "%s", engine_error_last());
        goto done;
    }
    int32_t nv = engine_model_n_vocab(m), range = nv > 151643 ? 151643 : nv;
    for (long r = -1; r < reps; r++) { /* r = -1: warm-up */
        /* distinct prompts per run and sequence (no prefix reuse between them) */
        uint64_t x = 0x9e3779b97f4a7c15ull + (uint64_t)(r + 1) * 0x2545f4914f6cdd1dull;
        for (long i = 0; i < n_seqs * n_prompt; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            prompts[i] = (int32_t)((x >> 33) % (uint64_t)range);
        }
        double t = 0, w = 0;
        if (agg_once(sched, n_seqs, prompts, n_prompt, n_gen, &t, &w, err, sizeof err) != 0) {
            cli_errorf(cmd, "%s", err);
            goto done;
        }
        if (r >= 0) {
            tps[r] = t;
            wall[r] = w;
        }
    }
    engine_sched_stats st;
    engine_sched_stats_get(sched, &st);
    double mean, sd, wmean, wsd;
    mean_sd(tps, (int)reps, &mean, &sd);
    mean_sd(wall, (int)reps, &wmean, &wsd);
    char params[32], desc[192], test[48], ts[32], size[16];
    fmt_count(params, sizeof params, (double)info->n_params);
    snprintf(desc, sizeof desc, "%s %s %s", info->name[0] ? info->name : info->arch, info->arch,
             info->weight_type);
    snprintf(test, sizeof test, "tg%ld x%ld", n_gen, n_seqs);
    snprintf(ts, sizeof ts, "%.2f ± %.2f", mean, sd);
    snprintf(size, sizeof size, "%.2f MiB", info->file_size / (1024.0 * 1024.0));
    printf("| %-36s | %10s | %10s | %-7s | %12s | %18s | %13s | %14s |\n", "model", "size",
           "params", "backend", "test", "aggregate t/s", "t/s per seq", "t/s incl. pp");
    printf("| %.36s | %.10s | %.10s | %.7s | %.12s | %.18s | %.13s | %.14s |\n",
           "------------------------------------", "----------", "----------", "-------",
           "------------", "------------------", "-------------", "--------------");
    printf("| %-36.36s | %10s | %10s | %-7s | %12s | %20s | %13.2f | %14.2f |\n", desc, size,
           params, engine_device_name(info->device), test, ts, mean / (double)n_seqs, wmean);
    const char *gb = getenv("SPARK_SCHED_GPU_BATCH");
    printf("\n%ld sequences of a %ld-token prompt then %ld tokens (greedy, end-of-generation "
           "ignored), %ld reps after a warm-up; aggregate t/s: tokens of all sequences per "
           "second once every one decodes; %llu scheduler steps in all\n", n_seqs, n_prompt,
           n_gen, reps, (unsigned long long)st.steps);
    if (info->device == ENGINE_DEVICE_CUDA)
        printf("GPU scheduler: %s\n", gb && !strcmp(gb, "1")
                   ? "one batched pass per step over a paged KV pool (SPARK_SCHED_GPU_BATCH=1)"
                   : "one session per request, batch-1 (SPARK_SCHED_GPU_BATCH=1 selects the "
                     "batched pass)");
    ret = CLI_EXIT_OK;
done:
    engine_sched_free(sched);
    free(prompts);
    free(tps);
    free(wall);
    return ret;
}

int cli_bench(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},   {"n-prompt", required_argument, 0, 'p'},
        {"n-gen", required_argument, 0, 'n'},   {"threads", required_argument, 0, 't'},
        {"reps", required_argument, 0, 'r'},    {"batch", required_argument, 0, 'b'},
        {"kv", required_argument, 0, 'k'},      {"depth", required_argument, 0, 'd'},
        {"seqs", required_argument, 0, 'B'},    {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *cmd = "bench", *model_flag = NULL;
    long n_prompt = 512, n_gen = 128, threads = -1, reps = 3, batch = 64, depth = 0, n_seqs = 0;
    engine_kv_type kv = ENGINE_KV_F16;
    const char *kv_flag = NULL;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":m:p:n:t:r:b:d:B:h", opts, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case 'm': model_flag = optarg; break;
        case 'p': ok = cli_parse_long(optarg, 0, 1 << 20, &n_prompt); break;
        case 'n': ok = cli_parse_long(optarg, 0, 1 << 20, &n_gen); break;
        case 't': ok = cli_parse_long(optarg, 1, 1024, &threads); break;
        case 'r': ok = cli_parse_long(optarg, 1, 1000, &reps); break;
        case 'b': ok = cli_parse_long(optarg, 1, 8192, &batch); break;
        case 'd': ok = cli_parse_long(optarg, 0, 1 << 20, &depth); break;
        case 'B': ok = cli_parse_long(optarg, 1, 1024, &n_seqs); break;
        case 'k':
            kv_flag = optarg;
            ok = engine_kv_type_parse(optarg) >= 0;
            break;
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
    if (optind < argc) {
        cli_errorf(cmd, "unexpected argument '%s'", argv[optind]);
        return CLI_EXIT_USAGE;
    }
    if (n_seqs > 0 && (n_prompt < 1 || n_gen < 2 || depth > 0)) {
        cli_errorf(cmd, "-B needs -p >= 1 and -n >= 2, and no -d");
        return CLI_EXIT_USAGE;
    }
    if (n_prompt == 0 && n_gen == 0) {
        cli_errorf(cmd, "nothing to measure: -p and -n are both 0");
        return CLI_EXIT_USAGE;
    }
    cli_config cfg;
    if (cli_config_load(&cfg) != 0) {
        cli_errorf(cmd, "%s", cfg.error);
        return CLI_EXIT_USAGE;
    }
    char path[4096];
    if (cli_model_resolve(cmd, model_flag, &cfg, path, sizeof path) != 0) return CLI_EXIT_FAIL;

    int ret = CLI_EXIT_FAIL;
    engine_model *m = NULL;
    engine_session *s = NULL;
    int32_t *prompt = NULL;
    double *pp = NULL, *tg = NULL, *pp_cpu = NULL, *tg_cpu = NULL, *gen = NULL, *gen_cpu = NULL;
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.n_threads = threads > 0 ? (int)threads : cfg.threads;
    mp.device = (engine_device)engine_device_parse(cfg.device);
    if (cli_kv_type_plan(cmd, kv_flag, &cfg, &mp)) {
        ret = CLI_EXIT_USAGE;
        goto done;
    }
    kv = mp.kv_type;
    if (engine_model_load(&m, path, &mp) != 0) {
        cli_errorf(cmd, "%s", engine_error_last());
        goto done;
    }
    engine_model_info info;
    engine_model_info_get(m, &info);
    /* -B: each sequence's prompt, then its tokens; else pp and tg apart, after DEPTH */
    long need = n_seqs > 0                ? n_prompt + n_gen + 1
                : n_prompt > n_gen + 1 ? depth + n_prompt
                                       : depth + n_gen + 1;
    if (need > info.n_ctx_train) {
        cli_errorf(cmd,
                   "-d %ld -p %ld -n %ld need %ld positions, more than the model's context of %d",
                   depth, n_prompt, n_gen, need, info.n_ctx_train);
        ret = CLI_EXIT_USAGE;
        goto done;
    }
    if (n_seqs > 0) {
        ret = bench_seqs(cmd, m, &info, n_seqs, n_prompt, n_gen, reps);
        goto done;
    }
    engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
    sp.n_ctx = (int32_t)need;
    sp.n_batch = (int32_t)batch;
    sp.kv_type = kv;
    if (engine_session_new(&s, m, &sp) != 0) {
        cli_errorf(cmd, "%s", engine_error_last());
        goto done;
    }
    prompt = malloc(sizeof(int32_t) * (size_t)(depth + n_prompt + 1));
    pp = calloc((size_t)reps, sizeof *pp);
    tg = calloc((size_t)reps, sizeof *tg);
    pp_cpu = calloc((size_t)reps, sizeof *pp_cpu);
    tg_cpu = calloc((size_t)reps, sizeof *tg_cpu);
    gen = calloc((size_t)reps, sizeof *gen);
    gen_cpu = calloc((size_t)reps, sizeof *gen_cpu);
    if (!prompt || !pp || !tg || !pp_cpu || !tg_cpu || !gen || !gen_cpu) {
        cli_errorf(cmd, "out of memory");
        goto done;
    }
    /* a fixed pseudo-random prompt over the ordinary vocabulary (ids below 151643 for Qwen) */
    uint64_t x = 0x9e3779b97f4a7c15ull;
    int32_t nv = engine_model_n_vocab(m), range = nv > 151643 ? 151643 : nv;
    for (long i = 0; i <= depth + n_prompt; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((x >> 33) % (uint64_t)range);
    }
    const bool gen_row = info.device == ENGINE_DEVICE_CUDA && n_gen > 0;
    for (long r = -1; r < reps; r++) { /* r = -1: warm-up (page in the weights) */
        engine_session_truncate(s, 0);
        if (depth > 0 && engine_session_append(s, prompt, (size_t)depth, NULL) != 0) {
            cli_errorf(cmd, "%s", engine_error_last());
            goto done;
        }
        double c0 = cpu_ms(), t0 = now_ms();
        if (n_prompt > 0 && engine_session_append(s, prompt + depth, (size_t)n_prompt, NULL) != 0) {
            cli_errorf(cmd, "%s", engine_error_last());
            goto done;
        }
        double c1 = cpu_ms(), t1 = now_ms();
        /* tg as llama-bench measures it: from DEPTH tokens of context, not after the prompt (one
         * token appended untimed, to decode after) */
        if (n_gen > 0) {
            if (engine_session_truncate(s, (int32_t)depth) != 0 ||
                engine_session_append(s, prompt + depth, 1, NULL) != 0) {
                cli_errorf(cmd, "%s", engine_error_last());
                goto done;
            }
        }
        const double c1g = cpu_ms(), t1g = now_ms();
        for (long i = 0; i < n_gen; i++) {
            int32_t tok = argmax(engine_session_logits(s), nv);
            if (engine_session_append(s, &tok, 1, NULL) != 0) {
                cli_errorf(cmd, "%s", engine_error_last());
                goto done;
            }
        }
        double c2 = cpu_ms(), t2 = now_ms();
        /* on the GPU also the generation loop (engine_generate, greedy): the tokens drawn on the
         * GPU, only ids crossing to the host; its decode time and tokens from its stats */
        engine_gen_stats gs;
        memset(&gs, 0, sizeof gs);
        if (gen_row) {
            engine_gen_params gp = ENGINE_GEN_PARAMS_INIT;
            gp.prompt = prompt;
            gp.n_prompt = (size_t)(depth + 1);
            gp.max_tokens = (int32_t)n_gen;
            gp.sampling.temperature = 0.0f;
            gp.ignore_eog = true;
            if (engine_generate(s, &gp, NULL, NULL, &gs) != 0) {
                cli_errorf(cmd, "%s", engine_error_last());
                goto done;
            }
        }
        double c3 = cpu_ms();
        if (r >= 0 && gen_row) {
            gen[r] = gs.decode_ms > 0 ? gs.decode_tokens * 1e3 / gs.decode_ms : 0.0;
            gen_cpu[r] = c3 > c2 ? gs.decode_tokens * 1e3 / (c3 - c2) : 0.0;
        }
        if (r >= 0) {
            pp[r] = n_prompt > 0 ? n_prompt * 1e3 / (t1 - t0) : 0.0;
            tg[r] = n_gen > 0 ? n_gen * 1e3 / (t2 - t1g) : 0.0;
            pp_cpu[r] = n_prompt > 0 ? n_prompt * 1e3 / (c1 - c0) : 0.0;
            tg_cpu[r] = n_gen > 0 ? n_gen * 1e3 / (c2 - c1g) : 0.0;
        }
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double rss_mib = ru.ru_maxrss / 1024.0, file_mib = info.file_size / (1024.0 * 1024.0);
    char params[32], desc[192];
    fmt_count(params, sizeof params, (double)info.n_params);
    snprintf(desc, sizeof desc, "%s %s %s", info.name[0] ? info.name : info.arch, info.arch,
             info.weight_type);
    printf("| %-36s | %10s | %10s | %-7s | %7s | %10s | %18s | %11s |\n", "model", "size",
           "params", "backend", "threads", "test", "t/s", "t/CPU-s");
    printf("| %.36s | %.10s | %.10s | %.7s | %.7s | %.10s | %.18s | %.11s |\n",
           "------------------------------------", "----------", "----------", "-------",
           "-------", "----------", "------------------", "-----------");
    for (int k = 0; k < 3; k++) {
        long n = k == 0 ? n_prompt : n_gen;
        if (n == 0 || (k == 2 && !gen_row)) continue;
        double mean, sd, cmean, csd;
        mean_sd(k == 0 ? pp : k == 1 ? tg : gen, (int)reps, &mean, &sd);
        mean_sd(k == 0 ? pp_cpu : k == 1 ? tg_cpu : gen_cpu, (int)reps, &cmean, &csd);
        char test[48], ts[32], size[16];
        const char *kind = k == 0 ? "pp" : "tg", *tail = k == 2 ? " gen" : "";
        if (depth > 0)
            snprintf(test, sizeof test, "%s%ld@d%ld%s", kind, n, depth, tail);
        else
            snprintf(test, sizeof test, "%s%ld%s", kind, n, tail);
        snprintf(ts, sizeof ts, "%.2f ± %.2f", mean, sd);
        snprintf(size, sizeof size, "%.2f MiB", file_mib);
        printf("| %-36.36s | %10s | %10s | %-7s | %7d | %10s | %20s | %11.2f |\n", desc, size,
               params, engine_device_name(info.device), info.n_threads, test, ts, cmean);
    }
    if (info.device == ENGINE_DEVICE_CUDA) {
        engine_gpu_info gi;
        if (engine_gpu_info_get(&gi) == 0 && gi.n_devices > 0)
            printf("\nGPU: %s (sm_%d%d, %.1f GB), driver %d, runtime %d; prompts in chunks of "
                   "SPARK_CUDA_PREFILL_CHUNK tokens (default 2048)\n", gi.devices[0].name,
                   gi.devices[0].major, gi.devices[0].minor, gi.devices[0].total_mem / 1e9,
                   gi.driver_version, gi.runtime_version);
    }
    double anon, mapped;
    rss_split(&anon, &mapped);
    if (gen_row)
        printf("\ntg: a token at a time through engine_session_append, its logits copied to the "
               "host (llama-bench's tg); tg gen: engine_generate (greedy), every token drawn on "
               "the GPU with the steps queued ahead of the host, only token ids crossing (what "
               "`spark-agent complete` and the agent get).\n");
    printf("\nt/CPU-s: tokens per second of process CPU time (all threads): the speed without "
           "other load on the machine when threads = 1; spinning waits count against it.\n");
    printf("peak RSS %.1f MiB for a model file of %.1f MiB; now %.1f MiB anonymous (KV cache, "
           "buffers) + %.1f MiB of mapped file pages (the weights are used in place, never "
           "copied); KV cache %s, batch %ld, %ld reps\n", rss_mib, file_mib, anon, mapped,
           engine_kv_type_name(kv), batch, reps);
    ret = CLI_EXIT_OK;
done:
    free(prompt);
    free(pp);
    free(tg);
    free(pp_cpu);
    free(tg_cpu);
    free(gen);
    free(gen_cpu);
    engine_session_free(s);
    engine_model_free(m);
    return ret;
}
