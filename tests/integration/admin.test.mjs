// admin.test.mjs - the web console's admin API (issue 19, server/srv_admin.c):
// the admin key (401 off / missing / wrong / a tenant's key), the KV map
// during and after a streaming generation, prefix sharing (refcount 2), the
// cpu tier under a tiny pool with swap, per-tenant token visibility, the
// stats, and POST /reset_prefix_cache.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { API_KEY, MODEL_NAME, authHeaders, postJson, startServer, tmpFile, waitKvEmpty }
  from './lib.mjs';

const ADMIN = 'sk-kvserve-admin-test';
const admin = { Authorization: `Bearer ${ADMIN}` };
const ADMIN_ROUTES = [['GET', '/admin/kv'], ['GET', '/admin/kv/blocks/device/1'],
  ['GET', '/admin/stats'], ['POST', '/reset_prefix_cache']];

// A prompt of about 60 tokens: three full blocks and more.
const LONG = 'It is a truth universally acknowledged, that a single man in possession of a ' +
  'good fortune, must be in want of a wife. However little known the feelings or views of ' +
  'such a man may be on his first entering a neighbourhood, this truth is so well fixed';

async function getJson(base, route, headers = admin) {
  const res = await fetch(base + route, { headers });
  const text = await res.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {
    json = null;
  }
  return { status: res.status, json, text };
}

async function kvMap(base) {
  const r = await getJson(base, '/admin/kv');
  assert.equal(r.status, 200, r.text.slice(0, 300));
  return r.json;
}

function cells(tier, state) {
  const out = [];
  for (let i = 0; i < tier.n_blocks; i++) {
    if (tier.state[i] === state) {
      out.push(i);
    }
  }
  return out;
}

// Starts a streaming completion; resolves `first` at its first data event
// and `done` with every event once the stream ends.
function stream(base, body, headers = {}) {
  let firstResolve;
  const first = new Promise((r) => { firstResolve = r; });
  const done = (async () => {
    const res = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', ...headers },
      body: JSON.stringify({ model: MODEL_NAME, stream: true, ...body }),
    });
    assert.equal(res.status, 200);
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    let text = '';
    let seen = false;
    for (;;) {
      const { value, done: end } = await reader.read();
      if (end) {
        break;
      }
      text += dec.decode(value, { stream: true });
      if (!seen && text.includes('data: {')) {
        seen = true;
        firstResolve();
      }
    }
    firstResolve();
    return text;
  })();
  return { first, done };
}

