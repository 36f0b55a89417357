// Reliability and security, second round: what a hostile or careless client could do to
// `vesper serve` that stalled the engine, leaked a file, or lost a stream, each driven over HTTP
// (the exact requests where it gave them). Hangs fail their test (timeouts) instead of
// stalling the suite.
import { describe, test as nodeTest, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import net from 'node:net';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { startServer, postJson, readSse, repoRoot, vesper } from './server_harness.mjs';

const test = (name, fn) => nodeTest(name, { timeout: 60000 }, fn);
const models = path.join(repoRoot, '..', 'shared', 'models');
const stories = path.join(models, 'stories260K.gguf');
const rel = (p) => path.relative(repoRoot, path.join(models, p));
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vesper-reliability-'));
after(() => fs.rmSync(tmp, { recursive: true, force: true }));

function assertApiError(r, status, param, message) {
  assert.equal(r.status, status, r.text);
  assert.ok(r.json?.error, `no error object: ${r.text}`);
  if (param !== undefined) assert.equal(r.json.error.param, param, r.text);
  if (message) assert.match(r.json.error.message, message);
}

// A raw connection: write bytes, collect what comes back, and learn how it ended.
function connect(url) {
  const { hostname, port } = new URL(url);
  const socket = net.connect({ host: hostname, port: Number(port) });
  const conn = { socket, received: '', ended: null, error: null };
  conn.closed = new Promise((resolve) => {
    socket.on('data', (d) => { conn.received += d.toString(); });
    socket.on('end', () => { conn.ended = 'end'; });
    socket.on('error', (e) => { conn.error = e; });
    socket.on('close', () => resolve(conn));
  });
  conn.ready = new Promise((resolve) => socket.on('connect', resolve));
  conn.waitFor = async (re, ms = 20000) => {
    const t0 = Date.now();
    while (!re.test(conn.received)) {
      if (Date.now() - t0 > ms) throw new Error(`timed out waiting for ${re} in:\n${conn.received.slice(-2000)}`);
      await new Promise((r) => setTimeout(r, 5));
    }
  };
  return conn;
}

const post = (p, body, extra = '') => {
  const b = JSON.stringify(body);
  return `POST ${p} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n${extra}Content-Length: ${Buffer.byteLength(b)}\r\n\r\n${b}`;
};

describe('adapters loaded while serving', () => {
  let server;
  const allowed = path.join(tmp, 'adapters');
  before(async () => {
    fs.mkdirSync(allowed);
    fs.copyFileSync(path.join(models, 'lora', 'zed', 'adapter.gguf'), path.join(allowed, 'zed.gguf'));
    fs.writeFileSync(path.join(allowed, 'passwd-like.gguf'), 'root:x:0:0:root:/root:/bin/bash\n');
    fs.symlinkSync('/etc/passwd', path.join(allowed, 'escape.gguf'));
    execFileSync('mkfifo', [path.join(allowed, 'fifo.gguf')]);
    server = await startServer(['--enable-lora', '--max-loras', '2', '--max-lora-rank', '32',
      '--enable-lora-runtime-updating', '--lora-modules', `bim=${rel('lora/bim/adapter.gguf')}`,
      '--lora-allowed-dirs', allowed], stories);
  });
  after(async () => { await server?.stop(); });
  const load = (body) => postJson(server.url + '/v1/load_lora_adapter', body);

  test('a FIFO as lora_path is refused at once and streams keep flowing', async () => {
    const stream = fetch(server.url + '/v1/completions', {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 120, ignore_eos: true, stream: true }),
    }).then((res) => readSse(res));
    const t0 = Date.now();
    const r = await load({ lora_name: 'f', lora_path: path.join(allowed, 'fifo.gguf') });
    assert.ok(Date.now() - t0 < 5000, 'the load blocked');
    assertApiError(r, 400, 'lora_path', /is not a readable LoRA adapter/);
    const { events, done } = await stream;
    assert.ok(done, JSON.stringify(events).slice(0, 500));
    assert.equal(events.length, 120, `${events.length} events`);
    // Still serving, and nothing named f.
    const models = (await (await fetch(server.url + '/v1/models')).json()).data.map((m) => m.id);
    assert.ok(!models.includes('f'));
  });

  test('no file bytes and no existence leak; paths outside the allowed directories are refused', async () => {
    for (const p of ['/etc/shadow', '/etc/passwd', '/no/such/file', path.join(allowed, '..', '..', 'etc', 'passwd'),
      path.join(allowed, 'escape.gguf')]) {
      const r = await load({ lora_name: 'x', lora_path: p });
      assertApiError(r, 400, 'lora_path', /outside the directories adapters may be loaded from/);
      assert.doesNotMatch(r.text, /root/);
    }
    // Inside: a text file, a missing file and a directory get one message.
    const messages = [];
    for (const name of ['passwd-like.gguf', 'missing.gguf', '.']) {
      const p = path.join(allowed, name);
      const r = await load({ lora_name: 'x', lora_path: p });
      assertApiError(r, 400, 'lora_path', /is not a readable LoRA adapter/);
      assert.doesNotMatch(r.text, /root|magic/);
      messages.push(r.json.error.message.replace(p, 'PATH'));
    }
    assert.equal(new Set(messages).size, 1, messages.join('\n'));
    // And a real adapter there loads.
    const ok = await load({ lora_name: 'zed2', lora_path: path.join(allowed, 'zed.gguf') });
    assert.equal(ok.status, 200, ok.text);
  });

  test('adapter names: no duplicate of a served name, bounded, no path characters', async () => {
    const good = path.join(allowed, 'zed.gguf');
    for (const [name, re] of [['stories260K', /base model's served name/], ['bim', /already loaded/],
      ['x'.repeat(100000), /1 to 128/], ['../x', /1 to 128/], ['a b', /1 to 128/], ['a//b', /1 to 128/]]) {
      const r = await load({ lora_name: name, lora_path: good });
      assertApiError(r, 400, 'lora_name', re);
    }
    const ids = (await (await fetch(server.url + '/v1/models')).json()).data.map((m) => m.id);
    assert.equal(new Set(ids).size, ids.length, ids.join(', '));
  });

  test('a request racing an unload gets 200 or the one 404 model_not_found', async () => {
    const r0 = await load({ lora_name: 'racer', lora_path: path.join(allowed, 'zed.gguf') });
    assert.equal(r0.status, 200, r0.text);
    const requests = [];
    for (let i = 0; i < 24; ++i) {
      // Streams too: their headers wait until the engine took the request, so a refused one gets
      // the same 404 rather than a 200 with an error event.
      requests.push(postJson(server.url + '/v1/completions', { model: 'racer', prompt: 'Hi', max_tokens: 4, stream: i % 2 === 1 }));
      if (i === 8) requests.push(postJson(server.url + '/v1/unload_lora_adapter', { lora_name: 'racer' }));
    }
    const results = await Promise.all(requests);
    let refused = 0;
    for (const r of results) {
      if (r.status === 200) {
        assert.doesNotMatch(r.text, /"error"/);
        continue;
      }
      assertApiError(r, 404, 'model', /racer/);
      assert.equal(r.json.error.code, 'model_not_found');
      ++refused;
    }
    assert.ok(refused > 0, 'no request came after the unload');
  });
});

