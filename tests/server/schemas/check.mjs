// Offline check of the structured-output schemas (no server): every schema compiles in ajv
// (draft 2020-12, ajv-formats), uses only the keywords the server supports, bounds its free text
// and arrays, and has a hand-made valid instance in examples.json. Prints each schema's bounds on
// the size of its JSON (compact, in characters; a token of stories260K is at least one character).
// Run: node tests/server/schemas/check.mjs
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';

const dir = path.dirname(fileURLToPath(import.meta.url));
export const schemaNames = fs.readdirSync(dir).filter((f) => /^\d\d-.*\.json$/.test(f)).sort()
  .map((f) => f.replace(/\.json$/, ''));

const SUPPORTED = new Set(['type', 'properties', 'required', 'additionalProperties', 'items', 'prefixItems',
  'minItems', 'maxItems', 'enum', 'const', 'pattern', 'format', 'minLength', 'maxLength', 'minimum', 'maximum',
  'exclusiveMinimum', 'exclusiveMaximum', 'anyOf', 'oneOf', '$ref', '$defs', 'definitions', 'nullable']);
const ANNOTATIONS = new Set(['title', 'description', '$comment', '$schema', 'examples', 'default']);
const FORMATS = new Set(['date', 'date-time', 'time', 'email', 'uuid']);
// The prompt plus at most 400 generated tokens must fit the 512-token context; a token is at
// least one character, so a schema whose largest compact instance (unbounded parts counted at
// UNBOUNDED_GUESS characters) is under MAX_CHARS cannot run out unless the model pads whitespace
// or writes very long numbers.
const MAX_CHARS = 400;
const MIN_CHARS = 80;  // the smallest valid instance: about 70 tokens at most (0.87 tokens a character)
const UNBOUNDED_GUESS = 12;

const problems = [];
const problem = (name, msg) => problems.push(`${name}: ${msg}`);

