/**
 * The thin layer over a GPUDevice: buffers, pipelines (cached by program cache key),
 * uniforms, dispatches and the device-loss guard every await goes through.
 *
 * Usage flags are written as numbers (the WebGPU spec fixes them), so this module needs no
 * globals such as GPUBufferUsage: Node's `webgpu` package does not install them.
 */
import type { GpuProfiler } from './gpu-profile.js';
import { CrispError } from '@crisp/core';
import { DEFAULT_SUBGROUP_MATRIX_FORM, type SubgroupMatrixForm, subgroupMatrixHeadDim } from '../kernels/attention/subgroup-matrix.js';
import type { ProgramDescriptor, StorageDType } from '../kernels/common.js';
import { copyBytes, ReadBatcher, type ReadRequest } from './read-batch.js';

export const Usage = {
  MAP_READ: 0x1,
  COPY_SRC: 0x4,
  COPY_DST: 0x8,
  UNIFORM: 0x40,
  STORAGE: 0x80,
} as const;
const MAP_MODE_READ = 0x1;
/** The largest staging buffer a batch of reads shares (a larger read goes alone). */
const READ_BATCH_MAX_BYTES = 64 * 1024 * 1024;
/**
 * Retired buffers up to this size are kept for reuse (see GpuContext.createBuffer), up to
 * POOL_MAX_BYTES in all: the plan's temporaries at the lengths where the host's cost per
 * prefill shows (at long n the kernels' time dwarfs it).
 */
const POOL_MAX_BUFFER_BYTES = 16 * 1024 * 1024;
const POOL_MAX_BYTES = 128 * 1024 * 1024;
/** Bind groups kept per pipeline (GpuContext.dispatch); past this many the pipeline's are dropped. */
const BIND_GROUPS_PER_PIPELINE = 256;
/** Uniform buffers kept by content (GpuContext.uniform); the oldest goes past this many. */
const UNIFORM_CACHE_MAX = 1024;

export type UniformField = number | { f32: number };

/**
 * The verdict of one error-scoped stretch of recording (see GpuContext.scoped): undefined when
 * WebGPU reported nothing, else the typed error (OUT_OF_MEMORY or BACKEND_ERROR).
 */
export type Check = Promise<CrispError | undefined>;

/**
 * Buffers this context holds now (tensors, temporaries not yet destroyed, staging); the
 * reserve kept for reuse is counted apart (GpuContext.pooledBuffers).
 */
export interface LiveBuffers {
  readonly buffers: number;
  readonly bytes: number;
}

/** Limits this backend reads (a subset of GPUSupportedLimits). */
export interface DeviceLimits {
  readonly maxStorageBufferBindingSize: number;
  readonly maxBufferSize: number;
  readonly maxComputeWorkgroupStorageSize: number;
  readonly maxStorageBuffersPerShaderStage: number;
  readonly maxComputeWorkgroupsPerDimension: number;
  readonly minStorageBufferOffsetAlignment: number;
}

export class DeviceLostError extends CrispError {
  constructor(message: string, details?: Record<string, unknown>) {
    super('DEVICE_LOST', message, details);
    this.name = 'DeviceLostError';
  }
}

/** Pipelines per device, shared by every backend on that device (compiles are costly). */
const pipelineCache = new WeakMap<GPUDevice, Map<string, Promise<GPUComputePipeline>>>();

/**
 * A wrapper of a GPUDevice (a proxy that traces or intercepts some of its calls) answers this
 * key with the device it wraps: its backends then share that device's compiled pipelines
 * instead of compiling every program again.
 */
export const WRAPPED_DEVICE = Symbol.for('crisp.webgpu.wrappedDevice');

