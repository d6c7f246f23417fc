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
import { checkOptions, InvalidArgumentError, type ProxyStats, type Route, type Router, type RoutingDecision, ShapeError } from '@crisp/core';
import { checkRange, checkStats } from './stats-check.js';

export interface JsdOptions {
  /** τ: heads with D < τ go to PE. Default 0.1 (FlexPrefill's). 0 < τ < sqrt(ln 2). */
  readonly tau?: number;
}

export interface JsdRouter extends Router {
  readonly tau: number;
}

/** x · ln(x / m) with the 0 · ln 0 = 0 convention; m >= x/2 > 0 whenever x > 0. */
function klTerm(x: number, m: number): number {
  return x > 0 ? x * Math.log(x / m) : 0;
}

/**
 * Jensen-Shannon distance D between two distributions over the same support (natural logs).
 * Inputs are renormalised to sum 1 first, so float32 rounding in either does not bias D.
 * NaN when either has a negative entry or no positive mass.
 */
export function jsDistance(p: ArrayLike<number>, q: ArrayLike<number>): number {
  if (!p || !q || typeof p.length !== 'number' || p.length !== q.length) {
    throw new ShapeError(`jsDistance needs two distributions of the same length; got lengths ${p?.length} and ${q?.length}`);
  }
  let sp = 0;
  let sq = 0;
  for (let i = 0; i < p.length; i++) {
    sp += p[i];
    sq += q[i];
  }
  if (!(sp > 0) || !(sq > 0)) return Number.NaN;
  for (let i = 0; i < p.length; i++) if (p[i] < 0 || q[i] < 0) return Number.NaN;
  let kp = 0;
  let kq = 0;
  for (let i = 0; i < p.length; i++) {
    const a = p[i] / sp;
    const b = q[i] / sq;
    const m = 0.5 * (a + b);
    kp += klTerm(a, m);
    kq += klTerm(b, m);
  }
  // Rounding can push the sum a hair below 0 when p == q.
  return Math.sqrt(Math.max(0, 0.5 * kp + 0.5 * kq));
}

/** JSD router (FlexPrefill): 'pe' iff D(ā, â) < τ, else 'vs'. */
export function jsd(options?: JsdOptions): JsdRouter {
  const opts: JsdOptions = checkOptions(options, 'jsd', ['tau']);
  const tau = checkRange(opts.tau ?? 0.1, 'tau', 0, Math.sqrt(Math.LN2), 'in (0, sqrt(ln 2) ≈ 0.833) (FlexPrefill uses 0.1)');
  const name = 'jsd';
  return Object.freeze({
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
  });
}

