/*
 * engine.h - the one public door of spark-agent's inference engine.
 *
 * The engine loads model files (GGUF), tokenizes, runs the forward pass on the CPU or a CUDA GPU,
 * samples, and reports what the machine it runs on can do. It knows nothing of tools, agents or
 * JSON. It depends on libc, pthreads, libm and (optionally) CUDA only, so that it builds on the
 * GPU machine with nothing else installed (CMake option SPARK_ENGINE_ONLY).
 *
 * Conventions (shared by every module of the project):
 *   - Functions return int: 0 on success or a negative ENGINE_E* code. The detail of the last
 *     error of the calling thread is in engine_error_last(); it stays valid until the next
 *     engine call on the same thread fails.
 *   - x_new/x_free pairs; x_free(NULL) is a no-op. Out-parameters come first.
 *   - The engine never prints and never exits. Diagnostics go through engine_log(), whose sink
 *     the application installs (default: stderr, level INFO).
 *   - Unless a function says otherwise it is thread-safe with respect to distinct objects.
 */
#ifndef SPARK_ENGINE_H
#define SPARK_ENGINE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------- */
enum {
    ENGINE_OK = 0,
    ENGINE_EINVAL = -1,      /* bad argument from the caller */
    ENGINE_ENOMEM = -2,      /* out of host or device memory */
    ENGINE_EIO = -3,         /* file could not be opened, read, mapped or written */
    ENGINE_EFORMAT = -4,     /* malformed or hostile model file */
    ENGINE_EUNSUPPORTED = -5,/* valid input we do not support (architecture, tensor type, ...) */
    ENGINE_ENODEV = -6,      /* a requested device (GPU) is not available */
    ENGINE_ECANCELED = -7,   /* stopped by the caller's cancellation */
    ENGINE_ERANGE = -8,      /* a size limit was exceeded (context length, token count, ...) */
    ENGINE_EINTERNAL = -9,   /* a bug; the message says where */
};

/* The message describing the calling thread's last error ("" if none). Borrowed; valid until
 * the next failing engine call on this thread. */
const char *engine_error_last(void);

/* Short name of an error code ("EFORMAT"). Static string. */
const char *engine_error_name(int code);

/* ---------------------------------------------------------------------------------------------
 * Logging
 * ------------------------------------------------------------------------------------------- */
typedef enum {
    ENGINE_LOG_DEBUG = 0,
    ENGINE_LOG_INFO = 1,
    ENGINE_LOG_WARN = 2,
    ENGINE_LOG_ERROR = 3,
    ENGINE_LOG_NONE = 4,
} engine_log_level;

/* A log sink. `msg` is one complete line without the trailing newline. Called from any thread;
 * the sink must be thread-safe. */
typedef void (*engine_log_fn)(engine_log_level level, const char *msg, void *user);

/* Install a sink (NULL restores the default stderr sink) and the minimum level it receives.
 * The process-wide sink is the one piece of shared state in the engine; set it once at start. */
void engine_log_set(engine_log_fn fn, void *user, engine_log_level min_level);

/* Log a printf-style message through the installed sink. */
void engine_log(engine_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void engine_logv(engine_log_level level, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

/* ---------------------------------------------------------------------------------------------
 * Build and machine facts (what `spark-agent version` and `doctor` report)
 * ------------------------------------------------------------------------------------------- */

/* Version string of the engine library, e.g. "0.1.0". Static. */
const char *engine_version(void);

/* One line describing how the engine was built: compiler, build type, CUDA on/off and
 * architectures. Static. */
const char *engine_build_info(void);

/* True when the CUDA backend was compiled into this build. */
bool engine_cuda_built(void);

typedef struct {
    char arch[16];          /* "x86_64", "aarch64", ... */
    char model_name[128];   /* from /proc/cpuinfo where available, else "" */
    int n_logical;          /* online logical CPUs */
    bool sse42, avx, avx2, fma, f16c, avx512f, avx512bw, avx512vnni, avx_vnni;
    bool neon, dotprod, i8mm, sve; /* arm64 */
} engine_cpu_info;

/* Detect the running CPU's features (not the compiler's). Never fails. */
void engine_cpu_info_get(engine_cpu_info *out);

/* The SIMD path the CPU kernels chose at run time: "avx2", "neon", "scalar", ... Static. */
const char *engine_cpu_simd_path(void);

typedef struct {
    char name[256];
    int major, minor;       /* compute capability */
    size_t total_mem;       /* bytes */
    size_t free_mem;        /* bytes, at the time of the query */
    int multiprocessors;
    int mem_bus_width_bits;
    int mem_clock_khz;      /* 0 when the runtime does not report it */
} engine_gpu_device;

#define ENGINE_MAX_GPUS 16

typedef struct {
    bool backend_built;     /* engine_cuda_built() */
    int driver_version;     /* e.g. 13000; 0 when no driver */
    int runtime_version;    /* e.g. 13000; 0 when not built */
    int n_devices;
    engine_gpu_device devices[ENGINE_MAX_GPUS];
    char status[256];       /* human sentence: why there is no GPU, or "ok" */
} engine_gpu_info;

/* Query the CUDA driver and every visible GPU. Returns 0 even when no GPU is present (then
 * n_devices is 0 and `status` says why); returns ENGINE_EINTERNAL only on an unexpected error. */
int engine_gpu_info_get(engine_gpu_info *out);

#ifdef __cplusplus
}
#endif
#endif /* SPARK_ENGINE_H */
