// soak.test.mjs - a bounded soak on loopback: 64 concurrent clients for a
// fixed time (KVSERVE_SOAK_SECONDS, default 120; KVSERVE_SOAK_CLIENTS,
// KVSERVE_SOAK_FLAGS the daemon's flags) with random sampling
// parameters and lengths, mostly streaming; about 10% drop the connection
// mid-stream, some cancel before the first token, some send malformed
// requests. Afterwards the daemon is alive and gives the same greedy answer
// as before, the KV pool is empty (every block FREE or CACHED), no request
// got a 5xx, and resident memory grew less than 5% between the end of the
// first minute and the end (not checked when KVSERVE_SANITIZED is set: the
// sanitizers' quarantine grows by design). Prints the figures.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import {
  MODEL_NAME, getMetrics, metricValue, postJson, rawRequest, parseRaw, startServer, validate,
  waitKvEmpty,
} from '../integration/lib.mjs';

const SECONDS = Number(process.env.KVSERVE_SOAK_SECONDS || 120);
const CLIENTS = Number(process.env.KVSERVE_SOAK_CLIENTS || 64);
const SANITIZED = Boolean(process.env.KVSERVE_SANITIZED);

const PROMPTS = [
  'Emma Woodhouse, handsome, clever, and rich,',
  'It is a truth universally acknowledged, that a single man',
  'The family of Dashwood had long been settled in Sussex.',
  'Sir Walter Elliot, of Kellynch Hall, in Somersetshire,',
  'No one who had ever seen Catherine Morland in her infancy',
  'She was the youngest of the two daughters of a most affectionate,',
];

// Deterministic PRNG so a failing run can be repeated (KVSERVE_SOAK_SEED).
let rngState = BigInt(process.env.KVSERVE_SOAK_SEED || 12345);
function rand() {
  rngState = (rngState * 6364136223846793005n + 1442695040888963407n) & ((1n << 64n) - 1n);
  return Number(rngState >> 11n) / 2 ** 53;
}
const pick = (a) => a[Math.floor(rand() * a.length)];
const randInt = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));

function rssKiB(pid) {
  const s = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(/VmRSS:\s+(\d+)/.exec(s)[1]);
}

function randomRequest(stream) {
  const chat = rand() < 0.3;
  const req = { model: MODEL_NAME, stream };
  if (chat) {
    req.messages = [{ role: 'user', content: pick(PROMPTS) }];
    req.max_completion_tokens = randInt(1, 48);
  } else {
    req.prompt = pick(PROMPTS);
    req.max_tokens = randInt(1, 64);
  }
  if (rand() < 0.7) req.temperature = Math.round(rand() * 200) / 100;
  if (rand() < 0.4) req.top_p = Math.round(rand() * 100) / 100 || 0.01;
  if (rand() < 0.4) req.top_k = randInt(0, 50);
  if (rand() < 0.3) req.min_p = Math.round(rand() * 30) / 100;
  if (rand() < 0.3) req.presence_penalty = Math.round((rand() * 4 - 2) * 10) / 10;
  if (rand() < 0.3) req.frequency_penalty = Math.round((rand() * 4 - 2) * 10) / 10;
  if (rand() < 0.2) req.repetition_penalty = 1 + Math.round(rand() * 50) / 100;
  if (rand() < 0.5) req.seed = randInt(0, 1 << 30);
  if (rand() < 0.2) req.stop = [pick([',', '.', ' the', '\n'])];
  if (rand() < 0.2) req.ignore_eos = true;
  if (rand() < 0.15) req.n = randInt(2, 3);
  if (stream && rand() < 0.3) req.stream_options = { include_usage: true };
  return { route: chat ? '/v1/chat/completions' : '/v1/completions', req, chat };
}

// One streaming request over http; dropAfter: destroy the socket after that
// many data chunks (0: cancel right after sending). Resolves with
// { status, events, done, dropped }.
function streamRequest(port, route, req, dropAfter = -1) {
  return new Promise((resolve, reject) => {
    const body = JSON.stringify(req);
    let chunks = 0;
    let text = '';
    let status = 0;
    let settled = false;
    const finish = (v) => {
      if (!settled) {
        settled = true;
        resolve(v);
      }
    };
    const r = http.request({
      host: '127.0.0.1', port, path: route, method: 'POST', agent: false,
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) },
    }, (res) => {
      status = res.statusCode;
      res.setEncoding('utf8');
      res.on('data', (d) => {
        text += d;
        chunks++;
        if (dropAfter > 0 && chunks >= dropAfter) {
          r.destroy();
          finish({ status, dropped: true });
        }
      });
      res.on('end', () => finish({ status, text, dropped: false }));
      res.on('error', () => finish({ status, dropped: true }));
    });
    r.on('error', (e) => {
      if (settled || dropAfter >= 0) {
        finish({ status, dropped: true });
      } else {
        reject(e);
      }
    });
    r.end(body);
    if (dropAfter === 0) {
      setTimeout(() => {
        r.destroy();
        finish({ status, dropped: true });
      }, randInt(0, 20));
    }
  });
}

