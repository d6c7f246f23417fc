// Test helper: JavaScript entries for worker threads (@crisp/synth's, @crisp/parallel's ranks), bundled from the sources
// with esbuild (Node 20 cannot start a worker on a .ts file). The product's entries (the
// bench's bundle, the crisp command's bin) call serveSynthChunks first themselves.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { build } from 'esbuild';

export interface WorkerEntry {
  readonly url: URL;
  /** the folder the entry lies in (tests may put other entries there) */
  readonly dir: string;
  remove(): void;
}

export async function bundleSynthWorkerEntry(): Promise<WorkerEntry> {
  const dir = mkdtempSync(join(tmpdir(), 'crisp-synth-workers-'));
  const src = join(dir, 'entry.ts');
  const node = fileURLToPath(new URL('../packages/synth/src/node.ts', import.meta.url));
  writeFileSync(src, `import { serveSynthChunks } from ${JSON.stringify(node)};\nserveSynthChunks();\n`);
  return bundleInto(dir, src);
}

/** Any TypeScript entry file bundled the same way, into a fresh temporary folder. */
export async function bundleWorkerEntry(entryFile: string): Promise<WorkerEntry> {
  return bundleInto(mkdtempSync(join(tmpdir(), 'crisp-workers-')), entryFile);
}

async function bundleInto(dir: string, src: string): Promise<WorkerEntry> {
  const out = join(dir, 'entry.mjs');
  await build({
    entryPoints: [src],
    outfile: out,
    bundle: true,
    platform: 'node',
    format: 'esm',
    conditions: ['@crisp/source'],
    logLevel: 'warning',
  });
  return { url: pathToFileURL(out), dir, remove: () => rmSync(dir, { recursive: true, force: true }) };
}
