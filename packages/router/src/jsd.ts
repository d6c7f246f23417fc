/**
 * FlexPrefill's Jensen-Shannon router.
 *
 * Per head, ā = softmax_J(mean_i(Q̂_i) · K̄_J · scale) (pool first, then softmax:
 * `stats.pooledEstimate`) against â = p_v (softmax first, then average over the proxy rows
 * and pool: `stats.verticalBlocks`), with m = (ā + â)/2 and natural logs:
 *
 *   D = sqrt( ½ KL(ā ‖ m) + ½ KL(â ‖ m) )   (0 <= D <= sqrt(ln 2) ≈ 0.833)
 *
 * D < τ: the cheap pooled estimate already agrees with the real map, so the head is
 * "query-aware" and goes to PE; D >= τ: the map has structure pooling blurs (a sink token
 * diluted by its block's mean key, per-query diagonals), so it goes to VS.
 */
import { checkOptions, InvalidArgumentError, jsDistance, type ProxyStats, type Route, type Router, type RoutingDecision } from '@crisp/core';
import { checkRange, checkStats } from './stats-check.js';

export interface JsdOptions {
  /** τ: heads with D < τ go to PE. Default 0.1 (FlexPrefill's). 0 < τ < sqrt(ln 2). */
  readonly tau?: number;
}

export interface JsdRouter extends Router {
  readonly tau: number;
}

export { jsDistance };

/** JSD router (FlexPrefill): 'pe' iff D(ā, â) < τ, else 'vs'. */
export function jsd(options?: JsdOptions): JsdRouter {
  const opts: JsdOptions = checkOptions(options, 'jsd', ['tau']);
  const tau = checkRange(opts.tau ?? 0.1, 'tau', 0, Math.sqrt(Math.LN2), 'in (0, sqrt(ln 2) ≈ 0.833) (FlexPrefill uses 0.1)');
  const name = 'jsd';
  const router: JsdRouter = {
    name,
    tau,
    needs: Object.freeze({ optionalStats: Object.freeze(['pooledEstimate'] as const) }),
    route(stats: ProxyStats): RoutingDecision {
      checkStats(stats, name, ['verticalBlocks', 'pooledEstimate']);
      const H = stats.heads;
      const Nb = stats.numBlocks;
      const scores = new Float64Array(H);
      const routes: Route[] = [];
      for (let h = 0; h < H; h++) {
        const d = jsDistance(
          stats.pooledEstimate.subarray(h * Nb, (h + 1) * Nb),
          stats.verticalBlocks.subarray(h * Nb, (h + 1) * Nb),
        );
        if (Number.isNaN(d)) {
          throw new InvalidArgumentError(
            `router jsd: head ${h}'s pooled estimate or vertical block scores are negative or sum to 0; pass the ProxyStats a backend's proxyStats() returned`,
            { head: h },
          );
        }
        scores[h] = d;
        routes.push(d < tau ? 'pe' : 'vs');
      }
      return { routes, scores, scoreName: 'JSD distance', threshold: tau };
    },
  };
  // The same rule for backends that route on the device (@crisp/core DeviceRouterRule);
  // non-enumerable, like cStruct's, so a router spread from this one with its own route()
  // does not inherit it.
  Object.defineProperty(router, 'device', { value: Object.freeze({ kind: 'jsd' as const, tau }), enumerable: false });
  return Object.freeze(router);
}

