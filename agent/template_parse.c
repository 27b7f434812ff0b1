/* Chat templates: tokens -> AST. A recursive-descent parser with @huggingface/jinja's grammar
 * and operator precedence (lowest first): ternary/select `if`, or, and, not, comparison and
 * membership, additive (+ - ~), multiplicative, power, `is` tests, filters, unary sign,
 * call/member, primary. Node layouts per kind are listed at new_node's callers. */
#include "template_int.h"

#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 200

typedef struct {
    tpl_arena *a;
    const tpl_tok *t;
    size_t n, i;
    size_t src_len;
    int depth;
    const char *src; /* the original source, for error positions */
} parser;

typedef struct {
    tpl_node **p;
    size_t n, cap;
} node_vec;

static const tpl_tok EOF_TOK = {TK_EOF, {"", 0}, 0};

static const tpl_tok *peek(const parser *P, size_t k) {
    return P->i + k < P->n ? &P->t[P->i + k] : &EOF_TOK;
}

static size_t here(const parser *P) {
    return P->i < P->n ? P->t[P->i].pos : P->src_len;
}

static int perr(const parser *P, size_t pos, const char *msg, const tpl_tok *tok) {
    if (tok && tok->type != TK_EOF) {
        int len = (int)(tok->v.len > 40 ? 40 : tok->v.len);
        return tpl_errf(P->src, P->src_len, pos, "%s (at '%.*s')", msg, len, tok->v.p);
    }
    if (tok) return tpl_errf(P->src, P->src_len, pos, "%s (at end of template)", msg);
    return tpl_errf(P->src, P->src_len, pos, "%s", msg);
}

static int perr_here(const parser *P, const char *msg) {
    return perr(P, here(P), msg, peek(P, 0));
}

static tpl_node *new_node(parser *P, tpl_node_kind k, size_t pos) {
    tpl_node *n = tpl_alloc(P->a, sizeof *n);
    if (n) {
        n->kind = k;
        n->pos = pos;
    }
    return n;
}

static int vec_push(parser *P, node_vec *v, tpl_node *x) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 8;
        tpl_node **p = tpl_alloc(P->a, cap * sizeof *p);
        if (!p) return agent_err(AGENT_ENOMEM, "out of memory");
        if (v->n) memcpy(p, v->p, v->n * sizeof *p);
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = x;
    return 0;
}

static bool is_tok(const parser *P, tpl_tok_type t) {
    return peek(P, 0)->type == t;
}

static bool tok_is_ident(const tpl_tok *t, const char *name) {
    return t->type == TK_IDENT && t->v.len == strlen(name) && !memcmp(t->v.p, name, t->v.len);
}

static bool is_ident(const parser *P, const char *name) {
    return tok_is_ident(peek(P, 0), name);
}

static bool tok_eq(const tpl_tok *t, const char *s) {
    return t->v.len == strlen(s) && !memcmp(t->v.p, s, t->v.len);
}

/* {% NAME ... where NAME is one of the NULL-terminated names */
static bool is_statement(const parser *P, const char *const *names) {
    if (peek(P, 0)->type != TK_OPEN_STMT) return false;
    for (; *names; names++)
        if (tok_is_ident(peek(P, 1), *names)) return true;
    return false;
}

static int expect(parser *P, tpl_tok_type t, const char *what) {
    if (peek(P, 0)->type != t) return perr_here(P, what);
    P->i++;
    return 0;
}

static int expect_ident(parser *P, const char *name, const char *what) {
    if (!is_ident(P, name)) return perr_here(P, what);
    P->i++;
    return 0;
}

#define OOM_IF(x)                                                                          \
    do {                                                                                   \
        if (!(x)) return agent_err(AGENT_ENOMEM, "out of memory");                         \
    } while (0)
#define TRY(x)                                                                             \
    do {                                                                                   \
        int rc_ = (x);                                                                     \
        if (rc_) return rc_;                                                               \
    } while (0)

static int parse_any(parser *P, tpl_node **out);
static int parse_expression(parser *P, tpl_node **out);
static int parse_primary(parser *P, tpl_node **out);
static int parse_args(parser *P, bool params, node_vec *out);

