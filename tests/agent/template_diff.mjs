// Differential test cases for the chat-template interpreter: random templates (expressions,
// filters, tests, methods, loops, macros, whitespace control, lexer edge cases) from a seeded
// generator, rendered by @huggingface/jinja. Prints {"cases": [{name, source, vars, output} or
// {..., error}]}; test_template_diff renders the same sources and compares byte for byte.
//   node tests/agent/template_diff.mjs SEED COUNT
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const nodeModules = process.env.SPARK_NODE_MODULES || path.join(here, "..", "node_modules");
const require = createRequire(path.join(nodeModules, "noop.js"));
const { Template } = require("@huggingface/jinja");

let state = (Number(process.argv[2] || 1) * 2654435761) >>> 0 || 1;
function rnd() { // xorshift32
    state ^= state << 13; state >>>= 0;
    state ^= state >>> 17;
    state ^= state << 5; state >>>= 0;
    return state / 4294967296;
}
const pick = (a) => a[Math.floor(rnd() * a.length)];
const count = Number(process.argv[3] || 500);

const ATOMS = ["1", "0", "-1", "2.5", "1.0", "'a'", "'Hello World'", "''", "' x '", "'a,b,,c'", "true", "false",
    "none", "x", "y", "s", "n", "f", "arr", "obj", "m", "m.role", "m.content", "arr[0]", "arr[-1]", "obj.a",
    "obj['k 2']", "undefinedvar", "[1,2,3]", "['b','a']", "{'z':1,'a':2}", "range(3)", "messages",
    "messages[0]", "loop.index", "'<think>x</think>y'", "'\\n t \\n'", "'é😀'", "(1,2)", "ns.v",
    "[none, 1]", "[[1, 2], 'x']", "{'a': none}", "big", "tiny", "nested", "(0/0)", "-0.0", "'😀x'",
    "[1.0, 2]", "obj.b", "obj.b.c", "(arr ~ obj)", "(nested ~ '')", "[none]|join(',')"];
const BIN = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">", "<=", ">=", "in", "not in", "and", "or", "**"];
const FIL = ["length", "trim", "tojson", "string", "upper", "lower", "title", "capitalize", "first", "last",
    "reverse", "sort", "join", "list", "items", "int", "float", "abs", "unique", "safe", "join(', ')",
    "default('D')", "default('D', true)", "tojson(indent=2)", "replace('a','b')", "indent(2)",
    "map(attribute='role')", "selectattr('role','equalto','user')", "rejectattr('content')", "dictsort", "int(5)"];
const TESTS = ["defined", "undefined", "none", "string", "number", "integer", "iterable", "mapping", "sequence",
    "boolean", "true", "false", "odd", "even", "callable", "lower", "upper"];
const METH = [".strip()", ".lstrip('x')", ".rstrip()", ".upper()", ".split()", ".split(',')", ".split(',', 1)",
    ".startswith('a')", ".endswith(('d','x'))", ".replace('a','A')", ".items()", ".keys()", ".values()",
    ".get('a')", ".get('q', 9)", ".length", ".title()"];
const NUMS = ["1", "0", "-1", "2.5", "1.0", "x", "f", "arr[0]", "obj.a", "loop.index", "ns.v", "(x * 2)",
    "arr|length", "s|length", "7 // 2", "2 ** 3"];
const STRS = ["'a'", "'Hello World'", "''", "' x '", "'a,b,,c'", "s", "y", "m.role", "m.content",
    "'<think>x</think>y'", "'\\n t \\n'", "arr[1]", "obj['2']", "(s ~ x)", "s.split(',')[0]",
    "m.content.split(',')[-1].lstrip()", "messages[-1].content.split('</think>')[-1]", "(y|upper)", "(y * 2)"];

