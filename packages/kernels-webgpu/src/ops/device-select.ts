/**
 * Routing, VS selection and the mask's expansion as device work (kernels/select.ts): the
 * cStruct router and the noise floor run on the GPU, exactly as @crisp/router and
 * @crisp/select do on the host (same routes, same lists, ties toward the lower index), and
 * the lists are expanded into block rows where they are, with nothing read back until asked.
 * The building block of the WebGPU device plan (../plan/planner.ts), which adds the PE
 * heads' rows.
 */
import {
  type AttentionOptions,
  type AttentionResult,
  checkDeviceRouterRule,
  checkDeviceSelectorRule,
  checkPeVsNarrowing,
  CrispError,
  type DeviceNoiseFloorRule,
  type DeviceSelectorRule,
  type DeviceTensor,
  InvalidArgumentError,
  LimitError,
  type ProxyStats,
  type Route,
  type VsLists,
  numBlocks,
} from '@crisp/core';
import { coverageLimit } from '../kernels/coverage.js';
import { residualRouteProgram } from '../kernels/route-residual.js';
import { SELECT_MAX_BLOCKS, vsPackProgram, vsSelectProgram } from '../kernels/select.js';
import { type Check, Usage } from '../runtime/gpu-context.js';
import { checkAttentionOptions, runAttention } from './attention.js';
import { expandBuffers } from './expand-mask.js';
import type { DevicePeRows } from './pe-cut.js';
import type { OpHost } from './host.js';
import { keptBuffers } from './stats-readback.js';
import { prepare, ready } from './validate.js';

export interface DeviceVsRequest {
  /** the cStruct rule's τ: VS iff C_struct >= τ (−Infinity: no such test) */
  readonly tauProxy: number;
  readonly vs: DeviceSelectorRule;
  /** blocks per direction for PE heads */
  readonly peK: number;
  /** the residual test (core's DeviceRouteTerms.residual): PE also where it says so */
  readonly residual?: { readonly tau: number; readonly minResidual: number };
  /** or FlexPrefill's: PE also where the JS distance over every block is < τ (DeviceRouteTerms.jsd) */
  readonly jsd?: { readonly tau: number };
  /** PE heads keep the noise floor's lists too (Policy.peWithVs), at `peVs`'s α when given */
  readonly peWithVs?: boolean;
  readonly peVs?: DeviceNoiseFloorRule;
  /** narrow PE heads' lists to p_v > κ ā outside the band (Policy.peVsExcess, peVsFullAnchor) */
  readonly excess?: number;
  readonly fullAnchor?: { readonly from: number; readonly below: number };
}

/** A selection and its expanded mask on the device; release it when done. */
export interface DeviceVsPlan {
  readonly heads: number;
  readonly numBlocks: number;
  readonly blockSize: number;
  /** the routes and lists, read back */
  read(): Promise<{ routes: Route[]; vs: VsLists }>;
  /** [H] blocks of each head's expanded rows, read back */
  blockCounts(): Promise<Float64Array>;
  /**
   * With a residual test (`residual` in the request): per head (1 where the test sends it to
   * PE else 0, the residual mass, the distance, 0) as the device computed them (f32), read
   * back; undefined without one.
   */
  residual(): Promise<Float32Array | undefined>;
  /** sparse attention over the expanded mask (the rows never leave the device) */
  attention(q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, opts?: AttentionOptions): Promise<AttentionResult>;
  release(): void;
}

/** The order key (kernels/f64.ts f32Key) of the smallest f32 >= τ: f32 x >= τ iff key(x) >= it. */
export function tauKey(tau: number): number {
  const f = new Float32Array(1);
  const u = new Uint32Array(f.buffer);
  f[0] = tau;
  const key = (b: number) => ((b & 0x7fffffff) === 0 ? 0x80000000 : b >>> 31 ? ~b >>> 0 : (b | 0x80000000) >>> 0);
  const k = key(u[0]);
  // rounded below τ: the next f32 up (the next key)
  return f[0] < tau ? k + 1 : k;
}

/** f64 bits (hi, lo) of x */
function f64Bits(x: number): [number, number] {
  const d = new Float64Array([x]);
  const u = new Uint32Array(d.buffer);
  return [u[1], u[0]];
}

