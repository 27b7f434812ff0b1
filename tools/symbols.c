/* Symbols with tree-sitter: file outlines and the repository map.
 *
 * Each language has one query. Definition patterns capture the whole definition under a kind
 * name (@function, @class, ...) and its name as @name; reference patterns capture @ref. The repo
 * map ranks files with PageRank over "file A references a name that file B defines" edges (as
 * Aider does), then hands each file's rank to the definitions others reference, and prints the
 * best definitions that fit the token budget. */
#include "tool_int.h"

#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <tree_sitter/api.h>
#include <unistd.h>

const TSLanguage *tree_sitter_c(void);
const TSLanguage *tree_sitter_cpp(void);
const TSLanguage *tree_sitter_python(void);
const TSLanguage *tree_sitter_javascript(void);
const TSLanguage *tree_sitter_typescript(void);
const TSLanguage *tree_sitter_tsx(void);
const TSLanguage *tree_sitter_go(void);
const TSLanguage *tree_sitter_rust(void);
const TSLanguage *tree_sitter_java(void);

#define C_DEFS                                                                                  \
    "(function_definition declarator: [(function_declarator declarator: (_) @name)"           \
    " (pointer_declarator declarator: (function_declarator declarator: (_) @name))"           \
    " (pointer_declarator declarator: (pointer_declarator declarator: (function_declarator"    \
    " declarator: (_) @name)))]) @function\n"                                                   \
    "(declaration declarator: [(function_declarator declarator: (identifier) @name)"          \
    " (pointer_declarator declarator: (function_declarator declarator: (identifier) @name))])" \
    " @prototype\n"                                                                             \
    "(struct_specifier name: (type_identifier) @name body: (field_declaration_list)) @struct\n" \
    "(union_specifier name: (type_identifier) @name body: (field_declaration_list)) @union\n"   \
    "(enum_specifier name: (type_identifier) @name body: (enumerator_list)) @enum\n"             \
    "(type_definition declarator: (type_identifier) @name) @type\n"                             \
    "(preproc_function_def name: (identifier) @name) @macro\n"                                  \
    "(preproc_def name: (identifier) @name) @macro\n"                                           \
    "(call_expression function: (identifier) @ref)\n"                                          \
    "(call_expression function: (field_expression field: (field_identifier) @ref))\n"          \
    "(type_identifier) @ref\n"

static const char Q_C[] = C_DEFS;

static const char Q_CPP[] =
    C_DEFS
    "(function_definition declarator: (reference_declarator (function_declarator declarator:"
    " (_) @name))) @function\n"
    "(class_specifier name: (type_identifier) @name body: (field_declaration_list)) @class\n"
    "(namespace_definition name: (namespace_identifier) @name) @namespace\n"
    "(field_declaration declarator: (function_declarator declarator: (field_identifier) @name))"
    " @method\n"
    "(alias_declaration name: (type_identifier) @name) @type\n"
    "(call_expression function: (qualified_identifier name: (identifier) @ref))\n";

static const char Q_PYTHON[] =
    "(function_definition name: (identifier) @name) @function\n"
    "(class_definition name: (identifier) @name) @class\n"
    "(call function: (identifier) @ref)\n"
    "(call function: (attribute attribute: (identifier) @ref))\n";

#define JS_COMMON                                                                              \
    "(function_declaration name: (identifier) @name) @function\n"                             \
    "(generator_function_declaration name: (identifier) @name) @function\n"                   \
    "(method_definition name: (property_identifier) @name) @method\n"                         \
    "(lexical_declaration (variable_declarator name: (identifier) @name value:"               \
    " [(arrow_function) (function_expression)])) @function\n"                                 \
    "(call_expression function: (identifier) @ref)\n"                                         \
    "(call_expression function: (member_expression property: (property_identifier) @ref))\n" \
    "(new_expression constructor: (identifier) @ref)\n"

static const char Q_JS[] = JS_COMMON "(class_declaration name: (identifier) @name) @class\n";

static const char Q_TS[] =
    JS_COMMON
    "(class_declaration name: (type_identifier) @name) @class\n"
    "(abstract_class_declaration name: (type_identifier) @name) @class\n"
    "(interface_declaration name: (type_identifier) @name) @interface\n"
    "(type_alias_declaration name: (type_identifier) @name) @type\n"
    "(enum_declaration name: (identifier) @name) @enum\n"
    "(method_signature name: (property_identifier) @name) @method\n"
    "(function_signature name: (identifier) @name) @function\n"
    "(type_identifier) @ref\n";

