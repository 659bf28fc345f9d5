// md.js - Markdown to DOM nodes, safely: every piece of text becomes a
// text node (never HTML), so a reply holding <script> or an onerror
// attribute shows as those characters.  Covers what chat replies use:
// paragraphs, headings, fenced and indented code, lists (nested by
// indentation, ordered and not), block quotes, rules, and inline code,
// bold, italic, strike-through and links (http, https and mailto only).
"use strict";

const el = (tag, cls) => {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  return e;
};

// Where the run of n backticks after from starts (a run of exactly n), or -1.
function closingRun(text, from, n) {
  const ticks = "`".repeat(n);
  for (let i = text.indexOf(ticks, from); i >= 0; i = text.indexOf(ticks, i + 1)) {
    let j = i + n;
    if (text[i - 1] === "`") continue;
    if (text[j] === "`") {
      while (text[j] === "`") j++;
      i = j - 1;
      continue;
    }
    return i;
  }
  return -1;
}

// Deeper lists and quotes than this are shown as text (no recursion without end).
const MAX_DEPTH = 16;

// Inline spans of one line of text into parent.
function inline(parent, text) {
  // Underscores emphasise only outside words (snake_case and __dunder__
  // stay).  A code span starts at a whole run of backticks and ends at the
  // next run of the same length (found with indexOf: no backtracking).
  const re = /(?<!`)(`+)(?!`)|\*\*(?=\S)([^*]+?)(?<=\S)\*\*|(?<![\w])__(?=\S)([^_]+?)(?<=\S)__(?![\w])|\*(?=[^*\s])([^*]*?[^*\s])\*|(?<![\w])_(?=[^_\s])([^_]*?[^_\s])_(?![\w])|~~([^~]+)~~|\[([^\]]+)\]\(([^)\s]+)\)/g;
  let last = 0, m;
  while ((m = re.exec(text))) {
    if (m.index > last) parent.append(text.slice(last, m.index));
    if (m[1]) {
      const close = closingRun(text, re.lastIndex, m[1].length);
      if (close < 0) { // no closing run: the backticks are text
        parent.append(m[1]);
        last = re.lastIndex;
        continue;
      }
      const c = el("code");
      c.textContent = text.slice(re.lastIndex, close).replace(/^ (.*) $/, "$1");
      parent.append(c);
      re.lastIndex = close + m[1].length;
    } else if (m[2] || m[3]) {
      const b = el("strong");
      inline(b, m[2] || m[3]);
      parent.append(b);
    } else if (m[4] || m[5]) {
      const i = el("em");
      inline(i, m[4] || m[5]);
      parent.append(i);
    } else if (m[6]) {
      const s = el("del");
      inline(s, m[6]);
      parent.append(s);
    } else {
      const href = m[8];
      if (/^(https?:|mailto:)/i.test(href)) {
        const a = el("a");
        a.href = href;
        a.rel = "noopener noreferrer nofollow";
        a.target = "_blank";
        inline(a, m[7]);
        parent.append(a);
      } else {
        parent.append(m[0]);
      }
    }
    last = re.lastIndex;
  }
  if (last < text.length) parent.append(text.slice(last));
}

// Lines joined into a paragraph keep their breaks.
function para(parent, lines, tag = "p") {
  const p = el(tag);
  lines.forEach((l, i) => {
    if (i) p.append(el("br"));
    inline(p, l);
  });
  parent.append(p);
}

const LIST = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;

// Parses lines[i..] as a list whose items start at indent; returns the next line.
function list(parent, lines, i, indent, depth) {
  const first = LIST.exec(lines[i]);
  const ordered = /\d/.test(first[2]);
  const l = el(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) l.start = parseInt(first[2], 10);
  let li = null, body = [];
  const flush = () => {
    if (li && body.length) blocks(li, body, true, depth + 1);
    body = [];
  };
  while (i < lines.length) {
    const line = lines[i], m = LIST.exec(line);
    if (m && m[1].length === indent) {
      flush();
      li = el("li");
      l.append(li);
      body.push(m[3]);
      i++;
    } else if (line.trim() === "") {
      // A blank line goes on with the list when the next line is an item of
      // it or indented under the item.
      const next = lines[i + 1], nm = next === undefined ? null : LIST.exec(next);
      const nextIndent = next === undefined ? -1 : next.length - next.trimStart().length;
      if (next !== undefined && next.trim() !== "" && ((nm && nm[1].length === indent) || nextIndent > indent)) {
        body.push("");
        i++;
      } else break;
    } else if (line.length - line.trimStart().length > indent || (m && m[1].length > indent)) {
      body.push(line.slice(Math.min(indent + 2, line.length - line.trimStart().length)));
      i++;
    } else if (!m && body.length && line.trim() && !/^(#{1,6}\s|```|~~~|>|(\*\s*){3,}$|(-\s*){3,}$)/.test(line)) {
      body.push(line.trim()); // a lazy continuation of the item's text
      i++;
    } else break;
  }
  flush();
  parent.append(l);
  return i;
}

