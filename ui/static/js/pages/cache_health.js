// The usage page's prompt-cache health: per key (and, for administrators,
// per channel) over the page's filter (/api/log/self/cache, /api/log/cache).
import { get } from '../api.js';
import { user } from '../common.js';
import { $, el, credits, num, fillRows, showError } from '../ui.js';

function filter() {
  const f = $('#usage-filter');
  const q = new URLSearchParams();
  for (const [name, arg] of [['start', 'start'], ['end', 'end']]) {
    const v = f.elements[name].value;
    if (v) q.set(arg, String(new Date(v).getTime() / 1000));
  }
  for (const n of ['token_id', 'model']) {
    const v = f.elements[n].value.trim();
    if (v) q.set(n, v);
  }
  return q;
}

function row(r) {
  return el('tr', { dataset: { id: String(r.token_id ?? r.channel_id) } },
    el('td', { class: 'name' }, r.name || String(r.token_id ?? r.channel_id)),
    el('td', { class: 'share' }, `${(r.share * 100).toFixed(1)}%`),
    el('td', {}, num(r.prompt_tokens)),
    el('td', {}, num(r.cache_written)),
    el('td', { class: 'unread' }, num(r.cache_unread)),
    el('td', {}, credits(r.cache_saved)));
}

async function load() {
  const q = filter();
  try {
    const keys = await get(`/api/log/self/cache?${q}`);
    fillRows($('#cache-keys tbody'), keys.items.map(row), 6);
    if (user.admin) {
      q.set('by', 'channel');
      const chans = await get(`/api/log/cache?${q}`);
      $('#cache-channels').closest('.admin-only').hidden = false;
      fillRows($('#cache-channels tbody'), chans.items.map(row), 6);
    }
  } catch (e) { showError(null, e); }
}

$('#usage-filter').addEventListener('submit', () => { load(); });
load();
