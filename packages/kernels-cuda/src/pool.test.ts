import { describe, expect, it } from 'vitest';
import type { CudaLibs } from './runtime/ffi.js';
import { DevicePool, sizeClass } from './runtime/pool.js';

/** A driver stand-in: allocations at increasing addresses, frees recorded (no GPU needed). */
function fakeLibs() {
  let next = 1 << 20;
  const live = new Map<number, number>();
  const freed: number[] = [];
  const cu = {
    cuMemAlloc: (out: number[], size: number) => {
      out[0] = next;
      live.set(next, size);
      next += size + 4096;
      return 0;
    },
    cuMemFree: (p: number) => {
      if (!live.has(p)) throw new Error(`cuMemFree(${p}): not a driver allocation`);
      live.delete(p);
      freed.push(p);
      return 0;
    },
    cuCtxSynchronize: () => 0,
  };
  return { libs: { cu } as unknown as CudaLibs, live, freed };
}

describe('DevicePool.allocBatch', () => {
  it('serves a run of blocks from one driver allocation and counts one miss', () => {
    const { libs, live } = fakeLibs();
    const pool = new DevicePool(libs);
    const bytes = 787_200;
    const a = pool.allocBatch(bytes, 4);
    const b = pool.allocBatch(bytes, 4);
    const c = pool.allocBatch(bytes, 4);
    const d = pool.allocBatch(bytes, 4);
    expect(pool.misses).toBe(1);
    expect(live.size).toBe(1);
    const ptrs = [a, b, c, d].map((x) => x.ptr).sort((x, y) => x - y);
    const size = sizeClass(bytes);
    // four distinct, non-overlapping blocks of the slab
    for (let i = 1; i < 4; i++) expect(ptrs[i] - ptrs[i - 1]).toBe(size);
    expect(pool.liveBytes).toBe(4 * size);
    expect(pool.pooledBytes).toBe(0);
    // a fifth is a new slab
    pool.allocBatch(bytes, 4);
    expect(pool.misses).toBe(2);
  });

  it('trim frees a slab only once all its blocks are back, and never a carved block on its own', () => {
    const { libs, live, freed } = fakeLibs();
    const pool = new DevicePool(libs);
    const a = pool.allocBatch(1000, 3);
    const b = pool.allocBatch(1000, 3);
    const plain = pool.alloc(5000);
    pool.release(plain);
    pool.release(a);
    pool.trim(); // b still live: the slab stays, its pooled blocks stay pooled
    expect(freed).toEqual([plain.ptr]);
    expect(live.size).toBe(1);
    expect(pool.pooledBytes).toBe(2 * sizeClass(1000));
    // the pooled blocks are still served (a, or the slab's third block), never the live one
    const c = pool.alloc(1000);
    expect(c.ptr).not.toBe(b.ptr);
    expect(pool.misses).toBe(2);
    pool.release(c);
    pool.release(b);
    pool.trim();
    expect(live.size).toBe(0);
    expect(pool.pooledBytes).toBe(0);
    expect(pool.liveBytes).toBe(0);
  });
});
