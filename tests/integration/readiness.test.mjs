// readiness.test.mjs - readiness as orchestrators expect it (issue 17,
// item 3): the port opens before the model loads; until the model is
// loaded and the engine has run its warm-up step, /health answers 503
// {"status":"loading"} and the API routes 503 with an OpenAI error and
// Retry-After; then /health turns 200 and a completion works. A start-up
// failure after the port opened still exits non-zero with its error line,
// and SIGTERM while loading exits cleanly. The test hook
// KVSERVE_TEST_LOAD_DELAY_MS holds the load back so the loading state can
// be observed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import path from 'node:path';
import { MODEL_NAME, SRC_ROOT, postJson, validate } from './lib.mjs';

const model = process.env.KVSERVE_MODEL || path.join(SRC_ROOT, 'models', 'austen-2.7m');

// Starts `kvserve serve` with the load delayed by delayMs; resolves with
// the port as soon as it is open (the "port open on" line).
async function startLoading(delayMs, flags = []) {
  const args = ['serve', '--model', model, '--host', '127.0.0.1', '--port', '0', ...flags];
  const proc = spawn(process.env.KVSERVE_BIN, args, {
    stdio: ['ignore', 'inherit', 'pipe'],
    env: { ...process.env, KVSERVE_API_KEY: '', KVSERVE_TEST_LOAD_DELAY_MS: String(delayMs) },
  });
  const logs = [];
  const exited = new Promise((resolve) => proc.on('exit', (code, sig) => resolve({ code, sig })));
  let buf = '';
  const port = await new Promise((resolve, reject) => {
    proc.stderr.on('data', (d) => {
      buf += d.toString();
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        logs.push(line);
        const m = /port open on http:\/\/[^ ]*:(\d+)/.exec(line);
        if (m) {
          resolve(Number(m[1]));
        }
      }
    });
    exited.then(({ code, sig }) => reject(new Error(`exited (${code ?? sig}):\n${logs.join('\n')}`)));
  });
  return { proc, port, base: `http://127.0.0.1:${port}`, logs, exited };
}

async function expectLoading503(res) {
  assert.equal(res.status, 503);
  assert.ok(Number(res.headers.get('retry-after')) >= 1, 'Retry-After');
  const body = await res.json();
  validate('ErrorResponse', body);
  assert.match(body.error.message, /loading/);
  assert.equal(body.error.type, 'service_unavailable_error');
}

test('the port answers 503 loading until the model is loaded and warmed up', async () => {
  const srv = await startLoading(3000);
  try {
    // The port accepts while the model has not even started to load.
    const h = await fetch(`${srv.base}/health`);
    assert.equal(h.status, 503);
    assert.deepEqual(await h.json(), { status: 'loading' });
    assert.ok(Number(h.headers.get('retry-after')) >= 1);
    const deep = await fetch(`${srv.base}/health?generate=1`);
    assert.equal(deep.status, 503);
    assert.deepEqual(await deep.json(), { status: 'loading' });
    await expectLoading503(await fetch(`${srv.base}/v1/models`));
    await expectLoading503(await fetch(`${srv.base}/v1/completions`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: MODEL_NAME, prompt: 'Emma', max_tokens: 2 }),
    }));
    await expectLoading503(await fetch(`${srv.base}/tokenize`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: MODEL_NAME, prompt: 'Emma' }),
    }));
    // The console's page needs no model: it is served while loading.
    const page = await fetch(`${srv.base}/console`);
    assert.equal(page.status, 200);
    assert.match(await page.text(), /<html/i);
    // /metrics answers with what the front end knows.
    const m = await fetch(`${srv.base}/metrics`);
    assert.equal(m.status, 200);
    assert.ok(!srv.logs.some((l) => /listening on/.test(l)), 'not ready yet');

    // Then it turns ready.
    let status = 503;
    for (let i = 0; i < 300 && status !== 200; i++) {
      await new Promise((r) => setTimeout(r, 50));
      status = (await fetch(`${srv.base}/health`)).status;
    }
    assert.equal(status, 200);
    assert.ok(srv.logs.some((l) => /warm-up step done/.test(l)), srv.logs.join('\n'));
    assert.ok(srv.logs.some((l) => /listening on/.test(l)), srv.logs.join('\n'));
    const ok = await fetch(`${srv.base}/health`);
    assert.deepEqual(await ok.json(), { status: 'ok' });
    const r = await postJson(srv.base, '/v1/completions',
      { model: MODEL_NAME, prompt: 'Emma', max_tokens: 4, ignore_eos: true });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.usage.completion_tokens, 4);
    assert.equal((await fetch(`${srv.base}/v1/models`)).status, 200);
  } finally {
    srv.proc.kill('SIGTERM');
    assert.equal((await srv.exited).code, 0);
  }
});

test('SIGTERM while the model loads exits cleanly', async () => {
  const srv = await startLoading(60000);
  assert.equal((await fetch(`${srv.base}/health`)).status, 503);
  const t0 = Date.now();
  srv.proc.kill('SIGTERM');
  const st = await srv.exited;
  assert.equal(st.code, 0, srv.logs.join('\n'));
  assert.ok(Date.now() - t0 < 20000, 'did not wait for the load delay');
});

test('a bad model path fails the start-up with its error, after the port opened', () => {
  const r = spawnSync(process.env.KVSERVE_BIN,
    ['serve', '--model', '/nonexistent/model', '--host', '127.0.0.1', '--port', '0'],
    { encoding: 'utf8', timeout: 60000, env: { ...process.env, KVSERVE_API_KEY: '' } });
  assert.notEqual(r.status, 0, r.stderr);
  assert.equal(r.signal, null);
  assert.match(r.stderr, /port open on/);
  assert.match(r.stderr, /\/nonexistent\/model/);
  assert.ok(!/listening on/.test(r.stderr), r.stderr);
});
