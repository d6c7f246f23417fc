/**
 * Streaming Q/K/V out of an open file, in canonical [n, H, d] row chunks: a tensor far
 * larger than any JS array (a 6 GB dump) reaches a backend through `allocate` + `write`
 * with one chunk in memory at a time.
 *
 * Shape legend: n tokens, H heads, d head dim; a "row" is one token's H·d values.
 */
import {
  type Backend,
  CrispError,
  type DType,
  type DeviceTensor,
  type HostData,
  type HostTensor,
  InvalidArgumentError,
  LimitError,
  UnsupportedError,
  assertDType,
  assertKnownKeys,
  bytesPerElement,
  decode,
  encode,
} from '@crisp/core';
import { totalmem } from 'node:os';
import { describeValue, settleAll } from './file-handle.js';
import { type Layout, type QkvDims, dimsFromFileShape, parseLayout } from './layout.js';
import type { TensorFile, TensorInfo } from './tensor-file.js';

/** Chunks aim at this many bytes unless `chunkRows` says otherwise. */
export const DEFAULT_CHUNK_BYTES = 16 * 1024 * 1024;

/** No chunk (nor a single row) is allowed above this many bytes of host memory. */
export const MAX_CHUNK_BYTES = 1024 ** 3;

/** readTensor's default limit on one whole-tensor array. */
export const DEFAULT_MAX_BYTES = 1024 ** 3;

export interface StreamOptions {
  /** How the file stores the tensor: 'nhd' [n,H,d], '1nhd' [1,n,H,d] or 'hnd' [H,n,d]. */
  readonly layout: Layout | string;
  /** Rows (tokens) per chunk; default: as many as fit in 16 MiB. */
  readonly chunkRows?: number;
  /** Only rows [start, end) (default: all n). */
  readonly rows?: readonly [number, number];
  /** Convert each chunk to this dtype (round to nearest even); default: the file's dtype. */
  readonly dtype?: DType;
  /**
   * Refuse tensors of more tokens than this (LIMIT_EXCEEDED from the header, before any
   * read); pass the backend's `capabilities.maxSequence`.
   */
  readonly maxSequence?: number;
  /** Refuse head dims not in this list (UNSUPPORTED, before any read); pass `capabilities.headDims`. */
  readonly headDims?: readonly number[];
}

const STREAM_KEYS = ['layout', 'chunkRows', 'rows', 'dtype', 'maxSequence', 'headDims'];

/** Checks that `opts` is an object of known keys (a typo is an error, not ignored). */
export function checkOptionKeys(opts: unknown, known: readonly string[], what: string): Record<string, unknown> {
  if (opts === null || typeof opts !== 'object' || Array.isArray(opts)) {
    throw new InvalidArgumentError(`${what} must be an object with at least { layout: 'nhd' | '1nhd' | 'hnd' }; got ${describeValue(opts)}`);
  }
  assertKnownKeys(opts, known, what, 'option');
  return opts as Record<string, unknown>;
}

function assertTensorFile(file: unknown): asserts file is TensorFile {
  const f = file as Partial<TensorFile> | null;
  if (f === null || typeof f !== 'object' || typeof f.tensor !== 'function' || typeof f.read !== 'function') {
    throw new InvalidArgumentError(`file must be an open TensorFile (from openTensorFile, openSafetensors or openNpy); got ${describeValue(file)}`);
  }
}

/** The limit options must be of the right type (a wrong one is never ignored). */
export function checkLimitOptions(opts: Pick<StreamOptions, 'maxSequence' | 'headDims'>): void {
  const { maxSequence, headDims } = opts;
  if (maxSequence !== undefined && (typeof maxSequence !== 'number' || !(maxSequence >= 1))) {
    throw new InvalidArgumentError(`maxSequence must be a positive number of tokens; got ${describeValue(maxSequence)}`);
  }
  if (headDims !== undefined && (!Array.isArray(headDims) || headDims.length === 0 || headDims.some((x) => !Number.isSafeInteger(x)))) {
    throw new InvalidArgumentError(`headDims must be a non-empty array of integers; got ${describeValue(headDims)}`);
  }
}

