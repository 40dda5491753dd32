// checks.mjs: what the JavaScript tests share: check() prints "ok   WHAT"
// or "FAIL WHAT: DETAIL" and counts failures; finish() runs the test's
// steps, counts an exception as a failure, sums up and exits 1 on any.
let failures = 0;

export function check(cond, what, detail) {
  if (cond) console.log(`ok   ${what}`);
  else {
    failures++;
    console.log(`FAIL ${what}${detail !== undefined ? ': ' + JSON.stringify(detail).slice(0, 600) : ''}`);
  }
}

export async function finish(steps) {
  try {
    await steps();
  } catch (e) {
    failures++;
    console.log(`FAIL unexpected error: ${e?.stack ?? e}`);
  }
  console.log(failures ? `${failures} checks failed` : 'all checks passed');
  process.exit(failures ? 1 : 0);
}
