import { t } from '../i18n.js';
import { post, get } from '../api.js';
import { boot, setBalance } from '../common.js';
import { $, showError, showOk, credits } from '../ui.js';

boot();
const form = $('#redeem-form');
form.addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const status = $('#redeem-status');
  const code = $('#redeem-code').value.trim();
  if (!code) { showError(status, new Error(t('topup.empty'))); return; }
  try {
    const added = await post('/api/user/topup', { key: code });
    showOk(status, t('topup.done', { amount: credits(added) }));
    $('#redeem-code').value = '';
    const me = await get('/api/user/self');
    setBalance(me.quota, me.used_quota);
  } catch (err) { showError(status, err); }
});