export class GpuContext {
  readonly device: GPUDevice;
  readonly limits: DeviceLimits;
  /** while a profile is open (WebGpuBackend.profile), every pass writes its timestamps there */
  profiler: GpuProfiler | undefined;
  /** false when the device was handed in: dispose() then leaves it alive */
  ownsDevice = true;
  #pipelines: Map<string, Promise<GPUComputePipeline>>;
  #lost: DeviceLostError | undefined;
  #lostPromise: Promise<never>;
  #firstError: CrispError | undefined;
  #destroyed = false;
  /** objects that must outlive the device (the GPU instance, the adapter) */
  readonly keepAlive: unknown[] = [];
  /** f16 attention at head dims 64 and 128 runs on the subgroup-matrix (tensor-core) kernel */
  subgroupMatrix = false;
  /** whether the tensor-core kernels run this dtype and head dim (f16 at 64 and 128, where the adapter is eligible) */
  tensorCores(dtype: StorageDType, headDim: number): boolean {
    return this.subgroupMatrix && dtype === 'f16' && subgroupMatrixHeadDim(headDim);
  }
  /** the proxy statistics' passes over every key use tensor cores too (cleared if their build fails) */
  subgroupMatrixStats = true;
  /** why a tensor-core program eligible here failed to build, and what runs instead */
  kernelNote: string | undefined;
  noteKernel(note: string): void {
    this.kernelNote = this.kernelNote ? `${this.kernelNote}; ${note}` : note;
  }
  /** the tensor-core kernel's form (WebGpuBackendOptions.subgroupMatrixForm) */
  subgroupMatrixForm: SubgroupMatrixForm = DEFAULT_SUBGROUP_MATRIX_FORM;
  /** generate rolled-loop WGSL (CPU adapters) */
  compact = false;
  #retired: GPUBuffer[] = [];
  readonly #onError: (ev: Event) => void;
  /** every buffer made here and not yet destroyed, with its size */
  readonly #live = new Map<GPUBuffer, number>();
  /** reads started together share one trip (read()) */
  readonly #reads: ReadBatcher;
  /** queue operations (submits, buffer writes) made through this context, in order */
  #queued = 0;
  /** the queue operations known to have finished: those up to a read whose map resolved */
  #doneThrough = 0;
  /** idle() calls that found the queue known to be idle and waited for nothing */
  #idleSkips = 0;
  /** retired buffers free for reuse, by size and usage (createBuffer takes from here) */
  readonly #pool = new Map<string, GPUBuffer[]>();
  #pooledBytes = 0;
  /** buffers whose allocation scope reported no error: only these are reused */
  readonly #verified = new WeakSet<GPUBuffer>();
  /**
   * What the scoped() stretch running now made, to be marked reusable if its verdict is clean:
   * buffers (into #verified) and bind groups (into #bindGroups).
   */
  #scopeMade: (() => void)[] | undefined;
  /** bind groups by pipeline and bound ranges, made in a stretch WebGPU found clean */
  readonly #bindGroups = new WeakMap<GPUComputePipeline, Map<string, GPUBindGroup>>();
  /** a number per buffer, for the bind groups' keys */
  readonly #bufferIds = new WeakMap<GPUBuffer, number>();
  #nextBufferId = 0;
  /** uniform buffers by content, read-only once written; never retired with their op's temps */
  readonly #uniforms = new Map<string, GPUBuffer>();
  readonly #uniformKey = new Map<GPUBuffer, string>();
  #uniformBytes = 0;
  /** uniforms made since the last idle(), shared by content there once verified */
  #pendingUniforms: (() => void)[] = [];
  /** retired buffers in the pool now (a buffer retired twice goes in once) */
  readonly #inPool = new WeakSet<GPUBuffer>();
  /** the usage each buffer was made with (its pool's key) */
  readonly #usage = new WeakMap<GPUBuffer, number>();
  /** pipelines compiled, by cache key (pipeline() answers these without a wait) */
  readonly #compiled = new Map<string, GPUComputePipeline>();
  /**
   * Buffers handed out again are filled with 0xff bytes first (those the host may write:
   * COPY_DST) when CRISP_WEBGPU_POISON_REUSED=1, as the tests run.
   */
  poisonReused: boolean;

