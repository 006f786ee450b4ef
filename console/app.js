// app.js - the web console's entry point (loaded as a module by
// index.html): the key form, the served model, and the three parts
// (playground.js, kvmap.js, charts.js).
import { getJson, getKey, setKey } from './api.js';
import { initCharts } from './charts.js';
import { initKvMap, kvView } from './kvmap.js';
import { initPlayground, setModel } from './playground.js';

const $ = (id) => document.getElementById(id);

async function loadModel() {
  try {
    const r = await getJson('/v1/models');
    const id = r.data?.[0]?.id ?? null;
    setModel(id);
    $('model-name').textContent = id ? `model ${id}` : '';
  } catch (e) {
    $('model-name').textContent = e.status === 401 ? 'enter the API key to use the playground' :
      `models: ${e.message}`;
  }
}

function initKeys() {
  $('api-key').value = getKey('api');
  $('admin-key').value = getKey('admin');
  $('keys').addEventListener('submit', (ev) => {
    ev.preventDefault();
    setKey('api', $('api-key').value.trim());
    setKey('admin', $('admin-key').value.trim());
    window.dispatchEvent(new Event('kvserve:keys'));
    loadModel();
  });
  $('forget-keys').addEventListener('click', () => {
    setKey('api', '');
    setKey('admin', '');
    $('api-key').value = '';
    $('admin-key').value = '';
  });
}

initKeys();
initPlayground();
initKvMap();
initCharts();
loadModel();
window.kvConsole = kvView;
