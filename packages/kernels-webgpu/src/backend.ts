/**
 * The WebGPU backend: every @crisp/core Backend primitive in WGSL, one code path for
 * browsers and Node (the device or adapter is injected; see ./node.ts for Dawn in Node).
 *
 * Shape legend: q [m, H, d], k and v [n, Hkv, d], out [m, H, d], lse [H, m];
 * B block size (64 or 128), Nb = ceil(n / B), d in {64, 128}.
 */
import {
  assertStatsWindows,
  type AttentionOptions,
  type AttentionResult,
  type AttentionShape,
  type Backend,
  type BackendCapabilities,
  type BlockMask,
  type BlockRows,
  CrispError,
  type DType,
  DTypeError,
  type DeviceTensor,
  DeviceTensorBase,
  type HostData,
  type HostTensor,
  InvalidArgumentError,
  LimitError,
  NonFiniteError,
  type PeRowsOptions,
  type ProxyStats,
  type ProxyStatsOptions,
  ShapeError,
  UnsupportedError,
  assertBlockSize,
  assertDType,
  assertShape,
  assertSupported,
  attentionShape,
  bytesPerElement,
  defaultScale,
  numBlocks,
  numel,
  validateMask,
  wrapHost,
  wantedOptionalStats,
} from '@crisp/core';
import { GpuContext, Usage } from './gpu.js';
import { FMA_ATTENTION_WORKGROUP_BYTES, fmaAttentionProgram } from './kernels/attention/fma.js';
import { SUBGROUP_MATRIX_WORKGROUP_BYTES, subgroupMatrixAttentionProgram } from './kernels/attention/subgroup-matrix.js';
import { expandCountProgram, expandFillProgram, peMapProgram, scanProgram } from './kernels/blocks.js';
import { LOG2E, type ProgramDescriptor, type StorageDType } from './kernels/common.js';
import {
  SLASH_STRIDE,
  blockMeanProgram,
  blockSumsProgram,
  pooledLogitsProgram,
  rowCombineProgram,
  rowStatsProgram,
  scoresProgram,
  slashCombineProgram,
} from './kernels/proxy.js';
import { coverageCut } from './coverage.js';
import { writeHalvesProgram } from './kernels/write.js';

/** Features this backend asks for when the adapter offers them. */
export const OPTIONAL_FEATURES = ['shader-f16', 'subgroups', 'chromium-experimental-subgroup-matrix'] as const;

/**
 * Measured by crisp-bench on one NVIDIA H200 (Dawn over Vulkan, H = 32, Hkv = 8, d = 128,
 * f16, the llama fill; apps/bench/results/nvidia-h200/bench.md, session 5): CRISP end to end
 * against the dense kernel: 21.8 vs 21.6 ms at 8k (dense wins by 1%), 50.1 vs 82.6 ms at
 * 16k; the log-n interpolation of the ratio crosses 1 at 8,262 keys. (Session 3, with a
 * slower dense kernel: CRISP won from 8k, the smallest size measured, so the gate was 8192.)
 */
export const H200_SPARSE_CROSSOVER = 8262;

/**
 * The selectable attention kernels; see WebGpuBackendOptions.attentionKernel. 'fma' is the
 * default; 'subgroup-matrix' is EXPERIMENTAL.
 */
export type AttentionKernel = 'fma' | 'subgroup-matrix';
export const ATTENTION_KERNELS: readonly AttentionKernel[] = ['fma', 'subgroup-matrix'];
/** A kernel a backend actually runs (the option's kernel, or 'fma' where the other is not eligible). */
export type ActiveAttentionKernel = AttentionKernel;

export interface WebGpuBackendOptions {
  /** Use this device (its features and limits as they are). */
  readonly device?: GPUDevice;
  /** Request a device from this adapter (with its real limits and the optional features). */
  readonly adapter?: GPUAdapter;
  /** Request an adapter from this GPU object (default: navigator.gpu). */
  readonly gpu?: GPU;
  /** Override the measured length gate (keys below which dense is faster). */
  readonly sparseCrossover?: number;
  /**
   * Upper bound on the multiply-adds one dispatch may hold (default 2^38, ~ 20-80 ms on a
   * large GPU): longer attention is split across heads and query tiles so no GPU watchdog
   * loses the device.
   */
  readonly maxDispatchWork?: number;
  /**
   * Attention kernel (dense and block-sparse use the same one).
   * - 'fma' (default): FMA flash attention (src/kernels/attention/fma.ts), f16 and f32,
   *   32 KiB of workgroup memory. On one H200: 25.8 / 26.8 / 27.1 / 26.8 TFLOP/s dense at
   *   8k / 16k / 32k / 64k (f16, H = 32, Hkv = 8, d = 128); @crisp/conformance passes with
   *   it there at n = 4000 and 65536.
   * - 'subgroup-matrix': EXPERIMENTAL tensor-core kernel for f16
   *   (src/kernels/attention/subgroup-matrix.ts) when the adapter offers
   *   chromium-experimental-subgroup-matrix (16 x 16 x 16 f16 -> f32, 32-wide subgroups),
   *   `subgroups`, and 41 KiB of workgroup memory. It matches float64 on the H200 but runs at
   *   6.7-7.3 TFLOP/s there, a quarter of 'fma'. f32 tensors, ineligible adapters or a failed
   *   build use 'fma' (`kernelNote` says why a build failed).
   */
  readonly attentionKernel?: AttentionKernel;
  /**
   * Rolled-loop WGSL (same arithmetic, far less code). Default: on for CPU adapters
   * (SwiftShader, fallback adapters), where pipeline compilation dominates; off on GPUs, where
   * the unrolled kernels were measured.
   */
  readonly compactKernels?: boolean;
}

export interface WebGpuInfo {
  readonly vendor: string;
  readonly architecture: string;
  readonly description: string;
  readonly features: readonly string[];
  readonly limits: GpuContext['limits'];
}

