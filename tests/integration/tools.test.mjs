// tools.test.mjs - tool calling, reasoning output and the Responses API
// through the official `openai` npm SDK: tools with tool_choice auto / none,
// a tool round trip in the history (the default model's template, which has
// no tool syntax, so the generic format; and a small Hermes-style template),
// chat_template_kwargs, --reasoning-parser deepseek_r1, and
// responses.create streamed and not. Every body and every stream chunk or
// event is validated against the OpenAI schemas. The default model is tiny
// and its output random, so what is checked is the plumbing: validity,
// what reaches the prompt (its token count), and that streamed and whole
// answers agree. Constrained outputs (tool_choice required / named,
// text.format json_schema) are in tools_constrained.test.mjs.
import { after, afterEach, before, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import {
  MODEL_NAME, SRC_ROOT, authHeaders, postJson, startServer, validate, waitKvEmpty,
} from './lib.mjs';

const servers = {};
const clients = {};

before(async () => {
  const hermes = path.join(SRC_ROOT, 'tests', 'integration', 'fixtures', 'tools-hermes.jinja');
  servers.generic = await startServer([]);
  servers.hermes = await startServer(['--chat-template', hermes]);
  servers.r1 = await startServer(['--reasoning-parser', 'deepseek_r1']);
  for (const [k, s] of Object.entries(servers)) {
    clients[k] = new OpenAI({ baseURL: `${s.base}/v1`, apiKey: 'none', maxRetries: 0 });
  }
});

after(async () => {
  for (const s of Object.values(servers)) {
    const st = await s.stop('SIGTERM');
    assert.equal(st.code, 0, s.logs.join('\n'));
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

// Small: the default model's context is 256 tokens, and its tokenizer spends
// about one token per JSON character.
const WEATHER = { type: 'function', function: { name: 'weather', parameters: { type: 'object' } } };
const USER = { role: 'user', content: 'Weather in Bath?' };
const ROUND_TRIP = [
  USER,
  {
    role: 'assistant', content: null,
    tool_calls: [{ id: 'call_1', type: 'function',
      function: { name: 'weather', arguments: '{"c":1}' } }],
  },
  { role: 'tool', tool_call_id: 'call_1', content: 'rain' },
];

function chat(client, extra) {
  return client.chat.completions.create({
    model: MODEL_NAME, messages: [USER], max_tokens: 8, temperature: 0, ...extra,
  });
}

// A message's tool calls are well formed wherever the model made some.
function checkCalls(msg, finish) {
  if (msg.tool_calls && msg.tool_calls.length > 0) {
    assert.equal(finish, 'tool_calls');
    for (const c of msg.tool_calls) {
      assert.match(c.id, /^call_[A-Za-z0-9]{24}$/);
      assert.equal(c.type, 'function');
      assert.equal(c.function.name, 'weather');
      JSON.parse(c.function.arguments);
    }
  } else {
    assert.ok(['stop', 'length'].includes(finish), finish);
    assert.equal(typeof msg.content, 'string');
  }
}

// Joins a chat stream: content, reasoning, calls by index, finish.
async function joinStream(stream) {
  const out = { content: '', reasoning: '', calls: [], finish: null, chunks: 0 };
  for await (const chunk of stream) {
    checked('CreateChatCompletionStreamResponse', chunk);
    out.chunks++;
    const ch = chunk.choices[0];
    if (!ch) {
      continue;
    }
    out.content += ch.delta.content ?? '';
    out.reasoning += ch.delta.reasoning_content ?? '';
    for (const d of ch.delta.tool_calls ?? []) {
      if (d.id) {
        assert.equal(out.calls.length, d.index, 'a call starts at the next index');
        out.calls.push({ id: d.id, name: d.function.name, arguments: d.function.arguments });
      } else {
        out.calls[d.index].arguments += d.function.arguments;
      }
    }
    if (ch.finish_reason) {
      assert.equal(out.finish, null, 'one finish_reason');
      out.finish = ch.finish_reason;
    }
  }
  return out;
}

test('tools with tool_choice auto describe them in the prompt (generic format); none does not', async () => {
  const plain = checked('CreateChatCompletionResponse', await chat(clients.generic, {}));
  const auto = checked('CreateChatCompletionResponse',
    await chat(clients.generic, { tools: [WEATHER], tool_choice: 'auto' }));
  const none = checked('CreateChatCompletionResponse',
    await chat(clients.generic, { tools: [WEATHER], tool_choice: 'none' }));
  assert.ok(auto.usage.prompt_tokens > plain.usage.prompt_tokens + 20,
    `${auto.usage.prompt_tokens} vs ${plain.usage.prompt_tokens}`);
  assert.equal(none.usage.prompt_tokens, plain.usage.prompt_tokens);
  checkCalls(auto.choices[0].message, auto.choices[0].finish_reason);
  assert.equal(none.choices[0].message.tool_calls, undefined);
  assert.equal(none.choices[0].message.content, plain.choices[0].message.content);
  const dflt = checked('CreateChatCompletionResponse',
    await chat(clients.generic, { tools: [WEATHER] }));
  assert.equal(dflt.usage.prompt_tokens, auto.usage.prompt_tokens, 'auto is the default');
});

test('a streamed tool request answers what the whole one does', async () => {
  for (const [name, client] of [['generic', clients.generic], ['hermes', clients.hermes]]) {
    const req = { tools: [WEATHER], max_tokens: 24, seed: 7 };
    const whole = checked('CreateChatCompletionResponse', await chat(client, req));
    const s = await joinStream(await chat(client, { ...req, stream: true }));
    const msg = whole.choices[0].message;
    checkCalls(msg, whole.choices[0].finish_reason);
    assert.equal(s.finish, whole.choices[0].finish_reason, name);
    assert.equal(s.content, msg.content ?? '', name);
    assert.deepEqual(s.calls.map((c) => [c.name, c.arguments]),
      (msg.tool_calls ?? []).map((c) => [c.function.name, c.function.arguments]), name);
  }
});

test('a tool round trip in the history is rendered and answered', async () => {
  // The generic format's tool description and the history together pass the
  // default model's 256-token context: there the history goes with
  // tool_choice none (tools not described, history still written as JSON).
  for (const [name, choice] of [['generic', 'none'], ['hermes', 'auto']]) {
    const client = clients[name];
    const req = { tools: [WEATHER], tool_choice: choice };
    const first = checked('CreateChatCompletionResponse',
      await chat(client, { ...req, messages: [USER] }));
    const rt = checked('CreateChatCompletionResponse',
      await chat(client, { ...req, messages: ROUND_TRIP }));
    assert.ok(rt.usage.prompt_tokens > first.usage.prompt_tokens + 10,
      `${name}: ${rt.usage.prompt_tokens} vs ${first.usage.prompt_tokens}`);
    checkCalls(rt.choices[0].message, rt.choices[0].finish_reason);
    // The call and its result reach the prompt: another result, another prompt.
    const other = structuredClone(ROUND_TRIP);
    other[2].content = 'rain rain rain rain rain';
    const rt2 = checked('CreateChatCompletionResponse',
      await chat(client, { ...req, messages: other }));
    assert.ok(rt2.usage.prompt_tokens > rt.usage.prompt_tokens, name);
    // Without tools in the request the history still renders.
    checked('CreateChatCompletionResponse', await chat(client, { messages: ROUND_TRIP }));
  }
  // The template sees the tools: the Hermes one lists them.
  const a = await chat(clients.hermes, {});
  const b = await chat(clients.hermes, { tools: [WEATHER] });
  assert.ok(b.usage.prompt_tokens > a.usage.prompt_tokens);
});

test('chat_template_kwargs reach the template', async () => {
  const a = await chat(clients.hermes, {});
  const b = await chat(clients.hermes, { chat_template_kwargs: { greeting: 'Good morning to all' } });
  assert.ok(b.usage.prompt_tokens > a.usage.prompt_tokens,
    `${b.usage.prompt_tokens} vs ${a.usage.prompt_tokens}`);
  const r = await postJson(servers.hermes.base, '/v1/chat/completions',
    { model: MODEL_NAME, messages: [USER], chat_template_kwargs: 'x' }, {});
  assert.equal(r.status, 400);
  assert.equal(r.json.error.param, 'chat_template_kwargs');
});

test('bad tools are refused with a 400 that names the problem', async () => {
  const cases = [
    [{ tools: { a: 1 } }, 'tools', /array/],
    [{ tools: [{ type: 'retrieval' }] }, 'tools', /tools\[0\]: 'type'/],
    [{ tools: [{ type: 'function', function: { name: 'has space' } }] }, 'tools', /name/],
    [{ tools: [{ type: 'function', function: { name: 'f', parameters: 3 } }] }, 'tools',
      /parameters/],
    [{ tools: [WEATHER], tool_choice: { type: 'function', function: { name: 'nope' } } },
      'tool_choice', /nope/],
    [{ tool_choice: 'required' }, 'tool_choice', /tools/],
    [{ tools: [WEATHER], parallel_tool_calls: 'yes' }, 'parallel_tool_calls', /boolean/],
    [{ messages: [{ role: 'tool', content: 'x' }] }, 'messages', /tool_call_id/],
    [{ messages: [{ role: 'assistant', content: null, tool_calls: [{ id: 'a' }] }] }, 'messages',
      /tool_calls\[0\]/],
  ];
  for (const [extra, param, msg] of cases) {
    const r = await postJson(servers.generic.base, '/v1/chat/completions',
      { model: MODEL_NAME, messages: [USER], max_tokens: 2, ...extra }, {});
    assert.equal(r.status, 400, JSON.stringify(extra));
    validate('ErrorResponse', r.json);
    assert.equal(r.json.error.param, param, JSON.stringify(extra));
    assert.match(r.json.error.message, msg);
  }
});

test('--reasoning-parser deepseek_r1 returns an unclosed think block as reasoning_content', async () => {
  const req = { max_tokens: 10 };
  const plain = checked('CreateChatCompletionResponse', await chat(clients.generic, req));
  const r1 = checked('CreateChatCompletionResponse', await chat(clients.r1, req));
  const text = plain.choices[0].message.content;
  assert.ok(text.length > 0);
  // The model never closes <think>: everything is reasoning (the open tag
  // is the template's, as with DeepSeek-R1).
  assert.equal(r1.choices[0].message.reasoning_content, text);
  assert.equal(r1.choices[0].message.content, '');
  const s = await joinStream(await chat(clients.r1, { ...req, stream: true }));
  assert.equal(s.reasoning, text);
  assert.equal(s.content, '');
  assert.equal(s.finish, r1.choices[0].finish_reason);
});

// ---- /v1/responses ---------------------------------------------------------------

async function responsesRaw(body, base = servers.generic.base) {
  return postJson(base, '/v1/responses', { model: MODEL_NAME, ...body }, authHeaders(''));
}

test('responses.create answers a Response', async () => {
  const req = { input: 'Hello there', instructions: 'Be brief.', max_output_tokens: 8,
    temperature: 0 };
  const r = await responsesRaw(req);
  assert.equal(r.status, 200, r.text);
  const resp = validate('Response', r.json);
  assert.match(resp.id, /^resp_/);
  assert.equal(resp.object, 'response');
  assert.ok(['completed', 'incomplete'].includes(resp.status));
  assert.equal(resp.instructions, 'Be brief.');
  assert.equal(resp.store, false);
  assert.equal(resp.output.length, 1);
  assert.equal(resp.output[0].type, 'message');
  assert.equal(resp.output[0].role, 'assistant');
  assert.equal(resp.usage.output_tokens <= 8, true);
  assert.equal(resp.usage.total_tokens, resp.usage.input_tokens + resp.usage.output_tokens);
  if (resp.status === 'incomplete') {
    assert.equal(resp.incomplete_details.reason, 'max_output_tokens');
    assert.equal(resp.usage.output_tokens, 8);
  }
  const sdk = await clients.generic.responses.create({ model: MODEL_NAME, ...req });
  assert.equal(sdk.output_text, resp.output[0].content[0].text);
  // The same conversation as chat messages gives the same prompt.
  const c = await chat(clients.generic, { messages: [
    { role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello there' }] });
  assert.equal(resp.usage.input_tokens, c.usage.prompt_tokens);
});

test('responses.create streams the Responses events', async () => {
  const req = { input: [{ role: 'user', content: [{ type: 'input_text', text: 'Hello' }] }],
    max_output_tokens: 12, temperature: 0 };
  const whole = (await responsesRaw(req)).json;
  const stream = await clients.generic.responses.create({ model: MODEL_NAME, ...req,
    stream: true });
  const types = [];
  let text = '';
  let seq = -1;
  let last = null;
  for await (const ev of stream) {
    checked('ResponseStreamEvent', ev);
    types.push(ev.type);
    assert.equal(ev.sequence_number, seq + 1);
    seq = ev.sequence_number;
    if (ev.type === 'response.output_text.delta') {
      text += ev.delta;
    }
    if (ev.type === 'response.output_text.done') {
      assert.equal(ev.text, text);
    }
    last = ev;
  }
  assert.deepEqual(types.slice(0, 4), ['response.created', 'response.in_progress',
    'response.output_item.added', 'response.content_part.added']);
  assert.ok(types.includes('response.output_text.delta'));
  assert.deepEqual(types.slice(-4), ['response.output_text.done', 'response.content_part.done',
    'response.output_item.done', whole.status === 'completed' ? 'response.completed'
      : 'response.incomplete']);
  assert.equal(text, whole.output[0].content[0].text);
  assert.equal(last.response.status, whole.status);
  assert.deepEqual(last.response.output[0].content, whole.output[0].content);
  assert.deepEqual(last.response.usage, whole.usage);
});

test('responses.create takes function tools and a function call round trip', async () => {
  const tools = [{ type: 'function', name: 'weather', parameters: { type: 'object' } }];
  const input = [
    { role: 'user', content: 'Weather in Bath?' },
    { type: 'function_call', call_id: 'call_1', name: 'weather', arguments: '{"c":1}' },
    { type: 'function_call_output', call_id: 'call_1', output: 'rain' },
  ];
  for (const [base, choice] of [[servers.generic.base, 'none'], [servers.hermes.base, 'auto']]) {
    const r = await responsesRaw({ input, tools, tool_choice: choice, max_output_tokens: 16 },
      base);
    assert.equal(r.status, 200, r.text);
    const resp = validate('Response', r.json);
    assert.equal(resp.tools[0].name, 'weather');
    for (const item of resp.output) {
      if (item.type === 'function_call') {
        assert.equal(item.name, 'weather');
        assert.match(item.call_id, /^call_/);
        JSON.parse(item.arguments);
      }
    }
    assert.equal(resp.tool_choice, choice);
    const first = await responsesRaw({ input: input.slice(0, 1), tools, tool_choice: choice,
      max_output_tokens: 2 }, base);
    assert.ok(resp.usage.input_tokens > first.json.usage.input_tokens + 5);
    const s = await clients.hermes.responses.create({ model: MODEL_NAME, input, tools,
      max_output_tokens: 16, stream: true });
    for await (const ev of s) {
      checked('ResponseStreamEvent', ev);
    }
  }
});

test('responses: store true, stateful fields and bad input are 400', async () => {
  const ok = await responsesRaw({ input: 'x', store: false, max_output_tokens: 2 });
  assert.equal(ok.status, 200, ok.text);
  const cases = [
    [{ input: 'x', store: true }, 'store', /store/],
    [{ input: 'x', previous_response_id: 'resp_1' }, 'previous_response_id', /input/],
    [{}, 'input', /input/],
    [{ input: 'x', tools: [{ type: 'web_search' }] }, 'tools', /function/],
    [{ input: 'x', tools: [{ type: 'function', name: 'a b' }] }, 'tools', /name/],
    [{ input: 'x', tool_choice: 'required' }, 'tool_choice', /tools/],
    [{ input: [{ type: 'computer_call' }] }, 'input', /computer_call/],
    [{ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'x' }] }] }, 'input',
      /text-only/],
    [{ input: 'x', text: { format: { type: 'json_schema' } } }, 'text.format', /schema/],
    [{ input: 'x', max_output_tokens: 0 }, 'max_output_tokens', /max_output_tokens/],
  ];
  for (const [body, param, msg] of cases) {
    const r = await responsesRaw(body);
    assert.equal(r.status, 400, JSON.stringify(body));
    validate('ErrorResponse', r.json);
    assert.equal(r.json.error.param, param, JSON.stringify(body) + r.text);
    assert.match(r.json.error.message, msg, r.text);
  }
  // The SDK surfaces it as an API error.
  await assert.rejects(clients.generic.responses.create({ model: MODEL_NAME, input: 'x',
    store: true }), (e) => e.status === 400);
});

test('responses: text.format json_schema is accepted', async () => {
  const r = await responsesRaw({ input: 'Name a city.', max_output_tokens: 4,
    text: { format: { type: 'json_schema', name: 'city', schema: { type: 'object',
      properties: { city: { type: 'string' } }, required: ['city'] } } } });
  assert.equal(r.status, 200, r.text);
  const resp = validate('Response', r.json);
  assert.equal(resp.text.format.type, 'json_schema');
});
