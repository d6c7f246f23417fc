/**
 * Ragged (varlen) batches on CUDA: row slices for planning each sequence, and the batch's
 * attention in one launch of the attention kernel (kernels/attention/: grid z the sequence,
 * each CTA's pointers moved to its sequence by `varlen_segment` in crisp-common.cuh).
 *
 * Shape legend: q [Mq, H, d], k and v [Nk, Hkv, d] packed; sequence s: m_s queries, n_s keys.
 */
import {
  type AttentionResult,
  type DeviceTensor,
  InvalidArgumentError,
  LimitError,
  type VarlenAttentionOptions,
  type VarlenBatch,
  assertVarlenBatch,
  bytesPerElement,
  numBlocks,
  numel,
  packedShape,
} from '@crisp/core';
import { CUDA_CAPABILITIES, type CudaContext } from '../runtime/context.js';
import type { DeviceBlock } from '../runtime/pool.js';
import type { CudaTensor } from '../runtime/tensor.js';
import type { AttentionOp } from './attention.js';
import { expandOnDevice } from './expand.js';
import { CudaPreparedMask } from './prepared-mask.js';

/** Int32 words per VarSeg (crisp-common.cuh): qRow, kRow, rowPtr, cols as 64-bit pairs, then n, m, Nb, qBlocks. */
const SEG_WORDS = 12;
const TWO32 = 2 ** 32;

/** Rows [start, start + rows) of t, sharing its memory. */
export function sliceRows(cx: CudaContext, t: DeviceTensor, start: number, rows: number): DeviceTensor {
  cx.alive();
  const ct = cx.tensor(t, 'sliceRows source');
  const total = ct.shape[0];
  if (!Number.isSafeInteger(start) || !Number.isSafeInteger(rows) || start < 0 || rows < 1 || start + rows > total) {
    throw new InvalidArgumentError(`sliceRows: rows [${start}, ${start + rows}) do not fit a tensor of ${total} rows (start >= 0, rows >= 1)`);
  }
  return ct.sliceRows(start, rows, numel(ct.shape.slice(1)), bytesPerElement(ct.dtype));
}

/** A 64-bit value as two int32 words, low first (little-endian, as the device reads it). */
function put64(words: Int32Array, at: number, x: number): void {
  words[at] = x % TWO32 | 0;
  words[at + 1] = Math.floor(x / TWO32) | 0;
}

/**
 * The batch's attention in one launch: every sparse sequence's rows from its plan's prepared
 * mask (when it is this device's and in one part) or expanded here; dense sequences have none.
 */
export function varlenAttention(
  cx: CudaContext,
  op: AttentionOp,
  q: DeviceTensor,
  k: DeviceTensor,
  v: DeviceTensor,
  batch: VarlenBatch,
  opts: VarlenAttentionOptions = {},
): AttentionResult {
  cx.alive();
  const shape = packedShape({ q: cx.tensor(q, 'q'), k: cx.tensor(k, 'k'), v: cx.tensor(v, 'v') });
  // rows' entries are checked on the device while expanding (MaskError), as sparseAttention does
  assertVarlenBatch(batch, shape, CUDA_CAPABILITIES.blockSizes, { rowEntries: false });
  if (opts === null || typeof opts !== 'object') throw new InvalidArgumentError(`varlenAttention options must be an object; got ${opts === null ? 'null' : typeof opts}`);
  const B = batch.blockSize;
  const S = batch.segments.length;
  let maxQueryBlocks = 0;
  for (const g of batch.segments) {
    if (g.keys > CUDA_CAPABILITIES.maxSequence) {
      throw new LimitError(`a sequence of ${g.keys} keys exceeds the CUDA backend's limit of ${CUDA_CAPABILITIES.maxSequence}`, {
        limit: 'maxSequence',
        max: CUDA_CAPABILITIES.maxSequence,
      });
    }
    maxQueryBlocks = Math.max(maxQueryBlocks, numBlocks(g.keys, B) - Math.floor((g.keys - g.queries) / B));
  }
  const p = op.prepare(q, k, v, { scale: opts.scale, returnLse: opts.returnLse, out: opts.out }, B, shape);
  const temp: DeviceBlock[] = [];
  try {
    const words = new Int32Array(S * SEG_WORDS);
    for (let s = 0; s < S; s++) {
      const g = batch.segments[s];
      const Nb = numBlocks(g.keys, B);
      let rows: { rowPtr: number; cols: number } | undefined;
      const mask = batch.masks[s];
      if (mask) {
        const pre = batch.prepared?.[s];
        if (pre instanceof CudaPreparedMask && pre.owner === cx && !pre.released && !pre.split && pre.heads === mask.heads && pre.numBlocks === Nb && pre.blockSize === B) {
          rows = { rowPtr: pre.rowPtr.ptr, cols: pre.cols.ptr };
        } else {
          const e = expandOnDevice(cx, mask);
          temp.push(...e.temp, e.rowPtr, e.cols);
          rows = { rowPtr: e.rowPtr.ptr, cols: e.cols.ptr };
        }
      }
      const at = s * SEG_WORDS;
      put64(words, at, g.qStart);
      put64(words, at + 2, g.kStart);
      put64(words, at + 4, rows ? rows.rowPtr : 0);
      put64(words, at + 6, rows ? rows.cols : 0);
      words[at + 8] = g.keys;
      words[at + 9] = g.queries;
      words[at + 10] = Nb;
      words[at + 11] = Nb - Math.floor((g.keys - g.queries) / B);
    }
    const table = cx.uploadArray(words);
    temp.push(table);
    return op.runVarlen(p, B, table.ptr, S, maxQueryBlocks);
  } catch (e) {
    if (!opts.out) (p.out as CudaTensor).dispose();
    p.lse?.dispose();
    throw e;
  } finally {
    // (released in stream order: the pool hands these blocks out again only behind the launch)
    cx.releaseBlocks(temp);
  }
}
