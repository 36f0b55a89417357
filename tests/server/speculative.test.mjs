// `vesper serve` with each speculative proposer (n-gram prompt lookup, a draft model, Medusa
// heads): greedy answers (plain and streamed) equal `vesper generate` without speculation, and
// /metrics reports the spec_decode_* counters.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, postJson, readSse, metrics, generateJson } from './server_harness.mjs';

const prompts = ['Once upon a time', 'Lily had a red ball. Lily had a red ball. Lily had a'];

const proposers = [
  { name: 'n-gram', args: ['--speculative-model', '[ngram]', '--num-speculative-tokens', '4'],
    log: /speculative decoding: n-gram prompt lookup \(n 1\.\.4\), 4 tokens per step/ },
  { name: 'draft model', args: ['--speculative-model', '../shared/models/stories-draft.gguf', '--num-speculative-tokens', '4'],
    log: /speculative decoding: draft model \.\.\/shared\/models\/stories-draft\.gguf/ },
  { name: 'Medusa heads', args: ['--speculative-model', '../shared/models/medusa', '--num-speculative-tokens', '8'],
    log: /speculative decoding: Medusa heads .*\(4 heads in f32, a tree of candidates\), 8 tokens per step/ },
];

for (const proposer of proposers) {
  describe(proposer.name, () => {
    let server;
    before(async () => { server = await startServer(proposer.args); });
    after(async () => { await server?.stop(); });

    test('greedy completions equal decoding without speculation, streamed or not', async () => {
      assert.match(server.logs, proposer.log);
      for (const prompt of prompts) {
        const expected = await generateJson(prompt, 48);
        const r = await postJson(server.url + '/v1/completions', { prompt, max_tokens: 48, temperature: 0 });
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.choices[0].text, expected.text);
        assert.equal(r.json.usage.completion_tokens, 48);
        const res = await fetch(server.url + '/v1/completions', {
          method: 'POST', headers: { 'Content-Type': 'application/json' },
          body: JSON.stringify({ prompt, max_tokens: 48, temperature: 0, stream: true }),
        });
        const { events, done } = await readSse(res);
        assert.ok(done);
        assert.equal(events.map((e) => e.choices[0]?.text ?? '').join(''), expected.text);
      }
    });

    test('/metrics counts drafts, proposals and acceptances', async () => {
      const { values, text } = await metrics(server.url);
      for (const name of ['vesper:spec_decode_num_drafts_total', 'vesper:spec_decode_num_draft_tokens_total',
        'vesper:spec_decode_num_accepted_tokens_total']) {
        assert.ok(values[name] > 0, `${name} is ${values[name]}`);
      }
      assert.ok(values['vesper:spec_decode_num_accepted_tokens_total'] <= values['vesper:spec_decode_num_draft_tokens_total']);
      assert.match(text, /vesper:spec_decode_num_accepted_tokens_per_pos\{[^}]*position="0"\} \d+/);
    });
  });
}
