// The HTTP dialects against a real `spark-agent serve` on the tiny model with the official
// clients: @anthropic-ai/sdk on /v1/messages (whole, streamed through its MessageStream, which
// rebuilds the message from the events and refuses events out of order; tools; count_tokens;
// a typed 400), the openai SDK's Responses API on /v1/responses (whole, streamed through its
// ResponseStream, a function call, a tolerated built-in tool, a typed 400), and /infill as
// llama.vscode sends it (whole with response_fields, streamed).
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { startServer, checker } from './serve_util.mjs';

const { check, failures } = checker();
// Tool calls are grammar-constrained: slow under ASan. The quick row (SPARK_TEST_TOOLS=0) leaves
// them out; the slow row runs everything.
const TOOLS = process.env.SPARK_TEST_TOOLS !== '0';
const srv = await startServer({ tag: 'dialects' });
const WEATHER = {
  name: 'get_weather', description: 'Weather of a city',
  input_schema: { type: 'object', properties: { city: { type: 'string', maxLength: 20 } },
                  required: ['city'], additionalProperties: false },
};
try {
  // ----- Anthropic Messages -----
  const anthropic = new Anthropic({ apiKey: srv.token, baseURL: srv.url, maxRetries: 0 });
  const m = await anthropic.messages.create({
    model: 'claude-x', max_tokens: 8, temperature: 0,
    system: [{ type: 'text', text: 'Be brief.' }], messages: [{ role: 'user', content: 'hi' }],
  });
  check(m.type === 'message' && m.role === 'assistant' && m.model === 'claude-x',
        `message ${JSON.stringify(m).slice(0, 200)}`);
  check(m.content.every((b) => b.type === 'text'), 'text blocks only');
  check(['end_turn', 'max_tokens'].includes(m.stop_reason), `stop_reason ${m.stop_reason}`);
  check(m.usage.output_tokens > 0 && m.usage.input_tokens + m.usage.cache_read_input_tokens > 0,
        `usage ${JSON.stringify(m.usage)}`);

  let streamed = '';
  const st = anthropic.messages.stream({ model: 'm', max_tokens: 6, temperature: 0,
                                          messages: [{ role: 'user', content: 'hi' }] });
  st.on('text', (t) => { streamed += t; });
  const fin = await st.finalMessage();
  const whole = fin.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  check(whole === streamed && whole.length > 0, `streamed text adds up: '${streamed}' vs '${whole}'`);
  check(fin.usage.output_tokens === 6 || fin.stop_reason === 'end_turn', 'stream usage');

  if (TOOLS) {
    const tst = anthropic.messages.stream({
      model: 'm', max_tokens: 200, temperature: 0, tools: [WEATHER],
      tool_choice: { type: 'any', disable_parallel_tool_use: true },
      messages: [{ role: 'user', content: 'Weather in Paris?' }],
    });
    const tfin = await tst.finalMessage();
    const use = tfin.content.find((b) => b.type === 'tool_use');
    check(tfin.stop_reason === 'tool_use' && use && use.name === 'get_weather' &&
          typeof use.input.city === 'string', `tool_use ${JSON.stringify(tfin.content)}`);
    // the tool result goes back as Claude Code sends it
    const next = await anthropic.messages.create({
      model: 'm', max_tokens: 4, tools: [WEATHER],
      messages: [{ role: 'user', content: 'Weather in Paris?' },
                 { role: 'assistant', content: tfin.content },
                 { role: 'user', content: [{ type: 'tool_result', tool_use_id: use?.id ?? 'x',
                                              content: 'sunny' }] }],
    });
    check(next.type === 'message', 'a turn after a tool result');
  }

  const count = await anthropic.messages.countTokens({
    model: 'm', messages: [{ role: 'user', content: 'hello there' }], tools: [WEATHER] });
  check(count.input_tokens > 20, `count_tokens ${JSON.stringify(count)}`);

  try {
    await anthropic.messages.create({ model: 'm', max_tokens: 5, messages: [] });
    check(false, 'empty messages accepted');
  } catch (e) {
    check(e instanceof Anthropic.BadRequestError && e.status === 400 &&
          e.error?.error?.type === 'invalid_request_error', `typed 400: ${e}`);
  }

  // ----- OpenAI Responses -----
  const openai = new OpenAI({ apiKey: srv.token, baseURL: srv.url + '/v1', maxRetries: 0 });
  const r = await openai.responses.create({ model: 'gpt-5-codex', input: 'hi',
                                            max_output_tokens: 8, instructions: 'Be brief.' });
  check(r.object === 'response' && typeof r.output_text === 'string' && r.output_text.length > 0,
        `response ${JSON.stringify(r).slice(0, 300)}`);
  check(r.status === 'incomplete' ? r.incomplete_details?.reason === 'max_output_tokens'
                                  : r.status === 'completed', `status ${r.status}`);
  check(r.usage.output_tokens > 0 && r.usage.total_tokens ===
        r.usage.input_tokens + r.usage.output_tokens, 'usage');

  let deltas = '';
  const rs = openai.responses.stream({ model: 'm', input: [{ role: 'user', content: 'hi' }],
                                       max_output_tokens: 5, temperature: 0 });
  rs.on('response.output_text.delta', (ev) => { deltas += ev.delta; });
  const rfin = await rs.finalResponse();
  const rtext = rfin.output.filter((o) => o.type === 'message')
    .flatMap((o) => o.content).filter((p) => p.type === 'output_text').map((p) => p.text).join('');
  check(rtext === deltas && deltas.length > 0, `streamed deltas add up: ${JSON.stringify(deltas)} vs ${JSON.stringify(rtext)}`);

  if (TOOLS) {
    const fs2 = openai.responses.stream({
      model: 'm', max_output_tokens: 200, temperature: 0, tool_choice: 'required',
      parallel_tool_calls: false,
      tools: [{ type: 'function', name: 'get_weather', parameters: WEATHER.input_schema,
                strict: false },
              { type: 'web_search' }],
      input: [{ type: 'message', role: 'developer', content: [{ type: 'input_text', text: 'x' }] },
              { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Weather?' }] }],
    });
    const ffin = await fs2.finalResponse();
    const call = ffin.output.find((o) => o.type === 'function_call');
    check(call && call.name === 'get_weather' && typeof JSON.parse(call.arguments).city === 'string',
          `function_call ${JSON.stringify(ffin.output).slice(0, 300)}`);
    const after = await openai.responses.create({
      model: 'm', max_output_tokens: 4,
      input: [{ role: 'user', content: 'Weather?' },
              { type: 'function_call', call_id: call?.call_id ?? 'c', name: 'get_weather',
                arguments: call?.arguments ?? '{}' },
              { type: 'function_call_output', call_id: call?.call_id ?? 'c', output: 'sunny' }],
    });
    check(after.object === 'response', 'a turn after a function call output');
  }
  try {
    await openai.responses.create({ model: 'm', input: 'x', previous_response_id: 'resp_1' });
    check(false, 'previous_response_id accepted');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.status === 400 &&
          e.param === 'previous_response_id', `typed 400: ${e}`);
  }

  // ----- llama.cpp /infill -----
  const infill = (body) => fetch(srv.url + '/infill', {
    method: 'POST', headers: { authorization: `Bearer ${srv.token}`, 'content-type': 'application/json' },
    body: JSON.stringify(body) });
  const vs = {
    input_prefix: 'def add(a, b):\n', input_suffix: '\n\nprint(add(1, 2))\n', prompt: '    return ',
    input_extra: [{ filename: 'util.py', text: 'def sub(a, b):\n    return a - b\n' }],
    n_predict: 4, top_k: 40, top_p: 0.99, stream: false, samplers: ['top_k', 'top_p', 'infill'],
    cache_prompt: true, t_max_prompt_ms: 500, t_max_predict_ms: 5000,
    response_fields: ['content', 'timings/prompt_n', 'timings/predicted_n', 'tokens_cached'],
  };
  const i1 = await (await infill(vs)).json();
  check(typeof i1.content === 'string' && i1['timings/predicted_n'] > 0 &&
        Object.keys(i1).length === 4, `infill ${JSON.stringify(i1)}`);
  const i2 = await (await infill(vs)).json();
  check(i2.tokens_cached > 0, `the repeated infill prompt is cached: ${JSON.stringify(i2)}`);
  const sres = await infill({ ...vs, stream: true, response_fields: undefined, n_predict: 3 });
  const lines = (await sres.text()).split('\n').filter((l) => l.startsWith('data: '))
    .map((l) => JSON.parse(l.slice(6)));
  check(lines.length >= 2 && lines.at(-1).stop === true && lines.slice(0, -1).every((l) => !l.stop),
        `infill stream ${JSON.stringify(lines).slice(0, 300)}`);
  const bad = await infill({ input_extra: [{ filename: 'a' }] });
  const bj = await bad.json();
  check(bad.status === 400 && bj.error?.type === 'invalid_request_error', `infill 400 ${JSON.stringify(bj)}`);
} finally {
  const code = await srv.stop();
  check(code === 0, `serve exit ${code}: ${srv.stderr().slice(-1500)}`);
}
if (failures()) {
  console.error(`test_dialects_http: ${failures()} failure(s)`);
  process.exit(1);
}
console.log('test_dialects_http: all checks passed');
