/**
 * denseAttention and sparseAttention: causal flash attention over all key tiles or over a
 * block mask's rows, in bounded dispatches (grid [heads, query tiles], heads fastest).
 * The kernel comes from OpHost.attentionPipeline (the backend's choice).
 */
import {
  assertBlockSize,
  assertOutApart,
  CrispError,
  DTypeError,
  type AttentionOptions,
  type AttentionResult,
  type AttentionShape,
  type BlockMask,
  type DeviceTensor,
  InvalidArgumentError,
  numBlocks,
  ShapeError,
  validateMask,
} from '@crisp/core';
import { expandOnDevice } from './expand-mask.js';
import { checkMaskArrays, checkScale, prepare, ready } from './validate.js';
import { LOG2E, type StorageDType } from '../kernels/common.js';
import { type Check, type UniformField, Usage } from '../runtime/gpu-context.js';
import type { WebGpuTensor } from '../runtime/tensor.js';
import type { OpHost } from './host.js';
import { sliceCopyError } from './slice-rows.js';

export async function sparseAttention(
  host: OpHost,
  q: DeviceTensor,
  k: DeviceTensor,
  v: DeviceTensor,
  mask: BlockMask,
  opts: AttentionOptions = {},
): Promise<AttentionResult> {
  const { shape, qt, kt, vt } = prepare(host, q, k, v);
  if (!mask || typeof mask !== 'object') throw new InvalidArgumentError('sparseAttention needs a BlockMask { heads, numBlocks, blockSize, vs?, rows? }');
  checkMaskArrays(mask);
  assertBlockSize(mask.blockSize, host.capabilities.blockSizes);
  const Nb = numBlocks(shape.keys, mask.blockSize);
  // (query blocks before the first query row may stay empty in chunked prefill)
  const firstQueryBlock = Math.floor((shape.keys - shape.queries) / mask.blockSize);
  validateMask(mask, { heads: shape.heads, numBlocks: Nb, blockSize: mask.blockSize }, { firstQueryBlock });
  const out = checkAttentionOptions(host, shape, [qt, kt, vt!], opts);
  await ready(qt, kt, vt, out);
  let rowPtr: GPUBuffer | undefined;
  let cols: GPUBuffer | undefined;
  let blocks: number;
  try {
    if (!mask.vs && mask.rows) {
      const checks: Check[] = [];
      const rows = mask.rows;
      host.gpu.scoped(checks, 'the mask rows', () => {
        rowPtr = host.gpu.u32Buffer(rows.rowPtr, 'rowPtr');
        cols = host.gpu.u32Buffer(rows.cols.length ? rows.cols : [0], 'cols');
      });
      await host.gpu.settle(checks);
      blocks = rows.cols.length;
    } else {
      const e = await expandOnDevice(host, mask);
      rowPtr = e.rowPtr;
      cols = e.cols;
      blocks = e.cols.size / 4;
    }
    return await runAttention(host, shape, qt, kt, vt!, { rowPtr: rowPtr!, cols: cols!, B: mask.blockSize, Nb, blocks }, opts);
  } finally {
    if (rowPtr) host.gpu.retire(rowPtr);
    if (cols) host.gpu.retire(cols);
  }
}

export async function denseAttention(host: OpHost, q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, opts: AttentionOptions = {}): Promise<AttentionResult> {
  const { shape, qt, kt, vt } = prepare(host, q, k, v);
  const out = checkAttentionOptions(host, shape, [qt, kt, vt!], opts);
  await ready(qt, kt, vt, out);
  return runAttention(host, shape, qt, kt, vt!, undefined, opts);
}

/**
 * AttentionOptions checked before any work: an object; scale; returnLse a boolean; `out` of
 * this backend, q's dtype and [m, H, d], sharing no byte with q, k or v (the kernel reads
 * those while it writes out: the same tensor, a view or a second wrapper of their buffer is
 * INVALID_ARGUMENT), not a sliceRows copy (INVALID_ARGUMENT: a view writes through to its
 * parent, a copy would not); no `prepared` mask (sparseAttention takes its own device plan's masks
 * (../plan/run-prepared.ts) and passes the options here without it). Returns `out`.
 */
