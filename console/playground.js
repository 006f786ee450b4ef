// playground.js - chat and completion with streaming, the sampling
// parameters, logprobs per token on hover, tools and a JSON schema, and
// the rendered prompt (POST /apply-template).
import { ApiError, postJson, postStream } from './api.js';
import { showTip, hideTip } from './tip.js';

const $ = (id) => document.getElementById(id);

let model = null; // the served model's id (GET /v1/models)
let history = []; // the chat so far: {role, content}
let abort = null; // the AbortController of the running generation

// Sets the model id the requests name.
export function setModel(id) {
  model = id;
}

function mode() {
  return document.querySelector('input[name=mode]:checked').value;
}

function num(id) {
  const v = $(id).value.trim();
  return v === '' ? undefined : Number(v);
}

// The JSON of textarea id, or undefined when empty; throws with a clear
// message when it does not parse.
function jsonField(id, what) {
  const v = $(id).value.trim();
  if (v === '') {
    return undefined;
  }
  try {
    return JSON.parse(v);
  } catch (e) {
    throw new Error(`${what} is not valid JSON: ${e.message}`);
  }
}

// The chat messages this send would carry (the history and the new one).
function chatMessages() {
  const msgs = [];
  const sys = $('system').value.trim();
  if (sys) {
    msgs.push({ role: 'system', content: sys });
  }
  msgs.push(...history);
  const m = $('message').value;
  if (m.trim()) {
    msgs.push({ role: 'user', content: m });
  }
  return msgs;
}

// The request body of the current form.
function requestBody() {
  const body = { model, stream: true, stream_options: { include_usage: true } };
  for (const p of ['temperature', 'top_p', 'top_k', 'max_tokens', 'seed']) {
    const v = num(`p-${p}`);
    if (v !== undefined) {
      body[p] = v;
    }
  }
  if ($('p-ignore_eos').checked) {
    body.ignore_eos = true; // vLLM's field: fill max_tokens (handy to watch the KV map)
  }
  const stop = $('p-stop').value.split(',').map((s) => s.replace(/\\n/g, '\n'))
    .filter((s) => s !== '');
  if (stop.length > 0) {
    body.stop = stop;
  }
  const ntop = num('p-top_logprobs');
  if (mode() === 'chat') {
    body.messages = chatMessages();
    if (ntop !== undefined && ntop > 0) {
      body.logprobs = true;
      body.top_logprobs = ntop;
    }
    const tools = jsonField('tools', 'tools');
    if (tools !== undefined) {
      body.tools = tools;
    }
  } else {
    body.prompt = $('prompt').value;
    if (ntop !== undefined && ntop > 0) {
      body.logprobs = ntop;
    }
  }
  const schema = jsonField('schema', 'the JSON schema');
  if (schema !== undefined) {
    body.response_format = { type: 'json_schema', json_schema: { name: 'console', schema } };
  }
  return body;
}

function lpClass(lp) {
  if (lp === null || lp === undefined) {
    return '';
  }
  const p = Math.exp(lp);
  return p >= 0.5 ? 'lp-high' : p >= 0.1 ? 'lp-mid' : 'lp-low';
}

// The hover text of one token: its logprob, probability and alternatives.
function tokenTip(entry) {
  const lines = [`token ${JSON.stringify(entry.token)}`];
  if (entry.logprob !== null && entry.logprob !== undefined) {
    const pct = (Math.exp(entry.logprob) * 100).toFixed(2);
    lines.push(`logprob ${entry.logprob.toFixed(4)}  p=${pct}%`);
  }
  for (const t of entry.top ?? []) {
    lines.push(`  ${JSON.stringify(t.token).padEnd(16)} ${t.logprob.toFixed(4)}`);
  }
  return lines.join('\n');
}

// Appends text to out as one span per token when the logprob entries
// spell it, else as plain text. pending holds entries that came ahead of
// their text (a tool-call parser holds content back while it decides, but
// not the logprobs): they are used once the text arrives, or dropped.
function appendTokens(out, text, entries, pending) {
  if (entries) {
    pending.push(...entries);
  }
  if (!text) {
    return;
  }
  const spelled = pending.map((e) => e.token).join('');
  if (spelled !== text) {
    pending.length = 0;
    out.append(document.createTextNode(text));
    return;
  }
  for (const e of pending.splice(0)) {
    const span = document.createElement('span');
    span.className = `tok ${lpClass(e.logprob)}`;
    span.textContent = e.token;
    span.dataset.logprob = String(e.logprob);
    span.addEventListener('mouseenter', (ev) => showTip(ev, tokenTip(e)));
    span.addEventListener('mousemove', (ev) => showTip(ev, null));
    span.addEventListener('mouseleave', hideTip);
    out.append(span);
  }
}

