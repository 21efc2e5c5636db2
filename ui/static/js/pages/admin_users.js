import { t } from '../i18n.js';
import { get, post, put } from '../api.js';
import { boot, user as me } from '../common.js';
import { $, el, credits, toUnits, fillRows, showError, showOk, openDialog, toast, copyText, stateBadge } from '../ui.js';

boot();
const dlg = $('#adjust-dialog');

function row(u) {
  return el('tr', { dataset: { id: u.id, name: u.username } },
    el('td', {}, String(u.id)), el('td', {}, u.username), el('td', {}, u.email), el('td', {}, u.group),
    el('td', { class: 'quota' }, credits(u.quota)), el('td', {}, credits(u.used_quota)),
    el('td', {}, stateBadge(u.status === 1)),
    el('td', { class: 'actions' },
      el('button', { class: 'small adjust', onclick: () => adjust(u) }, t('admin.adjust')),
      el('button', { class: 'small secondary limits', onclick: () => limits(u) }, t('keys.limits')),
      el('button', { class: 'small secondary groups', onclick: () => usable(u) }, t('admin.user_groups')),
      el('button', { class: 'small secondary', onclick: () => manage(u, u.status === 1 ? 'disable' : 'enable') },
        u.status === 1 ? t('keys.disable') : t('keys.enable')),
      // One's own password is changed on the Account page, with the current one.
      u.id !== me.id && el('button', { class: 'small secondary reset', onclick: () => resetPassword(u) }, t('admin.reset_password'))));
}

async function resetPassword(u) {
  if (!confirm(t('admin.reset_confirm', { name: u.username }))) return;
  try {
    const r = await post(`/api/user/${u.id}/password`);
    $('#reset-title').textContent = t('admin.reset_done', { name: u.username });
    $('#reset-value').textContent = r.password;
    openDialog($('#reset-dialog'));
  } catch (e) { showError(null, e); }
}
$('#reset-copy').addEventListener('click', () => copyText($('#reset-value').textContent));
$('#reset-close').addEventListener('click', () => { $('#reset-value').textContent = ''; $('#reset-dialog').close(); });

async function load() {
  const kw = $('#u-search').value.trim();
  const data = await get(`/api/user/?size=100${kw ? `&keyword=${encodeURIComponent(kw)}` : ''}`);
  fillRows($('#users-table tbody'), data.items.map(row), 8);
}

function adjust(u) {
  const f = $('#adjust-form');
  f.reset();
  f.elements.id.value = u.id;
  $('#adjust-title').textContent = t('admin.adjust_for', { name: u.username });
  $('#adjust-status').textContent = '';
  openDialog(dlg);
}

async function manage(u, action) {
  try { await post('/api/user/manage', { id: u.id, action }); toast(t('common.saved')); await load(); } catch (e) { showError(null, e); }
}

$('#adjust-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const f = ev.target;
  const status = $('#adjust-status');
  const raw = Number(f.elements.amount.value);
  if (!Number.isFinite(raw) || raw === 0) { showError(status, new Error(t('admin.amount_nonzero'))); return; }
  const reason = f.elements.reason.value.trim();
  if (!reason) { showError(status, new Error(t('admin.reason_needed'))); return; }
  const amount = Math.sign(raw) * toUnits(String(Math.abs(raw)));
  try {
    await post(`/api/user/${f.elements.id.value}/quota`, { amount, reason });
    dlg.close();
    showOk(null, t('admin.adjusted'));
    await load();
  } catch (e) { showError(status, e); }
});
dlg.querySelector('.close').addEventListener('click', () => dlg.close());

// The account's own rate limits (relay/money/limits.py), over all its keys.
const LIMITS = ['rpm_limit', 'tpm_limit', 'concurrency_limit'];
const ldlg = $('#limits-dialog');
function limits(u) {
  const f = $('#limits-form');
  f.elements.id.value = u.id;
  for (const k of LIMITS) f.elements[k].value = u[k] || 0;
  $('#limits-status').textContent = '';
  openDialog(ldlg);
}
$('#limits-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const f = ev.target;
  const body = { id: Number(f.elements.id.value) };
  for (const k of LIMITS) body[k] = Number(f.elements[k].value || 0);
  try { await put('/api/user/', body); ldlg.close(); toast(t('common.saved')); await load(); } catch (e) { showError($('#limits-status'), e); }
});
ldlg.querySelector('.close').addEventListener('click', () => ldlg.close());
// The groups a user may put keys in besides their own (null: their group's list).
const gdlg = $('#groups-dialog');
function usable(u) {
  const f = $('#groups-form');
  f.elements.id.value = u.id;
  const inherit = u.usable_groups === null || u.usable_groups === undefined;
  f.elements.inherit.checked = inherit;
  f.elements.usable_groups.value = inherit ? '' : u.usable_groups.join(', ');
  f.elements.usable_groups.disabled = inherit;
  $('#groups-title').textContent = t('admin.user_groups_for', { name: u.username });
  $('#groups-status').textContent = '';
  openDialog(gdlg);
}
$('#ug-inherit').addEventListener('change', (ev) => { $('#ug-list').disabled = ev.target.checked; });
$('#groups-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const f = ev.target;
  const body = { id: Number(f.elements.id.value),
    usable_groups: f.elements.inherit.checked ? null : f.elements.usable_groups.value };
  try { await put('/api/user/', body); gdlg.close(); toast(t('common.saved')); await load(); } catch (e) { showError($('#groups-status'), e); }
});
gdlg.querySelector('.close').addEventListener('click', () => gdlg.close());
$('#u-search').addEventListener('input', () => { clearTimeout(window.__s); window.__s = setTimeout(() => load().catch((e) => showError(null, e)), 300); });
load().catch((e) => showError(null, e));