function parseSse(text) {
  const events = [];
  let done = false;
  for (const block of text.split('\n\n')) {
    if (!block.trim()) continue;
    assert.ok(block.startsWith('data: '), `bad SSE block ${JSON.stringify(block)}`);
    const payload = block.slice(6);
    if (payload === '[DONE]') {
      done = true;
      continue;
    }
    assert.equal(done, false, 'data after [DONE]');
    events.push(JSON.parse(payload));
  }
  return { events, done };
}

const MALFORMED = [
  () => ({ body: '{"model":"x","prompt":', ct: 'application/json' }),
  () => ({ body: JSON.stringify({ model: MODEL_NAME, prompt: 'a', temperature: 5 }) }),
  () => ({ body: JSON.stringify({ model: MODEL_NAME, prompt: 'a', max_tokens: -3 }) }),
  () => ({ body: JSON.stringify({ model: MODEL_NAME, messages: 'hi' }), chat: true }),
  () => ({ body: JSON.stringify({ model: MODEL_NAME, prompt: [1e9] }) }),
  () => ({ body: JSON.stringify({ model: MODEL_NAME, prompt: 'a', logit_bias: { x: 1 } }) }),
  () => ({ body: '\xff\xfe garbage' }),
  () => ({ body: JSON.stringify({ model: MODEL_NAME, prompt: 'a', n: 1000 }) }),
];

async function malformed(srv, stats) {
  if (rand() < 0.3) {
    // Broken HTTP on a raw socket.
    // An unknown HTTP version is answered 505 by protocol (by libmicrohttpd,
    // before any route); everything else must be a 4xx or a closed socket.
    const [raw, ok505] = pick([
      ['GARBAGE / HTTP/1.1\r\n\r\n', false],
      ['POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{"a"', false],
      ['POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n{', false],
      ['GET /v1/models HTTP/9.9\r\n\r\n', true],
    ]);
    // A server that answers before reading a whole body (the 413) and then
    // closes leaves unread bytes in its socket: the kernel sends a reset,
    // which can reach us before the answer does. That is a closed socket.
    const text = await rawRequest(srv.port, raw, { idleMs: 300 }).catch((e) => {
      if (e.code === 'ECONNRESET') return '';
      throw e;
    });
    const { status } = parseRaw(text);
    assert.ok(status === 0 || status < 500 || (ok505 && status === 505),
      `malformed raw request answered ${status}`);
    stats.malformed++;
    return;
  }
  const m = pick(MALFORMED)();
  const r = await postJson(srv.base, m.chat ? '/v1/chat/completions' : '/v1/completions', m.body,
    {});
  assert.ok(r.status >= 400 && r.status < 500, `malformed request got ${r.status}: ${r.text}`);
  validate('ErrorResponse', r.json);
  stats.malformed++;
}

async function normal(srv, stats) {
  const stream = rand() < 0.85;
  const { route, req, chat } = randomRequest(stream);
  if (!stream) {
    const r = await postJson(srv.base, route, req, {});
    stats.status[r.status] = (stats.status[r.status] || 0) + 1;
    assert.equal(r.status, 200, r.text);
    validate(chat ? 'CreateChatCompletionResponse' : 'CreateCompletionResponse', r.json);
    stats.completed++;
    stats.tokens += r.json.usage.completion_tokens;
    return;
  }
  const res = await streamRequest(srv.port, route, req);
  stats.status[res.status] = (stats.status[res.status] || 0) + 1;
  assert.equal(res.status, 200, res.text);
  const { events, done } = parseSse(res.text);
  assert.ok(done, 'stream without [DONE]');
  const finished = new Set();
  for (const e of events) {
    assert.equal(e.error, undefined, JSON.stringify(e));
    validate(chat ? 'CreateChatCompletionStreamResponse' : 'CreateCompletionStreamResponse', e);
    for (const c of e.choices) {
      if (c.finish_reason) {
        assert.ok(['stop', 'length'].includes(c.finish_reason), c.finish_reason);
        finished.add(c.index);
      } else {
        stats.tokens++;
      }
    }
  }
  assert.equal(finished.size, req.n || 1, 'every choice finished');
  stats.completed++;
}

