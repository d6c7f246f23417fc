/**
 * The PE path in float64: the pooled block map Ā of a head from block means, and its γ cut
 * into block rows (what the reference backend's peBlockRows returns).
 *
 * Shape legend: H query heads, Hkv kv heads, d head dim, B block size, Nb = ceil(n / B).
 */
import { type BlockRows, InvalidArgumentError } from '@crisp/core';
import { type BlockMeans, blockMeans } from './block-means.js';
import { kvHeadOf, type Problem } from './math.js';

/** The sizes a pooled map needs beside the means. */
export interface PooledDims {
  readonly heads: number;
  readonly kvHeads: number;
  readonly dim: number;
  readonly numBlocks: number;
  /** softmax scale */
  readonly scale: number;
}

/**
 * The pooled block map of one head, flattened row-major (I, then J <= I) and normalised to
 * sum 1: Ā[I, J] = softmax_J(Q̄_I · K̄_J · scale) over J <= I, divided by the number of query
 * blocks. Q̄_I, K̄_J are block means (partial blocks over their real rows); with chunked
 * prefill, query blocks holding no query rows get zeros and do not count.
 */
export class PooledMap {
  readonly Nb: number;
  readonly entries: number;
  readonly flatI: Int32Array;
  readonly flatJ: Int32Array;
  readonly #kMeans: Float64Array;
  readonly #qm: BlockMeans;
  readonly #dims: PooledDims;
  /**
   * From block means: Q̄ [H][Nb][d] with each query block's row count (0: no query rows), K̄
   * [Hkv][Nb][d]. What a sharded prefill gathers from its ranks (@crisp/parallel).
   */
  constructor(qMeans: BlockMeans, kMeans: Float64Array, dims: PooledDims) {
    this.#dims = dims;
    this.Nb = dims.numBlocks;
    const Nb = this.Nb;
    this.#kMeans = kMeans;
    this.#qm = qMeans;
    this.entries = (Nb * (Nb + 1)) / 2;
    this.flatI = new Int32Array(this.entries);
    this.flatJ = new Int32Array(this.entries);
    let f = 0;
    for (let I = 0; I < Nb; I++) {
      for (let J = 0; J <= I; J++) {
        this.flatI[f] = I;
        this.flatJ[f] = J;
        f++;
      }
    }
  }
  /** The map of a whole problem: the block means of its q (the last m of n positions) and k. */
  static of(p: Problem, B: number): PooledMap {
    const n = p.k.rows;
    const Nb = Math.ceil(n / B);
    return new PooledMap(blockMeans(p.q, B, n - p.q.rows, Nb), blockMeans(p.k, B, 0, Nb).mean, {
      heads: p.q.heads,
      kvHeads: p.k.heads,
      dim: p.q.dim,
      numBlocks: Nb,
      scale: p.scale,
    });
  }
  /** query block I holds at least one query row */
  active(I: number): boolean {
    return this.#qm.count[I] > 0;
  }
  /** Fill vals (length `entries`) with head h's normalised map. */
  values(h: number, vals: Float64Array): Float64Array {
    const { heads, kvHeads, dim: d, scale } = this.#dims;
    const Nb = this.Nb;
    const g = kvHeadOf(h, heads, kvHeads);
    const qMean = this.#qm.mean;
    const kMeans = this.#kMeans;
    let f = 0;
    let activeRows = 0;
    for (let I = 0; I < Nb; I++) {
      if (!this.active(I)) {
        for (let J = 0; J <= I; J++) vals[f++] = 0;
        continue;
      }
      activeRows++;
      const qo = (h * Nb + I) * d;
      let mx = Number.NEGATIVE_INFINITY;
      for (let J = 0; J <= I; J++) {
        const ko = (g * Nb + J) * d;
        let dot = 0;
        for (let c = 0; c < d; c++) dot += qMean[qo + c] * kMeans[ko + c];
        const x = dot * scale;
        vals[f + J] = x;
        if (x > mx) mx = x;
      }
      let z = 0;
      for (let J = 0; J <= I; J++) {
        const e = Math.exp(vals[f + J] - mx);
        vals[f + J] = e;
        z += e;
      }
      for (let J = 0; J <= I; J++) vals[f + J] /= z;
      f += I + 1;
    }
    // Each active row sums to 1, so normalising the whole map divides by the row count.
    const invRows = 1 / activeRows;
    for (let e = 0; e < this.entries; e++) vals[e] *= invRows;
    return vals;
  }
}

/** Flat indices sorted by descending value, ties to the lower flat index. */
export function sortedEntries(vals: Float64Array): Int32Array {
  const order = new Int32Array(vals.length);
  for (let e = 0; e < order.length; e++) order[e] = e;
  return order.sort((a, b) => (vals[a] === vals[b] ? a - b : vals[b] > vals[a] ? 1 : -1));
}

/**
 * PE rows for the listed heads from the pooled map (see PooledMap). The entries are sorted
 * descending with ties to the lower flat index (row-major I, then J), and the SHORTEST
 * prefix whose cumulative sum reaches γ is kept (FlexPrefill keeps one entry fewer: the
 * prefix whose sum stays <= γ). Floating-point sums that never reach γ (γ = 1) keep every
 * entry.
 */
export function peRowsF64(p: Problem, B: number, gamma: number, heads: readonly number[]): BlockRows {
  return peRowsOfMap(PooledMap.of(p, B), gamma, heads);
}

/** peRowsF64 over a pooled map already built (from a problem, or from gathered block means). */
export function peRowsOfMap(map: PooledMap, gamma: number, heads: readonly number[]): BlockRows {
  if (!(gamma > 0 && gamma <= 1)) {
    throw new InvalidArgumentError(`gamma must be in (0, 1]; got ${gamma}`);
  }
  const { Nb, entries, flatI, flatJ } = map;
  const vals = new Float64Array(entries);
  const keep = new Uint8Array(entries);
  const perHeadRows: Int32Array[][] = [];
  for (const h of heads) {
    map.values(h, vals);
    const order = sortedEntries(vals);
    keep.fill(0);
    let cum = 0;
    for (let t = 0; t < entries; t++) {
      const e = order[t];
      if (!map.active(flatI[e])) continue; // a query block with no query rows (chunked)
      keep[e] = 1;
      cum += vals[e];
      if (cum >= gamma) break;
    }
    const rowsOfHead: Int32Array[] = [];
    let e = 0;
    for (let I = 0; I < Nb; I++) {
      let c = 0;
      for (let J = 0; J <= I; J++) if (keep[e + J]) c++;
      const row = new Int32Array(c);
      c = 0;
      for (let J = 0; J <= I; J++) if (keep[e + J]) row[c++] = flatJ[e + J];
      rowsOfHead.push(row);
      e += I + 1;
    }
    perHeadRows.push(rowsOfHead);
  }
  const rowPtr = new Int32Array(heads.length * Nb + 1);
  let total = 0;
  for (let s = 0; s < heads.length; s++) {
    for (let I = 0; I < Nb; I++) {
      total += perHeadRows[s][I].length;
      rowPtr[s * Nb + I + 1] = total;
    }
  }
  const cols = new Int32Array(total);
  for (let s = 0; s < heads.length; s++) {
    for (let I = 0; I < Nb; I++) cols.set(perHeadRows[s][I], rowPtr[s * Nb + I]);
  }
  return { rowPtr, cols };
}
