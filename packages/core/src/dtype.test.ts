import { describe, expect, it } from 'vitest';
import {
  bf16BitsToF32,
  castHost,
  decode,
  encode,
  f16BitsToF32,
  f32ToBf16Bits,
  f32ToF16Bits,
  hostTensor,
  isCrispError,
  roundTo,
  wrapHost,
  assertFinite,
} from './index.js';

const isF16NaN = (h: number) => (h & 0x7c00) === 0x7c00 && (h & 0x3ff) !== 0;
const isBf16NaN = (h: number) => (h & 0x7f80) === 0x7f80 && (h & 0x7f) !== 0;
function code(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (e) {
    if (isCrispError(e)) return e.code;
    throw e;
  }
  return undefined;
}

describe('f16', () => {
  it('every one of the 65536 bit patterns round-trips through f32 (NaNs stay NaN)', () => {
    let nans = 0;
    for (let h = 0; h < 0x10000; h++) {
      const x = f16BitsToF32(h);
      if (isF16NaN(h)) {
        nans++;
        expect(Number.isNaN(x)).toBe(true);
        expect(isF16NaN(f32ToF16Bits(x))).toBe(true);
        continue;
      }
      const back = f32ToF16Bits(x);
      if (back !== h) expect.fail(`pattern 0x${h.toString(16)} decoded to ${x} and encoded back to 0x${back.toString(16)}`);
    }
    expect(nans).toBe(2 * 1023);
  });

  it('decodes ordered: positive finite patterns increase strictly, and known values are exact', () => {
    for (let h = 1; h < 0x7c00; h++) expect(f16BitsToF32(h) > f16BitsToF32(h - 1)).toBe(true);
    expect(f16BitsToF32(0x3c00)).toBe(1);
    expect(f16BitsToF32(0xc000)).toBe(-2);
    expect(f16BitsToF32(0x7bff)).toBe(65504);
    expect(f16BitsToF32(0x0400)).toBe(2 ** -14); // smallest normal
    expect(f16BitsToF32(0x0001)).toBe(2 ** -24); // smallest subnormal
    expect(f16BitsToF32(0x03ff)).toBe(1023 * 2 ** -24); // largest subnormal
    expect(Object.is(f16BitsToF32(0x8000), -0)).toBe(true);
    expect(f16BitsToF32(0x7c00)).toBe(Number.POSITIVE_INFINITY);
    expect(f16BitsToF32(0xfc00)).toBe(Number.NEGATIVE_INFINITY);
  });

  it('rounds to nearest, ties to even, in the normal range', () => {
    const ulp = 2 ** -10; // at 1.0
    expect(f32ToF16Bits(1 + ulp / 2)).toBe(0x3c00); // tie -> even (mantissa 0)
    expect(f32ToF16Bits(1 + (3 * ulp) / 2)).toBe(0x3c02); // tie -> even (mantissa 2)
    expect(f32ToF16Bits(1 + ulp / 2 + 2 ** -20)).toBe(0x3c01); // just above the tie
    expect(f32ToF16Bits(1 + ulp / 2 - 2 ** -20)).toBe(0x3c00); // just below
    expect(f32ToF16Bits(-(1 + (3 * ulp) / 2))).toBe(0xbc02);
    // mantissa carry into the exponent: 2 - 2^-11 is a tie between 0x3bff and 0x4000 -> even 0x4000
    expect(f32ToF16Bits(2 - 2 ** -11)).toBe(0x4000);
  });

  it('subnormals: exact, ties to even, underflow to signed zero', () => {
    const u = 2 ** -24;
    expect(f32ToF16Bits(u)).toBe(0x0001);
    expect(f32ToF16Bits(5 * u)).toBe(0x0005);
    expect(f32ToF16Bits(u / 2)).toBe(0x0000); // tie between 0 and 1 unit -> 0
    expect(f32ToF16Bits((3 * u) / 2)).toBe(0x0002); // tie between 1 and 2 -> 2
    expect(f32ToF16Bits((5 * u) / 2)).toBe(0x0002); // tie between 2 and 3 -> 2
    expect(f32ToF16Bits(u / 2 + 2 ** -40)).toBe(0x0001); // above the tie
    expect(f32ToF16Bits(u / 4)).toBe(0x0000);
    expect(f32ToF16Bits(-u / 4)).toBe(0x8000);
    expect(f32ToF16Bits(2 ** -14 - u / 2)).toBe(0x0400); // tie at the subnormal/normal edge -> even
    expect(f32ToF16Bits(1e-30)).toBe(0x0000);
  });

  it('overflow goes to Inf at the rounding boundary; Inf and NaN map through', () => {
    expect(f32ToF16Bits(65504)).toBe(0x7bff);
    expect(f32ToF16Bits(65519)).toBe(0x7bff);
    expect(f32ToF16Bits(65520)).toBe(0x7c00); // tie between 65504 and 2^16 -> even = Inf
    expect(f32ToF16Bits(1e10)).toBe(0x7c00);
    expect(f32ToF16Bits(-1e10)).toBe(0xfc00);
    expect(f32ToF16Bits(Number.POSITIVE_INFINITY)).toBe(0x7c00);
    expect(f32ToF16Bits(Number.NEGATIVE_INFINITY)).toBe(0xfc00);
    expect(isF16NaN(f32ToF16Bits(Number.NaN))).toBe(true);
  });
});

