import { has, t } from '../i18n.js';
import { get, post, put, del } from '../api.js';
import { boot } from '../common.js';
import { $, $$, el, credits, toUnits, fillRows, showError, showOk, toast, when, stateBadge } from '../ui.js';

boot();
let channels = [];
let subs = [];
let keys = [];
const form = $('#sub-form');

function channelOf(type) { return channels.find((c) => c.type === type); }

// The server describes its channels in English; the table has their words
// in the console's language (a channel it does not know keeps the server's).
function word(key, fallback) { return has(key) ? t(key) : fallback; }
const channelLabel = (c) => word(`notify.ch.${c.type}`, c.label);
const fieldLabel = (c, f) => word(`notify.field.${c.type}.${f.name}`, f.label);

function objectEditor(name, value) {
  // Custom headers: one row per name/value pair.
  const box = el('div', { class: 'kv', dataset: { field: name } });
  const add = (k = '', v = '') => {
    const r = el('div', { class: 'row kv-row' },
      el('input', { class: 'kv-k', 'aria-label': t('notify.header_name'), value: k, placeholder: 'X-Header' }),
      el('input', { class: 'kv-v', 'aria-label': t('notify.header_value'), value: v }),
      el('button', { type: 'button', class: 'small secondary', onclick: () => r.remove() }, t('common.delete')));
    box.insertBefore(r, addBtn);
  };
  const addBtn = el('button', { type: 'button', class: 'small secondary', onclick: () => add() }, t('notify.add_header'));
  box.append(addBtn);
  for (const [k, v] of Object.entries(value || {})) add(k, v);
  return box;
}

function renderFields(type, config = {}) {
  const box = $('#channel-fields');
  box.replaceChildren();
  const ch = channelOf(type);
  if (!ch) return;
  for (const f of ch.fields) {
    const id = `cf-${f.name}`;
    const label = el('label', { for: id }, fieldLabel(ch, f) + (f.required ? ' *' : ''));
    let input;
    if (f.kind === 'object') {
      box.append(el('span', { class: 'label' }, fieldLabel(ch, f)), objectEditor(f.name, config[f.name]));
      continue;
    } else if (f.kind === 'text') {
      input = el('textarea', { id, rows: 4, dataset: { field: f.name } }, config[f.name] || '');
    } else if (f.kind === 'choice') {
      input = el('select', { id, dataset: { field: f.name } }, ...(f.choices || []).map((c) => el('option', { value: c }, word(`notify.vendor.${c}`, c))));
      if (config[f.name]) input.value = config[f.name];
    } else {
      input = el('input', { id, type: f.secret ? 'password' : 'text', autocomplete: 'off', dataset: { field: f.name }, value: config[f.name] || '' });
    }
    if (f.required) input.required = true;
    box.append(label, input);
  }
  if (type === 'email') box.append(el('p', { class: 'muted' }, t('notify.email_help')));
  $('#push-bind').hidden = type !== 'personal_push';
  $('#preview-box').hidden = type !== 'webhook';
  $('#preview-out').textContent = '';
  if (type === 'webhook') {
    box.append(el('p', { class: 'muted' }, t('notify.template_help')));
  }
}

function collectConfig() {
  const cfg = {};
  for (const input of $$('#channel-fields [data-field]')) {
    if (input.classList.contains('kv')) {
      const obj = {};
      for (const r of input.querySelectorAll('.kv-row')) {
        const k = r.querySelector('.kv-k').value.trim();
        if (k) obj[k] = r.querySelector('.kv-v').value;
      }
      cfg[input.dataset.field] = obj;
    } else cfg[input.dataset.field] = input.value;
  }
  return cfg;
}

function collect() {
  const events = $$('input[name="ev"]:checked', form).map((i) => i.value);
  return {
    name: form.elements.name.value.trim(),
    event_types: events,
    user_threshold: toUnits(form.elements.user_threshold.value || '0'),
    key_threshold: toUnits(form.elements.key_threshold.value || '0'),
    key_ids: [...$('#s-keys').selectedOptions].map((o) => Number(o.value)),
    channel_type: $('#s-channel').value,
    channel_config: collectConfig(),
    enabled: $('#s-enabled').checked,
  };
}

