/**
 * The proxy statistics and the pooled block map of a sharded sequence, made by every rank
 * together so that each ends with the same values (reduced in rank order), in float64 on the
 * host from the rank's own rows.
 *
 * What crosses between ranks (H heads, Hkv kv heads, d head dim, b = min(B, n) proxy rows,
 * Nb blocks, P ranks):
 * 1. the proxy rows Q̂ (b·H·d values, from the rank or two that hold positions n - b .. n - 1);
 * 2. each rank's log-sum-exp of every proxy row over its own keys (H·b values), so every rank
 *    normalises its part of Â by the same global log-sum-exp;
 * 3. the partial sums: C_struct, the row entropy, p_v and p_s (2H + 2H·Nb values), plus the
 *    token scores a_v and a_s (2H·n) only for a policy that reads them;
 * 4. the key block means K̄ (Hkv·Nb·d), for the pooled estimate and the PE map;
 * 5. the query block means Q̄ (H·Nb·d), only when some head is routed to PE.
 *
 * p_v, the pooled estimate and the PE rows equal a single reference backend's bit for bit
 * (a block's sums run over its own rows in the same order, given the same normaliser); C_struct,
 * the entropy and p_s are sums across ranks and equal it to rounding (about 1e-16 relative).
 */
import { type BlockRows, type HostTensor, InvalidArgumentError, type PeRowsOptions, type ProxyStats, type ProxyStatsOptions } from '@crisp/core';
import { blockMeans, type HeadMajor, kvHeadOf, PooledMap, peRowsOfMap, pooledEstimateOf, proxyQueryMean, toHeadMajor } from '@crisp/reference/f64';
import { bytesOf, type Communicator, f64Of, gatherStep, sumInRankOrder } from './communicator.js';
import { type ShardLayout, shardPositions } from './layout.js';

/** A rank's own rows, decoded to float64 head-major. */
export interface ShardData {
  readonly layout: ShardLayout;
  readonly rank: number;
  /** [H][rows][d] */
  readonly q: HeadMajor;
  /** [Hkv][rows][d] */
  readonly k: HeadMajor;
  /** position of each row, ascending */
  readonly positions: Int32Array;
}

/** Decode a rank's q and k shards (NaN or Inf is a NonFiniteError naming the rank's row). */
export function shardData(layout: ShardLayout, rank: number, q: HostTensor, k: HostTensor): ShardData {
  return {
    layout,
    rank,
    q: toHeadMajor(q.dtype, q.shape, q.data, `rank ${rank}'s q shard`),
    k: toHeadMajor(k.dtype, k.shape, k.data, `rank ${rank}'s k shard`),
    positions: shardPositions(layout, rank),
  };
}

