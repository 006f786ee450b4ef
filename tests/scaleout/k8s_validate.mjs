// k8s_validate.mjs - validates every manifest of deploy/kubernetes/ offline
// against the Kubernetes and CRD schemas (issue 17): core and apps objects
// with the `kubernetes-models` npm package (its validate() runs the
// OpenAPI schemas of the Kubernetes API), PodMonitor with
// `@kubernetes-models/prometheus-operator`, KEDA's ScaledObject with
// `@kubernetes-models/keda`, and InferencePool against the Gateway API
// Inference Extension's CRD (its openAPIV3Schema, with ajv): the copy in
// tests/fixtures/k8s/ (Apache-2.0, from kubernetes-sigs/gateway-api-inference-
// extension, see the README there), or the file KVS_INFERENCEPOOL_CRD names.
// The CRD's CEL rules (x-kubernetes-validations) need an API server and are
// not checked. A broken copy of each object
// must fail, so the validators are known to bite. Exits 77 (skip) when the
// npm packages are not installed.
//
// Environment: KVS_K8S_NODE_MODULES  where the packages are [<root>/node_modules]
//              KVS_INFERENCEPOOL_CRD another copy of
//                                    inference.networking.k8s.io_inferencepools.yaml
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..', '..');
const nm = process.env.KVS_K8S_NODE_MODULES || path.join(root, 'node_modules');
const packages = ['kubernetes-models', '@kubernetes-models/prometheus-operator',
  '@kubernetes-models/keda', 'js-yaml', 'ajv'];
for (const p of packages) {
  if (!fs.existsSync(path.join(nm, p, 'package.json'))) {
    console.log(`SKIP: npm package ${p} is not installed in ${nm}`);
    process.exit(77);
  }
}
const load = (p) => import(pathToFileURL(path.join(nm, p)).href);
const require = createRequire(path.join(nm, 'k8s_validate.cjs'));
const yaml = require('js-yaml');
const Ajv = require('ajv').default;

// apiVersion -> the package that has its models.
function modelFile(apiVersion, kind) {
  const g = apiVersion.includes('/') ? apiVersion : `v1`;
  if (apiVersion.startsWith('monitoring.coreos.com/')) {
    return `@kubernetes-models/prometheus-operator/${g}/${kind}.js`;
  }
  if (apiVersion.startsWith('keda.sh/')) {
    return `@kubernetes-models/keda/${g}/${kind}.js`;
  }
  return `kubernetes-models/${g}/${kind}.js`;
}

// The API server drops fields a structural schema does not know, and
// kubectl's strict field validation rejects them: fields unknown to the CRD
// fail here too.
function strict(schema) {
  if (schema && typeof schema === 'object') {
    if (schema.type === 'object' && schema.properties &&
        schema.additionalProperties === undefined &&
        !schema['x-kubernetes-preserve-unknown-fields']) {
      schema.additionalProperties = false;
    }
    for (const v of Object.values(schema)) {
      strict(v);
    }
  }
  return schema;
}

let crdValidate;
const crdFile = process.env.KVS_INFERENCEPOOL_CRD ||
  path.join(root, 'tests', 'fixtures', 'k8s', 'inference.networking.k8s.io_inferencepools.yaml');
{
  const crd = yaml.load(fs.readFileSync(crdFile, 'utf8'));
  const v1 = crd.spec.versions.find((v) => v.name === 'v1');
  const ajv = new Ajv({ strict: false, allErrors: true, validateFormats: false, logger: false });
  const schema = strict(v1.schema.openAPIV3Schema);
  schema.properties.metadata = { type: 'object' };
  crdValidate = ajv.compile(schema);
}

async function validate(doc) {
  if (doc.apiVersion === 'inference.networking.k8s.io/v1' && doc.kind === 'InferencePool') {
    if (!crdValidate(doc)) {
      throw new Error(JSON.stringify(crdValidate.errors));
    }
    return 'ok (CRD schema)';
  }
  const file = modelFile(doc.apiVersion, doc.kind);
  if (!fs.existsSync(path.join(nm, file))) {
    throw new Error(`no schema for ${doc.apiVersion} ${doc.kind}`);
  }
  const mod = await load(file);
  const Model = mod[doc.kind];
  new Model(doc).validate();
  return 'ok';
}

// A copy with a wrong type deep inside, which every schema must reject.
function broken(doc) {
  const d = structuredClone(doc);
  if (d.spec) {
    d.spec = 'not an object';
  } else {
    d.data = 42;
  }
  return d;
}

const dir = path.join(root, 'deploy', 'kubernetes');
let n = 0;
let failures = 0;
for (const f of fs.readdirSync(dir).filter((x) => x.endsWith('.yaml')).sort()) {
  const docs = yaml.loadAll(fs.readFileSync(path.join(dir, f), 'utf8')).filter(Boolean);
  for (const doc of docs) {
    const what = `${f}: ${doc.kind}/${doc.metadata?.name}`;
    try {
      const how = await validate(doc);
      console.log(`${what}: ${how}`);
      if (!how.startsWith('skipped')) {
        let rejected = false;
        try {
          await validate(broken(doc));
        } catch {
          rejected = true;
        }
        if (!rejected) {
          console.log(`${what}: a broken copy was NOT rejected`);
          failures++;
        }
        if (doc.kind === 'InferencePool') {
          // The CRD's own constraints: a required field gone, a misspelt one.
          for (const [why, edit] of [['no selector', (d) => delete d.spec.selector],
            ['unknown field', (d) => { d.spec.targetPort = d.spec.targetPorts; }]]) {
            const d = structuredClone(doc);
            edit(d);
            if (crdValidate(d)) {
              console.log(`${what}: a copy with ${why} was NOT rejected`);
              failures++;
            }
          }
        }
      }
      n++;
    } catch (e) {
      console.log(`${what}: INVALID: ${e.message}`);
      failures++;
    }
  }
}
console.log(`${n} objects, ${failures} failures`);
process.exit(failures === 0 && n > 0 ? 0 : 1);
