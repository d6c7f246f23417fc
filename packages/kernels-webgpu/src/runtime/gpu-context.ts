/**
 * The thin layer over a GPUDevice: buffers, pipelines (cached by program cache key),
 * uniforms, dispatches and the device-loss guard every await goes through.
 *
 * Usage flags are written as numbers (the WebGPU spec fixes them), so this module needs no
 * globals such as GPUBufferUsage: Node's `webgpu` package does not install them.
 */
import { CrispError } from '@crisp/core';
import type { ProgramDescriptor } from '../kernels/common.js';

export const Usage = {
  MAP_READ: 0x1,
  COPY_SRC: 0x4,
  COPY_DST: 0x8,
  UNIFORM: 0x40,
  STORAGE: 0x80,
} as const;
const MAP_MODE_READ = 0x1;

export type UniformField = number | { f32: number };

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

export class GpuContext {
  readonly device: GPUDevice;
  readonly limits: DeviceLimits;
  /** false when the device was handed in: dispose() then leaves it alive */
  ownsDevice = true;
  #pipelines: Map<string, Promise<GPUComputePipeline>>;
  #lost: DeviceLostError | undefined;
  #lostPromise: Promise<never>;
  #firstError: CrispError | undefined;
  #destroyed = false;
  /** objects that must outlive the device (the GPU instance, the adapter) */
  readonly keepAlive: unknown[] = [];
  /** f16 attention runs on the experimental subgroup-matrix (tensor-core) kernel */
  subgroupMatrix = false;
  /** generate rolled-loop WGSL (CPU adapters) */
  compact = false;
  #retired: GPUBuffer[] = [];

  constructor(device: GPUDevice) {
    this.device = device;
    let cache = pipelineCache.get(device);
    if (!cache) {
      cache = new Map();
      pipelineCache.set(device, cache);
    }
    this.#pipelines = cache;
    const l = device.limits;
    this.limits = {
      maxStorageBufferBindingSize: Number(l.maxStorageBufferBindingSize),
      maxBufferSize: Number(l.maxBufferSize),
      maxComputeWorkgroupStorageSize: l.maxComputeWorkgroupStorageSize,
      maxStorageBuffersPerShaderStage: l.maxStorageBuffersPerShaderStage,
      maxComputeWorkgroupsPerDimension: l.maxComputeWorkgroupsPerDimension,
      minStorageBufferOffsetAlignment: l.minStorageBufferOffsetAlignment,
    };
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
    device.addEventListener?.('uncapturederror', (ev: Event) => {
      const e = (ev as GPUUncapturedErrorEvent).error;
      if (this.#firstError) return;
      const oom = typeof GPUOutOfMemoryError !== 'undefined' && e instanceof GPUOutOfMemoryError;
      const isOom = oom || /out of memory/i.test(e.message);
      this.#firstError = new CrispError(
        isOom ? 'OUT_OF_MEMORY' : 'BACKEND_ERROR',
        isOom
          ? `the GPU ran out of memory: ${e.message}. Free tensors (dispose()) or use a shorter sequence`
          : `WebGPU reported an error: ${e.message}`,
        { native: e.constructor?.name },
      );
    });
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

  /** Await a device promise, failing with DEVICE_LOST instead of hanging if the device goes. */
  async guard<T>(p: Promise<T>): Promise<T> {
    this.check();
    const r = await Promise.race([p, this.#lostPromise]);
    this.check();
    return r;
  }

  createBuffer(size: number, usage: number, label?: string): GPUBuffer {
    this.check();
    return this.device.createBuffer({ size: Math.max(16, Math.ceil(size / 16) * 16), usage, label });
  }

  /** A uniform buffer from u32 fields ({ f32 } marks a float), padded to 16 bytes. */
  uniform(fields: readonly UniformField[]): GPUBuffer {
    const words = Math.max(4, Math.ceil(fields.length / 4) * 4);
    const ab = new ArrayBuffer(words * 4);
    const u = new Uint32Array(ab);
    const f = new Float32Array(ab);
    fields.forEach((x, i) => {
      if (typeof x === 'number') u[i] = x >>> 0;
      else f[i] = x.f32;
    });
    const buf = this.createBuffer(ab.byteLength, Usage.UNIFORM | Usage.COPY_DST, 'uniform');
    this.device.queue.writeBuffer(buf, 0, ab);
    return buf;
  }

  /** A read-only storage buffer holding u32 values. */
  u32Buffer(values: ArrayLike<number>, label: string): GPUBuffer {
    const data = Uint32Array.from(values as ArrayLike<number>);
    const buf = this.createBuffer(data.byteLength, Usage.STORAGE | Usage.COPY_DST | Usage.COPY_SRC, label);
    if (data.byteLength > 0) this.device.queue.writeBuffer(buf, 0, data.buffer, data.byteOffset, data.byteLength);
    return buf;
  }

  async pipeline(p: ProgramDescriptor): Promise<GPUComputePipeline> {
    let pp = this.#pipelines.get(p.cacheKey);
    if (!pp) {
      const module = this.device.createShaderModule({ code: p.wgsl, label: p.name });
      // Synchronous creation inside an error scope: dawn.node's createComputePipelineAsync
      // aborted the process under SwiftShader (std::system_error), the scope reports the same.
      this.device.pushErrorScope('validation');
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
    return this.guard(pp);
  }

  /** Record one dispatch (its own compute pass) on an encoder. */
  dispatch(
    enc: GPUCommandEncoder,
    pipeline: GPUComputePipeline,
    buffers: readonly GPUBuffer[],
    groups: readonly [number, number?, number?],
  ): void {
    const bind = this.device.createBindGroup({
      layout: pipeline.getBindGroupLayout(0),
      entries: buffers.map((buffer, binding) => ({ binding, resource: { buffer } })),
    });
    const pass = enc.beginComputePass();
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, bind);
    pass.dispatchWorkgroups(groups[0], groups[1] ?? 1, groups[2] ?? 1);
    pass.end();
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
    // Temporaries are destroyed once the queue has drained (destroying a buffer that
    // submitted work still uses crashed dawn.node under SwiftShader).
    this.#retired.push(...temps);
    temps.length = 0;
    if (this.#retired.length > 256) void this.idle().catch(() => undefined);
  }

  async read(src: GPUBuffer, byteOffset: number, byteLength: number): Promise<ArrayBuffer> {
    const size = Math.max(4, Math.ceil(byteLength / 4) * 4);
    const staging = this.device.createBuffer({ size, usage: Usage.MAP_READ | Usage.COPY_DST, label: 'staging' });
    try {
      const enc = this.device.createCommandEncoder();
      enc.copyBufferToBuffer(src, byteOffset, staging, 0, size);
      this.device.queue.submit([enc.finish()]);
      await this.guard(staging.mapAsync(MAP_MODE_READ));
      return staging.getMappedRange(0, size).slice(0, byteLength);
    } finally {
      staging.destroy();
    }
  }

  async idle(): Promise<void> {
    const done = this.#retired;
    this.#retired = [];
    await this.guard(this.device.queue.onSubmittedWorkDone());
    for (const b of done) b.destroy();
  }

  /** Destroy a buffer after the work submitted so far has finished. */
  retire(...bufs: GPUBuffer[]): void {
    this.#retired.push(...bufs);
  }

  destroy(): void {
    if (this.#destroyed) return;
    this.#destroyed = true;
    if (this.ownsDevice) this.device.destroy();
  }
}
