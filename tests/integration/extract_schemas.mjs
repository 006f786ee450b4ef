// extract_schemas.mjs - extracts the response schemas kvserve serves from the
// OpenAI OpenAPI document into schemas/openai.json (committed), so the
// integration tests validate against the official shapes without needing
// the 3 MB source at test time.
//
// usage: node tests/integration/extract_schemas.mjs [path/to/openapi.yaml]
//        (default: ../shared/openai/openapi.yaml relative to the repo root)
//
// Each schema named in ROOTS is copied with every schema it references,
// transitively. OpenAPI 3.0 `nullable: true` becomes a JSON Schema type union
// (or an anyOf with {type: "null"} around a $ref); vendor keys (x-*),
// examples and the OpenAPI-only `format: unixtime` are dropped; refs point
// into the bundle's `definitions`.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import * as yaml from 'js-yaml';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..', '..');
const src = process.argv[2] || path.resolve(root, '..', 'shared', 'openai', 'openapi.yaml');

const ROOTS = [
  'CreateCompletionResponse',
  'CreateChatCompletionResponse',
  'CreateChatCompletionStreamResponse',
  'ListModelsResponse',
  'Model',
  'CreateEmbeddingResponse',
  'ErrorResponse',
];

const doc = yaml.load(fs.readFileSync(src, 'utf8'));
const all = doc.components.schemas;
const REF = '#/components/schemas/';

function convert(node, refs) {
  if (Array.isArray(node)) {
    return node.map((n) => convert(n, refs));
  }
  if (node === null || typeof node !== 'object') {
    return node;
  }
  const out = {};
  for (const [k, v] of Object.entries(node)) {
    if (k.startsWith('x-') || k === 'example' || k === 'examples' || k === 'nullable') {
      continue;
    }
    if (k === 'format' && v === 'unixtime') {
      continue;
    }
    if (k === '$ref') {
      const name = v.slice(REF.length);
      refs.add(name);
      out.$ref = `#/definitions/${name}`;
      continue;
    }
    // Property names are data, not keywords: copy the map, convert values.
    if (k === 'properties' && v && typeof v === 'object') {
      out.properties = {};
      for (const [pn, pv] of Object.entries(v)) {
        out.properties[pn] = convert(pv, refs);
      }
      continue;
    }
    out[k] = convert(v, refs);
  }
  if (node.nullable === true) {
    if (out.$ref) {
      const { $ref, ...rest } = out;
      return { ...rest, anyOf: [{ $ref }, { type: 'null' }] };
    }
    if (typeof out.type === 'string') {
      out.type = [out.type, 'null'];
      if (Array.isArray(out.enum) && !out.enum.includes(null)) {
        out.enum = [...out.enum, null];
      }
    } else if (out.type === undefined) {
      return { anyOf: [out, { type: 'null' }] };
    }
  }
  return out;
}

// The Responses API's schemas go to their own bundle (openai-responses.json):
// the Response object and every stream event.
const RESPONSES_ROOTS = ['Response', 'ResponseStreamEvent'];

// Copies roots and every schema they reference, transitively.
function collect(roots) {
  const defs = {};
  const todo = [...roots];
  while (todo.length > 0) {
    const name = todo.pop();
    if (defs[name] !== undefined) {
      continue;
    }
    if (all[name] === undefined) {
      throw new Error(`schema ${name} is not in ${src}`);
    }
    const refs = new Set();
    defs[name] = convert(all[name], refs);
    for (const r of refs) {
      todo.push(r);
    }
  }
  return defs;
}

// Writes defs as the bundle schemas/<id>, sorted by name.
function write(id, defs) {
  const sorted = {};
  for (const k of Object.keys(defs).sort()) {
    sorted[k] = defs[k];
  }
  const bundle = {
    $id: id,
    $comment: `Extracted from the OpenAI OpenAPI document (openapi ${doc.openapi}, ` +
      `version ${doc.info.version}) by tests/integration/extract_schemas.mjs; see LICENSE.`,
    definitions: sorted,
  };
  fs.mkdirSync(path.join(here, 'schemas'), { recursive: true });
  fs.writeFileSync(path.join(here, 'schemas', id), JSON.stringify(bundle, null, 1) + '\n');
  console.log(`${id}: ${Object.keys(sorted).length} schemas: ${Object.keys(sorted).join(', ')}`);
}

const definitions = collect(ROOTS);

// Streamed completions: the document says streamed and non-streamed objects
// share one shape, but the API sends finish_reason null until a choice ends.
// Derive that schema. usage stays as the document has it (absent, or a
// CompletionUsage): unlike CreateChatCompletionStreamResponse, nothing
// allows it to be null.
const stream = JSON.parse(JSON.stringify(definitions.CreateCompletionResponse));
const fr = stream.properties.choices.items.properties.finish_reason;
fr.type = [fr.type, 'null'];
fr.enum = [...fr.enum, null];
stream.description = 'Derived from CreateCompletionResponse for streamed chunks ' +
  '(finish_reason may be null).';
definitions.CreateCompletionStreamResponse = stream;

write('openai.json', definitions);
write('openai-responses.json', collect(RESPONSES_ROOTS));
