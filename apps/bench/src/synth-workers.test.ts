import { createReferenceBackend } from '@crisp/reference';
import { setSynthWorkerEntry } from '@crisp/synth/node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bundleSynthWorkerEntry, type WorkerEntry } from '../../../tooling/synth-worker-entry.js';
import { latencyInputs } from './inputs.js';

let entry: WorkerEntry;
let workerUrl: URL;
beforeAll(async () => {
  entry = await bundleSynthWorkerEntry();
  workerUrl = entry.url;
}, 60_000);
afterAll(() => entry.remove());

describe('latencyInputs on worker threads', () => {
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
