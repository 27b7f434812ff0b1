'use strict';
// Completion cache. Entries are keyed by a window of the text around the cursor (the end of the
// prefix and the start of the suffix). A lookup also walks back over the characters typed since
// a cached request: if the user typed exactly what a cached suggestion began with, the rest of
// that suggestion is the answer, so typing through a suggestion never asks the server again.

class CompletionCache {
    /**
     * @param {object} [opts]
     * @param {number} [opts.maxEntries=256]  least recently used entries are dropped beyond this
     * @param {number} [opts.prefixWindow=2048] characters of the prefix that form the key
     * @param {number} [opts.suffixWindow=512]  characters of the suffix that form the key
     */
    constructor(opts = {}) {
        this.maxEntries = opts.maxEntries ?? 256;
        this.prefixWindow = opts.prefixWindow ?? 2048;
        this.suffixWindow = opts.suffixWindow ?? 512;
        this.map = new Map(); // key -> text, in LRU order (oldest first)
        this.longest = 0; // longest cached text: bounds the walk back
    }

    key(prefix, suffix) {
        return prefix.slice(-this.prefixWindow) + '\u0000' + suffix.slice(0, this.suffixWindow);
    }

    /** Remember the completion `text` for the cursor between `prefix` and `suffix`. */
    put(prefix, suffix, text) {
        if (typeof text !== 'string') return;
        const k = this.key(prefix, suffix);
        this.map.delete(k);
        this.map.set(k, text);
        if (text.length > this.longest) this.longest = text.length;
        while (this.map.size > this.maxEntries) this.map.delete(this.map.keys().next().value);
    }

    /**
     * The completion for the cursor between `prefix` and `suffix`, or null. An exact entry wins;
     * otherwise the nearest earlier cursor position (up to the longest cached text back) whose
     * cached text begins with the characters typed since then, minus those characters. An entry
     * that was typed through completely gives no answer (null), so the caller asks the server.
     */
    get(prefix, suffix) {
        const exact = this.map.get(this.key(prefix, suffix));
        if (exact !== undefined) {
            this.touch(this.key(prefix, suffix), exact);
            return exact;
        }
        const maxBack = Math.min(this.longest, prefix.length);
        for (let back = 1; back <= maxBack; back++) {
            const typed = prefix.slice(prefix.length - back);
            const k = this.key(prefix.slice(0, prefix.length - back), suffix);
            const text = this.map.get(k);
            if (text === undefined) continue;
            if (text.length > back && text.startsWith(typed)) {
                this.touch(k, text);
                return text.slice(back);
            }
        }
        return null;
    }

    touch(k, text) {
        this.map.delete(k);
        this.map.set(k, text);
    }

    clear() {
        this.map.clear();
        this.longest = 0;
    }

    get size() {
        return this.map.size;
    }
}

module.exports = { CompletionCache };
