// app.js - quire's chat page: conversations kept on the server (sessions),
// replies streamed over the WebSocket protocol (README.md, "Serving") and
// rendered as Markdown by md.js, JSON mode checked by schema.js.  No build
// step and no request outside the server.
"use strict";

import { renderMarkdown } from "./md.js";
import { validate } from "./schema.js";

const $ = (id) => document.getElementById(id);
const MAX_WS_KEY = 53; // bytes: "quire.v1, quire.key." + 2 a byte within libwebsockets' 128
const el = (tag, cls, text) => {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
};

// ---- settings (kept in this browser) -------------------------------------------------

const EXAMPLE_SCHEMAS = {
  person: {
    type: "object",
    properties: { name: { type: "string", maxLength: 40 }, age: { type: "integer", minimum: 0, maximum: 150 } },
    required: ["name", "age"],
    additionalProperties: false,
  },
  todo: {
    type: "object",
    properties: {
      title: { type: "string", maxLength: 60 },
      items: { type: "array", items: { type: "string", maxLength: 40 }, minItems: 1, maxItems: 5 },
      done: { type: "boolean" },
    },
    required: ["title", "items", "done"],
  },
  choice: { enum: ["yes", "no", "maybe"] },
};

const DEFAULTS = {
  system: "",
  temperature: 0.8,
  top_p: 0.95,
  max_tokens: 256,
  seed: "",
  speculative: true,
  json: false,
  schema: JSON.stringify(EXAMPLE_SCHEMAS.person, null, 2),
  api_key: "",
};

function loadSettings() {
  try {
    return Object.assign({}, DEFAULTS, JSON.parse(localStorage.getItem("quire.settings") || "{}"));
  } catch (e) {
    return Object.assign({}, DEFAULTS);
  }
}
const settings = loadSettings();
const saveSettings = () => localStorage.setItem("quire.settings", JSON.stringify(settings));

// ---- reply stats (kept in this browser) ------------------------------------------------
// The server stores a session's messages, not their timings: the stats line of
// each reply is kept here, by session and message index, for the 100 sessions
// used last, so that a reload shows it again.

const STATS_KEY = "quire.stats", STATS_SESSIONS = 100;

function loadStats() {
  try {
    const a = JSON.parse(localStorage.getItem(STATS_KEY) || "[]");
    return Array.isArray(a) ? a : [];
  } catch (e) {
    return [];
  }
}

// f(byIndex) changes session sid's stats ({index: stats}); the session moves to
// the end (used last) and the oldest beyond STATS_SESSIONS go.
function updateStats(sid, f) {
  const all = loadStats().filter((e) => e && e.id !== sid);
  const byIndex = storedStats(sid);
  if (f(byIndex) !== false) all.push({ id: sid, stats: byIndex });
  try {
    localStorage.setItem(STATS_KEY, JSON.stringify(all.slice(-STATS_SESSIONS)));
  } catch (e) {
    /* storage full: the line shows until the next reload */
  }
}

function storedStats(sid) {
  const mine = loadStats().find((e) => e && e.id === sid);
  return (mine && mine.stats) || {};
}

// Messages from index n on are gone (an edit, a reply asked for again).
const trimStats = (sid, n) => updateStats(sid, (s) => Object.keys(s).forEach((k) => +k >= n && delete s[k]));
const dropStats = (sid) => updateStats(sid, () => false);

// ---- state ----------------------------------------------------------------------------

const state = {
  ws: null,
  open: false,
  delay: 500, // reconnect back-off, ms
  sessions: [],
  sid: null, // the open session's id; null: a new chat
  msgs: [], // the session's messages as stored: {role, content, status, stats?, check?}
  run: null, // the request streaming: {id, msg, node, schema}
  n: 0,
  server: { model: "", speculative: "none" },
  detached: new Set(), // requests left to finish without the page
};

// ---- the connection -------------------------------------------------------------------

function setConn(s, text) {
  const c = $("conn");
  c.dataset.state = s;
  c.textContent = text;
  document.body.dataset.conn = s;
  updateControls();
}

