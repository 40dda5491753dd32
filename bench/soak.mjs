// soak.mjs: a soak of `convoy serve` (bench/soak.sh starts the server).
//
// usage: node bench/soak.mjs BASE_URL SECONDS PID
//
// 64 concurrent clients for SECONDS, each looping over a random mix of:
// normal greedy completions (one of 8 prompts, whose texts alone were
// recorded before the soak: every completed one must match), seeded
// sampled completions (same check), streamed completions, clients that
// disconnect mid-request, malformed JSON, wrong types, and oversized bodies
// (all must get 4xx JSON errors). Prints counts, checks /health at the end,
// and the server's resident memory (VmRSS of PID) after a warm-up of the
// same load (the first 15% of the run, at least 5 s: thread stacks and
// allocator arenas of 64 connections) and at the end. The report is one JSON
// line on stdout; the verdict and errors go to stderr.
import http from 'node:http';
import fs from 'node:fs';

const [base, seconds, pid] = [process.argv[2], Number(process.argv[3]), process.argv[4]];
const url = new URL(base);
const prompts = ['Once upon a time', 'The little dog', 'Lily and Tom', 'One day, a bird', 'The sun was',
                 'A big red ball', 'Mom said', 'The cat sat'];

function rss() {
  const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/);
  return Number(m[1]) * 1024;
}

function request(method, path, body, { abortAfterMs } = {}) {
  return new Promise((resolve) => {
    const data = body === undefined ? undefined : (typeof body === 'string' ? body : JSON.stringify(body));
    const req = http.request({ host: url.hostname, port: url.port, method, path,
                               headers: data ? { 'content-type': 'application/json',
                                                 'content-length': Buffer.byteLength(data) } : {} }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, text: Buffer.concat(chunks).toString() }));
      res.on('error', () => resolve({ status: -1, text: '' }));
    });
    req.on('error', () => resolve({ status: -1, text: '' }));
    if (abortAfterMs !== undefined) setTimeout(() => { req.destroy(); resolve({ status: 0, text: '' }); }, abortAfterMs);
    if (data) req.write(data);
    req.end();
  });
}

const completion = (i, sampled) => ({ model: 'stories260K', prompt: prompts[i], max_tokens: 24,
                                      temperature: sampled ? 0.9 : 0, seed: sampled ? 1000 + i : undefined });

async function main() {
  /* the start RSS is taken after the warm-up, so the run must outlast it */
  const warmup = Math.max(5, 0.15 * seconds);
  if (!(seconds > warmup)) throw new Error(`SECONDS must be more than the 5 s warm-up, got ${process.argv[3]}`);
  const expected = {};
  for (let i = 0; i < prompts.length; i++)
    for (const sampled of [false, true]) {
      const r = await request('POST', '/v1/completions', completion(i, sampled));
      if (r.status !== 200) throw new Error(`reference request failed: ${r.status} ${r.text}`);
      expected[`${i}/${sampled}`] = JSON.parse(r.text).choices[0].text;
    }
  let rssStart = 0;
  setTimeout(() => { rssStart = rss(); }, warmup * 1000);
  const counts = { ok: 0, mismatch: 0, streamed: 0, disconnects: 0, rejected4xx: 0, unexpected: 0 };
  const deadline = Date.now() + seconds * 1000;
  async function client(c) {
    while (Date.now() < deadline) {
      const kind = Math.floor(Math.random() * 10);
      const i = Math.floor(Math.random() * prompts.length);
      if (kind <= 3) {
        const sampled = kind >= 2;
        const r = await request('POST', '/v1/completions', completion(i, sampled));
        if (r.status === 200) {
          if (JSON.parse(r.text).choices[0].text === expected[`${i}/${sampled}`]) counts.ok++;
          else counts.mismatch++;
        } else if (r.status !== 503) counts.unexpected++;
      } else if (kind === 4) {
        const r = await request('POST', '/v1/completions', { ...completion(i, false), stream: true });
        if (r.status === 200 && r.text.includes('data: [DONE]')) {
          const text = r.text.split('\n').filter((l) => l.startsWith('data: {'))
            .map((l) => JSON.parse(l.slice(6)).choices?.[0]?.text ?? '').join('');
          if (text === expected[`${i}/false`]) counts.streamed++;
          else counts.mismatch++;
        } else if (r.status !== 503) counts.unexpected++;
      } else if (kind <= 6) {
        await request('POST', '/v1/completions', { ...completion(i, false), max_tokens: 200 },
                      { abortAfterMs: Math.floor(Math.random() * 30) });
        counts.disconnects++;
      } else {
        const bodies = ['{"model": "stories260K", "prompt": ', '{"prompt": 5, "max_tokens": "x"}',
                        JSON.stringify({ prompt: 'x'.repeat(2 << 20), max_tokens: 4 }),
                        JSON.stringify({ prompt: 'hi', max_tokens: -3 })];
        const r = await request('POST', '/v1/completions', bodies[Math.floor(Math.random() * bodies.length)]);
        let shaped = false;
        try { shaped = r.status >= 400 && r.status < 500 && JSON.parse(r.text).error.message.length > 0; } catch {}
        if (shaped) counts.rejected4xx++;
        else if (r.status !== -1) counts.unexpected++; /* -1: the server closed an oversized upload */
      }
    }
  }
  await Promise.all(Array.from({ length: 64 }, (_, c) => client(c)));
  await new Promise((r) => setTimeout(r, 1000));
  const health = await request('GET', '/health');
  const rssEnd = rss();
  const growth = (rssEnd - rssStart) / rssStart;
  console.log(JSON.stringify({ seconds, clients: 64, ...counts, health: health.status,
                               rss_start_mb: +(rssStart / 1e6).toFixed(2), rss_end_mb: +(rssEnd / 1e6).toFixed(2),
                               rss_growth_pct: +(100 * growth).toFixed(2) }));
  const pass = counts.mismatch === 0 && counts.unexpected === 0 && health.status === 200 && growth <= 0.05 &&
               counts.ok > 0;
  console.error(pass ? 'soak: PASS' : 'soak: FAIL'); /* stdout is the JSONL report only */
  process.exit(pass ? 0 : 1);
}

main().catch((e) => { console.error(`soak: ${e.message}`); process.exit(1); });
