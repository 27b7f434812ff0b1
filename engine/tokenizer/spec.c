/* engine_tokenizer_spec: construction, padding, and the Hugging Face tokenizer.json reader. */
#include "tokenizer.h"

#include "common.h"
#include "json.h"

#include <stdio.h>
#include <string.h>

/* The Qwen2 pre-tokenizer regex and its Qwen3.5 variant (marks in the letter runs), as
 * tokenizer.json spells them (we match them by hand: pretokenize.c). */
static const char QWEN2_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN35_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
    "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

int engine_tokenizer_spec_new(engine_tokenizer_spec **out, int32_t n_tokens, int32_t n_merges) {
    *out = NULL;
    if (n_tokens < 0 || n_merges < 0)
        return engine_err(ENGINE_EINVAL, "tokenizer spec: negative size");
    engine_tokenizer_spec *s = calloc(1, sizeof *s);
    if (!s) goto oom;
    s->bos_id = s->eos_id = s->pad_id = -1;
    s->model = dup_n("gpt2", 4);
    s->pre = dup_n("qwen2", 5);
    s->tokens = calloc((size_t)n_tokens + 1, sizeof *s->tokens);
    s->token_types = calloc((size_t)n_tokens + 1, sizeof *s->token_types);
    s->merges = calloc((size_t)n_merges + 1, sizeof *s->merges);
    s->n_tokens = n_tokens;
    s->n_merges = n_merges;
    if (!s->model || !s->pre || !s->tokens || !s->token_types || !s->merges) goto oom;
    *out = s;
    return 0;
oom:
    engine_tokenizer_spec_free(s);
    return engine_err(ENGINE_ENOMEM, "tokenizer spec: out of memory");
}

void engine_tokenizer_spec_free(engine_tokenizer_spec *s) {
    if (!s) return;
    if (s->tokens)
        for (int32_t i = 0; i < s->n_tokens; i++) free(s->tokens[i]);
    if (s->merges)
        for (int32_t i = 0; i < s->n_merges; i++) free(s->merges[i]);
    free(s->tokens);
    free(s->token_types);
    free(s->merges);
    free(s->model);
    free(s->pre);
    free(s->chat_template);
    free(s);
}

int engine_tokenizer_spec_set_string(char **field, const char *text, size_t len) {
    if (len && memchr(text, 0, len))
        return engine_err(ENGINE_EINVAL, "tokenizer spec: NUL byte inside a string");
    char *d = dup_n(text ? text : "", len);
    if (!d) return engine_err(ENGINE_ENOMEM, "tokenizer spec: out of memory");
    free(*field);
    *field = d;
    return 0;
}

int engine_tokenizer_spec_set_token(engine_tokenizer_spec *s, int32_t id, const char *text,
                                    size_t len, engine_token_type type) {
    if (id < 0 || id >= s->n_tokens)
        return engine_err(ENGINE_EINVAL, "tokenizer spec: token id %d out of range", (int)id);
    int rc = engine_tokenizer_spec_set_string(&s->tokens[id], text, len);
    if (rc) return rc;
    s->token_types[id] = (int32_t)type;
    return 0;
}

int engine_tokenizer_spec_set_merge(engine_tokenizer_spec *s, int32_t i, const char *text,
                                    size_t len) {
    if (i < 0 || i >= s->n_merges)
        return engine_err(ENGINE_EINVAL, "tokenizer spec: merge %d out of range", (int)i);
    return engine_tokenizer_spec_set_string(&s->merges[i], text, len);
}