function connect() {
  const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/v1/ws";
  let ws;
  try {
    // An API key travels as a subprotocol token (a browser's WebSocket sends
    // no Authorization header); the server answers with "quire.v1".
    const key = settings.api_key.trim();
    const hex = Array.from(new TextEncoder().encode(key), (b) => b.toString(16).padStart(2, "0")).join("");
    // libwebsockets reads 128 bytes of the subprotocol header: keys of up to 53 bytes.
    if (hex.length > 2 * MAX_WS_KEY) $("sessions-note").textContent = `an API key over ${MAX_WS_KEY} bytes cannot travel on the page's WebSocket`;
    ws = key ? new WebSocket(url, ["quire.v1", "quire.key." + hex]) : new WebSocket(url);
  } catch (e) {
    return retry();
  }
  state.ws = ws;
  setConn("connecting", "connecting…");
  ws.onopen = () => {
    state.open = true;
    state.delay = 500;
    setConn("open", "connected");
    refreshServer();
    refreshSessions();
    if (state.sid && !state.run) openSession(state.sid, true);
  };
  ws.onclose = () => {
    const was = state.open;
    state.open = false;
    state.ws = null;
    if (state.run) finishRun({ error: "the connection closed mid-reply (the server stores what it had)" });
    retry(was);
  };
  ws.onerror = () => {}; // onclose follows
  ws.onmessage = (ev) => {
    let m;
    try {
      m = JSON.parse(ev.data);
    } catch (e) {
      return;
    }
    onFrame(m);
  };
}

// A new key: the socket is opened again with it, the list read again.
function reconnect() {
  clearTimeout(retry.t);
  state.delay = 500;
  if (state.ws) {
    const old = state.ws;
    state.ws = null;
    old.onclose = null;
    old.close();
    state.open = false;
    if (state.run) finishRun({ error: "the connection was opened again" });
  }
  connect();
}

function retry() {
  const wait = state.delay;
  state.delay = Math.min(state.delay * 2, 5000);
  setConn("closed", `disconnected: retrying in ${(wait / 1000).toFixed(1)} s`);
  clearTimeout(retry.t);
  retry.t = setTimeout(connect, wait);
  // Refused at once: perhaps a key is missing or wrong (the socket cannot say).
  api("GET", "/v1/models").catch((e) => {
    if (/API key/.test(e.message)) $("sessions-note").textContent = e.message;
  });
}

async function api(method, path, body) {
  const headers = body ? { "Content-Type": "application/json" } : {};
  if (settings.api_key.trim()) headers.Authorization = "Bearer " + settings.api_key.trim();
  const r = await fetch(path, { method, headers, body: body ? JSON.stringify(body) : undefined });
  if (r.status === 401) throw new Error("the server wants an API key: set it in Settings");
  const j = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error((j.error && j.error.message) || `${method} ${path}: ${r.status}`);
  return j;
}

async function refreshServer() {
  try {
    const j = await api("GET", "/v1/models");
    const m = (j.data || [])[0] || {};
    state.server.model = m.id || "";
    state.server.speculative = m.speculative || "none";
  } catch (e) {
    /* loading: the next connection asks again */
  }
  $("spec-row").hidden = state.server.speculative === "none";
  $("model").textContent = state.server.model;
}

// ---- sessions -------------------------------------------------------------------------

async function refreshSessions() {
  let j;
  try {
    j = await api("GET", "/v1/sessions");
  } catch (e) {
    $("sessions-note").textContent = e.message;
    return;
  }
  $("sessions-note").textContent = "";
  state.sessions = j.data || [];
  renderSessions();
  // The open conversation's title, as a reload shows it (a new one gets it
  // from its first message when the server stores it).
  const cur = state.sessions.find((s) => s.id === state.sid);
  if (cur) $("title").textContent = cur.title || "quire";
}

function renderSessions() {
  const ul = $("sessions");
  ul.replaceChildren();
  for (const s of state.sessions) {
    const li = el("li", s.id === state.sid ? "session current" : "session");
    li.dataset.id = s.id;
    const open = el("button", "session-open", s.title || "(untitled)");
    open.title = new Date(s.updated * 1000).toLocaleString();
    open.onclick = () => {
      openSession(s.id);
      closeSidebarOnPhone();
    };
    const ren = el("button", "icon session-rename", "✎");
    ren.title = "Rename";
    ren.setAttribute("aria-label", "Rename");
    ren.onclick = () => renameSession(s);
    const del = el("button", "icon session-delete", "×");
    del.title = "Delete";
    del.setAttribute("aria-label", "Delete");
    del.onclick = () => deleteSession(s);
    li.append(open, ren, del);
    ul.append(li);
  }
}

// s cut to at most n bytes of UTF-8, whole characters only.
function cutBytes(s, n) {
  let out = "", used = 0;
  for (const ch of s) {
    used += new TextEncoder().encode(ch).length;
    if (used > n) break;
    out += ch;
  }
  return out;
}

