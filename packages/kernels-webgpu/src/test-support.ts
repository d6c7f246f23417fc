/**
 * Test helpers (not exported from the package entry): one shared Node backend per test
 * file, or the reason it is unavailable.
 */
import { createNodeWebGpuBackend, webgpuAvailability } from './node.js';
import { mulberry32 } from '@crisp/core';
import type { WebGpuBackend } from './backend.js';

let cached: Promise<{ backend?: WebGpuBackend; reason?: string }> | undefined;

export function sharedBackend(): Promise<{ backend?: WebGpuBackend; reason?: string }> {
  cached ??= (async () => {
    const a = await webgpuAvailability();
    if (!a.available) {
      console.warn(`[kernels-webgpu] skipping WebGPU tests: ${a.reason}`);
      return { reason: a.reason };
    }
    return { backend: await createNodeWebGpuBackend() };
  })();
  return cached;
}

/** Seeded uniform values in [-1, 1) (mulberry32). */
export function seededValues(seed: number, count: number, amp = 1): Float32Array {
  const r = mulberry32(seed);
  const out = new Float32Array(count);
  for (let i = 0; i < count; i++) out[i] = (r() * 2 - 1) * amp;
  return out;
}

export function freshSeed(): number {
  return Number(process.env.CRISP_SEED ?? Math.floor(Math.random() * 2 ** 31));
}
