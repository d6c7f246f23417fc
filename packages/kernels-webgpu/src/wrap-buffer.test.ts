/**
 * wrapBuffer / bufferOf: attention on buffers another library made on the same device, with
 * nothing copied, checked against float64; the buffer outlives the tensor over it.
 */
import { hostTensor, toFloat32 } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { describe, expect, it } from 'vitest';
import { Usage } from './runtime/gpu-context.js';
import { code, freshSeed, seededValues, sharedBackend } from './test-support.js';

const { backend, reason } = await sharedBackend();
const ref = createReferenceBackend();

/** A plain buffer with these f32 values, as another library would make it. */
function foreignBuffer(device: GPUDevice, values: Float32Array, usage = Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST): GPUBuffer {
  const b = device.createBuffer({ size: values.byteLength, usage });
  device.queue.writeBuffer(b, 0, values.buffer, values.byteOffset, values.byteLength);
  return b;
}

describe.skipIf(!backend)(`wrapBuffer (${reason ?? 'webgpu'})`, () => {
  it('runs dense attention on wrapped buffers like on uploaded tensors, and leaves the buffers alive', async () => {
    const b = backend!;
    const device = b.gpu.device;
    const seed = freshSeed();
    const [n, H, Hkv, d] = [96, 2, 1, 64];
    const qv = seededValues(seed, n * H * d, 1.5);
    const kv = seededValues(seed + 1, n * Hkv * d, 1.5);
    const vv = seededValues(seed + 2, n * Hkv * d);
    const bufs = [foreignBuffer(device, qv), foreignBuffer(device, kv), foreignBuffer(device, vv)];
    const live = b.gpu.liveBuffers.buffers;
    const q = b.wrapBuffer(bufs[0], 'f32', [n, H, d]);
    const k = b.wrapBuffer(bufs[1], 'f32', [n, Hkv, d]);
    const v = b.wrapBuffer(bufs[2], 'f32', [n, Hkv, d]);
    // nothing allocated for the wrapped tensors
    expect(b.gpu.liveBuffers.buffers).toBe(live);
    const { output } = await b.denseAttention(q, k, v);
    const got = toFloat32(await b.download(output));
    const rq = ref.upload(hostTensor('f32', [n, H, d], qv));
    const rk = ref.upload(hostTensor('f32', [n, Hkv, d], kv));
    const rv = ref.upload(hostTensor('f32', [n, Hkv, d], vv));
    const want = toFloat32(await ref.download((await ref.denseAttention(rq, rk, rv)).output));
    let err = 0;
    for (let i = 0; i < want.length; i++) err = Math.max(err, Math.abs(got[i] - want[i]));
    expect(err, `seed ${seed}`).toBeLessThan(2e-5);

    // the output's own buffer, as another library on the device would read it
    const outBuf = b.bufferOf(output);
    expect(outBuf.size).toBeGreaterThanOrEqual(n * H * d * 4);

    q.dispose();
    k.dispose();
    v.dispose();
    output.dispose();
    await b.synchronize();
    // the wrapped buffers are still the caller's and still hold their values
    const again = b.wrapBuffer(bufs[0], 'f32', [n, H, d]);
    const back = toFloat32(await b.download(again));
    expect(Array.from(back.subarray(0, 8))).toEqual(Array.from(qv.subarray(0, 8)));
    expect(back[back.length - 1]).toBe(qv[qv.length - 1]);
    again.dispose();
    for (const x of bufs) x.destroy();
  }, 120_000);

  it('refuses what cannot be a tensor: wrong usage, too small, bf16, not a buffer', async () => {
    const b = backend!;
    const device = b.gpu.device;
    const small = foreignBuffer(device, new Float32Array(16));
    const noStorage = device.createBuffer({ size: 64, usage: Usage.COPY_SRC | Usage.COPY_DST });
    expect(await code(() => b.wrapBuffer(small, 'f32', [4, 1, 8]))).toBe('INVALID_ARGUMENT');
    expect(await code(() => b.wrapBuffer(noStorage, 'f32', [4, 1, 4]))).toBe('INVALID_ARGUMENT');
    expect(await code(() => b.wrapBuffer(small, 'bf16', [4, 1, 4]))).toBe('UNSUPPORTED');
    expect(await code(() => b.wrapBuffer({} as GPUBuffer, 'f32', [4, 1, 4]))).toBe('INVALID_ARGUMENT');
    expect(await code(() => b.wrapBuffer(small, 'f32', [4, -1, 4]))).toBe('SHAPE_MISMATCH');
    expect(await code(() => b.bufferOf(ref.upload(hostTensor('f32', [1], [1]))))).toBe('WRONG_BACKEND');
    // an exact fit works (16 f32 = 64 bytes)
    expect(await code(() => b.wrapBuffer(small, 'f32', [4, 1, 4]).dispose())).toBeUndefined();
    small.destroy();
    noStorage.destroy();
  });
});