async function renameSession(s) {
  const title = prompt("Rename the conversation", s.title || "");
  if (title === null) return;
  try {
    await api("PATCH", `/v1/sessions/${encodeURIComponent(s.id)}`, { title: cutBytes(title.trim(), 200) });
  } catch (e) {
    return notice(e.message);
  }
  await refreshSessions();
  if (s.id === state.sid) $("title").textContent = title.trim() || "quire";
}

async function deleteSession(s) {
  if (!confirm(`Delete "${s.title || "(untitled)"}"?`)) return;
  try {
    await api("DELETE", `/v1/sessions/${encodeURIComponent(s.id)}`);
  } catch (e) {
    return notice(e.message);
  }
  dropStats(s.id);
  if (s.id === state.sid) newChat();
  refreshSessions();
}

const sessionHash = (id) => "#s=" + encodeURIComponent(id);

// The session id in the page's address, or null.
function hashSession() {
  const m = /^#s=(.+)$/.exec(location.hash);
  if (!m) return null;
  try {
    return decodeURIComponent(m[1]);
  } catch (e) {
    return null;
  }
}

let openSeq = 0;
async function openSession(id, quiet) {
  if (state.run && !quiet) detachRun();
  const seq = ++openSeq;
  let j;
  try {
    j = await api("GET", `/v1/sessions/${encodeURIComponent(id)}`);
  } catch (e) {
    if (seq !== openSeq) return;
    if (!quiet) notice(e.message);
    if (state.sid === id && !state.run) newChat();
    return;
  }
  if (seq !== openSeq || state.run) return; // another was asked for, or a reply started meanwhile
  const stats = storedStats(id);
  state.sid = id;
  state.msgs = (j.messages || []).map((m, i) => ({
    role: m.role,
    content: m.content,
    status: m.status,
    stats: m.role === "assistant" ? stats[i] : undefined,
  }));
  history.replaceState(null, "", sessionHash(id));
  $("title").textContent = j.title || "quire";
  renderLog();
  renderSessions();
}

function newChat() {
  if (state.run) detachRun();
  ++openSeq;
  state.sid = null;
  state.msgs = [];
  history.replaceState(null, "", location.pathname);
  $("title").textContent = "quire";
  renderLog();
  renderSessions();
  $("input").focus();
}

// ---- the conversation -----------------------------------------------------------------

function renderLog() {
  const log = $("log");
  log.replaceChildren();
  state.msgs.forEach((m, i) => log.append(messageNode(m, i)));
  if (!state.msgs.length) log.append(el("p", "empty", "Start a conversation: type below and press Enter."));
  log.scrollTop = log.scrollHeight;
  updateControls();
}

function lastIndex(role) {
  for (let i = state.msgs.length - 1; i >= 0; i--) if (state.msgs[i].role === role) return i;
  return -1;
}

function messageNode(m, i) {
  const n = el("div", `msg ${m.role}`);
  n.dataset.index = i;
  if (m.status && m.status !== "done") n.dataset.status = m.status;
  const who = el("div", "who", m.role === "assistant" ? "quire" : m.role);
  const body = el("div", "body");
  fillBody(body, m);
  n.append(who, body);
  if (m.role === "system") return n;
  const tools = el("div", "tools");
  const copy = el("button", "tool copy", "Copy");
  copy.onclick = () => copyText(m.content, copy);
  tools.append(copy);
  if (m.role === "user") {
    const edit = el("button", "tool edit", "Edit");
    edit.onclick = () => editMessage(i, n);
    tools.append(edit);
  } else if (i === lastIndex("assistant") && i === state.msgs.length - 1) {
    const again = el("button", "tool regenerate", "Regenerate");
    again.onclick = () => regenerate(i);
    tools.append(again);
  }
  n.append(tools);
  const st = el("div", "stats");
  fillStats(st, m);
  n.append(st);
  return n;
}

function fillBody(body, m) {
  try {
    fillBodyAs(body, m);
  } catch (e) {
    body.replaceChildren(el("div", "plain", m.content)); // whatever the renderer met, the text as it is
  }
}

