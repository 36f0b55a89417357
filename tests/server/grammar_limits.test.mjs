// Constraint limits through `vesper serve` (src/grammar/limits.h): a schema past them (a
// 100,000-value enum, 5,000 required properties) is a 400 naming the limit, answered quickly
// (refused before any value or property is converted, where compiling it took 10.3 s and
// 5.6 s), while other requests are served; and a format with maxLength (zod's
// z.string().email().max(40), pydantic's EmailStr with max_length) is enforced whole: the output
// is an email address of at most 40 characters.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, postJson } from './server_harness.mjs';
import { makeAjv } from './schemas/check.mjs';

const MODEL = 'stories260K-f32';
const PROMPT = 'Once upon a time, there was a little girl named Lily. She';
// A refusal costs parsing the request body and counting: milliseconds in a release build (the
// JSON parse of these bodies alone takes about a second under the sanitizers). Generous, for a
// loaded machine, and far below what compiling these schemas took (5-10 s in a release build).
const REFUSAL_MS = process.env.VESPER_SANITIZED ? 10000 : 2000;

const bigEnum = { enum: Array.from({ length: 100000 }, (_, i) => `value-${i}`) };
const manyRequired = { type: 'object', properties: {}, required: [] };
for (let i = 0; i < 5000; ++i) {
  manyRequired.properties[`field_${i}`] = { type: 'string' };
  manyRequired.required.push(`field_${i}`);
}
const rf = (schema, name = 'x') => ({ response_format: { type: 'json_schema', json_schema: { name, schema } } });

