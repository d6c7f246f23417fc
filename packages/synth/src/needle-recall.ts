/**
 * Needle recall (docs/ALGORITHM.md's metric, selection half): of the planted retrieval needles, the
 * fraction whose key block is selected, for each head that reads the needle, in every query
 * block that attends to it. Whether the output there matches dense is the caller's check
 * (it needs the attention outputs); `queryBlocks` lists the blocks to compare.
 *
 * Shape legend: H heads, B block size, Nb = ceil(n / B); row r = h * Nb + I of the expanded
 * mask holds the key blocks query block I of head h attends to.
 */
import { type BlockMask, type BlockRows, expandToRows, InvalidArgumentError } from '@crisp/core';
import type { GroundTruth } from './scenario.js';

export interface NeedleHit {
  readonly needle: number;
  readonly head: number;
  /** the key block(s) holding the needle's tokens */
  readonly keyBlocks: readonly number[];
  /** query blocks whose rows attend to the needle */
  readonly queryBlocks: readonly number[];
  /** query blocks where some needle key block is not selected */
  readonly missedIn: readonly number[];
  readonly recalled: boolean;
}

export interface NeedleRecall {
  /** recalled (needle, reader head) pairs / all pairs; 1 when there are no needles */
  readonly recall: number;
  readonly recalled: number;
  readonly total: number;
  /** the same over needles the proxy rows can see (askers include the last rows) */
  readonly visibleRecall: number;
  /** (needle, reader head) pairs of those needles */
  readonly visibleTotal: number;
  readonly hits: readonly NeedleHit[];
}

/** What needleRecall reads from a plan: the mask (absent = dense) and its geometry. */
export interface MaskedPlan {
  readonly mask?: BlockMask;
  readonly blockSize: number;
  readonly numBlocks: number;
}

export function needleRecall(plan: MaskedPlan, truth: Pick<GroundTruth, 'needles'>): NeedleRecall {
  const { blockSize: B, numBlocks: Nb } = plan;
  if (!Number.isInteger(B) || B < 1 || !Number.isInteger(Nb) || Nb < 1) {
    throw new InvalidArgumentError(`plan needs a positive blockSize and numBlocks; got ${B}, ${Nb}`);
  }
  const rows: BlockRows | undefined = plan.mask ? expandToRows(plan.mask) : undefined;
  const selected = (h: number, I: number, J: number): boolean => {
    if (!rows) return J <= I; // a dense plan keeps every causal block
    const r = h * Nb + I;
    for (let p = rows.rowPtr[r]; p < rows.rowPtr[r + 1]; p++) if (rows.cols[p] === J) return true;
    return false;
  };
  const hits: NeedleHit[] = [];
  for (const nd of truth.needles) {
    const last = nd.position + nd.length - 1;
    if (last >= Nb * B) {
      throw new InvalidArgumentError(`needle ${nd.id} at ${nd.position} lies beyond the plan's ${Nb * B} tokens`);
    }
    const keyBlocks: number[] = [];
    for (let J = Math.floor(nd.position / B); J <= Math.floor(last / B); J++) keyBlocks.push(J);
    const qb = new Set<number>();
    for (const [a, b] of nd.askers) for (let I = Math.floor(a / B); I <= Math.floor((b - 1) / B); I++) qb.add(I);
    const queryBlocks = [...qb].sort((x, y) => x - y);
    for (const h of nd.readers) {
      if (rows && h >= plan.mask!.heads) throw new InvalidArgumentError(`needle reader head ${h} is not in the plan`);
      const missedIn = queryBlocks.filter((I) => keyBlocks.some((J) => !selected(h, I, J)));
      hits.push({ needle: nd.id, head: h, keyBlocks, queryBlocks, missedIn, recalled: missedIn.length === 0 });
    }
  }
  const recalled = hits.filter((x) => x.recalled).length;
  const visibleIds = new Set(truth.needles.filter((x) => x.visibleToProxy).map((x) => x.id));
  const vis = hits.filter((x) => visibleIds.has(x.needle));
  return {
    recall: hits.length ? recalled / hits.length : 1,
    recalled,
    total: hits.length,
    visibleRecall: vis.length ? vis.filter((x) => x.recalled).length / vis.length : 1,
    visibleTotal: vis.length,
    hits,
  };
}
