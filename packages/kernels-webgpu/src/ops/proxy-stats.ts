/**
 * proxyStats: the proxy pass's per-head statistics (C_struct, row entropy, vertical and
 * slash block mass, pooled estimate) from the last `blockSize` query rows, on the GPU. With
 * `deferRead` nothing is read back: the statistics stay in their device buffers (a device
 * plan reads the block sums there, ./stats-readback.ts) until `settle()` copies them.
 */
import {
  assertBlockSize,
  assertStatsWindows,
  type DeviceTensor,
  InvalidArgumentError,
  numBlocks,
  type ProxyStats,
  type ProxyStatsOptions,
  wantedOptionalStats,
} from '@crisp/core';
import {
  SLASH_STRIDE,
  type ScoreTileKind,
  blockMeanProgram,
  blockSumsProgram,
  pooledLogitsProgram,
  rowCombineProgram,
  rowStatsProgram,
  scoresProgram,
  slashCombineProgram,
} from '../kernels/proxy.js';
import { checkScale, prepare, ready } from './validate.js';
import { LOG2E, type StorageDType } from '../kernels/common.js';
import { type Check, type GpuContext, Usage } from '../runtime/gpu-context.js';
import type { OpHost } from './host.js';
import { type KeptBuffers, deferredStats, readStats } from './stats-readback.js';

/**
 * The score-tile kind of the passes over every key: tensor cores where the tensor-core
 * attention runs this dtype and head dim (and its proxy programs built), else FMA.
 */
export function scoreTileKindFor(g: GpuContext, dtype: StorageDType, D: number): ScoreTileKind {
  return g.subgroupMatrixStats && g.tensorCores(dtype, D) ? 'subgroup-matrix' : 'fma';
}

/** The rowStats and scores pipelines; a tensor-core build the driver rejects falls back to FMA for good. */
async function scorePipelines(g: GpuContext, dtype: StorageDType, D: number): Promise<GPUComputePipeline[]> {
  if (scoreTileKindFor(g, dtype, D) === 'subgroup-matrix') {
    try {
      return await Promise.all([
        g.pipeline(rowStatsProgram(dtype, D, false, 'subgroup-matrix')),
        g.pipeline(scoresProgram(dtype, D, false, 'subgroup-matrix')),
      ]);
    } catch (e) {
      g.subgroupMatrixStats = false;
      g.noteKernel(`subgroup-matrix proxy statistics unavailable, using fma: ${e instanceof Error ? e.message : String(e)}`);
    }
  }
  return Promise.all([g.pipeline(rowStatsProgram(dtype, D, g.compact)), g.pipeline(scoresProgram(dtype, D, g.compact))]);
}

