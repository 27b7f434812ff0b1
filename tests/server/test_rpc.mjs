// The WebSocket JSON-RPC protocol (docs/protocol.md) against a real `spark-agent serve` on the
// tiny model, with the `ws` npm client: every fixture of tests/fixtures/protocol replayed
// (lifecycle, malformed messages, documents with UTF-16 positions, completion with its cache,
// chat streaming with tools, cancel mid-stream, an agent run with approvals in a workspace),
// then the handshake (token by header or subprotocol, none or wrong: 401), oversized and binary
// frames (closed, the server keeps serving), concurrent requests on one connection, and a
// client that disconnects mid-stream (its work stops; the server keeps serving).
import fs from 'node:fs';
import path from 'node:path';
import { startServer, checker, tmpDir, sleep, metric } from './serve_util.mjs';
import { loadFixtures, replayFixture, makeWorkspace, fixtureServerEnv, connect, serverCaps }
  from './rpc_replay.mjs';

const { check, failures } = checker();
class Done extends Error {}
const SRC = process.env.SPARK_SOURCE_DIR;
// Tool calls are grammar-constrained and slow under ASan: SPARK_TEST_TOOLS=0 leaves the fixtures
// that need tools to the slow row, which runs them alone (SPARK_TEST_TOOLS=only).
const TOOLS = process.env.SPARK_TEST_TOOLS ?? '1';
const needsTools = (f) => (f.needs ?? []).includes('tools');
const fixtures = loadFixtures(path.join(SRC, 'tests/fixtures/protocol'))
  .filter((f) => (TOOLS === '0' ? !needsTools(f) : TOOLS === 'only' ? needsTools(f) : true));
if (TOOLS === '0') console.log('fixtures needing tools run in the slow row (test_rpc_tools)');
let skipped = [];

async function replay(fx, srv, vars) {
  const url = `ws://127.0.0.1:${srv.port}/rpc`;
  const t0 = Date.now();
  try {
    const r = await replayFixture(fx, { url, token: srv.token, vars });
    if (r.skipped) skipped.push(`${fx.file}: ${r.skipped}`);
    else console.log(`ok ${fx.file} (${r.steps} steps, ${Date.now() - t0} ms)`);
  } catch (e) {
    check(false, `${fx.file}: ${e.message}`);
  }
}

const T0 = Date.now();
const lap = (what) => console.log(`${what}: ${Date.now() - T0} ms`);
// 1. fixtures without an agent script share one server
const srv = await startServer({ tag: 'rpc' });
lap('server started');
try {
  for (const fx of fixtures.filter((f) => !f.agentScript && !f.workspace)) await replay(fx, srv, {});
  const url = `ws://127.0.0.1:${srv.port}/rpc`;

  lap('fixtures replayed');
  if (TOOLS === 'only') throw new Done();
  // 2. the handshake: the token by subprotocol works, none or a wrong one is refused
  const viaProto = await connect(url, srv.token, { viaSubprotocol: true });
  check(viaProto.ws.protocol === 'spark-agent.jsonrpc.v1',
        `selected subprotocol ${viaProto.ws.protocol}`);
  viaProto.send({ jsonrpc: '2.0', id: 1, method: 'initialize', params: {} });
  check((await viaProto.next()).msg?.result?.protocolVersion === 1, 'initialize via subprotocol token');
  viaProto.close();
  for (const bad of ['', 'wrong-token-0123456789']) {
    let refused = '';
    try { (await connect(url, bad)).close(); } catch (e) { refused = e.message; }
    check(/401/.test(refused), `handshake with token '${bad}': ${refused || 'accepted'}`);
  }

  // 3. an oversized message and a binary frame close that connection; the server keeps serving
  const big = await connect(url, srv.token);
  big.send('{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"pad":"' + 'x'.repeat(9 << 20) + '"}}');
  const closedBig = await big.next();
  check(closedBig.close === 1009, `oversized message: ${JSON.stringify(closedBig)}`);
  const bin = await connect(url, srv.token);
  bin.ws.send(Buffer.from([1, 2, 3]), { binary: true });
  const closedBin = await bin.next();
  check(closedBin.close === 1003, `binary frame: ${JSON.stringify(closedBin)}`);

  lap('handshake and limits');
  // 4. concurrent requests on one connection: each gets its own answer, deltas name their id
  const c = await connect(url, srv.token);
  c.send({ jsonrpc: '2.0', id: 1, method: 'initialize', params: {} });
  const init = (await c.next()).msg.result;
  const fim = init.model.fim;
  c.send({ jsonrpc: '2.0', id: 10, method: 'chat/completion',
           params: { messages: [{ role: 'user', content: 'one' }], max_tokens: 6, temperature: 0 } });
  c.send({ jsonrpc: '2.0', id: 11, method: 'chat/completion',
           params: { messages: [{ role: 'user', content: 'two' }], max_tokens: 6, temperature: 0 } });
  if (fim) c.send({ jsonrpc: '2.0', id: 12, method: 'textDocument/inlineCompletion',
                    params: { prefix: 'int x = ', suffix: ';\n', maxTokens: 4 } });
  const want = new Set(fim ? [10, 11, 12] : [10, 11]);
  const text = { 10: '', 11: '' };
  while (want.size) {
    const { msg } = await c.next();
    if (!msg) { check(false, 'connection closed during concurrent requests'); break; }
    if (msg.method === 'chat/delta') {
      check(msg.params.id in text, `delta for ${msg.params.id}`);
      text[msg.params.id] += msg.params.content ?? '';
    } else if (msg.id !== undefined) {
      check(want.has(msg.id) && !msg.error, `answer ${JSON.stringify(msg).slice(0, 200)}`);
      if (msg.id !== 12) check(msg.result.message.content === text[msg.id],
                               `deltas of ${msg.id} add up to the message`);
      want.delete(msg.id);
    }
  }
  // the same chat again: identical greedy output, its prompt served from the prefix cache
  c.send({ jsonrpc: '2.0', id: 13, method: 'chat/completion',
           params: { messages: [{ role: 'user', content: 'one' }], max_tokens: 6, temperature: 0 } });
  for (;;) {
    const { msg } = await c.next();
    if (msg.id !== 13) continue;
    check(msg.result.message.content === text[10], 'greedy chat repeated gives the same text');
    check(msg.result.usage.cachedTokens > 0, `cachedTokens ${msg.result.usage.cachedTokens}`);
    break;
  }

  lap('concurrent requests');
  // 5. a client that disconnects mid-stream: its job is cancelled, the server keeps serving
  const CANCELED = 'spark_generations_total{finish="canceled"}';
  const before = await metric(srv, CANCELED) ?? 0;
  const d = await connect(url, srv.token);
  d.send({ jsonrpc: '2.0', id: 1, method: 'initialize', params: {} });
  await d.next();
  d.send({ jsonrpc: '2.0', id: 2, method: 'chat/completion',
           params: { messages: [{ role: 'user', content: 'long' }], max_tokens: 2000, temperature: 0 } });
  for (;;) { const { msg } = await d.next(); if (msg?.method === 'chat/delta') break; }
  d.ws.terminate();
  await sleep(500);
  c.send({ jsonrpc: '2.0', id: 14, method: 'chat/completion',
           params: { messages: [{ role: 'user', content: 'after' }], max_tokens: 2 } });
  for (;;) { const { msg } = await c.next(); if (msg.id === 14) { check(!!msg.result, 'serves after a disconnect'); break; } }
  const after = await metric(srv, CANCELED);
  check(after > before, `cancelled generations ${before} -> ${after}`);
  c.close();
} catch (e) {
  if (!(e instanceof Done)) throw e;
} finally {
  const code = await srv.stop();
  check(code === 0, `serve exit ${code}: ${srv.stderr().slice(-2000)}`);
}

