import { planPrefill } from '@crisp/core';
import { presets } from '@crisp/presets';
import { createReferenceBackend, massRecall, sampleRows } from '@crisp/reference';
import { scenario, uploadScenario } from '@crisp/synth';
import { describe, expect, it } from 'vitest';
import type { RunSummary } from './run-job.js';
import { SWEEP_ALPHAS, SWEEP_GAMMAS, sweepRefusal, sweepThresholds } from './sweep.js';

// What the sweep reads of a run: its scenario, shape, block size and preset.
const run = (preset: string, input: Partial<RunSummary['input']> = {}): RunSummary =>
  ({
    input: { source: 'scenario', profile: 'mixed-threshold', seed: 3, n: 2048, heads: 8, kvHeads: 2, headDim: 64, dtype: 'f32', ...input },
    blockSize: 128,
    policies: [{ policy: preset }],
  }) as unknown as RunSummary;

describe('crisp report --sweep', () => {
  it("sweeps crispGuarded, whose point at the preset's own α and γ is the preset's plan (density and float64 mass recall)", async () => {
    const r = await sweepThresholds(run('crispGuarded'), 16);
    expect(r.preset).toBe('crispGuarded');
    expect(r.points.map((x) => x.param)).toEqual([...SWEEP_ALPHAS.map(() => 'alpha'), ...SWEEP_GAMMAS.map(() => 'gamma')]);
    const own = r.points.find((x) => x.param === 'alpha' && x.value === 1)!;
    const be = createReferenceBackend();
    try {
      const sc = scenario('mixed-threshold', { n: 2048, heads: 8, kvHeads: 2, headDim: 64, seed: 3 });
      const t = await uploadScenario(be, sc);
      const plan = await planPrefill(be, t, presets.crispGuarded, { minSparseLength: 0 });
      const host = sc.rows(0, sc.n);
      expect(own.density).toBe(plan.overallDensity);
      expect(own.massRecall).toBe(massRecall(host.q, host.k, plan.mask!, { rows: sampleRows(sc.n, 16) }).overall);
      // the γ sweep at the preset's α passes through the same plan
      expect(r.points.find((x) => x.param === 'gamma' && x.value === 0.95)!.density).toBe(plan.overallDensity);
    } finally {
      be.dispose();
    }
    // a higher floor keeps no more blocks
    const alphas = r.points.filter((x) => x.param === 'alpha');
    for (let i = 1; i < alphas.length; i++) expect(alphas[i].density).toBeLessThanOrEqual(alphas[i - 1].density);
  });

  it('refuses what it cannot sweep, saying why', () => {
    expect(sweepRefusal(run('dense'))).toMatch(/no thresholds/);
    expect(sweepRefusal(run('crisp', { profile: undefined, seed: undefined }))).toMatch(/Q\/K\/V dump/);
    expect(sweepRefusal(run('mine'))).toMatch(/not one the sweep knows/);
    for (const p of ['crisp', 'crispFast', 'crispGuarded', 'flexPrefill']) expect(sweepRefusal(run(p)), p).toBeNull();
  });
});
