// Replays the protocol fixtures (tests/fixtures/protocol/*.json, format in docs/protocol.md §11)
// against a running `spark-agent serve`. Used by test_rpc.mjs; the editor plugins' tests may
// import it too:
//   import { replayFixture, loadFixtures, fixtureServerEnv, makeWorkspace } from '.../rpc_replay.mjs';
//   const r = await replayFixture(fixture, { url: 'ws://127.0.0.1:PORT/rpc', token, vars });
//   r.skipped (a reason) or r.steps (count); throws with the step and the mismatch on failure.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import WebSocket from 'ws';

export const SUBPROTOCOL = 'spark-agent.jsonrpc.v1';

export function loadFixtures(dir) {
  return fs.readdirSync(dir).filter((f) => f.endsWith('.json')).sort()
    .map((f) => ({ file: f, ...JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8')) }));
}

// The placeholders; any other string (also "$/progress") is literal.
const PLACEHOLDER = /^\$(any|absent|string|text|number|int|bool|object|array|null|capture:.+|ref:.+)$/;

function typeOf(v) {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  return typeof v;
}

// null when `value` matches `pattern`, else a description of the first difference.
export function match(pattern, value, caps, where = '$') {
  if (typeof pattern === 'string' && PLACEHOLDER.test(pattern)) {
    const [kind, name] = [pattern.split(':')[0], pattern.slice(pattern.indexOf(':') + 1)];
    switch (kind) {
      case '$any': return null;
      case '$absent': return value === undefined ? null : `${where}: should be absent`;
      case '$string': case '$text':
        return typeof value === 'string' ? null : `${where}: want a string, got ${JSON.stringify(value)}`;
      case '$number': return typeof value === 'number' ? null : `${where}: want a number`;
      case '$int': return Number.isInteger(value) ? null : `${where}: want an integer, got ${JSON.stringify(value)}`;
      case '$bool': return typeof value === 'boolean' ? null : `${where}: want a boolean`;
      case '$object': return typeOf(value) === 'object' ? null : `${where}: want an object`;
      case '$array': return Array.isArray(value) ? null : `${where}: want an array, got ${JSON.stringify(value)}`;
      case '$null': return value === null ? null : `${where}: want null`;
      case '$capture':
        if (value === undefined) return `${where}: missing (to capture as ${name})`;
        caps[name] = value;
        return null;
      case '$ref':
        if (!(name in caps)) return `${where}: $ref:${name} was never captured`;
        return JSON.stringify(caps[name]) === JSON.stringify(value) ? null
          : `${where}: want ${JSON.stringify(caps[name])} (captured ${name}), got ${JSON.stringify(value)}`;
      default: return `${where}: unknown placeholder ${pattern}`;
    }
  }
  if (typeof pattern === 'string' && /^\$\$/.test(pattern) && PLACEHOLDER.test(pattern.slice(1)))
    pattern = pattern.slice(1);
  if (typeOf(pattern) === 'object') {
    if (typeOf(value) !== 'object') return `${where}: want an object, got ${JSON.stringify(value)}`;
    for (const k of Object.keys(pattern)) {
      const d = match(pattern[k], value[k], caps, `${where}.${k}`);
      if (d) return d;
    }
    return null;
  }
  if (Array.isArray(pattern)) {
    if (!Array.isArray(value) || value.length !== pattern.length)
      return `${where}: want an array of ${pattern.length}, got ${JSON.stringify(value)}`;
    for (let i = 0; i < pattern.length; i++) {
      const d = match(pattern[i], value[i], caps, `${where}[${i}]`);
      if (d) return d;
    }
    return null;
  }
  return JSON.stringify(pattern) === JSON.stringify(value) ? null
    : `${where}: want ${JSON.stringify(pattern)}, got ${JSON.stringify(value)}`;
}

// Replace "$ref:NAME" and "$var:NAME" in a message to send.
export function substitute(v, caps, vars) {
  if (typeof v === 'string') {
    if (v.startsWith('$ref:')) return caps[v.slice(5)];
    if (v.startsWith('$var:')) {
      const name = v.slice(5);
      if (!(name in vars)) throw new Error(`fixture needs the variable ${name}`);
      return vars[name];
    }
    return v;
  }
  if (Array.isArray(v)) return v.map((x) => substitute(x, caps, vars));
  if (typeOf(v) === 'object') {
    const o = {};
    for (const [k, x] of Object.entries(v)) o[k] = substitute(x, caps, vars);
    return o;
  }
  return v;
}

// A WebSocket with a pull queue of incoming messages.
export async function connect(url, token, { viaSubprotocol = false } = {}) {
  const protocols = viaSubprotocol ? [SUBPROTOCOL, `spark-agent.token.${token}`] : [SUBPROTOCOL];
  const ws = new WebSocket(url, protocols,
    viaSubprotocol ? {} : { headers: { Authorization: `Bearer ${token}` } });
  const queue = [];
  let waiter = null;
  const push = (item) => {
    queue.push(item);
    if (waiter) { const w = waiter; waiter = null; w(); }
  };
  ws.on('message', (data, isBinary) => {
    if (isBinary) return push({ binary: true });
    let msg;
    try { msg = JSON.parse(data.toString('utf8')); } catch { msg = { unparsable: data.toString() }; }
    push({ msg });
  });
  ws.on('close', (code) => push({ close: code }));
  await new Promise((resolve, reject) => {
    ws.once('open', resolve);
    ws.once('unexpected-response', (req, res) => reject(new Error(`handshake refused: HTTP ${res.statusCode}`)));
    ws.once('error', reject);
  });
  return {
    ws,
    send(obj) { ws.send(typeof obj === 'string' ? obj : JSON.stringify(obj)); },
    async next(timeoutMs = 120000) {
      if (!queue.length) {
        await new Promise((resolve, reject) => {
          const t = setTimeout(() => { waiter = null; reject(new Error(`no message within ${timeoutMs} ms`)); }, timeoutMs);
          waiter = () => { clearTimeout(t); resolve(); };
        });
      }
      return queue.shift();
    },
    close() { try { ws.close(); } catch { /* already closed */ } },
  };
}

// What the server offers, from a probe connection: the capabilities a fixture may need.
export async function serverCaps(url, token) {
  const c = await connect(url, token);
  c.send({ jsonrpc: '2.0', id: 1, method: 'initialize', params: {} });
  const { msg } = await c.next();
  c.close();
  const r = msg?.result ?? {};
  const caps = new Set();
  if (r.model?.fim) caps.add('fim');
  if (r.capabilities?.chat?.tools) caps.add('tools');
  if (r.capabilities?.agent) caps.add('agent');
  return caps;
}

// A fresh git repository with the fixture's files: { WORKSPACE_PATH, WORKSPACE_URI, cleanup }.
export function makeWorkspace(files) {
  const dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), 'spark_ws_')));
  for (const [rel, content] of Object.entries(files)) {
    fs.mkdirSync(path.dirname(path.join(dir, rel)), { recursive: true });
    fs.writeFileSync(path.join(dir, rel), content);
  }
  const git = (...a) => execFileSync('git', a, { cwd: dir, stdio: 'ignore',
    env: { ...process.env, GIT_AUTHOR_NAME: 't', GIT_AUTHOR_EMAIL: 't@t', GIT_COMMITTER_NAME: 't',
      GIT_COMMITTER_EMAIL: 't@t' } });
  git('init', '-q');
  git('add', '-A');
  git('commit', '-q', '-m', 'fixture');
  return { WORKSPACE_PATH: dir, WORKSPACE_URI: 'file://' + dir,
    cleanup() { fs.rmSync(dir, { recursive: true, force: true }); } };
}

