// conformance.test.mjs - defects measured against the OpenAI spec and real
// clients (issue 14, item 8), each a regression test: logprob tokens and
// bytes that join to the text, a non-JSON Content-Type, completion chunks
// without "usage": null, token pieces longer than 256 bytes, the stop
// token's text. Every body is validated against the OpenAI schemas; after
// each test the KV pool must be empty again.
import { after, afterEach, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import {
  API_KEY, MODEL_NAME, SRC_ROOT, authHeaders, postJson, readSse, startServer, validate,
  waitKvEmpty,
} from './lib.mjs';

const EOS = 2; // </s> in the default model's vocabulary
const BYTE_C3 = 3 + 0xc3; // the byte-fallback token <0xC3>

let srv;
let client;

before(async () => {
  srv = await startServer(['--api-key', API_KEY]);
  client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: API_KEY, maxRetries: 0 });
});

after(async () => {
  const st = await srv.stop('SIGTERM');
  assert.equal(st.code, 0, srv.logs.join('\n'));
});

afterEach(async () => {
  await waitKvEmpty(srv.base);
});

function checked(name, obj) {
  return validate(name, JSON.parse(JSON.stringify(obj)));
}

test('completion logprob tokens join to the text (SentencePiece spaces kept)', async () => {
  const r = checked('CreateCompletionResponse', await client.completions.create({
    model: MODEL_NAME, prompt: 'Emma Woodhouse, handsome', max_tokens: 16, temperature: 0,
    logprobs: 1, logit_bias: { [EOS]: -100 },
  }));
  const c = r.choices[0];
  assert.equal(c.logprobs.tokens.length, 16);
  assert.ok(c.text.includes(' '), `no space in ${JSON.stringify(c.text)}`);
  assert.equal(c.logprobs.tokens.join(''), c.text);
  // text_offset follows the same texts.
  for (let i = 1; i < c.logprobs.tokens.length; i++) {
    assert.equal(c.logprobs.text_offset[i],
      c.logprobs.text_offset[i - 1] + c.logprobs.tokens[i - 1].length);
  }
  // Streamed, the same.
  const s = await client.completions.create({
    model: MODEL_NAME, prompt: 'Emma Woodhouse, handsome', max_tokens: 16, temperature: 0,
    logprobs: 1, logit_bias: { [EOS]: -100 }, stream: true,
  });
  let text = '';
  let toks = '';
  for await (const chunk of s) {
    checked('CreateCompletionStreamResponse', chunk);
    for (const ch of chunk.choices) {
      text += ch.text;
      toks += (ch.logprobs?.tokens ?? []).join('');
    }
  }
  assert.equal(text, c.text);
  assert.equal(toks, text);
});

test('chat logprob bytes join to the content; a byte-fallback token gives its byte', async () => {
  const r = checked('CreateChatCompletionResponse', await client.chat.completions.create({
    model: MODEL_NAME, messages: [{ role: 'user', content: 'Tell me of Emma.' }],
    max_tokens: 16, temperature: 0, logprobs: true, top_logprobs: 2,
    logit_bias: { [EOS]: -100 },
  }));
  const c = r.choices[0];
  const bytes = c.logprobs.content.flatMap((e) => e.bytes);
  assert.equal(Buffer.from(bytes).toString('utf8'), c.message.content);
  assert.equal(c.logprobs.content.map((e) => e.token).join(''), c.message.content);
  for (const e of c.logprobs.content) {
    for (const t of e.top_logprobs) {
      assert.equal(Buffer.from(t.bytes).toString('utf8'), t.token);
    }
  }
  // Forced: the one byte 0xC3 (the first half of a two-byte character).
  const b = checked('CreateChatCompletionResponse', await client.chat.completions.create({
    model: MODEL_NAME, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 1,
    temperature: 0, logprobs: true, logit_bias: { [BYTE_C3]: 100 },
  }));
  assert.deepEqual(b.choices[0].logprobs.content[0].bytes, [0xc3]);
});

