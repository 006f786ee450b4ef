// bench_stall.mjs - does a client sending huge prompts stall other streams?
// (issue 15) Not a test: prints figures. Starts kvserve with default flags
// (KVSERVE_BIN, KVSERVE_MODEL as for the integration suites), runs 32
// streaming completions in a loop for PHASE seconds alone, then again while
// one more client sends 8 MiB prompts back to back, and prints the 32
// streams' inter-token gaps (p50, p99, max) in both phases, the p99 rise,
// and the CPU time of the daemon's loop thread in each phase. The 8 MiB
// client runs in a worker thread with its body encoded once, so that its
// own work does not delay the event loop that times the streams.
//
//   KVSERVE_BIN=build/cli/kvserve node tests/integration/bench_stall.mjs [PHASE_S]
//   (KVSERVE_STALL_FLAGS='--threads 1' adds serve flags, e.g. to leave a core to the loop)
import fs from 'node:fs';
import http from 'node:http';
import { Worker, isMainThread, parentPort, workerData } from 'node:worker_threads';
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

// The 8 MiB client (run in a worker thread): sends back to back for
// phaseMs and fills stats.
function bigPrompts(port, phaseMs, stats) {
  const deadline = performance.now() + phaseMs;
  const prompt = 'It is a truth universally acknowledged, that a single man. '.repeat(
    Math.ceil(BIG / 60)).slice(0, BIG);
  const body = Buffer.from(JSON.stringify({ model: MODEL_NAME, prompt, max_tokens: 1 }));
  const one = () => new Promise((resolve) => {
    const t0 = performance.now();
    const req = http.request({ host: '127.0.0.1', port, path: '/v1/completions', method: 'POST',
      headers: { 'Content-Type': 'application/json', 'Content-Length': body.length },
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

// CPU time (ms) the daemon's loop thread (its main thread) has used.
function loopCpuMs(pid) {
  const f = fs.readFileSync(`/proc/${pid}/task/${pid}/stat`, 'utf8');
  const v = f.slice(f.lastIndexOf(')') + 2).split(' ');
  return (Number(v[11]) + Number(v[12])) * 10; // utime + stime, 100 ticks/s
}

async function phase(srv, withBig) {
  const gaps = [];
  let stats = { n: 0, status: {}, ms: [] };
  const cpu0 = loopCpuMs(srv.proc.pid);
  const deadline = performance.now() + PHASE_S * 1000;
  const jobs = Array.from({ length: STREAMS }, () => stream(srv.port, gaps, deadline));
  if (withBig) {
    const w = new Worker(new URL(import.meta.url), {
      workerData: { port: srv.port, phaseMs: PHASE_S * 1000 },
    });
    jobs.push(new Promise((resolve, reject) => {
      w.on('message', (m) => { stats = m; resolve(); });
      w.on('error', reject);
    }));
  }
  await Promise.all(jobs);
  return { gaps, stats, loopMs: loopCpuMs(srv.proc.pid) - cpu0 };
}

if (!isMainThread) {
  const stats = { n: 0, status: {}, ms: [] };
  await bigPrompts(workerData.port, workerData.phaseMs, stats);
  parentPort.postMessage(stats);
} else {
  const srv = await startServer((process.env.KVSERVE_STALL_FLAGS || '').split(' ').filter(Boolean));
  try {
    const a = await phase(srv, false);
    const b = await phase(srv, true);
    const row = (name, p) => console.log(`${name}: ${p.gaps.length} gaps, p50 `
      + `${pct(p.gaps, 50).toFixed(2)} ms, p99 ${pct(p.gaps, 99).toFixed(2)} ms, max `
      + `${p.gaps.reduce((a, b) => Math.max(a, b), 0).toFixed(2)} ms; loop thread CPU ${p.loopMs} ms`);
    console.log(`stall bench: ${STREAMS} streams, ${PHASE_S} s per phase, default flags`);
    row('alone          ', a);
    row('with 8 MiB ones', b);
    console.log(`8 MiB prompts sent: ${b.stats.n}, statuses ${JSON.stringify(b.stats.status)},`
      + ` median round trip ${pct(b.stats.ms, 50).toFixed(1)} ms`);
    console.log('p99 inter-token gap rise: '
      + `${((pct(b.gaps, 99) / pct(a.gaps, 99) - 1) * 100).toFixed(1)}%`);
  } finally {
    await srv.stop();
  }
}
