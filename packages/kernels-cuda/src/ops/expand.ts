/**
 * VS lists and block rows expanded to sorted rows on the device (kernels/mask/mask.cu): the
 * count, the row-pointer scan and the write, with the rows' entries checked while counting.
 */
import { type BlockMask, type BlockRows, MaskError, assertBlockSize, validateMask } from '@crisp/core';
import { NO_BAD_ROW } from '../plan/plan-layout.js';
import type { CudaContext } from '../runtime/context.js';
import { check } from '../runtime/ffi.js';
import { I, P } from '../runtime/launcher.js';
import type { DeviceBlock } from '../runtime/pool.js';
import { CUDA_CAPABILITIES } from '../runtime/context.js';

/** expand's VS part: host lists, or their device pointers [verticalPtr, vertical, slashPtr, slash] */
type ExpandVs = BlockMask['vs'] | { device: readonly [number, number, number, number] };
type ExpandRows = { rowPtr: number; cols: number; heads?: readonly number[]; headList?: number } | undefined;
/** expanded and read back: the total and each head's first row pointer */
type ExpandRead = { rowPtr: DeviceBlock; cols: DeviceBlock; total: number; headPtr: Int32Array };
/** expanded, nothing read: the summary [headPtr H + 1][total][bad row] left at `summary` on the device */
type ExpandUnread = { rowPtr: DeviceBlock; cols: DeviceBlock; summary: number };

/**
 * expand without a read: the summary left at `summary` on the device; `only` keeps the rows
 * of the heads routed `want` in `routes` ([H] on the device, 1 = VS; a device plan's mask in
 * two parts), the others empty; `room`: the cols' size in ints when fewer than every head's
 * causal triangle can be filled.
 */
export interface ExpandUnreadAt {
  readonly summary: number;
  readonly only?: { readonly routes: number; readonly want: 0 | 1 };
  readonly room?: number;
}

/** Expand a validated mask on the device; the caller releases the blocks. */
export function expandOnDevice(cx: CudaContext, mask: BlockMask): { rowPtr: DeviceBlock; cols: DeviceBlock; total: number; temp: DeviceBlock[] } {
  const temp: DeviceBlock[] = [];
  try {
    const rows = mask.rows
      ? { rowPtr: uploadTemp(cx, mask.rows.rowPtr, temp), cols: uploadTemp(cx, mask.rows.cols, temp) }
      : undefined;
    return { ...expand(cx, mask.heads, mask.numBlocks, mask.vs, rows, temp), temp };
  } catch (e) {
    cx.releaseBlocks(temp);
    throw e;
  }
}

export function uploadTemp(cx: CudaContext, a: Int32Array | Float32Array | Float64Array, temp: DeviceBlock[]): number {
  const b = cx.uploadArray(a);
  temp.push(b);
  return b.ptr;
}

/**
 * Exclusive scan of N ints on the device: out[0..N) and out[N] = the total. Tiles of 4096
 * (exclusive_scan_sums, then exclusive_scan_tiles; one tile needs no sums). The tile-sum
 * scratch goes to `temp` for the caller to release.
 */
export function scan(cx: CudaContext, inPtr: number, outPtr: number, N: number, temp: DeviceBlock[], summary?: { ptr: number; Nb: number; bad: number }): void {
  const tiles = Math.max(1, Math.ceil(N / 4096));
  const sums = cx.scratch(tiles * 4);
  temp.push(sums);
  if (tiles > 1) cx.launch('mask/mask.cu', 'exclusive_scan_sums', [tiles], 256, 0, [P(inPtr), P(sums.ptr), I(N)]);
  cx.launch('mask/mask.cu', 'exclusive_scan_tiles', [tiles], 256, 0, [
    P(inPtr),
    P(sums.ptr),
    P(outPtr),
    I(N),
    P(summary?.ptr ?? 0),
    I(summary?.Nb ?? 1),
    P(summary?.bad ?? 0),
  ]);
}

/**
 * VS lists (host) ∪ block rows (device) -> sorted rows on the device. The rows are either
 * all heads' (`rows.rowPtr` [H·Nb + 1]) or a subset's (`rows.heads`, or `rows.headList`
 * already on the device as [count][heads]: rowPtr [heads·Nb + 1]; expand_count and
 * expand_write find each head's slot in the list, the other heads' rows are empty). Row
 * entries are checked while counting (a MaskError names the first bad row). One upload (the
 * VS lists, the bad-row flag, the heads) and one read (each head's first row pointer, the
 * total and the flag): at 512k every synchronising copy costs a round trip, and the uploads
 * wait for the stream. `unread`: nothing read (ExpandUnreadAt).
 * Scratch goes to `temp`; the caller releases it and the returned blocks. `headPtr` [H + 1]:
 * head h's blocks are headPtr[h + 1] − headPtr[h].
 */
