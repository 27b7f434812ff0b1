/* Private to agent/template*.c: runtime values of the template interpreter. Values live in the
 * per-render arena; arrays and objects are referenced by pointer, which is also their identity
 * for `==` and `in` (as object identity in the JavaScript reference). */
#ifndef SPARK_AGENT_TEMPLATE_VALUE_H
#define SPARK_AGENT_TEMPLATE_VALUE_H

#include "template_int.h"

typedef enum {
    V_UNDEF = 0,
    V_NULL,
    V_BOOL,
    V_INT,
    V_FLOAT,
    V_STR,
    V_ARRAY,
    V_TUPLE,
    V_OBJECT,
    V_KWARGS, /* keyword arguments passed to a function: an object */
    V_NS,     /* namespace(): mutable attributes, not a mapping */
    V_FUNC,
} tpl_vt;

typedef struct tpl_arr tpl_arr;
typedef struct tpl_obj tpl_obj;
typedef struct tpl_fn tpl_fn;

typedef struct {
    tpl_vt t;
    bool b;
    double n; /* INT and FLOAT: JavaScript numbers (doubles) */
    tpl_str s;
    tpl_arr *a;
    tpl_obj *o;
    tpl_fn *f;
} tpl_val;

struct tpl_arr {
    size_t n;
    tpl_val *v;
};

struct tpl_obj {
    size_t n, cap;
    tpl_str *k;
    tpl_val *v;
};

typedef enum {
    FN_MACRO,
    FN_STR_METHOD, /* self: a string; name: the method */
    FN_OBJ_METHOD, /* self: an object */
    FN_RAISE,
    FN_RANGE,
    FN_NAMESPACE,
    FN_STRFTIME,
} tpl_fn_kind;

struct tpl_fn {
    tpl_fn_kind k;
    const char *name;
    tpl_val self;
    const tpl_node *macro;
};

#endif
