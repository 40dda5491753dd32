// test_serve_tool_calls.mjs: forced tool calls and tools on /v1/responses
// through the official openai client (run by test_serve_tool_calls.sh,
// which starts the servers and passes their URLs).
//
// Usage: node test_serve_tool_calls.mjs WHAT BASE_URL [CHAIN_BASE_URL | FAMILY]
// WHAT "forced": tool_choice "required" and a named function, whole and
//   streamed, each give exactly one call (parallel_tool_calls false) whose
//   name is right and whose arguments parse and validate (ajv) against the
//   schema (an enum, a number, a required string); a function not among the
//   tools is a 400 naming it; a forced call with response_format is a 400.
//   With CHAIN_BASE_URL (the same template on a 2-stage chain): the chain's
//   calls equal BASE_URL's.
// WHAT "responses": /v1/responses with a function tool, forced: a
//   function_call output item (call_id, name, valid arguments), streamed as
//   OpenAI's events (output_item.added, function_call_arguments.delta and
//   .done, output_item.done) adding up to the same call; a second turn with
//   the function_call and its function_call_output answers a message.
// WHAT "builtin" (BASE_URL serving a built-in family, named by the third
//   argument): a forced call, and a turn after a call and its tool result
//   answered.
// Prints "ok   ..." / "FAIL ..." per check; exits 1 on any failure.
import OpenAI from "openai";
import Ajv from "ajv";
import { check, finish } from "./checks.mjs";

const [what, base, chain] = process.argv.slice(2);
const client = (b) => new OpenAI({ baseURL: b, apiKey: "none", maxRetries: 0 });

const weather = {
  type: "object",
  properties: {
    city: { type: "string", maxLength: 24 },
    unit: { type: "string", enum: ["celsius", "fahrenheit"] },
    days: { type: "number" },
  },
  required: ["city", "unit"],
};
const clock = { type: "object", properties: { zone: { type: "string", maxLength: 12 } }, required: ["zone"] };
const schemas = { get_weather: weather, get_time: clock };
const tools = [
  { type: "function", function: { name: "get_weather", description: "The weather in a city", parameters: weather } },
  { type: "function", function: { name: "get_time", description: "The time in a zone", parameters: clock } },
];
const ajv = new Ajv();
const valid = (name, args) => {
  try {
    return name in schemas && ajv.validate(schemas[name], JSON.parse(args));
  } catch {
    return false;
  }
};
const messages = [{ role: "user", content: "What is the weather in Paris?" }];
const request = (tool_choice) => ({ model: "m", messages, tools, tool_choice, parallel_tool_calls: false,
  temperature: 0, max_tokens: 300 });
const choices = { required: "required", named: { type: "function", function: { name: "get_time" } } };

// The one call of an answer, as [name, arguments], or the answer itself when it holds not exactly one.
const oneCall = (c) => (c.finish_reason === "tool_calls" && c.message.tool_calls?.length === 1
  ? [c.message.tool_calls[0].function.name, c.message.tool_calls[0].function.arguments] : c);

