/**
 * The backend interface: the few primitives that touch O(n) or O(Nb²) data. Everything
 * else (routing, VS selection) is plain TypeScript over Nb-length host arrays.
 *
 * Shape legend: q [m, H, d], k and v [n, Hkv, d], B block size, Nb = ceil(n / B).
 */
import type { BackendCapabilities } from './attention.js';
import type { BlockMask, BlockRows, VsLists } from './mask.js';
import type { DeviceRouterRule, DeviceSelectorRule, Route } from './policy.js';
import type { ProxyStats, ProxyStatsOptions } from './stats.js';
import type { DType } from './dtype.js';
import type { DeviceTensor, HostData, HostTensor, MemoryRange } from './tensor.js';

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
  /**
   * The mask as this backend's device planner built it (`DevicePlanner.plan`): run that instead of expanding
   * `mask` again. It must come from this backend and describe `mask` (same heads, blocks,
   * block size); the pipeline passes it for plans it built.
   */
  readonly prepared?: PreparedMask;
}

export interface AttentionResult {
  /** [m, H, d], same dtype as q */
  readonly output: DeviceTensor;
  /** [H, m] f32, when asked for */
  readonly lse?: DeviceTensor;
}

/** One sequence of a packed batch, in rows of the packed tensors. */
export interface VarlenSegment {
  /** first query row in the packed q */
  readonly qStart: number;
  /** query rows (m_s >= 1; the last m_s of the sequence's positions) */
  readonly queries: number;
  /** first key row in the packed k and v */
  readonly kStart: number;
  /** key rows (n_s >= m_s) */
  readonly keys: number;
}

/**
 * A ragged batch as a backend runs it: its sequences, each with its own mask over its own key
 * blocks (local indices, Nb_s = ceil(n_s / B)), or none (dense causal for that sequence).
 */
export interface VarlenBatch {
  readonly blockSize: number;
  readonly segments: readonly VarlenSegment[];
  /** per segment: the mask, or undefined for dense causal attention */
  readonly masks: readonly (BlockMask | undefined)[];
  /**
   * per segment: the mask as the backend's device planner built it (a plan's
   * `prepared`), which the backend may run instead of expanding `masks[s]` again
   */
  readonly prepared?: readonly (PreparedMask | undefined)[];
}

/** `returnLse` gives LSE [H, Mq]; `out` is a [Mq, H, d] tensor in q's dtype. */
export type VarlenAttentionOptions = Pick<AttentionOptions, 'scale' | 'returnLse' | 'out'>;

export interface PeRowsOptions {
  readonly blockSize: number;
  /** γ: keep the shortest prefix of the sorted pooled map whose cumulative mass reaches γ */
  readonly gamma: number;
  /** the (query) heads to build rows for, ascending */
  readonly heads: readonly number[];
  readonly scale?: number;
}

/**
 * A mask expanded and kept on the backend, ready for sparseAttention: what a plan compiles
 * to. Holds device memory until released (the pipeline releases the ones it made).
 */
export interface PreparedMask {
  /** the name of the backend that holds it */
  readonly backend: string;
  readonly heads: number;
  readonly numBlocks: number;
  readonly blockSize: number;
  /**
   * [H] selected causal blocks per head: the union of the VS part and the rows, counted on
   * the device. A promise because a device read may only be asynchronous (WebGPU maps
   * buffers with mapAsync): it resolves after the plan's own kernels, not after later work
   * such as an attention queued behind the plan (each call may read again).
   */
  readBlockCounts(): Promise<Float64Array>;
  /**
   * Optional: resolves once the whole mask is queued on the device, for a backend that
   * finishes part of it on the host (WebGPU reads the routes back and cuts the PE heads' rows
   * there). sparsePrefill awaits it inside the plan's time, so that step counts as plan, not
   * as attention; sparseAttention awaits it too. Absent: the mask is whole once planned.
   */
  complete?(): Promise<unknown>;
  readonly released: boolean;
  release(): void;
}

/**
 * A plan's routing, VS selection and mask building as one queue of device work
 * (`DevicePlanner.plan`): heads routed by `route` over the statistics (C_struct, and p_v
 * with the pooled estimate for a residual rule), VS heads selected by `vs`, PE heads given
 * their pooled-map rows (γ cut) and the `peK` best blocks of each direction (with
 * `peWithVs`, `vs`'s lists too), the union expanded and counted, all on the device.
 */
