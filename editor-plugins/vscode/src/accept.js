'use strict';
// Partial acceptance of a suggestion: the next word or the next line. Both return
// { accepted, rest } with accepted + rest === text, so the caller can insert `accepted` and keep
// showing `rest` as the remaining ghost text without asking the server again.

const WORD = /[\p{L}\p{N}_$]/u;

/**
 * The next word: leading blanks (not newlines), then a run of identifier characters, or else a
 * run of other non-blank characters (operators, brackets). A suggestion that starts with a newline
 * accepts the newline and the next line's indentation, so "accept word" walks into the next line
 * the way an editor's word motion does.
 */
function acceptWord(text) {
    let i = 0;
    const n = text.length;
    if (text[i] === '\r' && text[i + 1] === '\n') i += 2;
    else if (text[i] === '\n') i += 1;
    while (i < n && (text[i] === ' ' || text[i] === '\t')) i++;
    if (i < n && WORD.test(text[i])) {
        while (i < n && WORD.test(text[i])) i++;
    } else {
        while (i < n && !WORD.test(text[i]) && !/\s/.test(text[i])) i++;
    }
    if (i === 0 && n > 0) i = 1; // never return an empty step for non-empty text
    return { accepted: text.slice(0, i), rest: text.slice(i) };
}

/**
 * The next line: everything up to (not including) the first line break that follows some text
 * on the line. A suggestion that starts with a line break accepts it and the whole next line.
 */
function acceptLine(text) {
    let i = 0;
    if (text.startsWith('\r\n')) i = 2;
    else if (text.startsWith('\n')) i = 1;
    const nl = text.indexOf('\n', i);
    let end = nl < 0 ? text.length : nl;
    if (end > i && text[end - 1] === '\r') end--;
    return { accepted: text.slice(0, end), rest: text.slice(end) };
}

module.exports = { acceptWord, acceptLine };