async function streamed(b, tool_choice) {
  const s = await client(b).chat.completions.create({ ...request(tool_choice), stream: true });
  let name = "", args = "", finish = null, calls = 0;
  for await (const chunk of s) {
    const d = chunk.choices[0]?.delta;
    for (const t of d?.tool_calls ?? []) {
      if (t.id) calls++;
      name += t.function?.name ?? "";
      args += t.function?.arguments ?? "";
    }
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  return calls === 1 && finish === "tool_calls" ? [name, args] : { calls, finish, name, args };
}

async function forced() {
  for (const [kind, tc] of Object.entries(choices)) {
    const r = await client(base).chat.completions.create(request(tc));
    const call = oneCall(r.choices[0]);
    check(Array.isArray(call) && (kind === "required" || call[0] === "get_time") && valid(...call),
      `tool_choice ${kind}: one call of the right function with arguments valid for its schema`, call);
    const s = await streamed(base, tc);
    check(JSON.stringify(s) === JSON.stringify(call), `tool_choice ${kind} streamed: the same call`, [s, call]);
    if (!chain) continue;
    const c = oneCall((await client(chain).chat.completions.create(request(tc))).choices[0]);
    check(JSON.stringify(c) === JSON.stringify(call), `tool_choice ${kind}: the chain's call is one machine's`,
      [c, call]);
  }
  const bad = await client(base).chat.completions.create(request({ type: "function", function: { name: "nope" } }))
    .catch((e) => e);
  check(bad.status === 400 && /nope/.test(bad.message), "a named function not among the tools is a 400 naming it",
    bad.message);
  const both = await client(base).chat.completions.create({ ...request("required"),
    response_format: { type: "json_object" } }).catch((e) => e);
  check(both.status === 400 && both.param === "tool_choice", "a forced call with response_format is a 400",
    both.message);
}

const rtools = [{ type: "function", name: "get_weather", description: "The weather in a city", parameters: weather }];
const rrequest = { model: "m", input: "What is the weather in Paris?", tools: rtools, tool_choice: "required",
  parallel_tool_calls: false, temperature: 0, max_output_tokens: 300 };

async function responses() {
  const r = await client(base).responses.create(rrequest);
  const fc = r.output.find((o) => o.type === "function_call");
  check(r.status === "completed" && fc && /^call_/.test(fc.call_id) && fc.name === "get_weather" &&
    fc.status === "completed" && valid(fc.name, fc.arguments), "responses: a function_call item with valid arguments",
  r.output);
  const stream = await client(base).responses.create({ ...rrequest, stream: true });
  const types = [];
  let args = "", done = null, last = null;
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === "response.function_call_arguments.delta") args += ev.delta;
    if (ev.type === "response.output_item.done" && ev.item.type === "function_call") done = ev.item;
    last = ev;
  }
  const at = (t) => types.indexOf(t);
  check(at("response.output_item.added") < at("response.function_call_arguments.delta") &&
    at("response.function_call_arguments.delta") < at("response.function_call_arguments.done") &&
    at("response.function_call_arguments.done") < at("response.output_item.done") &&
    last?.type === "response.completed", "responses streamed: the function call's events in OpenAI's order", types);
  check(done && args === done.arguments && done.arguments === fc?.arguments && done.name === fc?.name &&
    JSON.stringify(last.response.output.map((o) => o.type)) === JSON.stringify(r.output.map((o) => o.type)),
  "responses streamed: the deltas add up to the same call", [args, done, fc]);
  const id = fc?.call_id ?? "call_1";
  const second = await client(base).responses.create({ model: "m", tools: rtools, temperature: 0,
    max_output_tokens: 16, input: [{ role: "user", content: "What is the weather in Paris?" },
      { type: "function_call", call_id: id, name: "get_weather", arguments: fc?.arguments ?? "{}" },
      { type: "function_call_output", call_id: id, output: "sunny, 24 degrees" }] });
  check(["completed", "incomplete"].includes(second.status) && second.output.length > 0,
    "responses: a second turn with function_call_output is answered", second);
}

async function builtin() {
  const r = await client(base).chat.completions.create(request("required"));
  const call = oneCall(r.choices[0]);
  check(Array.isArray(call) && valid(...call), `built-in ${chain}: a forced call with valid arguments`, call);
  const after = await client(base).chat.completions.create({ model: "m", tools, max_tokens: 8, temperature: 0,
    messages: [...messages, { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function",
      function: { name: "get_weather", arguments: "{\"city\": \"Paris\", \"unit\": \"celsius\"}" } }] },
    { role: "tool", tool_call_id: "call_1", content: "sunny" }] });
  check(["stop", "length", "tool_calls"].includes(after.choices[0].finish_reason),
    `built-in ${chain}: a turn after a call and its result is answered`, after.choices[0]);
}

await finish(async () => {
  if (what === "forced") await forced();
  else if (what === "responses") await responses();
  else await builtin();
});
