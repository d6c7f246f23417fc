export {
  ATTENTION_VARIANTS,
  CudaBackend,
  CudaTensor,
  CUDA_SPARSE_CROSSOVER,
  createCudaBackend,
  defaultAttentionVariant,
  DEFAULT_PROXY_LAYOUT,
  defaultProxyLayout,
  PDL_KERNELS,
  PROXY_LAYOUTS,
} from './cuda-backend.js';
export type { AttentionVariant, CudaBackendOptions, CudaDeviceInfo, CudaSchedule, ProxyLayout, TraceEntry } from './cuda-backend.js';
export { cudaAvailability } from './availability.js';
export { defaultCacheDir, defaultKernelDir } from './compile.js';