export interface DevicePlanRequest {
  /** statistics from this backend's proxyStats (best with `deferRead`: nothing is read before the end) */
  readonly stats: ProxyStats;
  readonly route: DeviceRouterRule;
  readonly vs: DeviceSelectorRule;
  /** blocks per direction for PE heads (kMin / B) */
  readonly peK: number;
  /** the PE path's inputs: q and k the statistics came from, γ, the softmax scale (default 1/sqrt(d)) */
  readonly pe: { readonly q: DeviceTensor; readonly k: DeviceTensor; readonly gamma: number; readonly scale?: number };
  /** PE heads keep the `vs` rule's lists beside their peK best (Policy.peWithVs); only for a planner with `peWithVs` */
  readonly peWithVs?: boolean;
  /**
   * With `peWithVs`, the rule of those lists when it is not `vs` (Policy.peVs): a noise floor
   * beside a noise-floor `vs` with the same kMin; only for a planner with `peVs`
   */
  readonly peVs?: DeviceSelectorRule;
  /**
   * With `peWithVs`, narrow PE heads' vertical lists to p_v[J] > peVsExcess · ā[J] and drop
   * their extra slash lists, except heads whose C_struct lies in `peVsFullAnchor`
   * (Policy.peVsExcess, Policy.peVsFullAnchor); only for a planner with `peVsExcess`
   */
  readonly peVsExcess?: number;
  readonly peVsFullAnchor?: { readonly from: number; readonly below: number };
}

export interface DevicePlanResult {
  /**
   * The plan's mask, ready for `sparseAttention` at once: nothing was read back, so the
   * attention can be queued behind the plan. `readBlockCounts()` reads its block counts.
   */
  readonly prepared: PreparedMask;
  /**
   * The device's routes and VS lists, copied to the host when called (a caller queues the
   * attention first). A promise on every backend, since a device read may only be
   * asynchronous (WebGPU); call it before `prepared.release()`. Rejects with what the
   * device's checks of the plan found (NON_FINITE statistics, a bad row).
   */
  readonly read: () => Promise<DevicePlanOutcome>;
}

export interface DevicePlanOutcome {
  /** [H] the routes the device chose */
  readonly routes: Route[];
  /** the VS lists the device selected */
  readonly vs: VsLists;
  /**
   * the PE heads' rows (peBlockRows' form, heads ascending), copied when called; present when
   * the device routed a head to PE
   */
  readonly peRows?: () => Promise<BlockRows>;
}

/**
 * A point on a backend's device timeline (`Backend.mark`): when the device reached it in its
 * queue of work, or when it was taken if the device was idle by then.
 */
export interface DeviceMark {
  /**
   * Milliseconds on the device timeline from `earlier` to this mark. Call it once the device
   * reached both (after `synchronize`); a mark is good for the next 64 marks of its backend.
   */
  msSince(earlier: DeviceMark): number;
}

/**
 * A backend's capability to make a whole plan on the device: statistics (from `proxyStats`
 * with `deferRead`), routing, VS selection, PE rows and the expanded mask, queued with no
 * host round trip so the attention can be queued right behind it. The rules it runs are the
 * device forms of the host rules (`Router.device`, `VsSelector.device`): the same
 * comparisons, checked against the host forms by @crisp/conformance.
 */
export interface DevicePlanner {
  /** router rule kinds `plan` can run (`DeviceRouterRule['kind']`) */
  readonly routers: readonly DeviceRouterRule['kind'][];
  /** VS selector rule kinds `plan` can run (`DeviceSelectorRule['kind']`) */
  readonly selectors: readonly DeviceSelectorRule['kind'][];
  /** whether `plan` runs `peWithVs` requests (Policy.peWithVs); absent: it does not */
  readonly peWithVs?: boolean;
  /** whether `plan` runs `peVsExcess` requests beside the noise floor (Policy.peVsExcess, peVsFullAnchor); absent: it does not */
  readonly peVsExcess?: boolean;
  /** whether `plan` runs `peVs` requests (a noise floor at its own α for PE heads' lists, Policy.peVs); absent: it does not */
  readonly peVs?: boolean;
  /**
   * How close to its threshold a value the device computes in its own arithmetic may lie for
   * the device's decision to stand where the host rule's differs (device-route.ts): a residual
   * or JS distance, or a residual mass (absolute), and with `peVsExcess` the ratio
   * p_v[J] / (κ · ā[J]) (relative). Absent: RESIDUAL_MARGIN (1e-9, f64 arithmetic). A value
   * outside [RESIDUAL_MARGIN, MAX_PLANNER_MARGIN) makes the plan an INVALID_ARGUMENT.
   */
  readonly margin?: number;
  /** Queue the plan. Nothing is read back until the result's `read()` or `prepared.readBlockCounts()`. */
  plan(req: DevicePlanRequest): Promise<DevicePlanResult>;
}

