import { describe, expect, it } from 'vitest';
import { mulberry32 } from './random.js';
import { sortedUnique, topKIndices, unionSorted } from './ranking.js';

/** Set-and-sort reference for sortedUnique. */
function reference(values: number[]): number[] {
  return [...new Set(values)].sort((a, b) => a - b);
}

describe('ranking helpers', () => {
  it('sortedUnique matches a set-and-sort reference on ascending, unsorted and duplicated lists, and returns a fresh array', () => {
    const seed = Number(process.env.CRISP_SEED ?? Math.floor(Math.random() * 2 ** 31));
    const r = mulberry32(seed);
    for (let t = 0; t < 200; t++) {
      const len = Math.floor(r() * 40);
      const kind = t % 3;
      let vals = Array.from({ length: len }, () => Math.floor(r() * 50));
      if (kind === 0) vals = reference(vals); // strictly ascending: the fast path
      if (kind === 1) vals.sort((a, b) => a - b); // ascending with duplicates
      const input = Int32Array.from(vals);
      const out = sortedUnique(input);
      expect(Array.from(out), `seed ${seed} case ${t}`).toEqual(reference(vals));
      expect(out).not.toBe(input);
    }
    expect(Array.from(sortedUnique([]))).toEqual([]);
    expect(Array.from(sortedUnique([3, 3]))).toEqual([3]);
    expect(Array.from(sortedUnique([5, 1]))).toEqual([1, 5]);
  });

  it('unionSorted and topKIndices keep their tie rule (lower index first)', () => {
    expect(Array.from(unionSorted([4, 1], [1, 9], [0]))).toEqual([0, 1, 4, 9]);
    const scores = Float64Array.from({ length: 100 }, (_, i) => (i % 10 === 3 ? 1 : 0.5));
    expect(Array.from(topKIndices(scores, 3))).toEqual([3, 13, 23]);
    expect(Array.from(topKIndices(scores, 12))).toEqual([0, 1, 3, 13, 23, 33, 43, 53, 63, 73, 83, 93]);
  });
});