/* Parse statements until one of `enders` opens. */
static int parse_body(parser *P, const char *const *enders, const char *missing, node_vec *v) {
    while (!is_statement(P, enders)) {
        if (P->i >= P->n) return perr(P, P->src_len, missing, NULL);
        tpl_node *s = NULL;
        TRY(parse_any(P, &s));
        TRY(vec_push(P, v, s));
    }
    return 0;
}

static int parse_expr_sequence(parser *P, bool primary, tpl_node **out) {
    size_t pos = here(P);
    tpl_node *first = NULL;
    TRY(primary ? parse_primary(P, &first) : parse_expression(P, &first));
    if (!is_tok(P, TK_COMMA)) {
        *out = first;
        return 0;
    }
    node_vec v = {0};
    TRY(vec_push(P, &v, first));
    while (is_tok(P, TK_COMMA)) {
        P->i++;
        tpl_node *e = NULL;
        TRY(primary ? parse_primary(P, &e) : parse_expression(P, &e));
        TRY(vec_push(P, &v, e));
    }
    tpl_node *t = new_node(P, N_TUPLE, pos);
    OOM_IF(t);
    t->list = v.p;
    t->n = v.n;
    *out = t;
    return 0;
}

static int parse_if_stmt(parser *P, size_t pos, tpl_node **out) {
    tpl_node *n = new_node(P, N_IF, pos);
    OOM_IF(n);
    TRY(parse_expression(P, &n->a));
    TRY(expect(P, TK_CLOSE_STMT, "expected '%}' after the if condition"));
    static const char *const enders[] = {"elif", "else", "endif", NULL};
    node_vec body = {0}, alt = {0};
    TRY(parse_body(P, enders, "missing {% endif %}", &body));
    if (is_statement(P, (const char *const[]){"elif", NULL})) {
        size_t epos = peek(P, 1)->pos;
        P->i += 2;
        tpl_node *e = NULL;
        TRY(parse_if_stmt(P, epos, &e));
        TRY(vec_push(P, &alt, e));
    } else if (is_statement(P, (const char *const[]){"else", NULL})) {
        P->i += 2;
        TRY(expect(P, TK_CLOSE_STMT, "expected '%}' after else"));
        TRY(parse_body(P, (const char *const[]){"endif", NULL}, "missing {% endif %}", &alt));
    }
    n->list = body.p;
    n->n = body.n;
    n->list2 = alt.p;
    n->n2 = alt.n;
    *out = n;
    return 0;
}

/* Whether `kwargs` / `varargs` are read anywhere in a macro body (simplified from the
 * reference's declaration-order analysis: any read counts). */
static void scan_special(const tpl_node *n, bool *kw, bool *va, int depth) {
    if (!n || depth > MAX_DEPTH * 4) return;
    if (n->kind == N_IDENT) {
        if (n->s.len == 6 && !memcmp(n->s.p, "kwargs", 6)) *kw = true;
        if (n->s.len == 7 && !memcmp(n->s.p, "varargs", 7)) *va = true;
        return;
    }
    if (n->kind == N_FILTER && n->b && n->b->kind == N_IDENT) {
        scan_special(n->a, kw, va, depth + 1);
        return;
    }
    if (n->kind == N_MEMBER && !n->flag) {
        scan_special(n->a, kw, va, depth + 1);
        return;
    }
    scan_special(n->a, kw, va, depth + 1);
    scan_special(n->b, kw, va, depth + 1);
    scan_special(n->c, kw, va, depth + 1);
    for (size_t i = 0; i < n->n; i++) scan_special(n->list[i], kw, va, depth + 1);
    for (size_t i = 0; i < n->n2; i++) scan_special(n->list2[i], kw, va, depth + 1);
}

