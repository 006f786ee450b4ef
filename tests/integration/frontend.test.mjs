// frontend.test.mjs - the loop thread's side of issue 15:
//  * a request is parsed, rendered and tokenized on libuv's thread pool
//    (server/srv_work.c): clients that go away while theirs is prepared
//    leave nothing behind, and a drain answers the ones being prepared
//    (the ASan build of this suite checks the memory);
//  * a stream client that half-closes its sending side after the request
//    still receives the whole stream; one that resets the connection (after
//    a half-close or not) is cancelled and its blocks are freed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import {
  MODEL_NAME, getMetrics, metricValue, parseRaw, postJson, startServer, waitKvEmpty,
} from './lib.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function httpPost(route, body) {
  const b = Buffer.isBuffer(body) ? body : Buffer.from(JSON.stringify(body));
  return Buffer.concat([Buffer.from(`POST ${route} HTTP/1.1\r\nHost: x\r\n`
    + `Content-Type: application/json\r\nContent-Length: ${b.length}\r\n\r\n`), b]);
}

// The data events of an SSE body (chunked transfer decoded by parseRaw).
function sseEvents(text) {
  const events = [];
  let done = false;
  for (const block of text.split('\n\n')) {
    if (!block.trim()) {
      continue;
    }
    assert.ok(block.startsWith('data: '), `bad SSE block ${JSON.stringify(block)}`);
    const payload = block.slice(6);
    if (payload === '[DONE]') {
      done = true;
    } else {
      events.push(JSON.parse(payload));
    }
  }
  return { events, done };
}

// Sends req on a fresh socket; halfClose: end the sending side right after
// it; resetAfter: reset the connection (RST) once that many data events
// came. Resolves with what the server sent until it closed.
function rawStream(port, req, { halfClose = false, resetAfter = 0 } = {}) {
  return new Promise((resolve, reject) => {
    const sock = net.connect({ port, host: '127.0.0.1', allowHalfOpen: true });
    let got = '';
    let reset = false;
    sock.on('error', (e) => (reset ? resolve(got) : reject(e)));
    sock.on('connect', () => {
      sock.write(req);
      if (halfClose) {
        sock.end();
      }
    });
    sock.on('data', (d) => {
      got += d.toString('latin1');
      if (resetAfter > 0 && !reset && (got.match(/data: \{/g) ?? []).length >= resetAfter) {
        reset = true;
        sock.resetAndDestroy();
        resolve(got);
      }
    });
    sock.on('end', () => sock.end());
    sock.on('close', () => resolve(got));
  });
}

const streamReq = (maxTokens) => httpPost('/v1/completions', {
  model: MODEL_NAME, prompt: 'Emma Woodhouse, handsome, clever, and rich,',
  max_tokens: maxTokens, ignore_eos: true, stream: true,
});

test('a stream client that half-closes after its request receives the whole stream', async () => {
  const srv = await startServer([]);
  try {
    for (const route of ['/v1/completions', '/v1/chat/completions']) {
      const body = route === '/v1/completions'
        ? { model: MODEL_NAME, prompt: 'It is a truth', max_tokens: 40, ignore_eos: true,
          stream: true }
        : { model: MODEL_NAME, messages: [{ role: 'user', content: 'Hello' }], max_tokens: 40,
          ignore_eos: true, stream: true };
      const r = parseRaw(await rawStream(srv.port, httpPost(route, body), { halfClose: true }));
      assert.equal(r.status, 200, r.head);
      const { events, done } = sseEvents(r.body);
      assert.ok(done, `${route}: no [DONE] after a half-close:\n${r.body.slice(-300)}`);
      const last = events[events.length - 1];
      assert.equal(last.choices[0].finish_reason, 'length');
      const m = await getMetrics(srv.base);
      assert.equal(metricValue(m, 'kvserve:client_disconnects_total'), 0,
        `${route}: the half-close counted as a disconnect`);
    }
    const m = await getMetrics(srv.base);
    assert.equal(metricValue(m, 'kvserve:generation_tokens_total', 'tenant="default"'), 80);
    await waitKvEmpty(srv.base);
  } finally {
    assert.equal((await srv.stop()).code, 0);
  }
});

test('a stream client that resets the connection is cancelled, half-closed or not', async () => {
  const srv = await startServer(['--max-num-seqs', '8']);
  try {
    let n = 0;
    for (const halfClose of [false, true]) {
      const got = await rawStream(srv.port, streamReq(200), { halfClose, resetAfter: 2 });
      assert.match(got, /^HTTP\/1\.1 200/);
      n++;
      await waitKvEmpty(srv.base);
      const m = await getMetrics(srv.base);
      assert.equal(metricValue(m, 'kvserve:client_disconnects_total'), n,
        `half-close ${halfClose}`);
      assert.equal(metricValue(m, 'kvserve:request_success_total', 'finished_reason="abort"'), n);
      const gen = metricValue(m, 'kvserve:generation_tokens_total', 'tenant="default"');
      assert.ok(gen < 200 * n, `generated ${gen} tokens for ${n} reset clients`);
    }
    // Several at once.
    await Promise.all(Array.from({ length: 6 }, (_, i) =>
      rawStream(srv.port, streamReq(200), { halfClose: i % 2 === 1, resetAfter: 1 + (i % 3) })));
    await waitKvEmpty(srv.base);
    const m = await getMetrics(srv.base);
    assert.equal(metricValue(m, 'kvserve:requests_in_flight'), 0);
  } finally {
    assert.equal((await srv.stop()).code, 0);
  }
});

// A body whose preparation keeps a pool thread busy for a while: 64
// prompts of 9 KB (under the byte cap, so each is tokenized) that are then
// too long for the context (400).
function bigBody() {
  const text = 'It is a truth universally acknowledged, that a single man in possession. ';
  const prompt = Array.from({ length: 64 }, (_, i) => `${i} ${text.repeat(125)}`);
  return httpPost('/v1/completions', { model: MODEL_NAME, prompt, max_tokens: 4 });
}

function sendAndReset(port, req) {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1');
    sock.on('error', () => resolve());
    sock.on('connect', () => sock.write(req, () => {
      // Give the server's loop a moment to read the body and queue its
      // preparation, then reset while the pool tokenizes.
      setTimeout(() => { sock.resetAndDestroy(); resolve(); }, 30);
    }));
  });
}

