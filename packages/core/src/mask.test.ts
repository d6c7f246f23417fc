import { describe, expect, it } from 'vitest';
import {
  type BlockMask,
  argsortDescending,
  assertBlockSize,
  assertSupported,
  attentionShape,
  causalBlockCount,
  denseRows,
  expandToRows,
  isCrispError,
  MaskError,
  blocksPerHead,
  maskDensity,
  selectedBlockCounts,
  spreadRowPtr,
  mulberry32,
  topKIndices,
  unionSorted,
  validateMask,
  vsListsFromArrays,
} from './index.js';

function code(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (e) {
    if (isCrispError(e)) return e.code;
    throw e;
  }
  return undefined;
}
const i32 = (...x: number[]) => Int32Array.from(x);
const rowsOf = (r: { rowPtr: Int32Array; cols: Int32Array }, count: number) =>
  Array.from({ length: count }, (_, i) => Array.from(r.cols.subarray(r.rowPtr[i], r.rowPtr[i + 1])));

describe('validateMask', () => {
  it('with rowEntries: false still checks rowPtr but leaves the entries to the backend', () => {
    // head 0 of 1, Nb 2: row 0 holds block 1 (not causal), row 1 holds 0, 1
    const rows = { rowPtr: Int32Array.of(0, 1, 3), cols: Int32Array.of(1, 0, 1) };
    const mask: BlockMask = { heads: 1, numBlocks: 2, blockSize: 64, rows };
    expect(() => validateMask(mask)).toThrow(MaskError);
    expect(() => validateMask(mask, undefined, { rowEntries: false })).not.toThrow();
    const badPtr: BlockMask = { ...mask, rows: { rowPtr: Int32Array.of(0, 1, 4), cols: rows.cols } };
    expect(() => validateMask(badPtr, undefined, { rowEntries: false })).toThrow(/end at 3/);
  });

  const good: BlockMask = {
    heads: 2,
    numBlocks: 3,
    blockSize: 64,
    vs: { verticalPtr: i32(0, 1, 3), vertical: i32(0, 0, 2), slashPtr: i32(0, 1, 1), slash: i32(1) },
    rows: { rowPtr: i32(0, 1, 1, 2, 2, 4, 4), cols: i32(0, 2, 0, 1) },
  };

  it('accepts a well-formed mixed mask and checks expectations', () => {
    expect(code(() => validateMask(good, { heads: 2, numBlocks: 3, blockSize: 64 }))).toBeUndefined();
    expect(code(() => validateMask(good, { heads: 3 }))).toBe('INVALID_MASK');
    expect(code(() => validateMask(good, { numBlocks: 4 }))).toBe('INVALID_MASK');
    expect(code(() => validateMask(good, { blockSize: 128 }))).toBe('INVALID_MASK');
  });

  it('rejects out-of-range, unsorted, duplicate and non-causal blocks', () => {
    const vs = good.vs!;
    expect(code(() => validateMask({ ...good, vs: { ...vs, vertical: i32(0, 0, 3) } }))).toBe('INVALID_MASK');
    expect(code(() => validateMask({ ...good, vs: { ...vs, vertical: i32(0, 0, -1) } }))).toBe('INVALID_MASK');
    expect(code(() => validateMask({ ...good, vs: { ...vs, slash: i32(3) } }))).toBe('INVALID_MASK');
    expect(code(() => validateMask({ ...good, vs: { ...vs, vertical: i32(0, 2, 0) } }))).toBe('INVALID_MASK');
    expect(code(() => validateMask({ ...good, vs: { ...vs, vertical: i32(0, 1, 1) } }))).toBe('INVALID_MASK');
    // head 0 row 2 holds cols [2]: fine; move a col above its row (row 0 holding 1) -> non-causal
    expect(code(() => validateMask({ ...good, rows: { rowPtr: good.rows!.rowPtr, cols: i32(1, 2, 0, 1) } }))).toBe(
      'INVALID_MASK',
    );
    expect(code(() => validateMask({ ...good, rows: { rowPtr: good.rows!.rowPtr, cols: i32(0, 2, 1, 0) } }))).toBe(
      'INVALID_MASK',
    );
  });

  it('rejects wrong pointer arrays and empty masks', () => {
    const vs = good.vs!;
    expect(code(() => validateMask({ ...good, vs: { ...vs, verticalPtr: i32(0, 3) } }))).toBe('INVALID_MASK');
    expect(code(() => validateMask({ ...good, vs: { ...vs, verticalPtr: i32(0, 1, 2) } }))).toBe('INVALID_MASK');
    expect(code(() => validateMask({ ...good, vs: { ...vs, verticalPtr: i32(0, 2, 1, 3).subarray(1) } }))).toBe(
      'INVALID_MASK',
    );
    expect(code(() => validateMask({ ...good, vs: { ...vs, verticalPtr: [0, 1, 3] as never } }))).toBe('INVALID_MASK');
    expect(code(() => validateMask({ ...good, rows: { rowPtr: i32(0, 1, 1, 2, 2, 4), cols: good.rows!.cols } }))).toBe(
      'INVALID_MASK',
    );
    expect(code(() => validateMask({ ...good, rows: { rowPtr: i32(0, 2, 1, 2, 2, 4, 4), cols: good.rows!.cols } }))).toBe(
      'INVALID_MASK',
    );
    expect(code(() => validateMask({ heads: 2, numBlocks: 3, blockSize: 64 }))).toBe('INVALID_MASK');
    expect(code(() => validateMask({ ...good, numBlocks: 0 }))).toBe('INVALID_MASK');
    expect(code(() => validateMask(null as never))).toBe('INVALID_MASK');
  });
});

