// The chat webview. It only renders and forwards: the extension holds the connection. Model
// output is put in the page with textContent only, never as HTML.
(function () {
    'use strict';
    const vscode = acquireVsCodeApi();
    const log = document.getElementById('log');
    const input = document.getElementById('input');
    let current = null; // the assistant bubble being streamed
    let calls = null; // tool-call pieces of the current answer, by index

    function el(tag, cls, text) {
        const e = document.createElement(tag);
        if (cls) e.className = cls;
        if (text !== undefined) e.textContent = text;
        return e;
    }
    function add(e) {
        log.appendChild(e);
        log.scrollTop = log.scrollHeight;
        return e;
    }
    function diffView(diff) {
        const pre = el('pre', 'diff');
        for (const line of diff.split('\n')) {
            const cls = line.startsWith('+') && !line.startsWith('+++') ? 'add'
                : line.startsWith('-') && !line.startsWith('---') ? 'del'
                    : line.startsWith('@@') ? 'hunk' : '';
            pre.appendChild(el('span', cls, line + '\n'));
        }
        return pre;
    }
    function details(summary, body) {
        const d = el('details', 'tool');
        d.appendChild(el('summary', '', summary));
        d.appendChild(el('pre', '', body));
        return d;
    }

    document.getElementById('form').addEventListener('submit', (ev) => {
        ev.preventDefault();
        const text = input.value.trim();
        if (!text) return;
        add(el('div', 'msg user', text));
        input.value = '';
        vscode.postMessage({ type: 'send', text });
    });
    input.addEventListener('keydown', (ev) => {
        if (ev.key === 'Enter' && !ev.shiftKey) {
            ev.preventDefault();
            document.getElementById('form').requestSubmit();
        }
    });
    document.getElementById('stop').addEventListener('click',
        () => vscode.postMessage({ type: 'stop' }));
    document.getElementById('clear').addEventListener('click', () => {
        log.textContent = '';
        vscode.postMessage({ type: 'clear' });
    });

    window.addEventListener('message', (ev) => {
        const m = ev.data;
        switch (m.type) {
        case 'start':
            current = add(el('div', 'msg assistant', ''));
            calls = new Map();
            break;
        case 'delta':
            if (!current) current = add(el('div', 'msg assistant', ''));
            if (m.delta.content) current.textContent += m.delta.content;
            if (m.delta.toolCall) {
                const t = m.delta.toolCall;
                let c = calls.get(t.index);
                if (!c) {
                    c = add(el('pre', 'call', `${t.name ?? 'tool'}(`));
                    calls.set(t.index, c);
                }
                c.textContent += t.arguments ?? '';
            }
            log.scrollTop = log.scrollHeight;
            break;
        case 'done':
            if (current && m.usage) {
                current.appendChild(el('div', 'meta',
                    `${m.finishReason} · ${m.usage.completionTokens} tokens · ` +
                    `${(m.usage.tokensPerSecond ?? 0).toFixed(0)} tok/s`));
            }
            current = null;
            break;
        case 'agentStart':
            add(el('div', 'msg user', `agent: ${m.task}`));
            current = null;
            break;
        case 'agentEvent': {
            const e = m.event;
            if (e.type === 'text') {
                if (!current) current = add(el('div', 'msg assistant', ''));
                current.textContent += e.text;
            } else {
                current = null;
                if (e.type === 'tool_call') {
                    add(el('div', 'call', `${e.decision === 'deny' ? '✗' : '▶'} ${e.name} ${e.arguments}`));
                } else if (e.type === 'tool_result') {
                    add(details(`${e.ok ? '✓' : '✗'} ${e.name} result`, e.content));
                } else if (e.type === 'diff') {
                    add(diffView(e.diff));
                } else if (e.type === 'refused' || e.type === 'invalid_call') {
                    add(el('div', 'refused', `${e.type}: ${e.name}: ${e.content}`));
                } else if (e.type === 'stop') {
                    add(el('div', 'meta', `stopped: ${e.reason} (${e.steps} steps, ${e.tool_calls} tool calls)`));
                }
            }
            break;
        }
        case 'approval': {
            const box = add(el('div', 'approval'));
            box.appendChild(el('div', '', `Allow ${m.kind} ${m.tool}?`));
            box.appendChild(el('pre', '', m.arguments));
            const yes = el('button', '', 'Approve');
            const no = el('button', '', 'Deny');
            const answer = (approved) => {
                vscode.postMessage({ type: 'approve', id: m.id, approved });
                yes.disabled = no.disabled = true;
                box.appendChild(el('div', 'meta', approved ? 'approved' : 'denied'));
            };
            yes.addEventListener('click', () => answer(true));
            no.addEventListener('click', () => answer(false));
            box.appendChild(yes);
            box.appendChild(no);
            break;
        }
        case 'agentDone':
            add(el('div', 'msg assistant', m.result.answer ?? m.result.message ?? ''));
            add(el('div', 'meta', `${m.result.stop} · ${m.result.steps} steps · ${m.result.tokens} tokens`));
            current = null;
            break;
        case 'error':
            add(el('div', 'error', m.text));
            current = null;
            break;
        }
    });
}());
