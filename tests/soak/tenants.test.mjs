// tenants.test.mjs - tenant isolation.
//  * Prefix cache: tenant B cannot learn whether tenant A has a prompt
//    cached. With A's long prompts cached, B's requests for the same prompts
//    report no cached tokens and their time to first token is
//    indistinguishable from B's misses on fresh prompts (two-sided
//    Mann-Whitney U over interleaved trials, alpha 0.001), while A's own
//    repeats are hits (usage.prompt_tokens_details.cached_tokens); the
//    hit/miss TTFT figures are printed.
//  * API keys (right or wrong) never appear in the logs (debug level) or in
//    /metrics.
//  * One tenant's key never reaches another tenant's quotas or counters: A
//    flooded past its queue limit gets 429 while B, at the same time, gets
//    none, and the per-tenant token and rejection counters add up to what
//    each tenant's clients saw.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  MODEL_NAME, getMetrics, metricValue, postJson, startServer, waitKvEmpty,
} from '../integration/lib.mjs';

const KEY_A = 'sk-tenant-alpha-3f9c1e';
const KEY_B = 'sk-tenant-bravo-77d2aa';
const KEY_WRONG = 'sk-wrong-key-5b5b5b';
const TRIALS = Math.max(12, Math.round(40 * Number(process.env.KVSERVE_TEST_SCALE || 1)));

const WORDS = ('emma harriet knightley elton weston woodhouse highbury hartfield donwell randalls '
  + 'frank churchill jane fairfax bates martin smith taylor perry cole goddard abbey mill farm '
  + 'crown inn ball picnic box hill strawberries charade riddle letter piano sister brother '
  + 'morning evening walk garden carriage dinner party visit neighbour parish vicar').split(' ');

let seed = 987654321;
function rand() {
  seed = (seed * 1103515245 + 12345) % 2147483648;
  return seed / 2147483648;
}

function digest(key) {
  return createHash('sha256').update(key).digest('hex');
}

function bearer(key) {
  return { Authorization: `Bearer ${key}` };
}

// A prompt of about `tokens` tokens, unique to `tag`.
async function makePrompt(base, tag, tokens) {
  let words = [`${tag}`];
  for (;;) {
    for (let i = 0; i < 16; i++) {
      words.push(WORDS[Math.floor(rand() * WORDS.length)]);
    }
    const r = await postJson(base, '/tokenize', { model: MODEL_NAME, prompt: words.join(' ') },
      bearer(KEY_A));
    assert.equal(r.status, 200, r.text);
    if (r.json.count >= tokens) {
      return words.join(' ');
    }
  }
}

// Streams one completion of max_tokens 1; resolves with TTFT in ms and the
// number of cached prompt tokens.
async function ttft(base, key, prompt) {
  const t0 = process.hrtime.bigint();
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...bearer(key) },
    body: JSON.stringify({
      model: MODEL_NAME, prompt, max_tokens: 1, temperature: 0, stream: true,
      stream_options: { include_usage: true },
    }),
  });
  assert.equal(res.status, 200);
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let first = null;
  let text = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    if (first === null) first = process.hrtime.bigint();
    text += dec.decode(value);
  }
  let cached = null;
  let promptTokens = 0;
  for (const block of text.split('\n\n')) {
    if (!block.startsWith('data: {')) continue;
    const e = JSON.parse(block.slice(6));
    if (e.usage) {
      cached = e.usage.prompt_tokens_details?.cached_tokens ?? 0;
      promptTokens = e.usage.prompt_tokens;
    }
  }
  assert.notEqual(cached, null, 'no usage chunk');
  return { ms: Number(first - t0) / 1e6, cached, promptTokens };
}

// Two-sided Mann-Whitney U test with the normal approximation and tie
// correction; returns { u, z, p }.
function mannWhitney(x, y) {
  const all = x.map((v) => [v, 0]).concat(y.map((v) => [v, 1])).sort((a, b) => a[0] - b[0]);
  const ranks = new Array(all.length);
  let tieTerm = 0;
  for (let i = 0; i < all.length;) {
    let j = i;
    while (j + 1 < all.length && all[j + 1][0] === all[i][0]) j++;
    const r = (i + j) / 2 + 1;
    for (let k = i; k <= j; k++) ranks[k] = r;
    const t = j - i + 1;
    tieTerm += t * t * t - t;
    i = j + 1;
  }
  const n1 = x.length;
  const n2 = y.length;
  let r1 = 0;
  for (let i = 0; i < all.length; i++) if (all[i][1] === 0) r1 += ranks[i];
  const u = r1 - n1 * (n1 + 1) / 2;
  const mu = n1 * n2 / 2;
  const n = n1 + n2;
  const sigma = Math.sqrt(n1 * n2 / 12 * ((n + 1) - tieTerm / (n * (n - 1))));
  const z = (u - mu) / sigma;
  // erfc via Abramowitz-Stegun 7.1.26.
  const az = Math.abs(z) / Math.SQRT2;
  const t = 1 / (1 + 0.3275911 * az);
  const erfc = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
    + t * 1.061405429)))) * Math.exp(-az * az);
  return { u, z, p: erfc };
}

const median = (a) => [...a].sort((p, q) => p - q)[Math.floor(a.length / 2)];

function tenantConf() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-tenants-'));
  const file = path.join(dir, 'kvserve.conf');
  fs.writeFileSync(file, [
    'log_level = debug',
    '[tenant alpha]', `api_key_sha256 = ${digest(KEY_A)}`, 'max_running = 1', 'max_waiting = 1',
    '[tenant bravo]', `api_key_sha256 = ${digest(KEY_B)}`,
    '',
  ].join('\n'));
  return file;
}

