/**
 * The arithmetic of select.cu's coverage_select, checked on the CPU: line-for-line mirrors of
 * its count (cov_count, as one CTA or a cluster of CTAs splitting the scores in stretches,
 * with its warp-level adds: a radix select over the float32 patterns, 8 bits a pass, the masses
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

const SEL_T = 256;

/**
 * One pass's histograms as the CTAs of a cluster of CL build them (CL = 1: coverage_select's
 * one CTA): CTA r's warps read the stretches of 32 scores at r·SEL_T + 32·w + CL·SEL_T·j; a
 * warp whose 32 lanes all take a score of the same digit adds 32 and the warp's mass once,
 * otherwise each lane adds its own; then every CTA sums all CL histograms (and the flags of a
 * score that is not a softmax score). Returns null where some CTA saw such a score.
 */
function clusterHistograms(bits: Uint32Array, pass: number, prefix: number, CL: number): { cnt: Float64Array; mass: Float64Array } | null {
  const n = bits.length;
  const shift = 24 - 8 * pass;
  const cnt = new Float64Array(256);
  const mass = new Float64Array(256);
  let bad = false;
  for (let r = 0; r < CL; r++) {
    for (let w = 0; w < SEL_T / 32; w++) {
      for (let base = r * SEL_T + 32 * w; base < n; base += CL * SEL_T) {
        const lanes = Array.from({ length: 32 }, (_, lane) => {
          const i = base + lane;
          const x = i < n ? bits[i] : 0;
          let take: boolean;
          let d: number;
          let m = 0;
          if (pass === 0) {
            if (i < n && x > 0x3f800000) bad = true;
            take = i < n && x <= 0x3f800000;
            d = x >>> 24;
            if (take && d >= EXACT_BYTE) m = fixed(x);
          } else {
            take = i < n && x >>> (shift + 8) === prefix;
            d = (x >>> shift) & 255;
            if (take) m = fixed(x);
          }
          return { take, d, m };
        });
        const d0 = lanes[0].d;
        if (lanes.every((l) => l.take && l.d === d0)) {
          cnt[d0] += 32;
          mass[d0] += lanes.reduce((acc, l) => acc + l.m, 0);
        } else {
          for (const l of lanes) {
            if (!l.take) continue;
            cnt[l.d]++;
            mass[l.d] += l.m;
          }
        }
      }
    }
  }
  return bad ? null : { cnt, mass };
}

/** cov_count: the count, or −1 where the kernel gives up (the head then keeps every block). */
function deviceCount(a: Float32Array, gamma: number, CL = 1): number {
  const bits = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const T = Math.floor(gamma * 2 ** 52);
  let prefix = 0;
  let M = 0;
  let C = 0;
  for (let pass = 0; pass < 4; pass++) {
    const h = clusterHistograms(bits, pass, prefix, CL);
    if (h === null) return -1;
    const { cnt, mass } = h;
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

  it('counts the same as a cluster of eight CTAs (coverage_select_c8), lengths off the stretches included', () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 2 ** 31 - 1 }), fc.integer({ min: 2000, max: 30000 }), fc.double({ min: 0.05, max: 0.99, noNaN: true }), (seed, n, gamma) => {
        const a = row(n, seed);
        const want = coverageTokenCount(a, gamma);
        expect(deviceCount(a, gamma, 8), `seed ${seed}, n ${n}, γ ${gamma}`).toBe(want);
        expect(deviceCount(a, gamma, 3), `seed ${seed}, n ${n}, γ ${gamma}`).toBe(want);
      }),
      { numRuns: 25 },
    );
    // a score above 1 in one CTA's stretch only: every CTA of the cluster gives up
    const a = row(9000, 5);
    a[8 * 256 + 7] = 1.5;
    expect(deviceCount(a, 0.9, 8)).toBe(-1);
    expect(deviceCount(a, 0.9, 1)).toBe(-1);
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
