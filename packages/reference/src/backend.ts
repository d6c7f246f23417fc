/**
 * The reference backend: every primitive of @crisp/core's `Backend` in plain TypeScript on
 * host memory, float64 accumulation. Exact and slow; the oracle every other backend is
 * checked against (see @crisp/conformance).
 *
 * Shape legend: q [m, H, d], k and v [n, Hkv, d], B block size, Nb = ceil(n / B).
 */
import {
  checkOptions,
  assertStatsWindows,
  type AttentionOptions,
  type AttentionResult,
  type AttentionShape,
  type Backend,
  type BackendCapabilities,
  type BlockMask,
  type BlockRows,
  CrispError,
  DeviceTensorBase,
  type DType,
  DTypeError,
  describeValue,
  type DeviceTensor,
  type HostData,
  type HostTensor,
  InvalidArgumentError,
  type MemoryRange,
  assertOutApart,
  LimitError,
  type PeRowsOptions,
  type ProxyStats,
  type ProxyStatsOptions,
  ShapeError,
  assertBlockSize,
  assertDType,
  assertShape,
  checkElementRange,
  assertSupported,
  attentionShape,
  defaultScale,
  encode,
  expandToRows,
  numBlocks,
  numel,
  validateMask,
  wrapHost,
  wantedOptionalStats,
  assertVarlenBatch,
  inSequence,
  packedShape,
  type VarlenAttentionOptions,
  type VarlenBatch,
} from '@crisp/core';
import { attendMany, attendManySliced, type HeadMajor, proxyStatsF64, toHeadMajor } from './math.js';
import { peRowsF64 } from './pooled.js';

export const REFERENCE_BACKEND_NAME = 'reference';

const NAN_BITS: Record<DType, number> = { f32: Number.NaN, f16: 0x7e00, bf16: 0x7fc0 };

/** A "device" tensor of the reference backend: host storage behind the DeviceTensor handle. */
export class ReferenceTensor extends DeviceTensorBase {
  readonly backend = REFERENCE_BACKEND_NAME;
  /** the backend instance that made it (tensors do not cross instances) */
  readonly owner: object;
  #data: HostData | undefined;
  constructor(owner: object, dtype: DType, shape: readonly number[], data: HostData) {
    super(dtype, shape);
    this.owner = owner;
    this.#data = data;
  }
  /** The storage; throws DISPOSED after dispose(). */
  get data(): HostData {
    if (!this.#data) throw disposedError('tensor');
    return this.#data;
  }
  /** The bytes of the ArrayBuffer the storage is a view of (a slice shares its parent's). */
  get memoryRange(): MemoryRange {
    const d = this.data;
    return { resource: d.buffer, start: d.byteOffset, end: d.byteOffset + d.byteLength };
  }
  protected release(): void {
    this.#data = undefined;
  }
}

function disposedError(what: string): CrispError {
  return new CrispError('DISPOSED', `this ${what} was disposed; create a new one (upload again) before using it`);
}

/** How far one denseAttention or sparseAttention call has got. */
export interface ReferenceProgress {
  readonly op: 'dense' | 'sparse';
  /** work done and in all, in keys scanned summed over query rows and heads (0 <= done <= total) */
  readonly done: number;
  readonly total: number;
}

export interface ReferenceBackendOptions {
  /**
   * The pipeline's default length gate. 0: the reference never prefers dense, so plans
   * built through it always exercise the sparse path (it is an oracle, not a fast path).
   */
  readonly sparseCrossover?: number;
  /**
   * Called during each attention call: once at its start (done 0), every `progressEveryMs`
   * of work, and at its end (done = total). Between those calls the backend yields to the
   * event loop, so timers and progress output run during a long pass. Results are the same
   * bits with or without it. Without it, attention runs in one go, as before.
   */
  readonly onProgress?: (p: ReferenceProgress) => void;
  /** ms of work between progress calls (default 100; 0: after every group of query rows) */
  readonly progressEveryMs?: number;
}

const CAPABILITIES: BackendCapabilities = Object.freeze({
  dtypes: Object.freeze(['f32', 'f16', 'bf16'] as DType[]),
  headDims: Object.freeze(Array.from({ length: 16 }, (_, i) => 16 * (i + 1))),
  // 16 and 32 let unit tests use many blocks at small n.
  blockSizes: Object.freeze([16, 32, 64, 128]),
  maxSequence: 65536,
  chunkedPrefill: true,
  logSumExp: true,
});

class ReferenceBackend implements Backend {
  readonly name = REFERENCE_BACKEND_NAME;
  readonly capabilities = CAPABILITIES;
  readonly sparseCrossover: number;
  readonly #onProgress: ReferenceBackendOptions['onProgress'];
  readonly #everyMs: number;
  #disposed = false;

