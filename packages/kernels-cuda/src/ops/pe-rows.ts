/**
 * PE rows on the device (kernels/pe/pe.cu): the pooled block map Ā = softmax_J(Q̄_I · K̄_J ·
 * scale) of the listed heads, sorted by a radix pass and cut at γ, written as block rows.
 * Chunked prefill (q the last m of n positions): the map's rows are the query blocks holding
 * query rows (from floor((n - m) / B); a partial first block over its real rows), the earlier
 * rows empty.
 */
import {
  type BlockRows,
  type DeviceTensor,
  InvalidArgumentError,
  type PeRowsOptions,
  type AttentionShape,
  assertBlockSize,
  defaultScale,
  numBlocks,
} from '@crisp/core';
import { CUDA_CAPABILITIES, type CudaContext } from '../runtime/context.js';
import type { KeptStats } from '../runtime/kept-stats.js';
import { D64, F, I, P } from '../runtime/launcher.js';
import type { DeviceBlock } from '../runtime/pool.js';
import type { CudaTensor } from '../runtime/tensor.js';
import { scan } from './expand.js';
import { selectionShape } from './shape.js';

/** PE heads' pooled maps (Nb² f32 a head) are built in parts of at most this many bytes */
export const PE_PART_BYTES = 4 * 2 ** 30;
/**
 * Head slots in the per-row PE kernels' grids when the PE count is only on the device: each
 * CTA loops over the slots below the count (pe.cu), so a plan with 3 PE heads of 32 does not
 * launch ~30k CTAs that leave at once
 */
const PE_SLOT_GRID = 4;
/**
 * pe_radix_pass: at least PE_RADIX_ENTRIES / 2 entries of a head's causal triangle a CTA.
 * 131072 (64k a CTA) gave 8 CTAs a head at 128k, 22 us a pass for 3 heads on the H200;
 * 32768 gives 32
 */
const PE_RADIX_ENTRIES = 32768;

/** One chunk of PE heads' rows on the device: rowPtrD [rows + 1], cols (room for all causal blocks). */
export interface PePart {
  readonly rowPtrD: DeviceBlock;
  readonly cols: DeviceBlock;
  readonly rows: number;
}

export interface PeRequest {
  readonly shape: AttentionShape;
  readonly qt: CudaTensor;
  readonly kt: CudaTensor;
  readonly B: number;
  readonly Nb: number;
  readonly heads: readonly number[];
  readonly gamma: number;
  readonly scale: number;
}

export function peBlockRows(cx: CudaContext, kept: KeptStats, q: DeviceTensor, k: DeviceTensor, opts: PeRowsOptions): BlockRows {
  cx.alive();
  const req = peRequest(cx, q, k, opts);
  if (req.heads.length === 0) return { rowPtr: new Int32Array(1), cols: new Int32Array(0) };
  const parts = peOnDevice(cx, kept, req);
  try {
    return peRowsToHost(cx, parts);
  } finally {
    for (const r of parts) cx.releaseBlocks([r.rowPtrD, r.cols]);
  }
}

/**
 * The PE parts' rows on the host, joined. One part (every head's map fits in 4 GiB: all
 * Llama shapes to 512k) comes back as it is, without a second copy of its cols.
 */
export function peRowsToHost(cx: CudaContext, parts: readonly PePart[]): BlockRows {
  const host = parts.map((r) => pePartToHost(r, (ptr, out) => cx.read(ptr, out)));
  return host.length === 1 ? host[0] : joinRows(host, parts.reduce((a, r) => a + r.rows, 0));
}

/** One PE part's rows on the host: its row pointers, then as many cols as they count. */
export function pePartToHost(r: PePart, read: (ptr: number, out: Int32Array) => Int32Array): BlockRows {
  const rowPtr = read(r.rowPtrD.ptr, new Int32Array(r.rows + 1));
  return { rowPtr, cols: read(r.cols.ptr, new Int32Array(rowPtr[r.rows])) };
}

