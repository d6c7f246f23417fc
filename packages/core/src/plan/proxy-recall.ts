/**
 * The per-head check a plan can afford: how much of the proxy rows' attention mass the
 * chosen blocks hold, read off statistics the plan already has.
 *
 * The proxy rows are the last b queries. Their mass by key block is p_v (ProxyStats'
 * `verticalBlocks`, each head summing to 1), and the blocks they may attend to under the plan
 * are the mask's row for the last query block (Nb − 1): the vertical list, the slash offsets
 * O read as key blocks Nb − 1 − O, and the PE rows' last row. So
 *
 *   proxyRecall[h] = Σ_{J in row Nb−1 of head h} p_v[h][J]
 *
 * in O(blocks in that row) per head, with no dense attention. A head whose chosen blocks miss
 * mass the proxy rows put elsewhere (a needle the pooled map smoothed away) shows a low value.
 * The proxy rows see only their own queries: mass that earlier queries put on blocks the last
 * ones ignore is not measured here (when n is not a multiple of B, the proxy rows spanning two
 * query blocks are counted against the last block's row).
 *
 * `alternativeRecall(plan, policy)` (alternative-recall.ts, asked for after the plan) is what
 * the other path would keep in that row: for a PE head, the
 * policy's VS selector's lists; for a VS head, an estimate of the PE path's last row (the
 * pooled estimate ā's blocks up to γ of its mass, with the kMin best VS blocks a PE head also
 * gets), NaN when the statistics lack the pooled estimate (routers that do not read it, such
 * as cStruct, leave it uncomputed, and computing it costs another pass over the keys).
 */
import type { BlockMask, VsLists } from '../mask.js';
import { packVsLists, vsHead } from '../mask.js';
import type { Route } from '../policy.js';
import { topKIndices } from '../ranking.js';
import { headSlice, type ProxyStats } from '../stats.js';

/** One head's VS lists from the policy's selector (host-plan.ts's headSelector). */
export type SelectHead = (h: number) => { readonly vertical: ArrayLike<number>; readonly slash: ArrayLike<number> };

/** Marks the key blocks of head h's last query-block row in `mark` (a scratch of Nb bytes, cleared first). */
function markLastRow(mask: BlockMask, h: number, mark: Uint8Array): void {
  const Nb = mask.numBlocks;
  const last = Nb - 1;
  mark.fill(0);
  if (mask.vs) {
    const { vertical, slash } = vsHead(mask.vs, h);
    for (let i = 0; i < vertical.length; i++) if (vertical[i] <= last) mark[vertical[i]] = 1;
    for (let i = 0; i < slash.length; i++) if (slash[i] <= last) mark[last - slash[i]] = 1;
  }
  if (mask.rows) {
    const { rowPtr, cols } = mask.rows;
    const r = h * Nb + last;
    for (let p = rowPtr[r]; p < rowPtr[r + 1]; p++) mark[cols[p]] = 1;
  }
}

function markedMass(p: Float64Array, mark: Uint8Array): number {
  let s = 0;
  for (let J = 0; J < p.length; J++) if (mark[J] === 1) s += p[J];
  return Math.min(1, s);
}

/** [H] the proxy rows' mass inside each head's last query-block row of `mask` (see above). */
export function proxyRecallOf(mask: BlockMask, stats: ProxyStats): Float64Array {
  const { heads: H, numBlocks: Nb } = mask;
  const out = new Float64Array(H);
  const mark = new Uint8Array(Nb);
  for (let h = 0; h < H; h++) {
    markLastRow(mask, h, mark);
    out[h] = markedMass(headSlice(stats.verticalBlocks, h, Nb), mark);
  }
  return out;
}

/** The recall of VS lists alone (a vertical and a slash list) in the last row. */
function listsRecall(vertical: ArrayLike<number>, slash: ArrayLike<number>, p: Float64Array, mark: Uint8Array): number {
  const last = p.length - 1;
  mark.fill(0);
  for (let i = 0; i < vertical.length; i++) if (vertical[i] <= last) mark[vertical[i]] = 1;
  for (let i = 0; i < slash.length; i++) if (slash[i] <= last) mark[last - slash[i]] = 1;
  return markedMass(p, mark);
}

/**
 * The PE path's last row estimated from the pooled estimate ā (one head's Nb values): the
 * fewest blocks of largest ā holding γ of it, with the head's kMin best vertical and slash
 * blocks, read as p_v mass.
 */
