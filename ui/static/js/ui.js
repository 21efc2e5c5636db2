// Small DOM helpers.  Text always goes in as text nodes, never as HTML.
import { locale, t } from './i18n.js';

export const UNITS_PER_CREDIT = 500000;

/** el('a', {href: x, class: 'b', onclick: fn}, 'text', child) */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') node.addEventListener(k.slice(2), v);
    else if (k === 'class') node.className = v;
    else if (k === 'dataset') Object.assign(node.dataset, v);
    else if (k in node && typeof v !== 'string') node[k] = v;
    else node.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

export const $ = (sel, root = document) => root.querySelector(sel);
export const $$ = (sel, root = document) => [...root.querySelectorAll(sel)];

// Numbers and dates in the console's language (not the browser's), so that
// a page reads the same way throughout.
const creditFormat = new Intl.NumberFormat(locale, { minimumFractionDigits: 2, maximumFractionDigits: 4 });
const countFormat = new Intl.NumberFormat(locale);
const dateFormat = new Intl.DateTimeFormat(locale, { dateStyle: 'medium', timeStyle: 'medium' });

export function credits(units) {
  return creditFormat.format(Number(units || 0) / UNITS_PER_CREDIT);
}

/** A count (requests, tokens) with the locale's grouping. */
export function num(n) {
  return countFormat.format(Number(n || 0));
}

export function toUnits(creditsText) {
  const n = Number(String(creditsText).trim());
  if (!Number.isFinite(n) || n < 0) throw new Error(t('err.amount'));
  return Math.round(n * UNITS_PER_CREDIT);
}

export function when(ts) {
  if (!ts || ts <= 0) return t('common.never');
  return dateFormat.format(new Date(ts * 1000));
}

/** An on/off state as a badge: one line however narrow its cell ("已启用"). */
export function stateBadge(on) {
  return el('span', { class: `badge ${on ? 's1' : 's2'}` }, on ? t('keys.enabled') : t('keys.disabled'));
}

let toastTimer = null;
export function toast(message, kind = 'ok') {
  const box = document.getElementById('toast');
  if (!box) return;
  box.textContent = message;
  box.className = `toast show ${kind}`;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { box.className = 'toast'; }, 5000);
}

/** Show an error on a form's status line (and as a toast). */
export function showError(target, err) {
  const msg = err && err.message ? err.message : String(err);
  if (target) { target.textContent = msg; target.className = 'form-status error'; }
  toast(msg, 'error');
}

export function showOk(target, msg) {
  if (target) { target.textContent = msg; target.className = 'form-status ok'; }
  toast(msg, 'ok');
}

/** Empty a table body and fill it, with a 'nothing here' row when empty.
 *  Each cell gets its column's heading as data-label, which a narrow
 *  screen shows beside the value when the rows become cards (.table.cards). */
export function fillRows(tbody, rows, cols) {
  tbody.replaceChildren();
  if (!rows.length) {
    tbody.append(el('tr', {}, el('td', { colspan: cols, class: 'empty' }, t('common.empty'))));
    return;
  }
  const heads = [...(tbody.closest('table')?.querySelectorAll('thead th') || [])].map((th) => th.textContent.trim());
  for (const r of rows) {
    [...r.cells].forEach((td, i) => { if (heads[i] && !td.dataset.label) td.dataset.label = heads[i]; });
    tbody.append(r);
  }
}

export async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
  } catch (e) {
    // Insecure origins (plain http on a LAN) have no clipboard API.
    const ta = el('textarea', { class: 'offscreen' }, text);
    document.body.append(ta); ta.select(); document.execCommand('copy'); ta.remove();
  }
  toast(t('common.copied'));
}

/** A form's named fields as an object (checkboxes as booleans). */
export function formData(form) {
  const out = {};
  for (const f of form.elements) {
    if (!f.name) continue;
    out[f.name] = f.type === 'checkbox' ? f.checked : f.value;
  }
  return out;
}

/** Open a <dialog> (modal: focus is trapped, Escape closes it). */
export function openDialog(dlg) {
  dlg.showModal();
  const first = dlg.querySelector('input, select, textarea, button');
  if (first) first.focus();
}
