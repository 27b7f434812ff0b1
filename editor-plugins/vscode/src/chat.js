'use strict';
// Chat and agent runs over the protocol (docs/protocol.md sections 6 and 7), without any UI:
// the webview (extension.js) and the tests drive these.

const { codes } = require('./rpc');

class ChatSession {
    /** @param {import('./rpc').RpcClient} client */
    constructor(client, opts = {}) {
        this.client = client;
        this.opts = opts; // max_tokens, temperature, system
        this.messages = opts.system ? [{ role: 'system', content: opts.system }] : [];
        this.current = null;
    }

    /**
     * Send a user message; `onDelta({content?, toolCall?})` gets the streamed pieces. Resolves to
     * { message, finishReason, usage, cancelled }. The conversation keeps the user message and the
     * answer (the partial one after a cancel). Rejects on other errors (the user message is then
     * dropped from the history, so the user can retry).
     */
    async send(text, onDelta) {
        const user = { role: 'user', content: text };
        const params = { messages: [...this.messages, user] };
        if (this.opts.max_tokens !== undefined) params.max_tokens = this.opts.max_tokens;
        if (this.opts.temperature !== undefined) params.temperature = this.opts.temperature;
        const h = this.client.request('chat/completion', params, (method, p) => {
            if (method === 'chat/delta' && onDelta) onDelta(p);
        });
        this.current = h;
        try {
            const r = await h.promise;
            this.messages.push(user, r.message);
            return { message: r.message, finishReason: r.finishReason, usage: r.usage,
                cancelled: false };
        } catch (e) {
            if (e && e.code === codes.RequestCancelled) {
                const partial = e.data && e.data.message
                    ? e.data.message : { role: 'assistant', content: '' };
                this.messages.push(user, partial);
                return { message: partial, finishReason: 'cancelled', usage: null,
                    cancelled: true };
            }
            throw e;
        } finally {
            if (this.current === h) this.current = null;
        }
    }

    cancel() {
        if (this.current) this.current.cancel();
    }

    reset() {
        this.messages = this.messages.filter((m) => m.role === 'system');
    }
}

/**
 * Routes agent/approval requests to the run that asked (params.runId is the agent/run request
 * id). Install once per client.
 */
class Approvals {
    constructor(client) {
        this.byRun = new Map();
        client.onRequest('agent/approval', async (params) => {
            const ask = this.byRun.get(params.runId);
            if (!ask) return { approved: false };
            return { approved: (await ask(params)) === true };
        });
    }
}

/**
 * Start an agent run. `onEvent(event)` gets every agent/event in order; `ask(params)` decides
 * approvals (resolve true to approve). Returns { id, promise, cancel }; the promise resolves to
 * the final result, also for a cancelled run (the result from error.data, stop "canceled").
 */
function runAgent(client, approvals, params, onEvent, ask) {
    const h = client.request('agent/run', params, (method, p) => {
        if (method === 'agent/event' && onEvent) onEvent(p.event);
    });
    approvals.byRun.set(h.id, ask);
    const promise = h.promise.then(
        (r) => { approvals.byRun.delete(h.id); return r; },
        (e) => {
            approvals.byRun.delete(h.id);
            if (e && e.code === codes.RequestCancelled && e.data) return e.data;
            throw e;
        });
    return { id: h.id, promise, cancel: h.cancel };
}

module.exports = { ChatSession, Approvals, runAgent };
