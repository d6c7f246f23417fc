/**
 * The backend's streams and events: the main stream (every primitive's kernels), a device
 * plan's second stream (router and PE heads, at the greatest priority) and third stream (the
 * statistics' head values), the copy stream (reads that overlap kernels), event rings reused
 * in turn for fences, and timing marks.
 */
import { type DeviceMark, InvalidArgumentError } from '@crisp/core';
import { type CudaLibs, type Handle, check } from './ffi.js';
import type { StreamKind, Tracer } from './trace.js';

/** fences behind device plans, reused in turn (a reused one is recorded later: waiting on it is still safe) */
const DONE_EVENTS = 8;
/** timing events behind marks, reused in turn */
export const MARK_EVENTS = 64;

/** events reused in turn (recordIn) */
export interface EventRing {
  readonly events: unknown[];
  next: number;
}

/** Streams.mark's DeviceMark: the ring slot its event was recorded in, and the slot's generation then. */
export class CudaMark implements DeviceMark {
  constructor(
    readonly owner: Streams,
    readonly slot: { readonly ev: unknown; readonly gen: number },
    readonly gen: number,
  ) {}

  msSince(earlier: DeviceMark): number {
    return this.owner.markElapsed(this, earlier);
  }
}

export class Streams {
  readonly #libs: CudaLibs;
  readonly #tracer: Tracer;
  readonly #alive: () => void;
  /** the main stream: every primitive's kernels, in order */
  readonly main: Handle;
  /** the stream launches queue on: main, or another inside onStream */
  cur: Handle;
  /**
   * planOnDevice's second stream: the router and the PE kernels run there beside the rest of
   * the statistics and the VS selection (created on first use)
   */
  sideStream: Handle | undefined;
  /**
   * A third stream for fused deferRead statistics: C_struct (which only the router reads)
   * beside the block sums, then the head values (proxy_heads, the finiteness count,
   * planOnDevice's copy of them), which nothing before the attention reads: the main stream
   * goes from the combine to the block sums and the VS selection (created on first use)
   */
  tailStream: Handle | undefined;
  /** a stream for copies that overlap kernels (PE rows to the host during attention) */
  #copyStream: Handle | undefined;
  /** recorded on the third stream only: behind C_struct (cstructReady) and the head values (tailDone) */
  readonly tailEvents: EventRing = { events: [], next: 0 };
  /** fences between the two streams, reused in turn (a wait is queued right after its record) */
  readonly #sideEvents: EventRing = { events: [], next: 0 };
  /** fences behind device plans (recordDone), reused in turn */
  readonly #doneEvents: EventRing = { events: [], next: 0 };
  /** recorded on the second stream only, behind a device plan's PE rows (splitPe) */
  readonly peEvents: EventRing = { events: [], next: 0 };
  /** timing events behind marks (mark()), reused in turn; gen tells a reused slot */
  readonly #marks: { ev: unknown; gen: number }[] = [];
  #markNext = 0;

  constructor(libs: CudaLibs, tracer: Tracer, alive: () => void) {
    this.#libs = libs;
    this.#tracer = tracer;
    this.#alive = alive;
    const stream = [null];
    // flags 0: a blocking stream, ordered with the synchronous copies on the legacy stream
    check(libs, libs.cu.cuStreamCreate(stream, 0), 'cuStreamCreate');
    this.main = stream[0];
    this.cur = this.main;
  }

  /** the trace's name for the current stream */
  kind(): StreamKind {
    return this.cur === this.main ? 'main' : this.cur === this.tailStream ? 'tail' : 'side';
  }