static const char Q_GO[] =
    "(function_declaration name: (identifier) @name) @function\n"
    "(method_declaration name: (field_identifier) @name) @method\n"
    "(type_spec name: (type_identifier) @name type: (struct_type)) @struct\n"
    "(type_spec name: (type_identifier) @name type: (interface_type)) @interface\n"
    "(type_spec name: (type_identifier) @name) @type\n"
    "(method_elem name: (field_identifier) @name) @method\n"
    "(call_expression function: (identifier) @ref)\n"
    "(call_expression function: (selector_expression field: (field_identifier) @ref))\n"
    "(type_identifier) @ref\n";

static const char Q_RUST[] =
    "(function_item name: (identifier) @name) @function\n"
    "(function_signature_item name: (identifier) @name) @function\n"
    "(struct_item name: (type_identifier) @name) @struct\n"
    "(enum_item name: (type_identifier) @name) @enum\n"
    "(union_item name: (type_identifier) @name) @union\n"
    "(trait_item name: (type_identifier) @name) @trait\n"
    "(impl_item type: (_) @name) @impl\n"
    "(type_item name: (type_identifier) @name) @type\n"
    "(mod_item name: (identifier) @name) @module\n"
    "(macro_definition name: (identifier) @name) @macro\n"
    "(const_item name: (identifier) @name) @constant\n"
    "(static_item name: (identifier) @name) @constant\n"
    "(call_expression function: (identifier) @ref)\n"
    "(call_expression function: (field_expression field: (field_identifier) @ref))\n"
    "(call_expression function: (scoped_identifier name: (identifier) @ref))\n"
    "(macro_invocation macro: (identifier) @ref)\n"
    "(type_identifier) @ref\n";

static const char Q_JAVA[] =
    "(class_declaration name: (identifier) @name) @class\n"
    "(interface_declaration name: (identifier) @name) @interface\n"
    "(enum_declaration name: (identifier) @name) @enum\n"
    "(record_declaration name: (identifier) @name) @class\n"
    "(annotation_type_declaration name: (identifier) @name) @interface\n"
    "(method_declaration name: (identifier) @name) @method\n"
    "(constructor_declaration name: (identifier) @name) @constructor\n"
    "(method_invocation name: (identifier) @ref)\n"
    "(object_creation_expression type: (type_identifier) @ref)\n"
    "(type_identifier) @ref\n";

typedef struct {
    const char *name;
    const TSLanguage *(*lang)(void);
    const char *query;
    const char *exts;   /* space-separated, each with its dot */
} lang_def;

static const lang_def LANGS[] = {
    {"c", tree_sitter_c, Q_C, ".c .h"},
    {"cpp", tree_sitter_cpp, Q_CPP, ".cc .cpp .cxx .c++ .hh .hpp .hxx .h++ .ipp .inl"},
    {"python", tree_sitter_python, Q_PYTHON, ".py .pyi"},
    {"javascript", tree_sitter_javascript, Q_JS, ".js .mjs .cjs .jsx"},
    {"typescript", tree_sitter_typescript, Q_TS, ".ts .mts .cts"},
    {"tsx", tree_sitter_tsx, Q_TS, ".tsx"},
    {"go", tree_sitter_go, Q_GO, ".go"},
    {"rust", tree_sitter_rust, Q_RUST, ".rs"},
    {"java", tree_sitter_java, Q_JAVA, ".java"},
};
#define N_LANGS (sizeof LANGS / sizeof LANGS[0])

static int lang_for(const char *path) {
    const char *dot = strrchr(path, '.');
    const char *slash = strrchr(path, '/');
    if (!dot || (slash && dot < slash)) return -1;
    size_t el = strlen(dot);
    for (size_t i = 0; i < N_LANGS; i++) {
        const char *e = LANGS[i].exts;
        while (*e) {
            size_t l = strcspn(e, " ");
            if (l == el && !memcmp(e, dot, l)) return (int)i;
            e += l;
            while (*e == ' ') e++;
        }
    }
    return -1;
}

/* Compiled queries for every language (compiled per call: microseconds per language). */
typedef struct {
    TSQuery *q[N_LANGS];
} query_set;

static void queries_free(query_set *qs) {
    for (size_t i = 0; i < N_LANGS; i++)
        if (qs->q[i]) ts_query_delete(qs->q[i]);
}

static int query_get(query_set *qs, int li, TSQuery **out) {
    if (!qs->q[li]) {
        const TSLanguage *l = LANGS[li].lang();
        uint32_t off;
        TSQueryError err;
        if (ts_language_version(l) < TREE_SITTER_MIN_COMPATIBLE_LANGUAGE_VERSION ||
            ts_language_version(l) > TREE_SITTER_LANGUAGE_VERSION)
            return tool_err(TOOL_EINTERNAL, "the %s grammar has ABI %u, the runtime takes %d-%d",
                            LANGS[li].name, ts_language_version(l),
                            TREE_SITTER_MIN_COMPATIBLE_LANGUAGE_VERSION,
                            TREE_SITTER_LANGUAGE_VERSION);
        qs->q[li] = ts_query_new(l, LANGS[li].query, (uint32_t)strlen(LANGS[li].query), &off, &err);
        if (!qs->q[li])
            return tool_err(TOOL_EINTERNAL, "the %s symbol query does not compile (error %d at "
                            "offset %u)", LANGS[li].name, (int)err, off);
    }
    *out = qs->q[li];
    return 0;
}