int engine_tokenizer_spec_pad(engine_tokenizer_spec *s, int32_t n_vocab) {
    if (n_vocab < s->n_tokens)
        return engine_err(ENGINE_EINVAL, "tokenizer spec: cannot shrink %d tokens to %d",
                          (int)s->n_tokens, (int)n_vocab);
    if (n_vocab == s->n_tokens) return 0;
    char **t = realloc(s->tokens, ((size_t)n_vocab + 1) * sizeof *t);
    if (!t) return engine_err(ENGINE_ENOMEM, "tokenizer spec: out of memory");
    s->tokens = t;
    int32_t *ty = realloc(s->token_types, ((size_t)n_vocab + 1) * sizeof *ty);
    if (!ty) return engine_err(ENGINE_ENOMEM, "tokenizer spec: out of memory");
    s->token_types = ty;
    int32_t old = s->n_tokens;
    for (int32_t i = old; i < n_vocab; i++) {
        s->tokens[i] = NULL;
        s->token_types[i] = ENGINE_TOKEN_UNUSED;
    }
    s->n_tokens = n_vocab;
    for (int32_t i = old; i < n_vocab; i++) {
        char buf[32];
        int n = snprintf(buf, sizeof buf, "[PAD%d]", (int)i);
        int rc = engine_tokenizer_spec_set_token(s, i, buf, (size_t)n, ENGINE_TOKEN_UNUSED);
        if (rc) return rc;
    }
    return 0;
}

/* ---- Hugging Face reader ------------------------------------------------------------------ */

typedef struct {
    engine_json doc;
    const char *name;
} hf_file;

static bool is_str(const engine_json_node *n) { return n && n->type == ENGINE_JSON_STRING; }
static bool str_eq(const engine_json *d, const engine_json_node *n, const char *v) {
    return is_str(n) && n->len == strlen(v) && memcmp(engine_json_str(d, n), v, n->len) == 0;
}
static bool is_null_or_absent(const engine_json_node *n) {
    return !n || n->type == ENGINE_JSON_NULL;
}
static bool is_false_or_absent(const engine_json_node *n) {
    return !n || n->type == ENGINE_JSON_NULL || n->type == ENGINE_JSON_FALSE;
}
static bool is_empty_str_or_absent(const engine_json *d, const engine_json_node *n) {
    return is_null_or_absent(n) || str_eq(d, n, "");
}

/* What convert_hf_to_gguf.py's does_token_look_special() says for "<|...|>" style tokens. */
static bool looks_special(const char *t, size_t n) {
    return (n >= 4 && memcmp(t, "<|", 2) == 0 && memcmp(t + n - 2, "|>", 2) == 0) ||
           (n >= 6 && memcmp(t, "<\xef\xbd\x9c", 4) == 0 && memcmp(t + n - 4, "\xef\xbd\x9c>", 4) == 0);
}

/* The pipeline must be Qwen2's or Qwen3.5's; *qwen35 says which. */
static int check_pipeline(const engine_json *d, const engine_json_node *root, const char *name,
                          bool *qwen35) {
    const engine_json_node *norm = engine_json_get(d, root, "normalizer");
    if (!norm || !str_eq(d, engine_json_get(d, norm, "type"), "NFC"))
        return engine_err(ENGINE_EUNSUPPORTED,
                          "%s: unsupported normalizer (only the Qwen2 NFC normalizer)", name);
    const engine_json_node *pt = engine_json_get(d, root, "pre_tokenizer");
    const engine_json_node *seq = engine_json_get(d, pt, "pretokenizers");
    if (!str_eq(d, engine_json_get(d, pt, "type"), "Sequence") || !seq ||
        seq->type != ENGINE_JSON_ARRAY || seq->count != 2)
        return engine_err(ENGINE_EUNSUPPORTED, "%s: unsupported pre_tokenizer (only the Qwen2 "
                          "Sequence [Split, ByteLevel])", name);
    const engine_json_node *split = engine_json_first(d, seq), *bl = engine_json_next(d, split);
    const engine_json_node *pat = engine_json_get(d, split, "pattern");
    const engine_json_node *re = engine_json_get(d, pat, "Regex");
    *qwen35 = str_eq(d, re, QWEN35_PATTERN);
    if (!str_eq(d, engine_json_get(d, split, "type"), "Split") ||
        !(str_eq(d, re, QWEN2_PATTERN) || *qwen35) ||
        !str_eq(d, engine_json_get(d, split, "behavior"), "Isolated") ||
        !is_false_or_absent(engine_json_get(d, split, "invert")))
        return engine_err(ENGINE_EUNSUPPORTED, "%s: unsupported Split pre-tokenizer (only the "
                          "Qwen2 or Qwen3.5 regex, Isolated)", name);
    const engine_json_node *ups = engine_json_get(d, bl, "use_regex");
    if (!str_eq(d, engine_json_get(d, bl, "type"), "ByteLevel") ||
        !is_false_or_absent(engine_json_get(d, bl, "add_prefix_space")) ||
        !ups || ups->type != ENGINE_JSON_FALSE)
        return engine_err(ENGINE_EUNSUPPORTED, "%s: unsupported ByteLevel pre-tokenizer (needs "
                          "add_prefix_space=false, use_regex=false)", name);
    return 0;
}

