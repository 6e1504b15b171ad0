// The chat page (DESIGN.md W1–W6): conversations in a sidebar, a streamed message list,
// per-conversation settings and a debug line per answer. State lives in `data` (persisted by
// store.js) and `running` (the streams in flight, by conversation); the DOM is drawn from them.

import * as api from './api.js';
import * as store from './store.js';
import { render as markdown, escapeHtml } from './markdown.js';

const $ = (id) => document.getElementById(id);
const el = {
  sidebar: $('sidebar'), scrim: $('scrim'), list: $('conversations'), status: $('server-status'),
  title: $('title'), messages: $('messages'), jump: $('jump'), input: $('input'),
  send: $('send'), stop: $('stop'), composer: $('composer'), settings: $('settings'),
  model: $('set-model'), system: $('set-system'), temperature: $('set-temperature'),
  topP: $('set-top-p'), maxTokens: $('set-max-tokens'), tools: $('set-tools'), apiKey: $('set-api-key'), sessionId: $('session-id'),
  attach: $('attach'), attachFile: $('attach-file'), attachments: $('attachments'),
};

const data = store.load();
const prefs = store.loadPrefs();
let models = [];
// conversation id -> { requestId, controller, message, stopTimer }
const running = new Map();
let stick = true; // follow the stream unless the reader scrolled up
let editing = null; // id of the user message being edited
let attached = []; // images (data: URLs) for the next message

const current = () => data.conversations.find((c) => c.id === data.current);
const apiKey = () => prefs.apiKey || '';

// ---------- persistence ----------

let saveTimer = null;
function persist(now = true) {
  if (!now) {
    // While streaming: at most every 500 ms.
    saveTimer ??= setTimeout(() => { saveTimer = null; persist(); }, 500);
    return;
  }
  clearTimeout(saveTimer);
  saveTimer = null;
  const error = store.save(data);
  if (error) setStatus(error, true);
}

function setStatus(text, bad = false) {
  el.status.textContent = text;
  el.status.classList.toggle('bad', bad);
}

// ---------- conversations ----------

function titleOf(c) {
  if (c.title) return c.title;
  const first = c.messages.find((m) => m.role === 'user');
  const text = first ? first.content.replace(/\s+/g, ' ').trim() : '';
  if (!text) return first?.images?.length ? 'Image' : 'New chat';
  return text.length > 60 ? `${text.slice(0, 59)}…` : text;
}

function createConversation() {
  const c = store.newConversation({ model: current()?.settings.model || models[0]?.id });
  data.conversations.unshift(c);
  data.current = c.id;
  persist();
  editing = null;
  drawAll();
  el.input.focus();
}

function switchTo(id) {
  if (data.current === id) return closeSidebar();
  data.current = id;
  editing = null;
  stick = true;
  persist();
  drawAll();
  closeSidebar();
}

function renameConversation(c, li) {
  const input = document.createElement('input');
  input.className = 'rename';
  input.value = titleOf(c);
  input.setAttribute('aria-label', 'Conversation name');
  li.replaceChildren(input);
  input.focus();
  input.select();
  let done = false;
  const finish = (keep) => {
    if (done) return;
    done = true;
    const name = input.value.trim();
    if (keep && name) { c.title = name.slice(0, 120); c.renamed = true; persist(); }
    drawSidebar();
    drawTitle();
  };
  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter') { e.preventDefault(); finish(true); }
    if (e.key === 'Escape') finish(false);
  });
  input.addEventListener('blur', () => finish(true));
}

async function deleteConversation(c) {
  if (!confirm(`Delete “${titleOf(c)}”? This cannot be undone.`)) return;
  const run = running.get(c.id);
  if (run) run.controller.abort();
  data.conversations = data.conversations.filter((x) => x.id !== c.id);
  if (data.current === c.id) data.current = data.conversations[0]?.id ?? null;
  persist();
  drawAll();
  api.deleteSession(c.sessionId, apiKey()).catch(() => { /* the server frees idle sessions anyway */ });
}

// ---------- generation ----------