  constructor(opts: ReferenceBackendOptions) {
    if (opts.onProgress !== undefined && typeof opts.onProgress !== 'function') {
      throw new InvalidArgumentError(`createReferenceBackend: onProgress must be a function (or left out); got ${describeValue(opts.onProgress)}`);
    }
    const every = opts.progressEveryMs ?? 100;
    if (typeof every !== 'number' || !Number.isFinite(every) || every < 0) {
      throw new InvalidArgumentError(`createReferenceBackend: progressEveryMs must be a finite number >= 0 (ms); got ${describeValue(every)}`);
    }
    this.#onProgress = opts.onProgress;
    this.#everyMs = every;
    const c = opts.sparseCrossover ?? 0;
    if (typeof c !== 'number' || !Number.isFinite(c) || c < 0) {
      throw new InvalidArgumentError(`createReferenceBackend: sparseCrossover must be a finite number >= 0 (keys); got ${describeValue(c)}`);
    }
    // The reference has no speed to trade: 0 keeps every plan on the sparse path.
    this.sparseCrossover = c;
  }

  #alive(): void {
    if (this.#disposed) throw disposedError('reference backend');
  }

  /** Check ownership and liveness; return the storage. */
  #own(t: DeviceTensor, what: string): ReferenceTensor {
    this.#alive();
    if (!t || typeof t !== 'object') {
      throw new InvalidArgumentError(`${what} is ${describeValue(t)}; pass a tensor this backend's upload() or allocate() returned`);
    }
    if (!(t instanceof ReferenceTensor) || t.owner !== this) {
      if (typeof (t as { backend?: unknown }).backend !== 'string') {
        throw new InvalidArgumentError(`${what} is not a device tensor; upload host tensors first (backend.upload(t))`);
      }
      throw new CrispError(
        'WRONG_BACKEND',
        `${what} belongs to backend '${(t as DeviceTensor).backend}'${t instanceof ReferenceTensor ? ' (another reference backend instance)' : ''}, not to this reference backend; download it and upload it here`,
      );
    }
    if (t.disposed) throw disposedError(`${what} tensor`);
    return t;
  }

  upload(t: HostTensor): DeviceTensor {
    this.#alive();
    if (!t || typeof t !== 'object') throw new InvalidArgumentError('upload needs a host tensor');
    const host = wrapHost(t.dtype, t.shape, t.data);
    return new ReferenceTensor(this, host.dtype, host.shape, host.data.slice());
  }

  allocate(dtype: DType, shape: readonly number[]): DeviceTensor {
    this.#alive();
    assertDType(dtype);
    assertShape(shape as number[]);
    const len = numel(shape);
    if (len > MAX_ELEMENTS) {
      throw new LimitError(`allocate: [${shape}] is ${len} elements; the reference backend holds at most ${MAX_ELEMENTS} per tensor (host memory)`, {
        limit: 'elements',
        max: MAX_ELEMENTS,
      });
    }
    // "Uninitialised" is NaN here, so reading a never-written output is caught at once.
    const data = dtype === 'f32' ? new Float32Array(len) : new Uint16Array(len);
    data.fill(NAN_BITS[dtype]);
    return new ReferenceTensor(this, dtype, shape, data);
  }

  write(t: DeviceTensor, elementOffset: number, data: HostData): void {
    const rt = this.#own(t, 'write target');
    if (!(data instanceof Float32Array) && !(data instanceof Uint16Array)) {
      throw new DTypeError(`write needs a Float32Array (f32) or a Uint16Array of bit patterns (f16, bf16); got ${describeValue(data)}`);
    }
    const store = rt.data;
    if (rt.dtype === 'f32' ? !(data instanceof Float32Array) : !(data instanceof Uint16Array)) {
      throw new DTypeError(
        `write into a ${rt.dtype} tensor needs a ${rt.dtype === 'f32' ? 'Float32Array' : 'Uint16Array of bit patterns'}`,
      );
    }
    if (!Number.isInteger(elementOffset) || elementOffset < 0 || elementOffset + data.length > store.length) {
      throw new InvalidArgumentError(
        `write of ${data.length} elements at offset ${elementOffset} does not fit a tensor of ${store.length} elements`,
      );
    }
    store.set(data as never, elementOffset);
  }

