/**
 * Parameter and input checks shared by the selectors. Selectors are public entry points
 * that users call directly too, so every input is validated before any work.
 *
 * Shape legend: n keys, B block size, Nb = ceil(n / B) blocks.
 */
import { describeValue, type DirectionScores, InvalidArgumentError, NonFiniteError, ShapeError } from '@crisp/core';

export function checkAlpha(alpha: unknown, name = 'alpha'): number {
  if (typeof alpha !== 'number' || !Number.isFinite(alpha) || alpha <= 0) {
    throw new InvalidArgumentError(`${name} must be a finite number > 0 (1.0 keeps blocks above the mean background); got ${describeValue(alpha)}`, {
      [name]: alpha,
    });
  }
  return alpha;
}

export function checkGamma(gamma: unknown): number {
  if (typeof gamma !== 'number' || !Number.isFinite(gamma) || gamma <= 0 || gamma >= 1) {
    throw new InvalidArgumentError(`gamma must be in (0, 1) (FlexPrefill uses 0.95); got ${describeValue(gamma)}`, { gamma });
  }
  return gamma;
}

export function checkKMin(kMin: unknown): number {
  if (typeof kMin !== 'number' || !Number.isInteger(kMin) || kMin < 1) {
    throw new InvalidArgumentError(
      `kMin must be a positive integer number of tokens, a multiple of the block size (default 1024 = 8 blocks of 128); got ${describeValue(kMin)}`,
      { kMin },
    );
  }
  return kMin;
}

/**
 * Validate one direction's input and return Nb and the minimum block count kMin / B.
 * kMin must be a positive multiple of B: a budget that is not a whole number of blocks
 * would be rounded one way or the other silently.
 */
export function checkInput(input: DirectionScores, selector: string, kMin: number): { Nb: number; kBlocks: number } {
  if (!input || typeof input !== 'object') {
    throw new InvalidArgumentError(`selector ${selector}: input must be a DirectionScores object`);
  }
  const { blockScores: p, blockSize: B, n } = input;
  if (!Number.isInteger(B) || B < 1) throw new InvalidArgumentError(`selector ${selector}: blockSize must be a positive integer; got ${describeValue(B)}`);
  if (!Number.isSafeInteger(n) || n < 1) throw new InvalidArgumentError(`selector ${selector}: n must be a positive integer; got ${describeValue(n)}`);
  const Nb = Math.ceil(n / B);
  if (!p || typeof p !== 'object' || p.length !== Nb) {
    throw new ShapeError(`selector ${selector}: blockScores must hold Nb = ceil(n / B) = ${Nb} values; got ${describeValue(p)}`);
  }
  for (let i = 0; i < Nb; i++) {
    if (!Number.isFinite(p[i])) {
      throw new NonFiniteError(`selector ${selector}: blockScores[${i}] is ${p[i]} (head ${input.head}, ${input.direction}); q or k holds NaN/Inf`, {
        index: i,
      });
    }
  }
  if (kMin % B !== 0) {
    throw new InvalidArgumentError(
      `selector ${selector}: kMin = ${kMin} tokens is not a multiple of the block size ${B}; use ${Math.max(1, Math.round(kMin / B)) * B}`,
      { kMin, blockSize: B },
    );
  }
  return { Nb, kBlocks: kMin / B };
}