function promptMessages(c, upTo) {
  const msgs = [];
  if (c.settings.system.trim()) msgs.push({ role: 'system', content: c.settings.system });
  for (const m of c.messages) {
    if (m === upTo) break;
    if (m.role === 'user' && m.images?.length) {
      // OpenAI's parts: the images, then the text.
      const parts = m.images.map((url) => ({ type: 'image_url', image_url: { url } }));
      if (m.content) parts.push({ type: 'text', text: m.content });
      msgs.push({ role: 'user', content: parts });
    } else if (m.role === 'user') msgs.push({ role: 'user', content: m.content });
    else if (m.role === 'assistant' && m.toolCalls?.length) {
      const calls = m.toolCalls.map((t) => ({ id: t.id, type: 'function', function: { name: t.name, arguments: t.arguments } }));
      msgs.push({ role: 'assistant', content: m.content || null, tool_calls: calls });
    } else if (m.role === 'assistant' && m.content) msgs.push({ role: 'assistant', content: m.content });
  }
  return msgs;
}

// The conversation's tools setting, as request fields: a JSON list of OpenAI tools (or one
// function), or an object with `tools` and `tool_choice` / `parallel_tool_calls`.
function toolFields(text) {
  if (!text || !text.trim()) return {};
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new api.ApiError(`The tools setting is not JSON: ${e.message}`);
  }
  const fields = Array.isArray(value) || !value.tools ? { tools: value } : { ...value };
  if (!Array.isArray(fields.tools)) fields.tools = [fields.tools];
  fields.tools = fields.tools.map((t) => (t.type === 'function' ? t : { type: 'function', function: t }));
  return fields;
}

function requestBody(c, answer) {
  const s = c.settings;
  const body = { model: s.model || models[0]?.id, messages: promptMessages(c, answer), session_id: c.sessionId };
  const num = (v) => (v === '' || v === null || v === undefined ? undefined : Number(v));
  if (num(s.temperature) !== undefined) body.temperature = num(s.temperature);
  if (num(s.top_p) !== undefined) body.top_p = num(s.top_p);
  if (num(s.max_tokens) !== undefined) body.max_tokens = num(s.max_tokens);
  Object.assign(body, toolFields(s.tools));
  return body;
}

async function generate(c) {
  const answer = { id: store.randomId('m-'), role: 'assistant', content: '', status: 'streaming', meta: {} };
  c.messages.push(answer);
  c.updated = Date.now();
  const run = { requestId: store.randomId('webui-'), controller: new AbortController(), message: answer, stopTimer: null };
  running.set(c.id, run);
  persist();
  stick = true;
  drawAll();
  let body;
  try {
    body = requestBody(c, answer);
  } catch (e) {
    body = { model: undefined };
    answer.status = 'error';
    answer.error = e.message;
  }
  answer.meta.model = body.model;
  const started = performance.now();
  let firstAt = null;
  try {
    if (answer.status === 'error') throw new api.ApiError(answer.error);
    if (!body.model) throw new api.ApiError('No model to ask: the server lists none (see the status below).');
    const result = await api.streamChat(body, {
      apiKey: apiKey(),
      requestId: run.requestId,
      signal: run.controller.signal,
      onStart: (id) => {
        answer.meta.requestId = id;
        run.requestId = id;
        if (el.status.classList.contains('bad')) refreshModels();
      },
      onDelta: (text) => {
        firstAt ??= performance.now();
        answer.content += text;
        redrawAnswer(c, answer);
        persist(false);
      },
      onReasoning: (text) => {
        firstAt ??= performance.now();
        answer.reasoning = (answer.reasoning || '') + text;
        redrawAnswer(c, answer);
        persist(false);
      },
      onToolCall: (piece) => {
        firstAt ??= performance.now();
        answer.toolCalls ??= [];
        const call = (answer.toolCalls[piece.index] ??= { id: '', name: '', arguments: '' });
        call.id += piece.id || '';
        call.name += piece.function?.name || '';
        call.arguments += piece.function?.arguments || '';
        redrawAnswer(c, answer);
        persist(false);
      },
    });
    const end = performance.now();
    const u = result.usage || {};
    Object.assign(answer.meta, {
      finishReason: result.finishReason,
      promptTokens: u.prompt_tokens,
      completionTokens: u.completion_tokens,
      cachedTokens: u.prompt_tokens_details?.cached_tokens ?? 0,
      ttftMs: firstAt !== null ? Math.round(firstAt - started) : null,
      tokensPerSec: firstAt !== null && u.completion_tokens > 1 && end > firstAt
        ? (u.completion_tokens - 1) / ((end - firstAt) / 1000) : null,
    });
    answer.status = result.finishReason === 'abort' ? 'stopped' : 'done';
  } catch (e) {
    if (e.name === 'AbortError') {
      answer.status = 'stopped';
      answer.meta.finishReason = 'abort';
    } else {
      answer.status = 'error';
      answer.error = e.message;
      if (e.status === 401) openSettings(true);
      if (!e.status) setStatus(e.message, true);
    }
  } finally {
    clearTimeout(run.stopTimer);
    running.delete(c.id);
    c.updated = Date.now();
    persist();
    if (data.current === c.id) drawMessages();
    drawSidebar();
    drawComposer();
  }
}

