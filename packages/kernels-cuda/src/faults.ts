/**
 * Fault injection between the CUDA backend and the driver, for tests and soak runs: fail the
 * k-th allocation with CUDA_ERROR_OUT_OF_MEMORY, fail a kernel launch (with a chosen code, or
 * by handing the driver a launch it must refuse), load a module image the driver rejects, or
 * fault the context (every later call answers with a sticky error, or, on a GPU, a kernel is
 * given an unmapped pointer so the device itself faults). Works over the real driver and the
 * stand-in alike:
 *
 *   const faults = new CudaFaults();
 *   const be = await createCudaBackend({ faults });
 *   faults.failAlloc({ at: 3 });        // the third cuMemAlloc from now on, and every one after
 *   await sparsePrefill(be, inputs, crisp).catch((e) => e.code); // 'OUT_OF_MEMORY'
 *   faults.clear();
 *
 * Nothing fires until armed; a disarmed injector only counts calls.
 */
import type { CudaLibs } from './runtime/ffi.js';

/** CUresults the injector uses by default. */
export const CUDA_ERROR = Object.freeze({
  INVALID_VALUE: 1,
  OUT_OF_MEMORY: 2,
  INVALID_IMAGE: 200,
  ILLEGAL_ADDRESS: 700,
  LAUNCH_FAILED: 719,
});

/** A device address no allocation is ever given (the first page): a kernel reading it faults. */
const UNMAPPED = 0x1000n;

/** What fired, in order (CudaFaults.fired). */
export interface FiredFault {
  readonly kind: 'alloc' | 'launch' | 'moduleLoad' | 'fault';
  /** the kernel, for launches */
  readonly kernel?: string;
  /** the CUresult returned, or 0 where the driver was handed a call it must refuse or fault on */
  readonly code: number;
}

type KernelMatch = string | RegExp | undefined;

interface LaunchArm {
  at: number;
  readonly kernel: KernelMatch;
  readonly mode: 'code' | 'invalid' | 'corrupt';
  readonly code: number;
  readonly sticky: boolean;
}

/** The driver calls that do not need a context: a faulted context still answers them. */
const CONTEXT_FREE = new Set([
  'cuInit',
  'cuDriverGetVersion',
  'cuDeviceGetCount',
  'cuDeviceGet',
  'cuDeviceGetAttribute',
  'cuDeviceGetName',
  'cuDevicePrimaryCtxRetain',
  'cuDevicePrimaryCtxRelease',
  'cuDevicePrimaryCtxGetState',
  'cuDevicePrimaryCtxSetFlags',
  'cuCtxSetCurrent',
  'cuGetErrorName',
]);

export class CudaFaults {
  /** cuMemAlloc calls seen since the last arming (failAlloc or clear) */
  allocs = 0;
  /** kernel launches seen since the last arming (failLaunch, fault or clear), matching ones only when a kernel was named */
  launches = 0;
  /** what fired, in order */
  readonly fired: FiredFault[] = [];
  #alloc: { at: number; times: number; code: number } | undefined;
  #launch: LaunchArm | undefined;
  #moduleLoads = 0;
  /** the sticky error every context call returns once the emulated context faulted */
  #poison: number | undefined;
  /** holds on the primary context (retain minus release): the faulted context goes with the last */
  #retained = 0;
  /** kernel handles' names (cuModuleGetFunction), for launches named by kernel */
  readonly #names = new Map<unknown, string>();

  /** The k-th cuMemAlloc from now on (1 = the next) and the `times` after it fail with `code` (default: every one until clear()). */
  failAlloc(opts: { at?: number; times?: number; code?: number } = {}): void {
    this.allocs = 0;
    this.#alloc = { at: opts.at ?? 1, times: opts.times ?? Number.POSITIVE_INFINITY, code: opts.code ?? CUDA_ERROR.OUT_OF_MEMORY };
  }

