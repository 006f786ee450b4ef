// faults.test.mjs - lifecycle faults.
//  * Allocation failure. Every allocation a request makes goes through the
//    fallible allocator (common/xmalloc.h). With KVSERVE_TEST_HOOKS=1 the
//    daemon answers GET /debug/allocs (fallible allocations so far) and
//    POST /debug/fail-alloc?after=N (the N-th following one fails, once;
//    re-armable, so one daemon serves every site). For each request kind
//    below a counting run finds how many allocation sites the request has
//    (deterministic: the same request, repeated, makes the same
//    allocations; the count must stay above a floor so that a regression
//    back to aborting allocations fails here), then for every site N:
//    arm N, send the request, and check that the failure fired inside that
//    request and gave a clean error (a 503 OpenAI ErrorResponse, or for a
//    stream whose headers were already out, an error event then [DONE]),
//    and that the next identical request succeeds with the same text.
//    Arming one past the last site leaves the request untouched (the
//    count is exact). The loop thread and the engine thread count in
//    separate domains (common/xmalloc.h: their calls for one request
//    interleave differently from run to run, each domain's own order is
//    fixed), so the sites are enumerated per domain: the loop's (parse,
//    tokenize, records, bodies, SSE chunks) and the engine's
//    (?domain=engine: the reserve and the scheduler's records at submit,
//    a DELTA per token). At the end no KV block is in use, no request is
//    in flight, the 5xx counters match and the daemon exits 0.
//  * The same for prompts with combining characters under a tokenizer that
//    normalizes to NFC (text/tok_nfc.c), on a copy of the default model
//    whose tokenizer.json adds the NFC normalizer.
//  * KVSERVE_FAIL_ALLOC_AFTER=N arms the same failure from the start.
//  * A forward failure is the server's fault: 500, never 4xx.
//  * SIGTERM with 24 requests accepted, most of them queued: all complete.
//  * A second SIGTERM during a drain ends the open streams with an error
//    event and [DONE] (never a torn response) and the daemon exits.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  MODEL_NAME, getMetrics, metricValue, postJson, readSse, startServer, validate, waitKvEmpty,
} from '../integration/lib.mjs';

const OOM = /out of memory/;

async function allocs(base) {
  const res = await fetch(`${base}/debug/allocs`);
  const text = await res.text();
  assert.equal(res.status, 200, `/debug/allocs: ${res.status} ${text}`);
  return JSON.parse(text);
}

async function armFailure(base, n, domain = 'loop') {
  const res = await fetch(`${base}/debug/fail-alloc?after=${n}&domain=${domain}`,
    { method: 'POST' });
  const text = await res.text();
  assert.equal(res.status, 200, text);
}

// Sends a request; a stream is read to its end and parsed.
async function send(base, kind) {
  if (!kind.stream) {
    return postJson(base, kind.route, kind.body, {});
  }
  const res = await fetch(base + kind.route, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(kind.body),
  });
  if (res.status !== 200) {
    const text = await res.text();
    let json = null;
    try {
      json = JSON.parse(text);
    } catch {
      json = null;
    }
    return { status: res.status, text, json };
  }
  return { status: 200, ...(await readSse(res)) };
}

