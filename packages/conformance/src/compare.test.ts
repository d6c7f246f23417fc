import { hostTensor } from '@crisp/core';
import { pooledBlockMap } from '@crisp/reference';
import { describe, expect, it } from 'vitest';
import { compareRoutes, comparePeRows, compareSelection, maxMixedError } from './compare.js';
import { caseSeed, gaussian, rng } from './random.js';

const SEED = Number(process.env.CRISP_SEED ?? Math.floor(Math.random() * 2 ** 31));

describe('borderline rules', () => {
  it('VS selection: a flip within tolerance of the boundary passes, a real miss fails', () => {
    // selected {0, 2, 5, 7} by a threshold between 0.10 (best unselected, block 3) and 0.12 (block 2)
    const scores = [0.5, 0.01, 0.12, 0.1, 0.02, 0.2, 0.01, 0.04];
    const ref = [0, 2, 5, 7];
    expect(compareSelection([0, 2, 5, 7], ref, scores, 1e-3)).toEqual({ lines: [], borderline: 0 });
    // extra block 3 scoring 0.10: it is the best unselected block (a count flip) -> borderline
    expect(compareSelection([0, 2, 3, 5, 7], ref, scores, 1e-3).lines).toEqual([]);
    // two extra blocks below the boundary: only one count flip is allowed
    expect(compareSelection([0, 2, 3, 4, 5, 7], ref, scores, 1e-3).lines).toHaveLength(1);
    // missing block 5 (0.2, far above every unselected score, not among the lowest selected) -> fail
    expect(compareSelection([0, 2, 7], ref, scores, 1e-3).lines[0]).toMatch(/missing block 5/);
    // with a tolerance that covers the gap, the flip of block 2 is a score-borderline one
    expect(compareSelection([0, 5, 7], ref, scores, 0.03).lines).toEqual([]);
  });

  it('routes: a flip passes only within tolerance of the threshold', () => {
    const scores = [0.5, 0.2000001, 0.1];
    expect(compareRoutes(['vs', 'pe', 'pe'], ['vs', 'vs', 'pe'], scores, 0.2, 1e-5).lines).toEqual([]);
    expect(compareRoutes(['pe', 'vs', 'pe'], ['vs', 'vs', 'pe'], scores, 0.2, 1e-5).lines[0]).toMatch(/head 0/);
    expect(compareRoutes(['vs', 'pe', 'pe'], ['vs', 'vs', 'pe'], scores, undefined, 1e-5).lines).toHaveLength(1);
  });

  it('PE rows: the reference cut passes; a missing top entry fails; an entry past the cut fails', () => {
    const r = rng(caseSeed(SEED, 'pe'));
    const [n, d, B] = [128, 16, 16];
    const q = hostTensor('f32', [n, 1, d], Array.from({ length: n * d }, () => 2 * gaussian(r)));
    const k = hostTensor('f32', [n, 1, d], Array.from({ length: n * d }, () => 2 * gaussian(r)));
    const map = pooledBlockMap(q, k, B, [0]);
    const gamma = 0.7;
    const Nb = map.numBlocks;
    const toRows = (keep: Set<number>) => {
      const rowPtr = new Int32Array(Nb + 1);
      const cols: number[] = [];
      let f = 0;
      for (let I = 0; I < Nb; I++) {
        for (let J = 0; J <= I; J++) if (keep.has(f++)) cols.push(J);
        rowPtr[I + 1] = cols.length;
      }
      return { rowPtr, cols: Int32Array.from(cols) };
    };
    const order = Array.from(map.order[0]);
    const vals = map.values[0];
    let cum = 0;
    let t = 0;
    while (cum < gamma) cum += vals[order[t++]];
    const refSet = new Set(order.slice(0, t));
    const msg = `seed ${SEED}`;
    expect(comparePeRows(toRows(refSet), map, [0], gamma, 1e-6).lines, msg).toEqual([]);
    const noTop = new Set(refSet);
    noTop.delete(order[0]);
    expect(comparePeRows(toRows(noTop), map, [0], gamma, 1e-6).lines.length, msg).toBeGreaterThan(0);
    // an entry well past the cut (the smallest of all) is not borderline
    const extra = new Set(refSet);
    extra.add(order[order.length - 1]);
    expect(comparePeRows(toRows(extra), map, [0], gamma, 1e-6).lines.join(), msg).toMatch(/extra/);
  });

  it('mixed error: |a - e| / max(1, |e|), NaN counts as Infinity', () => {
    expect(maxMixedError([1.1, 10.5], [1, 10]).error).toBeCloseTo(0.1, 12);
    expect(maxMixedError([0.5, Number.NaN], [0.5, 1]).error).toBe(Number.POSITIVE_INFINITY);
  });
});
