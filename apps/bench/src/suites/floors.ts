/**
 * Floors compared: the VS selector swapped inside CRISP's policy (C_struct router, γ 0.95
 * PE path) and everything else fixed, on every scenario profile. The paper's mean floor μ
 * at several α, the median and upper-quantile floors, the robust (median + c·MAD) floor,
 * and FlexPrefill's γ coverage for contrast. Plotted as mass recall against density: the
 * accuracy-density Pareto front.
 */
import type { Policy, VsSelector } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { cumulativeCoverage, medianFloor, noiseFloor, quantileFloor, robustFloor } from '@crisp/select';
import type { OpenBackend } from '../backends.js';
import { deadlineReason, type SuiteContext, message, timeLeft, withTimeout } from '../context.js';
import { denseReference, evaluatePolicies, type MaskMetrics } from '../evaluate.js';
import { hostInputs, makeScenario } from '../inputs.js';
import { accuracyDtype } from './accuracy.js';

export interface FloorVariant {
  readonly family: 'mean' | 'median' | 'quantile' | 'robust' | 'coverage';
  readonly param: string;
  readonly selector: VsSelector;
}

export function floorVariants(): FloorVariant[] {
  return [
    ...[0.75, 1, 1.25, 1.5, 2].map((alpha) => ({ family: 'mean' as const, param: `α=${alpha}`, selector: noiseFloor({ alpha }) })),
    ...[1, 1.5, 2].map((alpha) => ({ family: 'median' as const, param: `α=${alpha}`, selector: medianFloor({ alpha }) })),
    ...[0.75, 0.9].map((q) => ({ family: 'quantile' as const, param: `q=${q}`, selector: quantileFloor({ q }) })),
    ...[2, 3, 4].map((c) => ({ family: 'robust' as const, param: `c=${c}`, selector: robustFloor({ c }) })),
    ...[0.9, 0.95].map((gamma) => ({ family: 'coverage' as const, param: `γ=${gamma}`, selector: cumulativeCoverage({ gamma }) })),
  ];
}

export interface FloorRow extends MaskMetrics {
  readonly backend: string;
  readonly profile: string;
  readonly n: number;
  readonly family: FloorVariant['family'];
  readonly param: string;
  /** the run (its startedAt) that measured this row; set when results are merged */
  readonly run?: string;
}

export interface FloorSummary {
  readonly family: string;
  readonly param: string;
  readonly massRecall: number;
  readonly outputError: number;
  readonly density: number;
  readonly needleRecall: number;
  /** on the accuracy-density Pareto front: no other variant has mass recall >= and density <=, one of them strictly */
  readonly pareto: boolean;
}

export interface FloorsResult {
  readonly backend?: string;
  readonly n: number;
  readonly rows: FloorRow[];
  /** per variant, the mean over the profiles measured */
  readonly summary: FloorSummary[];
  readonly skipped: { profile: string; reason: string }[];
}

export async function floorsSuite(ctx: SuiteContext, backends: readonly OpenBackend[]): Promise<FloorsResult> {
  const c = ctx.config.floors;
  // Selection is host code over the backend's statistics: one backend suffices; prefer the
  // float64 reference when the size allows it.
  const ob =
    backends.find((x) => x.backend && x.name === 'reference' && c.n <= x.backend.capabilities.maxSequence) ??
    backends.find((x) => x.backend && c.n <= x.backend.capabilities.maxSequence);
  const result: FloorsResult = { backend: ob?.name, n: c.n, rows: [], summary: [], skipped: [] };
  if (!ob?.backend) {
    result.skipped.push({ profile: '*', reason: 'no backend available at this n' });
    return result;
  }
  const variants = floorVariants();
  const policies: Policy[] = variants.map((v) => ({ ...crisp, name: `${v.family} ${v.param}`, vs: v.selector }));
  let lastMs: number | undefined;
  for (const profile of c.profiles) {
    const left = timeLeft(ctx);
    if ((lastMs ?? 0) > left || left <= 0) {
      result.skipped.push({ profile, reason: deadlineReason(lastMs ?? 0, left) });
      ctx.log(`  floors ${profile}: skipped (${deadlineReason(lastMs ?? 0, left)})`);
      continue;
    }
    const t0 = performance.now();
    try {
      const sc = makeScenario(profile, c.n, c.shape, ctx.config.seed + 1);
      const host = hostInputs(sc);
      const r = await withTimeout(
        evaluatePolicies(ob.backend, sc, host, policies, c.rows, accuracyDtype(ob), denseReference(sc, host, c.rows)),
        900_000,
        `floors ${profile}`,
      );
      r.metrics.forEach((m, i) => {
        result.rows.push({ backend: ob.name, profile, n: c.n, family: variants[i].family, param: variants[i].param, ...m });
      });
      ctx.log(`  floors ${profile}: ${r.metrics.map((m) => `${m.policy} ${m.massRecall.toFixed(3)}@${m.density.toFixed(3)}`).join(', ')}`);
    } catch (e) {
      result.skipped.push({ profile, reason: message(e) });
      ctx.log(`  floors ${profile}: failed (${message(e)})`);
    }
    lastMs = performance.now() - t0;
    result.summary.splice(0, result.summary.length, ...floorSummary(variants, result.rows));
    ctx.progress?.('floors', result);
  }
  return result;
}

/** Per variant, the mean over the profiles measured, and whether it is on the accuracy-density Pareto front. */
export function floorSummary(variants: readonly { family: string; param: string }[], rows: readonly FloorRow[]): FloorSummary[] {
  const means: Omit<FloorSummary, 'pareto'>[] = [];
  for (const v of variants) {
    const rs = rows.filter((r) => r.family === v.family && r.param === v.param);
    if (rs.length === 0) continue;
    const mean = (f: (r: FloorRow) => number) => rs.reduce((s, r) => s + f(r), 0) / rs.length;
    means.push({
      family: v.family,
      param: v.param,
      massRecall: mean((r) => r.massRecall),
      outputError: mean((r) => r.outputError),
      density: mean((r) => r.density),
      needleRecall: mean((r) => r.needleRecall),
    });
  }
  const dominated = (a: (typeof means)[number]) =>
    means.some((b) => b !== a && b.massRecall >= a.massRecall && b.density <= a.density && (b.massRecall > a.massRecall || b.density < a.density));
  return means.map((m) => ({ ...m, pareto: !dominated(m) }));
}