const prompt2 = ['Emma Woodhouse, handsome,', 'It is a truth'];
const KINDS = [
  {
    name: 'completion, two prompts, logit_bias', route: '/v1/completions', ep: '/v1/completions',
    body: { model: MODEL_NAME, prompt: prompt2, max_tokens: 4, temperature: 0, logit_bias: { 5: 1 } },
    floor: 60,
    engineFloor: 12, // per prompt: reserve + FINISHED, record, sequences, tokens, DELTAs
    result: (r) => r.json.choices.map((c) => c.text),
  },
  {
    name: 'chat completion, stop strings', route: '/v1/chat/completions', ep: '/v1/chat/completions',
    body: {
      model: MODEL_NAME, max_tokens: 4, temperature: 0, stop: ['zzz', 'Qq'],
      messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Who is Emma?' }],
    },
    floor: 50,
    engineFloor: 6,
    result: (r) => r.json.choices.map((c) => c.message.content),
  },
  {
    name: 'streaming completion', route: '/v1/completions', ep: '/v1/completions', stream: true,
    body: {
      model: MODEL_NAME, prompt: 'Emma Woodhouse, handsome,', max_tokens: 4, temperature: 0,
      stream: true, stream_options: { include_usage: true }, logprobs: 1,
    },
    floor: 40,
    engineFloor: 6,
    result: (r) => {
      assert.ok(r.done, 'stream ended with [DONE]');
      assert.ok(r.events.every((e) => e.error === undefined), JSON.stringify(r.events.at(-1)));
      assert.ok(r.events.at(-1).usage, 'usage chunk last');
      return r.events.filter((e) => e.choices.length > 0).map((e) => e.choices[0].text).join('');
    },
  },
  {
    name: '/tokenize (prompt)', route: '/tokenize', ep: '/tokenize',
    body: { model: MODEL_NAME, prompt: 'Emma Woodhouse, handsome, clever, and rich' },
    floor: 15,
    engineFloor: 0,
    result: (r) => r.json.tokens,
  },
  {
    name: '/tokenize (messages)', route: '/tokenize', ep: '/tokenize',
    body: { model: MODEL_NAME, messages: [{ role: 'user', content: 'Who is Emma?' }] },
    floor: 20,
    engineFloor: 0,
    result: (r) => r.json.tokens,
  },
];

function checkOk(kind, r) {
  assert.equal(r.status, 200, `${kind.name}: ${r.status} ${r.text}`);
  return kind.result(r);
}

// Fails every site of one domain in turn (see the file comment); returns
// how many failures were a plain 503 and how many an in-stream error.
async function failEachSite(srv, kind, ref, domain, sites) {
  const pendingKey = domain === 'engine' ? 'engine_pending' : 'pending';
  let plain = 0;
  let events = 0;
  for (let n = 1; n <= sites; n++) {
    await armFailure(srv.base, n, domain);
    const r = await send(srv.base, kind);
    const left = await allocs(srv.base);
    assert.equal(left[pendingKey], 0,
      `${kind.name}, ${domain} site ${n}/${sites}: the failure did not fire inside the request`);
    if (r.status === 503) {
      validate('ErrorResponse', r.json);
      assert.match(r.json.error.message, OOM, r.text);
      assert.equal(r.json.error.type, 'service_unavailable_error');
      plain++;
    } else {
      // Only a stream whose headers were out may fail in-band.
      assert.ok(kind.stream && r.status === 200,
        `${kind.name}, ${domain} site ${n}/${sites}: ${r.status} ${r.text ?? ''}`);
      assert.ok(r.done, `${kind.name}, ${domain} site ${n}: no [DONE]`);
      const last = r.events.at(-1);
      assert.ok(last && last.error,
        `${kind.name}, ${domain} site ${n}: last event ${JSON.stringify(last)}`);
      assert.match(last.error.message, OOM);
      r.events.slice(0, -1).forEach((e) => validate('CreateCompletionStreamResponse', e));
      events++;
    }
    const again = await send(srv.base, kind);
    assert.deepEqual(checkOk(kind, again), ref, `${kind.name}, after ${domain} site ${n}`);
  }
  return { plain, events };
}

