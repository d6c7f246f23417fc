import { InvalidArgumentError } from '@crisp/core';
import { type PeRequest, peParts } from '../ops/pe-rows.js';
import { expand } from '../ops/expand.js';
import type { CudaPreparedMask, SplitPlan, SplitQueued, SplitRows } from '../ops/prepared-mask.js';
import type { CudaContext } from '../runtime/context.js';
import type { Handle } from '../runtime/ffi.js';
import type { KeptStats } from '../runtime/kept-stats.js';
import type { DeviceBlock } from '../runtime/pool.js';
import { assertGoodRows } from './plan-layout.js';

/**
 * A device plan's PE heads on the second stream, queued once when first needed: by
 * sparseAttention right after it has launched the VS heads' attention (so the PE kernels,
 * their rows' expansion and their attention run beside it instead of before it), or by a
 * read of the plan. Needs the PE count on the host (the plan's one copy, which waits for the
 * VS heads' expansion: by then the attention is queued behind it). The second stream first
 * waits for the plan's end (`done`: the VS lists, and every statistics kernel that read
 * scratch the pool may hand out again); the main stream then waits for the PE rows.
 */
export function splitPe(
  cx: CudaContext,
  kept: KeptStats,
  side: Handle,
  r: PeRequest,
  H: number,
  Nb: number,
  prepared: CudaPreparedMask,
  at: { readonly routes: number; readonly list: number; readonly vs: readonly [number, number, number, number]; readonly done: unknown; readonly nPe: () => number },
): SplitPlan {
  let queued: SplitQueued | undefined;
  let headPtr: Int32Array | undefined;
  // a queueing that failed part way fails every later ask the same way (its kernels may be
  // half queued on the second stream: queueing them again would run them twice)
  let failed: unknown;
  const queue = (): SplitQueued => {
    if (queued) return queued;
    if (failed !== undefined) throw failed;
    if (prepared.released) throw new InvalidArgumentError("the device plan's PE heads were asked for after its prepared mask was released");
    const count = at.nPe();
    if (count === 0) {
      queued = { count };
      return queued;
    }
    const temp: DeviceBlock[] = [];
    try {
      const summary = cx.scratch((H + 2) * 4);
      prepared.held.blocks.push(summary);
      const rows = cx.streams.onStream(side, (): SplitRows => {
        cx.streams.waitFor(side, at.done);
        const part = peParts(cx, kept, r, count, [{ ptr: at.list, count, first: 0 }])[0];
        prepared.held.blocks.push(part.rowPtrD, part.cols);
        const rows = { rowPtr: part.rowPtrD.ptr, cols: part.cols.ptr, headList: at.list };
        const e = expand(cx, H, Nb, { device: at.vs }, rows, temp, {
          summary: summary.ptr,
          only: { routes: at.routes, want: 0 },
          room: (count * Nb * (Nb + 1)) / 2,
        });
        prepared.held.blocks.push(e.rowPtr, e.cols);
        // a ring of the second stream's own: a later record there is later on that stream
        const done = cx.streams.recordIn(cx.streams.peEvents, side);
        return { part, rowPtr: e.rowPtr.ptr, cols: e.cols.ptr, summary: summary.ptr, done };
      });
      queued = { count, rows };
      // the main stream behind the PE rows before the pool hands their scratch out again
      cx.streams.waitFor(cx.streams.main, rows.done);
    } catch (e) {
      // what was queued on the second stream may still read the scratch: the main stream,
      // where the pool hands it out again, waits for it first
      queued = undefined;
      failed = e;
      cx.streams.joinQuietly(side);
      throw e;
    } finally {
      cx.releaseBlocks(temp);
    }
    return queued;
  };
  return {
    routes: at.routes,
    list: at.list,
    side,
    queue,
    headPtr: () => {
      if (headPtr) return headPtr;
      const q = queue().rows;
      if (!q) headPtr = new Int32Array(H + 1);
      else {
        const summary = cx.streams.readOnCopyStream(q.summary, new Int32Array(H + 2), q.done);
        assertGoodRows(summary, H, Nb);
        headPtr = summary.subarray(0, H + 1);
      }
      return headPtr;
    },
  };
}
