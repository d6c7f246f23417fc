/**
 * @crisp/kernels-webgpu: the CRISP backend in WGSL for browsers and Node. The device or
 * adapter is injected; `@crisp/kernels-webgpu/node` adds Dawn for Node.
 */
export {
  ATTENTION_KERNELS,
  type ActiveAttentionKernel,
  type AttentionKernel,
  createWebGpuBackend,
  H200_SPARSE_CROSSOVER,
  OPTIONAL_FEATURES,
  WebGpuBackend,
  type WebGpuBackendOptions,
  type WebGpuInfo,
} from './backend.js';
export { DeviceLostError, GpuContext, type DeviceLimits } from './gpu.js';
export { coverageCut } from './coverage.js';
export type { ProgramDescriptor } from './kernels/common.js';
export { attentionProgram } from './kernels/attention.js';
export { attentionV3Program } from './kernels/attention-v3.js';
export { type AttentionV4Options, V4_DEFAULT_FORM, attentionV4Program } from './kernels/attention-v4.js';
export { attentionSmmProgram } from './kernels/attention-smm.js';