/** Number of the shard's rows at positions <= pos (the rows are ascending). */
function rowsUpTo(positions: Int32Array, pos: number): number {
  let lo = 0;
  let hi = positions.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (positions[mid] <= pos) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** Logits of proxy row t of head h against the shard's first `count` keys, into out; returns their max. */
function logits(qHat: HeadMajor, h: number, t: number, k: HeadMajor, g: number, count: number, scale: number, out: Float64Array): number {
  const d = qHat.dim;
  const qo = (h * qHat.rows + t) * d;
  let mx = Number.NEGATIVE_INFINITY;
  for (let j = 0; j < count; j++) {
    const ko = (g * k.rows + j) * d;
    let dot = 0;
    for (let c = 0; c < d; c++) dot += qHat.data[qo + c] * k.data[ko + c];
    const x = dot * scale;
    out[j] = x;
    if (x > mx) mx = x;
  }
  return mx;
}

/** Q̂, the last b rows of the sequence, gathered from the ranks that hold them: [H][b][d]. */
async function gatherProxyRows(comm: Communicator, s: ShardData, b: number): Promise<HeadMajor> {
  const { n } = s.layout;
  const { heads: H, dim: d } = s.q;
  const parts = await gatherStep(comm, 'gathering the proxy rows', () => {
    const first = rowsUpTo(s.positions, n - b - 1);
    const rows = s.positions.length - first;
    const out = new Float64Array(rows * (1 + H * d));
    for (let r = 0; r < rows; r++) {
      const o = r * (1 + H * d);
      out[o] = s.positions[first + r];
      for (let h = 0; h < H; h++) out.set(s.q.data.subarray((h * s.q.rows + first + r) * d, (h * s.q.rows + first + r + 1) * d), o + 1 + h * d);
    }
    return bytesOf(out);
  });
  const data = new Float64Array(H * b * d);
  for (const p of parts) {
    const v = f64Of(p);
    for (let o = 0; o < v.length; o += 1 + H * d) {
      const t = v[o] - (n - b);
      for (let h = 0; h < H; h++) data.set(v.subarray(o + 1 + h * d, o + 1 + (h + 1) * d), (h * b + t) * d);
    }
  }
  return { rows: b, heads: H, dim: d, data };
}

/** Every rank's block means of `x` (its own blocks), gathered into [heads][Nb][d] with the row counts. */
async function gatherBlockMeans(comm: Communicator, s: ShardData, x: HeadMajor, what: string): Promise<{ mean: Float64Array; count: Int32Array }> {
  const { numBlocks: Nb, blockSize: B, ranges, owner } = s.layout;
  const { heads, dim: d } = x;
  const parts = await gatherStep(comm, `gathering the ${what} block means`, () => {
    let owned = 0;
    for (let J = 0; J < Nb; J++) if (owner[J] === s.rank) owned++;
    const out = new Float64Array(owned * heads * d);
    let row = 0;
    let at = 0; // the rank's blocks, ascending: the order the ranges hold them in
    for (const r of ranges[s.rank]) {
      const len = r.end - r.start;
      // the range's own blocks, indexed from 0 (r.start is a block boundary, so each block
      // sums the same rows in the same order as over the whole sequence)
      const local = Math.ceil(len / B);
      const m = blockMeans(sliceRows(x, row, len), B, 0, local).mean;
      for (let j = 0; j < local; j++, at++) {
        for (let h = 0; h < heads; h++) out.set(m.subarray((h * local + j) * d, (h * local + j + 1) * d), (at * heads + h) * d);
      }
      row += len;
    }
    return bytesOf(out);
  });
  const mean = new Float64Array(heads * Nb * d);
  const count = new Int32Array(Nb);
  parts.forEach((p, rank) => {
    const v = f64Of(p);
    let at = 0;
    for (let J = 0; J < Nb; J++) {
      if (owner[J] !== rank) continue;
      for (let h = 0; h < heads; h++) mean.set(v.subarray((at * heads + h) * d, (at * heads + h + 1) * d), (h * Nb + J) * d);
      at++;
    }
  });
  for (let J = 0; J < Nb; J++) count[J] = Math.min(B, s.layout.n - J * B);
  return { mean, count };
}

/** Rows [row, row + len) of a head-major tensor, as their own head-major tensor. */
function sliceRows(x: HeadMajor, row: number, len: number): HeadMajor {
  const { heads, dim: d } = x;
  const data = new Float64Array(heads * len * d);
  for (let h = 0; h < heads; h++) data.set(x.data.subarray((h * x.rows + row) * d, (h * x.rows + row + len) * d), h * len * d);
  return { rows: len, heads, dim: d, data };
}

/** logsumexp of each row over the ranks' parts, added in rank order. */
function globalLse(parts: readonly Uint8Array[], len: number): Float64Array {
  const lse = parts.map(f64Of);
  const out = new Float64Array(len);
  for (let i = 0; i < len; i++) {
    let mx = Number.NEGATIVE_INFINITY;
    for (const l of lse) if (l[i] > mx) mx = l[i];
    let z = 0;
    for (const l of lse) z += Math.exp(l[i] - mx);
    out[i] = mx + Math.log(z);
  }
  return out;
}

/**
 * The statistics and the PE rows of the whole sequence, from every rank's shard (every rank
 * calls it, with the same options; each gets the same values).
 */
export class ShardStatistics {
  readonly #comm: Communicator;
  readonly #s: ShardData;
  readonly #scale: number;
    #kMeans: Float64Array | undefined;

  constructor(comm: Communicator, shard: ShardData, scale: number) {
    this.#comm = comm;
    this.#s = shard;
    this.#scale = scale;
  }

  async proxyStats(opts: ProxyStatsOptions): Promise<ProxyStats> {
    const s = this.#s;
    const comm = this.#comm;
    const { n, blockSize: B, numBlocks: Nb } = s.layout;
    const { heads: H, dim: d } = s.q;
    const Hkv = s.k.heads;
    const scale = opts.scale ?? this.#scale;
    const b = Math.min(B, n);
    const qHat = await gatherProxyRows(comm, s, b);
    const rows = s.positions.length;
    const x = new Float64Array(Math.max(rows, 1));
    const counts = new Int32Array(b);
    for (let t = 0; t < b; t++) counts[t] = rowsUpTo(s.positions, n - b + t);
    // 1. each proxy row's log-sum-exp over this rank's keys
    const lseParts = await gatherStep(comm, 'the proxy rows\' log-sum-exp', () => {
      const lse = new Float64Array(H * b);
      for (let h = 0; h < H; h++) {
        const g = kvHeadOf(h, H, Hkv);
        for (let t = 0; t < b; t++) {
          const count = counts[t];
          if (count === 0) {
            lse[h * b + t] = Number.NEGATIVE_INFINITY;
            continue;
          }
          const mx = logits(qHat, h, t, s.k, g, count, scale, x);
          let z = 0;
          for (let j = 0; j < count; j++) z += Math.exp(x[j] - mx);
          lse[h * b + t] = mx + Math.log(z);
        }
      }
      return bytesOf(lse);
    });
    const lse = globalLse(lseParts, H * b);
    // 2. this rank's part of every statistic, normalised by the global log-sum-exp
    const tokens = opts.tokenScores === true;
    const sinkEnd = Math.min(opts.wSink, n);
    const localStart = Math.max(n - opts.wLocal, sinkEnd);
    const width = 2 * H + 2 * H * Nb + (tokens ? 2 * H * n : 0);
    const sumParts = await gatherStep(comm, 'the partial statistics', () => {
      const part = new Float64Array(width);
      const av = new Float64Array(rows);
      const as = new Float64Array(n);
      const invB = 1 / b;
      for (let h = 0; h < H; h++) {
        const g = kvHeadOf(h, H, Hkv);
        av.fill(0);
        as.fill(0);
        let anchor = 0;
        let entropy = 0;
        for (let t = 0; t < b; t++) {
          const count = counts[t];
          if (count === 0) continue;
          const pos = n - b + t;
          logits(qHat, h, t, s.k, g, count, scale, x);
          const L = lse[h * b + t];
          for (let j = 0; j < count; j++) {
            const P = Math.exp(x[j] - L);
            const at = s.positions[j];
            av[j] += P;
            as[pos - at] += P;
            if (at < sinkEnd || at >= localStart) anchor += P;
            if (P > 0) entropy -= P * Math.log(P);
          }
        }
        part[h] = anchor;
        part[H + h] = entropy;
        const vOff = 2 * H + h * Nb;
        const sOff = 2 * H + H * Nb + h * Nb;
        for (let j = 0; j < rows; j++) {
          av[j] *= invB;
          part[vOff + Math.floor(s.positions[j] / B)] += av[j];
        }
        for (let o = 0; o < n; o++) {
          as[o] *= invB;
          part[sOff + Math.floor(o / B)] += as[o];
        }
        if (tokens) {
          const tOff = 2 * H + 2 * H * Nb;
          for (let j = 0; j < rows; j++) part[tOff + h * n + s.positions[j]] = av[j];
          part.set(as, tOff + H * n + h * n);
        }
      }
      return bytesOf(part);
    });
    const sums = sumInRankOrder(sumParts, width);
    // 3. the pooled estimate from the gathered key block means (as the reference computes it)
    const kMeans = (await gatherBlockMeans(comm, s, s.k, 'key')).mean;
    this.#kMeans = kMeans;
    const pooledEstimate = new Float64Array(H * Nb);
    const qMean = new Float64Array(d);
    const scratch = new Float64Array(Nb);
    for (let h = 0; h < H; h++) {
      proxyQueryMean(qHat, h, b, qMean);
      pooledEstimateOf(qMean, kMeans, kvHeadOf(h, H, Hkv), Nb, scale, scratch, pooledEstimate.subarray(h * Nb, (h + 1) * Nb));
    }
    const cStruct = new Float64Array(H);
    const rowEntropy = new Float64Array(H);
    for (let h = 0; h < H; h++) {
      cStruct[h] = sums[h] / b;
      rowEntropy[h] = sums[H + h] / b;
    }
    const tOff = 2 * H + 2 * H * Nb;
    const stats: ProxyStats = {
      n,
      heads: H,
      blockSize: B,
      numBlocks: Nb,
      proxyRows: b,
      cStruct,
      verticalBlocks: sums.slice(2 * H, 2 * H + H * Nb),
      slashBlocks: sums.slice(2 * H + H * Nb, tOff),
      pooledEstimate,
      rowEntropy,
      ...(tokens ? { verticalTokens: Float32Array.from(sums.subarray(tOff, tOff + H * n)), slashTokens: Float32Array.from(sums.subarray(tOff + H * n)) } : {}),
    };
    // (hostPlan checks every statistic is finite: the same values on every rank, so every rank stops there together)
    return stats;
  }

  /** The PE heads' rows: the query block means are gathered here (only plans with PE heads call it). */
  async peBlockRows(opts: PeRowsOptions): Promise<BlockRows> {
    const s = this.#s;
    if (!this.#kMeans) throw new InvalidArgumentError('peBlockRows before proxyStats: the key block means are gathered with the statistics');
    const qm = await gatherBlockMeans(this.#comm, s, s.q, 'query');
    const map = new PooledMap(qm, this.#kMeans, {
      heads: s.q.heads,
      kvHeads: s.k.heads,
      dim: s.q.dim,
      numBlocks: s.layout.numBlocks,
      scale: opts.scale ?? this.#scale,
    });
    return peRowsOfMap(map, opts.gamma, opts.heads);
  }
}
