import { crispGuarded, flexPrefill, crisp } from '@crisp/presets';
import { createReferenceBackend } from '@crisp/reference';
import { planPrefill } from '@crisp/core';
import { it } from 'vitest';
import { denseReference, evaluatePolicies } from './evaluate.js';
import { hostInputs, makeScenario, uploadHost } from './inputs.js';
const N = Number(process.env.EXP_N ?? 16384);
it('near', { timeout: 7_200_000 }, async () => {
  const b = createReferenceBackend();
  const g2 = { ...crispGuarded, name: 'guard κ2', peVsExcess: 2 };
  const pols = [crisp, crispGuarded, g2, flexPrefill];
  for (const profile of (process.env.EXP_P ?? 'llama-like,qwen-like,retrieval,diffuse,mixed-threshold,vs-trap').split(',')) {
    const sc = makeScenario(profile as never, N, { heads: 8, kvHeads: 2, headDim: 64 }, 7);
    const host = hostInputs(sc);
    const plan = await planPrefill(b, uploadHost(b, host, 'f32'), crispGuarded, { minSparseLength: 0 });
    console.log(profile, 'guarded routes', plan.routing!.routes.join(','), 'C', Array.from(plan.stats!.cStruct).map((x) => x.toFixed(3)).join(','));
    if (process.env.EXP_ROUTES) continue;
    const ref = denseReference(sc, host, 48);
    const r = await evaluatePolicies(b, sc, host, pols, 48, 'f32', ref);
    for (const m of r.metrics) console.log(`${profile} ${N} ${m.policy.padEnd(14)} err ${m.outputError.toFixed(4)} worst ${m.worstHeadError.toFixed(3)} needlesOut ${m.needleOutputRecall.toFixed(2)} density ${m.density.toFixed(3)}`);
  }
});
