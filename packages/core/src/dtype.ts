/**
 * Element types and exact conversions. f16 and bf16 travel as their 16-bit patterns in
 * a Uint16Array; conversions from f32 round to nearest, ties to even, as hardware does.
 */
import { DTypeError, describeValue } from './errors.js';

export type DType = 'f32' | 'f16' | 'bf16';
export const DTYPES: readonly DType[] = ['f32', 'f16', 'bf16'];

export function assertDType(x: unknown, what = 'dtype'): asserts x is DType {
  if (x !== 'f32' && x !== 'f16' && x !== 'bf16') {
    throw new DTypeError(`${what} must be one of f32, f16, bf16; got ${describeValue(x)}`);
  }
}

/** 4 for f32, 2 for f16 and bf16; anything else is a DTypeError (no table lookup by a user string). */
export function bytesPerElement(dtype: DType): number {
  if (dtype === 'f32') return 4;
  if (dtype === 'f16' || dtype === 'bf16') return 2;
  return assertDTypeNever(dtype);
}

function assertDTypeNever(x: unknown): never {
  assertDType(x);
  throw new DTypeError(`unknown dtype ${describeValue(x)}`);
}

/** The largest finite value of each dtype (values a little above it round down to it; larger ones overflow to Infinity). */
export const MAX_FINITE: Readonly<Record<DType, number>> = Object.freeze({ f32: 3.4028234663852886e38, f16: 65504, bf16: 3.3895313892515355e38 });

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/**
 * f32 bits of x rounded to ODD (truncate toward zero, then set the last bit if inexact).
 * Inputs are JS numbers (float64): rounding them to f32 by nearest-even and then to 16 bits
 * can round twice at a tie (1 + 2^-11 + 2^-40 would become 1 in f16 instead of 1 + 2^-10).
 * Round-to-odd to f32 (24 bits >= 11 + 2 and 8 + 2) makes the second rounding exact.
 * f32-representable inputs are unchanged.
 */
function f32BitsRoundedToOdd(x: number): number {
  f32[0] = x;
  let bits = u32[0];
  const r = f32[0];
  if (r !== x && Number.isFinite(r) && !Number.isNaN(x)) {
    if (Math.abs(r) > Math.abs(x)) bits -= 1; // one step toward zero (sign-magnitude bits)
    bits |= 1;
  }
  return bits >>> 0;
}

/** f32 -> bf16 bits, round to nearest even; NaN stays a quiet NaN. */
export function f32ToBf16Bits(x: number): number {
  const bits = f32BitsRoundedToOdd(x);
  if ((bits & 0x7f800000) === 0x7f800000 && (bits & 0x007fffff) !== 0) {
    return ((bits >>> 16) | 0x0040) & 0xffff;
  }
  const lsb = (bits >>> 16) & 1;
  return ((bits + 0x7fff + lsb) >>> 16) & 0xffff;
}

export function bf16BitsToF32(h: number): number {
  u32[0] = (h & 0xffff) << 16;
  return f32[0];
}

/** f32 -> IEEE binary16 bits, round to nearest even, with subnormals and overflow to Inf. */
export function f32ToF16Bits(x: number): number {
  const bits = f32BitsRoundedToOdd(x);
  const sign = (bits >>> 16) & 0x8000;
  const exp = (bits >>> 23) & 0xff;
  let mant = bits & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant !== 0 ? 0x200 : 0);
  // Unbiased exponent and the f16 biased one.
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00; // overflow
  if (e <= 0) {
    // Subnormal f16 (or zero): shift the mantissa with its implicit one.
    if (e < -10) return sign; // rounds to zero
    mant |= 0x800000;
    const shift = 14 - e; // 13 + (1 - e)
    const half = 1 << (shift - 1);
    const rest = mant & ((1 << shift) - 1);
    let out = mant >>> shift;
    if (rest > half || (rest === half && (out & 1) === 1)) out += 1;
    return sign | out;
  }
  let out = (e << 10) | (mant >>> 13);
  const rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest === 0x1000 && (out & 1) === 1)) out += 1; // may carry into exponent: correct
  return sign | out;
}

export function f16BitsToF32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 0x1f) return mant !== 0 ? Number.NaN : sign * Number.POSITIVE_INFINITY;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

/** Round a value through a dtype (what storing then loading it gives). */
export function roundTo(dtype: DType, x: number): number {
  if (dtype === 'bf16') return bf16BitsToF32(f32ToBf16Bits(x));
  if (dtype === 'f16') return f16BitsToF32(f32ToF16Bits(x));
  return Math.fround(x);
}

/** Encode float values into a dtype's storage array. */
export function encode(dtype: DType, values: ArrayLike<number>): Float32Array | Uint16Array {
  const n = values.length;
  if (dtype === 'f32') return Float32Array.from(values);
  const out = new Uint16Array(n);
  const conv = dtype === 'bf16' ? f32ToBf16Bits : f32ToF16Bits;
  for (let i = 0; i < n; i++) out[i] = conv(values[i]);
  return out;
}

/** Decode a dtype's storage array to f32 values. */
export function decode(dtype: DType, data: Float32Array | Uint16Array): Float32Array {
  if (dtype === 'f32') return data instanceof Float32Array ? data : new Float32Array(data);
  const out = new Float32Array(data.length);
  const conv = dtype === 'bf16' ? bf16BitsToF32 : f16BitsToF32;
  for (let i = 0; i < data.length; i++) out[i] = conv(data[i]);
  return out;
}
