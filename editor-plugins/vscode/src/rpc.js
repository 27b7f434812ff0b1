'use strict';
// The client side of spark-agent's editor protocol (docs/protocol.md): JSON-RPC 2.0 over one
// WebSocket, LSP-style lifecycle, requests with streamed notifications routed to the request
// that caused them, server-to-client requests (agent/approval), $/cancelRequest. No VS Code
// API here: the extension and the tests use the same client.

const { EventEmitter } = require('node:events');

const SUBPROTOCOL = 'spark-agent.jsonrpc.v1';

/** Error codes of docs/protocol.md section 9. */
const codes = {
    ParseError: -32700, InvalidRequest: -32600, MethodNotFound: -32601, InvalidParams: -32602,
    InternalError: -32603, ServerNotInitialized: -32002, RequestCancelled: -32800,
    DocumentNotOpen: -32010, ContextTooLong: -32011, Busy: -32012, Unsupported: -32013,
    NotAllowed: -32014, TooLarge: -32015,
};

class RpcError extends Error {
    constructor(code, message, data) {
        super(message);
        this.name = 'RpcError';
        this.code = code;
        this.data = data;
    }
}

/** Notifications that stream a request's output name it in params.id. */
const STREAMED = new Set(['chat/delta', 'agent/event']);

class RpcClient extends EventEmitter {
    /**
     * @param {object} opts
     * @param {string} opts.url    ws://host:port/rpc
     * @param {string} [opts.token] sent as Authorization: Bearer on the handshake
     * @param {Function} [opts.WebSocket] constructor (default: the `ws` package)
     * @param {number} [opts.pingMs=30000] keep-alive pings (the server closes idle connections)
     *
     * Events: 'notification' (method, params) for notifications not tied to a request,
     * 'progress' (token, value), 'log' (params of window/logMessage), 'close' (code, reason),
     * 'error' is never emitted (failures reject the pending requests instead).
     */
    constructor(opts) {
        super();
        this.url = opts.url;
        this.token = opts.token;
        this.WebSocket = opts.WebSocket ?? require('ws');
        this.pingMs = opts.pingMs ?? 30000;
        this.ws = null;
        this.nextId = 1;
        this.pending = new Map(); // id -> { resolve, reject, onNotify, method }
        this.handlers = new Map(); // server request method -> async (params) => result
        this.initResult = null;
        this.closed = true;
        this.pingTimer = null;
    }

    /**
     * Open the connection and run `initialize` + `initialized`. Resolves to the initialize
     * result (capabilities, model, limits); rejects with the handshake failure (401/403 from the
     * server, refused connection) or the initialize error.
     */
    async connect(initParams = {}) {
        const headers = {};
        if (this.token) headers.Authorization = `Bearer ${this.token}`;
        const ws = new this.WebSocket(this.url, [SUBPROTOCOL], { headers });
        this.ws = ws;
        await new Promise((resolve, reject) => {
            const fail = (err) => { cleanup(); reject(err); };
            const unexpected = (_req, res) => {
                cleanup();
                reject(new Error(`handshake refused: HTTP ${res.statusCode} ${res.statusMessage}`));
                res.resume();
            };
            const open = () => { cleanup(); resolve(); };
            const cleanup = () => {
                ws.off('open', open);
                ws.off('error', fail);
                ws.off('unexpected-response', unexpected);
            };
            ws.on('open', open);
            ws.on('error', fail);
            ws.on('unexpected-response', unexpected);
        });
        this.closed = false;
        ws.on('message', (data, isBinary) => this.onFrame(data, isBinary));
        ws.on('error', () => {}); // a 'close' follows; pending requests are rejected there
        ws.on('close', (code, reason) => this.onClose(code, String(reason)));
        if (this.pingMs > 0 && typeof ws.ping === 'function') {
            this.pingTimer = setInterval(() => { try { ws.ping(); } catch { /* closing */ } },
                this.pingMs);
            this.pingTimer.unref?.();
        }
        this.initResult = await this.request('initialize', initParams).promise;
        this.notify('initialized', {});
        return this.initResult;
    }

