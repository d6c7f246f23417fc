/**
 * How a sequence is sharded over ranks: zig-zag, the causal load balance of context-parallel
 * attention. The Nb blocks are cut into 2P chunks of whole blocks (as even as they go); rank r
 * holds chunks r and 2P - 1 - r, so every rank holds one early and one late chunk and the
 * causal work (which grows with the position) is about even. A shard is the concatenation of
 * its ranges in position order; every range starts on a block boundary, so each block lives
 * on exactly one rank.
 */
import { describeValue, type HostData, type HostTensor, InvalidArgumentError, ShapeError } from '@crisp/core';

/** Rows [start, end) of the sequence. */
export interface RowRange {
  readonly start: number;
  readonly end: number;
}

export interface ShardLayout {
  readonly n: number;
  readonly size: number;
  readonly blockSize: number;
  readonly numBlocks: number;
  /** per rank: its ranges, ascending and non-empty (one or two; every rank holds at least one block) */
  readonly ranges: readonly (readonly RowRange[])[];
  /** per block: the rank that holds it */
  readonly owner: Int32Array;
}

/** The zig-zag layout of n positions over `size` ranks, in blocks of `blockSize`. */
export function zigzagLayout(n: number, size: number, blockSize: number): ShardLayout {
  if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError(`n must be a positive integer; got ${String(n)}`);
  if (!Number.isInteger(size) || size < 1) throw new InvalidArgumentError(`size (ranks) must be a positive integer; got ${String(size)}`);
  if (!Number.isInteger(blockSize) || blockSize < 1) throw new InvalidArgumentError(`blockSize must be a positive integer; got ${String(blockSize)}`);
  const Nb = Math.ceil(n / blockSize);
  if (Nb < size) throw new InvalidArgumentError(`${n} positions make ${Nb} blocks of ${blockSize}: too few for ${size} ranks (each needs a block); use fewer ranks`);
  const chunks = 2 * size;
  const owner = new Int32Array(Nb);
  const ranges: RowRange[][] = Array.from({ length: size }, () => []);
  for (let c = 0; c < chunks; c++) {
    const b0 = Math.floor((c * Nb) / chunks);
    const b1 = Math.floor(((c + 1) * Nb) / chunks);
    if (b1 <= b0) continue;
    const rank = c < size ? c : chunks - 1 - c;
    owner.fill(rank, b0, b1);
    ranges[rank].push({ start: b0 * blockSize, end: Math.min(b1 * blockSize, n) });
  }
  return { n, size, blockSize, numBlocks: Nb, ranges, owner };
}

/**
 * Checks that `layout` is a ShardLayout (what zigzagLayout returns): an INVALID_ARGUMENT naming
 * `entry` otherwise, instead of a TypeError from inside.
 */
export function assertLayout(layout: unknown, entry: string): asserts layout is ShardLayout {
  const l = layout as Partial<ShardLayout> | null | undefined;
  const ok =
    l !== null &&
    typeof l === 'object' &&
    Number.isInteger(l.n) &&
    Number.isInteger(l.size) &&
    Number.isInteger(l.blockSize) &&
    Number.isInteger(l.numBlocks) &&
    Array.isArray(l.ranges) &&
    l.ranges.length === l.size &&
    l.ranges.every((rs) => Array.isArray(rs) && rs.every((r) => Number.isInteger(r?.start) && Number.isInteger(r?.end) && r.start < r.end && r.end <= l.n!)) &&
    l.owner instanceof Int32Array &&
    l.owner.length === l.numBlocks;
  if (!ok) throw new InvalidArgumentError(`${entry}: the layout must be a ShardLayout, as zigzagLayout(n, ranks, blockSize) returns; got ${describeValue(layout)}`);
}

function assertRank(layout: ShardLayout, rank: number, entry: string): void {
  if (!Number.isInteger(rank) || rank < 0 || rank >= layout.size) throw new InvalidArgumentError(`${entry}: rank must be an integer in [0, ${layout.size}); got ${String(rank)}`);
}

/** Rows a rank holds. */
export function shardRows(layout: ShardLayout, rank: number): number {
  let rows = 0;
  for (const r of layout.ranges[rank]) rows += r.end - r.start;
  return rows;
}

/** New host storage of `length` values of the same kind as `data` (f32 values, or f16/bf16 bits). */
export function storageLike(data: HostData, length: number): HostData {
  return data instanceof Float32Array ? new Float32Array(length) : new Uint16Array(length);
}

