// charts.js - live charts drawn by hand on canvases from GET /admin/stats
// (polled at most 4 Hz): running/waiting, tokens/s, TTFT and inter-token
// latency p50/p99, prefix-cache hit rate, preemptions by kind, and each
// tenant's KV blocks and running requests against its quota.
import { ApiError, getJson } from './api.js';
import { tenantHue } from './kvmap.js';

const $ = (id) => document.getElementById(id);
const POLL_MS = 300;
const POLL_OFF_MS = 2000;
const KEEP = 200; // samples (about a minute)

const COLORS = ['#4c9aff', '#f0a030', '#3fb950', '#f85149', '#bc8cff'];

// The charts: a title, and the series each takes from a sample.
const CHARTS = [
  { id: 'requests', title: 'requests', series: [
    ['running', (s) => s.running], ['waiting', (s) => s.waiting], ['swapped', (s) => s.swapped]] },
  { id: 'tps', title: 'tokens/s', series: [
    ['generation', (s) => s.gen_tps], ['prompt', (s) => s.prompt_tps]] },
  { id: 'ttft', title: 'TTFT ms', series: [
    ['p50', (s) => s.ttft_ms?.p50], ['p99', (s) => s.ttft_ms?.p99]] },
  { id: 'itl', title: 'inter-token ms', series: [
    ['p50', (s) => s.itl_ms?.p50], ['p99', (s) => s.itl_ms?.p99]] },
  { id: 'hit', title: 'prefix-cache hit rate', max: 1, series: [
    ['hit rate', (s) => s.prefix_cache?.hit_rate]] },
  { id: 'preempt', title: 'preemptions (total)', series: [
    ['recompute', (s) => s.preemptions?.recompute], ['swap', (s) => s.preemptions?.swap]] },
];

const samples = [];
const boxes = new Map(); // chart id -> {canvas, vals}

function fmt(v) {
  if (v === null || v === undefined || Number.isNaN(v)) {
    return '-';
  }
  if (Number.isInteger(v)) {
    return String(v);
  }
  return Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 1 ? v.toFixed(1) : v.toFixed(2);
}

function build() {
  const grid = $('chart-grid');
  for (const c of CHARTS) {
    const box = document.createElement('div');
    box.className = 'chart';
    box.id = `chart-${c.id}`;
    const title = document.createElement('div');
    title.className = 'title';
    title.textContent = c.title;
    const canvas = document.createElement('canvas');
    const vals = document.createElement('div');
    vals.className = 'vals';
    box.append(title, canvas, vals);
    grid.append(box);
    boxes.set(c.id, { canvas, vals });
  }
}

// A canvas sized to its CSS box at the device's pixel ratio; its 2D
// context in CSS pixels, and the size.
function prep(canvas) {
  const dpr = window.devicePixelRatio || 1;
  const w = Math.max(100, canvas.clientWidth);
  const h = Math.max(40, canvas.clientHeight);
  canvas.width = Math.round(w * dpr);
  canvas.height = Math.round(h * dpr);
  const g = canvas.getContext('2d');
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  return { g, w, h };
}

function drawChart(c) {
  const { canvas, vals } = boxes.get(c.id);
  const { g, w, h } = prep(canvas);
  const data = c.series.map(([, f]) => samples.map((s) => {
    const v = f(s);
    return typeof v === 'number' && Number.isFinite(v) ? v : null;
  }));
  let max = c.max ?? 0;
  for (const d of data) {
    for (const v of d) {
      if (v !== null && v > max) {
        max = v;
      }
    }
  }
  max = max > 0 ? max * (c.max ? 1 : 1.1) : 1;
  const top = 4;
  const bottom = h - 12;
  g.strokeStyle = '#30363d';
  g.lineWidth = 1;
  g.beginPath();
  g.moveTo(0, bottom + 0.5);
  g.lineTo(w, bottom + 0.5);
  g.stroke();
  g.fillStyle = '#8b949e';
  g.font = '10px system-ui, sans-serif';
  g.textBaseline = 'top';
  g.fillText(fmt(max), 2, 0);
  const n = samples.length;
  // A fresh page spreads its first samples; later the window scrolls.
  const dx = w / Math.max(40, n - 1);
  data.forEach((d, k) => {
    g.strokeStyle = COLORS[k % COLORS.length];
    g.lineWidth = 1.5;
    g.beginPath();
    let pen = false;
    d.forEach((v, i) => {
      if (v === null) {
        pen = false;
        return;
      }
      const x = w - (n - 1 - i) * dx;
      const y = bottom - (v / max) * (bottom - top);
      if (pen) {
        g.lineTo(x, y);
      } else {
        g.moveTo(x, y);
        pen = true;
      }
    });
    g.stroke();
  });
  vals.replaceChildren();
  c.series.forEach(([name], k) => {
    const s = document.createElement('span');
    const last = data[k].length ? data[k][data[k].length - 1] : null;
    s.textContent = `${name} ${fmt(last)}  `;
    s.dataset.series = name;
    s.dataset.value = last === null ? '' : String(last);
    s.className = `c${k}`;
    vals.append(s);
  });
}