test('a body declared as something else than JSON gets 415', async () => {
  const body = JSON.stringify({ model: MODEL_NAME, prompt: 'Emma', max_tokens: 2 });
  for (const ct of ['text/plain', 'application/x-www-form-urlencoded', 'application/xml',
    'multipart/form-data; boundary=x', 'application/jsonx']) {
    const res = await fetch(`${srv.base}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': ct, ...authHeaders() }, body,
    });
    assert.equal(res.status, 415, ct);
    const j = validate('ErrorResponse', await res.json());
    assert.match(j.error.message, /Content-Type/);
    assert.equal(j.error.type, 'invalid_request_error');
  }
  // JSON in its spellings, and no Content-Type at all (read as JSON).
  for (const ct of ['application/json', 'Application/JSON; charset=utf-8',
    'application/vnd.kvserve+json', null]) {
    const headers = { ...authHeaders() };
    if (ct !== null) {
      headers['Content-Type'] = ct;
    }
    // A Uint8Array body: fetch adds no Content-Type of its own.
    const res = await fetch(`${srv.base}/v1/completions`, {
      method: 'POST', headers, body: new TextEncoder().encode(body),
    });
    assert.equal(res.status, 200, String(ct));
    checked('CreateCompletionResponse', await res.json());
  }
  // GET routes take no body and are not checked.
  const m = await fetch(`${srv.base}/v1/models`, {
    headers: { 'Content-Type': 'text/plain', ...authHeaders() },
  });
  assert.equal(m.status, 200);
});

test('completion chunks carry no "usage": null; chat chunks may', async () => {
  for (const [route, body, schema] of [
    ['/v1/completions', { prompt: 'Emma' }, 'CreateCompletionStreamResponse'],
    ['/v1/chat/completions', { messages: [{ role: 'user', content: 'Hi' }] },
      'CreateChatCompletionStreamResponse'],
  ]) {
    const res = await fetch(srv.base + route, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', ...authHeaders() },
      body: JSON.stringify({
        model: MODEL_NAME, max_tokens: 4, stream: true, stream_options: { include_usage: true },
        ...body,
      }),
    });
    assert.equal(res.status, 200);
    const { events, done } = await readSse(res);
    assert.ok(done);
    const last = events.at(-1);
    assert.equal(last.choices.length, 0);
    assert.ok(last.usage.total_tokens > 0);
    for (const e of events.slice(0, -1)) {
      validate(schema, e);
      if (route === '/v1/completions') {
        assert.ok(!('usage' in e), JSON.stringify(e));
      } else {
        assert.equal(e.usage, null);
      }
    }
    validate(schema, last);
  }
});

test('the stop token is not in the text, whatever skip_special_tokens says (vLLM)', async () => {
  // EOS forced first: the choice stops on it at once, with an empty text.
  for (const stream of [false, true]) {
    for (const skip of [true, false]) {
      const req = {
        model: MODEL_NAME, prompt: 'Emma', max_tokens: 4, temperature: 0,
        logit_bias: { [EOS]: 100 }, skip_special_tokens: skip,
      };
      let text = '';
      let finish = null;
      if (stream) {
        const s = await client.completions.create({ ...req, stream: true });
        for await (const chunk of s) {
          checked('CreateCompletionStreamResponse', chunk);
          text += chunk.choices[0]?.text ?? '';
          finish = chunk.choices[0]?.finish_reason ?? finish;
        }
      } else {
        const r = checked('CreateCompletionResponse', await client.completions.create(req));
        text = r.choices[0].text;
        finish = r.choices[0].finish_reason;
        assert.equal(r.usage.completion_tokens, 1);
      }
      assert.equal(text, '', `stream=${stream} skip=${skip}`);
      assert.equal(finish, 'stop');
    }
  }
  // A stop token id is left out the same way, after text before it.
  const base = await client.completions.create({
    model: MODEL_NAME, prompt: 'Emma', max_tokens: 3, temperature: 0,
    logit_bias: { [EOS]: -100 },
  });
  const tok = await postJson(srv.base, '/tokenize',
    { prompt: base.choices[0].text, add_special_tokens: false });
  const third = tok.json.tokens.at(-1);
  const r = await client.chat.completions.create({
    model: MODEL_NAME, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 1,
    temperature: 0, logit_bias: { [third]: 100 }, stop_token_ids: [third],
    skip_special_tokens: false,
  });
  assert.equal(r.choices[0].message.content, '');
  assert.equal(r.choices[0].finish_reason, 'stop');
  // With ignore_eos, EOS does not stop and is text when not skipped.
  const ig = checked('CreateCompletionResponse', await client.completions.create({
    model: MODEL_NAME, prompt: 'Emma', max_tokens: 2, temperature: 0,
    logit_bias: { [EOS]: 100 }, skip_special_tokens: false, ignore_eos: true,
  }));
  assert.equal(ig.choices[0].text, '</s></s>');
  assert.equal(ig.choices[0].finish_reason, 'length');
});

test('a token piece longer than 256 bytes reaches the text and the stream', async () => {
  // The default model with token 1000 re-added as 300 'L's.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kvs-longtok-'));
  const model = path.join(SRC_ROOT, 'models', 'austen-2.7m');
  for (const f of fs.readdirSync(model)) {
    if (f !== 'tokenizer.json') {
      fs.symlinkSync(path.join(model, f), path.join(dir, f));
    }
  }
  const tj = JSON.parse(fs.readFileSync(path.join(model, 'tokenizer.json'), 'utf8'));
  const long = 'L'.repeat(300);
  tj.added_tokens.push({
    id: 1000, content: long, single_word: false, lstrip: false, rstrip: false,
    normalized: false, special: false,
  });
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tj));
  const s2 = await startServer(['--model', dir]);
  try {
    const c2 = new OpenAI({ baseURL: `${s2.base}/v1`, apiKey: 'none', maxRetries: 0 });
    const req = {
      model: 'kvs-longtok', prompt: 'Emma', max_tokens: 2, temperature: 0,
      logit_bias: { 1000: 100 },
    };
    const names = await c2.models.list();
    req.model = names.data[0].id;
    const r = checked('CreateCompletionResponse', await c2.completions.create(req));
    assert.equal(r.choices[0].text, long + long);
    let text = '';
    for await (const chunk of await c2.completions.create({ ...req, stream: true })) {
      text += chunk.choices[0]?.text ?? '';
    }
    assert.equal(text, long + long);
    await waitKvEmpty(s2.base);
  } finally {
    await s2.stop('SIGTERM');
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('GET /v1/models/{id}: the served model, 404 for another id', async () => {
  const m = checked('Model', await client.models.retrieve(MODEL_NAME));
  assert.equal(m.id, MODEL_NAME);
  assert.equal(m.object, 'model');
  const list = await client.models.list();
  assert.equal(list.data[0].created, m.created);
  const res = await fetch(`${srv.base}/v1/models/gpt-4o`, { headers: authHeaders() });
  assert.equal(res.status, 404);
  const e = validate('ErrorResponse', await res.json()).error;
  assert.equal(e.code, 'model_not_found');
  assert.match(e.message, /gpt-4o/);
  await assert.rejects(client.models.retrieve('org/some-model'), (err) => err.status === 404);
  // The key is needed as for the list.
  const noauth = await fetch(`${srv.base}/v1/models/${MODEL_NAME}`);
  assert.equal(noauth.status, 401);
  // Nothing else lives under /v1/models/.
  const post = await fetch(`${srv.base}/v1/models/${MODEL_NAME}`,
    { method: 'POST', headers: authHeaders() });
  assert.equal(post.status, 405);
  const empty = await fetch(`${srv.base}/v1/models/`, { headers: authHeaders() });
  assert.equal(empty.status, 404);
});

test('multimodal content parts are refused: the model is text-only', async () => {
  const parts = [
    { type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgo=' } },
    { type: 'input_audio', input_audio: { data: 'AAAA', format: 'wav' } },
    { type: 'file', file: { file_id: 'file-1' } },
  ];
  for (const p of parts) {
    const r = await postJson(srv.base, '/v1/chat/completions', {
      model: MODEL_NAME, max_tokens: 2,
      messages: [{ role: 'user', content: [{ type: 'text', text: 'What is this?' }, p] }],
    });
    assert.equal(r.status, 400, p.type);
    const e = validate('ErrorResponse', r.json).error;
    assert.match(e.message, /text-only/);
    assert.match(e.message, new RegExp(p.type));
    assert.equal(e.param, 'messages');
  }
  // Text parts still work.
  const ok = await client.chat.completions.create({
    model: MODEL_NAME, max_tokens: 2,
    messages: [{ role: 'user', content: [{ type: 'text', text: 'Hello' }] }],
  });
  checked('CreateChatCompletionResponse', ok);
});

// CORS: a preflight and an actual request from a browser origin.
async function preflight(base, origin, method = 'POST', route = '/v1/chat/completions') {
  return fetch(base + route, {
    method: 'OPTIONS',
    headers: {
      Origin: origin, 'Access-Control-Request-Method': method,
      'Access-Control-Request-Headers': 'authorization, content-type',
    },
  });
}

test('CORS: nothing is allowed unless configured', async () => {
  const pf = await preflight(srv.base, 'https://app.example.com');
  assert.equal(pf.status, 403);
  assert.equal(pf.headers.get('access-control-allow-origin'), null);
  assert.match(validate('ErrorResponse', await pf.json()).error.message, /not allowed/);
  const res = await fetch(`${srv.base}/v1/models`,
    { headers: { Origin: 'https://app.example.com', ...authHeaders() } });
  assert.equal(res.status, 200);
  assert.equal(res.headers.get('access-control-allow-origin'), null);
  // OPTIONS without preflight headers is just a method the route lacks.
  const opt = await fetch(`${srv.base}/v1/models`, { method: 'OPTIONS' });
  assert.equal(opt.status, 405);
});

test('CORS: a listed origin passes the preflight and reads responses and streams', async () => {
  const s2 = await startServer(['--api-key', API_KEY,
    '--allowed-origins', 'https://app.example.com, http://localhost:3000']);
  try {
    const pf = await preflight(s2.base, 'https://app.example.com');
    assert.equal(pf.status, 204);
    assert.equal(pf.headers.get('access-control-allow-origin'), 'https://app.example.com');
    assert.equal(pf.headers.get('access-control-allow-methods'), 'POST');
    assert.match(pf.headers.get('access-control-allow-headers'), /authorization/i);
    assert.ok(Number(pf.headers.get('access-control-max-age')) > 0);
    assert.match(pf.headers.get('vary'), /Origin/);
    // Preflights carry no key: answered without one.
    const pf2 = await preflight(s2.base, 'http://localhost:3000', 'GET', '/v1/models');
    assert.equal(pf2.status, 204);
    assert.equal(pf2.headers.get('access-control-allow-methods'), 'GET');
    // Refused: another origin, a method the route does not serve.
    const bad = await preflight(s2.base, 'https://evil.example.com');
    assert.equal(bad.status, 403);
    assert.equal(bad.headers.get('access-control-allow-origin'), null);
    const badm = await preflight(s2.base, 'https://app.example.com', 'DELETE');
    assert.equal(badm.status, 403);
    // Actual requests: JSON, errors and SSE carry Allow-Origin.
    const h = { Origin: 'https://app.example.com', 'Content-Type': 'application/json',
      ...authHeaders() };
    const body = JSON.stringify({ model: MODEL_NAME, prompt: 'Emma', max_tokens: 3 });
    const r = await fetch(`${s2.base}/v1/completions`, { method: 'POST', headers: h, body });
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('access-control-allow-origin'), 'https://app.example.com');
    assert.match(r.headers.get('access-control-expose-headers'), /X-Request-Id/i);
    await r.json();
    const st = await fetch(`${s2.base}/v1/completions`, {
      method: 'POST', headers: h,
      body: JSON.stringify({ model: MODEL_NAME, prompt: 'Emma', max_tokens: 3, stream: true }),
    });
    assert.equal(st.headers.get('access-control-allow-origin'), 'https://app.example.com');
    assert.ok((await readSse(st)).done);
    const unauth = await fetch(`${s2.base}/v1/models`,
      { headers: { Origin: 'https://app.example.com' } });
    assert.equal(unauth.status, 401);
    assert.equal(unauth.headers.get('access-control-allow-origin'), 'https://app.example.com');
    const other = await fetch(`${s2.base}/v1/models`,
      { headers: { Origin: 'https://evil.example.com', ...authHeaders() } });
    assert.equal(other.status, 200);
    assert.equal(other.headers.get('access-control-allow-origin'), null);
    await waitKvEmpty(s2.base);
  } finally {
    await s2.stop('SIGTERM');
  }
  // "*" allows any origin, answered with "*".
  const s3 = await startServer(['--allowed-origins', '*']);
  try {
    const pf = await preflight(s3.base, 'https://anything.example');
    assert.equal(pf.status, 204);
    assert.equal(pf.headers.get('access-control-allow-origin'), '*');
  } finally {
    await s3.stop('SIGTERM');
  }
});
