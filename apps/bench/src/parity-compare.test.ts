import type { BlockMask } from '@crisp/core';
import { describe, expect, it } from 'vitest';
import { compareLayer, countSet, headBitmap, jaccard, selectionsFromFlat, selectionsFromMask } from './parity-compare.js';

// Nb = 4: the causal grid has 10 blocks; flat index I * 4 + J.
const cells = (m: Uint8Array) => [...m.keys()].filter((i) => m[i] === 1);

describe('headBitmap', () => {
  it('expands vertical columns, slash diagonals and flat blocks inside the causal triangle', () => {
    expect(cells(headBitmap({ vertical: [0] }, 4))).toEqual([0, 4, 8, 12]);
    expect(cells(headBitmap({ slash: [0] }, 4))).toEqual([0, 5, 10, 15]);
    expect(cells(headBitmap({ slash: [2] }, 4))).toEqual([8, 13]);
    // 2 = (0, 2) is above the diagonal: ignored; 16 is off the grid
    expect(cells(headBitmap({ blocks: [2, 9, 9, 16] }, 4))).toEqual([9]);
    expect(countSet(headBitmap({ vertical: [0], slash: [0] }, 4))).toBe(7);
  });
});

describe('jaccard', () => {
  it('is |A ∩ B| / |A ∪ B|', () => {
    const a = headBitmap({ vertical: [0] }, 4); // 0 4 8 12
    const b = headBitmap({ slash: [0] }, 4); // 0 5 10 15
    expect(jaccard(a, b)).toBeCloseTo(1 / 7, 12);
    expect(jaccard(a, a)).toBe(1);
    expect(jaccard(new Uint8Array(16), new Uint8Array(16))).toBe(1);
  });
});

describe('selections', () => {
  it('reads a plan mask: VS lists per head and BSR rows as flat indices', () => {
    const mask: BlockMask = {
      heads: 2,
      numBlocks: 4,
      blockSize: 128,
      vs: { verticalPtr: Int32Array.from([0, 1, 1]), vertical: Int32Array.from([0]), slashPtr: Int32Array.from([0, 1, 2]), slash: Int32Array.from([0, 0]) },
      // head 1: row 2 keeps key block 0, row 3 keeps key blocks 1 and 2
      rows: { rowPtr: Int32Array.from([0, 0, 0, 0, 0, 0, 0, 1, 3]), cols: Int32Array.from([0, 1, 2]) },
    };
    const s = selectionsFromMask(mask);
    expect(Array.from(s[0].vertical!)).toEqual([0]);
    expect(s[0].blocks).toBeUndefined();
    expect(Array.from(s[1].blocks!)).toEqual([8, 13, 14]);
    expect(cells(headBitmap(s[1], 4))).toEqual([0, 5, 8, 10, 13, 14, 15]);
  });

  it('splits concatenated flat lists by per-head offsets', () => {
    const s = selectionsFromFlat(Int32Array.from([0, 5, 0, 4, 8]), [0, 2, 5]);
    expect(s.map((x) => Array.from(x.blocks!))).toEqual([[0, 5], [0, 4, 8]]);
  });
});

describe('compareLayer', () => {
  it('route agreement, Jaccard per head and densities', () => {
    const r = compareLayer(
      4,
      { routes: ['vs', 'pe'], selections: [{ vertical: [0], slash: [0] }, { slash: [0] }] },
      { routes: ['vs', 'vs'], selections: [{ blocks: [0, 4, 8, 12, 5, 10, 15] }, { blocks: [0, 5, 10, 15, 4] }] },
    );
    expect(r.routeAgreement).toBe(0.5);
    expect(r.heads[0].jaccard).toBe(1);
    expect(r.heads[1].jaccard).toBeCloseTo(4 / 5, 12);
    expect(r.meanJaccard).toBeCloseTo(0.9, 12);
    expect(r.meanJaccardSameRoute).toBe(1);
    expect(r.meanJaccardOtherRoute).toBeCloseTo(0.8, 12);
    expect(r.heads.map((x) => x.oursDensity)).toEqual([0.7, 0.4]);
    expect(r.heads.map((x) => x.theirsDensity)).toEqual([0.7, 0.5]);
    expect(r.oursDensity).toBeCloseTo(0.55, 12);
    expect(r.theirsDensity).toBeCloseTo(0.6, 12);
    expect(r.meanAbsDensityDiff).toBeCloseTo(0.05, 12);
  });

  it('with densities only: density difference, no Jaccard, no routes', () => {
    const r = compareLayer(4, { routes: ['vs'], selections: [{ slash: [0] }] }, { densities: [0.1] });
    expect(r.heads[0].jaccard).toBeUndefined();
    expect(r.meanJaccard).toBeUndefined();
    expect(r.routeAgreement).toBeUndefined();
    expect(r.meanAbsDensityDiff).toBeCloseTo(0.3, 12);
  });

  it('refuses a head count that differs', () => {
    expect(() => compareLayer(4, { routes: ['vs', 'vs'], selections: [{}, {}] }, { densities: [0.1] })).toThrow(/1 heads; ours has 2/);
  });
});
