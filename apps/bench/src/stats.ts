/** Summary statistics for repeated timings. */
export interface Spread {
  readonly median: number;
  readonly min: number;
  readonly max: number;
  readonly runs: number;
}

export function spread(samples: readonly number[]): Spread {
  if (samples.length === 0) throw new Error('spread of no samples');
  const s = [...samples].sort((a, b) => a - b);
  const mid = s.length >> 1;
  const median = s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
  return { median, min: s[0], max: s[s.length - 1], runs: s.length };
}

/** Time an async action: `warmup` untimed runs, then `reps` timed ones (ms, wall clock). */
export async function timeIt(action: () => Promise<unknown>, reps: number, warmup = 1): Promise<Spread> {
  for (let i = 0; i < warmup; i++) await action();
  const samples: number[] = [];
  for (let i = 0; i < reps; i++) {
    const t0 = performance.now();
    await action();
    samples.push(performance.now() - t0);
  }
  return spread(samples);
}

/** FLOPs of causal attention: two matmuls over the n(n+1)/2 visible (query, key) pairs. */
export function causalAttentionFlops(n: number, heads: number, headDim: number): number {
  return 4 * heads * headDim * ((n * (n + 1)) / 2);
}
