// test_serve_responses.mjs: drives a running `convoy serve` that needs an API
// key through POST /v1/responses: the AI SDK's default OpenAI provider
// (`ai` with `@ai-sdk/openai`, whose provider('model') calls /v1/responses)
// and plain fetch; run by test_serve_clients.sh.
//
// Usage: node test_serve_responses.mjs BASE_URL KEY
// Checks: generateText and streamText get non-empty text; with fetch, the
// non-streamed response object (status, output message, usage; "incomplete"
// with reason max_output_tokens when cut), and the streamed events in
// OpenAI's order with event: lines matching each data's type and
// sequence_numbers counting from 0.
// Prints "ok   ..." / "FAIL ..." per check; exits 1 on any failure.
import { generateText, streamText } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { check, finish } from './checks.mjs';

const [base, key] = process.argv.slice(2);

async function aiSdk() {
  const provider = createOpenAI({ baseURL: base, apiKey: key });
  const model = provider('gpt-4o-mini'); // the default: the Responses API
  const g = await generateText({ model, system: 'You tell stories.', prompt: 'Tell me a story.',
    maxOutputTokens: 12 });
  check(g.text.length > 0 && g.usage.outputTokens > 0, 'AI SDK: generateText through /v1/responses', g.text);
  const s = streamText({ model, prompt: 'Once upon a time', maxOutputTokens: 12,
    onError: ({ error }) => check(false, 'AI SDK: streamText raised no error', String(error)) });
  let text = '', parts = 0;
  for await (const t of s.textStream) {
    parts++;
    text += t;
  }
  check(parts > 0 && text.length > 0, 'AI SDK: streamText through /v1/responses', [parts, text]);
}

const post = (body) => fetch(`${base}/responses`, { method: 'POST',
  headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' }, body: JSON.stringify(body) });

async function shapes() {
  const input = [{ role: 'user', content: [{ type: 'input_text', text: 'Hi' }] },
    { role: 'assistant', content: [{ type: 'output_text', text: 'Hello.' }] }, { role: 'user', content: 'A story?' }];
  const r = await (await post({ model: 'm', input, instructions: 'Be kind.', max_output_tokens: 4,
    temperature: 0, ignore_eos: true })).json();
  const m = r.output?.[0];
  check(/^resp_/.test(r.id) && r.object === 'response' && r.status === 'incomplete' &&
    r.incomplete_details?.reason === 'max_output_tokens' && m?.type === 'message' && m.role === 'assistant' &&
    /^msg_/.test(m.id) && m.content[0].type === 'output_text' && Array.isArray(m.content[0].annotations) &&
    r.usage.output_tokens === 4 && r.usage.total_tokens === r.usage.input_tokens + 4,
  'fetch: the response object, incomplete at max_output_tokens', r);
  const done = await (await post({ input: 'Once upon a time', max_output_tokens: 200 })).json();
  check(done.status === 'completed' || done.incomplete_details?.reason === 'max_output_tokens',
    'fetch: a response ends completed (or cut)', done);
  const bad = await post({ input: 'Hi', previous_response_id: 'resp_1' });
  check(bad.status === 400, 'fetch: previous_response_id is refused (stateless)', bad.status);

  const sse = await (await post({ input: 'Once upon a time', max_output_tokens: 8, stream: true })).text();
  const events = sse.split('\n\n').filter((b) => b.trim()).map((b) => {
    const ev = /^event: (.*)$/m.exec(b)?.[1], data = JSON.parse(/^data: (.*)$/m.exec(b)[1]);
    return { ev, data };
  });
  const types = events.map((e) => e.data.type);
  const head = ['response.created', 'response.in_progress', 'response.output_item.added',
    'response.content_part.added'];
  const tail = ['response.output_text.done', 'response.content_part.done', 'response.output_item.done'];
  const mid = types.slice(head.length, -4);
  const last = events.at(-1)?.data;
  check(head.every((t, i) => types[i] === t) && tail.every((t, i) => types.at(-4 + i) === t) &&
    mid.length > 0 && mid.every((t) => t === 'response.output_text.delta') &&
    ['response.completed', 'response.incomplete'].includes(last?.type),
  'fetch: streamed events in OpenAI\'s order', types);
  check(events.every((e, i) => e.ev === e.data.type && e.data.sequence_number === i),
    'fetch: each event: line names its type, sequence_numbers count from 0', events.map((e) => e.ev));
  const deltas = events.filter((e) => e.data.type === 'response.output_text.delta').map((e) => e.data.delta).join('');
  check(deltas.length > 0 && last.response.output[0].content[0].text === deltas &&
    events.at(-4).data.text === deltas && last.response.usage.output_tokens > 0,
  'fetch: the deltas add up to the final text, with usage', [deltas, last]);
}

await finish(async () => {
  await aiSdk();
  await shapes();
});
