/**
 * Test inputs (not exported), also built into the browser test page (browser/main.ts), so
 * nothing here may need Node: seeded structured q, k, v values and a small policy whose plans
 * are sparse at test sizes.
 */
import { type Policy, mulberry32 } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { cStruct } from '@crisp/router';
import { globalCoverage, noiseFloor } from '@crisp/select';

export interface Sizes {
  readonly n: number;
  readonly H: number;
  readonly Hkv: number;
  readonly d: number;
}

/** q, k, v host values: uniform noise, a few sink keys, and keys every 37 rows sharing q's direction. */
export function values(seed: number, s: Sizes, batch = 1): { q: Float32Array; k: Float32Array; v: Float32Array } {
  const r = mulberry32(seed);
  const u = (len: number, amp: number) => Float32Array.from({ length: len }, () => (r() * 2 - 1) * amp);
  const q = u(batch * s.n * s.H * s.d, 1.5);
  const k = u(batch * s.n * s.Hkv * s.d, 1.5);
  const row = s.Hkv * s.d;
  for (let b = 0; b < batch; b++) {
    for (let i = 0; i < s.n; i++) {
      if (i % 37 === 0 || i < 4) for (let x = 0; x < row; x += 3) k[(b * s.n + i) * row + x] += i < 4 ? 2 : 1;
    }
  }
  return { q, k, v: u(batch * s.n * s.Hkv * s.d, 1) };
}

/** CRISP with 64-token blocks and budgets, so 1k-token test sequences get sparse plans. */
export const smallCrisp: Policy = Object.freeze({
  ...crisp,
  name: 'crisp-64',
  blockSize: 64,
  router: cStruct({ tauProxy: 0.2, wSink: 64, wLocal: 64 }),
  kMin: 64,
  vs: noiseFloor({ alpha: 1.0, kMin: 64 }),
  pe: globalCoverage({ gamma: 0.95, kMin: 64 }),
});
