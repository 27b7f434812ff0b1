// What a developer's laptop needs from `spark-agent serve`: the token on every route (Bearer or
// x-api-key) and on the WebSocket handshake, Host and Origin allow-lists against DNS
// rebinding, CORS only for an explicitly allowed Origin and never with credentials, limits on
// body size, JSON depth and connections per client, a token file created with mode 0600, a
// public address only with --listen-public; malformed input gets the right status and the
// server keeps serving. Raw node:http requests so that Host and Content-Length are ours.
import http from 'node:http';
import net from 'node:net';
import fs from 'node:fs';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { startServer, checker, tmpDir, CLI, sleep } from './serve_util.mjs';

const { check, failures } = checker();

function raw(srv, { method = 'GET', path: p = '/health', headers = {}, body, token } = {}) {
  return new Promise((resolve, reject) => {
    const h = { host: `127.0.0.1:${srv.port}`, ...headers };
    if (token !== null) h.authorization ??= `Bearer ${token ?? srv.token}`;
    if (body !== undefined) h['content-length'] ??= Buffer.byteLength(body);
    const r = http.request({ host: '127.0.0.1', port: srv.port, method, path: p, headers: h,
      agent: false }, (res) => {
      let text = '';
      res.on('data', (d) => { text += d; });
      res.on('end', () => {
        let json;
        try { json = JSON.parse(text); } catch { json = undefined; }
        resolve({ status: res.statusCode, headers: res.headers, text, json });
      });
    });
    r.on('error', (e) => reject(new Error(method + ' ' + p + ' ' + JSON.stringify(headers) + ': ' + e.message)));
    if (body !== undefined) r.write(body);
    r.end();
  });
}

const ORIGIN = 'http://editor.example:3000';
const srv = await startServer({ tag: 'security', args: ['--max-body', '4096', '--max-conns', '6',
  '--allow-origin', ORIGIN, '--allow-host', 'box.lan:1234', '--idle-timeout', '3'] });
