// kvmap.js - the KV map: every block of the device and cpu tiers a cell
// on a canvas, coloured by state (free, cached, used), the owning tenant
// as the hue, a white mark on blocks held by more than one sequence.
// Polls GET /admin/kv (at most 4 Hz); hovering a cell asks
// GET /admin/kv/blocks/{tier}/{id} with the playground key as
// X-Kvserve-Tenant-Key, so token text shows only for that tenant's blocks.
import { ApiError, getJson, getKey } from './api.js';
import { showTip, hideTip } from './tip.js';

const $ = (id) => document.getElementById(id);
const POLL_MS = 300; // <= 4 Hz
const POLL_OFF_MS = 2000; // after an error
const FREE = '#262c36';
const NULL_BLOCK = '#5a616c'; // state 'n': the device's reserved null block

// The hue of tenant t (-1: none): the default tenant blue, the others
// spread by the golden angle.
export function tenantHue(t) {
  return t < 0 ? 212 : (212 + t * 137.508) % 360;
}

const colors = new Map(); // state + tenant -> fill (a map of 100,000 cells asks often)

// The fill of a block: state 'f' | 'c' | 'u' | 'n', owning tenant.
function cellColor(state, tenant) {
  const key = `${state}${tenant}`;
  let c = colors.get(key);
  if (c === undefined) {
    c = makeColor(state, tenant);
    colors.set(key, c);
  }
  return c;
}

function makeColor(state, tenant) {
  const h = tenantHue(tenant);
  if (state === 'u') {
    return `hsl(${h}, 80%, 58%)`;
  }
  if (state === 'c') {
    return `hsl(${h}, 35%, 33%)`;
  }
  return state === 'n' ? NULL_BLOCK : FREE;
}

const view = {
  snap: null, // the last /admin/kv
  layout: [], // per drawn tier: {name, y0, cols, cell, gap, n}
  hover: null, // {tier, id} under the pointer
  detail: null, // the last block detail fetched
  error: null, // the last poll error (ApiError) or null
};

// The grid cell size for n blocks in width px, so the map stays within
// maxH px (cells of 16 px down to 1 px).
function cellSize(n, width, maxH) {
  for (const s of [16, 12, 10, 8, 6, 5, 4, 3, 2, 1]) {
    const cols = Math.max(1, Math.floor(width / s));
    if (Math.ceil(n / cols) * s <= maxH) {
      return s;
    }
  }
  return 1;
}

function draw() {
  const canvas = $('kv-canvas');
  const snap = view.snap;
  const dpr = window.devicePixelRatio || 1;
  const width = Math.max(200, canvas.clientWidth);
  const tiers = snap ? snap.tiers : [];
  const total = tiers.reduce((a, t) => a + t.n_blocks, 0);
  const labelH = 18;
  const cell = cellSize(Math.max(1, total), width, 420);
  const gap = cell >= 6 ? 1 : 0;
  const cols = Math.max(1, Math.floor(width / cell));
  let height = 0;
  const layout = [];
  for (const t of tiers) {
    const rows = Math.ceil(t.n_blocks / cols);
    layout.push({ name: t.name, y0: height + labelH, cols, cell, gap, n: t.n_blocks });
    height += labelH + rows * cell + 6;
  }
  height = Math.max(height, 40);
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(height * dpr);
  canvas.style.height = `${height}px`;
  const g = canvas.getContext('2d');
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, width, height);
  g.font = '12px system-ui, sans-serif';
  g.textBaseline = 'middle';
  tiers.forEach((t, k) => {
    const L = layout[k];
    g.fillStyle = '#8b949e';
    const used = countOf(t.state, 'u');
    const cached = countOf(t.state, 'c');
    g.fillText(t.n_blocks === 0 ? `${t.name}: no blocks (tier off)` :
      `${t.name}: ${t.n_blocks} blocks, ${used} used, ${cached} cached`, 0, L.y0 - labelH / 2);
    for (let i = 0; i < t.n_blocks; i++) {
      const x = (i % cols) * cell;
      const y = L.y0 + Math.floor(i / cols) * cell;
      const st = t.state[i];
      const tn = t.tenant[i] ?? -1;
      g.fillStyle = cellColor(st, tn);
      g.fillRect(x, y, cell - gap, cell - gap);
      const rc = t.refcount[i] ?? 0;
      if (rc > 1) {
        g.fillStyle = '#ffffff';
        if (cell >= 6) {
          const m = Math.min(cell - gap - 2, Math.max(2, Math.round(cell / 4) + rc - 2));
          const off = Math.floor((cell - gap - m) / 2);
          g.fillRect(x + off, y + off, m, m);
        } else {
          g.fillRect(x, y, Math.max(1, cell - gap), Math.max(1, cell - gap));
        }
      }
    }
  });
  view.layout = layout;
}

