import { t } from '../i18n.js';
import { get, post, del } from '../api.js';
import { boot } from '../common.js';
import { $, el, credits, toUnits, fillRows, showError, showOk } from '../ui.js';

boot();
const STATUS = { 1: 'admin.code_unused', 2: 'keys.disabled', 3: 'admin.code_used' };

function row(c) {
  return el('tr', { dataset: { id: c.id } }, el('td', {}, String(c.id)), el('td', {}, c.name), el('td', {}, el('code', {}, c.key)),
    el('td', {}, credits(c.quota)), el('td', {}, el('span', { class: `badge ${c.status === 1 ? 's1' : c.status === 2 ? 's2' : ''}` }, t(STATUS[c.status] || 'admin.code_used'))),
    el('td', {}, c.status === 1 ? el('button', { class: 'small danger', onclick: async () => {
      try { await del(`/api/redemption/${c.id}`); await load(); } catch (e) { showError(null, e); }
    } }, t('common.delete')) : ''));
}

async function load() {
  const data = await get('/api/redemption/?size=100');
  fillRows($('#codes-table tbody'), data.items.map(row), 6);
}

$('#code-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const f = ev.target;
  const status = $('#code-status');
  try {
    const quota = toUnits(f.elements.credits.value);
    if (!quota) throw new Error(t('err.amount'));
    const codes = await post('/api/redemption/', { name: f.elements.name.value, quota, count: Number(f.elements.count.value || 1) });
    $('#new-codes').hidden = false;
    $('#new-codes').textContent = codes.join('\n');
    showOk(status, t('admin.codes_created', { count: codes.length }));
    await load();
  } catch (e) { showError(status, e); }
});
load().catch((e) => showError(null, e));
