/**
 * Hostile input to @crisp/core's host entries, property-based (fast-check): every input either
 * gives the documented result or a CrispError with the exact code, never another exception.
 * Masks: the O(H + blocks) coverage rule against the brute-force expansion. Selector outputs
 * through selectVsLists: valid lists are exactly the sorted, deduplicated values; anything
 * else is a typed error before any Int32Array copy. Tensors: f16 overflow named as such,
 * dtype names looked up as own values only.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  assertCallOptions,
  type BlockMask,
  bytesPerElement,
  castHost,
  type CrispErrorCode,
  describeValue,
  DeviceTensorBase,
  type DirectionScores,
  expandToRows,
  hostTensor,
  isCrispError,
  type ProxyStats,
  type Route,
  selectVsLists,
  validateMask,
  validatePolicy,
  varlenSegments,
  vsListsFromArrays,
  wrapHost,
} from './index.js';

/** The CrispError code `fn` throws, undefined when it returns; any other exception fails the test. */
function codeOf(fn: () => unknown): CrispErrorCode | undefined {
  try {
    fn();
  } catch (e) {
    if (isCrispError(e)) return e.code;
    throw new Error(`not a CrispError: ${String(e)}`, { cause: e });
  }
  return undefined;
}

const runs = { numRuns: 200 };

describe('dtype names and host tensors', () => {
  it('a dtype that is not f32/f16/bf16 is DTYPE_MISMATCH, prototype names included', () => {
    for (const bad of ['__proto__', 'constructor', 'toString', 'hasOwnProperty', 'F32', 'f64', '', 'i32']) {
      expect(codeOf(() => bytesPerElement(bad as never)), bad).toBe('DTYPE_MISMATCH');
      expect(codeOf(() => hostTensor(bad as never, [1], [0])), bad).toBe('DTYPE_MISMATCH');
    }
    fc.assert(
      fc.property(fc.anything(), (x) => {
        const c = codeOf(() => bytesPerElement(x as never));
        expect(c === undefined ? ['f32', 'f16', 'bf16'].includes(x as string) : c === 'DTYPE_MISMATCH').toBe(true);
      }),
      runs,
    );
  });

  it('f16 overflow: a finite value that rounds to Infinity is NON_FINITE naming f16 and the wider dtypes; the rest encode', () => {
    fc.assert(
      fc.property(fc.array(fc.double({ noNaN: true, noDefaultInfinity: true, min: -1e6, max: 1e6 }), { minLength: 1, maxLength: 40 }), (values) => {
        const over = values.findIndex((x) => Math.abs(x) >= 65520); // 65520 and above round past 65504
        try {
          const t = hostTensor('f16', [values.length], values);
          expect(over, 'no value overflows').toBe(-1);
          expect(t.data.length).toBe(values.length);
        } catch (e) {
          expect(isCrispError(e, 'NON_FINITE'), String(e)).toBe(true);
          expect((e as Error).message).toMatch(/overflows f16 \(largest finite 65504\).*use f32 or bf16/);
          expect((e as { details: { index: number } }).details.index).toBe(over);
        }
      }),
      runs,
    );
    // NaN and Infinity given on purpose are kept (the backends reject them when they run)
    expect(codeOf(() => hostTensor('f16', [2], [Number.NaN, Number.POSITIVE_INFINITY]))).toBeUndefined();
    // castHost from f32 overflows the same way; bf16 holds the value
    const big = hostTensor('f32', [2], [1, 1e5]);
    expect(codeOf(() => castHost(big, 'f16'))).toBe('NON_FINITE');
    expect(codeOf(() => castHost(big, 'bf16'))).toBeUndefined();
    expect(codeOf(() => hostTensor('f32', [1], [1e39]))).toBe('NON_FINITE');
  });

  it('values, shapes and storage of the wrong kind are typed errors', () => {
    expect(codeOf(() => hostTensor('f32', [2], ['1', 2] as never))).toBe('INVALID_ARGUMENT');
    expect(codeOf(() => hostTensor('f32', [1], null as never))).toBe('INVALID_ARGUMENT');
    expect(codeOf(() => hostTensor('f32', [1], new BigInt64Array(1) as never))).toBe('INVALID_ARGUMENT');
    expect(codeOf(() => hostTensor('f32', [2, 2], [1, 2, 3]))).toBe('SHAPE_MISMATCH');
    expect(codeOf(() => hostTensor('f32', [1n] as never, [1]))).toBe('SHAPE_MISMATCH');
    expect(codeOf(() => hostTensor('f32', [2 ** 30, 2 ** 30, 2 ** 30] as never, []))).toBe('SHAPE_MISMATCH');
    expect(codeOf(() => wrapHost('f32', [1], [1] as never))).toBe('DTYPE_MISMATCH');
    expect(codeOf(() => castHost(null as never, 'f16'))).toBe('INVALID_ARGUMENT');
    fc.assert(
      fc.property(fc.anything(), fc.anything(), (shape, values) => {
        const c = codeOf(() => hostTensor('f32', shape as never, values as never));
        expect(c === undefined || ['SHAPE_MISMATCH', 'INVALID_ARGUMENT'].includes(c)).toBe(true);
      }),
      runs,
    );
  });

  it('describeValue never throws and stays short', () => {
    const hostile = {
      get constructor() {
        throw new Error('getter');
      },
    };
    expect(describeValue(hostile)).toBe('an unprintable value');
    // a case the property once found: nested arrays of 77-digit BigInts
    const big = 10n ** 76n;
    const nested = [[[[5e-324, -1.33446181516713e-310]], [['     ', -big, big, big, ' ', 1e15]]]];
    expect(describeValue(nested).length).toBeLessThan(320);
    expect(describeValue(big)).toBe(`1${'0'.repeat(23)}…n (a BigInt of 77 characters)`);
    fc.assert(
      fc.property(fc.anything({ withBigInt: true, withTypedArray: true, withMap: true, withSet: true }), (x) => {
        expect(describeValue(x).length).toBeLessThan(320);
      }),
      runs,
    );
  });
});