function fillBodyAs(body, m) {
  body.replaceChildren();
  if (m.role !== "assistant") {
    body.append(el("div", "plain", m.content)); // user text as typed, never markup
    return;
  }
  if (m.json) {
    let v, errs = null;
    try {
      v = JSON.parse(m.content);
    } catch (e) {
      errs = m.running ? null : ["not JSON: " + e.message];
    }
    if (v !== undefined) {
      errs = validate(v, m.json);
      const pre = el("pre", "json");
      pre.append(el("code", null, JSON.stringify(v, null, 2)));
      body.append(pre);
    } else {
      body.append(el("pre", "json", m.content));
    }
    if (errs) {
      const badge = el("div", errs.length ? "check invalid" : "check valid");
      badge.textContent = errs.length ? "invalid: " + errs.slice(0, 3).join("; ") : "valid JSON for the schema";
      body.append(badge);
    }
    return;
  }
  body.append(renderMarkdown(m.content));
  if (m.error) body.append(el("div", "error", m.error));
}

function fillStats(st, m) {
  st.replaceChildren();
  const s = m.stats;
  if (!s) return;
  const parts = [];
  if (s.ttft !== undefined) parts.push(`first token ${(s.ttft * 1000).toFixed(0)} ms`);
  if (s.tps !== undefined) parts.push(`${s.tps.toFixed(1)} tok/s`);
  if (s.completion !== undefined) parts.push(`${s.completion} tokens`);
  if (s.prompt !== undefined) {
    const c = s.cached || 0, disk = s.disk || 0;
    parts.push(`prompt ${s.prompt}, ${c} from cache` + (c ? ` (memory ${c - disk}, disk ${disk})` : ""));
  }
  if (s.spec !== undefined) parts.push(`drafts kept ${(s.spec * 100).toFixed(0)}% (${s.specLen.toFixed(2)} a pass)`);
  if (s.finish && s.finish !== "stop") parts.push(s.finish);
  st.textContent = parts.join(" · ");
}

function copyText(text, button) {
  const done = () => {
    button.textContent = "Copied";
    setTimeout(() => (button.textContent = "Copy"), 1200);
  };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(done, () => fallbackCopy(text) && done());
  } else if (fallbackCopy(text)) done();
}

function fallbackCopy(text) {
  const t = el("textarea");
  t.value = text;
  t.setAttribute("readonly", "");
  t.style.position = "fixed";
  t.style.opacity = "0";
  document.body.append(t);
  t.select();
  let ok = false;
  try {
    ok = document.execCommand("copy");
  } catch (e) {
    ok = false;
  }
  t.remove();
  return ok;
}

function editMessage(i, node) {
  if (state.run) return;
  const body = node.querySelector(".body");
  const area = el("textarea", "edit-area");
  area.value = state.msgs[i].content;
  area.rows = Math.min(12, area.value.split("\n").length + 1);
  const save = el("button", "tool resend", "Send");
  const cancel = el("button", "tool", "Cancel");
  save.onclick = () => {
    const text = area.value.trim();
    if (text) send(text, i);
  };
  cancel.onclick = () => renderLog();
  area.onkeydown = (e) => {
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      save.click();
    } else if (e.key === "Escape") cancel.click();
  };
  node.querySelector(":scope > .tools").remove(); // Send and Cancel replace Copy and Edit
  body.replaceChildren(area, el("div", "tools", ""));
  body.lastChild.append(save, cancel);
  area.focus();
}

function regenerate(i) {
  // The reply at i is asked for again: its user message (before it) resent.
  let u = i - 1;
  while (u >= 0 && state.msgs[u].role !== "user") u--;
  if (u < 0 || state.run) return;
  send(state.msgs[u].content, u);
}

function notice(text) {
  const n = $("notice");
  n.textContent = text;
  n.hidden = false;
  clearTimeout(notice.t);
  notice.t = setTimeout(() => (n.hidden = true), 6000);
}

// ---- requests -------------------------------------------------------------------------

function numberOr(v, d) {
  const x = parseFloat(v);
  return Number.isFinite(x) ? x : d;
}

