/**
 * The arithmetic of select.cu's coverage_select, checked on the CPU: line-for-line mirrors of
 * its count (cov_count: a radix select over the float32 patterns, 8 bits a pass, the masses
 * of the scores >= 2^-29 added as integers in units of 2^-52) and of its block choice
 * (cov_topk_bits: a radix select over the f64 scores' ordered keys, ties from the lower
 * index), against @crisp/select's coverageTokenCount (the definition: float64 running sums of
 * the sorted scores) and cumulativeCoverage's lists, on softmax rows with sinks, ties, zeros
 * and scores below 2^-29. The kernel itself runs in the conformance suite on a GPU
 * (devicePlanCoverage).
 */
import { mulberry32 } from '@crisp/core';
import { coverageTokenCount, cumulativeCoverage } from '@crisp/select';
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

/** cov_key: an f64 score's pattern mapped so that unsigned order is the value's order. */
function key(v: number): bigint {
  const b = new BigUint64Array(new Float64Array([v]).buffer)[0];
  return b >> 63n ? ~b & 0xffffffffffffffffn : b | 0x8000000000000000n;
}

/** cov_topk_bits: the k best of blocks 1..Nb−1 (k < Nb − 1), as the set of their indices. */
function topKBits(p: Float64Array, k: number): Set<number> {
  const keys = Array.from(p, key);
  let prefix = 0n;
  let need = k;
  for (let pass = 0; pass < 8; pass++) {
    const shift = BigInt(56 - 8 * pass);
    const cnt = new Array<number>(256).fill(0);
    for (let J = 1; J < p.length; J++) {
      if (pass === 0 || keys[J] >> (shift + 8n) === prefix) cnt[Number((keys[J] >> shift) & 255n)]++;
    }
    let d = 255;
    for (; d > 0 && cnt[d] < need; d--) need -= cnt[d];
    prefix = (prefix << 8n) | BigInt(d);
  }
  const out = new Set<number>();
  for (let J = 1; J < p.length; J++) if (keys[J] > prefix) out.add(J);
  for (let J = 1; J < p.length && need > 0; J++) {
    if (keys[J] === prefix) {
      out.add(J);
      need--;
    }
  }
  return out;
}

/** coverage_select on one VS head's direction: block 0 and the best blocks up to the count's budget. */
function deviceList(p: Float64Array, a: Float32Array, gamma: number, B: number, kBlocks: number): number[] {
  const Nb = p.length;
  const count = deviceCount(a, gamma);
  const blocks = Math.min(Nb, Math.max(kBlocks, count < 0 ? Nb : Math.floor(count / B) + 1));
  const bits = blocks >= Nb ? new Set(Array.from({ length: Nb }, (_, J) => J)) : blocks > 1 ? topKBits(p, blocks - 1) : new Set<number>();
  bits.add(0);
  return [...bits].sort((x, y) => x - y);
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

  it("keeps the selector's blocks: block 0 and the best by score, ties toward the lower index", () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 2 ** 31 - 1 }), fc.constantFrom(64, 128), fc.double({ min: 0.3, max: 0.99, noNaN: true }), (seed, B, gamma) => {
        const rnd = mulberry32(seed ^ 0x5bd1e995);
        const n = 4096 + Math.floor(rnd() * 30000);
        const Nb = Math.ceil(n / B);
        const a = row(n, seed);
        // block scores with ties (a few levels) and a heavy first block
        const p = Float64Array.from({ length: Nb }, () => Math.floor(rnd() * 6) / 64 + (rnd() < 0.5 ? rnd() * 1e-3 : 0));
        p[0] = 0.5;
        const kMin = B * (1 + Math.floor(rnd() * 4));
        const sel = cumulativeCoverage({ gamma, kMin });
        const want = Array.from(sel.select({ direction: 'vertical', head: 0, blockScores: p, tokenScores: a, blockSize: B, n }));
        expect(deviceList(p, a, gamma, B, kMin / B), `seed ${seed}, B ${B}, γ ${gamma}`).toEqual(want);
      }),
      { numRuns: 40 },
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