/** A random structurally valid mask (sorted lists, causal rows), with holes allowed. */
const maskArb = fc
  .record({ H: fc.integer({ min: 1, max: 3 }), Nb: fc.integer({ min: 1, max: 12 }) })
  .chain(({ H, Nb }) => {
    const subset = fc.uniqueArray(fc.integer({ min: 0, max: Nb - 1 }), { maxLength: 4 });
    const rows = fc.array(fc.array(fc.boolean(), { minLength: Nb, maxLength: Nb }), { minLength: H * Nb, maxLength: H * Nb });
    return fc.record({
      H: fc.constant(H),
      Nb: fc.constant(Nb),
      vertical: fc.array(subset, { minLength: H, maxLength: H }),
      slash: fc.array(subset, { minLength: H, maxLength: H }),
      withVs: fc.boolean(),
      rows: fc.option(rows, { nil: undefined }),
      first: fc.integer({ min: 0, max: Nb }),
    });
  })
  .map(({ H, Nb, vertical, slash, withVs, rows, first }) => {
    let rowPart: BlockMask['rows'];
    if (rows || !withVs) {
      const rowPtr = new Int32Array(H * Nb + 1);
      const cols: number[] = [];
      for (let r = 0; r < H * Nb; r++) {
        const I = r % Nb;
        for (let J = 0; J <= I; J++) if (rows?.[r][J]) cols.push(J);
        rowPtr[r + 1] = cols.length;
      }
      rowPart = { rowPtr, cols: Int32Array.from(cols) };
    }
    const mask: BlockMask = { heads: H, numBlocks: Nb, blockSize: 16, vs: withVs ? vsListsFromArrays(vertical, slash) : undefined, rows: rowPart };
    return { mask, first };
  });

describe('device tensor handles', () => {
  class Handle extends DeviceTensorBase {
    readonly backend = 'test';
    protected release(): void {}
  }

  it('keep the dtype and shape they were made with', () => {
    const given = [4, 2, 16];
    const t = new Handle('f32', given);
    given[0] = 100; // the caller's array is copied
    expect(t.shape).toEqual([4, 2, 16]);
    expect(() => {
      (t.shape as number[])[0] = 128;
    }).toThrow(TypeError);
    expect(() => {
      (t as { dtype: string }).dtype = 'bf16';
    }).toThrow(TypeError);
    expect(() => {
      (t as { shape: readonly number[] }).shape = [1];
    }).toThrow(TypeError);
    expect([t.dtype, t.shape]).toEqual(['f32', [4, 2, 16]]);
  });
});

describe('misspelt option, policy and layout keys are refused, not ignored', () => {
  it('names the key and the one it was probably meant to be', () => {
    expect(() => assertCallOptions({ minSparselength: 0 }, 'sparsePrefill')).toThrow(
      /sparsePrefill\(options\): unknown option 'minSparselength' \(did you mean 'minSparseLength'\?\); the options are scale, minSparseLength, returnLse, out/,
    );
    expect(codeOf(() => assertCallOptions({ scale: 0.1, minSparseLength: 0, returnLse: true }, 'sparsePrefill'))).toBeUndefined();
    expect(codeOf(() => assertCallOptions({ returnLse: true }, 'parallelPrefill', ['scale', 'minSparseLength']))).toBe('INVALID_ARGUMENT');
    expect(() => validatePolicy({ name: 'p', dense: true, blocksize: 32 } as never)).toThrow(/policy p: unknown key 'blocksize' \(did you mean 'blockSize'\?\); the keys are name, dense/);
    expect(codeOf(() => validatePolicy({ name: 'p', dense: true, blockSize: 64 }))).toBeUndefined();
    expect(() => varlenSegments({ cuSeqlensQ: [0, 4, 8], cu_seqlens_k: [0, 4, 8] } as never, 8, 8)).toThrow(
      /the varlen layout: unknown key 'cu_seqlens_k' \(did you mean 'cuSeqlensK'\?\); the keys are cuSeqlensQ, cuSeqlensK/,
    );
    expect(varlenSegments({ cuSeqlensQ: [0, 4, 8] }, 8, 8)).toHaveLength(2);
  });
});

