import { mergeConfig } from 'vitest/config';
import { crispVitest, useSwiftShaderVulkan } from '../../tooling/vitest.preset';

useSwiftShaderVulkan();

// One worker, modules shared across files: every file then uses the same Dawn device, and
// each WGSL pipeline is compiled once (on SwiftShader a compile takes seconds).
// --liftoff-only: V8 keeps WebAssembly on its baseline compiler. The only WebAssembly here is
// ONNX Runtime Web's 27 MB module (ort-peer), whose optimizing compiles otherwise take ~60 s
// of CPU in background threads while the later files' shaders wait for the cores; what ORT
// computes, and what its tests check, is the same.
export default mergeConfig(crispVitest, { test: { isolate: false, fileParallelism: false, execArgv: ['--liftoff-only'] } });
