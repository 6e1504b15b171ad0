// Markdown to HTML for answers: the subset language models write (fenced code, headings,
// lists, quotes, tables, rules, emphasis, inline code, links). Every character of the source is
// HTML-escaped first, so a model's output can never inject markup. A fence that is still open
// (the answer is streaming) renders as a code block too.

const ESC = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
export function escapeHtml(s) {
  return s.replace(/[&<>"']/g, (c) => ESC[c]);
}

// Inline spans of one escaped line: code first (its content is left alone), then links,
// strong, emphasis and strike-through.
function inline(text) {
  const parts = text.split(/(`+)([\s\S]*?[^`])\1(?!`)/);
  let out = '';
  for (let i = 0; i < parts.length; i++) {
    if (i % 3 === 0) out += spans(escapeHtml(parts[i]));
    else if (i % 3 === 2) out += `<code>${escapeHtml(parts[i].trim() || parts[i])}</code>`;
  }
  return out;
}

function spans(s) {
  return s
    .replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s)]+|mailto:[^\s)]+)\)/g,
      (_, label, href) => `<a href="${href}" target="_blank" rel="noopener noreferrer">${label}</a>`)
    .replace(/\*\*(?=\S)([\s\S]*?\S)\*\*/g, '<strong>$1</strong>')
    .replace(/__(?=\S)([\s\S]*?\S)__/g, '<strong>$1</strong>')
    .replace(/(^|[^*\w])\*(?=[^\s*])([^*\n]*?[^\s*])\*(?!\w)/g, '$1<em>$2</em>')
    .replace(/(^|[^_\w])_(?=[^\s_])([^_\n]*?[^\s_])_(?!\w)/g, '$1<em>$2</em>')
    .replace(/~~(?=\S)([\s\S]*?\S)~~/g, '<del>$1</del>');
}

function codeBlock(lang, lines) {
  const label = lang ? escapeHtml(lang) : 'text';
  const cls = lang ? ` class="language-${escapeHtml(lang.replace(/[^\w+-]/g, ''))}"` : '';
  return `<div class="code"><div class="code-head"><span>${label}</span>` +
    `<button type="button" class="copy" data-copy>Copy</button></div>` +
    `<pre><code${cls}>${escapeHtml(lines.join('\n'))}</code></pre></div>`;
}

const cells = (row) => row.trim().replace(/^\|/, '').replace(/\|$/, '').split('|').map((c) => c.trim());
const isTableRule = (line) => /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/.test(line) && line.includes('-');
const LIST = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;

export function render(src) {
  const lines = src.replace(/\r\n?/g, '\n').split('\n');
  const out = [];
  let para = [];
  const flush = () => {
    if (para.length) out.push(`<p>${para.map(inline).join('<br>')}</p>`);
    para = [];
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*(`{3,}|~{3,})\s*([^\s`]*)/);
    if (fence) {
      flush();
      const body = [];
      i++;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
      out.push(codeBlock(fence[2], body));
      continue;
    }
    if (!line.trim()) { flush(); continue; }
    const heading = line.match(/^(#{1,6})\s+(.*?)\s*#*\s*$/);
    if (heading) {
      flush();
      out.push(`<h${heading[1].length}>${inline(heading[2])}</h${heading[1].length}>`);
      continue;
    }
    if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) { flush(); out.push('<hr>'); continue; }
    if (line.includes('|') && i + 1 < lines.length && isTableRule(lines[i + 1])) {
      flush();
      const head = cells(line);
      let html = '<div class="table"><table><thead><tr>' + head.map((c) => `<th>${inline(c)}</th>`).join('') +
        '</tr></thead><tbody>';
      i += 2;
      while (i < lines.length && lines[i].includes('|') && lines[i].trim()) {
        html += '<tr>' + cells(lines[i]).map((c) => `<td>${inline(c)}</td>`).join('') + '</tr>';
        i++;
      }
      i--;
      out.push(html + '</tbody></table></div>');
      continue;
    }
    if (/^\s*>/.test(line)) {
      flush();
      const quoted = [];
      while (i < lines.length && /^\s*>/.test(lines[i])) quoted.push(lines[i++].replace(/^\s*>\s?/, ''));
      i--;
      out.push(`<blockquote>${render(quoted.join('\n'))}</blockquote>`);
      continue;
    }
    const item = line.match(LIST);
    if (item) {
      flush();
      const ordered = /\d/.test(item[2]);
      const start = ordered ? parseInt(item[2], 10) : 1;
      const items = [];
      while (i < lines.length) {
        const m = lines[i].match(LIST);
        if (m && /\d/.test(m[2]) === ordered && m[1].length < 2) items.push([m[3]]);
        else if (lines[i].trim() && items.length && /^\s+/.test(lines[i])) items[items.length - 1].push(lines[i].trim());
        else break;
        i++;
      }
      i--;
      const tag = ordered ? 'ol' : 'ul';
      const attr = ordered && start !== 1 ? ` start="${start}"` : '';
      out.push(`<${tag}${attr}>` + items.map((it) => `<li>${it.map(inline).join('<br>')}</li>`).join('') + `</${tag}>`);
      continue;
    }
    para.push(line);
  }
  flush();
  return out.join('\n');
}