static int parse_statement(parser *P, tpl_node **out) {
    TRY(expect(P, TK_OPEN_STMT, "expected '{%'"));
    const tpl_tok *name = peek(P, 0);
    if (name->type != TK_IDENT) return perr_here(P, "expected a statement name after '{%'");
    size_t npos = name->pos;
    P->i++;
    if (tok_eq(name, "set")) {
        tpl_node *n = new_node(P, N_SET, npos);
        OOM_IF(n);
        TRY(parse_expr_sequence(P, false, &n->a));
        if (is_tok(P, TK_EQUALS)) {
            P->i++;
            TRY(parse_expr_sequence(P, false, &n->b));
        } else {
            TRY(expect(P, TK_CLOSE_STMT, "expected '=' or '%}' in set"));
            node_vec body = {0};
            TRY(parse_body(P, (const char *const[]){"endset", NULL}, "missing {% endset %}",
                           &body));
            P->i++;
            TRY(expect_ident(P, "endset", "expected endset"));
            n->list = body.p;
            n->n = body.n;
        }
        TRY(expect(P, TK_CLOSE_STMT, "expected '%}' to close set"));
        *out = n;
        return 0;
    }
    if (tok_eq(name, "if")) {
        TRY(parse_if_stmt(P, npos, out));
        TRY(expect(P, TK_OPEN_STMT, "missing {% endif %}"));
        TRY(expect_ident(P, "endif", "missing {% endif %}"));
        return expect(P, TK_CLOSE_STMT, "expected '%}' after endif");
    }
    if (tok_eq(name, "macro")) {
        tpl_node *n = new_node(P, N_MACRO, npos);
        OOM_IF(n);
        tpl_node *id = NULL;
        TRY(parse_primary(P, &id));
        if (id->kind != N_IDENT) return perr(P, id->pos, "expected a macro name", NULL);
        n->s = id->s;
        node_vec params = {0}, body = {0};
        TRY(parse_args(P, true, &params));
        TRY(expect(P, TK_CLOSE_STMT, "expected '%}' after the macro signature"));
        TRY(parse_body(P, (const char *const[]){"endmacro", NULL}, "missing {% endmacro %}",
                       &body));
        P->i++;
        TRY(expect_ident(P, "endmacro", "expected endmacro"));
        TRY(expect(P, TK_CLOSE_STMT, "expected '%}' after endmacro"));
        n->list = params.p;
        n->n = params.n;
        n->list2 = body.p;
        n->n2 = body.n;
        for (size_t i = 0; i < body.n; i++) scan_special(body.p[i], &n->flag, &n->flag2, 0);
        for (size_t i = 0; i < params.n; i++) {
            tpl_str pn = params.p[i]->s;
            if (pn.len == 6 && !memcmp(pn.p, "kwargs", 6)) n->flag = false;
            if (pn.len == 7 && !memcmp(pn.p, "varargs", 7)) n->flag2 = false;
        }
        *out = n;
        return 0;
    }
    if (tok_eq(name, "for")) {
        tpl_node *n = new_node(P, N_FOR, npos);
        OOM_IF(n);
        TRY(parse_expr_sequence(P, true, &n->a));
        if (n->a->kind != N_IDENT && n->a->kind != N_TUPLE)
            return perr(P, n->a->pos, "expected a name or a tuple of names as loop variable",
                        NULL);
        TRY(expect_ident(P, "in", "expected 'in' after the loop variable"));
        TRY(parse_expression(P, &n->b));
        TRY(expect(P, TK_CLOSE_STMT, "expected '%}' after the for header"));
        node_vec body = {0}, alt = {0};
        TRY(parse_body(P, (const char *const[]){"endfor", "else", NULL}, "missing {% endfor %}",
                       &body));
        if (is_statement(P, (const char *const[]){"else", NULL})) {
            P->i += 2;
            TRY(expect(P, TK_CLOSE_STMT, "expected '%}' after else"));
            TRY(parse_body(P, (const char *const[]){"endfor", NULL}, "missing {% endfor %}",
                           &alt));
        }
        P->i++;
        TRY(expect_ident(P, "endfor", "expected endfor"));
        TRY(expect(P, TK_CLOSE_STMT, "expected '%}' after endfor"));
        n->list = body.p;
        n->n = body.n;
        n->list2 = alt.p;
        n->n2 = alt.n;
        *out = n;
        return 0;
    }
    if (tok_eq(name, "break") || tok_eq(name, "continue")) {
        tpl_node *n = new_node(P, tok_eq(name, "break") ? N_BREAK : N_CONTINUE, npos);
        OOM_IF(n);
        TRY(expect(P, TK_CLOSE_STMT, "expected '%}'"));
        *out = n;
        return 0;
    }
    if (tok_eq(name, "filter")) {
        tpl_node *n = new_node(P, N_FILTER_STMT, npos);
        OOM_IF(n);
        tpl_node *f = NULL;
        TRY(parse_primary(P, &f));
        if (f->kind != N_IDENT) return perr(P, f->pos, "expected a filter name", NULL);
        if (is_tok(P, TK_LPAREN)) {
            tpl_node *c = new_node(P, N_CALL, f->pos);
            OOM_IF(c);
            c->a = f;
            node_vec args = {0};
            TRY(parse_args(P, false, &args));
            c->list = args.p;
            c->n = args.n;
            f = c;
        }
        TRY(expect(P, TK_CLOSE_STMT, "expected '%}' after the filter"));
        node_vec body = {0};
        TRY(parse_body(P, (const char *const[]){"endfilter", NULL}, "missing {% endfilter %}",
                       &body));
        P->i++;
        TRY(expect_ident(P, "endfilter", "expected endfilter"));
        TRY(expect(P, TK_CLOSE_STMT, "expected '%}' after endfilter"));
        n->b = f;
        n->list = body.p;
        n->n = body.n;
        *out = n;
        return 0;
    }
    if (tok_eq(name, "call"))
        return perr(P, npos, "unsupported statement: {% call %} blocks", NULL);
    return perr(P, npos, "unknown or unsupported statement", name);
}

