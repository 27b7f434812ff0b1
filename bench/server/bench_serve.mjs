// Benchmark of `spark-agent serve` (not a test): time to first token and per-stream decode
// speed at p50/p99, and aggregate tokens/s, with 1, 8 and 32 concurrent streaming clients.
//
//   node bench/server/bench_serve.mjs [--cli build/spark-agent] [-m MODEL] [--tokens 32]
//        [--requests 3] [--clients 1,8,32] [--url URL --token TOKEN] [--json]
//
// Without --url it starts its own server (CPU, the given or default model) on a free port.
// Every client sends --requests chat requests one after another (distinct prompts of ~40
// tokens, greedy, ignore_eos so each answer has exactly --tokens tokens) and streams them.
// TTFT = request sent -> first content chunk; decode tok/s of a stream = (tokens - 1) / (last
// chunk - first chunk); aggregate = all tokens / wall time of the level.
import { spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const args = process.argv.slice(2);
const opt = (name, def) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : def;
};
const here = path.dirname(new URL(import.meta.url).pathname);
const cli = opt('--cli', path.join(here, '../../build/spark-agent'));
const model = opt('-m', null);
const TOKENS = Number(opt('--tokens', 32));
const REQS = Number(opt('--requests', 3));
const LEVELS = opt('--clients', '1,8,32').split(',').map(Number);
let url = opt('--url', null);
let token = opt('--token', null);
let proc = null;

if (!url) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bench_serve_'));
  token = crypto.randomBytes(24).toString('hex');
  const maxc = Math.max(...LEVELS);
  proc = spawn(cli, ['serve', ...(model ? ['-m', model] : []), '--port', '0', '--max-seqs',
    String(Math.max(16, maxc)), '--max-conns', String(4 * maxc + 16)], {
    env: { ...process.env, XDG_CONFIG_HOME: dir, SPARK_API_KEY: token },
    stdio: ['ignore', 'pipe', 'inherit'] });
  url = await new Promise((resolve, reject) => {
    let out = '';
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/[^ ]*:\d+) /);
      if (m) resolve(m[1]);
    });
    proc.on('exit', (c) => reject(new Error('serve exited ' + c)));
  });
}

const words = ['river', 'lamp', 'orbit', 'cedar', 'piano', 'harbor', 'quartz', 'meadow', 'signal',
  'ember', 'canyon', 'violet'];
function messages(i) {
  const w = Array.from({ length: 24 }, (_, k) => words[(i * 7 + k * 5) % words.length]);
  return [{ role: 'user', content: `Request ${i}: write about ${w.join(' ')}.` }];
}

async function one(i) {
  const t0 = performance.now();
  const r = await fetch(url + '/v1/chat/completions', {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'bench', messages: messages(i), max_tokens: TOKENS,
      temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true },
      chat_template_kwargs: { enable_thinking: false } }),
  });
  if (r.status !== 200) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
  let first = 0, last = 0, tokens = 0, cached = 0, buf = '';
  const dec = new TextDecoder();
  for await (const chunk of r.body) {
    buf += dec.decode(chunk, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k);
      buf = buf.slice(k + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (j.usage) { tokens = j.usage.completion_tokens; cached = j.usage.prompt_tokens_details.cached_tokens; }
      const d = j.choices?.[0]?.delta;
      if (d && (d.content || d.reasoning_content)) {
        const now = performance.now();
        if (!first) first = now;
        last = now;
      }
    }
  }
  return { ttft: first - t0, tps: tokens > 1 && last > first ? (tokens - 1) / ((last - first) / 1e3) : 0,
    tokens, cached };
}

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

const results = [];
let n = 0;
for (const c of LEVELS) {
  const t0 = performance.now();
  const all = await Promise.all(Array.from({ length: c }, async (_, k) => {
    const out = [];
    for (let r = 0; r < REQS; r++) out.push(await one(1000 * c + REQS * k + r + n));
    return out;
  }));
  n += c * REQS;
  const wall = (performance.now() - t0) / 1e3;
  const flat = all.flat();
  const row = { clients: c, requests: flat.length, tokens_each: TOKENS,
    ttft_ms_p50: pct(flat.map((x) => x.ttft), 50), ttft_ms_p99: pct(flat.map((x) => x.ttft), 99),
    stream_tok_s_p50: pct(flat.map((x) => x.tps), 50), stream_tok_s_p1: pct(flat.map((x) => x.tps), 1),
    aggregate_tok_s: flat.reduce((a, x) => a + x.tokens, 0) / wall, wall_s: wall };
  results.push(row);
  if (!args.includes('--json'))
    console.log(`clients ${String(c).padStart(2)}: TTFT p50 ${row.ttft_ms_p50.toFixed(0)} ms, ` +
      `p99 ${row.ttft_ms_p99.toFixed(0)} ms; per-stream decode p50 ${row.stream_tok_s_p50.toFixed(1)} ` +
      `tok/s (slowest 1%: ${row.stream_tok_s_p1.toFixed(1)}); aggregate ${row.aggregate_tok_s.toFixed(1)} ` +
      `tok/s over ${row.requests} requests in ${wall.toFixed(1)} s`);
}
if (args.includes('--json')) console.log(JSON.stringify({ url, tokens: TOKENS, results }, null, 1));
if (proc) {
  proc.kill('SIGTERM');
  await new Promise((r) => proc.on('exit', r));
}
