/**
 * The WebGPU backend: every @crisp/core Backend primitive in WGSL, one code path for
 * browsers and Node (the device or adapter is injected; see ./node.ts for Dawn in Node).
 * Each operation's host side is in ./ops/ (one file per operation), the device, buffers and
 * pipelines in ./runtime/, the WGSL generators in ./kernels/.
 *
 * Shape legend: q [m, H, d], k and v [n, Hkv, d], out [m, H, d], lse [H, m];
 * B block size (64 or 128), Nb = ceil(n / B), d in {64, 128}.
 */
import {
  type AttentionOptions,
  type AttentionResult,
  type Backend,
  type BackendCapabilities,
  type BlockMask,
  type BlockRows,
  CrispError,
  type DType,
  type DeviceTensor,
  type HostData,
  type HostTensor,
  InvalidArgumentError,
  type MemoryRange,
  type PeRowsOptions,
  type ProxyStats,
  type ProxyStatsOptions,
  type VarlenAttentionOptions,
  type VarlenBatch,
} from '@crisp/core';
import { fmaAttentionProgram } from './kernels/attention/fma.js';
import { type SubgroupMatrixForm, subgroupMatrixAttentionProgram } from './kernels/attention/subgroup-matrix.js';
import type { ProgramDescriptor, StorageDType } from './kernels/common.js';
import type { ScoreTileKind } from './kernels/proxy.js';
import { denseAttention, sparseAttention } from './ops/attention.js';
import { type DeviceVsPlan, type DeviceVsRequest, deviceVsPlan } from './ops/device-select.js';
import { expandMask } from './ops/expand-mask.js';
import type { OpHost } from './ops/host.js';
import { peBlockRows } from './ops/pe-rows.js';
import { proxyStats, scoreTileKindFor } from './ops/proxy-stats.js';
import { sliceRows } from './ops/slice-rows.js';
import { allocate, download, read, upload, wrapBuffer, write } from './ops/transfer.js';
import { type GpuProfile, GpuProfiler } from './runtime/gpu-profile.js';
import { varlenAttention } from './ops/varlen.js';
import { WebGpuDevicePlanner } from './plan/planner.js';
import { sparseAttentionPrepared } from './plan/run-prepared.js';
import {
  type ActiveAttentionKernel,
  FMA_SPARSE_CROSSOVER,
  TENSOR_CORE_SPARSE_CROSSOVER,
  type WebGpuBackendOptions,
  type WebGpuInfo,
  checkOptions,
} from './options.js';
import { openDevice } from './runtime/device.js';
import type { GpuContext } from './runtime/gpu-context.js';
import { WebGpuTensor, newTensor } from './runtime/tensor.js';

export {
  ATTENTION_KERNELS,
  type ActiveAttentionKernel,
  type AttentionKernel,
  FMA_SPARSE_CROSSOVER,
  H200_SPARSE_CROSSOVER,
  TENSOR_CORE_SPARSE_CROSSOVER,
  type WebGpuBackendOptions,
  type WebGpuInfo,
} from './options.js';
export { OPTIONAL_FEATURES } from './runtime/device.js';
export { type GpuKernelTime, type GpuProfile, PROFILE_QUERY_CAPACITY, summarizePasses } from './runtime/gpu-profile.js';
export type { DeviceVsPlan, DeviceVsRequest } from './ops/device-select.js';

let nextId = 0;

/**
 * Create the backend. Pass `device` (used as is), or `adapter`/`gpu` (a device is requested
 * with the adapter's real limits and the optional features it offers). Without any,
 * `navigator.gpu` is used. No adapter: BACKEND_UNAVAILABLE with the reason.
 */
export async function createWebGpuBackend(opts: WebGpuBackendOptions = {}): Promise<WebGpuBackend> {
  checkOptions(opts);
  const { ctx, info } = await openDevice(opts);
  return new WebGpuBackend(ctx, info, opts);
}

export class WebGpuBackend implements Backend {
  readonly name = 'webgpu';
  readonly capabilities: BackendCapabilities;
  readonly #crossover: number | undefined;
  /**
   * Keys below which dense attention is faster (sparsePrefill's default gate): the option
   * when given, else the measured gate of the kernel in use (the tensor-core kernel's, or the
   * FMA kernel's where it is not offered or failed to build).
   */
  get sparseCrossover(): number {
    return this.#crossover ?? (this.gpu.subgroupMatrix ? TENSOR_CORE_SPARSE_CROSSOVER : FMA_SPARSE_CROSSOVER);
  }

