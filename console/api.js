// api.js - the console's HTTP side: the keys (sessionStorage only), JSON
// calls to the same origin, and an SSE reader for OpenAI streams.
//
// The keys never leave this tab: sessionStorage is per tab and is cleared
// when the tab closes; nothing is written to localStorage or cookies.

const KEY_NAMES = { api: 'kvserve.apiKey', admin: 'kvserve.adminKey' };

// The stored key of kind 'api' (the playground's, a tenant's key) or
// 'admin' (the --admin-api-key), or ''.
export function getKey(kind) {
  return sessionStorage.getItem(KEY_NAMES[kind]) ?? '';
}

// Stores (or, for '', removes) the key of kind.
export function setKey(kind, value) {
  if (value) {
    sessionStorage.setItem(KEY_NAMES[kind], value);
  } else {
    sessionStorage.removeItem(KEY_NAMES[kind]);
  }
}

// An error with the HTTP status and the server's OpenAI-style message.
export class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code ?? null;
  }
}

async function errorOf(res) {
  let msg = `${res.status} ${res.statusText}`;
  let code = null;
  try {
    const body = await res.json();
    if (body && body.error) {
      msg = body.error.message ?? msg;
      code = body.error.code ?? null;
    }
  } catch {
    // not JSON: keep the status line
  }
  return new ApiError(res.status, msg, code);
}

// The headers of a call: the admin key for /admin/*, else the API key;
// tenant: also send the API key as X-Kvserve-Tenant-Key (admin calls that
// may show token text).
function headers({ admin = false, tenant = false, json = false } = {}) {
  const h = {};
  const key = getKey(admin ? 'admin' : 'api');
  if (key) {
    h.Authorization = `Bearer ${key}`;
  }
  if (tenant && getKey('api')) {
    h['X-Kvserve-Tenant-Key'] = getKey('api');
  }
  if (json) {
    h['Content-Type'] = 'application/json';
  }
  return h;
}

// GET path, the parsed JSON body; throws ApiError on a non-2xx status.
export async function getJson(path, opts = {}) {
  const res = await fetch(path, { headers: headers(opts), cache: 'no-store' });
  if (!res.ok) {
    throw await errorOf(res);
  }
  return res.json();
}

// POST body (an object) as JSON to path; the parsed JSON answer.
export async function postJson(path, body, opts = {}) {
  const res = await fetch(path, {
    method: 'POST', headers: headers({ ...opts, json: true }), body: JSON.stringify(body),
    signal: opts.signal,
  });
  if (!res.ok) {
    throw await errorOf(res);
  }
  return res.json();
}

// POSTs a streaming request and calls onEvent(obj) for each "data:" JSON
// event of the SSE answer until "[DONE]" or the end of the body. signal:
// an AbortSignal that stops it.
export async function postStream(path, body, onEvent, signal) {
  const res = await fetch(path, {
    method: 'POST', headers: headers({ json: true }), body: JSON.stringify(body), signal,
  });
  if (!res.ok) {
    throw await errorOf(res);
  }
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) {
      break;
    }
    buf += dec.decode(value, { stream: true });
    let m;
    // Events end with a blank line; "\r\n" line ends are allowed by SSE.
    while ((m = /\r?\n\r?\n/.exec(buf)) !== null) {
      const block = buf.slice(0, m.index);
      buf = buf.slice(m.index + m[0].length);
      const data = block.split(/\r?\n/).filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).replace(/^ /, '')).join('\n');
      if (data === '') {
        continue; // a comment or keep-alive
      }
      if (data === '[DONE]') {
        return;
      }
      const obj = JSON.parse(data);
      if (obj.error) {
        throw new ApiError(500, obj.error.message ?? 'stream error', obj.error.code);
      }
      onEvent(obj);
    }
  }
}
