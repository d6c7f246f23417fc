/**
 * Host tensors (plain typed arrays) and the device-tensor handle every backend returns.
 *
 * Shape legend used across the project:
 *   n   sequence length (keys; queries too unless chunked)   H    query heads
 *   Hkv key/value heads (H % Hkv == 0, GQA)                   d    head dim
 *   B   block size                                            Nb   ceil(n / B)
 */
import { type DType, MAX_FINITE, assertDType, decode, encode } from './dtype.js';
import { DTypeError, InvalidArgumentError, NonFiniteError, ShapeError, describeValue } from './errors.js';

export type HostData = Float32Array | Uint16Array;

export interface HostTensor {
  readonly dtype: DType;
  readonly shape: readonly number[];
  /** Row-major values: Float32Array for f32, Uint16Array of bit patterns for f16/bf16. */
  readonly data: HostData;
}

// `Symbol.dispose` and the Disposable interfaces, declared as @types/node declares them, so
// these types compile for a user whose `lib` predates TypeScript's esnext.disposable (target
// ES2022 or ES2023, no @types/node: a browser project) without `skipLibCheck`. Identical
// declarations merge with the lib's where it has them.
declare global {
  interface SymbolConstructor {
    readonly dispose: unique symbol;
    readonly asyncDispose: unique symbol;
  }
  interface Disposable {
    [Symbol.dispose](): void;
  }
  interface AsyncDisposable {
    [Symbol.asyncDispose](): PromiseLike<void>;
  }
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
  if (!Array.isArray(shape) || shape.some((s) => typeof s !== 'number' || !Number.isSafeInteger(s) || s < 0)) {
    throw new ShapeError(`${what} must be an array of non-negative integers; got ${describeValue(shape)}`);
  }
  if (!Number.isSafeInteger(numel(shape))) {
    throw new ShapeError(`${what} [${shape}] holds more elements than a tensor can (over 2^53); check the dimensions`);
  }
}

/**
 * Checks a ranged copy of `count` elements at the flat `elementOffset` of a tensor of
 * `elements` elements (`Backend.read`, `Backend.write`): both non-negative safe integers and
 * the range inside the tensor, else an INVALID_ARGUMENT naming the range. Number arithmetic
 * throughout, so tensors past 2^32 elements are checked exactly.
 */
export function checkElementRange(elementOffset: unknown, count: unknown, elements: number, what: string): void {
  if (typeof elementOffset !== 'number' || !Number.isSafeInteger(elementOffset) || elementOffset < 0) {
    throw new InvalidArgumentError(`${what}: the element offset must be a non-negative integer; got ${describeValue(elementOffset)}`, {
      elementOffset,
      elements,
    });
  }
  if (typeof count !== 'number' || !Number.isSafeInteger(count) || count < 0) {
    throw new InvalidArgumentError(`${what}: the element count must be a non-negative integer; got ${describeValue(count)}`, { count, elements });
  }
  if (elementOffset + count > elements) {
    throw new InvalidArgumentError(
      `${what}: elements [${elementOffset}, ${elementOffset + count}) are outside a tensor of ${elements} elements; read at most ${Math.max(0, elements - elementOffset)} from offset ${elementOffset}`,
      { elementOffset, count, elements },
    );
  }
}

/**
 * Throws unless `values` is an array of numbers or a numeric typed array: what `hostTensor`
 * and `castHost` encode (strings, BigInts and holes would become NaN or throw mid-copy).
 */
function assertNumericValues(values: unknown): asserts values is ArrayLike<number> {
  if (ArrayBuffer.isView(values) && !(values instanceof DataView)) {
    if (values instanceof BigInt64Array || values instanceof BigUint64Array) {
      throw new InvalidArgumentError('values must be numbers; got a BigInt typed array (convert it to a Float32Array first)');
    }
    return;
  }
  if (!Array.isArray(values)) {
    throw new InvalidArgumentError(`values must be an array of numbers or a typed array; got ${describeValue(values)}`);
  }
  for (let i = 0; i < values.length; i++) {
    if (typeof values[i] !== 'number') {
      throw new InvalidArgumentError(`values[${i}] is ${describeValue(values[i])}, not a number`, { index: i });
    }
  }
}

/**
 * Throws NonFiniteError when a finite input value became Infinity in `dtype` (f16 tops out at
 * 65504): the message names the value and suggests a wider dtype, instead of the input
 * later being reported as holding Infinity.
 */
