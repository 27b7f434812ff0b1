'use strict';
// Document sync (docs/protocol.md section 4): the server holds the open buffers, so completion
// requests name a document and a position. The client keeps the texts it sent, so that it can
// reopen a document the server dropped (-32010 after a change it could not apply).

const { codes } = require('./rpc');

class Documents {
    /** @param {import('./rpc').RpcClient} client */
    constructor(client) {
        this.client = client;
        this.docs = new Map(); // uri -> { languageId, version, getText }
    }

    /**
     * Open (or reopen) `uri`. `getText()` returns the editor's current text: it is called now
     * and again whenever the document has to be reopened.
     */
    open(uri, languageId, version, getText) {
        this.docs.set(uri, { languageId, version, getText });
        this.client.notify('textDocument/didOpen',
            { textDocument: { uri, languageId, version, text: getText() } });
    }

    /**
     * Send edits: `changes` is an array of { range: {start, end}, text } (UTF-16 positions,
     * as VS Code reports them) or { text } for a full replacement.
     */
    change(uri, version, changes) {
        const d = this.docs.get(uri);
        if (!d) return;
        d.version = version;
        this.client.notify('textDocument/didChange', {
            textDocument: { uri, version },
            contentChanges: changes.map((c) => (c.range
                ? { range: { start: { line: c.range.start.line, character: c.range.start.character },
                    end: { line: c.range.end.line, character: c.range.end.character } },
                text: c.text }
                : { text: c.text })),
        });
    }

    close(uri) {
        if (!this.docs.delete(uri)) return;
        this.client.notify('textDocument/didClose', { textDocument: { uri } });
    }

    isOpen(uri) {
        return this.docs.has(uri);
    }

    /** Send every open document again (after a reconnect). */
    reopenAll() {
        for (const [uri, d] of this.docs) {
            this.client.notify('textDocument/didOpen',
                { textDocument: { uri, languageId: d.languageId, version: d.version,
                    text: d.getText() } });
        }
    }

    /**
     * Send request `method` about `uri`; when the server answers DocumentNotOpen, reopen the
     * document with its full text and try once more. Returns { promise, cancel }.
     */
    request(uri, method, params) {
        let current = this.client.request(method, params);
        let cancelled = false;
        const promise = current.promise.catch((e) => {
            if (cancelled || !(e && e.code === codes.DocumentNotOpen) || !this.docs.has(uri)) {
                throw e;
            }
            const d = this.docs.get(uri);
            this.open(uri, d.languageId, d.version, d.getText);
            current = this.client.request(method, params);
            return current.promise;
        });
        return { promise, cancel: () => { cancelled = true; current.cancel(); } };
    }
}

module.exports = { Documents };
