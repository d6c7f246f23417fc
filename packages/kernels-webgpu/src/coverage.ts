/**
 * The PE coverage cut, finished on the host over the Nb (Nb + 1) / 2 pooled values the GPU
 * computed: keep the shortest prefix of the descending order (ties: lower flat index,
 * row-major) whose cumulative sum reaches γ.
 *
 * No comparison sort: values are non-negative f32, so their bit patterns order like the
 * values. A histogram of the top 16 bits finds the bucket where the running sum crosses γ,
 * a second histogram of the low 16 bits inside it finds the exact boundary value, and
 * entries equal to it are taken in index order. O(entries) per head.
 *
 * The two 65,536-bucket histograms are kept between calls and only the buckets a call
 * touched are scanned and cleared: softmax values of one map span a few thousand top-16-bit
 * buckets, so a head costs about its entries, not a fixed 1 MB of allocation and two full
 * scans (about 1 ms a head before, which made the cut the largest part of a WebGPU plan).
 */

const BUCKETS = 65536;
let hiScratch: Float64Array | undefined;
let loScratch: Float64Array | undefined;

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
  const hiSum = (hiScratch ??= new Float64Array(BUCKETS));
  const loSum = (loScratch ??= new Float64Array(BUCKETS));
  const inv = 1 / activeRows;
  // touched bucket ranges, cleared in `finally` so a later call starts from zeros
  let hiMin = BUCKETS;
  let hiMax = -1;
  let loMin = BUCKETS;
  let loMax = -1;
  try {
    // Row I holds flat entries I (I + 1) / 2 .. + I.
    for (let I = 0, e = 0; I < Nb; e += I + 1, I++) {
      if (!active[I]) continue;
      for (let x = e; x <= e + I; x++) {
        const hb = bits[x] >>> 16;
        hiSum[hb] += vals[x] * inv;
        if (hb < hiMin) hiMin = hb;
        if (hb > hiMax) hiMax = hb;
      }
    }
    let cum = 0;
    let boundary = -1;
    for (let bk = hiMax; bk >= hiMin; bk--) {
      if (hiSum[bk] === 0) continue;
      if (cum + hiSum[bk] >= gamma) {
        boundary = bk;
        break;
      }
      cum += hiSum[bk];
    }
    if (boundary < 0) {
      // The sum never reaches γ (γ = 1 with rounding): every active entry is kept.
      for (let I = 0, e = 0; I < Nb; e += I + 1, I++) if (active[I]) keep.fill(1, e, e + I + 1);
      return keep;
    }
    for (let I = 0, e = 0; I < Nb; e += I + 1, I++) {
      if (!active[I]) continue;
      for (let x = e; x <= e + I; x++) {
        const hi = bits[x] >>> 16;
        if (hi > boundary) keep[x] = 1;
        else if (hi === boundary) {
          const lb = bits[x] & 0xffff;
          loSum[lb] += vals[x] * inv;
          if (lb < loMin) loMin = lb;
          if (lb > loMax) loMax = lb;
        }
      }
    }
    let exact = -1;
    for (let lo = loMax; lo >= loMin; lo--) {
      if (loSum[lo] === 0) continue;
      if (cum + loSum[lo] >= gamma) {
        exact = lo;
        break;
      }
      cum += loSum[lo];
    }
    const target = ((boundary << 16) | Math.max(exact, 0)) >>> 0;
    for (let I = 0, e = 0; I < Nb; e += I + 1, I++) {
      if (!active[I]) continue;
      for (let x = e; x <= e + I; x++) if (bits[x] >>> 16 === boundary && (bits[x] & 0xffff) > exact) keep[x] = 1;
    }
    if (exact < 0) return keep;
    // Equal values: lower flat index first, until the running sum reaches γ.
    for (let I = 0, e = 0; I < Nb; e += I + 1, I++) {
      if (!active[I]) continue;
      for (let x = e; x <= e + I; x++) {
        if (bits[x] !== target) continue;
        keep[x] = 1;
        cum += vals[x] * inv;
        if (cum >= gamma) return keep;
      }
    }
    return keep;
  } finally {
    if (hiMax >= hiMin) hiSum.fill(0, hiMin, hiMax + 1);
    if (loMax >= loMin) loSum.fill(0, loMin, loMax + 1);
  }
}
