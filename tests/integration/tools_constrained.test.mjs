// tools_constrained.test.mjs - end to end, the outputs that the constraint
// (srv_constraint_t, the constrained-decoding engine) enforces: tool_choice
// "required" and a named function, streamed and not, whose arguments must
// validate against the function's parameters schema (ajv), and the
// Responses API's text.format json_schema, whose output must validate
// against that schema. The default model is tiny and its text random, so
// this proves the constraint, not the model. It needs the grammar engine:
// without it these outputs are free text and the tests fail.
import { after, afterEach, before, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import Ajv from 'ajv';
import OpenAI from 'openai';
import {
  MODEL_NAME, SRC_ROOT, authHeaders, postJson, startServer, validate, waitKvEmpty,
} from './lib.mjs';

const servers = {};
const clients = {};
const ajv = new Ajv({ allErrors: true, strict: false });

before(async () => {
  const hermes = path.join(SRC_ROOT, 'tests', 'integration', 'fixtures', 'tools-hermes.jinja');
  servers.hermes = await startServer(['--chat-template', hermes]);
  servers.generic = await startServer([]);
  for (const [k, s] of Object.entries(servers)) {
    clients[k] = new OpenAI({ baseURL: `${s.base}/v1`, apiKey: 'none', maxRetries: 0 });
  }
});

after(async () => {
  for (const s of Object.values(servers)) {
    assert.equal((await s.stop('SIGTERM')).code, 0, s.logs.join('\n'));
  }
});

afterEach(async () => {
  for (const s of Object.values(servers)) {
    await waitKvEmpty(s.base);
  }
});

function checked(name, obj) {
  return validate(name, JSON.parse(JSON.stringify(obj)));
}

// Small schemas: the default model's context is 256 tokens.
const BOOK_PARAMS = {
  type: 'object',
  properties: {
    city: { type: 'string', enum: ['Paris', 'Bath'] },
    days: { type: 'integer', minimum: 1, maximum: 7 },
  },
  required: ['city', 'days'],
  additionalProperties: false,
};
const NOTE_PARAMS = {
  type: 'object',
  properties: { ok: { type: 'boolean' } },
  required: ['ok'],
  additionalProperties: false,
};
const TOOLS = [
  { type: 'function', function: { name: 'book', parameters: BOOK_PARAMS } },
  { type: 'function', function: { name: 'note', parameters: NOTE_PARAMS } },
];
const PARAMS = { book: BOOK_PARAMS, note: NOTE_PARAMS };
const MESSAGES = [{ role: 'user', content: 'Book Bath.' }];

function argsValid(name, args) {
  const v = ajv.compile(PARAMS[name]);
  const obj = JSON.parse(args);
  assert.ok(v(obj), `${name}(${args}): ${ajv.errorsText(v.errors)}`);
}

async function joinCalls(stream) {
  const calls = [];
  let finish = null;
  for await (const chunk of stream) {
    checked('CreateChatCompletionStreamResponse', chunk);
    const ch = chunk.choices[0];
    for (const d of ch?.delta.tool_calls ?? []) {
      if (d.id) {
        calls.push({ id: d.id, name: d.function.name, arguments: d.function.arguments ?? '' });
      } else {
        calls[d.index].arguments += d.function.arguments;
      }
    }
    finish = ch?.finish_reason ?? finish;
  }
  return { calls, finish };
}

test('a named function: its arguments validate, streamed and not', async () => {
  // The generic format describes the named function only.
  for (const name of ['hermes', 'generic']) {
    const req = { model: MODEL_NAME, messages: MESSAGES, tools: TOOLS, seed: 1,
      tool_choice: { type: 'function', function: { name: 'book' } } };
    const r = checked('CreateChatCompletionResponse',
      await clients[name].chat.completions.create(req));
    const msg = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'tool_calls', name);
    assert.equal(msg.tool_calls.length, 1);
    assert.equal(msg.tool_calls[0].function.name, 'book');
    argsValid('book', msg.tool_calls[0].function.arguments);
    const s = await joinCalls(await clients[name].chat.completions.create({ ...req,
      stream: true }));
    assert.equal(s.finish, 'tool_calls');
    assert.equal(s.calls.length, 1);
    assert.equal(s.calls[0].name, 'book');
    argsValid('book', s.calls[0].arguments);
  }
});

test('tool_choice required: every call names a tool and its arguments validate', async () => {
  for (const parallel of [true, false]) {
    const req = { model: MODEL_NAME, messages: MESSAGES, tools: TOOLS, seed: 2,
      tool_choice: 'required', parallel_tool_calls: parallel };
    const r = checked('CreateChatCompletionResponse',
      await clients.hermes.chat.completions.create(req));
    const calls = r.choices[0].message.tool_calls;
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    assert.ok(calls.length >= 1);
    if (!parallel) {
      assert.equal(calls.length, 1);
    }
    for (const c of calls) {
      argsValid(c.function.name, c.function.arguments);
    }
    const s = await joinCalls(await clients.hermes.chat.completions.create({ ...req,
      stream: true }));
    assert.equal(s.finish, 'tool_calls');
    assert.ok(s.calls.length >= 1);
    for (const c of s.calls) {
      argsValid(c.name, c.arguments);
    }
  }
});

const CITY = {
  type: 'object',
  properties: { city: { type: 'string', enum: ['Paris', 'Bath', 'Rome'] } },
  required: ['city'],
  additionalProperties: false,
};

test('responses: text.format json_schema output validates, streamed and not', async () => {
  const body = { model: MODEL_NAME, input: 'Name a city.', seed: 3,
    text: { format: { type: 'json_schema', name: 'city', schema: CITY, strict: true } } };
  const r = await postJson(servers.generic.base, '/v1/responses', body, authHeaders(''));
  assert.equal(r.status, 200, r.text);
  const resp = validate('Response', r.json);
  const v = ajv.compile(CITY);
  const text = resp.output[0].content[0].text;
  assert.ok(v(JSON.parse(text)), text);
  const stream = await clients.generic.responses.create({ ...body, stream: true });
  let streamed = '';
  for await (const ev of stream) {
    checked('ResponseStreamEvent', ev);
    if (ev.type === 'response.output_text.delta') {
      streamed += ev.delta;
    }
  }
  assert.ok(v(JSON.parse(streamed)), streamed);
});

test('responses: tool_choice required gives valid function_call items', async () => {
  const tools = TOOLS.map((t) => ({ type: 'function', name: t.function.name,
    parameters: t.function.parameters }));
  const r = await postJson(servers.hermes.base, '/v1/responses',
    { model: MODEL_NAME, input: 'Book Bath.', tools, tool_choice: 'required', seed: 4 },
    authHeaders(''));
  assert.equal(r.status, 200, r.text);
  const resp = validate('Response', r.json);
  const calls = resp.output.filter((o) => o.type === 'function_call');
  assert.ok(calls.length >= 1);
  for (const c of calls) {
    argsValid(c.name, c.arguments);
  }
});
