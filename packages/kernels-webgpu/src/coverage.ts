/**
 * The PE coverage cut over one head's pooled map Ā (Nb (Nb + 1) / 2 values, row-major, each
 * active row a softmax): keep every entry at or above the largest threshold T whose entries
 * hold γ of the map's mass. That is the shortest prefix of the descending order that reaches
 * γ, with the entries equal to its last value all kept (no order among equal values to
 * depend on).
 *
 * The mass is counted in fixed point, so that adding it up in any order gives the same sums:
 * the GPU cut (kernels/pe-cut.ts) adds with atomics, the host in index order, and the two
 * keep the same blocks bit for bit. An entry of value v in a map of A active rows weighs
 * floor(v · 2^31 / A) units (`fixedMass`, computed from v's bits with integer operations
 * only), the whole map about 2^31, and γ is ⌈γ · 2^31⌉ units (`fixedGamma`). Each entry
 * loses less than 2^-31 of the mass to the floor, so the kept blocks hold at least γ.
 *
 * No sort: values are non-negative f32, so their bit patterns order like the values. A
 * histogram of the top 16 bits finds the bucket where the running mass crosses γ, a second
 * histogram of the low 16 bits inside it the exact threshold. O(entries) per head.
 */

const BUCKETS = 65536;

/** γ in fixed-point units of the map's mass (2^31 for all of it). */
export function fixedGamma(gamma: number): number {
  return Math.ceil(gamma * 2 ** 31);
}

/**
 * floor(v · 2^31 / activeRows) for the f32 value whose bits are `bits` (v in [0, 2): larger
 * exponents count as 1's), by integer operations only (the WGSL cut computes the same).
 */
export function fixedMass(bits: number, activeRows: number): number {
  const E = Math.min((bits >>> 23) & 0xff, 127);
  if (E === 0) return 0;
  const m = (bits & 0x7fffff) | 0x800000;
  let x: number;
  if (E >= 119) x = m * 2 ** (E - 119);
  else if (119 - E >= 24) return 0;
  else x = m >>> (119 - E);
  return (x - (x % activeRows)) / activeRows;
}

let hiScratch: Float64Array | undefined;
let loScratch: Float64Array | undefined;

/**
 * The cut's threshold: keep the active entries whose bits are >= the result; -1: keep every
 * active entry (the mass never reaches γ, as with γ = 1 after the floors).
 *
 * @param bits   the map's f32 values as bits, flattened row-major (I, then J <= I)
 * @param Nb     blocks
 * @param active 1 for query blocks that hold query rows (others never kept)
 * @param activeRows number of active rows (the map's mass is activeRows, one per row)
 * @param gamma  γ in (0, 1]
 */
export function coverageThreshold(bits: Uint32Array, Nb: number, active: Uint8Array, activeRows: number, gamma: number): number {
  const G = fixedGamma(gamma);
  // the histograms are kept between calls; only the buckets a call touched are scanned and
  // cleared (a map's values span a few thousand top-16-bit buckets)
  const hiSum = (hiScratch ??= new Float64Array(BUCKETS));
  const loSum = (loScratch ??= new Float64Array(BUCKETS));
  let hiMin = BUCKETS;
  let hiMax = -1;
  let loMin = BUCKETS;
  let loMax = -1;
  try {
    // row I holds flat entries I (I + 1) / 2 .. + I
    for (let I = 0, e = 0; I < Nb; e += I + 1, I++) {
      if (!active[I]) continue;
      for (let x = e; x <= e + I; x++) {
        const w = fixedMass(bits[x], activeRows);
        if (w === 0) continue;
        const hb = bits[x] >>> 16;
        hiSum[hb] += w;
        if (hb < hiMin) hiMin = hb;
        if (hb > hiMax) hiMax = hb;
      }
    }
    let cum = 0;
    let boundary = -1;
    for (let bk = hiMax; bk >= hiMin; bk--) {
      if (hiSum[bk] === 0) continue;
      if (cum + hiSum[bk] >= G) {
        boundary = bk;
        break;
      }
      cum += hiSum[bk];
    }
    if (boundary < 0) return -1;
    for (let I = 0, e = 0; I < Nb; e += I + 1, I++) {
      if (!active[I]) continue;
      for (let x = e; x <= e + I; x++) {
        if (bits[x] >>> 16 !== boundary) continue;
        const w = fixedMass(bits[x], activeRows);
        if (w === 0) continue;
        const lb = bits[x] & 0xffff;
        loSum[lb] += w;
        if (lb < loMin) loMin = lb;
        if (lb > loMax) loMax = lb;
      }
    }
    for (let lo = loMax; lo >= loMin; lo--) {
      if (loSum[lo] === 0) continue;
      if (cum + loSum[lo] >= G) return ((boundary << 16) | lo) >>> 0;
      cum += loSum[lo];
    }
    // (unreachable: the boundary bucket's entries reach γ)
    return ((boundary << 16) | Math.max(loMin, 0)) >>> 0;
  } finally {
    if (hiMax >= hiMin) hiSum.fill(0, hiMin, hiMax + 1);
    if (loMax >= loMin) loSum.fill(0, loMin, loMax + 1);
  }
}

/**
 * The cut as keep flags, one per flat entry (see coverageThreshold).
 *
 * @param vals   per-row softmax values Ā[I, J] flattened row-major (each active row sums to 1)
 */
export function coverageCut(vals: Float32Array, Nb: number, active: Uint8Array, activeRows: number, gamma: number): Uint8Array {
  const entries = vals.length;
  const bits = new Uint32Array(vals.buffer, vals.byteOffset, entries);
  const T = coverageThreshold(bits, Nb, active, activeRows, gamma);
  const keep = new Uint8Array(entries);
  for (let I = 0, e = 0; I < Nb; e += I + 1, I++) {
    if (!active[I]) continue;
    if (T < 0) keep.fill(1, e, e + I + 1);
    else for (let x = e; x <= e + I; x++) keep[x] = bits[x] >= T ? 1 : 0;
  }
  return keep;
}
