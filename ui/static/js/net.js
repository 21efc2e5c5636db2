// IP allow-list validation, the same rules as the server's parse_networks.
function ipv4(s) {
  const parts = s.split('.');
  return parts.length === 4 && parts.every((p) => /^\d{1,3}$/.test(p) && Number(p) <= 255);
}

function ipv6(s) {
  if (!/^[0-9a-fA-F:.]+$/.test(s) || !s.includes(':')) return false;
  try { new URL(`http://[${s}]/`); return true; } catch (e) { return false; }
}

/** The entries of an allow-list text, and the first invalid one (or null). */
export function checkAllowList(text) {
  const items = String(text || '').split(/[\s,;]+/).filter(Boolean);
  for (const item of items) {
    const [addr, prefix, extra] = item.split('/');
    if (extra !== undefined) return { items, bad: item };
    const v4 = ipv4(addr);
    const v6 = !v4 && ipv6(addr);
    if (!v4 && !v6) return { items, bad: item };
    if (prefix !== undefined) {
      if (!/^\d{1,3}$/.test(prefix) || Number(prefix) > (v4 ? 32 : 128)) return { items, bad: item };
    }
  }
  return { items, bad: null };
}
