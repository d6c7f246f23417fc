/**
 * What `crisp run --out FILE` writes: one safetensors file per layer with the attention
 * output of the run's preset, streamed off the device in row chunks (@crisp/io's
 * deviceTensorSource), and, when asked, its log-sum-exp and its plan. Atomic: written to a
 * temporary file beside FILE, flushed, renamed on success; a failure (or Ctrl-C, which ends
 * the process through process.exit) leaves no temporary file, and an existing FILE is
 * replaced only by a complete one.
 *
 * Tensors (shape legend: n tokens, H query heads, d head dim, Nb blocks):
 *   output            [n, H, d]   the run's dtype
 *   lse               [H, n]      f32, natural log (--out-lse)
 *   plan.routes       [H]         int8: 0 = VS, 1 = PE (--out-plan; sparse plans only)
 *   plan.vertical_ptr [H + 1]     int32: head h's vertical key blocks are
 *   plan.vertical     [*]         int32   vertical[vertical_ptr[h] .. vertical_ptr[h + 1])
 *   plan.slash_ptr    [H + 1]     int32: the same for the slash offsets
 *   plan.slash        [*]         int32
 *   plan.rows.rowPtr  [H·Nb + 1]  int32: the PE heads' block rows (BSR): row (h, I) holds
 *   plan.rows.cols    [*]         int32   cols[rowPtr[h·Nb + I] .. rowPtr[h·Nb + I + 1])
 *   plan.density      [H]         f32: selected causal blocks / (Nb (Nb + 1) / 2)
 * and in `__metadata__`: crisp.format, crisp.policy, crisp.source, crisp.layer (a model
 * dump's layer), crisp.blockSize, crisp.numBlocks, crisp.density, crisp.plan ('dense: REASON'
 * or 'sparse'), crisp.routes ('vs,pe,...').
 */
import { stat } from 'node:fs/promises';
import { type Backend, CrispError, type DeviceTensor, type PrefillPlan, isCrispError } from '@crisp/core';
import { type WritableTensor, deviceTensorSource, writeSafetensors } from '@crisp/io';

/** What --out, --out-lse and --out-plan ask for (the path checked by checkOutputPath). */
export interface OutRequest {
  readonly path: string;
  readonly lse: boolean;
  readonly plan: boolean;
}

/** What a run's --out wrote: the file, its bytes and its tensors. */
export interface OutWritten {
  readonly path: string;
  readonly bytes: number;
  readonly tensors: readonly string[];
}

export const OUT_FORMAT = 'crisp-run-output/1';

function planTensors(plan: PrefillPlan): Record<string, WritableTensor> {
  const t: Record<string, WritableTensor> = {};
  const i32 = (data: Int32Array): WritableTensor => ({ dtype: 'i32', shape: [data.length], data });
  if (plan.routing) {
    t['plan.routes'] = { dtype: 'i8', shape: [plan.routing.routes.length], data: Int8Array.from(plan.routing.routes, (r) => (r === 'pe' ? 1 : 0)) };
  }
  const vs = plan.mask?.vs;
  if (vs) {
    t['plan.vertical_ptr'] = i32(vs.verticalPtr);
    t['plan.vertical'] = i32(vs.vertical);
    t['plan.slash_ptr'] = i32(vs.slashPtr);
    t['plan.slash'] = i32(vs.slash);
  }
  const rows = plan.mask?.rows;
  if (rows) {
    t['plan.rows.rowPtr'] = i32(rows.rowPtr);
    t['plan.rows.cols'] = i32(rows.cols);
  }
  t['plan.density'] = { dtype: 'f32', shape: [plan.density.length], data: Float32Array.from(plan.density) };
  return t;
}

/**
 * Writes the run's output (and LSE and plan, as asked) to `req.path`. Errors are typed and
 * name --out; nothing is left behind on failure.
 */
export async function writeRunOutput(
  backend: Backend,
  req: OutRequest,
  result: { readonly output: DeviceTensor; readonly lse?: DeviceTensor; readonly plan: PrefillPlan },
  about: { readonly source: string; readonly layer?: number },
): Promise<OutWritten> {
  const { plan } = result;
  const tensors: Record<string, WritableTensor> = { output: deviceTensorSource(backend, result.output) };
  if (req.lse) {
    if (!result.lse) throw new CrispError('BACKEND_ERROR', `backend '${backend.name}' returned no LSE although it was asked for (--out-lse)`);
    tensors.lse = deviceTensorSource(backend, result.lse);
  }
  if (req.plan) Object.assign(tensors, planTensors(plan));
  const metadata: Record<string, string> = {
    'crisp.format': OUT_FORMAT,
    'crisp.policy': plan.policy,
    'crisp.source': about.source,
    'crisp.blockSize': String(plan.blockSize),
    'crisp.numBlocks': String(plan.numBlocks),
    'crisp.density': String(plan.overallDensity),
    'crisp.plan': plan.denseReason ? `dense: ${plan.denseReason}` : 'sparse',
  };
  if (about.layer !== undefined) metadata['crisp.layer'] = String(about.layer);
  if (plan.routing) metadata['crisp.routes'] = plan.routing.routes.join(',');
  try {
    await writeSafetensors(req.path, tensors, { metadata });
  } catch (e) {
    if (isCrispError(e, 'IO_ERROR')) throw new CrispError('IO_ERROR', `${e.message} (--out)`, e.details);
    throw e;
  }
  const bytes = (await stat(req.path)).size;
  return { path: req.path, bytes, tensors: Object.keys(tensors) };
}