function typed() {
    if (rnd() < 0.5) {
        const op = pick(["+", "-", "*", "/", "//", "%", "==", "!=", "<", ">", "<=", ">=", "~", "and", "or"]);
        return `(${pick(NUMS)} ${op} ${pick(NUMS)})`;
    }
    let e = `(${pick(STRS)} ${pick(["+", "~", "==", "!=", "in", "not in", "and", "or"])} ${pick(STRS)})`;
    if (rnd() < 0.4) e += "|" + pick(["trim", "length", "upper", "lower", "title", "tojson", "string", "indent",
        "replace(',', ';')", "join('-')", "list", "default('d')", "int", "float"]);
    if (rnd() < 0.3) e += `[${pick(["0", "-1", "1:", "::-1"])}]`;
    return e;
}
function expr(d = 0) {
    if (rnd() < 0.5) return typed();
    const r = rnd();
    if (d > 3 || r < 0.3) return pick(ATOMS);
    if (r < 0.5) return `(${expr(d + 1)} ${pick(BIN)} ${expr(d + 1)})`;
    if (r < 0.65) return `${expr(d + 1)}|${pick(FIL)}`;
    if (r < 0.72) return `(${expr(d + 1)} is ${pick(["", "not "])}${pick(TESTS)})`;
    if (r < 0.8) return `${pick(["s", "obj", "arr", "m.content", "x", "y"])}${pick(METH)}`;
    if (r < 0.86) return `(not ${expr(d + 1)})`;
    if (r < 0.92) return `(${expr(d + 1)} if ${expr(d + 1)} else ${expr(d + 1)})`;
    return `${expr(d + 1)}[${pick(["0", "1", "-1", "1:", "::-1", ":2", '"a"'])}]`;
}
function body(d) {
    let s = "";
    const n = 1 + Math.floor(rnd() * 3);
    for (let i = 0; i < n; i++) s += stmt(d);
    return s;
}
function stmt(d = 0) {
    const r = rnd();
    if (d > 2 || r < 0.35) return `{{ ${expr()} }}` + pick(["", " ", "\n", "|"]);
    if (r < 0.5) return `{% if ${expr()} %}${body(d + 1)}${rnd() < 0.5 ? "{% else %}" + body(d + 1) : ""}{% endif %}`;
    if (r < 0.65) return `{% for ${pick(["i", "k, v"])} in ${pick(["arr", "range(4)", "messages", "obj", "obj|items",
        "arr if arr", "messages[::-1]", expr()])}${pick(["", " if i"])} %}${body(d + 1)}${rnd() < 0.2 ? "{% else %}E" : ""}{% endfor %}`;
    if (r < 0.75) return `{% set ${pick(["x", "y", "ns.v", "a, b"])} = ${expr()} %}`;
    if (r < 0.8) return pick(["{% break %}", "{% continue %}"]);
    if (r < 0.85) return `{% macro mm(p, q='Q') %}[{{ p }}{{ q }}]{% endmacro %}{{ mm(${expr()}) }}`;
    if (r < 0.9) return `{%- if ${expr()} -%}\n  T \n{%- endif -%}\n`;
    return "  text \n";
}
const LEX = ["{%- if true -%}", "{% if true %}", "{%- endif -%}", "{% endif %}", "{{ 'x' }}", "{{- 'y' -}}", "{{ 1 }}",
    "{#- c -#}", "{# c #}", " ", "  ", "\n", "\n\n", "\t", "\u00a0", "\u3000", "\u2028", "\r\n", "text", "é", "a b",
    "{%- set v = 1 %}", "{% set w = 2 -%}", "{% for i in [1,2] %}", "{%- endfor %}", "{% endfor -%}", "{{ i }}", "%}",
    "#}", "-}", "{-", "}", "{", "{% generation %}", "{% endgeneration %}", "{%- generation -%}", "{{ \"%}\\n\" }}",
    "{{ '#}' }}", "{{ '-}' }}", "  {% if true %}", "\t{%- if true %}", "{{ {'a': {'b': 1}} }}", "{{ x }}"];

const VARS = {
    x: 3, y: "yy", s: "a,b,c d", n: null, f: 1.5, arr: [1, "two", 3.5, null, true],
    obj: { a: 1, "k 2": [1], 2: "two", b: { c: null } },
    m: { role: "user", content: "hello, world" },
    big: 1e21, tiny: 1e-7, nested: [[1, [2]], { k: null, 10: "ten", 9: "nine" }],
    messages: [{ role: "system", content: "S" }, { role: "user", content: "U" },
        { role: "assistant", content: "<think>r</think>A" }],
};
const cases = [];
for (let i = 0; i < count; i++) {
    let source;
    if (i % 3 === 2) {
        source = "";
        const n = 1 + Math.floor(rnd() * 14);
        for (let k = 0; k < n; k++) source += pick(LEX);
    } else {
        source = "{% set ns = namespace(v=0) %}" + body(0);
    }
    const c = { name: `r${i}`, source, vars: VARS };
    try {
        const out = new Template(source).render(VARS);
        c.output = out.toWellFormed ? out.toWellFormed() : out;
    } catch (e) {
        c.error = String(e && e.message);
    }
    cases.push(c);
}
process.stdout.write(JSON.stringify({ cases }));