async function waitIdle(base) {
  for (let i = 0; i < 400; i++) {
    const s = (await getJson(base, '/admin/stats')).json;
    if (s.running === 0 && s.waiting === 0 && s.swapped === 0 && s.kv.device_used === 0 &&
        s.kv.cpu_used === 0) {
      return s;
    }
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error('the engine did not go idle');
}

// ---- the admin key ------------------------------------------------------------

test('without --admin-api-key every admin route is 401 admin_key_required', async () => {
  const s = await startServer([]);
  try {
    for (const [method, route] of ADMIN_ROUTES) {
      const res = await fetch(s.base + route, { method, headers: admin });
      const body = await res.json();
      assert.equal(res.status, 401, `${method} ${route}`);
      assert.equal(body.error.type, 'authentication_error');
      assert.equal(body.error.code, 'admin_key_required');
      assert.match(body.error.message, /admin API is off.*--admin-api-key/);
    }
  } finally {
    assert.equal((await s.stop()).code, 0);
  }
});

let srv;
before(async () => {
  srv = await startServer(['--admin-api-key', ADMIN, '--api-key', API_KEY]);
});
after(async () => {
  assert.equal((await srv.stop()).code, 0);
});

test('a missing, wrong or tenant key is 401; the admin key is 200', async () => {
  for (const [method, route] of ADMIN_ROUTES) {
    for (const headers of [{}, { Authorization: 'Bearer sk-wrong' }, authHeaders(API_KEY),
      { Authorization: ADMIN }]) {
      const res = await fetch(srv.base + route, { method, headers });
      const body = await res.json();
      assert.equal(res.status, 401, `${method} ${route} ${JSON.stringify(headers)}`);
      assert.equal(body.error.code, 'admin_key_required');
      assert.match(body.error.message, /a valid admin key is required/);
    }
    const res = await fetch(srv.base + route, { method, headers: admin });
    await res.arrayBuffer();
    assert.equal(res.status, 200, `${method} ${route}`);
  }
  // The admin key is no tenant key.
  const gen = await fetch(`${srv.base}/v1/models`, { headers: admin });
  await gen.arrayBuffer();
  assert.equal(gen.status, 401);
  // Unknown tier or id: 404.
  assert.equal((await getJson(srv.base, '/admin/kv/blocks/gpu/1')).status, 404);
  assert.equal((await getJson(srv.base, '/admin/kv/blocks/device/99999999')).status, 404);
  assert.equal((await getJson(srv.base, '/admin/kv/blocks/device/x')).status, 404);
});

// ---- the map ------------------------------------------------------------------

test('the map shows used blocks during a streaming generation and cached ones after', async () => {
  await postJson(srv.base, '/reset_prefix_cache', {}, admin);
  const before = await kvMap(srv.base);
  const dev0 = before.tiers[0];
  assert.equal(before.block_size, 16);
  assert.equal(dev0.name, 'device');
  assert.equal(dev0.state.length, dev0.n_blocks);
  assert.equal(dev0.tenant.length, dev0.n_blocks);
  assert.equal(dev0.refcount.length, dev0.n_blocks);
  assert.equal(dev0.state[0], 'n'); // the null block
  assert.equal(cells(dev0, 'u').length, 0);
  assert.equal(before.tiers[1].name, 'cpu');

  const s = stream(srv.base, { prompt: LONG, max_tokens: 150, ignore_eos: true },
    authHeaders(API_KEY));
  await s.first;
  const during = await kvMap(srv.base);
  const text = await s.done;
  assert.ok(text.includes('data: [DONE]'));
  const used = cells(during.tiers[0], 'u');
  assert.ok(used.length >= 4, `used cells during generation: ${used.length}`);
  for (const b of used) {
    assert.equal(during.tiers[0].tenant[b], 0);
    assert.ok(during.tiers[0].refcount[b] >= 1);
  }
  assert.equal(during.sequences.length, 1);
  const seq = during.sequences[0];
  assert.equal(seq.tier, 'device');
  assert.equal(seq.tenant, 0);
  assert.deepEqual([...seq.blocks].sort((a, b) => a - b), used);
  assert.ok(seq.n_tokens > 48 && seq.n_tokens <= seq.blocks.length * 16, JSON.stringify(seq));
  assert.ok(during.step > before.step);

  const stats = await waitIdle(srv.base);
  const afterMap = await kvMap(srv.base);
  const dev = afterMap.tiers[0];
  assert.equal(cells(dev, 'u').length, 0);
  assert.equal(afterMap.sequences.length, 0);
  const cached = cells(dev, 'c');
  // Every full block of prompt + output stays cached: the last partial one is freed.
  assert.ok(cached.length >= Math.floor(seq.n_tokens / 16), `cached ${cached.length}`);
  assert.equal(cached.length, stats.kv.device_cached);
  for (const b of cached) {
    assert.equal(dev.tenant[b], 0);
    assert.equal(dev.refcount[b], 0);
  }
  // The admin key alone shows the hash but never token text.
  const detail = await getJson(srv.base, `/admin/kv/blocks/device/${cached[0]}`);
  assert.equal(detail.status, 200);
  assert.equal(detail.json.state, 'c');
  assert.match(detail.json.hash, /^[0-9a-f]{16}$/);
  assert.equal(detail.json.tokens, null);
  assert.equal(detail.json.text, null);
  assert.match(detail.json.tokens_hidden, /tenant key/);
  // With the default tenant's key: its tokens and their text.
  const own = await getJson(srv.base, `/admin/kv/blocks/device/${cached[0]}`,
    { ...admin, 'X-Kvserve-Tenant-Key': API_KEY });
  assert.equal(own.json.tokens.length, 16);
  assert.equal(typeof own.json.text, 'string');
  assert.equal(own.json.tokens_hidden, null);
});

test('two requests with the same long prompt share blocks: refcount 2 cells', async () => {
  await waitIdle(srv.base);
  const body = { prompt: `${LONG}, that he is considered`, max_tokens: 150, ignore_eos: true };
  const a = stream(srv.base, body, authHeaders(API_KEY));
  const b = stream(srv.base, body, authHeaders(API_KEY));
  await Promise.all([a.first, b.first]);
  const m = await kvMap(srv.base);
  await Promise.all([a.done, b.done]);
  const dev = m.tiers[0];
  const shared = [];
  for (let i = 0; i < dev.n_blocks; i++) {
    if (dev.refcount[i] === 2) {
      shared.push(i);
    }
  }
  assert.equal(m.sequences.length, 2, JSON.stringify(m.sequences));
  assert.ok(shared.length >= 3, `refcount-2 cells: ${shared}`);
  // They are the two sequences' common leading blocks.
  const [s1, s2] = m.sequences;
  for (let k = 0; k < shared.length; k++) {
    assert.equal(s1.blocks[k], s2.blocks[k]);
    assert.ok(shared.includes(s1.blocks[k]));
  }
  const detail = await getJson(srv.base, `/admin/kv/blocks/device/${shared[0]}`);
  if (detail.json.state === 'u') { // still running when asked
    assert.equal(detail.json.refcount, 2);
  }
  const stats = await waitIdle(srv.base);
  assert.ok(stats.prefix_cache.hits > 0);
});

test('/admin/stats: counters, latency percentiles, tenants', async () => {
  const s = (await getJson(srv.base, '/admin/stats')).json;
  assert.ok(s.uptime_s > 0);
  assert.ok(s.step > 0);
  assert.ok(s.prompt_tokens_total > 0 && s.generation_tokens_total >= 450);
  assert.ok(s.ttft_ms.p50 > 0 && s.ttft_ms.p99 >= s.ttft_ms.p50, JSON.stringify(s.ttft_ms));
  assert.ok(s.itl_ms.p50 >= 0 && s.itl_ms.p99 >= s.itl_ms.p50, JSON.stringify(s.itl_ms));
  assert.ok(s.prefix_cache.queries >= s.prefix_cache.hits);
  assert.ok(s.prefix_cache.hit_rate > 0 && s.prefix_cache.hit_rate <= 1);
  assert.equal(typeof s.preemptions.recompute, 'number');
  assert.equal(typeof s.preemptions.swap, 'number');
  assert.ok(s.kv.device_blocks > 0);
  assert.equal(s.tenants.length, 1);
  assert.equal(s.tenants[0].name, 'default');
  assert.equal(s.tenants[0].kv_quota_blocks, s.kv.device_blocks);
  assert.equal(s.tenants[0].generation_tokens_total, s.generation_tokens_total);
});

test('POST /reset_prefix_cache empties the cached set', async () => {
  await waitIdle(srv.base);
  const m0 = await kvMap(srv.base);
  const n = cells(m0.tiers[0], 'c').length + cells(m0.tiers[1], 'c').length;
  assert.ok(n > 0);
  const r = await postJson(srv.base, '/reset_prefix_cache', '', admin);
  assert.equal(r.status, 200, r.text);
  assert.deepEqual(r.json, { reset: true, blocks_freed: n });
  const m1 = await kvMap(srv.base);
  assert.equal(cells(m1.tiers[0], 'c').length, 0);
  assert.equal(cells(m1.tiers[1], 'c').length, 0);
  const again = await postJson(srv.base, '/reset_prefix_cache', '', admin);
  assert.deepEqual(again.json, { reset: true, blocks_freed: 0 });
  await waitKvEmpty(srv.base);
});

// ---- the cpu tier -------------------------------------------------------------

test('a tiny pool with --swap-space puts blocks on the cpu tier', async () => {
  const s = await startServer(['--admin-api-key', ADMIN, '--num-kv-blocks', '24',
    '--swap-space', '0.002', '--max-num-seqs', '8']);
  try {
    const m0 = await kvMap(s.base);
    assert.equal(m0.tiers[0].n_blocks, 24);
    assert.ok(m0.tiers[1].n_blocks >= 16, `cpu blocks ${m0.tiers[1].n_blocks}`);
    const streams = Array.from({ length: 6 }, (_, i) => stream(s.base,
      { prompt: `${LONG} (${i})`, max_tokens: 150, ignore_eos: true }));
    let sawCpuUsed = false;
    let sawCpuSeq = false;
    let finished = false;
    const all = Promise.all(streams.map((x) => x.done)).then(() => { finished = true; });
    while (!finished) {
      const m = await kvMap(s.base);
      sawCpuUsed ||= cells(m.tiers[1], 'u').length > 0;
      sawCpuSeq ||= m.sequences.some((q) => q.tier === 'cpu');
      for (const q of m.sequences) { // a swapped sequence's table names used cpu blocks
        const tier = m.tiers[q.tier === 'cpu' ? 1 : 0];
        for (const b of q.blocks) {
          assert.equal(tier.state[b], 'u', `${q.tier} block ${b} of sequence ${q.id}`);
        }
      }
      await new Promise((r) => setTimeout(r, 2));
    }
    await all;
    const stats = await waitIdle(s.base);
    const m1 = await kvMap(s.base);
    assert.ok(stats.preemptions.swap > 0, JSON.stringify(stats.preemptions));
    // Swapped sequences held cpu blocks (seen while they were out, if the
    // poll caught them); their full blocks and demoted ones stay cached there.
    const cpuCached = cells(m1.tiers[1], 'c').length;
    assert.ok(sawCpuUsed || cpuCached > 0, 'nothing ever showed on the cpu tier');
    assert.equal(sawCpuSeq, sawCpuUsed);
    assert.equal(cpuCached, stats.kv.cpu_cached);
    for (const b of cells(m1.tiers[1], 'c')) {
      assert.equal(m1.tiers[1].tenant[b], 0);
    }
  } finally {
    assert.equal((await s.stop()).code, 0);
  }
});

// ---- tenants ------------------------------------------------------------------

test("a tenant key never gets another tenant's tokens", async () => {
  const keys = { acme: 'sk-acme-console', globex: 'sk-globex-console' };
  const conf = tmpFile('kvserve.conf', Object.entries(keys).flatMap(([name, key]) => [
    `[tenant ${name}]`,
    `api_key_sha256 = ${createHash('sha256').update(key).digest('hex')}`,
    'max_kv_share = 0.5',
    '',
  ]).join('\n'));
  const s = await startServer(['--admin-api-key', ADMIN, '--config', conf]);
  const as = (name) => ({ ...admin, 'X-Kvserve-Tenant-Key': keys[name] });
  try {
    const m0 = await kvMap(s.base);
    assert.deepEqual(m0.tenants.map((t) => t.name), ['default', 'acme', 'globex']);
    const acme = m0.tenants.find((t) => t.name === 'acme').id;
    const st = stream(s.base, { prompt: LONG, max_tokens: 150, ignore_eos: true },
      authHeaders(keys.acme));
    await st.first;
    const m = await kvMap(s.base);
    const seq = m.sequences.find((q) => q.tenant === acme);
    assert.ok(seq, JSON.stringify(m.sequences));
    const block = seq.blocks[0];
    assert.equal(m.tiers[0].tenant[block], acme);
    const views = {};
    for (const who of ['acme', 'globex']) {
      views[who] = (await getJson(s.base, `/admin/kv/blocks/device/${block}`, as(who))).json;
    }
    views.none = (await getJson(s.base, `/admin/kv/blocks/device/${block}`)).json;
    views.bad = (await getJson(s.base, `/admin/kv/blocks/device/${block}`,
      { ...admin, 'X-Kvserve-Tenant-Key': ADMIN })).json;
    await st.done;
    assert.equal(views.acme.tokens.length, 16);
    assert.match(views.acme.text, /truth universally/);
    assert.equal(views.acme.tokens_hidden, null);
    for (const who of ['globex', 'none', 'bad']) {
      assert.equal(views[who].tokens, null, who);
      assert.equal(views[who].text, null, who);
      assert.equal(typeof views[who].tokens_hidden, 'string', who);
    }
    assert.equal(views.globex.tokens_hidden, "another tenant's block");
    // Once cached (no holder), the same rule by salt.
    await waitIdle(s.base);
    const cachedView = (who) => getJson(s.base, `/admin/kv/blocks/device/${block}`, as(who));
    const ca = (await cachedView('acme')).json;
    assert.equal(ca.state, 'c');
    assert.deepEqual(ca.tokens, views.acme.tokens);
    const cg = (await cachedView('globex')).json;
    assert.equal(cg.tokens, null);
    assert.equal(cg.tokens_hidden, "another tenant's block");
    // Per-tenant usage against quota.
    const stats = (await getJson(s.base, '/admin/stats')).json;
    const t = stats.tenants.find((x) => x.name === 'acme');
    assert.equal(t.kv_quota_blocks, Math.floor(0.5 * stats.kv.device_blocks));
    assert.ok(t.generation_tokens_total >= 150);
    assert.equal(stats.tenants.find((x) => x.name === 'globex').generation_tokens_total, 0);
  } finally {
    assert.equal((await s.stop()).code, 0);
  }
});
