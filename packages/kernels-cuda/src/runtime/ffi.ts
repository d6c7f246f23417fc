/**
 * The CUDA driver API and NVRTC through koffi: no native build step. Handles (contexts,
 * modules, functions, streams, events) are opaque pointers; device pointers are numbers
 * (CUdeviceptr fits in 53 bits on every driver we know of).
 *
 * Every failing call becomes a CrispError carrying the CUDA error name:
 * OUT_OF_MEMORY for CUDA_ERROR_OUT_OF_MEMORY, DEVICE_LOST for the errors that leave the
 * context unusable (STICKY_ERRORS: a kernel that faulted, a lost device), BACKEND_ERROR
 * otherwise.
 */
import { createRequire } from 'node:module';
import { CrispError } from '@crisp/core';

// biome-ignore lint/suspicious/noExplicitAny: koffi's handles are untyped by nature
type Fn = (...args: any[]) => any;
// biome-ignore lint/suspicious/noExplicitAny: see above
export type Handle = any;

export interface CudaDriver {
  readonly cuInit: Fn;
  readonly cuDriverGetVersion: Fn;
  readonly cuDeviceGetCount: Fn;
  readonly cuDeviceGet: Fn;
  readonly cuDeviceGetAttribute: Fn;
  readonly cuDeviceGetName: Fn;
  readonly cuDevicePrimaryCtxRetain: Fn;
  readonly cuDevicePrimaryCtxRelease: Fn;
  readonly cuDevicePrimaryCtxSetFlags: Fn;
  readonly cuDevicePrimaryCtxGetState: Fn;
  readonly cuCtxSetCurrent: Fn;
  readonly cuCtxSynchronize: Fn;
  readonly cuModuleLoadData: Fn;
  readonly cuModuleUnload: Fn;
  readonly cuModuleGetFunction: Fn;
  readonly cuFuncSetAttribute: Fn;
  readonly cuLaunchKernel: Fn;
  /**
   * cuLaunchKernelEx (CUDA 12.0 and later drivers; absent on older ones): a launch with
   * attributes, here programmatic stream serialisation (CudaBackendOptions.programmaticLaunch)
   */
  readonly cuLaunchKernelEx?: Fn;
  /**
   * cuTensorMapEncodeTiled (CUDA 12.0 and later drivers): a TMA tensor map (CUtensorMap, 128
   * bytes) for the attention layouts that load K and V with the tensor memory accelerator
   */
  readonly cuTensorMapEncodeTiled?: Fn;
  readonly cuMemAlloc: Fn;
  readonly cuMemFree: Fn;
  readonly cuMemGetInfo: Fn;
  readonly cuMemcpyHtoD: Fn;
  readonly cuMemcpyDtoH: Fn;
  readonly cuMemcpyDtoHAsync: Fn;
  readonly cuMemcpyHtoDAsync: Fn;
  readonly cuMemsetD32Async: Fn;
  readonly cuMemsetD16Async: Fn;
  readonly cuStreamCreate: Fn;
  readonly cuStreamCreateWithPriority: Fn;
  readonly cuCtxGetStreamPriorityRange: Fn;
  readonly cuStreamDestroy: Fn;
  readonly cuStreamSynchronize: Fn;
  /** cuStreamQuery: 0 when the stream's work is done, CUDA_ERROR_NOT_READY (600) while it runs */
  readonly cuStreamQuery?: Fn;
  readonly cuEventCreate: Fn;
  readonly cuEventDestroy: Fn;
  readonly cuEventRecord: Fn;
  readonly cuEventSynchronize: Fn;
  readonly cuEventElapsedTime: Fn;
  readonly cuStreamWaitEvent: Fn;
  readonly cuGetErrorName: Fn;
}

export interface Nvrtc {
  readonly nvrtcVersion: Fn;
  readonly nvrtcCreateProgram: Fn;
  readonly nvrtcCompileProgram: Fn;
  readonly nvrtcGetCUBINSize: Fn;
  readonly nvrtcGetCUBIN: Fn;
  readonly nvrtcGetProgramLogSize: Fn;
  readonly nvrtcGetProgramLog: Fn;
  readonly nvrtcDestroyProgram: Fn;
  readonly nvrtcGetErrorString: Fn;
}

export interface CudaLibs {
  // biome-ignore lint/suspicious/noExplicitAny: the koffi module
  readonly koffi: any;
  readonly cu: CudaDriver;
  readonly nvrtc: Nvrtc;
  /**
   * A backend's own view of the driver carries this: `check` records there the first error
   * that left the context unusable, and the backend refuses every later call with it.
   */
  readonly health?: { lost?: ContextLoss };
  /**
   * The driver these functions reach, when they wrap another table's (CudaFaults.wrap): the
   * backends of one driver share each device's primary context. Default: `cu` itself.
   */
  readonly device?: object;
}

