// test_serve.mjs: drives a running `convoy serve` (stories260K, ChatML)
// with the official `openai` npm client and with raw HTTP; run by
// test_serve.sh.
//
// Usage: node test_serve.mjs BASE_URL MODE RESULTS.json
//   MODE "local": the whole suite; writes each identity request's text
//   (run alone) to RESULTS.json.
//   MODE "chain": the server runs on a pipeline of nodes: the client basics,
//   and the identity requests alone and concurrently, which must also equal
//   the local server's texts in RESULTS.json.
// Prints "ok   ..." / "FAIL ..." per check; exits 1 on any failure.
import fs from 'node:fs';
import OpenAI from 'openai';
import { check, finish } from './checks.mjs';

const [base, mode, resultsPath] = process.argv.slice(2);
const model = 'stories260K';
const client = new OpenAI({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function raw(path, body, headers = {}) {
  const res = await fetch(base + path, {
    method: body === undefined ? 'GET' : 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body,
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, text, json, type: res.headers.get('content-type') };
}

async function metrics() {
  const r = await raw('/../metrics');
  const m = {};
  for (const line of r.text.split('\n')) {
    const k = line.match(/^([a-z_]+(?:\{[^}]*\})?) (\S+)$/);
    if (k) m[k[1]] = Number(k[2]);
  }
  return m;
}

// Runs one request and returns its text (streamed or not).
async function runOne(q) {
  const common = { model, max_tokens: q.max_tokens, temperature: q.temperature, seed: q.seed, stop: q.stop, ...q.extra };
  if (q.kind === 'completion') {
    if (!q.stream) return (await client.completions.create({ ...common, prompt: q.prompt })).choices[0].text;
    const s = await client.completions.create({ ...common, prompt: q.prompt, stream: true });
    let t = '';
    for await (const c of s) t += c.choices[0]?.text ?? '';
    return t;
  }
  const messages = [{ role: 'system', content: 'You tell short stories.' }, { role: 'user', content: q.prompt }];
  if (!q.stream) return (await client.chat.completions.create({ ...common, messages })).choices[0].message.content;
  const s = await client.chat.completions.create({ ...common, messages, stream: true });
  let t = '';
  for await (const c of s) t += c.choices[0]?.delta?.content ?? '';
  return t;
}

// Eight requests: greedy and seeded sampling, different prompts, both
// endpoints, streamed and not; two with a penalty window of the whole
// context (-1, and more than the context: a node must take it as one
// machine does).
const identity = [
  { kind: 'completion', stream: false, prompt: 'Once upon a time', temperature: 0, max_tokens: 60 },
  { kind: 'completion', stream: true, prompt: 'The little dog ran', temperature: 0.9, seed: 7, max_tokens: 80,
    extra: { repeat_penalty: 1.2, repeat_last_n: -1 } },
  { kind: 'chat', stream: false, prompt: 'Tell me about a cat.', temperature: 0, max_tokens: 50 },
  { kind: 'chat', stream: true, prompt: 'A story about the sea', temperature: 1.0, seed: 42, max_tokens: 70 },
  { kind: 'completion', stream: false, prompt: 'Lily and Tom went to the park. They saw a big tree and a bird. '.repeat(4),
    temperature: 0.8, seed: 3, max_tokens: 64 },
  { kind: 'completion', stream: true, prompt: 'Bob had a red ball', temperature: 0, max_tokens: 90,
    extra: { repeat_penalty: 1.3, repeat_last_n: 5000 } },
  { kind: 'chat', stream: false, prompt: 'Why is the sky blue?', temperature: 0.7, seed: 123456789, max_tokens: 40 },
  { kind: 'completion', stream: false, prompt: 'One day', temperature: 1.2, seed: 99, max_tokens: 100 },
];

function shuffled(n) {
  const order = [...Array(n).keys()];
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [order[i], order[j]] = [order[j], order[i]];
  }
  return order;
}

async function identitySuite(reference) {
  const alone = [];
  for (const q of identity) alone.push(await runOne(q));
  check(alone.every((t) => typeof t === 'string' && t.length > 0), 'identity requests give text alone');
  if (reference)
    check(alone.every((t, i) => t === reference[i]), 'each request alone on the chain = alone on one machine',
      alone.map((t, i) => [t === reference[i], t.slice(0, 40), reference[i].slice(0, 40)]));
  for (let round = 0; round < 2; round++) {
    const before = await metrics();
    const order = shuffled(identity.length);
    const got = new Array(identity.length);
    await Promise.all(order.map(async (i, k) => {
      await sleep(k);
      got[i] = await runOne(identity[i]);
    }));
    const shared = (await metrics())['convoy_steps_shared_total'] - before['convoy_steps_shared_total'];
    const same = got.map((t, i) => t === alone[i]);
    check(shared > 10, `the 8 requests ran batched together (${shared} steps shared)`, shared);
    check(same.every(Boolean), `8 concurrent requests (order ${order.join(',')}) = each alone`,
      got.map((t, i) => (same[i] ? 'same' : [t.slice(0, 60), alone[i].slice(0, 60)])));
  }
  return alone;
}

async function basics() {
  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === model, 'models.list names the model', models.data);

  const c = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 24, temperature: 0 });
  check(c.object === 'text_completion' && typeof c.choices[0].text === 'string' && c.choices[0].text.length > 0,
    'completion (non-streamed)', c);
  check(c.choices[0].finish_reason === 'length' && c.usage.completion_tokens === 24 && c.usage.prompt_tokens === 5 &&
    c.usage.total_tokens === 29, 'completion finish_reason and usage', c.usage);

  const s = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 24, temperature: 0,
    stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, chunks = 0;
  for await (const ch of s) {
    chunks++;
    if (ch.choices.length) {
      text += ch.choices[0].text;
      finish = ch.choices[0].finish_reason ?? finish;
    }
    if (ch.usage) usage = ch.usage;
  }
  check(chunks > 2 && text === c.choices[0].text, 'streamed completion = non-streamed', [text, chunks]);
  check(finish === 'length' && usage && usage.completion_tokens === 24, 'streamed completion: finish and usage chunk',
    [finish, usage]);

  // the prompt cache: the same chat again reuses all of its prompt but the last token, in the usage
  // as OpenAI reports it, streamed too; cache_prompt: false (llama-server's field) reuses none
  const cm = [{ role: 'user', content: 'Tell me about the moon and the three owls of the old forest.' }];
  const c1 = await client.chat.completions.create({ model, messages: cm, max_tokens: 8, temperature: 0 });
  const c2 = await client.chat.completions.create({ model, messages: cm, max_tokens: 8, temperature: 0 });
  check(c2.usage.prompt_tokens_details?.cached_tokens === c1.usage.prompt_tokens - 1 &&
    c2.choices[0].message.content === c1.choices[0].message.content,
  'the same chat again: cached_tokens is its prompt but the last token, the same answer', [c1.usage, c2.usage]);
  const c3 = await client.chat.completions.create({ model, messages: cm, max_tokens: 8, temperature: 0, stream: true,
    stream_options: { include_usage: true } });
  let u3 = null;
  for await (const ch of c3) if (ch.usage) u3 = ch.usage;
  check(u3?.prompt_tokens_details?.cached_tokens === c1.usage.prompt_tokens - 1, 'streamed usage: cached_tokens', u3);
  const c4 = await client.chat.completions.create({ model, messages: cm, max_tokens: 8, temperature: 0,
    cache_prompt: false });
  check(c4.usage.prompt_tokens_details?.cached_tokens === 0 && c4.choices[0].message.content === c1.choices[0].message.content,
    'cache_prompt: false reuses nothing, the same answer', c4.usage);

  const messages = [{ role: 'user', content: 'Hello! Tell me a story.' }];
  const cc = await client.chat.completions.create({ model, messages, max_tokens: 30, temperature: 0 });
  check(cc.object === 'chat.completion' && cc.choices[0].message.role === 'assistant' &&
    cc.choices[0].message.content.length > 0 && cc.usage.completion_tokens > 0, 'chat completion (non-streamed)', cc);
  const cs = await client.chat.completions.create({ model, messages, max_tokens: 30, temperature: 0, stream: true });
  let ctext = '', role = null, cfinish = null;
  for await (const ch of cs) {
    role = ch.choices[0]?.delta?.role ?? role;
    ctext += ch.choices[0]?.delta?.content ?? '';
    cfinish = ch.choices[0]?.finish_reason ?? cfinish;
  }
  check(role === 'assistant' && ctext === cc.choices[0].message.content && cfinish === cc.choices[0].finish_reason,
    'streamed chat completion = non-streamed', [ctext, role, cfinish]);
  return c.choices[0].text;
}

