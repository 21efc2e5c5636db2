// The console's words: one JSON file per language under /static/i18n/, the
// same file the server renders templates with.
const lang = document.documentElement.lang || 'en';
/** The page's language, for Intl's number and date formats (the server chose it). */
export const locale = lang;
let table = {};
try {
  const r = await fetch(`/static/i18n/${encodeURIComponent(lang)}.json`);
  table = r.ok ? await r.json() : {};
  if (lang !== 'en') {
    const en = await (await fetch('/static/i18n/en.json')).json();
    table = { ...en, ...table };
  }
} catch (e) { table = {}; }

/** t('key', {name: 'x'}) -> the string with {name} filled in (in one pass: a
 *  value that holds "{page}" stays as it is); the key itself when missing. */
export function t(key, vars = {}) {
  const s = table[key] ?? key;
  return s.replace(/\{(\w+)\}/g, (m, k) => (Object.prototype.hasOwnProperty.call(vars, k) ? String(vars[k]) : m));
}

/** Whether the table has the key (for words the server sends that we may translate). */
export function has(key) {
  return Object.prototype.hasOwnProperty.call(table, key);
}
