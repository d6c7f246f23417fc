import { crispVitest, useSwiftShaderVulkan } from '../../tooling/vitest.preset';

// WebGPU on SwiftShader where no GPU's Vulkan is installed (CI): the WebGPU peer and the
// backend report run there too (a few seconds; the suites' own tests use the reference).
useSwiftShaderVulkan();

export default crispVitest;
