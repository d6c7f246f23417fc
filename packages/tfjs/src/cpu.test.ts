/**
 * crispAttention on TF.js's cpu backend (the host path to the float64 reference), checked
 * against TF.js's own dense attention and the reference's masked attention on fresh seeded
 * inputs; batches, custom policies, a 16-bit-only backend, typed errors, and no leaked tensors.
 */
import { type Backend, castHost, hostTensor, NonFiniteError, toFloat32, UnsupportedError } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { dense } from '@crisp/presets';
import { fixed } from '@crisp/router';
import { beforeAll, describe, expect, it } from 'vitest';
import { crispAttention, disposeCrispBackends, tfBackendOf, tfDenseAttention } from './index.js';
import { code, freshSeed, maxAbsDiff, referenceOutput, sixteenBitOnly, smallCrisp, startTfCpu, tensors, tf } from './test-support.js';

beforeAll(startTfCpu);

const S = { n: 1024, H: 4, Hkv: 2, d: 64 };

describe('crispAttention on TF.js cpu', () => {
  it('dense policy: equals TF.js dense attention and the float64 reference', async () => {
    const seed = freshSeed();
    const s = { n: 192, H: 4, Hkv: 2, d: 64 };
    const { q, k, v, host } = tensors(seed, s);
    const r = await crispAttention(q, k, v, { policy: dense, backend: 'reference' });
    expect(r.path).toBe('host');
    expect(r.backend).toBe('reference');
    expect(r.output.shape).toEqual([s.n, s.H, s.d]);
    expect(r.output.dtype).toBe('float32');
    expect(tfBackendOf(tf, r.output)).toBe('cpu');
    const got = await r.output.data();
    const mine = tfDenseAttention(q, k, v);
    expect(maxAbsDiff(got, await mine.data()), `seed ${seed}`).toBeLessThan(2e-5);
    expect(maxAbsDiff(got, await referenceOutput(host, s)), `seed ${seed}`).toBeLessThan(1e-6);
    expect(r.plans).toHaveLength(1);
    expect(r.density).toBe(1);
    tf.dispose([q, k, v, r.output, mine]);
  });

  it('a sparse policy: the output is the float64 attention over its plan mask, and sparser than dense', async () => {
    const seed = freshSeed();
    const { q, k, v, host } = tensors(seed, S);
    const r = await crispAttention(q, k, v, { policy: smallCrisp, minSparseLength: 0 });
    const plan = r.plans[0];
    expect(plan.mask, `seed ${seed}: the plan is sparse`).toBeDefined();
    expect(r.routes[0]).toHaveLength(S.H);
    expect(r.density).toBeGreaterThan(0);
    expect(r.density, `seed ${seed}`).toBeLessThan(1);
    expect(r.density).toBeCloseTo(plan.overallDensity, 12);
    const got = await r.output.data();
    expect(maxAbsDiff(got, await referenceOutput(host, S, plan.mask)), `seed ${seed}`).toBeLessThan(1e-6);
    tf.dispose([q, k, v, r.output]);
  });

  it('a batch of equal-length sequences: each planned on its own, the same as one call each', async () => {
    const seed = freshSeed();
    const s = { n: 512, H: 4, Hkv: 2, d: 64 };
    const { q, k, v } = tensors(seed, s, 3);
    const r = await crispAttention(q, k, v, { policy: smallCrisp, minSparseLength: 0 });
    expect(r.output.shape).toEqual([3, s.n, s.H, s.d]);
    expect(r.plans).toHaveLength(3);
    const whole = await r.output.data();
    const per = s.n * s.H * s.d;
    let density = 0;
    for (let b = 0; b < 3; b++) {
      const [qb, kb, vb] = [q, k, v].map((t) => tf.squeeze(tf.slice(t, [b, 0, 0, 0], [1, -1, -1, -1]), [0]));
      const one = await crispAttention(qb, kb, vb, { policy: smallCrisp, minSparseLength: 0 });
      expect(one.routes[0], `seed ${seed}, sequence ${b}`).toEqual(r.routes[b]);
      expect(Array.from(await one.output.data()), `seed ${seed}, sequence ${b}`).toEqual(Array.from(whole.subarray(b * per, (b + 1) * per)));
      density += one.density;
      tf.dispose([qb, kb, vb, one.output]);
    }
    expect(r.density).toBeCloseTo(density / 3, 12);
    tf.dispose([q, k, v, r.output]);
  });

  it("a batch's NON_FINITE error names the entry it came from, and keeps its class", async () => {
    const seed = freshSeed();
    const s = { n: 512, H: 4, Hkv: 2, d: 64 };
    const { q, k, v } = tensors(seed, s, 3);
    const vals = await k.data();
    // entry 2's key row 100, head 1, column 5
    vals[((2 * s.n + 100) * s.Hkv + 1) * s.d + 5] = Number.NaN;
    const bad = tf.tensor(vals, k.shape, 'float32');
    const err = await crispAttention(q, bad, v, { policy: smallCrisp, minSparseLength: 0 }).catch((e: unknown) => e);
    expect(err, `seed ${seed}`).toBeInstanceOf(NonFiniteError);
    expect((err as NonFiniteError).message).toMatch(/^crispAttention: batch entry 2: /);
    expect((err as NonFiniteError).details?.batch).toBe(2);
    tf.dispose([q, k, v, bad]);
  });

  it('takes any policy: a custom router sends every head where it says', async () => {
    const seed = freshSeed();
    const { q, k, v } = tensors(seed, S);
    for (const to of ['vs', 'pe'] as const) {
      const r = await crispAttention(q, k, v, { policy: { ...smallCrisp, name: `all-${to}`, router: fixed(to) }, minSparseLength: 0 });
      expect(r.routes[0]).toEqual(Array(S.H).fill(to));
      expect(r.plans[0].policy).toBe(`all-${to}`);
      r.output.dispose();
    }
    tf.dispose([q, k, v]);
  });

  it('a backend without f32 gets the inputs cast to the asked 16-bit dtype, and the output back as float32', async () => {
    const ref = createReferenceBackend();
    // the reference, seen as a backend that stores bf16 and f16 only (as CUDA does)
    const sixteen = sixteenBitOnly(ref);
    const seed = freshSeed();
    const s = { n: 128, H: 2, Hkv: 1, d: 64 };
    const { q, k, v, host } = tensors(seed, s);
    for (const dtype of ['bf16', 'f16'] as const) {
      const r = await crispAttention(q, k, v, { policy: dense, backend: sixteen, deviceDtype: dtype });
      const qd = ref.upload(castHost(hostTensor('f32', [s.n, s.H, s.d], host.q), dtype));
      const kd = ref.upload(castHost(hostTensor('f32', [s.n, s.Hkv, s.d], host.k), dtype));
      const vd = ref.upload(castHost(hostTensor('f32', [s.n, s.Hkv, s.d], host.v), dtype));
      const want = toFloat32(await ref.download((await ref.denseAttention(qd, kd, vd)).output));
      expect(r.output.dtype).toBe('float32');
      expect(maxAbsDiff(await r.output.data(), want), `${dtype}, seed ${seed}`).toBe(0);
      // and not what f32 inputs give: the cast really happened
      expect(maxAbsDiff(await r.output.data(), await referenceOutput(host, s)), dtype).toBeGreaterThan(0);
      r.output.dispose();
    }
    tf.dispose([q, k, v]);
  });

  it('bad input: the core typed errors, and no tensor left behind', async () => {
    const { q, k, v } = tensors(1, { n: 64, H: 2, Hkv: 1, d: 64 });
    const before = tf.memory().numTensors;
    const int = tf.cast(q, 'int32');
    const flat = tf.reshape(q, [64, 128]);
    const shortK = tf.slice(k, [0, 0, 0], [32, -1, -1]);
    const gone = tf.clone(q);
    gone.dispose();
    const made = tf.memory().numTensors;
    expect(await code(() => crispAttention(int, k, v))).toBe('DTYPE_MISMATCH');
    expect(await code(() => crispAttention(flat, k, v))).toBe('SHAPE_MISMATCH');
    expect(await code(() => crispAttention(q, shortK, v))).toBe('SHAPE_MISMATCH');
    expect(await code(() => crispAttention(q, k, shortK))).toBe('SHAPE_MISMATCH');
    expect(await code(() => crispAttention(q, tf.reshape(k, [1, 64, 1, 64]), v))).toBe('SHAPE_MISMATCH');
    expect(await code(() => crispAttention(gone, k, v))).toBe('DISPOSED');
    expect(await code(() => crispAttention([1, 2] as unknown as tf.Tensor, k, v))).toBe('INVALID_ARGUMENT');
    expect(await code(() => crispAttention(q, k, v, { polcy: dense } as never))).toBe('INVALID_ARGUMENT');
    expect(await code(() => crispAttention(q, k, v, { backend: 'tpu' as never }))).toBe('INVALID_ARGUMENT');
    expect(await code(() => crispAttention(q, k, v, { deviceDtype: 'f8' as never }))).toBe('INVALID_ARGUMENT');
    expect(await code(() => crispAttention(q, k, v, { backend: 'webgpu' }))).toBe('INVALID_ARGUMENT');
    expect(await code(() => crispAttention(q, k, v, { scale: Number.NaN }))).toBe('INVALID_ARGUMENT');
    // the one that reshaped k above is the only tensor the failed calls' arguments made
    expect(tf.memory().numTensors).toBe(made + 1);
    tf.dispose([int, flat, shortK]);
    expect(tf.memory().numTensors).toBe(before + 1);
    tf.dispose([q, k, v]);
  });

  it("a head dim or length the backend lacks: UNSUPPORTED or LIMIT_EXCEEDED before any value is read", async () => {
    const { q, k, v } = tensors(1, { n: 64, H: 2, Hkv: 1, d: 8 });
    let reads = 0;
    for (const t of [q, k, v]) {
      const data = t.data.bind(t);
      t.data = (() => {
        reads++;
        return data();
      }) as typeof t.data;
    }
    let err: unknown;
    try {
      await crispAttention(q, k, v, { backend: 'reference' });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(UnsupportedError);
    expect((err as UnsupportedError).message).toBe('reference backend has no kernel for head dim 8; supported: 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256');
    const ref = createReferenceBackend();
    const short: Backend = new Proxy(ref, {
      get(t, p) {
        if (p === 'capabilities') return { ...t.capabilities, headDims: [8], maxSequence: 32 };
        const x = Reflect.get(t, p);
        return typeof x === 'function' ? x.bind(t) : x;
      },
    });
    expect(await code(() => crispAttention(q, k, v, { backend: short }))).toBe('LIMIT_EXCEEDED');
    expect(reads).toBe(0);
    tf.dispose([q, k, v]);
  });

  it('100 calls leave no tensor behind', async () => {
    const { q, k, v } = tensors(freshSeed(), { n: 128, H: 2, Hkv: 1, d: 64 });
    const before = tf.memory().numTensors;
    for (let i = 0; i < 100; i++) {
      const r = await crispAttention(q, k, v);
      expect(tf.memory().numTensors).toBe(before + 1);
      r.output.dispose();
    }
    expect(tf.memory().numTensors).toBe(before);
    tf.dispose([q, k, v]);
    await disposeCrispBackends();
  });

  it('a call made while disposeCrispBackends settles gets a fresh backend, which the dispose leaves alone', async () => {
    const { q, k, v } = tensors(freshSeed(), { n: 128, H: 2, Hkv: 1, d: 64 });
    const first = await crispAttention(q, k, v, { backend: 'reference' });
    const disposing = disposeCrispBackends(); // not awaited, as a caller may do
    const second = await crispAttention(q, k, v, { backend: 'reference' });
    await disposing;
    const third = await crispAttention(q, k, v, { backend: 'reference' });
    const a = await first.output.data();
    expect(await second.output.data()).toEqual(a);
    expect(await third.output.data()).toEqual(a);
    tf.dispose([q, k, v, first.output, second.output, third.output]);
    await disposeCrispBackends();
  });
});