static int parse_any(parser *P, tpl_node **out) {
    if (++P->depth > MAX_DEPTH) return perr_here(P, "template nested too deeply");
    const tpl_tok *t = peek(P, 0);
    int rc = 0;
    switch (t->type) {
    case TK_COMMENT:
        *out = new_node(P, N_COMMENT, t->pos);
        OOM_IF(*out);
        P->i++;
        break;
    case TK_TEXT:
        *out = new_node(P, N_STR, t->pos);
        OOM_IF(*out);
        (*out)->s = t->v;
        P->i++;
        break;
    case TK_OPEN_STMT:
        rc = parse_statement(P, out);
        break;
    case TK_OPEN_EXPR:
        P->i++;
        rc = parse_expression(P, out);
        if (!rc) rc = expect(P, TK_CLOSE_EXPR, "expected '}}'");
        break;
    default:
        rc = perr_here(P, "unexpected token");
    }
    P->depth--;
    return rc;
}

static tpl_node *binary(parser *P, tpl_op op, size_t pos, tpl_node *l, tpl_node *r) {
    tpl_node *n = new_node(P, N_BINARY, pos);
    if (n) {
        n->op = op;
        n->a = l;
        n->b = r;
    }
    return n;
}

static int parse_or(parser *P, tpl_node **out);

static int parse_expression(parser *P, tpl_node **out) {
    if (++P->depth > MAX_DEPTH) return perr_here(P, "expression nested too deeply");
    size_t pos = here(P);
    tpl_node *a = NULL;
    TRY(parse_or(P, &a));
    if (is_ident(P, "if")) {
        size_t ipos = here(P);
        P->i++;
        tpl_node *test = NULL;
        TRY(parse_or(P, &test));
        if (is_ident(P, "else")) {
            P->i++;
            tpl_node *f = NULL;
            TRY(parse_expression(P, &f));
            tpl_node *n = new_node(P, N_TERNARY, pos);
            OOM_IF(n);
            n->a = test;
            n->b = a;
            n->c = f;
            a = n;
        } else {
            tpl_node *n = new_node(P, N_SELECT, ipos);
            OOM_IF(n);
            n->a = a;
            n->b = test;
            a = n;
        }
    }
    P->depth--;
    *out = a;
    return 0;
}

