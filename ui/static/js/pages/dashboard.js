import uPlot from '../../vendor/uplot/uPlot.esm.js';
import { locale, t } from '../i18n.js';
import { get } from '../api.js';
import * as live from '../live.js';
import { boot, setBalance } from '../common.js';
import { budgetBars } from '../budget_view.js';
import { $, el, credits, num, when, showError, UNITS_PER_CREDIT } from '../ui.js';

boot();

const COLORS = ['#2563eb', '#dc2626', '#16a34a', '#d97706', '#7c3aed', '#0891b2', '#db2777', '#4b5563'];
// uPlot writes dates in English by default: the axis and the legend use the
// console's language instead.
const tickDay = new Intl.DateTimeFormat(locale, { month: 'short', day: 'numeric' });
const legendDay = new Intl.DateTimeFormat(locale, { dateStyle: 'medium' });
const valueFormat = new Intl.NumberFormat(locale, { maximumSignificantDigits: 4 });
let daily = null;
let plot = null;

function drawChart() {
  const box = $('#chart');
  if (plot) { plot.destroy(); plot = null; }
  if (!daily) return;
  const metric = $('#chart-metric').value;
  const scale = metric === 'quota' ? 1 / UNITS_PER_CREDIT : 1;
  const models = daily.models;
  $('#chart-empty').hidden = models.length > 0;
  const total = metric === 'quota' ? daily.total_quota : daily.total_requests;
  const data = [daily.timestamps, total.map((v) => v * scale)];
  const fmt = (v) => (v == null ? '--' : valueFormat.format(v));
  const value = (u, v) => fmt(v);
  const day = (u, ts) => (ts == null ? '--' : legendDay.format(new Date(ts * 1000)));
  const series = [{ label: t('dash.date'), value: day },
    { label: t('dash.total'), stroke: '#111827', width: 2, value }];
  models.forEach((m, i) => {
    data.push(daily[metric][m].map((v) => v * scale));
    series.push({ label: m, stroke: COLORS[i % COLORS.length], width: 1.5, value });
  });
  const width = Math.max(280, box.clientWidth || 600);
  plot = new uPlot({
    width, height: 260, series,
    axes: [{ values: (u, splits) => splits.map((ts) => tickDay.format(new Date(ts * 1000))) },
      { label: metric === 'quota' ? t('dash.spend_axis') : t('dash.requests'),
        size: 70, values: (u, vals) => vals.map(fmt) }],
    scales: { x: { time: true } },
  }, data, box);
  box.dataset.points = String(daily.timestamps.length);
  box.dataset.models = models.join(',');
}

async function loadChart() {
  const tz = -new Date().getTimezoneOffset();
  daily = await get(`/api/log/self/daily?days=30&tz_offset=${tz}`);
  $('#requests-30').textContent = num(daily.total_requests.reduce((a, b) => a + b, 0));
  drawChart();
}

async function pingOnce(url) {
  const t0 = performance.now();
  const r = await fetch(`${url}/api/ping`, { cache: 'no-store', mode: 'cors', credentials: 'omit' });
  if (!r.ok) throw new Error(String(r.status));
  return performance.now() - t0;
}

async function ping(url) {
  // The first call also pays for DNS, TCP and TLS; take the best of three.
  let best = Infinity;
  for (let i = 0; i < 3; i++) {
    try { best = Math.min(best, await pingOnce(url)); } catch (e) { /* unreachable this time */ }
  }
  return best;
}

async function loadBases() {
  const status = await get('/api/status');
  const tbody = $('#bases tbody');
  tbody.replaceChildren();
  const rows = status.base_addresses.map((b) => {
    const lat = el('td', { class: 'latency' }, t('dash.measuring'));
    const mark = el('td', { class: 'fastest' });
    const tr = el('tr', { dataset: { url: b.url } }, el('td', {}, el('code', {}, b.url)),
      el('td', {}, b.region || '—'), lat, mark);
    tbody.append(tr);
    return { b, lat, mark, tr };
  });
  const results = await Promise.all(rows.map((r) => ping(r.b.url)));
  let bestIdx = -1;
  results.forEach((ms, i) => {
    const r = rows[i];
    if (Number.isFinite(ms)) {
      r.lat.textContent = `${Math.round(ms)} ms`;
      r.tr.dataset.ms = String(Math.round(ms));
      if (bestIdx < 0 || ms < results[bestIdx]) bestIdx = i;
    } else {
      r.lat.textContent = t('dash.unreachable');
      r.tr.classList.add('unreachable');
    }
  });
  if (bestIdx >= 0) {
    rows[bestIdx].mark.append(el('span', { class: 'badge ok' }, t('dash.fastest')));
    rows[bestIdx].tr.classList.add('best');
  }
}

async function loadAnnouncements() {
  const list = $('#announcement-list');
  try {
    const data = await get('/api/announcement/');
    const items = Array.isArray(data) ? data : (data.items || []);
    list.replaceChildren(...items.slice(0, 10).map((a) => el('li', {},
      el('strong', {}, a.title), ' — ', a.content, ' ', el('span', { class: 'muted' }, when(a.created_at || a.created_time)))));
    if (!items.length) list.append(el('li', { class: 'muted' }, t('common.empty')));
  } catch (e) {
    list.append(el('li', { class: 'muted' }, t('common.empty')));
  }
}

live.on('announcement', (a) => {
  $('#announcement-list').prepend(el('li', {}, el('strong', {}, a.title), ' — ', a.content));
});
live.on('usage', () => { clearTimeout(window.__chartTimer); window.__chartTimer = setTimeout(() => loadChart().catch(() => {}), 1500); });

$('#chart-metric').addEventListener('change', drawChart);
$('#ping-again').addEventListener('click', loadBases);
window.addEventListener('resize', () => { if (plot) plot.setSize({ width: Math.max(280, $('#chart').clientWidth), height: 260 }); });

const report = (e) => showError(null, e);
// The account's budgets by period: a bar each, read again after new usage.
function showBudgets(me) {
  const bars = budgetBars(me.budget_use);
  $('#dash-budgets').hidden = !bars.length;
  $('#budget-bars').replaceChildren(...bars);
}
live.on('usage', () => { clearTimeout(window.__budgetTimer); window.__budgetTimer = setTimeout(() => get('/api/user/self').then(showBudgets).catch(() => {}), 1500); });
get('/api/user/self').then((me) => { setBalance(me.quota, me.used_quota); showBudgets(me); }).catch(report);
loadChart().catch(report);
loadBases().catch(report);
loadAnnouncements().catch(report);