describe('expandToRows and density', () => {
  it('expands a mixed mask by hand: vertical J -> (I >= J, J), slash O -> (I >= O, I - O), union with rows', () => {
    // Nb = 4. Head 0: vertical {1}, slash {0, 2}, rows: row 3 adds 0. Head 1: rows only.
    const mask: BlockMask = {
      heads: 2,
      numBlocks: 4,
      blockSize: 64,
      vs: vsListsFromArrays([[1], []], [[2, 0], []]),
      rows: { rowPtr: i32(0, 0, 0, 0, 1, 2, 3, 4, 6), cols: i32(0, 0, 1, 0, 0, 3) },
    };
    const r = expandToRows(mask);
    expect(rowsOf(r, 8)).toEqual([
      [0], // I=0: slash 0 -> 0
      [1], // I=1: vertical 1, slash 0 -> 1
      [0, 1, 2], // I=2: vertical 1, slash 0 -> 2, slash 2 -> 0
      [0, 1, 3], // I=3: vertical 1, slash 0 -> 3, slash 2 -> 1, rows 0
      [0],
      [1],
      [0],
      [0, 3],
    ]);
    const dens = maskDensity(mask);
    expect(Array.from(dens.perHead)).toEqual([8 / 10, 5 / 10]);
    expect(dens.overall).toBeCloseTo(13 / 20, 15);
  });

  it('rows-only density, the dense mask, causalBlockCount, vsListsFromArrays', () => {
    expect(causalBlockCount(5)).toBe(15);
    const dense = denseRows(2, 3);
    expect(rowsOf(dense, 6)).toEqual([[0], [0, 1], [0, 1, 2], [0], [0, 1], [0, 1, 2]]);
    expect(maskDensity({ heads: 2, numBlocks: 3, blockSize: 64, rows: dense }).overall).toBe(1);
    const vs = vsListsFromArrays([[3, 1, 3], [0]], [[], [2, 0]]);
    expect(Array.from(vs.vertical)).toEqual([1, 3, 0]);
    expect(Array.from(vs.verticalPtr)).toEqual([0, 2, 3]);
    expect(Array.from(vs.slash)).toEqual([0, 2]);
    expect(Array.from(vs.slashPtr)).toEqual([0, 0, 2]);
  });
});

