// A small Markdown renderer that builds DOM nodes: text is only ever set as
// text, so nothing in a model's reply can become markup or script.
import { el } from './ui.js';

function inline(text) {
  const out = [];
  // `code`, **bold**, *italic* / _italic_, [label](http(s) url)
  const re = /(`[^`]+`)|(\*\*[^*]+\*\*)|(\*[^*\s][^*]*\*|_[^_\s][^_]*_)|(\[[^\]]+\]\((https?:\/\/[^\s)]+)\))/g;
  let last = 0;
  let m;
  while ((m = re.exec(text)) !== null) {
    if (m.index > last) out.push(text.slice(last, m.index));
    const tok = m[0];
    if (m[1]) out.push(el('code', {}, tok.slice(1, -1)));
    else if (m[2]) out.push(el('strong', {}, ...inline(tok.slice(2, -2))));
    else if (m[3]) out.push(el('em', {}, ...inline(tok.slice(1, -1))));
    else if (m[4]) {
      const label = tok.slice(1, tok.indexOf(']('));
      out.push(el('a', { href: m[5], target: '_blank', rel: 'noopener noreferrer nofollow' }, label));
    }
    last = m.index + tok.length;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}

/** Render Markdown text into a DocumentFragment. */
export function render(text) {
  const frag = document.createDocumentFragment();
  const lines = String(text || '').split('\n');
  let i = 0;
  let para = [];
  const flush = () => {
    if (para.length) { frag.append(el('p', {}, ...inline(para.join('\n')))); para = []; }
  };
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^\s*```\s*([\w+-]*)\s*$/);
    if (fence) {
      flush();
      const body = [];
      i += 1;
      while (i < lines.length && !/^\s*```\s*$/.test(lines[i])) { body.push(lines[i]); i += 1; }
      i += 1;  // the closing fence (or the end of a reply still streaming)
      const code = el('code', { class: fence[1] ? `lang-${fence[1]}` : '' }, body.join('\n'));
      frag.append(el('pre', { class: 'code' }, code));
      continue;
    }
    const h = line.match(/^(#{1,6})\s+(.*)$/);
    if (h) { flush(); frag.append(el(`h${Math.min(6, h[1].length + 2)}`, {}, ...inline(h[2]))); i += 1; continue; }
    if (/^\s*([-*+]|\d+[.)])\s+/.test(line)) {
      flush();
      const ordered = /^\s*\d/.test(line);
      const list = el(ordered ? 'ol' : 'ul');
      while (i < lines.length && /^\s*([-*+]|\d+[.)])\s+/.test(lines[i])) {
        list.append(el('li', {}, ...inline(lines[i].replace(/^\s*([-*+]|\d+[.)])\s+/, ''))));
        i += 1;
      }
      frag.append(list);
      continue;
    }
    if (!line.trim()) { flush(); i += 1; continue; }
    para.push(line);
    i += 1;
  }
  flush();
  return frag;
}
