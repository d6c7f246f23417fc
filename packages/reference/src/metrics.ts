/**
 * Host-side metrics over host tensors (docs/ALGORITHM.md, "Metrics"): output error, mass
 * recall, and exact attention for a few query rows, all in float64. The CLI, the bench and
 * the conformance suite use them to check GPU backends at lengths where full reference
 * attention would be too slow: compare sampled rows instead.
 *
 * Shape legend: q [m, H, d], k and v [n, Hkv, d]; query row i sits at position n - m + i.
 */
import {
  type BlockMask,
  type HostTensor,
  InvalidArgumentError,
  ShapeError,
  attentionShape,
  defaultScale,
  expandToRows,
  numBlocks,
  toFloat32,
  validateMask,
} from '@crisp/core';
import { attendMany, attendRow, kvHeadOf, Scratch, toHeadMajor } from './math.js';
import { PooledMap, sortedEntries } from './pooled.js';

export interface PerHead {
  /** [H] one value per query head */
  readonly perHead: Float64Array;
  readonly overall: number;
}

/**
 * Relative error ‖a − b‖ / ‖b‖ (Frobenius), per head and overall, with `b` the reference.
 * Tensors of rank 3 ([rows, H, d]) are split by head (axis 1); other ranks give one "head".
 * When ‖b‖ = 0 the ratio is 0 if a equals b and Infinity otherwise. NaN anywhere gives NaN.
 */
export function relativeError(a: HostTensor, b: HostTensor): PerHead {
  if (a.shape.length !== b.shape.length || a.shape.some((s, i) => s !== b.shape[i])) {
    throw new ShapeError(`relativeError needs equal shapes; got [${a.shape}] and [${b.shape}]`);
  }
  const av = toFloat32(a);
  const bv = toFloat32(b);
  const H = a.shape.length === 3 ? a.shape[1] : 1;
  const d = a.shape.length === 3 ? a.shape[2] : av.length;
  const diff = new Float64Array(H);
  const ref = new Float64Array(H);
  for (let f = 0; f < av.length; f++) {
    const h = Math.floor(f / d) % H;
    const e = av[f] - bv[f];
    diff[h] += e * e;
    ref[h] += bv[f] * bv[f];
  }
  const ratio = (x: number, y: number) => (y > 0 ? Math.sqrt(x / y) : x === 0 ? 0 : Number.POSITIVE_INFINITY);
  let sx = 0;
  let sy = 0;
  const perHead = new Float64Array(H);
  for (let h = 0; h < H; h++) {
    perHead[h] = ratio(diff[h], ref[h]);
    sx += diff[h];
    sy += ref[h];
  }
  return { perHead, overall: ratio(sx, sy) };
}

/** Evenly spaced query rows (always including the last), at most `count`. */
export function sampleRows(m: number, count: number): number[] {
  if (!Number.isInteger(count) || count < 1) throw new InvalidArgumentError(`row count must be >= 1; got ${count}`);
  if (count >= m) return Array.from({ length: m }, (_, i) => i);
  const rows: number[] = [];
  for (let t = 0; t < count; t++) rows.push(Math.round(((t + 1) * (m - 1)) / count));
  return Array.from(new Set(rows)).sort((x, y) => x - y);
}

function checkRows(rows: readonly number[], m: number): void {
  if (!Array.isArray(rows) || rows.length === 0) throw new InvalidArgumentError('rows must be a non-empty array');
  for (const r of rows) {
    if (!Number.isInteger(r) || r < 0 || r >= m) {
      throw new InvalidArgumentError(`query row ${r} is outside [0, ${m - 1}]`);
    }
  }
}

export interface MassRecallOptions {
  /** query rows (indices into q) to average over; default: sampleRows(m, sampleCount) */
  readonly rows?: readonly number[];
  /** rows sampled when `rows` is not given (default 256) */
  readonly sampleCount?: number;
  readonly scale?: number;
}

/**
 * Mass recall: the fraction of exact dense attention probability that falls inside the
 * mask's blocks, averaged over the query rows, per head and overall (mean over heads).
 */
