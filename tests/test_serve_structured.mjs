// test_serve_structured.mjs: structured output and tool calls through the
// official openai client (run by test_serve_structured.sh, which starts the
// servers and passes their URLs).
//
// 1. response_format json_schema on stories260K, 50 seeds at temperature 1,
//    4 requests at a time: every answer parses and validates (ajv), finishes
//    with "stop", and is the very text the 2-stage chain gives for that seed.
//    The schema holds a pattern (serve/regex.h). json_object gives an object;
//    a bad schema, pattern or grammar is a 400 naming it.
// 2. Canned outputs: llama-server's `grammar` field holds the model to one
//    text, a tool call as Hermes/Qwen, Mistral and Llama 3.x write them (each
//    server has that model's real chat template); the client gets the call in
//    message.tool_calls with finish_reason "tool_calls", and streamed as
//    tool_calls deltas that add up to the same call.
// 3. Thinking: a canned "<think>...</think>" answer comes back with the
//    block in message.reasoning_content and the rest in content (Qwen3's
//    template, one machine and the 2-stage chain), streamed as
//    reasoning_content deltas then content deltas that add up to the same;
//    reasoning_format "none" keeps it all in content; with DeepSeek-R1's
//    template and chat_template_kwargs {enable_thinking: true} the prompt
//    opens the block (/apply-template shows it), so an answer without
//    "<think>" still has its reasoning apart.
import OpenAI from "openai";
import Ajv from "ajv";
import { check, finish } from "./checks.mjs";

const [one, chain, hermes, mistral, llama3, qwen3, r1] = process.argv.slice(2);
const client = (base) => new OpenAI({ baseURL: base, apiKey: "none", maxRetries: 0 });

const schema = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 12 },
    age: { type: "integer", minimum: 0, maximum: 120 },
    pets: { type: "array", items: { type: "string", enum: ["cat", "dog", "fish"] }, maxItems: 3 },
    mood: { enum: ["happy", "sad", null] },
    happy: { type: "boolean" },
    code: { type: "string", pattern: "^[A-Z]{2}-\\d{3}$" },
  },
  required: ["name", "age", "pets", "happy", "code"],
  additionalProperties: false,
};
const validate = new Ajv().compile(schema);

async function person(base, seed) {
  const r = await client(base).chat.completions.create({
    model: "stories260K",
    messages: [{ role: "user", content: "Tell me about a girl and her pets." }],
    response_format: { type: "json_schema", json_schema: { name: "person", schema, strict: true } },
    temperature: 1,
    seed,
    max_tokens: 200,
  });
  return r.choices[0];
}

async function schemas() {
  const seeds = Array.from({ length: 50 }, (_, i) => 1000 + i);
  const results = { one: [], chain: [] };
  for (let i = 0; i < seeds.length; i += 4) {
    const group = seeds.slice(i, i + 4);
    const [a, b] = await Promise.all([
      Promise.all(group.map((s) => person(one, s))),
      Promise.all(group.map((s) => person(chain, s))),
    ]);
    results.one.push(...a);
    results.chain.push(...b);
  }
  let valid = 0, same = 0, stopped = 0;
  const texts = new Set();
  for (let i = 0; i < seeds.length; i++) {
    const text = results.one[i].message.content;
    texts.add(text);
    try {
      if (validate(JSON.parse(text))) valid++;
      else console.log(`seed ${seeds[i]}: ${text}: ${JSON.stringify(validate.errors)}`);
    } catch (e) {
      console.log(`seed ${seeds[i]}: not JSON: ${text}`);
    }
    if (results.one[i].finish_reason === "stop") stopped++;
    if (results.chain[i].message.content === text) same++;
    else console.log(`seed ${seeds[i]}: one machine ${text}, chain ${results.chain[i].message.content}`);
  }
  check(valid === seeds.length, `json_schema: ${valid} of ${seeds.length} answers parse and validate`);
  check(stopped === seeds.length, `json_schema: ${stopped} of ${seeds.length} end by themselves (finish_reason stop)`);
  check(same === seeds.length, `json_schema: ${same} of ${seeds.length} are the 2-stage chain's text`);
  check(texts.size > 10, `json_schema: ${texts.size} different answers (the seeds matter)`);
  console.log(`example: ${results.one[0].message.content}`);

  const obj = await client(one).chat.completions.create({
    model: "stories260K",
    messages: [{ role: "user", content: "JSON please" }],
    response_format: { type: "json_object" },
    seed: 3,
    max_tokens: 400,
  });
  const text = obj.choices[0].message.content;
  let parsed = null;
  try { parsed = JSON.parse(text); } catch { /* checked below */ }
  // any object: its strings are unbounded, so a small model may be cut by max_tokens
  check(text.startsWith("{") &&
          (obj.choices[0].finish_reason !== "stop" || (parsed && typeof parsed === "object" && !Array.isArray(parsed))),
        `json_object: an object, or one cut by max_tokens (${obj.choices[0].finish_reason}: ${text.slice(0, 80)})`);

  for (const [what, extra, param, says] of [
    ["a schema keyword not supported", { response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "string", pattern: "^a", foo: 1 } } } }, "response_format", "foo"],
    ["a lookahead in a pattern",
      { response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "string", pattern: "^(?=a)" } } } },
      "response_format", "lookahead (?= is not supported"],
    ["a grammar without root", { grammar: 'start ::= "a"' }, "grammar", "root"],
  ]) {
    try {
      await client(one).chat.completions.create({ model: "m", messages: [{ role: "user", content: "x" }], ...extra });
      check(false, `${what}: refused`);
    } catch (e) {
      check(e.status === 400 && e.param === param && e.message.includes(says), `${what}: 400 on ${param}: ${e.message}`);
    }
  }
}

