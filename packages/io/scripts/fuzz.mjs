// Bundles scripts/fuzz.ts from the workspace sources (the '@crisp/source' condition) with
// esbuild and runs it in plain Node; arguments pass through (--seconds, --seed, --out).
import { build } from 'esbuild';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const dir = await mkdtemp(join(tmpdir(), 'crisp-io-fuzz-build-'));
const outfile = join(dir, 'fuzz.mjs');
try {
  await build({
    entryPoints: [join(here, 'fuzz.ts')],
    outfile,
    bundle: true,
    platform: 'node',
    format: 'esm',
    target: 'node20',
    conditions: ['@crisp/source'],
    logLevel: 'warning',
  });
  await import(pathToFileURL(outfile).href);
} finally {
  await rm(dir, { recursive: true, force: true });
}
