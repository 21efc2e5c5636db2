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
    // The server writes English; a refusal with a code the table knows is
    // shown in the console's language.
    const code = doc && doc.data && doc.data.code;
    const message = code && has(`err.${code}`) ? t(`err.${code}`) : (doc && doc.message) || `HTTP ${r.status}`;
    throw new ApiError(r.status, message, doc && doc.data);
  }
  return doc.data;
}

export const get = (p) => api('GET', p);
export const post = (p, b) => api('POST', p, b ?? {});
export const put = (p, b) => api('PUT', p, b ?? {});
export const del = (p) => api('DELETE', p);
