/* Private to sandbox/. */
#ifndef SPARK_SANDBOX_INT_H
#define SPARK_SANDBOX_INT_H
#include "sandbox.h"

/* Record the calling thread's last error and return `code`. */
int sandbox_err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#endif
