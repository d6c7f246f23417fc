/** Fixed-budget baseline: the k best blocks of a direction, whatever the input. */
import { type DirectionScores, InvalidArgumentError, topKIndices, unionSorted, type VsSelector } from '@crisp/core';
import { checkInput } from './checks.js';

export interface TopKOptions {
  /** k: blocks kept per direction (clipped to Nb). A positive integer. */
  readonly k: number;
  /** also keep both end blocks (sink/local, diagonal): default true, so every query block keeps its diagonal */
  readonly keepAnchors?: boolean;
}

export interface TopKSelector extends VsSelector {
  readonly k: number;
  readonly keepAnchors: boolean;
}

/** The k best block scores (ties toward the lower index), ∪ {0, Nb − 1} unless keepAnchors is false. */
export function topK(opts: TopKOptions): TopKSelector {
  const k = opts?.k;
  if (typeof k !== 'number' || !Number.isInteger(k) || k < 1) {
    throw new InvalidArgumentError(`topK: k must be a positive integer number of blocks; got ${String(k)}`, { k });
  }
  const keepAnchors = opts.keepAnchors ?? true;
  const name = `topK(k=${k})`;
  return Object.freeze({
    name,
    k,
    keepAnchors,
    select(input: DirectionScores): Int32Array {
      // B is checked; topK has no kMin of its own, so pass the block size (always a multiple).
      const { Nb } = checkInput(input, name, input?.blockSize);
      const best = topKIndices(input.blockScores, k);
      return keepAnchors ? unionSorted(best, [0, Nb - 1]) : best;
    },
  });
}
