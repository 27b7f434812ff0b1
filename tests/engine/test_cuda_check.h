/* The check macro of the CUDA tests: counts a failure (support_failures, the counter of
 * support.h: support_finish reports it) and prints the condition, a formatted detail and the
 * engine's last error, then carries on. It replaces support.h's one-argument CHECK. */
#ifndef SPARK_TEST_CUDA_CHECK_H
#define SPARK_TEST_CUDA_CHECK_H

#include <stdio.h>

#include "engine.h"
#include "support.h"

#undef CHECK
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, " (last error: %s)\n", engine_error_last());                           \
            support_failures++;                                                                    \
        }                                                                                          \
    } while (0)

#endif
