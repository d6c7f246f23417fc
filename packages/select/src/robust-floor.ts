/**
 * The robust outlier floor (our design, beyond the paper): keep the blocks that are
 * outliers of the background distribution, measured with statistics the signal itself
 * cannot move.
 *
 *   bg = p[1 .. Nb−2]                                  the non-anchor blocks
 *   m̃ = median(bg),  σ̂ = 1.4826 · median(|bg − m̃|)     robust centre and spread (MAD;
 *                                                      1.4826 makes σ̂ = σ for Gaussian noise)
 *   θ = m̃ + c · max(σ̂, ρ · m̃)
 *   keep {J : p[J] > θ}, kMin / B best if fewer pass, ∪ {0, Nb − 1}
 *
 * Why. The noise floor's question, "is this block above the background?", is a test; the
 * mean floor answers it with a threshold at the background's centre, so on a near-uniform
 * background (no signal at all, block masses μ(1 ± a few %)) it keeps about half of the
 * blocks: noise passes on a coin flip, and how many pass grows with Nb, the O(n) failure
 * the noise floor was meant to remove. A test needs a centre AND a spread: a block counts as
 * signal when it is c spreads above the typical background block. Mean and standard
 * deviation would be inflated by the very signal blocks being looked for (one dominant
 * block raises both and masks weaker signals), so the centre is the median and the spread
 * the median absolute deviation, which ignore up to half of the blocks being signal.
 *
 * Behaviour on a near-uniform background: σ̂ is a few percent of m̃, θ sits c of those
 * spreads above it, and about 0.1% of the blocks pass for Gaussian jitter with c = 3, so
 * the kMin / B fallback decides (nothing stands out, keep the minimum) where the mean and
 * median floors keep about Nb / 2. Planted signal blocks a few times the background still
 * pass, and a dominant block does not hide them (it moves neither m̃ nor σ̂).
 *
 * ρ (relative spread floor): an exactly flat background has σ̂ = 0, and θ = m̃ would let
 * blocks that differ from it by float rounding through; ρ · m̃ is the smallest spread taken
 * seriously (default 5% of the median).
 *
 * Limits: with Nb small and more than half of the non-anchor blocks carrying signal, the
 * median sits inside the signal and fewer blocks pass (the fallback still keeps kMin / B);
 * that regime is a diffuse head the router should have sent to PE.
 */
import type { DirectionScores, VsSelector } from '@crisp/core';
import { checkOptions, describeValue, InvalidArgumentError } from '@crisp/core';
import { checkInput, checkKMin } from './checks.js';
import { allBlocks, background, keepAboveWithAnchors, quantile } from './floor.js';

export interface RobustFloorOptions {
  /** c: how many robust spreads above the background median a block must stand. Default 3. c > 0. */
  readonly c?: number;
  /** ρ: the smallest spread, as a fraction of the median (guards an exactly flat background). Default 0.05. ρ >= 0. */
  readonly relSpread?: number;
  /** k_min: tokens per direction kept at least (a positive multiple of B). Default 1024. */
  readonly kMin?: number;
}

export interface RobustFloorSelector extends VsSelector {
  readonly c: number;
  readonly relSpread: number;
  readonly kMin: number;
}

/** θ = m̃ + c · max(σ̂, ρ m̃) over the background blocks (J = 1 .. Nb − 2); Nb >= 3. */
export function robustThreshold(p: ArrayLike<number>, c: number, relSpread: number): number {
  const bg = background(p);
  const med = quantile(bg, 0.5);
  const dev = bg.map((x) => Math.abs(x - med));
  const sigma = 1.4826 * quantile(dev, 0.5);
  return med + c * Math.max(sigma, relSpread * Math.abs(med));
}

/** The robust outlier floor: blocks more than c robust spreads above the background median. */
export function robustFloor(options?: RobustFloorOptions): RobustFloorSelector {
  const opts: RobustFloorOptions = checkOptions(options, 'robustFloor', ['c', 'relSpread', 'kMin']);
  const c = opts.c ?? 3;
  if (typeof c !== 'number' || !Number.isFinite(c) || c <= 0) {
    throw new InvalidArgumentError(`c must be a finite number > 0 (spreads above the background median; 3 is the usual outlier cut); got ${describeValue(c)}`, { c });
  }
  const relSpread = opts.relSpread ?? 0.05;
  if (typeof relSpread !== 'number' || !Number.isFinite(relSpread) || relSpread < 0) {
    throw new InvalidArgumentError(`relSpread must be a finite number >= 0 (a fraction of the background median); got ${describeValue(relSpread)}`, {
      relSpread,
    });
  }
  const kMin = checkKMin(opts.kMin ?? 1024);
  const name = `robustFloor(c=${c})`;
  return Object.freeze({
    name,
    c,
    relSpread,
    kMin,
    select(input: DirectionScores): Int32Array {
      const { Nb, kBlocks } = checkInput(input, name, kMin);
      if (Nb <= 2) return allBlocks(Nb);
      return keepAboveWithAnchors(input.blockScores, robustThreshold(input.blockScores, c, relSpread), kBlocks);
    },
  });
}
