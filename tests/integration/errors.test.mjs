// errors.test.mjs - every bad-input class gets an OpenAI-style error:
// 400 (bad JSON, invalid UTF-8, \u0000, nesting, bounds, context), 401, 404,
// 405, 413, 429 with Retry-After, and malformed HTTP framing (duplicate
// Content-Length, Content-Length with Transfer-Encoding) over raw sockets.
import { after, afterEach, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import OpenAI from 'openai';
import {
  API_KEY, MODEL_NAME, authHeaders, getMetrics, metricValue, parseRaw, postJson, rawRequest, startServer, tmpFile,
  validate, waitKvEmpty,
} from './lib.mjs';

let srv;

before(async () => {
  srv = await startServer(['--api-key', API_KEY, '--max-body-bytes', '64K', '--max-n', '4']);
});

after(async () => {
  const st = await srv.stop('SIGTERM');
  assert.equal(st.code, 0, srv.logs.join('\n'));
});

afterEach(async () => {
  await waitKvEmpty(srv.base);
});

function expectError(r, status, param) {
  assert.equal(r.status, status, r.text);
  validate('ErrorResponse', r.json);
  assert.ok(r.json.error.message.length > 0);
  if (param !== undefined) {
    assert.equal(r.json.error.param, param);
  }
  return r.json.error;
}

const good = { model: MODEL_NAME, prompt: 'Emma', max_tokens: 2 };

test('400 for malformed bodies', async () => {
  expectError(await postJson(srv.base, '/v1/completions', '{"model":'), 400);
  expectError(await postJson(srv.base, '/v1/completions', '[1,2]'), 400);
  expectError(await postJson(srv.base, '/v1/completions', ''), 400);
  expectError(await postJson(srv.base, '/v1/completions',
    '{"model":"austen-2.7m","prompt":"a\\u0000b"}'), 400);
  const deep = '{"model":"austen-2.7m","prompt":"x","x":' + '['.repeat(200) + ']'.repeat(200) + '}';
  const e = expectError(await postJson(srv.base, '/v1/completions', deep), 400);
  assert.match(e.message, /nesting/);
  // Invalid UTF-8 needs raw bytes.
  const res = await fetch(`${srv.base}/v1/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...authHeaders() },
    body: Buffer.concat([Buffer.from('{"model":"austen-2.7m","prompt":"'),
      Buffer.from([0xff, 0xfe]), Buffer.from('"}')]),
  });
  const body = await res.json();
  assert.equal(res.status, 400);
  assert.match(body.error.message, /UTF-8/);
});

test('400 for out-of-bounds parameters', async () => {
  const cases = [
    [{ temperature: 3 }, 'temperature'],
    [{ top_p: 0 }, 'top_p'],
    [{ n: 5 }, 'n'],
    [{ n: 0 }, 'n'],
    [{ stop: ['a', 'b', 'c', 'd', 'e'] }, 'stop'],
    [{ logprobs: 9 }, 'logprobs'],
    [{ logit_bias: { 99999: 1 } }, 'logit_bias'],
    [{ max_tokens: 0 }, 'max_tokens'],
    [{ prompt: [] }, 'prompt'],
    [{ prompt: [1, 999999] }, 'prompt'],
    [{ presence_penalty: -2.5 }, 'presence_penalty'],
  ];
  for (const [patch, param] of cases) {
    expectError(await postJson(srv.base, '/v1/completions', { ...good, ...patch }), 400, param);
  }
  expectError(await postJson(srv.base, '/v1/chat/completions', {
    model: MODEL_NAME, messages: [{ role: 'user', content: [{ type: 'image_url', image_url: {} }] }],
  }), 400, 'messages');
  expectError(await postJson(srv.base, '/v1/chat/completions', {
    model: MODEL_NAME, messages: [{ role: 'tool', content: 'x' }],
  }), 400, 'messages');
});

test('400 naming the context limit', async () => {
  const e = expectError(await postJson(srv.base, '/v1/completions',
    { ...good, max_tokens: 100000 }), 400, 'max_tokens');
  assert.match(e.message, /maximum context length is \d+ tokens/);
  const long = 'Emma '.repeat(400);
  const e2 = expectError(await postJson(srv.base, '/v1/completions',
    { ...good, prompt: long }), 400, 'prompt');
  assert.match(e2.message, /maximum context length/);
});

test('401 without a valid key; health and metrics stay public', async () => {
  expectError(await postJson(srv.base, '/v1/completions', good, {}), 401);
  expectError(await postJson(srv.base, '/v1/completions', good, authHeaders('sk-wrong')), 401);
  const r = await fetch(`${srv.base}/v1/models`);
  assert.equal(r.status, 401);
  assert.equal((await fetch(`${srv.base}/health`)).status, 200);
  assert.equal((await fetch(`${srv.base}/metrics`)).status, 200);
  const client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'sk-wrong', maxRetries: 0 });
  await assert.rejects(client.models.list(), (err) => err.status === 401);
});

test('404 for unknown routes and models, 405 for wrong methods', async () => {
  let r = await fetch(`${srv.base}/v1/nothing`, { headers: authHeaders() });
  assert.equal(r.status, 404);
  validate('ErrorResponse', await r.json());
  const e = expectError(await postJson(srv.base, '/v1/completions',
    { ...good, model: 'gpt-4o' }), 404, 'model');
  assert.equal(e.code, 'model_not_found');
  r = await fetch(`${srv.base}/v1/completions`, { headers: authHeaders() });
  assert.equal(r.status, 405);
  assert.equal(r.headers.get('allow'), 'POST');
  validate('ErrorResponse', await r.json());
  r = await fetch(`${srv.base}/v1/models`, { method: 'DELETE', headers: authHeaders() });
  assert.equal(r.status, 405);
});

test('413 for oversized bodies, declared or chunked', async () => {
  const big = JSON.stringify({ ...good, prompt: 'x'.repeat(70 * 1024) });
  expectError(await postJson(srv.base, '/v1/completions', big), 413);
  const chunk = (s) => `${Buffer.byteLength(s).toString(16)}\r\n${s}\r\n`;
  const parts = [
    'POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ' + API_KEY +
      '\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n',
  ];
  for (let i = 0; i < 80; i++) {
    parts.push(chunk('x'.repeat(1024)));
  }
  parts.push('0\r\n\r\n');
  const resp = parseRaw(await rawRequest(srv.port, parts.join('')));
  assert.equal(resp.status, 413, resp.head);
  validate('ErrorResponse', resp.json);
});

test('ambiguous framing is refused', async () => {
  const body = JSON.stringify(good);
  const head = 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ' + API_KEY +
    '\r\nContent-Type: application/json\r\n';
  let resp = parseRaw(await rawRequest(srv.port,
    `${head}Content-Length: ${body.length}\r\nContent-Length: ${body.length}\r\n\r\n${body}`));
  assert.equal(resp.status, 400, resp.head);
  resp = parseRaw(await rawRequest(srv.port,
    `${head}Content-Length: ${body.length}\r\nTransfer-Encoding: chunked\r\n\r\n` +
    `${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`));
  assert.equal(resp.status, 400, resp.head);
  // Garbage instead of HTTP gets a 4xx or a closed connection, never a hang.
  const junk = await rawRequest(srv.port, '\x00\x01\x02 not http\r\n\r\n');
  if (junk.length > 0) {
    assert.match(junk, /^HTTP\/1\.[01] 4\d\d/);
  }
  // A request head larger than the header limit.
  resp = parseRaw(await rawRequest(srv.port,
    `GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(200 * 1024)}\r\n\r\n`));
  assert.ok(resp.status === 0 || (resp.status >= 400 && resp.status < 500), resp.head);
  // The server is still fine.
  assert.equal((await fetch(`${srv.base}/health`)).status, 200);
});

test('429 with Retry-After when a tenant queue is full', async () => {
  const key = 'sk-tenant-small';
  const digest = createHash('sha256').update(key).digest('hex');
  const conf = tmpFile('kvserve.conf', [
    '[tenant small]',
    `api_key_sha256 = ${digest}`,
    'max_running = 1',
    'max_waiting = 1',
    '',
  ].join('\n'));
  const s2 = await startServer(['--api-key', API_KEY, '--config', conf]);
  try {
    const req = { model: MODEL_NAME, prompt: 'Emma', max_tokens: 64, ignore_eos: true };
    const results = await Promise.all(Array.from({ length: 8 },
      () => postJson(s2.base, '/v1/completions', req, authHeaders(key))));
    const codes = results.map((r) => r.status);
    assert.ok(codes.includes(200), codes.join(','));
    const limited = results.filter((r) => r.status === 429);
    assert.ok(limited.length >= 1, codes.join(','));
    for (const r of limited) {
      validate('ErrorResponse', r.json);
      assert.ok(Number(r.headers.get('retry-after')) >= 1);
    }
    for (const r of results) {
      assert.ok(r.status === 200 || r.status === 429, `${r.status} ${r.text}`);
    }
    const m = await getMetrics(s2.base);
    assert.equal(metricValue(m, 'kvserve:requests_rejected_total', 'tenant="small"'),
      limited.length);
    await waitKvEmpty(s2.base);
  } finally {
    const st = await s2.stop();
    assert.equal(st.code, 0);
  }
});
