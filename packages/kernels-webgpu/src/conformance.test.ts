/**
 * @crisp/conformance on whatever adapter Dawn finds here (SwiftShader in CI), small sizes.
 * Without an adapter the suite is not registered and the reason is printed.
 */
import { defineConformanceSuite } from '@crisp/conformance/vitest';
import { describe, it } from 'vitest';
import { createNodeWebGpuBackend } from './node.js';
import { sharedBackend } from './test-support.js';

const { backend, reason } = await sharedBackend();

if (backend) {
  // bf16 is not a WebGPU storage type here; the suite reports those cases as skipped
  // through the backend's declared capabilities.
  defineConformanceSuite('webgpu (Dawn)', () => createNodeWebGpuBackend(), { sizes: 'small', dtypes: ['f32', 'f16'] });
} else {
  describe('webgpu (Dawn) conformance', () => {
    it.skip(`skipped: ${reason}`, () => {});
  });
}
