/* The HTTP dialects' pure translators (agent/server/dialects.h) on the shapes real clients
 * send: a Claude Code-like Messages request, a Codex CLI-like Responses request, a
 * llama.vscode /infill request; the encoders' streams event by event and their complete
 * answers; malformed input answered in each dialect's own error shape. */
#include "server/dialects.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(c)                                                                               \
    do {                                                                                       \
        if (!(c)) {                                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);              \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)

static json_t *J(const char *text) {
    json_error_t e;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &e);
    if (!j) {
        fprintf(stderr, "bad test JSON line %d: %s\n", e.line, e.text);
        exit(2);
    }
    return j;
}

/* a equals the JSON text b (printed when not) */
static bool same(const json_t *a, const char *b) {
    json_t *jb = J(b);
    bool ok = a && json_equal((json_t *)a, jb);
    if (!ok) {
        char *sa = a ? json_dumps(a, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        char *sb = json_dumps(jb, JSON_COMPACT | JSON_SORT_KEYS);
        fprintf(stderr, "  got:  %s\n  want: %s\n", sa ? sa : "(null)", sb);
        free(sa);
        free(sb);
    }
    json_decref(jb);
    return ok;
}

/* ----- a recording SSE sink ----- */
typedef struct {
    json_t *events; /* [{"event": name or null, "data": {...}}] */
    int fail_after; /* > 0: the n-th send fails (client gone) */
    int sent;
} rec;

static int rec_sink(void *user, const char *event, const char *data, size_t len) {
    rec *r = user;
    if (r->fail_after && ++r->sent >= r->fail_after) return -1;
    json_error_t e;
    json_t *d = json_loadb(data, len, 0, &e);
    if (!d) {
        fprintf(stderr, "sink got invalid JSON: %.*s\n", (int)len, data);
        failures++;
        d = json_null();
    }
    if (memchr(data, '\n', len)) {
        fprintf(stderr, "sink got a newline inside an SSE data line\n");
        failures++;
    }
    json_array_append_new(r->events, json_pack("{s:s?, s:o}", "event", event, "data", d));
    return 0;
}

static const char *ev_name(rec *r, size_t i) {
    return json_string_value(json_object_get(json_array_get(r->events, i), "event"));
}

static json_t *ev_data(rec *r, size_t i) {
    return json_object_get(json_array_get(r->events, i), "data");
}

/* ----- Anthropic ----- */

static const char *CLAUDE_CODE_REQUEST =
    "{\"model\": \"claude-sonnet-4-5-20250929\", \"max_tokens\": 32000, \"stream\": true,"
    " \"temperature\": 1,"
    " \"system\": [{\"type\": \"text\", \"text\": \"You are Claude Code.\","
    "              \"cache_control\": {\"type\": \"ephemeral\"}},"
    "             {\"type\": \"text\", \"text\": \"Be brief.\"}],"
    " \"messages\": ["
    "  {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"<system-reminder>ctx</system-reminder>\"},"
    "                                   {\"type\": \"text\", \"text\": \"List the files\","
    "                                    \"cache_control\": {\"type\": \"ephemeral\"}}]},"
    "  {\"role\": \"assistant\", \"content\": [{\"type\": \"thinking\", \"thinking\": \"Use LS.\", \"signature\": \"x\"},"
    "      {\"type\": \"text\", \"text\": \"Listing.\"},"
    "      {\"type\": \"tool_use\", \"id\": \"toolu_01A\", \"name\": \"LS\", \"input\": {\"path\": \"/r\"}},"
    "      {\"type\": \"tool_use\", \"id\": \"toolu_01B\", \"name\": \"Read\", \"input\": {\"file_path\": \"/r/a\"}}]},"
    "  {\"role\": \"user\", \"content\": ["
    "      {\"type\": \"tool_result\", \"tool_use_id\": \"toolu_01A\", \"content\": \"a\\nb\"},"
    "      {\"type\": \"tool_result\", \"tool_use_id\": \"toolu_01B\", \"is_error\": true,"
    "       \"content\": [{\"type\": \"text\", \"text\": \"no such file\"},"
    "                     {\"type\": \"image\", \"source\": {\"type\": \"base64\", \"media_type\": \"image/png\", \"data\": \"AA==\"}}]},"
    "      {\"type\": \"text\", \"text\": \"Continue\"}]},"
    "  {\"role\": \"assistant\", \"content\": \"Sure\"},"
    "  {\"role\": \"user\", \"content\": \"Go\"}],"
    " \"tools\": [{\"name\": \"LS\", \"description\": \"List a directory\","
    "             \"input_schema\": {\"type\": \"object\", \"properties\": {\"path\": {\"type\": \"string\"}},"
    "                              \"required\": [\"path\"]}},"
    "            {\"name\": \"Read\", \"input_schema\": {\"type\": \"object\"}},"
    "            {\"type\": \"web_search_20250305\", \"name\": \"web_search\", \"max_uses\": 5}],"
    " \"tool_choice\": {\"type\": \"any\", \"disable_parallel_tool_use\": true},"
    " \"stop_sequences\": [\"\\n\\nHuman:\"],"
    " \"metadata\": {\"user_id\": \"u1\"}}";

static void test_anthropic_request(void) {
    json_t *body = J(CLAUDE_CODE_REQUEST), *notes = json_array();
    agent_chat_xlat x;
    agent_dialect_err e = {0};
    CHECK(agent_anthropic_to_chat(body, false, 512, &x, notes, &e) == 0);
    CHECK(x.stream);
    CHECK(same(x.req.messages,
               "[{\"role\":\"system\",\"content\":\"You are Claude Code.\\nBe brief.\"},"
               " {\"role\":\"user\",\"content\":\"<system-reminder>ctx</system-reminder>\\nList the files\"},"
               " {\"role\":\"assistant\",\"content\":\"Listing.\",\"reasoning_content\":\"Use LS.\","
               "  \"tool_calls\":[{\"id\":\"toolu_01A\",\"type\":\"function\",\"function\":{\"name\":\"LS\",\"arguments\":\"{\\\"path\\\":\\\"/r\\\"}\"}},"
               "                {\"id\":\"toolu_01B\",\"type\":\"function\",\"function\":{\"name\":\"Read\",\"arguments\":\"{\\\"file_path\\\":\\\"/r/a\\\"}\"}}]},"
               " {\"role\":\"tool\",\"tool_call_id\":\"toolu_01A\",\"content\":\"a\\nb\"},"
               " {\"role\":\"tool\",\"tool_call_id\":\"toolu_01B\",\"content\":\"Error: no such file\\n[non-text content omitted: this model reads text only]\"},"
               " {\"role\":\"user\",\"content\":\"Continue\"},"
               " {\"role\":\"assistant\",\"content\":\"Sure\"},"
               " {\"role\":\"user\",\"content\":\"Go\"}]"));
    CHECK(same(x.req.tools,
               "[{\"type\":\"function\",\"function\":{\"name\":\"LS\",\"description\":\"List a directory\","
               "  \"parameters\":{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\"}},\"required\":[\"path\"]}}},"
               " {\"type\":\"function\",\"function\":{\"name\":\"Read\",\"parameters\":{\"type\":\"object\"}}}]"));
    CHECK(x.req.tool_choice == SRV_TOOLS_REQUIRED);
    CHECK(!x.req.parallel_tool_calls);
    CHECK(x.req.sampling.max_tokens == 32000);
    CHECK(x.req.sampling.temperature == 1.0f);
    CHECK(x.req.sampling.n_stop == 1 && !strcmp(x.req.sampling.stop[0], "\n\nHuman:"));
    /* the server tool and the image were left out, with notes */
    CHECK(json_array_size(notes) == 2);
    agent_chat_xlat_clear(&x);
    json_decref(body);

    /* count_tokens needs no max_tokens; a named tool choice */
    body = J("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
             "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],"
             "\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"}}");
    CHECK(agent_anthropic_to_chat(body, true, 512, &x, NULL, &e) == 0);
    CHECK(x.req.tool_choice == SRV_TOOLS_NAMED && !strcmp(x.req.tool_name, "f"));
    CHECK(x.req.sampling.max_tokens == 512);
    agent_chat_xlat_clear(&x);
    CHECK(agent_anthropic_to_chat(body, false, 512, &x, NULL, &e) == AGENT_EINVAL);
    CHECK(e.status == 400 && !strcmp(e.param, "max_tokens"));
    agent_chat_xlat_clear(&x);
    json_decref(body);
    json_decref(notes);
}

