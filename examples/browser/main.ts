/**
 * Example (e): CRISP in a browser page on WebGPU. `createWebGpuBackend()` takes the page's
 * `navigator.gpu`; random Q/K/V are uploaded, planned and run with the `crisp` preset, and the
 * routes and density are shown. apps/demo is the full demo (synthetic layers, a float64 check).
 *
 * Run: pnpm --filter @crisp/examples build, then serve examples/browser/dist (vite preview
 * examples/browser) in a browser with WebGPU; `pnpm --filter @crisp/examples exec vite browser`
 * serves it for development.
 */
import { hostTensor, sparsePrefill } from '@crisp/core';
import { createWebGpuBackend } from '@crisp/kernels-webgpu';
import { crisp } from '@crisp/presets';

const out = document.getElementById('out') as HTMLPreElement;
const [n, H, Hkv, d] = [4096, 8, 2, 64];
const random = (len: number) => Float32Array.from({ length: len }, () => Math.random() * 2 - 1);

async function run(): Promise<void> {
  if (!navigator.gpu) throw new Error('this browser has no WebGPU (navigator.gpu is undefined)');
  const backend = await createWebGpuBackend(); // navigator.gpu's default adapter
  try {
    const q = backend.upload(hostTensor('f32', [n, H, d], random(n * H * d)));
    const k = backend.upload(hostTensor('f32', [n, Hkv, d], random(n * Hkv * d)));
    const v = backend.upload(hostTensor('f32', [n, Hkv, d], random(n * Hkv * d)));
    const { output, plan, timings } = await sparsePrefill(backend, { q, k, v }, crisp);
    const rows = await backend.download(output);
    out.textContent = [
      `routes: ${plan.routing?.routes.join(' ') ?? 'dense'}`,
      `density: ${plan.overallDensity.toFixed(3)}, ${timings.totalMs.toFixed(1)} ms`,
      `output [${rows.shape}]`,
    ].join('\n');
  } finally {
    backend.dispose();
  }
}

run().catch((e: unknown) => {
  out.textContent = `failed: ${e instanceof Error ? e.message : String(e)}`;
});