  constructor(device: GPUDevice) {
    this.device = device;
    const owner = ((device as unknown as Record<symbol, GPUDevice | undefined>)[WRAPPED_DEVICE] ?? device) as GPUDevice;
    let cache = pipelineCache.get(owner);
    if (!cache) {
      cache = new Map();
      pipelineCache.set(owner, cache);
    }
    this.#pipelines = cache;
    this.poisonReused = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process?.env?.CRISP_WEBGPU_POISON_REUSED === '1';
    const l = device.limits;
    this.limits = {
      maxStorageBufferBindingSize: Number(l.maxStorageBufferBindingSize),
      maxBufferSize: Number(l.maxBufferSize),
      maxComputeWorkgroupStorageSize: l.maxComputeWorkgroupStorageSize,
      maxStorageBuffersPerShaderStage: l.maxStorageBuffersPerShaderStage,
      maxComputeWorkgroupsPerDimension: l.maxComputeWorkgroupsPerDimension,
      minStorageBufferOffsetAlignment: l.minStorageBufferOffsetAlignment,
    };
    this.#reads = new ReadBatcher((reqs) => this.#readMany(reqs), Math.min(this.limits.maxBufferSize, READ_BATCH_MAX_BYTES));
    this.#lostPromise = device.lost.then((info) => {
      const err = new DeviceLostError(
        `the WebGPU device was lost (${info.reason}: ${info.message || 'no message'}); pending work failed. Create a new backend; tensors of this one are gone`,
        { reason: info.reason },
      );
      // A deliberate destroy() is not a loss the caller needs to hear about twice.
      this.#lost = err;
      throw err;
    });
    // Keep the rejection from being reported as unhandled when nobody is waiting.
    this.#lostPromise.catch(() => undefined);
    this.#onError = (ev: Event) => {
      if (this.#firstError) return;
      this.#firstError = classify((ev as GPUUncapturedErrorEvent).error, 'work queued earlier');
    };
    device.addEventListener?.('uncapturederror', this.#onError);
  }

  get lost(): DeviceLostError | undefined {
    return this.#lost;
  }

  /** Throw at once if the device is gone or an earlier asynchronous error is pending. */
  check(): void {
    if (this.#lost) throw this.#lost;
    if (this.#firstError) {
      const e = this.#firstError;
      this.#firstError = undefined;
      throw e;
    }
  }

  /**
   * Await a device promise, failing with DEVICE_LOST instead of hanging if the device goes.
   * A native rejection (a DOMException from mapAsync, say) becomes DEVICE_LOST when the device
   * is going, else BACKEND_ERROR with the native message: never an untyped error.
   */
  async guard<T>(p: Promise<T>): Promise<T> {
    try {
      this.check();
    } catch (e) {
      // p is not awaited then: keep its rejection from going unhandled
      p.catch(() => undefined);
      throw e;
    }
    let r: T;
    try {
      r = await Promise.race([p, this.#lostPromise]);
    } catch (e) {
      if (e instanceof CrispError) throw e;
      // device.lost settles a moment after the failure it explains
      await Promise.race([this.#lostPromise.catch(() => undefined), new Promise((res) => setTimeout(res, 0))]);
      if (this.#lost) throw this.#lost;
      const name = (e as { name?: string } | null)?.name ?? typeof e;
      const msg = e instanceof Error && e.message ? e.message : 'no message';
      throw new CrispError('BACKEND_ERROR', `WebGPU failed (${name}: ${msg}); the backend is still usable, retry or report the inputs that caused it`, {
        native: name,
      });
    }
    this.check();
    return r;
  }

  /**
   * Run `fn` (synchronous recording: buffer creation, writes, dispatches, submits) inside
   * out-of-memory and validation error scopes; their verdict goes to `sink` for settle().
   * Push and pop happen in this one synchronous stretch, so concurrent operations never
   * share a scope.
   */
  scoped<T>(sink: Check[], what: string, fn: () => T): T {
    const d = this.device;
    d.pushErrorScope('out-of-memory');
    d.pushErrorScope('validation');
    const outer = this.#scopeMade;
    const made: (() => void)[] = [];
    this.#scopeMade = made;
    try {
      return fn();
    } finally {
      this.#scopeMade = outer;
      const v = d.popErrorScope();
      const o = d.popErrorScope();
      sink.push(
        Promise.all([v, o]).then(
          ([ve, oe]) => {
            const err = oe ? classify(oe, what) : ve ? classify(ve, what) : undefined;
            // what was made in a stretch WebGPU found nothing wrong with may be reused
            if (!err) for (const keep of made) keep();
            return err;
          },
          // a scope pop fails only when the device is gone; guard reports that as DEVICE_LOST
          () => undefined,
        ),
      );
    }
  }

  /** The first error of these checks (OUT_OF_MEMORY before others), or undefined; guarded. */
  async verdict(checks: Check[]): Promise<CrispError | undefined> {
    if (checks.length === 0) return undefined;
    const errs = (await this.guard(Promise.all(checks.splice(0)))).filter((e): e is CrispError => e !== undefined);
    return errs.find((e) => e.code === 'OUT_OF_MEMORY') ?? errs[0];
  }

  /** Throw the first error of these checks (see verdict). */
  async settle(checks: Check[]): Promise<void> {
    const e = await this.verdict(checks);
    if (e) throw e;
  }

  /**
   * A buffer of `size` bytes (rounded up to 16). LIMIT_EXCEEDED past maxBufferSize before
   * anything is allocated; counted in liveBuffers until destroyed. A retired buffer of the
   * same size and usage is handed out again where there is one (see #recycle): its contents
   * are then what its last user left, not zeros, so every caller writes what it reads.
   */
  createBuffer(size: number, usage: number, label?: string): GPUBuffer {
    this.check();
    if (!Number.isFinite(size) || size < 0) {
      throw new CrispError('INVALID_ARGUMENT', `buffer ${label ?? ''} of ${size} bytes: the size must be a finite non-negative number`);
    }
    const bytes = Math.max(16, Math.ceil(size / 16) * 16);
    if (bytes > this.limits.maxBufferSize) {
      throw new CrispError(
        'LIMIT_EXCEEDED',
        `${label ?? 'a buffer'} needs ${bytes} bytes; this device's maxBufferSize is ${this.limits.maxBufferSize}. Use a shorter sequence or fewer heads, or a device with a larger limit`,
        { limit: 'maxBufferSize', max: this.limits.maxBufferSize, bytes },
      );
    }
    const free = this.#pool.get(poolKey(bytes, usage));
    const reused = free?.pop();
    if (reused) {
      this.#inPool.delete(reused);
      this.#pooledBytes -= bytes;
      // (a buffer without COPY_DST is written by kernels only)
      if (this.poisonReused && usage & Usage.COPY_DST) this.writeBuffer(reused, 0, new Uint8Array(bytes).fill(0xff));
      // (already verified: nothing to wait for)
      return reused;
    }
    const buf = this.device.createBuffer({ size: bytes, usage, label });
    this.#live.set(buf, bytes);
    this.#usage.set(buf, usage);
    this.#scopeMade?.push(() => this.#verified.add(buf));
    return buf;
  }

  /**
   * LIMIT_EXCEEDED when any of these storage bindings is over maxStorageBufferBindingSize;
   * called before an operation allocates anything.
   */
  checkBindings(op: string, sizes: Readonly<Record<string, number>>): void {
    const lim = this.limits.maxStorageBufferBindingSize;
    for (const [what, bytes] of Object.entries(sizes)) {
      if (bytes > lim) {
        throw new CrispError(
          'LIMIT_EXCEEDED',
          `${op} needs a ${what} buffer of ${bytes} bytes; this device binds at most ${lim} (maxStorageBufferBindingSize). Use a shorter sequence or fewer heads, or a device with a larger limit`,
          { limit: 'maxStorageBufferBindingSize', max: lim, bytes, buffer: what },
        );
      }
    }
  }

  /**
   * Buffers held now: tensors, and temporaries until the queue drains (synchronize); not the
   * reserve kept for reuse (pooledBuffers).
   */
  get liveBuffers(): LiveBuffers {
    let bytes = 0;
    for (const b of this.#live.values()) bytes += b;
    const kept = this.pooledBuffers;
    return { buffers: this.#live.size - kept.buffers, bytes: bytes - kept.bytes };
  }

  /**
   * The reserve kept for reuse: retired buffers free to be handed out again, and uniform
   * buffers kept by content. At most 128 MiB of the first (buffers of up to 16 MiB) and 1,024
   * of the second; trimPool() releases them.
   */
  get pooledBuffers(): LiveBuffers {
    let buffers = this.#uniforms.size;
    for (const list of this.#pool.values()) buffers += list.length;
    return { buffers, bytes: this.#pooledBytes + this.#uniformBytes };
  }

  /** Release the reserve (pooledBuffers): destroyed once the work submitted so far has finished. */
  trimPool(): void {
    for (const list of this.#pool.values()) {
      for (const b of list) this.#inPool.delete(b);
      this.#retired.push(...list.splice(0));
    }
    this.#pool.clear();
    this.#pooledBytes = 0;
    for (const b of this.#uniforms.values()) {
      this.#uniformKey.delete(b);
      this.#retired.push(b);
    }
    this.#uniforms.clear();
    this.#uniformBytes = 0;
  }

  #destroyBuffer(b: GPUBuffer): void {
    // (a uniform kept by content outlives the op that retired it; trimPool releases it)
    if (this.#uniformKey.has(b)) return;
    if (this.#live.delete(b)) b.destroy();
  }

  /**
   * A retired buffer whose work has finished: kept for reuse where its allocation was verified
   * and the reserve has room, else destroyed.
   */
  #recycle(b: GPUBuffer): void {
    if (this.#uniformKey.has(b) || this.#inPool.has(b)) return;
    const bytes = this.#live.get(b);
    if (
      bytes === undefined ||
      this.#lost ||
      this.#destroyed ||
      !this.#verified.has(b) ||
      bytes > POOL_MAX_BUFFER_BYTES ||
      this.#pooledBytes + bytes > POOL_MAX_BYTES
    ) {
      this.#destroyBuffer(b);
      return;
    }
    const key = poolKey(bytes, this.#usage.get(b) ?? 0);
    let list = this.#pool.get(key);
    if (!list) {
      list = [];
      this.#pool.set(key, list);
    }
    list.push(b);
    this.#inPool.add(b);
    this.#pooledBytes += bytes;
  }

  /**
   * A uniform buffer from u32 fields ({ f32 } marks a float), padded to 16 bytes. Uniforms are
   * only ever written here, so one of the same content is shared: a layer of a shape seen
   * before writes none. (Callers retire it with their temporaries as any other; a shared one
   * stays until trimPool or the reserve's bound.)
   */
  uniform(fields: readonly UniformField[]): GPUBuffer {
    const words = Math.max(4, Math.ceil(fields.length / 4) * 4);
    const ab = new ArrayBuffer(words * 4);
    const u = new Uint32Array(ab);
    const f = new Float32Array(ab);
    fields.forEach((x, i) => {
      if (typeof x === 'number') u[i] = x >>> 0;
      else f[i] = x.f32;
    });
    const key = u.join(',');
    const hit = this.#uniforms.get(key);
    if (hit) {
      this.check();
      // most recently used last: the bound drops the oldest
      this.#uniforms.delete(key);
      this.#uniforms.set(key, hit);
      return hit;
    }
    const buf = this.createBuffer(ab.byteLength, Usage.UNIFORM | Usage.COPY_DST, 'uniform');
    this.writeBuffer(buf, 0, u);
    this.#keepUniform(key, buf);
    return buf;
  }

  /**
   * Share `buf` by its content once its allocation is verified (see uniform). This runs at
   * idle(), before the retired buffers are recycled, not on its scope's verdict: a uniform
   * taken from the pool is verified already, and could otherwise be recycled and handed out
   * with other contents before being kept under this key.
   */
  #keepUniform(key: string, buf: GPUBuffer): void {
    const bytes = this.#live.get(buf) ?? 0;
    const keep = () => {
      if (!this.#verified.has(buf) || this.#uniforms.has(key) || this.#uniformKey.has(buf) || this.#destroyed || !this.#live.has(buf)) return;
      this.#uniforms.set(key, buf);
      this.#uniformKey.set(buf, key);
      this.#uniformBytes += bytes;
      if (this.#uniforms.size > UNIFORM_CACHE_MAX) {
        const [oldKey, old] = this.#uniforms.entries().next().value as [string, GPUBuffer];
        this.#uniforms.delete(oldKey);
        this.#uniformKey.delete(old);
        this.#uniformBytes -= this.#live.get(old) ?? 0;
        // queued work may still read it
        this.#retired.push(old);
      }
    };
    this.#pendingUniforms.push(keep);
  }

  /** A read-only storage buffer holding u32 values. */
  u32Buffer(values: ArrayLike<number>, label: string): GPUBuffer {
    const data = Uint32Array.from(values as ArrayLike<number>);
    const buf = this.createBuffer(data.byteLength, Usage.STORAGE | Usage.COPY_DST | Usage.COPY_SRC, label);
    if (data.byteLength > 0) this.writeBuffer(buf, 0, data);
    return buf;
  }

  /** `data` into `buf` at `offset` bytes, on the queue (every buffer write goes through here). */
  writeBuffer(buf: GPUBuffer, offset: number, data: ArrayBufferView): void {
    this.device.queue.writeBuffer(buf, offset, data.buffer, data.byteOffset, data.byteLength);
    this.#queued++;
  }

  async pipeline(p: ProgramDescriptor): Promise<GPUComputePipeline> {
    const done = this.#compiled.get(p.cacheKey);
    if (done) {
      this.check();
      return done;
    }
    let pp = this.#pipelines.get(p.cacheKey);
    if (!pp) {
      // Synchronous creation inside an error scope: dawn.node's createComputePipelineAsync
      // aborted the process under SwiftShader (std::system_error), the scope reports the same.
      this.device.pushErrorScope('validation');
      const module = this.device.createShaderModule({ code: p.wgsl, label: p.name });
      const pipe = this.device.createComputePipeline({
        layout: 'auto',
        compute: { module, entryPoint: p.entryPoint },
        label: p.name,
      });
      pp = this.device
        .popErrorScope()
        .then((err) => {
          if (err) throw new Error(err.message);
          return pipe;
        })
        .catch(async (e: unknown) => {
          let detail = e instanceof Error ? e.message : String(e);
          try {
            const info = await module.getCompilationInfo();
            const msgs = info.messages.filter((m) => m.type === 'error').map((m) => `${m.lineNum}:${m.linePos} ${m.message}`);
            if (msgs.length) detail += `; ${msgs.join('; ')}`;
          } catch {
            // compilation info is a diagnostic nicety only
          }
          throw new CrispError('BACKEND_ERROR', `WebGPU could not build program ${p.name} (${p.cacheKey}): ${detail}`, {
            program: p.cacheKey,
          });
        });
      this.#pipelines.set(p.cacheKey, pp);
      pp.catch(() => this.#pipelines.delete(p.cacheKey));
    }
    const pipe = await this.guard(pp);
    this.#compiled.set(p.cacheKey, pipe);
    return pipe;
  }

  /**
   * Record one dispatch (its own compute pass) on an encoder. A buffer binds whole; a
   * binding ({ buffer, offset, size }: a tensor's `binding`) binds that range.
   */
  dispatch(
    enc: GPUCommandEncoder,
    pipeline: GPUComputePipeline,
    buffers: readonly (GPUBuffer | GPUBufferBinding)[],
    groups: readonly [number, number?, number?],
  ): void {
    const bind = this.#bindGroup(pipeline, buffers);
    const timestampWrites = this.profiler?.passWrites(pipeline.label);
    const pass = enc.beginComputePass(timestampWrites ? { timestampWrites } : undefined);
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, bind);
    pass.dispatchWorkgroups(groups[0], groups[1] ?? 1, groups[2] ?? 1);
    pass.end();
  }

  /**
   * The bind group of these ranges for this pipeline: the one made before for the same
   * buffers where its stretch was clean (a layer of a shape seen before, its temporaries
   * reused, makes none), else a new one.
   */
  #bindGroup(pipeline: GPUComputePipeline, buffers: readonly (GPUBuffer | GPUBufferBinding)[]): GPUBindGroup {
    let key = '';
    for (const b of buffers) {
      const buf = 'buffer' in b ? b.buffer : b;
      let id = this.#bufferIds.get(buf);
      if (id === undefined) {
        id = this.#nextBufferId++;
        this.#bufferIds.set(buf, id);
      }
      key += 'buffer' in b ? `${id}@${b.offset ?? 0}+${b.size ?? '*'},` : `${id},`;
    }
    const hit = this.#bindGroups.get(pipeline)?.get(key);
    if (hit) return hit;
    const bind = this.device.createBindGroup({
      layout: pipeline.getBindGroupLayout(0),
      entries: buffers.map((b, binding) => ({ binding, resource: 'buffer' in b ? b : { buffer: b } })),
    });
    this.#scopeMade?.push(() => {
      let groups = this.#bindGroups.get(pipeline);
      if (!groups) {
        groups = new Map();
        this.#bindGroups.set(pipeline, groups);
      }
      // (bounded: a destroyed buffer's groups are never asked for again)
      if (groups.size >= BIND_GROUPS_PER_PIPELINE) groups.clear();
      groups.set(key, bind);
    });
    return bind;
  }

  /** 2-D grid for `threads` threads in workgroups of 256 (x <= the per-dimension limit). */
  grid(threads: number): { groups: [number, number]; rowWidth: number } {
    const wg = Math.max(1, Math.ceil(threads / 256));
    const maxX = this.limits.maxComputeWorkgroupsPerDimension;
    const x = Math.min(wg, maxX);
    const y = Math.ceil(wg / x);
    return { groups: [x, y], rowWidth: x * 256 };
  }

  submit(enc: GPUCommandEncoder, temps: GPUBuffer[] = []): void {
    this.check();
    this.device.queue.submit([enc.finish()]);
    this.#queued++;
    // Temporaries are destroyed once the queue has drained (destroying a buffer that
    // submitted work still uses crashed dawn.node under SwiftShader).
    this.#retired.push(...temps);
    temps.length = 0;
    if (this.#retired.length > 256) void this.idle().catch(() => undefined);
  }

  /**
   * Bytes [byteOffset, byteOffset + byteLength) of `src` (byteOffset a multiple of 4). Reads
   * started in the same turn of the event loop share one copy, submit and map (ReadBatcher).
   */
  read(src: GPUBuffer, byteOffset: number, byteLength: number): Promise<ArrayBuffer> {
    return this.#reads.read({ src, byteOffset, byteLength });
  }

  /** Waits idle() skipped because a read had come back after everything queued. */
  get idleWaitsSkipped(): number {
    return this.#idleSkips;
  }

  /** Trips to the GPU the reads have made so far (one per batch). */
  get readTrips(): number {
    return this.#reads.trips;
  }

  /** One staging buffer holding every request's copy, one submit, one map. */
  async #readMany(reqs: readonly ReadRequest[]): Promise<ArrayBuffer[]> {
    const at: number[] = [];
    let size = 0;
    for (const r of reqs) {
      at.push(size);
      size += copyBytes(r.byteLength);
    }
    const checks: Check[] = [];
    let serial = 0;
    const staging = this.scoped(checks, 'a read-back buffer', () => {
      const s = this.createBuffer(size, Usage.MAP_READ | Usage.COPY_DST, 'staging');
      try {
        const enc = this.device.createCommandEncoder();
        for (const [i, r] of reqs.entries()) enc.copyBufferToBuffer(r.src, r.byteOffset, s, at[i], copyBytes(r.byteLength));
        this.device.queue.submit([enc.finish()]);
        serial = ++this.#queued;
      } catch (e) {
        this.#destroyBuffer(s);
        throw e;
      }
      return s;
    });
    try {
      try {
        // (scoped too: mapping an invalid buffer is a validation error of its own, which
        // must not reach the device's other users as an uncaptured one)
        await this.guard(this.scoped(checks, 'a read-back', () => staging.mapAsync(MAP_MODE_READ)));
      } catch (e) {
        // the scope knows why (an out-of-memory staging buffer, an invalid source)
        await this.settle(checks);
        throw e;
      }
      // a copy that failed validation leaves a valid staging buffer of zeros: never return it
      await this.settle(checks);
      // the queue runs in order: everything queued up to this copy has finished
      this.#doneThrough = Math.max(this.#doneThrough, serial);
      const mapped = staging.getMappedRange(0, size);
      const out = reqs.map((r, i) => mapped.slice(at[i], at[i] + r.byteLength));
      // (its copy has finished: unmapped, it can take the next read's copy)
      staging.unmap();
      this.#recycle(staging);
      return out;
    } catch (e) {
      this.#destroyBuffer(staging);
      throw e;
    }
  }

  /**
   * Wait until the work queued so far has finished, then give back the buffers retired before
   * (kept for reuse or destroyed: #recycle).
   * Where this context owns its device (nobody else queues work on it) and a read's map has
   * resolved after everything queued (sparsePrefill reads its plan back behind the attention),
   * the queue is known to be idle and nothing is waited for.
   */
  async idle(): Promise<void> {
    // reads waiting for their turn go first: the wait below then covers their copies
    this.#reads.flush();
    // uniforms verified by now are shared from here on (not recycled below)
    for (const keep of this.#pendingUniforms.splice(0)) keep();
    const done = this.#retired;
    this.#retired = [];
    if (this.ownsDevice && this.#doneThrough === this.#queued) {
      this.#idleSkips++;
      for (const b of done) this.#recycle(b);
      this.check();
      return;
    }
    const through = this.#queued;
    let drained = false;
    try {
      await this.guard(this.device.queue.onSubmittedWorkDone());
      this.#doneThrough = Math.max(this.#doneThrough, through);
      drained = true;
    } finally {
      // (after a loss the device freed them; destroy() on a lost device's buffer is harmless)
      for (const b of done) {
        if (drained) this.#recycle(b);
        else this.#destroyBuffer(b);
      }
    }
  }

  /**
   * Give buffers back once the work submitted so far has finished: kept for reuse where they
   * qualify (see #recycle), else destroyed.
   */
  retire(...bufs: GPUBuffer[]): void {
    this.#retired.push(...bufs);
  }

  /**
   * Release everything: the device when this context made it, else (a device handed in,
   * which stays alive) every buffer made here, once the work submitted so far has finished.
   */
  destroy(): void {
    if (this.#destroyed) return;
    this.#reads.flush();
    this.#destroyed = true;
    this.device.removeEventListener?.('uncapturederror', this.#onError);
    // the reserve goes with everything else
    this.#pool.clear();
    this.#pooledBytes = 0;
    this.#uniforms.clear();
    this.#uniformKey.clear();
    this.#uniformBytes = 0;
    if (this.ownsDevice) {
      this.device.destroy();
      this.#live.clear();
      this.#retired = [];
      return;
    }
    const all = [...this.#live.keys()];
    this.#retired = [];
    const free = () => {
      for (const b of all) this.#destroyBuffer(b);
    };
    this.device.queue.onSubmittedWorkDone().then(free, free);
  }
}

/** The pool's key of a buffer: its size and usage. */
function poolKey(bytes: number, usage: number): string {
  return `${bytes}:${usage}`;
}

/** A WebGPU error object as a typed error: OUT_OF_MEMORY for allocation failures, else BACKEND_ERROR. */
function classify(e: GPUError, what: string): CrispError {
  const native = (e as { constructor?: { name?: string } }).constructor?.name ?? 'GPUError';
  const oom =
    (typeof GPUOutOfMemoryError !== 'undefined' && e instanceof GPUOutOfMemoryError) ||
    native === 'GPUOutOfMemoryError' ||
    /out of memory/i.test(e.message);
  if (oom) {
    return new CrispError(
      'OUT_OF_MEMORY',
      `the GPU ran out of memory for ${what}: ${e.message}. Dispose tensors you no longer need, or use a shorter sequence, fewer heads or smaller chunks`,
      { native },
    );
  }
  return new CrispError('BACKEND_ERROR', `WebGPU rejected ${what}: ${e.message}`, { native });
}
