/**
 * A CUDA driver and NVRTC stand-in for CPU machines: every call returns success at once,
 * allocations come at increasing fake addresses, kernels "launch" into a log, and device
 * reads return zeros unless `onRead` fills them. It runs the backend's host path (argument
 * checks, the order of launches and reads, the pipeline around them) and measures what the
 * host spends; it checks no kernel arithmetic.
 */
import { createRequire } from 'node:module';
import type { CudaLibs } from './runtime/ffi.js';
import { devicePlanLayout, NO_BAD_ROW } from './plan/plan-layout.js';

export interface StandInEvent {
  /**
   * 'launch' (kernel name), 'read' (a synchronous copy to the host), 'copyRead' (on a stream),
   * 'record' (an event recorded), 'wait' (a stream made to wait for an event), 'ctxFlags'
   * (the primary context's flags set: name holds them)
   */
  readonly kind: 'launch' | 'read' | 'copyRead' | 'sync' | 'record' | 'wait' | 'ctxFlags' | 'tensorMap';
  readonly name?: string;
  readonly bytes?: number;
  /** a synchronous read's source: the device address it copied from */
  readonly src?: number;
  /** performance.now() at a launch */
  readonly at?: number;
  /**
   * a launch's first `decodeArgs` kernel arguments (standInDriver's option), each slot's 8
   * bytes read through cuLaunchKernel's kernelParams as [low 32 bits, high 32 bits]
   */
  readonly args?: readonly (readonly [number, number])[];
  /** with `args`: the kernelParams slots' pointers themselves (where each argument's bytes are) */
  readonly argPtrs?: readonly bigint[];
  /**
   * a 'tensorMap' (cuTensorMapEncodeTiled): where the map was written, the tensor's address,
   * its dimensions (innermost first), byte strides, box and swizzle mode
   */
  readonly tensorMap?: {
    readonly at: bigint;
    readonly address: bigint;
    readonly dims: readonly bigint[];
    readonly strides: readonly bigint[];
    readonly box: readonly number[];
    readonly swizzle: number;
  };
  /**
   * the stream of a launch, a record or a wait (the stream made to wait): streams are
   * numbered in creation order from 1 (the backend's main stream is 1)
   */
  readonly stream?: number;
  /**
   * a launch through cuLaunchKernelEx: its attributes as [id, first 32 bits of the value]
   * (read at the config's attribute list; [6, 1]: programmatic stream serialisation)
   */
  readonly attributes?: readonly (readonly [number, number])[];
  /** a launch's grid x, y, z, block x, y, z and dynamic shared bytes, through either call */
  readonly shape?: readonly number[];
}

export interface StandIn {
  readonly libs: CudaLibs;
  /** every launch and read, in order (clear it between checks) */
  readonly log: StandInEvent[];
  /**
   * The device memory the stand-in hands out: `bytes` and `blocks` live now (allocated, not
   * freed; all of it goes with the primary context's last release), `badFrees` cuMemFree calls
   * of an address that was not live (a double free).
   * cuMemAlloc fails with CUDA_ERROR_OUT_OF_MEMORY beyond `total`, and cuMemGetInfo reports
   * what is left.
   */
  readonly memory: { readonly bytes: number; readonly blocks: number; readonly badFrees: number; readonly total: number };
}

/** CUresult names the stand-in's cuGetErrorName knows (others: CUDA_ERROR_STAND_IN). */
const ERROR_NAMES: Readonly<Record<number, string>> = {
  1: 'CUDA_ERROR_INVALID_VALUE',
  2: 'CUDA_ERROR_OUT_OF_MEMORY',
  200: 'CUDA_ERROR_INVALID_IMAGE',
  700: 'CUDA_ERROR_ILLEGAL_ADDRESS',
  719: 'CUDA_ERROR_LAUNCH_FAILED',
};
/** the most dynamic shared memory a block may ask for on the stand-in's device (an H200: 227 KiB) */
const MAX_SHARED = 227 * 1024;

