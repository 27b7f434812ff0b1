'use strict';
// Unit tests of the VS Code extension's client-side logic: accept word/line, the completion
// cache, the context-chunk ring and the debouncing completer.
const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');

const src = path.join(__dirname, '../../../editor-plugins/vscode/src');
const { acceptWord, acceptLine } = require(path.join(src, 'accept'));
const { CompletionCache } = require(path.join(src, 'cache'));
const { ContextRing, similarity, lineSet, pickLines } = require(path.join(src, 'context'));
const { Completer } = require(path.join(src, 'completer'));

test('acceptWord walks identifiers, operators and line breaks', () => {
    assert.deepEqual(acceptWord('foo(bar)'), { accepted: 'foo', rest: '(bar)' });
    assert.deepEqual(acceptWord('(bar)'), { accepted: '(', rest: 'bar)' });
    assert.deepEqual(acceptWord('  return x;'), { accepted: '  return', rest: ' x;' });
    assert.deepEqual(acceptWord(' += 1'), { accepted: ' +=', rest: ' 1' });
    assert.deepEqual(acceptWord('\n    int y;'), { accepted: '\n    int', rest: ' y;' });
    assert.deepEqual(acceptWord('\r\nx'), { accepted: '\r\nx', rest: '' });
    assert.deepEqual(acceptWord('größe = 1'), { accepted: 'größe', rest: ' = 1' });
    assert.deepEqual(acceptWord(''), { accepted: '', rest: '' });
    assert.deepEqual(acceptWord('   '), { accepted: '   ', rest: '' });
    // walking word by word always consumes the whole text
    let t = 'if (a &&  b) {\n\treturn c_2;\n}';
    let acc = '';
    for (let i = 0; t.length > 0 && i < 100; i++) {
        const s = acceptWord(t);
        assert.ok(s.accepted.length > 0);
        acc += s.accepted;
        t = s.rest;
    }
    assert.equal(acc, 'if (a &&  b) {\n\treturn c_2;\n}');
});

test('acceptLine takes the rest of the line, or the next line after a break', () => {
    assert.deepEqual(acceptLine('a = 1;\nb = 2;'), { accepted: 'a = 1;', rest: '\nb = 2;' });
    assert.deepEqual(acceptLine('\nb = 2;\nc'), { accepted: '\nb = 2;', rest: '\nc' });
    assert.deepEqual(acceptLine('x\r\ny'), { accepted: 'x', rest: '\r\ny' });
    assert.deepEqual(acceptLine('\r\ny\r\n'), { accepted: '\r\ny', rest: '\r\n' });
    assert.deepEqual(acceptLine('last'), { accepted: 'last', rest: '' });
    assert.deepEqual(acceptLine(''), { accepted: '', rest: '' });
});

test('cache: exact hit, typing through, typed past the end, mismatch', () => {
    const c = new CompletionCache();
    c.put('int main(', ') {}', 'void');
    assert.equal(c.get('int main(', ') {}'), 'void');
    assert.equal(c.get('int main(v', ') {}'), 'oid');
    assert.equal(c.get('int main(voi', ') {}'), 'd');
    assert.equal(c.get('int main(void', ') {}'), null); // typed through: ask again
    assert.equal(c.get('int main(x', ') {}'), null); // diverged
    assert.equal(c.get('int main(v', ') {} '), null); // other suffix
    assert.equal(c.get('int main', ') {}'), null); // earlier position is not cached
});

test('cache: the nearest earlier entry wins and LRU bounds the size', () => {
    const c = new CompletionCache({ maxEntries: 2 });
    c.put('a', '', 'bcdef');
    c.put('abc', '', 'XYZ');
    assert.equal(c.get('abcX', ''), 'YZ');
    assert.equal(c.get('abcd', ''), 'ef'); // falls back to the older entry
    c.get('a', ''); // touch 'a'
    c.put('q', '', 'r');
    assert.equal(c.size, 2);
    assert.equal(c.get('abc', ''), 'def'); // 'abc' entry evicted, 'a' survives
    assert.equal(c.get('q', ''), 'r');
});