function countOf(s, ch) {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    if (s.charCodeAt(i) === ch.charCodeAt(0)) {
      n++;
    }
  }
  return n;
}

// The text under the map: per tier the counts (also as data-* for the
// browser tests), and the sequences.
function summarize() {
  const sum = $('kv-summary');
  sum.replaceChildren();
  const snap = view.snap;
  if (!snap) {
    return;
  }
  const names = new Map(snap.tenants.map((t) => [t.id, t.name]));
  for (const t of snap.tiers) {
    const d = document.createElement('div');
    d.id = `kv-sum-${t.name}`;
    const used = countOf(t.state, 'u');
    const cached = countOf(t.state, 'c');
    const shared = t.refcount.filter((r) => r > 1).length;
    const maxRef = t.refcount.reduce((a, r) => Math.max(a, r), 0);
    d.dataset.blocks = String(t.n_blocks);
    d.dataset.used = String(used);
    d.dataset.cached = String(cached);
    d.dataset.shared = String(shared);
    d.dataset.maxRefcount = String(maxRef);
    const reserved = countOf(t.state, 'n');
    d.dataset.free = String(t.n_blocks - used - cached - reserved);
    d.textContent = `${t.name}: ${t.n_blocks} blocks · ${used} used · ${cached} cached · ` +
      `${t.n_blocks - used - cached - reserved} free · ${shared} shared ` +
      `(max refcount ${maxRef})` + (reserved ? ` · ${reserved} reserved (null block)` : '');
    sum.append(d);
  }
  const seqs = snap.sequences ?? [];
  const s = document.createElement('div');
  s.textContent = `${seqs.length}${snap.sequences_truncated ? '+' : ''} sequences` +
    (seqs.length ? ': ' + seqs.slice(0, 8).map((q) =>
      `#${q.id} ${names.get(q.tenant) ?? q.tenant} ${q.tier} ${q.n_tokens} tok`).join(', ') : '');
  sum.append(s);
  $('kv-meta').textContent = `step ${snap.step} · block ${snap.block_size} tokens · ` +
    `${snap.kv_dtype}`;
}

function legend() {
  const lg = $('kv-legend');
  const item = (cls, text) => {
    const s = document.createElement('span');
    const sw = document.createElement('span');
    sw.className = `sw ${cls}`;
    s.append(sw, document.createTextNode(text));
    return s;
  };
  lg.replaceChildren(item('free', 'free'), item('cached', 'cached (prefix cache)'),
    item('used', 'used'), item('shared', 'shared (refcount > 1)'), item('null', 'null block'),
    document.createTextNode('hue: tenant'));
}

// Shows the map, or the reason it cannot be shown.
function setStatus(err) {
  view.error = err;
  const st = $('kv-status');
  const body = $('kv-body');
  if (!err) {
    st.hidden = true;
    st.dataset.status = '';
    body.hidden = false;
    return;
  }
  st.hidden = false;
  body.hidden = true;
  st.dataset.status = String(err.status ?? 0);
  let msg;
  if (err.status === 401) {
    msg = getKey('admin') ? `401: the admin key was refused (${err.message}).` :
      `401: no admin key (${err.message}).`;
    msg += ' The KV map and the live charts need kvserve started with --admin-api-key and ' +
      'that key entered above; the playground works without it.';
  } else if (err.status === 404) {
    msg = '404: this kvserve has no admin API (/admin/kv); the console is playground only.';
  } else {
    msg = `KV map unavailable: ${err.message}`;
  }
  st.textContent = msg;
}

let timer = null; // the next poll, null while one is in flight
let again = false; // the keys changed during a poll: poll again at once

async function poll() {
  clearTimeout(timer);
  timer = null;
  const t0 = performance.now();
  let delay = POLL_MS;
  try {
    view.snap = await getJson('/admin/kv', { admin: true });
    setStatus(null);
    draw();
    summarize();
  } catch (e) {
    setStatus(e instanceof ApiError ? e : new ApiError(0, e.message));
    delay = POLL_OFF_MS;
  }
  if (again) {
    again = false;
    delay = 0;
  }
  timer = setTimeout(poll, Math.max(0, delay - (performance.now() - t0)));
}

// The block under the pointer position of ev, or null.
function cellAt(ev) {
  const canvas = $('kv-canvas');
  const r = canvas.getBoundingClientRect();
  const x = ev.clientX - r.left;
  const y = ev.clientY - r.top;
  for (const L of view.layout) {
    const row = Math.floor((y - L.y0) / L.cell);
    const col = Math.floor(x / L.cell);
    if (y < L.y0 || col < 0 || col >= L.cols) {
      continue;
    }
    const id = row * L.cols + col;
    if (id < L.n) {
      return { tier: L.name, id };
    }
  }
  return null;
}

