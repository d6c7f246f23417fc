#!/usr/bin/env node
// Runs one example by name: `pnpm --filter @crisp/examples example custom-router` (or
// `node examples/run.mjs custom-router`). Node 20 cannot run TypeScript, so the file is
// bundled first with esbuild, workspace packages taken from their sources (the
// "@crisp/source" condition: no build needed), then its `main()` is called.
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { build } from 'esbuild';

const src = fileURLToPath(new URL('./src/', import.meta.url));
const names = readdirSync(src).filter((f) => f.endsWith('.ts') && !f.endsWith('.test.ts')).map((f) => f.slice(0, -3));
const name = process.argv[2];
if (!names.includes(name)) {
  console.error(`usage: node run.mjs NAME; the examples are ${names.join(', ')} (the browser one: pnpm --filter @crisp/examples build)`);
  process.exit(2);
}
const dir = mkdtempSync(join(tmpdir(), 'crisp-example-'));
try {
  const outfile = join(dir, `${name}.mjs`);
  await build({
    entryPoints: [join(src, `${name}.ts`)],
    outfile,
    bundle: true,
    platform: 'node',
    format: 'esm',
    target: 'node20',
    conditions: ['@crisp/source'],
    logLevel: 'warning',
  });
  const { main } = await import(pathToFileURL(outfile).href);
  await main();
} finally {
  rmSync(dir, { recursive: true, force: true });
}
