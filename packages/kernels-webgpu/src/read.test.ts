/**
 * Ranged reads (`read`) on whatever adapter Dawn finds (SwiftShader in CI): the range through
 * a staging buffer of its own, f16 ranges at odd elements and of odd lengths included.
 */
import { hostTensor } from '@crisp/core';
import { describe, expect, it } from 'vitest';
import { sharedBackend } from './test-support.js';

const { backend, reason } = await sharedBackend();

describe.skipIf(!backend)(`read(t, elementOffset, count)${reason ? ` (skipped: ${reason})` : ''}`, () => {
  it('returns exactly the range for f32 and f16, at any offset and length', async () => {
    const be = backend!;
    const values = Array.from({ length: 70 }, (_, i) => (i % 13) - 6.5 + i / 64);
    for (const dtype of ['f32', 'f16'] as const) {
      const host = hostTensor(dtype, [5, 2, 7], values);
      const t = be.upload(host);
      for (const [off, count] of [
        [0, 70],
        [1, 1],
        [3, 5],
        [2, 4],
        [69, 1],
        [33, 34],
        [70, 0],
      ]) {
        const got = await be.read(t, off, count);
        expect(got.constructor).toBe(dtype === 'f32' ? Float32Array : Uint16Array);
        expect(Array.from(got), `${dtype} [${off}, ${off + count})`).toEqual(Array.from(host.data.subarray(off, off + count)));
      }
      await expect(be.read(t, 69, 2)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
      await expect(be.read(t, -1, 1)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
      t.dispose();
      await expect(be.read(t, 0, 1)).rejects.toMatchObject({ code: 'DISPOSED' });
    }
  });

  it('reads a sliceRows view at its own offset, aligned or copied', async () => {
    const be = backend!;
    const rows = 300;
    const values = Array.from({ length: rows * 2 * 4 }, (_, i) => (i % 97) - 48);
    for (const dtype of ['f32', 'f16'] as const) {
      const host = hostTensor(dtype, [rows, 2, 4], values);
      const t = be.upload(host);
      for (const start of [0, 1, 32, 64, 128, 299]) {
        const view = be.sliceRows(t, start, rows - start);
        const n = (rows - start) * 8;
        for (const [off, count] of [
          [0, n],
          [1, Math.min(5, n - 1)],
          [n - 1, 1],
        ]) {
          if (count <= 0) continue;
          const got = await be.read(view, off, count);
          expect(Array.from(got), `${dtype} rows from ${start}, [${off}, ${off + count})`).toEqual(Array.from(host.data.subarray(start * 8 + off, start * 8 + off + count)));
        }
        view.dispose();
      }
      t.dispose();
    }
  });
});