// Sends text as a new user message; keep: the index it replaces (an edit or a
// reply asked for again: the session keeps only the messages before it).
function send(text, keep) {
  if (!state.open || state.run) return;
  const typed = keep === undefined; // from the message box (not an edit or a reply asked for again)
  let schema = null;
  if (settings.json) {
    try {
      schema = JSON.parse(settings.schema);
    } catch (e) {
      return notice("JSON mode: the schema is not JSON: " + e.message);
    }
  }
  const fresh = !state.sid;
  const msgs = [];
  if (fresh && settings.system.trim()) msgs.push({ role: "system", content: settings.system.trim() });
  msgs.push({ role: "user", content: text });
  if (fresh) keep = undefined; // nothing stored to keep from
  const before = state.msgs.slice();
  if (keep !== undefined) state.msgs = state.msgs.slice(0, keep);
  state.msgs.push(...msgs);
  const reply = { role: "assistant", content: "", status: "running", running: true, json: schema };
  state.msgs.push(reply);
  const id = "r" + ++state.n;
  const req = {
    type: "chat",
    id,
    messages: msgs,
    max_tokens: Math.max(1, Math.round(numberOr(settings.max_tokens, 256))),
    temperature: numberOr(settings.temperature, 0.8),
    top_p: numberOr(settings.top_p, 0.95),
  };
  if (fresh) req.new_session = true;
  else req.session = state.sid;
  if (keep !== undefined) {
    req.keep_messages = keep;
    trimStats(state.sid, keep);
  }
  if (String(settings.seed).trim() !== "") req.seed = Math.round(numberOr(settings.seed, 0));
  if (state.server.speculative !== "none") req.speculative = !!settings.speculative;
  if (schema) req.response_format = { type: "json_schema", json_schema: { name: "reply", schema, strict: true } };
  state.run = { id, msg: reply, t0: performance.now(), before, started: false, stopAtStart: false, typed: typed ? text : null };
  renderLog();
  state.run.node = $("log").lastChild;
  state.ws.send(JSON.stringify(req));
  $("input").value = "";
  autosize();
}

// Cancels the running reply.  Before the server's start frame (a session's
// turn is still being stored) the request has no id there yet: the cancel
// waits for start.
function stop() {
  const r = state.run;
  if (!r || !state.open) return;
  if (!r.started) r.stopAtStart = true;
  else state.ws.send(JSON.stringify({ type: "cancel", id: r.id }));
}

// Leaves the running reply to finish on the server (cancelled) without the
// page: its frames are ignored from now on.
function detachRun() {
  stop();
  state.detached.add(state.run.id);
  state.run = null;
  updateControls();
}

// The streaming reply drawn at each delta while it is short; a long one
// (whose Markdown costs more to lay out again) once a frame.
let drawPending = false;
function drawNow() {
  drawPending = false;
  const r = state.run;
  if (!r || !r.node) return;
  const log = $("log"), bottom = log.scrollHeight - log.scrollTop - log.clientHeight < 120;
  fillBody(r.node.querySelector(".body"), r.msg);
  if (bottom) log.scrollTop = log.scrollHeight;
}
function drawRun() {
  if (state.run && state.run.msg.content.length < 16384) return drawNow();
  if (drawPending) return;
  drawPending = true;
  requestAnimationFrame(drawNow);
}

function onFrame(m) {
  const r = state.run;
  if (m.id && state.detached.has(m.id)) {
    if (m.type === "start") state.ws.send(JSON.stringify({ type: "cancel", id: m.id }));
    if (m.type === "done" || m.type === "error") state.detached.delete(m.id);
    return;
  }
  // An error for no request (a message the server could not read, one over
  // its size limit) ends a reply that has not started.
  if (r && !r.started && m.type === "error" && (m.id === null || m.id === undefined)) m.id = r.id;
  if (!r || m.id !== r.id) return;
  if (m.type === "start") {
    r.started = true;
    if (r.stopAtStart) state.ws.send(JSON.stringify({ type: "cancel", id: r.id }));
    if (m.session && m.session !== state.sid) {
      state.sid = m.session;
      history.replaceState(null, "", sessionHash(m.session));
      refreshSessions();
    }
  } else if (m.type === "delta") {
    if (r.msg.stats === undefined) r.msg.stats = { ttft: (performance.now() - r.t0) / 1000 };
    r.msg.content += m.text || "";
    drawRun();
  } else if (m.type === "done") {
    const c = (m.choices || [])[0] || {}, u = m.usage || {}, t = m.timings || {};
    r.msg.stats = {
      ttft: t.ttft_s,
      tps: t.tokens_per_s,
      completion: u.completion_tokens,
      prompt: u.prompt_tokens,
      cached: (u.prompt_tokens_details || {}).cached_tokens,
      disk: (u.prompt_tokens_details || {}).disk_cached_tokens || 0,
      finish: c.finish_reason,
    };
    if (t.spec_acceptance !== undefined && u.speculative && u.speculative.drafted_tokens > 0) {
      r.msg.stats.spec = t.spec_acceptance;
      r.msg.stats.specLen = t.spec_mean_accepted_length || 0;
    }
    const ok = c.finish_reason !== "cancelled" && c.finish_reason !== "error";
    if (state.sid && m.stored === false) finishRun({ error: "the reply could not be stored" });
    else finishRun({ status: ok ? "done" : "partial" });
  } else if (m.type === "error") {
    finishRun({ error: (m.error && m.error.message) || "error" });
  }
}

