/**
 * Comparisons with tolerances, and the borderline rules that let a backend's discrete
 * decisions (PE cut, VS selection, routing) differ from the reference only where a score
 * sits within tolerance of a decision boundary.
 */
import { type BlockRows, type DType, type ProxyStats, type Route, decode, type HostTensor } from '@crisp/core';
import type { PooledBlockMap } from '@crisp/reference';

export interface Tolerance {
  /** attention outputs: |got - exact| / max(1, |exact|) */
  readonly output: number;
  /** log-sum-exp, same error measure */
  readonly lse: number;
  /** proxy statistics (probabilities; entropy in nats measured as above) and the pooled map */
  readonly stats: number;
}

/**
 * Defaults. Outputs are rounded once to the dtype, so f16 and bf16 allow 4 units in the
 * last place at 1 (2^-10 * 2, 2^-7 * 2 ... written out below) for rounding plus
 * low-precision P·V products; f32 allows accumulation-order and fast-exp differences.
 * Statistics come from the same stored inputs on every backend and are accumulated in f32
 * or better, so their tolerance does not depend on the dtype.
 */
export const DEFAULT_TOLERANCES: Readonly<Record<DType, Tolerance>> = Object.freeze({
  f32: Object.freeze({ output: 2e-5, lse: 2e-5, stats: 2e-5 }),
  f16: Object.freeze({ output: 2 ** -9, lse: 1e-4, stats: 2e-5 }),
  bf16: Object.freeze({ output: 2 ** -6, lse: 1e-4, stats: 2e-5 }),
});

/** Largest |a - e| / max(1, |e|); non-finite values of `a` count as Infinity. */
export function maxMixedError(a: ArrayLike<number>, e: ArrayLike<number>): { error: number; index: number } {
  let worst = 0;
  let index = -1;
  for (let i = 0; i < e.length; i++) {
    const x = a[i];
    const err = Number.isFinite(x) ? Math.abs(x - e[i]) / Math.max(1, Math.abs(e[i])) : Number.POSITIVE_INFINITY;
    if (err > worst || index < 0) {
      worst = err;
      index = i;
    }
  }
  return { error: worst, index };
}

/** Pick rows [rows.length, H, d] out of a downloaded [m, H, d] output, as f64. */
export function outputRows(t: HostTensor, rows: readonly number[]): Float64Array {
  const [, H, d] = t.shape;
  const vals = decode(t.dtype, t.data);
  const out = new Float64Array(rows.length * H * d);
  rows.forEach((r, i) => {
    for (let c = 0; c < H * d; c++) out[i * H * d + c] = vals[r * H * d + c];
  });
  return out;
}

export interface FieldReport {
  readonly error: number;
  readonly lines: string[];
}

/**
 * Compare every statistic of two ProxyStats; lines name each field beyond tolerance.
 * `tokensIfPresent`: the token scores only where `got` holds them (a plan whose selection read
 * them on the device, `tokenScores: 'device'`, may keep none on the host; the proxyStats case
 * checks them strictly).
 */
export function compareStats(got: ProxyStats, ref: ProxyStats, tol: number, tokensIfPresent = false): FieldReport {
  const lines: string[] = [];
  for (const key of ['n', 'heads', 'blockSize', 'numBlocks', 'proxyRows'] as const) {
    if (got[key] !== ref[key]) lines.push(`${key}: got ${got[key]}, expected ${ref[key]}`);
  }
  if (lines.length > 0) return { error: Number.POSITIVE_INFINITY, lines };
  let error = 0;
  const fields = ['cStruct', 'verticalBlocks', 'slashBlocks', 'pooledEstimate', 'rowEntropy'] as const;
  const check = (name: string, a: ArrayLike<number> | undefined, e: ArrayLike<number> | undefined) => {
    if (!e) return;
    if (!a || a.length !== e.length) {
      lines.push(`${name}: got length ${a?.length}, expected ${e.length}`);
      error = Number.POSITIVE_INFINITY;
      return;
    }
    const r = maxMixedError(a, e);
    if (r.error > error) error = r.error;
    if (!(r.error <= tol)) lines.push(`${name}[${r.index}]: got ${a[r.index]}, expected ${e[r.index]} (error ${r.error.toExponential(2)})`);
  };
  for (const f of fields) check(f, got[f], ref[f]);
  if (!(tokensIfPresent && got.verticalTokens === undefined && got.slashTokens === undefined)) {
    check('verticalTokens', got.verticalTokens, ref.verticalTokens);
    check('slashTokens', got.slashTokens, ref.slashTokens);
  }
  return { error, lines };
}

function rowSet(rows: BlockRows, slot: number, Nb: number, flatIndex: (I: number, J: number) => number): Set<number> {
  const s = new Set<number>();
  for (let I = 0; I < Nb; I++) {
    const r = slot * Nb + I;
    for (let p = rows.rowPtr[r]; p < rows.rowPtr[r + 1]; p++) s.add(flatIndex(I, rows.cols[p]));
  }
  return s;
}

/**
 * PE rows against the reference pooled map, for each listed head (rows slot s = heads[s]).
 * The reference keeps entry e iff the mass sorted before it, S(e), is below γ. A backend may
 * differ on e only if e is borderline: |S(e) − γ| <= massTol (its running sum crosses γ
 * within rounding), or its value is within `tol` of the reference cut entry's value (a
 * near-tie reordered). The backend's kept set must still cover γ − massTol of the
 * reference mass. massTol = tol + entries · 2^-24 bounds an f32 running sum's drift.
 */