typedef struct {
    char *name;
    const char *kind;     /* static */
    uint32_t start_line, end_line;   /* 1-based */
    uint32_t start_byte, end_byte;
    char *signature;
    int parent;           /* index of the enclosing definition, or -1 */
} sym;

typedef struct {
    sym *defs;
    size_t n_defs, cap_defs;
    char **refs;          /* referenced names (with repeats) */
    size_t n_refs, cap_refs;
} file_syms;

static void file_syms_deinit(file_syms *f) {
    for (size_t i = 0; i < f->n_defs; i++) {
        free(f->defs[i].name);
        free(f->defs[i].signature);
    }
    free(f->defs);
    for (size_t i = 0; i < f->n_refs; i++) free(f->refs[i]);
    free(f->refs);
    memset(f, 0, sizeof *f);
}

static const char *const KINDS[] = {"function", "prototype", "struct", "union", "enum", "type",
                                    "macro", "class", "namespace", "method", "interface",
                                    "trait", "impl", "module", "constant", "constructor"};

static const char *kind_static(const char *k, uint32_t n) {
    for (size_t i = 0; i < sizeof KINDS / sizeof KINDS[0]; i++)
        if (strlen(KINDS[i]) == n && !memcmp(KINDS[i], k, n)) return KINDS[i];
    return NULL;
}

static bool has_methods(const char *k) {
    return !strcmp(k, "class") || !strcmp(k, "struct") || !strcmp(k, "impl") ||
           !strcmp(k, "trait") || !strcmp(k, "interface") || !strcmp(k, "union");
}

static bool container(const char *k) {
    return !strcmp(k, "class") || !strcmp(k, "struct") || !strcmp(k, "impl") ||
           !strcmp(k, "trait") || !strcmp(k, "interface") || !strcmp(k, "namespace") ||
           !strcmp(k, "module") || !strcmp(k, "union") || !strcmp(k, "enum");
}

static int sym_cmp(const void *a, const void *b) {
    const sym *x = a, *y = b;
    if (x->start_byte != y->start_byte) return x->start_byte < y->start_byte ? -1 : 1;
    return x->end_byte > y->end_byte ? -1 : x->end_byte < y->end_byte;
}