static void anthropic_refuses(const char *body_text, const char *param, const char *needle) {
    json_t *body = J(body_text);
    agent_chat_xlat x;
    agent_dialect_err e = {0};
    int rc = agent_anthropic_to_chat(body, false, 512, &x, NULL, &e);
    CHECK(rc == AGENT_EINVAL);
    CHECK(e.status == 400 && !strcmp(e.type, "invalid_request_error"));
    if (param && strcmp(e.param, param)) {
        fprintf(stderr, "  param was '%s' (wanted '%s') for %s\n", e.param, param, body_text);
        failures++;
    }
    if (!strstr(e.message, needle)) {
        fprintf(stderr, "  message was '%s' (wanted '%s')\n", e.message, needle);
        failures++;
    }
    char *eb = agent_anthropic_error_body(&e);
    json_t *j = J(eb);
    CHECK(!strcmp(json_string_value(json_object_get(j, "type")), "error"));
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(j, "error"), "type")),
                  "invalid_request_error"));
    CHECK(json_is_string(json_object_get(json_object_get(j, "error"), "message")));
    json_decref(j);
    free(eb);
    agent_chat_xlat_clear(&x);
    json_decref(body);
}

static void test_anthropic_errors(void) {
    anthropic_refuses("[]", "", "JSON object");
    anthropic_refuses("{\"max_tokens\":5}", "messages", "non-empty array");
    anthropic_refuses("{\"max_tokens\":0,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                      "max_tokens", "integer >= 1");
    anthropic_refuses("{\"max_tokens\":5,\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}",
                      "messages.0", "user");
    anthropic_refuses("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
                      "\"image\",\"source\":{}}]}]}", "messages.0.content.0", "image");
    anthropic_refuses("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":"
                      "\"x\"}]}]}", "messages.0.content.0", "type");
    anthropic_refuses("{\"max_tokens\":5,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":"
                      "\"tool_use\",\"id\":\"a\",\"name\":\"f\",\"input\":[1]}]}]}",
                      "messages.0.content.0", "object input");
    anthropic_refuses("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                      "\"tools\":[{\"name\":\"f\"}]}", "tools.0", "input_schema");
    anthropic_refuses("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                      "\"tool_choice\":{\"type\":\"sometimes\"}}", "tool_choice.type", "sometimes");
    anthropic_refuses("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                      "\"temperature\":1.5}", "temperature", "[0, 1]");
    anthropic_refuses("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                      "\"stop_sequences\":[\"\"]}", "stop_sequences", "non-empty");
    anthropic_refuses("{\"max_tokens\":5,\"stream\":\"yes\",\"messages\":[{\"role\":\"user\","
                      "\"content\":\"x\"}]}", "stream", "boolean");
}

static void test_anthropic_stream(void) {
    rec r = {json_array(), 0, 0};
    agent_anthropic_enc *e;
    CHECK(agent_anthropic_enc_new(&e, "claude-x", true, 17, rec_sink, &r) == 0);
    /* "Hé" split inside the é, then a tool call, then more text after it */
    CHECK(agent_anthropic_enc_text(e, "H\xC3", 2) == 0);
    CHECK(agent_anthropic_enc_text(e, "\xA9!", 2) == 0);
    CHECK(agent_anthropic_enc_tool(e, 0, "call_1", "LS", "{\"path\":", 8) == 0);
    CHECK(agent_anthropic_enc_tool(e, 0, NULL, NULL, "\"/r\"}", 5) == 0);
    CHECK(agent_anthropic_enc_tool(e, 1, "call_2", "Read", "{}", 2) == 0);
    agent_dialect_done d = {"tool_calls", NULL, {100, 9, 64, 0}};
    char *body = (char *)1;
    CHECK(agent_anthropic_enc_done(e, &d, &body) == 0 && body == NULL);
    agent_anthropic_enc_free(e);
    const char *want[] = {"message_start", "ping", "content_block_start", "content_block_delta",
                          "content_block_delta", "content_block_stop", "content_block_start",
                          "content_block_delta", "content_block_delta", "content_block_stop",
                          "content_block_start", "content_block_delta", "content_block_stop",
                          "message_delta", "message_stop"};
    size_t n = sizeof want / sizeof want[0];
    CHECK(json_array_size(r.events) == n);
    for (size_t i = 0; i < n && i < json_array_size(r.events); i++) {
        if (strcmp(ev_name(&r, i), want[i])) {
            fprintf(stderr, "  event %zu: %s (wanted %s)\n", i, ev_name(&r, i), want[i]);
            failures++;
        }
        /* every data object names its own event type */
        CHECK(!strcmp(json_string_value(json_object_get(ev_data(&r, i), "type")), want[i]));
    }
    json_t *start = json_object_get(ev_data(&r, 0), "message");
    CHECK(!strncmp(json_string_value(json_object_get(start, "id")), "msg_", 4));
    CHECK(same(json_object_get(start, "usage"), "{\"input_tokens\":17,\"output_tokens\":0}"));
    CHECK(same(json_object_get(start, "content"), "[]"));
    CHECK(same(ev_data(&r, 2), "{\"type\":\"content_block_start\",\"index\":0,"
                               "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}"));
    /* the split character is sent whole, in the second delta */
    CHECK(same(ev_data(&r, 3), "{\"type\":\"content_block_delta\",\"index\":0,"
                               "\"delta\":{\"type\":\"text_delta\",\"text\":\"H\"}}"));
    CHECK(same(ev_data(&r, 4), "{\"type\":\"content_block_delta\",\"index\":0,"
                               "\"delta\":{\"type\":\"text_delta\",\"text\":\"\xC3\xA9!\"}}"));
    CHECK(same(ev_data(&r, 6), "{\"type\":\"content_block_start\",\"index\":1,"
                               "\"content_block\":{\"type\":\"tool_use\",\"id\":\"call_1\","
                               "\"name\":\"LS\",\"input\":{}}}"));
    CHECK(same(ev_data(&r, 7), "{\"type\":\"content_block_delta\",\"index\":1,\"delta\":"
                               "{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"path\\\":\"}}"));
    CHECK(same(ev_data(&r, 9), "{\"type\":\"content_block_stop\",\"index\":1}"));
    CHECK(same(ev_data(&r, 13), "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\","
                                "\"stop_sequence\":null},\"usage\":{\"input_tokens\":36,"
                                "\"output_tokens\":9,\"cache_creation_input_tokens\":0,"
                                "\"cache_read_input_tokens\":64}}"));
    json_decref(r.events);

    /* the client goes away: the encoder fails and stays failed */
    rec g = {json_array(), 3, 0};
    CHECK(agent_anthropic_enc_new(&e, "m", true, 0, rec_sink, &g) == 0);
    CHECK(agent_anthropic_enc_text(e, "a", 1) < 0);
    CHECK(agent_anthropic_enc_text(e, "b", 1) < 0);
    agent_anthropic_enc_free(e);
    json_decref(g.events);
}

static void test_anthropic_whole(void) {
    agent_anthropic_enc *e;
    CHECK(agent_anthropic_enc_new(&e, "m", false, 0, NULL, NULL) == 0);
    CHECK(agent_anthropic_enc_text(e, "Done", 4) == 0);
    agent_dialect_done d = {"stop", NULL, {10, 1, 0, 0}};
    char *body = NULL;
    CHECK(agent_anthropic_enc_done(e, &d, &body) == 0 && body);
    json_t *j = J(body);
    CHECK(!strncmp(json_string_value(json_object_get(j, "id")), "msg_", 4));
    json_object_del(j, "id");
    CHECK(same(j, "{\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\","
                  "\"content\":[{\"type\":\"text\",\"text\":\"Done\"}],\"stop_reason\":\"end_turn\","
                  "\"stop_sequence\":null,\"usage\":{\"input_tokens\":10,\"output_tokens\":1,"
                  "\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0}}"));
    json_decref(j);
    free(body);
    agent_anthropic_enc_free(e);

    /* max_tokens, a stop sequence, invalid UTF-8 from the model, a tool call's bad JSON */
    CHECK(agent_anthropic_enc_new(&e, "m", false, 0, NULL, NULL) == 0);
    CHECK(agent_anthropic_enc_text(e, "a\xFF" "b\xE2\x82", 5) == 0);
    CHECK(agent_anthropic_enc_tool(e, 0, "c", "f", "[1]", 3) == 0);
    agent_dialect_done d2 = {"length", NULL, {3, 2, 0, 0}};
    CHECK(agent_anthropic_enc_done(e, &d2, &body) == 0);
    j = J(body);
    CHECK(same(json_object_get(j, "content"),
               "[{\"type\":\"text\",\"text\":\"a\xEF\xBF\xBD" "b\xEF\xBF\xBD\"},"
               " {\"type\":\"tool_use\",\"id\":\"c\",\"name\":\"f\",\"input\":{\"_arguments\":\"[1]\"}}]"));
    CHECK(!strcmp(json_string_value(json_object_get(j, "stop_reason")), "max_tokens"));
    json_decref(j);
    free(body);
    agent_anthropic_enc_free(e);

    CHECK(agent_anthropic_enc_new(&e, "m", false, 0, NULL, NULL) == 0);
    CHECK(agent_anthropic_enc_text(e, "x", 1) == 0);
    agent_dialect_done d3 = {"stop", "END", {3, 2, 0, 0}};
    CHECK(agent_anthropic_enc_done(e, &d3, &body) == 0);
    j = J(body);
    CHECK(!strcmp(json_string_value(json_object_get(j, "stop_reason")), "stop_sequence"));
    CHECK(!strcmp(json_string_value(json_object_get(j, "stop_sequence")), "END"));
    json_decref(j);
    free(body);
    agent_anthropic_enc_free(e);

    char *c = agent_anthropic_count_body(42);
    CHECK(c && !strcmp(c, "{\"input_tokens\":42}"));
    free(c);
}

/* ----- Responses ----- */

static const char *CODEX_REQUEST =
    "{\"model\": \"gpt-5-codex\", \"instructions\": \"You are Codex.\","
    " \"input\": ["
    "  {\"type\": \"message\", \"role\": \"developer\", \"content\": [{\"type\": \"input_text\", \"text\": \"<permissions>ro</permissions>\"}]},"
    "  {\"type\": \"message\", \"role\": \"user\", \"content\": [{\"type\": \"input_text\", \"text\": \"<environment_context>cwd</environment_context>\"}]},"
    "  {\"type\": \"message\", \"role\": \"user\", \"content\": [{\"type\": \"input_text\", \"text\": \"fix the bug\"}]},"
    "  {\"type\": \"reasoning\", \"id\": \"rs_1\", \"summary\": [], \"encrypted_content\": \"gAAA\"},"
    "  {\"type\": \"message\", \"role\": \"assistant\", \"content\": [{\"type\": \"output_text\", \"text\": \"Looking.\"}]},"
    "  {\"type\": \"function_call\", \"call_id\": \"call_a\", \"name\": \"shell\", \"arguments\": \"{\\\"command\\\":[\\\"ls\\\"]}\"},"
    "  {\"type\": \"function_call\", \"call_id\": \"call_b\", \"name\": \"shell\", \"arguments\": \"{}\"},"
    "  {\"type\": \"function_call_output\", \"call_id\": \"call_a\", \"output\": \"a.c\"},"
    "  {\"type\": \"function_call_output\", \"call_id\": \"call_b\", \"output\": [{\"type\": \"input_text\", \"text\": \"err\"}]},"
    "  {\"type\": \"local_shell_call\", \"call_id\": \"x\", \"action\": {}},"
    "  {\"role\": \"user\", \"content\": \"go on\"}],"
    " \"tools\": [{\"type\": \"function\", \"name\": \"shell\", \"description\": \"Runs a command\", \"strict\": false,"
    "             \"parameters\": {\"type\": \"object\", \"properties\": {\"command\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}},"
    "                            \"required\": [\"command\"], \"additionalProperties\": false}},"
    "            {\"type\": \"web_search\"},"
    "            {\"type\": \"custom\", \"name\": \"apply_patch\", \"format\": {\"type\": \"grammar\"}},"
    "            {\"type\": \"function\", \"name\": \"update_plan\", \"parameters\": null}],"
    " \"tool_choice\": \"auto\", \"parallel_tool_calls\": false,"
    " \"reasoning\": {\"effort\": \"medium\", \"summary\": \"auto\"}, \"store\": false, \"stream\": true,"
    " \"include\": [\"reasoning.encrypted_content\"], \"prompt_cache_key\": \"k\"}";

static void test_responses_request(void) {
    json_t *body = J(CODEX_REQUEST), *notes = json_array();
    agent_chat_xlat x;
    agent_dialect_err e = {0};
    CHECK(agent_responses_to_chat(body, 700, &x, notes, &e) == 0);
    CHECK(x.stream);
    CHECK(same(x.req.messages,
               "[{\"role\":\"system\",\"content\":\"You are Codex.\"},"
               " {\"role\":\"system\",\"content\":\"<permissions>ro</permissions>\"},"
               " {\"role\":\"user\",\"content\":\"<environment_context>cwd</environment_context>\"},"
               " {\"role\":\"user\",\"content\":\"fix the bug\"},"
               " {\"role\":\"assistant\",\"content\":\"Looking.\",\"tool_calls\":["
               "   {\"id\":\"call_a\",\"type\":\"function\",\"function\":{\"name\":\"shell\",\"arguments\":\"{\\\"command\\\":[\\\"ls\\\"]}\"}},"
               "   {\"id\":\"call_b\",\"type\":\"function\",\"function\":{\"name\":\"shell\",\"arguments\":\"{}\"}}]},"
               " {\"role\":\"tool\",\"tool_call_id\":\"call_a\",\"content\":\"a.c\"},"
               " {\"role\":\"tool\",\"tool_call_id\":\"call_b\",\"content\":\"err\"},"
               " {\"role\":\"user\",\"content\":\"go on\"}]"));
    CHECK(same(x.req.tools,
               "[{\"type\":\"function\",\"function\":{\"name\":\"shell\",\"description\":\"Runs a command\","
               "  \"parameters\":{\"type\":\"object\",\"properties\":{\"command\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},"
               "  \"required\":[\"command\"],\"additionalProperties\":false}}},"
               " {\"type\":\"function\",\"function\":{\"name\":\"update_plan\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}}]"));
    CHECK(x.req.tool_choice == SRV_TOOLS_AUTO);
    CHECK(!x.req.parallel_tool_calls);
    CHECK(x.req.sampling.max_tokens == 700);
    /* web_search, custom apply_patch and the local_shell_call item were tolerated */
    CHECK(json_array_size(notes) == 3);
    CHECK(same(json_object_get(x.echo, "tool_choice"), "\"auto\""));
    agent_chat_xlat_clear(&x);
    json_decref(body);

    /* a plain string input, json_schema output, a named function */
    body = J("{\"input\":\"hi\",\"max_output_tokens\":9,\"temperature\":0,"
             "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}],"
             "\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"},"
             "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"o\",\"schema\":{\"type\":\"object\"}}}}");
    CHECK(agent_responses_to_chat(body, 700, &x, NULL, &e) == 0);
    CHECK(same(x.req.messages, "[{\"role\":\"user\",\"content\":\"hi\"}]"));
    CHECK(x.req.tool_choice == SRV_TOOLS_NAMED && !strcmp(x.req.tool_name, "f"));
    CHECK(same(x.req.json_schema, "{\"type\":\"object\"}"));
    CHECK(x.req.sampling.max_tokens == 9 && x.req.sampling.temperature == 0.0f);
    CHECK(!x.stream);
    agent_chat_xlat_clear(&x);
    json_decref(body);
    json_decref(notes);
}

