// test_webui.mjs: convoy serve's chat page (src/serve/webui.html) in headless
// Chromium (Debian's, driven by playwright-core); run by test_webui.sh.
//
// Usage: node test_webui.mjs CHROMIUM BASE_URL SHOT.png [STOP_BASE_URL STOP_SHOT.png]
// Checks, at BASE_URL (a 2-stage chain serving stories260K): the header
// names the model and both nodes; with temperature 0 and 48 tokens at most
// a message streams a reply equal to /v1/chat/completions' answer, with its tokens/s
// and the cache counts under it; a second turn's prompt comes from the
// cache; the conversation is in the list and still there after a reload.
// At STOP_BASE_URL (a model whose replies run long): Stop ends a streaming
// reply, which keeps its text and says "stopped", and the page takes a
// new message. Screenshots go to SHOT.png and STOP_SHOT.png.
import { chromium } from 'playwright-core';
import { check, finish } from './checks.mjs';

const [chromiumPath, base, shot, stopBase, stopShot] = process.argv.slice(2);

async function greedy(messages) {
  const r = await fetch(`${base}/v1/chat/completions`, { method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages, temperature: 0, max_tokens: 48 }) });
  return (await r.json()).choices[0].message.content;
}

async function turn(page, text, n) {
  await page.fill('#input', text);
  await page.press('#input', 'Enter');
  await page.waitForFunction((k) => document.querySelectorAll('.msg.assistant').length >= k &&
    !document.body.classList.contains('busy'), n, { timeout: 60000 });
  return page.evaluate(() => {
    const all = document.querySelectorAll('.msg.assistant');
    const last = all[all.length - 1];
    const stats = last.querySelector('.stats')?.textContent ?? '';
    return { text: last.firstChild.textContent, stats };
  });
}

async function chat(browser) {
  const page = await browser.newPage({ viewport: { width: 1100, height: 700 } });
  await page.goto(base + '/');
  await page.waitForFunction(() => document.querySelector('#about').textContent.includes('nodes'));
  const about = await page.textContent('#about');
  check(/stories260K/.test(about) && /local \(\d+ layers\)/.test(about) &&
    /127\.0\.0\.1:\d+ \(\d+ layers\)/.test(about),
    'the header names the model and both nodes', about);
  await page.click('summary');
  await page.fill('#temperature', '0');
  await page.dispatchEvent('#temperature', 'change');
  await page.fill('#maxtokens', '48');
  await page.dispatchEvent('#maxtokens', 'change');
  const one = await turn(page, 'Hello there', 1);
  const want1 = await greedy([{ role: 'user', content: 'Hello there' }]);
  check(one.text === want1 && one.text.length > 0, 'a reply streams in, the greedy answer of the API', [one, want1]);
  check(/\d+ tokens, [\d.]+ tok\/s/.test(one.stats) && /from the cache/.test(one.stats),
    'its tokens/s and cache counts under it', one.stats);
  const two = await turn(page, 'Tell me about the dog', 2);
  const want2 = await greedy([{ role: 'user', content: 'Hello there' }, { role: 'assistant', content: one.text },
    { role: 'user', content: 'Tell me about the dog' }]);
  const cached = Number(/(\d+) from the cache/.exec(two.stats)?.[1] ?? 0);
  check(two.text === want2 && cached > 0, 'the second turn: the API\'s answer, its prompt partly from the cache',
    [two, want2]);
  await page.screenshot({ path: shot });
  await page.reload();
  await page.waitForSelector('#list div');
  const kept = await page.evaluate(() => [document.querySelector('#list div span').textContent,
    document.querySelectorAll('.msg').length]);
  check(kept[0] === 'Hello there' && kept[1] === 4, 'after a reload the conversation is listed and shown', kept);
  await page.close();
}

// Stop while a reply streams; a sampled reply that ends by itself before
// the click (its end token is one of 2048) is tried again, twice at most.
async function stop(browser) {
  if (!stopBase) return;
  const page = await browser.newPage({ viewport: { width: 1100, height: 700 } });
  await page.goto(stopBase + '/');
  let r = null;
  for (let attempt = 1; attempt <= 3 && !/stopped/.test(r?.stats ?? ''); attempt++) {
    await page.click('#new'); /* each try a conversation of its own: a whole reply may fill the context */
    await page.fill('#input', 'Tell me a very long story');
    await page.press('#input', 'Enter');
    await page.waitForFunction(() => {
      const all = document.querySelectorAll('.msg.assistant');
      return all.length >= 1 && (all[all.length - 1].textContent.length > 40 ||
                                 !document.body.classList.contains('busy'));
    }, null, { timeout: 60000 });
    /* clicked in the page, as a user's click lands (Playwright's own waits for the streaming layout to stand
       still); a reply that ended between the look and the click is a try that ended */
    await page.evaluate(() => { const b = document.querySelector('#stop'); if (b.offsetParent) b.click(); });
    await page.waitForFunction(() => !document.body.classList.contains('busy'), null, { timeout: 30000 });
    r = await page.evaluate(() => {
      const all = document.querySelectorAll('.msg.assistant'), last = all[all.length - 1];
      return { text: last.firstChild.textContent, stats: last.querySelector('.stats')?.textContent ?? '',
        send: !!document.querySelector('#send').offsetParent };
    });
  }
  check(r.text.length > 40 && /stopped/.test(r.stats) && r.send,
    'Stop ends a streaming reply, which keeps its text and says so; Send is back', r);
  await page.screenshot({ path: stopShot });
  await page.close();
}

finish(async () => {
  const browser = await chromium.launch({ executablePath: chromiumPath, args: ['--no-sandbox'] });
  try {
    await chat(browser);
    await stop(browser);
  } finally {
    await browser.close();
  }
});