/** The checks of a PE request, and what the kernels need from it. */
export function peRequest(cx: CudaContext, q: DeviceTensor, k: DeviceTensor, opts: PeRowsOptions): PeRequest {
  const shape = selectionShape(q, k);
  const B = opts?.blockSize;
  assertBlockSize(B, CUDA_CAPABILITIES.blockSizes);
  const gamma = opts.gamma;
  if (!(typeof gamma === 'number' && gamma > 0 && gamma < 1)) {
    throw new InvalidArgumentError(`gamma must be in (0, 1); got ${gamma}`);
  }
  const H = shape.heads;
  const heads = opts.heads;
  if (!Array.isArray(heads) && !(heads && typeof heads.length === 'number')) {
    throw new InvalidArgumentError('heads must be an array of head indices');
  }
  for (let i = 0; i < heads.length; i++) {
    const h = heads[i];
    if (!Number.isInteger(h) || h < 0 || h >= H || (i > 0 && h <= heads[i - 1])) {
      throw new InvalidArgumentError(`heads must be strictly increasing integers in [0, ${H}); got ${heads.join(',')}`);
    }
  }
  const qt = cx.tensor(q, 'q');
  const kt = cx.tensor(k, 'k');
  if (heads.length > 0) {
    cx.assertFinite(qt, 'q');
    cx.assertFinite(kt, 'k');
  }
  const scale = opts.scale ?? defaultScale(shape.headDim);
  return { shape, qt, kt, B, Nb: numBlocks(shape.keys, B), heads, gamma, scale };
}

/**
 * PE rows built on the device, one part per chunk of heads whose pooled maps fit ~4 GiB
 * (one part for every Llama shape to 512k). Nothing comes back to the host: cols are
 * allocated for the whole causal triangle of the part's heads (the kept count is only on
 * the device), and whoever needs the rows reads them (pePartToHost). The caller releases rowPtrD and cols.
 */
export function peOnDevice(cx: CudaContext, kept: KeptStats, req: PeRequest): PePart[] {
  const { heads, Nb } = req;
  const nh = heads.length;
  // The pooled map takes Nb² f32 per head: do heads in chunks of at most ~4 GiB.
  const chunk = Math.max(1, Math.min(nh, Math.floor(PE_PART_BYTES / (Nb * Nb * 4))));
  const parts: PePart[] = [];
  const lists: DeviceBlock[] = [];
  try {
    // each chunk's head list [count][heads] (pe.cu's hl), uploaded
    const hls = [];
    for (let c0 = 0; c0 < nh; c0 += chunk) {
      const sub = heads.slice(c0, c0 + chunk);
      const hl = cx.uploadArray(Int32Array.from([sub.length, ...sub]));
      lists.push(hl);
      hls.push({ ptr: hl.ptr, count: sub.length, first: c0 });
    }
    parts.push(...peParts(cx, kept, req, nh, hls));
    return parts;
  } catch (e) {
    for (const r of parts) cx.releaseBlocks([r.rowPtrD, r.cols]);
    throw e;
  } finally {
    cx.releaseBlocks(lists);
  }
}

/**
 * The PE kernels for head lists on the device: `slots` head slots of Q̄ in all, each list
 * {ptr: [count][heads], count: its slots (the count when the host knows it, else the
 * most the list can hold), first: its first slot}. One part a list.
 */
