/**
 * The plan made on the host: the router and the VS selector in TypeScript over the proxy
 * statistics' Nb-length arrays, the PE heads' rows from the backend's `peBlockRows`, the
 * mask and its density counted here. What every backend without a device planner runs, and
 * what a device plan must equal.
 */
import type { AttentionShape } from '../attention.js';
import type { PeRowsOptions } from '../backend.js';
import { CrispError, InvalidArgumentError, MaskError, NonFiniteError, describeValue, isCrispError } from '../errors.js';
import {
  assertIndexList,
  type BlockMask,
  type BlockRows,
  countValidated,
  densityFromCounts,
  packVsLists,
  spreadRowPtr,
  validateMask,
  type VsLists,
} from '../mask.js';
import type { DirectionScores, Policy, Route, Router, RoutingDecision, VsSelector } from '../policy.js';
import { topKIndices, unionSorted } from '../ranking.js';
import { assertFiniteStats, headSlice, type ProxyStats } from '../stats.js';
import { proxyRecallOf, type SelectHead, topUpVsLists } from './proxy-recall.js';
import type { PrefillPlan } from './types.js';

/**
 * A user router's or selector's throw, wrapped: a CrispError it threw passes unchanged (it
 * already says what is wrong); anything else becomes INVALID_ARGUMENT naming the part, with
 * the original as `cause`.
 */
function wrapThrown(e: unknown, part: string): CrispError {
  if (isCrispError(e)) return e;
  const what = e instanceof Error ? `${e.name}: ${e.message}` : describeValue(e);
  return new CrispError('INVALID_ARGUMENT', `${part} threw ${what}; fix it (the error is this one's cause)`, { part }, { cause: e });
}

function isThenable(x: unknown): boolean {
  return typeof x === 'object' && x !== null && typeof (x as { then?: unknown }).then === 'function';
}

/**
 * Run a router and check what it returned (the Router contract in policy.ts): a RoutingDecision
 * with one route per head, each 'vs' or 'pe'; scores of length H, all finite; a string
 * scoreName; a finite threshold if any. Returns a copy, so a router that keeps and changes
 * its arrays later does not change the plan. Routers made of routers (anyPe) check their parts
 * with it.
 */
export function checkedRouting(router: Router, stats: ProxyStats, H: number): RoutingDecision {
  const part = `router ${router.name}`;
  let d: unknown;
  try {
    d = router.route(stats);
  } catch (e) {
    throw wrapThrown(e, part);
  }
  if (isThenable(d)) {
    throw new InvalidArgumentError(`${part} returned a Promise: routers must be synchronous (return the RoutingDecision itself)`);
  }
  if (!d || typeof d !== 'object') {
    throw new InvalidArgumentError(`${part} returned ${describeValue(d)}; route(stats) must return { routes, scores, scoreName }`);
  }
  const { routes, scores, scoreName, threshold } = d as Partial<RoutingDecision>;
  if (!Array.isArray(routes) || routes.length !== H) {
    throw new InvalidArgumentError(`${part} returned ${Array.isArray(routes) ? routes.length : describeValue(routes)} routes for ${H} heads; return an array of ${H} 'vs' / 'pe'`);
  }
  for (let h = 0; h < H; h++) {
    if (routes[h] !== 'vs' && routes[h] !== 'pe') {
      throw new InvalidArgumentError(`${part}: route of head ${h} is ${describeValue(routes[h])}; each route must be 'vs' or 'pe'`, { head: h });
    }
  }
  const numeric = ArrayBuffer.isView(scores) ? !(scores instanceof DataView || scores instanceof BigInt64Array || scores instanceof BigUint64Array) : Array.isArray(scores);
  if (!numeric || (scores as ArrayLike<unknown>).length !== H) {
    throw new InvalidArgumentError(`${part}: scores must hold ${H} numbers (one per head, what each route was decided on); got ${describeValue(scores)}`);
  }
  const copy = new Float64Array(H);
  for (let h = 0; h < H; h++) {
    const x = (scores as ArrayLike<unknown>)[h];
    if (typeof x !== 'number') throw new InvalidArgumentError(`${part}: scores[${h}] is ${describeValue(x)}, not a number`, { head: h });
    if (!Number.isFinite(x)) {
      throw new NonFiniteError(`${part}: scores[${h}] is ${x}; a router's scores must be finite (a NaN score usually means it read a statistic it should check)`, { head: h });
    }
    copy[h] = x;
  }
  if (typeof scoreName !== 'string') throw new InvalidArgumentError(`${part}: scoreName must be a string (what the scores are, for reports); got ${describeValue(scoreName)}`);
  if (threshold !== undefined && !(typeof threshold === 'number' && Number.isFinite(threshold))) {
    throw new InvalidArgumentError(`${part}: threshold must be a finite number or left out; got ${describeValue(threshold)}`);
  }
  return threshold === undefined ? { routes: [...routes], scores: copy, scoreName } : { routes: [...routes], scores: copy, scoreName, threshold };
}

