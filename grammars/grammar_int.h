/* Private to grammars/. */
#ifndef SPARK_GRAMMAR_INT_H
#define SPARK_GRAMMAR_INT_H
#include "grammar.h"

/* Record the calling thread's last error and return `code`. */
int grammar_err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#endif
