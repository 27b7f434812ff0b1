'use strict';
// Debounce, stale-request cancellation and caching in front of the server's completion method.
// Every call supersedes the previous one: a call still waiting out the debounce delay resolves
// to null without a request, and a request still in flight is cancelled (the fetch function's
// cancel sends $/cancelRequest). A cache hit, including typing through a cached suggestion,
// answers at once without a request.

const { CompletionCache } = require('./cache');

class Completer {
    /**
     * @param {object} opts
     * @param {(req: object) => {promise: Promise<string>, cancel: () => void}} opts.fetch
     *        sends one completion request; `req` carries at least `prefix` and `suffix`
     * @param {CompletionCache} [opts.cache]
     * @param {number} [opts.delayMs=120] debounce delay
     * @param {{setTimeout: Function, clearTimeout: Function}} [opts.timers] for tests
     */
    constructor(opts) {
        this.fetch = opts.fetch;
        this.cache = opts.cache ?? new CompletionCache();
        this.delayMs = opts.delayMs ?? 120;
        this.timers = opts.timers ?? { setTimeout, clearTimeout };
        this.pending = null; // { timer, resolve } waiting out the delay
        this.inflight = null; // { cancel, resolve, seq }
        this.seq = 0;
        this.stats = { calls: 0, cacheHits: 0, debounced: 0, sent: 0, cancelled: 0,
            completed: 0, errors: 0 };
        this.lastError = null;
    }

    /**
     * The suggestion for `req` (its `prefix` and `suffix` key the cache), or null when a later
     * call superseded this one, the server answered nothing, or the request failed (lastError
     * says why). Never rejects.
     */
    complete(req) {
        this.stats.calls++;
        this.supersede();
        const hit = this.cache.get(req.prefix, req.suffix);
        if (hit !== null) {
            this.stats.cacheHits++;
            return Promise.resolve(hit);
        }
        const seq = ++this.seq;
        return new Promise((resolve) => {
            const timer = this.timers.setTimeout(() => {
                this.pending = null;
                this.send(req, seq, resolve);
            }, this.delayMs);
            this.pending = { timer, resolve, req };
        });
    }

    send(req, seq, resolve) {
        this.stats.sent++;
        let handle;
        try {
            handle = this.fetch(req);
        } catch (e) {
            this.stats.errors++;
            this.lastError = e;
            resolve(null);
            return;
        }
        const entry = { cancel: handle.cancel, resolve, seq };
        this.inflight = entry;
        handle.promise.then(
            (text) => {
                if (typeof text === 'string') {
                    this.cache.put(req.prefix, req.suffix, text);
                    this.servePending();
                }
                if (this.inflight === entry) {
                    this.inflight = null;
                    this.stats.completed++;
                    resolve(typeof text === 'string' && text.length > 0 ? text : null);
                }
            },
            (err) => {
                if (this.inflight === entry) {
                    this.inflight = null;
                    this.stats.errors++;
                    this.lastError = err;
                    resolve(null);
                }
            });
    }

    /**
     * A late answer (of a request superseded while in flight) went into the cache: the call now
     * waiting out its delay may be answered from it without a request of its own.
     */
    servePending() {
        const p = this.pending;
        if (!p) return;
        const hit = this.cache.get(p.req.prefix, p.req.suffix);
        if (hit === null) return;
        this.timers.clearTimeout(p.timer);
        this.pending = null;
        this.stats.cacheHits++;
        p.resolve(hit);
    }

    /** Drop the call waiting out its delay and cancel the request in flight. */
    supersede() {
        if (this.pending) {
            this.timers.clearTimeout(this.pending.timer);
            this.pending.resolve(null);
            this.pending = null;
            this.stats.debounced++;
        }
        if (this.inflight) {
            const f = this.inflight;
            this.inflight = null;
            this.stats.cancelled++;
            try {
                f.cancel();
            } catch (e) {
                this.lastError = e;
            }
            f.resolve(null);
        }
    }
}

module.exports = { Completer };
