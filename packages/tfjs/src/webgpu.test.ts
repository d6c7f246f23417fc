/**
 * crispAttention and crispAttentionVarlen on tfjs-backend-webgpu (Dawn; SwiftShader in CI): CRISP's WebGPU backend on
 * TF.js's own device, checked against float64 on fresh seeded inputs. The zero-copy claim is
 * measured: every byte that crosses between host and device during a call is counted (queue
 * writes, buffers mapped at creation, read-back maps) and compared with the tensors' size.
 */
import { createReferenceBackend } from '@crisp/reference';
import { dense } from '@crisp/presets';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { crispAttention, crispAttentionVarlen, disposeCrispBackends, tfBackendOf, tfDenseAttention } from './index.js';
import { code, freshSeed, maxAbsDiff, referenceOutput, smallCrisp, startTfWebGpu, tensors, tf } from './test-support.js';
import { webgpuBackendOn } from './backends.js';

let reason: string | undefined = 'not started';
beforeAll(async () => {
  reason = await startTfWebGpu();
  if (reason) console.warn(`[tfjs] skipping the tfjs-backend-webgpu tests: ${reason}`);
});
afterAll(disposeCrispBackends);

/** Host<->device bytes while `f` runs: queue writes, mapped-at-creation buffers, read-back maps. */
async function traffic<T>(f: () => Promise<T>): Promise<{ result: T; toDevice: number; toHost: number }> {
  const g = globalThis as unknown as { GPUQueue: { prototype: GPUQueue }; GPUBuffer: { prototype: GPUBuffer }; GPUDevice: { prototype: GPUDevice } };
  const qp = g.GPUQueue.prototype;
  const bp = g.GPUBuffer.prototype;
  const dp = g.GPUDevice.prototype;
  const [write, map, create] = [qp.writeBuffer, bp.mapAsync, dp.createBuffer];
  let toDevice = 0;
  let toHost = 0;
  qp.writeBuffer = function (this: GPUQueue, ...args: Parameters<GPUQueue['writeBuffer']>) {
    const [, , data, , size] = args as unknown as [GPUBuffer, number, ArrayBufferView | ArrayBuffer, number?, number?];
    toDevice += size ?? data.byteLength;
    return write.apply(this, args);
  } as GPUQueue['writeBuffer'];
  bp.mapAsync = function (this: GPUBuffer, mode: number, ...rest: [number?, number?]) {
    if (mode & 1) toHost += rest[1] ?? this.size;
    return map.call(this, mode, ...rest);
  } as GPUBuffer['mapAsync'];
  dp.createBuffer = function (this: GPUDevice, desc: GPUBufferDescriptor) {
    if (desc.mappedAtCreation) toDevice += desc.size;
    return create.call(this, desc);
  } as GPUDevice['createBuffer'];
  try {
    const result = await f();
    return { result, toDevice, toHost };
  } finally {
    qp.writeBuffer = write;
    bp.mapAsync = map;
    dp.createBuffer = create;
  }
}

