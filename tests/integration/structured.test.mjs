// structured.test.mjs - structured output (issue 14, items 1 and 2) on the
// default model through the official `openai` SDK: chat.completions.parse
// with JSON schemas, response_format json_object, vLLM's
// structured_outputs (regex, choice, grammar) and llama.cpp's grammar /
// json_schema, streamed and not. The model is tiny and knows nothing about
// JSON, so every output that parses and validates proves the constraint.
// Every output is checked with ajv against its own schema; then the same
// under batching (concurrent requests), n > 1, and preemption with a tiny
// KV pool (recompute, and swap). An unsupported schema feature is a 400
// naming it.
import { after, afterEach, before, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Ajv from 'ajv';
import addFormats from 'ajv-formats';
import {
  API_KEY, MODEL_NAME, getMetrics, metricValue, postJson, readSse, startServer, validate,
  waitKvEmpty,
} from './lib.mjs';

let srv;
let client;

const ajv = new Ajv({ allErrors: true, strict: false });
addFormats(ajv);

// Schemas whose every string and array is bounded, so a constrained output
// always ends well within max_tokens (the context is 256 tokens).
const SCHEMAS = {
  person: {
    type: 'object',
    properties: {
      name: { type: 'string', minLength: 1, maxLength: 12 },
      age: { type: 'integer', minimum: 0, maximum: 120 },
      role: { enum: ['lady', 'gentleman', 'servant'] },
      married: { type: 'boolean' },
    },
    required: ['name', 'age', 'role', 'married'],
    additionalProperties: false,
  },
  letter: {
    type: 'object',
    properties: {
      to: { type: 'string', maxLength: 10 },
      date: { type: 'string', format: 'date' },
      lines: { type: 'array', items: { type: 'string', maxLength: 8 }, minItems: 1, maxItems: 2 },
      postscript: { anyOf: [{ type: 'string', maxLength: 6 }, { type: 'null' }] },
    },
    required: ['to', 'date', 'lines', 'postscript'],
    additionalProperties: false,
  },
  family: {
    $defs: {
      member: {
        type: 'object',
        properties: {
          first: { type: 'string', maxLength: 8 },
          rank: { type: 'integer', minimum: -5, maximum: 5 },
        },
        required: ['first', 'rank'],
        additionalProperties: false,
      },
    },
    type: 'object',
    properties: {
      surname: { const: 'Bennet' },
      members: { type: 'array', items: { $ref: '#/$defs/member' }, maxItems: 2 },
      estate: { type: ['string', 'null'], maxLength: 8 },
    },
    required: ['surname', 'members'],
    additionalProperties: false,
  },
};

// Parses text as JSON and validates it against schema; throws with the text.
function checkJson(schema, text) {
  let obj;
  try {
    obj = JSON.parse(text);
  } catch (e) {
    throw new Error(`not JSON (${e.message}): ${JSON.stringify(text)}`);
  }
  const v = ajv.compile(schema);
  if (!v(obj)) {
    throw new Error(`does not match its schema: ${ajv.errorsText(v.errors)}: ${text}`);
  }
  return obj;
}

function schemaFormat(name) {
  return { type: 'json_schema', json_schema: { name, schema: SCHEMAS[name], strict: true } };
}

function chatReq(name, extra = {}) {
  return {
    model: MODEL_NAME,
    messages: [{ role: 'user', content: `Describe the ${name} as JSON.` }],
    max_tokens: 200,
    temperature: 1.0,
    response_format: schemaFormat(name),
    ...extra,
  };
}

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

test('chat.completions.parse with JSON schemas: every output validates', async () => {
  for (const name of Object.keys(SCHEMAS)) {
    for (const seed of [1, 2, 3]) {
      const r = await client.chat.completions.parse(chatReq(name, { seed }));
      validate('CreateChatCompletionResponse', JSON.parse(JSON.stringify(
        { ...r, choices: r.choices.map(({ message: { parsed, ...m }, ...c }) => ({ ...c, message: m })) })));
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'stop', `${name}: ${c.message.content}`);
      const obj = checkJson(SCHEMAS[name], c.message.content);
      assert.deepEqual(c.message.parsed, obj);
    }
  }
});

test('greedy structured output is deterministic; logprobs are of allowed tokens', async () => {
  const req = chatReq('person', { temperature: 0, logprobs: true, top_logprobs: 3 });
  const a = await client.chat.completions.create(req);
  const b = await client.chat.completions.create(req);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  checkJson(SCHEMAS.person, a.choices[0].message.content);
  const lp = a.choices[0].logprobs.content;
  assert.ok(lp.length > 0);
  for (const t of lp) {
    // The constrained distribution: the sampled token has a finite logprob,
    // and no reported alternative is impossible (-inf / -9999).
    assert.ok(Number.isFinite(t.logprob) && t.logprob <= 0, JSON.stringify(t));
  }
});