  /**
   * The length gate of a call: the option when given, else the measured gate of the kernel
   * this dtype and head dim run (f32 and head dims other than 64 and 128 run 'fma').
   */
  sparseCrossoverFor(dtype: DType, headDim: number): number {
    if (this.#crossover !== undefined) return this.#crossover;
    return dtype === 'f16' && this.attentionKernelFor(dtype, headDim) === 'subgroup-matrix' ? TENSOR_CORE_SPARSE_CROSSOVER : FMA_SPARSE_CROSSOVER;
  }
  readonly info: WebGpuInfo;
  /** The context (device, limits, pipelines); for benchmarks and tests. */
  readonly gpu: GpuContext;
  #disposed = false;
  readonly #id = nextId++;
  readonly #host: OpHost;
  /**
   * The device plan for the cStruct router, the distance tests (residualJsd, jsd; anyPe of
   * them), the noise-floor and cumulative-coverage selectors and the PE heads' lists
   * (plan/planner.ts): every sparse preset is planned on the device; a policy with rules of
   * its own (no device form) on the host.
   */
  readonly planner: WebGpuDevicePlanner;

  /** (options already checked by checkOptions: createWebGpuBackend does that before any device work) */
  constructor(ctx: GpuContext, info: WebGpuInfo, opts: WebGpuBackendOptions) {
    checkOptions(opts);
    this.gpu = ctx;
    this.info = info;
    this.#crossover = opts.sparseCrossover;
    const work = opts.maxDispatchWork ?? 2 ** 38;
    this.capabilities = Object.freeze({
      // f16 is stored as packed halves and widened in-kernel: no shader-f16 needed.
      dtypes: ['f32', 'f16'] as DType[],
      headDims: [64, 128],
      blockSizes: [64, 128],
      // one workgroup per 64-row query tile along x
      maxSequence: ctx.limits.maxComputeWorkgroupsPerDimension * 64,
      chunkedPrefill: true,
      logSumExp: true,
    });
    this.#host = {
      name: this.name,
      gpu: ctx,
      capabilities: this.capabilities,
      maxWork: work,
      peCut: opts.peCut ?? 'device',
      alive: () => this.#alive(),
      own: (t, what) => this.#own(t, what),
      newTensor: (dtype, shape) => newTensor(ctx, this, dtype, shape),
      wrapTensor: (buffer, dtype, shape, bytes) => new WebGpuTensor(ctx, this, dtype, shape, buffer, bytes, true),
      attentionPipeline: (dtype, D) => this.#attentionPipeline(dtype, D),
      varlenPipeline: (dtype, D) => ctx.pipeline(fmaAttentionProgram(dtype, D, ctx.compact, true)),
    };
    this.planner = new WebGpuDevicePlanner(this.#host);
  }

  toString(): string {
    return `WebGpuBackend#${this.#id}(${this.info.vendor} ${this.info.architecture})`;
  }

  // ---------------------------------------------------------------- tensors

  #alive(): void {
    if (this.#disposed) throw new CrispError('DISPOSED', 'this WebGPU backend was disposed; create a new one');
    this.gpu.check();
  }

  #own(t: DeviceTensor, what: string): WebGpuTensor {
    this.#alive();
    if (t === null || typeof t !== 'object') {
      throw new InvalidArgumentError(`${what} must be a device tensor of this backend (from upload or allocate); got ${t === null ? 'null' : typeof t}`);
    }
    if (!(t instanceof WebGpuTensor) || t.owner !== this) {
      throw new CrispError(
        'WRONG_BACKEND',
        `${what} belongs to backend '${(t as DeviceTensor | undefined)?.backend ?? typeof t}', not to this WebGPU backend; download it and upload it here`,
      );
    }
    if (t.disposed) throw new CrispError('DISPOSED', `${what} tensor was disposed`);
    if (t.failure) {
      throw new CrispError(t.failure.code, `${what} tensor is unusable (${t.failure.message}); dispose it and make it again`, t.failure.details);
    }
    return t;
  }