static int parse_not(parser *P, tpl_node **out);
static int parse_and(parser *P, tpl_node **out) {
    tpl_node *l = NULL;
    TRY(parse_not(P, &l));
    while (is_ident(P, "and")) {
        size_t pos = here(P);
        P->i++;
        tpl_node *r = NULL;
        TRY(parse_not(P, &r));
        OOM_IF(l = binary(P, OP_AND, pos, l, r));
    }
    *out = l;
    return 0;
}

static int parse_or(parser *P, tpl_node **out) {
    tpl_node *l = NULL;
    TRY(parse_and(P, &l));
    while (is_ident(P, "or")) {
        size_t pos = here(P);
        P->i++;
        tpl_node *r = NULL;
        TRY(parse_and(P, &r));
        OOM_IF(l = binary(P, OP_OR, pos, l, r));
    }
    *out = l;
    return 0;
}

static int parse_compare(parser *P, tpl_node **out);
static int parse_not(parser *P, tpl_node **out) {
    if (++P->depth > MAX_DEPTH) return perr_here(P, "expression nested too deeply");
    tpl_node *res = NULL;
    while (is_ident(P, "not")) {
        size_t pos = here(P);
        P->i++;
        tpl_node *arg = NULL;
        TRY(parse_not(P, &arg));
        res = new_node(P, N_UNARY, pos);
        OOM_IF(res);
        res->op = OP_NOT;
        res->a = arg;
    }
    P->depth--;
    if (res) {
        *out = res;
        return 0;
    }
    return parse_compare(P, out);
}

static int parse_additive(parser *P, tpl_node **out);
static int parse_compare(parser *P, tpl_node **out) {
    tpl_node *l = NULL;
    TRY(parse_additive(P, &l));
    while (1) {
        size_t pos = here(P);
        tpl_op op;
        const tpl_tok *t = peek(P, 0);
        if (tok_is_ident(t, "not") && tok_is_ident(peek(P, 1), "in")) {
            op = OP_NOT_IN;
            P->i += 2;
        } else if (tok_is_ident(t, "in")) {
            op = OP_IN;
            P->i++;
        } else if (t->type == TK_COMPARE) {
            op = tok_eq(t, "<")    ? OP_LT
                 : tok_eq(t, ">")  ? OP_GT
                 : tok_eq(t, "<=") ? OP_LE
                 : tok_eq(t, ">=") ? OP_GE
                 : tok_eq(t, "==") ? OP_EQ
                                   : OP_NE;
            P->i++;
        } else {
            break;
        }
        tpl_node *r = NULL;
        TRY(parse_additive(P, &r));
        OOM_IF(l = binary(P, op, pos, l, r));
    }
    *out = l;
    return 0;
}

static int parse_multiplicative(parser *P, tpl_node **out);
static int parse_additive(parser *P, tpl_node **out) {
    tpl_node *l = NULL;
    TRY(parse_multiplicative(P, &l));
    while (is_tok(P, TK_ADD)) {
        const tpl_tok *t = peek(P, 0);
        tpl_op op = tok_eq(t, "+") ? OP_ADD : tok_eq(t, "-") ? OP_SUB : OP_CONCAT;
        size_t pos = t->pos;
        P->i++;
        tpl_node *r = NULL;
        TRY(parse_multiplicative(P, &r));
        OOM_IF(l = binary(P, op, pos, l, r));
    }
    *out = l;
    return 0;
}

static int parse_power(parser *P, tpl_node **out);
static int parse_multiplicative(parser *P, tpl_node **out) {
    tpl_node *l = NULL;
    TRY(parse_power(P, &l));
    while (is_tok(P, TK_MUL)) {
        const tpl_tok *t = peek(P, 0);
        tpl_op op = tok_eq(t, "*")    ? OP_MUL
                    : tok_eq(t, "/")  ? OP_DIV
                    : tok_eq(t, "//") ? OP_FLOORDIV
                                      : OP_MOD;
        size_t pos = t->pos;
        P->i++;
        tpl_node *r = NULL;
        TRY(parse_power(P, &r));
        OOM_IF(l = binary(P, op, pos, l, r));
    }
    *out = l;
    return 0;
}

