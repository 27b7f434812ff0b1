'use strict';
// Building inline-completion requests from an editor's state, independent of the editor: lines
// of the document, a cursor (line, UTF-16 character, which is what JavaScript string indices
// count), the context ring. The prefix/suffix windows mirror what the server takes from the
// open document (maxPrefixLines/maxSuffixLines), so the client cache keys on the same text.

/**
 * @param {object} a
 * @param {string} a.uri
 * @param {string[]} [a.lines]         the document's lines without line ends, or:
 * @param {number} [a.lineCount]       with a.getLine(i): the lines, fetched only in the windows
 * @param {{line: number, character: number}} a.position
 * @param {import('./context').ContextRing} [a.ring]
 * @param {object} [a.opts] maxTokens, timeBudgetMs, temperature, maxPrefixLines,
 *        maxSuffixLines, contextBudget (characters of extra chunks), maxExtraChunks, relPath(uri)
 * @returns {{params: object, prefix: string, suffix: string}}
 */
function buildRequest(a) {
    const o = a.opts ?? {};
    const maxPrefixLines = o.maxPrefixLines ?? 256;
    const maxSuffixLines = o.maxSuffixLines ?? 64;
    const { line, character } = a.position;
    const count = a.lines ? a.lines.length : a.lineCount;
    const get = a.lines ? (i) => a.lines[i] : a.getLine;
    if (line < 0 || line >= count) throw new RangeError(`line ${line} outside 0..${count - 1}`);
    const cur = get(line);
    const col = Math.min(character, cur.length);
    const first = Math.max(0, line - maxPrefixLines);
    let prefix = '';
    for (let i = first; i < line; i++) prefix += get(i) + '\n';
    prefix += cur.slice(0, col);
    let suffix = cur.slice(col);
    const last = Math.min(count, line + 1 + maxSuffixLines);
    for (let i = line + 1; i < last; i++) suffix += '\n' + get(i);
    const params = {
        textDocument: { uri: a.uri },
        position: { line, character: col },
        maxTokens: o.maxTokens ?? 64,
        timeBudgetMs: o.timeBudgetMs ?? 2000,
        maxPrefixLines,
        maxSuffixLines,
    };
    if (o.temperature !== undefined) params.temperature = o.temperature;
    // in the middle of a line only the rest of that line makes sense (as llama.vscode does)
    if (/\S/.test(cur.slice(col))) params.singleLine = true;
    if (a.ring) {
        const chunks = a.ring.take(a.uri, first, line + 1 + maxSuffixLines,
            o.contextBudget ?? 8192).slice(-(o.maxExtraChunks ?? 32));
        if (chunks.length > 0) {
            const rel = o.relPath ?? ((u) => u);
            params.extra = chunks.map((c) => ({ uri: c.uri, filename: rel(c.uri), text: c.text }));
        }
    }
    // The cache key includes the extra context only through the prefix/suffix: a changed ring
    // alone does not invalidate a suggestion for the same text around the cursor.
    return { params, prefix, suffix };
}

/**
 * A Completer fetch function over the protocol: sends textDocument/inlineCompletion through
 * `docs` (so a dropped document is reopened) and resolves to the suggested text ('' for none).
 * `onResult(result)` sees every result (timings for the status bar).
 */
function makeFetch(docs, onResult) {
    return (req) => {
        const h = docs.request(req.params.textDocument.uri, 'textDocument/inlineCompletion',
            req.params);
        return {
            promise: h.promise.then((r) => {
                if (onResult) onResult(r);
                const item = r && Array.isArray(r.items) ? r.items[0] : undefined;
                return item && typeof item.insertText === 'string' ? item.insertText : '';
            }),
            cancel: h.cancel,
        };
    };
}

module.exports = { buildRequest, makeFetch };
