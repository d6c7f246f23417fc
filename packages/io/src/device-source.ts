/**
 * Device tensors out to files, streamed: `deviceTensorSource` turns a tensor on a backend
 * into a writer source whose chunks are ranged reads (`Backend.read`) of whole rows, so a
 * tensor larger than any JS array reaches a safetensors or .npy file with one chunk in host
 * memory at a time; `writeTensor` writes one tensor that way. The counterpart of
 * `uploadTensor`.
 *
 * A "row" is the tensor's first axis: one token's H·d values for [n, H, d], one head's n
 * values for an LSE [H, n].
 */
import {
  type Backend,
  CrispError,
  type DeviceTensor,
  type HostData,
  InvalidArgumentError,
  bytesPerElement,
  numel,
} from '@crisp/core';
import { describeValue } from './file-handle.js';
import type { Layout } from './layout.js';
import { DEFAULT_CHUNK_BYTES, MAX_CHUNK_BYTES, checkOptionKeys } from './stream.js';
import { type TensorSource, writeNpy, writeSafetensors } from './write.js';

export interface DeviceSourceOptions {
  /**
   * Host bytes a chunk aims at (default 16 MiB, at most 1 GiB): whole rows that fit, or,
   * when one row is larger, pieces of a row of this size.
   */
  readonly chunkBytes?: number;
  /** Called after each chunk with the elements read so far and the total (progress bars). */
  readonly onProgress?: (elementsDone: number, elementsTotal: number) => void;
}

const SOURCE_KEYS = ['chunkBytes', 'onProgress'];

function assertReader(backend: unknown): asserts backend is Pick<Backend, 'download'> & Partial<Pick<Backend, 'read'>> {
  const b = backend as Partial<Backend> | null;
  if (b === null || typeof b !== 'object' || typeof b.download !== 'function') {
    throw new InvalidArgumentError(`backend must be a CRISP backend (with download, and read for chunks); got ${describeValue(backend)}`);
  }
}

function assertTensor(t: unknown): asserts t is DeviceTensor {
  const x = t as Partial<DeviceTensor> | null;
  if (x === null || typeof x !== 'object' || typeof x.backend !== 'string' || !Array.isArray(x.shape) || typeof x.dtype !== 'string') {
    throw new InvalidArgumentError(`tensor must be a device tensor (from a backend's upload, allocate or an attention); got ${describeValue(t)}`);
  }
  if (x.disposed) throw new CrispError('DISPOSED', 'the device tensor was disposed; write it out before dispose()');
}

/** Elements per chunk: whole rows that fit in `chunkBytes`, or a piece of one row. */
export function chunkElements(shape: readonly number[], bpe: number, chunkBytes: number): number {
  const rowElems = shape.length > 1 ? numel(shape.slice(1)) : 1;
  const fit = Math.floor(chunkBytes / bpe);
  if (rowElems === 0) return 1;
  return rowElems <= fit ? Math.floor(fit / rowElems) * rowElems : Math.max(1, fit);
}

/**
 * A writer source (`writeSafetensors`, `writeNpy`) over a device tensor: each chunk is one
 * `backend.read` of whole rows (at most `chunkBytes` of host memory), read when the writer
 * asks for it. A backend without `read` is read once through `download` (the whole tensor in
 * host memory) and cut into the same chunks. Offsets are Numbers, exact past 2^32 elements.
 * The tensor must stay alive until the write has finished.
 */
