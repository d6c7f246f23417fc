/**
 * Host tensors (plain typed arrays) and the device-tensor handle every backend returns.
 *
 * Shape legend used across the project:
 *   n   sequence length (keys; queries too unless chunked)   H    query heads
 *   Hkv key/value heads (H % Hkv == 0, GQA)                   d    head dim
 *   B   block size                                            Nb   ceil(n / B)
 */
import { type DType, assertDType, decode, encode } from './dtype.js';
import { DTypeError, NonFiniteError, ShapeError } from './errors.js';

export type HostData = Float32Array | Uint16Array;

export interface HostTensor {
  readonly dtype: DType;
  readonly shape: readonly number[];
  /** Row-major values: Float32Array for f32, Uint16Array of bit patterns for f16/bf16. */
  readonly data: HostData;
}

/** An opaque tensor that lives on one backend. Free it with `dispose()`. */
export interface DeviceTensor {
  readonly backend: string;
  readonly dtype: DType;
  readonly shape: readonly number[];
  readonly disposed: boolean;
  dispose(): void;
  [Symbol.dispose](): void;
}

export function numel(shape: readonly number[]): number {
  let p = 1;
  for (const s of shape) p *= s;
  return p;
}

export function assertShape(shape: unknown, what = 'shape'): asserts shape is number[] {
  if (!Array.isArray(shape) || shape.some((s) => !Number.isInteger(s) || s < 0)) {
    throw new ShapeError(`${what} must be an array of non-negative integers; got ${JSON.stringify(shape)}`);
  }
}

/** Build a host tensor from f32 values, encoding to the requested dtype. */
export function hostTensor(dtype: DType, shape: readonly number[], values: ArrayLike<number>): HostTensor {
  assertDType(dtype);
  assertShape(shape as number[]);
  if (numel(shape) !== values.length) {
    throw new ShapeError(`shape [${shape}] holds ${numel(shape)} values but ${values.length} were given`);
  }
  return { dtype, shape: [...shape], data: encode(dtype, values) };
}

/** Wrap existing storage without copying; checks that the array type matches the dtype. */
export function wrapHost(dtype: DType, shape: readonly number[], data: HostData): HostTensor {
  assertDType(dtype);
  assertShape(shape as number[]);
  if (dtype === 'f32' && !(data instanceof Float32Array)) {
    throw new DTypeError('f32 tensors need a Float32Array');
  }
  if (dtype !== 'f32' && !(data instanceof Uint16Array)) {
    throw new DTypeError(`${dtype} tensors need a Uint16Array of bit patterns`);
  }
  if (numel(shape) !== data.length) {
    throw new ShapeError(`shape [${shape}] holds ${numel(shape)} values but the array has ${data.length}`);
  }
  return { dtype, shape: [...shape], data };
}

/** Values of a host tensor as f32 (no copy for f32 tensors). */
export function toFloat32(t: HostTensor): Float32Array {
  return decode(t.dtype, t.data);
}

/** Convert a host tensor to another dtype (round to nearest even). */
export function castHost(t: HostTensor, dtype: DType): HostTensor {
  if (t.dtype === dtype) return t;
  return { dtype, shape: [...t.shape], data: encode(dtype, toFloat32(t)) };
}

/** Throws NonFiniteError naming the first NaN/Inf position. */
export function assertFinite(t: HostTensor, what: string): void {
  const v = toFloat32(t);
  for (let i = 0; i < v.length; i++) {
    if (!Number.isFinite(v[i])) {
      throw new NonFiniteError(`${what} holds ${v[i]} at flat index ${i} (shape [${t.shape}]); clean the input first`, {
        index: i,
      });
    }
  }
}

/** Base class backends may extend for their device handles. */
export abstract class DeviceTensorBase implements DeviceTensor {
  abstract readonly backend: string;
  readonly dtype: DType;
  readonly shape: readonly number[];
  #disposed = false;
  constructor(dtype: DType, shape: readonly number[]) {
    this.dtype = dtype;
    this.shape = [...shape];
  }
  get disposed(): boolean {
    return this.#disposed;
  }
  protected abstract release(): void;
  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    this.release();
  }
  [Symbol.dispose](): void {
    this.dispose();
  }
}