function stop() {
  const c = current();
  const run = c && running.get(c.id);
  if (!run || run.stopping) return;
  run.stopping = true;
  drawComposer();
  // Ask the server to end it (the stream then closes with finish_reason "abort"); if that
  // does not end the stream soon, drop the connection, which cancels it too.
  const hardStop = () => run.controller.abort();
  api.cancel(run.requestId, apiKey()).catch(hardStop);
  run.stopTimer = setTimeout(hardStop, 3000);
}

function send(text) {
  const c = current() || (createConversation(), current());
  if (running.has(c.id) || (!text.trim() && !attached.length)) return;
  const message = { id: store.randomId('m-'), role: 'user', content: text };
  if (attached.length) message.images = attached;
  c.messages.push(message);
  attached = [];
  drawAttachments();
  el.input.value = '';
  growInput();
  generate(c);
}

function regenerateLast(c) {
  if (running.has(c.id)) return;
  const last = c.messages[c.messages.length - 1];
  if (last && last.role !== 'user') c.messages.pop();
  generate(c);
}

function commitEdit(c, message, text) {
  if (running.has(c.id) || (!text.trim() && !message.images?.length)) return;
  const at = c.messages.indexOf(message);
  if (at < 0) return;
  message.content = text;
  c.messages.length = at + 1; // later messages are replaced by the new answer
  editing = null;
  generate(c);
}

// ---------- drawing ----------

function drawAll() {
  drawSidebar();
  drawTitle();
  drawSettings();
  drawMessages();
  drawComposer();
}

function drawTitle() {
  const c = current();
  el.title.textContent = c ? titleOf(c) : 'New chat';
  document.title = c && c.messages.length ? `${titleOf(c)} · llaisys` : 'llaisys';
}

function drawSidebar() {
  el.list.replaceChildren(...data.conversations.map((c) => {
    const li = document.createElement('li');
    li.className = 'conversation' + (c.id === data.current ? ' active' : '');
    li.dataset.id = c.id;
    const open = document.createElement('button');
    open.type = 'button';
    open.className = 'open';
    open.textContent = titleOf(c);
    open.title = titleOf(c);
    if (running.has(c.id)) open.prepend(Object.assign(document.createElement('span'), { className: 'dot', title: 'answering' }));
    open.addEventListener('click', () => switchTo(c.id));
    const rename = iconButton('✎', 'Rename', () => renameConversation(c, li));
    rename.classList.add('rename-btn');
    const del = iconButton('✕', 'Delete', () => deleteConversation(c));
    del.classList.add('delete-btn');
    li.append(open, rename, del);
    return li;
  }));
}

