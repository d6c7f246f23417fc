import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { createReferenceBackend } from '@crisp/reference';
import { scenario, uploadScenario } from '@crisp/synth';
import { build } from 'esbuild';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { latencyInputs } from './inputs.js';
import { setSynthWorkerEntry, uploadScenarioParallel } from './synth-workers.js';

// The workers need a JavaScript entry that calls serveSynthChunks first (in the bench, its own
// bundle or build); here one is bundled from this folder's source.
let dir: string;
let workerUrl: URL;
beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'crisp-synth-workers-'));
  const src = join(dir, 'entry.ts');
  writeFileSync(src, `import { serveSynthChunks } from ${JSON.stringify(resolve(__dirname, 'synth-workers.ts'))};\nserveSynthChunks();\n`);
  const out = join(dir, 'entry.mjs');
  await build({ entryPoints: [src], outfile: out, bundle: true, platform: 'node', format: 'esm', conditions: ['@crisp/source'], logLevel: 'warning' });
  workerUrl = pathToFileURL(out);
}, 60_000);
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('uploadScenarioParallel', () => {
  for (const dtype of ['f32', 'bf16'] as const) {
    it(`writes the same tensors as uploadScenario, chunks from three workers (${dtype})`, async () => {
      const b = createReferenceBackend();
      const spec = { profile: 'llama-like' as const, n: 3000, heads: 4, kvHeads: 2, headDim: 64, seed: 23, dtype };
      const progress: number[] = [];
      const par = await uploadScenarioParallel(b, spec, { threads: 3, workerUrl, chunkRows: 256, onProgress: (r) => progress.push(r) });
      const seq = await uploadScenario(b, scenario(spec.profile, spec));
      try {
        for (const name of ['q', 'k', 'v'] as const) {
          const [x, y] = await Promise.all([b.download(par[name]), b.download(seq[name])]);
          expect(x.shape).toEqual(y.shape);
          expect(Array.from(x.data)).toEqual(Array.from(y.data));
          expect(x.data.some((e) => e !== 0)).toBe(true);
        }
        // 12 chunks, each reported once, the last at n
        expect(progress).toHaveLength(Math.ceil(3000 / 256));
        expect(progress.at(-1)).toBe(3000);
      } finally {
        for (const t of [par.q, par.k, par.v, seq.q, seq.k, seq.v]) t.dispose();
      }
    }, 60_000);
  }

  it('rejects with the reason when a worker fails, and frees what it allocated', async () => {
    const bad = join(dir, 'bad.mjs');
    writeFileSync(bad, "throw new Error('no scenario here');\n");
    const b = createReferenceBackend();
    const made: { dispose(): void; disposed?: boolean }[] = [];
    const allocate = b.allocate.bind(b);
    b.allocate = (dtype, shape) => {
      const t = allocate(dtype, shape);
      made.push(t);
      return t;
    };
    const spec = { profile: 'llama-like' as const, n: 1024, heads: 4, kvHeads: 2, headDim: 64, seed: 1, dtype: 'f32' as const };
    await expect(uploadScenarioParallel(b, spec, { threads: 2, workerUrl: pathToFileURL(bad), chunkRows: 256 })).rejects.toThrow(/no scenario here/);
    expect(made).toHaveLength(3);
    for (const t of made) expect((t as { disposed: boolean }).disposed).toBe(true);
  }, 60_000);

  it('latencyInputs generates synth inputs of 32k tokens on worker threads when the entry allows, the same values as one thread', async () => {
    const b = createReferenceBackend();
    const shape = { heads: 2, kvHeads: 1, headDim: 32 };
    setSynthWorkerEntry(workerUrl);
    try {
      const par = await latencyInputs(b, 'llama-like', 32768, shape, 'f32', 5, 1e12, 'synth', undefined, 2);
      const seq = await latencyInputs(b, 'llama-like', 32768, shape, 'f32', 5, 1e12, 'synth', undefined, 1);
      try {
        expect(par.source).toMatch(/generated on 2 host threads/);
        expect(seq.source).toMatch(/streamed from the host$/);
        for (const name of ['q', 'k', 'v'] as const) {
          const [x, y] = await Promise.all([b.download(par[name]), b.download(seq[name])]);
          expect(Array.from(x.data)).toEqual(Array.from(y.data));
        }
      } finally {
        par.dispose();
        seq.dispose();
      }
    } finally {
      setSynthWorkerEntry(undefined);
    }
  }, 120_000);
});
