/**
 * Counter-based randomness: every value is a pure function of (seed, stream, indices), so a
 * scenario's rows come out identical however they are chunked, and any row can be produced
 * without producing the rows before it.
 */

/** A 32-bit integer mix with good avalanche (lowbias32 constants). */
export function mix32(x: number): number {
  x ^= x >>> 16;
  x = Math.imul(x, 0x7feb352d);
  x ^= x >>> 15;
  x = Math.imul(x, 0x846ca68b);
  x ^= x >>> 16;
  return x >>> 0;
}

/** Hash up to four integers (and a seed) into 32 bits. */
export function hash4(seed: number, a: number, b = 0, c = 0, d = 0): number {
  let h = mix32((seed ^ 0x9e3779b9) >>> 0);
  h = mix32((h + Math.imul(a | 0, 0x85ebca6b)) >>> 0);
  h = mix32((h ^ Math.imul(b | 0, 0xc2b2ae35)) >>> 0);
  h = mix32((h + Math.imul(c | 0, 0x27d4eb2f)) >>> 0);
  h = mix32((h ^ Math.imul(d | 0, 0x165667b1)) >>> 0);
  return h;
}

/** Uniform in (0, 1) from 32 bits (never exactly 0 or 1). */
export function unitFromBits(bits: number): number {
  return ((bits >>> 0) + 0.5) / 4294967296;
}

// Inverse normal CDF (Acklam's rational approximation, |error| < 1.2e-9): fills the table
// the fast Gaussian draws index into, so draws need no log/sqrt/cos per value.
function inverseNormal(p: number): number {
  const a = [-39.6968302866538, 220.946098424521, -275.928510446969, 138.357751867269, -30.6647980661472, 2.50662827745924];
  const b = [-54.4760987982241, 161.585836858041, -155.698979859887, 66.8013118877197, -13.2806815528857];
  const c = [-0.00778489400243029, -0.322396458041136, -2.40075827716184, -2.54973253934373, 4.37466414146497, 2.93816398269878];
  const d = [0.00778469570904146, 0.32246712907004, 2.445134137143, 3.75440866190742];
  const pl = 0.02425;
  if (p < pl) {
    const q = Math.sqrt(-2 * Math.log(p));
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  if (p > 1 - pl) {
    const q = Math.sqrt(-2 * Math.log(1 - p));
    return -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  const q = p - 0.5;
  const r = q * q;
  return ((((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q) / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

const GAUSS_BITS = 16;
const GAUSS = new Float64Array(1 << GAUSS_BITS);
for (let i = 0; i < GAUSS.length; i++) GAUSS[i] = inverseNormal((i + 0.5) / GAUSS.length);

/** A standard normal draw from 32 random bits (65,536-level quantised inverse CDF). */
export function gaussFromBits(bits: number): number {
  return GAUSS[(bits >>> 0) >>> (32 - GAUSS_BITS)];
}

/**
 * A small sequential generator (mulberry32) for the values of one row: seeded from a
 * counter hash, so rows stay independent of each other and of chunking.
 */
export class RowRng {
  #s = 0;
  reset(seed: number): this {
    this.#s = seed >>> 0;
    return this;
  }
  nextU32(): number {
    this.#s = (this.#s + 0x6d2b79f5) >>> 0;
    let t = this.#s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  }
  uniform(): number {
    return unitFromBits(this.nextU32());
  }
  gauss(): number {
    return gaussFromBits(this.nextU32());
  }
  /**
   * Fill out[from, to) with standard normal draws, two per 32-bit step (16 bits each index
   * the table): the row generator's hot loop.
   */
  fillGauss(out: Float64Array, from: number, to: number, scale = 1): void {
    let i = from;
    for (; i + 1 < to; i += 2) {
      const u = this.nextU32();
      out[i] = scale * GAUSS[u >>> 16];
      out[i + 1] = scale * GAUSS[u & 0xffff];
    }
    if (i < to) out[i] = scale * GAUSS[this.nextU32() >>> 16];
  }
  /** Integer in [lo, hi). */
  int(lo: number, hi: number): number {
    return lo + Math.floor(this.uniform() * (hi - lo));
  }
  /** Uniform in [lo, hi). */
  range(lo: number, hi: number): number {
    return lo + this.uniform() * (hi - lo);
  }
}

/** A scenario-level generator for parameters (one stream per purpose). */
export function rngFor(seed: number, stream: number, a = 0, b = 0): RowRng {
  return new RowRng().reset(hash4(seed, stream, a, b));
}