function assertNoOverflow(dtype: DType, values: ArrayLike<number>, data: Float32Array | Uint16Array): void {
  for (let i = 0; i < data.length; i++) {
    const inf = dtype === 'f32' ? (data as Float32Array)[i] === Infinity || (data as Float32Array)[i] === -Infinity : (data[i] & 0x7fff) === (dtype === 'f16' ? 0x7c00 : 0x7f80);
    if (inf && Number.isFinite(values[i])) {
      const wider = dtype === 'f16' ? 'use f32 or bf16 (or scale the input down)' : 'scale the input down';
      throw new NonFiniteError(
        `value ${values[i]} at flat index ${i} overflows ${dtype} (largest finite ${MAX_FINITE[dtype]}) and would become ${values[i] > 0 ? '' : '-'}Infinity; ${wider}`,
        { index: i, dtype },
      );
    }
  }
}

/**
 * Build a host tensor from f32 values, encoding to the requested dtype. A finite value too
 * large for the dtype (above 65504 in f16) is a NonFiniteError that says so; NaN and
 * Infinity given on purpose are kept (the backends reject them when they run).
 */
export function hostTensor(dtype: DType, shape: readonly number[], values: ArrayLike<number>): HostTensor {
  assertDType(dtype);
  assertShape(shape as number[]);
  assertNumericValues(values);
  if (numel(shape) !== values.length) {
    throw new ShapeError(`shape [${shape}] holds ${numel(shape)} values but ${values.length} were given`);
  }
  const data = encode(dtype, values);
  assertNoOverflow(dtype, values, data);
  return { dtype, shape: [...shape], data };
}

/** Wrap existing storage without copying; checks that the array type matches the dtype. */
export function wrapHost(dtype: DType, shape: readonly number[], data: HostData): HostTensor {
  assertDType(dtype);
  if (!(data instanceof Float32Array) && !(data instanceof Uint16Array)) {
    throw new DTypeError(
      `tensor data must be a Float32Array (f32) or a Uint16Array of bit patterns (f16, bf16); got ${describeValue(data)}`,
    );
  }
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

/** Throws unless `t` is a host tensor whose data matches its dtype and shape. */
function assertHost(t: HostTensor, what: string): void {
  if (!t || typeof t !== 'object') {
    throw new InvalidArgumentError(`${what} needs a host tensor ({ dtype, shape, data }); got ${describeValue(t)}`);
  }
  wrapHost(t.dtype, t.shape, t.data);
}

/** Values of a host tensor as f32 (no copy for f32 tensors). */
export function toFloat32(t: HostTensor): Float32Array {
  assertHost(t, 'toFloat32');
  return decode(t.dtype, t.data);
}

/** Convert a host tensor to another dtype (round to nearest even). */
export function castHost(t: HostTensor, dtype: DType): HostTensor {
  assertHost(t, 'castHost');
  assertDType(dtype);
  if (t.dtype === dtype) return t;
  const values = decode(t.dtype, t.data);
  const data = encode(dtype, values);
  assertNoOverflow(dtype, values, data);
  return { dtype, shape: [...t.shape], data };
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

/**
 * Where a device tensor's bytes lie (`Backend.memoryRange`): bytes [start, end) of
 * `resource`, the buffer or address space that holds them, compared by identity (an
 * ArrayBuffer on the reference backend, a GPUBuffer on WebGPU, the device's address space on
 * CUDA). Offsets are plain Numbers (exact to 2^53).
 */
export interface MemoryRange {
  readonly resource: object;
  readonly start: number;
  readonly end: number;
  /**
   * Set where the device forbids a pass to write any part of `resource` while it reads
   * another part (WebGPU validates a dispatch's buffer usage per buffer, not per byte): an
   * output then conflicts with every input in the same resource, whatever their bytes.
   */
  readonly wholeResource?: boolean;
}

/** Whether two ranges share a byte: the same resource and intersecting, non-empty ranges (`wholeResource` aside). */
export function rangesOverlap(a: MemoryRange, b: MemoryRange): boolean {
  return a.resource === b.resource && a.start < b.end && b.start < a.end && a.start < a.end && b.start < b.end;
}

/** Base class backends may extend for their device handles. */
export abstract class DeviceTensorBase implements DeviceTensor {
  abstract readonly backend: string;
  readonly dtype: DType;
  readonly shape: readonly number[];
  #disposed = false;
  constructor(dtype: DType, shape: readonly number[]) {
    this.dtype = dtype;
    this.shape = Object.freeze([...shape]);
    // What a backend reads the buffer as: fixed for the handle's life (a caller who assigns
    // to them gets a TypeError in strict mode instead of a backend misreading the buffer).
    Object.defineProperty(this, 'dtype', { writable: false, configurable: false });
    Object.defineProperty(this, 'shape', { writable: false, configurable: false });
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
