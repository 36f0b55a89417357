// Prefix caching through `vesper serve` on stories260K: a multi-turn chat reuses its history
// (usage.prompt_tokens_details.cached_tokens), a shared system prompt is served from the cache
// to concurrent clients, outputs equal those computed without the cache
// (skip_reading_prefix_cache), cache_salt isolates tenants, the prefix cache metrics count it,
// and the new fields reject bad values with OpenAI's error JSON.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, postJson, metrics } from './server_harness.mjs';

let server;
before(async () => { server = await startServer(['--max-num-seqs', '32']); });
after(async () => { await server?.stop(); });

const BLOCK = 16;  // the default --block-size
const SYSTEM = 'You are a storyteller. Once upon a time there was a little girl named Lily. She loved to play ' +
  'outside in the park with her dog. One day, she saw a big red ball under a tree. The sun was hot and bright, ' +
  'and the birds were singing in the sky.';

async function chat(messages, extra = {}) {
  const r = await postJson(server.url + '/v1/chat/completions',
    { messages, max_tokens: 24, temperature: 0, ...extra });
  assert.equal(r.status, 200, r.text);
  return r.json;
}

test('a multi-turn chat reuses its history and answers as without the cache', async () => {
  const messages = [{ role: 'system', content: SYSTEM }, { role: 'user', content: 'Tell me about Lily.' }];
  let previousPromptTokens = 0;
  for (let turn = 0; turn < 4; ++turn) {
    const cached = await chat(messages);
    const fresh = await chat(messages, { skip_reading_prefix_cache: true });
    assert.equal(fresh.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal(cached.choices[0].message.content, fresh.choices[0].message.content, `turn ${turn}`);
    const { prompt_tokens: promptTokens, prompt_tokens_details: { cached_tokens: hit } } = cached.usage;
    assert.equal(hit % BLOCK, 0);
    assert.ok(hit < promptTokens, 'the last prompt token is always computed');
    if (turn > 0) {
      // The previous turn's prompt (and more) was cached, less at most one partial block.
      assert.ok(hit >= previousPromptTokens - BLOCK, `turn ${turn}: ${hit} cached of ${promptTokens}`);
    }
    previousPromptTokens = promptTokens;
    messages.push({ role: 'assistant', content: cached.choices[0].message.content });
    messages.push({ role: 'user', content: `And then what happened, part ${turn + 2}?` });
  }
});

test('concurrent clients share a system prompt; metrics count the hits', async () => {
  const before = (await metrics(server.url)).values;
  const prefix = SYSTEM + ' ' + SYSTEM;
  const first = await postJson(server.url + '/v1/completions', { prompt: prefix + ' Tom', max_tokens: 4, temperature: 0 });
  assert.equal(first.status, 200, first.text);
  const shared = first.json.usage.prompt_tokens - BLOCK;  // a lower bound on the cacheable prefix
  const names = ['Ben', 'Sue', 'Max', 'Mia', 'Sam', 'Zoe', 'Tim', 'Amy'];
  const results = await Promise.all(names.map((name) => postJson(server.url + '/v1/completions',
    { prompt: `${prefix} ${name}`, max_tokens: 12, temperature: 0 })));
  const fresh = await Promise.all(names.map((name) => postJson(server.url + '/v1/completions',
    { prompt: `${prefix} ${name}`, max_tokens: 12, temperature: 0, skip_reading_prefix_cache: true })));
  let hits = 0;
  results.forEach((r, i) => {
    assert.equal(r.status, 200, r.text);
    assert.ok(r.json.usage.prompt_tokens_details.cached_tokens >= shared - BLOCK, r.text);
    assert.equal(r.json.choices[0].text, fresh[i].json.choices[0].text);
    hits += r.json.usage.prompt_tokens_details.cached_tokens;
  });
  const after = (await metrics(server.url)).values;
  assert.ok(after['vesper:prefix_cache_hits_total'] - before['vesper:prefix_cache_hits_total'] >= hits);
  assert.ok(after['vesper:prefix_cache_queries_total'] > after['vesper:prefix_cache_hits_total']);
  assert.ok(after['vesper:gpu_prefix_cache_hit_rate'] > 0 && after['vesper:gpu_prefix_cache_hit_rate'] < 1);
  assert.ok(after['vesper:kv_cache_blocks_cached'] > 0);
  // Cached blocks nobody uses are not "in use".
  assert.equal(after['vesper:kv_cache_blocks_used'], 0);
});

test('cache_salt isolates requests; bad prefix-cache fields get 400 naming the field', async () => {
  const prompt = SYSTEM + ' The end.';
  const ask = (extra) => postJson(server.url + '/v1/completions', { prompt, max_tokens: 2, temperature: 0, ...extra });
  assert.equal((await ask({})).status, 200);
  const salted = await ask({ cache_salt: 'tenant-a' });
  assert.equal(salted.json.usage.prompt_tokens_details.cached_tokens, 0);
  const again = await ask({ cache_salt: 'tenant-a' });
  assert.ok(again.json.usage.prompt_tokens_details.cached_tokens > 0);
  const other = await ask({ cache_salt: 'tenant-b' });
  assert.equal(other.json.usage.prompt_tokens_details.cached_tokens, 0);
  for (const [body, param] of [[{ cache_salt: '' }, 'cache_salt'], [{ cache_salt: 7 }, 'cache_salt'],
    [{ skip_reading_prefix_cache: 'yes' }, 'skip_reading_prefix_cache']]) {
    const r = await ask(body);
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.error.param, param);
    assert.equal(r.json.error.type, 'invalid_request_error');
  }
});
