import { t } from '../i18n.js';
import { get, post, put, del } from '../api.js';
import * as live from '../live.js';
import { boot } from '../common.js';
import { checkAllowList } from '../net.js';
import { PERIODS, budgetBars, ruleWords } from '../budget_view.js';
import { $, el, credits, toUnits, when, fillRows, showError, showOk, copyText, openDialog, toast } from '../ui.js';

boot();

const STATUS = { 1: 'keys.enabled', 2: 'keys.disabled', 3: 'keys.expired', 4: 'keys.exhausted' };
let groups = [];
let keys = [];
let defaultBase = location.origin;
const dlg = $('#key-dialog');
const form = $('#key-form');

function remainingText(k) {
  return k.unlimited_quota ? t('keys.unlimited_short') : credits(k.remain_quota);
}

async function modelsFor(group) {
  try { return await get(`/api/user/models?group=${encodeURIComponent(group)}`); } catch (e) { return []; }
}

async function openChat(k) {
  let model = '';
  if (k.model_limits_enabled && k.model_limits) model = k.model_limits.split(',')[0];
  else model = (await modelsFor(k.group))[0] || '';
  const q = new URLSearchParams({ key_id: k.id, model, base: defaultBase });
  location.href = `/console/chat?${q}`;
}

function row(k) {
  const remain = el('td', { class: 'remain', dataset: { quota: k.remain_quota } },
    el('span', { class: 'remain-text' }, remainingText(k)), ...budgetBars(k.budget_use));
  const enabled = k.status === 1;
  return el('tr', { dataset: { id: k.id, name: k.name } },
    el('td', { class: 'name' }, k.name),
    el('td', {}, el('code', { class: 'masked' }, k.key), ' ',
      el('button', { class: 'small secondary copy', 'aria-label': t('keys.copy_label', { name: k.name }),
        onclick: async () => { const full = await get(`/api/token/${k.id}`); await copyText(full.key); } }, t('common.copy'))),
    el('td', {}, k.group),
    remain,
    el('td', {}, k.expired_time > 0 ? when(k.expired_time) : t('common.never')),
    el('td', {}, el('span', { class: `badge s${k.status}` }, t(STATUS[k.status] || 'keys.enabled'))),
    el('td', { class: 'ips' }, k.allow_ips ? k.allow_ips.split('\n').join(', ') : t('common.any')),
    el('td', { class: 'lock' }, k.model_limits_enabled ? k.model_limits.split(',').join(', ') : t('common.any')),
    el('td', { class: 'actions' },
      el('button', { class: 'small chat', onclick: () => openChat(k) }, t('keys.chat')),
      el('button', { class: 'small secondary edit', onclick: () => edit(k) }, t('common.edit')),
      el('button', { class: 'small secondary toggle', onclick: () => setStatus(k, enabled ? 2 : 1) },
        enabled ? t('keys.disable') : t('keys.enable')),
      el('button', { class: 'small danger delete', onclick: () => remove(k) }, t('common.delete'))));
}

async function load() {
  const kw = $('#key-search').value.trim();
  const data = await get(kw ? `/api/token/search?keyword=${encodeURIComponent(kw)}&size=200` : '/api/token/?size=200');
  keys = data.items;
  fillRows($('#keys-table tbody'), keys.map(row), 9);
}

async function setStatus(k, status) {
  try { await put('/api/token/?status_only=1', { id: k.id, status }); await load(); } catch (e) { showError(null, e); }
}

async function remove(k) {
  if (!confirm(t('keys.confirm_delete', { name: k.name }))) return;
  try { await del(`/api/token/${k.id}`); toast(t('keys.deleted')); await load(); } catch (e) { showError(null, e); }
}

function groupInfo() {
  const g = groups.find((x) => x.name === $('#k-group').value);
  $('#k-group-info').textContent = g ? t('keys.group_rule', { rule: ruleWords(g), description: g.description || '' }) : '';
}

async function fillModels(selected = []) {
  const list = $('#k-models-list');
  const models = await modelsFor($('#k-group').value);
  for (const m of selected) if (!models.includes(m)) models.push(m);
  list.replaceChildren(...models.map((m, i) => el('div', { class: 'check' },
    el('input', { type: 'checkbox', id: `km-${i}`, value: m, checked: selected.includes(m) }),
    el('label', { for: `km-${i}` }, m))));
  if (!models.length) list.append(el('p', { class: 'muted' }, t('keys.no_models')));
}

function syncSwitches() {
  $('#k-quota').disabled = $('#k-unlimited').checked;
  $('#k-models').disabled = !$('#k-lock').checked;
}

function toLocalInput(ts) {
  if (!ts || ts <= 0) return '';
  const d = new Date(ts * 1000);
  return new Date(d.getTime() - d.getTimezoneOffset() * 60000).toISOString().slice(0, 16);
}

// Requests and tokens per minute, calls at once; 0 = no limit (relay/money/limits.py).
const LIMITS = ['rpm_limit', 'tpm_limit', 'concurrency_limit'];

