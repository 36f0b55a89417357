// End-to-end tests of `vesper serve` on stories260K over real HTTP on 127.0.0.1: completions and
// chat, streaming and not, equality with `vesper generate`, 300 concurrent streaming clients,
// disconnects freeing KV blocks, every bad input's status and error JSON while a good request
// runs, admission control, API keys, metrics (the engine step phases among them),
// tokenize/detokenize, graceful SIGTERM, and the engine loop's modes (async scheduling and
// multi-step scheduling, output processing on the engine thread) answering alike.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { startServer, postJson, readSse, metrics, generateJson, vesper, repoRoot, waitForRequests } from './server_harness.mjs';

let server;
before(async () => { server = await startServer(['--max-num-seqs', '64']); });
after(async () => { await server?.stop(); });

const MODEL = 'stories260K-f32';

test('GET /health, /v1/models and /metrics answer', async () => {
  assert.equal((await fetch(server.url + '/health')).status, 200);
  const models = await (await fetch(server.url + '/v1/models')).json();
  assert.equal(models.object, 'list');
  assert.equal(models.data[0].id, MODEL);
  assert.equal(models.data[0].max_model_len, 2048);
  const { text } = await metrics(server.url);
  for (const name of ['vesper:num_requests_running', 'vesper:num_requests_waiting', 'vesper:num_requests_swapped',
    'vesper:kv_cache_usage_perc', 'vesper:prompt_tokens_total', 'vesper:generation_tokens_total',
    'vesper:num_preemptions_total', 'vesper:time_to_first_token_seconds_bucket',
    'vesper:time_per_output_token_seconds_bucket', 'vesper:e2e_request_latency_seconds_bucket',
    'vesper:request_prompt_tokens_bucket', 'vesper:request_generation_tokens_bucket']) {
    assert.ok(text.includes(name), `metrics lack ${name}`);
  }
});

test('/metrics has where each engine step spent its time, by phase', async () => {
  const r = await postJson(server.url + '/v1/completions', { prompt: 'Once upon a time', max_tokens: 8, temperature: 0 });
  assert.equal(r.status, 200, r.text);
  const { text } = await metrics(server.url);
  for (const phase of ['schedule', 'batch_build', 'forward', 'sample', 'propose', 'output']) {
    const count = text.match(new RegExp(`^vesper:engine_step_phase_seconds_count\\{[^}]*phase="${phase}"\\} (\\d+)$`, 'm'));
    assert.ok(count, `no phase ${phase} in /metrics`);
    assert.ok(Number(count[1]) >= 8, `phase ${phase}: ${count[1]} steps observed`);
  }
  const forward = text.match(/^vesper:engine_step_phase_seconds_sum\{[^}]*phase="forward"\} ([0-9.eE+-]+)$/m);
  assert.ok(Number(forward[1]) > 0, 'the forward passes took no time');
});

test('the engine loop modes give the same greedy and streamed output', async () => {
  const request = { prompt: 'Tom and his dog went to the beach.', max_tokens: 48, temperature: 0, stop: ['park'] };
  const expected = await postJson(server.url + '/v1/completions', request);
  assert.equal(expected.status, 200, expected.text);
  for (const flags of [['--async-scheduling', '--num-scheduler-steps', '8'], ['--disable-async-output-proc', '--num-scheduler-steps', '2']]) {
    const s = await startServer(flags);
    try {
      assert.match(s.logs, flags[0] === '--async-scheduling' ? /async scheduling on/ : /output processing synchronous/);
      const plain = await postJson(s.url + '/v1/completions', request);
      assert.equal(plain.status, 200, plain.text);
      assert.equal(plain.json.choices[0].text, expected.json.choices[0].text, flags.join(' '));
      assert.equal(plain.json.choices[0].finish_reason, expected.json.choices[0].finish_reason);
      const res = await fetch(s.url + '/v1/completions', {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ ...request, stream: true }),
      });
      const { events, done } = await readSse(res);
      assert.ok(done, 'no [DONE]');
      assert.equal(events.map((e) => e.choices[0]?.text ?? '').join(''), expected.json.choices[0].text, flags.join(' '));
    } finally {
      await s.stop();
    }
  }
});

