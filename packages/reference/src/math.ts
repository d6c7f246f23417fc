/**
 * The float64 kernels behind the reference backend and the host metric helpers. They work
 * on head-major f64 copies of q, k, v so the inner loops are straight typed-array sweeps.
 *
 * Shape legend: q [m, H, d], k and v [n, Hkv, d], query row i sits at absolute position
 * n - m + i; query head h reads kv head floor(h / (H / Hkv)); B block size, Nb = ceil(n / B).
 */
import {
  type BlockRows,
  type DType,
  decode,
  type HostData,
  NonFiniteError,
  type ProxyStats,
} from '@crisp/core';
import { blockMeans } from './block-means.js';

/** Head-major f64 copy of a [rows, heads, d] tensor: data[(h * rows + r) * d + c]. */
export interface HeadMajor {
  readonly rows: number;
  readonly heads: number;
  readonly dim: number;
  readonly data: Float64Array;
}

/** Decode storage to f64 head-major, rejecting NaN/Inf (named after `what`). */
export function toHeadMajor(
  dtype: DType,
  shape: readonly number[],
  storage: HostData,
  what: string,
  checkFinite = true,
): HeadMajor {
  const [rows, heads, dim] = shape;
  const vals = decode(dtype, storage);
  const data = new Float64Array(rows * heads * dim);
  for (let r = 0; r < rows; r++) {
    for (let h = 0; h < heads; h++) {
      const src = (r * heads + h) * dim;
      const dst = (h * rows + r) * dim;
      for (let c = 0; c < dim; c++) {
        const x = vals[src + c];
        if (checkFinite && !Number.isFinite(x)) {
          throw new NonFiniteError(
            `${what} holds ${x} at row ${r}, head ${h}, column ${c} (shape [${shape}]); clean the input first`,
            { tensor: what, index: src + c },
          );
        }
        data[dst + c] = x;
      }
    }
  }
  return { rows, heads, dim, data };
}

/** Where each query row of a head reads its keys. */
export interface Problem {
  readonly q: HeadMajor;
  readonly k: HeadMajor;
  readonly v?: HeadMajor;
  readonly scale: number;
}

/** kv head of query head h (GQA): floor(h / (H / Hkv)). */
export function kvHeadOf(h: number, H: number, Hkv: number): number {
  return Math.floor(h / (H / Hkv));
}

/**
 * Scratch buffers reused across rows so the inner loops allocate nothing.
 * `keys` holds [j0, j1) ranges of key positions a row attends to.
 */
export class Scratch {
  readonly scores: Float64Array;
  readonly acc: Float64Array;
  readonly ranges: Int32Array;
  constructor(n: number, d: number, Nb: number) {
    this.scores = new Float64Array(n);
    this.acc = new Float64Array(d);
    this.ranges = new Int32Array(2 * Math.max(Nb, 1));
  }
}

/**
 * Exact softmax attention of one query row over key ranges [ranges[2t], ranges[2t+1]).
 * Writes the output (f64) to out[outOff .. outOff + d) when `out` is given and returns the
 * natural-log log-sum-exp of the scaled logits (-Infinity when the row has no keys, in which
 * case the output is zero: skipped blocks contribute nothing).
 */
