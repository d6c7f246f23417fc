/**
 * The backend interface: the few primitives that touch O(n) or O(Nb²) data. Everything
 * else (routing, VS selection) is plain TypeScript over Nb-length host arrays.
 *
 * Shape legend: q [m, H, d], k and v [n, Hkv, d], B block size, Nb = ceil(n / B).
 */
import type { BackendCapabilities } from './attention.js';
import type { BlockMask, BlockRows } from './mask.js';
import type { ProxyStats, ProxyStatsOptions } from './stats.js';
import type { DType } from './dtype.js';
import type { DeviceTensor, HostData, HostTensor } from './tensor.js';

export interface AttentionOptions {
  /** softmax scale, default 1/sqrt(d) */
  readonly scale?: number;
  /** also return the natural-log log-sum-exp per (head, query row), f32 [H, m] (to merge chunks) */
  readonly returnLse?: boolean;
  /**
   * Write the output here instead of allocating ([m, H, d], q's dtype, this backend's).
   * Lets a plan run allocate nothing, and lets tests poison the output before a run.
   */
  readonly out?: DeviceTensor;
}

export interface AttentionResult {
  /** [m, H, d], same dtype as q */
  readonly output: DeviceTensor;
  /** [H, m] f32, when asked for */
  readonly lse?: DeviceTensor;
}

export interface PeRowsOptions {
  readonly blockSize: number;
  /** γ: keep the shortest prefix of the sorted pooled map whose cumulative mass reaches γ */
  readonly gamma: number;
  /** the (query) heads to build rows for, ascending */
  readonly heads: readonly number[];
  readonly scale?: number;
}

export interface Backend {
  readonly name: string;
  readonly capabilities: BackendCapabilities;
  /**
   * Below this many keys dense attention beats the sparse pipeline on this backend
   * (measured; the pipeline's default length gate).
   */
  readonly sparseCrossover: number;
  upload(t: HostTensor): DeviceTensor;
  /** An uninitialised device tensor (contents unspecified until written). */
  allocate(dtype: DType, shape: readonly number[]): DeviceTensor;
  /**
   * Copy host values into a device tensor starting at a flat element offset: the way to
   * stream a tensor too large for one JS array (files, generated scenarios) in chunks.
   */
  write(t: DeviceTensor, elementOffset: number, data: HostData): void;
  download(t: DeviceTensor): Promise<HostTensor>;
  /** Fused proxy statistics (never materialises Â). */
  proxyStats(q: DeviceTensor, k: DeviceTensor, opts: ProxyStatsOptions): Promise<ProxyStats>;
  /**
   * PE path: pooled block map Ā = softmax_J(Q̄_I · K̄_J · scale) over J <= I, flattened,
   * normalised, sorted descending (ties: lower flat index first) and cut at the shortest
   * prefix whose cumulative sum reaches γ. Rows for the listed heads, in that order:
   * rowPtr has heads.length * Nb + 1 entries.
   */
  peBlockRows(q: DeviceTensor, k: DeviceTensor, opts: PeRowsOptions): Promise<BlockRows>;
  /** Expand a mask (VS lists and/or rows) to sorted block rows: the VS-to-rows primitive. */
  expandMask(mask: BlockMask): Promise<BlockRows>;
  /** Exact attention over the mask's blocks; causal inside diagonal blocks; fp32 accumulation. */
  sparseAttention(
    q: DeviceTensor,
    k: DeviceTensor,
    v: DeviceTensor,
    mask: BlockMask,
    opts?: AttentionOptions,
  ): Promise<AttentionResult>;
  /** Exact causal attention over all keys (the baseline). */
  denseAttention(q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, opts?: AttentionOptions): Promise<AttentionResult>;
  /** Resolves when all queued device work is done (for timing). */
  synchronize(): Promise<void>;
  dispose(): void;
}
