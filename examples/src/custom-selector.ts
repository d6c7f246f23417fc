/**
 * Example (c): a VS selector of your own. A `VsSelector` (from @crisp/core) is called once
 * per Vertical-Slash head and direction with that direction's block scores, and returns the
 * block indices to keep. This one keeps a fixed budget: the k highest-scoring blocks (ties
 * toward the lower index), plus block 0, which the contract asks every head to keep in one
 * direction (key block 0 holds the sink; offset 0 is the diagonal). Every head is sent to VS
 * (`fixed('vs')` from @crisp/router) so each one runs it.
 *
 * Run: pnpm --filter @crisp/examples example custom-selector
 */
import { type DirectionScores, type Policy, sparsePrefill, type VsSelector, vsHead } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { createReferenceBackend } from '@crisp/reference';
import { fixed } from '@crisp/router';
import { scenario, uploadScenario } from '@crisp/synth';

/** The k best blocks of each direction ∪ {0}, ascending. */
export function keepTopBlocks(k: number): VsSelector {
  return {
    name: `keep-top-${k}`,
    select({ blockScores }: DirectionScores): Int32Array {
      const order = Array.from(blockScores.keys()).sort((a, b) => blockScores[b] - blockScores[a] || a - b);
      const kept = new Set([0, ...order.slice(0, k)]);
      return Int32Array.from([...kept].sort((a, b) => a - b));
    },
  };
}

export interface CustomSelectorResult {
  readonly k: number;
  readonly numBlocks: number;
  /** per head, the kept vertical (key) and slash (offset) blocks */
  readonly vertical: readonly number[][];
  readonly slash: readonly number[][];
  /** per head, the proxy's vertical and slash block scores the selector saw */
  readonly verticalScores: readonly number[][];
  readonly slashScores: readonly number[][];
  readonly density: number;
}

export async function main(log: (line: string) => void = console.log): Promise<CustomSelectorResult> {
  const k = 4;
  // B = 64 and kMin = 128 tokens: 32 blocks at n = 2048, sparse above n = 128.
  const policy: Policy = { ...crisp, name: 'top-blocks', blockSize: 64, kMin: 128, router: fixed('vs'), vs: keepTopBlocks(k) };
  const sc = scenario('llama-like', { n: 2048, heads: 4, kvHeads: 2, headDim: 32, dtype: 'f32', seed: 2 });
  const backend = createReferenceBackend();
  try {
    const { q, k: keys, v } = await uploadScenario(backend, sc);
    const { plan } = await sparsePrefill(backend, { q, k: keys, v }, policy);
    const stats = plan.stats!;
    const Nb = plan.numBlocks;
    const heads = Array.from({ length: sc.heads }, (_, h) => vsHead(plan.mask!.vs!, h));
    const perHead = (a: Float64Array) => Array.from({ length: sc.heads }, (_, h) => Array.from(a.subarray(h * Nb, (h + 1) * Nb)));
    for (const [h, { vertical, slash }] of heads.entries()) {
      log(`head ${h}: key blocks [${vertical.join(', ')}], diagonal offsets [${slash.join(', ')}]`);
    }
    log(`density ${plan.overallDensity.toFixed(3)} of ${Nb} x ${Nb} causal blocks`);
    return {
      k,
      numBlocks: Nb,
      vertical: heads.map((x) => Array.from(x.vertical)),
      slash: heads.map((x) => Array.from(x.slash)),
      verticalScores: perHead(stats.verticalBlocks),
      slashScores: perHead(stats.slashBlocks),
      density: plan.overallDensity,
    };
  } finally {
    backend.dispose();
  }
}