export function attendRow(
  p: Problem,
  h: number,
  i: number,
  nRanges: number,
  s: Scratch,
  out: Float64Array | undefined,
  outOff: number,
): number {
  const { q, k } = p;
  const d = q.dim;
  const n = k.rows;
  const g = kvHeadOf(h, q.heads, k.heads);
  const qd = q.data;
  const kd = k.data;
  const qo = (h * q.rows + i) * d;
  const kBase = g * n * d;
  const scores = s.scores;
  const ranges = s.ranges;
  let mx = Number.NEGATIVE_INFINITY;
  let cnt = 0;
  for (let t = 0; t < nRanges; t++) {
    const j1 = ranges[2 * t + 1];
    for (let j = ranges[2 * t]; j < j1; j++) {
      const ko = kBase + j * d;
      // Four partial sums: independent dependency chains run about twice as fast in V8.
      let d0 = 0;
      let d1 = 0;
      let d2 = 0;
      let d3 = 0;
      let c = 0;
      for (; c + 3 < d; c += 4) {
        d0 += qd[qo + c] * kd[ko + c];
        d1 += qd[qo + c + 1] * kd[ko + c + 1];
        d2 += qd[qo + c + 2] * kd[ko + c + 2];
        d3 += qd[qo + c + 3] * kd[ko + c + 3];
      }
      for (; c < d; c++) d0 += qd[qo + c] * kd[ko + c];
      const x = (d0 + d1 + (d2 + d3)) * p.scale;
      scores[cnt++] = x;
      if (x > mx) mx = x;
    }
  }
  if (cnt === 0) {
    if (out) out.fill(0, outOff, outOff + d);
    return Number.NEGATIVE_INFINITY;
  }
  let sum = 0;
  for (let t = 0; t < cnt; t++) {
    const e = Math.exp(scores[t] - mx);
    scores[t] = e;
    sum += e;
  }
  if (out && p.v) {
    const vd = p.v.data;
    const acc = s.acc;
    acc.fill(0);
    let t = 0;
    for (let r = 0; r < nRanges; r++) {
      const j1 = ranges[2 * r + 1];
      for (let j = ranges[2 * r]; j < j1; j++) {
        const w = scores[t++];
        const vo = kBase + j * d;
        let c = 0;
        for (; c + 3 < d; c += 4) {
          acc[c] += w * vd[vo + c];
          acc[c + 1] += w * vd[vo + c + 1];
          acc[c + 2] += w * vd[vo + c + 2];
          acc[c + 3] += w * vd[vo + c + 3];
        }
        for (; c < d; c++) acc[c] += w * vd[vo + c];
      }
    }
    const inv = 1 / sum;
    for (let c = 0; c < d; c++) out[outOff + c] = acc[c] * inv;
  }
  return mx + Math.log(sum);
}

/**
 * Fill `ranges` with the causal key ranges of query position `pos` in query block I:
 * every selected block J of the row, clipped to j <= pos (the causal diagonal). Returns the
 * number of ranges. `rows` undefined means dense: one range [0, pos].
 */
export function rowRanges(
  rows: BlockRows | undefined,
  r: number,
  pos: number,
  B: number,
  n: number,
  ranges: Int32Array,
): number {
  if (!rows) {
    ranges[0] = 0;
    ranges[1] = pos + 1;
    return 1;
  }
  let nr = 0;
  const end = Math.min(pos + 1, n);
  for (let p = rows.rowPtr[r]; p < rows.rowPtr[r + 1]; p++) {
    const j0 = rows.cols[p] * B;
    const j1 = Math.min(j0 + B, end);
    if (j1 <= j0) continue;
    // Merge adjacent blocks into one range: fewer loop headers, same arithmetic order.
    if (nr > 0 && ranges[2 * nr - 1] === j0) ranges[2 * nr - 1] = j1;
    else {
      ranges[2 * nr] = j0;
      ranges[2 * nr + 1] = j1;
      nr++;
    }
  }
  return nr;
}

/** Scratch for attendGroup: up to GROUP rows of scores and accumulators. */
const GROUP = 4;
class GroupScratch {
  readonly scores: Float64Array[];
  readonly acc: Float64Array[];
  readonly ranges: Int32Array;
  constructor(n: number, d: number, Nb: number) {
    this.scores = Array.from({ length: GROUP }, () => new Float64Array(n));
    this.acc = Array.from({ length: GROUP }, () => new Float64Array(d));
    this.ranges = new Int32Array(2 * Math.max(Nb, 1));
  }
}

