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
  constructor(code: CrispErrorCode, message: string, details?: Record<string, unknown>) {
    super(message);
    this.name = 'CrispError';
    this.code = code;
    this.details = details;
  }
}

export class InvalidArgumentError extends CrispError {
  constructor(message: string, details?: Record<string, unknown>) {
    super('INVALID_ARGUMENT', message, details);
    this.name = 'InvalidArgumentError';
  }
}
export class ShapeError extends CrispError {
  constructor(message: string, details?: Record<string, unknown>) {
    super('SHAPE_MISMATCH', message, details);
    this.name = 'ShapeError';
  }
}
export class DTypeError extends CrispError {
  constructor(message: string, details?: Record<string, unknown>) {
    super('DTYPE_MISMATCH', message, details);
    this.name = 'DTypeError';
  }
}
export class NonFiniteError extends CrispError {
  constructor(message: string, details?: Record<string, unknown>) {
    super('NON_FINITE', message, details);
    this.name = 'NonFiniteError';
  }
}
export class MaskError extends CrispError {
  constructor(message: string, details?: Record<string, unknown>) {
    super('INVALID_MASK', message, details);
    this.name = 'MaskError';
  }
}
export class UnsupportedError extends CrispError {
  constructor(message: string, details?: Record<string, unknown>) {
    super('UNSUPPORTED', message, details);
    this.name = 'UnsupportedError';
  }
}
export class LimitError extends CrispError {
  constructor(message: string, details?: Record<string, unknown>) {
    super('LIMIT_EXCEEDED', message, details);
    this.name = 'LimitError';
  }
}

/** True when `e` is a CrispError, optionally with the given code. */
export function isCrispError(e: unknown, code?: CrispErrorCode): e is CrispError {
  return e instanceof CrispError && (code === undefined || e.code === code);
}