test('greedy completion equals vesper generate', async () => {
  const expected = await generateJson('Once upon a time', 40);
  const r = await postJson(server.url + '/v1/completions',
    { model: MODEL, prompt: 'Once upon a time', max_tokens: 40, temperature: 0 });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.object, 'text_completion');
  assert.equal(r.json.choices[0].text, expected.text);
  assert.equal(r.json.choices[0].finish_reason, 'length');
  assert.deepEqual(r.json.usage, { prompt_tokens: expected.prompt_token_ids.length, completion_tokens: 40,
    total_tokens: expected.prompt_token_ids.length + 40, prompt_tokens_details: { cached_tokens: 0 } });
});

test('streaming completion: deltas add up to the same text, then usage and [DONE]', async () => {
  const plain = await postJson(server.url + '/v1/completions',
    { prompt: 'The little dog', max_tokens: 30, temperature: 0 });
  const res = await fetch(server.url + '/v1/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'The little dog', max_tokens: 30, temperature: 0, stream: true,
      stream_options: { include_usage: true } }),
  });
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type'), /text\/event-stream/);
  const { events, done } = await readSse(res);
  assert.ok(done, 'no [DONE]');
  const text = events.filter((e) => e.choices.length).map((e) => e.choices[0].text).join('');
  assert.equal(text, plain.json.choices[0].text);
  const finals = events.filter((e) => e.choices.length && e.choices[0].finish_reason);
  assert.equal(finals.length, 1);
  assert.equal(finals[0].choices[0].finish_reason, 'length');
  assert.equal(events.at(-1).usage.completion_tokens, 30);
});

test('prompt arrays, token-id prompts, n > 1, echo and logprobs', async () => {
  const ids = (await postJson(server.url + '/tokenize', { prompt: 'Once upon a time' })).json.tokens;
  assert.deepEqual(ids, [1, 403, 407, 261, 378]);
  const back = await postJson(server.url + '/detokenize', { tokens: ids.slice(1) });
  assert.equal(back.json.prompt, 'Once upon a time');
  const r = await postJson(server.url + '/v1/completions',
    { prompt: ['Once upon a time', ids], max_tokens: 8, temperature: 0, n: 2, logprobs: 2, echo: true });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices.length, 4);
  assert.deepEqual(r.json.choices.map((c) => c.index), [0, 1, 2, 3]);
  for (const c of r.json.choices) {
    // Greedy: every sample continues the same way; echo puts the prompt (decoded) first.
    assert.equal(c.text.trimStart(), r.json.choices[0].text);
    assert.ok(c.text.trimStart().startsWith('Once upon a time'), 'echo puts the prompt first');
    assert.equal(c.logprobs.tokens.length, 8);
    assert.equal(Object.keys(c.logprobs.top_logprobs[0]).length, 2);
  }
});

test('chat completion, streaming and not, agree', async () => {
  const messages = [{ role: 'system', content: 'You tell stories.' }, { role: 'user', content: 'Tell me about a cat.' }];
  const plain = await postJson(server.url + '/v1/chat/completions', { model: MODEL, messages, max_tokens: 24, temperature: 0 });
  assert.equal(plain.status, 200, plain.text);
  assert.equal(plain.json.object, 'chat.completion');
  assert.equal(plain.json.choices[0].message.role, 'assistant');
  assert.ok(plain.json.choices[0].message.content.length > 0);
  const res = await fetch(server.url + '/v1/chat/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'system', content: 'You tell stories.' },
      { role: 'user', content: [{ type: 'text', text: 'Tell me about a cat.' }] }], max_tokens: 24, temperature: 0, stream: true }),
  });
  const { events, done } = await readSse(res);
  assert.ok(done);
  assert.equal(events[0].object, 'chat.completion.chunk');
  assert.equal(events[0].choices[0].delta.role, 'assistant');
  const content = events.map((e) => e.choices[0]?.delta?.content ?? '').join('');
  assert.equal(content, plain.json.choices[0].message.content);
  assert.equal(events.at(-1).choices[0].finish_reason, 'length');
});

