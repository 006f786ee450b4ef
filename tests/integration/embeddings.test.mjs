// embeddings.test.mjs - POST /v1/embeddings through the official `openai` SDK:
// every input form, float and base64 encodings, dimensions, unit norm, the
// same vector alone and batched with other traffic, last vs mean pooling,
// bad inputs (400), and an empty KV pool after each test. Bodies are
// validated against the OpenAI CreateEmbeddingResponse schema.
import { after, afterEach, before, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import {
  API_KEY, MODEL_NAME, authHeaders, postJson, startServer, validate, waitKvEmpty,
} from './lib.mjs';

const DIM = 192; // the default model's hidden size

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

function checked(obj) {
  return validate('CreateEmbeddingResponse', JSON.parse(JSON.stringify(obj)));
}

function norm(v) {
  return Math.sqrt(v.reduce((a, x) => a + x * x, 0));
}

function maxDiff(a, b) {
  assert.equal(a.length, b.length);
  return a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i])), 0);
}

async function embed(input, extra = {}) {
  return checked(await client.embeddings.create({
    model: MODEL_NAME, input, encoding_format: 'float', ...extra,
  }));
}

test('a string, strings, token ids and token-id arrays', async () => {
  const one = await embed('Emma Woodhouse, handsome, clever, and rich');
  assert.equal(one.object, 'list');
  assert.equal(one.model, MODEL_NAME);
  assert.equal(one.data.length, 1);
  assert.equal(one.data[0].object, 'embedding');
  assert.equal(one.data[0].index, 0);
  assert.equal(one.data[0].embedding.length, DIM);
  assert.ok(Math.abs(norm(one.data[0].embedding) - 1) < 1e-5);
  const tok = await postJson(srv.base, '/tokenize',
    { prompt: 'Emma Woodhouse, handsome, clever, and rich' });
  assert.equal(one.usage.prompt_tokens, tok.json.count);
  assert.equal(one.usage.total_tokens, one.usage.prompt_tokens);

  // The same text as token ids gives the same vector.
  const ids = await embed(tok.json.tokens);
  assert.ok(maxDiff(ids.data[0].embedding, one.data[0].embedding) < 1e-6);

  const many = await embed(['Mr. Knightley', 'Emma Woodhouse, handsome, clever, and rich',
    'Harriet Smith']);
  assert.deepEqual(many.data.map((d) => d.index), [0, 1, 2]);
  assert.ok(maxDiff(many.data[1].embedding, one.data[0].embedding) < 1e-4);
  assert.ok(maxDiff(many.data[0].embedding, many.data[2].embedding) > 1e-3);
  for (const d of many.data) {
    assert.ok(Math.abs(norm(d.embedding) - 1) < 1e-5);
  }

  const arrays = await embed([tok.json.tokens, [1, 781, 468]]);
  assert.equal(arrays.data.length, 2);
  assert.ok(maxDiff(arrays.data[0].embedding, one.data[0].embedding) < 1e-4);
  assert.equal(arrays.usage.prompt_tokens, tok.json.count + 3);
});

test('base64 decodes to the same floats; the SDK default (base64) too', async () => {
  const text = 'It is a truth universally acknowledged';
  const f = await embed(text);
  const raw = await postJson(srv.base, '/v1/embeddings',
    { model: MODEL_NAME, input: text, encoding_format: 'base64' });
  assert.equal(raw.status, 200);
  const b64 = raw.json.data[0].embedding;
  assert.equal(typeof b64, 'string');
  const buf = Buffer.from(b64, 'base64');
  assert.equal(buf.length, DIM * 4);
  const dec = Array.from({ length: DIM }, (_, i) => buf.readFloatLE(i * 4));
  // %.9g round-trips an f32: the float form rounds to the same f32s.
  assert.deepEqual(dec, f.data[0].embedding.map(Math.fround));
  // The SDK asks for base64 when no format is given and decodes it.
  const sdk = await client.embeddings.create({ model: MODEL_NAME, input: text });
  assert.deepEqual(Array.from(sdk.data[0].embedding), dec);
});

