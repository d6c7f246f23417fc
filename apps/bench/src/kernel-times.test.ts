import { type Backend, type Policy, sparsePrefill } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { createReferenceBackend } from '@crisp/reference';
import { describe, expect, it } from 'vitest';
import { kernelTimesOf } from './suites/latency.js';

/** The reference backend with CUDA's launch profiling hooks, recording what it was asked. */
function withLaunchProfile(launches: { kernel: string; calls: number; ms: number }[]) {
  const ref = createReferenceBackend();
  const calls: string[] = [];
  const b: Backend = Object.assign(ref, {
    startProfile: () => calls.push('start'),
    stopProfile: () => {
      calls.push('stop');
      return launches;
    },
  });
  return { b, calls };
}

function inputs(b: Backend, n: number) {
  const shape = [n, 2, 16];
  const fill = (seed: number) => Float32Array.from({ length: 2 * n * 16 }, (_, i) => Math.sin(seed * 7.31 + i * 0.173) * 0.9);
  return { q: b.upload({ dtype: 'f32', shape, data: fill(1) }), k: b.upload({ dtype: 'f32', shape, data: fill(2) }), v: b.upload({ dtype: 'f32', shape, data: fill(3) }) };
}

describe('kernel times on a backend that times each launch (CUDA)', () => {
  it('sums the launches, orders them longest first and marks the span as serialized', async () => {
    const launches = [
      { kernel: 'proxy_blocks', calls: 2, ms: 0.5 },
      { kernel: 'attention_sparse', calls: 1, ms: 3.25 },
      { kernel: 'coverage_select', calls: 1, ms: 1.5 },
    ];
    const { b, calls } = withLaunchProfile(launches);
    const inp = inputs(b, 64);
    const out = b.allocate('f32', [64, 2, 16]);
    const policy: Policy = { ...crisp, blockSize: 16 };
    const t = await kernelTimesOf(b, inp, out, policy, 60_000);
    expect(calls).toEqual(['start', 'stop']);
    expect(t.error).toBeUndefined();
    expect(t.serialized).toBe(true);
    expect(t.kernels.map((k) => k.name)).toEqual(['attention_sparse', 'coverage_select', 'proxy_blocks']);
    expect(t.kernels.map((k) => k.passes)).toEqual([1, 1, 2]);
    expect(t.busyMs).toBeCloseTo(5.25, 12);
    expect(t.passes).toBe(4);
    expect(t.spanMs).toBeGreaterThan(0);
    // the profiled run wrote the same output as a plain run
    const again = b.allocate('f32', [64, 2, 16]);
    await sparsePrefill(b, inp, policy, { minSparseLength: 0, out: again });
    const [x, y] = [await b.download(out), await b.download(again)];
    expect(Array.from(x.data)).toEqual(Array.from(y.data));
    expect(Array.from(x.data).some((v) => v !== 0)).toBe(true);
  });

  it('stops the profile when the run fails, and reports the error instead of throwing', async () => {
    const { b, calls } = withLaunchProfile([]);
    const inp = inputs(b, 64);
    const out = b.allocate('f32', [32, 2, 16]); // the wrong shape: sparsePrefill rejects it
    const t = await kernelTimesOf(b, inp, out, { ...crisp, blockSize: 16 }, 60_000);
    expect(calls).toEqual(['start', 'stop']);
    expect(t.error).toBeTruthy();
    expect(t.kernels).toEqual([]);
  });
});
