// `vesper serve` on a Hugging Face checkpoint directory (../shared/models/hf/stories260K): it
// serves under the directory's name and answers, streamed and not, with the same tokens as the
// GGUF file of the same weights.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { startServer, postJson, repoRoot } from './server_harness.mjs';

const shared = path.join(repoRoot, '..', 'shared', 'models');
const PROMPTS = ['Once upon a time', 'Lily and Tom went to the park', 'The cat sat on the'];

async function answers(server) {
  const out = [];
  for (const prompt of PROMPTS) {
    const r = await postJson(server.url + '/v1/completions',
      { prompt, max_tokens: 32, temperature: 0, logprobs: 1 });
    assert.equal(r.status, 200, r.text);
    out.push({ text: r.json.choices[0].text, tokens: r.json.choices[0].logprobs.tokens });
  }
  return out;
}

async function streamed(server, prompt) {
  const res = await fetch(server.url + '/v1/completions', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: 32, temperature: 0, stream: true }),
  });
  assert.equal(res.status, 200);
  let text = '';
  for (const line of (await res.text()).split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    text += JSON.parse(line.slice(6)).choices[0].text;
  }
  return text;
}

let fromGguf;
before(async () => {
  const server = await startServer([], path.join(shared, 'stories260K.gguf'));
  try { fromGguf = await answers(server); } finally { await server.stop(); }
});

let hf;
before(async () => { hf = await startServer([], path.join(shared, 'hf', 'stories260K') + '/'); });
after(async () => { await hf?.stop(); });

test('a checkpoint directory serves under its name', async () => {
  const models = await (await fetch(hf.url + '/v1/models')).json();
  assert.deepEqual(models.data.map((m) => m.id), ['stories260K']);
});

test('completions equal the GGUF model\'s token for token, streamed and not', async () => {
  assert.deepEqual(await answers(hf), fromGguf);
  assert.equal(await streamed(hf, PROMPTS[0]), fromGguf[0].text);
});
