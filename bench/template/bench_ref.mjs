// The same render with @huggingface/jinja (node), for comparison: bench_ref.mjs TEMPLATE CONV REPEATS
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";
const nm = process.env.SPARK_NODE_MODULES;
const require = createRequire(path.join(nm, "noop.js"));
const { Template } = require("@huggingface/jinja");
const [tplPath, convPath, reps] = process.argv.slice(2);
const src = fs.readFileSync(tplPath, "utf8"), vars = JSON.parse(fs.readFileSync(convPath, "utf8"));
// CPU time (user + system) of this process, in ms: the machine is often shared.
const cpu = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1000; };
let t0 = cpu(), tpl;
for (let i = 0; i < 100; i++) tpl = new Template(src);
const parse = (cpu() - t0) / 100;
let out = "";
for (let i = 0; i < 20; i++) out = tpl.render(vars); // warm-up
t0 = cpu();
for (let i = 0; i < +reps; i++) out = tpl.render(vars);
const dt = (cpu() - t0) / +reps;
console.log(`node: ${path.basename(tplPath).padEnd(22)} parse ${parse.toFixed(3)} ms, render ${dt.toFixed(3)} ms CPU, ${Buffer.byteLength(out)} bytes out`);