  async download(t: DeviceTensor): Promise<HostTensor> {
    const rt = this.#own(t, 'downloaded');
    return { dtype: rt.dtype, shape: [...rt.shape], data: rt.data.slice() };
  }

  async read(t: DeviceTensor, elementOffset: number, count: number): Promise<HostData> {
    const rt = this.#own(t, 'read source');
    checkElementRange(elementOffset, count, rt.data.length, 'read');
    return rt.data.slice(elementOffset, elementOffset + count);
  }

  #prepare(
    q: DeviceTensor,
    k: DeviceTensor,
    v: DeviceTensor | undefined,
  ): { shape: AttentionShape; qf: HeadMajor; kf: HeadMajor; vf?: HeadMajor } {
    const qt = this.#own(q, 'q');
    const kt = this.#own(k, 'k');
    const vt = v ? this.#own(v, 'v') : undefined;
    const shape = attentionShape(qt, kt, vt ?? kt);
    assertSupported(this.capabilities, shape, this.name);
    return {
      shape,
      qf: toHeadMajor(qt.dtype, qt.shape, qt.data, 'q'),
      kf: toHeadMajor(kt.dtype, kt.shape, kt.data, 'k'),
      vf: vt ? toHeadMajor(vt.dtype, vt.shape, vt.data, 'v') : undefined,
    };
  }

  async proxyStats(q: DeviceTensor, k: DeviceTensor, opts: ProxyStatsOptions): Promise<ProxyStats> {
    if (!opts || typeof opts !== 'object') throw new InvalidArgumentError('proxyStats needs options ({ blockSize, wSink, wLocal })');
    assertBlockSize(opts.blockSize, this.capabilities.blockSizes);
    assertStatsWindows(opts);
    // (checked; the reference computes every statistic whatever is asked for)
    wantedOptionalStats(opts.optionalStats);
    const { shape, qf, kf } = this.#prepare(q, k, undefined);
    return proxyStatsF64(
      { q: qf, k: kf, scale: checkScale(opts.scale, shape.headDim) },
      {
        blockSize: opts.blockSize,
        wSink: opts.wSink,
        wLocal: opts.wLocal,
        scale: checkScale(opts.scale, shape.headDim),
        tokenScores: Boolean(opts.tokenScores),
      },
    );
  }

  async peBlockRows(q: DeviceTensor, k: DeviceTensor, opts: PeRowsOptions): Promise<BlockRows> {
    if (!opts || typeof opts !== 'object') throw new InvalidArgumentError('peBlockRows needs options ({ blockSize, gamma, heads })');
    assertBlockSize(opts.blockSize, this.capabilities.blockSizes);
    if (typeof opts.gamma !== 'number' || !(opts.gamma > 0 && opts.gamma <= 1)) {
      throw new InvalidArgumentError(`gamma must be a number in (0, 1]; got ${String(opts.gamma)}`);
    }
    const { shape, qf, kf } = this.#prepare(q, k, undefined);
    const heads = opts.heads;
    if (!Array.isArray(heads)) throw new InvalidArgumentError('heads must be an array of query head indices');
    for (let i = 0; i < heads.length; i++) {
      const h = heads[i];
      if (!Number.isInteger(h) || h < 0 || h >= shape.heads || (i > 0 && h <= heads[i - 1])) {
        throw new InvalidArgumentError(
          `heads must be strictly increasing integers in [0, ${shape.heads - 1}]; got [${heads.join(', ')}]`,
        );
      }
    }
    return peRowsF64({ q: qf, k: kf, scale: checkScale(opts.scale, shape.headDim) }, opts.blockSize, opts.gamma, heads);
  }

  async expandMask(mask: BlockMask): Promise<BlockRows> {
    this.#alive();
    validateMask(mask);
    assertBlockSize(mask.blockSize, this.capabilities.blockSizes);
    return expandToRows(mask);
  }

  async sparseAttention(
    q: DeviceTensor,
    k: DeviceTensor,
    v: DeviceTensor,
    mask: BlockMask,
    opts: AttentionOptions = {},
  ): Promise<AttentionResult> {
    this.#alive();
    checkOptionsObject(opts, 'sparseAttention');
    opts ??= {};
    const qt = this.#own(q, 'q');
    const kt = this.#own(k, 'k');
    const vt = this.#own(v, 'v');
    const shape = attentionShape(qt, kt, vt);
    assertSupported(this.capabilities, shape, this.name);
    if (!mask || typeof mask !== 'object') throw new InvalidArgumentError('sparseAttention needs a block mask');
    assertBlockSize(mask.blockSize, this.capabilities.blockSizes);
    // (query blocks before the first query row may stay empty in chunked prefill)
    const firstQueryBlock = Math.floor((shape.keys - shape.queries) / mask.blockSize);
    validateMask(mask, { heads: shape.heads, numBlocks: numBlocks(shape.keys, mask.blockSize) }, { firstQueryBlock });
    return this.#attend(q, k, v, expandToRows(mask), mask.blockSize, opts);
  }

  async denseAttention(
    q: DeviceTensor,
    k: DeviceTensor,
    v: DeviceTensor,
    opts: AttentionOptions = {},
  ): Promise<AttentionResult> {
    checkOptionsObject(opts, 'denseAttention');
    return this.#attend(q, k, v, undefined, 128, opts ?? {});
  }

  async #attend(
    q: DeviceTensor,
    k: DeviceTensor,
    v: DeviceTensor,
    rows: BlockRows | undefined,
    B: number,
    opts: AttentionOptions,
  ): Promise<AttentionResult> {
    const { shape, qf, kf, vf } = this.#prepare(q, k, v);
    const { queries: m, heads: H, headDim: d } = shape;
    const scale = checkScale(opts?.scale, d);
    if (opts?.returnLse !== undefined && typeof opts.returnLse !== 'boolean') {
      throw new InvalidArgumentError('returnLse must be a boolean');
    }
    let out: ReferenceTensor | undefined;
    if (opts?.out !== undefined) {
      out = this.#own(opts.out, 'out');
      assertOutApart(out, { q, k, v }, (t) => this.memoryRange(t), { out: 'out' });
      if (out.dtype !== shape.dtype) {
        throw new DTypeError(`out must have q's dtype ${shape.dtype}; got ${out.dtype}`);
      }
      if (out.shape.length !== 3 || out.shape[0] !== m || out.shape[1] !== H || out.shape[2] !== d) {
        throw new ShapeError(`out must have shape [${m}, ${H}, ${d}]; got [${out.shape}]`);
      }
    }
    const all = new Int32Array(m);
    for (let i = 0; i < m; i++) all[i] = i;
    const problem = { q: qf, k: kf, v: vf, scale };
    const report = this.#onProgress;
    const op = rows ? 'sparse' : 'dense';
    const res = report
      ? await attendManySliced(problem, all, rows, B, (done, total) => report({ op, done, total }), this.#everyMs)
      : attendMany(problem, all, rows, B);
    // (a yield may have let someone dispose the backend or the output meanwhile)
    if (report) this.#alive();
    // attendMany's output is already row-major [m, H, d]; round once to q's dtype.
    const encoded = encode(shape.dtype, res.output);
    if (out) this.#own(out, 'out').data.set(encoded as never);
    else out = new ReferenceTensor(this, shape.dtype, [m, H, d], encoded);
    if (!opts?.returnLse) return { output: out };
    const lse = new ReferenceTensor(this, 'f32', [H, m], Float32Array.from(res.lse));
    return { output: out, lse };
  }

  /**
   * Where `t`'s values lie: bytes of the ArrayBuffer behind its storage. A slice
   * (sliceRows) and a ReferenceTensor made over the same buffer overlap its parent.
   */
  memoryRange(t: DeviceTensor): MemoryRange {
    return this.#own(t, 'memoryRange: the tensor').memoryRange;
  }

  /** Rows [start, start + rows) of t: a view sharing t's storage. */
  sliceRows(t: DeviceTensor, start: number, rows: number): DeviceTensor {
    const rt = this.#own(t, 'sliced');
    const [total, ...rest] = rt.shape;
    if (!Number.isSafeInteger(start) || !Number.isSafeInteger(rows) || start < 0 || rows < 1 || start + rows > total) {
      throw new InvalidArgumentError(`sliceRows: rows [${start}, ${start + rows}) do not fit a tensor of ${total} rows`);
    }
    const per = numel(rest);
    return new ReferenceTensor(this, rt.dtype, [rows, ...rest], rt.data.subarray(start * per, (start + rows) * per));
  }

  /**
   * A ragged batch, segment by segment: each one exactly sparseAttention (or
   * denseAttention) on its rows, written into the packed output and LSE.
   */
  async varlenAttention(
    q: DeviceTensor,
    k: DeviceTensor,
    v: DeviceTensor,
    batch: VarlenBatch,
    opts: VarlenAttentionOptions = {},
  ): Promise<AttentionResult> {
    this.#alive();
    checkOptionsObject(opts, 'varlenAttention');
    opts ??= {};
    const qt = this.#own(q, 'q');
    const kt = this.#own(k, 'k');
    const vt = this.#own(v, 'v');
    const shape = packedShape({ q: qt, k: kt, v: vt });
    assertVarlenBatch(batch, shape, this.capabilities.blockSizes);
    const { queries: Mq, heads: H, headDim: d } = shape;
    checkScale(opts.scale, d);
    if (opts.returnLse !== undefined && typeof opts.returnLse !== 'boolean') throw new InvalidArgumentError('returnLse must be a boolean');
    let out: ReferenceTensor | undefined;
    if (opts.out !== undefined) {
      out = this.#own(opts.out, 'out');
      assertOutApart(out, { q: qt, k: kt, v: vt }, (t) => this.memoryRange(t), { out: 'out' });
      if (out.dtype !== shape.dtype) throw new DTypeError(`out must have q's dtype ${shape.dtype}; got ${out.dtype}`);
      if (out.shape.length !== 3 || out.shape[0] !== Mq || out.shape[1] !== H || out.shape[2] !== d) {
        throw new ShapeError(`out must have shape [${Mq}, ${H}, ${d}]; got [${out.shape}]`);
      }
    }
    out ??= this.allocate(shape.dtype, [Mq, H, d]) as ReferenceTensor;
    const lse = opts.returnLse ? new Float32Array(H * Mq).fill(Number.NaN) : undefined;
    const one = { scale: opts.scale, returnLse: opts.returnLse };
    for (let s = 0; s < batch.segments.length; s++) {
      const g = batch.segments[s];
      const qs = this.sliceRows(qt, g.qStart, g.queries);
      const ks = this.sliceRows(kt, g.kStart, g.keys);
      const vs = this.sliceRows(vt, g.kStart, g.keys);
      const mask = batch.masks[s];
      let r: AttentionResult;
      try {
        r = mask ? await this.sparseAttention(qs, ks, vs, mask, one) : await this.denseAttention(qs, ks, vs, one);
      } catch (e) {
        throw inSequence(e, s, g, 'varlenAttention');
      }
      const rowElems = H * d;
      out.data.set((r.output as ReferenceTensor).data as never, g.qStart * rowElems);
      if (lse && r.lse) {
        const part = (r.lse as ReferenceTensor).data as Float32Array;
        for (let h = 0; h < H; h++) lse.set(part.subarray(h * g.queries, (h + 1) * g.queries), h * Mq + g.qStart);
      }
    }
    this.#alive();
    return lse ? { output: out, lse: new ReferenceTensor(this, 'f32', [H, Mq], lse) } : { output: out };
  }

  async synchronize(): Promise<void> {
    this.#alive();
  }

  dispose(): void {
    this.#disposed = true;
  }
}

/** The most elements one tensor holds here (host typed arrays: larger ones fail to allocate in some JS engines). */
const MAX_ELEMENTS = 2 ** 31 - 1;

function checkOptionsObject(opts: unknown, what: string): void {
  if (opts !== undefined && (opts === null || typeof opts !== 'object')) {
    throw new InvalidArgumentError(`${what}: options must be an object (or left out); got ${describeValue(opts)}`);
  }
}

const OPTION_KEYS: readonly string[] = ['sparseCrossover', 'onProgress', 'progressEveryMs'];

function checkScale(scale: number | undefined, d: number): number {
  if (scale === undefined) return defaultScale(d);
  if (typeof scale !== 'number' || !Number.isFinite(scale) || scale <= 0) {
    throw new InvalidArgumentError(`scale must be a positive finite number; got ${String(scale)}`);
  }
  return scale;
}

/** Create a reference backend (name 'reference'). */
export function createReferenceBackend(opts: ReferenceBackendOptions = {}): Backend {
  return new ReferenceBackend(checkOptions(opts, 'createReferenceBackend', OPTION_KEYS));
}
