// Structured output (constrained decoding) through `vesper serve`: 50 real-world JSON schemas
// (tests/server/schemas/) sampled 20 times each through every request spelling (OpenAI's
// response_format, vLLM's guided_json and structured_outputs.json, llama.cpp's json_schema), each
// output that stops checked with ajv; chat through the OpenAI SDK; vLLM's guided_regex,
// guided_choice and guided_grammar and llama.cpp's grammar checked by JS recognisers of the same
// languages; greedy output unchanged by concurrent requests; and every malformed constraint a
// 400 naming the field, after which the server keeps serving.
//
// The model is stories260K (children's stories, 512-token vocabulary): it knows nothing of
// JSON, so the grammar alone makes the output valid. stories260K.gguf declares a 128-token
// context, too short for 400-token outputs; stories260K-f32.gguf holds the same weights with a
// 2048-token context, served here at the 512 tokens the model was trained with.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { LengthFinishReasonError } from 'openai/error';
import { makeParseableResponseFormat } from 'openai/lib/parser';
import { startServer, postJson, readSse, storiesLong } from './server_harness.mjs';
import { makeAjv, schemaNames } from './schemas/check.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const MODEL = 'stories260K-f32';
// stories260K writes long free text where a format leaves it free (an email's local part and
// domain, up to RFC 5321's limits): a budget well past the schemas' typical output.
const MAX_TOKENS = 900;
// Under the sanitizers (the asan test preset sets VESPER_SANITIZED) the sweep checks memory, not
// statistics: five seeds, which still send every spelling once per schema.
const SEEDS = Array.from({ length: process.env.VESPER_SANITIZED ? 5 : 20 }, (_, i) => i + 1);
const CONCURRENCY = 16;
// The least share of a schema's (or regex's, or grammar's) sampled outputs that must end because
// the grammar is complete (finish_reason "stop"); the rest may run into max_tokens ("length")
// and cannot be checked whole. The schemas bound their strings and arrays, so only recursion,
// long numbers or whitespace can run long: if in practice every output stops, tighten this to 1.
// (Five seeds under the sanitizers: one of them may run long, as one of twenty may.)
const MIN_STOP_FRACTION = process.env.VESPER_SANITIZED ? 0.8 : 0.95;
// json_object allows any object (unbounded strings, nesting), and stories260K, not a JSON
// model, writes member after member of story text: few outputs close within the budget, so
// only those that stop are checked whole.
const JSON_OBJECT_MIN_STOP_FRACTION = 0;

const PROMPTS = [
  'Once upon a time, there was a little girl named Lily. She',
  'One day, a boy named Tom went to the park with his dog.',
  'The cat and the bird were best friends. Every morning they',
  'Once upon a time, in a big green forest, there lived a bear.',
  'Sue had a red ball. She liked to play with it in the sun.',
];

const schemas = Object.fromEntries(schemaNames.map((name) =>
  [name, JSON.parse(fs.readFileSync(path.join(here, 'schemas', name + '.json'), 'utf8'))]));
const ajv = makeAjv();
const validators = Object.fromEntries(schemaNames.map((name) => [name, ajv.compile(schemas[name])]));

// Every way a request can carry a JSON schema; the sweep rotates through them.
const SPELLINGS = {
  'response_format': (name, schema) =>
    ({ response_format: { type: 'json_schema', json_schema: { name, schema, strict: true } } }),
  'guided_json': (name, schema) => ({ guided_json: schema }),
  'guided_json (JSON text)': (name, schema) => ({ guided_json: JSON.stringify(schema) }),
  'structured_outputs.json': (name, schema) => ({ structured_outputs: { json: schema } }),
  'json_schema (llama.cpp)': (name, schema) => ({ json_schema: schema }),
};
const spellingNames = Object.keys(SPELLINGS);

// At most n calls of fn at once.
function limiter(n) {
  let active = 0;
  const queue = [];
  const next = () => {
    if (active >= n || queue.length === 0) return;
    ++active;
    const { fn, resolve, reject } = queue.shift();
    fn().then(resolve, reject).finally(() => { --active; next(); });
  };
  return (fn) => new Promise((resolve, reject) => { queue.push({ fn, resolve, reject }); next(); });
}

const clip = (s, n = 160) => (s.length > n ? JSON.stringify(s.slice(0, n)) + '...' : JSON.stringify(s));

