/** openBackend: what a results file says about each backend it ran on. */
import { type WebGpuBackend, TENSOR_CORE_SPARSE_CROSSOVER, FMA_SPARSE_CROSSOVER } from '@crisp/kernels-webgpu';
import { webgpuAvailability } from '@crisp/kernels-webgpu/node';
import { describe, expect, it } from 'vitest';
import { openBackend } from './backends.js';

const webgpu = await webgpuAvailability();

describe('openBackend', () => {
  it('the reference: float64 on the host, its shipped gate', async () => {
    const o = await openBackend('reference', undefined);
    expect(o.device).toMatch(/float64/);
    expect(o.shippedCrossover).toBe(o.backend!.sparseCrossover);
  });

  it.skipIf(!webgpu.available)(`webgpu: the device names the attention kernel and the proxy statistics' kernel${webgpu.available ? '' : ` (skipped: ${webgpu.reason})`}`, async () => {
    const o = await openBackend('webgpu', undefined);
    const b = o.backend as WebGpuBackend;
    try {
      const stats = b.statisticsKernelFor('f16', 128);
      expect(stats).toBe(b.attentionKernelFor('f16', 128) === 'subgroup-matrix' ? 'subgroup-matrix' : 'fma');
      expect(o.device).toMatch(new RegExp(`attention kernel ${b.attentionKernel}(:[a-z-]+)?, proxy statistics ${stats}$`));
      expect(o.shippedCrossover).toBe(b.attentionKernel === 'subgroup-matrix' ? TENSOR_CORE_SPARSE_CROSSOVER : FMA_SPARSE_CROSSOVER);
    } finally {
      b.dispose();
    }
  });
});
