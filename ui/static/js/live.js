// One websocket per open console page: balance, key quotas, usage records,
// announcements, and the built-in chat.  Reconnects by itself with backoff.
const listeners = new Map();
let ws = null;
let attempt = 0;
let queue = [];
let stateCb = () => {};

export function on(type, fn) {
  if (!listeners.has(type)) listeners.set(type, new Set());
  listeners.get(type).add(fn);
  return () => listeners.get(type).delete(fn);
}

function emit(type, msg) {
  for (const fn of listeners.get(type) || []) {
    try { fn(msg); } catch (e) { console.error(e); }
  }
}

export function onState(fn) { stateCb = fn; }

export function connected() { return ws !== null && ws.readyState === WebSocket.OPEN; }

/** Send a message now, or as soon as the socket is (re)open. */
export function send(msg) {
  if (connected()) ws.send(JSON.stringify(msg));
  else queue.push(msg);
}

export function connect() {
  const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
  ws = new WebSocket(`${proto}//${location.host}/console/ws`);
  stateCb('connecting');
  ws.addEventListener('open', () => {
    attempt = 0;
    stateCb('open');
    const pending = queue; queue = [];
    for (const m of pending) ws.send(JSON.stringify(m));
  });
  ws.addEventListener('message', (ev) => {
    let msg;
    try { msg = JSON.parse(ev.data); } catch (e) { return; }
    emit(msg.type, msg);
    emit('*', msg);
  });
  ws.addEventListener('close', (ev) => {
    ws = null;
    stateCb('closed');
    emit('closed', {});
    if (ev.code === 4401) { location.href = '/console/login'; return; }
    // 0.5 s, 1 s, 2 s ... up to 30 s, with jitter so that a restarted
    // server is not hit by every console at the same instant.
    const delay = Math.min(30000, 500 * 2 ** attempt) * (0.75 + Math.random() * 0.5);
    attempt += 1;
    setTimeout(connect, delay);
  });
}
