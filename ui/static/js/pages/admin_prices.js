import { t } from '../i18n.js';
import { get, post, api } from '../api.js';
import { boot } from '../common.js';
import { $, el, fillRows, showError, showOk, formData } from '../ui.js';

boot();

const MAIN = ['input_price', 'output_price', 'cache_price', 'call_price'];
const OTHER = ['cache_write_price', 'cache_write_1h_price', 'reasoning_price', 'audio_input_price',
  'audio_output_price', 'audio_cache_price', 'image_input_price', 'image_output_price',
  'image_cache_price', 'unit_price', 'web_search_price', 'file_search_price',
  'code_execution_price'];

/** The components beyond the four columns, and the tiers, in a few words. */
function others(p) {
  const parts = OTHER.filter((k) => p[k]).map((k) => `${t(`admin.${k}`)}${t('common.colon')}${p[k]}`);
  for (const tier of p.tiers || []) {
    const { above, ...prices } = tier;
    parts.push(`> ${above}${t('common.colon')}` + Object.entries(prices).map(([k, v]) => `${t(`admin.${k}`)} ${v}`).join(', '));
  }
  return parts.join('; ');
}

function source(p) {
  if (p.source === 'catalogue') return el('span', { class: 'badge ok', title: p.ref }, `${t('admin.source_catalogue')} (${p.ref})`);
  if (p.source === 'none') return el('span', { class: 'badge s2' }, t('admin.source_none'));
  return el('span', { class: 'badge' }, t('admin.source_override'));
}

function row(p) {
  const priced = p.source !== 'none';
  return el('tr', { dataset: { model: p.model, group: p.group, source: p.source } },
    el('td', { class: 'name' }, p.model), el('td', { class: 'name' }, p.group || t('admin.all_groups')),
    el('td', {}, source(p)),
    ...MAIN.map((k) => el('td', {}, priced ? String(p[k]) : '')),
    el('td', { class: 'muted' }, priced ? others(p) : ''),
    el('td', { class: 'actions' },
      el('button', { class: 'small secondary', onclick: () => edit(p) },
        p.source === 'override' ? t('common.edit') : t('admin.override')),
      p.source === 'override' ? el('button', { class: 'small danger', onclick: async () => {
        try { await api('DELETE', `/api/price/?model=${encodeURIComponent(p.model)}&group=${encodeURIComponent(p.group)}`); await load(); } catch (e) { showError(null, e); }
      } }, t('common.delete')) : ''));
}

/** Fill the form from a row: an override starts from the catalogue's prices. */
function edit(p) {
  const f = $('#price-form');
  f.elements.model.value = p.model;
  f.elements.group.value = p.group || '';
  for (const k of [...MAIN, ...OTHER]) f.elements[k].value = p[k] ?? 0;
  f.elements.tiers.value = p.tiers && p.tiers.length ? JSON.stringify(p.tiers) : '';
  if (OTHER.some((k) => p[k]) || (p.tiers && p.tiers.length)) $('#price-more').open = true;
  f.elements.model.focus();
}

async function load() {
  fillRows($('#prices-table tbody'), (await get('/api/price/')).map(row), 9);
}

$('#price-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const status = $('#price-status');
  const body = formData(ev.target);
  if (!body.model.trim()) { showError(status, new Error(t('admin.model_needed'))); return; }
  try {
    body.tiers = body.tiers.trim() ? JSON.parse(body.tiers) : [];
  } catch (e) { showError(status, new Error(t('admin.tiers_not_json'))); return; }
  try { await post('/api/price/', body); showOk(status, t('admin.price_saved')); await load(); } catch (e) { showError(status, e); }
});

(async () => {
  const [groups, cat] = await Promise.all([get('/api/group/'), get('/api/price/catalogue')]);
  $('#p-group').append(...groups.map((g) => el('option', { value: g.name }, g.name)));
  $('#catalogue-version').textContent = cat.version ? `${cat.package} ${cat.version}` : t('admin.no_catalogue');
  await load();
})().catch((e) => showError(null, e));
