// The official OpenAI Node SDK (npm package `openai`) against `vesper serve`: completions, chat
// completions, and streaming.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, generateJson } from './server_harness.mjs';

let server;
let client;
before(async () => {
  server = await startServer(['--api-key', 'test-key']);
  client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'test-key', maxRetries: 0 });
});
after(async () => { await server?.stop(); });

test('models.list names the served model', async () => {
  const models = await client.models.list();
  assert.equal(models.data[0].id, 'stories260K-f32');
});

test('completions.create matches vesper generate', async () => {
  const expected = await generateJson('Once upon a time', 24);
  const r = await client.completions.create({ model: 'stories260K-f32', prompt: 'Once upon a time', max_tokens: 24, temperature: 0 });
  assert.equal(r.choices[0].text, expected.text);
  assert.equal(r.usage.completion_tokens, 24);
});

test('chat.completions.create answers as the assistant', async () => {
  const r = await client.chat.completions.create({
    model: 'stories260K-f32', messages: [{ role: 'user', content: 'Tell me a story.' }], max_tokens: 16, temperature: 0,
  });
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.equal(r.usage.completion_tokens, 16);
});

test('streaming through the SDK gives the same text', async () => {
  const plain = await client.chat.completions.create({
    model: 'stories260K-f32', messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 20, temperature: 0,
  });
  const stream = await client.chat.completions.create({
    model: 'stories260K-f32', messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 20, temperature: 0,
    stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let usage = null;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta?.content ?? '';
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(text, plain.choices[0].message.content);
  assert.equal(usage.completion_tokens, 20);
  const completions = await client.completions.create({ model: 'stories260K-f32', prompt: 'The cat', max_tokens: 10, temperature: 0, stream: true });
  let ctext = '';
  for await (const chunk of completions) ctext += chunk.choices[0]?.text ?? '';
  const ref = await client.completions.create({ model: 'stories260K-f32', prompt: 'The cat', max_tokens: 10, temperature: 0 });
  assert.equal(ctext, ref.choices[0].text);
});

test('a bad request surfaces as an APIError with status and param', async () => {
  await assert.rejects(
    client.completions.create({ model: 'stories260K-f32', prompt: 'x', temperature: -2 }),
    (e) => e.status === 400 && e.error?.param === 'temperature',
  );
});
