/**
 * Writers for safetensors and .npy, streamed: a source may yield its data in chunks, so a
 * tensor never has to exist as one JS array. Files are written to a unique temporary file
 * beside the target, flushed, and renamed into place, so a failed write never leaves a
 * half file under the real name, and the old file stays as it was. Only a regular file
 * (or nothing) is ever replaced: a directory, device, FIFO or socket at the target is
 * refused before anything is written. A symlink to a regular file is followed (the file
 * it points to is replaced, the link kept).
 */
import { randomBytes } from 'node:crypto';
import { type Stats, rmSync } from 'node:fs';
import { type FileHandle, chmod, lstat, open, realpath, rename, rm, stat } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import {
  CrispError,
  type DType,
  DTypeError,
  type HostData,
  type HostTensor,
  InvalidArgumentError,
  ShapeError,
  assertDType,
  assertKnownKeys,
  assertShape,
  LimitError,
  bytesPerElement,
  numel,
} from '@crisp/core';
import { assertLittleEndianHost, assertPath, bytesOf, describeValue, ioError, kindOf, writeFully } from './file-handle.js';
import { type Layout, type QkvDims, fileShapeFor, parseLayout } from './layout.js';
import { encodeNpyHeader } from './npy.js';
import { DTYPE_TO_SAFETENSORS, MAX_SAFETENSORS_HEADER } from './safetensors.js';

/** A tensor given as chunks: consecutive row-major pieces that together cover it once. */
export interface TensorSource {
  readonly dtype: DType;
  /** Canonical [n, H, d] when a layout is given; otherwise the shape written as is. */
  readonly shape: readonly number[];
  chunks(): AsyncIterable<HostData> | Iterable<HostData>;
}

/**
 * Integer data beside the float tensors (block indices, routes): int32 ('I32', '<i4') or
 * int8 ('I8', '|i1'), written as is, never through a layout.
 */
export interface IndexTensor {
  readonly dtype: 'i32' | 'i8';
  readonly shape: readonly number[];
  readonly data: Int32Array | Int8Array;
}

export type WritableTensor = HostTensor | TensorSource | IndexTensor;

type AnyDType = DType | IndexTensor['dtype'];

const INDEX_BYTES: Readonly<Record<IndexTensor['dtype'], number>> = { i32: 4, i8: 1 };
const SAFETENSORS_NAME: Readonly<Record<AnyDType, string>> = { ...DTYPE_TO_SAFETENSORS, i32: 'I32', i8: 'I8' };

function isIndex(t: { dtype: unknown }): t is IndexTensor {
  return t.dtype === 'i32' || t.dtype === 'i8';
}

function bytesOfDtype(dtype: AnyDType): number {
  return isIndex({ dtype }) ? INDEX_BYTES[dtype as IndexTensor['dtype']] : bytesPerElement(dtype as DType);
}

/** Whether `data` is the array type a dtype's elements travel in. */
function fitsDtype(dtype: AnyDType, data: unknown): boolean {
  if (dtype === 'i32') return data instanceof Int32Array;
  if (dtype === 'i8') return data instanceof Int8Array;
  return dtype === 'f32' ? data instanceof Float32Array : data instanceof Uint16Array;
}

const ARRAY_NAME: Readonly<Record<AnyDType, string>> = {
  f32: 'Float32Array',
  f16: 'Uint16Array (bit patterns)',
  bf16: 'Uint16Array (bit patterns)',
  i32: 'Int32Array',
  i8: 'Int8Array',
};

export interface WriteOptions {
  /**
   * Store canonical [n, H, d] tensors as 'nhd' [n,H,d], '1nhd' [1,n,H,d] or 'hnd' [H,n,d]
   * ('hnd' transposes while writing; its chunks must hold whole rows). Omit to write every
   * tensor's shape unchanged.
   */
  readonly layout?: Layout | string;
}

const HOST_CHUNK_ELEMENTS = 4 * 1024 * 1024;

function isSource(t: WritableTensor): t is TensorSource {
  return typeof (t as TensorSource).chunks === 'function';
}

/** A source's own failure, told apart from the writer's (its message says whose it was). */
class SourceError extends CrispError {
  constructor(name: string, e: unknown) {
    super(
      'INVALID_ARGUMENT',
      `tensor '${name}': its chunk source threw ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}; nothing was written (fix the source and write again)`,
      { cause: e },
    );
  }
}

