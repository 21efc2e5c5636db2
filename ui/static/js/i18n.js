// The console's words: one JSON file per language under /static/i18n/, the
// same file the server renders templates with.
const lang = document.documentElement.lang || 'en';
let table = {};
try {
  const r = await fetch(`/static/i18n/${encodeURIComponent(lang)}.json`);
  table = r.ok ? await r.json() : {};
  if (lang !== 'en') {
    const en = await (await fetch('/static/i18n/en.json')).json();
    table = { ...en, ...table };
  }
} catch (e) { table = {}; }

/** t('key', {name: 'x'}) -> the string with {name} filled in; the key itself when missing. */
export function t(key, vars = {}) {
  let s = table[key] ?? key;
  for (const [k, v] of Object.entries(vars)) s = s.split(`{${k}}`).join(String(v));
  return s;
}
