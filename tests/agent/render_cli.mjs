// `spark-agent model render --template T` against @huggingface/jinja for every conversation of
// tests/fixtures/templates/cases.json that the command's flags can express. Exits 77 (skip,
// with the reason printed) while the `model` dispatcher does not route `render` yet.
import { createRequire } from "node:module";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import os from "node:os";

const root = process.env.SPARK_SOURCE_DIR;
const cli = process.env.SPARK_CLI;
const nodeModules = process.env.SPARK_NODE_MODULES || path.join(root, "tests", "node_modules");
const require = createRequire(path.join(nodeModules, "noop.js"));
const { Template } = require("@huggingface/jinja");
const fixtures = path.join(root, "tests", "fixtures", "templates");

const probe = spawnSync(cli, ["model", "render", "--help"], { encoding: "utf8" });
if (probe.status !== 0) {
    console.log(`skip: 'spark-agent model render' is not routed in this build: ${probe.stderr.trim()}`);
    process.exit(77);
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "render-cli-"));
let failures = 0, checked = 0;
for (const c of JSON.parse(fs.readFileSync(path.join(fixtures, "cases.json"), "utf8")).cases) {
    const keys = Object.keys(c.vars).filter((k) => !["messages", "tools", "add_generation_prompt", "enable_thinking"].includes(k));
    if (keys.length) continue;
    const tplPath = path.join(fixtures, `${c.template}.jinja`);
    const args = ["model", "render", "--template", tplPath];
    if (!c.vars.add_generation_prompt) args.push("--no-generation-prompt");
    if ("enable_thinking" in c.vars) args.push(`--enable-thinking=${c.vars.enable_thinking}`);
    if ("tools" in c.vars) {
        const tp = path.join(tmp, "tools.json");
        fs.writeFileSync(tp, JSON.stringify(c.vars.tools));
        args.push("--tools", tp);
    }
    let want, wantErr = null;
    try {
        want = new Template(fs.readFileSync(tplPath, "utf8")).render(c.vars);
    } catch (e) {
        wantErr = String(e.message);
    }
    const r = spawnSync(cli, args, { input: JSON.stringify(c.vars.messages) });
    checked++;
    if (wantErr !== null) {
        if (r.status !== 1) {
            console.error(`FAIL ${c.name}: reference fails (${wantErr}), exit status ${r.status}`);
            failures++;
        }
        continue;
    }
    if (r.status !== 0 || !Buffer.from(want, "utf8").equals(r.stdout)) {
        console.error(`FAIL ${c.name}: status ${r.status} ${r.stderr.toString().trim()}`);
        failures++;
    }
}
// The template from the GGUF itself: a generated tiny model carries the real Qwen3 tokenizer and
// its chat template, so `model render FILE` must equal the reference on qwen3.jinja.
const gguf = path.join(tmp, "tiny.gguf");
const gen = spawnSync(cli, ["model", "gen", "--preset", "tiny", "--type", "q4_0", "-o", gguf], { encoding: "utf8" });
if (gen.status !== 0) {
    console.error(`FAIL model gen: ${gen.stderr}`);
    failures++;
} else {
    const qwen3 = new Template(fs.readFileSync(path.join(fixtures, "qwen3.jinja"), "utf8"));
    let viaGguf = 0;
    for (const c of JSON.parse(fs.readFileSync(path.join(fixtures, "cases.json"), "utf8")).cases) {
        if (c.template !== "qwen3" || Object.keys(c.vars).some((k) => !["messages", "add_generation_prompt"].includes(k)))
            continue;
        let want;
        try { want = qwen3.render(c.vars); } catch { continue; }
        if (++viaGguf > 8) break; // each run maps the model; eight conversations show the path
        const args = ["model", "render", gguf];
        if (!c.vars.add_generation_prompt) args.push("--no-generation-prompt");
        const r = spawnSync(cli, args, { input: JSON.stringify(c.vars.messages) });
        checked++;
        if (r.status !== 0 || !Buffer.from(want, "utf8").equals(r.stdout)) {
            console.error(`FAIL GGUF ${c.name}: status ${r.status} ${r.stderr.toString().trim()}`);
            failures++;
        }
    }
}
// usage errors
const bad = spawnSync(cli, ["model", "render", "--template", path.join(fixtures, "qwen3.jinja")], { input: "[" });
if (bad.status !== 2) { console.error(`FAIL malformed stdin: status ${bad.status}`); failures++; }
const none = spawnSync(cli, ["model", "render"], { input: "[]" });
if (none.status !== 2) { console.error(`FAIL no model: status ${none.status}`); failures++; }
fs.rmSync(tmp, { recursive: true, force: true });
console.log(`${checked} conversations through the CLI, ${failures} failures`);
process.exit(failures ? 1 : 0);