try {
  // the token
  let r = await raw(srv, { token: null });
  check(r.status === 401 && r.json?.error?.type === 'authentication_error', 'no token: 401');
  r = await raw(srv, { token: 'x'.repeat(48) });
  check(r.status === 401, 'wrong token: 401');
  r = await raw(srv, { headers: { authorization: `Basic ${srv.token}` } });
  check(r.status === 401, 'not Bearer: 401');
  r = await raw(srv, { token: null, headers: { 'x-api-key': srv.token } });
  check(r.status === 200 && r.json?.status === 'ok', 'x-api-key: 200');
  r = await raw(srv, { path: '/metrics', token: null });
  check(r.status === 401, '/metrics needs the token too');
  r = await raw(srv, { path: '/v1/models' });
  check(r.status === 200 && r.json?.data?.length === 1, 'Bearer: 200');

  // Host: IP literals and localhost with our port, names only when allowed
  for (const [host, want] of [[`localhost:${srv.port}`, 200], [`127.0.0.1:${srv.port}`, 200],
    [`[::1]:${srv.port}`, 200], ['box.lan:1234', 200], [`evil.example:${srv.port}`, 403],
    [`127.0.0.1:${srv.port + 1}`, 403], ['localhost', 403], [`attacker.localhost.evil:${srv.port}`, 403]]) {
    r = await raw(srv, { headers: { host } });
    check(r.status === want, `Host ${host}: ${r.status}, want ${want}`);
  }
  // Origin: none (not a browser) or allowed; a web page elsewhere is refused
  r = await raw(srv, { headers: { origin: 'http://evil.example' } });
  check(r.status === 403, 'foreign Origin: 403');
  r = await raw(srv, { headers: { origin: 'null' } });
  check(r.status === 403, 'Origin null: 403');
  r = await raw(srv, { headers: { origin: ORIGIN } });
  check(r.status === 200 && r.headers['access-control-allow-origin'] === ORIGIN &&
    !('access-control-allow-credentials' in r.headers), 'allowed Origin: exact ACAO, no credentials');
  r = await raw(srv, { headers: { origin: `http://127.0.0.1:${srv.port}` } });
  check(r.status === 200 && !('access-control-allow-origin' in r.headers),
    'own origin: allowed, no CORS header');
  r = await raw(srv, { method: 'OPTIONS', path: '/v1/chat/completions', token: null,
    headers: { origin: ORIGIN, 'access-control-request-method': 'POST' } });
  check(r.status === 204 && r.headers['access-control-allow-origin'] === ORIGIN &&
    /authorization/.test(r.headers['access-control-allow-headers'] || ''), 'preflight allowed');
  r = await raw(srv, { method: 'OPTIONS', path: '/v1/chat/completions', token: null,
    headers: { origin: 'http://evil.example' } });
  check(r.status === 403 && !('access-control-allow-origin' in r.headers), 'preflight refused');

  // bodies and JSON
  const chat = '/v1/chat/completions';
  r = await raw(srv, { method: 'POST', path: chat, body: '{"messages": [' });
  check(r.status === 400 && r.json?.error?.code === 'invalid_json', 'malformed JSON: 400');
  r = await raw(srv, { method: 'POST', path: chat, body: '[1, 2]' });
  check(r.status === 400, 'JSON not an object: 400');
  r = await raw(srv, { method: 'POST', path: chat, body: '['.repeat(80) + ']'.repeat(80) });
  check(r.status === 400 && /deep/.test(r.json?.error?.message), 'JSON too deep: 400');
  r = await raw(srv, { method: 'POST', path: chat, body: JSON.stringify({ messages: [{ role: 'user',
    content: 'x'.repeat(5000) }] }) });
  check(r.status === 413, 'body over --max-body: 413');
  r = await raw(srv, { method: 'POST', path: chat, body: '{}', headers: { 'content-length': '2' } });
  check(r.status === 400 && /messages/.test(r.json?.error?.message), 'no messages: 400');
  r = await raw(srv, { method: 'POST', path: chat, body: JSON.stringify({ messages: [{ role: 'wizard',
    content: 'x' }] }) });
  check(r.status === 400 && /role/.test(r.json?.error?.message), 'unknown role: 400');
  r = await raw(srv, { method: 'POST', path: chat, body: JSON.stringify({ messages: [{ role: 'user',
    content: 'x' }], temperature: 'hot' }) });
  check(r.status === 400 && r.json?.error?.param === 'temperature', 'bad temperature: 400');
  r = await raw(srv, { method: 'POST', path: chat, body: JSON.stringify({ messages: [{ role: 'user',
    content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }) });
  check(r.status === 400, 'image part: 400');
  r = await raw(srv, { method: 'POST', path: '/v1/completions',
    body: JSON.stringify({ prompt: 'a'.repeat(3000), max_tokens: 1 }) });
  check(r.status === 200 || r.status === 400, 'long prompt: answered ' + r.status);
  r = await raw(srv, { method: 'GET', path: chat });
  check(r.status === 405, 'GET on a POST route: 405');
  r = await raw(srv, { path: '/v2/nothing' });
  check(r.status === 404, 'unknown path: 404');
  r = await raw(srv, { method: 'POST', path: '/v1/models', body: '{}' });
  check(r.status === 405, 'POST with a body on a GET route: 405');

  // a refusal sent before the body was read still reaches the client: curl posting a large
  // body without waiting for 100 Continue (as SDKs do) gets the status, never a reset
  const bigFile = path.join(srv.dir, 'big.json');
  fs.writeFileSync(bigFile, '{"messages": "' + 'a'.repeat(3 << 20) + '"}');
  const curl = (args) => spawnSync('curl', ['-s', '-o', '/dev/null', '-w', '%{http_code}',
    '-H', 'Expect:', '-H', 'content-type: application/json', '--data-binary', '@' + bigFile,
    ...args], { encoding: 'utf8', timeout: 30000 });
  for (const [what, args, want] of [
    ['wrong token', ['-H', 'authorization: Bearer ' + 'x'.repeat(48), srv.url + chat], '401'],
    ['no token', [srv.url + chat], '401'],
    ['over --max-body', ['-H', `authorization: Bearer ${srv.token}`, srv.url + chat], '413'],
    ['unknown path', ['-H', `authorization: Bearer ${srv.token}`, srv.url + '/v1/nothing'], '404']]) {
    let got = [];
    for (let i = 0; i < 8; i++) {
      const c = curl(args);
      got.push(c.error ? 'spawn: ' + c.error.message : c.status === 0 ? c.stdout : `curl ${c.status}`);
    }
    check(got.every((x) => x === want), `large body, ${what}: ${want} every time (${got})`);
  }
  r = await raw(srv, { method: 'POST', path: chat, token: 'y'.repeat(48),
    body: 'z'.repeat(2 << 20) });
  check(r.status === 401, 'node http, large body, wrong token: 401');

  // WebSocket handshake: token and Origin before anything else
  const wsHandshake = (headers, p = '/rpc') => raw(srv, { path: p, token: null, headers: {
    connection: 'Upgrade', upgrade: 'websocket', 'sec-websocket-version': '13',
    'sec-websocket-key': 'dGhlIHNhbXBsZSBub25jZQ==', ...headers } });
  r = await wsHandshake({});
  check(r.status === 401, 'WS without a token: 401 before the upgrade (' + r.status + ')');
  r = await wsHandshake({ 'sec-websocket-protocol': 'spark-agent.jsonrpc.v1, spark-agent.token.nope' });
  check(r.status === 401, 'WS with a wrong token subprotocol: 401');
  r = await wsHandshake({ authorization: `Bearer ${srv.token}`, origin: 'http://evil.example' });
  check(r.status === 403, 'WS from a foreign Origin: 403');
  r = await wsHandshake({ authorization: `Bearer ${srv.token}` }, '/elsewhere');
  check(r.status === 404, 'WS on another path: 404');

  // connections per client: the 7th open connection is refused, and a slot frees on close
  const socks = [];
  for (let i = 0; i < 6; i++) {
    const s = net.connect(srv.port, '127.0.0.1');
    await new Promise((res) => s.on('connect', res));
    socks.push(s);
  }
  await sleep(200);
  const refused = await raw(srv).then(() => false, () => true);
  check(refused, 'connection over --max-conns refused');
  for (const s of socks) s.destroy();
  await sleep(300);
  r = await raw(srv);
  check(r.status === 200, 'after closing: served again');

  // a client that sends half a body and stops must not wedge the server
  const half = net.connect(srv.port, '127.0.0.1');
  await new Promise((res) => half.on('connect', res));
  half.write(`POST ${chat} HTTP/1.1\r\nHost: 127.0.0.1:${srv.port}\r\nAuthorization: Bearer ` +
    `${srv.token}\r\nContent-Length: 100\r\n\r\n{"mess`);
  const halfClosed = new Promise((res) => half.on('close', () => res(Date.now())));
  const t0 = Date.now();
  r = await raw(srv);
  check(r.status === 200, 'served while another client stalls mid-body');
  // idle clients time out: the stalled body and a connection that never sends anything
  const idle = net.connect(srv.port, '127.0.0.1');
  const idleClosed = new Promise((res) => idle.on('close', () => res(Date.now())));
  idle.on('error', () => {});
  half.on('error', () => {});
  const timeout = sleep(12000).then(() => 0);
  const [tHalf, tIdle] = await Promise.all([Promise.race([halfClosed, timeout]),
    Promise.race([idleClosed, timeout])]);
  check(tHalf && tHalf - t0 < 10000, `stalled body: closed by the server (${tHalf && tHalf - t0} ms)`);
  check(tIdle && tIdle - t0 < 10000, `silent connection: closed by the server (${tIdle && tIdle - t0} ms)`);
  half.destroy();
  idle.destroy();
} catch (e) {
  check(false, 'unexpected: ' + (e.stack || e));
} finally {
  const code = await srv.stop();
  check(code === 0, 'exit 0 after SIGTERM (' + code + ')');
}

// the token file: created 0600 on first start, reused after; others' readable file refused
{
  const dir = tmpDir('token');
  const env = { ...process.env, XDG_CONFIG_HOME: dir };
  delete env.SPARK_API_KEY;
  const s1 = await startServer({ tag: 'token1', env: { XDG_CONFIG_HOME: dir, SPARK_API_KEY: '' } });
  const file = path.join(dir, 'spark-agent', 'token');
  const st = fs.statSync(file);
  const tok = fs.readFileSync(file, 'utf8').trim();
  check((st.mode & 0o777) === 0o600 && /^[0-9a-f]{64}$/.test(tok), 'token file: 0600, 64 hex');
  check(s1.stdout().includes(file), 'start-up line names the token file');
  let r = await fetch(s1.url + '/health', { headers: { authorization: `Bearer ${tok}` } });
  check(r.status === 200, 'the file token works');
  await s1.stop();
  const s2 = await startServer({ tag: 'token2', env: { XDG_CONFIG_HOME: dir, SPARK_API_KEY: '' } });
  r = await fetch(s2.url + '/health', { headers: { authorization: `Bearer ${tok}` } });
  check(r.status === 200 && fs.readFileSync(file, 'utf8').trim() === tok, 'token reused');
  await s2.stop();
  fs.chmodSync(file, 0o644);
  const p = spawnSync(CLI, ['serve', '--port', '0'], { env, encoding: 'utf8', timeout: 30000 });
  check(p.status === 1 && /readable by others/.test(p.stderr), 'world-readable token refused: ' +
    p.stderr);
  fs.rmSync(dir, { recursive: true, force: true });
}

// a public address needs --listen-public
{
  const p = spawnSync(CLI, ['serve', '--host', '0.0.0.0', '--port', '0'], {
    env: { ...process.env, SPARK_API_KEY: 'k'.repeat(32) }, encoding: 'utf8', timeout: 30000 });
  check(p.status === 1 && /--listen-public/.test(p.stderr), 'public bind refused: ' + p.stderr);
  const q = spawnSync(CLI, ['serve', '--port', '99999'], { encoding: 'utf8', timeout: 30000 });
  check(q.status === 2, 'bad port: usage error');
}

if (failures()) process.exit(1);
console.log('test_security: ok');
