// lifecycle.test.mjs - a client that vanishes mid-stream is cancelled and its
// KV blocks freed; SIGTERM during 16 streams loses none of them and the
// daemon exits 0; health, metrics and version answer.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import {
  MODEL_NAME, getMetrics, metricValue, postJson, readSse, startServer, validate, waitKvEmpty,
} from './lib.mjs';

const longReq = {
  model: MODEL_NAME, prompt: 'Emma Woodhouse, handsome, clever, and rich,', max_tokens: 200,
  ignore_eos: true, stream: true,
};

// Opens a stream, reads until the first data event, then destroys the socket.
function openAndDrop(port) {
  return new Promise((resolve, reject) => {
    const body = JSON.stringify(longReq);
    const req = http.request({
      host: '127.0.0.1', port, path: '/v1/completions', method: 'POST',
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) },
    }, (res) => {
      assert.equal(res.statusCode, 200);
      res.once('data', () => {
        req.destroy();
        resolve();
      });
    });
    req.on('error', (e) => {
      if (e.code !== 'ECONNRESET') {
        reject(e);
      }
    });
    req.end(body);
  });
}

test('a client that disconnects mid-stream frees its blocks', async () => {
  const srv = await startServer(['--max-num-seqs', '8']);
  try {
    await openAndDrop(srv.port);
    // The engine must cancel well before 200 tokens are generated.
    await waitKvEmpty(srv.base);
    const m = await getMetrics(srv.base);
    assert.ok(metricValue(m, 'kvserve:client_disconnects_total') >= 1);
    assert.ok(metricValue(m, 'kvserve:request_success_total',
      'finished_reason="abort"') >= 1);
    const gen = metricValue(m, 'kvserve:generation_tokens_total', 'tenant="default"');
    assert.ok(gen < 200, `generated ${gen} tokens for a dropped client`);
    assert.ok(srv.logs.some((l) => /disconnect|closed early/.test(l)), srv.logs.join('\n'));
    // Several at once, then the pool is empty again.
    await Promise.all(Array.from({ length: 6 }, () => openAndDrop(srv.port)));
    await waitKvEmpty(srv.base);
  } finally {
    const st = await srv.stop();
    assert.equal(st.code, 0);
  }
});

test('SIGTERM during 16 streams loses none of them', async () => {
  const srv = await startServer(['--drain-timeout', '120']);
  const req = { ...longReq, max_tokens: 200 };
  const streams = Array.from({ length: 16 }, async () => {
    const res = await fetch(`${srv.base}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(req),
    });
    assert.equal(res.status, 200);
    return readSse(res);
  });
  // Wait until all 16 are in flight, then ask the daemon to stop.
  for (;;) {
    const m = await getMetrics(srv.base);
    if (metricValue(m, 'kvserve:requests_in_flight') >= 16) {
      break;
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  srv.proc.kill('SIGTERM');
  const results = await Promise.all(streams);
  for (const { events, done } of results) {
    assert.ok(done, 'stream ended with [DONE]');
    let tokens = 0;
    for (const e of events) {
      assert.equal(e.error, undefined, JSON.stringify(e));
      validate('CreateCompletionStreamResponse', e);
      tokens += e.choices.length;
    }
    assert.equal(events.at(-1).choices[0].finish_reason, 'length');
  }
  const st = await srv.exited;
  assert.equal(st.code, 0, srv.logs.join('\n'));
  assert.ok(srv.logs.some((l) => /draining/.test(l)));
  // New connections are refused once the daemon is gone.
  await assert.rejects(fetch(`${srv.base}/health`));
});

test('health, metrics and version answer', async () => {
  const srv = await startServer([]);
  try {
    const h = await fetch(`${srv.base}/health`);
    assert.equal(h.status, 200);
    const v = await (await fetch(`${srv.base}/version`)).json();
    assert.match(v.version, /^\d+\.\d+\.\d+/);
    const m = await getMetrics(srv.base);
    for (const name of ['kvserve:num_requests_running', 'kvserve:num_requests_waiting',
      'kvserve:num_requests_swapped', 'kvserve:prefix_cache_queries_total',
      'kvserve:prefix_cache_hits_total']) {
      assert.notEqual(metricValue(m, name), undefined, name);
    }
    assert.match(m, /# TYPE kvserve:time_to_first_token_seconds histogram/);
    assert.match(m, /kvserve:kv_cache_usage_perc\{[^}]*tier="device"/);
    assert.match(m, /kvserve:num_preemptions_total\{kind="swap"\}/);
    await waitKvEmpty(srv.base);
  } finally {
    assert.equal((await srv.stop('SIGINT')).code, 0);
  }
});

test('health answers 503 once the engine has died', async () => {
  // KVSERVE_TEST_FAIL_FORWARD_AT=3: the third forward pass (the warm-up
  // step is the first, the request's prefill the second) fails as a device
  // failure would, which ends the engine thread.
  const srv = await startServer([], { env: { KVSERVE_TEST_FAIL_FORWARD_AT: '3' } });
  try {
    assert.equal((await fetch(`${srv.base}/health`)).status, 200);
    const r = await postJson(srv.base, '/v1/completions',
      { model: MODEL_NAME, prompt: 'Emma', max_tokens: 8, ignore_eos: true });
    assert.ok(r.status >= 500, `status ${r.status}: ${r.text}`);
    assert.equal(typeof r.json.error.message, 'string', r.text);
    const h = await fetch(`${srv.base}/health`);
    assert.equal(h.status, 503);
    const r2 = await postJson(srv.base, '/v1/completions',
      { model: MODEL_NAME, prompt: 'Emma', max_tokens: 4 });
    assert.equal(r2.status, 503, r2.text);
    assert.equal(typeof r2.json.error.message, 'string', r2.text);
  } finally {
    const st = await srv.stop('SIGTERM');
    assert.ok(st.sig === null, `daemon died of ${st.sig}`);
    console.log(`dead engine: daemon exit code ${st.code}`);
  }
});
