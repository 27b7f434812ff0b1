'use strict';
// A scripted JSON-RPC-over-WebSocket peer on the `ws` package, for testing the Neovim plugin's
// own WebSocket framing and JSON-RPC client against an independent implementation (the real
// server is tested in test_server.lua). Prints the port, then serves until stdin closes.
const path = require('node:path');
const modules = process.env.SPARK_NODE_MODULES || path.join(__dirname, '../node_modules');
const { WebSocketServer } = require(path.join(modules, 'ws'));

const wss = new WebSocketServer({
    port: 0, host: '127.0.0.1', path: '/rpc',
    verifyClient: (info, done) => {
        if (info.req.headers.authorization !== 'Bearer secret') return done(false, 401);
        done(true);
    },
    handleProtocols: (protocols) => (protocols.has('spark-agent.jsonrpc.v1')
        ? 'spark-agent.jsonrpc.v1' : false),
});

wss.on('connection', (ws) => {
    const waiting = new Map(); // server request id -> resolve
    const slow = new Map(); // request id -> respond-on-cancel
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
            return reply({ protocolVersion: 1, model: { id: 'fake', fim: true },
                params: m.params, protocol: ws.protocol });
        case 'initialized': return undefined;
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
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