/** The error that left a context unusable (CudaLibs.health). */
export interface ContextLoss {
  readonly cudaError: string;
  readonly code: number;
  /** the driver call that reported it */
  readonly what: string;
}

const CUDA_ERROR_OUT_OF_MEMORY = 2;

/**
 * CUresults after which the context is unusable: every later call on it returns the same
 * error (cuda.h: "the process ... must be terminated and relaunched", or, with the driver
 * API, the context destroyed and a new one made). DEINITIALIZED 4, ECC_UNCORRECTABLE 214,
 * ILLEGAL_ADDRESS 700, LAUNCH_TIMEOUT 702, CONTEXT_IS_DESTROYED 709, ASSERT 710,
 * HARDWARE_STACK_ERROR 714, ILLEGAL_INSTRUCTION 715, MISALIGNED_ADDRESS 716,
 * INVALID_ADDRESS_SPACE 717, INVALID_PC 718, LAUNCH_FAILED 719, EXTERNAL_DEVICE 911.
 */
export const STICKY_ERRORS: ReadonlySet<number> = new Set([4, 214, 700, 702, 709, 710, 714, 715, 716, 717, 718, 719, 911]);

/** The advice every DEVICE_LOST error ends with. */
export const RECREATE_ADVICE =
  'dispose this backend and every other CUDA backend of this process (they share the device\'s primary context); NVIDIA\'s driver keeps a kernel fault for the rest of the process, so restart the process (or the worker or child process that runs the CUDA work) to use the device again';

let cached: CudaLibs | undefined;
let failure: string | undefined;

function loadKoffi(): unknown {
  // import.meta.url is empty where a bundler made this module CommonJS (esbuild
  // --format=cjs, webpack's commonjs output, a Node single executable): the bundle's own
  // require is in scope there and finds koffi beside the bundle
  const load = import.meta.url ? createRequire(import.meta.url) : require;
  return load('koffi');
}

const NVRTC_NAMES = [
  'libnvrtc.so',
  'libnvrtc.so.13',
  'libnvrtc.so.12',
  '/usr/local/cuda/lib64/libnvrtc.so',
  '/usr/local/cuda/lib64/libnvrtc.so.13',
  '/usr/local/cuda/lib64/libnvrtc.so.12',
];

/** Load libcuda.so.1 and libnvrtc; throws BACKEND_UNAVAILABLE with the reason. */
export function loadCuda(): CudaLibs {
  if (cached) return cached;
  if (failure) throw new CrispError('BACKEND_UNAVAILABLE', failure);
  try {
    cached = bind();
    return cached;
  } catch (e) {
    failure = e instanceof CrispError ? e.message : `CUDA could not be loaded: ${(e as Error).message}`;
    throw new CrispError('BACKEND_UNAVAILABLE', failure);
  }
}

/**
 * The first of `names` that koffi loads (a shared library's sonames, most specific first),
 * and why each one before it did not: its error's first line.
 */
// biome-ignore lint/suspicious/noExplicitAny: koffi module
export function loadFirst(koffi: any, names: readonly string[]): { lib: Handle | undefined; tried: string[] } {
  const tried: string[] = [];
  for (const name of names) {
    try {
      return { lib: koffi.load(name), tried };
    } catch (e) {
      tried.push(`${name}: ${(e as Error).message.split('\n')[0]}`);
    }
  }
  return { lib: undefined, tried };
}

