'use strict';
// The VS Code side: wires the editor to the protocol client. Everything that does not need the
// VS Code API (protocol, cache, context ring, debounce, chat/agent runs) lives in the other
// modules of src/ and is tested with node alone; this file only adapts VS Code's events and UI.

const vscode = require('vscode');
const cp = require('node:child_process');
const { RpcClient } = require('./rpc');
const { Documents } = require('./documents');
const { ContextRing } = require('./context');
const { CompletionCache } = require('./cache');
const { Completer } = require('./completer');
const { buildRequest, makeFetch } = require('./completion');
const { acceptWord, acceptLine } = require('./accept');
const { ChatSession, Approvals, runAgent } = require('./chat');
const { findToken } = require('./token');

const cfg = () => vscode.workspace.getConfiguration('spark');

class Extension {
    constructor(context) {
        this.context = context;
        this.client = null;
        this.docs = null;
        this.approvals = null;
        this.chat = null;
        this.server = null; // child process started by spark.startServer
        this.ring = null;
        this.completer = null;
        this.last = null; // { uri, line, character, text } of the suggestion shown last
        this.lastPlace = null; // { uri, line } of the cursor, for ring chunks when it leaves
        this.model = '';
        this.tps = null;
        this.connecting = null;
        this.panel = null;
        this.output = vscode.window.createOutputChannel('spark-agent');
        this.status = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
        this.status.command = 'spark.openChat';
        this.configure();
        this.showStatus('disconnected');
        this.status.show();
    }

    configure() {
        const c = cfg();
        this.ring = new ContextRing({ maxChunks: c.get('context.maxChunks', 16),
            chunkLines: c.get('context.chunkLines', 64) });
        this.completer = new Completer({
            fetch: (req) => this.fetch(req),
            cache: new CompletionCache({ maxEntries: 256 }),
            delayMs: c.get('completion.debounceMs', 120),
        });
    }

    showStatus(state) {
        const tps = this.tps !== null ? ` ${this.tps.toFixed(0)} tok/s` : '';
        const text = state === 'connected' ? `$(sparkle) ${this.model}${tps}`
            : state === 'connecting' ? '$(sync~spin) spark' : '$(circle-slash) spark';
        this.status.text = text;
        this.status.tooltip = state === 'connected'
            ? `spark-agent: ${this.model} at ${cfg().get('serverUrl')}` : `spark-agent: ${state}`;
    }

    /** Connect (once; concurrent callers share the attempt). Resolves to the client or null. */
    async connect(quiet) {
        if (this.client && !this.client.closed) return this.client;
        if (this.connecting) return this.connecting;
        this.connecting = (async () => {
            this.showStatus('connecting');
            const url = cfg().get('serverUrl', 'ws://127.0.0.1:8088/rpc');
            const client = new RpcClient({ url, token: findToken(cfg().get('token', '')) });
            client.on('log', (p) => this.output.appendLine(`[server] ${p.message}`));
            client.on('close', (code, reason) => {
                this.output.appendLine(`connection closed: ${code} ${reason}`);
                if (this.client === client) {
                    this.client = null;
                    this.showStatus('disconnected');
                }
            });
            try {
                const folders = (vscode.workspace.workspaceFolders ?? [])
                    .map((f) => ({ uri: f.uri.toString(), name: f.name }));
                const init = await client.connect({
                    clientInfo: { name: 'spark-vscode', version: '0.1.0' },
                    capabilities: { general: { positionEncodings: ['utf-16'] } },
                    workspaceFolders: folders,
                });
                this.client = client;
                this.docs = new Documents(client);
                this.approvals = new Approvals(client);
                this.chat = null;
                this.model = init.model?.id ?? 'model';
                this.limits = init.limits ?? {};
                this.showStatus('connected');
                this.output.appendLine(`connected to ${url}: ${this.model}`);
                return client;
            } catch (e) {
                this.showStatus('disconnected');
                this.output.appendLine(`connect ${url}: ${e.message}`);
                if (!quiet) vscode.window.showErrorMessage(`spark-agent: ${e.message}`);
                return null;
            } finally {
                this.connecting = null;
            }
        })();
        return this.connecting;
    }

    // ---- documents and context ----

