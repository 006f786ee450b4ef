// openapi.test.mjs - api/openapi.yaml describes exactly what is served: every
// route it lists answers (neither 404 nor 405), and every route in the
// server's route table (server/srv_route.c) is listed.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import * as yaml from 'js-yaml';
import { MODEL_NAME, SRC_ROOT, startServer, waitKvEmpty } from './lib.mjs';

const spec = yaml.load(fs.readFileSync(path.join(SRC_ROOT, 'api', 'openapi.yaml'), 'utf8'));
const METHODS = ['get', 'post', 'put', 'delete', 'patch', 'head', 'options'];

function specRoutes() {
  const out = [];
  for (const [p, item] of Object.entries(spec.paths)) {
    for (const m of METHODS) {
      if (item[m]) {
        out.push(`${m.toUpperCase()} ${p}`);
      }
    }
  }
  return out.sort();
}

// The route table of the server: lines like {"/v1/models", "GET", SRV_EP_MODELS, ...}.
function servedRoutes() {
  const src = fs.readFileSync(path.join(SRC_ROOT, 'server', 'srv_route.c'), 'utf8');
  const table = src.slice(src.indexOf('const srv_route_t srv_routes[]'));
  const body = table.slice(0, table.indexOf('};'));
  const out = [];
  for (const m of body.matchAll(/\{"([^"]+)", "([A-Z]+)", SRV_EP_/g)) {
    out.push(`${m[2]} ${m[1]}`);
  }
  return out.sort();
}

// The web console's admin routes (server/srv_admin.c) need the admin key.
const ADMIN_KEY = 'sk-kvserve-admin-openapi';
const isAdmin = (p) => p.startsWith('/admin/') || p === '/reset_prefix_cache';

let srv;
before(async () => {
  srv = await startServer(['--admin-api-key', ADMIN_KEY]);
});
after(async () => {
  assert.equal((await srv.stop()).code, 0);
});

test('the spec and the route table list the same routes', () => {
  const served = servedRoutes();
  assert.ok(served.length >= 8, served.join(', '));
  assert.deepEqual(specRoutes(), served);
});

const sampleBodies = {
  '/v1/completions': { model: MODEL_NAME, prompt: 'Emma', max_tokens: 2 },
  '/v1/chat/completions': { model: MODEL_NAME, messages: [{ role: 'user', content: 'Hi' }],
    max_tokens: 2 },
  '/v1/responses': { model: MODEL_NAME, input: 'Hi', max_output_tokens: 2 },
  '/tokenize': { prompt: 'Emma' },
  '/detokenize': { tokens: [1, 2] },
  '/v1/embeddings': { model: MODEL_NAME, input: 'Emma' },
  '/apply-template': { messages: [{ role: 'user', content: 'Hi' }] },
};

// A templated path with its parameters filled in.
function concrete(p) {
  return p.replace('{model}', MODEL_NAME).replace('{tier}/{id}', 'device/1')
    .replace('{file}', 'app.js');
}


test('every listed route answers with a documented status', async () => {
  for (const r of specRoutes()) {
    const [method, p] = r.split(' ');
    const init = { method, headers: {}, redirect: 'manual' };
    if (method === 'POST') {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(sampleBodies[p] ?? {});
    }
    if (isAdmin(p)) {
      init.headers.Authorization = `Bearer ${ADMIN_KEY}`;
    }
    const res = await fetch(srv.base + concrete(p), init);
    await res.arrayBuffer();
    const documented = Object.keys(spec.paths[p][method.toLowerCase()].responses);
    if (documented.includes('302')) {
      // GET / redirects to the web console.
      assert.equal(res.status, 302, `${r} -> ${res.status}`);
      continue;
    }
    assert.equal(res.status, 200, `${r} -> ${res.status}`);
    assert.ok(documented.includes('200'), r);
    const ct = res.headers.get('content-type');
    const types = Object.keys(spec.paths[p][method.toLowerCase()].responses['200'].content ?? {});
    assert.ok(types.some((t) => ct.startsWith(t)), `${r}: ${ct} not in ${types}`);
  }
  await waitKvEmpty(srv.base);
});

test('a method a route does not serve is 405, an unlisted path 404', async () => {
  for (const p of Object.keys(spec.paths)) {
    const served = METHODS.filter((m) => spec.paths[p][m]).map((m) => m.toUpperCase());
    const other = served.includes('GET') ? 'POST' : 'GET';
    const res = await fetch(srv.base + concrete(p),
      { method: other, body: other === 'POST' ? '{}' : undefined });
    await res.arrayBuffer();
    assert.equal(res.status, 405, `${other} ${p}`);
  }
  const res = await fetch(`${srv.base}/v1/audio/speech`, { method: 'POST', body: '{}' });
  assert.equal(res.status, 404);
});