describe('a copy read again after eviction', () => {
  // --max-cpu-loras 1: using one adapter drops the other's copy, read again from its path when
  // next used. That file is now a FIFO: the read must not block the engine, and the request ends.
  let server;
  const dir = path.join(tmp, 'evict');
  before(async () => {
    fs.mkdirSync(dir);
    fs.copyFileSync(path.join(models, 'lora', 'zed', 'adapter.gguf'), path.join(dir, 'a.gguf'));
    fs.copyFileSync(path.join(models, 'lora', 'bim', 'adapter.gguf'), path.join(dir, 'b.gguf'));
    server = await startServer(['--enable-lora', '--max-loras', '1', '--max-cpu-loras', '1',
      '--lora-modules', `a=${path.join(dir, 'a.gguf')}`, `b=${path.join(dir, 'b.gguf')}`], stories);
  });
  after(async () => { await server?.stop(); });

  test('a FIFO in place of an evicted adapter ends its requests; others go on', async () => {
    const ok = (model) => postJson(server.url + '/v1/completions', { model, prompt: 'Hi', max_tokens: 4, temperature: 0 });
    assert.equal((await ok('a')).status, 200);
    assert.equal((await ok('b')).status, 200);  // a's copy is dropped
    fs.rmSync(path.join(dir, 'a.gguf'));
    execFileSync('mkfifo', [path.join(dir, 'a.gguf')]);
    const stream = fetch(server.url + '/v1/completions', {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 100, ignore_eos: true, stream: true }),
    }).then((res) => readSse(res));
    const t0 = Date.now();
    const r = await ok('a');
    assert.ok(Date.now() - t0 < 5000, 'the re-read blocked');
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.choices[0].finish_reason, 'abort');
    const { events, done } = await stream;
    assert.ok(done);
    assert.equal(events.length, 100);
    assert.equal((await ok('b')).status, 200);
    assert.match(server.logs, /adapter 'a'/);
  });
});

