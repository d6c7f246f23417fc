/**
 * The CUDA backend: core's Backend over the runtime (src/runtime: the device, launches,
 * streams, memory, tracing) and the operations (src/ops: one file per primitive; src/plan:
 * the device planner). Shape legend: q [n, H, d], k and v [n, Hkv, d], B block size (64 or
 * 128), Nb = ceil(n / B), b = min(B, n) proxy rows.
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
  type DeviceMark,
  type DevicePlanner,
  type DeviceTensor,
  type HostData,
  type HostTensor,
  InvalidArgumentError,
  type MemoryRange,
  type PeRowsOptions,
  type ProxyStats,
  type ProxyStatsOptions,
  ShapeError,
  assertDType,
  assertShape,
  bytesPerElement,
  checkElementRange,
  checkOptions,
  describeValue,
  numel,
  type VarlenAttentionOptions,
  type VarlenBatch,
} from '@crisp/core';
import { ATTENTION_VARIANTS, AttentionOp, type AttentionVariant, defaultAttentionVariant } from './ops/attention.js';
import { expandMask } from './ops/expand.js';
import { deviceSleep, fillHash, fillLlamaLike, poison, relError } from './ops/fill.js';
import { peBlockRows } from './ops/pe-rows.js';
import { sliceRows, varlenAttention } from './ops/varlen.js';
import { PROXY_LAYOUTS, type ProxyLayout, ProxyStatsOp, defaultProxyLayout } from './ops/proxy-stats.js';
import { CudaDevicePlanner } from './plan/planner.js';
import { defaultCacheDir } from './runtime/compile.js';
import { CUDA_CAPABILITIES, type CudaDeviceInfo, type CudaSchedule, CudaContext } from './runtime/context.js';
import type { CudaFaults } from './faults.js';
import { type CudaLibs, check, loadCuda } from './runtime/ffi.js';
import { KeptStats } from './runtime/kept-stats.js';
import type { Handle } from './runtime/ffi.js';
import type { TraceEntry } from './runtime/trace.js';
import type { CudaTensor } from './runtime/tensor.js';

export interface CudaBackendOptions {
  /** CUDA device ordinal (default 0) */
  readonly device?: number;
  /** where compiled cubins are cached; null disables the cache (default ~/.cache/crisp/cuda) */
  readonly cacheDir?: string | null;
  /**
   * folder to compile the .cu sources from (default: the package's kernels/ as embedded in the
   * build, which an application bundle carries; set it to try edited kernels)
   */
  readonly kernelDir?: string;
  /** override the measured sparse/dense crossover (keys) */
  readonly sparseCrossover?: number;
  /** check q, k, v for NaN/Inf before each primitive (default true; one extra read of each) */
  readonly checkFinite?: boolean;
  /**
   * which attention kernel layout to launch (default: defaultAttentionVariant of the GPU:
   * `wgt` on Hopper, `w32` elsewhere); see ATTENTION_VARIANTS
   */
  readonly attentionVariant?: AttentionVariant;
  /** proxy statistics kernel layout (default: defaultProxyLayout(the GPU's compute capability)); see PROXY_LAYOUTS */
  readonly proxyLayout?: ProxyLayout;
  /**
   * block-level proxy statistics (no token scores asked for) in one pass over the keys
   * (default true); false runs the two-pass form (pass 1, then pass 2b). Same statistics up
   * to f32 rounding.
   */
  readonly proxyFused?: boolean;
  /**
   * How the host thread waits for the GPU in a synchronising call (the device's primary
   * context's scheduling flags, CU_CTX_SCHED_*): `auto` (default) leaves the flags as they
   * are (the driver's heuristic, or what another library in the process set); `spin` keeps the
   * thread polling, so a following call starts with a warm thread and driver; `yield` and
   * `blocking` give the CPU back while waiting. The flags are the primary context's, shared
   * with every user of it in the process, hence not changed unless asked. On the H200 after a
   * 30 ms synchronize, an event record and a launch took 5.7 and 11.6 us with `spin`, 32 and
   * 59 us with the driver's default, 45 and 67 us with `blocking`: from an idle device that
   * host time is part of a prefill's plan; a whole 128k prefill's plan measured 0.02-0.03 ms
   * slower with `spin` than with the default, so `auto` stays the default. A driver that refuses to change the flags (older ones while
   * the context is active elsewhere in the process) leaves them as they were.
   */
  readonly schedule?: CudaSchedule;
  /**
   * Launch the device plan's small kernels after the proxy pass (PDL_KERNELS) with
   * programmatic stream serialisation (default true; used on compute capability 9.0 and
   * later with a driver that has cuLaunchKernelEx, else off). Each of them may then be
   * scheduled while the kernel before it finishes, and waits on the device (griddepcontrol)
   * for that kernel's end before it reads anything: the same order and results, less time
   * between the kernels. False launches every kernel with cuLaunchKernel.
   */
  readonly programmaticLaunch?: boolean;
  /**
   * FlexPrefill's rules (the jsd router and the cumulativeCoverage selector, route_residual
   * over every block and coverage_select) in the device planner, so that `flexPrefill`'s plan
   * is device work like `crisp`'s (default true; false makes its plan on the host, reading the
   * token scores back). Checked by the conformance cases `devicePlanCoverage` and
   * `pipeline/flexPrefill*` on the GPU.
   */
  readonly flexPrefillOnDevice?: boolean;
  /**
   * The narrowed lists of PE heads (Policy.peVsExcess and peVsFullAnchor, which
   * `crispGuarded` sets) in the device planner's selection (select.cu's vs_select), so that
   * `crispGuarded`'s plan stays device work (default true: the conformance cases
   * `devicePlanNarrowed`, `devicePlanGuarded` and `pipeline/crispGuarded*` pass on an H100,
   * bf16 and f16). False makes such plans on the host (correct, and slower: the host reads the
   * statistics back and selects there).
   */
  readonly peVsExcessOnDevice?: boolean;
  /**
   * Testing: a fault injector between the backend and the driver (CudaFaults: failed
   * allocations and launches, a faulted context), for checking what the backend does under
   * each fault. Leave unset in production.
   */
  readonly faults?: CudaFaults;
}