export function massRecall(q: HostTensor, k: HostTensor, mask: BlockMask, opts: MassRecallOptions = {}): PerHead {
  const shape = attentionShape(q, k, k);
  const { queries: m, keys: n, heads: H, headDim: d } = shape;
  // (query blocks before a chunk's first query row may stay empty)
  validateMask(mask, { heads: H, numBlocks: numBlocks(n, mask.blockSize) }, { firstQueryBlock: Math.floor((n - m) / mask.blockSize) });
  const B = mask.blockSize;
  const rows = opts.rows ?? sampleRows(m, opts.sampleCount ?? 256);
  checkRows(rows as number[], m);
  const expanded = expandToRows(mask);
  const qf = toHeadMajor(q.dtype, q.shape, q.data, 'q');
  const kf = toHeadMajor(k.dtype, k.shape, k.data, 'k');
  const p = { q: qf, k: kf, scale: opts.scale ?? defaultScale(d) };
  const Nb = numBlocks(n, B);
  const s = new Scratch(n, d, Nb);
  const inMask = new Uint8Array(Nb);
  const perHead = new Float64Array(H);
  for (let h = 0; h < H; h++) {
    let acc = 0;
    for (const i of rows) {
      const pos = n - m + i;
      const I = Math.floor(pos / B);
      s.ranges[0] = 0;
      s.ranges[1] = pos + 1;
      attendRow(p, h, i, 1, s, undefined, 0);
      inMask.fill(0);
      const r = h * Nb + I;
      for (let t = expanded.rowPtr[r]; t < expanded.rowPtr[r + 1]; t++) inMask[expanded.cols[t]] = 1;
      let total = 0;
      let inside = 0;
      for (let j = 0; j <= pos; j++) {
        const e = s.scores[j];
        total += e;
        if (inMask[Math.floor(j / B)]) inside += e;
      }
      acc += inside / total;
    }
    perHead[h] = acc / rows.length;
  }
  let o = 0;
  for (const x of perHead) o += x;
  return { perHead, overall: o / H };
}

export interface AttentionRowsResult {
  /** float64 [rows.length, H, d] */
  readonly output: Float64Array;
  /** float64 [H, rows.length], natural-log log-sum-exp of the scaled logits */
  readonly lse: Float64Array;
  readonly shape: readonly [number, number, number];
}

/**
 * Exact attention (float64) for only the listed query rows: dense causal, or restricted to
 * the mask's blocks (causal inside the diagonal block). Cost O(rows · n · d · H).
 */
export function attentionRows(
  q: HostTensor,
  k: HostTensor,
  v: HostTensor,
  rows: readonly number[],
  mask?: BlockMask,
  opts: { scale?: number } = {},
): AttentionRowsResult {
  const shape = attentionShape(q, k, v);
  const { queries: m, keys: n, heads: H, headDim: d } = shape;
  checkRows(rows as number[], m);
  let expanded: ReturnType<typeof expandToRows> | undefined;
  let B = 128;
  if (mask) {
    validateMask(mask, { heads: H, numBlocks: numBlocks(n, mask.blockSize) }, { firstQueryBlock: Math.floor((n - m) / mask.blockSize) });
    expanded = expandToRows(mask);
    B = mask.blockSize;
  }
  const p = {
    q: toHeadMajor(q.dtype, q.shape, q.data, 'q'),
    k: toHeadMajor(k.dtype, k.shape, k.data, 'k'),
    v: toHeadMajor(v.dtype, v.shape, v.data, 'v'),
    scale: opts.scale ?? defaultScale(d),
  };
  const res = attendMany(p, rows, expanded, B);
  return { ...res, shape: [rows.length, H, d] };
}

// Re-exported for tests that need the GQA mapping the reference uses.
export { kvHeadOf };

export interface PooledBlockMap {
  readonly numBlocks: number;
  /** flat index f -> query block I and key block J (row-major I, then J <= I) */
  readonly flatI: Int32Array;
  readonly flatJ: Int32Array;
  /** per listed head: the normalised pooled map Ā (sums to 1), flattened */
  readonly values: Float64Array[];
  /** per listed head: flat indices by descending value, ties to the lower index */
  readonly order: Int32Array[];
}

/**
 * The PE path's pooled block map (what peBlockRows cuts at γ), in float64, for the listed
 * query heads. Conformance checks use it to tell a real error in a backend's PE rows from a
 * borderline entry whose cumulative mass sits within tolerance of γ.
 */
export function pooledBlockMap(
  q: HostTensor,
  k: HostTensor,
  blockSize: number,
  heads: readonly number[],
  opts: { scale?: number } = {},
): PooledBlockMap {
  const shape = attentionShape(q, k, k);
  if (!Number.isInteger(blockSize) || blockSize < 1) throw new InvalidArgumentError(`blockSize must be a positive integer; got ${blockSize}`);
  for (const h of heads) {
    if (!Number.isInteger(h) || h < 0 || h >= shape.heads) throw new InvalidArgumentError(`head ${h} is outside [0, ${shape.heads - 1}]`);
  }
  const map = PooledMap.of(
    {
      q: toHeadMajor(q.dtype, q.shape, q.data, 'q'),
      k: toHeadMajor(k.dtype, k.shape, k.data, 'k'),
      scale: opts.scale ?? defaultScale(shape.headDim),
    },
    blockSize,
  );
  const values = heads.map((h) => map.values(h, new Float64Array(map.entries)));
  return { numBlocks: map.Nb, flatI: map.flatI, flatJ: map.flatJ, values, order: values.map(sortedEntries) };
}
