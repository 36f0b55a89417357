// Token-level controls through `vesper serve`: OpenAI's logit_bias and vLLM's allowed_token_ids
// and bad_words change what is drawn (greedy and sampled, completions and chat), and malformed
// values are 400s naming the field.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, postJson } from './server_harness.mjs';

describe('logit_bias, allowed_token_ids, bad_words', () => {
  let server;
  before(async () => { server = await startServer(); });
  after(async () => { await server?.stop(); });

  const complete = (body) => postJson(server.url + '/v1/completions',
    { prompt: 'Once upon a time', max_tokens: 32, temperature: 0, logprobs: 0, return_tokens_as_token_ids: true,
      ...body });
  const tokenize = async (text) =>
    (await postJson(server.url + '/tokenize', { prompt: text, add_special_tokens: false })).json.tokens;
  // The drawn ids, from the logprobs' tokens ("token_id:<id>").
  const ids = (r) => r.json.choices[0].logprobs.tokens.map((t) => Number(t.replace(/^token_id:/, '')));

  test('logit_bias -100 on the greedy token changes it; +100 forces a token', async () => {
    const plain = await complete({});
    assert.equal(plain.status, 200, plain.text);
    assert.ok(plain.json.choices[0].logprobs.tokens.every((t) => /^token_id:\d+$/.test(t)));
    const first = ids(plain)[0];
    const banned = await complete({ logit_bias: { [String(first)]: -100 } });
    assert.equal(banned.status, 200, banned.text);
    assert.ok(!ids(banned).includes(first), JSON.stringify(ids(banned)));
    const forced = await complete({ logit_bias: { 100: 100 }, temperature: 0.8, seed: 3, max_tokens: 8 });
    assert.equal(forced.status, 200, forced.text);
    assert.deepEqual(ids(forced), Array(8).fill(100));
  });

  test('a load generator banning every byte token with -100 is served', async () => {
    const bias = {};
    for (let t = 3; t < 259; ++t) bias[t] = -100;
    const r = await complete({ logit_bias: bias, temperature: 1, seed: 7 });
    assert.equal(r.status, 200, r.text);
    assert.ok(ids(r).every((t) => t < 3 || t >= 259), JSON.stringify(ids(r)));
  });

  test('allowed_token_ids restricts every drawn token', async () => {
    const allowed = await tokenize(' the cat sat on a mat');
    const r = await complete({ allowed_token_ids: allowed, temperature: 1, seed: 11, ignore_eos: true });
    assert.equal(r.status, 200, r.text);
    assert.equal(ids(r).length, 32);
    assert.ok(ids(r).every((t) => allowed.includes(t)), JSON.stringify(ids(r)));
  });

  test('bad_words keeps a word out of greedy output, in completions and chat', async () => {
    const plain = await complete({ max_tokens: 64 });
    assert.match(plain.json.choices[0].text, /Lily/);
    const r = await complete({ max_tokens: 64, bad_words: ['Lily'] });
    assert.equal(r.status, 200, r.text);
    assert.doesNotMatch(r.json.choices[0].text, /Lily/);
    assert.notEqual(r.json.choices[0].text, plain.json.choices[0].text);
    const chat = await postJson(server.url + '/v1/chat/completions', {
      messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 64, temperature: 0,
      bad_words: ['Lily'], logit_bias: { 2: -100 },
    });
    assert.equal(chat.status, 200, chat.text);
    assert.doesNotMatch(chat.json.choices[0].message.content, /Lily/);
  });

  test('malformed values are 400s naming the field', async () => {
    const cases = [
      [{ logit_bias: { abc: 1 } }, 'logit_bias', /keys must be token ids in the vocabulary \(0\.\.511\), got "abc"/],
      [{ logit_bias: { 512: 1 } }, 'logit_bias', /got "512"/],
      [{ logit_bias: { 5: 101 } }, 'logit_bias', /'logit_bias\["5"\]' must be a number in \[-100, 100\], got an integer \(101\)/],
      [{ logit_bias: { 5: 'x' } }, 'logit_bias', /must be a number/],
      [{ logit_bias: [1] }, 'logit_bias', /'logit_bias' must be an object/],
      [{ allowed_token_ids: [] }, 'allowed_token_ids', /must not be empty/],
      [{ allowed_token_ids: [1, 600] }, 'allowed_token_ids', /'allowed_token_ids\[1\]' must be a token id in the vocabulary \(0\.\.511\)/],
      [{ bad_words: ['ok', 3] }, 'bad_words', /'bad_words\[1\]' must be a non-blank string/],
      [{ bad_words: '  ' }, 'bad_words', /'bad_words' must be an array/],
    ];
    for (const [body, param, message] of cases) {
      const r = await complete(body);
      assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.text}`);
      assert.equal(r.json.error.param, param, r.text);
      assert.match(r.json.error.message, message);
    }
  });
});
