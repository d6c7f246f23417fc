/**
 * FlexPrefill's cumulative coverage on the VS path (kept for comparison; CRISP replaces it
 * with the noise floor). It answers min |S| s.t. Σ_{j ∈ S} a_j >= γ, on TOKEN scores:
 *
 *   count  = #{ tokens in the descending-sorted prefix with cumulative sum <= γ } + 1
 *   blocks = floor(count / B) + 1, clipped to [kMin / B, Nb]
 *   keep the `blocks` best BLOCK scores, block 0 always among them
 *
 * (block 0 is key block 0, the sink, in the vertical direction and offset block 0, the
 * diagonal, in the slash direction; it takes one of the `blocks` slots, as FlexPrefill's
 * forced-first-block does). Softmax's mass cliff breaks it two ways: when the sink alone
 * nearly meets γ the count stops inside the anchors and every signal block is dropped
 * (sink-only collapse); otherwise the residual is filled with background tokens of mass
 * ε ≈ 1/n each, so the blocks it adds grow as O(n) (noise accumulation).
 */
import { argsortDescending, checkOptions, type DirectionScores, InvalidArgumentError, NonFiniteError, unionSorted, type VsSelector } from '@crisp/core';
import { checkGamma, checkInput, checkKMin } from './checks.js';

export interface CumulativeCoverageOptions {
  /** γ: the token mass to cover, 0 < γ < 1. Default 0.95 (FlexPrefill's). */
  readonly gamma?: number;
  /** k_min: tokens per direction kept at least (a positive multiple of B). Default 1024. */
  readonly kMin?: number;
}

export interface CumulativeCoverageSelector extends VsSelector {
  readonly gamma: number;
  readonly kMin: number;
}

/**
 * FlexPrefill's token count: tokens in the descending-sorted prefix whose cumulative sum
 * stays <= γ, plus one. Sums in float64 so the count does not depend on float32 rounding.
 *
 * The prefix is usually a small top slice (the sink alone holds most of the mass), so the
 * full O(n log n) sort is avoided: one pass buckets the values by the top 16 bits of their
 * float32 pattern (monotone in the value), accumulating each bucket's mass; the walk from the
 * top bucket finds where the sum crosses γ; only the values in the buckets down to one past
 * that one are sorted and summed in descending order, exactly as the full sort would. If that
 * slice does not reach γ after all (bucket sums in another order can differ in the last
 * bits), it falls back to the full sort. Same count, bit for bit, as sorting everything.
 */
export function coverageTokenCount(tokens: ArrayLike<number>, gamma: number): number {
  const n = tokens.length;
  const fullSort = () => fullSortCount(tokens, gamma);
  if (n < 4096) return fullSort();
  if (tokens instanceof Float32Array) {
    const r = coverageCountF32(tokens, gamma);
    return r >= 0 ? r : fullSort();
  }
  const f = new Float32Array(1);
  const u = new Uint32Array(f.buffer);
  const bucket = new Uint16Array(n);
  const mass = new Float64Array(65536);
  const count = new Uint32Array(65536);
  for (let i = 0; i < n; i++) {
    const v = tokens[i];
    if (!(v >= 0)) return fullSort(); // negatives or NaN: not a softmax row
    f[0] = v;
    const b = u[0] >>> 16;
    bucket[i] = b;
    mass[b] += v;
    count[b]++;
  }
  const slice = coverageSlice(mass, count, gamma, n);
  if (!slice) return fullSort();
  const { lo, m } = slice;
  const top = new Float64Array(m);
  let w = 0;
  for (let i = 0; i < n; i++) if (bucket[i] >= lo) top[w++] = tokens[i];
  const r = coverageCountSorted(top, gamma, true);
  return r >= 0 ? r : fullSort();
}

/**
 * coverageTokenCount on float32 scores (what the GPU backends download), without a comparison
 * sort: the same buckets (the top 16 bits of each value's bit pattern, read through a
 * Uint32Array view of the same memory); where their sums are exact, the count from the crossing
 * bucket alone (exactSumCount); otherwise the values in the buckets down to one past the
 * crossing one sorted descending by a two-pass radix sort on their bit patterns (low 16 bits,
 * then the bucket: for non-negative floats the pattern's order is the value's), and summed in
 * float64 in that order. Equal patterns are equal values, so the sums and the count are those
 * of the full sort, bit for bit. Returns −1 where the full sort must decide (a negative, -0,
 * Inf or NaN; the sum does not cross γ inside the slice; the slice is everything).
 */
