'use strict';
// The server the VS Code tests talk to: `spark-agent serve` on the tiny model when SPARK_CLI
// names a built binary and SPARK_TEST_FAKE is unset, else the scripted fake
// (../fake_rpc_server.js). start() resolves to { url, token, real, stop() } or { skip: reason }.
const cp = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');

function freePort() {
    return new Promise((resolve, reject) => {
        const s = net.createServer();
        s.listen(0, '127.0.0.1', () => {
            const { port } = s.address();
            s.close(() => resolve(port));
        });
        s.on('error', reject);
    });
}

function canConnect(port) {
    return new Promise((resolve) => {
        const c = net.connect(port, '127.0.0.1');
        c.on('connect', () => { c.destroy(); resolve(true); });
        c.on('error', () => resolve(false));
    });
}

async function start(opts = {}) {
    const cli = process.env.SPARK_CLI;
    if (cli && !process.env.SPARK_TEST_FAKE) {
        if (!fs.existsSync(cli)) return { skip: `spark-agent is not built (${cli})` };
        const port = await freePort();
        const home = fs.mkdtempSync(path.join(os.tmpdir(), 'spark-vscode-'));
        const token = `editor-test-token-${port}`;
        // a fresh config (token) and data directory; the model cache is shared (the default
        // tiny model is generated once)
        const env = { ...process.env, SPARK_API_KEY: token, XDG_CONFIG_HOME: home,
            XDG_DATA_HOME: home, ...(opts.env ?? {}) };
        // --exit-with-parent: the server does not outlive the test process (a failed or killed
        // test left it running before)
        const child = cp.spawn(cli, ['serve', '--host', '127.0.0.1', '--port', String(port),
            '--exit-with-parent', ...(opts.args ?? [])], { env, stdio: ['pipe', 'pipe', 'pipe'] });
        let log = '';
        child.stdout.on('data', (d) => { log += d; });
        child.stderr.on('data', (d) => { log += d; });
        let exited = null;
        child.on('exit', (code) => { exited = code; });
        const deadline = Date.now() + 120000;
        while (Date.now() < deadline && exited === null && !(await canConnect(port))) {
            await new Promise((r) => setTimeout(r, 100));
        }
        if (exited !== null || Date.now() >= deadline) {
            child.kill('SIGKILL');
            throw new Error(`spark-agent serve did not start (exit ${exited}):\n${log}`);
        }
        return { url: `ws://127.0.0.1:${port}/rpc`, token, real: true, log: () => log,
            stop: () => new Promise((r) => { child.once('exit', r); child.kill('SIGTERM'); }) };
    }
    const modules = process.env.SPARK_NODE_MODULES ?? path.join(__dirname, '../../node_modules');
    if (!fs.existsSync(path.join(modules, 'ws'))) {
        return { skip: `the ws npm package is not installed in ${modules}` };
    }
    const child = cp.spawn(process.execPath, [path.join(__dirname, '../fake_rpc_server.js')],
        { env: { ...process.env, SPARK_NODE_MODULES: modules }, stdio: ['pipe', 'pipe', 'inherit'] });
    const port = await new Promise((resolve, reject) => {
        let out = '';
        child.stdout.on('data', (d) => {
            out += d;
            const m = out.match(/^(\d+)\n/);
            if (m) resolve(Number(m[1]));
        });
        child.on('exit', () => reject(new Error('the fake server exited')));
    });
    return { url: `ws://127.0.0.1:${port}/rpc`, token: 'secret', real: false, log: () => '',
        stop: () => new Promise((r) => { child.once('exit', r); child.stdin.end(); }) };
}

/** A git repository with one commit holding `files`; returns its path. */
function workspace(files) {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'spark-ws-'));
    for (const [name, text] of Object.entries(files)) {
        fs.mkdirSync(path.dirname(path.join(dir, name)), { recursive: true });
        fs.writeFileSync(path.join(dir, name), text);
    }
    const git = (...a) => cp.execFileSync('git', ['-C', dir, '-c', 'user.name=t',
        '-c', 'user.email=t@t', ...a]);
    git('init', '-q');
    git('add', '.');
    git('commit', '-qm', 'init');
    return dir;
}

module.exports = { start, workspace };