test('300 concurrent streaming clients all complete correctly', async () => {
  const prompts = ['Once upon a time', 'The little dog', 'Lily and Ben went to the park', 'One day, a cat named Tom'];
  const expected = {};
  for (const p of prompts) {
    expected[p] = (await postJson(server.url + '/v1/completions', { prompt: p, max_tokens: 20, temperature: 0 })).json.choices[0].text;
  }
  const runs = Array.from({ length: 300 }, async (_, i) => {
    const prompt = prompts[i % prompts.length];
    const res = await fetch(server.url + '/v1/completions', {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt, max_tokens: 20, temperature: 0, stream: true }),
    });
    assert.equal(res.status, 200);
    const { events, done } = await readSse(res);
    assert.ok(done);
    return events.map((e) => e.choices[0]?.text ?? '').join('') === expected[prompt];
  });
  const results = await Promise.all(runs);
  assert.equal(results.filter(Boolean).length, 300);
});

test('vesper bench serve drives 1,000 concurrent streams to completion', async () => {
  const { stdout } = await promisify(execFile)(vesper, ['bench', 'serve', '--base-url', server.url, '--num-prompts', '1000',
    '--request-rate', 'inf', '--input-len', '16', '--output-len', '8', '--json'], { cwd: repoRoot, maxBuffer: 1 << 24 });
  const r = JSON.parse(stdout.trim().split('\n').at(-1));
  assert.equal(r.completed, 1000);
  assert.equal(r.failed, 0);
  assert.equal(r.total_output_tokens, 8000);
  assert.ok(r.mean_ttft_ms > 0 && r.p99_ttft_ms >= r.median_ttft_ms);
  assert.ok(r.output_throughput > 0);
});

test('a client that disconnects frees its KV blocks', async () => {
  const controller = new AbortController();
  const res = await fetch(server.url + '/v1/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 1900, temperature: 0, ignore_eos: true, stream: true }),
    signal: controller.signal,
  });
  const reader = res.body.getReader();
  await reader.read();  // the first chunk: the request is running
  let m = (await metrics(server.url)).values;
  assert.ok(m['vesper:kv_cache_blocks_used'] > 0, 'the request holds blocks while it runs');
  controller.abort();
  const deadline = Date.now() + 3000;
  do {
    await new Promise((r) => setTimeout(r, 50));
    m = (await metrics(server.url)).values;
  } while (m['vesper:kv_cache_blocks_used'] > 0 && Date.now() < deadline);
  assert.equal(m['vesper:kv_cache_blocks_used'], 0);
  assert.equal(m['vesper:num_requests_running'], 0);
});

