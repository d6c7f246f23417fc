/**
 * The CUDA backend: device tensors, the launch plumbing and the CRISP primitives.
 *
 * Shape legend: q [n, H, d], k and v [n, Hkv, d], B block size (64 or 128),
 * Nb = ceil(n / B), b = min(B, n) proxy rows.
 */
import {
  assertStatsWindows,
  assertFiniteStats,
  type AttentionOptions,
  type AttentionResult,
  type Backend,
  type BackendCapabilities,
  type BlockMask,
  type BlockRows,
  CrispError,
  type DType,
  type DeviceMark,
  type DevicePlanOutcome,
  type DevicePlanRequest,
  type DevicePlanResult,
  type DeviceTensor,
  type DeviceVsRequest,
  DeviceTensorBase,
  type HostData,
  type HostTensor,
  InvalidArgumentError,
  MaskError,
  NonFiniteError,
  type PeRowsOptions,
  type PreparedMask,
  type PreparedMaskResult,
  type PrepareMaskRequest,
  type ProxyStats,
  type ProxyStatsOptions,
  wantedOptionalStats,
  type Route,
  ShapeError,
  type VsLists,
  UnsupportedError,
  assertBlockSize,
  assertDType,
  assertShape,
  assertSupported,
  type AttentionShape,
  attentionShape,
  bytesPerElement,
  defaultScale,
  numBlocks,
  numel,
  spreadRowPtr,
  validateMask,
} from '@crisp/core';
import { compileCubin, defaultCacheDir, kernelParamCounts, kernelSource } from './compile.js';
import { deferFields } from './deferred-fields.js';
import { type CudaLibs, type Handle, check, loadCuda } from './ffi.js';
import { devicePlanLayout, NO_BAD_ROW } from './plan-layout.js';
import { type DeviceBlock, DevicePool } from './pool.js';

export interface CudaBackendOptions {
  /** CUDA device ordinal (default 0) */
  readonly device?: number;
  /** where compiled cubins are cached; null disables the cache (default ~/.cache/crisp/cuda) */
  readonly cacheDir?: string | null;
  /**
   * folder to compile the .cu sources from (default: the package's kernels/ as embedded in the
   * build, which an application bundle carries; set it to try edited kernels)
   */
  readonly kernelDir?: string;
  /** override the measured sparse/dense crossover (keys) */
  readonly sparseCrossover?: number;
  /** check q, k, v for NaN/Inf before each primitive (default true; one extra read of each) */
  readonly checkFinite?: boolean;
  /**
   * which attention kernel layout to launch (default: defaultAttentionVariant of the GPU:
   * `wgw` on Hopper, `w32` elsewhere); see ATTENTION_VARIANTS
   */
  readonly attentionVariant?: AttentionVariant;
  /** proxy statistics kernel layout (default: defaultProxyLayout(the GPU's compute capability)); see PROXY_LAYOUTS */
  readonly proxyLayout?: ProxyLayout;
  /**
   * block-level proxy statistics (no token scores asked for) in one pass over the keys
   * (default true); false runs the two-pass form (pass 1, then pass 2b). Same statistics up
   * to f32 rounding; NOTES.md has both timings.
   */
  readonly proxyFused?: boolean;
  /**
   * How the host thread waits for the GPU in a synchronising call (the device's primary
   * context's scheduling flags, CU_CTX_SCHED_*): `auto` (default) leaves the flags as they
   * are (the driver's heuristic, or what another library in the process set); `spin` keeps the
   * thread polling, so the next call starts with a warm thread and driver; `yield` and
   * `blocking` give the CPU back while waiting. The flags are the primary context's, shared
   * with every user of it in the process, hence not changed unless asked. On the H200 after a
   * 30 ms synchronize, an event record and a launch took 5.7 and 11.6 us with `spin`, 32 and
   * 59 us with the driver's default, 45 and 67 us with `blocking` (NOTES.md, session 15):
   * from an idle device that host time is part of a prefill's plan (a whole prefill with
   * `spin` is not measured yet). A driver that refuses to change the flags (older ones while
   * the context is active elsewhere in the process) leaves them as they were.
   */
  readonly schedule?: CudaSchedule;
  /**
   * Launch the device plan's small kernels after the proxy pass (PDL_KERNELS) with
   * programmatic stream serialisation (default true; used on compute capability 9.0 and
   * later with a driver that has cuLaunchKernelEx, else off). Each of them may then be
   * scheduled while the kernel before it finishes, and waits on the device (griddepcontrol)
   * for that kernel's end before it reads anything: the same order and results, less time
   * between the kernels. False launches every kernel with cuLaunchKernel.
   */
  readonly programmaticLaunch?: boolean;
}

/** CudaBackendOptions.schedule: the primary context's scheduling flags (CU_CTX_SCHED_SPIN 1, YIELD 2, BLOCKING_SYNC 4). */
export type CudaSchedule = 'spin' | 'yield' | 'blocking' | 'auto';
const SCHEDULE_FLAGS: Record<Exclude<CudaSchedule, 'auto'>, number> = { spin: 1, yield: 2, blocking: 4 };

/**
 * Attention kernel layouts (same math, same results up to f32 summation order). `w32`
 * (kernels/attention.cu, mma.sync, any sm_80+ GPU): B/32 warps of 32 query rows (each K/V
 * fragment feeds two MMAs), 64-key tiles, two CTAs per SM. `wgw` (kernels/attention-wgmma.cu,
 * Hopper only, built for sm_90a): B/64 consumer warpgroups of 64 rows on wgmma.mma_async with
 * Q/K/V read from shared memory through descriptors, key tiles of B rows, each tile's softmax
 * overlapped with the previous tile's P·V, fed by a producer warpgroup through mbarriers (3
 * stages, no CTA-wide barrier per tile; FA3's warp specialisation with cp.async). On a GPU
 * other than compute capability 9.0 `wgw` launches `w32` instead and
 * `attentionVariantFallback` says why. Measured on the H200 (bf16, d 128, B 128, dense at
 * 64k): w32 326, wgw 403 TFLOP/s. `keyTile` null: the key tile is the mask block (B rows).
 */
export const ATTENTION_VARIANTS = {
  w32: { file: 'attention.cu', prefix: 'attn_w32_', rowsPerWarp: 32, keyTile: 64, stages: 2, producerThreads: 0, sm90a: false },
  wgw: { file: 'attention-wgmma.cu', prefix: 'attn_wgw_', rowsPerWarp: 16, keyTile: null, stages: 3, producerThreads: 128, sm90a: true },
} as const;
export type AttentionVariant = keyof typeof ATTENTION_VARIANTS;
/** what a Hopper-only variant launches on other GPUs (any sm_80+ runs it) */
const PORTABLE_ATTENTION_VARIANT: AttentionVariant = 'w32';
/**
 * The layout a backend launches unless told otherwise: the fastest measured on the GPU's
 * architecture. Hopper (compute capability 9.0): `wgw` (403 TFLOP/s dense at 64k on the H200,
 * SDPA's flash backend ~330; per computed sparse block 1.04-1.07x dense). Elsewhere `w32`,
 * the fastest mma.sync layout on the H200 (not measured on other GPUs).
 */
export function defaultAttentionVariant(computeCapability: readonly [number, number]): AttentionVariant {
  return computeCapability[0] === 9 && computeCapability[1] === 0 ? 'wgw' : PORTABLE_ATTENTION_VARIANT;
}
/** kernel files built with an architecture feature suffix (sm_90a) instead of the GPU's plain sm_XY */
const FILE_ARCH: Readonly<Record<string, string>> = { 'attention-wgmma.cu': '90a', 'proxy-wgmma.cu': '90a' };
/** and the define that switches their bodies on (see kernels/wgmma.cuh) */
const FILE_OPTIONS: Readonly<Record<string, readonly string[]>> = {
  'attention-wgmma.cu': ['-DCRISP_SM90A=1'],
  'proxy-wgmma.cu': ['-DCRISP_SM90A=1'],
};

/**
 * Proxy statistics kernel layouts. In kernels/proxy.cu (mma.sync; same math, every sum in the
 * same order, so the two give the same bits): `w32` B/32 warps of 32 proxy rows, each K
 * fragment read from shared memory feeding two MMAs, pass 1 at 3 CTAs per SM; `w16` B/16
 * warps of 16 rows. `w32` needs at least d threads, so d 128 with B 64 runs `w16`. In
 * kernels/proxy-wgmma.cu (Hopper only): `wg`, B/64 warpgroups on wgmma with Q̂ and K read
 * by the tensor cores from shared memory; its scores may round differently from the mma.sync
 * layouts'. `wg` off Hopper runs `w32`; token scores (pass 2) always run proxy.cu's pass 2.
 * Timings: NOTES.md.
 */
export const PROXY_LAYOUTS = {
  w16: { rowsPerWarp: 16, sm90a: false },
  w32: { rowsPerWarp: 32, sm90a: false },
  wg: { rowsPerWarp: 16, sm90a: true },
} as const;
export type ProxyLayout = keyof typeof PROXY_LAYOUTS;
/** The portable proxy layout (every GPU): `w32`. */
export const DEFAULT_PROXY_LAYOUT: ProxyLayout = 'w32';
/**
 * The proxy layout a backend takes by default: `wg` on compute capability 9.0 (Hopper;
 * measured 10% faster than w32 for the two passes at 128k and 512k on the H200, with the
 * same bits: NOTES.md session 6), `w32` elsewhere.
 */
export function defaultProxyLayout(computeCapability: readonly [number, number]): ProxyLayout {
  return computeCapability[0] === 9 && computeCapability[1] === 0 ? 'wg' : DEFAULT_PROXY_LAYOUT;
}

/**
 * The length gate, measured by crisp-bench on one H200 (2026-11-30, session 7, commit
 * 8e4bb9e: wgw attention, the fused wg proxy pass, device selection;
 * apps/bench/results/nvidia-h200-synth/bench.md): CRISP end to end (statistics, routing,
 * selection, mask, sparse kernel) against the dense kernel on the @crisp/synth llama-like
 * layer (H = 32, Hkv = 8, d = 128, bf16): 1.28 vs 1.62 ms at 8k (CRISP 1.27x), 1.79 vs 5.62
 * ms at 16k. CRISP wins at the smallest size measured, so the crossover is at or below 8,192
 * keys; the gate stays there (not measured below). (Session 6: 8,818; session 5: 10,436;
 * session 4: 11,146; session 3 with the w32 kernels: 13,018.)
 */
export const CUDA_SPARSE_CROSSOVER = 8192;

const LOG2E = Math.LOG2E;
/** keys per proxy-statistics CTA (PART_KEYS in kernels/proxy.cu) */
const PART_KEYS = 1024;

export interface CudaDeviceInfo {
  readonly name: string;
  readonly ordinal: number;
  readonly computeCapability: readonly [number, number];
  readonly multiprocessors: number;
  readonly driverVersion: number;
  readonly totalMemory: number;
}

export class CudaTensor extends DeviceTensorBase {
  readonly backend = 'cuda';
  readonly ptr: number;
  readonly bytes: number;
  readonly #owner: CudaBackend;
  readonly #block: DeviceBlock;
  constructor(owner: CudaBackend, dtype: DType, shape: readonly number[], block: DeviceBlock, bytes: number) {
    super(dtype, shape);
    this.#owner = owner;
    this.#block = block;
    this.ptr = block.ptr;
    this.bytes = bytes;
  }
  protected release(): void {
    this.#owner.releaseBlock(this.#block);
  }
  /** bumped by every write through the backend; the NaN/Inf check is cached per version */
  #version = 0;
  /** the version last found finite, or -1 */
  #finiteAt = -1;
  /**
   * Call after writing this tensor's memory yourself (through `ptr`, outside this backend):
   * the backend checks inputs for NaN/Inf once per version and would otherwise trust the
   * previous check.
   */
  markWritten(): void {
    this.#version++;
  }
  /** @internal the write version (markWritten and the backend's writes bump it) */
  get version(): number {
    return this.#version;
  }
  /** @internal */
  get checkedFinite(): boolean {
    return this.#finiteAt === this.#version;
  }
  /** @internal */
  setCheckedFinite(): void {
    this.#finiteAt = this.#version;
  }
}

interface Prepared {
  readonly shape: ReturnType<typeof attentionShape>;
  readonly qt: CudaTensor;
  readonly kt: CudaTensor;
  readonly vt: CudaTensor;
  readonly out: CudaTensor;
  readonly lse: CudaTensor | undefined;
  readonly scale: number;
  readonly Nb: number;
}

/**
 * A mask expanded on the device (rowPtr [H·Nb + 1], cols) plus, until the host copy is
 * taken, the PE rows it was built from. Released to the pool explicitly or, as a safety
 * net, when garbage-collected.
 */