async function* chunksOf(name: string, t: WritableTensor): AsyncGenerator<HostData | IndexTensor['data']> {
  if (isSource(t)) {
    let it: AsyncIterator<HostData> | Iterator<HostData>;
    try {
      const src = t.chunks();
      const get = (src as AsyncIterable<HostData>)?.[Symbol.asyncIterator] ?? (src as Iterable<HostData>)?.[Symbol.iterator];
      if (typeof get !== 'function') {
        throw new InvalidArgumentError(`tensor '${name}': chunks() must return an iterable or async iterable of typed arrays; got ${describeValue(src)}`);
      }
      it = get.call(src);
    } catch (e) {
      throw e instanceof CrispError ? e : new SourceError(name, e);
    }
    for (;;) {
      let r: IteratorResult<HostData>;
      try {
        r = await it.next();
      } catch (e) {
        throw e instanceof CrispError ? e : new SourceError(name, e);
      }
      if (r.done) return;
      yield r.value;
    }
  }
  // Views over the host array (no copies), so large tensors go out in bounded writes.
  for (let i = 0; i < t.data.length; i += HOST_CHUNK_ELEMENTS) {
    yield t.data.subarray(i, Math.min(t.data.length, i + HOST_CHUNK_ELEMENTS));
  }
}

interface Planned {
  readonly name: string;
  readonly tensor: WritableTensor;
  readonly fileShape: number[];
  readonly dims: QkvDims | undefined;
  readonly byteLength: number;
}

function planTensor(name: string, t: WritableTensor, layout: Layout | undefined): Planned {
  if (t === null || typeof t !== 'object') {
    throw new InvalidArgumentError(`tensor '${name}' must be a host tensor { dtype, shape, data } or a source { dtype, shape, chunks }; got ${describeValue(t)}`);
  }
  if (!isIndex(t)) assertDType(t.dtype, `tensor '${name}' dtype`);
  assertShape(t.shape as number[], `tensor '${name}' shape`);
  const byteLength = numel(t.shape) * bytesOfDtype(t.dtype);
  if (!Number.isSafeInteger(byteLength)) {
    throw new LimitError(`tensor '${name}' [${t.shape.join(', ')}] has more bytes than a file can address; check the shape`);
  }
  if (!isSource(t)) {
    if (!fitsDtype(t.dtype, t.data)) {
      throw new DTypeError(
        `tensor '${name}' is ${t.dtype} but its data is ${describeValue(t.data)}; give a ${ARRAY_NAME[t.dtype]}${isIndex(t) ? '' : ', or a source with chunks()'}`,
      );
    }
    if (t.data.length !== numel(t.shape)) {
      throw new ShapeError(`tensor '${name}' has shape [${t.shape.join(', ')}] but ${t.data.length} values`);
    }
  }
  if (layout === undefined) return { name, tensor: t, fileShape: [...t.shape], dims: undefined, byteLength };
  if (isIndex(t)) {
    throw new InvalidArgumentError(`tensor '${name}' is ${t.dtype}: a layout applies to [n, H, d] float tensors only; write index tensors in a file without one`);
  }
  if (t.shape.length !== 3) {
    throw new ShapeError(
      `tensor '${name}' has shape [${t.shape.join(', ')}]; with a layout, tensors must be given canonical [n, H, d] (rank 3)`,
    );
  }
  const dims = { n: t.shape[0], H: t.shape[1], d: t.shape[2] };
  return { name, tensor: t, fileShape: fileShapeFor(dims, layout), dims, byteLength };
}

function checkWriteOptions(opts: unknown, known: readonly string[]): void {
  if (opts === null || typeof opts !== 'object' || Array.isArray(opts)) {
    throw new InvalidArgumentError(`options must be an object (${known.join(', ')}); got ${describeValue(opts)}`);
  }
  assertKnownKeys(opts, known, 'options', 'option');
}

