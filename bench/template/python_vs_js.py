#!/usr/bin/env python3
"""Where Python Jinja2 (as transformers' apply_chat_template configures it) and
@huggingface/jinja 0.5.11 (our reference, tests/fixtures/templates/expected.json) disagree on
the fixture conversations. A diagnostic, not a test: needs python3 with jinja2.
   python3 bench/template/python_vs_js.py"""
import os
import json
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.ext import loopcontrols
from jinja2.exceptions import TemplateError
def raise_exception(m): raise TemplateError(m)
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
base = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "templates") + "/"
cases = json.load(open(base + "cases.json"))["cases"]
exp = json.load(open(base + "expected.json"))["results"]
same = diff = both_err = err_mismatch = 0
for c in cases:
    t = env.from_string(open(base + c["template"] + ".jinja").read())
    try:
        out = t.render(**c["vars"]); err = None
    except Exception as e:
        out = None; err = str(e)
    r = exp[c["name"]]
    if out is None and "error" in r: both_err += 1
    elif out is None or "error" in r:
        err_mismatch += 1; print("ERRDIFF", c["name"], err, r.get("error"))
    elif out == r["output"]: same += 1
    else:
        diff += 1
        i = next((k for k in range(min(len(out), len(r["output"]))) if out[k] != r["output"][k]), min(len(out), len(r["output"])))
        print("DIFF", c["name"], "at", i, repr(r["output"][max(0,i-30):i+30]), "| py:", repr(out[max(0,i-30):i+30]))
print(f"python jinja2 vs @huggingface/jinja: {same} same, {diff} differ, {both_err} both fail, {err_mismatch} fail in one")