async function parameters(greedyText) {
  // a stop string cuts the text right before it
  const cut = greedyText.indexOf(' ', 8);
  const stopAt = greedyText.slice(cut, cut + 4);
  const st = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 24, temperature: 0,
    stop: ['zzzz', stopAt] });
  check(st.choices[0].text === greedyText.slice(0, greedyText.indexOf(stopAt)) && st.choices[0].finish_reason === 'stop',
    'stop string ends the text before it', [stopAt, st.choices[0].text]);
  const sst = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 24, temperature: 0,
    stop: stopAt, stream: true });
  let stext = '', sfinish = null;
  for await (const ch of sst) { stext += ch.choices[0].text; sfinish = ch.choices[0].finish_reason ?? sfinish; }
  check(stext === st.choices[0].text && sfinish === 'stop', 'streamed stop string', [stext, sfinish]);

  // seeds
  const p = { model, prompt: 'The cat', max_tokens: 40, temperature: 1.0, top_p: 0.95 };
  const a = await client.completions.create({ ...p, seed: 5 });
  const b = await client.completions.create({ ...p, seed: 5 });
  const d = await client.completions.create({ ...p, seed: 6 });
  check(a.choices[0].text === b.choices[0].text, 'the same seed gives the same text');
  check(a.choices[0].text !== d.choices[0].text, 'another seed gives another text');
  const pen = await client.completions.create({ ...p, seed: 5, presence_penalty: 1.5, frequency_penalty: 1.5 });
  check(pen.choices[0].text !== a.choices[0].text, 'presence/frequency penalties change the text');

  // logprobs
  const lp = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 5, temperature: 0,
    logprobs: 2 });
  const L = lp.choices[0].logprobs;
  check(L && L.tokens.length === 5 && L.token_logprobs.every((x) => x <= 0) && L.top_logprobs.length === 5 &&
    L.tokens.join('') === lp.choices[0].text && Object.keys(L.top_logprobs[0]).length === 2 &&
    Math.abs(Math.max(...Object.values(L.top_logprobs[0])) - L.token_logprobs[0]) < 1e-6,
  'completion logprobs (greedy token on top)', L);
  const clp = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4,
    temperature: 0, logprobs: true, top_logprobs: 3 });
  const C = clp.choices[0].logprobs?.content;
  check(C && C.length === 4 && C.every((t) => t.top_logprobs.length === 3 && t.logprob <= 0 && Array.isArray(t.bytes)),
    'chat logprobs', C);
}

