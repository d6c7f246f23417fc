/**
 * Where time goes: kernel profiling (each launch bracketed by events and waited for) and the
 * launch trace (events around each launch without serialising, plus host clock points).
 */
import { type CudaLibs, type Handle, check } from './ffi.js';

/** One entry of a trace (startTrace): a launch (device start/end) or a host wait (hostEndMs). */
export interface TraceEntry {
  readonly name: string;
  /** host clock at the launch, or at the start of the wait, ms after startTrace */
  readonly hostMs: number;
  readonly hostEndMs?: number;
  /** the launch's start and end on the device, ms after the first traced launch's start event */
  readonly startMs?: number;
  readonly endMs?: number;
  /**
   * a launch's stream: 'side' for a device plan's second stream (router and PE kernels),
   * 'tail' for the third (the statistics' head values)
   */
  readonly stream?: 'main' | 'side' | 'tail';
}

export type StreamKind = 'main' | 'side' | 'tail';

interface TraceState {
  readonly events: Handle[];
  readonly entries: { name: string; host: number; hostEnd?: number; ev?: number; stream?: StreamKind }[];
  readonly t0: number;
  /** the next unused start event (events come in start/end pairs) */
  nextEvent: number;
}

export class Tracer {
  readonly #libs: CudaLibs;
  /** while profiling: the bracketing events and the per-kernel totals */
  profile: { a: Handle; b: Handle; totals: Map<string, { calls: number; ms: number }> } | undefined;
  /** while tracing */
  trace: TraceState | undefined;

  constructor(libs: CudaLibs) {
    this.#libs = libs;
  }

  startProfile(newEvent: () => Handle): void {
    if (this.profile) return;
    this.profile = { a: newEvent(), b: newEvent(), totals: new Map() };
  }

  stopProfile(): { kernel: string; calls: number; ms: number }[] {
    const prof = this.profile;
    if (!prof) return [];
    this.profile = undefined;
    this.#libs.cu.cuEventDestroy(prof.a);
    this.#libs.cu.cuEventDestroy(prof.b);
    return [...prof.totals].map(([kernel, e]) => ({ kernel, ...e })).sort((x, y) => y.ms - x.ms);
  }

  /** Profiling: the launch just queued on `stream` is waited for and its time added to `name`'s total. */
  profiled(name: string, stream: Handle): void {
    const prof = this.profile as NonNullable<Tracer['profile']>;
    const cu = this.#libs.cu;
    check(this.#libs, cu.cuEventRecord(prof.b, stream), 'cuEventRecord');
    check(this.#libs, cu.cuEventSynchronize(prof.b), 'cuEventSynchronize');
    const ms = [0];
    check(this.#libs, cu.cuEventElapsedTime(ms, prof.a, prof.b), 'cuEventElapsedTime');
    const e = prof.totals.get(name) ?? { calls: 0, ms: 0 };
    e.calls++;
    e.ms += ms[0];
    prof.totals.set(name, e);
  }

  startTrace(maxLaunches: number, newEvent: () => Handle): void {
    if (this.trace) return;
    const events: Handle[] = [];
    for (let i = 0; i < 2 * maxLaunches; i++) events.push(newEvent());
    this.trace = { events, entries: [], t0: performance.now(), nextEvent: 0 };
  }

  /** The trace's entries once `synchronize` has waited for every stream; its events destroyed. */
  stopTrace(synchronize: () => void): TraceEntry[] {
    const tr = this.trace;
    if (!tr) return [];
    this.trace = undefined;
    const cu = this.#libs.cu;
    try {
      synchronize();
      const first = tr.entries.find((e) => e.ev !== undefined);
      const rel = (e: Handle): number => {
        const ms = [0];
        check(this.#libs, cu.cuEventElapsedTime(ms, tr.events[first!.ev!], e), 'cuEventElapsedTime');
        return ms[0];
      };
      return tr.entries.map((e) => ({
        name: e.name,
        hostMs: e.host - tr.t0,
        ...(e.hostEnd !== undefined ? { hostEndMs: e.hostEnd - tr.t0 } : {}),
        ...(e.ev !== undefined ? { startMs: rel(tr.events[e.ev]), endMs: rel(tr.events[e.ev + 1]) } : {}),
        ...(e.stream ? { stream: e.stream } : {}),
      }));
    } finally {
      for (const e of tr.events) cu.cuEventDestroy(e);
    }
  }

  /** Trace: records the start event of a launch on `stream` and returns the end event to record after it. */
  mark(name: string, stream: Handle, kind: StreamKind): Handle | undefined {
    const tr = this.trace!;
    const ev = tr.nextEvent;
    if (ev + 1 >= tr.events.length) {
      tr.entries.push({ name, host: performance.now() });
      return undefined;
    }
    tr.nextEvent += 2;
    tr.entries.push({ name, host: performance.now(), ev, stream: kind });
    check(this.#libs, this.#libs.cu.cuEventRecord(tr.events[ev], stream), 'cuEventRecord');
    return tr.events[ev + 1];
  }

  /** Trace: a point on the host's clock. */
  host(name: string): void {
    if (this.trace) this.wait(`(host) ${name}`, performance.now());
  }

  /** Trace: a host-side wait (a synchronous read), from `host` to now. */
  wait(name: string, host: number): void {
    this.trace?.entries.push({ name, host, hostEnd: performance.now() });
  }
}
