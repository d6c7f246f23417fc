/**
 * The accuracy suite's crispGuarded(VS α=…) rows: the VS heads' noise floor at α, the PE
 * heads' lists as the preset keeps them (Policy.peVs), checked against the two one-α plans on
 * a mixed-threshold scenario, which has heads on both paths.
 */
import { type PrefillPlan, planPrefill, vsHead } from '@crisp/core';
import { crispGuarded } from '@crisp/presets';
import { createReferenceBackend } from '@crisp/reference';
import { noiseFloor } from '@crisp/select';
import { scenario, uploadScenario } from '@crisp/synth';
import { describe, expect, it } from 'vitest';
import { alphaOfGuardedName, crispGuardedAtAlpha } from './suites/accuracy.js';

describe('crispGuardedAtAlpha', () => {
  it('moves the VS heads to α and keeps the PE heads\' lists at the preset\'s', async () => {
    const sc = scenario('mixed-threshold', { n: 4096, heads: 8, kvHeads: 2, headDim: 64, seed: 3 });
    const be = createReferenceBackend();
    const inputs = await uploadScenario(be, sc);
    const plan = (p: typeof crispGuarded) => planPrefill(be, inputs, p, { minSparseLength: 0 });
    const at3 = crispGuardedAtAlpha(3);
    expect(at3.name).toBe('crispGuarded(VS α=3)');
    expect(alphaOfGuardedName(at3.name)).toBe(3);
    expect(alphaOfGuardedName('crispGuarded')).toBeUndefined();
    const split = await plan(at3);
    const preset = await plan(crispGuarded);
    const both = await plan({ ...crispGuarded, vs: noiseFloor({ alpha: 3, kMin: 1024 }) });
    const routes = split.routing!.routes;
    expect(routes).toEqual(preset.routing!.routes);
    expect(routes.includes('vs') && routes.includes('pe')).toBe(true);
    const lists = (p: PrefillPlan, h: number) => {
      const l = vsHead(p.mask!.vs!, h);
      return [Array.from(l.vertical), Array.from(l.slash)];
    };
    for (let h = 0; h < routes.length; h++) expect(lists(split, h), `head ${h}`).toEqual(lists(routes[h] === 'vs' ? both : preset, h));
    // α 3 keeps fewer blocks than the preset on the VS heads
    expect(split.overallDensity).toBeLessThan(preset.overallDensity);
  });
});