function resolve(root, ref) {
  if (ref === '#') return root;
  const m = ref.match(/^#\/(\$defs|definitions)\/([^/]+)$/);
  if (!m || !root[m[1]] || !root[m[1]][m[2]]) throw new Error(`unresolvable $ref ${ref}`);
  return root[m[1]][m[2]];
}

// Every keyword supported, every free-text string with maxLength, every array with maxItems,
// exclusive bounds on numbers integral.
function lint(name, s, where) {
  if (typeof s !== 'object' || s === null || Array.isArray(s)) return problem(name, `${where}: not a schema object`);
  for (const k of Object.keys(s)) {
    if (!SUPPORTED.has(k) && !ANNOTATIONS.has(k)) problem(name, `${where}: unsupported keyword ${k}`);
  }
  const types = [].concat(s.type ?? []);
  if (types.includes('string') && s.maxLength === undefined && s.enum === undefined && s.const === undefined &&
      s.pattern === undefined && s.format === undefined) problem(name, `${where}: free-text string without maxLength`);
  if (s.format !== undefined && !FORMATS.has(s.format)) problem(name, `${where}: format ${s.format}`);
  if (s.format !== undefined && (s.maxLength !== undefined || s.pattern !== undefined)) {
    problem(name, `${where}: format combined with maxLength/pattern`);
  }
  if (s.pattern !== undefined && !(s.pattern.startsWith('^') && s.pattern.endsWith('$'))) {
    problem(name, `${where}: pattern not anchored (unanchored patterns are searches in JSON Schema)`);
  }
  if (types.includes('array') && s.maxItems === undefined) problem(name, `${where}: array without maxItems`);
  if (types.includes('number') || types.includes('integer')) {
    for (const k of ['minimum', 'maximum', 'exclusiveMinimum', 'exclusiveMaximum']) {
      if (s[k] !== undefined && !Number.isInteger(s[k])) problem(name, `${where}: ${k} ${s[k]} is not integral`);
    }
  }
  if (s.nullable !== undefined && s.type === undefined) problem(name, `${where}: nullable without type`);
  for (const [k, v] of Object.entries(s.properties ?? {})) lint(name, v, `${where}.properties.${k}`);
  for (const k of ['$defs', 'definitions']) for (const [d, v] of Object.entries(s[k] ?? {})) lint(name, v, `${where}.${k}.${d}`);
  if (s.items !== undefined) lint(name, s.items, `${where}.items`);
  (s.prefixItems ?? []).forEach((v, i) => lint(name, v, `${where}.prefixItems[${i}]`));
  for (const k of ['anyOf', 'oneOf']) (s[k] ?? []).forEach((v, i) => lint(name, v, `${where}.${k}[${i}]`));
  if (typeof s.additionalProperties === 'object') lint(name, s.additionalProperties, `${where}.additionalProperties`);
}

// Longest and shortest match of a simple regex (literals, escapes, classes, groups,
// alternation, ? * + {m} {m,} {m,n}); max is Infinity where it is unbounded.
function patternLengths(re) {
  let i = 0;
  const body = re.replace(/^\^/, '').replace(/\$$/, '');
  function alternation() {
    let best = seq();
    while (body[i] === '|') {
      ++i;
      const s = seq();
      best = { min: Math.min(best.min, s.min), max: Math.max(best.max, s.max) };
    }
    return best;
  }
  function seq() {
    const total = { min: 0, max: 0 };
    while (i < body.length && body[i] !== '|' && body[i] !== ')') {
      let atom;
      if (body[i] === '(') {
        ++i;
        if (body.startsWith('?:', i)) i += 2;
        atom = alternation();
        ++i;  // ')'
      } else if (body[i] === '[') {
        while (body[i] !== ']') i += body[i] === '\\' ? 2 : 1;
        ++i;
        atom = { min: 1, max: 1 };
      } else {
        i += body[i] === '\\' ? 2 : 1;
        atom = { min: 1, max: 1 };
      }
      let lo = 1;
      let hi = 1;
      if (body[i] === '?') { lo = 0; ++i; } else if (body[i] === '*') { lo = 0; hi = Infinity; ++i; } else if (body[i] === '+') {
        hi = Infinity; ++i;
      } else if (body[i] === '{') {
        const m = body.slice(i).match(/^\{(\d+)(,(\d*))?\}/);
        lo = Number(m[1]);
        hi = m[2] === undefined ? lo : m[3] === '' ? Infinity : Number(m[3]);
        i += m[0].length;
      }
      total.min += atom.min * lo;
      total.max += hi === 0 ? 0 : atom.max * hi;
    }
    return total;
  }
  return alternation();
}

const FORMAT_MAX = { date: 10, time: 21, 'date-time': 32, uuid: 36, email: Infinity };  // time: 12:00:00.123+01:00
const FORMAT_MIN = { date: 10, time: 9, 'date-time': 20, uuid: 36, email: 5 };
const intLen = (v) => String(v).length;

// {max, min, flags}: the longest and shortest compact JSON of an instance (max Infinity where
// unbounded; recursion is cut and flagged).
function sizes(root, s, stack = []) {
  const flags = new Set();
  const go = (schema, st) => {
    if (schema.$ref !== undefined) {
      if (st.includes(schema.$ref)) { flags.add('recursive'); return { max: 0, min: Infinity }; }
      return go(resolve(root, schema.$ref), [...st, schema.$ref]);
    }
    if (schema.const !== undefined) { const n = JSON.stringify(schema.const).length; return { max: n, min: n }; }
    if (schema.enum !== undefined) {
      const ns = schema.enum.map((v) => JSON.stringify(v).length);
      return { max: Math.max(...ns), min: Math.min(...ns) };
    }
    const branches = schema.anyOf ?? schema.oneOf;
    if (branches) {
      const r = branches.map((b) => go(b, st));
      return { max: Math.max(...r.map((x) => x.max)), min: Math.min(...r.map((x) => x.min)) };
    }
    const types = [].concat(schema.type ?? []);
    if (schema.nullable) types.push('null');
    if (types.length === 0) { flags.add('any value'); return { max: Infinity, min: 1 }; }
    const r = types.map((t) => {
      switch (t) {
        case 'null': return { max: 4, min: 4 };
        case 'boolean': return { max: 5, min: 4 };
        case 'integer': case 'number': {
          const lo = schema.minimum ?? (schema.exclusiveMinimum !== undefined ? schema.exclusiveMinimum + (t === 'integer' ? 1 : 0) : undefined);
          const hi = schema.maximum ?? (schema.exclusiveMaximum !== undefined ? schema.exclusiveMaximum - (t === 'integer' ? 1 : 0) : undefined);
          const min = lo !== undefined && lo > 0 ? intLen(lo) : hi !== undefined && hi < 0 ? intLen(hi) : 1;
          if (t === 'integer' && lo !== undefined && hi !== undefined) return { max: Math.max(intLen(lo), intLen(hi)), min };
          flags.add(t === 'integer' ? 'unbounded integer' : 'number (digits unbounded)');
          return { max: Infinity, min };
        }
        case 'string': {
          if (schema.format) {
            if (FORMAT_MAX[schema.format] === Infinity || schema.format === 'time' || schema.format === 'date-time') {
              flags.add(`format ${schema.format} (unbounded)`);
            }
            return { max: FORMAT_MAX[schema.format] + 2, min: FORMAT_MIN[schema.format] + 2 };
          }
          if (schema.pattern) {
            const p = patternLengths(schema.pattern);
            if (p.max === Infinity) flags.add(`pattern ${schema.pattern} (unbounded)`);
            return { max: p.max + 2, min: p.min + 2 };
          }
          return { max: (schema.maxLength ?? Infinity) + 2, min: (schema.minLength ?? 0) + 2 };
        }
        case 'array': {
          const prefix = (schema.prefixItems ?? []).map((p) => go(p, st));
          const item = schema.items ? go(schema.items, st) : { max: Infinity, min: 1 };
          const maxN = schema.maxItems ?? Infinity;
          const minN = schema.minItems ?? 0;
          let max = 2;
          let min = 2;
          for (let k = 0; k < Math.min(maxN, 1000); ++k) max += (k ? 1 : 0) + (k < prefix.length ? prefix[k].max : item.max);
          for (let k = 0; k < minN; ++k) min += (k ? 1 : 0) + (k < prefix.length ? prefix[k].min : item.min);
          if (maxN === Infinity) { flags.add('array without maxItems'); max = Infinity; }
          return { max, min };
        }
        case 'object': {
          const props = Object.entries(schema.properties ?? {});
          const required = new Set(schema.required ?? []);
          let max = 2 + Math.max(0, props.length - 1);
          let min = 2;
          let nreq = 0;
          for (const [k, v] of props) {
            const sz = go(v, st);
            max += JSON.stringify(k).length + 1 + sz.max;
            if (required.has(k)) { min += JSON.stringify(k).length + 1 + sz.min; ++nreq; }
          }
          min += Math.max(0, nreq - 1);
          if (schema.additionalProperties !== false) { flags.add('open object'); max = Infinity; }
          return { max, min };
        }
        default: throw new Error(`type ${t}`);
      }
    });
    return { max: Math.max(...r.map((x) => x.max)), min: Math.min(...r.map((x) => x.min)) };
  };
  const r = go(s, stack);
  return { ...r, flags: [...flags] };
}

export function makeAjv() {
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  addFormats(ajv);
  return ajv;
}

function main() {
  const ajv = makeAjv();
  const examples = JSON.parse(fs.readFileSync(path.join(dir, 'examples.json'), 'utf8'));
  if (schemaNames.length !== 50) problem('*', `${schemaNames.length} schemas, expected 50`);
  for (const name of Object.keys(examples)) if (!schemaNames.includes(name)) problem(name, 'example without a schema');
  for (const name of schemaNames) {
    const schema = JSON.parse(fs.readFileSync(path.join(dir, name + '.json'), 'utf8'));
    lint(name, schema, '#');
    let validate;
    try {
      validate = ajv.compile(schema);
    } catch (e) {
      problem(name, `does not compile: ${e.message}`);
      continue;
    }
    if (!(name in examples)) problem(name, 'no example');
    else if (!validate(examples[name])) problem(name, `example invalid: ${ajv.errorsText(validate.errors)}`);
    const sz = sizes(schema, schema);
    const exampleLen = JSON.stringify(examples[name] ?? null).length;
    if (sz.min > MIN_CHARS) problem(name, `smallest instance is ${sz.min} characters (over ${MIN_CHARS})`);
    if (sz.min > exampleLen) problem(name, `size estimate wrong: min ${sz.min} > example ${exampleLen}`);
    const capped = cappedMax(schema);
    if (!sz.flags.includes('recursive') && capped > MAX_CHARS) {
      problem(name, `largest instance about ${capped} characters (over ${MAX_CHARS})`);
    }
    console.log(`${name.padEnd(22)} min ${String(sz.min).padStart(3)}  max ${sz.flags.includes('recursive') ? 'recursive' : String(capped).padStart(3)}` +
      `${sz.max === Infinity ? '+' : ' '} example ${String(exampleLen).padStart(3)}  ${sz.flags.join(', ')}`);
  }
  // The oracle itself: instances each keyword must refuse (so a keyword ajv silently ignored, such
  // as prefixItems under a draft-07 Ajv, would show here).
  const refuse = [
    ['01-user-profile', { ...examples['01-user-profile'], email: 'lily@localhost' }, 'email without a dot in the domain'],
    ['01-user-profile', { ...examples['01-user-profile'], extra: 1 }, 'additionalProperties false'],
    ['01-user-profile', { ...examples['01-user-profile'], age: 12 }, 'minimum'],
    ['02-product-listing', { ...examples['02-product-listing'], sku: 'toy-0042' }, 'pattern'],
    ['02-product-listing', { ...examples['02-product-listing'], price: -1 }, 'number minimum 0'],
    ['03-calendar-event', { ...examples['03-calendar-event'], date: '2023-02-29' }, 'date in a non-leap year'],
    ['03-calendar-event', { ...examples['03-calendar-event'], start_time: '12:30:00' }, 'time without an offset'],
    ['06-order', { ...examples['06-order'], id: '0b7e6a52-3f1c-4d2a-9c55-2f0c7d1e8a9' }, 'uuid'],
    ['07-tree-node', { name: 'r', children: [{ name: 'a' }, { name: 'b' }, { name: 'c' }] }, 'maxItems through $ref'],
    ['07-tree-node', { name: 'r', children: [{ name: 'a', children: [{ name: '' }] }] }, 'minLength two levels down'],
    ['09-nested-comments', { author: 'a', text: 'b', replies: [{ author: 'c', text: 'd' }] }, 'required through definitions'],
    ['15-shape', { shape: { kind: 'circle', radius: 0 }, color: 'red' }, 'exclusiveMinimum'],
    ['15-shape', { shape: { kind: 'circle', width: 1, height: 1 }, color: 'red' }, 'oneOf'],
    ['17-rgb-tuple', { name: 'x', rgb: [0, 0, 256] }, 'prefixItems'],
    ['17-rgb-tuple', { name: 'x', rgb: [0, 0, 0, 0] }, 'maxItems on a tuple'],
    ['20-log-entry', { ...examples['20-log-entry'], ts: '2024-01-02 03:04:05' }, 'date-time without an offset'],
    ['24-contact-card', { ...examples['24-contact-card'], email: 5 }, 'nullable keeps the type'],
    ['25-inventory-count', { ...examples['25-inventory-count'], on_hand: 1000 }, 'exclusiveMaximum'],
    ['34-mixed-enum', { ...examples['34-mixed-enum'], answer: 41 }, 'const'],
    ['34-mixed-enum', { ...examples['34-mixed-enum'], size: 'large' }, 'enum'],
    ['35-nullable-fields', { ...examples['35-nullable-fields'], lucky: 100 }, 'maximum on ["integer","null"]'],
    ['46-string-lengths', { ...examples['46-string-lengths'], code: 'ABC' }, 'minLength'],
    ['48-word-counts', [], 'minItems at the top level'],
  ];
  for (const [name, instance, what] of refuse) {
    if (ajv.getSchema(name) === undefined) ajv.addSchema(JSON.parse(fs.readFileSync(path.join(dir, name + '.json'), 'utf8')), name);
    if (ajv.getSchema(name)(instance)) problem(name, `accepts an instance violating ${what}: ${JSON.stringify(instance)}`);
  }
  if (problems.length) {
    console.error(`\n${problems.length} problem(s):\n` + problems.join('\n'));
    process.exit(1);
  }
  console.log(`\nall ${schemaNames.length} schemas compile, lint clean, and accept their examples`);
}

// The largest instance with unbounded parts (numbers, emails, open objects' extras, unbounded
// patterns) counted at UNBOUNDED_GUESS characters.
function cappedMax(schema) {
  const capped = structuredClone(schema);
  const cap = (s) => {
    if (typeof s !== 'object' || s === null) return;
    const types = [].concat(s.type ?? []);
    if ((types.includes('number') || types.includes('integer')) && (s.minimum === undefined || s.maximum === undefined ||
        types.includes('number'))) {
      s.maximum = Number('9'.repeat(UNBOUNDED_GUESS - 1));
      s.minimum = s.minimum ?? -1;
      s.type = types.map((t) => (t === 'number' ? 'integer' : t));
      if (s.type.length === 1) s.type = s.type[0];
      delete s.exclusiveMinimum;
      delete s.exclusiveMaximum;
    }
    if (s.format === 'email' || s.format === 'time' || s.format === 'date-time') {
      s.maxLength = s.format === 'email' ? UNBOUNDED_GUESS : FORMAT_MAX[s.format];
      delete s.format;
    }
    if (s.pattern && patternLengths(s.pattern).max === Infinity) { delete s.pattern; s.maxLength = UNBOUNDED_GUESS; }
    if (types.includes('object') && s.additionalProperties !== false) s.additionalProperties = false;
    for (const v of Object.values(s)) if (typeof v === 'object') cap(v);
  };
  cap(capped);
  return sizes(capped, capped).max;
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) main();
