/**
 * Policy interfaces. Routers and selectors are plain objects over small host arrays, so
 * they are swappable and identical on every backend. A user policy is an object with the
 * same shape as the built-ins (see @crisp/router and @crisp/select).
 */
import type { OptionalStat, ProxyStats } from './stats.js';

export type Route = 'vs' | 'pe';

/** What a policy needs from proxyStats beyond the always-present block statistics. */
export interface StatsNeeds {
  /** token-level a_v / a_s (O(H n)); FlexPrefill's cumulative coverage reads them */
  readonly tokenScores?: boolean;
  /**
   * w_sink / w_local (tokens) the proxy statistics must use for C_struct. A router that reads
   * C_struct declares its own windows here; the pipeline prefers them over `Policy.wSink` /
   * `Policy.wLocal` and rejects a policy whose explicit windows disagree.
   */
  readonly wSink?: number;
  readonly wLocal?: number;
  /**
   * The optional statistics a router reads (ProxyStats' rowEntropy, pooledEstimate). When the
   * router declares them, the pipeline asks the backend for these only (ProxyStatsOptions'
   * optionalStats: the others are then computed only if someone reads them); undeclared, the
   * backend computes all of them.
   */
  readonly optionalStats?: readonly OptionalStat[];
}

export interface RoutingDecision {
  /** [H] per head: 'vs' (Vertical-Slash) or 'pe' (pooled estimation) */
  readonly routes: Route[];
  /** [H] the score each decision was taken on (C_struct, JSD distance, entropy, ...) */
  readonly scores: Float64Array;
  /** what `scores` holds, for reports */
  readonly scoreName: string;
  /** the threshold the scores were compared with, if any */
  readonly threshold?: number;
}

/**
 * A routing rule in a form a backend can run on the device (where C_struct is): the plan
 * then routes, selects and builds the mask in one queue of device work, with no read in
 * between (`Backend.planner`). Only rules whose device form gives exactly `route`'s
 * decisions (the same f64 comparison); the pipeline re-routes on the host afterwards and
 * rejects a backend whose routes differ.
 *   cStruct: 'vs' iff C_struct >= tauProxy.
 */
export interface DeviceRouterRule {
  readonly kind: 'cStruct';
  readonly tauProxy: number;
}

export interface Router {
  readonly name: string;
  readonly needs?: StatsNeeds;
  route(stats: ProxyStats): RoutingDecision;
  /**
   * The same rule for backends that route on the device (`DevicePlanner.routers`); absent for
   * rules that only run here. `route` stays the reference. Built-in routers define it
   * non-enumerable, so a router spread from one with its own `route` does not inherit it.
   */
  readonly device?: DeviceRouterRule;
}

/** One direction of one head, handed to a VS selector. */
export interface DirectionScores {
  readonly direction: 'vertical' | 'slash';
  readonly head: number;
  /** p_v (by key block) or p_s (by offset block, 0 = diagonal); length Nb */
  readonly blockScores: Float64Array;
  /** a_v or a_s (by offset) token scores, length n; present when the selector's needs ask */
  readonly tokenScores?: Float32Array;
  readonly blockSize: number;
  readonly n: number;
}

/**
 * A selector rule in a form a backend can run on the device (where the block scores are):
 * the plan then reads back only the selected lists instead of selecting over H·Nb scores on
 * the host. Only rules whose device form gives exactly `select`'s lists (same f64 arithmetic,
 * same tie order); the conformance suite checks that on every backend that offers it.
 *   noiseFloor: keep {J : p[J] > α · μ} ∪ {0, Nb − 1} (the kMin / B best when fewer pass).
 */
export interface DeviceSelectorRule {
  readonly kind: 'noiseFloor';
  readonly alpha: number;
  /** tokens, a multiple of B */
  readonly kMin: number;
}

export interface VsSelector {
  readonly name: string;
  readonly needs?: StatsNeeds;
  /** Selected block indices, ascending. Must be deterministic: ties toward the lower index. */
  select(input: DirectionScores): Int32Array;
  /**
   * The same rule for backends that select on the device (`DevicePlanner.selectors`); absent
   * for rules that only run here. `select` stays the reference and the fallback. The built-in
   * selectors define it non-enumerable, so a selector spread from one with its own `select`
   * does not inherit it (set `device` yourself only if your `select` is that exact rule).
   */
  readonly device?: DeviceSelectorRule;
}

/** PE heads: the backend's pooled map with a γ coverage cut, plus the kMin best VS blocks. */
export interface PeSelector {
  readonly name: string;
  /** γ */
  readonly gamma: number;
  /** tokens per direction of best vertical and slash blocks also given to PE heads (FlexPrefill) */
  readonly kMin: number;
}

export interface Policy {
  readonly name: string;
  /** run dense attention for every head (the `dense` preset) */
  readonly dense?: boolean;
  readonly router?: Router;
  readonly vs?: VsSelector;
  readonly pe?: PeSelector;
  /** B, default 128 */
  readonly blockSize?: number;
  /** sink / local window for C_struct, default 128 tokens each */
  readonly wSink?: number;
  readonly wLocal?: number;
  /** tokens per direction that keep a head from going below the FlexPrefill minimum (default 1024) */
  readonly kMin?: number;
}

/** Every head dense; the pipeline runs end to end with no policy packages at all. */
export const densePolicy: Policy = Object.freeze({ name: 'dense', dense: true });
