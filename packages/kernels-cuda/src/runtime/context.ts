/**
 * The backend's runtime: the device and its primary context, the memory pool, kernel
 * launches, streams and events, and tracing, as one object with ordinary members that the
 * operations (src/ops, src/plan) receive. Internal: not exported from the package index.
 */
import {
  type BackendCapabilities,
  CrispError,
  type DeviceTensor,
  InvalidArgumentError,
  NonFiniteError,
  numel,
} from '@crisp/core';
import { type CudaLibs, type Handle, RECREATE_ADVICE, check } from './ffi.js';
import { type Arg, I, Launcher, P, U64 } from './launcher.js';
import { type DeviceBlock, DevicePool } from './pool.js';
import { Streams } from './streams.js';
import { CudaTensor } from './tensor.js';
import { Tracer } from './trace.js';

/** What the CUDA backend runs (CudaBackend.capabilities). */
export const CUDA_CAPABILITIES: BackendCapabilities = Object.freeze({
  dtypes: ['bf16', 'f16'] as const,
  headDims: [64, 128] as const,
  blockSizes: [64, 128] as const,
  maxSequence: 1 << 20,
  chunkedPrefill: true,
  logSumExp: true,
});
export const BACKEND_NAME = 'cuda';

export interface CudaDeviceInfo {
  readonly name: string;
  readonly ordinal: number;
  readonly computeCapability: readonly [number, number];
  readonly multiprocessors: number;
  readonly driverVersion: number;
  readonly totalMemory: number;
}

/** CudaBackendOptions.schedule: the primary context's scheduling flags (CU_CTX_SCHED_SPIN 1, YIELD 2, BLOCKING_SYNC 4). */
export type CudaSchedule = 'spin' | 'yield' | 'blocking' | 'auto';
const SCHEDULE_FLAGS: Record<Exclude<CudaSchedule, 'auto'>, number> = { spin: 1, yield: 2, blocking: 4 };

/** The context's part of CudaBackendOptions (documented there). */
export interface ContextOptions {
  readonly device?: number;
  readonly cacheDir?: string | null;
  readonly kernelDir?: string;
  readonly checkFinite?: boolean;
  readonly schedule?: CudaSchedule;
  readonly programmaticLaunch?: boolean;
}

/**
 * Contexts open (created, not disposed) in this process, by driver and device ordinal: they
 * share the device's primary context.
 */
const OPEN = new WeakMap<object, Map<number, number>>();
function openCount(driver: CudaLibs): Map<number, number> {
  const key = driver.device ?? driver.cu;
  let m = OPEN.get(key);
  if (!m) {
    m = new Map();
    OPEN.set(key, m);
  }
  return m;
}

export class CudaContext {
  readonly libs: CudaLibs;
  readonly info: CudaDeviceInfo;
  /** compute capability as a number (90 for 9.0) */
  readonly arch: number;
  readonly pool: DevicePool;
  readonly launcher: Launcher;
  readonly tracer: Tracer;
  readonly streams: Streams;
  readonly checkFinite: boolean;
  readonly #ctx: Handle;
  /** the open contexts of this driver, by ordinal (OPEN) */
  readonly #open: Map<number, number>;
  disposed = false;
  /** kernels launched on the main stream so far (planOnDevice's guard for its second stream) */
  mainLaunches = 0;

