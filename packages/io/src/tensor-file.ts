/**
 * An open tensor file: the parsed header (names, dtypes, shapes, byte ranges) plus the
 * file handle that data is read from at offsets. Nothing but the header is read on open.
 */
import type { FileHandle } from 'node:fs/promises';
import { CrispError, type DType } from '@crisp/core';
import { readExactly } from './file-handle.js';

export type FileFormat = 'safetensors' | 'npy';

export interface TensorInfo {
  readonly name: string;
  /** The element type as the file spells it: 'BF16', 'F64', '<f4', '<u2', ... */
  readonly fileDtype: string;
  /** The library dtype, or undefined when the file's dtype is not f32/f16/bf16. */
  readonly dtype: DType | undefined;
  /** The shape as stored in the file (not yet mapped through a layout). */
  readonly shape: readonly number[];
  /** Absolute byte offset of the first element in the file. */
  readonly byteOffset: number;
  readonly byteLength: number;
}

export interface TensorFile extends AsyncDisposable {
  readonly path: string;
  readonly format: FileFormat;
  readonly fileSize: number;
  /** Tensors in file order (data offset order for safetensors). */
  readonly tensors: readonly TensorInfo[];
  /** safetensors `__metadata__` (string to string); empty for .npy. */
  readonly metadata: Readonly<Record<string, string>>;
  /** The named tensor; a missing name is a FORMAT_ERROR listing the names the file has. */
  tensor(name?: string): TensorInfo;
  /** Fills `target` with file bytes starting at an absolute `position`. */
  read(target: Uint8Array, position: number): Promise<void>;
  close(): Promise<void>;
}

export function listNames(names: readonly string[], max = 20): string {
  const shown = names.slice(0, max).map((s) => `'${s}'`);
  return names.length > max ? `${shown.join(', ')} and ${names.length - max} more` : shown.join(', ') || '(none)';
}

export class OpenTensorFile implements TensorFile {
  readonly path: string;
  readonly format: FileFormat;
  readonly fileSize: number;
  readonly tensors: readonly TensorInfo[];
  readonly metadata: Readonly<Record<string, string>>;
  readonly #handle: FileHandle;
  readonly #byName: Map<string, TensorInfo>;
  readonly #inFlight = new Set<Promise<void>>();
  #closed = false;
  #closing: Promise<void> | undefined;

  constructor(
    handle: FileHandle,
    path: string,
    format: FileFormat,
    fileSize: number,
    tensors: readonly TensorInfo[],
    metadata: Record<string, string>,
  ) {
    this.#handle = handle;
    this.path = path;
    this.format = format;
    this.fileSize = fileSize;
    this.tensors = tensors;
    this.metadata = metadata;
    this.#byName = new Map(tensors.map((t) => [t.name, t]));
  }

  tensor(name?: string): TensorInfo {
    if (name !== undefined && typeof name !== 'string') {
      throw new CrispError('INVALID_ARGUMENT', `a tensor name must be a string; got ${typeof name}`);
    }
    if (name === undefined) {
      if (this.tensors.length === 1) return this.tensors[0];
      throw new CrispError(
        'INVALID_ARGUMENT',
        `${this.path} holds ${this.tensors.length} tensors (${listNames(this.tensors.map((t) => t.name))}); name the one to read`,
      );
    }
    const t = this.#byName.get(name);
    if (t === undefined) {
      throw new CrispError(
        'FORMAT_ERROR',
        `${this.path} has no tensor named '${name}'; it has ${listNames(this.tensors.map((x) => x.name))}`,
        { path: this.path, name },
      );
    }
    return t;
  }

  async read(target: Uint8Array, position: number): Promise<void> {
    if (this.#closed) {
      throw new CrispError('DISPOSED', `${this.path} was closed; open it again to read from it`);
    }
    if (!(target instanceof Uint8Array)) {
      throw new CrispError('INVALID_ARGUMENT', 'read(target, position): target must be a Uint8Array');
    }
    if (!Number.isSafeInteger(position) || position < 0 || position + target.length > this.fileSize) {
      throw new CrispError(
        'INVALID_ARGUMENT',
        `read(target, position): bytes [${position}, ${position + target.length}) are not inside ${this.path} (${this.fileSize} bytes)`,
      );
    }
    // Tracked so that close() waits for reads already under way instead of pulling the
    // handle from under them.
    const p = readExactly(this.#handle, target, position, this.path);
    this.#inFlight.add(p);
    try {
      await p;
    } finally {
      this.#inFlight.delete(p);
    }
  }

  /** Closes the file once reads under way have finished; later reads are DISPOSED. */
  close(): Promise<void> {
    if (this.#closing === undefined) {
      this.#closed = true;
      this.#closing = (async () => {
        await Promise.allSettled([...this.#inFlight]);
        await this.#handle.close();
      })();
    }
    return this.#closing;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
