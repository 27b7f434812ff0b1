/* Private helpers shared by every part of the engine. Not installed, not for other modules. */
#ifndef SPARK_ENGINE_COMMON_H
#define SPARK_ENGINE_COMMON_H

#include "engine.h"

#include <stdio.h>
#include <stdlib.h>

/* Record `fmt` as the calling thread's last error and return `code` (a negative ENGINE_E*),
 * so that error paths read `return engine_err(ENGINE_EFORMAT, "%s: ...", path);`. */
int engine_err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Invariants only a bug can break: abort with file:line. Never used for input validation. */
#define ENGINE_ASSERT(x)                                                                   \
    do {                                                                                   \
        if (!(x)) engine_assert_fail(__FILE__, __LINE__, #x);                              \
    } while (0)
_Noreturn void engine_assert_fail(const char *file, int line, const char *expr);

/* The spark-agent cache directory <leaf> into buf: $XDG_CACHE_HOME/spark-agent/<leaf> (an
 * absolute XDG_CACHE_HOME only, as the XDG spec says), else $HOME/.cache/spark-agent/<leaf>;
 * with create, made (mkdir -p, 0755). ENGINE_EIO (no home, mkdir failed), ENGINE_ERANGE.
 * engine/gen/default_model.c. */
int engine_cache_dir(char *buf, size_t cap, const char *leaf, bool create);

#define ENGINE_MIN(a, b) ((a) < (b) ? (a) : (b))
#define ENGINE_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