/* "<|im_end|>" or {"content": "<|im_end|>", ...} -> its id in the spec, or -1 for null. */
static int special_id(const engine_tokenizer_spec *s, const engine_json *d,
                      const engine_json_node *v, const char *field, const char *name,
                      int32_t *out) {
    *out = -1;
    if (is_null_or_absent(v)) return 0;
    if (v->type == ENGINE_JSON_OBJECT) v = engine_json_get(d, v, "content");
    if (!is_str(v)) return engine_err(ENGINE_EFORMAT, "%s: %s is not a string", name, field);
    const char *t = engine_json_str(d, v);
    for (int32_t i = 0; i < s->n_tokens; i++) {
        if (s->tokens[i] && strlen(s->tokens[i]) == v->len && memcmp(s->tokens[i], t, v->len) == 0) {
            *out = i;
            return 0;
        }
    }
    return engine_err(ENGINE_EFORMAT, "%s: %s \"%.64s\" is not in the vocabulary", name, field, t);
}

static int read_config(engine_tokenizer_spec *s, const char *text, size_t len) {
    const char *name = "tokenizer_config.json";
    engine_json d;
    int rc = engine_json_parse(&d, text, len, name);
    if (rc) return rc;
    const engine_json_node *root = &d.nodes[0];
    if (root->type != ENGINE_JSON_OBJECT) {
        rc = engine_err(ENGINE_EFORMAT, "%s: not a JSON object", name);
        goto done;
    }
    if ((rc = special_id(s, &d, engine_json_get(&d, root, "bos_token"), "bos_token", name,
                         &s->bos_id)) ||
        (rc = special_id(s, &d, engine_json_get(&d, root, "eos_token"), "eos_token", name,
                         &s->eos_id)) ||
        (rc = special_id(s, &d, engine_json_get(&d, root, "pad_token"), "pad_token", name,
                         &s->pad_id)))
        goto done;
    const char *flags[2] = {"add_bos_token", "add_eos_token"};
    bool *dst[2] = {&s->add_bos, &s->add_eos};
    for (int i = 0; i < 2; i++) {
        const engine_json_node *f = engine_json_get(&d, root, flags[i]);
        if (is_null_or_absent(f)) continue;
        if (f->type != ENGINE_JSON_TRUE && f->type != ENGINE_JSON_FALSE) {
            rc = engine_err(ENGINE_EFORMAT, "%s: %s is not a boolean", name, flags[i]);
            goto done;
        }
        *dst[i] = f->type == ENGINE_JSON_TRUE;
    }
    const engine_json_node *ct = engine_json_get(&d, root, "chat_template");
    if (ct && ct->type == ENGINE_JSON_ARRAY) { /* [{"name": "default", "template": "..."}] */
        const engine_json_node *pick = NULL;
        for (const engine_json_node *e = engine_json_first(&d, ct); e; e = engine_json_next(&d, e))
            if (str_eq(&d, engine_json_get(&d, e, "name"), "default"))
                pick = engine_json_get(&d, e, "template");
        ct = pick;
    }
    if (!is_null_or_absent(ct)) {
        if (!is_str(ct)) {
            rc = engine_err(ENGINE_EFORMAT, "%s: chat_template is not a string", name);
            goto done;
        }
        rc = engine_tokenizer_spec_set_string(&s->chat_template, engine_json_str(&d, ct), ct->len);
        if (rc == ENGINE_EINVAL)
            rc = engine_err(ENGINE_EFORMAT, "%s: chat_template contains a NUL", name);
    }
done:
    engine_json_deinit(&d);
    return rc;
}

