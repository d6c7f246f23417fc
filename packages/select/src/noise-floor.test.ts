import { isCrispError } from '@crisp/core';
import { describe, expect, it } from 'vitest';
import { direction, freshSeed, rng } from './__fixtures__/scores.js';
import { meanBackground, noiseFloor } from './index.js';

const B = 128;

/** The selection computed the slow, obvious way, straight from the spec. */
function expectedNoiseFloor(p: Float64Array, alpha: number, kBlocks: number): number[] {
  const Nb = p.length;
  const mu = Math.max(1 - p[0] - p[Nb - 1], 0) / (Nb - 2);
  let keep = [...p.keys()].filter((J) => p[J] > alpha * mu);
  if (keep.length < kBlocks) {
    keep = [...p.keys()].sort((x, y) => p[y] - p[x] || x - y).slice(0, kBlocks);
  }
  return [...new Set([...keep, 0, Nb - 1])].sort((x, y) => x - y);
}

function randomBlocks(seed: number, Nb: number): Float64Array {
  const r = rng(seed);
  const p = new Float64Array(Nb);
  // Heavy-tailed masses (exp of Gaussian-ish logits) with a big sink, normalised to 1.
  for (let J = 0; J < Nb; J++) p[J] = Math.exp(3 * (r() + r() + r() - 1.5));
  p[0] = 40 * Nb * r() + Nb;
  let s = 0;
  for (const x of p) s += x;
  return p.map((x) => x / s);
}