// The logprob entries of a stream chunk's choice, chat or completion form:
// [{token, logprob, top: [{token, logprob}]}].
function chunkLogprobs(choice) {
  const lp = choice.logprobs;
  if (!lp) {
    return null;
  }
  if (Array.isArray(lp.content)) {
    return lp.content.map((c) => ({ token: c.token, logprob: c.logprob,
      top: (c.top_logprobs ?? []).map((t) => ({ token: t.token, logprob: t.logprob })) }));
  }
  if (Array.isArray(lp.tokens)) {
    return lp.tokens.map((t, i) => ({ token: t, logprob: lp.token_logprobs?.[i],
      top: Object.entries(lp.top_logprobs?.[i] ?? {})
        .map(([k, v]) => ({ token: k, logprob: v })) }));
  }
  return null;
}

function renderTranscript() {
  const tr = $('transcript');
  tr.replaceChildren();
  for (const m of history) {
    const d = document.createElement('div');
    d.className = `msg ${m.role}`;
    const r = document.createElement('span');
    r.className = 'role';
    r.textContent = m.role;
    d.append(r, document.createTextNode(m.content ?? ''));
    tr.append(d);
  }
}

function setBusy(busy) {
  $('send').disabled = busy;
  $('stop').disabled = !busy;
}

async function send() {
  const out = $('output');
  const status = $('gen-status');
  let body;
  try {
    body = requestBody();
  } catch (e) {
    status.textContent = e.message;
    status.className = 'error';
    return;
  }
  const isChat = mode() === 'chat';
  const path = isChat ? '/v1/chat/completions' : '/v1/completions';
  out.replaceChildren();
  $('usage').textContent = '';
  status.className = 'dim';
  status.textContent = 'generating…';
  out.dataset.state = 'streaming';
  abort = new AbortController();
  setBusy(true);
  let text = '';
  let finish = null;
  const toolCalls = [];
  const t0 = performance.now();
  let tFirst = null;
  let nTok = 0;
  const pending = [];
  try {
    await postStream(path, body, (chunk) => {
      if (chunk.usage) {
        $('usage').textContent = `prompt ${chunk.usage.prompt_tokens} tokens, ` +
          `completion ${chunk.usage.completion_tokens} tokens`;
      }
      const ch = chunk.choices?.[0];
      if (!ch) {
        return;
      }
      const piece = isChat ? ch.delta?.content ?? '' : ch.text ?? '';
      const entries = chunkLogprobs(ch);
      if (piece || entries) {
        tFirst ??= performance.now();
      }
      nTok += entries ? entries.length : piece ? 1 : 0;
      appendTokens(out, piece, entries, pending);
      text += piece;
      for (const tc of ch.delta?.tool_calls ?? []) {
        const cur = toolCalls[tc.index ?? 0] ??= { name: '', arguments: '' };
        cur.name += tc.function?.name ?? '';
        cur.arguments += tc.function?.arguments ?? '';
      }
      if (ch.finish_reason) {
        finish = ch.finish_reason;
      }
    }, abort.signal);
    for (const tc of toolCalls) {
      const d = document.createElement('div');
      d.className = 'tool-call';
      d.textContent = `tool call: ${tc.name}(${tc.arguments})`;
      out.append(d);
    }
    const dt = (performance.now() - t0) / 1000;
    status.textContent = `done (${finish ?? 'end'}) · ${nTok} tokens in ${dt.toFixed(2)} s` +
      (tFirst !== null ? ` · first token after ${((tFirst - t0)).toFixed(0)} ms` : '');
    out.dataset.state = 'done';
    if (isChat) {
      const m = $('message').value;
      if (m.trim()) {
        history.push({ role: 'user', content: m });
      }
      history.push({ role: 'assistant', content: text });
      $('message').value = '';
      renderTranscript();
    }
  } catch (e) {
    out.dataset.state = 'error';
    status.className = 'error';
    if (e.name === 'AbortError') {
      status.textContent = 'stopped';
    } else if (e instanceof ApiError && e.status === 401) {
      status.textContent = `401: ${e.message} (set the API key above)`;
    } else {
      status.textContent = e.message;
    }
  } finally {
    abort = null;
    setBusy(false);
  }
}

async function showPrompt() {
  const pre = $('rendered-prompt');
  if (!pre.hidden) {
    pre.hidden = true;
    return;
  }
  try {
    if (mode() === 'chat') {
      const r = await postJson('/apply-template', { model, messages: chatMessages() });
      pre.textContent = r.prompt;
    } else {
      pre.textContent = $('prompt').value;
    }
  } catch (e) {
    pre.textContent = `error: ${e.message}`;
  }
  pre.hidden = false;
}

// Wires the playground's controls.
export function initPlayground() {
  for (const r of document.querySelectorAll('input[name=mode]')) {
    r.addEventListener('change', () => {
      $('chat-inputs').hidden = mode() !== 'chat';
      $('completion-inputs').hidden = mode() === 'chat';
    });
  }
  $('send').addEventListener('click', send);
  $('message').addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && (ev.ctrlKey || ev.metaKey)) {
      send();
    }
  });
  $('stop').addEventListener('click', () => abort?.abort());
  $('show-prompt').addEventListener('click', showPrompt);
  $('clear').addEventListener('click', () => {
    history = [];
    renderTranscript();
    $('output').replaceChildren();
    $('gen-status').textContent = '';
    $('usage').textContent = '';
  });
}
