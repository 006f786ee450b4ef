// console.test.mjs - the web console (issue 19) in a real browser: Debian's
// chromium driven headless by playwright-core (npm; it downloads nothing).
// Starts kvserve on loopback with an admin key, loads /console and checks
// what a user sees: tokens streaming into the playground, used KV cells
// during generation turning cached after, refcount-2 cells for a system
// prompt shared by two sessions, cells on the cpu tier with a tiny pool and
// swap on, the 401 of the map without the admin key, per-tenant token
// text in the hover detail, and the CSP (headers, no violation logged).
//
// Screenshots go to $KVSERVE_CONSOLE_ARTIFACTS (the meson build dir's
// tests/console/) and their paths are printed. run.mjs skips it (77)
// without chromium or playwright-core. KVSERVE_CONSOLE_SCREENSHOT=path also
// writes the README's screenshot there.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { MODEL_NAME, startServer } from '../integration/lib.mjs';

const CHROMIUM = process.env.KVSERVE_CHROMIUM || '/usr/bin/chromium';
const ADMIN = 'admin-secret-key';
const KEYS = { alice: 'alice-key', bob: 'bob-key' };
const ART = process.env.KVSERVE_CONSOLE_ARTIFACTS || fs.mkdtempSync(path.join(os.tmpdir(), 'kvc-'));
// A long system prompt (about 10 blocks of 16 tokens) and a word only alice
// sends.
const SECRET = 'Quintessentially';
const SYSTEM = `${SECRET} private notes of Miss Woodhouse. ` +
  'Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, ' +
  'seemed to unite some of the best blessings of existence; and had lived nearly twenty-one ' +
  'years in the world with very little to distress or vex her. She was the youngest of the two ' +
  'daughters of a most affectionate, indulgent father.';

// run.mjs has checked that both are installed (77 otherwise).
const pw = await import('playwright-core');
fs.mkdirSync(ART, { recursive: true });

const sha256 = (s) => crypto.createHash('sha256').update(s).digest('hex');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function tenantConf() {
  const f = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'kvc-conf-')), 'kvserve.conf');
  fs.writeFileSync(f, Object.entries(KEYS).map(([n, k]) =>
    `[tenant ${n}]\napi_key_sha256 = ${sha256(k)}\n`).join('\n'));
  return f;
}

let browser;
let srv;
const violations = []; // CSP violations and page errors, from every page

before(async () => {
  browser = await pw.chromium.launch({ executablePath: CHROMIUM, headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });
  // Every step sleeps 10 ms (a test hook of cmd_serve.c): the tiny default
  // model makes a 90-token chat in well under the map's 300 ms poll on a
  // fast machine, and the shared-prefix check needs two chats seen at once.
  srv = await startServer(['--admin-api-key', ADMIN, '--config', tenantConf()],
    { env: { KVSERVE_TEST_STEP_DELAY_MS: '10' } });
});

after(async () => {
  await browser?.close();
  if (srv) {
    assert.equal((await srv.stop()).code, 0);
  }
});

// A new session (browser context) on base's /console with the keys typed
// into the page's form.
async function openConsole(base, { api = '', admin = '' } = {}) {
  const ctx = await browser.newContext({ viewport: { width: 1400, height: 1000 } });
  const page = await ctx.newPage();
  page.on('console', (m) => {
    if (/Content Security Policy|Refused to/i.test(m.text())) {
      violations.push(m.text());
    }
  });
  page.on('pageerror', (e) => violations.push(`page error: ${e.message}`));
  await page.goto(`${base}/`); // the redirect to /console
  assert.equal(new URL(page.url()).pathname, '/console');
  await page.waitForSelector('#kv-canvas', { state: 'attached' });
  if (api || admin) {
    await page.fill('#api-key', api);
    await page.fill('#admin-key', admin);
    await page.click('#keys button[type=submit]');
  }
  await page.evaluate(() => document.addEventListener('securitypolicyviolation',
    (e) => console.error(`Refused to load (CSP): ${e.violatedDirective} ${e.blockedURI}`)));
  return page;
}