// Checks one constrained completion: 200, finish_reason stop or length (length only at
// max_tokens), no whitespace around the text. Returns {finish, text} or throws.
function constrainedChoice(r, { chat = false, maxTokens = MAX_TOKENS } = {}) {
  assert.equal(r.status, 200, r.text);
  const choice = r.json.choices[0];
  const text = chat ? choice.message.content : choice.text;
  assert.equal(typeof text, 'string', r.text);
  assert.ok(['stop', 'length'].includes(choice.finish_reason), `finish_reason ${choice.finish_reason}: ${r.text}`);
  if (choice.finish_reason === 'length') {
    assert.equal(r.json.usage.completion_tokens, maxTokens, `"length" before max_tokens: ${clip(r.text, 400)}`);
    assert.ok(text === text.trimStart(), `leading whitespace: ${clip(text)}`);
  } else {
    assert.ok(text === text.trim(), `whitespace around the constrained text: ${clip(text)}`);
  }
  return { finish: choice.finish_reason, text };
}

// Checks the outputs of one constraint over many seeds: every one that stopped passes
// `check(text)` (which returns an error string or null), and at least `minStop` of them stopped.
// Reports a one-line summary (through `report`, before failing) and returns it.
function checkOutputs(label, outputs, check, { minStop = MIN_STOP_FRACTION, report = () => {} } = {}) {
  const failures = [];
  const lengths = [];
  let ok = 0;
  for (const o of outputs) {
    if (o.finish === 'length') { lengths.push(`seed ${o.seed} (${o.how}): ${clip(o.text, 80)}`); continue; }
    const err = check(o.text);
    if (err) failures.push(`seed ${o.seed} (${o.how}): ${err}\n    output ${clip(o.text, 400)}`);
    else ++ok;
  }
  const lengthSeeds = outputs.filter((o) => o.finish === 'length').map((o) => o.seed);
  const line = `${label}: ${ok} ok, ${failures.length} invalid, ${lengths.length} length` +
    (lengths.length ? ` (seeds ${lengthSeeds.join(', ')})` : '');
  report(line);
  if (failures.length) {
    assert.fail(`${label}: ${failures.length} output(s) that stopped are not in the language:\n${failures.join('\n')}`);
  }
  const stopped = outputs.length - lengths.length;
  assert.ok(stopped >= Math.ceil(minStop * outputs.length),
    `${label}: only ${stopped} of ${outputs.length} outputs stopped (need ${Math.ceil(minStop * outputs.length)}); ` +
    `ran into max_tokens:\n${lengths.join('\n')}`);
  return line;
}

// An error string when `text` is not JSON valid under the schema `name`, else null.
function schemaError(name) {
  return (text) => {
    let value;
    try { value = JSON.parse(text); } catch (e) { return `not JSON: ${e.message}`; }
    const validate = validators[name];
    return validate(value) ? null : `invalid: ${ajv.errorsText(validate.errors)}`;
  };
}

const wholeMatch = (re, flags = '') => new RegExp('^(?:' + re + ')$', flags);

// guided_regex patterns (full match; JS and the usual regex dialects read them alike).
const REGEXES = {
  phone: String.raw`\(\d{3}\) \d{3}-\d{4}`,
  date: String.raw`(19|20)\d{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])`,
  email: String.raw`[a-z]{1,12}@[a-z]{1,10}\.com`,
  sentence: '(the|a) (cat|dog|bird) (sat|ran|flew)( away)?',
  age: String.raw`[A-Z][a-z]{1,8} is [1-9][0-9]? years? old\.`,
};

// Integer arithmetic in GBNF (rules used before they are defined, comments, groups with
// bounded repetition, an optional rule) and a recogniser of the same language.
const ARITHMETIC_GBNF = String.raw`# integer arithmetic: + - * / and parentheses
root   ::= expr
expr   ::= term (ws ("+" | "-") ws term){0,3}
term   ::= factor (ws ("*" | "/") ws factor){0,2}
factor ::= number | "(" expr ")"   # nesting is the only recursion
number ::= [0-9] | [1-9] [0-9]{1,2}
ws     ::= " "?
`;
function isArithmetic(s) {
  let i = 0;
  const number = () => {
    const m = /^[0-9]+/.exec(s.slice(i));
    if (!m || !/^(?:[0-9]|[1-9][0-9]{1,2})$/.test(m[0])) return false;
    i += m[0].length;
    return true;
  };
  const factor = () => {
    if (s[i] !== '(') return number();
    ++i;
    if (!expr()) return false;
    if (s[i] !== ')') return false;
    ++i;
    return true;
  };
  // item (ws op ws item){0,max}: an optional space not followed by an operator ends the loop (no
  // rule of the grammar can use it, so the whole text then fails at the end).
  const loop = (item, ops, max) => {
    if (!item()) return false;
    for (let k = 0; k < max; ++k) {
      const save = i;
      if (s[i] === ' ') ++i;
      if (i >= s.length || !ops.includes(s[i])) { i = save; break; }
      ++i;
      if (s[i] === ' ') ++i;
      if (!item()) return false;
    }
    return true;
  };
  const term = () => loop(factor, '*/', 2);
  const expr = () => loop(term, '+-', 3);
  return expr() && i === s.length;
}