describe('attentionShape and capabilities', () => {
  const t = (shape: number[], dtype = 'f32') => ({ shape, dtype }) as never;
  it('describes a valid problem, GQA and chunked', () => {
    expect(attentionShape(t([10, 8, 64]), t([12, 2, 64]), t([12, 2, 64]))).toEqual({
      queries: 10,
      keys: 12,
      heads: 8,
      kvHeads: 2,
      headDim: 64,
      dtype: 'f32',
    });
  });
  it('rejects rank, GQA ratio, dtype mismatch, m > n, v/k and head-dim mismatch, empty', () => {
    expect(code(() => attentionShape(t([10, 64]), t([10, 1, 64]), t([10, 1, 64])))).toBe('SHAPE_MISMATCH');
    expect(code(() => attentionShape(t([10, 1, 64]), t([10, 1, 64, 1]), t([10, 1, 64])))).toBe('SHAPE_MISMATCH');
    expect(code(() => attentionShape(t([10, 6, 64]), t([10, 4, 64]), t([10, 4, 64])))).toBe('SHAPE_MISMATCH');
    expect(code(() => attentionShape(t([10, 4, 64]), t([10, 4, 64], 'f16'), t([10, 4, 64])))).toBe('DTYPE_MISMATCH');
    expect(code(() => attentionShape(t([11, 4, 64]), t([10, 4, 64]), t([10, 4, 64])))).toBe('SHAPE_MISMATCH');
    expect(code(() => attentionShape(t([10, 4, 64]), t([10, 4, 64]), t([9, 4, 64])))).toBe('SHAPE_MISMATCH');
    expect(code(() => attentionShape(t([10, 4, 32]), t([10, 4, 64]), t([10, 4, 64])))).toBe('SHAPE_MISMATCH');
    expect(code(() => attentionShape(t([0, 4, 64]), t([10, 4, 64]), t([10, 4, 64])))).toBe('SHAPE_MISMATCH');
  });
  it('assertSupported and assertBlockSize name the limit', () => {
    const caps = { dtypes: ['f32'], headDims: [64], blockSizes: [64], maxSequence: 100, chunkedPrefill: false, logSumExp: false } as const;
    const s = attentionShape(t([10, 4, 64]), t([10, 4, 64]), t([10, 4, 64]));
    expect(code(() => assertSupported(caps, s, 'x'))).toBeUndefined();
    expect(code(() => assertSupported(caps, { ...s, dtype: 'bf16' }, 'x'))).toBe('UNSUPPORTED');
    expect(code(() => assertSupported(caps, { ...s, headDim: 128 }, 'x'))).toBe('UNSUPPORTED');
    expect(code(() => assertSupported(caps, { ...s, keys: 101, queries: 101 }, 'x'))).toBe('LIMIT_EXCEEDED');
    expect(code(() => assertSupported(caps, { ...s, queries: 5 }, 'x'))).toBe('UNSUPPORTED');
    expect(code(() => assertBlockSize(96))).toBe('INVALID_ARGUMENT');
    expect(code(() => assertBlockSize(128))).toBeUndefined();
  });
});