export function comparePeRows(
  got: BlockRows,
  map: PooledBlockMap,
  slots: readonly number[],
  gamma: number,
  tol: number,
): { lines: string[]; borderline: number } {
  const lines: string[] = [];
  const Nb = map.numBlocks;
  const flatIndex = (I: number, J: number) => (I * (I + 1)) / 2 + J;
  if (got.rowPtr.length !== slots.length * Nb + 1) {
    return { lines: [`rowPtr has ${got.rowPtr.length} entries, expected ${slots.length * Nb + 1}`], borderline: 0 };
  }
  let borderline = 0;
  const entries = map.flatI.length;
  const massTol = tol + entries * 2 ** -24;
  slots.forEach((head, s) => {
    const vals = map.values[s];
    const order = map.order[s];
    const before = new Float64Array(entries);
    let cum = 0;
    let cut = -1;
    for (const e of order) {
      before[e] = cum;
      if (cum < gamma) cut = e;
      cum += vals[e];
    }
    const mine = rowSet(got, s, Nb, flatIndex);
    let covered = 0;
    for (const e of mine) covered += vals[e] ?? 0;
    for (let e = 0; e < entries; e++) {
      const inRef = before[e] < gamma;
      if (inRef === mine.has(e)) continue;
      if (Math.abs(before[e] - gamma) <= massTol || Math.abs(vals[e] - vals[cut]) <= tol) {
        borderline++;
        continue;
      }
      lines.push(
        `head ${head}: block (${map.flatI[e]}, ${map.flatJ[e]}) ${inRef ? 'missing' : 'extra'} (value ${vals[e].toExponential(3)}, mass before it ${before[e].toFixed(6)}, γ ${gamma})`,
      );
      if (lines.length > 8) return;
    }
    if (covered < gamma - massTol) lines.push(`head ${head}: kept blocks cover ${covered.toFixed(6)} < γ ${gamma}`);
  });
  return { lines, borderline };
}

/**
 * One head's VS selection (vertical or slash block list) against the reference's, on the
 * reference's block scores. A block may differ only if borderline:
 *  - by score: an extra block scoring within `tol` of the lowest reference-selected score,
 *    or a missing block scoring within `tol` of the highest unselected score (thresholds
 *    such as the noise floor α·μ lie between the two);
 *  - by count: one block per list at the rank boundary (an extra block that is the best
 *    unselected one, or a missing one that is the weakest selected block apart from the
 *    two always-kept end blocks), since count-based rules (kMin, FlexPrefill's token
 *    coverage count) move by one when a running sum crosses its bound within rounding.
 */
export function compareSelection(
  got: ArrayLike<number>,
  ref: ArrayLike<number>,
  scores: ArrayLike<number>,
  tol: number,
): { lines: string[]; borderline: number } {
  const R = new Set(Array.from(ref));
  const G = new Set(Array.from(got));
  let minSel = Number.POSITIVE_INFINITY;
  let maxUnsel = Number.NEGATIVE_INFINITY;
  let bestUnsel = -1;
  for (let J = 0; J < scores.length; J++) {
    if (R.has(J)) minSel = Math.min(minSel, scores[J]);
    else if (scores[J] > maxUnsel) {
      maxUnsel = scores[J];
      bestUnsel = J;
    }
  }
  // The weakest selected block other than the two always-kept end blocks.
  let worstSel = -1;
  for (const J of R) {
    if (J === 0 || J === scores.length - 1) continue;
    if (worstSel < 0 || scores[J] < scores[worstSel] || (scores[J] === scores[worstSel] && J > worstSel)) worstSel = J;
  }
  const lines: string[] = [];
  let borderline = 0;
  let rankFlips = 0;
  for (const J of G) {
    if (R.has(J)) continue;
    if (!(J >= 0 && J < scores.length)) {
      lines.push(`block ${J} out of range`);
      continue;
    }
    if (scores[J] >= minSel - tol) borderline++;
    else if (J === bestUnsel && rankFlips++ === 0) borderline++;
    else lines.push(`extra block ${J} (score ${scores[J].toExponential(3)}; lowest selected ${minSel.toExponential(3)})`);
  }
  for (const J of R) {
    if (G.has(J)) continue;
    if (scores[J] <= maxUnsel + tol) borderline++;
    else if (J === worstSel && rankFlips++ === 0) borderline++;
    else lines.push(`missing block ${J} (score ${scores[J].toExponential(3)}; best unselected ${maxUnsel.toExponential(3)})`);
  }
  return { lines, borderline };
}

/** Routing: heads may differ only where the reference score is within tol of the threshold. */
export function compareRoutes(
  got: readonly Route[],
  ref: readonly Route[],
  refScores: ArrayLike<number>,
  threshold: number | undefined,
  tol: number,
): { lines: string[]; flipped: Set<number> } {
  const lines: string[] = [];
  const flipped = new Set<number>();
  for (let h = 0; h < ref.length; h++) {
    if (got[h] === ref[h]) continue;
    flipped.add(h);
    if (threshold === undefined || !(Math.abs(refScores[h] - threshold) <= tol)) {
      lines.push(`head ${h}: routed ${got[h]}, reference ${ref[h]} (score ${refScores[h]}, threshold ${threshold})`);
    }
  }
  return { lines, flipped };
}
