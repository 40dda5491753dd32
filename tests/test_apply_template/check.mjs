// check.mjs: the comparison of test_apply_template.sh. For every template
// of a folder, `convoy serve --chat-template FILE` (on any free port) is
// asked for the prompt it feeds the model for every conversation of
// test_jinja's conversations.json (POST /apply-template, which renders as
// the chat routes do: tools, add_generation_prompt and
// chat_template_kwargs included), and the answer is compared byte for byte
// with `convoy render-template` given the same request and the model's BOS
// and EOS texts (from /props; --requests renders them all in one run). Both render today's date. A case passes
// when the texts are equal, or when both refuse (the server with a 400, or
// by not starting with a template it cannot parse). Exit status 1 on a
// failure, 2 on a usage error.
//
// Usage: node check.mjs CONVOY MODEL TEMPLATES_DIR CONVERSATIONS.json WORK_DIR
import { spawn } from "node:child_process";
import { availableParallelism } from "node:os";
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";

const [convoy, model, templatesDir, convPath, work] = process.argv.slice(2);
if (!work) {
    console.error("usage: node check.mjs CONVOY MODEL TEMPLATES_DIR CONVERSATIONS.json WORK_DIR");
    process.exit(2);
}
const conversations = JSON.parse(readFileSync(convPath, "utf8")).conversations;
const reqsPath = path.join(work, "requests.json");
writeFileSync(reqsPath, JSON.stringify(conversations.map((c) => c.request)));

// The server with template file, resolved to its base URL once it listens,
// or to null when it exits first (its log then says why).
function startServer(file, log) {
    const args = ["serve", "-m", model, "--port", "0", "-np", "1", "--chat-template", file];
    const proc = spawn(convoy, args, { stdio: ["ignore", "ignore", "pipe"] });
    return new Promise((resolve) => {
        let text = "";
        proc.stderr.on("data", (d) => {
            text += d;
            const m = /listening on (http:\/\/[0-9.]+:[0-9]+)\/v1/.exec(text);
            if (m) resolve({ proc, url: m[1] });
        });
        proc.on("exit", () => {
            log.push(text);
            resolve({ proc: null, url: null });
        });
    });
}

// render-template's answer for every conversation: [{ok, text | err}].
function renderTemplate(file, bos, eos) {
    const args = ["render-template", "--template", file, "--requests", reqsPath, "--bos", bos, "--eos", eos];
    return new Promise((resolve) => {
        const p = spawn(convoy, args), out = [], err = [];
        p.stdout.on("data", (d) => out.push(d));
        p.stderr.on("data", (d) => err.push(d));
        p.on("close", (code) => {
            const why = Buffer.concat(err).toString("utf8").trim();
            if (code !== 0) return resolve(conversations.map(() => ({ ok: false, err: why })));
            resolve(JSON.parse(Buffer.concat(out).toString("utf8")).map((a) =>
                "prompt" in a ? { ok: true, text: a.prompt } : { ok: false, err: a.error }));
        });
    });
}

async function applyTemplate(url, body) {
    const r = await fetch(`${url}/apply-template`, { method: "POST", body: JSON.stringify(body),
        headers: { "content-type": "application/json" } });
    const j = await r.json();
    return r.status === 200 ? { ok: true, text: j.prompt } : { ok: false, err: j.error?.message ?? `HTTP ${r.status}` };
}

let passed = 0, failed = 0;
function verdict(name, server, cli) {
    if (server.ok && cli.ok && server.text === cli.text) return passed++;
    if (!server.ok && !cli.ok) return passed++;
    failed++;
    console.log(`FAIL ${name}\n  server: ${server.ok ? JSON.stringify(server.text) : "refused: " + server.err}` +
        `\n  render-template: ${cli.ok ? JSON.stringify(cli.text) : "refused: " + cli.err}`);
}

async function checkTemplate(name) {
    const file = path.join(templatesDir, name), log = [];
    const { proc, url } = await startServer(file, log);
    let bos = "", eos = "";
    if (url) ({ bos_token: bos, eos_token: eos } = await (await fetch(`${url}/props`)).json());
    const cli = await renderTemplate(file, bos, eos);
    const width = availableParallelism();
    for (let i = 0; i < conversations.length; i += width) {
        await Promise.all(conversations.slice(i, i + width).map(async (c, k) => {
            const server = url ? await applyTemplate(url, c.request) : { ok: false, err: `no server: ${log[0]}` };
            verdict(`${name} / ${c.name}`, server, cli[i + k]);
        }));
    }
    if (proc) {
        const gone = new Promise((resolve) => proc.on("exit", resolve));
        proc.kill("SIGTERM");
        await gone;
    }
}

for (const name of readdirSync(templatesDir).filter((f) => f.endsWith(".jinja")).sort())
    await checkTemplate(name);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
