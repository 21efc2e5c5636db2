import { t } from '../i18n.js';
import { post } from '../api.js';
import { $, showError, formData } from '../ui.js';

const form = $('#login-form');
form.addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const status = $('#login-status');
  const body = formData(form);
  if (!body.username.trim() || !body.password) { showError(status, new Error(t('login.missing'))); return; }
  $('#login-submit').disabled = true;
  try {
    await post('/api/user/login', body);
    const next = new URLSearchParams(location.search).get('next') || '';
    // Only a path on this server: never an open redirect.
    location.href = next.startsWith('/console') ? next : '/console/';
  } catch (err) {
    if (err.status === 429) err.message = t('login.too_many', { seconds: (err.data && err.data.retry_after) || 1 });
    showError(status, err);
  } finally {
    $('#login-submit').disabled = false;
  }
});
