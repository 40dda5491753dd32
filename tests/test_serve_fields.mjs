// test_serve_fields.mjs: n, logit_bias, echo, suffix, /completion and
// /infill against one server (argv[2]); with a second URL (argv[3], one
// machine) every text must also equal that server's.
// 1. n = 3 at temperature 1: three choices, choice i the text of a single
//    request with seed + i; the prompt runs once (every choice takes all
//    but its last token from the cache); streamed, each index's deltas add
//    up to the same texts, and the usage comes once.
// 2. logit_bias: +100 on a token makes greedy output that token over and
//    over; false on it and +100 on another gives the other; an id outside
//    the vocabulary is a 400 naming logit_bias.
// 3. echo: the answer starts with the prompt; with logprobs a 400.
// 4. Fill-in-the-middle: a completion's suffix, /infill and Ollama's
//    generate with a suffix give the text of the prompt built by hand from
//    the model's FIM tokens; /completion's content (whole and streamed) is
//    /v1/completions' text.
import OpenAI from "openai";
import { check, finish } from "./checks.mjs";

const [base, single] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "none", maxRetries: 0 });
const seen = {};

async function post(path, body, url = base) {
  const r = await fetch(`${url}${path}`, { method: "POST", body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}
// The single machine's answer must equal this one's.
async function same(name, value, path, body, pick) {
  seen[name] = value;
  if (single) {
    const other = pick((await post(path, body, single)).body);
    check(JSON.stringify(other) === JSON.stringify(value), `${name}: the chain's equals one machine's`, [value, other]);
  }
}
const tokenize = async (content, special) =>
  (await post("/tokenize", { content, add_special: false, parse_special: special })).body.tokens;
const detokenize = async (tokens) => (await post("/detokenize", { tokens })).body.content;

async function choices() {
  const messages = [{ role: "user", content: "Tell me a story." }];
  const body = { model: "m", messages, n: 3, temperature: 1, seed: 11, max_tokens: 16 };
  const r = await client.chat.completions.create(body);
  const texts = r.choices.map((c) => c.message.content);
  check(r.choices.length === 3 && r.choices.every((c, i) => c.index === i), "n = 3: three choices, indexed", r);
  const each = [];
  for (let i = 0; i < 3; i++) {
    const one = await client.chat.completions.create({ ...body, n: 1, seed: 11 + i });
    check(one.choices[0].message.content === texts[i], `n = 3: choice ${i} is seed ${11 + i}'s text`,
          [texts[i], one.choices[0].message.content]);
    each.push(one.usage.completion_tokens);
  }
  check(new Set(texts).size > 1, "n = 3: the choices differ", texts);
  const u = r.usage;
  check(u.completion_tokens === each[0] + each[1] + each[2], "n = 3: the usage sums the choices'", [u, each]);
  check(u.prompt_tokens_details.cached_tokens === u.prompt_tokens - 1, "n = 3: the prompt ran once", u);
  const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  const got = ["", "", ""];
  let usages = 0;
  for await (const chunk of stream) {
    for (const c of chunk.choices) got[c.index] += c.delta.content ?? "";
    if (chunk.usage) usages++;
  }
  check(JSON.stringify(got) === JSON.stringify(texts), "n = 3 streamed: each index adds up to its text", [got, texts]);
  check(usages === 1, "n = 3 streamed: one usage chunk", usages);
  await same("n", texts, "/v1/chat/completions", body, (b) => b.choices.map((c) => c.message.content));
}

async function logitBias() {
  const [x] = await tokenize(" dog", false), [y] = await tokenize(" cat", false);
  const body = { model: "m", prompt: "Once upon a time", temperature: 0, max_tokens: 4 };
  const forced = await client.completions.create({ ...body, logit_bias: { [x]: 100 } });
  check(forced.choices[0].text === (await detokenize([x, x, x, x])), "logit_bias +100: that token, four times",
        forced.choices[0].text);
  const other = await client.completions.create({ ...body, logit_bias: { [x]: 100, [y]: 100 } });
  const banned = await post("/v1/completions", { ...body, logit_bias: [[x, false], [y, 100]] });
  check(banned.body.choices[0].text === (await detokenize([y, y, y, y])), "logit_bias false bans, +100 forces",
        banned.body);
  check(other.choices[0].text !== banned.body.choices[0].text || x === y, "logit_bias: the ban changes the text");
  const bad = await post("/v1/completions", { ...body, logit_bias: { 99999: 1 } });
  check(bad.status === 400 && bad.body.error.param === "logit_bias", "logit_bias: an unknown id is a 400", bad);
  await same("bias", banned.body.choices[0].text, "/v1/completions", { ...body, logit_bias: [[x, false], [y, 100]] },
             (b) => b.choices[0].text);
}

async function echo() {
  const body = { model: "m", prompt: "The cat sat", temperature: 0, max_tokens: 5 };
  const plain = await client.completions.create(body);
  const echoed = await client.completions.create({ ...body, echo: true });
  check(echoed.choices[0].text === body.prompt + plain.choices[0].text, "echo: the prompt, then the text", echoed);
  const bad = await post("/v1/completions", { ...body, echo: true, logprobs: 1 });
  check(bad.status === 400 && bad.body.error.param === "echo", "echo with logprobs: a 400 naming echo", bad.body);
}

async function fim() {
  const prefix = "def add(a, b):", suffix = "    return c";
  const [pre] = await tokenize("<|fim_prefix|>", true), [suf] = await tokenize("<|fim_suffix|>", true);
  const [mid] = await tokenize("<|fim_middle|>", true);
  const ids = [1, pre, ...(await tokenize(prefix, false)), suf, ...(await tokenize(suffix, false)), mid];
  const opts = { model: "m", temperature: 0, max_tokens: 8 };
  const byHand = (await client.completions.create({ ...opts, prompt: ids })).choices[0].text;
  const viaSuffix = (await client.completions.create({ ...opts, prompt: prefix, suffix })).choices[0].text;
  check(viaSuffix === byHand, "suffix: the FIM prompt of the model's tokens", [viaSuffix, byHand]);
  const infill = await post("/infill", { input_prefix: prefix, input_suffix: suffix, n_predict: 8, temperature: 0 });
  check(infill.status === 200 && infill.body.content === byHand && infill.body.stop === true,
        "/infill: the same continuation", infill.body);
  const gen = await post("/api/generate", { model: "m", prompt: prefix, suffix, stream: false,
                                             options: { temperature: 0, num_predict: 8 } });
  check(gen.body.response === byHand, "Ollama generate with a suffix: the same", gen.body);
  await same("infill", infill.body.content, "/infill",
             { input_prefix: prefix, input_suffix: suffix, n_predict: 8, temperature: 0 }, (b) => b.content);
}

async function native() {
  const body = { prompt: "Once upon a time", n_predict: 10, temperature: 0.8, seed: 3 };
  const v1 = await client.completions.create({ model: "m", prompt: body.prompt, max_tokens: 10, temperature: 0.8,
                                               seed: 3 });
  const want = v1.choices[0].text;
  const whole = await post("/completion", body);
  check(whole.body.content === want && whole.body.tokens_predicted === v1.usage.completion_tokens &&
        whole.body.stop_type === (v1.choices[0].finish_reason === "length" ? "limit" : "eos"),
        "/completion: /v1/completions' text, its counts", [whole.body, v1]);
  const r = await fetch(`${base}/completion`, { method: "POST", body: JSON.stringify({ ...body, stream: true }) });
  const events = (await r.text()).split("\n\n").filter((e) => e.startsWith("data: ")).map((e) => JSON.parse(e.slice(6)));
  check(events.map((e) => e.content).join("") === want && events.at(-1).stop === true,
        "/completion streamed: the same text, stop in the last event", events);
  const greedy = { prompt: "Once upon a time", n_predict: 24, temperature: 0 };
  const free = await post("/completion", greedy);
  const word = (free.body.content.match(/[a-z]{2,}/) ?? [""])[0]; /* a word the model writes */
  const cut = word ? free.body.content.indexOf(word) : -1;
  const stopped = await post("/completion", { ...greedy, stop: [word, "never said"] });
  check(whole.body.stopping_word === "" && cut > 0 && stopped.body.content === free.body.content.slice(0, cut) &&
        stopped.body.stop_type === "word" && stopped.body.stopping_word === word,
        "/completion: a stop string gives stop_type word and its stopping_word, as llama-server", [free.body,
        stopped.body]);
}

await finish(async () => {
  await choices();
  await logitBias();
  await echo();
  await fim();
  await native();
});