describe('ranking', () => {
  it('sorts descending, ties to the lower index, NaN last; top-k ascending; union sorted', () => {
    expect(Array.from(argsortDescending([0.5, 0.9, 0.5, Number.NaN, 0.9, 0.1]))).toEqual([1, 4, 0, 2, 5, 3]);
    expect(Array.from(topKIndices([0.5, 0.9, 0.5, 0.2, 0.9], 3))).toEqual([0, 1, 4]);
    expect(Array.from(topKIndices([1, 2], 5))).toEqual([0, 1]);
    // one-pass path: a tie at the top, then a better score: the later tied index goes
    expect(Array.from(topKIndices([5, 5, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 2))).toEqual([0, 2]);
    // the one-pass path (k <= 64, n >= 8k) against the sort definition: ties, -Infinity, NaN
    const seed = (Date.now() ^ 0x9e3779b9) >>> 0;
    const r = mulberry32(seed);
    for (let trial = 0; trial < 60; trial++) {
      const n = 8 + Math.floor(r() * 3000);
      const x = Float64Array.from({ length: n }, () => Math.floor(r() * (trial % 3 === 0 ? 5 : 1e6)) / 7);
      if (trial % 5 === 0) x[Math.floor(r() * n)] = Number.NEGATIVE_INFINITY;
      if (trial % 7 === 0) x[Math.floor(r() * n)] = Number.NaN;
      const k = 1 + Math.floor(r() * 64);
      const expected = Array.from(argsortDescending(x).slice(0, Math.min(k, n))).sort((a, b) => a - b);
      expect(Array.from(topKIndices(x, k)), `seed ${seed} trial ${trial} k ${k}`).toEqual(expected);
    }
    expect(Array.from(unionSorted([5, 1], [3, 1], []))).toEqual([1, 3, 5]);
  });
});

describe('selectedBlockCounts', () => {
  it('equals the count of the expanded rows on random mixed masks', () => {
    const seed = (Date.now() ^ 0x5bd1e995) >>> 0;
    let x = seed || 1;
    const rnd = () => {
      x ^= x << 13;
      x ^= x >>> 17;
      x ^= x << 5;
      return (x >>> 0) / 4294967296;
    };
    for (let trial = 0; trial < 40; trial++) {
      const H = 1 + Math.floor(rnd() * 3);
      const Nb = 1 + Math.floor(rnd() * 24);
      const pick = (p: number) => Array.from({ length: Nb }, (_, i) => i).filter(() => rnd() < p);
      const vertical = Array.from({ length: H }, () => pick(0.3));
      const slash = Array.from({ length: H }, () => pick(0.3));
      const rowPtr = new Int32Array(H * Nb + 1);
      const cols: number[] = [];
      for (let r = 0; r < H * Nb; r++) {
        const I = r % Nb;
        for (let J = 0; J <= I; J++) if (rnd() < 0.25) cols.push(J);
        rowPtr[r + 1] = cols.length;
      }
      const withRows = rnd() < 0.7;
      const mask: BlockMask = {
        heads: H,
        numBlocks: Nb,
        blockSize: 64,
        vs: vsListsFromArrays(vertical, slash),
        rows: withRows ? { rowPtr, cols: Int32Array.from(cols) } : undefined,
      };
      const expected = Array.from(blocksPerHead(expandToRows(mask), H, Nb));
      expect(Array.from(selectedBlockCounts(mask)), `seed ${seed} trial ${trial}`).toEqual(expected);
    }
  });
  it('takes the per-row binary-search path for PE-like heads (few VS lines, near-dense rows) and still counts exactly', () => {
    const seed = (Date.now() ^ 0x2545f491) >>> 0;
    const rnd = mulberry32(seed);
    for (let trial = 0; trial < 12; trial++) {
      const H = 1 + Math.floor(rnd() * 3);
      const Nb = 300 + Math.floor(rnd() * 100);
      // 1-2 verticals and slashes each, some chosen to hit the same blocks
      const lines = () => Array.from(new Set(Array.from({ length: 1 + Math.floor(rnd() * 2) }, () => Math.floor(rnd() * 8)))).sort((a, b) => a - b);
      const vertical = Array.from({ length: H }, lines);
      const slash = Array.from({ length: H }, () => [0, ...lines()]);
      const rowPtr = new Int32Array(H * Nb + 1);
      const cols: number[] = [];
      for (let r = 0; r < H * Nb; r++) {
        const I = r % Nb;
        for (let J = 0; J <= I; J++) if (rnd() < 0.9) cols.push(J);
        rowPtr[r + 1] = cols.length;
      }
      const mask: BlockMask = { heads: H, numBlocks: Nb, blockSize: 64, vs: vsListsFromArrays(vertical, slash), rows: { rowPtr, cols: Int32Array.from(cols) } };
      // the fast path's condition: |V| + |S| well under the mean row length
      expect((mask.vs!.verticalPtr[1] + mask.vs!.slashPtr[1]) * 16).toBeLessThan((rowPtr[Nb] - rowPtr[0]) / Nb);
      const expected = Array.from(blocksPerHead(expandToRows(mask), H, Nb));
      expect(Array.from(selectedBlockCounts(mask)), `seed ${seed} trial ${trial}`).toEqual(expected);
    }
  });
});

describe('spreadRowPtr', () => {
  it('places the listed heads’ rows and leaves the others empty, cols unchanged', () => {
    // rows for heads 1 and 3 of 4, Nb = 2: head 1 rows [0], [0, 1]; head 3 rows [], [1]
    const sub = Int32Array.of(0, 1, 3, 3, 4);
    const rowPtr = spreadRowPtr(sub, [1, 3], 4, 2);
    expect(Array.from(rowPtr)).toEqual([0, 0, 0, 1, 3, 3, 3, 3, 4]);
    const cols = Int32Array.of(0, 0, 1, 1);
    expect(Array.from(blocksPerHead({ rowPtr, cols }, 4, 2))).toEqual([0, 3, 0, 1]);
  });
  it('rejects a rowPtr of the wrong length and unordered heads', () => {
    expect(() => spreadRowPtr(Int32Array.of(0, 1, 2), [0, 1], 3, 2)).toThrow(MaskError);
    expect(() => spreadRowPtr(Int32Array.of(0, 1, 2, 2, 3), [2, 1], 3, 2)).toThrow(MaskError);
  });
});