test('clients gone while their request is prepared off the loop thread leave nothing', async () => {
  // Each preparation sleeps 200 ms first (a test hook), so the resets after
  // 30 ms land while it is in flight on any machine.
  const srv = await startServer([], { env: { KVSERVE_TEST_PREP_DELAY_MS: '200' } });
  try {
    const req = bigBody();
    for (let i = 0; i < 3; i++) {
      await Promise.all(Array.from({ length: 4 }, () => sendAndReset(srv.port, req)));
    }
    // Each was dropped: prepared to no one, or cancelled before it ran
    // (or reset while its body was still read). Their connections close
    // (the last within the 1 s timeout a hang-up sets): only this test's
    // own keep-alive connection for /metrics stays.
    let open = -1;
    for (let t0 = Date.now(); Date.now() - t0 < 20000;) {
      const m = await getMetrics(srv.base);
      open = metricValue(m, 'kvserve:open_connections');
      if (open <= 1 && metricValue(m, 'kvserve:requests_in_flight') === 0) {
        break;
      }
      await sleep(50);
    }
    assert.ok(open <= 1, `open connections: ${open}`);
    const dropped = srv.logs.filter((l) => /dropped while being prepared/.test(l));
    assert.ok(dropped.length >= 1, srv.logs.slice(-20).join('\n'));
    // The same body from a client that stays gets its answer (400: the
    // prompts are longer than the context can hold), and the server serves on.
    const r = parseRaw(await rawStream(srv.port, req, { halfClose: true }));
    assert.equal(r.status, 400, r.head);
    assert.match(r.json.error.message, /maximum context length/);
    const ok = parseRaw(await rawStream(srv.port, streamReq(8), { halfClose: true }));
    assert.ok(sseEvents(ok.body).done);
    await waitKvEmpty(srv.base);
  } finally {
    assert.equal((await srv.stop()).code, 0);
  }
});

