/* Model loading for the commands, with a progress bar on a terminal: the file is read ahead
 * into the page cache with a bar (the engine maps it, so this is most of a cold load), then
 * engine_model_load runs on a helper thread while an elapsed-time line is kept up to date
 * (weights repacked or uploaded to the GPU). Engine-only: no module beyond the engine. */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"

#define CLI_PROGRESS_MIN_BYTES ((uint64_t)256 << 20)
#define CHUNK ((size_t)16 << 20)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Bytes of memory the kernel says are available (MemAvailable), or 0 when unknown. */
static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static void bar(const char *name, uint64_t done, uint64_t total, double t0) {
    const int width = 30;
    double f = total ? (double)done / (double)total : 1.0;
    int fill = (int)(f * width);
    char b[64];
    for (int i = 0; i < width; i++) b[i] = i < fill ? '=' : i == fill ? '>' : ' ';
    b[width] = 0;
    double dt = now_s() - t0;
    fprintf(stderr, "\rloading %s [%s] %3d%%  %.1f/%.1f GiB  %.2f GiB/s\033[K", name, b,
            (int)(f * 100), (double)done / (1 << 30), (double)total / (1 << 30),
            dt > 0 ? (double)done / (1 << 30) / dt : 0.0);
    fflush(stderr);
}

typedef struct {
    const char *path;
    const engine_model_params *mp;
    engine_model *model;
    int rc;
    char err[1024];
    int done; /* atomic */
} load_job;

static void *load_thread(void *p) {
    load_job *j = p;
    j->rc = engine_model_load(&j->model, j->path, j->mp);
    if (j->rc) snprintf(j->err, sizeof j->err, "%s", engine_error_last());
    __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

int cli_model_load(const char *cmd, engine_model **out, const char *path,
                   const engine_model_params *mp) {
    *out = NULL;
    const char *mode = getenv("SPARK_PROGRESS");
    bool show = isatty(2);
    if (mode && !strcmp(mode, "never")) show = false;
    struct stat st;
    uint64_t size = stat(path, &st) == 0 && S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
    if (!(mode && !strcmp(mode, "always")) && size < CLI_PROGRESS_MIN_BYTES) show = false;
    if (!show) {
        int rc = engine_model_load(out, path, mp);
        if (rc) cli_errorf(cmd, "%s", engine_error_last());
        return rc;
    }
    const char *name = base_name(path);
    double t0 = now_s();
    /* read ahead into the page cache when it fits; a file larger than the available memory
     * would only evict itself */
    uint64_t avail = mem_available();
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0 && size && (avail == 0 || size < avail / 10 * 9)) {
        double last = 0;
        for (uint64_t off = 0; off < size;) {
            size_t n = size - off < CHUNK ? (size_t)(size - off) : CHUNK;
            if (readahead(fd, (off64_t)off, n) != 0) break; /* not supported here: skip */
            off += n;
            double t = now_s();
            if (t - last > 0.1 || off == size) {
                bar(name, off, size, t0);
                last = t;
            }
        }
    }
    if (fd >= 0) close(fd);
    /* the engine's own work (parsing, repacking, a GPU upload) with a running clock */
    load_job j = {.path = path, .mp = mp};
    pthread_t th;
    int rc;
    if (pthread_create(&th, NULL, load_thread, &j) != 0) {
        load_thread(&j);
    } else {
        while (!__atomic_load_n(&j.done, __ATOMIC_ACQUIRE)) {
            struct timespec ts = {0, 100 * 1000 * 1000};
            nanosleep(&ts, NULL);
            if (!__atomic_load_n(&j.done, __ATOMIC_ACQUIRE)) {
                fprintf(stderr, "\rloading %s: preparing the weights %.1f s\033[K", name,
                        now_s() - t0);
                fflush(stderr);
            }
        }
        pthread_join(th, NULL);
    }
    rc = j.rc;
    if (rc) {
        fprintf(stderr, "\r\033[K");
        cli_errorf(cmd, "%s", j.err);
        return rc;
    }
    fprintf(stderr, "\rloaded %s (%.1f GiB) in %.1f s\033[K\n", name,
            (double)size / (1 << 30), now_s() - t0);
    *out = j.model;
    return 0;
}

/* Positions per KV block of the engine's paged pool (engine.h: engine_prefix_*, B = 16). */
#define CLI_KV_BLOCK 16