/** The policy's router on the host, its H routes checked, and the PE heads ascending. */
export function routeOnHost(policy: Policy, stats: ProxyStats, H: number): { routing: RoutingDecision; peHeads: number[] } {
  const routing = checkedRouting(policy.router!, stats, H);
  const peHeads: number[] = [];
  for (let h = 0; h < H; h++) if (routing.routes[h] === 'pe') peHeads.push(h);
  return { routing, peHeads };
}

/**
 * Run a VS selector on one direction and check what it returned (the VsSelector contract in
 * policy.ts): an array or typed array of integer block indices in [0, Nb), checked before any
 * copy into an Int32Array could coerce them; any order, duplicates allowed (the lists are
 * sorted and deduplicated afterwards).
 */
function checkedSelect(selector: VsSelector, input: DirectionScores, Nb: number): ArrayLike<number> {
  const part = `selector ${selector.name}`;
  let list: unknown;
  try {
    list = selector.select(input);
  } catch (e) {
    throw wrapThrown(e, part);
  }
  if (isThenable(list)) {
    throw new InvalidArgumentError(`${part} returned a Promise: selectors must be synchronous (return the Int32Array of block indices itself)`);
  }
  if (!Array.isArray(list) && !(ArrayBuffer.isView(list) && !(list instanceof DataView))) {
    throw new InvalidArgumentError(`${part} returned ${describeValue(list)} for head ${input.head} (${input.direction}); select() must return an Int32Array of block indices`);
  }
  assertIndexList(list, `${part}: head ${input.head} ${input.direction}`, Nb);
  return list;
}

/** The policy's VS selector run on one head of `stats` (both directions, each list checked). */
export function headSelector(stats: ProxyStats, selector: VsSelector): SelectHead {
  const { numBlocks: Nb, blockSize: B, n } = stats;
  return (h) => {
    const select = (direction: 'vertical' | 'slash', blockScores: Float64Array, tokens?: Float32Array) =>
      checkedSelect(selector, { head: h, blockSize: B, n, direction, blockScores, tokenScores: tokens ? headSlice(tokens, h, n) : undefined }, Nb);
    return {
      vertical: select('vertical', headSlice(stats.verticalBlocks, h, Nb), stats.verticalTokens),
      slash: select('slash', headSlice(stats.slashBlocks, h, Nb), stats.slashTokens),
    };
  };
}

/** The VS lists PE heads keep beside their peK best (selectVsLists; the Policy fields of the same names). */
export interface PeListOptions {
  /** Policy.peWithVs: PE heads keep a VS selector's lists too (default false) */
  readonly withVs?: boolean;
  /** Policy.peVs: the selector of those lists (default: the VS heads' selector) */
  readonly selector?: VsSelector;
  /**
   * Policy.peVsExcess: of those lists only the vertical blocks J with p_v[J] > excess · ā[J]
   * (ā the statistics' pooled estimate, which must have been computed), and no slash list
   * beyond the peK best
   */
  readonly excess?: number;
  /** Policy.peVsFullAnchor: heads whose C_struct lies in [from, below) keep the full lists all the same */
  readonly fullAnchor?: { readonly from: number; readonly below: number };
}

/** A policy's PE list fields as selectVsLists' options. */
export function peListOptions(policy: Policy): PeListOptions {
  return { withVs: policy.peWithVs === true, selector: policy.peVs, excess: policy.peVsExcess, fullAnchor: policy.peVsFullAnchor };
}

/**
 * A plan's VS lists selected on the host: VS heads by `selector` over their block scores (and
 * token scores, when the statistics hold them), PE heads the `peK` best blocks of each
 * direction ∪ {0} (FlexPrefill gives PE heads the kMin best vertical and slash blocks too, and
 * forces key block 0, the sink, and offset 0, the diagonal, among them: a pooled map's mean
 * key dilutes the sink token, so its γ cut alone can miss that column); `pe` (PeListOptions,
 * the policy's fields through `peListOptions`) adds lists of a VS selector to PE heads. What
 * the host plan runs, and what a device planner's selection must equal.
 *
 * What the selector returns is checked (integers in [0, Nb); MaskError otherwise), and every
 * VS head must keep key block 0 in its vertical list or offset 0 in its slash list: without
 * either, query blocks below the smallest selected index attend to nothing (MaskError naming
 * the head and the selector).
 */
