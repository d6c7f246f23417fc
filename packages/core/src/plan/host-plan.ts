/**
 * The plan made on the host: the router and the VS selector in TypeScript over the proxy
 * statistics' Nb-length arrays, the PE heads' rows from the backend's `peBlockRows`, the
 * mask and its density counted here. What every backend without a device planner runs, and
 * what a device plan must equal.
 */
import type { AttentionShape } from '../attention.js';
import type { Backend } from '../backend.js';
import { InvalidArgumentError } from '../errors.js';
import { type BlockMask, type BlockRows, maskDensity, spreadRowPtr, validateMask, vsListsFromArrays, type VsLists } from '../mask.js';
import type { Policy, Route, RoutingDecision, VsSelector } from '../policy.js';
import { topKIndices, unionSorted } from '../ranking.js';
import { assertFiniteStats, headSlice, type ProxyStats } from '../stats.js';
import type { DeviceTensor } from '../tensor.js';
import type { PrefillPlan } from './types.js';

/** The policy's router on the host, its H routes checked, and the PE heads ascending. */
export function routeOnHost(policy: Policy, stats: ProxyStats, H: number): { routing: RoutingDecision; peHeads: number[] } {
  const routing = policy.router!.route(stats);
  if (!routing || !Array.isArray(routing.routes) || routing.routes.length !== H) {
    throw new InvalidArgumentError(`router ${policy.router!.name} returned ${routing?.routes?.length} routes for ${H} heads`);
  }
  const peHeads: number[] = [];
  for (let h = 0; h < H; h++) if (routing.routes[h] === 'pe') peHeads.push(h);
  return { routing, peHeads };
}

/**
 * A plan's VS lists selected on the host: VS heads by `selector` over their block scores (and
 * token scores, when the statistics hold them), PE heads the `peK` best blocks of each
 * direction, ∪ {0} in the slash one (FlexPrefill gives PE heads the kMin best vertical and
 * slash blocks too, so every query block keeps at least its diagonal block). What the host
 * plan runs, and what a device planner's selection must equal.
 */
export function selectVsLists(stats: ProxyStats, routes: readonly Route[], selector: VsSelector, peK: number): VsLists {
  const { heads: H, numBlocks: Nb, blockSize: B, n } = stats;
  const vertical: Int32Array[] = [];
  const slash: Int32Array[] = [];
  for (let h = 0; h < H; h++) {
    const pv = headSlice(stats.verticalBlocks, h, Nb);
    const ps = headSlice(stats.slashBlocks, h, Nb);
    if (routes[h] === 'pe') {
      vertical.push(topKIndices(pv, peK));
      slash.push(unionSorted(topKIndices(ps, peK), [0]));
      continue;
    }
    const select = (direction: 'vertical' | 'slash', blockScores: Float64Array, tokens?: Float32Array) =>
      selector.select({ head: h, blockSize: B, n, direction, blockScores, tokenScores: tokens ? headSlice(tokens, h, n) : undefined });
    vertical.push(select('vertical', pv, stats.verticalTokens));
    slash.push(select('slash', ps, stats.slashTokens));
  }
  return vsListsFromArrays(vertical, slash);
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

/** Route, select, build the PE rows and the mask on the host: a complete plan. */
export async function hostPlan(
  backend: Backend,
  inputs: { readonly q: DeviceTensor; readonly k: DeviceTensor },
  policy: Policy,
  c: HostPlanContext,
): Promise<PrefillPlan> {
  const { t0, shape, B, Nb, peK, stats } = c;
  const H = shape.heads;
  assertFiniteStats(stats);
  const tStats = performance.now();
  const { routing, peHeads } = routeOnHost(policy, stats, H);
  const vs = selectVsLists(stats, routing.routes, policy.vs!, peK);
  // Selectors may be user code: check what they returned. The PE rows come from the backend,
  // which validates masks itself when it runs them, so they are not scanned here (at 512k
  // they can hold tens of millions of entries).
  validateMask({ heads: H, numBlocks: Nb, blockSize: B, vs }, { heads: H, numBlocks: Nb, blockSize: B });
  const tSelect = performance.now();
  let rows: BlockRows | undefined;
  let tPe = tSelect;
  if (peHeads.length > 0) {
    const pe = await backend.peBlockRows(inputs.q, inputs.k, { blockSize: B, gamma: policy.pe!.gamma, heads: peHeads, scale: c.scale });
    tPe = performance.now();
    rows = spreadRows(pe, peHeads, H, Nb);
  }
  const mask: BlockMask = { heads: H, numBlocks: Nb, blockSize: B, vs, rows };
  const { perHead, overall } = maskDensity(mask);
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
    planMs: tEnd - t0,
    phases: { statsMs: tStats - t0, selectMs: tSelect - tStats, peRowsMs: tPe - tSelect, maskMs: tEnd - tPe },
  };
}
