'use strict';
// A scripted JSON-RPC-over-WebSocket peer on the `ws` package, for testing the Neovim plugin's
// own WebSocket framing and JSON-RPC client against an independent implementation (the real
// server is tested in test_server.lua). Prints the port, then serves until stdin closes.
const path = require('node:path');
const modules = process.env.SPARK_NODE_MODULES || path.join(__dirname, '../node_modules');
const { WebSocketServer } = require(path.join(modules, 'ws'));

// `fake_rpc_server.js serve --host H --port P` (as `spark-agent serve` is called by the
// plugins' start commands) listens there and runs until killed; without arguments it picks a
// free port, prints it, and exits when its stdin closes.
const argv = process.argv.slice(2);
const serveMode = argv[0] === 'serve';
const arg = (name, d) => (argv.includes(name) ? argv[argv.indexOf(name) + 1] : d);

const wss = new WebSocketServer({
    port: Number(arg('--port', 0)), host: arg('--host', '127.0.0.1'), path: '/rpc',
    verifyClient: (info, done) => {
        if (info.req.headers.authorization !== 'Bearer secret') return done(false, 401);
        done(true);
    },
    handleProtocols: (protocols) => (protocols.has('spark-agent.jsonrpc.v1')
        ? 'spark-agent.jsonrpc.v1' : false),
});

// Apply an LSP content change (UTF-16 positions: JavaScript string indices) to `text`.
function applyChange(text, c) {
    if (!c.range) return c.text;
    const starts = [0];
    for (let i = 0; i < text.length; i++) if (text[i] === '\n') starts.push(i + 1);
    const off = (p) => {
        if (p.line >= starts.length) throw new Error('range past the end');
        const end = p.line + 1 < starts.length ? starts[p.line + 1] - 1 : text.length;
        return Math.min(starts[p.line] + p.character, end);
    };
    return text.slice(0, off(c.range.start)) + c.text + text.slice(off(c.range.end));
}

// The fake model: a suggestion derived from the cursor's line, so tests can predict nothing
// about it but its presence (as with the real tiny model's random weights).
let completionDelayMs = 0;

