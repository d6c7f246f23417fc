/**
 * Per-head comparison of two block selections of the same layer: CRISP's plan (VS lists and
 * PE rows) and FlexPrefill's block indices. Pure: no backend, no files.
 *
 * A head's selection is given as vertical key blocks J (every query block I >= J), slash
 * offsets O (every (I, I - O), O = 0 the diagonal) and extra blocks as flat indices I·Nb + J.
 * Its causal block set is the union of the three within I >= J; sets are compared by Jaccard
 * (|A ∩ B| / |A ∪ B|) and by density (|A| / (Nb (Nb + 1) / 2)).
 */
import type { BlockMask, Route } from '@crisp/core';

export interface HeadSelection {
  readonly vertical?: ArrayLike<number>;
  readonly slash?: ArrayLike<number>;
  /** flat indices I * Nb + J; entries above the diagonal (J > I) are not causal and are ignored */
  readonly blocks?: ArrayLike<number>;
}

/** The causal block set of one head as a bitmap over the Nb × Nb grid (row-major, I·Nb + J). */
export function headBitmap(sel: HeadSelection, Nb: number): Uint8Array {
  if (!Number.isInteger(Nb) || Nb < 1) throw new RangeError(`Nb must be a positive integer; got ${Nb}`);
  const m = new Uint8Array(Nb * Nb);
  const v = sel.vertical ?? [];
  for (let i = 0; i < v.length; i++) {
    const J = v[i];
    if (!Number.isInteger(J) || J < 0 || J >= Nb) continue;
    for (let I = J; I < Nb; I++) m[I * Nb + J] = 1;
  }
  const s = sel.slash ?? [];
  for (let i = 0; i < s.length; i++) {
    const O = s[i];
    if (!Number.isInteger(O) || O < 0 || O >= Nb) continue;
    for (let I = O; I < Nb; I++) m[I * Nb + I - O] = 1;
  }
  const f = sel.blocks ?? [];
  for (let i = 0; i < f.length; i++) {
    const x = f[i];
    if (!Number.isInteger(x) || x < 0 || x >= Nb * Nb) continue;
    if (Math.floor(x / Nb) >= x % Nb) m[x] = 1;
  }
  return m;
}

export function countSet(m: Uint8Array): number {
  let c = 0;
  for (let i = 0; i < m.length; i++) c += m[i];
  return c;
}

/** |A ∩ B| / |A ∪ B| (1 for two empty sets). */
export function jaccard(a: Uint8Array, b: Uint8Array): number {
  if (a.length !== b.length) throw new RangeError(`bitmaps of different sizes (${a.length}, ${b.length})`);
  let inter = 0;
  let union = 0;
  for (let i = 0; i < a.length; i++) {
    inter += a[i] & b[i];
    union += a[i] | b[i];
  }
  return union === 0 ? 1 : inter / union;
}

/** A plan's mask as one HeadSelection per head (its VS lists, its BSR rows as flat indices). */
export function selectionsFromMask(mask: BlockMask): HeadSelection[] {
  const { heads: H, numBlocks: Nb } = mask;
  const out: HeadSelection[] = [];
  for (let h = 0; h < H; h++) {
    const vs = mask.vs;
    const vertical = vs ? vs.vertical.subarray(vs.verticalPtr[h], vs.verticalPtr[h + 1]) : undefined;
    const slash = vs ? vs.slash.subarray(vs.slashPtr[h], vs.slashPtr[h + 1]) : undefined;
    let blocks: Int32Array | undefined;
    const rows = mask.rows;
    if (rows) {
      const from = rows.rowPtr[h * Nb];
      const to = rows.rowPtr[(h + 1) * Nb];
      if (to > from) {
        blocks = new Int32Array(to - from);
        for (let I = 0; I < Nb; I++) {
          for (let e = rows.rowPtr[h * Nb + I]; e < rows.rowPtr[h * Nb + I + 1]; e++) blocks[e - from] = I * Nb + rows.cols[e];
        }
      }
    }
    out.push({ vertical, slash, blocks });
  }
  return out;
}

/** Heads' flat block lists from a concatenated int32 array and per-head offsets [H + 1]. */
export function selectionsFromFlat(flat: Int32Array, ptr: readonly number[]): HeadSelection[] {
  const out: HeadSelection[] = [];
  for (let h = 0; h + 1 < ptr.length; h++) out.push({ blocks: flat.subarray(ptr[h], ptr[h + 1]) });
  return out;
}