let nextId = 0;

class WebGpuTensor extends DeviceTensorBase {
  readonly backend = 'webgpu';
  readonly owner: WebGpuBackend;
  readonly buffer: GPUBuffer;
  readonly byteLength: number;
  constructor(owner: WebGpuBackend, dtype: DType, shape: readonly number[], buffer: GPUBuffer, byteLength: number) {
    super(dtype, shape);
    this.owner = owner;
    this.buffer = buffer;
    this.byteLength = byteLength;
  }
  protected release(): void {
    // Work already submitted may still read it: destroy once the queue drains.
    this.owner.gpu.retire(this.buffer);
  }
}

function unavailable(message: string, details?: Record<string, unknown>): CrispError {
  return new CrispError('BACKEND_UNAVAILABLE', message, details);
}

/**
 * Create the backend. Pass `device` (used as is), or `adapter`/`gpu` (a device is requested
 * with the adapter's real limits and the optional features it offers). Without any,
 * `navigator.gpu` is used. No adapter: BACKEND_UNAVAILABLE with the reason.
 */
export async function createWebGpuBackend(opts: WebGpuBackendOptions = {}): Promise<WebGpuBackend> {
  let device = opts.device;
  let adapter = opts.adapter;
  if (!device) {
    if (!adapter) {
      const gpu = opts.gpu ?? (globalThis as { navigator?: { gpu?: GPU } }).navigator?.gpu;
      if (!gpu) {
        throw unavailable(
          'no WebGPU here: navigator.gpu is undefined. In Node use createNodeWebGpuBackend from @crisp/kernels-webgpu/node; in a browser use one with WebGPU enabled',
        );
      }
      adapter = (await gpu.requestAdapter({ powerPreference: 'high-performance' })) ?? undefined;
      if (!adapter) {
        throw unavailable(
          'no WebGPU adapter found (requestAdapter returned null): no usable GPU driver. On Linux Dawn needs a Vulkan driver (libvulkan.so.1 and an ICD; SwiftShader works: VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json)',
        );
      }
    }
    const want = OPTIONAL_FEATURES.filter((f) => adapter!.features.has(f)) as GPUFeatureName[];
    const al = adapter.limits;
    const requiredLimits: Record<string, number> = {
      maxStorageBufferBindingSize: Number(al.maxStorageBufferBindingSize),
      maxBufferSize: Number(al.maxBufferSize),
      maxComputeWorkgroupStorageSize: al.maxComputeWorkgroupStorageSize,
      maxStorageBuffersPerShaderStage: al.maxStorageBuffersPerShaderStage,
      maxComputeInvocationsPerWorkgroup: al.maxComputeInvocationsPerWorkgroup,
      maxComputeWorkgroupSizeX: al.maxComputeWorkgroupSizeX,
    };
    try {
      device = await adapter.requestDevice({ requiredFeatures: want, requiredLimits, label: 'crisp' });
    } catch (e) {
      throw unavailable(`the WebGPU adapter refused a device: ${e instanceof Error ? e.message : String(e)}`);
    }
  }
  const ctx = new GpuContext(device);
  ctx.ownsDevice = opts.device === undefined;
  // Hold what created the device: some implementations (dawn.node) free the instance
  // when only the device refers to it.
  ctx.keepAlive.push(opts.gpu, adapter);
  if (ctx.limits.maxStorageBuffersPerShaderStage < 7) {
    throw unavailable(
      `this device allows ${ctx.limits.maxStorageBuffersPerShaderStage} storage buffers per shader stage; the attention kernel binds 7`,
      { limit: 'maxStorageBuffersPerShaderStage' },
    );
  }
  if (ctx.limits.maxComputeWorkgroupStorageSize < FMA_ATTENTION_WORKGROUP_BYTES) {
    throw unavailable(
      `this device allows ${ctx.limits.maxComputeWorkgroupStorageSize} bytes of workgroup memory; the attention kernel needs ${FMA_ATTENTION_WORKGROUP_BYTES} (request the adapter's limit)`,
      { limit: 'maxComputeWorkgroupStorageSize' },
    );
  }
  const info = adapter?.info;
  const ai = info as unknown as
    | { subgroupMinSize?: number; subgroupMaxSize?: number; subgroupMatrixConfigs?: Iterable<Record<string, unknown>> }
    | undefined;
  const kernel = opts.attentionKernel ?? 'fma';
  if (!ATTENTION_KERNELS.includes(kernel)) {
    throw new InvalidArgumentError(`attentionKernel must be one of ${ATTENTION_KERNELS.join(', ')}; got ${String(kernel)}`);
  }
  const smm =
    device.features.has('shader-f16') &&
    device.features.has('subgroups') &&
    device.features.has('chromium-experimental-subgroup-matrix') &&
    ai?.subgroupMinSize === 32 &&
    ai?.subgroupMaxSize === 32 &&
    [...(ai?.subgroupMatrixConfigs ?? [])].some(
      (c) => c.componentType === 'f16' && c.resultComponentType === 'f32' && c.M === 16 && c.N === 16 && c.K === 16,
    );
  ctx.subgroupMatrix =
    smm && kernel === 'subgroup-matrix' && ctx.limits.maxComputeWorkgroupStorageSize >= SUBGROUP_MATRIX_WORKGROUP_BYTES;
  const cpu =
    /swiftshader|llvmpipe|lavapipe/i.test(`${info?.architecture ?? ''} ${info?.description ?? ''}`) ||
    Boolean((info as { isFallbackAdapter?: boolean } | undefined)?.isFallbackAdapter);
  ctx.compact = opts.compactKernels ?? cpu;
  return new WebGpuBackend(ctx, {
    vendor: info?.vendor ?? '',
    architecture: info?.architecture ?? '',
    description: info?.description ?? '',
    features: [...device.features].map(String).sort(),
    limits: ctx.limits,
  }, opts);
}