describe('crispAttention on tfjs-backend-webgpu', () => {
  it('dense policy on TF.js\'s device: matches float64 and TF.js\'s own dense attention; the output stays on webgpu', async (ctx) => {
    if (reason) return ctx.skip();
    const seed = freshSeed();
    const s = { n: 160, H: 4, Hkv: 2, d: 64 };
    const { q, k, v, host } = tensors(seed, s);
    const r = await crispAttention(q, k, v, { policy: dense });
    expect(r.path).toBe('webgpu');
    expect(r.backend).toBe('webgpu');
    expect(tfBackendOf(tf, r.output)).toBe('webgpu');
    expect(r.output.shape).toEqual([s.n, s.H, s.d]);
    const got = await r.output.data();
    expect(maxAbsDiff(got, await referenceOutput(host, s)), `seed ${seed}`).toBeLessThan(2e-5);
    const theirs = tfDenseAttention(q, k, v);
    expect(maxAbsDiff(got, await theirs.data()), `seed ${seed}`).toBeLessThan(2e-5);
    tf.dispose([q, k, v, r.output, theirs]);
  });

  it('a sparse policy: the float64 attention over its plan mask, single and batched', async (ctx) => {
    if (reason) return ctx.skip();
    const seed = freshSeed();
    const s = { n: 1024, H: 4, Hkv: 2, d: 64 };
    const { q, k, v, host } = tensors(seed, s, 2);
    const r = await crispAttention(q, k, v, { policy: smallCrisp, minSparseLength: 0 });
    expect(r.path).toBe('webgpu');
    expect(r.output.shape).toEqual([2, s.n, s.H, s.d]);
    const got = await r.output.data();
    const per = s.n * s.H * s.d;
    const kvPer = s.n * s.Hkv * s.d;
    for (let b = 0; b < 2; b++) {
      const plan = r.plans[b];
      expect(plan.mask, `seed ${seed}, sequence ${b}: sparse`).toBeDefined();
      expect(plan.overallDensity, `seed ${seed}`).toBeLessThan(1);
      const one = { q: host.q.subarray(b * per, (b + 1) * per), k: host.k.subarray(b * kvPer, (b + 1) * kvPer), v: host.v.subarray(b * kvPer, (b + 1) * kvPer) };
      const want = await referenceOutput(one, s, plan.mask);
      expect(maxAbsDiff(got.subarray(b * per, (b + 1) * per), want), `seed ${seed}, sequence ${b}`).toBeLessThan(2e-5);
    }
    tf.dispose([q, k, v, r.output]);
  });

  it('no host round trip: under 2% of the tensors\' bytes cross, where the host path reads them all back', async (ctx) => {
    if (reason) return ctx.skip();
    const s = { n: 1024, H: 4, Hkv: 2, d: 64 };
    const { q, k, v } = tensors(freshSeed(), s);
    // inputs made on the device (as a model's activations are; data() would cache them on the host)
    const [qg, kg, vg] = [q, k, v].map((t) => tf.add(t, 0));
    const inBytes = (q.size + 2 * k.size) * 4;
    const outBytes = q.size * 4;
    const opts = { policy: smallCrisp, minSparseLength: 0 };
    await crispAttention(qg, kg, vg, opts).then((r) => r.output.dispose()); // pipelines compiled
    // (the tests fill reused buffers with a poison pattern from the host: not the library's traffic)
    (await webgpuBackendOn((tf.backend() as unknown as { device: GPUDevice }).device)).gpu.poisonReused = false;
    const zero = await traffic(() => crispAttention(qg, kg, vg, opts));
    expect(zero.result.path).toBe('webgpu');
    expect(zero.toDevice, 'host to device bytes').toBeLessThan(0.02 * inBytes);
    expect(zero.toHost, 'device to host bytes').toBeLessThan(0.02 * outBytes);
    // the same call through the host (TF.js data() out, the reference, a tensor in) moves everything
    const host = await traffic(() => crispAttention(qg, kg, vg, { ...opts, backend: createReferenceBackend() }));
    expect(host.result.path).toBe('host');
    expect(host.toHost).toBeGreaterThanOrEqual(inBytes);
    expect(maxAbsDiff(await zero.result.output.data(), await host.result.output.data())).toBeLessThan(2e-5);
    (await webgpuBackendOn((tf.backend() as unknown as { device: GPUDevice }).device)).gpu.poisonReused = true;
    tf.dispose([q, k, v, qg, kg, vg, zero.result.output, host.result.output]);
  });

  it('a ragged batch (crispAttentionVarlen) on TF.js\'s device: each sequence the float64 attention over its plan mask, no host round trip', async (ctx) => {
    if (reason) return ctx.skip();
    const seed = freshSeed();
    const lengths = [1024, 320];
    const per = lengths.map((n, i) => ({ n, s: { n, H: 4, Hkv: 2, d: 64 }, ...tensors(seed + i, { n, H: 4, Hkv: 2, d: 64 }) }));
    // packed on the device, as a runtime's activations are
    const [q, k, v] = (['q', 'k', 'v'] as const).map((p) => tf.concat(per.map((x) => x[p])));
    const cuSeqlensQ = [0, lengths[0], lengths[0] + lengths[1]];
    const opts = { policy: smallCrisp, minSparseLength: 0 };
    await crispAttentionVarlen(q, k, v, { cuSeqlensQ }, opts).then((r) => r.output.dispose()); // pipelines compiled
    const crisp = await webgpuBackendOn((tf.backend() as unknown as { device: GPUDevice }).device);
    crisp.gpu.poisonReused = false;
    const { result: r, toDevice, toHost } = await traffic(() => crispAttentionVarlen(q, k, v, { cuSeqlensQ }, opts));
    crisp.gpu.poisonReused = true;
    expect(r.path).toBe('webgpu');
    expect(tfBackendOf(tf, r.output)).toBe('webgpu');
    expect(r.output.shape).toEqual([cuSeqlensQ[2], 4, 64]);
    expect(toDevice, 'host to device bytes').toBeLessThan(0.02 * (q.size + 2 * k.size) * 4);
    expect(toHost, 'device to host bytes').toBeLessThan(0.02 * q.size * 4);
    expect(r.plans[0].mask, `seed ${seed}: the long sequence's plan is sparse`).toBeDefined();
    const got = await r.output.data();
    for (let i = 0; i < per.length; i++) {
      const want = await referenceOutput(per[i].host, per[i].s, r.plans[i].mask);
      expect(maxAbsDiff(got.subarray(cuSeqlensQ[i] * 4 * 64, cuSeqlensQ[i + 1] * 4 * 64), want), `seed ${seed}, sequence ${i}`).toBeLessThan(2e-5);
    }
    tf.dispose([q, k, v, r.output, ...per.flatMap((x) => [x.q, x.k, x.v])]);
  });

  it('100 calls: TF.js tensors and GPU bytes, and CRISP\'s device buffers, back where they were', async (ctx) => {
    if (reason) return ctx.skip();
    const { q, k, v } = tensors(freshSeed(), { n: 128, H: 2, Hkv: 1, d: 64 });
    const warm = await crispAttention(q, k, v);
    warm.output.dispose();
    const crisp = await webgpuBackendOn((tf.backend() as unknown as { device: GPUDevice }).device);
    await crisp.synchronize();
    const before = { tensors: tf.memory().numTensors, bytes: (tf.memory() as { numBytesInGPU?: number }).numBytesInGPU, crisp: crisp.gpu.liveBuffers };
    for (let i = 0; i < 100; i++) {
      const r = await crispAttention(q, k, v);
      expect(tf.memory().numTensors).toBe(before.tensors + 1);
      r.output.dispose();
    }
    await crisp.synchronize();
    expect(tf.memory().numTensors).toBe(before.tensors);
    expect((tf.memory() as { numBytesInGPU?: number }).numBytesInGPU).toBe(before.bytes);
    expect(crisp.gpu.liveBuffers).toEqual(before.crisp);
    tf.dispose([q, k, v]);
  });

  it('tensors on two TF.js backends are refused, and a tensor still on the cpu backend goes through the host', async (ctx) => {
    if (reason) return ctx.skip();
    await import('@tensorflow/tfjs-backend-cpu');
    const s = { n: 64, H: 2, Hkv: 1, d: 64 };
    const onGpu = tensors(1, s);
    await tf.setBackend('cpu');
    const onCpu = tensors(1, s);
    await tf.setBackend('webgpu');
    expect(await code(() => crispAttention(onGpu.q, onCpu.k, onGpu.v))).toBe('INVALID_ARGUMENT');
    const r = await crispAttention(onCpu.q, onCpu.k, onCpu.v, { policy: dense });
    expect(r.path).toBe('host');
    expect(tfBackendOf(tf, r.output)).toBe('webgpu');
    expect(maxAbsDiff(await r.output.data(), await referenceOutput(onCpu.host, s))).toBeLessThan(1e-6);
    tf.dispose([onGpu.q, onGpu.k, onGpu.v, onCpu.q, onCpu.k, onCpu.v, r.output]);
  });
});
