/**
 * Accuracy per preset (and crispGuarded with its PE heads' full VS lists) and scenario profile on every
 * backend (the plan comes from the backend's own proxy statistics and PE rows; the mask is
 * scored exactly on the host):
 * mass recall, output error, needle recall, density, and the routing agreement of C_struct
 * and JSD on the same heads (and of each with the scenario's intended routes).
 */
import type { DType, Policy } from '@crisp/core';
import { crisp, crispFast, crispGuarded, flexPrefill } from '@crisp/presets';
import { cumulativeCoverage, globalCoverage, type NoiseFloorSelector, noiseFloor } from '@crisp/select';
import type { OpenBackend } from '../backends.js';
import { deadlineReason, type SuiteContext, message, timeLeft, withTimeout } from '../context.js';
import { denseReference, evaluatePolicies, type MaskMetrics, type RoutingMetrics } from '../evaluate.js';
import { hostInputs, makeScenario } from '../inputs.js';

export interface AccuracyRow extends MaskMetrics {
  readonly backend: string;
  readonly profile: string;
  readonly n: number;
  /** the run (its startedAt) that measured this row; set when results are merged */
  readonly run?: string;
}

export interface RoutingRow extends RoutingMetrics {
  readonly backend: string;
  readonly profile: string;
  readonly n: number;
  readonly run?: string;
}

export interface AccuracyResult {
  readonly shape: { heads: number; kvHeads: number; headDim: number };
  readonly sampledRows: number;
  readonly rows: AccuracyRow[];
  readonly routing: RoutingRow[];
  readonly skipped: { backend: string; profile: string; n: number; reason: string }[];
}

/**
 * crispGuarded with its PE heads' full VS lists (no Policy.peVsExcess narrowing): measured
 * beside the preset, to show what the narrowing saves and costs.
 */
export const crispGuardedFullLists: Policy = Object.freeze({ ...crispGuarded, name: 'crispGuarded(full lists)', peVsExcess: undefined, peVsFullAnchor: undefined });

/**
 * The flexPrefill preset with coverage γ for both its selections (VS: cumulative coverage of
 * the proxy rows' token scores; PE: γ of the pooled map), the rest unchanged: FlexPrefill's
 * own knob for trading blocks for accuracy, for the comparison at matched error.
 */
export function flexPrefillAtGamma(gamma: number): Policy {
  const kMin = flexPrefill.pe!.kMin;
  return Object.freeze({
    ...flexPrefill,
    name: flexAtGammaName(gamma),
    vs: cumulativeCoverage({ gamma, kMin }),
    pe: globalCoverage({ gamma, kMin }),
  });
}

export const flexAtGammaName = (gamma: number): string => `flexPrefill(γ=${gamma})`;

/** The γ of a flexAtGammaName row's policy name; undefined for any other name. */
export function gammaOfFlexName(policy: string): number | undefined {
  const m = /^flexPrefill\(γ=([0-9.]+)\)$/.exec(policy);
  return m ? Number(m[1]) : undefined;
}

/**
 * crispGuarded with its VS heads' noise floor at α (the preset's is 1.0) and its PE heads'
 * lists kept at the preset's (Policy.peVs), the rest unchanged: the knob that trades its
 * error for blocks, for the comparison with flexPrefill at matched density. The PE heads'
 * lists stay as they are because they keep the needles the pooled map smooths away: one α
 * for both cost mixed-threshold needles-in-output at α 2 (0.97 / 0.93 / 0.90 from 1.00 /
 * 0.97 / 1.00) where this leaves them as the preset has them.
 */
export function crispGuardedAtAlpha(alpha: number): Policy {
  return Object.freeze({
    ...crispGuarded,
    name: guardedAtAlphaName(alpha),
    vs: noiseFloor({ alpha, kMin: (crispGuarded.vs as NoiseFloorSelector).kMin }),
    peVs: crispGuarded.peVs ?? crispGuarded.vs,
  });
}

export const guardedAtAlphaName = (alpha: number): string => `crispGuarded(VS α=${alpha})`;

/** The α of a guardedAtAlphaName row's policy name; undefined for any other name. */
export function alphaOfGuardedName(policy: string): number | undefined {
  const m = /^crispGuarded\(VS α=([0-9.]+)\)$/.exec(policy);
  return m ? Number(m[1]) : undefined;
}

