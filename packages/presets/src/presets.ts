/**
 * The named policies. A policy is just an object: take the router of one and the selector
 * of another, or put your own object with the same shape in (see the README).
 *
 *   crisp        C_struct router (τ_proxy 0.2) + noise floor (α 1.0) + global coverage (γ 0.95)
 *   crispFast    the same with α = 1.25 (fewer blocks, the paper's speed setting)
 *   crispGuarded PE when C_struct < 0.2 or the residual JSD < 0.2 + noise floor (α 1.0) + global
 *                coverage (γ 0.95), PE heads keeping the noise floor's lists too: whole on heads
 *                with 0.05 <= C_struct < 0.2, elsewhere only the vertical blocks the pooled map
 *                under-reads twice over (crisp with no head left behind)
 *   flexPrefill  JSD router (τ 0.1) + cumulative coverage (γ 0.95) + global coverage (γ 0.95)
 *   dense        every head dense (@crisp/core's densePolicy)
 *
 * All sparse presets use B = 128 and k_min = 1024 tokens per direction.
 */
import { describeValue, densePolicy, InvalidArgumentError, type Policy } from '@crisp/core';
import { anyPe, cStruct, jsd, residualJsd } from '@crisp/router';
import { cumulativeCoverage, globalCoverage, noiseFloor } from '@crisp/select';

const common = { blockSize: 128, kMin: 1024 } as const;

/** CRISP, accuracy setting: cStruct({ tauProxy: 0.2 }) + noiseFloor({ alpha: 1.0 }) + globalCoverage({ gamma: 0.95 }). */
export const crisp: Policy = Object.freeze({
  name: 'crisp',
  ...common,
  router: cStruct({ tauProxy: 0.2, wSink: 128, wLocal: 128 }),
  vs: noiseFloor({ alpha: 1.0, kMin: 1024 }),
  pe: globalCoverage({ gamma: 0.95, kMin: 1024 }),
});

/** CRISP, speed setting: as `crisp` with noiseFloor({ alpha: 1.25 }). */
export const crispFast: Policy = Object.freeze({
  name: 'crispFast',
  ...common,
  router: cStruct({ tauProxy: 0.2, wSink: 128, wLocal: 128 }),
  vs: noiseFloor({ alpha: 1.25, kMin: 1024 }),
  pe: globalCoverage({ gamma: 0.95, kMin: 1024 }),
});

/**
 * CRISP with no head left behind: `crisp`'s rules with two guards beside them. A head goes to
 * PE when C_struct < 0.2 or when the pooled estimate explains the mass its proxy rows put off
 * the anchors (residualJsd: residual JSD < 0.2 with at least 0.3 of the mass there), which
 * catches content-driven heads with a sink; and PE heads keep the noise floor's VS lists
 * beside their PE rows (Policy.peWithVs), which keeps the needles the pooled map smooths
 * away. Since a PE head keeps its VS lists, sending a head to PE costs blocks, never the VS
 * selection, so the residual test leans toward PE (τ 0.2; at 0.1 content-driven heads stayed
 * on VS at 64k, with errors up to 0.21). `crisp` stays the paper's method. On a backend whose
 * planner runs these rules (CUDA) the plan is made on the device, as crisp's is.
 */
export const crispGuarded: Policy = Object.freeze({
  name: 'crispGuarded',
  ...common,
  router: anyPe([cStruct({ tauProxy: 0.2, wSink: 128, wLocal: 128 }), residualJsd({ tau: 0.2, minResidual: 0.3 })]),
  vs: noiseFloor({ alpha: 1.0, kMin: 1024 }),
  pe: globalCoverage({ gamma: 0.95, kMin: 1024 }),
  peWithVs: true,
  peVsExcess: 2,
  peVsFullAnchor: { from: 0.05, below: 0.2 },
});

/** FlexPrefill: jsd({ tau: 0.1 }) + cumulativeCoverage({ gamma: 0.95 }) + globalCoverage({ gamma: 0.95 }). */
export const flexPrefill: Policy = Object.freeze({
  name: 'flexPrefill',
  ...common,
  router: jsd({ tau: 0.1 }),
  vs: cumulativeCoverage({ gamma: 0.95, kMin: 1024 }),
  pe: globalCoverage({ gamma: 0.95, kMin: 1024 }),
});

/** Dense attention for every head (the baseline). */
export const dense: Policy = densePolicy;

export type PresetName = 'crisp' | 'crispFast' | 'crispGuarded' | 'flexPrefill' | 'dense';

/**
 * Every preset by name (for CLIs and reports). It has no prototype, so a name such as
 * `'__proto__'` or `'toString'` finds nothing instead of an Object method; `presetByName`
 * turns an unknown name into a typed error.
 */
export const presets: Readonly<Record<PresetName, Policy>> = Object.freeze(
  Object.assign(Object.create(null) as Record<PresetName, Policy>, { crisp, crispFast, crispGuarded, flexPrefill, dense }),
);

/** The preset called `name` (an own key of `presets`), else INVALID_ARGUMENT listing the names. */
export function presetByName(name: string): Policy {
  if (typeof name !== 'string' || !Object.hasOwn(presets, name)) {
    throw new InvalidArgumentError(`unknown preset ${describeValue(name)}; the presets are ${Object.keys(presets).join(', ')}`);
  }
  return presets[name as PresetName];
}