function iconButton(symbol, label, onClick) {
  const b = document.createElement('button');
  b.type = 'button';
  b.className = 'icon-btn small';
  b.textContent = symbol;
  b.title = label;
  b.setAttribute('aria-label', label);
  b.addEventListener('click', (e) => { e.stopPropagation(); onClick(); });
  return b;
}

function drawSettings() {
  const c = current();
  const s = c ? c.settings : { model: models[0]?.id || '', system: '', temperature: '', top_p: '', max_tokens: '', tools: '' };
  const ids = models.map((m) => m.id);
  const options = ids.includes(s.model) || !s.model ? ids : [...ids, s.model];
  el.model.replaceChildren(...options.map((id) => {
    const o = document.createElement('option');
    o.value = id;
    o.textContent = ids.includes(id) ? id : `${id} (not served)`;
    return o;
  }));
  el.model.value = s.model || ids[0] || '';
  el.system.value = s.system;
  el.temperature.value = s.temperature;
  el.topP.value = s.top_p;
  el.maxTokens.value = s.max_tokens;
  el.tools.value = s.tools || '';
  el.apiKey.value = apiKey();
  el.sessionId.textContent = c ? c.sessionId : '(created with the first message)';
}

function drawComposer() {
  const c = current();
  const run = c && running.get(c.id);
  el.send.hidden = !!run;
  el.stop.hidden = !run;
  el.stop.disabled = !!run?.stopping;
  el.stop.textContent = run?.stopping ? 'Stopping…' : 'Stop';
  // Images only for a model that sees them (its /v1/models entry says so).
  const id = c?.settings.model || models[0]?.id;
  el.attach.hidden = !models.find((m) => m.id === id)?.vision;
  if (el.attach.hidden && attached.length) {
    attached = [];
    drawAttachments();
  }
}

function drawAttachments() {
  el.attachments.hidden = !attached.length;
  el.attachments.replaceChildren(...attached.map((url, i) => {
    const item = document.createElement('div');
    item.className = 'attachment';
    const img = Object.assign(document.createElement('img'), { src: url, alt: `Image ${i + 1}` });
    const remove = iconButton('×', 'Remove this image', () => { attached.splice(i, 1); drawAttachments(); });
    item.append(img, remove);
    return item;
  }));
}

// Most pixels an attached image keeps, and most bytes it is kept as, before it is scaled down and
// stored as JPEG: the server's default bound (limits.max_image_pixels) scales larger ones anyway,
// and conversations (images included) live in this browser's storage.
const MAX_IMAGE_PIXELS = 1280 * 28 * 28;
const MAX_IMAGE_BYTES = 1 << 20;

async function prepareImage(file) {
  if (!/^image\/(png|jpeg|webp)$/.test(file.type)) throw new Error(`${file.name}: not a PNG, JPEG or WebP image`);
  const bitmap = await createImageBitmap(file).catch(() => { throw new Error(`${file.name}: the image could not be read`); });
  const { width, height } = bitmap;
  if (width * height <= MAX_IMAGE_PIXELS && file.size <= MAX_IMAGE_BYTES) {
    bitmap.close();
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result);
      reader.onerror = () => reject(new Error(`${file.name}: ${reader.error?.message || 'unreadable'}`));
      reader.readAsDataURL(file);
    });
  }
  const scale = Math.min(1, Math.sqrt(MAX_IMAGE_PIXELS / (width * height)));
  const canvas = Object.assign(document.createElement('canvas'), {
    width: Math.max(1, Math.floor(width * scale)), height: Math.max(1, Math.floor(height * scale)),
  });
  const ctx = canvas.getContext('2d');
  ctx.fillStyle = '#fff'; // JPEG has no transparency
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  ctx.drawImage(bitmap, 0, 0, canvas.width, canvas.height);
  bitmap.close();
  return canvas.toDataURL('image/jpeg', 0.9);
}

async function attachFiles(files) {
  for (const file of files) {
    try {
      attached.push(await prepareImage(file));
    } catch (e) {
      setStatus(e.message, true);
    }
  }
  drawAttachments();
}

