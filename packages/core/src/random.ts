/**
 * mulberry32: a small, fast, seeded uniform generator in [0, 1). One copy serves the
 * conformance suite, the benchmarks and every package's seeded tests, so "seed S" means the
 * same numbers everywhere. Not for cryptography.
 */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
