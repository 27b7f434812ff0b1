/* Private to agent/: grammar set-up shared by the engine backend and the server's chat service
 * (agent/tool_grammar.c). */
#ifndef SPARK_AGENT_TOOL_GRAMMAR_INT_H
#define SPARK_AGENT_TOOL_GRAMMAR_INT_H
#include "agent_int.h"

#include <jansson.h>

#include "grammar.h"

/* The grammar's view of model m's vocabulary: every token's bytes, control tokens with length
 * 0 (never allowed), and the model's end-of-generation ids (*eog, malloc'd, caller frees; at
 * most 64). AGENT_ENOMEM / AGENT_EINTERNAL with the grammar's message. */
int agent_grammar_vocab_new(grammar_vocab **out, int32_t **eog, int *n_eog, const engine_model *m);

/* The copy of an OpenAI tool array (or a schema) that the grammar compiler sees: every string
 * bounded at max_len characters unless a smaller maxLength is given (the compiler refuses
 * larger bounds); in the XML tool-call format string parameters lose their constraints (its
 * grammar takes them as raw text). Modifies v in place. The parsed call or document is still
 * checked against the full schema where the caller can. */
void agent_schema_relax(json_t *v, json_int_t max_len, bool xml);
/* The same; with bound_all false, a maxLength up to max_len is kept, a larger one dropped, and
 * strings without one stay unbounded: a bounded string is a chain of some 30 DFA states per
 * character, so bounding the strings of the built-in tool set at 1000 goes past the
 * compiler's limit of 262,144 states. */
void agent_schema_relax_ex(json_t *v, json_int_t max_len, bool xml, bool bound_all);

/* The tool-call format a chat template teaches: XML when it mentions "<function=". */
agent_toolcall_format agent_toolcall_format_of(const char *template_source);
#endif
