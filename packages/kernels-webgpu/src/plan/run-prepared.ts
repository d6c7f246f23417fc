/**
 * sparseAttention over a mask this backend's device planner prepared (AttentionOptions.prepared):
 * one attention run over every head's final rows (./prepared-mask.ts: made with the plan on
 * the device; where the cut runs on the host, its PE part made first when it is not yet).
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
  // The plan's PE part first (the routes read back, the PE heads' rows cut), then one run
  // over every head's final rows. (Queuing every head over its VS rows first and the PE heads
  // again once their rows were cut kept the GPU busy during the cut, but two runs cost more
  // than the cut: on an H100 at 32k, the two-run attention took 69-72 ms where one run over
  // the same final mask took 54.6 ms.)
  const c = await p.rows();
  return runAttention(host, shape, qt, kt, vt!, { rowPtr: c.rowPtr, cols: c.cols, B, Nb, blocks: p.vsRows.cap }, rest);
}