    syncable(doc) {
        return (doc.uri.scheme === 'file' || doc.uri.scheme === 'untitled')
            && doc.getText().length <= (this.limits?.maxDocumentBytes ?? 4194304);
    }

    ensureOpen(doc) {
        const uri = doc.uri.toString();
        if (this.docs.isOpen(uri)) return;
        const max = (this.limits?.maxOpenDocuments ?? 64) - 1;
        if (this.docs.docs.size >= max) {
            this.docs.close(this.docs.docs.keys().next().value); // the oldest
        }
        this.docs.open(uri, doc.languageId, doc.version, () => doc.getText());
    }

    onChange(e) {
        const uri = e.document.uri.toString();
        if (!this.docs || !this.docs.isOpen(uri) || e.contentChanges.length === 0) return;
        this.docs.change(uri, e.document.version, e.contentChanges);
    }

    /** The cursor left a place: its surroundings become a context chunk. */
    notePlace(editor) {
        if (!editor) return;
        const uri = editor.document.uri.toString();
        const line = editor.selection.active.line;
        const p = this.lastPlace;
        if (p && (p.uri !== uri || Math.abs(p.line - line) > this.ring.chunkLines)) {
            const d = vscode.workspace.textDocuments.find((t) => t.uri.toString() === p.uri);
            if (d) this.ring.addAround(p.uri, linesOf(d), p.line);
        }
        this.lastPlace = { uri, line };
    }

    relPath(uri) {
        const u = vscode.Uri.parse(uri);
        return vscode.workspace.asRelativePath(u, false);
    }

    // ---- inline completion ----

    fetch(req) {
        const f = makeFetch(this.docs, (r) => {
            if (r?.timings?.tokensPerSecond) {
                this.tps = r.timings.tokensPerSecond;
                this.showStatus('connected');
            }
        });
        return f(req);
    }

    async provide(document, position, _context, token) {
        if (!cfg().get('completion.enabled', true) || !this.syncable(document)) return [];
        const client = await this.connect(true);
        if (!client || token.isCancellationRequested) return [];
        this.ensureOpen(document);
        const c = cfg();
        const req = buildRequest({
            uri: document.uri.toString(), lineCount: document.lineCount,
            getLine: (i) => document.lineAt(i).text,
            position: { line: position.line, character: position.character }, ring: this.ring,
            opts: { maxTokens: c.get('completion.maxTokens', 64),
                timeBudgetMs: c.get('completion.timeBudgetMs', 2000),
                temperature: c.get('completion.temperature', 0),
                contextBudget: c.get('context.budgetChars', 8192),
                maxExtraChunks: this.limits?.maxExtraChunks ?? 32,
                relPath: (u) => this.relPath(u) },
        });
        const text = await this.completer.complete(req);
        if (!text || token.isCancellationRequested) return [];
        this.last = { uri: document.uri.toString(), line: position.line,
            character: position.character, text };
        return [new vscode.InlineCompletionItem(text, new vscode.Range(position, position))];
    }

    /** Accept part of the suggestion shown; the rest comes back from the cache. */
    async acceptPart(split) {
        const ed = vscode.window.activeTextEditor;
        const l = this.last;
        if (!ed || !l || ed.document.uri.toString() !== l.uri) return;
        const pos = ed.selection.active;
        if (pos.line !== l.line || pos.character !== l.character) return;
        const { accepted } = split(l.text);
        if (!accepted) return;
        await ed.edit((b) => b.insert(pos, accepted));
        await vscode.commands.executeCommand('editor.action.inlineSuggest.trigger');
    }

    // ---- server process ----

