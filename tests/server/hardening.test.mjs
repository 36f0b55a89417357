// Hostile-client tests of `vesper serve`: one test per way a single request could crash, hang or
// stall the server, or leave a client with a malformed answer (each failed on the server before
// the hardening work). Every test ends by checking the server still answers.
import { test as nodeTest, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import { startServer, postJson, readSse, waitForRequests } from './server_harness.mjs';

// A hang must fail the test, not stall the suite.
const test = (name, fn) => nodeTest(name, { timeout: 120000 }, fn);

let server;
before(async () => { server = await startServer(['--max-num-seqs', '16']); });
after(async () => { await server?.stop(); });

const chat = (extra = {}) => ({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2, ...extra });

async function assertAlive(s = server) {
  const r = await fetch(s.url + '/health');
  assert.equal(r.status, 200, 'the server no longer answers');
}

function assertApiError(r, status, param, message) {
  assert.equal(r.status, status, r.text);
  assert.ok(r.json?.error, `no error object: ${r.text}`);
  for (const k of ['message', 'type', 'param', 'code']) assert.ok(k in r.json.error, `error lacks ${k}`);
  if (param !== undefined) assert.equal(r.json.error.param, param);
  if (message) assert.match(r.json.error.message, message);
}

// Sends raw bytes on a new connection; resolves with everything the server sent until it closed
// (or until `until` matches the bytes so far). `halfClose` ends our sending side after the request.
function rawRequest(url, bytes, { halfClose = false, until = null } = {}) {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host: hostname, port: Number(port), allowHalfOpen: true });
    let received = '';
    socket.on('connect', () => {
      socket.write(bytes);
      if (halfClose) socket.end();
    });
    socket.on('data', (d) => {
      received += d.toString();
      if (until && until.test(received)) { socket.destroy(); resolve(received); }
    });
    socket.on('end', () => { socket.destroy(); resolve(received); });
    socket.on('error', reject);
  });
}

