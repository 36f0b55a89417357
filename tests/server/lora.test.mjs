// `vesper serve` with LoRA and VeRA adapters on stories260K: greedy ids equal llama.cpp's (the
// verify files in ../shared/models/lora/) for zed, bim and merged adapters at several scales;
// PEFT equals GGUF; VeRA equals its reference; requests over several adapters batched together
// get exactly what each gets alone; adapters load and unload while serving; bad names and files
// get OpenAI errors and the server keeps serving.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { startServer, postJson, readSse, metrics, repoRoot, vesper } from './server_harness.mjs';

const models = path.join(repoRoot, '..', 'shared', 'models');
const stories = path.join(models, 'stories260K.gguf');
const rel = (p) => path.relative(repoRoot, path.join(models, p));
const verify = (file) => JSON.parse(fs.readFileSync(path.join(models, file), 'utf8'));

// Greedy completion of `promptIds` under `model`: the drawn ids.
async function greedyIds(url, model, promptIds, maxTokens) {
  const r = await postJson(url + '/v1/completions', {
    model, prompt: promptIds, max_tokens: maxTokens, temperature: 0, logprobs: 0,
    return_tokens_as_token_ids: true, ignore_eos: true,
  });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.model, model);
  return r.json.choices[0].logprobs.tokens.map((t) => Number(t.replace(/^token_id:/, '')));
}

// Every result of a verify file, through `model`.
async function checkVerifyFile(url, model, file) {
  const v = verify(file);
  for (const r of v.results) {
    if (r.llama_cpp) assert.ok(r.llama_cpp.ids_equal, `${file}: llama.cpp agreed with torch`);
    const ids = await greedyIds(url, model, r.prompt_ids, r.ids.length);
    assert.deepEqual(ids, r.ids, `${model} on "${r.prompt}" (${file})`);
  }
}