export function deviceTensorSource(
  backend: Pick<Backend, 'download'> & Partial<Pick<Backend, 'read'>>,
  tensor: DeviceTensor,
  opts: DeviceSourceOptions = {},
): TensorSource {
  assertReader(backend);
  assertTensor(tensor);
  checkOptionKeys(opts, SOURCE_KEYS, 'device source options');
  const chunkBytes = opts.chunkBytes ?? DEFAULT_CHUNK_BYTES;
  if (typeof chunkBytes !== 'number' || !Number.isSafeInteger(chunkBytes) || chunkBytes < 4 || chunkBytes > MAX_CHUNK_BYTES) {
    throw new InvalidArgumentError(`chunkBytes must be an integer in [4, ${MAX_CHUNK_BYTES}]; got ${describeValue(opts.chunkBytes)}`);
  }
  if (opts.onProgress !== undefined && typeof opts.onProgress !== 'function') {
    throw new InvalidArgumentError(`onProgress must be a function; got ${describeValue(opts.onProgress)}`);
  }
  const { dtype } = tensor;
  const shape = [...tensor.shape];
  const total = numel(shape);
  const step = chunkElements(shape, bytesPerElement(dtype), chunkBytes);
  const what = `device tensor [${shape.join(', ')}] ${dtype}`;
  const checked = (data: unknown, count: number, via: string): HostData => {
    const ok = dtype === 'f32' ? data instanceof Float32Array : data instanceof Uint16Array;
    if (!ok || (data as HostData).length !== count) {
      throw new CrispError(
        'BACKEND_ERROR',
        `${via} of ${count} elements of the ${what} returned ${describeValue(data)}${ok ? ` of ${(data as HostData).length}` : ''}; expected a ${dtype === 'f32' ? 'Float32Array' : 'Uint16Array'} of ${count}`,
      );
    }
    return data as HostData;
  };
  return {
    dtype,
    shape,
    async *chunks(): AsyncGenerator<HostData> {
      if (typeof backend.read === 'function') {
        for (let at = 0; at < total; at += step) {
          const count = Math.min(step, total - at);
          yield checked(await backend.read(tensor, at, count), count, `backend '${tensor.backend}' read`);
          opts.onProgress?.(at + count, total);
        }
        return;
      }
      const all = checked((await backend.download(tensor)).data, total, `backend '${tensor.backend}' download`);
      for (let at = 0; at < total; at += step) {
        const count = Math.min(step, total - at);
        yield all.subarray(at, at + count) as HostData;
        opts.onProgress?.(at + count, total);
      }
    },
  };
}

export interface WriteTensorOptions extends DeviceSourceOptions {
  /** 'safetensors' or 'npy'; default: 'npy' for a path ending in .npy, else 'safetensors' */
  readonly format?: 'safetensors' | 'npy';
  /** the tensor's name in a safetensors file (default 'tensor') */
  readonly name?: string;
  /** store a canonical [n, H, d] tensor as 'nhd', '1nhd' or 'hnd' (the writers' option) */
  readonly layout?: Layout | string;
  /** safetensors `__metadata__` */
  readonly metadata?: Readonly<Record<string, string>>;
}

/**
 * Writes one device tensor to a file, streamed in row chunks (`deviceTensorSource`) and
 * atomic like every writer here: a temporary file beside the target, flushed, renamed on
 * success; on any error (a failed read included) no file and no temporary file are left,
 * and an existing file stays as it was.
 */
export async function writeTensor(
  backend: Pick<Backend, 'download'> & Partial<Pick<Backend, 'read'>>,
  tensor: DeviceTensor,
  path: string,
  opts: WriteTensorOptions = {},
): Promise<void> {
  checkOptionKeys(opts, [...SOURCE_KEYS, 'format', 'name', 'layout', 'metadata'], 'writeTensor options');
  const { format: f, name, layout, metadata, ...src } = opts;
  const format = f ?? (typeof path === 'string' && path.toLowerCase().endsWith('.npy') ? 'npy' : 'safetensors');
  if (format !== 'safetensors' && format !== 'npy') throw new InvalidArgumentError(`format must be 'safetensors' or 'npy'; got ${describeValue(f)}`);
  const source = deviceTensorSource(backend, tensor, src);
  if (format === 'npy') {
    if (name !== undefined || metadata !== undefined) throw new InvalidArgumentError('name and metadata apply to safetensors files only; drop them for .npy');
    await writeNpy(path, source, layout === undefined ? {} : { layout });
    return;
  }
  if (name !== undefined && (typeof name !== 'string' || name.length === 0)) {
    throw new InvalidArgumentError(`name must be a non-empty string; got ${describeValue(name)}`);
  }
  await writeSafetensors(path, { [name ?? 'tensor']: source }, { ...(layout === undefined ? {} : { layout }), ...(metadata === undefined ? {} : { metadata }) });
}
