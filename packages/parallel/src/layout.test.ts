import { describe, expect, it } from 'vitest';
import { shardFromRows, shardPositions, shardRows, shardTensor, unshardTensor, zigzagLayout } from './layout.js';

describe('zigzagLayout', () => {
  for (const [n, P, B] of [
    [1000, 2, 64],
    [1337, 3, 64],
    [2048, 4, 128],
    [5000, 8, 64],
    [300, 3, 64],
  ] as const) {
    it(`n=${n}, P=${P}, B=${B}: every block on one rank, ranges block-aligned, the causal work balanced`, () => {
      const L = zigzagLayout(n, P, B);
      const Nb = Math.ceil(n / B);
      expect(L.numBlocks).toBe(Nb);
      const seen = new Int32Array(n);
      const work = new Array<number>(P).fill(0);
      for (let r = 0; r < P; r++) {
        expect(L.ranges[r].length).toBeGreaterThanOrEqual(1);
        expect(L.ranges[r].length).toBeLessThanOrEqual(2);
        for (const { start, end } of L.ranges[r]) {
          expect(start % B).toBe(0);
          expect(end === n || end % B === 0).toBe(true);
          for (let p = start; p < end; p++) {
            seen[p]++;
            work[r] += p + 1; // causal keys of row p
            expect(L.owner[Math.floor(p / B)]).toBe(r);
          }
        }
        expect(Array.from(shardPositions(L, r))).toEqual(L.ranges[r].flatMap(({ start, end }) => Array.from({ length: end - start }, (_, i) => start + i)));
      }
      expect(seen.every((x) => x === 1)).toBe(true);
      // zig-zag: the busiest rank does at most 1.35x the mean causal work once each holds 4+ blocks
      if (Nb >= 4 * P) expect(Math.max(...work) / (work.reduce((a, b) => a + b) / P)).toBeLessThan(1.35);
    });
  }

  it('refuses more ranks than blocks, and bad sizes', () => {
    expect(() => zigzagLayout(100, 4, 64)).toThrow(/too few for 4 ranks/);
    expect(() => zigzagLayout(0, 2, 64)).toThrow(/positive integer/);
    expect(() => zigzagLayout(100, 1.5, 64)).toThrow(/positive integer/);
  });

  it('shardFromRows reads only the rank\'s ranges and equals shardTensor of the whole', () => {
    const L = zigzagLayout(777, 3, 64);
    const data = Uint16Array.from({ length: 777 * 2 * 3 }, (_, i) => (i * 7919) & 0xffff);
    const whole = { dtype: 'bf16' as const, shape: [777, 2, 3], data };
    for (let r = 0; r < 3; r++) {
      const asked: [number, number][] = [];
      const shard = shardFromRows(L, r, (start, end) => {
        asked.push([start, end]);
        return { dtype: 'bf16', shape: [end - start, 2, 3], data: data.slice(start * 6, end * 6) };
      });
      expect(asked).toEqual(L.ranges[r].map((x) => [x.start, x.end]));
      expect(shard.shape).toEqual([shardRows(L, r), 2, 3]);
      expect(Array.from(shard.data)).toEqual(Array.from(shardTensor(L, r, whole).data));
    }
    expect(() => shardFromRows(L, 3, () => whole)).toThrow(/rank must be an integer in \[0, 3\)/);
    expect(() => shardFromRows(L, 0, (start) => ({ dtype: 'bf16', shape: [1, 2, 3], data: data.slice(start * 6, start * 6 + 6) }))).toThrow(
      /gave 1 rows/,
    );
  });

  it('shardTensor and unshardTensor are inverse', () => {
    const L = zigzagLayout(777, 3, 64);
    const data = Float32Array.from({ length: 777 * 2 * 3 }, (_, i) => i * 0.5 - 7);
    const whole = { dtype: 'f32' as const, shape: [777, 2, 3], data };
    const shards = [0, 1, 2].map((r) => shardTensor(L, r, whole));
    for (const [r, s] of shards.entries()) expect(s.shape).toEqual([shardRows(L, r), 2, 3]);
    expect(Array.from(unshardTensor(L, shards).data)).toEqual(Array.from(data));
  });
});