/** Checks the header-level limits of a tensor (n, head dim) against the caller's backend. */
export function checkLimits(dims: QkvDims, opts: Pick<StreamOptions, 'maxSequence' | 'headDims'>, what: string): void {
  checkLimitOptions(opts);
  const { maxSequence, headDims } = opts;
  if (maxSequence !== undefined) {
    if (dims.n > maxSequence) {
      throw new LimitError(
        `${what} holds n = ${dims.n} tokens, above the limit of ${maxSequence}: use a backend that takes longer sequences, or cut the dump to at most ${maxSequence} tokens`,
        { limit: 'maxSequence', n: dims.n, max: maxSequence },
      );
    }
  }
  if (headDims !== undefined) {
    if (!headDims.includes(dims.d)) {
      throw new UnsupportedError(`${what} has head dim d = ${dims.d}; the backend takes only ${headDims.join(', ')}: check the layout, or use another backend`, {
        limit: 'headDim',
        d: dims.d,
      });
    }
  }
}

/**
 * A host buffer, or LIMIT_EXCEEDED where it cannot be had: above the machine's memory
 * (an allocation the system would only grant lazily, then swap or kill the process
 * for), or refused by the engine.
 */
function allocHost(bytes: number, what: string): ArrayBuffer {
  if (bytes > totalmem()) {
    throw new LimitError(
      `${what}: needs ${bytes} bytes of host memory at once, more than this machine's ${totalmem()}; stream it with streamTensor/uploadTensor instead`,
      { bytes },
    );
  }
  try {
    return new ArrayBuffer(bytes);
  } catch (e) {
    throw new LimitError(`${what}: cannot allocate ${bytes} bytes of host memory (${(e as Error).message}); stream it in smaller chunks`, {
      bytes,
    });
  }
}

export interface TensorChunk {
  /** First token row this chunk holds. */
  readonly rowStart: number;
  readonly rowCount: number;
  /** [rowCount, H, d] row-major, in the output dtype (Uint16Array bits for f16/bf16). */
  readonly data: HostData;
}

export interface StreamPlan {
  readonly info: TensorInfo;
  readonly layout: Layout;
  readonly dims: QkvDims;
  /** The file's dtype. */
  readonly fileDtype: DType;
  /** The dtype chunks come out in. */
  readonly dtype: DType;
  readonly chunkRows: number;
  readonly rowStart: number;
  readonly rowEnd: number;
}

/** Validates a stream request up front, so bad names/layouts/dtypes fail before any read. */
export function planStream(file: TensorFile, name: string | undefined, opts: StreamOptions, known = STREAM_KEYS): StreamPlan {
  assertTensorFile(file);
  checkOptionKeys(opts, known, 'stream options');
  const info = file.tensor(name);
  const layout = parseLayout(opts.layout);
  const where = `${file.path}: tensor '${info.name}'`;
  if (info.dtype === undefined) {
    throw new UnsupportedError(
      `${where} is ${info.fileDtype}; CRISP reads F32, F16 or BF16 for Q/K/V: convert before saving, e.g. x.to(torch.bfloat16) or x.astype(np.float32)`,
      { path: file.path, name: info.name, dtype: info.fileDtype },
    );
  }
  const dims = dimsFromFileShape(info.shape, layout, where);
  checkLimits(dims, opts, where);
  const dtype = opts.dtype ?? info.dtype;
  assertDType(dtype, 'dtype');
  const rowBytes = dims.H * dims.d * Math.max(bytesPerElement(info.dtype), bytesPerElement(dtype));
  if (rowBytes > MAX_CHUNK_BYTES) {
    throw new LimitError(`${where} has rows (H·d = ${dims.H * dims.d} values) of ${rowBytes} bytes, above the ${MAX_CHUNK_BYTES}-byte chunk limit: check the layout`, {
      rowBytes,
    });
  }
  const chunkRows = opts.chunkRows ?? Math.max(1, Math.floor(DEFAULT_CHUNK_BYTES / rowBytes));
  if (!Number.isSafeInteger(chunkRows) || chunkRows < 1) {
    throw new InvalidArgumentError(`chunkRows must be a positive integer; got ${describeValue(opts.chunkRows)}`);
  }
  const rows = opts.rows ?? [0, dims.n];
  if (!Array.isArray(rows) || rows.length !== 2) {
    throw new InvalidArgumentError(`rows must be [start, end); got ${describeValue(opts.rows)}`);
  }
  const [rowStart, rowEnd] = rows;
  if (!Number.isSafeInteger(rowStart) || !Number.isSafeInteger(rowEnd) || rowStart < 0 || rowEnd > dims.n || rowStart > rowEnd) {
    throw new InvalidArgumentError(`rows must be [start, end) with 0 <= start <= end <= n = ${dims.n}; got [${rows}]`);
  }
  if (Math.min(chunkRows, rowEnd - rowStart) * rowBytes > MAX_CHUNK_BYTES) {
    throw new LimitError(
      `chunkRows ${chunkRows} makes chunks of ${chunkRows * rowBytes} bytes, above the ${MAX_CHUNK_BYTES}-byte limit: use at most ${Math.floor(MAX_CHUNK_BYTES / rowBytes)} rows`,
      { chunkRows },
    );
  }
  return { info, layout, dims, fileDtype: info.dtype, dtype, chunkRows, rowStart, rowEnd };
}

