/**
 * GpuContext keeps the uniform buffers of finished work and writes them again (uniform()),
 * binds one 16-byte stand-in per label where a kernel's optional binding is unused, and asks
 * Dawn for each pipeline's bind group layout once: a repeated sparsePrefill then makes no new
 * uniform buffers, computes the same output bit for bit, and holds no more buffers after it
 * than before it. Small shapes (SwiftShader in CI).
 */
import { hostTensor, mulberry32, type Policy, sparsePrefill } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { globalCoverage, noiseFloor } from '@crisp/select';
import { describe, expect, it } from 'vitest';
import { sharedBackend } from './test-support.js';

const { backend, reason } = await sharedBackend();
const D = 64;
const B = 64;
const policy: Policy = Object.freeze({
  ...crisp,
  blockSize: B,
  kMin: 128,
  vs: noiseFloor({ alpha: 1, kMin: 128 }),
  pe: globalCoverage({ gamma: 0.6, kMin: 128 }),
});

describe.skipIf(!backend)(`WebGPU buffer reuse${reason ? ` (skipped: ${reason})` : ''}`, () => {
  it('a second identical prefill makes no uniform buffer, matches the first bit for bit and leaves the live buffers as they were', async () => {
    const b = backend!;
    const n = 700;
    const H = 4;
    const Hkv = 2;
    const r = mulberry32(91);
    const vals = (len: number, amp: number) => Float32Array.from({ length: len }, () => (r() * 2 - 1) * amp);
    const q = vals(n * H * D, 1);
    for (let i = 0; i < n; i++) for (let h = 0; h < H; h++) q[(i * H + h) * D + (h % 2)] += h % 2 === 0 ? 6 : 3;
    const inp = {
      q: b.upload(hostTensor('f32', [n, H, D], q)),
      k: b.upload(hostTensor('f32', [n, Hkv, D], vals(n * Hkv * D, 1))),
      v: b.upload(hostTensor('f32', [n, Hkv, D], vals(n * Hkv * D, 1))),
    };
    const dev = b.gpu.device;
    const made: string[] = [];
    const create = dev.createBuffer.bind(dev);
    dev.createBuffer = (d: GPUBufferDescriptor) => {
      made.push(d.label ?? '');
      return create(d);
    };
    const run = async () => {
      const out = b.allocate('f32', [n, H, D]);
      b.write(out, 0, new Float32Array(n * H * D).fill(Number.NaN));
      made.length = 0;
      const res = await sparsePrefill(b, inp, policy, { minSparseLength: 0, out });
      await b.synchronize();
      const host = await b.download(res.output);
      res.output.dispose();
      return { data: host.data as Float32Array, made: [...made], density: res.plan.density };
    };
    try {
      // (the backend is shared with other files' tests: the pool may be warm already)
      const first = await run();
      const live = b.gpu.liveBuffers;
      const second = await run();
      expect(b.gpu.liveBuffers).toEqual(live);
      expect(second.made.filter((l) => l === 'uniform')).toEqual([]);
      expect(second.made).not.toContain('none');
      expect(second.made).not.toContain('no-lse');
      expect(b.gpu.pooledUniforms).toBeGreaterThan(5);
      // a sparse plan ran (some head keeps fewer than all its blocks), and the output is whole
      expect(Math.min(...Array.from(first.density))).toBeLessThan(1);
      expect(first.data.every(Number.isFinite)).toBe(true);
      expect(Array.from(second.data)).toEqual(Array.from(first.data));
    } finally {
      dev.createBuffer = create;
      for (const t of Object.values(inp)) t.dispose();
    }
  });
});
