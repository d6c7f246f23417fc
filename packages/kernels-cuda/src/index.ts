/**
 * The CUDA backend: kernels compiled by NVRTC, the driver API through koffi, plans on the device.
 *
 * @module @crisp/kernels-cuda
 */
export { CudaBackend, CUDA_SPARSE_CROSSOVER, createCudaBackend } from './backend.js';
export type { CudaBackendOptions } from './backend.js';
export { ATTENTION_VARIANTS, defaultAttentionVariant } from './ops/attention.js';
export type { AttentionVariant } from './ops/attention.js';
export { DEFAULT_PROXY_LAYOUT, defaultProxyLayout, PROXY_LAYOUTS } from './ops/proxy-stats.js';
export type { ProxyLayout } from './ops/proxy-stats.js';
export { PDL_KERNELS } from './runtime/launcher.js';
export { CudaTensor } from './runtime/tensor.js';
export type { CudaDeviceInfo, CudaSchedule } from './runtime/context.js';
export type { TraceEntry } from './runtime/trace.js';
export { cudaAvailability } from './availability.js';
export { defaultCacheDir, defaultKernelDir } from './runtime/compile.js';
export { CUDA_ERROR, CudaFaults } from './faults.js';
export { NCCL_UNIQUE_ID_BYTES, ncclCollectives, type NcclCollectives, type NcclCollectivesOptions, ncclUniqueId, ncclVersion } from './nccl.js';
export type { FiredFault } from './faults.js';