function httpRequest(path, body, contentType = 'application/json') {
  return `POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: ${contentType}\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
}

test('a content part whose type is not a string is a 400 naming it, not a crash', async () => {
  for (const type of [5, null, true, ['text'], { a: 1 }]) {
    const r = await postJson(server.url + '/v1/chat/completions',
      { messages: [{ role: 'user', content: [{ type, text: 'hi' }] }] });
    assertApiError(r, 400, 'messages[0].content[0].type', /must be a string/);
  }
  const text = await postJson(server.url + '/v1/chat/completions',
    { messages: [{ role: 'user', content: [{ type: 'text', text: 7 }] }] });
  assertApiError(text, 400, 'messages[0].content[0].text', /must be a string/);
  await assertAlive();
});

test('response_format with a non-string type is a 400 naming response_format.type', async () => {
  for (const type of [5, null]) {
    const r = await postJson(server.url + '/v1/chat/completions', chat({ response_format: { type } }));
    assertApiError(r, 400, 'response_format.type');
  }
  assertApiError(await postJson(server.url + '/v1/chat/completions', chat({ response_format: 'json' })), 400,
    'response_format', /object/);
  await assertAlive();
});

test('/tokenize with add_generation_prompt null or of the wrong type is a 400', async () => {
  for (const v of [null, 'yes', 1]) {
    const r = await postJson(server.url + '/tokenize', { messages: [{ role: 'user', content: 'hi' }], add_generation_prompt: v });
    assertApiError(r, 400, 'add_generation_prompt', /boolean/);
  }
  const ok = await postJson(server.url + '/tokenize', { messages: [{ role: 'user', content: 'hi' }], add_generation_prompt: false });
  assert.equal(ok.status, 200);
  await assertAlive();
});

test('deeply nested JSON is refused before anything walks it', async () => {
  const deepKwargs = '{"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":' +
    '{"a":'.repeat(30000) + '1' + '}'.repeat(30001);
  assertApiError(await postJson(server.url + '/v1/chat/completions', deepKwargs), 400, null, /deeper than 64 levels \(at byte \d+\)/);
  const deepField = '{"messages":[{"role":"user","content":"hi"}],"x":' + '['.repeat(200000) + ']'.repeat(200000) + '}';
  assertApiError(await postJson(server.url + '/tokenize', deepField), 400, null, /deeper than 64 levels/);
  // Brackets inside strings are text, not nesting.
  const inString = await postJson(server.url + '/tokenize', { prompt: '['.repeat(1000) });
  assert.equal(inString.status, 200);
  await assertAlive();
});

test('invalid JSON literals and too-large numbers say where and what', async () => {
  const url = server.url + '/v1/completions';
  assertApiError(await postJson(url, '{"prompt":"hi","max_tokens":NaN}'), 400, null, /at byte 28/);
  assertApiError(await postJson(url, '{"prompt":"hi","temperature":Infinity}'), 400, null, /at byte 29/);
  assertApiError(await postJson(url, '{"prompt":"hi","max_tokens":1e999}'), 400, null, /out of range/);
  const big = await postJson(url, '{"prompt":"hi","max_tokens":99999999999999999999999}');
  assertApiError(big, 400, 'max_tokens', /must be an integer between 0 and \d+, got a number \(1e\+23\)/);
  const frac = await postJson(url, { prompt: 'hi', max_tokens: 2.5 });
  assertApiError(frac, 400, 'max_tokens', /got a number \(2\.5\)/);
  await assertAlive();
});

test('out-of-range stop_token_ids are refused', async () => {
  for (const ids of [[512], [-1], [1, 'x']]) {
    const r = await postJson(server.url + '/v1/completions', { prompt: 'hi', max_tokens: 2, stop_token_ids: ids });
    assertApiError(r, 400, 'stop_token_ids', /stop_token_ids\[\d\]/);
  }
  const ok = await postJson(server.url + '/v1/completions', { prompt: 'hi', max_tokens: 2, stop_token_ids: [2, 511] });
  assert.equal(ok.status, 200);
});

test('max_tokens 0 on an idle server is answered at once, in every form', async () => {
  const idle = await startServer();
  try {
    const signal = () => AbortSignal.timeout(20000);
    const plain = await fetch(idle.url + '/v1/completions', { signal: signal(), method: 'POST',
      headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ prompt: 'Once', max_tokens: 0 }) });
    assert.equal(plain.status, 200);
    assert.equal((await plain.json()).choices[0].finish_reason, 'length');
    const echo = await fetch(idle.url + '/v1/completions', { signal: signal(), method: 'POST',
      headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ prompt: 'Once', max_tokens: 0, echo: true }) });
    assert.equal((await echo.json()).choices[0].text, 'Once');
    const stream = await fetch(idle.url + '/v1/completions', { signal: signal(), method: 'POST',
      headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ prompt: 'Once', max_tokens: 0, stream: true }) });
    const { events, done } = await readSse(stream);
    assert.ok(done);
    assert.equal(events.at(-1).choices[0].finish_reason, 'length');
    const c = await fetch(idle.url + '/v1/chat/completions', { signal: signal(), method: 'POST',
      headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(chat({ max_tokens: 0 })) });
    assert.equal((await c.json()).choices[0].finish_reason, 'length');
  } finally {
    await idle.stop();
  }
});

test('a 10 MB prompt does not stall other clients', async () => {
  // (Since the second reliability round it is refused for length untokenized, in milliseconds.)
  const big = JSON.stringify({ prompt: 'Once upon a time '.repeat(600000), max_tokens: 1 });
  const order = [];
  const bigDone = rawRequest(server.url, httpRequest('/v1/completions', big), { until: /\r\n\r\n[\s\S]*\}$/ })
    .then((r) => { order.push('big'); return r; });
  // The small request goes out once the big one is being worked on: it must not wait for it.
  await new Promise((r) => setTimeout(r, 200));
  const small = await postJson(server.url + '/v1/completions', { prompt: 'Hi', max_tokens: 2 });
  order.push('small');
  assert.equal(small.status, 200);
  const bigAnswer = await bigDone;
  assert.match(bigAnswer, /maximum context length/);
  assert.equal(order.length, 2);
});

test('a client that half-closes after its request still gets the whole answer', async () => {
  const body = JSON.stringify({ prompt: 'Once upon a time', max_tokens: 24, temperature: 0 });
  const expected = (await postJson(server.url + '/v1/completions', JSON.parse(body))).json.choices[0].text;
  const plain = await rawRequest(server.url, httpRequest('/v1/completions', body), { halfClose: true });
  assert.match(plain, /^HTTP\/1\.1 (100 Continue\r\n\r\nHTTP\/1\.1 )*200 OK/);
  const json = JSON.parse(plain.slice(plain.lastIndexOf('\r\n\r\n') + 4));
  assert.equal(json.choices[0].text, expected);
  const streamBody = JSON.stringify({ prompt: 'Once upon a time', max_tokens: 24, temperature: 0, stream: true });
  const streamed = await rawRequest(server.url, httpRequest('/v1/completions', streamBody), { halfClose: true });
  assert.match(streamed, /data: \[DONE\]/);
  await assertAlive();
});

test('an absolute-form request target is served', async () => {
  const { host } = new URL(server.url);
  const r = await rawRequest(server.url, `GET http://${host}/health HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`);
  assert.match(r, /^HTTP\/1\.1 200 OK/);
  assert.match(r, /"status":"ok"/);
});

