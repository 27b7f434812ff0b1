/* The check macro of the CUDA tests: counts a failure and prints the condition, a formatted
 * detail and the engine's last error, then carries on. The including file defines
 * `static int failures;`. */
#ifndef SPARK_TEST_CUDA_CHECK_H
#define SPARK_TEST_CUDA_CHECK_H

#include <stdio.h>

#include "engine.h"

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, " (last error: %s)\n", engine_error_last());                           \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

#endif