async function badRequests() {
  const expect = (r, status, what, test = () => true) =>
    check(r.status === status && r.json?.error && typeof r.json.error.message === 'string' &&
      typeof r.json.error.type === 'string' && 'param' in r.json.error && 'code' in r.json.error && test(r.json.error),
    `${what}: ${status} with an OpenAI error`, [r.status, r.text.slice(0, 300)]);
  const body = (o) => JSON.stringify({ model, prompt: 'Hi', max_tokens: 4, ...o });
  expect(await raw('/completions', '{"model": "stories260K", "prompt": '), 400, 'malformed JSON',
    (e) => /JSON/.test(e.message));
  expect(await raw('/completions', '[1,2]'), 400, 'a body that is not an object');
  expect(await raw('/completions', body({ temperature: 'hot' })), 400, 'wrong type', (e) => e.param === 'temperature');
  expect(await raw('/completions', body({ max_tokens: '4' })), 400, 'max_tokens as a string',
    (e) => e.param === 'max_tokens');
  const other = await raw('/completions', body({ model: 'gpt-4' }));
  check(other.status === 200 && other.json?.model === model, 'another model name is served as this model', other.text);
  expect(await raw('/completions', body({ max_tokens: 0 })), 400, 'max_tokens 0', (e) => e.param === 'max_tokens');
  expect(await raw('/completions', body({ max_tokens: 100000 })), 400, 'max_tokens past the context',
    (e) => e.param === 'max_tokens');
  expect(await raw('/completions', body({ prompt: 'one two three '.repeat(1000) })), 400, 'prompt longer than the context',
    (e) => e.code === 'context_length_exceeded');
  expect(await raw('/completions', body({ temperature: 5 })), 400, 'temperature out of range');
  expect(await raw('/completions', body({ n: 17 })), 400, 'n > 16');
  expect(await raw('/completions', body({ stop: [1] })), 400, 'stop of the wrong type', (e) => e.param === 'stop');
  expect(await raw('/chat/completions', JSON.stringify({ model, messages: [] })), 400, 'empty messages');
  expect(await raw('/chat/completions', JSON.stringify({ model, messages: [{ role: 'wizard', content: 'x' }] })), 400,
    'unknown role');
  expect(await raw('/completions', body({ stream_options: { include_usage: true } })), 400,
    'stream_options without stream');
  const big = body({ prompt: 'x'.repeat(2 * 1024 * 1024) });
  expect(await raw('/completions', big), 413, 'a 2 MiB body', (e) => e.code === 'request_too_large');
  expect(await raw('/nowhere', '{}'), 404, 'unknown route');
  expect(await raw('/completions'), 405, 'GET on a POST route');
  let status = 0;
  try {
    await client.completions.create({ model, prompt: 'Hi', max_tokens: -1 });
  } catch (e) {
    status = e.status;
  }
  check(status === 400, 'the openai client raises a 400 for a bad request', status);
  const h = await raw('/../health');
  check(h.status === 200 && h.json?.status === 'ok', '/health');
}