describe('grammar limits', () => {
  let server;
  before(async () => { server = await startServer(['--max-num-seqs', '8']); });
  after(async () => { await server?.stop(); });

  const complete = (body) => postJson(server.url + '/v1/completions', { model: MODEL, prompt: PROMPT, max_tokens: 8, ...body });
  const chat = (body) => postJson(server.url + '/v1/chat/completions', { model: MODEL, max_tokens: 8, ...body });
  const timed = async (fn) => {
    const start = performance.now();
    const r = await fn();
    return { r, ms: performance.now() - start };
  };

  // A 400 whose param or message names one of `fields` and whose message matches every one of
  // `messages`, answered within REFUSAL_MS.
  const assertRefused = (label, { r, ms }, fields, messages) => {
    assert.equal(r.status, 400, `${label}: ${r.text.slice(0, 400)}`);
    const e = r.json?.error;
    assert.ok(e, `${label}: no error object: ${r.text.slice(0, 400)}`);
    assert.equal(e.type, 'invalid_request_error', `${label}: ${r.text}`);
    const said = `${e.param ?? ''} ${e.message}`;
    assert.ok(fields.some((f) => said.includes(f)), `${label}: neither param nor message names ${fields.join(' or ')}: ${r.text}`);
    for (const m of messages) assert.match(e.message, m, `${label}: ${r.text}`);
    assert.ok(ms < REFUSAL_MS, `${label}: answered in ${ms.toFixed(0)} ms`);
  };

  test('a 100,000-value enum is a quick 400 naming the limit', { timeout: 60000 }, async (t) => {
    const viaResponseFormat = await timed(() => complete(rf(bigEnum)));
    assertRefused('response_format', viaResponseFormat, ['response_format.json_schema.schema'],
      [/100,000 values/, /limit of 10,000/]);
    const viaGuidedJson = await timed(() => complete({ guided_json: bigEnum }));
    assertRefused('guided_json', viaGuidedJson, ['guided_json'], [/100,000 values/, /limit of 10,000/]);
    const viaChat = await timed(() => chat({ messages: [{ role: 'user', content: 'Hi' }], ...rf(bigEnum) }));
    assertRefused('chat response_format', viaChat, ['response_format.json_schema.schema'], [/limit of 10,000/]);
    t.diagnostic(`refused in ${[viaResponseFormat, viaGuidedJson, viaChat].map((x) => x.ms.toFixed(0)).join(', ')} ms`);
  });

  test('5,000 required properties are a quick 400 naming the limit', { timeout: 60000 }, async (t) => {
    const viaResponseFormat = await timed(() => complete(rf(manyRequired)));
    assertRefused('response_format', viaResponseFormat, ['response_format.json_schema.schema'],
      [/5,000 properties/, /limit of 2,000/]);
    const viaStructuredOutputs = await timed(() => complete({ structured_outputs: { json: manyRequired } }));
    assertRefused('structured_outputs.json', viaStructuredOutputs, ['structured_outputs.json'], [/limit of 2,000/]);
    t.diagnostic(`refused in ${[viaResponseFormat, viaStructuredOutputs].map((x) => x.ms.toFixed(0)).join(', ')} ms`);
  });

  test('other requests complete while refused ones arrive', { timeout: 60000 }, async () => {
    const plain = complete({ max_tokens: 32, temperature: 0 });
    const constrained = complete({ max_tokens: 16, temperature: 0, guided_choice: ['yes', 'no'] });
    const refused = [rf(bigEnum), rf(manyRequired), { guided_json: bigEnum }, rf(manyRequired)]
      .map((body) => timed(() => complete(body)));
    const [p, c, ...rs] = await Promise.all([plain, constrained, ...refused]);
    assert.equal(p.status, 200, p.text);
    assert.ok(p.json.usage.completion_tokens > 0, p.text);
    assert.equal(c.status, 200, c.text);
    assert.ok(['yes', 'no'].includes(c.json.choices[0].text), c.text);
    for (const [i, x] of rs.entries()) assertRefused(`concurrent ${i}`, x, ['response_format', 'guided_json'], [/limit of/]);
    const h = await fetch(server.url + '/health');
    assert.equal(h.status, 200);
  });

  test('format email with maxLength 40 gives an email address of at most 40 characters', { timeout: 120000 }, async (t) => {
    const schema = { type: 'string', format: 'email', maxLength: 40 };
    const validate = makeAjv().compile(schema);
    const texts = [];
    for (const seed of [1, 2, 3, 4, 5, 6]) {
      const r = await complete({ ...rf(schema, 'email'), max_tokens: 100, temperature: 1.0, seed });
      assert.equal(r.status, 200, r.text);
      const choice = r.json.choices[0];
      // At most 42 characters of JSON: the grammar ends it long before max_tokens.
      assert.equal(choice.finish_reason, 'stop', r.text);
      const value = JSON.parse(choice.text);
      assert.equal(typeof value, 'string', choice.text);
      assert.ok(value.length <= 40, `${value.length} characters: ${choice.text}`);
      assert.ok(validate(value), `${choice.text}: ${JSON.stringify(validate.errors)}`);
      texts.push(choice.text);
    }
    const r = await chat({ messages: [{ role: 'user', content: 'Write your email address.' }], ...rf(schema, 'email'),
      max_tokens: 100, temperature: 1.0, seed: 7 });
    assert.equal(r.status, 200, r.text);
    const content = r.json.choices[0].message.content;
    const value = JSON.parse(content);
    assert.ok(typeof value === 'string' && value.length <= 40 && validate(value), content);
    t.diagnostic(`outputs: ${texts.join(' ')} ${content}`);
  });

  test('a grammar too ambiguous to follow ends the output with the reason as stop_reason', { timeout: 60000 }, async () => {
    // Every "a" doubles the ways to read the output so far (grammar/README.md); the bias makes
    // the model write a's until the matcher's cap (1,024 stacks) is passed, ten or so tokens in.
    const doubling = 'root ::= s\ns ::= "a" s "b" | "a" t "c" | ""\nt ::= s\n';
    const aTokens = [];
    for (const id of [100, 261, 412]) {
      const d = await postJson(server.url + '/detokenize', { tokens: [id] });
      if (d.json?.prompt === 'a') aTokens.push(id);
    }
    assert.ok(aTokens.length > 0, 'no token reads "a" in this vocabulary');
    const r = await complete({ prompt: PROMPT, guided_grammar: doubling, max_tokens: 40, temperature: 0,
      logit_bias: Object.fromEntries(aTokens.map((id) => [id, 100])) });
    assert.equal(r.status, 200, r.text);
    const choice = r.json.choices[0];
    assert.equal(choice.finish_reason, 'stop', r.text);
    assert.match(choice.stop_reason ?? '', /too ambiguous: more than 1,024/);
    assert.match(choice.text, /^a{5,20}$/);
    assert.match(server.logs, /too ambiguous/);
  });
});