/**
 * The statistics' block sums in proxyStats' device layout [H][Nb + 1][2] f32 (the statistics
 * hold f32 values, so this is exact).
 */
export function blockSumsOf(stats: ProxyStats): Float32Array {
  const { heads: H, numBlocks: Nb } = stats;
  const out = new Float32Array(H * (Nb + 1) * 2);
  for (let h = 0; h < H; h++) {
    for (let J = 0; J < Nb; J++) {
      out[(h * (Nb + 1) + J) * 2] = stats.verticalBlocks[h * Nb + J];
      out[(h * (Nb + 1) + J) * 2 + 1] = stats.slashBlocks[h * Nb + J];
    }
    out[(h * (Nb + 1) + Nb) * 2] = stats.cStruct[h];
  }
  return out;
}

/** The statistics' pooled estimate as f32 values (statistics read back: no logits on the device). */
function hostPooled(stats: ProxyStats): Float32Array {
  const a = stats.pooledEstimate;
  if (!a || a.length !== stats.heads * stats.numBlocks) {
    throw new InvalidArgumentError('the residual test and the PE lists\' narrowing need the statistics\' pooled estimate (optionalStats: pooledEstimate)');
  }
  return Float32Array.from(a);
}

/** The statistics' token scores as f32 values (statistics read back: none on the device). */
function hostTokens(stats: ProxyStats): [Float32Array, Float32Array] {
  const v = stats.verticalTokens;
  const t = stats.slashTokens;
  const len = stats.heads * stats.n;
  if (!v || !t || v.length !== len || t.length !== len) {
    throw new InvalidArgumentError('the cumulativeCoverage rule reads the token scores: take the statistics with tokenScores: true');
  }
  return [Float32Array.from(v), Float32Array.from(t)];
}

/** Routes, lists and their expansion queued on the device (the caller retires `held`). */
export interface QueuedSelection {
  /** [H] u32: 1 VS, 0 PE */
  readonly routes: GPUBuffer;
  /** [vertical H + 1][slash H + 1] u32 */
  readonly vsPtr: GPUBuffer;
  /** [vertical H * Nb][slash H * Nb] u32, each head's lists from its pointers */
  readonly vsList: GPUBuffer;
  /** the lists expanded into rows (rowPtr [H * Nb + 1], cols) */
  readonly rowPtr: GPUBuffer;
  readonly cols: GPUBuffer;
  /** the expanded cols' capacity in blocks: every causal block, H * Nb (Nb + 1) / 2 */
  readonly cap: number;
  /** the PE heads' rows made on the device (queueSelection's `peRows`), in the expansion above */
  readonly pe?: DevicePeRows;
  /** with a residual test: [H] vec4 f32 (PE by the test 1 / 0, the residual mass, the distance, 0) */
  readonly residual?: GPUBuffer;
  /** every buffer above */
  readonly held: GPUBuffer[];
}

