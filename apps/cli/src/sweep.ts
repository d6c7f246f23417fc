/**
 * `crisp report --sweep`: the accuracy/density trade-off of the run's policy as its thresholds
 * move. The run's scenario is regenerated at a modest size on the reference backend (plans
 * only, no attention), and each plan's density and float64 mass recall on sampled rows are
 * recorded: α (the noise floor of the VS heads; crispGuarded's PE heads' lists stay at the
 * preset's α, as with --alpha) with γ fixed, then γ (PE coverage, and FlexPrefill's VS
 * coverage) with α fixed. A few seconds on a laptop CPU.
 */
import { planPrefill } from '@crisp/core';
import { createReferenceBackend, massRecall, sampleRows } from '@crisp/reference';
import { type ProfileName, scenario, uploadScenario } from '@crisp/synth';
import { buildPolicy } from './policy.js';
import { presetSettings } from './provenance.js';
import type { RunSummary } from './run-job.js';

export const SWEEP_ALPHAS: readonly number[] = [0.5, 0.75, 1, 1.25, 1.5, 2, 3, 5];
export const SWEEP_GAMMAS: readonly number[] = [0.7, 0.8, 0.9, 0.95, 0.98, 0.995];
/** the largest scenario the sweep generates (tokens, heads, head dim) */
export const SWEEP_CAP = { n: 2048, heads: 8, headDim: 64 } as const;

export interface SweepPoint {
  readonly param: 'alpha' | 'gamma';
  readonly value: number;
  readonly density: number;
  readonly massRecall: number;
}

export interface SweepResult {
  readonly preset: string;
  readonly profile: string;
  readonly seed: number;
  readonly n: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly blockSize: number;
  readonly sampleRows: number;
  /** the run's own α and γ (the point the plot marks) */
  readonly alpha?: number;
  readonly gamma?: number;
  readonly points: readonly SweepPoint[];
  readonly ms: number;
}

/** Why a run cannot be swept, or null when it can. */
export function sweepRefusal(s: RunSummary): string | null {
  const preset = s.provenance?.settings.preset ?? baseName(s.policies[0]?.policy ?? '');
  if (!s.input.profile || s.input.seed === undefined) return 'the run read a Q/K/V dump, and the sweep regenerates a synthetic scenario';
  if (preset === 'dense') return 'the dense preset has no thresholds to sweep';
  if (!['crisp', 'crispFast', 'crispGuarded', 'flexPrefill'].includes(preset)) return `preset '${preset}' is not one the sweep knows`;
  return null;
}

/** 'crisp(α=1.5, …)' -> 'crisp' */
function baseName(policy: string): string {
  return policy.replace(/\(.*$/, '');
}

/** The sweep for a run's scenario and policy; throws when sweepRefusal says why not. */
export async function sweepThresholds(s: RunSummary, sampleCount = 32): Promise<SweepResult> {
  const why = sweepRefusal(s);
  if (why) throw new Error(`no sweep: ${why}`);
  const t0 = performance.now();
  const settings = s.provenance?.settings ?? presetSettings(baseName(s.policies[0].policy), {});
  const preset = settings.preset;
  const heads = Math.min(s.input.heads, SWEEP_CAP.heads);
  // the run's kv heads where they still divide the capped heads, else a quarter of them
  const kvHeads = s.input.kvHeads <= heads && heads % s.input.kvHeads === 0 ? s.input.kvHeads : Math.max(1, Math.floor(heads / 4));
  const shape = {
    n: Math.min(s.input.n, SWEEP_CAP.n),
    heads,
    kvHeads,
    headDim: Math.min(s.input.headDim, SWEEP_CAP.headDim),
    seed: s.input.seed!,
  };
  const sc = scenario(s.input.profile as ProfileName, shape);
  const be = createReferenceBackend();
  try {
    const t = await uploadScenario(be, sc);
    const host = sc.rows(0, sc.n);
    const rows = sampleRows(sc.n, sampleCount);
    const B = s.blockSize;
    const points: SweepPoint[] = [];
    const measure = async (param: SweepPoint['param'], value: number, o: { alpha?: number; gamma?: number }) => {
      const plan = await planPrefill(be, t, buildPolicy(preset, { ...o, tauProxy: settings.tauProxy, blockSize: B }), { minSparseLength: 0 });
      const recall = plan.mask ? massRecall(host.q, host.k, plan.mask, { rows }).overall : 1;
      points.push({ param, value, density: plan.overallDensity, massRecall: recall });
    };
    if (preset !== 'flexPrefill') for (const a of SWEEP_ALPHAS) await measure('alpha', a, { alpha: a, gamma: settings.gamma });
    for (const g of SWEEP_GAMMAS) await measure('gamma', g, { alpha: settings.alpha, gamma: g });
    for (const x of [t.q, t.k, t.v]) x.dispose();
    return { preset, profile: sc.profile, ...shape, blockSize: B, sampleRows: rows.length, alpha: settings.alpha, gamma: settings.gamma, points, ms: performance.now() - t0 };
  } finally {
    be.dispose();
  }
}