function pooledRecall(a: Float64Array, pv: Float64Array, ps: Float64Array, gamma: number, peK: number, mark: Uint8Array): number {
  const Nb = a.length;
  const last = Nb - 1;
  mark.fill(0);
  const order = Array.from({ length: Nb }, (_, J) => J).sort((x, y) => a[y] - a[x] || x - y);
  let total = 0;
  for (let J = 0; J < Nb; J++) total += a[J];
  let acc = 0;
  for (const J of order) {
    if (acc >= gamma * total) break;
    mark[J] = 1;
    acc += a[J];
  }
  for (const J of topKIndices(pv, peK)) mark[J] = 1;
  for (const O of topKIndices(ps, peK)) mark[last - O] = 1;
  // key block 0 and the diagonal, as a PE head's lists always hold them
  mark[0] = 1;
  mark[last] = 1;
  return markedMass(pv, mark);
}

/**
 * [H] what the other path would keep of the proxy rows' mass (see the module comment): PE
 * heads through `selectHead` (the policy's VS selector on that head), VS heads through the
 * pooled estimate when `pooled` is true, else NaN (NaN too where the selector throws on a PE
 * head: it never ran there for the plan).
 */
export function alternativeRecallOf(
  stats: ProxyStats,
  routes: readonly Route[],
  selectHead: SelectHead,
  opts: { readonly gamma: number; readonly peK: number; readonly pooled: boolean },
): Float64Array {
  const { heads: H, numBlocks: Nb } = stats;
  const out = new Float64Array(H);
  const mark = new Uint8Array(Nb);
  for (let h = 0; h < H; h++) {
    const pv = headSlice(stats.verticalBlocks, h, Nb);
    if (routes[h] === 'pe') {
      // The selector never ran on this head for the plan: a selector that fails on it (a
      // user's, on scores it did not expect) leaves the estimate out rather than the plan.
      let lists: ReturnType<SelectHead> | undefined;
      try {
        lists = selectHead(h);
      } catch {
        lists = undefined;
      }
      out[h] = lists ? listsRecall(lists.vertical, lists.slash, pv, mark) : Number.NaN;
    } else {
      out[h] = opts.pooled ? pooledRecall(headSlice(stats.pooledEstimate, h, Nb), pv, headSlice(stats.slashBlocks, h, Nb), opts.gamma, opts.peK, mark) : Number.NaN;
    }
  }
  return out;
}

/**
 * The guard's top-up: every head whose proxy recall is below `target` gets, as vertical
 * blocks, the key blocks of largest p_v that its last row lacks, until it holds `target` of the
 * proxy rows' mass. A vertical block J is kept by every query block from J on, so a needle the
 * proxy rows see is kept for every later query. Returns the new VS lists, the blocks added
 * per head and the recall after; heads at or above the target are unchanged.
 */
export function topUpVsLists(
  mask: BlockMask,
  stats: ProxyStats,
  recall: Float64Array,
  target: number,
): { vs: VsLists; added: Int32Array; recall: Float64Array } {
  const { heads: H, numBlocks: Nb } = mask;
  const added = new Int32Array(H);
  const after = Float64Array.from(recall);
  const vertical: ArrayLike<number>[] = [];
  const slash: ArrayLike<number>[] = [];
  const mark = new Uint8Array(Nb);
  for (let h = 0; h < H; h++) {
    const lists = mask.vs ? vsHead(mask.vs, h) : { vertical: new Int32Array(0), slash: new Int32Array(0) };
    slash.push(lists.slash);
    if (!(recall[h] < target)) {
      vertical.push(lists.vertical);
      continue;
    }
    const pv = headSlice(stats.verticalBlocks, h, Nb);
    markLastRow(mask, h, mark);
    const missing: number[] = [];
    for (let J = 0; J < Nb; J++) if (mark[J] === 0 && pv[J] > 0) missing.push(J);
    missing.sort((x, y) => pv[y] - pv[x] || x - y);
    const extra: number[] = [];
    let r = recall[h];
    for (const J of missing) {
      if (r >= target) break;
      extra.push(J);
      r += pv[J];
    }
    added[h] = extra.length;
    after[h] = Math.min(1, r);
    vertical.push(extra.length === 0 ? lists.vertical : Int32Array.from([...lists.vertical, ...extra]));
  }
  return { vs: packVsLists(vertical, slash), added, recall: after };
}