test('cache: keys use only the windows around the cursor', () => {
    const c = new CompletionCache({ prefixWindow: 4, suffixWindow: 2 });
    c.put('xxxxabcd', 'efyyyy', 'T');
    assert.equal(c.get('zzabcd', 'efzz'), 'T');
    assert.equal(c.get('zzabce', 'efzz'), null);
});

test('similarity and line sets', () => {
    const a = lineSet(['  int a;', '', 'int b;', 'int a;']);
    assert.equal(a.size, 2);
    assert.equal(similarity(a, a), 1);
    assert.equal(similarity(lineSet(['x', 'y']), lineSet(['z', 'w'])), 0);
    assert.equal(similarity(lineSet(['x', 'y']), lineSet(['x', 'z'])), 0.5);
    assert.deepEqual(pickLines(['0', '1', '2', '3', '4'], 4, 2), { start: 3, lines: ['3', '4'] });
    assert.deepEqual(pickLines(['0', '1', '2'], 0, 8), { start: 0, lines: ['0', '1', '2'] });
});

const lines = (tag, n) => Array.from({ length: n }, (_, i) => `${tag} line ${i};`);

test('ring: dedup, similar replaces, capacity evicts the oldest', () => {
    const r = new ContextRing({ maxChunks: 3 });
    assert.equal(r.add('a.c', 0, ['x', '', 'y']), 'ignored');
    assert.equal(r.add('a.c', 0, lines('A', 10)), 'added');
    assert.equal(r.add('b.c', 0, lines('B', 30)), 'added');
    assert.equal(r.add('a.c', 0, lines('A', 10)), 'refreshed');
    assert.deepEqual(r.chunks.map((c) => c.uri), ['b.c', 'a.c']);
    // B with one line of 30 changed: similarity 29/30 > 0.9 -> replaces
    const b2 = lines('B', 30);
    b2[5] = 'changed;';
    assert.equal(r.add('b.c', 0, b2), 'replaced');
    assert.equal(r.chunks.filter((c) => c.uri === 'b.c').length, 1);
    r.add('c.c', 0, lines('C', 10));
    r.add('d.c', 0, lines('D', 10));
    assert.equal(r.size, 3);
    assert.deepEqual(r.chunks.map((c) => c.uri), ['b.c', 'c.c', 'd.c']);
    r.dropUri('c.c');
    assert.deepEqual(r.chunks.map((c) => c.uri), ['b.c', 'd.c']);
});

test('ring: take skips the current window, honours the budget, oldest first', () => {
    const r = new ContextRing({ maxChunks: 8, chunkLines: 4 });
    const doc = lines('M', 40);
    r.addAround('main.c', doc, 2); // lines 0..3
    r.addAround('main.c', doc, 30); // lines 28..31
    r.add('util.c', 10, lines('U', 4));
    r.add('big.c', 0, lines('BIG', 200));
    const all = r.take('main.c', 0, 10, 1e9);
    assert.deepEqual(all.map((c) => [c.uri, c.start]), [['main.c', 28], ['util.c', 10],
        ['big.c', 0]]);
    const small = r.take('main.c', 0, 10, 200);
    assert.deepEqual(small.map((c) => [c.uri, c.start]), [['main.c', 28], ['util.c', 10]]);
    assert.ok(small.reduce((n, c) => n + c.text.length, 0) <= 200);
    assert.deepEqual(r.take('other.c', 0, 10, 0), []);
});

// A fake clock for the debounce: timers fire only when the test advances time.
function fakeTimers() {
    let now = 0;
    let id = 0;
    const q = new Map();
    return {
        setTimeout(fn, ms) { q.set(++id, { at: now + ms, fn }); return id; },
        clearTimeout(t) { q.delete(t); },
        advance(ms) {
            now += ms;
            for (const [k, t] of [...q].sort((x, y) => x[1].at - y[1].at)) {
                if (t.at <= now) { q.delete(k); t.fn(); }
            }
        },
    };
}

