/**
 * Typed errors. Every error the library throws on purpose is a `CrispError` with a
 * stable `code` (safe to switch on) and a message that says what to do next.
 */
export type CrispErrorCode =
  | 'INVALID_ARGUMENT' // a parameter is out of range or of the wrong type
  | 'SHAPE_MISMATCH' // tensor rank/shape wrong or inconsistent between q, k, v
  | 'DTYPE_MISMATCH' // dtypes differ where they must agree, or a dtype is unknown
  | 'NON_FINITE' // NaN or Inf in inputs or in policy inputs (proxy statistics)
  | 'INVALID_MASK' // a block mask is out of range, unsorted or non-causal
  | 'UNSUPPORTED' // the backend lacks a head dim, dtype, block size or feature
  | 'LIMIT_EXCEEDED' // n or a buffer is beyond what the backend can hold
  | 'DISPOSED' // a tensor or backend was used after dispose()
  | 'WRONG_BACKEND' // a device tensor was handed to a backend that does not own it
  | 'BACKEND_UNAVAILABLE' // no driver / adapter / library found
  | 'DEVICE_LOST' // the GPU device was lost
  | 'OUT_OF_MEMORY' // device allocation failed
  | 'BACKEND_ERROR' // a driver/compiler/launch error, with the native error name
  | 'FORMAT_ERROR' // a file is not what it claims to be (I/O)
  | 'IO_ERROR'; // reading or writing failed

export class CrispError extends Error {
  readonly code: CrispErrorCode;
  readonly details: Record<string, unknown> | undefined;
  /** `options.cause`: the error this one wraps (a user router's or selector's own throw) */
  constructor(code: CrispErrorCode, message: string, details?: Record<string, unknown>, options?: { readonly cause?: unknown }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'CrispError';
    this.code = code;
    this.details = details;
  }
}

export class InvalidArgumentError extends CrispError {
  constructor(message: string, details?: Record<string, unknown>, options?: { readonly cause?: unknown }) {
    super('INVALID_ARGUMENT', message, details, options);
    this.name = 'InvalidArgumentError';
  }
}
export class ShapeError extends CrispError {
  constructor(message: string, details?: Record<string, unknown>, options?: { readonly cause?: unknown }) {
    super('SHAPE_MISMATCH', message, details, options);
    this.name = 'ShapeError';
  }
}
export class DTypeError extends CrispError {
  constructor(message: string, details?: Record<string, unknown>, options?: { readonly cause?: unknown }) {
    super('DTYPE_MISMATCH', message, details, options);
    this.name = 'DTypeError';
  }
}
export class NonFiniteError extends CrispError {
  constructor(message: string, details?: Record<string, unknown>, options?: { readonly cause?: unknown }) {
    super('NON_FINITE', message, details, options);
    this.name = 'NonFiniteError';
  }
}
export class MaskError extends CrispError {
  constructor(message: string, details?: Record<string, unknown>, options?: { readonly cause?: unknown }) {
    super('INVALID_MASK', message, details, options);
    this.name = 'MaskError';
  }
}
export class UnsupportedError extends CrispError {
  constructor(message: string, details?: Record<string, unknown>, options?: { readonly cause?: unknown }) {
    super('UNSUPPORTED', message, details, options);
    this.name = 'UnsupportedError';
  }
}
export class LimitError extends CrispError {
  constructor(message: string, details?: Record<string, unknown>, options?: { readonly cause?: unknown }) {
    super('LIMIT_EXCEEDED', message, details, options);
    this.name = 'LimitError';
  }
}

/** True when `e` is a CrispError, optionally with the given code. */
export function isCrispError(e: unknown, code?: CrispErrorCode): e is CrispError {
  return e instanceof CrispError && (code === undefined || e.code === code);
}

/**
 * A short, safe rendering of any value for an error message: never throws (symbols, BigInts,
 * objects with throwing getters or toString, cycles), never long (arrays and strings are cut).
 */
