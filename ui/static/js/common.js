// Runs on every signed-in page: the menu, sign-out, the live connection and
// the balance in the header.
import { t } from './i18n.js';
import { post } from './api.js';
import * as live from './live.js';
import { $, el, credits } from './ui.js';

export const user = {
  id: Number(document.body.dataset.userId || 0),
  admin: document.body.dataset.admin === '1',
};

function setBalance(quota, used) {
  const b = $('#balance');
  if (b && quota !== undefined) { b.textContent = credits(quota); b.dataset.quota = String(quota); }
  const u = $('#used-quota');
  if (u && used !== undefined) { u.textContent = credits(used); u.dataset.quota = String(used); }
  const d = $('#dash-balance');
  if (d && quota !== undefined) { d.textContent = credits(quota); d.dataset.quota = String(quota); }
}

function showAnnouncement(a) {
  const box = $('#announcements');
  if (!box) return;
  const item = el('div', { class: `announcement ${a.kind === 'marketing' ? 'marketing' : ''}`, role: 'note' },
    el('strong', {}, a.title), ' ', el('span', {}, a.content),
    el('button', { class: 'link', 'aria-label': t('common.dismiss'), onclick: () => item.remove() }, '×'));
  box.prepend(item);
}

export function boot() {
  const toggle = $('#nav-toggle');
  if (toggle) {
    toggle.addEventListener('click', () => {
      const open = toggle.getAttribute('aria-expanded') !== 'true';
      toggle.setAttribute('aria-expanded', String(open));
      $('#nav').classList.toggle('open', open);
    });
  }
  const logout = $('#logout');
  if (logout) {
    logout.addEventListener('click', async () => {
      try { await post('/api/user/logout'); } finally { location.href = '/console/login'; }
    });
  }
  if (!user.id) return;
  live.onState((s) => {
    const dot = $('#live-dot');
    if (dot) { dot.className = `live-dot ${s}`; dot.title = t(`live.${s}`); dot.dataset.state = s; }
  });
  live.on('hello', (m) => setBalance(m.quota, m.used_quota));
  live.on('balance', (m) => setBalance(m.quota, m.used_quota));
  live.on('announcement', showAnnouncement);
  live.connect();
}

export { setBalance };