/** Checks of a selection request (typed errors before any work). */
function checkSelection(H: number, Nb: number, B: number, req: DeviceVsRequest): void {
  if (!Number.isInteger(H) || !Number.isInteger(Nb) || H < 1 || Nb < 1) throw new InvalidArgumentError('the device selection needs the statistics from proxyStats');
  const { tauProxy, vs: rule, peK } = req ?? ({} as DeviceVsRequest);
  if (typeof tauProxy !== 'number' || Number.isNaN(tauProxy)) throw new InvalidArgumentError(`tauProxy must be a number; got ${String(tauProxy)}`);
  checkDeviceSelectorRule(rule, 'the device selection rule');
  if (!Number.isInteger(peK) || peK < 0) throw new InvalidArgumentError(`peK must be a non-negative integer; got ${String(peK)}`);
  const { residual, jsd, peWithVs, peVs, excess, fullAnchor } = req;
  if (residual !== undefined) checkDeviceRouterRule({ kind: 'residualJsd', ...residual }, 'the residual test');
  if (jsd !== undefined) checkDeviceRouterRule({ kind: 'jsd', ...jsd }, 'the jsd test');
  if (residual !== undefined && jsd !== undefined) throw new InvalidArgumentError('the device selection takes one distance test: residual or jsd, not both');
  if (rule.kind !== 'noiseFloor' && (peVs !== undefined || excess !== undefined)) {
    throw new InvalidArgumentError(`peVs and peVsExcess run beside the noiseFloor rule only; got ${rule.kind}`);
  }
  if (peWithVs !== undefined && typeof peWithVs !== 'boolean') throw new InvalidArgumentError(`peWithVs must be true or false; got ${String(peWithVs)}`);
  if (peVs !== undefined) {
    checkDeviceSelectorRule(peVs, 'the PE heads\' list rule (peVs)');
    if (peVs.kind !== 'noiseFloor' || peVs.kMin !== rule.kMin) {
      throw new InvalidArgumentError(`the PE heads' list rule (peVs) must be a noise floor with the VS rule's kMin ${rule.kMin}; got ${peVs.kind} with kMin ${peVs.kMin}`);
    }
  }
  checkPeVsNarrowing(excess, fullAnchor, 'the device selection: ');
  if ((peVs !== undefined || excess !== undefined) && peWithVs !== true) {
    throw new InvalidArgumentError('peVs and peVsExcess shape the lists PE heads keep with peWithVs, so they need peWithVs: true');
  }
  if (Nb > SELECT_MAX_BLOCKS) {
    throw new LimitError(`the device selection handles up to ${SELECT_MAX_BLOCKS} blocks a head; got ${Nb}`, { limit: 'selectBlocks', max: SELECT_MAX_BLOCKS * B });
  }
}

/**
 * Route, select and expand on the device from block sums in proxyStats' layout: where
 * deferred statistics of this backend left them (read there, nothing read back), or else
 * uploaded from `stats`' values (the f32 values proxyStats computed; deferred statistics
 * whose settle() was called are settled first). `peRows`, given the routes buffer, queues the
 * PE heads' rows (ops/pe-cut.ts); the one expansion then holds them too.
 */
