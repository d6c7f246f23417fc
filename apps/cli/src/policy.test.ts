/** The CLI's policies: each preset name builds the preset itself (same plan), overrides change only what they name. */
import { planPrefill } from '@crisp/core';
import { presets } from '@crisp/presets';
import { createReferenceBackend } from '@crisp/reference';
import type { AnyPeRouter } from '@crisp/router';
import { scenario, uploadScenario } from '@crisp/synth';
import { describe, expect, it } from 'vitest';
import { buildPolicy, PRESET_NAMES, runPolicies } from './policy.js';

describe('buildPolicy', () => {
  it.each(PRESET_NAMES.filter((p) => p !== 'dense'))('%s plans exactly as the preset does', async (name) => {
    const sc = scenario('diffuse', { n: 2048, heads: 4, kvHeads: 1, headDim: 32, seed: 5 });
    const be = createReferenceBackend();
    const t = await uploadScenario(be, sc);
    const mine = buildPolicy(name);
    expect(mine.name).toBe(name);
    expect(mine.router?.name).toBe(presets[name].router?.name);
    expect(mine.peWithVs).toBe(presets[name].peWithVs);
    const a = await planPrefill(be, t, mine, { minSparseLength: 0 });
    const b = await planPrefill(be, t, presets[name], { minSparseLength: 0 });
    expect(a.routing?.routes).toEqual(b.routing?.routes);
    expect(Array.from(a.density)).toEqual(Array.from(b.density));
    expect(Array.from(a.proxyRecall!)).toEqual(Array.from(b.proxyRecall!));
  });

  it('keeps the guards of crispGuarded under --tau-proxy and names the override', () => {
    const p = buildPolicy('crispGuarded', { tauProxy: 0.3 });
    expect(p.name).toBe('crispGuarded(α=1, γ=0.95, τ=0.3, B=128)');
    expect(p.router?.name).toBe('anyPe(cStruct, residualJsd)');
    expect((p.router as AnyPeRouter).routers).toMatchObject([{ tauProxy: 0.3 }, { tau: 0.2, minResidual: 0.3 }]);
    expect(p.peWithVs).toBe(true);
    expect(buildPolicy('crisp').peWithVs).toBeUndefined();
  });

  it('keeps every field of the preset it names (crispGuarded narrows its PE heads\' VS lists)', async () => {
    for (const name of PRESET_NAMES) {
      const { router: _r, vs: _v, pe: _p, ...fields } = presets[name];
      expect(buildPolicy(name)).toMatchObject(fields);
    }
    // where the narrowing matters (PE heads with lists to narrow), the plans are the preset's
    const sc = scenario('vs-trap', { n: 8192, heads: 8, kvHeads: 2, headDim: 32, seed: 5 });
    const be = createReferenceBackend();
    const t = await uploadScenario(be, sc);
    const mine = await planPrefill(be, t, buildPolicy('crispGuarded'), { minSparseLength: 0 });
    const preset = await planPrefill(be, t, presets.crispGuarded, { minSparseLength: 0 });
    const { peVsExcess: _e, peVsFullAnchor: _f, ...unnarrowed } = presets.crispGuarded;
    const wide = await planPrefill(be, t, unnarrowed, { minSparseLength: 0 });
    expect(Array.from(mine.density)).toEqual(Array.from(preset.density));
    expect(mine.overallDensity).toBeLessThan(wide.overallDensity - 0.01);
  });

  it('moves only crispGuarded\'s VS heads under --alpha: its PE heads keep the preset\'s lists', async () => {
    const p = buildPolicy('crispGuarded', { alpha: 3 });
    expect(p.name).toBe('crispGuarded(α=3, γ=0.95, τ=0.2, B=128)');
    expect(p.peVs).toBe(presets.crispGuarded.vs);
    expect(buildPolicy('crispGuarded').peVs).toBeUndefined();
    expect(buildPolicy('crisp', { alpha: 3 }).peVs).toBeUndefined();
    const sc = scenario('mixed-threshold', { n: 16384, heads: 8, kvHeads: 2, headDim: 32, seed: 5 });
    const be = createReferenceBackend();
    const t = await uploadScenario(be, sc);
    const mine = await planPrefill(be, t, p, { minSparseLength: 0 });
    const preset = await planPrefill(be, t, presets.crispGuarded, { minSparseLength: 0 });
    const routes = mine.routing!.routes;
    expect(routes).toEqual(preset.routing!.routes);
    expect(routes.includes('vs') && routes.includes('pe')).toBe(true);
    for (let h = 0; h < routes.length; h++) {
      if (routes[h] === 'pe') expect(mine.density[h], `head ${h}`).toBe(preset.density[h]);
      else expect(mine.density[h], `head ${h}`).toBeLessThanOrEqual(preset.density[h]);
    }
    expect(mine.overallDensity).toBeLessThan(preset.overallDensity);
  });

  it('runs a compared preset beside the same preset with overrides, and only once without', () => {
    expect(runPolicies('crisp', { alpha: 2 }, ['crisp', 'flexPrefill']).map((p) => p.name)).toEqual([
      'crisp(α=2, γ=0.95, τ=0.2, B=128)',
      'crisp',
      'flexPrefill',
    ]);
    expect(runPolicies('crisp', {}, ['crisp', 'crispFast']).map((p) => p.name)).toEqual(['crisp', 'crispFast']);
    expect(runPolicies('crisp', { blockSize: 64 }, ['crisp']).map((p) => p.name)).toEqual(['crisp(α=1, γ=0.95, τ=0.2, B=64)']);
  });
});