async function shot(page, name) {
  const p = path.join(ART, `${name}.png`);
  await page.screenshot({ path: p, fullPage: true });
  console.log(`screenshot: ${p}`);
  return p;
}

// The KV summary of tier as the page shows it ({blocks, used, cached,
// shared, maxRefcount} as numbers), or null before the first snapshot.
async function kvSummary(page, tier) {
  return page.evaluate((t) => {
    const d = document.getElementById(`kv-sum-${t}`);
    if (!d || document.getElementById('kv-body').hidden) {
      return null;
    }
    const o = {};
    for (const [k, v] of Object.entries(d.dataset)) {
      o[k] = Number(v);
    }
    return o;
  }, tier);
}

// Polls fn() every 25 ms until it returns a truthy value; throws after ms.
async function until(fn, ms, what) {
  const t0 = Date.now();
  for (;;) {
    const v = await fn();
    if (v) {
      return v;
    }
    if (Date.now() - t0 > ms) {
      throw new Error(`timed out waiting for ${what}`);
    }
    await sleep(25);
  }
}

// Background generations that keep the engine busy (so the page's own
// chat streams for a while): n choices of len tokens each, per request.
function load(base, key, { requests = 2, n = 8, len = 200, prompt = 'Mr. Knightley' } = {}) {
  return Promise.all(Array.from({ length: requests }, () => fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${key}` },
    body: JSON.stringify({ model: MODEL_NAME, prompt, n, max_tokens: len, ignore_eos: true,
      temperature: 1 }),
  }).then(async (r) => {
    const text = await r.text();
    assert.equal(r.status, 200, text);
    return text;
  })));
}

async function setChat(page, { system = '', message, maxTokens = 120 }) {
  await page.fill('#system', system);
  await page.fill('#message', message);
  await page.fill('#p-max_tokens', String(maxTokens));
  await page.check('#p-ignore_eos');
}

test('the console routes carry the CSP and the other headers', async () => {
  for (const p of ['/', '/console', '/console/app.js', '/console/style.css', '/console/nope.js']) {
    const res = await fetch(srv.base + p, { redirect: 'manual' });
    await res.arrayBuffer();
    const csp = res.headers.get('content-security-policy') ?? '';
    assert.match(csp, /default-src 'none'/, p);
    assert.match(csp, /script-src 'self'/, p);
    assert.match(csp, /connect-src 'self'/, p);
    assert.match(csp, /frame-ancestors 'none'/, p);
    assert.equal(res.headers.get('x-content-type-options'), 'nosniff', p);
    assert.equal(res.headers.get('referrer-policy'), 'no-referrer', p);
  }
  const root = await fetch(`${srv.base}/`, { redirect: 'manual' });
  assert.equal(root.status, 302);
  assert.equal(root.headers.get('location'), '/console');
  assert.equal((await fetch(`${srv.base}/console/nope.js`)).status, 404);
  // No inline script or style in the page itself.
  const html = await (await fetch(`${srv.base}/console`)).text();
  assert.doesNotMatch(html, /<script(?![^>]*\bsrc=)[^>]*>/);
  assert.doesNotMatch(html, /<style|\sstyle=/);
});

test('POST /apply-template renders the chat; bad input is a 400, no key a 401', async () => {
  const post = (body, key = KEYS.alice) => fetch(`${srv.base}/apply-template`, {
    method: 'POST', body: JSON.stringify(body),
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${key}` },
  });
  const ok = await post({ messages: [{ role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'Who is Emma?' }] });
  assert.equal(ok.status, 200);
  const { prompt } = await ok.json();
  assert.ok(prompt.indexOf('Be brief.') < prompt.indexOf('Who is Emma?'), prompt);
  const bad = await post({ prompt: 'no messages' });
  assert.equal(bad.status, 400);
  assert.equal((await bad.json()).error.param, 'messages');
  assert.equal((await post({ messages: [] }, 'wrong-key')).status, 401);
});

