#!/usr/bin/env node
// Generates engine/tokenizer/unicode_tables.c: the Unicode data the tokenizer needs, taken from
// the JavaScript engine that runs the reference tokenizer (@huggingface/tokenizers in node), so
// that both follow the same Unicode version:
//   - per code point class bits: \p{L}, \p{N}, \p{M}, \p{White_Space} (what the reference rewrites the
//     regex's \s to), and "NFC-unsafe" (the char may change under NFC in some context),
//   - NFC data derived from String.prototype.normalize: full canonical decompositions, the
//     canonical combining class order, and the primary composition pairs.
// Usage: node engine/tokenizer/gen_unicode_tables.js > engine/tokenizer/unicode_tables.c
'use strict';

const MAX = 0x110000;
const isSurrogate = (c) => c >= 0xd800 && c <= 0xdfff;
const isHangulSyllable = (c) => c >= 0xac00 && c <= 0xd7a3;
const str = (...cps) => String.fromCodePoint(...cps);
const cps = (s) => Array.from(s, (ch) => ch.codePointAt(0));

const reL = /\p{L}/u, reN = /\p{N}/u, reM = /\p{M}/u, reWS = /\p{White_Space}/u;

// ---- canonical combining classes, as an order (only the order matters for reordering) --------
// c has ccc > 1  <=>  NFD(c + U+0334 [ccc 1]) reorders to U+0334 + c
// c has 0 < ccc < 240  <=>  NFD(U+0345 [ccc 240] + c) reorders to c + U+0345
const R1 = 0x0334, R240 = 0x0345;
const nonzero = [];
for (let c = 0; c < MAX; c++) {
    if (isSurrogate(c)) continue;
    const s = str(c);
    if (s.normalize('NFD') !== s) continue; // only NFD-stable chars take part in reordering
    if (str(c, R1).normalize('NFD') === str(R1, c) || str(R240, c).normalize('NFD') === str(c, R240)
        || c === R1 || c === R240) {
        nonzero.push(c);
    }
}
const cmp = (a, b) => {
    if (str(a, b).normalize('NFD') === str(b, a)) return 1;  // ccc(a) > ccc(b)
    if (str(b, a).normalize('NFD') === str(a, b)) return -1; // ccc(b) > ccc(a)
    return 0;
};
nonzero.sort(cmp);
const ccc = new Map();
let rank = 0;
for (let i = 0; i < nonzero.length; i++) {
    if (i === 0 || cmp(nonzero[i - 1], nonzero[i]) !== 0) rank++;
    ccc.set(nonzero[i], rank);
}
if (rank > 255) throw new Error('too many combining classes');

// ---- decompositions and composition pairs ------------------------------------------------------
const decomp = []; // [cp, [cps...]]
const pairs = [];  // [first, second, composite]
const seconds = new Set();
for (let c = 0; c < MAX; c++) {
    if (isSurrogate(c) || isHangulSyllable(c)) continue;
    const s = str(c);
    const d = s.normalize('NFD');
    if (d === s) continue;
    const dc = cps(d);
    decomp.push([c, dc]);
    if (s.normalize('NFC') !== s || dc.length < 2) continue; // excluded or singleton
    if (ccc.has(dc[0])) continue;                           // non-starter decomposition
    // a primary composite: find its one-level mapping (first, second). Prefer the last mark
    // (the usual shape), else any mark whose removal leaves a single composed char.
    let found = null;
    for (let k = dc.length - 1; k >= 1 && !found; k--) {
        const rest = dc.slice(0, k).concat(dc.slice(k + 1));
        const first = cps(str(...rest).normalize('NFC'));
        if (first.length !== 1) continue;
        if (str(first[0], dc[k]).normalize('NFC') === s) found = [first[0], dc[k], c];
    }
    if (!found) throw new Error('no composition pair for U+' + c.toString(16));
    pairs.push(found);
    seconds.add(found[1]);
}
// Hangul: V and T jamo compose algorithmically with a preceding L / LV.
for (let c = 0x1161; c <= 0x1175; c++) seconds.add(c);
for (let c = 0x11a8; c <= 0x11c2; c++) seconds.add(c);