export function peParts(
  cx: CudaContext,
  kept: KeptStats,
  req: PeRequest,
  slots: number,
  lists: readonly { ptr: number; count: number; first: number; known?: false }[],
): PePart[] {
  const { shape, qt, kt, B, Nb, gamma, scale } = req;
  const { queries: m, keys: n, heads: H, kvHeads: Hkv, headDim: D, dtype } = shape;
  // q holds positions qOff .. n - 1 (chunked prefill when qOff > 0): query blocks before I0
  // hold no query rows, and their rows of the map stay empty
  const qOff = n - m;
  const I0 = Math.floor(qOff / B);
  // Q̄ for the listed heads only (a few of H; Q is the largest tensor), K̄ for every kv head
  const qm = cx.scratch(slots * Nb * D * 4);
  const cached = kept.kMeans;
  const reused = cached && cached.k.deref() === kt && cached.version === kt.version && cached.B === B ? cached.block : undefined;
  let km: DeviceBlock;
  try {
    km = reused ?? cx.scratch(Hkv * Nb * D * 4);
  } catch (e) {
    cx.releaseBlock(qm);
    throw e;
  }
  const parts: PePart[] = [];
  try {
    if (!reused) {
      const bm = `block_means_${dtype}`;
      cx.launch('proxy/proxy-reduce.cu', bm, [Nb, Hkv], D, 0, [P(kt.ptr), P(km.ptr), I(n), I(Hkv), I(D), I(B), I(0)]);
    }
    for (const l of lists) {
      // this list's Q̄ rows start at its first slot
      const qml = qm.ptr + l.first * Nb * D * 4;
      const g = l.known === false ? Math.min(l.count, PE_SLOT_GRID) : l.count;
      // 128 threads (PE_QM_THREADS in pe.cu): 16-byte loads, row groups summed in order
      cx.launch('pe/pe.cu', `pe_q_means_${dtype}`, [Nb, g], 128, 0, [P(qt.ptr), P(l.ptr), P(qml), I(n), I(H), I(D), I(B), I(qOff)]);
      parts.push(peChunk(cx, qml, km.ptr, l.ptr, l.count, l.known !== false, { H, Hkv, Nb, D, I0 }, scale, gamma));
    }
    return parts;
  } catch (e) {
    for (const r of parts) cx.releaseBlocks([r.rowPtrD, r.cols]);
    throw e;
  } finally {
    cx.releaseBlocks(reused ? [qm] : [qm, km]);
  }
}

/**
 * One list's PE kernels (query blocks from I0 on: the chunk's): `nc` head slots (grids sized for them; slots past the device
 * list's count leave at once), `known`: nc is the list's count (the host uploaded it), so
 * the radix pass's CTAs a head can be sized here rather than from the slots.
 */