int cli_kv_type_plan(const char *cmd, const char *flag, const cli_config *cfg,
                     engine_model_params *mp) {
    int t = flag ? engine_kv_type_parse(flag) : cfg->kv_type;
    if (t < 0) {
        cli_errorf(cmd, "--kv %s: expected f16, f32 or q8_0", flag);
        return -1;
    }
    mp->kv_type = (engine_kv_type)t;
    return 0;
}

int cli_kv_cache_plan(const char *cmd, const char *flag, const cli_config *cfg, const char *path,
                      int32_t n_ctx, engine_model_params *mp, bool log) {
    long mib = cfg->kv_cache_mib;
    const char *src = cfg->kv_cache_source;
    if (flag) {
        if (!cli_parse_kv_cache(flag, &mib)) {
            cli_errorf(cmd, "--kv-cache %s: expected auto or a size in MiB (0: off)", flag);
            return -1;
        }
        src = "--kv-cache";
    }
    mp->prefix_cache_bytes = 0;
    if (mib >= 0) {
        mp->prefix_cache_bytes = (size_t)mib << 20;
        if (log && mib)
            fprintf(stderr, "spark-agent %s: kv cache %ld MiB (%s), %s KV\n", cmd, mib, src,
                    engine_kv_type_name(mp->kv_type));
        else if (log) fprintf(stderr, "spark-agent %s: kv cache off (%s)\n", cmd, src);
        return 0;
    }
    /* auto: the engine has no prefix cache on the GPU yet */
    engine_gpu_info gi;
    if (mp->device == ENGINE_DEVICE_CUDA ||
        (mp->device == ENGINE_DEVICE_AUTO && engine_cuda_built() && engine_gpu_info_get(&gi) == 0 &&
         gi.n_devices > 0)) {
        if (log) fprintf(stderr, "spark-agent %s: kv cache off (auto: none on the GPU yet)\n", cmd);
        return 0;
    }
    /* the model's shape without its weights; a file that cannot be read is reported by the
     * real load that follows */
    engine_model_params vp = ENGINE_MODEL_PARAMS_INIT;
    vp.vocab_only = true;
    vp.n_ctx = mp->n_ctx;
    engine_model *vm = NULL;
    if (engine_model_load(&vm, path, &vp)) return 0;
    engine_model_info in;
    engine_model_info_get(vm, &in);
    engine_model_free(vm);
    if (in.n_layer <= 0 || in.n_head_kv <= 0 || in.head_dim <= 0) {
        if (log)
            fprintf(stderr, "spark-agent %s: kv cache off (auto: %s reports no KV shape)\n",
                    cmd, in.arch);
        return 0;
    }
    /* K and V, every layer, of the KV type (Q8_0: 34 bytes per 32 values). For qwen35moe
     * (a quarter of the layers have KV) the engine gives half of the pool to snapshots of the
     * recurrent state: counting every layer leaves it room for the positions and for them. */
    uint64_t per_value = mp->kv_type == ENGINE_KV_F32    ? 64
                         : mp->kv_type == ENGINE_KV_Q8_0 ? 17
                                                         : 32; /* sixteenths of a byte */
    uint64_t per_token = 2ull * (uint64_t)in.n_layer * (uint64_t)in.n_head_kv *
                         (uint64_t)in.head_dim * per_value / 16;
    /* a vocabulary-only model reports no session context: the engine's default then,
     * min(trained, 4096) (engine_model_params.n_ctx) */
    int64_t pos = n_ctx > 0 ? n_ctx : in.n_ctx > 0 ? in.n_ctx : in.n_ctx_train;
    if (n_ctx <= 0 && in.n_ctx <= 0 && (pos <= 0 || pos > 4096)) pos = 4096;
    uint64_t blocks = (uint64_t)(pos + CLI_KV_BLOCK - 1) / CLI_KV_BLOCK + 2;
    mp->prefix_cache_bytes = (size_t)(blocks * CLI_KV_BLOCK * per_token);
    if (log)
        fprintf(stderr, "spark-agent %s: kv cache %.1f MiB (auto: %lld positions + 2 blocks x "
                "%.1f KiB per token of %s KV)\n", cmd, (double)mp->prefix_cache_bytes / (1 << 20),
                (long long)pos, (double)per_token / 1024, engine_kv_type_name(mp->kv_type));
    return 0;
}
