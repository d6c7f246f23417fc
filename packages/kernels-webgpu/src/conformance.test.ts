/**
 * @crisp/conformance on whatever adapter Dawn finds here (SwiftShader in CI), small sizes.
 * Without an adapter the suite is not registered and the reason is printed. The tensor-core
 * subgroup-matrix kernel gets its own f16 suite wherever the adapter makes it eligible.
 */
import { defineConformanceSuite } from '@crisp/conformance/vitest';
import { describe, it } from 'vitest';
import { createWebGpuBackend } from './backend.js';
import { conformancePolicies, LONG_PIPELINE, sharedBackend } from './test-support.js';

const NOT_LONG_PIPELINE = new RegExp(`^(?!${LONG_PIPELINE.source.slice(1)})`);

const { backend, reason } = await sharedBackend();

if (backend) {
  // bf16 is not a WebGPU storage type here; the suite reports those cases as skipped
  // through the backend's declared capabilities.
  // The suite's backend shares the test device (and its compiled pipelines); f32 only: the
  // f16 storage path is covered by primitives.test.ts and, on the H200, by the f16 suite.
  // The varlen cases run in conformance-varlen.test.ts and the longest pipeline cases in
  // conformance-long.test.ts, in the package's other test process.
  defineConformanceSuite('webgpu (Dawn)', () => createWebGpuBackend({ device: backend.gpu.device }), {
    sizes: 'small',
    varlenSizes: 'none',
    dtypes: ['f32'],
    policies: conformancePolicies(),
    filter: NOT_LONG_PIPELINE,
  });
  const smm = () => createWebGpuBackend({ device: backend.gpu.device, attentionKernel: 'subgroup-matrix' });
  const probe = await smm();
  const eligible = probe.attentionKernel === 'subgroup-matrix';
  probe.dispose();
  if (eligible) {
    defineConformanceSuite('webgpu (Dawn) subgroup-matrix (tensor-core) attention', smm, { sizes: 'small', dtypes: ['f16'] });
  } else {
    describe('webgpu (Dawn) subgroup-matrix (tensor-core) attention conformance', () => {
      it.skip('skipped: this adapter does not offer f16 16 x 16 x 16 subgroup matrices with 32-wide subgroups', () => {});
    });
  }
} else {
  describe('webgpu (Dawn) conformance', () => {
    it.skip(`skipped: ${reason}`, () => {});
  });
}