test('bad input gets 4xx with OpenAI error JSON while a good request runs', async () => {
  const good = postJson(server.url + '/v1/completions', { prompt: 'Once upon a time', max_tokens: 200, temperature: 0 });
  const url = server.url + '/v1/completions';
  const cases = [
    [await postJson(url, '{"prompt": "x", '), 400, null, /not valid JSON/],
    [await postJson(url, '[1, 2]'), 400, null, /JSON object/],
    [await postJson(url, { prompt: 'x', temperature: -1 }), 400, 'temperature', /temperature/],
    [await postJson(url, { prompt: 'x', top_p: 1.5 }), 400, 'top_p', /top_p/],
    [await postJson(url, { prompt: 'x', n: 0 }), 400, 'n', /'n'/],
    [await postJson(url, { prompt: 'x', max_tokens: -1 }), 400, 'max_tokens', /max_tokens/],
    [await postJson(url, { prompt: 'x', max_tokens: 'ten' }), 400, 'max_tokens', /integer/],
    [await postJson(url, { prompt: 42 }), 400, 'prompt', /prompt/],
    [await postJson(url, { max_tokens: 3 }), 400, 'prompt', /required/],
    [await postJson(url, { prompt: 'x', model: 'gpt-4' }), 404, 'model', /gpt-4/],
    [await postJson(url, { prompt: [1, 999999] }), 400, 'prompt', /vocabulary/],
    [await postJson(url, { prompt: 'x', max_tokens: 5000 }), 400, 'prompt', /maximum context length is 2048 tokens/],
    [await postJson(server.url + '/v1/chat/completions', { messages: [] }), 400, 'messages', /messages/],
    [await postJson(server.url + '/v1/chat/completions', { messages: [{ role: 'wizard', content: 'x' }] }), 400, 'messages[0].role', /role/],
    [await postJson(url, { prompt: 'x' }, { 'Content-Type': 'text/plain' }), 415, null, /Content-Type/],
    [await postJson(server.url + '/v1/nothing', {}), 404, null, /Not found/],
  ];
  const nonUtf8 = await fetch(url, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: Buffer.from([0x7b, 0x22, 0x70, 0x22, 0x3a, 0x22, 0xff, 0xfe, 0x22, 0x7d]) });
  cases.push([{ status: nonUtf8.status, json: await nonUtf8.json() }, 400, null, /UTF-8/]);
  const get = await fetch(url);
  cases.push([{ status: get.status, json: await get.json() }, 405, null, /POST/]);
  const big = await postJson(url, { prompt: 'x'.repeat(40 << 20) });
  cases.push([big, 413, null, /larger than the limit/]);
  for (const [r, status, param, message] of cases) {
    assert.equal(r.status, status, JSON.stringify(r.json));
    assert.ok(r.json?.error, 'no error object');
    for (const k of ['message', 'type', 'param', 'code']) assert.ok(k in r.json.error, `error lacks ${k}`);
    if (param) assert.equal(r.json.error.param, param);
    assert.match(r.json.error.message, message);
  }
  const g = await good;
  assert.equal(g.status, 200);
  assert.equal(g.json.usage.completion_tokens, 200);
});

test('admission control answers 503 when too many requests wait', async () => {
  const small = await startServer(['--max-num-seqs', '1', '--max-num-waiting', '2']);
  try {
    const body = { prompt: 'Once upon a time', max_tokens: 300, temperature: 0, ignore_eos: true };
    const results = await Promise.all(Array.from({ length: 12 }, () => postJson(small.url + '/v1/completions', body)));
    const ok = results.filter((r) => r.status === 200);
    const refused = results.filter((r) => r.status === 503);
    assert.ok(ok.length >= 1 && refused.length >= 1, results.map((r) => r.status).join(','));
    assert.equal(ok.length + refused.length, 12);
    assert.equal(refused[0].json.error.code, 'overloaded');
    assert.match(refused[0].json.error.message, /--max-num-waiting 2/);
  } finally {
    await small.stop();
  }
});

test('--api-key requires a bearer token', async () => {
  const keyed = await startServer(['--api-key', 'sekrit', '--served-model-name', 'tiny']);
  try {
    const no = await postJson(keyed.url + '/v1/completions', { prompt: 'Hi', max_tokens: 2 });
    assert.equal(no.status, 401);
    assert.equal(no.json.error.type, 'authentication_error');
    const yes = await postJson(keyed.url + '/v1/completions', { model: 'tiny', prompt: 'Hi', max_tokens: 2 },
      { Authorization: 'Bearer sekrit' });
    assert.equal(yes.status, 200);
    assert.equal(yes.json.model, 'tiny');
    assert.equal((await fetch(keyed.url + '/health')).status, 200);
  } finally {
    await keyed.stop();
  }
});

test('SIGTERM lets an in-flight request finish and exits 0', async () => {
  const s = await startServer();
  const inflight = postJson(s.url + '/v1/completions', { prompt: 'Once upon a time', max_tokens: 400, temperature: 0, ignore_eos: true });
  await waitForRequests(s.url, 1);
  s.proc.kill('SIGTERM');
  const r = await inflight;
  assert.equal(r.status, 200);
  assert.equal(r.json.usage.completion_tokens, 400);
  const { code } = await s.exited;
  assert.equal(code, 0);
});
