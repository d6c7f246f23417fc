// WebGpuBackend.profile: the GPU time per program from timestamp queries. The summing is
// checked on given timestamps; on the adapter here (SwiftShader in CI offers timestamp-query
// with Dawn's allow_unsafe_apis) a profiled run must give the same output as an unprofiled
// one, name the kernels it ran, and close cleanly after a failure.
import { hostTensor } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { describe, expect, it } from 'vitest';
import { GpuProfiler, summarizePasses } from './runtime/gpu-profile.js';
import { code, freshSeed, seededValues, sharedBackend } from './test-support.js';

describe('summarizePasses', () => {
  it('sums each program, orders the longest first and measures the span', () => {
    const ns = new BigInt64Array([100n, 300n, 400n, 1400n, 2000n, 2100n]);
    const p = summarizePasses(['a', 'b', 'a'], ns, 2);
    expect(p.kernels).toEqual([
      { name: 'b', ms: 0.001, passes: 1 },
      { name: 'a', ms: 0.0003, passes: 2 },
    ]);
    expect(p.totalMs).toBeCloseTo(0.0013, 12);
    expect(p.spanMs).toBeCloseTo(0.002, 12);
    expect(p.passes).toBe(3);
    expect(p.dropped).toBe(2);
  });

  it('counts an untimed pass (zeros) and a clock that stepped back as no time', () => {
    const p = summarizePasses(['x', 'y', 'z'], new BigInt64Array([0n, 0n, 500n, 400n, 1000n, 1600n]), 0);
    expect(p.kernels.map((k) => [k.name, k.ms])).toEqual([
      ['z', 0.0006],
      ['x', 0],
      ['y', 0],
    ]);
    expect(p.spanMs).toBeCloseTo(0.0011, 12);
    expect(summarizePasses([], new BigInt64Array(0), 0)).toEqual({ kernels: [], totalMs: 0, spanMs: 0, passes: 0, dropped: 0 });
  });

  it('refuses a device without timestamp-query (UNSUPPORTED) and a bad capacity', async () => {
    const host = { device: { features: new Set<string>() } as unknown as GPUDevice, read: async () => new ArrayBuffer(0), submit: () => undefined };
    expect(await code(GpuProfiler.open(host))).toBe('UNSUPPORTED');
    const withTs = { ...host, device: { features: new Set(['timestamp-query']) } as unknown as GPUDevice };
    for (const c of [0, 3, 1.5, 4098]) expect(await code(GpuProfiler.open(withTs, c))).toBe('INVALID_ARGUMENT');
  });
});

const { backend, reason } = await sharedBackend();
const timed = backend?.gpu.device.features.has('timestamp-query') ?? false;
describe.skipIf(!timed)(`profile on this adapter${reason ? ` (${reason})` : timed ? '' : ' (no timestamp-query)'}`, () => {
  const n = 192;
  const H = 2;
  const Hkv = 1;
  const D = 64;
  /** fresh seeded q, k, v on the host (`x`) and on the backend */
  const inputs = () => {
    const seed = freshSeed();
    const x = {
      q: hostTensor('f32', [n, H, D], seededValues(seed, n * H * D, 1.5)),
      k: hostTensor('f32', [n, Hkv, D], seededValues(seed + 1, n * Hkv * D, 1.5)),
      v: hostTensor('f32', [n, Hkv, D], seededValues(seed + 2, n * Hkv * D)),
    };
    const be = backend!;
    return { x, q: be.upload(x.q), k: be.upload(x.k), v: be.upload(x.v) };
  };

  it('times the kernels of a run and leaves its output as an unprofiled run makes it', async () => {
    const be = backend!;
    const { x, q, k, v } = inputs();
    const plain = await be.denseAttention(q, k, v);
    const { result, profile } = await be.profile(() => be.denseAttention(q, k, v));
    const a = (await be.download(plain.output)).data as Float32Array;
    const b = (await be.download(result.output)).data as Float32Array;
    expect(Array.from(b)).toEqual(Array.from(a));
    // and both against float64 attention
    const ref = createReferenceBackend();
    const want = (await ref.download((await ref.denseAttention(ref.upload(x.q), ref.upload(x.k), ref.upload(x.v))).output)).data;
    let worst = 0;
    for (let i = 0; i < want.length; i++) worst = Math.max(worst, Math.abs(b[i] - Number(want[i])));
    expect(worst).toBeLessThan(1e-4);
    const attn = profile.kernels.filter((kt) => /attention/i.test(kt.name));
    expect(attn.length, JSON.stringify(profile.kernels)).toBeGreaterThan(0);
    expect(attn[0].passes).toBeGreaterThanOrEqual(1);
    expect(profile.totalMs).toBeGreaterThan(0);
    expect(profile.passes).toBe(profile.kernels.reduce((s, kt) => s + kt.passes, 0));
    expect(profile.dropped).toBe(0);
    // passes do not overlap on one queue here: their sum fits in the span
    expect(profile.totalMs).toBeLessThanOrEqual(profile.spanMs + 1e-6);
    for (const t of [plain.output, result.output, q, k, v]) t.dispose();
  }, 120_000);

  it('refuses a nested profile, and after a failed run closes and profiles again', async () => {
    const be = backend!;
    const inner = await be.profile(async () => code(() => be.profile(async () => 1)));
    expect(inner.result).toBe('INVALID_ARGUMENT');
    await expect(
      be.profile(async () => {
        throw new Error('boom');
      }),
    ).rejects.toThrow('boom');
    expect(be.gpu.profiler).toBeUndefined();
    expect(await code(() => be.profile(1 as unknown as () => Promise<number>))).toBe('INVALID_ARGUMENT');
    const { q, k, v } = inputs();
    const again = await be.profile(() => be.denseAttention(q, k, v));
    expect(again.profile.passes).toBeGreaterThan(0);
    for (const t of [again.result.output, q, k, v]) t.dispose();
  }, 120_000);

  it('counts the passes past its capacity as dropped', async () => {
    const be = backend!;
    const { q, k, v } = inputs();
    const p = await GpuProfiler.open(be.gpu, 2);
    be.gpu.profiler = p;
    let outs: { dispose(): void }[] = [];
    try {
      outs = [(await be.denseAttention(q, k, v)).output, (await be.denseAttention(q, k, v)).output];
      await be.synchronize();
    } finally {
      be.gpu.profiler = undefined;
    }
    const got = await p.finish();
    expect(got.passes).toBe(1);
    expect(got.dropped).toBeGreaterThanOrEqual(1);
    for (const t of [...outs, q, k, v]) t.dispose();
  }, 120_000);
});
