// Tool calls through `vesper serve` and the official OpenAI Node SDK: "required" and named
// choices constrain the output to valid calls (checked against each tool's schema with ajv),
// streamed deltas reassemble into the same calls, "auto" reads calls with --tool-call-parser,
// and bad tools / choices are 400s naming the field.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Ajv from 'ajv';
import { startServer, postJson } from './server_harness.mjs';

const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Current weather in a city',
      parameters: {
        type: 'object',
        properties: {
          city: { type: 'string', maxLength: 24 },
          unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
          days: { type: 'integer', minimum: 1, maximum: 7 },
        },
        required: ['city', 'unit'],
        additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'set_alarm',
      parameters: {
        type: 'object',
        properties: { hour: { type: 'integer', minimum: 0, maximum: 23 }, label: { type: ['string', 'null'], maxLength: 16 } },
        required: ['hour', 'label'],
        additionalProperties: false,
      },
    },
  },
];
const ajv = new Ajv({ strict: false });
const validators = Object.fromEntries(tools.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));
const messages = [{ role: 'user', content: 'What is the weather like where the little dog lives?' }];

let server;
let client;
before(async () => {
  server = await startServer(['--enable-auto-tool-choice', '--tool-call-parser', 'hermes']);
  client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'unused', maxRetries: 0 });
});
after(async () => { await server?.stop(); });

function checkCalls(choice, names) {
  assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice));
  const calls = choice.message.tool_calls;
  assert.ok(Array.isArray(calls) && calls.length >= 1, JSON.stringify(choice.message));
  for (const call of calls) {
    assert.equal(call.type, 'function');
    assert.match(call.id, /^chatcmpl-tool-[0-9a-f]{32}$/);
    assert.ok(names.includes(call.function.name), call.function.name);
    const args = JSON.parse(call.function.arguments);
    const validate = validators[call.function.name];
    assert.ok(validate(args), `${call.function.arguments}: ${JSON.stringify(validate.errors)}`);
  }
  return calls;
}

// stories260K, left to itself, keeps adding calls to a list until max_tokens; with
// parallel_tool_calls false the list holds one call and every sample completes.
test('tool_choice "required": every sample is a valid call', { timeout: 120000 }, async () => {
  const seen = new Set();
  for (let seed = 1; seed <= 40; seed++) {
    const r = await client.chat.completions.create({
      model: 'stories260K-f32', messages, tools, tool_choice: 'required', parallel_tool_calls: false,
      temperature: 1.0, seed, max_tokens: 300,
    });
    const calls = checkCalls(r.choices[0], ['get_weather', 'set_alarm']);
    assert.equal(calls.length, 1);
    assert.equal(r.choices[0].message.content, null);
    for (const c of calls) seen.add(c.function.name);
  }
  assert.equal(seen.size, 2, 'both tools were called across seeds');
});

test('a named tool_choice calls that function with valid arguments', { timeout: 60000 }, async () => {
  for (let seed = 1; seed <= 8; seed++) {
    const r = await client.chat.completions.create({
      model: 'stories260K-f32', messages, tools, temperature: 1.0, seed, max_tokens: 200,
      tool_choice: { type: 'function', function: { name: 'set_alarm' } },
    });
    const calls = checkCalls(r.choices[0], ['set_alarm']);
    assert.equal(calls.length, 1);
  }
});

async function streamed(body) {
  const stream = await client.chat.completions.create({ ...body, stream: true });
  const calls = [];
  let finish = null;
  let content = '';
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    if (!choice) continue;
    if (choice.finish_reason) finish = choice.finish_reason;
    if (choice.delta?.content) content += choice.delta.content;
    for (const d of choice.delta?.tool_calls ?? []) {
      if (d.id) {
        assert.equal(d.index, calls.length, 'a new call comes with the next index');
        calls.push({ id: d.id, type: d.type, function: { name: d.function.name, arguments: d.function.arguments ?? '' } });
      } else {
        calls[d.index].function.arguments += d.function.arguments;
      }
    }
  }
  return { calls, finish, content };
}

