/**
 * The PE coverage cut, finished on the host over the Nb (Nb + 1) / 2 pooled values the GPU
 * computed: keep the shortest prefix of the descending order (ties: lower flat index,
 * row-major) whose cumulative sum reaches γ.
 *
 * No comparison sort: values are non-negative f32, so their bit patterns order like the
 * values. A histogram of the top 16 bits finds the bucket where the running sum crosses γ,
 * a second histogram of the low 16 bits inside it finds the exact boundary value, and
 * entries equal to it are taken in index order. O(entries) per head.
 */

/**
 * @param vals   per-row softmax values Ā[I, J] flattened row-major (each active row sums to 1)
 * @param Nb     blocks
 * @param active 1 for query blocks that hold query rows (others never kept)
 * @param activeRows number of active rows: the flattened map is normalised by it
 * @param gamma  γ in (0, 1]
 * @returns keep flags, one per flat entry
 */
export function coverageCut(
  vals: Float32Array,
  Nb: number,
  active: Uint8Array,
  activeRows: number,
  gamma: number,
): Uint8Array {
  const entries = vals.length;
  const keep = new Uint8Array(entries);
  const bits = new Uint32Array(vals.buffer, vals.byteOffset, entries);
  const isActive = new Uint8Array(entries);
  {
    let e = 0;
    for (let I = 0; I < Nb; I++) {
      const a = active[I];
      for (let J = 0; J <= I; J++, e++) isActive[e] = a;
    }
  }
  const inv = 1 / activeRows;
  const hiSum = new Float64Array(65536);
  for (let e = 0; e < entries; e++) {
    if (isActive[e]) hiSum[bits[e] >>> 16] += vals[e] * inv;
  }
  let cum = 0;
  let boundary = -1;
  for (let bk = 65535; bk >= 0; bk--) {
    if (hiSum[bk] === 0) continue;
    if (cum + hiSum[bk] >= gamma) {
      boundary = bk;
      break;
    }
    cum += hiSum[bk];
  }
  if (boundary < 0) {
    // The sum never reaches γ (γ = 1 with rounding): every active entry is kept.
    for (let e = 0; e < entries; e++) keep[e] = isActive[e];
    return keep;
  }
  const loSum = new Float64Array(65536);
  for (let e = 0; e < entries; e++) {
    if (!isActive[e]) continue;
    const hi = bits[e] >>> 16;
    if (hi > boundary) keep[e] = 1;
    else if (hi === boundary) loSum[bits[e] & 0xffff] += vals[e] * inv;
  }
  let exact = -1;
  for (let lo = 65535; lo >= 0; lo--) {
    if (loSum[lo] === 0) continue;
    if (cum + loSum[lo] >= gamma) {
      exact = lo;
      break;
    }
    cum += loSum[lo];
  }
  const target = ((boundary << 16) | (Math.max(exact , 0))) >>> 0;
  for (let e = 0; e < entries; e++) {
    if (!isActive[e] || bits[e] >>> 16 !== boundary) continue;
    const lo = bits[e] & 0xffff;
    if (lo > exact) keep[e] = 1;
  }
  if (exact < 0) return keep;
  // Equal values: lower flat index first, until the running sum reaches γ.
  for (let e = 0; e < entries; e++) {
    if (!isActive[e] || bits[e] !== target) continue;
    keep[e] = 1;
    cum += vals[e] * inv;
    if (cum >= gamma) break;
  }
  return keep;
}
