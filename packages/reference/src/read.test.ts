/** Ranged reads (`read`): the counterpart of `write`, checked by the same rule as every backend's. */
import { describe, expect, it } from 'vitest';
import { hostTensor } from '@crisp/core';
import { createReferenceBackend } from './index.js';

describe('read(t, elementOffset, count)', () => {
  it('returns exactly the range, as a copy, in the tensor dtype', async () => {
    const be = createReferenceBackend();
    const values = Array.from({ length: 24 }, (_, i) => i - 7);
    for (const dtype of ['f32', 'f16', 'bf16'] as const) {
      const host = hostTensor(dtype, [4, 2, 3], values);
      const t = be.upload(host);
      const part = await be.read!(t, 5, 11);
      expect(part.constructor).toBe(dtype === 'f32' ? Float32Array : Uint16Array);
      expect(Array.from(part)).toEqual(Array.from(host.data.subarray(5, 16)));
      part.fill(0);
      expect(Array.from(await be.read!(t, 5, 11))).toEqual(Array.from(host.data.subarray(5, 16)));
      expect((await be.read!(t, 24, 0)).length).toBe(0);
      t.dispose();
    }
    be.dispose();
  });

  it('refuses ranges outside the tensor, bad numbers and disposed tensors with typed errors', async () => {
    const be = createReferenceBackend();
    const t = be.upload(hostTensor('f32', [2, 2, 2], [1, 2, 3, 4, 5, 6, 7, 8]));
    for (const [off, count] of [
      [-1, 1],
      [0, 9],
      [8, 1],
      [1.5, 1],
      [0, -1],
      [Number.NaN, 1],
      [2 ** 53, 1],
    ]) {
      await expect(be.read!(t, off, count)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', name: 'InvalidArgumentError' });
    }
    await expect(be.read!(t, 7, 2)).rejects.toThrow(/\[7, 9\) are outside a tensor of 8 elements/);
    t.dispose();
    await expect(be.read!(t, 0, 1)).rejects.toMatchObject({ code: 'DISPOSED' });
    be.dispose();
  });
});
