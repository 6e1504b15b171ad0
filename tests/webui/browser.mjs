// The Web UI in Debian's headless Chromium, driven by playwright-core against a running
// llaisys server (started by tests/tests/webui.rs, which also computes the expected answers).
//
// Environment: LLAISYS_URL (the server), LLAISYS_EXPECTED (JSON {prompt: greedy answer} for the
// fixture model, the reasoning under "Think", the image's answer under "Image"), LLAISYS_FIXTURE,
// LLAISYS_SLOW, LLAISYS_TOOLS, LLAISYS_THINKING and LLAISYS_VISION (model names), LLAISYS_IMAGE (a PNG),
// LLAISYS_SCREENSHOTS (a folder).
// Protocol on stdio: prints "PASS <step>" per step; prints "STOP_SERVER" and waits for one line
// on stdin before the server-down step. Any failure exits non-zero with the reason on stderr.

import { chromium } from 'playwright-core';
import { mkdtempSync, mkdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import assert from 'node:assert/strict';

const URL = process.env.LLAISYS_URL;
const EXPECTED = JSON.parse(process.env.LLAISYS_EXPECTED);
const FIXTURE = process.env.LLAISYS_FIXTURE;
const SLOW = process.env.LLAISYS_SLOW;
const TOOLS = process.env.LLAISYS_TOOLS;
const THINKING = process.env.LLAISYS_THINKING;
const VISION = process.env.LLAISYS_VISION;
const IMAGE = process.env.LLAISYS_IMAGE;
const SHOTS = process.env.LLAISYS_SCREENSHOTS;
mkdirSync(SHOTS, { recursive: true });

const stdin = createInterface({ input: process.stdin });
const nextLine = () => new Promise((resolve) => stdin.once('line', resolve));
const pass = (step) => console.log(`PASS ${step}`);

const profile = mkdtempSync(join(tmpdir(), 'llaisys-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-dev-shm-usage'],
  viewport: { width: 1280, height: 800 },
  colorScheme: 'light',
});
context.setDefaultTimeout(20_000);
const page = context.pages()[0] ?? (await context.newPage());
const pageErrors = [];
page.on('pageerror', (e) => pageErrors.push(e.message));
page.on('dialog', (d) => d.accept());
// Nothing may be fetched from anywhere but the server.
const foreign = [];
page.on('request', (r) => { if (!r.url().startsWith(URL) && !r.url().startsWith('data:')) foreign.push(r.url()); });

const shot = (name) => page.screenshot({ path: join(SHOTS, `${name}.png`) });
const stored = () => page.evaluate(() => JSON.parse(localStorage.getItem('llaisys.conversations.v1')));
const storedCurrent = async () => { const d = await stored(); return d.conversations.find((c) => c.id === d.current); };
const lastAnswer = () => page.locator('.message.assistant').last();
const finished = (n = 1) => page.waitForFunction(
  (n) => document.querySelectorAll('.message.assistant:not(.streaming)').length >= n && !document.querySelector('.message.streaming'),
  n,
);
// The answer's HTML must be exactly what the page's own Markdown renderer makes of `text`.
const renderedAs = (text) => page.evaluate(async (text) => {
  const { render } = await import('/ui/markdown.js');
  return document.querySelector('.message.assistant:last-of-type .body').innerHTML === render(text);
}, text);
async function setField(selector, value) {
  if (!(await page.locator('#settings').isVisible())) await page.click('#toggle-settings');
  if (selector === '#set-model') await page.selectOption(selector, value);
  else await page.fill(selector, String(value));
  await page.locator(selector).dispatchEvent('change');
}
async function debugValue(key) {
  return (await lastAnswer().locator(`.debug td[data-key="${key}"]`).textContent()).trim();
}