lap('disconnect, server stopped');
// 6. fixtures with an agent script and a workspace: their own server each
for (const fx of fixtures.filter((f) => f.agentScript || f.workspace)) {
  const dir = tmpDir('rpc_agent');
  const ws = makeWorkspace(fx.workspace?.files ?? {});
  const asrv = await startServer({ tag: 'rpc_agent', env: fixtureServerEnv(fx, dir) });
  try {
    await replay(fx, asrv, ws);
    if (fx.file.startsWith('08-')) {
      check(fs.readFileSync(path.join(ws.WORKSPACE_PATH, 'hello.txt'), 'utf8') === 'goodbye world\n',
            'the approved edit was made');
      check(!fs.existsSync(path.join(ws.WORKSPACE_PATH, 'new.txt')), 'the denied file was not created');
      // cancel a run while it waits for an approval: -32800 with the run's summary, nothing
      // written (a new connection starts the script again: reply 0 asks to edit hello.txt)
      const c = await connect(`ws://127.0.0.1:${asrv.port}/rpc`, asrv.token);
      c.send({ jsonrpc: '2.0', id: 1, method: 'initialize',
               params: { workspaceFolders: [{ uri: ws.WORKSPACE_URI, name: 'ws' }] } });
      await c.next();
      c.send({ jsonrpc: '2.0', id: 2, method: 'agent/run',
               params: { root: ws.WORKSPACE_PATH, task: 'edit', approval: 'ask', workDoneToken: 'w' } });
      let asked = false, progress = 0;
      for (;;) {
        const { msg } = await c.next();
        if (!msg) { check(false, 'closed during the cancelled run'); break; }
        if (msg.method === '$/progress') progress++;
        if (msg.method === 'agent/approval') {
          asked = true;
          c.send({ jsonrpc: '2.0', method: '$/cancelRequest', params: { id: 2 } });
        }
        if (msg.id === 2) {
          check(asked && msg.error?.code === -32800 && msg.error.data?.stop === 'canceled',
                `cancelled run answer ${JSON.stringify(msg)}`);
          break;
        }
      }
      check(progress >= 2, `progress notifications of the run: ${progress}`);
      check(fs.readFileSync(path.join(ws.WORKSPACE_PATH, 'hello.txt'), 'utf8') === 'goodbye world\n',
            'nothing written by the cancelled run');
      c.close();
    }
  } finally {
    const code = await asrv.stop();
    check(code === 0, `serve exit ${code}: ${asrv.stderr().slice(-2000)}`);
    ws.cleanup();
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

lap('agent runs');
// the tiny model has every capability the fixtures need: a skip here is a failure
for (const s of skipped) check(false, `skipped ${s}`);
if (failures()) {
  console.error(`test_rpc: ${failures()} failure(s)`);
  process.exit(1);
}
console.log('test_rpc: all checks passed');
