'use strict';
// The extension itself (src/extension.js) with the VS Code API stubbed at its boundary
// (vscode_stub.js) against a server (spark-agent serve, or the fake with SPARK_TEST_FAKE=1):
// activation connects and fills the status bar, the inline provider syncs the document and
// returns the server's suggestion, edits reach the server, accept-word inserts part of the
// suggestion, the chat webview streams an answer, an agent run asks for approval in it.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { start, workspace } = require('./server');
const stub = require('./vscode_stub');

const ws = workspace({ 'hello.txt': 'hello\n' });
const script = path.join(os.tmpdir(), `spark-ext-script-${process.pid}.json`);
fs.writeFileSync(script, JSON.stringify([
    'I will edit it.\n<tool_call>\n{"name": "edit_file", "arguments": {"path": "hello.txt", '
        + '"old_text": "hello", "new_text": "goodbye"}}\n</tool_call>',
    'Replaced hello with goodbye.',
]));

let server;
let api;
let ext;

const until = async (pred, ms, what) => {
    const end = Date.now() + ms;
    while (Date.now() < end) {
        const v = await pred();
        if (v) return v;
        await new Promise((r) => setTimeout(r, 10));
    }
    throw new Error(`timed out waiting for ${what}`);
};

const token = { isCancellationRequested: false, onCancellationRequested: () => ({ dispose() {} }) };

test.before(async () => {
    server = await start({ env: { SPARK_SERVE_AGENT_SCRIPT: script } });
    if (server.skip) return;
    api = stub.create({ 'spark.serverUrl': server.url, 'spark.token': server.token,
        'spark.completion.debounceMs': 0, 'spark.completion.maxTokens': 6,
        'spark.completion.timeBudgetMs': 30000, 'spark.chat.maxTokens': 8 });
    api.vscode.workspace.workspaceFolders = [{ uri: api.vscode.Uri.file(ws), name: 'ws' }];
    stub.install(api);
    ext = require('../../../editor-plugins/vscode/src/extension');
    ext.activate({ subscriptions: [], extensionUri: api.vscode.Uri.file('/ext') });
});

test.after(async () => {
    if (ext) await ext.deactivate();
    if (server && !server.skip) await server.stop();
    if (server && server.skip) {
        console.log(`SKIP: ${server.skip}`);
        process.exitCode = 77;
    }
});

const skipped = (t) => (server.skip ? (t.skip(server.skip), true) : false);

test('activation registers the provider and commands and connects', async (t) => {
    if (skipped(t)) return;
    assert.equal(api.providers.length, 1);
    for (const c of ['spark.startServer', 'spark.stopServer', 'spark.connect', 'spark.openChat',
        'spark.runAgent', 'spark.acceptWord', 'spark.acceptLine']) {
        assert.ok(api.commands.has(c), c);
    }
});

let doc;
let suggestion;
const E = () => ext.instance();

async function documentText(uri) {
    return E().client.request('spark/documentText', { textDocument: { uri } }).promise;
}

test('inline completion: the document is synced and the suggestion comes back', async (t) => {
    if (skipped(t)) return;
    await until(() => E().client && !E().client.closed, 15000, 'the connection');
    assert.match(E().status.text, /\$\(sparkle\) /);
    doc = new api.TextDocument(path.join(ws, 'util.py'), 'python',
        'def add(a, b):\n    return \n\nprint(add(1, 2))\n');
    api.vscode.workspace.textDocuments.push(doc);
    const pos = new stub.Position(1, 11);
    const items = await api.providers[0].provideInlineCompletionItems(doc, pos, {}, token);
    assert.ok(Array.isArray(items));
    assert.deepEqual(await documentText(doc.uri.toString()), { version: 1, text: doc.getText() });
    assert.equal(E().completer.stats.sent, 1);
    if (items.length === 0) return; // the model ended the middle at once: nothing to show
    suggestion = items[0].insertText;
    assert.ok(suggestion.length > 0);
    assert.deepEqual(items[0].range.start, pos);
    assert.match(E().status.text, /tok\/s/);
});

test('edits reach the server as incremental UTF-16 changes', async (t) => {
    if (skipped(t)) return;
    api.events.change.fire(doc.edit(new stub.Range(new stub.Position(0, 0),
        new stub.Position(0, 0)), '# 😀 util\n'));
    api.events.change.fire(doc.edit(new stub.Range(new stub.Position(0, 4),
        new stub.Position(0, 4)), '!'));
    api.events.change.fire(doc.edit(new stub.Range(new stub.Position(2, 4),
        new stub.Position(3, 0)), ''));
    const d = await documentText(doc.uri.toString());
    assert.equal(d.text, doc.getText());
    assert.equal(d.version, doc.version);
});

