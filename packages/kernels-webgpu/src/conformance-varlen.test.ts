/**
 * @crisp/conformance's varlen cases (ragged batches: attention and whole pipelines) on the
 * adapter Dawn finds here, f32, small sizes (policies: varlenPolicies): the rest of the suite
 * is conformance.test.ts.
 * They run in the package's other test process (scripts/test.mjs), beside varlen.test.ts,
 * which compiles the same varlen kernel.
 */
import { defineConformanceSuite } from '@crisp/conformance/vitest';
import { describe, it } from 'vitest';
import { createWebGpuBackend } from './backend.js';
import { varlenPolicies, sharedBackend } from './test-support.js';

const { backend, reason } = await sharedBackend();

if (backend) {
  defineConformanceSuite('webgpu (Dawn) varlen', () => createWebGpuBackend({ device: backend.gpu.device }), {
    sizes: 'small',
    dtypes: ['f32'],
    policies: varlenPolicies(),
    filter: /^varlen\//,
  });
} else {
  describe('webgpu (Dawn) varlen conformance', () => {
    it.skip(`skipped: ${reason}`, () => {});
  });
}