function peChunk(
  cx: CudaContext,
  qm: number,
  km: number,
  hl: number,
  nc: number,
  known: boolean,
  dims: { readonly H: number; readonly Hkv: number; readonly Nb: number; readonly D: number; readonly I0: number },
  scale: number,
  gamma: number,
): PePart {
  const { H, Hkv, Nb, D, I0 } = dims;
  // every block goes to `blocks` as it is taken (a failed allocation leaves those before it to the finally)
  const blocks: DeviceBlock[] = [];
  const take = (bytes: number): DeviceBlock => {
    const x = cx.scratch(bytes);
    blocks.push(x);
    return x;
  };
  // the per-row kernels' slots (pe.cu loops over the count)
  const g = known ? nc : Math.min(nc, PE_SLOT_GRID);
  try {
    const pm = take(nc * Nb * Nb * 4);
    // [cnt nc·256][tickets nc][prefixes nc] u32
    const cnt = take(nc * 258 * 4);
    const sum = take(nc * 256 * 8);
    const state = take(nc * 8 * 8);
    const strict = take(nc * Nb * 4);
    const eq = take(nc * Nb * 4);
    const eqStart = take(nc * (Nb + 1) * 4);
    const kept = take(nc * Nb * 4);
    const rowPtrD = take((nc * Nb + 1) * 4);
    const tiles = Math.ceil(Nb / 64);
    // both operands staged whole: 2 x D rows of 68 floats (PE_LG_PAD in pe.cu)
    cx.launch('pe/pe.cu', 'pe_logits', [tiles, tiles, g], 256, 2 * D * 68 * 4, [
      P(qm),
      P(km),
      P(hl),
      P(pm.ptr),
      I(H),
      I(Hkv),
      I(Nb),
      I(D),
      F(scale),
    ]);
    // cnt, the tickets and the prefixes, and the sums, zeroed by pe_softmax's first CTA
    // once: each radix pass's last CTA of a head zeroes that head's cnt, sum and ticket for
    // the next pass (pe_radix_pass)
    cx.launch('pe/pe.cu', 'pe_softmax', [Nb, g], 256, 0, [P(pm.ptr), I(Nb), P(hl), P(cnt.ptr), I(nc * 258), P(sum.ptr), I(nc * 512), I(I0)]);
    // pe_radix_pass: 512 threads and 96 KiB of shared memory a CTA, two CTAs an SM; the
    // heads' CTAs together fill the SMs once (each does an equal share of its head's
    // triangle), fewer for small maps (about PE_RADIX_ENTRIES / 2 entries a CTA at least). With the count
    // only on the device, the grid has room for one head's share and the kernel divides
    // the budget by the count.
    const budget = 2 * cx.info.multiprocessors;
    const histCtas = Math.max(1, Math.min(known ? Math.floor(budget / nc) : budget, Math.ceil((Nb * Nb) / PE_RADIX_ENTRIES)));
    const done = cnt.ptr + nc * 256 * 4;
    const prefix = done + nc * 4;
    for (let pass = 0; pass < 4; pass++) {
      cx.launch('pe/pe.cu', 'pe_radix_pass', [histCtas, nc], 512, 96 * 1024, [
        P(pm.ptr),
        I(Nb),
        I(pass),
        P(prefix),
        P(cnt.ptr),
        P(sum.ptr),
        P(state.ptr),
        P(done),
        D64(gamma),
        P(hl),
        I(budget),
      ]);
    }
    cx.launch('pe/pe.cu', 'pe_row_counts', [Nb, g], 256, 0, [P(pm.ptr), I(Nb), P(state.ptr), P(strict.ptr), P(eq.ptr), P(hl), I(I0)]);
    cx.launch('pe/pe.cu', 'pe_row_kept', [nc], 1024, 0, [
      P(strict.ptr),
      P(eq.ptr),
      P(eqStart.ptr),
      P(kept.ptr),
      P(state.ptr),
      I(Nb),
      P(hl),
    ]);
    scan(cx, kept.ptr, rowPtrD.ptr, nc * Nb, blocks);
    // room for every causal block of the chunk's heads: the kept count stays on the device
    // (reading it here would drain the stream between the PE kernels and the mask's)
    const colsD = take(((nc * Nb * (Nb + 1)) / 2) * 4);
    cx.launch('pe/pe.cu', 'pe_write', [Nb, g], 32, 0, [
      P(pm.ptr),
      I(Nb),
      P(state.ptr),
      P(eqStart.ptr),
      P(rowPtrD.ptr),
      P(colsD.ptr),
      P(hl),
      I(I0),
    ]);
    blocks.splice(blocks.indexOf(rowPtrD), 1);
    blocks.splice(blocks.indexOf(colsD), 1);
    return { rowPtrD, cols: colsD, rows: nc * Nb };
  } finally {
    for (const x of blocks) cx.pool.release(x);
  }
}

/** Concatenate row sets built for consecutive chunks of heads. */
function joinRows(parts: readonly BlockRows[], rows: number): BlockRows {
  const rowPtr = new Int32Array(rows + 1);
  let total = 0;
  let ri = 0;
  for (const { rowPtr: rp } of parts) {
    const r = rp.length - 1;
    for (let i = 0; i < r; i++) rowPtr[ri + i] = rp[i] + total;
    ri += r;
    total += rp[r];
  }
  rowPtr[rows] = total;
  const cols = new Int32Array(total);
  let off = 0;
  for (const { cols: c } of parts) {
    cols.set(c, off);
    off += c.length;
  }
  return { rowPtr, cols };
}