/**
 * The length gate, measured by crisp-bench on one H200 (2026-11-30, commit 8e4bb9e: wgw
 * attention, the fused wg proxy pass, device selection;
 * apps/bench/results/nvidia-h200-synth/bench.md): CRISP end to end (statistics, routing,
 * selection, mask, sparse kernel) against the dense kernel on the @crisp/synth llama-like
 * layer (H = 32, Hkv = 8, d = 128, bf16): 1.28 vs 1.62 ms at 8k (CRISP 1.27x), 1.79 vs 5.62
 * ms at 16k. CRISP wins at the smallest size measured, so the crossover is at or below 8,192
 * keys; the gate stays there (not measured below).
 */
export const CUDA_SPARSE_CROSSOVER = 8192;

export class CudaBackend implements Backend {
  readonly name = 'cuda';
  readonly capabilities: BackendCapabilities = CUDA_CAPABILITIES;
  readonly sparseCrossover: number;
  readonly info: CudaDeviceInfo;
  /** The plan on the device (kernels/route, select, pe, mask): core's DevicePlanner. */
  readonly planner: DevicePlanner;
  readonly #cx: CudaContext;
  readonly #kept: KeptStats;
  readonly #proxy: ProxyStatsOp;
  readonly #attention: AttentionOp;

  static #checkVariant(v: string): AttentionVariant {
    if (!Object.hasOwn(ATTENTION_VARIANTS, v)) {
      throw new InvalidArgumentError(`attentionVariant must be one of ${Object.keys(ATTENTION_VARIANTS).join(', ')}; got ${v}`);
    }
    return v as AttentionVariant;
  }

  constructor(libs: CudaLibs, opts: CudaBackendOptions = {}) {
    checkCudaOptions(opts);
    const driver = opts.faults ? opts.faults.wrap(libs) : libs;
    const cx = new CudaContext(driver, opts, opts.cacheDir === undefined ? defaultCacheDir() : opts.cacheDir);
    this.#cx = cx;
    this.info = cx.info;
    this.sparseCrossover = opts.sparseCrossover ?? CUDA_SPARSE_CROSSOVER;
    const cc = cx.info.computeCapability;
    const variant = CudaBackend.#checkVariant(opts.attentionVariant ?? defaultAttentionVariant(cc));
    const layout = opts.proxyLayout ?? defaultProxyLayout(cc);
    if (!Object.hasOwn(PROXY_LAYOUTS, layout)) {
      throw new InvalidArgumentError(`proxyLayout must be one of ${Object.keys(PROXY_LAYOUTS).join(', ')}; got ${layout}`);
    }
    this.#kept = new KeptStats(cx);
    this.#proxy = new ProxyStatsOp(cx, this.#kept, layout, opts.proxyFused ?? true);
    this.#attention = new AttentionOp(cx, this.#kept, variant);
    this.planner = new CudaDevicePlanner(cx, this.#kept, opts.flexPrefillOnDevice !== false, opts.peVsExcessOnDevice !== false);
  }

  get attentionVariant(): AttentionVariant {
    return this.#attention.variant;
  }
  /**
   * Why the selected variant is not the one launched (undefined when it is): the Hopper
   * variant needs compute capability 9.0 (wgmma is an sm_90a feature, absent from
   * Ampere/Ada and not carried forward to later architectures); elsewhere `w32` runs.
   */
  get attentionVariantFallback(): string | undefined {
    return this.#attention.fallback;
  }
  /** Switch the attention kernel layout (benchmarks compare them on one context). */
  set attentionVariant(v: AttentionVariant) {
    this.#attention.variant = CudaBackend.#checkVariant(v);
  }
  /** the proxy statistics kernel layout (a tuning knob, like the attention variant) */
  get proxyLayout(): ProxyLayout {
    return this.#proxy.proxyLayout;
  }
  set proxyLayout(v: ProxyLayout) {
    this.#proxy.proxyLayout = v;
  }
  /** block-level proxy statistics in one pass (a tuning knob; CudaBackendOptions.proxyFused) */
  get proxyFused(): boolean {
    return this.#proxy.proxyFused;
  }
  set proxyFused(v: boolean) {
    this.#proxy.proxyFused = v;
  }
  /** milliseconds spent compiling or loading modules, by file (under kernels/) */
  get compileMs(): Record<string, { ms: number; cached: boolean }> {
    return this.#cx.launcher.compileMs;
  }
  /** whether the plan's small kernels are launched programmatically (CudaBackendOptions.programmaticLaunch) */
  get programmaticLaunch(): boolean {
    return this.#cx.launcher.programmatic;
  }

  /**
   * Kernel profiling: while on, every launch is bracketed by events and waited for, and its
   * kernel time on the device is added to a per-kernel total (this serialises the stream: use it to see
   * where time goes, never while timing). `stopProfile` returns the totals, largest first.
   */
  startProfile(): void {
    this.#cx.alive();
    this.#cx.tracer.startProfile(() => this.#cx.streams.newEvent(0) as Handle);
  }

  stopProfile(): { kernel: string; calls: number; ms: number }[] {
    return this.#cx.tracer.stopProfile();
  }

  /**
   * A timeline of the launches without serialising them (unlike startProfile): an event on
   * the stream before and after each kernel, the host's clock at each launch and around each
   * synchronous read. `stopTrace` waits for the stream and returns, per entry, the host time
   * and the device-side start and end relative to the first launch's start event: where the GPU waited
   * for the host (a start event well after the previous end) and where the host waited for
   * the GPU (a read). For finding gaps, not for timing (the events add a little work).
   */
  startTrace(maxLaunches = 256): void {
    this.#cx.alive();
    this.#cx.tracer.startTrace(maxLaunches, () => this.#cx.streams.newEvent(0) as Handle);
  }

  stopTrace(): TraceEntry[] {
    return this.#cx.tracer.stopTrace(() => this.#cx.streams.synchronizeAll());
  }

  // ---- tensors ----------------------------------------------------------------------

  allocate(dtype: DType, shape: readonly number[]): DeviceTensor {
    this.#cx.alive();
    assertDType(dtype);
    assertShape(shape as number[]);
    const bytes = numel(shape) * bytesPerElement(dtype);
    return this.#cx.allocate(dtype, shape, bytes);
  }

  upload(t: HostTensor): DeviceTensor {
    this.#cx.alive();
    if (!t || typeof t !== 'object') throw new InvalidArgumentError(`upload takes a host tensor { dtype, shape, data }; got ${t === null ? 'null' : typeof t}`);
    assertDType(t.dtype);
    assertShape(t.shape as number[]);
    if (numel(t.shape) !== t.data.length) {
      throw new ShapeError(`shape [${t.shape}] holds ${numel(t.shape)} values but data has ${t.data.length}`);
    }
    const d = this.allocate(t.dtype, t.shape) as CudaTensor;
    this.write(d, 0, t.data);
    return d;
  }

  write(t: DeviceTensor, elementOffset: number, data: HostData): void {
    this.#cx.alive();
    const ct = this.#cx.tensor(t, 'write target');
    const bpe = bytesPerElement(ct.dtype);
    // exactly the array type whose elements are the dtype's bytes (a Float64Array or an
    // Int16Array would be copied as other bytes)
    if (!(ct.dtype === 'f32' ? data instanceof Float32Array : data instanceof Uint16Array)) {
      const got = data === null || typeof data !== 'object' ? String(data) : (data as object).constructor?.name;
      throw new CrispError(
        'DTYPE_MISMATCH',
        `a ${ct.dtype} tensor needs ${ct.dtype === 'f32' ? 'Float32Array' : 'Uint16Array (the bit patterns; hostTensor encodes numbers)'} data; got ${got}`,
      );
    }
    if (!Number.isInteger(elementOffset) || elementOffset < 0 || elementOffset + data.length > numel(ct.shape)) {
      throw new InvalidArgumentError(
        `write of ${data.length} elements at offset ${elementOffset} overruns a tensor of ${numel(ct.shape)} elements`,
      );
    }
    if (data.length === 0) return;
    ct.markWritten();
    check(
      this.#cx.libs,
      this.#cx.libs.cu.cuMemcpyHtoD(ct.ptr + elementOffset * bpe, data, data.length * bpe),
      'cuMemcpyHtoD',
    );
  }

  async download(t: DeviceTensor): Promise<HostTensor> {
    this.#cx.alive();
    const ct = this.#cx.tensor(t, 'download source');
    const n = numel(ct.shape);
    const data = ct.dtype === 'f32' ? new Float32Array(n) : new Uint16Array(n);
    this.#cx.read(ct.ptr, data);
    return { dtype: ct.dtype, shape: [...ct.shape], data };
  }

  async read(t: DeviceTensor, elementOffset: number, count: number): Promise<HostData> {
    this.#cx.alive();
    const ct = this.#cx.tensor(t, 'read source');
    checkElementRange(elementOffset, count, numel(ct.shape), 'read');
    const data = ct.dtype === 'f32' ? new Float32Array(count) : new Uint16Array(count);
    // (device addresses and byte offsets in Numbers: exact to 2^53, so past 2^32 elements too)
    this.#cx.read(ct.ptr + elementOffset * bytesPerElement(ct.dtype), data);
    return data;
  }

  // ---- primitives -------------------------------------------------------------------

  async proxyStats(q: DeviceTensor, k: DeviceTensor, opts: ProxyStatsOptions): Promise<ProxyStats> {
    return this.#proxy.run(q, k, opts);
  }

  async peBlockRows(q: DeviceTensor, k: DeviceTensor, opts: PeRowsOptions): Promise<BlockRows> {
    return peBlockRows(this.#cx, this.#kept, q, k, opts);
  }

  async expandMask(mask: BlockMask): Promise<BlockRows> {
    return expandMask(this.#cx, mask);
  }

  async sparseAttention(q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, mask: BlockMask, opts: AttentionOptions = {}): Promise<AttentionResult> {
    return this.#attention.sparse(q, k, v, mask, opts);
  }

  async denseAttention(q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, opts: AttentionOptions = {}): Promise<AttentionResult> {
    return this.#attention.dense(q, k, v, opts);
  }
  /**
   * Where `t`'s bytes lie: [ptr, ptr + bytes) of this backend's device memory. A row slice
   * (sliceRows) overlaps its parent; the pipeline uses it to refuse an `out` over an input's
   * memory.
   */
  memoryRange(t: DeviceTensor): MemoryRange {
    this.#cx.alive();
    return this.#cx.tensor(t, 'memoryRange: the tensor').memoryRange;
  }

  /** Rows [start, start + rows) of t along its first axis, sharing its memory (no copy). */
  sliceRows(t: DeviceTensor, start: number, rows: number): DeviceTensor {
    return sliceRows(this.#cx, t, start, rows);
  }

  /** A ragged batch's attention in one launch (see @crisp/core's varlenPrefill). */
  async varlenAttention(q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, batch: VarlenBatch, opts: VarlenAttentionOptions = {}): Promise<AttentionResult> {
    return varlenAttention(this.#cx, this.#attention, q, k, v, batch, opts);
  }


  // ---- marks on the device's timeline ---------------------------------------------

  /**
   * A point on the device's timeline behind the work queued so far (a timing event; 64 in
   * turn, so a mark is good for the next 64). msSince needs both marks reached (synchronize).
   */
  mark(): DeviceMark {
    this.#cx.alive();
    return this.#cx.streams.mark();
  }

  async synchronize(): Promise<void> {
    this.#cx.alive();
    this.#cx.streams.synchronize();
  }

  dispose(): void {
    this.#cx.dispose(() => this.#kept.releaseRetained(true));
  }

  // ---- tools for benchmarks and tests (not part of Backend) -------------------------

  /** Fill a bf16/f16 tensor with crisp_hash values (the formula the PyTorch peer shares). */
  fillHash(t: DeviceTensor, seed: number, amplitude: number): void {
    fillHash(this.#cx, t, seed, amplitude);
  }

  /** Fill q, k, v with the llama-like structured layer of kernels/fill/fill.cu. */
  fillLlamaLike(q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, seed: number, slash0 = 1000, vEvery = 4096): void {
    fillLlamaLike(this.#cx, q, k, v, seed, slash0, vEvery);
  }

  /**
   * Keep the device's main stream busy for `ms` milliseconds (one thread spinning on the global
   * timer). Queued before a timed call, it lets the host get ahead, so device marks around the
   * call measure the device's critical path without the host's launch time (a benchmark tool).
   */
  deviceSleep(ms: number): void {
    deviceSleep(this.#cx, ms);
  }

  /** Overwrite a tensor with NaN so unwritten outputs show. */
  poison(t: DeviceTensor): void {
    poison(this.#cx, t);
  }

  /** ‖a − b‖ / ‖b‖ in f64 over two same-shape bf16/f16 tensors, and a's non-finite count. */
  relError(a: DeviceTensor, b: DeviceTensor): { relErr: number; nonFinite: number; refNorm: number } {
    return relError(this.#cx, a, b);
  }

  /** Time device work on this backend's stream with CUDA events (milliseconds). */
  async timeMs(run: () => unknown | Promise<unknown>): Promise<number> {
    this.#cx.alive();
    const cu = this.#cx.libs.cu;
    const a = this.#cx.streams.newEvent(0);
    const b = this.#cx.streams.newEvent(0);
    try {
      check(this.#cx.libs, cu.cuEventRecord(a, this.#cx.streams.main), 'cuEventRecord');
      await run();
      check(this.#cx.libs, cu.cuEventRecord(b, this.#cx.streams.main), 'cuEventRecord');
      check(this.#cx.libs, cu.cuEventSynchronize(b), 'cuEventSynchronize');
      const ms = [0];
      check(this.#cx.libs, cu.cuEventElapsedTime(ms, a, b), 'cuEventElapsedTime');
      return ms[0];
    } finally {
      cu.cuEventDestroy(a);
      cu.cuEventDestroy(b);
    }
  }

  /** Copy the listed rows (first axis) of a tensor to the host, in that order. */
  readRows(t: DeviceTensor, rows: Int32Array): HostTensor {
    this.#cx.alive();
    const ct = this.#cx.tensor(t, 'readRows source');
    const rowElems = numel(ct.shape.slice(1));
    const bpe = bytesPerElement(ct.dtype);
    const data = ct.dtype === 'f32' ? new Float32Array(rows.length * rowElems) : new Uint16Array(rows.length * rowElems);
    for (let i = 0; i < rows.length; i++) {
      const r = rows[i];
      if (!(r >= 0 && r < ct.shape[0])) throw new InvalidArgumentError(`row ${r} is outside [0, ${ct.shape[0]})`);
      const view = data.subarray(i * rowElems, (i + 1) * rowElems);
      check(this.#cx.libs, this.#cx.libs.cu.cuMemcpyDtoH(view, ct.ptr + r * rowElems * bpe, rowElems * bpe), 'cuMemcpyDtoH');
    }
    return { dtype: ct.dtype, shape: [rows.length, ...ct.shape.slice(1)], data };
  }

  /** Device memory: free and total bytes (cuMemGetInfo), and the bytes this backend's pool keeps for reuse. */
  memoryInfo(): { free: number; total: number; pooled: number } {
    this.#cx.alive();
    const f = [0];
    const t = [0];
    check(this.#cx.libs, this.#cx.libs.cu.cuMemGetInfo(f, t), 'cuMemGetInfo');
    return { free: Number(f[0]), total: Number(t[0]), pooled: this.#cx.pool.pooledBytes };
  }

  /**
   * The memory pool's counters: bytes held by live tensors and buffers (`liveBytes`), bytes
   * kept for reuse (`pooledBytes`), allocations the pool could not serve (`misses`, each a
   * cuMemAlloc), and statistics whose block scores the backend keeps on the device (`keptStats`).
   */
  poolStats(): { liveBytes: number; pooledBytes: number; misses: number; keptStats: number } {
    const pool = this.#cx.pool;
    return { liveBytes: pool.liveBytes, pooledBytes: pool.pooledBytes, misses: pool.misses, keptStats: this.#kept.entries.length };
  }

  /**
   * Give back what the backend keeps between calls: the statistics it holds on the device
   * (their objects get their values first) and every pooled block (to the driver). Live
   * tensors stay. After it, `poolStats().liveBytes` is the bytes of the live tensors alone.
   */
  trimMemory(): void {
    this.#cx.alive();
    this.#cx.streams.synchronizeAll();
    this.#kept.releaseRetained(true);
    this.#cx.pool.trim();
  }
}

/**
 * The options' kinds and values that need no device, checked before the driver is loaded (so
 * a misspelt or mistyped option is reported as such, also where CUDA is missing);
 * INVALID_ARGUMENT. The device ordinal's range and the variants a GPU can run are checked
 * once the device is open.
 */
function checkCudaOptions(opts: CudaBackendOptions): void {
  checkOptions(opts, 'createCudaBackend', CUDA_OPTION_KEYS);
  if (opts.device !== undefined && !(Number.isInteger(opts.device) && opts.device >= 0)) {
    throw new InvalidArgumentError(`device must be a CUDA device ordinal (an integer >= 0); got ${describeValue(opts.device)}`);
  }
  if (opts.sparseCrossover !== undefined && !(Number.isFinite(opts.sparseCrossover) && opts.sparseCrossover >= 0)) {
    throw new InvalidArgumentError(`sparseCrossover must be a finite number of keys >= 0; got ${opts.sparseCrossover}`);
  }
  for (const key of ['flexPrefillOnDevice', 'peVsExcessOnDevice', 'checkFinite', 'proxyFused', 'programmaticLaunch'] as const) {
    if (opts[key] !== undefined && typeof opts[key] !== 'boolean') throw new InvalidArgumentError(`${key} must be true or false; got ${String(opts[key])}`);
  }
  for (const key of ['cacheDir', 'kernelDir'] as const) {
    const v = opts[key];
    if (v !== undefined && !(typeof v === 'string' || (key === 'cacheDir' && v === null))) {
      throw new InvalidArgumentError(`${key} must be a folder path${key === 'cacheDir' ? ' or null' : ''}; got ${describeValue(v)}`);
    }
  }
}

const CUDA_OPTION_KEYS = [
  'device',
  'cacheDir',
  'kernelDir',
  'sparseCrossover',
  'checkFinite',
  'attentionVariant',
  'proxyLayout',
  'proxyFused',
  'schedule',
  'programmaticLaunch',
  'flexPrefillOnDevice',
  'peVsExcessOnDevice',
  'faults',
];

/** Create the CUDA backend (compiles kernels lazily on first use, cached on disk). */
export async function createCudaBackend(opts: CudaBackendOptions = {}): Promise<CudaBackend> {
  checkCudaOptions(opts);
  const libs = loadCuda();
  return new CudaBackend(libs, opts);
}