/* Parse `src` and collect definitions (and references when want_refs). */
static int extract(TSParser *parser, TSQueryCursor *cur, TSQuery *q, int li, const char *src,
                   size_t len, bool want_refs, file_syms *out) {
    memset(out, 0, sizeof *out);
    if (!ts_parser_set_language(parser, LANGS[li].lang()))
        return tool_err(TOOL_EINTERNAL, "tree-sitter refused the %s grammar", LANGS[li].name);
    ts_parser_set_timeout_micros(parser, 5u * 1000 * 1000);
    TSTree *tree = ts_parser_parse_string(parser, NULL, src, (uint32_t)len);
    if (!tree) {
        ts_parser_reset(parser);
        return tool_err(TOOL_EUNSUPPORTED, "parsing took too long");
    }
    ts_query_cursor_exec(cur, q, ts_tree_root_node(tree));
    TSQueryMatch m;
    int rc = 0;
    while (ts_query_cursor_next_match(cur, &m)) {
        TSNode def = {0}, name = {0};
        const char *kind = NULL;
        bool have_def = false, have_name = false;
        for (uint16_t i = 0; i < m.capture_count; i++) {
            uint32_t cl;
            const char *cn = ts_query_capture_name_for_id(q, m.captures[i].index, &cl);
            if (cl == 4 && !memcmp(cn, "name", 4)) {
                name = m.captures[i].node;
                have_name = true;
            } else if (cl == 3 && !memcmp(cn, "ref", 3)) {
                if (!want_refs) continue;
                TSNode n = m.captures[i].node;
                uint32_t s = ts_node_start_byte(n), e = ts_node_end_byte(n);
                if (e <= s || e - s > 200) continue;
                if (out->n_refs == out->cap_refs) {
                    size_t nc = out->cap_refs ? out->cap_refs * 2 : 64;
                    char **nr = realloc(out->refs, nc * sizeof *nr);
                    if (!nr) {
                        rc = tool_err(TOOL_ENOMEM, "out of memory");
                        goto done;
                    }
                    out->refs = nr;
                    out->cap_refs = nc;
                }
                if (!(out->refs[out->n_refs] = strndup(src + s, e - s))) {
                    rc = tool_err(TOOL_ENOMEM, "out of memory");
                    goto done;
                }
                out->n_refs++;
            } else if ((kind = kind_static(cn, cl))) {
                def = m.captures[i].node;
                have_def = true;
            }
        }
        if (!have_def || !have_name || !kind) continue;
        uint32_t ns = ts_node_start_byte(name), ne = ts_node_end_byte(name);
        if (ne <= ns || ne - ns > 300) continue;
        uint32_t ds = ts_node_start_byte(def), de = ts_node_end_byte(def);
        /* the same definition matched by two patterns (Go's type_spec): keep the first kind */
        bool dup = false;
        for (size_t i = out->n_defs; i-- > 0 && !dup;) {
            dup = out->defs[i].start_byte == ds && out->defs[i].end_byte == de;
            if (dup && !strcmp(out->defs[i].kind, "type")) out->defs[i].kind = kind;
        }
        if (dup) continue;
        if (out->n_defs == out->cap_defs) {
            size_t nc = out->cap_defs ? out->cap_defs * 2 : 32;
            sym *nd = realloc(out->defs, nc * sizeof *nd);
            if (!nd) {
                rc = tool_err(TOOL_ENOMEM, "out of memory");
                goto done;
            }
            out->defs = nd;
            out->cap_defs = nc;
        }
        sym *s = &out->defs[out->n_defs];
        memset(s, 0, sizeof *s);
        s->name = strndup(src + ns, ne - ns);
        /* signature: the definition's first line, trimmed */
        const char *ls = src + ds, *le = memchr(ls, '\n', de - ds);
        if (!le) le = src + de;
        while (ls < le && (*ls == ' ' || *ls == '\t')) ls++;
        size_t sl = (size_t)(le - ls);
        while (sl && (ls[sl - 1] == ' ' || ls[sl - 1] == '\r' || ls[sl - 1] == '{')) sl--;
        if (sl > 200) sl = 200;
        if (!memmem(ls, sl, src + ns, ne - ns)) {
            /* the name is not on the first line (typedef struct {...} name): say kind + name */
            size_t kl = strlen(kind), nl = ne - ns;
            s->signature = malloc(kl + nl + 2);
            if (s->signature) snprintf(s->signature, kl + nl + 2, "%s %.*s", kind, (int)nl, src + ns);
        } else {
            s->signature = strndup(ls, sl);
        }
        if (!s->name || !s->signature) {
            free(s->name);
            free(s->signature);
            rc = tool_err(TOOL_ENOMEM, "out of memory");
            goto done;
        }
        s->kind = kind;
        s->start_byte = ds;
        s->end_byte = de;
        s->start_line = ts_node_start_point(def).row + 1;
        s->end_line = ts_node_end_point(def).row + 1;
        s->parent = -1;
        out->n_defs++;
    }
    qsort(out->defs, out->n_defs, sizeof *out->defs, sym_cmp);
    /* parents by containment; functions inside a class-like parent are methods */
    for (size_t i = 0; i < out->n_defs; i++) {
        for (size_t j = i; j-- > 0;) {
            if (out->defs[j].end_byte >= out->defs[i].end_byte && container(out->defs[j].kind)) {
                out->defs[i].parent = (int)j;
                if (!strcmp(out->defs[i].kind, "function") && has_methods(out->defs[j].kind))
                    out->defs[i].kind = "method";
                break;
            }
        }
    }
done:
    ts_tree_delete(tree);
    if (rc < 0) file_syms_deinit(out);
    return rc;
}

static int load_source(tool_ctx *ctx, const char *rel, char **data, size_t *len) {
    int fd = tool_path_open(ctx, rel, O_RDONLY, 0, false);
    if (fd < 0) return fd;
    int rc = tool_fd_read_all(fd, ctx->opt.max_file_bytes, data, len);
    close(fd);
    if (rc < 0) return tool_err(rc, "%s: %s", rel, tool_error_last());
    if (len && tool_is_binary(*data, *len)) {
        free(*data);
        *data = NULL;
        return tool_err(TOOL_EBINARY, "%s is a binary file", rel);
    }
    return 0;
}

