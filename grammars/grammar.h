/*
 * grammar.h - public door of grammars/. (Conventions: functions return 0 or a negative GRAMMAR_E* code;
 * grammar_error_last() holds the calling thread's last error message. Nothing here prints or exits.)
 */
#ifndef SPARK_GRAMMAR_H
#define SPARK_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    GRAMMAR_OK = 0,
    GRAMMAR_EINVAL = -1,
    GRAMMAR_ENOMEM = -2,
    GRAMMAR_EINTERNAL = -3,
};

/* The calling thread's last error message ("" if none). Borrowed. */
const char *grammar_error_last(void);

#ifdef __cplusplus
}
#endif
#endif