function openForm(s) {
  form.hidden = false;
  form.reset();
  $('#sub-status').textContent = '';
  form.elements.id.value = s ? s.id : '';
  form.elements.name.value = s ? s.name : '';
  for (const i of $$('input[name="ev"]', form)) i.checked = s ? s.event_types.includes(i.value) : false;
  form.elements.user_threshold.value = s ? String(s.user_threshold / 500000) : '0';
  form.elements.key_threshold.value = s ? String(s.key_threshold / 500000) : '0';
  for (const o of $('#s-keys').options) o.selected = s ? s.key_ids.includes(Number(o.value)) : false;
  $('#s-channel').value = s ? s.channel_type : (channels[0] || {}).type;
  $('#s-enabled').checked = s ? s.enabled : true;
  renderFields($('#s-channel').value, s ? s.channel_config : {});
  form.elements.name.focus();
}

/** An event's name, with the threshold (and watched keys) of a warning. */
function eventText(s, e) {
  const name = t(`notify.ev_${e}`);
  if (e === 'user_quota_warning') return t('notify.below', { name, amount: credits(s.user_threshold) });
  if (e !== 'key_quota_warning') return name;
  const watched = s.key_ids.length
    ? s.key_ids.map((id) => (keys.find((k) => k.id === id) || { name: `#${id}` }).name).join(', ')
    : t('notify.all_keys');
  return t('notify.below_keys', { name, amount: credits(s.key_threshold), keys: watched });
}

function row(s) {
  const ch = channelOf(s.channel_type);
  return el('tr', { dataset: { id: s.id } },
    el('td', {}, s.name),
    el('td', { class: 'events' }, s.event_types.map((e) => el('span', { class: 'event', dataset: { event: e } }, eventText(s, e)))),
    el('td', {}, ch ? channelLabel(ch) : s.channel_type),
    el('td', {}, stateBadge(s.enabled), s.last_error ? el('span', { class: 'error' }, ` ${s.last_error}`) : ''),
    el('td', { class: 'actions' },
      el('button', { class: 'small test', onclick: () => test(s) }, t('notify.send_test')),
      el('button', { class: 'small secondary', onclick: () => openForm(s) }, t('common.edit')),
      el('button', { class: 'small secondary', onclick: () => deliveries(s) }, t('notify.deliveries')),
      el('button', { class: 'small danger', onclick: () => remove(s) }, t('common.delete'))));
}

async function load() {
  const data = await get('/api/subscription/');
  subs = Array.isArray(data) ? data : data.items;
  fillRows($('#subs-table tbody'), subs.map(row), 5);
}

async function test(s) {
  try {
    const r = await post(`/api/subscription/${s.id}/test`);
    if (r && r.ok === false) showError(null, new Error(t('notify.test_failed', { error: r.error || '' })));
    else toast(t('notify.test_sent') + (r && r.receipt ? ` (${r.receipt})` : ''));
    const tr = document.querySelector(`#subs-table tr[data-id="${Number(s.id)}"]`);
    if (tr) tr.dataset.test = r && r.ok === false ? 'failed' : 'sent';
    await deliveries(s);
  } catch (e) { showError(null, e); }
}

/** The delivery history: every subscription's, or one's (s). */
async function deliveries(s) {
  const list = $('#deliveries');
  $('#deliveries-title').textContent = s ? t('notify.deliveries_of', { name: s.name }) : t('notify.deliveries');
  $('#deliveries-all').hidden = !s;
  try {
    const data = await get(s ? `/api/subscription/${s.id}/deliveries` : '/api/notify/deliveries?size=20');
    const items = Array.isArray(data) ? data : data.items || [];
    list.replaceChildren(...items.map((d) => el('li', { dataset: { status: d.status } },
      `${when(d.created_at || d.updated_at)} · ${d.title || d.event_type || ''} · `,
      el('span', { class: `badge ${d.status === 'sent' ? 'ok' : d.status === 'failed' ? 's2' : ''}` }, t(`notify.status_${d.status}`)),
      d.last_error ? ` · ${d.last_error}` : '', d.receipt ? ` · ${d.receipt}` : '')));
    if (!items.length) list.append(el('li', { class: 'muted empty' }, s ? t('notify.no_deliveries_sub') : t('notify.no_deliveries')));
  } catch (e) { showError(null, e); }
}

