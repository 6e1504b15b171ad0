// The conversations, kept in the browser's localStorage (one key, JSON) so a reload restores
// them. This module is the only place that reads or writes that storage.

const KEY = 'llaisys.conversations.v1';
const PREFS = 'llaisys.prefs.v1';

export function randomId(prefix) {
  // crypto.randomUUID needs a secure context; getRandomValues works on plain http too.
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return prefix + Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}

export function newConversation(defaults) {
  return {
    id: randomId('c-'),
    title: '',
    renamed: false,
    created: Date.now(),
    updated: Date.now(),
    sessionId: randomId('webui-'),
    settings: { model: defaults.model || '', system: '', temperature: '', top_p: '', max_tokens: '', tools: '' },
    messages: [],
  };
}

// { conversations: [...newest first], current: id }. Unreadable storage starts empty but is
// kept aside, never overwritten silently.
export function load() {
  let raw = null;
  try {
    raw = localStorage.getItem(KEY);
    if (!raw) return { conversations: [], current: null };
    const data = JSON.parse(raw);
    if (!Array.isArray(data.conversations)) throw new Error('no conversation list');
    for (const c of data.conversations) {
      // A stream that was running when the page went away cannot be resumed.
      for (const m of c.messages) if (m.status === 'streaming') m.status = 'interrupted';
    }
    return data;
  } catch (e) {
    if (raw) localStorage.setItem(`${KEY}.unreadable.${Date.now()}`, raw);
    return { conversations: [], current: null, warning: `Stored conversations could not be read (${e.message}); they were kept aside.` };
  }
}

// Returns an error message when the browser refuses to store (quota), else null.
export function save(data) {
  try {
    localStorage.setItem(KEY, JSON.stringify({ conversations: data.conversations, current: data.current }));
    return null;
  } catch (e) {
    return `Could not save the conversations in this browser: ${e.message}`;
  }
}

export function loadPrefs() {
  try {
    return JSON.parse(localStorage.getItem(PREFS)) || {};
  } catch {
    return {};
  }
}

export function savePrefs(prefs) {
  try {
    localStorage.setItem(PREFS, JSON.stringify(prefs));
  } catch {
    // Preferences are a convenience; the conversations' own save reports quota problems.
  }
}
