/* Private to agent/template*.c: JavaScript case mappings of non-ASCII code points (generated
 * into template_case.c by template_case_gen.mjs). ASCII is mapped by the caller. */
#ifndef SPARK_AGENT_TEMPLATE_CASE_H
#define SPARK_AGENT_TEMPLATE_CASE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t cp;
    const char *utf8; /* the mapping, one or more code points */
} tpl_case_map;

typedef struct {
    uint32_t lo, hi; /* inclusive */
} tpl_case_range;

extern const tpl_case_map tpl_case_upper[];
extern const size_t tpl_case_upper_len;
extern const tpl_case_map tpl_case_lower[];
extern const size_t tpl_case_lower_len;
/* Unicode's Cased and Case_Ignorable properties (for the final sigma rule). */
extern const tpl_case_range tpl_cased[];
extern const size_t tpl_cased_len;
extern const tpl_case_range tpl_case_ignorable[];
extern const size_t tpl_case_ignorable_len;

#endif
