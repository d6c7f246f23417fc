import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { createReferenceBackend } from '@crisp/reference';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bundleSynthWorkerEntry, type WorkerEntry } from '../../../tooling/synth-worker-entry.js';
import { scenario } from './scenario.js';
import { uploadScenario } from './upload.js';
import { uploadScenarioParallel } from './workers.js';

// The workers need a JavaScript entry that calls serveSynthChunks first (in the bench and the
// crisp command, their own entry); here one is bundled from the sources.
let entry: WorkerEntry;
let workerUrl: URL;
let dir: string;
beforeAll(async () => {
  entry = await bundleSynthWorkerEntry();
  workerUrl = entry.url;
  dir = entry.dir;
}, 60_000);
afterAll(() => entry.remove());

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
        // the wall time splits into waiting for the workers and writing on this thread
        expect(par.timing!.writeMs).toBeGreaterThan(0);
        expect(par.timing!.generateMs).toBeGreaterThan(0);
        expect(seq.timing!.generateMs).toBeGreaterThan(seq.timing!.writeMs);
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

});
