// The language switch in the header: the choice is kept in the `lang`
// cookie (this browser) and, when signed in, as the account's language,
// which its e-mails and notifications are written in.
import { put } from './api.js';

const box = document.getElementById('lang-switch');
if (box) {
  box.addEventListener('change', async () => {
    const lang = box.value;
    document.cookie = `lang=${encodeURIComponent(lang)}; path=/; max-age=${400 * 86400}; SameSite=Lax`;
    if (document.body.dataset.userId) {
      try { await put('/api/user/self', { language: lang }); } catch (e) { /* the cookie still applies here */ }
    }
    location.reload();
  });
}
