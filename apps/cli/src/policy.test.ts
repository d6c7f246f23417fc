/** The CLI's policies: each preset name builds the preset itself (same plan), overrides change only what they name. */
import { planPrefill } from '@crisp/core';
import { presets } from '@crisp/presets';
import { createReferenceBackend } from '@crisp/reference';
import type { AnyPeRouter } from '@crisp/router';
import { scenario, uploadScenario } from '@crisp/synth';
import { describe, expect, it } from 'vitest';
import { buildPolicy, PRESET_NAMES } from './policy.js';

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
});