/** Writes one tensor's chunks into the region starting at `base`, transposing for 'hnd'. */
async function writeData(
  fh: FileHandle,
  path: string,
  base: number,
  p: Planned,
  layout: Layout | undefined,
): Promise<void> {
  const { dtype } = p.tensor;
  const bpe = bytesOfDtype(dtype);
  const total = numel(p.tensor.shape);
  let at = 0;
  for await (const chunk of chunksOf(p.name, p.tensor)) {
    if (!fitsDtype(dtype, chunk)) throw new DTypeError(`tensor '${p.name}' is ${dtype} but a chunk is ${describeValue(chunk)}`);
    if (at + chunk.length > total) {
      throw new ShapeError(`tensor '${p.name}' [${p.tensor.shape.join(', ')}] holds ${total} values but its chunks yield more`);
    }
    if (layout === 'hnd' && p.dims !== undefined) {
      const { n, H, d } = p.dims;
      const row = H * d;
      if (chunk.length % row !== 0) {
        throw new ShapeError(
          `tensor '${p.name}': a chunk of ${chunk.length} values is not whole rows of H·d = ${row}; layout 'hnd' needs row-aligned chunks`,
        );
      }
      const r0 = at / row;
      const rc = chunk.length / row;
      const src = bpe === 4 ? new Uint32Array(chunk.buffer, chunk.byteOffset, chunk.length) : (chunk as Uint16Array);
      const run = bpe === 4 ? new Uint32Array(rc * d) : new Uint16Array(rc * d);
      for (let h = 0; h < H; h++) {
        for (let r = 0; r < rc; r++) run.set(src.subarray((r * H + h) * d, (r * H + h + 1) * d), r * d);
        await writeFully(fh, bytesOf(run), base + (h * n + r0) * d * bpe, path);
      }
    } else {
      await writeFully(fh, bytesOf(chunk), base + at * bpe, path);
    }
    at += chunk.length;
  }
  if (at !== total) {
    throw new ShapeError(`tensor '${p.name}' [${p.tensor.shape.join(', ')}] holds ${total} values but its chunks yielded ${at}`);
  }
}

/**
 * Where a write to `path` may go: the path itself when nothing is there or a regular file
 * is, the file a symlink points to; anything else is refused with IO_ERROR.
 */
async function writeTarget(path: string): Promise<{ target: string; existing: Stats | undefined }> {
  let st: Stats;
  try {
    st = await lstat(path);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return { target: path, existing: undefined };
    throw ioError(e, 'write', path);
  }
  if (st.isSymbolicLink()) {
    let real: string;
    try {
      real = await realpath(path);
      st = await stat(real);
    } catch (e) {
      throw ioError(e, 'write through the symbolic link', path);
    }
    if (!st.isFile()) throw refuse(path, st);
    return { target: real, existing: st };
  }
  if (!st.isFile()) throw refuse(path, st);
  return { target: path, existing: st };
}

function refuse(path: string, st: Stats): CrispError {
  return new CrispError(
    'IO_ERROR',
    `cannot write ${path}: it is ${kindOf(st)}, and writers replace only regular files; nothing was written: choose a file path`,
    { path, kind: kindOf(st) },
  );
}

/**
 * Temporary files of writes under way. A process that ends mid-write through `process.exit`
 * (a command's Ctrl-C handler, say) runs no `finally`: its 'exit' hook removes them, so no
 * half file is left beside the target.
 */
const partials = new Set<string>();
let exitHook = false;

function trackPartial(tmp: string): void {
  partials.add(tmp);
  if (exitHook) return;
  exitHook = true;
  process.once('exit', () => {
    for (const p of partials) {
      try {
        rmSync(p, { force: true });
      } catch {
        // (exiting: nothing else to do about it)
      }
    }
  });
}

async function writeAtomically(path: string, body: (fh: FileHandle) => Promise<void>): Promise<void> {
  assertLittleEndianHost();
  const { target, existing } = await writeTarget(path);
  // Unique per call (random name, created exclusively) and in the target's directory, so
  // the rename stays on one file system and concurrent writers never share a file.
  const tmp = join(dirname(target), `.${basename(target)}.${process.pid}.${randomBytes(6).toString('hex')}.partial`);
  let fh: FileHandle;
  try {
    fh = await open(tmp, 'wx', 0o666);
  } catch (e) {
    throw ioError(e, 'create a file beside', path);
  }
  trackPartial(tmp);
  let closed = false;
  try {
    await body(fh);
    await fh.sync().catch((e) => {
      throw ioError(e, 'flush', path);
    });
    closed = true;
    await fh.close().catch((e) => {
      throw ioError(e, 'close', path);
    });
    if (existing !== undefined) await chmod(tmp, existing.mode & 0o7777).catch(() => undefined);
    // The target may have changed since the first look: never rename over a non-file.
    const now = await lstat(target).catch(() => undefined);
    if (now !== undefined && !now.isFile()) throw refuse(path, now);
    await rename(tmp, target).catch((e) => {
      throw ioError(e, 'rename into place', path);
    });
  } catch (e) {
    if (!closed) await fh.close().catch(() => undefined);
    await rm(tmp, { force: true }).catch(() => undefined);
    throw e;
  } finally {
    partials.delete(tmp);
  }
}