function coverageCountF32(a: Float32Array, gamma: number): number {
  const n = a.length;
  const bits = new Uint32Array(a.buffer, a.byteOffset, n);
  const count = new Uint32Array(65536);
  const mass = new Float64Array(65536);
  for (let i = 0; i < n; i++) {
    const x = bits[i];
    // sign bit set (negatives, -0) or an exponent of all ones (Inf, NaN): not a softmax row
    if (x >= 0x7f800000) return -1;
    const b = x >>> 16;
    count[b]++;
    mass[b] += a[i];
  }
  const exact = exactSumCount(bits, count, mass, gamma);
  if (exact >= 0) return exact;
  const slice = coverageSlice(mass, count, gamma, n);
  if (!slice) return -1;
  const { lo, m } = slice;
  // the slice's patterns, gathered with a histogram of their low 16 bits
  const sorted = new Uint32Array(m);
  const low = new Uint32Array(65537);
  let w = 0;
  for (let i = 0; i < n; i++) {
    const x = bits[i];
    if (x >>> 16 >= lo) {
      sorted[w++] = x;
      low[(x & 0xffff) + 1]++;
    }
  }
  // pass 1: ordered by their low 16 bits, descending (a counting sort; offsets highest first)
  let at = 0;
  for (let c = 65535; c >= 0; c--) {
    const k = low[c + 1];
    low[c + 1] = at;
    at += k;
  }
  const byLow = new Uint32Array(m);
  for (let i = 0; i < m; i++) {
    const x = sorted[i];
    byLow[low[(x & 0xffff) + 1]++] = x;
  }
  // pass 2: stable by bucket, highest first (each bucket's start from the counts above), back
  // into the gathered array
  const start = new Uint32Array(65536);
  at = 0;
  for (let c = 65535; c >= lo; c--) {
    start[c] = at;
    at += count[c];
  }
  for (let i = 0; i < m; i++) {
    const x = byLow[i];
    sorted[start[x >>> 16]++] = x;
  }
  const values = new Float32Array(sorted.buffer);
  let s = 0;
  for (let i = 0; i < m; i++) {
    s += values[i];
    if (s > gamma) return i + 1;
  }
  return -1;
}

/**
 * The first bucket (top 16 bits of the pattern) whose values are all >= 2^-29 (exponent field
 * 98). Such a float32 is a whole multiple of 2^-52, so any float64 sum of them below 2 is a
 * multiple of 2^-52 below 2^53 · 2^-52, which float64 holds exactly: their sums do not depend
 * on the order of the additions.
 */
const EXACT_MIN_BUCKET = (98 << 23) >>> 16;

/**
 * The count without sorting the buckets above the crossing one, where their sums are exact:
 * when every value down to the crossing bucket is >= 2^-29 and the mass through it stays below
 * 2 (EXACT_MIN_BUCKET), the bucket masses of the first pass and the sorted prefix's running
 * sums are the same exact numbers whatever the order, so the definition's count is the values
 * in the buckets above plus the position, in the crossing bucket sorted descending, where the
 * running sum passes γ. Only that bucket is gathered and sorted. −1 where this does not apply
 * (a crossing among tiny values, a row whose mass reaches 2): the radix path decides.
 */
function exactSumCount(bits: Uint32Array, count: Uint32Array, mass: Float64Array, gamma: number): number {
  let sum = 0;
  let above = 0;
  let b = 65535;
  for (; b >= EXACT_MIN_BUCKET; b--) {
    const next = sum + mass[b];
    if (next > gamma) break;
    sum = next;
    above += count[b];
  }
  if (b < EXACT_MIN_BUCKET || !(sum + mass[b] < 2)) return -1;
  const k = count[b];
  const patterns = new Uint32Array(k);
  for (let i = 0, w = 0; w < k; i++) if (bits[i] >>> 16 === b) patterns[w++] = bits[i];
  // ascending patterns are ascending values (non-negative floats); walk from the largest
  patterns.sort();
  const values = new Float32Array(patterns.buffer);
  for (let j = k - 1; j >= 0; j--) {
    sum += values[j];
    if (sum > gamma) return above + (k - j);
  }
  return -1;
}

/**
 * The buckets to sort and sum: from the top down to one non-empty bucket past the one where the
 * buckets' running mass crosses γ (a margin for summation order), and how many values they
 * hold; undefined when the mass never crosses γ or the slice is every value (the full sort).
 */