// A list with a literal header, "\n" escapes and alternatives that overlap a character class.
const LIST_GBNF = String.raw`# a shopping list of one to four items
root ::= "Shopping list:" ("\n- " item){1,4}
item ::= qty " " food
qty  ::= [1-9] | "a few" | "some"
food ::= "apples" | "eggs" | "milk" | "bread" | [a-z]{3,10}
`;
const LIST_RE = /^Shopping list:(?:\n- (?:[1-9]|a few|some) (?:apples|eggs|milk|bread|[a-z]{3,10})){1,4}$/;

// key=value pairs: a negated class with escapes, several value kinds.
const PAIRS_GBNF = String.raw`root  ::= pair ("; " pair){0,2}
pair  ::= key "=" value
key   ::= [a-z] [a-z0-9_]{0,7}
value ::= "\"" [^"\\\n]{0,12} "\"" | [0-9]{1,4} | "true" | "false"
`;
const PAIR = String.raw`[a-z][a-z0-9_]{0,7}=(?:"[^"\\\n]{0,12}"|[0-9]{1,4}|true|false)`;
const PAIRS_RE = new RegExp(`^${PAIR}(?:; ${PAIR}){0,2}$`, 'u');

describe('structured output', () => {
  let server;
  let client;
  const limit = limiter(CONCURRENCY);
  const complete = (body) => postJson(server.url + '/v1/completions', { model: MODEL, max_tokens: MAX_TOKENS, ...body });
  const chat = (body) => postJson(server.url + '/v1/chat/completions', { model: MODEL, max_tokens: MAX_TOKENS, ...body });

  // The sweep's outputs, name -> Promise<[{seed, how, finish, text}]>; all queued at once so the
  // server always has CONCURRENCY requests, each schema's test awaiting its own.
  const sweep = new Map();
  const sweepSummaries = [];

  before(async () => {
    server = await startServer(['--max-num-seqs', '32', '--max-model-len', '1024'], storiesLong);
    client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 120000 });
    schemaNames.forEach((name, index) => {
      const runs = SEEDS.map((seed) => limit(async () => {
        const how = spellingNames[(index + seed) % spellingNames.length];
        const r = await complete({
          // Each run of five seeds sends every spelling once, with one prompt.
          prompt: PROMPTS[(index + Math.floor((seed - 1) / spellingNames.length)) % PROMPTS.length], temperature: 1.0, seed,
          ...SPELLINGS[how](name, schemas[name]),
        });
        try {
          return { seed, how, ...constrainedChoice(r) };
        } catch (e) {
          e.message = `${name} seed ${seed} (${how}): ${e.message}`;
          throw e;
        }
      }));
      const all = Promise.all(runs);
      all.catch(() => {});  // awaited by the schema's test; not unhandled when that test is filtered out
      sweep.set(name, all);
    });
  });
  after(async () => { await server?.stop(); });

  test('the JS recognisers accept and refuse what their patterns and grammars do (no server)', () => {
    const inOut = [
      [(s) => wholeMatch(REGEXES.phone).test(s), ['(555) 123-4567'], ['555-123-4567', '(555) 123-45678', '(555)123-4567']],
      [(s) => wholeMatch(REGEXES.date).test(s), ['2024-02-29', '1999-12-31'], ['2024-13-01', '2024-00-10', '1899-01-01', '2024-01-32']],
      [(s) => wholeMatch(REGEXES.email).test(s), ['tom@park.com'], ['tom@park.org', '@park.com', 'Tom@park.com', 'tom@park.com ']],
      [(s) => wholeMatch(REGEXES.sentence).test(s), ['the cat sat', 'a bird flew away'], ['the cat', 'the cat sat away ', 'cat sat']],
      [(s) => wholeMatch(REGEXES.age).test(s), ['Lily is 5 years old.', 'Tom is 1 year old.'], ['Lily is 05 years old.', 'lily is 5 years old.']],
      [isArithmetic, ['7', '12+3', '(1 + 2) * 30', '((4))', '1*2/3 - 4', '(1+2+3+4)'],
        ['', '01', '1234', '1 +', '(1', '1  + 2', '1*2*3*4', ' 1', '1+2+3+4+5', '( 1)', '1 2']],
      [(s) => LIST_RE.test(s), ['Shopping list:\n- 3 eggs', 'Shopping list:\n- a few apples\n- some bread\n- 2 cake\n- 9 milk'],
        ['Shopping list:', 'Shopping list:\n- 3 eggs\n', 'Shopping list:\n- 0 eggs', 'Shopping list:\n- 3 ab']],
      [(s) => PAIRS_RE.test(s), ['a=1', 'name="Lily"; age=5; ok=true', 'k_2="é ü"'],
        ['a=', 'A=1', 'a="x"; b=1; c=2; d=3', 'a="\\"', 'a=12345']],
    ];
    for (const [accepts, good, bad] of inOut) {
      for (const s of good) assert.ok(accepts(s), `should accept ${JSON.stringify(s)}`);
      for (const s of bad) assert.ok(!accepts(s), `should refuse ${JSON.stringify(s)}`);
    }
  });

  test('the schemas compile and accept their hand-made examples (no server)', () => {
    const examples = JSON.parse(fs.readFileSync(path.join(here, 'schemas', 'examples.json'), 'utf8'));
    assert.equal(schemaNames.length, 50);
    for (const name of schemaNames) assert.equal(schemaError(name)(JSON.stringify(examples[name])), null, name);
  });

  describe(`50 schemas x ${SEEDS.length} seeds through every spelling; each output that stops is valid`, () => {
    for (const name of schemaNames) {
      test(name, { timeout: 300000 }, async (t) => {
        const outputs = await sweep.get(name);
        checkOutputs(name, outputs, schemaError(name), { report: (line) => { sweepSummaries.push(line); t.diagnostic(line); } });
      });
    }
    test('summary', (t) => {
      for (const line of sweepSummaries) t.diagnostic(line);
      const total = (re) => sweepSummaries.reduce((n, line) => n + Number(line.match(re)?.[1] ?? 0), 0);
      t.diagnostic(`all schemas: ${total(/(\d+) ok/)} ok, ${total(/(\d+) invalid/)} invalid, ${total(/(\d+) length/)} length ` +
        `(${sweepSummaries.length} of ${schemaNames.length} schemas completed their requests)`);
    });
  });

  // The masks of states after the first are computed on the runner's prefetching thread while
  // the next forward pass runs (grammar/mask_prefetcher.h), not on the step loop.
  test('grammar masks are computed ahead of their step, off the step loop (/metrics)', { timeout: 300000 }, async () => {
    await Promise.allSettled([...sweep.values()]);
    const text = await (await fetch(server.url + '/metrics')).text();
    const m = text.match(/^vesper:grammar_masks_prefetched_total\{[^}]*\} (\d+)/m);
    assert.ok(m, 'vesper:grammar_masks_prefetched_total is exported');
    assert.ok(Number(m[1]) > 0, `masks prefetched: ${m[1]}`);
  });

  test('every spelling of a schema gives the same output for the same seed', { timeout: 120000 }, async () => {
    for (const name of ['04-todo-list', '15-shape', '42-file-system']) {
      const texts = {};
      for (const how of spellingNames) {
        const r = await complete({ prompt: PROMPTS[0], temperature: 1.0, seed: 7, ...SPELLINGS[how](name, schemas[name]) });
        texts[how] = constrainedChoice(r).text;
      }
      for (const how of spellingNames) {
        assert.equal(texts[how], texts.response_format, `${name}: ${how} differs from response_format`);
      }
    }
  });

  test('streamed constrained output equals the non-streamed output', { timeout: 120000 }, async () => {
    const name = '14-team-roster';
    const body = { prompt: PROMPTS[1], temperature: 1.0, seed: 3, ...SPELLINGS.response_format(name, schemas[name]) };
    const plain = constrainedChoice(await complete(body));
    const res = await fetch(server.url + '/v1/completions', {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: MODEL, max_tokens: MAX_TOKENS, ...body, stream: true }),
    });
    assert.equal(res.status, 200);
    const { events, done } = await readSse(res);
    assert.ok(done);
    assert.equal(events.map((e) => e.choices[0]?.text ?? '').join(''), plain.text);
    assert.equal(events.findLast((e) => e.choices[0]?.finish_reason).choices[0].finish_reason, plain.finish);

    const messages = [{ role: 'user', content: 'Tell me about the team.' }];
    const chatPlain = constrainedChoice(await chat({ messages, temperature: 1.0, seed: 5,
      response_format: body.response_format }), { chat: true });
    const stream = await client.chat.completions.create({ model: MODEL, messages, max_tokens: MAX_TOKENS,
      temperature: 1.0, seed: 5, response_format: body.response_format, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    assert.equal(text, chatPlain.text);
  });

  describe('chat completions through the OpenAI SDK', () => {
    const CHAT_SCHEMAS = ['04-todo-list', '15-shape', '35-nullable-fields', '41-game-state', '48-word-counts'];
    const CHAT_SEEDS = [1, 2, 3, 4, 5, 6];
    const messages = [{ role: 'user', content: 'Once upon a time, a little fox made a list. What was on it?' }];

    test('response_format json_schema: content is valid JSON under the schema', { timeout: 180000 }, async (t) => {
      for (const name of CHAT_SCHEMAS) {
        const outputs = await Promise.all(CHAT_SEEDS.map((seed) => limit(async () => {
          const r = await client.chat.completions.create({
            model: MODEL, messages, max_tokens: MAX_TOKENS, temperature: 1.0, seed,
            response_format: { type: 'json_schema', json_schema: { name: `story_${name.slice(0, 2)}`, schema: schemas[name], strict: true } },
          });
          const c = r.choices[0];
          assert.equal(c.message.role, 'assistant');
          assert.ok(['stop', 'length'].includes(c.finish_reason), c.finish_reason);
          if (c.finish_reason === 'stop') assert.equal(c.message.content, c.message.content.trim());
          return { seed, how: 'chat', finish: c.finish_reason, text: c.message.content };
        })));
        checkOutputs(`chat ${name}`, outputs, schemaError(name), { report: (l) => t.diagnostic(l) });
      }
    });

    test('beta.chat.completions.parse gives the parsed object', { timeout: 120000 }, async () => {
      const name = '17-rgb-tuple';
      let parsedOnce = false;
      for (const seed of CHAT_SEEDS) {
        const format = makeParseableResponseFormat(
          { type: 'json_schema', json_schema: { name: 'rgb', schema: schemas[name], strict: true } },
          (content) => {
            const v = JSON.parse(content);
            assert.ok(validators[name](v), `${content}: ${ajv.errorsText(validators[name].errors)}`);
            return v;
          });
        let r;
        try {
          r = await client.beta.chat.completions.parse({ model: MODEL, messages, max_tokens: MAX_TOKENS, temperature: 1.0, seed,
            response_format: format });
        } catch (e) {
          if (e instanceof LengthFinishReasonError) continue;  // ran into max_tokens
          throw e;
        }
        assert.deepEqual(r.choices[0].message.parsed, JSON.parse(r.choices[0].message.content));
        parsedOnce = true;
      }
      assert.ok(parsedOnce, 'no seed gave a complete output');
    });

    test('json_object gives a JSON object (chat, completions, structured_outputs.json_object)', { timeout: 180000 }, async (t) => {
      const isObject = (text) => {
        let v;
        try { v = JSON.parse(text); } catch (e) { return `not JSON: ${e.message}`; }
        return v !== null && typeof v === 'object' && !Array.isArray(v) ? null : `not an object: ${typeof v}`;
      };
      const chatOutputs = await Promise.all(SEEDS.slice(0, 10).map((seed) => limit(async () => {
        const r = await client.chat.completions.create({ model: MODEL, messages, max_tokens: MAX_TOKENS, temperature: 1.0,
          seed, response_format: { type: 'json_object' } });
        const c = r.choices[0];
        if (c.finish_reason === 'stop') assert.equal(c.message.content, c.message.content.trim());
        return { seed, how: 'chat', finish: c.finish_reason, text: c.message.content };
      })));
      checkOutputs('json_object (chat)', chatOutputs, isObject,
        { minStop: JSON_OBJECT_MIN_STOP_FRACTION, report: (l) => t.diagnostic(l) });
      const completionOutputs = await Promise.all(SEEDS.slice(0, 10).map((seed) => limit(async () => {
        const how = seed % 2 ? 'response_format' : 'structured_outputs.json_object';
        const constraint = seed % 2 ? { response_format: { type: 'json_object' } } : { structured_outputs: { json_object: true } };
        const r = await complete({ prompt: PROMPTS[seed % PROMPTS.length], temperature: 1.0, seed, ...constraint });
        return { seed, how, ...constrainedChoice(r) };
      })));
      checkOutputs('json_object (completions)', completionOutputs, isObject,
        { minStop: JSON_OBJECT_MIN_STOP_FRACTION, report: (l) => t.diagnostic(l) });
      // Cut or not, every output is the start of an object.
      for (const o of [...chatOutputs, ...completionOutputs]) assert.ok(o.text.startsWith('{'), o.text);
    });

    test('response_format type "text" is unconstrained', { timeout: 60000 }, async () => {
      const r = await chat({ messages, max_tokens: 16, temperature: 0, response_format: { type: 'text' } });
      const plain = await chat({ messages, max_tokens: 16, temperature: 0 });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.json.choices[0].message.content, plain.json.choices[0].message.content);
    });
  });

  // Samples `body` (plus a spelling chosen per seed) over SEEDS; outputs for checkOutputs.
  const sampleSeeds = (body, spellings) => Promise.all(SEEDS.map((seed) => limit(async () => {
    const [how, constraint] = spellings[seed % spellings.length];
    const r = await complete({ prompt: PROMPTS[seed % PROMPTS.length], temperature: 1.0, seed, ...body, ...constraint });
    try {
      return { seed, how, ...constrainedChoice(r) };
    } catch (e) {
      e.message = `seed ${seed} (${how}): ${e.message}`;
      throw e;
    }
  })));

  describe('regex, choice and grammar', () => {
    for (const [label, re] of Object.entries(REGEXES)) {
      test(`guided_regex / structured_outputs.regex: ${label} ${re}`, { timeout: 120000 }, async (t) => {
        const outputs = await sampleSeeds({}, [
          ['guided_regex', { guided_regex: re }],
          ['structured_outputs.regex', { structured_outputs: { regex: re } }],
        ]);
        const full = wholeMatch(re);
        checkOutputs(`regex ${label}`, outputs, (text) => (full.test(text) ? null : `does not match ${full}`), { report: (l) => t.diagnostic(l) });
      });
    }

    test('guided_choice / structured_outputs.choice: exactly one choice, and more than one over the seeds', { timeout: 120000 }, async (t) => {
      // "rain" is a prefix of "rainbow"; one choice has a space, one quotes and a backslash.
      const choices = ['sunny', 'rain', 'rainbow', 'cloudy and cold', 'a "big" storm \\o/'];
      const outputs = await sampleSeeds({}, [
        ['guided_choice', { guided_choice: choices }],
        ['structured_outputs.choice', { structured_outputs: { choice: choices } }],
      ]);
      checkOutputs('choice', outputs, (text) => (choices.includes(text) ? null : 'not one of the choices'),
        { minStop: 1, report: (l) => t.diagnostic(l) });
      const seen = new Set(outputs.map((o) => o.text));
      t.diagnostic(`choices seen: ${JSON.stringify([...seen])}`);
      assert.ok(seen.size > 1, `every seed gave ${JSON.stringify([...seen])}`);
    });

    test('guided_grammar / grammar: arithmetic expressions', { timeout: 120000 }, async (t) => {
      const outputs = await sampleSeeds({}, [
        ['guided_grammar', { guided_grammar: ARITHMETIC_GBNF }],
        ['grammar (llama.cpp)', { grammar: ARITHMETIC_GBNF }],
      ]);
      checkOutputs('arithmetic', outputs, (text) => (isArithmetic(text) ? null : 'not an expression of the grammar'), { report: (l) => t.diagnostic(l) });
    });

    test('grammar / structured_outputs.grammar: a shopping list', { timeout: 120000 }, async (t) => {
      const outputs = await sampleSeeds({}, [
        ['grammar (llama.cpp)', { grammar: LIST_GBNF }],
        ['structured_outputs.grammar', { structured_outputs: { grammar: LIST_GBNF } }],
      ]);
      checkOutputs('shopping list', outputs, (text) => (LIST_RE.test(text) ? null : `does not match ${LIST_RE}`), { report: (l) => t.diagnostic(l) });
    });

    test('guided_grammar: key=value pairs', { timeout: 120000 }, async (t) => {
      const outputs = await sampleSeeds({}, [['guided_grammar', { guided_grammar: PAIRS_GBNF }]]);
      checkOutputs('key=value', outputs, (text) => (PAIRS_RE.test(text) ? null : `does not match ${PAIRS_RE}`), { report: (l) => t.diagnostic(l) });
    });
  });

  test('greedy output under a schema is the same alone and with 8 different requests in flight', { timeout: 180000 }, async () => {
    const name = '22-recipe';
    const target = { prompt: PROMPTS[3], temperature: 0, ...SPELLINGS.response_format(name, schemas[name]) };
    const alone = constrainedChoice(await complete(target));
    if (alone.finish === 'stop') assert.equal(schemaError(name)(alone.text), null);
    const others = () => [
      { prompt: PROMPTS[0], temperature: 1, seed: 101, guided_json: schemas['07-tree-node'] },
      { prompt: PROMPTS[1], temperature: 1, seed: 102, structured_outputs: { json: schemas['33-invoice'] } },
      { prompt: PROMPTS[2], temperature: 1, seed: 103, json_schema: schemas['09-nested-comments'] },
      { prompt: PROMPTS[3], temperature: 0.7, seed: 104, guided_regex: '[a-z]+@[a-z]+\\.com' },
      { prompt: PROMPTS[4], temperature: 1, seed: 105, grammar: ARITHMETIC_GBNF },
      { prompt: PROMPTS[0], temperature: 1, seed: 106, response_format: { type: 'json_object' } },
      { prompt: PROMPTS[1], temperature: 0, ...SPELLINGS.response_format('01-user-profile', schemas['01-user-profile']) },
      { prompt: PROMPTS[2], temperature: 1, seed: 108, max_tokens: 200 },  // unconstrained
    ].map((b) => complete(b));
    // Others first, then the target joins a running batch.
    let inflight = others();
    const joined = constrainedChoice(await complete(target));
    for (const r of await Promise.all(inflight)) assert.equal(r.status, 200, r.text);
    // The target first, then the others join it.
    const first = complete(target);
    inflight = others();
    const joinedBy = constrainedChoice(await first);
    for (const r of await Promise.all(inflight)) assert.equal(r.status, 200, r.text);
    assert.equal(joined.text, alone.text, 'joining 8 running requests changed the greedy output');
    assert.equal(joinedBy.text, alone.text, '8 requests joining changed the greedy output');
    assert.equal(joined.finish, alone.finish);
    // Another spelling of the same schema, alone again.
    const again = constrainedChoice(await complete({ prompt: target.prompt, temperature: 0, guided_json: schemas[name] }));
    assert.equal(again.text, alone.text);
  });

  describe('malformed constraints are 400s naming the field; the server keeps serving', () => {
    const TYPE42 = { type: 42 };
    const MULTIPLE_OF = { type: 'object', properties: { n: { type: 'integer', multipleOf: 3 } }, required: ['n'] };
    const UNIQUE_ITEMS = { type: 'array', items: { type: 'integer' }, uniqueItems: true, maxItems: 3 };
    const NOT = { type: 'object', properties: { a: { type: 'string' } }, not: { required: ['a'] } };
    const BAD_REF = { type: 'object', properties: { a: { $ref: '#/$defs/missing' } }, required: ['a'] };
    const rf = (schema) => ({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } });

    // [label, body, fields one of which param or message must name, what the message must also say]
    const cases = [
      ['multipleOf via response_format', rf(MULTIPLE_OF), ['response_format.json_schema.schema'], /multipleOf/],
      ['uniqueItems via guided_json', { guided_json: UNIQUE_ITEMS }, ['guided_json'], /uniqueItems/],
      ['not via structured_outputs.json', { structured_outputs: { json: NOT } }, ['structured_outputs.json'], /['"`]not['"`]/],
      ['multipleOf via json_schema (llama.cpp)', { json_schema: MULTIPLE_OF }, ['json_schema'], /multipleOf/],
      ['uniqueItems in guided_json JSON text', { guided_json: JSON.stringify(UNIQUE_ITEMS) }, ['guided_json'], /uniqueItems/],
      ['type 42 via response_format', rf(TYPE42), ['response_format.json_schema.schema'], /type/],
      ['type 42 via guided_json', { guided_json: TYPE42 }, ['guided_json'], /type/],
      ['unknown type name', { guided_json: { type: 'strnig' } }, ['guided_json'], /strnig/],
      ['$ref that does not resolve via response_format', rf(BAD_REF), ['response_format.json_schema.schema'], /missing/],
      ['$ref that does not resolve via structured_outputs.json', { structured_outputs: { json: { $ref: '#/definitions/nope' } } },
        ['structured_outputs.json'], /nope/],
      ['a schema pattern that is not a regex', { guided_json: { type: 'string', pattern: '^(ab$' } }, ['guided_json'], null],
      ['guided_json text that is not JSON', { guided_json: '{"type": "object",' }, ['guided_json'], null],
      ['guided_regex "(ab"', { guided_regex: '(ab' }, ['guided_regex'], null],
      ['guided_regex "a{3,1}"', { guided_regex: 'a{3,1}' }, ['guided_regex'], null],
      ['guided_regex "(?=x)"', { guided_regex: '(?=x)' }, ['guided_regex'], null],
      ['structured_outputs.regex "(ab"', { structured_outputs: { regex: '(ab' } }, ['structured_outputs.regex'], null],
      ['guided_regex not a string', { guided_regex: 42 }, ['guided_regex'], null],
      ['guided_choice not an array', { guided_choice: 'yes' }, ['guided_choice'], null],
      ['guided_grammar with an undefined rule', { guided_grammar: 'root ::= greeting " world"\n' }, ['guided_grammar'], /greeting/],
      ['grammar without root', { grammar: 'expr ::= "a" | "b"\n' }, ['grammar'], /root/],
      ['grammar with an unterminated literal', { grammar: 'root ::= "abc\n' }, ['grammar'], null],
      ['guided_grammar with an unbalanced parenthesis', { guided_grammar: 'root ::= ("a" | "b"\n' }, ['guided_grammar'], null],
      ['structured_outputs.grammar without ::=', { structured_outputs: { grammar: 'root = "a"\n' } }, ['structured_outputs.grammar'], null],
      ['guided_json and guided_regex', { guided_json: { type: 'integer', minimum: 0, maximum: 9 }, guided_regex: 'a+' },
        ['guided_json', 'guided_regex'], null],
      ['response_format and grammar', { ...rf({ type: 'boolean' }), grammar: 'root ::= "a"\n' }, ['response_format', 'grammar'], null],
      ['json_object and guided_choice', { response_format: { type: 'json_object' }, guided_choice: ['a', 'b'] },
        ['response_format', 'guided_choice'], null],
      ['two structured_outputs keys', { structured_outputs: { json: { type: 'boolean' }, regex: 'a+' } },
        ['structured_outputs.json', 'structured_outputs.regex'], null],
      ['guided_grammar and structured_outputs.choice', { guided_grammar: 'root ::= "a"\n', structured_outputs: { choice: ['a'] } },
        ['guided_grammar', 'structured_outputs.choice'], null],
      ['response_format type "xml"', { response_format: { type: 'xml' } }, ['response_format'], /xml/],
    ];

    const assertNamed = (label, r, fields, message) => {
      assert.equal(r.status, 400, `${label}: ${r.text}`);
      const e = r.json?.error;
      assert.ok(e, `${label}: no error object: ${r.text}`);
      for (const k of ['message', 'type', 'param', 'code']) assert.ok(k in e, `${label}: error lacks ${k}: ${r.text}`);
      assert.equal(e.type, 'invalid_request_error', `${label}: ${r.text}`);
      const said = `${e.param ?? ''} ${e.message}`;
      assert.ok(fields.some((f) => said.includes(f)), `${label}: neither param nor message names ${fields.join(' or ')}: ${r.text}`);
      if (message) assert.match(e.message, message, `${label}: ${r.text}`);
    };

    test('completions', { timeout: 120000 }, async () => {
      for (const [label, body, fields, message] of cases) {
        assertNamed(label, await complete({ prompt: PROMPTS[0], max_tokens: 8, ...body }), fields, message);
      }
      const r = await complete({ prompt: PROMPTS[0], max_tokens: 8, temperature: 0 });
      assert.equal(r.status, 200, r.text);
    });

    test('chat completions', { timeout: 120000 }, async () => {
      const messages = [{ role: 'user', content: 'Hi' }];
      for (const [label, body, fields, message] of cases) {
        assertNamed(`chat: ${label}`, await chat({ messages, max_tokens: 8, ...body }), fields, message);
      }
      // Through the SDK: an APIError with status 400 and the param.
      await assert.rejects(client.chat.completions.create({ model: MODEL, messages, max_tokens: 8,
        response_format: { type: 'json_schema', json_schema: { name: 'x', schema: MULTIPLE_OF, strict: true } } }),
      (e) => e.status === 400 && /response_format/.test(`${e.param} ${e.message}`) && /multipleOf/.test(e.message));
    });

    test('the server still serves plain and constrained requests', { timeout: 60000 }, async () => {
      const plain = await chat({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 8, temperature: 0 });
      assert.equal(plain.status, 200, plain.text);
      const r = constrainedChoice(await complete({ prompt: PROMPTS[0], temperature: 0, guided_choice: ['yes', 'no'] }));
      assert.ok(['yes', 'no'].includes(r.text), r.text);
      assert.equal(r.finish, 'stop');
      const h = await fetch(server.url + '/health');
      assert.equal(h.status, 200);
    });
  });
});
