/**
 * Policy interfaces. Routers and selectors are plain objects over small host arrays, so
 * they are swappable and identical on every backend. A user policy is an object with the
 * same shape as the built-ins (see @crisp/router and @crisp/select).
 *
 * The pipeline checks a policy before any work (its fields, below) and checks what its
 * router and selector return each time they run; every failure is a CrispError naming the
 * policy, router or selector:
 *  - a router or selector that throws: INVALID_ARGUMENT with its name and its error as
 *    `cause` (a CrispError it throws passes unchanged);
 *  - one that returns a Promise: INVALID_ARGUMENT (they must be synchronous);
 *  - the Router and VsSelector contracts below: INVALID_ARGUMENT, NON_FINITE or INVALID_MASK
 *    as stated there.
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
 * A routing rule in a form a backend can run on the device (where the statistics are): the
 * plan then routes, selects and builds the mask in one queue of device work, with no read in
 * between (`Backend.planner`). Only rules whose device form gives `route`'s decisions; the
 * pipeline re-routes on the host afterwards and rejects a backend whose routes differ
 * (see `deviceRouteMargin` for the one tolerance).
 *   cStruct:     'vs' iff C_struct >= tauProxy (the same f64 comparison on both sides).
 *   residualJsd: 'pe' iff r = 1 − p_v[0] − p_v[Nb−1] >= minResidual and the JS distance
 *                between the pooled estimate and p_v over blocks 1..Nb−2 is < tau.
 *   jsd:         'pe' iff the JS distance between the pooled estimate and p_v over every
 *                block is < tau (FlexPrefill's router).
 *   anyPe:       'pe' iff any of `rules` routes the head to PE.
 */
export type DeviceRouterRule = DeviceCStructRule | DeviceResidualJsdRule | DeviceJsdRule | DeviceAnyPeRule;

export interface DeviceCStructRule {
  readonly kind: 'cStruct';
  readonly tauProxy: number;
}

export interface DeviceResidualJsdRule {
  readonly kind: 'residualJsd';
  readonly tau: number;
  readonly minResidual: number;
}

export interface DeviceJsdRule {
  readonly kind: 'jsd';
  readonly tau: number;
}

export interface DeviceAnyPeRule {
  readonly kind: 'anyPe';
  readonly rules: readonly DeviceRouterRule[];
}

/**
 * A routing rule. `route` must be synchronous and return a RoutingDecision with exactly H
 * routes, each 'vs' or 'pe' (anything else: INVALID_ARGUMENT, never read as VS), H scores
 * (an array or typed array of numbers; non-finite ones: NON_FINITE), a string `scoreName` and,
 * if present, a finite `threshold`. The plan keeps a copy of the decision.
 */