async function edit(k) {
  form.reset();
  $('#key-form-status').textContent = '';
  $('#k-ips-error').textContent = '';
  form.elements.id.value = k ? k.id : '';
  $('#k-name').value = k ? k.name : '';
  $('#k-group').value = k ? k.group : (groups[0] || {}).name || 'default';
  $('#k-unlimited').checked = k ? k.unlimited_quota : false;
  $('#k-quota').value = k ? String(k.remain_quota / 500000) : '0';
  form.dataset.quotaShown = $('#k-quota').value;
  $('#k-ips').value = k ? k.allow_ips : '';
  $('#k-lock').checked = k ? k.model_limits_enabled : false;
  $('#k-billing').value = k ? k.billing_mode : 'per_token';
  $('#k-expiry').value = k ? toLocalInput(k.expired_time) : '';
  for (const f of LIMITS) form.elements[f].value = k ? k[f] || 0 : 0;
  for (const p of PERIODS) form.elements[`budget_${p}`].value = k && k.budgets[p] ? String(k.budgets[p] / 500000) : '';
  $('#key-dialog-title').textContent = k ? t('keys.edit_title', { name: k.name }) : t('keys.form_title');
  groupInfo();
  syncSwitches();
  await fillModels(k && k.model_limits ? k.model_limits.split(',') : []);
  openDialog(dlg);
}

function validateIps() {
  const { bad } = checkAllowList($('#k-ips').value);
  $('#k-ips-error').textContent = bad ? t('keys.bad_ip', { entry: bad }) : '';
  $('#k-ips').setAttribute('aria-invalid', bad ? 'true' : 'false');
  return !bad;
}

form.addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const status = $('#key-form-status');
  if (!validateIps()) { $('#k-ips').focus(); return; }
  let expired = -1;
  if ($('#k-expiry').value) {
    expired = Math.floor(new Date($('#k-expiry').value).getTime() / 1000);
    if (!(expired > Date.now() / 1000)) { showError(status, new Error(t('keys.past_expiry'))); return; }
  }
  const lock = $('#k-lock').checked;
  const models = [...$('#k-models-list').querySelectorAll('input:checked')].map((i) => i.value);
  if (lock && !models.length) { showError(status, new Error(t('keys.pick_model'))); return; }
  let remain;
  const budgets = {};
  try {
    remain = toUnits($('#k-quota').value || '0');
    for (const p of PERIODS) budgets[p] = toUnits(form.elements[`budget_${p}`].value || '0');
  } catch (e) { showError(status, e); return; }
  const body = {
    name: $('#k-name').value.trim(), group: $('#k-group').value,
    unlimited_quota: $('#k-unlimited').checked, remain_quota: remain,
    allow_ips: checkAllowList($('#k-ips').value).items.join('\n'),
    model_limits_enabled: lock, model_limits: models,
    billing_mode: $('#k-billing').value, expired_time: expired,
    ...Object.fromEntries(LIMITS.map((f) => [f, Number(form.elements[f].value || 0)])),
    budgets,
  };
  const id = form.elements.id.value;
  // Setting the remaining quota of a key in use to what the form showed
  // would undo what it spent since: send it only when the person changed it.
  if (id && $('#k-quota').value === form.dataset.quotaShown) delete body.remain_quota;
  try {
    if (id) {
      await put('/api/token/', { id: Number(id), ...body });
      dlg.close();
      toast(t('common.saved'));
    } else {
      const created = await post('/api/token/', body);
      dlg.close();
      $('#key-created-value').textContent = created.key;
      openDialog($('#key-created'));
    }
    await load();
  } catch (err) { showError(status, err); }
});

$('#k-ips').addEventListener('input', validateIps);
$('#k-unlimited').addEventListener('change', syncSwitches);
$('#k-lock').addEventListener('change', syncSwitches);
$('#k-group').addEventListener('change', async () => { groupInfo(); await fillModels([]); });
$('#key-cancel').addEventListener('click', () => dlg.close());
$('#new-key').addEventListener('click', () => edit(null));
$('#key-search').addEventListener('input', () => { clearTimeout(window.__s); window.__s = setTimeout(() => load().catch((e) => showError(null, e)), 300); });
$('#key-created-copy').addEventListener('click', () => copyText($('#key-created-value').textContent));
$('#key-created-close').addEventListener('click', () => { $('#key-created-value').textContent = ''; $('#key-created').close(); });

live.on('token_balance', (m) => {
  const tr = document.querySelector(`#keys-table tr[data-id="${Number(m.token_id)}"]`);
  const k = keys.find((x) => x.id === m.token_id);
  if (!tr || !k) return;
  k.remain_quota = m.remain_quota;
  const cell = tr.querySelector('.remain');
  cell.querySelector('.remain-text').textContent = remainingText(k);
  cell.dataset.quota = String(m.remain_quota);
});

(async () => {
  groups = await get('/api/group/');
  $('#k-group').replaceChildren(...groups.map((g) => el('option', { value: g.name }, `${g.name} (×${g.rate})`)));
  try { const st = await get('/api/status'); if (st.base_addresses.length) defaultBase = st.base_addresses[0].url; } catch (e) { /* keep this origin */ }
  await load();
})().catch((e) => showError(null, e));
