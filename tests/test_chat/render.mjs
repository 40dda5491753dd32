// render.mjs: the Jinja side of test_chat. Renders chat templates with the
// npm package @huggingface/jinja (the engine of Hugging Face's JS libraries,
// with trim_blocks and lstrip_blocks as transformers sets them).
//
// Usage: node render.mjs NPM_PREFIX CASES.json RESULTS.json
// CASES.json: {"cases": [{"template": PATH, "messages": [{"role", "content"}],
//   "add_generation_prompt": bool, "bos_token": str, "eos_token": str,
//   "date_string": str (optional), "enable_thinking": bool (optional)}]}
// RESULTS.json: [{"ok": true, "text": str} | {"ok": false, "error": str}],
// one per case in order. Context: raise_exception (the package's own, which
// throws with the message) and strftime_now, which returns "26 Jul 2024"
// whatever the format, so that Llama 3.2's template is deterministic.
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const [npmPrefix, casesPath, resultsPath] = process.argv.slice(2);
if (!resultsPath) {
    console.error("usage: node render.mjs NPM_PREFIX CASES.json RESULTS.json");
    process.exit(2);
}
const require = createRequire(path.join(path.resolve(npmPrefix), "package.json"));
const { Template, Environment } = require("@huggingface/jinja");

// The package declares its own strftime_now (today's date) as a global and
// refuses to declare a name twice, so the fixed-date one passed with the
// context replaces it.
const declare = Environment.prototype.set;
Environment.prototype.set = function (name, value) {
    if (name === "strftime_now") this.variables.delete(name);
    return declare.call(this, name, value);
};

const { cases } = JSON.parse(readFileSync(casesPath, "utf8"));
const templates = new Map();
const results = cases.map((c) => {
    if (!templates.has(c.template)) {
        templates.set(c.template, new Template(readFileSync(c.template, "utf8")));
    }
    const ctx = {
        messages: c.messages,
        add_generation_prompt: c.add_generation_prompt,
        bos_token: c.bos_token,
        eos_token: c.eos_token,
        strftime_now: () => "26 Jul 2024",
    };
    if (c.date_string !== undefined) ctx.date_string = c.date_string;
    if (c.enable_thinking !== undefined) ctx.enable_thinking = c.enable_thinking;
    try {
        return { ok: true, text: templates.get(c.template).render(ctx) };
    } catch (e) {
        return { ok: false, error: String(e && e.message ? e.message : e) };
    }
});
writeFileSync(resultsPath, JSON.stringify(results));