int tool_outline(tool_ctx *ctx, json_t *args, json_t *res) {
    char *rel = NULL, *src = NULL;
    size_t len = 0;
    query_set qs = {{0}};
    TSParser *parser = NULL;
    TSQueryCursor *cur = NULL;
    file_syms fs = {0};
    int rc = tool_path_clean(ctx, tool_arg_str(args, "path", NULL), &rel);
    if (rc < 0) return rc;
    int li = lang_for(rel);
    if (li < 0) {
        rc = tool_err(TOOL_EUNSUPPORTED, "no grammar for %s (outlines cover C, C++, Python, "
                      "JavaScript, TypeScript/TSX, Go, Rust and Java by file extension)", rel);
        goto done;
    }
    TSQuery *q;
    if ((rc = load_source(ctx, rel, &src, &len)) < 0 || (rc = query_get(&qs, li, &q)) < 0)
        goto done;
    parser = ts_parser_new();
    cur = ts_query_cursor_new();
    if (!parser || !cur) {
        rc = tool_err(TOOL_ENOMEM, "out of memory");
        goto done;
    }
    if ((rc = extract(parser, cur, q, li, src, len, false, &fs)) < 0) goto done;
    json_t *arr = json_array();
    for (size_t i = 0; i < fs.n_defs; i++) {
        sym *s = &fs.defs[i];
        json_t *x = json_object();
        json_object_set_new(x, "name", tool_json_text(s->name, strlen(s->name)));
        json_object_set_new(x, "kind", json_string(s->kind));
        json_object_set_new(x, "start_line", json_integer(s->start_line));
        json_object_set_new(x, "end_line", json_integer(s->end_line));
        if (s->parent >= 0)
            json_object_set_new(x, "parent", tool_json_text(fs.defs[s->parent].name,
                                                            strlen(fs.defs[s->parent].name)));
        json_object_set_new(x, "signature", tool_json_text(s->signature, strlen(s->signature)));
        json_array_append_new(arr, x);
    }
    json_object_set_new(res, "path", json_string(rel));
    json_object_set_new(res, "language", json_string(LANGS[li].name));
    json_object_set_new(res, "symbols", arr);
done:
    file_syms_deinit(&fs);
    if (cur) ts_query_cursor_delete(cur);
    if (parser) ts_parser_delete(parser);
    queries_free(&qs);
    free(src);
    free(rel);
    return rc;
}

/* ---- the repo map ---- */

/* A string -> index map (open addressing). */
typedef struct {
    char **keys;
    int *vals;
    size_t cap, n;
} strmap;

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int strmap_get(strmap *m, const char *k) {
    if (!m->cap) return -1;
    for (size_t i = hash_str(k) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->keys[i]) return -1;
        if (!strcmp(m->keys[i], k)) return m->vals[i];
    }
}

/* Insert k (borrowed; must outlive the map) with value v unless present; returns the value. */
static int strmap_put(strmap *m, const char *k, int v) {
    if ((m->n + 1) * 2 > m->cap) {
        size_t nc = m->cap ? m->cap * 2 : 256;
        char **nk = calloc(nc, sizeof *nk);
        int *nv = calloc(nc, sizeof *nv);
        if (!nk || !nv) {
            free(nk);
            free(nv);
            return -2;
        }
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->keys[i]) continue;
            size_t j = hash_str(m->keys[i]) & (nc - 1);
            while (nk[j]) j = (j + 1) & (nc - 1);
            nk[j] = m->keys[i];
            nv[j] = m->vals[i];
        }
        free(m->keys);
        free(m->vals);
        m->keys = nk;
        m->vals = nv;
        m->cap = nc;
    }
    size_t i = hash_str(k) & (m->cap - 1);
    for (; m->keys[i]; i = (i + 1) & (m->cap - 1))
        if (!strcmp(m->keys[i], k)) return m->vals[i];
    m->keys[i] = (char *)k;
    m->vals[i] = v;
    m->n++;
    return v;
}

static void strmap_free(strmap *m) {
    free(m->keys);
    free(m->vals);
}

typedef struct {
    char *path;
    file_syms fs;
} map_file;

typedef struct {
    tool_ctx *ctx;
    query_set qs;
    pthread_mutex_t mu;
    map_file *files;
    size_t n_files, cap_files;
    TSParser **parsers;
    TSQueryCursor **cursors;
    long parsed, failed;
    int rc;
} map_state;

