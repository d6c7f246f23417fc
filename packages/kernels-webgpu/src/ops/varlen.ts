/**
 * varlenAttention: a ragged batch (sequences packed along the rows, FlashAttention's
 * cu_seqlens layout) in one run of the varlen form of the FMA kernel. Each sequence's mask is
 * expanded as sparseAttention does it (block rows uploaded as given, VS lists expanded on the
 * device) and the rows are concatenated into one rowPtr/cols pair; a small table tells each
 * workgroup its sequence (row bases, n_s, m_s, rows base, dense flag) and query tile. The run
 * is split into bounded dispatches by work, as single-sequence attention is.
 *
 * Shape legend: q [Mq, H, d], k and v [Nk, Hkv, d] packed; sequence s holds m_s queries (the
 * last m_s of its n_s positions: causal offset n_s - m_s) and n_s keys; out [Mq, H, d], lse
 * [H, Mq]. Masks are in each sequence's own block space, Nb_s = ceil(n_s / B).
 */
import {
  assertSupported,
  assertVarlenBatch,
  type AttentionResult,
  CrispError,
  type DeviceTensor,
  InvalidArgumentError,
  numBlocks,
  packedShape,
  type VarlenAttentionOptions,
  type VarlenBatch,
} from '@crisp/core';
import { VARLEN_RECORD_WORDS, type StorageDType } from '../kernels/common.js';
import { type Check, Usage } from '../runtime/gpu-context.js';
import { checkAttentionOptions, launchAttention } from './attention.js';
import { expandOnDevice } from './expand-mask.js';
import type { OpHost } from './host.js';
import { WebGpuPreparedMask } from '../plan/prepared-mask.js';
import { checkBindings, checkMaskArrays, ready } from './validate.js';

/** One sequence's mask rows as the run binds them. */
type SegmentRows =
  | { readonly kind: 'dense' }
  | { readonly kind: 'host'; readonly rowPtr: Int32Array; readonly cols: Int32Array }
  | { readonly kind: 'device'; readonly rowPtr: GPUBuffer; readonly cols: GPUBuffer; readonly rows: number };