test('dimensions cut the vector and renormalize it', async () => {
  const text = 'Mr. Darcy';
  const full = (await embed(text)).data[0].embedding;
  const cut = (await embed(text, { dimensions: 16 })).data[0].embedding;
  assert.equal(cut.length, 16);
  assert.ok(Math.abs(norm(cut) - 1) < 1e-5);
  const head = full.slice(0, 16);
  const n = norm(head);
  assert.ok(maxDiff(cut, head.map((x) => x / n)) < 1e-5);
  assert.equal((await embed(text, { dimensions: DIM })).data[0].embedding.length, DIM);
  const big = await postJson(srv.base, '/v1/embeddings',
    { model: MODEL_NAME, input: text, dimensions: DIM + 1 });
  assert.equal(big.status, 400);
  assert.equal(validate('ErrorResponse', big.json).error.param, 'dimensions');
});

test('the same text gives the same vector alone and batched with other traffic', async () => {
  const text = 'She was the youngest of the two daughters of a most affectionate father';
  const alone = (await embed(text)).data[0].embedding;
  // Streams and long prompts in flight while the embedding is computed.
  const traffic = [];
  for (let i = 0; i < 4; i++) {
    traffic.push((async () => {
      const s = await client.completions.create({
        model: MODEL_NAME, prompt: 'Emma '.repeat(20 + i * 10), max_tokens: 24, stream: true,
        temperature: 0,
      });
      for await (const chunk of s) {
        void chunk;
      }
    })());
  }
  const batched = await Promise.all([
    embed(['Harriet', text, 'Mr. Elton'.repeat(10)]),
    embed(text),
    ...traffic,
  ]);
  assert.ok(maxDiff(batched[0].data[1].embedding, alone) < 1e-4);
  assert.ok(maxDiff(batched[1].data[0].embedding, alone) < 1e-4);
});

test('bad inputs are 400 (404 for another model)', async () => {
  const cases = [
    [{ input: '' }, 'input'],
    [{ input: [] }, 'input'],
    [{ input: ['a', [1, 2]] }, 'input'],
    [{ input: [[]] }, 'input'],
    [{ input: [1, 'a'] }, 'input'],
    [{ input: [5000] }, 'input'],
    [{ input: [1.5] }, 'input'],
    [{ input: 42 }, 'input'],
    [{ input: 'Emma '.repeat(400) }, 'input'], // beyond the 256-token context
    [{ input: 'Emma', encoding_format: 'hex' }, 'encoding_format'],
    [{ input: 'Emma', dimensions: 0 }, 'dimensions'],
    [{ input: 'Emma', dimensions: 2.5 }, 'dimensions'],
  ];
  for (const [body, param] of cases) {
    const r = await postJson(srv.base, '/v1/embeddings', { model: MODEL_NAME, ...body });
    assert.equal(r.status, 400, JSON.stringify(body));
    const e = validate('ErrorResponse', r.json).error;
    assert.equal(e.param, param, JSON.stringify(body));
    assert.equal(e.type, 'invalid_request_error');
  }
  const nomodel = await postJson(srv.base, '/v1/embeddings', { input: 'Emma' });
  assert.equal(nomodel.status, 400);
  const other = await postJson(srv.base, '/v1/embeddings', { model: 'gpt-x', input: 'Emma' });
  assert.equal(other.status, 404);
  assert.equal(other.json.error.code, 'model_not_found');
  const noauth = await postJson(srv.base, '/v1/embeddings',
    { model: MODEL_NAME, input: 'Emma' }, {});
  assert.equal(noauth.status, 401);
  // With the API key through the SDK the error surfaces as its BadRequestError.
  await assert.rejects(client.embeddings.create({ model: MODEL_NAME, input: '' }),
    (e) => e.status === 400);
  assert.ok(authHeaders().Authorization);
});

