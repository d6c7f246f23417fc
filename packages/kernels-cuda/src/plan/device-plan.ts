/**
 * The plan after the statistics as device work: routing (kernels/route/route.cu), VS
 * selection, the PE rows and the expanded mask, queued with nothing read back.
 */
import {
  type DevicePlanOutcome,
  type DevicePlanRequest,
  type DevicePlanResult,
  InvalidArgumentError,
  type Route,
  type VsLists,
} from '@crisp/core';
import { expand, uploadTemp } from '../ops/expand.js';
import { PE_PART_BYTES, peParts, peRequest } from '../ops/pe-rows.js';
import { prepareMask } from '../ops/prepare-mask.js';
import { peRowsReader, preparedResult } from '../ops/prepared-mask.js';
import { type DeviceVsSelection, selectOnDevice } from '../ops/select.js';
import type { CudaContext } from '../runtime/context.js';
import type { KeptStats } from '../runtime/kept-stats.js';
import { D64, I, P } from '../runtime/launcher.js';
import type { DeviceBlock } from '../runtime/pool.js';
import { assertGoodRows, devicePlanLayout } from './plan-layout.js';
import { checkedTerms, residualFlags, routesOnDevice } from './route.js';
import { splitPe } from './split-pe.js';

/**
 * The plan after the statistics as device work (core's planOnDevice): routes (route.cu)
 * from the statistics' C_struct where proxyStats left it (and the residual test over p_v and
 * the pooled estimate, route_residual, when the rule has one), VS selection (select.cu) on those
 * routes (PE heads too with peWithVs), then the rows expanded and counted (mask.cu), an event behind the last kernel.
 * Nothing is read here, so the caller queues the attention behind the plan; `read()` then
 * brings the routes, the PE count, the statistics' head values, expand's summary and the
 * list pointers back in one copy on the copy stream (waiting for that event only), and the
 * lists after them. Two streams (the statistics were the last work queued): the router on
 * the second one beside the statistics' sums, the VS heads' rows only here, and the PE
 * heads' kernels, rows and attention on the second stream beside the VS heads' attention
 * (splitPe: queued by sparseAttention, or by a read). One stream: the PE kernels over a
 * head slot for every head (slots past the device's PE count leave at once) and every
 * head's rows. Pooled maps for every head over PE_PART_BYTES (beyond Llama shapes at
 * 512k): routed by route.cu and read back (routesOnDevice), then prepareMask, which reads as it goes.
 */