export interface HeadComparison {
  readonly head: number;
  readonly oursRoute: Route;
  readonly theirsRoute?: Route;
  readonly oursDensity: number;
  readonly theirsDensity: number;
  /** Jaccard of the causal block sets (absent when one side gave only densities) */
  readonly jaccard?: number;
  /** the head's relative error over the sampled rows, ours and the peer's (where the peer scored them) */
  readonly oursRelErr?: number;
  readonly theirsRelErr?: number;
}

export interface LayerComparison {
  readonly heads: HeadComparison[];
  /** share of heads routed the same way (absent when the peer gave no routes) */
  readonly routeAgreement?: number;
  readonly meanJaccard?: number;
  /** mean Jaccard over the heads both sides routed the same way, and over the others */
  readonly meanJaccardSameRoute?: number;
  readonly meanJaccardOtherRoute?: number;
  readonly oursDensity: number;
  readonly theirsDensity: number;
  /** mean |ours − theirs| of per-head densities */
  readonly meanAbsDensityDiff: number;
}

/** Mean over heads of the causal blocks each selection keeps, over Nb (Nb + 1) / 2. */
export function causalDensity(Nb: number, selections: readonly HeadSelection[]): number {
  if (!selections.length) return 0;
  const total = (Nb * (Nb + 1)) / 2;
  let sum = 0;
  for (const sel of selections) sum += countSet(headBitmap(sel, Nb)) / total;
  return sum / selections.length;
}

const mean = (xs: readonly number[]): number | undefined => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : undefined);

/**
 * Compare CRISP's and the peer's decisions on one layer. `theirs` gives either selections
 * (Jaccard and density computed here) or densities alone (per-head density difference only).
 */
export function compareLayer(
  Nb: number,
  ours: { readonly routes: readonly Route[]; readonly selections: readonly HeadSelection[] },
  theirs: { readonly routes?: readonly (Route | string)[]; readonly selections?: readonly HeadSelection[]; readonly densities?: readonly number[] },
): LayerComparison {
  const H = ours.routes.length;
  if (ours.selections.length !== H) throw new RangeError(`ours: ${ours.routes.length} routes but ${ours.selections.length} selections`);
  const theirCount = theirs.selections?.length ?? theirs.densities?.length;
  if (theirCount !== H) throw new RangeError(`theirs: ${theirCount ?? 'no'} heads; ours has ${H}`);
  if (theirs.routes && theirs.routes.length !== H) throw new RangeError(`theirs: ${theirs.routes.length} routes for ${H} heads`);
  const total = (Nb * (Nb + 1)) / 2;
  const heads: HeadComparison[] = [];
  for (let h = 0; h < H; h++) {
    const a = headBitmap(ours.selections[h], Nb);
    const oursDensity = countSet(a) / total;
    const tr = theirs.routes?.[h];
    const theirsRoute = tr === 'vs' || tr === 'pe' ? tr : undefined;
    if (theirs.selections) {
      const b = headBitmap(theirs.selections[h], Nb);
      heads.push({ head: h, oursRoute: ours.routes[h], theirsRoute, oursDensity, theirsDensity: countSet(b) / total, jaccard: jaccard(a, b) });
    } else {
      heads.push({ head: h, oursRoute: ours.routes[h], theirsRoute, oursDensity, theirsDensity: theirs.densities![h] });
    }
  }
  const routed = heads.filter((x) => x.theirsRoute !== undefined);
  const js = (f: (x: HeadComparison) => boolean) => mean(heads.filter((x) => x.jaccard !== undefined && f(x)).map((x) => x.jaccard!));
  return {
    heads,
    routeAgreement: theirs.routes ? routed.filter((x) => x.oursRoute === x.theirsRoute).length / H : undefined,
    meanJaccard: js(() => true),
    meanJaccardSameRoute: theirs.routes ? js((x) => x.oursRoute === x.theirsRoute) : undefined,
    meanJaccardOtherRoute: theirs.routes ? js((x) => x.oursRoute !== x.theirsRoute) : undefined,
    oursDensity: mean(heads.map((x) => x.oursDensity)) ?? 0,
    theirsDensity: mean(heads.map((x) => x.theirsDensity)) ?? 0,
    meanAbsDensityDiff: mean(heads.map((x) => Math.abs(x.oursDensity - x.theirsDensity))) ?? 0,
  };
}
