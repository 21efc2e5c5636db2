import { has, t } from './i18n.js';

// The JSON API with the session cookie; every unsafe call carries the CSRF
// token (the readable csrf_token cookie set at sign-in).
export class ApiError extends Error {
  constructor(status, message, data) { super(message); this.status = status; this.data = data; }
}

export function csrfToken() {
  const m = document.cookie.match(/(?:^|;\s*)csrf_token=([^;]+)/);
  return m ? decodeURIComponent(m[1]) : '';
}

/** A refusal's words in the console's language: the server writes English
 *  and names every refusal by `data.code`, with its variable parts as the
 *  other values of `data` ({code: 'field_too_long', field: 'name', max: 64});
 *  a field the table has a label for is named by it.  The server's English
 *  when the table lacks the code (a newer server). */
export function refusal(data, english) {
  const code = data && data.code;
  if (!code || !has(`err.${code}`)) return english;
  const vars = { ...data };
  if (typeof vars.field === 'string' && has(`field.${vars.field}`)) vars.field = t(`field.${vars.field}`);
  return t(`err.${code}`, vars);
}

export async function api(method, path, body) {
  const opts = { method, headers: {}, credentials: 'same-origin' };
  if (!['GET', 'HEAD'].includes(method)) opts.headers['X-CSRF-Token'] = csrfToken();
  if (body !== undefined) {
    opts.headers['Content-Type'] = 'application/json';
    opts.body = JSON.stringify(body);
  }
  let r;
  try {
    r = await fetch(path, opts);
  } catch (e) {
    // The server is unreachable (restarting, or the network is down).
    throw new ApiError(0, t('err.network'));
  }
  let doc = null;
  try { doc = await r.json(); } catch (e) { doc = null; }
  if (!r.ok || !doc || doc.success === false) {
    if (r.status === 401 && !location.pathname.startsWith('/console/login')) {
      location.href = '/console/login?next=' + encodeURIComponent(location.pathname + location.search);
    }
    const data = (doc && doc.data) || null;
    throw new ApiError(r.status, refusal(data, (doc && doc.message) || `HTTP ${r.status}`), data);
  }
  return doc.data;
}

export const get = (p) => api('GET', p);
export const post = (p, b) => api('POST', p, b ?? {});
export const put = (p, b) => api('PUT', p, b ?? {});
export const del = (p) => api('DELETE', p);
