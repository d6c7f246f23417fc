/**
 * Ground truth on the block grid: which causal blocks (I, J) of a head hold the signal a
 * scenario planted (@crisp/synth's truth), and which of those a plan left out. The report
 * draws the missed ones over its block-mask heatmaps.
 *
 * Signal blocks of head h (B tokens a block, Nb blocks, J <= I always):
 *   - the sink column J = 0 and the local diagonal J = I (every head);
 *   - slash heads: the blocks each slash line i - j = offset crosses;
 *   - vertical heads: the key blocks of their kv head's stripe tokens, in every later query block;
 *   - needle readers: the needle's key blocks in the query blocks of its askers.
 */
import type { BlockRows } from '@crisp/core';
import type { GroundTruth } from '@crisp/synth';

export type TruthView = Pick<GroundTruth, 'heads' | 'needles'> & Partial<Pick<GroundTruth, 'stripes'>>;

/** Sorted, distinct [I, J] pairs of head h's signal blocks. */
export function signalBlocks(truth: TruthView, h: number, B: number, Nb: number): [number, number][] {
  const ht = truth.heads[h];
  if (!ht) return [];
  const set = new Set<number>();
  const add = (I: number, J: number) => {
    if (I >= 0 && I < Nb && J >= 0 && J <= I) set.add(I * Nb + J);
  };
  for (let I = 0; I < Nb; I++) {
    add(I, 0);
    add(I, I);
  }
  if (ht.kind === 'slash') {
    for (const off of ht.slashOffsets) {
      for (let I = 0; I < Nb; I++) {
        // rows i in [I·B, I·B + B - 1] read key j = i - off
        const lo = Math.floor((I * B - off) / B);
        const hi = Math.floor((I * B + B - 1 - off) / B);
        for (let J = lo; J <= hi; J++) add(I, J);
      }
    }
  }
  if (ht.kind === 'vertical' && truth.stripes) {
    for (const t of truth.stripes[ht.kvHead] ?? []) {
      const J = Math.floor(t / B);
      for (let I = J; I < Nb; I++) add(I, J);
    }
  }
  for (const nd of truth.needles) {
    if (!nd.readers.includes(h)) continue;
    const keys: number[] = [];
    for (let J = Math.floor(nd.position / B); J <= Math.floor((nd.position + nd.length - 1) / B); J++) keys.push(J);
    for (const [a, b] of nd.askers) for (let I = Math.floor(a / B); I <= Math.floor((b - 1) / B); I++) for (const J of keys) add(I, J);
  }
  return [...set].sort((x, y) => x - y).map((k) => [Math.floor(k / Nb), k % Nb]);
}

/** Head h's signal blocks the plan's rows leave out ([I, J], sorted). A dense plan (no rows) misses none. */
export function missedSignalBlocks(rows: BlockRows | undefined, truth: TruthView, h: number, B: number, Nb: number): [number, number][] {
  if (!rows) return [];
  return signalBlocks(truth, h, B, Nb).filter(([I, J]) => {
    const r = h * Nb + I;
    for (let p = rows.rowPtr[r]; p < rows.rowPtr[r + 1]; p++) if (rows.cols[p] === J) return false;
    return true;
  });
}