export interface Backend {
  readonly name: string;
  readonly capabilities: BackendCapabilities;
  /**
   * Below this many keys dense attention beats the sparse pipeline on this backend
   * (measured; the pipeline's default length gate).
   */
  readonly sparseCrossover: number;
  /**
   * The length gate for a call's dtype and head dim, on a backend whose attention kernel (and
   * so its crossover) depends on them; the pipeline asks it before `sparseCrossover`.
   */
  sparseCrossoverFor?(dtype: DType, headDim: number): number;
  upload(t: HostTensor): DeviceTensor;
  /** An uninitialised device tensor (contents unspecified until written). */
  allocate(dtype: DType, shape: readonly number[]): DeviceTensor;
  /**
   * Copy host values into a device tensor starting at a flat element offset: the way to
   * stream a tensor too large for one JS array (files, generated scenarios) in chunks.
   */
  write(t: DeviceTensor, elementOffset: number, data: HostData): void;
  download(t: DeviceTensor): Promise<HostTensor>;
  /**
   * Optional: copy `count` elements of a device tensor, from the flat element offset
   * `elementOffset`, to the host (the counterpart of `write`): the way to stream a tensor too
   * large for one JS array out in chunks (`@crisp/io`'s `deviceTensorSource`). Resolves with a
   * Float32Array (f32) or a Uint16Array of bit patterns (f16, bf16) of `count` elements, after
   * the work queued before it. Offsets are plain Numbers (safe to 2^53), never 32-bit. A range
   * outside the tensor is an INVALID_ARGUMENT (`checkElementRange`); a backend without it is
   * read through `download`.
   */
  read?(t: DeviceTensor, elementOffset: number, count: number): Promise<HostData>;
  /**
   * Fused proxy statistics (never materialises Â). The pipeline may pass the same frozen
   * options object on every call with a given policy: read it, do not change or keep it.
   */
  proxyStats(q: DeviceTensor, k: DeviceTensor, opts: ProxyStatsOptions): Promise<ProxyStats>;
  /**
   * PE path: pooled block map Ā = softmax_J(Q̄_I · K̄_J · scale) over J <= I, flattened,
   * normalised, sorted descending (ties: lower flat index first) and cut at the shortest
   * prefix whose cumulative sum reaches γ. Rows for the listed heads, in that order:
   * rowPtr has heads.length * Nb + 1 entries.
   */
  peBlockRows(q: DeviceTensor, k: DeviceTensor, opts: PeRowsOptions): Promise<BlockRows>;
  /**
   * Optional: the plan on the device (see `DevicePlanner`). The pipeline uses it when the
   * policy's router and VS selector both have device forms this planner lists; every other
   * plan is made on the host (routing and selection in TypeScript, PE rows through
   * `peBlockRows`, the mask expanded by `sparseAttention`).
   */
  readonly planner?: DevicePlanner;
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
  /**
   * Optional: rows [start, start + rows) of `t` along its first axis as a tensor of this
   * backend, for planning one sequence of a packed batch. It shares `t`'s memory where the
   * backend can (the reference and CUDA always; WebGPU where the rows start at an aligned
   * offset), and then writing it (as an attention's `out`, or by `write`) writes `t`'s rows;
   * where it is a copy (WebGPU otherwise) it is refused as `out` and as `write`'s target
   * (INVALID_ARGUMENT), since the write would not reach `t`. Dispose it when done, and do not
   * use it after `t` is disposed.
   */
  sliceRows?(t: DeviceTensor, start: number, rows: number): DeviceTensor;
  /**
   * Optional: where the bytes of `t`, a live tensor of this backend, lie (`MemoryRange`).
   * The pipeline compares `out`'s range with q's, k's and v's and refuses any overlap
   * (INVALID_ARGUMENT naming the input) before any work: a second handle or a view over the
   * memory of an input (`sliceRows`, a wrapped buffer, a typed array over the same
   * ArrayBuffer) would be overwritten while the attention still reads it. A range marked
   * `wholeResource` (WebGPU's) also refuses an `out` at other bytes of an input's buffer.
   * Without it, only `out` being the same handle as an input is caught. WRONG_BACKEND or
   * DISPOSED for a tensor that is not a live one of this backend.
   */
  memoryRange?(t: DeviceTensor): MemoryRange;
  /**
   * Optional: exact attention over a ragged batch in one call (one launch on the GPU
   * backends): each segment's queries against its own keys, causal with the segment's
   * offset, over its own mask (or dense). q [Mq, H, d] and k, v [Nk, Hkv, d] packed; the
   * output [Mq, H, d], LSE [H, Mq]. Equal, segment by segment, to sparseAttention (or
   * denseAttention) on the segment's rows.
   */
  varlenAttention?(
    q: DeviceTensor,
    k: DeviceTensor,
    v: DeviceTensor,
    batch: VarlenBatch,
    opts?: VarlenAttentionOptions,
  ): Promise<AttentionResult>;
  /** Resolves when all queued device work is done (for timing). */
  synchronize(): Promise<void>;
  /**
   * Optional: mark the device timeline here, behind the work queued so far (for timings
   * that count what the device waited for, without synchronising).
   */
  mark?(): DeviceMark;
  dispose(): void;
}
