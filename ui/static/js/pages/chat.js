import { t } from '../i18n.js';
import { get } from '../api.js';
import * as live from '../live.js';
import { boot } from '../common.js';
import { render } from '../markdown.js';
import { $, el, showError } from '../ui.js';

boot();

const MAX_IMAGE = 20 * 1024 * 1024;
const STORE = 'console.chat.history';
let history = [];
let pending = null;   // {id, text, node}
let image = null;     // data URL waiting to be sent
let keys = [];

function save() {
  try { localStorage.setItem(STORE, JSON.stringify(history)); } catch (e) {
    // Over the browser's quota (images): keep the text, drop the pictures.
    const slim = history.map((m) => (typeof m.content === 'string' ? m
      : { role: m.role, content: m.content.filter((p) => p.type === 'text') }));
    try { localStorage.setItem(STORE, JSON.stringify(slim)); } catch (e2) { /* give up quietly */ }
  }
}

function bubble(role, content) {
  const body = el('div', { class: 'body' });
  if (typeof content === 'string') body.append(role === 'assistant' ? render(content) : el('p', {}, content));
  else {
    for (const p of content) {
      if (p.type === 'text') body.append(role === 'assistant' ? render(p.text) : el('p', {}, p.text));
      if (p.type === 'image_url') body.append(el('img', { src: p.image_url.url, alt: t('chat.image_alt'), class: 'chat-img' }));
    }
  }
  const node = el('div', { class: `msg ${role}` }, el('span', { class: 'who' }, t(`chat.role_${role}`)), body);
  $('#chat-log').append(node);
  node.scrollIntoView({ block: 'end' });
  return node;
}

function redraw() {
  $('#chat-log').replaceChildren();
  for (const m of history) bubble(m.role, m.content);
}

function busy(on) {
  $('#chat-send').disabled = on;
  $('#chat-stop').disabled = !on;
}

function keyChoice() {
  const v = $('#chat-key').value;
  if (v === 'raw') return { key: $('#chat-rawkey').value.trim() };
  return { key_id: Number(v) };
}

async function fillModels() {
  const v = $('#chat-key').value;
  const k = keys.find((x) => String(x.id) === v);
  let models = [];
  if (k && k.model_limits_enabled && k.model_limits) models = k.model_limits.split(',');
  else {
    try { models = await get(`/api/user/models?group=${encodeURIComponent(k ? k.group : '')}`); } catch (e) { models = []; }
  }
  $('#chat-models').replaceChildren(...models.map((m) => el('option', { value: m })));
  if (!$('#chat-model').value && models.length) $('#chat-model').value = models[0];
}

function send(ev) {
  ev.preventDefault();
  const status = $('#chat-status');
  status.textContent = '';
  const text = $('#chat-text').value.trim();
  if (!text && !image) return;
  const mode = $('#chat-mode').value;
  const base = $('#chat-base').value.trim();
  const model = $('#chat-model').value.trim();
  if (!base || !model) { showError(status, new Error(t('chat.need_base_model'))); return; }
  const id = `c${Date.now()}${Math.random().toString(36).slice(2, 8)}`;
  const content = image ? [{ type: 'text', text }, { type: 'image_url', image_url: { url: image } }] : text;
  history.push({ role: 'user', content });
  bubble('user', content);
  const node = bubble('assistant', '');
  node.classList.add('streaming');
  pending = { id, text: '', node, mode };
  busy(true);
  if (mode === 'image') {
    live.send({ type: 'image', id, ...keyChoice(), model, base, prompt: text });
  } else {
    live.send({ type: 'chat', id, ...keyChoice(), model, base, messages: history, stream: true });
  }
  $('#chat-text').value = '';
  image = null;
  $('#chat-image').value = '';
  $('#chat-image-name').textContent = '';
  save();
}

function finish(stopped) {
  if (!pending) return;
  pending.node.classList.remove('streaming');
  if (stopped) pending.node.append(el('p', { class: 'muted' }, t('chat.stopped')));
  if (pending.text || pending.images) {
    history.push({ role: 'assistant', content: pending.text || (pending.images || []).join('\n') });
    save();
  }
  pending = null;
  busy(false);
  $('#chat-text').focus();
}

