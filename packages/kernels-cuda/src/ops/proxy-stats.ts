/**
 * Fused proxy statistics (kernels/proxy/): the proxy map Â = softmax(Q̂ Kᵀ · scale) of the
 * last b = min(B, m) queries reduced to C_struct, the row entropies and the block scores
 * without being stored. Shape legend: q [m, H, d] (positions n - m .. n - 1; m < n in chunked
 * prefill), k [n, Hkv, d], Nb = ceil(n / B).
 */
import {
  type DType,
  type DeviceTensor,
  CrispError,
  InvalidArgumentError,
  NonFiniteError,
  type ProxyStats,
  type ProxyStatsOptions,
  assertBlockSize,
  assertFiniteStats,
  assertStatsWindows,
  defaultScale,
  numBlocks,
  wantedOptionalStats,
} from '@crisp/core';
import { CUDA_CAPABILITIES, type CudaContext } from '../runtime/context.js';
import { deferFields } from '../runtime/deferred-fields.js';
import { check } from '../runtime/ffi.js';
import type { DeviceStats, KeptStats } from '../runtime/kept-stats.js';
import { F, I, P } from '../runtime/launcher.js';
import type { DeviceBlock } from '../runtime/pool.js';
import type { CudaTensor } from '../runtime/tensor.js';
import { PE_PART_BYTES } from './pe-rows.js';
import { selectionShape } from './shape.js';

/**
 * Proxy statistics kernel layouts. In kernels/proxy/proxy.cu (mma.sync; same math, every sum in the
 * same order, so the two give the same bits): `w32` B/32 warps of 32 proxy rows, each K
 * fragment read from shared memory feeding two MMAs, pass 1 at 3 CTAs per SM; `w16` B/16
 * warps of 16 rows. `w32` needs at least d threads, so d 128 with B 64 runs `w16`. In
 * kernels/proxy/proxy-wgmma.cu (Hopper only): `wg`, B/64 warpgroups on wgmma with Q̂ and K read
 * by the tensor cores from shared memory; its scores may round differently from the mma.sync
 * layouts'. `wg` off Hopper runs `w32`; token scores (pass 2) always run proxy.cu's pass 2.
 * The three gave bit-identical statistics on the H200 at 128k and 512k.
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
 * same bits), `w32` elsewhere.
 */
export function defaultProxyLayout(computeCapability: readonly [number, number]): ProxyLayout {
  return computeCapability[0] === 9 && computeCapability[1] === 0 ? 'wg' : DEFAULT_PROXY_LAYOUT;
}

const LOG2E = Math.LOG2E;
/** keys per proxy-statistics CTA (PART_KEYS in kernels/proxy/proxy-common.cuh) */
const PART_KEYS = 1024;

/** The proxy passes' kernels for one configuration (ProxyStatsOp.#passNames). */
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
  readonly file: 'proxy/proxy.cu' | 'proxy/proxy-wgmma.cu';
  readonly p1: string;
  readonly p2b: string;
}

/** proxyStats, with the layout knobs and the last configuration's kernel names. */
export class ProxyStatsOp {
  readonly #cx: CudaContext;
  readonly #kept: KeptStats;
  /** the proxy statistics kernel layout (a tuning knob, like the attention variant) */
  proxyLayout: ProxyLayout;
  /** block-level proxy statistics in one pass (a tuning knob; CudaBackendOptions.proxyFused) */
  proxyFused: boolean;
  /** #passNames' last configuration */
  #lastPassNames: PassNames | undefined;

  constructor(cx: CudaContext, kept: KeptStats, proxyLayout: ProxyLayout, proxyFused: boolean) {
    this.#cx = cx;
    this.#kept = kept;
    this.proxyLayout = proxyLayout;
    this.proxyFused = proxyFused;
  }