    async startServer() {
        if (this.server) {
            vscode.window.showInformationMessage('spark-agent: the server is already running');
            return;
        }
        const c = cfg();
        const url = new URL(c.get('serverUrl', 'ws://127.0.0.1:8088/rpc'));
        // --exit-with-parent: the server we start dies with the extension host, also when
        // VS Code is killed (deactivate runs only on a clean exit); stdin is the pipe it watches
        const args = ['serve', '--host', url.hostname, '--port', url.port || '8088',
            '--exit-with-parent'];
        if (c.get('model')) args.push('-m', c.get('model'));
        const bin = c.get('serverPath', 'spark-agent');
        this.output.appendLine(`starting ${bin} ${args.join(' ')}`);
        const child = cp.spawn(bin, args, { stdio: ['pipe', 'pipe', 'pipe'] });
        this.server = child;
        child.stdout.on('data', (d) => this.output.append(String(d)));
        child.stderr.on('data', (d) => this.output.append(String(d)));
        child.on('error', (e) => {
            vscode.window.showErrorMessage(`spark-agent: cannot start ${bin}: ${e.message}`);
        });
        child.on('exit', (code, sig) => {
            this.output.appendLine(`server exited (${code ?? sig})`);
            if (this.server === child) this.server = null;
        });
        for (let i = 0; i < 50 && this.server === child; i++) {
            await new Promise((r) => setTimeout(r, 200));
            if (await this.connect(true)) return;
        }
        if (this.server === child) vscode.window.showErrorMessage(
            'spark-agent: the server started but does not answer (see the spark-agent output)');
    }

    async stopServer() {
        if (this.client) await this.client.dispose();
        this.client = null;
        if (this.server) {
            this.server.kill('SIGTERM');
            this.server = null;
        }
        this.showStatus('disconnected');
    }

    async pointAt() {
        const url = await vscode.window.showInputBox({ prompt: 'spark-agent server URL',
            value: cfg().get('serverUrl', 'ws://127.0.0.1:8088/rpc') });
        if (!url) return;
        await cfg().update('serverUrl', url, vscode.ConfigurationTarget.Global);
        if (this.client) await this.client.dispose();
        this.client = null;
        await this.connect(false);
    }

    // ---- chat webview ----

    openChat() {
        if (this.panel) {
            this.panel.reveal();
            return this.panel;
        }
        const media = vscode.Uri.joinPath(this.context.extensionUri, 'media');
        const panel = vscode.window.createWebviewPanel('spark.chat', 'spark-agent chat',
            vscode.ViewColumn.Beside, { enableScripts: true, retainContextWhenHidden: true,
                localResourceRoots: [media] });
        const script = panel.webview.asWebviewUri(vscode.Uri.joinPath(media, 'chat.js'));
        const style = panel.webview.asWebviewUri(vscode.Uri.joinPath(media, 'chat.css'));
        const nonce = Math.random().toString(36).slice(2) + Date.now().toString(36);
        panel.webview.html = `<!DOCTYPE html><html><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src ${panel.webview.cspSource}; script-src 'nonce-${nonce}';">
<link rel="stylesheet" href="${style}"></head><body>
<div id="log"></div>
<form id="form"><textarea id="input" rows="3" placeholder="Ask, or /agent TASK to run the agent on the workspace"></textarea>
<div class="row"><button type="submit">Send</button><button type="button" id="stop">Stop</button>
<button type="button" id="clear">New chat</button></div></form>
<script nonce="${nonce}" src="${script}"></script></body></html>`;
        panel.webview.onDidReceiveMessage((m) => this.onChatMessage(m));
        panel.onDidDispose(() => { this.panel = null; });
        this.panel = panel;
        this.pendingApprovals = new Map();
        return panel;
    }

    post(msg) {
        if (this.panel) this.panel.webview.postMessage(msg);
    }

    async onChatMessage(m) {
        if (m.type === 'approve') {
            const resolve = this.pendingApprovals.get(m.id);
            this.pendingApprovals.delete(m.id);
            if (resolve) resolve(m.approved === true);
            return;
        }
        if (m.type === 'stop') {
            this.chat?.cancel();
            this.run?.cancel();
            return;
        }
        if (m.type === 'clear') {
            this.chat?.reset();
            return;
        }
        if (m.type !== 'send') return;
        const client = await this.connect(false);
        if (!client) {
            this.post({ type: 'error', text: 'not connected to a spark-agent server' });
            return;
        }
        if (m.text.startsWith('/agent ')) {
            await this.agent(m.text.slice(7));
            return;
        }
        if (!this.chat || this.chat.client !== client) {
            this.chat = new ChatSession(client, { temperature: cfg().get('chat.temperature', 0.7),
                max_tokens: cfg().get('chat.maxTokens', 1024) });
        }
        this.post({ type: 'start', role: 'assistant' });
        try {
            const r = await this.chat.send(m.text, (d) => this.post({ type: 'delta', delta: d }));
            if (r.usage?.tokensPerSecond) {
                this.tps = r.usage.tokensPerSecond;
                this.showStatus('connected');
            }
            this.post({ type: 'done', finishReason: r.finishReason, usage: r.usage });
        } catch (e) {
            this.post({ type: 'error', text: e.message });
        }
    }