test('without the admin key the map says 401', async () => {
  const page = await openConsole(srv.base, { api: KEYS.alice });
  await page.waitForSelector('#kv-status[data-status="401"]', { timeout: 10000 });
  const text = await page.textContent('#kv-status');
  assert.match(text, /401/);
  assert.match(text, /admin/i);
  assert.ok(await page.isHidden('#kv-canvas'));
  await shot(page, 'console-no-admin-key');
  await page.context().close();
  // A kvserve without --admin-api-key: the admin API is off.
  const off = await startServer([]);
  try {
    const p2 = await openConsole(off.base, { admin: 'whatever' });
    await p2.waitForSelector('#kv-status[data-status="401"]', { timeout: 10000 });
    assert.match(await p2.textContent('#kv-status'), /401.*admin-api-key/s);
    await p2.context().close();
  } finally {
    assert.equal((await off.stop()).code, 0);
  }
});

test('a chat streams into the page; used cells during generation turn cached after',
  async () => {
    const page = await openConsole(srv.base, { api: KEYS.alice, admin: ADMIN });
    await until(() => kvSummary(page, 'device'), 10000, 'the first KV snapshot');
    await setChat(page, { message: 'Tell me about Mr. Knightley.', maxTokens: 150 });
    const busy = load(srv.base, KEYS.bob);
    await page.click('#send');
    // Tokens appear while the stream is still open, and more come later.
    const seen = [];
    let usedDuring = 0;
    await until(async () => {
      const st = await page.evaluate(() => ({
        state: document.getElementById('output').dataset.state,
        len: document.getElementById('output').textContent.length,
      }));
      const kv = await kvSummary(page, 'device');
      if (st.state === 'streaming') {
        seen.push(st.len);
        usedDuring = Math.max(usedDuring, kv?.used ?? 0);
      }
      return st.state !== 'streaming';
    }, 30000, 'the chat to finish');
    assert.equal(await page.getAttribute('#output', 'data-state'), 'done',
      await page.textContent('#gen-status'));
    const partial = seen.filter((n) => n > 0);
    assert.ok(partial.length >= 2 && partial[0] < partial[partial.length - 1],
      `no streaming seen: ${seen.join(',')}`);
    assert.ok(usedDuring > 0, 'no used cell shown during generation');
    // Per-token logprobs are on the spans, shown on hover.
    const tok = page.locator('#output .tok').first();
    await tok.hover();
    await page.waitForSelector('#tip:not([hidden])');
    assert.match(await page.textContent('#tip'), /logprob -?\d/);
    await busy;
    // After: nothing used, the finished prompts' blocks cached.
    const kv = await until(async () => {
      const s = await kvSummary(page, 'device');
      return s && s.used === 0 && s.cached > 0 ? s : null;
    }, 10000, 'used cells to turn cached');
    assert.ok(kv.cached > 0);
    // The canvas really draws them: a cached cell is not the free colour.
    const snap = await page.evaluate(() => window.kvConsole.snapshot);
    const id = snap.tiers[0].state.indexOf('c');
    const c = await page.evaluate((i) => window.kvConsole.cellCenter('device', i), id);
    const px = await page.evaluate(({ x, y }) => {
      const cv = document.getElementById('kv-canvas');
      const r = cv.getBoundingClientRect();
      const k = window.devicePixelRatio || 1;
      return Array.from(cv.getContext('2d').getImageData(Math.round((x - r.left) * k),
        Math.round((y - r.top) * k), 1, 1).data);
    }, c);
    assert.notDeepEqual(px.slice(0, 3), [0x26, 0x2c, 0x36], 'a cached cell drawn as free');
    await page.click('#show-prompt');
    await page.waitForSelector('#rendered-prompt:not([hidden])');
    assert.match(await page.textContent('#rendered-prompt'), /Knightley/);
    await shot(page, 'console-chat');
    await page.context().close();
  });