export function checkAttentionOptions(
  host: OpHost,
  shape: AttentionShape,
  inputs: readonly WebGpuTensor[],
  opts: AttentionOptions,
): WebGpuTensor | undefined {
  if (opts === null || typeof opts !== 'object') throw new InvalidArgumentError('attention options must be an object ({ scale?, returnLse?, out? })');
  checkScale(opts.scale, shape.headDim);
  if (opts.returnLse !== undefined && typeof opts.returnLse !== 'boolean') {
    throw new InvalidArgumentError(`returnLse must be true or false; got ${String(opts.returnLse)}`);
  }
  if (opts.prepared !== undefined) {
    throw new CrispError(
      'WRONG_BACKEND',
      `a prepared mask (from backend '${(opts.prepared as { backend?: string } | null)?.backend ?? 'unknown'}') runs only in sparseAttention of the WebGPU backend whose planner made it; pass the BlockMask alone`,
    );
  }
  if (opts.out === undefined) return undefined;
  const out = host.own(opts.out, 'out');
  const { queries: m, heads: H, headDim: D } = shape;
  if (out.dtype !== shape.dtype) {
    throw new DTypeError(`out must be ${shape.dtype} like q; got ${out.dtype}. Allocate it with allocate('${shape.dtype}', [${m}, ${H}, ${D}])`);
  }
  if (out.shape.length !== 3 || out.shape[0] !== m || out.shape[1] !== H || out.shape[2] !== D) {
    throw new ShapeError(`out must be a ${shape.dtype} tensor of shape [${m}, ${H}, ${D}]; got [${out.shape}]`);
  }
  const [q, k, v] = inputs;
  assertOutApart(out, { q, k, v }, (t) => (t as WebGpuTensor).memoryRange, { out: 'out' });
  if (out.sliceCopy) throw sliceCopyError('out', host.gpu.limits.minStorageBufferOffsetAlignment);
  return out;
}

export async function runAttention(
  host: OpHost,
  shape: AttentionShape,
  qt: WebGpuTensor,
  kt: WebGpuTensor,
  vt: WebGpuTensor,
  sparse: { rowPtr: GPUBuffer; cols: GPUBuffer; B: number; Nb: number; blocks: number } | undefined,
  opts: AttentionOptions,
): Promise<AttentionResult> {
  const { queries: m, keys: n, heads: H, kvHeads: Hkv, headDim: D } = shape;
  const B = sparse?.B ?? 128;
  const Nb = sparse?.Nb ?? numBlocks(n, B);
  const firstTile = Math.floor((n - m) / 64);
  const numTiles = Math.ceil(n / 64) - firstTile;
  // Work per query tile in key tiles: dense t + 1; sparse at most the mean row length
  // (an upper bound spread evenly).
  const tileWork = 64 * 64 * D;
  const avgSparse = sparse ? Math.max(1, (sparse.blocks / (H * Nb)) * (B / 64)) : 0;
  const workOf = (t: number) => (sparse ? Math.min(t + 1, avgSparse) : t + 1) * tileWork;
  // grid row j is query tile firstTile + numTiles - 1 - j (the kernel's order: heaviest first)
  return launchAttention(host, shape, [qt, kt, vt], opts, {
    rows: numTiles,
    work: (j) => workOf(firstTile + numTiles - 1 - j),
    uniform: (h0, first, count) => [m, n, H, Hkv, B, Nb, sparse ? 0 : 1, h0, firstTile + numTiles - first - count, count],
    extra: sparse ? [sparse.rowPtr, sparse.cols] : undefined,
    headTable: true,
    pipeline: () => host.attentionPipeline(shape.dtype as StorageDType, D),
  });
}

/**
 * One attention run as the launcher sees it: grid rows in the kernel's y order (heaviest
 * first) with their work, the uniform fields of one dispatch, and bindings 6 onwards.
 */
export interface AttentionLaunches {
  /** grid rows of the whole run (query tiles, or the varlen work entries) */
  readonly rows: number;
  /** multiply-adds of grid row j (an upper bound) */
  work(j: number): number;
  /** the first ten uniform fields of a dispatch over heads h0.. and grid rows first .. first + count */
  uniform(h0: number, first: number, count: number): UniformField[];
  /** bindings 6 onwards (rowPtr, cols, ...); undefined: dense, two placeholders */
  readonly extra?: readonly GPUBuffer[];
  /**
   * the kernel reads its head from a head table (binding 8, after `extra`): the launcher
   * binds every head there, in order, and cuts dispatches over the table's entries
   */
  readonly headTable?: boolean;
  pipeline(): Promise<GPUComputePipeline>;
}

/**
 * The dispatches of a run, as [h0, nh, first, count]: grid [nh heads, count rows], every one
 * under `maxWork` multiply-adds and `maxRows` grid rows (the per-dimension workgroup limit).
 * All rows of a group of heads when one head's rows fit; else, head by head, ranges of rows,
 * heaviest first.
 */
