import { t } from '../i18n.js';
import { get, post } from '../api.js';
import { boot } from '../common.js';
import { $, el, showError, showOk, formData, when } from '../ui.js';

boot();

async function load() {
  try {
    const data = await get('/api/announcement/');
    const items = Array.isArray(data) ? data : (data.items || []);
    $('#ann-list').replaceChildren(...items.map((a) => el('li', {}, el('strong', {}, a.title), ` (${t(`notify.ev_${a.kind}`)}) — `, a.content, ' ',
      el('span', { class: 'muted' }, when(a.created_at || a.created_time)))));
  } catch (e) { $('#ann-list').replaceChildren(el('li', { class: 'muted' }, e.message)); }
}

$('#ann-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const status = $('#ann-status');
  const body = formData(ev.target);
  if (!body.title.trim()) { showError(status, new Error(t('admin.title_needed'))); return; }
  try { await post('/api/announcement/', body); showOk(status, t('admin.published')); ev.target.reset(); await load(); } catch (e) { showError(status, e); }
});
load().catch((e) => showError(null, e));