// A GBNF grammar whose only sentence is text.
const only = (text) => `root ::= ${JSON.stringify(text)}`;

const call = { name: "get_weather", arguments: { city: "Paris" } };
const tools = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "The weather in a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
}];

async function toolCalls(name, base, canned) {
  const body = {
    model: "stories260K",
    messages: [{ role: "user", content: "Weather in Paris?" }],
    tools,
    grammar: only(canned),
    max_tokens: 100,
  };
  const r = await client(base).chat.completions.create(body);
  const c = r.choices[0];
  const got = c.message.tool_calls?.[0];
  check(c.finish_reason === "tool_calls" && c.message.tool_calls?.length === 1 && got.type === "function" &&
          got.function.name === call.name && JSON.stringify(JSON.parse(got.function.arguments)) === JSON.stringify(call.arguments) &&
          /^call_/.test(got.id),
        `${name}: tool_calls parsed from ${JSON.stringify(canned)}: ${JSON.stringify(c.message)}`);

  const stream = await client(base).chat.completions.create({ ...body, stream: true });
  const calls = [];
  let finish_reason = null, content = "";
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta ?? {};
    content += d.content ?? "";
    for (const t of d.tool_calls ?? []) {
      calls[t.index] ??= { id: "", name: "", arguments: "" };
      calls[t.index].id += t.id ?? "";
      calls[t.index].name += t.function?.name ?? "";
      calls[t.index].arguments += t.function?.arguments ?? "";
    }
    finish_reason = chunk.choices[0]?.finish_reason ?? finish_reason;
  }
  check(finish_reason === "tool_calls" && calls.length === 1 && calls[0].name === call.name &&
          JSON.stringify(JSON.parse(calls[0].arguments)) === JSON.stringify(call.arguments) && content.trim() === "",
        `${name}: streamed tool_calls deltas add up to the call (${JSON.stringify(calls)}, content ${JSON.stringify(content)})`);
}

// The answer to a request held to canned, whole and streamed: {reasoning, content}.
async function thought(base, canned, extra = {}) {
  const body = { model: "m", messages: [{ role: "user", content: "Why?" }], grammar: only(canned), max_tokens: 100,
    ...extra };
  const m = (await client(base).chat.completions.create(body)).choices[0].message;
  let reasoning = "", content = "", order = "";
  for await (const chunk of await client(base).chat.completions.create({ ...body, stream: true })) {
    const d = chunk.choices[0]?.delta ?? {};
    if (d.reasoning_content) order += order.endsWith("r") ? "" : "r";
    if (d.content) order += order.endsWith("c") ? "" : "c";
    reasoning += d.reasoning_content ?? "";
    content += d.content ?? "";
  }
  return { whole: { reasoning: m.reasoning_content, content: m.content }, streamed: { reasoning, content }, order };
}

async function thinking() {
  const canned = "<think>\nOnce upon a time\n</think>\n\nThe end";
  for (const [name, base] of [["one machine", one], ["2-stage chain", chain]]) {
    const t = await thought(base, canned, {});
    check(t.whole.reasoning === "Once upon a time" && t.whole.content === "The end",
          `${name}: <think> block in reasoning_content, the rest in content`, t.whole);
    check(t.streamed.reasoning === "Once upon a time" && t.streamed.content === "The end" && t.order === "rc",
          `${name}: streamed as reasoning_content deltas, then content deltas`, t);
  }
  const none = await thought(qwen3, canned, { reasoning_format: "none" });
  check(none.whole.content === canned && none.whole.reasoning === undefined && none.streamed.content === canned,
        "reasoning_format none: the block stays in content", none);
  const kwargs = { chat_template_kwargs: { enable_thinking: true } };
  const prompt = await (await fetch(r1.replace(/\/v1$/, "/apply-template"), { method: "POST",
    body: JSON.stringify({ messages: [{ role: "user", content: "Why?" }], ...kwargs }) })).json();
  check(prompt.prompt?.endsWith("<\uff5cAssistant\uff5c><think>\n"), "R1: chat_template_kwargs reach the template",
        prompt);
  const open = await thought(r1, "Because.\n</think>\n\nSo.", kwargs);
  check(open.whole.reasoning === "Because." && open.whole.content === "So." &&
          open.streamed.reasoning === "Because." && open.streamed.content === "So.",
        "R1: a block the prompt opened is reasoning up to </think>", open);
}

await finish(async () => {
  await schemas();
  await toolCalls("Hermes/Qwen", hermes, `<tool_call>\n${JSON.stringify(call)}\n</tool_call>`);
  await toolCalls("Mistral", mistral, `[TOOL_CALLS]${JSON.stringify([call])}`);
  await toolCalls("Llama 3.x", llama3, JSON.stringify({ name: call.name, parameters: call.arguments }));
  await thinking();
});
