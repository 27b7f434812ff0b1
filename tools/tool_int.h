/* Private to tools/. */
#ifndef SPARK_TOOL_INT_H
#define SPARK_TOOL_INT_H
#include "tools.h"

/* Record the calling thread's last error and return `code`. */
int tool_err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#endif
