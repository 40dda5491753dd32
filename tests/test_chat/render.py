"""render.py: the Python side of test_chat. Renders chat templates with
Jinja2 set up as Hugging Face transformers renders chat templates: an
ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks and the
loopcontrols extension, raise_exception raising TemplateError, tools=None in
the context. strftime_now returns "26 Jul 2024" whatever the format, so that
Llama 3.2's template is deterministic.

Usage: python3 render.py CASES.json RESULTS.json (the formats of render.mjs).
"""
import json
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def main():
    cases_path, results_path = sys.argv[1:3]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: "26 Jul 2024"
    with open(cases_path, encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    templates = {}
    results = []
    for c in cases:
        if c["template"] not in templates:
            with open(c["template"], encoding="utf-8") as f:
                templates[c["template"]] = env.from_string(f.read())
        ctx = {
            "messages": c["messages"],
            "tools": None,
            "add_generation_prompt": c["add_generation_prompt"],
            "bos_token": c["bos_token"],
            "eos_token": c["eos_token"],
        }
        for key in ("date_string", "enable_thinking"):
            if key in c:
                ctx[key] = c[key]
        try:
            results.append({"ok": True, "text": templates[c["template"]].render(**ctx)})
        except jinja2.exceptions.TemplateError as e:
            results.append({"ok": False, "error": str(e)})
    with open(results_path, "w", encoding="utf-8") as f:
        json.dump(results, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
