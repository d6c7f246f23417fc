/**
 * The PE heads' rows of a device plan made on the GPU (kernels/pe-cut.ts), queued right
 * behind the routing: the pooled map of every head (the same program and slots-per-head
 * layout as peBlockRows, so the same values), the γ cut of the heads the device routed PE,
 * and their rows, with nothing read back. They equal what peBlockRows gives for those heads.
 */
import { type AttentionShape, numBlocks } from '@crisp/core';
import { fixedGamma } from '../coverage.js';
import { PE_CUT_BUCKETS, peFindProgram, peHistProgram, peRowsProgram } from '../kernels/pe-cut.js';
import { peMapProgram, scanProgram } from '../kernels/blocks.js';
import { blockMeanProgram } from '../kernels/proxy.js';
import type { StorageDType } from '../kernels/common.js';
import { type Check, Usage } from '../runtime/gpu-context.js';
import type { WebGpuTensor } from '../runtime/tensor.js';
import type { OpHost } from './host.js';
import { activeQueryBlocks, recordBlockMeans, recordPeMap } from './pe-rows.js';

/** The device cut keeps every head's map: at most this many bytes of it (else the host cuts). */
export const DEVICE_PE_MAP_MAX_BYTES = 2 ** 30;

/** PE rows on the device: rowPtr [H * Nb + 1] over every head (VS heads' rows empty), cols. */
export interface DevicePeRows {
  readonly rowPtr: GPUBuffer;
  readonly cols: GPUBuffer;
}

/**
 * Whether the device cut fits this shape: every head's map (and the rows' cols, as large) in
 * one binding, at most DEVICE_PE_MAP_MAX_BYTES.
 */
export function devicePeCutFits(host: OpHost, H: number, Nb: number): boolean {
  const mapBytes = ((H * Nb * (Nb + 1)) / 2) * 4;
  const lim = host.gpu.limits.maxStorageBufferBindingSize;
  return mapBytes <= Math.min(lim, DEVICE_PE_MAP_MAX_BYTES) && H * PE_CUT_BUCKETS * 4 <= lim && (H * Nb + 1) * 4 <= lim;
}

/**
 * Queue the PE rows of the heads `routes` (u32 [H], 0 = PE) marks, for q [m, H, d] and
 * k [n, Hkv, d] at block size B. The caller checked devicePeCutFits and retires the result.
 */
export async function queueDevicePeRows(
  host: OpHost,
  routes: GPUBuffer,
  t: { readonly qt: WebGpuTensor; readonly kt: WebGpuTensor },
  shape: AttentionShape,
  B: number,
  gamma: number,
  scale: number,
): Promise<DevicePeRows> {
  const g = host.gpu;
  const { queries: m, keys: n, heads: H, kvHeads: Hkv, headDim: D } = shape;
  const Nb = numBlocks(n, B);
  const R = H * Nb;
  const entries = (Nb * (Nb + 1)) / 2;
  const firstPos = n - m;
  const activeRows = activeQueryBlocks(n, m, B).count;
  const [pMean, pMap, pHist, pFind, pRows, pScan] = await Promise.all([
    g.pipeline(blockMeanProgram(shape.dtype as StorageDType, D)),
    g.pipeline(peMapProgram(D)),
    g.pipeline(peHistProgram()),
    g.pipeline(peFindProgram()),
    g.pipeline(peRowsProgram()),
    g.pipeline(scanProgram()),
  ]);
  const S = Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST;
  const checks: Check[] = [];
  const temps: GPUBuffer[] = [];
  const made: GPUBuffer[] = [];
  try {
    const rows = g.scoped(checks, `the PE heads' cut on the device (${H} heads, ${entries} map entries each)`, () => {
      const mk = (bytes: number, label: string, keep: GPUBuffer[]) => {
        const b = g.createBuffer(Math.max(4, bytes), S, label);
        keep.push(b);
        return b;
      };
      const qbar = mk(H * Nb * D * 4, 'qbar', temps);
      const kbar = mk(Hkv * Nb * D * 4, 'kbar', temps);
      const map = mk(H * entries * 4, 'peMap', temps);
      const hist = mk(H * PE_CUT_BUCKETS * 4, 'peHist', temps);
      const cut = mk(H * 16, 'peCut', temps);
      const rowPtr = mk((R + 1) * 4, 'peRowPtr', made);
      const cols = mk(H * entries * 4, 'peCols', made);
      const enc = g.device.createCommandEncoder();
      recordBlockMeans(host, enc, pMean, { qt: t.qt, kt: t.kt, qbar, kbar }, shape, B, temps);
      // every head's map (slot h = head h): the VS heads' cost little and keep the program and
      // its values those of peBlockRows
      recordPeMap(host, enc, pMap, { qbar, kbar, map }, Array.from({ length: H }, (_, h) => h), shape, B, scale, temps);
      enc.clearBuffer(cut);
      const G = fixedGamma(gamma);
      for (const pass of [0, 1]) {
        enc.clearBuffer(hist);
        const uh = g.uniform([H, Nb, B, firstPos, n, activeRows, pass, 0]);
        const uf = g.uniform([H, G, pass, 0]);
        temps.push(uh, uf);
        g.dispatch(enc, pHist, [uh, routes, map, cut, hist], [Nb, H]);
        g.dispatch(enc, pFind, [uf, routes, hist, cut], [H]);
      }
      const grid = g.grid(R);
      for (const mode of [0, 1]) {
        const ur = g.uniform([H, Nb, B, firstPos, n, grid.rowWidth, mode, 0]);
        temps.push(ur);
        g.dispatch(enc, pRows, [ur, routes, map, cut, rowPtr, cols], grid.groups);
        if (mode === 0) {
          const us = g.uniform([R, 0, 0, 0]);
          temps.push(us);
          g.dispatch(enc, pScan, [us, rowPtr], [1]);
        }
      }
      g.submit(enc, temps);
      return { rowPtr, cols };
    });
    await g.settle(checks);
    return rows;
  } catch (e) {
    g.retire(...made);
    throw e;
  } finally {
    g.retire(...temps);
  }
}