export async function varlenAttention(
  host: OpHost,
  q: DeviceTensor,
  k: DeviceTensor,
  v: DeviceTensor,
  batch: VarlenBatch,
  opts: VarlenAttentionOptions = {},
): Promise<AttentionResult> {
  host.alive();
  if (opts === null || typeof opts !== 'object') {
    throw new InvalidArgumentError('varlenAttention options must be an object ({ scale?, returnLse?, out? }) or left out');
  }
  const qt = host.own(q, 'q');
  const kt = host.own(k, 'k');
  const vt = host.own(v, 'v');
  const shape = packedShape({ q: qt, k: kt, v: vt });
  assertVarlenBatch(batch, shape, host.capabilities.blockSizes);
  const { segments, masks, blockSize: B } = batch;
  for (const mask of masks) if (mask !== undefined) checkMaskArrays(mask);
  // This backend's own prepared masks may come along (varlenPrefill passes its plans'): the
  // batch runs the host masks, which a plan holds complete once planPrefill resolves.
  const foreign = batch.prepared?.findIndex((p) => p !== undefined && !(p instanceof WebGpuPreparedMask && p.ownedBy(host))) ?? -1;
  if (foreign >= 0) {
    throw new CrispError(
      'WRONG_BACKEND',
      `batch.prepared[${foreign}] is a prepared mask not made by this WebGPU backend's planner; pass the BlockMasks alone`,
    );
  }
  const longest = Math.max(...segments.map((g) => g.keys));
  assertSupported(host.capabilities, { ...shape, keys: longest, queries: Math.min(longest, shape.queries) }, host.name);
  checkBindings(host, shape);
  const out = checkAttentionOptions(host, shape, [qt, kt, vt], opts);
  await ready(qt, kt, vt, out);

  const { heads: H, kvHeads: Hkv, headDim: D, queries: Mq } = shape;
  const g = host.gpu;
  const S = segments.length;
  const made: GPUBuffer[] = [];
  try {
    // Each sequence's rows: dense, as given (host), or expanded on the device.
    const rows: SegmentRows[] = [];
    for (let s = 0; s < S; s++) {
      const mask = masks[s];
      if (!mask) rows.push({ kind: 'dense' });
      else if (!mask.vs && mask.rows) rows.push({ kind: 'host', rowPtr: mask.rows.rowPtr, cols: mask.rows.cols });
      else {
        const e = await expandOnDevice(host, mask);
        made.push(e.rowPtr, e.cols);
        rows.push({ kind: 'device', rowPtr: e.rowPtr, cols: e.cols, rows: e.rows });
      }
    }
    // The sequence table, the concatenated rows' bases, and the work entries.
    const tileWork = 64 * 64 * D;
    const table: number[] = [];
    const entries: { seg: number; tile: number; work: number }[] = [];
    let rpTotal = 0;
    let colsTotal = 0;
    const bases: { rp: number; cb: number }[] = [];
    for (let s = 0; s < S; s++) {
      const { qStart, queries: m, kStart, keys: n } = segments[s];
      const Nb = numBlocks(n, B);
      const r = rows[s];
      const rp = rpTotal;
      const cb = colsTotal;
      let blocks = 0;
      if (r.kind !== 'dense') {
        rpTotal += H * Nb + 1;
        blocks = r.kind === 'host' ? r.cols.length : r.cols.size / 4;
        colsTotal += blocks;
      }
      bases.push({ rp, cb });
      table.push(qStart, kStart, n, m, rp, cb, Nb, r.kind === 'dense' ? 1 : 0);
      const avg = r.kind === 'dense' ? 0 : Math.max(1, (blocks / (H * Nb)) * (B / 64));
      const firstTile = Math.floor((n - m) / 64);
      for (let t = Math.ceil(n / 64) - 1; t >= firstTile; t--) {
        entries.push({ seg: s, tile: t, work: (r.kind === 'dense' ? t + 1 : Math.min(t + 1, avg)) * tileWork });
      }
    }
    // heaviest first across the batch (stable: by sequence, then tile, on ties)
    entries.sort((a, b) => b.work - a.work);
    const workBase = S * VARLEN_RECORD_WORDS;
    const vtWords = new Uint32Array(workBase + 2 * entries.length);
    vtWords.set(table, 0);
    entries.forEach((e, j) => {
      vtWords[workBase + 2 * j] = e.seg;
      vtWords[workBase + 2 * j + 1] = e.tile;
    });
    g.checkBindings('varlen attention', {
      'concatenated rowPtr': Math.max(1, rpTotal) * 4,
      'concatenated cols': Math.max(1, colsTotal) * 4,
      'sequence table': vtWords.byteLength,
    });
    const checks: Check[] = [];
    const [rowPtr, cols, seqTable] = g.scoped(checks, `the mask rows of ${S} sequences (${rpTotal} row pointers, ${colsTotal} blocks)`, () => {
      const SC = Usage.STORAGE | Usage.COPY_DST | Usage.COPY_SRC;
      const rp = g.createBuffer(Math.max(1, rpTotal) * 4, SC, 'varlen rowPtr');
      made.push(rp);
      const cl = g.createBuffer(Math.max(1, colsTotal) * 4, SC, 'varlen cols');
      made.push(cl);
      const tb = g.u32Buffer(vtWords, 'varlen table');
      made.push(tb);
      const enc = g.device.createCommandEncoder();
      for (let s = 0; s < S; s++) {
        const r = rows[s];
        const { rp: at, cb } = bases[s];
        if (r.kind === 'host') {
          g.writeBuffer(rp, at * 4, r.rowPtr);
          if (r.cols.length) g.writeBuffer(cl, cb * 4, r.cols);
        } else if (r.kind === 'device') {
          enc.copyBufferToBuffer(r.rowPtr, 0, rp, at * 4, (r.rows + 1) * 4);
          enc.copyBufferToBuffer(r.cols, 0, cl, cb * 4, r.cols.size);
        }
      }
      g.submit(enc);
      return [rp, cl, tb] as const;
    });
    await g.settle(checks);
    return await launchAttention(host, shape, [qt, kt, vt], opts, {
      rows: entries.length,
      work: (j) => entries[j].work,
      uniform: (h0, first, count) => [Mq, workBase, H, Hkv, B, 0, 0, h0, first, count],
      extra: [rowPtr, cols, seqTable],
      pipeline: () => host.varlenPipeline(shape.dtype as StorageDType, D),
    });
  } finally {
    g.retire(...made);
  }
}
