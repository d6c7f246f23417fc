/**
 * Ranged reads (`read`) through the stand-in driver: one cuMemcpyDtoH of exactly the range,
 * from the right device address, past 2^32 elements too (Number arithmetic, never 32-bit).
 */
import { describe, expect, it } from 'vitest';
import { CudaBackend, type CudaTensor } from './index.js';
import { standInDriver } from './stand-in-driver.js';

describe('read(t, elementOffset, count) (stand-in driver)', () => {
  it('copies exactly the range from its device address, beyond 2^32 elements', async () => {
    // the stand-in fills each read with its element index inside the tensor
    let base = 0;
    const s = standInDriver({
      onRead: (out, kind, src) => {
        if (kind !== 'read' || !(out instanceof Uint16Array)) return;
        for (let i = 0; i < out.length; i++) out[i] = ((src - base) / 2 + i) % 65536;
      },
    });
    const be = new CudaBackend(s.libs, { cacheDir: null });
    // a 1M-token q of 32 heads x 128: 2^32 bf16 elements (8 GiB on the stand-in's device)
    const q = be.allocate('bf16', [2 ** 20, 32, 128]) as CudaTensor;
    base = q.ptr;
    const off = 2 ** 32 - 3;
    s.log.length = 0;
    const got = await be.read(q, off, 3);
    expect(s.log).toEqual([{ kind: 'read', bytes: 6, src: q.ptr + off * 2 }]);
    expect(Array.from(got)).toEqual([65533, 65534, 65535]);
    s.log.length = 0;
    const mid = await be.read(q, 2 ** 32 - 2 ** 31, 4);
    expect(s.log[0].src).toBe(q.ptr + 2 ** 32);
    expect(Array.from(mid)).toEqual([0, 1, 2, 3]);
    q.dispose();
    be.dispose();
  });

  it('returns Float32Array for f32, and nothing is copied for an empty range', async () => {
    const s = standInDriver({ onRead: (out) => (out as Float32Array).fill(2.5) });
    const be = new CudaBackend(s.libs, { cacheDir: null });
    const t = be.allocate('f32', [4, 2, 8]);
    s.log.length = 0;
    const got = await be.read(t, 60, 4);
    expect(got).toBeInstanceOf(Float32Array);
    expect(Array.from(got)).toEqual([2.5, 2.5, 2.5, 2.5]);
    expect((await be.read(t, 64, 0)).length).toBe(0);
    expect(s.log.filter((e) => e.kind === 'read')).toHaveLength(1);
    be.dispose();
  });

  it('refuses ranges outside the tensor with INVALID_ARGUMENT before any copy', async () => {
    const s = standInDriver();
    const be = new CudaBackend(s.libs, { cacheDir: null });
    const t = be.allocate('bf16', [2 ** 20, 32, 128]);
    s.log.length = 0;
    for (const [off, count] of [
      [2 ** 32, 1],
      [2 ** 32 - 1, 2],
      [-1, 1],
      [0.5, 1],
      [0, Number.POSITIVE_INFINITY],
    ]) {
      await expect(be.read(t, off, count)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    }
    expect(s.log.filter((e) => e.kind === 'read')).toHaveLength(0);
    t.dispose();
    await expect(be.read(t, 0, 1)).rejects.toMatchObject({ code: 'DISPOSED' });
    be.dispose();
  });
});
