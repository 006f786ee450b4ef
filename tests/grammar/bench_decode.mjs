// bench_decode.mjs - benchmark, not a test: decode tokens/s of the default
// model through `kvserve serve`, at 1 and 32 concurrent streams, without
// and with a JSON schema (response_format json_schema), closed loop for a
// fixed time per point. Prints completion tokens per second (all streams)
// and the ratio constrained / unconstrained.
//
//   KVSERVE_BIN=build/cli/kvserve node tests/grammar/bench_decode.mjs [SECONDS [ROUNDS]]
import { startServer } from '../integration/lib.mjs';

const secs = Number(process.argv[2] || 10);
const schema = {
  type: 'object',
  properties: {
    to: { type: 'string', maxLength: 40 },
    lines: { type: 'array', items: { type: 'string', maxLength: 60 }, minItems: 2, maxItems: 4 },
    year: { type: 'integer', minimum: 1790, maximum: 1820 },
  },
  required: ['to', 'lines', 'year'],
  additionalProperties: false,
};

async function run(base, streams, constrained) {
  const t0 = Date.now();
  let tokens = 0;
  let requests = 0;
  let seed = 0;
  async function worker() {
    while (Date.now() - t0 < secs * 1000) {
      const body = {
        model: 'austen-2.7m',
        messages: [{ role: 'user', content: 'Write a short letter.' }],
        max_tokens: constrained ? 200 : 100,
        temperature: 1.0,
        seed: seed++,
      };
      if (constrained) {
        body.response_format = { type: 'json_schema', json_schema: { name: 'letter', schema } };
      } else {
        body.ignore_eos = true;
      }
      const res = await fetch(`${base}/v1/chat/completions`, {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
      });
      const j = await res.json();
      if (res.status !== 200) {
        throw new Error(JSON.stringify(j));
      }
      tokens += j.usage.completion_tokens;
      requests++;
    }
  }
  await Promise.all(Array.from({ length: streams }, worker));
  const dt = (Date.now() - t0) / 1000;
  return { tps: tokens / dt, requests, tokens_per_req: tokens / requests };
}

// The machine may be shared: points alternate (free, constrained) for
// `rounds` rounds and each side reports its median.
const rounds = Number(process.argv[3] || 3);
const median = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
const srv = await startServer(['--max-num-seqs', '64']);
try {
  for (const streams of [1, 32]) {
    const free = [];
    const con = [];
    let fr;
    let cr;
    for (let r = 0; r < rounds; r++) {
      fr = await run(srv.base, streams, false);
      cr = await run(srv.base, streams, true);
      free.push(fr.tps);
      con.push(cr.tps);
    }
    const f = median(free);
    const c = median(con);
    console.log(`streams ${String(streams).padStart(2)}: unconstrained ${f.toFixed(0)} tok/s ` +
      `(${fr.tokens_per_req.toFixed(0)} tokens/request), json_schema ${c.toFixed(0)} tok/s ` +
      `(${cr.tokens_per_req.toFixed(0)} tokens/request): ${(100 * c / f).toFixed(1)}% ` +
      `[rounds: free ${free.map((x) => x.toFixed(0)).join(' ')}, ` +
      `schema ${con.map((x) => x.toFixed(0)).join(' ')}]`);
  }
} finally {
  await srv.stop();
}