try {
  // 1. Send a message; the streamed answer equals the greedy reference.
  await page.goto(URL);
  await page.waitForFunction(() => document.querySelector('#server-status').textContent.startsWith('Connected'));
  const models = await page.locator('#set-model option').allTextContents();
  assert.deepEqual(models.sort(), [FIXTURE, SLOW, TOOLS, THINKING, VISION].sort());
  await setField('#set-model', FIXTURE);
  await setField('#set-temperature', 0);
  await setField('#set-max-tokens', 40);
  await page.click('#toggle-settings');
  await page.fill('#input', 'Hello there');
  await page.press('#input', 'Enter');
  await finished();
  const hello = EXPECTED['Hello there'];
  let conv = await storedCurrent();
  assert.equal(conv.messages.length, 2);
  assert.equal(conv.messages[1].content, hello, 'the stored answer is the greedy reference');
  assert.ok(await renderedAs(hello), 'the shown answer is the reference, rendered');
  assert.equal(await page.inputValue('#input'), '');
  assert.match(await debugValue('request id'), /^webui-/);
  assert.equal(await debugValue('completion tokens'), String(conv.messages[1].meta.completionTokens));
  assert.ok(['stop', 'length'].includes(await debugValue('finish reason')));
  assert.equal(await debugValue('model'), FIXTURE);
  assert.ok(conv.messages[1].meta.ttftMs >= 0 && conv.messages[1].meta.promptTokens > 0);
  assert.equal(await page.textContent('#title'), 'Hello there');
  await lastAnswer().locator('details.debug summary').click();
  await shot('desktop-answer');
  pass('send and stream the greedy answer');

  // 2. A second conversation on the slow model: Stop ends the answer mid-way.
  await page.click('#new-chat');
  await setField('#set-model', SLOW);
  await setField('#set-max-tokens', 200);
  await page.click('#toggle-settings');
  // Record the answer's text each time it changes: it must grow step by step, each text a
  // prefix of the next (token-by-token streaming, nothing reordered).
  await page.evaluate(() => {
    window.__texts = [];
    new MutationObserver(() => {
      const t = document.querySelector('.message.assistant .body')?.textContent;
      if (t !== undefined && t !== window.__texts.at(-1)) window.__texts.push(t);
    }).observe(document.querySelector('#messages'), { subtree: true, childList: true, characterData: true });
  });
  await page.fill('#input', 'Count to two hundred, slowly');
  await page.click('#send');
  await page.waitForFunction(() => window.__texts.filter((t) => t.length).length >= 4);
  assert.ok(await page.locator('#stop').isVisible());
  await shot('desktop-streaming');
  await page.click('#stop');
  await finished();
  await page.locator('.message.assistant .notice', { hasText: 'Stopped.' }).waitFor();
  conv = await storedCurrent();
  const stopped = conv.messages[1];
  assert.equal(stopped.status, 'stopped');
  assert.equal(stopped.meta.finishReason, 'abort');
  const texts = await page.evaluate(() => window.__texts.filter((t) => t.length));
  texts.forEach((t, i) => i && assert.ok(t.startsWith(texts[i - 1]), `streamed text ${i} extends the one before`));
  assert.ok(stopped.content.length > 0 && stopped.meta.completionTokens < 200, `stopped after ${stopped.meta.completionTokens} tokens`);
  assert.ok(await page.locator('#send').isVisible());
  assert.ok(!(await page.locator('#stop').isVisible()));
  pass('stop a long generation');

  // 3. Switch back and forth; reload; both conversations are intact and never mixed.
  const items = page.locator('#conversations .conversation');
  assert.equal(await items.count(), 2);
  await items.filter({ hasText: 'Hello there' }).locator('.open').click();
  assert.ok(await renderedAs(hello));
  assert.equal(await page.locator('.message').count(), 2);
  await items.filter({ hasText: 'Count to two' }).locator('.open').click();
  assert.equal(await page.locator('.message.user .body').textContent(), 'Count to two hundred, slowly');
  await page.reload();
  await page.waitForFunction(() => document.querySelector('#server-status').textContent.startsWith('Connected'));
  assert.equal(await items.count(), 2);
  assert.equal(await page.locator('.message.user .body').textContent(), 'Count to two hundred, slowly');
  assert.equal((await storedCurrent()).messages[1].content, stopped.content);
  await items.filter({ hasText: 'Hello there' }).locator('.open').click();
  assert.ok(await renderedAs(hello));
  pass('switch conversations and reload');

  // 4. Edit the first message and regenerate from there; then regenerate the last answer.
  await page.locator('.message.user').first().hover();
  await page.locator('.message.user .edit').first().click();
  await page.fill('.edit-area', 'Tell me a story');
  await page.click('.save-edit');
  await finished();
  const story = EXPECTED['Tell me a story'];
  conv = await storedCurrent();
  assert.deepEqual(conv.messages.map((m) => m.role), ['user', 'assistant']);
  assert.equal(conv.messages[0].content, 'Tell me a story');
  assert.equal(conv.messages[1].content, story);
  assert.ok(await renderedAs(story));
  const firstId = conv.messages[1].meta.requestId;
  await page.click('.message.assistant .regenerate');
  await finished();
  conv = await storedCurrent();
  assert.equal(conv.messages.length, 2);
  assert.equal(conv.messages[1].content, story, 'greedy regenerates the same answer');
  assert.notEqual(conv.messages[1].meta.requestId, firstId);
  assert.ok(conv.messages[1].meta.cachedTokens > 0, 'the session reused its KV cells');
  pass('edit and regenerate');

  // 5. Rename and delete in the sidebar.
  await items.filter({ hasText: 'Tell me a story' }).locator('.rename-btn').click();
  await page.fill('#conversations input.rename', 'Stories');
  await page.press('#conversations input.rename', 'Enter');
  assert.equal(await page.textContent('#title'), 'Stories');
  await page.click('#new-chat');
  assert.equal(await items.count(), 3);
  await items.first().locator('.delete-btn').click();
  assert.equal(await items.count(), 2);
  await page.reload();
  assert.deepEqual((await items.allTextContents()).map((t) => t.replace(/[✎✕]/gu, '').trim()).sort(), ['Count to two hundred, slowly', 'Stories']);
  pass('rename and delete conversations');

  // 6. Screens: dark theme, mobile with and without the drawer.
  await items.filter({ hasText: 'Stories' }).locator('.open').click();
  await page.emulateMedia({ colorScheme: 'dark' });
  await shot('desktop-dark');
  await page.emulateMedia({ colorScheme: 'light' });
  await page.setViewportSize({ width: 390, height: 844 });
  await page.waitForTimeout(300); // the drawer slides
  const drawerShown = async () => { const b = await page.locator('#sidebar').boundingBox(); return b.x + b.width > 1; };
  assert.ok(!(await drawerShown()), 'the drawer is closed on mobile');
  await shot('mobile-chat');
  await page.click('#toggle-sidebar');
  await page.waitForTimeout(300);
  assert.ok(await drawerShown());
  await shot('mobile-sidebar');
  await page.click('#scrim', { position: { x: 370, y: 400 } });
  await page.setViewportSize({ width: 1280, height: 800 });
  pass('dark and mobile layouts');

  // 6b. Tools: the answer's tool call shows as its name and arguments, never as raw tags.
  await page.click('#new-chat');
  await setField('#set-model', TOOLS);
  await setField('#set-temperature', 1);
  await setField('#set-max-tokens', 150);
  const weather = {
    name: 'get_weather',
    description: 'Current weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 8 } }, required: ['city'], additionalProperties: false },
  };
  await setField('#set-tools', JSON.stringify({ tools: [weather], tool_choice: 'required', parallel_tool_calls: false }));
  await page.click('#toggle-settings');
  await page.fill('#input', 'Weather in Paris?');
  await page.press('#input', 'Enter');
  await finished();
  const call = lastAnswer().locator('.tool-call');
  assert.equal(await call.count(), 1);
  assert.equal((await call.locator('.tool-call-name').textContent()).trim(), 'Tool call: get_weather');
  const args = JSON.parse(await call.locator('pre').textContent());
  assert.deepEqual(Object.keys(args), ['city']);
  assert.ok(!(await lastAnswer().textContent()).includes('<tool_call>'));
  assert.equal(await debugValue('finish reason'), 'tool_calls');
  const saved = (await storedCurrent()).messages.at(-1);
  assert.equal(saved.toolCalls[0].name, 'get_weather');
  assert.deepEqual(JSON.parse(saved.toolCalls[0].arguments), args);
  await shot('desktop-tool-call');
  pass('tool calls are shown');

  // 6c. A reasoning model: its thinking is folded above the answer, closed, and kept.
  await page.click('#new-chat');
  await setField('#set-model', THINKING);
  await setField('#set-temperature', 0);
  await setField('#set-max-tokens', 12);
  await setField('#set-tools', '');
  await page.click('#toggle-settings');
  await page.fill('#input', 'Think');
  await page.press('#input', 'Enter');
  await finished();
  const thought = lastAnswer().locator('details.reasoning');
  assert.equal(await thought.count(), 1);
  assert.equal(await thought.evaluate((d) => d.open), false, 'the thinking starts folded');
  assert.equal((await thought.locator('summary').textContent()).trim(), 'Thought');
  assert.equal(await thought.locator('.reasoning-text').textContent(), EXPECTED.Think);
  assert.equal((await storedCurrent()).messages.at(-1).reasoning, EXPECTED.Think);
  await thought.locator('summary').click();
  await shot('desktop-reasoning');
  await items.filter({ hasText: 'Stories' }).locator('.open').click();
  pass('reasoning is folded above the answer');

  // 6d. A model that sees images: the attach button shows for it (not for a text model); the
  // attached image shows in the composer, goes with the message, shows in it and is kept; the
  // answer is the API's for the same image, and again after the message is edited.
  await page.click('#new-chat');
  await setField('#set-model', FIXTURE);
  assert.equal(await page.locator('#attach').isVisible(), false, 'a text model takes no images');
  await setField('#set-model', VISION);
  await setField('#set-temperature', 0);
  await setField('#set-max-tokens', 8);
  await page.click('#toggle-settings');
  assert.ok(await page.locator('#attach').isVisible());
  // Pasted into the message box, an image attaches (and is removed again here)...
  await page.evaluate(async (bytes) => {
    const data = new DataTransfer();
    data.items.add(new File([new Uint8Array(bytes)], 'pasted.png', { type: 'image/png' }));
    document.querySelector('#input').dispatchEvent(new ClipboardEvent('paste', { clipboardData: data, bubbles: true, cancelable: true }));
  }, [...readFileSync(IMAGE)]);
  await page.locator('.attachment img').waitFor();
  await page.locator('.attachment button').click();
  assert.equal(await page.locator('.attachment').count(), 0, 'a removed image leaves the composer');
  // ... and so does one chosen with the button's file picker.
  await page.setInputFiles('#attach-file', IMAGE);
  await page.locator('.attachment img').waitFor();
  await page.fill('#input', 'Describe');
  await shot('desktop-image-attached');
  await page.press('#input', 'Enter');
  await finished();
  assert.equal(await page.locator('.attachment').count(), 0, 'a sent image leaves the composer');
  assert.equal(await page.locator('.message.user .images img').count(), 1);
  const seen = await storedCurrent();
  assert.equal(seen.messages[0].images.length, 1);
  assert.match(seen.messages[0].images[0], /^data:image\/png;base64,/);
  assert.equal(seen.messages[1].content, EXPECTED.Image, 'the answer is the API\'s for the same image');
  await shot('desktop-image');
  // Edited, the message keeps its image (shown while editing) and gets the same answer again.
  await page.locator('.message.user .edit').click();
  assert.equal(await page.locator('.message.user .images img').count(), 1, 'the image shows while editing');
  await page.locator('.edit-area').fill('Describe');
  await page.locator('.save-edit').click();
  await finished();
  const edited = await storedCurrent();
  assert.equal(edited.messages.length, 2);
  assert.equal(edited.messages[0].images.length, 1);
  assert.equal(edited.messages[1].content, EXPECTED.Image);
  await items.filter({ hasText: 'Stories' }).locator('.open').click();
  pass('images are attached and sent');

  // 7. The server goes away: the error shows in the conversation, the page stays usable and the
  // history is kept.
  console.log('STOP_SERVER');
  await nextLine();
  const before = (await storedCurrent()).messages.length;
  await page.fill('#input', 'Are you still there?');
  await page.press('#input', 'Enter');
  const error = page.locator('.message.assistant .notice.error');
  await error.waitFor();
  assert.match(await error.textContent(), /Cannot reach the server|503/);
  assert.ok(await page.locator('#send').isVisible() && await page.locator('#input').isEditable());
  conv = await storedCurrent();
  assert.equal(conv.messages.length, before + 2);
  assert.equal(conv.messages[before].content, 'Are you still there?');
  assert.equal(conv.messages[1].content, story);
  await shot('desktop-server-down');
  pass('server down is shown');

  assert.deepEqual(pageErrors, [], 'no script errors');
  assert.deepEqual(foreign, [], 'nothing loaded from elsewhere');
  pass('all');
} catch (e) {
  await shot('failure').catch(() => {});
  console.error(e.stack || e);
  process.exitCode = 1;
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
  stdin.close();
}
