/**
 * The policy a run uses: a preset, with the flags' overrides applied to its parts.
 *   --alpha      noise-floor multiplier α (crisp, crispFast; crispGuarded: of its VS heads,
 *                its PE heads' lists keep the preset's α through Policy.peVs)
 *   --gamma      γ of the PE global coverage (all sparse presets) and of FlexPrefill's
 *                cumulative coverage
 *   --tau-proxy  C_struct threshold τ_proxy (crisp, crispFast, crispGuarded)
 *   --block      B, 64 or 128
 */
import type { Policy } from '@crisp/core';
import { type PresetName, presets } from '@crisp/presets';
import { type AnyPeRouter, anyPe, cStruct, jsd } from '@crisp/router';
import { cumulativeCoverage, globalCoverage, type NoiseFloorSelector, noiseFloor } from '@crisp/select';
import { UsageError } from './cli-io.js';

export const PRESET_NAMES = Object.keys(presets) as PresetName[];

/** The noise-floor α a preset runs with (undefined for presets without the floor: flexPrefill, dense, unknown names). */
export function presetAlpha(preset: string): number | undefined {
  const vs = (presets as Record<string, Policy | undefined>)[preset]?.vs;
  return vs?.device?.kind === 'noiseFloor' ? (vs as NoiseFloorSelector).alpha : undefined;
}

export interface PolicyOverrides {
  readonly alpha?: number;
  readonly gamma?: number;
  readonly tauProxy?: number;
  readonly blockSize?: number;
}

const K_MIN = 1024;

export function buildPolicy(name: string, o: PolicyOverrides = {}): Policy {
  if (!(PRESET_NAMES as string[]).includes(name)) {
    throw new UsageError(`unknown preset '${name}'; use one of ${PRESET_NAMES.join(', ')}`);
  }
  const preset = name as PresetName;
  const B = o.blockSize ?? 128;
  if (preset === 'dense') {
    if (o.alpha !== undefined || o.gamma !== undefined || o.tauProxy !== undefined) {
      throw new UsageError('--alpha, --gamma and --tau-proxy do not apply to the dense preset');
    }
    return presets.dense;
  }
  const gamma = o.gamma ?? 0.95;
  if (preset === 'flexPrefill') {
    if (o.alpha !== undefined) throw new UsageError('--alpha is the noise floor of the crisp presets; flexPrefill has no α');
    if (o.tauProxy !== undefined) {
      throw new UsageError('--tau-proxy is the C_struct threshold of the crisp presets; flexPrefill routes by JSD (τ = 0.1)');
    }
    return {
      name: o.gamma !== undefined || B !== 128 ? `flexPrefill(γ=${gamma}, B=${B})` : 'flexPrefill',
      blockSize: B,
      kMin: K_MIN,
      router: jsd({ tau: 0.1 }),
      vs: cumulativeCoverage({ gamma, kMin: K_MIN }),
      pe: globalCoverage({ gamma, kMin: K_MIN }),
    };
  }
  // Unset flags keep the preset's own values (its floor's α; crispGuarded's residual router).
  const base = presets[preset];
  const alpha = o.alpha ?? presetAlpha(preset);
  const tauProxy = o.tauProxy ?? 0.2;
  const changed = o.alpha !== undefined || o.gamma !== undefined || o.tauProxy !== undefined || B !== 128;
  const byAnchors = cStruct({ tauProxy, wSink: 128, wLocal: 128 });
  return {
    name: changed ? `${preset}(α=${alpha}, γ=${gamma}, τ=${tauProxy}, B=${B})` : preset,
    blockSize: B,
    kMin: K_MIN,
    // crispGuarded: PE when C_struct or the residual JSD says so, PE heads keeping VS lists too
    router: preset === 'crispGuarded' ? anyPe([byAnchors, (base.router as AnyPeRouter).routers[1]]) : byAnchors,
    vs: noiseFloor({ alpha, kMin: K_MIN }),
    pe: globalCoverage({ gamma, kMin: K_MIN }),
    // the preset's PE-head guards as they are (crispGuarded: its VS lists, narrowed, at the
    // preset's α: they keep the needles the pooled map smooths away, which a higher α loses)
    ...(base.peWithVs ? { peWithVs: true } : {}),
    ...(base.peWithVs && alpha !== presetAlpha(preset) ? { peVs: base.peVs ?? base.vs } : {}),
    ...(base.peVsExcess !== undefined ? { peVsExcess: base.peVsExcess } : {}),
    ...(base.peVsFullAnchor !== undefined ? { peVsFullAnchor: base.peVsFullAnchor } : {}),
  };
}

/**
 * The policies a run plans: the preset with the flags' overrides, then each compared preset
 * (with the run's block size) unless it is that same policy (the preset itself, no override).
 */
export function runPolicies(preset: string, o: PolicyOverrides, compare: readonly string[]): Policy[] {
  const policies = [buildPolicy(preset, o)];
  for (const c of compare) {
    const p = buildPolicy(c, { blockSize: o.blockSize });
    if (!policies.some((x) => x.name === p.name)) policies.push(p);
  }
  return policies;
}