/**
 * `onRead(out, kind, src)`: fill a device read from device address `src` (zeros otherwise). Reads of H + 2 ints (expand's
 * summary) and of a device plan's prefix with its list pointers (devicePlanPrefix) get a
 * clean bad-row flag by default, so masks expand without a MaskError; the prefix also gets
 * a full PE list (every head routed to PE, as the zeros' C_struct says).
 */
export function standInDriver(
  opts: {
    heads?: number;
    onRead?: (out: ArrayBufferView & { length: number }, kind: 'read' | 'copyRead', src: number) => void;
    /** the first device address handed out (default 2^20) */
    baseAddress?: number;
    /** log each launch's first `decodeArgs` arguments (StandInEvent.args; default none) */
    decodeArgs?: number;
    /** the device's memory in bytes (default 1.4e11; cuMemGetInfo's total) */
    totalMemory?: number;
  } = {},
): StandIn {
  const require = createRequire(import.meta.url);
  const koffi = require('koffi');
  const H = opts.heads ?? 32;
  const log: StandInEvent[] = [];
  let next = opts.baseAddress ?? 1 << 20;
  const decodeArgs = opts.decodeArgs ?? 0;
  // kernelParams[i] is a host pointer to argument i's bytes: a launch's event gets the first
  // decodeArgs pointers and the bytes each points at (none when decodeArgs is 0)
  const launchArgs = (params: unknown): Pick<StandInEvent, 'args' | 'argPtrs'> => {
    if (decodeArgs === 0) return {};
    const ptrs = koffi.decode(params, 'uint64_t', decodeArgs) as BigUint64Array;
    const base = koffi.address(params) as bigint;
    // (read relative to kernelParams: koffi reads raw memory at an offset from a pointer)
    const args = Array.from(ptrs, (p): [number, number] => {
      const [lo, hi] = koffi.decode(params, Number(p - base), 'uint32_t', 2) as Uint32Array;
      return [lo, hi];
    });
    return { args, argPtrs: Array.from(ptrs, BigInt) };
  };
  let streams = 0;
  // streams are real host pointers (a launch config names its stream by address), numbered
  // in creation order from 1
  const streamIds = new Map<bigint, number>();
  const newStream = (out: unknown[]) => {
    const p = koffi.alloc('uint8_t', 8);
    streamIds.set(BigInt(koffi.address(p)), ++streams);
    return set(out, p);
  };
  // the primary context's scheduling flags (cuDevicePrimaryCtxSetFlags)
  let ctxFlags = 0;
  // cuLaunchKernelEx: a view of each launch config (and its attribute list) met, by buffer
  const configViews = new Map<unknown, { view: DataView; list: number }>();
  const sid = (s: unknown) => (s ? streamIds.get(BigInt(koffi.address(s))) : undefined);
  const set = (a: unknown[], x: unknown) => {
    a[0] = x;
    return 0;
  };
  const ATTRS: Record<number, number> = { 75: 9, 76: 0, 16: 132 };
  const total = opts.totalMemory ?? 1.4e11;
  const live = new Map<number, number>();
  const memory = { bytes: 0, blocks: 0, badFrees: 0, total };
  // holds on the primary context (cuDevicePrimaryCtxRetain minus Release)
  let retained = 0;
  // a launch the real driver refuses: more than 1024 threads a block, or more shared memory than the device has
  const refused = (bx: number, by: number, bz: number, smem: number) => bx * by * bz > 1024 || bx < 1 || smem > MAX_SHARED;
  const plan = devicePlanPrefix(H);
  const fill = (out: ArrayBufferView & { length: number }, kind: 'read' | 'copyRead', src: number) => {
    if (out instanceof Int32Array && out.length === H + 2) out[H + 1] = NO_BAD_ROW;
    if (out instanceof Int32Array && out.length === plan.ints) {
      out[plan.badRow] = NO_BAD_ROW;
      // every head routed to PE, as the zeros' C_struct says: the device's PE list is full
      out[plan.pe] = H;
      for (let h = 0; h < H; h++) out[plan.pe + 1 + h] = h;
    }
    opts.onRead?.(out, kind, src);
  };
  const cu = {
    cuInit: () => 0,
    cuDeviceGetCount: (c: number[]) => set(c, 1),
    cuDeviceGet: (d: number[]) => set(d, 0),
    cuDeviceGetAttribute: (v: number[], a: number) => set(v, ATTRS[a] ?? 0),
    cuDeviceGetName: (buf: Uint8Array) => {
      buf.set(new TextEncoder().encode('stand-in H200\0'));
      return 0;
    },
    cuDriverGetVersion: (v: number[]) => set(v, 12080),
    cuDevicePrimaryCtxRetain: (c: unknown[]) => {
      retained++;
      return set(c, {});
    },
    cuDevicePrimaryCtxRelease: () => {
      // the last hold gone, the driver destroys the context and everything allocated in it
      if (retained > 0 && --retained === 0) {
        live.clear();
        memory.bytes = 0;
        memory.blocks = 0;
      }
      return 0;
    },
    cuDevicePrimaryCtxSetFlags: (_dev: number, flags: number) => {
      ctxFlags = flags;
      log.push({ kind: 'ctxFlags', name: String(flags) });
      return 0;
    },
    cuDevicePrimaryCtxGetState: (_dev: number, flags: number[], active: number[]) => {
      flags[0] = ctxFlags;
      active[0] = 1;
      return 0;
    },
    cuCtxSetCurrent: () => 0,
    cuCtxSynchronize: () => 0,
    cuStreamCreate: (s: unknown[]) => newStream(s),
    cuStreamCreateWithPriority: (s: unknown[]) => newStream(s),
    cuCtxGetStreamPriorityRange: (least: unknown[], greatest: unknown[]) => {
      least[0] = 0;
      greatest[0] = -5;
      return 0;
    },
    cuStreamDestroy: () => 0,
    cuStreamSynchronize: () => {
      log.push({ kind: 'sync' });
      return 0;
    },
    cuEventCreate: (e: unknown[]) => set(e, {}),
    cuEventDestroy: () => 0,
    cuEventRecord: (_e: unknown, s: unknown) => {
      log.push({ kind: 'record', stream: sid(s) });
      return 0;
    },
    cuStreamWaitEvent: (s: unknown) => {
      log.push({ kind: 'wait', stream: sid(s) });
      return 0;
    },
    cuEventSynchronize: () => 0,
    cuEventElapsedTime: (ms: number[]) => set(ms, 0),
    cuMemGetInfo: (f: number[], t: number[]) => {
      t[0] = total;
      return set(f, total - memory.bytes);
    },
    cuMemAlloc: (out: number[], size: number) => {
      const bytes = Number(size);
      if (!(bytes > 0) || memory.bytes + bytes > total) return 2;
      set(out, next);
      live.set(next, bytes);
      memory.bytes += bytes;
      memory.blocks++;
      next += Math.ceil(bytes / 256) * 256 + 256;
      return 0;
    },
    cuMemFree: (p: number) => {
      const bytes = live.get(Number(p));
      if (bytes === undefined) {
        memory.badFrees++;
        return 1;
      }
      live.delete(Number(p));
      memory.bytes -= bytes;
      memory.blocks--;
      return 0;
    },
    cuModuleLoadData: (m: unknown[]) => set(m, {}),
    cuModuleUnload: () => 0,
    cuModuleGetFunction: (f: unknown[], _m: unknown, name: string) => set(f, { name }),
    cuFuncSetAttribute: () => 0,
    cuLaunchKernel: (f: { name: string }, ...rest: unknown[]) => {
      // (f, grid x y z, block x y z, shared bytes, stream, args, extra)
      const at = performance.now();
      const shape = rest.slice(0, 7).map(Number);
      if (refused(shape[3], shape[4], shape[5], shape[6])) return 1;
      log.push({ kind: 'launch', name: f.name, at, stream: sid(rest[7]), shape, ...launchArgs(rest[8]) });
      return 0;
    },
    cuLaunchKernelEx: (config: unknown, f: { name: string }, params: unknown) => {
      // CUlaunchConfig: grid, block, shared bytes (7 uint32), the stream's address at byte 32,
      // the attribute list's address at 40 and its length at 48; a CUlaunchAttribute is 72
      // bytes, its id first and its value from byte 8. Read through one view of the config
      // and its list (the backend passes the same buffer each time; a view a call, or koffi
      // decodes, would make the stand-in's launch the host path's largest cost in host-cost.mjs)
      const at = performance.now();
      let c = configViews.get(config);
      if (!c) {
        const list = Number(BigInt(koffi.decode(config, 40, 'uint64_t')) - BigInt(koffi.address(config)));
        const end = list + 72 * (koffi.decode(config, 48, 'uint32_t') as number);
        c = { view: new DataView(koffi.view(config, Math.max(56, end))), list };
        configViews.set(config, c);
      }
      const v = c.view;
      const shape = [0, 4, 8, 12, 16, 20, 24].map((o) => v.getUint32(o, true));
      const stream = streamIds.get(v.getBigUint64(32, true));
      if (refused(shape[3], shape[4], shape[5], shape[6])) return 1;
      const attributes = Array.from({ length: v.getUint32(48, true) }, (_, i) => [v.getUint32(c.list + 72 * i, true), v.getUint32(c.list + 72 * i + 8, true)] as const);
      log.push({ kind: 'launch', name: f.name, at, stream, shape, attributes, ...launchArgs(params) });
      return 0;
    },
    cuTensorMapEncodeTiled: (at: bigint, _dt: number, rank: number, address: bigint, dims: BigUint64Array, strides: BigUint64Array, box: Uint32Array, _es: Uint32Array, _il: number, swizzle: number) => {
      log.push({ kind: 'tensorMap', tensorMap: { at: BigInt(at), address: BigInt(address), dims: [...dims].slice(0, rank), strides: [...strides].slice(0, rank - 1), box: [...box].slice(0, rank), swizzle } });
      return 0;
    },
    cuMemcpyHtoD: () => 0,
    cuMemcpyHtoDAsync: () => 0,
    cuMemcpyDtoH: (out: ArrayBufferView & { length: number }, src: number | bigint) => {
      log.push({ kind: 'read', bytes: out.byteLength, src: Number(src) });
      fill(out, 'read', Number(src));
      return 0;
    },
    cuMemcpyDtoHAsync: (out: ArrayBufferView & { length: number }, src: number | bigint) => {
      log.push({ kind: 'copyRead', bytes: out.byteLength });
      fill(out, 'copyRead', Number(src));
      return 0;
    },
    cuMemsetD32Async: () => 0,
    cuMemsetD16Async: () => 0,
    cuGetErrorName: (e: number, s: unknown[]) => set(s, ERROR_NAMES[e] ?? 'CUDA_ERROR_STAND_IN'),
  };
  const nvrtc = {
    nvrtcVersion: (a: number[], b: number[]) => {
      b[0] = 8;
      return set(a, 12);
    },
    nvrtcCreateProgram: (p: unknown[]) => set(p, {}),
    nvrtcCompileProgram: () => 0,
    nvrtcGetCUBINSize: (s: number[]) => set(s, 16),
    nvrtcGetCUBIN: () => 0,
    nvrtcGetProgramLogSize: (s: number[]) => set(s, 1),
    nvrtcGetProgramLog: () => 0,
    nvrtcDestroyProgram: () => 0,
    nvrtcGetErrorString: () => 'NVRTC_STAND_IN',
  };
  return { libs: { koffi, cu, nvrtc } as unknown as CudaLibs, log, memory };
}

/**
 * Where a device plan's one copy (the device planner, `planner.plan`: the statistics' head values, the
 * routes, the PE head list, expand's summary, then the VS list pointers) holds what, in ints.
 */
export function devicePlanPrefix(H: number): { ints: number; routes: number; pe: number; badRow: number } {
  const { headBytes, sumOff, bytes } = devicePlanLayout(H);
  return { ints: bytes / 4 + 2 * (H + 1), routes: headBytes / 4, pe: headBytes / 4 + H, badRow: sumOff / 4 + H + 1 };
}
