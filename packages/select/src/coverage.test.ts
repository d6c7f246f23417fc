import { isCrispError } from '@crisp/core';
import { describe, expect, it } from 'vitest';
import { direction, freshSeed, rng } from './__fixtures__/scores.js';
import { coverageTokenCount, cumulativeCoverage, globalCoverage } from './index.js';

const B = 64;

function errCode(f: () => unknown): string {
  try {
    f();
  } catch (e) {
    expect(isCrispError(e)).toBe(true);
    return (e as { code: string }).code;
  }
  return 'no error';
}

/** The spec's rule written out naively (float64 sums over a sorted copy). */
function expectedCoverage(tokens: Float32Array, gamma: number, B: number, kBlocks: number): number[] {
  const n = tokens.length;
  const Nb = Math.ceil(n / B);
  const sorted = Array.from(tokens).sort((a, b) => b - a);
  let s = 0;
  let count = 0;
  for (const x of sorted) {
    s += x;
    if (s <= gamma) count++;
    else break;
  }
  count += 1;
  const blocks = Math.min(Nb, Math.max(kBlocks, Math.floor(count / B) + 1));
  const p = new Float64Array(Nb);
  for (let j = 0; j < n; j++) p[Math.floor(j / B)] += tokens[j];
  const order = [...p.keys()].filter((J) => J !== 0).sort((x, y) => p[y] - p[x] || x - y);
  return [0, ...order.slice(0, blocks - 1)].sort((x, y) => x - y);
}

/** The count by docs/ALGORITHM.md's definition: sort descending in float64, the prefix with sum <= γ, plus one. */
function byDefinition(t: ArrayLike<number>, gamma: number): number {
  const sorted = Float64Array.from(t).sort().reverse();
  let sum = 0;
  let count = 0;
  for (const x of sorted) {
    sum += x;
    if (sum > gamma) break;
    count++;
  }
  return count + 1;
}

