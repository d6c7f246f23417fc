/// <reference types="@webgpu/types" preserve="true" />
/**
 * @crisp/kernels-webgpu: the CRISP backend in WGSL for browsers and Node. The device or
 * adapter is injected; `@crisp/kernels-webgpu/node` adds Dawn for Node.
 *
 * @module @crisp/kernels-webgpu
 */
export {
  ATTENTION_KERNELS,
  type ActiveAttentionKernel,
  type AttentionKernel,
  createWebGpuBackend,
  FMA_SPARSE_CROSSOVER,
  H200_SPARSE_CROSSOVER,
  TENSOR_CORE_SPARSE_CROSSOVER,
  OPTIONAL_FEATURES,
  WebGpuBackend,
  type WebGpuBackendOptions,
  type WebGpuInfo,
  type DeviceVsPlan,
  type DeviceVsRequest,
  type GpuKernelTime,
  type GpuProfile,
  PROFILE_QUERY_CAPACITY,
  summarizePasses,
} from './backend.js';
export { DeviceLostError, GpuContext, type DeviceLimits } from './runtime/gpu-context.js';
export type { WebGpuTensor } from './runtime/tensor.js';
export { coverageCut, coverageThreshold, fixedGamma, fixedMass } from './coverage.js';
export type { ProgramDescriptor } from './kernels/common.js';
export type { ScoreTileKind } from './kernels/proxy.js';
export { FMA_ATTENTION_WORKGROUP_BYTES, fmaAttentionProgram } from './kernels/attention/fma.js';
export {
  DEFAULT_SUBGROUP_MATRIX_FORM,
  SUBGROUP_MATRIX_FORMS,
  SUBGROUP_MATRIX_PARTS,
  SUBGROUP_MATRIX_WORKGROUP_BYTES,
  type SubgroupMatrixForm,
  type SubgroupMatrixPart,
  subgroupMatrixAttentionProgram,
  subgroupMatrixHeadDim,
  subgroupMatrixWorkgroupBytes,
} from './kernels/attention/subgroup-matrix.js';
