/**
 * peBlockRows: pooled-estimate block rows for the given heads: block means of q and k on the
 * GPU, the PE map per head, and the coverage cut (../coverage.ts) on the host.
 */
import {
  assertBlockSize,
  type BlockRows,
  type DeviceTensor,
  InvalidArgumentError,
  LimitError,
  numBlocks,
  type PeRowsOptions,
  type AttentionShape,
} from '@crisp/core';
import { coverageCut } from '../coverage.js';
import { peMapProgram } from '../kernels/blocks.js';
import { blockMeanProgram } from '../kernels/proxy.js';
import { checkScale, prepare, ready } from './validate.js';
import type { StorageDType } from '../kernels/common.js';
import { type Check, Usage } from '../runtime/gpu-context.js';
import type { OpHost } from './host.js';
import type { WebGpuTensor } from '../runtime/tensor.js';

export async function peBlockRows(host: OpHost, q: DeviceTensor, k: DeviceTensor, opts: PeRowsOptions): Promise<BlockRows> {
  const { shape, qt, kt } = prepare(host, q, k, undefined);
  if (!opts || typeof opts !== 'object') throw new InvalidArgumentError('peBlockRows needs options ({ blockSize, gamma, heads })');
  assertBlockSize(opts.blockSize, host.capabilities.blockSizes);
  if (typeof opts.gamma !== 'number' || !(opts.gamma > 0 && opts.gamma <= 1)) {
    throw new InvalidArgumentError(`gamma must be a number in (0, 1]; got ${String(opts.gamma)}`);
  }
  const { queries: m, keys: n, heads: H, kvHeads: Hkv, headDim: D } = shape;
  const heads = opts.heads;
  if (!Array.isArray(heads) && !ArrayBuffer.isView(heads)) {
    throw new InvalidArgumentError('heads must be an array of ascending head indices');
  }
  for (let i = 0; i < heads.length; i++) {
    const h = heads[i];
    if (!Number.isInteger(h) || h < 0 || h >= H || (i > 0 && h <= heads[i - 1])) {
      throw new InvalidArgumentError(`heads must be strictly ascending integers in [0, ${H}); got ${JSON.stringify(Array.from(heads))}`);
    }
  }
  const scale = checkScale(opts.scale, D);
  const B = opts.blockSize;
  const Nb = numBlocks(n, B);
  if (heads.length === 0) return { rowPtr: new Int32Array(1), cols: new Int32Array(0) };
  if (Nb > host.gpu.limits.maxComputeWorkgroupsPerDimension) {
    throw new LimitError(`PE map needs ${Nb} workgroups along x; the device allows ${host.gpu.limits.maxComputeWorkgroupsPerDimension}`, {
      limit: 'maxComputeWorkgroupsPerDimension',
      max: host.gpu.limits.maxComputeWorkgroupsPerDimension * B,
    });
  }
  const dtype = shape.dtype as StorageDType;
  const g = host.gpu;
  const S = Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST;
  const entries = (Nb * (Nb + 1)) / 2;
  const perHeadBytes = entries * 4;
  if (perHeadBytes > g.limits.maxStorageBufferBindingSize) {
    const maxNb = Math.floor((Math.sqrt(1 + (8 * g.limits.maxStorageBufferBindingSize) / 4) - 1) / 2);
    throw new LimitError(
      `one head's PE map (${entries} entries) exceeds maxStorageBufferBindingSize (${g.limits.maxStorageBufferBindingSize} bytes); the largest n that fits at B = ${B} is ${maxNb * B}`,
      { limit: 'maxStorageBufferBindingSize', max: maxNb * B },
    );
  }
  g.checkBindings('peBlockRows', { 'q block means': H * Nb * D * 4, 'k block means': Hkv * Nb * D * 4 });
  await ready(qt, kt);
  const [pMean, pMap] = await Promise.all([g.pipeline(blockMeanProgram(dtype, D)), g.pipeline(peMapProgram(D))]);
  // Heads per pass: bounded by the binding limit and 256 MiB of host traffic per pass.
  const chunk = Math.max(1, Math.min(heads.length, Math.floor(Math.min(g.limits.maxStorageBufferBindingSize, 2 ** 28) / perHeadBytes)));
  const temps: GPUBuffer[] = [];
  const made: GPUBuffer[] = [];
  const checks: Check[] = [];
  const { active, count: activeRows } = activeQueryBlocks(n, m, B);
  try {
    const [qbar, kbar, map] = g.scoped(checks, 'the PE block means and map', () => {
      const mk = (bytes: number, label: string) => {
        const b = g.createBuffer(bytes, S, label);
        made.push(b);
        return b;
      };
      const bufs = [mk(H * Nb * D * 4, 'qbar'), mk(Hkv * Nb * D * 4, 'kbar'), mk(chunk * perHeadBytes, 'peMap')] as const;
      const enc = g.device.createCommandEncoder();
      recordBlockMeans(host, enc, pMean, { qt, kt, qbar: bufs[0], kbar: bufs[1] }, shape, B, temps);
      g.submit(enc, temps);
      return bufs;
    });
    const perHead: Uint8Array[] = [];
    for (let s0 = 0; s0 < heads.length; s0 += chunk) {
      const nh = Math.min(chunk, heads.length - s0);
      g.scoped(checks, 'a PE map pass', () => {
        const e2 = g.device.createCommandEncoder();
        recordPeMap(host, e2, pMap, { qbar, kbar, map }, Array.from(heads).slice(s0, s0 + nh), shape, B, scale, temps);
        g.submit(e2, temps);
      });
      // (read settles nothing of these scopes: a failed pass must not pass for a map of zeros)
      await g.settle(checks);
      const vals = new Float32Array(await g.read(map, 0, nh * perHeadBytes));
      for (let s = 0; s < nh; s++) {
        perHead.push(coverageCut(vals.subarray(s * entries, (s + 1) * entries), Nb, active, activeRows, opts.gamma));
      }
    }
    // Kept flags are row-major (I, then J), so each row's cols come out sorted.
    const rowPtr = new Int32Array(heads.length * Nb + 1);
    let total = 0;
    for (const keep of perHead) for (let e = 0; e < entries; e++) total += keep[e];
    const cols = new Int32Array(total);
    let p = 0;
    for (let s = 0; s < heads.length; s++) {
      const keep = perHead[s];
      let e = 0;
      for (let I = 0; I < Nb; I++) {
        for (let J = 0; J <= I; J++, e++) if (keep[e]) cols[p++] = J;
        rowPtr[s * Nb + I + 1] = p;
      }
    }
    return { rowPtr, cols };
  } finally {
    host.gpu.retire(...temps, ...made);
  }
}

