// spark-agent run --model-url against a small fake OpenAI-compatible server (node http): the
// request carries the API key, the tools and the conversation; the streamed (SSE) tool call,
// split over several chunks, is executed; its result goes back with the call's id; the
// streamed answer ends the run with exit 0. A wrong key gives HTTP 401 and exit 1; a server
// that is not there gives a clear error.
import http from 'node:http';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execFileSync } from 'node:child_process';

const CLI = process.env.SPARK_CLI;
if (!CLI) { console.error('SPARK_CLI not set'); process.exit(1); }
let failures = 0;
const check = (ok, what) => { if (!ok) { console.error('FAIL: ' + what); failures++; } };

const requests = [];
const server = http.createServer((req, res) => {
  let body = '';
  req.on('data', (d) => { body += d; });
  req.on('end', () => {
    if (req.url !== '/v1/chat/completions' || req.method !== 'POST') {
      res.writeHead(404); res.end('not found'); return;
    }
    if (req.headers.authorization !== 'Bearer sekret') {
      res.writeHead(401, { 'content-type': 'application/json' });
      res.end('{"error":{"message":"bad api key"}}');
      return;
    }
    const j = JSON.parse(body);
    requests.push(j);
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const send = (delta, finish = null) => res.write('data: ' + JSON.stringify({
      choices: [{ index: 0, delta, finish_reason: finish }] }) + '\n\n');
    if (requests.length === 1) {
      send({ role: 'assistant', content: 'Reading ' });
      send({ content: 'it.' });
      send({ tool_calls: [{ index: 0, id: 'x1', type: 'function',
        function: { name: 'read_file', arguments: '{"pa' } }] });
      send({ tool_calls: [{ index: 0, function: { arguments: 'th": "a.txt"}' } }] }, 'tool_calls');
    } else {
      send({ content: 'The file ' });
      send({ content: 'says hello.' }, 'stop');
    }
    res.end('data: [DONE]\n\n');
  });
});

function run(args, env) {
  return new Promise((resolve) => {
    const p = spawn(CLI, args, { cwd: repo, env: { ...process.env, ...env } });
    let out = '', err = '';
    p.stdout.on('data', (d) => { out += d; });
    p.stderr.on('data', (d) => { err += d; });
    p.on('close', (code) => resolve({ code, out, err }));
  });
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'test_loop_remote_'));
const repo = path.join(tmp, 'repo');
fs.mkdirSync(repo);
fs.writeFileSync(path.join(repo, 'a.txt'), 'hello\n');
execFileSync('git', ['init', '-q'], { cwd: repo });
const env = { XDG_STATE_HOME: path.join(tmp, 'state') };

server.listen(0, '127.0.0.1', async () => {
  const port = server.address().port;
  const url = `http://127.0.0.1:${port}/v1`;
  let r = await run(['run', '--model-url', url, '--api-key', 'sekret', '--json', 'what does a.txt say?'], env);
  check(r.code === 0, `exit 0 (got ${r.code}: ${r.err})`);
  const events = r.out.trim().split('\n').map((l) => JSON.parse(l));
  const stop = events[events.length - 1];
  check(stop.type === 'stop' && stop.reason === 'answer' && stop.tool_calls === 1,
        'stopped on the answer after one tool call: ' + JSON.stringify(stop));
  const result = events.find((e) => e.type === 'tool_result');
  check(result && result.ok && result.content.includes('hello'), 'read_file ran: ' + JSON.stringify(result));
  check(requests.length === 2, 'two requests');
  if (requests.length === 2) {
    const [q1, q2] = requests;
    check(q1.stream === true && Array.isArray(q1.tools) &&
          q1.tools.some((t) => t.function.name === 'read_file'), 'tools and stream sent');
    check(q1.messages[0].role === 'system' && q1.messages[1].content === 'what does a.txt say?',
          'system and user messages');
    const a = q2.messages[2];
    check(a.role === 'assistant' && a.tool_calls && a.tool_calls[0].function.name === 'read_file' &&
          JSON.parse(a.tool_calls[0].function.arguments).path === 'a.txt' && !('raw' in a),
          'assistant call sent back in wire form: ' + JSON.stringify(a));
    const t = q2.messages[3];
    check(t.role === 'tool' && t.tool_call_id === a.tool_calls[0].id && t.content.includes('hello'),
          'tool result with the call id');
  }
  r = await run(['run', '--model-url', url, '--api-key', 'wrong', 'x'], env);
  check(r.code === 1 && r.err.includes('HTTP 401'), `wrong key: HTTP 401, exit 1 (got ${r.code}: ${r.err})`);
  server.close();
  r = await run(['run', '--model-url', `http://127.0.0.1:${port}/v1`, 'x'], env);
  check(r.code === 1 && /connect/.test(r.err), `no server: exit 1 with a reason (${r.code}: ${r.err})`);
  r = await run(['run', '--model-url', 'ftp://x/v1', 'x'], env);
  check(r.code === 1 && r.err.includes('expected http'), `bad url (${r.code}: ${r.err})`);
  fs.rmSync(tmp, { recursive: true, force: true });
  if (failures) { console.error(`${failures} failure(s)`); process.exit(1); }
  console.log('test_loop_remote: ok');
});
