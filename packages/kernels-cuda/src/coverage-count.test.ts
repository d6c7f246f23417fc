/**
 * The arithmetic of select.cu's coverage_select, checked on the CPU: a line-for-line mirror of
 * its count (cov_count: a radix select over the float32 patterns, 8 bits a pass, the masses
 * of the scores >= 2^-29 added as integers in units of 2^-52) against @crisp/select's
 * coverageTokenCount, the definition (float64 running sums of the sorted scores), on softmax
 * rows with sinks, ties, zeros and scores below 2^-29. The kernel itself runs in the
 * conformance suite on a GPU (deviceSelect and devicePlan cases of the flexPrefill rules).
 */
import { mulberry32 } from '@crisp/core';
import { coverageTokenCount } from '@crisp/select';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';

const EXACT_BYTE = 49;

/** cov_fixed: a pattern of a score in [2^-29, 1] times 2^52 (exact in a double: below 2^53). */
function fixed(x: number): number {
  return ((x & 0x7fffff) | 0x800000) * 2 ** ((x >>> 23) - 98);
}

/** cov_count: the count, or −1 where the kernel gives up (the head then keeps every block). */
function deviceCount(a: Float32Array, gamma: number): number {
  const bits = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const T = Math.floor(gamma * 2 ** 52);
  let prefix = 0;
  let M = 0;
  let C = 0;
  for (let pass = 0; pass < 4; pass++) {
    const shift = 24 - 8 * pass;
    const cnt = new Float64Array(256);
    const mass = new Float64Array(256);
    for (let i = 0; i < bits.length; i++) {
      const x = bits[i];
      if (pass === 0) {
        if (x > 0x3f800000) return -1;
        const d = x >>> 24;
        cnt[d]++;
        if (d >= EXACT_BYTE) mass[d] += fixed(x);
      } else if (x >>> (shift + 8) === prefix) {
        const d = (x >>> shift) & 255;
        cnt[d]++;
        mass[d] += fixed(x);
      }
    }
    let cross = -1;
    for (let d = 255; d >= (pass === 0 ? EXACT_BYTE : 0); d--) {
      if (M + mass[d] > T) {
        cross = d;
        break;
      }
      M += mass[d];
      C += cnt[d];
    }
    if (cross < 0) {
      let tiny = 0;
      for (let d = 0; d < EXACT_BYTE; d++) tiny += cnt[d];
      return pass === 0 && tiny === 0 ? C + 1 : -1;
    }
    prefix = pass === 0 ? cross : ((prefix << 8) | cross) >>> 0;
  }
  return C + Math.floor((T - M) / fixed(prefix)) + 1;
}

/** A softmax-like row of n scores: a sink, some spikes, a background, exact ties and tiny tails. */
function row(n: number, seed: number): Float32Array {
  const rnd = mulberry32(seed);
  const logits = new Float64Array(n);
  const spread = 1 + 6 * rnd();
  for (let i = 0; i < n; i++) logits[i] = spread * (rnd() - 0.5);
  logits[0] += 8 + 10 * rnd(); // the sink
  for (let s = 0; s < 1 + Math.floor(rnd() * 20); s++) logits[Math.floor(rnd() * n)] += 3 + 6 * rnd();
  // a run of equal scores, and a far tail (scores below 2^-29 after the softmax)
  const tieAt = Math.floor(rnd() * (n - 64));
  for (let i = 0; i < 64; i++) logits[tieAt + i] = logits[tieAt];
  for (let i = 0; i < n; i += 7) if (rnd() < 0.3) logits[i] -= 40;
  let max = -Infinity;
  for (const x of logits) max = Math.max(max, x);
  let sum = 0;
  for (let i = 0; i < n; i++) sum += Math.exp(logits[i] - max);
  return Float32Array.from(logits, (x) => Math.exp(x - max) / sum);
}

describe("coverage_select's count (select.cu)", () => {
  it('equals the definition on softmax rows for every γ up to 0.99, and never gives up there', () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 2 ** 31 - 1 }), fc.integer({ min: 4096, max: 40000 }), fc.double({ min: 0.05, max: 0.99, noNaN: true }), (seed, n, gamma) => {
        const a = row(n, seed);
        const got = deviceCount(a, gamma);
        expect(got, `seed ${seed}, n ${n}, γ ${gamma}`).toBeGreaterThan(0);
        expect(got, `seed ${seed}, n ${n}, γ ${gamma}`).toBe(coverageTokenCount(a, gamma));
      }),
      { numRuns: 60 },
    );
  });

  it('counts through ties: the crossing inside a run of equal scores, and n + 1 when γ is never passed', () => {
    // 1000 equal scores of 2^-10 (sum 1000 / 1024): γ 0.5 is passed at the 513th
    const flat = new Float32Array(1000).fill(2 ** -10);
    expect(deviceCount(flat, 0.5)).toBe(coverageTokenCount(flat, 0.5));
    expect(deviceCount(flat, 0.5)).toBe(513);
    // the whole row holds less than γ and every score is exact: n + 1, as the definition
    expect(deviceCount(flat, 0.99)).toBe(coverageTokenCount(flat, 0.99));
    expect(deviceCount(flat, 0.99)).toBe(1001);
  });

  it('gives up (every block kept) on what is not a softmax score, or where the crossing lies among scores below 2^-29', () => {
    expect(deviceCount(Float32Array.from([0.5, 2, 0.1]), 0.5)).toBe(-1);
    expect(deviceCount(Float32Array.from([0.5, -0.25, 0.1]), 0.5)).toBe(-1);
    expect(deviceCount(Float32Array.from([0.5, Number.NaN]), 0.5)).toBe(-1);
    // mass below γ with tiny scores present: the sums there are not exact, so no answer
    expect(deviceCount(Float32Array.from([0.25, 2 ** -40, 2 ** -41]), 0.5)).toBe(-1);
  });
});
