// check.mjs: the comparison of test_jinja.sh. Renders every template of a
// folder with every conversation of conversations.json three ways and
// compares them byte for byte:
//   - @huggingface/jinja (the oracle the suite requires; trim_blocks and
//     lstrip_blocks as transformers sets them),
//   - Python's Jinja2 as transformers sets it up (oracle.py, run from here),
//   - `convoy render-template` (each template's requests in one file given
//     to --requests, --bos, --eos, --date).
// Both oracles get the variables chat/template.h's cv_render_chat documents:
// messages (content null or absent as "", a list of text parts joined by
// "\n", tool call arguments that hold a JSON object as that object), tools (or null),
// add_generation_prompt (the request's, else true), bos_token, eos_token,
// then chat_template_kwargs over them; strftime_now formats the fixed date.
//
// A case passes when convoy's text equals @huggingface/jinja's, or when both
// refuse: for raise_exception, convoy's message must contain the
// template's; for other failures, Jinja2 must refuse too. A case where
// @huggingface/jinja fails or renders differently while Jinja2 gives
// convoy's result (the oracle's own gaps: filters and methods it lacks,
// JavaScript's semantics) is listed with convoy's output and passes. Any
// other case fails. A NOTE line marks a case where convoy agrees with
// @huggingface/jinja but not with Jinja2: jinja.h's two documented
// deviations (lists where Python has generators, no Markup escaping).
// Exit status 1 on a failure, 2 on a usage error.
//
// Usage: node check.mjs CONVOY NPM_PREFIX TEMPLATES_DIR CONVERSATIONS.json WORK_DIR
import { spawn, spawnSync } from "node:child_process";
import { availableParallelism } from "node:os";
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const [convoy, npmPrefix, templatesDir, convPath, work] = process.argv.slice(2);
if (!work) {
    console.error("usage: node check.mjs CONVOY NPM_PREFIX TEMPLATES_DIR CONVERSATIONS.json WORK_DIR");
    process.exit(2);
}
const require = createRequire(path.join(path.resolve(npmPrefix), "package.json"));
const { Template, Environment } = require("@huggingface/jinja");

const data = JSON.parse(readFileSync(convPath, "utf8"));
const MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
    "November", "December"];
const DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
const [dd, mon, yyyy] = data.date.split(" ");
const day = new Date(Date.UTC(Number(yyyy), MONTHS.findIndex((m) => m.startsWith(mon)), Number(dd)));

// strftime of the fixed date at 00:00 (the codes chat templates use).
function strftime(fmt) {
    const pad = (n, w = 2) => String(n).padStart(w, "0");
    const start = Date.UTC(day.getUTCFullYear(), 0, 1);
    const codes = {
        Y: String(day.getUTCFullYear()), y: pad(day.getUTCFullYear() % 100), m: pad(day.getUTCMonth() + 1),
        d: pad(day.getUTCDate()), H: "00", M: "00", S: "00", b: MONTHS[day.getUTCMonth()].slice(0, 3),
        B: MONTHS[day.getUTCMonth()], a: DAYS[day.getUTCDay()].slice(0, 3), A: DAYS[day.getUTCDay()],
        j: pad((day - start) / 86400000 + 1, 3), "%": "%",
    };
    return fmt.replace(/%(-?)([YymdHMSbBaAj%])/g, (_, dash, c) => (dash ? String(Number(codes[c])) : codes[c]));
}

// The template's variables for a request, as cv_render_chat makes them.
function contextOf(req, bos, eos) {
    const messages = structuredClone(req.messages).map((m) => {
        if (Array.isArray(m.content)) m.content = m.content.map((p) => p.text).join("\n");
        if (m.content === null || m.content === undefined) m.content = "";
        for (const call of m.tool_calls ?? []) {
            const args = call.function?.arguments;
            if (typeof args !== "string") continue;
            try {
                const o = JSON.parse(args);
                if (o && typeof o === "object" && !Array.isArray(o)) call.function.arguments = o;
            } catch {}
        }
        return m;
    });
    const gen = typeof req.add_generation_prompt === "boolean" ? req.add_generation_prompt : true;
    const ctx = { messages, tools: req.tools ?? null, add_generation_prompt: gen, bos_token: bos, eos_token: eos };
    return Object.assign(ctx, req.chat_template_kwargs ?? {});
}