int engine_tokenizer_spec_from_hf(engine_tokenizer_spec **out, const char *tj, size_t tj_len,
                                  const char *cj, size_t cj_len) {
    const char *name = "tokenizer.json";
    engine_tokenizer_spec *s = NULL;
    engine_json d;
    *out = NULL;
    int rc = engine_json_parse(&d, tj, tj_len, name);
    if (rc) return rc;
    const engine_json_node *root = &d.nodes[0];
    const engine_json_node *model = engine_json_get(&d, root, "model");
    const engine_json_node *vocab = engine_json_get(&d, model, "vocab");
    const engine_json_node *merges = engine_json_get(&d, model, "merges");
    const engine_json_node *added = engine_json_get(&d, root, "added_tokens");
    if (root->type != ENGINE_JSON_OBJECT || !model || model->type != ENGINE_JSON_OBJECT) {
        rc = engine_err(ENGINE_EFORMAT, "%s: no \"model\" object", name);
        goto fail;
    }
    const engine_json_node *mt = engine_json_get(&d, model, "type");
    if (mt && !str_eq(&d, mt, "BPE")) {
        rc = engine_err(ENGINE_EUNSUPPORTED, "%s: model type is not BPE", name);
        goto fail;
    }
    if (!vocab || vocab->type != ENGINE_JSON_OBJECT || !merges || merges->type != ENGINE_JSON_ARRAY) {
        rc = engine_err(ENGINE_EFORMAT, "%s: model.vocab must be an object and model.merges an "
                        "array", name);
        goto fail;
    }
    if (!is_false_or_absent(engine_json_get(&d, model, "byte_fallback")) ||
        !is_false_or_absent(engine_json_get(&d, model, "ignore_merges")) ||
        !is_null_or_absent(engine_json_get(&d, model, "dropout")) ||
        !is_empty_str_or_absent(&d, engine_json_get(&d, model, "continuing_subword_prefix")) ||
        !is_empty_str_or_absent(&d, engine_json_get(&d, model, "end_of_word_suffix"))) {
        rc = engine_err(ENGINE_EUNSUPPORTED, "%s: unsupported BPE options (byte_fallback, "
                        "ignore_merges, dropout, subword prefix/suffix)", name);
        goto fail;
    }
    if (added && added->type != ENGINE_JSON_ARRAY) {
        rc = engine_err(ENGINE_EFORMAT, "%s: added_tokens is not an array", name);
        goto fail;
    }
    bool qwen35 = false;
    if ((rc = check_pipeline(&d, root, name, &qwen35))) goto fail;

    /* ids: vocab values and added token ids must cover 0..n-1 */
    int64_t max_id = -1;
    for (const engine_json_node *e = engine_json_first(&d, vocab); e; e = engine_json_next(&d, e)) {
        if (e->type != ENGINE_JSON_NUMBER || !e->is_int || e->ival < 0 || e->ival >= INT32_MAX / 2) {
            rc = engine_err(ENGINE_EFORMAT, "%s: vocab entry \"%.64s\" has a bad id", name,
                            engine_json_key(&d, e));
            goto fail;
        }
        if (e->ival > max_id) max_id = e->ival;
    }
    for (const engine_json_node *a = engine_json_first(&d, added); a; a = engine_json_next(&d, a)) {
        const engine_json_node *id = engine_json_get(&d, a, "id");
        if (!id || id->type != ENGINE_JSON_NUMBER || !id->is_int || id->ival < 0 ||
            id->ival >= INT32_MAX / 2 || !is_str(engine_json_get(&d, a, "content"))) {
            rc = engine_err(ENGINE_EFORMAT, "%s: added token without a valid id and content", name);
            goto fail;
        }
        if (id->ival > max_id) max_id = id->ival;
    }
    /* ids must cover 0..max_id, one a token: a larger id means gaps, and sizing the tables by it
     * would let a few bytes of hostile file ask for gigabytes */
    uint64_t n_named = (uint64_t)vocab->count + (added ? added->count : 0);
    if ((uint64_t)(max_id + 1) > n_named) {
        rc = engine_err(ENGINE_EUNSUPPORTED,
                        "%s: ids go up to %lld but there are only %llu tokens "
                        "(gaps in the vocabulary)",
                        name, (long long)max_id, (unsigned long long)n_named);
        goto fail;
    }
    if (merges->count > (uint32_t)INT32_MAX / 2) {
        rc = engine_err(ENGINE_EFORMAT, "%s: too many merges", name);
        goto fail;
    }
    if ((rc = engine_tokenizer_spec_new(&s, (int32_t)(max_id + 1), (int32_t)merges->count)))
        goto fail;
    if (qwen35 && (rc = engine_tokenizer_spec_set_string(&s->pre, "qwen35", 6))) goto fail;
    for (const engine_json_node *e = engine_json_first(&d, vocab); e; e = engine_json_next(&d, e)) {
        int32_t id = (int32_t)e->ival;
        if (s->tokens[id]) {
            rc = engine_err(ENGINE_EFORMAT, "%s: id %d used twice in the vocab", name, (int)id);
            goto fail;
        }
        if ((rc = engine_tokenizer_spec_set_token(s, id, engine_json_key(&d, e), e->klen,
                                                  ENGINE_TOKEN_NORMAL))) {
            if (rc == ENGINE_EINVAL) rc = engine_err(ENGINE_EFORMAT, "%s: NUL in token %d", name, (int)id);
            goto fail;
        }
    }
    for (const engine_json_node *a = engine_json_first(&d, added); a; a = engine_json_next(&d, a)) {
        const engine_json_node *c = engine_json_get(&d, a, "content");
        int32_t id = (int32_t)engine_json_get(&d, a, "id")->ival;
        const engine_json_node *sp = engine_json_get(&d, a, "special");
        const char *txt = engine_json_str(&d, c);
        if (!is_false_or_absent(engine_json_get(&d, a, "lstrip")) ||
            !is_false_or_absent(engine_json_get(&d, a, "rstrip")) ||
            !is_false_or_absent(engine_json_get(&d, a, "single_word")) ||
            !is_false_or_absent(engine_json_get(&d, a, "normalized"))) {
            rc = engine_err(ENGINE_EUNSUPPORTED, "%s: added token \"%.64s\" uses lstrip, rstrip, "
                            "single_word or normalized", name, txt);
            goto fail;
        }
        if (c->len == 0) {
            rc = engine_err(ENGINE_EFORMAT, "%s: empty added token %d", name, (int)id);
            goto fail;
        }
        if (s->tokens[id] && s->token_types[id] != ENGINE_TOKEN_NORMAL) {
            rc = engine_err(ENGINE_EFORMAT, "%s: added token id %d used twice", name, (int)id);
            goto fail;
        }
        if (s->tokens[id] && (strlen(s->tokens[id]) != c->len || memcmp(s->tokens[id], txt, c->len))) {
            rc = engine_err(ENGINE_EFORMAT, "%s: added token \"%.64s\" reuses vocab id %d", name,
                            txt, (int)id);
            goto fail;
        }
        bool special = sp && sp->type == ENGINE_JSON_TRUE;
        engine_token_type ty = special || looks_special(txt, c->len) ? ENGINE_TOKEN_CONTROL
                                                                     : ENGINE_TOKEN_USER_DEFINED;
        if ((rc = engine_tokenizer_spec_set_token(s, id, txt, c->len, ty))) {
            if (rc == ENGINE_EINVAL) rc = engine_err(ENGINE_EFORMAT, "%s: NUL in token %d", name, (int)id);
            goto fail;
        }
    }
    for (int32_t i = 0; i < s->n_tokens; i++) {
        if (!s->tokens[i]) {
            rc = engine_err(ENGINE_EUNSUPPORTED, "%s: no token has id %d (gaps in the vocabulary)",
                            name, (int)i);
            goto fail;
        }
    }
    int32_t mi = 0;
    for (const engine_json_node *m = engine_json_first(&d, merges); m; m = engine_json_next(&d, m), mi++) {
        char buf[1024];
        const char *txt;
        size_t len;
        if (is_str(m)) {
            txt = engine_json_str(&d, m);
            len = m->len;
            const char *sp = memchr(txt, ' ', len);
            if (!sp || sp == txt || sp == txt + len - 1 || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - txt))) {
                rc = engine_err(ENGINE_EFORMAT, "%s: merge %d is not \"left right\"", name, (int)mi);
                goto fail;
            }
        } else if (m->type == ENGINE_JSON_ARRAY && m->count == 2) {
            const engine_json_node *l = engine_json_first(&d, m), *r = engine_json_next(&d, l);
            if (!is_str(l) || !is_str(r) || !l->len || !r->len ||
                memchr(engine_json_str(&d, l), ' ', l->len) || memchr(engine_json_str(&d, r), ' ', r->len) ||
                (size_t)l->len + r->len + 2 > sizeof buf) {
                rc = engine_err(ENGINE_EFORMAT, "%s: merge %d is not two space-free strings", name,
                                (int)mi);
                goto fail;
            }
            memcpy(buf, engine_json_str(&d, l), l->len);
            buf[l->len] = ' ';
            memcpy(buf + l->len + 1, engine_json_str(&d, r), r->len);
            len = (size_t)l->len + 1 + r->len;
            txt = buf;
        } else {
            rc = engine_err(ENGINE_EFORMAT, "%s: merge %d is neither \"a b\" nor [\"a\", \"b\"]",
                            name, (int)mi);
            goto fail;
        }
        if ((rc = engine_tokenizer_spec_set_merge(s, mi, txt, len))) {
            if (rc == ENGINE_EINVAL) rc = engine_err(ENGINE_EFORMAT, "%s: NUL in merge %d", name, (int)mi);
            goto fail;
        }
    }
    engine_json_deinit(&d);
    if (cj && (rc = read_config(s, cj, cj_len))) goto fail_spec;
    *out = s;
    return 0;