/**
 * Attention of T <= 4 consecutive query rows i0 .. i0+T-1 of head h that share a query
 * block, so one pass over the keys serves them all (each key row loaded once for four
 * queries: about twice as fast as one row at a time). `ranges` are those of the last row;
 * row t ignores keys past its own position. Every row's arithmetic (a single dot-product
 * chain, then the running max, exp, sum and P·V in key order) does not depend on how rows
 * are grouped, so full and chunked prefill, dense and all-block masks agree bit for bit.
 */
function attendGroup(
  p: Problem,
  h: number,
  i0: number,
  T: number,
  pos0: number,
  nRanges: number,
  s: GroupScratch,
  out: Float64Array,
  outOff: (t: number) => number,
  lse: Float64Array,
  lseOff: number,
): void {
  const { q, k } = p;
  const d = q.dim;
  const n = k.rows;
  const g = kvHeadOf(h, q.heads, k.heads);
  const qd = q.data;
  const kd = k.data;
  const kBase = g * n * d;
  const qo = (h * q.rows + i0) * d;
  const ranges = s.ranges;
  const [s0, s1, s2, s3] = s.scores;
  const scale = p.scale;
  let cnt = 0;
  for (let r = 0; r < nRanges; r++) {
    const j1 = ranges[2 * r + 1];
    for (let j = ranges[2 * r]; j < j1; j++) {
      const ko = kBase + j * d;
      if (T === GROUP) {
        let a0 = 0;
        let a1 = 0;
        let a2 = 0;
        let a3 = 0;
        for (let c = 0; c < d; c++) {
          const kv = kd[ko + c];
          a0 += qd[qo + c] * kv;
          a1 += qd[qo + d + c] * kv;
          a2 += qd[qo + 2 * d + c] * kv;
          a3 += qd[qo + 3 * d + c] * kv;
        }
        s0[cnt] = a0 * scale;
        s1[cnt] = a1 * scale;
        s2[cnt] = a2 * scale;
        s3[cnt] = a3 * scale;
      } else {
        for (let t = 0; t < T; t++) {
          const qt = qo + t * d;
          let a = 0;
          for (let c = 0; c < d; c++) a += qd[qt + c] * kd[ko + c];
          s.scores[t][cnt] = a * scale;
        }
      }
      cnt++;
    }
  }
  const acc = s.acc;
  for (let t = 0; t < T; t++) {
    const sc = s.scores[t];
    const o = outOff(t);
    if (cnt === 0) {
      out.fill(0, o, o + d);
      lse[lseOff + t] = Number.NEGATIVE_INFINITY;
      continue;
    }
    // Keys past this row's position (the diagonal block's tail) get weight exactly 0.
    const pos = pos0 + t;
    let mx = Number.NEGATIVE_INFINITY;
    let u = 0;
    for (let r = 0; r < nRanges; r++) {
      const j1 = ranges[2 * r + 1];
      for (let j = ranges[2 * r]; j < j1; j++, u++) {
        if (j > pos) sc[u] = Number.NEGATIVE_INFINITY;
        else if (sc[u] > mx) mx = sc[u];
      }
    }
    let sum = 0;
    for (let x = 0; x < cnt; x++) {
      const e = Math.exp(sc[x] - mx);
      sc[x] = e;
      sum += e;
    }
    lse[lseOff + t] = mx + Math.log(sum);
    acc[t].fill(0);
  }
  if (cnt === 0 || !p.v) return;
  const vd = p.v.data;
  const [c0, c1, c2, c3] = acc;
  let u = 0;
  for (let r = 0; r < nRanges; r++) {
    const j1 = ranges[2 * r + 1];
    for (let j = ranges[2 * r]; j < j1; j++, u++) {
      const vo = kBase + j * d;
      if (T === GROUP) {
        const w0 = s0[u];
        const w1 = s1[u];
        const w2 = s2[u];
        const w3 = s3[u];
        for (let c = 0; c < d; c++) {
          const vv = vd[vo + c];
          c0[c] += w0 * vv;
          c1[c] += w1 * vv;
          c2[c] += w2 * vv;
          c3[c] += w3 * vv;
        }
      } else {
        for (let t = 0; t < T; t++) {
          const w = s.scores[t][u];
          const ct = acc[t];
          for (let c = 0; c < d; c++) ct[c] += w * vd[vo + c];
        }
      }
    }
  }
  for (let t = 0; t < T; t++) {
    let sum = 0;
    const sc = s.scores[t];
    for (let x = 0; x < cnt; x++) sum += sc[x];
    const inv = 1 / sum;
    const o = outOff(t);
    for (let c = 0; c < d; c++) out[o + c] = acc[t][c] * inv;
  }
}

