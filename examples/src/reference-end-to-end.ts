/**
 * Example (a): the reference backend end to end. A seeded @crisp/synth scenario (llama-like:
 * sink, local window, slash lines, a diffuse head or two) goes onto the float64 reference
 * backend, `sparsePrefill` plans and runs it with the `crisp` preset, and the per-head routes
 * and the density of the chosen blocks are printed.
 *
 * Run: pnpm --filter @crisp/examples example reference-end-to-end
 */
import { sparsePrefill } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { createReferenceBackend } from '@crisp/reference';
import { scenario, uploadScenario } from '@crisp/synth';

export interface EndToEndResult {
  readonly heads: number;
  readonly routes: readonly ('vs' | 'pe')[];
  readonly density: number;
  readonly outputShape: readonly number[];
  readonly finiteOutput: boolean;
}

export async function main(log: (line: string) => void = console.log): Promise<EndToEndResult> {
  // n must exceed the preset's dense cut-off (max(2B, kMin) = 1024 tokens) to plan sparsely.
  const sc = scenario('llama-like', { n: 2048, heads: 8, kvHeads: 2, headDim: 32, dtype: 'f32', seed: 1 });
  const backend = createReferenceBackend();
  try {
    const { q, k, v } = await uploadScenario(backend, sc);
    const { output, plan, timings } = await sparsePrefill(backend, { q, k, v }, crisp);
    const routes = plan.routing?.routes ?? [];
    const out = await backend.download(output);
    log(`routes: ${routes.join(' ')} (C_struct ${Array.from(plan.routing?.scores ?? [], (s) => s.toFixed(2)).join(' ')})`);
    log(`density: ${plan.overallDensity.toFixed(3)} of the causal blocks, in ${timings.totalMs.toFixed(0)} ms`);
    return {
      heads: sc.heads,
      routes,
      density: plan.overallDensity,
      outputShape: out.shape,
      finiteOutput: out.data.every((x) => Number.isFinite(x)),
    };
  } finally {
    backend.dispose();
  }
}
