/**
 * The reserve (runtime/gpu-context.ts): a prefill of a shape seen before takes its
 * temporaries from the buffers the last one retired, its uniforms and bind groups from those
 * made before, and answers bit for bit what a prefill on fresh buffers answers. The tests run
 * with CRISP_WEBGPU_POISON_REUSED=1 (tooling/vitest.preset.ts): every buffer handed out again
 * is filled with 0xff bytes (NaN as f32 and f16) first, so a kernel reading what it did not
 * write would show here and in every other suite.
 */
import { hostTensor, type Policy, sparsePrefill, toFloat32 } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { globalCoverage, noiseFloor } from '@crisp/select';
import { describe, expect, it } from 'vitest';
import { createWebGpuBackend } from './backend.js';
import { WRAPPED_DEVICE } from './runtime/gpu-context.js';
import { freshSeed, seededValues, sharedBackend } from './test-support.js';

const { backend, reason } = await sharedBackend();

/** `real` with its createBuffer, createBindGroup, writeBuffer and submit calls counted. */
function countingDevice(real: GPUDevice, counts: Record<string, number>): GPUDevice {
  const bump = (k: string) => {
    counts[k] = (counts[k] ?? 0) + 1;
  };
  const queue = new Proxy(real.queue, {
    get(t, p) {
      const v = Reflect.get(t, p) as unknown;
      if (typeof v !== 'function') return v;
      return (...a: unknown[]) => {
        if (p === 'writeBuffer' || p === 'submit') bump(p);
        return (v as (...x: unknown[]) => unknown).apply(t, a);
      };
    },
  });
  return new Proxy(real, {
    get(t, p) {
      if (p === WRAPPED_DEVICE) return t;
      if (p === 'queue') return queue;
      const v = Reflect.get(t, p) as unknown;
      if (typeof v !== 'function') return v;
      return (...a: unknown[]) => {
        if (p === 'createBuffer' || p === 'createBindGroup') bump(p);
        return (v as (...x: unknown[]) => unknown).apply(t, a);
      };
    },
  });
}

// crisp's rules at a scale this shape has (B 64, kMin 128 tokens): the device plan, PE heads included
const policy: Policy = { ...crisp, blockSize: 64, kMin: 128, vs: noiseFloor({ alpha: 1, kMin: 128 }), pe: globalCoverage({ gamma: 0.6, kMin: 128 }) };

describe.skipIf(!backend)(`buffer reuse on WebGPU${reason ? ` (skipped: ${reason})` : ''}`, () => {
  it('a prefill of a shape seen before allocates nothing, makes few bind groups, and answers bit for bit as on fresh buffers', async () => {
    const counts: Record<string, number> = {};
    const b = await createWebGpuBackend({ device: countingDevice(backend!.gpu.device, counts) });
    try {
      const s = freshSeed();
      const [n, H, Hkv, D] = [520, 4, 2, 64];
      const up = (h: number, seed: number) => b.upload(hostTensor('f32', [n, h, D], seededValues(seed, n * h * D)));
      const t = { q: up(H, s), k: up(Hkv, s + 1), v: up(Hkv, s + 2) };
      const run = async () => {
        const r = await sparsePrefill(b, t, policy, { minSparseLength: 0 });
        const got = toFloat32(await b.download(r.output));
        r.output.dispose();
        return { got, plan: r.plan };
      };
      const first = await run();
      await b.synchronize();
      expect(b.gpu.pooledBuffers.buffers).toBeGreaterThan(0);
      await run();
      await b.synchronize();
      for (const k of Object.keys(counts)) delete counts[k];
      const again = await run();
      // the output tensor and the read-back's staging are taken from the reserve too
      expect(counts.createBuffer ?? 0, `seed ${s}`).toBe(0);
      expect(counts.createBindGroup ?? 0).toBeLessThan(10);
      expect(counts.submit).toBeGreaterThan(0);
      expect(Array.from(again.got)).toEqual(Array.from(first.got));
      expect(Array.from(again.plan.density)).toEqual(Array.from(first.plan.density));
      expect(again.plan.routing?.routes).toEqual(first.plan.routing?.routes);
      for (const x of Object.values(t)) x.dispose();
    } finally {
      b.dispose();
    }
  });

  it('counts the reserve apart from the live buffers, and trimPool releases it', async () => {
    const b = await createWebGpuBackend({ device: countingDevice(backend!.gpu.device, {}) });
    try {
      await b.synchronize();
      const live = b.gpu.liveBuffers;
      const s = freshSeed();
      const [n, H, D] = [320, 2, 64];
      const x = b.upload(hostTensor('f32', [n, H, D], seededValues(s, n * H * D)));
      const r = await sparsePrefill(b, { q: x, k: x, v: x }, policy, { minSparseLength: 0 });
      r.output.dispose();
      x.dispose();
      await b.synchronize();
      expect(b.gpu.liveBuffers).toEqual(live);
      expect(b.gpu.pooledBuffers.buffers).toBeGreaterThan(0);
      expect(b.gpu.pooledBuffers.bytes).toBeGreaterThan(0);
      b.gpu.trimPool();
      expect(b.gpu.pooledBuffers).toEqual({ buffers: 0, bytes: 0 });
      await b.synchronize();
      expect(b.gpu.liveBuffers).toEqual(live);
    } finally {
      b.dispose();
    }
  });
});
