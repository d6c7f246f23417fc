export {
  ATTENTION_VARIANTS,
  CudaBackend,
  CudaTensor,
  CUDA_SPARSE_CROSSOVER,
  createCudaBackend,
  DEFAULT_ATTENTION_VARIANT,
  DEFAULT_PROXY_LAYOUT,
  PROXY_LAYOUTS,
  UNVERIFIED_ATTENTION_VARIANTS,
} from './cuda-backend.js';
export type { AttentionVariant, CudaBackendOptions, CudaDeviceInfo, ProxyLayout } from './cuda-backend.js';
export { cudaAvailability } from './availability.js';
export { defaultCacheDir, defaultKernelDir } from './compile.js';