// Environment for a server that replays fixture.agentScript (write the file; caller removes dir).
export function fixtureServerEnv(fixture, dir) {
  if (!fixture.agentScript) return {};
  const f = path.join(dir, 'agent_script.json');
  fs.writeFileSync(f, JSON.stringify(fixture.agentScript));
  return { SPARK_SERVE_AGENT_SCRIPT: f };
}

export async function replayFixture(fixture, { url, token, vars = {}, caps: serverOffers, log = () => {} }) {
  const offers = serverOffers ?? await serverCaps(url, token);
  for (const need of fixture.needs ?? [])
    if (!offers.has(need)) return { skipped: `the server does not offer ${need}` };
  const ignore = new Set(fixture.ignore ?? []);
  const c = await connect(url, token);
  const captures = {};
  const steps = fixture.steps;
  let pending = null; // a message read but not consumed yet
  const nextMsg = async () => {
    if (pending) { const p = pending; pending = null; return p; }
    for (;;) {
      const item = await c.next();
      if (item.msg && ignore.has(item.msg.method)) continue;
      return item;
    }
  };
  const fail = (i, why, got) => {
    c.close();
    throw new Error(`${fixture.name} step ${i} (${JSON.stringify(steps[i]).slice(0, 160)}): ${why}` +
      (got ? `\n  got: ${JSON.stringify(got).slice(0, 600)}` : ''));
  };
  try {
    for (let i = 0; i < steps.length; i++) {
      const st = steps[i];
      log(`step ${i}`);
      if (st.send) { c.send(substitute(st.send, captures, vars)); continue; }
      if (st.sendRaw !== undefined) { c.send(String(st.sendRaw)); continue; }
      if (st.sleepMs) { await new Promise((r) => setTimeout(r, st.sleepMs)); continue; }
      if (st.expectClose !== undefined) {
        const item = await nextMsg();
        if (item.close === undefined) fail(i, 'want the connection closed', item.msg);
        if (item.close !== st.expectClose) fail(i, `closed with ${item.close}, want ${st.expectClose}`);
        continue;
      }
      if (st.unordered) {
        const left = [...st.unordered];
        while (left.length) {
          const item = await nextMsg();
          if (!item.msg) fail(i, `connection closed (${item.close})`);
          const k = left.findIndex((p) => !match(p, item.msg, { ...captures }));
          if (k < 0) fail(i, 'matches none of the unordered patterns', item.msg);
          match(left[k], item.msg, captures);
          left.splice(k, 1);
        }
        continue;
      }
      if (!st.expect) fail(i, 'unknown step');
      if (!st.repeat) {
        const item = await nextMsg();
        if (!item.msg) fail(i, `connection closed (${item.close})`);
        const d = match(st.expect, item.msg, captures);
        if (d) fail(i, d, item.msg);
        continue;
      }
      // repeat: consume matching messages until the following step's pattern matches
      const follow = steps[i + 1]?.expect;
      let n = 0;
      for (;;) {
        const item = await nextMsg();
        if (!item.msg) { pending = item; break; }
        if (follow && !match(follow, item.msg, { ...captures })) { pending = item; break; }
        const d = match(st.expect, item.msg, captures);
        if (d) {
          if (!follow) { pending = item; break; }
          fail(i, `neither the repeated pattern nor the next step matches: ${d}`, item.msg);
        }
        n++;
      }
      if (st.repeat === '+' && n === 0) fail(i, 'want at least one matching message');
    }
  } finally {
    c.close();
  }
  return { steps: steps.length };
}