describe('bf16', () => {
  it('every bit pattern round-trips (NaNs stay NaN)', () => {
    for (let h = 0; h < 0x10000; h++) {
      const x = bf16BitsToF32(h);
      if (isBf16NaN(h)) {
        expect(Number.isNaN(x)).toBe(true);
        expect(isBf16NaN(f32ToBf16Bits(x))).toBe(true);
        continue;
      }
      const back = f32ToBf16Bits(x);
      if (back !== h) expect.fail(`bf16 0x${h.toString(16)} -> ${x} -> 0x${back.toString(16)}`);
    }
  });

  it('rounds to nearest, ties to even; overflow to Inf; NaN stays NaN (payload only in the low half too)', () => {
    const ulp = 2 ** -7;
    expect(f32ToBf16Bits(1)).toBe(0x3f80);
    expect(f32ToBf16Bits(1 + ulp / 2)).toBe(0x3f80);
    expect(f32ToBf16Bits(1 + (3 * ulp) / 2)).toBe(0x3f82);
    expect(f32ToBf16Bits(1 + ulp / 2 + 2 ** -20)).toBe(0x3f81);
    expect(f32ToBf16Bits(-(1 + (3 * ulp) / 2))).toBe(0xbf82);
    expect(f32ToBf16Bits(3.4028234663852886e38)).toBe(0x7f80); // f32 max rounds up to Inf
    expect(f32ToBf16Bits(Number.NEGATIVE_INFINITY)).toBe(0xff80);
    expect(bf16BitsToF32(0x0001)).toBe(2 ** -133); // bf16 subnormal
    expect(f32ToBf16Bits(2 ** -133)).toBe(0x0001);
    const nanLow = new Float32Array(new Uint32Array([0x7f800001]).buffer)[0];
    expect(isBf16NaN(f32ToBf16Bits(nanLow))).toBe(true);
  });
});

