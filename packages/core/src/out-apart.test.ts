/**
 * rangesOverlap and assertOutApart: the memory check behind `options.out`, over ranges a
 * backend's `memoryRange` gives (here a table of them), byte-exact or whole-resource.
 */
import { describe, expect, it } from 'vitest';
import { assertOutApart, type DeviceTensor, isCrispError, type MemoryRange, rangesOverlap } from './index.js';

const bufA = {};
const bufB = {};
const r = (resource: object, start: number, end: number): MemoryRange => ({ resource, start, end });

function tensor(name: string): DeviceTensor {
  return { backend: 'table', dtype: 'f32', shape: [1], disposed: false, dispose() {}, [Symbol.dispose]() {}, toString: () => name } as DeviceTensor;
}

describe('rangesOverlap', () => {
  it('shares a byte only on one resource: adjacent, empty and other-resource ranges do not', () => {
    expect(rangesOverlap(r(bufA, 0, 16), r(bufA, 8, 24))).toBe(true);
    expect(rangesOverlap(r(bufA, 8, 24), r(bufA, 0, 16))).toBe(true);
    expect(rangesOverlap(r(bufA, 0, 64), r(bufA, 16, 32))).toBe(true);
    expect(rangesOverlap(r(bufA, 0, 16), r(bufA, 16, 32))).toBe(false);
    expect(rangesOverlap(r(bufA, 16, 32), r(bufA, 0, 16))).toBe(false);
    expect(rangesOverlap(r(bufA, 0, 16), r(bufB, 0, 16))).toBe(false);
    expect(rangesOverlap(r(bufA, 8, 8), r(bufA, 0, 16))).toBe(false);
  });
});

describe('assertOutApart', () => {
  const [q, k, v, out] = ['q', 'k', 'v', 'out'].map(tensor);
  const table = new Map<DeviceTensor, MemoryRange>([
    [q, r(bufA, 0, 1024)],
    [k, r(bufB, 0, 2048)],
    [v, r(bufB, 2048, 4096)],
  ]);
  const rangeOf = (t: DeviceTensor) => table.get(t)!;
  const names = { entry: 'sparsePrefill', out: 'options.out', inputs: 'inputs.' };
  const errorOf = (fn: () => void) => {
    try {
      fn();
    } catch (e) {
      if (!isCrispError(e)) throw e;
      return e;
    }
    return undefined;
  };

  it('refuses out over an input, naming it and the bytes of it out covers', () => {
    table.set(out, r(bufB, 1024, 3072));
    const e = errorOf(() => assertOutApart(out, { q, k, v }, rangeOf, names));
    expect(e?.code).toBe('INVALID_ARGUMENT');
    expect(e?.details).toEqual({ input: 'k' });
    expect(e?.message).toMatch(/^sparsePrefill: options\.out shares memory with inputs\.k \(it covers bytes \[1024, 2048\) of k's 2048:/);
    table.set(out, r(bufB, 3000, 5000));
    expect(errorOf(() => assertOutApart(out, { q, k, v }, rangeOf, names))?.message).toMatch(/inputs\.v \(it covers bytes \[952, 2048\) of v's 2048/);
  });

  it('takes rows of a shared buffer that touch no input byte, and skips undefined inputs', () => {
    table.set(out, r(bufB, 4096, 5120));
    expect(errorOf(() => assertOutApart(out, { q, k, v }, rangeOf, names))).toBeUndefined();
    table.set(out, r(bufB, 2048, 3072));
    expect(errorOf(() => assertOutApart(out, { q, k, v: undefined }, rangeOf, names))).toBeUndefined();
  });

  it('a wholeResource range conflicts with every input in its resource, whatever the bytes', () => {
    table.set(out, { ...r(bufB, 4096, 5120), wholeResource: true });
    const e = errorOf(() => assertOutApart(out, { q, k, v }, rangeOf, names));
    expect(e?.details).toEqual({ input: 'k' });
    expect(e?.message).toMatch(/^sparsePrefill: options\.out is in the same buffer as inputs\.k \(bytes \[4096, 5120\) of it; k holds \[0, 2048\)\)/);
    table.set(out, { ...r(bufA, 4096, 5120), wholeResource: true });
    expect(errorOf(() => assertOutApart(out, { q, k, v }, rangeOf, names))?.details).toEqual({ input: 'q' });
  });

  it('without a memoryRange, refuses only the same handle', () => {
    expect(errorOf(() => assertOutApart(out, { q, k, v }, undefined, names))).toBeUndefined();
    const e = errorOf(() => assertOutApart(v, { q, k, v }, undefined, { out: 'out' }));
    expect(e?.message).toMatch(/^out is v: the attention reads v while it writes the output/);
  });
});