export function expand(cx: CudaContext, H: number, Nb: number, vsIn: ExpandVs, rows: ExpandRows, temp: DeviceBlock[]): ExpandRead;
export function expand(cx: CudaContext, H: number, Nb: number, vsIn: ExpandVs, rows: ExpandRows, temp: DeviceBlock[], unread: ExpandUnreadAt): ExpandUnread;
export function expand(cx: CudaContext, H: number, Nb: number, vsIn: ExpandVs, rows: ExpandRows, temp: DeviceBlock[], unread?: ExpandUnreadAt): ExpandRead | ExpandUnread {
  const only = unread?.only;
  const n = H * Nb;
  // [bad][verticalPtr H+1][vertical][slashPtr H+1][slash][count][heads] (VS lists already
  // on the device: their pointers)
  const vsDevice = vsIn && 'device' in vsIn ? vsIn.device : undefined;
  const vs = vsIn && !('device' in vsIn) ? vsIn : undefined;
  const nh = rows?.heads?.length ?? 0;
  const parts = vs ? [vs.verticalPtr, vs.vertical, vs.slashPtr, vs.slash] : [];
  const len = 1 + parts.reduce((a, x) => a + x.length, 0) + (rows?.heads ? 1 + nh : 0);
  const packed = new Int32Array(len);
  packed[0] = NO_BAD_ROW;
  const offs: number[] = [];
  let o = 1;
  for (const x of parts) {
    offs.push(o);
    packed.set(x, o);
    o += x.length;
  }
  const headsOff = o;
  if (rows?.heads) {
    packed[o] = nh;
    packed.set(rows.heads, o + 1);
  }
  let up: number;
  if (len === 1) {
    // only the bad-row flag (VS lists and head list on the device): set it on the stream
    // rather than a blocking upload
    const flag = cx.scratch(4);
    temp.push(flag);
    check(cx.libs, cx.libs.cu.cuMemsetD32Async(flag.ptr, NO_BAD_ROW, 1, cx.streams.cur), 'cuMemsetD32Async');
    up = flag.ptr;
  } else {
    up = uploadTemp(cx, packed, temp);
  }
  const at = (off: number) => up + off * 4;
  const [vPtr, vert, sPtr, slash] = vsDevice ?? (vs ? offs.map(at) : [0, 0, 0, 0]);
  const bad = up;
  const rPtr = rows ? rows.rowPtr : 0;
  const rCols = rows ? rows.cols : 0;
  // a subset's rows: expand_count and expand_write find each head's slot in the head list
  const hl = rows?.heads || rows?.headList !== undefined ? (rows.headList ?? at(headsOff)) : 0;
  const counts = cx.scratch(n * 4);
  temp.push(counts);
  // a warp per row, 4 rows a 128-thread block, each warp a bitmap of the row's Nb bits
  const words = Math.ceil(Nb / 32);
  // the union's parts, as expand_count and expand_write take them
  const union = [P(vPtr), P(vert), P(sPtr), P(slash), P(rPtr), P(rCols), P(hl), P(only?.routes ?? 0), I(only?.want ?? 0)];
  cx.launch('mask/mask.cu', 'expand_count', [Math.ceil(n / 4)], 128, 4 * words * 4, [...union, P(counts.ptr), I(H), I(Nb), P(bad)]);
  const rowPtr = cx.scratch((n + 1) * 4);
  try {
    let sumPtr = unread?.summary;
    if (sumPtr === undefined) {
      const sum = cx.scratch((H + 2) * 4);
      temp.push(sum);
      sumPtr = sum.ptr;
    }
    // the row pointers, and the summary (each head's first row pointer, the total, the
    // bad-row flag) written by the scan's last launch
    scan(cx, counts.ptr, rowPtr.ptr, n, temp, { ptr: sumPtr, Nb, bad });
    // the rows' entries into room for `entries` ints
    const write = (entries: number): DeviceBlock => {
      const cols = cx.scratch(entries * 4);
      const args = [...union, P(rowPtr.ptr), P(cols.ptr), I(H), I(Nb), P(bad)];
      try {
        cx.launch('mask/mask.cu', 'expand_write', [Math.ceil(n / 4)], 128, 4 * words * 4, args);
      } catch (e) {
        cx.releaseBlock(cols);
        throw e;
      }
      return cols;
    };
    if (unread) {
      // nothing read: room for every causal block (a valid row holds at most I + 1, a bad
      // one is counted 0, and expand_write leaves at once once a row was flagged bad)
      return { rowPtr, cols: write(unread.room ?? (H * Nb * (Nb + 1)) / 2), summary: unread.summary };
    }
    const summary = cx.read(sumPtr, new Int32Array(H + 2));
    const badRow = summary[H + 1];
    if (badRow !== NO_BAD_ROW) {
      const h = Math.floor(badRow / Nb);
      const r = badRow % Nb;
      throw new MaskError(
        `head ${h} row ${r}: block rows must be strictly increasing key blocks in [0, ${r}] (causal); this row is not (checked on the device)`,
      );
    }
    const tot = summary[H];
    return { rowPtr, cols: write(tot), total: tot, headPtr: summary.subarray(0, H + 1) };
  } catch (e) {
    cx.releaseBlock(rowPtr);
    throw e;
  }
}

export function expandMask(cx: CudaContext, mask: BlockMask): BlockRows {
  cx.alive();
  // Row entries are checked on the device while expanding (expand_count).
  validateMask(mask, undefined, { rowEntries: false });
  assertBlockSize(mask.blockSize, CUDA_CAPABILITIES.blockSizes);
  const e = expandOnDevice(cx, mask);
  try {
    const rows = mask.heads * mask.numBlocks;
    return {
      rowPtr: cx.read(e.rowPtr.ptr, new Int32Array(rows + 1)),
      cols: cx.read(e.cols.ptr, new Int32Array(e.total)),
    };
  } finally {
    for (const x of [...e.temp, e.rowPtr, e.cols]) cx.pool.release(x);
  }
}