export async function proxyStats(host: OpHost, q: DeviceTensor, k: DeviceTensor, opts: ProxyStatsOptions): Promise<ProxyStats> {
  const { shape, qt, kt } = prepare(host, q, k, undefined);
  if (!opts || typeof opts !== 'object') throw new InvalidArgumentError('proxyStats needs options ({ blockSize, wSink, wLocal })');
  assertBlockSize(opts.blockSize, host.capabilities.blockSizes);
  assertStatsWindows(opts);
  // (checked; this backend computes every statistic whatever is asked for)
  wantedOptionalStats(opts.optionalStats);
  const scale = checkScale(opts.scale, shape.headDim);
  const { queries: m, keys: n, heads: H, kvHeads: Hkv, headDim: D } = shape;
  const dtype = shape.dtype as StorageDType;
  const B = opts.blockSize;
  const Nb = numBlocks(n, B);
  const b = Math.min(B, m);
  const T = Math.ceil(n / 64);
  const rowTiles = Math.ceil(b / 64);
  const tilesPerSplit = Math.max(16, Math.ceil(T / 4096));
  const numSplits = Math.ceil(T / tilesPerSplit);
  const g = host.gpu;
  const sizes = {
    'row-statistics partials': H * b * numSplits * 16,
    'row statistics': H * b * 16,
    'vertical token scores': H * n * 4,
    'slash token scores': H * n * 4,
    'slash partials': H * T * SLASH_STRIDE * 4,
    'block sums': H * (Nb + 1) * 2 * 4,
    'k block means': Hkv * Nb * D * 4,
    'pooled logits': H * Nb * 4,
  };
  g.checkBindings('proxyStats', sizes);
  await ready(qt, kt);
  const [[pRow, pScores], pComb, pSlash, pBlock, pMean, pLogits] = await Promise.all([
    scorePipelines(g, dtype, D),
    g.pipeline(rowCombineProgram()),
    g.pipeline(slashCombineProgram()),
    g.pipeline(blockSumsProgram()),
    g.pipeline(blockMeanProgram(dtype, D)),
    g.pipeline(pooledLogitsProgram(dtype, D)),
  ]);
  const S = Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST;
  const owned: GPUBuffer[] = [];
  const temps: GPUBuffer[] = [];
  const checks: Check[] = [];
  try {
    const [part, rows, av, as, slashPart, sums, kbar, logits] = g.scoped(checks, 'the proxy statistics buffers', () =>
      Object.entries(sizes).map(([label, bytes]) => {
        const buf = g.createBuffer(bytes, S, label);
        owned.push(buf);
        return buf;
      }),
    );
    g.scoped(checks, 'the proxy statistics passes', () => {
      const scaleLog2 = { f32: scale * LOG2E };
      // Bounded dispatches: heads per dispatch so one holds <= maxWork multiply-adds. Where
      // one dispatch takes every head, the passes share one submit (a submit costs the host
      // about 0.1 ms on Dawn); split ones go one submit each, so none holds more than that.
      const perHead = b * n * D;
      const hg = Math.max(1, Math.min(H, Math.floor(host.maxWork / perHead)));
      const split = hg < H;
      let enc = g.device.createCommandEncoder();
      const next = () => {
        if (!split) return;
        g.submit(enc, temps);
        enc = g.device.createCommandEncoder();
      };
      for (let h0 = 0; h0 < H; h0 += hg) {
        const nh = Math.min(hg, H - h0);
        const u = g.uniform([m, n, H, Hkv, b, tilesPerSplit, numSplits, h0, scaleLog2, 0, 0, 0]);
        temps.push(u);
        g.dispatch(enc, pRow, [u, qt.binding, kt.binding, part], [numSplits, rowTiles, nh]);
        next();
      }
      {
        const u = g.uniform([H * b, b, numSplits, 0]);
        temps.push(u);
        g.dispatch(enc, pComb, [u, part, rows], [Math.ceil((H * b) / 256)]);
        next();
      }
      for (let h0 = 0; h0 < H; h0 += hg) {
        const nh = Math.min(hg, H - h0);
        const u = g.uniform([m, n, H, Hkv, b, T, h0, 0, scaleLog2, { f32: 1 / b }, 0, 0]);
        temps.push(u);
        g.dispatch(enc, pScores, [u, qt.binding, kt.binding, rows, av, slashPart], [T, nh]);
        next();
      }
      const grid = g.grid(H * n);
      const u1 = g.uniform([n, b, T, H, { f32: 1 / b }, grid.rowWidth, 0, 0]);
      g.dispatch(enc, pSlash, [u1, slashPart, as], grid.groups);
      const sinkEnd = Math.min(opts.wSink, n);
      const localStart = Math.max(n - opts.wLocal, sinkEnd);
      const u2 = g.uniform([n, B, Nb, H, sinkEnd, localStart, 0, 0]);
      g.dispatch(enc, pBlock, [u2, av, as, sums], [Math.ceil((H * (Nb + 1)) / 256)]);
      const mgrid = g.grid(Hkv * Nb * (D / 4));
      const u3 = g.uniform([n, Hkv, 0, Nb, B, mgrid.rowWidth, 0, 0]);
      g.dispatch(enc, pMean, [u3, kt.binding, kbar], mgrid.groups);
      const u4 = g.uniform([m, H, Hkv, b, Nb, { f32: scale }, 0, 0]);
      g.dispatch(enc, pLogits, [u4, qt.binding, kbar, logits], [Math.ceil(Nb / 256), H]);
      temps.push(u1, u2, u3, u4);
      g.submit(enc, temps);
    });
    await g.settle(checks);
    const base = { n, heads: H, blockSize: B, numBlocks: Nb, proxyRows: b };
    // ('device': kept for a device plan's coverage selection, not read back with the rest)
    const tokens = Boolean(opts.tokenScores);
    const kept: KeptBuffers = {
      rows,
      sums,
      logits,
      av: tokens ? av : undefined,
      as: tokens ? as : undefined,
      readTokens: !(opts.tokenScores === 'device' && opts.deferRead),
    };
    if (opts.deferRead) {
      // the buffers the statistics are read from stay on the device until settle() reads them
      owned.splice(0, owned.length, ...owned.filter((x) => x !== rows && x !== sums && x !== logits && x !== kept.av && x !== kept.as));
      return deferredStats(host, base, kept);
    }
    return { ...base, ...(await readStats(host, base, kept)) };
  } finally {
    host.gpu.retire(...temps, ...owned);
  }
}
