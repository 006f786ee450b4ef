// overload.test.mjs - overload and backpressure.
//  * 4x more demand than KV memory: 12 greedy requests that each need 14
//    blocks (about 220 tokens) against a 40-block pool, with and without a
//    CPU swap tier. Every request completes through preemption (the
//    preemption counter moves) with the same text as when it ran alone, and
//    the pool is empty afterwards.
//  * Beyond the queue limit (--max-waiting-requests): 40 concurrent
//    requests against 2 running + 2 waiting slots; the excess gets 429 with
//    a Retry-After header and an OpenAI error body, the rest complete, no
//    request hangs (each has a deadline) and the daemon stays healthy.
// Slow SSE readers (the per-stream buffer cap) and slowloris heads are
// covered by tests/integration/hardening.test.mjs.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  MODEL_NAME, getMetrics, metricValue, postJson, startServer, validate, waitKvEmpty,
} from '../integration/lib.mjs';

const PROMPTS = [
  'Emma Woodhouse, handsome, clever, and rich,',
  'It is a truth universally acknowledged,',
  'The family of Dashwood had long been settled',
  'Sir Walter Elliot, of Kellynch Hall,',
];

function greedy(i) {
  return {
    model: MODEL_NAME, prompt: `${PROMPTS[i % PROMPTS.length]} ${i}`, max_tokens: 200,
    ignore_eos: true, temperature: 0,
  };
}

async function withDeadline(p, ms, what) {
  let timer;
  const t = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer in ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([p, t]);
  } finally {
    clearTimeout(timer);
  }
}

for (const swap of ['0', '0.01']) {
  test(`4x KV demand completes through preemption (swap space ${swap} GiB)`,
    { timeout: 600000 }, async () => {
      const srv = await startServer(['--num-kv-blocks', '40', '--block-size', '16',
        '--max-num-seqs', '12', '--swap-space', swap, '--no-enable-prefix-caching']);
      try {
        const N = 12;
        const alone = [];
        for (let i = 0; i < N; i++) {
          const r = await postJson(srv.base, '/v1/completions', greedy(i), {});
          assert.equal(r.status, 200, r.text);
          alone.push(r.json.choices[0].text);
        }
        const m0 = await getMetrics(srv.base);
        const rs = await withDeadline(Promise.all(Array.from({ length: N },
          (_, i) => postJson(srv.base, '/v1/completions', greedy(i), {}))), 300000, 'overload');
        const m1 = await getMetrics(srv.base);
        for (let i = 0; i < N; i++) {
          assert.equal(rs[i].status, 200, rs[i].text);
          assert.equal(rs[i].json.choices[0].finish_reason, 'length');
          assert.equal(rs[i].json.usage.completion_tokens, 200);
          assert.equal(rs[i].json.choices[0].text, alone[i], `request ${i} changed under preemption`);
        }
        const d = (kind) => metricValue(m1, 'kvserve:num_preemptions_total', `kind="${kind}"`)
          - metricValue(m0, 'kvserve:num_preemptions_total', `kind="${kind}"`);
        const pre = d('swap') + d('recompute');
        console.log(`overload (swap ${swap} GiB): ${N} x 14 blocks on 40 blocks, preemptions:`
          + ` ${d('swap')} swap, ${d('recompute')} recompute; all complete with their`
          + ' unpreempted text');
        assert.ok(pre > 0, 'no preemption happened');
        await waitKvEmpty(srv.base);
      } finally {
        const st = await srv.stop();
        assert.equal(st.code, 0);
      }
    });
}

test('beyond the queue limit: 429 with Retry-After, never a hang', { timeout: 600000 },
  async () => {
    const srv = await startServer(['--max-num-seqs', '2', '--max-waiting-requests', '2']);
    try {
      const req = { model: MODEL_NAME, prompt: 'Emma', max_tokens: 64, ignore_eos: true };
      const rs = await withDeadline(Promise.all(Array.from({ length: 40 },
        (_, i) => postJson(srv.base, i % 2 ? '/v1/completions' : '/v1/completions',
          { ...req, stream: i % 3 === 0 }, {}))), 300000, '40 requests');
      const codes = rs.map((r) => r.status);
      const ok = rs.filter((r) => r.status === 200);
      const limited = rs.filter((r) => r.status === 429);
      assert.equal(ok.length + limited.length, rs.length, codes.join(','));
      assert.ok(ok.length >= 4, codes.join(','));
      assert.ok(limited.length >= 1, codes.join(','));
      for (const r of limited) {
        validate('ErrorResponse', r.json);
        assert.ok(Number(r.headers.get('retry-after')) >= 1, 'Retry-After');
      }
      for (const r of ok.filter((x) => x.json)) {
        assert.equal(r.json.usage.completion_tokens, 64);
      }
      console.log(`queue limit: ${ok.length} served, ${limited.length} got 429`);
      await waitKvEmpty(srv.base);
      assert.equal((await fetch(`${srv.base}/health`)).status, 200);
      const again = await postJson(srv.base, '/v1/completions', req, {});
      assert.equal(again.status, 200);
    } finally {
      const st = await srv.stop();
      assert.equal(st.code, 0);
    }
  });
