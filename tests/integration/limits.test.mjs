// limits.test.mjs - request limits checked before costly work on the loop
// thread (issue 15): a prompt longer in bytes than the context could hold
// is refused before tokenizing, stop strings are capped at 1024 bytes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { MODEL_NAME, postJson, startServer } from './lib.mjs';

test('oversized prompts and stop strings are refused with a 400', async () => {
  const srv = await startServer([]);
  try {
    // 2 MiB of text: far more than 256 tokens of context can hold.
    const big = 'It is a truth universally acknowledged. '.repeat(52429);
    for (const [route, body] of [
      ['/v1/completions', { model: MODEL_NAME, prompt: big, max_tokens: 4 }],
      ['/v1/chat/completions',
        { model: MODEL_NAME, messages: [{ role: 'user', content: big }], max_tokens: 4 }],
    ]) {
      const r = await postJson(srv.base, route, body, {});
      assert.equal(r.status, 400, r.text);
      assert.equal(r.json.error.param, 'prompt');
      assert.match(r.json.error.message, /the prompt is \d+ bytes: more than 256 tokens/);
    }
    // A prompt under the byte cap but over the context still gets the token count.
    const over = await postJson(srv.base, '/v1/completions',
      { model: MODEL_NAME, prompt: 'word '.repeat(400), max_tokens: 4 }, {});
    assert.equal(over.status, 400, over.text);
    assert.doesNotMatch(over.json.error.message, /bytes/);

    const stop = 'x'.repeat(1025);
    for (const s of [stop, ['ok', stop]]) {
      const r = await postJson(srv.base, '/v1/completions',
        { model: MODEL_NAME, prompt: 'Emma', max_tokens: 4, stop: s }, {});
      assert.equal(r.status, 400, r.text);
      assert.equal(r.json.error.param, 'stop');
      assert.match(r.json.error.message, /at most 1024 bytes/);
    }
    const ok = await postJson(srv.base, '/v1/completions',
      { model: MODEL_NAME, prompt: 'Emma', max_tokens: 4, stop: 'y'.repeat(1024) }, {});
    assert.equal(ok.status, 200, ok.text);
  } finally {
    await srv.stop();
  }
});