fail:
    engine_json_deinit(&d);
fail_spec:
    engine_tokenizer_spec_free(s);
    return rc;
}

static int read_file(const char *path, char **data, size_t *len) {
    FILE *f = fopen(path, "rb");
    *data = NULL;
    if (!f) return engine_err(ENGINE_EIO, "%s: cannot open", path);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (n < cap) break;
        if (cap > ((size_t)1 << 31)) {
            free(buf);
            fclose(f);
            return engine_err(ENGINE_ERANGE, "%s: file too large", path);
        }
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    int err = ferror(f);
    fclose(f);
    if (!buf) return engine_err(ENGINE_ENOMEM, "%s: out of memory", path);
    if (err) {
        free(buf);
        return engine_err(ENGINE_EIO, "%s: read error", path);
    }
    *data = buf;
    *len = n;
    return 0;
}

int engine_tokenizer_spec_from_hf_files(engine_tokenizer_spec **out, const char *tokenizer_path,
                                        const char *config_path) {
    char *tj = NULL, *cj = NULL;
    size_t tl = 0, cl = 0;
    *out = NULL;
    int rc = read_file(tokenizer_path, &tj, &tl);
    if (!rc && config_path) rc = read_file(config_path, &cj, &cl);
    if (!rc) rc = engine_tokenizer_spec_from_hf(out, tj, tl, cj, cl);
    free(tj);
    free(cj);
    return rc;
}