    /**
     * Send a request. Returns { id, promise, cancel }: the promise resolves to the result or
     * rejects with an RpcError (code -32800 after cancel(), with error.data where the method puts
     * a partial result there). `onNotify(method, params)` receives the request's streamed
     * notifications (chat/delta, agent/event) in order.
     */
    request(method, params, onNotify) {
        const id = this.nextId++;
        let resolve, reject;
        const promise = new Promise((res, rej) => { resolve = res; reject = rej; });
        if (this.closed || !this.ws) {
            reject(new RpcError(codes.InternalError, 'not connected'));
            return { id, promise, cancel: () => {} };
        }
        this.pending.set(id, { resolve, reject, onNotify, method });
        this.send({ jsonrpc: '2.0', id, method, params: params ?? {} });
        const cancel = () => {
            if (this.pending.has(id) && !this.closed) this.notify('$/cancelRequest', { id });
        };
        return { id, promise, cancel };
    }

    notify(method, params) {
        if (!this.closed) this.send({ jsonrpc: '2.0', method, params: params ?? {} });
    }

    /** Answer server requests of `method` (agent/approval) with `handler(params)`'s result. */
    onRequest(method, handler) {
        this.handlers.set(method, handler);
    }

    send(msg) {
        this.ws.send(JSON.stringify(msg));
    }

    onFrame(data, isBinary) {
        if (isBinary) return;
        let msg;
        try {
            msg = JSON.parse(String(data));
        } catch {
            this.emit('log', { type: 1, message: 'unparsable frame from the server' });
            return;
        }
        if (msg === null || typeof msg !== 'object') return;
        if (msg.method !== undefined && msg.id !== undefined) {
            this.answer(msg);
        } else if (msg.method !== undefined) {
            this.dispatch(msg.method, msg.params ?? {});
        } else if (msg.id !== undefined && msg.id !== null) {
            const p = this.pending.get(msg.id);
            if (!p) return;
            this.pending.delete(msg.id);
            if (msg.error) p.reject(new RpcError(msg.error.code, msg.error.message, msg.error.data));
            else p.resolve(msg.result);
        } else if (msg.error) {
            // id null: a transport-level error (parse error, too large) of an unknown request
            this.emit('log', { type: 1, message: `server: ${msg.error.message}` });
        }
    }

    dispatch(method, params) {
        if (STREAMED.has(method) && this.pending.has(params.id)) {
            const p = this.pending.get(params.id);
            if (p.onNotify) p.onNotify(method, params);
            return;
        }
        if (method === '$/progress') this.emit('progress', params.token, params.value);
        else if (method === 'window/logMessage') this.emit('log', params);
        else this.emit('notification', method, params);
    }

    async answer(msg) {
        const h = this.handlers.get(msg.method);
        let reply;
        if (!h) {
            reply = { jsonrpc: '2.0', id: msg.id,
                error: { code: codes.MethodNotFound, message: `client has no ${msg.method}` } };
        } else {
            try {
                reply = { jsonrpc: '2.0', id: msg.id, result: await h(msg.params ?? {}) };
            } catch (e) {
                reply = { jsonrpc: '2.0', id: msg.id,
                    error: { code: codes.InternalError, message: String(e?.message ?? e) } };
            }
        }
        if (!this.closed) this.send(reply);
    }

    onClose(code, reason) {
        this.closed = true;
        clearInterval(this.pingTimer);
        this.pingTimer = null;
        for (const [, p] of this.pending) {
            p.reject(new RpcError(codes.InternalError, `connection closed (${code} ${reason})`));
        }
        this.pending.clear();
        this.emit('close', code, reason);
    }

    /** shutdown + exit, then wait for the close (at most `ms`). */
    async dispose(ms = 2000) {
        if (this.closed) return;
        try {
            await Promise.race([this.request('shutdown').promise,
                new Promise((r) => setTimeout(r, ms))]);
        } catch { /* closing anyway */ }
        if (this.closed) return;
        const closed = new Promise((r) => this.once('close', r));
        this.notify('exit', {});
        const t = setTimeout(() => this.ws.terminate?.(), ms);
        await closed;
        clearTimeout(t);
    }
}

module.exports = { RpcClient, RpcError, codes, SUBPROTOCOL };