function bind(): CudaLibs {
  // biome-ignore lint/suspicious/noExplicitAny: koffi module
  let koffi: any;
  try {
    koffi = loadKoffi();
  } catch (e) {
    throw new CrispError('BACKEND_UNAVAILABLE', `the koffi FFI package did not load: ${(e as Error).message}`);
  }
  let lib: Handle;
  try {
    lib = koffi.load('libcuda.so.1');
  } catch (e) {
    throw new CrispError(
      'BACKEND_UNAVAILABLE',
      `no NVIDIA driver: libcuda.so.1 did not load (${(e as Error).message.split('\n')[0]}); install the driver or use another backend`,
    );
  }
  const { lib: nv, tried } = loadFirst(koffi, NVRTC_NAMES);
  if (!nv) {
    throw new CrispError(
      'BACKEND_UNAVAILABLE',
      `NVRTC not found (tried ${NVRTC_NAMES.join(', ')}); add the CUDA toolkit's lib64 to LD_LIBRARY_PATH`,
      { tried },
    );
  }
  const f = (l: Handle, proto: string): Fn => l.func(proto);
  const first = (l: Handle, protos: string[]): Fn => {
    let err: unknown;
    for (const p of protos) {
      try {
        return l.func(p);
      } catch (e) {
        err = e;
      }
    }
    throw err;
  };
  const optional = (l: Handle, proto: string): Fn | undefined => {
    try {
      return l.func(proto);
    } catch {
      return undefined;
    }
  };
  const cu: CudaDriver = {
    cuInit: f(lib, 'int cuInit(unsigned int flags)'),
    cuDriverGetVersion: f(lib, 'int cuDriverGetVersion(_Out_ int *v)'),
    cuDeviceGetCount: f(lib, 'int cuDeviceGetCount(_Out_ int *n)'),
    cuDeviceGet: f(lib, 'int cuDeviceGet(_Out_ int *dev, int ordinal)'),
    cuDeviceGetAttribute: f(lib, 'int cuDeviceGetAttribute(_Out_ int *v, int attrib, int dev)'),
    cuDeviceGetName: f(lib, 'int cuDeviceGetName(void *name, int len, int dev)'),
    cuDevicePrimaryCtxRetain: f(lib, 'int cuDevicePrimaryCtxRetain(_Out_ void **ctx, int dev)'),
    cuDevicePrimaryCtxRelease: first(lib, [
      'int cuDevicePrimaryCtxRelease_v2(int dev)',
      'int cuDevicePrimaryCtxRelease(int dev)',
    ]),
    cuDevicePrimaryCtxSetFlags: first(lib, [
      'int cuDevicePrimaryCtxSetFlags_v2(int dev, unsigned int flags)',
      'int cuDevicePrimaryCtxSetFlags(int dev, unsigned int flags)',
    ]),
    cuDevicePrimaryCtxGetState: f(lib, 'int cuDevicePrimaryCtxGetState(int dev, _Out_ unsigned int *flags, _Out_ int *active)'),
    cuCtxSetCurrent: f(lib, 'int cuCtxSetCurrent(void *ctx)'),
    cuCtxSynchronize: f(lib, 'int cuCtxSynchronize()'),
    cuModuleLoadData: f(lib, 'int cuModuleLoadData(_Out_ void **mod, const void *image)'),
    cuModuleUnload: f(lib, 'int cuModuleUnload(void *mod)'),
    cuModuleGetFunction: f(lib, 'int cuModuleGetFunction(_Out_ void **fn, void *mod, const char *name)'),
    cuFuncSetAttribute: f(lib, 'int cuFuncSetAttribute(void *fn, int attrib, int value)'),
    cuLaunchKernel: f(
      lib,
      'int cuLaunchKernel(void *fn, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem, void *stream, void *params, void *extra)',
    ),
    cuLaunchKernelEx: optional(lib, 'int cuLaunchKernelEx(const void *config, void *fn, void *params, void *extra)'),
    // the map's and the tensor's addresses as integers (the map goes into the launcher's
    // 64-byte-aligned parameter area; the tensor is a device pointer)
    cuTensorMapEncodeTiled: optional(
      lib,
      'int cuTensorMapEncodeTiled(uint64_t map, int dataType, unsigned int rank, uint64_t address, const uint64_t *dims, const uint64_t *strides, const uint32_t *box, const uint32_t *elementStrides, int interleave, int swizzle, int l2Promotion, int oobFill)',
    ),
    cuMemAlloc: f(lib, 'int cuMemAlloc_v2(_Out_ uint64_t *ptr, size_t bytes)'),
    cuMemFree: f(lib, 'int cuMemFree_v2(uint64_t ptr)'),
    cuMemGetInfo: f(lib, 'int cuMemGetInfo_v2(_Out_ size_t *free, _Out_ size_t *total)'),
    cuMemcpyHtoD: f(lib, 'int cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t bytes)'),
    cuMemcpyDtoH: f(lib, 'int cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t bytes)'),
    cuMemcpyDtoHAsync: f(lib, 'int cuMemcpyDtoHAsync_v2(void *dst, uint64_t src, size_t bytes, void *stream)'),
    cuMemcpyHtoDAsync: f(lib, 'int cuMemcpyHtoDAsync_v2(uint64_t dst, const void *src, size_t bytes, void *stream)'),
    cuMemsetD32Async: f(lib, 'int cuMemsetD32Async(uint64_t dst, unsigned int v, size_t n, void *stream)'),
    cuMemsetD16Async: f(lib, 'int cuMemsetD16Async(uint64_t dst, unsigned short v, size_t n, void *stream)'),
    cuStreamCreate: f(lib, 'int cuStreamCreate(_Out_ void **stream, unsigned int flags)'),
    cuStreamCreateWithPriority: f(lib, 'int cuStreamCreateWithPriority(_Out_ void **stream, unsigned int flags, int priority)'),
    cuCtxGetStreamPriorityRange: f(lib, 'int cuCtxGetStreamPriorityRange(_Out_ int *least, _Out_ int *greatest)'),
    cuStreamDestroy: first(lib, ['int cuStreamDestroy_v2(void *s)', 'int cuStreamDestroy(void *s)']),
    cuStreamSynchronize: f(lib, 'int cuStreamSynchronize(void *s)'),
    cuStreamQuery: optional(lib, 'int cuStreamQuery(void *s)'),
    cuEventCreate: f(lib, 'int cuEventCreate(_Out_ void **ev, unsigned int flags)'),
    cuEventDestroy: first(lib, ['int cuEventDestroy_v2(void *ev)', 'int cuEventDestroy(void *ev)']),
    cuEventRecord: f(lib, 'int cuEventRecord(void *ev, void *stream)'),
    cuEventSynchronize: f(lib, 'int cuEventSynchronize(void *ev)'),
    cuStreamWaitEvent: f(lib, 'int cuStreamWaitEvent(void *stream, void *ev, unsigned int flags)'),
    cuEventElapsedTime: first(lib, [
      'int cuEventElapsedTime_v2(_Out_ float *ms, void *start, void *end)',
      'int cuEventElapsedTime(_Out_ float *ms, void *start, void *end)',
    ]),
    cuGetErrorName: f(lib, 'int cuGetErrorName(int err, _Out_ const char **name)'),
  };
  const nvrtc: Nvrtc = {
    nvrtcVersion: f(nv, 'int nvrtcVersion(_Out_ int *major, _Out_ int *minor)'),
    nvrtcCreateProgram: f(
      nv,
      'int nvrtcCreateProgram(_Out_ void **prog, const char *src, const char *name, int nh, const char **headers, const char **names)',
    ),
    nvrtcCompileProgram: f(nv, 'int nvrtcCompileProgram(void *prog, int n, const char **opts)'),
    nvrtcGetCUBINSize: f(nv, 'int nvrtcGetCUBINSize(void *prog, _Out_ size_t *size)'),
    nvrtcGetCUBIN: f(nv, 'int nvrtcGetCUBIN(void *prog, void *cubin)'),
    nvrtcGetProgramLogSize: f(nv, 'int nvrtcGetProgramLogSize(void *prog, _Out_ size_t *size)'),
    nvrtcGetProgramLog: f(nv, 'int nvrtcGetProgramLog(void *prog, void *log)'),
    nvrtcDestroyProgram: f(nv, 'int nvrtcDestroyProgram(_Inout_ void **prog)'),
    nvrtcGetErrorString: f(nv, 'const char *nvrtcGetErrorString(int res)'),
  };
  return { koffi, cu, nvrtc };
}