function drawMessages() {
  const c = current();
  if (!c || !c.messages.length) {
    const hint = document.createElement('div');
    hint.className = 'empty';
    hint.innerHTML = '<h2>What can I help with?</h2><p>Answers stream from the model served by this llaisys ' +
      'server. Conversations stay in this browser.</p>';
    el.messages.replaceChildren(hint);
    return;
  }
  const last = c.messages[c.messages.length - 1];
  el.messages.replaceChildren(...c.messages.map((m) => messageNode(c, m, m === last)));
  if (data.warning) el.messages.prepend(noticeNode(data.warning));
  followBottom();
}

function noticeNode(text) {
  const n = document.createElement('div');
  n.className = 'notice';
  n.textContent = text;
  return n;
}

function messageNode(c, m, isLast) {
  const node = document.createElement('article');
  node.className = `message ${m.role} ${m.status || ''}`;
  node.dataset.id = m.id;
  const body = document.createElement('div');
  body.className = 'body';
  node.append(body);
  if (m.role === 'user') {
    // A message's images show above its text, while it is edited too (they stay with it).
    if (m.images?.length) {
      const images = document.createElement('div');
      images.className = 'images';
      images.append(...m.images.map((url, i) => Object.assign(document.createElement('img'), { src: url, alt: `Image ${i + 1}` })));
      node.prepend(images);
    }
    if (editing === m.id) return editNode(c, m, node);
    body.textContent = m.content;
    body.hidden = !m.content;
    const tools = document.createElement('div');
    tools.className = 'tools';
    const edit = iconButton('✎ Edit', 'Edit and regenerate from here', () => { editing = m.id; drawMessages(); });
    edit.classList.add('edit');
    edit.disabled = running.has(c.id);
    tools.append(edit);
    node.append(tools);
    return node;
  }
  body.classList.add('markdown');
  drawAnswerBody(body, m);
  if (m.status === 'error') node.append(Object.assign(noticeNode(m.error), { className: 'notice error', role: 'alert' }));
  if (m.status === 'stopped') node.append(Object.assign(noticeNode('Stopped.'), { className: 'notice muted' }));
  if (m.status === 'interrupted') node.append(Object.assign(noticeNode('Interrupted: the page was closed while this answer streamed.'), { className: 'notice muted' }));
  if (m.status !== 'streaming') {
    const tools = document.createElement('div');
    tools.className = 'tools';
    if (isLast && !running.has(c.id)) {
      const again = iconButton('↻ Regenerate', 'Regenerate this answer', () => regenerateLast(c));
      again.classList.add('regenerate');
      tools.append(again);
    }
    tools.append(debugNode(m));
    node.append(tools);
  }
  return node;
}

function editNode(c, m, node) {
  const area = document.createElement('textarea');
  area.className = 'edit-area';
  area.value = m.content;
  area.setAttribute('aria-label', 'Edit message');
  const save = Object.assign(document.createElement('button'), { type: 'button', className: 'btn primary save-edit', textContent: 'Save & regenerate' });
  const cancel = Object.assign(document.createElement('button'), { type: 'button', className: 'btn', textContent: 'Cancel' });
  save.addEventListener('click', () => commitEdit(c, m, area.value));
  cancel.addEventListener('click', () => { editing = null; drawMessages(); });
  area.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); commitEdit(c, m, area.value); }
    if (e.key === 'Escape') { editing = null; drawMessages(); }
  });
  const row = document.createElement('div');
  row.className = 'tools';
  row.append(save, cancel);
  node.querySelector('.body').replaceChildren(area);
  node.append(row);
  queueMicrotask(() => { area.focus(); area.style.height = `${area.scrollHeight}px`; });
  return node;
}

