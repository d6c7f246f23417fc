/**
 * Statistics kept on the device between calls: the buffer of each recent ProxyStats (its
 * block scores stay there until read, so a device selection reads them in place), the
 * scratch and third-stream events a device plan still needs, and the last key block means.
 */
import type { ProxyStats } from '@crisp/core';
import type { CudaContext } from './context.js';
import type { DeviceBlock } from './pool.js';
import type { CudaTensor } from './tensor.js';

/** Statistics whose block scores are on the device only (KeptStats.entries). */
export interface DeviceStats {
  readonly block: DeviceBlock;
  /**
   * deferRead statistics with token scores: a_v and a_s [H·n] f32 each, where a device plan's
   * coverage selection reads them; downloaded by materialize, released with the entry
   */
  readonly tokens?: readonly [DeviceBlock, DeviceBlock];
  /**
   * downloads the block statistics for the object's getters, unless they were read (it cannot
   * tell whether the object is still alive: the entry holds no reference to it, not even a
   * WeakRef, see deferred-fields.ts)
   */
  readonly materialize: () => void;
  /** out of KeptStats.entries, its block released (drop) */
  dropped?: boolean;
  /**
   * deferRead statistics: their head values [non-finite count][C_struct H][entropy H] as a
   * later copy brought them (planOnDevice's, route.cu copies them), so reading the fields
   * waits for nothing
   */
  readonly settle?: (head: Float64Array) => void;
  /**
   * Fused deferRead statistics: an event behind proxy_cstruct on the third stream (C_struct
   * is on the device, the rest of the statistics still queued), where planOnDevice's second
   * stream starts
   */
  cstructReady?: unknown;
  /**
   * Fused deferRead statistics: an event on the third stream (Streams.tail) behind the kernels
   * of the head values there (proxy_heads, the finiteness count; later planOnDevice's copy of
   * them). The main stream waits for it before their scratch goes back (releaseHeld) and
   * before anything there reads them (joinTail); a synchronous read waits for that stream anyway.
   */
  tailDone?: unknown;
  /** CudaContext.mainLaunches when proxyStats returned: the second stream only if none came since */
  readonly launchesAtEnd?: number;
  /**
   * proxyStats' scratch, given back by planOnDevice once what its second stream runs later
   * waits for the plan's end (until then the pool must not hand it to kernels there beside
   * the statistics kernels that still read it), or when the entry is dropped
   */
  held?: DeviceBlock[];
}

/**
 * At most this many statistics, and this many bytes of them, keep their block scores on the
 * device only (256 MiB: ~85 plans at 512k, ~340 at 128k). Older ones are downloaded into
 * their objects when newer ones need the room, unless the objects' collection was reported
 * first (FinalizationRegistry); a plan loop whose statistics are collected and reported by
 * then never downloads them. With a cap of 4 a loop that dropped its plans still downloaded
 * one a call (the objects were not collected yet): proxyStats wall at 128k 0.75 -> 1.0 ms.
 */
const DEVICE_STATS_KEPT = 64;
const DEVICE_STATS_BYTES = 256 * 2 ** 20;
const STATS_FINALIZER = new FinalizationRegistry<{ owner: KeptStats; entry: DeviceStats }>((h) => {
  h.owner.releaseCollected(h.entry);
});

/** The device bytes an entry keeps (its statistics and token scores). */
function entryBytes(e: DeviceStats): number {
  return e.block.size + (e.tokens ? e.tokens[0].size + e.tokens[1].size : 0);
}

export class KeptStats {
  readonly #cx: CudaContext;
  /**
   * The device buffers behind recent statistics (newest last). Their block scores stay there
   * until read (a getter downloads them; a device selection for those statistics reads them
   * in place), until the statistics object is collected (FinalizationRegistry), or until
   * newer ones need the room (DEVICE_STATS_KEPT, DEVICE_STATS_BYTES; then they are
   * downloaded first: the entry cannot tell whether the object is still alive). dispose
   * downloads what is left.
   */
  readonly entries: DeviceStats[] = [];
  /** the blocks' bytes of entries (kept as entries come and go, not summed a call) */
  #bytes = 0;
  /**
   * Entries that may still hold scratch or a third-stream event (releaseHeld): those pushed
   * since the last releaseRetained, so that it does not walk every kept entry (it runs
   * between the proxy pass's launch and the next one's; over 127 entries it cost ~7 us there,
   * ~40 us with the host thread just woken)
   */
  readonly #holding: DeviceStats[] = [];
  /**
   * Each kept statistics object's entry (get). A WeakMap, not a WeakRef in the entry: a
   * WeakRef keeps its target alive to the end of the job that made it, and a loop of awaited
   * prefills is one job (200 prefills at 128k held 103 MB of downloaded statistics that no
   * collection could free until the loop returned).
   */
  readonly #entry = new WeakMap<ProxyStats, DeviceStats>();
  /**
   * The key block means the last proxyStats computed (pass 1 takes them from the K tiles it
   * already holds): the PE rows of the same k (same tensor, same write version, same B)
   * reuse them instead of reading K again (block_means: 0.09 ms at 128k, 0.34 at 512k).
   */
  kMeans: { block: DeviceBlock; k: WeakRef<CudaTensor>; version: number; B: number } | undefined;