export function describeValue(x: unknown): string {
  try {
    if (x === null) return 'null';
    if (x === undefined) return 'undefined';
    if (typeof x === 'string') return x.length > 40 ? `'${x.slice(0, 40)}…' (${x.length} characters)` : `'${x}'`;
    if (typeof x === 'number' || typeof x === 'boolean') return String(x);
    if (typeof x === 'bigint') {
      const digits = String(x);
      return digits.length > 24 ? `${digits.slice(0, 24)}…n (a BigInt of ${digits.length} characters)` : `${digits}n (a BigInt)`;
    }
    if (typeof x === 'symbol') return 'a symbol';
    if (typeof x === 'function') return 'a function';
    if (typeof (x as { then?: unknown }).then === 'function') return 'a Promise';
    if (Array.isArray(x) || ArrayBuffer.isView(x)) {
      const kind = Array.isArray(x) ? 'array' : (x as object).constructor?.name ?? 'typed array';
      const len = (x as ArrayLike<unknown>).length ?? 0;
      if (typeof len !== 'number') return kind;
      const head: string[] = [];
      for (let i = 0; i < Math.min(len, 6); i++) {
        const v = (x as ArrayLike<unknown>)[i];
        // each element cut short: a 77-digit BigInt or a nested array must not make the whole long
        const item = typeof v === 'number' ? String(v) : describeValue(v);
        head.push(item.length > 40 ? `${item.slice(0, 39)}…` : item);
      }
      return `${kind} [${head.join(', ')}${len > 6 ? ', …' : ''}] of length ${len}`;
    }
    const name = (x as object).constructor?.name;
    return name && name !== 'Object' ? `a ${name}` : 'an object';
  } catch {
    return 'an unprintable value';
  }
}

/**
 * A function's options (a router factory's, a backend's, sparsePrefill's): undefined (the
 * defaults) or a plain object naming only `known` keys. A misspelt option would otherwise be ignored without a word and the
 * default used.
 */
export function checkOptions<T extends object>(opts: T | undefined, factory: string, known: readonly string[]): T | Record<string, never> {
  if (opts === undefined) return {};
  if (opts === null || typeof opts !== 'object' || Array.isArray(opts)) {
    throw new InvalidArgumentError(`${factory}(options): options must be an object (or left out); got ${describeValue(opts)}`);
  }
  assertKnownKeys(opts, known, `${factory}(options)`, 'option');
  return opts;
}

/**
 * INVALID_ARGUMENT for the first key of `obj` that is not in `known` (a misspelt option would
 * otherwise be ignored without a word): "WHAT: unknown NOUN 'k' (did you mean 'K'?); the NOUNs
 * are ...", the suggestion where a case-insensitive match (underscores dropped) exists.
 */
export function assertKnownKeys(obj: object, known: readonly string[], what: string, noun: 'key' | 'option' = 'key'): void {
  for (const k of Object.keys(obj)) {
    if (known.includes(k)) continue;
    const near = known.find((x) => x.toLowerCase() === k.toLowerCase().replace(/_/g, ''));
    throw new InvalidArgumentError(`${what}: unknown ${noun} ${describeValue(k)}${near ? ` (did you mean '${near}'?)` : ''}; the ${noun}s are ${known.join(', ')}`);
  }
}

/**
 * `e` with a place put in front of its message (which item of a batch, which part): a
 * CrispError keeps its code, its class where it is one of core's (so `instanceof
 * NonFiniteError` still holds) and its details, gains `details` and is the new error's cause.
 * Anything else is returned unchanged.
 */
export function errorWithin(e: unknown, where: string, details: Record<string, unknown>): unknown {
  if (!(e instanceof CrispError)) return e;
  const message = `${where}: ${e.message}`;
  const all = { ...e.details, ...details };
  const Same = [InvalidArgumentError, ShapeError, DTypeError, NonFiniteError, MaskError, UnsupportedError, LimitError].find((C) => e.constructor === C);
  return Same ? new Same(message, all, { cause: e }) : new CrispError(e.code, message, all, { cause: e });
}
