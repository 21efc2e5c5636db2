import { t } from '../i18n.js';
import { put } from '../api.js';
import { boot } from '../common.js';
import { $, showError, showOk, formData } from '../ui.js';

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
    const next = new URLSearchParams(location.search).get('next') || '';
    // Only a path on this server: never an open redirect.
    if ($('#must-change')) setTimeout(() => { location.href = next.startsWith('/console') ? next : '/console/'; }, 800);
  } catch (err) {
    showError(status, err);
  } finally {
    $('#password-save').disabled = false;
  }
});
document.body.dataset.ready = '1';
