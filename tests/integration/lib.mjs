// lib.mjs - helpers for the integration suites: start kvserve on 127.0.0.1
// with an ephemeral port, read /metrics, validate bodies against the OpenAI
// schemas (schemas/openai.json, extracted by extract_schemas.mjs), and speak
// raw HTTP for malformed requests.
//
// Environment (set by tests/integration/meson.build):
//   KVSERVE_BIN    the kvserve executable
//   KVSERVE_MODEL  the model directory to serve
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import Ajv from 'ajv';
import addFormats from 'ajv-formats';

const here = path.dirname(fileURLToPath(import.meta.url));
export const SRC_ROOT = path.resolve(here, '..', '..');
export const MODEL_NAME = 'austen-2.7m';
export const API_KEY = 'sk-kvserve-test-key';

// ---- schemas -------------------------------------------------------------

const ajv = new Ajv({ allErrors: true, strict: false });
addFormats(ajv);
ajv.addSchema(JSON.parse(fs.readFileSync(path.join(here, 'schemas', 'openai.json'), 'utf8')));
ajv.addSchema(JSON.parse(fs.readFileSync(path.join(here, 'schemas', 'openai-responses.json'),
  'utf8')));

// Throws with ajv's errors when obj does not match the named OpenAI schema
// (openai.json, or the Responses API's openai-responses.json).
export function validate(name, obj) {
  const v = ajv.getSchema(`openai.json#/definitions/${name}`) ??
    ajv.getSchema(`openai-responses.json#/definitions/${name}`);
  if (v === undefined) {
    throw new Error(`no schema ${name}`);
  }
  if (!v(obj)) {
    throw new Error(`${name} mismatch: ${ajv.errorsText(v.errors)}\n${JSON.stringify(obj)}`);
  }
  return obj;
}

// ---- the daemon ----------------------------------------------------------

// Starts `kvserve serve` and resolves once it is ready. extra: more flags.
// The port opens before the model loads; the "listening on" line is logged
// once the model is loaded and warmed up, when /health turns 200
// (server/srv_ready.c), so requests sent after it are served.
export async function startServer(extra = [], { env = {} } = {}) {
  const bin = process.env.KVSERVE_BIN;
  const model = process.env.KVSERVE_MODEL || path.join(SRC_ROOT, 'models', 'austen-2.7m');
  if (!bin) {
    throw new Error('KVSERVE_BIN is not set');
  }
  const args = ['serve', '--model', model, '--host', '127.0.0.1', '--port', '0', ...extra];
  const proc = spawn(bin, args, {
    stdio: ['ignore', 'inherit', 'pipe'],
    env: { ...process.env, KVSERVE_API_KEY: '', ...env },
  });
  const logs = [];
  let buf = '';
  const exited = new Promise((resolve) => proc.on('exit', (code, sig) => resolve({ code, sig })));
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no listening line:\n${logs.join('\n')}`)),
      60000);
    proc.stderr.on('data', (d) => {
      buf += d.toString();
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        logs.push(line);
        if (process.env.KVSERVE_TEST_VERBOSE) {
          process.stderr.write(line + '\n');
        }
        const m = /listening on http:\/\/[^ ]*:(\d+)/.exec(line);
        if (m) {
          clearTimeout(timer);
          resolve(Number(m[1]));
        }
      }
    });
    exited.then(({ code, sig }) => {
      clearTimeout(timer);
      reject(new Error(`kvserve exited (${code ?? sig}) before listening:\n${logs.join('\n')}`));
    });
  });
  const base = `http://127.0.0.1:${port}`;
  return {
    port,
    base,
    proc,
    logs,
    exited,
    // Sends sig and resolves with the exit status.
    async stop(sig = 'SIGTERM') {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill(sig);
      }
      return exited;
    },
  };
}

// ---- HTTP helpers -------------------------------------------------------------

export function authHeaders(key = API_KEY) {
  return key ? { Authorization: `Bearer ${key}` } : {};
}