function line(parent, k, v, cls) {
  const d = document.createElement('div');
  const ks = document.createElement('span');
  ks.className = 'k';
  ks.textContent = `${k} `;
  d.append(ks, document.createTextNode(v));
  if (cls) {
    d.className = cls;
  }
  parent.append(d);
}

// The hover box of block c: what the snapshot knows, then the detail.
function tipContent(c, detail) {
  const snap = view.snap;
  const t = snap.tiers.find((x) => x.name === c.tier);
  const names = new Map(snap.tenants.map((x) => [x.id, x.name]));
  const box = document.createElement('div');
  const st = { f: 'free', c: 'cached', u: 'used', n: 'null block (reserved)' }[t.state[c.id]] ??
    t.state[c.id];
  const tn = t.tenant[c.id];
  line(box, 'block', `${c.id} · ${c.tier} tier · ${st}`);
  line(box, 'refcount', String(detail ? detail.refcount : t.refcount[c.id]));
  line(box, 'tenant', tn >= 0 ? `${names.get(tn) ?? tn} (${tn})` : '-');
  if (!detail) {
    line(box, '', '…');
    return box;
  }
  if (detail.error) {
    line(box, 'detail', detail.error, 'hidden-tokens');
    return box;
  }
  line(box, 'sequences', detail.sequences.length ? detail.sequences.join(', ') : 'none');
  line(box, 'hash', detail.hash ?? 'unhashed');
  if (detail.tokens_hidden) {
    line(box, 'tokens', `hidden: ${detail.tokens_hidden}`, 'hidden-tokens');
  } else if (detail.tokens) {
    const ids = detail.tokens.slice(0, 32).join(' ') + (detail.tokens.length > 32 ? ' …' : '');
    line(box, 'tokens', ids);
    line(box, 'text', JSON.stringify(detail.text ?? ''));
  } else {
    line(box, 'tokens', 'none');
  }
  return box;
}

let inflight = false;

async function fetchDetail(ev) {
  if (inflight || !view.hover) {
    return;
  }
  const c = view.hover;
  inflight = true;
  let detail;
  try {
    detail = await getJson(`/admin/kv/blocks/${encodeURIComponent(c.tier)}/${c.id}`,
      { admin: true, tenant: true });
  } catch (e) {
    detail = { error: e.message };
  }
  inflight = false;
  view.detail = { ...detail, _tier: c.tier, _id: c.id };
  const h = view.hover;
  if (h && h.tier === c.tier && h.id === c.id) {
    showTip(ev, tipContent(c, detail));
    $('tip').dataset.block = `${c.tier}/${c.id}`;
  } else if (h) {
    fetchDetail(ev);
  }
}

function onMove(ev) {
  if (!view.snap) {
    return;
  }
  const c = cellAt(ev);
  if (!c) {
    view.hover = null;
    hideTip();
    return;
  }
  const h = view.hover;
  if (h && h.tier === c.tier && h.id === c.id) {
    showTip(ev, null);
    return;
  }
  view.hover = c;
  $('tip').dataset.block = '';
  showTip(ev, tipContent(c, null));
  fetchDetail(ev);
}

// Starts the map: legend, hover, polling.
export function initKvMap() {
  legend();
  const canvas = $('kv-canvas');
  canvas.addEventListener('mousemove', onMove);
  canvas.addEventListener('mouseleave', () => {
    view.hover = null;
    hideTip();
  });
  window.addEventListener('resize', () => view.snap && draw());
  // New keys: ask at once rather than after the slow retry of an error.
  window.addEventListener('kvserve:keys', () => {
    if (timer !== null) {
      poll();
    } else {
      again = true;
    }
  });
  poll();
}

// For the browser tests and the curious: the last snapshot, the last
// detail, and where block id of tier is drawn (page coordinates of its
// centre, or null).
export const kvView = {
  get snapshot() {
    return view.snap;
  },
  get detail() {
    return view.detail;
  },
  cellCenter(tier, id) {
    const L = view.layout.find((x) => x.name === tier);
    if (!L || id >= L.n) {
      return null;
    }
    const r = $('kv-canvas').getBoundingClientRect();
    return { x: r.left + (id % L.cols) * L.cell + (L.cell - L.gap) / 2,
      y: r.top + L.y0 + Math.floor(id / L.cols) * L.cell + (L.cell - L.gap) / 2 };
  },
};