export async function queueSelection(
  host: OpHost,
  stats: ProxyStats,
  req: DeviceVsRequest,
  peRows?: (routes: GPUBuffer) => Promise<DevicePeRows>,
): Promise<QueuedSelection> {
  const { heads: H, numBlocks: Nb, blockSize: B } = stats;
  checkSelection(H, Nb, B, req);
  const { tauProxy, peK, residual, jsd, excess, fullAnchor } = req;
  const rule = req.vs;
  const coverage = rule.kind === 'cumulativeCoverage' ? rule : undefined;
  const peWithVs = req.peWithVs === true;
  // (the noise floor's α for the VS heads and the PE heads' lists; unused beside coverage)
  const alpha = rule.kind === 'noiseFloor' ? rule.alpha : 1;
  const peAlpha = req.peVs?.alpha ?? alpha;
  const kBlocks = Math.ceil(rule.kMin / B);
  // ā is needed by the distance tests and the narrowing
  const distance = residual !== undefined || jsd !== undefined;
  const wantsPooled = distance || (peWithVs && excess !== undefined);
  const g = host.gpu;
  const [pSel, pPack, pRes] = await Promise.all([
    g.pipeline(vsSelectProgram()),
    g.pipeline(vsPackProgram()),
    wantsPooled ? g.pipeline(residualRouteProgram()) : undefined,
  ]);
  // (looked up with no await before the submission below: settle() retires the buffers
  // after the work submitted before it)
  const kept = keptBuffers(g, stats);
  const sums = kept?.sums;
  const logits = kept?.logits;
  const tokens = coverage && kept?.av && kept.as ? [kept.av, kept.as] : undefined;
  if (!sums && stats.settle) await stats.settle();
  const pooledValues = wantsPooled && !logits ? hostPooled(stats) : undefined;
  const tokenValues = coverage && !tokens ? hostTokens(stats) : undefined;
  const S = Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST;
  const checks: Check[] = [];
  const temps: GPUBuffer[] = [];
  const held: GPUBuffer[] = [];
  try {
    const [routes, vsPtr, vsList, resOut] = g.scoped(checks, 'the device selection', () => {
      const mk = (bytes: number, label: string, keep: GPUBuffer[]) => {
        const b = g.createBuffer(Math.max(4, bytes), S, label);
        keep.push(b);
        return b;
      };
      let src = sums;
      if (!src) {
        src = mk(H * (Nb + 1) * 8, 'blockSums', temps);
        const sumsData = blockSumsOf(stats);
        g.writeBuffer(src, 0, sumsData);
      }
      const lists = mk(2 * H * Nb * 4, 'selected', temps);
      const counts = mk(2 * H * 4, 'selectedCounts', temps);
      const routes = mk(H * 4, 'routes', held);
      const vsPtr = mk(2 * (H + 1) * 4, 'vsPtr', held);
      const vsList = mk(2 * H * Nb * 4, 'vsList', held);
      const enc = g.device.createCommandEncoder();
      // the residual test and ā (./route-residual.ts), or one-word stand-ins where not read
      const resOut = mk(pRes ? H * 16 : 16, 'residualRoute', distance ? held : temps);
      const pooled = mk(wantsPooled ? H * Nb * 4 : 4, 'pooledEstimate', temps);
      if (pRes) {
        let from = logits;
        if (!from) {
          from = mk(H * Nb * 4, 'pooledValues', temps);
          g.writeBuffer(from, 0, pooledValues!);
        }
        const [mHi, mLo] = f64Bits(residual?.minResidual ?? 2);
        const ur = g.uniform([H, Nb, logits ? 1 : 0, jsd ? 1 : 0, { f32: residual?.tau ?? jsd?.tau ?? 0 }, mHi, mLo, 0]);
        temps.push(ur);
        g.dispatch(enc, pRes, [ur, src, from, pooled, resOut], [H]);
      }
      // the token scores the coverage rule reads: where proxyStats left them, or uploaded
      let [tokV, tokS] = tokens ?? [];
      if (!tokV || !tokS) {
        tokV = mk(tokenValues ? H * stats.n * 4 : 4, 'verticalTokens', temps);
        tokS = mk(tokenValues ? H * stats.n * 4 : 4, 'slashTokens', temps);
        if (tokenValues) {
          g.writeBuffer(tokV, 0, tokenValues[0]);
          g.writeBuffer(tokS, 0, tokenValues[1]);
        }
      }
      const [aHi, aLo] = f64Bits(alpha);
      const [pHi, pLo] = f64Bits(peAlpha);
      const [gHi, gLo] = coverageLimit(coverage?.gamma ?? 0.5);
      const narrow = peWithVs && excess !== undefined;
      const band = fullAnchor ? [tauKey(fullAnchor.from), tauKey(fullAnchor.below)] : [0xffffffff, 0];
      const u = g.uniform([
        H, Nb, kBlocks, peK, tauKey(tauProxy), aHi, aLo, distance ? 1 : 0,
        peWithVs ? 1 : 0, pHi, pLo, narrow ? 1 : 0, { f32: excess ?? 0 }, band[0], band[1], coverage ? 1 : 0,
        stats.n, B, gHi, gLo,
      ]);
      const up = g.uniform([H, Nb, 0, 0]);
      temps.push(u, up);
      g.dispatch(enc, pSel, [u, src, lists, counts, routes, resOut, pooled, tokV, tokS], [2, H]);
      g.dispatch(enc, pPack, [up, lists, counts, vsPtr, vsList], [2, H]);
      g.submit(enc, temps);
      return [routes, vsPtr, vsList, distance ? resOut : undefined] as const;
    });
    await g.settle(checks);
    // the PE heads' rows from the routes on the device, when asked for: one expansion of both
    const pe = peRows ? await peRows(routes) : undefined;
    if (pe) held.push(pe.rowPtr, pe.cols);
    // every row holds at most I + 1 blocks
    const cap = (H * Nb * (Nb + 1)) / 2;
    const e = await expandBuffers(host, H, Nb, { vsPtr, vsList, sliceBase: H * Nb }, pe, cap);
    held.push(e.rowPtr, e.cols);
    return { routes, vsPtr, vsList, rowPtr: e.rowPtr, cols: e.cols, cap, held, ...(pe ? { pe } : {}), ...(resOut ? { residual: resOut } : {}) };
  } catch (err) {
    g.retire(...held);
    throw err;
  } finally {
    g.retire(...temps);
  }
}