describe('requests that cannot be served are refused cheaply and clearly', () => {
  let server;
  before(async () => { server = await startServer(['--max-model-len', '256']); });
  after(async () => { await server?.stop(); });

  test('a 10 MB prompt is refused for length without being tokenized', async () => {
    const t0 = Date.now();
    const r = await postJson(server.url + '/v1/completions', { prompt: 'a b '.repeat(2500000), max_tokens: 1 });
    assertApiError(r, 400, 'prompt', /maximum context length is 256 tokens.*at least/);
    // Tokenizing it took 4.5 s in a release build; parsing the body under the sanitizers ~2 s.
    assert.ok(Date.now() - t0 < (process.env.VESPER_SANITIZED ? 10000 : 2000), `took ${Date.now() - t0} ms`);
    const c = await postJson(server.url + '/v1/chat/completions',
      { messages: [{ role: 'user', content: 'x'.repeat(1 << 20) }], max_tokens: 1 });
    assertApiError(c, 400, 'messages', /at least/);
  });

  test('allowed_token_ids of end tokens alone with min_tokens is a 400', async () => {
    const eos = 2;  // stories260K's </s>
    const r = await postJson(server.url + '/v1/completions',
      { prompt: 'Hi', max_tokens: 8, allowed_token_ids: [eos], min_tokens: 5 });
    assertApiError(r, 400, undefined, /allowed_token_ids.*min_tokens 5/);
    const ok = await postJson(server.url + '/v1/completions',
      { prompt: 'Hi', max_tokens: 8, allowed_token_ids: [eos, 300], min_tokens: 5, temperature: 0 });
    assert.equal(ok.status, 200, ok.text);
  });

  test('response ids are random, not counters', async () => {
    const ids = [];
    for (let i = 0; i < 3; ++i) {
      const r = await postJson(server.url + '/v1/completions', { prompt: 'Hi', max_tokens: 1 });
      ids.push(r.json.id);
    }
    const chat = await postJson(server.url + '/v1/chat/completions', { messages: [{ role: 'user', content: 'Hi' }], max_tokens: 1 });
    for (const id of ids) assert.match(id, /^cmpl-[0-9a-f]{32}$/);
    assert.match(chat.json.id, /^chatcmpl-[0-9a-f]{32}$/);
    assert.equal(new Set(ids).size, ids.length);
  });
});

describe('HTTP hygiene', () => {
  let server;
  before(async () => {
    server = await startServer(['--timeout-keep-alive', '1', '--timeout-request-header', '1',
      '--max-num-seqs', '1', '--max-num-waiting', '1', '--allowed-origins', 'https://a.example']);
  });
  after(async () => { await server?.stop(); });

  test('a client sending its headers a byte at a time gets a 408 and is closed', async () => {
    const c = connect(server.url);
    await c.ready;
    const head = 'GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ' + 'y'.repeat(100) + '\r\n\r\n';
    const t0 = Date.now();
    for (const ch of head) {
      if (c.socket.destroyed || c.ended) break;
      c.socket.write(ch);
      await new Promise((r) => setTimeout(r, 50));
    }
    await c.closed;
    assert.match(c.received, /^HTTP\/1\.1 408 /);
    assert.ok(Date.now() - t0 < 4000, `closed after ${Date.now() - t0} ms`);
  });

  test('an idle keep-alive connection is closed after --timeout-keep-alive', async () => {
    const c = connect(server.url);
    await c.ready;
    c.socket.write('GET /health HTTP/1.1\r\nHost: x\r\n\r\n');
    await c.waitFor(/"ok"/);
    const t0 = Date.now();
    await c.closed;
    const idle = Date.now() - t0;
    assert.ok(idle > 500 && idle < 4000, `closed after ${idle} ms`);
    assert.equal(c.ended, 'end');
  });

  test('a POST without a length is a 411', async () => {
    const c = connect(server.url);
    await c.ready;
    c.socket.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\r\n');
    await c.waitFor(/\r\n\r\n.*\}/s);
    assert.match(c.received, /^HTTP\/1\.1 411 Length Required/);
    c.socket.destroy();
  });

  test('overload 503s carry Retry-After', async () => {
    const body = { prompt: 'Once upon a time', max_tokens: 200, ignore_eos: true };
    const results = await Promise.all(Array.from({ length: 8 }, () => fetch(server.url + '/v1/completions', {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
    })));
    const refused = results.filter((r) => r.status === 503);
    assert.ok(refused.length > 0, 'nothing was refused');
    for (const r of refused) assert.equal(r.headers.get('retry-after'), '1');
    await Promise.all(results.map((r) => r.text()));
  });

  test('CORS: preflights answered, allowed origins named, others refused', async () => {
    const pre = await fetch(server.url + '/v1/chat/completions', {
      method: 'OPTIONS',
      headers: { Origin: 'https://a.example', 'Access-Control-Request-Method': 'POST',
        'Access-Control-Request-Headers': 'content-type, authorization' },
    });
    assert.equal(pre.status, 200);
    assert.equal(pre.headers.get('access-control-allow-origin'), 'https://a.example');
    assert.match(pre.headers.get('access-control-allow-methods'), /POST/);
    assert.match(pre.headers.get('access-control-allow-headers'), /authorization/);
    const bad = await fetch(server.url + '/v1/chat/completions', {
      method: 'OPTIONS', headers: { Origin: 'https://b.example', 'Access-Control-Request-Method': 'POST' },
    });
    assert.equal(bad.status, 400);
    assert.equal(bad.headers.get('access-control-allow-origin'), null);
    const simple = await fetch(server.url + '/v1/models', { headers: { Origin: 'https://a.example' } });
    assert.equal(simple.headers.get('access-control-allow-origin'), 'https://a.example');
    assert.match(simple.headers.get('vary'), /Origin/);
  });

  test('CORS defaults allow any origin, as vLLM\'s', async () => {
    const open = await startServer([]);
    try {
      const r = await fetch(open.url + '/health', { headers: { Origin: 'https://anywhere.example' } });
      assert.equal(r.headers.get('access-control-allow-origin'), '*');
      const pre = await fetch(open.url + '/v1/completions', {
        method: 'OPTIONS', headers: { Origin: 'https://x.example', 'Access-Control-Request-Method': 'POST' },
      });
      assert.equal(pre.status, 200);
      assert.equal(pre.headers.get('access-control-allow-origin'), '*');
    } finally {
      await open.stop();
    }
  });
});

