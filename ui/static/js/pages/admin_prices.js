import { t } from '../i18n.js';
import { get, post, api } from '../api.js';
import { boot } from '../common.js';
import { $, el, fillRows, showError, showOk, formData } from '../ui.js';

boot();

function row(p) {
  return el('tr', { dataset: { model: p.model, group: p.group } }, el('td', {}, p.model), el('td', {}, p.group || t('admin.all_groups')),
    el('td', {}, String(p.input_price)), el('td', {}, String(p.output_price)), el('td', {}, String(p.cache_price)), el('td', {}, String(p.call_price)),
    el('td', { class: 'actions' },
      el('button', { class: 'small secondary', onclick: () => edit(p) }, t('common.edit')),
      el('button', { class: 'small danger', onclick: async () => {
        try { await api('DELETE', `/api/price/?model=${encodeURIComponent(p.model)}&group=${encodeURIComponent(p.group)}`); await load(); } catch (e) { showError(null, e); }
      } }, t('common.delete'))));
}

function edit(p) {
  const f = $('#price-form');
  for (const k of ['model', 'group', 'input_price', 'output_price', 'cache_price', 'call_price']) f.elements[k].value = p[k];
  f.elements.model.focus();
}

async function load() {
  fillRows($('#prices-table tbody'), (await get('/api/price/')).map(row), 7);
}

$('#price-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const status = $('#price-status');
  const body = formData(ev.target);
  if (!body.model.trim()) { showError(status, new Error(t('admin.model_needed'))); return; }
  try { await post('/api/price/', body); showOk(status, t('admin.price_saved')); await load(); } catch (e) { showError(status, e); }
});

(async () => {
  const groups = await get('/api/group/');
  $('#p-group').append(...groups.map((g) => el('option', { value: g.name }, g.name)));
  await load();
})().catch((e) => showError(null, e));