export async function postJson(base, route, body, headers = authHeaders()) {
  const res = await fetch(base + route, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {
    json = null;
  }
  return { status: res.status, headers: res.headers, text, json };
}

export async function getMetrics(base) {
  const res = await fetch(base + '/metrics');
  if (res.status !== 200) {
    throw new Error(`/metrics answered ${res.status}`);
  }
  return res.text();
}

// Value of the first sample whose name and labels match (labels: substring
// of the label set, e.g. 'tier="device",state="used"').
export function metricValue(text, name, labels = '') {
  for (const line of text.split('\n')) {
    if (line.startsWith('#')) {
      continue;
    }
    const m = /^([^{ ]+)(\{[^}]*\})? (\S+)$/.exec(line);
    if (m && m[1] === name && (m[2] || '').includes(labels)) {
      return Number(m[3]);
    }
  }
  return undefined;
}

// Waits until no KV block is in use on either tier (blocks of finished
// requests are freed by the engine shortly after their last message).
export async function waitKvEmpty(base, limitMs = 20000) {
  const t0 = Date.now();
  let last = '';
  for (;;) {
    const text = await getMetrics(base);
    const dev = metricValue(text, 'kvserve:kv_blocks', 'tier="device",state="used"');
    const cpu = metricValue(text, 'kvserve:kv_blocks', 'tier="cpu",state="used"');
    const running = metricValue(text, 'kvserve:num_requests_running');
    const waiting = metricValue(text, 'kvserve:num_requests_waiting');
    if (dev === 0 && cpu === 0 && running === 0 && waiting === 0) {
      return;
    }
    last = `device used ${dev}, cpu used ${cpu}, running ${running}, waiting ${waiting}`;
    if (Date.now() - t0 > limitMs) {
      throw new Error(`KV pool not empty: ${last}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

// Sends raw bytes on a fresh connection and resolves with everything the
// server sent until it closed (or until idleMs of silence after a full
// response head arrived).
export function rawRequest(port, chunks, { idleMs = 1500, gapMs = 0 } = {}) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    let data = '';
    let timer = null;
    const finish = () => {
      sock.destroy();
      resolve(data);
    };
    const arm = () => {
      clearTimeout(timer);
      timer = setTimeout(finish, idleMs);
    };
    sock.on('data', (d) => {
      data += d.toString('latin1');
      arm();
    });
    sock.on('close', () => {
      clearTimeout(timer);
      resolve(data);
    });
    sock.on('error', (e) => {
      clearTimeout(timer);
      if (data) {
        resolve(data);
      } else {
        reject(e);
      }
    });
    sock.on('connect', async () => {
      const list = Array.isArray(chunks) ? chunks : [chunks];
      for (const c of list) {
        sock.write(typeof c === 'string' ? Buffer.from(c, 'latin1') : c);
        if (gapMs) {
          await new Promise((r) => setTimeout(r, gapMs));
        }
      }
      arm();
    });
  });
}

// Status code and JSON body of a raw HTTP/1.1 response.
export function parseRaw(resp) {
  const m = /^HTTP\/1\.[01] (\d{3})/.exec(resp);
  const status = m ? Number(m[1]) : 0;
  const split = resp.indexOf('\r\n\r\n');
  const head = split >= 0 ? resp.slice(0, split) : resp;
  let body = split >= 0 ? resp.slice(split + 4) : '';
  if (/transfer-encoding: *chunked/i.test(head)) {
    let out = '';
    let rest = body;
    for (;;) {
      const nl = rest.indexOf('\r\n');
      if (nl < 0) {
        break;
      }
      const n = parseInt(rest.slice(0, nl), 16);
      if (!n) {
        break;
      }
      out += rest.slice(nl + 2, nl + 2 + n);
      rest = rest.slice(nl + 2 + n + 2);
    }
    body = out;
  }
  let json = null;
  try {
    json = JSON.parse(body);
  } catch {
    json = null;
  }
  return { status, head, body, json };
}

// Reads an SSE response body; returns the parsed data events (objects) and
// whether [DONE] came last.
export async function readSse(res) {
  const text = await res.text();
  const events = [];
  let done = false;
  for (const block of text.split('\n\n')) {
    if (!block.trim()) {
      continue;
    }
    if (!block.startsWith('data: ')) {
      throw new Error(`bad SSE block: ${JSON.stringify(block)}`);
    }
    const payload = block.slice(6);
    if (payload === '[DONE]') {
      done = true;
      continue;
    }
    if (done) {
      throw new Error('data after [DONE]');
    }
    events.push(JSON.parse(payload));
  }
  return { events, done, text };
}

export function tmpFile(name, contents) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-it-'));
  const p = path.join(dir, name);
  fs.writeFileSync(p, contents);
  return p;
}
