import { t } from '../i18n.js';
import { del, get, post, put } from '../api.js';
import { boot } from '../common.js';
import { $, el, fillRows, formData, showError, showOk, toast, toUnits, when } from '../ui.js';
import { PERIODS, budgetBars } from '../budget_view.js';

boot();
const form = $('#password-form');
form.addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const status = $('#password-status');
  const body = formData(form);
  if (!body.original_password) { showError(status, new Error(t('account.need_current'))); return; }
  if (body.password !== body.again) { showError(status, new Error(t('account.mismatch'))); return; }
  $('#password-save').disabled = true;
  try {
    // The server checks the rules (length, strength) and says what is wrong.
    await put('/api/user/self', { original_password: body.original_password, password: body.password });
    form.reset();
    showOk(status, t('account.changed'));
    loadSessions().catch(() => {});
    const next = new URLSearchParams(location.search).get('next') || '';
    // Only a path on this server: never an open redirect.
    if ($('#must-change')) setTimeout(() => { location.href = next.startsWith('/console') ? next : '/console/'; }, 800);
  } catch (err) {
    showError(status, err);
  } finally {
    $('#password-save').disabled = false;
  }
});

// The e-mail address: a new one is the account's only once the code mailed to it comes back.
function showEmail(me) {
  $('#email-current').textContent = me.email || t('account.email_none');
  const pending = $('#email-code-form');
  pending.hidden = !me.pending_email;
  if (me.pending_email) $('#email-pending').textContent = t('account.email_pending', { email: me.pending_email });
}

$('#email-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const status = $('#email-status');
  $('#email-save').disabled = true;
  try {
    await put('/api/user/self', { email: $('#email-new').value.trim() });
    showEmail(await get('/api/user/self'));
    $('#email-new').value = '';
    showOk(status, $('#email-code-form').hidden ? t('common.saved') : t('account.email_sent'));
  } catch (err) {
    showError(status, err);
  } finally {
    $('#email-save').disabled = false;
  }
});

$('#email-code-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const status = $('#email-status');
  try {
    showEmail(await post('/api/user/self/email', { code: $('#email-code').value.trim() }));
    $('#email-code').value = '';
    showOk(status, t('account.email_confirmed'));
  } catch (err) {
    showError(status, err);
    showEmail(await get('/api/user/self'));
  }
});

// Signed-in sessions: each browser, with a way to sign one or all of them out.
async function loadSessions() {
  const rows = (await get('/api/user/sessions')).map((s) => el('tr', { dataset: { id: s.id } },
    el('td', {}, when(s.created)),
    el('td', {}, when(s.expires)),
    el('td', {}, s.ip || '–'),
    el('td', { class: 'agent' }, s.agent || '–'),
    el('td', {}, s.current ? el('span', { class: 'badge' }, t('account.this_one'))
      : el('button', { class: 'secondary end', type: 'button', onclick: () => endSession(s.id) },
        t('account.end')))));
  fillRows($('#sessions-table tbody'), rows, 5);
}

async function endSession(id) {
  try {
    await del(`/api/user/sessions/${encodeURIComponent(id)}`);
    toast(t('account.ended'));
  } catch (err) {
    showError(null, err);
  }
  await loadSessions();
}

$('#sign-out-everywhere').addEventListener('click', async () => {
  if (!window.confirm(t('account.everywhere_confirm'))) return;
  try {
    await post('/api/user/logout', { everywhere: true });
  } finally {
    location.href = '/console/login';
  }
});

// The account's budgets by period, in its time zone (relay/money/budgets.py).
const budgetForm = $('#budget-form');
function showBudgets(me) {
  budgetForm.elements.timezone.value = me.timezone || 'UTC';
  for (const p of PERIODS) budgetForm.elements[p].value = me.budgets[p] ? String(me.budgets[p] / 500000) : '';
  $('#b-bars').replaceChildren(...budgetBars(me.budget_use));
}
budgetForm.addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const status = $('#budget-status');
  const budgets = {};
  try {
    for (const p of PERIODS) budgets[p] = toUnits(budgetForm.elements[p].value || '0');
    showBudgets(await put('/api/user/self', { timezone: budgetForm.elements.timezone.value.trim(), budgets }));
    showOk(status, t('common.saved'));
  } catch (err) { showError(status, err); }
});
try {
  const zones = Intl.supportedValuesOf ? Intl.supportedValuesOf('timeZone') : [];
  $('#b-zones').replaceChildren(...['UTC', ...zones].map((z) => el('option', { value: z })));
} catch (e) { /* typing a name works without the list */ }

Promise.all([loadSessions(), get('/api/user/self').then((me) => { showEmail(me); showBudgets(me); })])
  .catch((err) => showError(null, err)).finally(() => { document.body.dataset.ready = '1'; });
