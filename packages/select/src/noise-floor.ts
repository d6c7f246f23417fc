/**
 * CRISP's sink-aware noise floor (the paper's Algorithm 3), the VS-path replacement of
 * FlexPrefill's γ coverage.
 *
 * Softmax puts a mass cliff between the anchors (sink, local window: often > 0.9 of the
 * mass), the task's signal blocks, and a background of blocks whose mass is ε ≈ 1/n each.
 * The floor asks "is this block above the average background?" instead of "how far am I
 * from γ?":
 *
 *   μ = max(1 − p[0] − p[Nb−1], 0) / (Nb − 2)      the mean non-anchor block mass
 *   keep {J : p[J] > α · μ}
 *
 * and if fewer than kMin / B blocks pass, the kMin / B best by score instead; both end
 * blocks are always kept. The number kept is set by the input (how many blocks stand above
 * the background), not by n: a larger sink makes μ smaller and the floor more sensitive,
 * where γ would stop inside the sink.
 */
import type { DirectionScores, VsSelector } from '@crisp/core';
import { checkOptions } from '@crisp/core';
import { checkAlpha, checkInput, checkKMin } from './checks.js';
import { allBlocks, keepAboveWithAnchors } from './floor.js';

export interface NoiseFloorOptions {
  /** α: keep blocks above α · μ. 1.0 (accuracy, the paper's default), 1.25 (speed). α > 0. */
  readonly alpha?: number;
  /** k_min: tokens per direction kept at least (a positive multiple of B). Default 1024. */
  readonly kMin?: number;
}

export interface NoiseFloorSelector extends VsSelector {
  readonly alpha: number;
  readonly kMin: number;
}

/** μ = max(1 − p[0] − p[Nb−1], 0) / (Nb − 2), the mean background block mass (Nb >= 3). */
export function meanBackground(p: ArrayLike<number>): number {
  const Nb = p.length;
  return Math.max(1 - p[0] - p[Nb - 1], 0) / (Nb - 2);
}

/** The noise-floor selector: {J : p[J] > α μ} (kMin / B best if fewer), ∪ {0, Nb − 1}. */
export function noiseFloor(options?: NoiseFloorOptions): NoiseFloorSelector {
  const opts: NoiseFloorOptions = checkOptions(options, 'noiseFloor', ['alpha', 'kMin']);
  const alpha = checkAlpha(opts.alpha ?? 1.0);
  const kMin = checkKMin(opts.kMin ?? 1024);
  const name = `noiseFloor(alpha=${alpha})`;
  const selector = {
    name,
    alpha,
    kMin,
    select(input: DirectionScores): Int32Array {
      const { Nb, kBlocks } = checkInput(input, name, kMin);
      if (Nb <= 2) return allBlocks(Nb);
      return keepAboveWithAnchors(input.blockScores, alpha * meanBackground(input.blockScores), kBlocks);
    },
  };
  // The same rule for backends that select on the device (@crisp/core DeviceSelectorRule).
  // Not enumerable, so `{ ...noiseFloor(), select: mine }` does not carry it: a selector with
  // its own select() must not be replaced by this rule on the device.
  Object.defineProperty(selector, 'device', { value: Object.freeze({ kind: 'noiseFloor' as const, alpha, kMin }), enumerable: false });
  return Object.freeze(selector) as NoiseFloorSelector;
}