test('streamed json_schema chat: the joined deltas validate', async () => {
  for (const name of Object.keys(SCHEMAS)) {
    const stream = await client.chat.completions.create(chatReq(name, { stream: true, seed: 7 }));
    let text = '';
    let finish = null;
    for await (const chunk of stream) {
      validate('CreateChatCompletionStreamResponse', JSON.parse(JSON.stringify(chunk)));
      for (const c of chunk.choices) {
        text += c.delta?.content ?? '';
        finish = c.finish_reason ?? finish;
      }
    }
    assert.equal(finish, 'stop');
    checkJson(SCHEMAS[name], text);
  }
});

test('response_format json_object on chat and completions gives a JSON object', async () => {
  const objSchema = { type: 'object' };
  for (const seed of [11, 12]) {
    const r = await client.chat.completions.create({
      model: MODEL_NAME, messages: [{ role: 'user', content: 'Say anything as JSON' }],
      max_tokens: 200, temperature: 0.8, seed, response_format: { type: 'json_object' },
    });
    if (r.choices[0].finish_reason === 'stop') {
      checkJson(objSchema, r.choices[0].message.content);
    } else {
      // Free-form JSON is unbounded: a cut one is still a valid prefix.
      assert.equal(r.choices[0].finish_reason, 'length');
      assert.match(r.choices[0].message.content, /^ ?\{/);
    }
  }
  const c = await client.completions.create({
    model: MODEL_NAME, prompt: 'Emma said', max_tokens: 120, temperature: 0,
    response_format: { type: 'json_object' },
  });
  assert.match(c.choices[0].text, /^ ?\{/);
});

test('structured_outputs regex, choice and grammar on completions, streamed and not', async () => {
  const cases = [
    { so: { regex: '[A-Z][a-z]{2,6} (Bennet|Darcy), \\d{2}' },
      check: (t) => /^[A-Z][a-z]{2,6} (Bennet|Darcy), \d{2}$/.test(t) },
    { so: { choice: ['Pride', 'Prejudice', 'Persuasion'] },
      check: (t) => ['Pride', 'Prejudice', 'Persuasion'].includes(t) },
    { so: { grammar: 'root ::= num ( [-+*] num ){1,3}\nnum ::= [1-9] [0-9]?\n' },
      check: (t) => /^[1-9][0-9]?([-+*][1-9][0-9]?){1,3}$/.test(t) },
  ];
  for (const { so, check } of cases) {
    for (const seed of [1, 2]) {
      const body = { model: MODEL_NAME, prompt: 'Answer:', max_tokens: 60, temperature: 1.0,
        seed, structured_outputs: so };
      const r = await postJson(srv.base, '/v1/completions', body);
      assert.equal(r.status, 200, r.text);
      validate('CreateCompletionResponse', r.json);
      const t = r.json.choices[0].text;
      assert.ok(check(t), `${JSON.stringify(so)}: ${JSON.stringify(t)}`);
      assert.equal(r.json.choices[0].finish_reason, 'stop');

      const res = await fetch(`${srv.base}/v1/completions`, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${API_KEY}` },
        body: JSON.stringify({ ...body, stream: true }),
      });
      const { events, done } = await readSse(res);
      assert.ok(done);
      let text = '';
      for (const e of events) {
        for (const c of e.choices) {
          text += c.text ?? '';
        }
      }
      assert.equal(text, t, 'a stream gives the same text as the same seeded request');
    }
  }
});

test('vLLM guided_* and llama.cpp grammar / json_schema fields', async () => {
  const person = SCHEMAS.person;
  const bodies = [
    [{ guided_json: person }, (t) => checkJson(person, t)],
    [{ guided_choice: ['yes', 'no'] }, (t) => assert.ok(['yes', 'no'].includes(t), t)],
    [{ guided_regex: '\\d{3}' }, (t) => assert.match(t, /^\d{3}$/)],
    [{ grammar: 'root ::= "a" [bc]{2}' }, (t) => assert.match(t, /^a[bc]{2}$/)],
    [{ json_schema: person }, (t) => checkJson(person, t)],
  ];
  for (const [extra, check] of bodies) {
    const r = await postJson(srv.base, '/v1/completions',
      { model: MODEL_NAME, prompt: 'Mr', max_tokens: 200, temperature: 0.9, seed: 5, ...extra });
    assert.equal(r.status, 200, r.text);
    check(r.json.choices[0].text);
  }
});

test('unsupported or bad constraints are a 400 that names them', async () => {
  const cases = [
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x',
      schema: { type: 'object', properties: { a: { not: { type: 'null' } } } } } } }, /'not'/],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x',
      schema: { type: 'string', format: 'email' } } } }, /format 'email'/],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x',
      schema: { type: 'array', uniqueItems: true } } } }, /uniqueItems/],
    [{ structured_outputs: { regex: '(a)\\1' } }, /escape/],
    [{ structured_outputs: { grammar: 'root ::= root "a"' } }, /left recursion/],
    [{ structured_outputs: { choice: [] } }, /choice/],
    [{ structured_outputs: { regex: 'a', choice: ['b'] } }, /both/],
    [{ response_format: { type: 'xml' } }, /xml/],
  ];
  for (const [extra, re] of cases) {
    const r = await postJson(srv.base, '/v1/chat/completions', {
      model: MODEL_NAME, messages: [{ role: 'user', content: 'x' }], max_tokens: 5, ...extra });
    assert.equal(r.status, 400, r.text);
    validate('ErrorResponse', r.json);
    assert.match(r.json.error.message, re);
  }
  await assert.rejects(() => client.chat.completions.parse({
    model: MODEL_NAME, messages: [{ role: 'user', content: 'x' }],
    response_format: { type: 'json_schema',
      json_schema: { name: 'x', schema: { type: 'object', patternProperties: {} } } },
  }), (e) => e.status === 400 && /patternProperties/.test(e.message));
});

// Sends the schemas concurrently (k of each) and checks every output.
async function concurrentValid(c, k, extra = {}) {
  const jobs = [];
  for (let i = 0; i < k; i++) {
    for (const name of Object.keys(SCHEMAS)) {
      jobs.push(c.chat.completions.create(chatReq(name, { seed: 100 + i, ...extra }))
        .then((r) => ({ name, r })));
    }
  }
  const out = await Promise.all(jobs);
  for (const { name, r } of out) {
    for (const ch of r.choices) {
      assert.equal(ch.finish_reason, 'stop', `${name}: ${ch.message.content}`);
      checkJson(SCHEMAS[name], ch.message.content);
    }
  }
  return out;
}

test('under batching: 24 concurrent constrained and free requests', async () => {
  const free = [];
  for (let i = 0; i < 6; i++) {
    free.push(client.completions.create({ model: MODEL_NAME, prompt: 'Emma', max_tokens: 40,
      temperature: 1.0, seed: i }));
  }
  await concurrentValid(client, 8);
  for (const r of await Promise.all(free)) {
    assert.equal(r.choices[0].finish_reason, 'length'); // free requests are not constrained
  }
});

test('n > 1: every choice has its own matcher and validates', async () => {
  const r = await client.chat.completions.create(chatReq('person', { n: 4, seed: 9 }));
  assert.equal(r.choices.length, 4);
  const texts = new Set();
  for (const c of r.choices) {
    assert.equal(c.finish_reason, 'stop');
    checkJson(SCHEMAS.person, c.message.content);
    texts.add(c.message.content);
  }
  assert.ok(texts.size > 1, 'the choices sample independently');
  const s = await client.chat.completions.create(chatReq('letter', { n: 3, seed: 4, stream: true }));
  const acc = ['', '', ''];
  for await (const chunk of s) {
    for (const c of chunk.choices) {
      acc[c.index] += c.delta?.content ?? '';
    }
  }
  for (const t of acc) {
    checkJson(SCHEMAS.letter, t);
  }
});

for (const [mode, flags, kind] of [
  ['recompute', ['--swap-space', '0'], 'recompute'],
  ['swap', ['--swap-space', '0.01'], 'swap'],
]) {
  test(`preemption by ${mode} with a tiny KV pool: outputs still validate`, async () => {
    const small = await startServer(['--api-key', API_KEY, '--num-kv-blocks', '40',
      '--no-enable-prefix-caching', ...flags]);
    try {
      const c = new OpenAI({ baseURL: `${small.base}/v1`, apiKey: API_KEY, maxRetries: 0 });
      await concurrentValid(c, 4, { n: 2 });
      const m = await getMetrics(small.base);
      const pre = metricValue(m, 'kvserve:num_preemptions_total', `kind="${kind}"`);
      assert.ok(pre > 0, `no ${kind} preemption happened (the test would prove nothing)`);
      await waitKvEmpty(small.base);
    } finally {
      assert.equal((await small.stop('SIGTERM')).code, 0);
    }
  });
}
