/**
 * ReadBatcher (runtime/read-batch.ts) on a stand-in readMany that answers each request with
 * bytes naming it: reads started in one turn make one trip, each read gets its own bytes, a
 * failed batch is retried read by read (each with its own verdict), and batches are cut at
 * the byte cap. The real path (GpuContext.read on Dawn) is covered by read.test.ts and the
 * device plan's trip count in device-plan.test.ts.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { batchesOf, copyBytes, ReadBatcher, type ReadRequest } from './runtime/read-batch.js';

/** A stand-in buffer: its id names it in the bytes read back. */
const buf = (id: number) => ({ id }) as unknown as GPUBuffer;
const idOf = (b: GPUBuffer) => (b as unknown as { id: number }).id;

/** bytes: [buffer id, byteOffset, byteLength] as u32, padded to byteLength */
function answer(r: ReadRequest): ArrayBuffer {
  const ab = new ArrayBuffer(Math.max(12, r.byteLength));
  new Uint32Array(ab, 0, 3).set([idOf(r.src), r.byteOffset, r.byteLength]);
  return ab.slice(0, r.byteLength);
}

function stand(failing: ReadonlySet<number> = new Set()) {
  const calls: number[][] = [];
  const readMany = async (reqs: readonly ReadRequest[]) => {
    calls.push(reqs.map((r) => idOf(r.src)));
    await new Promise((r) => setTimeout(r, 1));
    if (reqs.some((r) => failing.has(idOf(r.src)))) throw new Error(`bad source in [${reqs.map((r) => idOf(r.src))}]`);
    return reqs.map(answer);
  };
  return { calls, readMany };
}

describe('ReadBatcher', () => {
  it('makes one trip for reads started in one turn, and answers each with its own bytes', async () => {
    const s = stand();
    const rb = new ReadBatcher(s.readMany, 1 << 20);
    const got = await Promise.all([1, 2, 3].map((id) => rb.read({ src: buf(id), byteOffset: 4 * id, byteLength: 16 + id * 4 })));
    expect(s.calls).toEqual([[1, 2, 3]]);
    expect(rb.trips).toBe(1);
    got.forEach((ab, i) => {
      const id = i + 1;
      expect(ab.byteLength).toBe(16 + id * 4);
      expect(Array.from(new Uint32Array(ab, 0, 3))).toEqual([id, 4 * id, 16 + id * 4]);
    });
  });

  it('takes reads started a few promise jobs later into the same trip, and reads awaited in turn into separate trips', async () => {
    const s = stand();
    const rb = new ReadBatcher(s.readMany, 1 << 20);
    const later = (async () => {
      await undefined;
      await Promise.resolve();
      return rb.read({ src: buf(2), byteOffset: 0, byteLength: 4 });
    })();
    await Promise.all([rb.read({ src: buf(1), byteOffset: 0, byteLength: 4 }), later]);
    expect(s.calls).toEqual([[1, 2]]);
    await rb.read({ src: buf(3), byteOffset: 0, byteLength: 4 });
    await rb.read({ src: buf(4), byteOffset: 0, byteLength: 4 });
    expect(s.calls).toEqual([[1, 2], [3], [4]]);
    expect(rb.trips).toBe(3);
  });

  it('retries a failed batch read by read: only the bad read fails, the others get their bytes', async () => {
    const s = stand(new Set([2]));
    const rb = new ReadBatcher(s.readMany, 1 << 20);
    const got = await Promise.allSettled([1, 2, 3].map((id) => rb.read({ src: buf(id), byteOffset: 0, byteLength: 12 })));
    expect(got.map((g) => g.status)).toEqual(['fulfilled', 'rejected', 'fulfilled']);
    expect((got[1] as PromiseRejectedResult).reason.message).toBe('bad source in [2]');
    expect(new Uint32Array((got[0] as PromiseFulfilledResult<ArrayBuffer>).value)[0]).toBe(1);
    expect(new Uint32Array((got[2] as PromiseFulfilledResult<ArrayBuffer>).value)[0]).toBe(3);
    expect(s.calls).toEqual([[1, 2, 3], [1], [2], [3]]);
  });

  it('submits waiting reads at once on flush() (before a wait for the queue)', async () => {
    const s = stand();
    const rb = new ReadBatcher(s.readMany, 1 << 20, () => undefined);
    const p = rb.read({ src: buf(7), byteOffset: 0, byteLength: 4 });
    expect(s.calls).toEqual([]);
    rb.flush();
    expect(s.calls).toEqual([[7]]);
    expect(new Uint32Array(await p)[0]).toBe(7);
    rb.flush();
    expect(s.calls).toEqual([[7]]);
  });

  it('cuts batches at the byte cap, in order, a larger read alone', () => {
    const reqs = [8, 8, 100, 4, 4, 4].map((byteLength, id) => ({ src: buf(id), byteOffset: 0, byteLength }));
    expect(batchesOf(reqs, 16).map((b) => b.map((r) => idOf(r.src)))).toEqual([[0, 1], [2], [3, 4, 5]]);
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 0, max: 64 }), { maxLength: 30 }), fc.integer({ min: 4, max: 128 }), (lens, cap) => {
        const rs = lens.map((byteLength, id) => ({ src: buf(id), byteOffset: 0, byteLength }));
        const bs = batchesOf(rs, cap);
        expect(bs.flat().map((r) => idOf(r.src))).toEqual(rs.map((r) => idOf(r.src)));
        for (const b of bs) {
          const total = b.reduce((a, r) => a + copyBytes(r.byteLength), 0);
          expect(b.length === 1 || total <= cap).toBe(true);
        }
      }),
    );
  });
});