export function splitDispatches(
  rows: number,
  work: (j: number) => number,
  H: number,
  maxWork: number,
  maxRows: number,
): [number, number, number, number][] {
  const out: [number, number, number, number][] = [];
  let perHead = 0;
  for (let j = 0; j < rows; j++) perHead += work(j);
  if (perHead <= maxWork && rows <= maxRows) {
    const hg = Math.max(1, Math.min(H, Math.floor(maxWork / perHead)));
    for (let h0 = 0; h0 < H; h0 += hg) out.push([h0, Math.min(hg, H - h0), 0, rows]);
    return out;
  }
  const ranges: [number, number][] = [];
  for (let j = 0; j < rows; ) {
    let w = 0;
    const first = j;
    while (j < rows && j - first < maxRows && (w === 0 || w + work(j) <= maxWork)) w += work(j++);
    ranges.push([first, j - first]);
  }
  for (let h = 0; h < H; h++) for (const [first, count] of ranges) out.push([h, 1, first, count]);
  return out;
}

/**
 * Allocate the output (and LSE), then run the attention kernel in bounded dispatches
 * (splitDispatches); `shape.queries` rows of output. Frees what it made on failure.
 */
export async function launchAttention(
  host: OpHost,
  shape: AttentionShape,
  [qt, kt, vt]: readonly [WebGpuTensor, WebGpuTensor, WebGpuTensor],
  opts: { readonly scale?: number; readonly returnLse?: boolean; readonly out?: DeviceTensor },
  run: AttentionLaunches,
): Promise<AttentionResult> {
  const { queries: m, heads: H, headDim: D } = shape;
  const scale = checkScale(opts.scale, D);
  const g = host.gpu;
  const checks: Check[] = [];
  const given = opts.out === undefined ? undefined : host.own(opts.out, 'out');
  let out: WebGpuTensor | undefined;
  let lse: WebGpuTensor | undefined;
  const temps: GPUBuffer[] = [];
  let dummy: GPUBuffer | undefined;
  let lseBuf: GPUBuffer | undefined;
  let headBuf: GPUBuffer | undefined;
  // the heads this run computes, in the head table's order
  const table = Array.from({ length: H }, (_, h) => h);
  try {
    g.scoped(checks, `the attention output [${m}, ${H}, ${D}]`, () => {
      out = given ?? host.newTensor(shape.dtype, [m, H, D]);
      lse = opts.returnLse ? host.newTensor('f32', [H, m]) : undefined;
      dummy = run.extra ? undefined : g.createBuffer(16, Usage.STORAGE, 'none');
      lseBuf = lse ? lse.buffer : g.createBuffer(16, Usage.STORAGE, 'no-lse');
      if (run.headTable) headBuf = g.u32Buffer(table, 'heads');
    });
    // a failed allocation ends the call here, before a pipeline is built or anything runs
    await Promise.all([g.settle(checks), ready(out, lse)]);
    const pipe = await run.pipeline();
    const o = out!;
    const lb = lseBuf!;
    const extra = [...(run.extra ?? [dummy!, dummy!]), ...(headBuf ? [headBuf] : [])];
    // One dispatch: nh heads from h0, grid rows first .. first + count (grid [nh, count]).
    const launch = (h0: number, nh: number, first: number, count: number) =>
      g.scoped(checks, 'an attention dispatch', () => {
        const u = g.uniform([...run.uniform(h0, first, count), lse ? 1 : 0, { f32: scale * LOG2E }]);
        temps.push(u);
        const bufs = [u, qt.binding, kt.binding, vt.binding, o.binding, lb, ...extra];
        const enc = g.device.createCommandEncoder();
        g.dispatch(enc, pipe, bufs, [nh, count]);
        g.submit(enc, temps);
      });
    // Grid [heads, query tiles], heads fastest: the kernels map y = 0 to the heaviest
    // (last) tile, so every head's longest tiles start in the first wave and the tail holds
    // short ones (head-major order left the last heads' long tiles for the end: 24.9 vs
    // 25.9 TFLOP/s at 8k on the H200). Dispatches stay under #maxWork: all query tiles of a
    // group of heads; when one head alone is over the bound, that head's tiles in ranges,
    // heaviest first. (Tile ranges of all heads measured slower at 32k-64k: their jobs are
    // all about as long, so the last wave of each dispatch runs part-empty.)
    const maxRows = g.limits.maxComputeWorkgroupsPerDimension;
    // h0 and nh index the head table (a subset of heads runs in the same dispatches).
    const runs = splitDispatches(run.rows, run.work, table.length, host.maxWork, maxRows);
    for (const [h0, nh, first, count] of runs) launch(h0, nh, first, count);
    // Out of memory, invalid bindings: the scopes of this call's own recording say so.
    await Promise.all([g.settle(checks), ready(out, lse)]);
  } catch (e) {
    if (!given) out?.dispose();
    lse?.dispose();
    throw e;
  } finally {
    host.gpu.retire(...temps);
    if (dummy) host.gpu.retire(dummy);
    if (lseBuf && !lse) host.gpu.retire(lseBuf);
    if (headBuf) host.gpu.retire(headBuf);
  }
  return lse ? { output: out!, lse } : { output: out! };
}