// The package declares raise_exception and strftime_now itself and refuses
// to declare a name twice: ours (a tagged error, the fixed date) replace them.
const declare = Environment.prototype.set;
Environment.prototype.set = function (name, value) {
    if (name === "raise_exception" || name === "strftime_now") this.variables.delete(name);
    return declare.call(this, name, value);
};
function raiseException(msg) {
    const e = new Error(String(msg));
    e.raised = true;
    throw e;
}

function renderJs(cache, file, ctx) {
    try {
        if (!cache.has(file)) cache.set(file, new Template(readFileSync(file, "utf8")));
        const text = cache.get(file).render({ ...ctx, raise_exception: raiseException, strftime_now: strftime });
        return { ok: true, text };
    } catch (e) {
        return { ok: false, raised: !!e.raised, error: String(e && e.message ? e.message : e) };
    }
}

function renderPython(cases) {
    const casesPath = path.join(work, "cases.json"), resultsPath = path.join(work, "python.json");
    const py = cases.map((c) => ({ template: c.file, context: c.ctx }));
    writeFileSync(casesPath, JSON.stringify({ date: [day.getUTCFullYear(), day.getUTCMonth() + 1, day.getUTCDate()], cases: py }));
    const here = path.dirname(new URL(import.meta.url).pathname);
    const r = spawnSync("python3", [path.join(here, "oracle.py"), casesPath, resultsPath], { stdio: "inherit" });
    if (r.status !== 0) throw new Error("oracle.py failed");
    return JSON.parse(readFileSync(resultsPath, "utf8"));
}

// Every case of one template through one convoy process (--requests: a
// JSON array of bodies in, a JSON array of {prompt} or {error} out).
function renderTemplateCases(file, tcases) {
    const reqsPath = path.join(work, `requests-${path.basename(file)}.json`);
    writeFileSync(reqsPath, JSON.stringify(tcases.map((c) => c.request)));
    const args = ["render-template", "--template", file, "--requests", reqsPath, "--bos", tcases[0].bos,
        "--eos", tcases[0].eos, "--date", data.date];
    return new Promise((resolve, reject) => {
        const p = spawn(convoy, args), out = [], err = [];
        p.stdout.on("data", (d) => out.push(d));
        p.stderr.on("data", (d) => err.push(d));
        p.on("error", reject);
        p.on("close", (status) => {
            const why = Buffer.concat(err).toString("utf8").trim();
            if (status !== 0) return resolve(tcases.map(() => ({ ok: false, error: why })));
            resolve(JSON.parse(Buffer.concat(out).toString("utf8")).map((a) =>
                "prompt" in a ? { ok: true, bytes: Buffer.from(a.prompt, "utf8") } : { ok: false, error: a.error }));
        });
    });
}

// Every case through convoy, one process per template, as many at once as
// there are cores.
async function renderAllConvoy(cases) {
    const byFile = new Map();
    cases.forEach((c, i) => (byFile.get(c.file) ?? byFile.set(c.file, []).get(c.file)).push(i));
    const groups = [...byFile.values()], results = new Array(cases.length);
    let next = 0;
    const worker = async () => {
        while (next < groups.length) {
            const idx = groups[next++];
            const answers = await renderTemplateCases(cases[idx[0]].file, idx.map((i) => cases[i]));
            idx.forEach((i, k) => (results[i] = answers[k]));
        }
    };
    await Promise.all(Array.from({ length: availableParallelism() }, worker));
    return results;
}

const sameText = (bytes, text) => Buffer.compare(bytes, Buffer.from(text, "utf8")) === 0;
// Whether an oracle's result is convoy's: the same text, or both refusing
// (with the template's own message when it raised).
function agrees(o, cv) {
    if (o.ok) return cv.ok && sameText(cv.bytes, o.text);
    return !cv.ok && (!o.raised || cv.error.includes(o.error));
}

function show(label, text) {
    const lines = text.split("\n");
    console.log(`    ${label} (${Buffer.byteLength(text)} bytes):`);
    for (const l of lines) console.log(`    | ${JSON.stringify(l).slice(1, -1)}`);
}

function firstDiff(a, b) {
    let i = 0;
    while (i < a.length && i < b.length && a[i] === b[i]) i++;
    return i;
}

