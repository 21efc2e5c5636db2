import { locale, t } from '../i18n.js';
import { get } from '../api.js';
import * as live from '../live.js';
import { boot } from '../common.js';
import { $, el, credits, num, when, fillRows, showError } from '../ui.js';

boot();
// The log is paged by time (handlers/api_log.py): `older` and `newer` are
// the cursors of the pages beside the one shown; null at either end.
let at = {};
let pageNo = 1;
let last = null;
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

const hourFormat = new Intl.DateTimeFormat(locale, { dateStyle: 'short', timeStyle: 'short' });
function hour(ts) {
  return hourFormat.format(new Date(ts * 1000));
}

async function load(move = {}) {
  const q = query();
  if (q.has('status') && !/^\d+$/.test(q.get('status'))) { showError(null, new Error(t('usage.bad_status'))); return; }
  $('#usage-csv').href = `/api/log/self/export?${q}`;
  q.set('size', String(SIZE));
  for (const [k, v] of Object.entries(move)) q.set(k, v);
  try {
    const data = await get(`/api/log/self?${q}`);
    if (move.newer && !data.items.length) { pageNo = 1; return load(); }
    fillRows($('#usage-table tbody'), data.items.map(row), 7);
    at = { older: data.older, newer: data.newer };
    last = data;
    $('#t-requests').textContent = num(data.totals.requests);
    $('#t-quota').textContent = credits(data.totals.quota);
    $('#t-unpaid').textContent = credits(data.totals.unpaid || 0);
    $('#t-tokens').textContent = num(data.totals.prompt_tokens + data.totals.completion_tokens);
    // Totals come from hourly sums: a bound inside an hour counts the whole hour.
    $('#t-range').textContent = data.total_exact ? ''
      : t('usage.totals_hours', { from: data.totals_since ? hour(data.totals_since) : '…',
        to: data.totals_until ? hour(data.totals_until) : '…' });
    $('#page-info').textContent = t('usage.page', { page: pageNo, records: num(data.total) });
    $('#prev').disabled = !data.newer;
    $('#next').disabled = !data.older;
    const big = data.export_max && data.total > data.export_max;
    $('#usage-csv').classList.toggle('disabled', Boolean(big));
    $('#usage-csv').title = big ? t('usage.export_too_big', { max: num(data.export_max) }) : '';
  } catch (e) { showError(null, e); }
}

$('#usage-filter').addEventListener('submit', (ev) => { ev.preventDefault(); pageNo = 1; load(); });
$('#prev').addEventListener('click', () => { if (at.newer) { pageNo = Math.max(1, pageNo - 1); load({ newer: at.newer }); } });
$('#next').addEventListener('click', () => { if (at.older) { pageNo += 1; load({ older: at.older }); } });
$('#usage-csv').addEventListener('click', (ev) => {
  if (last && last.export_max && last.total > last.export_max) {
    ev.preventDefault();
    showError(null, new Error(t('usage.export_too_big', { max: num(last.export_max) })));
  }
});
live.on('usage', () => { if (pageNo === 1) { clearTimeout(window.__u); window.__u = setTimeout(load, 800); } });

(async () => {
  const data = await get('/api/token/?size=200');
  for (const k of data.items) {
    keyNames[k.id] = k.name;
    $('#f-key').append(el('option', { value: String(k.id) }, k.name));
  }
  await load();
})().catch((e) => showError(null, e));
