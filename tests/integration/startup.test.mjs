// startup.test.mjs - start-up validation and memory committed at start
// (issue 15): a KV pool too small for the model's context lowers
// max_model_len with a warning, an explicit --max-model-len that does not
// fit is refused, contradictory step budgets are refused, a swap tier
// larger than MemAvailable is refused with the numbers, the KV pool is
// resident before the server listens, cpu has no swap tier by default, and
// --mlock pins memory or fails with RLIMIT_MEMLOCK named.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { MODEL_NAME, SRC_ROOT, postJson, startServer } from './lib.mjs';

const model = process.env.KVSERVE_MODEL || path.join(SRC_ROOT, 'models', 'austen-2.7m');

// Runs `kvserve serve` that must exit before listening; returns status and stderr.
function serveFails(flags, wrap = null) {
  const args = ['serve', '--model', model, '--host', '127.0.0.1', '--port', '0', ...flags];
  const cmd = wrap ? wrap.cmd : process.env.KVSERVE_BIN;
  const argv = wrap ? [...wrap.args, process.env.KVSERVE_BIN, ...args] : args;
  const r = spawnSync(cmd, argv, { encoding: 'utf8', timeout: 60000,
    env: { ...process.env, KVSERVE_API_KEY: '' } });
  return { status: r.status, stderr: r.stderr };
}

function statusKb(pid, field) {
  const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm')
    .exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) : -1;
}

test('a KV pool shorter than the context lowers max_model_len with a warning', async () => {
  const srv = await startServer(['--num-kv-blocks', '8']);
  try {
    assert.ok(srv.logs.some((l) => /max_model_len lowered to 112/.test(l)), srv.logs.join('\n'));
    const models = await (await fetch(srv.base + '/v1/models')).json();
    assert.equal(models.data[0].max_model_len, 112);
    // What fits is served; a prompt beyond the lowered context is a 400.
    const ok = await postJson(srv.base, '/v1/completions',
      { model: MODEL_NAME, prompt: 'It is a truth', max_tokens: 4 }, {});
    assert.equal(ok.status, 200, ok.text);
    const long = await postJson(srv.base, '/v1/completions',
      { model: MODEL_NAME, prompt: 'word '.repeat(200), max_tokens: 4 }, {});
    assert.equal(long.status, 400, long.text);
  } finally {
    await srv.stop();
  }
});

test('an explicit --max-model-len the pool cannot hold is refused', () => {
  const r = serveFails(['--num-kv-blocks', '8', '--max-model-len', '200']);
  assert.equal(r.status, 1, r.stderr);
  assert.match(r.stderr, /--max-model-len 200 does not fit the KV pool: 8 blocks of 16 tokens hold 112 tokens/);
});

test('--max-num-batched-tokens below --max-num-seqs is refused', () => {
  const r = serveFails(['--max-num-seqs', '64', '--max-num-batched-tokens', '32']);
  assert.equal(r.status, 2, r.stderr);
  assert.match(r.stderr, /--max-num-batched-tokens 32 is below --max-num-seqs 64/);
});

test('a tenant share smaller than one block is refused', () => {
  const dir = fs.mkdtempSync('/tmp/kvserve-startup-');
  const conf = path.join(dir, 'k.conf');
  fs.writeFileSync(conf, '[tenant tiny]\napi_key_sha256 = ' + 'a'.repeat(64) +
    '\nmax_kv_share = 0.001\n');
  try {
    const r = serveFails(['--num-kv-blocks', '64', '--config', conf]);
    assert.equal(r.status, 1, r.stderr);
    assert.match(r.stderr, /tenant tiny: max_kv_share 0.001 of 63 KV blocks is less than one block/);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('memory that does not fit MemAvailable stops start-up with the numbers', () => {
  const r = serveFails(['--swap-space', '1024']);
  assert.equal(r.status, 1, r.stderr);
  assert.match(r.stderr,
    /not enough memory: KV pool [\d.]+ MiB \+ swap tier 1048576.0 MiB \+ scratch [\d.]+ MiB = [\d.]+ MiB, but MemAvailable is [\d.]+ MiB/);
  assert.ok(!/listening/.test(r.stderr));
});

test('the KV pool and the swap tier are resident before the server listens', async () => {
  // Default flags on cpu: no swap tier.
  const d = await startServer([]);
  try {
    assert.ok(d.logs.some((l) => /KV cache: \d+ blocks .* swap 0 blocks/.test(l)), d.logs.join('\n'));
  } finally {
    await d.stop();
  }
  const srv = await startServer(['--swap-space', '0.25']);
  try {
    const line = srv.logs.find((l) => /KV cache: \d+ blocks of/.test(l));
    const mib = Number(/\(([\d.]+) MiB\)/.exec(line)[1]);
    const rssMib = statusKb(srv.proc.pid, 'VmRSS') / 1024;
    // Pool + 256 MiB of swap tier, committed at start (lazily they would be ~0).
    assert.ok(rssMib >= mib + 256, `RSS ${rssMib} MiB < pool ${mib} + swap 256 MiB`);
  } finally {
    await srv.stop();
  }
});

test('--mlock pins the pool, or fails naming RLIMIT_MEMLOCK', async () => {
  // Without CAP_IPC_LOCK and with a 1 MiB limit, locking must fail cleanly.
  const root = process.getuid() === 0;
  const wrap = { cmd: '/bin/sh', args: ['-c', 'ulimit -l 1024 && exec "$@"', 'sh'] };
  if (root) {
    wrap.args = ['-c', 'ulimit -l 1024 && exec setpriv --bounding-set=-ipc_lock -- "$@"', 'sh'];
  }
  const r = serveFails(['--mlock'], wrap);
  assert.equal(r.status, 1, r.stderr);
  // A sanitizer build intercepts mlockall as a no-op: it must say so.
  const sanitized = /nothing is locked \(a sanitizer build/.test(r.stderr);
  if (!sanitized) {
    assert.match(r.stderr, /--mlock: cannot lock \d+ MiB .*RLIMIT_MEMLOCK is 1024 KiB/);
  }
  if (root && !sanitized) {
    // With the capability, the pool is locked before the server listens.
    const srv = await startServer(['--mlock']);
    try {
      const line = srv.logs.find((l) => /KV cache: \d+ blocks of/.test(l));
      const mib = Number(/\(([\d.]+) MiB\)/.exec(line)[1]);
      assert.ok(statusKb(srv.proc.pid, 'VmLck') / 1024 >= mib, 'VmLck below the pool');
    } finally {
      await srv.stop();
    }
  }
});