static int parse_test(parser *P, tpl_node **out);
static int parse_power(parser *P, tpl_node **out) {
    tpl_node *l = NULL;
    TRY(parse_test(P, &l));
    while (is_tok(P, TK_POW)) {
        size_t pos = here(P);
        P->i++;
        tpl_node *r = NULL;
        TRY(parse_test(P, &r));
        OOM_IF(l = binary(P, OP_POW, pos, l, r));
    }
    *out = l;
    return 0;
}

static int parse_filter(parser *P, tpl_node **out);
static int parse_test(parser *P, tpl_node **out) {
    tpl_node *operand = NULL;
    TRY(parse_filter(P, &operand));
    while (is_ident(P, "is")) {
        size_t pos = here(P);
        P->i++;
        bool neg = is_ident(P, "not");
        if (neg) P->i++;
        tpl_node *name = NULL;
        TRY(parse_primary(P, &name));
        if (name->kind != N_IDENT) return perr(P, name->pos, "expected a test name", NULL);
        tpl_node *n = new_node(P, N_TEST, pos);
        OOM_IF(n);
        n->a = operand;
        n->s = name->s;
        n->flag = neg;
        operand = n;
    }
    *out = operand;
    return 0;
}

static int parse_call(parser *P, tpl_node *callee, tpl_node **out);
static int parse_unary(parser *P, tpl_node **out);
static int parse_filter(parser *P, tpl_node **out) {
    tpl_node *operand = NULL;
    TRY(parse_unary(P, &operand));
    while (is_tok(P, TK_PIPE)) {
        size_t pos = here(P);
        P->i++;
        tpl_node *f = NULL;
        TRY(parse_primary(P, &f));
        if (f->kind != N_IDENT) return perr(P, f->pos, "expected a filter name", NULL);
        if (is_tok(P, TK_LPAREN)) TRY(parse_call(P, f, &f));
        tpl_node *n = new_node(P, N_FILTER, pos);
        OOM_IF(n);
        n->a = operand;
        n->b = f;
        operand = n;
    }
    *out = operand;
    return 0;
}

static int parse_member(parser *P, tpl_node *obj, tpl_node **out);
static int parse_unary(parser *P, tpl_node **out) {
    const tpl_tok *t = peek(P, 0);
    if ((t->type == TK_UNARY || t->type == TK_ADD) && (tok_eq(t, "-") || tok_eq(t, "+"))) {
        if (++P->depth > MAX_DEPTH) return perr_here(P, "expression nested too deeply");
        size_t pos = t->pos;
        tpl_op op = tok_eq(t, "-") ? OP_NEG : OP_POS;
        P->i++;
        tpl_node *arg = NULL;
        TRY(parse_unary(P, &arg));
        tpl_node *n = new_node(P, N_UNARY, pos);
        OOM_IF(n);
        n->op = op;
        n->a = arg;
        *out = n;
        P->depth--;
        return 0;
    }
    tpl_node *prim = NULL, *mem = NULL;
    TRY(parse_primary(P, &prim));
    TRY(parse_member(P, prim, &mem));
    if (is_tok(P, TK_LPAREN)) return parse_call(P, mem, out);
    *out = mem;
    return 0;
}

static int parse_call(parser *P, tpl_node *callee, tpl_node **out) {
    if (++P->depth > MAX_DEPTH) return perr_here(P, "expression nested too deeply");
    tpl_node *n = new_node(P, N_CALL, callee->pos);
    OOM_IF(n);
    n->a = callee;
    node_vec args = {0};
    TRY(parse_args(P, false, &args));
    n->list = args.p;
    n->n = args.n;
    tpl_node *m = NULL;
    TRY(parse_member(P, n, &m));
    if (is_tok(P, TK_LPAREN)) TRY(parse_call(P, m, &m));
    P->depth--;
    *out = m;
    return 0;
}

