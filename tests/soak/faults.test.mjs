// faults.test.mjs - lifecycle faults.
//  * Allocation failure: with KVSERVE_FAIL_ALLOC_AFTER=N the N-th fallible
//    allocation on the request path fails once. For every allocation site
//    of a two-prompt request with logit_bias (3 + 2 x 3 sites), that request
//    gets a clean 503 JSON error, the next identical request succeeds, no
//    KV block stays in use and the daemon exits 0; N one past the last site
//    leaves the request untouched and fails the next one.
//  * SIGTERM with 24 requests accepted, most of them queued: all complete.
//  * A second SIGTERM during a drain ends the open streams with an error
//    event and [DONE] (never a torn response) and the daemon exits.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  MODEL_NAME, getMetrics, metricValue, postJson, readSse, startServer, validate, waitKvEmpty,
} from '../integration/lib.mjs';

const req = {
  model: MODEL_NAME, prompt: ['Emma Woodhouse, handsome,', 'It is a truth'], max_tokens: 8,
  temperature: 0, logit_bias: { 5: 1 },
};
const SITES = 9;

test('an allocation failure at each request-path site fails that request only', async () => {
  const ref = await (async () => {
    const srv = await startServer([]);
    try {
      return await postJson(srv.base, '/v1/completions', req, {});
    } finally {
      await srv.stop();
    }
  })();
  assert.equal(ref.status, 200);
  for (let n = 1; n <= SITES + 1; n++) {
    const srv = await startServer([], { env: { KVSERVE_FAIL_ALLOC_AFTER: String(n) } });
    try {
      const r1 = await postJson(srv.base, '/v1/completions', req, {});
      if (n <= SITES) {
        assert.equal(r1.status, 503, `site ${n}: ${r1.status} ${r1.text}`);
        validate('ErrorResponse', r1.json);
        assert.match(r1.json.error.message, /out of memory/);
      } else {
        assert.equal(r1.status, 200, r1.text);
      }
      if (n > SITES) {
        // The countdown went on into the next request's first site.
        const r = await postJson(srv.base, '/v1/completions', req, {});
        assert.equal(r.status, 503, `exactly ${SITES} sites per request: ${r.text}`);
      }
      const r2 = await postJson(srv.base, '/v1/completions', req, {});
      assert.equal(r2.status, 200, `site ${n}, next request: ${r2.text}`);
      assert.deepEqual(r2.json.choices.map((c) => c.text), ref.json.choices.map((c) => c.text));
      await waitKvEmpty(srv.base);
      const m = await getMetrics(srv.base);
      assert.equal(metricValue(m, 'kvserve:requests_in_flight'), 0);
    } finally {
      const st = await srv.stop();
      assert.equal(st.code, 0, `site ${n}: exit ${st.code ?? st.sig}\n${srv.logs.join('\n')}`);
    }
  }
  // A failing streaming request is refused before its headers: a plain 503.
  const srv = await startServer([], { env: { KVSERVE_FAIL_ALLOC_AFTER: '2' } });
  try {
    const r = await postJson(srv.base, '/v1/completions', { ...req, stream: true }, {});
    assert.equal(r.status, 503, r.text);
    validate('ErrorResponse', r.json);
    await waitKvEmpty(srv.base);
  } finally {
    await srv.stop();
  }
});

test('a second SIGTERM during the drain ends every stream with an error event', async () => {
  const srv = await startServer(['--drain-timeout', '120']);
  const long = {
    model: MODEL_NAME, prompt: 'Emma', max_tokens: 250, ignore_eos: true, stream: true,
  };
  const streams = Array.from({ length: 6 }, async () => {
    const res = await fetch(`${srv.base}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(long),
    });
    assert.equal(res.status, 200);
    return readSse(res);
  });
  for (;;) {
    const m = await getMetrics(srv.base);
    if (metricValue(m, 'kvserve:requests_in_flight') >= 6) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  srv.proc.kill('SIGTERM');
  await new Promise((r) => setTimeout(r, 200));
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