  /** A CUDA event (flags: 0 timing, 2 CU_EVENT_DISABLE_TIMING). */
  newEvent(flags: number): unknown {
    const e = [null];
    check(this.#libs, this.#libs.cu.cuEventCreate(e, flags), 'cuEventCreate');
    return e[0];
  }

  /** An event recorded on the main stream behind the work queued so far (no timing; reused in turn). */
  recordDone(): unknown {
    return this.recordIn(this.#doneEvents, this.main);
  }

  /**
   * The ring's next event (DONE_EVENTS of them, CU_EVENT_DISABLE_TIMING: fences, cheaper to
   * record and wait for; made at once on first use) recorded on `stream`.
   */
  recordIn(ring: EventRing, stream: Handle): unknown {
    while (ring.events.length < DONE_EVENTS) ring.events.push(this.newEvent(2));
    const ev = ring.events[ring.next++ % DONE_EVENTS];
    check(this.#libs, this.#libs.cu.cuEventRecord(ev, stream), 'cuEventRecord');
    return ev;
  }

  /** `stream` waits for `ev` (cuStreamWaitEvent). */
  waitFor(stream: Handle, ev: unknown): void {
    check(this.#libs, this.#libs.cu.cuStreamWaitEvent(stream, ev, 0), 'cuStreamWaitEvent');
  }

  /**
   * planOnDevice's second stream (flags 0, like the main one), made on first use, at the
   * context's greatest priority: its PE kernels and the PE heads' attention run beside the VS
   * heads' attention, and the block scheduler gives the SMs that attention frees to pending
   * CTAs of higher-priority streams first (at equal priority the PE chain could wait behind
   * the whole attention grid).
   */
  side(): Handle {
    if (!this.sideStream) {
      const least = [0];
      const greatest = [0];
      check(this.#libs, this.#libs.cu.cuCtxGetStreamPriorityRange(least, greatest), 'cuCtxGetStreamPriorityRange');
      const s = [null];
      check(this.#libs, this.#libs.cu.cuStreamCreateWithPriority(s, 0, greatest[0]), 'cuStreamCreateWithPriority');
      this.sideStream = s[0];
    }
    return this.sideStream;
  }

  /** The third stream (tailStream; flags 0 as the main one, default priority), made on first use. */
  tail(): Handle {
    if (!this.tailStream) {
      const s = [null];
      check(this.#libs, this.#libs.cu.cuStreamCreate(s, 0), 'cuStreamCreate');
      this.tailStream = s[0];
    }
    return this.tailStream;
  }

  /**
   * A fence on `from` behind the work queued there so far (no timing; a ring of its own, so
   * it never re-records a recordDone event that a later read still waits for); `to`, when
   * given, waits for it.
   */
  fence(from: Handle, to?: Handle): unknown {
    const ev = this.recordIn(this.#sideEvents, from);
    if (to !== undefined) check(this.#libs, this.#libs.cu.cuStreamWaitEvent(to, ev, 0), 'cuStreamWaitEvent');
    return ev;
  }

  /**
   * The main stream waits for the work queued so far on `from` (a failure's clean-up: the
   * pool's blocks are reused in the main stream's order). Driver errors are swallowed: after
   * a fault nothing runs on the context anyway.
   */
  joinQuietly(from: Handle): void {
    try {
      this.fence(from, this.main);
    } catch {
      // (the context is unusable: nothing will run behind this)
    }
  }

  /** The main stream waits for `ev` (a failure's clean-up; driver errors swallowed as in joinQuietly). */
  joinEvent(ev: unknown): void {
    try {
      this.waitFor(this.main, ev);
    } catch {
      // (the context is unusable: nothing will run behind this)
    }
  }

  /** Runs `fn` with launches (and the uploads and memsets of the PE path) on `stream`. */
  onStream<T>(stream: Handle, fn: () => T): T {
    const prev = this.cur;
    this.cur = stream;
    try {
      return fn();
    } finally {
      this.cur = prev;
    }
  }

  /**
   * Device-to-host copy on the copy stream: it does not wait for kernels queued on the main
   * stream, so it overlaps them. Callers read data whose producers have finished (a plan step
   * that ended in a synchronous read) or pass `after`, an event recorded on the main stream
   * behind the producers. Returns when the copy is done (pageable memory).
   */
  readOnCopyStream<T extends Int32Array | Float32Array | Float64Array>(ptr: number, out: T, after?: unknown): T {
    if (out.byteLength === 0) return out;
    const cu = this.#libs.cu;
    if (!this.#copyStream) {
      const s = [null];
      // CU_STREAM_NON_BLOCKING: no implicit ordering with the main stream's kernels
      check(this.#libs, cu.cuStreamCreate(s, 1), 'cuStreamCreate');
      this.#copyStream = s[0];
    }
    // the producers' end, marked on the main stream (later kernels there are not waited for)
    if (after !== undefined) check(this.#libs, cu.cuStreamWaitEvent(this.#copyStream, after, 0), 'cuStreamWaitEvent');
    const t = this.#tracer.trace ? performance.now() : 0;
    check(this.#libs, cu.cuMemcpyDtoHAsync(out, ptr, out.byteLength, this.#copyStream), 'cuMemcpyDtoHAsync');
    check(this.#libs, cu.cuStreamSynchronize(this.#copyStream), 'cuStreamSynchronize');
    if (this.#tracer.trace) this.#tracer.wait(`copy-stream read ${out.byteLength} B`, t);
    return out;
  }

  /**
   * A point on the device's timeline behind the work queued so far (a timing event; 64 in
   * turn, so a mark is good for the next 64). msSince needs both marks reached (synchronize).
   */
  mark(): DeviceMark {
    // the ring's events made at once, on the first mark (not one per mark in the first
    // prefills a benchmark times)
    while (this.#marks.length < MARK_EVENTS) this.#marks.push({ ev: this.newEvent(0), gen: 0 });
    const i = this.#markNext++ % MARK_EVENTS;
    const slot = this.#marks[i];
    const gen = this.#markNext;
    slot.gen = gen;
    check(this.#libs, this.#libs.cu.cuEventRecord(slot.ev, this.main), 'cuEventRecord');
    // a plain object whose fields say where it was recorded (no closure, no WeakMap entry: the
    // first mark of a prefill runs on the host path to the first launch)
    return new CudaMark(this, slot, gen);
  }

  /** CudaMark.msSince: `later` minus `earlier` on the device's timeline. */
  markElapsed(later: CudaMark, earlier: DeviceMark): number {
    if (!(earlier instanceof CudaMark) || earlier.owner !== this) {
      throw new InvalidArgumentError('msSince takes a mark from the same CUDA backend');
    }
    if (later.slot.gen !== later.gen || earlier.slot.gen !== earlier.gen) {
      throw new InvalidArgumentError(`a mark is good for the next ${MARK_EVENTS} marks of its backend; this one was reused`);
    }
    this.#alive();
    const ms = [0];
    check(this.#libs, this.#libs.cu.cuEventElapsedTime(ms, earlier.slot.ev, later.slot.ev), 'cuEventElapsedTime');
    return ms[0];
  }

  /** Waits for the main stream, then the third (statistics' head values with no plan after them to join it). */
  synchronize(): void {
    check(this.#libs, this.#libs.cu.cuStreamSynchronize(this.main), 'cuStreamSynchronize');
    if (this.tailStream) check(this.#libs, this.#libs.cu.cuStreamSynchronize(this.tailStream), 'cuStreamSynchronize');
  }

  /** Waits for the main, second and third streams (a trace's end). */
  synchronizeAll(): void {
    const cu = this.#libs.cu;
    check(this.#libs, cu.cuStreamSynchronize(this.main), 'cuStreamSynchronize');
    if (this.sideStream) check(this.#libs, cu.cuStreamSynchronize(this.sideStream), 'cuStreamSynchronize');
    if (this.tailStream) check(this.#libs, cu.cuStreamSynchronize(this.tailStream), 'cuStreamSynchronize');
  }

  /** Destroys the events and streams (dispose). */
  dispose(): void {
    const cu = this.#libs.cu;
    for (const e of [...this.#doneEvents.events, ...this.#sideEvents.events, ...this.peEvents.events, ...this.tailEvents.events]) cu.cuEventDestroy(e);
    if (this.sideStream) cu.cuStreamDestroy(this.sideStream);
    if (this.tailStream) cu.cuStreamDestroy(this.tailStream);
    for (const m of this.#marks) cu.cuEventDestroy(m.ev);
    cu.cuStreamDestroy(this.main);
    if (this.#copyStream) cu.cuStreamDestroy(this.#copyStream);
  }
}