static int parse_args(parser *P, bool params, node_vec *out) {
    TRY(expect(P, TK_LPAREN, "expected '(' to open the argument list"));
    bool saw_kw = false;
    while (!is_tok(P, TK_RPAREN)) {
        if (P->i >= P->n) return perr_here(P, "unterminated argument list");
        const tpl_tok *t = peek(P, 0);
        if (t->type == TK_POW || (t->type == TK_MUL && tok_eq(t, "*")))
            return perr_here(P, "unsupported: argument unpacking with * or **");
        tpl_node *arg = NULL;
        TRY(parse_expression(P, &arg));
        if (is_tok(P, TK_EQUALS)) {
            P->i++;
            if (arg->kind != N_IDENT)
                return perr(P, arg->pos,
                            params ? "expected a name for the parameter"
                                   : "expected a name for the keyword argument",
                            NULL);
            tpl_node *kw = new_node(P, N_KWARG, arg->pos);
            OOM_IF(kw);
            kw->s = arg->s;
            TRY(parse_expression(P, &kw->a));
            arg = kw;
        }
        if (params) {
            if (arg->kind != N_IDENT && arg->kind != N_KWARG)
                return perr(P, arg->pos, "expected a name for the parameter", NULL);
            for (size_t k = 0; k < out->n; k++)
                if (out->p[k]->s.len == arg->s.len &&
                    !memcmp(out->p[k]->s.p, arg->s.p, arg->s.len))
                    return perr(P, arg->pos, "duplicate parameter name", NULL);
        }
        if (arg->kind == N_KWARG) {
            saw_kw = true;
        } else if (saw_kw) {
            return perr(P, arg->pos,
                        params ? "non-default parameter follows a default parameter"
                               : "positional argument follows keyword argument",
                        NULL);
        }
        TRY(vec_push(P, out, arg));
        if (is_tok(P, TK_COMMA)) P->i++;
    }
    P->i++;
    return 0;
}

static int parse_subscript(parser *P, tpl_node **out) {
    size_t pos = here(P);
    tpl_node *parts[4] = {0};
    size_t np = 0;
    bool slice = false;
    while (!is_tok(P, TK_RBRACKET)) {
        if (P->i >= P->n) return perr_here(P, "expected ']'");
        if (np >= 4) return perr(P, pos, "expected at most 3 slice arguments", NULL);
        if (is_tok(P, TK_COLON)) {
            parts[np++] = NULL;
            P->i++;
            slice = true;
        } else {
            TRY(parse_expression(P, &parts[np]));
            np++;
            if (is_tok(P, TK_COLON)) {
                P->i++;
                slice = true;
            }
        }
    }
    if (np == 0) return perr(P, pos, "expected an index or a slice inside []", NULL);
    if (!slice) {
        *out = parts[0];
        return 0;
    }
    if (np > 3) return perr(P, pos, "expected at most 3 slice arguments", NULL);
    tpl_node *n = new_node(P, N_SLICE, pos);
    OOM_IF(n);
    n->a = parts[0];
    n->b = np > 1 ? parts[1] : NULL;
    n->c = np > 2 ? parts[2] : NULL;
    *out = n;
    return 0;
}

static int parse_member(parser *P, tpl_node *obj, tpl_node **out) {
    while (is_tok(P, TK_DOT) || is_tok(P, TK_LBRACKET)) {
        bool computed = is_tok(P, TK_LBRACKET);
        size_t pos = here(P);
        P->i++;
        tpl_node *prop = NULL;
        if (computed) {
            if (++P->depth > MAX_DEPTH) return perr_here(P, "expression nested too deeply");
            TRY(parse_subscript(P, &prop));
            TRY(expect(P, TK_RBRACKET, "expected ']'"));
            P->depth--;
        } else {
            TRY(parse_primary(P, &prop));
            if (prop->kind != N_IDENT && prop->kind != N_INT)
                return perr(P, prop->pos, "expected a name or an integer after '.'", NULL);
        }
        tpl_node *m = new_node(P, N_MEMBER, pos);
        OOM_IF(m);
        m->a = obj;
        m->b = prop;
        m->flag = computed;
        obj = m;
    }
    *out = obj;
    return 0;
}

