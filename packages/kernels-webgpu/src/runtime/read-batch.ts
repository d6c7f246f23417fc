/**
 * Reads started together go back together. Every read-back costs a trip to the GPU and back
 * (a copy into a mappable buffer, a submit, mapAsync); a plan that reads its routes, lists,
 * row pointers and statistics as separate reads pays that trip for each. `ReadBatcher` holds
 * the reads started in one turn of the event loop and hands them to `readMany` at once (one
 * staging buffer, one submit, one map: GpuContext.read), so reads a caller starts
 * concurrently (Promise.all, or several operations not awaited in between) cost one trip.
 *
 * A failed batch is retried read by read, so each read gets its own verdict (one invalid
 * source must not fail the reads beside it), and a batch is cut at `maxBatchBytes`.
 */

export interface ReadRequest {
  readonly src: GPUBuffer;
  readonly byteOffset: number;
  /** bytes asked for; the copy covers it rounded up to 4 */
  readonly byteLength: number;
}

interface Pending extends ReadRequest {
  readonly resolve: (ab: ArrayBuffer) => void;
  readonly reject: (e: unknown) => void;
}

/** Run `fn` in a later turn of the event loop (after the promise jobs queued now). */
export type Defer = (fn: () => void) => void;

/** setImmediate where there is one (Node), else a message on a channel (browsers: no timer clamp). */
export const deferTurn: Defer = (fn) => {
  const si = (globalThis as { setImmediate?: (f: () => void) => unknown }).setImmediate;
  if (typeof si === 'function') {
    si(fn);
    return;
  }
  const ch = new MessageChannel();
  const port = ch.port1 as unknown as { onmessage: (() => void) | null; close(): void };
  port.onmessage = () => {
    port.close();
    fn();
  };
  ch.port2.postMessage(0);
};

/** The copy's length of a request: its bytes rounded up to 4 (at least 4). */
export function copyBytes(byteLength: number): number {
  return Math.max(4, Math.ceil(byteLength / 4) * 4);
}

/** Requests cut into batches whose copies total at most `maxBytes` (a larger request alone), in order. */
export function batchesOf<T extends ReadRequest>(reqs: readonly T[], maxBytes: number): T[][] {
  const out: T[][] = [];
  let cur: T[] = [];
  let bytes = 0;
  for (const r of reqs) {
    const b = copyBytes(r.byteLength);
    if (cur.length && bytes + b > maxBytes) {
      out.push(cur);
      cur = [];
      bytes = 0;
    }
    cur.push(r);
    bytes += b;
  }
  if (cur.length) out.push(cur);
  return out;
}

export class ReadBatcher {
  readonly #readMany: (reqs: readonly ReadRequest[]) => Promise<ArrayBuffer[]>;
  readonly #maxBatchBytes: number;
  readonly #defer: Defer;
  #pending: Pending[] = [];
  #trips = 0;

  constructor(readMany: (reqs: readonly ReadRequest[]) => Promise<ArrayBuffer[]>, maxBatchBytes: number, defer: Defer = deferTurn) {
    this.#readMany = readMany;
    this.#maxBatchBytes = maxBatchBytes;
    this.#defer = defer;
  }

  /** trips made (one per batch handed to readMany, retries included): for tests and profiles */
  get trips(): number {
    return this.#trips;
  }

  read(req: ReadRequest): Promise<ArrayBuffer> {
    return new Promise<ArrayBuffer>((resolve, reject) => {
      if (this.#pending.length === 0) this.#defer(() => this.flush());
      this.#pending.push({ ...req, resolve, reject });
    });
  }

  /**
   * Submit the reads waiting for their turn now (their turn comes, or GpuContext.idle calls
   * this before it waits, so a buffer retired meanwhile is not destroyed under a copy
   * submitted after the wait began).
   */
  flush(): void {
    if (this.#pending.length === 0) return;
    const all = this.#pending;
    this.#pending = [];
    for (const batch of batchesOf(all, this.#maxBatchBytes)) void this.#run(batch);
  }

  async #run(batch: readonly Pending[]): Promise<void> {
    this.#trips++;
    let got: ArrayBuffer[];
    try {
      got = await this.#readMany(batch);
    } catch (e) {
      if (batch.length === 1) {
        batch[0].reject(e);
        return;
      }
      // one by one, so each read gets its own verdict
      await Promise.all(batch.map((r) => this.#run([r])));
      return;
    }
    for (const [i, r] of batch.entries()) r.resolve(got[i]);
  }
}