describe('named adapters (--lora-modules)', () => {
  let server;
  before(async () => {
    server = await startServer([
      '--enable-lora', '--max-loras', '4', '--max-lora-rank', '32', '--enable-lora-runtime-updating',
      '--lora-modules', `zed=${rel('lora/zed/adapter.gguf')}`, `bim=${rel('lora/bim/adapter.gguf')}`,
      `pzed=${rel('lora/zed')}`, `pbim=${rel('lora/bim')}`,
      JSON.stringify({ name: 'vzed', path: rel('vera/zed'), base_model_name: 'stories260K' }),
      '--lora-allowed-dirs', models, os.tmpdir(),
    ], stories);
  });
  after(async () => { await server?.stop(); });

  test('/v1/models lists the base model and each adapter with the base as parent', async () => {
    const r = await fetch(server.url + '/v1/models').then((res) => res.json());
    const ids = r.data.map((m) => m.id);
    assert.deepEqual(ids, ['stories260K', 'bim', 'pbim', 'pzed', 'vzed', 'zed']);
    for (const m of r.data.slice(1)) assert.equal(m.parent, 'stories260K');
    assert.equal(r.data[0].parent, null);
  });

  test('GGUF LoRA greedy ids equal llama.cpp\'s: base, zed, bim', async () => {
    await checkVerifyFile(server.url, 'stories260K', 'lora/verify_none.json');
    await checkVerifyFile(server.url, 'zed', 'lora/verify_zed-1.0.json');
    await checkVerifyFile(server.url, 'bim', 'lora/verify_bim-1.0.json');
  });

  test('PEFT LoRA (HF row order) gives the GGUF adapter\'s ids', async () => {
    await checkVerifyFile(server.url, 'pzed', 'lora/verify_zed-1.0.json');
    await checkVerifyFile(server.url, 'pbim', 'lora/verify_bim-1.0.json');
  });

  test('VeRA zed gives its reference ids', async () => {
    await checkVerifyFile(server.url, 'vzed', 'vera/verify_zed.json');
  });

  test('16 concurrent requests over zed, bim, VeRA zed and the base get what each gets alone', async () => {
    const names = ['zed', 'bim', 'vzed', 'stories260K'];
    const prompts = ['Once upon a time', 'One day, a little girl named', 'Once upon a time, there was a boy named',
      'The little dog'];
    const body = (model, prompt) => ({ model, prompt, max_tokens: 40, temperature: 0, ignore_eos: true });
    const alone = {};
    for (const m of names)
      for (const p of prompts) {
        const r = await postJson(server.url + '/v1/completions', body(m, p));
        assert.equal(r.status, 200, r.text);
        alone[m + '|' + p] = r.json.choices[0].text;
      }
    assert.notEqual(alone['zed|Once upon a time'], alone['stories260K|Once upon a time']);
    const jobs = [];
    for (const m of names)
      for (const p of prompts) jobs.push(postJson(server.url + '/v1/completions', body(m, p)).then((r) => [m, p, r]));
    for (const [m, p, r] of await Promise.all(jobs)) {
      assert.equal(r.status, 200, r.text);
      assert.equal(r.json.choices[0].text, alone[m + '|' + p], `${m} on "${p}"`);
    }
  });

  test('chat completions take the adapter from "model"', async () => {
    const r = await postJson(server.url + '/v1/chat/completions', {
      model: 'zed', messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 8, temperature: 0,
    });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.model, 'zed');
  });

  test('an unknown model is a 404 model_not_found naming what is served', async () => {
    const r = await postJson(server.url + '/v1/completions', { model: 'nope', prompt: 'Hi', max_tokens: 2 });
    assert.equal(r.status, 404);
    assert.equal(r.json.error.code, 'model_not_found');
    assert.equal(r.json.error.param, 'model');
    assert.match(r.json.error.message, /`nope` does not exist.*`zed`/);
  });

  test('adapters load and unload while serving; bad ones get a 400 naming the file', async () => {
    const load = (body) => postJson(server.url + '/v1/load_lora_adapter', body);
    const unload = (body) => postJson(server.url + '/v1/unload_lora_adapter', body);
    let r = await load({ lora_name: 'zed2', lora_path: rel('lora/zed/adapter.gguf') });
    assert.equal(r.status, 200, r.text);
    assert.match(r.text, /zed2/);
    r = await load({ lora_name: 'zed2', lora_path: rel('lora/zed/adapter.gguf') });
    assert.equal(r.status, 400);
    assert.match(r.json.error.message, /already loaded/);
    await checkVerifyFile(server.url, 'zed2', 'lora/verify_zed-1.0.json');

    // Unloading while a request streams with the adapter lets it finish with the adapter.
    const expected = (await postJson(server.url + '/v1/completions',
      { model: 'zed2', prompt: 'Once upon a time', max_tokens: 100, temperature: 0, ignore_eos: true })).json.choices[0].text;
    const res = await fetch(server.url + '/v1/completions', {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'zed2', prompt: 'Once upon a time', max_tokens: 100, temperature: 0,
        ignore_eos: true, stream: true }),
    });
    // The first token's chunk: the request runs with the adapter (the headers alone come before
    // the server has handed the request to the engine).
    const reader = res.body.getReader();
    const first = await reader.read();
    r = await unload({ lora_name: 'zed2' });
    assert.equal(r.status, 200, r.text);
    const rest = new ReadableStream({
      start(c) { if (!first.done) c.enqueue(first.value); },
      async pull(c) {
        const { value, done: end } = await reader.read();
        if (end) c.close();
        else c.enqueue(value);
      },
    });
    const { events, done } = await readSse(new Response(rest));
    assert.ok(done);
    assert.equal(events.map((e) => e.choices[0]?.text ?? '').join(''), expected);
    r = await postJson(server.url + '/v1/completions', { model: 'zed2', prompt: 'Hi', max_tokens: 2 });
    assert.equal(r.status, 404);
    r = await unload({ lora_name: 'zed2' });
    assert.equal(r.status, 404);

    r = await load({ lora_name: 'bad', lora_path: 'no/such/adapter.gguf' });
    assert.equal(r.status, 400);
    assert.match(r.json.error.message, /no\/such\/adapter\.gguf/);
    r = await load({ lora_name: 'model', lora_path: rel('stories260K.gguf') });
    assert.equal(r.status, 400);
    assert.match(r.json.error.message, /stories260K\.gguf.*not a readable LoRA adapter/);
    r = await load({ lora_name: 'draft', lora_path: rel('stories-draft.gguf') });
    assert.equal(r.status, 400);
    r = await load({ lora_name: 'medusa', lora_path: rel('medusa') });
    assert.equal(r.status, 400);
    assert.match(r.json.error.message, /adapter_config\.json/);
    // An adapter for another model's shapes, and one of a rank over --max-lora-rank 32.
    const other = path.join(os.tmpdir(), `vesper-lora-draft-${process.pid}.gguf`);
    const wide = path.join(os.tmpdir(), `vesper-lora-r64-${process.pid}.gguf`);
    execFileSync(vesper, ['synth', '--base', rel('stories-draft.gguf'), '--lora-rank', '4', '-o', other],
      { cwd: repoRoot, stdio: 'ignore' });
    execFileSync(vesper, ['synth', '--base', stories, '--lora-rank', '64', '-o', wide], { cwd: repoRoot, stdio: 'ignore' });
    r = await load({ lora_name: 'other', lora_path: other });
    assert.equal(r.status, 400);
    assert.match(r.json.error.message, /blk\.0\.attn_q\.weight\.lora_a has shape \[48, 4\], expected \[64, rank\]/);
    r = await load({ lora_name: 'wide', lora_path: wide });
    assert.equal(r.status, 400);
    assert.match(r.json.error.message, /rank 64, more than --max-lora-rank 32/);
    fs.rmSync(other, { force: true });
    fs.rmSync(wide, { force: true });
    r = await load({ lora_path: rel('lora/zed') });
    assert.equal(r.status, 400);
    assert.equal(r.json.error.param, 'lora_name');
    // Still serving.
    await checkVerifyFile(server.url, 'bim', 'lora/verify_bim-1.0.json');
  });
});