  constructor(driver: CudaLibs, opts: ContextOptions, cacheDir: string | null) {
    // this context's own view of the driver: `check` records there an error that left the
    // context unusable (CudaLibs.health), which alive() then reports
    const libs: CudaLibs = { koffi: driver.koffi, cu: driver.cu, nvrtc: driver.nvrtc, health: {} };
    this.libs = libs;
    this.#open = openCount(driver);
    const cu = libs.cu;
    check(libs, cu.cuInit(0), 'cuInit');
    const count = [0];
    check(libs, cu.cuDeviceGetCount(count), 'cuDeviceGetCount');
    const ordinal = opts.device ?? 0;
    if (!Number.isInteger(ordinal) || ordinal < 0 || ordinal >= count[0]) {
      throw new CrispError(
        'BACKEND_UNAVAILABLE',
        `CUDA device ${ordinal} does not exist: the driver sees ${count[0]} device(s)`,
      );
    }
    const dev = [0];
    check(libs, cu.cuDeviceGet(dev, ordinal), 'cuDeviceGet');
    const attr = (a: number) => {
      const v = [0];
      check(libs, cu.cuDeviceGetAttribute(v, a, dev[0]), `cuDeviceGetAttribute(${a})`);
      return v[0];
    };
    const major = attr(75);
    const minor = attr(76);
    const sms = attr(16);
    const nameBuf = new Uint8Array(256);
    check(libs, cu.cuDeviceGetName(nameBuf, 256, dev[0]), 'cuDeviceGetName');
    const name = new TextDecoder().decode(nameBuf.subarray(0, nameBuf.indexOf(0)));
    const ver = [0];
    check(libs, cu.cuDriverGetVersion(ver), 'cuDriverGetVersion');
    if (major < 8) {
      throw new CrispError(
        'BACKEND_UNAVAILABLE',
        `${name} has compute capability ${major}.${minor}; the CRISP kernels need 8.0 or newer (bf16 tensor cores, cp.async)`,
      );
    }
    const schedule = opts.schedule ?? 'auto';
    if (schedule !== 'auto' && !Object.hasOwn(SCHEDULE_FLAGS, schedule)) {
      throw new InvalidArgumentError(`schedule must be one of spin, yield, blocking, auto; got ${String(schedule)}`);
    }
    if (schedule !== 'auto') {
      // the scheduling bits only; the driver keeps the context's other flags as they are
      const state = [0];
      const active = [0];
      check(libs, cu.cuDevicePrimaryCtxGetState(dev[0], state, active), 'cuDevicePrimaryCtxGetState');
      const flags = (state[0] & ~7) | SCHEDULE_FLAGS[schedule];
      // a driver that refuses (older ones do while the context is active elsewhere in the
      // process) leaves the flags as they were: the backend works either way
      if (flags !== state[0]) cu.cuDevicePrimaryCtxSetFlags(dev[0], flags);
    }
    const ctx = [null];
    check(libs, cu.cuDevicePrimaryCtxRetain(ctx, dev[0]), 'cuDevicePrimaryCtxRetain');
    this.#ctx = ctx[0];
    const open = this.#open.get(ordinal) ?? 0;
    let streams: Streams | undefined;
    try {
      check(libs, cu.cuCtxSetCurrent(this.#ctx), 'cuCtxSetCurrent');
      // a context an earlier fault left unusable answers here with its sticky error (the
      // primary context is shared: nothing of this backend is queued yet)
      check(libs, cu.cuCtxSynchronize(), 'cuCtxSynchronize');
      const mem = [0];
      const tot = [0];
      check(libs, cu.cuMemGetInfo(mem, tot), 'cuMemGetInfo');
      this.tracer = new Tracer(libs);
      streams = new Streams(libs, this.tracer, () => this.alive());
      this.streams = streams;
      this.info = Object.freeze({
        name,
        ordinal,
        computeCapability: [major, minor] as const,
        multiprocessors: sms,
        driverVersion: ver[0],
        totalMemory: Number(tot[0]),
      });
      this.arch = major * 10 + minor;
      this.pool = new DevicePool(libs, this.info.totalMemory);
      this.checkFinite = opts.checkFinite ?? true;
      const programmatic = Boolean((opts.programmaticLaunch ?? true) && major >= 9 && cu.cuLaunchKernelEx);
      this.launcher = new Launcher(libs, this.arch, cacheDir, opts.kernelDir, programmatic);
    } catch (e) {
      // nothing of this context stays behind: its stream and its hold on the primary context go
      if (streams) cu.cuStreamDestroy(streams.main);
      cu.cuDevicePrimaryCtxRelease(ordinal);
      if (e instanceof CrispError && e.code === 'DEVICE_LOST') {
        throw new CrispError(
          'DEVICE_LOST',
          `CUDA device ${ordinal}'s context is unusable (${(e.details?.cudaError as string | undefined) ?? e.message}), left so by an earlier fault in this process${open > 0 ? `; ${open} CUDA backend(s) of this process still hold it` : '; every backend of this process has let go and the driver still reports the fault'}: ${RECREATE_ADVICE}`,
          { ...e.details, openBackends: open },
        );
      }
      throw e;
    }
    this.#open.set(ordinal, open + 1);
  }

  /** Typed errors for a disposed backend and for one whose context a fault left unusable. */
  alive(): void {
    if (this.disposed) throw new CrispError('DISPOSED', 'this CUDA backend was disposed; create a new one');
    const lost = this.libs.health?.lost;
    if (lost) {
      throw new CrispError(
        'DEVICE_LOST',
        `this CUDA backend's context was lost to ${lost.cudaError} (${lost.code}, reported by ${lost.what}): no further work runs on it; ${RECREATE_ADVICE}`,
        { cudaError: lost.cudaError, code: lost.code },
      );
    }
  }

  /** Whether a fault left the context unusable (alive() throws DEVICE_LOST). */
  get lost(): boolean {
    return this.libs.health?.lost !== undefined;
  }

  /** the prepared masks' blocks go back to the pool (no-op after dispose) */
  releaseBlocks(blocks: readonly DeviceBlock[]): void {
    if (this.disposed) return;
    for (const b of blocks) this.pool.release(b);
  }

  releaseBlock(b: DeviceBlock): void {
    if (!this.disposed) this.pool.release(b);
  }

  /** Queues a kernel on the current stream (Streams.cur), profiled or traced when those are on. */
  launch(file: string, name: string, grid: readonly [number, number?, number?], block: number, smem: number, args: readonly Arg[]): void {
    const f = this.launcher.prepare(file, name, grid, smem, args);
    const prof = this.tracer.profile;
    const stream = this.streams.cur;
    if (stream === this.streams.main) this.mainLaunches++;
    if (prof) check(this.libs, this.libs.cu.cuEventRecord(prof.a, stream), 'cuEventRecord');
    const tr = this.tracer.trace ? this.tracer.mark(name, stream, this.streams.kind()) : undefined;
    this.launcher.submit(f, name, grid, block, smem, stream);
    if (tr) check(this.libs, this.libs.cu.cuEventRecord(tr, stream), 'cuEventRecord');
    if (prof) this.tracer.profiled(name, stream);
  }

  scratch(bytes: number): DeviceBlock {
    // (no closure unless tracing: this runs several times before a prefill's first launch)
    if (!this.tracer.trace) return this.pool.alloc(Math.max(4, bytes));
    return this.allocTraced(() => this.pool.alloc(Math.max(4, bytes)));
  }

  /** A pool allocation; while tracing, one the pool could not serve shows as a cuMemAlloc wait. */
  allocTraced(alloc: () => DeviceBlock): DeviceBlock {
    if (!this.tracer.trace) return alloc();
    const t = performance.now();
    const misses = this.pool.misses;
    const b = alloc();
    if (this.pool.misses !== misses) this.tracer.wait(`cuMemAlloc for ${b.size} B`, t);
    return b;
  }

  /**
   * A host array in a scratch block, copied on the kernels' stream: ordered after the kernels
   * queued before it and before those queued after, without waiting for them (a synchronous
   * cuMemcpyHtoD first drains the stream: one idle gap of the GPU per upload). From pageable
   * memory the driver stages the bytes before returning, so `a` may change right after.
   */
  uploadArray(a: Int32Array | Float32Array | Float64Array): DeviceBlock {
    const b = this.scratch(a.byteLength);
    if (a.byteLength > 0) {
      const t = this.tracer.trace ? performance.now() : 0;
      check(this.libs, this.libs.cu.cuMemcpyHtoDAsync(b.ptr, a, a.byteLength, this.streams.cur), 'cuMemcpyHtoDAsync');
      if (this.tracer.trace) this.tracer.wait(`upload ${a.byteLength} B`, t);
    }
    return b;
  }

  /** A synchronous device-to-host copy (waits for the work queued before it). */
  read<T extends Float32Array | Int32Array | Float64Array | Uint16Array>(ptr: number, out: T): T {
    const t = this.tracer.trace ? performance.now() : 0;
    if (out.byteLength > 0) check(this.libs, this.libs.cu.cuMemcpyDtoH(out, ptr, out.byteLength), 'cuMemcpyDtoH');
    if (this.tracer.trace) this.tracer.wait(`read ${out.byteLength} B`, t);
    return out;
  }

  /**
   * NaN/Inf in q, k or v would vanish inside a softmax (a -Inf score is just a zero
   * weight), so inputs are checked on the device first: one read of each tensor and a
   * 4-byte readback. Off with `checkFinite: false`.
   */
  assertFinite(t: CudaTensor, what: string): void {
    // Once per tensor version: a plan and its run read q and k up to three times, and at
    // 512k each check is a 1-4 GB read (about 13 ms a prefill when repeated).
    if (!this.checkFinite || t.dtype === 'f32' || t.checkedFinite) return;
    const flag = this.scratch(4);
    try {
      check(this.libs, this.libs.cu.cuMemsetD32Async(flag.ptr, 0, 1, this.streams.main), 'cuMemsetD32Async');
      const count = numel(t.shape);
      this.launch('mask/mask.cu', 'count_nonfinite', [Math.max(1, Math.min(4096, Math.ceil(count / 256)))], 256, 0, [
        P(t.ptr),
        U64(count),
        I(t.dtype === 'bf16' ? 0x7f80 : 0x7c00),
        P(flag.ptr),
      ]);
      const c = this.read(flag.ptr, new Int32Array(1))[0];
      if (c !== 0) {
        throw new NonFiniteError(`${what} holds ${c >>> 0} NaN/Inf values; clean the input before attention`, {
          tensor: what,
          count: c >>> 0,
        });
      }
      t.setCheckedFinite();
    } finally {
      this.pool.release(flag);
    }
  }

  /** `t` as this backend's tensor, not disposed (typed errors otherwise). */
  tensor(t: DeviceTensor, what: string): CudaTensor {
    if (!(t instanceof CudaTensor)) {
      if (!t || typeof t !== 'object') throw new InvalidArgumentError(`${what} must be a device tensor; got ${t === null ? 'null' : typeof t}`);
      throw new CrispError('WRONG_BACKEND', `${what} belongs to backend '${t.backend}', not cuda; upload it here first`);
    }
    if (t.owner !== this) {
      throw new CrispError(
        'WRONG_BACKEND',
        `${what} belongs to another CUDA backend${t.owner instanceof CudaContext ? ` (device ${t.owner.info.ordinal})` : ''}; tensors are not shared between backends: download it and upload it here`,
      );
    }
    if (t.disposed) throw new CrispError('DISPOSED', `${what} was disposed; allocate or upload a new tensor`);
    return t;
  }

  /** A new tensor in a pool block (OUT_OF_MEMORY at once when it cannot fit the device at all). */
  allocate(dtype: CudaTensor['dtype'], shape: readonly number[], bytes: number): CudaTensor {
    if (!(Number.isSafeInteger(bytes) && bytes <= this.info.totalMemory)) {
      throw new CrispError(
        'OUT_OF_MEMORY',
        `a ${dtype} tensor of shape [${shape}] needs ${(bytes / 2 ** 30).toFixed(2)} GiB; ${this.info.name} has ${(this.info.totalMemory / 2 ** 30).toFixed(2)} GiB in all: use a shorter sequence or fewer heads`,
        { bytes, totalMemory: this.info.totalMemory },
      );
    }
    return new CudaTensor(this, dtype, shape, this.scratch(bytes), bytes);
  }

  /**
   * Tears the context down once the caller has given back what it keeps (`release`, after
   * the device is idle and before the pool is trimmed).
   */
  dispose(release: () => void): void {
    if (this.disposed) return;
    const cu = this.libs.cu;
    // Each step on its own: on a context a fault left unusable every driver call fails, and
    // the hold on the primary context must still go (a driver that can clear the fault gives a
    // fresh context only once every holder has let go; the H200's driver 580 (CUDA 13.0) keeps a kernel
    // fault for the rest of the process).
    const attempt = (fn: () => void) => {
      try {
        fn();
      } catch {
        // (a lost context: the driver frees everything of it with the context)
      }
    };
    attempt(() => cu.cuCtxSynchronize());
    attempt(release);
    attempt(() => this.pool.trim());
    // the live tensors' memory too: the primary context (which would free it) may outlive this backend
    attempt(() => this.pool.freeAll());
    this.disposed = true;
    attempt(() => this.launcher.unload());
    attempt(() => this.streams.dispose());
    attempt(() => this.launcher.free());
    cu.cuDevicePrimaryCtxRelease(this.info.ordinal);
    this.#open.set(this.info.ordinal, Math.max(0, (this.#open.get(this.info.ordinal) ?? 1) - 1));
  }
}
