// bench_stall.mjs - does a client sending huge prompts stall other streams?
// (issue 15) Not a test: prints figures. Starts kvserve with default flags
// (KVSERVE_BIN, KVSERVE_MODEL as for the integration suites), runs 32
// streaming completions in a loop for PHASE seconds alone, then again while
// one more client sends 8 MiB prompts back to back, and prints the 32
// streams' inter-token gaps (p50, p99, max) in both phases and the p99 rise.
//
//   KVSERVE_BIN=build/cli/kvserve node tests/integration/bench_stall.mjs [PHASE_S]
import http from 'node:http';
import { MODEL_NAME, startServer } from './lib.mjs';

const PHASE_S = Number(process.argv[2] || 20);
const STREAMS = 32;
const BIG = 8 * 1024 * 1024 - 4096; // under the default 8 MiB body limit

function stream(port, gaps, deadline) {
  return new Promise((resolve, reject) => {
    const body = JSON.stringify({ model: MODEL_NAME, prompt: 'Emma Woodhouse, handsome,',
      max_tokens: 200, ignore_eos: true, stream: true });
    const req = http.request({ host: '127.0.0.1', port, path: '/v1/completions', method: 'POST',
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) },
    }, (res) => {
      let last = null;
      let buf = '';
      res.on('data', (d) => {
        const now = performance.now();
        buf += d.toString();
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, i);
          buf = buf.slice(i + 2);
          if (ev.startsWith('data: {')) {
            if (last !== null) gaps.push(now - last);
            last = now;
          }
        }
      });
      res.on('end', resolve);
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  }).then(() => (performance.now() < deadline ? stream(port, gaps, deadline) : null));
}

function bigPrompts(port, deadline, stats) {
  const prompt = 'It is a truth universally acknowledged, that a single man. '.repeat(
    Math.ceil(BIG / 60)).slice(0, BIG);
  const body = JSON.stringify({ model: MODEL_NAME, prompt, max_tokens: 1 });
  const one = () => new Promise((resolve) => {
    const t0 = performance.now();
    const req = http.request({ host: '127.0.0.1', port, path: '/v1/completions', method: 'POST',
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) },
    }, (res) => {
      res.resume();
      res.on('end', () => {
        stats.n++;
        stats.status[res.statusCode] = (stats.status[res.statusCode] || 0) + 1;
        stats.ms.push(performance.now() - t0);
        resolve();
      });
    });
    req.on('error', () => resolve());
    req.end(body);
  });
  const loop = async () => {
    while (performance.now() < deadline) {
      await one();
    }
  };
  return loop();
}

function pct(a, p) {
  const s = [...a].sort((x, y) => x - y);
  return s.length ? s[Math.min(s.length - 1, Math.floor(p / 100 * s.length))] : NaN;
}

async function phase(srv, withBig) {
  const gaps = [];
  const stats = { n: 0, status: {}, ms: [] };
  const deadline = performance.now() + PHASE_S * 1000;
  const jobs = Array.from({ length: STREAMS }, () => stream(srv.port, gaps, deadline));
  if (withBig) jobs.push(bigPrompts(srv.port, deadline, stats));
  await Promise.all(jobs);
  return { gaps, stats };
}

const srv = await startServer([]);
try {
  const a = await phase(srv, false);
  const b = await phase(srv, true);
  const row = (name, g) => console.log(`${name}: ${g.length} gaps, p50 ${pct(g, 50).toFixed(2)} ms,`
    + ` p99 ${pct(g, 99).toFixed(2)} ms, max ${Math.max(...g).toFixed(2)} ms`);
  console.log(`stall bench: ${STREAMS} streams, ${PHASE_S} s per phase, default flags`);
  row('alone          ', a.gaps);
  row('with 8 MiB ones', b.gaps);
  console.log(`8 MiB prompts sent: ${b.stats.n}, statuses ${JSON.stringify(b.stats.status)},`
    + ` median round trip ${pct(b.stats.ms, 50).toFixed(1)} ms`);
  console.log(`p99 inter-token gap rise: ${((pct(b.gaps, 99) / pct(a.gaps, 99) - 1) * 100).toFixed(1)}%`);
} finally {
  await srv.stop();
}