export class WebGpuBackend implements Backend {
  readonly name = 'webgpu';
  readonly capabilities: BackendCapabilities;
  readonly sparseCrossover: number;
  readonly info: WebGpuInfo;
  /** The context (device, limits, pipelines); for benchmarks and tests. */
  readonly gpu: GpuContext;
  readonly #maxWork: number;
  #disposed = false;
  readonly #id = nextId++;

  constructor(ctx: GpuContext, info: WebGpuInfo, opts: WebGpuBackendOptions) {
    this.gpu = ctx;
    this.info = info;
    const crossover = opts.sparseCrossover ?? H200_SPARSE_CROSSOVER;
    if (typeof crossover !== 'number' || !(crossover >= 0)) {
      throw new InvalidArgumentError(`sparseCrossover must be a non-negative number; got ${String(crossover)}`);
    }
    this.sparseCrossover = crossover;
    const work = opts.maxDispatchWork ?? 2 ** 38;
    if (!(work > 0)) throw new InvalidArgumentError(`maxDispatchWork must be positive; got ${String(work)}`);
    this.#maxWork = work;
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
    if (!(t instanceof WebGpuTensor) || t.owner !== this) {
      throw new CrispError(
        'WRONG_BACKEND',
        `${what} belongs to backend '${(t as DeviceTensor | undefined)?.backend ?? typeof t}', not to this WebGPU backend; download it and upload it here`,
      );
    }
    if (t.disposed) throw new CrispError('DISPOSED', `${what} tensor was disposed`);
    return t;
  }