describe('mask coverage', () => {
  it('validateMask refuses exactly the masks whose expansion leaves a query block (from firstQueryBlock on) empty', () => {
    fc.assert(
      fc.property(maskArb, ({ mask, first }) => {
        const rows = expandToRows(mask);
        let empty = false;
        for (let h = 0; h < mask.heads; h++) {
          for (let I = first; I < mask.numBlocks; I++) {
            const r = h * mask.numBlocks + I;
            if (rows.rowPtr[r + 1] === rows.rowPtr[r]) empty = true;
          }
        }
        expect(codeOf(() => validateMask(mask, undefined, { firstQueryBlock: first }))).toBe(empty ? 'INVALID_MASK' : undefined);
        // the entry-free form (rowPtr only, as the GPU backends call it) decides the same
        expect(codeOf(() => validateMask(mask, undefined, { firstQueryBlock: first, rowEntries: false }))).toBe(empty ? 'INVALID_MASK' : undefined);
        expect(codeOf(() => validateMask(mask, undefined, { coverage: false }))).toBeUndefined();
      }),
      { numRuns: 400 },
    );
  });

  it('masks of the wrong kind are INVALID_MASK, never a TypeError', () => {
    const good = { heads: 1, numBlocks: 2, blockSize: 16, vs: vsListsFromArrays([[0]], [[]]) };
    for (const bad of [
      { ...good, blockSize: 1.5 },
      { ...good, heads: 2 ** 20, numBlocks: 2 ** 12 },
      { ...good, vs: { ...good.vs, vertical: [0] } },
      { ...good, vs: 3 },
      { ...good, vs: undefined, rows: { rowPtr: Int32Array.of(0, 1, 1), cols: [0] } },
      { ...good, vs: undefined, rows: 'rows' },
    ]) {
      expect(codeOf(() => validateMask(bad as never)), JSON.stringify(bad)).toBe('INVALID_MASK');
    }
    fc.assert(
      fc.property(fc.anything(), (x) => {
        const c = codeOf(() => validateMask(x as never));
        expect(c).toBe('INVALID_MASK');
      }),
      runs,
    );
  });

  it('vsListsFromArrays refuses NaN, fractions, negatives, indices past 2^31 and non-numbers before copying', () => {
    fc.assert(
      fc.property(fc.array(fc.oneof(fc.nat(40), fc.double(), fc.integer({ min: -5, max: -1 }), fc.constant(2 ** 32), fc.string()), { maxLength: 8 }), (list) => {
        const ok = list.every((x) => typeof x === 'number' && Number.isInteger(x) && x >= 0 && x < 2 ** 31);
        const c = codeOf(() => vsListsFromArrays([list as number[]], [[0]]));
        expect(c).toBe(ok ? undefined : 'INVALID_MASK');
        if (ok) expect(Array.from(vsListsFromArrays([list as number[]], [[0]]).vertical)).toEqual([...new Set(list as number[])].sort((a, b) => a - b));
      }),
      runs,
    );
    expect(codeOf(() => vsListsFromArrays([[0]], [] as never))).toBe('INVALID_MASK');
    expect(codeOf(() => vsListsFromArrays(null as never, null as never))).toBe('INVALID_MASK');
  });
});

/** Proxy statistics by hand: H heads, Nb blocks of 16, uniform block scores. */
function statsOf(H: number, Nb: number): ProxyStats {
  const flat = new Float64Array(H * Nb).fill(1 / Nb);
  return {
    n: Nb * 16,
    heads: H,
    blockSize: 16,
    numBlocks: Nb,
    proxyRows: 16,
    cStruct: new Float64Array(H).fill(0.5),
    verticalBlocks: flat,
    slashBlocks: flat,
    pooledEstimate: flat,
    rowEntropy: new Float64Array(H),
  };
}

/** What a selector may return: the code selectVsLists gives for the list itself, and whether it holds block 0. */
type Output = { kind: string; value: unknown; error: CrispErrorCode | undefined; zero: boolean };

