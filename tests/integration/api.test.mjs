// api.test.mjs - the OpenAI API through the official `openai` npm SDK:
// completions, chat, streaming, n, logprobs, usage, echo, stop strings,
// multiple prompts, tokenize / detokenize. Every response and every stream
// chunk is validated against the OpenAI schemas; after each test the KV
// pool must be empty again.
import { after, afterEach, before, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import {
  API_KEY, MODEL_NAME, authHeaders, postJson, readSse, startServer, validate, waitKvEmpty,
} from './lib.mjs';

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

// Plain JSON copy (drops SDK-only properties) validated against a schema.
function checked(name, obj) {
  return validate(name, JSON.parse(JSON.stringify(obj)));
}

test('models list names the served model', async () => {
  const page = await client.models.list();
  assert.equal(page.data.length, 1);
  assert.equal(page.data[0].id, MODEL_NAME);
  const res = await fetch(`${srv.base}/v1/models`, { headers: authHeaders() });
  checked('ListModelsResponse', await res.json());
});

test('greedy completion is deterministic and counts usage', async () => {
  const req = { model: MODEL_NAME, prompt: 'Emma Woodhouse', max_tokens: 12, temperature: 0 };
  const a = checked('CreateCompletionResponse', await client.completions.create(req));
  const b = checked('CreateCompletionResponse', await client.completions.create(req));
  assert.equal(a.object, 'text_completion');
  assert.equal(a.model, MODEL_NAME);
  assert.equal(a.choices.length, 1);
  assert.equal(a.choices[0].text, b.choices[0].text);
  assert.ok(a.choices[0].text.length > 0);
  assert.ok(['stop', 'length'].includes(a.choices[0].finish_reason));
  const u = a.usage;
  assert.ok(u.prompt_tokens >= 3);
  assert.ok(u.completion_tokens >= 1 && u.completion_tokens <= 12);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
  if (a.choices[0].finish_reason === 'length') {
    assert.equal(u.completion_tokens, 12);
  }
});

test('n choices, seeds and several prompts', async () => {
  const r = checked('CreateCompletionResponse', await client.completions.create({
    model: MODEL_NAME, prompt: 'It is a truth', max_tokens: 6, n: 3, temperature: 1, seed: 7,
  }));
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  const again = await client.completions.create({
    model: MODEL_NAME, prompt: 'It is a truth', max_tokens: 6, n: 3, temperature: 1, seed: 7,
  });
  assert.deepEqual(again.choices.map((c) => c.text), r.choices.map((c) => c.text));

  const multi = checked('CreateCompletionResponse', await client.completions.create({
    model: MODEL_NAME, prompt: ['Mr. Darcy', 'Elizabeth'], max_tokens: 4, n: 2, temperature: 0,
  }));
  assert.equal(multi.choices.length, 4);
  assert.deepEqual(multi.choices.map((c) => c.index), [0, 1, 2, 3]);
  // Greedy: both choices of one prompt agree.
  assert.equal(multi.choices[0].text, multi.choices[1].text);
  assert.equal(multi.choices[2].text, multi.choices[3].text);
  const single = await client.completions.create({
    model: MODEL_NAME, prompt: 'Elizabeth', max_tokens: 4, temperature: 0,
  });
  assert.equal(multi.choices[2].text, single.choices[0].text);
});

test('token id prompts and echo', async () => {
  const tok = await postJson(srv.base, '/tokenize', { model: MODEL_NAME, prompt: 'Emma' });
  assert.equal(tok.status, 200);
  assert.equal(tok.json.count, tok.json.tokens.length);
  const byText = await client.completions.create({
    model: MODEL_NAME, prompt: 'Emma', max_tokens: 5, temperature: 0,
  });
  const byIds = checked('CreateCompletionResponse', await client.completions.create({
    model: MODEL_NAME, prompt: tok.json.tokens, max_tokens: 5, temperature: 0,
  }));
  assert.equal(byIds.choices[0].text, byText.choices[0].text);
  assert.equal(byIds.usage.prompt_tokens, tok.json.count);
  const echo = checked('CreateCompletionResponse', await client.completions.create({
    model: MODEL_NAME, prompt: 'Emma', max_tokens: 5, temperature: 0, echo: true,
  }));
  assert.equal(echo.choices[0].text, 'Emma' + byText.choices[0].text);
  let streamed = '';
  for await (const chunk of await client.completions.create({
    model: MODEL_NAME, prompt: tok.json.tokens, max_tokens: 5, temperature: 0, echo: true,
    stream: true,
  })) {
    checked('CreateCompletionStreamResponse', chunk);
    streamed += chunk.choices[0]?.text ?? '';
  }
  assert.equal(streamed, 'Emma' + byText.choices[0].text);
  const det = await postJson(srv.base, '/detokenize', { tokens: tok.json.tokens });
  assert.equal(det.status, 200);
  assert.match(det.json.prompt, /Emma/);
});

test('completion logprobs', async () => {
  const r = checked('CreateCompletionResponse', await client.completions.create({
    model: MODEL_NAME, prompt: 'Emma', max_tokens: 6, temperature: 0, logprobs: 2,
  }));
  const lp = r.choices[0].logprobs;
  assert.ok(lp);
  assert.equal(lp.tokens.length, r.usage.completion_tokens);
  assert.equal(lp.token_logprobs.length, lp.tokens.length);
  assert.equal(lp.top_logprobs.length, lp.tokens.length);
  assert.equal(lp.text_offset.length, lp.tokens.length);
  for (let i = 0; i < lp.tokens.length; i++) {
    assert.ok(lp.token_logprobs[i] <= 0);
    const keys = Object.keys(lp.top_logprobs[i]);
    assert.ok(keys.length >= 1 && keys.length <= 2);
    // Greedy: the chosen token is the most likely one.
    const best = Math.max(...Object.values(lp.top_logprobs[i]));
    assert.ok(Math.abs(best - lp.token_logprobs[i]) < 1e-4);
  }
});

test('stop strings end the text before the match, across token boundaries', async () => {
  const base = await client.completions.create({
    model: MODEL_NAME, prompt: 'She was', max_tokens: 24, temperature: 0, ignore_eos: true,
  });
  const text = base.choices[0].text;
  assert.ok(text.length >= 8, `short text ${JSON.stringify(text)}`);
  // A 3-character stop string from the middle of the text: it usually spans
  // a token boundary, and the text must end right before its first match.
  const stop = text.slice(4, 7);
  const cut = text.indexOf(stop);
  for (const stream of [false, true]) {
    let got = '';
    let finish = null;
    if (stream) {
      const s = await client.completions.create({
        model: MODEL_NAME, prompt: 'She was', max_tokens: 24, temperature: 0, ignore_eos: true,
        stop: [stop, 'zzzz-never'], stream: true,
      });
      for await (const chunk of s) {
        checked('CreateCompletionStreamResponse', chunk);
        got += chunk.choices[0]?.text ?? '';
        finish = chunk.choices[0]?.finish_reason ?? finish;
      }
    } else {
      const r = checked('CreateCompletionResponse', await client.completions.create({
        model: MODEL_NAME, prompt: 'She was', max_tokens: 24, temperature: 0, ignore_eos: true,
        stop: [stop, 'zzzz-never'],
      }));
      got = r.choices[0].text;
      finish = r.choices[0].finish_reason;
    }
    assert.equal(got, text.slice(0, cut), `stream=${stream}`);
    assert.equal(finish, 'stop');
  }
});

test('streamed completion equals the non-streamed one', async () => {
  const req = { model: MODEL_NAME, prompt: 'Emma Woodhouse', max_tokens: 16, temperature: 0 };
  const full = await client.completions.create(req);
  const stream = await client.completions.create({
    ...req, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let usage = null;
  let finish = null;
  for await (const chunk of stream) {
    checked('CreateCompletionStreamResponse', chunk);
    if (chunk.usage) {
      usage = chunk.usage;
      assert.equal(chunk.choices.length, 0);
    }
    for (const c of chunk.choices) {
      text += c.text;
      finish = c.finish_reason ?? finish;
    }
  }
  assert.equal(text, full.choices[0].text);
  assert.equal(finish, full.choices[0].finish_reason);
  assert.deepEqual(usage, full.usage);
});

test('raw SSE framing ends with [DONE]', async () => {
  const res = await fetch(`${srv.base}/v1/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...authHeaders() },
    body: JSON.stringify({ model: MODEL_NAME, prompt: 'Emma', max_tokens: 5, stream: true }),
  });
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type'), /^text\/event-stream/);
  // The id the server logs the request under.
  const rid = res.headers.get('x-request-id');
  assert.match(rid, /^\d+$/);
  const { events, done, text } = await readSse(res);
  assert.ok(done);
  assert.ok(text.endsWith('data: [DONE]\n\n'));
  assert.ok(events.length >= 1);
  for (const e of events) {
    validate('CreateCompletionStreamResponse', e);
  }
  assert.ok(events.at(-1).choices[0].finish_reason);
  assert.ok(srv.logs.some((l) => l.includes(`req=${rid} `)), `no log line for req=${rid}`);
});

test('chat completion, logprobs and usage', async () => {
  const r = checked('CreateChatCompletionResponse', await client.chat.completions.create({
    model: MODEL_NAME,
    messages: [{ role: 'system', content: 'You are Emma.' }, { role: 'user', content: 'Hello' }],
    max_tokens: 10,
    temperature: 0,
    logprobs: true,
    top_logprobs: 3,
  }));
  assert.equal(r.object, 'chat.completion');
  const c = r.choices[0];
  assert.equal(c.message.role, 'assistant');
  assert.equal(typeof c.message.content, 'string');
  assert.equal(c.logprobs.content.length, r.usage.completion_tokens);
  for (const t of c.logprobs.content) {
    assert.ok(t.top_logprobs.length <= 3);
    assert.ok(t.logprob <= 0);
    assert.ok(Array.isArray(t.bytes));
  }
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

test('streamed chat with n=2 and include_usage', async () => {
  const req = {
    model: MODEL_NAME,
    messages: [{ role: 'user', content: [{ type: 'text', text: 'Tell me of Mr. Knightley' }] }],
    max_completion_tokens: 12,
    temperature: 0,
  };
  const full = checked('CreateChatCompletionResponse', await client.chat.completions.create(req));
  const stream = await client.chat.completions.create({
    ...req, n: 2, stream: true, stream_options: { include_usage: true },
  });
  const text = ['', ''];
  const finish = [null, null];
  const roleSeen = [false, false];
  let usage = null;
  for await (const chunk of stream) {
    checked('CreateChatCompletionStreamResponse', chunk);
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) {
      usage = chunk.usage;
      assert.equal(chunk.choices.length, 0);
    }
    for (const c of chunk.choices) {
      if (c.delta.role) {
        assert.equal(c.delta.role, 'assistant');
        roleSeen[c.index] = true;
      }
      assert.ok(roleSeen[c.index], 'role comes in the first chunk of a choice');
      text[c.index] += c.delta.content ?? '';
      finish[c.index] = c.finish_reason ?? finish[c.index];
    }
  }
  assert.equal(text[0], full.choices[0].message.content);
  assert.equal(text[1], full.choices[0].message.content);
  assert.deepEqual(finish, [full.choices[0].finish_reason, full.choices[0].finish_reason]);
  assert.equal(usage.completion_tokens, 2 * full.usage.completion_tokens);
  assert.equal(usage.prompt_tokens, full.usage.prompt_tokens);
});

test('tokenize chat messages', async () => {
  const r = await postJson(srv.base, '/tokenize', {
    messages: [{ role: 'user', content: 'Hello' }],
  });
  assert.equal(r.status, 200);
  const chat = await client.chat.completions.create({
    model: MODEL_NAME, messages: [{ role: 'user', content: 'Hello' }], max_tokens: 1,
  });
  assert.equal(chat.usage.prompt_tokens, r.json.count);
});
