import { mergeConfig } from 'vitest/config';
import { crispVitest, useSwiftShaderVulkan } from '../../tooling/vitest.preset';

useSwiftShaderVulkan();

// One worker, modules shared across files: every file then uses the same Dawn device, and
// each WGSL pipeline is compiled once (on SwiftShader a compile takes seconds).
export default mergeConfig(crispVitest, { test: { isolate: false, fileParallelism: false } });
