// test_schema_ajv.mjs: random sentences of the grammars that serve/schema.c makes (sampled by
// `test_schema --sample`) validated by ajv, the JSON Schema validator, as an oracle: every sentence
// must parse as JSON and validate. Run by test_serve_structured.sh, which installs ajv and ajv-formats (found
// through NODE_PATH or AJV_DIR); skips when they are missing.
// Usage: node tests/test_schema_ajv.mjs BUILD_DIR
import { execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import path from 'node:path';

const build = process.argv[2] || 'build';
const require = createRequire(path.join(process.env.AJV_DIR || process.cwd(), 'noop.js'));
let Ajv2020, addFormats;
try {
  Ajv2020 = require('ajv/dist/2020').default;
  addFormats = require('ajv-formats').default;
} catch (e) {
  console.log('SKIP: ajv / ajv-formats not installed (set AJV_DIR to a folder with node_modules)');
  process.exit(0);
}
const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);

const schemas = [
  { type: 'object', properties: { name: { type: 'string', maxLength: 10 }, n: { type: 'integer', minimum: -5, maximum: 300 },
    x: { type: 'number', minimum: 0, maximum: 1 }, d: { type: 'string', format: 'date-time' },
    t: { type: 'array', items: { enum: ['a', 1, null] }, maxItems: 3 } }, required: ['name'], additionalProperties: false },
  { type: 'object', properties: { a: { type: 'integer' }, ab: { type: 'integer' } } },
  { type: 'object', additionalProperties: { type: 'number', exclusiveMaximum: 3 } },
  { type: 'array', prefixItems: [{ type: 'integer', minimum: 10, maximum: 10050 }, { type: 'string', format: 'date' }],
    items: { type: ['boolean', 'null'] }, minItems: 1, maxItems: 4 },
  { $ref: '#/$defs/node', $defs: { node: { type: 'object', properties: { v: { type: 'integer', exclusiveMinimum: -3 },
    kids: { type: 'array', items: { $ref: '#/$defs/node' }, maxItems: 2 } }, required: ['v'], additionalProperties: false } } },
  { anyOf: [{ type: 'number', minimum: -2.5, maximum: 7.25 }, { type: 'string', format: 'uuid' }, { const: { k: [1, 'x'] } }] },
  { allOf: [{ type: 'object', properties: { a: { type: 'string', minLength: 2, maxLength: 4 } }, required: ['a'] },
    { properties: { b: { type: 'boolean' } }, required: ['b'] }] },
  { type: 'string', format: 'time' },
  { type: 'number' },
  { type: 'object' },
  // pattern (serve/regex.c), checked by ajv's own regex (the "u" flag). The sampler's random walk cannot
  // finish a pattern open at its start (it would have to hit the match by chance): those are in test_schema.c.
  { type: 'string', pattern: '^[A-Z]{2}-\\d{3,4}$' },
  { type: 'string', pattern: '^(cat|dog)s?' },
  { type: 'object', properties: {
    phone: { type: 'string', pattern: '^\\+?1?[-. ]?\\(?\\d{3}\\)?[-. ]?\\d{3}[-. ]?\\d{4}$' },
    date: { type: 'string', pattern: '^\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])$' },
    mail: { type: 'string', pattern: '^[\\w.+-]+@[\\w-]+\\.[a-z]{2,}$' } },
    required: ['phone', 'date', 'mail'], additionalProperties: false },
  { type: 'string', pattern: '^say "[^a-z]{1,4}"\\\\.{2,5}\\n?(?:x|\\/|\\t)*?$' },
  { type: 'array', items: { type: 'string', pattern: '^caf(\u00e9|e)\\s\\S+\\D\\W$|^[^\\s]$' }, maxItems: 3 },
];

let bad = 0, total = 0;
for (const s of schemas) {
  const validate = ajv.compile(s);
  const out = execFileSync(path.join(build, 'test_schema'), ['--sample', '300', JSON.stringify(s)], { encoding: 'utf8' });
  for (const line of out.split('\n').filter((l) => l.length)) {
    total++;
    let v;
    try { v = JSON.parse(line); } catch (e) { bad++; console.log(`not JSON: ${line}\n  schema ${JSON.stringify(s)}`); continue; }
    if (!validate(v)) {
      bad++;
      console.log(`invalid: ${line}\n  schema ${JSON.stringify(s)}\n  ${ajv.errorsText(validate.errors)}`);
    }
  }
}
console.log(`${total - bad} of ${total} sampled sentences valid`);
process.exit(bad ? 1 : 0);
