'use strict';
// The VS Code API at the extension's boundary, for tests: only what src/extension.js uses, with
// the same shapes (documents with lines and UTF-16 positions, events, commands, configuration,
// a webview panel that records what the extension posts). `install()` makes require('vscode')
// return it.
const Module = require('node:module');
const path = require('node:path');
const { pathToFileURL, fileURLToPath } = require('node:url');

class Position {
    constructor(line, character) { this.line = line; this.character = character; }
}
class Range {
    constructor(start, end) { this.start = start; this.end = end; }
}
class InlineCompletionItem {
    constructor(insertText, range) { this.insertText = insertText; this.range = range; }
}
class Uri {
    constructor(s) { this.s = s; this.scheme = s.slice(0, s.indexOf(':')); }
    toString() { return this.s; }
    get fsPath() { return fileURLToPath(this.s); }
    static parse(s) { return new Uri(s); }
    static file(p) { return new Uri(pathToFileURL(p).href); }
    static joinPath(u, ...parts) { return new Uri(u.s.replace(/\/$/, '') + '/' + parts.join('/')); }
}

function emitter() {
    const listeners = [];
    const event = (fn) => {
        listeners.push(fn);
        return { dispose() { listeners.splice(listeners.indexOf(fn), 1); } };
    };
    event.fire = (e) => listeners.forEach((fn) => fn(e));
    return event;
}

class TextDocument {
    constructor(file, languageId, text) {
        this.uri = Uri.file(file);
        this.languageId = languageId;
        this.version = 1;
        this.text = text;
    }
    getText() { return this.text; }
    get lines() { return this.text.split(/\r\n|\r|\n/); }
    get lineCount() { return this.lines.length; }
    lineAt(i) { return { text: this.lines[i] }; }
    offsetAt(p) {
        const l = this.lines;
        let off = 0;
        for (let i = 0; i < p.line; i++) off += l[i].length + 1;
        return off + p.character;
    }
    /** Replace `range` by `text`; returns the change event VS Code would fire. */
    edit(range, text) {
        const a = this.offsetAt(range.start);
        const b = this.offsetAt(range.end);
        this.text = this.text.slice(0, a) + text + this.text.slice(b);
        this.version++;
        return { document: this, contentChanges: [{ range, rangeOffset: a, rangeLength: b - a, text }] };
    }
}

function create(settings) {
    const events = {
        change: emitter(), close: emitter(), save: emitter(), config: emitter(),
        selection: emitter(), active: emitter(),
    };
    const commands = new Map();
    const executed = [];
    const messages = [];
    const providers = [];
    const panels = [];
    const vscode = {
        Position, Range, InlineCompletionItem, Uri,
        StatusBarAlignment: { Left: 1, Right: 2 },
        ViewColumn: { Beside: -2 },
        ConfigurationTarget: { Global: 1 },
        workspace: {
            workspaceFolders: [],
            textDocuments: [],
            getConfiguration: (section) => ({
                get: (k, d) => (settings[`${section}.${k}`] ?? d),
                update: async (k, v) => { settings[`${section}.${k}`] = v; },
            }),
            asRelativePath: (u) => {
                const f = vscode.workspace.workspaceFolders[0];
                const p = u.fsPath;
                return f ? path.relative(f.uri.fsPath, p) : p;
            },
            onDidChangeTextDocument: events.change, onDidCloseTextDocument: events.close,
            onDidSaveTextDocument: events.save, onDidChangeConfiguration: events.config,
        },
        window: {
            activeTextEditor: undefined,
            createOutputChannel: () => ({ lines: [], append(s) { this.lines.push(s); },
                appendLine(s) { this.lines.push(s); }, dispose() {} }),
            createStatusBarItem: () => ({ text: '', show() {}, dispose() {} }),
            showErrorMessage: (m) => { messages.push(['error', m]); },
            showInformationMessage: (m) => { messages.push(['info', m]); },
            showInputBox: async () => undefined,
            onDidChangeTextEditorSelection: events.selection,
            onDidChangeActiveTextEditor: events.active,
            createWebviewPanel: () => {
                const received = emitter();
                const disposed = emitter();
                const panel = {
                    posted: [],
                    webview: {
                        html: '', cspSource: 'vscode-resource:',
                        asWebviewUri: (u) => u,
                        onDidReceiveMessage: received,
                        postMessage: async (m) => { panel.posted.push(m); return true; },
                    },
                    reveal() {},
                    onDidDispose: disposed,
                    /** what the webview script would send */
                    receive: (m) => received.fire(m),
                };
                panels.push(panel);
                return panel;
            },
        },
        languages: {
            registerInlineCompletionItemProvider: (selector, provider) => {
                providers.push(provider);
                return { dispose() {} };
            },
        },
        commands: {
            registerCommand: (name, fn) => { commands.set(name, fn); return { dispose() {} }; },
            executeCommand: async (name, ...args) => {
                executed.push(name);
                const fn = commands.get(name);
                return fn ? fn(...args) : undefined;
            },
        },
    };
    return { vscode, events, commands, executed, messages, providers, panels, TextDocument };
}

function install(api) {
    const orig = Module._resolveFilename;
    Module._resolveFilename = function (request, ...rest) {
        if (request === 'vscode') return 'vscode';
        return orig.call(this, request, ...rest);
    };
    require.cache.vscode = { id: 'vscode', filename: 'vscode', loaded: true, exports: api.vscode };
}

module.exports = { create, install, Position, Range };