static int parse_primary(parser *P, tpl_node **out) {
    if (++P->depth > MAX_DEPTH) return perr_here(P, "expression nested too deeply");
    const tpl_tok *t = peek(P, 0);
    size_t pos = t->pos;
    tpl_node *n = NULL;
    switch (t->type) {
    case TK_NUMBER: {
        char buf[64];
        size_t len = t->v.len < sizeof buf - 1 ? t->v.len : sizeof buf - 1;
        memcpy(buf, t->v.p, len);
        buf[len] = 0;
        n = new_node(P, memchr(buf, '.', len) ? N_FLOAT : N_INT, pos);
        OOM_IF(n);
        n->num = strtod(buf, NULL);
        if (t->v.len >= sizeof buf - 1) n->num = (buf[0] == '-' ? -1.0 : 1.0) * 1e300 * 1e300;
        P->i++;
        break;
    }
    case TK_STRING: {
        P->i++;
        tpl_str s = t->v;
        if (is_tok(P, TK_STRING)) {
            tpl_sb b;
            tpl_sb_init(&b, P->a);
            tpl_sb_put(&b, s.p, s.len);
            while (is_tok(P, TK_STRING)) {
                tpl_sb_put(&b, peek(P, 0)->v.p, peek(P, 0)->v.len);
                P->i++;
            }
            if (b.oom) return agent_err(AGENT_ENOMEM, "out of memory");
            s.p = b.p ? b.p : "";
            s.len = b.len;
        }
        n = new_node(P, N_STR, pos);
        OOM_IF(n);
        n->s = s;
        break;
    }
    case TK_IDENT:
        n = new_node(P, N_IDENT, pos);
        OOM_IF(n);
        n->s = t->v;
        P->i++;
        break;
    case TK_LPAREN:
        P->i++;
        TRY(parse_expr_sequence(P, false, &n));
        TRY(expect(P, TK_RPAREN, "expected ')'"));
        break;
    case TK_LBRACKET: {
        P->i++;
        node_vec v = {0};
        while (!is_tok(P, TK_RBRACKET)) {
            if (P->i >= P->n) return perr_here(P, "expected ']'");
            tpl_node *e = NULL;
            TRY(parse_expression(P, &e));
            TRY(vec_push(P, &v, e));
            if (is_tok(P, TK_COMMA)) P->i++;
        }
        P->i++;
        n = new_node(P, N_ARRAY, pos);
        OOM_IF(n);
        n->list = v.p;
        n->n = v.n;
        break;
    }
    case TK_LBRACE: {
        P->i++;
        node_vec k = {0}, v = {0};
        while (!is_tok(P, TK_RBRACE)) {
            if (P->i >= P->n) return perr_here(P, "expected '}'");
            tpl_node *key = NULL, *val = NULL;
            TRY(parse_expression(P, &key));
            TRY(expect(P, TK_COLON, "expected ':' between key and value"));
            TRY(parse_expression(P, &val));
            TRY(vec_push(P, &k, key));
            TRY(vec_push(P, &v, val));
            if (is_tok(P, TK_COMMA)) P->i++;
        }
        P->i++;
        n = new_node(P, N_OBJECT, pos);
        OOM_IF(n);
        n->list = k.p;
        n->n = k.n;
        n->list2 = v.p;
        n->n2 = v.n;
        break;
    }
    default:
        return perr_here(P, "unexpected token in expression");
    }
    P->depth--;
    *out = n;
    return 0;
}

int tpl_parse(tpl_arena *a, const tpl_tok *toks, size_t n, const char *src, size_t src_len,
              tpl_program *out) {
    parser P = {.a = a, .t = toks, .n = n, .src = src, .src_len = src_len};
    node_vec body = {0};
    while (P.i < P.n) {
        tpl_node *s = NULL;
        TRY(parse_any(&P, &s));
        TRY(vec_push(&P, &body, s));
    }
    out->body = body.p;
    out->n = body.n;
    return 0;
}