wss.on('connection', (ws) => {
    const waiting = new Map(); // server request id -> resolve
    const slow = new Map(); // request id -> respond-on-cancel
    const docs = new Map(); // uri -> { version, text }
    let initialized = false;
    const send = (m) => ws.send(JSON.stringify(m));
    ws.on('message', (data) => {
        const m = JSON.parse(String(data));
        if (m.id !== undefined && m.method === undefined) { // answer to our request
            waiting.get(m.id)?.(m);
            return;
        }
        const reply = (result) => send({ jsonrpc: '2.0', id: m.id, result });
        switch (m.method) {
        case 'initialize':
            if (initialized) {
                return send({ jsonrpc: '2.0', id: m.id,
                    error: { code: -32600, message: 'already initialized' } });
            }
            initialized = true;
            return reply({ protocolVersion: 1, model: { id: 'fake', fim: true },
                params: m.params, protocol: ws.protocol });
        case 'initialized': return undefined;
        case 'shutdown': return reply(null);
        case 'exit': return ws.close(1000, '');
        case 'echo': return reply(m.params);
        case 'stream': {
            for (const piece of ['a', 'é', 'ü€']) {
                send({ jsonrpc: '2.0', method: 'chat/delta', params: { id: m.id, content: piece } });
            }
            // one notification in three fragments
            const text = JSON.stringify({ jsonrpc: '2.0', method: 'chat/delta',
                params: { id: m.id, content: 'frag' } });
            ws.send(text.slice(0, 5), { fin: false });
            ws.send(text.slice(5, 20), { fin: false });
            ws.send(text.slice(20), { fin: true });
            send({ jsonrpc: '2.0', method: 'window/logMessage', params: { type: 3, message: 'hi' } });
            return reply({ done: true });
        }
        case 'textDocument/didOpen':
            docs.set(m.params.textDocument.uri,
                { version: m.params.textDocument.version, text: m.params.textDocument.text });
            return undefined;
        case 'textDocument/didChange': {
            const d = docs.get(m.params.textDocument.uri);
            try {
                for (const c of m.params.contentChanges) d.text = applyChange(d.text, c);
                d.version = m.params.textDocument.version;
            } catch (e) {
                docs.delete(m.params.textDocument.uri);
                send({ jsonrpc: '2.0', method: 'window/logMessage',
                    params: { type: 1, message: String(e.message) } });
            }
            return undefined;
        }
        case 'textDocument/didClose':
            docs.delete(m.params.textDocument.uri);
            return undefined;
        case 'spark/documentText': {
            const d = docs.get(m.params.textDocument.uri);
            if (!d) return send({ jsonrpc: '2.0', id: m.id, error: { code: -32010, message: 'not open' } });
            return reply({ version: d.version, text: d.text });
        }
        case 'fake/setDelay':
            completionDelayMs = m.params.ms;
            return reply(null);
        case 'textDocument/inlineCompletion': {
            const uri = m.params.textDocument?.uri;
            if (uri && !m.params.prefix && !docs.has(uri)) {
                return send({ jsonrpc: '2.0', id: m.id, error: { code: -32010, message: 'not open' } });
            }
            const answer = () => {
                if (!slow.has(m.id)) return;
                slow.delete(m.id);
                reply({ items: [{ insertText: `_${m.params.position?.line ?? 0}x(1);\nnext();`,
                    range: { start: m.params.position, end: m.params.position } }],
                cached: false, stopReason: 'eos',
                timings: { promptTokens: 10, cachedTokens: 0, generatedTokens: 4, ttftMs: 1,
                    totalMs: 2, tokensPerSecond: 123 } });
            };
            slow.set(m.id, () => send({ jsonrpc: '2.0', id: m.id,
                error: { code: -32800, message: 'request cancelled' } }));
            setTimeout(answer, completionDelayMs);
            return undefined;
        }
        case 'chat/completion': {
            const last = m.params.messages[m.params.messages.length - 1].content;
            const words = ['You', ' said: ', last];
            words.forEach((w) => send({ jsonrpc: '2.0', method: 'chat/delta',
                params: { id: m.id, content: w } }));
            return reply({ message: { role: 'assistant', content: words.join('') },
                finishReason: 'stop', usage: { promptTokens: 5, completionTokens: 3,
                    cachedTokens: 0, tokensPerSecond: 99 },
                turns: m.params.messages.length });
        }
        case 'agent/run': {
            const ev = (event) => send({ jsonrpc: '2.0', method: 'agent/event',
                params: { id: m.id, event } });
            ev({ type: 'text', text: 'Editing.' });
            waiting.set('s7', (ans) => {
                const ok = ans.result && ans.result.approved === true;
                ev({ type: 'tool_call', callId: 'c1', name: 'edit_file',
                    arguments: '{"path":"a.txt"}', decision: ok ? 'allow' : 'deny' });
                if (ok) {
                    ev({ type: 'tool_result', callId: 'c1', name: 'edit_file', ok: true,
                        content: '{"ok":true}' });
                    ev({ type: 'diff', callId: 'c1', name: 'edit_file',
                        diff: 'diff --git a/a.txt b/a.txt\n-old\n+new\n' });
                } else {
                    ev({ type: 'refused', callId: 'c1', name: 'edit_file', content: 'denied' });
                }
                ev({ type: 'stop', reason: 'answer', message: 'answered', steps: 2,
                    tool_calls: 1, refused: ok ? 0 : 1, invalid: 0, tool_errors: 0, tokens: 9 });
                reply({ stop: 'answer', message: 'answered', answer: ok ? 'Done.' : 'Not allowed.',
                    steps: 2, toolCalls: 1, toolErrors: 0, refused: ok ? 0 : 1, invalid: 0,
                    tokens: 9 });
            });
            return send({ jsonrpc: '2.0', id: 's7', method: 'agent/approval',
                params: { runId: m.id, callId: 'c1', tool: 'edit_file',
                    arguments: '{"path":"a.txt"}', kind: 'edit' } });
        }
        case 'big': return reply({ text: 'x'.repeat(m.params.n) });
        case 'ask': {
            waiting.set('s1', (ans) => reply({ answer: ans.result ?? null, error: ans.error ?? null }));
            return send({ jsonrpc: '2.0', id: 's1', method: 'agent/approval',
                params: { runId: m.id, tool: 'edit_file' } });
        }
        case 'slow':
            slow.set(m.id, () => send({ jsonrpc: '2.0', id: m.id,
                error: { code: -32800, message: 'request cancelled' } }));
            return undefined;
        case '$/cancelRequest': {
            const f = slow.get(m.params.id);
            slow.delete(m.params.id);
            return f?.();
        }
        case 'ping':
            ws.ping();
            return reply('pinged');
        case 'goodbye':
            reply('bye');
            return ws.close(1000, 'done');
        default:
            if (m.id !== undefined) {
                send({ jsonrpc: '2.0', id: m.id, error: { code: -32601, message: 'no ' + m.method } });
            }
        }
        return undefined;
    });
    ws.on('pong', () => send({ jsonrpc: '2.0', method: 'test/pong', params: {} }));
});
wss.on('listening', () => console.log(wss.address().port));
if (!serveMode) {
    process.stdin.on('end', () => process.exit(0));
    process.stdin.resume();
}