function debugNode(m) {
  const d = m.meta || {};
  const details = document.createElement('details');
  details.className = 'debug';
  const summary = document.createElement('summary');
  const parts = [];
  if (d.completionTokens !== undefined) parts.push(`${d.completionTokens} tokens`);
  if (d.tokensPerSec) parts.push(`${d.tokensPerSec.toFixed(1)} tok/s`);
  if (d.ttftMs !== null && d.ttftMs !== undefined) parts.push(`first token ${d.ttftMs} ms`);
  summary.textContent = parts.join(' · ') || 'details';
  const rows = [
    ['model', d.model], ['prompt tokens', d.promptTokens], ['completion tokens', d.completionTokens],
    ['prefix-cache hit tokens', d.cachedTokens], ['time to first token', d.ttftMs != null ? `${d.ttftMs} ms` : undefined],
    ['tokens/s', d.tokensPerSec ? d.tokensPerSec.toFixed(1) : undefined], ['finish reason', d.finishReason],
    ['request id', d.requestId],
  ].filter(([, v]) => v !== undefined && v !== null);
  const table = document.createElement('table');
  table.innerHTML = rows.map(([k, v]) => `<tr><th>${k}</th><td data-key="${k}">${escapeHtml(String(v))}</td></tr>`).join('');
  details.append(summary, table);
  return details;
}

// An answer's Markdown, below a reasoning model's thinking folded away; while it streams, a
// cursor at the end of its last block.
function drawAnswerBody(body, m) {
  body.innerHTML = markdown(m.content);
  if (m.reasoning) body.prepend(reasoningNode(m));
  for (const call of m.toolCalls || []) body.append(toolCallNode(call));
  if (m.status !== 'streaming') return;
  let at = body;
  while (at.lastElementChild && ['P', 'UL', 'OL', 'LI', 'BLOCKQUOTE', 'TABLE', 'TBODY', 'TR', 'TD'].includes(at.lastElementChild.tagName)) {
    at = at.lastElementChild;
  }
  at.append(Object.assign(document.createElement('span'), { className: 'cursor' }));
}

// A reasoning model's thinking, folded (its summary says so while it is still thinking).
function reasoningNode(m) {
  const details = document.createElement('details');
  details.className = 'reasoning';
  const summary = document.createElement('summary');
  summary.textContent = m.status === 'streaming' && !m.content && !m.toolCalls?.length ? 'Thinking…' : 'Thought';
  const text = document.createElement('div');
  text.className = 'reasoning-text';
  text.textContent = m.reasoning;
  details.append(summary, text);
  return details;
}

// A tool call the answer made: the function's name and its arguments (pretty-printed once
// they are whole JSON).
function toolCallNode(call) {
  const node = document.createElement('div');
  node.className = 'tool-call';
  const head = document.createElement('div');
  head.className = 'tool-call-name';
  head.textContent = `Tool call: ${call.name}`;
  const args = document.createElement('pre');
  let text = call.arguments;
  try {
    text = JSON.stringify(JSON.parse(call.arguments), null, 2);
  } catch {
    // still streaming: shown as it is so far
  }
  args.textContent = text;
  node.append(head, args);
  return node;
}

// One answer changed while streaming: redraw just its body, once per frame.
const pending = new Set();
function redrawAnswer(c, m) {
  if (data.current !== c.id) return;
  pending.add(m);
  if (pending.size > 1) return;
  requestAnimationFrame(() => {
    for (const msg of pending) {
      const body = el.messages.querySelector(`[data-id="${msg.id}"] .body`);
      if (!body) continue;
      drawAnswerBody(body, msg);
    }
    pending.clear();
    followBottom();
  });
}

function followBottom() {
  if (stick) el.messages.scrollTop = el.messages.scrollHeight;
  el.jump.hidden = stick;
}

// ---------- settings ----------

function openSettings(open = el.settings.hidden) {
  el.settings.hidden = !open;
  $('toggle-settings').setAttribute('aria-expanded', String(open));
}

function bindSetting(input, key, parse = (v) => v) {
  input.addEventListener('change', () => {
    const value = parse(input.value); // read first: a new conversation redraws the fields
    const c = current() || (createConversation(), current());
    c.settings[key] = value;
    persist();
    drawSettings();
    drawComposer();
  });
}

async function refreshModels() {
  try {
    models = await api.listModels(apiKey());
    setStatus(`Connected · ${models.map((m) => m.id).join(', ')}`);
  } catch (e) {
    models = [];
    setStatus(e.message, true);
    if (e.status === 401) openSettings(true);
  }
  drawSettings();
  drawComposer();
}

