/**
 * A mask expanded and kept on the device (core's PreparedMask), and the reader of the PE rows
 * it was built from.
 */
import { type BlockRows, InvalidArgumentError, type PreparedMask } from '@crisp/core';
import { BACKEND_NAME, type CudaContext } from '../runtime/context.js';
import type { Handle } from '../runtime/ffi.js';
import type { DeviceBlock } from '../runtime/pool.js';
import { type PePart, pePartToHost } from './pe-rows.js';

/**
 * A device plan run on two streams (splitPe): the prepared rows hold the VS heads; the PE
 * heads' kernels, rows and attention go to the second stream once queued.
 */
export interface SplitPlan {
  /** the routes [H] on the device (1 = VS): the VS heads' attention serves only those */
  readonly routes: number;
  /** the PE heads [count][heads] on the device (route.cu's list) */
  readonly list: number;
  readonly side: Handle;
  /** queues the PE heads' kernels and rows on the second stream (once) */
  readonly queue: () => SplitQueued;
  /** the PE heads' rows' pointer at each head's start [H + 1] (a VS head's rows are empty there) */
  readonly headPtr: () => Int32Array;
}

/** What splitPe queued: the PE count, and with PE heads their rows. */
export interface SplitQueued {
  readonly count: number;
  readonly rows?: SplitRows;
}

/** The PE heads' rows on the device (their PE part and expansion), summary, and an event behind them. */
export interface SplitRows {
  readonly part: PePart;
  readonly rowPtr: number;
  readonly cols: number;
  readonly summary: number;
  readonly done: unknown;
}

/**
 * A mask expanded on the device (rowPtr [H·Nb + 1], cols) plus, until the host copy is
 * taken, the PE rows it was built from. Released to the pool explicitly or, as a safety
 * net, when garbage-collected.
 */
export class CudaPreparedMask implements PreparedMask {
  readonly backend: string;
  /** a device plan on two streams: rowPtr and cols hold its VS heads, the PE heads come from here */
  split?: SplitPlan;
  #released = false;
  #counts: Float64Array | (() => Float64Array);
  constructor(
    readonly owner: CudaContext,
    readonly heads: number,
    readonly numBlocks: number,
    readonly blockSize: number,
    /** the counts, or (a plan that read nothing back) what reads them */
    counts: Float64Array | (() => Float64Array),
    readonly rowPtr: DeviceBlock,
    readonly cols: DeviceBlock,
    readonly held: { blocks: DeviceBlock[] },
  ) {
    this.backend = BACKEND_NAME;
    this.#counts = counts;
  }
  /** (the read is synchronous here, on the copy stream; core's interface is asynchronous for WebGPU) */
  async readBlockCounts(): Promise<Float64Array> {
    if (typeof this.#counts === 'function') {
      if (this.#released) throw new InvalidArgumentError('the block counts were read for the first time after the prepared mask was released');
      this.#counts = this.#counts();
    }
    return this.#counts;
  }
  get released(): boolean {
    return this.#released;
  }
  release(): void {
    if (this.#released) return;
    this.#released = true;
    PREPARED_FINALIZER.unregister(this);
    this.owner.releaseBlocks(this.held.blocks);
    this.held.blocks.length = 0;
  }
}

const PREPARED_FINALIZER = new FinalizationRegistry<{ owner: CudaContext; held: { blocks: DeviceBlock[] } }>((h) => {
  h.owner.releaseBlocks(h.held.blocks);
});

/**
 * The prepared mask over expanded rows `e` (each head's blocks from its row pointers), owning
 * `held` (emptied: the mask releases them), and peRows() for the PE rows on the device
 * (`pePart`, its kernels finished before expand's read) or already on the host.
 */
export function preparedResult(
  cx: CudaContext,
  H: number,
  Nb: number,
  B: number,
  e: { rowPtr: DeviceBlock; cols: DeviceBlock; headPtr: Int32Array | (() => Int32Array) },
  held: DeviceBlock[],
  pePart: PePart | undefined,
  peHost?: BlockRows,
): { prepared: CudaPreparedMask; peRows?: () => Promise<BlockRows> } {
  const fromPtr = (hp: Int32Array) => Float64Array.from({ length: H }, (_, h) => hp[h + 1] - hp[h]);
  const hp = e.headPtr;
  const counts = typeof hp === 'function' ? () => fromPtr(hp()) : fromPtr(hp);
  const box = { blocks: held.slice() };
  const prepared = new CudaPreparedMask(cx, H, Nb, B, counts, e.rowPtr, e.cols, box);
  PREPARED_FINALIZER.register(prepared, { owner: cx, held: box }, prepared);
  held.length = 0;
  if (!pePart && !peHost) return { prepared };
  return { prepared, peRows: peRowsReader(cx, prepared, pePart, peHost) };
}

/**
 * peRows() of a prepared mask: the PE rows already on the host (`peHost`), or its PE part's
 * device rows copied on the copy stream (their kernels finished before expand's read, or,
 * `after`, a plan that read nothing back: the copy stream waits for the plan's end). The
 * device rows go back to the pool once copied (the expanded rows are what runs).
 */
export function peRowsReader(cx: CudaContext, prepared: CudaPreparedMask, pePart: PePart | undefined, peHost: BlockRows | undefined, after?: unknown) {
  let taken = false;
  return async (): Promise<BlockRows> => {
    if (taken) throw new InvalidArgumentError('peRows() was already called for this prepared mask');
    if (prepared.released) throw new InvalidArgumentError('peRows() after the prepared mask was released');
    taken = true;
    if (peHost) return peHost;
    const part = pePart as PePart;
    const got = pePartToHost(part, (ptr, out) => cx.streams.readOnCopyStream(ptr, out, after));
    const box = prepared.held;
    for (const b of [part.rowPtrD, part.cols]) {
      const i = box.blocks.indexOf(b);
      if (i >= 0) cx.releaseBlocks(box.blocks.splice(i, 1));
    }
    return got;
  };
}
