/**
 * Seeded score-vector builders for the selector tests: token scores a[0..n) (sum 1) and
 * their block sums p[J], with the mass cliff the paper describes (anchors, a few signal
 * blocks, a background of near-equal tokens).
 */
import type { DirectionScores } from '@crisp/core';
import { mulberry32 } from '@crisp/core';

/** mulberry32, from @crisp/core (one generator for every seeded input). */
export const rng: (seed: number) => () => number = mulberry32;

/** A fresh seed per run, printed by the caller on failure; CRISP_SEED=S reruns seed S. */
export function freshSeed(): number {
  return process.env.CRISP_SEED === undefined ? (Math.random() * 2 ** 31) >>> 0 : Number(process.env.CRISP_SEED);
}

export interface CliffSpec {
  readonly n: number;
  readonly blockSize: number;
  /** mass of key block 0 (the sink token carries it, minus its block's background tokens) */
  readonly sink: number;
  /** mass of the last block (spread evenly over its tokens) */
  readonly local: number;
  /** signal block indices (not 0 or Nb - 1) */
  readonly signalBlocks: readonly number[];
  /** total signal mass, split evenly over the signal blocks and their tokens */
  readonly signal: number;
  /** relative jitter of background tokens (uniform in ±jitter) */
  readonly jitter: number;
  readonly seed: number;
}

/** Token scores with the given block masses; the background takes 1 − sink − local − signal. */
export function cliffScores(spec: CliffSpec): { tokens: Float32Array; blocks: Float64Array } {
  const { n, blockSize: B, sink, local, signalBlocks, signal, jitter } = spec;
  const Nb = Math.ceil(n / B);
  const rand = rng(spec.seed);
  const kind = new Uint8Array(Nb); // 0 background, 1 signal, 2 local
  for (const J of signalBlocks) kind[J] = 1;
  kind[Nb - 1] = 2;
  const a = new Float64Array(n);
  // Background tokens outside block 0 share the background mass (with jitter); block 0's
  // tokens besides the sink get the same per-token mass, and the sink token the rest of
  // block 0's mass, so p[0] = sink exactly.
  const w = new Float64Array(n);
  let bgWeight = 0;
  for (let j = 1; j < n; j++) {
    const J = Math.floor(j / B);
    if (J === 0 || kind[J] === 0) {
      w[j] = 1 + jitter * (2 * rand() - 1);
      if (J !== 0) bgWeight += w[j];
    }
  }
  const bgMass = 1 - sink - local - signal;
  if (!(bgMass > 0) || !(bgWeight > 0)) throw new Error('cliffScores: no background left');
  const eps = bgMass / bgWeight;
  let block0 = 0;
  for (let j = 1; j < n; j++) {
    const J = Math.floor(j / B);
    if (J === 0 || kind[J] === 0) {
      a[j] = eps * w[j];
      if (J === 0) block0 += a[j];
    } else if (kind[J] === 2) {
      a[j] = local / (n - (Nb - 1) * B);
    } else {
      a[j] = signal / signalBlocks.length / Math.min(B, n - J * B);
    }
  }
  a[0] = sink - block0;
  const tokens = Float32Array.from(a);
  const blocks = new Float64Array(Nb);
  for (let j = 0; j < n; j++) blocks[Math.floor(j / B)] += tokens[j];
  return { tokens, blocks };
}

/** A DirectionScores for one vertical direction of head 0. */
export function direction(blocks: Float64Array, n: number, blockSize: number, tokens?: Float32Array): DirectionScores {
  return { direction: 'vertical', head: 0, blockScores: blocks, tokenScores: tokens, blockSize, n };
}
