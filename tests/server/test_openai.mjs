// The official `openai` npm SDK against a real `spark-agent serve` on the tiny model:
// /v1/models, /v1/chat/completions (plain, streaming, tools with tool_choice required / named,
// streamed tool_calls deltas, json_schema enforced by the grammar, stop, usage with
// prompt_tokens_details.cached_tokens from the prefix cache) and /v1/completions (plain,
// streaming, suffix = fill-in-the-middle), and the SDK's typed errors for 401 and 400.
import OpenAI from 'openai';
import Ajv from 'ajv';
import { startServer, checker } from './serve_util.mjs';

const { check, failures } = checker();
// where the time goes (the ASan run is the slow one): each section's wall time on stdout
let t0 = Date.now();
const mark = (what) => {
  const t = Date.now();
  console.log(`# ${String(t - t0).padStart(6)} ms  ${what}`);
  t0 = t;
};
const srv = await startServer({ tag: 'openai' });
mark('server start-up (model load)');
const client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: srv.token, maxRetries: 0 });
const ajv = new Ajv();

try {
  // models
  const models = await client.models.list();
  const ids = models.data.map((m) => m.id);
  check(ids.length === 1 && typeof ids[0] === 'string', 'models.list: one model ' + ids);
  const model = ids[0];

  mark('models.list');
  // plain chat, greedy: deterministic; the second identical request hits the prefix cache
  const messages = [{ role: 'system', content: 'You are terse.' },
    { role: 'user', content: 'Say something about the sea.' }];
  const a = await client.chat.completions.create({ model, messages, max_tokens: 8,
    temperature: 0, chat_template_kwargs: { enable_thinking: false } });
  check(a.object === 'chat.completion' && a.id.startsWith('chatcmpl-'), 'chat: object/id');
  check(a.choices.length === 1 && a.choices[0].message.role === 'assistant', 'chat: choice');
  const text = a.choices[0].message.content;
  check(typeof text === 'string' && text.length > 0, 'chat: content ' + JSON.stringify(text));
  check(['length', 'stop'].includes(a.choices[0].finish_reason), 'chat: finish_reason');
  check(a.usage.prompt_tokens > 10 && a.usage.completion_tokens > 0 &&
    a.usage.completion_tokens <= 8 &&
    a.usage.total_tokens === a.usage.prompt_tokens + a.usage.completion_tokens, 'chat: usage');
  const b = await client.chat.completions.create({ model, messages, max_tokens: 8,
    temperature: 0, chat_template_kwargs: { enable_thinking: false } });
  check(b.choices[0].message.content === text, 'chat: greedy is deterministic');
  check(b.usage.prompt_tokens_details.cached_tokens >= 16,
    'chat: repeated prompt served from the prefix cache (cached_tokens ' +
    b.usage.prompt_tokens_details.cached_tokens + ')');

  // streaming: the deltas add up to the same greedy text; usage in the last chunk
  const stream = await client.chat.completions.create({ model, messages, max_tokens: 8,
    temperature: 0, stream: true, stream_options: { include_usage: true },
    chat_template_kwargs: { enable_thinking: false } });
  let streamed = '', finish = null, usage = null, chunks = 0, role = null;
  for await (const ch of stream) {
    chunks++;
    if (ch.usage) usage = ch.usage;
    for (const c of ch.choices) {
      if (c.delta.role) role = c.delta.role;
      if (c.delta.content) streamed += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  check(streamed === text, `stream: same text (${JSON.stringify(streamed)} vs ${JSON.stringify(text)})`);
  check(role === 'assistant' && finish === a.choices[0].finish_reason && chunks >= 3,
    'stream: role, finish_reason, chunks');
  check(usage && usage.completion_tokens === a.usage.completion_tokens, 'stream: usage chunk');

  // stop string: the text ends before it
  if (text.length > 4) {
    const stopAt = text.slice(2, 4);
    const s = await client.chat.completions.create({ model, messages, max_tokens: 8,
      temperature: 0, stop: [stopAt], chat_template_kwargs: { enable_thinking: false } });
    check(s.choices[0].message.content === text.slice(0, text.indexOf(stopAt)) &&
      s.choices[0].finish_reason === 'stop', 'stop: cut before ' + JSON.stringify(stopAt));
  }

  mark('plain chat x2 + stream + stop');
  // tools: required -> a call of a declared tool whose arguments satisfy its schema
  const params = { type: 'object', properties: { city: { type: 'string', maxLength: 6 },
    days: { type: 'integer', minimum: 1, maximum: 7 } }, required: ['city', 'days'],
  additionalProperties: false };
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather',
    parameters: params } }, { type: 'function', function: { name: 'get_time',
    parameters: { type: 'object', properties: { tz: { type: 'string', enum: ['UTC', 'CET'] } },
      required: ['tz'] } } }];
  const tmsg = [{ role: 'user', content: 'What is the weather in Paris for 3 days?' }];
  const t = await client.chat.completions.create({ model, messages: tmsg, tools,
    tool_choice: 'required', parallel_tool_calls: false, max_tokens: 80, temperature: 0 });
  const calls = t.choices[0].message.tool_calls || [];
  check(calls.length === 1 && t.choices[0].finish_reason === 'tool_calls',
    'tools required: a call and finish_reason tool_calls ' + JSON.stringify(t.choices[0]));
  for (const c of calls) {
    const tool = tools.find((x) => x.function.name === c.function.name);
    check(c.type === 'function' && c.id.startsWith('call_') && tool, 'tools: known name ' +
      c.function.name);
    let args;
    try { args = JSON.parse(c.function.arguments); } catch { args = undefined; }
    check(tool && args && ajv.validate(tool.function.parameters, args),
      'tools: arguments match the schema ' + c.function.arguments);
  }
  mark('tools required');
  // named tool, streamed: the tool_calls delta carries id, name and arguments
  const ts = await client.chat.completions.create({ model, messages: tmsg, tools,
    tool_choice: { type: 'function', function: { name: 'get_time' } }, max_tokens: 80,
    temperature: 0, stream: true, parallel_tool_calls: false });
  const acc = {};
  let tfinish = null;
  for await (const ch of ts) {
    for (const c of ch.choices) {
      for (const d of c.delta.tool_calls || []) {
        const e = acc[d.index] ??= { id: '', name: '', args: '' };
        if (d.id) e.id = d.id;
        if (d.function?.name) e.name += d.function.name;
        if (d.function?.arguments) e.args += d.function.arguments;
      }
      if (c.finish_reason) tfinish = c.finish_reason;
    }
  }
  const got = Object.values(acc);
  check(got.length === 1 && got[0].name === 'get_time' && got[0].id.startsWith('call_') &&
    tfinish === 'tool_calls', 'tools named+stream: one get_time call ' + JSON.stringify(got));
  check(got.length === 1 && ajv.validate(tools[1].function.parameters, JSON.parse(got[0].args)),
    'tools named+stream: arguments match ' + got[0]?.args);
  mark('tools named, streamed');
  // a tool result goes back in the conversation and renders
  const back = await client.chat.completions.create({ model, tools, max_tokens: 8,
    temperature: 0, messages: [...tmsg, t.choices[0].message,
      { role: 'tool', tool_call_id: calls[0]?.id ?? 'x', content: '{"temp": 21}' }] });
  check(back.usage.prompt_tokens > t.usage.prompt_tokens, 'tool result: longer prompt');

  mark('tool result');
  // response_format json_schema: the content parses and satisfies the schema
  const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 6 },
    age: { type: 'integer', minimum: 0, maximum: 150 }, tags: { type: 'array',
      items: { type: 'string', enum: ['a', 'b'] }, maxItems: 2 } },
  required: ['name', 'age', 'tags'], additionalProperties: false };
  const j = await client.chat.completions.create({ model, max_tokens: 100, temperature: 0,
    messages: [{ role: 'user', content: 'A person as JSON.' }],
    response_format: { type: 'json_schema', json_schema: { name: 'person', schema,
      strict: true } } });
  let doc;
  try { doc = JSON.parse(j.choices[0].message.content); } catch { doc = undefined; }
  check(doc !== undefined && ajv.validate(schema, doc) && j.choices[0].finish_reason === 'stop',
    'json_schema: valid document ' + j.choices[0].message.content);
  mark('json_schema');
  const jo = await client.chat.completions.create({ model, max_tokens: 24, temperature: 0.7,
    seed: 5, messages: [{ role: 'user', content: 'JSON please' }],
    response_format: { type: 'json_object' } });
  let obj;
  try { obj = JSON.parse(jo.choices[0].message.content); } catch { obj = undefined; }
  check(jo.choices[0].finish_reason !== 'stop' ||
    (obj !== null && typeof obj === 'object' && !Array.isArray(obj)),
  'json_object: an object ' + jo.choices[0].message.content);

  mark('json_object');
  // seeded sampling is reproducible
  const s1 = await client.chat.completions.create({ model, messages, max_tokens: 6,
    temperature: 0.9, top_p: 0.9, seed: 42 });
  const s2 = await client.chat.completions.create({ model, messages, max_tokens: 6,
    temperature: 0.9, top_p: 0.9, seed: 42 });
  check(s1.choices[0].message.content === s2.choices[0].message.content, 'seed: reproducible');

  mark('seeded sampling x2');
  // completions: plain, streamed (same greedy text), and FIM with a suffix
  const c1 = await client.completions.create({ model, prompt: 'def add(a, b):',
    max_tokens: 10, temperature: 0 });
  check(c1.object === 'text_completion' && typeof c1.choices[0].text === 'string' &&
    c1.usage.completion_tokens > 0 && c1.usage.completion_tokens <= 10, 'completions: plain');
  const cs = await client.completions.create({ model, prompt: 'def add(a, b):',
    max_tokens: 10, temperature: 0, stream: true });
  let ctext = '';
  for await (const ch of cs) ctext += ch.choices[0]?.text ?? '';
  check(ctext === c1.choices[0].text, 'completions: stream = plain');
  const d = await client.completions.create({ model, prompt: 'def add(a, b):\n    ',
    suffix: '\n    return c\n', max_tokens: 8, temperature: 0 });
  check(typeof d.choices[0].text === 'string' && d.usage.prompt_tokens > 8,
    'completions: suffix (FIM)');
  check(d.choices[0].text !== c1.choices[0].text || d.usage.prompt_tokens !== c1.usage.prompt_tokens,
    'completions: FIM prompt differs from the plain one');
  const def = await client.completions.create({ model, prompt: 'x', temperature: 0 });
  check(def.usage.completion_tokens <= 16, 'completions: default max_tokens 16');
  const ie = await client.completions.create({ model, prompt: 'x', temperature: 0, max_tokens: 5,
    ignore_eos: true });
  check(ie.usage.completion_tokens === 5 && ie.choices[0].finish_reason === 'length',
    'completions: ignore_eos runs to max_tokens');

  mark('completions x5');
  // typed errors
  const bad = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'wrong-token-wrong-token',
    maxRetries: 0 });
  try {
    await bad.chat.completions.create({ model, messages, max_tokens: 2 });
    check(false, 'wrong token accepted');
  } catch (e) {
    check(e instanceof OpenAI.AuthenticationError && e.status === 401, 'wrong token: 401 ' + e);
  }
  try {
    await client.chat.completions.create({ model, messages: [], max_tokens: 2 });
    check(false, 'empty messages accepted');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && /messages/.test(e.message),
      'empty messages: 400 naming messages ' + e);
  }
  try {
    await client.chat.completions.create({ model, messages, n: 2 });
    check(false, 'n=2 accepted');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.error?.param === 'n', 'n=2: 400 param n');
  }
  try {
    await client.chat.completions.create({ model, messages, tools, tool_choice: 'sometimes' });
    check(false, 'bad tool_choice accepted');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError, 'bad tool_choice: 400');
  }
  try {
    await client.chat.completions.create({ model, messages, response_format: { type: 'json_schema',
      json_schema: { name: 'x', schema: { type: 'object', properties: { a: { type: 'strnig' } } } } } });
    check(false, 'bad schema accepted');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && /schema/.test(e.message), 'bad schema: 400 ' + e);
  }
  mark('typed errors');
  const after = await client.models.list();
  check(after.data.length === 1, 'still serving after the errors');
} catch (e) {
  check(false, 'unexpected: ' + (e.stack || e));
} finally {
  const code = await srv.stop();
  check(code === 0, 'SIGTERM: exit 0 (got ' + code + ')\n' + srv.stderr());
}
if (failures()) process.exit(1);
console.log('test_openai: ok');