static void responses_refuses(const char *body_text, const char *param, const char *needle) {
    json_t *body = J(body_text);
    agent_chat_xlat x;
    agent_dialect_err e = {0};
    CHECK(agent_responses_to_chat(body, 10, &x, NULL, &e) == AGENT_EINVAL);
    if (strcmp(e.param, param) || !strstr(e.message, needle)) {
        fprintf(stderr, "  refused %s with param '%s', message '%s' (wanted '%s', '%s')\n",
                body_text, e.param, e.message, param, needle);
        failures++;
    }
    char *eb = agent_responses_error_body(&e);
    json_t *j = J(eb), *err = json_object_get(j, "error");
    CHECK(!strcmp(json_string_value(json_object_get(err, "type")), "invalid_request_error"));
    CHECK(json_is_string(json_object_get(err, "message")));
    CHECK(param[0] ? !strcmp(json_string_value(json_object_get(err, "param")), param)
                   : json_is_null(json_object_get(err, "param")));
    CHECK(json_is_null(json_object_get(err, "code")));
    json_decref(j);
    free(eb);
    agent_chat_xlat_clear(&x);
    json_decref(body);
}

static void test_responses_errors(void) {
    responses_refuses("3", "", "JSON object");
    responses_refuses("{}", "input", "string or an array");
    responses_refuses("{\"input\":[]}", "input", "no messages");
    responses_refuses("{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}",
                      "previous_response_id", "does not store");
    responses_refuses("{\"input\":[{\"type\":\"message\",\"role\":\"tool\",\"content\":\"x\"}]}",
                      "input[0]", "role");
    responses_refuses("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\","
                      "\"image_url\":\"x\"}]}]}", "input[0].content", "input_image");
    responses_refuses("{\"input\":[{\"type\":\"function_call\",\"name\":\"f\"}]}", "input[0]",
                      "call_id");
    responses_refuses("{\"input\":[{\"type\":\"item_reference\",\"id\":\"x\"}]}", "input[0]",
                      "item_reference");
    responses_refuses("{\"input\":\"x\",\"tools\":[{\"type\":\"function\"}]}", "tools[0]",
                      "name");
    responses_refuses("{\"input\":\"x\",\"tool_choice\":\"maybe\"}", "tool_choice", "maybe");
    responses_refuses("{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"xml\"}}}",
                      "text.format.type", "xml");
    responses_refuses("{\"input\":\"x\",\"max_output_tokens\":-1}", "max_output_tokens",
                      ">= 1");
}

