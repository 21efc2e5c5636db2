import { t } from '../i18n.js';
import { get, post, put, del } from '../api.js';
import { boot } from '../common.js';
import { $, el, fillRows, showError, showOk, openDialog, toast, stateBadge, when } from '../ui.js';

boot();
const dlg = $('#channel-dialog');
const form = $('#channel-form');

// What the channel was seen to refuse (relay/compat): its API on the row,
// each beta or field it refuses below its name, each with a Forget button.
function factText(f) {
  if (f.kind === 'wire') return t(`admin.learned_wire_${f.name}`);
  return t('admin.learned_strip', { what: f.label, model: f.model });
}

function forget(c, id) {
  return async () => {
    try { await del(`/api/channel/${c.id}/learned${id ? `?id=${encodeURIComponent(id)}` : ''}`); await load(); } catch (e) { showError(null, e); }
  };
}

function learned(c) {
  const facts = c.learned || [];
  if (!facts.length) return null;
  const items = facts.map((f) => el('li', { class: 'learned-fact', dataset: { kind: f.kind, name: f.name },
    title: t('admin.learned_until', { reason: f.reason, until: when(f.until) }) },
  el('span', { class: 'badge' }, factText(f)), ' ',
  el('button', { class: 'link forget', type: 'button', onclick: forget(c, f.id) }, t('admin.forget'))));
  if (facts.length > 1) {
    items.push(el('li', {}, el('button', { class: 'link forget-all', type: 'button', onclick: forget(c, null) }, t('admin.forget_all'))));
  }
  return el('ul', { class: 'learned', 'aria-label': t('admin.learned') }, items);
}

function row(c) {
  const result = el('span', { class: 'test-result' });
  return el('tr', { dataset: { id: c.id, name: c.name } }, el('td', {}, String(c.id)), el('td', {}, c.name, learned(c)), el('td', {}, c.type),
    el('td', {}, c.models.join(', ')), el('td', {}, String(c.priority)), el('td', {}, String(c.weight)),
    el('td', {}, stateBadge(c.enabled)),
    el('td', { class: 'actions' },
      el('button', { class: 'small test', onclick: async () => {
        result.textContent = t('admin.testing');
        try { const r = await post(`/api/channel/${c.id}/test`); result.textContent = r.ok ? `✓ ${r.latency_ms} ms` : `✗ ${r.error}`; result.className = `test-result ${r.ok ? 'ok' : 'error'}`; } catch (e) { result.textContent = e.message; }
      } }, t('admin.test')),
      el('button', { class: 'small secondary', onclick: () => edit(c) }, t('common.edit')),
      el('button', { class: 'small secondary', onclick: async () => {
        try { await put('/api/channel/', { id: c.id, enabled: !c.enabled }); await load(); } catch (e) { showError(null, e); }
      } }, c.enabled ? t('keys.disable') : t('keys.enable')),
      el('button', { class: 'small danger', onclick: async () => {
        if (!confirm(t('admin.confirm_delete_channel', { name: c.name }))) return;
        try { await del(`/api/channel/${c.id}`); await load(); } catch (e) { showError(null, e); }
      } }, t('common.delete')), result));
}

async function load() {
  const data = await get('/api/channel/?size=200');
  fillRows($('#channels-table tbody'), data.items.map(row), 8);
}

function edit(c) {
  form.reset();
  $('#channel-status').textContent = '';
  form.elements.id.value = c ? c.id : '';
  form.elements.name.value = c ? c.name : '';
  form.elements.type.value = c ? c.type : 'openai';
  form.elements.base_url.value = c ? c.base_url : '';
  form.elements.key.value = '';
  form.elements.key.placeholder = c ? c.key : '';
  form.elements.models.value = c ? c.models.join(', ') : '';
  form.elements.groups.value = c ? c.groups.join(', ') : 'default';
  form.elements.priority.value = c ? c.priority : 0;
  form.elements.weight.value = c ? c.weight : 1;
  form.elements.model_mapping.value = c && Object.keys(c.model_mapping).length ? JSON.stringify(c.model_mapping, null, 1) : '';
  form.elements.enabled.checked = c ? c.enabled : true;
  openDialog(dlg);
}

form.addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const status = $('#channel-status');
  const f = form.elements;
  let mapping = {};
  if (f.model_mapping.value.trim()) {
    try { mapping = JSON.parse(f.model_mapping.value); } catch (e) { showError(status, new Error(t('admin.bad_mapping'))); return; }
  }
  const body = {
    name: f.name.value.trim(), type: f.type.value.trim(), base_url: f.base_url.value.trim(),
    models: f.models.value, groups: f.groups.value, priority: Number(f.priority.value || 0),
    weight: Number(f.weight.value || 0), model_mapping: mapping, enabled: f.enabled.checked,
  };
  if (f.key.value) body.key = f.key.value;
  try {
    if (f.id.value) await put('/api/channel/', { id: Number(f.id.value), ...body });
    else await post('/api/channel/', body);
    dlg.close();
    toast(t('common.saved'));
    await load();
  } catch (e) { showError(status, e); }
});
dlg.querySelector('.close').addEventListener('click', () => dlg.close());
$('#new-channel').addEventListener('click', () => edit(null));
load().catch((e) => showError(null, e));
