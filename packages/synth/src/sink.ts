/** Bisection solvers for the attention-sink strength S of one head. */

export interface SinkSample {
  /** base logits of the sink tokens at one row */
  readonly sinkBase: Float64Array;
  /** Σ exp(logit) of the other tokens of the sink block */
  readonly blockRest: number;
  /** Σ exp(logit) of every token after the sink block */
  readonly other: number;
}

/** S with the mean over sampled rows of the sink block's mass equal to `target` (monotone in S). */
export function solveMeanSink(sample: SinkSample[], w: Float64Array, target: number): number {
  const mean = (S: number) => {
    let m = 0;
    for (const { sinkBase, blockRest, other } of sample) {
      let s = blockRest;
      for (let j = 0; j < sinkBase.length; j++) s += Math.exp(S * w[j] + sinkBase[j]);
      m += s / (s + other);
    }
    return m / sample.length;
  };
  let lo = -40;
  let hi = 80;
  for (let it = 0; it < 100; it++) {
    const mid = (lo + hi) / 2;
    if (mean(mid) < target) lo = mid;
    else hi = mid;
  }
  return (lo + hi) / 2;
}

/** S with Σ_j exp(S·w_j + base_j) over sink tokens equal to `target` (monotone in S). */
export function solveSink(base: Float64Array, w: Float64Array, target: number): number {
  const f = (S: number) => {
    let s = 0;
    for (let j = 0; j < w.length && j < base.length; j++) s += Math.exp(S * w[j] + base[j]);
    return s;
  };
  let lo = -40;
  let hi = 80;
  for (let it = 0; it < 100; it++) {
    const mid = (lo + hi) / 2;
    if (f(mid) < target) lo = mid;
    else hi = mid;
  }
  return (lo + hi) / 2;
}