static void test_responses_stream(void) {
    rec r = {json_array(), 0, 0};
    agent_responses_enc *e;
    json_t *echo = J("{\"instructions\":\"I\",\"tool_choice\":\"auto\"}");
    CHECK(agent_responses_enc_new(&e, "gpt-5-codex", echo, true, rec_sink, &r) == 0);
    CHECK(agent_responses_enc_text(e, "Hi ", 3) == 0);
    CHECK(agent_responses_enc_text(e, "there", 5) == 0);
    CHECK(agent_responses_enc_tool(e, 0, "call_x", "shell", "{\"command\":[\"ls\"]}", 18) == 0);
    agent_dialect_done d = {"tool_calls", NULL, {50, 7, 32, 0}};
    char *body = NULL;
    CHECK(agent_responses_enc_done(e, &d, &body) == 0 && !body);
    agent_responses_enc_free(e);
    const char *want[] = {"response.created", "response.in_progress",
                          "response.output_item.added", "response.content_part.added",
                          "response.output_text.delta", "response.output_text.delta",
                          "response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.output_item.added",
                          "response.function_call_arguments.delta",
                          "response.function_call_arguments.done",
                          "response.output_item.done", "response.completed"};
    size_t n = sizeof want / sizeof want[0];
    CHECK(json_array_size(r.events) == n);
    for (size_t i = 0; i < n && i < json_array_size(r.events); i++) {
        json_t *dd = ev_data(&r, i);
        if (strcmp(ev_name(&r, i), want[i])) {
            fprintf(stderr, "  event %zu: %s (wanted %s)\n", i, ev_name(&r, i), want[i]);
            failures++;
        }
        CHECK(!strcmp(json_string_value(json_object_get(dd, "type")), want[i]));
        CHECK(json_integer_value(json_object_get(dd, "sequence_number")) == (json_int_t)i);
    }
    json_t *created = json_object_get(ev_data(&r, 0), "response");
    CHECK(!strcmp(json_string_value(json_object_get(created, "status")), "in_progress"));
    CHECK(!strcmp(json_string_value(json_object_get(created, "instructions")), "I"));
    CHECK(!strncmp(json_string_value(json_object_get(created, "id")), "resp_", 5));
    json_t *item = json_object_get(ev_data(&r, 2), "item");
    const char *msg_id = json_string_value(json_object_get(item, "id"));
    CHECK(msg_id && !strncmp(msg_id, "msg_", 4));
    CHECK(!strcmp(json_string_value(json_object_get(ev_data(&r, 4), "item_id")), msg_id));
    CHECK(!strcmp(json_string_value(json_object_get(ev_data(&r, 5), "delta")), "there"));
    CHECK(!strcmp(json_string_value(json_object_get(ev_data(&r, 6), "text")), "Hi there"));
    json_t *call = json_object_get(ev_data(&r, 9), "item");
    CHECK(!strcmp(json_string_value(json_object_get(call, "type")), "function_call"));
    CHECK(!strcmp(json_string_value(json_object_get(call, "call_id")), "call_x"));
    CHECK(json_integer_value(json_object_get(ev_data(&r, 10), "output_index")) == 1);
    json_t *fin = json_object_get(ev_data(&r, 13), "response");
    CHECK(!strcmp(json_string_value(json_object_get(fin, "status")), "completed"));
    CHECK(json_array_size(json_object_get(fin, "output")) == 2);
    CHECK(same(json_object_get(fin, "usage"),
               "{\"input_tokens\":50,\"input_tokens_details\":{\"cached_tokens\":32},"
               "\"output_tokens\":7,\"output_tokens_details\":{\"reasoning_tokens\":0},"
               "\"total_tokens\":57}"));
    CHECK(same(json_object_get(json_array_get(json_object_get(fin, "output"), 1), "arguments"),
               "\"{\\\"command\\\":[\\\"ls\\\"]}\""));
    json_decref(r.events);
    json_decref(echo);

    /* whole answer, cut by max_output_tokens: status incomplete */
    CHECK(agent_responses_enc_new(&e, "m", NULL, false, NULL, NULL) == 0);
    CHECK(agent_responses_enc_text(e, "abc", 3) == 0);
    /* reasoning tokens are reported, never more than the output tokens */
    agent_dialect_done d2 = {"length", NULL, {5, 3, 0, 9}};
    CHECK(agent_responses_enc_done(e, &d2, &body) == 0 && body);
    json_t *j = J(body);
    CHECK(same(json_object_get(json_object_get(j, "usage"), "output_tokens_details"),
               "{\"reasoning_tokens\":3}"));
    CHECK(!strcmp(json_string_value(json_object_get(j, "status")), "incomplete"));
    CHECK(same(json_object_get(j, "incomplete_details"), "{\"reason\":\"max_output_tokens\"}"));
    json_t *o0 = json_array_get(json_object_get(j, "output"), 0);
    CHECK(same(json_object_get(o0, "content"),
               "[{\"type\":\"output_text\",\"text\":\"abc\",\"annotations\":[],\"logprobs\":[]}]"));
    CHECK(same(json_object_get(j, "tools"), "[]"));
    json_decref(j);
    free(body);
    agent_responses_enc_free(e);

    /* a failure mid-stream: response.failed */
    rec f = {json_array(), 0, 0};
    CHECK(agent_responses_enc_new(&e, "m", NULL, true, rec_sink, &f) == 0);
    CHECK(agent_responses_enc_text(e, "a", 1) == 0);
    agent_dialect_err err;
    agent_dialect_fail(&err, 500, "", NULL, "engine failed");
    CHECK(agent_responses_enc_fail(e, &err) == 0);
    size_t last = json_array_size(f.events) - 1;
    CHECK(!strcmp(ev_name(&f, last), "response.failed"));
    json_t *fr = json_object_get(ev_data(&f, last), "response");
    CHECK(!strcmp(json_string_value(json_object_get(fr, "status")), "failed"));
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(fr, "error"), "message")),
                  "engine failed"));
    agent_responses_enc_free(e);
    json_decref(f.events);
}