test('the KV capacity error names --num-gpu-blocks-override when that set the capacity', async () => {
  const s = await startServer(['--num-gpu-blocks-override', '4', '--block-size', '16']);
  try {
    const r = await postJson(s.url + '/v1/completions', { prompt: 'Once upon a time', max_tokens: 100 });
    assertApiError(r, 400, 'max_tokens', /64 tokens in all \(--num-gpu-blocks-override\)/);
  } finally {
    await s.stop();
  }
});

test('API keys: the Bearer scheme is case-insensitive, and VESPER_API_KEY sets the key', async () => {
  const keyed = await startServer(['--api-key', 'sekrit']);
  try {
    for (const auth of ['bearer sekrit', 'BEARER sekrit', 'Bearer   sekrit']) {
      const r = await postJson(keyed.url + '/v1/completions', { prompt: 'Hi', max_tokens: 1 }, { Authorization: auth });
      assert.equal(r.status, 200, auth);
    }
    for (const auth of ['Bearer sekri', 'Bearer sekrit2', 'Basic sekrit', 'Bearersekrit', '']) {
      const r = await postJson(keyed.url + '/v1/completions', { prompt: 'Hi', max_tokens: 1 }, { Authorization: auth });
      assertApiError(r, 401, null, /API key/);
    }
  } finally {
    await keyed.stop();
  }
  process.env.VESPER_API_KEY = 'from-env';
  const fromEnv = await startServer().finally(() => { delete process.env.VESPER_API_KEY; });
  try {
    assert.equal((await postJson(fromEnv.url + '/v1/completions', { prompt: 'Hi', max_tokens: 1 })).status, 401);
    const ok = await postJson(fromEnv.url + '/v1/completions', { prompt: 'Hi', max_tokens: 1 }, { Authorization: 'Bearer from-env' });
    assert.equal(ok.status, 200);
  } finally {
    await fromEnv.stop();
  }
});

test('a burst is admitted while sequence slots are free, whatever the engine has picked up', async () => {
  const s = await startServer(['--max-num-seqs', '256', '--max-num-waiting', '8']);
  try {
    const body = { prompt: 'Once upon a time', max_tokens: 8, temperature: 0 };
    const results = await Promise.all(Array.from({ length: 200 }, () => postJson(s.url + '/v1/completions', body)));
    assert.deepEqual([...new Set(results.map((r) => r.status))], [200]);
  } finally {
    await s.stop();
  }
});

