import { t } from '../i18n.js';
import { post } from '../api.js';
import { $, showError, showOk, formData } from '../ui.js';

const form = $('#register-form');
if (form) {
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const status = $('#register-status');
    const body = formData(form);
    if (body.password.length < 8) { showError(status, new Error(t('register.short'))); return; }
    try {
      await post('/api/user/register', body);
      showOk(status, t('register.done'));
      setTimeout(() => { location.href = '/console/login'; }, 1200);
    } catch (err) { showError(status, err); }
  });
}