test('streamed tool calls reassemble into the non-streamed calls', { timeout: 120000 }, async () => {
  for (const tool_choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
    for (let seed = 1; seed <= 4; seed++) {
      const body = { model: 'stories260K-f32', messages, tools, tool_choice, parallel_tool_calls: false, temperature: 1.0, seed, max_tokens: 300 };
      const plain = await client.chat.completions.create(body);
      const whole = checkCalls(plain.choices[0], ['get_weather', 'set_alarm']);
      const s = await streamed(body);
      assert.equal(s.finish, 'tool_calls');
      assert.equal(s.content, '');
      assert.deepEqual(s.calls.map((c) => [c.type, c.function.name, c.function.arguments]),
        whole.map((c) => [c.type, c.function.name, c.function.arguments]));
    }
  }
});

// "auto": the model's own output is parsed (hermes). stories260K never writes a call by itself,
// so a grammar makes it write one in hermes' format, and the parser must find it.
const hermesGrammar = String.raw`root ::= "I will check." "\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"" [a-z]{1,8} "\", \"unit\": \"celsius\"}}\n</tool_call>"
`;

test('tool_choice "auto" parses hermes calls, streamed and not', { timeout: 60000 }, async () => {
  const body = { model: 'stories260K-f32', messages, tools, temperature: 1.0, seed: 3, max_tokens: 200, guided_grammar: hermesGrammar };
  const plain = await client.chat.completions.create(body);
  const calls = checkCalls(plain.choices[0], ['get_weather']);
  assert.equal(plain.choices[0].message.content, 'I will check.');
  const s = await streamed(body);
  assert.equal(s.finish, 'tool_calls');
  assert.equal(s.content, 'I will check.\n');
  assert.deepEqual(s.calls.map((c) => [c.function.name, c.function.arguments]),
    calls.map((c) => [c.function.name, c.function.arguments]));
  // Without a call in the output, "auto" answers content.
  const text = await client.chat.completions.create({ ...body, guided_grammar: undefined, max_tokens: 12, temperature: 0 });
  assert.equal(text.choices[0].finish_reason, 'length');
  assert.equal(typeof text.choices[0].message.content, 'string');
  assert.equal(text.choices[0].message.tool_calls, undefined);
});

test('a conversation with earlier calls and tool results renders', { timeout: 30000 }, async () => {
  const r = await client.chat.completions.create({
    model: 'stories260K-f32', tools, temperature: 0, max_tokens: 8, tool_choice: 'none',
    messages: [
      ...messages,
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "oslo", "unit": "celsius"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '{"temperature": 3}' },
    ],
  });
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(typeof r.choices[0].message.content, 'string');
});

test('bad tools and tool choices are 400s naming the field', { timeout: 30000 }, async () => {
  const url = server.url + '/v1/chat/completions';
  const cases = [
    [{ tool_choice: 'required' }, 'tool_choice'],
    [{ tools, tool_choice: 'always' }, 'tool_choice'],
    [{ tools, tool_choice: { type: 'function', function: { name: 'fly' } } }, 'tool_choice.function.name'],
    [{ tools: [{ type: 'function', function: { name: 'has space' } }] }, 'tools[0].function.name'],
    [{ tools: [{ type: 'code_interpreter' }] }, 'tools[0].type'],
    [{ tools: [{ type: 'function' }] }, 'tools[0].function'],
    [{ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { x: { type: 'number', multipleOf: 3 } } } } }], tool_choice: 'required' }, 'tools'],
    [{ tools, tool_choice: 'required', response_format: { type: 'json_object' } }, 'response_format'],
  ];
  for (const [extra, param] of cases) {
    const r = await postJson(url, { model: 'stories260K-f32', messages, max_tokens: 4, ...extra });
    assert.equal(r.status, 400, JSON.stringify(extra) + ' -> ' + r.text);
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.equal(r.json.error.param, param, r.text);
  }
  const ok = await postJson(url, { model: 'stories260K-f32', messages, max_tokens: 4 });
  assert.equal(ok.status, 200);
});

test('"auto" without --enable-auto-tool-choice is a 400 saying what to set', { timeout: 60000 }, async () => {
  const plain = await startServer([]);
  try {
    const r = await postJson(plain.url + '/v1/chat/completions', { model: 'stories260K-f32', messages, tools, max_tokens: 4 });
    assert.equal(r.status, 400);
    assert.match(r.json.error.message, /--enable-auto-tool-choice/);
    const none = await postJson(plain.url + '/v1/chat/completions', { model: 'stories260K-f32', messages, tools, tool_choice: 'none', max_tokens: 4 });
    assert.equal(none.status, 200, none.text);
  } finally {
    await plain.stop();
  }
});