describe('float64 inputs round once (no double rounding through f32)', () => {
  it('values a hair above or below a 16-bit tie round the right way', () => {
    // f32 would first round 1 + 2^-11 + 2^-40 to the tie 1 + 2^-11, and RNE would then go to 1.
    expect(f32ToF16Bits(1 + 2 ** -11 + 2 ** -40)).toBe(0x3c01);
    expect(f32ToF16Bits(1 + 2 ** -11 - 2 ** -40)).toBe(0x3c00);
    expect(f32ToF16Bits(-(1 + 3 * 2 ** -11 - 2 ** -40))).toBe(0xbc01);
    expect(f32ToF16Bits(2 ** -25 + 2 ** -60)).toBe(0x0001); // subnormal tie, just above
    expect(f32ToBf16Bits(1 + 2 ** -8 + 2 ** -40)).toBe(0x3f81);
    expect(f32ToBf16Bits(1 + 2 ** -8 - 2 ** -40)).toBe(0x3f80);
    expect(f32ToBf16Bits(-(1 + 3 * 2 ** -8 - 2 ** -40))).toBe(0xbf81);
    expect(roundTo('f16', 1 + 2 ** -11 + 2 ** -40)).toBe(1 + 2 ** -10);
  });

  it('agrees with exact rounding on random float64 values', () => {
    const seed = Math.floor(Math.random() * 2 ** 31);
    let s = seed;
    const next = () => ((s = (Math.imul(s, 1103515245) + 12345) >>> 0) / 2 ** 32);
    for (let t = 0; t < 20000; t++) {
      const x = (next() - 0.5) * 2 ** Math.floor(next() * 40 - 20);
      for (const [dt, enc, dec] of [
        ['f16', f32ToF16Bits, f16BitsToF32],
        ['bf16', f32ToBf16Bits, bf16BitsToF32],
      ] as const) {
        const h = enc(x);
        const y = dec(h);
        if (!Number.isFinite(y)) continue; // overflow to Inf is tested above
        // exact RNE: no representable neighbour is strictly closer, and a tie goes to the even pattern
        const lo = dec(h - 1 >= 0 ? h - 1 : h);
        const up = dec(h + 1);
        for (const nb of [lo, up]) {
          if (!Number.isFinite(nb) || Number.isNaN(nb)) continue;
          const dy = Math.abs(y - x);
          const dn = Math.abs(nb - x);
          if (dn < dy || (dn === dy && nb !== y && (h & 1) === 1)) {
            expect.fail(`${dt}: ${x} -> 0x${h.toString(16)} (${y}) but ${nb} is nearer or the even tie (seed ${seed})`);
          }
        }
      }
    }
  });
});

describe('encode, decode, roundTo, host tensors', () => {
  it('encode/decode agree with the scalar conversions and roundTo', () => {
    const vals = [0.1, -3.75, 1e-6, 70000, 2 ** -24];
    for (const dt of ['f16', 'bf16'] as const) {
      const enc = encode(dt, vals);
      expect(enc).toBeInstanceOf(Uint16Array);
      const dec = decode(dt, enc);
      vals.forEach((v, i) => {
        expect(dec[i]).toBe(roundTo(dt, v));
      });
    }
    expect(roundTo('f16', 70000)).toBe(Number.POSITIVE_INFINITY);
    expect(roundTo('f32', 0.1)).toBe(Math.fround(0.1));
    expect(decode('f32', encode('f32', vals))).toEqual(Float32Array.from(vals));
  });

  it('hostTensor, wrapHost, castHost and assertFinite reject bad input with typed errors', () => {
    expect(code(() => hostTensor('f32', [2, 2], [1, 2, 3]))).toBe('SHAPE_MISMATCH');
    expect(code(() => hostTensor('f64' as never, [1], [1]))).toBe('DTYPE_MISMATCH');
    expect(code(() => hostTensor('f32', [2, -1], []))).toBe('SHAPE_MISMATCH');
    expect(code(() => wrapHost('f16', [2], new Float32Array(2)))).toBe('DTYPE_MISMATCH');
    expect(code(() => wrapHost('f32', [2], new Uint16Array(2)))).toBe('DTYPE_MISMATCH');
    expect(code(() => wrapHost('bf16', [3], new Uint16Array(2)))).toBe('SHAPE_MISMATCH');
    const t = hostTensor('f32', [3], [1.5, -2, 1e-3]);
    const h = castHost(t, 'bf16');
    expect(h.dtype).toBe('bf16');
    expect(Array.from(decode('bf16', h.data))).toEqual([1.5, -2, roundTo('bf16', 1e-3)]);
    expect(code(() => assertFinite(t, 'q'))).toBeUndefined();
    expect(code(() => assertFinite(hostTensor('f16', [2], [1, 1e6]), 'k'))).toBe('NON_FINITE'); // 1e6 overflows f16
    expect(code(() => assertFinite(hostTensor('f32', [2], [Number.NaN, 1]), 'q'))).toBe('NON_FINITE');
  });
});