static int map_cb(void *user, const tool_walk_entry *e, int worker) {
    map_state *s = user;
    if (e->is_dir) return 0;
    int li = lang_for(e->rel);
    if (li < 0) return 0;
    TSQuery *q = s->qs.q[li];
    char *src = NULL;
    size_t len = 0;
    int fd = openat(e->dirfd, e->name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return 0;
    int rc = tool_fd_read_all(fd, 1u << 20, &src, &len); /* skip generated giants */
    close(fd);
    if (rc < 0 || tool_is_binary(src, len)) {
        free(src);
        return 0;
    }
    map_file mf = {0};
    rc = extract(s->parsers[worker], s->cursors[worker], q, li, src, len, true, &mf.fs);
    free(src);
    pthread_mutex_lock(&s->mu);
    if (rc < 0) {
        s->failed++;
        pthread_mutex_unlock(&s->mu);
        return rc == TOOL_ENOMEM ? rc : 0;
    }
    s->parsed++;
    if (s->n_files == s->cap_files) {
        size_t nc = s->cap_files ? s->cap_files * 2 : 64;
        map_file *nf = realloc(s->files, nc * sizeof *nf);
        if (!nf) {
            pthread_mutex_unlock(&s->mu);
            file_syms_deinit(&mf.fs);
            return tool_err(TOOL_ENOMEM, "out of memory");
        }
        s->files = nf;
        s->cap_files = nc;
    }
    mf.path = strdup(e->rel);
    s->files[s->n_files++] = mf;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static int int_cmp(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static int file_cmp(const void *a, const void *b) {
    return strcmp(((const map_file *)a)->path, ((const map_file *)b)->path);
}

typedef struct {
    int file, def;
    double rank;
} ranked;

static int ranked_cmp(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->rank != y->rank) return x->rank > y->rank ? -1 : 1;
    if (x->file != y->file) return x->file - y->file;
    return x->def - y->def;
}

static int def_pos_cmp(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->file != y->file) return x->file - y->file;
    return x->def - y->def;
}

/* Weight of a referenced identifier: descriptive names count more, private ones less. */
static double name_weight(const char *n, int n_definers) {
    double w = 1.0;
    size_t l = strlen(n);
    bool mixed = false, under = false;
    for (size_t i = 1; i < l; i++) {
        if (n[i] == '_') under = true;
        if (n[i] >= 'A' && n[i] <= 'Z' && n[i - 1] >= 'a' && n[i - 1] <= 'z') mixed = true;
    }
    if ((mixed || under) && l >= 8) w *= 10;
    if (n[0] == '_') w *= 0.1;
    if (n_definers > 5) w *= 0.1;
    return w;
}

/* Render the chosen definitions (sorted by file, then position) as text. */
static char *render(map_state *s, ranked *sel, size_t n) {
    size_t cap = 4096, o = 0;
    char *t = malloc(cap);
    if (!t) return NULL;
    t[0] = '\0';
    int last_file = -1;
    for (size_t i = 0; i < n; i++) {
        map_file *f = &s->files[sel[i].file];
        sym *d = &f->fs.defs[sel[i].def];
        size_t need = strlen(f->path) + strlen(d->signature) + 64;
        if (o + need + 1 > cap) {
            cap = (o + need + 1) * 2;
            char *nt = realloc(t, cap);
            if (!nt) {
                free(t);
                return NULL;
            }
            t = nt;
        }
        if (sel[i].file != last_file) {
            o += (size_t)snprintf(t + o, cap - o, "%s:\n", f->path);
            last_file = sel[i].file;
        }
        o += (size_t)snprintf(t + o, cap - o, "%s%5u| %s\n", d->parent >= 0 ? "    " : "  ",
                              d->start_line, d->signature);
    }
    return t;
}

int tool_repo_map(tool_ctx *ctx, json_t *args, json_t *res) {
    char *rel = NULL;
    int rc = tool_path_clean(ctx, tool_arg_str(args, "path", "."), &rel);
    if (rc < 0) return rc;
    long budget = (long)tool_arg_int(args, "max_tokens", 2048);
    map_state s;
    memset(&s, 0, sizeof s);
    s.ctx = ctx;
    pthread_mutex_init(&s.mu, NULL);
    strmap defs_by_name = {0};
    int *definers = NULL, *def_next = NULL;
    double *pr = NULL, *npr = NULL, *out_w = NULL, *def_rank = NULL;
    size_t *def_base = NULL;
    ranked *rk = NULL;
    char *text = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t i = 0; i < N_LANGS; i++) {
        TSQuery *q;
        if ((rc = query_get(&s.qs, (int)i, &q)) < 0) goto done;
    }
    int nt = ctx->threads;
    s.parsers = calloc((size_t)nt, sizeof *s.parsers);
    s.cursors = calloc((size_t)nt, sizeof *s.cursors);
    if (!s.parsers || !s.cursors) {
        rc = tool_err(TOOL_ENOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < nt; i++) {
        s.parsers[i] = ts_parser_new();
        s.cursors[i] = ts_query_cursor_new();
        if (!s.parsers[i] || !s.cursors[i]) {
            rc = tool_err(TOOL_ENOMEM, "out of memory");
            goto done;
        }
    }
    tool_walk_opts o = {rel, 0, false, false, nt, NULL};
    if ((rc = tool_walk(ctx, &o, map_cb, &s)) < 0) goto done;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    qsort(s.files, s.n_files, sizeof *s.files, file_cmp);
    size_t nf = s.n_files;
    /* every definition name -> a chain of (file) definers */
    size_t total_defs = 0;
    def_base = calloc(nf + 1, sizeof *def_base);
    if (!def_base) {
        rc = tool_err(TOOL_ENOMEM, "out of memory");
        goto done;
    }
    for (size_t f = 0; f < nf; f++) {
        def_base[f] = total_defs;
        total_defs += s.files[f].fs.n_defs;
    }
    def_base[nf] = total_defs;
    /* names: index -> first definer in a linked list over (file) entries */
    size_t cap_names = total_defs + 1;
    definers = malloc(cap_names * sizeof *definers);      /* name -> head def id */
    def_next = malloc((total_defs + 1) * sizeof *def_next); /* def id -> next def id */
    int *name_of = malloc((total_defs + 1) * sizeof *name_of);
    int *n_definer_files = calloc(cap_names, sizeof *n_definer_files);
    def_rank = calloc(total_defs + 1, sizeof *def_rank);
    pr = malloc((nf + 1) * sizeof *pr);
    npr = malloc((nf + 1) * sizeof *npr);
    out_w = calloc(nf + 1, sizeof *out_w);
    if (!definers || !def_next || !name_of || !n_definer_files || !def_rank || !pr || !npr ||
        !out_w) {
        free(name_of);
        free(n_definer_files);
        rc = tool_err(TOOL_ENOMEM, "out of memory");
        goto done;
    }
    int n_names = 0;
    for (size_t f = 0; f < nf; f++) {
        for (size_t d = 0; d < s.files[f].fs.n_defs; d++) {
            sym *sd = &s.files[f].fs.defs[d];
            if (!strcmp(sd->kind, "impl") || !strcmp(sd->kind, "prototype")) {
                name_of[def_base[f] + d] = -1;
                continue;
            }
            int id = strmap_put(&defs_by_name, sd->name, n_names);
            if (id == -2) {
                free(name_of);
                free(n_definer_files);
                rc = tool_err(TOOL_ENOMEM, "out of memory");
                goto done;
            }
            if (id == n_names) {
                definers[n_names] = -1;
                n_names++;
            }
            int gid = (int)(def_base[f] + d);
            /* count distinct files: defs are grouped by file, so compare with the head */
            if (definers[id] < 0 || (size_t)definers[id] < def_base[f]) n_definer_files[id]++;
            def_next[gid] = definers[id];
            definers[id] = gid;
            name_of[gid] = id;
        }
    }
    /* edges: file f -> each definition (in another file) of a name f references, weighted by
     * how telling the name is and sqrt(times referenced); names defined in more than 50 files
     * say nothing about structure and are left out */
    int *def_file = malloc((total_defs + 1) * sizeof *def_file);
    int *ids = NULL;
    size_t n_edges = 0, cap_edges = 0;
    struct map_edge {
        int src, def;
        double w;
    } *edges = NULL;
    if (!def_file) {
        free(name_of);
        free(n_definer_files);
        rc = tool_err(TOOL_ENOMEM, "out of memory");
        goto done;
    }
    for (size_t f = 0; f < nf; f++)
        for (size_t g = def_base[f]; g < def_base[f + 1]; g++) def_file[g] = (int)f;
    for (size_t f = 0; f < nf && rc == 0; f++) {
        file_syms *fs = &s.files[f].fs;
        int *ni = realloc(ids, (fs->n_refs + 1) * sizeof *ids);
        if (!ni) {
            rc = tool_err(TOOL_ENOMEM, "out of memory");
            break;
        }
        ids = ni;
        size_t k = 0;
        for (size_t r = 0; r < fs->n_refs; r++) {
            int id = strmap_get(&defs_by_name, fs->refs[r]);
            if (id >= 0 && n_definer_files[id] <= 50) ids[k++] = id;
        }
        qsort(ids, k, sizeof *ids, int_cmp);
        for (size_t i = 0; i < k && rc == 0;) {
            size_t j = i;
            while (j < k && ids[j] == ids[i]) j++;
            int id = ids[i];
            const char *nm = s.files[def_file[definers[id]]].fs.defs[definers[id] -
                                                                     def_base[def_file[definers[id]]]].name;
            double w = name_weight(nm, n_definer_files[id]) * sqrt((double)(j - i));
            for (int g = definers[id]; g >= 0; g = def_next[g]) {
                if (def_file[g] == (int)f) continue;
                if (n_edges == cap_edges) {
                    size_t nc = cap_edges ? cap_edges * 2 : 1024;
                    struct map_edge *ne = realloc(edges, nc * sizeof *ne);
                    if (!ne) {
                        rc = tool_err(TOOL_ENOMEM, "out of memory");
                        break;
                    }
                    edges = ne;
                    cap_edges = nc;
                }
                edges[n_edges].src = (int)f;
                edges[n_edges].def = g;
                edges[n_edges++].w = w;
                out_w[f] += w;
            }
            i = j;
        }
    }
    free(ids);
    if (rc < 0) {
        free(edges);
        free(def_file);
        free(name_of);
        free(n_definer_files);
        goto done;
    }
    for (size_t f = 0; f < nf; f++) pr[f] = 1.0 / (double)(nf ? nf : 1);
    for (int iter = 0; iter < 30 && nf; iter++) {
        double dangling = 0;
        for (size_t f = 0; f < nf; f++) {
            npr[f] = 0;
            if (out_w[f] <= 0) dangling += pr[f];
        }
        for (size_t e = 0; e < n_edges; e++)
            npr[def_file[edges[e].def]] += 0.85 * pr[edges[e].src] * edges[e].w /
                                           out_w[edges[e].src];
        for (size_t f = 0; f < nf; f++) npr[f] += (0.15 + 0.85 * dangling) / (double)nf;
        double *t = pr;
        pr = npr;
        npr = t;
    }
    for (size_t e = 0; e < n_edges; e++)
        def_rank[edges[e].def] += pr[edges[e].src] * edges[e].w / out_w[edges[e].src];
    free(edges);
    free(def_file);
    free(n_definer_files);
    /* unreferenced definitions still get a little of their file's rank */
    rk = malloc((total_defs + 1) * sizeof *rk);
    if (!rk) {
        free(name_of);
        rc = tool_err(TOOL_ENOMEM, "out of memory");
        goto done;
    }
    size_t nr = 0;
    for (size_t f = 0; f < nf; f++)
        for (size_t d = 0; d < s.files[f].fs.n_defs; d++) {
            size_t g = def_base[f] + d;
            if (name_of[g] < 0) continue;
            rk[nr].file = (int)f;
            rk[nr].def = (int)d;
            rk[nr].rank = def_rank[g] + pr[f] * 1e-3 / (double)(s.files[f].fs.n_defs + 1);
            nr++;
        }
    free(name_of);
    qsort(rk, nr, sizeof *rk, ranked_cmp);
    /* the largest prefix of the ranking whose rendering fits the budget (binary search) */
    size_t lo = 0, hi = nr;
    while (lo < hi) {
        size_t mid = (lo + hi + 1) / 2;
        ranked *tmp = malloc(mid * sizeof *tmp);
        if (!tmp) {
            rc = tool_err(TOOL_ENOMEM, "out of memory");
            goto done;
        }
        memcpy(tmp, rk, mid * sizeof *tmp);
        qsort(tmp, mid, sizeof *tmp, def_pos_cmp);
        char *t = render(&s, tmp, mid);
        free(tmp);
        if (!t) {
            rc = tool_err(TOOL_ENOMEM, "out of memory");
            goto done;
        }
        long tokens = (long)(strlen(t) + 3) / 4;
        free(t);
        if (tokens <= budget) lo = mid;
        else hi = mid - 1;
    }
    qsort(rk, lo, sizeof *rk, def_pos_cmp);
    text = render(&s, rk, lo);
    if (!text) {
        rc = tool_err(TOOL_ENOMEM, "out of memory");
        goto done;
    }
    json_t *top = json_array();
    ranked *byrank = malloc((nf + 1) * sizeof *byrank);
    if (byrank) {
        for (size_t f = 0; f < nf; f++) {
            byrank[f].file = (int)f;
            byrank[f].def = 0;
            byrank[f].rank = pr[f];
        }
        qsort(byrank, nf, sizeof *byrank, ranked_cmp);
        for (size_t i = 0; i < nf && i < 10; i++)
            json_array_append_new(top, json_string(s.files[byrank[i].file].path));
        free(byrank);
    }
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    json_object_set_new(res, "map", tool_json_text(text, strlen(text)));
    json_object_set_new(res, "top_files", top);
    json_object_set_new(res, "symbols_shown", json_integer((json_int_t)lo));
    json_object_set_new(res, "symbols_total", json_integer((json_int_t)nr));
    json_object_set_new(res, "files_parsed", json_integer(s.parsed));
    if (s.failed) json_object_set_new(res, "files_failed", json_integer(s.failed));
    json_object_set_new(res, "tokens_estimated", json_integer((json_int_t)(strlen(text) + 3) / 4));
    json_object_set_new(res, "parse_seconds", json_real(secs));
done:
    free(text);
    free(rk);
    free(def_base);
    free(definers);
    free(def_next);
    free(def_rank);
    free(pr);
    free(npr);
    free(out_w);
    strmap_free(&defs_by_name);
    for (size_t f = 0; f < s.n_files; f++) {
        free(s.files[f].path);
        file_syms_deinit(&s.files[f].fs);
    }
    free(s.files);
    for (int i = 0; s.parsers && i < ctx->threads; i++)
        if (s.parsers[i]) ts_parser_delete(s.parsers[i]);
    for (int i = 0; s.cursors && i < ctx->threads; i++)
        if (s.cursors[i]) ts_query_cursor_delete(s.cursors[i]);
    free(s.parsers);
    free(s.cursors);
    queries_free(&s.qs);
    pthread_mutex_destroy(&s.mu);
    free(rel);
    return rc;
}