// Per tenant: KV blocks against the quota, running against max_running.
function drawTenants(tenants) {
  const canvas = $('tenant-canvas');
  const rowH = 22;
  const hgt = Math.max(1, tenants.length) * rowH + 4;
  canvas.style.height = `${hgt}px`;
  const { g, w } = prep(canvas);
  g.font = '11px system-ui, sans-serif';
  g.textBaseline = 'middle';
  const labelW = 90;
  const barW = Math.max(40, w - labelW - 230);
  tenants.forEach((t, i) => {
    const y = i * rowH + 2;
    g.fillStyle = '#e6edf3';
    g.fillText(t.name, 0, y + rowH / 2);
    const quota = t.kv_quota_blocks > 0 ? t.kv_quota_blocks : 1;
    g.fillStyle = '#262c36';
    g.fillRect(labelW, y + 4, barW, rowH - 8);
    g.fillStyle = `hsl(${tenantHue(t.id)}, 80%, 58%)`;
    g.fillRect(labelW, y + 4, Math.min(1, t.kv_blocks / quota) * barW, rowH - 8);
    g.fillStyle = '#8b949e';
    const run = t.max_running > 0 ? `${t.running}/${t.max_running}` : `${t.running}`;
    g.fillText(`KV ${t.kv_blocks}/${t.kv_quota_blocks} · running ${run} · waiting ${t.waiting}`,
      labelW + barW + 8, y + rowH / 2);
  });
  canvas.dataset.tenants = JSON.stringify(tenants.map((t) => ({ name: t.name,
    kv_blocks: t.kv_blocks, kv_quota_blocks: t.kv_quota_blocks })));
}

function setStatus(err) {
  const st = $('stats-status');
  st.hidden = !err;
  st.dataset.status = err ? String(err.status ?? 0) : '';
  if (err) {
    st.textContent = err.status === 401 ? `401: ${err.message}` :
      err.status === 404 ? '404: no admin API in this kvserve' :
        `stats unavailable: ${err.message}`;
  }
  $('chart-grid').hidden = !!err;
}

let timer = null; // the next poll, null while one is in flight
let again = false; // the keys changed during a poll: poll again at once

async function poll() {
  clearTimeout(timer);
  timer = null;
  const t0 = performance.now();
  let delay = POLL_MS;
  try {
    const s = await getJson('/admin/stats', { admin: true });
    const prev = samples[samples.length - 1];
    const dt = prev ? s.uptime_s - prev.uptime_s : 0;
    s.gen_tps = prev && dt > 0 ? (s.generation_tokens_total - prev.generation_tokens_total) / dt
      : null;
    s.prompt_tps = prev && dt > 0 ? (s.prompt_tokens_total - prev.prompt_tokens_total) / dt : null;
    samples.push(s);
    if (samples.length > KEEP) {
      samples.shift();
    }
    setStatus(null);
    for (const c of CHARTS) {
      drawChart(c);
    }
    drawTenants(s.tenants ?? []);
    $('stats-meta').textContent = `uptime ${s.uptime_s.toFixed(0)} s · step ${s.step}`;
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

// Builds the charts and starts polling.
export function initCharts() {
  build();
  window.addEventListener('kvserve:keys', () => {
    if (timer !== null) {
      poll();
    } else {
      again = true;
    }
  });
  poll();
}