test('SIGINT with requests being prepared answers them, then the daemon exits 0', async () => {
  const srv = await startServer([]);
  const req = bigBody();
  const answers = Array.from({ length: 6 }, () => new Promise((resolve) => {
    const sock = net.connect(srv.port, '127.0.0.1');
    let got = '';
    sock.on('error', () => resolve(got));
    sock.on('data', (d) => {
      got += d.toString('latin1');
      if (/\r\n\r\n\{.*\}$/s.test(got)) {
        sock.destroy();
        resolve(got);
      }
    });
    sock.on('close', () => resolve(got));
    sock.on('connect', () => sock.write(req));
  }));
  // Once the bodies are out, stop: the drain waits for the ones being
  // prepared (their records are busy), which answer 400 as usual.
  await sleep(40);
  srv.proc.kill('SIGINT');
  const got = await Promise.all(answers);
  const st = await srv.exited;
  assert.equal(st.code, 0, `exit ${st.code ?? st.sig}: ${srv.logs.slice(-5).join('\n')}`);
  for (const g of got) {
    const r = parseRaw(g);
    assert.ok(r.status === 400 || r.status === 503, `${r.status} ${r.body.slice(0, 200)}`);
  }
  assert.ok(got.some((g) => parseRaw(g).status === 400), 'none was answered');
});

test('/tokenize, /detokenize and /apply-template are made on the pool: /health answers meanwhile',
  async () => {
    // Every pool item sleeps 1 s first (a test hook that runs on the pool
    // thread only): work done on the loop thread would not sleep, and
    // nothing the loop does waits for the pool, so /health must come back
    // while each of these is still being prepared.
    const srv = await startServer([], { env: { KVSERVE_TEST_PREP_DELAY_MS: '1000' } });
    try {
      const prompt = 'It is a truth universally acknowledged. '.repeat(2000);
      const cases = [
        ['/tokenize', { model: MODEL_NAME, prompt }],
        ['/detokenize', { tokens: [1, 2, 3] }],
        ['/apply-template', { messages: [{ role: 'user', content: 'Hello' }] }],
        ['/tokenize', { model: 'no-such-model', prompt: 'x' }],
      ];
      const answers = [];
      for (const [route, body] of cases) {
        let slowDone = false;
        const slow = postJson(srv.base, route, body).then((r) => {
          slowDone = true;
          return r;
        });
        await sleep(100); // the body is in and its item queued
        const h = await fetch(`${srv.base}/health`);
        assert.equal(h.status, 200);
        assert.equal(slowDone, false, `${route} answered before /health: made on the loop?`);
        answers.push(await slow);
      }
      const [tok, det, tpl, bad] = answers;
      assert.equal(tok.status, 200, tok.text);
      assert.equal(tok.json.count, tok.json.tokens.length);
      assert.ok(tok.json.count > 2000, `count ${tok.json.count}`);
      // The same text tokenized again gives the same ids; decoding them
      // gives the text back.
      const again = await postJson(srv.base, '/tokenize',
        { model: MODEL_NAME, prompt: 'Emma', add_special_tokens: false });
      const back = await postJson(srv.base, '/detokenize', { tokens: again.json.tokens });
      assert.equal(back.status, 200, back.text);
      assert.equal(back.json.prompt, 'Emma');
      assert.equal(det.status, 200, det.text);
      assert.equal(typeof det.json.prompt, 'string');
      assert.equal(tpl.status, 200, tpl.text);
      assert.match(tpl.json.prompt, /Hello/);
      assert.equal(bad.status, 404, bad.text);
      assert.equal(bad.json.error.code, 'model_not_found');
      // A client that resets while its /tokenize is prepared is dropped.
      await sendAndReset(srv.port, httpPost('/tokenize', { prompt }));
      for (let t0 = Date.now(); Date.now() - t0 < 10000;) {
        if (srv.logs.some((l) => /dropped while being prepared/.test(l))) {
          break;
        }
        await sleep(50);
      }
      assert.ok(srv.logs.some((l) => /dropped while being prepared/.test(l)),
        srv.logs.slice(-10).join('\n'));
    } finally {
      assert.equal((await srv.stop()).code, 0);
    }
  });
