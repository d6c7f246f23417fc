/** Fixed-budget baseline: the k best blocks of a direction, whatever the input. */
import { checkOptions, describeValue, type DirectionScores, InvalidArgumentError, topKIndices, unionSorted, type VsSelector } from '@crisp/core';
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
export function topK(options: TopKOptions): TopKSelector {
  if (options === undefined) throw new InvalidArgumentError('topK(options): k is required ({ k: a positive integer number of blocks })');
  const opts: Partial<TopKOptions> = checkOptions(options, 'topK', ['k', 'keepAnchors']);
  const k = opts.k;
  if (typeof k !== 'number' || !Number.isInteger(k) || k < 1) {
    throw new InvalidArgumentError(`topK: k must be a positive integer number of blocks; got ${describeValue(k)}`, { k });
  }
  const keepAnchors = opts.keepAnchors ?? true;
  if (typeof keepAnchors !== 'boolean') {
    throw new InvalidArgumentError(`topK: keepAnchors must be true or false; got ${describeValue(keepAnchors)}`);
  }
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
