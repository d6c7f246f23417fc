// core's planFromStatistics (what every rank of a parallel prefill runs), checked against
// planPrefill on the same backend: a source that hands over the backend's own statistics
// and PE rows must give the same plan.
import { attentionShape, planFromStatistics, planPrefill, type Policy, type StatisticsSource } from '@crisp/core';
import { crispGuardedSmall, crispSmall, flexPrefillSmall } from '@crisp/conformance';
import { dense } from '@crisp/presets';
import { createReferenceBackend } from '@crisp/reference';
import { scenario } from '@crisp/synth';
import { describe, expect, it } from 'vitest';

const n = 1300;
const whole = scenario('mixed-threshold', { n, heads: 4, kvHeads: 2, headDim: 32, seed: 9, dtype: 'f32' }).rows(0, n);
const be = createReferenceBackend();
const q = be.upload(whole.q);
const k = be.upload(whole.k);
const shape = attentionShape(whole.q, whole.k, whole.v);
const source: StatisticsSource = {
  name: 'test source',
  proxyStats: (o) => be.proxyStats(q, k, o),
  peBlockRows: (o) => be.peBlockRows(q, k, o),
};

describe('planFromStatistics', () => {
  for (const policy of [crispSmall, crispGuardedSmall, flexPrefillSmall] as Policy[]) {
    it(`${policy.name}: the plan planPrefill makes from the same statistics`, async () => {
      const want = await planPrefill(be, { q, k }, policy, { minSparseLength: 0 });
      const got = await planFromStatistics(source, shape, policy);
      expect(want.denseReason).toBeUndefined();
      expect(got.routing).toEqual(want.routing);
      expect(got.mask).toEqual(want.mask);
      expect(Array.from(got.density)).toEqual(Array.from(want.density));
      expect(Array.from(got.proxyRecall!)).toEqual(Array.from(want.proxyRecall!));
      expect(got.routing!.routes).toContain('pe');
    });
  }

  it('applies the same gates: a dense policy, the minimum length, the length gate', async () => {
    expect((await planFromStatistics(source, shape, dense)).denseReason).toBe('policy');
    expect((await planFromStatistics(source, { ...shape, keys: 200, queries: 200 }, crispSmall)).denseReason).toBe('min-length');
    expect((await planFromStatistics(source, shape, crispSmall, { minSparseLength: n + 1 })).denseReason).toBe('length-gate');
    await expect(planFromStatistics(source, shape, crispSmall, { minSparseLength: Number.NaN })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
  });

  it('refuses statistics of another layer and a source without its two calls', async () => {
    await expect(planFromStatistics(source, { ...shape, keys: n + 64, queries: n + 64 }, crispSmall)).rejects.toThrow(/statistics for n 1300/);
    await expect(planFromStatistics({ name: 'x' } as unknown as StatisticsSource, shape, crispSmall)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
  });
});