/* ----- llama.cpp /infill ----- */

static const char *LLAMA_VSCODE_REQUEST =
    "{\"id_slot\": 0, \"input_prefix\": \"def add(a, b):\\n\", \"input_suffix\": \"\\n\\nprint(add(1, 2))\\n\","
    " \"input_extra\": [{\"filename\": \"src/util.py\", \"text\": \"def sub(a, b):\\n    return a - b\\n\"},"
    "                 {\"text\": \"# notes\\n\", \"filename\": \"README.md\"}],"
    " \"prompt\": \"    return \", \"n_predict\": 128, \"top_k\": 40, \"top_p\": 0.99, \"stream\": false,"
    " \"n_indent\": 4, \"samplers\": [\"top_k\", \"top_p\", \"infill\"], \"cache_prompt\": true,"
    " \"t_max_prompt_ms\": 500, \"t_max_predict_ms\": 1000,"
    " \"response_fields\": [\"content\", \"timings/prompt_n\", \"timings/predicted_n\","
    "                       \"timings/predicted_ms\", \"truncated\", \"tokens_cached\"]}";

static void test_infill(void) {
    json_t *body = J(LLAMA_VSCODE_REQUEST);
    agent_infill_req q;
    agent_dialect_err e = {0};
    CHECK(agent_infill_parse(body, 256, &q, &e) == 0);
    CHECK(!strcmp(q.req.prompt, "def add(a, b):\n"));
    CHECK(!strcmp(q.req.middle, "    return "));
    CHECK(!strcmp(q.req.suffix, "\n\nprint(add(1, 2))\n"));
    CHECK(q.req.n_extra == 2 && !strcmp(q.req.extra[0].name, "src/util.py") &&
          !strcmp(q.req.extra[1].text, "# notes\n"));
    CHECK(q.req.sampling.max_tokens == 128 && q.req.sampling.top_k == 40);
    CHECK(q.req.sampling.top_p > 0.989f && q.req.sampling.top_p < 0.991f);
    CHECK(q.req.time_budget_ms == 1000 && q.n_indent == 4 && !q.stream);

    /* the answer: n_indent cuts at the first line indented less than 4 */
    agent_infill_enc *enc;
    CHECK(agent_infill_enc_new(&enc, &q, "tiny", NULL, NULL) == 0);
    CHECK(agent_infill_enc_text(enc, "a + b\n", 6) == 0);
    CHECK(agent_infill_enc_text(enc, "    x\n", 6) == 0);
    CHECK(agent_infill_enc_text(enc, "def", 3) == 1);
    agent_infill_stats st = {30, 20, 3, 5.0, 12.0, "eos", NULL, false};
    char *out = NULL;
    CHECK(agent_infill_enc_done(enc, &st, &out) == 0 && out);
    json_t *jo = J(out);
    CHECK(same(jo, "{\"content\":\"a + b\\n    x\\n\",\"timings/prompt_n\":10,"
                   "\"timings/predicted_n\":3,\"timings/predicted_ms\":12.0,"
                   "\"truncated\":false,\"tokens_cached\":20}"));
    json_decref(jo);
    free(out);
    agent_infill_enc_free(enc);
    agent_infill_req_clear(&q);
    json_decref(body);

    /* streaming, all fields, defaults */
    body = J("{\"input_prefix\":\"x = \",\"input_suffix\":\"\",\"stream\":true}");
    CHECK(agent_infill_parse(body, 256, &q, &e) == 0);
    CHECK(q.req.sampling.max_tokens == 256 && q.req.n_extra == 0 && q.stream);
    rec r = {json_array(), 0, 0};
    CHECK(agent_infill_enc_new(&enc, &q, "tiny", rec_sink, &r) == 0);
    CHECK(agent_infill_enc_text(enc, "1\xE2\x82", 3) == 0);
    CHECK(agent_infill_enc_text(enc, "\xAC", 1) == 0);
    agent_infill_stats st2 = {4, 0, 2, 1.0, 2.0, "limit", NULL, false};
    CHECK(agent_infill_enc_done(enc, &st2, &out) == 0 && !out);
    CHECK(json_array_size(r.events) == 3);
    CHECK(same(ev_data(&r, 0), "{\"index\":0,\"content\":\"1\",\"tokens\":[],\"stop\":false,"
                               "\"id_slot\":-1}"));
    CHECK(!strcmp(json_string_value(json_object_get(ev_data(&r, 1), "content")), "\xE2\x82\xAC"));
    json_t *fin = ev_data(&r, 2);
    CHECK(json_is_true(json_object_get(fin, "stop")));
    CHECK(!strcmp(json_string_value(json_object_get(fin, "stop_type")), "limit"));
    CHECK(json_integer_value(json_object_get(fin, "tokens_evaluated")) == 4);
    CHECK(json_is_object(json_object_get(fin, "timings")));
    CHECK(!ev_name(&r, 0));
    json_decref(r.events);
    agent_infill_enc_free(enc);
    agent_infill_req_clear(&q);
    json_decref(body);

    const char *bad[][2] = {
        {"[1]", "JSON object"},
        {"{\"input_prefix\":1}", "input_prefix"},
        {"{\"input_extra\":[{\"filename\":\"a\"}]}", "extra_context chunk"},
        {"{\"input_extra\":{}}", "input_extra"},
        {"{\"n_predict\":1.5}", "n_predict"},
        {"{\"n_predict\":0}", "n_predict"},
        {"{\"top_p\":2}", "top_p"},
        {"{\"stop\":[1]}", "stop"},
        {"{\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop"},
        {"{\"stream\":1}", "stream"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        body = J(bad[i][0]);
        int rc = agent_infill_parse(body, 256, &q, &e);
        CHECK(rc == AGENT_EINVAL);
        if (!strstr(e.message, bad[i][1])) {
            fprintf(stderr, "  %s: message '%s' (wanted '%s')\n", bad[i][0], e.message, bad[i][1]);
            failures++;
        }
        char *eb = agent_infill_error_body(&e);
        json_t *j = J(eb);
        CHECK(json_integer_value(json_object_get(json_object_get(j, "error"), "code")) == 400);
        CHECK(!strcmp(json_string_value(json_object_get(json_object_get(j, "error"), "type")),
                      "invalid_request_error"));
        json_decref(j);
        free(eb);
        agent_infill_req_clear(&q);
        json_decref(body);
    }
}

static void test_helpers(void) {
    CHECK(agent_utf8_complete_len("ab", 2) == 2);
    CHECK(agent_utf8_complete_len("a\xC3", 2) == 1);
    CHECK(agent_utf8_complete_len("a\xE2\x82", 3) == 1);
    CHECK(agent_utf8_complete_len("a\xE2\x82\xAC", 4) == 4);
    CHECK(agent_utf8_complete_len("\xF0\x9F\x98", 3) == 0);
    CHECK(agent_utf8_complete_len("\xF0\x9F\x98\x80", 4) == 4);
    json_t *t = agent_json_text("a\xED\xA0\x80" "b", 5); /* an encoded surrogate */
    /* as a WHATWG decoder: one U+FFFD per byte of the encoded surrogate */
    CHECK(t && !strcmp(json_string_value(t), "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" "b"));
    json_decref(t);
    CHECK(!strcmp(agent_dialect_finish(SRV_FINISH_TIME), "length"));
    CHECK(!strcmp(agent_dialect_finish(SRV_FINISH_TOOL_CALLS), "tool_calls"));
    CHECK(!strcmp(agent_dialect_finish(SRV_FINISH_STOP), "stop"));
}

int main(void) {
    test_anthropic_request();
    test_anthropic_errors();
    test_anthropic_stream();
    test_anthropic_whole();
    test_responses_request();
    test_responses_errors();
    test_responses_stream();
    test_infill();
    test_helpers();
    if (failures) {
        fprintf(stderr, "test_dialects: %d check(s) failed\n", failures);
        return 1;
    }
    printf("test_dialects: all checks passed\n");
    return 0;
}