let srv;

test('tenant isolation', { timeout: 600000 }, async (t) => {
  srv = await startServer(['--config', tenantConf(), '--max-num-seqs', '8']);
  try {
    await t.test('B cannot see A\'s prefix cache; A\'s repeats hit', async () => {
      const bOnA = [];
      const bMiss = [];
      const aHit = [];
      const aMiss = [];
      for (let i = 0; i < TRIALS; i++) {
        const pa = await makePrompt(srv.base, `a${i}`, 200);
        const pb = await makePrompt(srv.base, `b${i}`, 200);
        const first = await ttft(srv.base, KEY_A, pa);
        assert.equal(first.cached, 0, 'a fresh prompt hit the cache');
        aMiss.push(first.ms);
        // B's probe of A's prompt and B's fresh miss, in random order.
        const probes = rand() < 0.5 ? ['onA', 'miss'] : ['miss', 'onA'];
        for (const p of probes) {
          const r = await ttft(srv.base, KEY_B, p === 'onA' ? pa : pb);
          assert.equal(r.cached, 0, `tenant B got ${r.cached} cached tokens (${p})`);
          (p === 'onA' ? bOnA : bMiss).push(r.ms);
        }
        const again = await ttft(srv.base, KEY_A, pa);
        assert.ok(again.cached >= 160 && again.cached < again.promptTokens,
          `A's repeat cached ${again.cached} of ${again.promptTokens} tokens`);
        aHit.push(again.ms);
      }
      const probe = mannWhitney(bOnA, bMiss);
      const hit = mannWhitney(aHit, aMiss);
      console.log(`tenant isolation figures (${TRIALS} trials, ~200-token prompts): TTFT median`
        + ` B on A's cached prompts ${median(bOnA).toFixed(2)} ms vs B misses`
        + ` ${median(bMiss).toFixed(2)} ms (Mann-Whitney z ${probe.z.toFixed(2)}, p`
        + ` ${probe.p.toFixed(3)}); A hits ${median(aHit).toFixed(2)} ms vs A misses`
        + ` ${median(aMiss).toFixed(2)} ms (z ${hit.z.toFixed(2)}, p ${hit.p.toExponential(2)})`);
      assert.ok(probe.p > 0.001,
        `B's TTFT on A's cached prompts differs from a miss (p ${probe.p})`);
    });

    await t.test('quotas and counters stay with the key\'s tenant', async () => {
      const before = await getMetrics(srv.base);
      const req = { model: MODEL_NAME, prompt: 'Emma', max_tokens: 24, ignore_eos: true };
      const a = Array.from({ length: 8 }, () => postJson(srv.base, '/v1/completions', req,
        bearer(KEY_A)));
      const b = Array.from({ length: 8 }, () => postJson(srv.base, '/v1/completions', req,
        bearer(KEY_B)));
      const ra = await Promise.all(a);
      const rb = await Promise.all(b);
      const aRejected = ra.filter((r) => r.status === 429).length;
      assert.ok(aRejected >= 1, ra.map((r) => r.status).join(','));
      for (const r of ra) assert.ok(r.status === 200 || r.status === 429, r.text);
      for (const r of rb) assert.equal(r.status, 200, r.text);
      await waitKvEmpty(srv.base);
      const after = await getMetrics(srv.base);
      const delta = (name, tenant) => (metricValue(after, name, `tenant="${tenant}"`) ?? 0)
        - (metricValue(before, name, `tenant="${tenant}"`) ?? 0);
      assert.equal(delta('kvserve:requests_rejected_total', 'alpha'), aRejected);
      assert.equal(delta('kvserve:requests_rejected_total', 'bravo'), 0);
      assert.equal(delta('kvserve:requests_rejected_total', 'default'), 0);
      const sum = (rs, f) => rs.filter((r) => r.status === 200)
        .reduce((s, r) => s + r.json.usage[f], 0);
      assert.equal(delta('kvserve:generation_tokens_total', 'alpha'), sum(ra, 'completion_tokens'));
      assert.equal(delta('kvserve:generation_tokens_total', 'bravo'), sum(rb, 'completion_tokens'));
      assert.equal(delta('kvserve:prompt_tokens_total', 'bravo'), sum(rb, 'prompt_tokens'));
      assert.equal(delta('kvserve:generation_tokens_total', 'default'), 0);
    });

    await t.test('API keys never appear in logs or metrics', async () => {
      const r = await postJson(srv.base, '/v1/completions',
        { model: MODEL_NAME, prompt: 'x', max_tokens: 1 }, bearer(KEY_WRONG));
      assert.equal(r.status, 401);
      const m = await getMetrics(srv.base);
      for (const key of [KEY_A, KEY_B, KEY_WRONG]) {
        assert.ok(!m.includes(key), `key ${key} in /metrics`);
        const hex = key.slice(3);
        assert.ok(!srv.logs.some((l) => l.includes(key) || l.includes(hex)),
          `key ${key} in the logs`);
        // Nor its digest prefix in the metrics (digests identify keys).
        assert.ok(!m.includes(digest(key).slice(0, 16)), 'key digest in /metrics');
      }
      assert.ok(srv.logs.length > 10, 'debug logging was on');
    });
  } finally {
    const st = await srv.stop();
    assert.equal(st.code, 0);
  }
});