describe('SIGTERM loses no stream', () => {
  // A model slow enough that a 400-token stream is still running when the signal lands.
  const slow = path.join(tmp, 'slow.gguf');
  before(() => {
    execFileSync(vesper, ['synth', '--n-layer', '4', '--n-embd', '768', '--n-head', '12', '--n-head-kv', '12',
      '--n-ff', '2048', '--n-vocab', '32000', '--type', 'q8_0', '-o', slow], { stdio: 'ignore' });
  });
  const streamBody = (n) => ({ prompt: 'hello', max_tokens: n, ignore_eos: true, stream: true, temperature: 0 });

  test('the running stream ends with [DONE], the pipelined request gets 503 + close, idle connections close', async () => {
    const server = await startServer([], slow);
    const idle = connect(server.url);
    await idle.ready;
    idle.socket.write('GET /health HTTP/1.1\r\nHost: x\r\n\r\n');
    await idle.waitFor(/"ok"/);
    // A request whose headers are still arriving would be refused: it must not hold up the exit.
    const partial = connect(server.url);
    await partial.ready;
    partial.socket.write('GET /health HTTP/1.1\r\nHost: x\r\n');
    const c = connect(server.url);
    await c.ready;
    // Both requests in one write: the second waits in the connection behind the stream.
    c.socket.write(post('/v1/completions', streamBody(400)) + post('/v1/completions', { prompt: 'hi', max_tokens: 2 }));
    await c.waitFor(/data: \{/);
    server.proc.kill('SIGTERM');
    await idle.closed;  // at SIGTERM, not at exit
    assert.equal(idle.ended, 'end');
    await partial.closed;
    assert.ok(!/data: \[DONE\]/.test(c.received), 'the stream ended before the idle connections closed');
    const { code } = await server.exited;
    await c.closed;
    assert.equal(c.error, null, `connection error: ${c.error}`);
    assert.equal(c.ended, 'end');
    assert.equal(code, 0);
    const [stream, second] = c.received.split(/(?=HTTP\/1\.1 503)/);
    assert.equal((stream.match(/data: \{/g) || []).length, 400);
    assert.match(stream, /"finish_reason":"length"/);
    assert.match(stream, /data: \[DONE\]/);
    assert.match(second, /^HTTP\/1\.1 503 [^]*Retry-After: 1\r\n[^]*Connection: close\r\n[^]*shutting down/);
  });

  test('past --shutdown-timeout the stream gets finish_reason "abort" and [DONE]', async () => {
    const server = await startServer(['--shutdown-timeout', '0.5'], slow);
    const c = connect(server.url);
    await c.ready;
    c.socket.write(post('/v1/completions', streamBody(2000)));
    await c.waitFor(/data: \{/);
    server.proc.kill('SIGTERM');
    await server.exited;
    await c.closed;
    assert.equal(c.error, null, `connection error: ${c.error}`);
    assert.match(c.received, /"finish_reason":"abort"/);
    assert.match(c.received, /data: \[DONE\]/);
  });
});
