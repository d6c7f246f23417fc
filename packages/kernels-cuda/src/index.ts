export { CudaBackend, CudaTensor, CUDA_SPARSE_CROSSOVER, createCudaBackend } from './cuda-backend.js';
export type { CudaBackendOptions, CudaDeviceInfo } from './cuda-backend.js';
export { cudaAvailability } from './availability.js';
export { defaultCacheDir, defaultKernelDir } from './compile.js';