// Counts, then fails, every loop and engine site of each kind; returns the
// report lines and the 5xx answers per endpoint.
async function enumerateKinds(srv, kinds) {
  const report = [];
  const expect5xx = {};
  for (const kind of kinds) {
    const t0 = Date.now();
    // Reference and warm-up (first-use allocations are not per request).
    const ref = checkOk(kind, await send(srv.base, kind));
    // Counting run: what one /debug/allocs costs, then one more request
    // (a non-streamed answer or [DONE] comes after the engine's last word,
    // so its engine allocations are all counted).
    const c0 = await allocs(srv.base);
    const c1 = await allocs(srv.base);
    assert.deepEqual(checkOk(kind, await send(srv.base, kind)), ref);
    const c2 = await allocs(srv.base);
    const sites = c2.count - c1.count - (c1.count - c0.count);
    const engineSites = c2.engine_count - c1.engine_count;
    assert.equal(c1.engine_count, c0.engine_count, '/debug/allocs allocated on the engine');
    assert.ok(sites >= kind.floor,
      `${kind.name}: only ${sites} fallible allocations (floor ${kind.floor}): ` +
      'did the request path go back to aborting allocations?');
    assert.ok(engineSites >= kind.engineFloor,
      `${kind.name}: only ${engineSites} fallible engine allocations ` +
      `(floor ${kind.engineFloor}): did the engine go back to aborting allocations?`);
    const loop = await failEachSite(srv, kind, ref, 'loop', sites);
    const eng = await failEachSite(srv, kind, ref, 'engine', engineSites);
    const plain = loop.plain + eng.plain;
    expect5xx[kind.ep] = (expect5xx[kind.ep] ?? 0) + plain;
    // One past the last site: the request is untouched and the failure
    // lands on the next allocation, the record of the next request.
    await armFailure(srv.base, sites + 1);
    assert.deepEqual(checkOk(kind, await send(srv.base, kind)), ref,
      `${kind.name}: more than ${sites} sites`);
    const res = await fetch(`${srv.base}/debug/allocs`);
    assert.equal(res.status, 503, `${kind.name}: fewer than ${sites} sites`);
    await res.arrayBuffer();
    assert.equal((await allocs(srv.base)).pending, 0);
    // The same on the engine: one call left over, then disarmed.
    await armFailure(srv.base, engineSites + 1, 'engine');
    assert.deepEqual(checkOk(kind, await send(srv.base, kind)), ref,
      `${kind.name}: more than ${engineSites} engine sites`);
    assert.equal((await allocs(srv.base)).engine_pending, 1,
      `${kind.name}: fewer than ${engineSites} engine sites`);
    await armFailure(srv.base, 0, 'engine');
    report.push(`${kind.name}: ${sites} loop + ${engineSites} engine sites (${plain} plain 503, ` +
      `${loop.events + eng.events} in-stream), ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  }
  return { report, expect5xx };
}

async function checkEnd(srv, expect5xx) {
  await waitKvEmpty(srv.base);
  const m = await getMetrics(srv.base);
  assert.equal(metricValue(m, 'kvserve:requests_in_flight'), 0);
  for (const [route, n] of Object.entries(expect5xx)) {
    assert.equal(metricValue(m, 'kvserve:http_requests_total', `route="${route}",code="5xx"`) ?? 0,
      n, `5xx count of ${route}`);
  }
}

test('an allocation failure at each request-path site fails that request only', async () => {
  const srv = await startServer([], { env: { KVSERVE_TEST_HOOKS: '1' } });
  let report = [];
  try {
    const r = await enumerateKinds(srv, KINDS);
    report = r.report;
    await checkEnd(srv, r.expect5xx);
  } finally {
    const st = await srv.stop();
    assert.equal(st.code, 0, `exit ${st.code ?? st.sig}\n${srv.logs.slice(-30).join('\n')}`);
  }
  console.log(report.join('\n'));
});

// A copy of the default model (files linked) whose tokenizer normalizes
// to NFC first, as Qwen2-style tokenizer.json files do.
function nfcModel() {
  const src = process.env.KVSERVE_MODEL;
  assert.ok(src, 'KVSERVE_MODEL is not set');
  // Same base name: the served model name comes from it.
  const dir = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-nfc-')), path.basename(src));
  fs.mkdirSync(dir);
  for (const f of fs.readdirSync(src)) {
    if (f !== 'tokenizer.json') {
      fs.symlinkSync(path.join(src, f), path.join(dir, f));
    }
  }
  const tok = JSON.parse(fs.readFileSync(path.join(src, 'tokenizer.json'), 'utf8'));
  const norm = tok.normalizer;
  tok.normalizer = {
    type: 'Sequence',
    normalizers: [{ type: 'NFC' }, ...(norm?.type === 'Sequence' ? norm.normalizers : [norm])],
  };
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tok));
  return dir;
}

// Combining acute accents (U+0301) that NFC composes: the prompt goes
// through text/tok_nfc.c, whose allocations fail like any other.
const DECOMPOSED = 'Emma Woodhouse, handsome, cafe\u0301 and ble\u0301 clever';
const PRECOMPOSED = 'Emma Woodhouse, handsome, caf\u00e9 and bl\u00e9 clever';
const NFC_KINDS = [
  {
    name: '/tokenize (combining characters)', route: '/tokenize', ep: '/tokenize',
    body: { model: MODEL_NAME, prompt: DECOMPOSED },
    floor: 15,
    engineFloor: 0,
    result: (r) => r.json.tokens,
  },
  {
    name: 'completion (combining characters)', route: '/v1/completions', ep: '/v1/completions',
    body: { model: MODEL_NAME, prompt: DECOMPOSED, max_tokens: 4, temperature: 0 },
    floor: 30,
    engineFloor: 6,
    result: (r) => r.json.choices.map((c) => c.text),
  },
];

test('NFC of a prompt with combining characters fails cleanly at each site', async () => {
  const dir = nfcModel();
  const saved = process.env.KVSERVE_MODEL;
  process.env.KVSERVE_MODEL = dir;
  let srv;
  try {
    srv = await startServer([], { env: { KVSERVE_TEST_HOOKS: '1' } });
  } finally {
    process.env.KVSERVE_MODEL = saved;
  }
  let report = [];
  try {
    // NFC is on: the decomposed prompt tokenizes as the precomposed one,
    // and costs the normalizer's allocations on top.
    const pre = { ...NFC_KINDS[0], body: { model: MODEL_NAME, prompt: PRECOMPOSED } };
    const refPre = checkOk(pre, await send(srv.base, pre));
    assert.deepEqual(checkOk(NFC_KINDS[0], await send(srv.base, NFC_KINDS[0])), refPre);
    const a0 = await allocs(srv.base);
    checkOk(pre, await send(srv.base, pre));
    const a1 = await allocs(srv.base);
    checkOk(NFC_KINDS[0], await send(srv.base, NFC_KINDS[0]));
    const a2 = await allocs(srv.base);
    assert.ok(a2.count - a1.count >= a1.count - a0.count + 4,
      `NFC sites missing: ${a1.count - a0.count} precomposed, ${a2.count - a1.count} decomposed`);
    const r = await enumerateKinds(srv, NFC_KINDS);
    report = r.report;
    await checkEnd(srv, r.expect5xx);
  } finally {
    const st = await srv.stop();
    fs.rmSync(path.dirname(dir), { recursive: true, force: true });
    assert.equal(st.code, 0, `exit ${st.code ?? st.sig}\n${srv.logs.slice(-30).join('\n')}`);
  }
  console.log(report.join('\n'));
});

test('KVSERVE_FAIL_ALLOC_AFTER arms the failure from the start', async () => {
  const srv = await startServer([], { env: { KVSERVE_FAIL_ALLOC_AFTER: '1' } });
  try {
    const req = KINDS[0];
    const r1 = await send(srv.base, req);
    assert.equal(r1.status, 503, r1.text);
    validate('ErrorResponse', r1.json);
    assert.match(r1.json.error.message, OOM);
    const r2 = await send(srv.base, req);
    assert.equal(r2.status, 200, r2.text);
    await waitKvEmpty(srv.base);
  } finally {
    const st = await srv.stop();
    assert.equal(st.code, 0, srv.logs.slice(-10).join('\n'));
  }
});

test('a failed forward is a server error (500), not the client\'s', async () => {
  // KVSERVE_TEST_FAIL_FORWARD_AT=2: the first forward pass after the
  // start-up's warm-up step fails and the engine fails every open request
  // with the forward's status.
  const srv = await startServer([], { env: { KVSERVE_TEST_FAIL_FORWARD_AT: '2' } });
  try {
    const r = await postJson(srv.base, '/v1/completions',
      { model: MODEL_NAME, prompt: 'Emma', max_tokens: 4 }, {});
    assert.equal(r.status, 500, r.text);
    validate('ErrorResponse', r.json);
    assert.equal(r.json.error.type, 'server_error');
  } finally {
    await srv.stop();
  }
});

test('a second SIGTERM during the drain ends every stream with an error event', async () => {
  const srv = await startServer(['--drain-timeout', '120']);
  const long = {
    model: MODEL_NAME, prompt: 'Emma', max_tokens: 250, ignore_eos: true, stream: true,
  };
  // Every stream has its headers (200) before the signals: a request
  // whose stream has not begun is answered 503 by the drain instead.
  const responses = await Promise.all(Array.from({ length: 6 }, () => fetch(
    `${srv.base}/v1/completions`,
    { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(long) },
  )));
  for (const res of responses) {
    assert.equal(res.status, 200);
  }
  const streams = responses.map((res) => readSse(res));
  // The second signal goes as soon as the first has started the drain (a
  // fixed pause let all six streams finish first on a fast machine; two
  // signals sent back to back can merge into one).
  srv.proc.kill('SIGTERM');
  const drainDeadline = Date.now() + 10000;
  while (!srv.logs.some((l) => /signal 15: draining/.test(l))) {
    assert.ok(Date.now() < drainDeadline, 'the first SIGTERM did not start a drain');
    await new Promise((r) => setTimeout(r, 2));
  }
  srv.proc.kill('SIGTERM');
  const results = await Promise.all(streams);
  let ended = 0;
  for (const { events, done } of results) {
    assert.ok(done, 'stream ended with [DONE]');
    const last = events.at(-1);
    if (last.error !== undefined) {
      ended++;
      assert.ok(last.error.message, JSON.stringify(last));
    } else {
      // Finished before the second signal: complete and well-formed.
      validate('CreateCompletionStreamResponse', last);
      assert.equal(last.choices[0].finish_reason, 'length');
    }
  }
  assert.ok(ended >= 1, 'no stream was cut by the second SIGTERM');
  const st = await srv.exited;
  assert.ok(st.code !== null, `daemon died of ${st.sig}`);
  console.log(`second SIGTERM: ${ended} of 6 streams ended with an error event, exit ${st.code}`);
});

test('SIGTERM with a queue loses no accepted request', async () => {
  const srv = await startServer(['--max-num-seqs', '4', '--drain-timeout', '300']);
  const N = 24;
  const r = { model: MODEL_NAME, prompt: 'Emma', max_tokens: 200, ignore_eos: true };
  let settled = 0;
  const all = Array.from({ length: N }, (_, i) => postJson(srv.base, '/v1/completions',
    { ...r, stream: i % 2 === 0 }, {}).finally(() => settled++));
  // Awaited below; marked handled now so that a failure in the wait loop
  // (which kills the daemon) reports its own message, not 24 rejections.
  all.forEach((p) => p.catch(() => {}));
  try {
    // requests_in_flight counts at the HTTP layer at once; the engine's
    // queue gauges are a snapshot published after its next step, so wait
    // for both rather than read them in the same instant.
    for (;;) {
      const m = await getMetrics(srv.base);
      assert.equal(settled, 0, 'a request finished before all were accepted');
      if (metricValue(m, 'kvserve:requests_in_flight') >= N &&
          metricValue(m, 'kvserve:num_requests_waiting') > 0) {
        break;
      }
      await new Promise((res) => setTimeout(res, 10));
    }
  } catch (e) {
    await srv.stop('SIGKILL');
    await Promise.allSettled(all);
    e.message += `\nserver log:\n${srv.logs.slice(-30).join('\n')}`;
    throw e;
  }
  srv.proc.kill('SIGTERM');
  const rs = await Promise.all(all);
  rs.forEach((x, i) => {
    assert.equal(x.status, 200, x.text);
    if (i % 2 === 0) {
      assert.ok(x.text.trimEnd().endsWith('data: [DONE]'), x.text.slice(-200));
      assert.ok(!x.text.includes('"error"'), x.text.slice(-300));
    } else {
      assert.equal(x.json.usage.completion_tokens, 200);
    }
  });
  const st = await srv.exited;
  assert.equal(st.code, 0, srv.logs.slice(-10).join('\n'));
});
