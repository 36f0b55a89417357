// KV sparsity through `vesper serve` on stories260K, with sinks + window (--kv-window 16
// --kv-sink-tokens 4) and with Quest (--kv-sparsity quest --kv-sparse-budget 48): long outputs
// differ from a dense server's, a request with "kv_sparsity": "none" gets exactly the dense answer,
// concurrent clients get the answers they get alone, and a bad kv_sparsity value is a 400 naming
// the field.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, postJson } from './server_harness.mjs';

let windowed, quest, dense;
before(async () => {
  windowed = await startServer(['--kv-window', '16', '--kv-sink-tokens', '4']);
  quest = await startServer(['--kv-sparsity', 'quest', '--kv-sparse-budget', '48']);
  dense = await startServer([]);
});
after(async () => { await windowed?.stop(); await quest?.stop(); await dense?.stop(); });

const PROMPTS = ['Once upon a time', 'Lily and Ben went to the park.', 'The cat was very hungry.'];
const complete = (server, prompt, extra = {}) => postJson(server.url + '/v1/completions',
  { prompt, max_tokens: 120, temperature: 0, ignore_eos: true, ...extra });

for (const [name, server] of [['the window', () => windowed], ['Quest', () => quest]]) {
  test(`${name} changes long outputs; kv_sparsity "none" is the dense answer`, async () => {
    let differ = 0;
    for (const prompt of PROMPTS) {
      const d = await complete(dense, prompt);
      const w = await complete(server(), prompt);
      const optOut = await complete(server(), prompt, { kv_sparsity: 'none' });
      const auto = await complete(server(), prompt, { kv_sparsity: 'auto' });
      for (const r of [d, w, optOut, auto]) assert.equal(r.status, 200, r.text);
      assert.equal(optOut.json.choices[0].text, d.json.choices[0].text, prompt);
      assert.equal(auto.json.choices[0].text, w.json.choices[0].text, prompt);
      if (w.json.choices[0].text !== d.json.choices[0].text) ++differ;
    }
    assert.ok(differ > 0, `${name} gave every 120-token output the dense text`);
  });
}

test('concurrent clients get the answers they get alone', async () => {
  const alone = [];
  for (const prompt of PROMPTS) alone.push((await complete(windowed, prompt)).json.choices[0].text);
  const together = await Promise.all(PROMPTS.map((prompt) => complete(windowed, prompt)));
  together.forEach((r, i) => assert.equal(r.json.choices[0].text, alone[i], PROMPTS[i]));
});

test('a bad kv_sparsity is a 400 naming the field', async () => {
  for (const value of ['quest', 7, '']) {
    const r = await complete(windowed, 'Once', { kv_sparsity: value, max_tokens: 2 });
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.error.param, 'kv_sparsity');
    assert.equal(r.json.error.type, 'invalid_request_error');
  }
});
