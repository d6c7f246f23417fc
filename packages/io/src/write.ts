/**
 * Writers for safetensors and .npy, streamed: a source may yield its data in chunks, so a
 * tensor never has to exist as one JS array. Files are written to a temporary name and
 * renamed into place, so a failed write never leaves a half file under the real name.
 */
import { open, rename, rm } from 'node:fs/promises';
import {
  type DType,
  DTypeError,
  type HostData,
  type HostTensor,
  InvalidArgumentError,
  ShapeError,
  assertDType,
  assertShape,
  bytesPerElement,
  numel,
} from '@crisp/core';
import { assertLittleEndianHost, bytesOf, ioError, writeFully } from './file-handle.js';
import { type Layout, type QkvDims, fileShapeFor, parseLayout } from './layout.js';
import { encodeNpyHeader } from './npy.js';
import { DTYPE_TO_SAFETENSORS } from './safetensors.js';

/** A tensor given as chunks: consecutive row-major pieces that together cover it once. */
export interface TensorSource {
  readonly dtype: DType;
  /** Canonical [n, H, d] when a layout is given; otherwise the shape written as is. */
  readonly shape: readonly number[];
  chunks(): AsyncIterable<HostData> | Iterable<HostData>;
}

export type WritableTensor = HostTensor | TensorSource;

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

async function* chunksOf(t: WritableTensor): AsyncGenerator<HostData> {
  if (isSource(t)) {
    yield* t.chunks();
    return;
  }
  // Views over the host array (no copies), so large tensors go out in bounded writes.
  for (let i = 0; i < t.data.length; i += HOST_CHUNK_ELEMENTS) {
    yield t.data.subarray(i, Math.min(t.data.length, i + HOST_CHUNK_ELEMENTS)) as HostData;
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
  assertDType(t.dtype, `tensor '${name}' dtype`);
  assertShape(t.shape as number[], `tensor '${name}' shape`);
  const byteLength = numel(t.shape) * bytesPerElement(t.dtype);
  if (!isSource(t)) {
    const ok = t.dtype === 'f32' ? t.data instanceof Float32Array : t.data instanceof Uint16Array;
    if (!ok) throw new DTypeError(`tensor '${name}' is ${t.dtype} but its data is a ${t.data.constructor.name}`);
    if (t.data.length !== numel(t.shape)) {
      throw new ShapeError(`tensor '${name}' has shape [${t.shape.join(', ')}] but ${t.data.length} values`);
    }
  }
  if (layout === undefined) return { name, tensor: t, fileShape: [...t.shape], dims: undefined, byteLength };
  if (t.shape.length !== 3) {
    throw new ShapeError(
      `tensor '${name}' has shape [${t.shape.join(', ')}]; with a layout, tensors must be given canonical [n, H, d] (rank 3)`,
    );
  }
  const dims = { n: t.shape[0], H: t.shape[1], d: t.shape[2] };
  return { name, tensor: t, fileShape: fileShapeFor(dims, layout), dims, byteLength };
}

/** Writes one tensor's chunks into the region starting at `base`, transposing for 'hnd'. */
async function writeData(
  fh: Awaited<ReturnType<typeof open>>,
  path: string,
  base: number,
  p: Planned,
  layout: Layout | undefined,
): Promise<void> {
  const { dtype } = p.tensor;
  const bpe = bytesPerElement(dtype);
  const total = numel(p.tensor.shape);
  let at = 0;
  for await (const chunk of chunksOf(p.tensor)) {
    const ok = dtype === 'f32' ? chunk instanceof Float32Array : chunk instanceof Uint16Array;
    if (!ok) throw new DTypeError(`tensor '${p.name}' is ${dtype} but a chunk is a ${chunk?.constructor?.name}`);
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

async function writeAtomically(path: string, body: (fh: Awaited<ReturnType<typeof open>>) => Promise<void>): Promise<void> {
  assertLittleEndianHost();
  const tmp = `${path}.${process.pid}.${Math.random().toString(36).slice(2, 8)}.partial`;
  let fh: Awaited<ReturnType<typeof open>>;
  try {
    fh = await open(tmp, 'w');
  } catch (e) {
    throw ioError(e, 'create', path);
  }
  try {
    await body(fh);
    await fh.close();
    await rename(tmp, path).catch((e) => {
      throw ioError(e, 'rename into place', path);
    });
  } catch (e) {
    await fh.close().catch(() => undefined);
    await rm(tmp, { force: true }).catch(() => undefined);
    throw e;
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
  const layout = opts.layout === undefined ? undefined : parseLayout(opts.layout);
  const planned = Object.entries(tensors).map(([name, t]) => {
    if (name === '__metadata__' || name.length === 0) {
      throw new InvalidArgumentError(`'${name}' cannot be a tensor name in safetensors`);
    }
    return planTensor(name, t, layout);
  });
  const header: Record<string, unknown> = {};
  if (opts.metadata !== undefined) {
    for (const [k, v] of Object.entries(opts.metadata)) {
      if (typeof v !== 'string') throw new InvalidArgumentError(`metadata['${k}'] must be a string`);
    }
    header.__metadata__ = opts.metadata;
  }
  let offset = 0;
  for (const p of planned) {
    header[p.name] = {
      dtype: DTYPE_TO_SAFETENSORS[p.tensor.dtype],
      shape: p.fileShape,
      data_offsets: [offset, offset + p.byteLength],
    };
    offset += p.byteLength;
  }
  let json = new TextEncoder().encode(JSON.stringify(header));
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
  const layout = opts.layout === undefined ? undefined : parseLayout(opts.layout);
  const p = planTensor('array', tensor, layout);
  const descr = tensor.dtype === 'f32' ? '<f4' : tensor.dtype === 'f16' ? '<f2' : '<u2';
  const header = encodeNpyHeader(descr, p.fileShape);
  await writeAtomically(path, async (fh) => {
    await writeFully(fh, header, 0, path);
    await writeData(fh, path, header.length, p, layout);
  });
}
