/**
 * sparseAttention over a mask this backend's device planner prepared (AttentionOptions.prepared):
 * every head's rows at once when the plan's PE part is made; else every head over the VS
 * rows at once (nothing read back before it is queued), then the PE part (./prepared-mask.ts)
 * and the PE heads again over their complete rows, into the same output.
 */
import {
  type AttentionOptions,
  type AttentionResult,
  type BlockMask,
  CrispError,
  type DeviceTensor,
  InvalidArgumentError,
  ShapeError,
  numBlocks,
} from '@crisp/core';
import { checkAttentionOptions, runAttention } from '../ops/attention.js';
import type { OpHost } from '../ops/host.js';
import { prepare, ready } from '../ops/validate.js';
import { WebGpuPreparedMask } from './prepared-mask.js';

export async function sparseAttentionPrepared(
  host: OpHost,
  q: DeviceTensor,
  k: DeviceTensor,
  v: DeviceTensor,
  mask: BlockMask,
  opts: AttentionOptions,
): Promise<AttentionResult> {
  const p = opts.prepared;
  if (!(p instanceof WebGpuPreparedMask) || !p.ownedBy(host)) {
    throw new CrispError(
      'WRONG_BACKEND',
      `the prepared mask (from backend '${(p as { backend?: string } | null)?.backend ?? 'unknown'}') was not made by this WebGPU backend's planner; pass the BlockMask alone`,
    );
  }
  if (p.released) throw new InvalidArgumentError('the prepared mask was released; run the plan without it (runPlan does) or plan again');
  const { shape, qt, kt, vt } = prepare(host, q, k, v);
  const { heads: H, numBlocks: Nb, blockSize: B } = p;
  if (!mask || typeof mask !== 'object' || mask.heads !== H || mask.numBlocks !== Nb || mask.blockSize !== B) {
    throw new InvalidArgumentError(`the mask must describe the prepared one (H=${H}, Nb=${Nb}, B=${B}); pass the plan's mask with its prepared mask`);
  }
  if (shape.heads !== H || numBlocks(shape.keys, B) !== Nb) {
    throw new ShapeError(`the prepared mask is for H=${H} heads and Nb=${Nb} blocks of ${B}; the inputs have H=${shape.heads}, n=${shape.keys}`);
  }
  const { prepared: _, ...rest } = opts;
  const out = checkAttentionOptions(host, shape, [qt, kt, vt!], rest);
  await ready(qt, kt, vt, out);
  const blocks = p.vsRows.cap;
  const done = p.done;
  if (done) return runAttention(host, shape, qt, kt, vt!, { rowPtr: done.rowPtr, cols: done.cols, B, Nb, blocks }, rest);
  const first = await runAttention(host, shape, qt, kt, vt!, { rowPtr: p.vsRows.rowPtr, cols: p.vsRows.cols, B, Nb, blocks }, rest);
  try {
    const c = await p.complete();
    if (c.peHeads.length > 0) {
      const lseInto = first.lse ? host.own(first.lse, 'lse') : undefined;
      const into = { ...rest, out: first.output, ...(lseInto ? { lseInto } : {}) };
      await runAttention(host, shape, qt, kt, vt!, { rowPtr: c.rowPtr, cols: c.cols, B, Nb, blocks, heads: c.peHeads }, into);
    }
    return first;
  } catch (e) {
    if (!opts.out) first.output.dispose();
    first.lse?.dispose();
    throw e;
  }
}
