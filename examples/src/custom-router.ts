/**
 * Example (b): a router of your own. A `Router` (from @crisp/core) is a plain object with a
 * name and a synchronous `route(stats)` that returns one route per head. This one routes by
 * a single statistic: the share of a head's proxy-row attention that lands on the first key
 * block (the attention sink). A head that leans on the sink is served by a few structural
 * blocks (Vertical-Slash); the others go to pooled estimation. It replaces the router of
 * the `crisp` preset, keeping its selectors.
 *
 * Run: pnpm --filter @crisp/examples example custom-router
 */
import { type Policy, type ProxyStats, type Route, type Router, type RoutingDecision, sparsePrefill } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { createReferenceBackend } from '@crisp/reference';
import { scenario, uploadScenario } from '@crisp/synth';

/** VS iff the first key block holds at least `minShare` of the head's vertical block mass. */
export function firstBlockRouter(minShare: number): Router {
  return {
    name: `first-block(>=${minShare})`,
    // Only the block statistics, which every backend always computes: skip the optional ones.
    needs: { optionalStats: [] },
    route(stats: ProxyStats): RoutingDecision {
      const scores = new Float64Array(stats.heads);
      for (let h = 0; h < stats.heads; h++) scores[h] = stats.verticalBlocks[h * stats.numBlocks];
      const routes: Route[] = Array.from(scores, (s) => (s >= minShare ? 'vs' : 'pe'));
      return { routes, scores, scoreName: 'first key block share', threshold: minShare };
    },
  };
}

export interface CustomRouterResult {
  readonly heads: number;
  readonly minShare: number;
  readonly routerName: string;
  readonly routes: readonly Route[];
  /** the first key block's share per head, read back from the plan's own statistics */
  readonly firstBlockShare: readonly number[];
  readonly density: number;
}

export async function main(log: (line: string) => void = console.log): Promise<CustomRouterResult> {
  const minShare = 0.8;
  const policy: Policy = { ...crisp, name: 'crisp-first-block', router: firstBlockRouter(minShare) };
  const sc = scenario('llama-like', { n: 2048, heads: 8, kvHeads: 2, headDim: 32, dtype: 'f32', seed: 1 });
  const backend = createReferenceBackend();
  try {
    const { q, k, v } = await uploadScenario(backend, sc);
    const { plan } = await sparsePrefill(backend, { q, k, v }, policy);
    const routing = plan.routing!;
    const stats = plan.stats!;
    const firstBlockShare = Array.from({ length: stats.heads }, (_, h) => stats.verticalBlocks[h * stats.numBlocks]);
    log(`${routing.scoreName}: ${firstBlockShare.map((s) => s.toFixed(2)).join(' ')}`);
    log(`routes (VS iff >= ${minShare}): ${routing.routes.join(' ')}; density ${plan.overallDensity.toFixed(3)}`);
    return {
      heads: sc.heads,
      minShare,
      routerName: policy.router!.name,
      routes: routing.routes,
      firstBlockShare,
      density: plan.overallDensity,
    };
  } finally {
    backend.dispose();
  }
}
