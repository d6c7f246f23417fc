/**
 * GPU time per kernel from timestamp queries (the `timestamp-query` feature): while a
 * profile is open, every compute pass the backend records (GpuContext.dispatch, one pass per
 * dispatch) writes a timestamp at its start and end into a query set, under its program's
 * name. Closing the profile resolves the set and sums the passes per program.
 *
 * The timestamps are the GPU's own clock, so the times are the kernels' execution, not the
 * host's queueing. Dawn quantizes timestamps unless its `timestamp_quantization` toggle is
 * off (DEFAULT_DAWN_FLAGS turns it off); browsers quantize to about 0.1 ms, which makes
 * short passes read as 0 or 0.1 ms there. Passes past the query set's capacity are counted
 * in `dropped` and not timed.
 */
import { CrispError, InvalidArgumentError, UnsupportedError } from '@crisp/core';

/** One program's passes in a profile. */
export interface GpuKernelTime {
  /** the program's name (its pipeline's label) */
  readonly name: string;
  /** GPU time of its passes, summed, ms */
  readonly ms: number;
  readonly passes: number;
}

export interface GpuProfile {
  /** per program, the longest first */
  readonly kernels: readonly GpuKernelTime[];
  /** every timed pass's GPU time, summed, ms */
  readonly totalMs: number;
  /** from the first timed pass's start to the last one's end, ms (gaps between passes included) */
  readonly spanMs: number;
  /** passes timed */
  readonly passes: number;
  /** passes recorded past the query set's capacity (not timed) */
  readonly dropped: number;
}

/** Query slots a profile holds (two per pass): the most one query set may hold. */
export const PROFILE_QUERY_CAPACITY = 4096;

/** What the profiler needs of the device context. */
export interface ProfilerHost {
  readonly device: GPUDevice;
  read(src: GPUBuffer, byteOffset: number, byteLength: number): Promise<ArrayBuffer>;
  submit(enc: GPUCommandEncoder): void;
}

// GPUBufferUsage values (the global is absent before a WebGPU implementation is loaded)
const QUERY_RESOLVE = 0x0200;
const COPY_SRC = 0x0004;

/** Sum timed passes per name; `ns` holds each pass's start and end (BigInt64 nanoseconds). */
export function summarizePasses(names: readonly string[], ns: BigInt64Array | BigUint64Array, dropped: number): GpuProfile {
  const per = new Map<string, { ns: number; passes: number }>();
  let total = 0;
  let first = Number.POSITIVE_INFINITY;
  let last = Number.NEGATIVE_INFINITY;
  for (let i = 0; i < names.length; i++) {
    const a = Number(ns[2 * i]);
    const b = Number(ns[2 * i + 1]);
    // (a pass the implementation could not time reads 0 at both ends; a clock that stepped
    // back is not a duration either)
    const d = b >= a ? b - a : 0;
    if (a > 0 || b > 0) {
      first = Math.min(first, a);
      last = Math.max(last, b);
    }
    total += d;
    const e = per.get(names[i]) ?? { ns: 0, passes: 0 };
    e.ns += d;
    e.passes++;
    per.set(names[i], e);
  }
  const kernels = [...per].map(([name, e]) => ({ name, ms: e.ns / 1e6, passes: e.passes })).sort((x, y) => y.ms - x.ms || x.name.localeCompare(y.name));
  return { kernels, totalMs: total / 1e6, spanMs: last > first ? (last - first) / 1e6 : 0, passes: names.length, dropped };
}

/** An open profile: the query set and the names of the passes that write into it. */
export class GpuProfiler {
  readonly #host: ProfilerHost;
  readonly #set: GPUQuerySet;
  readonly #capacity: number;
  readonly #names: string[] = [];
  #dropped = 0;

  private constructor(host: ProfilerHost, set: GPUQuerySet, capacity: number) {
    this.#host = host;
    this.#set = set;
    this.#capacity = capacity;
  }

  /**
   * A profile with room for `capacity` / 2 passes. UNSUPPORTED without timestamp-query; a
   * query set the device refuses is a BACKEND_ERROR here, not an error of later work.
   */
  static async open(host: ProfilerHost, capacity = PROFILE_QUERY_CAPACITY): Promise<GpuProfiler> {
    if (!host.device.features.has('timestamp-query')) {
      throw new UnsupportedError("GPU profiling needs the device's timestamp-query feature, which this device does not have", { limit: 'timestampQuery' });
    }
    if (!Number.isInteger(capacity) || capacity < 2 || capacity % 2 !== 0 || capacity > PROFILE_QUERY_CAPACITY) {
      throw new InvalidArgumentError(`the profile's query capacity must be an even integer in [2, ${PROFILE_QUERY_CAPACITY}]; got ${String(capacity)}`);
    }
    const device = host.device;
    device.pushErrorScope('validation');
    const set = device.createQuerySet({ type: 'timestamp', count: capacity, label: 'crisp-profile' });
    const err = await device.popErrorScope();
    if (err) {
      set.destroy();
      throw new CrispError('BACKEND_ERROR', `WebGPU refused the profile's query set: ${err.message}`);
    }
    return new GpuProfiler(host, set, capacity);
  }

  /** The timestamp writes of the next pass (undefined once the set is full). */
  passWrites(name: string): GPUComputePassTimestampWrites | undefined {
    const i = this.#names.length * 2;
    if (i + 2 > this.#capacity) {
      this.#dropped++;
      return undefined;
    }
    this.#names.push(name);
    return { querySet: this.#set, beginningOfPassWriteIndex: i, endOfPassWriteIndex: i + 1 };
  }

  /** Close without reading (the profiled work failed). */
  discard(): void {
    this.#set.destroy();
  }

  /** Resolve the timestamps (after the passes submitted so far) and sum them per program. */
  async finish(): Promise<GpuProfile> {
    const count = this.#names.length * 2;
    try {
      if (count === 0) return summarizePasses([], new BigInt64Array(0), this.#dropped);
      const device = this.#host.device;
      const buf = device.createBuffer({ size: count * 8, usage: QUERY_RESOLVE | COPY_SRC, label: 'crisp-profile-resolve' });
      try {
        const enc = device.createCommandEncoder();
        enc.resolveQuerySet(this.#set, 0, count, buf, 0);
        this.#host.submit(enc);
        const ab = await this.#host.read(buf, 0, count * 8);
        return summarizePasses(this.#names, new BigInt64Array(ab), this.#dropped);
      } finally {
        buf.destroy();
      }
    } finally {
      this.#set.destroy();
    }
  }
}