function coverageSlice(mass: Float64Array, count: Uint32Array, gamma: number, n: number): { lo: number; m: number } | undefined {
  let sum = 0;
  let b = 65535;
  for (; b >= 0; b--) {
    sum += mass[b];
    if (sum > gamma) break;
  }
  if (b < 0) return undefined;
  let lo = b;
  for (let c = lo - 1; c >= 0; c--) {
    if (count[c] > 0) {
      lo = c;
      break;
    }
  }
  let m = 0;
  for (let c = lo; c < 65536; c++) m += count[c];
  return m === n ? undefined : { lo, m };
}

/** The count by the definition, on a float64 copy of the scores (every value sorted). */
function fullSortCount(tokens: ArrayLike<number>, gamma: number): number {
  return coverageCountSorted(Float64Array.from(tokens), gamma);
}

/** The definition: sort descending, count the prefix with sum <= γ, plus one. Sorts `values` in place. */
function coverageCountSorted(values: Float64Array, gamma: number, mustCross = false): number {
  const sorted = values.sort().reverse();
  let sum = 0;
  let count = 0;
  for (let i = 0; i < sorted.length; i++) {
    sum += sorted[i];
    if (sum > gamma) return count + 1;
    count++;
  }
  return mustCross ? -1 : count + 1;
}

/** γ cumulative coverage on token scores (needs `tokenScores`). */
export function cumulativeCoverage(options?: CumulativeCoverageOptions): CumulativeCoverageSelector {
  const opts: CumulativeCoverageOptions = checkOptions(options, 'cumulativeCoverage', ['gamma', 'kMin']);
  const gamma = checkGamma(opts.gamma ?? 0.95);
  const kMin = checkKMin(opts.kMin ?? 1024);
  const name = `cumulativeCoverage(gamma=${gamma})`;
  const selector: CumulativeCoverageSelector = {
    name,
    gamma,
    kMin,
    needs: Object.freeze({ tokenScores: true }),
    select(input: DirectionScores): Int32Array {
      const { Nb, kBlocks } = checkInput(input, name, kMin);
      const a = input.tokenScores;
      if (!a) {
        throw new InvalidArgumentError(
          `selector ${name} reads token scores (a_v / a_s): declare needs.tokenScores (the pipeline then asks proxyStats for them) or pass tokenScores of length n`,
        );
      }
      if (a.length !== input.n) {
        throw new InvalidArgumentError(`selector ${name}: tokenScores must hold n = ${input.n} values; got ${a.length}`);
      }
      // The float32 count's first pass sees every score and gives up on a NaN, an Inf or a
      // negative one: only then is the row scanned for the first non-finite value to name.
      const f32 = a instanceof Float32Array && a.length >= 4096;
      const fast = f32 ? coverageCountF32(a, gamma) : -1;
      if (fast < 0) {
        for (let i = 0; i < a.length; i++) {
          if (!Number.isFinite(a[i])) {
            throw new NonFiniteError(`selector ${name}: tokenScores[${i}] is ${a[i]}; q or k holds NaN/Inf`, { index: i });
          }
        }
      }
      // (where the float32 count gave up, the full sort decides: coverageTokenCount would try it again first)
      const count = fast >= 0 ? fast : f32 ? fullSortCount(a, gamma) : coverageTokenCount(a, gamma);
      const blocks = Math.min(Nb, Math.max(kBlocks, Math.floor(count / input.blockSize) + 1));
      // Block 0 first, then the best of the rest (ties toward the lower index).
      const order = argsortDescending(input.blockScores);
      const kept: number[] = [0];
      for (let i = 0; i < order.length && kept.length < blocks; i++) if (order[i] !== 0) kept.push(order[i]);
      return unionSorted(kept);
    },
  };
  // The same rule for backends that select on the device (@crisp/core DeviceSelectorRule),
  // non-enumerable as the noise floor's. Only for γ <= 0.99: there the device's count, exact
  // integer sums of the scores >= 2^-29, is the definition's (the scores below 2^-29 hold under
  // 2^-9 of a softmax row's mass at n <= 2^20, so the running sum passes γ before them).
  if (gamma <= 0.99) {
    Object.defineProperty(selector, 'device', { value: Object.freeze({ kind: 'cumulativeCoverage' as const, gamma, kMin }), enumerable: false });
  }
  return Object.freeze(selector);
}
