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
import { type DirectionScores, InvalidArgumentError, NonFiniteError, unionSorted, argsortDescending, type VsSelector } from '@crisp/core';
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
 */
export function coverageTokenCount(tokens: ArrayLike<number>, gamma: number): number {
  const sorted = Float64Array.from(tokens).sort().reverse();
  let sum = 0;
  let count = 0;
  for (let i = 0; i < sorted.length; i++) {
    sum += sorted[i];
    if (sum > gamma) break;
    count++;
  }
  return count + 1;
}

/** γ cumulative coverage on token scores (needs `tokenScores`). */
export function cumulativeCoverage(opts: CumulativeCoverageOptions = {}): CumulativeCoverageSelector {
  const gamma = checkGamma(opts.gamma ?? 0.95);
  const kMin = checkKMin(opts.kMin ?? 1024);
  const name = `cumulativeCoverage(gamma=${gamma})`;
  return Object.freeze({
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
      for (let i = 0; i < a.length; i++) {
        if (!Number.isFinite(a[i])) {
          throw new NonFiniteError(`selector ${name}: tokenScores[${i}] is ${a[i]}; q or k holds NaN/Inf`, { index: i });
        }
      }
      const count = coverageTokenCount(a, gamma);
      const blocks = Math.min(Nb, Math.max(kBlocks, Math.floor(count / input.blockSize) + 1));
      // Block 0 first, then the best of the rest (ties toward the lower index).
      const order = argsortDescending(input.blockScores);
      const kept: number[] = [0];
      for (let i = 0; i < order.length && kept.length < blocks; i++) if (order[i] !== 0) kept.push(order[i]);
      return unionSorted(kept);
    },
  });
}