/** Row i of the shard is row `positions[i]` of the sequence. */
export function shardPositions(layout: ShardLayout, rank: number): Int32Array {
  const out = new Int32Array(shardRows(layout, rank));
  let at = 0;
  for (const r of layout.ranges[rank]) for (let p = r.start; p < r.end; p++) out[at++] = p;
  return out;
}

/** The rank's shard of a whole [n, ...] host tensor: its rows, in position order (a copy). */
export function shardTensor(layout: ShardLayout, rank: number, whole: HostTensor): HostTensor {
  assertLayout(layout, 'shardTensor');
  assertRank(layout, rank, 'shardTensor');
  if (!whole || typeof whole !== 'object' || !Array.isArray(whole.shape)) throw new InvalidArgumentError(`shardTensor: the tensor must be a host tensor { dtype, shape, data }; got ${describeValue(whole)}`);
  if (whole.shape[0] !== layout.n) throw new ShapeError(`shardTensor: the tensor has ${whole.shape[0]} rows, the layout ${layout.n}`);
  const per = whole.shape.slice(1).reduce((a, b) => a * b, 1);
  return shardFromRows(layout, rank, (start, end) => ({
    dtype: whole.dtype,
    shape: [end - start, ...whole.shape.slice(1)],
    data: whole.data.subarray(start * per, end * per),
  }));
}

/**
 * The rank's shard built from its own rows only: `rows(start, end)` gives rows [start, end)
 * of the sequence as a [end - start, ...] tensor (read from a file, generated, downloaded),
 * and is called once per range of the rank, in position order. The same shard as
 * `shardTensor` of the whole tensor, without any rank holding the whole of it.
 */
export function shardFromRows(layout: ShardLayout, rank: number, rows: (start: number, end: number) => HostTensor): HostTensor {
  assertLayout(layout, 'shardFromRows');
  assertRank(layout, rank, 'shardFromRows');
  if (typeof rows !== 'function') throw new InvalidArgumentError(`shardFromRows: rows must be a function (start, end) => host tensor; got ${describeValue(rows)}`);
  const parts = layout.ranges[rank].map((r) => {
    const t = rows(r.start, r.end);
    if (t.shape[0] !== r.end - r.start) throw new ShapeError(`shardFromRows: rows(${r.start}, ${r.end}) gave ${t.shape[0]} rows, expected ${r.end - r.start}`);
    return t;
  });
  const first = parts[0];
  const per = first.shape.slice(1).reduce((a, b) => a * b, 1);
  const out = storageLike(first.data, shardRows(layout, rank) * per);
  let at = 0;
  for (const t of parts) {
    if (t.dtype !== first.dtype || t.shape.slice(1).join() !== first.shape.slice(1).join()) {
      throw new ShapeError(`shardFromRows: the ranges' tensors differ (${first.dtype} [${first.shape}] and ${t.dtype} [${t.shape}])`);
    }
    out.set(t.data.subarray(0, t.shape[0] * per), at);
    at += t.shape[0] * per;
  }
  return { dtype: first.dtype, shape: [shardRows(layout, rank), ...first.shape.slice(1)], data: out };
}

/** The whole [n, ...] tensor from every rank's shard (the inverse of shardTensor). */
export function unshardTensor(layout: ShardLayout, shards: readonly HostTensor[]): HostTensor {
  assertLayout(layout, 'unshardTensor');
  if (!Array.isArray(shards as unknown)) throw new InvalidArgumentError(`unshardTensor: shards must be an array of host tensors, one per rank; got ${describeValue(shards)}`);
  if (shards.length !== layout.size) throw new ShapeError(`unshardTensor: ${shards.length} shards for ${layout.size} ranks`);
  shards.forEach((s, rank) => {
    if (!s || typeof s !== 'object' || !Array.isArray(s.shape) || !s.data) throw new InvalidArgumentError(`unshardTensor: rank ${rank}'s shard is not a host tensor { dtype, shape, data }`);
  });
  const first = shards[0];
  const per = first.shape.slice(1).reduce((a, b) => a * b, 1);
  const out = storageLike(first.data, layout.n * per);
  shards.forEach((s, rank) => {
    if (s.shape[0] !== shardRows(layout, rank) || s.dtype !== first.dtype) {
      throw new ShapeError(`unshardTensor: rank ${rank}'s shard is ${s.dtype} [${s.shape}], expected ${first.dtype} with ${shardRows(layout, rank)} rows`);
    }
    let at = 0;
    for (const r of layout.ranges[rank]) {
      out.set(s.data.subarray(at * per, (at + r.end - r.start) * per), r.start * per);
      at += r.end - r.start;
    }
  });
  return { dtype: first.dtype, shape: [layout.n, ...first.shape.slice(1)], data: out };
}
