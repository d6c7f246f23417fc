/**
 * The residual JSD router: does the pooled estimate explain the mass the proxy rows put away
 * from the anchors?
 *
 * FlexPrefill's JSD compares the pooled estimate ā with p_v over every key block. On a head
 * with a sink, ā (one mean key per block) dilutes the sink token, so D is large and the head
 * goes to VS whatever the rest of its map looks like. A head with a real sink whose other
 * mass is content-driven (each region of queries reading its own earlier passage) passes
 * C_struct, goes to VS, and its VS lists, taken from the last queries, miss what the earlier
 * queries read; the pooled map serves it. This router looks only at the residual: the blocks
 * between the first and the last (Nb − 2 of them), where
 *
 *   r = 1 − p_v[0] − p_v[Nb−1]                          the residual mass
 *   D_res = JSD(ā[1..Nb−2], p_v[1..Nb−2])              both renormalised
 *
 * PE iff r >= minResidual and D_res < τ: enough of the head's mass is off the anchors and
 * pooling reproduces it. Needles, stripes and diagonals are sub-block structure that pooling
 * blurs (D_res large), so those heads stay VS. Meant to be combined with cStruct through anyPe
 * (the crispGuarded preset); alone it sends sink-free diffuse heads to VS when their residual
 * is not pooled-smooth.
 */
import { checkOptions, InvalidArgumentError, type ProxyStats, residualDistance, type Route, type Router, type RoutingDecision } from '@crisp/core';
import { checkRange, checkStats } from './stats-check.js';

export interface ResidualJsdOptions {
  /** τ: PE when the residual JSD distance is below it. Default 0.1. 0 < τ < sqrt(ln 2). */
  readonly tau?: number;
  /** the residual mass (off the first and last key blocks) a PE head must have. Default 0.3. 0 <= r < 1. */
  readonly minResidual?: number;
}

export interface ResidualJsdRouter extends Router {
  readonly tau: number;
  readonly minResidual: number;
}

/** PE iff 1 − p_v[0] − p_v[Nb−1] >= minResidual and JSD(ā, p_v) over blocks 1..Nb−2 < τ. */
export function residualJsd(options?: ResidualJsdOptions): ResidualJsdRouter {
  const opts: ResidualJsdOptions = checkOptions(options, 'residualJsd', ['tau', 'minResidual']);
  const tau = checkRange(opts.tau ?? 0.1, 'tau', 0, Math.sqrt(Math.LN2), 'in (0, sqrt(ln 2) ≈ 0.833)');
  const minResidual = opts.minResidual ?? 0.3;
  if (typeof minResidual !== 'number' || !(minResidual >= 0 && minResidual < 1)) {
    throw new InvalidArgumentError(`residualJsd: minResidual must be a number in [0, 1); got ${String(minResidual)}`);
  }
  const name = 'residualJsd';
  const router: ResidualJsdRouter = {
    name,
    tau,
    minResidual,
    needs: Object.freeze({ optionalStats: Object.freeze(['pooledEstimate'] as const) }),
    route(stats: ProxyStats): RoutingDecision {
      checkStats(stats, name, ['verticalBlocks', 'pooledEstimate']);
      const H = stats.heads;
      const Nb = stats.numBlocks;
      const scores = new Float64Array(H);
      const routes: Route[] = [];
      for (let h = 0; h < H; h++) {
        const pv = stats.verticalBlocks.subarray(h * Nb, (h + 1) * Nb);
        const pa = stats.pooledEstimate.subarray(h * Nb, (h + 1) * Nb);
        const { residual, distance } = residualDistance(pv, pa);
        scores[h] = distance;
        routes.push(residual >= minResidual && distance < tau ? 'pe' : 'vs');
      }
      return { routes, scores, scoreName: 'residual JSD distance', threshold: tau };
    },
  };
  // The same rule for backends that route on the device (@crisp/core DeviceRouterRule);
  // non-enumerable, like cStruct's, so a router spread from this one with its own route()
  // does not inherit it.
  Object.defineProperty(router, 'device', { value: Object.freeze({ kind: 'residualJsd' as const, tau, minResidual }), enumerable: false });
  return Object.freeze(router);
}
