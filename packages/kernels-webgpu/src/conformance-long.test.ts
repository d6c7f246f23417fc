/**
 * @crisp/conformance's longest cases on the adapter Dawn finds here (whole pipelines at
 * n = 2100 with a chunk of 1100 queries, f32, the policies of longPipelinePolicies): the rest
 * of the suite is conformance.test.ts. They run in the package's other test process
 * (scripts/test.mjs), which compiles the same default kernels for the varlen cases.
 */
import { defineConformanceSuite } from '@crisp/conformance/vitest';
import { describe, it } from 'vitest';
import { createWebGpuBackend } from './backend.js';
import { LONG_PIPELINE, longPipelinePolicies, sharedBackend } from './test-support.js';

const { backend, reason } = await sharedBackend();

if (backend) {
  defineConformanceSuite('webgpu (Dawn) long pipelines', () => createWebGpuBackend({ device: backend.gpu.device }), {
    sizes: 'small',
    varlenSizes: 'none',
    dtypes: ['f32'],
    policies: longPipelinePolicies(),
    filter: LONG_PIPELINE,
  });
} else {
  describe('webgpu (Dawn) long pipeline conformance', () => {
    it.skip(`skipped: ${reason}`, () => {});
  });
}
