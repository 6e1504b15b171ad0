// The Web UI's Markdown renderer (webui/markdown.js), run with `node --test` by tests/tests/webui.rs.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { render } from '../../webui/markdown.js';

test('model output can never inject markup', () => {
  const html = render('<script>alert(1)</script> <img src=x onerror=alert(1)> [x](javascript:alert(1)) **<b>**');
  assert.ok(!html.includes('<script') && !html.includes('<img') && !html.includes('href="javascript'));
  assert.ok(html.includes('&lt;script&gt;') && html.includes('<strong>&lt;b&gt;</strong>'));
  assert.ok(!render('[a](https://x.org/"onmouseover="alert(1))').includes('"onmouseover'));
});

test('fenced code keeps its text verbatim, with a language label and a copy button', () => {
  const html = render('Here:\n```python\ndef f(x):\n    return x * 2 < 3 and "**a**"\n```\nDone.');
  assert.ok(html.includes('<span>python</span>') && html.includes('data-copy'));
  assert.ok(html.includes('<code class="language-python">def f(x):\n    return x * 2 &lt; 3 and &quot;**a**&quot;</code>'));
  assert.ok(html.startsWith('<p>Here:</p>') && html.endsWith('<p>Done.</p>'));
});

test('an unclosed fence (still streaming) renders as code', () => {
  assert.ok(render('```js\nlet a = 1;').includes('<code class="language-js">let a = 1;</code>'));
});

test('headings, lists, quotes, rules, tables and inline spans', () => {
  assert.equal(render('# Title'), '<h1>Title</h1>');
  assert.equal(render('- a\n- b *c*'), '<ul><li>a</li><li>b <em>c</em></li></ul>');
  assert.equal(render('3. x\n4. y'), '<ol start="3"><li>x</li><li>y</li></ol>');
  assert.equal(render('> quoted'), '<blockquote><p>quoted</p></blockquote>');
  assert.equal(render('---'), '<hr>');
  assert.equal(render('use `a*b*c` ~~no~~ __yes__'), '<p>use <code>a*b*c</code> <del>no</del> <strong>yes</strong></p>');
  assert.equal(render('snake_case_name and 2*3*4'), '<p>snake_case_name and 2*3*4</p>');
  assert.equal(render('[docs](https://example.org/a?b=1&c=2)'),
    '<p><a href="https://example.org/a?b=1&amp;c=2" target="_blank" rel="noopener noreferrer">docs</a></p>');
  const table = render('| a | b |\n|---|:-:|\n| 1 | 2 |');
  assert.equal(table, '<div class="table"><table><thead><tr><th>a</th><th>b</th></tr></thead><tbody><tr><td>1</td><td>2</td></tr></tbody></table></div>');
});

test('line breaks inside a paragraph are kept; blank lines split paragraphs', () => {
  assert.equal(render('one\ntwo\n\nthree'), '<p>one<br>two</p>\n<p>three</p>');
});