export interface SafetensorsWriteOptions extends WriteOptions {
  /** Free-form string metadata stored as `__metadata__`. */
  readonly metadata?: Readonly<Record<string, string>>;
}

/**
 * Writes tensors (in the given order) to a safetensors file. The JSON header is padded
 * with spaces to a multiple of 8 bytes so the data section starts aligned.
 */
export async function writeSafetensors(
  path: string,
  tensors: Readonly<Record<string, WritableTensor>>,
  opts: SafetensorsWriteOptions = {},
): Promise<void> {
  assertPath(path);
  checkWriteOptions(opts, ['layout', 'metadata']);
  if (tensors === null || typeof tensors !== 'object' || Array.isArray(tensors)) {
    throw new InvalidArgumentError(`tensors must be an object of name -> tensor, e.g. { q, k, v }; got ${describeValue(tensors)}`);
  }
  const layout = opts.layout === undefined ? undefined : parseLayout(opts.layout);
  const planned = Object.entries(tensors).map(([name, t]) => {
    if (name === '__metadata__' || name.length === 0) {
      throw new InvalidArgumentError(`'${name}' cannot be a tensor name in safetensors`);
    }
    return planTensor(name, t, layout);
  });
  // No prototype: a tensor named '__proto__' must become a key, not the object's prototype.
  const header: Record<string, unknown> = Object.create(null);
  if (opts.metadata !== undefined) {
    if (opts.metadata === null || typeof opts.metadata !== 'object' || Array.isArray(opts.metadata)) {
      throw new InvalidArgumentError(`metadata must be an object of strings; got ${describeValue(opts.metadata)}`);
    }
    for (const [k, v] of Object.entries(opts.metadata)) {
      if (typeof v !== 'string') throw new InvalidArgumentError(`metadata['${k}'] must be a string`);
    }
    header.__metadata__ = opts.metadata;
  }
  let offset = 0;
  for (const p of planned) {
    header[p.name] = {
      dtype: SAFETENSORS_NAME[p.tensor.dtype],
      shape: p.fileShape,
      data_offsets: [offset, offset + p.byteLength],
    };
    offset += p.byteLength;
  }
  let json = new TextEncoder().encode(JSON.stringify(header));
  if (json.length > MAX_SAFETENSORS_HEADER) {
    throw new LimitError(`the safetensors header would be ${json.length} bytes, above the format's 100 MB limit: write fewer tensors or less metadata`);
  }
  const padded = Math.ceil(json.length / 8) * 8;
  if (padded !== json.length) {
    const out = new Uint8Array(padded).fill(0x20);
    out.set(json);
    json = out;
  }
  const prefix = new Uint8Array(8);
  new DataView(prefix.buffer).setBigUint64(0, BigInt(json.length), true);
  await writeAtomically(path, async (fh) => {
    await writeFully(fh, prefix, 0, path);
    await writeFully(fh, json, 8, path);
    let base = 8 + json.length;
    for (const p of planned) {
      await writeData(fh, path, base, p, layout);
      base += p.byteLength;
    }
  });
}

/**
 * Writes one tensor as .npy (format 1.0, C order). f32 -> '<f4', f16 -> '<f2', bf16 ->
 * '<u2' bit patterns (NumPy has no bfloat16; read back with { uint16As: 'bf16' }, or in
 * Python: torch.from_numpy(np.load(p)).view(torch.bfloat16)).
 */
export async function writeNpy(path: string, tensor: WritableTensor, opts: WriteOptions = {}): Promise<void> {
  assertPath(path);
  checkWriteOptions(opts, ['layout']);
  const layout = opts.layout === undefined ? undefined : parseLayout(opts.layout);
  const p = planTensor('array', tensor, layout);
  const descr = { f32: '<f4', f16: '<f2', bf16: '<u2', i32: '<i4', i8: '|i1' }[tensor.dtype];
  const header = encodeNpyHeader(descr, p.fileShape);
  await writeAtomically(path, async (fh) => {
    await writeFully(fh, header, 0, path);
    await writeData(fh, path, header.length, p, layout);
  });
}
