import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { type HostTensor, type Policy, sparsePrefill } from '@crisp/core';
import { crispGuardedSmall, crispSmall, flexPrefillSmall } from '@crisp/conformance';
import { createReferenceBackend } from '@crisp/reference';
import { scenario } from '@crisp/synth';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bundleWorkerEntry, type WorkerEntry } from '../../../tooling/synth-worker-entry.js';
import type { RankJob } from './__fixtures__/rank-entry.js';
import { unshardTensor, zigzagLayout } from './layout.js';
import { runRanks } from './node.js';
import type { ParallelTraffic } from './prefill.js';

// Node 20 cannot start a worker on a .ts file: the rank entry is bundled from the sources.
let bundled: WorkerEntry;
let dir: string;
let entry: URL;
beforeAll(async () => {
  bundled = await bundleWorkerEntry(fileURLToPath(new URL('./__fixtures__/rank-entry.ts', import.meta.url)));
  dir = bundled.dir;
  entry = bundled.url;
}, 60_000);
afterAll(() => bundled.remove());

interface RankResult {
  output: HostTensor;
  routes: string[];
  traffic: ParallelTraffic;
  commTraffic: { bytesSent: number; bytesReceived: number };
}

const byName: Record<string, Policy> = { [crispSmall.name]: crispSmall, [crispGuardedSmall.name]: crispGuardedSmall, [flexPrefillSmall.name]: flexPrefillSmall };

describe('parallelPrefill with ranks on worker threads', () => {
  const jobs: (RankJob & { P: number })[] = [
    { P: 2, profile: 'llama-like', n: 1111, seed: 21, dtype: 'f32', policy: crispSmall.name },
    { P: 3, profile: 'mixed-threshold', n: 1400, seed: 22, dtype: 'bf16', policy: crispGuardedSmall.name },
    { P: 4, profile: 'vs-trap', n: 1729, seed: 23, dtype: 'bf16', policy: flexPrefillSmall.name },
  ];
  for (const job of jobs) {
    it(`P=${job.P}, n=${job.n} (${job.profile}, ${job.dtype}, ${job.policy}): the single-rank output, bit for bit`, async () => {
      const results = (await runRanks({ size: job.P, entry, data: job })) as RankResult[];
      const layout = zigzagLayout(job.n, job.P, 64);
      const output = unshardTensor(layout, results.map((r) => r.output));
      const whole = scenario(job.profile, { n: job.n, heads: 4, kvHeads: 2, headDim: 32, seed: job.seed, dtype: job.dtype }).rows(0, job.n);
      const be = createReferenceBackend();
      const res = await sparsePrefill(be, { q: be.upload(whole.q), k: be.upload(whole.k), v: be.upload(whole.v) }, byName[job.policy], { minSparseLength: 0 });
      const want = await be.download(res.output);
      expect(Array.from(output.data)).toEqual(Array.from(want.data));
      for (const r of results) expect(r.routes).toEqual(res.plan.routing!.routes);
      // the threads' own byte counts: what ranks sent is what ranks received
      const sent = results.reduce((t, r) => t + r.commTraffic.bytesSent, 0);
      expect(results.reduce((t, r) => t + r.commTraffic.bytesReceived, 0)).toBe(sent);
      expect(results.reduce((t, r) => t + r.traffic.kvBytesReceived, 0)).toBeLessThan(results[0].traffic.denseRingBytes);
    }, 120_000);
  }

  it('a rank whose keys hold NaN makes runRanks reject with NON_FINITE, and no rank is left waiting', async () => {
    const job: RankJob = { profile: 'llama-like', n: 1111, seed: 21, dtype: 'f32', policy: crispSmall.name, poisonRank: 1 };
    await expect(runRanks({ size: 3, entry, data: job })).rejects.toMatchObject({ code: 'NON_FINITE' });
  }, 120_000);

  it('a rank whose fn returns nothing has reported: runRanks resolves with undefined for it', async () => {
    const quiet = await bundleWorkerEntry(fileURLToPath(new URL('./__fixtures__/quiet-rank-entry.ts', import.meta.url)));
    try {
      await expect(runRanks({ size: 3, entry: quiet.url })).resolves.toEqual([undefined, undefined, undefined]);
    } finally {
      quiet.remove();
    }
  }, 60_000);

  it('an entry that does not serve a rank is reported, not waited on', async () => {
    const bad = join(dir, 'not-a-rank.mjs');
    writeFileSync(bad, 'export {};\n');
    await expect(runRanks({ size: 2, entry: pathToFileURL(bad) })).rejects.toThrow(/exited .* before reporting; its entry must call serveRank first/);
  }, 60_000);
});