/** q and k block means (qbar [H][Nb][d], kbar [Hkv][Nb][d], f32), recorded on `enc`. */
export function recordBlockMeans(
  host: OpHost,
  enc: GPUCommandEncoder,
  pMean: GPUComputePipeline,
  b: { readonly qt: WebGpuTensor; readonly kt: WebGpuTensor; readonly qbar: GPUBuffer; readonly kbar: GPUBuffer },
  shape: AttentionShape,
  B: number,
  temps: GPUBuffer[],
): void {
  const g = host.gpu;
  const { queries: m, keys: n, heads: H, kvHeads: Hkv, headDim: D } = shape;
  const Nb = numBlocks(n, B);
  const gq = g.grid(H * Nb * (D / 4));
  const uq = g.uniform([m, H, n - m, Nb, B, gq.rowWidth, 0, 0]);
  temps.push(uq);
  g.dispatch(enc, pMean, [uq, b.qt.binding, b.qbar], gq.groups);
  const gk = g.grid(Hkv * Nb * (D / 4));
  const uk = g.uniform([n, Hkv, 0, Nb, B, gk.rowWidth, 0, 0]);
  temps.push(uk);
  g.dispatch(enc, pMean, [uk, b.kt.binding, b.kbar], gk.groups);
}

/** The pooled maps of `heads` (slot s = heads[s]) into `map` [slot][Nb (Nb + 1) / 2], recorded on `enc`. */
export function recordPeMap(
  host: OpHost,
  enc: GPUCommandEncoder,
  pMap: GPUComputePipeline,
  b: { readonly qbar: GPUBuffer; readonly kbar: GPUBuffer; readonly map: GPUBuffer },
  heads: readonly number[],
  shape: AttentionShape,
  B: number,
  scale: number,
  temps: GPUBuffer[],
): void {
  const g = host.gpu;
  const { queries: m, keys: n, heads: H, kvHeads: Hkv } = shape;
  const Nb = numBlocks(n, B);
  const hb = g.u32Buffer(heads, 'peHeads');
  temps.push(hb);
  const u = g.uniform([H, Hkv, Nb, B, n - m, n, { f32: scale }, 0]);
  temps.push(u);
  g.dispatch(enc, pMap, [u, b.qbar, b.kbar, hb, b.map], [Nb, heads.length]);
}

/**
 * Query blocks that hold at least one query row (chunked prefill: q the last m of n
 * positions): 1 per active block of the Nb, and how many there are.
 */
export function activeQueryBlocks(n: number, m: number, B: number): { active: Uint8Array; count: number } {
  const Nb = numBlocks(n, B);
  const firstPos = n - m;
  const active = new Uint8Array(Nb);
  let count = 0;
  for (let I = 0; I < Nb; I++) {
    if (Math.max(I * B, firstPos) < Math.min(I * B + B, n)) {
      active[I] = 1;
      count++;
    }
  }
  return { active, count };
}
