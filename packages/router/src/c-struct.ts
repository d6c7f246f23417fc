/**
 * CRISP's structural-mass router.
 *
 * C_struct = (1/b) Σ_i ( Σ_{j < w_sink} Â[i, j] + Σ_{j >= n - w_local} Â[i, j] ), the mass the
 * proxy rows Q̂ (the last b queries) put on the anchors: the architectural sink (first
 * w_sink tokens) and the local window (last w_local tokens). A concentrated (low-entropy)
 * head in a sink architecture puts its mass exactly there, so C_struct >= τ_proxy reads the
 * Vertical-Slash decision straight off Â, with no pooled matmul and no KL (the paper's
 * replacement of FlexPrefill's JSD router).
 */
import type { ProxyStats, Route, Router, RoutingDecision } from '@crisp/core';
import { checkOptions } from '@crisp/core';
import { checkPositiveInt, checkRange, checkStats } from './stats-check.js';

export interface CStructOptions {
  /** τ_proxy: heads with C_struct >= τ_proxy go to VS. Default 0.2 (the paper's). 0 < τ_proxy < 1. */
  readonly tauProxy?: number;
  /** w_sink: tokens counted as the sink. Default 128. */
  readonly wSink?: number;
  /** w_local: tokens counted as the local window. Default 128. */
  readonly wLocal?: number;
}

export interface CStructRouter extends Router {
  readonly tauProxy: number;
  readonly wSink: number;
  readonly wLocal: number;
}

/**
 * C_struct router: 'vs' iff C_struct >= τ_proxy, else 'pe'.
 *
 * The windows travel to the backend through `needs.wSink` / `needs.wLocal`: the pipeline
 * computes proxy statistics with this router's windows (a policy-level `wSink`/`wLocal`
 * that disagrees is an error there, not silently ignored). It reads C_struct alone, so
 * `needs.optionalStats` is empty: backends may skip the entropy and the pooled estimate.
 */
export function cStruct(options?: CStructOptions): CStructRouter {
  const opts: CStructOptions = checkOptions(options, 'cStruct', ['tauProxy', 'wSink', 'wLocal']);
  const tauProxy = checkRange(opts.tauProxy ?? 0.2, 'tauProxy', 0, 1, 'in (0, 1) (the paper uses 0.2)');
  const wSink = checkPositiveInt(opts.wSink ?? 128, 'wSink');
  const wLocal = checkPositiveInt(opts.wLocal ?? 128, 'wLocal');
  const name = 'cStruct';
  const router = {
    name,
    tauProxy,
    wSink,
    wLocal,
    needs: Object.freeze({ wSink, wLocal, optionalStats: Object.freeze([]) }),
    route(stats: ProxyStats): RoutingDecision {
      checkStats(stats, name, ['cStruct']);
      const scores = Float64Array.from(stats.cStruct);
      const routes: Route[] = Array.from(scores, (c) => (c >= tauProxy ? 'vs' : 'pe'));
      return { routes, scores, scoreName: 'C_struct', threshold: tauProxy };
    },
  };
  // The same rule for backends that route on the device (@crisp/core DeviceRouterRule). Not
  // enumerable, so `{ ...cStruct(), route: mine }` does not carry it: a router with its own
  // route() must not be replaced by this rule on the device.
  Object.defineProperty(router, 'device', { value: Object.freeze({ kind: 'cStruct' as const, tauProxy }), enumerable: false });
  return Object.freeze(router) as CStructRouter;
}