// ---- per code point class bits -------------------------------------------------------------------
const L = 1, N = 2, WS = 4, NFC_UNSAFE = 8, DECOMP = 16, M = 32;
const cls = new Uint8Array(MAX);
for (let c = 0; c < MAX; c++) {
    if (isSurrogate(c)) continue;
    const s = str(c);
    let v = 0;
    if (reL.test(s)) v |= L;
    if (reN.test(s)) v |= N;
    if (reWS.test(s)) v |= WS;
    if (reM.test(s)) v |= M;
    if (s.normalize('NFC') !== s || ccc.has(c) || seconds.has(c)) v |= NFC_UNSAFE;
    if (!isHangulSyllable(c) && s.normalize('NFD') !== s) v |= DECOMP;
    cls[c] = v;
}

// two-stage table: 256-entry blocks, deduplicated
const blocks = [], blockIndex = new Map(), stage1 = [];
for (let b = 0; b < MAX / 256; b++) {
    const blk = cls.subarray(b * 256, b * 256 + 256);
    const key = Buffer.from(blk).toString('latin1');
    let idx = blockIndex.get(key);
    if (idx === undefined) {
        idx = blocks.length;
        blocks.push(blk);
        blockIndex.set(key, idx);
    }
    stage1.push(idx);
}

// ---- emit ----------------------------------------------------------------------------------------
const out = [];
const p = (s) => out.push(s);
const wrap = (items, per) => {
    const lines = [];
    for (let i = 0; i < items.length; i += per) lines.push('    ' + items.slice(i, i + per).join(', ') + ',');
    return lines.join('\n');
};
p('/* Generated by engine/tokenizer/gen_unicode_tables.js from node ' + process.version +
  ' (Unicode ' + process.versions.unicode + ', ICU ' + process.versions.icu + ').');
p(' * Do not edit: regenerate with');
p(' *   node engine/tokenizer/gen_unicode_tables.js > engine/tokenizer/unicode_tables.c */');
p('#include "unicode.h"');
p('');
p('const char engine_unicode_version[] = "' + process.versions.unicode + '";');
p('');
p('const uint16_t engine_unicode_stage1[' + stage1.length + '] = {');
p(wrap(stage1.map(String), 16));
p('};');
p('');
p('const uint8_t engine_unicode_stage2[' + blocks.length + '][256] = {');
for (const blk of blocks) {
    p('    {');
    p(wrap(Array.from(blk, (v) => String(v)), 32).replace(/^/gm, '    '));
    p('    },');
}
p('};');
p('');
const cccList = [...ccc.entries()].sort((a, b) => a[0] - b[0]);
p('const engine_unicode_ccc engine_unicode_ccc_table[' + cccList.length + '] = {');
p(wrap(cccList.map(([c, r]) => '{0x' + c.toString(16) + ', ' + r + '}'), 6));
p('};');
p('const size_t engine_unicode_ccc_count = ' + cccList.length + ';');
p('');
decomp.sort((a, b) => a[0] - b[0]);
const pool = [];
const dents = decomp.map(([c, dc]) => {
    const e = '{0x' + c.toString(16) + ', ' + pool.length + ', ' + dc.length + '}';
    pool.push(...dc);
    return e;
});
p('const uint32_t engine_unicode_decomp_pool[' + pool.length + '] = {');
p(wrap(pool.map((c) => '0x' + c.toString(16)), 10));
p('};');
p('const engine_unicode_decomp engine_unicode_decomp_table[' + dents.length + '] = {');
p(wrap(dents, 4));
p('};');
p('const size_t engine_unicode_decomp_count = ' + dents.length + ';');
p('');
pairs.sort((a, b) => (a[0] - b[0]) || (a[1] - b[1]));
p('const engine_unicode_pair engine_unicode_pair_table[' + pairs.length + '] = {');
p(wrap(pairs.map(([a, b, c]) => '{0x' + a.toString(16) + ', 0x' + b.toString(16) + ', 0x' +
  c.toString(16) + '}'), 3));
p('};');
p('const size_t engine_unicode_pair_count = ' + pairs.length + ';');
process.stdout.write(out.join('\n') + '\n');
