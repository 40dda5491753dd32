// test_serve_ollama.mjs: `convoy serve`'s Ollama API driven by the `ollama`
// npm client, as Open WebUI, Continue and editors use it; run by
// test_serve_ollama.sh against one machine and a 2-stage chain.
//
// Usage: node test_serve_ollama.mjs BASE_URL MODEL_FILE_BYTES [SINGLE_BASE_URL]
// Checks: version; list (the model's name, family, format, size) and ps;
// show (model_info, template, capabilities); chat greedy, not streamed and
// streamed (the same text, the last part with done, done_reason and the
// counts), and its text equals /v1/chat/completions' for the same request;
// generate with the template (= that chat) and raw (= /v1/completions),
// streamed and not; format "json"; an empty prompt only loads; images and
// a bad format are refused with Ollama's {"error"} (ResponseError, 400),
// unknown routes too (404); with SINGLE_BASE_URL (a chain's run), every
// greedy text equals the single machine's.
// Prints "ok   ..." / "FAIL ..." per check; exits 1 on any failure.
import { Ollama } from 'ollama';
import { check, finish } from './checks.mjs';

const [base, fileBytes, singleBase] = process.argv.slice(2);
const ollama = new Ollama({ host: base });
const greedy = { temperature: 0, num_predict: 24, seed: 7 };
const messages = [{ role: 'user', content: 'Once upon a time' }];
const texts = {};

async function post(url, body) {
  const r = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body) });
  return r.json();
}

async function models() {
  const v = await ollama.version();
  check(/^\d+\.\d+\.\d+$/.test(v.version), 'version: a version number', v);
  const list = await ollama.list();
  const m = list.models?.[0];
  check(list.models.length === 1 && m.name === 'stories260K' && m.model === m.name, 'list: the one model by name',
    list);
  check(m.details.family === 'llama' && m.details.format === 'gguf' && m.size === Number(fileBytes) &&
    /^[0-9a-f]{64}$/.test(m.digest) && /^\d/.test(m.details.parameter_size) && m.modified_at,
    'list: family, format, size, digest, parameter size', m);
  const ps = await ollama.ps();
  check(ps.models.length === 1 && ps.models[0].name === 'stories260K' && ps.models[0].expires_at,
    'ps: the model is loaded', ps);
  const show = await ollama.show({ model: 'stories260K' });
  check(show.model_info['general.architecture'] === 'llama' && show.model_info['llama.block_count'] === 5 &&
    typeof show.template === 'string' && show.capabilities.includes('completion'),
    'show: model_info, template, capabilities', show);
}

async function chat() {
  const one = await ollama.chat({ model: 'stories260K', messages, options: greedy, stream: false });
  check(one.message.role === 'assistant' && one.message.content.length > 0 && one.done === true &&
    ['stop', 'length'].includes(one.done_reason) && one.eval_count > 0 && one.prompt_eval_count > 0 &&
    one.total_duration > 0, 'chat: the message, done, done_reason, counts and durations', one);
  let text = '', parts = 0, early = 0, last;
  for await (const part of await ollama.chat({ model: 'stories260K', messages, options: greedy, stream: true })) {
    parts++;
    early += last?.done === false ? 0 : parts > 1; /* a part after one that said done */
    text += part.message.content;
    last = part;
  }
  check(parts >= 2 && early === 0 && text === one.message.content,
    'chat streamed: the same text in parts, done only in the last', [parts, text]);
  check(last.done === true && last.eval_count === one.eval_count && last.done_reason === one.done_reason,
    'chat streamed: the last part has done and the counts', last);
  const oai = await post(`${base}/v1/chat/completions`, { messages, temperature: 0, max_tokens: 24, seed: 7 });
  check(oai.choices[0].message.content === one.message.content, 'chat: the text /v1/chat/completions gives',
    [oai.choices[0].message.content, one.message.content]);
  texts.chat = one.message.content;
}

async function generate() {
  const tmpl = await ollama.generate({ model: 'stories260K', prompt: 'Once upon a time', options: greedy,
    stream: false });
  check(tmpl.response === texts.chat && tmpl.done === true, 'generate: the chat\'s text (the template applied)',
    [tmpl.response, texts.chat]);
  const raw = await ollama.generate({ model: 'stories260K', prompt: 'Once upon a time', raw: true, options: greedy,
    stream: false });
  const oai = await post(`${base}/v1/completions`, { prompt: 'Once upon a time', temperature: 0, max_tokens: 24,
    seed: 7 });
  check(raw.response === oai.choices[0].text && raw.response.length > 0, 'generate raw: /v1/completions\' text',
    [raw.response, oai.choices[0].text]);
  let text = '';
  for await (const part of await ollama.generate({ model: 'stories260K', prompt: 'Once upon a time', raw: true,
    options: greedy, stream: true }))
    text += part.response;
  check(text === raw.response, 'generate raw streamed: the same text', [text, raw.response]);
  texts.raw = raw.response;
  const json = await ollama.generate({ model: 'stories260K', prompt: 'Give me JSON', format: 'json',
    options: { temperature: 0, num_predict: 48 }, stream: false });
  check(/^\s*[{[]/.test(json.response) && (json.done_reason !== 'stop' || JSON.parse(json.response) !== undefined),
    'generate format json: JSON (whole when it stopped)', json);
  const load = await ollama.generate({ model: 'stories260K', prompt: '' });
  check(load.done === true && load.done_reason === 'load', 'generate with no prompt: only loads', load);
}

async function refusals() {
  try {
    await ollama.chat({ model: 'stories260K', messages: [{ role: 'user', content: 'hi', images: ['aGk='] }] });
    check(false, 'chat with images: refused');
  } catch (e) {
    check(e.name === 'ResponseError' && e.status_code === 400 && /images/.test(e.error),
      'chat with images: refused, Ollama\'s error shape', [e.name, e.status_code, e.error]);
  }
  const bad = await fetch(`${base}/api/generate`, { method: 'POST', body: '{"prompt": "x", "format": 3}' });
  const badBody = await bad.json();
  check(bad.status === 400 && /format/.test(badBody.error), 'generate with format 3: 400 {"error"}', badBody);
  const pull = await fetch(`${base}/api/pull`, { method: 'POST', body: '{"model": "x"}' });
  const pullBody = await pull.json();
  check(pull.status === 404 && typeof pullBody.error === 'string', 'an unknown route: 404', pullBody);
}

async function sameAsSingle() {
  if (!singleBase) return;
  const single = new Ollama({ host: singleBase });
  const one = await single.chat({ model: 'stories260K', messages, options: greedy, stream: false });
  const raw = await single.generate({ model: 'stories260K', prompt: 'Once upon a time', raw: true,
    options: greedy, stream: false });
  check(one.message.content === texts.chat && raw.response === texts.raw,
    'the chain\'s texts are the single machine\'s', [texts, one.message.content, raw.response]);
}

finish(async () => {
  await models();
  await chat();
  await generate();
  await refusals();
  await sameAsSingle();
});
