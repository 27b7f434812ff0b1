#include "common.h"
#include "build_info.h"

#include <string.h>
#include <unistd.h>
#if defined(__aarch64__)
#include <sys/auxv.h>
#endif

const char *engine_version(void) {
    return SPARK_VERSION;
}

const char *engine_build_info(void) {
#ifdef SPARK_HAVE_CUDA
    return SPARK_C_COMPILER ", " SPARK_BUILD_TYPE ", CUDA " SPARK_CUDA_COMPILER_VERSION
                            " (sm " SPARK_CUDA_ARCHS ")";
#else
    return SPARK_C_COMPILER ", " SPARK_BUILD_TYPE ", CUDA not built";
#endif
}

bool engine_cuda_built(void) {
#ifdef SPARK_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

static void read_cpu_model(char *out, size_t cap) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    out[0] = 0;
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        /* x86 says "model name", arm64 kernels often only "CPU part"; take the first we see. */
        if (strncmp(line, "model name", 10) == 0 || strncmp(line, "Model", 5) == 0) {
            char *colon = strchr(line, ':');
            if (!colon) continue;
            colon++;
            while (*colon == ' ' || *colon == '\t') colon++;
            size_t n = strcspn(colon, "\n");
            if (n >= cap) n = cap - 1;
            memcpy(out, colon, n);
            out[n] = 0;
            break;
        }
    }
    fclose(f);
}

void engine_cpu_info_get(engine_cpu_info *out) {
    memset(out, 0, sizeof *out);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    out->n_logical = n > 0 ? (int)n : 1;
    read_cpu_model(out->model_name, sizeof out->model_name);
#if defined(__x86_64__)
    snprintf(out->arch, sizeof out->arch, "x86_64");
    __builtin_cpu_init();
    out->sse42 = __builtin_cpu_supports("sse4.2");
    out->avx = __builtin_cpu_supports("avx");
    out->avx2 = __builtin_cpu_supports("avx2");
    out->fma = __builtin_cpu_supports("fma");
    out->avx512f = __builtin_cpu_supports("avx512f");
    out->avx512bw = __builtin_cpu_supports("avx512bw");
    out->avx512vnni = __builtin_cpu_supports("avx512vnni");
    /* F16C and AVX-VNNI have no __builtin_cpu_supports name in gcc 12: read CPUID directly. */
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
    out->f16c = (c >> 29) & 1;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
    out->avx_vnni = (a >> 4) & 1;
#elif defined(__aarch64__)
    snprintf(out->arch, sizeof out->arch, "aarch64");
    unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    out->neon = true; /* mandatory on AArch64 */
    out->dotprod = (hw >> 20) & 1; /* HWCAP_ASIMDDP */
    out->sve = (hw >> 22) & 1;     /* HWCAP_SVE */
    out->i8mm = (hw2 >> 13) & 1;   /* HWCAP2_I8MM */
#else
    snprintf(out->arch, sizeof out->arch, "other");
#endif
}

/* engine_cpu_simd_path() lives with the dispatch it reports, in engine/cpu/quant.c. */