async function queueFull() {
  // 4 slots and a queue of 4: 16 simultaneous long requests, some refused
  const req = body => raw('/completions', JSON.stringify(body));
  const rs = await Promise.all([...Array(16).keys()].map((i) =>
    req({ model, prompt: `Story ${i}`, max_tokens: 1500, temperature: 0, ignore_eos: true })));
  const ok = rs.filter((r) => r.status === 200).length;
  const full = rs.filter((r) => r.status === 503 && r.json?.error?.code === 'queue_full').length;
  check(ok >= 8 && full >= 1 && ok + full === 16, 'a full queue answers 503 (queue_full)', [ok, full]);
}

async function disconnect() {
  const before = await metrics();
  const controller = new AbortController();
  const s = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 2000, temperature: 0,
    stream: true, ignore_eos: true }, { signal: controller.signal });
  let n = 0;
  try {
    for await (const ch of s) {
      if (++n === 2) controller.abort();
    }
  } catch { /* aborted */ }
  let after = {};
  for (let i = 0; i < 100; i++) {
    await sleep(50);
    after = await metrics();
    if (after['convoy_active_slots'] === 0) break;
  }
  const key = 'convoy_generations_total{reason="cancelled"}';
  check(after[key] === (before[key] ?? 0) + 1 && after['convoy_active_slots'] === 0,
    'a client that disconnects cancels its request and frees its slot', [before[key], after[key],
      after['convoy_active_slots']]);
  const c = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 8, temperature: 0 });
  check(c.choices[0].text.length > 0, 'a request after the disconnect runs');
  check(after['convoy_generated_tokens_total'] > 0 && after['convoy_prompt_tokens_total'] > 0 &&
    'convoy_tokens_per_second' in after && after['convoy_queue_length'] === 0 &&
    after['convoy_requests_total{route="/v1/completions",code="200"}'] > 0, '/metrics counts', after);
}

await finish(async () => {
  if (mode === 'local') {
    const greedy = await basics();
    await parameters(greedy);
    await badRequests();
    const alone = await identitySuite(null);
    fs.writeFileSync(resultsPath, JSON.stringify(alone));
    await queueFull();
    await disconnect();
  } else {
    await basics();
    const reference = JSON.parse(fs.readFileSync(resultsPath, 'utf8'));
    await identitySuite(reference);
    await disconnect();
  }
});
