/**
 * Policies for the pipeline cases. The presets use B = 128 and kMin = 1024 tokens, so at
 * the lengths CI can afford (n ~ 1k) their masks are nearly dense; the scaled copies
 * (B = 64, kMin = 256, windows 64) make the same decisions at small n with real sparsity.
 */
import type { Policy } from '@crisp/core';
import { crisp, flexPrefill } from '@crisp/presets';
import { anyPe, cStruct, jsd, residualJsd } from '@crisp/router';
import { cumulativeCoverage, globalCoverage, noiseFloor } from '@crisp/select';

/** crisp with B = 64, kMin = 256, wSink = wLocal = 64 (τ_proxy 0.2, α 1.0, γ 0.95). */
export const crispSmall: Policy = Object.freeze({
  name: 'crisp-b64-kmin256',
  blockSize: 64,
  kMin: 256,
  wSink: 64,
  wLocal: 64,
  router: cStruct({ tauProxy: 0.2, wSink: 64, wLocal: 64 }),
  vs: noiseFloor({ alpha: 1.0, kMin: 256 }),
  pe: globalCoverage({ gamma: 0.95, kMin: 256 }),
});

/** flexPrefill with B = 64, kMin = 256 (τ 0.1, γ 0.95). */
export const flexPrefillSmall: Policy = Object.freeze({
  name: 'flexPrefill-b64-kmin256',
  blockSize: 64,
  kMin: 256,
  router: jsd({ tau: 0.1 }),
  vs: cumulativeCoverage({ gamma: 0.95, kMin: 256 }),
  pe: globalCoverage({ gamma: 0.95, kMin: 256 }),
});

/**
 * crispGuarded with B = 64, kMin = 256, windows 64: PE when C_struct < 0.2 or the residual JSD
 * < 0.2, PE heads keeping the noise floor's lists too, narrowed outside 0.05 <= C_struct < 0.2
 * (planned on the device where the planner narrows: CUDA with peVsExcessOnDevice).
 */
export const crispGuardedSmall: Policy = Object.freeze({
  name: 'crispGuarded-b64-kmin256',
  blockSize: 64,
  kMin: 256,
  router: anyPe([cStruct({ tauProxy: 0.2, wSink: 64, wLocal: 64 }), residualJsd({ tau: 0.2, minResidual: 0.3 })]),
  vs: noiseFloor({ alpha: 1.0, kMin: 256 }),
  pe: globalCoverage({ gamma: 0.95, kMin: 256 }),
  peWithVs: true,
  peVsExcess: 2,
  peVsFullAnchor: { from: 0.05, below: 0.2 },
});

/** The default pipeline policies: the presets as shipped, and their scaled copies (crispGuarded's scaled copy only). */
export function defaultPolicies(): Policy[] {
  return [crisp, flexPrefill, crispSmall, flexPrefillSmall, crispGuardedSmall];
}