/** One group of attendMany: rows queryRows[t .. t+T) of head h, keys in the first nr ranges. */
interface Group {
  h: number;
  t: number;
  T: number;
  i0: number;
  pos0: number;
  nr: number;
}

/**
 * The groups of attendMany in their order (heads outer, rows inner; up to 4 consecutive rows
 * of one query block share a group), with each group's key ranges left in `ranges`. One
 * Group object is reused: read it before the next step.
 */
function* attendGroups(m: number, n: number, H: number, queryRows: ArrayLike<number>, rows: BlockRows | undefined, B: number, ranges: Int32Array): Generator<Group> {
  const Nb = Math.ceil(n / B);
  const R = queryRows.length;
  const g: Group = { h: 0, t: 0, T: 0, i0: 0, pos0: 0, nr: 0 };
  for (let h = 0; h < H; h++) {
    let t = 0;
    while (t < R) {
      const i0 = queryRows[t];
      const pos0 = n - m + i0;
      const I = Math.floor(pos0 / B);
      // Group consecutive rows of the same query block (up to 4).
      let T = 1;
      while (T < GROUP && t + T < R && queryRows[t + T] === i0 + T && Math.floor((pos0 + T) / B) === I) T++;
      g.h = h;
      g.t = t;
      g.T = T;
      g.i0 = i0;
      g.pos0 = pos0;
      g.nr = rowRanges(rows, h * Nb + I, pos0 + T - 1, B, n, ranges);
      yield g;
      t += T;
    }
  }
}

/** Keys a group scans: its rows times the keys in its ranges (the unit of attention progress). */
function groupWork(g: Group, ranges: Int32Array): number {
  let keys = 0;
  for (let r = 0; r < g.nr; r++) keys += ranges[2 * r + 1] - ranges[2 * r];
  return g.T * keys;
}

interface AttendPass {
  readonly output: Float64Array;
  readonly lse: Float64Array;
  /** runs the groups one by one; yields the work of each group after running it */
  readonly steps: Generator<number>;
}

function attendPass(p: Problem, queryRows: ArrayLike<number>, rows: BlockRows | undefined, B: number): AttendPass {
  const { q, k } = p;
  const H = q.heads;
  const d = q.dim;
  const n = k.rows;
  const R = queryRows.length;
  const output = new Float64Array(R * H * d);
  const lse = new Float64Array(H * R);
  const gs = new GroupScratch(n, d, Math.ceil(n / B));
  function* steps(): Generator<number> {
    for (const g of attendGroups(q.rows, n, H, queryRows, rows, B, gs.ranges)) {
      const { h, t: base } = g;
      attendGroup(p, h, g.i0, g.T, g.pos0, g.nr, gs, output, (x) => ((base + x) * H + h) * d, lse, h * R + base);
      yield groupWork(g, gs.ranges);
    }
  }
  return { output, lse, steps: steps() };
}

/**
 * Attention for the listed query rows (indices into q's rows), all heads, dense or over a
 * mask's expanded rows. Returns f64 output [rows.length, H, d] and LSE [H, rows.length].
 */