test('the same long system prompt from two sessions: cells with refcount 2', async () => {
  const a = await openConsole(srv.base, { api: KEYS.alice, admin: ADMIN });
  const b = await openConsole(srv.base, { api: KEYS.alice, admin: ADMIN });
  for (const p of [a, b]) {
    await setChat(p, { system: SYSTEM, message: 'Who is Emma?', maxTokens: 90 });
  }
  const busy = load(srv.base, KEYS.bob, { requests: 2, n: 8, len: 200 });
  await a.click('#send');
  // A's prompt is in the prefix cache once its first tokens stream.
  await until(() => a.evaluate(() => document.getElementById('output').textContent.length > 0),
    20000, 'the first session to stream');
  await b.click('#send');
  let maxRef = 0;
  await until(async () => {
    const s = await kvSummary(b, 'device');
    maxRef = Math.max(maxRef, s?.maxRefcount ?? 0);
    if (maxRef >= 2) {
      return true;
    }
    const done = await a.evaluate(() => document.getElementById('output').dataset.state);
    return done !== 'streaming' && maxRef < 2 ? 'ended' : false;
  }, 30000, 'a shared cell');
  assert.ok(maxRef >= 2, `max refcount seen ${maxRef}`);
  await shot(b, 'console-shared-prefix');
  await until(() => Promise.all([a, b].map((p) => p.evaluate(
    () => document.getElementById('output').dataset.state))).then((s) =>
    s.every((x) => x !== 'streaming')), 30000, 'both sessions to finish');
  await busy;
  await a.context().close();
  await b.context().close();
});

test("a tenant's key never shows another tenant's tokens in the hover detail", async () => {
  // alice's system prompt (from the test before) is cached under her salt.
  const page = await openConsole(srv.base, { api: KEYS.bob, admin: ADMIN });
  await until(() => kvSummary(page, 'device'), 10000, 'a KV snapshot');
  const snap = await page.evaluate(() => window.kvConsole.snapshot);
  const aliceId = snap.tenants.find((t) => t.name === 'alice').id;
  const dev = snap.tiers.find((t) => t.name === 'device');
  const id = [...dev.state].findIndex((s, i) => s === 'c' && dev.tenant[i] === aliceId);
  assert.ok(id >= 0, 'no cached block of alice');
  const hover = async (p) => {
    const c = await p.evaluate((i) => window.kvConsole.cellCenter('device', i), id);
    await p.mouse.move(c.x, c.y);
    await p.waitForSelector(`#tip[data-block="device/${id}"]`, { timeout: 5000 });
    return { tip: await p.textContent('#tip'),
      detail: await p.evaluate(() => window.kvConsole.detail) };
  };
  const asBob = await hover(page);
  assert.equal(asBob.detail.tokens, null);
  assert.equal(asBob.detail.text, null);
  assert.match(asBob.tip, /hidden/);
  assert.doesNotMatch(asBob.tip, new RegExp(SECRET));
  await shot(page, 'console-other-tenant');
  await page.context().close();
  // The same block with alice's key: her tokens are shown.
  const mine = await openConsole(srv.base, { api: KEYS.alice, admin: ADMIN });
  await until(() => kvSummary(mine, 'device'), 10000, 'a KV snapshot');
  const asAlice = await hover(mine);
  assert.ok(Array.isArray(asAlice.detail.tokens) && asAlice.detail.tokens.length > 0);
  assert.match(asAlice.tip, /text /);
  await mine.context().close();
});