test('SIGTERM with a keep-alive connection streaming, then a new request on it: 503, and the process exits', async () => {
  const s = await startServer(['--shutdown-timeout', '10']);
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  let onFirstData;
  const started = new Promise((r) => { onFirstData = r; });
  const post = (body) => new Promise((resolve, reject) => {
    const req = http.request(s.url + '/v1/completions', { method: 'POST', agent, headers: { 'Content-Type': 'application/json' } },
      (res) => {
        let text = '';
        res.on('data', (d) => { text += d; onFirstData(); });
        res.on('end', () => resolve({ status: res.statusCode, text }));
      });
    req.on('error', reject);
    req.end(JSON.stringify(body));
  });
  try {
    // Long enough that the signal is handled while it streams, however busy the machine.
    const streaming = post({ prompt: 'Once upon a time', max_tokens: 400, temperature: 0, ignore_eos: true, stream: true });
    await started;
    s.proc.kill('SIGTERM');
    const first = await streaming;
    assert.equal(first.status, 200);
    assert.match(first.text, /data: \[DONE\]/);
    const second = await post({ prompt: 'Hi', max_tokens: 2 }).catch(() => ({ status: 'closed' }));
    assert.ok(second.status === 503 || second.status === 'closed', JSON.stringify(second));
    const { code } = await s.exited;
    assert.equal(code, 0);
  } finally {
    agent.destroy();
    await s.stop();
  }
});

test('streams still running at the shutdown deadline end well-formed, and exit follows promptly', async () => {
  const s = await startServer(['--shutdown-timeout', '1']);
  try {
    const open = () => fetch(s.url + '/v1/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 1900, temperature: 0, ignore_eos: true, stream: true }) });
    const streams = [await open(), await open()];
    const chatStream = await fetch(s.url + '/v1/chat/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(chat({ max_tokens: 1900, ignore_eos: true, stream: true })) });
    const plain = postJson(s.url + '/v1/completions', { prompt: 'Once upon a time', max_tokens: 1900, ignore_eos: true });
    // All four must be in the engine before the signal: after it, a new request is a 503.
    await waitForRequests(s.url, 4);
    const killedAt = Date.now();
    s.proc.kill('SIGTERM');
    for (const res of [...streams, chatStream]) {
      const { events, done } = await readSse(res);
      assert.ok(done, 'no [DONE]');
      const finals = events.filter((e) => e.choices.length && e.choices[0].finish_reason);
      assert.equal(finals.length, 1);
      assert.equal(finals[0].choices[0].finish_reason, 'abort');
    }
    const p = await plain;
    assert.equal(p.status, 200);
    assert.equal(p.json.choices[0].finish_reason, 'abort');
    const { code } = await s.exited;
    assert.equal(code, 0);
    // The deadline is 1 s; the process used to linger 5 s more waiting for cut streams.
    assert.ok(Date.now() - killedAt < 4000, `exit took ${Date.now() - killedAt} ms`);
  } finally {
    await s.stop();
  }
});

test('with n > 1, a choice that stops first has its final chunk streamed once', async () => {
  const res = await fetch(server.url + '/v1/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'The little dog', max_tokens: 40, n: 2, temperature: 1, stop: '.', stream: true, seed: 2 }) });
  const { events, done } = await readSse(res);
  assert.ok(done);
  for (const index of [0, 1]) {
    const chunks = events.flatMap((e) => e.choices).filter((c) => c.index === index);
    const finals = chunks.filter((c) => c.finish_reason);
    assert.equal(finals.length, 1, `choice ${index} finished ${finals.length} times`);
    assert.equal(chunks.at(-1), finals[0], `choice ${index} streamed after its finish`);
  }
});