class CudaPreparedMask implements PreparedMask {
  readonly backend: string;
  /** a device plan on two streams: rowPtr and cols hold its VS heads, the PE heads come from here */
  split?: SplitPlan;
  #released = false;
  #counts: Float64Array | (() => Float64Array);
  constructor(
    readonly owner: CudaBackend,
    readonly heads: number,
    readonly numBlocks: number,
    readonly blockSize: number,
    /** the counts, or (a plan that read nothing back) what reads them */
    counts: Float64Array | (() => Float64Array),
    readonly rowPtr: DeviceBlock,
    readonly cols: DeviceBlock,
    readonly held: { blocks: DeviceBlock[] },
  ) {
    this.backend = owner.name;
    this.#counts = counts;
  }
  get blockCounts(): Float64Array {
    if (typeof this.#counts === 'function') {
      if (this.#released) throw new InvalidArgumentError('blockCounts read for the first time after the prepared mask was released');
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

const PREPARED_FINALIZER = new FinalizationRegistry<{ owner: CudaBackend; held: { blocks: DeviceBlock[] } }>((h) => {
  h.owner.releaseBlocks(h.held.blocks);
});

/** Statistics whose block scores are on the device only (CudaBackend.#deviceStats). */
interface DeviceStats {
  readonly block: DeviceBlock;
  /**
   * downloads the block statistics for the object's getters, unless they were read (it cannot
   * tell whether the object is still alive: the entry holds no reference to it, not even a
   * WeakRef, see deferred-fields.ts)
   */
  readonly materialize: () => void;
  /** out of #deviceStats, its block released (#dropStats) */
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
   * Fused deferRead statistics: an event on the third stream (#tail) behind the kernels of the
   * head values there (proxy_heads, the finiteness count; later planOnDevice's copy of them).
   * The main stream waits for it before their scratch goes back (#releaseHeld) and before
   * anything there reads them (#joinTail); a synchronous read waits for that stream anyway.
   */
  tailDone?: unknown;
  /** #mainLaunches when proxyStats returned: the second stream only if none came since */
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
 * then never downloads them. With a cap of 4 (session 7, run 3) a loop that dropped its plans
 * still downloaded one a call (the objects were not collected yet): proxyStats wall at 128k
 * 0.75 -> 1.0 ms.
 */
const DEVICE_STATS_KEPT = 64;
/** fences behind device plans, reused in turn (a reused one is recorded later: waiting on it is still safe) */
const DONE_EVENTS = 8;
/** timing events behind marks, reused in turn */
const MARK_EVENTS = 64;
/** PE heads' pooled maps (Nb² f32 a head) are built in parts of at most this many bytes */
const PE_PART_BYTES = 4 * 2 ** 30;
/**
 * Head slots in the per-row PE kernels' grids when the PE count is only on the device: each
 * CTA loops over the slots below the count (pe.cu), so a plan with 3 PE heads of 32 does not
 * launch ~30k CTAs that leave at once
 */
const PE_SLOT_GRID = 4;
/**
 * pe_radix_pass: at least PE_RADIX_ENTRIES / 2 entries of a head's causal triangle a CTA.
 * 131072 (64k a CTA) gave 8 CTAs a head at 128k, 22 us a pass for 3 heads on the H200;
 * 32768 gives 32
 */
const PE_RADIX_ENTRIES = 32768;
const DEVICE_STATS_BYTES = 256 * 2 ** 20;
const STATS_FINALIZER = new FinalizationRegistry<{ owner: CudaBackend; entry: DeviceStats }>((h) => {
  h.owner.releaseCollectedStats(h.entry);
});

/** #expand's VS part: host lists, or their device pointers [verticalPtr, vertical, slashPtr, slash] */
type ExpandVs = BlockMask['vs'] | { device: readonly [number, number, number, number] };
type ExpandRows = { rowPtr: number; cols: number; heads?: readonly number[]; headList?: number } | undefined;
/** expanded and read back: the total and each head's first row pointer */
type ExpandRead = { rowPtr: DeviceBlock; cols: DeviceBlock; total: number; headPtr: Int32Array };
/** expanded, nothing read: the summary [headPtr H + 1][total][bad row] left at `summary` on the device */
type ExpandUnread = { rowPtr: DeviceBlock; cols: DeviceBlock; summary: number };

/**
 * #expand without a read: the summary left at `summary` on the device; `only` keeps the rows
 * of the heads routed `want` in `routes` ([H] on the device, 1 = VS; a device plan's mask in
 * two parts), the others empty; `room`: the cols' size in ints when fewer than every head's
 * causal triangle can be filled.
 */
interface ExpandUnreadAt {
  readonly summary: number;
  readonly only?: { readonly routes: number; readonly want: 0 | 1 };
  readonly room?: number;
}

/** #selectOnDevice's lists on the device: their pointers, their buffer, and their read. */
interface DeviceVsSelection {
  readonly ptrs: readonly [number, number, number, number];
  readonly buf: DeviceBlock;
  readonly read: (after?: unknown) => { lists: () => VsLists; prefix: ArrayBuffer };
}

/**
 * A device plan run on two streams (#splitPe): the prepared rows hold the VS heads; the PE
 * heads' kernels, rows and attention go to the second stream once queued.
 */
interface SplitPlan {
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

/** What #splitPe queued: the PE count, and with PE heads their rows. */
interface SplitQueued {
  readonly count: number;
  readonly rows?: SplitRows;
}

/** The PE heads' rows on the device (their PE part and expansion), summary, and an event behind them. */
interface SplitRows {
  readonly part: PePart;
  readonly rowPtr: number;
  readonly cols: number;
  readonly summary: number;
  readonly done: unknown;
}

/** A device plan's expansion summary [headPtr H + 1][total][bad row]: a bad row is this backend's fault. */
function assertGoodRows(summary: Int32Array, H: number, Nb: number): void {
  const badRow = summary[H + 1];
  if (badRow !== NO_BAD_ROW) {
    // the device builds every row itself
    throw new CrispError('BACKEND_ERROR', `the device plan built a bad row (head ${Math.floor(badRow / Nb)} row ${badRow % Nb}); the mask was not written`);
  }
}

/** One chunk of PE heads' rows on the device: rowPtrD [rows + 1], cols (room for all causal blocks). */
interface PePart {
  readonly rowPtrD: DeviceBlock;
  readonly cols: DeviceBlock;
  readonly rows: number;
}

interface PeRequest {
  readonly shape: AttentionShape;
  readonly qt: CudaTensor;
  readonly kt: CudaTensor;
  readonly B: number;
  readonly Nb: number;
  readonly heads: readonly number[];
  readonly gamma: number;
  readonly scale: number;
}

/** One entry of a trace (startTrace): a launch (device start/end) or a host wait (hostEndMs). */
export interface TraceEntry {
  readonly name: string;
  /** host clock at the launch, or at the start of the wait, ms after startTrace */
  readonly hostMs: number;
  readonly hostEndMs?: number;
  /** device times, ms after the first traced launch's start event */
  readonly startMs?: number;
  readonly endMs?: number;
  /**
   * a launch's stream: 'side' for a device plan's second stream (router and PE kernels),
   * 'tail' for the third (the statistics' head values)
   */
  readonly stream?: 'main' | 'side' | 'tail';
}

/** events reused in turn (#recordIn) */
interface EventRing {
  readonly events: unknown[];
  next: number;
}

interface TraceState {
  readonly events: Handle[];
  readonly entries: { name: string; host: number; hostEnd?: number; ev?: number; stream?: 'main' | 'side' | 'tail' }[];
  readonly t0: number;
  /** the next unused start event (events come in start/end pairs) */
  nextEvent: number;
}

type Arg = readonly ['p' | 'i' | 'f' | 'd' | 'u64', number];
/** CudaBackend.mark's DeviceMark: the ring slot its event was recorded in, and the slot's generation then. */
class CudaMark implements DeviceMark {
  constructor(
    readonly owner: CudaBackend,
    readonly slot: { readonly ev: unknown; readonly gen: number },
    readonly gen: number,
  ) {}

  msSince(earlier: DeviceMark): number {
    return markElapsed(this.owner, this, earlier);
  }
}

/** CudaBackend's #markElapsed, set in its static block (module-private, not on the class's API). */
let markElapsed: (be: CudaBackend, later: CudaMark, earlier: DeviceMark) => number;

/** The proxy passes' kernels for one configuration (CudaBackend's #passNames). */
interface PassNames {
  readonly dtype: DType;
  readonly D: number;
  readonly B: number;
  readonly w32: boolean;
  readonly wg: boolean;
  readonly lean: boolean;
  readonly fused: boolean;
  /** the mma.sync passes' kernel suffix (w32_ or not, dtype, d, B) */
  readonly kname: string;
  readonly file: 'proxy.cu' | 'proxy-wgmma.cu';
  readonly p1: string;
  readonly p2b: string;
}

/**
 * The kernels launched with programmatic stream serialisation (programmaticLaunch): each
 * starts with CRISP_PDL_ENTRY (kernels/crisp-common.cuh), the device-side wait for the
 * kernel before it, so a launch may overlap that kernel's last moments without reading or
 * writing anything early (kernels-compile.test.ts checks every one begins so). The device
 * plan's chain on the main stream: the combine, the block sums, the VS selection and the
 * expansion.
 */
export const PDL_KERNELS: ReadonlySet<string> = new Set([
  'proxy_combine',
  'proxy_fused_sums',
  'proxy_blocks_b',
  'vs_select',
  'vs_pack',
  'expand_count',
  'exclusive_scan_sums',
  'exclusive_scan_tiles',
  'expand_write',
]);
/** CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuda.h) */
const ATTR_PROGRAMMATIC_SERIALIZATION = 6;
/** #launchCfg's bytes: CUlaunchConfig at 0 (56 bytes), its one CUlaunchAttribute at 64 (72 bytes) */
const CFG_BYTES = 192;
const CFG_ATTR = 64;

/** kernelParams: at most MAX_ARGS arguments; their pointers at bytes 0.., their values from ARG_VALUES (#argMem) */
const MAX_ARGS = 64;
const ARG_VALUES = 512;
const P = (x: number): Arg => ['p', x];
const I = (x: number): Arg => ['i', x];
const F = (x: number): Arg => ['f', x];
const D64 = (x: number): Arg => ['d', x];
const U64 = (x: number): Arg => ['u64', x];

export class CudaBackend implements Backend {
  readonly name = 'cuda';
  readonly capabilities: BackendCapabilities = Object.freeze({
    dtypes: ['bf16', 'f16'] as const,
    headDims: [64, 128] as const,
    blockSizes: [64, 128] as const,
    maxSequence: 1 << 20,
    chunkedPrefill: true,
    logSumExp: true,
  });
  readonly sparseCrossover: number;
  readonly info: CudaDeviceInfo;
  readonly #libs: CudaLibs;
  readonly #pool: DevicePool;
  readonly #ctx: Handle;
  readonly #stream: Handle;
  /** the stream #launch queues on: #stream, or #sideStream inside #onSide */
  #cur: Handle;
  /**
   * planOnDevice's second stream: the router and the PE kernels run there beside the rest of
   * the statistics and the VS selection (created on first use)
   */
  #sideStream: Handle | undefined;
  /**
   * A third stream for fused deferRead statistics: C_struct (which only the router reads)
   * beside the block sums, then the head values (proxy_heads, the finiteness count,
   * planOnDevice's copy of them), which nothing before the attention reads: the main stream
   * goes from the combine to the block sums and the VS selection (created on first use)
   */
  #tailStream: Handle | undefined;
  /** recorded on the third stream only: behind C_struct (cstructReady) and the head values (tailDone) */
  readonly #tailEvents: EventRing = { events: [], next: 0 };
  /** fences between the two streams, reused in turn (a wait is queued right after its record) */
  readonly #sideEvents: EventRing = { events: [], next: 0 };
  /** kernels launched on the main stream so far (planOnDevice's guard for its second stream) */
  #mainLaunches = 0;
  readonly #arch: number;
  readonly #cacheDir: string | null;
  readonly #kernelDir: string | undefined;
  readonly #modules = new Map<string, Handle>();
  /** loaded kernels by file, then name, with the dynamic shared memory each was raised to */
  readonly #functions = new Map<string, Map<string, { f: Handle; smem: number }>>();
  /** each loaded file's kernels' parameter counts (kernelParamCounts), checked at every launch */
  readonly #paramCounts = new Map<string, Map<string, number>>();
  /** #passNames' last configuration */
  #lastPassNames: PassNames | undefined;
  readonly #argMem: Handle;
  readonly #argView: DataView;
  /** cuLaunchKernelEx's CUlaunchConfig and attribute (programmatic launches), or none */
  readonly #launchCfg: { mem: Handle; view: DataView } | undefined;
  /** the streams' handles as addresses, for CUlaunchConfig.hStream */
  readonly #streamAddr = new Map<unknown, bigint>();
  #disposed = false;
  /** a second stream for copies that overlap kernels (PE rows to the host during attention) */
  #copyStream: Handle | undefined;
  /** fences behind device plans (#recordDone), reused in turn */
  readonly #doneEvents: EventRing = { events: [], next: 0 };
  /** recorded on the second stream only, behind a device plan's PE rows (#splitPe) */
  readonly #peEvents: EventRing = { events: [], next: 0 };
  /** timing events behind marks (mark()), reused in turn; gen tells a reused slot */
  readonly #marks: { ev: unknown; gen: number }[] = [];
  #markNext = 0;
  readonly #checkFinite: boolean;
  /** the attention kernel layout launched by sparseAttention and denseAttention (a tuning knob) */
  #variant: AttentionVariant;
  /** the proxy statistics kernel layout (a tuning knob, like the attention variant) */
  proxyLayout: ProxyLayout;
  /** block-level proxy statistics in one pass (a tuning knob; CudaBackendOptions.proxyFused) */
  proxyFused: boolean;
  /** Selector rules prepareMask runs on the device (kernels/select.cu). */
  readonly deviceSelectors = ['noiseFloor'] as const;
  /** Router rules planOnDevice runs on the device (kernels/route.cu). */
  readonly deviceRouters = ['cStruct'] as const;
  /**
   * The device buffers behind recent statistics (newest last). Their block scores stay there
   * until read (a getter downloads them; a device selection for those statistics reads them
   * in place), until the statistics object is collected (FinalizationRegistry), or until
   * newer ones need the room (DEVICE_STATS_KEPT, DEVICE_STATS_BYTES; then they are
   * downloaded first: the entry cannot tell whether the object is still alive). dispose
   * downloads what is left.
   */
  #deviceStats: DeviceStats[] = [];
  /** the blocks' bytes of #deviceStats (kept as entries come and go, not summed a call) */
  #deviceStatsBytes = 0;
  /**
   * Entries that may still hold scratch or a third-stream event (#releaseHeld): those pushed
   * since the last #releaseRetained, so that it does not walk every kept entry (it runs
   * between the proxy pass's launch and the next one's; over 127 entries it cost ~7 us there,
   * ~40 us with the host thread just woken: NOTES.md, session 19)
   */
  #statsHolding: DeviceStats[] = [];
  /**
   * Each kept statistics object's entry (#keptStats). A WeakMap, not a WeakRef in the entry:
   * a WeakRef keeps its target alive to the end of the job that made it, and a loop of awaited
   * prefills is one job (session 20: 200 prefills at 128k held 103 MB of downloaded statistics
   * that no collection could free until the loop returned).
   */
  #statsEntry = new WeakMap<ProxyStats, DeviceStats>();

  /** The entry whose device buffer still holds these statistics, if any. */
  #keptStats(stats: ProxyStats): DeviceStats | undefined {
    const e = this.#statsEntry.get(stats);
    return e && !e.dropped ? e : undefined;
  }
  /**
   * The key block means the last proxyStats computed (pass 1 takes them from the K tiles it
   * already holds): the PE rows of the same k (same tensor, same write version, same B)
   * reuse them instead of reading K again (block_means: 0.09 ms at 128k, 0.34 at 512k).
   */
  #kMeans: { block: DeviceBlock; k: WeakRef<CudaTensor>; version: number; B: number } | undefined;

  /**
   * What proxyStats keeps between calls, given back before the next call (or all of it on
   * dispose): the key block means, and the buffers of collected statistics. Downloading the
   * oldest live ones (#evictRetained) is left to the attention launches, where it overlaps
   * the kernel; here only past twice the limits (a run of plans with no attention), or all of
   * them when disposing.
   */
  #releaseRetained(disposing: boolean): void {
    if (this.#kMeans) this.#pool.release(this.#kMeans.block);
    this.#kMeans = undefined;
    // scratch held for a plan that never came (a plan after this call runs without the second stream)
    for (const e of this.#statsHolding) this.#releaseHeld(e);
    this.#statsHolding.length = 0;
    this.#evictRetained(disposing ? 0 : 2);
  }

  /**
   * Beyond `factor` x (DEVICE_STATS_KEPT, DEVICE_STATS_BYTES) (factor 0: all), the oldest
   * kept statistics are downloaded for their objects and their buffers released. A plan's
   * statistics are not read back unless someone asks, and the garbage collector reports
   * collected ones late (or, in a loop of awaited prefills, not until the loop yields), so in
   * a loop of plans one such download (3·H·Nb f64: 0.8 MB at 128k) a plan is the steady state:
   * at the start of proxyStats it cost ~0.2 ms of the plan (session 9), after an attention
   * launch it runs while the kernel does. On dispose (factor 0) a failed download is kept for
   * the getters to throw.
   */
  #evictRetained(factor: number): void {
    const keep = factor === 0 ? 0 : factor * DEVICE_STATS_KEPT - 1;
    // Collected statistics leave through STATS_FINALIZER (after a collection, in a later
    // task); the entries cannot tell a collected object from a live one themselves.
    while (this.#overStatsCaps(keep, factor)) {
      const e = this.#removeStats(0);
      try {
        e.materialize();
      } catch (err) {
        if (factor !== 0) {
          this.#dropStats(e);
          throw err;
        }
      }
      this.#dropStats(e);
    }
  }

  /** More than `keep` kept statistics, or more than factor x DEVICE_STATS_BYTES of them (a method, not a closure a call: proxyStats runs this) */
  #overStatsCaps(keep: number, factor: number): boolean {
    const n = this.#deviceStats.length;
    return n > keep || (n > 0 && this.#deviceStatsBytes > factor * DEVICE_STATS_BYTES);
  }

  /** Entry i out of #deviceStats (its bytes out of the count). */
  #removeStats(i: number): DeviceStats {
    const e = this.#deviceStats.splice(i, 1)[0] as DeviceStats;
    this.#deviceStatsBytes -= e.block.size;
    return e;
  }

  #dropStats(e: DeviceStats): void {
    e.dropped = true;
    STATS_FINALIZER.unregister(e);
    this.#pool.release(e.block);
    this.#releaseHeld(e);
  }

  /** An entry's held scratch back to the pool (planOnDevice has ordered its second stream, or none ran). */
  #releaseHeld(e: DeviceStats): void {
    // proxy_heads on the third stream reads the scratch: the main stream (where the pool's
    // next users run) waits for it first
    this.#joinTail(e);
    if (e.held) this.releaseBlocks(e.held.splice(0));
  }

  /** The main stream behind the entry's head values on the third stream (once). */
  #joinTail(e: DeviceStats): void {
    if (e.tailDone === undefined) return;
    check(this.#libs, this.#libs.cu.cuStreamWaitEvent(this.#stream, e.tailDone, 0), 'cuStreamWaitEvent');
    e.tailDone = undefined;
  }

  /** @internal STATS_FINALIZER: statistics collected before they were read. */
  releaseCollectedStats(e: DeviceStats): void {
    if (this.#disposed) return;
    const i = this.#deviceStats.lastIndexOf(e);
    if (i >= 0) this.#dropStats(this.#removeStats(i));
  }

  #profile: { a: Handle; b: Handle; totals: Map<string, { calls: number; ms: number }> } | undefined;
  #trace: TraceState | undefined;

  static #checkVariant(v: string): AttentionVariant {
    if (!Object.hasOwn(ATTENTION_VARIANTS, v)) {
      throw new InvalidArgumentError(`attentionVariant must be one of ${Object.keys(ATTENTION_VARIANTS).join(', ')}; got ${v}`);
    }
    return v as AttentionVariant;
  }

  get attentionVariant(): AttentionVariant {
    return this.#variant;
  }
  /**
   * Why the selected variant is not the one launched (undefined when it is): the Hopper
   * variant needs compute capability 9.0 (wgmma is an sm_90a feature, absent from
   * Ampere/Ada and not carried forward to later architectures); elsewhere `w32` runs.
   */
  get attentionVariantFallback(): string | undefined {
    const lay = ATTENTION_VARIANTS[this.#variant];
    if (!lay.sm90a || this.#arch === 90) return undefined;
    return `attention variant ${this.#variant} needs a Hopper GPU (compute capability 9.0, wgmma); ${this.info.name} is ${this.info.computeCapability.join('.')}, so ${PORTABLE_ATTENTION_VARIANT} runs instead`;
  }
  /** Switch the attention kernel layout (benchmarks compare them on one context). */
  set attentionVariant(v: AttentionVariant) {
    this.#variant = CudaBackend.#checkVariant(v);
  }
  /** milliseconds spent compiling or loading modules, by file */
  readonly compileMs: Record<string, { ms: number; cached: boolean }> = {};

  constructor(libs: CudaLibs, opts: CudaBackendOptions = {}) {
    this.#libs = libs;
    const cu = libs.cu;
    check(libs, cu.cuInit(0), 'cuInit');
    const count = [0];
    check(libs, cu.cuDeviceGetCount(count), 'cuDeviceGetCount');
    const ordinal = opts.device ?? 0;
    if (!Number.isInteger(ordinal) || ordinal < 0 || ordinal >= count[0]) {
      throw new CrispError(
        'BACKEND_UNAVAILABLE',
        `CUDA device ${ordinal} does not exist: the driver sees ${count[0]} device(s)`,
      );
    }
    const dev = [0];
    check(libs, cu.cuDeviceGet(dev, ordinal), 'cuDeviceGet');
    const attr = (a: number) => {
      const v = [0];
      check(libs, cu.cuDeviceGetAttribute(v, a, dev[0]), `cuDeviceGetAttribute(${a})`);
      return v[0];
    };
    const major = attr(75);
    const minor = attr(76);
    const sms = attr(16);
    const nameBuf = new Uint8Array(256);
    check(libs, cu.cuDeviceGetName(nameBuf, 256, dev[0]), 'cuDeviceGetName');
    const name = new TextDecoder().decode(nameBuf.subarray(0, nameBuf.indexOf(0)));
    const ver = [0];
    check(libs, cu.cuDriverGetVersion(ver), 'cuDriverGetVersion');
    if (major < 8) {
      throw new CrispError(
        'BACKEND_UNAVAILABLE',
        `${name} has compute capability ${major}.${minor}; the CRISP kernels need 8.0 or newer (bf16 tensor cores, cp.async)`,
      );
    }
    const schedule = opts.schedule ?? 'auto';
    if (schedule !== 'auto' && !Object.hasOwn(SCHEDULE_FLAGS, schedule)) {
      throw new InvalidArgumentError(`schedule must be one of spin, yield, blocking, auto; got ${String(schedule)}`);
    }
    if (schedule !== 'auto') {
      // the scheduling bits only; the driver keeps the context's other flags as they are
      const state = [0];
      const active = [0];
      check(libs, cu.cuDevicePrimaryCtxGetState(dev[0], state, active), 'cuDevicePrimaryCtxGetState');
      const flags = (state[0] & ~7) | SCHEDULE_FLAGS[schedule];
      // a driver that refuses (older ones do while the context is active elsewhere in the
      // process) leaves the flags as they were: the backend works either way
      if (flags !== state[0]) cu.cuDevicePrimaryCtxSetFlags(dev[0], flags);
    }
    const ctx = [null];
    check(libs, cu.cuDevicePrimaryCtxRetain(ctx, dev[0]), 'cuDevicePrimaryCtxRetain');
    this.#ctx = ctx[0];
    check(libs, cu.cuCtxSetCurrent(this.#ctx), 'cuCtxSetCurrent');
    const stream = [null];
    // flags 0: a blocking stream, ordered with the synchronous copies on the legacy stream
    check(libs, cu.cuStreamCreate(stream, 0), 'cuStreamCreate');
    this.#stream = stream[0];
    this.#cur = this.#stream;
    const mem = [0];
    const tot = [0];
    check(libs, cu.cuMemGetInfo(mem, tot), 'cuMemGetInfo');
    this.info = Object.freeze({
      name,
      ordinal,
      computeCapability: [major, minor] as const,
      multiprocessors: sms,
      driverVersion: ver[0],
      totalMemory: Number(tot[0]),
    });
    this.#arch = major * 10 + minor;
    this.#cacheDir = opts.cacheDir === undefined ? defaultCacheDir() : opts.cacheDir;
    this.#kernelDir = opts.kernelDir;
    this.#pool = new DevicePool(libs);
    this.sparseCrossover = opts.sparseCrossover ?? CUDA_SPARSE_CROSSOVER;
    this.#checkFinite = opts.checkFinite ?? true;
    this.#variant = CudaBackend.#checkVariant(opts.attentionVariant ?? defaultAttentionVariant([major, minor]));
    const layout = opts.proxyLayout ?? defaultProxyLayout([major, minor]);
    if (!Object.hasOwn(PROXY_LAYOUTS, layout)) {
      throw new InvalidArgumentError(`proxyLayout must be one of ${Object.keys(PROXY_LAYOUTS).join(', ')}; got ${layout}`);
    }
    this.proxyLayout = layout;
    this.proxyFused = opts.proxyFused ?? true;
    this.#argMem = libs.koffi.alloc('uint8_t', 4096);
    this.#argView = new DataView(libs.koffi.view(this.#argMem, 4096));
    // cuLaunchKernel's kernelParams: slot i's pointer (bytes 8i) points at its value (bytes
    // ARG_VALUES + 8i). The pointers never change, so they are written once here, and a
    // launch writes only the values (session 16: no BigInt a launch on the host path).
    const base = BigInt(libs.koffi.address(this.#argMem));
    for (let i = 0; i < MAX_ARGS; i++) this.#argView.setBigUint64(i * 8, base + BigInt(ARG_VALUES + i * 8), true);
    if ((opts.programmaticLaunch ?? true) && major >= 9 && cu.cuLaunchKernelEx) {
      // The config's block y and z (1) and attribute list (one attribute, programmatic
      // serialisation allowed) are written once; a launch writes the grid, the block's x, the
      // shared bytes and the stream
      const mem = libs.koffi.alloc('uint8_t', CFG_BYTES);
      const view = new DataView(libs.koffi.view(mem, CFG_BYTES));
      view.setUint32(16, 1, true);
      view.setUint32(20, 1, true);
      view.setBigUint64(40, BigInt(libs.koffi.address(mem)) + BigInt(CFG_ATTR), true);
      view.setUint32(48, 1, true);
      view.setUint32(CFG_ATTR, ATTR_PROGRAMMATIC_SERIALIZATION, true);
      view.setUint32(CFG_ATTR + 8, 1, true);
      this.#launchCfg = { mem, view };
    }
  }

  /** whether the plan's small kernels are launched programmatically (CudaBackendOptions.programmaticLaunch) */
  get programmaticLaunch(): boolean {
    return this.#launchCfg !== undefined;
  }

  // ---- plumbing ---------------------------------------------------------------------

  #alive(): void {
    if (this.#disposed) throw new CrispError('DISPOSED', 'this CUDA backend was disposed; create a new one');
  }

  /** @internal the prepared masks' blocks go back to the pool (no-op after dispose) */
  releaseBlocks(blocks: readonly DeviceBlock[]): void {
    if (this.#disposed) return;
    for (const b of blocks) this.#pool.release(b);
  }

  releaseBlock(b: DeviceBlock): void {
    if (!this.#disposed) this.#pool.release(b);
  }

  /** A kernel, compiled and loaded on first use (#loadFn), its shared memory limit raised as needed. */
  #fn(file: string, name: string, dynSmem = 0): Handle {
    // by file, then name: no key string built a launch (a prefill's first launch runs on a
    // cold host, where each runtime path touched costs: NOTES, session 23)
    let byName = this.#functions.get(file);
    if (!byName) {
      byName = new Map();
      this.#functions.set(file, byName);
    }
    let fn = byName.get(name);
    if (!fn) {
      fn = { f: this.#loadFn(file, name), smem: 0 };
      byName.set(name, fn);
    }
    // over 48 KiB, raised as a launch needs it (pe_logits' grows with d)
    if (dynSmem > 48 * 1024 && dynSmem > fn.smem) {
      // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
      check(this.#libs, this.#libs.cu.cuFuncSetAttribute(fn.f, 8, dynSmem), `cuFuncSetAttribute(${name})`);
      fn.smem = dynSmem;
    }
    return fn.f;
  }

  #loadFn(file: string, name: string): Handle {
    let mod = this.#modules.get(file);
    if (!mod) {
      const src = kernelSource(this.#kernelDir, file);
      this.#paramCounts.set(file, kernelParamCounts(src));
      const res = compileCubin(
        this.#libs,
        src,
        file.replace(/\.cu$/, ''),
        FILE_ARCH[file] ?? this.#arch,
        this.#cacheDir,
        FILE_OPTIONS[file],
      );
      this.compileMs[file] = { ms: res.ms, cached: res.cached };
      const out = [null];
      check(this.#libs, this.#libs.cu.cuModuleLoadData(out, res.cubin), `cuModuleLoadData(${file})`);
      mod = out[0];
      this.#modules.set(file, mod);
    }
    const out = [null];
    check(this.#libs, this.#libs.cu.cuModuleGetFunction(out, mod, name), `cuModuleGetFunction(${name})`);
    return out[0];
  }

  /** a stream handle's address (CUlaunchConfig.hStream), looked up once a stream */
  #addressOf(stream: unknown): bigint {
    let a = this.#streamAddr.get(stream);
    if (a === undefined) {
      a = BigInt(this.#libs.koffi.address(stream));
      this.#streamAddr.set(stream, a);
    }
    return a;
  }

  #launch(
    file: string,
    name: string,
    grid: readonly [number, number?, number?],
    block: number,
    smem: number,
    args: readonly Arg[],
  ): void {
    const f = this.#fn(file, name, smem);
    const want = this.#paramCounts.get(file)?.get(name);
    if (want !== undefined && want !== args.length) {
      throw new CrispError('BACKEND_ERROR', `${name} (${file}) takes ${want} arguments; the backend passed ${args.length}`);
    }
    if (args.length > MAX_ARGS) throw new CrispError('BACKEND_ERROR', `${name} takes ${args.length} arguments; launches carry at most ${MAX_ARGS}`);
    const v = this.#argView;
    for (let i = 0, off = ARG_VALUES; i < args.length; i++, off += 8) {
      const [t, x] = args[i];
      if (t === 'p' || t === 'u64') {
        // a 64-bit value as two 32-bit halves (device pointers and sizes are below 2^53)
        v.setUint32(off, x % 4294967296, true);
        v.setUint32(off + 4, Math.floor(x / 4294967296), true);
      } else if (t === 'i') v.setInt32(off, x, true);
      else if (t === 'f') v.setFloat32(off, x, true);
      else v.setFloat64(off, x, true);
    }
    const [gx, gy = 1, gz = 1] = grid;
    if (gx < 1 || gy < 1 || gz < 1 || gy > 65535 || gz > 65535) {
      throw new CrispError('LIMIT_EXCEEDED', `launch grid [${gx}, ${gy}, ${gz}] for ${name} is out of range`);
    }
    const prof = this.#profile;
    if (this.#cur === this.#stream) this.#mainLaunches++;
    if (prof) check(this.#libs, this.#libs.cu.cuEventRecord(prof.a, this.#cur), 'cuEventRecord');
    const tr = this.#trace ? this.#traceMark(name) : undefined;
    const cfg = this.#launchCfg;
    if (cfg && PDL_KERNELS.has(name)) {
      const c = cfg.view;
      c.setUint32(0, gx, true);
      c.setUint32(4, gy, true);
      c.setUint32(8, gz, true);
      c.setUint32(12, block, true);
      c.setUint32(24, smem, true);
      c.setBigUint64(32, this.#addressOf(this.#cur), true);
      check(this.#libs, this.#libs.cu.cuLaunchKernelEx!(cfg.mem, f, this.#argMem, null), `cuLaunchKernelEx(${name})`);
    } else {
      check(
        this.#libs,
        this.#libs.cu.cuLaunchKernel(f, gx, gy, gz, block, 1, 1, smem, this.#cur, this.#argMem, null),
        `cuLaunchKernel(${name})`,
      );
    }
    if (tr) check(this.#libs, this.#libs.cu.cuEventRecord(tr, this.#cur), 'cuEventRecord');
    if (prof) {
      const cu = this.#libs.cu;
      check(this.#libs, cu.cuEventRecord(prof.b, this.#cur), 'cuEventRecord');
      check(this.#libs, cu.cuEventSynchronize(prof.b), 'cuEventSynchronize');
      const ms = [0];
      check(this.#libs, cu.cuEventElapsedTime(ms, prof.a, prof.b), 'cuEventElapsedTime');
      const e = prof.totals.get(name) ?? { calls: 0, ms: 0 };
      e.calls++;
      e.ms += ms[0];
      prof.totals.set(name, e);
    }
  }

  /**
   * Kernel profiling: while on, every launch is bracketed by events and waited for, and its
   * device time is added to a per-kernel total (this serialises the stream: use it to see
   * where time goes, never while timing). `stopProfile` returns the totals, largest first.
   */
  startProfile(): void {
    this.#alive();
    if (this.#profile) return;
    this.#profile = { a: this.#newEvent(0) as Handle, b: this.#newEvent(0) as Handle, totals: new Map() };
  }

  stopProfile(): { kernel: string; calls: number; ms: number }[] {
    const prof = this.#profile;
    if (!prof) return [];
    this.#profile = undefined;
    this.#libs.cu.cuEventDestroy(prof.a);
    this.#libs.cu.cuEventDestroy(prof.b);
    return [...prof.totals].map(([kernel, e]) => ({ kernel, ...e })).sort((x, y) => y.ms - x.ms);
  }

  /**
   * A timeline of the launches without serialising them (unlike startProfile): an event on
   * the stream before and after each kernel, the host's clock at each launch and around each
   * synchronous read. `stopTrace` waits for the stream and returns, per entry, the host time
   * and the device times relative to the first launch's start event: where the GPU waited
   * for the host (a start event well after the previous end) and where the host waited for
   * the GPU (a read). For finding gaps, not for timing (the events add a little work).
   */
  startTrace(maxLaunches = 256): void {
    this.#alive();
    if (this.#trace) return;
    const events: Handle[] = [];
    for (let i = 0; i < 2 * maxLaunches; i++) events.push(this.#newEvent(0) as Handle);
    this.#trace = { events, entries: [], t0: performance.now(), nextEvent: 0 };
  }

  stopTrace(): TraceEntry[] {
    const tr = this.#trace;
    if (!tr) return [];
    this.#trace = undefined;
    const cu = this.#libs.cu;
    try {
      check(this.#libs, cu.cuStreamSynchronize(this.#stream), 'cuStreamSynchronize');
      if (this.#sideStream) check(this.#libs, cu.cuStreamSynchronize(this.#sideStream), 'cuStreamSynchronize');
      if (this.#tailStream) check(this.#libs, cu.cuStreamSynchronize(this.#tailStream), 'cuStreamSynchronize');
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

  /** Trace: records the start event of a launch and returns the end event to record after it. */
  #traceMark(name: string): Handle | undefined {
    const tr = this.#trace!;
    const ev = tr.nextEvent;
    if (ev + 1 >= tr.events.length) {
      tr.entries.push({ name, host: performance.now() });
      return undefined;
    }
    tr.nextEvent += 2;
    tr.entries.push({ name, host: performance.now(), ev, stream: this.#cur === this.#stream ? 'main' : this.#cur === this.#tailStream ? 'tail' : 'side' });
    check(this.#libs, this.#libs.cu.cuEventRecord(tr.events[ev], this.#cur), 'cuEventRecord');
    return tr.events[ev + 1];
  }

  /** Trace: a point on the host's clock. */
  #traceHost(name: string): void {
    if (this.#trace) this.#traceWait(`(host) ${name}`, performance.now());
  }

  /** Trace: a host-side wait (a synchronous read), from `host` to now. */
  #traceWait(name: string, host: number): void {
    this.#trace?.entries.push({ name, host, hostEnd: performance.now() });
  }

  #scratch(bytes: number): DeviceBlock {
    // (no closure unless tracing: this runs several times before a prefill's first launch)
    if (!this.#trace) return this.#pool.alloc(Math.max(4, bytes));
    return this.#allocTraced(() => this.#pool.alloc(Math.max(4, bytes)));
  }

  /** A pool allocation; while tracing, one the pool could not serve shows as a cuMemAlloc wait. */
  #allocTraced(alloc: () => DeviceBlock): DeviceBlock {
    if (!this.#trace) return alloc();
    const t = performance.now();
    const misses = this.#pool.misses;
    const b = alloc();
    if (this.#pool.misses !== misses) this.#traceWait(`cuMemAlloc for ${b.size} B`, t);
    return b;
  }

  /**
   * A host array in a scratch block, copied on the kernels' stream: ordered after the kernels
   * queued before it and before those queued after, without waiting for them (a synchronous
   * cuMemcpyHtoD first drains the stream: one idle gap of the GPU per upload). From pageable
   * memory the driver stages the bytes before returning, so `a` may change right after.
   */
  #uploadArray(a: Int32Array | Float64Array): DeviceBlock {
    const b = this.#scratch(a.byteLength);
    if (a.byteLength > 0) {
      const t = this.#trace ? performance.now() : 0;
      check(this.#libs, this.#libs.cu.cuMemcpyHtoDAsync(b.ptr, a, a.byteLength, this.#cur), 'cuMemcpyHtoDAsync');
      if (this.#trace) this.#traceWait(`upload ${a.byteLength} B`, t);
    }
    return b;
  }

  #read<T extends Float32Array | Int32Array | Float64Array | Uint16Array>(ptr: number, out: T): T {
    const t = this.#trace ? performance.now() : 0;
    if (out.byteLength > 0) check(this.#libs, this.#libs.cu.cuMemcpyDtoH(out, ptr, out.byteLength), 'cuMemcpyDtoH');
    if (this.#trace) this.#traceWait(`read ${out.byteLength} B`, t);
    return out;
  }

  /**
   * NaN/Inf in q, k or v would vanish inside a softmax (a -Inf score is just a zero
   * weight), so inputs are checked on the device first: one read of each tensor and a
   * 4-byte readback. Off with `checkFinite: false`.
   */
  #assertFinite(t: CudaTensor, what: string): void {
    // Once per tensor version: a plan and its run read q and k up to three times, and at
    // 512k each check is a 1-4 GB read (about 13 ms a prefill when repeated).
    if (!this.#checkFinite || t.dtype === 'f32' || t.checkedFinite) return;
    const flag = this.#scratch(4);
    try {
      check(this.#libs, this.#libs.cu.cuMemsetD32Async(flag.ptr, 0, 1, this.#stream), 'cuMemsetD32Async');
      const count = numel(t.shape);
      this.#launch('mask.cu', 'count_nonfinite', [Math.max(1, Math.min(4096, Math.ceil(count / 256)))], 256, 0, [
        P(t.ptr),
        U64(count),
        I(t.dtype === 'bf16' ? 0x7f80 : 0x7c00),
        P(flag.ptr),
      ]);
      const c = this.#read(flag.ptr, new Int32Array(1))[0];
      if (c !== 0) {
        throw new NonFiniteError(`${what} holds ${c >>> 0} NaN/Inf values; clean the input before attention`, {
          tensor: what,
          count: c >>> 0,
        });
      }
      t.setCheckedFinite();
    } finally {
      this.#pool.release(flag);
    }
  }

  #tensor(t: DeviceTensor, what: string): CudaTensor {
    if (!(t instanceof CudaTensor)) {
      throw new CrispError('WRONG_BACKEND', `${what} belongs to backend '${t?.backend}', not cuda; upload it here first`);
    }
    if (t.disposed) throw new CrispError('DISPOSED', `${what} was disposed`);
    return t;
  }

  // ---- tensors ----------------------------------------------------------------------

  allocate(dtype: DType, shape: readonly number[]): DeviceTensor {
    this.#alive();
    assertDType(dtype);
    assertShape(shape as number[]);
    const bytes = numel(shape) * bytesPerElement(dtype);
    return new CudaTensor(this, dtype, shape, this.#scratch(bytes), bytes);
  }

  upload(t: HostTensor): DeviceTensor {
    this.#alive();
    assertDType(t.dtype);
    assertShape(t.shape as number[]);
    if (numel(t.shape) !== t.data.length) {
      throw new ShapeError(`shape [${t.shape}] holds ${numel(t.shape)} values but data has ${t.data.length}`);
    }
    const d = this.allocate(t.dtype, t.shape) as CudaTensor;
    this.write(d, 0, t.data);
    return d;
  }

  write(t: DeviceTensor, elementOffset: number, data: HostData): void {
    this.#alive();
    const ct = this.#tensor(t, 'write target');
    const bpe = bytesPerElement(ct.dtype);
    if ((ct.dtype === 'f32') !== data instanceof Float32Array) {
      throw new CrispError('DTYPE_MISMATCH', `a ${ct.dtype} tensor needs ${ct.dtype === 'f32' ? 'Float32Array' : 'Uint16Array'} data`);
    }
    if (!Number.isInteger(elementOffset) || elementOffset < 0 || elementOffset + data.length > numel(ct.shape)) {
      throw new InvalidArgumentError(
        `write of ${data.length} elements at offset ${elementOffset} overruns a tensor of ${numel(ct.shape)} elements`,
      );
    }
    if (data.length === 0) return;
    ct.markWritten();
    check(
      this.#libs,
      this.#libs.cu.cuMemcpyHtoD(ct.ptr + elementOffset * bpe, data, data.length * bpe),
      'cuMemcpyHtoD',
    );
  }

  async download(t: DeviceTensor): Promise<HostTensor> {
    this.#alive();
    const ct = this.#tensor(t, 'download source');
    const n = numel(ct.shape);
    const data = ct.dtype === 'f32' ? new Float32Array(n) : new Uint16Array(n);
    this.#read(ct.ptr, data);
    return { dtype: ct.dtype, shape: [...ct.shape], data };
  }

  // ---- proxy statistics -------------------------------------------------------------

  /** The shape proxy statistics and PE rows work on: supported, and q as long as k (no chunks). */
  #selectionShape(q: DeviceTensor, k: DeviceTensor): AttentionShape {
    const shape = attentionShape(q, k, k);
    assertSupported(this.capabilities, shape, this.name);
    if (shape.queries !== shape.keys) {
      throw new UnsupportedError(
        `proxy statistics and PE rows need q and k of equal length (got ${shape.queries} and ${shape.keys}); chunked prefill runs dense or with a mask you pass`,
        { limit: 'chunkedPrefill' },
      );
    }
    return shape;
  }

  async proxyStats(q: DeviceTensor, k: DeviceTensor, opts: ProxyStatsOptions): Promise<ProxyStats> {
    return this.#proxyStats(q, k, opts);
  }

  /**
   * The proxy passes' kernel names for a configuration, kept for the last one asked (a model's
   * layers ask for the same one): the same string objects each call, so no names are built
   * and hashed on the host's path to the pass's launch (NOTES, session 23).
   */
  #passNames(dtype: DType, D: number, B: number, w32: boolean, wg: boolean, lean: boolean, fused: boolean): PassNames {
    const c = this.#lastPassNames;
    if (c && c.dtype === dtype && c.D === D && c.B === B && c.w32 === w32 && c.wg === wg && c.lean === lean && c.fused === fused) {
      return c;
    }
    const suf = `${dtype}_d${D}_b${B}`;
    const kname = w32 ? `w32_${suf}` : suf;
    const names: PassNames = {
      dtype,
      D,
      B,
      w32,
      wg,
      lean,
      fused,
      kname,
      file: wg ? 'proxy-wgmma.cu' : 'proxy.cu',
      p1: wg ? `proxy_wg_pass1${lean ? 'l' : fused ? 'f' : ''}_${suf}` : `proxy_pass1${fused ? 'f' : ''}_${kname}`,
      p2b: wg ? `proxy_wg_pass2b_${suf}` : `proxy_pass2b_${kname}`,
    };
    this.#lastPassNames = names;
    return names;
  }

  /** proxyStats' work, synchronous (the optional statistics' later pass calls it from a getter). */
  #proxyStats(q: DeviceTensor, k: DeviceTensor, opts: ProxyStatsOptions): ProxyStats {
    this.#alive();
    this.#traceHost('proxyStats()');
    const shape = this.#selectionShape(q, k);
    const B = opts?.blockSize;
    assertBlockSize(B, this.capabilities.blockSizes);
    assertStatsWindows(opts);
    const scale = opts.scale ?? defaultScale(shape.headDim);
    if (!(scale > 0) || !Number.isFinite(scale)) throw new InvalidArgumentError(`scale must be positive; got ${scale}`);
    const wanted = wantedOptionalStats(opts.optionalStats);
    const qt = this.#tensor(q, 'q');
    const kt = this.#tensor(k, 'k');
    this.#assertFinite(qt, 'q');
    this.#assertFinite(kt, 'k');
    this.#traceHost('proxyStats: checked');
    const { keys: n, heads: H, kvHeads: Hkv, headDim: D, dtype } = shape;
    const b = Math.min(B, n);
    const Nb = numBlocks(n, B);
    const nParts = Math.ceil(n / PART_KEYS);
    const SP = PART_KEYS + B;
    const f4 = 4;
    // [C_struct H][row entropy H][p_v H·Nb][p_s H·Nb][pooled H·Nb], f64, written by
    // proxy_blocks and proxy_heads and downloaded in one copy.
    const outLen = 2 * H + 3 * H * Nb;
    // The pass's own buffers first and the pass launched, then the rest (from an idle device
    // the device waits for this host work: session 15, NOTES).
    const pm = this.#scratch(H * b * nParts * f4);
    const pl = this.#scratch(H * b * nParts * f4);
    const pt = this.#scratch(H * b * nParts * f4);
    // Token scores asked for: pass 2 writes a_v [H·n] and the parts' a_s; otherwise pass 2b
    // writes block scores and window sums only (SBP offset blocks a part).
    const tokens = Boolean(opts.tokenScores);
    const SBP = PART_KEYS / B + 3;
    // the fused pass (block level): per (head, part, row) the part's bins, key blocks, offset
    // blocks and window relative to the row's part max, [H][nParts][NS][b]
    const fused = !tokens && this.proxyFused;
    const wg = PROXY_LAYOUTS[this.proxyLayout].sm90a && this.#arch === 90;
    // The lean fused pass (no key block means, no query mean, no entropy sums: 0.485 -> 0.429
    // ms at 128k, session 15's ablation) when neither optional statistic is wanted, for a
    // device plan's statistics (deferRead) whose PE heads run on the second stream beside the
    // attention (H·Nb² within one PE part): their key block means then come from block_means
    // there (0.09 ms at 128k), off the plan's critical path. Elsewhere the PE rows would read K
    // on it, so the full pass.
    const lean = fused && wg && Boolean(opts.deferRead) && wanted.length === 0 && H * Nb * Nb * 4 <= PE_PART_BYTES;
    const NS = 2 * (PART_KEYS / B) + 4;
    const bins = fused ? this.#scratch(H * nParts * NS * b * f4) : undefined;
    const qm = lean ? undefined : this.#scratch(H * D * f4);
    const km = lean ? undefined : this.#scratch(Hkv * Nb * D * f4);
    const blocks = [pm, pl, pt, ...(qm && km ? [qm, km] : []), ...(bins ? [bins] : [])];
    const take = (bytes: number): DeviceBlock => {
      const x = this.#scratch(bytes);
      blocks.push(x);
      return x;
    };
    this.#traceHost('proxyStats: scratch taken');
    // the third stream's last event (C_struct's, then the head values'), when it is used: on a
    // failure the scratch waits for it
    let tailDone: unknown;
    try {
      const scaleLog2 = scale * LOG2E;
      // wg (Hopper): B / 64 warpgroups, tiles at 1024-byte-aligned addresses (1024 bytes of
      // slack). The mma.sync layout runs proxy.cu's passes off wg, and the token-score pass 2
      // always (wg's as w32); w32 gives each thread one column of the block means: it needs
      // d <= B threads, else w16
      const w32 = this.proxyLayout !== 'w16' && D <= B;
      const mmaThreads = w32 ? B : B * 2;
      const threads = wg ? B * 2 : mmaThreads;
      const { file, p1, p2b, kname } = this.#passNames(dtype, D, B, w32, wg, lean, fused);
      const slack = wg ? 1024 : 0;
      const kTiles = 2 * 64 * D * 2; // two 64-key K tiles (bf16/f16)
      // Q rows, K tiles, the block means' two chunk partials per column for two blocks; the
      // fused pass's per-tile table (16 tiles x 4 values x B rows)
      const smem1 = slack + B * D * 2 + kTiles + 4 * D * f4 + (fused ? (PART_KEYS / 64) * 4 * B * f4 : 0);
      this.#traceHost('proxyStats: launching the pass');
      // pass 1: grid [H, nParts], heads fastest (a kv group's query heads share K tiles in L2)
      this.#launch(file, p1, [H, nParts], threads, smem1, [
        P(qt.ptr),
        P(kt.ptr),
        P(pm.ptr),
        P(pl.ptr),
        P(pt.ptr),
        P(qm ? qm.ptr : 0),
        P(km ? km.ptr : 0),
        ...(bins ? [P(bins.ptr)] : []),
        I(n),
        I(H),
        I(Hkv),
        I(b),
        F(scaleLog2),
        ...(bins ? [I(opts.wSink), I(opts.wLocal)] : []),
      ]);
      // Collected or surplus statistics and the last key block means back to the pool (not
      // before the launch: the pass's buffers may come from the pool's growth instead)
      this.#releaseRetained(false);
      this.#traceHost('proxyStats: retained released');
      const lse2 = take(H * b * f4);
      const ent = take(H * b * f4);
      const av = take(tokens ? H * n * f4 : H * Nb * f4);
      const sp = take(tokens ? H * nParts * SP * f4 : H * nParts * SBP * f4);
      const win = tokens ? undefined : take(H * nParts * f4);
      const as = tokens ? take(H * n * f4) : undefined;
      // proxy_cstruct's per-head tickets (its last CTA of a head sums the parts)
      const tickets = bins ? take(H * 4) : undefined;
      // one more f64: the count of non-finite statistics (count_nonfinite_f64)
      // held by the statistics until read or collected (#deviceStats): taken in slabs of 16,
      // so that calls whose earlier statistics are not collected yet do not each pay a
      // cuMemAlloc (0.31 ms at 128k in session 8's trace)
      const out = this.#allocTraced(() => this.#pool.allocBatch((outLen + 1) * 8, 16));
      blocks.push(out);
      this.#launch('proxy.cu', 'proxy_combine', [Math.ceil((H * b * 32) / 256)], 256, 0, [
        P(pm.ptr),
        P(pl.ptr),
        P(pt.ptr),
        P(lse2.ptr),
        P(ent.ptr),
        I(H),
        I(b),
        I(nParts),
        // proxy_cstruct's tickets, zeroed there
        P(tickets ? tickets.ptr : 0),
        I(tickets ? H : 0),
      ]);
      const st = out.ptr + 8; // the statistics, after the non-finite count
      const defer = Boolean(opts.deferRead) && !as;
      let cstructReady: unknown;
      // Fused deferRead statistics (a device plan's) use a third stream: C_struct there beside
      // the block sums here, then an event where the plan's second stream starts its router;
      // later the head values, which nothing before the attention reads (the VS selection
      // reads p_v and p_s). The main stream goes from the combine to the block sums and the
      // selection without either (NOTES, session 15).
      const tail = bins && defer ? this.#tail() : undefined;
      if (bins) {
        if (tail) this.#fence(this.#stream, tail);
        this.#onStream(tail ?? this.#stream, () =>
          this.#launch('proxy.cu', 'proxy_cstruct', [nParts, H], 32, 0, [
            P(bins.ptr),
            P(pm.ptr),
            P(lse2.ptr),
            P(win!.ptr),
            P(tickets!.ptr),
            P(st),
            I(b),
            I(B),
            I(nParts),
          ]),
        );
        if (tail) {
          cstructReady = this.#recordIn(this.#tailEvents, tail);
          tailDone = cstructReady;
        }
        // the rows' bins weighted by 2^(m − lse) into pass 2b's outputs, the window's left out
        this.#launch('proxy.cu', 'proxy_fused_sums', [nParts, H], 256, 0, [
          P(bins.ptr),
          P(pm.ptr),
          P(lse2.ptr),
          P(av.ptr),
          P(sp.ptr),
          I(n),
          I(H),
          I(b),
          I(B),
          I(nParts),
        ]);
      } else if (tokens) {
        // two probability tiles (B x 64 f32; the first over Q's rows), K tiles, two sets of
        // column and diagonal partials of the B / 32 row groups (64 and 96 floats each), the
        // part's slash accumulator
        const pTile = B * 64 * f4;
        const smem2 = Math.max(B * D * 2, pTile) + pTile + kTiles + (2 * (B / 32) * (64 + 96) + SP) * f4;
        this.#launch('proxy.cu', `proxy_pass2_${kname}`, [H, nParts], mmaThreads, smem2, [
          P(qt.ptr),
          P(kt.ptr),
          P(lse2.ptr),
          P(av.ptr),
          P(sp.ptr),
          I(n),
          I(H),
          I(Hkv),
          I(b),
          F(scaleLog2),
        ]);
      } else {
        // Q rows, K tiles, two parities of the warps' five tile sums, the part's key-block,
        // offset-block and window accumulators
        const smem2b = slack + B * D * 2 + kTiles + (2 * (threads / 32) * 5 + PART_KEYS / B + SBP + 1) * f4;
        this.#launch(file, p2b, [H, nParts], threads, smem2b, [
          P(qt.ptr),
          P(kt.ptr),
          P(lse2.ptr),
          P(av.ptr),
          P(sp.ptr),
          P(win!.ptr),
          I(n),
          I(H),
          I(Hkv),
          I(b),
          F(scaleLog2),
          I(opts.wSink),
          I(opts.wLocal),
        ]);
      }
      // one warp per (block, head), 4 blocks a CTA: block sums from pass 2's token scores
      // (proxy_blocks, which also writes a_s when asked) or pass 2b's parts (proxy_blocks_b)
      // (the lean pass: no means, the pooled logits 0)
      const sums = [P(av.ptr), P(sp.ptr), P(qm ? qm.ptr : 0), P(km ? km.ptr : 0)];
      const shape = [P(st), I(n), I(H), I(Hkv), I(b), I(B), I(nParts), I(D), F(scale), I(Nb)];
      this.#launch(
        'proxy.cu',
        tokens ? 'proxy_blocks' : 'proxy_blocks_b',
        // (proxy_blocks: a block a warp; proxy_blocks_b: BB_J = 4 blocks a warp)
        [Math.ceil(Nb / (tokens ? 4 : 16)), H],
        128,
        0,
        tokens ? [...sums, P(as ? as.ptr : 0), ...shape] : [...sums, ...shape],
      );
      // The head values (entropies, the pooled estimate's softmax) and the finiteness count:
      // on the third stream, when there is one, once the block sums are queued
      if (tail) this.#fence(this.#stream, tail);
      try {
        this.#onStream(tail ?? this.#stream, () => {
          // (the fused pass: neither av nor winPart, C_struct is proxy_cstruct's)
          this.#launch('proxy.cu', 'proxy_heads', [H], 256, 0, [
            P(tokens ? av.ptr : 0),
            P(win && !bins ? win.ptr : 0),
            // (the lean pass: no entropy sums, the entropy 0)
            P(lean ? 0 : ent.ptr),
            P(st),
            I(n),
            I(H),
            I(b),
            I(Nb),
            I(opts.wSink),
            I(opts.wLocal),
            I(nParts),
          ]);
          check(this.#libs, this.#libs.cu.cuMemsetD32Async(out.ptr, 0, 2, this.#cur), 'cuMemsetD32Async');
          this.#launch('proxy.cu', 'count_nonfinite_f64', [Math.min(this.info.multiprocessors, Math.ceil(outLen / 256))], 256, 0, [
            P(st),
            I(outLen),
            P(out.ptr),
          ]);
        });
      } finally {
        if (tail) tailDone = this.#recordIn(this.#tailEvents, tail);
      }
      // What routing reads comes back now: the count, C_struct and the entropies (2H + 1
      // values). The block statistics (3·H·Nb: 3 MB at 512k) come back when first read
      // (lazyBlockStats), as a device selection reads them where they are. deferRead (a plan
      // routed on the device): the head values too, on first access (that read waits for the
      // device), so nothing here waits.
      let given: Float64Array | undefined;
      const readHead = () => {
        const head = given ?? this.#read(out.ptr, new Float64Array(1 + 2 * H));
        return {
          nonFinite: head[0],
          cStruct: head.subarray(1, 1 + H),
          rowEntropy: head.subarray(1 + H, 1 + 2 * H),
          finite: head[0] === 0,
        };
      };
      const head = defer ? undefined : readHead();
      const nonFinite = head ? head.nonFinite : 0;
      const HNb = H * Nb;
      const stats = {
        n,
        heads: H,
        blockSize: B,
        numBlocks: Nb,
        proxyRows: b,
        ...(head ? { cStruct: head.cStruct, rowEntropy: head.rowEntropy, finite: head.finite } : {}),
        ...(as
          ? {
              verticalTokens: this.#read(av.ptr, new Float32Array(H * n)),
              slashTokens: this.#read(as.ptr, new Float32Array(H * n)),
            }
          : {}),
      } as unknown as ProxyStats;
      // deferred: C_struct, the entropies and the device's finiteness verdict on first access
      // (the lean pass's entropies are placeholders: see below)
      const headLoad = () => {
        const h = readHead();
        return { cStruct: h.cStruct, rowEntropy: h.rowEntropy, finite: h.finite };
      };
      const headLazy = defer
        ? deferFields(stats, lean ? (['cStruct', 'finite'] as const) : (['cStruct', 'rowEntropy', 'finite'] as const), headLoad)
        : undefined;
      // the block statistics: on first read (copy stream: their kernels finished before the
      // read above), or when the backend needs their buffer back (#releaseRetained)
      const blockLoad = () => {
        // deferred statistics: their kernels are done once the head values are read
        headLazy?.materialize();
        const all = this.#readOnCopyStream(st + 2 * H * 8, new Float64Array(3 * HNb));
        return {
          verticalBlocks: all.subarray(0, HNb),
          slashBlocks: all.subarray(HNb, 2 * HNb),
          pooledEstimate: all.subarray(2 * HNb, 3 * HNb),
        };
      };
      // The lean pass left the optional statistics out (their slots hold finite placeholders,
      // entropy 0 and a uniform pooled estimate, so that the finiteness count holds): they
      // come from a full pass on first read, while q and k are the tensors these statistics
      // were computed from.
      if (lean) this.#optionalLater(stats, qt, kt, { blockSize: B, wSink: opts.wSink, wLocal: opts.wLocal, scale });
      const lazy = deferFields(
        stats,
        lean ? (['verticalBlocks', 'slashBlocks'] as const) : (['verticalBlocks', 'slashBlocks', 'pooledEstimate'] as const),
        blockLoad,
        (e) =>
          new CrispError(
            'BACKEND_ERROR',
            `proxy statistics: the block statistics could not be downloaded before their device buffer was released (${(e as Error).message})`,
            { cause: String((e as Error).message) },
          ),
      );
      if (nonFinite !== 0) {
        // names the first bad statistic (NonFiniteError); the device count says one exists
        assertFiniteStats(stats);
        throw new NonFiniteError(`proxy statistics: ${nonFinite} non-finite values (counted on the device)`, { count: nonFinite });
      }
      // kept past this call: the statistics' buffer (the entry's) and the key block means (#kMeans)
      blocks.splice(blocks.indexOf(out), 1);
      if (km) blocks.splice(blocks.indexOf(km), 1);
      // keep the buffer for a device selection on these statistics (prepareMask), and for
      // their block statistics until read
      const entry: DeviceStats = {
        block: out,
        materialize: () => {
          headLazy?.materialize();
          lazy.materialize();
        },
        ...(headLazy
          ? {
              settle: (h: Float64Array) => {
                if (h.length === 1 + 2 * H) given = h;
                headLazy.materialize();
              },
            }
          : {}),
        // the scratch stays taken until planOnDevice has ordered its second stream and the main
        // stream waits for the third (#releaseHeld)
        ...(cstructReady !== undefined ? { cstructReady, tailDone, launchesAtEnd: this.#mainLaunches, held: blocks.splice(0) } : {}),
      };
      this.#deviceStats.push(entry);
      this.#statsEntry.set(stats, entry);
      this.#deviceStatsBytes += entry.block.size;
      if (entry.held !== undefined || entry.tailDone !== undefined) this.#statsHolding.push(entry);
      STATS_FINALIZER.register(stats, { owner: this, entry }, entry);
      if (km) this.#kMeans = { block: km, k: new WeakRef(kt), version: kt.version, B };
      this.#traceHost('proxyStats: returns');
      return stats;
    } finally {
      // (on a failure: C_struct or proxy_heads may be queued on the third stream, reading the scratch)
      if (blocks.length > 0 && tailDone !== undefined) check(this.#libs, this.#libs.cu.cuStreamWaitEvent(this.#stream, tailDone, 0), 'cuStreamWaitEvent');
      for (const x of blocks) this.#pool.release(x);
    }
  }

  /**
   * The lean pass's statistics: rowEntropy and pooledEstimate from a full pass on first read
   * (either field), on the same q and k if they are still the tensors and write versions the
   * statistics came from; otherwise a typed error that says how to get them.
   */
  #optionalLater(stats: ProxyStats, qt: CudaTensor, kt: CudaTensor, opts: ProxyStatsOptions): void {
    const q = new WeakRef(qt);
    const k = new WeakRef(kt);
    const versions = [qt.version, kt.version];
    deferFields(stats, ['rowEntropy', 'pooledEstimate'], () => {
      const q2 = q.deref();
      const k2 = k.deref();
      if (!q2 || !k2 || q2.disposed || k2.disposed || q2.version !== versions[0] || k2.version !== versions[1]) {
        throw new InvalidArgumentError(
          'proxy statistics: rowEntropy and pooledEstimate were left out of these statistics (optionalStats did not ask for them), and q or k has been released or written since, so they cannot be computed now; ask proxyStats for them (optionalStats) while the inputs are unchanged',
        );
      }
      const full = this.#proxyStats(q2, k2, opts);
      return { rowEntropy: full.rowEntropy, pooledEstimate: full.pooledEstimate };
    });
  }

  // ---- PE rows ----------------------------------------------------------------------

  async peBlockRows(q: DeviceTensor, k: DeviceTensor, opts: PeRowsOptions): Promise<BlockRows> {
    this.#alive();
    const req = this.#peRequest(q, k, opts);
    if (req.heads.length === 0) return { rowPtr: new Int32Array(1), cols: new Int32Array(0) };
    const parts = this.#peOnDevice(req);
    try {
      return this.#peRowsToHost(parts);
    } finally {
      for (const r of parts) this.releaseBlocks([r.rowPtrD, r.cols]);
    }
  }

  /**
   * The PE parts' rows on the host, joined. One part (every head's map fits in 4 GiB: all
   * Llama shapes to 512k) comes back as it is, without a second copy of its cols.
   */
  #peRowsToHost(parts: readonly PePart[]): BlockRows {
    const host = parts.map((r) => this.#pePartToHost(r, (ptr, out) => this.#read(ptr, out)));
    return host.length === 1 ? host[0] : joinRows(host, parts.reduce((a, r) => a + r.rows, 0));
  }

  /** One PE part's rows on the host: its row pointers, then as many cols as they count. */
  #pePartToHost(r: PePart, read: (ptr: number, out: Int32Array) => Int32Array): BlockRows {
    const rowPtr = read(r.rowPtrD.ptr, new Int32Array(r.rows + 1));
    return { rowPtr, cols: read(r.cols.ptr, new Int32Array(rowPtr[r.rows])) };
  }

  /** The checks of a PE request, and what the kernels need from it. */
  #peRequest(q: DeviceTensor, k: DeviceTensor, opts: PeRowsOptions): PeRequest {
    const shape = this.#selectionShape(q, k);
    const B = opts?.blockSize;
    assertBlockSize(B, this.capabilities.blockSizes);
    const gamma = opts.gamma;
    if (!(typeof gamma === 'number' && gamma > 0 && gamma < 1)) {
      throw new InvalidArgumentError(`gamma must be in (0, 1); got ${gamma}`);
    }
    const H = shape.heads;
    const heads = opts.heads;
    if (!Array.isArray(heads) && !(heads && typeof heads.length === 'number')) {
      throw new InvalidArgumentError('heads must be an array of head indices');
    }
    for (let i = 0; i < heads.length; i++) {
      const h = heads[i];
      if (!Number.isInteger(h) || h < 0 || h >= H || (i > 0 && h <= heads[i - 1])) {
        throw new InvalidArgumentError(`heads must be strictly increasing integers in [0, ${H}); got ${heads.join(',')}`);
      }
    }
    const qt = this.#tensor(q, 'q');
    const kt = this.#tensor(k, 'k');
    if (heads.length > 0) {
      this.#assertFinite(qt, 'q');
      this.#assertFinite(kt, 'k');
    }
    const scale = opts.scale ?? defaultScale(shape.headDim);
    return { shape, qt, kt, B, Nb: numBlocks(shape.keys, B), heads, gamma, scale };
  }

  /**
   * PE rows built on the device, one part per chunk of heads whose pooled maps fit ~4 GiB
   * (one part for every Llama shape to 512k). Nothing comes back to the host: cols are
   * allocated for the whole causal triangle of the part's heads (the kept count is only on
   * the device), and whoever needs the rows reads them (#pePartToHost). `overlap` runs on the
   * host once every kernel is queued. The caller releases rowPtrD and cols.
   */
  #peOnDevice(req: PeRequest, overlap?: () => void): PePart[] {
    const { heads, Nb } = req;
    const nh = heads.length;
    // The pooled map takes Nb² f32 per head: do heads in chunks of at most ~4 GiB.
    const chunk = Math.max(1, Math.min(nh, Math.floor(PE_PART_BYTES / (Nb * Nb * 4))));
    const parts: PePart[] = [];
    const lists: DeviceBlock[] = [];
    try {
      // each chunk's head list [count][heads] (pe.cu's hl), uploaded
      const hls = [];
      for (let c0 = 0; c0 < nh; c0 += chunk) {
        const sub = heads.slice(c0, c0 + chunk);
        const hl = this.#uploadArray(Int32Array.from([sub.length, ...sub]));
        lists.push(hl);
        hls.push({ ptr: hl.ptr, count: sub.length, first: c0 });
      }
      parts.push(...this.#peParts(req, nh, hls));
      overlap?.();
      return parts;
    } catch (e) {
      for (const r of parts) this.releaseBlocks([r.rowPtrD, r.cols]);
      throw e;
    } finally {
      this.releaseBlocks(lists);
    }
  }

  /**
   * The PE kernels for head lists on the device: `slots` head slots of Q̄ in all, each list
   * {ptr: [count][heads], count: its slots (the count when the host knows it, else the
   * most the list can hold), first: its first slot}. One part a list.
   */
  #peParts(req: PeRequest, slots: number, lists: readonly { ptr: number; count: number; first: number; known?: false }[]): PePart[] {
    const { shape, qt, kt, B, Nb, gamma, scale } = req;
    const { keys: n, heads: H, kvHeads: Hkv, headDim: D, dtype } = shape;
    // Q̄ for the listed heads only (a few of H; Q is the largest tensor), K̄ for every kv head
    const qm = this.#scratch(slots * Nb * D * 4);
    const cached = this.#kMeans;
    const reused = cached && cached.k.deref() === kt && cached.version === kt.version && cached.B === B ? cached.block : undefined;
    const km = reused ?? this.#scratch(Hkv * Nb * D * 4);
    const parts: PePart[] = [];
    try {
      if (!reused) {
        const bm = `block_means_${dtype}`;
        this.#launch('proxy.cu', bm, [Nb, Hkv], D, 0, [P(kt.ptr), P(km.ptr), I(n), I(Hkv), I(D), I(B), I(0)]);
      }
      for (const l of lists) {
        // this list's Q̄ rows start at its first slot
        const qml = qm.ptr + l.first * Nb * D * 4;
        const g = l.known === false ? Math.min(l.count, PE_SLOT_GRID) : l.count;
        // 128 threads (PE_QM_THREADS in pe.cu): 16-byte loads, row groups summed in order
        this.#launch('pe.cu', `pe_q_means_${dtype}`, [Nb, g], 128, 0, [P(qt.ptr), P(l.ptr), P(qml), I(n), I(H), I(D), I(B)]);
        parts.push(this.#peChunk(qml, km.ptr, l.ptr, l.count, l.known !== false, H, Hkv, Nb, D, scale, gamma));
      }
      return parts;
    } catch (e) {
      for (const r of parts) this.releaseBlocks([r.rowPtrD, r.cols]);
      throw e;
    } finally {
      this.releaseBlocks(reused ? [qm] : [qm, km]);
    }
  }

  /**
   * One list's PE kernels: `nc` head slots (grids sized for them; slots past the device
   * list's count leave at once), `known`: nc is the list's count (the host uploaded it), so
   * the radix pass's CTAs a head can be sized here rather than from the slots.
   */
  #peChunk(
    qm: number,
    km: number,
    hl: number,
    nc: number,
    known: boolean,
    H: number,
    Hkv: number,
    Nb: number,
    D: number,
    scale: number,
    gamma: number,
  ): PePart {
    const pm = this.#scratch(nc * Nb * Nb * 4);
    // the per-row kernels' slots (pe.cu loops over the count)
    const g = known ? nc : Math.min(nc, PE_SLOT_GRID);
    // [cnt nc·256][tickets nc][prefixes nc] u32
    const cnt = this.#scratch(nc * 258 * 4);
    const sum = this.#scratch(nc * 256 * 8);
    const state = this.#scratch(nc * 8 * 8);
    const strict = this.#scratch(nc * Nb * 4);
    const eq = this.#scratch(nc * Nb * 4);
    const eqStart = this.#scratch(nc * (Nb + 1) * 4);
    const kept = this.#scratch(nc * Nb * 4);
    const rowPtrD = this.#scratch((nc * Nb + 1) * 4);
    const blocks = [pm, cnt, sum, state, strict, eq, eqStart, kept, rowPtrD];
    try {
      const tiles = Math.ceil(Nb / 64);
      // both operands staged whole: 2 x D rows of 68 floats (PE_LG_PAD in pe.cu)
      this.#launch('pe.cu', 'pe_logits', [tiles, tiles, g], 256, 2 * D * 68 * 4, [
        P(qm),
        P(km),
        P(hl),
        P(pm.ptr),
        I(H),
        I(Hkv),
        I(Nb),
        I(D),
        F(scale),
      ]);
      // cnt, the tickets and the prefixes, and the sums, zeroed by pe_softmax's first CTA
      // once: each radix pass's last CTA of a head zeroes that head's cnt, sum and ticket for
      // the next pass (pe_radix_pass)
      this.#launch('pe.cu', 'pe_softmax', [Nb, g], 256, 0, [P(pm.ptr), I(Nb), P(hl), P(cnt.ptr), I(nc * 258), P(sum.ptr), I(nc * 512)]);
      // pe_radix_pass: 512 threads and 96 KiB of shared memory a CTA, two CTAs an SM; the
      // heads' CTAs together fill the SMs once (each does an equal share of its head's
      // triangle), fewer for small maps (about PE_RADIX_ENTRIES / 2 entries a CTA at least). With the count
      // only on the device, the grid has room for one head's share and the kernel divides
      // the budget by the count.
      const budget = 2 * this.info.multiprocessors;
      const histCtas = Math.max(1, Math.min(known ? Math.floor(budget / nc) : budget, Math.ceil((Nb * Nb) / PE_RADIX_ENTRIES)));
      const done = cnt.ptr + nc * 256 * 4;
      const prefix = done + nc * 4;
      for (let pass = 0; pass < 4; pass++) {
        this.#launch('pe.cu', 'pe_radix_pass', [histCtas, nc], 512, 96 * 1024, [
          P(pm.ptr),
          I(Nb),
          I(pass),
          P(prefix),
          P(cnt.ptr),
          P(sum.ptr),
          P(state.ptr),
          P(done),
          D64(gamma),
          P(hl),
          I(budget),
        ]);
      }
      this.#launch('pe.cu', 'pe_row_counts', [Nb, g], 256, 0, [P(pm.ptr), I(Nb), P(state.ptr), P(strict.ptr), P(eq.ptr), P(hl)]);
      this.#launch('pe.cu', 'pe_row_kept', [nc], 1024, 0, [
        P(strict.ptr),
        P(eq.ptr),
        P(eqStart.ptr),
        P(kept.ptr),
        P(state.ptr),
        I(Nb),
        P(hl),
      ]);
      this.#scan(kept.ptr, rowPtrD.ptr, nc * Nb, blocks);
      // room for every causal block of the chunk's heads: the kept count stays on the device
      // (reading it here would drain the stream between the PE kernels and the mask's)
      const colsD = this.#scratch(((nc * Nb * (Nb + 1)) / 2) * 4);
      this.#launch('pe.cu', 'pe_write', [Nb, g], 32, 0, [
        P(pm.ptr),
        I(Nb),
        P(state.ptr),
        P(eqStart.ptr),
        P(rowPtrD.ptr),
        P(colsD.ptr),
        P(hl),
      ]);
      blocks.splice(blocks.indexOf(rowPtrD), 1);
      return { rowPtrD, cols: colsD, rows: nc * Nb };
    } finally {
      for (const x of blocks) this.#pool.release(x);
    }
  }

  // ---- masks ------------------------------------------------------------------------

  /** Expand a validated mask on the device; the caller releases the blocks. */
  #expandOnDevice(mask: BlockMask): { rowPtr: DeviceBlock; cols: DeviceBlock; total: number; temp: DeviceBlock[] } {
    const temp: DeviceBlock[] = [];
    try {
      const rows = mask.rows
        ? { rowPtr: this.#uploadTemp(mask.rows.rowPtr, temp), cols: this.#uploadTemp(mask.rows.cols, temp) }
        : undefined;
      return { ...this.#expand(mask.heads, mask.numBlocks, mask.vs, rows, temp), temp };
    } catch (e) {
      this.releaseBlocks(temp);
      throw e;
    }
  }

  #uploadTemp(a: Int32Array | Float64Array, temp: DeviceBlock[]): number {
    const b = this.#uploadArray(a);
    temp.push(b);
    return b.ptr;
  }

  /**
   * Exclusive scan of N ints on the device: out[0..N) and out[N] = the total. Tiles of 4096
   * (exclusive_scan_sums, then exclusive_scan_tiles; one tile needs no sums). The tile-sum
   * scratch goes to `temp` for the caller to release.
   */
  #scan(inPtr: number, outPtr: number, N: number, temp: DeviceBlock[], summary?: { ptr: number; Nb: number; bad: number }): void {
    const tiles = Math.max(1, Math.ceil(N / 4096));
    const sums = this.#scratch(tiles * 4);
    temp.push(sums);
    if (tiles > 1) this.#launch('mask.cu', 'exclusive_scan_sums', [tiles], 256, 0, [P(inPtr), P(sums.ptr), I(N)]);
    this.#launch('mask.cu', 'exclusive_scan_tiles', [tiles], 256, 0, [
      P(inPtr),
      P(sums.ptr),
      P(outPtr),
      I(N),
      P(summary?.ptr ?? 0),
      I(summary?.Nb ?? 1),
      P(summary?.bad ?? 0),
    ]);
  }

  /**
   * VS selection on the device (kernels/select.cu) for a DeviceVsRequest: the block scores
   * of the statistics proxyStats last returned are still on the device (other statistics
   * are uploaded). Queues vs_select and vs_pack; returns the lists' device pointers
   * [verticalPtr, vertical, slashPtr, slash] and `read()`, which copies them to the host on
   * the copy stream once the kernels are known to be done. `prefix` (a device plan): that
   * many bytes (a multiple of 8) before the list pointers in the same buffer, handed to
   * `prefix.fill`, which queues what writes them before vs_select and returns where in them
   * the routes are ([H] int, 1 = VS: route.cu's; req.routes is then not read); they come
   * back with the pointers, in one copy.
   */
  #selectOnDevice(
    req: Omit<DeviceVsRequest, 'routes'> & { readonly routes?: readonly Route[] },
    H: number,
    Nb: number,
    B: number,
    temp: DeviceBlock[],
    prefix?: { readonly bytes: number; readonly fill: (ptr: number) => number },
  ): DeviceVsSelection {
    const { rule, stats, routes, peK } = req;
    if (rule?.kind !== 'noiseFloor') {
      throw new UnsupportedError(`device selection supports the noiseFloor rule; got ${rule?.kind}`, { limit: 'deviceSelector' });
    }
    if (!(Number.isFinite(rule.alpha) && rule.alpha > 0)) throw new InvalidArgumentError(`noiseFloor alpha must be finite and > 0; got ${rule.alpha}`);
    if (!(Number.isInteger(rule.kMin) && rule.kMin >= 1 && rule.kMin % B === 0)) {
      throw new InvalidArgumentError(`noiseFloor kMin must be a positive multiple of the block size ${B}; got ${rule.kMin}`);
    }
    if (!(Number.isInteger(peK) && peK >= 0)) throw new InvalidArgumentError(`peK must be a non-negative integer; got ${peK}`);
    if (!stats || stats.heads !== H || stats.numBlocks !== Nb || stats.blockSize !== B) {
      throw new InvalidArgumentError(`device selection: the statistics are for H=${stats?.heads}, Nb=${stats?.numBlocks}, B=${stats?.blockSize}; the mask for H=${H}, Nb=${Nb}, B=${B}`);
    }
    if (!prefix && (!routes || routes.length !== H || routes.some((r) => r !== 'vs' && r !== 'pe'))) {
      throw new InvalidArgumentError(`device selection needs ${H} routes ('vs' or 'pe')`);
    }
    const HNb = H * Nb;
    let pv: number;
    let ps: number;
    const kept = this.#keptStats(stats);
    if (kept) {
      pv = kept.block.ptr + 8 + 2 * H * 8; // after the non-finite count, C_struct and the entropies
      ps = pv + HNb * 8;
    } else {
      const both = new Float64Array(2 * HNb);
      both.set(stats.verticalBlocks.subarray(0, HNb));
      both.set(stats.slashBlocks.subarray(0, HNb), HNb);
      pv = this.#uploadTemp(both, temp);
      ps = pv + HNb * 8;
    }
    const lists = this.#scratch(2 * HNb * 4);
    const counts = this.#scratch(2 * H * 4);
    const pb = prefix?.bytes ?? 0;
    const buf = this.#scratch(pb + (2 * (H + 1) + 2 * HNb) * 4);
    temp.push(lists, counts, buf);
    const rt = prefix ? prefix.fill(buf.ptr) : this.#uploadTemp(Int32Array.from(routes ?? [], (r) => (r === 'vs' ? 1 : 0)), temp);
    this.#launch('select.cu', 'vs_select', [2, H], 256, Math.ceil(Nb / 32) * 4, [
      P(pv),
      P(ps),
      P(rt),
      I(H),
      I(Nb),
      D64(rule.alpha),
      I(rule.kMin / B),
      I(peK),
      P(lists.ptr),
      P(counts.ptr),
    ]);
    const vPtr = buf.ptr + pb;
    this.#launch('select.cu', 'vs_pack', [2, H], 256, 0, [P(lists.ptr), P(counts.ptr), I(H), I(Nb), P(vPtr)]);
    const sPtr = vPtr + (H + 1) * 4;
    const vert = vPtr + 2 * (H + 1) * 4;
    const slash = vert + HNb * 4;
    // the prefix and the list pointers in one copy; the lists when asked (buf must live)
    // `after`: an event behind the lists' kernels, for a caller that has not waited for them
    const read = (after?: unknown) => {
      const head = this.#readOnCopyStream(buf.ptr, new Int32Array(pb / 4 + 2 * (H + 1)), after);
      const ptrs = head.subarray(pb / 4);
      const verticalPtr = ptrs.slice(0, H + 1);
      const slashPtr = ptrs.slice(H + 1);
      // the copy stream already waited for `after`
      const lists = (): VsLists => ({
        verticalPtr,
        vertical: this.#readOnCopyStream(vert, new Int32Array(verticalPtr[H])),
        slashPtr,
        slash: this.#readOnCopyStream(slash, new Int32Array(slashPtr[H])),
      });
      return { lists, prefix: head.buffer.slice(0, pb) };
    };
    return { ptrs: [vPtr, vert, sPtr, slash], buf, read };
  }

  /**
   * VS lists (host) ∪ block rows (device) -> sorted rows on the device. The rows are either
   * all heads' (`rows.rowPtr` [H·Nb + 1]) or a subset's (`rows.heads`, or `rows.headList`
   * already on the device as [count][heads]: rowPtr [heads·Nb + 1]; expand_count and
   * expand_write find each head's slot in the list, the other heads' rows are empty). Row
   * entries are checked while counting (a MaskError names the first bad row). One upload (the
   * VS lists, the bad-row flag, the heads) and one read (each head's first row pointer, the
   * total and the flag): at 512k every synchronising copy costs a round trip, and the uploads
   * wait for the stream. `unread`: nothing read (ExpandUnreadAt).
   * Scratch goes to `temp`; the caller releases it and the returned blocks. `headPtr` [H + 1]:
   * head h's blocks are headPtr[h + 1] − headPtr[h].
   */
  #expand(H: number, Nb: number, vsIn: ExpandVs, rows: ExpandRows, temp: DeviceBlock[]): ExpandRead;
  #expand(H: number, Nb: number, vsIn: ExpandVs, rows: ExpandRows, temp: DeviceBlock[], unread: ExpandUnreadAt): ExpandUnread;
  #expand(H: number, Nb: number, vsIn: ExpandVs, rows: ExpandRows, temp: DeviceBlock[], unread?: ExpandUnreadAt): ExpandRead | ExpandUnread {
    const only = unread?.only;
    const n = H * Nb;
    // [bad][verticalPtr H+1][vertical][slashPtr H+1][slash][count][heads] (VS lists already
    // on the device: their pointers)
    const vsDevice = vsIn && 'device' in vsIn ? vsIn.device : undefined;
    const vs = vsIn && !('device' in vsIn) ? vsIn : undefined;
    const nh = rows?.heads?.length ?? 0;
    const parts = vs ? [vs.verticalPtr, vs.vertical, vs.slashPtr, vs.slash] : [];
    const len = 1 + parts.reduce((a, x) => a + x.length, 0) + (rows?.heads ? 1 + nh : 0);
    const packed = new Int32Array(len);
    packed[0] = NO_BAD_ROW;
    const offs: number[] = [];
    let o = 1;
    for (const x of parts) {
      offs.push(o);
      packed.set(x, o);
      o += x.length;
    }
    const headsOff = o;
    if (rows?.heads) {
      packed[o] = nh;
      packed.set(rows.heads, o + 1);
    }
    let up: number;
    if (len === 1) {
      // only the bad-row flag (VS lists and head list on the device): set it on the stream
      // rather than a blocking upload
      const flag = this.#scratch(4);
      temp.push(flag);
      check(this.#libs, this.#libs.cu.cuMemsetD32Async(flag.ptr, NO_BAD_ROW, 1, this.#cur), 'cuMemsetD32Async');
      up = flag.ptr;
    } else {
      up = this.#uploadTemp(packed, temp);
    }
    const at = (off: number) => up + off * 4;
    const [vPtr, vert, sPtr, slash] = vsDevice ?? (vs ? offs.map(at) : [0, 0, 0, 0]);
    const bad = up;
    const rPtr = rows ? rows.rowPtr : 0;
    const rCols = rows ? rows.cols : 0;
    // a subset's rows: expand_count and expand_write find each head's slot in the head list
    const hl = rows?.heads || rows?.headList !== undefined ? (rows.headList ?? at(headsOff)) : 0;
    const counts = this.#scratch(n * 4);
    temp.push(counts);
    // a warp per row, 4 rows a 128-thread block, each warp a bitmap of the row's Nb bits
    const words = Math.ceil(Nb / 32);
    // the union's parts, as expand_count and expand_write take them
    const union = [P(vPtr), P(vert), P(sPtr), P(slash), P(rPtr), P(rCols), P(hl), P(only?.routes ?? 0), I(only?.want ?? 0)];
    this.#launch('mask.cu', 'expand_count', [Math.ceil(n / 4)], 128, 4 * words * 4, [...union, P(counts.ptr), I(H), I(Nb), P(bad)]);
    const rowPtr = this.#scratch((n + 1) * 4);
    try {
      let sumPtr = unread?.summary;
      if (sumPtr === undefined) {
        const sum = this.#scratch((H + 2) * 4);
        temp.push(sum);
        sumPtr = sum.ptr;
      }
      // the row pointers, and the summary (each head's first row pointer, the total, the
      // bad-row flag) written by the scan's last launch
      this.#scan(counts.ptr, rowPtr.ptr, n, temp, { ptr: sumPtr, Nb, bad });
      // the rows' entries into room for `entries` ints
      const write = (entries: number): DeviceBlock => {
        const cols = this.#scratch(entries * 4);
        const args = [...union, P(rowPtr.ptr), P(cols.ptr), I(H), I(Nb), P(bad)];
        this.#launch('mask.cu', 'expand_write', [Math.ceil(n / 4)], 128, 4 * words * 4, args);
        return cols;
      };
      if (unread) {
        // nothing read: room for every causal block (a valid row holds at most I + 1, a bad
        // one is counted 0, and expand_write leaves at once once a row was flagged bad)
        return { rowPtr, cols: write(unread.room ?? (H * Nb * (Nb + 1)) / 2), summary: unread.summary };
      }
      const summary = this.#read(sumPtr, new Int32Array(H + 2));
      const badRow = summary[H + 1];
      if (badRow !== NO_BAD_ROW) {
        const h = Math.floor(badRow / Nb);
        const r = badRow % Nb;
        throw new MaskError(
          `head ${h} row ${r}: block rows must be strictly increasing key blocks in [0, ${r}] (causal); this row is not (checked on the device)`,
        );
      }
      const tot = summary[H];
      return { rowPtr, cols: write(tot), total: tot, headPtr: summary.subarray(0, H + 1) };
    } catch (e) {
      this.releaseBlock(rowPtr);
      throw e;
    }
  }

  /**
   * The plan's mask building on the device: PE rows for the requested heads (kept on the
   * device), merged with the VS lists and expanded to rows, each head's blocks counted from
   * the expanded rowPtr. The PE rows come to the host only when `peRows()` is called, on a
   * second stream, so inside sparsePrefill that copy overlaps the attention kernel.
   */
  async prepareMask(req: PrepareMaskRequest): Promise<PreparedMaskResult> {
    this.#alive();
    this.#traceHost('prepareMask()');
    const { heads: H, numBlocks: Nb, blockSize: B } = req ?? ({} as PrepareMaskRequest);
    assertBlockSize(B, this.capabilities.blockSizes);
    if (!req.vs) throw new InvalidArgumentError('prepareMask needs the VS lists (empty lists for heads without any)');
    const device = 'device' in req.vs ? req.vs.device : undefined;
    // A vs function runs once the PE kernels are queued (host selection overlaps them);
    // plain lists are checked before any device work; a device request is checked here and
    // selected on the device before the PE kernels (vs_select: tens of microseconds).
    let vs: VsLists | undefined;
    const selectVs = (): VsLists => {
      if (vs) return vs;
      const lists = typeof req.vs === 'function' ? req.vs() : (req.vs as VsLists);
      if (!lists) throw new InvalidArgumentError('prepareMask: vs() returned no VS lists (empty lists for heads without any)');
      validateMask({ heads: H, numBlocks: Nb, blockSize: B, vs: lists });
      vs = lists;
      return lists;
    };
    if (!device && typeof req.vs !== 'function') selectVs();
    const temp: DeviceBlock[] = [];
    const held: DeviceBlock[] = [];
    try {
      const vsDev = device ? this.#selectOnDevice(device, H, Nb, B, temp) : undefined;
      // the PE heads' rows on the device (one part), or joined on the host (several)
      let pePart: PePart | undefined;
      let peHost: BlockRows | undefined;
      // the PE heads' rows, spread to all heads on the device (the host-joined case uploads them)
      let rows: { rowPtr: number; cols: number; heads?: readonly number[] } | undefined;
      if (req.pe) {
        const r = this.#peRequest(req.pe.q, req.pe.k, req.pe.opts);
        if (r.shape.heads !== H || r.Nb !== Nb || r.B !== B) {
          throw new InvalidArgumentError(
            `prepareMask: the PE request is for H=${r.shape.heads}, Nb=${r.Nb}, B=${r.B}; the mask for H=${H}, Nb=${Nb}, B=${B}`,
          );
        }
        if (r.heads.length > 0) {
          const parts = this.#peOnDevice(r, vsDev ? undefined : selectVs);
          if (parts.length === 1) {
            // held until peRows() reads them (or the prepared mask is released)
            held.push(parts[0].rowPtrD, parts[0].cols);
            pePart = parts[0];
            rows = { rowPtr: parts[0].rowPtrD.ptr, cols: parts[0].cols.ptr, heads: r.heads };
          } else {
            // pooled maps over 4 GiB (beyond Llama shapes at 512k): join on the host
            for (const x of parts) temp.push(x.rowPtrD, x.cols);
            peHost = this.#peRowsToHost(parts);
            rows = {
              rowPtr: this.#uploadTemp(spreadRowPtr(peHost.rowPtr, r.heads, H, Nb), temp),
              cols: this.#uploadTemp(peHost.cols, temp),
            };
          }
        }
      }
      this.#traceHost('prepareMask: PE queued');
      const e = this.#expand(H, Nb, vsDev ? { device: vsDev.ptrs } : selectVs(), rows, temp);
      held.push(e.rowPtr, e.cols);
      // the device's lists to the host, on the copy stream (vs_pack finished before #expand's
      // read; expand_write may still run)
      if (vsDev) vs = vsDev.read().lists();
      return { ...this.#preparedResult(H, Nb, B, e, held, pePart, peHost), ...(device ? { vs } : {}) };
    } catch (e) {
      this.releaseBlocks(held);
      throw e;
    } finally {
      this.releaseBlocks(temp);
    }
  }

  /**
   * The prepared mask over expanded rows `e` (each head's blocks from its row pointers), owning
   * `held` (emptied: the mask releases them), and peRows() for the PE rows on the device
   * (`pePart`, its kernels finished before #expand's read) or already on the host.
   */
  #preparedResult(
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
    const prepared = new CudaPreparedMask(this, H, Nb, B, counts, e.rowPtr, e.cols, box);
    PREPARED_FINALIZER.register(prepared, { owner: this, held: box }, prepared);
    held.length = 0;
    if (!pePart && !peHost) return { prepared };
    return { prepared, peRows: this.#peRowsReader(prepared, pePart, peHost) };
  }

  /**
   * peRows() of a prepared mask: the PE rows already on the host (`peHost`), or its PE part's
   * device rows copied on the copy stream (their kernels finished before #expand's read, or,
   * `after`, a plan that read nothing back: the copy stream waits for the plan's end). The
   * device rows go back to the pool once copied (the expanded rows are what runs).
   */
  #peRowsReader(prepared: CudaPreparedMask, pePart: PePart | undefined, peHost: BlockRows | undefined, after?: unknown) {
    let taken = false;
    return async (): Promise<BlockRows> => {
      if (taken) throw new InvalidArgumentError('peRows() was already called for this prepared mask');
      if (prepared.released) throw new InvalidArgumentError('peRows() after the prepared mask was released');
      taken = true;
      if (peHost) return peHost;
      const part = pePart as PePart;
      const got = this.#pePartToHost(part, (ptr, out) => this.#readOnCopyStream(ptr, out, after));
      const box = prepared.held;
      for (const b of [part.rowPtrD, part.cols]) {
        const i = box.blocks.indexOf(b);
        if (i >= 0) this.releaseBlocks(box.blocks.splice(i, 1));
      }
      return got;
    };
  }

  /**
   * The plan after the statistics as device work (core's planOnDevice): routes (route.cu)
   * from the statistics' C_struct where proxyStats left it, VS selection (select.cu) on those
   * routes, then the rows expanded and counted (mask.cu), an event behind the last kernel.
   * Nothing is read here, so the caller queues the attention behind the plan; `read()` then
   * brings the routes, the PE count, the statistics' head values, expand's summary and the
   * list pointers back in one copy on the copy stream (waiting for that event only), and the
   * lists after them. Two streams (the statistics were the last work queued): the router on
   * the second one beside the statistics' sums, the VS heads' rows only here, and the PE
   * heads' kernels, rows and attention on the second stream beside the VS heads' attention
   * (#splitPe: queued by sparseAttention, or by a read). One stream: the PE kernels over a
   * head slot for every head (slots past the device's PE count leave at once) and every
   * head's rows. Pooled maps for every head over PE_PART_BYTES (beyond Llama shapes at
   * 512k): routed on the host from C_struct, then prepareMask (which reads as it goes).
   */
  async planOnDevice(req: DevicePlanRequest): Promise<DevicePlanResult> {
    this.#alive();
    this.#traceHost('planOnDevice()');
    const { stats, route, vs: rule, peK, pe } = req ?? ({} as DevicePlanRequest);
    if (route?.kind !== 'cStruct') {
      throw new UnsupportedError(`device routing supports the cStruct rule; got ${route?.kind}`, { limit: 'deviceRouter' });
    }
    if (!(typeof route.tauProxy === 'number' && Number.isFinite(route.tauProxy))) {
      throw new InvalidArgumentError(`cStruct tauProxy must be a finite number; got ${route.tauProxy}`);
    }
    if (!stats || !Number.isInteger(stats.heads) || !Number.isInteger(stats.numBlocks)) {
      throw new InvalidArgumentError('planOnDevice needs the statistics from proxyStats');
    }
    if (!pe?.q || !pe.k) throw new InvalidArgumentError('planOnDevice needs the PE inputs q and k');
    const { heads: H, numBlocks: Nb, blockSize: B } = stats;
    const r = this.#peRequest(pe.q, pe.k, { blockSize: B, gamma: pe.gamma, heads: [], scale: pe.scale });
    if (r.shape.heads !== H || r.Nb !== Nb || r.shape.keys !== stats.n) {
      throw new InvalidArgumentError(
        `planOnDevice: the statistics are for n=${stats.n}, H=${H}, Nb=${Nb}; q and k for n=${r.shape.keys}, H=${r.shape.heads}, Nb=${r.Nb}`,
      );
    }
    if (H * Nb * Nb * 4 > PE_PART_BYTES) {
      // routed on the host: no second stream, so the statistics' held scratch can go back now
      const entry = this.#keptStats(stats);
      if (entry) this.#releaseHeld(entry);
      const routes = Array.from(stats.cStruct, (c): Route => (c >= route.tauProxy ? 'vs' : 'pe'));
      const heads = routes.flatMap((x, h) => (x === 'pe' ? [h] : []));
      const res = await this.prepareMask({
        heads: H,
        numBlocks: Nb,
        blockSize: B,
        vs: { device: { rule, stats, routes, peK } },
        pe: heads.length > 0 ? { q: pe.q, k: pe.k, opts: { blockSize: B, gamma: pe.gamma, heads, scale: pe.scale } } : undefined,
      });
      const outcome = { routes, vs: res.vs as VsLists, ...(res.peRows ? { peRows: res.peRows } : {}) };
      return { prepared: res.prepared, read: () => outcome };
    }
    this.#assertFinite(r.qt, 'q');
    this.#assertFinite(r.kt, 'k');
    const temp: DeviceBlock[] = [];
    const held: DeviceBlock[] = [];
    // the statistics' head values [non-finite count][C_struct H][entropy H] where proxyStats
    // left them, else uploaded
    const kept = this.#keptStats(stats);
    try {
      const st = kept
        ? kept.block.ptr
        : this.#uploadTemp(Float64Array.from([0, ...stats.cStruct, ...stats.rowEntropy]), temp);
      // The second stream (fused statistics just queued, nothing launched on the main stream
      // since): the router waits only for C_struct there, and the main stream waits for the
      // routes before the VS selection. The PE heads then go to the second stream once the
      // attention of the VS heads is queued (sparseAttention; #splitPe).
      const side =
        kept?.cstructReady !== undefined && kept.launchesAtEnd === this.#mainLaunches && kept === this.#deviceStats.at(-1)
          ? this.#side()
          : undefined;
      // One buffer before the VS list pointers, read with them (devicePlanLayout)
      const { headBytes, sumOff, bytes } = devicePlanLayout(H);
      let rt = 0;
      const fill = (ptr: number) => {
        rt = ptr + headBytes;
        const args = [P(st), I(H), D64(route.tauProxy), P(ptr), P(rt)];
        const tail = kept?.tailDone !== undefined ? this.#tailStream : undefined;
        if (side) {
          check(this.#libs, this.#libs.cu.cuStreamWaitEvent(side, kept!.cstructReady, 0), 'cuStreamWaitEvent');
          this.#onStream(side, () => this.#launch('route.cu', 'route_cstruct', [1], 32, 0, [...args, I(1)]));
          this.#fence(side, this.#stream);
          // the head values' copy behind their kernels (count, entropies): on the third stream
          // when they are there, which the main stream joins at the plan's end (#releaseHeld).
          // (The buffer is new, but nothing released since proxyStats' fence can be in it: the
          // statistics hold their scratch until then, and the plan releases nothing before.)
          if (tail) {
            this.#onStream(tail, () => this.#launch('route.cu', 'route_cstruct', [1], 32, 0, [...args, I(2)]));
            // (kept held an event already, so it is in #statsHolding: #releaseRetained joins this one)
            kept!.tailDone = this.#recordIn(this.#tailEvents, tail);
          } else {
            this.#launch('route.cu', 'route_cstruct', [1], 32, 0, [...args, I(2)]);
          }
        } else {
          if (kept) this.#joinTail(kept);
          this.#launch('route.cu', 'route_cstruct', [1], 32, 0, [...args, I(3)]);
        }
        return rt;
      };
      let vsDev: DeviceVsSelection;
      try {
        vsDev = this.#selectOnDevice({ rule, stats, peK }, H, Nb, B, temp, { bytes, fill });
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
      const part = side ? undefined : this.#peParts(r, H, [{ ptr: hl, count: H, first: 0, known: false }])[0];
      if (part) held.push(part.rowPtrD, part.cols);
      const e = part
        ? this.#expand(H, Nb, { device: vsDev.ptrs }, { rowPtr: part.rowPtrD.ptr, cols: part.cols.ptr, headList: hl }, temp, { summary: summaryAt })
        : // two streams: the VS heads now (the PE heads' rows empty), the PE heads in #splitPe
          this.#expand(H, Nb, { device: vsDev.ptrs }, undefined, temp, { summary: summaryAt, only: { routes: rt, want: 1 } });
      held.push(e.rowPtr, e.cols);
      // The main stream waits for the second stream's router already, and what runs there
      // later waits for the end of this plan (#splitPe); it now also waits for the third
      // stream's head values (#joinTail): the statistics' scratch can go back, and the plan's
      // one copy (behind `done`) holds the head values. Not before the VS heads' rows: the
      // third stream's kernels run beside the selection.
      if (kept) this.#releaseHeld(kept);
      this.#traceHost('planOnDevice: queued');
      const done = this.#recordDone();
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
      const res = this.#preparedResult(H, Nb, B, { ...e, headPtr: counts }, held, undefined);
      if (side) {
        res.prepared.split = this.#splitPe(side, r, H, Nb, res.prepared, {
          routes: rt,
          list: hl,
          vs: vsDev.ptrs,
          done,
          nPe: () => fetch().nPe,
        });
      }
      let outcome: DevicePlanOutcome | undefined;
      const read = (): DevicePlanOutcome => {
        if (outcome) return outcome;
        const { routes, lists, nPe } = fetch();
        const peRows = (() => {
          if (nPe === 0) return undefined;
          if (part) return this.#peRowsReader(res.prepared, { rowPtrD: part.rowPtrD, cols: part.cols, rows: nPe * Nb }, undefined, done);
          const q = res.prepared.split?.queue().rows;
          return q ? this.#peRowsReader(res.prepared, q.part, undefined, q.done) : undefined;
        })();
        outcome = { routes, vs: lists(), ...(peRows ? { peRows } : {}) };
        return outcome;
      };
      return { prepared: res.prepared, read };
    } catch (e) {
      // (the statistics' scratch too, once the main stream is behind the third stream)
      if (kept) this.#releaseHeld(kept);
      this.releaseBlocks(held);
      throw e;
    } finally {
      this.releaseBlocks(temp);
    }
  }

  /**
   * A device plan's PE heads on the second stream, queued once when first needed: by
   * sparseAttention right after it has launched the VS heads' attention (so the PE kernels,
   * their rows' expansion and their attention run beside it instead of before it), or by a
   * read of the plan. Needs the PE count on the host (the plan's one copy, which waits for the
   * VS heads' expansion: by then the attention is queued behind it). The second stream first
   * waits for the plan's end (`done`: the VS lists, and every statistics kernel that read
   * scratch the pool may hand out again); the main stream then waits for the PE rows.
   */
  #splitPe(
    side: Handle,
    r: PeRequest,
    H: number,
    Nb: number,
    prepared: CudaPreparedMask,
    at: { readonly routes: number; readonly list: number; readonly vs: readonly [number, number, number, number]; readonly done: unknown; readonly nPe: () => number },
  ): SplitPlan {
    let queued: SplitQueued | undefined;
    let headPtr: Int32Array | undefined;
    const queue = (): SplitQueued => {
      if (queued) return queued;
      if (prepared.released) throw new InvalidArgumentError("the device plan's PE heads were asked for after its prepared mask was released");
      const count = at.nPe();
      if (count === 0) {
        queued = { count };
        return queued;
      }
      const temp: DeviceBlock[] = [];
      try {
        const summary = this.#scratch((H + 2) * 4);
        prepared.held.blocks.push(summary);
        const rows = this.#onStream(side, (): SplitRows => {
          check(this.#libs, this.#libs.cu.cuStreamWaitEvent(side, at.done, 0), 'cuStreamWaitEvent');
          const part = this.#peParts(r, count, [{ ptr: at.list, count, first: 0 }])[0];
          prepared.held.blocks.push(part.rowPtrD, part.cols);
          const rows = { rowPtr: part.rowPtrD.ptr, cols: part.cols.ptr, headList: at.list };
          const e = this.#expand(H, Nb, { device: at.vs }, rows, temp, {
            summary: summary.ptr,
            only: { routes: at.routes, want: 0 },
            room: (count * Nb * (Nb + 1)) / 2,
          });
          prepared.held.blocks.push(e.rowPtr, e.cols);
          // a ring of the second stream's own: a later record there is later on that stream
          const done = this.#recordIn(this.#peEvents, side);
          return { part, rowPtr: e.rowPtr.ptr, cols: e.cols.ptr, summary: summary.ptr, done };
        });
        queued = { count, rows };
        // the main stream behind the PE rows before the pool hands their scratch out again
        check(this.#libs, this.#libs.cu.cuStreamWaitEvent(this.#stream, rows.done, 0), 'cuStreamWaitEvent');
      } finally {
        this.releaseBlocks(temp);
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
          const summary = this.#readOnCopyStream(q.summary, new Int32Array(H + 2), q.done);
          assertGoodRows(summary, H, Nb);
          headPtr = summary.subarray(0, H + 1);
        }
        return headPtr;
      },
    };
  }

  /** A CUDA event (flags: 0 timing, 2 CU_EVENT_DISABLE_TIMING). */
  #newEvent(flags: number): unknown {
    const e = [null];
    check(this.#libs, this.#libs.cu.cuEventCreate(e, flags), 'cuEventCreate');
    return e[0];
  }

  /** An event recorded on the main stream behind the work queued so far (no timing; reused in turn). */
  #recordDone(): unknown {
    return this.#recordIn(this.#doneEvents, this.#stream);
  }

  /**
   * The ring's next event (DONE_EVENTS of them, CU_EVENT_DISABLE_TIMING: fences, cheaper to
   * record and wait for; made at once on first use) recorded on `stream`.
   */
  #recordIn(ring: EventRing, stream: Handle): unknown {
    while (ring.events.length < DONE_EVENTS) ring.events.push(this.#newEvent(2));
    const ev = ring.events[ring.next++ % DONE_EVENTS];
    check(this.#libs, this.#libs.cu.cuEventRecord(ev, stream), 'cuEventRecord');
    return ev;
  }

  /**
   * planOnDevice's second stream (flags 0, like the main one), made on first use, at the
   * context's greatest priority: its PE kernels and the PE heads' attention run beside the VS
   * heads' attention, and the block scheduler gives the SMs that attention frees to pending
   * CTAs of higher-priority streams first (at equal priority the PE chain could wait behind
   * the whole attention grid).
   */
  #side(): Handle {
    if (!this.#sideStream) {
      const least = [0];
      const greatest = [0];
      check(this.#libs, this.#libs.cu.cuCtxGetStreamPriorityRange(least, greatest), 'cuCtxGetStreamPriorityRange');
      const s = [null];
      check(this.#libs, this.#libs.cu.cuStreamCreateWithPriority(s, 0, greatest[0]), 'cuStreamCreateWithPriority');
      this.#sideStream = s[0];
    }
    return this.#sideStream;
  }

  /** The third stream (#tailStream; flags 0 as the main one, default priority), made on first use. */
  #tail(): Handle {
    if (!this.#tailStream) {
      const s = [null];
      check(this.#libs, this.#libs.cu.cuStreamCreate(s, 0), 'cuStreamCreate');
      this.#tailStream = s[0];
    }
    return this.#tailStream;
  }

  /**
   * A fence on `from` behind the work queued there so far (no timing; a ring of its own, so
   * it never re-records a #recordDone event that a later read still waits for); `to`, when
   * given, waits for it.
   */
  #fence(from: Handle, to?: Handle): unknown {
    const ev = this.#recordIn(this.#sideEvents, from);
    if (to !== undefined) check(this.#libs, this.#libs.cu.cuStreamWaitEvent(to, ev, 0), 'cuStreamWaitEvent');
    return ev;
  }

  /** Runs `fn` with #launch (and the uploads and memsets of the PE path) on `stream`. */
  #onStream<T>(stream: Handle, fn: () => T): T {
    const prev = this.#cur;
    this.#cur = stream;
    try {
      return fn();
    } finally {
      this.#cur = prev;
    }
  }

  /**
   * A point on the device timeline behind the work queued so far (a timing event; 64 in
   * turn, so a mark is good for the next 64). msSince needs both marks reached (synchronize).
   */
  mark(): DeviceMark {
    this.#alive();
    // the ring's events made at once, on the first mark (not one per mark in the first
    // prefills a benchmark times)
    while (this.#marks.length < MARK_EVENTS) this.#marks.push({ ev: this.#newEvent(0), gen: 0 });
    const i = this.#markNext++ % MARK_EVENTS;
    const slot = this.#marks[i];
    const gen = this.#markNext;
    slot.gen = gen;
    check(this.#libs, this.#libs.cu.cuEventRecord(slot.ev, this.#stream), 'cuEventRecord');
    // a plain object whose fields say where it was recorded (no closure, no WeakMap entry: the
    // first mark of a prefill runs on the host path to the first launch: NOTES, session 16)
    return new CudaMark(this, slot, gen);
  }

  static {
    markElapsed = (be, later, earlier) => be.#markElapsed(later, earlier);
  }

  /** CudaMark.msSince: `later` minus `earlier` on the device timeline. */
  #markElapsed(later: CudaMark, earlier: DeviceMark): number {
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

  /**
   * Device-to-host copy on the copy stream: it does not wait for kernels queued on the main
   * stream, so it overlaps them. Callers read data whose producers have finished (a plan step
   * that ended in a synchronous read) or pass `after`, an event recorded on the main stream
   * behind the producers. Returns when the copy is done (pageable memory).
   */
  #readOnCopyStream<T extends Int32Array | Float64Array>(ptr: number, out: T, after?: unknown): T {
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
    const t = this.#trace ? performance.now() : 0;
    check(this.#libs, cu.cuMemcpyDtoHAsync(out, ptr, out.byteLength, this.#copyStream), 'cuMemcpyDtoHAsync');
    check(this.#libs, cu.cuStreamSynchronize(this.#copyStream), 'cuStreamSynchronize');
    if (this.#trace) this.#traceWait(`copy-stream read ${out.byteLength} B`, t);
    return out;
  }

  async expandMask(mask: BlockMask): Promise<BlockRows> {
    this.#alive();
    // Row entries are checked on the device while expanding (expand_count).
    validateMask(mask, undefined, { rowEntries: false });
    assertBlockSize(mask.blockSize, this.capabilities.blockSizes);
    const e = this.#expandOnDevice(mask);
    try {
      const rows = mask.heads * mask.numBlocks;
      return {
        rowPtr: this.#read(e.rowPtr.ptr, new Int32Array(rows + 1)),
        cols: this.#read(e.cols.ptr, new Int32Array(e.total)),
      };
    } finally {
      for (const x of [...e.temp, e.rowPtr, e.cols]) this.#pool.release(x);
    }
  }

  // ---- attention --------------------------------------------------------------------

  #prepareAttention(q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, opts: AttentionOptions, B: number): Prepared {
    const shape = attentionShape(q, k, v);
    assertSupported(this.capabilities, shape, this.name);
    const qt = this.#tensor(q, 'q');
    const kt = this.#tensor(k, 'k');
    const vt = this.#tensor(v, 'v');
    this.#assertFinite(qt, 'q');
    this.#assertFinite(kt, 'k');
    this.#assertFinite(vt, 'v');
    const { queries: m, heads: H, headDim: D } = shape;
    const scale = opts.scale ?? defaultScale(D);
    if (!(scale > 0) || !Number.isFinite(scale)) throw new InvalidArgumentError(`scale must be positive; got ${scale}`);
    let out: CudaTensor;
    if (opts.out) {
      out = this.#tensor(opts.out, 'opts.out');
      out.markWritten();
      if (out.dtype !== shape.dtype || out.shape.length !== 3 || out.shape[0] !== m || out.shape[1] !== H || out.shape[2] !== D) {
        throw new ShapeError(
          `opts.out must be ${shape.dtype} [${m}, ${H}, ${D}]; got ${out.dtype} [${out.shape}]`,
        );
      }
    } else {
      out = this.allocate(shape.dtype, [m, H, D]) as CudaTensor;
    }
    const lse = opts.returnLse ? (this.allocate('f32', [H, m]) as CudaTensor) : undefined;
    return { shape, qt, kt, vt, out, lse, scale, Nb: numBlocks(shape.keys, B) };
  }

  /**
   * One attention launch over rows (rowPtr, cols; 0, 0: dense). `heads` (crisp-common.cuh's
   * cta_order): every head by default; `{ routes }` only the heads routed to VS there (the
   * others leave at once); `{ list, count }` the `count` heads of a device list [count][heads].
   */
  #runAttention(
    p: Prepared,
    B: number,
    rowPtr: number,
    cols: number,
    heads?: { readonly routes: number } | { readonly list: number; readonly count: number },
  ): AttentionResult {
    const { shape, qt, kt, vt, out, lse, scale, Nb } = p;
    const { keys: n, queries: m, heads: H, kvHeads: Hkv, headDim: D, dtype } = shape;
    if (Nb > 65535) throw new CrispError('LIMIT_EXCEEDED', `n = ${n} gives ${Nb} query blocks; at most 65535 per launch`);
    // Chunked prefill: only the query blocks holding positions n − m .. n − 1.
    const firstBlock = Math.floor((n - m) / B);
    const lay = ATTENTION_VARIANTS[this.attentionVariantFallback ? PORTABLE_ATTENTION_VARIANT : this.#variant];
    // Q (B rows) plus `stages` stages of K and V tiles; the wgmma layouts align their tiles
    // to 1024 bytes (the 128-byte swizzle's repeat) themselves, from up to 1 KB of slack; a
    // producer warpgroup's pipeline adds 4 mbarriers (8 bytes) a stage.
    const keyTile = lay.keyTile ?? B;
    const smem =
      B * D * 2 + 2 * lay.stages * keyTile * D * 2 + (lay.sm90a ? 1024 : 0) + (lay.producerThreads ? 32 * lay.stages : 0);
    const block = (B / lay.rowsPerWarp) * 32 + lay.producerThreads;
    const [gx, hsel, hmode] = !heads ? [H, 0, 0] : 'routes' in heads ? [H, heads.routes, 1] : [heads.count, heads.list, 2];
    this.#launch(lay.file, `${lay.prefix}${dtype}_d${D}_b${B}`, [gx, Nb - firstBlock], block, smem, [
      P(qt.ptr),
      P(kt.ptr),
      P(vt.ptr),
      P(out.ptr),
      P(lse ? lse.ptr : 0),
      P(rowPtr),
      P(cols),
      I(n),
      I(m),
      I(Nb),
      I(H),
      I(Hkv),
      F(scale * LOG2E),
      P(hsel),
      I(hmode),
    ]);
    // housekeeping while the kernel runs: old statistics to the host (#evictRetained)
    this.#evictRetained(1);
    return lse ? { output: out, lse } : { output: out };
  }

  async sparseAttention(
    q: DeviceTensor,
    k: DeviceTensor,
    v: DeviceTensor,
    mask: BlockMask,
    opts: AttentionOptions = {},
  ): Promise<AttentionResult> {
    this.#alive();
    const B = mask?.blockSize;
    assertBlockSize(B, this.capabilities.blockSizes);
    const shape = attentionShape(q, k, v);
    const expect = { heads: shape.heads, numBlocks: numBlocks(shape.keys, B), blockSize: B };
    const prepared = opts.prepared;
    if (prepared) {
      // A plan's mask, expanded on this device already (its PE rows may still be on their
      // way to the host, so the mask itself is not re-read here).
      if (!(prepared instanceof CudaPreparedMask) || prepared.owner !== this) {
        throw new InvalidArgumentError(`opts.prepared was made by ${prepared.backend}, not by this CUDA backend`);
      }
      if (prepared.released) throw new InvalidArgumentError('opts.prepared was released; run plan.mask instead (re-plan or drop opts.prepared)');
      if (prepared.heads !== expect.heads || prepared.numBlocks !== expect.numBlocks || prepared.blockSize !== B) {
        throw new MaskError(
          `opts.prepared covers H=${prepared.heads}, Nb=${prepared.numBlocks}, B=${prepared.blockSize}; the problem has H=${expect.heads}, Nb=${expect.numBlocks}, B=${B}`,
        );
      }
      if (mask.heads !== prepared.heads || mask.numBlocks !== prepared.numBlocks || mask.blockSize !== B) {
        throw new MaskError('opts.prepared does not describe this mask (heads, blocks or block size differ)');
      }
      const p = this.#prepareAttention(q, k, v, opts, B);
      const split = prepared.split;
      if (!split) return this.#runAttention(p, B, prepared.rowPtr.ptr, prepared.cols.ptr);
      // A device plan on two streams: the VS heads' attention first; then the PE heads'
      // kernels, rows and attention on the second stream, beside it (that attention also
      // waits for what the main stream had queued before this call: writes to out, say);
      // the main stream then waits for the second.
      try {
        const before = this.#fence(this.#stream);
        const res = this.#runAttention(p, B, prepared.rowPtr.ptr, prepared.cols.ptr, { routes: split.routes });
        const pe = split.queue();
        const rows = pe.rows;
        if (rows) {
          this.#onStream(split.side, () => {
            check(this.#libs, this.#libs.cu.cuStreamWaitEvent(split.side, before, 0), 'cuStreamWaitEvent');
            this.#runAttention(p, B, rows.rowPtr, rows.cols, { list: split.list, count: pe.count });
          });
          this.#fence(split.side, this.#stream);
        }
        return res;
      } catch (e) {
        // (a failed launch, a bad row in the plan, no memory for the PE rows): the output is
        // incomplete, and is not handed out
        if (!opts.out) p.out.dispose();
        p.lse?.dispose();
        throw e;
      }
    }
    // Pointers and VS lists on the host; the BSR entries (tens of millions at 512k) on the
    // device while expanding (expand_count), which raises the same MaskError.
    validateMask(mask, expect, { rowEntries: false });
    const p = this.#prepareAttention(q, k, v, opts, B);
    const temp: DeviceBlock[] = [];
    try {
      const e = this.#expandOnDevice(mask);
      temp.push(...e.temp, e.rowPtr, e.cols);
      return this.#runAttention(p, B, e.rowPtr.ptr, e.cols.ptr);
    } catch (e) {
      if (!opts.out) p.out.dispose();
      p.lse?.dispose();
      throw e;
    } finally {
      for (const x of temp) this.#pool.release(x);
    }
  }

  async denseAttention(q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, opts: AttentionOptions = {}): Promise<AttentionResult> {
    this.#alive();
    const B = 128;
    const p = this.#prepareAttention(q, k, v, opts, B);
    try {
      return this.#runAttention(p, B, 0, 0);
    } catch (e) {
      if (!opts.out) p.out.dispose();
      p.lse?.dispose();
      throw e;
    }
  }

  async synchronize(): Promise<void> {
    this.#alive();
    check(this.#libs, this.#libs.cu.cuStreamSynchronize(this.#stream), 'cuStreamSynchronize');
    // statistics' head values queued on the third stream with no plan after them to join it
    if (this.#tailStream) check(this.#libs, this.#libs.cu.cuStreamSynchronize(this.#tailStream), 'cuStreamSynchronize');
  }

  dispose(): void {
    if (this.#disposed) return;
    const cu = this.#libs.cu;
    cu.cuCtxSynchronize();
    this.#releaseRetained(true);
    this.#pool.trim();
    this.#disposed = true;
    for (const m of this.#modules.values()) cu.cuModuleUnload(m);
    this.#modules.clear();
    this.#functions.clear();
    for (const e of [...this.#doneEvents.events, ...this.#sideEvents.events, ...this.#peEvents.events, ...this.#tailEvents.events]) cu.cuEventDestroy(e);
    if (this.#sideStream) cu.cuStreamDestroy(this.#sideStream);
    if (this.#tailStream) cu.cuStreamDestroy(this.#tailStream);
    for (const m of this.#marks) cu.cuEventDestroy(m.ev);
    cu.cuStreamDestroy(this.#stream);
    if (this.#copyStream) cu.cuStreamDestroy(this.#copyStream);
    this.#libs.koffi.free(this.#argMem);
    if (this.#launchCfg) this.#libs.koffi.free(this.#launchCfg.mem);
    cu.cuDevicePrimaryCtxRelease(this.info.ordinal);
  }

  // ---- tools for benchmarks and tests (not part of Backend) -------------------------

  /** Fill a bf16/f16 tensor with crisp_hash values (the formula the PyTorch peer shares). */
  fillHash(t: DeviceTensor, seed: number, amplitude: number): void {
    const ct = this.#tensor(t, 'fill target');
    ct.markWritten();
    if (ct.dtype === 'f32') throw new UnsupportedError('fillHash fills bf16 or f16 tensors');
    this.#launch('bench.cu', `fill_hash_${ct.dtype}`, [4096], 256, 0, [
      P(ct.ptr),
      U64(numel(ct.shape)),
      I(seed >>> 0),
      F(amplitude),
    ]);
  }

  /** Fill q, k, v with the llama-like structured layer of kernels/bench.cu. */
  fillLlamaLike(q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, seed: number, slash0 = 1000, vEvery = 4096): void {
    const shape = attentionShape(q, k, v);
    const { keys: n, heads: H, kvHeads: Hkv, headDim: D, dtype } = shape;
    const tensors = [this.#tensor(q, 'q'), this.#tensor(k, 'k'), this.#tensor(v, 'v')];
    tensors.forEach((t, which) => {
      t.markWritten();
      this.#launch('bench.cu', `fill_llama_${dtype}`, [4096], 256, 0, [
        P(t.ptr),
        I(which),
        I(n),
        I(which === 0 ? H : Hkv),
        I(D),
        I(H),
        I(seed >>> 0),
        I(slash0),
        I(vEvery),
      ]);
    });
  }

  /**
   * Keep the device's main stream busy for `ms` milliseconds (one thread spinning on the global
   * timer). Queued before a timed call, it lets the host get ahead, so device marks around the
   * call measure the device's critical path without the host's launch time (a benchmark tool).
   */
  deviceSleep(ms: number): void {
    if (!(Number.isFinite(ms) && ms >= 0 && ms <= 1000)) throw new InvalidArgumentError(`deviceSleep takes 0..1000 ms; got ${ms}`);
    this.#launch('bench.cu', 'spin_ns', [1], 1, 0, [U64(Math.round(ms * 1e6))]);
  }

  /** Overwrite a tensor with NaN so unwritten outputs show. */
  poison(t: DeviceTensor): void {
    const ct = this.#tensor(t, 'poison target');
    ct.markWritten();
    const cu = this.#libs.cu;
    const n = numel(ct.shape);
    if (ct.dtype === 'f32') check(this.#libs, cu.cuMemsetD32Async(ct.ptr, 0x7fc00000, n, this.#stream), 'cuMemsetD32Async');
    else check(this.#libs, cu.cuMemsetD16Async(ct.ptr, ct.dtype === 'bf16' ? 0x7fc0 : 0x7e00, n, this.#stream), 'cuMemsetD16Async');
  }

  /** ‖a − b‖ / ‖b‖ in f64 over two same-shape bf16/f16 tensors, and a's non-finite count. */
  relError(a: DeviceTensor, b: DeviceTensor): { relErr: number; nonFinite: number; refNorm: number } {
    const at = this.#tensor(a, 'a');
    const bt = this.#tensor(b, 'b');
    if (at.dtype !== bt.dtype || numel(at.shape) !== numel(bt.shape) || at.dtype === 'f32') {
      throw new InvalidArgumentError('relError compares two bf16 or f16 tensors of one shape');
    }
    const grid = 1024;
    const part = this.#scratch(grid * 3 * 8);
    try {
      this.#launch('bench.cu', `rel_err_${at.dtype}`, [grid], 256, 0, [P(at.ptr), P(bt.ptr), U64(numel(at.shape)), P(part.ptr)]);
      const h = this.#read(part.ptr, new Float64Array(grid * 3));
      let e = 0;
      let r = 0;
      let bad = 0;
      for (let i = 0; i < grid; i++) {
        e += h[3 * i];
        r += h[3 * i + 1];
        bad += h[3 * i + 2];
      }
      return { relErr: Math.sqrt(e / r), nonFinite: bad, refNorm: Math.sqrt(r) };
    } finally {
      this.#pool.release(part);
    }
  }

  /** Time device work on this backend's stream with CUDA events (milliseconds). */
  async timeMs(run: () => unknown | Promise<unknown>): Promise<number> {
    const cu = this.#libs.cu;
    const a = this.#newEvent(0);
    const b = this.#newEvent(0);
    try {
      check(this.#libs, cu.cuEventRecord(a, this.#stream), 'cuEventRecord');
      await run();
      check(this.#libs, cu.cuEventRecord(b, this.#stream), 'cuEventRecord');
      check(this.#libs, cu.cuEventSynchronize(b), 'cuEventSynchronize');
      const ms = [0];
      check(this.#libs, cu.cuEventElapsedTime(ms, a, b), 'cuEventElapsedTime');
      return ms[0];
    } finally {
      cu.cuEventDestroy(a);
      cu.cuEventDestroy(b);
    }
  }

  /** Copy the listed rows (first axis) of a tensor to the host, in that order. */
  readRows(t: DeviceTensor, rows: Int32Array): HostTensor {
    const ct = this.#tensor(t, 'readRows source');
    const rowElems = numel(ct.shape.slice(1));
    const bpe = bytesPerElement(ct.dtype);
    const data = ct.dtype === 'f32' ? new Float32Array(rows.length * rowElems) : new Uint16Array(rows.length * rowElems);
    for (let i = 0; i < rows.length; i++) {
      const r = rows[i];
      if (!(r >= 0 && r < ct.shape[0])) throw new InvalidArgumentError(`row ${r} is outside [0, ${ct.shape[0]})`);
      const view = data.subarray(i * rowElems, (i + 1) * rowElems);
      check(this.#libs, this.#libs.cu.cuMemcpyDtoH(view, ct.ptr + r * rowElems * bpe, rowElems * bpe), 'cuMemcpyDtoH');
    }
    return { dtype: ct.dtype, shape: [rows.length, ...ct.shape.slice(1)], data };
  }

  /** Device memory: free and total bytes. */
  memoryInfo(): { free: number; total: number; pooled: number } {
    const f = [0];
    const t = [0];
    check(this.#libs, this.#libs.cu.cuMemGetInfo(f, t), 'cuMemGetInfo');
    return { free: Number(f[0]), total: Number(t[0]), pooled: this.#pool.pooledBytes };
  }
}

/** Create the CUDA backend (compiles kernels lazily on first use, cached on disk). */
export async function createCudaBackend(opts: CudaBackendOptions = {}): Promise<CudaBackend> {
  const libs = loadCuda();
  return new CudaBackend(libs, opts);
}

/** Concatenate row sets built for consecutive chunks of heads. */
function joinRows(parts: readonly BlockRows[], rows: number): BlockRows {
  const rowPtr = new Int32Array(rows + 1);
  let total = 0;
  let ri = 0;
  for (const { rowPtr: rp } of parts) {
    const r = rp.length - 1;
    for (let i = 0; i < r; i++) rowPtr[ri + i] = rp[i] + total;
    ri += r;
    total += rp[r];
  }
  rowPtr[rows] = total;
  const cols = new Int32Array(total);
  let off = 0;
  for (const { cols: c } of parts) {
    cols.set(c, off);
    off += c.length;
  }
  return { rowPtr, cols };
}