describe('merged adapters (--lora, --lora-scaled) apply to every request', () => {
  const cases = [
    { args: ['--lora', rel('lora/zed/adapter.gguf')], file: 'lora/verify_zed-1.0.json' },
    { args: ['--lora-scaled', rel('lora/zed/adapter.gguf'), '0.5'], file: 'lora/verify_zed-0.5.json' },
    { args: ['--lora-scaled', rel('lora/zed/adapter.gguf'), '0.5', '--lora-scaled', rel('lora/bim'), '0.5'],
      file: 'lora/verify_zed-0.5_bim-0.5.json' },
    { args: ['--lora', rel('lora/zed'), '--lora', rel('lora/bim/adapter.gguf')], file: 'lora/verify_zed-1.0_bim-1.0.json' },
  ];
  for (const c of cases) {
    test(`${c.args.join(' ')} gives ${c.file}`, async () => {
      const server = await startServer(c.args, stories);
      try {
        assert.match(server.logs, /merged into every request/);
        await checkVerifyFile(server.url, 'stories260K', c.file);
      } finally {
        await server.stop();
      }
    });
  }
});

describe('adapter limits', () => {
  test('--max-loras 1: requests for two adapters all finish, each with its own output', async () => {
    const server = await startServer(['--enable-lora', '--max-loras', '1',
      '--lora-modules', `zed=${rel('lora/zed/adapter.gguf')}`, `bim=${rel('lora/bim/adapter.gguf')}`], stories);
    try {
      const body = (model) => ({ model, prompt: 'Once upon a time', max_tokens: 24, temperature: 0, ignore_eos: true });
      const jobs = [];
      for (let i = 0; i < 6; ++i) jobs.push(postJson(server.url + '/v1/completions', body(i % 2 ? 'bim' : 'zed')));
      jobs.push(postJson(server.url + '/v1/completions', body('stories260K')));
      const out = await Promise.all(jobs);
      for (const r of out) assert.equal(r.status, 200, r.text);
      for (let i = 0; i < 6; ++i) assert.match(out[i].json.choices[0].text, i % 2 ? /Bim/ : /Zed/);
      assert.match(out[6].json.choices[0].text, /Lily/);
      const { text } = await metrics(server.url);
      assert.match(text, /vesper:lora_requests_info\{[^}]*max_lora="1"[^}]*\} /);
    } finally {
      await server.stop();
    }
  });

  test('a rank over --max-lora-rank and a corrupt adapter stop startup with the file named', async () => {
    await assert.rejects(startServer(['--enable-lora', '--lora-modules', `vzed=${rel('vera/zed')}`], stories),
      /vzed: .*vera\/zed\/adapter_config\.json has rank 32, more than --max-lora-rank 16/);
    await assert.rejects(startServer(['--enable-lora', '--lora-modules', `m=${rel('stories260K.gguf')}`], stories),
      /stories260K\.gguf: general\.type is absent/);
    await assert.rejects(startServer(['--lora-modules', `zed=${rel('lora/zed')}`], stories),
      /--lora-modules needs --enable-lora/);
  });
});