test('a JSON schema and tools from the playground; a streamed completion', async () => {
  const page = await openConsole(srv.base, { api: KEYS.alice });
  const sent = [];
  page.on('request', (r) => r.method() === 'POST' && sent.push(JSON.parse(r.postData())));
  await setChat(page, { message: 'Is Emma clever?', maxTokens: 40 });
  await page.uncheck('#p-ignore_eos');
  await page.click('#advanced summary');
  const schema = { type: 'object', properties: { answer: { enum: ['yes', 'no'] } },
    required: ['answer'] };
  const tools = [{ type: 'function', function: { name: 'lookup', description: 'Look up a name',
    parameters: { type: 'object', properties: { name: { type: 'string' } } } } }];
  await page.fill('#schema', JSON.stringify(schema));
  await page.fill('#tools', JSON.stringify(tools));
  await page.click('#send');
  await page.waitForSelector('#output[data-state="done"]', { timeout: 20000 });
  const body = sent.find((b) => b.messages);
  assert.deepEqual(body.response_format.json_schema.schema, schema);
  assert.deepEqual(body.tools, tools);
  assert.equal(body.stream, true);
  // The constrained answer is the schema's JSON (or a call of the tool).
  const out = (await page.textContent('#output')).trim();
  if (!out.startsWith('tool call:')) {
    assert.ok(['yes', 'no'].includes(JSON.parse(out).answer), out);
  }
  // Invalid JSON in the schema box is refused before any request.
  await page.fill('#schema', '{nope');
  const n = sent.length;
  await page.click('#send');
  assert.match(await page.textContent('#gen-status'), /not valid JSON/);
  assert.equal(sent.length, n);
  // Completion mode streams too, with per-token logprobs.
  await page.fill('#schema', '');
  await page.fill('#tools', '');
  await page.check('input[name=mode][value=completion]');
  await page.fill('#p-max_tokens', '24');
  await page.click('#send');
  await page.waitForSelector('#output[data-state="done"]', { timeout: 20000 });
  assert.ok(await page.locator('#output .tok').count() > 0);
  assert.equal(sent[sent.length - 1].prompt.length > 0, true);
  await page.context().close();
});

test('a tiny KV pool with swap on: cells on the cpu tier', async () => {
  const tiny = await startServer(['--admin-api-key', ADMIN, '--num-kv-blocks', '40',
    '--swap-space', '0.05']);
  try {
    const page = await openConsole(tiny.base, { admin: ADMIN });
    const first = await until(() => kvSummary(page, 'cpu'), 10000, 'a cpu tier');
    assert.ok(first.blocks > 0, 'the cpu tier has no blocks');
    // 12 sequences of 200 tokens need 156 blocks: the scheduler swaps some
    // out. A swapped sequence can come back between two polls of the map
    // (a loaded CI machine once saw none in 30 s), so the load is sent
    // again, one batch at a time, until a poll catches a cpu-tier cell.
    const loads = [];
    let running = 0;
    const more = () => {
      running++;
      loads.push(load(tiny.base, '', { requests: 12, n: 1, len: 200 }).finally(() => {
        running--;
      }));
    };
    more();
    const cpu = await until(async () => {
      const s = await kvSummary(page, 'cpu');
      if (s && s.used > 0) {
        return s;
      }
      if (running === 0) {
        more();
      }
      return null;
    }, 60000, 'used cells on the cpu tier');
    assert.ok(cpu.used > 0);
    await shot(page, 'console-swap');
    await Promise.all(loads);
    await page.context().close();
  } finally {
    assert.equal((await tiny.stop()).code, 0);
  }
});

test('the README screenshot, and no CSP violation was logged', async () => {
  const page = await openConsole(srv.base, { api: KEYS.alice, admin: ADMIN });
  await setChat(page, { system: SYSTEM, message: 'Who is Emma?', maxTokens: 80 });
  const busy = load(srv.base, KEYS.bob, { requests: 4, n: 8, len: 220 });
  await sleep(700); // a few chart samples with the load on
  await page.click('#send');
  // Taken mid-generation: used cells, alice's shared prompt, the charts live.
  // On a fast machine the chat can pass 40 characters after the map's last
  // poll that saw used cells, so "used" need only have been seen once.
  let seenUsed = false;
  await until(async () => {
    const s = await kvSummary(page, 'device');
    seenUsed = seenUsed || (s !== null && s !== undefined && s.used > 0);
    const len = await page.evaluate(() => document.getElementById('output').textContent.length);
    return seenUsed && len > 40;
  }, 30000, 'the chat to stream');
  const p = await shot(page, 'console');
  await until(() => page.evaluate(() => document.getElementById('output').dataset.state === 'done'),
    30000, 'the chat');
  await busy;
  if (process.env.KVSERVE_CONSOLE_SCREENSHOT) {
    fs.copyFileSync(p, process.env.KVSERVE_CONSOLE_SCREENSHOT);
    console.log(`screenshot: ${process.env.KVSERVE_CONSOLE_SCREENSHOT}`);
  }
  await page.context().close();
  assert.deepEqual(violations, []);
});