  #newTensor(dtype: DType, shape: readonly number[]): WebGpuTensor {
    const bytes = numel(shape) * bytesPerElement(dtype);
    const padded = Math.max(16, Math.ceil(bytes / 16) * 16);
    if (padded > this.gpu.limits.maxBufferSize) {
      throw new LimitError(
        `a ${dtype} tensor of shape [${shape}] needs ${bytes} bytes; this device's maxBufferSize is ${this.gpu.limits.maxBufferSize}`,
        { limit: 'maxBufferSize', max: this.gpu.limits.maxBufferSize },
      );
    }
    const buf = this.gpu.createBuffer(padded, Usage.STORAGE | Usage.COPY_DST | Usage.COPY_SRC, `tensor[${shape}]`);
    return new WebGpuTensor(this, dtype, shape, buf, bytes);
  }

  upload(t: HostTensor): DeviceTensor {
    this.#alive();
    if (!t || typeof t !== 'object') throw new InvalidArgumentError('upload needs a host tensor { dtype, shape, data }');
    const host = wrapHost(t.dtype, t.shape, t.data);
    const dt = this.allocate(host.dtype, host.shape) as WebGpuTensor;
    this.write(dt, 0, host.data);
    return dt;
  }

  allocate(dtype: DType, shape: readonly number[]): DeviceTensor {
    this.#alive();
    assertDType(dtype);
    assertShape(shape as number[]);
    if (dtype === 'bf16') {
      throw new UnsupportedError('the WebGPU backend stores f32 and f16 only (WGSL has no bf16); cast to f16 or f32', {
        limit: 'dtype',
      });
    }
    return this.#newTensor(dtype, shape);
  }

  write(t: DeviceTensor, elementOffset: number, data: HostData): void {
    const wt = this.#own(t, 'write target');
    if (wt.dtype === 'f32' ? !(data instanceof Float32Array) : !(data instanceof Uint16Array)) {
      throw new DTypeError(
        `write into a ${wt.dtype} tensor needs a ${wt.dtype === 'f32' ? 'Float32Array' : 'Uint16Array of bit patterns'}`,
      );
    }
    const total = numel(wt.shape);
    if (!Number.isInteger(elementOffset) || elementOffset < 0 || elementOffset + data.length > total) {
      throw new InvalidArgumentError(
        `write of ${data.length} elements at offset ${elementOffset} does not fit a tensor of ${total} elements`,
      );
    }
    if (data.length === 0) return;
    const bpe = bytesPerElement(wt.dtype);
    const byteOff = elementOffset * bpe;
    const q = this.gpu.device.queue;
    if (byteOff % 4 === 0 && data.byteLength % 4 === 0) {
      q.writeBuffer(wt.buffer, byteOff, data.buffer, data.byteOffset, data.byteLength);
      return;
    }
    // f16 at an odd element offset or of odd length: whole words go straight in, the one or
    // two boundary halves through a tiny kernel that keeps the neighbouring half intact.
    this.#writeHalves(wt, elementOffset, data as Uint16Array);
  }

  #writeHalves(wt: WebGpuTensor, off: number, data: Uint16Array): void {
    const firstWord = Math.floor(off / 2);
    const lastWord = Math.floor((off + data.length - 1) / 2);
    const words = lastWord - firstWord + 1;
    const packed = new Uint16Array(words * 2);
    packed.set(data, off - firstWord * 2);
    const src = this.gpu.createBuffer(packed.byteLength, Usage.STORAGE | Usage.COPY_DST, 'halves');
    this.gpu.device.queue.writeBuffer(src, 0, packed.buffer, 0, packed.byteLength);
    const prog = writeHalvesProgram();
    const uni = this.gpu.uniform([firstWord, words, off, data.length]);
    const enc = this.gpu.device.createCommandEncoder();
    // Pipelines build asynchronously; this one is tiny and compiled synchronously instead.
    const module = this.gpu.device.createShaderModule({ code: prog.wgsl, label: prog.name });
    const pipe = this.gpu.device.createComputePipeline({ layout: 'auto', compute: { module, entryPoint: prog.entryPoint } });
    this.gpu.dispatch(enc, pipe, [uni, src, wt.buffer], [Math.ceil(words / 256)]);
    this.gpu.submit(enc, [uni, src]);
  }

  async download(t: DeviceTensor): Promise<HostTensor> {
    const wt = this.#own(t, 'downloaded');
    const n = numel(wt.shape);
    const ab = await this.gpu.read(wt.buffer, 0, wt.byteLength);
    const data = wt.dtype === 'f32' ? new Float32Array(ab, 0, n) : new Uint16Array(ab, 0, n);
    return { dtype: wt.dtype, shape: [...wt.shape], data };
  }

  // ------------------------------------------------------------- validation

  #checkScale(scale: number | undefined, d: number): number {
    if (scale === undefined) return defaultScale(d);
    if (typeof scale !== 'number' || !Number.isFinite(scale) || scale <= 0) {
      throw new InvalidArgumentError(`scale must be a positive finite number; got ${String(scale)}`);
    }
    return scale;
  }

  /** Binding-size limit: the largest n that fits for this H, d and dtype, named in the error. */
  #checkBindings(shape: AttentionShape): void {
    const lim = this.gpu.limits.maxStorageBufferBindingSize;
    const bpe = bytesPerElement(shape.dtype);
    const row = shape.heads * shape.headDim * bpe;
    const qBytes = shape.queries * row;
    const kBytes = shape.keys * shape.kvHeads * shape.headDim * bpe;
    if (qBytes > lim || kBytes > lim) {
      const maxN = Math.floor(lim / row);
      throw new LimitError(
        `q of ${qBytes} bytes exceeds this device's maxStorageBufferBindingSize (${lim} bytes): with H = ${shape.heads}, d = ${shape.headDim}, ${shape.dtype} the largest n that fits is ${maxN}. Split the sequence into chunks (chunked prefill with the LSE merge) or use a device with a larger limit`,
        { limit: 'maxStorageBufferBindingSize', max: maxN, bytes: Math.max(qBytes, kBytes) },
      );
    }
  }

  #prepare(
    q: DeviceTensor,
    k: DeviceTensor,
    v: DeviceTensor | undefined,
  ): { shape: AttentionShape; qt: WebGpuTensor; kt: WebGpuTensor; vt?: WebGpuTensor } {
    const qt = this.#own(q, 'q');
    const kt = this.#own(k, 'k');
    const vt = v ? this.#own(v, 'v') : undefined;
    const shape = attentionShape(qt, kt, vt ?? kt);
    assertSupported(this.capabilities, shape, this.name);
    this.#checkBindings(shape);
    return { shape, qt, kt, vt };
  }

  // ----------------------------------------------------------------- proxy

  async proxyStats(q: DeviceTensor, k: DeviceTensor, opts: ProxyStatsOptions): Promise<ProxyStats> {
    const { shape, qt, kt } = this.#prepare(q, k, undefined);
    if (!opts || typeof opts !== 'object') throw new InvalidArgumentError('proxyStats needs options ({ blockSize, wSink, wLocal })');
    assertBlockSize(opts.blockSize, this.capabilities.blockSizes);
    assertStatsWindows(opts);
    // (checked; this backend computes every statistic whatever is asked for)
    wantedOptionalStats(opts.optionalStats);
    const scale = this.#checkScale(opts.scale, shape.headDim);
    const { queries: m, keys: n, heads: H, kvHeads: Hkv, headDim: D } = shape;
    const dtype = shape.dtype as StorageDType;
    const B = opts.blockSize;
    const Nb = numBlocks(n, B);
    const b = Math.min(B, m);
    const T = Math.ceil(n / 64);
    const rowTiles = Math.ceil(b / 64);
    const tilesPerSplit = Math.max(16, Math.ceil(T / 4096));
    const numSplits = Math.ceil(T / tilesPerSplit);
    const g = this.gpu;
    const [pRow, pComb, pScores, pSlash, pBlock, pMean, pLogits] = await Promise.all([
      g.pipeline(rowStatsProgram(dtype, D, g.compact)),
      g.pipeline(rowCombineProgram()),
      g.pipeline(scoresProgram(dtype, D, g.compact)),
      g.pipeline(slashCombineProgram()),
      g.pipeline(blockSumsProgram()),
      g.pipeline(blockMeanProgram(dtype, D)),
      g.pipeline(pooledLogitsProgram(dtype, D)),
    ]);
    const S = Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST;
    const part = g.createBuffer(H * b * numSplits * 16, S, 'rowStats.part');
    const rows = g.createBuffer(H * b * 16, S, 'rowStats.rows');
    const av = g.createBuffer(H * n * 4, S, 'a_v');
    const as = g.createBuffer(H * n * 4, S, 'a_s');
    const slashPart = g.createBuffer(H * T * SLASH_STRIDE * 4, S, 'slash.part');
    const sums = g.createBuffer(H * (Nb + 1) * 2 * 4, S, 'blockSums');
    const kbar = g.createBuffer(Hkv * Nb * D * 4, S, 'kbar');
    const logits = g.createBuffer(H * Nb * 4, S, 'pooledLogits');
    const owned = [part, rows, av, as, slashPart, sums, kbar, logits];
    const temps: GPUBuffer[] = [];
    try {
      const scaleLog2 = { f32: scale * LOG2E };
      // Bounded dispatches: heads per dispatch so one holds <= maxWork multiply-adds.
      const perHead = b * n * D;
      const hg = Math.max(1, Math.min(H, Math.floor(this.#maxWork / perHead)));
      for (let h0 = 0; h0 < H; h0 += hg) {
        const nh = Math.min(hg, H - h0);
        const enc = g.device.createCommandEncoder();
        const u = g.uniform([m, n, H, Hkv, b, tilesPerSplit, numSplits, h0, scaleLog2, 0, 0, 0]);
        temps.push(u);
        g.dispatch(enc, pRow, [u, qt.buffer, kt.buffer, part], [numSplits, rowTiles, nh]);
        g.submit(enc, temps);
      }
      {
        const enc = g.device.createCommandEncoder();
        const u = g.uniform([H * b, b, numSplits, 0]);
        temps.push(u);
        g.dispatch(enc, pComb, [u, part, rows], [Math.ceil((H * b) / 256)]);
        g.submit(enc, temps);
      }
      for (let h0 = 0; h0 < H; h0 += hg) {
        const nh = Math.min(hg, H - h0);
        const enc = g.device.createCommandEncoder();
        const u = g.uniform([m, n, H, Hkv, b, T, h0, 0, scaleLog2, { f32: 1 / b }, 0, 0]);
        temps.push(u);
        g.dispatch(enc, pScores, [u, qt.buffer, kt.buffer, rows, av, slashPart], [T, nh]);
        g.submit(enc, temps);
      }
      const enc = g.device.createCommandEncoder();
      const grid = g.grid(H * n);
      const u1 = g.uniform([n, b, T, H, { f32: 1 / b }, grid.rowWidth, 0, 0]);
      g.dispatch(enc, pSlash, [u1, slashPart, as], grid.groups);
      const sinkEnd = Math.min(opts.wSink, n);
      const localStart = Math.max(n - opts.wLocal, sinkEnd);
      const u2 = g.uniform([n, B, Nb, H, sinkEnd, localStart, 0, 0]);
      g.dispatch(enc, pBlock, [u2, av, as, sums], [Math.ceil((H * (Nb + 1)) / 256)]);
      const mgrid = g.grid(Hkv * Nb * (D / 4));
      const u3 = g.uniform([n, Hkv, 0, Nb, B, mgrid.rowWidth, 0, 0]);
      g.dispatch(enc, pMean, [u3, kt.buffer, kbar], mgrid.groups);
      const u4 = g.uniform([m, H, Hkv, b, Nb, { f32: scale }, 0, 0]);
      g.dispatch(enc, pLogits, [u4, qt.buffer, kbar, logits], [Math.ceil(Nb / 256), H]);
      temps.push(u1, u2, u3, u4);
      g.submit(enc, temps);

      const [rowsAb, sumsAb, logitsAb, avAb, asAb] = await Promise.all([
        g.read(rows, 0, H * b * 16),
        g.read(sums, 0, H * (Nb + 1) * 8),
        g.read(logits, 0, H * Nb * 4),
        opts.tokenScores ? g.read(av, 0, H * n * 4) : undefined,
        opts.tokenScores ? g.read(as, 0, H * n * 4) : undefined,
      ]);
      const rowStats = new Float32Array(rowsAb);
      for (let r = 0; r < H * b; r++) {
        if (rowStats[r * 4 + 3] !== 0) {
          throw new NonFiniteError(
            `q or k holds NaN or Inf (seen by proxy row ${r % b} of head ${Math.floor(r / b)}); clean the inputs first`,
            { head: Math.floor(r / b) },
          );
        }
      }
      const blockSums = new Float32Array(sumsAb);
      const lg = new Float32Array(logitsAb);
      const cStruct = new Float64Array(H);
      const rowEntropy = new Float64Array(H);
      const verticalBlocks = new Float64Array(H * Nb);
      const slashBlocks = new Float64Array(H * Nb);
      const pooledEstimate = new Float64Array(H * Nb);
      for (let h = 0; h < H; h++) {
        let e = 0;
        for (let i = 0; i < b; i++) e += rowStats[(h * b + i) * 4 + 2];
        rowEntropy[h] = e / b;
        const base = h * (Nb + 1);
        cStruct[h] = blockSums[(base + Nb) * 2];
        for (let J = 0; J < Nb; J++) {
          verticalBlocks[h * Nb + J] = blockSums[(base + J) * 2];
          slashBlocks[h * Nb + J] = blockSums[(base + J) * 2 + 1];
        }
        let mx = Number.NEGATIVE_INFINITY;
        for (let J = 0; J < Nb; J++) mx = Math.max(mx, lg[h * Nb + J]);
        let z = 0;
        for (let J = 0; J < Nb; J++) z += Math.exp(lg[h * Nb + J] - mx);
        for (let J = 0; J < Nb; J++) pooledEstimate[h * Nb + J] = Math.exp(lg[h * Nb + J] - mx) / z;
      }
      return {
        n,
        heads: H,
        blockSize: B,
        numBlocks: Nb,
        proxyRows: b,
        cStruct,
        verticalBlocks,
        slashBlocks,
        pooledEstimate,
        rowEntropy,
        verticalTokens: avAb ? new Float32Array(avAb) : undefined,
        slashTokens: asAb ? new Float32Array(asAb) : undefined,
      };
    } finally {
      this.gpu.retire(...temps, ...owned);
    }
  }

  // -------------------------------------------------------------------- PE

  async peBlockRows(q: DeviceTensor, k: DeviceTensor, opts: PeRowsOptions): Promise<BlockRows> {
    const { shape, qt, kt } = this.#prepare(q, k, undefined);
    if (!opts || typeof opts !== 'object') throw new InvalidArgumentError('peBlockRows needs options ({ blockSize, gamma, heads })');
    assertBlockSize(opts.blockSize, this.capabilities.blockSizes);
    if (typeof opts.gamma !== 'number' || !(opts.gamma > 0 && opts.gamma <= 1)) {
      throw new InvalidArgumentError(`gamma must be a number in (0, 1]; got ${String(opts.gamma)}`);
    }
    const { queries: m, keys: n, heads: H, kvHeads: Hkv, headDim: D } = shape;
    const heads = opts.heads;
    if (!Array.isArray(heads) && !ArrayBuffer.isView(heads)) {
      throw new InvalidArgumentError('heads must be an array of ascending head indices');
    }
    for (let i = 0; i < heads.length; i++) {
      const h = heads[i];
      if (!Number.isInteger(h) || h < 0 || h >= H || (i > 0 && h <= heads[i - 1])) {
        throw new InvalidArgumentError(`heads must be strictly ascending integers in [0, ${H}); got ${JSON.stringify(Array.from(heads))}`);
      }
    }
    const scale = this.#checkScale(opts.scale, D);
    const B = opts.blockSize;
    const Nb = numBlocks(n, B);
    if (heads.length === 0) return { rowPtr: new Int32Array(1), cols: new Int32Array(0) };
    if (Nb > this.gpu.limits.maxComputeWorkgroupsPerDimension) {
      throw new LimitError(`PE map needs ${Nb} workgroups along x; the device allows ${this.gpu.limits.maxComputeWorkgroupsPerDimension}`, {
        limit: 'maxComputeWorkgroupsPerDimension',
        max: this.gpu.limits.maxComputeWorkgroupsPerDimension * B,
      });
    }
    const dtype = shape.dtype as StorageDType;
    const g = this.gpu;
    const [pMean, pMap] = await Promise.all([g.pipeline(blockMeanProgram(dtype, D)), g.pipeline(peMapProgram(D))]);
    const S = Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST;
    const entries = (Nb * (Nb + 1)) / 2;
    const perHeadBytes = entries * 4;
    if (perHeadBytes > g.limits.maxStorageBufferBindingSize) {
      const maxNb = Math.floor((Math.sqrt(1 + (8 * g.limits.maxStorageBufferBindingSize) / 4) - 1) / 2);
      throw new LimitError(
        `one head's PE map (${entries} entries) exceeds maxStorageBufferBindingSize (${g.limits.maxStorageBufferBindingSize} bytes); the largest n that fits at B = ${B} is ${maxNb * B}`,
        { limit: 'maxStorageBufferBindingSize', max: maxNb * B },
      );
    }
    // Heads per pass: bounded by the binding limit and 256 MiB of host traffic per pass.
    const chunk = Math.max(1, Math.min(heads.length, Math.floor(Math.min(g.limits.maxStorageBufferBindingSize, 2 ** 28) / perHeadBytes)));
    const qbar = g.createBuffer(H * Nb * D * 4, S, 'qbar');
    const kbar = g.createBuffer(Hkv * Nb * D * 4, S, 'kbar');
    const map = g.createBuffer(chunk * perHeadBytes, S, 'peMap');
    const temps: GPUBuffer[] = [];
    // Active query blocks hold at least one query row (chunked prefill starts at n - m).
    const firstPos = n - m;
    const active = new Uint8Array(Nb);
    let activeRows = 0;
    for (let I = 0; I < Nb; I++) {
      if (Math.max(I * B, firstPos) < Math.min(I * B + B, n)) {
        active[I] = 1;
        activeRows++;
      }
    }
    try {
      const enc = g.device.createCommandEncoder();
      const gq = g.grid(H * Nb * (D / 4));
      const uq = g.uniform([m, H, firstPos, Nb, B, gq.rowWidth, 0, 0]);
      g.dispatch(enc, pMean, [uq, qt.buffer, qbar], gq.groups);
      const gk = g.grid(Hkv * Nb * (D / 4));
      const uk = g.uniform([n, Hkv, 0, Nb, B, gk.rowWidth, 0, 0]);
      g.dispatch(enc, pMean, [uk, kt.buffer, kbar], gk.groups);
      temps.push(uq, uk);
      g.submit(enc, temps);
      const perHead: Uint8Array[] = [];
      for (let s0 = 0; s0 < heads.length; s0 += chunk) {
        const nh = Math.min(chunk, heads.length - s0);
        const hb = g.u32Buffer(Array.from(heads).slice(s0, s0 + nh), 'peHeads');
        const u = g.uniform([H, Hkv, Nb, B, firstPos, n, { f32: scale }, 0]);
        const e2 = g.device.createCommandEncoder();
        g.dispatch(e2, pMap, [u, qbar, kbar, hb, map], [Nb, nh]);
        temps.push(u, hb);
        g.submit(e2, temps);
        const vals = new Float32Array(await g.read(map, 0, nh * perHeadBytes));
        for (let s = 0; s < nh; s++) {
          perHead.push(coverageCut(vals.subarray(s * entries, (s + 1) * entries), Nb, active, activeRows, opts.gamma));
        }
      }
      // Kept flags are row-major (I, then J), so each row's cols come out sorted.
      const rowPtr = new Int32Array(heads.length * Nb + 1);
      let total = 0;
      for (const keep of perHead) for (let e = 0; e < entries; e++) total += keep[e];
      const cols = new Int32Array(total);
      let p = 0;
      for (let s = 0; s < heads.length; s++) {
        const keep = perHead[s];
        let e = 0;
        for (let I = 0; I < Nb; I++) {
          for (let J = 0; J <= I; J++, e++) if (keep[e]) cols[p++] = J;
          rowPtr[s * Nb + I + 1] = p;
        }
      }
      return { rowPtr, cols };
    } finally {
      this.gpu.retire(...temps, qbar, kbar, map);
    }
  }

  // ------------------------------------------------------------ VS-to-rows

  /** Expand on the GPU; rowPtr and cols stay in device buffers (the caller destroys them). */
  async #expandOnDevice(mask: BlockMask): Promise<{ rowPtr: GPUBuffer; cols: GPUBuffer; rows: number }> {
    const H = mask.heads;
    const Nb = mask.numBlocks;
    const R = H * Nb;
    const g = this.gpu;
    const vs = mask.vs;
    const vsPtr = new Uint32Array(2 * (H + 1));
    let sliceBase = 0;
    let list = new Uint32Array(0);
    if (vs) {
      vsPtr.set(vs.verticalPtr, 0);
      vsPtr.set(vs.slashPtr, H + 1);
      sliceBase = vs.vertical.length;
      list = new Uint32Array(vs.vertical.length + vs.slash.length);
      list.set(vs.vertical, 0);
      list.set(vs.slash, sliceBase);
    }
    // Upper bound on the expanded size: a row holds at most I + 1 blocks and at most the
    // sum of its three sources.
    let cap = 0;
    for (let h = 0; h < H; h++) {
      const lists = vs ? vs.verticalPtr[h + 1] - vs.verticalPtr[h] + vs.slashPtr[h + 1] - vs.slashPtr[h] : 0;
      for (let I = 0; I < Nb; I++) {
        const r = h * Nb + I;
        const own = mask.rows ? mask.rows.rowPtr[r + 1] - mask.rows.rowPtr[r] : 0;
        cap += Math.min(I + 1, lists + own);
      }
    }
    if (cap * 4 > g.limits.maxStorageBufferBindingSize) {
      throw new LimitError(`the expanded mask (${cap} blocks) exceeds maxStorageBufferBindingSize`, {
        limit: 'maxStorageBufferBindingSize',
      });
    }
    const [pCount, pScan, pFill] = await Promise.all([
      g.pipeline(expandCountProgram()),
      g.pipeline(expandFillProgram()),
      g.pipeline(scanProgram()),
    ]).then(([c, f, s]) => [c, s, f] as const);
    const temps: GPUBuffer[] = [];
    const ptrB = g.u32Buffer(vsPtr, 'vsPtr');
    const listB = g.u32Buffer(list, 'vsList');
    const rpB = g.u32Buffer(mask.rows ? mask.rows.rowPtr : [0], 'rowPtr.in');
    const colsB = g.u32Buffer(mask.rows ? mask.rows.cols : [0], 'cols.in');
    temps.push(ptrB, listB, rpB, colsB);
    const S = Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST;
    const outPtr = g.createBuffer((R + 1) * 4, S, 'rowPtr');
    const outCols = g.createBuffer(Math.max(1, cap) * 4, S, 'cols');
    const grid = g.grid(R);
    const u = g.uniform([H, Nb, mask.rows ? 1 : 0, sliceBase, grid.rowWidth, 0, 0, 0]);
    const us = g.uniform([R, 0, 0, 0]);
    temps.push(u, us);
    const enc = g.device.createCommandEncoder();
    g.dispatch(enc, pCount, [u, ptrB, listB, rpB, colsB, outPtr], grid.groups);
    g.dispatch(enc, pScan, [us, outPtr], [1]);
    g.dispatch(enc, pFill, [u, ptrB, listB, rpB, colsB, outPtr, outCols], grid.groups);
    g.submit(enc, temps);
    return { rowPtr: outPtr, cols: outCols, rows: R };
  }

  async expandMask(mask: BlockMask): Promise<BlockRows> {
    this.#alive();
    validateMask(mask);
    assertBlockSize(mask.blockSize, this.capabilities.blockSizes);
    const { rowPtr, cols, rows } = await this.#expandOnDevice(mask);
    try {
      const ptr = new Int32Array(await this.gpu.read(rowPtr, 0, (rows + 1) * 4));
      const total = ptr[rows];
      const c = total > 0 ? new Int32Array(await this.gpu.read(cols, 0, total * 4)) : new Int32Array(0);
      return { rowPtr: ptr, cols: c };
    } finally {
      this.gpu.retire(rowPtr, cols);
    }
  }

  // ------------------------------------------------------------- attention

  async sparseAttention(
    q: DeviceTensor,
    k: DeviceTensor,
    v: DeviceTensor,
    mask: BlockMask,
    opts: AttentionOptions = {},
  ): Promise<AttentionResult> {
    const { shape, qt, kt, vt } = this.#prepare(q, k, v);
    if (!mask || typeof mask !== 'object') throw new InvalidArgumentError('sparseAttention needs a BlockMask');
    assertBlockSize(mask.blockSize, this.capabilities.blockSizes);
    const Nb = numBlocks(shape.keys, mask.blockSize);
    validateMask(mask, { heads: shape.heads, numBlocks: Nb, blockSize: mask.blockSize });
    let rowPtr: GPUBuffer;
    let cols: GPUBuffer;
    let blocks: number;
    if (!mask.vs && mask.rows) {
      rowPtr = this.gpu.u32Buffer(mask.rows.rowPtr, 'rowPtr');
      cols = this.gpu.u32Buffer(mask.rows.cols.length ? mask.rows.cols : [0], 'cols');
      blocks = mask.rows.cols.length;
    } else {
      const e = await this.#expandOnDevice(mask);
      rowPtr = e.rowPtr;
      cols = e.cols;
      blocks = e.cols.size / 4;
    }
    try {
      return await this.#attention(shape, qt, kt, vt!, { rowPtr, cols, B: mask.blockSize, Nb, blocks }, opts);
    } finally {
      this.gpu.retire(rowPtr, cols);
    }
  }

  async denseAttention(q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, opts: AttentionOptions = {}): Promise<AttentionResult> {
    const { shape, qt, kt, vt } = this.#prepare(q, k, v);
    return this.#attention(shape, qt, kt, vt!, undefined, opts);
  }

  async #attention(
    shape: AttentionShape,
    qt: WebGpuTensor,
    kt: WebGpuTensor,
    vt: WebGpuTensor,
    sparse: { rowPtr: GPUBuffer; cols: GPUBuffer; B: number; Nb: number; blocks: number } | undefined,
    opts: AttentionOptions,
  ): Promise<AttentionResult> {
    if (opts === null || typeof opts !== 'object') throw new InvalidArgumentError('attention options must be an object');
    const { queries: m, keys: n, heads: H, kvHeads: Hkv, headDim: D } = shape;
    const scale = this.#checkScale(opts.scale, D);
    let out: WebGpuTensor;
    if (opts.out !== undefined) {
      out = this.#own(opts.out, 'out');
      if (out.dtype !== shape.dtype || out.shape.length !== 3 || out.shape[0] !== m || out.shape[1] !== H || out.shape[2] !== D) {
        throw new ShapeError(`out must be a ${shape.dtype} tensor of shape [${m}, ${H}, ${D}]; got ${out.dtype} [${out.shape}]`);
      }
    } else {
      out = this.#newTensor(shape.dtype, [m, H, D]);
    }
    const lse = opts.returnLse ? this.#newTensor('f32', [H, m]) : undefined;
    const g = this.gpu;
    const pipe = await this.#attentionPipeline(shape.dtype as StorageDType, D);
    const temps: GPUBuffer[] = [];
    const dummy = sparse ? undefined : g.createBuffer(16, Usage.STORAGE, 'none');
    const lseBuf = lse ? lse.buffer : g.createBuffer(16, Usage.STORAGE, 'no-lse');
    const B = sparse?.B ?? 128;
    const Nb = sparse?.Nb ?? numBlocks(n, B);
    const firstTile = Math.floor((n - m) / 64);
    const numTiles = Math.ceil(n / 64) - firstTile;
    // Work per query tile in key tiles: dense t + 1; sparse at most the mean row length
    // (an upper bound spread evenly).
    const tileWork = 64 * 64 * D;
    const avgSparse = sparse ? Math.max(1, (sparse.blocks / (H * Nb)) * (B / 64)) : 0;
    const workOf = (t: number) => (sparse ? Math.min(t + 1, avgSparse) : t + 1) * tileWork;
    try {
      // One dispatch: nh heads from h0, query tiles ft .. ft + nt (grid [nh, nt]).
      const launch = (h0: number, nh: number, ft: number, nt: number) => {
        const u = g.uniform([m, n, H, Hkv, B, Nb, sparse ? 0 : 1, h0, ft, nt, lse ? 1 : 0, { f32: scale * LOG2E }]);
        temps.push(u);
        const bufs = [u, qt.buffer, kt.buffer, vt.buffer, out.buffer, lseBuf, sparse?.rowPtr ?? dummy!, sparse?.cols ?? dummy!];
        const enc = g.device.createCommandEncoder();
        g.dispatch(enc, pipe, bufs, [nh, nt]);
        g.submit(enc, temps);
      };
      // Grid [heads, query tiles], heads fastest: the kernels map y = 0 to the heaviest
      // (last) tile, so every head's longest tiles start in the first wave and the tail holds
      // short ones (head-major order left the last heads' long tiles for the end: 24.9 vs
      // 25.9 TFLOP/s at 8k on the H200). Dispatches stay under #maxWork: all query tiles of a
      // group of heads; when one head alone is over the bound, that head's tiles in ranges,
      // heaviest first. (Tile ranges of all heads measured slower at 32k-64k: their jobs are
      // all about as long, so the last wave of each dispatch runs part-empty.)
      let perHead = 0;
      for (let i = 0; i < numTiles; i++) perHead += workOf(firstTile + i);
      if (perHead <= this.#maxWork) {
        const hg = Math.max(1, Math.min(H, Math.floor(this.#maxWork / perHead)));
        for (let h0 = 0; h0 < H; h0 += hg) launch(h0, Math.min(hg, H - h0), firstTile, numTiles);
      } else {
        const ranges: [number, number][] = [];
        let end = firstTile + numTiles;
        while (end > firstTile) {
          let w = 0;
          let start = end;
          while (start > firstTile && (w === 0 || w + workOf(start - 1) <= this.#maxWork)) {
            w += workOf(start - 1);
            start--;
          }
          ranges.push([start, end - start]);
          end = start;
        }
        for (let h = 0; h < H; h++) for (const [ft, nt] of ranges) launch(h, 1, ft, nt);
      }
    } catch (e) {
      if (!opts.out) out.dispose();
      lse?.dispose();
      throw e;
    } finally {
      this.gpu.retire(...temps);
      if (dummy) this.gpu.retire(dummy);
      if (!lse) this.gpu.retire(lseBuf);
    }
    // Surface asynchronous validation errors (bad bindings, OOM) of these dispatches.
    g.check();
    return lse ? { output: out, lse } : { output: out };
  }

  /** Which attention kernel f16 runs use: 'subgroup-matrix' (tensor cores, experimental) or 'fma'. */
  get attentionKernel(): ActiveAttentionKernel {
    return this.gpu.subgroupMatrix ? 'subgroup-matrix' : 'fma';
  }

  /** The program the given attention kernel runs for this dtype and head dim (for build reports). */
  attentionProgramFor(kernel: ActiveAttentionKernel, dtype: StorageDType, D: number): ProgramDescriptor {
    if (kernel === 'subgroup-matrix') return subgroupMatrixAttentionProgram(D);
    return fmaAttentionProgram(dtype, D, this.gpu.compact);
  }

  async #attentionPipeline(dtype: StorageDType, D: number): Promise<GPUComputePipeline> {
    if (dtype === 'f16' && this.gpu.subgroupMatrix) {
      try {
        return await this.gpu.pipeline(subgroupMatrixAttentionProgram(D));
      } catch (e) {
        // An experimental feature: if the driver rejects the program, keep the portable
        // kernel for the rest of this backend's life and say why in kernelNote.
        this.gpu.subgroupMatrix = false;
        this.kernelNote = `subgroup-matrix attention unavailable, using fma: ${e instanceof Error ? e.message : String(e)}`;
      }
    }
    return this.gpu.pipeline(this.attentionProgramFor('fma', dtype, D));
  }

  /** Why the tensor-core kernel is not in use, when it was eligible but failed to build. */
  kernelNote: string | undefined;

  async synchronize(): Promise<void> {
    this.#alive();
    await this.gpu.idle();
  }

  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    this.gpu.destroy();
  }
}
