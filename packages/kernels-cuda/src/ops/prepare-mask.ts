/**
 * The device planner's one-stream mask building, for plans whose pooled maps pass one PE
 * part (PE_PART_BYTES): the VS lists selected on the device, the PE heads' rows built there,
 * the union expanded and counted, nothing read before the expansion but the selection's.
 */
import { type BlockRows, InvalidArgumentError, assertBlockSize, spreadRowPtr } from '@crisp/core';
import { CUDA_CAPABILITIES, type CudaContext } from '../runtime/context.js';
import type { KeptStats } from '../runtime/kept-stats.js';
import type { DeviceBlock } from '../runtime/pool.js';
import { expand, uploadTemp } from './expand.js';
import type { PrepareMaskRequest, PreparedMaskResult } from './mask-types.js';
import { type PePart, peOnDevice, peRequest, peRowsToHost } from './pe-rows.js';
import { preparedResult } from './prepared-mask.js';
import { selectOnDevice } from './select.js';

/**
 * The plan's mask building on the device: the VS selection, PE rows for the requested heads
 * (kept on the device), merged with the VS lists and expanded to rows, each head's blocks
 * counted from the expanded rowPtr. The PE rows come to the host only when `peRows()` is
 * called, on a second stream, so inside sparsePrefill that copy overlaps the attention kernel.
 */
export async function prepareMask(cx: CudaContext, kept: KeptStats, req: PrepareMaskRequest): Promise<PreparedMaskResult> {
  cx.alive();
  cx.tracer.host('prepareMask()');
  const { heads: H, numBlocks: Nb, blockSize: B } = req ?? ({} as PrepareMaskRequest);
  assertBlockSize(B, CUDA_CAPABILITIES.blockSizes);
  if (!req.vs) throw new InvalidArgumentError('prepareMask needs a VS selection request for the device');
  const temp: DeviceBlock[] = [];
  const held: DeviceBlock[] = [];
  try {
    // selected on the device before the PE kernels (vs_select: tens of microseconds)
    const vsDev = selectOnDevice(cx, kept, req.vs, H, Nb, B, temp);
    // the PE heads' rows on the device (one part), or joined on the host (several)
    let pePart: PePart | undefined;
    let peHost: BlockRows | undefined;
    // the PE heads' rows, spread to all heads on the device (the host-joined case uploads them)
    let rows: { rowPtr: number; cols: number; heads?: readonly number[] } | undefined;
    if (req.pe) {
      const r = peRequest(cx, req.pe.q, req.pe.k, req.pe.opts);
      if (r.shape.heads !== H || r.Nb !== Nb || r.B !== B) {
        throw new InvalidArgumentError(
          `prepareMask: the PE request is for H=${r.shape.heads}, Nb=${r.Nb}, B=${r.B}; the mask for H=${H}, Nb=${Nb}, B=${B}`,
        );
      }
      if (r.heads.length > 0) {
        const parts = peOnDevice(cx, kept, r);
        if (parts.length === 1) {
          // held until peRows() reads them (or the prepared mask is released)
          held.push(parts[0].rowPtrD, parts[0].cols);
          pePart = parts[0];
          rows = { rowPtr: parts[0].rowPtrD.ptr, cols: parts[0].cols.ptr, heads: r.heads };
        } else {
          // pooled maps over 4 GiB (beyond Llama shapes at 512k): join on the host
          for (const x of parts) temp.push(x.rowPtrD, x.cols);
          peHost = peRowsToHost(cx, parts);
          rows = {
            rowPtr: uploadTemp(cx, spreadRowPtr(peHost.rowPtr, r.heads, H, Nb), temp),
            cols: uploadTemp(cx, peHost.cols, temp),
          };
        }
      }
    }
    cx.tracer.host('prepareMask: PE queued');
    const e = expand(cx, H, Nb, { device: vsDev.ptrs }, rows, temp);
    held.push(e.rowPtr, e.cols);
    // the device's lists to the host, on the copy stream (vs_pack finished before expand's
    // read; expand_write may still run)
    const vs = vsDev.read().lists();
    return { ...preparedResult(cx, H, Nb, B, e, held, pePart, peHost), vs };
  } catch (e) {
    cx.releaseBlocks(held);
    throw e;
  } finally {
    cx.releaseBlocks(temp);
  }
}