export function attendMany(
  p: Problem,
  queryRows: ArrayLike<number>,
  rows: BlockRows | undefined,
  B: number,
): { output: Float64Array; lse: Float64Array } {
  const pass = attendPass(p, queryRows, rows, B);
  for (const _ of pass.steps);
  return { output: pass.output, lse: pass.lse };
}

/** Total work of an attendMany call, in the unit of its progress (keys scanned, summed over groups). */
export function attendWork(m: number, n: number, H: number, queryRows: ArrayLike<number>, rows: BlockRows | undefined, B: number): number {
  const ranges = new Int32Array(2 * Math.max(Math.ceil(n / B), 1));
  let total = 0;
  for (const g of attendGroups(m, n, H, queryRows, rows, B, ranges)) total += groupWork(g, ranges);
  return total;
}

/** Let timers, I/O and progress output run: setImmediate in Node, a zero timeout in browsers. */
function yieldToEventLoop(): Promise<void> {
  const g = globalThis as { setImmediate?: (cb: () => void) => unknown };
  return new Promise<void>((resolve) => (g.setImmediate ? g.setImmediate(resolve) : setTimeout(resolve, 0)));
}

/**
 * attendMany in slices: after every `everyMs` of work it reports (done, total) and yields to
 * the event loop, so a long pass neither freezes progress output nor stops timers. The same
 * groups in the same order as attendMany: the results are bit for bit the same.
 */
export async function attendManySliced(
  p: Problem,
  queryRows: ArrayLike<number>,
  rows: BlockRows | undefined,
  B: number,
  onSlice: (done: number, total: number) => void,
  everyMs: number,
): Promise<{ output: Float64Array; lse: Float64Array }> {
  const total = attendWork(p.q.rows, p.k.rows, p.q.heads, queryRows, rows, B);
  const pass = attendPass(p, queryRows, rows, B);
  let done = 0;
  let last = performance.now();
  onSlice(0, total);
  for (const work of pass.steps) {
    done += work;
    if (performance.now() - last >= everyMs && done < total) {
      onSlice(done, total);
      await yieldToEventLoop();
      last = performance.now();
    }
  }
  onSlice(total, total);
  return { output: pass.output, lse: pass.lse };
}

export interface ProxyOptions {
  readonly blockSize: number;
  readonly wSink: number;
  readonly wLocal: number;
  readonly scale: number;
  readonly tokenScores: boolean;
}

/**
 * Proxy statistics from the explicitly normalised proxy map Â (one row at a time, never
 * stored whole). Q̂ = the last b = min(B, m) query rows (m = n outside chunked prefill).
 *
 * C_struct counts each token once: when the sink window [0, wSink) and the local window
 * [n - wLocal, n) overlap (n < wSink + wLocal), the overlap is not counted twice, so
 * C_struct stays a probability mass in [0, 1].
 */