async function client(srv, deadline, stats) {
  while (Date.now() < deadline) {
    const x = rand();
    if (x < 0.10) {
      const { route, req } = randomRequest(true);
      req.max_tokens = req.max_completion_tokens = undefined;
      req.max_tokens = 200;
      req.ignore_eos = true;
      const r = await streamRequest(srv.port, route, req, randInt(1, 6));
      assert.ok(r.status === 0 || r.status === 200, `dropped stream got ${r.status}`);
      stats.dropped++;
    } else if (x < 0.15) {
      const { route, req } = randomRequest(true);
      await streamRequest(srv.port, route, req, 0);
      stats.cancelled++;
    } else if (x < 0.20) {
      await malformed(srv, stats);
    } else {
      await normal(srv, stats);
    }
  }
}

const greedy = { model: MODEL_NAME, prompt: PROMPTS[0], max_tokens: 32, temperature: 0 };

test(`soak: ${CLIENTS} clients for ${SECONDS} s`, { timeout: (SECONDS + 240) * 1000 }, async () => {
  // The KV pool and the CPU tier are committed at start, so RSS growth
  // after the first minute means a leak. KVSERVE_SOAK_FLAGS replaces the
  // flags below ('' for the defaults, as a user runs it).
  const flags = process.env.KVSERVE_SOAK_FLAGS !== undefined
    ? process.env.KVSERVE_SOAK_FLAGS.split(/\s+/).filter(Boolean)
    : ['--max-num-seqs', '32', '--drain-timeout', '5', '--swap-space', '0.0625'];
  const srv = await startServer(flags);
  try {
    const before = await postJson(srv.base, '/v1/completions', greedy, {});
    assert.equal(before.status, 200);
    const stats = {
      completed: 0, dropped: 0, cancelled: 0, malformed: 0, tokens: 0, status: {},
    };
    const t0 = Date.now();
    const deadline = t0 + SECONDS * 1000;
    const rss = [];
    let rssMinute = null;
    const sampler = setInterval(() => {
      const kib = rssKiB(srv.proc.pid);
      rss.push(kib);
      if (rssMinute === null && Date.now() - t0 >= Math.min(60, SECONDS / 2) * 1000) {
        rssMinute = kib;
      }
    }, 1000);
    try {
      await Promise.all(Array.from({ length: CLIENTS }, () => client(srv, deadline, stats)));
    } finally {
      clearInterval(sampler);
    }
    await waitKvEmpty(srv.base, 30000);
    const rssEnd = rssKiB(srv.proc.pid);
    const m = await getMetrics(srv.base);
    const after = await postJson(srv.base, '/v1/completions', greedy, {});
    assert.equal(after.status, 200);
    assert.equal(after.json.choices[0].text, before.json.choices[0].text,
      'greedy answer changed after the soak');
    const fivexx = m.split('\n').filter((l) => /^kvserve:http_requests_total\{.*code="5xx"/.test(l))
      .reduce((s, l) => s + Number(l.split(' ').at(-1)), 0);
    const used = metricValue(m, 'kvserve:kv_blocks', 'tier="device",state="used"');
    const cached = metricValue(m, 'kvserve:kv_blocks', 'tier="device",state="cached"');
    const total = metricValue(m, 'kvserve:kv_blocks', 'tier="device",state="total"');
    const growth = (rssEnd - rssMinute) / rssMinute * 100;
    const secs = (Date.now() - t0) / 1000;
    console.log(`soak figures: ${secs.toFixed(0)} s, ${CLIENTS} clients; completed ${stats.completed}`
      + ` (${(stats.completed / secs).toFixed(1)}/s), dropped mid-stream ${stats.dropped},`
      + ` cancelled ${stats.cancelled}, malformed ${stats.malformed}; ${stats.tokens} tokens`
      + ` streamed; client statuses ${JSON.stringify(stats.status)}; 5xx in /metrics ${fivexx};`
      + ` disconnects ${metricValue(m, 'kvserve:client_disconnects_total')};`
      + ` preemptions ${metricValue(m, 'kvserve:num_preemptions_total', 'kind="swap"')} swap`
      + ` ${metricValue(m, 'kvserve:num_preemptions_total', 'kind="recompute"')} recompute;`
      + ` KV device blocks used ${used}, cached ${cached}, total ${total};`
      + ` RSS first minute ${rssMinute} KiB, end ${rssEnd} KiB (${growth.toFixed(2)}%),`
      + ` max ${Math.max(...rss)} KiB`);
    assert.equal(fivexx, 0, 'a request got a 5xx');
    assert.equal(used, 0);
    assert.ok(stats.completed > 0 && stats.dropped > 0 && stats.malformed > 0);
    if (!SANITIZED) {
      assert.ok(growth < 5, `RSS grew ${growth.toFixed(2)}% after the first minute`);
    }
  } finally {
    const st = await srv.stop();
    assert.equal(st.code, 0, srv.logs.slice(-20).join('\n'));
  }
});