/** The flexPrefill preset's own coverage γ (its VS and PE selections share it). */
export const FLEX_PRESET_GAMMA = flexPrefill.pe!.gamma;

/** Accuracy inputs stay in f32 where the backend has it (CUDA: bf16). */
export function accuracyDtype(ob: OpenBackend): DType {
  return ob.backend?.capabilities.dtypes.includes('f32') ? 'f32' : 'bf16';
}

const presets: readonly Policy[] = [crisp, crispFast, crispGuarded, crispGuardedFullLists, flexPrefill];

export async function accuracySuite(ctx: SuiteContext, backends: readonly OpenBackend[]): Promise<AccuracyResult> {
  const c = ctx.config.accuracy;
  const result: AccuracyResult = { shape: c.shape, sampledRows: c.rows, rows: [], routing: [], skipped: [] };
  // Host time per (n, profile): the scenario, the dense rows and every backend's scoring.
  // Scoring is O(rows · n): the next item is projected linearly in n from the last one.
  let last: { n: number; ms: number } | undefined;
  for (const n of c.sizes) {
    for (const profile of c.profiles) {
      const on = backends.filter((ob) => ob.backend && (ob.name === 'reference' || c.gpuProfiles.includes(profile)));
      if (on.length === 0) continue;
      const projected = last ? (last.ms * n) / last.n : 0;
      const left = timeLeft(ctx);
      if (projected > left || left <= 0) {
        const reason = deadlineReason(projected, left);
        for (const ob of on) result.skipped.push({ backend: ob.name, profile, n, reason });
        ctx.log(`  accuracy ${profile} n=${n}: skipped (${reason})`);
        continue;
      }
      const t0 = performance.now();
      const sc = makeScenario(profile, n, c.shape, ctx.config.seed);
      const host = hostInputs(sc);
      const tScenario = performance.now() - t0;
      let ref: ReturnType<typeof denseReference> | undefined;
      let tDense = 0;
      for (const ob of on) {
        const b = ob.backend!;
        if (n > b.capabilities.maxSequence) {
          result.skipped.push({ backend: ob.name, profile, n, reason: `n exceeds maxSequence ${b.capabilities.maxSequence}` });
          continue;
        }
        try {
          if (!ref) {
            const t1 = performance.now();
            ref = denseReference(sc, host, c.rows);
            tDense = performance.now() - t1;
          }
          const r = await withTimeout(
            evaluatePolicies(b, sc, host, [...presets, ...(c.guardAlphas ?? []).map(crispGuardedAtAlpha), ...(c.flexGammas ?? []).map(flexPrefillAtGamma)], c.rows, accuracyDtype(ob), ref),
            600_000,
            `accuracy ${ob.name} ${profile} n=${n}`,
          );
          for (const m of r.metrics) result.rows.push({ backend: ob.name, profile, n, ...m });
          result.routing.push({ backend: ob.name, profile, n, ...r.routing });
          ctx.log(
            `  accuracy ${ob.name} ${profile} n=${n}: ${r.metrics.map((m) => `${m.policy} recall ${m.massRecall.toFixed(3)} err ${m.outputError.toFixed(3)} worst head ${m.worstHeadError.toFixed(3)} proxy recall >= ${m.minProxyRecall.toFixed(3)} needles ${m.needleRecall.toFixed(2)} (visible ${m.visibleNeedleRecall?.toFixed(2) ?? '–'}) density ${m.density.toFixed(3)}`).join('; ')}; C_struct~JSD ${r.routing.cStructVsJsd.toFixed(2)}`,
          );
        } catch (e) {
          result.skipped.push({ backend: ob.name, profile, n, reason: message(e) });
          ctx.log(`  accuracy ${ob.name} ${profile} n=${n}: failed (${message(e)})`);
        }
      }
      last = { n, ms: performance.now() - t0 };
      ctx.log(`  accuracy ${profile} n=${n}: ${(last.ms / 1000).toFixed(1)} s (scenario ${(tScenario / 1000).toFixed(1)} s, dense rows ${(tDense / 1000).toFixed(1)} s)`);
      ctx.progress?.('accuracy', result);
    }
  }
  return result;
}
