import { t } from '../i18n.js';
import { get } from '../api.js';
import * as live from '../live.js';
import { boot } from '../common.js';
import { $, el, credits, num, when, fillRows, showError } from '../ui.js';

boot();
let page = 1;
const SIZE = 50;
const keyNames = {};

function query() {
  const f = $('#usage-filter');
  const q = new URLSearchParams();
  const start = f.elements.start.value;
  const end = f.elements.end.value;
  if (start) q.set('start', String(new Date(start).getTime() / 1000));
  if (end) q.set('end', String(new Date(end).getTime() / 1000));
  for (const n of ['token_id', 'model', 'status']) {
    const v = f.elements[n].value.trim();
    if (v) q.set(n, v);
  }
  return q;
}

// Parts of a call's usage beyond text in and out (relay/money/pricing.py bills each).
const PARTS = ['cached_tokens', 'cache_write_5m_tokens', 'cache_write_1h_tokens', 'reasoning_tokens',
  'audio_input_tokens', 'audio_output_tokens', 'image_input_tokens', 'image_output_tokens', 'units'];

function tokens(r) {
  const inOut = `${num(r.prompt_tokens)} / ${num(r.completion_tokens)}`;
  const parts = PARTS.filter((f) => r[f] > 0).map((f) => t(`usage.part.${f}`, { n: num(r[f]) }));
  return parts.length ? [inOut, el('small', { class: 'parts' }, parts.join(' · '))] : inOut;
}

function row(r) {
  return el('tr', { dataset: { id: r.request_id } },
    el('td', {}, when(r.created_at)),
    el('td', { class: 'name' }, r.token_name || keyNames[r.token_id] || String(r.token_id ?? '')),
    el('td', { class: 'name' }, r.model || ''),
    el('td', {}, tokens(r)),
    el('td', {}, r.unpaid > 0
      ? [credits(r.quota), ' ', el('span', { class: 'badge s2', title: t('usage.unpaid_hint', { cost: credits(r.cost) }) },
          t('usage.unpaid_badge', { unpaid: credits(r.unpaid) }))]
      : credits(r.quota),
      // A group's tiered rate (relay/money/rates.py): the one this call got.
      r.rate_rule && r.rate_rule !== 'flat' ? el('small', { class: 'parts', title: r.rate_rule }, t('usage.rate', { rate: r.rate })) : ''),
    el('td', {}, el('span', { class: `badge ${r.status >= 400 ? 's2' : 's1'}` }, String(r.status ?? ''))),
    el('td', {}, r.duration_ms ? `${num(r.duration_ms)} ms` : ''));
}

async function load() {
  const q = query();
  if (q.has('status') && !/^\d+$/.test(q.get('status'))) { showError(null, new Error(t('usage.bad_status'))); return; }
  $('#usage-csv').href = `/api/log/self/export?${q}`;
  q.set('p', String(page)); q.set('size', String(SIZE));
  try {
    const data = await get(`/api/log/self?${q}`);
    fillRows($('#usage-table tbody'), data.items.map(row), 7);
    $('#t-requests').textContent = num(data.totals.requests);
    $('#t-quota').textContent = credits(data.totals.quota);
    $('#t-unpaid').textContent = credits(data.totals.unpaid || 0);
    $('#t-tokens').textContent = num(data.totals.prompt_tokens + data.totals.completion_tokens);
    const pages = Math.max(1, Math.ceil(data.total / SIZE));
    $('#page-info').textContent = t('common.page', { page, pages });
    $('#prev').disabled = page <= 1;
    $('#next').disabled = page >= pages;
  } catch (e) { showError(null, e); }
}

$('#usage-filter').addEventListener('submit', (ev) => { ev.preventDefault(); page = 1; load(); });
$('#prev').addEventListener('click', () => { page -= 1; load(); });
$('#next').addEventListener('click', () => { page += 1; load(); });
live.on('usage', () => { if (page === 1) { clearTimeout(window.__u); window.__u = setTimeout(load, 800); } });

(async () => {
  const data = await get('/api/token/?size=200');
  for (const k of data.items) {
    keyNames[k.id] = k.name;
    $('#f-key').append(el('option', { value: String(k.id) }, k.name));
  }
  await load();
})().catch((e) => showError(null, e));
