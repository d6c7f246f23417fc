/**
 * Accuracy per preset and scenario profile on every backend (the plan comes from the
 * backend's own proxy statistics and PE rows; the mask is scored exactly on the host):
 * mass recall, output error, needle recall, density, and the routing agreement of C_struct
 * and JSD on the same heads (and of each with the scenario's intended routes).
 */
import type { DType } from '@crisp/core';
import { crisp, crispFast, flexPrefill } from '@crisp/presets';
import type { OpenBackend } from '../backends.js';
import { type SuiteContext, message, withTimeout } from '../context.js';
import { evaluatePolicies, type MaskMetrics, type RoutingMetrics } from '../evaluate.js';
import { hostInputs, makeScenario } from '../inputs.js';

export interface AccuracyRow extends MaskMetrics {
  readonly backend: string;
  readonly profile: string;
  readonly n: number;
}

export interface RoutingRow extends RoutingMetrics {
  readonly backend: string;
  readonly profile: string;
  readonly n: number;
}

export interface AccuracyResult {
  readonly shape: { heads: number; kvHeads: number; headDim: number };
  readonly sampledRows: number;
  readonly rows: AccuracyRow[];
  readonly routing: RoutingRow[];
  readonly skipped: { backend: string; profile: string; n: number; reason: string }[];
}

/** Accuracy inputs stay in f32 where the backend has it (CUDA: bf16). */
export function accuracyDtype(ob: OpenBackend): DType {
  return ob.backend?.capabilities.dtypes.includes('f32') ? 'f32' : 'bf16';
}

export async function accuracySuite(ctx: SuiteContext, backends: readonly OpenBackend[]): Promise<AccuracyResult> {
  const c = ctx.config.accuracy;
  const result: AccuracyResult = { shape: c.shape, sampledRows: c.rows, rows: [], routing: [], skipped: [] };
  for (const n of c.sizes) {
    for (const profile of c.profiles) {
      const sc = makeScenario(profile, n, c.shape, ctx.config.seed);
      const host = hostInputs(sc);
      for (const ob of backends) {
        const b = ob.backend;
        if (!b) continue;
        if (ob.name !== 'reference' && !c.gpuProfiles.includes(profile)) continue;
        if (n > b.capabilities.maxSequence) {
          result.skipped.push({ backend: ob.name, profile, n, reason: `n exceeds maxSequence ${b.capabilities.maxSequence}` });
          continue;
        }
        try {
          const r = await withTimeout(
            evaluatePolicies(b, sc, host, [crisp, crispFast, flexPrefill], c.rows, accuracyDtype(ob)),
            600_000,
            `accuracy ${ob.name} ${profile} n=${n}`,
          );
          for (const m of r.metrics) result.rows.push({ backend: ob.name, profile, n, ...m });
          result.routing.push({ backend: ob.name, profile, n, ...r.routing });
          ctx.log(
            `  accuracy ${ob.name} ${profile} n=${n}: ${r.metrics.map((m) => `${m.policy} recall ${m.massRecall.toFixed(3)} err ${m.outputError.toFixed(3)} needles ${m.needleRecall.toFixed(2)} density ${m.density.toFixed(3)}`).join('; ')}; C_struct~JSD ${r.routing.cStructVsJsd.toFixed(2)}`,
          );
        } catch (e) {
          result.skipped.push({ backend: ob.name, profile, n, reason: message(e) });
          ctx.log(`  accuracy ${ob.name} ${profile} n=${n}: failed (${message(e)})`);
        }
      }
    }
  }
  return result;
}