function viewAs(dtype: DType, buf: ArrayBuffer): HostData {
  return dtype === 'f32' ? new Float32Array(buf) : new Uint16Array(buf);
}

/** Reads rows [r0, r0 + rc) of a planned tensor as canonical [rc, H, d] in the file dtype. */
async function readRows(file: TensorFile, plan: StreamPlan, r0: number, rc: number): Promise<HostData> {
  const { info, dims, fileDtype } = plan;
  const { n, H, d } = dims;
  const bpe = bytesPerElement(fileDtype);
  const out = allocHost(rc * H * d * bpe, `${file.path}: tensor '${info.name}'`);
  if (plan.layout !== 'hnd') {
    await file.read(new Uint8Array(out), info.byteOffset + r0 * H * d * bpe);
    return viewAs(fileDtype, out);
  }
  // [H, n, d] on disk: one contiguous run of rc·d values per head, interleaved into rows.
  // Copies go through integer views so NaN payloads keep their exact bits.
  const headRun = rc * d;
  const raw = allocHost(H * headRun * bpe, `${file.path}: tensor '${info.name}'`);
  const rawBytes = new Uint8Array(raw);
  await settleAll(
    Array.from({ length: H }, (_, h) =>
      file.read(rawBytes.subarray(h * headRun * bpe, (h + 1) * headRun * bpe), info.byteOffset + (h * n + r0) * d * bpe),
    ),
  );
  const src = bpe === 4 ? new Uint32Array(raw) : new Uint16Array(raw);
  const dst = bpe === 4 ? new Uint32Array(out) : new Uint16Array(out);
  for (let h = 0; h < H; h++) {
    for (let r = 0; r < rc; r++) {
      const s = (h * rc + r) * d;
      dst.set(src.subarray(s, s + d), (r * H + h) * d);
    }
  }
  return viewAs(fileDtype, out);
}

async function* chunksOfPlan(file: TensorFile, plan: StreamPlan): AsyncGenerator<TensorChunk> {
  for (let r0 = plan.rowStart; r0 < plan.rowEnd; r0 += plan.chunkRows) {
    const rc = Math.min(plan.chunkRows, plan.rowEnd - r0);
    let data = await readRows(file, plan, r0, rc);
    if (plan.dtype !== plan.fileDtype) data = encode(plan.dtype, decode(plan.fileDtype, data));
    yield { rowStart: r0, rowCount: rc, data };
  }
}

/**
 * Streams a Q/K/V tensor as canonical [n, H, d] chunks of whole rows. Validation
 * (name, dtype, layout/rank) happens on the call, before the first chunk is read.
 */
export function streamTensor(file: TensorFile, name: string | undefined, opts: StreamOptions): AsyncIterable<TensorChunk> {
  const plan = planStream(file, name, opts);
  return chunksOfPlan(file, plan);
}