  upload(t: HostTensor): DeviceTensor {
    return upload(this.#host, t);
  }

  allocate(dtype: DType, shape: readonly number[]): DeviceTensor {
    return allocate(this.#host, dtype, shape);
  }

  write(t: DeviceTensor, elementOffset: number, data: HostData): void {
    write(this.#host, t, elementOffset, data);
  }

  download(t: DeviceTensor): Promise<HostTensor> {
    return download(this.#host, t);
  }

  read(t: DeviceTensor, elementOffset: number, count: number): Promise<HostData> {
    return read(this.#host, t, elementOffset, count);
  }

  /**
   * A tensor over a GPUBuffer made elsewhere on this backend's device, without a copy (the
   * way to run on another library's tensors, e.g. TF.js's `dataToGPU()`). The buffer stays
   * the caller's: disposing the tensor leaves it alive; keep it alive and unwritten until
   * the work that uses it has finished (`synchronize()`). The buffer needs STORAGE and
   * COPY_SRC usage and at least the tensor's bytes (rounded up to 4).
   */
  wrapBuffer(buffer: GPUBuffer, dtype: DType, shape: readonly number[]): DeviceTensor {
    return wrapBuffer(this.#host, buffer, dtype, shape);
  }

  /**
   * The GPUBuffer behind one of this backend's tensors (to hand to another library on the
   * same device). A view made by sliceRows has no buffer of its own: INVALID_ARGUMENT.
   */
  bufferOf(t: DeviceTensor): GPUBuffer {
    const wt = this.#own(t, 'bufferOf');
    if (wt.byteOffset !== 0) {
      throw new InvalidArgumentError(
        `bufferOf: this tensor is a view at byte ${wt.byteOffset} of another tensor's buffer (sliceRows); pass the tensor it was sliced from, or copy the rows into a tensor of their own`,
      );
    }
    return wt.buffer;
  }

  /**
   * Where `t`'s bytes lie: its GPUBuffer and the bytes it covers there, marked
   * `wholeResource` (a dispatch may not write a buffer it also reads, whatever the bytes).
   * The pipeline uses it to refuse an `out` in the buffer of q, k or v: a second wrapBuffer
   * of it, a sliceRows view of it, or other rows of it.
   */
  memoryRange(t: DeviceTensor): MemoryRange {
    return this.#own(t, 'memoryRange: the tensor').memoryRange;
  }

  /**
   * Rows [start, start + rows) of `t` along its first axis: a view of `t`'s buffer (no copy)
   * when the rows start at a multiple of the device's minStorageBufferOffsetAlignment, else
   * a copy. A view can be written (as `out`, by `write`: the rows land in `t`); a copy is
   * refused as either (INVALID_ARGUMENT: the write would not reach `t`). Dispose it when done
   * (that never frees `t`'s buffer), and do not use it after `t` is disposed.
   * INVALID_ARGUMENT for rows outside `t`, WRONG_BACKEND or DISPOSED for a tensor that is not
   * a live one of this backend.
   */
  sliceRows(t: DeviceTensor, start: number, rows: number): DeviceTensor {
    return sliceRows(this.#host, t, start, rows);
  }

  // ------------------------------------------------------------ operations

  proxyStats(q: DeviceTensor, k: DeviceTensor, opts: ProxyStatsOptions): Promise<ProxyStats> {
    return proxyStats(this.#host, q, k, opts);
  }

  peBlockRows(q: DeviceTensor, k: DeviceTensor, opts: PeRowsOptions): Promise<BlockRows> {
    return peBlockRows(this.#host, q, k, opts);
  }

  expandMask(mask: BlockMask): Promise<BlockRows> {
    return expandMask(this.#host, mask);
  }

  /**
   * The cStruct router and the noise-floor VS selection on the device (kernels/select.ts),
   * giving the host rules' routes and lists exactly (with a residual test or narrowed PE lists
   * in the request, up to `planner.margin`), expanded into block rows on the device;
   * nothing is read back until the result's read(), blockCounts() or attention(). The
   * building block of `planner`, without the PE heads' rows.
   */
  deviceVsPlan(stats: ProxyStats, req: DeviceVsRequest): Promise<DeviceVsPlan> {
    return deviceVsPlan(this.#host, stats, req);
  }

  /**
   * Exact attention over the mask's blocks; with `opts.prepared` (a mask this backend's
   * planner made) over the device's rows instead (plan/run-prepared.ts).
   */
  sparseAttention(q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, mask: BlockMask, opts: AttentionOptions = {}): Promise<AttentionResult> {
    if (opts !== null && typeof opts === 'object' && opts.prepared !== undefined) return sparseAttentionPrepared(this.#host, q, k, v, mask, opts);
    return sparseAttention(this.#host, q, k, v, mask, opts);
  }

  denseAttention(q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, opts: AttentionOptions = {}): Promise<AttentionResult> {
    return denseAttention(this.#host, q, k, v, opts);
  }

  /**
   * A ragged batch (sequences packed along the rows) in one run of the FMA kernel's varlen
   * form: each workgroup finds its sequence and query tile in a small table, each sequence
   * has its own causal offset n_s - m_s and its own mask (rows concatenated into one
   * rowPtr/cols pair) or none (dense causal), split into bounded dispatches by work. Equal,
   * sequence by sequence, to sparseAttention / denseAttention on the sequence's rows. The
   * batch is checked (assertVarlenBatch) before any work. f16 batches run the FMA kernel even
   * where the subgroup-matrix kernel runs single sequences (it has no varlen form).
   */
  varlenAttention(q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, batch: VarlenBatch, opts: VarlenAttentionOptions = {}): Promise<AttentionResult> {
    return varlenAttention(this.#host, q, k, v, batch, opts);
  }

  // ------------------------------------------------------ attention kernel

  /**
   * Which attention kernel f16 runs at head dims 64 and 128 use: 'subgroup-matrix' (tensor
   * cores, where the adapter offers them) or 'fma'. Other head dims and f32 always run 'fma'.
   */
  get attentionKernel(): ActiveAttentionKernel {
    return this.gpu.subgroupMatrix ? 'subgroup-matrix' : 'fma';
  }

  /** The attention kernel a run of this dtype and head dim uses (f32 and head dims other than 64 and 128 run 'fma'). */
  attentionKernelFor(dtype: StorageDType, headDim: number): ActiveAttentionKernel {
    return this.gpu.tensorCores(dtype, headDim) ? 'subgroup-matrix' : 'fma';
  }

  /** The tensor-core kernel's form when it is in use (WebGpuBackendOptions.subgroupMatrixForm). */
  get subgroupMatrixForm(): SubgroupMatrixForm | undefined {
    return this.gpu.subgroupMatrix ? this.gpu.subgroupMatrixForm : undefined;
  }

  /** The program the given attention kernel runs for this dtype and head dim (for build reports). */
  attentionProgramFor(kernel: ActiveAttentionKernel, dtype: StorageDType, D: number): ProgramDescriptor {
    if (kernel === 'subgroup-matrix') return subgroupMatrixAttentionProgram(D, this.gpu.subgroupMatrixForm);
    return fmaAttentionProgram(dtype, D, this.gpu.compact);
  }

  async #attentionPipeline(dtype: StorageDType, D: number): Promise<GPUComputePipeline> {
    if (this.attentionKernelFor(dtype, D) === 'subgroup-matrix') {
      try {
        return await this.gpu.pipeline(subgroupMatrixAttentionProgram(D, this.gpu.subgroupMatrixForm));
      } catch (e) {
        // An experimental feature: if the driver rejects the program, keep the portable
        // kernel for the rest of this backend's life and say why in kernelNote.
        this.gpu.subgroupMatrix = false;
        this.gpu.noteKernel(`subgroup-matrix attention unavailable, using fma: ${e instanceof Error ? e.message : String(e)}`);
      }
    }
    return this.gpu.pipeline(this.attentionProgramFor('fma', dtype, D));
  }

  /**
   * Why a tensor-core program is not in use where it was eligible (the attention kernel, or
   * the proxy statistics' score passes) because its build failed.
   */
  get kernelNote(): string | undefined {
    return this.gpu.kernelNote;
  }

  /**
   * The score tiles the proxy statistics' two passes over every key use for this dtype and
   * head dim: 'subgroup-matrix' (tensor cores) wherever the tensor-core attention runs, else 'fma'.
   */
  statisticsKernelFor(dtype: StorageDType, headDim: number): ScoreTileKind {
    return scoreTileKindFor(this.gpu, dtype, headDim);
  }

  /**
   * Resolves when the work this backend queued has finished. On a device this backend made,
   * nothing is waited for when a read has come back after all of it (the queue runs in order);
   * on a device handed in, the queue's own completion is awaited, since others may queue
   * work there too.
   */
  async synchronize(): Promise<void> {
    this.#alive();
    await this.gpu.idle();
  }

  /**
   * Run `fn` (calls on this backend) with every kernel it queues timed on the GPU by
   * timestamp queries, and return its result with the GPU time per program (`GpuProfile`;
   * runtime/gpu-profile.ts). The backend is synchronised before the timestamps are read, so
   * work `fn` queued and did not await is included. Needs the device's `timestamp-query`
   * feature (requested wherever the adapter offers it; UNSUPPORTED otherwise); profiles do
   * not nest. The timestamps add a little GPU work per pass: time a run without a profile.
   */
  async profile<T>(fn: () => Promise<T>): Promise<{ readonly result: T; readonly profile: GpuProfile }> {
    this.#alive();
    if (typeof fn !== 'function') throw new InvalidArgumentError(`profile takes a function returning a promise; got ${typeof fn}`);
    if (this.gpu.profiler) throw new InvalidArgumentError('a profile is already open on this backend; profiles do not nest');
    const profiler = await this.gpu.guard(GpuProfiler.open(this.gpu));
    if (this.gpu.profiler) {
      profiler.discard();
      throw new InvalidArgumentError('a profile is already open on this backend; profiles do not nest');
    }
    this.gpu.profiler = profiler;
    let result: T;
    try {
      result = await fn();
      await this.synchronize();
    } catch (e) {
      profiler.discard();
      throw e;
    } finally {
      this.gpu.profiler = undefined;
    }
    return { result, profile: await this.gpu.guard(profiler.finish()) };
  }

  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    this.gpu.destroy();
  }
}