function fakeServer() {
    const calls = [];
    return {
        calls,
        fetch(req) {
            let resolve;
            const promise = new Promise((r) => { resolve = r; });
            const call = { req, resolve, cancelled: false };
            calls.push(call);
            return { promise, cancel: () => { call.cancelled = true; } };
        },
    };
}

const tick = () => new Promise((r) => setImmediate(r));

test('completer: debounce drops intermediate keystrokes', async () => {
    const t = fakeTimers();
    const s = fakeServer();
    const c = new Completer({ fetch: s.fetch, delayMs: 100, timers: t });
    const p1 = c.complete({ prefix: 'a', suffix: '' });
    t.advance(50);
    const p2 = c.complete({ prefix: 'ab', suffix: '' });
    t.advance(50);
    const p3 = c.complete({ prefix: 'abc', suffix: '' });
    assert.equal(await p1, null);
    assert.equal(await p2, null);
    assert.equal(s.calls.length, 0);
    t.advance(100);
    assert.equal(s.calls.length, 1);
    assert.equal(s.calls[0].req.prefix, 'abc');
    s.calls[0].resolve('def');
    assert.equal(await p3, 'def');
    assert.deepEqual(c.stats, { calls: 3, cacheHits: 0, debounced: 2, sent: 1, cancelled: 0,
        completed: 1, errors: 0 });
});

test('completer: typing cancels the stale request; typing through uses the cache', async () => {
    const t = fakeTimers();
    const s = fakeServer();
    const c = new Completer({ fetch: s.fetch, delayMs: 10, timers: t });
    const p1 = c.complete({ prefix: 'x = ', suffix: '' });
    t.advance(10);
    assert.equal(s.calls.length, 1);
    const p2 = c.complete({ prefix: 'x = f', suffix: '' }); // typed while in flight
    assert.equal(s.calls[0].cancelled, true);
    assert.equal(await p1, null);
    s.calls[0].resolve('foo(1)'); // a late answer still fills the cache
    await tick();
    t.advance(10);
    assert.equal(s.calls.length, 1, 'cache answered: no second request');
    assert.equal(await p2, 'oo(1)');
    assert.equal(await c.complete({ prefix: 'x = fo', suffix: '' }), 'o(1)');
    assert.equal(await c.complete({ prefix: 'x = foo(', suffix: '' }), '1)');
    assert.equal(c.stats.cacheHits, 3);
    assert.equal(c.stats.cancelled, 1);
    // a failing request resolves null and records the error
    const p3 = c.complete({ prefix: 'y', suffix: '' });
    t.advance(10);
    s.calls[1].resolve(Promise.reject(new Error('boom')));
    assert.equal(await p3, null);
    assert.equal(c.lastError.message, 'boom');
    assert.equal(c.stats.errors, 1);
});

test('buildRequest: windows, extra chunks, single line in the middle of a line', () => {
    const { buildRequest } = require(path.join(src, 'completion'));
    const lines = ['a', 'b', 'cX = 1', 'd', 'e'];
    const ring = new ContextRing();
    ring.add('other.c', 0, ['o1', 'o2', 'o3']);
    const r = buildRequest({ uri: 'f.py', lines, position: { line: 2, character: 1 }, ring,
        opts: { maxPrefixLines: 1, maxSuffixLines: 1, relPath: (u) => `rel/${u}` } });
    assert.equal(r.prefix, 'b\nc');
    assert.equal(r.suffix, 'X = 1\nd');
    assert.equal(r.params.singleLine, true);
    assert.deepEqual(r.params.position, { line: 2, character: 1 });
    assert.deepEqual(r.params.extra, [{ uri: 'other.c', filename: 'rel/other.c',
        text: 'o1\no2\no3' }]);
    const end = buildRequest({ uri: 'f.py', lineCount: 5, getLine: (i) => lines[i],
        position: { line: 2, character: 99 } });
    assert.equal(end.params.position.character, 6);
    assert.equal(end.params.singleLine, undefined);
    assert.equal(end.params.extra, undefined);
    assert.throws(() => buildRequest({ uri: 'f', lines, position: { line: 9, character: 0 } }),
        RangeError);
});