export function selectVsLists(
  stats: ProxyStats,
  routes: readonly Route[],
  selector: VsSelector,
  peK: number,
  pe: PeListOptions = {},
): VsLists {
  const { heads: H, numBlocks: Nb } = stats;
  const { withVs = false, excess: peExcess, fullAnchor } = pe;
  const selectHead = headSelector(stats, selector);
  const selectPeHead = pe.selector === undefined || pe.selector === selector ? selectHead : headSelector(stats, pe.selector);
  const vertical: ArrayLike<number>[] = [];
  const slash: ArrayLike<number>[] = [];
  for (let h = 0; h < H; h++) {
    if (routes[h] === 'pe') {
      const pv = headSlice(stats.verticalBlocks, h, Nb);
      const v = unionSorted(topKIndices(pv, peK), [0]);
      const s = unionSorted(topKIndices(headSlice(stats.slashBlocks, h, Nb), peK), [0]);
      const both = withVs ? selectPeHead(h) : undefined;
      const c = stats.cStruct[h];
      const full = fullAnchor !== undefined && c >= fullAnchor.from && c < fullAnchor.below;
      if (both && peExcess !== undefined && !full) {
        // only the blocks the pooled map under-reads: what its rows cannot bring back
        const pa = headSlice(stats.pooledEstimate, h, Nb);
        vertical.push(unionSorted(v, Array.from(both.vertical).filter((J) => pv[J] > peExcess * pa[J])));
        slash.push(s);
        continue;
      }
      vertical.push(both ? unionSorted(v, both.vertical) : v);
      slash.push(both ? unionSorted(s, both.slash) : s);
      continue;
    }
    const { vertical: v, slash: s } = selectHead(h);
    if (!hasZero(v) && !hasZero(s)) {
      const lo = Math.min(minOf(v), minOf(s));
      throw new MaskError(
        `selector ${selector.name}: head ${h} keeps neither key block 0 (vertical) nor offset 0 (the diagonal, slash), so query blocks 0 to ${Math.min(lo, Nb) - 1} would attend to nothing; always keep block 0 in one direction (the built-in selectors keep both)`,
        { head: h, selector: selector.name },
      );
    }
    vertical.push(v);
    slash.push(s);
  }
  return packVsLists(vertical, slash);
}

function hasZero(a: ArrayLike<number>): boolean {
  for (let i = 0; i < a.length; i++) if (a[i] === 0) return true;
  return false;
}

function minOf(a: ArrayLike<number>): number {
  let m = Number.POSITIVE_INFINITY;
  for (let i = 0; i < a.length; i++) if (a[i] < m) m = a[i];
  return m;
}

/** Place rows built for a subset of heads into an all-heads row set (other heads empty). */
export function spreadRows(sub: BlockRows, heads: readonly number[], H: number, Nb: number): BlockRows {
  return { rowPtr: spreadRowPtr(sub.rowPtr, heads, H, Nb), cols: sub.cols };
}

export interface HostPlanContext {
  readonly t0: number;
  readonly shape: AttentionShape;
  readonly B: number;
  readonly Nb: number;
  readonly peK: number;
  readonly stats: ProxyStats;
  readonly scale: number | undefined;
}

/**
 * The per-head check of a finished mask (proxy-recall.ts), and the recall guard when the
 * policy has one: the plan's proxy recall, and the mask after the guard.
 */
export function checkRecall(
  mask: BlockMask,
  policy: Policy,
  stats: ProxyStats,
): { mask: BlockMask; proxyRecall: Float64Array; guardAdded?: Int32Array } {
  const recall = proxyRecallOf(mask, stats);
  if (policy.recallTarget === undefined) return { mask, proxyRecall: recall };
  const up = topUpVsLists(mask, stats, recall, policy.recallTarget);
  return { mask: { ...mask, vs: up.vs }, proxyRecall: up.recall, guardAdded: up.added };
}

/**
 * Route, select, build the PE rows and the mask on the host: a complete plan. `peRows` gives
 * the PE heads' rows (the backend's `peBlockRows` over q and k, or a sharded prefill's).
 */
export async function hostPlan(peRows: (opts: PeRowsOptions) => Promise<BlockRows>, policy: Policy, c: HostPlanContext): Promise<PrefillPlan> {
  const { t0, shape, B, Nb, peK, stats } = c;
  const H = shape.heads;
  assertFiniteStats(stats);
  const tStats = performance.now();
  const { routing, peHeads } = routeOnHost(policy, stats, H);
  const vs = selectVsLists(stats, routing.routes, policy.vs!, peK, peListOptions(policy));
  // Selectors may be user code: check what they returned. The PE rows come from the backend,
  // which validates masks itself when it runs them, so they are not scanned here (at 512k
  // they can hold tens of millions of entries).
  validateMask({ heads: H, numBlocks: Nb, blockSize: B, vs }, { heads: H, numBlocks: Nb, blockSize: B });
  const tSelect = performance.now();
  let rows: BlockRows | undefined;
  let tPe = tSelect;
  if (peHeads.length > 0) {
    const pe = await peRows({ blockSize: B, gamma: policy.pe!.gamma, heads: peHeads, scale: c.scale });
    tPe = performance.now();
    rows = spreadRows(pe, peHeads, H, Nb);
  }
  const checked = checkRecall({ heads: H, numBlocks: Nb, blockSize: B, vs, rows }, policy, stats);
  const mask = checked.mask;
  const { perHead, overall } = densityFromCounts(countValidated(mask), Nb);
  const tEnd = performance.now();
  return {
    policy: policy.name,
    shape,
    blockSize: B,
    numBlocks: Nb,
    stats,
    routing,
    mask,
    density: perHead,
    overallDensity: overall,
    proxyRecall: checked.proxyRecall,
    ...(checked.guardAdded ? { guardAdded: checked.guardAdded } : {}),
    planMs: tEnd - t0,
    phases: { statsMs: tStats - t0, selectMs: tSelect - tStats, peRowsMs: tPe - tSelect, maskMs: tEnd - tPe },
  };
}
