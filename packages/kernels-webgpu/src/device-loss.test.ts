/**
 * Device loss from outside (`device.destroy()`): calls in flight and every later call end in
 * DEVICE_LOST (or, for work that finished first, the right answer), nothing hangs (each
 * await has a timeout), and the process goes on.
 */
import { type HostTensor, hostTensor, toFloat32 } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { describe, expect, it } from 'vitest';
import { createWebGpuBackend } from './backend.js';
import { createNodeWebGpuBackend } from './node.js';
import { code, freshSeed, seededValues, sharedBackend, withTimeout } from './test-support.js';

const { backend, reason } = await sharedBackend();
const ref = createReferenceBackend();

describe.skipIf(!backend)(`WebGPU device loss${reason ? ` (skipped: ${reason})` : ''}`, () => {
  it('in-flight and later calls: DEVICE_LOST or a correct answer, never a hang or garbage', async () => {
    const b = await createNodeWebGpuBackend();
    const s = freshSeed();
    const n = 128;
    const hq = hostTensor('f32', [n, 2, 64], seededValues(s, n * 2 * 64));
    const hk = hostTensor('f32', [n, 1, 64], seededValues(s + 1, n * 64));
    const q = b.upload(hq);
    const k = b.upload(hk);
    // warm: the attention pipeline is built (seconds on a CPU adapter) before the loss
    await b.denseAttention(q, k, k);
    const expected = toFloat32(await ref.download((await ref.denseAttention(ref.upload(hq), ref.upload(hk), ref.upload(hk))).output));
    const mask = { heads: 2, numBlocks: 2, blockSize: 64, rows: { rowPtr: Int32Array.from([0, 1, 3, 4, 6]), cols: Int32Array.from([0, 0, 1, 0, 0, 1]) } };

    // in flight: attention whose result is downloaded, a plain download, a sync, a fresh
    // pipeline build (proxyStats), a mask expansion
    const attended = (async (): Promise<HostTensor> => b.download((await b.denseAttention(q, k, k)).output))();
    const pending: [string, Promise<unknown>][] = [
      ['attention + download', attended],
      ['download', b.download(q)],
      ['synchronize', b.synchronize()],
      ['proxyStats', b.proxyStats(q, k, { blockSize: 64, wSink: 64, wLocal: 64 })],
      ['sparseAttention', b.sparseAttention(q, k, k, mask)],
      ['expandMask', b.expandMask(mask)],
    ];
    b.gpu.device.destroy();
    // every outcome is taken at once (calls that fail together reject together)
    const outcomes = pending.map(([what, p]) => withTimeout(code(p), 30_000, what));
    const codes: (string | undefined)[] = [];
    for (const [i, [what]] of pending.entries()) {
      const c = await outcomes[i];
      codes.push(c);
      expect(c === 'DEVICE_LOST' || c === undefined, `${what}: ${c}`).toBe(true);
    }
    // (the loss came before the queued work ran: at least the work still to build fails)
    expect(codes, String(codes)).toContain('DEVICE_LOST');
    console.info(`[device-loss] in-flight calls ended: ${pending.map(([w], i) => `${w} ${codes[i] ?? 'resolved'}`).join(', ')}`);
    // what resolved carries the right numbers
    const got = await attended.catch(() => undefined);
    if (got) {
      const o = toFloat32(got);
      let err = 0;
      for (let i = 0; i < o.length; i++) err = Math.max(err, Math.abs(o[i] - expected[i]));
      expect(err, `seed ${s}`).toBeLessThan(2e-5);
    }

    const later: [string, () => unknown][] = [
      ['upload', () => b.upload(hk)],
      ['allocate', () => b.allocate('f32', [4])],
      ['write', () => b.write(q, 0, new Float32Array(4))],
      ['download', () => b.download(q)],
      ['denseAttention', () => b.denseAttention(q, k, k)],
      ['sparseAttention', () => b.sparseAttention(q, k, k, mask)],
      ['expandMask', () => b.expandMask(mask)],
      ['peBlockRows', () => b.peBlockRows(q, k, { blockSize: 64, gamma: 0.9, heads: [0, 1] })],
      ['proxyStats', () => b.proxyStats(q, k, { blockSize: 64, wSink: 64, wLocal: 64 })],
      ['synchronize', () => b.synchronize()],
    ];
    for (const [what, f] of later) {
      expect(await withTimeout(code(f), 10_000, what), what).toBe('DEVICE_LOST');
    }
    // the loss is named, with what to do
    const e = await b.download(q).catch((x: unknown) => x);
    expect(String((e as Error).message)).toContain('Create a new backend');
    // a backend on the lost device is refused; dispose is quiet
    expect(await code(createWebGpuBackend({ device: b.gpu.device }))).toBe('DEVICE_LOST');
    expect(() => b.dispose()).not.toThrow();
  }, 120_000);

  it('the loss of one device leaves other backends working', async () => {
    const shared = backend!;
    const x = shared.upload(hostTensor('f32', [4], [1, 2, 3, 4]));
    expect(Array.from((await withTimeout(shared.download(x), 10_000, 'download')).data)).toEqual([1, 2, 3, 4]);
    x.dispose();
  });
});