let drawTimer = null;
live.on('chat_delta', (m) => {
  if (!pending || m.id !== pending.id) return;
  pending.text += m.text;
  // Re-render at most every 50 ms: a long reply arrives in many pieces.
  if (!drawTimer) {
    drawTimer = setTimeout(() => {
      drawTimer = null;
      if (!pending) return;
      pending.node.querySelector('.body').replaceChildren(render(pending.text));
      pending.node.scrollIntoView({ block: 'end' });
    }, 50);
  }
});
live.on('chat_image', (m) => {
  if (!pending || m.id !== pending.id) return;
  pending.images = (pending.images || []).concat([m.url]);
  pending.node.querySelector('.body').append(el('img', { src: m.url, alt: t('chat.image_alt'), class: 'chat-img' }));
});
live.on('chat_done', (m) => {
  if (!pending || m.id !== pending.id) return;
  clearTimeout(drawTimer); drawTimer = null;
  pending.node.querySelector('.body').replaceChildren(render(pending.text));
  if (pending.images) for (const u of pending.images) pending.node.querySelector('.body').append(el('img', { src: u, alt: t('chat.image_alt'), class: 'chat-img' }));
  pending.node.dataset.done = '1';
  finish(!!m.stopped);
});
live.on('chat_error', (m) => {
  if (!pending || m.id !== pending.id) {
    showError($('#chat-status'), new Error(m.message));
    return;
  }
  pending.node.classList.add('error');
  pending.node.querySelector('.body').replaceChildren(el('p', { class: 'error' }, m.message));
  showError($('#chat-status'), new Error(m.message));
  history.pop();  // the question stays in the box to try again
  save();
  pending = null;
  busy(false);
});
live.on('closed', () => { if (pending) { pending.node.classList.remove('streaming'); pending = null; busy(false); } });

$('#chat-form').addEventListener('submit', send);
$('#chat-text').addEventListener('keydown', (ev) => {
  if (ev.key === 'Enter' && (ev.ctrlKey || ev.metaKey)) send(ev);
});
$('#chat-stop').addEventListener('click', () => { if (pending) live.send({ type: 'chat_stop', id: pending.id }); });
$('#chat-clear').addEventListener('click', () => { history = []; save(); redraw(); });
$('#chat-key').addEventListener('change', () => {
  $('#raw-key-box').hidden = $('#chat-key').value !== 'raw';
  fillModels();
});
$('#chat-image').addEventListener('change', () => {
  const f = $('#chat-image').files[0];
  image = null;
  $('#chat-image-name').textContent = '';
  if (!f) return;
  if (f.size >= MAX_IMAGE) { showError($('#chat-status'), new Error(t('chat.image_too_big'))); $('#chat-image').value = ''; return; }
  const reader = new FileReader();
  reader.onload = () => { image = reader.result; $('#chat-image-name').textContent = f.name; };
  reader.readAsDataURL(f);
});

(async () => {
  try { history = JSON.parse(localStorage.getItem(STORE) || '[]'); } catch (e) { history = []; }
  if (!Array.isArray(history)) history = [];
  redraw();
  const q = new URLSearchParams(location.search);
  const data = await get('/api/token/?size=200');
  keys = data.items.filter((k) => k.owned !== false);
  $('#chat-key').replaceChildren(...keys.map((k) => el('option', { value: String(k.id) }, `${k.name} (${k.key})`)),
    el('option', { value: 'raw' }, t('chat.other_key')));
  if (q.get('key_id')) $('#chat-key').value = q.get('key_id');
  $('#raw-key-box').hidden = $('#chat-key').value !== 'raw';
  let bases = [];
  try { bases = (await get('/api/status')).base_addresses; } catch (e) { bases = []; }
  $('#chat-bases').replaceChildren(...bases.map((b) => el('option', { value: b.url }, b.region || b.url)));
  $('#chat-base').value = q.get('base') || (bases[0] ? bases[0].url : location.origin);
  if (q.get('model')) $('#chat-model').value = q.get('model');
  await fillModels();
  document.body.dataset.ready = '1';
})().catch((e) => showError(null, e));
