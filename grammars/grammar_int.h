/* Private to grammars/. */
#ifndef SPARK_GRAMMAR_INT_H
#define SPARK_GRAMMAR_INT_H
#include "grammar.h"

#include <stdlib.h>

/* Record the calling thread's last error and return `code`. */
int grammar_err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ----- growable buffers ----- */

typedef struct {
    char *data;
    size_t len, cap;
    int failed; /* an allocation failed; everything after is dropped */
} grammar_buf;

void grammar_buf_put(grammar_buf *b, const char *s, size_t n);
void grammar_buf_puts(grammar_buf *b, const char *s);
void grammar_buf_printf(grammar_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append s as the body of a GBNF string literal (escaping quotes, backslashes, controls). */
void grammar_buf_put_gbnf_literal(grammar_buf *b, const char *s, size_t n);

/* Value of a hexadecimal digit, -1 if c is none. */
static inline int grammar_hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Grow *p (an array of `size`-byte items, capacity *cap) to hold at least `need` items. */
int grammar_grow(void **p, size_t *cap, size_t need, size_t size);

/* ----- compiled grammar: one byte-level DFA per rule, with rule calls on edges ----- */

/* Per DFA state: trans[q * 256 + b] = next state or -1; refs[ref_off[q] .. ref_off[q + 1]) = the
 * rule calls (rule, return state) possible from q. */
typedef struct {
    int32_t rule;
    int32_t ret;
} grammar_ref;

#define GRAMMAR_MAX_TRIGGERS 8

struct grammar {
    int32_t n_rules;
    char **rule_names;      /* n_rules */
    int32_t *rule_start;    /* n_rules: start state of each rule */
    int32_t root;           /* start rule */

    int32_t n_states;
    /* transitions over per-rule byte classes: next(q, b) =
     * trans[row_off[q] + rule_cls[state_rule[q] * 256 + b]] (-1: none) */
    int32_t *trans;
    uint32_t *row_off;      /* n_states */
    uint8_t *rule_cls;      /* n_rules * 256 */
    uint16_t *rule_ncls;    /* n_rules */
    uint8_t *final;         /* n_states */
    uint8_t *has_bytes;     /* n_states: some byte edge leaves */
    int32_t *state_rule;    /* n_states: the rule a state belongs to */
    int32_t *ref_off;       /* n_states + 1 */
    grammar_ref *refs;
    int32_t *ret_off;       /* n_rules + 1: the return states of calls of each rule */
    int32_t *rets;
    uint32_t *dist;         /* n_states: fewest bytes to reach a final state of the rule */

    /* lazy mode: free text until one of these strings, then the grammar from its first byte */
    int n_triggers;
    char *triggers[GRAMMAR_MAX_TRIGGERS];
    size_t trigger_len[GRAMMAR_MAX_TRIGGERS];
};

#define GRAMMAR_DIST_INF 0x3fffffffu

static inline int32_t grammar_next(const grammar *g, int32_t q, uint8_t b) {
    return g->trans[g->row_off[q] + g->rule_cls[(size_t)g->state_rule[q] * 256 + b]];
}

/* One character of JSON string content as a GBNF group (written inline, so a string body is one
 * DFA loop rather than a rule call per character). \u escapes exclude surrogates, so every
 * match is exactly one codepoint (what minLength/maxLength count). */
#define GRAMMAR_JSON_CHAR                                                                        \
    "( [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-Ce-fE-F] "             \
    "[0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} ) ) )"

/* JSON strings (json_schema.c, regex.c): the GBNF alternatives (joined with " | ", *first
 * tracks the first) that match one character of the codepoint set as JSON string content. */
void grammar_json_char_class(grammar_buf *b, const uint32_t *ranges, size_t pairs, int *first);
/* A regular expression (ECMAScript subset, see docs) as a GBNF expression over JSON string
 * content; the search is unanchored unless the pattern starts with ^ / ends with $. Needs the
 * `char` rule. Returns 0, or -1 with a message in err. */
int grammar_regex_to_gbnf(grammar_buf *b, const char *re, char *err, size_t errcap);

/* Rules for one schema (a Jansson value; `prefix` keeps rule names of several schemas apart)
 * appended to out; *name receives the top rule; *used collects the shared rules needed, which
 * grammar_schema_core appends once at the end. */
struct json_t;
#define GRAMMAR_CORE_WS 1u /* `used` bit: the ws rule */
int grammar_schema_rules(grammar_buf *out, struct json_t *schema, const char *prefix, char *name,
                         uint32_t *used);
void grammar_schema_core(grammar_buf *out, uint32_t used);

/* ----- GBNF front end (gbnf.c) and DFA construction (compile.c) ----- */

enum { GA_EMPTY, GA_SEQ, GA_ALT, GA_CLASS, GA_LIT, GA_REF, GA_REP };

typedef struct {
    int kind;
    int32_t first, count;   /* SEQ/ALT: kids[first .. first + count); CLASS: ranges (pairs);
                               LIT: bytes; REP: kid index in `first` */
    int32_t ref;            /* REF: rule id */
    int32_t min, max;       /* REP: max < 0 = unbounded */
} grammar_ast;

typedef struct {
    grammar_ast *nodes;
    size_t n_nodes, cap_nodes;
    int32_t *kids;
    size_t n_kids, cap_kids;
    uint32_t *ranges;       /* codepoint ranges, lo/hi pairs */
    size_t n_ranges, cap_ranges;
    uint8_t *bytes;
    size_t n_bytes, cap_bytes;
    char **names;
    int32_t *rule_body;     /* AST node per rule, -1 = referenced but not defined */
    int32_t *rule_line, *rule_col; /* where the rule was first referenced or defined */
    size_t n_rules, cap_rules;
} grammar_ir;

void grammar_ir_free(grammar_ir *ir);
int grammar_gbnf_parse(grammar_ir *ir, const char *text, size_t len);
int grammar_compile_ir(grammar **out, const grammar_ir *ir, const char *root);

/* ----- vocabulary ----- */

struct grammar_vocab {
    int32_t n_vocab;
    uint8_t *bytes;         /* all token bytes */
    uint32_t *off;          /* n_vocab + 1 */
    int32_t *order;         /* tokens with bytes, sorted by bytes: rank -> id */
    int32_t n_order;
    int32_t *rank;          /* id -> rank, -1 when the token has no bytes */
    uint32_t max_len;
    /* prefix trie in preorder: node i extends its parent by byte tn_byte[i]; its subtree is
     * [i, tn_skip[i]); the tokens whose bytes end exactly here are ranks
     * [tn_rank[i], tn_rank[i] + tn_nrank[i]) */
    int32_t n_nodes;
    uint8_t *tn_byte;
    uint16_t *tn_depth;
    int32_t *tn_skip;
    int32_t *tn_rank;
    int32_t *tn_nrank;
    int32_t *tn_parent;     /* -1 at depth 1 */
    int32_t *tn_nchild;
    uint32_t *nonempty;     /* bitset of tokens with bytes */
};

/* ----- stacks: hash-consed frames (state, parent), truncated last-in first-out ----- */

#define GQ_COMPLETE (-1)    /* node 0 (real bottom) and 1 (unknown context) */
#define GQ_P0 (-2)          /* cache builder: the caller of rule `parent`, unknown */
#define GQ_W (-3)           /* cache builder: any caller of rule `parent` */

typedef struct {
    int32_t *q, *parent;
    uint8_t *ctx;           /* 1 when the frame lies above an unknown-context pop */
    uint64_t *h;            /* structural hash of the whole stack */
    uint32_t *slot;
    size_t n, cap;
    uint32_t *table;        /* node id + 1, 0 = empty; linear probing */
    size_t tmask;
} grammar_store;

int grammar_store_init(grammar_store *s, size_t cap);
void grammar_store_deinit(grammar_store *s);
/* Node id of frame (q, parent), creating it; -1 when out of memory. */
int32_t grammar_store_intern(grammar_store *s, int32_t q, int32_t parent);
void grammar_store_truncate(grammar_store *s, size_t n);

/* One step of the pushdown automaton: sets of nodes whose top state has byte edges, plus the
 * completion markers. */
typedef struct {
    const grammar *g;
    grammar_store *st;
    int32_t *out;
    size_t n_out, cap_out;
    uint32_t *wstamp;       /* per rule: popped to any caller already in this step */
    uint32_t *seen;         /* per node: in out already in this step (== stamp) */
    size_t cap_seen;
    uint32_t stamp;
    int depth;
    int no_w;               /* popping the unknown caller (GQ_P0) ends the stack instead */
    int p0_popped;          /* set (never cleared) when no_w ended a stack that way */
    int err;
} grammar_stepper;

int grammar_stepper_init(grammar_stepper *sp, const grammar *g, grammar_store *st);
void grammar_stepper_deinit(grammar_stepper *sp);
/* The expanded set that starts rule `rule` with caller `parent` (-1: bottom) into sp->out. */
int grammar_stepper_start(grammar_stepper *sp, int32_t rule, int32_t parent);
/* The expanded set after rule `rule` returns to any of its callers (as popping GQ_P0 does when
 * no_w is off) into sp->out. */
int grammar_stepper_callers(grammar_stepper *sp, int32_t rule);
/* out = the set after byte b from set in[0..n) (in must not alias sp->out). */
int grammar_stepper_step(grammar_stepper *sp, const int32_t *in, size_t n, uint8_t b);

/* ----- grammar x vocabulary: per-state token classes (mask.c) ----- */

typedef struct {
    int built;
    int dense;              /* acc is a bitset of n_vocab bits, else a list of ids */
    uint32_t *acc;          /* accepted whatever the stack below */
    uint32_t n_acc;
    int32_t *unc;           /* ranks to check against the whole stack */
    uint32_t n_unc;
} grammar_state_cache;

typedef struct {
    int32_t *ids;           /* tokens to check exactly while untriggered */
    size_t n;
} grammar_trigger_list;

/* A byte region: the states reached from a looping state through byte edges alone while no
 * state on the way can finish, call or return (at most GRAMMAR_REGION_MAX of them, numbered in
 * breadth-first order from the looping state: the shape does not depend on the rule). ok has a
 * bit per trie node: set when, entering the node from the region's first state, every token of
 * the node's subtree stays in the region (so it is consumed with the frame kept). */
#define GRAMMAR_REGION_MAX 64
typedef struct {
    int n;
    int8_t *table;          /* n x 256: byte -> region state index, -1 leaves the region,
                             * -2 no edge */
    uint64_t *ok;           /* n_nodes bits */
} grammar_region;

/* A shape (mask.c, shape_map): the byte region seen from a state, up to GRAMMAR_SHAPE_MAX
 * states breadth first, with its table (byte -> index, -1 leaves, -2 no edge); its roots
 * (index 0 and the states with many tokens into the region, at most GRAMMAR_SHAPE_ROOTS) each
 * get the tokens that stay in the region and the exits (trie node, index before its byte). A
 * copy is one occurrence of a shape in the grammar: its real states. */
#define GRAMMAR_SHAPE_MAX 1024
#define GRAMMAR_SHAPE_ROOTS 32
typedef struct {
    uint32_t *in_bits;      /* ids of the tokens that stay in the region */
    uint32_t n_in;
    int32_t *in_rng;        /* the same as rank ranges (lo, hi pairs) */
    size_t n_in_rng;
    int32_t (*exits)[2];
    size_t n_exits;
} grammar_shape_root;

typedef struct {
    int n;
    int16_t *table;         /* n x 256 */
    uint64_t hash;
    int n_roots;
    int16_t root_idx[GRAMMAR_SHAPE_ROOTS];
    grammar_shape_root *roots;
} grammar_shape;

typedef struct {
    int32_t shape;
    size_t off;             /* its states: copy_states[off .. off + shape's n) */
} grammar_copy;

struct grammar_index {
    const grammar *g;
    const grammar_vocab *v;
    grammar_state_cache *cache; /* n_states (only representatives' entries are filled) */
    int32_t *rep;           /* n_states: the representative of the state's cache class */
    int32_t n_classes;      /* cache classes (states with the same caches share one) */
    /* walks of first-byte subtrees of the trie, shared between states: key (class of the
     * state after the first byte, the byte) -> the subtree's accepted rank ranges (lo, hi
     * pairs) and uncertain ranks, slices of sub_ids */
    uint64_t *sub_key;      /* key + 1, 0 = empty; linear probing */
    uint32_t (*sub_val)[4]; /* acc offset, acc count, unc offset, unc count */
    size_t sub_mask, sub_n;
    int32_t *sub_ids;
    size_t n_sub_ids, cap_sub_ids;
    uint64_t sub_hits;
    int no_share;           /* tests: build every cache on its own (no classes, no sharing,
                             * no byte regions) */
    /* byte regions (see mask.c, region_get): per state -2 not looked at, -1 none, else an
     * index into regions; regions with equal shapes (in any rule) are one */
    int32_t *region_of;
    grammar_region *regions;
    size_t n_regions, cap_regions;
    /* shapes (mask.c): per state -2 not looked at, -1 none, else its copy and root slot */
    grammar_shape *shapes;
    size_t n_shapes, cap_shapes, shape_bytes;
    grammar_copy *copies;
    size_t n_copies, cap_copies;
    int32_t *copy_states;
    size_t n_copy_states, cap_copy_states;
    int32_t *shape_of;
    int16_t *shape_slot;
    int16_t *shape_at;      /* n_states: scratch of shape_map, -1 */
    int32_t first_tok[256]; /* tokens per first byte */
    uint64_t region_builds; /* caches built from a shape's shared result (tests) */
    uint64_t pop_unions;    /* pops in pass 2 answered by the pop memo (tests) */
    int8_t *region_at;      /* n_states: scratch of region_states, -1 */
    size_t bytes_used;
    double build_ms;
    /* builder scratch */
    grammar_store st;
    grammar_stepper sp;
    int32_t *depth_sets;
    size_t cap_depth_sets;
    size_t *depth_off;
    size_t *depth_mark;
    int32_t *tmp_acc, *tmp_unc; /* accepted rank ranges (lo, hi pairs); uncertain ranks */
    size_t cap_tmp_acc, cap_tmp_unc;
    size_t n_tok_acc;       /* tokens in the accepted ranges of the current build */
    size_t acc_floor;       /* ranges before this one belong to earlier subtrees: no merging */
    uint32_t *acc_stamp;    /* per rank: accepted in this build (== build_stamp) */
    uint32_t build_stamp;
    /* per trie node, == walk_stamp when pass 1 of the current subtree walk accepted every
     * token below the node; full_kids counts such children of nodes pass 1 entered */
    uint32_t *full_stamp, walk_stamp;
    int32_t *full_kids;
    int32_t *visited;       /* nodes pass 1 entered, in order */
    size_t n_visited, cap_visited;
    /* pop memo walks (mask.c, pop_walk): levels per depth below the pop node, the ranks */
    int32_t *pw_sets;
    size_t cap_pw_sets;
    size_t *pw_off, *pw_mark;
    int32_t *pw_list;
    size_t n_pw_list, cap_pw_list;
    int unc_unsorted;       /* a pop union added uncertain ranks in this subtree's pass 2 */
    int32_t *vq, *vp;       /* per depth: a level held as one (state, caller) pair... */
    uint8_t *virt;          /* ...when set (not interned: the walk's fast path) */
    /* lazy triggers: per trigger and matched-prefix length k, the rank range of tokens that
     * start with trigger[k..]; plus the tokens that contain a whole trigger */
    int32_t trig_lo[GRAMMAR_MAX_TRIGGERS][64], trig_hi[GRAMMAR_MAX_TRIGGERS][64];
    int32_t *trig_contain;
    size_t n_trig_contain;
};

int grammar_index_state(grammar_index *idx, int32_t q, const grammar_state_cache **out);

/* Checks tokens one by one against a set of stacks, sharing the work of common prefixes when
 * the tokens come in rank order. Keeps the store last-in first-out. */
typedef struct {
    const grammar_vocab *v;
    grammar_store *st;
    grammar_stepper *sp;
    int32_t *sets;          /* sets per depth, flat */
    size_t cap_sets;
    size_t *off;            /* depth d: sets[off[d] .. off[d + 1]) */
    size_t *mark;           /* store size when depth d was made */
    size_t depth;           /* depths 0..depth are valid */
    const uint8_t *prev;    /* bytes of the last token checked */
    uint32_t prev_len;
} grammar_checker;

int grammar_checker_init(grammar_checker *c, const grammar_vocab *v, grammar_store *st,
                         grammar_stepper *sp);
void grammar_checker_deinit(grammar_checker *c);
/* Start from set[0..n) (copied). */
int grammar_checker_begin(grammar_checker *c, const int32_t *set, size_t n);
/* 1 when bytes[0..len) can follow, 0 when not, < 0 on error. With `shared`, reuse the depths
 * of the common prefix with the previous call's bytes. */
int grammar_checker_try(grammar_checker *c, const uint8_t *bytes, uint32_t len, int shared);
/* Drop every frame made since begin. */
void grammar_checker_end(grammar_checker *c);

#define GRAMMAR_MEMO_SLOTS 32
#define GRAMMAR_MEMO_KEY 512

typedef struct {
    int used;
    uint64_t h;
    int32_t key_len;
    int32_t key[GRAMMAR_MEMO_KEY];
    uint32_t *bits;
} grammar_memo;

struct grammar_matcher {
    grammar_index *ix;
    const grammar *g;
    const grammar_vocab *v;
    grammar_store st;
    grammar_stepper sp;
    grammar_checker ck;
    int32_t *eog;
    int n_eog;
    /* parse sets per byte position: set i = sets[pos_off[i] .. pos_off[i + 1]), made when the
     * store had pos_mark[i] frames */
    int32_t *sets;
    size_t n_sets, cap_sets;
    size_t *pos_off, *pos_mark;
    size_t n_pos, cap_pos;
    /* per token: n_pos and free-text length before it, and whether it was end-of-generation */
    size_t *tok_pos, *tok_text;
    uint8_t *tok_eog;
    size_t n_tok, cap_tok;
    int finished;
    /* lazy mode: free text before the trigger (n_pos == 0 means not triggered) */
    uint8_t *text;
    size_t n_text, cap_text;
    size_t base_mark;
    /* mask scratch */
    int32_t *unc;
    size_t cap_unc;
    uint64_t *hs;
    size_t cap_hs;
    int32_t memo_key[GRAMMAR_MEMO_KEY];
    grammar_memo memo[GRAMMAR_MEMO_SLOTS];
    uint64_t memo_hits, memo_misses;
};

#endif