// ---------- layout ----------

function closeSidebar() {
  el.sidebar.classList.remove('open');
  el.scrim.hidden = true;
}

function growInput() {
  el.input.style.height = 'auto';
  el.input.style.height = `${Math.min(el.input.scrollHeight, window.innerHeight * 0.4)}px`;
}

// ---------- events ----------

el.composer.addEventListener('submit', (e) => { e.preventDefault(); send(el.input.value); });
el.input.addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(el.input.value); }
});
el.input.addEventListener('input', growInput);
el.stop.addEventListener('click', stop);
el.attach.addEventListener('click', () => el.attachFile.click());
el.attachFile.addEventListener('change', () => {
  attachFiles([...el.attachFile.files]);
  el.attachFile.value = ''; // the same file again is a change too
});
// Images pasted into the message box or dropped on the composer attach too, for a model that
// sees them; pasted text stays text.
const imageFiles = (transfer) => [...(transfer?.files || [])].filter((f) => f.type.startsWith('image/'));
el.input.addEventListener('paste', (e) => {
  const files = imageFiles(e.clipboardData);
  if (el.attach.hidden || !files.length) return;
  e.preventDefault();
  attachFiles(files);
});
el.composer.addEventListener('dragover', (e) => { if (!el.attach.hidden) e.preventDefault(); });
el.composer.addEventListener('drop', (e) => {
  const files = imageFiles(e.dataTransfer);
  if (el.attach.hidden || !files.length) return;
  e.preventDefault();
  attachFiles(files);
});
$('new-chat').addEventListener('click', () => { createConversation(); closeSidebar(); });
$('toggle-settings').addEventListener('click', () => openSettings());
$('toggle-sidebar').addEventListener('click', () => { el.sidebar.classList.add('open'); el.scrim.hidden = false; });
el.scrim.addEventListener('click', closeSidebar);
el.messages.addEventListener('scroll', () => {
  stick = el.messages.scrollHeight - el.messages.scrollTop - el.messages.clientHeight < 40;
  el.jump.hidden = stick;
});
el.jump.addEventListener('click', () => { stick = true; followBottom(); });
el.messages.addEventListener('click', async (e) => {
  const button = e.target.closest('[data-copy]');
  if (!button) return;
  const code = button.closest('.code').querySelector('code').textContent;
  try {
    await navigator.clipboard.writeText(code);
  } catch {
    // No clipboard API (plain http on another host): the old way.
    const t = Object.assign(document.createElement('textarea'), { value: code });
    document.body.append(t);
    t.select();
    document.execCommand('copy');
    t.remove();
  }
  button.textContent = 'Copied';
  setTimeout(() => { button.textContent = 'Copy'; }, 1500);
});
bindSetting(el.model, 'model');
bindSetting(el.system, 'system');
bindSetting(el.temperature, 'temperature');
bindSetting(el.topP, 'top_p');
bindSetting(el.maxTokens, 'max_tokens');
bindSetting(el.tools, 'tools');
el.apiKey.addEventListener('change', () => {
  prefs.apiKey = el.apiKey.value.trim();
  store.savePrefs(prefs);
  refreshModels();
});
window.addEventListener('storage', (e) => {
  // Another tab saved: take its conversations, unless this tab is streaming (then this tab's
  // next save wins; one writer at a time keeps the list whole).
  if ((e.key !== null && !e.key.startsWith('llaisys.conversations')) || running.size) return;
  Object.assign(data, store.load());
  if (!data.conversations.some((c) => c.id === data.current)) data.current = data.conversations[0]?.id ?? null;
  editing = null;
  drawAll();
});

if (!data.conversations.some((c) => c.id === data.current)) data.current = data.conversations[0]?.id ?? null;
drawAll();
refreshModels().then(() => {
  const c = current();
  if (c && !c.settings.model && models[0]) { c.settings.model = models[0].id; persist(); }
});
el.input.focus();