function selectorOutput(Nb: number): fc.Arbitrary<Output> {
  const valid = fc.array(fc.integer({ min: 0, max: Nb - 1 }), { maxLength: 2 * Nb });
  const ok = (kind: string, f: (a: number[]) => ArrayLike<number>) =>
    valid.map((a) => {
      const value = f(a);
      return { kind, value, error: undefined, zero: Array.from(value).includes(0) };
    });
  const bad = (kind: string, f: (a: number[]) => unknown, error: CrispErrorCode = 'INVALID_MASK') =>
    valid.map((a) => ({ kind, value: f(a), error, zero: false }));
  return fc.oneof(
    ok('any order with duplicates', (a) => a),
    ok('block 0 and more, any order', (a) => [...a, 0]),
    ok('an Int32Array', (a) => Int32Array.from(a)),
    ok('a Float64Array of integers', (a) => Float64Array.from(a)),
    fc.constant({ kind: 'a huge array of zeros', value: new Array(50_000).fill(0), error: undefined, zero: true }),
    fc.constant({ kind: 'empty', value: new Int32Array(0), error: undefined, zero: false }),
    fc.constant({ kind: 'the last block only', value: Int32Array.of(Nb - 1), error: undefined, zero: Nb === 1 }),
    bad('NaN', (a) => [...a, Number.NaN]),
    bad('a fraction', (a) => Float64Array.from([...a, 0.5])),
    bad('a negative index', (a) => Int32Array.from([...a, -1])),
    bad('Nb', (a) => [...a, Nb]),
    bad('2^32 (0 once in an Int32Array)', (a) => [...a, 2 ** 32]),
    bad('a string', (a) => [...a, '1']),
    bad('undefined', () => undefined, 'INVALID_ARGUMENT'),
    bad('a number', () => 3, 'INVALID_ARGUMENT'),
    bad('a Promise', () => Promise.resolve(Int32Array.of(0)), 'INVALID_ARGUMENT'),
    bad('a throw', () => new Error('selector bug'), 'INVALID_ARGUMENT'),
  );
}

describe('selector outputs through selectVsLists', () => {
  it('valid outputs become their sorted, deduplicated lists; anything else is the exact typed error', () => {
    const arb = fc.integer({ min: 1, max: 16 }).chain((Nb) =>
      fc.record({
        Nb: fc.constant(Nb),
        H: fc.integer({ min: 1, max: 3 }),
        vertical: selectorOutput(Nb),
        slash: selectorOutput(Nb),
        routes: fc.array(fc.constantFrom<Route>('vs', 'pe'), { minLength: 3, maxLength: 3 }),
      }),
    );
    fc.assert(
      fc.property(arb, ({ Nb, H, vertical, slash, routes }) => {
        const selector = {
          name: 'hostile',
          select(input: DirectionScores): Int32Array {
            const o = input.direction === 'vertical' ? vertical : slash;
            if (o.value instanceof Error) throw o.value;
            return o.value as Int32Array;
          },
        };
        const r = routes.slice(0, H);
        // the vertical list is checked first, then the slash list, then coverage (block 0 in one of them)
        let want: CrispErrorCode | undefined;
        if (r.includes('vs')) want = vertical.error ?? slash.error ?? (vertical.zero || slash.zero ? undefined : 'INVALID_MASK');
        const stats = statsOf(H, Nb);
        let lists: ReturnType<typeof selectVsLists> | undefined;
        const c = codeOf(() => {
          lists = selectVsLists(stats, r, selector, 1);
        });
        expect(c, `${vertical.kind} / ${slash.kind}, routes ${r}`).toBe(want);
        if (lists) {
          const h = r.indexOf('vs');
          if (h >= 0) {
            const got = Array.from(lists.vertical.subarray(lists.verticalPtr[h], lists.verticalPtr[h + 1]));
            expect(got).toEqual([...new Set(Array.from(vertical.value as ArrayLike<number>))].sort((a, b) => a - b));
          }
          expect(codeOf(() => validateMask({ heads: H, numBlocks: Nb, blockSize: 16, vs: lists }))).toBeUndefined();
        }
      }),
      { numRuns: 300 },
    );
  });

  it('a selector that throws is wrapped with its name and keeps the cause', () => {
    const cause = new RangeError('off by one');
    const selector = {
      name: 'mine',
      select(): Int32Array {
        throw cause;
      },
    };
    try {
      selectVsLists(statsOf(1, 4), ['vs'], selector, 1);
      expect.unreachable();
    } catch (e) {
      expect(isCrispError(e, 'INVALID_ARGUMENT')).toBe(true);
      expect((e as Error).message).toMatch(/^selector mine threw RangeError: off by one/);
      expect((e as Error).cause).toBe(cause);
    }
  });
});