test('accept word inserts the first word and asks VS Code to show the rest', async (t) => {
    if (skipped(t)) return;
    if (suggestion === undefined) {
        // the model suggested nothing there: accept-word works on whatever was shown last
        E().last = { uri: doc.uri.toString(), line: 1, character: 11, text: 'a + b\n' };
    }
    const { acceptWord } = require('../../../editor-plugins/vscode/src/accept');
    const inserted = [];
    const l = E().last;
    api.vscode.window.activeTextEditor = {
        document: { uri: { toString: () => l.uri } },
        selection: { active: new stub.Position(l.line, l.character) },
        edit: async (cb) => { cb({ insert: (p, text) => inserted.push([p, text]) }); return true; },
    };
    await api.commands.get('spark.acceptWord')();
    assert.deepEqual(inserted, [[new stub.Position(l.line, l.character),
        acceptWord(l.text).accepted]]);
    assert.ok(api.executed.includes('editor.action.inlineSuggest.trigger'));
});

test('chat webview: the answer streams into the panel', async (t) => {
    if (skipped(t)) return;
    await api.commands.get('spark.openChat')();
    const panel = api.panels[0];
    assert.match(panel.webview.html, /Content-Security-Policy/);
    panel.receive({ type: 'send', text: 'Say hi' });
    const done = await until(() => panel.posted.find((m) => m.type === 'done'
        || m.type === 'error'), 60000, 'the chat answer');
    assert.equal(done.type, 'done', JSON.stringify(done));
    const types = panel.posted.map((m) => m.type);
    assert.equal(types[0], 'start');
    const streamed = panel.posted.filter((m) => m.type === 'delta')
        .map((m) => m.delta.content ?? '').join('');
    const last = E().chat.messages[E().chat.messages.length - 1];
    assert.equal(streamed, last.content ?? '');
});

test('agent run from the webview: approval asked, granted, result shown', async (t) => {
    if (skipped(t)) return;
    const panel = api.panels[0];
    panel.posted.length = 0;
    panel.receive({ type: 'send', text: '/agent replace hello by goodbye in hello.txt' });
    const ask = await until(() => panel.posted.find((m) => m.type === 'approval'), 60000,
        'the approval request');
    assert.equal(ask.tool, 'edit_file');
    panel.receive({ type: 'approve', id: ask.id, approved: true });
    const done = await until(() => panel.posted.find((m) => m.type === 'agentDone'
        || m.type === 'error'), 60000, 'the run result');
    assert.equal(done.type, 'agentDone', JSON.stringify(done));
    assert.equal(done.result.stop, 'answer');
    const evs = panel.posted.filter((m) => m.type === 'agentEvent').map((m) => m.event.type);
    assert.ok(evs.includes('tool_call') && evs.includes('diff'), evs.join(','));
    if (server.real) assert.equal(fs.readFileSync(path.join(ws, 'hello.txt'), 'utf8'), 'goodbye\n');
});

test('start/stop server commands run the configured binary and connect to it', async (t) => {
    if (skipped(t)) return;
    const net = require('node:net');
    const port = await new Promise((r) => {
        const srv = net.createServer().listen(0, '127.0.0.1', () => {
            const p = srv.address().port;
            srv.close(() => r(p));
        });
    });
    const old = E().client;
    await api.commands.get('spark.stopServer')();
    assert.equal(E().client, null);
    assert.equal(old.closed, true);
    const settings = api.vscode.workspace.getConfiguration('spark');
    await settings.update('serverUrl', `ws://127.0.0.1:${port}/rpc`);
    // the real binary when testing against it (its token from the environment it inherits)
    const tok = server.real ? `editor-start-token-${port}` : 'secret';
    if (server.real) {
        process.env.SPARK_API_KEY = tok;
        process.env.XDG_CONFIG_HOME = fs.mkdtempSync(path.join(os.tmpdir(), 'spark-start-'));
    }
    await settings.update('token', tok);
    await settings.update('serverPath', server.real ? process.env.SPARK_CLI
        : path.join(__dirname, '../fake_serve.sh'));
    await api.commands.get('spark.startServer')();
    assert.ok(E().server, 'server process kept');
    assert.ok(E().client && !E().client.closed, 'connected to the started server');
    assert.match(E().status.text, server.real ? /\$\(sparkle\) \S/ : /\$\(sparkle\) fake/);
    const child = E().server;
    const exited = new Promise((r) => child.once('exit', r));
    await api.commands.get('spark.stopServer')();
    await exited;
    assert.equal(E().server, null);
    assert.match(E().status.text, /circle-slash/);
});