  /**
   * The proxy passes' kernel names for a configuration, kept for the last one asked (a model's
   * layers ask for the same one): the same string objects each call, so no names are built
   * and hashed on the host's path to the pass's launch (a prefill's first launch runs on a cold
   * host, where each runtime path touched costs).
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
      file: wg ? 'proxy/proxy-wgmma.cu' : 'proxy/proxy.cu',
      p1: wg ? `proxy_wg_pass1${lean ? 'l' : fused ? 'f' : ''}_${suf}` : `proxy_pass1${fused ? 'f' : ''}_${kname}`,
      p2b: wg ? `proxy_wg_pass2b_${suf}` : `proxy_pass2b_${kname}`,
    };
    this.#lastPassNames = names;
    return names;
  }

  /** proxyStats' work, synchronous (the optional statistics' later pass calls it from a getter). */
  run(q: DeviceTensor, k: DeviceTensor, opts: ProxyStatsOptions): ProxyStats {
    const cx = this.#cx;
    const kept = this.#kept;
    cx.alive();
    cx.tracer.host('proxyStats()');
    const shape = selectionShape(q, k);
    const B = opts?.blockSize;
    assertBlockSize(B, CUDA_CAPABILITIES.blockSizes);
    assertStatsWindows(opts);
    const scale = opts.scale ?? defaultScale(shape.headDim);
    if (!(scale > 0) || !Number.isFinite(scale)) throw new InvalidArgumentError(`scale must be positive; got ${scale}`);
    const wanted = wantedOptionalStats(opts.optionalStats);
    const qt = cx.tensor(q, 'q');
    const kt = cx.tensor(k, 'k');
    cx.assertFinite(qt, 'q');
    cx.assertFinite(kt, 'k');
    cx.tracer.host('proxyStats: checked');
    const { queries: m, keys: n, heads: H, kvHeads: Hkv, headDim: D, dtype } = shape;
    // the proxy rows: the last b query rows, at positions n - b .. n - 1 (q holds positions
    // qOff .. n - 1; qOff > 0 in chunked prefill)
    const b = Math.min(B, m);
    const qOff = n - m;
    const Nb = numBlocks(n, B);
    const nParts = Math.ceil(n / PART_KEYS);
    const SP = PART_KEYS + B;
    const f4 = 4;
    // [C_struct H][row entropy H][p_v H·Nb][p_s H·Nb][pooled H·Nb], f64, written by
    // proxy_blocks and proxy_heads and downloaded in one copy.
    const outLen = 2 * H + 3 * H * Nb;
    // The pass's own buffers first and the pass launched, then the rest (from an idle device
    // the device waits for this host work).
    // every block goes to `blocks` as it is taken: an allocation that fails part way leaves
    // the ones before it to the finally below (no partial allocation outlives the call)
    const blocks: DeviceBlock[] = [];
    const take = (bytes: number): DeviceBlock => {
      const x = cx.scratch(bytes);
      blocks.push(x);
      return x;
    };
    let pm: DeviceBlock;
    let pl: DeviceBlock;
    let pt: DeviceBlock;
    try {
      pm = take(H * b * nParts * f4);
      pl = take(H * b * nParts * f4);
      pt = take(H * b * nParts * f4);
    } catch (e) {
      cx.releaseBlocks(blocks);
      throw e;
    }
    // Token scores asked for: pass 2 writes a_v [H·n] and the parts' a_s; otherwise pass 2b
    // writes block scores and window sums only (SBP offset blocks a part).
    const tokens = Boolean(opts.tokenScores);
    const SBP = PART_KEYS / B + 3;
    // the fused pass (block level): per (head, part, row) the part's bins, key blocks, offset
    // blocks and window relative to the row's part max, [H][nParts][NS][b]
    const fused = !tokens && this.proxyFused;
    const wg = PROXY_LAYOUTS[this.proxyLayout].sm90a && cx.arch === 90;
    // The lean fused pass (no key block means, no query mean, no entropy sums: 0.485 -> 0.429
    // ms at 128k on the H200) when neither optional statistic is wanted, for a
    // device plan's statistics (deferRead) whose PE heads run on the second stream beside the
    // attention (H·Nb² within one PE part): their key block means then come from block_means
    // there (0.09 ms at 128k), off the plan's critical path. Elsewhere the PE rows would read K
    // on it, so the full pass.
    const lean = fused && wg && Boolean(opts.deferRead) && wanted.length === 0 && H * Nb * Nb * 4 <= PE_PART_BYTES;
    const NS = 2 * (PART_KEYS / B) + 4;
    // the third stream's last event (C_struct's, then the head values'), when it is used: on a
    // failure the scratch waits for it
    let tailDone: unknown;
    try {
      const bins = fused ? take(H * nParts * NS * b * f4) : undefined;
      const qm = lean ? undefined : take(H * D * f4);
      const km = lean ? undefined : take(Hkv * Nb * D * f4);
      cx.tracer.host('proxyStats: scratch taken');
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
      cx.tracer.host('proxyStats: launching the pass');
      // pass 1: grid [H, nParts], heads fastest (a kv group's query heads share K tiles in L2)
      cx.launch(file, p1, [H, nParts], threads, smem1, [
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
        I(qOff),
        F(scaleLog2),
        ...(bins ? [I(opts.wSink), I(opts.wLocal)] : []),
      ]);
      // Collected or surplus statistics and the last key block means back to the pool (not
      // before the launch: the pass's buffers may come from the pool's growth instead)
      kept.releaseRetained(false);
      cx.tracer.host('proxyStats: retained released');
      const lse2 = take(H * b * f4);
      const ent = take(H * b * f4);
      const av = take(tokens ? H * n * f4 : H * Nb * f4);
      const sp = take(tokens ? H * nParts * SP * f4 : H * nParts * SBP * f4);
      const win = tokens ? undefined : take(H * nParts * f4);
      const as = tokens ? take(H * n * f4) : undefined;
      // proxy_cstruct's per-head tickets (its last CTA of a head sums the parts)
      const tickets = bins ? take(H * 4) : undefined;
      // one more f64: the count of non-finite statistics (count_nonfinite_f64)
      // held by the statistics until read or collected (KeptStats): taken in slabs of 16,
      // so that calls whose earlier statistics are not collected yet do not each pay a
      // cuMemAlloc (0.31 ms at 128k in a trace on the H200)
      const out = cx.allocTraced(() => cx.pool.allocBatch((outLen + 1) * 8, 16));
      blocks.push(out);
      cx.launch('proxy/proxy-reduce.cu', 'proxy_combine', [Math.ceil((H * b * 32) / 256)], 256, 0, [
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
      // selection without either.
      const tail = bins && defer ? cx.streams.tail() : undefined;
      if (bins) {
        if (tail) cx.streams.fence(cx.streams.main, tail);
        cx.streams.onStream(tail ?? cx.streams.main, () =>
          cx.launch('proxy/proxy-reduce.cu', 'proxy_cstruct', [nParts, H], 32, 0, [
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
          cstructReady = cx.streams.recordIn(cx.streams.tailEvents, tail);
          tailDone = cstructReady;
        }
        // the rows' bins weighted by 2^(m − lse) into pass 2b's outputs, the window's left out
        cx.launch('proxy/proxy-reduce.cu', 'proxy_fused_sums', [nParts, H], 256, 0, [
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
        cx.launch('proxy/proxy.cu', `proxy_pass2_${kname}`, [H, nParts], mmaThreads, smem2, [
          P(qt.ptr),
          P(kt.ptr),
          P(lse2.ptr),
          P(av.ptr),
          P(sp.ptr),
          I(n),
          I(H),
          I(Hkv),
          I(b),
          I(qOff),
          F(scaleLog2),
        ]);
      } else {
        // Q rows, K tiles, two parities of the warps' five tile sums, the part's key-block,
        // offset-block and window accumulators
        const smem2b = slack + B * D * 2 + kTiles + (2 * (threads / 32) * 5 + PART_KEYS / B + SBP + 1) * f4;
        cx.launch(file, p2b, [H, nParts], threads, smem2b, [
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
          I(qOff),
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
      cx.launch(
        'proxy/proxy-reduce.cu',
        tokens ? 'proxy_blocks' : 'proxy_blocks_b',
        // (proxy_blocks: a block a warp; proxy_blocks_b: BB_J = 4 blocks a warp)
        [Math.ceil(Nb / (tokens ? 4 : 16)), H],
        128,
        0,
        tokens ? [...sums, P(as ? as.ptr : 0), ...shape] : [...sums, ...shape],
      );
      // The head values (entropies, the pooled estimate's softmax) and the finiteness count:
      // on the third stream, when there is one, once the block sums are queued
      if (tail) cx.streams.fence(cx.streams.main, tail);
      try {
        cx.streams.onStream(tail ?? cx.streams.main, () => {
          // (the fused pass: neither av nor winPart, C_struct is proxy_cstruct's)
          cx.launch('proxy/proxy-reduce.cu', 'proxy_heads', [H], 256, 0, [
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
          check(cx.libs, cx.libs.cu.cuMemsetD32Async(out.ptr, 0, 2, cx.streams.cur), 'cuMemsetD32Async');
          cx.launch('proxy/proxy-reduce.cu', 'count_nonfinite_f64', [Math.min(cx.info.multiprocessors, Math.ceil(outLen / 256))], 256, 0, [
            P(st),
            I(outLen),
            P(out.ptr),
          ]);
        });
      } finally {
        if (tail) tailDone = cx.streams.recordIn(cx.streams.tailEvents, tail);
      }
      // What routing reads comes back now: the count, C_struct and the entropies (2H + 1
      // values). The block statistics (3·H·Nb: 3 MB at 512k) come back when first read
      // (lazyBlockStats), as a device selection reads them where they are. deferRead (a plan
      // routed on the device): the head values too, on first access (that read waits for the
      // device), so nothing here waits.
      let given: Float64Array | undefined;
      const readHead = () => {
        const head = given ?? cx.read(out.ptr, new Float64Array(1 + 2 * H));
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
        // token scores: read now, or (deferRead: a device plan's coverage selection reads them
        // where they are) kept with the entry and read on first access
        ...(as && !opts.deferRead
          ? {
              verticalTokens: cx.read(av.ptr, new Float32Array(H * n)),
              slashTokens: cx.read(as.ptr, new Float32Array(H * n)),
            }
          : {}),
      } as unknown as ProxyStats;
      const tokenBlocks: [DeviceBlock, DeviceBlock] | undefined = as && opts.deferRead ? [av, as] : undefined;
      const tokenLazy = tokenBlocks
        ? deferFields(
            stats,
            ['verticalTokens', 'slashTokens'] as const,
            () => ({
              verticalTokens: cx.streams.readOnCopyStream(tokenBlocks[0].ptr, new Float32Array(H * n)),
              slashTokens: cx.streams.readOnCopyStream(tokenBlocks[1].ptr, new Float32Array(H * n)),
            }),
            (e) =>
              new CrispError('BACKEND_ERROR', `proxy statistics: the token scores could not be downloaded before their device buffers were released (${(e as Error).message})`, {
                cause: String((e as Error).message),
              }),
          )
        : undefined;
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
      // read above), or when the backend needs their buffer back (KeptStats.releaseRetained)
      const blockLoad = () => {
        // deferred statistics: their kernels are done once the head values are read
        headLazy?.materialize();
        const all = cx.streams.readOnCopyStream(st + 2 * H * 8, new Float64Array(3 * HNb));
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
      // kept past this call: the statistics' buffer (the entry's) and the key block means (KeptStats.kMeans)
      blocks.splice(blocks.indexOf(out), 1);
      if (km) blocks.splice(blocks.indexOf(km), 1);
      for (const t of tokenBlocks ?? []) blocks.splice(blocks.indexOf(t), 1);
      // keep the buffer for a device selection on these statistics (prepareMask), and for
      // their block statistics until read
      const entry: DeviceStats = {
        block: out,
        materialize: () => {
          headLazy?.materialize();
          lazy.materialize();
          tokenLazy?.materialize();
        },
        ...(tokenBlocks ? { tokens: tokenBlocks } : {}),
        ...(headLazy
          ? {
              settle: (h: Float64Array) => {
                if (h.length === 1 + 2 * H) given = h;
                headLazy.materialize();
              },
            }
          : {}),
        // the scratch stays taken until planOnDevice has ordered its second stream and the main
        // stream waits for the third (KeptStats.releaseHeld)
        ...(cstructReady !== undefined ? { cstructReady, tailDone, launchesAtEnd: cx.mainLaunches, held: blocks.splice(0) } : {}),
      };
      kept.add(stats, entry);
      if (km) kept.kMeans = { block: km, k: new WeakRef(kt), version: kt.version, B };
      cx.tracer.host('proxyStats: returns');
      return stats;
    } finally {
      // (on a failure: C_struct or proxy_heads may be queued on the third stream, reading the scratch)
      if (blocks.length > 0 && tailDone !== undefined) cx.streams.joinEvent(tailDone);
      for (const x of blocks) cx.pool.release(x);
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
      const full = this.run(q2, k2, opts);
      return { rowEntropy: full.rowEntropy, pooledEstimate: full.pooledEstimate };
    });
  }

}
