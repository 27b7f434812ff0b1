'use strict';
// Context chunks from other files: a small ring of recently viewed, edited or copied ranges that
// goes with each completion request as extra context, so the model sees the code the user has
// been working with and not only the current file. The strategy follows llama.vscode/llama.vim:
// fixed-size line chunks, most recent last, a chunk that mostly repeats an older one replaces it,
// the oldest leave when the ring is full, and a request takes the newest chunks that fit a
// character budget.

/** Non-blank, trimmed lines of a chunk as a set: the basis of the similarity measure. */
function lineSet(lines) {
    const s = new Set();
    for (const l of lines) {
        const t = l.trim();
        if (t.length > 0) s.add(t);
    }
    return s;
}

/** Dice coefficient of two line sets: 1 for the same lines, 0 for none in common. */
function similarity(a, b) {
    if (a.size === 0 && b.size === 0) return 1;
    let common = 0;
    const [small, large] = a.size <= b.size ? [a, b] : [b, a];
    for (const l of small) if (large.has(l)) common++;
    return (2 * common) / (a.size + b.size);
}

/**
 * Lines [start, start + n) of `lines` centred on `centre` (clamped to the document):
 * returns { start, lines }.
 */
function pickLines(lines, centre, n) {
    let start = Math.max(0, Math.min(centre - Math.floor(n / 2), lines.length - n));
    start = Math.max(0, start);
    return { start, lines: lines.slice(start, start + n) };
}

class ContextRing {
    /**
     * @param {object} [opts]
     * @param {number} [opts.maxChunks=16]    ring capacity
     * @param {number} [opts.chunkLines=64]   lines per chunk picked around a position
     * @param {number} [opts.minLines=3]      chunks with fewer non-blank lines are noise
     * @param {number} [opts.similar=0.9]     a new chunk this similar to an old one replaces it
     */
    constructor(opts = {}) {
        this.maxChunks = opts.maxChunks ?? 16;
        this.chunkLines = opts.chunkLines ?? 64;
        this.minLines = opts.minLines ?? 3;
        this.similar = opts.similar ?? 0.9;
        this.chunks = []; // { uri, start, text, set }, oldest first
        this.evicted = 0;
    }

    /**
     * Add the range of `uri` that starts at line `start` (0-based) with the given `lines`.
     * Returns 'added', 'refreshed' (the same text was already there: it becomes the newest),
     * 'replaced' (similar older chunks were dropped for it) or 'ignored' (too small).
     */
    add(uri, start, lines) {
        const set = lineSet(lines);
        if (set.size < this.minLines) return 'ignored';
        const text = lines.join('\n');
        const same = this.chunks.findIndex((c) => c.text === text);
        if (same >= 0) {
            const [c] = this.chunks.splice(same, 1);
            c.uri = uri;
            c.start = start;
            this.chunks.push(c);
            return 'refreshed';
        }
        const before = this.chunks.length;
        this.chunks = this.chunks.filter((c) => similarity(c.set, set) <= this.similar);
        const replaced = this.chunks.length < before;
        this.evicted += before - this.chunks.length;
        this.chunks.push({ uri, start, text, set });
        while (this.chunks.length > this.maxChunks) {
            this.chunks.shift();
            this.evicted++;
        }
        return replaced ? 'replaced' : 'added';
    }

    /** Add a chunk of `chunkLines` lines of the document `allLines` centred on line `line`. */
    addAround(uri, allLines, line) {
        const p = pickLines(allLines, line, this.chunkLines);
        return this.add(uri, p.start, p.lines);
    }

    /**
     * The chunks to send with a request for `uri` whose own window covers lines
     * [winStart, winEnd): chunks of the same file that overlap the window are left out (the
     * request carries that text already). The newest chunks that fit `budget` characters are
     * returned oldest first (the newest ends up nearest the cursor in the prompt), each as
     * { uri, start, text }.
     */
    take(uri, winStart, winEnd, budget) {
        const out = [];
        let used = 0;
        for (let i = this.chunks.length - 1; i >= 0; i--) {
            const c = this.chunks[i];
            if (c.uri === uri) {
                const end = c.start + c.text.split('\n').length;
                if (c.start < winEnd && end > winStart) continue;
            }
            if (used + c.text.length > budget) continue;
            used += c.text.length;
            out.push({ uri: c.uri, start: c.start, text: c.text });
        }
        return out.reverse();
    }

    /** Forget the chunks of a file (closed or deleted). */
    dropUri(uri) {
        this.chunks = this.chunks.filter((c) => c.uri !== uri);
    }

    get size() {
        return this.chunks.length;
    }
}

module.exports = { ContextRing, similarity, lineSet, pickLines };
