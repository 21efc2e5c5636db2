import { t } from '../i18n.js';
import { get, post, put, del } from '../api.js';
import { boot } from '../common.js';
import { $, el, fillRows, showError, showOk, formData, stateBadge } from '../ui.js';
import { ruleWords } from '../budget_view.js';

boot();
let groups = [];

function row(g) {
  return el('tr', { dataset: { name: g.name } }, el('td', {}, g.name), el('td', {}, `×${g.rate}`),
    el('td', { class: 'rule' }, ruleWords(g)), el('td', {}, g.description),
    el('td', { class: 'usable' }, (g.usable_groups || []).join(', ')),
    el('td', {}, stateBadge(g.enabled)),
    el('td', { class: 'actions' },
      el('button', { class: 'small secondary', onclick: () => edit(g) }, t('common.edit')),
      el('button', { class: 'small danger', onclick: async () => {
        if (!confirm(t('admin.confirm_delete_group', { name: g.name }))) return;
        try { await del(`/api/group/${encodeURIComponent(g.name)}`); await load(); } catch (e) { showError(null, e); }
      } }, t('common.delete'))));
}

function edit(g) {
  const f = $('#group-form');
  f.elements.name.value = g.name; f.elements.rate.value = g.rate;
  f.elements.description.value = g.description; f.elements.enabled.checked = g.enabled;
  f.elements.usable_groups.value = (g.usable_groups || []).join(', ');
  f.elements.input_tiers.value = g.input_tiers.length ? JSON.stringify(g.input_tiers) : '';
  f.elements.spend_tiers.value = g.spend_tiers.length ? JSON.stringify(g.spend_tiers) : '';
  f.elements.name.focus();
}

async function load() {
  groups = await get('/api/group/');
  fillRows($('#groups-table tbody'), groups.map(row), 7);
}

$('#group-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const body = formData(ev.target);
  const status = $('#group-status');
  try {
    // Tiers are typed as JSON; empty is none (the server says what is wrong).
    for (const f of ['input_tiers', 'spend_tiers']) body[f] = body[f] ? JSON.parse(body[f]) : [];
    if (groups.some((g) => g.name === body.name)) await put('/api/group/', body);
    else await post('/api/group/', body);
    showOk(status, t('common.saved'));
    await load();
  } catch (e) { showError(status, e); }
});
load().catch((e) => showError(null, e));