export interface Router {
  /** a non-empty name (errors and reports use it) */
  readonly name: string;
  /** what the statistics must hold; checked with the policy (types, positive integer windows) */
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
 *   noiseFloor:         keep {J : p[J] > α · μ} ∪ {0, Nb − 1} (the kMin / B best when fewer
 *                       pass).
 *   cumulativeCoverage: FlexPrefill's: the token scores' coverage count for γ, then block 0
 *                       and the best blocks up to max(kMin / B, count / B + 1) (reads the
 *                       token scores; offered for γ <= 0.99, where the device's count is
 *                       exact).
 */
export type DeviceSelectorRule = DeviceNoiseFloorRule | DeviceCoverageRule;

export interface DeviceNoiseFloorRule {
  readonly kind: 'noiseFloor';
  readonly alpha: number;
  /** tokens, a multiple of B */
  readonly kMin: number;
}

export interface DeviceCoverageRule {
  readonly kind: 'cumulativeCoverage';
  readonly gamma: number;
  /** tokens, a multiple of B */
  readonly kMin: number;
}

/**
 * A VS selection rule, run once per VS head and direction. `select` must be synchronous and
 * return an array or typed array of block indices: integers in [0, Nb) (NaN, fractions,
 * negatives, Nb or more, non-numbers: INVALID_MASK, checked before any copy to an Int32Array
 * could coerce them; a Set or anything else: INVALID_ARGUMENT). Any order and duplicates are
 * accepted: the lists are sorted and deduplicated. Each VS head must keep key block 0 in its
 * vertical list or offset 0 (the diagonal) in its slash list: without either, the query
 * blocks below the smallest selected index attend to nothing (INVALID_MASK naming the head and
 * the selector). A `kMin` property, when the selector has one, must be a multiple of the
 * policy's block size (INVALID_ARGUMENT before the statistics).
 */
export interface VsSelector {
  /** a non-empty name (errors and reports use it) */
  readonly name: string;
  readonly needs?: StatsNeeds;
  /** Selected block indices, ascending (see above). Must be deterministic: ties toward the lower index. */
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

/**
 * A policy. Checked before any statistic (INVALID_ARGUMENT naming the field): a non-empty
 * name; `dense` a boolean; `blockSize` one the backend lists; `kMin`, `wSink`, `wLocal`
 * positive integers; for sparse policies a router and a VS selector as above (with their
 * `needs` and any `device` rule well-typed) and a PE selector with 0 < gamma < 1 and a
 * positive integer kMin.
 */
export interface Policy {
  /** a non-empty name */
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
  /**
   * FlexPrefill's minimum length, in tokens (default 1024): a sequence with n <= max(2B, kMin
   * rounded up to B) runs dense (`denseReason: 'min-length'`). It does not change selection:
   * each head's minimum blocks come from the selectors' own `vs.kMin` and `pe.kMin`, so a
   * policy that changes the budget sets those (e.g. `noiseFloor({ alpha: 1, kMin: 256 })`).
   */
  readonly kMin?: number;
  /**
   * PE heads also keep the VS selector's lists (both directions) beside their PE rows: a
   * union of the two paths, so a needle the proxy rows see and the pooled map smooths away
   * stays selected. Default false (PE heads keep the kMin best blocks per direction, as in
   * FlexPrefill). Plans with it are made on the host unless the backend's planner runs it
   * (`DevicePlanner.peWithVs`).
   */
  readonly peWithVs?: boolean;
  /**
   * With `peWithVs`: the VS selector whose lists PE heads keep, when it is not `vs` (default:
   * `vs`). It lets the VS heads' selection and the PE heads' lists be tuned apart: e.g.
   * `noiseFloor({ alpha: 2 })` for VS heads (fewer blocks) and `noiseFloor({ alpha: 1 })` for
   * the lists that keep the PE heads' needles. A device planner runs it when both are the
   * noise floor with the same kMin (`DevicePlanner.peVs`); otherwise the plan is made on the host.
   */
  readonly peVs?: VsSelector;
  /**
   * With `peWithVs`, κ > 0: a PE head keeps only its VS selector's vertical blocks whose proxy
   * mass exceeds κ times the pooled estimate's, p_v[J] > κ · ā[J] (the needles its PE rows,
   * built from the same pooled map, under-read), and no slash list beyond its kMin best; a
   * diffuse head, which the pooled map already serves, then adds few blocks. Needs the pooled
   * estimate (it is computed for the plan). A device planner runs it beside the noise floor
   * (`DevicePlanner.peVsExcess`: CUDA's); otherwise the plan is made on the host.
   */
  readonly peVsExcess?: number;
  /**
   * With `peVsExcess`: the PE heads whose anchor mass C_struct lies in [from, below) keep the
   * full VS lists all the same (no narrowing). Those are the mixed heads hard routing fails
   * on: a real sink, but too little anchor mass for VS, and needles or stripes beside a
   * content-driven part the pooled map smooths; the lists the narrowing would drop carry
   * mass their PE rows miss. Heads below `from` (little anchor mass: diffuse) and at or above
   * `below` (sent to PE by another test, e.g. residualJsd: their mass off the anchors is
   * content-driven, which the pooled map reads) keep the narrowed lists. `below` is usually
   * the C_struct router's τ_proxy. Absent: every PE head is narrowed.
   */
  readonly peVsFullAnchor?: { readonly from: number; readonly below: number };
  /**
   * The recall guard, 0 < recallTarget <= 1: every head whose proxy recall (the proxy rows'
   * mass inside its last query-block row, `PrefillPlan.proxyRecall`) is below it gets the key
   * blocks of largest proxy mass that row lacks, as vertical blocks, until it reaches it.
   * Absent: no guard. Plans with a guard are made on the host.
   */
  readonly recallTarget?: number;
}

/** Every head dense; the pipeline runs end to end with no policy packages at all. */
export const densePolicy: Policy = Object.freeze({ name: 'dense', dense: true });
