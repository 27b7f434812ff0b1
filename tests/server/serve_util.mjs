// Shared by the server tests: start a real `spark-agent serve` on an ephemeral port with a
// private token and config directory, read the start-up line, stop it with SIGTERM.
//   const srv = await startServer({ args: ['--max-body', '4096'] });
//   srv.url ('http://127.0.0.1:PORT'), srv.port, srv.token, srv.proc, srv.stderr(),
//   await srv.stop() -> exit code (SIGTERM, then waits)
// The model is SPARK_TEST_MODEL when set, else the CLI's default (the tiny generated model,
// made on first use in XDG_CACHE_HOME).
import { spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export const CLI = process.env.SPARK_CLI;

export function tmpDir(tag) {
  return fs.mkdtempSync(path.join(os.tmpdir(), `spark_${tag}_`));
}

export async function startServer({ args = [], env = {}, tag = 'serve', timeoutMs = 60000 } = {}) {
  if (!CLI) throw new Error('SPARK_CLI not set');
  const dir = tmpDir(tag);
  const token = crypto.randomBytes(24).toString('hex');
  const model = process.env.SPARK_TEST_MODEL ? ['-m', process.env.SPARK_TEST_MODEL] : [];
  // --exit-with-parent and a stdin pipe: a test that throws or is killed does not leave the
  // server running (an orphan also holds ctest's output pipe open until the time-out)
  const proc = spawn(CLI, ['serve', ...model, '--port', '0', '--exit-with-parent', ...args], {
    env: { ...process.env, XDG_CONFIG_HOME: path.join(dir, 'config'), SPARK_API_KEY: token,
      ...env },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let out = '', err = '';
  proc.stderr.on('data', (d) => { err += d; });
  const exited = new Promise((resolve) => {
    proc.on('exit', (code, sig) => resolve(code ?? sig));
    proc.on('error', (e) => resolve('spawn failed: ' + e.message));
  });
  const port = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error('serve did not start: ' + err)), timeoutMs);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on http:\/\/[^ ]*:(\d+) /);
      if (m) { clearTimeout(t); resolve(Number(m[1])); }
    });
    exited.then((code) => { clearTimeout(t); reject(new Error(`serve exited (${code}): ${err}`)); });
  });
  const url = `http://127.0.0.1:${port}`;
  return {
    url, port, token, proc, dir, exited,
    stdout: () => out,
    stderr: () => err,
    async stop(signal = 'SIGTERM') {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
      const code = await exited;
      fs.rmSync(dir, { recursive: true, force: true });
      return code;
    },
  };
}

// A request with node's fetch: returns { status, headers, text, json }.
export async function req(srv, pathname, { method = 'GET', body, headers = {}, token } = {}) {
  const h = { ...headers };
  if (token !== null) h.authorization = `Bearer ${token ?? srv.token}`;
  if (body !== undefined && typeof body !== 'string') {
    body = JSON.stringify(body);
    h['content-type'] = 'application/json';
  }
  const r = await fetch(srv.url + pathname, { method, body, headers: h });
  const text = await r.text();
  let json;
  try { json = JSON.parse(text); } catch { json = undefined; }
  return { status: r.status, headers: r.headers, text, json };
}

// The value of a Prometheus sample ("name" or 'name{label="x"}').
export async function metric(srv, name) {
  const r = await req(srv, '/metrics');
  for (const line of r.text.split('\n')) {
    if (line.startsWith(name + ' ')) return Number(line.slice(name.length + 1));
  }
  return undefined;
}

export function checker() {
  let failures = 0;
  const check = (ok, what) => {
    if (!ok) { console.error('FAIL: ' + what); failures++; }
  };
  return { check, failures: () => failures };
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
