// run.mjs - runs console.test.mjs with node's test runner; exits 77 (skip)
// when chromium or the npm packages it needs are missing.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..', '..');
for (const pkg of ['playwright-core', 'ajv', 'ajv-formats']) {
  if (!fs.existsSync(path.join(root, 'node_modules', pkg, 'package.json'))) {
    console.log(`node_modules/${pkg} missing: run npm ci at the repo root`);
    process.exit(77);
  }
}
// playwright-core needs node >= 20 (its package.json); Debian 12's own
// nodejs is 18, so say so and skip rather than fail there.
const nodeMajor = Number(process.versions.node.split('.')[0]);
if (nodeMajor < 20) {
  console.log(`node ${process.versions.node}: playwright-core needs node >= 20, skipping`);
  process.exit(77);
}
const chromium = process.env.KVSERVE_CHROMIUM || '/usr/bin/chromium';
if (!fs.existsSync(chromium)) {
  console.log(`${chromium} missing: apt-get install chromium (tools/install-deps --test)`);
  process.exit(77);
}
const r = spawnSync(process.execPath, ['--test', '--test-reporter=spec', process.argv[2]],
  { stdio: 'inherit' });
process.exit(r.status ?? 1);