  /**
   * The k-th kernel launch from now on (of `kernel` when given, a name or a pattern) fails,
   * once. `mode` 'code' (default) returns `code` (default CUDA_ERROR_INVALID_VALUE) without
   * reaching the driver; 'invalid' hands the driver the launch with a block of 4096 threads,
   * which it must refuse itself.
   */
  failLaunch(opts: { at?: number; kernel?: string | RegExp; mode?: 'code' | 'invalid'; code?: number } = {}): void {
    this.launches = 0;
    this.#launch = { at: opts.at ?? 1, kernel: opts.kernel, mode: opts.mode ?? 'code', code: opts.code ?? CUDA_ERROR.INVALID_VALUE, sticky: false };
  }

  /**
   * The k-th kernel launch from now on faults the context. `mode` 'code' (default) emulates
   * it: the launch succeeds, and every later call that needs the context returns `code`
   * (default CUDA_ERROR_ILLEGAL_ADDRESS) until every hold on the primary context is released;
   * 'corrupt' (on a GPU) gives the kernel an unmapped address for its first argument, so the
   * device faults and the driver reports it.
   */
  fault(opts: { at?: number; kernel?: string | RegExp; mode?: 'code' | 'corrupt'; code?: number } = {}): void {
    this.launches = 0;
    this.#launch = { at: opts.at ?? 1, kernel: opts.kernel, mode: opts.mode ?? 'code', code: opts.code ?? CUDA_ERROR.ILLEGAL_ADDRESS, sticky: true };
  }

  /** The next `times` module loads fail with CUDA_ERROR_INVALID_IMAGE (a corrupt cubin). */
  failModuleLoad(times = 1): void {
    this.#moduleLoads = times;
  }

  /** Disarms everything (an emulated faulted context stays faulted until released) and restarts the counts. */
  clear(): void {
    this.#alloc = undefined;
    this.#launch = undefined;
    this.#moduleLoads = 0;
    this.allocs = 0;
    this.launches = 0;
  }

  /** whether the emulated context is faulted */
  get faulted(): boolean {
    return this.#poison !== undefined;
  }