    async agent(task) {
        const client = await this.connect(false);
        if (!client) return;
        const folder = vscode.workspace.workspaceFolders?.[0];
        if (!folder) {
            vscode.window.showErrorMessage('spark-agent: open a folder to run the agent on it');
            return;
        }
        this.openChat();
        this.post({ type: 'agentStart', task });
        const ask = (p) => new Promise((resolve) => {
            this.pendingApprovals.set(p.callId, resolve);
            this.post({ type: 'approval', id: p.callId, tool: p.tool, kind: p.kind,
                arguments: p.arguments });
        });
        this.run = runAgent(client, this.approvals, { root: folder.uri.toString(), task,
            approval: cfg().get('agent.approval', 'ask') },
        (ev) => this.post({ type: 'agentEvent', event: ev }), ask);
        try {
            const r = await this.run.promise;
            this.post({ type: 'agentDone', result: r });
        } catch (e) {
            this.post({ type: 'error', text: e.message });
        } finally {
            this.run = null;
            for (const [, resolve] of this.pendingApprovals) resolve(false);
            this.pendingApprovals.clear();
        }
    }

    async dispose() {
        this.completer.supersede();
        if (this.client) await this.client.dispose(500);
        if (this.server) this.server.kill('SIGTERM');
    }
}

function linesOf(doc) {
    return doc.getText().split(/\r\n|\r|\n/);
}

let ext = null;

function activate(context) {
    ext = new Extension(context);
    const sub = (d) => context.subscriptions.push(d);
    sub(ext.status);
    sub(ext.output);
    sub(vscode.languages.registerInlineCompletionItemProvider({ pattern: '**' },
        { provideInlineCompletionItems: (d, p, c, t) => ext.provide(d, p, c, t) }));
    sub(vscode.workspace.onDidChangeTextDocument((e) => ext.onChange(e)));
    sub(vscode.workspace.onDidCloseTextDocument((d) => {
        ext.docs?.close(d.uri.toString());
        ext.ring.dropUri(d.uri.toString());
    }));
    sub(vscode.workspace.onDidSaveTextDocument((d) => {
        const ed = vscode.window.activeTextEditor;
        if (ed && ed.document === d) ext.ring.addAround(d.uri.toString(), linesOf(d),
            ed.selection.active.line);
    }));
    sub(vscode.window.onDidChangeTextEditorSelection((e) => ext.notePlace(e.textEditor)));
    sub(vscode.window.onDidChangeActiveTextEditor((ed) => ext.notePlace(ed)));
    sub(vscode.workspace.onDidChangeConfiguration((e) => {
        if (e.affectsConfiguration('spark')) ext.configure();
    }));
    const cmd = (name, fn) => sub(vscode.commands.registerCommand(name, fn));
    cmd('spark.startServer', () => ext.startServer());
    cmd('spark.stopServer', () => ext.stopServer());
    cmd('spark.connect', () => ext.pointAt());
    cmd('spark.openChat', () => ext.openChat());
    cmd('spark.runAgent', async () => {
        const task = await vscode.window.showInputBox({ prompt: 'Task for the agent' });
        if (task) await ext.agent(task);
    });
    cmd('spark.acceptWord', () => ext.acceptPart(acceptWord));
    cmd('spark.acceptLine', () => ext.acceptPart(acceptLine));
    cmd('spark.toggleCompletion', async () => {
        const on = cfg().get('completion.enabled', true);
        await cfg().update('completion.enabled', !on, vscode.ConfigurationTarget.Global);
    });
    if (cfg().get('autoConnect', true)) ext.connect(true);
}

async function deactivate() {
    if (ext) await ext.dispose();
    ext = null;
}

/** The running extension object (tests reach its connection and state through it). */
function instance() {
    return ext;
}

module.exports = { activate, deactivate, instance };