async function remove(s) {
  if (!confirm(t('notify.confirm_delete', { name: s.name }))) return;
  try { await del(`/api/subscription/${s.id}`); await load(); } catch (e) { showError(null, e); }
}

form.addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const status = $('#sub-status');
  let body;
  try { body = collect(); } catch (e) { showError(status, e); return; }
  if (!body.event_types.length) { showError(status, new Error(t('notify.pick_event'))); return; }
  const id = form.elements.id.value;
  try {
    if (id) await put('/api/subscription/', { id: Number(id), ...body });
    else await post('/api/subscription/', body);
    showOk(status, t('common.saved'));
    form.hidden = true;
    await load();
  } catch (e) { showError(status, e); }
});

$('#s-channel').addEventListener('change', () => renderFields($('#s-channel').value));
$('#new-sub').addEventListener('click', () => openForm(null));
$('#sub-cancel').addEventListener('click', () => { form.hidden = true; });
$('#preview-btn').addEventListener('click', async () => {
  try {
    // What the form says now (thresholds, keys), as a real delivery would carry it.
    const f = collect();
    const body = { channel_type: f.channel_type, channel_config: f.channel_config, event_type: f.event_types[0] || 'announcement',
      user_threshold: f.user_threshold, key_threshold: f.key_threshold, key_ids: f.key_ids };
    const r = await post('/api/subscription/preview', body);
    $('#preview-out').textContent = r.body;
    $('#preview-vars').replaceChildren(el('p', { class: 'muted' }, t('notify.variables')),
      el('dl', { class: 'vars' }, Object.entries(r.variables).flatMap(([k, v]) => [
        el('dt', {}, `{{ ${k} }}`), el('dd', { dataset: { var: k } }, String(v))])));
  } catch (e) { $('#preview-out').textContent = e.message; $('#preview-vars').replaceChildren(); }
});
$('#deliveries-all').addEventListener('click', () => deliveries(null));
$('#push-qr').addEventListener('click', async () => {
  try {
    const r = await get('/api/notify/push/qrcode?vendor=wxpusher');
    const img = $('#push-qr-img');
    img.src = r.qr_url; img.hidden = false;
    $('#push-state').textContent = t('notify.push_waiting');
    const poll = setInterval(async () => {
      try {
        const b = await get('/api/notify/push/binding');
        if (b && b.uid) {
          clearInterval(poll);
          $('#push-state').textContent = t('notify.push_bound', { uid: b.uid });
        }
      } catch (e) { clearInterval(poll); }
    }, 3000);
    setTimeout(() => clearInterval(poll), 5 * 60 * 1000);
  } catch (e) { showError(null, e); }
});

$('#marketing-opt-in').addEventListener('change', async (ev) => {
  try {
    await put('/api/user/self', { marketing_opt_in: ev.target.checked });
    toast(t('common.saved'));
  } catch (e) { ev.target.checked = !ev.target.checked; showError(null, e); }
});

(async () => {
  get('/api/user/self').then((me) => { $('#marketing-opt-in').checked = !!me.marketing_opt_in; });
  channels = await get('/api/notify/channels');
  $('#s-channel').replaceChildren(...channels.map((c) => el('option', { value: c.type }, channelLabel(c))));
  keys = (await get('/api/token/?size=200')).items;
  $('#s-keys').replaceChildren(...keys.map((k) => el('option', { value: String(k.id) }, k.name)));
  await load();
  await deliveries(null);
  document.body.dataset.ready = '1';
})().catch((e) => showError(null, e));