  /** `libs` with this injector between them and the driver. */
  wrap(libs: CudaLibs): CudaLibs {
    const cu = libs.cu as unknown as Record<string, (...a: unknown[]) => number>;
    const koffi = libs.koffi;
    const out: Record<string, unknown> = {};
    for (const [name, f] of Object.entries(cu)) {
      if (typeof f !== 'function') continue;
      out[name] = CONTEXT_FREE.has(name) ? f : (...a: unknown[]) => this.#poison ?? f(...a);
    }
    out.cuDevicePrimaryCtxRetain = (...a: unknown[]) => {
      const r = cu.cuDevicePrimaryCtxRetain(...a);
      if (r === 0) this.#retained++;
      return r;
    };
    out.cuDevicePrimaryCtxRelease = (...a: unknown[]) => {
      const r = cu.cuDevicePrimaryCtxRelease(...a);
      this.#retained = Math.max(0, this.#retained - 1);
      // the last hold gone, the driver destroys the context: the next one is fresh
      if (this.#retained === 0) this.#poison = undefined;
      return r;
    };
    out.cuModuleGetFunction = (fn: unknown, mod: unknown, name: unknown) => {
      const r = this.#poison ?? cu.cuModuleGetFunction(fn, mod, name);
      if (r === 0) this.#names.set((fn as unknown[])[0], String(name));
      return r;
    };
    out.cuModuleLoadData = (...a: unknown[]) => {
      if (this.#poison !== undefined) return this.#poison;
      if (this.#moduleLoads > 0) {
        this.#moduleLoads--;
        this.fired.push({ kind: 'moduleLoad', code: CUDA_ERROR.INVALID_IMAGE });
        return CUDA_ERROR.INVALID_IMAGE;
      }
      return cu.cuModuleLoadData(...a);
    };
    out.cuMemAlloc = (...a: unknown[]) => {
      if (this.#poison !== undefined) return this.#poison;
      this.allocs++;
      const arm = this.#alloc;
      if (arm && this.allocs >= arm.at && this.allocs < arm.at + arm.times) {
        this.fired.push({ kind: 'alloc', code: arm.code });
        return arm.code;
      }
      return cu.cuMemAlloc(...a);
    };
    // (f, gx, gy, gz, bx, by, bz, shared bytes, stream, params, extra)
    out.cuLaunchKernel = (...a: unknown[]) => {
      if (this.#poison !== undefined) return this.#poison;
      const arm = this.#armed(a[0]);
      if (!arm) return cu.cuLaunchKernel(...a);
      const kernel = this.#names.get(a[0]);
      if (arm.mode === 'code') return this.#fire(arm, kernel, () => cu.cuLaunchKernel(...a));
      if (arm.mode === 'invalid') {
        const b = [...a];
        b[4] = 4096;
        this.fired.push({ kind: 'launch', kernel, code: 0 });
        return cu.cuLaunchKernel(...b);
      }
      return this.#corrupt(koffi, a[9], kernel, () => cu.cuLaunchKernel(...a));
    };
    if (cu.cuLaunchKernelEx) {
      // (config, f, params, extra); CUlaunchConfig's blockDimX at byte 12
      out.cuLaunchKernelEx = (...a: unknown[]) => {
        if (this.#poison !== undefined) return this.#poison;
        const arm = this.#armed(a[1]);
        if (!arm) return cu.cuLaunchKernelEx(...a);
        const kernel = this.#names.get(a[1]);
        if (arm.mode === 'code') return this.#fire(arm, kernel, () => cu.cuLaunchKernelEx(...a));
        if (arm.mode === 'invalid') {
          const view = new DataView(koffi.view(a[0], 16));
          const bx = view.getUint32(12, true);
          view.setUint32(12, 4096, true);
          this.fired.push({ kind: 'launch', kernel, code: 0 });
          try {
            return cu.cuLaunchKernelEx(...a);
          } finally {
            view.setUint32(12, bx, true);
          }
        }
        return this.#corrupt(koffi, a[2], kernel, () => cu.cuLaunchKernelEx(...a));
      };
    }
    return { koffi, nvrtc: libs.nvrtc, cu: out as unknown as CudaLibs['cu'], device: libs.device ?? libs.cu };
  }

  /** The launch arm when this launch is the one it waits for (then disarmed). */
  #armed(fn: unknown): LaunchArm | undefined {
    const arm = this.#launch;
    if (!arm) return undefined;
    const name = this.#names.get(fn) ?? '';
    if (arm.kernel !== undefined && !(typeof arm.kernel === 'string' ? name === arm.kernel : arm.kernel.test(name))) return undefined;
    this.launches++;
    if (this.launches !== arm.at) return undefined;
    this.#launch = undefined;
    return arm;
  }

  /** A 'code' arm: the launch fails with its code, or (sticky) runs and faults the context behind it. */
  #fire(arm: LaunchArm, kernel: string | undefined, launch: () => number): number {
    if (!arm.sticky) {
      this.fired.push({ kind: 'launch', kernel, code: arm.code });
      return arm.code;
    }
    const r = launch();
    this.#poison = arm.code;
    this.fired.push({ kind: 'fault', kernel, code: arm.code });
    return r;
  }

  /** The launch with its first argument (a pointer in every kernel here) set to an unmapped address. */
  // biome-ignore lint/suspicious/noExplicitAny: the koffi module
  #corrupt(koffi: any, params: unknown, kernel: string | undefined, launch: () => number): number {
    const slots = new DataView(koffi.view(params, 8));
    const at = Number(slots.getBigUint64(0, true) - BigInt(koffi.address(params)));
    const view = new DataView(koffi.view(params, at + 8));
    const was = view.getBigUint64(at, true);
    view.setBigUint64(at, UNMAPPED, true);
    this.fired.push({ kind: 'fault', kernel, code: 0 });
    try {
      return launch();
    } finally {
      view.setBigUint64(at, was, true);
    }
  }
}