// Block structure of lines into parent (tight: list items without <p>).
function blocks(parent, lines, tight = false, depth = 0) {
  if (depth > MAX_DEPTH) return para(parent, lines.filter((l) => l.trim() !== ""), "div");
  let i = 0, text = [];
  const flushText = () => {
    if (text.length) para(parent, text, tight ? "div" : "p");
    text = [];
  };
  while (i < lines.length) {
    const line = lines[i];
    const fence = /^\s*(`{3,}|~{3,})\s*([\w+#.-]*)/.exec(line);
    if (fence) {
      flushText();
      const pre = el("pre"), code = el("code");
      if (fence[2]) code.dataset.lang = fence[2];
      const body = [];
      i++;
      const closing = new RegExp("^\\s*\\" + fence[1][0] + "{" + fence[1].length + ",}\\s*$");
      while (i < lines.length && !closing.test(lines[i])) body.push(lines[i++]);
      i++; // the closing fence (or the end: a reply still streaming)
      code.textContent = body.join("\n");
      pre.append(code);
      parent.append(pre);
      continue;
    }
    const h = /^(#{1,6})\s+(.*?)\s*#*\s*$/.exec(line);
    if (h) {
      flushText();
      const e = el("h" + Math.min(6, h[1].length + 2));
      inline(e, h[2]);
      parent.append(e);
      i++;
      continue;
    }
    if (/^\s{0,3}((\*\s*){3,}|(-\s*){3,}|(_\s*){3,})$/.test(line)) {
      flushText();
      parent.append(el("hr"));
      i++;
      continue;
    }
    if (/^\s{0,3}>/.test(line)) {
      flushText();
      const q = el("blockquote"), body = [];
      while (i < lines.length && /^\s{0,3}>/.test(lines[i])) body.push(lines[i++].replace(/^\s{0,3}>\s?/, ""));
      blocks(q, body, false, depth + 1);
      parent.append(q);
      continue;
    }
    const lm = LIST.exec(line);
    if (lm && (!text.length || !/\d/.test(lm[2]) || lm[2].startsWith("1"))) {
      flushText();
      i = list(parent, lines, i, lm[1].length, depth);
      continue;
    }
    if (/^( {4}|\t)/.test(line) && !text.length) {
      const pre = el("pre"), code = el("code"), body = [];
      while (i < lines.length && (/^( {4}|\t)/.test(lines[i]) || (lines[i].trim() === "" && /^( {4}|\t)/.test(lines[i + 1] || ""))))
        body.push(lines[i++].replace(/^( {4}|\t)/, ""));
      code.textContent = body.join("\n");
      pre.append(code);
      parent.append(pre);
      continue;
    }
    if (line.trim() === "") {
      flushText();
      i++;
      continue;
    }
    text.push(line.trim());
    i++;
  }
  flushText();
}

// A fragment holding text rendered as Markdown.
export function renderMarkdown(text) {
  const f = document.createDocumentFragment();
  blocks(f, String(text).replace(/\r\n?/g, "\n").split("\n"));
  return f;
}
