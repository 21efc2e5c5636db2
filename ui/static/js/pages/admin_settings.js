import { t } from '../i18n.js';
import { get, put } from '../api.js';
import { boot } from '../common.js';
import { $, $$, el, showError, showOk } from '../ui.js';

boot();

function baseRow(b = { url: '', region: '' }) {
  const i = $$('.base-row').length;
  const r = el('div', { class: 'row base-row' },
    el('label', { for: `b-url-${i}`, class: 'sr-only' }, t('dash.base')),
    el('input', { id: `b-url-${i}`, class: 'b-url', type: 'url', value: b.url, placeholder: 'https://api.example.com' }),
    el('label', { for: `b-region-${i}`, class: 'sr-only' }, t('dash.region')),
    el('input', { id: `b-region-${i}`, class: 'b-region', value: b.region, placeholder: t('dash.region') }),
    el('button', { type: 'button', class: 'small secondary', onclick: () => r.remove() }, t('common.delete')));
  $('#bases-editor').append(r);
}

$('#add-base').addEventListener('click', () => baseRow());
$('#settings-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const f = ev.target;
  const status = $('#settings-status');
  const bases = $$('.base-row').map((r) => ({ url: r.querySelector('.b-url').value.trim(), region: r.querySelector('.b-region').value.trim() })).filter((b) => b.url);
  try {
    await put('/api/console/options', {
      site_name: f.elements.site_name.value, registration_enabled: f.elements.registration_enabled.checked,
      purchase_rate: f.elements.purchase_rate.value, base_addresses: bases,
    });
    showOk(status, t('common.saved'));
  } catch (e) { showError(status, e); }
});

(async () => {
  const opts = await get('/api/option/');
  let bases = opts.base_addresses || [];
  if (typeof bases === 'string') { try { bases = JSON.parse(bases); } catch (e) { bases = []; } }
  for (const b of bases) baseRow(typeof b === 'string' ? { url: b, region: '' } : b);
})().catch((e) => showError(null, e));
