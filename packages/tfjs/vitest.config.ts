import { mergeConfig } from 'vitest/config';
import { crispVitest, useSwiftShaderVulkan } from '../../tooling/vitest.preset';

useSwiftShaderVulkan();

// Files one after another (each starts TF.js on its own backend: cpu or webgpu over Dawn),
// so two SwiftShader devices never share the CI machine's two cores.
export default mergeConfig(crispVitest, { test: { fileParallelism: false } });
