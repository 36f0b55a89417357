// `vesper serve` on a Hugging Face checkpoint directory (../shared/models/hf/stories260K): it
// serves under the directory's name and answers, streamed and not, with the same tokens as the
// GGUF file of the same weights; and on an EXL2 directory `vesper quantize --to exl2` writes.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, postJson, repoRoot, vesper } from './server_harness.mjs';

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

async function streamed(server, prompt, maxTokens = 32) {
  const res = await fetch(server.url + '/v1/completions', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, stream: true }),
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

// Every width the writer mixes: 2.5 (2- and 3-bit groups), 4.0 calibrated on text, 6.0 and 8.0.
// Under the sanitizers (VESPER_SANITIZED) 2.5 and 8.0 only: the memory of both ends.
const EXL2_RUNS = [['2.5'], ['4.0', '--calibration', path.join(shared, '..', 'data', 'tinystories-heldout.txt'),
  '--calibration-chunks', '4'], ['6.0'], ['8.0']]
  .filter(([bits]) => !process.env.VESPER_SANITIZED || bits === '2.5' || bits === '8.0');

for (const [bits, ...flags] of EXL2_RUNS) {
  test(`an EXL2 checkpoint written by vesper quantize at ${bits} bpw serves, streamed and not`, async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vesper-exl2-'));
    try {
      execFileSync(vesper, ['quantize', path.join(shared, 'hf', 'stories260K'), '--to', 'exl2', '--bits', bits,
        ...flags, '-o', dir], { stdio: 'pipe' });
      const exl2 = await startServer([], dir);
      try {
        const r = await postJson(exl2.url + '/v1/completions',
          { prompt: PROMPTS[0], max_tokens: 16, temperature: 0 });
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.usage.completion_tokens, 16);
        assert.ok(r.json.choices[0].text.length > 0);
        assert.equal(await streamed(exl2, PROMPTS[0], 16), r.json.choices[0].text);
      } finally { await exl2.stop(); }
    } finally { fs.rmSync(dir, { recursive: true, force: true }); }
  });
}
