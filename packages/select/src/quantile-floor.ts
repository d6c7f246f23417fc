/**
 * Quantile floors (the paper's Table 9 tried the median in place of the mean).
 *
 * The mean floor μ is pulled up by one dominant non-anchor block: a block holding 30% of
 * the mass raises μ by 0.3 / (Nb − 2) and can push real but weaker signal blocks under it.
 * A quantile of the background is not moved by a few large blocks:
 *
 *   μ_q = Q_q( p[1 .. Nb−2] )      (type-7 quantile of the non-anchor blocks)
 *   keep {J : p[J] > α · μ_q}, kMin / B best if fewer pass, ∪ {0, Nb − 1}
 *
 * With q = 0.5 (the median) it shares the mean floor's other weakness: on a near-uniform
 * background about half the blocks sit above it. The paper measured ±0.7 pp between mean
 * and median, neither better everywhere.
 */
import type { DirectionScores, VsSelector } from '@crisp/core';
import { checkOptions, describeValue, InvalidArgumentError } from '@crisp/core';
import { checkAlpha, checkInput, checkKMin } from './checks.js';
import { allBlocks, background, keepAboveWithAnchors, quantile } from './floor.js';

export interface QuantileFloorOptions {
  /** q: the background quantile used as the floor, in (0, 1). Default 0.5 (the median). */
  readonly q?: number;
  /** α: keep blocks above α · μ_q. Default 1.0. α > 0. */
  readonly alpha?: number;
  /** k_min: tokens per direction kept at least (a positive multiple of B). Default 1024. */
  readonly kMin?: number;
}

export interface QuantileFloorSelector extends VsSelector {
  readonly q: number;
  readonly alpha: number;
  readonly kMin: number;
}

/** Floor at α times the q-quantile of the background blocks (J = 1 .. Nb − 2). */
export function quantileFloor(options?: QuantileFloorOptions): QuantileFloorSelector {
  const opts: QuantileFloorOptions = checkOptions(options, 'quantileFloor', ['q', 'alpha', 'kMin']);
  const q = opts.q ?? 0.5;
  if (typeof q !== 'number' || !Number.isFinite(q) || q <= 0 || q >= 1) {
    throw new InvalidArgumentError(`q must be a quantile in (0, 1) (0.5 is the median); got ${describeValue(q)}`, { q });
  }
  const alpha = checkAlpha(opts.alpha ?? 1.0);
  const kMin = checkKMin(opts.kMin ?? 1024);
  const name = q === 0.5 ? `medianFloor(alpha=${alpha})` : `quantileFloor(q=${q}, alpha=${alpha})`;
  return Object.freeze({
    name,
    q,
    alpha,
    kMin,
    select(input: DirectionScores): Int32Array {
      const { Nb, kBlocks } = checkInput(input, name, kMin);
      if (Nb <= 2) return allBlocks(Nb);
      return keepAboveWithAnchors(input.blockScores, alpha * quantile(background(input.blockScores), q), kBlocks);
    },
  });
}

/** The median floor of Table 9: quantileFloor with q = 0.5. */
export function medianFloor(options?: Omit<QuantileFloorOptions, 'q'>): QuantileFloorSelector {
  const opts: Omit<QuantileFloorOptions, 'q'> = checkOptions(options, 'medianFloor', ['alpha', 'kMin']);
  return quantileFloor({ ...opts, q: 0.5 });
}