/** The routes and VS lists of a queued selection, read back. */
export async function readSelection(host: OpHost, sel: QueuedSelection, H: number, Nb: number): Promise<{ routes: Route[]; vs: VsLists }> {
  const g = host.gpu;
  // one trip: the lists' whole room (2 · H · Nb entries, vertical then slash) beside their
  // pointers, cut to the pointers' lengths here
  const [rAb, pAb, lAb] = await Promise.all([g.read(sel.routes, 0, H * 4), g.read(sel.vsPtr, 0, 2 * (H + 1) * 4), g.read(sel.vsList, 0, 2 * H * Nb * 4)]);
  const r = new Uint32Array(rAb);
  const ptr = new Int32Array(pAb);
  const lists = new Int32Array(lAb);
  const verticalPtr = ptr.slice(0, H + 1);
  const slashPtr = ptr.slice(H + 1);
  const nv = verticalPtr[H];
  const ns = slashPtr[H];
  if (!(nv >= 0 && nv <= H * Nb && ns >= 0 && ns <= H * Nb)) {
    throw new CrispError('BACKEND_ERROR', `the device selection wrote list lengths ${nv} and ${ns}, outside [0, ${H * Nb}]`);
  }
  return {
    routes: Array.from(r, (x): Route => (x === 1 ? 'vs' : 'pe')),
    vs: { verticalPtr, vertical: lists.slice(0, nv), slashPtr, slash: lists.slice(H * Nb, H * Nb + ns) },
  };
}

/** [H] blocks of each head's expanded rows, from rowPtr [H * Nb + 1] on the device. */
export async function readRowCounts(host: OpHost, rowPtr: GPUBuffer, H: number, Nb: number): Promise<Float64Array> {
  const ptr = new Int32Array(await host.gpu.read(rowPtr, 0, (H * Nb + 1) * 4));
  return Float64Array.from({ length: H }, (_, h) => ptr[(h + 1) * Nb] - ptr[h * Nb]);
}

/**
 * Route, select and expand on the device from the statistics' block sums: where deferred
 * statistics left them (proxyStats with deferRead), else uploaded from `stats`' values.
 */
export async function deviceVsPlan(host: OpHost, stats: ProxyStats, req: DeviceVsRequest): Promise<DeviceVsPlan> {
  host.alive();
  const { heads: H, numBlocks: Nb, blockSize: B } = stats ?? ({} as ProxyStats);
  checkSelection(H, Nb, B, req);
  const sel = await queueSelection(host, stats, req);
  const g = host.gpu;
  let released = false;
  const alive = () => {
    host.alive();
    if (released) throw new InvalidArgumentError('this device selection was released');
  };
  return {
    heads: H,
    numBlocks: Nb,
    blockSize: B,
    async read() {
      alive();
      return readSelection(host, sel, H, Nb);
    },
    async blockCounts() {
      alive();
      return readRowCounts(host, sel.rowPtr, H, Nb);
    },
    async residual() {
      alive();
      return sel.residual ? new Float32Array(await g.read(sel.residual, 0, H * 16)) : undefined;
    },
    async attention(q, k, v, opts = {}) {
      alive();
      const { shape, qt, kt, vt } = prepare(host, q, k, v);
      if (shape.heads !== H || numBlocks(shape.keys, B) !== Nb || shape.queries !== shape.keys) {
        throw new InvalidArgumentError(`this device selection is for H=${H}, Nb=${Nb} (B=${B}) and a full prefill; got H=${shape.heads}, n=${shape.keys}, m=${shape.queries}`);
      }
      checkAttentionOptions(host, shape, [qt, kt, vt!], opts);
      await ready(qt, kt, vt);
      return runAttention(host, shape, qt, kt, vt!, { rowPtr: sel.rowPtr, cols: sel.cols, B, Nb, blocks: sel.cap }, opts);
    },
    release() {
      if (released) return;
      released = true;
      g.retire(...sel.held);
    },
  };
}
