/**
 * The paper's claims ("Why the noise floor", Figure 1) on score vectors: sink-only collapse,
 * noise accumulation, and the O(n) growth of γ-selected background blocks against a
 * constant noise-floor count. The same claims on heads built from crafted Q/K through the
 * reference backend live in @crisp/presets (figure-1.test.ts).
 */
import { describe, expect, it } from 'vitest';
import { cliffScores, direction, freshSeed } from './__fixtures__/scores.js';
import { coverageTokenCount, cumulativeCoverage, noiseFloor } from './index.js';

const B = 128;
const SIGNAL = [5, 12, 20, 27, 33, 41, 50, 58];

function background(kept: Int32Array, Nb: number, signal: readonly number[]): number[] {
  return Array.from(kept).filter((J) => J !== 0 && J !== Nb - 1 && !signal.includes(J));
}

describe('the mass cliff on score vectors', () => {
  it('sink 0.93, 8 signal blocks: γ = 0.95 keeps none of the 8, the noise floor keeps all 8', () => {
    const seed = freshSeed();
    const n = 8192;
    const Nb = n / B;
    const { tokens, blocks } = cliffScores({ n, blockSize: B, sink: 0.93, local: 0.03, signalBlocks: SIGNAL, signal: 0.03, jitter: 0.2, seed });
    const msg = `seed ${seed}`;
    expect(blocks[0], msg).toBeCloseTo(0.93, 6);
    // With the minimum budget at one block the coverage rule decides alone.
    const gamma = cumulativeCoverage({ gamma: 0.95, kMin: B }).select(direction(blocks, n, B, tokens));
    const floor = noiseFloor({ alpha: 1, kMin: B }).select(direction(blocks, n, B, tokens));
    expect(SIGNAL.filter((J) => gamma.includes(J)), msg).toEqual([]);
    expect(Array.from(gamma), msg).toEqual([0]);
    expect(Array.from(floor), msg).toEqual([0, ...SIGNAL, Nb - 1]);
    // With the default k_min = 1024 the coverage count still asks for one block; the 8-block
    // budget comes from k_min alone, and sink + local take 2 of its slots: 2 signals lost.
    expect(Math.floor(coverageTokenCount(tokens, 0.95) / B) + 1, msg).toBe(1);
    const gammaDefault = cumulativeCoverage().select(direction(blocks, n, B, tokens));
    expect(gammaDefault.length, msg).toBe(8);
    expect(SIGNAL.filter((J) => gammaDefault.includes(J)).length, msg).toBe(6);
    expect(Array.from(noiseFloor().select(direction(blocks, n, B, tokens))), msg).toEqual([0, ...SIGNAL, Nb - 1]);
  });

  it('sink 0.91: γ = 0.95 adds 10 or more near-zero blocks, the noise floor adds none', () => {
    const seed = freshSeed();
    const n = 16384;
    const Nb = n / B;
    const { tokens, blocks } = cliffScores({ n, blockSize: B, sink: 0.91, local: 0.013, signalBlocks: SIGNAL, signal: 0.02, jitter: 0.2, seed });
    const msg = `seed ${seed}`;
    const gamma = cumulativeCoverage({ gamma: 0.95 }).select(direction(blocks, n, B, tokens));
    const floor = noiseFloor({ alpha: 1 }).select(direction(blocks, n, B, tokens));
    const noise = background(gamma, Nb, SIGNAL);
    console.log(`sink 0.91 (seed ${seed}): γ adds ${noise.length} background blocks, the noise floor ${background(floor, Nb, SIGNAL).length}`);
    expect(noise.length, msg).toBeGreaterThanOrEqual(10);
    // "near-zero": each added block is an ordinary background block (about 1/Nb of the
    // background mass, a fifth of a signal block), not a signal the floor missed.
    const bgMean = (1 - 0.91 - 0.013 - 0.02) / (Nb - 10);
    for (const J of noise) {
      expect(blocks[J], msg).toBeLessThan(1.25 * bgMean);
      expect(blocks[J], msg).toBeLessThan(0.3 * blocks[SIGNAL[0]]);
    }
    expect(SIGNAL.every((J) => gamma.includes(J)), msg).toBe(true);
    expect(Array.from(floor), msg).toEqual([0, ...SIGNAL, Nb - 1]);
  });

  it('O(n): γ-selected background blocks double as n doubles (8k .. 512k); the noise-floor count stays constant', () => {
    const seed = freshSeed();
    const gammaNoise: number[] = [];
    const floorCounts: number[] = [];
    for (let n = 8192; n <= 524288; n *= 2) {
      const Nb = n / B;
      const { tokens, blocks } = cliffScores({
        n,
        blockSize: B,
        sink: 0.91,
        local: 0.02,
        signalBlocks: SIGNAL,
        signal: 0.016,
        jitter: 0.2,
        seed: seed + n,
      });
      const gamma = cumulativeCoverage({ gamma: 0.95 }).select(direction(blocks, n, B, tokens));
      const floor = noiseFloor({ alpha: 1 }).select(direction(blocks, n, B, tokens));
      gammaNoise.push(background(gamma, Nb, SIGNAL).length);
      floorCounts.push(floor.length);
      expect(background(floor, Nb, SIGNAL), `seed ${seed} n ${n}`).toEqual([]);
    }
    console.log(`O(n) (seed ${seed}): γ background blocks ${gammaNoise.join(', ')}; noise-floor counts ${floorCounts.join(', ')}`);
    const msg = `seed ${seed}: γ background blocks ${gammaNoise.join(', ')}; noise floor counts ${floorCounts.join(', ')}`;
    expect(floorCounts.every((c) => c === 10), msg).toBe(true);
    expect(gammaNoise[0], msg).toBeGreaterThanOrEqual(3);
    for (let i = 1; i < gammaNoise.length; i++) {
      const ratio = gammaNoise[i] / gammaNoise[i - 1];
      expect(ratio, msg).toBeGreaterThanOrEqual(1.75);
      expect(ratio, msg).toBeLessThanOrEqual(2.25);
    }
    expect(gammaNoise[gammaNoise.length - 1], msg).toBeGreaterThanOrEqual(200);
  });
});
