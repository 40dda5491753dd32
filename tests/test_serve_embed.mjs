// test_serve_embed.mjs: `convoy serve --embeddings` driven by the official
// `openai` npm client's embeddings.create and the `ollama` client's embed;
// run by test_serve_embed.sh against a server without --embeddings, one
// machine and a 2-stage chain.
//
// Usage: node test_serve_embed.mjs BASE_URL on|off [SINGLE_BASE_URL]
// Checks (on): a string, a list (its vectors one per input, in order, each
// the string's own), token ids, and base64 (the same float32 bits as the
// floats); every vector has the model's width and norm 1, different texts
// differ; usage counts the prompt tokens (BOS included); Ollama's embed (a
// string, a list) and legacy /api/embeddings give the same vectors; an
// empty input is a 400; with SINGLE_BASE_URL (a chain's run) every vector
// equals the single machine's bit for bit. (off): every embedding route
// answers 501 naming --embeddings.
// Prints "ok   ..." / "FAIL ..." per check; exits 1 on any failure.
import OpenAI from 'openai';
import { Ollama } from 'ollama';
import { check, finish } from './checks.mjs';

const [base, mode, singleBase] = process.argv.slice(2);
const texts = ['Once upon a time', 'The dog ran to the big tree.', 'Lily liked to play in the park with her ball.'];
const N_EMBD = 64; /* stories260K's width */

const client = (url) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'none', maxRetries: 0 });

async function post(url, body) {
  const r = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
const f32 = (v) => Float32Array.from(v);
const sameBits = (a, b) => a.length === b.length && Buffer.compare(Buffer.from(f32(a).buffer),
  Buffer.from(f32(b).buffer)) === 0;

/* The vectors of every text, floats, from the server at url. */
async function vectors(url) {
  const r = await client(url).embeddings.create({ model: 'any', input: texts, encoding_format: 'float' });
  return r.data.map((d) => d.embedding);
}

async function openai(vecs) {
  const one = await client(base).embeddings.create({ model: 'stories260K', input: texts[0],
    encoding_format: 'float' });
  const e = one.data[0]?.embedding;
  check(one.object === 'list' && one.data.length === 1 && one.data[0].object === 'embedding' &&
    one.data[0].index === 0 && one.model === 'stories260K', 'a string: one embedding, the list shape', one);
  check(e.length === N_EMBD && Math.abs(norm(e) - 1) < 1e-5, 'its width is the model\'s, its norm 1', norm(e));
  check(one.usage.prompt_tokens >= 4 && one.usage.total_tokens === one.usage.prompt_tokens,
    'usage counts the prompt tokens', one.usage);
  check(vecs.length === 3 && vecs.every((v) => v.length === N_EMBD && Math.abs(norm(v) - 1) < 1e-5),
    'a list: one vector per input, each of norm 1', vecs.map(norm));
  check(sameBits(vecs[0], e), 'a list\'s first vector is the string\'s own', [vecs[0].slice(0, 3), e.slice(0, 3)]);
  check(!sameBits(vecs[0], vecs[1]) && !sameBits(vecs[1], vecs[2]), 'different texts give different vectors');
  const b64 = await client(base).embeddings.create({ model: 'x', input: texts });
  check(b64.data.every((d, i) => d.index === i && sameBits(d.embedding, vecs[i])),
    'base64 (the client\'s default): the same float32 bits as the floats');
  const raw = await post(`${base}/v1/embeddings`, { input: texts[1], encoding_format: 'base64' });
  const bytes = Buffer.from(raw.body.data[0].embedding, 'base64');
  check(bytes.length === 4 * N_EMBD && sameBits(Array.from(new Float32Array(bytes.buffer, bytes.byteOffset,
    N_EMBD)), vecs[1]), 'base64 by hand: little-endian float32', bytes.length);
  const tok = await post(`${base}/tokenize`, { content: texts[2], add_special: true });
  const ids = await client(base).embeddings.create({ model: 'x', input: [tok.body.tokens, tok.body.tokens],
    encoding_format: 'float' });
  check(ids.data.length === 2 && ids.data.every((d) => sameBits(d.embedding, vecs[2])),
    'lists of token ids: the text\'s vector (its ids with BOS)', tok.body);
  const oneIds = await post(`${base}/embeddings`, { input: tok.body.tokens });
  check(oneIds.status === 200 && sameBits(oneIds.body.data[0].embedding, vecs[2]), '/embeddings: a list of ids',
    oneIds.status);
}

async function ollama(vecs) {
  const o = new Ollama({ host: base });
  const one = await o.embed({ model: 'stories260K', input: texts[0] });
  check(one.embeddings.length === 1 && sameBits(one.embeddings[0], vecs[0]) && one.model === 'stories260K' &&
    one.prompt_eval_count > 0 && one.total_duration > 0, 'ollama embed: a string', one.prompt_eval_count);
  const all = await o.embed({ model: 'stories260K', input: texts });
  check(all.embeddings.length === 3 && all.embeddings.every((v, i) => sameBits(v, vecs[i])),
    'ollama embed: a list, in order');
  const legacy = await post(`${base}/api/embeddings`, { model: 'stories260K', prompt: texts[1] });
  check(legacy.status === 200 && sameBits(legacy.body.embedding, vecs[1]), 'ollama legacy /api/embeddings',
    legacy.status);
}

async function refusals() {
  const empty = await post(`${base}/v1/embeddings`, { input: '' });
  check(empty.status === 400 && /empty/.test(empty.body.error?.message), 'an empty text: 400', empty);
  const none = await post(`${base}/v1/embeddings`, { input: [] });
  check(none.status === 400 && /empty/.test(none.body.error?.message), 'an empty list: 400', none);
  let caught;
  try {
    await new Ollama({ host: base }).embed({ model: 'stories260K', input: [] });
  } catch (e) {
    caught = e;
  }
  check(caught?.status_code === 400 && /empty/.test(caught?.error), 'ollama: an empty list: 400', String(caught));
}

async function off() {
  for (const route of ['/v1/embeddings', '/embeddings', '/api/embed', '/api/embeddings']) {
    const r = await post(`${base}${route}`, { input: 'hi', prompt: 'hi' });
    const msg = r.body.error?.message ?? r.body.error;
    check(r.status === 501 && /--embeddings/.test(msg), `without --embeddings ${route} answers 501`, r);
  }
  let caught;
  try {
    await client(base).embeddings.create({ model: 'x', input: 'hi' });
  } catch (e) {
    caught = e;
  }
  check(caught?.status === 501, 'the openai client sees the 501', String(caught));
}

finish(async () => {
  if (mode === 'off') return off();
  const vecs = await vectors(base);
  await openai(vecs);
  await ollama(vecs);
  await refusals();
  if (singleBase) {
    const single = await vectors(singleBase);
    check(single.every((v, i) => sameBits(v, vecs[i])), 'the chain\'s vectors are the single machine\'s, bit for bit');
  }
});