// ---- the cases ----
mkdirSync(work, { recursive: true });
const files = readdirSync(templatesDir).filter((f) => f.endsWith(".jinja")).sort();
const cases = [];
files.forEach((f) => {
    const [, bos, eos] = data.special_tokens.find(([prefix]) => f.startsWith(prefix));
    for (const conv of data.conversations)
        cases.push({ file: path.join(templatesDir, f), name: f, conv: conv.name, request: conv.request, bos, eos,
            ctx: contextOf(conv.request, bos, eos) });
});

const js = new Map();
const jsResults = cases.map((c) => renderJs(js, c.file, c.ctx));
const pyResults = renderPython(cases);
const cvResults = await renderAllConvoy(cases);
const perTemplate = new Map(files.map((f) => [f, { equal: 0, refused: 0, listed: 0, failed: 0 }]));
const listed = [];
let failures = 0;
cases.forEach((c, i) => {
    const o = jsResults[i], py = pyResults[i], cv = cvResults[i], t = perTemplate.get(c.name);
    if (!agrees(py, cv)) console.log(`NOTE ${c.name} / "${c.conv}": Jinja2 ${py.ok ? "renders otherwise" : "refuses: " + py.error}`);
    if (o.ok && agrees(o, cv)) return t.equal++;
    if (!o.ok && agrees(o, cv) && (o.raised || !py.ok)) {
        console.log(`refused alike: ${c.name} / "${c.conv}": ${cv.error.replace(/^.*?: chat template /, "")}`);
        return t.refused++;
    }
    if (agrees(py, cv)) {
        t.listed++;
        return listed.push({ c, o, cv });
    }
    t.failed++;
    failures++;
    console.log(`FAIL ${c.name} / "${c.conv}"`);
    const ref = o.ok ? o : py;
    if (ref.ok && cv.ok) {
        const text = cv.bytes.toString("utf8"), at = firstDiff(ref.text, text);
        console.log(`    first difference at character ${at}`);
        console.log(`    ${o.ok ? "@huggingface/jinja" : "Jinja2"}: ${JSON.stringify(ref.text.slice(Math.max(0, at - 60), at + 80))}`);
        console.log(`    convoy:   ${JSON.stringify(text.slice(Math.max(0, at - 60), at + 80))}`);
    } else {
        console.log(`    @huggingface/jinja: ${o.ok ? "text" : "error: " + o.error}`);
        console.log(`    Jinja2: ${py.ok ? "text" : "error: " + py.error}`);
        console.log(`    convoy: ${cv.ok ? "text" : "error: " + cv.error}`);
    }
});

// ---- the report ----
console.log(`\nCases @huggingface/jinja cannot render, or renders otherwise than Python's Jinja2 (convoy's output,`);
console.log(`which is Jinja2's, is shown):`);
for (const { c, o, cv } of listed) {
    console.log(`\nLISTED ${c.name} / "${c.conv}"`);
    if (!o.ok) console.log(`    @huggingface/jinja fails: ${o.error}`);
    else {
        const text = cv.ok ? cv.bytes.toString("utf8") : "", at = firstDiff(o.text, text);
        console.log(`    @huggingface/jinja differs at character ${at}: ${JSON.stringify(o.text.slice(Math.max(0, at - 40), at + 60))}`);
    }
    if (cv.ok) show("convoy", cv.bytes.toString("utf8"));
    else console.log(`    convoy (and Jinja2) refuse: ${cv.error}`);
}
console.log("");
let total = { equal: 0, refused: 0, listed: 0, failed: 0 };
for (const [f, t] of perTemplate) {
    console.log(`${t.failed ? "FAIL" : "ok  "} ${f}: ${t.equal} equal, ${t.refused} refused alike, ${t.listed} listed, ${t.failed} failed`);
    for (const k of Object.keys(total)) total[k] += t[k];
}
console.log(`\n${files.length} templates x ${data.conversations.length} conversations = ${cases.length} cases: ` +
    `${total.equal} equal to @huggingface/jinja, ${total.refused} refused alike, ${total.listed} listed ` +
    `(oracle gaps, Jinja2 agrees with convoy), ${total.failed} failed`);
process.exit(failures ? 1 : 0);