describe('noiseFloor', () => {
  it('keeps exactly {J : p[J] > α μ} ∪ anchors on fresh random heads', () => {
    const seed = freshSeed();
    for (let t = 0; t < 20; t++) {
      const Nb = 16 + ((seed + t * 7919) % 200);
      const p = randomBlocks(seed + t, Nb);
      for (const alpha of [0.75, 1, 1.25]) {
        const got = Array.from(noiseFloor({ alpha, kMin: 2 * B }).select(direction(p, Nb * B - 5, B)));
        expect(got, `seed ${seed} trial ${t} alpha ${alpha}`).toEqual(expectedNoiseFloor(p, alpha, 2));
        // kMin of 32 blocks: the top-k fallback on the heads where fewer pass
        const got32 = Array.from(noiseFloor({ alpha, kMin: 32 * B }).select(direction(p, Nb * B - 5, B)));
        expect(got32, `seed ${seed} trial ${t} alpha ${alpha} kMin 32 blocks`).toEqual(expectedNoiseFloor(p, alpha, 32));
      }
    }
  });

  it('hand example: μ, the strict >, anchors kept below the floor', () => {
    // Nb = 6: ends 0.5 and 0.1, background 0.4 over 4 blocks -> μ = 0.1.
    const p = Float64Array.from([0.5, 0.2, 0.1, 0.05, 0.05, 0.1]);
    expect(meanBackground(p)).toBeCloseTo(0.1, 15);
    // α = 1: only block 1 is > 0.1 (block 2 equals μ and is dropped); 2 of kMin/B = 1 pass.
    expect(Array.from(noiseFloor({ alpha: 1, kMin: B }).select(direction(p, 6 * B, B)))).toEqual([0, 1, 5]);
    // α = 0.4: threshold 0.04, every block passes.
    expect(Array.from(noiseFloor({ alpha: 0.4, kMin: B }).select(direction(p, 6 * B, B)))).toEqual([0, 1, 2, 3, 4, 5]);
    // μ = 0.1 / 4 = 0.025: 0.04 and 0.03 pass; the last block is kept though it is the smallest.
    const q = Float64Array.from([0.9, 0.04, 0.03, 0.02, 0.01, 0]);
    expect(Array.from(noiseFloor({ kMin: B }).select(direction(q, 6 * B, B)))).toEqual([0, 1, 2, 5]);
  });

  it('falls back to the kMin / B best (ties toward the lower index) when too few pass', () => {
    // One dominant background block lifts μ so nothing else passes; ties at 0.01.
    const p = Float64Array.from([0.5, 0.01, 0.01, 0.4, 0.01, 0.01, 0.01, 0.05]);
    const got = Array.from(noiseFloor({ kMin: 4 * B }).select(direction(p, 8 * B, B)));
    // pass: {0, 3} (0.4 > μ = 0.45/6) -> 2 < 4 -> top 4: 0, 3, 7, 1 (1 wins the tie) -> ∪ {0, 7}
    expect(got).toEqual([0, 1, 3, 7]);
  });

  it('μ = 0 when the anchors hold all the mass: any positive block passes', () => {
    const p = Float64Array.from([0.75, 0, 1e-9, 0, 0.25]);
    expect(meanBackground(p)).toBe(0);
    expect(Array.from(noiseFloor({ kMin: B }).select(direction(p, 5 * B, B)))).toEqual([0, 2, 4]);
  });

  it('keeps every block when Nb <= 2 (no background exists)', () => {
    expect(Array.from(noiseFloor().select(direction(Float64Array.from([0.6, 0.4]), 200, B)))).toEqual([0, 1]);
    expect(Array.from(noiseFloor().select(direction(Float64Array.from([1]), 100, B)))).toEqual([0]);
  });

  it('is deterministic and handles a partial last block', () => {
    const seed = freshSeed();
    const p = randomBlocks(seed, 77);
    const a = noiseFloor().select(direction(p, 76 * B + 3, B));
    const b = noiseFloor().select(direction(Float64Array.from(p), 76 * B + 3, B));
    expect(Array.from(a), `seed ${seed}`).toEqual(Array.from(b));
    expect(a[a.length - 1]).toBe(76);
  });

  it('rejects bad parameters and inputs with typed errors', () => {
    const code = (f: () => unknown) => {
      try {
        f();
      } catch (e) {
        expect(isCrispError(e)).toBe(true);
        return (e as { code: string }).code;
      }
      return 'no error';
    };
    expect(code(() => noiseFloor({ alpha: 0 }))).toBe('INVALID_ARGUMENT');
    expect(code(() => noiseFloor({ alpha: -1 }))).toBe('INVALID_ARGUMENT');
    expect(code(() => noiseFloor({ alpha: Number.NaN }))).toBe('INVALID_ARGUMENT');
    expect(code(() => noiseFloor({ kMin: 0 }))).toBe('INVALID_ARGUMENT');
    expect(code(() => noiseFloor({ kMin: 100.5 }))).toBe('INVALID_ARGUMENT');
    const p = Float64Array.from([0.5, 0.2, 0.2, 0.1]);
    expect(code(() => noiseFloor({ kMin: 1000 }).select(direction(p, 4 * B, B)))).toBe('INVALID_ARGUMENT');
    expect(code(() => noiseFloor().select(direction(p, 5 * B, B)))).toBe('SHAPE_MISMATCH');
    expect(code(() => noiseFloor().select(direction(Float64Array.from([0.5, Number.NaN, 0.2, 0.1]), 4 * B, B)))).toBe(
      'NON_FINITE',
    );
    expect(code(() => noiseFloor().select(direction(p, 4 * B, 0)))).toBe('INVALID_ARGUMENT');
  });
});

describe('the README example', () => {
  it('keeps [0, 2, 6, 7]', () => {
    const p = Float64Array.from([0.9, 0.004, 0.03, 0.001, 0.002, 0.003, 0.02, 0.04]);
    const kept = noiseFloor({ alpha: 1, kMin: 128 }).select({ direction: 'vertical', head: 0, blockScores: p, blockSize: 128, n: 1024 });
    expect(meanBackground(p)).toBeCloseTo(0.01, 15);
    expect(Array.from(kept)).toEqual([0, 2, 6, 7]);
  });
});

describe('the device form of the rule', () => {
  it('carries alpha and kMin, and is not inherited by a selector spread from it with its own select()', () => {
    const f = noiseFloor({ alpha: 1.25, kMin: 512 });
    expect(f.device).toEqual({ kind: 'noiseFloor', alpha: 1.25, kMin: 512 });
    expect(Object.isFrozen(f.device)).toBe(true);
    // a user selector built from the floor: the backend must call its select(), not run the floor
    const mine = { ...f, name: 'mine', select: () => Int32Array.of(0) };
    expect(mine.device).toBeUndefined();
    expect(Object.keys(f)).not.toContain('device');
  });
});