function finishRun(how) {
  const r = state.run;
  state.run = null;
  r.msg.running = false;
  r.msg.status = how.status || "error";
  if (how.error) {
    r.msg.error = how.error;
    notice(how.error);
    // The server may hold less than the page shows: a new chat that failed
    // before it was stored is dropped; a session is read again.
    if (!r.started && !state.sid) state.msgs = r.before;
    // Refused before it started: what was typed goes back into the box
    // (unless something new is being typed there).
    if (!r.started && r.typed !== null && !$("input").value) {
      $("input").value = r.typed;
      autosize();
    }
  } else if (state.sid && r.msg.stats) {
    updateStats(state.sid, (s) => {
      s[state.msgs.indexOf(r.msg)] = r.msg.stats;
    });
  }
  renderLog();
  refreshSessions();
  if (how.error && state.sid && state.open) setTimeout(() => state.sid && !state.run && openSession(state.sid, true), 300);
}

// ---- controls -------------------------------------------------------------------------

function updateControls() {
  $("send").disabled = !state.open || !!state.run;
  $("stop").disabled = !state.run;
  document.body.dataset.running = state.run ? "1" : "0";
}

function autosize() {
  const t = $("input");
  t.style.height = "auto";
  // Empty, the box is as tall as its placeholder (two lines at a phone's
  // width), which it would clip otherwise.
  let h = t.scrollHeight;
  if (!t.value) {
    t.value = t.placeholder;
    h = t.scrollHeight;
    t.value = "";
  }
  t.style.height = Math.min(h + 2, 220) + "px";
  t.style.overflowY = h > 218 ? "auto" : "hidden";
}

function closeSidebarOnPhone() {
  if (window.matchMedia("(max-width: 760px)").matches) document.body.classList.remove("side-open");
}

function bindSettings() {
  const fields = ["system", "temperature", "top_p", "max_tokens", "seed", "schema", "api_key"];
  for (const f of fields) {
    const e = $("set-" + f);
    e.value = settings[f];
    e.oninput = () => {
      settings[f] = e.value;
      saveSettings();
      if (f === "schema") checkSchema();
    };
    if (f === "api_key") e.onchange = () => reconnect();
  }
  const spec = $("set-speculative");
  spec.checked = !!settings.speculative;
  spec.onchange = () => {
    settings.speculative = spec.checked;
    saveSettings();
  };
  const json = $("json-mode");
  json.checked = !!settings.json;
  json.onchange = () => {
    settings.json = json.checked;
    saveSettings();
    document.body.dataset.json = json.checked ? "1" : "0";
  };
  document.body.dataset.json = settings.json ? "1" : "0";
  const pick = $("schema-pick");
  pick.onchange = () => {
    if (!pick.value) return;
    settings.schema = JSON.stringify(EXAMPLE_SCHEMAS[pick.value], null, 2);
    $("set-schema").value = settings.schema;
    saveSettings();
    checkSchema();
    pick.value = "";
  };
  checkSchema();
}

function checkSchema() {
  try {
    JSON.parse(settings.schema);
    $("schema-note").textContent = "";
  } catch (e) {
    $("schema-note").textContent = "not JSON: " + e.message;
  }
}

function init() {
  bindSettings();
  $("composer").onsubmit = (e) => {
    e.preventDefault();
    const text = $("input").value.trim();
    if (text) send(text);
  };
  $("input").onkeydown = (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  };
  $("input").oninput = autosize;
  window.addEventListener("resize", autosize);
  autosize();
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && state.run) {
      e.preventDefault();
      stop();
    }
  });
  $("stop").onclick = stop;
  $("new-chat").onclick = () => {
    newChat();
    closeSidebarOnPhone();
  };
  $("open-side").onclick = () => document.body.classList.toggle("side-open");
  $("close-side").onclick = () => document.body.classList.remove("side-open");
  $("open-settings").onclick = () => document.body.classList.toggle("settings-open");
  $("close-settings").onclick = () => document.body.classList.remove("settings-open");
  state.sid = hashSession();
  window.addEventListener("hashchange", () => {
    const h = hashSession();
    if (h && h !== state.sid) openSession(h);
    else if (!h && state.sid) newChat();
  });
  renderLog();
  connect();
}

init();
