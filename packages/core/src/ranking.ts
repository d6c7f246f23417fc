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
  const n = scores.length;
  const kk = Math.max(0, Math.min(k, n));
  // Small k over long score lists (the PE heads' kMin lines: 8 of 4096 at 512k): one pass
  // keeping the best kk in a sorted buffer instead of sorting all n. Scanning in index order,
  // a newcomer only displaces strictly lower scores, which is the tie rule above.
  if (kk > 0 && kk <= 64 && n >= 8 * kk) {
    const bestIdx = new Int32Array(kk);
    const bestVal = new Float64Array(kk);
    let size = 0;
    for (let i = 0; i < n; i++) {
      const v = scores[i];
      if (Number.isNaN(v)) return argsortDescending(scores).slice(0, kk).sort();
      if (size === kk && !(v > bestVal[kk - 1])) continue;
      let p = size < kk ? size : kk - 1;
      while (p > 0 && v > bestVal[p - 1]) {
        bestVal[p] = bestVal[p - 1];
        bestIdx[p] = bestIdx[p - 1];
        p--;
      }
      bestVal[p] = v;
      bestIdx[p] = i;
      if (size < kk) size++;
    }
    return bestIdx.sort();
  }
  return argsortDescending(scores).slice(0, kk).sort();
}

/**
 * Sorted, deduplicated copy of integer indices (numeric typed-array sort, then one pass):
 * the masks' canonical list form. At 512k a plan builds ~64 such lists of up to Nb entries;
 * a Set-based union cost tens of milliseconds there, this costs well under one.
 */
export function sortedUnique(values: ArrayLike<number>): Int32Array {
  const a = Int32Array.from(values);
  // Selectors return their lists ascending already: then the copy is the answer (the sort
  // was most of vsListsFromArrays' ~2 ms for 64 lists of ~1,500 blocks at 512k).
  let ascending = true;
  for (let i = 1; i < a.length && ascending; i++) ascending = a[i] > a[i - 1];
  if (ascending) return a;
  a.sort();
  let w = 0;
  for (let i = 0; i < a.length; i++) if (i === 0 || a[i] !== a[w - 1]) a[w++] = a[i];
  return w === a.length ? a : a.slice(0, w);
}

/** Sorted union of index lists. */
export function unionSorted(...lists: ArrayLike<number>[]): Int32Array {
  let total = 0;
  for (const l of lists) total += l.length;
  const all = new Int32Array(total);
  let o = 0;
  for (const l of lists) for (let i = 0; i < l.length; i++) all[o++] = l[i];
  return sortedUnique(all);
}