describe('cumulativeCoverage', () => {
  it('matches the spec rule on fresh random token scores', () => {
    const seed = freshSeed();
    const r = rng(seed);
    for (let t = 0; t < 12; t++) {
      const n = 1000 + Math.floor(r() * 3000);
      const tokens = new Float32Array(n);
      const sharp = 1 + 6 * r();
      let s = 0;
      for (let j = 0; j < n; j++) {
        tokens[j] = Math.exp(sharp * (r() + r() - 1));
        s += tokens[j];
      }
      for (let j = 0; j < n; j++) tokens[j] /= s;
      const Nb = Math.ceil(n / B);
      const p = new Float64Array(Nb);
      for (let j = 0; j < n; j++) p[Math.floor(j / B)] += tokens[j];
      for (const gamma of [0.5, 0.9, 0.95]) {
        const got = cumulativeCoverage({ gamma, kMin: 2 * B }).select(direction(p, n, B, tokens));
        expect(Array.from(got), `seed ${seed} trial ${t} gamma ${gamma}`).toEqual(expectedCoverage(tokens, gamma, B, 2));
      }
    }
  });

  it('the bucketed count equals the full-sort definition bit for bit (n >= 4096: sink, heavy tail, ties, zeros)', () => {
    const seed = freshSeed();
    const r = rng(seed);
    for (let trial = 0; trial < 24; trial++) {
      const n = 4096 + Math.floor(r() * 30000);
      const t = new Float32Array(n);
      const kind = trial % 4;
      for (let i = 0; i < n; i++) {
        const u = r();
        // heavy tail over many decades; kind 1 quantised (ties); kind 2 many exact zeros
        let x = Math.exp(-30 * u * u) * 1e-3;
        if (kind === 1) x = Math.round(x * 1e5) / 1e5;
        if (kind === 2 && u < 0.5) x = 0;
        t[i] = x;
      }
      let total = 0;
      for (const x of t) total += x;
      const sink = kind === 3 ? 0.2 : 0.8; // kind 3: the prefix is most of the array
      t[0] = (sink * total) / (1 - sink);
      total += t[0];
      for (let i = 0; i < n; i++) t[i] /= total;
      for (const gamma of [0.5, 0.8, 0.9, 0.95, 0.99]) {
        expect(coverageTokenCount(t, gamma), `seed ${seed} trial ${trial} kind ${kind} gamma ${gamma}`).toBe(byDefinition(t, gamma));
      }
    }
  });

  it('softmax-like rows (every value far above 2^-29, the crossing bucket full of ties) count by the definition', () => {
    // The float32 count's exact-sum path: no sort above the crossing bucket. Rows like the
    // proxy's token scores: a sink, a few strong tokens, noise over the rest; some rows
    // quantised so the crossing bucket holds many equal values; one row summing to 3.
    const seed = freshSeed();
    const r = rng(seed);
    for (let trial = 0; trial < 16; trial++) {
      const n = 4096 + Math.floor(r() * 60000);
      const t = new Float32Array(n);
      for (let i = 0; i < n; i++) {
        // logits ~ N(0, s²) by Box-Muller, s in [0.2, 2]: values within a few decades
        const g = Math.sqrt(-2 * Math.log(1 - r())) * Math.cos(2 * Math.PI * r());
        t[i] = Math.exp((0.2 + 1.8 * (trial / 16)) * g);
        if (trial % 4 === 1) t[i] = Math.round(t[i] * 8) / 8 + 1 / 8; // ties
      }
      for (let i = 1; i < 9; i++) t[Math.floor(r() * n)] *= 200;
      let total = 0;
      for (const x of t) total += x;
      t[0] = total * (trial % 3 === 0 ? 4 : 0.3); // a sink holding 80% or 23% of the mass
      total += t[0];
      const scaleTo = trial === 5 ? 3 : 1;
      for (let i = 0; i < n; i++) t[i] = (t[i] / total) * scaleTo;
      for (const gamma of [0.1, 0.5, 0.8, 0.9, 0.95, 0.99]) {
        expect(coverageTokenCount(t, gamma), `seed ${seed} trial ${trial} gamma ${gamma}`).toBe(byDefinition(t, gamma));
      }
    }
  });

  it('rows whose crossing lies among values near or below 2^-29 count by the definition', () => {
    const n = 8192;
    for (const tiny of [2 ** -29, 2 ** -29 * (1 - 2 ** -10), 2 ** -31, 1e-12]) {
      const t = new Float32Array(n);
      // the sink holds just under γ; the rest are `tiny` with a few larger ones: the crossing
      // lands among the tiny values (or just at the 2^-29 boundary)
      t[3] = 0.5 - 100 * tiny;
      for (let i = 4; i < n; i++) t[i] = tiny * (1 + (i % 7) / 8);
      for (const gamma of [0.5, 0.5 - 50 * tiny]) {
        expect(coverageTokenCount(t, gamma), `tiny ${tiny} gamma ${gamma}`).toBe(byDefinition(t, gamma));
      }
    }
    // random rows of the same kind: large values just short of γ, then a tail of mixed tiny
    // magnitudes (2^-34 .. 2^-26, or all below 2^-29: 2^-40 .. 2^-29.5; some tied) in which
    // the sum crosses γ
    const seed = freshSeed();
    const r = rng(seed);
    for (let trial = 0; trial < 16; trial++) {
      const gamma = 0.5 + 0.45 * r();
      const below = trial % 4 >= 2;
      const t = new Float32Array(4096 + Math.floor(r() * 20000));
      for (let i = 0; i < t.length; i++) {
        const x = below ? 2 ** (-40 + 10.5 * r()) : 2 ** (-34 + 8 * r());
        t[i] = trial % 2 ? Math.fround(2 ** Math.round(Math.log2(x))) : x;
      }
      const short = below ? (10 + 200 * r()) * 2 ** -34 : (10 + 1000 * r()) * 2 ** -30;
      for (let j = 0; j < 5; j++) t[j * 97] = (gamma - short) / 5;
      expect(coverageTokenCount(t, gamma), `seed ${seed} trial ${trial}`).toBe(byDefinition(t, gamma));
    }
    // a crossing bucket whose mass reaches 2 (a row that is not a distribution): not summed exactly
    const u = new Float32Array(8192).fill(1e-6);
    for (let j = 0; j < 12; j++) u[j * 100] = 0.25;
    expect(coverageTokenCount(u, 0.95)).toBe(byDefinition(u, 0.95));
  });

  it('float32 scores with -0 or a negative value take the full sort and still count by the definition', () => {
    const n = 8192;
    const t = new Float32Array(n).fill(0.5 / n);
    t[7] = 0.5;
    t[100] = -0;
    expect(coverageTokenCount(t, 0.9)).toBe(byDefinition(t, 0.9));
    t[100] = -1e-9;
    expect(coverageTokenCount(t, 0.9)).toBe(coverageTokenCount(Float64Array.from(t), 0.9));
  });

  it('hand example: the count, the +1, block 0 forced in', () => {
    // n = 8, B = 2: sorted tokens 0.4, 0.3, 0.1, 0.1, 0.05, 0.05, 0, 0.
    const tokens = Float32Array.from([0.05, 0, 0.4, 0.3, 0.1, 0.1, 0.05, 0]);
    expect(coverageTokenCount(tokens, 0.5)).toBe(2); // 0.4 <= 0.5, 0.7 > 0.5 -> 1 + 1
    expect(coverageTokenCount(tokens, 0.8)).toBe(3); // 0.4, 0.7 <= 0.8 -> 2 + 1
    const p = Float64Array.from([0.05, 0.7, 0.2, 0.05]);
    // gamma 0.8: count 3 -> floor(3/2) + 1 = 2 blocks: block 0 and the best other (1).
    expect(Array.from(cumulativeCoverage({ gamma: 0.8, kMin: 2 }).select(direction(p, 8, 2, tokens)))).toEqual([0, 1]);
    // gamma 0.96: 5 tokens sum to 0.95 <= 0.96 -> 6 -> 4 blocks (clipped to Nb = 4).
    expect(Array.from(cumulativeCoverage({ gamma: 0.96, kMin: 2 }).select(direction(p, 8, 2, tokens)))).toEqual([0, 1, 2, 3]);
    // kMin = 3 blocks lifts the 2 of gamma 0.5 to 3: block 0, then 1 and 2.
    expect(Array.from(cumulativeCoverage({ gamma: 0.5, kMin: 6 }).select(direction(p, 8, 2, tokens)))).toEqual([0, 1, 2]);
  });

  it('breaks ties among equal block scores toward the lower index', () => {
    // n = 8, B = 2; blocks 1, 2, 3 tie at 0.3. gamma 0.2: 0.15 <= 0.2 -> count 2 -> 2 blocks: 0 and 1.
    const tokens = Float32Array.from([0.05, 0.05, 0.15, 0.15, 0.15, 0.15, 0.15, 0.15]);
    const p = Float64Array.from([0.1, 0.3, 0.3, 0.3]);
    expect(Array.from(cumulativeCoverage({ gamma: 0.2, kMin: 2 }).select(direction(p, 8, 2, tokens)))).toEqual([0, 1]);
    // kMin = 3 blocks: 0, 1, 2 (3 loses the tie).
    expect(Array.from(cumulativeCoverage({ gamma: 0.2, kMin: 6 }).select(direction(p, 8, 2, tokens)))).toEqual([0, 1, 2]);
  });

  it('declares needs.tokenScores and rejects a call without token scores', () => {
    const sel = cumulativeCoverage();
    expect(sel.needs?.tokenScores).toBe(true);
    const p = Float64Array.from([0.5, 0.2, 0.2, 0.1]);
    expect(errCode(() => sel.select(direction(p, 4 * 128, 128)))).toBe('INVALID_ARGUMENT');
    expect(errCode(() => sel.select(direction(p, 4 * 128, 128, new Float32Array(10).fill(0.1))))).toBe('INVALID_ARGUMENT');
    const nan = new Float32Array(512).fill(1 / 512);
    nan[3] = Number.NaN;
    expect(errCode(() => sel.select(direction(p, 512, 128, nan)))).toBe('NON_FINITE');
    // long rows (the float32 count's path): NaN and Inf named by index, wherever they are
    const long = Float64Array.from([0.5, 0.2, 0.2, 0.1]);
    for (const [at, bad] of [
      [0, Number.NaN],
      [5000, Number.POSITIVE_INFINITY],
      [8191, Number.NaN],
    ] as const) {
      const t = new Float32Array(8192).fill(1 / 8192);
      t[at] = bad;
      let err: unknown;
      try {
        cumulativeCoverage({ kMin: 2048 }).select(direction(long, 8192, 2048, t));
      } catch (e) {
        err = e;
      }
      expect(err).toMatchObject({ code: 'NON_FINITE', details: { index: at } });
    }
  });

  it('validates gamma and kMin', () => {
    for (const gamma of [0, 1, -0.1, 1.5, Number.NaN]) expect(errCode(() => cumulativeCoverage({ gamma }))).toBe('INVALID_ARGUMENT');
    expect(errCode(() => cumulativeCoverage({ kMin: -128 }))).toBe('INVALID_ARGUMENT');
    const p = Float64Array.from([0.5, 0.2, 0.2, 0.1]);
    const t = new Float32Array(512).fill(1 / 512);
    expect(errCode(() => cumulativeCoverage({ kMin: 200 }).select(direction(p, 512, 128, t)))).toBe('INVALID_ARGUMENT');
  });
});

describe('globalCoverage', () => {
  it('carries γ and kMin for the backend primitive and validates them', () => {
    const pe = globalCoverage();
    expect(pe.gamma).toBe(0.95);
    expect(pe.kMin).toBe(1024);
    expect(globalCoverage({ gamma: 0.9, kMin: 512 })).toMatchObject({ gamma: 0.9, kMin: 512 });
    for (const gamma of [0, 1, 2, Number.NaN]) expect(errCode(() => globalCoverage({ gamma }))).toBe('INVALID_ARGUMENT');
    expect(errCode(() => globalCoverage({ kMin: 0 }))).toBe('INVALID_ARGUMENT');
    expect(errCode(() => globalCoverage({ kMin: 1.5 }))).toBe('INVALID_ARGUMENT');
  });
});