test('mean pooling differs from last-token pooling, and is unit-norm', async () => {
  const text = 'Emma Woodhouse, handsome, clever, and rich';
  const last = (await embed(text)).data[0].embedding;
  const mean = await startServer(['--pooling', 'mean']);
  try {
    const c2 = new OpenAI({ baseURL: `${mean.base}/v1`, apiKey: 'none', maxRetries: 0 });
    const m = checked(await c2.embeddings.create({
      model: MODEL_NAME, input: [text, 'Mr. Knightley'], encoding_format: 'float',
    }));
    const v = m.data[0].embedding;
    assert.equal(v.length, DIM);
    assert.ok(Math.abs(norm(v) - 1) < 1e-5);
    assert.ok(maxDiff(v, last) > 1e-2, 'mean equals last');
    // Mean pooling over one token is that token's (last) vector.
    const oneTok = [1];
    const a = checked(await c2.embeddings.create({
      model: MODEL_NAME, input: oneTok, encoding_format: 'float',
    })).data[0].embedding;
    const b = (await embed(oneTok)).data[0].embedding;
    assert.ok(maxDiff(a, b) < 1e-5);
    // A long text twice: the second time its full blocks are in the prefix
    // cache, and mean pooling still computes (and counts) every row.
    const long = 'Emma Woodhouse, handsome, clever, and rich, '.repeat(5);
    const first = checked(await c2.embeddings.create({
      model: MODEL_NAME, input: long, encoding_format: 'float',
    }));
    const again = checked(await c2.embeddings.create({
      model: MODEL_NAME, input: long, encoding_format: 'float',
    }));
    assert.ok(first.usage.prompt_tokens > 32);
    assert.ok(maxDiff(again.data[0].embedding, first.data[0].embedding) < 1e-5);
    await waitKvEmpty(mean.base);
  } finally {
    assert.equal((await mean.stop('SIGTERM')).code, 0);
  }
});

test('mean pooling in chunks under preemption gives the vector computed alone', async () => {
  // A tiny pool and 16-token steps: the embedding's prompt is prefilled in
  // chunks among long generations, which preempt each other (recompute).
  const s2 = await startServer(['--pooling', 'mean', '--num-kv-blocks', '24',
    '--max-num-batched-tokens', '16', '--max-num-seqs', '8', '--swap-space', '0',
    '--no-enable-prefix-caching']);
  try {
    const c2 = new OpenAI({ baseURL: `${s2.base}/v1`, apiKey: 'none', maxRetries: 0 });
    const text = 'Emma Woodhouse, handsome, clever, and rich, with a comfortable home '.repeat(6);
    const alone = checked(await c2.embeddings.create({
      model: MODEL_NAME, input: text, encoding_format: 'float',
    }));
    assert.ok(alone.usage.prompt_tokens > 64);
    const gens = [];
    for (let i = 0; i < 4; i++) {
      gens.push(c2.completions.create({
        model: MODEL_NAME, prompt: 'It is a truth universally acknowledged '.repeat(8),
        max_tokens: 96, ignore_eos: true, temperature: 0,
      }));
    }
    const embs = [];
    for (let i = 0; i < 3; i++) {
      embs.push(c2.embeddings.create({ model: MODEL_NAME, input: text, encoding_format: 'float' }));
    }
    const got = await Promise.all([...embs, ...gens]);
    for (let i = 0; i < 3; i++) {
      assert.ok(maxDiff(got[i].data[0].embedding, alone.data[0].embedding) < 1e-4, `emb ${i}`);
    }
    const m = await (await fetch(`${s2.base}/metrics`)).text();
    const pre = /kvserve:num_preemptions_total\{kind="recompute"\} (\d+)/.exec(m);
    console.log(`preemptions (recompute): ${pre ? pre[1] : '?'}`);
    await waitKvEmpty(s2.base);
  } finally {
    assert.equal((await s2.stop('SIGTERM')).code, 0);
  }
});

test('tensor parallel (2 CPU ranks) gives the same vectors', async () => {
  const input = ['Emma Woodhouse, handsome, clever, and rich', 'Mr. Knightley'];
  const one = await embed(input);
  const tp = await startServer(['--tensor-parallel-size', '2']);
  try {
    const c2 = new OpenAI({ baseURL: `${tp.base}/v1`, apiKey: 'none', maxRetries: 0 });
    const two = checked(await c2.embeddings.create({
      model: MODEL_NAME, input, encoding_format: 'float',
    }));
    for (let i = 0; i < input.length; i++) {
      assert.ok(maxDiff(two.data[i].embedding, one.data[i].embedding) < 1e-4, `input ${i}`);
    }
    await waitKvEmpty(tp.base);
  } finally {
    assert.equal((await tp.stop('SIGTERM')).code, 0);
  }
});