export function proxyStatsF64(p: Problem, o: ProxyOptions): ProxyStats {
  const { q, k } = p;
  const H = q.heads;
  const d = q.dim;
  const m = q.rows;
  const n = k.rows;
  const B = o.blockSize;
  const Nb = Math.ceil(n / B);
  const b = Math.min(B, m);
  const cStruct = new Float64Array(H);
  const verticalBlocks = new Float64Array(H * Nb);
  const slashBlocks = new Float64Array(H * Nb);
  const pooledEstimate = new Float64Array(H * Nb);
  const rowEntropy = new Float64Array(H);
  const av = new Float64Array(n);
  const as = new Float64Array(n);
  const verticalTokens = o.tokenScores ? new Float32Array(H * n) : undefined;
  const slashTokens = o.tokenScores ? new Float32Array(H * n) : undefined;
  const s = new Scratch(n, d, Math.ceil(n / B));
  const sinkEnd = Math.min(o.wSink, n);
  const localStart = Math.max(n - o.wLocal, sinkEnd);
  const kMeans = blockMeans(k, B, 0, Nb).mean;
  const qMean = new Float64Array(d);
  const pooledLogits = new Float64Array(Nb);
  for (let h = 0; h < H; h++) {
    av.fill(0);
    as.fill(0);
    let anchor = 0;
    let entropy = 0;
    for (let t = 0; t < b; t++) {
      const i = m - b + t;
      const pos = n - m + i;
      s.ranges[0] = 0;
      s.ranges[1] = pos + 1;
      // attendRow leaves exp(x_j - max) in scores; normalise them into the row of Â.
      attendRow(p, h, i, 1, s, undefined, 0);
      const sc = s.scores;
      let sum = 0;
      for (let j = 0; j <= pos; j++) sum += sc[j];
      const inv = 1 / sum;
      for (let j = 0; j <= pos; j++) {
        const P = sc[j] * inv;
        av[j] += P;
        as[pos - j] += P;
        if (j < sinkEnd || j >= localStart) anchor += P;
        if (P > 0) entropy -= P * Math.log(P);
      }
    }
    const invB = 1 / b;
    cStruct[h] = anchor * invB;
    rowEntropy[h] = entropy * invB;
    for (let j = 0; j < n; j++) {
      av[j] *= invB;
      as[j] *= invB;
      verticalBlocks[h * Nb + Math.floor(j / B)] += av[j];
      slashBlocks[h * Nb + Math.floor(j / B)] += as[j];
    }
    if (verticalTokens && slashTokens) {
      for (let j = 0; j < n; j++) {
        verticalTokens[h * n + j] = av[j];
        slashTokens[h * n + j] = as[j];
      }
    }
    // FlexPrefill's pooled estimate ā = softmax_J(mean_i(Q̂_i) · K̄_J · scale).
    proxyQueryMean(q, h, b, qMean);
    pooledEstimateOf(qMean, kMeans, kvHeadOf(h, H, k.heads), Nb, p.scale, pooledLogits, pooledEstimate.subarray(h * Nb, (h + 1) * Nb));
  }
  return {
    n,
    heads: H,
    blockSize: B,
    numBlocks: Nb,
    proxyRows: b,
    cStruct,
    verticalBlocks,
    slashBlocks,
    pooledEstimate,
    rowEntropy,
    verticalTokens,
    slashTokens,
  };
}

/** Mean of head h's last b query rows (the proxy rows Q̂) into qMean [d]. */
export function proxyQueryMean(q: HeadMajor, h: number, b: number, qMean: Float64Array): Float64Array {
  const d = q.dim;
  const m = q.rows;
  qMean.fill(0);
  for (let t = 0; t < b; t++) {
    const qo = (h * m + (m - b + t)) * d;
    for (let c = 0; c < d; c++) qMean[c] += q.data[qo + c];
  }
  const invB = 1 / b;
  for (let c = 0; c < d; c++) qMean[c] *= invB;
  return qMean;
}

/**
 * FlexPrefill's pooled estimate of one head, ā = softmax_J(q̄ · K̄_J · scale), into out [Nb]:
 * q̄ the proxy rows' mean (proxyQueryMean), K̄ [Hkv][Nb][d] the key block means (blockMeans),
 * g the head's kv head; `logits` is [Nb] scratch.
 */
export function pooledEstimateOf(qMean: Float64Array, kMeans: Float64Array, g: number, Nb: number, scale: number, logits: Float64Array, out: Float64Array): Float64Array {
  const d = qMean.length;
  let mx = Number.NEGATIVE_INFINITY;
  for (let J = 0; J < Nb; J++) {
    const ko = (g * Nb + J) * d;
    let dot = 0;
    for (let c = 0; c < d; c++) dot += qMean[c] * kMeans[ko + c];
    logits[J] = dot * scale;
    if (logits[J] > mx) mx = logits[J];
  }
  let z = 0;
  for (let J = 0; J < Nb; J++) z += Math.exp(logits[J] - mx);
  for (let J = 0; J < Nb; J++) out[J] = Math.exp(logits[J] - mx) / z;
  return out;
}
