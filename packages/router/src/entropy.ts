/**
 * Entropy router (the paper's appendix B, as a routing rule of its own).
 *
 * A proxy row's attention entropy H(â_i) = -Σ_j Â[i,j] ln Â[i,j]; the head's H is the mean
 * over the proxy rows (`stats.rowEntropy`). exp(H) is the effective support size
 * (Campbell 1966): about 1 when one token takes all the mass, n when the row is uniform. A
 * head whose effective support is small is served by a few structural blocks (VS); one
 * whose support spans a power of n close to 1 needs broad coverage (PE).
 *
 * The rule compares the support on a log scale with n, so it does not drift with length:
 *
 *   η = ln exp(H) / ln n = H / ln n ∈ [0, 1],   VS iff η <= η_max.
 *
 * Why η_max = 0.8 by default: a head that puts mass c on an anchor and spreads 1 - c evenly
 * over the rest has H ≈ (1 - c) ln n + h(c), so η ≈ 1 - c at long n. η_max = 0.8 is then the
 * same cut as C_struct >= τ_proxy = 0.2 on such heads; unlike C_struct it does not assume
 * the concentrated mass sits on the sink or local window (a sink-free architecture still
 * routes by it), which is the paper's stated weakness of C_struct.
 */
import type { ProxyStats, Route, Router, RoutingDecision } from '@crisp/core';
import { checkOptions } from '@crisp/core';
import { checkRange, checkStats } from './stats-check.js';

export interface EntropyOptions {
  /** η_max: VS iff exp(H) <= n^η_max (H / ln n <= η_max). Default 0.8. 0 < η_max < 1. */
  readonly maxSupportExponent?: number;
}

export interface EntropyRouter extends Router {
  readonly maxSupportExponent: number;
}

/** Entropy router: score η = H / ln n (the effective support exp(H) as a power of n); VS iff η <= η_max. */
export function entropy(options?: EntropyOptions): EntropyRouter {
  const opts: EntropyOptions = checkOptions(options, 'entropy', ['maxSupportExponent']);
  const maxSupportExponent = checkRange(
    opts.maxSupportExponent ?? 0.8,
    'maxSupportExponent',
    0,
    1,
    'in (0, 1): the largest effective support exp(H), as a power of n, still routed to VS',
  );
  const name = 'entropy';
  return Object.freeze({
    name,
    maxSupportExponent,
    needs: Object.freeze({ optionalStats: Object.freeze(['rowEntropy'] as const) }),
    route(stats: ProxyStats): RoutingDecision {
      checkStats(stats, name, ['rowEntropy']);
      const logN = Math.log(stats.n);
      const scores = Float64Array.from(stats.rowEntropy, (h) => (logN > 0 ? Math.max(0, h) / logN : 0));
      const routes: Route[] = Array.from(scores, (s) => (s <= maxSupportExponent ? 'vs' : 'pe'));
      return { routes, scores, scoreName: 'H / ln n (effective support exp(H) as a power of n)', threshold: maxSupportExponent };
    },
  });
}
