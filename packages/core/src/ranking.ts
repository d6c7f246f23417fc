/** Deterministic ranking helpers shared by selectors and the pipeline. */

/**
 * Indices of `scores` sorted by descending score; ties break toward the lower index.
 * NaN sorts last.
 */
export function argsortDescending(scores: ArrayLike<number>): Int32Array {
  const idx = new Int32Array(scores.length);
  for (let i = 0; i < idx.length; i++) idx[i] = i;
  idx.sort((a, b) => {
    const sa = scores[a];
    const sb = scores[b];
    if (sa === sb) return a - b;
    if (Number.isNaN(sa)) return 1;
    if (Number.isNaN(sb)) return -1;
    return sb > sa ? 1 : -1;
  });
  return idx;
}

/** The k best indices (ties toward the lower index), returned ascending. */
export function topKIndices(scores: ArrayLike<number>, k: number): Int32Array {
  const kk = Math.max(0, Math.min(k, scores.length));
  return argsortDescending(scores).slice(0, kk).sort();
}

/** Sorted union of index lists. */
export function unionSorted(...lists: ArrayLike<number>[]): Int32Array {
  const s = new Set<number>();
  for (const l of lists) for (let i = 0; i < l.length; i++) s.add(l[i]);
  return Int32Array.from(s).sort();
}
