"""oracle.py: the Python side of test_jinja.sh. Renders chat templates with
Jinja2 set up as Hugging Face transformers renders chat templates
(trim_blocks, lstrip_blocks, the loopcontrols extension, its tojson, a
raise_exception that raises TemplateError, the {% generation %} tag), in a
SandboxedEnvironment rather than transformers' immutable one, so that
list.append and list.pop work as llama.cpp's engine and convoy allow them;
from_json is json.loads, as llama.cpp's engine provides it for DeepSeek's
templates. strftime_now formats the date the cases give, at 00:00.

Usage: python3 oracle.py CASES.json RESULTS.json (check.mjs writes the
cases: template path, context; results: {"ok": true, "text": ...} or
{"ok": false, "error": ..., "raised": bool}, one per case in order).
"""
import datetime
import json
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import SandboxedEnvironment


class Raised(Exception):
    """raise_exception's error, told apart from the template's other errors."""


class Generation(jinja2.ext.Extension):
    """transformers' {% generation %}...{% endgeneration %}: renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def raise_exception(message):
    raise Raised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def main():
    cases_path, results_path = sys.argv[1:3]
    with open(cases_path, encoding="utf-8") as f:
        data = json.load(f)
    day = datetime.datetime(*data["date"])
    env = SandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                               extensions=[jinja2.ext.loopcontrols, Generation])
    env.filters["tojson"] = tojson
    env.filters["from_json"] = json.loads
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = day.strftime
    templates = {}
    results = []
    for c in data["cases"]:
        try:
            if c["template"] not in templates:
                with open(c["template"], encoding="utf-8") as f:
                    templates[c["template"]] = env.from_string(f.read())
            results.append({"ok": True, "text": templates[c["template"]].render(**c["context"])})
        except Raised as e:
            results.append({"ok": False, "raised": True, "error": str(e)})
        except Exception as e:  # the template's own failure, reported as a refusal
            results.append({"ok": False, "raised": False, "error": "%s: %s" % (type(e).__name__, e)})
    with open(results_path, "w", encoding="utf-8") as f:
        json.dump(results, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