  constructor(cx: CudaContext) {
    this.#cx = cx;
  }

  /** The entry whose device buffer still holds these statistics, if any. */
  get(stats: ProxyStats): DeviceStats | undefined {
    const e = this.#entry.get(stats);
    return e && !e.dropped ? e : undefined;
  }

  /** Keeps `entry` for `stats` (newest), until read, collected or evicted. */
  add(stats: ProxyStats, entry: DeviceStats): void {
    this.entries.push(entry);
    this.#entry.set(stats, entry);
    this.#bytes += entryBytes(entry);
    if (entry.held !== undefined || entry.tailDone !== undefined) this.#holding.push(entry);
    STATS_FINALIZER.register(stats, { owner: this, entry }, entry);
  }

  /**
   * What proxyStats keeps between calls, given back at the start of the following call (or all of it on
   * dispose): the key block means, and the buffers of collected statistics. Downloading the
   * oldest live ones (evictRetained) is left to the attention launches, where it overlaps
   * the kernel; here only past twice the limits (a run of plans with no attention), or all of
   * them when disposing.
   */
  releaseRetained(disposing: boolean): void {
    if (this.kMeans) this.#cx.pool.release(this.kMeans.block);
    this.kMeans = undefined;
    // scratch held for a plan that never came (a plan after this call runs without the second stream)
    for (const e of this.#holding) this.releaseHeld(e);
    this.#holding.length = 0;
    this.evictRetained(disposing ? 0 : 2);
  }

  /**
   * Beyond `factor` x (DEVICE_STATS_KEPT, DEVICE_STATS_BYTES) (factor 0: all), the oldest
   * kept statistics are downloaded for their objects and their buffers released. A plan's
   * statistics are not read back unless someone asks, and the garbage collector reports
   * collected ones late (or, in a loop of awaited prefills, not until the loop yields), so in
   * a loop of plans one such download (3·H·Nb f64: 0.8 MB at 128k) a plan is the steady state:
   * at the start of proxyStats it cost ~0.2 ms of the plan, after an attention launch it runs
   * while the kernel does. On dispose (factor 0) a failed download is kept for the getters to
   * throw.
   */
  evictRetained(factor: number): void {
    const keep = factor === 0 ? 0 : factor * DEVICE_STATS_KEPT - 1;
    // Collected statistics leave through STATS_FINALIZER (after a collection, in a later
    // task); the entries cannot tell a collected object from a live one themselves.
    while (this.#overCaps(keep, factor)) {
      const e = this.#remove(0);
      try {
        e.materialize();
      } catch (err) {
        if (factor !== 0) {
          this.#drop(e);
          throw err;
        }
      }
      this.#drop(e);
    }
  }

  /** More than `keep` kept statistics, or more than factor x DEVICE_STATS_BYTES of them (a method, not a closure a call: proxyStats runs this) */
  #overCaps(keep: number, factor: number): boolean {
    const n = this.entries.length;
    return n > keep || (n > 0 && this.#bytes > factor * DEVICE_STATS_BYTES);
  }

  /** Entry i out of entries (its bytes out of the count). */
  #remove(i: number): DeviceStats {
    const e = this.entries.splice(i, 1)[0] as DeviceStats;
    this.#bytes -= entryBytes(e);
    return e;
  }

  #drop(e: DeviceStats): void {
    e.dropped = true;
    STATS_FINALIZER.unregister(e);
    this.#cx.pool.release(e.block);
    for (const t of e.tokens ?? []) this.#cx.pool.release(t);
    this.releaseHeld(e);
  }

  /** An entry's held scratch back to the pool (planOnDevice has ordered its second stream, or none ran). */
  releaseHeld(e: DeviceStats): void {
    // proxy_heads on the third stream reads the scratch: the main stream (where the pool's
    // next users run) waits for it first
    this.joinTail(e);
    if (e.held) this.#cx.releaseBlocks(e.held.splice(0));
  }

  /** The main stream behind the entry's head values on the third stream (once). */
  joinTail(e: DeviceStats): void {
    if (e.tailDone === undefined) return;
    this.#cx.streams.waitFor(this.#cx.streams.main, e.tailDone);
    e.tailDone = undefined;
  }

  /** STATS_FINALIZER: statistics collected before they were read. */
  releaseCollected(e: DeviceStats): void {
    if (this.#cx.disposed) return;
    const i = this.entries.lastIndexOf(e);
    if (i >= 0) this.#drop(this.#remove(i));
  }
}
