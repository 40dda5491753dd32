// test_serve_clients.mjs: drives a running `convoy serve` that needs an API
// key with the clients people point at llama-server: the official `openai`
// npm client and LangChain's ChatOpenAI, each with its default model name;
// run by test_serve_clients.sh.
//
// Usage: node test_serve_clients.mjs BASE_URL KEY
// Checks: chat and completions, streamed and not, with the key (the answer
// names the server's model, whatever name was asked); without the key and
// with a wrong one, a 401 the openai client raises as AuthenticationError
// with OpenAI's error shape (code invalid_api_key); ChatOpenAI invoke and
// stream (when @langchain/openai is not installed, its two request bodies
// are sent with fetch instead, and the output says so).
// Prints "ok   ..." / "FAIL ..." per check; exits 1 on any failure.
import OpenAI from 'openai';
import { check, finish } from './checks.mjs';

const [base, key] = process.argv.slice(2);

async function openaiClient() {
  const client = new OpenAI({ baseURL: base, apiKey: key, maxRetries: 0, timeout: 60000 });
  const messages = [{ role: 'user', content: 'Tell me a story.' }];
  const chat = await client.chat.completions.create({ model: 'gpt-3.5-turbo', messages, max_tokens: 12 });
  check(chat.choices[0].message.content.length > 0 && chat.usage.completion_tokens > 0,
    'openai: chat completion as gpt-3.5-turbo', chat);
  let text = '', chunks = 0;
  for await (const c of await client.chat.completions.create({ model: 'gpt-3.5-turbo', messages, max_tokens: 12,
    stream: true })) {
    chunks++;
    text += c.choices[0]?.delta?.content ?? '';
  }
  check(chunks > 1 && text.length > 0, 'openai: streamed chat completion as gpt-3.5-turbo', [chunks, text]);
  const c = await client.completions.create({ model: 'gpt-3.5-turbo-instruct', prompt: 'Once upon a time',
    max_tokens: 8, temperature: 0 });
  check(c.choices[0].text.length > 0 && c.model !== 'gpt-3.5-turbo-instruct',
    'openai: completion as gpt-3.5-turbo-instruct, answered as the server\'s model', c);
  let ctext = '';
  for await (const ch of await client.completions.create({ model: 'gpt-3.5-turbo-instruct',
    prompt: 'Once upon a time', max_tokens: 8, temperature: 0, stream: true }))
    ctext += ch.choices[0]?.text ?? '';
  check(ctext === c.choices[0].text, 'openai: streamed completion = non-streamed', [ctext, c.choices[0].text]);
  const models = await client.models.list();
  check(models.data.length === 1, 'openai: models.list with the key', models.data);
}

async function withoutKey() {
  for (const [name, apiKey] of [['without the key', ''], ['with a wrong key', key + 'x']]) {
    const client = new OpenAI({ baseURL: base, apiKey: apiKey || 'unused', maxRetries: 0, timeout: 60000,
      defaultHeaders: apiKey ? {} : { Authorization: null } });
    let err = null;
    try {
      await client.chat.completions.create({ model: 'gpt-3.5-turbo', messages: [{ role: 'user', content: 'Hi' }] });
    } catch (e) {
      err = e;
    }
    check(err instanceof OpenAI.AuthenticationError && err.status === 401 && err.code === 'invalid_api_key' &&
      err.error?.type === 'invalid_request_error' && 'param' in (err.error ?? {}) &&
      typeof err.error?.message === 'string', `openai: ${name}: 401 in OpenAI's error shape`,
    [err?.status, err?.error]);
  }
}

async function langchain() {
  let ChatOpenAI = null;
  try {
    ({ ChatOpenAI } = await import('@langchain/openai'));
  } catch {
    console.log('note @langchain/openai is not installed: its requests are sent with fetch');
  }
  if (ChatOpenAI) {
    const llm = new ChatOpenAI({ apiKey: key, configuration: { baseURL: base }, maxRetries: 0, maxTokens: 12 });
    check(llm.model === 'gpt-3.5-turbo', 'langchain: ChatOpenAI\'s default model is gpt-3.5-turbo', llm.model);
    const r = await llm.invoke('Tell me a story');
    check(typeof r.content === 'string' && r.content.length > 0, 'langchain: ChatOpenAI.invoke', r.content);
    let text = '';
    for await (const chunk of await llm.stream('Tell me a story')) text += chunk.content;
    check(text.length > 0, 'langchain: ChatOpenAI.stream', text);
    return;
  }
  // ChatOpenAI's bodies (@langchain/openai 1.x), as it sends them
  const post = (body) => fetch(`${base}/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${key}` },
    body: JSON.stringify(body) });
  const messages = [{ role: 'user', content: 'Tell me a story' }];
  const r = await post({ model: 'gpt-3.5-turbo', stream: false, messages, max_tokens: 12 });
  const j = await r.json();
  check(r.status === 200 && j.choices[0].message.content.length > 0, 'langchain (emulated): invoke', j);
  const s = await post({ model: 'gpt-3.5-turbo', stream: true, stream_options: { include_usage: true }, messages,
    max_tokens: 12 });
  const events = (await s.text()).split('\n').filter((l) => l.startsWith('data: '));
  check(s.status === 200 && events.at(-1) === 'data: [DONE]' && events.length > 3, 'langchain (emulated): stream',
    events.slice(-3));
}

await finish(async () => {
  await openaiClient();
  await withoutKey();
  await langchain();
});