/** The CUDA error name for a CUresult (e.g. CUDA_ERROR_LAUNCH_FAILED). */
export function cudaErrorName(libs: CudaLibs, res: number): string {
  const out: [string | null] = [null];
  try {
    if (libs.cu.cuGetErrorName(res, out) === 0 && out[0]) return out[0];
  } catch {
    // fall through to the number
  }
  return `CUresult ${res}`;
}

/**
 * Throw the typed error for a failed driver call. An error that leaves the context unusable
 * (STICKY_ERRORS) is recorded in `libs.health`, so that the backend refuses later calls.
 */
export function check(libs: CudaLibs, res: number, what: string): void {
  if (res === 0) return;
  const name = cudaErrorName(libs, res);
  if (STICKY_ERRORS.has(res)) {
    const health = libs.health;
    if (health && !health.lost) health.lost = { cudaError: name, code: res, what };
    throw new CrispError(
      'DEVICE_LOST',
      `${what} failed: ${name} (${res}); the CUDA context is unusable from now on (a kernel faulted or the device failed): ${RECREATE_ADVICE}`,
      { cudaError: name, code: res },
    );
  }
  if (res === CUDA_ERROR_OUT_OF_MEMORY) {
    throw new CrispError('OUT_OF_MEMORY', `${what} failed: ${name}; free device tensors or use a shorter sequence`, {
      cudaError: name,
      code: res,
    });
  }
  throw new CrispError('BACKEND_ERROR', `${what} failed: ${name} (${res})`, { cudaError: name, code: res });
}

/** Cheap probe: can koffi load the driver and NVRTC? Never throws. */
export function probeCuda(): { available: boolean; reason?: string } {
  try {
    const libs = loadCuda();
    const r = libs.cu.cuInit(0);
    if (r !== 0) return { available: false, reason: `cuInit failed: ${cudaErrorName(libs, r)}` };
    const n = [0];
    const r2 = libs.cu.cuDeviceGetCount(n);
    if (r2 !== 0) return { available: false, reason: `cuDeviceGetCount failed: ${cudaErrorName(libs, r2)}` };
    if (n[0] < 1) return { available: false, reason: 'the NVIDIA driver found no CUDA device' };
    return { available: true };
  } catch (e) {
    return { available: false, reason: (e as Error).message };
  }
}
