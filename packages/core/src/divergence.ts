/**
 * Jensen-Shannon distances between block distributions: FlexPrefill's router compares the
 * pooled estimate with p_v over every key block, the residual router over the blocks between
 * the first and the last. Here (not in @crisp/router) because the device plan's route check
 * evaluates the residual rule too (plan/device-route.ts).
 */
import { ShapeError } from './errors.js';

/** x · ln(x / m) with the 0 · ln 0 = 0 convention; m >= x/2 > 0 whenever x > 0. */
function klTerm(x: number, m: number): number {
  return x > 0 ? x * Math.log(x / m) : 0;
}

/**
 * Jensen-Shannon distance D between two distributions over the same support (natural logs).
 * Inputs are renormalised to sum 1 first, so float32 rounding in either does not bias D.
 * NaN when either has a negative entry or no positive mass.
 */
export function jsDistance(p: ArrayLike<number>, q: ArrayLike<number>): number {
  if (!p || !q || typeof p.length !== 'number' || p.length !== q.length) {
    throw new ShapeError(`jsDistance needs two distributions of the same length; got lengths ${p?.length} and ${q?.length}`);
  }
  let sp = 0;
  let sq = 0;
  for (let i = 0; i < p.length; i++) {
    sp += p[i];
    sq += q[i];
  }
  if (!(sp > 0) || !(sq > 0)) return Number.NaN;
  for (let i = 0; i < p.length; i++) if (p[i] < 0 || q[i] < 0) return Number.NaN;
  let kp = 0;
  let kq = 0;
  for (let i = 0; i < p.length; i++) {
    const a = p[i] / sp;
    const b = q[i] / sq;
    const m = 0.5 * (a + b);
    kp += klTerm(a, m);
    kq += klTerm(b, m);
  }
  // Rounding can push the sum a hair below 0 when p == q.
  return Math.sqrt(Math.max(0, 0.5 * kp + 0.5 * kq));
}

/**
 * One head's residual: r = 1 − p_v[0] − p_v[Nb−1], the mass its proxy rows put off the end
 * blocks, and D = JSD(pooled[1..Nb−2], p_v[1..Nb−2]) (both renormalised). With fewer than 3
 * blocks, no residual mass, or an undefined distance, D = sqrt(ln 2), the most VS-like value.
 * `pv` and `pooled` are the head's Nb-length slices.
 */
export function residualDistance(pv: Float64Array, pooled: Float64Array): { residual: number; distance: number } {
  const Nb = pv.length;
  const residual = Nb >= 3 ? 1 - pv[0] - pv[Nb - 1] : 0;
  const d = Nb >= 3 && residual > 0 ? jsDistance(pooled.subarray(1, Nb - 1), pv.subarray(1, Nb - 1)) : Math.sqrt(Math.LN2);
  return { residual, distance: Number.isNaN(d) ? Math.sqrt(Math.LN2) : d };
}