export async function planOnDevice(cx: CudaContext, store: KeptStats, req: DevicePlanRequest): Promise<DevicePlanResult> {
  cx.alive();
  cx.tracer.host('planOnDevice()');
  const { stats, route, vs: rule, peK, pe, peWithVs, peVs, peVsExcess, peVsFullAnchor } = req ?? ({} as DevicePlanRequest);
  const peLists = {
    ...(peVs !== undefined ? { peVs } : {}),
    ...(peVsExcess !== undefined ? { peVsExcess } : {}),
    ...(peVsFullAnchor !== undefined ? { peVsFullAnchor } : {}),
  };
  const terms = checkedTerms(route);
  if (!stats || !Number.isInteger(stats.heads) || !Number.isInteger(stats.numBlocks)) {
    throw new InvalidArgumentError('planOnDevice needs the statistics from proxyStats');
  }
  if (!pe?.q || !pe.k) throw new InvalidArgumentError('planOnDevice needs the PE inputs q and k');
  const { heads: H, numBlocks: Nb, blockSize: B } = stats;
  const r = peRequest(cx, pe.q, pe.k, { blockSize: B, gamma: pe.gamma, heads: [], scale: pe.scale });
  if (r.shape.heads !== H || r.Nb !== Nb || r.shape.keys !== stats.n) {
    throw new InvalidArgumentError(
      `planOnDevice: the statistics are for n=${stats.n}, H=${H}, Nb=${Nb}; q and k for n=${r.shape.keys}, H=${r.shape.heads}, Nb=${r.Nb}`,
    );
  }
  if (H * Nb * Nb * 4 > PE_PART_BYTES) {
    // routed and read back first (the device form, route.cu), then prepareMask, which reads as
    // it goes: no second stream, so the statistics' held scratch can go back now
    const entry = store.get(stats);
    if (entry) store.releaseHeld(entry);
    const routes = routesOnDevice(cx, store, stats, terms);
    const heads = routes.flatMap((x, h) => (x === 'pe' ? [h] : []));
    const res = await prepareMask(cx, store, {
      heads: H,
      numBlocks: Nb,
      blockSize: B,
      vs: { rule, stats, routes, peK, peWithVs, ...peLists },
      pe: heads.length > 0 ? { q: pe.q, k: pe.k, opts: { blockSize: B, gamma: pe.gamma, heads, scale: pe.scale } } : undefined,
    });
    const outcome = { routes, vs: res.vs, ...(res.peRows ? { peRows: res.peRows } : {}) };
    return { prepared: res.prepared, read: async () => outcome };
  }
  cx.assertFinite(r.qt, 'q');
  cx.assertFinite(r.kt, 'k');
  const temp: DeviceBlock[] = [];
  const held: DeviceBlock[] = [];
  // the statistics' head values [non-finite count][C_struct H][entropy H] where proxyStats
  // left them, else uploaded
  const kept = store.get(stats);
  try {
    const st = kept
      ? kept.block.ptr
      : uploadTemp(cx, Float64Array.from([0, ...stats.cStruct, ...stats.rowEntropy]), temp);
    // The second stream (fused statistics just queued, nothing launched on the main stream
    // since): the router waits only for C_struct there, and the main stream waits for the
    // routes before the VS selection. The PE heads then go to the second stream once the
    // attention of the VS heads is queued (sparseAttention; splitPe).
    // (a distance test reads p_v and the pooled estimate, which the main stream writes last:
    // no early routing on the second stream then)
    const side =
      terms.residual === undefined && terms.jsd === undefined && kept?.cstructReady !== undefined && kept.launchesAtEnd === cx.mainLaunches && kept === store.entries.at(-1)
        ? cx.streams.side()
        : undefined;
    // One buffer before the VS list pointers, read with them (devicePlanLayout)
    const { headBytes, sumOff, bytes } = devicePlanLayout(H);
    let rt = 0;
    const fill = (ptr: number) => {
      rt = ptr + headBytes;
      const args = [P(st), I(H), D64(terms.tauProxy), P(ptr), P(rt)];
      const tail = kept?.tailDone !== undefined ? cx.streams.tailStream : undefined;
      if (side) {
        cx.streams.waitFor(side, kept!.cstructReady);
        cx.streams.onStream(side, () => cx.launch('route/route.cu', 'route_cstruct', [1], 32, 0, [...args, I(1), P(0)]));
        cx.streams.fence(side, cx.streams.main);
        // the head values' copy behind their kernels (count, entropies): on the third stream
        // when they are there, which the main stream joins at the plan's end (KeptStats.releaseHeld).
        // (The buffer is new, but nothing released since proxyStats' fence can be in it: the
        // statistics hold their scratch until then, and the plan releases nothing before.)
        if (tail) {
          cx.streams.onStream(tail, () => cx.launch('route/route.cu', 'route_cstruct', [1], 32, 0, [...args, I(2), P(0)]));
          // (kept held an event already, so it is in KeptStats: KeptStats.releaseRetained joins this one)
          kept!.tailDone = cx.streams.recordIn(cx.streams.tailEvents, tail);
        } else {
          cx.launch('route/route.cu', 'route_cstruct', [1], 32, 0, [...args, I(2), P(0)]);
        }
      } else {
        if (kept) store.joinTail(kept);
        // (the second stream routes only without a distance test: its verdicts come here)
        const flags = residualFlags(cx, stats, kept?.block.ptr, terms, temp);
        cx.launch('route/route.cu', 'route_cstruct', [1], 32, 0, [...args, I(3), P(flags)]);
      }
      return rt;
    };
    let vsDev: DeviceVsSelection;
    try {
      vsDev = selectOnDevice(cx, store, { rule, stats, peK, peWithVs, ...peLists }, H, Nb, B, temp, { bytes, fill });
    } finally {
      // one plan a statistics object on the second stream: its event is a ring slot that
      // later fences reuse, so another plan on these statistics runs on the main stream
      if (kept && side) kept.cstructReady = undefined;
    }
    temp.splice(temp.indexOf(vsDev.buf), 1);
    held.push(vsDev.buf);
    const hl = rt + H * 4;
    const summaryAt = vsDev.buf.ptr + sumOff;
    // one stream: the PE kernels over a head slot for every head, then every head expanded
    const part = side ? undefined : peParts(cx, store, r, H, [{ ptr: hl, count: H, first: 0, known: false }])[0];
    if (part) held.push(part.rowPtrD, part.cols);
    const e = part
      ? expand(cx, H, Nb, { device: vsDev.ptrs }, { rowPtr: part.rowPtrD.ptr, cols: part.cols.ptr, headList: hl }, temp, { summary: summaryAt })
      : // two streams: the VS heads now (the PE heads' rows empty), the PE heads in splitPe
        expand(cx, H, Nb, { device: vsDev.ptrs }, undefined, temp, { summary: summaryAt, only: { routes: rt, want: 1 } });
    held.push(e.rowPtr, e.cols);
    // The main stream waits for the second stream's router already, and what runs there
    // later waits for the end of this plan (splitPe); it now also waits for the third
    // stream's head values (KeptStats.joinTail): the statistics' scratch can go back, and the plan's
    // one copy (behind `done`) holds the head values. Not before the VS heads' rows: the
    // third stream's kernels run beside the selection.
    if (kept) store.releaseHeld(kept);
    cx.tracer.host('planOnDevice: queued');
    const done = cx.streams.recordDone();
    let back: { summary: Int32Array; nPe: number; routes: Route[]; lists: () => VsLists } | undefined;
    // the one copy, when first needed (read(), the block counts, or the PE heads' turn)
    const fetch = () => {
      if (back) return back;
      if (res.prepared.released) throw new InvalidArgumentError('the device plan was read for the first time after its prepared mask was released');
      const { lists, prefix } = vsDev.read(done);
      kept?.settle?.(new Float64Array(prefix, 0, 1 + 2 * H));
      const ints = new Int32Array(prefix, headBytes, (bytes - headBytes) / 4);
      const routes = Array.from(ints.subarray(0, H), (x): Route => (x === 1 ? 'vs' : 'pe'));
      const s0 = (sumOff - headBytes) / 4;
      const summary = ints.slice(s0, s0 + H + 2);
      assertGoodRows(summary, H, Nb);
      back = { summary, nPe: ints[H], routes, lists };
      return back;
    };
    const counts = (): Int32Array => {
      const main = fetch().summary.subarray(0, H + 1);
      const other = res.prepared.split?.headPtr();
      // each head's blocks are in one of the two parts: the counts add
      return other ? Int32Array.from(main, (x, h) => x + other[h]) : main;
    };
    const res = preparedResult(cx, H, Nb, B, { ...e, headPtr: counts }, held, undefined);
    if (side) {
      res.prepared.split = splitPe(cx, store, side, r, H, Nb, res.prepared, {
        routes: rt,
        list: hl,
        vs: vsDev.ptrs,
        done,
        nPe: () => fetch().nPe,
      });
    }
    let outcome: DevicePlanOutcome | undefined;
    // (synchronous reads on the copy stream; core's read() is a promise for WebGPU)
    const read = async (): Promise<DevicePlanOutcome> => {
      if (outcome) return outcome;
      const { routes, lists, nPe } = fetch();
      const peRows = (() => {
        if (nPe === 0) return undefined;
        if (part) return peRowsReader(cx, res.prepared, { rowPtrD: part.rowPtrD, cols: part.cols, rows: nPe * Nb }, undefined, done);
        const q = res.prepared.split?.queue().rows;
        return q ? peRowsReader(cx, res.prepared, q.part, undefined, q.done) : undefined;
      })();
      outcome = { routes, vs: lists(), ...(peRows ? { peRows } : {}) };
      return outcome;
    };
    return { prepared: res.prepared, read };
  } catch (e) {
    // (the statistics' scratch too, once the main stream is behind the third stream)
    if (kept) store.releaseHeld(kept);
    cx.releaseBlocks(held);
    throw e;
  } finally {
    cx.releaseBlocks(temp);
  }
}
