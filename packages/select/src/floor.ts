/**
 * What every floor selector shares once it has a threshold: keep the blocks strictly above
 * it, fall back to the kMin / B best when too few pass, and always keep both end blocks.
 */
import { topKIndices, unionSorted } from '@crisp/core';

/**
 * {J : p[J] > threshold}; if fewer than `kBlocks` pass, the `kBlocks` best instead (ties
 * toward the lower index); then ∪ {0, Nb − 1}, the anchors: key blocks 0 (sink) and Nb − 1
 * (local) in the vertical direction, offset blocks 0 (diagonal) and Nb − 1 in the slash one.
 */
export function keepAboveWithAnchors(p: ArrayLike<number>, threshold: number, kBlocks: number): Int32Array {
  const Nb = p.length;
  // One pass: the interior blocks above the threshold go straight into place after anchor 0
  // (already ascending, so the anchors need no general union); the count adds the ends.
  const out = new Int32Array(Nb + 1);
  let w = 0;
  out[w++] = 0;
  for (let J = 1; J < Nb - 1; J++) if (p[J] > threshold) out[w++] = J;
  const count = w - 1 + (p[0] > threshold ? 1 : 0) + (Nb > 1 && p[Nb - 1] > threshold ? 1 : 0);
  if (count < kBlocks) return unionSorted(topKIndices(p, kBlocks), [0, Nb - 1]);
  if (Nb > 1) out[w++] = Nb - 1;
  return out.slice(0, w);
}

/** The background: every block but the two anchors (J = 1 .. Nb − 2), as a new array. */
export function background(p: ArrayLike<number>): Float64Array {
  const out = new Float64Array(Math.max(0, p.length - 2));
  for (let J = 1; J < p.length - 1; J++) out[J - 1] = p[J];
  return out;
}

/** Type-7 (linear interpolation) quantile of a non-empty array; sorts a copy. */
export function quantile(values: Float64Array, q: number): number {
  const s = Float64Array.from(values).sort();
  const pos = q * (s.length - 1);
  const lo = Math.floor(pos);
  const hi = Math.min(lo + 1, s.length - 1);
  return s[lo] + (pos - lo) * (s[hi] - s[lo]);
}

/** Every block index 0 .. Nb − 1 (too few blocks for a background to exist). */
export function allBlocks(Nb: number): Int32Array {
  return Int32Array.from({ length: Nb }, (_, i) => i);
}
