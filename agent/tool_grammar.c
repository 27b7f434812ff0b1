/* Grammar set-up shared by the engine backend and the server's chat service. */
#include "tool_grammar_int.h"

#include <stdlib.h>
#include <string.h>

int agent_grammar_vocab_new(grammar_vocab **out, int32_t **eog, int *n_eog, const engine_model *m) {
    *out = NULL;
    *eog = NULL;
    *n_eog = 0;
    int32_t nv = engine_model_n_vocab(m);
    const char **pieces = calloc((size_t)nv, sizeof *pieces);
    uint32_t *lens = calloc((size_t)nv, sizeof *lens);
    int32_t *ids = malloc(64 * sizeof *ids);
    int n = 0, rc = 0;
    if (!pieces || !lens || !ids) {
        rc = agent_err(AGENT_ENOMEM, "out of memory");
        goto done;
    }
    for (int32_t i = 0; i < nv; i++) {
        if (engine_model_token_is_eog(m, i) && n < 64) ids[n++] = i;
        if (engine_model_token_is_special(m, i)) continue;
        size_t l = 0;
        pieces[i] = engine_model_token_bytes(m, i, &l);
        lens[i] = (uint32_t)l;
    }
    if (grammar_vocab_new(out, nv, pieces, lens) < 0) {
        rc = agent_err(AGENT_EINTERNAL, "grammar vocabulary: %s", grammar_error_last());
        goto done;
    }
    *eog = ids;
    *n_eog = n;
    ids = NULL;
done:
    free(pieces);
    free(lens);
    free(ids);
    return rc;
}

void agent_schema_relax(json_t *v, json_int_t max_len, bool xml) {
    agent_schema_relax_ex(v, max_len, xml, true);
}

void agent_schema_relax_ex(json_t *v, json_int_t max_len, bool xml, bool bound_all) {
    if (json_is_object(v)) {
        json_t *ty = json_object_get(v, "type");
        if (xml && json_is_string(ty) && !strcmp(json_string_value(ty), "string")) {
            /* the XML format's grammar takes a string parameter as raw text up to
             * </parameter> and supports no constraints on it */
            json_object_del(v, "minLength");
            json_object_del(v, "maxLength");
            json_object_del(v, "pattern");
            json_object_del(v, "format");
            return;
        }
        json_t *ml = json_object_get(v, "maxLength");
        if (json_is_integer(ml) && json_integer_value(ml) > max_len) ml = NULL;
        /* enum and const bound the string already (and refuse a length beside them) */
        bool fixed = json_object_get(v, "enum") || json_object_get(v, "const");
        bool is_str = json_is_string(ty) && !strcmp(json_string_value(ty), "string");
        if (is_str && !ml && !fixed) {
            if (bound_all) json_object_set_new(v, "maxLength", json_integer(max_len));
            else json_object_del(v, "maxLength"); /* larger than max_len: unbounded */
        }
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) agent_schema_relax_ex(x, max_len, xml, bound_all);
    } else if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) agent_schema_relax_ex(x, max_len, xml, bound_all);
    }
}

agent_toolcall_format agent_toolcall_format_of(const char *template_source) {
    return template_source && strstr(template_source, "<function=") ? AGENT_TOOLCALL_XML
                                                                    : AGENT_TOOLCALL_HERMES;
}