/** Reads a whole tensor into one canonical [n, H, d] host tensor (small files). */
export async function readTensor(
  file: TensorFile,
  name: string | undefined,
  opts: StreamOptions & { readonly maxBytes?: number },
): Promise<HostTensor> {
  const plan = planStream(file, name, opts, [...STREAM_KEYS, 'maxBytes']);
  const { H, d } = plan.dims;
  const rows = plan.rowEnd - plan.rowStart;
  const bytes = rows * H * d * bytesPerElement(plan.dtype);
  const maxBytes = opts.maxBytes ?? DEFAULT_MAX_BYTES;
  if (typeof maxBytes !== 'number' || !(maxBytes >= 0)) {
    throw new InvalidArgumentError(`maxBytes must be a non-negative number of bytes; got ${describeValue(opts.maxBytes)}`);
  }
  if (bytes > maxBytes) {
    throw new LimitError(
      `${file.path}: tensor '${plan.info.name}' is ${bytes} bytes as one array, above maxBytes ${maxBytes}; stream it with streamTensor/uploadTensor instead`,
      { bytes, maxBytes },
    );
  }
  const buf = allocHost(bytes, `${file.path}: tensor '${plan.info.name}'`);
  const data = plan.dtype === 'f32' ? new Float32Array(buf) : new Uint16Array(buf);
  for await (const c of chunksOfPlan(file, plan)) {
    data.set(c.data as never, (c.rowStart - plan.rowStart) * H * d);
  }
  return { dtype: plan.dtype, shape: [rows, H, d], data: data as HostData };
}

export interface UploadOptions extends StreamOptions {
  /** Called after each chunk with rows written so far and the total (progress bars). */
  readonly onProgress?: (rowsDone: number, rowsTotal: number) => void;
}

/**
 * Streams a tensor from a file onto a backend: `allocate` once, then one `write` per
 * chunk at its flat element offset. Only one chunk is in host memory at a time. On any
 * error the device tensor is disposed and the error rethrown.
 */
export async function uploadTensor(
  backend: Pick<Backend, 'allocate' | 'write'>,
  file: TensorFile,
  name: string | undefined,
  opts: UploadOptions,
): Promise<DeviceTensor> {
  const b = backend as Partial<Backend> | null;
  if (b === null || typeof b !== 'object' || typeof b.allocate !== 'function' || typeof b.write !== 'function') {
    throw new InvalidArgumentError(`backend must be a CRISP backend (with allocate and write); got ${describeValue(backend)}`);
  }
  const plan = planStream(file, name, opts, [...STREAM_KEYS, 'onProgress']);
  if (opts.onProgress !== undefined && typeof opts.onProgress !== 'function') {
    throw new InvalidArgumentError(`onProgress must be a function; got ${describeValue(opts.onProgress)}`);
  }
  const { H, d } = plan.dims;
  const rows = plan.rowEnd - plan.rowStart;
  const failed = (e: unknown) =>
    e instanceof CrispError
      ? e
      : new CrispError('BACKEND_ERROR', `uploading '${plan.info.name}' from ${file.path} failed: ${String(e)}`, { cause: e });
  let t: DeviceTensor;
  try {
    t = backend.allocate(plan.dtype, [rows, H, d]);
  } catch (e) {
    throw failed(e);
  }
  try {
    for await (const c of chunksOfPlan(file, plan)) {
      backend.write(t, (c.rowStart - plan.rowStart) * H * d, c.data);
      opts.onProgress?.(c.rowStart - plan.rowStart + c.rowCount, rows);
    }
  } catch (e) {
    try {
      t.dispose();
    } catch {
      // the upload's own error is the one to report
    }
    throw failed(e);
  }
  return t;
}

/** A writer source that streams a tensor out of an open file (for format/layout conversion). */
export function tensorSource(file: TensorFile, name: string | undefined, opts: StreamOptions) {
  const plan = planStream(file, name, opts);
  const rows = plan.rowEnd - plan.rowStart;
  return {
    dtype: plan.dtype,
    shape: [rows, plan.dims.H, plan.dims.d] as const,
    async *chunks(): AsyncGenerator<HostData> {
      for await (const c of chunksOfPlan(file, plan)) yield c.data;
    },
  };
}
